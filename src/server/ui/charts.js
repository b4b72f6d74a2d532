// The charts view (issue 46): rates, connections, reply latency and usage over the retained
// history (from stats.js, fed every event of the log through `observe`), and the live gauges
// the log does not carry (outbox and queue depths, store commit time, connections now) polled
// from `GET /metrics` while the view is shown. uPlot draws; each chart is created once and
// given new data with `setData` (created again only when its set of series changes).
//
// Interface (app.js): `render(root, ctx)` draws when the view is shown; `observe(event)` takes
// every event of the log in order, from its start, shown or not.
//
// Each chart is `[data-testid="chart-<name>"]` and says what it draws in data attributes:
// `data-labels` (JSON: its series), `data-last-x` (Unix seconds of the first series' last
// point), `data-last-y` (its value), `data-last` (JSON: label → last value of each series),
// `data-start` / `data-end` (the window, Unix ms), and for counts `data-totals` (JSON: label →
// count in the window).
import uPlot from './uplot.js';
import { AGENTS_TRACKED, METRIC_SAMPLES, Stats, metricSample, parseMetrics } from './stats.js';
import { nameOf } from './views.js';
import { clock, el, num, replaceChildren } from './util.js';

/** Live charts are redrawn at most this often. */
const REDRAW_MS = 1000;
/** /metrics is read this often while the view is shown. */
const METRICS_MS = 2000;
/** After a refusal (401) or a router without /metrics (404), asked again this much later. */
const METRICS_RETRY_MS = 15_000;
/** Agents drawn in a per-agent chart (the busiest in the window). */
const TOP = 6;
/** Height of a chart's plot, px. */
const HEIGHT = 130;
const SPANS = [
  [60, 'last minute'],
  [300, 'last 5 min'],
  [900, 'last 15 min'],
  [3600, 'last hour'],
  [86_400, 'last day'],
];
const PALETTE = ['#2757d6', '#17803d', '#b3261e', '#c76a00', '#8a3ffc', '#2f8f8a', '#a8589a', '#59606a'];

const stats = new Stats();

/** Every event of the log, in order (app.js). */
export function observe(event) {
  stats.observe(event);
}

const V = {
  built: false,
  span: 300,
  metric: 'sent',
  /** name → {card, body, note, plot (uPlot), labelsKey} */
  charts: new Map(),
  drawnAt: 0,
  key: '',
  timer: null,
  width: 0,
  ctx: null,
};

const M = {
  running: false,
  samples: [],
  prev: null,
  /** `waiting`, `ok`, `refused` (401), `off` (404), `error` */
  status: 'waiting',
  detail: '',
  /** The credential of the last request, and when to ask again after a refusal or a 404. */
  triedWith: null,
  retryAt: 0,
};

const CHARTS = [
  ['messages', 'Messages per second (all agents)'],
  ['agents', 'Per agent, per second'],
  ['latency', 'Reply latency per answering agent (ms)'],
  ['tokens', 'Tokens per agent (input + output, running total)'],
  ['cost', 'Cost per agent (USD, running total)'],
  ['connections', 'Participants connected (from the log)'],
  ['conn-now', 'Connections and sessions now (/metrics)'],
  ['queues', 'Outbox and queue depths (/metrics)'],
  ['commit', 'Store commit time, mean per scrape (ms, /metrics)'],
];

function build(root, ctx) {
  const span = el(
    'select',
    { 'data-testid': 'charts-span', 'aria-label': 'Window' },
    SPANS.map(([s, label]) => el('option', { value: s, selected: s === V.span }, label)),
  );
  span.addEventListener('change', () => {
    V.span = Number(span.value);
    V.ctx?.rerender();
  });
  const metric = el(
    'select',
    { 'data-testid': 'charts-metric', 'aria-label': 'Per agent' },
    [['sent', 'sent (by sender)'], ['delivered', 'delivered (by recipient)'], ['failed', 'failed (by sender)']].map(([v, label]) => el('option', { value: v }, label)),
  );
  metric.addEventListener('change', () => {
    V.metric = metric.value;
    V.ctx?.rerender();
  });
  const grid = el('div', { class: 'charts', 'data-testid': 'charts' });
  for (const [name, title] of CHARTS) {
    const body = el('div', { class: 'chart-plot' });
    const note = el('p', { class: 'chart-note muted', hidden: true });
    const card = el('section', { class: 'chart', 'data-testid': `chart-${name}` }, el('h3', {}, title), note, body);
    grid.append(card);
    V.charts.set(name, { card, body, note, plot: null, labelsKey: '' });
  }
  replaceChildren(
    root,
    el('div', { class: 'toolbar charts-toolbar' }, el('label', {}, 'Window ', span), el('label', {}, 'Per agent ', metric), el('span', { class: 'muted', 'data-testid': 'charts-status' })),
    grid,
  );
  const ro = new ResizeObserver(() => {
    const w = chartWidth();
    if (w === V.width) return;
    V.width = w;
    for (const c of V.charts.values()) c.plot?.setSize({ width: w, height: HEIGHT });
  });
  ro.observe(root);
  V.built = true;
  V.root = root;
}

