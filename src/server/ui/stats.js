// Aggregates for the charts (issue 46): bounded time series folded from the log's events, one
// event at a time, and the reading of a window of them for a chart. Pure: no DOM, no I/O, so a
// test can feed it events directly.
//
// What it keeps (every part has a fixed bound, see the constants):
//   totals        messages sent, deliveries, failures per second; participants connected
//                 (a running count of participant_connected / participant_disconnected);
//   per agent     sent (agent = sender), delivered (agent = recipient), failed (agent = sender)
//                 for the AGENTS_TRACKED busiest agents;
//   reply latency per answering agent: a `message_sent` whose `meta.isResult` is true and whose
//                 `meta.correlationId` names an earlier request (`meta.expectsResponse`) by its
//                 `meta.correlationId` or, as the SDK's `reply()` does without one, by its
//                 message id; latency = reply's event timestamp − request's;
//   usage         tokens (input + output) and cost per agent over time, as docs/dashboard.md
//                 "Usage: the convention" says: `metadata.usage` (a running total, from
//                 `agent_registered` and `agent.metadata.changed`) wins over the sum of the
//                 agent's `trajectory.checkpoint` `metadata.usage` (one step each).
//
// Time is bucketed twice: one-second buckets for the newest hour (FINE_SECONDS) and one-minute
// buckets for the newest day (COARSE_MINUTES). Each event goes into both; a window that lies
// within the newest hour is read from the seconds, an older or longer one from the minutes.
// Each bucket knows which second (minute) it holds, so a reused slot never leaks old counts.

/** One-second buckets kept: the newest hour. */
export const FINE_SECONDS = 3600;
/** One-minute buckets kept: the newest day. */
export const COARSE_MINUTES = 1440;
/** Agents with their own message series (the busiest; when full, a newcomer replaces the quietest quarter). */
export const AGENTS_TRACKED = 64;
/** Agents with their own reply-latency series. */
export const LATENCY_AGENTS = 16;
/** Agents with their own usage series. */
export const USAGE_AGENTS = 16;
/** Requests waiting for their reply (the oldest is forgotten first). */
export const PENDING_REQUESTS = 10_000;
/** Checkpoint ids remembered so that a checkpoint seen twice counts once. */
export const CHECKPOINT_IDS = 20_000;

const SUM = 0;
const LAST = 1;

/**
 * Buckets of a few channels over time. A `SUM` channel adds what happens in a bucket (0 when
 * nothing did); a `LAST` channel holds the level at the end of the bucket (NaN when it did not
 * change in that bucket: the level carries on from before).
 */
class Ring {
  constructor(kinds) {
    this.kinds = kinds;
    this.fine = Ring.part(FINE_SECONDS, kinds);
    this.coarse = Ring.part(COARSE_MINUTES, kinds);
  }

  static part(size, kinds) {
    return {
      size,
      // 0 = empty (no event is from 1970-01-01T00:00:00). Seconds fit 32 bits until 2106.
      stamp: new Uint32Array(size),
      // Counts per bucket are small: 32-bit floats are exact up to 16 million. Levels (running
      // totals of tokens and cost) keep 64 bits.
      ch: kinds.map((k) => (k === LAST ? new Float64Array(size).fill(Number.NaN) : new Float32Array(size))),
    };
  }

  /** The slot of `unit` (a second or a minute) in `part`, reset if it held another unit; -1 when it holds a newer one. */
  static slot(part, unit, kinds) {
    const i = unit % part.size;
    const s = part.stamp[i];
    if (s === unit) return i;
    if (s > unit) return -1; // older than what the slot already holds: out of this part's reach
    part.stamp[i] = unit;
    for (let c = 0; c < kinds.length; c++) part.ch[c][i] = kinds[c] === LAST ? Number.NaN : 0;
    return i;
  }

  add(sec, c, v) {
    const f = Ring.slot(this.fine, sec, this.kinds);
    if (f >= 0) this.fine.ch[c][f] += v;
    const m = Ring.slot(this.coarse, Math.floor(sec / 60), this.kinds);
    if (m >= 0) this.coarse.ch[c][m] += v;
  }

