// The agent graph: who talks to whom. One node per participant that sent or received a message
// in the window (the WINDOW_MS before the newest event, or before the moment looked at when
// time travelling), boxed by scope; one edge per direction, labelled with the messages
// delivered along it. A click on an edge filters the events by its sender and shows the flow
// of that pair only (flow.js `showPair`).
//
// Owns: a ring of the last DELIVERIES_KEPT deliveries (observe(): O(1), four array slots per
// delivery), from which each drawing counts its edges. Interface (app.js): `render(root, ctx)`,
// `observe(event)`. No MAP calls.
import { nameOf } from './views.js';
import { CLI_KEY, laneKeyOf, showPair } from './flow.js';
import { clock, compareIds, el, num, replaceChildren, svg } from './util.js';

/** Deliveries kept (sender, recipient, time, event id), the oldest forgotten first. */
export const DELIVERIES_KEPT = 50_000;
/** The window the edges count: this long before the newest event (or the moment looked at). */
export const WINDOW_MS = 15 * 60_000;
/** Nodes drawn at most (the busiest); the others are counted in the status line. */
export const MAX_NODES = 80;
/** Live redraws at most this often (ms). */
const REDRAW_MS = 1000;

const NODE_W = 112;
const NODE_H = 30;
const GAP_X = 64;
const GAP_Y = 56;
const PAD = 12;
const TITLE_H = 30;
const MARGIN = 10;

// ---------------------------------------------------------------------------------------------
// Deliveries (observe)

const ring = {
  from: new Array(DELIVERIES_KEPT),
  to: new Array(DELIVERIES_KEPT),
  ts: new Float64Array(DELIVERIES_KEPT),
  id: new Array(DELIVERIES_KEPT),
  next: 0,
  size: 0,
  /** Deliveries seen since the page loaded (changes whenever the ring does). */
  seen: 0,
  newest: 0,
};

/** One string per participant id, so that the ring does not hold a copy per delivery. */
const names = new Map();
const NAMES_KEPT = 10_000;
function intern(id) {
  const known = names.get(id);
  if (known !== undefined) return known;
  if (names.size >= NAMES_KEPT) names.clear();
  names.set(id, id);
  return id;
}

export function observe(event) {
  if (typeof event.timestamp === 'number' && event.timestamp > ring.newest) ring.newest = event.timestamp;
  if (event.type !== 'message_delivered') return;
  const d = event.data ?? {};
  if (typeof d.from !== 'string' || !Array.isArray(d.deliveredTo)) return;
  for (const r of d.deliveredTo) {
    if (typeof r !== 'string') continue;
    const i = ring.next;
    ring.from[i] = intern(d.from);
    ring.to[i] = intern(r);
    ring.ts[i] = event.timestamp;
    ring.id[i] = event.id;
    ring.next = (i + 1) % DELIVERIES_KEPT;
    if (ring.size < DELIVERIES_KEPT) ring.size += 1;
    ring.seen += 1;
  }
}

/** Edge counts in the window: Map `from\u0001to` (lane keys) → {from, to, count}. */
function countEdges(model, past, filters) {
  const end = past ? past.timestamp : ring.newest;
  const start = end - WINDOW_MS;
  const edges = new Map();
  const keyOf = new Map(); // participant id → lane key (memo for this count)
  const lane = (id) => {
    let k = keyOf.get(id);
    if (k === undefined) {
      k = laneKeyOf(id, model, past);
      keyOf.set(id, k);
    }
    return k;
  };
  const inScope = (id) => (model.agents.get(id)?.scopes ?? []).includes(filters.scope);
  for (let n = 0; n < ring.size; n++) {
    const i = (ring.next - ring.size + n + DELIVERIES_KEPT) % DELIVERIES_KEPT;
    const ts = ring.ts[i];
    if (ts <= start || ts > end) continue;
    if (past && compareIds(ring.id[i], past.id) > 0) continue;
    const from = ring.from[i];
    const to = ring.to[i];
    if (filters.agent && from !== filters.agent && to !== filters.agent) continue;
    if (filters.scope && !inScope(from) && !inScope(to)) continue;
    const a = lane(from);
    const b = lane(to);
    if (a === b) continue;
    const key = `${a}\u0001${b}`;
    const e = edges.get(key);
    if (e) e.count += 1;
    else edges.set(key, { from: a, to: b, count: 1, members: new Set() });
    if (a === CLI_KEY) edges.get(key).members.add(from);
  }
  // The ring is full and its oldest delivery is inside the window: older ones were forgotten.
  const truncated = ring.size === DELIVERIES_KEPT && ring.ts[ring.next] > start;
  return { edges, start, end, truncated };
}

