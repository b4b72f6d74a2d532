#!/usr/bin/env node
// Traces out, the acceptance of issue 45: the built router exports its spans over OTLP/HTTP to a
// real Arize Phoenix (tests/interop/phoenix.mjs, loopback only) while ordinary SDK agents work,
// and the trace is read back through Phoenix's REST API.
//
//   node tests/interop/traces.mjs [--bin <path-to-map-router>] [--verbose]
//   TRACES_SCREENSHOT=docs/img/phoenix-multi-agent-trace.png node tests/interop/traces.mjs
//
// Under one caller's W3C trace (the caller's own span is exported by this script, so the tree
// has a known root):
// - caller -> planner (a request carrying meta.traceparent); the planner continues from the
//   router's span of that delivery, read from the map/message frame's params._meta.traceparent
//   (the SDK hands a message handler the message only, so the script reads the frame off the
//   socket, as an agent without that SDK would); planner -> researcher (a request in a mail
//   conversation), researcher replies (isResult + correlationId) in the conversation;
//   planner -> the AIP tool `add` (examples/aip-python/tool.py over the AIP gateway), the
//   gateway replies; planner replies to the caller;
// - an @a2a-js/sdk client calls the A2A gateway with an HTTP `traceparent` header carrying the
//   caller's span; the researcher answers.
// Then it asserts: one tree under the caller's span, no unknown parent; invoke_agent spans with
// gen_ai.agent.id/name that Phoenix classifies AGENT; replies nested under their requests;
// gen_ai.conversation.id on the conversation's messages; the A2A hop (a2a.*) and the tool call
// (execute_tool, TOOL) in the trace; no payload text anywhere; a trace started for an untraced
// send (a root span, a new trace id); and, from a second router with capture_content = true,
// the payload text present.
//
// Prints `ok - ...` per check and the span tree; exits 0 only when everything held. Every wait
// is bounded. With TRACES_SCREENSHOT set, saves Phoenix's page of the trace there (PNG).
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  ClientFactory,
  ClientFactoryOptions,
  DefaultAgentCardResolver,
  JsonRpcTransportFactory,
} from '@a2a-js/sdk/client';
import { AgentConnection, websocketStream } from '@multi-agent-protocol/sdk';
import WebSocket from 'ws';
import { assert, withTimeout, sleep } from './lib.mjs';
import { startPhoenix, encodeSpans, SpanKind } from './phoenix.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '../..');
const argv = process.argv.slice(2);
const argValue = (flag) => {
  const i = argv.indexOf(flag);
  return i >= 0 ? argv[i + 1] : undefined;
};
const BIN = path.resolve(argValue('--bin') ?? path.join(ROOT, 'target/debug/map-router'));
const VERBOSE = argv.includes('--verbose') || !!process.env.INTEROP_VERBOSE;
const SCREENSHOT = process.env.TRACES_SCREENSHOT;
const AIP_PYTHON = path.join(ROOT, 'tests/aip_py/.venv/bin/python');
/** One step (a connection, a reply, an A2A call). */
const STEP_MS = 10_000;
/** Spans to show up in Phoenix after the work that makes them. */
const SPANS_MS = 20_000;
/** The whole script. */
const TOTAL_MS = 180_000;

// Text that must never leave the router unless capture_content is on.
const SECRET = {
  ask: 'SECRET-ASK-c41f',
  research: 'SECRET-RESEARCH-9b2e',
  finding: 'SECRET-FINDING-77d0',
  answer: 'SECRET-ANSWER-0a5c',
  tool: 'SECRET-TOOL-3e81',
  a2a: 'SECRET-A2A-d6f2',
  untraced: 'SECRET-UNTRACED-51aa',
};
const VISIBLE = 'CAPTURED-CONTENT-e03b';

const cleanups = [];
const check = (cond, what) => {
  assert.ok(cond, what);
  console.log(`ok - ${what}`);
};
const hex = (n) => randomBytes(n).toString('hex');
const traceOf = (tp) => tp?.split('-')[1];
const spanOf = (tp) => tp?.split('-')[2];

