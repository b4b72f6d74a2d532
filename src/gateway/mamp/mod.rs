//! The MAMP 1.0 gateway (seed 000; docs/gateways.md "MAMP"): the router's card and one card
//! per MAP agent, and `POST /mamp/v1/messages`, which turns a MAMP message into a `map/send`
//! with `meta.mail` (a recorded turn of a mail conversation) from the MAP agent that stands
//! for the sender (`peers.rs`). Outbound messages to configured remote MAMP agents are in
//! `outbound.rs`.
//!
//! Owns only the translation. Conversations are the mail extension's: a MAMP
//! `conversation_id` is our mail conversation id (or, for a conversation our side started at a
//! remote agent, the remote's id, mapped by `PeerTable`).

pub mod envelope;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router as HttpRouter;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::client::ClientError;
use crate::gateway::context::{closing, resolve, GatewayContext};
use crate::gateway::peer_table::Peer;
use crate::gateway::peers;
use crate::gateway::wire::{error_response, gateway_error_response, AgentUri, GatewayError, Json};
use crate::protocol::json::RawJson;
use crate::protocol::methods::messaging::SendParams;

/// Mail error codes the gateway maps (the mail extension's, SDK `MAIL_ERROR_CODES`).
mod mail_codes {
    pub const NOT_FOUND: i32 = 10000;
    pub const CLOSED: i32 = 10001;
    pub const NOT_A_PARTICIPANT: i32 = 10002;
}
/// MAP's "agent not found".
const AGENT_NOT_FOUND: i32 = 2001;

/// `/mamp/v1/*`.
pub fn routes(ctx: Arc<GatewayContext>) -> HttpRouter {
    HttpRouter::new()
        .route("/mamp/v1/card", get(router_card))
        .route("/mamp/v1/agents/{agent_id}/card", get(agent_card))
        .route("/mamp/v1/messages", post(receive))
        .with_state(ctx)
}

/// The host our cards name: the configured domain, else the request's `Host` (without port).
fn card_host(ctx: &GatewayContext, headers: &HeaderMap) -> String {
    if let Some(d) = &ctx.settings.domain {
        return d.clone();
    }
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(|h| h.rsplit_once(':').map_or(h, |(host, _)| host).to_owned())
        .unwrap_or_else(|| ctx.default_host.clone())
}

async fn router_card(State(ctx): State<Arc<GatewayContext>>, headers: HeaderMap) -> Response {
    let host = card_host(&ctx, &headers);
    Json(envelope::router_card(
        &format!("{}{host}/{}", AgentUri::SCHEME, ctx.router_name),
        &ctx.router_name,
        ctx.settings.mamp.max_message_size,
        ctx.auth.is_some(),
    ))
    .into_response()
}

async fn agent_card(
    State(ctx): State<Arc<GatewayContext>>,
    Path(agent_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = ctx.bearer_refusal(&headers) {
        return r;
    }
    let service = match ctx.service().await {
        Ok(s) => s,
        Err(e) => return gateway_error_response(&e),
    };
    let Some(agent) = resolve(&service.client, &agent_id).await else {
        return agent_not_found(&agent_id);
    };
    let host = card_host(&ctx, &headers);
    let uri = if agent.id.as_str().starts_with(AgentUri::SCHEME) {
        agent.id.to_string()
    } else {
        format!("{}{host}/{}", AgentUri::SCHEME, agent.id)
    };
    Json(envelope::agent_card(
        &uri,
        agent.name.as_deref().unwrap_or(agent.id.as_str()),
        agent.description.as_deref(),
        agent.role.as_deref(),
        ctx.settings.mamp.max_message_size,
        ctx.auth.is_some(),
    ))
    .into_response()
}

fn agent_not_found(what: &str) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "agent_not_found",
        &format!("Agent {what} not found"),
    )
}

fn conversation_not_found(id: &str) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "conversation_not_found",
        &format!("Conversation {id} not found"),
    )
}

/// `meta` of the `map/send` a MAMP message becomes; `metadata` spliced in as sent.
#[derive(Serialize)]
struct Meta<'a> {
    mail: MailMeta<'a>,
    protocol: &'a str,
    mamp: MampMeta<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MailMeta<'a> {
    conversation_id: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MampMeta<'a> {
    message_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    conversation_id: Option<&'a str>,
    from: &'a str,
    to: &'a str,
    metadata: &'a RawValue,
}

