// Infrastructure for the interop suite: router processes, SDK connections over real WebSocket
// sockets, bounded waits and assertions. The scenarios live in run.mjs.
import WebSocket from 'ws';
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
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
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
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
 * Starts `bin --listen 127.0.0.1:0 --data-dir <dir> [--config <tmp toml>]` and resolves once
 * stderr reports the listening URL. The event store lives in a fresh temp directory (removed by
 * `stopRouter`) unless `dataDir` names one, which outlives the router (restart tests).
 */
export function startRouter(bin, { config, dataDir, verbose = false } = {}) {
  return new Promise((resolve, reject) => {
    const args = ['--listen', '127.0.0.1:0'];
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
  return { ws, frames, opened: withTimeout(opened, WAIT_MS, `WebSocket open ${url}`) };
}

/** Raw frames helpers shared by both handle kinds. */
class Handle {
  constructor(ctx, ws, frames, name) {
    this.ctx = ctx;
    this.ws = ws;
    this.frames = frames;
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

  /** Subscribes and collects the events the SDK hands to `on('event')`. */
  async watch(filter) {
    const sub = await withTimeout(this.conn.subscribe(filter), WAIT_MS, 'subscribe');
    const events = [];
    sub.on('event', (event) => events.push(event));
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
  constructor(ctx, ws, frames, name) {
    super(ctx, ws, frames, name);
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
    this.url = null;
  }

  async startRouter(opts = {}) {
    const router = await startRouter(this.bin, { ...opts, verbose: this.verbose });
    this.routers.push(router);
    return router;
  }

  /** A ClientConnection over our own socket; `connect: false` leaves out map/connect. */
  async client({ name = 'client', url = this.url, connect = true, connectOptions, capabilities } = {}) {
    const { ws, frames, opened } = openSocket(url);
    const h = new ClientHandle(this, ws, frames, name);
    this.handles.push(h);
    await opened;
    h.conn = new ClientConnection(websocketStream(ws), { name, capabilities });
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
  async agent({ name = 'agent', url = this.url, agentId, role, parent, scopes, visibility, capabilities } = {}) {
    const { ws, frames, opened } = openSocket(url);
    const h = new AgentHandle(this, ws, frames, name);
    this.handles.push(h);
    await opened;
    h.conn = new AgentConnection(websocketStream(ws), {
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
    const gaps = this.sdkLogs.filter((l) => /sequence gap|unknown subscription/i.test(l));
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
  }
}