// ---------------------------------------------------------------------------------------------
// Processes

/** The router with `--aip-listen` and `config`, OTEL_* removed from its environment. */
function startRouter(config) {
  const dir = mkdtempSync(path.join(tmpdir(), 'map-router-traces-'));
  const file = path.join(dir, 'router.toml');
  writeFileSync(file, config);
  const env = { ...process.env };
  for (const key of Object.keys(env)) if (key.startsWith('OTEL_')) delete env[key];
  const proc = spawn(
    BIN,
    ['--listen', '127.0.0.1:0', '--aip-listen', '127.0.0.1:0', '--data-dir', path.join(dir, 'data'), '--config', file],
    { env, stdio: ['ignore', 'ignore', 'pipe'] },
  );
  const router = { proc, log: [], url: null, aip: null };
  const exited = new Promise((resolve) => proc.once('exit', resolve));
  cleanups.push(async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGKILL');
      await withTimeout(exited, 5000, 'router exit').catch(() => {});
    }
    rmSync(dir, { recursive: true, force: true });
  });
  return withTimeout(
    new Promise((resolve, reject) => {
      let buf = '';
      proc.stderr.setEncoding('utf8').on('data', (chunk) => {
        buf += chunk;
        let nl;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          router.log.push(line);
          if (VERBOSE) process.stderr.write(`[router] ${line}\n`);
          const ws = /map-router listening on (ws:\/\/127\.0\.0\.1:\d+\/)/.exec(line);
          if (ws) router.url = ws[1];
          const aip = /map-router AIP gateway listening on (127\.0\.0\.1:\d+)/.exec(line);
          if (aip) router.aip = aip[1];
          if (router.url && router.aip) resolve(router);
        }
      });
      proc.once('exit', (code) => reject(new Error(`router exited (${code}): ${router.log.join('\n')}`)));
    }),
    STEP_MS,
    'router start',
  );
}

/** The AIP stubs, generated from the router's schema by grpcio-tools (as scripts/aip_py.sh does). */
function aipStubs() {
  const dir = mkdtempSync(path.join(tmpdir(), 'map-router-traces-stubs-'));
  cleanups.push(async () => rmSync(dir, { recursive: true, force: true }));
  const r = spawnSync(
    AIP_PYTHON,
    ['-m', 'grpc_tools.protoc', '-I', 'src/gateway/aip/proto', `--python_out=${dir}`, `--grpc_python_out=${dir}`, 'schema.proto'],
    { cwd: ROOT, encoding: 'utf8', timeout: STEP_MS },
  );
  if (r.status !== 0) throw new Error(`grpc_tools.protoc failed (${r.status}): ${r.stderr ?? r.error}`);
  return dir;
}

/** examples/aip-python/tool.py (`add`) registered at the router's AIP gateway. */
async function startTool(router, stubs) {
  const proc = spawn(
    AIP_PYTHON,
    ['examples/aip-python/tool.py', '--gateway', router.aip, '--id', 'add', '--domain', 'math', '--stubs', stubs, '--heartbeat', '30'],
    { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  const exited = new Promise((resolve) => proc.once('exit', resolve));
  cleanups.push(async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGKILL');
      await withTimeout(exited, 5000, 'tool exit').catch(() => {});
    }
  });
  let out = '';
  proc.stderr.setEncoding('utf8').on('data', (c) => { out += c; });
  await withTimeout(
    new Promise((resolve, reject) => {
      proc.stdout.setEncoding('utf8').on('data', (c) => {
        out += c;
        if (/^ready add /m.test(out)) resolve();
      });
      proc.once('exit', (code) => reject(new Error(`tool.py exited (${code}): ${out}`)));
    }),
    STEP_MS,
    'the AIP tool to register',
  );
}