function chartWidth() {
  const body = V.charts.get('messages')?.body;
  return Math.max(200, Math.floor(body?.clientWidth || 600));
}

export function render(root, ctx) {
  V.ctx = ctx;
  if (!V.built) build(root, ctx);
  if (!M.running) {
    M.running = true;
    void poll(root);
  }
  const past = ctx.past;
  // What the user chose: a change redraws at once; otherwise a live view redraws at most once
  // a second (the window moves with the clock), a past one only when the moment changes.
  const key = JSON.stringify([V.span, V.metric, ctx.filters.agent, past?.timestamp ?? null, ctx.historyReady]);
  const now = Date.now();
  const due = now - V.drawnAt >= REDRAW_MS;
  if (key === V.key && (past || !due)) {
    if (!past) tick(now);
    return;
  }
  V.key = key;
  V.drawnAt = now;
  draw(ctx, now);
  if (!past) tick(now);
}

/** Keeps a live view moving: one redraw a second while it is shown. */
function tick(now) {
  if (V.timer) return;
  V.timer = setTimeout(() => {
    V.timer = null;
    V.ctx?.rerender();
  }, Math.max(50, REDRAW_MS - (now - V.drawnAt)));
}

function nameIn(ctx, id) {
  const n = nameOf(ctx.model, id);
  return n === id ? nameOf(ctx.fold, id) : n;
}

function draw(ctx, now) {
  const past = ctx.past;
  const endMs = past ? past.timestamp : Math.max(now, stats.head * 1000 + 999);
  const w = stats.window(endMs, V.span);
  const x0 = w.xs[0];
  const x1 = w.endS + 1;
  const startMs = x0 * 1000;
  const agent = ctx.filters.agent;
  const totals = stats.totals(w);
  const rate = (counts) => (w.step === 1 ? counts : counts.map((v) => v / w.step));
  const sum = (a) => a.reduce((s, v) => s + v, 0);
  const per = w.step === 1 ? '1 s buckets' : '1 min buckets';
  const status = V.root.querySelector('[data-testid="charts-status"]');
  status.textContent = `${clock(startMs)} – ${clock(endMs)} · ${per}${past ? ' · the past' : ''}${ctx.historyReady ? '' : ' · reading history…'}`;

  set('messages', w, { x0, x1, startMs, endMs }, [
    { label: 'sent', data: rate(totals.sent), total: sum(totals.sent) },
    { label: 'delivered', data: rate(totals.delivered), total: sum(totals.delivered), dash: [6, 4] },
    { label: 'failed', data: rate(totals.failed), total: sum(totals.failed) },
  ]);

  if (agent) {
    const a = stats.agent(agent, w);
    const who = nameIn(ctx, agent);
    set('agents', w, { x0, x1, startMs, endMs }, a
      ? [
          { label: `${who} sent`, data: rate(a.sent), total: sum(a.sent) },
          { label: `${who} delivered`, data: rate(a.delivered), total: sum(a.delivered) },
          { label: `${who} failed`, data: rate(a.failed), total: sum(a.failed) },
        ]
      : [], a ? '' : `${who} sent and received nothing that is kept (the ${AGENTS_TRACKED} busiest agents are).`);
  } else {
    const top = stats.topAgents(V.metric, w, TOP);
    set('agents', w, { x0, x1, startMs, endMs }, top.map((t) => ({ label: nameIn(ctx, t.id), data: rate(t.counts), total: t.total })), top.length ? '' : `No message ${V.metric} in this window.`);
  }

  set('connections', w, { x0, x1, startMs, endMs }, [{ label: 'connected', data: totals.connected }]);

  const lat = stats.latencies(w, TOP, agent);
  set('latency', w, { x0, x1, startMs, endMs }, lat.map((l) => ({ label: nameIn(ctx, l.id), data: l.ms, points: true, summary: `${l.replies} replies, mean ${num(l.mean, 1)} ms, max ${num(l.max, 1)} ms` })),
    lat.length ? '' : 'No replies in this window (a reply is a message with meta.isResult and the correlationId of a request that set meta.expectsResponse).');

  const use = stats.usages(w, TOP, agent);
  const noUsage = 'No agent reports usage (docs/dashboard.md, "Usage: the convention").';
  set('tokens', w, { x0, x1, startMs, endMs }, use.map((u) => ({ label: nameIn(ctx, u.id), data: u.tokens })), use.length ? '' : noUsage);
  set('cost', w, { x0, x1, startMs, endMs }, use.map((u) => ({ label: nameIn(ctx, u.id), data: u.cost, money: true })), use.length ? '' : noUsage);

  drawMetrics(startMs, endMs);
}

