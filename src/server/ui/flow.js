// The message flow: a sequence diagram of the newest messages that pass the shared filters
// (agent, scope) and the flow's own pair filter (set by a click on a graph edge). One lane per
// participant active in those messages, one arrow per delivery. The lanes always fit the
// panel's width: past what fits at MIN_LANE px each, a scope's members fold into one lane
// `scope (n)` (largest scopes first), then the quietest lanes into `others (n)`. The CLI's
// connections and clients connected for less than BRIEF_MS share one lane, `cli (n)`.
//
// Owns: the participants' connect/disconnect times (observe(), bounded by PARTICIPANTS_TRACKED),
// the pair filter, and whether the user scrolled up (then new arrows do not pull the view down).
// Interface (app.js): `render(root, ctx)`, `observe(event)`; `collectMessages` is also used by
// app.js (a click on a message event selects its message). No MAP calls.
import { nameOf, recipientsOf } from './views.js';
import { clock, compact, el, replaceChildren, svg } from './util.js';

/** Messages drawn: the newest that pass the filters. */
export const FLOW_MESSAGES = 120;
/** The narrowest lane (px); past that, lanes fold by scope. */
export const MIN_LANE = 96;
/** A client connected for less than this (ms) is "short-lived": it goes to the `cli` lane. */
export const BRIEF_MS = 10_000;
/** Participants whose connection times are kept (the oldest are forgotten first). */
export const PARTICIPANTS_TRACKED = 2000;
/** Live redraws at most this often (ms). */
const REDRAW_MS = 250;
/** How the CLI names its connections and begins their ids (src/cli/common.rs). */
const CLI_NAME = 'map-router-cli';
const CLI_ID_PREFIX = 'map-router-cli-';
/** The lane key of the merged short-lived clients (no participant id has a NUL). */
export const CLI_KEY = '\u0000cli';
const OTHERS_KEY = '\u0000others';
const ROW_H = 24;
/** Approximate width of a character of the message labels (11 px monospace). */
const CHAR_W = 6.7;

// ---------------------------------------------------------------------------------------------
// Participants (observe)

/** participant id → {type, name, at, goneAt}; insertion order = oldest first. */
const participants = new Map();

export function observe(event) {
  const d = event.data;
  if (!d || typeof d.participantId !== 'string') return;
  if (event.type === 'participant_connected') {
    participants.delete(d.participantId);
    participants.set(d.participantId, { type: d.participantType, name: d.name, at: event.timestamp, goneAt: null });
    if (participants.size > PARTICIPANTS_TRACKED) participants.delete(participants.keys().next().value);
  } else if (event.type === 'participant_disconnected') {
    const p = participants.get(d.participantId);
    if (p) p.goneAt = event.timestamp;
  }
}

/**
 * Whether `id` is a short-lived client: a connection of the CLI (its id prefix or name, or one
 * of `send --as-agent`'s temporary agents), or a client that is not an agent and was connected
 * for less than BRIEF_MS (as of `past`, when looking at the past).
 */
export function isShortLived(id, model, past) {
  if (typeof id !== 'string') return false;
  if (id.startsWith(CLI_ID_PREFIX)) return true;
  if (model?.agents.has(id)) return false;
  const p = participants.get(id);
  const name = p?.name ?? model?.participants.get(id)?.name;
  if (name === CLI_NAME) return true;
  if (!p || p.type !== 'client' || p.goneAt === null) return false;
  if (past && p.goneAt > past.timestamp) return false;
  return p.goneAt - p.at < BRIEF_MS;
}

/** The lane (or graph node) of a participant: its id, or CLI_KEY for short-lived clients. */
export function laneKeyOf(id, model, past) {
  return isShortLived(id, model, past) ? CLI_KEY : id;
}

// ---------------------------------------------------------------------------------------------
// Messages

/**
 * Messages in `events` (sent, then who got them), oldest first: the newest `limit` of those
 * that pass `keep(message)` (all when omitted).
 */
export function collectMessages(events, limit, keep = null) {
  const byId = new Map();
  for (const e of events) {
    const d = e.data ?? {};
    if (!d.messageId) continue;
    let m = byId.get(d.messageId);
    if (e.type === 'message_sent') {
      m = m ?? { id: d.messageId, delivered: [], failed: [] };
      Object.assign(m, { from: d.from, to: d.to, payload: d.payload ?? d.message?.payload, message: d.message, timestamp: e.timestamp, eventId: e.id });
      byId.set(d.messageId, m);
    } else if (m && e.type === 'message_delivered') {
      for (const r of d.deliveredTo ?? []) if (!m.delivered.includes(r)) m.delivered.push(r);
    } else if (m && e.type === 'message_failed') {
      for (const r of recipientsOf(d)) m.failed.push({ recipient: r, reason: d.reason });
    }
  }
  const out = [];
  const all = [...byId.values()];
  for (let i = all.length - 1; i >= 0 && out.length < limit; i--) {
    const m = all[i];
    if (m.eventId && (!keep || keep(m))) out.push(m);
  }
  return out.reverse();
}

