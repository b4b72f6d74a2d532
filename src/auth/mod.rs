//! Authentication: who is on the other end of a connection.
//!
//! Owns the configured methods and their key material ([`config`] reads it once, at start-up:
//! API keys in [`api_keys`], a JWT secret and a JWKS in [`jwt`]) and the pure check of one
//! credential: [`Authenticator::verify`] turns an `auth` object into a [`Principal`](crate::protocol::methods::session::Principal) (with its
//! expiry) or an [`AuthError`](crate::protocol::methods::session::AuthError) with the wire code. It keeps no session state and does no I/O
//! after start-up. [`bearer`] is the crate's one parser of an `Authorization: Bearer` value.
//!
//! What a verdict means for a connection (authRequired, pending connects, resume, refresh,
//! expiry) is decided by the router (`router::sessions::auth`). Verification runs on the connection's
//! task, never on the router's: a signature check is CPU work the router must not wait for.
//! The rules are documented in docs/security.md.

pub mod api_keys;
mod authenticator;
pub mod bearer;
pub mod config;
pub mod jwt;

pub use authenticator::{
    is_service, service_principal, trusted_principal, Authenticator, TrustedTransport,
    LOCAL_ISSUER, METHOD_API_KEY, METHOD_BEARER, SERVICE_PRINCIPAL,
};
pub use config::AuthSettings;