function drawMetrics(startMs, endMs) {
  const samples = M.samples.filter((s) => s.t >= startMs && s.t <= endMs);
  const xs = samples.map((s) => s.t / 1000);
  const bounds = { x0: startMs / 1000, x1: endMs / 1000, startMs, endMs, xs };
  const pick = (f) => samples.map((s) => s[f]);
  const note = {
    waiting: 'Reading /metrics…',
    ok: samples.length ? '' : 'No /metrics sample in this window (they are taken every 2 s while this view is shown, since the page was opened).',
    refused: `The router refused this credential for /metrics: ${M.detail}`,
    off: 'This router serves no /metrics ([metrics] enabled = false).',
    error: `/metrics could not be read: ${M.detail}`,
  }[M.status];
  const series = (list) => (M.status === 'ok' || samples.length ? list : []);
  set('conn-now', null, bounds, series([
    { label: 'connections', data: pick('connections') },
    { label: 'sessions', data: pick('sessions') },
  ]), note);
  set('queues', null, bounds, series([
    { label: 'outbox frames', data: pick('outbox') },
    { label: 'fullest outbox', data: pick('outboxMax') },
    { label: 'messages waiting', data: pick('pending') },
    { label: 'paused subscriptions', data: pick('paused') },
  ]), note);
  set('commit', null, bounds, series([{ label: 'commit ms', data: pick('commitMs'), points: true }]), note);
  for (const name of ['conn-now', 'queues', 'commit']) V.charts.get(name).card.dataset.metrics = M.status;
}

