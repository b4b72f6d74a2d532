// Rendering: each function draws one part of the page from the state app.js hands it, and
// calls back through `actions` (select, steer, travel). No MAP calls here.
import { agentsOf, scopesOf } from './model.js';
import { clock, compact, el, num, pretty, replaceChildren } from './util.js';

// Parts of the page are redrawn only when what they show changed: a node replaced under the
// pointer between mousedown and mouseup loses the click, and events arrive all the time.
const drawn = new WeakMap();
function once(root, key, draw) {
  if (drawn.get(root) === key) return;
  drawn.set(root, key);
  draw();
}

/**
 * Every event type a subscriber can get (the router's `EventType::ALL` but its internal
 * records; tests/ui.rs keeps the two equal): the type filter offers each, seen or not.
 */
export const ALL_TYPES = ['agent_registered', 'agent_unregistered', 'agent_state_changed', 'agent_orphaned', 'agent_environment_changed', 'agent.metadata.changed', 'agent.presence.changed', 'agent.injected', 'agent.stderr', 'agent.diagnostic', 'agent.spawning', 'agent.spawn.failed', 'participant_connected', 'participant_disconnected', 'message_sent', 'message_delivered', 'message_failed', 'message.queued', 'scope_created', 'scope_deleted', 'scope_member_joined', 'scope_member_left', 'subscription.overflow', 'permissions_client_updated', 'permissions_agent_updated', 'trajectory.checkpoint', 'task.created', 'task.assigned', 'task.status', 'task.completed', 'task.updated', 'mail.created', 'mail.closed', 'mail.participant.joined', 'mail.participant.left', 'mail.turn.added', 'mail.thread.created'];

/**
 * The gateway an agent came through (`im`, `mamp`, `aip`, `a2a`), or null for the user's own
 * agents: the gateways mark the agents they register in their metadata (docs/gateways.md,
 * docs/aip.md, docs/a2a.md).
 */
export function gatewayOf(agent) {
  const m = agent?.metadata;
  if (!m || typeof m !== 'object') return null;
  if (typeof m.gateway === 'string') return m.gateway;
  if (m.aip && typeof m.aip === 'object') return 'aip';
  if (m.a2a && typeof m.a2a === 'object') return 'a2a';
  return null;
}

/** A MAP address for people: names instead of ids (`worker-1`, `scope team`, `role reviewer`). */
export function addressText(model, to) {
  const who = (id) => nameOf(model, id);
  if (typeof to === 'string') return who(to);
  if (!to || typeof to !== 'object') return compact(to, 60);
  if (typeof to.agent === 'string') return to.system ? `${who(to.agent)} @ ${to.system}` : who(to.agent);
  if (Array.isArray(to.agents)) return to.agents.map(who).join(', ');
  if (typeof to.scope === 'string') return `scope ${model?.scopes.get(to.scope)?.name ?? to.scope}`;
  if (typeof to.role === 'string') return `role ${to.role}${to.within ? ` in ${model?.scopes.get(to.within)?.name ?? to.within}` : ''}`;
  if (typeof to.parent === 'string' || to.parent === true) return 'parent';
  if (to.children !== undefined) return 'children';
  if (to.broadcast) return 'everyone';
  return compact(to, 60);
}

const KNOWN_STATES = new Set(['registered', 'active', 'busy', 'idle', 'suspended', 'stopping', 'stopped', 'failed', 'orphaned']);

function stateClass(state) {
  return `state state-${KNOWN_STATES.has(state) ? state : 'custom'}`;
}

/** Display name of an agent or participant id. */
export function nameOf(model, id) {
  if (id === 'system') return 'router';
  const a = model?.agents.get(id);
  if (a) return a.name ?? a.id;
  const p = model?.participants.get(id);
  return p?.name ?? id;
}

// ---------------------------------------------------------------------------------------------
// Agent tree

