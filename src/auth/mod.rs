//! Authentication: who is on the other end of a connection.
//!
//! Owns the configured methods and their key material ([`config`] reads it once, at start-up:
//! API keys in [`api_keys`], a JWT secret and a JWKS in [`jwt`]) and the pure check of one
//! credential: [`Authenticator::verify`] turns an `auth` object into a [`Principal`] (with its
//! expiry) or an [`AuthError`] with the wire code. It keeps no session state and does no I/O
//! after start-up.
//!
//! What a verdict means for a connection (authRequired, pending connects, resume, refresh,
//! expiry) is decided by the router (`router::auth_ops`). Verification runs on the connection's
//! task, never on the router's: a signature check is CPU work the router must not wait for.
//! The rules are documented in docs/security.md.

pub mod api_keys;
pub mod config;
pub mod jwt;

use std::time::Duration;

use crate::protocol::methods::auth::{
    AuthError, AuthErrorCode, AuthRequiredInfo, AuthRequiredResult, RefreshParams,
};
use crate::protocol::methods::session::{AuthCredentials, Principal};

pub use config::{AuthSettings, TrustedTransport};

/// The wire name of JWT authentication.
pub const METHOD_BEARER: &str = "bearer";
/// The wire name of API-key authentication.
pub const METHOD_API_KEY: &str = "api-key";
/// The issuer of the principals the router asserts itself (trusted transports).
pub const LOCAL_ISSUER: &str = "map-router";

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
                (Some(jwt), Some(_)) if looks_like_jwt(secret) => jwt.verify(secret),
                (Some(jwt), None) => jwt.verify(secret),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::config::Secret;

    fn keys_only() -> Authenticator {
        let mut s = AuthSettings::default();
        s.api_keys.inline = Some(Secret("k-0123456789abcdef alice".into()));
        Authenticator::clone_of(&s)
    }

    impl Authenticator {
        fn clone_of(s: &AuthSettings) -> Authenticator {
            let a = s.build("realm").unwrap().unwrap();
            std::sync::Arc::try_unwrap(a).unwrap()
        }
    }

    fn creds(method: &str, credential: Option<&str>, token: Option<&str>) -> AuthCredentials {
        AuthCredentials {
            method: method.into(),
            credential: credential.map(Into::into),
            token: token.map(Into::into),
            metadata: None,
        }
    }

    #[test]
    fn both_spellings_and_bearer_api_keys() {
        let a = keys_only();
        assert_eq!(a.methods(), vec!["api-key"]);
        for c in [
            creds("api-key", Some("k-0123456789abcdef"), None),
            creds("api-key", None, Some("k-0123456789abcdef")),
            creds("bearer", Some("k-0123456789abcdef"), None),
        ] {
            assert_eq!(a.verify(&c).unwrap().id, "alice");
        }
        let e = a
            .verify(&creds("api-key", Some("k-0123456789abcdeX"), None))
            .unwrap_err();
        assert_eq!(e.code, AuthErrorCode::InvalidCredentials);
        let e = a.verify(&creds("api-key", None, None)).unwrap_err();
        assert_eq!(e.code, AuthErrorCode::AuthRequired);
        let e = a
            .verify(&creds(
                "api-key",
                Some("a-0123456789abcdef"),
                Some("b-0123456789abcdef"),
            ))
            .unwrap_err();
        assert_eq!(e.code, AuthErrorCode::InvalidCredentials);
        let e = a
            .verify(&creds("mtls", Some("k-0123456789abcdef"), None))
            .unwrap_err();
        assert_eq!(e.code, AuthErrorCode::MethodNotSupported);
        assert!(e
            .message
            .starts_with("Authentication method not supported: mtls"));
    }

    #[test]
    fn refresh_takes_any_shape() {
        let a = keys_only();
        let p = RefreshParams {
            refresh_token: Some("k-0123456789abcdef".into()),
            ..RefreshParams::default()
        };
        assert_eq!(a.verify_refresh(&p).unwrap().id, "alice");
        let e = a.verify_refresh(&RefreshParams::default()).unwrap_err();
        assert_eq!(e.code, AuthErrorCode::AuthRequired);
    }

    #[test]
    fn trusted_principals_are_local() {
        let p = trusted_principal(TrustedTransport::Supervised, Some("a1"));
        assert_eq!(p.id, "supervised:a1");
        assert_eq!(p.issuer.as_deref(), Some(LOCAL_ISSUER));
    }
}
