#!/usr/bin/env node
// Keeps the README's quick start true: runs examples/quickstart/{agent,dashboard,orchestrator}.mjs
// against the built router and checks what they print; then kills the router under agent.mjs
// (SIGKILL) and starts it again on the same port and data directory: the agent comes back as
// the same agent (one `echo`, the same id) and answers again.
//
//   node tests/interop/quickstart.mjs [--bin <path-to-map-router>]
//
// The examples resolve the SDK from examples/quickstart/node_modules; this script links that to
// tests/interop/node_modules (same packages, same versions) when it is absent.
import { execFile, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { existsSync, symlinkSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { assert, killAllRouters, killRouter, sleep, startRouter, stopRouter, withTimeout } from './lib.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const EXAMPLES = path.resolve(HERE, '../../examples/quickstart');
const argv = process.argv.slice(2);
const binArg = argv.indexOf('--bin') >= 0 ? argv[argv.indexOf('--bin') + 1] : undefined;
const BIN = path.resolve(binArg ?? path.join(HERE, '../../target/debug/map-router'));

/** Runs `node <script> ...args` in examples/quickstart; resolves with its exit code and output. */
function run(script, args, url) {
  const child = spawn(process.execPath, [script, ...args], {
    cwd: EXAMPLES,
    env: { ...process.env, MAP_ROUTER_URL: url },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (out += d));
  const done = new Promise((resolve) => child.on('exit', (code) => resolve({ code, out: () => out })));
  return { child, done, out: () => out };
}

async function main() {
  const link = path.join(EXAMPLES, 'node_modules');
  if (!existsSync(link)) symlinkSync(path.relative(EXAMPLES, path.join(HERE, 'node_modules')), link, 'dir');
  const router = await startRouter(BIN);
  const started = [];
  try {
    const agent = run('agent.mjs', ['--seconds', '6'], router.url);
    started.push(agent.child);
    await withTimeout(
      (async () => {
        while (!/registered as /.test(agent.out())) await sleep(20);
      })(),
      5000,
      'agent.mjs registering',
    );
    const dashboard = run('dashboard.mjs', ['--seconds', '4'], router.url);
    started.push(dashboard.child);
    await withTimeout(
      (async () => {
        while (!/agents:/.test(dashboard.out())) await sleep(20);
      })(),
      5000,
      'dashboard.mjs listing agents',
    );
    const orchestrator = run('orchestrator.mjs', [], router.url);
    started.push(orchestrator.child);
    const o = await withTimeout(orchestrator.done, 10000, 'orchestrator.mjs');
    assert.equal(o.code, 0, `orchestrator.mjs exited ${o.code}: ${o.out()}`);
    assert.match(o.out(), /spawned researcher=\S+, writer=\S+ into scope/);
    assert.match(o.out(), /scope message delivered to \[/);
    assert.match(o.out(), /echo replied: \{"echo":\{"question":"ping\?"\}\}/);
    assert.match(o.out(), /researcher is stopping/);
    const a = await withTimeout(agent.done, 10000, 'agent.mjs');
    assert.equal(a.code, 0, `agent.mjs exited ${a.code}: ${a.out()}`);
    assert.match(a.out(), /from \S+: \{"question":"ping\?"\}/);
    const d = await withTimeout(dashboard.done, 10000, 'dashboard.mjs');
    assert.equal(d.code, 0, `dashboard.mjs exited ${d.code}: ${d.out()}`);
    for (const type of ['agent_registered', 'scope_created', 'message_sent', 'message_delivered', 'agent_state_changed']) {
      assert.ok(d.out().includes(` ${type} `), `dashboard.mjs printed no ${type}: ${d.out()}`);
    }
  } finally {
    for (const c of started) c.kill('SIGKILL');
    await stopRouter(router);
  }
  await agentComesBack();
  console.log('quickstart examples: ok');
}

/** `map-router <args>` against `url`: its exit code and stdout. */
function cli(args, url) {
  return new Promise((resolve) => {
    execFile(BIN, args, { env: { ...process.env, MAP_ROUTER_URL: url }, timeout: 10000 }, (err, stdout, stderr) =>
      resolve({ code: err ? err.code ?? 1 : 0, stdout, stderr }),
    );
  });
}

async function agentComesBack() {
  const data = mkdtempSync(path.join(tmpdir(), 'map-router-quickstart-'));
  let router = await startRouter(BIN, { dataDir: path.join(data, 'd') });
  const { url } = router;
  const agent = run('agent.mjs', [], url);
  try {
    await withTimeout(
      (async () => {
        while (!/registered as /.test(agent.out())) await sleep(20);
      })(),
      5000,
      'agent.mjs registering',
    );
    const id = /registered as (\S+)/.exec(agent.out())[1];
    await killRouter(router, 'SIGKILL');
    router = await startRouter(BIN, { dataDir: path.join(data, 'd'), listen: new URL(url).host });
    await withTimeout(
      (async () => {
        while (!/back as /.test(agent.out())) await sleep(20);
      })(),
      15000,
      'agent.mjs coming back after the router restarted',
    );
    assert.match(agent.out(), new RegExp(`back as ${id}`), agent.out());
    const listed = await cli(['agents', '--json'], url);
    assert.equal(listed.code, 0, listed.stderr);
    const echoes = JSON.parse(listed.stdout).filter((a) => a.name === 'echo');
    assert.deepEqual(echoes.map((a) => a.id), [id], `one echo, the same: ${listed.stdout}`);
    const asked = await cli(['request', '--to', 'echo', '--payload', '"after restart"', '--timeout-ms', '5000'], url);
    assert.equal(asked.code, 0, asked.stderr);
    assert.equal(asked.stdout.trim(), '{"echo":"after restart"}');
  } finally {
    agent.child.kill('SIGKILL');
    await stopRouter(router);
    rmSync(data, { recursive: true, force: true });
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(`quickstart examples: FAIL: ${err.message}`);
    killAllRouters();
    process.exit(1);
  },
);