  set(sec, c, v) {
    const f = Ring.slot(this.fine, sec, this.kinds);
    if (f >= 0) this.fine.ch[c][f] = v;
    const m = Ring.slot(this.coarse, Math.floor(sec / 60), this.kinds);
    if (m >= 0) this.coarse.ch[c][m] = v;
  }

  /** The raw value of channel `c` in unit `u` of `part`, or null when the slot holds another unit. */
  static at(part, c, u) {
    const i = u % part.size;
    return part.stamp[i] === u ? part.ch[c][i] : null;
  }

  /**
   * Channel `c` over `n` units from `first` (seconds when `coarse` is false, else minutes):
   * sums (0 where nothing happened), or levels (carried forward; null before the first known).
   */
  read(c, first, n, coarse) {
    const part = coarse ? this.coarse : this.fine;
    const out = new Array(n);
    if (this.kinds[c] === SUM) {
      for (let k = 0; k < n; k++) out[k] = Ring.at(part, c, first + k) ?? 0;
      return out;
    }
    let level = this.levelBefore(c, first, coarse);
    for (let k = 0; k < n; k++) {
      const v = Ring.at(part, c, first + k);
      if (v !== null && !Number.isNaN(v)) level = v;
      out[k] = level;
    }
    return out;
  }

  /** The sum of `SUM` channel `c` over `n` units from `first` (no allocation). */
  sum(c, first, n, coarse) {
    const part = coarse ? this.coarse : this.fine;
    let total = 0;
    for (let k = 0; k < n; k++) total += Ring.at(part, c, first + k) ?? 0;
    return total;
  }

  /** The level of channel `c` just before unit `first`, or null when none is kept. */
  levelBefore(c, first, coarse) {
    if (!coarse) {
      // The seconds of this minute before `first`, then whole minutes.
      for (let u = first - 1; u >= first - FINE_SECONDS && u >= Math.floor(first / 60) * 60; u--) {
        const v = Ring.at(this.fine, c, u);
        if (v !== null && !Number.isNaN(v)) return v;
      }
    }
    const m0 = coarse ? first - 1 : Math.floor(first / 60) - 1;
    for (let m = m0; m > m0 - COARSE_MINUTES; m--) {
      const v = Ring.at(this.coarse, c, m);
      if (v !== null && !Number.isNaN(v)) return v;
    }
    return null;
  }
}

/** A Map of at most `cap` entries by weight: when it is full, a new key replaces the lightest ones. */
class Tracked {
  constructor(cap, make) {
    this.cap = cap;
    this.make = make;
    this.map = new Map();
  }

  get(id) {
    let e = this.map.get(id);
    if (e) return e;
    if (this.map.size >= this.cap) {
      // The lightest quarter goes at once, so that a stream of newcomers (a multicast to a
      // large scope) costs one sort per cap/4 of them, not a scan each.
      const byWeight = [...this.map].sort((a, b) => a[1].weight - b[1].weight);
      for (const [k] of byWeight.slice(0, Math.max(1, this.cap >> 2))) this.map.delete(k);
    }
    e = { weight: 0, ring: this.make() };
    this.map.set(id, e);
    return e;
  }
}

// Channels
const SENT = 0;
const DELIVERED = 1;
const FAILED = 2;
const CONNECTED = 3;
const LAT_SUM = 0;
const LAT_COUNT = 1;
const TOKENS = 0;
const COST = 1;

const secondOf = (ms) => Math.floor(ms / 1000);
const finite = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : 0);
const tokensOf = (u) => finite(u?.inputTokens) + finite(u?.outputTokens);

/** How many recipients a `message_failed` is about. */
function failedCount(d) {
  if (typeof d.recipientCount === 'number') return d.recipientCount;
  if (Array.isArray(d.recipients)) return d.recipients.length;
  return 1;
}

