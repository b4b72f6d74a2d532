//! [`Router`]: the owner of all routing state, and the loop of the router task.
//!
//! The router owns sessions, connections, the agent registry, scopes, the event bus and the
//! rest, and runs as one task that takes [`Command`]s from a bounded channel. Everyone else
//! holds a cheap [`RouterHandle`](crate::router::handle::RouterHandle). Because a single task
//! applies every change, sequence numbers and event order come from one place and need no
//! locks, and calls from one session are applied in the order they arrive.
//!
//! The router never waits on a peer: it hands frames to connection outboxes with `try_push`
//! only. A full outbox pauses that connection's subscriptions (their events stay in the log)
//! and queues its messages in a bounded per-connection queue; the connection's writer reports
//! room with [`Command::Drained`].

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tokio::sync::mpsc;

use crate::protocol::agent::Agent;
use crate::protocol::capabilities::Capability;
use crate::protocol::event::EventType;
use crate::protocol::ids::{AgentId, EventId, ParticipantId, SubscriptionId};
use crate::router::agents::registry::Registry;
use crate::router::agents::supervised::{ProcessControl, Supervision};
use crate::router::caller::{Caller, Ctx};
use crate::router::config::RouterConfig;
use crate::router::error::RouterError;
use crate::router::events::bus::{DiskRows, EventBus};
use crate::router::events::log::{Audience, EventDraft, EventLog, FilterKeys};
use crate::router::ids::ConnId;
use crate::router::messaging::state::Messaging;
use crate::router::outbox::Outbox;
use crate::router::permissions;
use crate::router::scopes::table::Scopes;
use crate::router::sessions::table::{self as session, Conns, Sessions};
use crate::router::timers::{Deadline, Timers};

/// A request-scoped operation the router runs on its own task.
pub type Op = Box<dyn FnOnce(&mut Router) + Send>;

/// Messages into the router.
pub enum Command {
    /// A new connection with its outbox.
    Attach {
        /// The connection.
        conn: ConnId,
        /// Its outbox.
        outbox: Outbox,
        /// Who is on the other end.
        origin: session::ConnOrigin,
        /// The medium.
        transport: session::Transport,
        /// In cluster mode, the node the connection is on when it is not this one (a relay
        /// session of a standby's connection).
        node: Option<Arc<str>>,
    },
    /// The connection's transport closed.
    Detach {
        /// The connection.
        conn: ConnId,
    },
    /// Run an operation (a method call) for a connection.
    Call(Op),
    /// A subscription's `map/subscribe` response is queued: start delivering.
    Activate {
        /// The connection.
        conn: ConnId,
        /// The subscription id.
        subscription: SubscriptionId,
    },
    /// The connection's writer has room again.
    Drained {
        /// The connection.
        conn: ConnId,
    },
    /// Rows the store read for a subscription's catch-up.
    DiskRows(DiskRows),
    /// The store committed every event below this log position (read-committed delivery).
    Committed(u64),
    /// Detach everyone and stop.
    Shutdown,
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Attach { conn, .. } => write!(f, "Attach({conn})"),
            Self::Detach { conn } => write!(f, "Detach({conn})"),
            Self::Call(_) => f.write_str("Call"),
            Self::Activate { conn, subscription } => write!(f, "Activate({conn}, {subscription})"),
            Self::Drained { conn } => write!(f, "Drained({conn})"),
            Self::DiskRows(rows) => {
                write!(f, "DiskRows({}, {})", rows.subscription, rows.from)
            }
            Self::Committed(upto) => write!(f, "Committed({upto})"),
            Self::Shutdown => f.write_str("Shutdown"),
        }
    }
}

