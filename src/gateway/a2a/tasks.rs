//! [`Core`]: the gateway's own MAP sessions, and every A2A operation as ordinary MAP calls.
//!
//! Owns: the gateway's two in-process MAP sessions, both of the router's service principal
//! (`auth::service_principal`, with or without `[auth]`; their ids are in
//! `gateway::RESERVED_IDS`, so nobody can squat them):
//! - the **agent** session (participant and agent `a2a-gateway`, type `agent`): the `from` of
//!   every message the gateway sends to an agent, so an agent's `reply()` comes back here and
//!   becomes the task's update ([`Core::on_agent_message`]) even when the caller has gone;
//! - the **books** session (participant `a2a-gateway-tasks`, type `system`): the gateway's
//!   bookkeeping, which must reach every A2A task whoever created it: each task's state
//!   changes (`map/tasks/update`), reading tasks for the rule in `access.rs`, and the [`Feed`]
//!   of `task.*` events.
//!
//! What is done *as the caller* (its own MAP session, `access::Caller`): resolving the agent a
//! path names (its visibility), and creating the task (`map/tasks/create`, so its
//! `tasks.canCreate` applies and the task records the caller's session as `createdBy` and its
//! principal as `meta.a2a.owner`). Before a message goes to an agent, the caller's
//! `messaging.canSend` is checked. Reads and changes of an existing task first pass
//! [`Caller::controls`](crate::gateway::a2a::access::Caller::controls): anyone else gets
//! -32001, as for an unknown task.
//!
//! Every A2A state change is one `map/tasks/update` (a durable `task.*` event that MAP
//! subscribers see), made under that task's own lock ([`Core::lock_task`]) so that the
//! read-modify-write of `meta.a2a` (MAP merges `meta` one key deep) never interleaves. No lock
//! is held across a MAP round trip for more than one task: a slow or refused update of one
//! task never waits for another's. The task itself is the source of truth: nothing about a
//! task is kept in memory, so a restarted router serves the tasks of the previous run
//! (`recovery.rs` ends those a restart interrupted, on the gateway's first use).
//!
//! The books are a small pool of `system` sessions ([`BOOKS`]: `a2a-gateway-tasks`, which also
//! holds the feed, and `a2a-gateway-tasks-1` …), each task's calls always on the same one (by
//! its id), so the router's per-connection rate is not one budget for every caller's tasks.
//!
//! What MAP would refuse is refused before it is sent ([`Core::fits`]): a frame larger than
//! `[limits] max_frame_bytes`, nested deeper than `max_depth`, or a message payload over
//! `max_payload_bytes` is an error naming the limit (413) in milliseconds, rather than a MAP
//! round trip the router answers with `id: null` (which the client would wait out).
//!
//! After a restart, a task is also found through the URL of the agent that now has its
//! agent's name ([`Target`]): agents that register without a fixed id come back under a new
//! one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use crate::client::{AgentHandle, Client, ClientError, ClientOptions};
use crate::gateway::a2a::access::Caller;
use crate::gateway::a2a::error::A2aError;
use crate::gateway::a2a::feed::Feed;
use crate::gateway::a2a::limits::{Limits, MAP_ENVELOPE_BYTES};
use crate::gateway::a2a::push::{Push, PushConfig};
use crate::gateway::a2a::record::{
    agent_payload, final_artifact, rfc3339_now, AgentReport, MapTask, Record, Snapshot,
};
use crate::gateway::a2a::wire::{Message, Role, TaskState, TaskView};
use crate::gateway::egress::AllowList;
use crate::protocol::agent::Agent;
use crate::protocol::capabilities::{Capability, ParticipantType};
use crate::protocol::event::SubscriptionFilter;
use crate::protocol::json::RawJson;
use crate::protocol::message::Message as MapMessage;
use crate::protocol::methods::agents::{AgentFilter, RegisterParams};
use crate::protocol::methods::messaging::SendParams as MapSendParams;
use crate::transport::in_process::InProcessLinks;

/// The id (and name) of the gateway's agent participant and of its agent (on a cluster's
/// standby, qualified with the node's name: [`node_id`]).
pub const GATEWAY_AGENT: &str = "a2a-gateway";

/// The id of one of the gateway's sessions on `node`: `id` itself on a single router or the
/// cluster's live node, `id@node` on a standby, whose gateway is a second one with sessions
/// of its own (relayed to the live node; `gateway::RESERVED_IDS` covers these forms too).
pub fn node_id(id: &str, node: Option<&str>) -> String {
    match node {
        Some(node) => format!("{id}@{node}"),
        None => id.to_owned(),
    }
}

/// The status message of a task ended because the cluster node whose gateway sent its agent
/// the message died before the agent answered (its reply would go to that gateway).
pub const SENDER_GONE: &str =
    "the router node that sent the task's message stopped before the agent answered";

