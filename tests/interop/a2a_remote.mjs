#!/usr/bin/env node
// A2A client side: the map-router's A2A gateway calls remote A2A agents served by the official
// @a2a-js/sdk 1.3.0 SERVER classes (DefaultRequestHandler + InMemoryTaskStore + the express
// jsonRpcHandler / agentCardHandler, pinned in package.json with express 5.1.0), started here on
// 127.0.0.1. The remote agent is registered by card URL (the config file's [[a2a.remote]], or
// POST /a2a/remote), and official @multi-agent-protocol/sdk connections message it through MAP.
//
//   node tests/interop/a2a_remote.mjs [--bin <path-to-map-router>] [--filter <substring>] [--verbose]
//
// Prints `ok - name` / `FAIL - name: reason` per scenario, then `N passed, M failed`; exits 0
// only when nothing failed. Every await is bounded (withTimeout / until).
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import express from 'express';
import { TaskState } from '@a2a-js/sdk';
import { ClientFactory } from '@a2a-js/sdk/client';
import { AgentEvent, DefaultRequestHandler, InMemoryTaskStore } from '@a2a-js/sdk/server';
import { UserBuilder, agentCardHandler, jsonRpcHandler } from '@a2a-js/sdk/server/express';
import { assert, WAIT_MS, hostPort, sleep, until, withTimeout, runScenarios } from './lib.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const argv = process.argv.slice(2);
const argValue = (flag) => {
  const i = argv.indexOf(flag);
  return i >= 0 ? argv[i + 1] : undefined;
};
const BIN = path.resolve(argValue('--bin') ?? path.join(HERE, '../../target/debug/map-router'));
const FILTER = argValue('--filter');
const VERBOSE = argv.includes('--verbose') || !!process.env.INTEROP_VERBOSE;
const SCENARIO_TIMEOUT_MS = 20_000;

const scenarios = [];
function scenario(name, fn) {
  scenarios.push({ name, fn });
}

const now = () => new Date().toISOString();
const textPart = (value) => ({ content: { $case: 'text', value }, metadata: undefined, filename: '', mediaType: '' });
const dataPart = (value) => ({ content: { $case: 'data', value }, metadata: undefined, filename: '', mediaType: '' });
const status = (state, text) => ({
  state,
  timestamp: now(),
  message: text
    ? { messageId: `s-${Math.random().toString(36).slice(2)}`, contextId: '', taskId: '', role: 2, parts: [textPart(text)], metadata: undefined, extensions: [], referenceTaskIds: [] }
    : undefined,
});

/**
 * The remote agent's logic: a task that goes working -> artifact -> completed, the artifact
 * echoing the text (or the data) it was sent. A message "fail" ends the task failed.
 */
class EchoExecutor {
  constructor() {
    this.seen = [];
    this.waiting = new Map();
    this.canceled = [];
  }

  async execute(rc, bus) {
    const { taskId, contextId, userMessage } = rc;
    this.seen.push(userMessage);
    const content = userMessage.parts[0]?.content;
    bus.publish(
      AgentEvent.task({ id: taskId, contextId, status: status(TaskState.TASK_STATE_SUBMITTED), artifacts: [], history: [userMessage], metadata: undefined }),
    );
    bus.publish(AgentEvent.statusUpdate({ taskId, contextId, status: status(TaskState.TASK_STATE_WORKING, 'on it'), metadata: undefined }));
    await sleep(30);
    if (content?.$case === 'text' && content.value === 'wait') {
      // Works until canceled (cancelTask below ends it).
      await new Promise((resolve) => this.waiting.set(taskId, resolve));
      return;
    }
    if (content?.$case === 'text' && content.value === 'fail') {
      bus.publish(AgentEvent.statusUpdate({ taskId, contextId, status: status(TaskState.TASK_STATE_FAILED, 'asked to fail'), metadata: undefined }));
      bus.finished();
      return;
    }
    const part = content?.$case === 'data' ? dataPart(content.value) : textPart(`echo: ${content?.value}`);
    bus.publish(
      AgentEvent.artifactUpdate({
        taskId,
        contextId,
        artifact: { artifactId: 'echo-1', name: 'echo', description: '', parts: [part], metadata: undefined, extensions: [] },
        append: false,
        lastChunk: true,
        metadata: undefined,
      }),
    );
    await sleep(30);
    bus.publish(AgentEvent.statusUpdate({ taskId, contextId, status: status(TaskState.TASK_STATE_COMPLETED), metadata: undefined }));
    bus.finished();
  }

