// The agent graph (issue 46, item 3): three SDK agents, A → B five times and B → C three
// times: the edges carry the counts of the messages sent, the nodes sit in their scopes' boxes,
// a click on an edge narrows the flow (and the events) to that pair, and time travel counts
// only up to the moment shown.
export default function (h) {
  const { assert, tid, until, WAIT_MS } = h;

  h.scenario('graph', async (t, browser) => {
    const router = await t.router('');
    const a = await h.sdkAgent(t, router.wsUrl, { name: 'A', role: 'planner' });
    const b = await h.sdkAgent(t, router.wsUrl, { name: 'B', role: 'worker' });
    const c = await h.sdkAgent(t, router.wsUrl, { name: 'C', role: 'reviewer' });
    await a.createScope({ scopeId: 'team-a', name: 'team-a' });
    await a.joinScope('team-a');
    await b.joinScope('team-a');
    await c.createScope({ scopeId: 'team-b', name: 'team-b' });
    await c.joinScope('team-b');
    const peer = await t.peer(router.wsUrl);

    const context = await t.context(browser);
    const page = await context.newPage();
    await page.goto(`${router.uiUrl}#graph`);
    await page.locator(`${tid('connection-status')}[data-status="live"]`).waitFor({ timeout: WAIT_MS });

    for (let i = 1; i <= 5; i++) assert.deepEqual((await a.send({ agent: b.agentId }, { step: i, ask: 'plan' })).delivered, [b.agentId]);
    for (let i = 1; i <= 3; i++) assert.deepEqual((await b.send({ agent: c.agentId }, { step: i, ask: 'review' })).delivered, [c.agentId]);
    const log = await peer.history();
    const delivered = (from, to) => log.filter((e) => e.type === 'message_delivered' && e.data.from === from && e.data.deliveredTo.includes(to)).length;
    assert.equal(delivered(a.agentId, b.agentId), 5);
    assert.equal(delivered(b.agentId, c.agentId), 3);

    const edges = () => page.$$eval(tid('graph-edge'), (es) => es.map((e) => ({ from: e.dataset.from, to: e.dataset.to, count: Number(e.dataset.count), fromName: e.dataset.fromName, toName: e.dataset.toName })));

    await t.step('the edges carry the counts of the messages sent', async () => {
      const es = await until(async () => {
        const x = await edges();
        return x.length === 2 && x.reduce((n, e) => n + e.count, 0) === 8 ? x : null;
      }, 'two edges counting eight messages');
      const sorted = es.sort((x, y) => y.count - x.count);
      assert.deepEqual(sorted, [
        { from: a.agentId, to: b.agentId, count: delivered(a.agentId, b.agentId), fromName: 'A', toName: 'B' },
        { from: b.agentId, to: c.agentId, count: delivered(b.agentId, c.agentId), fromName: 'B', toName: 'C' },
      ]);
      // The labels show the counts; the nodes show names.
      const labels = await page.$$eval(tid('graph-edge-count'), (ls) => ls.map((l) => l.textContent).sort());
      assert.deepEqual(labels, ['3', '5']);
      const nodes = await page.$$eval(tid('graph-node'), (ns) => ns.map((n) => [n.dataset.name, n.textContent.trim(), Number(n.dataset.count)]).sort());
      assert.deepEqual(nodes.map(([name, text, n]) => [name, text.endsWith(name), n]), [['A', true, 5], ['B', true, 8], ['C', true, 3]]);
    });

    await t.step('the nodes are grouped by scope', async () => {
      const boxOf = async (sel) => page.locator(sel).boundingBox();
      const inside = (inner, outer) => inner.x >= outer.x && inner.y >= outer.y && inner.x + inner.width <= outer.x + outer.width && inner.y + inner.height <= outer.y + outer.height;
      const teamA = await boxOf(`${tid('graph-scope')}[data-scope="team-a"] rect`);
      const teamB = await boxOf(`${tid('graph-scope')}[data-scope="team-b"] rect`);
      const node = (id) => boxOf(`${tid('graph-node')}[data-node-id="${id}"] rect`);
      assert.ok(inside(await node(a.agentId), teamA), 'A in team-a');
      assert.ok(inside(await node(b.agentId), teamA), 'B in team-a');
      assert.ok(inside(await node(c.agentId), teamB), 'C in team-b');
      assert.ok(!inside(await node(c.agentId), teamA), 'C not in team-a');
      assert.match(await page.locator(`${tid('graph-scope')}[data-scope="team-a"]`).textContent(), /team-a \(2\)/);
      await h.docsShot(page, 'graph');
    });

    await t.step('a click on an edge narrows the flow and the events to that pair', async () => {
      await page.locator(`${tid('graph-edge')}[data-from="${a.agentId}"][data-to="${b.agentId}"]`).click();
      await page.locator(`${tid('tab-flow')}[aria-selected="true"]`).waitFor({ timeout: WAIT_MS });
      assert.equal(await page.locator(tid('filter-agent')).inputValue(), a.agentId, 'the events are filtered by the sender');
      await until(async () => (await page.locator(tid('flow-message')).count()) === 5, 'the five messages of A → B');
      const labels = await page.$$eval(tid('flow-label'), (ls) => ls.map((l) => l.textContent.split(':')[0]));
      assert.deepEqual(labels, Array(5).fill('A → B'));
      assert.match(await page.locator(tid('flow-pair')).textContent(), /only A → B/);
      // The events view shows A's events only.
      await page.click(tid('tab-events'));
      const rows = await until(async () => {
        const rs = await h.rows(page);
        return rs.length > 0 ? rs : null;
      }, 'event rows');
      assert.ok(rows.every((r) => !r.text.includes('C →') && !r.text.includes('→ C')), 'no B → C message among the events');
      await page.click(tid('tab-flow'));
      await page.click(tid('flow-pair-clear'));
      await until(async () => (await page.locator(tid('flow-message')).count()) === 8, 'every message after the pair is cleared');
      assert.equal(await page.locator(tid('filter-agent')).inputValue(), '');
    });

    await t.step('in the past, the graph counts only up to the moment shown', async () => {
      await page.click(tid('tab-graph'));
      await page.locator(`${tid('history-status')}[data-state="ready"]`).waitFor({ state: 'attached', timeout: WAIT_MS });
      // The third A → B delivery: the graph then had one edge, counting 3.
      const third = log.filter((e) => e.type === 'message_delivered' && e.data.from === a.agentId)[2];
      await page.locator(tid('scrubber')).fill(String(log.findIndex((e) => e.id === third.id)));
      await page.locator(`${tid('scrubber-label')}[data-event-id="${third.id}"]`).waitFor({ timeout: WAIT_MS });
      await until(async () => JSON.stringify((await edges()).map((e) => [e.fromName, e.toName, e.count])) === '[["A","B",3]]', 'one edge counting 3 in the past');
      await page.click(tid('back-to-live'));
      await until(async () => (await edges()).length === 2, 'both edges again, live');
    });
  });
}
