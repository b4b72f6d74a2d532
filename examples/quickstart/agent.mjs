// An agent that answers every message it gets.
//   MAP_ROUTER_URL=ws://127.0.0.1:4500/ node agent.mjs [--seconds N]
import WebSocket from 'ws';
globalThis.WebSocket = WebSocket; // Node 20 has no global WebSocket; the SDK expects one.
import { AgentConnection } from '@multi-agent-protocol/sdk';

const url = process.env.MAP_ROUTER_URL || process.env.MAP_URL || 'ws://127.0.0.1:4500/';
const agent = await AgentConnection.connect(url, { name: 'echo', role: 'echo' });
console.log(`registered as ${agent.agentId}`);

agent.onMessage((message) => {
  console.log(`from ${message.from}:`, JSON.stringify(message.payload));
  // Do not await requests inside a handler: the SDK runs handlers one at a time.
  agent.reply(message, { echo: message.payload }).catch((e) => console.error(e.message));
});
await agent.idle();

const seconds = Number(process.argv[process.argv.indexOf('--seconds') + 1]) || 0;
const stop = async () => { await agent.disconnect(); process.exit(0); };
process.on('SIGINT', stop);
if (seconds > 0) setTimeout(stop, seconds * 1000);
