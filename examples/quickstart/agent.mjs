// An agent that answers every message it gets, and stays: when its connection is lost (the
// router restarted, its cluster node died) it connects again and registers its own agent id
// again, which gets the agent back (the router keeps it, orphaned, for the resume window: it
// is reclaimed with its state, and messages sent `guaranteed` meanwhile arrive) instead of
// making a second `echo`.
//   MAP_ROUTER_URL=ws://127.0.0.1:4500/ node agent.mjs [--seconds N]
//   MAP_ROUTER_URL=ws://127.0.0.1:3001/,ws://127.0.0.1:3002/,ws://127.0.0.1:3003/ node agent.mjs
// With several URLs (a cluster's nodes, docs/cluster.md) each connection tries the next.
// (The SDK's own `reconnection` option cannot do this in @multi-agent-protocol/sdk 0.1.15: its
// connection is closed for good when the socket ends, so every retry fails.)
import WebSocket from 'ws';
globalThis.WebSocket = WebSocket; // Node 20 has no global WebSocket; the SDK expects one.
import { AgentConnection, waitForOpen, websocketStream } from '@multi-agent-protocol/sdk';

const urls = (process.env.MAP_ROUTER_URL || process.env.MAP_URL || 'ws://127.0.0.1:4500/')
  .split(',')
  .map((u) => u.trim())
  .filter(Boolean);
const seconds = Number(process.argv[process.argv.indexOf('--seconds') + 1]) || 0;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Connects to the next URL in turn and registers (as `agentId` when given: getting it back). */
let turn = 0;
async function connect(agentId) {
  const url = urls[turn++ % urls.length];
  const ws = new WebSocket(url);
  try {
    await waitForOpen(ws, 5000);
  } catch (e) {
    ws.terminate();
    throw e;
  }
  const agent = new AgentConnection(websocketStream(ws), { name: 'echo', role: 'echo' });
  await agent.connect(agentId ? { agentId } : undefined);
  agent.onMessage((message) => {
    console.log(`from ${message.from}:`, JSON.stringify(message.payload));
    // Do not await requests inside a handler: the SDK runs handlers one at a time.
    agent.reply(message, { echo: message.payload }).catch((e) => console.error(e.message));
  });
  await agent.idle();
  return agent;
}

/** `connect`, retried for about a minute (longer than a takeover or a restart). */
async function connectRetrying(agentId) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await connect(agentId);
    } catch (e) {
      if (attempt >= 60) throw e;
      await sleep(Math.min(250 * attempt, 2000));
    }
  }
}

let stopping = false;
let agent = await connectRetrying();
const id = agent.agentId;
console.log(`registered as ${id}`);
const stop = async () => {
  stopping = true;
  await agent.disconnect().catch(() => {});
  process.exit(0);
};
process.on('SIGINT', stop);
if (seconds > 0) setTimeout(stop, seconds * 1000);
for (;;) {
  await agent.closed;
  if (stopping) break;
  console.log('connection lost; connecting again');
  try {
    agent = await connectRetrying(id);
  } catch (e) {
    console.error(`gave up connecting: ${e.message}`);
    process.exit(1);
  }
  console.log(`back as ${agent.agentId}`);
}
