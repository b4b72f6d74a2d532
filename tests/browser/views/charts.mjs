// The charts view (issue 46, item 1): rates, connections, reply latency and usage from the log,
// and the /metrics gauges, against a real router with SDK agents making real traffic.
import path from 'node:path';
import { pathToFileURL } from 'node:url';

/** Reads what a chart says it draws (charts.js, the top comment). */
function chart(page, tid, name) {
  return page.locator(tid(`chart-${name}`)).evaluate((n) => {
    const d = n.dataset;
    const json = (v, fallback) => (v ? JSON.parse(v) : fallback);
    const canvas = n.querySelector('canvas');
    const box = canvas?.getBoundingClientRect();
    return {
      labels: json(d.labels, []),
      last: json(d.last, {}),
      lastX: d.lastX ? Number(d.lastX) : null,
      lastY: d.lastY ? Number(d.lastY) : null,
      start: Number(d.start),
      end: Number(d.end),
      totals: json(d.totals, null),
      metrics: d.metrics ?? null,
      note: n.querySelector('.chart-note')?.hidden ? '' : (n.querySelector('.chart-note')?.textContent ?? ''),
      canvas: box ? { width: box.width, height: box.height, left: box.left, right: box.right } : null,
    };
  });
}

/** The sum over label sets of each metric of a Prometheus text exposition. */
function scrapeSums(text) {
  const sums = {};
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (m && !line.startsWith('#')) sums[m[1]] = (sums[m[1]] ?? 0) + Number(m[3]);
  }
  return sums;
}

