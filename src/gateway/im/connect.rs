//! `WS /gateway/connect`: one IM agent's connection (seed 002, "Agent 注册和发现").
//!
//! Frames in: `{"type":"register","agent_uri","capabilities"}` (first), `{"type":"heartbeat"}`,
//! and `{"type":"send","to","content","conversation_id?"}` (an extension: send without a
//! second connection). Frames out: `{"type":"registered","agent_uri"}`, `{"type":"heartbeat_ack"}`,
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
//! so is the MAP session, so the router reports the agent offline. Owns nothing beyond the
//! connection's lifetime.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::client::{Client, ClientOptions, Messages};
use crate::gateway::caller::Caller;
use crate::gateway::context::{resolve, GatewayContext};
use crate::gateway::im::sender::Im;
use crate::gateway::wire::{iso8601, AgentUri, Failure, GatewayError};
use crate::protocol::ids::AgentId;
use crate::protocol::json::RawJson;
use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::message::Message;
use crate::protocol::methods::agents::RegisterParams;

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

/// The upgrade; the caller was authenticated before it (`caller.rs`), so a connection without
/// a valid credential never opens.
pub async fn upgrade(
    State(im): State<Arc<Im>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let max = im.ctx.settings.im.max_frame_bytes;
    ws.max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| serve(im, caller, headers, socket))
        .into_response()
}

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

fn error_frame(error: &str, message: &str) -> WsMessage {
    WsMessage::Text(
        json!({"type": "error", "error": error, "message": message})
            .to_string()
            .into(),
    )
}

async fn close(socket: &mut WebSocket, code: u16, reason: &str) {
    let _ = socket
        .send(WsMessage::Close(Some(CloseFrame {
            code,
            reason: reason.to_owned().into(),
        })))
        .await;
}

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

async fn serve(im: Arc<Im>, caller: Caller, headers: HeaderMap, mut socket: WebSocket) {
    let Some(reg) = register(&im, &caller, &headers, &mut socket).await else {
        return;
    };
    let Registered {
        uri,
        client,
        mut messages,
        conn,
        _agent,
    } = reg;
    let timeout = im.ctx.settings.im.heartbeat_timeout();
    let directory = match im.ctx.service().await {
        Ok(s) => Arc::clone(&s.directory),
        Err(_) => return,
    };
    let mut deadline = Instant::now() + timeout;
    let expiry = expiry_of(&im.ctx, &caller);
    let expired = async move {
        match expiry {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expired);
    loop {
        tokio::select! {
            frame = socket.recv() => {
                let text = match frame {
                    Some(Ok(WsMessage::Text(t))) => t,
                    Some(Ok(WsMessage::Binary(_))) => {
                        deadline = Instant::now() + timeout;
                        directory.heard(&uri);
                        let _ = socket.send(error_frame("unsupported_frame", "binary frames are not supported: send JSON text")).await;
                        continue;
                    }
                    Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_))) => continue,
                    Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => break,
                };
                deadline = Instant::now() + timeout;
                directory.heard(&uri);
                let reply = handle_frame(&im, &client, &headers, &uri, text.as_str()).await;
                if let Some(reply) = reply {
                    if socket.send(reply).await.is_err() {
                        break;
                    }
                }
            }
            message = messages.next() => {
                let Some(message) = message else {
                    close(&mut socket, 1011, "MAP session ended").await;
                    break;
                };
                if socket.send(push_frame(&im.ctx, &uri, &message)).await.is_err() {
                    break;
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                close(&mut socket, CLOSE_HEARTBEAT_TIMEOUT, "heartbeat timeout").await;
                break;
            }
            () = &mut expired => {
                close(&mut socket, CLOSE_CREDENTIAL_EXPIRED, "credential expired").await;
                break;
            }
        }
    }
    im.table.disconnected(&uri, conn);
    directory.disconnected(&uri);
    // A lost transport for the router: the agent goes offline (orphaned, reclaimable by the
    // next registration of the same principal under the same URI).
    let _ = client.close().await;
}

/// When the caller's credential stops being accepted: its expiry plus the authenticator's
/// leeway, as the router reckons a MAP session's (`None`: it does not expire).
fn expiry_of(ctx: &GatewayContext, caller: &Caller) -> Option<Instant> {
    let at = caller.principal.as_ref()?.expires_at?;
    let leeway = ctx.auth.as_ref().map_or(Duration::ZERO, |a| a.leeway());
    let left = Duration::from_millis(at.saturating_sub(crate::gateway::wire::now_ms()));
    Some(Instant::now() + left + leeway)
}

/// Sends `failure` as an error frame, then closes with `code`.
async fn refuse(socket: &mut WebSocket, failure: &Failure, code: u16) {
    let _ = socket
        .send(error_frame(failure.error, &failure.message))
        .await;
    close(socket, code, failure.error).await;
}

/// The close code for a failed registration.
fn close_code(failure: &Failure) -> u16 {
    match failure.error {
        "forbidden" => CLOSE_FORBIDDEN,
        "quota_exceeded" => CLOSE_QUOTA,
        "gateway_unavailable" => 1011,
        _ => CLOSE_NOT_REGISTERED,
    }
}

