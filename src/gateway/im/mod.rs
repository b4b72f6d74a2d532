//! The agent IM gateway (seed 002; docs/gateways.md "IM"): `WS /gateway/connect`
//! (`connect.rs`), `POST /gateway/send`, presence (`/gateway/status/{agent_uri}`,
//! `/gateway/agents`), and the contacts and collaborators read models (`/api/*`), answered from
//! the [`Directory`](crate::gateway::directory::Directory).
//!
//! Each IM connection is one in-process MAP session of the caller's principal owning one MAP
//! agent whose id is the IM agent's `agent://` URI, so MAP agents message it with
//! `{agent: "<uri>"}` and the router reports its presence. Every route acts as its caller
//! (`caller.rs`): sends come from the caller's own sessions, and reads answer with what the
//! caller may see (`directory::View`). Every route is built behind the IM gate (`guard.rs`,
//! [`GatewayContext::gate`]), which checks before the handler runs: the credential (401), one
//! request from the caller's rate budget (429 with `Retry-After`; the WebSocket upgrade too),
//! a POST body in `application/json` (415) that fits what the router delivers (413 at once)
//! and arrives within the body deadline (408). Frames on an IM connection spend the same
//! budget (`connect.rs`).
//! Owns the table of IM URIs (`table.rs`, held by the context); nothing else.

pub mod connect;
pub mod sender;
pub mod socket;
pub mod table;

use std::collections::HashSet;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::gateway::caller::{Accepts, Caller};
use crate::gateway::context::{granted, GatewayContext};
use crate::gateway::directory::View;
use crate::gateway::guard::{Access, Gated, GatedRoutes};
use crate::gateway::im::sender::{unknown_agent, Im, Sending};
use crate::gateway::senders::in_namespace;
use crate::gateway::wire::{error_response, iso8601, AgentUri, Failure, GatewayError, Json};
use crate::protocol::capabilities::Capability;
use crate::protocol::methods::session::SessionList;

