// The conversations view (issue 46): mail conversations (docs/mail.md), which are also where
// the MAMP and IM gateways and AIP sessions keep their talk (`metadata.protocol` says which:
// docs/gateways.md, docs/aip.md), each with its participants; a click shows its turns in order.
// A2A contexts are not mail conversations (docs/a2a.md: a `contextId` is kept in the tasks'
// `meta.a2a`, and the gateway records no mail): they are listed below, as the A2A tasks of each
// context (from the tasks board's listing).
//
// Where it reads from, with the viewer's own permissions (the router filters all of it):
//   - `mail/list` (paged), when the view is shown and again every REFRESH_MS while it is: the
//     store's conversations, so the view survives a restart. Who sees which: participants, and
//     system participants and system principals' sessions (a dashboard connects as `client`);
//   - `mail/get {include: {participants}}` for the conversations drawn, once per change;
//   - `mail/turns/list` (paged) for the conversation opened;
//   - `observe(event)`: `mail.*` events (sent to the sessions of the participants and to system
//     participants), which update a conversation's record and participants at once.
// In the past (time travel) it shows the conversations created by then and their turns up to then.
import { a2aContexts, ensureListed, version as tasksVersion } from './tasks.js';
import { nameOf } from './views.js';
import { clock, compact, el, replaceChildren } from './util.js';

/** Conversations kept (the newest by creation). */
export const CONVERSATIONS_CAP = 1000;
/** Conversations drawn in the list (the most recently active). */
export const CONVERSATIONS_DRAWN = 100;
/** Turns read and kept for the conversation opened (its first ones, in order). */
export const TURNS_CAP = 2000;
/** Pages of `mail/list` read at most (1 000 a page). */
const LIST_PAGES = 10;
/** The listing is read again this often while the view is shown. */
const REFRESH_MS = 3000;
/** `mail/get` calls in flight at most. */
const PARTICIPANT_READS = 4;
/** The view is redrawn at most this often while what it shows changes. */
const REDRAW_MS = 250;

const S = {
  /** @type {Map<string, object>} conversation id → record (wire shape) */
  convs: new Map(),
  /** @type {Map<string, {updatedAt: number, list: object[]}>} conversation id → participants */
  participants: new Map(),
  /** Conversation ids whose participants are being read. */
  reading: new Set(),
  client: null,
  status: 'idle',
  error: '',
  listedAt: 0,
  listing: false,
  open: null,
  /** The open conversation's turns: {convId, updatedAt, status, list, error, more}. */
  turns: null,
  version: 0,
  timer: null,
  lastDraw: -Infinity,
  drawTimer: null,
};

function putConv(c) {
  if (!c || typeof c.id !== 'string') return;
  const prev = S.convs.get(c.id);
  if (prev && (prev.updatedAt ?? 0) > (c.updatedAt ?? 0)) return;
  if (prev && JSON.stringify(prev) === JSON.stringify(c)) return;
  S.convs.set(c.id, c);
  if (S.convs.size > CONVERSATIONS_CAP) {
    // Evict the oldest created.
    let oldest = null;
    for (const x of S.convs.values()) if (!oldest || x.createdAt < oldest.createdAt) oldest = x;
    S.convs.delete(oldest.id);
    S.participants.delete(oldest.id);
  }
  S.version++;
}

/** Every event of the log: `mail.*` updates a conversation (O(1) apart from a JSON comparison). */
export function observe(event) {
  const t = event?.type;
  if (typeof t !== 'string' || !t.startsWith('mail.')) return;
  const d = event.data ?? {};
  if (d.conversation) putConv(d.conversation);
  if (Array.isArray(d.participants) && d.conversation) {
    S.participants.set(d.conversation.id, { updatedAt: d.conversation.updatedAt ?? 0, list: d.participants });
    S.version++;
  }
  if (t === 'mail.turn.added' && d.turn) {
    const c = S.convs.get(d.conversationId);
    if (c) c.updatedAt = Math.max(c.updatedAt ?? 0, d.turn.timestamp ?? 0);
    const open = S.turns;
    if (open && open.convId === d.conversationId && open.status === 'loaded' && !open.more && !open.list.some((x) => x.id === d.turn.id)) {
      if (open.list.length < TURNS_CAP) open.list.push(d.turn);
      else open.more = true;
      open.updatedAt = c?.updatedAt ?? open.updatedAt;
    }
    S.version++;
  }
}

