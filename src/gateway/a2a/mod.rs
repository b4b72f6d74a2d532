//! The A2A gateway: A2A clients (`@a2a-js/sdk`, `a2a-sdk`) reach MAP agents through the
//! router, each MAP agent appearing as one A2A agent.
//!
//! Owns: the HTTP routes (fixed by `docs/spec`'s gateways page; `docs/a2a.md` describes them)
//! and [`A2aGateway`], which opens the gateway's MAP session on first use. It is a translator
//! outside the router core: it speaks to the router only as an ordinary in-process MAP
//! participant, so everything it does is in the event log, obeys permissions and is visible
//! to MAP subscribers; the router knows nothing of A2A.
//!
//! | route | what |
//! |---|---|
//! | `GET /.well-known/agent-card.json`, `GET /a2a/.well-known/agent-card.json` | the router's card (v1.0), skills = MAP agents |
//! | `GET /.well-known/agent.json`, `GET /a2a/.well-known/agent.json` | the same, v0.3 |
//! | `GET /a2a/agents/{agentId}/.well-known/agent-card.json` | one agent's card (v1.0); `agentId` may be a unique name |
//! | `GET /a2a/agents/{agentId}/.well-known/agent.json` | the same, v0.3 |
//! | `POST /a2a/agents/{agentId}` | JSON-RPC, v1.0 and v0.3 method names |
//! | `POST /a2a` | JSON-RPC for the tasks of every agent (follow-ups, get, list, cancel, subscribe) |
//! | `POST /a2a/remote`, `GET /a2a/remote`, `DELETE /a2a/remote/{agentId}` | remote A2A agents as MAP agents (`remote/`) |
//!
//! Callers act as themselves: each request's credential is verified first (401 before the body
//! is read), and the gateway acts for the caller through that principal's own MAP session
//! (`gateway::callers::CallerSessions`: one per principal, closed when idle), so its grants,
//! visibility, quotas and rate apply; `access.rs` says who may act on which task.
//!
//! Rooms: `wire.rs` (A2A shapes, both versions), `card.rs`, `rpc.rs` (envelope, method table,
//! handlers), `sse.rs` (streams), `tasks.rs` (the gateway's MAP sessions and the task
//! translation), `access.rs` (the caller, and who may act on a task),
//! `record.rs` (what a MAP task keeps for A2A, the agent conventions), `feed.rs` (task events to
//! streams), `error.rs` (A2A error codes), `frame.rs` (JSON-RPC response frames), `push.rs`
//! (webhooks), `remote/` (the client side: remote A2A agents registered by card URL, called when
//! MAP agents message them).

pub mod access;
pub mod card;
pub mod egress;
pub mod error;
pub mod feed;
pub mod frame;
pub mod push;
pub mod record;
pub mod remote;
pub mod rpc;
pub mod sse;
pub mod tasks;
pub mod wire;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router as HttpRouter;
use tokio::sync::{watch, OnceCell};

use crate::auth::Authenticator;
use crate::client::{ClientError, ClientOptions};
use crate::gateway::a2a::access::Caller;
use crate::gateway::a2a::card::{CardContext, Security};
use crate::gateway::a2a::error::A2aError;
use crate::gateway::a2a::remote::{RegisterError, RemoteSpec, Remotes};
use crate::gateway::a2a::tasks::{Core, Target};
use crate::gateway::callers::CallerSessions;
use crate::gateway::wire::closing;
use crate::protocol::methods::session::Principal;
use crate::transport::in_process::InProcessLinks;

/// Largest JSON-RPC body accepted (larger: HTTP 413 with a -32600 error). A2A messages carry
/// files inline as base64, so this is generous; MAP frames are capped separately.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// What the gateway needs to know about the server it runs in.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The router's name (cards).
    pub router_name: String,
    /// Whether the listener serves TLS (card URLs say `https://`).
    pub tls: bool,
    /// Body limit of a JSON-RPC request.
    pub max_body_bytes: usize,
    /// When set, every JSON-RPC call must carry a credential this authenticator accepts
    /// (`Authorization: Bearer <JWT or API key>`, or `X-API-Key: <key>`), and the cards say so.
    pub auth: Option<Arc<Authenticator>>,
    /// What the cards announce.
    pub security: Security,
    /// URL prefixes push-notification webhooks may have (empty: push notifications off).
    pub push_allow: Vec<String>,
    /// Remote A2A agents to register at start (`[[a2a.remote]]`).
    pub remotes: Vec<RemoteSpec>,
}

/// The gateway: its settings, its MAP sessions once opened, and its callers' sessions.
pub struct A2aGateway {
    links: Arc<dyn InProcessLinks + Send + Sync>,
    core: OnceCell<Arc<Core>>,
    /// Callers' MAP sessions: one per principal (the anonymous one with authentication off),
    /// closed after [`crate::gateway::callers::DEFAULT_IDLE`] unused.
    callers: Arc<CallerSessions>,
    settings: Settings,
    shutdown: watch::Receiver<bool>,
    /// Remote A2A agents (the client side).
    remotes: Arc<Remotes>,
}