export class Stats {
  constructor() {
    this.total = new Ring([SUM, SUM, SUM, LAST]);
    this.agents = new Tracked(AGENTS_TRACKED, () => new Ring([SUM, SUM, SUM]));
    this.latency = new Tracked(LATENCY_AGENTS, () => new Ring([SUM, SUM]));
    this.usage = new Tracked(USAGE_AGENTS, () => new Ring([LAST, LAST]));
    /** correlation key → {ts, from} of requests waiting for a reply (insertion order = age). */
    this.pending = new Map();
    /** agent id → {meta: usage or null, steps: usage summed over checkpoints} */
    this.usageSource = new Map();
    this.checkpointIds = new Set();
    this.connected = 0;
    /** The newest second an event carried. */
    this.head = 0;
    /** Events observed. */
    this.events = 0;
    /** Bumped whenever something a chart shows changed. */
    this.version = 0;
  }

  /** Takes one event of the log (in log order). O(1) but for a multicast's recipient list. */
  observe(event) {
    const ts = event?.timestamp;
    if (typeof ts !== 'number' || !Number.isFinite(ts) || ts <= 0) return;
    const sec = secondOf(ts);
    const d = event.data ?? {};
    this.events += 1;
    if (sec > this.head) this.head = sec;
    switch (event.type) {
      case 'message_sent': {
        this.total.add(sec, SENT, 1);
        if (typeof d.from === 'string') this.agentAdd(d.from, sec, SENT, 1);
        this.correlate(d, ts);
        break;
      }
      case 'message_delivered': {
        const to = Array.isArray(d.deliveredTo) ? d.deliveredTo : [];
        if (to.length === 0) return;
        this.total.add(sec, DELIVERED, to.length);
        for (const r of to) if (typeof r === 'string') this.agentAdd(r, sec, DELIVERED, 1);
        break;
      }
      case 'message_failed': {
        const n = failedCount(d);
        this.total.add(sec, FAILED, n);
        if (typeof d.from === 'string') this.agentAdd(d.from, sec, FAILED, n);
        break;
      }
      case 'participant_connected':
        this.connected += 1;
        this.total.set(sec, CONNECTED, this.connected);
        break;
      case 'participant_disconnected':
        // A log cut by retention can start with disconnections of earlier connections.
        this.connected = Math.max(0, this.connected - 1);
        this.total.set(sec, CONNECTED, this.connected);
        break;
      case 'agent_registered':
      case 'agent.metadata.changed': {
        const u = d.metadata?.usage;
        if (u && typeof u === 'object' && typeof d.agentId === 'string') this.reportUsage(d.agentId, sec, u, null);
        break;
      }
      case 'trajectory.checkpoint': {
        const cp = d.checkpoint;
        const u = cp?.metadata?.usage;
        if (!u || typeof u !== 'object' || typeof cp.agentId !== 'string') return;
        if (typeof cp.id === 'string') {
          if (this.checkpointIds.has(cp.id)) return;
          this.checkpointIds.add(cp.id);
          if (this.checkpointIds.size > CHECKPOINT_IDS) this.checkpointIds.delete(this.checkpointIds.values().next().value);
        }
        this.reportUsage(cp.agentId, sec, null, u);
        break;
      }
      default:
        return;
    }
    this.version += 1;
  }

  agentAdd(id, sec, c, n) {
    const e = this.agents.get(id);
    e.weight += n;
    e.ring.add(sec, c, n);
  }

