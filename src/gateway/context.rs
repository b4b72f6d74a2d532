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
//! Must not hold routing state: who is registered, online or in which conversation is the
//! router's (read through MAP calls and the event log, `directory.rs`).

use std::sync::{Arc, OnceLock};

use axum::http::{header, HeaderMap};
use tokio::sync::OnceCell;

use crate::auth::Authenticator;
use crate::client::{Client, ClientError, ClientOptions};
use crate::gateway::caller::Caller;
use crate::gateway::callers::CallerSessions;
use crate::gateway::config::GatewaySettings;
use crate::gateway::directory::Directory;
use crate::gateway::peer_table::PeerTable;
use crate::gateway::wire::{AgentUri, GatewayError};
use crate::protocol::agent::Agent;
use crate::protocol::capabilities::{Capability, ParticipantType};
use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::methods::session::Principal;
use crate::transport::in_process::InProcessLinks;

/// Everything a gateway needs, shared by its routes and tasks.
pub struct GatewayContext {
    /// `[gateways]`.
    pub settings: GatewaySettings,
    /// The router's authenticator (`None`: authentication off). Bearer tokens of MAMP and IM
    /// requests are checked against it (`caller.rs`), as `GET /metrics` does.
    pub auth: Option<Arc<Authenticator>>,
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
    /// A context over `links`.
    pub fn new(
        settings: GatewaySettings,
        auth: Option<Arc<Authenticator>>,
        router_name: String,
        default_host: String,
        links: Arc<dyn InProcessLinks + Send + Sync>,
    ) -> Self {
        Self {
            settings,
            auth,
            router_name,
            default_host,
            links,
            service: OnceCell::new(),
            callers: OnceLock::new(),
            peers: Arc::new(PeerTable::default()),
        }
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
        let opened = match principal {
            Some(p) => Client::in_process_as(&*self.links, p.clone(), options).await,
            None => Client::in_process(&*self.links, options).await,
        };
        opened.map_err(|e| {
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
        Client::in_process_as(&*self.links, crate::auth::service_principal(), options)
            .await
            .map_err(|e| refused_session("the gateways' service session", e))
    }

    /// The callers' sessions.
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
        self.callers()
            .get(caller.principal.as_ref(), || {
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
                let directory = Directory::start(client.clone(), public).await?;
                Ok(Service { client, directory })
            })
            .await
    }

    /// The host of our `agent://` URIs: `[gateways] domain`, else the default host.
    pub fn host(&self) -> &str {
        self.settings
            .domain
            .as_deref()
            .unwrap_or(&self.default_host)
    }

    /// Whether `host` (of an `agent://HOST/ID`) names this router: the configured domain, the
    /// default host, or the host the request was addressed to (`Host` header, with or without
    /// its port).
    pub fn is_local_host(&self, host: &str, headers: &HeaderMap) -> bool {
        if host.eq_ignore_ascii_case(self.host()) || host.eq_ignore_ascii_case(&self.default_host) {
            return true;
        }
        let Some(given) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let bare = given.rsplit_once(':').map_or(given, |(h, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                h
            } else {
                given
            }
        });
        host.eq_ignore_ascii_case(given) || host.eq_ignore_ascii_case(bare)
    }

    /// The `agent://` URI of a MAP agent id: the id itself when it already is one (IM agents
    /// and remote MAMP agents are registered under their URI), else `agent://<host>/<id>`.
    pub fn uri_of(&self, agent_id: &str) -> String {
        if agent_id.starts_with(AgentUri::SCHEME) {
            agent_id.to_owned()
        } else {
            format!("{}{}/{agent_id}", AgentUri::SCHEME, self.host())
        }
    }
}

/// A MAP agent by id, else by unique name (as `client`, which sees what it may see).
pub async fn resolve(client: &Client, id_or_name: &str) -> Option<Agent> {
    if let Ok(agent) = client.get_agent(id_or_name).await {
        return Some(agent);
    }
    let agents = client.list_agents(Default::default()).await.ok()?;
    let mut named = agents
        .into_iter()
        .filter(|a| a.name.as_deref() == Some(id_or_name));
    match (named.next(), named.next()) {
        (Some(a), None) => Some(a),
        _ => None,
    }
}

/// The agent a message `to` names, as `client` sees it (so a caller reaches only what it may
/// see): for `agent://HOST/ID` with HOST ours, our agent whose id or unique name is ID, else an
/// agent registered under the whole URI (an IM agent, a remote MAMP agent); for another host,
/// only the latter. A bare id or name (the IM gateway's `to`) is resolved as such.
///
/// Our own agents come first, so that nobody holding the URI `agent://<our host>/<id>` can
/// catch what is sent to our agent `<id>` (an IM registration of such a URI is refused too).
pub async fn resolve_target(
    ctx: &GatewayContext,
    client: &Client,
    to: &str,
    headers: &HeaderMap,
) -> Option<Agent> {
    match AgentUri::parse(to) {
        Some(uri) if ctx.is_local_host(&uri.host, headers) => {
            match resolve(client, &uri.id).await {
                Some(a) => Some(a),
                None => client.get_agent(to).await.ok(),
            }
        }
        Some(_) => client.get_agent(to).await.ok(),
        None if !to.is_empty() => resolve(client, to).await,
        None => None,
    }
}
