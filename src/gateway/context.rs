//! [`GatewayContext`]: what both gateways share at run time: settings, authentication, the
//! in-process links, the callers' sessions, the peer table, and the service sessions with
//! their read model.
//!
//! Every MAP session the MAMP and IM gateways open is somebody's (docs/gateways.md,
//! "Identity"): a caller's ([`GatewayContext::caller_session`], one per principal, or one
//! opened as its principal for an IM connection or an outside sender), or the router's
//! service principal's for the gateways' own bookkeeping (the read model, the public view,
//! configured remote agents), which no participant can connect as, register under or exhaust.
//! Never the `in-process` transport's shared principal.
//!
//! Every HTTP request is admitted and limited first by its route group's gate
//! ([`GatewayContext::gate`] over the shared [`Guard`], `guard.rs`): the caller's credential
//! (the one [`Admission`]), its rate budget (one bucket per principal, or per address without
//! authentication), a JSON body within the group's size and the body deadline, before any MAP
//! call; IM frames and AIP calls spend the same buckets ([`GatewayContext::check_rate`]). The
//! limits a message must fit to be deliverable at all are the router's own ([`RouterFacts`]):
//! what the gateways accept they can deliver. Every MAP session is opened by the one opener,
//! [`CallerSessions`] (`callers.rs`).
//!
//! **One URI per agent.** Our agents' canonical URI is `agent://<host>/<id>` with
//! [`GatewayContext::host`]; [`GatewayContext::local_id`] is the one rule of which URIs name
//! our agents (the domain, the default host or the request's `Host`, each with or without one
//! of our listening ports), used by every route and frame.
//!
//! Must not hold routing state: who is registered, online or in which conversation is the
//! router's (read through MAP calls and the event log, `directory.rs`).

use std::sync::{Arc, Mutex, OnceLock};

use axum::http::{header, HeaderMap, StatusCode};
use tokio::sync::OnceCell;

use crate::auth::Authenticator;
use crate::client::{Client, ClientError, ClientOptions};
use crate::gateway::caller::{Accepts, Admission, Caller, CallerKey, Refusal};
use crate::gateway::callers::CallerSessions;
use crate::gateway::config::{GatewaySettings, RouterFacts, ENVELOPE_ROOM};
use crate::gateway::directory::Directory;
use crate::gateway::guard::{Access, Gate, GatedRoute, Guard, GuardSettings, Refused, Render};
use crate::gateway::im::table::ImTable;
use crate::gateway::peer_table::PeerTable;
use crate::gateway::threads::Threads;
use crate::gateway::traffic::Traffic;
use crate::gateway::wire::{closing, error_response, AgentUri, Failure, GatewayError};
use crate::protocol::agent::Agent;
use crate::protocol::capabilities::{Capability, ParticipantType};
use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::methods::session::Principal;
use crate::transport::in_process::InProcessLinks;

/// Everything a gateway needs, shared by its routes and tasks.
pub struct GatewayContext {
    /// `[gateways]`.
    pub settings: GatewaySettings,
    /// The router's authenticator (`None`: authentication off).
    pub auth: Option<Arc<Authenticator>>,
    /// The one admission of callers over it (`caller.rs`): MAMP, IM and AIP credentials are
    /// verified there, as A2A's and `GET /metrics`'s.
    pub admission: Admission,
    /// The router's name (the router card's `name`).
    pub router_name: String,
    /// The host of our `agent://` URIs when `[gateways] domain` is unset (the first listen
    /// address, else the router name).
    pub default_host: String,
    /// Opens in-process MAP connections (the server).
    links: Arc<dyn InProcessLinks + Send + Sync>,
    /// The service sessions and the read model, opened on first use so that a router whose
    /// gateways nobody uses has no extra session.
    service: OnceCell<Service>,
    /// The callers' own sessions, one per principal (made on first use: its sweeper needs the
    /// runtime).
    callers: OnceLock<Arc<CallerSessions>>,
    /// The sessions standing for outside agents.
    pub peers: Arc<PeerTable>,
    /// The IM gateway's table (live connections, who registered which URI); kept here so
    /// that its size can be read beside the others ([`GatewayContext::sizes`]).
    pub im_table: Arc<ImTable>,
    /// The conversation of each message the gateways sent for an outside caller (replies).
    pub threads: Threads,
    /// The callers' buckets and the body deadline, shared by the MAMP and IM gates, IM frames
    /// and AIP calls.
    pub guard: Arc<Guard>,
    /// What the gateways' routes were asked (`traffic.rs`), counted by every gate of this
    /// context's gateways and of the A2A gateway; rendered into `/metrics`.
    traffic: Arc<Traffic>,
    /// The gateway routes the server built (MAMP, IM, A2A), each behind its gate.
    routes: Mutex<Vec<GatedRoute>>,
    /// What the router delivers (its payload and frame limits), and where it listens.
    pub facts: RouterFacts,
}

