// A dashboard: print every event the router emits.
//   MAP_ROUTER_URL=ws://127.0.0.1:4500/ node dashboard.mjs [--seconds N]
import WebSocket from 'ws';
globalThis.WebSocket = WebSocket;
import { ClientConnection } from '@multi-agent-protocol/sdk';

const url = process.env.MAP_ROUTER_URL || process.env.MAP_URL || 'ws://127.0.0.1:4500/';
const client = await ClientConnection.connect(url, { name: 'dashboard' });

const { agents } = await client.listAgents();
console.log(`${agents.length} agents:`, agents.map((a) => `${a.name ?? a.id} (${a.state})`).join(', '));

const events = await client.subscribe(); // no filter: everything we may see
events.on('event', (e) => console.log(new Date(e.timestamp).toISOString(), e.type, JSON.stringify(e.data)));

const seconds = Number(process.argv[process.argv.indexOf('--seconds') + 1]) || 0;
const stop = async () => { await client.disconnect(); process.exit(0); };
process.on('SIGINT', stop);
if (seconds > 0) setTimeout(stop, seconds * 1000);