  async cancelTask(taskId, bus) {
    this.canceled.push(taskId);
    bus.publish(AgentEvent.statusUpdate({ taskId, contextId: '', status: status(TaskState.TASK_STATE_CANCELED), metadata: undefined }));
    bus.finished();
    this.waiting.get(taskId)?.();
  }
}

/**
 * Starts an A2A agent on 127.0.0.1:0 with the SDK's server classes. `streaming` goes in the card.
 * `legacy`: the JSON-RPC handler also takes v0.3 (`legacyCompat`), and a v0.3 card is served at
 * /.well-known/agent.json (top-level `url`, `protocolVersion: "0.3.0"`).
 */
async function startA2aAgent(ctx, { name = 'Echo Remote', streaming = true, legacy = false } = {}) {
  const app = express();
  const executor = new EchoExecutor();
  const server = await new Promise((resolve, reject) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
    s.once('error', reject);
  });
  ctx.defer(() => new Promise((resolve) => server.close(() => resolve())));
  ctx.defer(() => server.closeAllConnections?.());
  const base = `http://127.0.0.1:${server.address().port}`;
  const card = {
    name,
    description: 'echoes what it is sent, streaming working -> artifact -> completed',
    supportedInterfaces: [
      { url: `${base}/a2a/jsonrpc`, protocolBinding: 'JSONRPC', tenant: '', protocolVersion: '1.0' },
      ...(legacy ? [{ url: `${base}/a2a/jsonrpc`, protocolBinding: 'JSONRPC', tenant: '', protocolVersion: '0.3' }] : []),
    ],
    provider: undefined,
    version: '1.2.3',
    capabilities: { streaming, pushNotifications: false, extensions: [], extendedAgentCard: false },
    securitySchemes: {},
    securityRequirements: [],
    defaultInputModes: ['text/plain', 'application/json'],
    defaultOutputModes: ['text/plain', 'application/json'],
    skills: [{ id: 'echo', name: 'Echo', description: 'echoes', tags: ['echo', 'test'], examples: ['hello'], inputModes: [], outputModes: [], securityRequirements: [] }],
    signatures: [],
  };
  const handler = new DefaultRequestHandler(card, new InMemoryTaskStore(), executor);
  const requests = [];
  app.use((req, _res, next) => {
    requests.push({ method: req.method, path: req.path, version: req.header('A2A-Version') ?? null });
    next();
  });
  app.use('/.well-known/agent-card.json', agentCardHandler({ agentCardProvider: handler }));
  if (legacy) {
    app.get('/.well-known/agent.json', (_req, res) =>
      res.json({
        protocolVersion: '0.3.0',
        name,
        description: card.description,
        url: `${base}/a2a/jsonrpc`,
        preferredTransport: 'JSONRPC',
        version: '1.2.3',
        capabilities: { streaming },
        defaultInputModes: card.defaultInputModes,
        defaultOutputModes: card.defaultOutputModes,
        skills: [{ id: 'echo', name: 'Echo', description: 'echoes', tags: ['echo'] }],
      }),
    );
  }
  app.use(
    '/a2a/jsonrpc',
    jsonRpcHandler({ requestHandler: handler, userBuilder: UserBuilder.noAuthentication, legacyCompat: { enabled: legacy } }),
  );
  return { base, executor, requests, cardUrl: `${base}/.well-known/agent-card.json`, legacyCardUrl: `${base}/.well-known/agent.json` };
}

/** A user text message in the A2A SDK's v1.0 shape. */
const a2aText = (text) => ({ messageId: `m-${Math.random().toString(36).slice(2)}`, role: 1, parts: [{ content: { $case: 'text', value: text } }] });

const httpBase = (router) => `http://${hostPort(router)}`;

/**
 * The router config that lets `POST /a2a/remote` register agents at these base URLs: the
 * agents run on loopback, which only an `[a2a] remote_allow` entry naming the host and port
 * allows (registering by request is off without one).
 */
const allowRemotes = (...bases) => `[a2a]\nremote_allow = [${bases.map((b) => JSON.stringify(`${b}/`)).join(', ')}]\n`;

