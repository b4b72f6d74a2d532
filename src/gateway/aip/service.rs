//! The RPCs of `GatewayService` (`docs/aip.md` has the mapping table).
//!
//! Every call is admitted first by one interceptor ([`admit`], installed by `listener.rs` in
//! front of the whole service, so a new RPC cannot miss it), the gRPC twin of the HTTP
//! gateways' gate (`gateway::guard`): with `[auth]` on, the metadata `authorization`
//! (`Bearer <API key or JWT>`, or the bare credential; the crate's one parser, `auth::bearer`)
//! checked by the gateway layer's one admission (`gateway::caller::Admission`;
//! `UNAUTHENTICATED` without it), then one request from the caller's rate budget (the
//! MAMP and IM buckets; `RESOURCE_EXHAUSTED` past it). Message sizes are capped once, on the
//! server (`listener.rs`). The handler finds the [`Caller`] in the request's extensions
//! ([`admitted`]) and acts through MAP sessions of that principal only: the node's own session
//! for what a node does, the caller's session (`callers.rs`) for lookups. A node may be acted
//! as (sent from, heartbeated, updated, deregistered) only by the subject that registered it;
//! a system principal may also deregister any node.
//!
//! Owns the update subscriptions (`SubscribeToUpdates` / `Unsubscribe`).

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status, Streaming};

use super::content;
use super::messages::message_meta;
use super::nodes::{self, Kind, Node};
use super::proto::agent_message::SessionStatus;
use super::proto::gateway_service_server::GatewayService;
use super::proto::node_update::UpdateType;
use super::proto::peer::InfoType;
use super::proto::task_info::TaskStatus as AipTaskStatus;
use super::proto::*;
use super::pump;
use super::settings::{AipSettings, Silence};
use super::state::{lock, AipGateway};
use crate::client::{Client, ClientError, ClientOptions};
use crate::gateway::caller::{Caller, Refusal, Subject};
use crate::gateway::wire::GatewayError;
use crate::protocol::json::RawJson;
use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::methods::agents::RegisterParams;
use crate::protocol::methods::messaging::SendParams;
use crate::protocol::methods::session::{AgentBehavior, DisconnectPolicy};

/// The interceptor in front of every RPC (module docs): the caller admitted by the one
/// admission and charged one request, put in the request's extensions for [`admitted`].
///
/// # Errors
/// `UNAUTHENTICATED` (no credential, or a refused one), `RESOURCE_EXHAUSTED` (rate), each
/// counted as a refusal.
pub fn admit(
    gw: Arc<AipGateway>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone + Send + Sync + 'static {
    move |mut request: Request<()>| {
        let ip = request.remote_addr().map(|a| a.ip());
        let secret = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| crate::auth::bearer::credential(v, true));
        let caller = gw.ctx.admission.admit(secret, ip).map_err(|refusal| {
            gw.refused(Status::unauthenticated(match refusal {
                Refusal::Missing => {
                    "this router needs metadata `authorization: Bearer <API key or JWT>`".to_owned()
                }
                Refusal::Refused(why) => format!("credential refused: {why}"),
            }))
        })?;
        gw.ctx
            .check_rate(&caller)
            .map_err(|_| gw.refused(Status::resource_exhausted("rate limited: slow down")))?;
        request.extensions_mut().insert(caller);
        Ok(request)
    }
}

/// The caller [`admit`] put in `request`.
///
/// # Errors
/// `INTERNAL` when the service runs without its interceptor (a wiring mistake).
fn admitted<T>(request: &Request<T>) -> Result<Caller, Status> {
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| Status::internal("the AIP service runs without its admission interceptor"))
}

/// The service tonic serves.
#[derive(Debug, Clone)]
pub struct Service {
    gw: Arc<AipGateway>,
    /// By (owner, subscriber id): a subscriber id is its principal's, as every id is, so one
    /// principal taking an id first never keeps another out of it.
    subscriptions: Arc<Mutex<Subscriptions>>,
}

/// The subscriptions by (owner, subscriber id).
type Subscriptions = HashMap<(Subject, String), Arc<Mutex<Subscription>>>;

#[derive(Debug, Default)]
struct Subscription {
    include: Option<HashSet<String>>,
    exclude: HashSet<String>,
    ended: bool,
}