/** A time axis label on one line: `12:03:04`, or `12:03` on a whole minute. */
function timeLabel(sec) {
  const d = new Date(sec * 1000);
  const pad = (n) => String(n).padStart(2, '0');
  return d.getSeconds() === 0 ? `${pad(d.getHours())}:${pad(d.getMinutes())}` : `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function fmt(v, s) {
  if (v === null || v === undefined || Number.isNaN(v)) return '–';
  if (s?.money) return `$${v < 1 ? v.toFixed(4) : v.toFixed(2)}`;
  return Math.abs(v) >= 1000 || Number.isInteger(v) ? num(v) : num(v, Math.abs(v) < 10 ? 2 : 1);
}

/**
 * Draws chart `name`: `series` [{label, data, total?, points?, money?, summary?, dash?}] over `w`'s
 * buckets (or `bounds.xs` for sampled gauges); `empty` is said instead when there is nothing.
 */
function set(name, w, bounds, series, empty = '') {
  const c = V.charts.get(name);
  const xs = w ? w.xs : bounds.xs;
  const summaries = series.filter((s) => s.summary).map((s) => `${s.label}: ${s.summary}`);
  if (!summaries.length && series.some((s) => s.total !== undefined)) summaries.push(`in the window: ${series.map((s) => `${s.label} ${num(s.total ?? 0)}`).join(' · ')}`);
  c.note.textContent = summaries.length ? summaries.join(' · ') : empty;
  c.note.hidden = !c.note.textContent;
  const labels = series.map((s) => s.label);
  const labelsKey = JSON.stringify(labels);
  const data = [xs, ...series.map((s) => s.data)];
  c.range = [bounds.x0, bounds.x1];
  if (!c.plot || c.labelsKey !== labelsKey) {
    c.plot?.destroy();
    c.labelsKey = labelsKey;
    const money = series.some((s) => s.money);
    c.plot = new uPlot(
      {
        width: V.width || chartWidth(),
        height: HEIGHT,
        scales: {
          x: { time: true, range: () => c.range },
          // From 0, rounded up to a number the ticks can name.
          y: { range: (u, min, max) => uPlot.rangeNum(Math.min(0, min ?? 0), Math.max(max ?? 0, money ? 0.001 : 1), 0.1, true) },
        },
        series: [
          {},
          ...series.map((s, i) => ({
            label: s.label,
            stroke: PALETTE[i % PALETTE.length],
            width: 1.5,
            dash: s.dash,
            spanGaps: false,
            points: { show: Boolean(s.points), size: 5 },
            value: (u, v) => fmt(v, s),
          })),
        ],
        axes: [{ stroke: '#5f6b7a', grid: { stroke: '#eef0f3' }, size: 30, values: (u, splits) => splits.map(timeLabel) }, { stroke: '#5f6b7a', grid: { stroke: '#eef0f3' }, size: 56, values: (u, vals) => vals.map((v) => fmt(v, { money })) }],
        cursor: { drag: { x: false, y: false } },
        legend: { show: series.length > 0 },
      },
      null,
      c.body,
    );
  }
  c.plot.setData(data);
  // What a test (or a person with devtools) reads.
  const d = c.card.dataset;
  const last = {};
  let lastX = null;
  let lastY = null;
  series.forEach((s, i) => {
    let k = s.data.length - 1;
    while (k >= 0 && (s.data[k] === null || s.data[k] === undefined || Number.isNaN(s.data[k]))) k--;
    last[s.label] = k >= 0 ? s.data[k] : null;
    if (i === 0 && k >= 0) {
      lastX = xs[k];
      lastY = s.data[k];
    }
  });
  d.labels = labelsKey;
  d.last = JSON.stringify(last);
  d.lastX = lastX === null ? '' : String(lastX);
  d.lastY = lastY === null ? '' : String(lastY);
  d.start = String(bounds.startMs);
  d.end = String(bounds.endMs);
  if (series.some((s) => s.total !== undefined)) d.totals = JSON.stringify(Object.fromEntries(series.map((s) => [s.label, s.total ?? 0])));
  else delete d.totals;
}

// ---------------------------------------------------------------------------------------------
// /metrics

async function poll(root) {
  if (root.hidden || !root.isConnected) {
    M.running = false;
    return;
  }
  const bearer = V.ctx?.bearer?.() ?? null;
  // After a refusal or a 404, ask again later, or at once when the page signed in anew.
  if ((M.status === 'refused' || M.status === 'off') && bearer === M.triedWith && Date.now() < M.retryAt) {
    setTimeout(() => void poll(root), METRICS_MS);
    return;
  }
  M.triedWith = bearer;
  try {
    const res = await fetch('/metrics', {
      cache: 'no-store',
      headers: bearer ? { Authorization: `Bearer ${bearer}` } : {},
      signal: AbortSignal.timeout(METRICS_MS),
    });
    if (res.status === 401 || res.status === 403) {
      M.status = 'refused';
      M.detail = `${res.status}: ${(await res.text()).trim() || res.statusText}`;
      M.retryAt = Date.now() + METRICS_RETRY_MS;
    } else if (res.status === 404) {
      M.status = 'off';
      M.retryAt = Date.now() + METRICS_RETRY_MS;
    } else if (!res.ok) {
      M.status = 'error';
      M.detail = `${res.status} ${(await res.text()).trim()}`;
    } else {
      const text = await res.text();
      const sample = metricSample(Date.now(), parseMetrics(text), M.prev);
      M.prev = sample;
      M.samples.push(sample);
      if (M.samples.length > METRIC_SAMPLES) M.samples.splice(0, M.samples.length - METRIC_SAMPLES);
      M.status = 'ok';
    }
  } catch (err) {
    M.status = 'error';
    M.detail = err?.name === 'TimeoutError' ? 'no answer within 2 s' : String(err?.message ?? err);
  }
  V.key = ''; // new gauges: draw them at the next frame
  V.ctx?.rerender();
  setTimeout(() => void poll(root), METRICS_MS);
}
