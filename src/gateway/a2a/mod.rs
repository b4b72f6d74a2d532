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
//! Rooms: `wire.rs` (A2A shapes, both versions), `card.rs`, `rpc.rs` (envelope, method table,
//! handlers), `sse.rs` (streams), `tasks.rs` (the MAP session and the task translation),
//! `record.rs` (what a MAP task keeps for A2A, the agent conventions), `feed.rs` (task events to
//! streams), `error.rs` (A2A error codes), `frame.rs` (JSON-RPC response frames), `push.rs`
//! (webhooks), `remote/` (the client side: remote A2A agents registered by card URL, called when
//! MAP agents message them).

pub mod card;
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

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router as HttpRouter;
use tokio::sync::{watch, OnceCell};

use crate::auth::Authenticator;
use crate::client::{Client, ClientOptions, ConnectionState};
use crate::gateway::a2a::card::{CardContext, Security};
use crate::gateway::a2a::error::A2aError;
use crate::gateway::a2a::remote::{RegisterError, RemoteSpec, Remotes};
use crate::gateway::a2a::tasks::{Core, Target};
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

/// Callers' MAP sessions kept at most (authentication on). Past this, all are closed and the
/// next requests open new ones: a bound on memory, not a cache policy worth tuning.
pub const MAX_CALLER_SESSIONS: usize = 256;

/// The gateway: its settings, and its MAP session once opened.
pub struct A2aGateway {
    links: Arc<dyn InProcessLinks + Send + Sync>,
    core: OnceCell<Arc<Core>>,
    /// Callers' MAP sessions by credential (authentication on). NB: a std mutex, never held
    /// across an await.
    callers: std::sync::Mutex<HashMap<String, Client>>,
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
        Arc::new(Self {
            links,
            core: OnceCell::new(),
            callers: std::sync::Mutex::new(HashMap::new()),
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
                    "the A2A gateway could not open its MAP session: {e} (with [auth] on, the gateway connects in-process: add \"in-process\" to auth.trusted_transports)"
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

    /// Whose eyes a request reads through: the gateway's session when authentication is off;
    /// else the caller's own MAP session, opened in-process with the caller's credential (so the
    /// router applies that principal's permissions) and kept for the next request with the same
    /// credential. `Ok(None)`: authentication is on and the request carries no credential.
    ///
    /// # Errors
    /// 401 for a refused credential; the MAP session could not be opened.
    async fn viewer(&self, core: &Core, headers: &HeaderMap) -> Result<Option<Client>, A2aError> {
        let Some(auth) = &self.settings.auth else {
            return Ok(Some(core.client().clone()));
        };
        let Some(secret) = credential(headers) else {
            return Ok(None);
        };
        // NB: checked here first, so a refused credential costs no MAP session.
        verify(auth, secret)?;
        let cached = self
            .callers
            .lock()
            .ok()
            .and_then(|c| c.get(secret).cloned())
            .filter(|c| c.state() == ConnectionState::Connected);
        if let Some(client) = cached {
            return Ok(Some(client));
        }
        let client = Client::in_process(
            &*self.links,
            ClientOptions::new().name("a2a-caller").bearer_token(secret),
        )
        .await
        .map_err(|e| A2aError::from_map(&e, None))?;
        if let Ok(mut c) = self.callers.lock() {
            if c.len() >= MAX_CALLER_SESSIONS {
                c.clear();
            }
            c.insert(secret.to_owned(), client.clone());
        }
        Ok(Some(client))
    }

    /// With authentication on, the request's credential must be one the router accepts (401
    /// otherwise); used by the routes that open no session of the caller's (`/a2a/remote`).
    fn authenticate(&self, headers: &HeaderMap) -> Result<(), A2aError> {
        let Some(auth) = &self.settings.auth else {
            return Ok(());
        };
        let secret = credential(headers).ok_or_else(|| {
            A2aError::invalid_request(
                "authentication required: send Authorization: Bearer <JWT or API key> (see the agent card's securitySchemes)",
            )
            .with_status(StatusCode::UNAUTHORIZED)
        })?;
        verify(auth, secret)
    }

    /// As [`A2aGateway::viewer`], but a missing credential is 401.
    async fn caller(&self, core: &Core, headers: &HeaderMap) -> Result<Client, A2aError> {
        self.viewer(core, headers).await?.ok_or_else(|| {
            A2aError::invalid_request(
                "authentication required: send Authorization: Bearer <JWT or API key>, or X-API-Key (see the router card's securitySchemes)",
            )
            .with_status(StatusCode::UNAUTHORIZED)
        })
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

/// 401 for a credential the router refuses.
fn verify(auth: &Authenticator, secret: &str) -> Result<(), A2aError> {
    auth.verify_bearer(secret).map(drop).map_err(|e| {
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
    let agents = match g.viewer(core, headers).await {
        Ok(Some(viewer)) => core.agents(&viewer).await,
        Ok(None) => Ok(Vec::new()),
        Err(e) => Err(e),
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
    let agent = match g.caller(core, headers).await {
        Ok(viewer) => core.resolve(&viewer, id).await,
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
    let bytes = match axum::body::to_bytes(body, g.settings.max_body_bytes).await {
        Ok(b) => b,
        Err(_) => {
            let e = A2aError::invalid_request(format!(
                "the body is larger than {} bytes",
                g.settings.max_body_bytes
            ))
            .with_status(StatusCode::PAYLOAD_TOO_LARGE);
            return rpc::error_response(None, &e);
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
    let viewer = match g.caller(core, headers).await {
        Ok(v) => v,
        Err(e) => return rpc::error_response(Some(&request.id), &e),
    };
    let target = match agent {
        None => Target::Router,
        Some(id) => match core.resolve(&viewer, &id).await {
            Ok(a) => Target::Agent(Box::new(a)),
            Err(e) => return rpc::error_response(Some(&request.id), &e),
        },
    };
    rpc::handle(core, &viewer, &target, request, g.shutdown.clone()).await
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
