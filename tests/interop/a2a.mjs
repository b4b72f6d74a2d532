#!/usr/bin/env node
// A2A interop: the official A2A client (@a2a-js/sdk 1.3.0, pinned in package.json) talks to the
// map-router binary's A2A gateway, and the MAP agent on the other side is an ordinary
// @multi-agent-protocol/sdk AgentConnection that knows nothing about A2A (it echoes with
// reply()). A MAP ClientConnection watches task.* and message_* events meanwhile.
//
//   node tests/interop/a2a.mjs [--bin <path-to-map-router>] [--filter <substring>] [--verbose]
//
// One scenario runs with [auth] on (API keys, no trusted transports): two principals' SDK
// clients each see and act on their own tasks only.
//
// With MAP_INTEROP_SPREAD=1 the scenarios run on a cluster (a nats-server, a writer and a
// standby): the A2A clients call the standby's gateway while the MAP agents and observers
// alternate between the two nodes (docs/cluster.md, "Gateways on every node"). The scenarios
// that restart the router are single-node ones and are left out of that run.
//
// Prints `ok - name` / `FAIL - name: reason` per scenario, then `N passed, M failed`; exits 0
// only when nothing failed. Every await is bounded (withTimeout / until).
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  ClientFactory,
  ClientFactoryOptions,
  DefaultAgentCardResolver,
  JsonRpcTransportFactory,
  createAuthenticatingFetchWithRetry,
} from '@a2a-js/sdk/client';
import { AgentConnection, websocketStream } from '@multi-agent-protocol/sdk';
import WebSocket from 'ws';
import { assert, WAIT_MS, clusterSection, hostPort, until, withTimeout, runScenarios } from './lib.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const argv = process.argv.slice(2);
const argValue = (flag) => {
  const i = argv.indexOf(flag);
  return i >= 0 ? argv[i + 1] : undefined;
};
const BIN = path.resolve(argValue('--bin') ?? path.join(HERE, '../../target/debug/map-router'));
const FILTER = argValue('--filter');
const VERBOSE = argv.includes('--verbose') || !!process.env.INTEROP_VERBOSE;
const SPREAD = process.env.MAP_INTEROP_SPREAD === '1';
const SCENARIO_TIMEOUT_MS = SPREAD ? 30_000 : 15_000;

// The SDK's enums (proto numbering, as its Task/Message objects carry them).
const ROLE_USER = 1;
const STATE = { SUBMITTED: 1, WORKING: 2, COMPLETED: 3, FAILED: 4, CANCELED: 5, INPUT_REQUIRED: 6 };

const scenarios = [];
function scenario(name, fn, { singleNode = false } = {}) {
  if (SPREAD && singleNode) return;
  scenarios.push({ name, fn });
}

/**
 * The scenario's router, the one its A2A clients call: one node, or in spread mode a standby
 * of a writer on one nats-server (both with `config`), `ctx.spread` set so that `ctx.agent` and
 * `ctx.client` alternate between the writer and the standby.
 */
async function startNode(ctx, { config = '' } = {}) {
  if (!SPREAD) return ctx.startRouter({ config });
  const nats = await ctx.startNats();
  const cluster = (node, extra) => clusterSection(nats.url, node, extra);
  const writer = await ctx.startRouter({ config: config + cluster('n0') });
  const standby = await ctx.startStandby({ config: config + cluster('n1', 'standby = true\n') });
  ctx.spread = [writer.url, standby.url];
  return standby;
}

/** `http://127.0.0.1:PORT` of a router. */
const httpBase = (router) => `http://${hostPort(router)}`;

/** A text message in the SDK's v1.0 shape. */
const textMessage = (text, extra = {}) => ({
  messageId: `m-${Math.random().toString(36).slice(2)}`,
  role: ROLE_USER,
  parts: [{ content: { $case: 'text', value: text } }],
  ...extra,
});

/** The text of an SDK part. */
const partText = (p) => (p?.content?.$case === 'text' ? p.content.value : undefined);

