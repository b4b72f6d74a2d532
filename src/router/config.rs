//! [`RouterConfig`]: the router's settings and their defaults (each default's reason is on its
//! constant), and [`Durability`]: when a state-changing call is answered relative to the
//! store's commit.

use std::sync::Arc;
use std::time::Duration;

use crate::router::events::log::Retention;
use crate::router::permissions;
use crate::router::quotas;

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

/// Events that may wait for their commit before calls are refused (`max_uncommitted`).
pub const DEFAULT_MAX_UNCOMMITTED: u64 = 50_000;

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
    /// With a store: while more events than this wait for their commit (the store is slow or
    /// away, e.g. NATS down in cluster mode), calls are refused at once instead of adding
    /// to the wait (0: no bound).
    pub max_uncommitted: u64,
    /// When subscribers are shown an event, relative to its commit (with a store).
    pub delivery: Delivery,
    /// Authentication, when some method is enabled (`None`: everyone is admitted, anonymous).
    pub auth: Option<Arc<crate::auth::Authenticator>>,
    /// Per-session and per-principal quotas (`[limits]`).
    pub quotas: quotas::Quotas,
    /// Who may see and do what (`[permissions]`).
    pub permissions: permissions::SharedPolicy,
    /// Participant ids and agent ids that only the router's own service principal
    /// (`auth::service_principal`) may take: the ids of the gateways' own sessions and agents.
    /// Anyone else asking for one gets a fresh participant id, or 1003 for an agent id.
    pub reserved_ids: Vec<String>,
    /// Top-level members of a task's `meta` that only the service principal may write (in
    /// `map/tasks/create` and `map/tasks/update`): the records a gateway keeps in the tasks
    /// it makes, which say whose they are (`a2a`: the A2A gateway's, with the task's owner).
    /// Anyone else writing one gets `TaskDenied`.
    pub reserved_task_meta: Vec<String>,
    /// In cluster mode, this node's name (`[cluster] node`): the node an agent connected here
    /// is on (`Presence::node`). `None` on a single router.
    pub node: Option<String>,
    /// Most participant and agent ids one principal owns (`router::identities`).
    pub ids_per_principal: usize,
    /// Kept items of each kind (tasks, checkpoints, conversations, quota counts) the router
    /// caches in memory; the rest stay in the store until used (`router::kept`).
    pub cache_items: usize,
    /// A follower: this router serves subscriptions and replay from a log another node
    /// writes (`router::events::follow`); it logs nothing and refuses every call that would.
    pub follower: bool,
    /// Where a follower forwards the calls it does not serve (`router::relay`): the writer,
    /// under each caller's principal. `None`: they are refused (`NotOnFollower`).
    pub relay: Option<Arc<dyn crate::router::relay::Relay>>,
    /// In cluster mode, the stream's retention limits, so that the saved records of long-lived
    /// sessions, agents and scopes are written again before the limits delete them
    /// (`router::handover`). `None`: the stream keeps everything.
    pub saved_refresh: Option<SavedRefresh>,
    /// Federation: this system's id, its routing rules and which principal speaks for which
    /// peer system (`router::federation`).
    pub federation: Federation,
}

/// When the live node writes a saved record again (`RouterConfig::saved_refresh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SavedRefresh {
    /// The stream has a count or size limit: a record in the older half of the retained log
    /// is written again.
    pub by_position: bool,
    /// The stream has an age limit: a record saved longer ago than this (half the limit) is
    /// written again.
    pub older_than: Option<std::time::Duration>,
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
            max_uncommitted: DEFAULT_MAX_UNCOMMITTED,
            delivery: Delivery::Committed,
            auth: None,
            quotas: quotas::Quotas::default(),
            permissions: Arc::default(),
            reserved_ids: Vec::new(),
            reserved_task_meta: Vec::new(),
            node: None,
            ids_per_principal: crate::router::identities::table::DEFAULT_IDS_PER_PRINCIPAL,
            cache_items: crate::router::kept::DEFAULT_CACHE_ITEMS,
            follower: false,
            relay: None,
            saved_refresh: None,
            federation: Federation::default(),
        }
    }
}

/// Federation settings (`router::federation`; the server fills them from `[federation]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Federation {
    /// This system's id, hop limit and allowed sources and targets (spec §3).
    pub rules: crate::protocol::methods::federation::RoutingRules,
    /// `(system id, principal id)`: the principal an inbound link for that system must have
    /// authenticated as (with authentication on; off, a gateway is taken at its word).
    pub peers: Vec<(String, String)>,
    /// The peer systems this router dials (`[[federation.peer]]` with an `endpoint`): messages
    /// for them wait here until the server's link to them takes them.
    pub outbound: Vec<String>,
    /// `(target system, peer)`: systems reached through a peer that dials them in turn.
    pub routes: Vec<(String, String)>,
    /// Most messages waiting for one peer (the rest fail, reported to their senders).
    pub max_queued: usize,
    /// How long a message passing through waits for the next system's answer before its
    /// sender's system is told it was routed (it waits here, durably, for the link).
    pub forward_wait: std::time::Duration,
}

/// Default of [`Federation::max_queued`] (the SDK's outage buffer holds as many).
pub const DEFAULT_FEDERATION_QUEUE: usize = 1000;

impl Default for Federation {
    fn default() -> Self {
        Self {
            rules: crate::protocol::methods::federation::RoutingRules {
                system_id: "map-router".into(),
                ..Default::default()
            },
            peers: Vec::new(),
            outbound: Vec::new(),
            routes: Vec::new(),
            max_queued: DEFAULT_FEDERATION_QUEUE,
            forward_wait: std::time::Duration::from_secs(5),
        }
    }
}

impl Federation {
    /// The peer a message for `system` goes to: the system itself when this router dials it,
    /// else the peer a route names (which must be dialled); `None` for this system or an
    /// unknown one.
    pub fn next_hop(&self, system: &str) -> Option<&str> {
        if system == self.rules.system_id {
            return None;
        }
        if let Some(peer) = self.outbound.iter().find(|p| *p == system) {
            return Some(peer);
        }
        self.routes
            .iter()
            .find(|(target, _)| target == system)
            .map(|(_, via)| via.as_str())
            .filter(|via| self.outbound.iter().any(|p| p == via))
    }

    /// The system and agent of a federated agent id `<system>:agent:<agent>` whose system this
    /// router reaches (else `None`: a local id).
    pub fn remote_agent<'a>(&self, id: &'a str) -> Option<(&'a str, &'a str)> {
        let (system, agent) = crate::protocol::methods::federation::Federated::Agent.split(id)?;
        (!agent.is_empty() && self.next_hop(system).is_some()).then_some((system, agent))
    }
}

/// When an event is delivered to subscribers, relative to the store's commit of it (with a
/// durable store; without one every event is delivered at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Delivery {
    /// Read-committed: a subscriber is shown an event once its group commit has landed, so no
    /// event it saw can be erased by a crash. Commits are pipelined: the router goes on
    /// appending while a commit is in flight.
    #[default]
    Committed,
    /// Live first: shown as soon as it is appended. A crash before the commit can erase events
    /// a subscriber was shown (docs/streams.md).
    Live,
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
