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
//! | `GET /.well-known/agent-card.json`, `GET /a2a/.well-known/agent-card.json` | the router's card in the version `A2A-Version` asks for (`card::Shape`), skills = MAP agents; `ETag`, `Last-Modified`, `Cache-Control`, 304 |
//! | `GET /.well-known/agent.json`, `GET /a2a/.well-known/agent.json` | the same, v0.3 |
//! | `GET /a2a/agents/{agentId}/.well-known/agent-card.json` | one agent's card (likewise); `agentId` may be a unique name |
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
//! Every route is built behind one of three gates (`gateway::guard`, [`routes`]): the JSON-RPC
//! routes (refusals as JSON-RPC errors in the version `A2A-Version` asks for, the body up to
//! `[a2a] max_body_bytes`), the router's cards (the credential optional: without one the
//! skills are empty) and the other routes (`{error, code}`, bodies up to
//! [`MAX_REMOTE_BODY_BYTES`]). Before any work, in this order, from the headers alone (each
//! answered at once, the connection closed when a body was left unread): the credential
//! (`Authorization: Bearer` or `X-API-Key`; 401), the caller's own request rate (a token
//! bucket per principal, or per IP without authentication; 429 with `Retry-After`), a JSON
//! `Content-Type` (-32005). Then the body is read with the group's size cap and a deadline
//! (413, 408); the handler checks its nesting before it is parsed (-32600), and its envelope
//! (`rpc.rs`). What MAP would refuse is refused before it is sent (`tasks/`, `limits.rs`).
//!
//! Rooms: `wire.rs` (A2A shapes, both versions), `card.rs`, `rpc.rs` (envelope, method table,
//! handlers), `sse.rs` (streams), `tasks/` (the gateway's MAP sessions and the task
//! translation), `access.rs` (the caller, and who may act on a task), `limits.rs` (every bound
//! the gateway keeps), `recovery.rs` (tasks a restart interrupted),
//! `record.rs` (what a MAP task keeps for A2A, the agent conventions), `feed.rs` (task events to
//! streams), `error.rs` (A2A error codes), `frame.rs` (JSON-RPC response frames), `push.rs`
//! (webhooks), `remote/` (the client side: remote A2A agents registered by card URL, called when
//! MAP agents message them).

pub mod access;
pub mod card;
pub mod error;
pub mod feed;
pub mod frame;
pub mod limits;
pub mod push;
pub mod record;
pub mod recovery;
pub mod remote;
pub mod rpc;
pub mod sse;
pub mod tasks;
pub mod wire;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::{watch, OnceCell};

use crate::auth::Authenticator;
use crate::client::{ClientError, ClientOptions};
use crate::gateway::a2a::access::Caller;
use crate::gateway::a2a::card::{CardContext, Security, Shape};
use crate::gateway::a2a::error::A2aError;
use crate::gateway::a2a::limits::Limits;
use crate::gateway::a2a::remote::{Asker, RegisterError, RemoteSpec, Remotes};
use crate::gateway::a2a::tasks::{Core, Target};
use crate::gateway::a2a::wire::Version;
use crate::gateway::caller::{Accepts, Admission, Caller as Admitted, Refusal};
use crate::gateway::callers::CallerSessions;
use crate::gateway::egress::AllowList;
use crate::gateway::guard::{Access, Gate, Gated, GatedRoutes, Guard, GuardSettings, Refused};
use crate::gateway::wire::closing;
use crate::protocol::methods::session::Principal;
use crate::transport::in_process::InProcessLinks;

