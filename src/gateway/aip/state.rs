//! [`AipGateway`]: the gateway's state, and the one place that changes it: nodes by id, open
//! agent sessions by (initiator node, session id), the correlation of MAP replies to those
//! sessions, the scopes made, the counters; liveness (a sign of life, eviction or offline) and
//! the sweeper that checks it.
//!
//! None of it is durable: after a restart nodes are told to register again (`Heartbeat`
//! answers `success: false`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc, Semaphore};
use tonic::Status;

use super::dial;
use super::nodes::Node;
use super::proto::agent_message::SessionStatus;
use super::proto::node_update::UpdateType;
use super::proto::{AgentMessage, NodeUpdate};
use super::settings::{AipSettings, Silence};
use crate::client::Client;
use crate::gateway::GatewayContext;

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

/// The most correlation ids one session remembers unanswered: past it the oldest is
/// forgotten (a MAP reply to it is no longer delivered), so a long session costs a bounded
/// amount whatever its receiver does. Answers of AIP receivers name the session, not the id.
pub const CORRELATIONS_PER_SESSION: usize = 64;

/// An agent session an AIP node started through `RouteAgentCalling`: where its answers go.
#[derive(Debug)]
struct Outgoing {
    tx: mpsc::Sender<Result<AgentMessage, Status>>,
    /// The MAP agent the session is addressed to: the only sender whose answers it takes.
    receiver: String,
    /// The correlation ids of its quests not answered yet, oldest first (at most
    /// [`CORRELATIONS_PER_SESSION`]).
    correlations: VecDeque<String>,
    last: Instant,
    /// Its slot of `max_sessions`, given back when it ends.
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// The AIP gateway: its settings and tables (module docs).
#[derive(Debug)]
pub struct AipGateway {
    pub(crate) ctx: Arc<GatewayContext>,
    pub(crate) settings: AipSettings,
    pub(crate) allow: dial::DialAllow,
    pub(crate) nodes: Mutex<HashMap<String, Arc<Node>>>,
    pub(crate) updates: broadcast::Sender<NodeUpdate>,
    pub(crate) permits: Arc<Semaphore>,
    outgoing: Mutex<HashMap<(String, String), Outgoing>>,
    correlations: Mutex<HashMap<String, (String, String, SessionStatus)>>,
    scopes: Mutex<HashSet<String>>,
    service: tokio::sync::OnceCell<Client>,
    /// The traffic counters.
    pub counters: Counters,
}

pub(crate) use crate::sync::lock;

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
        tokio::spawn(sweep_loop(Arc::downgrade(&gw)));
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

