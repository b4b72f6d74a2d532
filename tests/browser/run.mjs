#!/usr/bin/env node
// Browser tests of the live dashboard (/ui): headless Chromium (Debian's `chromium` package,
// driven by playwright-core) against the map-router binary with a supervised tree of agents.
//
//   node tests/browser/run.mjs [--bin <path-to-map-router>] [--chromium <path>] [--filter <substring>]
//
// Each scenario starts its own router (127.0.0.1:0, a temporary data dir and config) and a fresh
// browser context. Prints `ok - scenario: step` per step, `FAIL - ...` with the reason, then
// `N passed, M failed`; exits 0 only when nothing failed. Screenshots go to
// target/browser-artifacts/. Every wait is bounded; the whole run is bounded by RUN_LIMIT_MS.
import { spawn } from 'node:child_process';
import { createServer, connect as tcpConnect } from 'node:net';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';
import WebSocket from 'ws';
import { AgentConnection, ClientConnection, websocketStream } from '@multi-agent-protocol/sdk';

// Node has no global WebSocket before 22; the SDK's static connect() helpers use it.
globalThis.WebSocket ??= WebSocket;

const HERE = path.dirname(fileURLToPath(import.meta.url));
const argv = process.argv.slice(2);
const arg = (flag, fallback) => {
  const i = argv.indexOf(flag);
  return i >= 0 ? argv[i + 1] : fallback;
};
const BIN = path.resolve(arg('--bin', path.join(HERE, '../../target/debug/map-router')));
const CHROMIUM = arg('--chromium', process.env.CHROMIUM ?? '/usr/bin/chromium');
const FILTER = arg('--filter');
const ARTIFACTS = path.resolve(HERE, '../../target/browser-artifacts');
const AGENT = path.join(HERE, 'agent.py');
/** The whole run. */
const RUN_LIMIT_MS = 600_000;
/** One wait (an element, a state, an answer). */
const WAIT_MS = 8_000;
/** How long "it does not appear" is watched. */
const QUIET_MS = 400;
/** The acceptance bound for a live event to be on the page. */
const LIVE_MS = 1_000;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: timed out after ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

/** Polls `fn` (async allowed) until it returns something truthy, within `ms`. */
async function until(fn, what, ms = WAIT_MS) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}${last ? ` (last error: ${last.message})` : ''}`);
    await sleep(25);
  }
}

// ---------------------------------------------------------------------------------------------
// Routers

const routers = new Set();

/** The test's environment without the router's own variables (the flags say everything). */
function routerEnv() {
  const env = { ...process.env };
  for (const k of Object.keys(env)) if (k.startsWith('MAP_ROUTER_')) delete env[k];
  return env;
}

/** Starts the binary with `config` (TOML); resolves once it printed both of its URLs. */
function startRouter(config, files = {}, reuseDir = null) {
  const dir = reuseDir ?? mkdtempSync(path.join(tmpdir(), 'map-router-browser-'));
  for (const [name, text] of Object.entries(files)) writeFileSync(path.join(dir, name), text, { mode: 0o600 });
  writeFileSync(path.join(dir, 'router.toml'), config);
  const argv = ['serve', '--listen', '127.0.0.1:0', '--data-dir', path.join(dir, 'data'), '--config', path.join(dir, 'router.toml')];
  // Benchmarks pin the router to its own cores (taskset execs it: the pid is the router's).
  const pin = process.env.MAP_BROWSER_ROUTER_CPUS;
  const proc = spawn(pin ? 'taskset' : BIN, pin ? ['-c', pin, BIN, ...argv] : argv, {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: routerEnv(),
  });
  const router = { proc, dir, log: [], wsUrl: null, uiUrl: null, config, files };
  routers.add(router);
  return withTimeout(
    new Promise((resolve, reject) => {
      let buf = '';
      proc.stderr.setEncoding('utf8');
      proc.stderr.on('data', (chunk) => {
        buf += chunk;
        let nl;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          router.log.push(line);
          if (router.log.length > 300) router.log.shift();
          const ws = /^map-router listening on (ws:\/\/127\.0\.0\.1:\d+\/)$/.exec(line);
          if (ws) router.wsUrl = ws[1];
          const ui = /^map-router dashboard on (http:\/\/127\.0\.0\.1:\d+\/ui)$/.exec(line);
          if (ui) router.uiUrl = ui[1];
          if (router.wsUrl && router.uiUrl) resolve(router);
        }
      });
      proc.on('exit', (code) => reject(new Error(`router exited (${code}) before listening: ${router.log.slice(-5).join(' | ')}`)));
    }),
    WAIT_MS,
    'router start',
  );
}

/** A free TCP port on 127.0.0.1. */
function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/**
 * A real `nats-server -js` on 127.0.0.1 (cluster mode's event log), with a temporary store:
 * `kill()` (SIGKILL) and `start()` again on the same port and store.
 */
async function startNats() {
  const dir = mkdtempSync(path.join(tmpdir(), 'map-router-browser-nats-'));
  const port = await freePort();
  const nats = {
    url: `nats://127.0.0.1:${port}`,
    proc: null,
    async start() {
      this.proc = spawn('nats-server', ['-a', '127.0.0.1', '-p', String(port), '-js', '-sd', path.join(dir, 'store')], { stdio: 'ignore' });
      const failed = new Promise((_, reject) => this.proc.once('error', (e) => reject(new Error(`cannot start nats-server (apt-get install nats-server): ${e.message}`))));
      await Promise.race([failed, until(() => new Promise((resolve) => {
        const sock = tcpConnect(port, '127.0.0.1', () => { sock.destroy(); resolve(true); });
        sock.once('error', () => resolve(false));
      }), 'nats-server to listen')]);
    },
    async kill() {
      if (!this.proc || this.proc.exitCode !== null || this.proc.signalCode !== null) return;
      const exited = new Promise((r) => this.proc.once('exit', r));
      this.proc.kill('SIGKILL');
      await withTimeout(exited, WAIT_MS, 'nats-server exit');
    },
    async stop() {
      await this.kill();
      rmSync(dir, { recursive: true, force: true });
    },
  };
  await nats.start();
  return nats;
}