/** The hierarchy of `model`, each node a button that selects the agent. */
export function renderTree(root, model, { selectedId, mode }, actions) {
  root.dataset.mode = mode;
  const key = JSON.stringify([
    mode,
    selectedId,
    // Of a process, only what a node shows (its stderr lines would redraw the tree at each one).
    [...model.agents.values()].map((a) => {
      const p = model.procs.get(a.id);
      return [a.id, a.name, a.role, a.state, a.node, a.parent, a.scopes, p ? [p.pid, p.restarts, p.exitCode, p.signal] : null];
    }),
    [...model.scopes.values()].map((s) => [s.id, s.name]),
  ]);
  once(root, key, () => drawTree(root, model, selectedId, actions));
}

/**
 * Each tree's last drawing: its shape (which agent at which place) and its agent buttons by
 * id. While the shape stays the same, a redraw updates the buttons in place instead of
 * replacing them: a click is a mousedown and a mouseup on the same element, and the browser
 * drops the click when that element leaves the document in between (an event arriving
 * mid-click would otherwise lose it). The buttons' parts take no pointer events (style.css),
 * so the element pressed is the button itself.
 */
const treeDrawings = new WeakMap();

/** Walks the forest in drawing order: `visit(agent, level, children)` once per agent. */
function walkTree(model, agents, level, visit, seen = new Set()) {
  for (const a of agents) {
    if (seen.has(a.id)) continue;
    seen.add(a.id);
    const kids = model.children(a.id);
    visit(a, level, kids);
    walkTree(model, kids, level + 1, visit, seen);
  }
}

/** Makes `kept` look exactly like `fresh` (attributes and content), keeping the element. */
function morph(kept, fresh) {
  for (const { name } of [...kept.attributes]) if (!fresh.hasAttribute(name)) kept.removeAttribute(name);
  for (const { name, value } of [...fresh.attributes]) if (kept.getAttribute(name) !== value) kept.setAttribute(name, value);
  if (kept.innerHTML !== fresh.innerHTML) kept.replaceChildren(...fresh.childNodes);
}

function drawTree(root, model, selectedId, actions) {
  // The user's own agents first; the agents the gateways registered for outside callers after
  // them, under their own heading.
  const all = model.roots();
  const own = all.filter((a) => !gatewayOf(a));
  const through = all.filter((a) => gatewayOf(a));
  const roots = [...own, ...through];
  if (roots.length === 0) {
    treeDrawings.delete(root);
    replaceChildren(root, el('p', { class: 'empty', 'data-testid': 'tree-empty' }, 'No agents.'));
    return;
  }
  const shape = [own.length];
  walkTree(model, roots, 1, (a, level, kids) => shape.push([a.id, level, kids.length > 0]));
  const shapeKey = JSON.stringify(shape);
  const last = treeDrawings.get(root);
  if (last?.shapeKey === shapeKey) {
    walkTree(model, roots, 1, (a) => {
      const button = last.buttons.get(a.id);
      morph(button, agentNode(model, a, a.id === selectedId, actions));
      button.parentElement.setAttribute('aria-selected', a.id === selectedId ? 'true' : 'false');
    });
    return;
  }
  const buttons = new Map();
  const keep = (button) => {
    buttons.set(button.dataset.agentId, button);
    return button;
  };
  const seen = new Set();
  const branch = (agents, level, label = 'Agents') =>
    el(
      'ul',
      { role: level === 1 ? 'tree' : 'group', 'aria-label': level === 1 ? label : null },
      agents.map((a) => {
        if (seen.has(a.id)) return null;
        seen.add(a.id);
        const kids = model.children(a.id);
        return el(
          'li',
          { role: 'treeitem', 'aria-level': level, 'aria-selected': a.id === selectedId ? 'true' : 'false', 'aria-expanded': kids.length ? 'true' : null },
          keep(agentNode(model, a, a.id === selectedId, actions)),
          kids.length ? branch(kids, level + 1) : null,
        );
      }),
    );
  replaceChildren(
    root,
    own.length ? branch(own, 1) : null,
    through.length ? [el('h3', { class: 'tree-heading', 'data-testid': 'gateway-agents' }, `Through gateways (${through.length})`), branch(through, 1, 'Agents through gateways')] : null,
  );
  treeDrawings.set(root, { shapeKey, buttons });
}

