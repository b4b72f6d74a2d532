// The dashboard's controller: connects (with credentials when the router asks), attaches
// race-free (snapshot `asOf` → `map/subscribe {replayFrom: asOf}`), follows the stream, reads
// the history once for process details and time travel, and drives the views.
//
// Three consumers follow the router's one event log, each with its own cursor (the id of the
// last event it took; ids are ULIDs, so a later event has a greater id):
//   live  the snapshot model; takes every event of the subscription at once;
//   fold  a model folded from the start of the log (process details, checkpoints, time travel);
//   list  the event stream and message flow; holds still while paused or in the past.
// A consumer that cannot take events (history still loading, paused, looking at the past,
// reconnecting) queues them, up to a bound; past the bound it forgets the queue and, when it can
// take events again, reads what it missed with `map/replay` from its cursor. Taking only ids
// above the cursor makes every path free of gaps and duplicates.
import { ClosedError, MapClient, RpcError, routerUrl } from './client.js';
import { Model } from './model.js';
import { ALL_TYPES, fillSelect, nameOf, renderAgentDetail, renderEvents, renderMessageDetail, renderPlaceholder, renderScopes, renderTree } from './views.js';
import * as flow from './flow.js';
import * as charts from './charts.js';
import * as graph from './graph.js';
import * as traces from './traces.js';
import * as tasks from './tasks.js';
import * as conversations from './conversations.js';
import * as system from './system.js';
import { clock, compareIds, el } from './util.js';

// Every event type: `*` (the standard ones) and our vendor types, which the router sends only
// to subscriptions that name them (docs/compatibility.md §7).
const EVERY_TYPE = ['*', 'agent.presence.changed', 'agent.metadata.changed', 'message.queued', 'agent.injected', 'agent.stderr', 'agent.diagnostic', 'agent.spawning', 'agent.spawn.failed', 'task.updated'];

const params = new URLSearchParams(location.search);
/** Events a paused stream keeps before it forgets them and reads them again on resume. */
const BUFFER_CAP = positive(params.get('buffer'), 2000);
/** Events kept for the stream and message flow (up to LIST_SLACK more until the next trim). */
const LIST_CAP = 2000;
const LIST_SLACK = 500;
/** Live events redraw the page at most this often; a click, a filter or a tab at once. */
const LIVE_RENDER_MS = 200;
/** Rows drawn in the stream. */
const ROWS = 300;
/** Event ids kept for the scrubber (positions beyond are forgotten, oldest first). */
const TIMELINE_CAP = 100_000;
const TIMELINE_SLACK = 10_000;
/** A copy of the folded model every this many events, so time travel replays little. */
const SNAPSHOT_EVERY = 500;
const SNAPSHOTS_CAP = 400;
/** Replay page size (the router's maximum). */
const PAGE = 1000;
/** Pages one catch-up reads at most (a million events). */
const MAX_PAGES = 1000;
const AUTH_KEY = 'map-router-dashboard.auth';

/**
 * The views of the middle panel, one tab each (`#<name>` in the URL opens one). Only the view
 * shown is drawn. A view module exports `render(root, ctx)` (ctx: see `viewContext`) and may
 * export `observe(event)`, called with every event of the log in order from its start (the
 * history, then live), shown or not, so that it can keep bounded aggregates over time.
 */
const VIEWS = {
  events: null, // drawn by render() below (the stream)
  flow,
  charts,
  graph,
  traces,
  tasks,
  conversations,
  system,
};
/** The views the shared filters (type, agent, scope) and the pause apply to. */
const FILTERED_VIEWS = new Set(['events', 'flow', 'charts', 'graph']);
const OBSERVERS = Object.values(VIEWS).filter((v) => v && typeof v.observe === 'function');

function positive(text, fallback) {
  const n = Number.parseInt(text ?? '', 10);
  return Number.isFinite(n) && n > 0 ? n : fallback;
}

// ---------------------------------------------------------------------------------------------
// Following the log

/** One consumer of the event log (see the top of this file). */
class Follower {
  constructor(name, cap, take) {
    this.name = name;
    this.cap = cap;
    this.takeFn = take;
    this.cursor = null;
    this.queue = [];
    this.overflowed = false;
    this.blocks = new Set();
    this.running = false;
    this.gap = false;
  }

  get blocked() {
    return this.blocks.size > 0 || this.running;
  }

  push(event) {
    if (this.blocked || this.overflowed) {
      this.queue.push(event);
      if (this.queue.length > this.cap) {
        this.queue = [];
        this.overflowed = true;
      }
    } else {
      this.take(event);
    }
  }

  take(event) {
    if (compareIds(event.id, this.cursor) <= 0) return;
    this.cursor = event.id;
    this.takeFn(event);
  }

