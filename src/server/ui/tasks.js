// The tasks board (issue 46): the tasks extension's tasks and the A2A gateway's (an A2A task is
// a MAP task, docs/a2a.md), one column per status, each card with its title, assignee and
// history.
//
// Where it reads from (with the viewer's own permissions: the router filters both):
//   - `map/tasks/list` (paged) when the view is first drawn on a connection: the store's tasks
//     as they are, so the board survives a restart and retention;
//   - `observe(event)`: every `task.*` event of the log, from its start (history, then live).
//     Each carries the whole task after the change, so an event is enough to move a card; and
//     each is a line of that task's history;
//   - a card's history, when opened: `map/replay {filter: {tasks: {taskIds: [id]}}}`, merged
//     with what was observed.
// In the past (time travel) the board shows each task as of the moment looked at, from its
// history (tasks known only from the listing, created before that moment, as they are now).
import { nameOf } from './views.js';
import { clock, compact, compareIds, el, replaceChildren } from './util.js';

/** The statuses of docs/tasks.md, one column each, in this order. */
export const STATUSES = ['open', 'in_progress', 'blocked', 'completed', 'failed'];
const LABELS = { open: 'Open', in_progress: 'In progress', blocked: 'Blocked', completed: 'Completed', failed: 'Failed' };
/** Tasks kept (the most recently changed; the oldest changed go first). */
export const TASKS_CAP = 5000;
/** History lines kept per task (the newest). */
export const HISTORY_PER_TASK = 100;
/** Cards drawn per column (the most recently changed). */
export const CARDS_PER_COLUMN = 100;
/** Pages of `map/tasks/list` read at most (1 000 a page). */
const LIST_PAGES = 5;
/** The board is redrawn at most this often while tasks change. */
const REDRAW_MS = 250;

// ---------------------------------------------------------------------------------------------
// State (one owner: this module)

const S = {
  /** @type {Map<string, object>} task id → the newest task record seen (wire shape) */
  tasks: new Map(),
  /** @type {Map<string, Array<object>>} task id → history lines, oldest first */
  history: new Map(),
  /** Bumped at every change of what the board shows. */
  version: 0,
  /** The client the listing was read with (read again on a new connection). */
  listedWith: null,
  /** 'idle' | 'loading' | 'loaded' | 'unavailable' | 'refused' | 'error' */
  status: 'idle',
  error: '',
  /** The task whose history is open, and how its replay went. */
  open: null,
  replay: { taskId: null, status: 'idle', error: '' },
  lastDraw: 0,
  drawTimer: null,
};

/** Task ids whose record came from the listing (not from an event). */
const listed = new Set();

/**
 * The task's card: what the board and its history show of it. Events come in log order, so an
 * event's record replaces the one of an earlier event; the listing's record is the task as it
 * was when it was read, replaced only by a record changed later (an event of the history read
 * after the listing, with the same `updatedAt`, is not newer).
 */
function put(task, fromList = false) {
  if (!task || typeof task.id !== 'string') return;
  const prev = S.tasks.get(task.id);
  if (prev) {
    const older = (task.updatedAt ?? 0) < (prev.updatedAt ?? 0);
    const same = (task.updatedAt ?? 0) === (prev.updatedAt ?? 0);
    if (older || (same && !fromList && listed.has(task.id))) return;
  }
  if (fromList) listed.add(task.id);
  else listed.delete(task.id);
  S.tasks.delete(task.id); // re-inserted: the map's order is the order of the last change
  S.tasks.set(task.id, task);
  if (S.tasks.size > TASKS_CAP) {
    const oldest = S.tasks.keys().next().value;
    S.tasks.delete(oldest);
    S.history.delete(oldest);
    listed.delete(oldest);
  }
  S.version++;
}

/** One history line from a `task.*` event (once per event id). */
function line(event) {
  const d = event.data ?? {};
  const id = d.taskId ?? d.task?.id;
  if (typeof id !== 'string') return;
  let lines = S.history.get(id);
  if (!lines) {
    lines = [];
    S.history.set(id, lines);
    if (S.history.size > TASKS_CAP) S.history.delete(S.history.keys().next().value);
  }
  if (lines.some((l) => l.eventId === event.id)) return;
  const t = d.task ?? {};
  const entry = {
    eventId: event.id,
    type: event.type,
    timestamp: event.timestamp,
    source: event.source ?? null,
    status: t.status ?? d.current ?? null,
    previous: d.previous ?? null,
    assignee: t.assignee ?? d.agentId ?? null,
    title: t.title ?? null,
    result: event.type === 'task.completed' ? d.result : undefined,
  };
  // Events arrive in log order; a replayed one may be older than the lines observed.
  let i = lines.length;
  while (i > 0 && compareIds(lines[i - 1].eventId, entry.eventId) > 0) i--;
  lines.splice(i, 0, entry);
  if (lines.length > HISTORY_PER_TASK) lines.shift();
  S.version++;
}

/** Every event of the log, in order: `task.*` moves a card and adds to its history. O(1). */
export function observe(event) {
  if (typeof event?.type !== 'string' || !event.type.startsWith('task.')) return;
  if (event.data?.task) put(event.data.task);
  line(event);
}

