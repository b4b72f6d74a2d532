//! A node's MAP inbox, delivered to the node's own gRPC server (dial-back), one task per node.
//!
//! What reaches an AIP node's MAP agent is, in this order:
//! 1. an answer in a session the node started (`meta.aip.sessionStatus` `HOLD_RESPONSE` or
//!    `STOP_RESPONSE`, or `meta.aip.error`; or a MAP reply whose `correlationId` is one of the
//!    session's messages, its status then derived from the request's: `STOP_QUEST` →
//!    `STOP_RESPONSE`, else `HOLD_RESPONSE`): handed to that session's `RouteAgentCalling`
//!    stream when its sender is the session's receiver (the MAP agent its `START_QUEST` was
//!    addressed to). From anyone else it goes no further: the sender gets a reply with MAP's
//!    permission error (`{"error": {"code": 1003, ...}}`; at most 16 a second per node, the
//!    rest unanswered). A MAP reply answers one quest: its
//!    correlation id is forgotten once delivered;
//! 2. for a tool: a call (`{"tool", "arguments"}`; a string payload is `{"input": <it>}`),
//!    made with `ToolService.CallTool` and answered with a MAP reply `{"isError",
//!    "errorMessage", "parts", ...}`, or `{"error": {code, message, data: {grpcCode}}}`;
//! 3. for an agent: a session message (`meta.aip.sessionStatus` a quest), forwarded in order on
//!    the `AgentService.CallAgent` stream of its (sender, session id), opened by its
//!    `START_QUEST`; each answer goes back to the sender as a MAP message with `meta.aip`;
//! 4. for an agent: any other message, a one-message session: `START_QUEST` with its content
//!    and `STOP_QUEST`, and one MAP reply with every answer's parts.
//!
//! Each call of 2. and each session of 3. and 4. holds a slot of `[aip] max_sessions` while it
//! lasts; past it the sender is answered `RESOURCE_EXHAUSTED` (2.: a MAP error reply with
//! `data.grpcCode`; 3.: `meta.aip.error`; 4.: an error reply) and the node sees nothing.
//!
//! The sender the node sees (`sender_id`) is always the MAP sender the router vouches for
//! (`from`), never what `meta` claims. Control messages from the router are not forwarded.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Status};

use super::content;
use super::messages::{message_meta, message_of};
use super::nodes::{string_map, Kind, Node};
use super::proto::agent_message::SessionStatus;
use super::proto::agent_service_client::AgentServiceClient;
use super::proto::tool_service_client::ToolServiceClient;
use super::proto::{AgentMessage, ToolRequest};
use super::settings::AipSettings;
use super::state::{lock, AipGateway};
use crate::client::Messages;
use crate::protocol::json::RawJson;
use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::message::Message;
use crate::protocol::methods::messaging::SendParams;
use crate::protocol::trace::TraceContext;

/// Runs until the node or the gateway is gone, or the inboxes end. `messages` is the agent's
/// inbox; `unclaimed` the session's (what the router delivered before the agent's handle
/// existed, such as what was kept for it while it was offline, flushed as it is reclaimed):
/// the session has no other agent, so both are the node's.
pub async fn run(gw: Weak<AipGateway>, node: Weak<Node>, messages: Messages, unclaimed: Messages) {
    let mut messages = std::pin::pin!(futures::stream::select(
        crate::gateway::trace::traced(messages),
        crate::gateway::trace::traced(unclaimed),
    ));
    while let Some((message, trace)) = messages.next().await {
        let (Some(gw), Some(node)) = (gw.upgrade(), node.upgrade()) else {
            break;
        };
        handle(&gw, &node, message, trace).await;
    }
}

/// A delivered message as `inbound` reads it: the message, its `meta` (parsed) and the trace
/// context the node's gRPC calls carry for it.
#[derive(Clone, Copy)]
struct Incoming<'a> {
    message: &'a Message,
    meta: &'a Value,
    trace: Option<&'a TraceContext>,
}

fn meta_of(message: &Message) -> Value {
    message.meta.as_ref().map_or(Value::Null, RawJson::to_value)
}

fn status_name(aip: Option<&Value>) -> Option<SessionStatus> {
    aip?.get("sessionStatus")?
        .as_str()
        .and_then(SessionStatus::from_str_name)
}