  block(reason) {
    this.blocks.add(reason);
  }

  /** Blocks, and makes the next catch-up read everything after the cursor again. */
  interrupt(reason) {
    this.block(reason);
    this.queue = [];
    this.overflowed = true;
  }

  async unblock(reason) {
    this.blocks.delete(reason);
    await this.catchUp();
  }

  async catchUp() {
    if (this.blocks.size > 0 || this.running) return;
    this.running = true;
    const client = S.client;
    let failed = false;
    try {
      while (this.overflowed && this.blocks.size === 0) {
        this.overflowed = false;
        this.queue = [];
        const r = await replayRange(this.cursor, null, (e) => this.take(e));
        if (r.gap) this.gap = true;
      }
      if (this.blocks.size === 0) {
        const queued = this.queue;
        this.queue = [];
        for (const e of queued) this.take(e);
      }
    } catch (err) {
      this.overflowed = true; // read again on the next catch-up
      failed = true;
      if (!(err instanceof ClosedError)) console.warn(`map-router dashboard: ${this.name} catch-up failed`, err);
    } finally {
      this.running = false;
    }
    const alive = client && client === S.client && !client.closed;
    if (failed && alive) {
      setTimeout(() => void this.catchUp(), 2000); // a refused or slow replay: try again later
    } else if (!failed && alive && this.blocks.size === 0 && (this.overflowed || this.queue.length > 0)) {
      await this.catchUp(); // blocked and released while it was reading
    }
  }
}

/**
 * Reads the log after `afterId` (from its start when null) with `map/replay`, page by page,
 * calling `onEvent` with each event up to `untilId` (inclusive; to the end when null).
 */
async function replayRange(afterId, untilId, onEvent, isCancelled = () => false) {
  const client = S.client;
  let after = afterId;
  let gap = false;
  for (let page = 0; page < MAX_PAGES; page++) {
    if (client !== S.client || isCancelled()) return { gap, complete: false };
    const req = { limit: PAGE, filter: { eventTypes: EVERY_TYPE } };
    if (after) req.afterEventId = after;
    const r = await client.request('map/replay', req);
    if (r.gap) gap = true;
    for (const item of r.events ?? []) {
      const event = item.event;
      if (untilId && compareIds(event.id, untilId) > 0) return { gap, complete: true };
      onEvent(event);
      after = event.id;
    }
    if (!r.hasMore || (r.events ?? []).length === 0) return { gap, complete: true };
  }
  return { gap, complete: false };
}

// ---------------------------------------------------------------------------------------------
// State

const S = {
  client: null,
  connect: null,
  caps: null,
  subId: null,
  asOf: null,
  attached: false,
  status: 'connecting',
  statusDetail: '',
  /** @type {Model} */ live: new Model(),
  /** @type {Model} */ fold: new Model(),
  historyReady: false,
  historyEvents: 0,
  timeline: { ids: [], times: [], offset: 0 },
  snapshots: [],
  list: [],
  recent: [],
  prepended: false,
  paused: false,
  past: null,
  travelToken: 0,
  selected: null,
  expanded: new Set(),
  filters: { type: '', agent: '', scope: '' },
  cp: null,
  steer: null,
  notice: '',
  expiresAt: null,
  view: viewFromHash(),
  /** What the trace view shows: `{messageId}`, `{eventId}` or `{traceId}`, or null. */
  traceAnchor: anchorFromHash(),
};