/// Follows `events` (the gateway agents' `agent_unregistered` and `agent.presence.changed`)
/// for the live node's gateway: when another node's gateway agent goes (its node died), the
/// tasks waiting on it end ([`Core::end_if_orphaned`]). Ends with the subscription or the
/// gateway.
async fn watch_other_gateways(core: Weak<Core>, mut events: crate::client::Subscription) {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Gone {
        agent_id: String,
        #[serde(default)]
        status: Option<crate::protocol::agent::PresenceStatus>,
    }
    while let Some(envelope) = events.next().await {
        let Some(gone) = envelope
            .event
            .data
            .as_ref()
            .and_then(|d| serde_json::from_str::<Gone>(d.get()).ok())
        else {
            continue;
        };
        let offline = gone
            .status
            .is_none_or(|s| s == crate::protocol::agent::PresenceStatus::Offline);
        // Another node's (`a2a-gateway@<node>`): this gateway's own never goes while it runs.
        if !offline || !is_gateway_agent(&gone.agent_id) || !gone.agent_id.contains('@') {
            continue;
        }
        let Some(core) = core.upgrade() else { return };
        tokio::spawn(async move {
            let waiting =
                crate::gateway::a2a::recovery::waiting_on(&core.books[0], &gone.agent_id).await;
            let mut ended = 0;
            for id in waiting {
                if core.end_if_orphaned(&id, &gone.agent_id).await {
                    ended += 1;
                }
            }
            if ended > 0 {
                tracing::info!(gateway = %gone.agent_id, tasks = ended, "a2a gateway: ended the tasks another node's gateway was waiting on");
            }
        });
    }
}

/// Whether `id` is the gateway's agent, on any node (not an A2A agent of its own).
pub fn is_gateway_agent(id: &str) -> bool {
    id.split_once('@').map_or(id, |(base, _)| base) == GATEWAY_AGENT
}

/// The id of the gateway's bookkeeping participant (a `system` session with no agent).
pub const GATEWAY_BOOKS: &str = "a2a-gateway-tasks";

/// The participant ids of the books pool: [`GATEWAY_BOOKS`] (which also holds the feed) and
/// three more. Each carries the calls of a quarter of the tasks, so the gateway's bookkeeping
/// has four times a connection's request rate (`[limits] rate_per_connection`).
pub const BOOKS: [&str; 4] = [
    GATEWAY_BOOKS,
    "a2a-gateway-tasks-1",
    "a2a-gateway-tasks-2",
    "a2a-gateway-tasks-3",
];

/// The `map/tasks/*` methods (docs/tasks.md), called with JSON text so that the verbatim
/// members of `meta.a2a` keep their bytes both ways.
mod methods {
    use crate::protocol::methods::tasks::{TasksCreate, TasksGet, TasksList, TasksUpdate};
    use crate::protocol::methods::Method;
    pub const CREATE: &str = TasksCreate::NAME;
    pub const UPDATE: &str = TasksUpdate::NAME;
    pub const GET: &str = TasksGet::NAME;
    pub const LIST: &str = TasksList::NAME;
}

/// Longest a blocking `SendMessage` waits for the task to end or be interrupted; after that it
/// answers with the task as it is (still working), which the caller can poll or resubscribe to.
pub const BLOCKING_WAIT: Duration = Duration::from_secs(60);

/// MAP tasks read per `map/tasks/list` page while `ListTasks` looks for the caller's tasks,
/// after the first page (which is the size the caller asked for: a caller whose tasks are most
/// of the board reads no more than it gets).
pub const LIST_SCAN_PAGE: u32 = 250;

/// MAP pages one `ListTasks` reads at most. A caller whose tasks are rare among many gets a
/// short (or empty) page with a `nextPageToken` rather than one request that reads the whole
/// board.
pub const LIST_SCAN_PAGES: usize = 8;

/// Where an A2A call is addressed: one MAP agent (`/a2a/agents/{id}`), the agent a path named
/// in a previous run, or the router's own endpoint (`/a2a`), which serves the tasks of every
/// agent.
#[derive(Debug, Clone)]
pub enum Target {
    /// One live agent: its tasks, and (after a restart) those of a gone agent of its name.
    Agent(Box<Agent>),
    /// A path naming no live agent (`/a2a/agents/<old id>`): the tasks of the agent that had
    /// this id or name. New tasks need a live agent.
    Former(String),
    /// The router endpoint.
    Router,
}

impl Target {
    /// The answer for a task not found at this target: at a former agent's URL the path itself
    /// names nothing (404, as before the rule), elsewhere -32001.
    fn not_found(&self, id: &str) -> A2aError {
        match self {
            Self::Former(agent) => A2aError::unknown_agent(agent),
            _ => A2aError::task_not_found(id),
        }
    }
}

/// Calls `method` on `client` with JSON text both ways.
async fn call(
    client: &Client,
    method: &str,
    params: String,
    task: Option<&str>,
) -> Result<String, A2aError> {
    client
        .call_text(method, params)
        .await
        .map_err(|e| A2aError::from_map(&e, task))
}

/// The gateway's MAP sessions and the operations on them.
#[derive(Debug)]
pub struct Core {
    /// The agent session: sends to agents as `a2a-gateway`, receives their replies.
    client: Client,
    agent: AgentHandle,
    /// The books sessions (`system`): task updates and reads; the first also the feed.
    books: Vec<Client>,
    /// Watchers of tasks.
    pub feed: Arc<Feed>,
    /// Webhooks of tasks.
    pub push: Arc<Push>,
    /// One lock per task being changed (see the module docs); entries of tasks no longer
    /// locked are dropped as the table grows.
    locks: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
    /// What MAP takes.
    limits: Limits,
}

/// Per task with agent messages being applied: the newest one's number and the signal that
/// it is done (the next one about the task waits for it).
type Chains = HashMap<String, (u64, oneshot::Receiver<()>)>;

/// Locks held past this many entries are swept of the dead ones.
const LOCKS_SWEEP: usize = 1024;

