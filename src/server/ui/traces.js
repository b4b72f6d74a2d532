// The trace view (issue 46, item 2): one trace across agents and gateways as a waterfall of
// spans, read from the router with `map/traces/get` (the span model of the OTLP export, built
// from the log with this viewer's own visibility; docs/traces.md, "Reading a trace back").
//
// Opened from a message (the message detail's "Trace" button, a message row's ⌁ button) or an
// event (spawn, inject, task, checkpoint), or from the list of recent messages shown when no
// trace is open. Keeps the traces it read (the newest TRACES_KEPT), each at most 2 000 spans
// (the router's bound).
import { nameOf } from './views.js';
import { clock, compact, el, num, replaceChildren } from './util.js';

/** Traces kept in memory (the newest read). */
export const TRACES_KEPT = 20;
/** Recent messages offered when no trace is open. */
const RECENT = 30;

const state = {
  /** anchor key → {status: 'loading'|'ok'|'error', result?, error?, at} */
  traces: new Map(),
  selectedSpan: null,
  shownKey: null,
};

function anchorKey(anchor) {
  return anchor ? JSON.stringify(anchor) : null;
}

async function load(ctx, anchor) {
  const key = anchorKey(anchor);
  const entry = { status: 'loading', at: Date.now() };
  state.traces.set(key, entry);
  while (state.traces.size > TRACES_KEPT) state.traces.delete(state.traces.keys().next().value);
  try {
    entry.result = await ctx.client.request('map/traces/get', anchor);
    entry.status = 'ok';
  } catch (err) {
    entry.status = 'error';
    entry.error = `${err.code !== undefined ? `${err.code} ` : ''}${err.message}`;
  }
  ctx.rerender();
}

export function render(root, ctx) {
  const anchor = ctx.traceAnchor;
  const key = anchorKey(anchor);
  if (anchor && ctx.client && !state.traces.has(key)) void load(ctx, anchor);
  const entry = key ? state.traces.get(key) : null;
  const drawKey = JSON.stringify([key, entry?.status, entry?.at, state.selectedSpan, anchor ? null : recentKey(ctx)]);
  if (root.dataset.key === drawKey) return;
  root.dataset.key = drawKey;
  if (!anchor) {
    replaceChildren(root, recentList(ctx));
    return;
  }
  replaceChildren(
    root,
    el(
      'div',
      { class: 'toolbar trace-bar' },
      el('button', { type: 'button', 'data-testid': 'trace-back', onclick: () => ctx.actions.showTrace(null) }, '← Recent messages'),
      el('span', { class: 'muted' }, anchor.messageId ? `message ${anchor.messageId}` : anchor.eventId ? `event ${anchor.eventId}` : `trace ${anchor.traceId}`),
      el('button', { type: 'button', 'data-testid': 'trace-refresh', onclick: () => ctx.client && void load(ctx, anchor) }, 'Refresh'),
    ),
    !entry || entry.status === 'loading'
      ? el('p', { class: 'muted', 'data-testid': 'trace-status', 'data-status': 'loading' }, 'Reading the trace from the log…')
      : entry.status === 'error'
        ? el('p', { class: 'error', 'data-testid': 'trace-status', 'data-status': 'error' }, `Could not read the trace: ${entry.error}`)
        : waterfall(entry.result, ctx),
  );
  placeBars(root);
}

function recentKey(ctx) {
  const ids = [];
  for (let i = ctx.events.length - 1; i >= 0 && ids.length < RECENT; i--) if (ctx.events[i].type === 'message_sent') ids.push(ctx.events[i].id);
  return ids.join(',');
}

/** The newest messages of the stream, each a way into its trace. */
function recentList(ctx) {
  const rows = [];
  for (let i = ctx.events.length - 1; i >= 0 && rows.length < RECENT; i--) {
    const e = ctx.events[i];
    if (e.type !== 'message_sent') continue;
    const d = e.data ?? {};
    rows.push(
      el(
        'li',
        {},
        el(
          'button',
          { type: 'button', class: 'linkish', 'data-testid': 'trace-pick', 'data-message-id': d.messageId, onclick: () => ctx.actions.showTrace({ messageId: d.messageId }) },
          el('time', {}, clock(e.timestamp)),
          ' ',
          `${nameOf(ctx.model, d.from)} → ${compact(d.to, 50)}`,
          d.message?.meta?.traceparent ? el('span', { class: 'chip', title: d.message.meta.traceparent }, 'traced') : null,
        ),
      ),
    );
  }
  return el(
    'section',
    { 'data-testid': 'trace-recent' },
    el('p', { class: 'muted' }, 'Pick a message to see its whole trace: what it caused, who answered, where it waited, queued or failed. Or open one from a message (Trace) or an event row (⌁).'),
    rows.length ? el('ol', { class: 'trace-recent' }, rows) : el('p', { class: 'empty' }, 'No messages yet.'),
  );
}