/** `#traces/message/<id>`, `#traces/event/<id>`, `#traces/trace/<hex>`: a trace's own link. */
function anchorFromHash() {
  const [view, kind, id] = location.hash.replace(/^#/, '').split('/');
  if (view !== 'traces' || !id) return null;
  const key = { message: 'messageId', event: 'eventId', trace: 'traceId' }[kind];
  return key ? { [key]: decodeURIComponent(id) } : null;
}

function hashOfAnchor(anchor) {
  if (anchor?.messageId) return `#traces/message/${encodeURIComponent(anchor.messageId)}`;
  if (anchor?.eventId) return `#traces/event/${encodeURIComponent(anchor.eventId)}`;
  if (anchor?.traceId) return `#traces/trace/${encodeURIComponent(anchor.traceId)}`;
  return '#traces';
}

function viewFromHash() {
  const name = location.hash.replace(/^#/, '').split('/')[0];
  return Object.hasOwn(VIEWS, name) ? name : 'events';
}

const fold = new Follower('history', 100_000, (e) => {
  S.fold.apply(e);
  for (const v of OBSERVERS) {
    try {
      v.observe(e);
    } catch (err) {
      console.warn('map-router dashboard: a view could not take an event', err);
    }
  }
  const t = S.timeline;
  t.ids.push(e.id);
  t.times.push(e.timestamp);
  if (t.ids.length > TIMELINE_CAP + TIMELINE_SLACK) {
    const drop = t.ids.length - TIMELINE_CAP;
    t.ids.splice(0, drop);
    t.times.splice(0, drop);
    t.offset += drop;
  }
  if (S.fold.applied % SNAPSHOT_EVERY === 0) {
    S.snapshots.push({ pos: t.offset + t.ids.length - 1, id: e.id, model: S.fold.clone() });
    if (S.snapshots.length > SNAPSHOTS_CAP) S.snapshots = S.snapshots.filter((_, i) => i % 2 === 0);
  }
  if (!S.prepended && compareIds(e.id, S.asOf) <= 0) {
    S.recent.push(e);
    if (S.recent.length > ROWS) S.recent.shift();
  }
  scheduleRender(false);
});

const list = new Follower('stream', BUFFER_CAP, (e) => {
  S.list.push(e);
  // Dropped in chunks: one splice per LIST_SLACK events, not one per event.
  if (S.list.length > LIST_CAP + LIST_SLACK) S.list.splice(0, S.list.length - LIST_CAP);
  scheduleRender(false);
});

// ---------------------------------------------------------------------------------------------
// Connecting and attaching

const $ = (id) => document.getElementById(id);

function loadCredential() {
  try {
    const c = JSON.parse(sessionStorage.getItem(AUTH_KEY) ?? 'null');
    return c && typeof c.credential === 'string' && c.credential ? c : null;
  } catch {
    return null;
  }
}

function saveCredential(c) {
  if (c) sessionStorage.setItem(AUTH_KEY, JSON.stringify(c));
  else sessionStorage.removeItem(AUTH_KEY);
}

let retryDelay = 500;
let retryTimer = null;

/** How often the NATS state is read from `GET /health` (cluster mode only). */
const HEALTH_MS = 2000;

/**
 * The nodes of the event log's stream (the live node's last roll call, as /health lists them;
 * `system.parseHealth`): each with its role, and how far a standby is behind the writer.
 */
function showNodes(nodes) {
  const el = $('cluster-nodes');
  if (nodes.length === 0) {
    el.hidden = true;
    return;
  }
  const writer = nodes.find((n) => n.role === 'writer');
  el.textContent = `nodes: ${nodes
    .map((n) => {
      const behind = writer && n.role !== 'writer' ? writer.position - n.position : 0;
      return behind > 0 ? `${n.name} (${n.role}, ${behind} behind)` : `${n.name} (${n.role})`;
    })
    .join(' · ')}`;
  el.hidden = false;
}

/**
 * Cluster mode: the event log's NATS connection, as `GET /health`'s `nats:` line says, in the
 * header. A router that is not in cluster mode has no such line: the badge stays hidden and
 * the page stops asking.
 */
async function watchNats() {
  const badge = $('nats-status');
  let state;
  try {
    const res = await fetch('/health', { cache: 'no-store', signal: AbortSignal.timeout(HEALTH_MS) });
    const health = system.parseHealth(res.status, await res.text());
    if (health.nats === null) {
      badge.hidden = true;
      return;
    }
    showNodes(health.nodes);
    void learnNodes();
    state = health.nats.split(/[ :]/)[0];
    badge.textContent = `nats: ${health.nats}`;
  } catch {
    // The router itself does not answer: the connection status says so; keep asking.
    state = 'unreachable';
    badge.textContent = 'nats: unknown (the router does not answer)';
  }
  badge.dataset.status = state;
  badge.hidden = false;
  setTimeout(() => void watchNats(), HEALTH_MS);
}

async function connect() {
  clearTimeout(retryTimer);
  setStatus('connecting');
  const credential = loadCredential();
  const client = new MapClient(routerUrl(location), {
    onNotification: (method, p) => client === S.client && onNotification(method, p),
    onClose: (err) => client === S.client && onClosed(err),
  });
  S.client = client;
  try {
    await client.open();
    const req = { protocolVersion: 1, participantType: 'client', name: 'map-router-dashboard' };
    if (credential) req.auth = { method: credential.method, credential: credential.credential };
    const res = await connectAs(client, req);
    if (res.authRequired) {
      S.client = null;
      client.close();
      if (credential) saveCredential(null);
      showAuth(res.authRequired, res.error, credential);
      return;
    }
    hideAuth();
    S.connect = res;
    S.caps = res.capabilities ?? {};
    S.expiresAt = res.principal?.expiresAt ?? null;
    retryDelay = 500;
    await attach();
  } catch (err) {
    if (client !== S.client) return;
    if (err instanceof ClosedError) return; // onClosed decides what happens next
    setStatus('error', err.message);
    client.close();
  }
}

/**
 * `map/connect`, as an operator when the credential's principal is one: signed in, the page asks
 * for `participantType: "system"` first (granted only to principals in `auth.system_principals`,
 * docs/security.md), so that an operator sees every agent, conversation and event; any other
 * principal is refused that (1003) and connects as a `client` on the same socket, seeing what
 * its principal may. Without a credential the page is a client.
 */
async function connectAs(client, req) {
  if (!req.auth) return client.request('map/connect', req);
  try {
    return await client.request('map/connect', { ...req, participantType: 'system' });
  } catch (err) {
    if (!(err instanceof RpcError) || err.code !== 1003) throw err;
    return client.request('map/connect', req);
  }
}

/** Snapshot, then the subscription from the snapshot's event, then the consumers catch up. */
async function attach() {
  const client = S.client;
  fold.block('attach');
  list.block('attach');
  const agents = await client.request('map/agents/list', {});
  const scopes = await client.request('map/scopes/list', {});
  S.asOf = agents.asOf ?? null;
  S.live = Model.fromSnapshot(agents.agents, scopes.scopes, S.asOf);
  if (!S.attached) {
    // The stream starts at the snapshot; the newest older events come with the history.
    S.attached = true;
    list.cursor = S.asOf;
  }
  fold.interrupt('attach');
  list.interrupt('attach');
  // An empty log has no asOf: start at time 0, which is everything logged after the snapshot.
  const sub = await client.request('map/subscribe', { replayFrom: S.asOf ?? 0, filter: { eventTypes: EVERY_TYPE } });
  S.subId = sub.subscriptionId;
  setStatus('live');
  scheduleRender();
  if (S.selected?.kind === 'agent') void loadCheckpoints(S.selected.id);
  void list.unblock('attach').then(scheduleRender);
  void fold.unblock('attach').then(() => {
    if (client !== S.client) return;
    S.historyReady = true;
    if (!S.prepended) {
      S.prepended = true;
      const firstShown = S.list[0]?.id ?? null;
      const older = S.recent.filter((e) => firstShown === null || compareIds(e.id, firstShown) < 0);
      S.list.unshift(...older);
      S.recent = [];
    }
    scheduleRender();
  });
}

/**
 * Cluster mode: which node each agent is on, for the agents that registered since the
 * snapshot (`agent_registered` does not say; their records do:
 * `_meta.mapRouter.presence.node`). Asked with the NATS state, only while some agent lacks it.
 */
async function learnNodes() {
  const client = S.client;
  if (!client || ![...S.live.agents.values()].some((a) => !a.node)) return;
  try {
    const r = await client.request('map/agents/list', {});
    let changed = false;
    for (const a of r?.agents ?? []) {
      const node = a._meta?.mapRouter?.presence?.node;
      const mine = S.live.agents.get(a.id);
      if (node && mine && mine.node !== node) {
        mine.node = node;
        changed = true;
      }
    }
    if (changed) scheduleRender();
  } catch {
    // Not connected just now, or not allowed to list: the next poll asks again.
  }
}

function onNotification(method, p) {
  if (method === 'map/event') {
    if (p.subscriptionId !== S.subId) return;
    const e = p.event;
    if (e.type === 'subscription.overflow' || !p.eventId) {
      // The router could not keep this subscription: the snapshot may be stale. Attach again.
      S.notice = `The stream fell behind the router's retention (${e.data?.eventsDropped ?? '?'} events dropped); attached again.`;
      void attach().catch((err) => setStatus('error', err.message));
      return;
    }
    if (compareIds(e.id, S.live.lastEventId) > 0) S.live.apply(e);
    fold.push(e);
    list.push(e);
    scheduleRender(false);
  } else if (method === 'map/auth/expiring') {
    S.expiresAt = p?.expiresAt ?? S.expiresAt;
    S.notice = `Your credential expires at ${clock(S.expiresAt)}; sign in again after that.`;
    scheduleRender();
  }
}

function onClosed(err) {
  S.subId = null;
  if (err.code === 4001) {
    saveCredential(null);
    S.client = null;
    showAuth({ methods: ['api-key', 'bearer'] }, { code: 'expired', message: 'your credential expired: sign in again' }, null);
    return;
  }
  setStatus('reconnecting', `connection closed (${err.code}); retrying in ${(retryDelay / 1000).toFixed(1)} s`);
  retryTimer = setTimeout(() => void connect(), retryDelay);
  retryDelay = Math.min(retryDelay * 2, 10_000);
}

function setStatus(status, detail = '') {
  S.status = status;
  S.statusDetail = detail;
  scheduleRender();
}

// ---------------------------------------------------------------------------------------------
// Authentication

function showAuth(required, error, sent) {
  setStatus('auth required');
  const form = $('auth');
  form.hidden = false;
  $('auth-realm').textContent = required?.realm ? `Realm: ${required.realm}` : '';
  const methods = required?.methods ?? ['api-key', 'bearer'];
  for (const opt of $('auth-method').options) opt.disabled = !methods.includes(opt.value);
  if (sent) $('auth-method').value = sent.method;
  const msg = $('auth-error');
  if (error) {
    msg.hidden = false;
    msg.textContent = `Refused (${error.code ?? 'error'}): ${error.message ?? 'the router did not accept the credential'}`;
  } else {
    msg.hidden = true;
    msg.textContent = '';
  }
  $('auth-credential').focus();
}

function hideAuth() {
  $('auth').hidden = true;
  $('auth-error').hidden = true;
}

$('auth').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const credential = $('auth-credential').value.trim();
  if (!credential) return;
  saveCredential({ method: $('auth-method').value, credential });
  $('auth-credential').value = '';
  void connect();
});

