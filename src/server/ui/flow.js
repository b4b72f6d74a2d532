// The message flow: a sequence diagram of the messages in the window, one lane per
// participant, one arrow per delivery. Draws from the events app.js hands it; no MAP calls.
import { nameOf, recipientsOf } from './views.js';
import { compact, el, replaceChildren } from './util.js';

// Redrawn only when what it shows changed (see views.js).
const drawn = new WeakMap();
function once(root, key, draw) {
  if (drawn.get(root) === key) return;
  drawn.set(root, key);
  draw();
}

/** Messages in `events` (sent, then who got them), oldest first, at most `limit`. */
export function collectMessages(events, limit) {
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
  return [...byId.values()].filter((m) => m.eventId).slice(-limit);
}

const SVG = 'http://www.w3.org/2000/svg';
function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith('on') && typeof v === 'function') node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) if (c !== null && c !== undefined && c !== false) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

/** A sequence diagram: one lane per agent or participant, one arrow per delivery. */
export function renderFlow(root, messages, { model, selectedMessage }, actions) {
  const key = JSON.stringify([selectedMessage, messages.map((m) => [m.id, nameOf(model, m.from), m.delivered.map((r) => nameOf(model, r)), m.failed.length])]);
  once(root, key, () => drawFlow(root, messages, model, selectedMessage, actions));
}

function drawFlow(root, messages, model, selectedMessage, actions) {
  if (messages.length === 0) {
    replaceChildren(root, el('p', { class: 'empty', 'data-testid': 'flow-empty' }, 'No messages yet.'));
    return;
  }
  const lanes = [];
  const lane = (id) => {
    let i = lanes.indexOf(id);
    if (i < 0) {
      lanes.push(id);
      i = lanes.length - 1;
    }
    return i;
  };
  for (const m of messages) {
    lane(m.from);
    for (const r of targetsOf(m)) lane(r);
  }
  const laneW = 120;
  const rowH = 26;
  const top = 30;
  const width = Math.max(lanes.length * laneW, 240);
  const height = top + messages.length * rowH + 10;
  const x = (id) => lane(id) * laneW + laneW / 2;
  const drawing = svg(
    'svg',
    { width, height, viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': `Message flow between ${lanes.length} participants` },
    svg('defs', {}, svg('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' }, svg('path', { d: 'M 0 0 L 10 5 L 0 10 z', class: 'arrowhead' }))),
    lanes.map((id) => [
      svg('text', { x: x(id), y: 16, 'text-anchor': 'middle', class: 'lane-label' }, truncate(nameOf(model, id), 16)),
      svg('line', { x1: x(id), y1: 22, x2: x(id), y2: height, class: 'lane' }),
    ]),
    messages.map((m, i) => {
      const y = top + i * rowH + rowH / 2;
      const targets = targetsOf(m);
      const selected = m.id === selectedMessage;
      return svg(
        'g',
        { class: `msg${selected ? ' selected' : ''}`, 'data-testid': 'flow-message', 'data-message-id': m.id, tabindex: 0, role: 'button', 'aria-label': `Message from ${nameOf(model, m.from)}`, onclick: () => actions.selectMessage(m), onkeydown: (ev) => (ev.key === 'Enter' || ev.key === ' ') && actions.selectMessage(m) },
        svg('rect', { x: 0, y: y - rowH / 2, width, height: rowH, class: 'hit' }),
        targets.length === 0
          ? svg('circle', { cx: x(m.from), cy: y, r: 4, class: 'self' })
          : targets.map((t) => {
              const failed = m.failed.some((f) => f.recipient === t);
              const x1 = x(m.from);
              const x2 = x(t);
              return svg('line', { x1, y1: y, x2: x2 === x1 ? x1 + 30 : x2 + (x2 > x1 ? -4 : 4), y2: y, class: failed ? 'arrow failed' : 'arrow', 'marker-end': 'url(#arrow)' });
            }),
        svg('text', { x: Math.min(...[m.from, ...targets].map(x)) + 8, y: y - 4, class: 'msg-label' }, truncate(compact(m.payload, 60), 40)),
      );
    }),
  );
  const stick = root.scrollTop + root.clientHeight >= root.scrollHeight - 8;
  replaceChildren(root, drawing);
  if (stick) root.scrollTop = root.scrollHeight;
}

function targetsOf(m) {
  const out = [...m.delivered, ...m.failed.map((f) => f.recipient)];
  if (out.length === 0 && m.to && typeof m.to === 'object' && typeof m.to.agent === 'string') out.push(m.to.agent);
  return [...new Set(out)];
}

function truncate(s, n) {
  const t = String(s ?? '');
  return t.length > n ? `${t.slice(0, n - 1)}…` : t;
}