function agentNode(model, a, selected, actions) {
  const p = model.procs.get(a.id);
  const procBits = [];
  if (p?.pid) procBits.push(`pid ${p.pid}`);
  if (p && (p.pid || p.restarts || p.exitCode !== null)) procBits.push(`restarts ${p.restarts}`);
  if (p && p.exitCode !== null && p.exitCode !== undefined) procBits.push(`exit ${p.exitCode}`);
  if (p && p.signal !== null && p.signal !== undefined) procBits.push(`signal ${p.signal}`);
  return el(
    'button',
    {
      type: 'button',
      class: `agent-node${selected ? ' selected' : ''}`,
      'data-testid': 'agent-node',
      'data-agent-id': a.id,
      'data-state': a.state,
      'aria-pressed': selected ? 'true' : 'false',
      onclick: () => actions.selectAgent(a.id),
    },
    el('span', { class: 'agent-name' }, a.name ?? a.id),
    a.role ? el('span', { class: 'agent-role' }, a.role) : null,
    el('span', { class: stateClass(a.state), 'data-testid': 'agent-state' }, a.state),
    a.node ? el('span', { class: 'chip node', title: `on node ${a.node}`, 'data-testid': 'agent-node-name' }, a.node) : null,
    gatewayOf(a) ? el('span', { class: 'chip gateway', title: `registered by the ${gatewayOf(a)} gateway`, 'data-testid': 'agent-gateway' }, `via ${gatewayOf(a)}`) : null,
    (a.scopes ?? []).map((s) => el('span', { class: 'chip', title: `scope ${s}` }, model.scopes.get(s)?.name ?? s)),
    procBits.length ? el('span', { class: 'proc', 'data-testid': 'agent-proc' }, procBits.join(' · ')) : null,
  );
}

/** Scopes with their member counts. */
export function renderScopes(root, model) {
  const scopes = [...model.scopes.values()];
  const key = JSON.stringify([scopes, [...model.agents.values()].map((a) => a.scopes)]);
  once(root, key, () => drawScopes(root, model, scopes));
}

function drawScopes(root, model, scopes) {
  if (scopes.length === 0) {
    replaceChildren(root, el('p', { class: 'empty' }, 'No scopes.'));
    return;
  }
  const members = (id) => [...model.agents.values()].filter((a) => (a.scopes ?? []).includes(id)).length;
  replaceChildren(
    root,
    el(
      'ul',
      { class: 'scopes' },
      scopes.map((s) =>
        el('li', { 'data-testid': 'scope', 'data-scope-id': s.id }, el('span', { class: 'chip' }, s.name ?? s.id), ` ${members(s.id)} members`, s.parent ? ` · in ${s.parent}` : ''),
      ),
    ),
  );
}

// ---------------------------------------------------------------------------------------------
// Event stream

/** Whether an event passes the stream's filters. */
export function matches(event, filters) {
  if (filters.type && event.type !== filters.type) return false;
  if (filters.agent && !agentsOf(event).has(filters.agent)) return false;
  if (filters.scope && !scopesOf(event).has(filters.scope)) return false;
  return true;
}

/** The recipients of a message_failed or message.queued: one (`recipient`) or a multicast's (`recipients`). */
export function recipientsOf(d) {
  return typeof d.recipient === 'string' ? [d.recipient] : Array.isArray(d.recipients) ? d.recipients : [];
}