async function loadList(client, rerender) {
  S.listedWith = client;
  S.status = 'loading';
  S.version++;
  try {
    let cursor;
    for (let page = 0; page < LIST_PAGES; page++) {
      const r = await client.request('map/tasks/list', cursor ? { limit: 1000, cursor } : { limit: 1000 });
      for (const task of r?.tasks ?? []) put(task, true);
      cursor = r?.nextCursor;
      if (!r?.hasMore || !cursor) break;
    }
    if (S.listedWith === client) S.status = 'loaded';
  } catch (err) {
    if (S.listedWith !== client) return;
    S.status = err.code === -32601 ? 'unavailable' : err.code === 1003 ? 'refused' : 'error';
    S.error = err.message ?? String(err);
  }
  S.version++;
  rerender();
}

async function loadHistory(client, taskId, rerender) {
  S.replay = { taskId, status: 'loading', error: '' };
  S.version++;
  try {
    let after;
    for (let page = 0; page < 5; page++) {
      const req = { limit: 1000, filter: { tasks: { taskIds: [taskId] }, eventTypes: ['*', 'task.updated'] } };
      if (after) req.afterEventId = after;
      const r = await client.request('map/replay', req);
      for (const item of r?.events ?? []) {
        const e = item.event;
        if (e.type?.startsWith('task.')) line(e);
        after = item.eventId ?? e.id;
      }
      if (!r?.hasMore || (r?.events ?? []).length === 0) break;
    }
    if (S.replay.taskId === taskId) S.replay = { taskId, status: 'loaded', error: '' };
  } catch (err) {
    if (S.replay.taskId === taskId) S.replay = { taskId, status: 'error', error: err.message ?? String(err) };
  }
  S.version++;
  rerender();
}

/** Reads the store's tasks on this connection if not done yet (the conversations view uses the tasks too). */
export function ensureListed(ctx) {
  if (ctx.client && S.listedWith !== ctx.client) void loadList(ctx.client, ctx.rerender);
}

/** The A2A tasks this viewer may read the record of, by `contextId`: Map contextId → tasks. */
export function a2aContexts() {
  const out = new Map();
  for (const t of S.tasks.values()) {
    const ctxId = t.meta?.a2a?.contextId;
    if (typeof ctxId !== 'string') continue;
    if (!out.has(ctxId)) out.set(ctxId, []);
    out.get(ctxId).push(t);
  }
  return out;
}

/** The change counter (for views that draw from the tasks). */
export function version() {
  return S.version;
}

// ---------------------------------------------------------------------------------------------
// What is shown

/** The tasks as of `past` (null: now): [{task, status, assignee, title}]. */
function shown(past) {
  const out = [];
  for (const t of S.tasks.values()) {
    if (!past) {
      out.push({ task: t, status: t.status, assignee: t.assignee ?? null, title: t.title });
      continue;
    }
    const lines = S.history.get(t.id) ?? [];
    let last = null;
    for (const l of lines) if (compareIds(l.eventId, past.id) <= 0) last = l;
    if (last) {
      out.push({ task: t, status: last.status ?? t.status, assignee: last.assignee, title: last.title ?? t.title });
    } else if (lines.length === 0 && (t.createdAt ?? Infinity) <= past.timestamp) {
      out.push({ task: t, status: t.status, assignee: t.assignee ?? null, title: t.title });
    }
  }
  return out;
}

function passes(row, ctx) {
  const { agent, scope } = ctx.filters ?? {};
  if (agent && row.assignee !== agent) return false;
  if (scope) {
    const a = row.assignee ? ctx.model.agents.get(row.assignee) : null;
    if (!a || !(a.scopes ?? []).includes(scope)) return false;
  }
  return true;
}

function assigneeName(ctx, row) {
  if (!row.assignee) return 'unassigned';
  const a2a = row.task.meta?.a2a;
  const known = ctx.model.agents.has(row.assignee) || ctx.model.participants?.has(row.assignee);
  return known ? nameOf(ctx.model, row.assignee) : a2a?.agentName ?? nameOf(ctx.model, row.assignee);
}

function describe(l, ctx) {
  const who = l.source ? nameOf(ctx.model, l.source) : 'someone';
  const to = l.assignee ? nameOf(ctx.model, l.assignee) : 'nobody';
  switch (l.type) {
    case 'task.created':
      return `created (${LABELS[l.status] ?? l.status ?? 'open'}${l.assignee ? `, for ${to}` : ''}) by ${who}`;
    case 'task.assigned':
      return `assigned to ${to} by ${who}`;
    case 'task.status':
      return `${LABELS[l.previous] ?? l.previous ?? '?'} → ${LABELS[l.status] ?? l.status} by ${who}`;
    case 'task.completed':
      return `completed${l.result !== undefined ? `: ${compact(l.result, 120)}` : ''}`;
    case 'task.updated':
      return `updated by ${who}${l.title ? ` (title: ${l.title})` : ''}`;
    default:
      return `${l.type} by ${who}`;
  }
}