/** Collects an async iterator, bounded. */
async function collect(iterable, what) {
  const out = [];
  await withTimeout(
    (async () => {
      for await (const x of iterable) out.push(x);
    })(),
    WAIT_MS,
    what,
  );
  return out;
}

/** Polls the async `fn` until it resolves truthy, bounded by WAIT_MS. */
async function eventually(fn, what) {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    const left = deadline - Date.now();
    if (left <= 0) throw new Error(`timed out waiting for ${what}`);
    if (await withTimeout(Promise.resolve(fn()), left, what)) return;
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Awaits `promise`, which must reject with an A2A error whose JSON-RPC code is `code`. */
async function expectA2aCode(promise, code, what) {
  let result;
  try {
    result = await withTimeout(Promise.resolve(promise), WAIT_MS, what);
  } catch (err) {
    const got = err?.envelopeCode ?? err?.code;
    if (got === code) return err;
    throw new Error(`${what}: expected code ${code}, got ${got} (${err?.name}: ${err?.message})`);
  }
  throw new Error(`${what}: expected code ${code}, got success ${JSON.stringify(result)}`);
}

/**
 * An SDK agent that echoes every message with reply() and ignores the gateway's cancel notices.
 * NB: the SDK awaits message handlers in its reader loop, so a handler must not await a call on
 * its own connection (the answer could never be read): the reply is sent, not awaited.
 */
async function echoAgent(ctx, name = 'echo') {
  const agent = await ctx.agent({ name });
  agent.conn.onMessage((m) => {
    if (m.payload && typeof m.payload === 'object' && m.payload.a2a?.cancel) return;
    agent.conn.reply(m, m.payload).catch((e) => ctx.sdkLogs.push(`echo reply failed: ${e.message}`));
  });
  return agent;
}

// ---------------------------------------------------------------------------------------------

scenario('a2a v1.0 client: card, sendMessage, stream, getTask, errors, MAP observer', async (ctx) => {
  const router = await startNode(ctx);
  ctx.url = router.url;
  const base = httpBase(router);
  const observer = await ctx.client({ name: 'observer' });
  // task.updated is one of our vendor types: named (docs/compatibility.md §7).
  const watch = await observer.watch({ eventTypes: ['task.*', 'task.updated', 'message_*'] });
  const agent = await echoAgent(ctx);

  // Discovery: the agent's base URL (with the trailing slash URL resolution needs; see
  // docs/a2a.md) finds the card at <base>/.well-known/agent-card.json.
  const factory = new ClientFactory();
  const client = await withTimeout(
    factory.createFromUrl(`${base}/a2a/agents/${agent.id}/`),
    WAIT_MS,
    'createFromUrl',
  );
  const card = await client.getAgentCard();
  assert.equal(card.name, 'echo');
  assert.equal(card.supportedInterfaces[0].url, `${base}/a2a/agents/${agent.id}`);
  assert.equal(card.supportedInterfaces[0].protocolVersion, '1.0');
  assert.equal(client.protocolVersion, '1.0');
  // By name too.
  const byName = await withTimeout(factory.createFromUrl(`${base}/a2a/agents/echo/`), WAIT_MS, 'createFromUrl by name');
  assert.equal((await byName.getAgentCard()).supportedInterfaces[0].url, `${base}/a2a/agents/${agent.id}`);

  // sendMessage (blocking): a completed task whose artifact is the echo.
  const task = await withTimeout(client.sendMessage({ message: textMessage('hello') }), WAIT_MS, 'sendMessage');
  assert.ok(task.id, `a task: ${JSON.stringify(task)}`);
  assert.equal(task.status.state, STATE.COMPLETED);
  assert.equal(partText(task.artifacts[0].parts[0]), 'hello');
  assert.equal(partText(task.history[0].parts[0]), 'hello');
  assert.equal(task.history[0].role, ROLE_USER);

  // sendMessageStream: task, working, artifact, completed, then the stream ends.
  const events = await collect(client.sendMessageStream({ message: textMessage('streamed') }), 'sendMessageStream');
  const cases = events.map((e) => e.payload.$case);
  assert.deepEqual(cases, ['task', 'statusUpdate', 'artifactUpdate', 'statusUpdate']);
  const streamed = events[0].payload.value;
  assert.equal(streamed.status.state, STATE.SUBMITTED);
  assert.equal(events[1].payload.value.status.state, STATE.WORKING);
  assert.equal(partText(events[2].payload.value.artifact.parts[0]), 'streamed');
  assert.equal(events[3].payload.value.status.state, STATE.COMPLETED);
  for (const e of events.slice(1)) assert.equal(e.payload.value.taskId, streamed.id);

  // getTask agrees.
  const got = await withTimeout(client.getTask({ id: streamed.id }), WAIT_MS, 'getTask');
  assert.equal(got.id, streamed.id);
  assert.equal(got.contextId, streamed.contextId);
  assert.equal(got.status.state, STATE.COMPLETED);
  assert.equal(partText(got.artifacts[0].parts[0]), 'streamed');

  // Errors: canceling a finished task is -32002, an unknown task -32001.
  const notCancelable = await expectA2aCode(client.cancelTask({ id: task.id }), -32002, 'cancelTask of a finished task');
  assert.equal(notCancelable.name, 'TaskNotCancelableError');
  const notFound = await expectA2aCode(client.getTask({ id: 'task-unknown' }), -32001, 'getTask of an unknown task');
  assert.equal(notFound.name, 'TaskNotFoundError');

  // listTasks (v1.0 only) lists both.
  const list = await withTimeout(client.listTasks({}), WAIT_MS, 'listTasks');
  assert.deepEqual(list.tasks.map((t) => t.id).sort(), [task.id, streamed.id].sort());

  // The MAP observer saw every step of both tasks: created (by the caller's session, without
  // the gateway's record, which only the gateway writes: task.updated), open -> in_progress ->
  // completed, the artifact (task.updated), task.completed, and the messages both ways.
  for (const t of [task, streamed]) {
    const of = (type) => watch.events.filter((e) => e.type === type && (e.data?.taskId ?? e.data?.task?.id) === t.id);
    await until(() => of('task.completed').length === 1, `task.completed of ${t.id}`);
    assert.equal(of('task.created').length, 1);
    assert.equal(of('task.created')[0].data.task.assignee, agent.id);
    assert.equal(of('task.created')[0].data.task.meta?.a2a, undefined, 'the record is the gateway\'s to write');
    assert.equal(of('task.updated')[0].data.task.meta.a2a.state, 'submitted', 'the record as made');
    const statuses = of('task.status').map((e) => [e.data.previous, e.data.current]);
    assert.deepEqual(statuses, [
      ['open', 'in_progress'],
      ['in_progress', 'completed'],
    ]);
    assert.equal(of('task.updated').length, 2, 'the record as made, then the artifact');
    const messages = watch.events.filter(
      (e) => e.type === 'message_sent' && (e.data?.message?.meta?.correlationId ?? '') === t.id,
    );
    assert.equal(messages.length, 2, `the A2A message and the reply of ${t.id}`);
    assert.equal(messages[0].data.message.meta.protocol, 'a2a');
    assert.equal(messages[1].data.message.meta.isResult, true);
  }
});

scenario('a2a v0.3 client (legacy compat): agent.json, message/send, message/stream', async (ctx) => {
  const router = await startNode(ctx);
  ctx.url = router.url;
  const base = httpBase(router);
  const agent = await echoAgent(ctx);
  const legacy = { legacyCompat: { enabled: true } };
  const factory = new ClientFactory(
    ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      transports: [new JsonRpcTransportFactory(legacy)],
      cardResolver: new DefaultAgentCardResolver(legacy),
    }),
  );
  const client = await withTimeout(
    factory.createFromUrl(`${base}/a2a/agents/${agent.id}/`, '.well-known/agent.json'),
    WAIT_MS,
    'createFromUrl (v0.3 card)',
  );
  assert.equal(client.protocolVersion, '0.3');
  const task = await withTimeout(client.sendMessage({ message: textMessage('old') }), WAIT_MS, 'message/send');
  assert.equal(task.status.state, STATE.COMPLETED);
  assert.equal(partText(task.artifacts[0].parts[0]), 'old');
  const events = await collect(client.sendMessageStream({ message: textMessage('old stream') }), 'message/stream');
  assert.deepEqual(
    events.map((e) => e.payload.$case),
    ['task', 'statusUpdate', 'artifactUpdate', 'statusUpdate'],
  );
  assert.equal(events[3].payload.value.status.state, STATE.COMPLETED);
  const got = await withTimeout(client.getTask({ id: task.id }), WAIT_MS, 'tasks/get');
  assert.equal(got.status.state, STATE.COMPLETED);
  await expectA2aCode(client.cancelTask({ id: task.id }), -32002, 'tasks/cancel of a finished task');
  await expectA2aCode(client.getTask({ id: 'nope' }), -32001, 'tasks/get of an unknown task');
});