$('sign-out').addEventListener('click', () => {
  saveCredential(null);
  location.reload();
});

// ---------------------------------------------------------------------------------------------
// Pause, time travel

$('pause').addEventListener('click', () => {
  S.paused = !S.paused;
  if (S.paused) list.block('paused');
  else void list.unblock('paused').then(scheduleRender);
  scheduleRender();
});

function position(id) {
  const ids = S.timeline.ids;
  let lo = 0;
  let hi = ids.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    const c = compareIds(ids[mid], id);
    if (c === 0) return S.timeline.offset + mid;
    if (c < 0) lo = mid + 1;
    else hi = mid - 1;
  }
  return null;
}

/** Shows the system as it was right after the event at timeline position `pos`. */
async function travel(pos) {
  const t = S.timeline;
  const last = t.offset + t.ids.length - 1;
  if (pos >= last) {
    backToLive();
    return;
  }
  const index = Math.max(0, pos - t.offset);
  const id = t.ids[index];
  const token = ++S.travelToken;
  list.block('past');
  S.past = { pos: t.offset + index, id, timestamp: t.times[index], model: S.past?.model ?? null, events: S.past?.events ?? [], loading: true };
  scheduleRender();
  // Start from the newest model copy a few hundred events before, so the list has some past.
  const snaps = S.snapshots;
  let base = null;
  for (let i = snaps.length - 1; i >= 0; i--) {
    if (snaps[i].pos <= S.past.pos - ROWS) {
      base = snaps[i];
      break;
    }
  }
  const model = base ? base.model.clone() : new Model();
  const events = [];
  try {
    await replayRange(base?.id ?? null, id, (e) => {
      model.apply(e);
      events.push(e);
      if (events.length > ROWS) events.shift();
    }, () => token !== S.travelToken);
  } catch (err) {
    if (token === S.travelToken) S.notice = `Time travel failed: ${err.message}`;
  }
  if (token !== S.travelToken) return;
  S.past = { ...S.past, model, events, loading: false };
  scheduleRender();
}

