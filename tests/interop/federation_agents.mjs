// Two SDK agents on two federated routers (issue 47), with the official SDK's AgentConnection:
//
//   node federation_agents.mjs wait <url> <api-key> <agentId>
//     registers <agentId>, prints `ready`, then for the first message prints one JSON line
//     {from, id, payload} and answers it with reply(message, {echo: payload}); runs until
//     stdin closes.
//   node federation_agents.mjs send <url> <api-key> <agentId> <system> <target>
//     registers <agentId>, sends {hello} to {system, agent: target}, prints one JSON line
//     {sent, reply: {from, payload, meta}} once the reply arrives, and exits.
//
// Driven by tests/federation_links.rs.
import WebSocket from 'ws';
import { AgentConnection, websocketStream } from '@multi-agent-protocol/sdk';

globalThis.WebSocket = WebSocket;
const [mode, url, key, agentId, system, target] = process.argv.slice(2);
const timer = setTimeout(() => {
  console.error(`federation_agents ${mode} timed out`);
  process.exit(3);
}, 20000);

const ws = new WebSocket(url);
await new Promise((resolve, reject) => {
  ws.once('open', resolve);
  ws.once('error', reject);
});
const agent = new AgentConnection(websocketStream(ws), { name: agentId });
let firstMessage;
const got = new Promise((resolve) => {
  firstMessage = resolve;
});
agent.onMessage((m) => firstMessage(m));
await agent.connect({ agentId, auth: { method: 'api-key', credential: key } });

if (mode === 'wait') {
  process.stdout.write('ready\n');
  const m = await got;
  process.stdout.write(`${JSON.stringify({ from: m.from, id: m.id, payload: m.payload })}\n`);
  await agent.reply(m, { echo: m.payload });
  clearTimeout(timer);
  process.stdin.resume();
  process.stdin.on('end', () => process.exit(0));
} else {
  const sent = await agent.send({ system, agent: target }, { hello: 'from the SDK' });
  const r = await got;
  process.stdout.write(
    `${JSON.stringify({ sent, reply: { from: r.from, payload: r.payload, meta: r.meta } })}\n`,
  );
  clearTimeout(timer);
  process.exit(0);
}