impl std::fmt::Debug for A2aGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("A2aGateway")
            .field("settings", &self.settings)
            .field("started", &self.core.initialized())
            .finish_non_exhaustive()
    }
}

impl A2aGateway {
    /// A gateway that will open its MAP session through `links` on first use (so a router
    /// that no A2A client calls carries no gateway agent). `shutdown` ends its streams.
    pub fn new(
        links: Arc<dyn InProcessLinks + Send + Sync>,
        settings: Settings,
        shutdown: watch::Receiver<bool>,
    ) -> Arc<Self> {
        let remotes = Remotes::new(Arc::clone(&links));
        remotes.register_configured(settings.remotes.clone());
        let callers =
            CallerSessions::new(Arc::clone(&links), crate::gateway::callers::DEFAULT_IDLE);
        Arc::new(Self {
            links,
            core: OnceCell::new(),
            callers,
            settings,
            shutdown,
            remotes,
        })
    }

    /// The remote A2A agents.
    pub fn remotes(&self) -> &Arc<Remotes> {
        &self.remotes
    }

    async fn core(&self) -> Result<&Arc<Core>, A2aError> {
        self.core
            .get_or_try_init(|| Core::start(&*self.links, self.settings.push_allow.clone()))
            .await
            .map_err(|e| {
                A2aError::internal(format!(
                    "the A2A gateway could not open its MAP sessions: {e}"
                ))
                .with_status(StatusCode::SERVICE_UNAVAILABLE)
            })
    }

    fn card_context(&self, headers: &HeaderMap) -> CardContext {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .filter(|h| !h.is_empty() && !h.contains(['/', ' ', '"']))
            .unwrap_or("localhost");
        let scheme = if self.settings.tls { "https" } else { "http" };
        CardContext {
            base: format!("{scheme}://{host}"),
            router_name: self.settings.router_name.clone(),
            security: self.settings.security,
            push: !self.settings.push_allow.is_empty(),
        }
    }

    /// Who calls: `Ok(None)` with authentication off (every caller is anonymous, as every MAP
    /// participant is then); else the principal of the request's credential. Reads headers
    /// only, so it answers before the body is read.
    ///
    /// # Errors
    /// 401 for a missing or refused credential (authentication on).
    fn principal(&self, headers: &HeaderMap) -> Result<Option<Principal>, A2aError> {
        let Some(auth) = &self.settings.auth else {
            return Ok(None);
        };
        let secret = credential(headers).ok_or_else(|| {
            A2aError::invalid_request(
                "authentication required: send Authorization: Bearer <JWT or API key>, or X-API-Key (see the agent card's securitySchemes)",
            )
            .with_status(StatusCode::UNAUTHORIZED)
        })?;
        verify(auth, secret).map(Some)
    }

    /// With authentication on, the request's credential must be one the router accepts (401
    /// otherwise); used by the routes that open no session of the caller's (`/a2a/remote`).
    fn authenticate(&self, headers: &HeaderMap) -> Result<(), A2aError> {
        self.principal(headers).map(drop)
    }

    /// The caller with `principal`, over its principal's MAP session (opened when it has none;
    /// `None`: authentication off, the shared anonymous session).
    ///
    /// # Errors
    /// MAP refused the session: a quota (`max_sessions_per_principal`) is 429 with the router's
    /// message; anything else 503.
    async fn caller(&self, principal: Option<Principal>) -> Result<Caller, A2aError> {
        let session = self
            .callers
            .get(principal.as_ref(), || {
                ClientOptions::new()
                    .name("a2a-caller")
                    .request_timeout(std::time::Duration::from_secs(30))
            })
            .await
            .map_err(|e| match e {
                ClientError::Rpc { .. } if e.code().is_some_and(|c| c.0 == 4001 || c.0 == 4002) => {
                    A2aError::from_map(&e, None)
                }
                e => {
                    A2aError::internal(format!("the router refused the caller's MAP session: {e}"))
                        .with_status(StatusCode::SERVICE_UNAVAILABLE)
                }
            })?;
        let system = match (&self.settings.auth, &principal) {
            (Some(auth), Some(p)) => crate::auth::is_service(p) || auth.may_be_system(&p.id),
            _ => false,
        };
        Ok(Caller::new(session, principal, system))
    }

    /// The caller of a request: [`A2aGateway::principal`], then [`A2aGateway::caller`].
    ///
    /// # Errors
    /// As those.
    async fn caller_of(&self, headers: &HeaderMap) -> Result<Caller, A2aError> {
        let principal = self.principal(headers)?;
        self.caller(principal).await
    }
}