/// A ClientError as a gRPC status.
pub fn status_of(e: &ClientError) -> Status {
    match e {
        ClientError::Timeout(t) => Status::deadline_exceeded(format!("no answer within {t:?}")),
        ClientError::NoRecipient { .. } => Status::unavailable("the receiver is not connected"),
        ClientError::Rpc { code, message, .. } => {
            let c = match *code {
                ErrorCode::AGENT_EXISTS => Code::AlreadyExists,
                ErrorCode::PERMISSION_DENIED
                | ErrorCode::INSUFFICIENT_SCOPE
                | ErrorCode::MAIL_PERMISSION_DENIED
                | ErrorCode::TASK_PERMISSION_DENIED => Code::PermissionDenied,
                ErrorCode::AUTH_REQUIRED | ErrorCode::AUTH_FAILED | ErrorCode::TOKEN_EXPIRED => {
                    Code::Unauthenticated
                }
                ErrorCode::AGENT_NOT_FOUND | ErrorCode::ADDRESS_NOT_FOUND => Code::NotFound,
                ErrorCode::EXHAUSTED | ErrorCode::RATE_LIMITED | ErrorCode::QUOTA_EXCEEDED => {
                    Code::ResourceExhausted
                }
                ErrorCode::INVALID_PARAMS => Code::InvalidArgument,
                _ => Code::Unavailable,
            };
            Status::new(c, message.clone())
        }
        other => Status::unavailable(other.to_string()),
    }
}

fn status_of_gateway(e: &GatewayError) -> Status {
    match e {
        GatewayError::Forbidden(m) => Status::permission_denied(m.clone()),
        GatewayError::Quota(m) => Status::resource_exhausted(m.clone()),
        GatewayError::RateLimited(d) => {
            Status::resource_exhausted(format!("rate limited: try again in {d:?}"))
        }
        GatewayError::Unavailable(m) => Status::unavailable(m.clone()),
        GatewayError::Map(e) => status_of(e),
    }
}

/// The trace context of a call's metadata, as MAP `meta` members: exactly one valid
/// `traceparent` (and the `tracestate` entries, joined), else nothing (`gateway::trace`).
fn trace_meta(metadata: &MetadataMap) -> Map<String, Value> {
    let mut out = Map::new();
    let mut parents = metadata.get_all("traceparent").iter();
    let (Some(parent), None) = (parents.next(), parents.next()) else {
        return out;
    };
    let Ok(parent) = parent.to_str() else {
        return out;
    };
    let states: Option<Vec<&str>> = metadata
        .get_all("tracestate")
        .iter()
        .map(|v| v.to_str().ok())
        .collect();
    let Some(states) = states else { return out };
    let state = (!states.is_empty()).then(|| states.join(","));
    let trace = crate::protocol::trace::TraceContext::new(parent.trim(), state.as_deref());
    crate::gateway::trace::insert_meta(&mut out, trace.as_ref());
    out
}

