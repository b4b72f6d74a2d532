// The federation link's throughput and latency (docs/performance.md, "Federation"): an SDK
// agent on system alpha sends COUNT messages to an SDK agent on system beta
// ({system: "beta", agent}), at most WINDOW sends unanswered at once; the receiver notes each
// arrival. Prints one JSON line: messages, seconds from the first send to the last arrival,
// messages/s, and the send-to-arrival latency p50/p99 (ms; one clock, one machine).
//
//   node scripts/bench-federation.mjs <alpha-url> <alpha-key> <beta-url> <beta-key> [COUNT] [WINDOW]
//
// Run from the repository root (it loads the SDK from tests/interop/node_modules).
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.resolve('tests/interop/package.json'));
const WebSocket = require('ws');
const { AgentConnection, websocketStream } = await import(require.resolve('@multi-agent-protocol/sdk'));
globalThis.WebSocket = WebSocket;

const [alphaUrl, alphaKey, betaUrl, betaKey, countArg = '20000', windowArg = '64'] = process.argv.slice(2);
const COUNT = Number(countArg);
const WINDOW = Number(windowArg);
const timer = setTimeout(() => {
  console.error('bench-federation: timed out');
  process.exit(3);
}, 300_000);

async function agent(url, key, agentId) {
  const ws = new WebSocket(url);
  await new Promise((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('error', reject);
  });
  const a = new AgentConnection(websocketStream(ws), { name: agentId });
  await a.connect({ agentId, auth: { method: 'api-key', credential: key } });
  return a;
}

const bob = await agent(betaUrl, betaKey, 'bench-bob');
const alice = await agent(alphaUrl, alphaKey, 'bench-alice');
const latencies = [];
let arrived = 0;
let lastArrival = 0;
const done = new Promise((resolve) => {
  bob.onMessage((m) => {
    const now = performance.now();
    latencies.push(now - m.payload.t);
    arrived += 1;
    lastArrival = now;
    if (arrived === COUNT) resolve();
  });
});
const start = performance.now();
let next = 0;
async function sender() {
  while (next < COUNT) {
    const n = next++;
    await alice.send({ system: 'beta', agent: 'bench-bob' }, { n, t: performance.now() });
  }
}
await Promise.all(Array.from({ length: WINDOW }, sender));
await done;
latencies.sort((a, b) => a - b);
const q = (p) => Math.round(latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))] * 100) / 100;
const seconds = (lastArrival - start) / 1000;
console.log(JSON.stringify({ messages: COUNT, window: WINDOW, seconds: Math.round(seconds * 1000) / 1000, perSecond: Math.round(COUNT / seconds), p50Ms: q(0.5), p99Ms: q(0.99) }));
clearTimeout(timer);
process.exit(0);