/**
 * A standby node (`[cluster] standby = true`) on the stream of `natsUrl`, named `node`, on a
 * free port (`url`): it prints nothing until it takes over, so nothing is awaited here
 * (`serving()` waits until its /health says it serves). `kill()` is SIGKILL.
 */
async function startStandby(natsUrl, node) {
  const dir = mkdtempSync(path.join(tmpdir(), 'map-router-browser-standby-'));
  writeFileSync(path.join(dir, 'router.toml'), `[cluster]\nurl = "${natsUrl}"\nnode = "${node}"\nstandby = true\nrequest_timeout_ms = 1000\nconnect_timeout_ms = 3000\n`);
  const port = await freePort();
  const proc = spawn(BIN, ['serve', '--listen', `127.0.0.1:${port}`, '--data-dir', path.join(dir, 'data'), '--config', path.join(dir, 'router.toml')], {
    stdio: ['ignore', 'ignore', 'ignore'],
    env: routerEnv(),
  });
  return {
    url: `ws://127.0.0.1:${port}/`,
    async serving() {
      await until(async () => {
        try {
          return (await (await fetch(`http://127.0.0.1:${port}/health`)).text()).includes('\nserving:');
        } catch {
          return false;
        }
      }, `standby ${node} serving`, 4 * WAIT_MS);
    },
    async kill() {
      if (proc.exitCode === null && proc.signalCode === null) {
        const exited = new Promise((r) => proc.once('exit', r));
        proc.kill('SIGKILL');
        await withTimeout(exited, WAIT_MS, 'standby exit');
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** kill -9, then the same binary on the same data directory and config (new port). */
async function restartRouter(router) {
  router.keepDir = true;
  routers.delete(router);
  if (router.proc.exitCode === null && router.proc.signalCode === null) {
    const exited = new Promise((r) => router.proc.once('exit', r));
    router.proc.kill('SIGKILL');
    await withTimeout(exited, WAIT_MS, 'router exit after SIGKILL');
  }
  return startRouter(router.config, {}, router.dir);
}

async function stopRouter(router) {
  routers.delete(router);
  if (router.keepDir) return;
  if (router.proc.exitCode === null && router.proc.signalCode === null) {
    const exited = new Promise((r) => router.proc.once('exit', r));
    router.proc.kill('SIGTERM');
    await withTimeout(exited, 6000, 'router exit').catch(() => router.proc.kill('SIGKILL'));
  }
  rmSync(router.dir, { recursive: true, force: true });
}

// ---------------------------------------------------------------------------------------------
// A MAP client for the test's own side (sending messages, reading the log)

class Peer {
  static async connect(url, params = {}) {
    const peer = new Peer();
    peer.ws = new WebSocket(url);
    peer.pending = new Map();
    peer.nextId = 1;
    peer.ws.on('message', (data) => {
      const f = JSON.parse(String(data));
      const w = f.id !== undefined ? peer.pending.get(f.id) : undefined;
      if (!w) return;
      peer.pending.delete(f.id);
      if (f.error) w.reject(Object.assign(new Error(f.error.message), { code: f.error.code }));
      else w.resolve(f.result);
    });
    await withTimeout(new Promise((resolve, reject) => {
      peer.ws.once('open', resolve);
      peer.ws.once('error', reject);
    }), WAIT_MS, 'test client socket');
    const res = await peer.call('map/connect', { protocolVersion: 1, participantType: 'client', name: 'browser-test', ...params });
    assert.ok(!res.authRequired, `test client connects: ${JSON.stringify(res)}`);
    return peer;
  }

  call(method, params = {}) {
    const id = this.nextId++;
    return withTimeout(new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.ws.send(JSON.stringify({ jsonrpc: '2.0', id, method, params }));
    }), WAIT_MS, method);
  }

  send(to, payload, meta) {
    return this.call('map/send', meta ? { to, payload, meta } : { to, payload });
  }

  /** Every event of the log this peer may see, oldest first (bounded). */
  async history() {
    const out = [];
    let after;
    for (let page = 0; page < 100; page++) {
      // Every type, as the dashboard reads the log: `*` and our vendor types, named (the
      // dashboard's EVERY_TYPE, src/server/ui/app.js, which tests/ui.rs keeps equal to the router's).
      const filter = { eventTypes: ['*', 'agent.presence.changed', 'agent.metadata.changed', 'message.queued', 'agent.injected', 'agent.stderr', 'agent.diagnostic', 'agent.spawning', 'agent.spawn.failed', 'task.updated'] };
      const r = await this.call('map/replay', after ? { afterEventId: after, limit: 1000, filter } : { limit: 1000, filter });
      for (const e of r.events) out.push(e.event);
      if (!r.hasMore || r.events.length === 0) return out;
      after = r.events.at(-1).eventId;
    }
    throw new Error('history longer than 100 pages');
  }

  close() {
    this.ws.close();
  }
}

// ---------------------------------------------------------------------------------------------
// Page helpers

const tid = (id) => `[data-testid="${id}"]`;

async function shot(page, name) {
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: path.join(ARTIFACTS, `${name}.png`), fullPage: false });
}