use crate::sync::lock as lock_map;

impl Core {
    /// Opens the sessions, registers the gateway agent, subscribes to `task.*` and starts the
    /// loops (they end when the sessions do), and the sweep of the tasks a restart interrupted
    /// (`recovery.rs`; `started`: when the gateway was made, Unix ms). `node`: the standby
    /// this gateway runs on ([`node_id`]); a standby's gateway sweeps nothing (the live node's
    /// does, when it starts: a standby that takes over starts one).
    ///
    /// # Errors
    /// A session or the registration was refused.
    pub async fn start(
        links: &(dyn InProcessLinks + Send + Sync),
        push_allow: AllowList,
        limits: Limits,
        started: u64,
        node: Option<&str>,
    ) -> Result<Arc<Self>, ClientError> {
        let me = node_id(GATEWAY_AGENT, node);
        let client = Client::in_process_as(
            links,
            crate::auth::service_principal(),
            ClientOptions::agent()
                .name(me.clone())
                .participant_id(me.clone())
                .request_timeout(Duration::from_secs(30)),
        )
        .await?;
        let agent = client
            .register(RegisterParams {
                agent_id: Some(me.clone().into()),
                name: Some(me),
                description: Some(
                    "The A2A gateway: sends A2A callers' messages to MAP agents and takes their replies"
                        .into(),
                ),
                role: Some("gateway".into()),
                ..RegisterParams::default()
            })
            .await?;
        let mut books = Vec::with_capacity(BOOKS.len());
        for id in BOOKS {
            let id = node_id(id, node);
            books.push(
                Client::in_process_as(
                    links,
                    crate::auth::service_principal(),
                    ClientOptions::new()
                        .participant_type(ParticipantType::System)
                        .name(id.clone())
                        .participant_id(id)
                        .request_timeout(Duration::from_secs(30)),
                )
                .await?,
            );
        }
        let events = books[0]
            .subscribe(SubscriptionFilter {
                // task.updated is a vendor type: named (docs/compatibility.md §7).
                event_types: Some(vec!["task.*".into(), "task.updated".into()]),
                ..SubscriptionFilter::default()
            })
            .await?;
        let feed = Arc::new(Feed::default());
        let push = Arc::new(Push::new(push_allow, limits.max_push_configs_per_principal));
        let core = Arc::new(Self {
            client,
            agent,
            books,
            feed: Arc::clone(&feed),
            push: Arc::clone(&push),
            locks: Mutex::new(HashMap::new()),
            limits,
        });
        tokio::spawn(async move { feed.run(events, push).await });
        // NB: after the feed, so that a stream resubscribed to an interrupted task sees it end.
        let weak = Arc::downgrade(&core);
        let sweep = node.is_none().then(|| {
            crate::gateway::a2a::recovery::run(core.books[0].clone(), started, move |id| {
                let core = weak.upgrade();
                async move {
                    match core {
                        Some(core) => {
                            let reason = crate::gateway::a2a::recovery::REASON;
                            core.end_if_interrupted(&id, started, reason).await
                        }
                        None => false,
                    }
                }
            })
        });
        if let Some(sweep) = sweep {
            tokio::spawn(sweep);
        }
        // The live node's gateway also ends the tasks a dead standby's gateway was waiting on.
        if node.is_none() {
            let gone = core.books[0]
                .subscribe(SubscriptionFilter {
                    // agent.presence.changed is a vendor type: named.
                    event_types: Some(vec![
                        "agent_unregistered".into(),
                        "agent.presence.changed".into(),
                    ]),
                    ..SubscriptionFilter::default()
                })
                .await?;
            tokio::spawn(watch_other_gateways(Arc::downgrade(&core), gone));
        }
        let mut inbox = core.agent.messages();
        let weak = Arc::downgrade(&core);
        tokio::spawn(async move {
            // NB: each reply in a task of its own, so that a slow update of one task never
            // holds up the replies about the others; the replies about one task still apply
            // in arrival order: each waits for the one before it (`chains`).
            let chains: Arc<Mutex<Chains>> = Arc::default();
            let mut generation = 0u64;
            while let Some(message) = inbox.next().await {
                let Some(core) = weak.upgrade() else { break };
                let Some(id) = message.correlation_id() else {
                    tracing::debug!(from = %message.from, "a2a gateway: message without correlationId ignored");
                    continue;
                };
                generation += 1;
                let (done, next) = oneshot::channel::<()>();
                let before = lock_map(&chains)
                    .insert(id.clone(), (generation, next))
                    .map(|(_, rx)| rx);
                let chains = Arc::clone(&chains);
                let mine = generation;
                tokio::spawn(async move {
                    if let Some(before) = before {
                        let _ = before.await;
                    }
                    core.on_agent_message(&id, message).await;
                    drop(done);
                    let mut chains = lock_map(&chains);
                    if chains.get(&id).is_some_and(|(g, _)| *g == mine) {
                        chains.remove(&id);
                    }
                });
            }
        });
        Ok(core)
    }

    /// The books session of task `id` (always the same one for a task).
    fn books_for(&self, id: &str) -> &Client {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        id.hash(&mut h);
        let n = usize::try_from(h.finish() % self.books.len() as u64).unwrap_or(0);
        &self.books[n]
    }

