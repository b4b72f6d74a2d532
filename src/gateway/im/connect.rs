//! `WS /gateway/connect`: one IM agent's connection (seed 002, "Agent 注册和发现").
//!
//! Frames in: `{"type":"register","agent_uri","capabilities"}` (first), `{"type":"heartbeat"}`,
//! and `{"type":"send","to","content","conversation_id?","traceparent?","tracestate?"}` (an
//! extension: send without a second connection; a valid `traceparent` becomes the MAP
//! message's `meta.traceparent`, `gateway::trace`). Frames out: `{"type":"registered","agent_uri"}`, `{"type":"heartbeat_ack"}`,
//! `{"type":"message","from","to","content","conversation_id","message_id","timestamp"}` for
//! every MAP message to the agent, `{"type":"sent",...}` and `{"type":"error","error","message"}`.
//! A wrong frame gets an error frame and the connection stays open.
//!
//! The connection is one in-process MAP session of the caller's principal (its credential came
//! with the upgrade: `Authorization: Bearer` or `?token=`, `caller.rs`) owning one MAP agent
//! (id = `agent_uri`), so its grants (`lifecycle.canRegister`, `messaging.canSend`), quotas and
//! ids apply as over MAP. A URI that is not the caller's to take is refused with an error frame
//! `forbidden` and close 4003 (docs/gateways.md, "Who may register which URI"); a quota with
//! `quota_exceeded` and close 4029. A credential that expires (a JWT's `exp`, plus the
//! configured leeway) ends the connection as it ends a MAP session: close 4001 "credential
//! expired". Any frame counts as a sign of life; after
//! `heartbeat_timeout_ms` without one the connection is closed (4008 "heartbeat timeout") and
//! so is the MAP session, so the router reports the agent offline.
//!
//! Hostile peers (docs/security.md, "Hostile input"): the upgrade takes one request from the
//! caller's rate budget and a slot of `gateways.im.max_connections` (and of the caller's own
//! `max_connections_per_caller`), refused before upgrading (503 / 429); each frame takes one
//! request from the same budget (over it: an error frame `rate_limited` with
//! `retry_after_ms`, and the socket is not read until then); a frame above `max_frame_bytes`
//! closes with 1009, text that is not UTF-8 with 1007; a peer that stops reading (a write, or
//! room in its bounded queue, not coming within `write_timeout_ms`, or a ping unanswered that
//! long) is dropped with 1008 (`socket.rs`). Every end of the connection is the same: the IM
//! agent goes offline (orphaned, reclaimable by its principal's next `register`).
//!
//! Owns nothing beyond the connection's lifetime.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures::stream::SplitStream;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::client::{Client, ClientOptions, Messages};
use crate::gateway::caller::Caller;
use crate::gateway::context::{resolve, GatewayContext};
use crate::gateway::im::sender::{Im, Sending};
use crate::gateway::im::socket::{close_for, Outbound, CLOSE_INTERNAL, CLOSE_POLICY};
use crate::gateway::wire::{iso8601, AgentUri, Failure, GatewayError};
use crate::protocol::ids::AgentId;
use crate::protocol::json::RawJson;
use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::message::Message;
use crate::protocol::methods::agents::RegisterParams;
use crate::transport::admission::PeerInfo;

/// Close code of a connection whose heartbeats stopped.
const CLOSE_HEARTBEAT_TIMEOUT: u16 = 4008;
/// Close code of a connection that never registered, or whose agent URI is in use.
const CLOSE_NOT_REGISTERED: u16 = 4001;
/// Close code of a registration the caller may not make (HTTP's 403).
const CLOSE_FORBIDDEN: u16 = 4003;
/// Close code of a registration refused by a quota (HTTP's 429).
const CLOSE_QUOTA: u16 = 4029;
/// Close code of a connection whose credential expired (the router's own, for MAP sessions).
const CLOSE_CREDENTIAL_EXPIRED: u16 = 4001;

