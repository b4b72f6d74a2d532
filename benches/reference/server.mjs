// Launches the official SDK's MAPServer (@multi-agent-protocol/sdk@0.1.15) over WebSocket on
// 127.0.0.1, so that benches/load.rs can run the same load against it and against map-router
// (scripts/bench-compare.sh). Prints `reference listening on ws://127.0.0.1:PORT/` on stderr.
//
// What the host has to supply, because MAPServer does not (docs/performance.md lists these):
// - a role at accept(): MAPServer takes the session's role from accept(), not from map/connect,
//   so the first frame is read here and its params.participantType becomes the role;
// - message delivery: MAPServer delivers map/message only through `messages.onDeliver`, so the
//   launcher wires it to a `map/message {message}` notification on the recipient's connection;
// - serialized writes: RouterConnection takes `writable.getWriter()` per frame, and two frames
//   produced by one operation collide ("WritableStream is locked", the response becomes
//   -32603). The stream given to accept() hands out a writer that never locks and calls
//   ws.send, which queues frames in order.
//
// Usage: node benches/reference/server.mjs [--port N]   (default 0: any free port)
import { WebSocketServer } from 'ws';
import { MAPServer } from '@multi-agent-protocol/sdk/server';

const portArg = process.argv.indexOf('--port');
const port = portArg > 0 ? Number(process.argv[portArg + 1]) : 0;

const server = new MAPServer({ name: 'reference' });
/** session id → RouterConnection, for delivering map/message to an agent's connection. */
const routersBySession = new Map();

server.messages.onDeliver((agentId, message) => {
  const agent = server.agents.get(agentId);
  const router = agent && routersBySession.get(agent.sessionId);
  if (router) router.notify('map/message', { message }).catch(() => {});
});

/** A Stream (readable of parsed frames, writable of objects) over a `ws` socket. */
function socketStream(ws, first) {
  const queue = [first];
  let waiting = null;
  let closed = false;
  ws.on('message', (data) => {
    let msg;
    try {
      msg = JSON.parse(data);
    } catch {
      return;
    }
    if (waiting) {
      const resolve = waiting;
      waiting = null;
      resolve(msg);
    } else {
      queue.push(msg);
    }
  });
  ws.on('close', () => {
    closed = true;
    if (waiting) {
      const resolve = waiting;
      waiting = null;
      resolve(undefined);
    }
  });
  const readable = new ReadableStream({
    async pull(controller) {
      if (queue.length > 0) return controller.enqueue(queue.shift());
      if (closed) return controller.close();
      const msg = await new Promise((resolve) => {
        waiting = resolve;
      });
      if (msg === undefined) controller.close();
      else controller.enqueue(msg);
    },
  });
  const writer = {
    async write(message) {
      if (ws.readyState !== ws.OPEN) throw new Error('WebSocket is not open');
      ws.send(JSON.stringify(message));
    },
    releaseLock() {},
    async close() {
      ws.close();
    },
  };
  const writable = { getWriter: () => writer };
  return { readable, writable };
}

const wss = new WebSocketServer({ host: '127.0.0.1', port, perMessageDeflate: false });
wss.on('connection', (ws) => {
  ws.once('message', (data) => {
    let first;
    try {
      first = JSON.parse(data);
    } catch {
      ws.close();
      return;
    }
    const role = first?.params?.participantType ?? 'agent';
    const router = server.accept(socketStream(ws, first), { role, transportType: 'websocket' });
    // start() creates the session synchronously, before it reads the first frame.
    router.start().catch(() => ws.close());
    const id = router.session.id;
    routersBySession.set(id, router);
    router.closed.then(() => routersBySession.delete(id));
  });
});
wss.on('listening', () => {
  console.error(`reference listening on ws://127.0.0.1:${wss.address().port}/`);
});
const stop = () => {
  wss.close();
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
