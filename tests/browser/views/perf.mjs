// The dashboard under load (issue 46, item 7): 50 agents in five scopes send 1 000 messages/s
// in all for MAP_UI_PERF_SECONDS (10 in the suite; scripts/bench-ui.sh runs 60 against a
// release build and records the figures in docs/performance.md). The page is driven through its
// views meanwhile, and measured with the Performance API: every animation frame's interval
// (requestAnimationFrame) and the long animation frames Chromium reports; the JS heap
// (collected, through the DevTools protocol) after a warm-up and at the end; and the router's CPU
// time with and without the page open (/proc/<pid>/stat).
//
// Asserted in the suite: the page keeps up (the newest message is on the page), nothing errs,
// and the heap stays bounded. The frame-time and CPU bounds of the issue are checked by the
// benchmark script (MAP_UI_PERF_STRICT=1), never in a timed test under CI's shared cores.
import { readFileSync, writeFileSync } from 'node:fs';
import WebSocket from 'ws';

const SECONDS = Number(process.env.MAP_UI_PERF_SECONDS ?? 10);
const RATE = Number(process.env.MAP_UI_PERF_RATE ?? 1000);
const AGENTS = 50;
const STRICT = process.env.MAP_UI_PERF_STRICT === '1';
const REPORT = process.env.MAP_UI_PERF_REPORT; // a JSON file for the benchmark script
const CYCLES = Math.max(1, Number(process.env.MAP_UI_PERF_CYCLES ?? 1)); // blank/page alternations