async function list(client, rerender) {
  if (S.listing) return;
  S.listing = true;
  if (S.status === 'idle') S.status = 'loading';
  try {
    let cursor;
    for (let page = 0; page < LIST_PAGES; page++) {
      const r = await client.request('mail/list', cursor ? { limit: 1000, cursor } : { limit: 1000 });
      for (const c of r?.conversations ?? []) putConv(c);
      cursor = r?.nextCursor;
      if (!r?.hasMore || !cursor) break;
    }
    if (S.client === client && S.status !== 'loaded') {
      S.status = 'loaded';
      S.version++;
    }
  } catch (err) {
    if (S.client === client) {
      S.status = err.code === -32601 ? 'unavailable' : err.code === 1003 ? 'refused' : 'error';
      S.error = err.message ?? String(err);
      S.version++;
    }
  } finally {
    S.listing = false;
    S.listedAt = performance.now();
  }
  rerender();
}

async function readParticipants(client, conv, rerender) {
  S.reading.add(conv.id);
  try {
    const r = await client.request('mail/get', { conversationId: conv.id, include: { participants: true } });
    if (r?.conversation) putConv(r.conversation);
    S.participants.set(conv.id, { updatedAt: r?.conversation?.updatedAt ?? conv.updatedAt ?? 0, list: r?.participants ?? [] });
  } catch (err) {
    // Gone from view (10000) or refused: keep what is known; shown without participants.
    S.participants.set(conv.id, { updatedAt: conv.updatedAt ?? 0, list: S.participants.get(conv.id)?.list ?? [], error: err.message });
  } finally {
    S.reading.delete(conv.id);
    S.version++;
    rerender();
  }
}

async function readTurns(client, conv, rerender) {
  const convId = conv.id;
  S.turns = { convId, updatedAt: conv.updatedAt ?? 0, status: 'loading', list: S.turns?.convId === convId ? S.turns.list : [], error: '', more: false };
  S.version++;
  const out = [];
  let more = false;
  try {
    let cursor;
    for (;;) {
      const req = { conversationId: convId, limit: 1000 };
      if (cursor) req.cursor = cursor;
      const r = await client.request('mail/turns/list', req);
      out.push(...(r?.turns ?? []));
      cursor = r?.nextCursor;
      if (!r?.hasMore || !cursor) break;
      if (out.length >= TURNS_CAP) {
        more = true;
        break;
      }
    }
    if (S.turns?.convId === convId) S.turns = { ...S.turns, status: 'loaded', list: out.slice(0, TURNS_CAP), more };
  } catch (err) {
    if (S.turns?.convId === convId) S.turns = { ...S.turns, status: 'error', error: err.message ?? String(err) };
  }
  S.version++;
  rerender();
}

/** The conversation's kind as a person reads it: the gateway's protocol, else mail, and its type. */
function kindOf(c) {
  const p = c.metadata?.protocol;
  const via = { mamp: 'MAMP', im: 'IM', aip: 'AIP session' }[p] ?? (typeof p === 'string' ? p : 'mail');
  return `${via} · ${c.type ?? 'multi-agent'}`;
}

/** Its subject, else who talks in it (`a ↔ b`), else its id. */
function titleOf(ctx, c, parts) {
  if (c.subject) return c.subject;
  return parts.length ? parts.map((p) => participantName(ctx, p)).join(' ↔ ') : c.id;
}

function participantName(ctx, p) {
  if (ctx.model.agents.has(p.id) || ctx.model.participants?.has(p.id)) return nameOf(ctx.model, p.id);
  return p.agentInfo?.name ?? nameOf(ctx.model, p.id);
}

function senderName(ctx, id, parts) {
  const p = parts.find((x) => x.id === id);
  return p ? participantName(ctx, p) : nameOf(ctx.model, id);
}

