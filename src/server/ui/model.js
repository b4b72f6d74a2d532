// The dashboard's picture of the system: agents (with their supervised process, checkpoints
// and usage), scopes and participants, changed one MAP event at a time. Pure: no DOM, no I/O,
// so the same code folds the live stream, the history read at attach, and time travel.
//
// Two models are kept by app.js: the *live* one starts from the `map/agents/list` and
// `map/scopes/list` snapshot (authoritative records) and the *fold* starts empty at the
// beginning of the log and applies every event (it alone knows process details, which no
// snapshot carries, and it is what time travel rebuilds).

/** Lines of stderr kept per agent (the router keeps 20 as the tail). */
export const STDERR_LINES = 20;
/** Checkpoints kept per agent in memory. */
export const CHECKPOINTS_PER_AGENT = 500;

/** Participants remembered (connected ones, then the most recently gone). */
export const PARTICIPANTS_KEPT = 1000;

/** Numbers an agent reports under `metadata.usage` (docs/dashboard.md). */
export const USAGE_FIELDS = ['inputTokens', 'outputTokens', 'costUsd'];

export class Model {
  constructor() {
    /** @type {Map<string, object>} agent id → agent record (wire shape, plus what events add) */
    this.agents = new Map();
    /** @type {Map<string, object>} scope id → scope record */
    this.scopes = new Map();
    /** @type {Map<string, object>} participant id → {id, type, name} */
    this.participants = new Map();
    /** @type {Map<string, object>} agent id → supervised process details */
    this.procs = new Map();
    /** @type {Map<string, Map<string, object>>} agent id → checkpoint id → checkpoint */
    this.checkpoints = new Map();
    /** The id of the last event applied (or the snapshot's `asOf`). */
    this.lastEventId = null;
    /** How many events were applied. */
    this.applied = 0;
  }

  /** A model from `map/agents/list` and `map/scopes/list` results. */
  static fromSnapshot(agents, scopes, asOf) {
    const m = new Model();
    for (const a of agents ?? []) {
      // In cluster mode, the node the agent's connection is on (`_meta.mapRouter.presence`).
      const presence = a._meta?.mapRouter?.presence;
      const node = presence?.node;
      m.agents.set(a.id, { ...a, scopes: [...(a.scopes ?? [])], ...(node ? { node } : {}), ...(presence?.status ? { presence: { status: presence.status, since: presence.since ?? null } } : {}) });
      const life = a.lifecycle ?? {};
      if (life.exitCode !== undefined || life.exitReason !== undefined) {
        const p = m.proc(a.id);
        p.exitCode = life.exitCode ?? p.exitCode;
        p.exitReason = life.exitReason ?? p.exitReason;
      }
    }
    for (const s of scopes ?? []) m.scopes.set(s.id, { ...s });
    m.lastEventId = asOf ?? null;
    return m;
  }

  /** A deep copy (records are plain JSON). */
  clone() {
    const m = new Model();
    const copy = (v) => structuredClone(v);
    for (const [k, v] of this.agents) m.agents.set(k, copy(v));
    for (const [k, v] of this.scopes) m.scopes.set(k, copy(v));
    for (const [k, v] of this.participants) m.participants.set(k, copy(v));
    for (const [k, v] of this.procs) m.procs.set(k, copy(v));
    for (const [k, v] of this.checkpoints) m.checkpoints.set(k, new Map(copy([...v])));
    m.lastEventId = this.lastEventId;
    m.applied = this.applied;
    return m;
  }

  /** The process details of an agent, created empty on first use. */
  proc(agentId) {
    let p = this.procs.get(agentId);
    if (!p) {
      p = { pid: null, program: null, restarts: 0, exitCode: null, signal: null, exitReason: null, stderr: [], dropped: 0 };
      this.procs.set(agentId, p);
    }
    return p;
  }