/** utime + stime of a process, in seconds. */
function cpuSeconds(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/** 50 raw WebSocket agents (register, join a scope); `run(ms)` sends RATE messages/s in all. */
async function loadAgents(url, h) {
  const agents = [];
  for (let i = 0; i < AGENTS; i++) {
    const ws = new WebSocket(url);
    await h.withTimeout(new Promise((resolve, reject) => {
      ws.once('open', resolve);
      ws.once('error', reject);
    }), h.WAIT_MS, 'load agent socket');
    const a = { ws, id: `load-${String(i).padStart(2, '0')}`, next: 1, answered: 0, pending: new Map() };
    ws.on('message', (data) => {
      const f = JSON.parse(String(data));
      if (f.id !== undefined && a.pending.has(f.id)) {
        a.pending.get(f.id)(f);
        a.pending.delete(f.id);
      } else if (f.id !== undefined) {
        a.answered++;
      }
    });
    a.call = (method, params) => h.withTimeout(new Promise((resolve) => {
      const id = a.next++;
      a.pending.set(id, resolve);
      ws.send(JSON.stringify({ jsonrpc: '2.0', id, method, params }));
    }), h.WAIT_MS, method);
    await a.call('map/connect', { protocolVersion: 1, participantType: 'agent', name: a.id });
    await a.call('map/agents/register', { agentId: a.id, name: a.id, role: 'worker' });
    agents.push(a);
  }
  const scopes = ['alpha', 'beta', 'gamma', 'delta', 'epsilon'];
  for (const s of scopes) await agents[0].call('map/scopes/create', { scopeId: s, name: s });
  for (const [i, a] of agents.entries()) await a.call('map/scopes/join', { scopeId: scopes[i % 5], agentId: a.id });
  return {
    agents,
    /** Sends for `ms` at RATE in all; resolves with the number sent. */
    async run(ms) {
      let sent = 0;
      const start = Date.now();
      for (;;) {
        const elapsed = Date.now() - start;
        if (elapsed >= ms) break;
        // As many as the elapsed time owes (a late tick catches up), in 20 ms ticks.
        const owed = Math.floor((RATE * elapsed) / 1000);
        while (sent < owed) {
          const from = agents[sent % AGENTS];
          const to = agents[(sent * 7 + 3) % AGENTS];
          from.ws.send(JSON.stringify({ jsonrpc: '2.0', id: from.next++, method: 'map/send', params: { to: { agent: to.id }, payload: { seq: sent } } }));
          sent++;
        }
        await h.sleep(20);
      }
      return sent;
    },
    close() {
      for (const a of agents) a.ws.close();
    },
  };
}

const median = (xs) => {
  if (xs.length === 0) return 0;
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

const percentile = (xs, p) => {
  if (xs.length === 0) return 0;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

export default function (h) {
  const { assert, tid, until, WAIT_MS } = h;

  h.scenario('perf: 50 agents at 1 000 messages/s', async (t, browser) => {
    const router = await t.router('[limits]\nexempt_loopback = true\n');
    const load = await loadAgents(router.wsUrl, h);
    t.cleanup(() => load.close());
    const pid = router.proc.pid;
    const report = { seconds: SECONDS, rate: RATE, agents: AGENTS };

    const context = await t.context(browser);
    const page = await context.newPage();
    await page.addInitScript(() => {
      const w = window;
      w.__frames = [];
      w.__loaf = [];
      let last = performance.now();
      const tick = (now) => {
        if (w.__frames.length < 100_000) w.__frames.push(now - last);
        last = now;
        requestAnimationFrame(tick);
      };
      requestAnimationFrame(tick);
      try {
        new PerformanceObserver((list) => {
          for (const e of list.getEntries()) if (w.__loaf.length < 100_000) w.__loaf.push(e.duration);
        }).observe({ type: 'long-animation-frame', buffered: true });
      } catch {
        // no LoAF in this browser: the rAF intervals still say it
      }
    });
    // The same browser with a blank page while the router is measured alone: what differs in
    // a page phase is the dashboard, not a browser competing for the machine. On this machine
    // the router's CPU per message varies by ±10 % from one 20 s phase to the next with the
    // same work, as much as the effect measured; so the benchmark alternates blank and page
    // phases (MAP_UI_PERF_CYCLES, 1 in the suite) and takes, for each page phase, its share
    // against the mean of the blank phases either side, then the median of those shares.
    const blankMs = Math.max(3000, (SECONDS * 1000) / 3);
    const blank = async () => {
      await page.goto('about:blank');
      await load.run(1000);
      const before = cpuSeconds(pid);
      const sent = await load.run(blankMs);
      return { cpu: cpuSeconds(pid) - before, sent };
    };
    const per = (phase) => (phase.sent > 0 ? (1e6 * phase.cpu) / phase.sent : 0);
    const blanks = [];
    const pages = [];
    const frames = [];
    const loaf = [];

    await t.step('the router with a blank page: its CPU per message', async () => {
      blanks.push(await blank());
    });

    const cdp = await context.newCDPSession(page);
    const heap = async () => {
      await cdp.send('HeapProfiler.collectGarbage');
      const { metrics } = await cdp.send('Performance.getMetrics');
      return metrics.find((m) => m.name === 'JSHeapUsedSize')?.value ?? 0;
    };
    await cdp.send('Performance.enable');

    for (let cycle = 1; cycle <= CYCLES; cycle++) {
      const last = cycle === CYCLES;
      // The first page phase is the whole run (frame times and memory over SECONDS without a
      // reload); the others, as long as a blank phase, only add CPU pairs.
      const pageMs = cycle === 1 ? SECONDS * 1000 : blankMs;
      await t.step(`${CYCLES > 1 ? `cycle ${cycle}: ` : ''}with the page open, driven through its views, for ${pageMs / 1000} s`, async () => {
        await page.goto(router.uiUrl);
        await page.locator(`${tid('connection-status')}[data-status="live"]`).waitFor({ timeout: WAIT_MS });
        // A reload reads the whole retained log again (about 2 000 events per second of the run
        // so far): outside the measured phase, and given time.
        await page.locator(`${tid('history-status')}[data-state="ready"]`).waitFor({ state: 'attached', timeout: cycle === 1 ? 4 * WAIT_MS : 300_000 });
        await load.run(1000);
        const first = cycle === 1;
        if (first) report.heapWarm = await heap();
        await page.evaluate(() => {
          window.__frames = [];
          window.__loaf = [];
        });
        const profile = process.env.MAP_UI_PERF_PROFILE; // a .cpuprofile file (Chrome DevTools)
        if (profile && last) {
          await cdp.send('Profiler.enable');
          await cdp.send('Profiler.start');
        }
        const before = cpuSeconds(pid);
        const views = ['events', 'flow', 'charts', 'graph', 'events'];
        const slice = pageMs / views.length;
        let sent = 0;
        for (const v of views) {
          await page.click(tid(`tab-${v}`));
          sent += await load.run(slice);
        }
        pages.push({ cpu: cpuSeconds(pid) - before, sent });
        if (profile && last) writeFileSync(profile, JSON.stringify((await cdp.send('Profiler.stop')).profile));
        const drawn = await page.evaluate(() => window.__frames);
        frames.push(...drawn);
        loaf.push(...(await page.evaluate(() => window.__loaf)));
        if (first) report.heapEnd = await heap();
        assert.ok(drawn.length > (pageMs / 1000) * 5, `the page kept drawing (${drawn.length} frames in ${pageMs / 1000} s)`);
        // Bounded memory: what the page holds after the run is what it held after the warm-up,
        // give or take its bounded tables filling (a leak grows with every message).
        if (first) assert.ok(report.heapEnd < report.heapWarm + 64 * 1024 * 1024, `heap ${report.heapWarm} -> ${report.heapEnd}`);
      });

      if (last) {
        await t.step('the page kept up: the newest message is on it', async () => {
          const peer = await t.peer(router.wsUrl);
          await peer.send({ agent: 'load-00' }, { probe: 'after-the-load' });
          await page.click(tid('tab-events'));
          await page.locator(`${tid('event-row')}[data-type="message_sent"]`, { hasText: 'after-the-load' }).waitFor({ timeout: 4 * WAIT_MS });
          peer.close();
          await h.shot(page, 'perf-end');
        });
      }

      await t.step(`${CYCLES > 1 ? `cycle ${cycle}: ` : ''}the router with a blank page again`, async () => {
        blanks.push(await blank());
      });
    }

    await t.step('the figures', async () => {
      report.frames = frames.length;
      report.frameP50 = percentile(frames, 50);
      report.frameP95 = percentile(frames, 95);
      report.frameMax = Math.max(0, ...frames);
      report.longFrames = loaf.length;
      report.longFrameP95 = percentile(loaf, 95);
      // The router's CPU per message sent, with the page open and without: what serving the
      // page (its subscription, /metrics and /health polls) adds. Loading the page (its files,
      // its first replay) is not in a page phase: an operator opens it once and leaves it.
      report.cycles = pages.map((p, i) => {
        const alone = (per(blanks[i]) + per(blanks[i + 1])) / 2;
        const withPage = per(p);
        return { aloneUs: alone, withPageUs: withPage, share: withPage > 0 ? (withPage - alone) / withPage : 0 };
      });
      report.cpuPerMessageAloneUs = median(report.cycles.map((c) => c.aloneUs));
      report.cpuPerMessageWithPageUs = median(report.cycles.map((c) => c.withPageUs));
      report.servingShare = median(report.cycles.map((c) => c.share));
      report.sentAlone = blanks.reduce((n, b) => n + b.sent, 0);
      report.sentWithPage = pages.reduce((n, p) => n + p.sent, 0);
      console.log(`  perf: ${JSON.stringify(report)}`);
      if (REPORT) writeFileSync(REPORT, JSON.stringify(report));
      if (STRICT) {
        assert.ok(report.frameP95 < 50, `frame time p95 ${report.frameP95.toFixed(1)} ms`);
        assert.ok(report.servingShare < 0.05, `serving the page costs ${(100 * report.servingShare).toFixed(1)} % of the router's CPU`);
      }
    });
  });
}
