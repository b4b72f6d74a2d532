//! The router core: the one owner of all routing state. It opens no sockets.
//!
//! [`Router`] owns sessions, connections, the agent registry, scopes and the event bus, and runs
//! as one task that takes [`Command`]s from a bounded channel. Everyone else holds a cheap
//! [`RouterHandle`]. Because a single task applies every change, sequence numbers and event
//! order come from one place and need no locks, and calls from one session are applied in the
//! order they arrive.
//!
//! The router never waits on a peer: it hands frames to connection outboxes with `try_push`
//! only. A full outbox pauses that connection's subscriptions (their events stay in the log) and
//! queues its messages in a bounded per-connection queue; the connection's writer reports room
//! with [`Command::Drained`].
//!
//! Handlers live in sibling modules, grouped by concept: `session_ops` (connect, disconnect,
//! detach, resume), `auth_ops` (admission, authenticate, refresh, credential expiry), `agent_ops`, `scope_ops`, `messaging` (send and address resolution) and
//! `subscription_ops` (subscribe, unsubscribe, replay).

pub mod agent_ops;
pub mod auth_ops;
pub mod dispatch;
pub mod error;
pub mod events;
pub mod messaging;
pub mod outbox;
pub mod permissions;
pub mod pipeline;
pub mod quotas;
pub mod rate;
pub mod recovery;
pub mod registry;
pub mod scope_ops;
pub mod scopes;
pub mod session;
pub mod session_ops;
pub mod steering;
pub mod subscription_ops;
pub mod supervision;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::protocol::agent::Agent;
use crate::protocol::capabilities::{Capability, ParticipantType};
use crate::protocol::event::EventType;
use crate::protocol::ids::{AgentId, EventId, ParticipantId, SessionId, SubscriptionId};

pub use self::error::RouterError;
use self::events::log::{Audience, EventDraft, EventLog, FilterKeys, Retention};
use self::events::EventBus;
use self::outbox::Outbox;
use self::registry::Registry;
use self::scopes::Scopes;
use self::session::{Conn, Sessions};

/// Identifies one transport connection inside the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conn-{}", self.0)
    }
}

/// Default outbox size per connection, in frames. Large enough to absorb bursts at full speed,
/// small enough that a stalled peer pins little memory (the log keeps the rest).
pub const DEFAULT_OUTBOX_FRAMES: usize = 1024;
/// Default bound on `map/message` frames queued per connection beyond its outbox.
pub const DEFAULT_PENDING_MESSAGES: usize = 4096;
/// Default event-log retention, in events.
pub const DEFAULT_LOG_EVENTS: usize = 100_000;
/// Default event-log retention, in bytes (about).
pub const DEFAULT_LOG_BYTES: usize = 64 * 1024 * 1024;
/// Default window for resuming a detached session, and the grace period of orphaned agents.
pub const DEFAULT_RESUME_WINDOW: Duration = Duration::from_secs(60);
/// Default capacity of the router's command channel.
pub const DEFAULT_COMMAND_QUEUE: usize = 8192;
/// Default wait for a call's events to become durable: long enough for a slow disk's fsync
/// under load, short enough that a failing disk surfaces as errors rather than hung calls.
pub const DEFAULT_COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// Router settings.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// `systemInfo.name`.
    pub name: String,
    /// `systemInfo.version`.
    pub version: String,
    /// Frames per connection outbox.
    pub outbox_frames: usize,
    /// `map/message` frames queued per connection while its outbox is full.
    pub pending_messages: usize,
    /// Event-log retention.
    pub retention: Retention,
    /// How long a detached session can be resumed, and how long its orphaned agents wait to be
    /// reclaimed before they are unregistered (under the default `grace-period` policy).
    pub resume_window: Duration,
    /// Capacity of the command channel.
    pub command_queue: usize,
    /// Whether `map/send` to an unknown explicit agent or scope is an error (2001/2002) rather
    /// than a success with `delivered: []` (the TestServer's behaviour).
    pub strict_recipients: bool,
    /// When state-changing calls are answered relative to durability (with a store).
    pub durability: Durability,
    /// How long a call waits for its events to be committed before it fails.
    pub commit_timeout: Duration,
    /// Authentication, when some method is enabled (`None`: everyone is admitted, anonymous).
    pub auth: Option<Arc<crate::auth::Authenticator>>,
    /// Per-session and per-principal quotas (`[limits]`).
    pub quotas: quotas::Quotas,
    /// Who may see and do what (`[permissions]`).
    pub permissions: permissions::SharedPolicy,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            name: "map-router".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            outbox_frames: DEFAULT_OUTBOX_FRAMES,
            pending_messages: DEFAULT_PENDING_MESSAGES,
            retention: Retention {
                max_events: DEFAULT_LOG_EVENTS,
                max_bytes: DEFAULT_LOG_BYTES,
            },
            resume_window: DEFAULT_RESUME_WINDOW,
            command_queue: DEFAULT_COMMAND_QUEUE,
            strict_recipients: true,
            durability: Durability::Durable,
            commit_timeout: DEFAULT_COMMIT_TIMEOUT,
            auth: None,
            quotas: quotas::Quotas::default(),
            permissions: Arc::default(),
        }
    }
}

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
        subscription: String,
    },
    /// The connection's writer has room again.
    Drained {
        /// The connection.
        conn: ConnId,
    },
    /// Rows the store read for a subscription's catch-up.
    DiskRows {
        /// The subscription.
        subscription: SubscriptionId,
        /// Where the read started.
        from: u64,
        /// The rows, or why not.
        rows: Result<Vec<events::log::StoredRow>, crate::store::StoreError>,
    },
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
            Self::DiskRows {
                subscription, from, ..
            } => {
                write!(f, "DiskRows({subscription}, {from})")
            }
            Self::Shutdown => f.write_str("Shutdown"),
        }
    }
}

