//! The agent IM gateway (seed 002; docs/gateways.md "IM"): `WS /gateway/connect`
//! (`connect.rs`), `POST /gateway/send`, presence (`/gateway/status/{agent_uri}`,
//! `/gateway/agents`), and the contacts and collaborators read models (`/api/*`), answered from
//! the [`Directory`](crate::gateway::directory::Directory).
//!
//! Each IM connection is one in-process MAP session owning one MAP agent whose id is the IM
//! agent's `agent://` URI, so MAP agents message it with `{agent: "<uri>"}` and the router
//! reports its presence. Owns the table of live IM sessions (to send as them); nothing else.

pub mod connect;
pub mod sender;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router as HttpRouter;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::gateway::context::GatewayContext;
use crate::gateway::im::sender::{unknown_agent, Im};
use crate::gateway::wire::{error_response, gateway_error_response, iso8601, AgentUri, Json};

/// `/gateway/*` and `/api/*`.
pub fn routes(ctx: Arc<GatewayContext>) -> HttpRouter {
    let im = Arc::new(Im::new(ctx));
    HttpRouter::new()
        .route("/gateway/connect", get(connect::upgrade))
        .route("/gateway/send", post(send))
        .route("/gateway/status/{*agent_uri}", get(status))
        .route("/gateway/agents", get(agents))
        .route("/api/contacts", get(contacts))
        .route("/api/contacts/{*rest}", get(contact))
        .route("/api/traces/{id}/collaborators", get(collaborators))
        .with_state(im)
}

/// A catch-all path segment as an agent URI: percent-decoded by axum; a leading `/` (from
/// `//` normalisation) dropped, and `agent:/x` (a proxy that folded `//`) repaired.
fn path_uri(raw: &str) -> String {
    let s = raw.trim_start_matches('/');
    match s.strip_prefix("agent:/") {
        Some(rest) if !rest.starts_with('/') => format!("agent://{rest}"),
        _ => s.to_owned(),
    }
}

/// The MAP agent id an IM agent URI stands for: the URI itself when an agent is registered
/// under it (IM agents, remote MAMP agents), else the id part of one of ours.
fn id_of(ctx: &GatewayContext, uri: &str) -> String {
    match AgentUri::parse(uri) {
        Some(u) if u.host.eq_ignore_ascii_case(ctx.host()) => u.id,
        _ => uri.to_owned(),
    }
}

async fn status(
    State(im): State<Arc<Im>>,
    Path(raw): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = im.ctx.bearer_refusal(&headers) {
        return r;
    }
    let uri = path_uri(&raw);
    if AgentUri::parse(&uri).is_none() {
        return error_response(
            StatusCode::BAD_REQUEST,
            "invalid_agent_uri",
            &format!("`{uri}` is not an agent://HOST/ID URI"),
        );
    }
    let service = match im.ctx.service().await {
        Ok(s) => s,
        Err(e) => return gateway_error_response(&e),
    };
    let dir = &service.directory;
    let found = dir
        .status(&uri, &uri)
        .or_else(|| dir.status(&id_of(&im.ctx, &uri), &uri));
    match found {
        Some(v) => Json(v).into_response(),
        None => unknown_agent(&uri),
    }
}

async fn agents(State(im): State<Arc<Im>>, headers: HeaderMap) -> Response {
    if let Some(r) = im.ctx.bearer_refusal(&headers) {
        return r;
    }
    let service = match im.ctx.service().await {
        Ok(s) => s,
        Err(e) => return gateway_error_response(&e),
    };
    let list: Vec<Value> = service
        .directory
        .online()
        .into_iter()
        .map(|(uri, live)| {
            json!({
                "agent_uri": uri,
                "status": "online",
                "last_seen": iso8601(live.last_seen),
                "connected_at": iso8601(live.connected_at),
                "connection_type": "websocket",
                "capabilities": live.capabilities,
            })
        })
        .collect();
    Json(json!({ "agents": list })).into_response()
}