scenario('a2a resubscribe after a router restart: the current task, then live updates', async (ctx) => {
  const dataDir = ctx.tempDir();
  let router = await ctx.startRouter({ dataDir });
  ctx.url = router.url;
  const base = httpBase(router);
  // A slow agent: it reports working, and answers when told to.
  let agent = await ctx.agent({ name: 'slow' });
  const inbox = [];
  agent.conn.onMessage((m) => inbox.push(m));
  const client = await withTimeout(new ClientFactory().createFromUrl(`${base}/a2a/agents/${agent.id}/`), WAIT_MS, 'createFromUrl');
  const task = await withTimeout(
    client.sendMessage({ message: textMessage('later'), configuration: { returnImmediately: true, acceptedOutputModes: [] } }),
    WAIT_MS,
    'sendMessage (returnImmediately)',
  );
  assert.equal(task.status.state, STATE.WORKING);
  const request = await until(() => inbox[0], 'the agent gets the message');
  await withTimeout(agent.conn.send({ agent: request.from }, { a2a: { status: 'working', message: 'halfway' } }, { correlationId: task.id }), WAIT_MS, 'progress');
  await eventually(async () => {
    const t = await client.getTask({ id: task.id });
    return partText(t.status.message?.parts?.[0]) === 'halfway';
  }, 'the progress is on the task');

  // Restart the router on the same port and data dir; the agent comes back with its id.
  const agentId = agent.id;
  await ctx.killRouter(router, 'SIGTERM');
  router = await ctx.startRouter({ dataDir, listen: hostPort(router) });
  ctx.url = router.url;
  agent = await ctx.agent({ name: 'slow', agentId });

  // Resubscribe: the task as it was left (working, with the progress message), then what the
  // agent does now, then the end.
  const stream = client.resubscribeTask({ id: task.id });
  const it = stream[Symbol.asyncIterator]();
  const first = await withTimeout(it.next(), WAIT_MS, 'first frame');
  assert.equal(first.value.payload.$case, 'task');
  assert.equal(first.value.payload.value.status.state, STATE.WORKING);
  assert.equal(partText(first.value.payload.value.status.message?.parts?.[0]), 'halfway');
  await withTimeout(agent.conn.reply(request, 'finally'), WAIT_MS, 'the reply');
  const rest = [];
  for (;;) {
    const n = await withTimeout(it.next(), WAIT_MS, 'next frame');
    if (n.done) break;
    rest.push(n.value);
  }
  assert.deepEqual(rest.map((e) => e.payload.$case), ['artifactUpdate', 'statusUpdate']);
  assert.equal(partText(rest[0].payload.value.artifact.parts[0]), 'finally');
  assert.equal(rest[1].payload.value.status.state, STATE.COMPLETED);
}, { singleNode: true });