tokio::task_local! {
    /// Set while a pipelining connection handles a request: router calls record the log
    /// position they need committed here instead of waiting for it.
    static DEFERRED_COMMIT: std::cell::Cell<Option<u64>>;
}

/// A cheap, cloneable handle to the router task.
#[derive(Debug, Clone)]
pub struct RouterHandle {
    tx: mpsc::Sender<Command>,
    next_conn: Arc<AtomicU64>,
    config: Arc<RouterConfig>,
    /// Store durability progress, when calls wait for it.
    committed: Option<tokio::sync::watch::Receiver<u64>>,
    /// The durable store, for reads that must not go through the router task.
    store: Option<Arc<dyn crate::store::EventStore>>,
}

impl RouterHandle {
    /// A fresh connection id.
    pub fn new_conn_id(&self) -> ConnId {
        ConnId(self.next_conn.fetch_add(1, Ordering::Relaxed))
    }

    /// The router's configuration.
    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// The durable event store, if the log is durable.
    pub fn store(&self) -> Option<Arc<dyn crate::store::EventStore>> {
        self.store.clone()
    }

    /// Sends a command, waiting for room in the channel.
    ///
    /// # Errors
    /// `RouterError::Unavailable` when the router has stopped.
    pub async fn send(&self, cmd: Command) -> Result<(), RouterError> {
        self.tx
            .send(cmd)
            .await
            .map_err(|_| RouterError::Unavailable)
    }

