#!/usr/bin/env node
// A MAP agent written with the official SDK (@multi-agent-protocol/sdk), over WebSocket, that
// advertises itself to AIP by joining scope `aip:<domain>` (docs/aip.md). tests/aip_py/
// acceptance.py starts it, for both directions of issue 25's agent sessions:
// - what it receives from an AIP agent (a message with meta.aip) it answers with reply():
//   `{"parts": [{"kind": "text", "text": "map agent heard: <texts>"}]}`, and prints
//   `got <sessionStatus> <texts> trace=<meta.traceparent>`;
// - a line `send <agentId> <json payload>` on stdin makes it send that payload to that agent
//   (correlationId `rev-<n>`, expectsResponse); `send-kept` adds `delivery: "guaranteed"` (kept
//   for a recipient that is away); the reply is printed as `answer <json>`.
// It prints `ready <agentId>` once registered and exits when stdin closes.
//
//   node tests/interop/aip_map_agent.mjs <ws://router-url> <name> <domain>
import WebSocket from 'ws';
import readline from 'node:readline';
import { AgentConnection, websocketStream } from '@multi-agent-protocol/sdk';

globalThis.WebSocket = WebSocket;
const [url, name = 'map-agent', domain = 'default'] = process.argv.slice(2);
const ws = new WebSocket(url);
await new Promise((resolve, reject) => {
  ws.once('open', resolve);
  ws.once('error', reject);
});
const agent = new AgentConnection(websocketStream(ws), { name, role: 'assistant' });
const texts = (payload) =>
  (payload?.parts ?? []).filter((p) => p.kind === 'text').map((p) => p.text).join(' ');
agent.onMessage((m) => {
  if (m.meta?.isResult) {
    process.stdout.write(`answer ${JSON.stringify({ from: m.from, payload: m.payload, meta: m.meta })}\n`);
    return;
  }
  if (m.meta?.aip) {
    process.stdout.write(`got ${m.meta.aip.sessionStatus} ${texts(m.payload)} trace=${m.meta.traceparent ?? ''}\n`);
    agent
      .reply(m, { parts: [{ kind: 'text', text: `map agent heard: ${texts(m.payload)}` }] })
      .catch((e) => console.error(`reply failed: ${e.message}`));
  }
});
await agent.connect();
const scope = `aip:${domain}`;
try {
  await agent.createScope({ scopeId: scope, name: scope });
} catch {
  // The gateway made it already.
}
await agent.joinScope(scope);
process.stdout.write(`ready ${agent.agentId}\n`);
let n = 0;
const lines = readline.createInterface({ input: process.stdin });
lines.on('line', (line) => {
  const m = line.match(/^(send|send-kept) (\S+) (.*)$/);
  if (!m) return;
  n += 1;
  const meta = { correlationId: `rev-${n}`, expectsResponse: true };
  if (m[1] === 'send-kept') meta.delivery = 'guaranteed';
  agent
    .send({ agent: m[2] }, JSON.parse(m[3]), meta)
    .catch((e) => process.stdout.write(`answer ${JSON.stringify({ error: e.message })}\n`));
});
lines.on('close', () => process.exit(0));