function backToLive() {
  S.travelToken++;
  S.past = null;
  void list.unblock('past').then(scheduleRender);
  scheduleRender();
}

$('scrubber').addEventListener('input', (ev) => {
  const pos = Number(ev.target.value);
  const t = S.timeline;
  const i = pos - t.offset;
  $('scrubber-label').textContent = i >= t.ids.length - 1 ? 'live' : `${clock(t.times[i])} · event ${pos + 1} of ${t.offset + t.ids.length}`;
});
$('scrubber').addEventListener('change', (ev) => void travel(Number(ev.target.value)));
$('back-to-live').addEventListener('click', () => backToLive());

// ---------------------------------------------------------------------------------------------
// Detail, steering, checkpoints

async function loadCheckpoints(agentId) {
  const client = S.client;
  if (!client) return;
  S.cp = { agentId, status: 'loading', list: [], error: null };
  scheduleRender();
  const found = [];
  let cursor;
  try {
    for (let page = 0; page < 20; page++) {
      const req = { filter: { agentId }, agentId, limit: 100 };
      if (cursor) req.cursor = cursor;
      const r = await client.request('trajectory/list', req);
      found.push(...(r.checkpoints ?? []));
      cursor = r.nextCursor;
      if (!cursor || r.hasMore === false) break;
    }
    if (S.cp?.agentId === agentId) S.cp = { agentId, status: 'loaded', list: found, error: null };
  } catch (err) {
    if (S.cp?.agentId !== agentId) return;
    S.cp = err instanceof RpcError && err.code === -32601 ? { agentId, status: 'unavailable', list: [], error: null } : { agentId, status: 'error', list: [], error: err.message };
  }
  scheduleRender();
}