async function postJson(url, body) {
  const res = await withTimeout(
    fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }),
    WAIT_MS * 3,
    `POST ${url}`,
  );
  return { status: res.status, body: await withTimeout(res.json(), WAIT_MS, 'response body') };
}

/** The MAP messages `h` received that answer `correlationId`, in arrival order. */
const answers = (h, correlationId) => h.received.filter((m) => m.meta?.correlationId === correlationId);

/** Waits for the final reply (isResult) to `correlationId`; returns every answer so far. */
async function finalAnswer(h, correlationId, timeout = WAIT_MS * 2) {
  await until(() => answers(h, correlationId).some((m) => m.meta?.isResult), `final reply to ${correlationId}`, timeout);
  return answers(h, correlationId);
}

// ---------------------------------------------------------------------------------------------

scenario('v1.0 streaming remote from [[a2a.remote]]: MAP send -> working, artifact, completed; task.* seen', async (ctx) => {
  const remote = await startA2aAgent(ctx, { streaming: true });
  const router = await ctx.startRouter({
    config: `[[a2a.remote]]\ncard_url = "${remote.cardUrl}"\nname = "echo-remote"\n`,
  });
  ctx.url = router.url;
  const observer = await ctx.client({ name: 'observer' });
  const tasks = await observer.watch({ eventTypes: ['task.*'] });
  const sender = await ctx.client({ name: 'sender' });

  // The configured agent appears as a MAP agent with its card's name, description, skills.
  let listed;
  await withTimeout(
    (async () => {
      for (;;) {
        const r = await sender.conn.callExtension('map/agents/list', {});
        listed = r.agents.find((a) => a.id === 'echo-remote');
        if (listed) return;
        await sleep(50);
      }
    })(),
    WAIT_MS * 2,
    'the configured remote agent registered',
  );
  assert.equal(listed.name, 'Echo Remote');
  assert.equal(listed.role, 'a2a-remote');
  assert.match(listed.description, /echoes/);
  assert.equal(listed.metadata.a2a.protocolVersion, '1.0');
  assert.equal(listed.metadata.a2a.streaming, true);
  assert.equal(listed.metadata.a2a.skills[0].id, 'echo');
  assert.equal(listed.metadata.a2a.cardUrl, remote.cardUrl);

  await withTimeout(sender.conn.send({ agent: 'echo-remote' }, 'hello', { expectsResponse: true, correlationId: 'c-1' }), WAIT_MS, 'send');
  const got = await finalAnswer(sender, 'c-1');
  // In order: working (status), the artifact, then the final reply with the artifact's text.
  const kinds = got.map((m) => m.meta.a2a.kind);
  const firstWorking = got.findIndex((m) => m.payload?.a2a?.status === 'working');
  const artifact = got.findIndex((m) => m.payload?.a2a?.artifact);
  const last = got.at(-1);
  assert.ok(firstWorking >= 0 && artifact > firstWorking, `working then artifact: ${JSON.stringify(kinds)}`);
  assert.equal(got[firstWorking].payload.a2a.message, 'on it');
  assert.equal(got[artifact].payload.a2a.artifact.artifactId, 'echo-1');
  assert.equal(got[artifact].payload.a2a.artifact.parts[0].text, 'echo: hello');
  assert.equal(got[artifact].payload.a2a.lastChunk, true);
  assert.equal(last.meta.isResult, true, 'the last answer is the result');
  assert.equal(last.meta.a2a.state, 'completed');
  assert.equal(last.payload, 'echo: hello');
  assert.equal(last.from, 'echo-remote');
  assert.equal(got.filter((m) => m.meta.isResult).length, 1, 'exactly one result');
  const taskId = last.meta.a2a.taskId;
  assert.ok(taskId, 'the reply names the remote task');
  for (const m of got) assert.equal(m.meta.a2a.taskId, taskId);
  // The remote agent got the text as a text part, over v1.0 SendStreamingMessage.
  assert.equal(remote.executor.seen[0].parts[0].content.value, 'hello');
  assert.ok(remote.requests.some((r) => r.method === 'POST' && r.version === '1.0'));

  // The MAP task mirrors the A2A task: created, then through in_progress to completed.
  const mapTaskId = `a2a-remote:echo-remote:${taskId}`;
  await tasks.waitFor('task.completed', (e) => e.data?.taskId === mapTaskId, 'task.completed of the remote task');
  const mine = tasks.events.filter((e) => (e.data?.task?.id ?? e.data?.taskId) === mapTaskId);
  assert.equal(mine[0].type, 'task.created');
  assert.equal(mine[0].data.task.assignee, 'echo-remote');
  const completed = mine.find((e) => e.type === 'task.completed');
  assert.equal(completed.data.result, 'echo: hello');
  assert.equal(completed.data.task.meta.a2aRemote.state, 'completed');
  assert.equal(completed.data.task.meta.a2aRemote.requestedBy, sender.id);
  assert.ok(mine.some((e) => e.type === 'task.status' && e.data.current === 'in_progress'), 'in_progress seen');
});