/// `trace` (the delivery's context: the router's span of it, else the message's own valid
/// `meta.traceparent`; `gateway::trace::of_delivery`) as gRPC metadata on `request`.
fn carry_trace<T>(trace: Option<&TraceContext>, request: &mut Request<T>) {
    for (key, value) in crate::gateway::trace::headers(trace) {
        if let Ok(v) = value.parse() {
            request.metadata_mut().insert(key, v);
        }
    }
}

async fn handle(
    gw: &Arc<AipGateway>,
    node: &Arc<Node>,
    message: Message,
    frame: Option<TraceContext>,
) {
    if message.from == "system" {
        return;
    }
    let meta = meta_of(&message);
    let trace = crate::gateway::trace::of_delivery(frame.as_ref(), &message);
    let aip = meta.get("aip");
    let status = status_name(aip);
    let payload = message.payload_value();
    // 1. Answers in a session this node started: from its receiver only.
    if let Some(aip) = aip {
        let session = aip.get("sessionId").and_then(Value::as_str).unwrap_or("");
        let error = aip.get("error");
        let answer = error.is_some()
            || matches!(
                status,
                Some(SessionStatus::HoldResponse | SessionStatus::StopResponse)
            );
        if answer {
            match gw.receiver_of(&node.id, session) {
                Some(receiver) if receiver == message.from => {}
                Some(_) => return refuse_answer(node, &message, session).await,
                None => return,
            }
        }
        if let Some(error) = error {
            let code = error.get("code").and_then(Value::as_i64).unwrap_or(2);
            let text = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("session failed");
            let code = Code::from_i32(i32::try_from(code).unwrap_or(2));
            gw.deliver_answer(&node.id, session, Err(Status::new(code, text.to_owned())));
            return;
        }
        if answer {
            let mut answer = message_of(aip, payload.as_ref());
            answer.sender_id = message.from.clone();
            answer.receiver_id = node.id.clone();
            gw.deliver_answer(&node.id, session, Ok(answer));
            return;
        }
    }
    if message.is_result() {
        let correlation = message.correlation_id();
        let found = correlation.as_deref().and_then(|c| gw.correlation(c));
        if let Some((owner, session, asked)) = found.filter(|(owner, ..)| *owner == node.id) {
            if gw.receiver_of(&owner, &session).as_deref() != Some(message.from.as_str()) {
                return refuse_answer(node, &message, &session).await;
            }
            if let Some(c) = &correlation {
                gw.forget_correlation(c);
            }
            let status = if asked == SessionStatus::StopQuest {
                SessionStatus::StopResponse
            } else {
                SessionStatus::HoldResponse
            };
            let answer = AgentMessage {
                sender_id: message.from.clone(),
                receiver_id: owner.clone(),
                session_id: session.clone(),
                session_status: status as i32,
                task_info: None,
                message_id: message.id.to_string(),
                reply_to_message_id: String::new(),
                content: content::items(payload.as_ref()),
            };
            gw.deliver_answer(&owner, &session, Ok(answer));
        }
        return;
    }
    match node.kind {
        Kind::Tool => {
            tokio::spawn(tool_call(
                Arc::clone(gw),
                Arc::clone(node),
                message,
                meta,
                trace,
            ));
        }
        Kind::Agent => match (aip, status) {
            (
                Some(aip),
                Some(
                    s @ (SessionStatus::StartQuest
                    | SessionStatus::HoldQuest
                    | SessionStatus::StopQuest),
                ),
            ) => {
                let incoming = Incoming {
                    message: &message,
                    meta: &meta,
                    trace: trace.as_ref(),
                };
                inbound(gw, node, incoming, aip, s, payload.as_ref()).await;
            }
            _ => {
                tokio::spawn(one_shot(Arc::clone(gw), Arc::clone(node), message, trace));
            }
        },
    }
}

/// Refuses `message`, an answer to session `session` of `node` from an agent that is not the
/// session's receiver: it goes no further, and its sender gets MAP's permission error (1003)
/// in a reply to it (`correlationId` = its id), at most `nodes::REFUSALS_PER_SECOND` a second
/// per node (sent as the node, so they are its principal's traffic).
async fn refuse_answer(node: &Node, message: &Message, session: &str) {
    if !node.may_refuse() {
        return;
    }
    tracing::warn!(node = %node.id, from = %message.from, session, "an answer from an agent that is not the session's receiver: refused");
    let payload = json!({ "error": {
        "code": ErrorCode::PERMISSION_DENIED.0,
        "message": format!("{} is not the receiver of this session of {}: only the receiver answers it", message.from, node.id),
    }});
    let meta = json!({ "isResult": true, "correlationId": message.id.to_string() });
    let sent = node
        .client()
        .send_with(SendParams {
            to: RawJson::from(json!({ "agent": message.from })),
            payload: Some(RawJson::from(payload)),
            meta: Some(RawJson::from(meta)),
        })
        .await;
    if let Err(e) = sent {
        tracing::debug!(node = %node.id, error = %e, "a refusal could not be sent");
    }
}