/// How big the gateways' tables are (for tests and operators): each is bounded
/// (docs/gateways.md, "Limits").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sizes {
    /// Contacts of the read model (online and not).
    pub contacts: usize,
    /// Conversations of the read model.
    pub conversations: usize,
    /// Messages the read model remembers (to thread deliveries).
    pub remembered_messages: usize,
    /// Live IM connections the read model lists.
    pub live: usize,
    /// Outside senders' (and remote agents') sessions held.
    pub peers: usize,
    /// Mailboxes of outside senders held.
    pub mailboxes: usize,
    /// MAMP conversation-id mappings.
    pub conversation_map: usize,
    /// Reply threads remembered.
    pub threads: usize,
    /// Live IM connections (upgraded sockets, registered or not).
    pub im_connections: usize,
    /// Owners of IM URIs remembered.
    pub im_owners: usize,
    /// Callers' own sessions.
    pub caller_sessions: usize,
}

impl std::fmt::Debug for GatewayContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayContext")
            .field("router_name", &self.router_name)
            .field("default_host", &self.default_host)
            .finish_non_exhaustive()
    }
}

/// The gateways' service session and the read model it feeds.
#[derive(Debug, Clone)]
pub struct Service {
    /// A `system` participant of the service principal: sees every agent and event, owns no
    /// agent.
    pub client: Client,
    /// Contacts, presence and conversations folded from the event log.
    pub directory: Arc<Directory>,
}

/// Whether `client`'s session was granted `cap` (its principal's grant, fixed when it opened).
pub fn granted(client: &Client, cap: Capability) -> bool {
    client.session().is_some_and(|s| s.capabilities.has(cap))
}

/// The error for a session the router would not open: a quota (4002, whose message names it),
/// a refusal (1003), else the router being unavailable.
fn refused_session(whose: &str, e: ClientError) -> GatewayError {
    match &e {
        ClientError::Rpc { code, message, .. } if *code == ErrorCode::QUOTA_EXCEEDED => {
            GatewayError::Quota(format!("{whose}: {message}"))
        }
        ClientError::Rpc { code, message, .. } if *code == ErrorCode::PERMISSION_DENIED => {
            GatewayError::Forbidden(format!("{whose}: {message}"))
        }
        _ => GatewayError::Unavailable(format!("the router refused {whose} ({e})")),
    }
}