/// The owner of all routing state.
#[derive(Debug)]
pub struct Router {
    pub(super) config: Arc<RouterConfig>,
    pub(super) conns: Conns,
    pub(super) sessions: Sessions,
    pub(super) registry: Registry,
    pub(super) scopes: Scopes,
    pub(super) bus: EventBus,
    pub(super) timers: Timers,
    pub(super) shutting_down: bool,
    /// Agents whose processes the router supervises, and the channel to the supervisor.
    pub(super) supervised: Supervision,
    /// The durable event store, when the log is durable.
    pub(super) store: Option<Arc<dyn crate::store::EventStore>>,
    /// The store's commit progress (with a store), for [`Router::check_backlog`].
    pub(super) store_progress: Option<tokio::sync::watch::Receiver<u64>>,
    /// Cluster mode, live node: what was last saved for the next live node
    /// (`router::handover`); `None` saves nothing.
    pub(super) handover: Option<crate::router::changes::Saver>,
    /// The saved records the store came back with, restored before the first command.
    pub(super) saved_at_open: Vec<crate::store::record::StoredRow>,
    /// Cluster standby: its fold of the lifecycle events it follows (`sessions::recovery`).
    pub(super) standby_fold: Option<crate::router::sessions::lifecycle::LifecycleFold>,
    /// The node that took the stream over: the standby's fold, carried over.
    pub(super) carried_fold: Option<crate::router::sessions::lifecycle::LifecycleFold>,
    /// Events appended since the last flush to the store.
    pub(super) unflushed: Vec<Arc<crate::router::events::log::EventRecord>>,
    /// Messages kept for agents that are away, and recent deliveries (reply correlation).
    pub(super) messaging: Messaging,
    /// Trajectory checkpoints and content requests waiting on agents.
    pub(super) trajectories: crate::router::trajectory::table::Trajectories,
    /// The tasks extension's tasks.
    pub(super) tasks: crate::router::tasks::table::Tasks,
    /// The mail extension's conversations.
    pub(super) mailboxes: crate::router::mail::table::Mailboxes,
    /// Traces out: the span model run on each logged event (`router::traces`).
    pub(super) traces: Option<Box<crate::router::traces::Tap>>,
    /// The trace context of the current call (`params._meta.traceparent`): stamped on its
    /// events that have none of their own.
    pub(super) call_trace: Option<crate::protocol::trace::TraceContext>,
    /// Whether `call_trace` is a cluster node's relay span (`relayTraceparent`): then it wins
    /// over a message's own `meta.traceparent` for the events' `_meta`.
    pub(super) call_relayed: bool,
    /// Causes the current call declared (`params._meta.causedBy`); given to its events that
    /// have no cause of their own.
    pub(super) call_causes: Vec<EventId>,
    /// Running counts for the metrics (read at scrape time).
    pub(super) counters: crate::router::metrics::counters::Counters,
    /// Who owns which participant id and agent id.
    pub(super) identities: crate::router::identities::table::Identities,
    /// How the kept items (tasks, checkpoints, conversations, turns) are read: the store, or
    /// in-memory tables; the loads in flight.
    pub(super) kept: crate::router::kept::Kept,
    /// What each quota owner has created (tasks, conversations, checkpoints): a bounded cache
    /// of the store's counts.
    pub(super) created: crate::router::kept::cache::Cache<crate::store::kept::OwnerCounts>,
    /// Federation: which session speaks for which peer system.
    pub(super) federation: crate::router::federation::Federation,
}

/// The router's collaborators.
#[derive(Debug, Default)]
pub struct RouterParts {
    /// Where process controls go (the supervisor).
    pub process_control: Option<mpsc::Sender<ProcessControl>>,
    /// The durable event store and what it recovered.
    pub store: Option<(Arc<dyn crate::store::EventStore>, crate::store::Recovered)>,
    /// The server's metrics (`None`: not collected).
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
    /// The span model and where its spans go, when traces are exported (`router::traces`).
    pub traces: Option<crate::router::traces::Tap>,
    /// Cluster mode, the node that takes the stream over: its standby's fold of the lifecycle
    /// events ([`LifecycleFold`](crate::router::sessions::lifecycle::LifecycleFold)).
    pub carried_fold: Option<crate::router::sessions::lifecycle::LifecycleFold>,
}

/// Sizes of the router's state at one moment ([`RouterHandle::stats`](crate::router::handle::RouterHandle::stats)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouterStats {
    /// Attached transports.
    pub connections: usize,
    /// Sessions, attached or detached (within their resume window).
    pub sessions: usize,
    /// Registered agents (orphans included).
    pub agents: usize,
    /// Live subscriptions.
    pub subscriptions: usize,
    /// Events in the in-memory window.
    pub log_events: usize,
    /// The sequence number the next event gets.
    pub next_seq: u64,
    /// Entries of the router's other tables and indexes: what must shrink back once sessions,
    /// orphans and loads are gone (`scripts/soak-memory.sh` compares them).
    pub tables: TableSizes,
}

