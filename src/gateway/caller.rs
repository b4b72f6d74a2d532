//! [`Caller`]: who sent one gateway request, established once, before anything else runs
//! (docs/gateways.md, "Identity"), by the one admission of the gateway layer ([`Admission`]);
//! and [`Subject`], the key the gateways' tables record ownership under.
//!
//! **One way to admit a caller.** Every gateway (A2A, MAMP, IM, AIP) and `GET /metrics` reads
//! its request's credential with [`credential`] (or, for AIP's gRPC metadata and `/metrics`,
//! the same `auth::bearer` parser directly) in the forms it accepts ([`Accepts`]: `Authorization: Bearer <API
//! key or JWT>` everywhere; `X-API-Key` on A2A; `?token=` on the IM WebSocket's upgrade, since
//! browsers cannot set headers there; a bare credential in AIP's metadata) and hands it to
//! [`Admission::admit`], the one place the router's authenticator is asked. The answer is a
//! [`Caller`] (its principal, or its address when authentication is off) or a [`Refusal`] that
//! each gateway renders in its own shape (the seeds' 401, A2A's JSON-RPC error, gRPC's
//! `UNAUTHENTICATED`, the metrics 401). The HTTP gateways admit in their route group's gate
//! (`guard.rs`), which puts the [`Caller`] in the request's extensions; handlers then act as
//! the caller: through its own MAP session (`callers.rs`, keyed by [`Caller::key`]), or sessions
//! opened as its principal (an IM connection, an outside MAMP sender, an AIP node), never as
//! the gateway.
//!
//! Owns nothing: a `Caller` lives as long as its request or connection.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::Query;
use axum::http::{header, HeaderMap, Uri};

use crate::auth::Authenticator;
use crate::gateway::wire::bearer;
use crate::protocol::methods::session::Principal;

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

/// Whose rate bucket (`guard.rs`) and shared MAP session (`callers.rs`) a caller has: the
/// gateway layer's one key of a caller ([`Caller::key`]), its principal, else its address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CallerKey {
    /// An authenticated principal (`id`, `issuer`).
    Principal(String, Option<String>),
    /// An anonymous caller's address.
    Ip(IpAddr),
    /// An anonymous caller whose address is unknown (all share one bucket).
    Unknown,
}

/// The verified caller of one request.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Its principal; `None` when authentication is off.
    pub principal: Option<Principal>,
    /// The address it called from (the listener's `PeerInfo`): without a principal, its rate
    /// budget and connection caps are this address's.
    pub ip: Option<IpAddr>,
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

    /// Whose budget and shared session this caller uses: its principal's, else its address's
    /// (`None`: an anonymous loopback caller, exempt as over MAP when `exempt_loopback`;
    /// [`CallerKey::Unknown`]: anonymous without a known address).
    pub fn key(&self, exempt_loopback: bool) -> Option<CallerKey> {
        if let Some(p) = &self.principal {
            return Some(CallerKey::Principal(p.id.clone(), p.issuer.clone()));
        }
        match self.ip {
            Some(ip) if exempt_loopback && ip.is_loopback() => None,
            Some(ip) => Some(CallerKey::Ip(ip)),
            None => Some(CallerKey::Unknown),
        }
    }

    /// The principal's id, or `anonymous`.
    pub fn name(&self) -> &str {
        self.principal
            .as_ref()
            .map_or("anonymous", |p| p.id.as_str())
    }
}

/// The forms of credential a route group accepts besides `Authorization: Bearer`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Accepts {
    /// `X-API-Key: <key>` (A2A's cards announce it).
    pub x_api_key: bool,
    /// `?token=<credential>` on a WebSocket upgrade (the IM gateway's browsers).
    pub upgrade_token: bool,
}

/// The credential a request carries, in the forms `accepts` allows: `Authorization: Bearer`
/// first (the crate's one parser, `auth::bearer`), then `X-API-Key`, then a WebSocket
/// upgrade's `?token=`. Reads headers and the URI only.
pub fn credential(headers: &HeaderMap, uri: &Uri, accepts: Accepts) -> Option<String> {
    if let Some(s) = bearer(headers) {
        return Some(s.to_owned());
    }
    if accepts.x_api_key {
        let key = headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|s| !s.is_empty());
        if let Some(key) = key {
            return Some(key.to_owned());
        }
    }
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !accepts.upgrade_token || !upgrade {
        return None;
    }
    let Query(query) = Query::<HashMap<String, String>>::try_from_uri(uri).ok()?;
    query.get("token").cloned().filter(|s| !s.is_empty())
}

/// Why a caller was not admitted; each gateway renders it in its own shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Authentication is on and the request carries no credential.
    Missing,
    /// The authenticator refused the credential: its message.
    Refused(String),
}