/**
 * An SDK agent (AgentConnection over our own WebSocket). `frames` maps each delivered message's
 * id to the frame's params._meta.traceparent (the router's span of that delivery), read off the
 * socket before the SDK sees the frame. `waitReply(correlationId)` resolves with the reply.
 */
async function sdkAgent(url, name, onRequest = () => {}) {
  const ws = new WebSocket(url);
  const frames = new Map();
  const inbox = [];
  ws.on('message', (data, isBinary) => {
    if (isBinary) return;
    const f = JSON.parse(data.toString());
    if (f.method === 'map/message') frames.set(f.params.message.id, f.params._meta?.traceparent);
  });
  await withTimeout(new Promise((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('error', reject);
  }), STEP_MS, `${name} socket`);
  cleanups.push(async () => ws.terminate());
  const conn = new AgentConnection(websocketStream(ws), { name, role: 'assistant' });
  const waiting = new Map();
  const a = { name, conn, frames, inbox };
  // NB: the SDK awaits message handlers in its reader loop: a handler must not await a call on
  // its own connection (the answer could never be read), so sends are started, not awaited.
  conn.onMessage((m) => {
    inbox.push(m);
    const c = m.meta?.correlationId;
    if (m.meta?.isResult && waiting.has(c)) {
      waiting.get(c)(m);
      waiting.delete(c);
      return;
    }
    onRequest(m, a);
  });
  a.waitReply = (correlationId, what) => {
    const p = new Promise((resolve) => waiting.set(correlationId, resolve));
    return withTimeout(p, STEP_MS, what);
  };
  a.fail = (e) => { a.error ??= e; };
  await withTimeout(conn.connect(), STEP_MS, `${name} connect`);
  a.id = conn.agentId;
  return a;
}