/** A one-line description of an event. */
export function summarize(event, model) {
  const d = event.data ?? {};
  const who = (id) => nameOf(model, id);
  switch (event.type) {
    case 'message_sent':
      return `${who(d.from)} → ${addressText(model, d.to ?? d.message?.to)}: ${compact(d.payload ?? d.message?.payload, 120)}`;
    case 'message_delivered':
      // A multicast's one event lists every recipient and leaves the payload in message_sent.
      return `${who(d.from)} → ${(d.deliveredTo ?? []).map(who).join(', ')}${d.payload !== undefined || d.message ? `: ${compact(d.payload ?? d.message?.payload, 120)}` : ''}`;
    case 'message_failed':
      return `${who(d.from)} ↛ ${recipientsOf(d).map(who).join(', ')}: ${d.reason}`;
    case 'message.queued':
      return `${who(d.from)} ⇢ ${recipientsOf(d).map(who).join(', ')} (kept: ${d.reason})`;
    case 'agent_state_changed':
      return `${who(d.agentId)}: ${d.previousState} → ${d.newState}${d.reason ? ` (${d.reason})` : ''}${d.exitCode !== undefined ? ` exit ${d.exitCode}` : ''}${d.signal !== undefined ? ` signal ${d.signal}` : ''}`;
    case 'agent_registered':
      return `${d.name ?? d.agentId}${d.role ? ` (${d.role})` : ''}${d.parent ? ` under ${who(d.parent)}` : ''}`;
    case 'agent_unregistered':
      return `${who(d.agentId)}${d.reason ? ` (${d.reason})` : ''}`;
    case 'agent.metadata.changed':
      return `${who(d.agentId)}: ${compact(d.changes, 140)}`;
    case 'agent.presence.changed':
      return `${who(d.agentId)}: ${d.status}${d.node ? ` on ${d.node}` : ''}`;
    case 'agent.stderr':
      return `${who(d.agentId)} [pid ${d.pid}]: ${(d.lines ?? []).join(' ⏎ ')}`;
    case 'agent.spawning':
      return `${who(d.agentId)}: ${d.program} pid ${d.pid}`;
    case 'agent.injected':
      return `${who(d.agentId)} (${d.delivery}${d.injected ? '' : ', not delivered'}): ${compact(d.content, 100)}`;
    case 'scope_member_joined':
    case 'scope_member_left':
      return `${who(d.agentId)} ${event.type === 'scope_member_joined' ? 'joined' : 'left'} ${model?.scopes.get(d.scopeId)?.name ?? d.scopeId}`;
    case 'participant_connected':
    case 'participant_disconnected':
      return `${d.name ?? who(d.participantId)} (${d.participantType})${d.reason ? `: ${d.reason}` : ''}`;
    case 'trajectory.checkpoint':
      return `${who(d.checkpoint?.agentId)}: ${d.checkpoint?.label ?? d.checkpoint?.id}`;
    default:
      return compact(d, 160);
  }
}

/**
 * The event list: the newest `limit` events of `events` that pass the filters, newest last.
 * `expanded` is the set of event ids whose JSON is open.
 */
export function renderEvents(root, events, { filters, expanded, model, limit, canTravel, emptyText = 'No events.' }, actions) {
  const brief = briefClients(events, filters);
  const rows = [];
  for (let i = events.length - 1; i >= 0 && rows.length < limit; i--) {
    const e = events[i];
    if (brief.hidden.has(e.id)) continue;
    if (matches(e, filters)) rows.push(e);
  }
  rows.reverse();
  const stick = root.scrollTop + root.clientHeight >= root.scrollHeight - 8;
  // Rows are kept by event id: only new rows are inserted and old ones removed, so a row under
  // the pointer stays where it is.
  const text = (e) => (brief.lasted.has(e.id) ? `${e.data?.name ?? nameOf(model, e.data?.participantId)} (client): connected for ${num(brief.lasted.get(e.id))} ms` : summarize(e, model));
  const rowKey = (e) => `${e.id}|${expanded.has(e.id)}|${canTravel}|${text(e)}`;
  const wanted = new Map(rows.map((e) => [rowKey(e), e]));
  for (const child of [...root.children]) {
    if (!wanted.has(child.dataset.rowKey)) child.remove();
  }
  let cursor = root.firstElementChild;
  for (const [k, e] of wanted) {
    if (cursor && cursor.dataset.rowKey === k) {
      cursor = cursor.nextElementSibling;
      continue;
    }
    const row = eventRow(e, { expanded, model, canTravel, text: text(e), merged: brief.lasted.has(e.id) }, actions);
    row.dataset.rowKey = k;
    root.insertBefore(row, cursor);
  }
  if (rows.length === 0) root.append(el('li', { class: 'empty', 'data-row-key': `empty|${emptyText}` }, emptyText));
  if (stick) root.scrollTop = root.scrollHeight;
}