/// The one admission of the gateway layer: the router's authenticator (`None`: authentication
/// is off) and the single place a gateway credential is verified.
#[derive(Clone, Default)]
pub struct Admission {
    auth: Option<Arc<Authenticator>>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("auth", &self.auth.is_some())
            .finish()
    }
}

impl Admission {
    /// An admission over the router's authenticator (`None`: authentication is off).
    pub fn new(auth: Option<Arc<Authenticator>>) -> Self {
        Self { auth }
    }

    /// Whether callers must authenticate.
    pub fn required(&self) -> bool {
        self.auth.is_some()
    }

    /// Whether a verified `principal` passes every rule (`auth.system_principals`).
    pub fn may_be_system(&self, principal: &Principal) -> bool {
        self.auth
            .as_ref()
            .is_some_and(|a| a.may_be_system(&principal.id))
    }

    /// The caller of a request from `ip` carrying `secret`: with authentication off, the
    /// anonymous caller who sees everything (as every MAP participant then may); else the
    /// principal of the credential, which must be there and verify.
    ///
    /// # Errors
    /// [`Refusal`] (authentication on).
    pub fn admit(&self, secret: Option<&str>, ip: Option<IpAddr>) -> Result<Caller, Refusal> {
        let Some(auth) = &self.auth else {
            return Ok(Caller {
                principal: None,
                ip,
                sees_all: true,
            });
        };
        let secret = secret.filter(|s| !s.is_empty()).ok_or(Refusal::Missing)?;
        let principal = auth
            .verify_bearer(secret)
            .map_err(|e| Refusal::Refused(e.message))?;
        Ok(Caller {
            sees_all: auth.may_be_system(&principal.id),
            principal: Some(principal),
            ip,
        })
    }

    /// The caller of a request that carries no credential on a public route: anonymous,
    /// known by its address only; it sees everything only with authentication off.
    pub fn anonymous(&self, ip: Option<IpAddr>) -> Caller {
        Caller {
            principal: None,
            ip,
            sees_all: self.auth.is_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::config::Secret;
    use crate::auth::AuthSettings;
    use axum::http::HeaderValue;

    const KEYS: &str = "key-ops-0123456789 ops,key-alice-0123456789 alice";

    fn admission() -> Admission {
        let mut settings = AuthSettings::default();
        settings.api_keys.inline = Some(Secret(KEYS.into()));
        settings.system_principals = vec!["ops".into()];
        Admission::new(settings.build("test").expect("valid settings"))
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn credentials_in_the_forms_a_group_accepts() {
        let plain = Uri::from_static("/x");
        let with_token = Uri::from_static("/gateway/connect?token=t0k");
        let a2a = Accepts {
            x_api_key: true,
            ..Accepts::default()
        };
        let im = Accepts {
            upgrade_token: true,
            ..Accepts::default()
        };
        let bearer = headers(&[("authorization", "Bearer abc")]);
        assert_eq!(
            credential(&bearer, &plain, Accepts::default()).as_deref(),
            Some("abc")
        );
        let key = headers(&[("x-api-key", " k ")]);
        assert_eq!(credential(&key, &plain, a2a).as_deref(), Some("k"));
        assert_eq!(credential(&key, &plain, Accepts::default()), None);
        let upgrade = headers(&[("upgrade", "websocket")]);
        assert_eq!(
            credential(&upgrade, &with_token, im).as_deref(),
            Some("t0k")
        );
        assert_eq!(
            credential(&HeaderMap::new(), &with_token, im),
            None,
            "not an upgrade"
        );
        assert_eq!(credential(&upgrade, &with_token, a2a), None, "not accepted");
    }

    #[test]
    fn one_admission_for_every_gateway() {
        let addr = IpAddr::from([127, 0, 0, 2]);
        let ip = Some(addr);
        let off = Admission::new(None)
            .admit(None, ip)
            .expect("anybody, auth off");
        assert!(off.principal.is_none() && off.sees_all);
        assert_eq!(off.key(false), Some(CallerKey::Ip(addr)));
        assert_eq!(off.key(true), None, "an exempt loopback caller");
        let on = admission();
        assert_eq!(on.admit(None, ip).unwrap_err(), Refusal::Missing);
        assert!(matches!(
            on.admit(Some("key-nobody-0123456789"), ip),
            Err(Refusal::Refused(_))
        ));
        let alice = on.admit(Some("key-alice-0123456789"), ip).expect("alice");
        assert_eq!(alice.name(), "alice");
        assert!(!alice.sees_all);
        assert_eq!(
            alice.key(true),
            Some(CallerKey::Principal(
                "alice".into(),
                alice.principal.clone().unwrap().issuer
            )),
            "a principal is never exempt"
        );
        assert!(on.admit(Some("key-ops-0123456789"), ip).unwrap().sees_all);
        let anonymous = on.anonymous(ip);
        assert!(anonymous.principal.is_none() && !anonymous.sees_all);
    }
}
