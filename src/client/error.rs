//! [`ClientError`]: everything a client call can fail with.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::methods::auth::{AuthError, AuthErrorCode};

/// Why a client call failed.
///
/// Server errors keep the MAP error object intact (`code`, `message`, `data`), so callers can
/// match on codes such as [`ErrorCode::AGENT_NOT_FOUND`]:
///
/// ```
/// use map_router::client::ClientError;
/// use map_router::protocol::jsonrpc::ErrorCode;
///
/// fn describe(e: &ClientError) -> &'static str {
///     match e {
///         ClientError::Rpc { code: ErrorCode::AGENT_NOT_FOUND, .. } => "no such agent",
///         ClientError::Rpc { .. } => "the router refused",
///         e if e.is_retryable() => "try again",
///         _ => "failed",
///     }
/// }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ClientError {
    /// The router answered with a JSON-RPC / MAP error.
    Rpc {
        /// The numeric code (`-32601`, `2001`, ...).
        code: ErrorCode,
        /// The router's message, e.g. `Agent not found: a1`.
        message: String,
        /// `error.data` as sent (`category`, `details`, `retryable`, ...), if any.
        data: Option<serde_json::Value>,
    },
    /// No response within the request timeout. The call may or may not have taken effect.
    Timeout(Duration),
    /// The client was closed (by [`Client::close`](super::Client::close), by dropping every
    /// handle, or because reconnecting gave up).
    Closed,
    /// The transport failed: the connection could not be opened, or it was lost while the
    /// request was in flight. Retryable: the client reconnects by itself when its policy allows.
    Transport(String),
    /// A frame or a result could not be decoded into the expected type.
    Decode(String),
    /// The router's TLS certificate is not trusted for this URL: signed by a CA the client does
    /// not trust, expired, or issued for another host name. Trust the router's CA with
    /// [`ClientOptions::ca_file`](super::ClientOptions::ca_file). Not retryable as it is.
    UntrustedCertificate {
        /// The URL connected to (`wss://...`).
        url: String,
        /// What was wrong with the certificate (rustls's words, e.g.
        /// `invalid peer certificate: UnknownIssuer`).
        reason: String,
    },
    /// The CA file given with [`ClientOptions::ca_file`](super::ClientOptions::ca_file) cannot
    /// be used: unreadable, not PEM, or without a certificate. Not retryable.
    CaFile {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// The router requires authentication and refused (or was not given) credentials
    /// (`map/connect` answered `authRequired`). Not retryable with the same credentials.
    Auth(AuthError),
    /// A [`Client::request`](super::Client::request) reached nobody: the router answered its
    /// `map/send` with no recipient delivered or queued (the agent is gone, or the address
    /// matched no one), so no reply can come. Returned at once instead of waiting for the
    /// timeout.
    NoRecipient {
        /// The id the router gave the message.
        message_id: String,
    },
}

impl ClientError {
    /// The MAP error code of a server error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Rpc { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// `error.data.category` of a server error (`routing`, `auth`, ...).
    pub fn category(&self) -> Option<&str> {
        match self {
            Self::Rpc { data: Some(d), .. } => d.get("category")?.as_str(),
            _ => None,
        }
    }

    /// `error.data.details` of a server error (for `-32602`, which field was wrong and why).
    pub fn details(&self) -> Option<&serde_json::Value> {
        match self {
            Self::Rpc { data: Some(d), .. } => d.get("details"),
            _ => None,
        }
    }

    /// Whether the same call may succeed if retried: transport failures and timeouts, and
    /// server errors that say `data.retryable: true`.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Transport(_) | Self::Timeout(_) => true,
            Self::Rpc { data: Some(d), .. } => {
                d.get("retryable") == Some(&serde_json::Value::Bool(true))
            }
            _ => false,
        }
    }

    /// Whether the router requires authentication and was given no credentials
    /// (`map/connect` answered `authRequired` with code `auth_required`). Credentials that were
    /// given and refused are [`ClientError::Auth`] with another code (`invalid_credentials`,
    /// `expired`, ...).
    pub fn is_auth_required(&self) -> bool {
        matches!(self, Self::Auth(e) if e.code == AuthErrorCode::AuthRequired)
    }

    pub(crate) fn decode(what: &str, e: impl fmt::Display) -> Self {
        Self::Decode(format!("{what}: {e}"))
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rpc {
                code,
                message,
                data,
            } => {
                write!(f, "MAP error {}: {message}", code.0)?;
                match data.as_ref().and_then(|d| d.get("details")) {
                    Some(serde_json::Value::String(s)) => write!(f, " ({s})"),
                    Some(d) => match d.get("reason").and_then(|r| r.as_str()) {
                        Some(reason) => write!(f, " ({reason})"),
                        None => write!(f, " ({d})"),
                    },
                    None => Ok(()),
                }
            }
            Self::Timeout(after) => write!(f, "no response within {after:?}"),
            Self::Closed => f.write_str("the client is closed"),
            Self::Transport(why) => write!(f, "transport: {why}"),
            Self::Decode(why) => write!(f, "cannot decode {why}"),
            Self::UntrustedCertificate { url, reason } => write!(
                f,
                "cannot connect to {url}: TLS certificate not trusted ({reason}); trust the \
                 router's CA with ClientOptions::ca_file"
            ),
            Self::CaFile { path, reason } => write!(f, "CA file {}: {reason}", path.display()),
            Self::Auth(e) => write!(
                f,
                "authentication refused ({}): {}",
                e.code.as_str(),
                e.message
            ),
            Self::NoRecipient { message_id } => write!(
                f,
                "nobody received the request (message {message_id}): no recipient is connected, \
                 so no reply can come"
            ),
        }
    }
}

impl std::error::Error for ClientError {}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rpc_errors_show_code_message_and_details() {
        let e = ClientError::Rpc {
            code: ErrorCode::INVALID_PARAMS,
            message: "Invalid params".into(),
            data: Some(json!({"category": "protocol", "details": "missing field `agentId`"})),
        };
        assert_eq!(
            e.to_string(),
            "MAP error -32602: Invalid params (missing field `agentId`)"
        );
        assert_eq!(e.category(), Some("protocol"));
        assert!(!e.is_retryable());
        assert!(ClientError::Transport("lost".into()).is_retryable());
        let retry = ClientError::Rpc {
            code: ErrorCode::RATE_LIMITED,
            message: "slow down".into(),
            data: Some(json!({"category": "resource", "retryable": true})),
        };
        assert!(retry.is_retryable());
    }

    #[test]
    fn auth_required_is_told_apart_from_refused_credentials() {
        let missing = ClientError::Auth(AuthError::new(AuthErrorCode::AuthRequired, "no"));
        let refused = ClientError::Auth(AuthError::new(AuthErrorCode::InvalidCredentials, "no"));
        assert!(missing.is_auth_required());
        assert!(!refused.is_auth_required());
        assert!(!ClientError::Closed.is_auth_required());
    }
}