/** Waits until `message` (by payload marker) has reached `agent`; returns it. */
async function received(agent, pred, what) {
  const deadline = Date.now() + STEP_MS;
  for (;;) {
    const m = agent.inbox.find(pred);
    if (m) return m;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

/** Polls Phoenix until `ready(spans)` holds (bounded); returns the spans. */
async function spansWhen(phoenix, traceId, ready, what) {
  const deadline = Date.now() + SPANS_MS;
  for (;;) {
    const spans = await phoenix.spans(traceId);
    if (ready(spans)) return spans;
    if (Date.now() > deadline) {
      throw new Error(`Phoenix: ${what} not there after ${SPANS_MS} ms; it holds ${spans.length} span(s): ${tree(spans)}`);
    }
    await sleep(250);
  }
}

/** The spans as an indented tree (name, kind, id), parents first; orphans flagged. */
function tree(spans) {
  const ids = new Set(spans.map((s) => s.context.span_id));
  const children = new Map();
  for (const s of spans) {
    const p = s.parent_id && ids.has(s.parent_id) ? s.parent_id : null;
    if (!children.has(p)) children.set(p, []);
    children.get(p).push(s);
  }
  const lines = [];
  const walk = (parent, depth) => {
    const kids = (children.get(parent) ?? []).sort((a, b) => a.start_time.localeCompare(b.start_time));
    for (const s of kids) {
      const orphan = s.parent_id && !ids.has(s.parent_id) ? ` UNKNOWN PARENT ${s.parent_id}` : '';
      lines.push(`${'  '.repeat(depth)}${s.name} [${s.span_kind}] ${s.context.span_id}${orphan}`);
      walk(s.context.span_id, depth + 1);
    }
  };
  walk(null, 0);
  return `\n${lines.join('\n')}`;
}

const textMessage = (text) => ({
  messageId: `m-${hex(6)}`,
  role: 1,
  parts: [{ content: { $case: 'text', value: text } }],
});

// ---------------------------------------------------------------------------------------------

async function main() {
  const started = Date.now();
  const [phoenix, stubs] = await Promise.all([startPhoenix(), Promise.resolve().then(aipStubs)]);
  cleanups.push(() => phoenix.stop());
  console.log(`# Phoenix on ${phoenix.otlpBase} after ${Date.now() - started} ms`);
  const telemetry = (capture) =>
    `[telemetry]\nendpoint = "${phoenix.otlpBase}"\ndelay_ms = 50\ncapture_content = ${capture}\n`;
  const router = await startRouter(telemetry(false));
  await startTool(router, stubs);

  // The caller's trace: its own span C is exported below, so the tree's root is known.
  const T = hex(16);
  const C = hex(8);
  const callerTp = `00-${T}-${C}-01`;
  const callerStart = BigInt(Date.now()) * 1_000_000n;

  let conversationId;
  const researcher = await sdkAgent(router.url, 'researcher', (m, self) => {
    // The A2A gateway's message: echo it (the task completes with it as its artifact).
    // The planner's request: a finding, in the conversation.
    const mail = m.meta?.mail?.conversationId ? { mail: { conversationId: m.meta.mail.conversationId } } : {};
    const answer = m.meta?.protocol === 'a2a' ? m.payload : { finding: SECRET.finding };
    self.conn.reply(m, answer, mail).catch(self.fail);
  });
  const planner = await sdkAgent(router.url, 'planner', (m, self) => {
    if (m.payload?.untraced) return;
    // The caller's request: continue from the router's span of this delivery.
    const tp = self.frames.get(m.id);
    self.continued = tp;
    if (!tp) return self.fail(new Error(`no params._meta.traceparent on the frame of ${m.id}`));
    const research = self.conn.sendWithMail({ agent: researcher.id }, { research: SECRET.research }, conversationId, {
      meta: { traceparent: tp, correlationId: 'research-1', expectsResponse: true },
    });
    // An AIP tool call as the Rust client's call_tool sends it (docs/aip.md).
    const tool = self.conn.send({ agent: 'add' }, { tool: 'add', arguments: { a: '2', b: '3', note: SECRET.tool } }, {
      protocol: 'aip', aip: { kind: 'tool_call', toolName: 'add' },
      traceparent: tp, correlationId: 'tool-1', expectsResponse: true,
    });
    Promise.all([
      research, tool,
      self.waitReply('research-1', 'the researcher\'s reply'),
      self.waitReply('tool-1', 'the tool\'s answer'),
    ]).then(([, , finding, sum]) => {
      self.toolAnswer = sum.payload;
      self.finding = finding;
      return self.conn.reply(m, { answer: SECRET.answer, sum: sum.payload?.parts });
    }).catch(self.fail);
  });
  const caller = await sdkAgent(router.url, 'caller');
  ({ conversation: { id: conversationId } } = await withTimeout(
    planner.conn.createConversation({ subject: 'trip' }), STEP_MS, 'mail/create'));

  // 1. caller -> planner -> (researcher, tool) -> planner -> caller.
  const asked = caller.waitReply('ask-1', 'the planner\'s answer');
  await withTimeout(caller.conn.send({ agent: planner.id }, { ask: SECRET.ask }, {
    traceparent: callerTp, correlationId: 'ask-1', expectsResponse: true,
  }), STEP_MS, 'the caller\'s send');
  const answer = await asked.catch((e) => { throw planner.error ?? e; });
  check(answer.payload.answer === SECRET.answer, 'caller -> planner -> researcher + AIP tool -> planner -> caller');
  check(JSON.stringify(planner.toolAnswer?.parts ?? []).includes('5') && !planner.toolAnswer.isError,
    `the AIP tool answered 2 + 3 (${JSON.stringify(planner.toolAnswer)})`);
  const S1 = spanOf(planner.continued);
  check(traceOf(planner.continued) === T && S1 !== C,
    `the planner's frame carried the router's span in the caller's trace (${planner.continued})`);

  // 2. An A2A call in the same trace: the traceparent header of the HTTP request.
  const base = `http://${new URL(router.url).host}`;
  const fetchImpl = (url, init = {}) => {
    const headers = new Headers(init.headers);
    headers.set('traceparent', callerTp);
    return fetch(url, { ...init, headers });
  };
  const factory = new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    transports: [new JsonRpcTransportFactory({ fetchImpl })],
    cardResolver: new DefaultAgentCardResolver({ fetchImpl }),
  }));
  const a2a = await withTimeout(factory.createFromUrl(`${base}/a2a/agents/${researcher.id}/`), STEP_MS, 'A2A card');
  const task = await withTimeout(a2a.sendMessage({ message: textMessage(SECRET.a2a) }), STEP_MS, 'A2A sendMessage');
  check(task.status?.state === 3, `the A2A task completed (${task.id})`);
  const callerEnd = BigInt(Date.now()) * 1_000_000n;

  // 3. An untraced send: the router starts a trace.
  await withTimeout(caller.conn.send({ agent: planner.id }, { untraced: SECRET.untraced }), STEP_MS, 'untraced send');
  const untraced = await received(planner, (m) => m.payload?.untraced, 'the untraced message');
  const untracedTp = planner.frames.get(untraced.id);
  check(/^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/.test(untracedTp ?? '') && traceOf(untracedTp) !== T,
    `an untraced send's frame names a new trace (${untracedTp})`);
  check(untraced.meta?.traceparent === undefined
    && researcher.inbox.find((m) => m.payload?.research)?.meta?.traceparent === planner.continued,
  'the messages\' own meta as their senders wrote it (the router\'s span only in the frame\'s _meta)');
  if (researcher.error || planner.error) throw researcher.error ?? planner.error;

  // The caller's own span, the root of the tree.
  const status = await phoenix.export(encodeSpans([{
    traceId: T, spanId: C, name: 'caller: plan a trip', kind: SpanKind.CLIENT,
    startNs: callerStart, endNs: callerEnd,
    attributes: { 'openinference.span.kind': 'CHAIN' },
  }], 'caller-app'));
  check(status === 200, 'the caller\'s span is exported');

  // 4. Read back.
  const named = (spans, name) => spans.filter((s) => s.name === name);
  const spans = await spansWhen(phoenix, T, (ss) =>
    ss.some((s) => s.context.span_id === C)
    && named(ss, 'invoke_agent planner').length >= 3 // the ask, the finding, the tool's answer
    && named(ss, 'invoke_agent researcher').length >= 1
    && named(ss, 'invoke_agent caller').length >= 1
    && named(ss, 'execute_tool add').length >= 1,
  'the multi-agent trace');
  // The A2A call joins the trace through its HTTP traceparent header (the gateways carry it
  // into the MAP message's meta), and the task's changes with it; the last of them, the task
  // completed, is logged before sendMessage answers. Spans are exported as they end, so a
  // child may land before its parent: wait until every parent is there (an orphan that stays
  // fails the wait, and the tree printed shows it).
  const parentsKnown = (ss) => {
    const ids = new Set(ss.map((s) => s.context.span_id));
    return ss.every((s) => !s.parent_id || ids.has(s.parent_id));
  };
  const all = await spansWhen(phoenix, T, (ss) =>
    ss.some((s) => s.attributes['a2a.task.id'] === task.id)
    && ss.some((s) => s.attributes['map.task.id'] === task.id && s.attributes['a2a.task.state'] === 'completed')
    && parentsKnown(ss),
  `the A2A call (a span with a2a.task.id = ${task.id}, its task completed) in the caller's trace, every parent known`);
  console.log(`# the trace ${T} in Phoenix (${all.length} spans):${tree(all)}`);
  const byId = new Map(all.map((s) => [s.context.span_id, s]));
  check(all.length >= spans.length, 'no span vanished');
  check(all.every((s) => s.context.trace_id === T), 'every span is in the caller\'s trace');
  const roots = all.filter((s) => !s.parent_id);
  check(roots.length === 1 && roots[0].context.span_id === C, 'one root: the caller\'s span');
  const orphans = all.filter((s) => s.parent_id && !byId.has(s.parent_id));
  check(orphans.length === 0, `no unknown parents (${orphans.map((s) => `${s.name} -> ${s.parent_id}`).join(', ')})`);
  const agents = all.filter((s) => s.name.startsWith('invoke_agent '));
  for (const s of agents) {
    const a = s.attributes;
    assert.equal(s.span_kind, 'AGENT', `${s.name} classified`);
    assert.equal(a['gen_ai.operation.name'], 'invoke_agent', `${s.name} operation`);
    assert.equal(`invoke_agent ${a['gen_ai.agent.name']}`, s.name, `${s.name} gen_ai.agent.name`);
    assert.ok(a['gen_ai.agent.id'], `${s.name} gen_ai.agent.id`);
  }
  const ids = { planner: planner.id, researcher: researcher.id, caller: caller.id };
  check(agents.every((s) => !(s.attributes['gen_ai.agent.name'] in ids) || s.attributes['gen_ai.agent.id'] === ids[s.attributes['gen_ai.agent.name']]),
    `${agents.length} invoke_agent spans, AGENT in Phoenix, with gen_ai.agent.id/name of the agent`);
  const s1 = byId.get(S1);
  check(s1?.name === 'invoke_agent planner' && s1.parent_id === C
    && s1.attributes['map.sender'] === caller.id && s1.attributes['map.outcome'] === 'delivered',
  'the ask: invoke_agent planner under the caller\'s span, the span the planner continued from');
  const research = all.find((s) => s.name === 'invoke_agent researcher' && s.attributes['map.correlation_id'] === 'research-1');
  check(research?.parent_id === S1, 'planner -> researcher under the ask (the frame\'s _meta.traceparent)');
  const finding = all.find((s) => s.name === 'invoke_agent planner' && s.attributes['map.correlation_id'] === 'research-1');
  check(finding?.parent_id === research.context.span_id && finding.attributes['map.is_result'] === true,
    'the researcher\'s reply under the research request');
  check(research.attributes['gen_ai.conversation.id'] === conversationId
    && finding.attributes['gen_ai.conversation.id'] === conversationId,
  `gen_ai.conversation.id ${conversationId} on the conversation's two messages`);
  const tool = named(all, 'execute_tool add')[0];
  check(tool.parent_id === S1 && tool.span_kind === 'TOOL' && tool.attributes['gen_ai.tool.name'] === 'add'
    && tool.attributes['gen_ai.operation.name'] === 'execute_tool',
  'the AIP tool call: execute_tool add under the ask, TOOL in Phoenix');
  const toolAnswer = all.find((s) => s.name === 'invoke_agent planner' && s.attributes['map.correlation_id'] === 'tool-1');
  check(toolAnswer?.parent_id === tool.context.span_id, 'the tool\'s answer under the tool call');
  const reply = all.find((s) => s.name === 'invoke_agent caller' && s.attributes['map.correlation_id'] === 'ask-1');
  check(reply?.parent_id === S1 && reply.attributes['map.is_result'] === true, 'the planner\'s answer under the ask');
  const a2aHop = all.find((s) => s.name === 'invoke_agent researcher' && s.attributes['a2a.task.id'] === task.id);
  check(a2aHop?.parent_id === C && a2aHop.attributes['gen_ai.conversation.id'] === task.contextId,
    `the A2A call under the caller's span (header traceparent), a2a.task.id, gen_ai.conversation.id = contextId (a2a.method.name: ${a2aHop?.attributes['a2a.method.name']})`);
  const a2aReply = all.find((s) => s.attributes['map.correlation_id'] === task.id && s.attributes['map.is_result'] === true);
  check(a2aReply?.parent_id === a2aHop.context.span_id, `the researcher's A2A answer under the A2A call (${a2aReply?.name})`);
  const completed = all.find((s) => s.attributes['map.task.id'] === task.id && s.attributes['a2a.task.state'] === 'completed');
  check(completed.parent_id === a2aReply.context.span_id,
    `the A2A task's completion (${completed.name}, a2a.task.state = completed) under the answer that completed it`);
  if (VERBOSE) for (const s of all) console.log(`# ${s.name} ${s.context.span_id}: ${JSON.stringify(s.attributes)}`);
  const text = JSON.stringify(all);
  const leaked = Object.values(SECRET).filter((s) => text.includes(s));
  check(leaked.length === 0 && !all.some((s) => 'map.message.payload' in s.attributes),
    `no payload text in any span by default (${leaked.join(', ')})`);

  // The untraced send: a trace of its own, its span the root.
  const fresh = await spansWhen(phoenix, traceOf(untracedTp), (ss) => ss.length >= 1, 'the untraced send\'s trace');
  check(fresh.length === 1 && fresh[0].parent_id === null && fresh[0].context.span_id === spanOf(untracedTp)
    && fresh[0].name === 'invoke_agent planner' && !JSON.stringify(fresh).includes(SECRET.untraced),
  `an untraced send starts a trace: ${fresh[0]?.name} is its root (${traceOf(untracedTp)})`);

  if (SCREENSHOT) {
    const out = path.resolve(ROOT, SCREENSHOT);
    const url = await phoenix.screenshot(T, out);
    check(statSync(out).size > 30_000 && readFileSync(out).subarray(0, 4).toString('latin1') === '\x89PNG',
      `a screenshot of ${url} in ${SCREENSHOT}`);
  }

  // A tool call in docs/aip.md's minimal form (a request whose payload is {tool, arguments},
  // no meta.protocol / meta.aip) to an agent whose role is `tool` is a tool call too.
  const T3 = hex(16);
  const bare = caller.waitReply('tool-bare', 'the tool\'s answer to the minimal form');
  await withTimeout(caller.conn.send({ agent: 'add' }, { tool: 'add', arguments: { a: '1', b: '1' } }, {
    traceparent: `00-${T3}-${hex(8)}-01`, correlationId: 'tool-bare', expectsResponse: true,
  }), STEP_MS, 'the minimal tool call');
  await bare;
  const bareSpans = await spansWhen(phoenix, T3, (ss) => ss.some((s) => s.attributes['gen_ai.tool.name'] === 'add'), 'the minimal tool call\'s span');
  const bareSpan = bareSpans.find((s) => s.attributes['gen_ai.tool.name'] === 'add');
  check(bareSpan.name === 'execute_tool add' && bareSpan.span_kind === 'TOOL',
    `a tool call in docs/aip.md's minimal form is "execute_tool add" [TOOL] (got "${bareSpan.name}" [${bareSpan.span_kind}])`);

  // 5. capture_content = true: a second router exports the payload text.
  const open = await startRouter(telemetry(true));
  const b = await sdkAgent(open.url, 'reader');
  const a = await sdkAgent(open.url, 'writer');
  const T2 = hex(16);
  await withTimeout(a.conn.send({ agent: b.id }, { text: VISIBLE }, { traceparent: `00-${T2}-${hex(8)}-01` }), STEP_MS, 'send with content');
  const shown = await spansWhen(phoenix, T2, (ss) => ss.length >= 1, 'the span with content');
  check(shown[0].name === 'invoke_agent reader' && shown[0].attributes['map.message.payload'] === JSON.stringify({ text: VISIBLE }),
    `with capture_content the payload is exported (map.message.payload = ${shown[0].attributes['map.message.payload']})`);
  console.log(`# ${Date.now() - started} ms in all`);
}

let failed = false;
try {
  await withTimeout(main(), TOTAL_MS, 'the traces acceptance');
} catch (err) {
  failed = true;
  console.log(`FAIL - ${err.stack ?? err}`);
} finally {
  for (const c of cleanups.reverse()) await c().catch(() => {});
}
process.exit(failed ? 1 : 0);