export function render(root, ctx) {
  const client = ctx.client;
  if (client && S.client !== client) {
    S.client = client;
    S.status = S.convs.size > 0 ? S.status : 'idle';
    S.listedAt = 0;
  }
  ensureListed(ctx); // the A2A tasks, for the contexts
  if (client && !S.listing && performance.now() - S.listedAt >= REFRESH_MS) void list(client, ctx.rerender);
  // While shown, look again every REFRESH_MS (a `client` of a system principal gets no mail events).
  if (!S.timer) {
    S.timer = setTimeout(() => {
      S.timer = null;
      if (!root.hidden) ctx.rerender();
    }, REFRESH_MS);
  }
  const key = JSON.stringify([S.version, tasksVersion(), ctx.past?.id ?? null, ctx.filters, ctx.model.agents.size, client ? 1 : 0]);
  if (root.dataset.key === key) return;
  // Live changes are drawn at most every REDRAW_MS (a burst of turns or tasks is one redraw).
  const now = performance.now();
  const wait = S.lastDraw + REDRAW_MS - now;
  if (wait > 0) {
    if (!S.drawTimer) {
      S.drawTimer = setTimeout(() => {
        S.drawTimer = null;
        ctx.rerender();
      }, wait);
    }
    return;
  }
  S.lastDraw = now;
  root.dataset.key = key;
  const convs = shownConvs(ctx);
  const drawn = convs.slice(0, CONVERSATIONS_DRAWN);
  if (client && !ctx.past) {
    let inFlight = S.reading.size;
    for (const c of drawn) {
      if (inFlight >= PARTICIPANT_READS) break;
      const known = S.participants.get(c.id);
      if (S.reading.has(c.id) || (known && known.updatedAt >= (c.updatedAt ?? 0))) continue;
      inFlight++;
      void readParticipants(client, c, ctx.rerender);
    }
  }
  const open = S.open ? S.convs.get(S.open) : null;
  if (client && open && S.turns?.status !== 'loading' && (S.turns?.convId !== open.id || (S.turns.updatedAt < (open.updatedAt ?? 0) && !S.turns.more))) {
    void readTurns(client, open, ctx.rerender);
  }
  draw(root, ctx, convs, drawn);
}

/** The conversations to show, most recently active first, filtered, as of the past moment. */
function shownConvs(ctx) {
  const past = ctx.past;
  const { agent } = ctx.filters ?? {};
  const out = [];
  for (const c of S.convs.values()) {
    if (past && (c.createdAt ?? 0) > past.timestamp) continue;
    if (agent) {
      const parts = S.participants.get(c.id)?.list ?? [];
      if (!parts.some((p) => p.id === agent) && c.createdBy !== agent) continue;
    }
    out.push(c);
  }
  out.sort((a, b) => (b.updatedAt ?? 0) - (a.updatedAt ?? 0) || (a.id < b.id ? 1 : -1));
  return out;
}

function draw(root, ctx, convs, drawn) {
  const status = {
    idle: 'connecting…',
    loading: 'reading the conversations…',
    loaded: `${convs.length} conversation${convs.length === 1 ? '' : 's'}${ctx.past ? ` as of ${clock(ctx.past.timestamp)}` : ''}`,
    unavailable: 'The router does not offer the mail extension.',
    refused: `This principal may not read conversations (${S.error}).`,
    error: `The conversations could not be read: ${S.error}`,
  }[S.status];
  const listEl = el(
    'ul',
    { class: 'conv-list', 'data-testid': 'conversation-list' },
    drawn.length === 0 && S.status === 'loaded' ? el('li', { class: 'empty', 'data-testid': 'conversations-empty' }, 'No conversation this principal may see.') : null,
    drawn.map((c) => {
      const parts = S.participants.get(c.id)?.list ?? [];
      const selected = S.open === c.id;
      return el(
        'li',
        {},
        el(
          'button',
          {
            type: 'button',
            class: `conv${selected ? ' selected' : ''}`,
            'data-testid': 'conversation',
            'data-conversation-id': c.id,
            'aria-pressed': selected ? 'true' : 'false',
            onclick: () => {
              S.open = selected ? null : c.id;
              S.version++;
              ctx.rerender();
            },
          },
          el('span', { class: 'conv-subject', 'data-testid': 'conversation-subject' }, titleOf(ctx, c, parts)),
          el('span', { class: 'badge', 'data-testid': 'conversation-kind' }, kindOf(c)),
          c.status === 'completed' ? el('span', { class: 'badge' }, 'closed') : null,
          el('span', { class: 'conv-participants muted', 'data-testid': 'conversation-participants' }, parts.length ? parts.map((p) => participantName(ctx, p)).join(', ') : `${c.participantCount ?? 0} participant(s)`),
          el('span', { class: 'muted conv-time' }, clock(c.updatedAt)),
        ),
      );
    }),
    convs.length > drawn.length ? el('li', { class: 'muted' }, `+${convs.length - drawn.length} older`) : null,
  );
  replaceChildren(
    root,
    el('p', { class: 'muted', 'data-testid': 'conversations-status', 'data-status': S.status }, status),
    el('div', { class: 'conv-layout' }, listEl, turnsPane(ctx)),
    contextsPane(ctx),
  );
}