/// `/gateway/*` and `/api/*`, every one behind the IM gate: the caller's credential
/// (`Authorization: Bearer`, or `?token=` on the WebSocket upgrade), its rate, bodies up to
/// `gateways.im.max_frame_bytes` (what the router delivers).
pub fn routes(ctx: Arc<GatewayContext>) -> Gated {
    let im = Arc::new(Im::new(Arc::clone(&ctx)));
    let accepts = Accepts {
        upgrade_token: true,
        ..Accepts::default()
    };
    let gate = ctx.gate(
        Access::Required,
        accepts,
        ctx.im_max_body(),
        "gateways.im.max_frame_bytes",
    );
    GatedRoutes::new("im", gate)
        .get("/gateway/connect", connect::upgrade)
        .post("/gateway/send", send)
        .get("/gateway/status/{*agent_uri}", status)
        .get("/gateway/agents", agents)
        .get("/api/contacts", contacts)
        .get("/api/contacts/{*rest}", contact)
        .get("/api/traces/{id}/collaborators", collaborators)
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

/// The MAP agent id an agent URI stands for: the id part of one of ours (any of our URI
/// forms), else the URI itself (IM agents and remote MAMP agents are registered under it).
fn id_of(ctx: &GatewayContext, uri: &str, headers: &HeaderMap) -> String {
    ctx.local_id(uri, headers).unwrap_or_else(|| uri.to_owned())
}

/// What a caller reads with: the whole model, or (`Some`) the ids that are its own: its
/// principal's sessions' participant ids and agents (`map/session/list` through its own
/// session), the IM URIs it registered, the outside senders' URIs of its namespace.
struct Reader {
    own: Option<HashSet<String>>,
}

impl Im {
    /// The caller's [`Reader`]: reading needs `observation.canQuery`, as over MAP.
    async fn reader(&self, caller: &Caller) -> Result<Reader, Failure> {
        if caller.sees_all {
            return Ok(Reader { own: None });
        }
        let session = self.ctx.caller_session(caller).await?;
        if !granted(&session, Capability::CanQuery) {
            return Err(Failure::forbidden(format!(
                "Permission denied: principal {} lacks {}",
                caller.name(),
                Capability::CanQuery.path()
            )));
        }
        let mine = session
            .call::<SessionList>(Default::default())
            .await
            .map_err(|e| Failure::from(GatewayError::Map(e)))?;
        let mut own = HashSet::new();
        for s in mine.sessions {
            own.insert(s.participant_id.to_string());
            own.extend(s.agents.into_iter().map(|a| a.to_string()));
        }
        Ok(Reader { own: Some(own) })
    }

    /// Answers with `f` given the caller's [`View`].
    fn with_view<T>(&self, caller: &Caller, reader: &Reader, f: impl FnOnce(View<'_>) -> T) -> T {
        let Some(own) = &reader.own else {
            return f(View::All);
        };
        let subject = caller.subject();
        let principal = caller.name();
        let mine = |id: &str| {
            own.contains(id)
                || self.table.is_owned_by(id, &subject)
                || AgentUri::parse(id)
                    .is_some_and(|u| in_namespace(&self.ctx.settings.mamp, principal, &u, id))
        };
        f(View::Limited(&mine))
    }
}

async fn status(
    State(im): State<Arc<Im>>,
    Extension(caller): Extension<Caller>,
    Path(raw): Path<String>,
    headers: HeaderMap,
) -> Response {
    let uri = path_uri(&raw);
    if AgentUri::parse(&uri).is_none() {
        return error_response(
            StatusCode::BAD_REQUEST,
            "invalid_agent_uri",
            &format!("`{uri}` is not an agent://HOST/ID URI"),
        );
    }
    let (service, reader) = match ready(&im, &caller).await {
        Ok(x) => x,
        Err(f) => return f.response(),
    };
    let dir = &service.directory;
    let ids = [
        uri.clone(),
        id_of(&im.ctx, &uri, &headers),
        im.ctx.canonical(&uri, &headers),
    ];
    let found = im.with_view(&caller, &reader, |view| {
        ids.iter().find_map(|id| dir.status(id, &uri, view))
    });
    match found {
        Some(v) => Json(v).into_response(),
        None => unknown_agent(&uri).response(),
    }
}

/// The service (its read model) and the caller's reader.
async fn ready(
    im: &Im,
    caller: &Caller,
) -> Result<(crate::gateway::context::Service, Reader), Failure> {
    let service = im.ctx.service().await?.clone();
    let reader = im.reader(caller).await?;
    Ok((service, reader))
}

async fn agents(State(im): State<Arc<Im>>, Extension(caller): Extension<Caller>) -> Response {
    let (service, reader) = match ready(&im, &caller).await {
        Ok(x) => x,
        Err(f) => return f.response(),
    };
    let online = im.with_view(&caller, &reader, |view| service.directory.online(view));
    let list: Vec<Value> = online
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

async fn contacts(State(im): State<Arc<Im>>, Extension(caller): Extension<Caller>) -> Response {
    let (service, reader) = match ready(&im, &caller).await {
        Ok(x) => x,
        Err(f) => return f.response(),
    };
    let uri_of = |id: &str| im.ctx.uri_of(id);
    let list = im.with_view(&caller, &reader, |view| {
        service.directory.contacts(view, &uri_of)
    });
    Json(json!({ "contacts": list })).into_response()
}

/// `/api/contacts/{agent_uri}` and `/api/contacts/{agent_uri}/conversations`.
async fn contact(
    State(im): State<Arc<Im>>,
    Extension(caller): Extension<Caller>,
    Path(raw): Path<String>,
    headers: HeaderMap,
) -> Response {
    let (raw, conversations) = match raw.strip_suffix("/conversations") {
        Some(r) => (r, true),
        None => (raw.as_str(), false),
    };
    let uri = path_uri(raw);
    let (service, reader) = match ready(&im, &caller).await {
        Ok(x) => x,
        Err(f) => return f.response(),
    };
    let uri_of = |id: &str| im.ctx.uri_of(id);
    let dir = &service.directory;
    let ids = [
        uri.clone(),
        id_of(&im.ctx, &uri, &headers),
        im.ctx.canonical(&uri, &headers),
    ];
    let found = im.with_view(&caller, &reader, |view| {
        ids.iter().find_map(|id| {
            if conversations {
                dir.conversations_of(id, view, &uri_of)
                    .map(|c| json!({ "agent_uri": uri, "conversations": c }))
            } else {
                dir.contact(id, view, &uri_of)
            }
        })
    });
    match found {
        Some(v) => Json(v).into_response(),
        None => unknown_agent(&uri).response(),
    }
}

async fn collaborators(
    State(im): State<Arc<Im>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    let (service, reader) = match ready(&im, &caller).await {
        Ok(x) => x,
        Err(f) => return f.response(),
    };
    let uri_of = |id: &str| im.ctx.uri_of(id);
    let found = im.with_view(&caller, &reader, |view| {
        service.directory.collaborators(&id, view, &uri_of)
    });
    match found {
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
    /// Who sends (an extension of the seed, whose sender is implicit): an IM agent the
    /// caller registered and that is connected; absent: the caller itself, through its own
    /// session.
    #[serde(default)]
    from: Option<String>,
}

async fn send(
    State(im): State<Arc<Im>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(e) = crate::protocol::json::refuse_lone_surrogate(&body) {
        return error_response(StatusCode::BAD_REQUEST, "invalid_message", &e);
    }
    let body: SendBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "invalid_message",
                &format!("expected {{to, content, conversation_id?, from?}}: {e}"),
            )
        }
    };
    let sending = match &body.from {
        Some(from) if AgentUri::parse(from).is_none() => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "invalid_agent_uri",
                &format!("from `{from}` is not an agent://HOST/ID URI"),
            );
        }
        Some(from) => {
            let from = im.ctx.canonical(from, &headers);
            im.table
                .sender(&from, &caller.subject())
                .map(|client| (client, from))
        }
        None => match im.ctx.caller_session(&caller).await {
            Ok(client) => {
                let me = client
                    .participant_id()
                    .map_or_else(|| caller.name().to_owned(), |p| p.to_string());
                Ok((client, im.ctx.uri_of(&me)))
            }
            Err(e) => Err(Failure::from(e)),
        },
    };
    let (client, from) = match sending {
        Ok(x) => x,
        Err(f) => return f.response(),
    };
    match im
        .deliver(
            &client,
            &from,
            &headers,
            Sending {
                to: &body.to,
                content: &body.content,
                conversation: body.conversation_id.as_deref(),
                trace: crate::gateway::trace::from_headers(&headers).as_ref(),
            },
        )
        .await
    {
        Ok((conversation_id, message_id)) => Json(json!({
            "conversation_id": conversation_id,
            "message_id": message_id,
            "status": "sent",
        }))
        .into_response(),
        Err(f) => f.response(),
    }
}
