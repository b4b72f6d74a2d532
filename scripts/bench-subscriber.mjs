// What one subscriber of every event costs the router, without a browser (docs/performance.md,
// "The dashboard under load", the cross-check): 50 raw WebSocket agents send 1 000 messages/s
// to the router (pinned to core 0); phases of PHASE_MS without and with one subscriber on
// /map?linger=LINGER (100; empty for none) alternate ROUNDS times; prints the router's CPU per
// message in each and the share of each pair. EPHEMERAL=1 keeps events in memory.
//
//   node scripts/bench-subscriber.mjs [router binary]   (default target/release/map-router)
import { spawn } from 'node:child_process';
import { readFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
const root = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');
const { default: WebSocket } = await import(path.join(root, 'tests/browser/node_modules/ws/wrapper.mjs'));
const BIN = process.argv[2] ?? path.join(root, 'target/release/map-router');
const PHASE = Number(process.env.PHASE_MS ?? 8000), ROUNDS = Number(process.env.ROUNDS ?? 4), RATE = 1000, AGENTS = 50;
const LINGER = process.env.LINGER ?? '100';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const dir = mkdtempSync(path.join(tmpdir(), 'subcost-'));
writeFileSync(path.join(dir, 'r.toml'), '[limits]\nexempt_loopback = true\n' + (process.env.EPHEMERAL ? '[storage]\nephemeral = true\n' : ''));
const proc = spawn('taskset', ['-c', '0', BIN, 'serve', '--listen', '127.0.0.1:0', '--data-dir', path.join(dir, 'd'), '--config', path.join(dir, 'r.toml')], { stdio: ['ignore', 'ignore', 'pipe'] });
const url = await new Promise((res) => { let b = ''; proc.stderr.on('data', (c) => { b += c; const m = b.match(/ws:\/\/127\.0\.0\.1:\d+\//); if (m) res(m[0]); }); });
const wsUrl = url;
const cpu = () => { const f = readFileSync(`/proc/${proc.pid}/stat`, 'utf8'); const x = f.slice(f.lastIndexOf(')') + 2).split(' '); return (Number(x[11]) + Number(x[12])) / 100; };
async function open(u) { const ws = new WebSocket(u); await new Promise((r, j) => { ws.once('open', r); ws.once('error', j); }); const a = { ws, next: 1, pending: new Map(), events: 0 };
  ws.on('message', (d) => { const s = String(d); if (s.includes('"map/event"')) { a.events++; return; } const f = JSON.parse(s); if (f.id !== undefined && a.pending.has(f.id)) { a.pending.get(f.id)(f); a.pending.delete(f.id); } });
  a.call = (method, params) => new Promise((r) => { const id = a.next++; a.pending.set(id, r); ws.send(JSON.stringify({ jsonrpc: '2.0', id, method, params })); }); return a; }
const agents = [];
for (let i = 0; i < AGENTS; i++) { const a = await open(wsUrl); a.id = `load-${i}`; await a.call('map/connect', { protocolVersion: 1, participantType: 'agent', name: a.id }); await a.call('map/agents/register', { agentId: a.id, name: a.id, role: 'worker' }); agents.push(a); }
let sent = 0;
async function run(ms) { let n = 0; const start = Date.now(); for (;;) { const el = Date.now() - start; if (el >= ms) break; const owed = Math.floor(RATE * el / 1000); while (n < owed) { const from = agents[sent % AGENTS], to = agents[(sent * 7 + 3) % AGENTS]; from.ws.send(JSON.stringify({ jsonrpc: '2.0', id: from.next++, method: 'map/send', params: { to: { agent: to.id }, payload: { seq: sent } } })); sent++; n++; } await sleep(20); } return n; }
const TYPES = process.env.TYPES ? JSON.parse(process.env.TYPES) : undefined;
await run(2000);
if (process.env.PROFILE) {
  const sub = await open(LINGER ? `${wsUrl}map?linger=${LINGER}` : `${wsUrl}map`);
  if (process.env.PROFILE === 'sub') { await sub.call('map/connect', { protocolVersion: 1, participantType: 'client', name: 'dash' }); await sub.call('map/subscribe', {}); }
  await run(1000);
  const perf = spawn('perf', ['record', '-e', 'cpu-clock', '-F', '2000', '-g', '-p', String(proc.pid), '-o', process.env.PROFILE_OUT, '--', 'sleep', String(PHASE / 1000)], { stdio: 'ignore' });
  await run(PHASE); await new Promise((r) => perf.once('exit', r)); proc.kill('SIGKILL'); await sleep(200); rmSync(dir, { recursive: true, force: true }); process.exit(0);
}
const res = { alone: [], sub: [] };
for (let r = 0; r < ROUNDS; r++) {
  let c0 = cpu(); let n = await run(PHASE); res.alone.push(1e6 * (cpu() - c0) / n);
  const sub = await open(LINGER ? `${wsUrl}map?linger=${LINGER}` : `${wsUrl}map`);
  await sub.call('map/connect', { protocolVersion: 1, participantType: 'client', name: 'dash' });
  await sub.call('map/subscribe', TYPES ? { filter: { eventTypes: TYPES } } : {});
  await run(1000);
  c0 = cpu(); const e0 = sub.events; n = await run(PHASE); res.sub.push(1e6 * (cpu() - c0) / n);
  res.events = (sub.events - e0) / n;
  sub.ws.close(); await sleep(300);
}
const med = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const pairs = res.alone.map((a, i) => (res.sub[i] - a) / res.sub[i]);
console.log(JSON.stringify({ alone: res.alone.map((x) => +x.toFixed(1)), sub: res.sub.map((x) => +x.toFixed(1)), eventsPerMsg: res.events, share: pairs.map((x) => +(100 * x).toFixed(1)), medianShare: +(100 * med(pairs)).toFixed(1) }));
proc.kill('SIGKILL'); await sleep(200); rmSync(dir, { recursive: true, force: true }); process.exit(0);