    /// Runs `f` on the router task and returns its result, with no connection context (for
    /// the supervisor and other router-side components).
    ///
    /// # Errors
    /// `Unavailable` when the router has stopped.
    pub async fn with<R, F>(&self, f: F) -> Result<R, RouterError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Router) -> R + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let op: Op = Box::new(move |router: &mut Router| {
            let _ = tx.send(f(router));
        });
        self.send(Command::Call(op)).await?;
        rx.await.map_err(|_| RouterError::Unavailable)
    }

    /// A snapshot of the router's sizes (for health checks, metrics and tests).
    ///
    /// # Errors
    /// `Unavailable` when the router has stopped.
    pub async fn stats(&self) -> Result<RouterStats, RouterError> {
        self.with(|r| RouterStats {
            connections: r.conns.len(),
            sessions: r.sessions.len(),
            agents: r.registry.len(),
            subscriptions: r.bus.len(),
            log_events: r.bus.log.len(),
            next_seq: r.bus.log.next_seq(),
        })
        .await
    }

    /// Runs `f` on the router task for `conn` and returns its result. The capability, when
    /// given, is checked first against the connection's session.
    ///
    /// # Errors
    /// The operation's own error, `NotConnected`, `PermissionDenied`, or `Unavailable`.
    pub async fn call<R, F>(
        &self,
        conn: ConnId,
        capability: Option<Capability>,
        needs_session: bool,
        f: F,
    ) -> Result<R, RouterError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Router, &Ctx) -> Result<R, RouterError> + Send + 'static,
    {
        self.call_caused(conn, capability, needs_session, Vec::new(), f)
            .await
    }

    /// [`RouterHandle::call`] for a call that declared causes (`params._meta.causedBy`): the
    /// call's events without a cause of their own get them. Ids the router has not issued yet
    /// are dropped.
    ///
    /// # Errors
    /// As [`RouterHandle::call`].
    pub async fn call_caused<R, F>(
        &self,
        conn: ConnId,
        capability: Option<Capability>,
        needs_session: bool,
        causes: Vec<EventId>,
        f: F,
    ) -> Result<R, RouterError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Router, &Ctx) -> Result<R, RouterError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let op: Op = Box::new(move |router: &mut Router| {
            let ctx = Ctx { conn };
            let before = router.bus.log.next_seq();
            let newest = router.bus.log.newest_id();
            router.call_causes = causes
                .into_iter()
                .filter(|c| newest.is_some_and(|n| *c <= n))
                .collect();
            let result = router
                .check_call(&ctx, capability, needs_session)
                .and_then(|()| f(router, &ctx));
            router.call_causes.clear();
            let after = router.bus.log.next_seq();
            let _ = tx.send((result, (after > before).then_some(after)));
        });
        self.send(Command::Call(op)).await?;
        let (result, appended_to) = rx.await.map_err(|_| RouterError::Unavailable)?;
        let result = result?;
        if let (Some(until), Some(committed)) = (appended_to, &self.committed) {
            // A pipelining connection answers once the commit arrives, without holding up
            // the requests behind this one (see `dispatch::RpcSession`).
            let deferred = DEFERRED_COMMIT
                .try_with(|d| d.set(Some(d.get().map_or(until, |u| u.max(until)))))
                .is_ok();
            if !deferred {
                self.wait_committed(committed.clone(), until).await?;
            }
        }
        Ok(result)
    }

    /// Runs `fut`, collecting instead of awaiting the store commits its router calls need:
    /// returns its output and the log position that must be committed before its answer
    /// may be sent (`None`: nothing to wait for).
    pub(crate) async fn deferring_commit<T>(
        fut: impl std::future::Future<Output = T>,
    ) -> (T, Option<u64>) {
        DEFERRED_COMMIT
            .scope(std::cell::Cell::new(None), async {
                let out = fut.await;
                (out, DEFERRED_COMMIT.with(std::cell::Cell::get))
            })
            .await
    }

    /// The store's commit progress and the commit timeout, when calls wait for commits.
    pub(crate) fn commit_progress(&self) -> Option<(tokio::sync::watch::Receiver<u64>, Duration)> {
        self.committed
            .clone()
            .map(|c| (c, self.config.commit_timeout))
    }

    /// Waits until every event below `until` is committed.
    async fn wait_committed(
        &self,
        mut committed: tokio::sync::watch::Receiver<u64>,
        until: u64,
    ) -> Result<(), RouterError> {
        let limit = self.config.commit_timeout;
        match tokio::time::timeout(limit, committed.wait_for(|c| *c >= until)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(RouterError::not_committed(true, limit)),
            Err(_) => Err(RouterError::not_committed(false, limit)),
        }
    }
}

/// The caller of an operation.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    /// The calling connection.
    pub conn: ConnId,
}

/// What an operation needs to know about its caller's session.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Session id.
    pub session: SessionId,
    /// Participant id.
    pub participant: ParticipantId,
    /// Participant type.
    pub kind: ParticipantType,
    /// The agent the session speaks as, if any.
    pub primary_agent: Option<AgentId>,
    /// The permission policy.
    pub policy: permissions::SharedPolicy,
}

impl Caller {
    /// The permission-check view of this caller.
    pub fn viewer(&self) -> permissions::Viewer<'_> {
        permissions::Viewer {
            participant: &self.participant,
            kind: self.kind,
            agent: self.primary_agent.as_ref(),
            policy: &self.policy,
        }
    }

    /// `from` of messages this caller sends, and `source` of events it causes.
    pub fn address(&self) -> Arc<str> {
        match &self.primary_agent {
            Some(a) => a.as_arc().clone(),
            None => self.participant.as_arc().clone(),
        }
    }
}

/// Things that happen later.
#[derive(Debug, Clone)]
enum Deadline {
    /// A detached session can no longer be resumed.
    SessionExpiry(SessionId),
    /// An orphaned agent was not reclaimed in time.
    OrphanExpiry(AgentId),
    /// Time to send `map/auth/expiring` (for the session's credential of this epoch).
    CredentialExpiring(SessionId, u64),
    /// The session's credential (of this epoch) has expired.
    CredentialExpired(SessionId, u64),
}

