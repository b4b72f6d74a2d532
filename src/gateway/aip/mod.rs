//! The AIP gateway (seed 003, the Agent Interaction Protocol; `docs/aip.md`): serves
//! `grpc_service.GatewayService` with tonic on a listener of its own (`[aip] listen`,
//! `--aip-listen`), and makes each AIP node a MAP agent, reached through the router like any.
//!
//! Like the other gateways it is a MAP client over in-process sessions and nothing more:
//! - a registered node (`RegisterAgent`, `RegisterTool`) is one MAP session opened as its
//!   registrant's principal, with one agent: the node's id, role `agent` or `tool`, scope
//!   `aip:<domain>`, its AIP info in `metadata.aip` (`nodes.rs`);
//! - what an AIP node sends (`RouteAgentCalling`, `RouteToolCalling`) is a `map/send` from its
//!   agent (`service.rs`); what reaches its agent is delivered to the node's own gRPC server
//!   at its registered address, dialled back as upstream does (`pump.rs`, `dial.rs`);
//! - so an AIP agent reaches MAP agents, MAP agents reach AIP agents and tools (a plain
//!   `map/send` or request; `Client::call_tool`), and AIP nodes reach each other, all through
//!   the router: logged, permission-checked, visible on the dashboard.
//!
//! Files: `proto.rs` (the vendored generated code), `content.rs` (ContentItem ↔ payload
//! parts), `dial.rs` (allow-list and channels), `nodes.rs` (a node, its peer info, liveness),
//! `service.rs` (the RPCs), `pump.rs` (a node's MAP inbox to its gRPC server), `listener.rs`
//! (the listener, TLS, limits).
//!
//! Owns the AIP tables: nodes by id, open agent sessions by (initiator node, session id), the
//! correlation of MAP replies to those sessions, update subscriptions. None of it is durable:
//! after a restart nodes are told to register again (`Heartbeat` answers `success: false`).

pub mod content;
pub mod dial;
pub mod listener;
pub mod nodes;
pub mod proto;
pub mod pump;
pub mod service;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::sync::{broadcast, mpsc, Semaphore};
use tonic::Status;

use crate::client::Client;
use crate::gateway::GatewayContext;

use self::nodes::Node;
use self::proto::agent_message::SessionStatus;
use self::proto::{AgentMessage, NodeUpdate};

/// What happens to a node silent past `heartbeat_timeout_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Silence {
    /// Upstream's rule (the default): the node is removed, its MAP agent unregistered; it must
    /// register again.
    #[default]
    Evict,
    /// The node stays, its MAP agent's state `x-offline`; its next heartbeat (or message)
    /// makes it `active` again.
    Offline,
}

/// `[aip]`: the AIP gateway (`docs/aip.md`). Off unless `listen` is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AipSettings {
    /// Where to serve `GatewayService` (gRPC, HTTP/2; TLS when `[tls]` is set). `None`: off.
    pub listen: Option<SocketAddr>,
    /// Where nodes' own servers may be dialled back (`dial.rs`; default loopback only).
    pub dial_allow: Vec<String>,
    /// A node silent this long is evicted or marked offline (default 30 000, upstream's).
    pub heartbeat_timeout_ms: u64,
    /// `evict` (default, upstream's) or `offline`.
    pub on_silence: Silence,
    /// Largest gRPC message received or sent, in bytes (default 4 MiB, gRPC's own).
    pub max_message_bytes: usize,
    /// Concurrent gRPC streams on one connection (default 64).
    pub max_streams_per_connection: u32,
    /// Agent sessions and update subscriptions open at once, over all callers (default 256).
    pub max_sessions: usize,
    /// Nodes one principal may have registered (default 64).
    pub max_nodes_per_principal: usize,
    /// How long a `RouteAgentCalling` stream may wait before its first message (default 10 000).
    pub first_message_timeout_ms: u64,
    /// An agent session with no traffic this long is ended (default 300 000).
    pub session_idle_timeout_ms: u64,
    /// Longest tool call (default 60 000; a caller's shorter gRPC deadline wins).
    pub tool_timeout_ms: u64,
    /// Longest wait for a node's server to accept the dial-back connection (default 10 000).
    pub dial_timeout_ms: u64,
}

impl Default for AipSettings {
    fn default() -> Self {
        Self {
            listen: None,
            dial_allow: dial::default_allow(),
            heartbeat_timeout_ms: 30_000,
            on_silence: Silence::Evict,
            max_message_bytes: 4 << 20,
            max_streams_per_connection: 64,
            max_sessions: 256,
            max_nodes_per_principal: 64,
            first_message_timeout_ms: 10_000,
            session_idle_timeout_ms: 300_000,
            tool_timeout_ms: 60_000,
            dial_timeout_ms: 10_000,
        }
    }
}