impl GatewayContext {
    /// A context over `links`, for a router with `facts`.
    pub fn new(
        settings: GatewaySettings,
        auth: Option<Arc<Authenticator>>,
        router_name: String,
        default_host: String,
        links: Arc<dyn InProcessLinks + Send + Sync>,
        facts: RouterFacts,
    ) -> Self {
        let rate = (settings.rate_per_caller > 0)
            .then_some((settings.rate_per_caller, settings.burst_per_caller));
        let traffic = Arc::new(Traffic::default());
        let guard = Arc::new(Guard::new(GuardSettings {
            body_timeout: settings.body_timeout(),
            rate,
            traffic: Some(Arc::clone(&traffic)),
            ..GuardSettings::default()
        }));
        let configured = settings.mamp.max_message_size;
        let ctx = Self {
            settings,
            admission: Admission::new(auth.clone()),
            auth,
            router_name,
            default_host,
            links,
            service: OnceCell::new(),
            callers: OnceLock::new(),
            peers: Arc::new(PeerTable::default()),
            im_table: Arc::new(ImTable::default()),
            threads: Threads::default(),
            guard,
            traffic,
            routes: Mutex::new(Vec::new()),
            facts,
        };
        let deliverable = ctx.mamp_max_message_size();
        if configured > deliverable {
            tracing::warn!(
                configured,
                deliverable,
                "gateways.mamp.max_message_size is above what the router delivers \
                 (limits.max_payload_bytes, limits.max_frame_bytes): lowered, and the card says so"
            );
        }
        ctx
    }

    /// The largest MAMP message accepted (and advertised): `max_message_size`, lowered to what
    /// the router delivers: a payload of at most `max_payload_bytes` in a frame of at most
    /// `max_frame_bytes` (less room for the envelope).
    pub fn mamp_max_message_size(&self) -> usize {
        self.settings
            .mamp
            .max_message_size
            .min(self.facts.max_payload_bytes)
            .min(self.deliverable_frame())
    }

    /// The largest `POST /gateway/send` body accepted: `gateways.im.max_frame_bytes`, lowered
    /// to what fits a MAP frame. Its `content` must also fit `max_payload_bytes`.
    pub fn im_max_body(&self) -> usize {
        self.settings
            .im
            .max_frame_bytes
            .min(self.deliverable_frame())
    }

    fn deliverable_frame(&self) -> usize {
        self.facts
            .max_frame_bytes
            .saturating_sub(ENVELOPE_ROOM)
            .max(1024)
    }

    /// 413 unless `content` (a message's payload as sent) fits the router's payload limit.
    ///
    /// # Errors
    /// 413 `message_too_large`.
    pub fn check_payload(&self, content: &str) -> Result<(), Failure> {
        let max = self.facts.max_payload_bytes;
        if content.len() > max {
            return Err(Failure::too_large(format!(
                "content of {} bytes is above the {max} bytes a MAP message may carry \
                 (limits.max_payload_bytes)",
                content.len()
            )));
        }
        Ok(())
    }

    /// Whose rate bucket and shared session `caller` has: its principal's, else its address's
    /// (`None`: a loopback caller without a principal, exempt as over MAP when
    /// `limits.exempt_loopback`).
    pub fn caller_key(&self, caller: &Caller) -> Option<CallerKey> {
        caller.key(self.facts.exempt_loopback)
    }

    /// Takes one request from `caller`'s budget, for what is not an HTTP request (an IM
    /// frame, an AIP call); HTTP routes are rated by their gate.
    ///
    /// # Errors
    /// 429 `rate_limited` with when to try again.
    pub fn check_rate(&self, caller: &Caller) -> Result<(), Failure> {
        match self.caller_key(caller) {
            Some(key) => self.guard.rate(&key).map_err(Failure::rate_limited),
            None => Ok(()),
        }
    }

    /// The gateways' request counts (for `/metrics`, and for the A2A gateway's gates).
    pub fn traffic(&self) -> Arc<Traffic> {
        Arc::clone(&self.traffic)
    }

