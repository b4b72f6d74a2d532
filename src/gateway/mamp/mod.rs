//! The MAMP 1.0 gateway (seed 000; docs/gateways.md "MAMP"): the router's card and one card
//! per MAP agent, and `POST /mamp/v1/messages`, which turns a MAMP message into a `map/send`
//! with `meta.mail` (a recorded turn of a mail conversation) from the MAP agent that stands
//! for the sender (`peers.rs`). Outbound messages to configured remote MAMP agents are in
//! `outbound.rs`.
//!
//! Every route but the router's card acts as its caller (`caller.rs`): cards and targets are
//! looked up through the caller's own MAP session (what it may not see is not found), and a
//! message is sent from the session its `from` proves to be the caller's (`senders.rs`: a
//! configured remote agent bound to the caller's principal, or an outside sender in the
//! caller's namespace, whose session is of the caller's principal).
//!
//! Every route is built behind a gate (`guard.rs`, [`GatewayContext::gate`]), which does the
//! checks before the handler runs: the caller's credential (401; the router's card is public),
//! one request from the caller's rate budget (429 with `Retry-After`), a POST body in
//! `application/json` (415), within the size the router delivers (413, from `Content-Length`
//! before reading), arriving within the body deadline (408), all before any MAP call.
//!
//! Replies: what MAP agents send an outside sender without an endpoint is kept for it, and
//! `GET /mamp/v1/messages?agent=<its URI>` fetches it (docs/gateways.md, "Replies").
//!
//! Owns only the translation. Conversations are the mail extension's: a MAMP
//! `conversation_id` is our mail conversation id (or, for a conversation our side started at a
//! remote agent, the remote's id, mapped by `PeerTable`).

pub mod envelope;

use std::sync::Arc;

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::client::Client;
use crate::gateway::caller::{Accepts, Caller};
use crate::gateway::context::{granted, resolve, resolve_target, split_port, GatewayContext};
use crate::gateway::guard::{Access, Gated, GatedRoutes};
use crate::gateway::peers::{self, PeerFor};
use crate::gateway::senders::{mamp_sender, MampSender};
use crate::gateway::wire::{gateway_error_response, AgentUri, Failure, GatewayError, Json};
use crate::protocol::capabilities::Capability;
use crate::protocol::json::RawJson;
use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::methods::messaging::SendParams;

/// `/mamp/v1/*`: the router's card is public (it says how to authenticate); everything else is
/// behind the caller's credential. Bodies up to what the router delivers.
pub fn routes(ctx: Arc<GatewayContext>) -> Gated {
    let max = ctx.mamp_max_message_size();
    let gate = |access| ctx.gate(access, Accepts::default(), max, "max_message_size");
    let public = GatedRoutes::new("mamp card", gate(Access::Public))
        .get("/mamp/v1/card", router_card)
        .with_state(Arc::clone(&ctx));
    let callers = GatedRoutes::new("mamp", gate(Access::Required))
        .get("/mamp/v1/agents/{agent_id}/card", agent_card)
        .post("/mamp/v1/messages", receive)
        .get("/mamp/v1/messages", fetch)
        .with_state(Arc::clone(&ctx));
    public.merge(callers)
}

/// The host our cards name: the canonical one ([`GatewayContext::host`]: the configured
/// domain, else the first listen address with its port), so that a card's URI is the one
/// every other route and frame uses for the agent. Only when the router listens on an
/// unspecified address (`0.0.0.0`, `::`) and has no domain, the request's `Host` stands in.
fn card_host(ctx: &GatewayContext, headers: &HeaderMap) -> String {
    let host = ctx.host();
    let unspecified = ctx.settings.domain.is_none()
        && split_port(host)
            .0
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_unspecified());
    if !unspecified {
        return host.to_owned();
    }
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| host.to_owned(), str::to_owned)
}

async fn router_card(State(ctx): State<Arc<GatewayContext>>, headers: HeaderMap) -> Response {
    let host = card_host(&ctx, &headers);
    Json(envelope::router_card(
        &format!("{}{host}/{}", AgentUri::SCHEME, ctx.router_name),
        &ctx.router_name,
        ctx.mamp_max_message_size(),
        ctx.auth.is_some(),
    ))
    .into_response()
}

async fn agent_card(
    State(ctx): State<Arc<GatewayContext>>,
    Extension(caller): Extension<Caller>,
    Path(agent_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let session = match ctx.caller_session(&caller).await {
        Ok(s) => s,
        Err(e) => return gateway_error_response(&e),
    };
    // An agent's id or name, or its URI (in any of our forms).
    let wanted = ctx
        .local_id(&agent_id, &headers)
        .unwrap_or_else(|| agent_id.clone());
    let agent = match resolve(&session, &wanted).await {
        Ok(Some(a)) => a,
        Ok(None) => return agent_not_found(&agent_id).response(),
        Err(e) => return gateway_error_response(&e),
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
        ctx.mamp_max_message_size(),
        ctx.auth.is_some(),
    ))
    .into_response()
}

