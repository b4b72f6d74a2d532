// The SDK's own GatewayConnection, as a peer system's gateway: connects to the router at
// argv[2] with the API key argv[3] as participant type "gateway", links as system argv[4]
// (connectToSystem), routes one message to the router's system argv[5] for agent argv[6]
// (routeToSystem, with routing configured: the SDK's envelope on the wire), and prints one JSON
// line with what it got. Driven by tests/federation.rs.
import WebSocket from 'ws';
import { GatewayConnection, websocketStream } from '@multi-agent-protocol/sdk';

globalThis.WebSocket = WebSocket;

const [url, key, me, target, agent] = process.argv.slice(2);
const timer = setTimeout(() => {
  console.error('federation_gateway timed out');
  process.exit(3);
}, 10000);

const ws = new WebSocket(url);
await new Promise((resolve, reject) => {
  ws.once('open', resolve);
  ws.once('error', reject);
});
const gw = new GatewayConnection(websocketStream(ws), {
  name: `${me}-gateway`,
  routing: { systemId: me, trackPath: true, maxHops: 5 },
});
const session = await gw.connect({ auth: { method: 'api-key', credential: key } });
const connect = await gw.connectToSystem(me, `wss://${me}.example/map`);
const route = await gw.routeToSystem(target, {
  id: 'sdk-m-1',
  from: 'alice',
  to: { agent },
  timestamp: Date.now(),
  payload: { hello: 'from the SDK' },
});
console.log(JSON.stringify({
  sessionId: session.sessionId,
  connect,
  recorded: gw.isSystemConnected(me),
  route,
}));
await gw.disconnect();
clearTimeout(timer);
process.exit(0);