/// The caller's gRPC deadline (`grpc-timeout`), if it set one.
fn grpc_timeout(metadata: &MetadataMap) -> Option<Duration> {
    let v = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (n, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn task_status(s: i32) -> &'static str {
    match AipTaskStatus::try_from(s).unwrap_or(AipTaskStatus::Create) {
        AipTaskStatus::Create => "open",
        AipTaskStatus::Executing => "in_progress",
        AipTaskStatus::Waiting => "blocked",
        AipTaskStatus::Break => "failed",
        AipTaskStatus::Finish => "completed",
    }
}

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The options of a node's MAP session: under `on_silence = "offline"` its agent is orphaned,
/// not unregistered, when the session goes away.
fn node_options(gw: &AipGateway, id: &str) -> ClientOptions {
    let options = ClientOptions::agent().name(format!("AIP {id}"));
    match gw.settings.on_silence {
        Silence::Evict => options,
        Silence::Offline => options.disconnect_policy(DisconnectPolicy {
            agent_behavior: AgentBehavior::Orphan,
            grace_period_ms: None,
            notify_subscribers: None,
        }),
    }
}

/// A sign of life from node `id` (if it is one): refreshed; a node that was offline is back,
/// its agent reclaimed by a new session of its principal (what was kept for it is delivered
/// then), or removed if that fails.
async fn touch(gw: &Arc<AipGateway>, id: &str) {
    let Some(node) = gw.node(id) else { return };
    if !node.refresh() {
        return;
    }
    let reopened = async {
        let client = gw
            .ctx
            .open_as(node.principal.as_ref(), node_options(gw, id))
            .await
            .map_err(|e| format!("{e:?}"))?;
        let mut params = node.registration.clone();
        params.metadata = Some(RawJson::from(nodes::metadata(&node.peer())));
        match client.register(params).await {
            Ok(agent) => Ok((client, agent)),
            Err(e) => {
                let _ = client.close().await;
                Err(e.to_string())
            }
        }
    };
    match reopened.await {
        Ok((client, agent)) => {
            let messages = agent.messages();
            let unclaimed = client.messages();
            node.replace_session(client, agent);
            node.set_pump(tokio::spawn(pump::run(
                Arc::downgrade(gw),
                Arc::downgrade(&node),
                messages,
                unclaimed,
            )));
            gw.publish(NodeUpdate {
                update_type: UpdateType::Updated as i32,
                node_id: node.id.clone(),
                peer: Some(node.peer()),
            });
            tracing::info!(node = %id, "AIP node back online");
        }
        Err(e) => {
            tracing::warn!(node = %id, error = %e, "AIP node could not come back: removed");
            gw.remove(id).await;
        }
    }
}

/// Ends a session with `status` once its first message was read. What the caller is still
/// writing is read and dropped first (until it half-closes, or nothing came for 100 ms; 2 s at
/// most in all), then the status goes out as the stream's end, so that its client sees the
/// status and not a reset of a stream it is still writing.
fn refuse(mut inbound: Streaming<AgentMessage>, status: Status) -> Response<Stream_<AgentMessage>> {
    let (settled, settle) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut settled = Some(settled);
        let drain = async {
            loop {
                // What is already on its way is read before the status goes out.
                match tokio::time::timeout(Duration::from_millis(100), inbound.message()).await {
                    Ok(Ok(Some(_))) => {}
                    Ok(_) => break,
                    Err(_) => {
                        if let Some(s) = settled.take() {
                            let _ = s.send(());
                        }
                    }
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
        if let Some(s) = settled.take() {
            let _ = s.send(());
        }
    });
    Response::new(Box::pin(futures::stream::once(async move {
        let _ = settle.await;
        Err(status)
    })))
}

impl Service {
    /// The service over `gw`.
    pub fn new(gw: Arc<AipGateway>) -> Self {
        Self {
            gw,
            subscriptions: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Node `id`, which `caller` must own.
    fn own_node(&self, caller: &Caller, id: &str) -> Result<Arc<Node>, Status> {
        let node = self.gw.node(id).ok_or_else(|| {
            self.gw.refused(Status::failed_precondition(format!(
                "sender {id} is not registered with this gateway: register it first"
            )))
        })?;
        if node.owner != caller.subject() {
            return Err(self.gw.refused(Status::permission_denied(format!(
                "node {id} was registered by another principal"
            ))));
        }
        Ok(node)
    }

    async fn caller_session(&self, caller: &Caller) -> Result<Client, Status> {
        self.gw
            .ctx
            .caller_session(caller)
            .await
            .map_err(|e| status_of_gateway(&e))
    }

    /// Registers `peer` as a node of `caller` (both kinds).
    async fn register(&self, caller: &Caller, kind: Kind, peer: Peer) -> Result<Arc<Node>, Status> {
        let gw = &self.gw;
        let (id, address, name, domain, description) = match &peer.info_type {
            Some(InfoType::AgentInfo(a)) => {
                (&a.agent_id, &a.address, &a.name, &a.domain, &a.description)
            }
            Some(InfoType::ToolInfo(t)) => {
                (&t.tool_id, &t.address, &t.name, &t.domain, &t.description)
            }
            None => return Err(Status::invalid_argument("no node info")),
        };
        let (id, address, name, domain, description) = (
            id.clone(),
            address.clone(),
            name.clone(),
            domain.clone(),
            description.clone(),
        );
        let what = if kind == Kind::Agent { "Agent" } else { "Tool" };
        if id.is_empty() || id.len() > 256 {
            return Err(gw.refused(Status::invalid_argument(format!(
                "{what} id must be 1 to 256 bytes"
            ))));
        }
        let domain = if domain.is_empty() {
            "default".to_owned()
        } else {
            domain
        };
        if domain.len() > 128 || domain.contains(['/', ' ']) {
            return Err(gw.refused(Status::invalid_argument("domain must be a short name")));
        }
        gw.allow
            .check(&address)
            .map_err(|e| gw.refused(Status::permission_denied(e)))?;
        {
            let nodes = lock(&gw.nodes);
            if nodes.contains_key(&id) {
                return Err(gw.refused(Status::already_exists(format!(
                    "{what} {id} already registered."
                ))));
            }
            if nodes.values().any(|n| n.address == address) {
                return Err(gw.refused(Status::already_exists(format!(
                    "Address {address} already registered."
                ))));
            }
            let mine = nodes
                .values()
                .filter(|n| n.owner == caller.subject())
                .count();
            if mine >= gw.settings.max_nodes_per_principal {
                return Err(gw.refused(Status::resource_exhausted(format!(
                    "principal {} has {mine} nodes registered, the most allowed ([aip] max_nodes_per_principal)",
                    caller.name()
                ))));
            }
        }
        let dial_timeout = AipSettings::ms(gw.settings.dial_timeout_ms);
        let channel = super::dial::connect(&gw.allow, &address, dial_timeout)
            .await
            .map_err(|e| gw.refused(e))?;
        let client = gw
            .ctx
            .open_as(caller.principal.as_ref(), node_options(gw, &id))
            .await
            .map_err(|e| gw.refused(status_of_gateway(&e)))?;
        let scope = format!("aip:{domain}");
        if let Err(status) = gw.ensure_scope(&scope).await {
            let _ = client.close().await;
            return Err(gw.refused(status));
        }
        let role = if kind == Kind::Agent { "agent" } else { "tool" };
        let registration = RegisterParams {
            agent_id: Some(id.as_str().into()),
            name: Some(if name.is_empty() { id.clone() } else { name }),
            description: Some(description).filter(|d| !d.is_empty()),
            role: Some(role.to_owned()),
            scopes: Some(vec![scope.as_str().into()]),
            metadata: Some(RawJson::from(nodes::metadata(&peer))),
            ..Default::default()
        };
        let registered = client.register(registration.clone()).await;
        let agent = match registered {
            Ok(a) => a,
            Err(e) => {
                let _ = client.close().await;
                let s = status_of(&e);
                let s = if s.code() == Code::AlreadyExists {
                    Status::already_exists(format!("{what} {id} already registered."))
                } else {
                    s
                };
                return Err(gw.refused(s));
            }
        };
        let messages = agent.messages();
        let unclaimed = client.messages();
        let node = Node::new(
            kind,
            peer.clone(),
            caller.subject(),
            caller.principal.clone(),
            registration,
            client.clone(),
            agent,
            channel,
        );
        node.set_pump(tokio::spawn(pump::run(
            Arc::downgrade(gw),
            Arc::downgrade(&node),
            messages,
            unclaimed,
        )));
        let raced = {
            let mut nodes = lock(&gw.nodes);
            if nodes.contains_key(&id) || nodes.values().any(|n| n.address == address) {
                true
            } else {
                nodes.insert(id.clone(), Arc::clone(&node));
                false
            }
        };
        if raced {
            let _ = client.unregister(id.as_str()).await;
            let _ = client.close().await;
            return Err(gw.refused(Status::already_exists(format!(
                "{what} {id} already registered."
            ))));
        }
        gw.counters.registrations.fetch_add(1, Ordering::Relaxed);
        gw.publish(NodeUpdate {
            update_type: UpdateType::Added as i32,
            node_id: id.clone(),
            peer: Some(peer),
        });
        tracing::info!(node = %id, kind = role, %address, principal = caller.name(), "AIP node registered");
        Ok(node)
    }

    /// The AIP peers `caller` may see in `domain` (`default`: every domain): a node of this
    /// gateway as registered (its table's `Peer`), any other agent as `nodes::peer_of` shows
    /// it (its own id, address `""`), never as its metadata claims.
    async fn peers(&self, caller: &Caller, domain: &str) -> Result<Vec<Peer>, Status> {
        let session = self.caller_session(caller).await?;
        let agents = session
            .list_agents(Default::default())
            .await
            .map_err(|e| status_of(&e))?;
        Ok(agents
            .iter()
            .filter(|a| !a.state.is_terminal())
            .filter_map(|a| {
                let d = nodes::domain_of(a)?;
                (domain == "default" || d == domain).then(|| match self.gw.node(a.id.as_str()) {
                    Some(node) => node.peer(),
                    None => nodes::peer_of(a, &d),
                })
            })
            .collect())
    }

    fn permit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Status> {
        Arc::clone(&self.gw.permits)
            .try_acquire_owned()
            .map_err(|_| {
                self.gw.refused(Status::resource_exhausted(format!(
                    "{} sessions and subscriptions are open, the most allowed ([aip] max_sessions)",
                    self.gw.settings.max_sessions
                )))
            })
    }
}

/// Records `task` as a MAP task of `client` (created, or its status updated); parents are
/// its dependencies (`meta.dependsOn`). Bookkeeping: a refusal is logged, not fatal.
async fn record_task(client: &Client, receiver: &str, session: &str, task: &TaskInfo) {
    if task.task_id.is_empty() {
        return;
    }
    let status = task_status(task.task_status);
    let created = client
        .call_raw(
            "map/tasks/create",
            json!({ "task": {
                "id": task.task_id,
                "assignee": receiver,
                "title": format!("AIP session {session}"),
                "status": status,
                "meta": { "dependsOn": task.parent_task_ids, "aip": { "sessionId": session } },
            }}),
        )
        .await;
    if created.is_err() {
        let updated = client
            .call_raw(
                "map/tasks/update",
                json!({ "taskId": task.task_id, "status": status }),
            )
            .await;
        if let Err(e) = updated {
            tracing::debug!(task = %task.task_id, error = %e, "AIP task not recorded");
        }
    }
}

/// Forwards one message of a session from `sender`'s agent to `receiver`.
async fn forward(
    gw: &AipGateway,
    sender: &Node,
    receiver: &str,
    conversation: Option<&str>,
    m: &AgentMessage,
    trace: &Map<String, Value>,
) -> Result<(), Status> {
    let status = SessionStatus::try_from(m.session_status)
        .map_err(|_| Status::invalid_argument("unknown session_status"))?;
    if matches!(
        status,
        SessionStatus::HoldResponse | SessionStatus::StopResponse
    ) {
        return Err(Status::invalid_argument(
            "the initiator of a session sends START_QUEST, HOLD_QUEST or STOP_QUEST",
        ));
    }
    if let Some(task) = &m.task_info {
        record_task(&sender.client(), receiver, &m.session_id, task).await;
    }
    let correlation = format!("aip-{}", uuid::Uuid::new_v4().simple());
    let mut meta = trace.clone();
    meta.insert("protocol".into(), json!("aip"));
    meta.insert("aip".into(), message_meta(m));
    meta.insert("correlationId".into(), json!(correlation));
    meta.insert("expectsResponse".into(), json!(true));
    if let Some(c) = conversation {
        meta.insert("mail".into(), json!({ "conversationId": c }));
    }
    gw.note_correlation(&sender.id, &m.session_id, &correlation, status);
    sender
        .client()
        .send_with(SendParams {
            to: RawJson::from(json!({ "agent": receiver })),
            payload: Some(RawJson::from(content::payload(&m.content))),
            meta: Some(RawJson::from(Value::Object(meta))),
        })
        .await
        .map(|_| ())
        .map_err(|e| status_of(&e))
}

#[tonic::async_trait]
impl GatewayService for Service {
    type RouteAgentCallingStream = Stream_<AgentMessage>;
    type SubscribeToUpdatesStream = Stream_<NodeUpdate>;

    async fn route_agent_calling(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::RouteAgentCallingStream>, Status> {
        let gw = Arc::clone(&self.gw);
        let caller = admitted(&request)?;
        let trace = trace_meta(request.metadata());
        let permit = self.permit()?;
        let mut inbound = request.into_inner();
        let wait = AipSettings::ms(gw.settings.first_message_timeout_ms);
        let first = match tokio::time::timeout(wait, inbound.message()).await {
            Err(_) => {
                return Err(gw.refused(Status::deadline_exceeded(format!(
                    "First message must be START_QUEST: none came within {wait:?}"
                ))))
            }
            Ok(Err(status)) => return Err(gw.refused(status)),
            Ok(Ok(None)) => return Err(gw.refused(Status::aborted("Empty request stream"))),
            Ok(Ok(Some(m))) => m,
        };
        let checked = async {
            if first.session_status != SessionStatus::StartQuest as i32 {
                return Err(Status::invalid_argument(
                    "First message must be START_QUEST",
                ));
            }
            if first.session_id.is_empty() {
                return Err(Status::invalid_argument(
                    "Missing session_id in START_QUEST",
                ));
            }
            let sender = self.own_node(&caller, &first.sender_id)?;
            touch(&gw, &sender.id).await;
            if first.receiver_id.is_empty()
                || sender
                    .client()
                    .get_agent(first.receiver_id.as_str())
                    .await
                    .is_err()
            {
                return Err(Status::not_found("Receiver not found"));
            }
            Ok(sender)
        };
        let sender = match checked.await {
            Ok(s) => s,
            Err(status) => return Ok(refuse(inbound, gw.refused(status))),
        };
        let receiver = first.receiver_id.clone();
        let session = first.session_id.clone();
        let (tx, rx) = mpsc::channel(256);
        if !gw.open_outgoing(&sender.id, &session, &receiver, tx.clone(), permit) {
            return Err(gw.refused(Status::already_exists(format!(
                "session {session} is already open"
            ))));
        }
        gw.counters.sessions.fetch_add(1, Ordering::Relaxed);
        let conversation = sender
            .client()
            .call_raw(
                "mail/create",
                json!({
                    "initialParticipants": [{ "id": receiver }],
                    "metadata": { "protocol": "aip", "aip": { "sessionId": session } },
                }),
            )
            .await
            .ok()
            .and_then(|v| {
                v.pointer("/conversation/id")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            });
        tokio::spawn(async move {
            let mut next = Some(first);
            loop {
                let m = match next.take() {
                    Some(m) => m,
                    None => match inbound.message().await {
                        Ok(Some(m)) => m,
                        Ok(None) => break,
                        Err(status) => {
                            gw.deliver_answer(&sender.id, &session, Err(status));
                            break;
                        }
                    },
                };
                if m.sender_id != sender.id || m.session_id != session || m.receiver_id != receiver
                {
                    gw.deliver_answer(
                        &sender.id,
                        &session,
                        Err(Status::invalid_argument(
                            "every message of a session has its first message's sender, receiver and session_id",
                        )),
                    );
                    break;
                }
                if let Err(status) =
                    forward(&gw, &sender, &receiver, conversation.as_deref(), &m, &trace).await
                {
                    gw.deliver_answer(&sender.id, &session, Err(status));
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn route_tool_calling(
        &self,
        request: Request<ToolRequest>,
    ) -> Result<Response<ToolResponse>, Status> {
        let gw = &self.gw;
        let caller = admitted(&request)?;
        let trace = trace_meta(request.metadata());
        let limit = AipSettings::ms(gw.settings.tool_timeout_ms);
        // Shorter than the caller's own deadline, so that the answer is ours
        // (DEADLINE_EXCEEDED), not tonic's timeout (CANCELLED).
        let timeout = grpc_timeout(request.metadata()).map_or(limit, |t| {
            t.saturating_sub(Duration::from_millis(100))
                .max(Duration::from_millis(1))
                .min(limit)
        });
        let req = request.into_inner();
        let arguments = super::proto::arguments(&req.arguments)
            .map_err(|e| gw.refused(Status::invalid_argument(e)))?;
        let client = if gw.node(&req.sender_id).is_some() {
            let node = self.own_node(&caller, &req.sender_id)?;
            touch(gw, &node.id).await;
            node.client()
        } else {
            self.caller_session(&caller).await?
        };
        if req.receiver_id.is_empty() || client.get_agent(req.receiver_id.as_str()).await.is_err() {
            return Err(gw.refused(Status::not_found("Receiver not found")));
        }
        let tool_name = if req.tool_name.is_empty() {
            "unknown"
        } else {
            req.tool_name.as_str()
        };
        let mut meta = trace;
        meta.insert("protocol".into(), json!("aip"));
        meta.insert(
            "aip".into(),
            json!({
                "kind": "tool_call",
                "senderId": req.sender_id,
                "receiverId": req.receiver_id,
                "sessionId": req.session_id,
                "toolName": tool_name,
            }),
        );
        let reply = client
            .request_with(
                req.receiver_id.as_str(),
                json!({ "tool": tool_name, "arguments": arguments, "sessionId": req.session_id }),
                meta,
                timeout,
            )
            .await
            .map_err(|e| match e {
                ClientError::Timeout(t) => gw.refused(Status::deadline_exceeded(format!(
                    "tool {} did not answer within {t:?}",
                    req.receiver_id
                ))),
                other => gw.refused(status_of(&other)),
            })?;
        let payload = reply.payload_value().unwrap_or(Value::Null);
        if let Some(error) = payload.get("error") {
            let code = error
                .pointer("/data/grpcCode")
                .and_then(Value::as_i64)
                .and_then(|c| i32::try_from(c).ok())
                .map_or(Code::Unknown, Code::from_i32);
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("tool call failed");
            return Err(gw.refused(Status::new(code, message.to_owned())));
        }
        let is_error = payload.get("isError").and_then(Value::as_bool) == Some(true);
        let s = |k: &str| payload.get(k).and_then(Value::as_str).map(str::to_owned);
        Ok(Response::new(ToolResponse {
            sender_id: s("senderId").unwrap_or_else(|| req.receiver_id.clone()),
            receiver_id: s("receiverId").unwrap_or_else(|| req.sender_id.clone()),
            session_id: s("sessionId").unwrap_or_else(|| req.session_id.clone()),
            is_error,
            error_message: s("errorMessage").unwrap_or_default(),
            content: content::items(Some(&payload)),
        }))
    }

    async fn register_agent(
        &self,
        request: Request<AgentInfo>,
    ) -> Result<Response<RegisterAgentResponse>, Status> {
        let caller = admitted(&request)?;
        let info = request.into_inner();
        let peer = Peer {
            info_type: Some(InfoType::AgentInfo(info)),
        };
        self.register(&caller, Kind::Agent, peer).await?;
        let peers = self.peers(&caller, "default").await?;
        Ok(Response::new(RegisterAgentResponse {
            success: true,
            peers,
        }))
    }

    async fn register_tool(
        &self,
        request: Request<ToolInfo>,
    ) -> Result<Response<RegisterToolResponse>, Status> {
        let caller = admitted(&request)?;
        let info = request.into_inner();
        let peer = Peer {
            info_type: Some(InfoType::ToolInfo(info)),
        };
        self.register(&caller, Kind::Tool, peer).await?;
        Ok(Response::new(RegisterToolResponse { success: true }))
    }

    async fn deregister_node(
        &self,
        request: Request<DeregisterNodeRequest>,
    ) -> Result<Response<DeregisterNodeResponse>, Status> {
        let caller = admitted(&request)?;
        let id = request.into_inner().node_id;
        let Some(node) = self.gw.node(&id) else {
            return Ok(Response::new(DeregisterNodeResponse { success: false }));
        };
        let admin = self.gw.ctx.auth.is_some() && caller.sees_all;
        if node.owner != caller.subject() && !admin {
            return Err(self.gw.refused(Status::permission_denied(format!(
                "node {id} was registered by another principal"
            ))));
        }
        let success = self.gw.remove(&id).await;
        Ok(Response::new(DeregisterNodeResponse { success }))
    }

    async fn get_nodes(
        &self,
        request: Request<GetNodesRequest>,
    ) -> Result<Response<GetNodesResponse>, Status> {
        let caller = admitted(&request)?;
        let req = request.into_inner();
        if self
            .gw
            .node(&req.agent_id)
            .is_some_and(|n| n.owner == caller.subject())
        {
            touch(&self.gw, &req.agent_id).await;
        }
        let domain = if req.domain.is_empty() {
            "default"
        } else {
            req.domain.as_str()
        };
        let peers = self.peers(&caller, domain).await?;
        Ok(Response::new(GetNodesResponse { peers }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let caller = admitted(&request)?;
        let id = request.into_inner().sender_id;
        if self.gw.node(&id).is_none() {
            return Ok(Response::new(HeartbeatResponse {
                success: false,
                message: format!("Node {id} not registered"),
            }));
        }
        let node = self.own_node(&caller, &id)?;
        touch(&self.gw, &node.id).await;
        Ok(Response::new(HeartbeatResponse {
            success: true,
            message: "Heartbeat received".into(),
        }))
    }

    async fn update_node_info(
        &self,
        request: Request<UpdateNodeInfoRequest>,
    ) -> Result<Response<UpdateNodeInfoResponse>, Status> {
        let caller = admitted(&request)?;
        let req = request.into_inner();
        let node = self.own_node(&caller, &req.sender_id)?;
        let peer = req
            .peer
            .ok_or_else(|| Status::invalid_argument("no peer"))?;
        let old = node.peer();
        let same_kind = matches!(
            (&old.info_type, &peer.info_type),
            (Some(InfoType::AgentInfo(_)), Some(InfoType::AgentInfo(_)))
                | (Some(InfoType::ToolInfo(_)), Some(InfoType::ToolInfo(_)))
        );
        if !same_kind || nodes::peer_id(&peer) != node.id {
            return Err(self.gw.refused(Status::invalid_argument(
                "a node updates its own info only, of its own kind",
            )));
        }
        let domain_address = |p: &Peer| match &p.info_type {
            Some(InfoType::AgentInfo(a)) => (a.domain.clone(), a.address.clone()),
            Some(InfoType::ToolInfo(t)) => (t.domain.clone(), t.address.clone()),
            None => (String::new(), String::new()),
        };
        if domain_address(&peer) != domain_address(&old) {
            return Err(self.gw.refused(Status::failed_precondition(
                "domain and address cannot change: deregister and register again",
            )));
        }
        node.client()
            .update_agent(crate::protocol::methods::agents::UpdateParams {
                agent_id: node.id.as_str().into(),
                state: None,
                environment: None,
                metadata: Some(RawJson::from(nodes::metadata(&peer))),
                permission_overrides: None,
            })
            .await
            .map_err(|e| self.gw.refused(status_of(&e)))?;
        *lock(&node.peer) = peer.clone();
        touch(&self.gw, &node.id).await;
        self.gw.publish(NodeUpdate {
            update_type: UpdateType::Updated as i32,
            node_id: node.id.clone(),
            peer: Some(peer),
        });
        Ok(Response::new(UpdateNodeInfoResponse {
            success: true,
            message: "updated".into(),
        }))
    }

    async fn subscribe_to_updates(
        &self,
        request: Request<UpdateSubscriptionRequest>,
    ) -> Result<Response<Self::SubscribeToUpdatesStream>, Status> {
        let caller = admitted(&request)?;
        let req = request.into_inner();
        if self.gw.node(&req.subscriber_id).is_some() {
            self.own_node(&caller, &req.subscriber_id)?;
        }
        let permit = self.permit()?;
        let session = self.caller_session(&caller).await?;
        let state = Arc::new(Mutex::new(Subscription {
            include: (!req.node_ids.is_empty()).then(|| req.node_ids.iter().cloned().collect()),
            ..Default::default()
        }));
        let key = (caller.subject(), req.subscriber_id.clone());
        {
            let mut subs = lock(&self.subscriptions);
            if let Some(old) = subs.get(&key) {
                lock(old).ended = true;
            }
            subs.insert(key.clone(), Arc::clone(&state));
        }
        let mut updates = self.gw.updates.subscribe();
        let snapshot: Vec<Arc<Node>> = lock(&self.gw.nodes).values().cloned().collect();
        let (tx, rx) = mpsc::channel(64);
        let subscriptions = Arc::clone(&self.subscriptions);
        tokio::spawn(async move {
            let _permit = permit;
            let wanted = |id: &str| {
                let s = lock(&state);
                !s.ended
                    && !s.exclude.contains(id)
                    && s.include.as_ref().is_none_or(|i| i.contains(id))
            };
            let mut seen: HashSet<String> = HashSet::new();
            for node in snapshot {
                if wanted(&node.id) && session.get_agent(node.id.as_str()).await.is_ok() {
                    seen.insert(node.id.clone());
                    let u = NodeUpdate {
                        update_type: UpdateType::Added as i32,
                        node_id: node.id.clone(),
                        peer: Some(node.peer()),
                    };
                    if tx.send(Ok(u)).await.is_err() {
                        return;
                    }
                }
            }
            loop {
                let update = tokio::select! {
                    u = updates.recv() => u,
                    () = tx.closed() => break,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {
                        if lock(&state).ended { break } else { continue }
                    }
                };
                let update = match update {
                    Ok(u) => u,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => break,
                };
                if lock(&state).ended {
                    break;
                }
                if !wanted(&update.node_id) {
                    continue;
                }
                let visible = if update.update_type == UpdateType::Removed as i32 {
                    seen.remove(&update.node_id)
                } else {
                    session.get_agent(update.node_id.as_str()).await.is_ok()
                };
                if !visible {
                    continue;
                }
                seen.insert(update.node_id.clone());
                if tx.send(Ok(update)).await.is_err() {
                    break;
                }
            }
            let mut subs = lock(&subscriptions);
            if subs.get(&key).is_some_and(|s| Arc::ptr_eq(s, &state)) {
                subs.remove(&key);
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn unsubscribe(
        &self,
        request: Request<UnsubscribeRequest>,
    ) -> Result<Response<UnsubscribeResponse>, Status> {
        let caller = admitted(&request)?;
        let req = request.into_inner();
        let key = (caller.subject(), req.subscriber_id.clone());
        let Some(state) = lock(&self.subscriptions).get(&key).cloned() else {
            return Ok(Response::new(UnsubscribeResponse {
                success: false,
                message: format!("no subscription of {}", req.subscriber_id),
            }));
        };
        let mut s = lock(&state);
        if req.node_ids.is_empty() {
            s.ended = true;
        } else {
            for id in req.node_ids {
                if let Some(i) = s.include.as_mut() {
                    i.remove(&id);
                }
                s.exclude.insert(id);
            }
        }
        Ok(Response::new(UnsubscribeResponse {
            success: true,
            message: "unsubscribed".into(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts() {
        let mut m = MetadataMap::new();
        assert_eq!(grpc_timeout(&m), None);
        for (v, d) in [
            ("2S", Duration::from_secs(2)),
            ("150m", Duration::from_millis(150)),
            ("1M", Duration::from_secs(60)),
            ("7u", Duration::from_micros(7)),
        ] {
            m.insert("grpc-timeout", v.parse().unwrap());
            assert_eq!(grpc_timeout(&m), Some(d), "{v}");
        }
        m.insert("grpc-timeout", "x".parse().unwrap());
        assert_eq!(grpc_timeout(&m), None);
    }

    #[test]
    fn task_statuses() {
        assert_eq!(task_status(AipTaskStatus::Create as i32), "open");
        assert_eq!(task_status(AipTaskStatus::Finish as i32), "completed");
        assert_eq!(task_status(99), "open");
    }
}
