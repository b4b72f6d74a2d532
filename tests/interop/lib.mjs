// Infrastructure for the interop suite: router processes, SDK connections over real WebSocket
// sockets, bounded waits and assertions. The scenarios live in run.mjs.
import WebSocket from 'ws';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import assert from 'node:assert/strict';
import { ClientConnection, AgentConnection, websocketStream } from '@multi-agent-protocol/sdk';

// Node 20 has no global WebSocket; the SDK's static connect() helpers and websocketStream() use it.
globalThis.WebSocket = WebSocket;

export { assert };

/** Default bound for a single wait (an event, a message, a socket opening). */
export const WAIT_MS = 3000;

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Resolves with `promise`, or rejects after `ms` with "<what> timed out"; the timer is always cleared. */
export function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} timed out after ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** Polls `fn` until it returns something truthy (returned), or throws after `timeout` ms. */
export async function until(fn, what, timeout = WAIT_MS) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = fn();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${typeof what === "function" ? what() : what}`);
    await sleep(10);
  }
}

/** Awaits `promise`, which must reject with a MAP error carrying `code`; returns the error. */
export async function expectCode(promise, code, what) {
  let result;
  try {
    result = await withTimeout(Promise.resolve(promise), WAIT_MS, what);
  } catch (err) {
    if (err && err.code === code) return err;
    throw new Error(`${what}: expected error code ${code}, got ${err?.code ?? 'no code'} (${err?.message})`);
  }
  throw new Error(`${what}: expected error code ${code}, got success ${JSON.stringify(result)}`);
}

export const sorted = (xs) => [...xs].sort();

// ---------------------------------------------------------------------------------------------
// Router processes

const liveRouters = new Set();

export function killAllRouters() {
  for (const r of liveRouters) {
    try {
      r.proc.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
}

/**
 * Starts `bin --listen <listen> --data-dir <dir> [--config <tmp toml>]` and resolves once
 * stderr reports the listening URL. The event store lives in a fresh temp directory (removed by
 * `stopRouter`) unless `dataDir` names one, which outlives the router (restart tests).
 * `listen` defaults to `127.0.0.1:0`; a restarted router passes the previous one's
 * `127.0.0.1:<port>` (the router binds with SO_REUSEADDR, so this works right after a kill).
 */
export function startRouter(bin, { config, dataDir, listen = '127.0.0.1:0', verbose = false } = {}) {
  return new Promise((resolve, reject) => {
    const args = ['--listen', listen];
    const dir = mkdtempSync(path.join(tmpdir(), 'map-router-interop-'));
    args.push('--data-dir', dataDir ?? path.join(dir, 'data'));
    if (config) {
      const file = path.join(dir, 'router.toml');
      writeFileSync(file, config);
      args.push('--config', file);
    }
    const proc = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    const router = { proc, dir, url: null, log: [], exited: false, exitCode: null };
    liveRouters.add(router);
    const tail = () => router.log.slice(-10).join(' | ') || '(empty)';
    let settled = false;
    const fail = (err) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      void stopRouter(router);
      reject(err);
    };
    const timer = setTimeout(
      () => fail(new Error(`router did not report its port within 5 s; stderr: ${tail()}`)),
      5000,
    );
    let buf = '';
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (chunk) => {
      buf += chunk;
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        router.log.push(line);
        if (router.log.length > 200) router.log.shift();
        if (verbose) process.stderr.write(`[router ${proc.pid}] ${line}\n`);
        const m = /map-router listening on (ws:\/\/127\.0\.0\.1:\d+\/)/.exec(line);
        if (m && !settled) {
          settled = true;
          clearTimeout(timer);
          router.url = m[1];
          resolve(router);
        }
      }
    });
    proc.on('error', (err) => fail(err));
    proc.on('exit', (code, signal) => {
      router.exited = true;
      router.exitCode = code ?? signal;
      liveRouters.delete(router);
      fail(new Error(`router exited (${code ?? signal}) before listening; stderr: ${tail()}`));
    });
  });
}

/**
 * Sends `signal` to the router and waits (bounded) until it has exited. Unlike `stopRouter` it
 * leaves the router's temp directory alone, so a restart test can reopen its data dir.
 */
export async function killRouter(router, signal = 'SIGKILL') {
  if (!router.exited) {
    const exited = new Promise((resolve) => router.proc.once('exit', resolve));
    router.proc.kill(signal);
    await withTimeout(exited, WAIT_MS, `router exit after ${signal}`);
  }
  liveRouters.delete(router);
}

/** Polls the async `check` every 50 ms until it is true (bounded by `timeout`). */
async function poll(check, what, timeout) {
  const deadline = Date.now() + timeout;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${typeof what === "function" ? what() : what}`);
    await sleep(50);
  }
}

