// The system view (issue 46, item 6): this router's node and, in a cluster, every node of the
// event log's stream (role, position, how far behind the writer), the NATS connection, what a
// standby would restore on a takeover; the router's live gauges; the gateways: the agents they
// registered, the AIP nodes and tools, each gateway's callers and errors; the federation peers
// this router dials (docs/federation.md): each link's state, what waits for it, what it routed.
//
// Read from `GET /health` and `GET /metrics` every POLL_MS while the view is shown (with the
// page's credential; a principal that may not read /metrics is told so), and from the model
// (agents) for the gateways' agents. Keeps only the last answers.
import { gatewayOf, nameOf } from './views.js';
import { metric, scrape } from './metrics.js';
import { clock, el, num, replaceChildren } from './util.js';

/** How often /health and /metrics are read while the view is shown. */
export const POLL_MS = 2000;

const state = { health: null, healthStatus: null, healthError: null, metrics: null, at: null, timer: null, ctx: null, root: null };

/** `/health` as `{status, first (its first line), nats, writer, handover, nodes: [{name, role, position}], lines}` (null for a line it lacks). */
export function parseHealth(status, text) {
  const lines = text.split('\n').map((l) => l.trim()).filter(Boolean);
  const value = (prefix) => lines.find((l) => l.startsWith(prefix))?.slice(prefix.length).trim() ?? null;
  const nodes = lines
    .map((l) => /^node (.+): (\w+), position (\d+)$/.exec(l))
    .filter(Boolean)
    .map(([, name, role, position]) => ({ name, role, position: Number(position) }));
  return {
    status,
    first: lines[0] ?? '',
    nats: value('nats:'),
    writer: value('writer:'),
    handover: value('handover:'),
    nodes,
    lines,
  };
}

async function poll() {
  const { ctx, root } = state;
  state.timer = null;
  if (!ctx || !root?.isConnected || root.hidden) return; // not shown: stop until drawn again
  try {
    const res = await ctx.fetchAuthed('/health');
    state.health = parseHealth(res.status, await res.text());
    state.healthError = null;
  } catch (err) {
    state.healthError = `/health did not answer (${err.message})`;
  }
  const m = await scrape(ctx);
  state.metrics = m;
  state.at = Date.now();
  ctx.rerender();
  if (!state.timer) state.timer = setTimeout(() => void poll(), POLL_MS);
}

export function render(root, ctx) {
  state.ctx = ctx;
  state.root = root;
  if (!state.timer) state.timer = setTimeout(() => void poll(), state.at ? POLL_MS : 0);
  const key = JSON.stringify([state.at, state.healthError, agentsKey(ctx.model)]);
  if (root.dataset.key === key) return;
  root.dataset.key = key;
  replaceChildren(root, el('div', { class: 'system', 'data-testid': 'system' }, nodeSection(), routerSection(), federationSection(), gatewaySection(ctx.model)));
}

function agentsKey(model) {
  return [...model.agents.values()].filter((a) => gatewayOf(a)).map((a) => [a.id, a.name, a.role, a.state, a.presence?.status, a.metadata?.aip?.domain]);
}

/**
 * An AIP node's state as an operator reads it: `offline since <time>` when the gateway closed
 * its session for silence (its agent orphaned, presence offline: `[aip] on_silence = "offline"`),
 * else its agent's state. An evicted node is not listed at all (its agent is unregistered).
 */
function aipState(a) {
  if (a.presence?.status === 'offline' || a.state === 'orphaned') return a.presence?.since ? `offline since ${clock(a.presence.since)}` : 'offline';
  return a.state ?? '';
}

function table(testid, head, rows) {
  return el(
    'table',
    { class: 'grid', 'data-testid': testid },
    el('thead', {}, el('tr', {}, head.map((h) => el('th', {}, h)))),
    el('tbody', {}, rows),
  );
}