fn rpc_code(e: &GatewayError) -> Option<i32> {
    match e {
        GatewayError::Map(ClientError::Rpc { code, .. }) => Some(code.0),
        _ => None,
    }
}

async fn receive(
    State(ctx): State<Arc<GatewayContext>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Some(r) = ctx.bearer_refusal(&headers) {
        return r;
    }
    let max = ctx.settings.mamp.max_message_size;
    let too_large = || {
        closing(error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "message_too_large",
            &format!("messages are limited to {max} bytes (max_message_size)"),
        ))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return too_large();
    }
    let bytes = match axum::body::to_bytes(body, max).await {
        Ok(b) => b,
        Err(_) => return too_large(),
    };
    let checked = match envelope::check(&bytes) {
        Ok(c) => c,
        Err((error, message)) => return error_response(StatusCode::BAD_REQUEST, error, &message),
    };
    let service = match ctx.service().await {
        Ok(s) => s.clone(),
        Err(e) => return gateway_error_response(&e),
    };
    let env = &checked.envelope;
    // An agent registered under the whole URI (an IM agent, a remote MAMP agent) is reached
    // whatever the host; otherwise the host must be ours and the id an agent id or name.
    let target = match service.client.get_agent(env.to.as_str()).await {
        Ok(a) => Some(a),
        Err(_) if ctx.is_local_host(&checked.to.host, &headers) => {
            resolve(&service.client, &checked.to.id).await
        }
        _ => None,
    };
    let Some(target) = target else {
        return agent_not_found(&env.to);
    };
    let peer = match peers::get_or_open(&ctx, &env.from, "mamp").await {
        Ok(p) => p,
        Err(e) => return gateway_error_response(&e),
    };
    let (ours, answer_id) = match &env.conversation_id {
        Some(given) => (
            ctx.peers
                .ours(&env.from, given)
                .unwrap_or_else(|| given.clone()),
            given.clone(),
        ),
        None => match create_conversation(&peer, target.id.as_str(), env).await {
            Ok(id) => (id.clone(), id),
            Err(e) => return gateway_error_response(&e),
        },
    };
    let meta = Meta {
        mail: MailMeta {
            conversation_id: &ours,
        },
        protocol: "mamp",
        mamp: MampMeta {
            message_id: &env.message_id,
            conversation_id: env.conversation_id.as_deref(),
            from: &env.from,
            to: &env.to,
            metadata: &env.metadata,
        },
    };
    let params = SendParams {
        to: RawJson::from(json!({ "agent": target.id })),
        payload: Some(RawJson::from_text(env.content.get()).unwrap_or_else(|_| RawJson::null())),
        meta: Some(RawJson::serialize_from(&meta)),
    };
    let mut sent = peer
        .client
        .send_with(params.clone())
        .await
        .map_err(GatewayError::from);
    if let Err(e) = &sent {
        if rpc_code(e) == Some(mail_codes::NOT_A_PARTICIPANT) {
            // A sender that knows the id may take part: join, then send again.
            let joined = peer
                .client
                .call_raw("mail/join", json!({ "conversationId": ours }))
                .await;
            if joined.is_ok() {
                sent = peer
                    .client
                    .send_with(params)
                    .await
                    .map_err(GatewayError::from);
            }
        }
    }
    match sent {
        Ok(_) => Json(json!({
            "conversation_id": answer_id,
            "message_id": env.message_id,
            "status": "received",
        }))
        .into_response(),
        Err(e) => match rpc_code(&e) {
            Some(mail_codes::NOT_FOUND | mail_codes::NOT_A_PARTICIPANT) => {
                conversation_not_found(&answer_id)
            }
            Some(mail_codes::CLOSED) => error_response(
                StatusCode::CONFLICT,
                "conversation_closed",
                &format!("Conversation {answer_id} is closed"),
            ),
            Some(AGENT_NOT_FOUND) => agent_not_found(&env.to),
            _ => gateway_error_response(&e),
        },
    }
}

/// A new mail conversation between the sender's peer agent and `target`.
async fn create_conversation(
    peer: &Peer,
    target: &str,
    env: &envelope::Envelope,
) -> Result<String, GatewayError> {
    let created = peer
        .client
        .call_raw(
            "mail/create",
            json!({
                "initialParticipants": [{ "id": target }],
                "metadata": { "protocol": "mamp", "mamp": { "from": env.from, "to": env.to } },
            }),
        )
        .await?;
    created
        .pointer("/conversation/id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| GatewayError::Unavailable("mail/create answered without an id".into()))
}