/// Entries of the router's tables and indexes, beyond the counts of [`RouterStats`]. Each is
/// either bounded by a constant or follows the live sessions and agents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TableSizes {
    /// Deadlines waiting (session expiries, orphan grace periods, credential expiries).
    pub timers: usize,
    /// Entries of the sessions' participant and resume-token indexes.
    pub session_index: usize,
    /// Entries of the agents' order and owner indexes.
    pub agent_index: usize,
    /// Scope memberships.
    pub scope_members: usize,
    /// Agents with messages kept while they are away.
    pub offline_agents: usize,
    /// Messages kept for agents that are away.
    pub offline_messages: usize,
    /// Deliveries remembered for reply correlation (at most 16 384).
    pub reply_index: usize,
    /// Owned participant and agent ids (`router::identities`).
    pub identities: usize,
    /// Content requests waiting on agents.
    pub content_requests: usize,
    /// Tasks cached.
    pub cached_tasks: usize,
    /// Checkpoints cached.
    pub cached_checkpoints: usize,
    /// Conversation records cached.
    pub cached_conversations: usize,
    /// Turn places cached.
    pub cached_turns: usize,
    /// Quota owners' counts cached.
    pub cached_quota_counts: usize,
    /// Loads of kept items in flight.
    pub loads: usize,
}

impl Router {
    /// The sizes of [`TableSizes`], now.
    pub(crate) fn table_sizes(&self) -> TableSizes {
        let (offline_agents, offline_messages) = self.messaging.offline_len();
        TableSizes {
            timers: self.timers.len(),
            session_index: self.sessions.index_len(),
            agent_index: self.registry.index_len(),
            scope_members: self.scopes.memberships(),
            offline_agents,
            offline_messages,
            reply_index: self.messaging.deliveries_len(),
            identities: self.identities.len(),
            content_requests: self.trajectories.pending_len(),
            cached_tasks: self.tasks.cache.len(),
            cached_checkpoints: self.trajectories.cache.len(),
            cached_conversations: self.mailboxes.convs.len(),
            cached_turns: self.mailboxes.turns.len(),
            cached_quota_counts: self.created.len(),
            loads: self.kept.loads_in_flight(),
        }
    }
}

impl Router {
    pub(crate) fn new(config: Arc<RouterConfig>) -> Self {
        let cache_items = config.cache_items;
        Self {
            identities: crate::router::identities::table::Identities::new(config.ids_per_principal),
            bus: EventBus::new(EventLog::new(config.retention)),
            config,
            conns: Conns::default(),
            sessions: Sessions::default(),
            registry: Registry::default(),
            scopes: Scopes::default(),
            timers: Timers::default(),
            shutting_down: false,
            supervised: Supervision::default(),
            store: None,
            store_progress: None,
            handover: None,
            saved_at_open: Vec::new(),
            standby_fold: None,
            carried_fold: None,
            unflushed: Vec::new(),
            messaging: Messaging::default(),
            trajectories: crate::router::trajectory::table::Trajectories::new(cache_items, 0),
            tasks: crate::router::tasks::table::Tasks::new(cache_items, 0),
            mailboxes: crate::router::mail::table::Mailboxes::new(cache_items, 0),
            kept: crate::router::kept::Kept::new(None),
            created: crate::router::kept::cache::Cache::new(cache_items),
            federation: Default::default(),
            call_causes: Vec::new(),
            traces: None,
            call_trace: None,
            call_relayed: false,
            counters: Default::default(),
        }
    }

