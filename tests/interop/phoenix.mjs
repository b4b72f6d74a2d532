// A real Arize Phoenix for node scripts (the traces tests, issue 45): the twin of
// tests/common/phoenix.rs, which documents the JSON shape of the spans Phoenix returns. No npm
// dependencies (node:child_process, node:net, global fetch).
//
//   import { startPhoenix, encodeSpans } from './phoenix.mjs';
//   const phoenix = await startPhoenix();          // 127.0.0.1, reserved ports, temp working dir
//   phoenix.otlpBase                               // 'http://127.0.0.1:PORT' (OTLP/HTTP at /v1/traces)
//   await phoenix.export(encodeSpans([...]))       // POST /v1/traces (protobuf), returns the status
//   await phoenix.spans(traceId)                   // every span of the trace (REST API, all pages)
//   await phoenix.waitSpans(traceId, n, 15000)     // polls until n spans are there (bounded)
//   await phoenix.traceUrl(traceId)                // the UI's page of the trace
//   await phoenix.screenshot(traceId, 'x.png')     // headless Chromium, 1400x900 PNG
//   await phoenix.stop()                           // SIGKILL, temp dir removed
//
// Phoenix's OTLP/HTTP endpoint takes `application/x-protobuf` only (no OTLP/JSON): an exporter
// pointed at it must send protobuf.
//
//   node tests/interop/phoenix.mjs --self-test
// starts Phoenix, exports an `invoke_agent` span and its `execute_tool` child, reads them back,
// checks Phoenix's AGENT / TOOL classification and takes a screenshot; prints `ok - ...` lines
// and exits 0, or prints the failure (and Phoenix's log) and exits 1. tests/phoenix_harness.rs
// runs it.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync, statSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const PYTHON = path.join(ROOT, 'tests/phoenix/.venv/bin/python');
const SERVE = path.join(ROOT, 'tests/phoenix/serve.py');
/** How long Phoenix may take to answer /healthz (about 8 s idle, 25 s seen under load). */
export const START_MS = 90_000;
const BROWSER_MS = 60_000;
const MAX_PAGES = 50;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** A free loopback port (held until the listener closes; Phoenix binds it right after). */
function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** `fetch` with a deadline. */
async function fetchWithin(url, options = {}, ms = 5000) {
  return fetch(url, { ...options, signal: AbortSignal.timeout(ms) });
}