function turnsPane(ctx) {
  const c = S.open ? S.convs.get(S.open) : null;
  if (!c) return el('section', { class: 'conv-turns muted', 'data-testid': 'conversation-hint' }, 'Click a conversation for its turns.');
  const parts = S.participants.get(c.id)?.list ?? [];
  const t = S.turns?.convId === c.id ? S.turns : { status: 'loading', list: [] };
  const list = t.list.filter((x) => !ctx.past || (x.timestamp ?? 0) <= ctx.past.timestamp);
  return el(
    'section',
    { class: 'conv-turns', 'data-testid': 'conversation-turns', 'data-conversation-id': c.id, 'data-status': t.status },
    el('h4', {}, titleOf(ctx, c, parts)),
    el('p', { class: 'muted' }, `${kindOf(c)} · ${c.id} · started ${clock(c.createdAt)} by ${nameOf(ctx.model, c.createdBy)}`),
    el('p', { class: 'muted', 'data-testid': 'conversation-members' }, 'Participants: ', parts.map((p) => `${participantName(ctx, p)} (${p.role}${p.leftAt ? ', left' : ''})`).join(', ') || '–'),
    t.status === 'error' ? el('p', { class: 'error' }, `The turns could not be read: ${t.error}`) : null,
    list.length === 0
      ? el('p', { class: 'empty' }, t.status === 'loading' ? 'reading…' : 'No turns.')
      : el(
          'ol',
          { class: 'turns' },
          list.map((x) =>
            el(
              'li',
              { class: 'turn', 'data-testid': 'turn', 'data-turn-id': x.id },
              el('span', { class: 'muted' }, clock(x.timestamp)),
              ' ',
              el('strong', { 'data-testid': 'turn-sender' }, senderName(ctx, x.participant, parts)),
              ' ',
              el('span', { class: 'turn-content', 'data-testid': 'turn-content' }, turnText(x)),
              x.contentType !== 'text' ? el('span', { class: 'badge' }, x.contentType) : null,
            ),
          ),
        ),
    t.more ? el('p', { class: 'muted' }, `Only the first ${TURNS_CAP} turns are shown.`) : null,
  );
}

/**
 * A turn's content as a person reads it: its text; a gateway's `{parts: [...]}` payload (an AIP
 * session's, docs/aip.md) as its text parts in order, other parts as `[image]`, `[audio]`...;
 * anything else as compact JSON.
 */
function turnText(x) {
  const c = x.content;
  if (typeof c === 'string') return c;
  const parts = c && typeof c === 'object' && !Array.isArray(c) && Object.keys(c).length === 1 ? c.parts : null;
  if (Array.isArray(parts) && parts.length > 0 && parts.every((p) => p && typeof p === 'object')) {
    const text = parts.map((p) => (typeof p.text === 'string' ? p.text : `[${typeof p.kind === 'string' ? p.kind : 'part'}]`)).join(' ');
    return text.length > 400 ? `${text.slice(0, 399)}…` : text;
  }
  return compact(c, 400);
}

function contextsPane(ctx) {
  const contexts = [...a2aContexts()];
  return el(
    'section',
    { class: 'a2a-contexts', 'data-testid': 'a2a-contexts' },
    el('h4', {}, 'A2A contexts'),
    el('p', { class: 'muted' }, 'An A2A contextId is not a mail conversation: its tasks (docs/a2a.md) are grouped here; their turns are in each task’s A2A history.'),
    contexts.length === 0
      ? el('p', { class: 'empty' }, 'No A2A task this principal may read.')
      : el(
          'ul',
          {},
          contexts.slice(0, CONVERSATIONS_DRAWN).map(([id, tasks]) =>
            el(
              'li',
              { 'data-testid': 'a2a-context', 'data-context-id': id },
              el('code', {}, id),
              ` · ${tasks.length} task${tasks.length === 1 ? '' : 's'}: `,
              tasks
                .slice(0, 10)
                .map((t) => `${t.meta?.a2a?.agentName ?? nameOf(ctx.model, t.assignee)} (${t.meta?.a2a?.state ?? t.status})`)
                .join(', '),
            ),
          ),
        ),
  );
}