async fn contacts(State(im): State<Arc<Im>>, headers: HeaderMap) -> Response {
    if let Some(r) = im.ctx.bearer_refusal(&headers) {
        return r;
    }
    let service = match im.ctx.service().await {
        Ok(s) => s,
        Err(e) => return gateway_error_response(&e),
    };
    let ctx = Arc::clone(&im.ctx);
    let uri_of = move |id: &str| ctx.uri_of(id);
    Json(json!({ "contacts": service.directory.contacts(&uri_of) })).into_response()
}

/// `/api/contacts/{agent_uri}` and `/api/contacts/{agent_uri}/conversations`.
async fn contact(
    State(im): State<Arc<Im>>,
    Path(raw): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = im.ctx.bearer_refusal(&headers) {
        return r;
    }
    let (raw, conversations) = match raw.strip_suffix("/conversations") {
        Some(r) => (r, true),
        None => (raw.as_str(), false),
    };
    let uri = path_uri(raw);
    let service = match im.ctx.service().await {
        Ok(s) => s,
        Err(e) => return gateway_error_response(&e),
    };
    let ctx = Arc::clone(&im.ctx);
    let uri_of = move |id: &str| ctx.uri_of(id);
    let dir = &service.directory;
    let ids = [uri.clone(), id_of(&im.ctx, &uri)];
    let found = ids.iter().find_map(|id| {
        if conversations {
            dir.conversations_of(id, &uri_of)
                .map(|c| json!({ "agent_uri": uri, "conversations": c }))
        } else {
            dir.contact(id, &uri_of)
        }
    });
    match found {
        Some(v) => Json(v).into_response(),
        None => unknown_agent(&uri),
    }
}

async fn collaborators(
    State(im): State<Arc<Im>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = im.ctx.bearer_refusal(&headers) {
        return r;
    }
    let service = match im.ctx.service().await {
        Ok(s) => s,
        Err(e) => return gateway_error_response(&e),
    };
    let ctx = Arc::clone(&im.ctx);
    let uri_of = move |id: &str| ctx.uri_of(id);
    match service.directory.collaborators(&id, &uri_of) {
        Some(c) => Json(json!({ "trace_id": id, "collaborators": c })).into_response(),
        None => error_response(
            StatusCode::NOT_FOUND,
            "trace_not_found",
            &format!("Trace {id} not found"),
        ),
    }
}

/// `POST /gateway/send` body.
#[derive(Debug, Deserialize)]
struct SendBody {
    to: String,
    content: Box<RawValue>,
    #[serde(default)]
    conversation_id: Option<String>,
    /// Who sends (an extension of the seed, whose sender is implicit): a live IM agent sends
    /// through its own session, any other URI through a peer session; absent: the gateway.
    #[serde(default)]
    from: Option<String>,
}

async fn send(State(im): State<Arc<Im>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(r) = im.ctx.bearer_refusal(&headers) {
        return r;
    }
    let body: SendBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "invalid_message",
                &format!("expected {{to, content, conversation_id?}}: {e}"),
            )
        }
    };
    if let Some(from) = &body.from {
        if AgentUri::parse(from).is_none() {
            return error_response(
                StatusCode::BAD_REQUEST,
                "invalid_agent_uri",
                &format!("from `{from}` is not an agent://HOST/ID URI"),
            );
        }
    }
    let from = body
        .from
        .clone()
        .unwrap_or_else(|| format!("{}{}/gateway", AgentUri::SCHEME, im.ctx.host()));
    match im
        .deliver(
            &headers,
            &from,
            &body.to,
            &body.content,
            body.conversation_id.as_deref(),
        )
        .await
    {
        Ok((conversation_id, message_id)) => Json(json!({
            "conversation_id": conversation_id,
            "message_id": message_id,
            "status": "sent",
        }))
        .into_response(),
        Err(r) => r,
    }
}