scenario('A2A -> MAP -> A2A: an @a2a-js/sdk client calls the remote agent through the gateway; its cancel reaches the remote task', async (ctx) => {
  const remote = await startA2aAgent(ctx, { streaming: true });
  const router = await ctx.startRouter({ config: allowRemotes(remote.base) });
  ctx.url = router.url;
  const base = httpBase(router);
  const reg = await postJson(`${base}/a2a/remote`, { cardUrl: remote.cardUrl, name: 'echo-remote' });
  assert.equal(reg.status, 201, JSON.stringify(reg.body));
  // The remote agent is a MAP agent, so the server side serves it to A2A callers too.
  const client = await withTimeout(new ClientFactory().createFromUrl(`${base}/a2a/agents/echo-remote/`), WAIT_MS, 'createFromUrl');
  const task = await withTimeout(client.sendMessage({ message: a2aText('proxied') }), WAIT_MS * 2, 'sendMessage');
  assert.equal(task.status.state, TaskState.TASK_STATE_COMPLETED, JSON.stringify(task.status));
  assert.equal(task.artifacts.at(-1).parts[0].content.value, 'echo: proxied');
  // A working task canceled by the A2A caller: the gateway's cancel notice becomes the remote
  // agent's CancelTask.
  const waiting = await withTimeout(
    client.sendMessage({ message: a2aText('wait'), configuration: { returnImmediately: true, acceptedOutputModes: [] } }),
    WAIT_MS,
    'sendMessage (returnImmediately)',
  );
  await until(() => remote.executor.waiting.size > 0, 'the remote task is working');
  const canceled = await withTimeout(client.cancelTask({ id: waiting.id }), WAIT_MS, 'cancelTask');
  assert.equal(canceled.status.state, TaskState.TASK_STATE_CANCELED);
  const [remoteTask] = remote.executor.waiting.keys();
  await until(() => remote.executor.canceled.includes(remoteTask), 'the remote agent canceled its task');
});