/** Who a message reached or was meant to reach. */
export function targetsOf(m) {
  const out = [...m.delivered, ...m.failed.map((f) => f.recipient)];
  if (out.length === 0 && m.to && typeof m.to === 'object' && typeof m.to.agent === 'string') out.push(m.to.agent);
  return [...new Set(out)];
}

/** The filter of the flow: shared agent and scope filters, and the pair. */
function messageFilter(model, filters, pair, past) {
  const inScope = (id) => (model.agents.get(id)?.scopes ?? []).includes(filters.scope);
  return (m) => {
    const targets = targetsOf(m);
    if (filters.agent && m.from !== filters.agent && !targets.includes(filters.agent) && m.to?.agent !== filters.agent) return false;
    if (filters.scope && m.to?.scope !== filters.scope && !inScope(m.from) && !targets.some(inScope)) return false;
    if (pair) {
      if (laneKeyOf(m.from, model, past) !== pair.from) return false;
      if (!targets.some((t) => laneKeyOf(t, model, past) === pair.to)) return false;
    }
    return true;
  };
}

// ---------------------------------------------------------------------------------------------
// The pair filter (a graph edge)

let pair = null;

/** Narrows the flow to the messages from lane `from` to lane `to` (a graph edge's ends). */
export function showPair(from, to) {
  pair = { from, to, agent: null };
}

// ---------------------------------------------------------------------------------------------
// Lanes

/**
 * The lanes for `messages` in `width` px: [{key, label, title, kind, members}] and a map from
 * participant id to its lane's index. `pinned` ids keep their own lane; `keepScope` folds last.
 */
export function layoutLanes(messages, model, past, width, pinned, keepScope = '') {
  const traffic = new Map(); // unit key → arrows at it
  const members = new Map(); // unit key → participant ids
  const order = [];
  const unit = (id) => {
    const key = laneKeyOf(id, model, past);
    if (!members.has(key)) {
      members.set(key, new Set());
      traffic.set(key, 0);
      order.push(key);
    }
    members.get(key).add(id);
    traffic.set(key, traffic.get(key) + 1);
    return key;
  };
  for (const m of messages) {
    unit(m.from);
    for (const t of targetsOf(m)) unit(t);
  }
  const capacity = Math.max(2, Math.floor(width / MIN_LANE));
  // lanes: key → {key, units: [unit keys], kind, scope}
  let lanes = order.map((key) => ({ key, units: [key], kind: key === CLI_KEY ? 'cli' : 'one' }));
  if (lanes.length > capacity) {
    // Fold scopes, largest first (an agent goes with its first scope).
    const byScope = new Map();
    for (const l of lanes) {
      if (l.kind !== 'one' || pinned.has(l.key)) continue;
      const scope = model.agents.get(l.key)?.scopes?.[0];
      if (!scope) continue;
      if (!byScope.has(scope)) byScope.set(scope, []);
      byScope.get(scope).push(l.key);
    }
    let count = lanes.length;
    const folded = new Map(); // unit key → scope
    // The scope chosen in the scope filter folds last.
    const sorted = [...byScope].sort((a, b) => (a[0] === keepScope) - (b[0] === keepScope) || b[1].length - a[1].length);
    for (const [scope, keys] of sorted) {
      if (count <= capacity) break;
      if (keys.length < 2) continue;
      for (const k of keys) folded.set(k, scope);
      count -= keys.length - 1;
    }
    const next = [];
    const scopeLanes = new Map();
    for (const l of lanes) {
      const scope = folded.get(l.key);
      if (scope === undefined) {
        next.push(l);
      } else if (scopeLanes.has(scope)) {
        scopeLanes.get(scope).units.push(l.key);
      } else {
        const s = { key: `\u0000scope:${scope}`, units: [l.key], kind: 'scope', scope };
        scopeLanes.set(scope, s);
        next.push(s);
      }
    }
    lanes = next;
    // Still too many: the quietest lanes go to `others`.
    const weight = (l) => l.units.reduce((n, k) => n + traffic.get(k), 0);
    let others = null;
    while (lanes.length > capacity) {
      const candidates = lanes.filter((l) => l !== others && !(l.kind === 'one' && pinned.has(l.key)));
      if (candidates.length === 0 || (candidates.length === 1 && !others)) break;
      const quietest = candidates.reduce((a, b) => (weight(b) < weight(a) ? b : a));
      lanes = lanes.filter((l) => l !== quietest);
      if (!others) {
        others = { key: OTHERS_KEY, units: [], kind: 'others' };
        lanes.push(others);
      }
      others.units.push(...quietest.units);
    }
  }
  const index = new Map();
  const out = lanes.map((l, i) => {
    const ids = l.units.flatMap((k) => [...members.get(k)]);
    for (const id of ids) index.set(id, i);
    const names = ids.map((id) => nameOf(model, id));
    const shown = names.slice(0, 20).join(', ') + (names.length > 20 ? `, … (${names.length})` : '');
    const label =
      l.kind === 'one'
        ? names[0]
        : l.kind === 'cli'
          ? `cli (${ids.length})`
          : l.kind === 'scope'
            ? `${model.scopes.get(l.scope)?.name ?? l.scope} (${ids.length})`
            : `others (${ids.length})`;
    const title =
      l.kind === 'cli'
        ? `${ids.length} short-lived clients (the CLI's connections, clients connected < ${BRIEF_MS / 1000} s): ${shown}`
        : l.kind === 'one'
          ? `${names[0]} (${ids[0]})`
          : `${ids.length} participants: ${shown}`;
    return { key: l.key, label, title, kind: l.kind, members: ids.length };
  });
  return { lanes: out, index };
}