  /**
   * Applies one event (the `event` object of `map/event` or of a replayed event). Unknown types
   * change nothing but still count as the last applied event.
   */
  apply(event) {
    const d = event.data ?? {};
    switch (event.type) {
      case 'agent_registered': {
        const prev = this.agents.get(d.agentId);
        const agent = prev ?? { id: d.agentId, state: 'registered', scopes: [] };
        agent.ownerId = d.ownerId ?? null;
        if (d.name !== undefined) agent.name = d.name;
        if (d.role !== undefined) agent.role = d.role;
        if (d.parent !== undefined) agent.parent = d.parent;
        if (d.metadata !== undefined) agent.metadata = d.metadata;
        if (!prev) {
          agent.lifecycle = { createdAt: event.timestamp };
        } else if (agent.state === 'orphaned' && d.resumed) {
          agent.state = 'registered';
        }
        this.agents.set(d.agentId, agent);
        break;
      }
      case 'agent_unregistered':
        this.agents.delete(d.agentId);
        this.procs.delete(d.agentId);
        this.checkpoints.delete(d.agentId);
        break;
      case 'agent_state_changed': {
        const agent = this.agents.get(d.agentId);
        if (agent) agent.state = d.newState;
        const supervised = this.procs.has(d.agentId);
        if (d.exitCode !== undefined || d.signal !== undefined || d.stderrTail !== undefined || supervised) {
          const p = this.proc(d.agentId);
          if (d.exitCode !== undefined) p.exitCode = d.exitCode;
          if (d.signal !== undefined) p.signal = d.signal;
          if (d.exitCode !== undefined || d.signal !== undefined) p.exitReason = d.reason ?? null;
          if (Array.isArray(d.stderrTail)) p.stderr = d.stderrTail.slice(-STDERR_LINES);
          if (d.reason === 'restarted') {
            // A new process: its pid is known again from its first stderr line (the router
            // announces only the first launch with agent.spawning).
            p.restarts += 1;
            p.pid = null;
          }
        }
        break;
      }
      case 'agent_orphaned': {
        const agent = this.agents.get(d.agentId);
        if (agent) {
          agent.state = 'orphaned';
          agent.ownerId = null;
        }
        break;
      }
      case 'agent_environment_changed': {
        const agent = this.agents.get(d.agentId);
        if (agent) agent.environment = d.environment;
        break;
      }
      case 'agent.presence.changed': {
        const agent = this.agents.get(d.agentId);
        if (agent && d.node) agent.node = d.node;
        // Online or offline, and since when (an AIP node silent past its heartbeat timeout).
        if (agent && d.status) agent.presence = { status: d.status, since: d.since ?? null };
        break;
      }
      case 'agent.metadata.changed': {
        const agent = this.agents.get(d.agentId);
        if (agent) agent.metadata = d.metadata ?? { ...(agent.metadata ?? {}), ...(d.changes ?? {}) };
        break;
      }
      case 'agent.spawning': {
        const p = this.proc(d.agentId);
        p.pid = d.pid ?? p.pid;
        p.program = d.program ?? p.program;
        break;
      }
      case 'agent.spawn.failed':
        this.proc(d.agentId).error = d.error;
        break;
      case 'agent.stderr': {
        const p = this.proc(d.agentId);
        if (d.pid !== undefined) p.pid = d.pid;
        p.stderr = [...p.stderr, ...(d.lines ?? [])].slice(-STDERR_LINES);
        p.dropped += d.dropped ?? 0;
        break;
      }
      case 'agent.diagnostic': {
        const p = this.proc(d.agentId);
        if (d.pid !== undefined) p.pid = d.pid;
        p.diagnostics = [...(p.diagnostics ?? []), `${d.stream}: ${d.error}: ${d.line}`].slice(-5);
        break;
      }
      case 'participant_connected':
        this.participants.set(d.participantId, { id: d.participantId, type: d.participantType, name: d.name });
        break;
      case 'participant_disconnected': {
        // Kept (as gone) so that old messages still show a name; the oldest gone ones go first.
        const p = this.participants.get(d.participantId);
        if (p) p.gone = true;
        if (this.participants.size > PARTICIPANTS_KEPT) {
          for (const [id, q] of this.participants) {
            if (q.gone) {
              this.participants.delete(id);
              break;
            }
          }
        }
        break;
      }
      case 'scope_created':
        this.scopes.set(d.scopeId, { ...(this.scopes.get(d.scopeId) ?? {}), id: d.scopeId, name: d.name, parent: d.parent });
        break;
      case 'scope_deleted':
        for (const id of [d.scopeId, ...(d.deletedDescendants ?? [])]) {
          this.scopes.delete(id);
          for (const agent of this.agents.values()) agent.scopes = (agent.scopes ?? []).filter((s) => s !== id);
        }
        break;
      case 'scope_member_joined': {
        const agent = this.agents.get(d.agentId);
        if (agent && !(agent.scopes ?? []).includes(d.scopeId)) agent.scopes = [...(agent.scopes ?? []), d.scopeId];
        break;
      }
      case 'scope_member_left': {
        const agent = this.agents.get(d.agentId);
        if (agent) agent.scopes = (agent.scopes ?? []).filter((s) => s !== d.scopeId);
        break;
      }
      case 'trajectory.checkpoint':
        if (d.checkpoint) this.addCheckpoint(d.checkpoint);
        break;
      default:
        break;
    }
    this.lastEventId = event.id ?? this.lastEventId;
    this.applied += 1;
  }