scenario('a2a stream killed mid-task by kill -9: resubscribeTask picks it up, every update exactly once', async (ctx) => {
  const dataDir = ctx.tempDir();
  let router = await ctx.startRouter({ dataDir });
  ctx.url = router.url;
  const base = httpBase(router);
  let agent = await ctx.agent({ name: 'long' });
  const inbox = [];
  agent.conn.onMessage((m) => inbox.push(m));
  const client = await withTimeout(new ClientFactory().createFromUrl(`${base}/a2a/agents/${agent.id}/`), WAIT_MS, 'createFromUrl');
  // The stream: read frames as they come, remembering each update once seen.
  const seen = [];
  let streamedTask;
  const label = (e) => {
    const v = e.payload.value;
    switch (e.payload.$case) {
      case 'statusUpdate':
        return `status:${v.status.state}:${partText(v.status.message?.parts?.[0]) ?? ''}`;
      case 'artifactUpdate':
        return `artifact:${v.artifact.artifactId}:${partText(v.artifact.parts[0])}`;
      default:
        return e.payload.$case;
    }
  };
  const it = client.sendMessageStream({ message: textMessage('long job') })[Symbol.asyncIterator]();
  const reading = (async () => {
    try {
      for (;;) {
        const n = await it.next();
        if (n.done) return;
        if (n.value.payload.$case === 'task') streamedTask = n.value.payload.value.id;
        seen.push(label(n.value));
      }
    } catch {
      // The router died under the stream: what was seen is recorded.
    }
  })();
  const request = await until(() => inbox[0], 'the agent gets the message');
  const progress = (text) =>
    withTimeout(agent.conn.send({ agent: request.from }, { a2a: { status: 'working', message: text } }, { correlationId: request.meta?.correlationId ?? request.id }), WAIT_MS, `progress ${text}`);
  await progress('step 1');
  await progress('step 2');
  await until(() => seen.includes(`status:${STATE.WORKING}:step 2`), 'the stream shows step 2');

  // kill -9 in the middle of the task; the stream dies with it.
  await ctx.killRouter(router, 'SIGKILL');
  await withTimeout(reading, WAIT_MS, 'the dead stream ends');
  const before = [...seen];
  router = await ctx.startRouter({ dataDir, listen: hostPort(router) });
  ctx.url = router.url;
  agent = await ctx.agent({ name: 'long', agentId: agent.id });
  const taskId = streamedTask;
  assert.ok(taskId, 'the stream named its task');
  await eventually(async () => (await client.listTasks({})).tasks.some((t) => t.id === taskId), 'the task is back');

  const again = client.resubscribeTask({ id: taskId })[Symbol.asyncIterator]();
  const first = await withTimeout(again.next(), WAIT_MS, 'first frame after the restart');
  assert.equal(first.value.payload.$case, 'task', 'the current task first');
  const current = first.value.payload.value;
  assert.equal(current.status.state, STATE.WORKING);
  assert.equal(partText(current.status.message?.parts?.[0]), 'step 2', 'nothing answered before the kill was lost');
  await progress('step 3');
  await withTimeout(agent.conn.reply(request, 'done'), WAIT_MS, 'the reply');
  const after = [];
  for (;;) {
    const n = await withTimeout(again.next(), WAIT_MS, 'next frame');
    if (n.done) break;
    after.push(label(n.value));
  }
  const updates = [...before, ...after].filter((l) => l !== 'task');
  const once = new Set(updates);
  assert.equal(once.size, updates.length, `an update came twice: ${updates.join(' | ')}`);
  for (const want of [`status:${STATE.WORKING}:step 1`, `status:${STATE.WORKING}:step 2`, `status:${STATE.WORKING}:step 3`]) {
    assert.ok(updates.includes(want), `${want} in ${updates.join(' | ')}`);
  }
  assert.ok(updates.some((l) => l.startsWith('artifact:') && l.endsWith(':done')), `the artifact in ${updates.join(' | ')}`);
  assert.equal(updates.at(-1), `status:${STATE.COMPLETED}:`, 'the stream ends completed');
  assert.ok(!after.includes(`status:${STATE.WORKING}:step 2`), 'no update from before the kill is sent again');
}, { singleNode: true });