    /// The gate of a MAMP or IM route group: `access`, bodies of at most `max` bytes (`setting`
    /// names the limit in the 413's message), refusals in the seeds' shape: 401 (the
    /// connection closed), 429 with `Retry-After`, 415, 413, 408, 400.
    pub fn gate(
        &self,
        access: Access,
        accepts: Accepts,
        max: usize,
        setting: &'static str,
    ) -> Gate {
        let render: Render = Arc::new(move |refused: &Refused, _: &HeaderMap| {
            let failure = match refused {
                Refused::Caller(refusal) => {
                    let why = match refusal {
                        Refusal::Missing => {
                            "this router needs `Authorization: Bearer <API key or JWT>`".to_owned()
                        }
                        Refusal::Refused(m) => format!("credential refused: {m}"),
                    };
                    return closing(error_response(
                        StatusCode::UNAUTHORIZED,
                        "unauthorized",
                        &why,
                    ));
                }
                Refused::RateLimited { after, .. } => Failure::rate_limited(*after),
                Refused::NotJson(_) => Failure::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    "send the body as Content-Type: application/json",
                ),
                Refused::TooLarge { max } => Failure::too_large(format!(
                    "the body is limited to {max} bytes ({setting}: what the router delivers)"
                )),
                Refused::Timeout { deadline } => Failure::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    format!("the body did not arrive within {} ms", deadline.as_millis()),
                ),
                Refused::Broken => Failure::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_message",
                    "the body ended before it was complete",
                ),
            };
            failure.response()
        });
        Gate::new(self.admission.clone(), Arc::clone(&self.guard), max, render)
            .access(access)
            .accepts(accepts)
            .exempt_loopback(self.facts.exempt_loopback)
    }

    /// Records the gateway routes the server built (`server::gateways`).
    pub fn record_routes(&self, routes: Vec<GatedRoute>) {
        *crate::sync::lock(&self.routes) = routes;
    }

    /// The gateway routes the server built (MAMP, IM and A2A, those enabled), each behind its
    /// group's gate: what `tests/gateway_limits.rs` walks.
    pub fn routes(&self) -> Vec<GatedRoute> {
        crate::sync::lock(&self.routes).clone()
    }

    /// The sizes of the gateways' tables.
    pub fn sizes(&self) -> Sizes {
        let mut s = Sizes {
            peers: self.peers.len(),
            mailboxes: self.peers.mailboxes(),
            conversation_map: self.peers.conversation_mappings(),
            threads: self.threads.len(),
            im_connections: self.im_table.connections(),
            im_owners: self.im_table.owners(),
            caller_sessions: self.callers.get().map_or(0, |c| c.len()),
            ..Sizes::default()
        };
        if let Some(service) = self.service.get() {
            let d = service.directory.sizes();
            s.contacts = d.contacts;
            s.conversations = d.conversations;
            s.remembered_messages = d.remembered_messages;
            s.live = d.live;
        }
        s
    }

    /// Opens an in-process MAP session as `principal` (`None`: authentication is off, and
    /// the session is anonymous like every MAP participant's).
    ///
    /// # Errors
    /// [`GatewayError::Quota`] naming the quota the router applied (4002),
    /// [`GatewayError::Forbidden`] for a refusal (1003), else [`GatewayError::Unavailable`].
    pub async fn open_as(
        &self,
        principal: Option<&Principal>,
        options: ClientOptions,
    ) -> Result<Client, GatewayError> {
        self.callers().open(principal, options).await.map_err(|e| {
            let whose = principal.map_or_else(
                || "a session for the caller".to_owned(),
                |p| format!("a session for principal {}", p.id),
            );
            refused_session(&whose, e)
        })
    }

    /// Opens a session of the router's service principal (`auth::service_principal`), with
    /// or without `[auth]`.
    ///
    /// # Errors
    /// As [`GatewayContext::open_as`].
    pub async fn open_service(&self, options: ClientOptions) -> Result<Client, GatewayError> {
        self.callers()
            .open_service(options)
            .await
            .map_err(|e| refused_session("the gateways' service session", e))
    }

    /// The one opener of the gateways' MAP sessions (the callers' shared ones among them).
    fn callers(&self) -> &Arc<CallerSessions> {
        self.callers.get_or_init(|| {
            CallerSessions::new(Arc::clone(&self.links), self.settings.session_idle())
        })
    }

    /// The caller's own MAP session, shared by its requests while it keeps calling (one per
    /// principal): a `system` participant when it may see everything, else a `client`, with
    /// its principal's grants, quotas and visibility. Its participant id is the router's to
    /// choose: a fixed one (`im:<principal>`) could be taken first over MAP by somebody else,
    /// who would then send under what looks like the caller's name.
    ///
    /// # Errors
    /// As [`GatewayContext::open_as`].
    pub async fn caller_session(&self, caller: &Caller) -> Result<Client, GatewayError> {
        let kind = if caller.sees_all {
            ParticipantType::System
        } else {
            ParticipantType::Client
        };
        let name = caller.name().to_owned();
        // Without a principal, a caller's address keys its own session (so one address's
        // flood spends that session's rate budget), unless it is an exempt loopback address.
        let key = self.caller_key(caller).unwrap_or(CallerKey::Unknown);
        self.callers()
            .get_for(caller.principal.as_ref(), key, || {
                ClientOptions::new()
                    .participant_type(kind)
                    .name(format!("MAMP/IM caller {name}"))
            })
            .await
            .map_err(|e| refused_session(&format!("a session for principal {name}"), e))
    }

    /// The service session, opened (and its read model started) on first use. With `[auth]`
    /// on, a second service session, an ordinary `client`, follows which agents an ordinary
    /// participant may see (`Directory`'s public view).
    ///
    /// # Errors
    /// As [`GatewayContext::open_as`].
    pub async fn service(&self) -> Result<&Service, GatewayError> {
        self.service
            .get_or_try_init(|| async {
                let client = self
                    .open_service(
                        ClientOptions::new()
                            .participant_type(ParticipantType::System)
                            .name("gateway"),
                    )
                    .await?;
                let public = match self.auth {
                    Some(_) => Some(
                        self.open_service(ClientOptions::new().name("gateway public view"))
                            .await?,
                    ),
                    None => None,
                };
                let directory = Directory::start(
                    client.clone(),
                    public,
                    self.settings.max_contacts,
                    self.settings.max_conversations,
                )
                .await?;
                Ok(Service { client, directory })
            })
            .await
    }

    /// The host of our canonical `agent://` URIs: `[gateways] domain`, else the default host
    /// (the first listen address, with its port).
    pub fn host(&self) -> &str {
        self.settings
            .domain
            .as_deref()
            .unwrap_or(&self.default_host)
    }

    /// Whether `host` (of an `agent://HOST/ID`) names this router: the configured domain, the
    /// default host, or the host the request was addressed to (`Host` header), each with or
    /// without a port; a port given must be one we listen on (or the request's own).
    pub fn is_local_host(&self, host: &str, headers: &HeaderMap) -> bool {
        let (name, port) = split_port(host);
        let given = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        let ours: Vec<(&str, Option<u16>)> = [
            self.settings.domain.as_deref(),
            Some(self.default_host.as_str()),
            given,
        ]
        .into_iter()
        .flatten()
        .map(split_port)
        .collect();
        if name.is_empty() || !ours.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
            return false;
        }
        match port {
            None => true,
            Some(p) => {
                self.facts.listen_ports.contains(&p) || ours.iter().any(|(_, q)| *q == Some(p))
            }
        }
    }

    /// The id part of `uri` when it names one of our agents (`agent://<one of our hosts>/<id>`,
    /// [`GatewayContext::is_local_host`]).
    pub fn local_id(&self, uri: &str, headers: &HeaderMap) -> Option<String> {
        let u = AgentUri::parse(uri)?;
        self.is_local_host(&u.host, headers).then_some(u.id)
    }

    /// `uri` in its one form: a URI of our host (any of its spellings) as
    /// `agent://<host>/<id>`, any other as given.
    pub fn canonical(&self, uri: &str, headers: &HeaderMap) -> String {
        match self.local_id(uri, headers) {
            Some(id) => format!("{}{}/{id}", AgentUri::SCHEME, self.host()),
            None => uri.to_owned(),
        }
    }

    /// The `agent://` URI of a MAP agent id: the id itself when it already is one (IM agents
    /// and remote MAMP agents are registered under their URI), else the canonical
    /// `agent://<host>/<id>`.
    pub fn uri_of(&self, agent_id: &str) -> String {
        if agent_id.starts_with(AgentUri::SCHEME) {
            agent_id.to_owned()
        } else {
            format!("{}{}/{agent_id}", AgentUri::SCHEME, self.host())
        }
    }
}

