#!/usr/bin/env node
// A complete MAP agent over stdio, with nothing but Node's standard library.
//
// Run it under the router:  map-router spawn --name echo -- node agent.mjs
// or bridge it to a router: map-router agent --name echo -- node agent.mjs
//
// It speaks MAP as NDJSON (one JSON-RPC message per line) on stdin/stdout: it connects,
// registers, answers every message with a reply that carries the request's correlation id,
// exits 0 on the router's stop control message, and exits when stdin closes. Logs go to
// stderr: stdout carries only MAP. (With the official SDK, `new AgentConnection(ndJsonStream(
// Readable.toWeb(process.stdin), Writable.toWeb(process.stdout)), {name})` does the same.)
import { createInterface } from 'node:readline';

let nextId = 0;
const send = (method, params) => {
  process.stdout.write(JSON.stringify({ jsonrpc: '2.0', id: ++nextId, method, params }) + '\n');
};
const log = (text) => process.stderr.write(`agent.mjs: ${text}\n`);

const name = process.env.MAP_AGENT_NAME ?? 'node-echo';
// No participantType: over a supervised pipe (or `map-router agent`) it defaults to "agent".
send('map/connect', { protocolVersion: 1, name });
send('map/agents/register', { name, role: 'echo' });

const lines = createInterface({ input: process.stdin });
lines.on('line', (line) => {
  if (!line.trim()) return;
  const frame = JSON.parse(line);
  if (frame.error) { // an answer to one of our requests that failed
    log(`request ${frame.id} failed: ${JSON.stringify(frame.error)}`);
    if (frame.id === 1 || frame.id === 2) process.exit(1); // could not connect or register
    return;
  }
  if (frame.method !== 'map/message') return; // answers to our requests, events
  const { message } = frame.params;
  const meta = message.meta ?? {};
  if (message.from === 'system') { // the router: control messages and injected content
    if (message.payload?.control === 'stop') {
      log('stop requested; exiting');
      process.exit(0);
    }
    log(`from the router: ${JSON.stringify(message.payload)}`); // suspend, resume, steering
    return;
  }
  if (meta.isResult) return; // a reply to something we asked; this agent asks nothing
  send('map/send', {
    to: { agent: message.from },
    payload: { echo: message.payload, by: name },
    meta: { correlationId: meta.correlationId ?? message.id, isResult: true },
  });
});
lines.on('close', () => { log('stdin closed; exiting'); process.exit(0); }); // EOF: the router is going away