/** The agent nodes drawn in the tree: [{id, state, parent (id of the enclosing node or null)}]. */
function treeNodes(page) {
  return page.$$eval(`${tid('agent-tree')} ${tid('agent-node')}`, (nodes) =>
    nodes.map((n) => {
      const group = n.closest('[role="treeitem"]')?.parentElement?.closest('[role="treeitem"]');
      const parent = group?.querySelector(':scope > [data-testid="agent-node"]')?.dataset.agentId ?? null;
      return { id: n.dataset.agentId, state: n.dataset.state, parent, text: n.textContent };
    }),
  );
}

/** The rows of the event stream: [{id, type, text}]. */
function rows(page) {
  return page.$$eval(`${tid('event-stream')} ${tid('event-row')}`, (rs) => rs.map((r) => ({ id: r.dataset.eventId, type: r.dataset.type, text: r.textContent })));
}

/** The numbers `seq` of message_sent rows whose payload carries `tag`, in page order. */
async function sequence(page, tag) {
  const out = [];
  for (const r of await rows(page)) {
    if (r.type !== 'message_sent' || !r.text.includes(`"tag":"${tag}"`)) continue;
    const m = /"seq":(\d+)/.exec(r.text);
    if (m) out.push(Number(m[1]));
  }
  return out;
}

const range = (n) => Array.from({ length: n }, (_, i) => i + 1);

/**
 * The checkpoints the detail pane shows for the selected agent: {status, ids}. `status` is
 * `loaded` when `trajectory/list` worked (`unavailable` would mean the router lacks it).
 */
async function checkpointsShown(page) {
  const box = page.locator(`${tid('agent-detail')} ${tid('checkpoints')}`);
  await box.waitFor({ timeout: WAIT_MS });
  await until(async () => (await box.getAttribute('data-status')) !== 'loading', 'checkpoints to load');
  return {
    status: await box.getAttribute('data-status'),
    ids: await page.$$eval(`${tid('checkpoint')}`, (cs) => cs.map((c) => c.dataset.checkpointId)),
  };
}

// ---------------------------------------------------------------------------------------------
// Scenarios

const scenarios = [];
const scenario = (name, fn) => scenarios.push({ name, fn });

function treeConfig() {
  return `
[router]
resume_window_ms = 1000

[[agents]]
id = "lead"
name = "lead"
role = "lead"
program = "python3"
args = ["${AGENT}", "active", "1200", "300", "0.012",
        "worker-1", "worker", "busy", "800", "150", "0.006",
        "worker-2", "worker", "idle", "500", "100", "0.003"]
`;
}