/// `host[:port]` (or `[v6]:port`) split; a suffix that is not a port stays in the name.
pub fn split_port(host: &str) -> (&str, Option<u16>) {
    if let Some(rest) = host.strip_prefix('[') {
        if let Some((v6, tail)) = rest.split_once(']') {
            let port = tail.strip_prefix(':').and_then(|p| p.parse().ok());
            return (v6, port);
        }
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => match port.parse() {
            Ok(p) => (name, Some(p)),
            Err(_) => (host, None),
        },
        _ => (host, None),
    }
}

/// Whether a refused lookup means "no such agent (that you may see)".
fn not_found(e: &ClientError) -> bool {
    matches!(e, ClientError::Rpc { code, .. }
        if *code == ErrorCode::AGENT_NOT_FOUND
            || *code == ErrorCode::ADDRESS_NOT_FOUND
            || *code == ErrorCode::PERMISSION_DENIED
            || *code == ErrorCode::INVALID_PARAMS)
}

/// A lookup's error that is not "not found": a rate limit (429), the session gone (503), ...
fn lookup_error(e: ClientError) -> GatewayError {
    match &e {
        ClientError::Rpc { code, data, .. } if *code == ErrorCode::RATE_LIMITED => {
            GatewayError::RateLimited(crate::gateway::wire::retry_after_of(data.as_ref()))
        }
        _ => GatewayError::Map(e),
    }
}