// ---------------------------------------------------------------------------------------------
// Drawing


const state = new WeakMap();

export function render(root, ctx) {
  let s = state.get(root);
  if (!s) {
    const status = el('p', { class: 'muted', 'data-testid': 'graph-status' });
    const box = el('div', { class: 'graph', 'data-testid': 'graph' });
    replaceChildren(root, status, box);
    s = { status, box, key: null, view: null, drawnAt: 0, timer: null, rerender: ctx.rerender };
    new ResizeObserver(() => s.rerender()).observe(box);
    state.set(root, s);
  }
  s.rerender = ctx.rerender;
  const { filters, past } = ctx;
  const width = s.box.clientWidth;
  const view = JSON.stringify([filters.agent, filters.scope, past?.id, width, ctx.model.agents.size, ctx.model.scopes.size]);
  // New deliveries, or anything else that changed the model (names, scopes): redrawn, throttled.
  const key = `${view}|${ring.seen}|${ctx.model.lastEventId}`;
  if (key === s.key) return;
  const wait = s.drawnAt + REDRAW_MS - performance.now();
  if (s.view === view && wait > 0) {
    if (!s.timer) {
      s.timer = setTimeout(() => {
        s.timer = null;
        s.rerender();
      }, wait);
    }
    return;
  }
  s.key = key;
  s.view = view;
  s.drawnAt = performance.now();
  draw(s, ctx, Math.max(width, NODE_W + 2 * (PAD + MARGIN)));
}