function nodeSection() {
  const h = state.health;
  if (!h) return el('section', {}, el('h3', {}, 'Node'), el('p', { class: state.healthError ? 'error' : 'muted' }, state.healthError ?? 'Reading /health…'));
  const m = state.metrics?.families;
  const clustered = h.nats !== null || h.nodes.length > 0 || h.writer !== null;
  const writer = h.nodes.find((n) => n.role === 'writer');
  const role = !clustered ? 'single node' : h.status === 200 ? 'live (writes the event log)' : `standby${h.writer ? ` (writer: ${h.writer})` : ''}`;
  const handover = ['session', 'agent', 'scope'].map((kind) => [kind, metric(m, 'map_cluster_handover_records', { kind })]).filter(([, v]) => v !== null);
  const relayed = metric(m, 'map_cluster_relay_sessions');
  const following = metric(m, 'map_cluster_following_position');
  return el(
    'section',
    { 'aria-label': 'Nodes' },
    el('h3', {}, 'Node'),
    el(
      'dl',
      { class: 'facts' },
      el('dt', {}, 'this node'),
      el('dd', { 'data-testid': 'node-role' }, role),
      clustered ? [el('dt', {}, 'NATS'), el('dd', { 'data-testid': 'node-nats', 'data-status': (h.nats ?? 'unknown').split(/[ :]/)[0] }, h.nats ?? 'unknown')] : null,
      h.handover ? [el('dt', {}, 'on a takeover'), el('dd', { 'data-testid': 'node-handover' }, h.handover)] : null,
      handover.length ? [el('dt', {}, 'handover records'), el('dd', {}, handover.map(([k, v]) => `${num(v)} ${k}s`).join(' · '))] : null,
      following !== null ? [el('dt', {}, 'following'), el('dd', { 'data-testid': 'node-following' }, `position ${num(following)}`)] : null,
      relayed !== null ? [el('dt', {}, 'relay sessions'), el('dd', { 'data-testid': 'node-relays', 'data-value': relayed }, `${num(relayed)} (clients of this node whose calls go to the live node)`)] : null,
      el('dt', {}, 'read'),
      el('dd', { class: 'muted' }, state.at ? clock(state.at) : '–'),
    ),
    h.nodes.length
      ? table(
          'cluster-table',
          ['node', 'role', 'position', 'behind the writer'],
          h.nodes.map((n) =>
            el(
              'tr',
              { 'data-testid': 'cluster-node', 'data-node': n.name, 'data-role': n.role, 'data-position': n.position },
              el('td', {}, n.name),
              el('td', {}, n.role),
              el('td', { class: 'num' }, num(n.position)),
              el('td', { class: 'num', 'data-testid': 'cluster-lag' }, writer && n.role !== 'writer' ? num(Math.max(0, writer.position - n.position)) : '–'),
            ),
          ),
        )
      : clustered
        ? el('p', { class: 'muted' }, 'No roll call answered yet.')
        : null,
  );
}

function routerSection() {
  const s = state.metrics;
  if (!s) return el('section', {}, el('h3', {}, 'Router'), el('p', { class: 'muted' }, 'Reading /metrics…'));
  if (s.error) return el('section', {}, el('h3', {}, 'Router'), el('p', { class: 'muted', 'data-testid': 'metrics-unavailable' }, s.error));
  const m = s.families;
  const sum = (name, labels) => metric(m, name, labels);
  const commits = sum('map_store_commit_duration_seconds_count');
  const commitMs = commits ? (1000 * sum('map_store_commit_duration_seconds_sum')) / commits : null;
  const rows = [
    ['connections', sum('map_connections'), (m.get('map_connections') ?? []).filter((x) => x.value > 0).map((x) => `${x.labels.transport} ${num(x.value)}`).join(', ')],
    ['sessions', sum('map_sessions'), ''],
    ['agents', sum('map_agents'), (m.get('map_agents') ?? []).filter((x) => x.value > 0).map((x) => `${x.labels.state} ${num(x.value)}`).join(', ')],
    ['subscriptions', sum('map_subscriptions'), (m.get('map_subscriptions') ?? []).filter((x) => x.value > 0).map((x) => `${x.labels.state} ${num(x.value)}`).join(', ')],
    ['outbox frames', sum('map_outbox_frames'), `largest outbox ${num(sum('map_outbox_frames_max'))}`],
    ['messages kept for offline agents', sum('map_pending_messages'), ''],
    ['events appended', sum('map_events_appended_total'), `log position ${num(sum('map_event_log_next_sequence'))}`],
    ['store commit, mean', commitMs, commitMs === null ? 'no commit yet' : `${num(commits)} commits`],
    ['request errors', sum('map_request_errors_total'), topErrors(m)],
    ['tasks', sum('map_tasks'), ''],
    ['conversations', sum('map_conversations'), ''],
  ].filter(([, v]) => v !== null);
  return el(
    'section',
    { 'aria-label': 'Router' },
    el('h3', {}, 'Router'),
    table(
      'router-gauges',
      ['', 'now', ''],
      rows.map(([label, v, more]) => el('tr', { 'data-testid': 'gauge', 'data-name': label, 'data-value': v }, el('td', {}, label), el('td', { class: 'num' }, label.includes('commit') ? `${num(v, 2)} ms` : num(v)), el('td', { class: 'muted' }, more))),
    ),
  );
}