/// The upgrade; the caller was admitted and its rate budget charged before it (the IM gate,
/// `guard.rs`), so a connection without a valid credential never opens.
///
/// Before upgrading: a slot among the live IM connections (all, and the caller's own). The listener's `PeerInfo` (its admission slot) is
/// kept for the socket's life, as MAP's WebSocket keeps it.
pub async fn upgrade(
    State(im): State<Arc<Im>>,
    Extension(caller): Extension<Caller>,
    peer: Option<Extension<PeerInfo>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let settings = &im.ctx.settings.im;
    let admitted = match im.table.admit(
        im.ctx.caller_key(&caller),
        settings.max_connections,
        settings.max_connections_per_caller,
    ) {
        Ok(a) => a,
        Err(f) => return f.response(),
    };
    let max = settings.max_frame_bytes;
    ws.max_message_size(max)
        .max_frame_size(max)
        .read_buffer_size(READ_BUFFER_BYTES)
        .on_upgrade(move |socket| async move {
            serve(im, caller, headers, socket).await;
            drop(admitted);
            drop(peer);
        })
        .into_response()
}

/// Initial read buffer of an IM WebSocket (the library's default, 128 KiB allocated up front,
/// was most of an idle connection's memory; it still grows for a larger frame).
const READ_BUFFER_BYTES: usize = 4 * 1024;

#[derive(Deserialize)]
struct Frame {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    agent_uri: Option<String>,
    #[serde(default)]
    capabilities: Option<Value>,
    #[serde(default)]
    to: Option<String>,
    #[serde(default)]
    content: Option<Box<RawValue>>,
    #[serde(default)]
    conversation_id: Option<String>,
    /// A `send` frame's W3C trace context (the connection is not one request: its upgrade's
    /// headers are not a message's context). Invalid: ignored.
    #[serde(default)]
    traceparent: Option<Value>,
    #[serde(default)]
    tracestate: Option<Value>,
}

/// A pushed `message` frame; `content` is the MAP payload as sent.
#[derive(Serialize)]
struct Pushed<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    from: &'a str,
    to: &'a str,
    content: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    conversation_id: Option<&'a str>,
    message_id: &'a str,
    timestamp: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    protocol: Option<&'a str>,
}

fn error_frame(error: &str, message: &str) -> Value {
    json!({"type": "error", "error": error, "message": message})
}

/// How a connection ended: the close code and reason to send, if any.
struct End(Option<u16>, String);

impl End {
    fn with(code: u16, reason: impl Into<String>) -> Self {
        Self(Some(code), reason.into())
    }

    fn silent() -> Self {
        Self(None, String::new())
    }
}

type Incoming = SplitStream<WebSocket>;

/// A registered IM agent's session.
struct Registered {
    uri: String,
    client: Client,
    messages: Messages,
    /// Its number in the IM table.
    conn: u64,
    /// Kept so that the agent's messages keep reaching `messages`.
    _agent: crate::client::AgentHandle,
}

async fn serve(im: Arc<Im>, caller: Caller, headers: HeaderMap, socket: WebSocket) {
    let settings = im.ctx.settings.im.clone();
    let (sink, mut stream) = socket.split();
    let out = Outbound::start(sink, settings.send_queue, settings.write_timeout());
    let reg = match register(&im, &caller, &headers, &mut stream, &out).await {
        Ok(reg) => reg,
        Err(end) => {
            out.close(end.0, &end.1).await;
            return;
        }
    };
    let Registered {
        uri,
        client,
        mut messages,
        conn,
        _agent,
    } = reg;
    let end = match im.ctx.service().await {
        Ok(s) => {
            let directory = Arc::clone(&s.directory);
            let end = live(
                &im,
                &caller,
                &headers,
                &mut stream,
                &out,
                &uri,
                &client,
                &mut messages,
                &directory,
            )
            .await;
            directory.disconnected(&uri);
            end
        }
        Err(_) => End::with(CLOSE_INTERNAL, "gateway unavailable"),
    };
    im.table.disconnected(&uri, conn);
    // A lost transport for the router: the agent goes offline (orphaned, reclaimable by the
    // next registration of the same principal under the same URI).
    let _ = client.close().await;
    out.close(end.0, &end.1).await;
}