/// Largest JSON-RPC body accepted (larger: HTTP 413 with a -32600 error). A2A messages carry
/// files inline as base64, so this is generous; what MAP takes is checked separately
/// (`limits.rs`), also at once.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Largest `POST /a2a/remote` body (`{cardUrl, name?, token?}`).
pub const MAX_REMOTE_BODY_BYTES: usize = 16 * 1024;

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
    /// Where push-notification webhooks may be (empty: push notifications off).
    pub push_allow: AllowList,
    /// Where remote agents registered by request may be (empty: registering by request off).
    pub remote_allow: AllowList,
    /// Remote A2A agents to register at start (`[[a2a.remote]]`).
    pub remotes: Vec<RemoteSpec>,
    /// The gateway's bounds (`limits.rs`).
    pub limits: Limits,
    /// The agent whose card is served at the router's card paths (`[a2a] default_agent`).
    pub default_agent: Option<String>,
    /// `Some(node)` on a cluster's standby (docs/cluster.md, "Gateways on every node"): the
    /// gateway's sessions are node-qualified (`tasks::node_id`), and what only one gateway of
    /// the cluster may do is the live node's: the configured remote agents, the sweep of
    /// tasks a restart interrupted.
    pub node: Option<String>,
    /// Where its gates count their requests (the gateway context's table, shared with MAMP
    /// and IM); `None`: not counted.
    pub traffic: Option<Arc<crate::gateway::traffic::Traffic>>,
}

/// The gateway: its settings, its MAP sessions once opened, and its callers' sessions.
pub struct A2aGateway {
    core: OnceCell<Arc<Core>>,
    /// Callers' MAP sessions: one per principal (the anonymous one with authentication off),
    /// closed after [`crate::gateway::callers::DEFAULT_IDLE`] unused.
    callers: Arc<CallerSessions>,
    settings: Settings,
    shutdown: watch::Receiver<bool>,
    /// Remote A2A agents (the client side).
    remotes: Arc<Remotes>,
    /// The callers' request rates (per principal, or IP) and the body deadline.
    guard: Arc<Guard>,
    /// Who calls (`gateway::caller`): the one check of a credential.
    admission: Admission,
    /// When the gateway was made (Unix ms): tasks last changed before are the previous run's
    /// (`recovery.rs`).
    started: u64,
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
        let callers = CallerSessions::new(links, crate::gateway::callers::DEFAULT_IDLE);
        let remotes = Remotes::new(
            Arc::clone(&callers),
            settings.remote_allow.clone(),
            settings.limits.max_remotes_per_principal,
        );
        if settings.node.is_none() {
            remotes.register_configured(settings.remotes.clone());
        }
        let guard = Arc::new(Guard::new(GuardSettings {
            body_timeout: settings.limits.body_timeout,
            rate: settings.limits.rate,
            traffic: settings.traffic.clone(),
            ..GuardSettings::default()
        }));
        let admission = Admission::new(settings.auth.clone());
        Arc::new(Self {
            core: OnceCell::new(),
            callers,
            settings,
            shutdown,
            remotes,
            guard,
            admission,
            started: recovery::now_ms(),
        })
    }

    /// The remote A2A agents.
    pub fn remotes(&self) -> &Arc<Remotes> {
        &self.remotes
    }

    async fn core(&self) -> Result<&Arc<Core>, A2aError> {
        self.core
            .get_or_try_init(|| {
                Core::start(
                    &self.callers,
                    self.settings.push_allow.clone(),
                    self.settings.limits.clone(),
                    self.started,
                    self.settings.node.as_deref(),
                )
            })
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

    /// Whether `principal` passes every rule (a system principal, or the service's).
    fn is_system(&self, principal: Option<&Principal>) -> bool {
        match principal {
            Some(p) if self.admission.required() => {
                crate::auth::is_service(p) || self.admission.may_be_system(p)
            }
            _ => false,
        }
    }

    /// The gate of one route group (`gateway::guard`): credentials as A2A accepts them
    /// (`Authorization: Bearer` or `X-API-Key`), the callers' buckets, bodies up to `max`,
    /// refusals rendered by `render`.
    fn gate(
        &self,
        access: Access,
        max: usize,
        render: fn(&Refused, &HeaderMap) -> Response,
    ) -> Gate {
        Gate::new(
            self.admission.clone(),
            Arc::clone(&self.guard),
            max,
            Arc::new(render),
        )
        .access(access)
        .accepts(Accepts {
            x_api_key: true,
            ..Accepts::default()
        })
        .exempt_loopback(self.settings.limits.exempt_loopback)
    }

    /// Who asks, for the `/a2a/remote` routes.
    fn asker(&self, principal: Option<Principal>) -> Asker {
        match principal {
            None => Asker::Anyone,
            Some(principal) => Asker::Principal {
                system: self.is_system(Some(&principal)),
                principal,
            },
        }
    }

    /// The admitted caller (the gate's), over its principal's MAP session (opened when it has
    /// none; no principal: authentication off, the shared anonymous session).
    ///
    /// # Errors
    /// MAP refused the session: a quota (`max_sessions_per_principal`) is 429 with the router's
    /// message; anything else 503.
    async fn caller(&self, admitted: &Admitted) -> Result<Caller, A2aError> {
        let principal = admitted.principal.clone();
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
        let system = self.is_system(principal.as_ref());
        Ok(Caller::new(session, principal, system))
    }
}