/** Spans in tree order (parents before children, siblings by start), each with its depth. */
export function ordered(spans) {
  const byId = new Map(spans.map((s) => [s.spanId, s]));
  const kids = new Map();
  const roots = [];
  for (const s of spans) {
    if (s.parentSpanId && byId.has(s.parentSpanId) && s.parentSpanId !== s.spanId) {
      if (!kids.has(s.parentSpanId)) kids.set(s.parentSpanId, []);
      kids.get(s.parentSpanId).push(s);
    } else {
      roots.push(s);
    }
  }
  const out = [];
  const seen = new Set();
  const walk = (s, depth) => {
    if (seen.has(s.spanId)) return;
    seen.add(s.spanId);
    out.push({ span: s, depth });
    for (const c of kids.get(s.spanId) ?? []) walk(c, depth + 1);
  };
  for (const r of roots) walk(r, 0);
  return out;
}

function waterfall(result, ctx) {
  const spans = result?.spans ?? [];
  if (spans.length === 0) return el('p', { class: 'empty', 'data-testid': 'trace-status', 'data-status': 'empty' }, 'This trace has no spans you may see.');
  const rows = ordered(spans);
  const t0 = Math.min(...spans.map((s) => s.startTimeMs));
  const t1 = Math.max(...spans.map((s) => s.endTimeMs ?? s.startTimeMs));
  const total = Math.max(t1 - t0, 1);
  const selected = spans.find((s) => s.spanId === state.selectedSpan) ?? null;
  return el(
    'div',
    { class: 'trace', 'data-testid': 'trace', 'data-trace-id': result.traceId, 'data-spans': spans.length },
    el(
      'p',
      { class: 'muted', 'data-testid': 'trace-summary' },
      `trace ${result.traceId} · ${spans.length} spans · ${fmtMs(total)} · ${num(result.examined)} events read`,
      result.truncated ? ' · truncated (more than the router returns, or the read stopped at its bound)' : '',
    ),
    el(
      'ol',
      { class: 'waterfall', 'aria-label': 'Spans' },
      rows.map(({ span: s, depth }) => {
        const start = s.startTimeMs - t0;
        const dur = Math.max(0, (s.endTimeMs ?? s.startTimeMs) - s.startTimeMs);
        const a = s.attributes ?? {};
        const error = s.status?.code === 'error';
        const queued = a['map.from_queue'] === true;
        return el(
          'li',
          {
            class: `span kind-${s.kind}${error ? ' error' : ''}${queued ? ' queued' : ''}${s.spanId === state.selectedSpan ? ' selected' : ''}`,
            'data-testid': 'span',
            'data-span-id': s.spanId,
            'data-parent-id': s.parentSpanId ?? '',
            'data-name': s.name,
            'data-depth': depth,
            'data-start-ms': start.toFixed(3),
            'data-duration-ms': dur.toFixed(3),
            'data-status': s.status?.code ?? 'unset',
            onclick: () => {
              state.selectedSpan = state.selectedSpan === s.spanId ? null : s.spanId;
              ctx.rerender();
            },
          },
          el(
            'span',
            { class: 'span-name', 'data-indent': depth, title: s.name },
            el('span', { class: 'indent', 'aria-hidden': 'true' }, '│ '.repeat(depth)),
            s.name,
            a['map.is_result'] === true ? el('span', { class: 'muted' }, ' ↩ answer') : null,
            typeof a['map.sender'] === 'string' ? el('span', { class: 'muted' }, ` from ${nameOf(ctx.model, a['map.sender'])}`) : null,
          ),
          el(
            'span',
            { class: 'span-track' },
            el('span', { class: 'span-bar', 'data-left': (100 * start) / total, 'data-width': (100 * dur) / total }),
          ),
          el('span', { class: 'span-time' }, `+${fmtMs(start)} · ${fmtMs(dur)}`, error ? ` · ${s.status?.message ?? 'failed'}` : '', queued ? ' · from the queue' : ''),
        );
      }),
    ),
    selected ? spanDetail(selected, ctx.model) : el('p', { class: 'muted' }, 'Click a span for its attributes.'),
  );
}

function spanDetail(s, model) {
  // An agent's or participant's id is shown with its name.
  const value = (v) => {
    if (typeof v !== 'string') return compact(v, 200);
    const name = nameOf(model, v);
    return name !== v ? `${name} (${v})` : v;
  };
  return el(
    'section',
    { class: 'span-detail', 'data-testid': 'span-detail' },
    el('h3', {}, s.name),
    el(
      'dl',
      { class: 'facts' },
      el('dt', {}, 'span'),
      el('dd', {}, s.spanId),
      s.parentSpanId ? [el('dt', {}, 'parent'), el('dd', {}, s.parentSpanId)] : null,
      el('dt', {}, 'kind'),
      el('dd', {}, s.kind),
      el('dt', {}, 'status'),
      el('dd', {}, s.status?.code ?? 'unset', s.status?.message ? `: ${s.status.message}` : ''),
      Object.entries(s.attributes ?? {}).map(([k, v]) => [el('dt', {}, k), el('dd', {}, value(v))]),
    ),
  );
}

function fmtMs(ms) {
  if (ms < 1) return `${ms.toFixed(2)} ms`;
  if (ms < 1000) return `${ms.toFixed(ms < 10 ? 1 : 0)} ms`;
  return `${(ms / 1000).toFixed(2)} s`;
}

/** Positions the bars (CSP forbids style attributes in markup; CSSOM is allowed). */
export function placeBars(root) {
  for (const bar of root.querySelectorAll('.span-bar')) {
    bar.style.left = `${bar.dataset.left}%`;
    bar.style.width = `max(2px, ${bar.dataset.width}%)`;
  }
}