fn agent_not_found(what: &str) -> Failure {
    Failure::new(
        StatusCode::NOT_FOUND,
        "agent_not_found",
        format!("Agent {what} not found"),
    )
}

fn conversation_not_found(id: &str) -> Failure {
    Failure::new(
        StatusCode::NOT_FOUND,
        "conversation_not_found",
        format!("Conversation {id} not found"),
    )
}

/// `meta` of the `map/send` a MAMP message becomes; `metadata` spliced in as sent.
#[derive(Serialize)]
struct Meta<'a> {
    mail: MailMeta<'a>,
    protocol: &'a str,
    mamp: MampMeta<'a>,
    /// The caller's trace context, from its `traceparent` / `tracestate` headers
    /// (`gateway::trace`).
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tracestate: Option<&'a str>,
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

async fn receive(
    State(ctx): State<Arc<GatewayContext>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let checked = match envelope::check(&bytes) {
        Ok(c) => c,
        Err((error, message)) => {
            return Failure::new(StatusCode::BAD_REQUEST, error, message).response()
        }
    };
    match deliver(&ctx, &caller, &headers, &checked).await {
        Ok(answer_id) => Json(json!({
            "conversation_id": answer_id,
            "message_id": checked.envelope.message_id,
            "status": "received",
        }))
        .into_response(),
        Err(f) => f.response(),
    }
}

/// The message of `checked` to its target, from the session its `from` proves to be the
/// caller's: the conversation id to answer with.
async fn deliver(
    ctx: &Arc<GatewayContext>,
    caller: &Caller,
    headers: &HeaderMap,
    checked: &envelope::Checked,
) -> Result<String, Failure> {
    let env = &checked.envelope;
    // Who sends, first: a sender that is not the caller's learns nothing about targets.
    let local = ctx.is_local_host(&checked.from.host, headers);
    let sender = mamp_sender(&ctx.settings.mamp, caller, &checked.from, &env.from, local)
        .map_err(Failure::forbidden)?;
    let session = ctx.caller_session(caller).await?;
    let target = resolve_target(ctx, &session, &env.to, headers)
        .await?
        .ok_or_else(|| agent_not_found(&env.to))?;
    // The caller's grant decides before anything is opened or created (its session and the
    // sender's are of the same principal; the remote agent's is the service's).
    let creates = env.conversation_id.is_none();
    if !granted(&session, Capability::CanSend) {
        return Err(lacks(caller, Capability::CanSend));
    }
    if creates && !granted(&session, Capability::CanCreateConversations) {
        return Err(lacks(caller, Capability::CanCreateConversations));
    }
    let peer = match sender {
        MampSender::Remote(remote) => {
            peers::get_or_open(ctx, &env.from, PeerFor::Remote(remote)).await?
        }
        MampSender::Own => peers::get_or_open(ctx, &env.from, PeerFor::Caller(caller)).await?,
    };
    // The caller's trace context (its headers): the message's `meta` and the calls' `_meta`.
    let trace = crate::gateway::trace::from_headers(headers);
    let (ours, answer_id) = match &env.conversation_id {
        Some(given) => (
            ctx.peers
                .ours(&env.from, given)
                .unwrap_or_else(|| given.clone()),
            given.clone(),
        ),
        None => {
            let id =
                create_conversation(&peer.client, target.id.as_str(), env, trace.as_ref()).await?;
            (id.clone(), id)
        }
    };
    let meta = Meta {
        traceparent: trace.as_ref().map(|t| &*t.traceparent),
        tracestate: trace.as_ref().and_then(|t| t.tracestate.as_deref()),
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
    ctx.check_payload(env.content.get())?;
    let params = SendParams {
        to: RawJson::from(json!({ "agent": target.id })),
        payload: Some(RawJson::from_text(env.content.get()).unwrap_or_else(|_| RawJson::null())),
        meta: Some(RawJson::serialize_from(&meta)),
    };
    let mut sent = peer.client.send_with(params.clone()).await;
    if matches!(&sent, Err(e) if e.code() == Some(ErrorCode::MAIL_NOT_A_PARTICIPANT)) {
        // A sender that knows the id may take part again: join, then send again.
        let joined = peer
            .client
            .call_raw("mail/join", json!({ "conversationId": ours }))
            .await;
        if joined.is_ok() {
            sent = peer.client.send_with(params).await;
        }
    }
    match sent {
        Ok(r) => {
            // A reply to this message goes to the sender in this conversation, under the id it
            // knows it by (threads.rs; outbound.rs for a configured remote).
            ctx.threads.record(r.message_id.as_str(), &ours);
            if matches!(sender, MampSender::Remote(_))
                && ctx.peers.theirs(&env.from, &ours).is_none()
            {
                ctx.peers.map_conversation(&env.from, &ours, &answer_id);
            }
            Ok(answer_id)
        }
        Err(e) => Err(match e.code() {
            Some(ErrorCode::MAIL_CONVERSATION_NOT_FOUND | ErrorCode::MAIL_NOT_A_PARTICIPANT) => {
                conversation_not_found(&answer_id)
            }
            Some(ErrorCode::MAIL_CONVERSATION_CLOSED) => Failure::new(
                StatusCode::CONFLICT,
                "conversation_closed",
                format!("Conversation {answer_id} is closed"),
            ),
            Some(ErrorCode::AGENT_NOT_FOUND) => agent_not_found(&env.to),
            _ => Failure::from(GatewayError::Map(e)),
        }),
    }
}

/// 403 for a grant the caller's principal lacks.
fn lacks(caller: &Caller, cap: Capability) -> Failure {
    Failure::forbidden(format!(
        "Permission denied: principal {} lacks {}",
        caller.name(),
        cap.path()
    ))
}

/// A new mail conversation between the sender's agent and `target` (`trace`: the request's
/// context, as the call's `_meta`).
async fn create_conversation(
    client: &Client,
    target: &str,
    env: &envelope::Envelope,
    trace: Option<&crate::protocol::trace::TraceContext>,
) -> Result<String, Failure> {
    let created = client
        .call_raw(
            "mail/create",
            crate::gateway::trace::with_meta(
                json!({
                    "initialParticipants": [{ "id": target }],
                    "metadata": { "protocol": "mamp", "mamp": { "from": env.from, "to": env.to } },
                }),
                trace,
            ),
        )
        .await
        .map_err(|e| Failure::from(GatewayError::Map(e)))?;
    created
        .pointer("/conversation/id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| {
            Failure::new(
                StatusCode::BAD_GATEWAY,
                "map_error",
                "mail/create answered without an id",
            )
        })
}