/// Whether `uri` may be registered by `caller` before anything is opened: not a configured
/// remote agent's, not one of our agents' (`agent://<our host>/<an agent's id or name>`), not
/// another caller's IM URI or outside sender. The router checks the rest (the grant, its own
/// record of who owns the agent id).
async fn may_register(
    im: &Im,
    caller: &Caller,
    headers: &HeaderMap,
    service: &Client,
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
    if let Some(u) = AgentUri::parse(uri) {
        if ctx.is_local_host(&u.host, headers) && resolve(service, &u.id).await.is_some() {
            return Err(not_free());
        }
    }
    if im.table.owner(uri).is_some_and(|o| o != caller.subject()) {
        return Err(not_free());
    }
    Ok(())
}

/// Waits (bounded) for a valid `register` frame and opens the agent's MAP session.
async fn register(
    im: &Arc<Im>,
    caller: &Caller,
    headers: &HeaderMap,
    socket: &mut WebSocket,
) -> Option<Registered> {
    let deadline = Instant::now() + im.ctx.settings.im.register_timeout();
    loop {
        let frame = match tokio::time::timeout_at(deadline, socket.recv()).await {
            Err(_) => {
                close(socket, CLOSE_NOT_REGISTERED, "no register frame").await;
                return None;
            }
            Ok(Some(Ok(WsMessage::Text(t)))) => t,
            Ok(Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_)))) => continue,
            Ok(Some(Ok(WsMessage::Binary(_)))) => {
                let _ = socket
                    .send(error_frame(
                        "unsupported_frame",
                        "binary frames are not supported",
                    ))
                    .await;
                continue;
            }
            Ok(_) => return None,
        };
        let frame: Frame = match serde_json::from_str(frame.as_str()) {
            Ok(f) => f,
            Err(e) => {
                let _ = socket
                    .send(error_frame(
                        "invalid_frame",
                        &format!("not a gateway frame: {e}"),
                    ))
                    .await;
                continue;
            }
        };
        if frame.kind != "register" {
            let _ = socket
                .send(error_frame(
                    "not_registered",
                    "send {\"type\":\"register\",\"agent_uri\",\"capabilities\"} first",
                ))
                .await;
            continue;
        }
        let Some(uri) = frame.agent_uri.filter(|u| AgentUri::parse(u).is_some()) else {
            let _ = socket
                .send(error_frame(
                    "invalid_agent_uri",
                    "agent_uri must be agent://HOST/ID",
                ))
                .await;
            continue;
        };
        let capabilities = frame.capabilities.unwrap_or(Value::Array(Vec::new()));
        let service = match im.ctx.service().await {
            Ok(s) => s.clone(),
            Err(e) => {
                refuse(socket, &Failure::from(e), 1011).await;
                return None;
            }
        };
        if let Err(f) = may_register(im, caller, headers, &service.client, &uri).await {
            refuse(socket, &f, CLOSE_FORBIDDEN).await;
            return None;
        }
        if service.directory.is_live(&uri) {
            let _ = socket
                .send(error_frame(
                    "agent_uri_in_use",
                    &format!("{uri} is connected on another socket"),
                ))
                .await;
            close(socket, CLOSE_NOT_REGISTERED, "agent_uri in use").await;
            return None;
        }
        // A session of the caller's may hold the URI as an outside sender: end it, so that
        // the agent id is free for the connection's own session. Anybody else's is refused.
        match im.ctx.peers.take(&uri, &caller.subject()) {
            Ok(Some(peer)) => {
                let _ = peer.client.disconnect().await;
            }
            Ok(None) => {}
            Err(e) => {
                refuse(socket, &Failure::from(e), CLOSE_FORBIDDEN).await;
                return None;
            }
        }
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
                refuse(socket, &failure, code).await;
                return None;
            }
        };
        let messages = agent.messages();
        service.directory.connected(&uri, capabilities);
        let conn = im.table.connected(&uri, client.clone(), caller.subject());
        let ok = json!({"type": "registered", "agent_uri": uri, "agent_id": agent.id()});
        if socket
            .send(WsMessage::Text(ok.to_string().into()))
            .await
            .is_err()
        {
            im.table.disconnected(&uri, conn);
            service.directory.disconnected(&uri);
            let _ = client.close().await;
            return None;
        }
        return Some(Registered {
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
) -> Option<WsMessage> {
    let frame: Frame = match serde_json::from_str(text) {
        Ok(f) => f,
        Err(e) => {
            return Some(error_frame(
                "invalid_frame",
                &format!("not a gateway frame: {e}"),
            ))
        }
    };
    match frame.kind.as_str() {
        "heartbeat" => Some(WsMessage::Text(
            json!({"type": "heartbeat_ack", "timestamp": iso8601(crate::gateway::wire::now_ms())})
                .to_string()
                .into(),
        )),
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
            match im
                .deliver(client, uri, headers, &to, &content, frame.conversation_id.as_deref())
                .await
            {
                Ok((conversation_id, message_id)) => Some(WsMessage::Text(
                    json!({"type": "sent", "conversation_id": conversation_id, "message_id": message_id})
                        .to_string()
                        .into(),
                )),
                Err(f) => Some(error_frame(f.error, &f.message)),
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
    let conversation = meta
        .as_ref()
        .and_then(|m| m.pointer("/mail/conversationId"))
        .and_then(Value::as_str);
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