// ---------------------------------------------------------------------------------------------
// With [auth] on: each principal's tasks are its own.

/** A factory whose every request (card and JSON-RPC) carries `Authorization: Bearer <key>`. */
function keyedFactory(key) {
  const fetchImpl = createAuthenticatingFetchWithRetry(fetch, {
    headers: async () => ({ Authorization: `Bearer ${key}` }),
    shouldRetryWithHeaders: async () => undefined,
  });
  return new ClientFactory(
    ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      transports: [new JsonRpcTransportFactory({ fetchImpl })],
      cardResolver: new DefaultAgentCardResolver({ fetchImpl }),
    }),
  );
}

scenario('a2a with [auth] on: two principals each see and act on their own tasks only', async (ctx) => {
  const keys = { alice: 'ak-a2a-alice-0123456789', bob: 'ak-a2a-bob-0123456789', dev: 'ak-a2a-dev-0123456789' };
  const dir = ctx.tempDir();
  const keyFile = path.join(dir, 'api-keys.txt');
  writeFileSync(keyFile, Object.entries(keys).map(([who, k]) => `${k} ${who}`).join('\n') + '\n');
  // No trusted_transports: the gateway's own sessions need none.
  const router = await startNode(ctx, { config: `[auth.api_keys]\nfile = ${JSON.stringify(keyFile)}\n` });
  ctx.url = router.url;
  const base = httpBase(router);

  // dev runs the echo agent (an SDK AgentConnection that authenticates with its API key), on
  // the writer in spread mode.
  const ws = new WebSocket(ctx.spread ? ctx.spread[0] : router.url);
  await withTimeout(new Promise((resolve, reject) => ws.once('open', resolve).once('error', reject)), WAIT_MS, 'ws open');
  ctx.defer(() => ws.terminate());
  const agent = new AgentConnection(websocketStream(ws), { name: 'echo' });
  await withTimeout(agent.connect({ auth: { method: 'api-key', token: keys.dev } }), WAIT_MS, 'agent connect');
  agent.onMessage((m) => {
    if (m.payload && typeof m.payload === 'object' && m.payload.a2a?.cancel) return;
    agent.reply(m, m.payload).catch((e) => ctx.sdkLogs.push(`echo reply failed: ${e.message}`));
  });

  // Without a credential, no card (and so no client).
  await assert.rejects(
    withTimeout(new ClientFactory().createFromUrl(`${base}/a2a/agents/echo/`), WAIT_MS, 'createFromUrl without a key'),
    /401/,
  );
  const alice = await withTimeout(keyedFactory(keys.alice).createFromUrl(`${base}/a2a/agents/echo/`), WAIT_MS, 'alice createFromUrl');
  const bob = await withTimeout(keyedFactory(keys.bob).createFromUrl(`${base}/a2a/agents/echo/`), WAIT_MS, 'bob createFromUrl');
  const mine = await withTimeout(alice.sendMessage({ message: textMessage("alice's") }), WAIT_MS, 'alice sendMessage');
  const theirs = await withTimeout(bob.sendMessage({ message: textMessage("bob's") }), WAIT_MS, 'bob sendMessage');
  assert.equal(mine.status.state, STATE.COMPLETED);
  assert.equal(theirs.status.state, STATE.COMPLETED);

  // Each lists only its own.
  assert.deepEqual((await withTimeout(alice.listTasks({}), WAIT_MS, 'alice listTasks')).tasks.map((t) => t.id), [mine.id]);
  assert.deepEqual((await withTimeout(bob.listTasks({}), WAIT_MS, 'bob listTasks')).tasks.map((t) => t.id), [theirs.id]);
  // The other's task does not exist for it: not found, even to cancel (not "not cancelable",
  // which would say it exists).
  await expectA2aCode(bob.getTask({ id: mine.id }), -32001, "bob's getTask of alice's task");
  await expectA2aCode(bob.cancelTask({ id: mine.id }), -32001, "bob's cancelTask of alice's task");
  await expectA2aCode(alice.getTask({ id: theirs.id }), -32001, "alice's getTask of bob's task");
  // Their own: found (a finished task is not cancelable).
  assert.equal(partText((await withTimeout(alice.getTask({ id: mine.id }), WAIT_MS, 'alice getTask')).history[0].parts[0]), "alice's");
  await expectA2aCode(alice.cancelTask({ id: mine.id }), -32002, "alice's cancelTask of her finished task");
});

// ---------------------------------------------------------------------------------------------

await runScenarios(scenarios, { bin: BIN, filter: FILTER, verbose: VERBOSE, timeoutMs: SCENARIO_TIMEOUT_MS });