    /// The command loop: block for one command, then take what else is ready (bounded) before
    /// looking at timers, so a burst is handled without a wake-up per command.
    pub(super) async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        const BATCH: usize = 256;
        // First, before any command: end what the previous run left open (commands wait in
        // the channel meanwhile).
        self.recover_previous_run().await;
        loop {
            let next_deadline = self.timers.next();
            let cmd = tokio::select! {
                cmd = rx.recv() => cmd,
                () = sleep_until_opt(next_deadline) => {
                    self.fire_deadlines(Instant::now());
                    self.flush_store();
                    continue;
                }
            };
            let Some(cmd) = cmd else { break };
            let mut stop = self.handle(cmd);
            for _ in 0..BATCH {
                if stop {
                    break;
                }
                match rx.try_recv() {
                    Ok(cmd) => stop = self.handle(cmd),
                    Err(_) => break,
                }
            }
            if next_deadline.is_some_and(|d| d <= Instant::now()) {
                self.fire_deadlines(Instant::now());
            }
            // NB: once per batch, so the store sees one append per burst, not one per event.
            self.flush_store();
            if stop {
                break;
            }
        }
        self.flush_store();
    }

    /// Hands the events appended since the last flush to the durable store.
    pub(super) fn flush_store(&mut self) {
        self.save_changed();
        if self.unflushed.is_empty() {
            return;
        }
        let records = std::mem::take(&mut self.unflushed);
        if let Some(store) = &self.store {
            store.append_records(records);
        }
    }

    /// Applies one command; returns true when the router should stop.
    pub(super) fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Attach {
                conn,
                outbox,
                origin,
                transport,
                node,
            } => {
                self.counters.connection_opened(transport);
                self.conns.attach(conn, outbox, origin, transport, node);
            }
            Command::Detach { conn } => self.handle_transport_closed(conn),
            Command::Call(op) => op(self),
            Command::Activate { conn, subscription } => {
                let owned = self.bus.get(&subscription).is_some_and(|s| s.conn == conn);
                if owned {
                    let (bus, agents) = self.bus_and_agents();
                    bus.activate(&subscription, agents);
                }
            }
            Command::Drained { conn } => self.handle_drained(conn),
            Command::DiskRows(DiskRows {
                subscription,
                from,
                rows,
            }) => {
                let (bus, agents) = self.bus_and_agents();
                bus.deliver_disk(&subscription, from, rows, agents)
            }
            Command::Committed(upto) => {
                let (bus, agents) = self.bus_and_agents();
                bus.committed(upto, agents);
                // Writes the caches held until their commit may go now.
                self.trim_kept();
            }
            Command::Shutdown => {
                self.handle_shutdown();
                return true;
            }
        }
        false
    }

    pub(super) fn handle_drained(&mut self, conn: ConnId) {
        self.conns.flush_pending(conn);
        let (bus, agents) = self.bus_and_agents();
        bus.resume_conn(conn, agents);
    }

    pub(super) fn fire_deadlines(&mut self, now: Instant) {
        // NB: a deadline's handler may schedule another one that is already due.
        loop {
            let due = self.timers.take_due(now);
            if due.is_empty() {
                return;
            }
            for d in due {
                match d {
                    Deadline::SessionExpiry(s) => self.expire_session(&s),
                    Deadline::OrphanExpiry(a) => self.expire_orphan(&a),
                    Deadline::QueueExpiry(a) => self.expire_recovered_queue(&a),
                    Deadline::CredentialExpiring(s, epoch) => self.credential_expiring(&s, epoch),
                    Deadline::CredentialExpired(s, epoch) => self.credential_expired(&s, epoch),
                    Deadline::RefreshSaved => self.refresh_saved(),
                    Deadline::FlushSpans => {
                        if let Some(tap) = &mut self.traces {
                            tap.flush_due(crate::protocol::ids::now_ms());
                            self.schedule(
                                std::time::Instant::now() + crate::router::traces::FLUSH_EVERY,
                                Deadline::FlushSpans,
                            );
                        }
                    }
                }
            }
        }
    }

    pub(super) fn schedule(&mut self, at: Instant, d: Deadline) {
        self.timers.schedule(at, d);
    }

    /// Refuses a call while more events than `max_uncommitted` wait for the store's commit
    /// (the store is slow or away): queueing more would only grow memory, and the call
    /// would fail on its commit timeout anyway.
    pub(super) fn check_backlog(&self) -> Result<(), RouterError> {
        let (Some(progress), limit) = (&self.store_progress, self.config.max_uncommitted) else {
            return Ok(());
        };
        let waiting = self.bus.log.next_seq().saturating_sub(*progress.borrow());
        if limit > 0 && waiting > limit {
            return Err(RouterError::store_behind(waiting, limit));
        }
        Ok(())
    }

    /// Checks that the connection may make this call.
    pub(super) fn check_call(
        &self,
        ctx: &Ctx,
        capability: Option<Capability>,
        needs_session: bool,
    ) -> Result<(), RouterError> {
        if !needs_session {
            return Ok(());
        }
        let session = self.session_of(ctx)?;
        if let Some(cap) = capability {
            if !session.capabilities().has(cap) {
                return Err(RouterError::PermissionDenied(cap.path().into()));
            }
        }
        Ok(())
    }

    pub(super) fn session_of(&self, ctx: &Ctx) -> Result<&session::Session, RouterError> {
        self.conns
            .get(&ctx.conn)
            .and_then(|c| c.session())
            .and_then(|s| self.sessions.get(s))
            .ok_or(RouterError::NotConnected)
    }

    /// Records that the caller's session made a call (`lastActiveAt` of `map/session/list`).
    pub(super) fn touch_session(&mut self, ctx: &Ctx) {
        let session = self.conns.get(&ctx.conn).and_then(|c| c.session().cloned());
        if let Some(id) = session {
            self.sessions.touch(&id);
        }
    }

    /// The caller's identity, for handlers.
    pub fn caller(&self, ctx: &Ctx) -> Result<Caller, RouterError> {
        let s = self.session_of(ctx)?;
        let primary_agent = s
            .primary_agent()
            .cloned()
            .filter(|a| self.registry.is_owned_by(a, s.participant()));
        Ok(Caller {
            session: s.id().clone(),
            participant: s.participant().clone(),
            kind: s.kind(),
            primary_agent,
            principal: s.principal().cloned(),
            policy: self.config.permissions.clone(),
        })
    }

    /// Whether the caller holds a capability.
    pub fn caller_has(&self, ctx: &Ctx, cap: Capability) -> bool {
        self.session_of(ctx)
            .is_ok_and(|s| s.capabilities().has(cap))
    }

    /// Appends an event to the log and fans it out. Returns its id.
    pub fn emit(&mut self, draft: EventDraft) -> EventId {
        let trace = self.call_trace.clone();
        self.emit_traced(draft, trace.as_ref())
    }

    /// [`Router::emit`] with the event's own trace context (a message's `meta.traceparent`)
    /// instead of the call's.
    pub fn emit_traced(
        &mut self,
        mut draft: EventDraft,
        trace: Option<&crate::protocol::trace::TraceContext>,
    ) -> EventId {
        if self.config.follower {
            // A follower's own sessions come and go without a trace in the log another node
            // writes; nothing else reaches here (the method table refuses it).
            if !matches!(
                draft.kind,
                EventType::ParticipantConnected | EventType::ParticipantDisconnected
            ) {
                tracing::error!(kind = %draft.kind.as_str(), "a follower does not write the event log; event not logged (a bug)");
            }
            return EventId(crate::protocol::ids::Ulid(0));
        }
        if draft.caused_by.is_empty() && !self.call_causes.is_empty() {
            draft.caused_by = self.call_causes.clone();
        }
        let rec = self.bus.log.append(draft, trace);
        self.counters.event_appended();
        if let Some(memory) = &mut self.kept.memory {
            // No store: the kept tables are these, written as their events are logged.
            if crate::store::kept::KeptTable::of_kind(rec.kind.as_str()).is_some() {
                if let Some(row) = rec.to_row() {
                    memory.ingest(row);
                }
            }
        }
        if self.store.is_some() {
            // The store builds the row on its own thread.
            self.unflushed.push(rec.clone());
        }
        if let Some(tap) = &mut self.traces {
            let registry = &self.registry;
            tap.observe(&rec, &|id| {
                registry
                    .get(&crate::protocol::ids::AgentId::from(id))
                    .map(|r| crate::router::traces::AgentFacts {
                        name: r
                            .agent()
                            .name
                            .as_deref()
                            .map_or_else(|| Arc::from(id), Arc::from),
                        role: r.agent().role.as_deref().map(Arc::from),
                    })
            });
        }
        let (bus, agents) = self.bus_and_agents();
        bus.publish(&rec, agents);
        // Records appended by `append` always carry an id.
        rec.id.unwrap_or(EventId(crate::protocol::ids::Ulid(0)))
    }

    /// Builds and emits an event about an agent: source = the agent, audience from its
    /// visibility, role keys from its role.
    pub fn emit_agent_event<D: Serialize>(
        &mut self,
        kind: EventType,
        agent: &Agent,
        data: &D,
        caused_by: Vec<EventId>,
    ) -> EventId {
        let role: Option<Arc<str>> = agent.role.as_deref().map(Arc::from);
        let metadata = match kind {
            // Parsed here, once, for `metadataMatch` filters; the event carries the text.
            EventType::AgentRegistered | EventType::AgentMetadataChanged => agent
                .metadata
                .as_ref()
                .and_then(|m| m.parse::<serde_json::Map<String, serde_json::Value>>().ok())
                .map(Arc::new),
            _ => None,
        };
        let draft = EventDraft {
            kind,
            source: Some(agent.id.as_arc().clone()),
            data: to_json(data),
            caused_by,
            keys: FilterKeys {
                agent_id: Some(agent.id.clone()),
                source_role: role.clone(),
                subject_role: role,
                metadata,
                ..FilterKeys::default()
            },
            audience: permissions::agent_audience(
                agent,
                self.agent_view(),
                &self.config.permissions,
            ),
        };
        self.emit(draft)
    }

    /// Emits `participant_connected` / `participant_disconnected` about `participant`. They name
    /// the participant, and the SDK's `AgentConnection` uses its agent's id as the participant
    /// id, so they are narrowed like agent events: a participant id hidden by the exposure rules
    /// is seen by system observers only, and a participant owning agents only by those who may
    /// see every one of them (those it owns, and `also`: the orphans a resume is reclaiming).
    pub(crate) fn emit_participant_event<D: Serialize>(
        &mut self,
        kind: EventType,
        participant: &ParticipantId,
        also: &[AgentId],
        data: &D,
        caused_by: Vec<EventId>,
    ) -> EventId {
        let policy = &self.config.permissions;
        let mut audience = if permissions::agent_exposed(policy, participant.as_str()) {
            Audience::Everyone
        } else {
            Audience::System
        };
        // With authentication on, what a session says about itself is its principal's business:
        // other principals do not learn who connected (nor the names its agents connect under).
        if let Some(p) = self
            .sessions
            .by_participant(participant)
            .and_then(|s| s.principal())
        {
            audience = audience.and(Audience::Principal {
                id: p.id.clone(),
                issuer: p.issuer.clone(),
            });
        }
        let owned = self.registry.owned_by(participant);
        for id in owned.iter().chain(also) {
            if let Some(r) = self.registry.get(id) {
                audience = audience.and(permissions::agent_audience(
                    r.agent(),
                    self.agent_view(),
                    policy,
                ));
            }
        }
        self.emit(EventDraft {
            kind,
            source: Some(participant.as_arc().clone()),
            data: to_json(data),
            caused_by,
            keys: FilterKeys::default(),
            audience,
        })
    }

    /// Emits an event with no particular agent subject.
    pub fn emit_plain<D: Serialize>(
        &mut self,
        kind: EventType,
        source: Option<Arc<str>>,
        data: &D,
        keys: FilterKeys,
        caused_by: Vec<EventId>,
    ) -> EventId {
        self.emit(EventDraft {
            kind,
            source,
            data: to_json(data),
            caused_by,
            keys,
            audience: Audience::Everyone,
        })
    }

    /// Marks the router as stopping, so that connections closing from now on are recorded with
    /// reason `shutdown` (the server calls this before it closes them).
    pub(crate) fn begin_shutdown(&mut self) {
        self.shutting_down = true;
    }

    fn handle_shutdown(&mut self) {
        self.shutting_down = true;
        let conns: Vec<ConnId> = self.conns.ids();
        for conn in conns {
            self.handle_transport_closed(conn);
        }
    }

    /// The agents as the other parts read them (`router::views`).
    pub(crate) fn agent_view(&self) -> crate::router::views::AgentView<'_> {
        crate::router::views::AgentView::new(&self.registry, &self.scopes)
    }

    /// The event bus, to change, beside the agents its delivery checks read (one borrow of
    /// the router split in two).
    pub(crate) fn bus_and_agents(
        &mut self,
    ) -> (&mut EventBus, crate::router::views::AgentView<'_>) {
        (
            &mut self.bus,
            crate::router::views::AgentView::new(&self.registry, &self.scopes),
        )
    }

    /// The scopes as the other parts read them.
    pub(crate) fn scope_view(&self) -> crate::router::views::ScopeView<'_> {
        crate::router::views::ScopeView::new(&self.scopes)
    }

    /// The sessions as the other parts read them.
    pub(crate) fn session_view(&self) -> crate::router::views::SessionView<'_> {
        crate::router::views::SessionView::new(&self.sessions)
    }

    /// Number of attached connections (for tests and metrics).
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Serializes event data. Our data types contain only strings, numbers, maps and vectors, for
/// which serde_json cannot fail; an empty object keeps the event well-formed regardless.
pub(crate) fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "{}".into())
}
