// AIP traffic on the dashboard (issue 46, items 4 and 6): real AIP nodes, Python gRPC servers
// with upstream's stubs (tests/browser/aip_node.py, in tests/aip_py/.venv, which
// scripts/setup.sh installs), registered with the router's AIP gateway as alice. An operator's
// dashboard (a system principal) shows them in the system view with the tools and skills they
// declared, and a node killed shown offline once the router notices its silence; it lists the
// AIP session one node held with another in the conversations view, with its participants and
// turns in order, also after kill -9 and a restart. An ordinary principal (bob) sees no AIP
// conversation and none of alice's private agents, and no more than MAP gives him: the AIP nodes
// are public agents (AIP has no visibility), so he does see them and their session's message
// events, only not its mail conversation (reported with issue 46; docs/dashboard.md says so).
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

const KEYS = 'ops-key-0123456789abcdef0123 ops\nalice-key-0123456789abcdef01 alice\nbob-key-0123456789abcdef0123 bob\n';
const OPS = 'ops-key-0123456789abcdef0123';
const ALICE = 'alice-key-0123456789abcdef01';
const BOB = 'bob-key-0123456789abcdef0123';
/** A silent node goes offline after this long (the sweeper looks every third of it). */
const HEARTBEAT_TIMEOUT_MS = 3000;

const QUESTS = ['Shall we ship on Friday?', 'The tests are green.', 'Then ship it.'];