/** Starts `phoenix serve` (through tests/phoenix/serve.py) and resolves once /healthz answers. */
export async function startPhoenix() {
  if (!existsSync(PYTHON)) {
    throw new Error(`${PYTHON} is missing: run scripts/setup.sh (it makes the Phoenix venv)`);
  }
  const port = await freePort();
  let grpcPort = await freePort();
  while (grpcPort === port) grpcPort = await freePort();
  const dir = mkdtempSync(path.join(tmpdir(), 'map-router-phoenix-'));
  const logFile = path.join(dir, 'phoenix.log');
  const logFd = openSync(logFile, 'a');
  const env = { ...process.env };
  for (const key of Object.keys(env)) if (key.startsWith('OTEL_')) delete env[key];
  Object.assign(env, {
    PHOENIX_HOST: '127.0.0.1',
    PHOENIX_PORT: String(port),
    PHOENIX_GRPC_PORT: String(grpcPort),
    PHOENIX_WORKING_DIR: path.join(dir, 'work'),
    // Nothing phones home (same settings as tests/common/phoenix.rs).
    PHOENIX_TELEMETRY_ENABLED: 'false',
    PHOENIX_ALLOW_EXTERNAL_RESOURCES: 'false',
    PHOENIX_DISABLE_AGENT_ASSISTANT: 'true',
    PHOENIX_AGENTS_DISABLE_BASH: 'true',
    PHOENIX_AGENTS_DISABLE_WEB_ACCESS: 'true',
    PHOENIX_AGENTS_DISABLE_GITHUB: 'true',
    DO_NOT_TRACK: '1',
    PYTHONUNBUFFERED: '1',
  });
  const proc = spawn(PYTHON, [SERVE, 'serve'], { env, stdio: ['ignore', logFd, logFd] });
  let exited = null;
  const exit = new Promise((resolve) => proc.once('exit', (code, signal) => {
    exited = { code, signal };
    resolve();
  }));
  const base = `http://127.0.0.1:${port}`;
  const log = () => (existsSync(logFile) ? readFileSync(logFile, 'utf8') : '');
  const tail = (n = 40) => log().split('\n').slice(-n).join('\n');

  const phoenix = {
    port,
    grpcPort,
    otlpBase: base,
    tracesEndpoint: `${base}/v1/traces`,
    grpcEndpoint: `http://127.0.0.1:${grpcPort}`,
    log,
    async stop() {
      if (!exited) {
        proc.kill('SIGKILL');
        await Promise.race([exit, sleep(5000)]);
      }
      rmSync(dir, { recursive: true, force: true });
    },
    async getJson(pathAndQuery) {
      const res = await fetchWithin(base + pathAndQuery, { headers: { accept: 'application/json' } });
      const text = await res.text();
      if (res.status !== 200) throw new Error(`GET ${pathAndQuery}: ${res.status} ${text}\n${tail()}`);
      return JSON.parse(text);
    },
    /** POSTs OTLP/HTTP protobuf bytes to /v1/traces; returns the status. */
    async export(body) {
      const res = await fetchWithin(`${base}/v1/traces`, {
        method: 'POST',
        headers: { 'content-type': 'application/x-protobuf' },
        body,
      });
      await res.arrayBuffer();
      return res.status;
    },
    async projectId(name = 'default') {
      const projects = await phoenix.getJson('/v1/projects');
      const project = projects.data.find((p) => p.name === name);
      if (!project) throw new Error(`no project ${name} in ${JSON.stringify(projects)}`);
      return project.id;
    },
    /** Every span of `traceId` (32 hex) in the default project, following next_cursor. */
    async spans(traceId) {
      if (!/^[0-9a-fA-F]{32}$/.test(traceId)) throw new Error(`not a trace id: ${traceId}`);
      const out = [];
      let cursor = null;
      for (let page = 0; page < MAX_PAGES; page++) {
        let q = `/v1/projects/default/spans?trace_id=${traceId.toLowerCase()}&limit=1000`;
        if (cursor) q += `&cursor=${encodeURIComponent(cursor)}`;
        const body = await phoenix.getJson(q);
        out.push(...body.data);
        if (!body.next_cursor) return out;
        cursor = body.next_cursor;
      }
      throw new Error(`more than ${MAX_PAGES} pages of spans for ${traceId}`);
    },
    /** Polls spans(traceId) until at least `atLeast` are there, for at most `ms`. */
    async waitSpans(traceId, atLeast, ms = 15000) {
      const deadline = Date.now() + ms;
      for (;;) {
        const spans = await phoenix.spans(traceId);
        if (spans.length >= atLeast) return spans;
        if (Date.now() > deadline) {
          throw new Error(`Phoenix holds ${spans.length} span(s) of ${traceId} after ${ms} ms, not ${atLeast}: ${JSON.stringify(spans)}\n${tail()}`);
        }
        await sleep(200);
      }
    },
    /** `http://127.0.0.1:PORT/projects/<project id>/traces/<trace id>`. */
    async traceUrl(traceId) {
      return `${base}/projects/${await phoenix.projectId()}/traces/${traceId}`;
    },
    /** Saves a PNG of the trace's page with headless Chromium; returns the page's URL. */
    async screenshot(traceId, out, { width = 1400, height = 900 } = {}) {
      const url = await phoenix.traceUrl(traceId);
      await chromium(dir, [`--screenshot=${out}`, `--window-size=${width},${height}`, url]);
      return url;
    },
    /** The page's DOM after its scripts ran, rendered as screenshot() renders it. */
    async renderedText(url) {
      return chromium(dir, ['--dump-dom', '--window-size=1400,900', url]);
    },
  };

  const deadline = Date.now() + START_MS;
  for (;;) {
    if (exited) throw new Error(`Phoenix exited at start (${JSON.stringify(exited)}):\n${tail()}`);
    try {
      const res = await fetchWithin(`${base}/healthz`, {}, 2000);
      await res.arrayBuffer();
      if (res.status === 200) return phoenix;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      await phoenix.stop();
      throw new Error(`Phoenix did not answer /healthz within ${START_MS} ms:\n${tail()}`);
    }
    await sleep(100);
  }
}

/** Runs headless Chromium (`$CHROMIUM` or /usr/bin/chromium) with `args`; resolves with stdout. */
function chromium(dir, args) {
  const program = process.env.CHROMIUM ?? '/usr/bin/chromium';
  return new Promise((resolve, reject) => {
    const proc = spawn(program, [
      '--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--disable-quic', '--virtual-time-budget=15000', `--user-data-dir=${path.join(dir, 'chromium')}`,
      ...args,
    ], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    proc.stdout.setEncoding('utf8').on('data', (c) => { stdout += c; });
    proc.stderr.setEncoding('utf8').on('data', (c) => { stderr += c; });
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      reject(new Error(`headless Chromium did not finish within ${BROWSER_MS} ms`));
    }, BROWSER_MS);
    proc.once('error', (e) => { clearTimeout(timer); reject(e); });
    proc.once('exit', (code) => {
      clearTimeout(timer);
      if (code === 0) resolve(stdout);
      else reject(new Error(`headless Chromium exited ${code}: ${stderr}`));
    });
  });
}

// ---------------------------------------------------------------------------------------------
// A minimal OTLP protobuf encoder (ExportTraceServiceRequest with string attributes), for tests
// that hand Phoenix spans of their own.