async function steer(method, p) {
  const agentId = p.agentId;
  S.steer = { agentId, text: `${method}…`, error: false };
  scheduleRender();
  try {
    const r = await S.client.request(method, p);
    const what = {
      'map/agents/stop': 'stop requested',
      'map/agents/suspend': 'suspended',
      'map/agents/resume': 'resumed',
      'map/inject': r?.injected === false ? 'not delivered (the agent has no live connection)' : `injected (${r?.delivery ?? 'queue'})`,
    }[method];
    S.steer = { agentId, text: `${nameOf(S.live, agentId)}: ${what}`, error: r?.injected === false };
  } catch (err) {
    S.steer = { agentId, text: `${method} failed: ${err.code !== undefined ? `${err.code} ` : ''}${err.message}`, error: true };
  }
  scheduleRender();
}

const injectForm = el(
  'form',
  { class: 'inject', 'data-testid': 'inject-form', 'aria-label': 'Inject a message' },
  el('label', { for: 'inject-content' }, 'Inject'),
  el('textarea', { id: 'inject-content', 'data-testid': 'inject-content', rows: 2, placeholder: 'Text or JSON to put in front of the agent' }),
  el(
    'select',
    { id: 'inject-delivery', 'aria-label': 'Delivery' },
    ['queue', 'steer', 'interrupt', 'best-effort'].map((d) => el('option', { value: d }, d)),
  ),
  el('button', { type: 'submit', 'data-testid': 'inject' }, 'Send'),
);
injectForm.addEventListener('submit', (ev) => {
  ev.preventDefault();
  if (S.selected?.kind !== 'agent') return;
  const text = $('inject-content').value;
  if (!text.trim()) return;
  let content = text;
  try {
    content = JSON.parse(text);
  } catch {
    // plain text is sent as a string
  }
  void steer('map/inject', { agentId: S.selected.id, content, delivery: $('inject-delivery').value });
});

const actions = {
  selectAgent(id) {
    S.selected = { kind: 'agent', id };
    S.steer = null;
    void loadCheckpoints(id);
    scheduleRender();
  },
  selectMessage(m) {
    S.selected = { kind: 'message', id: m.id, message: m };
    scheduleRender();
  },
  toggleEvent(e) {
    if (S.expanded.has(e.id)) S.expanded.delete(e.id);
    else S.expanded.add(e.id);
    if (e.type.startsWith('message_')) {
      const m = flow.collectMessages(S.past ? S.past.events : S.list, LIST_CAP).find((x) => x.id === e.data?.messageId);
      if (m) S.selected = { kind: 'message', id: m.id, message: m };
    }
    scheduleRender();
  },
  travelTo(id) {
    const pos = position(id);
    if (pos !== null) void travel(pos);
  },
  steer,
  /** Shows another view (`events`, `flow`, `charts`, ...). */
  showView(name) {
    if (!Object.hasOwn(VIEWS, name)) return;
    const hash = name === 'traces' ? hashOfAnchor(S.traceAnchor) : `#${name}`;
    if (location.hash !== hash) history.replaceState(null, '', hash);
    S.view = name;
    scheduleRender();
  },
  /** Sets some of the filters (`{type?, agent?, scope?}`; '' clears one); they apply to every view. */
  setFilters(f) {
    for (const [key, id] of [['type', 'filter-type'], ['agent', 'filter-agent'], ['scope', 'filter-scope']]) {
      if (f[key] === undefined) continue;
      S.filters[key] = f[key];
      $(id).value = f[key];
    }
    scheduleRender();
  },
  /** Opens the trace waterfall of a message or an event (`{messageId}` or `{eventId}`). */
  showTrace(anchor) {
    S.traceAnchor = anchor ?? null;
    S.view = 'traces';
    if (location.hash !== hashOfAnchor(S.traceAnchor)) history.replaceState(null, '', hashOfAnchor(S.traceAnchor));
    scheduleRender();
  },
  reloadCheckpoints() {
    if (S.selected?.kind === 'agent') void loadCheckpoints(S.selected.id);
  },
};

for (const tab of document.querySelectorAll('#tabs [data-view]')) {
  tab.addEventListener('click', () => actions.showView(tab.dataset.view));
}
window.addEventListener('hashchange', () => {
  S.view = viewFromHash();
  S.traceAnchor = anchorFromHash();
  scheduleRender();
});

for (const [key, id] of [['type', 'filter-type'], ['agent', 'filter-agent'], ['scope', 'filter-scope']]) {
  $(id).addEventListener('change', (ev) => {
    S.filters[key] = ev.target.value;
    scheduleRender();
  });
}