/// A MAP agent by id, else by unique name (as `client`, which sees what it may see).
///
/// # Errors
/// A lookup the router refused for another reason than "not found" (a rate limit, the session
/// gone): never reported as not found.
pub async fn resolve(client: &Client, id_or_name: &str) -> Result<Option<Agent>, GatewayError> {
    match client.get_agent(id_or_name).await {
        Ok(agent) => return Ok(Some(agent)),
        Err(e) if not_found(&e) => {}
        Err(e) => return Err(lookup_error(e)),
    }
    let agents = client
        .list_agents(Default::default())
        .await
        .map_err(lookup_error)?;
    let mut named = agents
        .into_iter()
        .filter(|a| a.name.as_deref() == Some(id_or_name));
    Ok(match (named.next(), named.next()) {
        (Some(a), None) => Some(a),
        _ => None,
    })
}

/// An agent by its exact id, as `client` sees it.
async fn by_id(client: &Client, id: &str) -> Result<Option<Agent>, GatewayError> {
    match client.get_agent(id).await {
        Ok(a) => Ok(Some(a)),
        Err(e) if not_found(&e) => Ok(None),
        Err(e) => Err(lookup_error(e)),
    }
}

/// The agent a message `to` names, as `client` sees it (so a caller reaches only what it may
/// see): for `agent://HOST/ID` with HOST ours, our agent whose id or unique name is ID, else an
/// agent registered under the whole URI (an IM agent, a remote MAMP agent); for another host,
/// only the latter. A bare id or name (the IM gateway's `to`) is resolved as such.
///
/// Our own agents come first, so that nobody holding the URI `agent://<our host>/<id>` can
/// catch what is sent to our agent `<id>` (an IM registration of such a URI is refused too).
///
/// # Errors
/// As [`resolve`]: a refusal that is not "not found" (429 for a rate limit, ...).
pub async fn resolve_target(
    ctx: &GatewayContext,
    client: &Client,
    to: &str,
    headers: &HeaderMap,
) -> Result<Option<Agent>, GatewayError> {
    match AgentUri::parse(to) {
        Some(uri) if ctx.is_local_host(&uri.host, headers) => {
            match resolve(client, &uri.id).await? {
                Some(a) => Ok(Some(a)),
                None => by_id(client, &ctx.canonical(to, headers)).await,
            }
        }
        Some(_) => by_id(client, to).await,
        None if !to.is_empty() => resolve(client, to).await,
        None => Ok(None),
    }
}