  /** Records a checkpoint (from an event or from `trajectory/list`), de-duplicated by id. */
  addCheckpoint(cp) {
    if (!cp || typeof cp.agentId !== 'string' || typeof cp.id !== 'string') return;
    let byId = this.checkpoints.get(cp.agentId);
    if (!byId) {
      byId = new Map();
      this.checkpoints.set(cp.agentId, byId);
    }
    byId.set(cp.id, cp);
    if (byId.size > CHECKPOINTS_PER_AGENT) byId.delete(byId.keys().next().value);
  }

  /** An agent's checkpoints, oldest first (by timestamp, then id). */
  checkpointsOf(agentId) {
    return [...(this.checkpoints.get(agentId)?.values() ?? [])].sort(
      (a, b) => (a.timestamp ?? 0) - (b.timestamp ?? 0) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0),
    );
  }

  /** Agents whose parent is not in the model (roots, or children of agents this principal cannot see). */
  roots() {
    return [...this.agents.values()].filter((a) => !a.parent || !this.agents.has(a.parent));
  }

  /** Direct children of an agent, in registration order. */
  children(agentId) {
    return [...this.agents.values()].filter((a) => a.parent === agentId && a.id !== agentId);
  }

  /** The agent and every descendant (each once). */
  subtree(agentId) {
    const seen = new Set();
    const walk = (id) => {
      if (seen.has(id) || !this.agents.has(id)) return;
      seen.add(id);
      for (const c of this.children(id)) walk(c.id);
    };
    walk(agentId);
    return [...seen];
  }

  /**
   * What an agent reports it used: its `metadata.usage` when present (the agent's running
   * total), otherwise the sum of its checkpoints' `metadata.usage` (each the usage of its step).
   * Null when it reports nothing.
   */
  usageOf(agentId) {
    const own = normalizeUsage(this.agents.get(agentId)?.metadata?.usage);
    if (own) return { ...own, source: 'metadata' };
    let sum = null;
    for (const cp of this.checkpointsOf(agentId)) {
      const u = normalizeUsage(cp.metadata?.usage);
      if (u) sum = addUsage(sum, u);
    }
    return sum ? { ...sum, source: 'checkpoints' } : null;
  }

  /** The usage of an agent and all its descendants, summed; `agents` counts those reporting. */
  subtreeUsage(agentId) {
    let total = { inputTokens: 0, outputTokens: 0, costUsd: 0, agents: 0 };
    for (const id of this.subtree(agentId)) {
      const u = this.usageOf(id);
      if (u) total = { ...addUsage(total, u), agents: total.agents + 1 };
    }
    return total;
  }
}

/** `{inputTokens, outputTokens, costUsd}` with numbers only, or null when none is a number. */
export function normalizeUsage(u) {
  if (!u || typeof u !== 'object') return null;
  const out = {};
  let any = false;
  for (const f of USAGE_FIELDS) {
    const v = u[f];
    if (typeof v === 'number' && Number.isFinite(v)) {
      out[f] = v;
      any = true;
    } else {
      out[f] = 0;
    }
  }
  return any ? out : null;
}

function addUsage(a, b) {
  const out = { ...(a ?? {}) };
  for (const f of USAGE_FIELDS) out[f] = (a?.[f] ?? 0) + (b?.[f] ?? 0);
  return out;
}

/** The agent ids an event is about (source, subject, sender, recipients). */
export function agentsOf(event) {
  const d = event.data ?? {};
  const ids = new Set();
  const add = (v) => {
    if (typeof v === 'string') ids.add(v);
  };
  add(event.source);
  add(d.agentId);
  add(d.from);
  add(d.recipient);
  add(d.participantId);
  for (const r of d.deliveredTo ?? []) add(r);
  for (const r of Array.isArray(d.recipients) ? d.recipients : []) add(r);
  add(d.checkpoint?.agentId);
  const to = d.to ?? d.message?.to;
  if (to && typeof to === 'object') {
    add(to.agent);
    for (const a of Array.isArray(to.agents) ? to.agents : []) add(a);
  } else {
    add(to);
  }
  return ids;
}

/** The scope ids an event is about. */
export function scopesOf(event) {
  const d = event.data ?? {};
  const ids = new Set();
  if (typeof d.scopeId === 'string') ids.add(d.scopeId);
  const to = d.to ?? d.message?.to;
  if (to && typeof to === 'object' && typeof to.scope === 'string') ids.add(to.scope);
  return ids;
}