/// The credential a request carries: `Authorization: Bearer <token>` or `X-API-Key`.
fn credential(headers: &HeaderMap) -> Option<&str> {
    crate::gateway::wire::bearer(headers)
        .or_else(|| {
            headers
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
        })
        .filter(|s| !s.is_empty())
}

/// The principal of a credential; 401 for one the router refuses.
fn verify(auth: &Authenticator, secret: &str) -> Result<Principal, A2aError> {
    auth.verify_bearer(secret).map_err(|e| {
        A2aError::invalid_request(format!("credential refused: {}", e.message))
            .with_status(StatusCode::UNAUTHORIZED)
    })
}

/// The gateway's routes (merged into the server's).
pub fn routes(gateway: Arc<A2aGateway>) -> HttpRouter {
    let limit = gateway.settings.max_body_bytes;
    HttpRouter::new()
        .route("/.well-known/agent-card.json", get(router_card_v1))
        .route("/.well-known/agent.json", get(router_card_v03))
        .route("/a2a/.well-known/agent-card.json", get(router_card_v1))
        .route("/a2a/.well-known/agent.json", get(router_card_v03))
        .route("/a2a", post(rpc_router))
        .route("/a2a/", post(rpc_router))
        .route(
            "/a2a/agents/{agent}/.well-known/agent-card.json",
            get(agent_card_v1),
        )
        .route(
            "/a2a/agents/{agent}/.well-known/agent.json",
            get(agent_card_v03),
        )
        .route(
            "/a2a/agents/.well-known/agent-card.json",
            get(missing_slash),
        )
        .route("/a2a/agents/.well-known/agent.json", get(missing_slash))
        .route("/a2a/remote", post(remote_register).get(remote_list))
        .route("/a2a/remote/{agent}", delete(remote_unregister))
        .route("/a2a/agents/{agent}", post(rpc_agent))
        .route("/a2a/agents/{agent}/", post(rpc_agent))
        // NB: we read the body ourselves, with our limit, and answer 413 as JSON-RPC.
        .layer(axum::extract::DefaultBodyLimit::max(
            limit.saturating_add(1),
        ))
        .with_state(gateway)
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        value.to_string(),
    )
        .into_response()
}

fn problem(e: &A2aError) -> Response {
    json(
        if e.status == StatusCode::OK {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            e.status
        },
        &serde_json::json!({"error": e.message, "code": e.code}),
    )
}

/// Where `ClientFactory.createFromUrl("…/a2a/agents/<id>")` (no trailing slash) looks: URL
/// resolution replaces the last segment, so the agent is lost. Say how to fix it.
async fn missing_slash() -> Response {
    json(
        StatusCode::NOT_FOUND,
        &serde_json::json!({
            "error": "no agent named in the path: give the agent's base URL with a trailing slash, http://<host>/a2a/agents/<agentId>/ (the card path .well-known/agent-card.json is resolved against it)",
        }),
    )
}

async fn router_card(g: &A2aGateway, headers: &HeaderMap, legacy: bool) -> Response {
    let core = match g.core().await {
        Ok(c) => c,
        Err(e) => return problem(&e),
    };
    // With authentication on, the skills are the agents the caller may see: none for a caller
    // without a credential (the card still says how to authenticate).
    let agents = if g.settings.auth.is_some() && credential(headers).is_none() {
        Ok(Vec::new())
    } else {
        match g.caller_of(headers).await {
            Ok(caller) => core.agents(caller.session()).await,
            Err(e) => Err(e),
        }
    };
    match agents {
        Ok(agents) => json(
            StatusCode::OK,
            &card::router_card(&g.card_context(headers), &agents, legacy),
        ),
        Err(e) => problem(&e),
    }
}

async fn router_card_v1(State(g): State<Arc<A2aGateway>>, headers: HeaderMap) -> Response {
    router_card(&g, &headers, false).await
}

async fn router_card_v03(State(g): State<Arc<A2aGateway>>, headers: HeaderMap) -> Response {
    router_card(&g, &headers, true).await
}

async fn agent_card(g: &A2aGateway, id: &str, headers: &HeaderMap, legacy: bool) -> Response {
    let core = match g.core().await {
        Ok(c) => c,
        Err(e) => return problem(&e),
    };
    let agent = match g.caller_of(headers).await {
        Ok(caller) => core.resolve(caller.session(), id).await,
        Err(e) => Err(e),
    };
    match agent {
        Ok(agent) => json(
            StatusCode::OK,
            &card::agent_card(&g.card_context(headers), &agent, legacy),
        ),
        Err(e) => problem(&e),
    }
}

async fn agent_card_v1(
    State(g): State<Arc<A2aGateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    agent_card(&g, &id, &headers, false).await
}

