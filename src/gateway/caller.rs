//! [`Caller`]: who sent one MAMP or IM request, established once by the [`authenticate`]
//! middleware before anything else runs (docs/gateways.md, "Identity"), and [`Subject`], the
//! key the gateways' tables record ownership under.
//!
//! The middleware reads headers only (`Authorization: Bearer <API key or JWT>`, and for the IM
//! WebSocket's upgrade `?token=`, since browsers cannot set headers there), checks the
//! credential with the router's authenticator and puts the [`Caller`] in the request's
//! extensions; a missing or refused credential is a 401 in the seeds' shape, with
//! `Connection: close` (the body was not read). Handlers then act as the caller: through its
//! own MAP session (`context.rs`, over `callers::CallerSessions`), or sessions opened as its
//! principal (an IM connection, an outside MAMP sender), never as the gateway.
//!
//! Owns nothing: a `Caller` lives as long as its request or connection.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use crate::auth::Authenticator;
use crate::gateway::wire::{bearer, closing, error_response};
use crate::protocol::methods::session::Principal;
use crate::transport::admission::PeerInfo;

/// Who owns something a gateway opened for a caller (an IM agent's URI, an outside sender's
/// session): a principal's subject, or the one anonymous caller there is with authentication
/// off.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Subject {
    /// Authentication is off: every caller is this one.
    Anonymous,
    /// A principal's `id` and `issuer` (its expiry does not matter).
    Principal {
        /// The principal's id.
        id: String,
        /// Its issuer.
        issuer: Option<String>,
    },
}

impl Subject {
    /// The subject of `principal` (`None`: authentication is off).
    pub fn of(principal: Option<&Principal>) -> Self {
        match principal {
            None => Subject::Anonymous,
            Some(p) => Subject::Principal {
                id: p.id.clone(),
                issuer: p.issuer.clone(),
            },
        }
    }
}

/// The verified caller of one request.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Its principal; `None` when authentication is off.
    pub principal: Option<Principal>,
    /// The address it called from (the listener's `PeerInfo`): without a principal, its rate
    /// budget and connection caps are this address's.
    pub ip: Option<std::net::IpAddr>,
    /// Whether it sees everything: authentication is off (anybody may then connect to MAP as a
    /// `system` participant), or its principal is one of `auth.system_principals`. Its MAP
    /// session is then a `system` participant's; otherwise a `client`'s.
    pub sees_all: bool,
}

impl Caller {
    /// Its [`Subject`].
    pub fn subject(&self) -> Subject {
        Subject::of(self.principal.as_ref())
    }

    /// The principal's id, or `anonymous`.
    pub fn name(&self) -> &str {
        self.principal
            .as_ref()
            .map_or("anonymous", |p| p.id.as_str())
    }
}

/// The credential of a request: `Authorization: Bearer`, or for a WebSocket upgrade `?token=`.
fn credential(request: &Request) -> Option<String> {
    if let Some(s) = bearer(request.headers()).filter(|s| !s.is_empty()) {
        return Some(s.to_owned());
    }
    let upgrade = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrade {
        return None;
    }
    let Query(query) = Query::<HashMap<String, String>>::try_from_uri(request.uri()).ok()?;
    query.get("token").cloned()
}

/// The middleware, over the router's authenticator (`None`: authentication is off): a
/// [`Caller`] in the request's extensions, or a 401.
pub async fn authenticate(
    State(auth): State<Option<Arc<Authenticator>>>,
    mut request: Request,
    next: Next,
) -> Response {
    let ip = request.extensions().get::<PeerInfo>().map(|p| p.addr.ip());
    let Some(auth) = auth.as_ref() else {
        request.extensions_mut().insert(Caller {
            principal: None,
            ip,
            sees_all: true,
        });
        return next.run(request).await;
    };
    let secret = credential(&request);
    let why = match secret.filter(|s| !s.is_empty()) {
        None => "this router needs `Authorization: Bearer <API key or JWT>`".to_owned(),
        Some(secret) => match auth.verify_bearer(&secret) {
            Ok(principal) => {
                let sees_all = auth.may_be_system(&principal.id);
                request.extensions_mut().insert(Caller {
                    principal: Some(principal),
                    ip,
                    sees_all,
                });
                return next.run(request).await;
            }
            Err(e) => format!("credential refused: {}", e.message),
        },
    };
    closing(error_response(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        &why,
    ))
}