/// `GET /mamp/v1/messages?agent=<URI>`: what MAP agents sent outside sender `agent` (a URI
/// the caller may post as, with no endpoint of its own) since its last fetch, oldest first,
/// as MAMP envelopes: `{"messages": [...]}`. Opening its session again (when it was closed for
/// idleness) reclaims its agent, and with it what the router queued meanwhile.
async fn fetch(
    State(ctx): State<Arc<GatewayContext>>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let Some(uri) = query.get("agent") else {
        return Failure::new(
            StatusCode::BAD_REQUEST,
            "invalid_message",
            "name the sender: GET /mamp/v1/messages?agent=<its agent:// URI>",
        )
        .response();
    };
    let Some(parsed) = AgentUri::parse(uri) else {
        return Failure::new(
            StatusCode::BAD_REQUEST,
            "invalid_agent_uri",
            format!("`{uri}` is not an agent://HOST/ID URI"),
        )
        .response();
    };
    let local = ctx.is_local_host(&parsed.host, &headers);
    match mamp_sender(&ctx.settings.mamp, &caller, &parsed, uri, local) {
        Err(why) => return Failure::forbidden(why).response(),
        Ok(MampSender::Remote(_)) => {
            return Failure::new(
                StatusCode::CONFLICT,
                "has_endpoint",
                format!(
                "{uri} is a configured remote agent: what is sent to it is POSTed to its endpoint"
            ),
            )
            .response()
        }
        Ok(MampSender::Own) => {}
    }
    let peer = match peers::get_or_open(&ctx, uri, PeerFor::Caller(&caller)).await {
        Ok(p) => p,
        Err(e) => return gateway_error_response(&e),
    };
    let Some(mailbox) = ctx.peers.mailbox_of(uri, Some(&caller.subject())) else {
        return Json(json!({ "messages": [] })).into_response();
    };
    if peer.opened_at.elapsed() < Duration::from_secs(1) {
        // Just reopened: the router hands the agent what it queued on reclaiming it.
        mailbox
            .settle(Duration::from_millis(50), Duration::from_millis(500))
            .await;
    }
    // Spliced as written: each envelope's `content` is the MAP payload byte for byte.
    let mut body = b"{\"messages\":[".to_vec();
    let mut first = true;
    for m in mailbox.take().iter() {
        let ours = ctx.threads.conversation_of(m);
        match crate::gateway::outbound::envelope(&ctx, uri, m, ours.as_deref(), ours.as_deref()) {
            Ok(envelope) => {
                if !first {
                    body.push(b',');
                }
                first = false;
                body.extend_from_slice(&envelope);
            }
            Err(e) => {
                tracing::warn!(sender = %uri, error = %e, "a kept message could not be encoded")
            }
        }
    }
    body.extend_from_slice(b"]}");
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}