/// Answer `payload` with `meta.aip` to `to`, from `node`.
async fn send_back(
    node: &Node,
    to: &str,
    payload: Value,
    aip: Value,
    correlation: Option<&str>,
    conversation: Option<&str>,
) {
    let mut meta = Map::new();
    meta.insert("protocol".into(), json!("aip"));
    meta.insert("aip".into(), aip);
    meta.insert("isResult".into(), json!(true));
    if let Some(c) = correlation {
        meta.insert("correlationId".into(), json!(c));
    }
    if let Some(c) = conversation {
        meta.insert("mail".into(), json!({ "conversationId": c }));
    }
    let sent = node
        .client()
        .send_with(SendParams {
            to: RawJson::from(json!({ "agent": to })),
            payload: Some(RawJson::from(payload)),
            meta: Some(RawJson::from(Value::Object(meta))),
        })
        .await;
    if let Err(e) = sent {
        tracing::warn!(node = %node.id, to, error = %e, "an AIP answer could not be sent");
    }
}

/// Answer `status` as the error of AIP session `session` to `to`, from `node`.
async fn send_error(
    node: &Node,
    to: &str,
    session: &str,
    status: &Status,
    correlation: Option<&str>,
) {
    let aip = json!({ "sessionId": session, "error": { "code": status.code() as i32, "message": status.message() } });
    send_back(node, to, Value::Null, aip, correlation, None).await;
}

#[allow(clippy::too_many_arguments)]
async fn inbound(
    gw: &Arc<AipGateway>,
    node: &Arc<Node>,
    incoming: Incoming<'_>,
    aip: &Value,
    status: SessionStatus,
    payload: Option<&Value>,
) {
    let Incoming {
        message,
        meta,
        trace,
    } = incoming;
    let mut m = message_of(aip, payload);
    m.sender_id = message.from.clone();
    m.receiver_id = node.id.clone();
    let session = m.session_id.clone();
    let key = (message.from.clone(), session.clone());
    let correlation = message.correlation_id();
    let conversation = meta
        .pointer("/mail/conversationId")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let existing = lock(&node.inbound).get(&key).cloned();
    if let Some(tx) = existing {
        if tx.try_send(m).is_err() {
            let s = Status::resource_exhausted("the receiver does not keep up with this session");
            send_error(node, &message.from, &session, &s, correlation.as_deref()).await;
        }
        return;
    }
    if status != SessionStatus::StartQuest || session.is_empty() {
        let s = Status::invalid_argument("First message must be START_QUEST");
        send_error(node, &message.from, &session, &s, correlation.as_deref()).await;
        return;
    }
    let Some(permit) = session_permit(gw) else {
        let s = exhausted(gw);
        send_error(node, &message.from, &session, &s, correlation.as_deref()).await;
        return;
    };
    let (tx, rx) = mpsc::channel(64);
    let _ = tx.try_send(m);
    lock(&node.inbound).insert(key.clone(), tx);
    gw.counters.sessions.fetch_add(1, Ordering::Relaxed);
    let (gw, node, trace) = (Arc::clone(gw), Arc::clone(node), trace.cloned());
    tokio::spawn(async move {
        let _permit = permit;
        let max = gw.settings.max_message_bytes;
        let idle = AipSettings::ms(gw.settings.session_idle_timeout_ms);
        let mut client = agent_client(&node, max);
        let mut request = Request::new(ReceiverStream::new(rx));
        carry_trace(trace.as_ref(), &mut request);
        let (from, _) = &key;
        match tokio::time::timeout(idle, client.call_agent(request)).await {
            Err(_) => {
                let s = Status::deadline_exceeded("the receiver did not answer");
                send_error(&node, from, &session, &s, correlation.as_deref()).await;
            }
            Ok(Err(s)) => {
                send_error(&node, from, &session, &s, correlation.as_deref()).await;
            }
            Ok(Ok(response)) => {
                let mut answers = response.into_inner();
                loop {
                    match tokio::time::timeout(idle, answers.message()).await {
                        Ok(Ok(Some(mut a))) => {
                            a.session_id.clone_from(&session);
                            let stop = a.session_status == SessionStatus::StopResponse as i32;
                            send_back(
                                &node,
                                from,
                                content::payload(&a.content),
                                message_meta(&a),
                                correlation.as_deref(),
                                conversation.as_deref(),
                            )
                            .await;
                            if stop {
                                break;
                            }
                        }
                        Ok(Ok(None)) => break,
                        Ok(Err(s)) => {
                            send_error(&node, from, &session, &s, correlation.as_deref()).await;
                            break;
                        }
                        Err(_) => {
                            let s = Status::deadline_exceeded(format!("no answer within {idle:?}"));
                            send_error(&node, from, &session, &s, correlation.as_deref()).await;
                            break;
                        }
                    }
                }
            }
        }
        lock(&node.inbound).remove(&key);
    });
}

