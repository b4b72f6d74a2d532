//! [`GatewayContext`]: what both gateways share at run time: settings, authentication, the
//! in-process links, the peer table, and the service session with its read model.
//!
//! Must not hold routing state: who is registered, online or in which conversation is the
//! router's (read through MAP calls and the event log, `directory.rs`).

use std::sync::Arc;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use tokio::sync::OnceCell;

use crate::auth::Authenticator;
use crate::client::{Client, ClientOptions};
use crate::gateway::config::GatewaySettings;
use crate::gateway::directory::Directory;
use crate::gateway::peer_table::PeerTable;
use crate::gateway::wire::{bearer, error_response, AgentUri, GatewayError};
use crate::protocol::agent::Agent;
use crate::protocol::capabilities::ParticipantType;
use crate::transport::in_process::InProcessLinks;

/// Everything a gateway needs, shared by its routes and tasks.
pub struct GatewayContext {
    /// `[gateways]`.
    pub settings: GatewaySettings,
    /// The router's authenticator (`None`: authentication off). Bearer tokens of MAMP and IM
    /// requests are checked against it, as `GET /metrics` does.
    pub auth: Option<Arc<Authenticator>>,
    /// The router's name (the router card's `name`).
    pub router_name: String,
    /// The host of our `agent://` URIs when `[gateways] domain` is unset (the first listen
    /// address, else the router name).
    pub default_host: String,
    /// Opens in-process MAP connections (the server).
    links: Arc<dyn InProcessLinks + Send + Sync>,
    /// The gateway's own session (a `system` participant) and its read model, opened on
    /// first use so that a router whose gateways nobody uses has no extra session.
    service: OnceCell<Service>,
    /// The sessions standing for outside agents.
    pub peers: PeerTable,
}

impl std::fmt::Debug for GatewayContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayContext")
            .field("router_name", &self.router_name)
            .field("default_host", &self.default_host)
            .finish_non_exhaustive()
    }
}

/// The gateway's service session and the read model it feeds.
#[derive(Debug, Clone)]
pub struct Service {
    /// A `system` participant: sees every agent and event, owns no agent.
    pub client: Client,
    /// Contacts, presence and conversations folded from the event log.
    pub directory: Arc<Directory>,
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
            peers: PeerTable::default(),
        }
    }

    /// Opens an in-process MAP session.
    ///
    /// # Errors
    /// [`GatewayError::Unavailable`] when the router refuses it (with `[auth]` on, the
    /// `in-process` transport must be trusted: docs/gateways.md).
    pub async fn open_session(&self, options: ClientOptions) -> Result<Client, GatewayError> {
        Client::in_process(&*self.links, options)
            .await
            .map_err(|e| {
                GatewayError::Unavailable(format!(
                    "the router refused the gateway's in-process session ({e}); with [auth] on, \
                     add \"in-process\" to auth.trusted_transports"
                ))
            })
    }

    /// The service session, opened (and its read model started) on first use. It runs as the
    /// router's service principal (`auth::service_principal`), with or without `[auth]`.
    ///
    /// # Errors
    /// As [`GatewayContext::open_session`].
    pub async fn service(&self) -> Result<&Service, GatewayError> {
        self.service
            .get_or_try_init(|| async {
                let client = Client::in_process_as(
                    &*self.links,
                    crate::auth::service_principal(),
                    ClientOptions::new()
                        .participant_type(ParticipantType::System)
                        .name("gateway"),
                )
                .await
                .map_err(|e| {
                    GatewayError::Unavailable(format!(
                        "the router refused the gateways' service session ({e})"
                    ))
                })?;
                let directory = Directory::start(client.clone()).await?;
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

    /// Checks `Authorization: Bearer <token>` when authentication is on: `None` when the
    /// request may go on, else the 401 to answer (in the seeds' error shape).
    pub fn bearer_refusal(&self, headers: &HeaderMap) -> Option<Response> {
        let auth = self.auth.as_ref()?;
        let given = bearer(headers);
        let why = match given.filter(|s| !s.is_empty()) {
            None => "this router needs `Authorization: Bearer <API key or JWT>`".to_owned(),
            Some(secret) => match auth.verify_bearer(secret) {
                Ok(_) => return None,
                Err(e) => format!("credential refused: {}", e.message),
            },
        };
        Some(closing(error_response(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            &why,
        )))
    }
}

/// `response` with `Connection: close`: for answers given before the request's body was read
/// (401, 413), so that a keep-alive client does not send its next request on a connection
/// whose unread body the server is about to drop with the connection.
pub fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
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