// ---------------------------------------------------------------------------------------------
// Rendering

let renderQueued = false;
let renderTimer = null;
let lastRender = -Infinity;

/**
 * Draws the page on the next animation frame. `force` (the default: anything a person did, an
 * answer that arrived) draws at once; live events (`force` false) at most every LIVE_RENDER_MS,
 * so a busy router costs the page a few redraws a second, not one per frame.
 */
function scheduleRender(force = true) {
  if (renderQueued && !(force && renderTimer)) return;
  clearTimeout(renderTimer);
  renderTimer = null;
  renderQueued = true;
  const frame = () =>
    requestAnimationFrame(() => {
      renderQueued = false;
      lastRender = performance.now();
      render();
    });
  const wait = force ? 0 : LIVE_RENDER_MS - (performance.now() - lastRender);
  if (wait > 0) {
    renderTimer = setTimeout(() => {
      renderTimer = null;
      frame();
    }, wait);
  } else {
    frame();
  }
}

function render() {
  const past = S.past;
  const model = past?.model ?? S.live;
  const events = past ? past.events : S.list;

  // Header
  const status = $('connection-status');
  status.textContent = S.status + (S.statusDetail ? `: ${S.statusDetail}` : '');
  status.dataset.status = S.status;
  $('principal').textContent = S.connect?.principal
    ? `principal ${S.connect.principal.id}${S.connect.participantType === 'system' ? ' (operator: sees everything)' : ''}`
    : S.connect
      ? 'anonymous'
      : '';
  $('sign-out').hidden = !loadCredential();
  const mode = $('mode');
  // The connection status already says "live": the badge speaks only of the past.
  mode.textContent = 'past';
  mode.dataset.mode = past ? 'past' : 'live';
  mode.hidden = !past;
  document.body.dataset.mode = past ? 'past' : 'live';
  $('notice').textContent = S.notice + (fold.gap ? ' Older events were removed by retention: history starts later than the first agents.' : '');
  $('notice').hidden = !S.notice && !fold.gap;

  // Tree and scopes
  const selectedAgent = S.selected?.kind === 'agent' ? S.selected.id : null;
  // Process details live in the fold; the live records come from the snapshot.
  const treeModel = past ? model : withProcs(S.live, S.fold);
  renderTree($('agent-tree'), treeModel, { selectedId: selectedAgent, mode: past ? 'past' : 'live' }, actions);
  renderScopes($('scope-list'), model);
  $('agent-count').textContent = `${model.agents.size}`;

  // Stream
  const types = new Set(ALL_TYPES);
  for (const e of events) types.add(e.type);
  fillSelect($('filter-type'), [...types].sort().map((t) => [t, t]), 'all types');
  fillSelect($('filter-agent'), [...model.agents.values()].map((a) => [a.id, a.name ?? a.id]), 'all agents');
  fillSelect($('filter-scope'), [...model.scopes.values()].map((s) => [s.id, s.name ?? s.id]), 'all scopes');
  S.filters = { type: $('filter-type').value, agent: $('filter-agent').value, scope: $('filter-scope').value };
  const stream = $('event-stream');
  stream.dataset.paused = S.paused ? 'true' : 'false';
  const pause = $('pause');
  pause.textContent = S.paused ? 'Resume' : 'Pause';
  pause.setAttribute('aria-pressed', S.paused ? 'true' : 'false');
  const waiting = list.queue.length;
  $('stream-status').textContent = past
    ? `the past: ${events.length} events up to ${clock(past.timestamp)}${past.loading ? ' (reading history…)' : ''}`
    : S.paused
      ? list.overflowed
        ? `paused: more than ${BUFFER_CAP} new events; they will be read again on resume`
        : `paused: ${waiting} new events held`
      : list.running
        ? 'catching up…'
        : streamCount();

  // Tabs, then the view shown (only it is drawn).
  for (const tab of document.querySelectorAll('#tabs [data-view]')) {
    const on = tab.dataset.view === S.view;
    tab.setAttribute('aria-selected', on ? 'true' : 'false');
    tab.classList.toggle('selected', on);
  }
  for (const name of Object.keys(VIEWS)) $(`view-${name}`).hidden = name !== S.view;
  // The filters and the pause concern the views drawn from the stream.
  document.querySelector('.filters').hidden = !FILTERED_VIEWS.has(S.view);
  const shownModel = past ? model : treeModel;
  if (S.view === 'events') {
    const emptyText = !past && !S.historyReady && events.length === 0 ? 'Reading the log…' : 'No events.';
    renderEvents(stream, events, { filters: S.filters, expanded: S.expanded, model: shownModel, limit: ROWS, canTravel: S.historyReady, emptyText }, actions);
  } else {
    VIEWS[S.view].render($(`view-${S.view}`), viewContext(shownModel, events));
  }

  // Detail
  const detail = $('detail');
  if (S.selected?.kind === 'agent') {
    renderAgentDetail(detail, past ? model : treeModel, S.selected.id, { cp: S.cp, past, caps: S.caps, steer: S.steer, injectForm }, actions);
  } else if (S.selected?.kind === 'message') {
    renderMessageDetail(detail, S.selected.message, past ? model : treeModel, actions);
  } else {
    renderPlaceholder(detail);
  }

  // Scrubber
  const t = S.timeline;
  const scrubber = $('scrubber');
  const last = t.offset + t.ids.length - 1;
  scrubber.disabled = !S.historyReady || t.ids.length < 2;
  scrubber.min = String(t.offset);
  scrubber.max = String(Math.max(last, t.offset));
  if (document.activeElement !== scrubber || past?.loading === false) scrubber.value = String(past ? past.pos : Math.max(last, t.offset));
  const label = $('scrubber-label');
  label.dataset.eventId = past ? past.id : 'live';
  if (document.activeElement !== scrubber) label.textContent = past ? `${clock(past.timestamp)} · event ${past.pos + 1} of ${last + 1}` : S.historyReady ? `live · ${last + 1} events` : 'reading history…';
  $('history-status').dataset.state = S.historyReady ? 'ready' : 'loading';
  $('back-to-live').disabled = !past;
}

