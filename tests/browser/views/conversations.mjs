// The conversations view (issue 46, item 4): a mail conversation between two of alice's SDK
// agents, seen by an operator's dashboard (a system principal, connected as `client`) with its
// participants and its turns in order, by name; an ordinary principal that takes no part (bob)
// sees no conversation and none of alice's agents; after kill -9 and a restart, the same.
const KEYS = 'ops-key-0123456789abcdef0123 ops\nalice-key-0123456789abcdef01 alice\nbob-key-0123456789abcdef0123 bob\n';
const CONFIG = `
[auth]
system_principals = ["ops"]

[auth.api_keys]
file = "api-keys"
`;
const ALICE = { method: 'api-key', credential: 'alice-key-0123456789abcdef01' };
const OPS = 'ops-key-0123456789abcdef0123';
const BOB = 'bob-key-0123456789abcdef0123';

export default function (h) {
  const { assert, tid, until, WAIT_MS, QUIET_MS } = h;

  async function signIn(page, url, key) {
    await page.goto(`${url}#conversations`);
    await page.locator(tid('auth-form')).waitFor({ timeout: WAIT_MS });
    await page.selectOption(tid('auth-method'), 'api-key');
    await page.fill(tid('auth-credential'), key);
    await page.click(tid('auth-submit'));
    await page.locator(`${tid('connection-status')}[data-status="live"]`).waitFor({ timeout: WAIT_MS });
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
      ts.map((t) => ({
        sender: t.querySelector('[data-testid="turn-sender"]').textContent,
        content: t.querySelector('[data-testid="turn-content"]').textContent,
        top: t.getBoundingClientRect().top,
        visible: t.getBoundingClientRect().height > 0,
      })),
    );
  }

  const EXPECTED = [
    { sender: 'alice-planner', content: 'Shall we ship on Friday?' },
    { sender: 'alice-planner', content: 'The tests are green.' },
    { sender: 'alice-helper', content: 'Friday it is.' },
  ];

  async function seesTheConversation(page, convId, expected = EXPECTED) {
    const row = await until(async () => {
      const r = (await listed(page)).find((c) => c.id === convId);
      return r && r.participants === 'alice-planner, alice-helper' ? r : null;
    }, 'the conversation listed with its participants by name').catch(async (e) => {
      throw new Error(`${e.message}: the list shows ${JSON.stringify(await listed(page))}`);
    });
    assert.equal(row.subject, 'Release plan');
    assert.equal(row.kind, 'mail · multi-agent');
    await page.click(`${tid('conversation')}[data-conversation-id="${convId}"]`);
    const shown = await until(async () => {
      const ts = await turns(page);
      return ts.length >= expected.length ? ts : null;
    }, 'the turns').catch(async (e) => {
      throw new Error(`${e.message}: ${JSON.stringify(await turns(page))}`);
    });
    assert.deepEqual(shown.map(({ sender, content }) => ({ sender, content })), expected);
    // In order on the screen too, one below the other.
    for (let i = 1; i < shown.length; i++) assert.ok(shown[i].top > shown[i - 1].top && shown[i].visible, `turn ${i + 1} below turn ${i}`);
  }

  h.scenario('conversations', async (t, browser) => {
    let router = await t.router(CONFIG, { 'api-keys': KEYS });
    // alice's agents are seen only by their owner and by agents sharing their scope (not by bob).
    const ops = await t.peer(router.wsUrl, { participantType: 'system', auth: { method: 'api-key', credential: OPS } });
    await ops.call('map/scopes/create', { scopeId: 'release', name: 'release' });
    const planner = await h.sdkAgent(t, router.wsUrl, { name: 'alice-planner', role: 'planner', visibility: 'scope', scopes: ['release'], auth: ALICE });
    const helper = await h.sdkAgent(t, router.wsUrl, { name: 'alice-helper', role: 'helper', visibility: 'scope', scopes: ['release'], auth: ALICE });
    const heard = new Promise((resolve) => helper.onMessage((m) => resolve(m)));
    const created = await planner.createConversation({ subject: 'Release plan', initialTurn: { contentType: 'text', content: 'Shall we ship on Friday?' } });
    const convId = created.conversation.id;
    await planner.sendWithMail({ agent: helper.agentId }, 'The tests are green.', convId);
    await h.withTimeout(heard, WAIT_MS, 'the helper gets the message');
    await helper.recordTurn({ conversationId: convId, contentType: 'text', content: 'Friday it is.' });

    const context = await t.context(browser);
    const page = await context.newPage();

    await t.step("an operator's dashboard lists the conversation and its turns in order, by name", async () => {
      await signIn(page, router.uiUrl, OPS);
      await seesTheConversation(page, convId);
      await page.locator(`${tid('conversations-status')}[data-status="loaded"]`).waitFor({ timeout: WAIT_MS });
    });

    await t.step('a new turn appears in the open conversation', async () => {
      await planner.recordTurn({ conversationId: convId, contentType: 'text', content: 'Shipping.' });
      await until(async () => (await turns(page)).at(-1)?.content === 'Shipping.', 'the new turn, last');
      assert.equal((await turns(page)).at(-1).sender, 'alice-planner');
    });

    await t.step('an IM message is a conversation too, marked IM, with its turn', async () => {
      const http = router.uiUrl.replace(/\/ui$/, '');
      const res = await fetch(`${http}/gateway/send`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${OPS}` },
        body: JSON.stringify({ to: 'alice-planner', content: 'ping over IM' }),
        signal: AbortSignal.timeout(WAIT_MS),
      });
      const sent = await res.json();
      assert.equal(res.status, 200, JSON.stringify(sent));
      const im = await until(async () => (await listed(page)).find((c) => c.kind.startsWith('IM') && /alice-planner/.test(c.participants)), 'the IM conversation listed with its participants').catch(async (e) => {
        throw new Error(`${e.message}: ${JSON.stringify(await listed(page))}`);
      });
      assert.equal(im.kind, 'IM · multi-agent');
      await page.click(`${tid('conversation')}[data-conversation-id="${im.id}"]`);
      await until(async () => (await turns(page)).map((x) => x.content).join('|') === 'ping over IM', 'its one turn');
      // The picture for the docs: both conversations listed, the mail one open.
      await page.click(`${tid('conversation')}[data-conversation-id="${convId}"]`);
      await until(async () => (await turns(page)).length === EXPECTED.length + 1, 'the mail conversation open again');
      await h.docsShot(page, 'conversations');
    });

    await t.step('an ordinary principal taking no part sees no conversation and no foreign agent', async () => {
      const other = await t.context(browser);
      const bobPage = await other.newPage();
      await signIn(bobPage, router.uiUrl, BOB);
      await bobPage.locator(`${tid('conversations-status')}[data-status="loaded"]`).waitFor({ timeout: WAIT_MS });
      await bobPage.locator(tid('conversations-empty')).waitFor({ timeout: WAIT_MS });
      await h.sleep(QUIET_MS);
      assert.equal(await bobPage.locator(tid('conversation')).count(), 0);
      assert.equal(await bobPage.locator(tid('agent-node')).count(), 0, 'none of alice\'s agents in the tree');
      const text = await bobPage.textContent('body');
      for (const secret of ['Release plan', 'Friday', 'ping over IM', 'alice-planner', 'alice-helper']) assert.ok(!text.includes(secret), `bob's page does not show "${secret}"`);
      await bobPage.click(tid('tab-events'));
      await h.sleep(QUIET_MS);
      // No event about alice's agents or their conversation: not registered, not joined to a
      // scope, no message, no mail. (Her sessions' participant_connected events do reach bob,
      // with the names her SDK agents connect under: that is the router's event audience for
      // sessions, not an agent nor a conversation; reported with issue 46, left as it is.)
      const shown = await h.rows(bobPage);
      const about = shown.filter((r) => r.type !== 'participant_connected' && (r.text.includes('alice-') || r.text.includes(convId)));
      assert.deepEqual(about, [], 'no event about alice\'s agents or conversation');
      assert.ok(!shown.some((r) => /^(agent_|message_|mail\.|scope_member)/.test(r.type) && r.text.includes('alice')));
      await other.close();
    });

    await t.step('after kill -9 and a restart, the conversation and its turns are read back', async () => {
      router = await t.restart(router);
      await signIn(page, router.uiUrl, OPS);
      await seesTheConversation(page, convId, [...EXPECTED, { sender: 'alice-planner', content: 'Shipping.' }]);
    });
  });
  // Many turns while the conversation is open: the view reads them all back in order, redraws
  // at most every 250 ms, and the page's frames stay short.
  h.scenario('conversations-load', async (t, browser) => {
    const router = await t.router(CONFIG, { 'api-keys': KEYS });
    const a = await h.sdkAgent(t, router.wsUrl, { name: 'talker-a', role: 'worker', auth: ALICE });
    const b = await h.sdkAgent(t, router.wsUrl, { name: 'talker-b', role: 'worker', auth: ALICE });
    const convId = (await a.createConversation({ subject: 'Busy', initialParticipants: [{ id: b.agentId }] })).conversation.id;
    const context = await t.context(browser);
    const page = await context.newPage();
    await signIn(page, router.uiUrl, OPS);
    await page.locator(`${tid('conversation')}[data-conversation-id="${convId}"]`).click();
    await page.locator(`${tid('conversation-turns')}[data-conversation-id="${convId}"]`).waitFor({ timeout: WAIT_MS });
    const N = 600;

    await t.step(`${N} turns while it is open: all shown in order, redraws throttled`, async () => {
      await page.evaluate(() => {
        window.__frames = [];
        window.__draws = 0;
        let last = performance.now();
        const tick = (now) => {
          window.__frames.push(now - last);
          last = now;
          if (window.__frames.length < 100000) requestAnimationFrame(tick);
        };
        requestAnimationFrame(tick);
        new MutationObserver(() => window.__draws++).observe(document.querySelector('[data-testid="view-conversations"]'), { childList: true });
      });
      const started = Date.now();
      for (let i = 0; i < N; i += 100) {
        await Promise.all(Array.from({ length: 100 }, (_, j) => (j % 2 ? b : a).recordTurn({ conversationId: convId, contentType: 'text', content: `turn ${i + j}` })));
      }
      const shown = await until(async () => {
        const ts = await turns(page);
        return ts.length === N ? ts : null;
      }, `${N} turns shown`, 3 * WAIT_MS);
      const seconds = (Date.now() - started) / 1000;
      // In the order the router recorded them (mail/turns/list), each by its sender's name.
      const listedByRouter = [];
      let cursor;
      const ops = await t.peer(router.wsUrl, { auth: { method: 'api-key', credential: OPS } });
      for (let page = 0; page < 5; page++) {
        const r = await ops.call('mail/turns/list', cursor ? { conversationId: convId, limit: 1000, cursor } : { conversationId: convId, limit: 1000 });
        listedByRouter.push(...r.turns.map((x) => x.content));
        cursor = r.nextCursor;
        if (!r.hasMore) break;
      }
      assert.deepEqual(shown.map((x) => x.content), listedByRouter);
      assert.deepEqual(new Set(shown.map((x) => x.sender)), new Set(['talker-a', 'talker-b']));
      const { frames, draws } = await page.evaluate(() => ({ frames: window.__frames.slice(1), draws: window.__draws }));
      frames.sort((x, y) => x - y);
      const p95 = frames[Math.floor(frames.length * 0.95)] ?? 0;
      console.log(`  conversations-load: ${N} turns in ${seconds.toFixed(1)} s, ${frames.length} frames, p95 ${p95.toFixed(1)} ms, ${draws} redraws`);
      // Timings are reported, not asserted: CI's cores are shared (scripts/bench-ui.sh measures them).
      assert.ok(draws <= Math.ceil(seconds * 4) + 4, `at most 4 redraws a second: ${draws} in ${seconds.toFixed(1)} s`);
    });
  });
}