/** What `map/traces/get` is asked for an event's trace, or null for an event in no trace. */
export function traceAnchorOf(e) {
  const d = e.data ?? {};
  if (e.type.startsWith('message') && typeof d.messageId === 'string') return { messageId: d.messageId };
  if (['agent.spawning', 'agent.injected', 'trajectory.checkpoint'].includes(e.type) || e.type.startsWith('task.')) return { eventId: e.id };
  return null;
}

/** A client connected for less than this, with nothing in between shown, is one row. */
const BRIEF_MS = 10_000;

/**
 * Short-lived clients (a CLI call): their `participant_connected` and `participant_disconnected`
 * become one row, at the disconnect ("connected for 40 ms"). `hidden` holds the connects folded
 * away, `lasted` the disconnects' durations. Not when the type filter asks for either type.
 */
function briefClients(events, filters) {
  const hidden = new Set();
  const lasted = new Map();
  if (filters.type === 'participant_connected' || filters.type === 'participant_disconnected') return { hidden, lasted };
  const connected = new Map();
  for (const e of events) {
    const d = e.data ?? {};
    if (e.type === 'participant_connected' && d.participantType === 'client') {
      connected.set(d.participantId, e);
    } else if (e.type === 'participant_disconnected') {
      const c = connected.get(d.participantId);
      connected.delete(d.participantId);
      if (c && e.timestamp - c.timestamp < BRIEF_MS) {
        hidden.add(c.id);
        lasted.set(e.id, Math.max(0, e.timestamp - c.timestamp));
      }
    }
  }
  return { hidden, lasted };
}

function eventRow(e, { expanded, model, canTravel, text, merged }, actions) {
  return el(
        'li',
        { class: `event type-${e.type.replace(/[^a-z]/gi, '-')}`, 'data-testid': 'event-row', 'data-event-id': e.id, 'data-type': e.type, 'data-merged': merged ? 'true' : null, title: e.type },
        el('time', { datetime: new Date(e.timestamp).toISOString() }, clock(e.timestamp)),
        el('span', { class: 'etype' }, merged ? 'client connected' : e.type),
        el(
          'button',
          { type: 'button', class: 'summary', 'aria-expanded': expanded.has(e.id) ? 'true' : 'false', onclick: () => actions.toggleEvent(e) },
          text,
        ),
        traceAnchorOf(e)
          ? el('button', { type: 'button', class: 'travel', 'data-testid': 'trace-here', title: 'Show the trace this event is part of', 'aria-label': 'Show its trace', onclick: () => actions.showTrace(traceAnchorOf(e)) }, '⌁')
          : el('span', {}),
        canTravel
          ? el('button', { type: 'button', class: 'travel', 'data-testid': 'travel-here', title: 'Show the system as it was after this event', 'aria-label': 'Time travel to this event', onclick: () => actions.travelTo(e.id) }, '◀')
          : null,
        expanded.has(e.id) ? el('pre', { class: 'json' }, pretty(e)) : null,
      );
}

/** Replaces a <select>'s options when the set changed (keeps the user's choice otherwise). */
export function fillSelect(select, options, allLabel) {
  const key = JSON.stringify(options);
  if (select.dataset.key === key) return;
  const current = select.value;
  select.dataset.key = key;
  replaceChildren(select, el('option', { value: '' }, allLabel), options.map(([value, label]) => el('option', { value }, label)));
  select.value = options.some(([v]) => v === current) ? current : '';
}

