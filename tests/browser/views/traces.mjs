// The trace waterfall (issue 46, item 2): three SDK agents, A asks B, B asks C, C answers B,
// B answers A; the page shows the whole trace from A's message with its hops in order, nested,
// with timings, as `map/traces/get` gives it; a failed hop in red; after kill -9 and a restart
// the same trace is read back from the log.
export default function (h) {
  const { assert, tid, until, WAIT_MS } = h;

  /** A (requester), B (asks C, then answers A), C (answers): three SDK agents. */
  async function threeAgents(t, url) {
    const a = await h.sdkAgent(t, url, { name: 'A', role: 'planner' });
    // B is instrumented: its request to C continues the router's span of the delivery that
    // reached it (the frame's _meta.traceparent), as docs/traces.md asks of an agent.
    const { agent: b, frames } = await h.sdkAgentWithFrames(t, url, { name: 'B', role: 'researcher' });
    const c = await h.sdkAgent(t, url, { name: 'C', role: 'analyst' });
    const answered = [];
    // NB: an SDK onMessage handler must not await its own send or reply: the SDK reads the
    // socket in that same turn, so the answer to the send would never be read.
    const quietly = (p) => void p.catch(() => {});
    c.onMessage((m) => {
      if (m.meta?.expectsResponse) quietly(c.reply(m, { answer: 42 }));
    });
    const waiting = new Map();
    b.onMessage((m) => {
      if (m.meta?.isResult) {
        const original = waiting.get(m.meta.correlationId);
        waiting.delete(m.meta.correlationId);
        if (original) quietly(b.reply(original, { summary: 'C says 42' }));
      } else if (m.meta?.expectsResponse) {
        const cid = `b-asks-c-${m.id}`;
        waiting.set(cid, m);
        const traceparent = frames.get(m.id);
        quietly(b.send({ agent: c.agentId }, { question: 'what is it?' }, { expectsResponse: true, correlationId: cid, ...(traceparent ? { traceparent } : {}) }));
      }
    });
    a.onMessage((m) => {
      if (m.meta?.isResult) answered.push(m);
    });
    return { a, b, c, answered };
  }

  h.scenario('traces', async (t, browser) => {
    // Export on (to a collector that is not there: the spans are dropped and counted), so the
    // router hands each delivery's span to its agent; the waterfall itself is read from the log.
    const port = await h.freePort();
    let router = await t.router(`[limits]\nexempt_loopback = true\n\n[telemetry]\nendpoint = "http://127.0.0.1:${port}"\n`);
    const { a, b, c, answered } = await threeAgents(t, router.wsUrl);
    const sent = await a.send({ agent: b.agentId }, { task: 'find it' }, { expectsResponse: true, correlationId: 'a-asks-b' });
    const messageId = sent.messageId;
    assert.ok(messageId, `the send answers a messageId: ${JSON.stringify(sent)}`);
    await until(() => answered.length === 1, "B's answer back at A", WAIT_MS);
    const peer = await t.peer(router.wsUrl);
    const expected = await peer.call('map/traces/get', { messageId });

    const context = await t.context(browser);
    let page = await context.newPage();
    await page.goto(router.uiUrl);

    const spansShown = (p) =>
      p.$$eval(h.tid('span'), (rows) => rows.map((r) => ({ id: r.dataset.spanId, parent: r.dataset.parentId, name: r.dataset.name, depth: Number(r.dataset.depth), start: Number(r.dataset.startMs), duration: Number(r.dataset.durationMs), status: r.dataset.status, text: r.textContent })));

    await t.step("from A's message row, the whole trace: hops in order, nested, with timings", async () => {
      const row = page.locator(`${tid('event-row')}[data-type="message_sent"]`, { hasText: 'find it' });
      await row.waitFor({ timeout: WAIT_MS });
      await row.locator(tid('trace-here')).click();
      await page.locator(`${tid('tab-traces')}[aria-selected="true"]`).waitFor({ timeout: WAIT_MS });
      await page.locator(tid('trace')).waitFor({ timeout: WAIT_MS });
      const shown = await spansShown(page);
      // The page shows exactly the spans the router gives this viewer, each under its parent.
      assert.deepEqual(shown.map((s) => s.id).sort(), expected.spans.map((s) => s.spanId).sort());
      const names = shown.map((s) => s.name).join(', ');
      const ab = shown.find((s) => s.name === 'invoke_agent B' && !shown.some((p) => p.id === s.parent));
      const bc = shown.find((s) => s.name === 'invoke_agent C');
      assert.ok(ab && bc, `the two requests' hops: ${names}`);
      // B's request to C is nested under A's hop to B; C's answer (to B) under B's hop to C;
      // B's answer (to A) under A's hop to B.
      assert.equal(bc.parent, ab.id, 'B→C under A→B');
      assert.ok(bc.depth > ab.depth);
      const replies = shown.filter((s) => s !== ab && s !== bc);
      assert.deepEqual(replies.map((r) => r.name).sort(), ['invoke_agent A', 'invoke_agent B'], `two answers: ${names}`);
      assert.equal(replies.find((r) => r.name === 'invoke_agent A').parent, ab.id, "B's answer under A's request");
      assert.equal(replies.find((r) => r.name === 'invoke_agent B').parent, bc.id, "C's answer under B's request");
      // In order: each child starts no earlier than its parent; rows are drawn parents first.
      for (const s of shown) {
        const parent = shown.find((p) => p.id === s.parent);
        if (parent) {
          assert.ok(s.start >= parent.start, `${s.name} starts after ${parent.name}`);
          assert.ok(shown.indexOf(s) > shown.indexOf(parent), `${s.name} drawn after ${parent.name}`);
        }
        assert.ok(s.duration >= 0 && /ms|s/.test(s.text), `${s.name} shows its timing`);
      }
      // A request's hop lasts until its answer: A→B covers B→C.
      assert.ok(ab.start + ab.duration >= bc.start + bc.duration - 0.001, 'A→B waits for its answer');
      await page.locator(`${tid('span')}[data-span-id="${bc.id}"]`).click();
      assert.match(await page.textContent(tid('span-detail')), /gen_ai\.agent\.name/);
      await h.docsShot(page, 'traces');
    });

    await t.step('a failed hop is drawn as an error with its reason', async () => {
      const r = await a.send({ agent: 'nobody-here' }, { task: 'lost' }).catch((e) => ({ error: e }));
      const failed = r.messageId ?? null;
      if (!failed) {
        // The router refused the send at once (unknown recipient): nothing to trace; say so.
        assert.ok(r.error, 'an unknown recipient is refused or failed');
        return;
      }
      await page.click(tid('trace-back'));
      await page.locator(`${tid('trace-pick')}[data-message-id="${failed}"]`).click();
      await until(async () => (await page.locator(`${tid('span')}[data-status="error"]`).count()) === 1, 'the failed hop');
    });

    await t.step('after kill -9 and a restart, the same trace is read back from the log', async () => {
      await page.close();
      router = await t.restart(router);
      page = await context.newPage();
      // A trace has its own link: #traces/message/<id>.
      await page.goto(`${router.uiUrl}#traces/message/${messageId}`);
      await page.locator(`${tid('connection-status')}[data-status="live"]`).waitFor({ timeout: 2 * WAIT_MS });
      await page.locator(tid('trace')).waitFor({ timeout: 2 * WAIT_MS });
      const again = await spansShown(page);
      assert.deepEqual(again.map((s) => [s.id, s.parent, s.name]).sort(), expected.spans.map((s) => [s.spanId, s.parentSpanId ?? '', s.name]).sort());
    });
  });
}
