//! [`Authenticator`]: the configured methods and their key material, and the pure check of
//! one credential ([`Authenticator::verify`]: an `auth` object to a [`Principal`] or an
//! [`AuthError`] with the wire code). Built once by `config` at start-up; no I/O after that.

use std::time::Duration;

use serde::Deserialize;

use crate::auth::api_keys;
use crate::auth::jwt;
use crate::protocol::methods::auth::RefreshParams;
use crate::protocol::methods::session::{
    AuthCredentials, AuthError, AuthErrorCode, AuthRequiredInfo, AuthRequiredResult, Principal,
};

/// A transport whose connections are admitted without credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrustedTransport {
    /// The pipes of processes the router launched itself (`map/agents/spawn` with a `command`,
    /// `[[agents]]`). Their principal is `supervised:<agentId>`.
    Supervised,
    /// In-process connections of a program that embeds the router. Principal `in-process`.
    InProcess,
    /// `map-router stdio`: the router's own stdin/stdout. Principal `stdio`.
    Stdio,
}

impl std::str::FromStr for TrustedTransport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "supervised" => Ok(Self::Supervised),
            "in-process" => Ok(Self::InProcess),
            "stdio" => Ok(Self::Stdio),
            other => Err(format!(
                "unknown transport `{other}` (expected supervised, in-process or stdio)"
            )),
        }
    }
}

/// The wire name of JWT authentication.
pub const METHOD_BEARER: &str = "bearer";
/// The wire name of API-key authentication.
pub const METHOD_API_KEY: &str = "api-key";
/// The issuer of the principals the router asserts itself (trusted transports).
pub const LOCAL_ISSUER: &str = "map-router";

/// What [`Authenticator::new`] is built from (read and validated by `config`).
#[derive(Debug)]
pub(crate) struct AuthenticatorParts {
    pub api_keys: Option<api_keys::ApiKeys>,
    pub jwt: Option<jwt::JwtVerifier>,
    pub realm: String,
    pub trusted: Vec<TrustedTransport>,
    pub system_principals: Vec<String>,
    pub expiry_notice: Duration,
    pub leeway: Duration,
}

/// The configured authentication (present only when some method is enabled).
#[derive(Debug)]
pub struct Authenticator {
    api_keys: Option<api_keys::ApiKeys>,
    jwt: Option<jwt::JwtVerifier>,
    realm: String,
    trusted: Vec<TrustedTransport>,
    system_principals: Vec<String>,
    expiry_notice: Duration,
    leeway: Duration,
}

/// Whether a credential has the shape of a JWT (three base64url segments).
fn looks_like_jwt(s: &str) -> bool {
    s.split('.').count() == 3 && !s.contains(char::is_whitespace)
}

impl Authenticator {
    pub(crate) fn new(p: AuthenticatorParts) -> Self {
        Self {
            api_keys: p.api_keys,
            jwt: p.jwt,
            realm: p.realm,
            trusted: p.trusted,
            system_principals: p.system_principals,
            expiry_notice: p.expiry_notice,
            leeway: p.leeway,
        }
    }

    /// The accepted wire methods, in the order `authRequired.methods` lists them.
    pub fn methods(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.jwt.is_some() {
            out.push(METHOD_BEARER.to_owned());
        }
        if self.api_keys.is_some() {
            out.push(METHOD_API_KEY.to_owned());
        }
        out
    }

    /// The `map/connect` answer that asks for authentication.
    pub fn auth_required(&self, error: Option<AuthError>) -> AuthRequiredResult {
        AuthRequiredResult {
            auth_required: AuthRequiredInfo {
                methods: self.methods(),
                required: true,
                realm: Some(self.realm.clone()),
            },
            error,
        }
    }

    /// Whether connections over `transport` are admitted without credentials.
    pub fn trusts(&self, transport: TrustedTransport) -> bool {
        self.trusted.contains(&transport)
    }

    /// Whether `principal` may connect as a system participant (`auth.system_principals`).
    pub fn may_be_system(&self, principal: &str) -> bool {
        self.system_principals.iter().any(|p| p == principal)
    }

    /// How long before expiry `map/auth/expiring` is sent (at most half the remaining life).
    pub fn expiry_notice(&self) -> Duration {
        self.expiry_notice
    }

    /// The clock leeway: a session's credential ends `leeway` after its `exp`, the instant a
    /// fresh connect with the same token would start failing.
    pub fn leeway(&self) -> Duration {
        self.leeway
    }

    /// Checks `map/connect`'s `auth` (or `map/authenticate`'s params).
    ///
    /// # Errors
    /// Why the credential is refused, with the wire code.
    pub fn verify(&self, c: &AuthCredentials) -> Result<Principal, AuthError> {
        let secret = c.secret()?;
        self.verify_secret(Some(&c.method), secret)
    }