function draw(s, ctx, width) {
  const { model, past, filters, actions } = ctx;
  const { edges, start, end, truncated } = countEdges(model, past, filters);
  // Nodes: every end of an edge, the busiest MAX_NODES.
  const traffic = new Map();
  for (const e of edges.values()) {
    traffic.set(e.from, (traffic.get(e.from) ?? 0) + e.count);
    traffic.set(e.to, (traffic.get(e.to) ?? 0) + e.count);
  }
  const kept = new Set([...traffic].sort((a, b) => b[1] - a[1]).slice(0, MAX_NODES).map(([k]) => k));
  const hidden = traffic.size - kept.size;
  const total = [...edges.values()].reduce((n, e) => n + e.count, 0);
  const cliMembers = new Set();
  for (const e of edges.values()) for (const m of e.members) cliMembers.add(m);
  const label = (k) => (k === CLI_KEY ? `cli (${cliMembers.size})` : nameOf(model, k));
  s.status.textContent =
    `${num(total)} messages between ${kept.size} participants · ${clock(start).slice(0, 8)} – ${clock(end).slice(0, 8)}` +
    ` (${WINDOW_MS / 60_000} min before ${past ? 'the moment shown' : 'the newest event'})` +
    (hidden > 0 ? ` · ${hidden} quieter participants not drawn` : '') +
    (truncated ? ` · only the newest ${num(DELIVERIES_KEPT)} deliveries` : '');
  if (kept.size === 0) {
    replaceChildren(s.box, el('p', { class: 'empty', 'data-testid': 'graph-empty' }, filters.agent || filters.scope ? 'No messages pass the filters in the window.' : 'No messages in the window.'));
    return;
  }

  // Groups: an agent's first scope; agents without one; clients (participants that are no agent).
  const groups = new Map();
  const groupOf = (k) => {
    if (k === CLI_KEY || !model.agents.has(k)) return { id: '\u0000clients', name: 'clients' };
    const scope = model.agents.get(k).scopes?.[0];
    return scope ? { id: scope, name: model.scopes.get(scope)?.name ?? scope } : { id: '\u0000none', name: 'no scope' };
  };
  for (const k of [...kept].sort((a, b) => label(a).localeCompare(label(b)))) {
    const g = groupOf(k);
    if (!groups.has(g.id)) groups.set(g.id, { ...g, nodes: [] });
    groups.get(g.id).nodes.push(k);
  }
  // Boxes, packed in rows across the width; nodes in a grid inside each box.
  const maxCols = Math.max(1, Math.floor((width - 2 * MARGIN - 2 * PAD + GAP_X) / (NODE_W + GAP_X)));
  const ordered = [...groups.values()].sort((a, b) => (a.id.startsWith('\u0000') ? 1 : 0) - (b.id.startsWith('\u0000') ? 1 : 0) || b.nodes.length - a.nodes.length || a.name.localeCompare(b.name));
  const pos = new Map();
  const boxes = [];
  let x = MARGIN;
  let y = MARGIN;
  let rowH = 0;
  for (const g of ordered) {
    const cols = Math.min(maxCols, Math.max(1, Math.ceil(Math.sqrt(g.nodes.length * 1.5))), g.nodes.length);
    const rows = Math.ceil(g.nodes.length / cols);
    const w = cols * (NODE_W + GAP_X) - GAP_X + 2 * PAD;
    const h = TITLE_H + rows * (NODE_H + GAP_Y) - GAP_Y + 2 * PAD;
    if (x > MARGIN && x + w > width - MARGIN) {
      x = MARGIN;
      y += rowH + GAP_Y;
      rowH = 0;
    }
    boxes.push({ g, x, y, w, h });
    g.nodes.forEach((k, i) => {
      const cx = x + PAD + (i % cols) * (NODE_W + GAP_X) + NODE_W / 2;
      const cy = y + TITLE_H + PAD + Math.floor(i / cols) * (NODE_H + GAP_Y) + NODE_H / 2;
      pos.set(k, { x: cx, y: cy, group: g });
    });
    x += w + GAP_X;
    rowH = Math.max(rowH, h);
  }
  const height = y + rowH + MARGIN;
  const maxCount = Math.max(...[...edges.values()].map((e) => e.count));
  const shown = [...edges.values()].filter((e) => kept.has(e.from) && kept.has(e.to));
  const both = new Set(shown.map((e) => `${e.from}\u0001${e.to}`));

  const edgeParts = shown.map((e) => {
    const a = pos.get(e.from);
    const b = pos.get(e.to);
    // A quadratic curve bowing to the left of its direction: the two directions of a pair
    // part, and an edge does not run through the nodes between its ends in a row.
    const len = Math.hypot(b.x - a.x, b.y - a.y) || 1;
    const bow = Math.min(0.22 * len, 70);
    const cx = (a.x + b.x) / 2 + ((b.y - a.y) / len) * bow;
    const cy = (a.y + b.y) / 2 - ((b.x - a.x) / len) * bow;
    // Each end leaves its node's border, towards the control point.
    const border = (p, gap) => {
      const dx = cx - p.x;
      const dy = cy - p.y;
      const d = Math.hypot(dx, dy) || 1;
      const t = Math.min(NODE_W / 2 / Math.max(Math.abs(dx / d), 1e-6), NODE_H / 2 / Math.max(Math.abs(dy / d), 1e-6)) + gap;
      return [p.x + (dx / d) * t, p.y + (dy / d) * t];
    };
    const [x1, y1] = border(a, 2);
    const [x2, y2] = border(b, 4);
    const lx = 0.25 * x1 + 0.5 * cx + 0.25 * x2;
    const ly = 0.25 * y1 + 0.5 * cy + 0.25 * y2;
    const d = `M ${x1.toFixed(1)} ${y1.toFixed(1)} Q ${cx.toFixed(1)} ${cy.toFixed(1)} ${x2.toFixed(1)} ${y2.toFixed(1)}`;
    const stroke = 1.2 + (3.5 * Math.log1p(e.count)) / Math.log1p(maxCount);
    const fromName = label(e.from);
    const toName = label(e.to);
    const open = () => {
      actions.setFilters({ agent: model.agents.has(e.from) ? e.from : '' });
      showPair(e.from, e.to);
      actions.showView('flow');
    };
    return {
      line: svg(
        'g',
        {
          class: 'graph-edge',
          'data-testid': 'graph-edge',
          'data-from': e.from === CLI_KEY ? 'cli' : e.from,
          'data-to': e.to === CLI_KEY ? 'cli' : e.to,
          'data-from-name': fromName,
          'data-to-name': toName,
          'data-count': e.count,
          tabindex: 0,
          role: 'button',
          'aria-label': `${fromName} → ${toName}: ${e.count} messages; show them in the flow`,
          onclick: open,
          onkeydown: (ev) => (ev.key === 'Enter' || ev.key === ' ') && open(),
        },
        svg('title', {}, `${fromName} → ${toName}: ${e.count} messages`),
        svg('path', { d, class: 'hit' }),
        svg('path', { d, class: 'edge', 'stroke-width': stroke.toFixed(1), 'marker-end': 'url(#graph-arrow)' }),
        svg('rect', { x: lx - 4 - 4 * String(e.count).length, y: ly - 9, width: 8 + 8 * String(e.count).length, height: 17, rx: 8, class: 'count-bg' }),
        svg('text', { x: lx, y: ly + 4, 'text-anchor': 'middle', class: 'count', 'data-testid': 'graph-edge-count' }, String(e.count)),
      ),
    };
  });

  const drawing = svg(
    'svg',
    { width, height, viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': `Agent graph: ${kept.size} participants, ${shown.length} edges` },
    svg('defs', {}, svg('marker', { id: 'graph-arrow', viewBox: '0 0 10 10', refX: 8, refY: 5, markerWidth: 9, markerHeight: 9, markerUnits: 'userSpaceOnUse', orient: 'auto-start-reverse' }, svg('path', { d: 'M 0 0 L 10 5 L 0 10 z', class: 'graph-arrowhead' }))),
    boxes.map((bx) =>
      svg(
        'g',
        { class: 'graph-scope', 'data-testid': 'graph-scope', 'data-scope': bx.g.id.startsWith('\u0000') ? '' : bx.g.id, 'data-name': bx.g.name, 'data-nodes': bx.g.nodes.length },
        svg('rect', { x: bx.x, y: bx.y, width: bx.w, height: bx.h, rx: 8 }),
        svg('text', { x: bx.x + PAD, y: bx.y + 16 }, `${bx.g.name} (${bx.g.nodes.length})`),
      ),
    ),
    edgeParts.map((p) => p.line),
    [...pos].map(([k, p]) =>
      svg(
        'g',
        {
          class: `graph-node kind-${k === CLI_KEY ? 'cli' : model.agents.has(k) ? 'agent' : 'client'}`,
          'data-testid': 'graph-node',
          'data-node-id': k === CLI_KEY ? 'cli' : k,
          'data-name': label(k),
          'data-scope': p.group.id.startsWith('\u0000') ? '' : p.group.id,
          'data-count': traffic.get(k),
        },
        svg('title', {}, `${label(k)}${k === CLI_KEY ? ' (the CLI and clients connected briefly)' : ` (${k})`}: ${traffic.get(k)} messages in and out`),
        svg('rect', { x: p.x - NODE_W / 2, y: p.y - NODE_H / 2, width: NODE_W, height: NODE_H, rx: 6 }),
        svg('text', { x: p.x, y: p.y + 4, 'text-anchor': 'middle' }, truncate(label(k), 15)),
      ),
    ),
  );
  replaceChildren(s.box, drawing);
}

function truncate(s, n) {
  const t = String(s ?? '');
  return t.length > n ? `${t.slice(0, n - 1)}…` : t;
}