scenario('dashboard', async (t, browser) => {
  const router = await t.router(treeConfig());
  const peer = await t.peer(router.wsUrl);
  await until(async () => {
    const { agents } = await peer.call('map/agents/list');
    const states = Object.fromEntries(agents.map((a) => [a.id, a.state]));
    return states.lead === 'active' && states['worker-1'] === 'busy' && states['worker-2'] === 'idle';
  }, 'the three supervised agents in their states', 15_000);

  const context = await t.context(browser);
  const page = await context.newPage();
  await page.goto(router.uiUrl);

  await t.step('the tree shows the three supervised agents with their states and processes', async () => {
    const nodes = await until(async () => {
      const ns = await treeNodes(page);
      return ns.length === 3 && ns.every((n) => /pid \d+/.test(n.text)) ? ns : null;
    }, 'three nodes with their pids');
    const by = Object.fromEntries(nodes.map((n) => [n.id, n]));
    assert.deepEqual(
      Object.fromEntries(nodes.map((n) => [n.id, [n.state, n.parent]])),
      { lead: ['active', null], 'worker-1': ['busy', 'lead'], 'worker-2': ['idle', 'lead'] },
    );
    assert.match(by['worker-1'].text, /restarts 0/);
    for (const n of nodes) assert.match(n.text, /team/, `${n.id} shows its scope`);
    await page.locator(`${tid('scope')}[data-scope-id="team"]`, { hasText: '3 members' }).waitFor({ timeout: WAIT_MS });
    assert.equal(await page.textContent(tid('connection-status')), 'live');
    await page.locator(`${tid('history-status')}[data-state="ready"]`).waitFor({ state: 'attached', timeout: WAIT_MS });
    await shot(page, '01-tree');
  });

  await t.step('a message sent by another client is on the page within a second', async () => {
    const sent = Date.now();
    const res = await peer.send({ agent: 'worker-1' }, { probe: 'live-1', task: 'summarize the logs' });
    assert.deepEqual(res.delivered, ['worker-1']);
    await page
      .locator(`${tid('event-row')}[data-type="message_sent"]`, { hasText: 'live-1' })
      .waitFor({ timeout: Math.max(1, LIVE_MS - (Date.now() - sent)) });
  });

  await t.step('the message flow draws it; a click shows its payload and trace context', async () => {
    const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
    await peer.send({ agent: 'worker-2' }, { probe: 'traced', step: 2 }, { traceparent });
    await page.click(tid('tab-flow'));
    const arrow = page.locator(tid('flow-message')).last();
    await until(async () => (await page.locator(tid('flow-message')).count()) >= 2, 'two messages in the flow');
    await arrow.click();
    const detail = page.locator(tid('message-detail'));
    await detail.waitFor({ timeout: WAIT_MS });
    assert.match(await detail.locator(tid('message-payload')).textContent(), /"probe": "traced"/);
    assert.equal(await detail.locator(tid('traceparent')).textContent(), traceparent);
    await page.click(tid('tab-events'));
  });

  await t.step('clicking an agent shows its metadata, process, and usage summed up the tree', async () => {
    await page.locator(`${tid('agent-node')}[data-agent-id="lead"]`).click();
    const detail = page.locator(`${tid('agent-detail')}[data-agent-id="lead"]`);
    await detail.waitFor({ timeout: WAIT_MS });
    assert.match(await detail.locator(tid('agent-metadata')).textContent(), /"inputTokens": 1200/);
    const own = detail.locator(tid('usage-own'));
    assert.equal(await own.getAttribute('data-input-tokens'), '1200');
    const total = detail.locator(tid('usage-total'));
    assert.equal(await total.getAttribute('data-input-tokens'), '2500');
    assert.equal(await total.getAttribute('data-output-tokens'), '550');
    assert.ok(Math.abs(Number(await total.getAttribute('data-cost-usd')) - 0.021) < 1e-9);
    assert.match(await total.textContent(), /3 reporting/);
    assert.match(await detail.locator(tid('process-pid')).textContent(), /^\d+$/);
    await until(async () => /lead: ready/.test(await detail.locator(tid('stderr-tail')).textContent()), 'the stderr tail');
    const cps = await checkpointsShown(page);
    // Each agent of agent.py records two, in order.
    assert.equal(cps.status, 'loaded');
    assert.deepEqual(cps.ids, ['lead-cp-1', 'lead-cp-2']);
    await page.locator(tid('flow-message')).first().waitFor({ state: 'attached', timeout: WAIT_MS });
    // Not in cluster mode: no NATS badge (the page asked /health at load, seconds ago).
    assert.ok(await page.locator(tid('nats-status')).isHidden());
    await shot(page, 'dashboard');
    // The README's and docs/dashboard.md's picture, taken here so that it cannot go stale.
    await docsShot(page, 'overview');
  });

  await t.step('steering: suspend, resume and inject from the detail pane', async () => {
    await page.locator(`${tid('agent-node')}[data-agent-id="worker-1"]`).click();
    const detail = page.locator(`${tid('agent-detail')}[data-agent-id="worker-1"]`);
    await detail.locator(tid('suspend')).click();
    await page.locator(`${tid('agent-node')}[data-agent-id="worker-1"][data-state="suspended"]`).waitFor({ timeout: WAIT_MS });
    await detail.locator(tid('resume')).click();
    await page.locator(`${tid('agent-node')}[data-agent-id="worker-1"][data-state="busy"]`).waitFor({ timeout: WAIT_MS });
    await detail.locator(tid('inject-content')).fill('{"hint":"look at the errors first"}');
    await detail.locator(tid('inject')).click();
    await detail.locator(tid('steer-result'), { hasText: 'injected' }).waitFor({ timeout: WAIT_MS });
    await page.locator(`${tid('event-row')}[data-type="agent.injected"]`).waitFor({ timeout: WAIT_MS });
    await until(async () => /got \{"hint": "look at the errors first"\}/.test(await detail.locator(tid('stderr-tail')).textContent()), 'the agent to log the injected content');
    await shot(page, '02-steering');
  });

  await t.step('a click is not lost when the tree is redrawn between mousedown and mouseup', async () => {
    const box = await page.locator(`${tid('agent-node')}[data-agent-id="lead"]`).boundingBox();
    await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
    await page.mouse.down();
    // Another agent's state changes while the button is pressed: the tree is redrawn.
    await peer.call('map/agents/suspend', { agentId: 'worker-1', reason: 'mid-click' });
    await page.locator(`${tid('agent-node')}[data-agent-id="worker-1"][data-state="suspended"]`).waitFor({ timeout: WAIT_MS });
    await page.mouse.up();
    await page.locator(`${tid('agent-detail')}[data-agent-id="lead"]`).waitFor({ timeout: WAIT_MS });
    await peer.call('map/agents/resume', { agentId: 'worker-1' });
    await page.locator(`${tid('agent-node')}[data-agent-id="worker-1"][data-state="busy"]`).waitFor({ timeout: WAIT_MS });
  });

  await t.step('a paused stream holds new events and shows each once, in order, on resume', async () => {
    await page.click(tid('pause'));
    for (const seq of range(5)) await peer.send({ agent: 'worker-1' }, { tag: 'paused', seq });
    await until(async () => /5 new events held|held/.test(await page.textContent(tid('stream-status'))), 'the held count');
    await sleep(QUIET_MS);
    assert.deepEqual(await sequence(page, 'paused'), [], 'nothing is drawn while paused');
    await page.click(tid('pause'));
    await until(async () => (await sequence(page, 'paused')).length === 5, 'the five held messages');
    assert.deepEqual(await sequence(page, 'paused'), range(5));
  });

  await t.step('a pause longer than the buffer reads the missed events again on resume', async () => {
    const small = await context.newPage();
    await small.goto(`${router.uiUrl}?buffer=10`);
    await small.locator(`${tid('connection-status')}[data-status="live"]`).waitFor({ timeout: WAIT_MS });
    await small.click(tid('pause'));
    for (const seq of range(30)) await peer.send({ agent: 'worker-1' }, { tag: 'overflow', seq });
    await until(async () => /more than 10/.test(await small.textContent(tid('stream-status'))), 'the overflow notice');
    await small.click(tid('pause'));
    await until(async () => (await sequence(small, 'overflow')).length >= 30, 'thirty messages after resume');
    assert.deepEqual(await sequence(small, 'overflow'), range(30));
    await small.close();
  });

  let marker;
  await t.step('stopping an agent from the dashboard removes it from the live tree', async () => {
    await peer.send({ agent: 'worker-2' }, { tag: 'marker', note: 'before the stop' });
    marker = (await peer.history()).filter((e) => e.type === 'message_sent' && e.data.payload?.tag === 'marker').at(-1);
    assert.ok(marker, 'the marker message is in the log');
    await page.locator(`${tid('agent-node')}[data-agent-id="worker-2"]`).click();
    await page.locator(`${tid('agent-detail')}[data-agent-id="worker-2"] ${tid('stop')}`).click();
    await until(async () => !(await treeNodes(page)).some((n) => n.id === 'worker-2'), 'worker-2 to leave the live tree');
    const ended = (await peer.history()).filter((e) => e.type === 'agent_unregistered' && e.data.agentId === 'worker-2');
    assert.equal(ended.length, 1);
  });

  await t.step('scrubbing back shows the stopped agent as it was', async () => {
    const log = await peer.history();
    const index = log.findIndex((e) => e.id === marker.id);
    assert.ok(index >= 0);
    await page.locator(tid('scrubber')).fill(String(index));
    await page.locator(`${tid('scrubber-label')}[data-event-id="${marker.id}"]`).waitFor({ timeout: WAIT_MS });
    await page.locator(`${tid('mode')}[data-mode="past"]`).waitFor({ timeout: WAIT_MS });
    const nodes = await until(async () => {
      const ns = await treeNodes(page);
      return ns.some((n) => n.id === 'worker-2') ? ns : null;
    }, 'worker-2 in the past tree');
    assert.deepEqual(Object.fromEntries(nodes.map((n) => [n.id, n.state])), { lead: 'active', 'worker-1': 'busy', 'worker-2': 'idle' });
    const last = (await rows(page)).at(-1);
    assert.equal(last.id, marker.id, 'the past stream ends at the chosen event');
    await shot(page, '03-past');
  });

  await t.step('back to live shows what happened meanwhile: every event once, in order', async () => {
    for (const seq of range(20)) await peer.send({ agent: 'worker-1' }, { tag: 'meanwhile', seq });
    await sleep(QUIET_MS);
    assert.deepEqual(await sequence(page, 'meanwhile'), [], 'the past does not show new events');
    await page.click(tid('back-to-live'));
    await page.locator(`${tid('mode')}[data-mode="live"]`).waitFor({ state: 'attached', timeout: WAIT_MS });
    assert.ok(await page.locator(tid('mode')).isHidden(), 'live is said once, by the connection status');
    await page.selectOption(tid('filter-type'), 'message_sent');
    await until(async () => (await sequence(page, 'meanwhile')).length >= 20, 'the twenty messages');
    assert.deepEqual(await sequence(page, 'meanwhile'), range(20));
    // The whole stream is the log, with no duplicates: compare the ids of the message_sent rows.
    const shown = (await rows(page)).map((r) => r.id);
    assert.equal(new Set(shown).size, shown.length, 'no event twice');
    const logged = (await peer.history()).filter((e) => e.type === 'message_sent').map((e) => e.id);
    assert.deepEqual(shown, logged.slice(-shown.length), 'the rows are the tail of the log, in order');
    assert.ok(!(await treeNodes(page)).some((n) => n.id === 'worker-2'), 'worker-2 stays gone in the live tree');
    await shot(page, '04-live');
  });
});