/**
 * What a view is drawn from:
 *   model     the system at the moment shown (live, or the past being looked at)
 *   events    the stream's events up to that moment, oldest first (at most 2 000)
 *   fold      the model folded from the start of the log (process details, participants)
 *   past      null when live, else {id, timestamp, pos} of the event looked at
 *   client    the MapClient (`await ctx.client.request(method, params)`); null while connecting
 *   caps      the connection's capabilities; connect: the `map/connect` result
 *   filters   {type, agent, scope}: the filters every view applies ('' = all)
 *   selected  what the detail pane shows: {kind: 'agent'|'message', id}
 *   traceAnchor  {messageId} or {eventId} to show in the trace view, or null
 *   historyReady  whether the history has been read (observe() has seen the whole log)
 *   actions   selectAgent(id), selectMessage(m), showView(name), setFilters(f), showTrace(anchor),
 *             travelTo(eventId)
 *   rerender  schedules a redraw (after an answer arrives)
 *   fetchAuthed(path)  GET a path of this router (`/metrics`, `/health`) with the page's
 *             credential as `Authorization: Bearer` when it has one, within 2 s
 *   bearer    () => the credential the page signed in with (an API key or a JWT), or null: what
 *             `Authorization: Bearer` carries to the router's HTTP routes (`GET /metrics`)
 */
function viewContext(model, events) {
  return {
    model,
    events,
    fold: S.fold,
    past: S.past ? { id: S.past.id, timestamp: S.past.timestamp, pos: S.past.pos } : null,
    client: S.client && !S.client.closed && S.status === 'live' ? S.client : null,
    caps: S.caps,
    connect: S.connect,
    filters: S.filters,
    selected: S.selected,
    traceAnchor: S.traceAnchor,
    historyReady: S.historyReady,
    actions,
    rerender: scheduleRender,
    fetchAuthed,
    bearer: () => loadCredential()?.credential ?? null,
  };
}

/** GET `path` on this origin with the page's credential (a bearer), bounded by 2 s. */
function fetchAuthed(path) {
  const c = loadCredential();
  const headers = c ? { authorization: `Bearer ${c.credential}` } : {};
  return fetch(path, { cache: 'no-store', headers, signal: AbortSignal.timeout(2000) });
}

/**
 * The stream's count, in the scrubber's terms: the log's whole length once the history is read
 * (the stream keeps only the newest LIST_CAP of them).
 */
function streamCount() {
  const t = S.timeline;
  const total = t.offset + t.ids.length;
  if (!S.historyReady) return `${S.list.length} events (reading the log…)`;
  return S.list.length < total ? `the newest ${S.list.length} of ${total} events` : `${total} events`;
}

/** The live model with the fold's process details and checkpoints (read-only view). */
function withProcs(live, folded) {
  const view = Object.create(live);
  view.procs = new Map([...live.procs, ...folded.procs]);
  view.checkpoints = new Map([...folded.checkpoints, ...live.checkpoints]);
  // No snapshot lists participants: their names come from the log.
  view.participants = new Map([...folded.participants, ...live.participants]);
  return view;
}

void connect();
void watchNats();