  /** Remembers a request; measures a reply against its request. */
  correlate(d, ts) {
    const meta = d.message?.meta ?? {};
    if (meta.isResult === true && typeof meta.correlationId === 'string') {
      const key = meta.correlationId;
      const req = this.pending.get(`c:${key}`) ?? this.pending.get(`m:${key}`);
      if (req && typeof d.from === 'string') {
        this.pending.delete(`c:${key}`);
        this.pending.delete(`m:${key}`);
        this.pending.delete(req.other);
        const e = this.latency.get(d.from);
        e.weight += 1;
        const sec = secondOf(ts);
        e.ring.add(sec, LAT_SUM, Math.max(0, ts - req.ts));
        e.ring.add(sec, LAT_COUNT, 1);
      }
    }
    if (meta.expectsResponse === true) {
      const byId = typeof d.messageId === 'string' ? `m:${d.messageId}` : null;
      const byCorr = typeof meta.correlationId === 'string' ? `c:${meta.correlationId}` : null;
      if (byId) this.pending.set(byId, { ts, other: byCorr });
      if (byCorr) this.pending.set(byCorr, { ts, other: byId });
      while (this.pending.size > PENDING_REQUESTS) this.pending.delete(this.pending.keys().next().value);
    }
  }

  reportUsage(agentId, sec, total, step) {
    let src = this.usageSource.get(agentId);
    if (!src) {
      if (this.usageSource.size >= USAGE_AGENTS * 4) this.usageSource.delete(this.usageSource.keys().next().value);
      src = { meta: null, steps: { inputTokens: 0, outputTokens: 0, costUsd: 0 } };
      this.usageSource.set(agentId, src);
    }
    if (total) src.meta = total;
    if (step) for (const f of ['inputTokens', 'outputTokens', 'costUsd']) src.steps[f] += finite(step[f]);
    const u = src.meta ?? src.steps;
    const e = this.usage.get(agentId);
    e.weight = tokensOf(u);
    e.ring.set(sec, TOKENS, tokensOf(u));
    e.ring.set(sec, COST, finite(u.costUsd));
  }

  /**
   * The buckets of a window ending at `endMs` and `spanS` seconds long: one-second buckets when
   * the window lies within the newest hour of what was observed (and is at most an hour long),
   * else one-minute buckets. `xs` are the buckets' starts in Unix seconds.
   */
  window(endMs, spanS) {
    const end = secondOf(endMs);
    const coarse = spanS > FINE_SECONDS || end - spanS + 1 <= Math.max(this.head, end) - FINE_SECONDS;
    const step = coarse ? 60 : 1;
    const last = Math.floor(end / step);
    const n = Math.max(1, Math.ceil(spanS / step));
    const first = last - n + 1;
    const xs = new Array(n);
    for (let k = 0; k < n; k++) xs[k] = (first + k) * step;
    return { coarse, step, first, n, xs, endS: end };
  }

  /** Per second over the window `w` (`window()`), from counts. */
  static rate(counts, w) {
    return w.step === 1 ? counts : counts.map((v) => v / w.step);
  }

  /** Totals: {sent, delivered, failed} counts and `connected` levels over `w`. */
  totals(w) {
    return {
      sent: this.total.read(SENT, w.first, w.n, w.coarse),
      delivered: this.total.read(DELIVERED, w.first, w.n, w.coarse),
      failed: this.total.read(FAILED, w.first, w.n, w.coarse),
      connected: this.total.read(CONNECTED, w.first, w.n, w.coarse),
    };
  }

  /** One agent's {sent, delivered, failed} counts over `w`, or null when it is not tracked. */
  agent(id, w) {
    const e = this.agents.map.get(id);
    if (!e) return null;
    return {
      sent: e.ring.read(SENT, w.first, w.n, w.coarse),
      delivered: e.ring.read(DELIVERED, w.first, w.n, w.coarse),
      failed: e.ring.read(FAILED, w.first, w.n, w.coarse),
    };
  }

  /**
   * The `top` agents with the most of `what` (`sent`, `delivered`, `failed`) in `w`: [{id,
   * counts, total}], busiest first; agents with none are left out.
   */
  topAgents(what, w, top) {
    const c = { sent: SENT, delivered: DELIVERED, failed: FAILED }[what] ?? SENT;
    const out = [];
    for (const [id, e] of this.agents.map) {
      if (e.weight === 0) continue;
      const total = e.ring.sum(c, w.first, w.n, w.coarse);
      if (total > 0) out.push({ id, total, ring: e.ring });
    }
    out.sort((a, b) => b.total - a.total || (a.id < b.id ? -1 : 1));
    // Only the agents drawn get their series read out.
    return out.slice(0, top).map(({ id, total, ring }) => ({ id, total, counts: ring.read(c, w.first, w.n, w.coarse) }));
  }

