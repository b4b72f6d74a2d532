//! The small shared pieces of both gateways, with no state: `agent://` URIs, times in the
//! seeds' format, the seeds' error body, JSON answers, the bearer header, early answers that
//! close the connection ([`closing`]), [`GatewayError`] and
//! [`Failure`] (what a request failed with, before each edge renders it: an HTTP answer, or an
//! IM error frame).

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::client::ClientError;
use crate::protocol::jsonrpc::ErrorCode;

/// Why a gateway could not do what was asked, before its protocol's own error mapping.
#[derive(Debug)]
pub enum GatewayError {
    /// The gateway's MAP session could not be opened or a call failed for reasons of the
    /// router (it is shutting down, ...).
    Unavailable(String),
    /// The caller may not do this (403): the message says what is missing.
    Forbidden(String),
    /// A limit of the caller's was reached (429): the message names it.
    Quota(String),
    /// The caller's request rate is over its budget (429 with `Retry-After`): try again after
    /// this long. Never reported as anything else (a lookup refused for its rate is not "not
    /// found").
    RateLimited(std::time::Duration),
    /// A MAP call answered with an error.
    Map(ClientError),
}

impl From<ClientError> for GatewayError {
    fn from(e: ClientError) -> Self {
        GatewayError::Map(e)
    }
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Unavailable(why) => write!(f, "gateway unavailable: {why}"),
            GatewayError::Forbidden(why) | GatewayError::Quota(why) => write!(f, "{why}"),
            GatewayError::RateLimited(after) => {
                write!(f, "rate limited: try again in {} ms", after.as_millis())
            }
            GatewayError::Map(e) => write!(f, "{e}"),
        }
    }
}

impl GatewayError {
    /// The MAP error code of a refused MAP call.
    pub fn rpc_code(&self) -> Option<i32> {
        match self {
            GatewayError::Map(ClientError::Rpc { code, .. }) => Some(code.0),
            _ => None,
        }
    }
}

/// What a request failed with, in the seeds' terms (`{"error", "message", "status_code"}`):
/// rendered as an HTTP answer ([`Failure::response`]) or an IM error frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The HTTP status.
    pub status: StatusCode,
    /// The seeds' `error` code (`agent_not_found`, `forbidden`, ...).
    pub error: &'static str,
    /// What happened, for a person.
    pub message: String,
    /// When to try again (a rate limit): `Retry-After` over HTTP, `retry_after_ms` in an IM
    /// error frame.
    pub retry_after: Option<std::time::Duration>,
}

impl Failure {
    /// A failure.
    pub fn new(status: StatusCode, error: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            error,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 429 `rate_limited`: the caller's own budget is spent for `after`.
    pub fn rate_limited(after: std::time::Duration) -> Self {
        let after = after.max(std::time::Duration::from_millis(1));
        Self {
            retry_after: Some(after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!(
                    "too many requests from this caller: try again in {} ms",
                    after.as_millis()
                ),
            )
        }
    }

    /// 413 `message_too_large`.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "message_too_large", message)
    }

    /// 403 `forbidden`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// The HTTP answer (with `Retry-After`, in whole seconds rounded up, for a rate limit).
    pub fn response(&self) -> Response {
        let mut response = error_response(self.status, self.error, &self.message);
        if let Some(after) = self.retry_after {
            let secs = after.as_millis().div_ceil(1000).max(1);
            if let Ok(v) = axum::http::HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        response
    }

    /// The IM error frame's JSON: `{"type": "error", "error", "message"}`, plus
    /// `retry_after_ms` for a rate limit.
    pub fn frame(&self) -> serde_json::Value {
        let mut v = json!({"type": "error", "error": self.error, "message": self.message});
        if let Some(after) = self.retry_after {
            v["retry_after_ms"] = json!(after.as_millis().max(1) as u64);
        }
        v
    }
}

impl From<&GatewayError> for Failure {
    /// A 403 for what the caller may not do (a refusal of ours, or the router's 1003 and the
    /// mail extension's 10003), a 429 for a quota (ours, or the router's 4002, whose message
    /// names it), a 409 for an agent id in use (3000), a 503 when the router cannot serve, a
    /// 502 for any other MAP error.
    fn from(e: &GatewayError) -> Self {
        match e {
            GatewayError::Unavailable(why) => Failure::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "gateway_unavailable",
                why.clone(),
            ),
            GatewayError::Forbidden(why) => Failure::forbidden(why.clone()),
            GatewayError::Quota(why) => {
                Failure::new(StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", why.clone())
            }
            GatewayError::RateLimited(after) => Failure::rate_limited(*after),
            GatewayError::Map(ClientError::Rpc { code, data, .. })
                if *code == ErrorCode::RATE_LIMITED =>
            {
                Failure::rate_limited(retry_after_of(data.as_ref()))
            }
            GatewayError::Map(ClientError::Rpc { code, message, .. }) => match *code {
                ErrorCode::PERMISSION_DENIED | ErrorCode::MAIL_PERMISSION_DENIED => {
                    Failure::forbidden(message.clone())
                }
                ErrorCode::QUOTA_EXCEEDED => Failure::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "quota_exceeded",
                    message.clone(),
                ),
                ErrorCode::AGENT_EXISTS => {
                    Failure::new(StatusCode::CONFLICT, "agent_uri_in_use", message.clone())
                }
                _ => Failure::new(StatusCode::BAD_GATEWAY, "map_error", message.clone()),
            },
            GatewayError::Map(e @ (ClientError::Closed | ClientError::Transport(_))) => {
                Failure::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "gateway_unavailable",
                    format!("the gateway's MAP session ended: {e}; try again"),
                )
            }
            GatewayError::Map(e) => {
                Failure::new(StatusCode::BAD_GATEWAY, "map_error", e.to_string())
            }
        }
    }
}