    /// Correlation ids (MAP message ids of quests) remembered now, over every open session.
    pub fn correlations_open(&self) -> usize {
        lock(&self.correlations).len()
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

    pub(crate) fn node(&self, id: &str) -> Option<Arc<Node>> {
        lock(&self.nodes).get(id).cloned()
    }

    /// The gateway's own service session (creates the `aip:<domain>` scopes).
    pub(crate) async fn service(&self) -> Result<&Client, Status> {
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
    ///
    /// # Errors
    /// `RESOURCE_EXHAUSTED` for a scope past `[aip] max_domains` (the gateway makes scopes
    /// with its own session, so what registrants may grow is bounded here); `UNAVAILABLE`
    /// without the service session.
    pub(crate) async fn ensure_scope(&self, scope: &str) -> Result<(), Status> {
        {
            let known = lock(&self.scopes);
            if known.contains(scope) {
                return Ok(());
            }
            if known.len() >= self.settings.max_domains {
                return Err(Status::resource_exhausted(format!(
                    "{} domains are in use, the most allowed ([aip] max_domains)",
                    known.len()
                )));
            }
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

    pub(crate) fn publish(&self, update: NodeUpdate) {
        let _ = self.updates.send(update);
    }

    /// Registers where the answers of session `(node, session)`, addressed to `receiver`, go.
    pub(crate) fn open_outgoing(
        &self,
        node: &str,
        session: &str,
        receiver: &str,
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
                receiver: receiver.to_owned(),
                correlations: VecDeque::new(),
                last: Instant::now(),
                _permit: permit,
            },
        );
        true
    }

    pub(crate) fn note_correlation(
        &self,
        node: &str,
        session: &str,
        id: &str,
        status: SessionStatus,
    ) {
        let mut table = lock(&self.outgoing);
        if let Some(o) = table.get_mut(&(node.to_owned(), session.to_owned())) {
            o.correlations.push_back(id.to_owned());
            o.last = Instant::now();
            let mut c = lock(&self.correlations);
            c.insert(id.to_owned(), (node.to_owned(), session.to_owned(), status));
            while o.correlations.len() > CORRELATIONS_PER_SESSION {
                if let Some(old) = o.correlations.pop_front() {
                    c.remove(&old);
                }
            }
        }
    }

    pub(crate) fn correlation(&self, id: &str) -> Option<(String, String, SessionStatus)> {
        lock(&self.correlations).get(id).cloned()
    }

    /// Forgets correlation id `id` (its quest was answered).
    pub(crate) fn forget_correlation(&self, id: &str) {
        let Some((node, session, _)) = lock(&self.correlations).remove(id) else {
            return;
        };
        if let Some(o) = lock(&self.outgoing).get_mut(&(node, session)) {
            o.correlations.retain(|c| c != id);
        }
    }

    /// The MAP agent session `(node, session)` is addressed to, while it is open.
    pub(crate) fn receiver_of(&self, node: &str, session: &str) -> Option<String> {
        lock(&self.outgoing)
            .get(&(node.to_owned(), session.to_owned()))
            .map(|o| o.receiver.clone())
    }

    /// Hands an answer to session `(node, session)`'s caller; a `STOP_RESPONSE` (or an error)
    /// ends it. False when there is no such session.
    pub(crate) fn deliver_answer(
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

    pub(crate) fn close_outgoing(&self, node: &str, session: &str) {
        let removed = lock(&self.outgoing).remove(&(node.to_owned(), session.to_owned()));
        if let Some(o) = removed {
            let mut c = lock(&self.correlations);
            for id in o.correlations {
                c.remove(&id);
            }
        }
    }

    /// Ends the sessions idle past the limit (DEADLINE_EXCEEDED to their callers).
    pub(crate) fn sweep_sessions(&self) {
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

    pub(crate) fn refused(&self, status: Status) -> Status {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        status
    }
}

impl AipGateway {
    /// Removes node `id`: its MAP agent is unregistered and its session closed. False when
    /// there was none.
    pub async fn remove(&self, id: &str) -> bool {
        let Some(node) = lock(&self.nodes).remove(id) else {
            return false;
        };
        self.counters.removals.fetch_add(1, Ordering::Relaxed);
        node.abort_pump();
        lock(&node.inbound).clear();
        // The sessions it started end with it.
        let started: Vec<String> = lock(&self.outgoing)
            .keys()
            .filter(|(n, _)| *n == node.id)
            .map(|(_, s)| s.clone())
            .collect();
        for session in started {
            self.deliver_answer(
                &node.id,
                &session,
                Err(Status::unavailable(format!(
                    "node {} is no longer registered",
                    node.id
                ))),
            );
        }
        let client = node.client();
        if client.unregister(node.id.as_str()).await.is_err() {
            // Offline (its session closed, the agent orphaned): the service session may.
            if let Ok(service) = self.service().await {
                let _ = service.unregister(node.id.as_str()).await;
            }
        }
        if client.disconnect().await.is_err() {
            let _ = client.close().await;
        }
        self.publish(NodeUpdate {
            update_type: UpdateType::Removed as i32,
            node_id: node.id.clone(),
            peer: Some(node.peer()),
        });
        tracing::info!(node = %id, "AIP node removed");
        true
    }

    pub(crate) async fn sweep_nodes(&self) {
        let timeout = AipSettings::ms(self.settings.heartbeat_timeout_ms);
        let silent: Vec<Arc<Node>> = lock(&self.nodes)
            .values()
            .filter(|n| n.is_online() && n.silent_for() > timeout)
            .cloned()
            .collect();
        for node in silent {
            self.counters.silent.fetch_add(1, Ordering::Relaxed);
            match self.settings.on_silence {
                Silence::Evict => {
                    tracing::info!(node = %node.id, "AIP node silent past the heartbeat timeout: evicted");
                    self.remove(&node.id).await;
                }
                Silence::Offline => {
                    tracing::info!(node = %node.id, "AIP node silent past the heartbeat timeout: offline");
                    // Its session goes away without `map/disconnect`: the router orphans the
                    // agent (presence offline, `agent.presence.changed`) and keeps what is
                    // sent to it until the node is back (`service::touch` reclaims it).
                    node.set_offline();
                    node.abort_pump();
                    let _ = node.client().close().await;
                    self.publish(NodeUpdate {
                        update_type: UpdateType::Updated as i32,
                        node_id: node.id.clone(),
                        peer: Some(node.peer()),
                    });
                }
            }
        }
    }
}

/// Checks liveness and idle sessions until the gateway is gone.
pub async fn sweep_loop(gw: Weak<AipGateway>) {
    let period = match gw.upgrade() {
        Some(gw) => AipSettings::ms(gw.settings.heartbeat_timeout_ms / 3)
            .clamp(Duration::from_millis(100), Duration::from_secs(10)),
        None => return,
    };
    loop {
        tokio::time::sleep(period).await;
        let Some(gw) = gw.upgrade() else { break };
        gw.sweep_nodes().await;
        gw.sweep_sessions();
    }
}
