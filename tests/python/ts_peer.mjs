#!/usr/bin/env node
// The TypeScript side of the mixed scenarios (tests/python/scenarios_mixed.py): the official
// SDK (@multi-agent-protocol/sdk, installed in tests/interop/node_modules) as an agent or a
// client, talking to Python agents and clients through the router.
//
//   node tests/python/ts_peer.mjs echo  <url> <name>            TS agent: reply(m, {ts: payload}); `ready <id>`
//   node tests/python/ts_peer.mjs ask   <url> <agentId> <json>  TS client: request(); `reply <json>`
//   node tests/python/ts_peer.mjs send  <url> <agentId> <json>  TS agent: send, wait for the reply; `reply <json>`
//   node tests/python/ts_peer.mjs watch <url> <agentId> <n>     TS client: n agent_state_changed of agentId; `event <json>`
//
// Every wait is bounded (5 s); stdin's end ends the long-running modes.
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const MODULES = path.join(HERE, '..', 'interop', 'node_modules');
const { default: WebSocket } = await import(pathToFileURL(path.join(MODULES, 'ws', 'wrapper.mjs')).href);
const sdk = await import(pathToFileURL(path.join(MODULES, '@multi-agent-protocol', 'sdk', 'dist', 'index.js')).href);
const { AgentConnection, ClientConnection } = sdk;
globalThis.WebSocket = WebSocket;

const WAIT_MS = 5000;
const [mode, url, ...rest] = process.argv.slice(2);
const fail = (why) => {
  process.stderr.write(`ts_peer ${mode}: ${why}\n`);
  process.exit(1);
};
const bounded = (promise, what) =>
  Promise.race([promise, new Promise((_, reject) => setTimeout(() => reject(new Error(`${what} timed out`)), WAIT_MS))]);
const out = (line) => process.stdout.write(`${line}\n`);

try {
  if (mode === 'echo') {
    const agent = await bounded(AgentConnection.connect(url, { name: rest[0] ?? 'ts-echo', role: 'ts' }), 'connect');
    agent.onMessage((m) => {
      if (m.from === 'system' || m.meta?.isResult) return;
      // Not awaited: the SDK runs message handlers one at a time.
      agent.reply(m, { ts: m.payload }).catch((e) => process.stderr.write(`reply failed: ${e.message}\n`));
    });
    out(`ready ${agent.agentId}`);
    process.stdin.resume();
    process.stdin.on('end', () => process.exit(0));
  } else if (mode === 'ask') {
    const client = await bounded(ClientConnection.connect(url, { name: 'ts-asker' }), 'connect');
    const reply = await client.request({ agent: rest[0] }, JSON.parse(rest[1]), { timeout: WAIT_MS });
    out(`reply ${JSON.stringify({ from: reply.from, payload: reply.payload, meta: reply.meta })}`);
    await client.disconnect();
    process.exit(0);
  } else if (mode === 'send') {
    const agent = await bounded(AgentConnection.connect(url, { name: 'ts-sender', role: 'ts' }), 'connect');
    const got = new Promise((resolve) => agent.onMessage((m) => m.meta?.isResult && resolve(m)));
    const sent = await agent.send({ agent: rest[0] }, JSON.parse(rest[1]), { correlationId: 'ts-corr-1' });
    const reply = await bounded(got, 'the reply');
    out(`reply ${JSON.stringify({ delivered: sent.delivered, from: reply.from, payload: reply.payload, meta: reply.meta })}`);
    await agent.disconnect();
    process.exit(0);
  } else if (mode === 'watch') {
    const client = await bounded(ClientConnection.connect(url, { name: 'ts-watcher' }), 'connect');
    const sub = await client.subscribe({ eventTypes: ['agent_state_changed'], fromAgents: [rest[0]] });
    out('watching');
    let n = Number(rest[1]);
    for await (const e of sub) {
      out(`event ${JSON.stringify(e)}`);
      if (--n === 0) break;
    }
    process.exit(0);
  } else {
    fail(`unknown mode ${mode}`);
  }
} catch (e) {
  fail(e?.stack ?? String(e));
}