/// `data.retryAfterMs` of the router's 4001 (one second when it is missing).
pub fn retry_after_of(data: Option<&serde_json::Value>) -> std::time::Duration {
    let ms = data
        .and_then(|d| d.get("retryAfterMs"))
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(1000);
    std::time::Duration::from_millis(ms.max(1))
}

impl From<GatewayError> for Failure {
    fn from(e: GatewayError) -> Self {
        Failure::from(&e)
    }
}

/// A JSON answer (axum's `Json` needs its `json` feature, which the rest of the server does
/// not use).
#[derive(Debug)]
pub struct Json<T>(pub T);

impl<T: serde::Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        match serde_json::to_vec(&self.0) {
            Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
            Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        }
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

/// The credential of an `Authorization: Bearer` header (non-empty), read by the crate's one
/// parser ([`crate::auth::bearer::credential`]).
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| crate::auth::bearer::credential(v, false))
}

/// The seeds' error body: `{"error", "message", "status_code"}`.
pub fn error_response(status: StatusCode, error: &str, message: &str) -> Response {
    (
        status,
        Json(json!({
            "error": error,
            "message": message,
            "status_code": status.as_u16(),
        })),
    )
        .into_response()
}

/// The HTTP answer for `e` ([`Failure`]'s mapping).
pub fn gateway_error_response(e: &GatewayError) -> Response {
    Failure::from(e).response()
}

/// An `agent://HOST/ID` URI (seed 000, "Agent URI"). The id is everything after the first
/// `/` following the host, and may itself contain slashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentUri {
    /// The host part.
    pub host: String,
    /// The id part.
    pub id: String,
}

impl AgentUri {
    /// The URI scheme with its slashes.
    pub const SCHEME: &'static str = "agent://";

    /// Parses `text`; `None` unless it is `agent://HOST/ID` with a non-empty host and id and
    /// no whitespace or control characters.
    pub fn parse(text: &str) -> Option<Self> {
        if text.len() > MAX_URI_BYTES || text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return None;
        }
        let rest = text.strip_prefix(Self::SCHEME)?;
        let (host, id) = rest.split_once('/')?;
        if host.is_empty() || id.is_empty() {
            return None;
        }
        Some(Self {
            host: host.to_owned(),
            id: id.to_owned(),
        })
    }
}

/// Longest agent URI accepted (a URI is an agent id too; ids this long are already odd).
pub const MAX_URI_BYTES: usize = 512;

/// Now, in Unix ms.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A Unix-ms time as the seeds write times: RFC 3339 in UTC, `2026-03-04T10:30:00.123Z`.
pub fn iso8601(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's days_from_civil, inverted).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!(
        "{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}.{:03}Z",
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_uris() {
        assert_eq!(
            AgentUri::parse("agent://other.com/a/b"),
            Some(AgentUri {
                host: "other.com".into(),
                id: "a/b".into()
            })
        );
        for bad in [
            "",
            "agent://",
            "agent://host",
            "agent://host/",
            "agent:///id",
            "http://host/id",
            "agent://h st/id",
        ] {
            assert_eq!(AgentUri::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(1_772_618_400_123), "2026-03-04T10:00:00.123Z");
        assert_eq!(iso8601(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