// ---------------------------------------------------------------------------------------------
// Detail panes

/** One message: envelope, payload, and its W3C trace context when present. */
export function renderMessageDetail(root, m, model, actions) {
  once(root, JSON.stringify(['message', m.id, m.delivered, m.failed, nameOf(model, m.from)]), () => drawMessageDetail(root, m, model, actions));
}

/** The detail pane's text when nothing is selected. */
export function renderPlaceholder(root) {
  once(root, 'placeholder', () => replaceChildren(root, el('p', { class: 'muted' }, 'Select an agent or a message.')));
}

function drawMessageDetail(root, m, model, actions) {
  const meta = m.message?.meta ?? {};
  replaceChildren(
    root,
    el(
      'section',
      { 'data-testid': 'message-detail', 'aria-label': 'Message detail' },
      el('h2', {}, 'Message'),
      actions ? el('button', { type: 'button', 'data-testid': 'message-trace', title: 'The whole trace of this message across agents', onclick: () => actions.showTrace({ messageId: m.id }) }, 'Show its trace') : null,
      el(
        'dl',
        {},
        el('dt', {}, 'id'),
        el('dd', {}, m.id),
        el('dt', {}, 'from'),
        el('dd', {}, `${nameOf(model, m.from)} (${m.from})`),
        el('dt', {}, 'to'),
        el('dd', {}, addressText(model, m.to)),
        el('dt', {}, 'delivered to'),
        el('dd', {}, m.delivered.map((r) => nameOf(model, r)).join(', ') || '–'),
        m.failed.length ? [el('dt', {}, 'failed'), el('dd', {}, m.failed.map((f) => `${nameOf(model, f.recipient)}: ${f.reason}`).join(', '))] : null,
        el('dt', {}, 'sent'),
        el('dd', {}, clock(m.timestamp)),
        meta.traceparent ? [el('dt', {}, 'traceparent'), el('dd', { 'data-testid': 'traceparent' }, String(meta.traceparent))] : null,
        meta.tracestate ? [el('dt', {}, 'tracestate'), el('dd', {}, String(meta.tracestate))] : null,
      ),
      el('h3', {}, 'Payload'),
      el('pre', { class: 'json', 'data-testid': 'message-payload' }, pretty(m.payload)),
      el('h3', {}, 'Meta'),
      el('pre', { class: 'json' }, pretty(meta)),
    ),
  );
}

function usageLine(u, testid) {
  if (!u) return el('span', { 'data-testid': testid, class: 'muted' }, 'not reported');
  return el(
    'span',
    { 'data-testid': testid, 'data-input-tokens': u.inputTokens, 'data-output-tokens': u.outputTokens, 'data-cost-usd': u.costUsd },
    `in ${num(u.inputTokens)} · out ${num(u.outputTokens)} tokens · $${num(u.costUsd, 4)}`,
    u.agents !== undefined ? ` (${u.agents} reporting)` : '',
  );
}

/**
 * One agent: record, process, usage, checkpoints and (when allowed and live) steering.
 * `cp` is the state of the `trajectory/list` call: {status, list, error}.
 */