/// The owner of all routing state.
#[derive(Debug)]
pub struct Router {
    config: Arc<RouterConfig>,
    conns: HashMap<ConnId, Conn>,
    sessions: Sessions,
    registry: Registry,
    scopes: Scopes,
    bus: EventBus,
    deadlines: BTreeMap<Instant, Vec<Deadline>>,
    shutting_down: bool,
    /// Agents whose processes the router supervises.
    supervised: supervision::SupervisedTable,
    /// Where process controls go (the supervisor), when there is one.
    process_control: Option<mpsc::Sender<supervision::ProcessControl>>,
    /// The durable event store, when the log is durable.
    store: Option<Arc<dyn crate::store::EventStore>>,
    /// Events appended since the last flush to the store.
    unflushed: Vec<Arc<events::log::EventRecord>>,
    /// Messages kept for agents that are away (`meta.delivery` acknowledged/guaranteed).
    offline: HashMap<AgentId, std::collections::VecDeque<Arc<messaging::Outgoing>>>,
    /// Recent deliveries, for linking a reply to the request it answers.
    deliveries: messaging::DeliveryIndex,
    /// Causes the current call declared (`params._meta.causedBy`); given to its events that
    /// have no cause of their own.
    call_causes: Vec<EventId>,
}

/// The router's collaborators.
#[derive(Debug, Default)]
pub struct RouterParts {
    /// Where process controls go (the supervisor).
    pub process_control: Option<mpsc::Sender<supervision::ProcessControl>>,
    /// The durable event store and what it recovered.
    pub store: Option<(Arc<dyn crate::store::EventStore>, crate::store::Recovered)>,
}

/// Sizes of the router's state at one moment ([`RouterHandle::stats`]).
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
}

/// When a call that changes state is answered, relative to the durability of its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// Answered once the store has committed the call's events (the store's `synchronous`
    /// setting says what committed survives).
    #[default]
    Durable,
    /// Answered at once; the store commits within its group-commit delay.
    Async,
}

impl Router {
    /// Starts the router task and returns its handle.
    pub fn spawn(config: RouterConfig) -> (RouterHandle, tokio::task::JoinHandle<()>) {
        Self::spawn_with(config, None)
    }

    /// Starts the router task with a channel to a process supervisor.
    pub fn spawn_with(
        config: RouterConfig,
        process_control: Option<mpsc::Sender<supervision::ProcessControl>>,
    ) -> (RouterHandle, tokio::task::JoinHandle<()>) {
        Self::start(
            config,
            RouterParts {
                process_control,
                store: None,
            },
        )
    }

    /// Starts the router task with its collaborators (supervisor channel, durable store).
    pub fn start(
        config: RouterConfig,
        parts: RouterParts,
    ) -> (RouterHandle, tokio::task::JoinHandle<()>) {
        let config = Arc::new(config);
        let (tx, rx) = mpsc::channel(config.command_queue.max(1));
        let mut router = Router::new(config.clone());
        router.process_control = parts.process_control;
        let mut committed = None;
        let handle_store = parts.store.as_ref().map(|(s, _)| s.clone());
        if let Some((store, recovered)) = parts.store {
            router.bus.log = EventLog::recover(config.retention, &recovered);
            if config.durability == Durability::Durable {
                committed = Some(store.committed());
            }
            router.store = Some(store.clone());
            router.bus.set_disk(events::DiskAccess {
                store,
                router: tx.downgrade(),
            });
        }
        let task = tokio::spawn(router.run(rx));
        (
            RouterHandle {
                tx,
                next_conn: Arc::new(AtomicU64::new(1)),
                committed,
                store: handle_store,
                config,
            },
            task,
        )
    }

    fn new(config: Arc<RouterConfig>) -> Self {
        Self {
            bus: EventBus::new(EventLog::new(config.retention)),
            config,
            conns: HashMap::new(),
            sessions: Sessions::default(),
            registry: Registry::default(),
            scopes: Scopes::default(),
            deadlines: BTreeMap::new(),
            shutting_down: false,
            supervised: Default::default(),
            process_control: None,
            store: None,
            unflushed: Vec::new(),
            offline: HashMap::new(),
            deliveries: Default::default(),
            call_causes: Vec::new(),
        }
    }