/// Serves a registered connection until it ends; how it ended.
#[allow(clippy::too_many_arguments)]
async fn live(
    im: &Arc<Im>,
    caller: &Caller,
    headers: &HeaderMap,
    stream: &mut Incoming,
    out: &Outbound,
    uri: &str,
    client: &Client,
    messages: &mut Messages,
    directory: &crate::gateway::directory::Directory,
) -> End {
    let settings = &im.ctx.settings.im;
    let timeout = settings.heartbeat_timeout();
    let write_timeout = settings.write_timeout();
    let max = settings.max_frame_bytes;
    let mut deadline = Instant::now() + timeout;
    let expiry = expiry_of(&im.ctx, caller);
    let expired = async move {
        match expiry {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expired);
    let mut ping = settings.ping_interval().map(|p| {
        let mut i = tokio::time::interval_at(Instant::now() + p, p);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    // When a ping went out that nothing has answered yet.
    let mut unanswered: Option<Instant> = None;
    let not_reading = || {
        End::with(
            CLOSE_POLICY,
            format!(
                "not reading: nothing written could be delivered within {} ms",
                write_timeout.as_millis()
            ),
        )
    };
    loop {
        let pong_deadline = unanswered.map(|at| at + write_timeout);
        tokio::select! {
            biased;
            () = out.dead() => return not_reading(),
            () = &mut expired => return End::with(CLOSE_CREDENTIAL_EXPIRED, "credential expired"),
            () = sleep_until_opt(pong_deadline) => {
                return End::with(
                    CLOSE_POLICY,
                    format!("not reading: no pong within {} ms of a ping", write_timeout.as_millis()),
                );
            }
            () = tokio::time::sleep_until(deadline) => {
                return End::with(CLOSE_HEARTBEAT_TIMEOUT, "heartbeat timeout");
            }
            () = tick(&mut ping) => {
                if unanswered.is_none() {
                    if out.send(WsMessage::Ping(Default::default())).await.is_err() {
                        return not_reading();
                    }
                    unanswered = Some(Instant::now());
                }
            }
            frame = stream.next() => {
                let text = match frame {
                    Some(Ok(WsMessage::Text(t))) => Some(t),
                    Some(Ok(WsMessage::Binary(_))) => None,
                    // Only a pong proves the peer reads: one that sends but never reads still
                    // sends frames.
                    Some(Ok(WsMessage::Pong(_))) => {
                        unanswered = None;
                        continue;
                    }
                    Some(Ok(WsMessage::Ping(_))) => continue,
                    Some(Ok(WsMessage::Close(_))) | None => return End::silent(),
                    Some(Err(e)) => {
                        return match close_for(&e, max) {
                            Some((code, reason)) => End::with(code, reason),
                            None => End::silent(),
                        };
                    }
                };
                deadline = Instant::now() + timeout;
                directory.heard(uri);
                if let Err(f) = im.ctx.check_rate(caller) {
                    if out.json(&f.frame()).await.is_err() {
                        return not_reading();
                    }
                    // Not read again until the budget has room: a flood slows itself down.
                    if let Some(after) = f.retry_after {
                        tokio::time::sleep(after.min(Duration::from_secs(1))).await;
                    }
                    continue;
                }
                let reply = match text {
                    Some(t) => handle_frame(im, client, headers, uri, t.as_str()).await,
                    None => Some(error_frame(
                        "unsupported_frame",
                        "binary frames are not supported: send JSON text",
                    )),
                };
                if let Some(reply) = reply {
                    if out.json(&reply).await.is_err() {
                        return not_reading();
                    }
                }
            }
            message = messages.next() => {
                let Some(message) = message else {
                    return End::with(CLOSE_INTERNAL, "MAP session ended");
                };
                if out.send(push_frame(&im.ctx, uri, &message)).await.is_err() {
                    return not_reading();
                }
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn tick(ping: &mut Option<tokio::time::Interval>) {
    match ping {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// When the caller's credential stops being accepted: its expiry plus the authenticator's
/// leeway, as the router reckons a MAP session's (`None`: it does not expire).
fn expiry_of(ctx: &GatewayContext, caller: &Caller) -> Option<Instant> {
    let at = caller.principal.as_ref()?.expires_at?;
    let leeway = ctx.auth.as_ref().map_or(Duration::ZERO, |a| a.leeway());
    let left = Duration::from_millis(at.saturating_sub(crate::gateway::wire::now_ms()));
    Some(Instant::now() + left + leeway)
}

/// Sends `failure` as an error frame; the connection is then closed with `code`.
async fn refuse(out: &Outbound, failure: &Failure, code: u16) -> End {
    let _ = out.json(&failure.frame()).await;
    End::with(code, failure.error)
}

/// The close code for a failed registration.
fn close_code(failure: &Failure) -> u16 {
    match failure.error {
        "forbidden" => CLOSE_FORBIDDEN,
        "quota_exceeded" | "rate_limited" => CLOSE_QUOTA,
        "gateway_unavailable" => CLOSE_INTERNAL,
        _ => CLOSE_NOT_REGISTERED,
    }
}

/// Whether `uri` (canonical) may be registered by `caller` before anything is opened: not a
/// configured remote agent's, not one of our agents' (`agent://<our host>/<an agent's id or
/// name>`: known to the read model, or visible to the caller), not another caller's IM URI or
/// outside sender. The router checks the rest (the grant, its own record of who owns the agent
/// id). No lookup goes through a session shared with other callers: the read model, then the
/// caller's own session.
async fn may_register(
    im: &Im,
    caller: &Caller,
    headers: &HeaderMap,
    directory: &crate::gateway::directory::Directory,
    uri: &str,
) -> Result<(), Failure> {
    let not_free = || {
        Failure::forbidden(format!(
            "{uri} is not yours to register: an agent of this router, a configured remote \
             agent or another principal holds it; register a URI of your own"
        ))
    };
    let ctx = &im.ctx;
    if ctx.settings.mamp.remote.iter().any(|r| r.uri == uri) {
        return Err(not_free());
    }
    if let Some(id) = ctx.local_id(uri, headers) {
        if directory.knows_agent(&id) {
            return Err(not_free());
        }
        let session = ctx.caller_session(caller).await?;
        if resolve(&session, &id).await?.is_some() {
            return Err(not_free());
        }
    }
    if im.table.owner(uri).is_some_and(|o| o != caller.subject()) {
        return Err(not_free());
    }
    Ok(())
}

/// The next frame before registration (bounded by `deadline`): `Ok(Some(text))`, `Ok(None)`
/// for a frame answered here (binary, ping), `Err` when the connection ends.
async fn next_text(
    stream: &mut Incoming,
    out: &Outbound,
    deadline: Instant,
    max: usize,
) -> Result<Option<String>, End> {
    match tokio::time::timeout_at(deadline, stream.next()).await {
        Err(_) => Err(End::with(CLOSE_NOT_REGISTERED, "no register frame")),
        Ok(Some(Ok(WsMessage::Text(t)))) => Ok(Some(t.as_str().to_owned())),
        Ok(Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_)))) => Ok(None),
        Ok(Some(Ok(WsMessage::Binary(_)))) => {
            let e = error_frame("unsupported_frame", "binary frames are not supported");
            out.json(&e).await.map_err(|_| End::silent())?;
            Ok(None)
        }
        Ok(Some(Err(e))) => Err(match close_for(&e, max) {
            Some((code, reason)) => End::with(code, reason),
            None => End::silent(),
        }),
        Ok(Some(Ok(WsMessage::Close(_))) | None) => Err(End::silent()),
    }
}

/// Waits (bounded) for a valid `register` frame and opens the agent's MAP session.
async fn register(
    im: &Arc<Im>,
    caller: &Caller,
    headers: &HeaderMap,
    stream: &mut Incoming,
    out: &Outbound,
) -> Result<Registered, End> {
    let deadline = Instant::now() + im.ctx.settings.im.register_timeout();
    let max = im.ctx.settings.im.max_frame_bytes;
    let say = |v: Value| async move { out.json(&v).await.map_err(|_| End::silent()) };
    loop {
        let Some(text) = next_text(stream, out, deadline, max).await? else {
            continue;
        };
        if let Err(f) = im.ctx.check_rate(caller) {
            say(f.frame()).await?;
            if let Some(after) = f.retry_after {
                tokio::time::sleep(after.min(Duration::from_secs(1))).await;
            }
            continue;
        }
        let parsed = crate::protocol::json::refuse_lone_surrogate(text.as_bytes())
            .and_then(|()| serde_json::from_str::<Frame>(&text).map_err(|e| e.to_string()));
        let frame: Frame = match parsed {
            Ok(f) => f,
            Err(e) => {
                say(error_frame(
                    "invalid_frame",
                    &format!("not a gateway frame: {e}"),
                ))
                .await?;
                continue;
            }
        };
        if frame.kind != "register" {
            say(error_frame(
                "not_registered",
                "send {\"type\":\"register\",\"agent_uri\",\"capabilities\"} first",
            ))
            .await?;
            continue;
        }
        let Some(given) = frame.agent_uri.filter(|u| AgentUri::parse(u).is_some()) else {
            say(error_frame(
                "invalid_agent_uri",
                "agent_uri must be agent://HOST/ID",
            ))
            .await?;
            continue;
        };
        // One URI per agent: a URI of our host in any of its forms is registered canonical.
        let uri = im.ctx.canonical(&given, headers);
        let capabilities = frame.capabilities.unwrap_or(Value::Array(Vec::new()));
        let service = match im.ctx.service().await {
            Ok(s) => s.clone(),
            Err(e) => return Err(refuse(out, &Failure::from(e), CLOSE_INTERNAL).await),
        };
        if let Err(f) = may_register(im, caller, headers, &service.directory, &uri).await {
            let code = close_code(&f);
            return Err(refuse(out, &f, code).await);
        }
        if service.directory.is_live(&uri) {
            let f = Failure::new(
                axum::http::StatusCode::CONFLICT,
                "agent_uri_in_use",
                format!("{uri} is connected on another socket"),
            );
            return Err(refuse(out, &f, CLOSE_NOT_REGISTERED).await);
        }
        // A session of the caller's may hold the URI as an outside sender: end it, so that
        // the agent id is free for the connection's own session. Anybody else's is refused.
        match im.ctx.peers.take(&uri, &caller.subject()) {
            Ok(Some(peer)) => {
                let _ = peer.client.disconnect().await;
            }
            Ok(None) => {}
            Err(e) => return Err(refuse(out, &Failure::from(e), CLOSE_FORBIDDEN).await),
        }
        // Registering the URI again reclaims its MAP agent when it waits orphaned for this
        // principal (its queued messages come with it, before the answer), never unregister
        // + register: nothing queued for it is lost.
        let opened = async {
            let client = im
                .ctx
                .open_as(
                    caller.principal.as_ref(),
                    ClientOptions::agent().name(uri.clone()),
                )
                .await?;
            let registered = client
                .register(RegisterParams {
                    agent_id: Some(AgentId::from(uri.as_str())),
                    name: Some(uri.clone()),
                    role: Some("im-agent".into()),
                    metadata: Some(RawJson::from(json!({
                        "gateway": "im",
                        "agentUri": uri,
                        "capabilities": capabilities,
                    }))),
                    ..RegisterParams::default()
                })
                .await;
            match registered {
                Ok(agent) => Ok((client, agent)),
                Err(e) => {
                    let _ = client.disconnect().await;
                    Err(GatewayError::Map(e))
                }
            }
        }
        .await;
        let (client, agent) = match opened {
            Ok(x) => x,
            Err(e) => {
                let failure = match e.rpc_code().map(ErrorCode) {
                    Some(ErrorCode::AGENT_EXISTS) => Failure::new(
                        axum::http::StatusCode::CONFLICT,
                        "agent_uri_in_use",
                        format!("{uri} is registered by another session"),
                    ),
                    _ => Failure::from(&e),
                };
                let code = close_code(&failure);
                return Err(refuse(out, &failure, code).await);
            }
        };
        let messages = agent.messages();
        service.directory.connected(&uri, capabilities);
        let conn = im.table.connected(&uri, client.clone(), caller.subject());
        let ok = json!({"type": "registered", "agent_uri": uri, "agent_id": agent.id()});
        if out.json(&ok).await.is_err() {
            im.table.disconnected(&uri, conn);
            service.directory.disconnected(&uri);
            let _ = client.close().await;
            return Err(End::silent());
        }
        return Ok(Registered {
            uri,
            client,
            messages,
            conn,
            _agent: agent,
        });
    }
}

/// The answer to one frame after registration, if any.
async fn handle_frame(
    im: &Arc<Im>,
    client: &Client,
    headers: &HeaderMap,
    uri: &str,
    text: &str,
) -> Option<Value> {
    let parsed = crate::protocol::json::refuse_lone_surrogate(text.as_bytes())
        .and_then(|()| serde_json::from_str::<Frame>(text).map_err(|e| e.to_string()));
    let frame: Frame = match parsed {
        Ok(f) => f,
        Err(e) => {
            return Some(error_frame(
                "invalid_frame",
                &format!("not a gateway frame: {e}"),
            ))
        }
    };
    match frame.kind.as_str() {
        "heartbeat" => Some(
            json!({"type": "heartbeat_ack", "timestamp": iso8601(crate::gateway::wire::now_ms())}),
        ),
        "register" => Some(error_frame(
            "already_registered",
            &format!("this connection is {uri}"),
        )),
        "send" => {
            let (Some(to), Some(content)) = (frame.to, frame.content) else {
                return Some(error_frame(
                    "invalid_frame",
                    "send needs `to` and `content`",
                ));
            };
            let trace = frame
                .traceparent
                .as_ref()
                .and_then(Value::as_str)
                .and_then(|p| {
                    crate::protocol::trace::TraceContext::new(
                        p,
                        frame.tracestate.as_ref().and_then(Value::as_str),
                    )
                });
            match im
                .deliver(
                    client,
                    uri,
                    headers,
                    Sending {
                        to: &to,
                        content: &content,
                        conversation: frame.conversation_id.as_deref(),
                        trace: trace.as_ref(),
                    },
                )
                .await
            {
                Ok((conversation_id, message_id)) => Some(
                    json!({"type": "sent", "conversation_id": conversation_id, "message_id": message_id}),
                ),
                Err(f) => Some(f.frame()),
            }
        }
        other => Some(error_frame(
            "unknown_frame_type",
            &format!("unknown frame type `{other}` (expected heartbeat or send)"),
        )),
    }
}

/// A MAP message as a pushed `message` frame.
fn push_frame(ctx: &GatewayContext, uri: &str, message: &Message) -> WsMessage {
    let meta = message.meta.as_ref().map(RawJson::to_value);
    // Its conversation: its own `meta.mail`, else that of the message it answers.
    let conversation = ctx.threads.conversation_of(message);
    let conversation = conversation.as_deref();
    let protocol = meta
        .as_ref()
        .and_then(|m| m.get("protocol"))
        .and_then(Value::as_str);
    let null = RawJson::null();
    let content = message.payload.as_ref().unwrap_or(&null);
    let from = ctx.uri_of(&message.from);
    let frame = Pushed {
        kind: "message",
        from: &from,
        to: uri,
        content: content.as_raw(),
        conversation_id: conversation,
        message_id: message.id.as_str(),
        timestamp: iso8601(message.timestamp),
        protocol,
    };
    let text = serde_json::to_string(&frame).unwrap_or_else(|e| {
        json!({"type": "error", "error": "encode", "message": e.to_string()}).to_string()
    });
    WsMessage::Text(text.into())
}