export function renderAgentDetail(root, model, agentId, { cp, past, caps, steer, injectForm }, actions) {
  const a = model.agents.get(agentId);
  // The frame changes with the agent; its two parts (what it is, how to steer it) each only
  // when what they show changed.
  once(root, JSON.stringify([agentId, !!a, !!past]), () => {
    if (!a) {
      replaceChildren(root, el('section', { 'data-testid': 'agent-detail', 'data-agent-id': agentId }, el('h2', {}, agentId), el('p', { class: 'muted' }, past ? 'This agent did not exist at this point.' : 'This agent is gone.')));
    } else {
      replaceChildren(root, el('section', { 'data-testid': 'agent-detail', 'data-agent-id': agentId, 'aria-label': `Agent ${a.name ?? a.id}` }, el('div', { class: 'detail-info' }), el('div', { class: 'detail-steer' })));
    }
  });
  if (!a) return;
  const [info, steerRoot] = root.firstElementChild.children;
  const p = model.procs.get(agentId);
  const own = model.usageOf(agentId);
  const total = model.subtreeUsage(agentId);
  const checkpoints = mergeCheckpoints(cp?.agentId === agentId ? cp.list : [], model.checkpointsOf(agentId), past?.timestamp);
  const cpStatus = cp?.agentId === agentId ? cp.status : 'loading';
  const canStop = caps?.lifecycle?.canStop === true;
  const canSteer = caps?.lifecycle?.canSteer === true;
  const note = steer?.agentId === agentId ? steer : null;
  once(steerRoot, JSON.stringify([!!past, canStop, canSteer, note]), () =>
    replaceChildren(
      steerRoot,
      past ? el('p', { class: 'muted' }, 'Steering is off while you look at the past.') : steeringSection(a, { canStop, canSteer, steer: note, injectForm }, actions),
    ),
  );
  once(info, JSON.stringify([a, p ?? null, own, total, checkpoints, cpStatus, cp?.error ?? null, a.parent ? nameOf(model, a.parent) : null]), () =>
    replaceChildren(
      info,
      el('h2', {}, a.name ?? a.id, ' ', el('span', { class: stateClass(a.state), 'data-testid': 'detail-state' }, a.state)),
      el(
        'dl',
        {},
        el('dt', {}, 'id'),
        el('dd', {}, a.id),
        a.role ? [el('dt', {}, 'role'), el('dd', {}, a.role)] : null,
        el('dt', {}, 'owner'),
        el('dd', {}, a.ownerId ? (nameOf(model, a.ownerId) === a.ownerId ? a.ownerId : `${nameOf(model, a.ownerId)} (${a.ownerId})`) : '– (orphaned)'),
        a.parent ? [el('dt', {}, 'parent'), el('dd', {}, `${nameOf(model, a.parent)} (${a.parent})`)] : null,
        el('dt', {}, 'scopes'),
        el('dd', {}, (a.scopes ?? []).map((s) => model.scopes.get(s)?.name ?? s).join(', ') || '–'),
        a.visibility ? [el('dt', {}, 'visibility'), el('dd', {}, a.visibility)] : null,
        a.lifecycle?.createdAt ? [el('dt', {}, 'created'), el('dd', {}, clock(a.lifecycle.createdAt))] : null,
      ),
      el('h3', {}, 'Usage'),
      el('dl', { 'data-testid': 'usage' }, el('dt', {}, 'own'), el('dd', {}, usageLine(own, 'usage-own')), el('dt', {}, 'with descendants'), el('dd', {}, usageLine(total.agents ? total : null, 'usage-total'))),
      p ? processSection(p) : null,
      el('h3', {}, 'Metadata'),
      el('pre', { class: 'json', 'data-testid': 'agent-metadata' }, pretty(a.metadata ?? {})),
      el('h3', {}, 'Trajectory checkpoints'),
      checkpointSection(cpStatus, cp, checkpoints, actions),
    ),
  );
  // The stderr tail opens at its newest lines.
  const tail = info.querySelector('[data-testid="stderr-tail"]');
  if (tail && tail.dataset.shown !== String(tail.textContent.length)) {
    tail.dataset.shown = String(tail.textContent.length);
    tail.scrollTop = tail.scrollHeight;
  }
}

