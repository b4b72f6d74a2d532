// An orchestrator: spawn two children into a scope, steer them, ask the echo agent a question,
// stop the children, and exit.
//   MAP_ROUTER_URL=ws://127.0.0.1:4500/ node orchestrator.mjs
import WebSocket from 'ws';
globalThis.WebSocket = WebSocket;
import { AgentConnection, ClientConnection } from '@multi-agent-protocol/sdk';

const url = process.env.MAP_ROUTER_URL || process.env.MAP_URL || 'ws://127.0.0.1:4500/';
const boss = await AgentConnection.connect(url, { name: 'orchestrator', role: 'lead' });

const team = await boss.createScope({ name: 'team' });
const kids = [];
for (const name of ['researcher', 'writer']) {
  const { agent } = await boss.spawn({ name, role: 'worker', scopes: [team.id] });
  kids.push(agent);
}
console.log('spawned', kids.map((k) => `${k.name}=${k.id}`).join(', '), 'into scope', team.id);

// Children spawned this way belong to this connection: their messages arrive here.
boss.onMessage((m) => console.log(`message for ${JSON.stringify(m.to)}:`, JSON.stringify(m.payload)));
const sent = await boss.sendToScope(team.id, { task: 'summarize the logs' });
console.log('scope message delivered to', sent.delivered);

// Ask the echo agent (node agent.mjs), if one is running, and wait for its reply.
const client = await ClientConnection.connect(url, { name: 'orchestrator-client' });
// Only live agents: a stopped or orphaned echo agent cannot answer.
const { agents } = await client.listAgents({
  filter: { roles: ['echo'], states: ['registered', 'active', 'busy', 'idle'] },
});
if (agents.length > 0) {
  const reply = await client.request({ agent: agents[0].id }, { question: 'ping?' }, { timeout: 5000 });
  console.log('echo replied:', JSON.stringify(reply.payload));
} else {
  console.log('no echo agent running (start agent.mjs to see request/response)');
}

for (const kid of kids) {
  const { agent } = await client.stopAgent(kid.id, { reason: 'done' });
  console.log(`${kid.name} is ${agent.state}`);
}
const graph = await client.getStructureGraph();
console.log('graph edges:', graph.edges.map((e) => `${e.from}->${e.to}`).join(', '));

await client.disconnect();
await boss.disconnect();
process.exit(0);