/// Whether `status` is tonic's own timeout (`tonic::TimeoutExpired`, which it turns into
/// CANCELLED with this text) rather than a status the peer sent.
fn is_tonic_timeout(status: &Status) -> bool {
    status.code() == Code::Cancelled && status.message() == tonic::TimeoutExpired(()).to_string()
}

fn error_payload(status: &Status) -> Value {
    let message = if status.message().is_empty() {
        format!("{:?}", status.code())
    } else {
        status.message().to_owned()
    };
    json!({ "error": { "code": 2003, "message": message, "data": { "grpcCode": status.code() as i32 } } })
}

/// A slot of `[aip] max_sessions` (shared by the sessions AIP nodes start, the sessions and
/// calls MAP agents make to AIP nodes, and update subscriptions), if one is free.
fn session_permit(gw: &Arc<AipGateway>) -> Option<tokio::sync::OwnedSemaphorePermit> {
    Arc::clone(&gw.permits).try_acquire_owned().ok()
}

/// The refusal past `[aip] max_sessions`.
fn exhausted(gw: &AipGateway) -> Status {
    gw.refused(Status::resource_exhausted(format!(
        "{} sessions, tool calls and subscriptions are open, the most allowed ([aip] max_sessions)",
        gw.settings.max_sessions
    )))
}

async fn tool_call(
    gw: Arc<AipGateway>,
    node: Arc<Node>,
    message: Message,
    meta: Value,
    trace: Option<TraceContext>,
) {
    let Some(_permit) = session_permit(&gw) else {
        let answer = error_payload(&exhausted(&gw));
        if let Err(e) = node.client().reply(&message, answer).await {
            tracing::warn!(node = %node.id, error = %e, "a refusal could not be sent");
        }
        return;
    };
    let payload = message.payload_value().unwrap_or(Value::Null);
    let aip = meta.get("aip");
    let tool_name = payload
        .get("tool")
        .and_then(Value::as_str)
        .or_else(|| aip.and_then(|a| a.get("toolName")).and_then(Value::as_str))
        .unwrap_or("unknown")
        .to_owned();
    let arguments: BTreeMap<String, String> = match &payload {
        Value::String(s) => [("input".to_owned(), s.clone())].into(),
        v => string_map(v.get("arguments")),
    };
    let session_id = payload
        .get("sessionId")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map_or_else(
            || format!("tool_session_{}", uuid::Uuid::new_v4().simple()),
            str::to_owned,
        );
    let max = gw.settings.max_message_bytes;
    let mut client = ToolServiceClient::new(node.channel.clone())
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let mut request = Request::new(ToolRequest {
        sender_id: message.from.clone(),
        receiver_id: node.id.clone(),
        session_id,
        tool_name,
        arguments: super::proto::encode_arguments(&arguments),
    });
    let timeout = AipSettings::ms(gw.settings.tool_timeout_ms);
    request.set_timeout(timeout);
    carry_trace(trace.as_ref(), &mut request);
    gw.counters.tool_calls.fetch_add(1, Ordering::Relaxed);
    let answer =
        match tokio::time::timeout(timeout + Duration::from_secs(1), client.call_tool(request))
            .await
        {
            Ok(Ok(r)) => {
                let r = r.into_inner();
                json!({
                    "isError": r.is_error,
                    "errorMessage": r.error_message,
                    "senderId": r.sender_id,
                    "receiverId": r.receiver_id,
                    "sessionId": r.session_id,
                    "parts": content::parts(&r.content),
                })
            }
            Ok(Err(status)) if !is_tonic_timeout(&status) => error_payload(&status),
            // Our timer, or tonic's on the call's `grpc-timeout` (it ends the call with
            // CANCELLED "Timeout expired"): the two race, and either is the tool's deadline, so
            // the caller sees DEADLINE_EXCEEDED whichever won.
            Ok(Err(_)) | Err(_) => error_payload(&Status::deadline_exceeded(format!(
                "the tool did not answer within {timeout:?}"
            ))),
        };
    if let Err(e) = node.client().reply(&message, answer).await {
        tracing::warn!(node = %node.id, error = %e, "a tool answer could not be sent");
    }
}