async fn agent_card_v03(
    State(g): State<Arc<A2aGateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    agent_card(&g, &id, &headers, true).await
}

async fn rpc_router(State(g): State<Arc<A2aGateway>>, headers: HeaderMap, body: Body) -> Response {
    rpc(&g, None, &headers, body).await
}

async fn rpc_agent(
    State(g): State<Arc<A2aGateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    rpc(&g, Some(id), &headers, body).await
}

async fn rpc(g: &A2aGateway, agent: Option<String>, headers: &HeaderMap, body: Body) -> Response {
    // NB: the credential first, from the headers alone: an unauthenticated caller costs no body
    // read and no MAP session. The connection closes after such an early answer, since its
    // body was not read.
    let principal = match g.principal(headers) {
        Ok(p) => p,
        Err(e) => return closing(rpc::error_response(None, &e)),
    };
    let bytes = match axum::body::to_bytes(body, g.settings.max_body_bytes).await {
        Ok(b) => b,
        Err(_) => {
            let e = A2aError::invalid_request(format!(
                "the body is larger than {} bytes",
                g.settings.max_body_bytes
            ))
            .with_status(StatusCode::PAYLOAD_TOO_LARGE);
            return closing(rpc::error_response(None, &e));
        }
    };
    let request = match rpc::read(&bytes) {
        Ok(r) => r,
        Err((id, e)) => return rpc::error_response(id.as_deref(), &e),
    };
    let core = match g.core().await {
        Ok(c) => c,
        Err(e) => return rpc::error_response(Some(&request.id), &e),
    };
    let caller = match g.caller(principal).await {
        Ok(c) => c,
        Err(e) => return rpc::error_response(Some(&request.id), &e),
    };
    let target = match agent {
        None => Target::Router,
        Some(id) => match core.resolve(caller.session(), &id).await {
            Ok(a) => Target::Agent(Box::new(a)),
            Err(e) => return rpc::error_response(Some(&request.id), &e),
        },
    };
    rpc::handle(core, &caller, &target, request, g.shutdown.clone()).await
}

/// `POST /a2a/remote {cardUrl, name?, token?}`: registers a remote A2A agent as a MAP agent.
/// 201 `{agent, remote}`; 400 a bad body or URL; 409 a taken id; 502 an unusable card; 503 MAP
/// refused.
async fn remote_register(
    State(g): State<Arc<A2aGateway>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(e) = g.authenticate(&headers) {
        return problem(&e);
    }
    let bytes = match axum::body::to_bytes(body, 64 * 1024).await {
        Ok(b) => b,
        Err(_) => {
            return problem(
                &A2aError::invalid_request("the body is too large")
                    .with_status(StatusCode::PAYLOAD_TOO_LARGE),
            )
        }
    };
    let spec: RemoteSpec = match serde_json::from_slice(&bytes) {
        Ok(s) => s,
        Err(e) => {
            return problem(
                &A2aError::invalid_params(format!("expected {{cardUrl, name?, token?}}: {e}"))
                    .with_status(StatusCode::BAD_REQUEST),
            )
        }
    };
    match g.remotes.register(spec).await {
        Ok((remote, agent)) => json(
            StatusCode::CREATED,
            &serde_json::json!({ "agent": agent, "remote": remote.describe() }),
        ),
        Err(e) => {
            let status = match &e {
                RegisterError::Invalid(_) => StatusCode::BAD_REQUEST,
                RegisterError::Taken(_) => StatusCode::CONFLICT,
                RegisterError::Card { .. } => StatusCode::BAD_GATEWAY,
                RegisterError::Map(_) => StatusCode::SERVICE_UNAVAILABLE,
            };
            json(
                status,
                &serde_json::json!({ "error": e.to_string(), "code": status.as_u16() }),
            )
        }
    }
}

/// `GET /a2a/remote`: `{remotes: [{agentId, cardUrl, name, url, protocolVersion, streaming}]}`.
async fn remote_list(State(g): State<Arc<A2aGateway>>, headers: HeaderMap) -> Response {
    if let Err(e) = g.authenticate(&headers) {
        return problem(&e);
    }
    let remotes: Vec<serde_json::Value> = g.remotes.list().iter().map(|r| r.describe()).collect();
    json(StatusCode::OK, &serde_json::json!({ "remotes": remotes }))
}

/// `DELETE /a2a/remote/{agentId}`: unregisters it (its MAP session closes). 200, or 404.
async fn remote_unregister(
    State(g): State<Arc<A2aGateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = g.authenticate(&headers) {
        return problem(&e);
    }
    if g.remotes.unregister(&id).await {
        json(StatusCode::OK, &serde_json::json!({ "unregistered": id }))
    } else {
        json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({ "error": format!("no remote agent {id}"), "code": 404 }),
        )
    }
}