scenario('POST /a2a/remote registers by card URL; data payloads pass verbatim; failed task; unreachable card', async (ctx) => {
  const remote = await startA2aAgent(ctx, { name: 'Data Echo', streaming: true });
  const router = await ctx.startRouter({ config: allowRemotes(remote.base, 'http://127.0.0.1:9') });
  ctx.url = router.url;
  const base = httpBase(router);
  const reg = await postJson(`${base}/a2a/remote`, { cardUrl: remote.cardUrl });
  assert.equal(reg.status, 201, JSON.stringify(reg.body));
  assert.equal(reg.body.agent.id, 'data-echo');
  assert.equal(reg.body.remote.protocolVersion, '1.0');
  // The same id again: 409.
  const again = await postJson(`${base}/a2a/remote`, { cardUrl: remote.cardUrl });
  assert.equal(again.status, 409);
  // Nobody listens there: a clear 502, fast, that says no more than "unreachable".
  const dead = await postJson(`${base}/a2a/remote`, { cardUrl: 'http://127.0.0.1:9/.well-known/agent-card.json', name: 'dead' });
  assert.equal(dead.status, 502);
  assert.match(dead.body.error, /remote unreachable/i);
  // Anywhere the allow-list does not name (here: the router's own metrics) is refused unfetched.
  const internal = await postJson(`${base}/a2a/remote`, { cardUrl: `${base}/metrics`, name: 'internal' });
  assert.equal(internal.status, 403);
  assert.match(internal.body.error, /remote_allow/);
  const bad = await postJson(`${base}/a2a/remote`, { cardUrl: 'ftp://x' });
  assert.equal(bad.status, 400);

  const sender = await ctx.client({ name: 'sender' });
  // An object payload goes as a data part and comes back verbatim (key order and all).
  await withTimeout(sender.conn.send({ agent: 'data-echo' }, { z: 1, a: [2, { y: 'é' }] }, { correlationId: 'c-data' }), WAIT_MS, 'send data');
  const got = await finalAnswer(sender, 'c-data');
  assert.deepEqual(got.at(-1).payload, { z: 1, a: [2, { y: 'é' }] });
  assert.deepEqual(remote.executor.seen[0].parts[0].content.value, { z: 1, a: [2, { y: 'é' }] });
  const raw = sender.frames.find((f) => f.method === 'map/message' && f.params?.message?.meta?.isResult);
  assert.ok(raw, 'the raw result frame');
  // Byte for byte through the gateway (JSON.parse keeps key order): the order z, a survives.
  assert.equal(JSON.stringify(raw.params.message.payload), '{"z":1,"a":[2,{"y":"é"}]}');

  // A task that fails: the result says so.
  await withTimeout(sender.conn.send({ agent: 'data-echo' }, 'fail', { correlationId: 'c-fail' }), WAIT_MS, 'send fail');
  const failed = await finalAnswer(sender, 'c-fail');
  assert.equal(failed.at(-1).meta.a2a.state, 'failed');
  assert.equal(failed.at(-1).payload.a2a.state, 'failed');
  assert.equal(failed.at(-1).payload.a2a.message, 'asked to fail');

  // Listed, then unregistered: it leaves MAP.
  const list = await withTimeout(fetch(`${base}/a2a/remote`).then((r) => r.json()), WAIT_MS, 'GET /a2a/remote');
  assert.deepEqual(list.remotes.map((r) => r.agentId), ['data-echo']);
  const del = await withTimeout(fetch(`${base}/a2a/remote/data-echo`, { method: 'DELETE' }), WAIT_MS, 'DELETE');
  assert.equal(del.status, 200);
  await withTimeout(
    (async () => {
      for (;;) {
        const r = await sender.conn.callExtension('map/agents/list', {});
        if (!r.agents.some((a) => a.id === 'data-echo')) return;
        await sleep(50);
      }
    })(),
    WAIT_MS,
    'the agent gone',
  );
});

scenario('v0.3 remote (card at /.well-known/agent.json, no streaming): message/send, the answer, the MAP task', async (ctx) => {
  const remote = await startA2aAgent(ctx, { name: 'Old Echo', streaming: false, legacy: true });
  const router = await ctx.startRouter({ config: allowRemotes(remote.base) });
  ctx.url = router.url;
  const observer = await ctx.client({ name: 'observer' });
  const tasks = await observer.watch({ eventTypes: ['task.*'] });
  const reg = await postJson(`${httpBase(router)}/a2a/remote`, { cardUrl: remote.legacyCardUrl, name: 'old-echo' });
  assert.equal(reg.status, 201, JSON.stringify(reg.body));
  assert.equal(reg.body.remote.protocolVersion, '0.3');
  assert.equal(reg.body.remote.streaming, false);
  const sender = await ctx.client({ name: 'sender' });
  await withTimeout(sender.conn.send({ agent: 'old-echo' }, 'hi there', { correlationId: 'c-old' }), WAIT_MS, 'send');
  const got = await finalAnswer(sender, 'c-old');
  const last = got.at(-1);
  assert.equal(last.meta.a2a.state, 'completed');
  assert.equal(last.payload, 'echo: hi there');
  // It spoke v0.3: no A2A-Version header (the SDK server then takes the v0.3 compat path).
  assert.ok(remote.requests.some((r) => r.method === 'POST' && r.version === null), JSON.stringify(remote.requests));
  await tasks.waitFor('task.completed', (e) => e.data?.taskId === `a2a-remote:old-echo:${last.meta.a2a.taskId}`, 'task.completed');
});

// ---------------------------------------------------------------------------------------------

await runScenarios(scenarios, { bin: BIN, filter: FILTER, verbose: VERBOSE, timeoutMs: SCENARIO_TIMEOUT_MS });