async fn one_shot(
    gw: Arc<AipGateway>,
    node: Arc<Node>,
    message: Message,
    trace: Option<TraceContext>,
) {
    let Some(_permit) = session_permit(&gw) else {
        let _ = node
            .client()
            .reply(&message, error_payload(&exhausted(&gw)))
            .await;
        return;
    };
    gw.counters.sessions.fetch_add(1, Ordering::Relaxed);
    let session = format!("map_session_{}", uuid::Uuid::new_v4().simple());
    let quest = |status: SessionStatus, id: String, items| AgentMessage {
        sender_id: message.from.clone(),
        receiver_id: node.id.clone(),
        session_id: session.clone(),
        session_status: status as i32,
        task_info: None,
        message_id: id,
        reply_to_message_id: String::new(),
        content: items,
    };
    let (tx, rx) = mpsc::channel(2);
    let _ = tx.try_send(quest(
        SessionStatus::StartQuest,
        message.id.to_string(),
        content::items(message.payload_value().as_ref()),
    ));
    let _ = tx.try_send(quest(
        SessionStatus::StopQuest,
        format!("{}-stop", message.id),
        Vec::new(),
    ));
    drop(tx);
    let max = gw.settings.max_message_bytes;
    let idle = AipSettings::ms(gw.settings.session_idle_timeout_ms);
    let mut client = agent_client(&node, max);
    let mut request = Request::new(ReceiverStream::new(rx));
    carry_trace(trace.as_ref(), &mut request);
    let collected = tokio::time::timeout(idle, async {
        let mut answers = client.call_agent(request).await?.into_inner();
        let mut parts = Vec::new();
        let mut statuses = Vec::new();
        while let Some(a) = answers.message().await? {
            parts.extend(content::parts(&a.content));
            let s =
                SessionStatus::try_from(a.session_status).unwrap_or(SessionStatus::HoldResponse);
            statuses.push(s.as_str_name());
            if s == SessionStatus::StopResponse {
                break;
            }
        }
        Ok::<_, Status>(
            json!({ "parts": parts, "aip": { "sessionId": session, "statuses": statuses } }),
        )
    })
    .await;
    let answer = match collected {
        Ok(Ok(v)) => v,
        Ok(Err(s)) => error_payload(&s),
        Err(_) => error_payload(&Status::deadline_exceeded(format!(
            "no answer within {idle:?}"
        ))),
    };
    if let Err(e) = node.client().reply(&message, answer).await {
        tracing::warn!(node = %node.id, error = %e, "an AIP agent's answer could not be sent");
    }
}

/// The AIP agent client of `node`, with messages up to `max` bytes both ways.
fn agent_client(node: &Node, max: usize) -> AgentServiceClient<tonic::transport::Channel> {
    AgentServiceClient::new(node.channel.clone())
        .max_decoding_message_size(max)
        .max_encoding_message_size(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// tonic's own deadline is recognised (and becomes DEADLINE_EXCEEDED for callers); a
    /// CANCELLED the peer sent is passed on as it is.
    #[test]
    fn tonic_timeouts_are_told_from_a_peers_cancel() {
        let ours = Status::from_error(Box::new(tonic::TimeoutExpired(())));
        assert_eq!(ours.code(), Code::Cancelled);
        assert!(is_tonic_timeout(&ours));
        assert!(!is_tonic_timeout(&Status::cancelled("the user gave up")));
        assert!(!is_tonic_timeout(&Status::deadline_exceeded(
            "Timeout expired"
        )));
    }
}