export default function (h) {
  const { assert, tid, until, WAIT_MS, QUIET_MS } = h;
  const ROOT = path.resolve(h.HERE, '../..');
  const PYTHON = path.join(ROOT, 'tests/aip_py/.venv/bin/python');

  /** The AIP stubs, generated as scripts/aip_py.sh does, into a directory removed at the end. */
  function stubs(t) {
    const dir = mkdtempSync(path.join(tmpdir(), 'map-router-browser-aip-'));
    t.cleanup(() => rmSync(dir, { recursive: true, force: true }));
    const r = spawnSync(PYTHON, ['-m', 'grpc_tools.protoc', '-I', path.join(ROOT, 'src/gateway/aip/proto'), `--python_out=${dir}`, `--grpc_python_out=${dir}`, 'schema.proto'], { timeout: 30_000, encoding: 'utf8' });
    if (r.error || r.status !== 0) throw new Error(`cannot generate the AIP stubs with ${PYTHON} (run scripts/setup.sh): ${r.error?.message ?? r.stderr}`);
    return dir;
  }

  /** One AIP node (tests/browser/aip_node.py), SIGKILLed when the scenario ends. */
  async function aipNode(t, stubDir, gateway, { id, name, kind, skills = '', args = '' }) {
    const proc = spawn(PYTHON, [path.join(h.HERE, 'aip_node.py'), '--stubs', stubDir, '--gateway', gateway, '--key', ALICE, '--kind', kind, '--id', id, '--name', name, '--domain', 'lab', '--skills', skills, '--arguments', args, '--heartbeat', '0.4'], { stdio: ['pipe', 'pipe', 'pipe'] });
    const node = { id, proc, lines: [], waiters: [], stderr: '' };
    let buf = '';
    proc.stdout.setEncoding('utf8');
    proc.stdout.on('data', (chunk) => {
      buf += chunk;
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        node.lines.push(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
      }
      for (const w of node.waiters.splice(0)) w();
    });
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (c) => {
      node.stderr = (node.stderr + c).slice(-2000);
    });
    const exited = new Promise((r) => proc.once('exit', r));
    node.line = () =>
      h.withTimeout(
        (async () => {
          for (;;) {
            if (node.lines.length) return node.lines.shift();
            if (proc.exitCode !== null || proc.signalCode !== null) throw new Error(`AIP node ${id} exited: ${node.stderr}`);
            await new Promise((r) => {
              node.waiters.push(r);
              void exited.then(r);
            });
          }
        })(),
        WAIT_MS,
        `a line from AIP node ${id}`,
      );
    node.ask = async (cmd) => {
      proc.stdin.write(`${JSON.stringify(cmd)}\n`);
      const line = await node.line();
      const [word, ...rest] = line.split(' ');
      if (word === 'error') throw new Error(`AIP node ${id}: ${line}`);
      return JSON.parse(rest.join(' '));
    };
    node.kill = async () => {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      proc.kill('SIGKILL');
      await h.withTimeout(exited, WAIT_MS, `AIP node ${id} exit`);
    };
    t.cleanup(() => node.kill());
    const ready = await node.line();
    assert.equal(ready, `ready ${id}`, `AIP node ${id} registered (${node.stderr})`);
    return node;
  }

  async function signIn(page, url, key, view) {
    await page.goto(`${url}#${view}`);
    await page.locator(tid('auth-form')).waitFor({ timeout: WAIT_MS });
    await page.selectOption(tid('auth-method'), 'api-key');
    await page.fill(tid('auth-credential'), key);
    await page.click(tid('auth-submit'));
    await page.locator(`${tid('connection-status')}[data-status="live"]`).waitFor({ timeout: WAIT_MS });
  }

  /** The AIP nodes of the system view, as drawn: their cells' text and their boxes. */
  function aipRows(page) {
    return page.$$eval(`${tid('aip-nodes')} ${tid('aip-node')}`, (rs) =>
      rs.map((r) => {
        const b = r.getBoundingClientRect();
        return { id: r.dataset.agentId, cells: [...r.querySelectorAll('td')].map((c) => c.textContent), top: b.top, height: b.height };
      }),
    );
  }

  function listed(page) {
    return page.$$eval(`${tid('conversation-list')} ${tid('conversation')}`, (cs) =>
      cs.map((c) => ({
        id: c.dataset.conversationId,
        subject: c.querySelector('[data-testid="conversation-subject"]').textContent,
        kind: c.querySelector('[data-testid="conversation-kind"]').textContent,
        participants: c.querySelector('[data-testid="conversation-participants"]').textContent,
      })),
    );
  }

  function turns(page) {
    return page.$$eval(`${tid('conversation-turns')} ${tid('turn')}`, (ts) =>
      ts.map((t) => {
        const b = t.getBoundingClientRect();
        return { sender: t.querySelector('[data-testid="turn-sender"]').textContent, content: t.querySelector('[data-testid="turn-content"]').textContent, top: b.top, height: b.height };
      }),
    );
  }

  /** The quests of the planner and the echo's answers, alternating, as the session went. */
  const EXPECTED = QUESTS.flatMap((q) => [
    { sender: 'Planner', content: q },
    { sender: 'Echo desk', content: `Echo desk heard: ${q}` },
  ]);

  /** The operator's page lists the AIP session with its participants, then shows its turns in order. */
  async function seesTheSession(page) {
    const row = await until(async () => (await listed(page)).find((c) => c.kind.startsWith('AIP session') && c.participants === 'Planner, Echo desk'), 'the AIP session listed with its participants by name').catch(async (e) => {
      throw new Error(`${e.message}: the list shows ${JSON.stringify(await listed(page))}`);
    });
    assert.equal(row.kind, 'AIP session · multi-agent');
    assert.equal(row.subject, 'Planner ↔ Echo desk');
    await page.click(`${tid('conversation')}[data-conversation-id="${row.id}"]`);
    const shown = await until(async () => {
      const ts = await turns(page);
      return ts.length >= EXPECTED.length ? ts : null;
    }, 'the six turns').catch(async (e) => {
      throw new Error(`${e.message}: ${JSON.stringify(await turns(page))}`);
    });
    assert.deepEqual(shown.map(({ sender, content }) => ({ sender, content })), EXPECTED);
    for (let i = 1; i < shown.length; i++) assert.ok(shown[i].height > 0 && shown[i].top > shown[i - 1].top, `turn ${i + 1} drawn below turn ${i}`);
    const members = await page.textContent(tid('conversation-members'));
    assert.match(members, /Planner \(\w+\)/);
    assert.match(members, /Echo desk \(\w+\)/);
    return row.id;
  }

  h.scenario('aip: nodes, tools and sessions', async (t, browser) => {
    const aipPort = await h.freePort();
    const gateway = `127.0.0.1:${aipPort}`;
    const config = `
[auth]
system_principals = ["ops"]

[auth.api_keys]
file = "api-keys"

[aip]
listen = "${gateway}"
heartbeat_timeout_ms = ${HEARTBEAT_TIMEOUT_MS}
on_silence = "offline"
`;
    let router = await t.router(config, { 'api-keys': KEYS });
    const stubDir = stubs(t);
    const echo = await aipNode(t, stubDir, gateway, { id: 'lab-echo', name: 'Echo desk', kind: 'agent', skills: 'echo:repeats what it hears,summarize:sums up a thread' });
    const calc = await aipNode(t, stubDir, gateway, { id: 'lab-calc', name: 'Calculator', kind: 'tool', args: 'a:int,b:int' });
    const planner = await aipNode(t, stubDir, gateway, { id: 'lab-planner', name: 'Planner', kind: 'agent', skills: 'plan:plans releases' });
    // A private MAP agent of alice's (visibility `scope`, in no scope: its owner's only).
    const secret = await h.sdkAgent(t, router.wsUrl, { name: 'alice-private', role: 'analyst', visibility: 'scope', auth: { method: 'api-key', credential: ALICE } });
    assert.ok(secret.agentId);

    // The planner holds a session with the echo through the gateway, one quest at a time, and
    // calls the calculator.
    const answers = await planner.ask({ session: 'lab-echo', quests: QUESTS });
    assert.deepEqual(answers, QUESTS.map((q) => `Echo desk heard: ${q}`));
    assert.deepEqual(await planner.ask({ tool: 'lab-calc', name: 'add', arguments: { a: 2, b: 3 } }), { isError: false, text: '5' });

    const context = await t.context(browser);
    const page = await context.newPage();
    // name, AIP id, kind, domain, and the skills or arguments, as each node declared them.
    const NODES = {
      'lab-calc': ['Calculator', 'lab-calc', 'tool', 'lab', 'a: int, b: int'],
      'lab-echo': ['Echo desk', 'lab-echo', 'agent', 'lab', 'echo, summarize'],
      'lab-planner': ['Planner', 'lab-planner', 'agent', 'lab', 'plan'],
    };
    const STATE = 4;

    await t.step("the operator's system view lists each AIP node with the tools and skills it declared", async () => {
      await signIn(page, router.uiUrl, OPS, 'system');
      await page.locator(`${tid('tab-system')}[aria-selected="true"]`).waitFor({ timeout: WAIT_MS });
      const rows = await until(async () => {
        const rs = await aipRows(page);
        return rs.length === 3 ? rs : null;
      }, 'three AIP nodes').catch(async (e) => {
        throw new Error(`${e.message}: ${JSON.stringify(await aipRows(page))}`);
      });
      const by = Object.fromEntries(rows.map((r) => [r.id, r]));
      assert.deepEqual(Object.keys(by).sort(), Object.keys(NODES));
      for (const [id, declared] of Object.entries(NODES)) {
        const cells = [...by[id].cells];
        const [state] = cells.splice(STATE, 1);
        assert.deepEqual(cells, declared, `${id} as it declared itself`);
        assert.equal(state, 'registered', `${id} is online`);
      }
      // On the screen: the table scrolled into view, each row drawn, one below the other.
      await page.locator(tid('aip-nodes')).scrollIntoViewIfNeeded();
      const drawn = await aipRows(page);
      for (const r of drawn) assert.ok(r.height > 0 && r.top >= 0 && r.top + r.height <= 900, `${r.id} on screen (${r.top}, ${r.height})`);
      for (let i = 1; i < drawn.length; i++) assert.ok(drawn[i].top >= drawn[i - 1].top + drawn[i - 1].height - 1, 'rows one below the other');
      assert.ok(!drawn.some((r) => r.id === secret.agentId), 'a MAP agent is not an AIP node');
      // The gateway's own row: three agents, and the session and tool call counted.
      const gw = page.locator(`${tid('gateway')}[data-gateway="aip"]`);
      await gw.waitFor({ timeout: WAIT_MS });
      // Its gRPC calls are not HTTP requests of a gateway route (map_gateway_requests_total):
      // not shown as zero requests, but as not counted there; refused from map_aip_refused_total.
      assert.deepEqual(await gw.locator('td').allTextContents(), ['aip', '3', '–', '–', '0', '–']);
      await until(async () => /sessions open \d+ · tool calls 1\b/.test(await page.textContent(`${tid('system')} h4`)), 'the tool call counted');
    });

    await t.step('a killed node is shown offline once the router notices its silence', async () => {
      const killedAt = Date.now();
      await calc.kill();
      const state = async () => (await aipRows(page)).find((r) => r.id === 'lab-calc')?.cells[STATE];
      await until(async () => /^offline since \d\d:\d\d:\d\d/.test((await state()) ?? ''), 'the calculator offline', HEARTBEAT_TIMEOUT_MS + 2 * WAIT_MS).catch(async (e) => {
        throw new Error(`${e.message}: shown ${JSON.stringify(await aipRows(page))}`);
      });
      const noticed = Date.now() - killedAt;
      assert.ok(noticed >= HEARTBEAT_TIMEOUT_MS - 500, `not before its heartbeat timeout (${noticed} ms)`);
      // The other two stay online.
      for (const r of await aipRows(page)) if (r.id !== 'lab-calc') assert.equal(r.cells[STATE], 'registered', `${r.id} still online`);
      assert.ok(echo.proc.exitCode === null);
      // The picture for the docs: the AIP nodes and tools, one of them offline.
      await page.locator(tid('aip-nodes')).scrollIntoViewIfNeeded();
      await h.docsShot(page, 'aip');
    });

    let convId;
    await t.step("the operator's conversations view lists the AIP session with its participants and turns in order", async () => {
      await page.click(tid('tab-conversations'));
      convId = await seesTheSession(page);
      await page.locator(`${tid('conversations-status')}[data-status="loaded"]`).waitFor({ timeout: WAIT_MS });
      await h.shot(page, 'aip-conversation');
    });

    await t.step('an ordinary principal sees no AIP conversation, none of the private agents, and no more than MAP shows it', async () => {
      const other = await t.context(browser);
      const bobPage = await other.newPage();
      await signIn(bobPage, router.uiUrl, BOB, 'conversations');
      await bobPage.locator(`${tid('conversations-status')}[data-status="loaded"]`).waitFor({ timeout: WAIT_MS });
      await bobPage.locator(tid('conversations-empty')).waitFor({ timeout: WAIT_MS });
      await h.sleep(QUIET_MS);
      assert.equal(await bobPage.locator(tid('conversation')).count(), 0);
      // What bob may see over MAP: the AIP nodes, public agents (AIP has no visibility; every
      // principal's GetNodes lists them), never alice's private agent.
      const bob = await t.peer(router.wsUrl, { auth: { method: 'api-key', credential: BOB } });
      const mayList = (await bob.call('map/agents/list')).agents.map((a) => a.id).sort();
      assert.deepEqual(mayList, Object.keys(NODES));
      assert.deepEqual((await h.treeNodes(bobPage)).map((n) => n.id).sort(), mayList, "bob's tree: the agents MAP lists to him");
      await bobPage.click(tid('tab-events'));
      await h.sleep(QUIET_MS);
      const text = await bobPage.textContent('body');
      for (const secretText of [convId, 'alice-private', secret.agentId]) assert.ok(!text.includes(secretText), `bob's page does not show "${secretText}"`);
      // The event stream: only events MAP replays to bob. The session's messages are among them
      // (message events between public agents; only its mail conversation is the participants').
      const mayRead = new Set((await bob.history()).map((e) => e.id));
      const shown = await h.rows(bobPage);
      assert.ok(shown.length > 0);
      assert.deepEqual(shown.filter((r) => !mayRead.has(r.id)), [], 'no event MAP does not give bob');
      assert.ok(!shown.some((r) => r.type.startsWith('mail.')), 'no mail event');
      await bobPage.click(tid('tab-system'));
      await until(async () => (await aipRows(bobPage)).length === 3, "the public AIP nodes in bob's system view");
      assert.deepEqual((await aipRows(bobPage)).map((r) => r.id).sort(), mayList);
      assert.ok(!(await bobPage.textContent(tid('system'))).includes('alice-private'));
      await other.close();
    });

    await t.step('after kill -9 and a restart, the AIP session and its turns are read back from the log', async () => {
      router = await t.restart(router);
      await signIn(page, router.uiUrl, OPS, 'conversations');
      assert.equal(await seesTheSession(page), convId);
    });
  });
}