/** The peers this router dials, from /metrics (absent: no `[[federation.peer]]` with an endpoint). */
function federationSection() {
  const m = state.metrics?.families;
  const peers = [...new Set([...(m?.get('map_federation_queued') ?? []), ...(m?.get('map_federation_link_up') ?? [])].map((x) => x.labels.peer))].sort();
  if (!peers.length) return null;
  const of = (name, peer) => metric(m, name, { peer }) ?? 0;
  return el(
    'section',
    { 'aria-label': 'Federation' },
    el('h3', {}, `Federation peers (${peers.length})`),
    table(
      'federation-peers',
      ['peer system', 'link', 'waiting', 'routed', 'refused', 'retried', 'link failures'],
      peers.map((p) => {
        const up = of('map_federation_link_up', p) === 1;
        return el(
          'tr',
          { 'data-testid': 'federation-peer', 'data-peer': p, 'data-link': up ? 'up' : 'down' },
          el('td', {}, p),
          el('td', { class: up ? '' : 'muted', 'data-testid': 'federation-link' }, up ? 'up' : 'down'),
          el('td', { class: 'num', 'data-testid': 'federation-waiting' }, num(of('map_federation_queued', p))),
          el('td', { class: 'num', 'data-testid': 'federation-routed' }, num(of('map_federation_routed_total', p))),
          el('td', { class: 'num', 'data-testid': 'federation-refused' }, num(of('map_federation_refused_total', p))),
          el('td', { class: 'num' }, num(of('map_federation_retries_total', p))),
          el('td', { class: 'num' }, num(of('map_federation_link_failures_total', p))),
        );
      }),
    ),
  );
}

function topErrors(m) {
  const by = new Map();
  for (const s of m.get('map_request_errors_total') ?? []) {
    if (s.value > 0) by.set(s.labels.method ?? '?', (by.get(s.labels.method ?? '?') ?? 0) + s.value);
  }
  return [...by].sort((a, b) => b[1] - a[1]).slice(0, 4).map(([k, v]) => `${k} ${num(v)}`).join(', ');
}

function gatewaySection(model) {
  const m = state.metrics?.families;
  const through = [...model.agents.values()].filter((a) => gatewayOf(a));
  const by = new Map();
  for (const a of through) by.set(gatewayOf(a), [...(by.get(gatewayOf(a)) ?? []), a]);
  const requests = m?.get('map_gateway_requests_total') ?? [];
  const gateways = new Set([...by.keys(), ...requests.map((r) => r.labels.gateway)]);
  const aip = through.filter((a) => gatewayOf(a) === 'aip');
  return el(
    'section',
    { 'aria-label': 'Gateways' },
    el('h3', {}, 'Gateways'),
    gateways.size === 0
      ? el('p', { class: 'muted', 'data-testid': 'gateways-none' }, 'No gateway has callers or agents yet.')
      : table(
          'gateway-table',
          ['gateway', 'agents', 'callers (10 min)', 'requests', 'refused', 'errors'],
          [...gateways].sort().map((g) => {
            const requests = (outcome) => metric(m, 'map_gateway_requests_total', outcome ? { gateway: g, outcome } : { gateway: g });
            // AIP's gRPC calls are not HTTP requests of a gateway route: not counted there (so
            // not shown as 0); its refusals are `map_aip_refused_total`.
            const grpc = g === 'aip' && requests() === null;
            const notCounted = el('td', { class: 'num muted', title: 'gRPC calls: see the AIP counters below' }, '–');
            return el(
              'tr',
              { 'data-testid': 'gateway', 'data-gateway': g },
              el('td', {}, g),
              el('td', { class: 'num' }, num(by.get(g)?.length ?? 0)),
              grpc ? notCounted.cloneNode(true) : el('td', { class: 'num', 'data-testid': 'gateway-callers' }, num(metric(m, 'map_gateway_callers', { gateway: g }) ?? 0)),
              grpc ? notCounted.cloneNode(true) : el('td', { class: 'num' }, num(requests() ?? 0)),
              el('td', { class: 'num' }, num((grpc ? metric(m, 'map_aip_refused_total') : requests('refused')) ?? 0)),
              grpc ? notCounted : el('td', { class: 'num', 'data-testid': 'gateway-errors' }, num(requests('error') ?? 0)),
            );
          }),
        ),
    aip.length
      ? [
          el('h4', {}, `AIP nodes and tools (${aip.length})`, m ? ` · sessions open ${num(metric(m, 'map_aip_sessions_open') ?? 0)} · tool calls ${num(metric(m, 'map_aip_tool_calls_total') ?? 0)}` : ''),
          table(
            'aip-nodes',
            ['name', 'AIP id', 'kind', 'domain', 'state', 'skills / arguments'],
            aip.map((a) =>
              el(
                'tr',
                { 'data-testid': 'aip-node', 'data-agent-id': a.id, 'data-role': a.role ?? '' },
                el('td', {}, nameOf(model, a.id)),
                el('td', { class: 'muted' }, a.id),
                el('td', {}, a.role === 'tool' ? 'tool' : 'agent'),
                el('td', {}, String(a.metadata?.aip?.domain ?? '')),
                el('td', { 'data-testid': 'aip-node-state' }, aipState(a)),
                el('td', { class: 'muted' }, a.role === 'tool' ? Object.entries(a.metadata?.aip?.arguments ?? {}).map(([k, v]) => `${k}: ${typeof v === 'string' ? v : JSON.stringify(v)}`).join(', ') : (a.metadata?.aip?.skills ?? []).map((s) => s?.skillId ?? s?.capability ?? '').filter(Boolean).join(', ')),
              ),
            ),
          ),
        ]
      : null,
  );
}