function varint(n) {
  const out = [];
  let v = BigInt(n);
  do {
    let byte = Number(v & 0x7fn);
    v >>= 7n;
    if (v > 0n) byte |= 0x80;
    out.push(byte);
  } while (v > 0n);
  return Buffer.from(out);
}
const tag = (field, wire) => varint((field << 3) | wire);
const bytesField = (field, buf) => Buffer.concat([tag(field, 2), varint(buf.length), buf]);
const stringField = (field, s) => bytesField(field, Buffer.from(s, 'utf8'));
const fixed64Field = (field, n) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(BigInt(n));
  return Buffer.concat([tag(field, 1), b]);
};
const keyValue = (key, value) =>
  Buffer.concat([stringField(1, key), bytesField(2, stringField(1, String(value)))]);

/** OTel span kinds as the protocol numbers them. */
export const SpanKind = { INTERNAL: 1, SERVER: 2, CLIENT: 3, PRODUCER: 4, CONSUMER: 5 };

/**
 * Encodes spans `{traceId (32 hex), spanId (16 hex), parentId?, name, kind?, startNs (bigint),
 * endNs, attributes: {key: string}}` as one ExportTraceServiceRequest under a resource with
 * `service.name` = `service`.
 */
export function encodeSpans(spans, service = 'map-router-tests') {
  const encoded = spans.map((s) => {
    const parts = [
      bytesField(1, Buffer.from(s.traceId, 'hex')),
      bytesField(2, Buffer.from(s.spanId, 'hex')),
    ];
    if (s.parentId) parts.push(bytesField(4, Buffer.from(s.parentId, 'hex')));
    parts.push(stringField(5, s.name), tag(6, 0), varint(s.kind ?? SpanKind.INTERNAL));
    parts.push(fixed64Field(7, s.startNs), fixed64Field(8, s.endNs));
    for (const [k, v] of Object.entries(s.attributes ?? {})) parts.push(bytesField(9, keyValue(k, v)));
    return bytesField(2, Buffer.concat(parts));
  });
  const scope = bytesField(1, stringField(1, 'map-router-tests'));
  const scopeSpans = bytesField(2, Buffer.concat([scope, ...encoded]));
  const resource = bytesField(1, bytesField(1, keyValue('service.name', service)));
  return bytesField(1, Buffer.concat([resource, scopeSpans]));
}

// ---------------------------------------------------------------------------------------------
// --self-test

async function selfTest() {
  const { randomBytes } = await import('node:crypto');
  const check = (cond, what) => {
    if (!cond) throw new Error(what);
    console.log(`ok - ${what}`);
  };
  const started = Date.now();
  const phoenix = await startPhoenix();
  try {
    console.log(`# Phoenix answered after ${Date.now() - started} ms on ${phoenix.otlpBase}`);
    const traceId = randomBytes(16).toString('hex');
    const agentId = randomBytes(8).toString('hex');
    const toolId = randomBytes(8).toString('hex');
    const now = BigInt(Date.now()) * 1_000_000n;
    const status = await phoenix.export(encodeSpans([
      {
        traceId, spanId: agentId, name: 'invoke_agent planner', kind: SpanKind.CLIENT,
        startNs: now, endNs: now + 5_000_000n,
        attributes: { 'gen_ai.operation.name': 'invoke_agent', 'gen_ai.agent.id': 'planner-1' },
      },
      {
        traceId, spanId: toolId, parentId: agentId, name: 'execute_tool search',
        startNs: now + 1_000_000n, endNs: now + 4_000_000n,
        attributes: { 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': 'search' },
      },
    ]));
    check(status === 200, `the export is accepted (${status})`);
    const spans = await phoenix.waitSpans(traceId, 2, 30000);
    check(spans.length === 2, `two spans of trace ${traceId} read back`);
    const agent = spans.find((s) => s.name === 'invoke_agent planner');
    const tool = spans.find((s) => s.name === 'execute_tool search');
    check(agent?.context.span_id === agentId && agent.parent_id === null, 'the agent span is the root');
    check(tool?.parent_id === agentId && tool.context.trace_id === traceId, 'the tool span is its child');
    check(agent.span_kind === 'AGENT' && tool.span_kind === 'TOOL', 'classified AGENT and TOOL');
    check(agent.attributes['gen_ai.agent.id'] === 'planner-1', 'attributes kept');
    const png = path.join(mkdtempSync(path.join(tmpdir(), 'map-router-phoenix-shot-')), 'trace.png');
    const url = await phoenix.screenshot(traceId, png);
    const head = readFileSync(png).subarray(0, 8).toString('latin1');
    check(head === '\x89PNG\r\n\x1a\n' && statSync(png).size > 30_000, `a PNG of ${url}`);
    rmSync(path.dirname(png), { recursive: true, force: true });
    const dom = await phoenix.renderedText(url);
    check(dom.includes('invoke_agent planner') && dom.includes('execute_tool search'), 'the page shows both spans');
  } catch (err) {
    console.log(`FAIL - ${err.message}\n--- Phoenix log (tail) ---\n${phoenix.log().split('\n').slice(-40).join('\n')}`);
    process.exitCode = 1;
  } finally {
    await phoenix.stop();
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url) && process.argv.includes('--self-test')) {
  await selfTest();
}