/// An early answer (from the headers, the body unread) in `v`'s shape: the connection closes
/// after it.
fn early(e: &A2aError, v: Version) -> Response {
    closing(rpc::error_response(None, e, v))
}

/// What the gate's refusal is in A2A's terms.
fn refusal_error(refused: &Refused) -> A2aError {
    match refused {
        Refused::Caller(Refusal::Missing) => unauthenticated(),
        Refused::Caller(Refusal::Refused(why)) => {
            A2aError::invalid_request(format!("credential refused: {why}"))
                .with_status(StatusCode::UNAUTHORIZED)
        }
        Refused::RateLimited { after, rate } => A2aError::caller_rate_limited(*after, *rate),
        Refused::NotJson(found) => A2aError::content_type_not_supported(found.as_deref()),
        Refused::TooLarge { max } => {
            A2aError::too_large(format!("the body is larger than {max} bytes"))
        }
        Refused::Timeout { deadline } => A2aError::invalid_request(format!(
            "the body did not arrive within {} ms",
            deadline.as_millis()
        ))
        .with_status(StatusCode::REQUEST_TIMEOUT),
        Refused::Broken => {
            A2aError::invalid_request("the body broke off").with_status(StatusCode::BAD_REQUEST)
        }
    }
}

/// 401: no credential (authentication on).
fn unauthenticated() -> A2aError {
    A2aError::invalid_request(
        "authentication required: send Authorization: Bearer <JWT or API key>, or X-API-Key (see the agent card's securitySchemes)",
    )
    .with_status(StatusCode::UNAUTHORIZED)
}

/// A refusal of the JSON-RPC routes: a JSON-RPC error in the version `A2A-Version` asks for
/// (none: 0.3), the connection closed.
fn rpc_refusal(refused: &Refused, headers: &HeaderMap) -> Response {
    let shape = rpc::asked_version(headers)
        .ok()
        .flatten()
        .unwrap_or(Version::V03);
    early(&refusal_error(refused), shape)
}

/// A refusal of the other routes: `{error, code}` (a non-JSON body: 415).
fn rest_refusal(refused: &Refused, _: &HeaderMap) -> Response {
    let e = refusal_error(refused);
    if e.status == StatusCode::OK {
        return problem(&e.with_status(StatusCode::UNSUPPORTED_MEDIA_TYPE));
    }
    problem(&e)
}

