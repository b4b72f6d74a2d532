#!/usr/bin/env node
// A MAP agent written with the official SDK that talks over its stdin/stdout (ndJsonStream), as
// a process the router supervises (map/agents/spawn with a command). It echoes every message
// back with reply(), and exits on a stop control message or when stdin closes.
import { Readable, Writable } from 'node:stream';
import { AgentConnection, ndJsonStream } from '@multi-agent-protocol/sdk';

const stream = ndJsonStream(Readable.toWeb(process.stdin), Writable.toWeb(process.stdout));
const agent = new AgentConnection(stream, { name: process.env.MAP_AGENT_NAME ?? 'stdio-agent', role: 'echo' });
// Handlers go on before connect(): a message may arrive right after registration.
agent.onMessage((m) => {
  if (m.from === 'system' && m.payload?.control === 'stop') {
    agent.disconnect().finally(() => process.exit(0));
    return;
  }
  // Not awaited: the SDK runs message handlers one at a time.
  agent.reply(m, { echo: m.payload, from: 'stdio' }).catch(() => {});
});
await agent.connect();
console.error(`stdio agent ${agent.agentId} (MAP_AGENT_ID=${process.env.MAP_AGENT_ID}) ready`);
process.stdin.on('end', () => process.exit(0));