    /// The lock of task `id` (made when nobody holds it).
    fn task_lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = lock_map(&self.locks);
        if let Some(l) = locks.get(id).and_then(Weak::upgrade) {
            return l;
        }
        if locks.len() >= LOCKS_SWEEP {
            locks.retain(|_, w| w.strong_count() > 0);
        }
        let l = Arc::new(tokio::sync::Mutex::new(()));
        locks.insert(id.to_owned(), Arc::downgrade(&l));
        l
    }

    /// Serialises the changes of task `id` (and of no other).
    async fn lock_task(&self, id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        self.task_lock(id).lock_owned().await
    }

    /// Whether MAP would take a request with these `params` (JSON text): the frame within
    /// `max_frame_bytes`, nested at most `max_depth` deep.
    ///
    /// # Errors
    /// 413 (-32600) naming the limit and `what` would have broken it.
    fn fits(&self, params: &str, what: &str) -> Result<(), A2aError> {
        let bytes = params.len() + MAP_ENVELOPE_BYTES;
        if bytes > self.limits.max_frame_bytes {
            return Err(A2aError::too_large(format!(
                "{what} would be a MAP request of {bytes} bytes, over the router's limit of {} ([limits] max_frame_bytes)",
                self.limits.max_frame_bytes
            )));
        }
        // The envelope adds one level.
        let depth = self.limits.max_depth.saturating_sub(1);
        crate::protocol::jsonrpc::check_depth(params, depth).map_err(|_| {
            A2aError::too_large(format!(
                "{what} would nest deeper than the router's limit of {} levels ([limits] max_depth)",
                self.limits.max_depth
            ))
        })
    }

    // -----------------------------------------------------------------------------------------
    // Agents

    /// The agents an A2A caller may address: those `viewer` sees, but the gateway.
    ///
    /// # Errors
    /// The listing failed.
    pub async fn agents(&self, viewer: &Client) -> Result<Vec<Agent>, A2aError> {
        let agents = viewer
            .list_agents(AgentFilter::default())
            .await
            .map_err(|e| A2aError::from_map(&e, None))?;
        Ok(agents
            .into_iter()
            .filter(|a| !is_gateway_agent(a.id.as_str()))
            .collect())
    }

    /// The agent an A2A path names: by id, else by a unique name.
    ///
    /// # Errors
    /// [`A2aError::unknown_agent`] when none (or several, by name) match; MAP's refusals (a
    /// missing `observation.canQuery` is 403, a rate limit 429).
    pub async fn resolve(&self, viewer: &Client, id_or_name: &str) -> Result<Agent, A2aError> {
        if is_gateway_agent(id_or_name) {
            return Err(A2aError::unknown_agent(id_or_name));
        }
        match viewer.get_agent(id_or_name).await {
            Ok(agent) => return Ok(agent),
            Err(e) if refusal(&e) => return Err(A2aError::from_map(&e, None)),
            Err(_) => {}
        }
        let named: Vec<Agent> = self
            .agents(viewer)
            .await?
            .into_iter()
            .filter(|a| a.name.as_deref() == Some(id_or_name))
            .collect();
        match <[Agent; 1]>::try_from(named) {
            Ok([agent]) => Ok(agent),
            Err(_) => Err(A2aError::unknown_agent(id_or_name)),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Tasks

    /// Calls `method` about task `task` (or none: the first books session) on the books.
    async fn call(
        &self,
        method: &str,
        params: String,
        task: Option<&str>,
    ) -> Result<String, A2aError> {
        let books = task.map_or(&self.books[0], |t| self.books_for(t));
        call(books, method, params, task).await
    }

    /// Ends task `id` with the status message `reason` if it is still as the previous run left
    /// it (last changed before `started`, `submitted` or `working`) and its agent is not back
    /// (or its message was sent by another node's gateway, now gone); read and written under
    /// its lock (`recovery.rs`). Whether it ended it.
    pub(super) async fn end_if_interrupted(&self, id: &str, started: u64, reason: &str) -> bool {
        #[derive(serde::Deserialize)]
        struct Wrapped {
            task: crate::gateway::a2a::recovery::Times,
        }
        self.end_failed(id, reason, async |text, record| {
            serde_json::from_str::<Wrapped>(text).is_ok_and(|w| w.task.updated_at < started)
                && (!self.agent_live(&record.agent).await || self.sender_gone(record).await)
        })
        .await
    }

    /// Ends task `id` `failed` with the status message `reason` if it is still in flight
    /// (`submitted`, `working`) and `still` holds for what was read (the task's text, its
    /// record): read and written under the task's lock. Whether it ended it.
    async fn end_failed(
        &self,
        id: &str,
        reason: &str,
        still: impl AsyncFnOnce(&str, &Record) -> bool,
    ) -> bool {
        let _guard = self.lock_task(id).await;
        let Ok(text) = self
            .call(methods::GET, json!({ "taskId": id }).to_string(), Some(id))
            .await
        else {
            return false;
        };
        let Some(mut record) = MapTask::from_wrapped(&text).and_then(|t| t.record()) else {
            return false;
        };
        if !record.state.awaits_agent() || !still(&text, &record).await {
            return false;
        }
        let message = Message::agent_text(reason, id, &record.context_id);
        record.set_state(TaskState::Failed, Some(message));
        match self.write(id, &record, None).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(task = %id, error = %e, reason, "a2a gateway: a task in flight could not be ended");
                false
            }
        }
    }

    /// Whether the agent `id` is registered now.
    async fn agent_live(&self, id: &str) -> bool {
        self.books[0].get_agent(id).await.is_ok()
    }

    /// Whether the agent `id` is registered and online now (an orphaned one is offline).
    async fn agent_online(&self, id: &str) -> bool {
        self.books[0].get_agent(id).await.is_ok_and(|a| {
            a.presence
                .is_none_or(|p| p.status == crate::protocol::agent::PresenceStatus::Online)
        })
    }

    /// Whether `record` waits for a reply that another node's gateway agent was to receive,
    /// and that gateway is gone (unregistered, or offline: its node died).
    async fn sender_gone(&self, record: &Record) -> bool {
        match record.gateway.as_deref() {
            Some(g) if g != self.agent.id().as_str() && is_gateway_agent(g) => {
                !self.agent_online(g).await
            }
            _ => false,
        }
    }

    /// Ends task `id` if it still waits (`submitted`, `working`) for a reply that `gateway`,
    /// another node's gateway agent now gone, was to receive: that reply can reach no gateway
    /// that would apply it. Read and written under the task's lock. Whether it ended it.
    pub(super) async fn end_if_orphaned(&self, id: &str, gateway: &str) -> bool {
        let node = gateway.split_once('@').map_or("?", |(_, n)| n);
        let reason =
            format!("{SENDER_GONE} (node {node}, whose gateway sent the agent the message)");
        self.end_failed(id, &reason, async |_, record| {
            record.gateway.as_deref() == Some(gateway) && self.sender_gone(record).await
        })
        .await
    }

    /// Whether `target` serves `record`: the router endpoint serves every task; an agent's URL
    /// the tasks of that agent and, when their agent is gone, those of an agent of the same
    /// name (a restart gave it a new id); a former agent's URL the tasks of the agent that had
    /// that id or name.
    async fn owns(&self, target: &Target, record: &Record) -> bool {
        match target {
            Target::Router => true,
            Target::Agent(a) if a.id.as_str() == record.agent => true,
            Target::Agent(a) => {
                a.name.is_some()
                    && a.name == record.agent_name
                    && !self.agent_live(&record.agent).await
            }
            Target::Former(s) => {
                &record.agent == s || record.agent_name.as_deref() == Some(s.as_str())
            }
        }
    }

    /// The target a path's `agentId` names: a live agent `viewer` sees, else, when `former`
    /// (a request about one task: new tasks and listings need a live agent), the agent that had
    /// that id or name before.
    ///
    /// # Errors
    /// MAP's refusals (403, 429); [`A2aError::unknown_agent`] for a path that names no live
    /// agent when not `former`.
    pub async fn target(
        &self,
        viewer: &Client,
        id_or_name: &str,
        former: bool,
    ) -> Result<Target, A2aError> {
        match self.resolve(viewer, id_or_name).await {
            Ok(agent) => Ok(Target::Agent(Box::new(agent))),
            Err(e)
                if e.status == axum::http::StatusCode::NOT_FOUND
                    && !is_gateway_agent(id_or_name)
                    && former =>
            {
                Ok(Target::Former(id_or_name.to_owned()))
            }
            Err(e) => Err(e),
        }
    }

    /// The A2A task `id`, as the books have it, when `target` serves it (no caller rule).
    ///
    /// # Errors
    /// -32001 (404 at a former agent's URL) when there is no such task, it is not an A2A
    /// task, or `target` does not serve it.
    async fn load(&self, target: &Target, id: &str) -> Result<Record, A2aError> {
        let text = self
            .call(methods::GET, json!({ "taskId": id }).to_string(), Some(id))
            .await
            .map_err(|e| {
                if e.code == crate::gateway::a2a::error::code::TASK_NOT_FOUND {
                    target.not_found(id)
                } else {
                    e
                }
            })?;
        let record = MapTask::from_wrapped(&text)
            .and_then(|t| t.record())
            .ok_or_else(|| target.not_found(id))?;
        if !self.owns(target, &record).await {
            return Err(target.not_found(id));
        }
        Ok(record)
    }

    /// The A2A task `id` at `target`, when `caller` controls it (`access.rs`).
    ///
    /// # Errors
    /// -32001 when there is no such task, it is not an A2A task, it belongs to another agent
    /// than `target`, or `caller` does not control it: the same answer, so that existence
    /// does not leak (404 at a former agent's URL, also the same for all).
    pub async fn task(
        &self,
        caller: &Caller,
        target: &Target,
        id: &str,
    ) -> Result<Record, A2aError> {
        let record = self.load(target, id).await?;
        if !caller.controls(&record).await {
            return Err(target.not_found(id));
        }
        Ok(record)
    }

    /// Writes `record` as the task's new state: `status` follows the A2A state; `result`, when
    /// given, becomes `meta.result` (what `task.completed` reports).
    async fn write(
        &self,
        id: &str,
        record: &Record,
        result: Option<&RawJson>,
    ) -> Result<(), A2aError> {
        #[derive(Serialize)]
        struct Meta<'a> {
            a2a: &'a Record,
            #[serde(skip_serializing_if = "Option::is_none")]
            result: Option<&'a RawJson>,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Update<'a> {
            task_id: &'a str,
            status: &'a str,
            meta: Meta<'a>,
        }
        let params = serde_json::to_string(&Update {
            task_id: id,
            status: record.state.map_status(),
            meta: Meta {
                a2a: record,
                result,
            },
        })
        .map_err(A2aError::internal)?;
        self.fits(&params, &format!("task {id}"))?;
        self.call(methods::UPDATE, params, Some(id)).await.map(drop)
    }

    /// Reads the task, applies `change`, writes it back, all under the task's lock. `change`
    /// returns an error to leave the task as it was.
    async fn modify(
        &self,
        target: &Target,
        id: &str,
        change: impl FnOnce(&mut Record) -> Result<Option<RawJson>, A2aError>,
    ) -> Result<Record, A2aError> {
        let _guard = self.lock_task(id).await;
        let mut record = self.load(target, id).await?;
        let result = change(&mut record)?;
        self.write(id, &record, result.as_ref()).await?;
        Ok(record)
    }

    /// A new message from an A2A caller: a new task (or the next turn of the task it names)
    /// and a `map/send` to the agent. Returns the task's id, its record as created (seq 0,
    /// `submitted`) and, when `watch`, a watcher registered before the task existed.
    ///
    /// # Errors
    /// 403 when the caller may not send (`messaging.canSend`) or create tasks
    /// (`tasks.canCreate`); -32001 / -32004 for a follow-up to a task that is unknown, not the
    /// caller's to control, or over; MAP failures.
    pub async fn send(
        &self,
        caller: &Caller,
        target: &Target,
        mut message: Message,
        metadata: Option<RawJson>,
        push: Option<PushConfig>,
        watch: bool,
    ) -> Result<(String, Record, Option<mpsc::Receiver<Snapshot>>), A2aError> {
        message.role = Role::User;
        // NB: what MAP would refuse is refused here, before anything is made or changed.
        let payload = agent_payload(&message);
        if payload.len() > self.limits.max_payload_bytes {
            return Err(A2aError::too_large(format!(
                "the message's content is {} bytes as a MAP message, over the router's limit of {} ([limits] max_payload_bytes)",
                payload.len(),
                self.limits.max_payload_bytes
            )));
        }
        self.fits(payload.get(), "the message to the agent")?;
        let (id, first, watcher) = match message.task_id.clone() {
            Some(id) => {
                // The caller must control the task, and may still send to its agent: the
                // task's, or after a restart the one that has its agent's name now.
                let current = self.task(caller, target, &id).await?;
                caller.require(Capability::CanSend)?;
                let agent = self.agent_of(caller, &current, &id).await?;
                let watcher = watch.then(|| self.feed.watch(&id));
                let record = self
                    .modify(target, &id, |r| {
                        if r.state.is_terminal() {
                            return Err(A2aError::unsupported(format!(
                                "task {id} is {}; send a message without taskId to start a new task",
                                r.state.v03_name()
                            )));
                        }
                        if let Some(c) = &message.context_id {
                            if c != &r.context_id {
                                return Err(A2aError::invalid_params(format!(
                                    "task {id} belongs to context {}",
                                    r.context_id
                                )));
                            }
                        }
                        message.context_id = Some(r.context_id.clone());
                        r.history.push(message.clone());
                        r.agent = agent.id.to_string();
                        r.agent_name.clone_from(&agent.name);
                        r.gateway = Some(self.agent.id().to_string());
                        r.set_state(TaskState::Working, None);
                        Ok(None)
                    })
                    .await?;
                if let Some(config) = push {
                    // After the change (a refused follow-up registers nothing); the webhook gets the
                    // changes from here on.
                    self.push.set(&id, config)?;
                }
                (id, record, watcher)
            }
            None => {
                let agent = match target {
                    Target::Agent(agent) => agent,
                    Target::Former(name) => return Err(A2aError::unknown_agent(name)),
                    Target::Router => {
                        return Err(A2aError::invalid_params(
                            "the router endpoint takes follow-ups only (message.taskId); send new tasks to /a2a/agents/{agentId}",
                        ))
                    }
                };
                // NB: checked before anything is made: a caller who may not send creates no task.
                caller.require(Capability::CanSend)?;
                let id = format!("task-{}", crate::protocol::ids::Ulid::random());
                let context_id = message
                    .context_id
                    .clone()
                    .unwrap_or_else(|| format!("ctx-{}", crate::protocol::ids::Ulid::random()));
                message.task_id = Some(id.clone());
                message.context_id = Some(context_id.clone());
                let record = Record {
                    context_id,
                    state: TaskState::Submitted,
                    status_message: None,
                    timestamp: Some(rfc3339_now()),
                    artifacts: Vec::new(),
                    history: vec![message.clone()],
                    seq: 0,
                    update: None,
                    agent: agent.id.to_string(),
                    agent_name: agent.name.clone(),
                    metadata,
                    owner: caller.owner(),
                    message_only: false,
                    gateway: Some(self.agent.id().to_string()),
                };
                let created = create_params(&id, agent, &message, &record)?;
                let first = record.clone();
                let mut working = record;
                working.set_state(TaskState::Working, None);
                // The record is written right after the task is made: too big, nothing is made.
                self.fits(
                    &serde_json::to_string(&working).map_err(A2aError::internal)?,
                    "the new task",
                )?;
                if let Some(config) = push {
                    self.push.set(&id, config)?;
                }
                let watcher = watch.then(|| self.feed.watch(&id));
                if let Err(e) = call(caller.session(), methods::CREATE, created, None).await {
                    self.push.forget(&id);
                    return Err(e);
                }
                {
                    // The record as made (`submitted`: webhooks get the task first), then
                    // `working`.
                    let _guard = self.lock_task(&id).await;
                    self.write(&id, &first, None).await?;
                    self.write(&id, &working, None).await?;
                }
                (id, first, watcher)
            }
        };
        let to = RawJson::from_value(&json!({ "agent": first.agent }));
        let meta = RawJson::from_value(&json!({
            "protocol": "a2a",
            "correlationId": id,
            "expectsResponse": true,
            "a2a": {
                "taskId": id,
                "contextId": first.context_id,
                "messageId": message.message_id,
            }
        }));
        let sent = self
            .client
            .send_with(MapSendParams {
                to,
                payload: Some(payload),
                meta: Some(meta),
            })
            .await;
        let undelivered = match sent {
            Ok(r) if r.delivered.is_empty() && r.queued.is_empty() => {
                Some("the agent is not connected".to_owned())
            }
            Ok(_) => None,
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = undelivered {
            let context = first.context_id.clone();
            self.modify(&Target::Router, &id, |r| {
                r.set_state(
                    TaskState::Failed,
                    Some(Message::agent_text(
                        format!("could not deliver the message to agent {}: {why}", r.agent),
                        &id,
                        &context,
                    )),
                );
                Ok(None)
            })
            .await?;
        }
        Ok((id, first, watcher))
    }

    /// The agent a follow-up to `record` goes to, as `caller` sees it: the task's agent, or,
    /// when that one is gone (a restart gave the agent a new id), the one agent that has its
    /// name now.
    ///
    /// # Errors
    /// 403 when the caller sees no such agent; MAP's refusals.
    async fn agent_of(
        &self,
        caller: &Caller,
        record: &Record,
        id: &str,
    ) -> Result<Agent, A2aError> {
        let hidden = || {
            A2aError::forbidden(format!(
                "agent {} of task {id} is not one this caller may see",
                record.agent
            ))
        };
        match self.resolve(caller.session(), &record.agent).await {
            Ok(a) => Ok(a),
            Err(e) if e.status == axum::http::StatusCode::NOT_FOUND => {
                let Some(name) = &record.agent_name else {
                    return Err(hidden());
                };
                match self.resolve(caller.session(), name).await {
                    Ok(a) if a.name.as_deref() == Some(name) => Ok(a),
                    Ok(_) => Err(hidden()),
                    Err(e) if e.status == axum::http::StatusCode::NOT_FOUND => Err(hidden()),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// `CancelTask`: tells the agent (`{"a2a": {"cancel": id}}`) and ends the task `canceled`.
    ///
    /// # Errors
    /// -32001 (also a task the caller does not control), or -32002 when the task has already
    /// ended.
    pub async fn cancel(
        &self,
        caller: &Caller,
        target: &Target,
        id: &str,
    ) -> Result<Record, A2aError> {
        self.task(caller, target, id).await?;
        let record = self
            .modify(target, id, |r| {
                if r.state.is_terminal() {
                    return Err(A2aError::not_cancelable(id, r.state.v03_name()));
                }
                r.set_state(TaskState::Canceled, None);
                Ok(None)
            })
            .await?;
        let control = MapSendParams {
            to: RawJson::from_value(&json!({ "agent": record.agent })),
            payload: Some(RawJson::from_value(&json!({ "a2a": { "cancel": id } }))),
            meta: Some(RawJson::from_value(&json!({
                "protocol": "a2a",
                "correlationId": id,
                "a2a": { "taskId": id, "contextId": record.context_id, "control": "cancel" }
            }))),
        };
        if let Err(e) = self.client.send_with(control).await {
            tracing::debug!(task = id, error = %e, "a2a gateway: cancel notice not delivered");
        }
        Ok(record)
    }

    /// `ListTasks`: the A2A tasks of `target` that `caller` controls, in creation order, at
    /// most `limit`; and the token of the next page, if there may be one (the id of the last
    /// task looked at, a MAP cursor).
    ///
    /// The books list every task; the caller's are picked out page by page (`limit` tasks,
    /// then [`LIST_SCAN_PAGE`] tasks a page, at most [`LIST_SCAN_PAGES`] pages a call).
    ///
    /// # Errors
    /// MAP failures (an unknown page token is -32602).
    pub async fn list(
        &self,
        caller: &Caller,
        target: &Target,
        context_id: Option<&str>,
        state: Option<TaskState>,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<(Vec<TaskView>, Option<String>), A2aError> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Page {
            tasks: Vec<MapTask>,
            #[serde(default)]
            next_cursor: Option<String>,
        }
        let mut filter = serde_json::Map::new();
        if let Target::Agent(a) = target {
            filter.insert("assignee".into(), json!(a.id));
        }
        if let Some(s) = state {
            filter.insert("status".into(), json!(s.map_status()));
        }
        let mut out = Vec::new();
        let mut cursor = cursor.map(str::to_owned);
        for page in 0..LIST_SCAN_PAGES {
            let size = if page == 0 { limit } else { LIST_SCAN_PAGE };
            let mut params = json!({ "filter": filter, "limit": size });
            if let Some(c) = &cursor {
                params["cursor"] = json!(c);
            }
            let text = self.call(methods::LIST, params.to_string(), None).await?;
            let page: Page = serde_json::from_str(&text).map_err(A2aError::internal)?;
            let last = page.tasks.len();
            for (i, t) in page.tasks.iter().enumerate() {
                let Some(record) = t.record() else { continue };
                let view = record.view(&t.id);
                if context_id.is_some_and(|c| view.context_id != c)
                    || state.is_some_and(|s| view.state != s)
                    || !caller.controls(&record).await
                {
                    continue;
                }
                out.push(view);
                if out.len() == limit as usize {
                    let more = i + 1 < last || page.next_cursor.is_some();
                    return Ok((out, more.then(|| t.id.clone())));
                }
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok((out, None)),
            }
        }
        Ok((out, cursor))
    }

    // -----------------------------------------------------------------------------------------
    // The agents' side

    /// Fails task `id` (its stored state, which the refused change never reached) with a status
    /// message saying why the agent's update could not be kept.
    async fn fail_too_large(&self, id: &str, why: &A2aError) {
        let failed = async {
            let mut record = self.load(&Target::Router, id).await?;
            let text = format!(
                "the agent's update could not be recorded: {}",
                why.message.trim_start_matches("Invalid request: ")
            );
            let message = Message::agent_text(text, id, &record.context_id);
            record.set_state(TaskState::Failed, Some(message));
            self.write(id, &record, None).await
        }
        .await;
        if let Err(e) = failed {
            tracing::warn!(task = %id, error = %e, "a2a gateway: a task whose update was too large could not be failed");
        }
    }

    /// One message to the gateway agent: progress, an artifact, a state, or the final reply of
    /// the task its `correlationId` names. Messages about unknown, foreign or finished tasks are
    /// dropped (logged).
    async fn on_agent_message(&self, id: &str, message: MapMessage) {
        let report = AgentReport::of(message.payload.as_ref());
        if report == AgentReport::Ignored {
            return;
        }
        let from = message.from.clone();
        let _guard = self.lock_task(id).await;
        let outcome = async {
            let mut record = self.load(&Target::Router, id).await?;
            if record.agent != from {
                return Err(A2aError::invalid_request(format!(
                    "{from} is not the agent of task {id}"
                )));
            }
            if record.state.is_terminal() {
                return Err(A2aError::unsupported(format!(
                    "task {id} is already {}",
                    record.state.v03_name()
                )));
            }
            let text = |t: String| Message::agent_text(t, id, &record.context_id);
            let written = match report {
                AgentReport::Working(m) => {
                    let m = m.map(text);
                    record.set_state(TaskState::Working, m);
                    self.write(id, &record, None).await
                }
                AgentReport::Artifact {
                    artifact,
                    append,
                    last_chunk,
                } => {
                    record.add_artifact(artifact, append, last_chunk);
                    self.write(id, &record, None).await
                }
                AgentReport::State(state, m) => {
                    let m = m.map(text);
                    record.set_state(state, m);
                    self.write(id, &record, None).await
                }
                AgentReport::Final(payload) => {
                    let artifact = final_artifact(payload.as_ref());
                    let mut done = Ok(());
                    if !artifact.parts.is_empty() {
                        record.add_artifact(artifact, false, true);
                        done = self.write(id, &record, payload.as_ref()).await;
                    }
                    if done.is_ok() {
                        record.set_state(TaskState::Completed, None);
                        done = self.write(id, &record, None).await;
                    }
                    done
                }
                AgentReport::Reply { parts, metadata } => {
                    let mut m = text(String::new());
                    m.parts = parts;
                    m.metadata = metadata;
                    // A direct answer only to the exchange's first message: after a turn
                    // (input-required ...) the caller holds the task, which completes.
                    record.message_only = record
                        .history
                        .iter()
                        .filter(|m| m.role == Role::User)
                        .count()
                        == 1;
                    record.set_state(TaskState::Completed, Some(m));
                    self.write(id, &record, None).await
                }
                AgentReport::Ignored => Ok(()),
            };
            if let Err(e) = &written {
                if e.status == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                    // What the agent sent cannot be kept in the task: the task fails saying
                    // so, rather than staying `working` with the answer lost.
                    self.fail_too_large(id, e).await;
                }
            }
            written
        }
        .await;
        if let Err(e) = outcome {
            tracing::debug!(task = %id, from = %from, error = %e, "a2a gateway: agent message not applied");
        }
    }
}

/// Whether a MAP error is a refusal to pass on (a grant, a rate limit, a quota), rather than
/// "no such agent".
fn refusal(e: &ClientError) -> bool {
    matches!(e, ClientError::Rpc { code, .. } if [1003, 4001, 4002].contains(&code.0))
}

/// The params of `map/tasks/create` for the A2A task `id` (made by the caller's session: MAP
/// applies the caller's `tasks.canCreate` and the assignee's visibility to the caller). Its
/// `meta.a2a` (the record, with the owner) is not in it: only the gateway's bookkeeping
/// sessions may write that member (`gateway::RESERVED_TASK_META`), which they do at once.
fn create_params(
    id: &str,
    agent: &Agent,
    message: &Message,
    record: &Record,
) -> Result<String, A2aError> {
    #[derive(Serialize)]
    struct Task<'a> {
        id: &'a str,
        assignee: &'a str,
        title: String,
        status: &'a str,
    }
    #[derive(Serialize)]
    struct Create<'a> {
        task: Task<'a>,
    }
    let title: String = message
        .parts
        .iter()
        .find_map(|p| p.text.as_deref())
        .unwrap_or("A2A task")
        .chars()
        .take(80)
        .collect();
    serde_json::to_string(&Create {
        task: Task {
            id,
            assignee: agent.id.as_str(),
            title,
            status: record.state.map_status(),
        },
    })
    .map_err(A2aError::internal)
}