  /**
   * Reply latency in ms per answering agent over `w` (the mean of each bucket; null where the
   * agent answered nothing): [{id, ms, replies, mean, max}], most replies first. `only`: one agent id.
   */
  latencies(w, top, only = '') {
    const out = [];
    for (const [id, e] of this.latency.map) {
      if (only && id !== only) continue;
      const sums = e.ring.read(LAT_SUM, w.first, w.n, w.coarse);
      const counts = e.ring.read(LAT_COUNT, w.first, w.n, w.coarse);
      let replies = 0;
      let sum = 0;
      let max = 0;
      const ms = counts.map((n, k) => {
        if (!n) return null;
        replies += n;
        sum += sums[k];
        const mean = sums[k] / n;
        if (mean > max) max = mean;
        return mean;
      });
      if (replies > 0) out.push({ id, ms, replies, mean: sum / replies, max });
    }
    out.sort((a, b) => b.replies - a.replies || (a.id < b.id ? -1 : 1));
    return out.slice(0, top);
  }

  /**
   * Usage per agent over `w` (levels: the running totals): [{id, tokens, cost, lastTokens,
   * lastCost}], most tokens first; agents with nothing reported by the window's end left out.
   */
  usages(w, top, only = '') {
    const out = [];
    for (const [id, e] of this.usage.map) {
      if (only && id !== only) continue;
      const tokens = e.ring.read(TOKENS, w.first, w.n, w.coarse);
      const cost = e.ring.read(COST, w.first, w.n, w.coarse);
      const lastTokens = tokens[tokens.length - 1];
      if (lastTokens === null) continue;
      out.push({ id, tokens, cost, lastTokens, lastCost: cost[cost.length - 1] });
    }
    out.sort((a, b) => b.lastTokens - a.lastTokens || (a.id < b.id ? -1 : 1));
    return out.slice(0, top);
  }
}

// ---------------------------------------------------------------------------------------------
// /metrics (Prometheus text)

/**
 * The samples of a Prometheus text exposition (classic or OpenMetrics): name → sum over its
 * label sets, and `name{labels}` → value for each labelled sample.
 */
export function parseMetrics(text) {
  const sums = new Map();
  const labelled = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const v = Number(m[3]);
    if (!Number.isFinite(v)) continue;
    sums.set(m[1], (sums.get(m[1]) ?? 0) + v);
    if (m[2]) labelled.set(m[1] + m[2], v);
  }
  return { sums, labelled };
}

/** Gauges sampled from /metrics kept since the page was opened (2 s apart: an hour). */
export const METRIC_SAMPLES = 1800;

/**
 * What the charts take from one scrape at `t` (Unix ms), given the previous sample (for the
 * store's commit time: the mean over the commits between the two scrapes, in ms; null when
 * there was none).
 */
export function metricSample(t, parsed, prev) {
  const g = (name) => parsed.sums.get(name) ?? null;
  const commitSum = g('map_store_commit_duration_seconds_sum');
  const commitCount = g('map_store_commit_duration_seconds_count');
  let commitMs = null;
  if (prev && commitSum !== null && commitCount !== null && prev.commitCount !== null && commitCount > prev.commitCount) {
    commitMs = ((commitSum - prev.commitSum) / (commitCount - prev.commitCount)) * 1000;
  }
  return {
    t,
    connections: g('map_connections'),
    sessions: g('map_sessions'),
    outbox: g('map_outbox_frames'),
    outboxMax: g('map_outbox_frames_max'),
    pending: g('map_pending_messages'),
    paused: parsed.labelled.get('map_subscriptions{state="paused"}') ?? null,
    commitSum,
    commitCount,
    commitMs,
  };
}