// ---------------------------------------------------------------------------------------------
// Drawing


/** Per flow element: its parts, what was drawn last, the scroll state. */
const state = new WeakMap();

function partsOf(root, ctx) {
  let s = state.get(root);
  if (s) return s;
  const box = root.querySelector('#message-flow') ?? root;
  const bar = el('div', { class: 'flow-bar', 'data-testid': 'flow-bar' });
  root.insertBefore(bar, box);
  s = { box, bar, key: null, drawnAt: 0, timer: null, follow: true, rerender: ctx.rerender };
  box.addEventListener('scroll', () => {
    if (box.clientHeight === 0) return;
    s.follow = box.scrollTop + box.clientHeight >= box.scrollHeight - 8;
  });
  new ResizeObserver(() => s.rerender()).observe(box);
  state.set(root, s);
  return s;
}

/** How long the last drawings took (ms), newest last, and how many there were: what the flow costs the page. */
const drawTimes = [];
const DRAW_TIMES_KEPT = 100;
let drawings = 0;
export function drawStats() {
  return { drawings, recent: [...drawTimes] };
}

/** Draws the flow into the view's element (`#view-flow`, holding `#message-flow`). */
export function render(root, ctx) {
  const s = partsOf(root, ctx);
  s.rerender = ctx.rerender;
  const { filters, model, past, events } = ctx;
  if (pair) {
    if (pair.agent === null) pair.agent = filters.agent;
    else if (filters.agent !== pair.agent) pair = null;
  }
  const width = s.box.clientWidth;
  const selected = ctx.selected?.kind === 'message' ? ctx.selected.id : null;
  const view = JSON.stringify([filters.agent, filters.scope, pair && [pair.from, pair.to], selected, past?.id, width]);
  const data = `${events.length}|${events.at(-1)?.id}`;
  const key = `${view}|${data}`;
  if (key !== s.key) {
    const wait = s.drawnAt + REDRAW_MS - performance.now();
    if (s.view === view && wait > 0) {
      // Only new events: redraw a little later, at most every REDRAW_MS.
      if (!s.timer) {
        s.timer = setTimeout(() => {
          s.timer = null;
          s.rerender();
        }, wait);
      }
    } else {
      s.key = key;
      s.view = view;
      s.drawnAt = performance.now();
      draw(s, ctx, width, selected);
      drawings += 1;
      drawTimes.push(performance.now() - s.drawnAt);
      if (drawTimes.length > DRAW_TIMES_KEPT) drawTimes.shift();
    }
  }
  if (s.follow && s.box.clientHeight > 0 && s.box.scrollTop + s.box.clientHeight < s.box.scrollHeight - 8) s.box.scrollTop = s.box.scrollHeight;
}

