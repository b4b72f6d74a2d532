#!/usr/bin/env node
// A MAP agent (official SDK, `AgentConnection` over WebSocket) that behaves as the A2A
// conformance kit's system-under-test agent expects (a2aproject/a2a-tck, 1.0-dev:
// scenarios/core_operations.feature and streaming.feature), through the A2A gateway's agent
// conventions (docs/a2a.md, "For agents: the conventions"): the behaviour is picked by the
// prefix of the A2A messageId (`meta.a2a.messageId`). Anything else is echoed, as
// echo_agent.mjs does; with `--v03`, it is worked on as the v0.3 kit's own reference agent
// (python-sut/tck_core_agent at 0.3.0.beta4) does: `working`, about 1.2 s of work, a text
// artifact, `completed` (a cancel meanwhile ends the task at the gateway, which then ignores
// the rest). docs/compatibility.md ("A2A conformance kit") says how to run the kit with it; it
// prints `ready <agentId>` once registered and exits when stdin closes.
//
//   node tests/interop/tck_agent.mjs <ws://router-url> [name] [--v03]
import WebSocket from 'ws';
import { AgentConnection, websocketStream } from '@multi-agent-protocol/sdk';

globalThis.WebSocket = WebSocket;
const args = process.argv.slice(2);
const v03 = args.includes('--v03');
const [url, name = 'tck'] = args.filter((a) => a !== '--v03');
const ws = new WebSocket(url);
await new Promise((resolve, reject) => {
  ws.once('open', resolve);
  ws.once('error', reject);
});
const agent = new AgentConnection(websocketStream(ws), { name });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const file = { raw: Buffer.from('TCK file content').toString('base64'), filename: 'output.txt', mediaType: 'text/plain' };
const fileUrl = { url: 'https://example.com/output.txt', filename: 'output.txt', mediaType: 'text/plain' };

// prefix -> the reports to send, in order (the last one ends the task).
const SCENARIOS = [
  ['tck-complete-task', [{ state: 'completed', message: 'Hello from TCK' }]],
  ['tck-artifact-text', [{ artifact: { parts: [{ text: 'Generated text content' }] } }, { state: 'completed' }]],
  ['tck-artifact-file-url', [{ artifact: { parts: [fileUrl] } }, { state: 'completed' }]],
  ['tck-artifact-file', [{ artifact: { parts: [file] } }, { state: 'completed' }]],
  ['tck-artifact-data', [{ artifact: { parts: [{ data: { key: 'value', count: 42 } }] } }, { state: 'completed' }]],
  ['tck-message-response', [{ reply: 'Direct message response' }]],
  ['tck-input-required', [{ state: 'input-required', message: 'Input required' }]],
  ['tck-reject-task', [{ state: 'rejected', message: 'rejected' }]],
  ['tck-stream-002', [{ state: 'completed' }]],
  ['tck-stream-artifact-text', [{ status: 'working' }, { artifact: { parts: [{ text: 'Streamed text content' }] } }, { state: 'completed' }]],
  ['tck-stream-artifact-file', [{ status: 'working' }, { artifact: { parts: [file] } }, { state: 'completed' }]],
  ['tck-stream-artifact-chunked', [
    { status: 'working' },
    { artifact: { artifactId: 'chunked', parts: [{ text: 'chunk-1 ' }] } },
    { artifact: { artifactId: 'chunked', parts: [{ text: 'chunk-2' }] }, append: true, lastChunk: true },
    { state: 'completed' },
  ]],
  ['tck-stream-ordering-001', [{ status: 'working' }, { artifact: { parts: [{ text: 'Ordered output' }] } }, { state: 'completed' }]],
  ['tck-stream-001', [{ status: 'working' }, { artifact: { parts: [{ text: 'Stream hello from TCK' }] } }, { state: 'completed' }]],
  ['tck-stream-003', [{ status: 'working' }, { artifact: { parts: [{ text: 'Stream task lifecycle' }] } }, { state: 'completed' }]],
  ['test-resubscribe-message-id', [{ status: 'working' }, { wait: 4000 }, { state: 'completed' }]],
];

agent.onMessage((m) => {
  if (m.payload && typeof m.payload === 'object' && m.payload.a2a?.cancel) return;
  const messageId = m.meta?.a2a?.messageId ?? '';
  const found = SCENARIOS.find(([prefix]) => messageId.startsWith(prefix));
  if (!found && !v03) {
    agent.reply(m, m.payload).catch((e) => console.error(`reply failed: ${e.message}`));
    return;
  }
  const to = { agent: m.from };
  const meta = { correlationId: m.meta.correlationId };
  // Not awaited: the SDK runs message handlers one at a time.
  const said = typeof m.payload === 'string' ? m.payload : JSON.stringify(m.payload);
  const steps = found
    ? found[1]
    : [{ status: 'working' }, { wait: 1200 }, { artifact: { parts: [{ text: `Hello World! You said: '${said}'. Thanks for your message!` }] } }, { state: 'completed' }];
  (async () => {
    for (const step of steps) {
      if (step.wait) await sleep(step.wait);
      else await agent.send(to, { a2a: step }, meta);
    }
  })().catch((e) => console.error(`report failed: ${e.message}`));
});
await agent.connect();
process.stdout.write(`ready ${agent.agentId}\n`);
process.stdin.resume();
process.stdin.on('end', () => process.exit(0));