impl AipSettings {
    /// Checks what can be checked before start.
    ///
    /// # Errors
    /// A malformed `dial_allow` entry, or a zero limit.
    pub fn validate(&self) -> Result<(), String> {
        dial::DialAllow::parse(&self.dial_allow).map_err(|e| format!("aip.dial_allow: {e}"))?;
        if self.max_message_bytes == 0 || self.max_sessions == 0 || self.heartbeat_timeout_ms == 0 {
            return Err(
                "aip: max_message_bytes, max_sessions and heartbeat_timeout_ms must be > 0".into(),
            );
        }
        Ok(())
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }
}

/// Counters of the gateway's traffic (`/metrics`: `map_aip_*`, `server/metrics.rs`).
#[derive(Debug, Default)]
pub struct Counters {
    /// Registrations accepted.
    pub registrations: AtomicU64,
    /// Nodes removed (deregistered or evicted).
    pub removals: AtomicU64,
    /// Nodes evicted or marked offline for silence.
    pub silent: AtomicU64,
    /// Agent sessions opened (`RouteAgentCalling`, or a MAP message to an AIP agent).
    pub sessions: AtomicU64,
    /// Tool calls made (to AIP tools, dialled back).
    pub tool_calls: AtomicU64,
    /// Calls refused with a gRPC error status.
    pub refused: AtomicU64,
}