function draw(s, ctx, width, selectedId) {
  const { filters, model, past, events, actions } = ctx;
  const messages = collectMessages(events, FLOW_MESSAGES, messageFilter(model, filters, pair, past));
  const laneName = (key) => (key === CLI_KEY ? 'cli' : nameOf(model, key));
  replaceChildren(
    s.bar,
    pair
      ? el(
          'span',
          { class: 'chip pair', 'data-testid': 'flow-pair', 'data-from': pair.from, 'data-to': pair.to },
          `only ${laneName(pair.from)} → ${laneName(pair.to)} `,
          el('button', { type: 'button', class: 'link', 'data-testid': 'flow-pair-clear', 'aria-label': 'Show every pair', onclick: () => clearPair(ctx) }, '✕'),
        )
      : null,
    el('span', { class: 'muted', 'data-testid': 'flow-status' }, flowStatus(messages, filters, model, past)),
  );
  if (messages.length === 0) {
    replaceChildren(s.box, el('p', { class: 'empty', 'data-testid': 'flow-empty' }, filters.agent || filters.scope || pair ? 'No messages pass the filters.' : 'No messages yet.'));
    return;
  }
  const pinned = new Set([filters.agent, pair?.from, pair?.to].filter(Boolean));
  const { lanes, index } = layoutLanes(messages, model, past, width, pinned, filters.scope);
  const laneW = width / lanes.length;
  const x = (id) => index.get(id) * laneW + laneW / 2;
  const height = messages.length * ROW_H + 8;
  const header = el(
    'div',
    { class: 'flow-lanes', 'data-testid': 'flow-lanes', 'data-lanes': lanes.length },
    lanes.map((l) => {
      const cell = el('div', { class: `flow-lane-name kind-${l.kind}`, title: l.title, 'data-testid': 'flow-lane', 'data-kind': l.kind, 'data-members': l.members }, l.label);
      cell.style.width = `${laneW}px`; // CSSOM, not a style attribute (the CSP forbids those)
      return cell;
    }),
  );
  const who = (id) => nameOf(model, id);
  const drawing = svg(
    'svg',
    { width, height, viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': `Message flow between ${lanes.length} lanes` },
    svg('defs', {}, svg('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' }, svg('path', { d: 'M 0 0 L 10 5 L 0 10 z', class: 'arrowhead' }))),
    lanes.map((_, i) => svg('line', { x1: i * laneW + laneW / 2, y1: 0, x2: i * laneW + laneW / 2, y2: height, class: 'lane' })),
    messages.map((m, i) => {
      const y = 4 + i * ROW_H + ROW_H / 2 + 4;
      const targets = targetsOf(m);
      const selected = m.id === selectedId;
      const x1 = x(m.from);
      const text = `${who(m.from)} → ${targets.length ? targets.map(who).join(', ') : compact(m.to, 40)}: ${compact(m.payload, 200)}`;
      const left = Math.min(...[m.from, ...targets].map(x)) + 6;
      const room = Math.max(8, Math.floor((width - left - 4) / CHAR_W));
      return svg(
        'g',
        { class: `msg${selected ? ' selected' : ''}`, 'data-testid': 'flow-message', 'data-message-id': m.id, tabindex: 0, role: 'button', 'aria-label': `Message ${text}`, onclick: () => actions.selectMessage(m), onkeydown: (ev) => (ev.key === 'Enter' || ev.key === ' ') && actions.selectMessage(m) },
        svg('title', {}, `${clock(m.timestamp)} ${text}`),
        svg('rect', { x: 0, y: y - ROW_H + 6, width, height: ROW_H, class: 'hit' }),
        targets.length === 0
          ? svg('circle', { cx: x1, cy: y, r: 4, class: 'self' })
          : targets.map((t) => {
              const failed = m.failed.some((f) => f.recipient === t);
              const x2 = x(t);
              if (x2 === x1) {
                // Within one lane (a folded scope, the cli lane): a small loop.
                return svg('path', { d: `M ${x1} ${y - 3} h 18 v 6 h -16`, fill: 'none', class: failed ? 'arrow failed' : 'arrow', 'marker-end': 'url(#arrow)' });
              }
              return svg('line', { x1, y1: y, x2: x2 + (x2 > x1 ? -4 : 4), y2: y, class: failed ? 'arrow failed' : 'arrow', 'marker-end': 'url(#arrow)' });
            }),
        svg('text', { x: left, y: y - 4, class: 'msg-label', 'data-testid': 'flow-label' }, truncate(text, room)),
      );
    }),
  );
  replaceChildren(s.box, header, drawing);
}

function flowStatus(messages, filters, model, past) {
  const bits = [`${messages.length} newest messages${messages.length >= FLOW_MESSAGES ? ` (at most ${FLOW_MESSAGES})` : ''}`];
  if (filters.agent) bits.push(`with ${nameOf(model, filters.agent)}`);
  if (filters.scope) bits.push(`in ${model.scopes.get(filters.scope)?.name ?? filters.scope}`);
  if (past) bits.push(`up to ${clock(past.timestamp)}`);
  return bits.join(' · ');
}

function clearPair(ctx) {
  const from = pair?.from;
  pair = null;
  if (from && ctx.filters.agent === from) ctx.actions.setFilters({ agent: '' });
  else ctx.rerender();
}

function truncate(s, n) {
  const t = String(s ?? '');
  return t.length > n ? `${t.slice(0, n - 1)}…` : t;
}