export default function (h) {
  const { assert, until, tid, WAIT_MS } = h;

  h.scenario('charts', async (t, browser) => {
    let router = await t.router('[router]\nresume_window_ms = 1000\n');
    const metricsUrl = () => router.uiUrl.replace(/\/ui$/, '/metrics');
    const asker = await h.sdkAgent(t, router.wsUrl, { name: 'asker', role: 'worker' });
    const answerer = await h.sdkAgent(t, router.wsUrl, { name: 'answerer', role: 'worker' });
    const helper = await h.sdkAgent(t, router.wsUrl, { name: 'helper', role: 'worker' });
    /** How long the answerer takes to reply, ms: the latency the chart must show at least. */
    const DELAY = 40;
    // NB: not awaited in the handler: the SDK reads its socket in the handler's turn, so a
    // handler awaiting its own send never sees the answer (found while writing this test).
    answerer.onMessage((m) => {
      if (m.meta?.expectsResponse) setTimeout(() => void answerer.reply(m, { ok: true }), DELAY);
    });
    const replies = [];
    asker.onMessage((m) => {
      if (m.meta?.isResult) replies.push(m);
    });
    const N = 6;
    // Half with a correlationId of their own; the SDK answers the others with the message id.
    for (let i = 0; i < N; i++) {
      await asker.send({ agent: answerer.agentId }, { q: i }, i % 2 === 0 ? { expectsResponse: true, correlationId: `q-${i}` } : { expectsResponse: true });
    }
    await until(() => replies.length === N, `${N} replies`);
    await helper.send({ agent: asker.agentId }, { note: 'fyi' });
    await answerer.updateMetadata({ usage: { inputTokens: 1000, outputTokens: 200, costUsd: 0.05 } });
    await answerer.updateMetadata({ usage: { inputTokens: 1500, outputTokens: 300, costUsd: 0.075 } });
    await helper.updateMetadata({ usage: { inputTokens: 40, outputTokens: 2, costUsd: 0.001 } });
    let sent = 2 * N + 1;

    const peer = await t.peer(router.wsUrl);
    const firstPhase = (await peer.history()).filter((e) => e.type === 'message_sent');
    assert.equal(firstPhase.length, sent, 'the log has every message sent');
    // The next messages are in later seconds than the first phase (time travel goes back there).
    await h.sleep(1100 - (Date.now() % 1000) + 50);

    const context = await t.context(browser);
    const page = await context.newPage();
    await page.goto(`${router.uiUrl}#charts`);
    await page.locator(`${tid('history-status')}[data-state="ready"]`).waitFor({ state: 'attached', timeout: WAIT_MS });

    await t.step('the messages chart counts every message sent', async () => {
      const c = await until(async () => {
        const x = await chart(page, tid, 'messages');
        return x.totals?.sent === sent ? x : null;
      }, `the messages chart to total ${sent} sent`);
      assert.deepEqual(c.labels, ['sent', 'delivered', 'failed']);
      assert.equal(c.totals.delivered, sent, 'each message reached its one recipient');
      assert.equal(c.totals.failed, 0);
      // The window ends now (live) and its last point is this second or the one before.
      assert.ok(Math.abs(c.end - Date.now()) < 3000, `live window ends now (${c.end})`);
      assert.ok(Date.now() / 1000 - c.lastX < 3, `last point is recent (${c.lastX})`);
      // Drawn, inside the middle panel.
      const panel = await page.locator(tid('view-charts')).boundingBox();
      assert.ok(c.canvas && c.canvas.width > 300 && c.canvas.height > 50, `canvas size ${JSON.stringify(c.canvas)}`);
      assert.ok(c.canvas.left >= panel.x - 1 && c.canvas.right <= panel.x + panel.width + 1, 'the chart fits its panel');
    });

    await t.step('the charts resize with the panel', async () => {
      const wide = (await chart(page, tid, 'messages')).canvas.width;
      await page.setViewportSize({ width: 1100, height: 900 });
      const narrow = await until(async () => {
        const c = await chart(page, tid, 'messages');
        return c.canvas.width < wide - 50 ? c.canvas : null;
      }, 'a narrower chart');
      const panel = await page.locator(tid('view-charts')).boundingBox();
      assert.ok(narrow.right <= panel.x + panel.width + 1, 'still inside its panel');
      await page.setViewportSize({ width: 1440, height: 900 });
      await until(async () => Math.abs((await chart(page, tid, 'messages')).canvas.width - wide) < 2, 'the width back');
    });

    await t.step('live messages show within the throttle', async () => {
      // The plot is given new data, not drawn anew: its canvas stays the same element.
      await page.locator(`${tid('chart-messages')} canvas`).evaluate((c) => { c.dataset.mark = 'kept'; });
      for (let i = 0; i < 4; i++) await helper.send({ agent: answerer.agentId }, { live: i });
      sent += 4;
      const at = Date.now();
      await until(async () => (await chart(page, tid, 'messages')).totals?.sent === sent, `the chart to count ${sent}`, 3000);
      assert.ok(Date.now() - at < 3000);
      await h.sleep(1500); // a redraw or two more
      assert.equal(await page.locator(`${tid('chart-messages')} canvas[data-mark="kept"]`).count(), 1, 'the same uPlot instance');
    });

    await t.step('per agent: the busiest senders, and the agent filter narrows to one', async () => {
      const all = await until(async () => {
        const x = await chart(page, tid, 'agents');
        return x.totals?.helper === 5 ? x : null;
      }, 'per-agent totals');
      assert.deepEqual(all.totals, { asker: N, answerer: N, helper: 5 });
      await page.selectOption(tid('filter-agent'), asker.agentId);
      const one = await until(async () => {
        const x = await chart(page, tid, 'agents');
        return x.labels[0] === 'asker sent' ? x : null;
      }, 'the asker alone');
      assert.deepEqual(one.labels, ['asker sent', 'asker delivered', 'asker failed']);
      assert.deepEqual(one.totals, { 'asker sent': N, 'asker delivered': N + 1, 'asker failed': 0 });
      // The totals chart stays the whole router's.
      assert.equal((await chart(page, tid, 'messages')).totals.sent, sent);
      await page.selectOption(tid('filter-agent'), '');
    });

    await t.step('reply latency shows the agent that replies', async () => {
      const c = await until(async () => {
        const x = await chart(page, tid, 'latency');
        return x.labels.includes('answerer') ? x : null;
      }, 'the answerer in the latency chart');
      assert.deepEqual(c.labels, ['answerer'], 'only the answering agent (the asker replied to nothing)');
      assert.ok(c.last.answerer >= DELAY - 2 && c.last.answerer < 5000, `latency ${c.last.answerer} ms ≥ ${DELAY} ms`);
      assert.match(c.note, new RegExp(`answerer: ${N} replies`));
    });

    await t.step('tokens and cost per agent match the reported usage', async () => {
      const tokens = await chart(page, tid, 'tokens');
      assert.deepEqual(tokens.labels, ['answerer', 'helper']);
      assert.deepEqual(tokens.last, { answerer: 1800, helper: 42 });
      const cost = await chart(page, tid, 'cost');
      assert.deepEqual(cost.labels, ['answerer', 'helper']);
      assert.ok(Math.abs(cost.last.answerer - 0.075) < 1e-9 && Math.abs(cost.last.helper - 0.001) < 1e-9, JSON.stringify(cost.last));
    });

    await t.step('a /metrics gauge: the chart matches /metrics within one scrape', async () => {
      const connections = async () => scrapeSums(await (await fetch(metricsUrl())).text()).map_connections;
      const before = await connections();
      await until(async () => (await chart(page, tid, 'conn-now')).last.connections === before, `connections ${before} on the chart`, 5000);
      // One more connection: the chart follows within a scrape (2 s) and a redraw (1 s).
      const extra = await t.peer(router.wsUrl);
      const now = await connections();
      assert.equal(now, before + 1);
      const asked = Date.now();
      const c = await until(async () => {
        const x = await chart(page, tid, 'conn-now');
        return x.last.connections === now ? x : null;
      }, `connections ${now} on the chart`, 5000);
      assert.ok(Date.now() - asked < 2000 + 1000 + 1500, 'within one scrape');
      assert.ok(c.lastX * 1000 >= asked - 2000, 'the last point is a sample taken since');
      assert.equal(c.metrics, 'ok');
      extra.close();
      // Commits happened between two samples: the commit-time chart has a point.
      await helper.send({ agent: asker.agentId }, { commit: true });
      sent += 1;
      const commit = await until(async () => {
        const x = await chart(page, tid, 'commit');
        return x.lastY !== null ? x : null;
      }, 'a commit time', 6000);
      assert.ok(commit.lastY >= 0 && commit.lastY < 5000, `commit ${commit.lastY} ms`);
      const queues = await chart(page, tid, 'queues');
      assert.deepEqual(queues.labels, ['outbox frames', 'fullest outbox', 'messages waiting', 'paused subscriptions']);
      // The dashboard's own connection lingers (`?linger=100`): for up to 100 ms after the
      // message its events wait in its outbox, and a scrape then counts them. Once the router
      // is idle, the chart and /metrics agree within one scrape.
      await until(async () => {
        const scraped = scrapeSums(await (await fetch(metricsUrl())).text());
        return (await chart(page, tid, 'queues')).last['outbox frames'] === scraped.map_outbox_frames;
      }, 'idle outboxes on both, within one scrape', 5000);
    });

    await t.step('screenshot', async () => {
      await page.mouse.move(0, 0);
      await page.selectOption(tid('charts-span'), '60');
      await until(async () => (await chart(page, tid, 'messages')).end - (await chart(page, tid, 'messages')).start < 61_000, 'a one-minute window');
      await h.docsShot(page, 'charts');
      await page.selectOption(tid('charts-span'), '300');
      await until(async () => (await chart(page, tid, 'messages')).end - (await chart(page, tid, 'messages')).start > 299_000, 'the five-minute window again');
    });

    await t.step('scrubbing back moves the charts\' end there', async () => {
      const log = await peer.history();
      const marker = firstPhase.at(-1);
      const index = log.findIndex((e) => e.id === marker.id);
      assert.ok(index >= 0);
      await page.locator(tid('scrubber')).fill(String(index));
      await page.locator(`${tid('scrubber-label')}[data-event-id="${marker.id}"]`).waitFor({ timeout: WAIT_MS });
      const c = await until(async () => {
        const x = await chart(page, tid, 'messages');
        return x.end === marker.timestamp ? x : null;
      }, 'the chart to end at the moment looked at');
      assert.equal(c.lastX, Math.floor(marker.timestamp / 1000));
      assert.equal(c.totals.sent, firstPhase.length, 'only what was sent up to then');
      const tokens = await chart(page, tid, 'tokens');
      assert.equal(tokens.end, marker.timestamp);
      await page.click(tid('back-to-live'));
      await until(async () => (await chart(page, tid, 'messages')).totals?.sent === sent, 'live again');
    });

    await t.step('after kill -9 and a restart, the charts rebuild from the log', async () => {
      const before = {
        messages: (await chart(page, tid, 'messages')).totals,
        agents: (await chart(page, tid, 'agents')).totals,
        tokens: (await chart(page, tid, 'tokens')).last,
        latency: (await chart(page, tid, 'latency')).labels,
      };
      router = await t.restart(router);
      await page.goto(`${router.uiUrl}#charts`);
      await page.locator(`${tid('history-status')}[data-state="ready"]`).waitFor({ state: 'attached', timeout: WAIT_MS });
      const after = await until(async () => {
        const x = await chart(page, tid, 'messages');
        return x.totals?.sent === before.messages.sent ? x : null;
      }, 'the same totals after the restart');
      assert.deepEqual(after.totals, before.messages);
      assert.deepEqual((await chart(page, tid, 'agents')).totals, before.agents);
      assert.deepEqual((await chart(page, tid, 'tokens')).last, before.tokens);
      assert.deepEqual((await chart(page, tid, 'latency')).labels, before.latency);
      // The gauges come from the new process.
      await until(async () => (await chart(page, tid, 'conn-now')).metrics === 'ok', '/metrics of the restarted router');
    });
  });

  h.scenario('charts-metrics-auth', async (t, browser) => {
    const keys = 'dashboard-key-0123456789abcdef dashboard\n';
    const router = await t.router('[auth]\n\n[auth.api_keys]\nfile = "api-keys"\n', { 'api-keys': keys });
    const off = await t.router('[metrics]\nenabled = false\n');
    const context = await t.context(browser);
    const page = await context.newPage();

    await t.step('with auth on, the dashboard\'s key reads /metrics', async () => {
      const metricsUrl = router.uiUrl.replace(/\/ui$/, '/metrics');
      assert.equal((await fetch(metricsUrl)).status, 401, 'a scrape without a credential is refused');
      await page.goto(`${router.uiUrl}#charts`);
      await page.locator(tid('auth-form')).waitFor({ timeout: WAIT_MS });
      await page.selectOption(tid('auth-method'), 'api-key');
      await page.fill(tid('auth-credential'), 'dashboard-key-0123456789abcdef');
      await page.click(tid('auth-submit'));
      await page.locator(`${tid('connection-status')}[data-status="live"]`).waitFor({ timeout: WAIT_MS });
      const scraped = scrapeSums(await (await fetch(metricsUrl, { headers: { Authorization: 'Bearer dashboard-key-0123456789abcdef' } })).text());
      const c = await until(async () => {
        const x = await chart(page, tid, 'conn-now');
        return x.metrics === 'ok' && x.last.connections === scraped.map_connections ? x : null;
      }, 'the gauges read with the key', 6000);
      assert.equal(c.note, '');
    });

    await t.step('a router without /metrics says so instead of failing', async () => {
      const page2 = await context.newPage();
      await page2.goto(`${off.uiUrl}#charts`);
      const c = await until(async () => {
        const x = await chart(page2, tid, 'conn-now');
        return x.metrics === 'off' ? x : null;
      }, 'the gauges to say /metrics is off');
      assert.match(c.note, /serves no \/metrics/);
      assert.deepEqual(c.labels, [], 'no series drawn');
      // The log's charts still work.
      await page2.locator(`${tid('history-status')}[data-state="ready"]`).waitFor({ state: 'attached', timeout: WAIT_MS });
      assert.deepEqual((await chart(page2, tid, 'messages')).labels, ['sent', 'delivered', 'failed']);
    });
  });

  h.scenario('charts-stats', async (t) => {
   await t.step('stats.js: bounds, usage rules, buckets, /metrics parsing', async () => {
    // stats.js is pure: its bounds and rules, fed events directly.
    const S = await import(pathToFileURL(path.join(h.HERE, '../../src/server/ui/stats.js')).href);
    const T = 1_795_000_000_000;
    let n = 0;
    const ev = (type, dt, data) => ({ id: String(n++).padStart(26, '0'), type, timestamp: T + dt, data });
    await (async () => {
      const s = new S.Stats();
      // Per-agent series stay bounded: 100 senders, at most AGENTS_TRACKED kept, the busiest among them.
      for (let i = 0; i < 100; i++) {
        for (let k = 0; k < (i === 0 ? 50 : 1); k++) s.observe(ev('message_sent', i * 10, { messageId: `m${i}-${k}`, from: `agent-${i}`, message: { meta: { expectsResponse: true } } }));
      }
      assert.ok(s.agents.map.size <= S.AGENTS_TRACKED && s.agents.map.size > (S.AGENTS_TRACKED * 3) / 4, `tracked ${s.agents.map.size}`);
      assert.ok(s.agents.map.has('agent-0'), 'the busiest stays');
      assert.ok(s.pending.size <= S.PENDING_REQUESTS);
      for (let i = 0; i < S.PENDING_REQUESTS + 10; i++) s.observe(ev('message_sent', 2000, { messageId: `p${i}`, from: 'x', message: { meta: { expectsResponse: true } } }));
      assert.equal(s.pending.size, S.PENDING_REQUESTS, 'waiting requests bounded');
      // Usage: checkpoints add up (each once); metadata.usage, when it comes, wins.
      const cp = (id, dt) => ev('trajectory.checkpoint', dt, { checkpoint: { id, agentId: 'w', metadata: { usage: { inputTokens: 10, outputTokens: 5, costUsd: 0.01 } } } });
      s.observe(cp('k1', 3000));
      s.observe(cp('k1', 3100));
      s.observe(cp('k2', 4000));
      let w = s.window(T + 5000, 300);
      assert.deepEqual(s.usages(w, 6).map((u) => [u.id, u.lastTokens]), [['w', 30]]);
      s.observe(ev('agent.metadata.changed', 6000, { agentId: 'w', metadata: { usage: { inputTokens: 7, outputTokens: 0 } } }));
      w = s.window(T + 7000, 300);
      assert.deepEqual(s.usages(w, 6).map((u) => [u.id, u.lastTokens, u.lastCost]), [['w', 7, 0]]);
      // An hour later a 5-minute window at that moment is read from minutes; a day is 1 440 of them.
      s.observe(ev('message_sent', 2 * 3600_000, { messageId: 'late', from: 'y' }));
      const old = s.window(T + 7000, 300);
      assert.equal(old.coarse, true);
      const day = s.window(T + 2 * 3600_000, 86_400);
      assert.equal(day.n, S.COARSE_MINUTES);
      const sentInDay = s.totals(day).sent.reduce((a, b) => a + b, 0);
      assert.equal(sentInDay, 149 + S.PENDING_REQUESTS + 10 + 1);
    })();
    // Prometheus text: sums over label sets, and the commit time between two scrapes.
    const a = S.metricSample(1000, S.parseMetrics('# TYPE map_connections gauge\nmap_connections{transport="websocket"} 3\nmap_connections{transport="http"} 1\nmap_store_commit_duration_seconds_sum 0.5\nmap_store_commit_duration_seconds_count 10\n'), null);
    assert.equal(a.connections, 4);
    assert.equal(a.commitMs, null);
    const b = S.metricSample(3000, S.parseMetrics('map_store_commit_duration_seconds_sum 0.6\nmap_store_commit_duration_seconds_count 14\nmap_subscriptions{state="paused"} 2\n'), a);
    assert.ok(Math.abs(b.commitMs - 25) < 1e-9, `commit ${b.commitMs}`);
    assert.equal(b.paused, 2);
   });
  });
}
