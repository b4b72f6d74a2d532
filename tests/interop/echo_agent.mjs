#!/usr/bin/env node
// A MAP echo agent written with the official SDK (@multi-agent-protocol/sdk), over WebSocket:
// it answers every message with reply(message, message.payload) and ignores the A2A gateway's
// cancel notices. tests/a2a_py/acceptance.py starts it; it prints `ready <agentId>` on stdout
// once registered and exits when stdin closes.
//
//   node tests/interop/echo_agent.mjs <ws://router-url> [name]
import WebSocket from 'ws';
import { AgentConnection, websocketStream } from '@multi-agent-protocol/sdk';

globalThis.WebSocket = WebSocket;
const [url, name = 'echo'] = process.argv.slice(2);
const ws = new WebSocket(url);
await new Promise((resolve, reject) => {
  ws.once('open', resolve);
  ws.once('error', reject);
});
const agent = new AgentConnection(websocketStream(ws), { name });
agent.onMessage((m) => {
  if (m.payload && typeof m.payload === 'object' && m.payload.a2a?.cancel) return;
  // Not awaited: the SDK runs message handlers one at a time.
  agent.reply(m, m.payload).catch((e) => console.error(`reply failed: ${e.message}`));
});
await agent.connect();
process.stdout.write(`ready ${agent.agentId}\n`);
process.stdin.resume();
process.stdin.on('end', () => process.exit(0));
