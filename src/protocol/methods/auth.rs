//! `map/authenticate`, `map/auth/refresh`, the `authRequired` answer of `map/connect`, and the
//! `map/auth/expiring` notification (wire.md §4.3, §6, §7).
//!
//! Auth failures are *results*, not JSON-RPC errors: `{success: false, error: {code, message}}`
//! with a string [`AuthErrorCode`], as the SDK types them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::methods::method::method;
use crate::protocol::methods::session::AuthCredentials;
use crate::protocol::methods::session::ConnectResult;
use crate::protocol::methods::session::Principal;
// The vocabulary of `map/connect`'s answer lives with `map/connect`; re-exported here, where it
// was first defined.
pub use crate::protocol::methods::session::AuthError;
pub use crate::protocol::methods::session::AuthErrorCode;
pub use crate::protocol::methods::session::AuthRequiredInfo;
pub use crate::protocol::methods::session::AuthRequiredResult;
pub use crate::protocol::methods::session::ConnectResponse;

/// `map/authenticate` params: the same object as `map/connect`'s `auth`.
pub type AuthenticateParams = AuthCredentials;

/// `map/authenticate` result.
///
/// On success it carries the whole connect result of the session it opened (`sessionId`,
/// `participantId`, `principal`, `resumeToken`, `capabilities`, ...), a superset of the SDK's
/// `{success, sessionId, participantId, principal}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthenticateResult {
    /// Whether the credential was accepted.
    pub success: bool,
    /// The session (on success).
    #[serde(flatten)]
    pub session: Option<Box<ConnectResult>>,
    /// Why not (on failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<AuthError>,
}

/// `map/auth/refresh` params, in every shape a client sends: `{method, credential}` (both SDK
/// clients), `{method, token}`, `{credential}` (docs) or `{refreshToken}` (SDK type / schema).
/// Whichever is present is the new credential; it must name the session's principal. `Debug`
/// never shows it.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct RefreshParams {
    /// `bearer` or `api-key`; when absent, a JWT-shaped credential is `bearer`, anything else
    /// `api-key`.
    pub method: Option<String>,
    /// The new credential.
    pub credential: Option<String>,
    /// The new credential (schema spelling).
    pub token: Option<String>,
    /// The new credential (SDK type spelling; this router issues no refresh tokens of its own).
    pub refresh_token: Option<String>,
    /// Free-form.
    pub metadata: Option<serde_json::Value>,
}

impl std::fmt::Debug for RefreshParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redact = |v: &Option<String>| v.as_ref().map(|_| "***");
        f.debug_struct("RefreshParams")
            .field("method", &self.method)
            .field("credential", &redact(&self.credential))
            .field("token", &redact(&self.token))
            .field("refresh_token", &redact(&self.refresh_token))
            .finish()
    }
}

/// `map/auth/refresh` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefreshResult {
    /// Whether the new credential was accepted (the session keeps its old one otherwise).
    pub success: bool,
    /// The session's principal with its new expiry (on success).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<Principal>,
    /// The new expiry, Unix ms (on success, when the credential expires; the SDK type's field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// Why not (on failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<AuthError>,
}

/// `map/auth/expiring` params: sent once, before the session's credential expires.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthExpiringParams {
    /// When the credential expires (Unix ms; the JWT `exp`).
    pub expires_at: u64,
    /// Milliseconds from now until then.
    pub expires_in_ms: u64,
    /// Refresh (`map/auth/refresh`) before this instant (Unix ms) to keep the session.
    pub refresh_before: u64,
}

method!(
    /// `map/authenticate`: authenticate the connection; completes a `map/connect` that answered
    /// `authRequired`.
    Authenticate, "map/authenticate", None, AuthenticateParams, AuthenticateResult
);
method!(
    /// `map/auth/refresh`: swap the session's credential for a new one of the same principal.
    AuthRefresh, "map/auth/refresh", None, RefreshParams, RefreshResult
);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn auth_required_and_failures_have_the_sdk_shapes() {
        let r = ConnectResponse::AuthRequired(AuthRequiredResult {
            auth_required: AuthRequiredInfo {
                methods: vec!["bearer".into(), "api-key".into()],
                required: true,
                realm: Some("r".into()),
            },
            error: Some(AuthError::new(AuthErrorCode::InvalidCredentials, "bad")),
        });
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"authRequired": {"methods": ["bearer", "api-key"], "required": true, "realm": "r"},
                   "error": {"code": "invalid_credentials", "message": "bad"}})
        );
        let failed = AuthenticateResult {
            success: false,
            session: None,
            error: Some(AuthError::new(AuthErrorCode::Expired, "old")),
        };
        assert_eq!(
            serde_json::to_value(&failed).unwrap(),
            json!({"success": false, "error": {"code": "expired", "message": "old"}})
        );
    }

    #[test]
    fn refresh_accepts_every_shape() {
        for v in [
            json!({"method": "bearer", "credential": "t"}),
            json!({"method": "bearer", "token": "t"}),
            json!({"credential": "t"}),
            json!({"refreshToken": "t"}),
        ] {
            let p: RefreshParams = serde_json::from_value(v.clone()).unwrap();
            assert!(
                p.credential.or(p.token).or(p.refresh_token).as_deref() == Some("t"),
                "{v}"
            );
        }
    }
}