/// The gateway's routes (merged into the server's), in three gated groups (module docs).
pub fn routes(gateway: Arc<A2aGateway>) -> Gated {
    let g = &gateway;
    let rpc = GatedRoutes::new(
        "a2a rpc",
        g.gate(Access::Required, g.settings.max_body_bytes, rpc_refusal),
    )
    .post("/a2a", rpc_router)
    .post("/a2a/", rpc_router)
    .post("/a2a/agents/{agent}", rpc_agent)
    .post("/a2a/agents/{agent}/", rpc_agent)
    .with_state(Arc::clone(g));
    let cards = GatedRoutes::new(
        "a2a router card",
        g.gate(Access::Optional, MAX_REMOTE_BODY_BYTES, rest_refusal),
    )
    .get("/.well-known/agent-card.json", router_card_v1)
    .get("/.well-known/agent.json", router_card_v03)
    .get("/a2a/.well-known/agent-card.json", router_card_v1)
    .get("/a2a/.well-known/agent.json", router_card_v03)
    .get("/a2a/agents/.well-known/agent-card.json", missing_slash)
    .get("/a2a/agents/.well-known/agent.json", missing_slash)
    .with_state(Arc::clone(g));
    let rest = GatedRoutes::new(
        "a2a",
        g.gate(Access::Required, MAX_REMOTE_BODY_BYTES, rest_refusal),
    )
    .get(
        "/a2a/agents/{agent}/.well-known/agent-card.json",
        agent_card_v1,
    )
    .get("/a2a/agents/{agent}/.well-known/agent.json", agent_card_v03)
    .post("/a2a/remote", remote_register)
    .get("/a2a/remote", remote_list)
    .delete("/a2a/remote/{agent}", remote_unregister)
    .with_state(Arc::clone(g));
    rpc.merge(cards).merge(rest)
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response {
    json_text(status, value.to_string())
}

fn json_text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

fn problem(e: &A2aError) -> Response {
    let mut response = json(
        if e.status == StatusCode::OK {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            e.status
        },
        &serde_json::json!({"error": e.message, "code": e.code}),
    );
    if let Some(v) = e.retry_after.and_then(rpc::retry_after_header) {
        response.headers_mut().insert(header::RETRY_AFTER, v);
    }
    response
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

/// The caller the gate admitted.
type Who = Extension<Admitted>;

/// The card a request to `…/agent-card.json` gets: the version its `A2A-Version` header names;
/// without one, [`Shape::Unasked`].
fn asked_shape(headers: &HeaderMap) -> Shape {
    match rpc::asked_version(headers) {
        Ok(Some(Version::V03)) => Shape::V03,
        Ok(None) => Shape::Unasked,
        Ok(Some(Version::V1)) | Err(_) => Shape::V1,
    }
}

/// How long a card may be cached (`Cache-Control: max-age`, seconds): short, since its skills
/// follow the agents that come and go.
pub const CARD_MAX_AGE: u32 = 60;

/// When each card text (by its ETag) was first served: its `Last-Modified`. Bounded: cleared
/// when it holds [`CARD_DATES`] entries.
static CARD_SEEN: std::sync::Mutex<Option<std::collections::HashMap<String, u64>>> =
    std::sync::Mutex::new(None);

/// Most card texts whose first-served time is kept.
const CARD_DATES: usize = 1024;

/// A card answer: `ETag` (a hash of its bytes), `Last-Modified` (when this text was first
/// served), `Cache-Control` (`private` when the card depends on the caller's credential),
/// `Vary`; and `304 Not Modified` when `If-None-Match` names its ETag.
fn card_response(g: &A2aGateway, headers: &HeaderMap, card: &serde_json::Value) -> Response {
    use sha2::Digest;
    let body = card.to_string();
    let digest = sha2::Sha256::digest(body.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let etag = format!("\"{hex}\"");
    let first_seen = {
        let mut seen = crate::sync::lock(&CARD_SEEN);
        let map = seen.get_or_insert_with(std::collections::HashMap::new);
        if map.len() >= CARD_DATES && !map.contains_key(&etag) {
            map.clear();
        }
        *map.entry(etag.clone())
            .or_insert_with(crate::protocol::ids::now_ms)
    };
    let cache = if g.settings.auth.is_some() {
        format!("private, max-age={CARD_MAX_AGE}")
    } else {
        format!("public, max-age={CARD_MAX_AGE}")
    };
    let matches = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == etag);
    let mut response = if matches {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        json_text(StatusCode::OK, body)
    };
    let h = response.headers_mut();
    for (name, value) in [
        (header::ETAG, etag),
        (header::CACHE_CONTROL, cache),
        (header::LAST_MODIFIED, card::http_date(first_seen)),
        (
            header::VARY,
            "A2A-Version, Authorization, X-API-Key".to_owned(),
        ),
    ] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    }
    response
}

async fn router_card(
    g: &A2aGateway,
    headers: &HeaderMap,
    who: &Admitted,
    shape: Shape,
) -> Response {
    // Single-agent mode: the host's card is that agent's (as the caller may see it: an agent
    // the caller may not see is 404, as at its own card path).
    if let Some(id) = &g.settings.default_agent {
        return agent_card(g, id, headers, who, shape).await;
    }
    // With authentication on, the skills are the agents the caller may see: none for a caller
    // without a credential (the card still says how to authenticate).
    let agents = if g.admission.required() && who.principal.is_none() {
        Ok(Vec::new())
    } else {
        match g.caller(who).await {
            Ok(caller) => match g.core().await {
                Ok(core) => core.agents(caller.session()).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    };
    match agents {
        Ok(agents) => card_response(
            g,
            headers,
            &card::router_card(&g.card_context(headers), &agents, shape),
        ),
        Err(e) => problem(&e),
    }
}

async fn router_card_v1(
    State(g): State<Arc<A2aGateway>>,
    Extension(who): Who,
    headers: HeaderMap,
) -> Response {
    router_card(&g, &headers, &who, asked_shape(&headers)).await
}

async fn router_card_v03(
    State(g): State<Arc<A2aGateway>>,
    Extension(who): Who,
    headers: HeaderMap,
) -> Response {
    router_card(&g, &headers, &who, Shape::V03).await
}

async fn agent_card(
    g: &A2aGateway,
    id: &str,
    headers: &HeaderMap,
    who: &Admitted,
    shape: Shape,
) -> Response {
    // The router's card in single-agent mode is gated with the credential optional.
    if g.admission.required() && who.principal.is_none() {
        return problem(&unauthenticated());
    }
    let agent = match g.caller(who).await {
        Ok(caller) => match g.core().await {
            Ok(core) => core.resolve(caller.session(), id).await,
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    match agent {
        Ok(agent) => card_response(
            g,
            headers,
            &card::agent_card(&g.card_context(headers), &agent, shape),
        ),
        Err(e) => problem(&e),
    }
}

async fn agent_card_v1(
    State(g): State<Arc<A2aGateway>>,
    Path(id): Path<String>,
    Extension(who): Who,
    headers: HeaderMap,
) -> Response {
    agent_card(&g, &id, &headers, &who, asked_shape(&headers)).await
}

async fn agent_card_v03(
    State(g): State<Arc<A2aGateway>>,
    Path(id): Path<String>,
    Extension(who): Who,
    headers: HeaderMap,
) -> Response {
    agent_card(&g, &id, &headers, &who, Shape::V03).await
}

async fn rpc_router(
    State(g): State<Arc<A2aGateway>>,
    Extension(who): Who,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    rpc(&g, None, &who, &headers, &body).await
}

async fn rpc_agent(
    State(g): State<Arc<A2aGateway>>,
    Path(id): Path<String>,
    Extension(who): Who,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    rpc(&g, Some(id), &who, &headers, &body).await
}

async fn rpc(
    g: &A2aGateway,
    agent: Option<String>,
    who: &Admitted,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Response {
    // The shape of the errors before the method is known: the header's version (none: 0.3).
    let asked = rpc::asked_version(headers);
    let shape = asked
        .as_ref()
        .ok()
        .copied()
        .flatten()
        .unwrap_or(Version::V03);
    // The gate answered an unauthenticated, flooding, non-JSON or oversize caller before the
    // body was read or a MAP session opened (module docs).
    let request = match rpc::read(bytes, g.settings.limits.max_depth) {
        Ok(r) => r,
        Err((id, e)) => return rpc::error_response(id.as_deref(), &e, shape),
    };
    let v = request.version;
    if let Err(e) = asked {
        return rpc::error_response(Some(&request.id), &e, v);
    }
    let core = match g.core().await {
        Ok(c) => c,
        Err(e) => return rpc::error_response(Some(&request.id), &e, v),
    };
    let caller = match g.caller(who).await {
        Ok(c) => c.making(request.name, crate::gateway::trace::from_headers(headers)),
        Err(e) => return rpc::error_response(Some(&request.id), &e, v),
    };
    let target = match agent {
        None => Target::Router,
        Some(id) => match core
            .target(caller.session(), &id, request.method.is_about_one_task())
            .await
        {
            Ok(t) => t,
            Err(e) => return rpc::error_response(Some(&request.id), &e, v),
        },
    };
    rpc::handle(core, &caller, &target, request, g.shutdown.clone()).await
}

/// `POST /a2a/remote {cardUrl, name?, token?}`: registers a remote A2A agent as a MAP agent,
/// owned by the caller's principal. 201 `{agent, remote}`; 400 a bad body or URL; 403 a URL
/// outside `[a2a] remote_allow` (or registering by request off); 409 a taken id; 429 a cap;
/// 502 an unreachable or unusable card; 503 MAP refused.
async fn remote_register(
    State(g): State<Arc<A2aGateway>>,
    Extension(who): Who,
    bytes: Bytes,
) -> Response {
    let principal = who.principal;
    let spec: RemoteSpec = match serde_json::from_slice(&bytes) {
        Ok(s) => s,
        Err(e) => {
            return problem(
                &A2aError::invalid_params(format!("expected {{cardUrl, name?, token?}}: {e}"))
                    .with_status(StatusCode::BAD_REQUEST),
            )
        }
    };
    match g.remotes.register(spec, g.asker(principal)).await {
        Ok((remote, agent)) => json(
            StatusCode::CREATED,
            &serde_json::json!({ "agent": agent, "remote": remote.describe() }),
        ),
        Err(e) => {
            let status = match &e {
                RegisterError::Invalid(_) => StatusCode::BAD_REQUEST,
                RegisterError::NotAllowed(_) => StatusCode::FORBIDDEN,
                RegisterError::Taken(_) => StatusCode::CONFLICT,
                RegisterError::Quota(_) => StatusCode::TOO_MANY_REQUESTS,
                RegisterError::Unreachable(_) | RegisterError::Card { .. } => {
                    StatusCode::BAD_GATEWAY
                }
                RegisterError::Map(_) => StatusCode::SERVICE_UNAVAILABLE,
            };
            json(
                status,
                &serde_json::json!({ "error": e.to_string(), "code": status.as_u16() }),
            )
        }
    }
}

/// `GET /a2a/remote`: `{remotes: [{agentId, cardUrl, name, url, protocolVersion, streaming,
/// owner?}]}`, the caller's own (every one for a system principal, or with authentication
/// off).
async fn remote_list(State(g): State<Arc<A2aGateway>>, Extension(who): Who) -> Response {
    let principal = who.principal;
    let remotes: Vec<serde_json::Value> = g
        .remotes
        .list(&g.asker(principal))
        .iter()
        .map(|r| r.describe())
        .collect();
    json(StatusCode::OK, &serde_json::json!({ "remotes": remotes }))
}

/// `DELETE /a2a/remote/{agentId}`: unregisters it (its calls stop, its MAP session closes). 200,
/// or 404 (also for another principal's remote, unless the caller is a system principal).
async fn remote_unregister(
    State(g): State<Arc<A2aGateway>>,
    Path(id): Path<String>,
    Extension(who): Who,
) -> Response {
    let principal = who.principal;
    if g.remotes.unregister(&id, &g.asker(principal)).await {
        json(StatusCode::OK, &serde_json::json!({ "unregistered": id }))
    } else {
        json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({ "error": format!("no remote agent {id}"), "code": 404 }),
        )
    }
}