scenario('auth', async (t, browser) => {
  const config = `
[auth]
system_principals = ["ops"]

[auth.api_keys]
file = "api-keys"

[permissions.exposure.agents]
hidden = ["secret-*"]

[permissions.principals."dashboard".lifecycle]
canStop = false
canSteer = false

[[agents]]
id = "public-a"
name = "public-a"
role = "worker"
program = "python3"
args = ["${AGENT}", "idle", "10", "5", "0.001"]

[[agents]]
id = "public-b"
name = "public-b"
role = "worker"
program = "python3"
args = ["${AGENT}", "busy", "20", "5", "0.002"]

[[agents]]
id = "secret-c"
name = "secret-c"
role = "auditor"
program = "python3"
args = ["${AGENT}", "active", "30", "5", "0.003"]
`;
  const keys = 'dashboard-key-0123456789abcdef dashboard\nops-key-0123456789abcdef0123 ops\n';
  const router = await t.router(config, { 'api-keys': keys });
  const ops = await t.peer(router.wsUrl, { participantType: 'system', auth: { method: 'api-key', credential: 'ops-key-0123456789abcdef0123' } });
  // NB: secret-c stays `registered`: exposure rules hide an agent from its own (non-system)
  // session too, so its map/agents/update answers 2001.
  await until(async () => {
    const states = Object.fromEntries((await ops.call('map/agents/list')).agents.map((a) => [a.id, a.state]));
    return states['public-a'] === 'idle' && states['public-b'] === 'busy' && states['secret-c'];
  }, 'three agents, the public ones in their states', 15_000);

  const context = await t.context(browser);
  const page = await context.newPage();
  await page.goto(router.uiUrl);

  await t.step('the page asks for a key', async () => {
    await page.locator(tid('auth-form')).waitFor({ timeout: WAIT_MS });
    // NB: the form shows at once, the status on the page's next render (scheduleRender): read
    // at once, it could still say "connecting" on a loaded machine (this step failed so once).
    await page.locator(`${tid('connection-status')}[data-status="auth required"]`).waitFor({ timeout: WAIT_MS });
    assert.equal(await page.locator(tid('agent-node')).count(), 0);
    await shot(page, '05-auth');
  });

  await t.step('a wrong key is refused with a clear error', async () => {
    await page.selectOption(tid('auth-method'), 'api-key');
    await page.fill(tid('auth-credential'), 'not-a-key-0123456789abcdef');
    await page.click(tid('auth-submit'));
    const error = page.locator(tid('auth-error'));
    await error.waitFor({ timeout: WAIT_MS });
    assert.match(await error.textContent(), /invalid_credentials/);
    assert.ok(await page.locator(tid('auth-form')).isVisible());
  });

  await t.step('the right key shows only what its principal may see', async () => {
    await page.fill(tid('auth-credential'), 'dashboard-key-0123456789abcdef');
    await page.click(tid('auth-submit'));
    await page.locator(`${tid('connection-status')}[data-status="live"]`).waitFor({ timeout: WAIT_MS });
    assert.equal(await page.textContent(tid('principal')), 'principal dashboard');
    const nodes = await until(async () => {
      const ns = await treeNodes(page);
      return ns.length === 2 ? ns : null;
    }, 'two visible agents');
    assert.deepEqual(nodes.map((n) => n.id).sort(), ['public-a', 'public-b']);
    await ops.send({ agent: 'secret-c' }, { tag: 'hidden' });
    await ops.send({ agent: 'public-a' }, { tag: 'visible' });
    await page.locator(`${tid('event-row')}[data-type="message_sent"]`, { hasText: '"tag":"visible"' }).waitFor({ timeout: WAIT_MS });
    const text = (await rows(page)).map((r) => r.text).join('\n');
    assert.ok(!text.includes('secret-c') && !text.includes('"tag":"hidden"'), `nothing about the hidden agent: ${text.split('\n').filter((l) => l.includes('secret')).join(' / ')}`);
    assert.ok(!(await treeNodes(page)).some((n) => n.id === 'secret-c'));
  });

  await t.step('steering is offered only where the principal may steer', async () => {
    await page.locator(`${tid('agent-node')}[data-agent-id="public-a"]`).click();
    const detail = page.locator(`${tid('agent-detail')}[data-agent-id="public-a"]`);
    await detail.locator(tid('steering-none')).waitFor({ timeout: WAIT_MS });
    assert.equal(await detail.locator(tid('stop')).count(), 0);
    await shot(page, '06-auth-visible');
  });

  await t.step('the key is kept in the tab across a reload', async () => {
    await page.reload();
    await page.locator(`${tid('connection-status')}[data-status="live"]`).waitFor({ timeout: WAIT_MS });
    assert.ok(!(await page.locator(tid('auth-form')).isVisible()));
    await until(async () => (await treeNodes(page)).length === 2, 'the two visible agents again');
  });

  await t.step("an operator's key (a system principal) sees every agent, the hidden one too", async () => {
    const opsContext = await t.context(browser);
    const opsPage = await opsContext.newPage();
    await opsPage.goto(router.uiUrl);
    await opsPage.locator(tid('auth-form')).waitFor({ timeout: WAIT_MS });
    await opsPage.fill(tid('auth-credential'), 'ops-key-0123456789abcdef0123');
    await opsPage.click(tid('auth-submit'));
    await opsPage.locator(`${tid('connection-status')}[data-status="live"]`).waitFor({ timeout: WAIT_MS });
    assert.match(await opsPage.textContent(tid('principal')), /^principal ops \(operator/);
    const nodes = await until(async () => {
      const ns = await treeNodes(opsPage);
      return ns.length === 3 ? ns : null;
    }, 'three agents for the operator');
    assert.deepEqual(nodes.map((n) => n.id).sort(), ['public-a', 'public-b', 'secret-c']);
    // ...while the ordinary dashboard still shows two.
    assert.equal((await treeNodes(page)).length, 2);
  });
});

scenario('cluster', async (t, browser) => {
  const nats = await startNats();
  t.cleanup(() => nats.stop());
  const router = await t.router(`[cluster]\nurl = "${nats.url}"\nnode = "node-a"\nrequest_timeout_ms = 1000\nconnect_timeout_ms = 3000\n`);
  const context = await t.context(browser);
  const page = await context.newPage();
  await page.goto(router.uiUrl);
  const badge = (state) => page.locator(`${tid('nats-status')}[data-status="${state}"]`);

  await t.step("the header shows the event log's NATS connection", async () => {
    await page.locator(`${tid('connection-status')}[data-status="live"]`).waitFor({ timeout: WAIT_MS });
    await badge('connected').waitFor({ timeout: WAIT_MS });
    assert.equal(await page.textContent(tid('nats-status')), 'nats: connected');
  });

  await t.step('the header lists the nodes of the stream: a standby joins, then dies', async () => {
    const nodes = async () => page.textContent(tid('cluster-nodes'));
    await until(async () => (await nodes()) === 'nodes: node-a (writer)', 'the writer alone');
    const standby = await startStandby(nats.url, 'node-b');
    t.cleanup(() => standby.kill());
    // A standby starts (NATS, the stream followed), then the next roll call (every 2 s) and the
    // page's next /health (every 2 s) show it: more than WAIT_MS on a loaded machine.
    await until(async () => (await nodes()) === 'nodes: node-a (writer) · node-b (standby)', 'the standby listed', 4 * WAIT_MS);
    // Which node each agent is on: one agent connected to the standby, one to the writer.
    await standby.serving();
    const onB = await Peer.connect(standby.url, { participantType: 'agent', name: 'on-b' });
    t.cleanup(() => onB.close());
    await onB.call('map/agents/register', { agentId: 'on-b', name: 'on-b' });
    const onA = await Peer.connect(router.wsUrl, { participantType: 'agent', name: 'on-a' });
    t.cleanup(() => onA.close());
    await onA.call('map/agents/register', { agentId: 'on-a', name: 'on-a' });
    const nodeOf = async (id) =>
      page.$eval(`${tid('agent-tree')} [data-agent-id="${id}"] ${tid('agent-node-name')}`, (n) => n.textContent).catch(() => null);
    // The page asks for new agents' nodes with its /health poll (every 2 s).
    await until(async () => (await nodeOf('on-b')) === 'node-b' && (await nodeOf('on-a')) === 'node-a', 'each agent shown with its node', 4 * WAIT_MS).catch(async (e) => {
      throw new Error(`${e.message}: the tree shows ${JSON.stringify(await treeNodes(page))}`);
    });
    await shot(page, '07a-agents-on-their-nodes');
    await standby.kill();
    await until(async () => (await nodes()) === 'nodes: node-a (writer)', 'the standby gone from the list', 4 * WAIT_MS);
  });

  await t.step('NATS killed: the header says disconnected; NATS back: connected again', async () => {
    await nats.kill();
    await badge('disconnected').waitFor({ timeout: WAIT_MS });
    assert.match(await page.textContent(tid('nats-status')), /^nats: disconnected/);
    await shot(page, '07-nats-disconnected');
    await nats.start();
    await badge('connected').waitFor({ timeout: WAIT_MS });
  });
});

// ---------------------------------------------------------------------------------------------
// The views' scenarios (tests/browser/views/*.mjs; see views/README.md)

const DOCS_IMAGES = path.resolve(HERE, '../../docs/images');
/** A screenshot for the docs: docs/images/dashboard-<name>.png, taken by the suite itself. */
async function docsShot(page, name, options = {}) {
  mkdirSync(DOCS_IMAGES, { recursive: true });
  await page.screenshot({ path: path.join(DOCS_IMAGES, `dashboard-${name}.png`), fullPage: false, ...options });
}

/**
 * An SDK agent (`@multi-agent-protocol/sdk`'s AgentConnection over a real WebSocket), closed
 * when the scenario ends: `await sdkAgent(t, url, {name, role, scopes, auth})`.
 */
async function sdkAgent(t, url, options) {
  const agent = await withTimeout(AgentConnection.connect(url, options), WAIT_MS, `SDK agent ${options?.name}`);
  t.cleanup(() => withTimeout(agent.disconnect(), WAIT_MS, 'SDK agent disconnect').catch(() => {}));
  return agent;
}

/**
 * An SDK agent over a socket the test also reads: `frames` maps each delivered message's id to
 * its frame's `params._meta.traceparent` (the router's span of that delivery, present when the
 * router exports traces), which an instrumented agent continues. `{agent, frames}`.
 */
async function sdkAgentWithFrames(t, url, options) {
  const ws = new WebSocket(url);
  const frames = new Map();
  ws.on('message', (data, isBinary) => {
    if (isBinary) return;
    const f = JSON.parse(data.toString());
    if (f.method === 'map/message' && f.params?.message?.id) frames.set(f.params.message.id, f.params._meta?.traceparent);
  });
  await withTimeout(new Promise((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('error', reject);
  }), WAIT_MS, `${options?.name} socket`);
  t.cleanup(() => ws.terminate());
  const agent = new AgentConnection(websocketStream(ws), options);
  await withTimeout(agent.connect(), WAIT_MS, `SDK agent ${options?.name}`);
  return { agent, frames };
}

const harness = { scenario, sdkAgent, sdkAgentWithFrames, AgentConnection, ClientConnection, assert, until, sleep, withTimeout, tid, shot, docsShot, treeNodes, rows, sequence, range, Peer, startNats, startStandby, freePort, treeConfig, AGENT, BIN, WAIT_MS, QUIET_MS, LIVE_MS, HERE };
const VIEWS_DIR = path.join(HERE, 'views');
for (const file of readdirSync(VIEWS_DIR).filter((f) => f.endsWith('.mjs')).sort()) {
  const mod = await import(pathToFileURL(path.join(VIEWS_DIR, file)).href);
  mod.default(harness);
}

// ---------------------------------------------------------------------------------------------
// Runner

let passed = 0;
let failed = 0;

async function runScenario(s, browser) {
  const cleanups = [];
  let broken = null;
  const t = {
    async router(config, files) {
      const r = await startRouter(config, files);
      cleanups.push(() => stopRouter(r));
      t.routerLog = r.log;
      return r;
    },
    /** kill -9 `r` and start it again on its data directory; resolves with the new router. */
    async restart(r) {
      const next = await restartRouter(r);
      cleanups.push(() => stopRouter(next));
      t.routerLog = next.log;
      return next;
    },
    cleanup(fn) {
      cleanups.push(fn);
    },
    async peer(url, params) {
      const p = await Peer.connect(url, params);
      cleanups.push(() => p.close());
      return p;
    },
    async context(b) {
      const c = await b.newContext({ viewport: { width: 1440, height: 900 } });
      c.setDefaultTimeout(WAIT_MS);
      t.pageErrors = [];
      c.on('page', (p) => {
        p.on('pageerror', (e) => t.pageErrors.push(e.message));
        // console.error from the page's scripts; the browser's own network lines (a router
        // killed on purpose, a socket refused while it restarts) are not the page's errors.
        p.on('console', (m) => {
          if (m.type() !== 'error') return;
          const text = m.text();
          if (/^(Failed to load resource|WebSocket connection to .* failed)/.test(text)) return;
          t.pageErrors.push(`console.error: ${text}`);
        });
      });
      cleanups.push(() => c.close());
      return c;
    },
    async step(name, fn) {
      const label = `${s.name}: ${name}`;
      if (broken) {
        failed++;
        console.log(`FAIL - ${label}: not run after "${broken}" failed`);
        return;
      }
      try {
        await fn();
        if (t.pageErrors?.length) throw new Error(`errors in the page: ${t.pageErrors.join('; ')}`);
        passed++;
        console.log(`ok - ${label}`);
      } catch (err) {
        failed++;
        broken = name;
        console.log(`FAIL - ${label}: ${err.message}${t.pageErrors?.length ? ` (errors in the page: ${t.pageErrors.join('; ')})` : ''}`);
        if (t.routerLog) console.log(`  router stderr (last lines): ${t.routerLog.slice(-8).join('\n    ')}`);
      }
    },
  };
  try {
    await s.fn(t, browser);
  } catch (err) {
    failed++;
    console.log(`FAIL - ${s.name}: ${err.message}`);
  } finally {
    for (const c of cleanups.reverse()) await Promise.resolve(c()).catch(() => {});
  }
}

const overall = setTimeout(() => {
  console.log(`FAIL - the run took longer than ${RUN_LIMIT_MS / 1000} s`);
  for (const r of routers) r.proc.kill('SIGKILL');
  console.log(`${passed} passed, ${failed + 1} failed`);
  process.exit(1);
}, RUN_LIMIT_MS);

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  // launch() gives every run a fresh temporary profile (user-data-dir), removed on close.
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  timeout: 30_000,
});
try {
  for (const s of scenarios) {
    if (FILTER && !s.name.includes(FILTER)) continue;
    await runScenario(s, browser);
  }
} finally {
  await browser.close().catch(() => {});
  for (const r of routers) r.proc.kill('SIGKILL');
  clearTimeout(overall);
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed > 0 ? 0 : 1);