    /// The command loop: block for one command, then take what else is ready (bounded) before
    /// looking at timers, so a burst is handled without a wake-up per command.
    async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        const BATCH: usize = 256;
        // First, before any command: end what the previous run left open (commands wait in
        // the channel meanwhile).
        if let Some(store) = self.store.clone() {
            match recovery::previous_run(&*store).await {
                Ok(run) => self.close_previous_run(run),
                Err(e) => {
                    tracing::error!(error = %e, "could not read the previous run's lifecycle events")
                }
            }
            self.flush_store();
        }
        loop {
            let next_deadline = self.deadlines.keys().next().copied();
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
    fn flush_store(&mut self) {
        if self.unflushed.is_empty() {
            return;
        }
        let records = std::mem::take(&mut self.unflushed);
        if let Some(store) = &self.store {
            store.append_records(records);
        }
    }

    /// Applies one command; returns true when the router should stop.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Attach {
                conn,
                outbox,
                origin,
            } => {
                self.conns.insert(
                    conn,
                    Conn {
                        origin,
                        outbox,
                        session: None,
                        pending: Default::default(),
                        pending_auth: None,
                    },
                );
            }
            Command::Detach { conn } => self.handle_transport_closed(conn),
            Command::Call(op) => op(self),
            Command::Activate { conn, subscription } => {
                let owned = self.bus.get(&subscription).is_some_and(|s| s.conn == conn);
                if owned {
                    self.bus.activate(&subscription, &self.registry);
                }
            }
            Command::Drained { conn } => self.handle_drained(conn),
            Command::DiskRows {
                subscription,
                from,
                rows,
            } => self
                .bus
                .deliver_disk(subscription.as_str(), from, rows, &self.registry),
            Command::Shutdown => {
                self.handle_shutdown();
                return true;
            }
        }
        false
    }

    fn handle_drained(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn) {
            while let Some(frame) = c.pending.front().cloned() {
                match events::push(&c.outbox, outbox::Outbound::Shared(frame)) {
                    Ok(()) => {
                        c.pending.pop_front();
                    }
                    Err(_) => return,
                }
            }
        }
        self.bus.resume_conn(conn, &self.registry);
    }

    fn fire_deadlines(&mut self, now: Instant) {
        while let Some(entry) = self.deadlines.first_entry() {
            if *entry.key() > now {
                break;
            }
            for d in entry.remove() {
                match d {
                    Deadline::SessionExpiry(s) => self.expire_session(&s),
                    Deadline::OrphanExpiry(a) => self.expire_orphan(&a),
                    Deadline::CredentialExpiring(s, epoch) => self.credential_expiring(&s, epoch),
                    Deadline::CredentialExpired(s, epoch) => self.credential_expired(&s, epoch),
                }
            }
        }
    }

    fn schedule(&mut self, at: Instant, d: Deadline) {
        self.deadlines.entry(at).or_default().push(d);
    }

    /// Checks that the connection may make this call.
    fn check_call(
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
            if !session.capabilities.has(cap) {
                return Err(RouterError::PermissionDenied(cap.path().into()));
            }
        }
        Ok(())
    }

    fn session_of(&self, ctx: &Ctx) -> Result<&session::Session, RouterError> {
        self.conns
            .get(&ctx.conn)
            .and_then(|c| c.session.as_ref())
            .and_then(|s| self.sessions.get(s.as_str()))
            .ok_or(RouterError::NotConnected)
    }

    /// The caller's identity, for handlers.
    pub fn caller(&self, ctx: &Ctx) -> Result<Caller, RouterError> {
        let s = self.session_of(ctx)?;
        let primary_agent = s.primary_agent.clone().filter(|a| {
            self.registry
                .is_owned_by(a.as_str(), s.participant.as_str())
        });
        Ok(Caller {
            session: s.id.clone(),
            participant: s.participant.clone(),
            kind: s.kind,
            primary_agent,
            policy: self.config.permissions.clone(),
        })
    }

    /// Whether the caller holds a capability.
    pub fn caller_has(&self, ctx: &Ctx, cap: Capability) -> bool {
        self.session_of(ctx).is_ok_and(|s| s.capabilities.has(cap))
    }

    /// Appends an event to the log and fans it out. Returns its id.
    pub fn emit(&mut self, mut draft: EventDraft) -> EventId {
        if draft.caused_by.is_empty() && !self.call_causes.is_empty() {
            draft.caused_by = self.call_causes.clone();
        }
        let rec = self.bus.log.append(draft);
        if self.store.is_some() {
            // The store builds the row on its own thread.
            self.unflushed.push(rec.clone());
        }
        self.bus.publish(&rec, &self.registry);
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
            EventType::AgentRegistered | EventType::AgentMetadataChanged => {
                agent.metadata.clone().map(Arc::new)
            }
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
            audience: permissions::agent_audience(agent, &self.registry, &self.config.permissions),
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
        let owned = self.registry.owned_by(participant.as_str());
        for id in owned.iter().chain(also) {
            if let Some(r) = self.registry.get(id.as_str()) {
                audience = audience.and(permissions::agent_audience(
                    &r.agent,
                    &self.registry,
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
        let conns: Vec<ConnId> = self.conns.keys().copied().collect();
        for conn in conns {
            self.handle_transport_closed(conn);
        }
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
