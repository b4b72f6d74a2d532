// The system view (issue 46, item 6): the node, the cluster's nodes with their positions, a
// standby's page, the router's gauges from /metrics, and the gateways' agents.
export default function (h) {
  const { assert, tid, until, WAIT_MS } = h;

  h.scenario('system: single node', async (t, browser) => {
    const router = await t.router(h.treeConfig());
    const context = await t.context(browser);
    const page = await context.newPage();
    await page.goto(`${router.uiUrl}#system`);

    await t.step('the system view says this is a single node and shows the gauges of /metrics', async () => {
      await page.locator(`${tid('tab-system')}[aria-selected="true"]`).waitFor({ timeout: WAIT_MS });
      await until(async () => (await page.textContent(tid('node-role'))) === 'single node', 'the node role');
      // Three supervised agents: /metrics and the page agree on the agents and connections.
      const gauge = async (name) => Number(await page.getAttribute(`${tid('gauge')}[data-name="${name}"]`, 'data-value'));
      const scrape = async () => (await (await fetch(router.uiUrl.replace(/\/ui$/, '/metrics'))).text()).split('\n');
      const sum = (lines, name) => lines.filter((l) => l.startsWith(name) && !l.startsWith(`${name}_`)).reduce((n, l) => n + Number(l.split(' ').at(-1)), 0);
      await until(async () => (await gauge('agents')) === 3, 'three agents in the gauges', 15_000);
      const lines = await scrape();
      assert.equal(sum(lines, 'map_agents'), 3);
      // Connections move with the page's own polls: within one scrape of /metrics.
      const shown = await gauge('connections');
      assert.ok(Math.abs(shown - sum(lines, 'map_connections')) <= 1, `connections ${shown} vs /metrics ${sum(lines, 'map_connections')}`);
      assert.ok(await page.locator(tid('gateways-none')).isVisible(), 'no gateway traffic yet');
    });

    await t.step("each gateway's requests, callers and errors, as /metrics counts them", async () => {
      const base = router.uiUrl.replace(/\/ui$/, '');
      assert.equal((await fetch(`${base}/mamp/v1/card`)).status, 200);
      assert.equal((await fetch(`${base}/a2a/agents/nobody/.well-known/agent-card.json`)).status, 404);
      const row = (g) => page.locator(`${tid('gateway')}[data-gateway="${g}"]`);
      await row('a2a').waitFor({ timeout: WAIT_MS });
      await row('mamp').waitFor({ timeout: WAIT_MS });
      assert.equal(await row('a2a').locator(tid('gateway-errors')).textContent(), '1');
      assert.equal(await row('mamp').locator(tid('gateway-errors')).textContent(), '0');
      assert.equal(await row('mamp').locator(tid('gateway-callers')).textContent(), '1');
      await h.docsShot(page, 'system');
    });
  });

  h.scenario('system: cluster', async (t, browser) => {
    const nats = await h.startNats();
    t.cleanup(() => nats.stop());
    const router = await t.router(`[cluster]\nurl = "${nats.url}"\nnode = "node-a"\nrequest_timeout_ms = 1000\nconnect_timeout_ms = 3000\n`);
    const standby = await h.startStandby(nats.url, 'node-b');
    t.cleanup(() => standby.kill());
    const context = await t.context(browser);
    const page = await context.newPage();
    await page.goto(`${router.uiUrl}#system`);

    await t.step('the live node lists both nodes, their roles and positions, and NATS connected', async () => {
      await until(async () => (await page.locator(tid('cluster-node')).count()) === 2, 'two nodes', 4 * WAIT_MS);
      const nodes = await page.$$eval(h.tid('cluster-node'), (rs) => rs.map((r) => [r.dataset.node, r.dataset.role]));
      assert.deepEqual(nodes.sort(), [['node-a', 'writer'], ['node-b', 'standby']]);
      assert.match(await page.textContent(tid('node-role')), /^live/);
      assert.equal(await page.getAttribute(tid('node-nats'), 'data-status'), 'connected');
    });

    await t.step("a standby's page shows the same agents and nodes, and says it is a standby", async () => {
      await standby.serving();
      const peer = await t.peer(router.wsUrl, { participantType: 'agent', name: 'on-a' });
      await peer.call('map/agents/register', { agentId: 'on-a', name: 'on-a' });
      const other = await context.newPage();
      await other.goto(`${standby.url.replace(/^ws/, 'http')}ui#system`);
      await until(async () => /^standby/.test((await other.textContent(tid('node-role')).catch(() => '')) ?? ''), 'the standby role', 4 * WAIT_MS);
      await until(async () => (await other.locator(tid('cluster-node')).count()) === 2, 'two nodes on the standby', 4 * WAIT_MS);
      await other.locator(`${tid('agent-node')}[data-agent-id="on-a"]`).waitFor({ timeout: 4 * WAIT_MS });
      await h.docsShot(other, 'system-standby');
      await other.close();
    });

    await t.step("a standby's page shows the same charts, trace and tasks as the live node's", async () => {
      // Two SDK agents on the live node: five messages, a request answered, a task.
      const a = await h.sdkAgent(t, router.wsUrl, { name: 'sa', role: 'planner' });
      const b = await h.sdkAgent(t, router.wsUrl, { name: 'sb', role: 'worker' });
      b.onMessage((m) => {
        if (m.meta?.expectsResponse) void b.reply(m, { ok: true }).catch(() => {});
      });
      for (let i = 0; i < 4; i++) await a.send({ agent: b.agentId }, { n: i });
      const asked = await a.send({ agent: b.agentId }, { q: 'done?' }, { expectsResponse: true, correlationId: 'standby-q' });
      await a.createTask({ task: { title: 'Seen from the standby', assignee: b.agentId } });
      const sent = 6; // four, the request, the answer
      const peer = await t.peer(router.wsUrl);
      await until(async () => (await peer.history()).filter((e) => e.type === 'message_sent').length === sent, 'the six messages in the log');
      const pages = [];
      for (const url of [router.uiUrl, `${standby.url.replace(/^ws/, 'http')}ui`]) {
        const p = await context.newPage();
        pages.push(p);
        await p.goto(`${url}#charts`);
        await p.locator(`${tid('history-status')}[data-state="ready"]`).waitFor({ state: 'attached', timeout: 4 * WAIT_MS });
      }
      const totals = (p) => p.getAttribute(tid('chart-messages'), 'data-totals').then((t) => JSON.parse(t ?? 'null'));
      for (const p of pages) await until(async () => (await totals(p))?.sent === sent, 'six messages charted', 4 * WAIT_MS);
      assert.deepEqual(await totals(pages[1]), await totals(pages[0]), 'the same totals on both nodes');
      // The trace of the request, read on the standby (relayed to the live node).
      for (const p of pages) {
        await p.goto(`${p.url().split('#')[0]}#traces/message/${asked.messageId}`);
        await p.locator(tid('trace')).waitFor({ timeout: 4 * WAIT_MS });
      }
      const spans = (p) => p.$$eval(h.tid('span'), (rs) => rs.map((r) => [r.dataset.spanId, r.dataset.parentId, r.dataset.name]));
      assert.deepEqual(await spans(pages[1]), await spans(pages[0]));
      assert.equal((await spans(pages[1])).length, 2, 'the request and its answer');
      // The standby relayed its page's trace call: its system view counts that relay session.
      await pages[1].click(tid('tab-system'));
      await until(async () => Number(await pages[1].getAttribute(tid('node-relays'), 'data-value').catch(() => 0)) >= 1, "the standby's relay session", 4 * WAIT_MS);
      for (const p of pages) {
        await p.click(tid('tab-tasks'));
        await p.locator(tid('task-card'), { hasText: 'Seen from the standby' }).waitFor({ timeout: 4 * WAIT_MS });
      }
      for (const p of pages) await p.close();
    });
  });

  h.scenario('system: federation peers', async (t, browser) => {
    // Authentication off: beta takes alpha's link at its word (docs/federation.md).
    const beta = await t.router('[federation]\nsystem_id = "beta"\n');
    const alpha = await t.router(`[federation]\nsystem_id = "alpha"\n[[federation.peer]]\nsystem_id = "beta"\nprincipal = "beta-gw"\nendpoint = "${beta.wsUrl}"\n`);
    const bob = await h.sdkAgent(t, beta.wsUrl, { name: 'bob' });
    const got = [];
    bob.onMessage((m) => got.push(m));
    const alice = await h.sdkAgent(t, alpha.wsUrl, { name: 'alice' });
    const context = await t.context(browser);
    const page = await context.newPage();
    await page.goto(`${alpha.uiUrl}#system`);
    const row = page.locator(`${tid('federation-peer')}[data-peer="beta"]`);

    await t.step('the peer, its link up, and what it routed', async () => {
      await row.waitFor({ timeout: 4 * WAIT_MS });
      await until(async () => (await row.getAttribute('data-link')) === 'up', 'the link up', 4 * WAIT_MS);
      const sent = await alice.send({ system: 'beta', agent: bob.agentId }, { n: 1 });
      assert.deepEqual(sent.queued, [`beta:agent:${bob.agentId}`]);
      await until(async () => got.length === 1, "bob's message");
      assert.equal(got[0].from, `alpha:agent:${alice.agentId}`);
      await until(async () => (await row.locator(tid('federation-routed')).textContent()) === '1', 'one routed', 4 * WAIT_MS);
      assert.equal(await row.locator(tid('federation-waiting')).textContent(), '0');
    });

    await t.step('the peer down: its link and what waits for it', async () => {
      const exited = new Promise((r) => beta.proc.once('exit', r));
      beta.proc.kill('SIGKILL');
      await exited;
      await until(async () => (await row.getAttribute('data-link')) === 'down', 'the link down', 4 * WAIT_MS);
      for (let n = 2; n <= 4; n++) await alice.send({ system: 'beta', agent: bob.agentId }, { n });
      await until(async () => (await row.locator(tid('federation-waiting')).textContent()) === '3', 'three waiting', 4 * WAIT_MS);
      await h.docsShot(page, 'system-federation');
    });
  });
}