    /// Checks an HTTP `Authorization: Bearer` credential: a JWT, or an API key.
    ///
    /// # Errors
    /// Why the credential is refused, with the wire code.
    pub fn verify_bearer(&self, secret: &str) -> Result<Principal, AuthError> {
        self.verify_secret(None, secret)
    }

    /// Checks the new credential of `map/auth/refresh` (any of its shapes).
    ///
    /// # Errors
    /// Why the credential is refused, with the wire code.
    pub fn verify_refresh(&self, p: &RefreshParams) -> Result<Principal, AuthError> {
        let given = [&p.credential, &p.token, &p.refresh_token];
        let mut values = given.iter().filter_map(|v| v.as_deref());
        let Some(secret) = values.next().filter(|s| !s.is_empty()) else {
            return Err(AuthError::new(
                AuthErrorCode::AuthRequired,
                "no credential: send the new one in `credential` (or `token`, `refreshToken`)",
            ));
        };
        if values.any(|v| v != secret) {
            return Err(AuthError::new(
                AuthErrorCode::InvalidCredentials,
                "`credential`, `token` and `refreshToken` differ: send one of them",
            ));
        }
        self.verify_secret(p.method.as_deref(), secret)
    }

    /// `method: None` picks by shape: a JWT is `bearer`, anything else `api-key`. A `bearer`
    /// credential that is not a JWT is looked up as an API key (clients often send API keys as
    /// bearer tokens).
    fn verify_secret(&self, method: Option<&str>, secret: &str) -> Result<Principal, AuthError> {
        let not_enabled = |m: &str| {
            AuthError::new(
                AuthErrorCode::MethodNotSupported,
                format!(
                    "Authentication method not supported: {m} (this router accepts {})",
                    self.methods().join(", ")
                ),
            )
        };
        let method = method.unwrap_or(if looks_like_jwt(secret) {
            METHOD_BEARER
        } else {
            METHOD_API_KEY
        });
        match method {
            METHOD_BEARER => match (&self.jwt, &self.api_keys) {
                (Some(jwt), Some(_)) if looks_like_jwt(secret) => not_local(jwt.verify(secret)),
                (Some(jwt), None) => not_local(jwt.verify(secret)),
                (_, Some(keys)) => self.api_key(keys, secret),
                (None, None) => Err(not_enabled(method)),
            },
            METHOD_API_KEY => match &self.api_keys {
                Some(keys) => self.api_key(keys, secret),
                None => Err(not_enabled(method)),
            },
            other => Err(not_enabled(other)),
        }
    }

    fn api_key(&self, keys: &api_keys::ApiKeys, secret: &str) -> Result<Principal, AuthError> {
        match keys.lookup(secret) {
            Some(id) => Ok(Principal {
                id: id.to_owned(),
                issuer: None,
                expires_at: None,
            }),
            None => Err(AuthError::new(
                AuthErrorCode::InvalidCredentials,
                "unknown API key",
            )),
        }
    }
}

/// A token's principal, unless its issuer is [`LOCAL_ISSUER`]: the router's own principals
/// (trusted transports, its services) have that issuer, and no token may claim to be one of
/// them.
fn not_local(verified: Result<Principal, AuthError>) -> Result<Principal, AuthError> {
    let principal = verified?;
    if principal.issuer.as_deref() == Some(LOCAL_ISSUER) {
        return Err(AuthError::new(
            AuthErrorCode::InvalidCredentials,
            format!("the token's issuer (iss) `{LOCAL_ISSUER}` is reserved for the router's own principals"),
        ));
    }
    Ok(principal)
}

/// The id of [`service_principal`].
pub const SERVICE_PRINCIPAL: &str = "map-router:service";

/// The principal of the router's own services (the gateways' bookkeeping sessions): admitted
/// only over the in-process links the server opens for them
/// (`InProcessLinks::connect_as`), never by a credential (no API key or JWT yields issuer
/// [`LOCAL_ISSUER`]), and allowed to be `system` whatever `auth.system_principals` says.
pub fn service_principal() -> Principal {
    Principal {
        id: SERVICE_PRINCIPAL.to_owned(),
        issuer: Some(LOCAL_ISSUER.to_owned()),
        expires_at: None,
    }
}

/// Whether `p` is [`service_principal`].
pub fn is_service(p: &Principal) -> bool {
    p.id == SERVICE_PRINCIPAL && p.issuer.as_deref() == Some(LOCAL_ISSUER)
}

/// The principal of a connection admitted without credentials over a trusted transport.
pub fn trusted_principal(transport: TrustedTransport, agent: Option<&str>) -> Principal {
    let id = match (transport, agent) {
        (TrustedTransport::Supervised, Some(agent)) => format!("supervised:{agent}"),
        (TrustedTransport::Supervised, None) => "supervised".to_owned(),
        (TrustedTransport::InProcess, _) => "in-process".to_owned(),
        (TrustedTransport::Stdio, _) => "stdio".to_owned(),
    };
    Principal {
        id,
        issuer: Some(LOCAL_ISSUER.to_owned()),
        expires_at: None,
    }
}