/// An agent session an AIP node started through `RouteAgentCalling`: where its answers go.
#[derive(Debug)]
struct Outgoing {
    tx: mpsc::Sender<Result<AgentMessage, Status>>,
    /// The MAP message ids (correlation ids) sent in it, with the status each carried.
    correlations: Vec<String>,
    last: Instant,
    /// Its slot of `max_sessions`, given back when it ends.
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// The AIP gateway: its settings and tables (module docs).
#[derive(Debug)]
pub struct AipGateway {
    ctx: Arc<GatewayContext>,
    settings: AipSettings,
    allow: dial::DialAllow,
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    updates: broadcast::Sender<NodeUpdate>,
    permits: Arc<Semaphore>,
    outgoing: Mutex<HashMap<(String, String), Outgoing>>,
    correlations: Mutex<HashMap<String, (String, String, SessionStatus)>>,
    scopes: Mutex<HashSet<String>>,
    service: tokio::sync::OnceCell<Client>,
    /// The traffic counters.
    pub counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl AipGateway {
    /// The gateway over the shared gateway context (sessions, credentials), and its sweeper.
    ///
    /// # Errors
    /// A malformed `dial_allow`.
    pub fn new(ctx: Arc<GatewayContext>, settings: AipSettings) -> Result<Arc<Self>, String> {
        let allow = dial::DialAllow::parse(&settings.dial_allow)?;
        let (updates, _) = broadcast::channel(256);
        let gw = Arc::new(Self {
            ctx,
            permits: Arc::new(Semaphore::new(settings.max_sessions)),
            settings,
            allow,
            nodes: Mutex::new(HashMap::new()),
            updates,
            outgoing: Mutex::new(HashMap::new()),
            correlations: Mutex::new(HashMap::new()),
            scopes: Mutex::new(HashSet::new()),
            service: tokio::sync::OnceCell::new(),
            counters: Counters::default(),
        });
        tokio::spawn(nodes::sweep_loop(Arc::downgrade(&gw)));
        Ok(gw)
    }

    /// The settings.
    pub fn settings(&self) -> &AipSettings {
        &self.settings
    }

    /// Nodes registered now.
    pub fn node_count(&self) -> usize {
        lock(&self.nodes).len()
    }

    /// Agent sessions open now.
    pub fn session_count(&self) -> usize {
        lock(&self.outgoing).len()
    }

    /// The gateway's metric families, OpenMetrics text (`docs/metrics.md`, "AIP gateway").
    pub fn render_metrics(&self) -> String {
        use std::fmt::Write as _;
        let c = &self.counters;
        let mut out = String::new();
        let gauges = [
            (
                "map_aip_nodes",
                "AIP nodes registered now.",
                self.node_count(),
            ),
            (
                "map_aip_sessions_open",
                "AIP agent sessions open now (started by AIP nodes).",
                self.session_count(),
            ),
        ];
        for (name, help, v) in gauges {
            let _ = write!(
                out,
                "# TYPE {name} gauge\n# HELP {name} {help}\n{name} {v}\n"
            );
        }
        let counters = [
            (
                "map_aip_registrations",
                "AIP registrations accepted.",
                &c.registrations,
            ),
            (
                "map_aip_removals",
                "AIP nodes removed (deregistered or evicted).",
                &c.removals,
            ),
            (
                "map_aip_silent",
                "AIP nodes found silent past the heartbeat timeout.",
                &c.silent,
            ),
            (
                "map_aip_sessions",
                "AIP agent sessions opened.",
                &c.sessions,
            ),
            (
                "map_aip_tool_calls",
                "Calls made to AIP tools.",
                &c.tool_calls,
            ),
            (
                "map_aip_refused",
                "AIP calls refused with an error status.",
                &c.refused,
            ),
        ];
        for (name, help, v) in counters {
            let v = v.load(Ordering::Relaxed);
            let _ = write!(
                out,
                "# TYPE {name} counter\n# HELP {name} {help}\n{name}_total {v}\n"
            );
        }
        out
    }

    fn node(&self, id: &str) -> Option<Arc<Node>> {
        lock(&self.nodes).get(id).cloned()
    }

    /// The gateway's own service session (creates the `aip:<domain>` scopes).
    async fn service(&self) -> Result<&Client, Status> {
        self.service
            .get_or_try_init(|| async {
                self.ctx
                    .open_service(
                        crate::client::ClientOptions::new()
                            .participant_type(
                                crate::protocol::capabilities::ParticipantType::System,
                            )
                            .name("AIP gateway"),
                    )
                    .await
            })
            .await
            .map_err(|e| {
                Status::unavailable(format!("the router refused the gateway's session: {e:?}"))
            })
    }

    /// Makes sure scope `aip:<domain>` exists (created once, by the service session).
    async fn ensure_scope(&self, scope: &str) -> Result<(), Status> {
        if lock(&self.scopes).contains(scope) {
            return Ok(());
        }
        let service = self.service().await?;
        let created = service
            .scopes()
            .create(crate::protocol::methods::scopes::ScopesCreateParams {
                scope_id: Some(scope.into()),
                name: Some(scope.to_owned()),
                ..Default::default()
            })
            .await;
        if let Err(e) = created {
            // Already there is fine; anything else is said when the agent joins.
            tracing::debug!(scope, error = %e, "creating an AIP scope");
        }
        lock(&self.scopes).insert(scope.to_owned());
        Ok(())
    }

    fn publish(&self, update: NodeUpdate) {
        let _ = self.updates.send(update);
    }

    /// Registers where the answers of session `(node, session)` go.
    fn open_outgoing(
        &self,
        node: &str,
        session: &str,
        tx: mpsc::Sender<Result<AgentMessage, Status>>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> bool {
        let mut table = lock(&self.outgoing);
        let key = (node.to_owned(), session.to_owned());
        if table.contains_key(&key) {
            return false;
        }
        table.insert(
            key,
            Outgoing {
                tx,
                correlations: Vec::new(),
                last: Instant::now(),
                _permit: permit,
            },
        );
        true
    }

    fn note_correlation(&self, node: &str, session: &str, id: &str, status: SessionStatus) {
        let mut table = lock(&self.outgoing);
        if let Some(o) = table.get_mut(&(node.to_owned(), session.to_owned())) {
            o.correlations.push(id.to_owned());
            o.last = Instant::now();
            lock(&self.correlations)
                .insert(id.to_owned(), (node.to_owned(), session.to_owned(), status));
        }
    }

    fn correlation(&self, id: &str) -> Option<(String, String, SessionStatus)> {
        lock(&self.correlations).get(id).cloned()
    }

    /// Hands an answer to session `(node, session)`'s caller; a `STOP_RESPONSE` (or an error)
    /// ends it. False when there is no such session.
    fn deliver_answer(
        &self,
        node: &str,
        session: &str,
        answer: Result<AgentMessage, Status>,
    ) -> bool {
        let key = (node.to_owned(), session.to_owned());
        let ends = match &answer {
            Ok(m) => m.session_status == SessionStatus::StopResponse as i32,
            Err(_) => true,
        };
        let mut table = lock(&self.outgoing);
        let Some(o) = table.get_mut(&key) else {
            return false;
        };
        o.last = Instant::now();
        if o.tx.try_send(answer).is_err() {
            // The caller does not read its answers: the session ends.
            let _ = o.tx.try_send(Err(Status::resource_exhausted(
                "too many unread answers: the session is closed",
            )));
            drop(table);
            self.close_outgoing(node, session);
            return true;
        }
        if ends {
            drop(table);
            self.close_outgoing(node, session);
        }
        true
    }

    fn close_outgoing(&self, node: &str, session: &str) {
        let removed = lock(&self.outgoing).remove(&(node.to_owned(), session.to_owned()));
        if let Some(o) = removed {
            let mut c = lock(&self.correlations);
            for id in o.correlations {
                c.remove(&id);
            }
        }
    }

    /// Ends the sessions idle past the limit (DEADLINE_EXCEEDED to their callers).
    fn sweep_sessions(&self) {
        let idle = AipSettings::ms(self.settings.session_idle_timeout_ms);
        let stale: Vec<(String, String)> = lock(&self.outgoing)
            .iter()
            .filter(|(_, o)| o.last.elapsed() > idle || o.tx.is_closed())
            .map(|(k, _)| k.clone())
            .collect();
        for (node, session) in stale {
            self.deliver_answer(
                &node,
                &session,
                Err(Status::deadline_exceeded(format!(
                    "session {session}: no traffic for {idle:?}"
                ))),
            );
        }
    }

    fn refused(&self, status: Status) -> Status {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        status
    }
}