/** A free loopback TCP port. */
async function freePort() {
  const { createServer } = await import('node:net');
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
 * `nats-server -js` on a free loopback port with a temporary store (cluster scenarios);
 * `stop()` kills it and removes the store.
 */
export async function startNats() {
  const dir = mkdtempSync(path.join(tmpdir(), 'map-router-interop-nats-'));
  const port = await freePort();
  const proc = spawn('nats-server', ['-a', '127.0.0.1', '-p', String(port), '-js', '-sd', path.join(dir, 'store')], { stdio: 'ignore' });
  const failed = new Promise((_, reject) => proc.once('error', (e) => reject(new Error(`cannot start nats-server: ${e.message}`))));
  const { connect } = await import('node:net');
  const listening = () =>
    new Promise((resolve) => {
      const sock = connect(port, '127.0.0.1', () => {
        sock.destroy();
        resolve(true);
      });
      sock.once('error', () => resolve(false));
    });
  await Promise.race([failed, poll(listening, 'nats-server to listen', 10_000)]);
  return {
    url: `nats://127.0.0.1:${port}`,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        const exited = new Promise((r) => proc.once('exit', r));
        proc.kill('SIGKILL');
        await withTimeout(exited, WAIT_MS, 'nats-server exit');
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * A standby node (cluster mode, `[cluster] standby = true` in `config`) on a free port: it
 * prints its address only once it takes over, so this waits until its `/health` says it
 * serves subscriptions. Stopped like a router (`stopRouter`: SIGTERM).
 */
/**
 * The `[cluster]` section of node `node` on the nats-server at `natsUrl` (short NATS timeouts),
 * with `extra` lines (e.g. `standby = true`); it starts on a new line, to follow any config.
 */
export const clusterSection = (natsUrl, node, extra = '') =>
  `\n[cluster]\nurl = "${natsUrl}"\nnode = "${node}"\nrequest_timeout_ms = 1000\nconnect_timeout_ms = 3000\n${extra}`;

export async function startStandby(bin, { config, verbose = false }) {
  const port = await freePort();
  const dir = mkdtempSync(path.join(tmpdir(), 'map-router-interop-'));
  const file = path.join(dir, 'router.toml');
  writeFileSync(file, config);
  const args = ['--listen', `127.0.0.1:${port}`, '--data-dir', path.join(dir, 'data'), '--config', file];
  const proc = spawn(bin, args, { stdio: ['ignore', 'ignore', verbose ? 'inherit' : 'ignore'] });
  const router = { proc, dir, url: `ws://127.0.0.1:${port}/`, log: [], exited: false, exitCode: null };
  liveRouters.add(router);
  proc.on('exit', (code, signal) => {
    router.exited = true;
    router.exitCode = code ?? signal;
    liveRouters.delete(router);
  });
  await poll(async () => {
    if (router.exited) throw new Error(`standby exited (${router.exitCode})`);
    try {
      const r = await fetch(`http://127.0.0.1:${port}/health`);
      return (await r.text()).includes('\nserving:');
    } catch {
      return false;
    }
  }, 'the standby to serve', 20_000);
  return router;
}

/** `127.0.0.1:<port>` of a running router, for `startRouter({listen})` on the same port. */
export const hostPort = (router) => new URL(router.url).host;

export async function stopRouter(router) {
  if (!router.exited) {
    const exited = new Promise((resolve) => router.proc.once('exit', resolve));
    router.proc.kill('SIGTERM');
    try {
      await withTimeout(exited, 2000, 'router SIGTERM');
    } catch {
      router.proc.kill('SIGKILL');
      await withTimeout(exited, 2000, 'router SIGKILL').catch(() => {});
    }
  }
  liveRouters.delete(router);
  if (router.dir) rmSync(router.dir, { recursive: true, force: true });
}

// ---------------------------------------------------------------------------------------------
// Connections

function openSocket(url) {
  const ws = new WebSocket(url);
  const frames = [];
  const sent = [];
  // Every frame the SDK writes goes through ws.send: record it (acks are notifications, so the
  // only trace of them is what we sent).
  const send = ws.send.bind(ws);
  ws.send = (data, ...rest) => {
    try {
      sent.push(JSON.parse(String(data)));
    } catch {
      sent.push({ unparsable: String(data) });
    }
    return send(data, ...rest);
  };
  // Registered before the SDK's own listener: every frame the SDK sees is recorded here first.
  ws.on('message', (data, isBinary) => {
    if (isBinary) return;
    try {
      frames.push(JSON.parse(data.toString()));
    } catch {
      frames.push({ unparsable: data.toString() });
    }
  });
  const opened = new Promise((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('error', reject);
  });
  return { ws, frames, sent, opened: withTimeout(opened, WAIT_MS, `WebSocket open ${url}`) };
}

/** Raw frames helpers shared by both handle kinds. */
class Handle {
  constructor(ctx, { ws, frames, sent }, name) {
    this.ctx = ctx;
    this.ws = ws;
    /** Frames received, parsed. */
    this.frames = frames;
    /** Frames the SDK sent on this socket, parsed. */
    this.sent = sent;
    this.name = name;
  }

  /** `map/message` notifications received on this socket, as Message objects. */
  get received() {
    return this.frames
      .filter((f) => f.method === 'map/message')
      .map((f) => f.params?.message ?? f.params);
  }

  /** `map/event` envelopes received for subscription `subId`. */
  envelopes(subId) {
    return this.frames
      .filter((f) => f.method === 'map/event' && f.params?.subscriptionId === subId)
      .map((f) => f.params);
  }

  /** Abrupt close: no close handshake, no map/disconnect. */
  terminate() {
    this.ws.terminate();
  }

  /**
   * Subscribes and collects the events the SDK hands to `on('event')`; `onEvent(event, sub)`,
   * if given, is called from the same handler right after.
   */
  async watch(filter, { onEvent } = {}) {
    const sub = await withTimeout(this.conn.subscribe(filter), WAIT_MS, 'subscribe');
    const events = [];
    sub.on('event', (event) => {
      events.push(event);
      onEvent?.(event, sub);
    });
    const w = { sub, events, handle: this, envelopes: () => this.envelopes(sub.id) };
    w.waitFor = (type, pred = () => true, what) =>
      until(
        () => events.find((e) => e.type === type && pred(e)),
        what ?? `${type} event on ${this.name}`,
      );
    w.ofType = (type) => events.filter((e) => e.type === type);
    this.ctx.watches.push(w);
    return w;
  }
}

export class ClientHandle extends Handle {
  /** Messages this client's connection received (ClientConnection itself ignores map/message). */
  get inbox() {
    return this.received;
  }
}

export class AgentHandle extends Handle {
  constructor(ctx, socket, name) {
    super(ctx, socket, name);
    this.inbox = [];
  }

  /** Calls any method on this agent's connection. */
  call(method, params) {
    return withTimeout(this.conn.callExtension(method, params), WAIT_MS, method);
  }
}

/** Per-scenario context: routers, connections and the invariants checked after the scenario. */
export class Ctx {
  constructor({ bin, verbose }) {
    this.bin = bin;
    this.verbose = verbose;
    this.routers = [];
    this.handles = [];
    this.watches = [];
    this.sdkLogs = [];
    this.deferred = [];
    this.tempDirs = [];
    this.allowedWarnings = [];
    this.url = null;
  }

  /**
   * The node the next SDK client or agent connects to: the scenario's router, or in spread
   * mode (`MAP_INTEROP_SPREAD=1`) the writer and the standby in turn.
   */
  nextUrl() {
    if (!this.spread) return this.url;
    this.spreadTurn = (this.spreadTurn ?? 0) + 1;
    return this.spread[this.spreadTurn % this.spread.length];
  }

  async startRouter(opts = {}) {
    const router = await startRouter(this.bin, { ...opts, verbose: this.verbose });
    this.routers.push(router);
    return router;
  }

  /** `startStandby` (above), stopped at cleanup. */
  async startStandby(opts) {
    const router = await startStandby(this.bin, { ...opts, verbose: this.verbose });
    this.routers.push(router);
    return router;
  }

  /** `startNats` (above), stopped at cleanup, after the routers. */
  async startNats() {
    const nats = await startNats();
    this.defer(() => nats.stop());
    return nats;
  }

  /** See `killRouter`: the router is still stopped (and its temp dir removed) at cleanup. */
  killRouter(router, signal = 'SIGKILL') {
    return killRouter(router, signal);
  }

  /** A temp directory (e.g. a data dir shared by two routers), removed after the routers stop. */
  tempDir() {
    const dir = mkdtempSync(path.join(tmpdir(), 'map-router-interop-data-'));
    this.tempDirs.push(dir);
    return dir;
  }

  /**
   * Lets `checkInvariants` pass SDK warnings matching `pattern` that also contain `id` (a
   * subscription id), for subscriptions the SDK cannot know about; `why` documents it.
   */
  allowSdkWarnings(pattern, id, why) {
    assert.ok(id && why, 'allowSdkWarnings needs an id and a reason');
    this.allowedWarnings.push({ pattern, id });
  }

  /** A ClientConnection over our own socket; `connect: false` leaves out map/connect. */
  async client({ name = 'client', url = this.nextUrl(), connect = true, connectOptions, capabilities } = {}) {
    const socket = openSocket(url);
    const h = new ClientHandle(this, socket, name);
    this.handles.push(h);
    await socket.opened;
    h.conn = new ClientConnection(websocketStream(socket.ws), { name, capabilities });
    if (connect) {
      h.result = await withTimeout(h.conn.connect(connectOptions), WAIT_MS, `${name} connect`);
      h.id = h.result.participantId;
    }
    return h;
  }

  /**
   * An AgentConnection over our own socket (connect + register). `agentId` re-registers an
   * existing id, as the SDK's reconnect does.
   */
  async agent({ name = 'agent', url = this.nextUrl(), agentId, role, parent, scopes, visibility, capabilities } = {}) {
    const socket = openSocket(url);
    const h = new AgentHandle(this, socket, name);
    this.handles.push(h);
    await socket.opened;
    h.conn = new AgentConnection(websocketStream(socket.ws), {
      name,
      role,
      parent,
      scopes,
      visibility,
      capabilities,
    });
    h.conn.onMessage((message) => {
      h.inbox.push(message);
    });
    h.result = await withTimeout(
      h.conn.connect(agentId ? { agentId } : undefined),
      WAIT_MS,
      `${name} connect+register`,
    );
    h.id = h.conn.agentId;
    h.pid = h.result.connection.participantId;
    return h;
  }

  /** A started `ResumingDashboard` (below). */
  dashboard(opts = {}) {
    return new ResumingDashboard(this, opts).start();
  }

  defer(fn) {
    this.deferred.push(fn);
  }

  /** Invariants every subscription must satisfy, whatever the scenario. */
  checkInvariants() {
    for (const w of this.watches) {
      const envs = w.envelopes();
      envs.forEach((env, i) => {
        assert.equal(
          env.sequenceNumber,
          i + 1,
          `subscription ${w.sub.id} on ${w.handle.name}: sequence numbers must start at 1 without gaps (got ${envs.map((e) => e.sequenceNumber).join(',')})`,
        );
        if (env.eventId !== undefined) {
          assert.equal(env.event?.id, env.eventId, `event.id must equal the envelope eventId (${env.event?.type})`);
        }
        assert.equal(typeof env.event?.source, 'string', `event.source must be a string (${env.event?.type})`);
      });
    }
    const allowed = (l) => this.allowedWarnings.some((a) => a.pattern.test(l) && l.includes(a.id));
    const gaps = this.sdkLogs.filter((l) => /sequence gap|unknown subscription/i.test(l) && !allowed(l));
    assert.equal(gaps.length, 0, `SDK warnings: ${gaps.join(' / ')}`);
  }

  async cleanup() {
    for (const fn of this.deferred) {
      try {
        await withTimeout(Promise.resolve().then(fn), 1000, 'deferred cleanup');
      } catch {
        // best effort
      }
    }
    for (const h of this.handles) {
      try {
        h.ws.terminate();
      } catch {
        // already closed
      }
    }
    await Promise.all(this.routers.map((r) => stopRouter(r)));
    for (const dir of this.tempDirs) rmSync(dir, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------------------------------------
// A dashboard that survives losing its connection

/**
 * A client that keeps one subscription going across lost connections and router restarts, the
 * way ClientConnection's `reconnection` option is documented to (SDK `#attemptReconnect` and
 * `#restoreSubscriptions`): when its socket closes it opens a new one (retrying with backoff), a
 * new ClientConnection `connect()`s with a fresh session, `subscribe(filter)`s again, then
 * `replay({afterEventId: <newest event id seen>, filter})` page by page, and hands every event to
 * one handler, dropping event ids it has already handled (as the SDK's Subscription does).
 *
 * Why not the SDK's own option: in @multi-agent-protocol/sdk 0.1.15 it cannot succeed.
 * BaseConnection.close() moves the connection to state "closed" and BaseConnection.reconnect()
 * throws "Cannot reconnect a permanently closed connection" in that state, so every attempt
 * fails and the client ends with `reconnectFailed`. Even past that, `#restoreSubscriptions`
 * puts the restored events into a new Subscription object (only its id is reported, in
 * `subscriptionRestored`), so the handlers on the subscription the application holds never see
 * another event. Every step here is public SDK API over our own sockets, so frames are recorded
 * and every subscription is checked by `checkInvariants`.
 */
export class ResumingDashboard {
  /**
   * `url`: where to (re)connect; `filter`: the subscription filter (undefined = everything);
   * `retry`: `{baseDelayMs, maxDelayMs, maxRetries}` between failed reconnection attempts.
   */
  constructor(ctx, { name = 'dashboard', url = ctx.url, filter, retry = {} } = {}) {
    this.ctx = ctx;
    this.name = name;
    this.url = url;
    this.filter = filter;
    this.retry = { baseDelayMs: 25, maxDelayMs: 200, maxRetries: 40, ...retry };
    /** What the dashboard's handler got: each event once, in the order handled. */
    this.events = [];
    /** Every event before de-duplication: `{eventId, via: 'live' | 'replay', subscriptionId}`. */
    this.arrivals = [];
    /** Reconnection events, named as the SDK's `onReconnection` names them. */
    this.history = [];
    /** One entry per connection: `{handle, watch}`. */
    this.connections = [];
    this.seen = new Set();
    this.lastEventId = undefined;
    this.closed = false;
    this.gate = null;
    ctx.defer(() => {
      this.closed = true;
    });
  }

  /** The current connection's handle and subscription. */
  get current() {
    return this.connections.at(-1);
  }

  async start() {
    await this.#attach();
    return this;
  }

  /** Abruptly closes the current socket (the dashboard then resumes by itself). */
  terminate() {
    this.current.handle.terminate();
  }

  /** Until the returned function is called, reconnection waits (to make things happen meanwhile). */
  holdReconnection() {
    let release;
    this.gate = new Promise((resolve) => {
      release = resolve;
    });
    return () => {
      this.gate = null;
      release();
    };
  }

  /** Waits for the `n`-th (1-based) reconnection event of `type`; returns it. */
  reconnection(type, n = 1, timeout = WAIT_MS) {
    return until(
      () => this.history.filter((e) => e.type === type)[n - 1],
      `${this.name}: reconnection event ${type} #${n} (history: ${this.history.map((e) => e.type).join(',') || 'none'})`,
      timeout,
    );
  }

  /** Waits until the handler has got `n` events; returns them. */
  waitForCount(n, timeout = WAIT_MS) {
    return until(
      () => this.events.length >= n && this.events,
      `${this.name}: ${n} events (has ${this.events.length})`,
      timeout,
    );
  }

  /** Waits until the handler has got an event matching `pred`; returns it. */
  waitFor(pred, what, timeout = WAIT_MS) {
    return until(() => this.events.find(pred), `${this.name}: ${what}`, timeout);
  }

  #handle(event, via, subscriptionId) {
    if (this.closed) return;
    this.arrivals.push({ eventId: event.id, via, subscriptionId });
    if (this.seen.has(event.id)) return;
    this.seen.add(event.id);
    this.events.push(event);
    if (!this.lastEventId || event.id > this.lastEventId) this.lastEventId = event.id;
  }

  async #attach() {
    const handle = await this.ctx.client({ name: this.name, url: this.url });
    const watch = await handle.watch(this.filter, { onEvent: (e, sub) => this.#handle(e, 'live', sub.id) });
    this.connections.push({ handle, watch });
    handle.ws.once('close', () => {
      if (this.closed) return;
      this.history.push({ type: 'disconnected' });
      void this.#reconnect(watch.sub.id);
    });
    return watch;
  }

  async #reconnect(oldSubscriptionId) {
    if (this.gate) await this.gate;
    const { baseDelayMs, maxDelayMs, maxRetries } = this.retry;
    let watch;
    for (let attempt = 1; !watch; attempt++) {
      if (this.closed) return;
      try {
        watch = await this.#attach();
      } catch (error) {
        if (attempt > maxRetries) {
          this.history.push({ type: 'reconnectFailed', error });
          return;
        }
        const delay = Math.min(baseDelayMs * 2 ** (attempt - 1), maxDelayMs);
        this.history.push({ type: 'reconnecting', attempt, delay, error });
        await sleep(delay);
      }
    }
    this.history.push({ type: 'reconnected' });
    const conn = this.current.handle.conn;
    try {
      let afterEventId = this.lastEventId;
      for (let page = 0; afterEventId && page < 100; page++) {
        const res = await withTimeout(conn.replay({ afterEventId, filter: this.filter, limit: 100 }), WAIT_MS, 'replay');
        for (const item of res.events) this.#handle(item.event, 'replay', watch.sub.id);
        if (!res.hasMore || res.events.length === 0) break;
        afterEventId = res.events.at(-1).eventId;
      }
      this.history.push({ type: 'subscriptionRestored', subscriptionId: oldSubscriptionId, newSubscriptionId: watch.sub.id });
    } catch (error) {
      this.history.push({ type: 'subscriptionRestoreFailed', subscriptionId: oldSubscriptionId, error });
    }
  }
}

/**
 * Runs `scenarios` ({name, fn(ctx)}) one after the other, each with a fresh `Ctx` and its own
 * time limit, and prints `ok - name` / `FAIL - name: reason` lines and a `N passed, M failed`
 * summary; exits 0 only when nothing failed. The SDKs' console warnings go to the scenario's
 * `sdkLogs` (and to stderr with `verbose`); routers are killed on exit and on Ctrl-C. Used by
 * the A2A suites (a2a.mjs, a2a_remote.mjs).
 */
export async function runScenarios(scenarios, { bin, filter, verbose, timeoutMs }) {
  let currentCtx = null;
  for (const level of ['warn', 'error']) {
    const original = console[level].bind(console);
    console[level] = (...args) => {
      const line = args.map((a) => (a instanceof Error ? a.message : typeof a === 'string' ? a : JSON.stringify(a))).join(' ');
      currentCtx?.sdkLogs.push(line);
      if (verbose) original(`[sdk] ${line}`);
    };
  }
  process.on('exit', killAllRouters);
  for (const sig of ['SIGINT', 'SIGTERM']) {
    process.on(sig, () => {
      killAllRouters();
      process.exit(130);
    });
  }

  if (!existsSync(bin)) {
    process.stdout.write(`FAIL - setup: router binary not found at ${bin} (cargo build --bin map-router)\n`);
    process.stdout.write('0 passed, 1 failed\n');
    process.exit(1);
  }
  let passed = 0;
  let failed = 0;
  for (const s of scenarios.filter((s) => !filter || s.name.includes(filter))) {
    const ctx = new Ctx({ bin, verbose });
    currentCtx = ctx;
    let err = null;
    try {
      await withTimeout(s.fn(ctx), timeoutMs, `scenario ${s.name}`);
      ctx.checkInvariants();
    } catch (e) {
      err = e;
    }
    await withTimeout(ctx.cleanup(), 5000, 'cleanup').catch(() => {});
    currentCtx = null;
    if (err) {
      failed++;
      process.stdout.write(`FAIL - ${s.name}: ${String(err?.message ?? err).replace(/\s+/g, ' ').trim()}\n`);
      if (verbose && err?.stack) process.stderr.write(`${err.stack}\n`);
    } else {
      passed++;
      process.stdout.write(`ok - ${s.name}\n`);
    }
  }
  process.stdout.write(`${passed} passed, ${failed} failed\n`);
  killAllRouters();
  process.exit(failed === 0 ? 0 : 1);
}