function processSection(p) {
  return [
    el('h3', {}, 'Process'),
    el(
      'dl',
      { 'data-testid': 'process' },
      el('dt', {}, 'pid'),
      el('dd', { 'data-testid': 'process-pid' }, p.pid ?? '–'),
      p.program ? [el('dt', {}, 'program'), el('dd', {}, p.program)] : null,
      el('dt', {}, 'restarts'),
      el('dd', { 'data-testid': 'process-restarts' }, p.restarts),
      el('dt', {}, 'last exit'),
      el('dd', { 'data-testid': 'process-exit' }, p.exitCode !== null && p.exitCode !== undefined ? `code ${p.exitCode}` : p.signal !== null && p.signal !== undefined ? `signal ${p.signal}` : 'none'),
      p.exitReason ? [el('dt', {}, 'reason'), el('dd', {}, p.exitReason)] : null,
      p.error ? [el('dt', {}, 'spawn error'), el('dd', {}, p.error)] : null,
    ),
    el('h4', {}, 'stderr (tail)', p.dropped ? ` · ${p.dropped} lines dropped by the rate limit` : ''),
    el('pre', { class: 'stderr', 'data-testid': 'stderr-tail' }, p.stderr.length ? p.stderr.join('\n') : '(nothing yet)'),
  ];
}

function mergeCheckpoints(listed, fromEvents, until) {
  const byId = new Map();
  for (const cp of [...(listed ?? []), ...(fromEvents ?? [])]) if (cp?.id) byId.set(cp.id, cp);
  return [...byId.values()]
    .filter((cp) => until === undefined || (cp.timestamp ?? 0) <= until)
    .sort((a, b) => (a.timestamp ?? 0) - (b.timestamp ?? 0) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}

function checkpointSection(status, cp, checkpoints, actions) {
  if (status === 'unavailable') {
    return el('p', { 'data-testid': 'checkpoints', 'data-status': 'unavailable', class: 'muted' }, 'Trajectory checkpoints are not available on this router (trajectory/list: method not found).');
  }
  if (status === 'error') {
    return el('p', { 'data-testid': 'checkpoints', 'data-status': 'error', class: 'error' }, `Could not read checkpoints: ${cp.error}`, ' ', el('button', { type: 'button', onclick: () => actions.reloadCheckpoints() }, 'Retry'));
  }
  if (checkpoints.length === 0) {
    return el('p', { 'data-testid': 'checkpoints', 'data-status': status, class: 'muted' }, status === 'loading' ? 'Loading…' : 'No checkpoints.');
  }
  return el(
    'ol',
    { 'data-testid': 'checkpoints', 'data-status': status, class: 'checkpoints' },
    checkpoints.map((c) =>
      el(
        'li',
        { 'data-testid': 'checkpoint', 'data-checkpoint-id': c.id },
        el('time', {}, clock(c.timestamp)),
        ' ',
        el('strong', {}, c.label ?? c.id),
        c.sessionId ? el('span', { class: 'muted' }, ` session ${c.sessionId}`) : null,
        c.metadata ? el('pre', { class: 'json' }, compact(c.metadata, 300)) : null,
      ),
    ),
  );
}

function steeringSection(a, { canStop, canSteer, steer, injectForm }, actions) {
  if (!canStop && !canSteer) {
    return el('p', { class: 'muted', 'data-testid': 'steering-none' }, 'Your principal may not steer agents.');
  }
  const note = steer;
  return el(
    'section',
    { 'data-testid': 'steering', 'aria-label': 'Steering' },
    el('h3', {}, 'Steering'),
    canStop
      ? el(
          'div',
          { class: 'buttons' },
          el('button', { type: 'button', 'data-testid': 'stop', onclick: () => actions.steer('map/agents/stop', { agentId: a.id, reason: 'stopped from the dashboard' }) }, 'Stop'),
          el('button', { type: 'button', 'data-testid': 'suspend', onclick: () => actions.steer('map/agents/suspend', { agentId: a.id, reason: 'suspended from the dashboard' }) }, 'Suspend'),
          el('button', { type: 'button', 'data-testid': 'resume', onclick: () => actions.steer('map/agents/resume', { agentId: a.id }) }, 'Resume'),
        )
      : null,
    canSteer ? injectForm : null,
    note ? el('p', { role: 'status', class: note.error ? 'error' : 'ok', 'data-testid': note.error ? 'steer-error' : 'steer-result' }, note.text) : null,
  );
}