export function render(root, ctx) {
  ensureListed(ctx);
  const past = ctx.past;
  const key = JSON.stringify([S.version, past?.id ?? null, ctx.filters, S.open, ctx.client ? 1 : 0, ctx.model.agents.size]);
  if (root.dataset.key === key) return;
  // Live changes are drawn at most every REDRAW_MS (a burst of task events is one redraw).
  const now = performance.now();
  const wait = S.lastDraw + REDRAW_MS - now;
  if (root.dataset.drawn === 'yes' && wait > 0) {
    if (!S.drawTimer) {
      S.drawTimer = setTimeout(() => {
        S.drawTimer = null;
        ctx.rerender();
      }, wait);
    }
    return;
  }
  root.dataset.key = key;
  root.dataset.drawn = 'yes';
  S.lastDraw = now;
  draw(root, ctx);
}

function draw(root, ctx) {
  const rows = shown(ctx.past).filter((r) => passes(r, ctx));
  const columns = new Map(STATUSES.map((s) => [s, []]));
  for (const r of rows) {
    const s = STATUSES.includes(r.status) ? r.status : 'open';
    columns.get(s).push(r);
  }
  const status = {
    idle: 'connecting…',
    loading: 'reading the tasks…',
    loaded: `${rows.length} task${rows.length === 1 ? '' : 's'}${ctx.past ? ` as of ${clock(ctx.past.timestamp)}` : ''}`,
    unavailable: 'The router does not offer the tasks extension.',
    refused: `This principal may not list tasks (${S.error}).`,
    error: `The tasks could not be read: ${S.error}`,
  }[S.status];
  const board = el(
    'div',
    { class: 'task-board', 'data-testid': 'task-board' },
    STATUSES.map((s) => {
      const cards = columns.get(s);
      // Newest change first; at most CARDS_PER_COLUMN drawn.
      const drawn = cards.slice(-CARDS_PER_COLUMN).reverse();
      return el(
        'section',
        { class: 'task-column', 'data-testid': 'task-column', 'data-status': s, 'aria-label': LABELS[s] },
        el('h4', {}, `${LABELS[s]} `, el('span', { class: 'count', 'data-testid': 'task-column-count' }, String(cards.length))),
        drawn.map((r) => card(r, ctx)),
        cards.length > drawn.length ? el('p', { class: 'muted' }, `+${cards.length - drawn.length} more`) : null,
      );
    }),
  );
  replaceChildren(
    root,
    el('p', { class: 'muted task-status', 'data-testid': 'tasks-status', 'data-status': S.status }, status),
    board,
    historyPane(ctx),
  );
}

function card(r, ctx) {
  const t = r.task;
  const a2a = t.meta?.a2a;
  const selected = S.open === t.id;
  return el(
    'button',
    {
      type: 'button',
      class: `task-card${selected ? ' selected' : ''}`,
      'data-testid': 'task-card',
      'data-task-id': t.id,
      'data-status': r.status,
      'aria-pressed': selected ? 'true' : 'false',
      onclick: () => {
        S.open = selected ? null : t.id;
        S.version++;
        if (S.open && ctx.client) void loadHistory(ctx.client, t.id, ctx.rerender);
        ctx.rerender();
      },
    },
    el('span', { class: 'task-title', 'data-testid': 'task-title' }, r.title || t.id),
    el('span', { class: 'task-assignee muted', 'data-testid': 'task-assignee' }, assigneeName(ctx, r)),
    a2a ? el('span', { class: 'badge', 'data-testid': 'task-a2a', title: `A2A context ${a2a.contextId ?? ''}` }, `A2A ${a2a.state ?? ''}`) : null,
  );
}

function historyPane(ctx) {
  if (!S.open) return el('p', { class: 'muted', 'data-testid': 'task-history-hint' }, 'Click a card for its history.');
  const t = S.tasks.get(S.open);
  const lines = (S.history.get(S.open) ?? []).filter((l) => !ctx.past || compareIds(l.eventId, ctx.past.id) <= 0);
  const replay = S.replay.taskId === S.open ? S.replay : { status: 'idle' };
  return el(
    'section',
    { class: 'task-history', 'data-testid': 'task-history', 'data-task-id': S.open, 'data-status': replay.status },
    el('h4', {}, `History of ${t?.title || S.open}`),
    t
      ? el(
          'p',
          { class: 'muted' },
          `${t.id} · created by ${nameOf(ctx.model, t.createdBy)} at ${clock(t.createdAt)}`,
          t.meta?.a2a?.contextId ? ` · A2A context ${t.meta.a2a.contextId}` : '',
        )
      : null,
    replay.status === 'error' ? el('p', { class: 'error' }, `The history could not be read: ${replay.error}`) : null,
    lines.length === 0
      ? el('p', { class: 'empty' }, replay.status === 'loading' ? 'reading…' : 'No change recorded in the retained log.')
      : el(
          'ol',
          { class: 'task-lines' },
          lines.map((l) =>
            el(
              'li',
              { 'data-testid': 'task-history-line', 'data-type': l.type, 'data-status': l.status ?? '' },
              el('span', { class: 'muted' }, clock(l.timestamp)),
              ' ',
              describe(l, ctx),
            ),
          ),
        ),
  );
}
