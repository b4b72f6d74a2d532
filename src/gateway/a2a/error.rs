//! [`A2aError`]: every failure the gateway answers, with its JSON-RPC code (the A2A codes
//! -32001 … -32009 as `@a2a-js/sdk` maps them to its error classes, and the JSON-RPC ones) and
//! the HTTP status it goes out with. The one place MAP errors become A2A errors
//! ([`A2aError::from_map`]).
//!
//! MAP's limits keep the router's words: a rate limit (4001) and a quota (4002) answer HTTP 429
//! with the MAP code as the JSON-RPC code and the router's message (which says which quota, or
//! when to retry), never a 404 or 503 that would send the caller looking elsewhere.

use axum::http::StatusCode;

use crate::client::ClientError;

/// The `A2A-Version`s the endpoint speaks (major.minor; a patch, `1.0.0`, is accepted too).
pub const SUPPORTED_VERSIONS: [&str; 2] = ["1.0", "0.3"];

/// A2A / JSON-RPC error codes.
pub mod code {
    /// Not JSON.
    pub const PARSE_ERROR: i32 = -32700;
    /// Not a JSON-RPC request.
    pub const INVALID_REQUEST: i32 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i32 = -32601;
    /// Params of the wrong shape.
    pub const INVALID_PARAMS: i32 = -32602;
    /// Our failure.
    pub const INTERNAL_ERROR: i32 = -32603;
    /// No such task (or not one the caller may see on this endpoint).
    pub const TASK_NOT_FOUND: i32 = -32001;
    /// The task has already ended.
    pub const TASK_NOT_CANCELABLE: i32 = -32002;
    /// Push notifications are not offered.
    pub const PUSH_NOTIFICATION_NOT_SUPPORTED: i32 = -32003;
    /// Not supported here.
    pub const UNSUPPORTED_OPERATION: i32 = -32004;
    /// The request's `Content-Type` is not JSON.
    pub const CONTENT_TYPE_NOT_SUPPORTED: i32 = -32005;
    /// No extended card.
    pub const EXTENDED_CARD_NOT_CONFIGURED: i32 = -32007;
    /// The `A2A-Version` the caller asked for is not one the gateway speaks (1.0, 0.3).
    pub const VERSION_NOT_SUPPORTED: i32 = -32009;
    /// MAP's `4001 Rate limited`, passed through (HTTP 429, `Retry-After`).
    pub const RATE_LIMITED: i32 = 4001;
    /// MAP's `4002 Quota exceeded`, passed through (HTTP 429).
    pub const QUOTA_EXCEEDED: i32 = 4002;
}

/// A failure to answer as a JSON-RPC error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct A2aError {
    /// The JSON-RPC `error.code`.
    pub code: i32,
    /// The JSON-RPC `error.message`.
    pub message: String,
    /// The HTTP status of the answer (200 for errors of a well-formed call, as JSON-RPC over
    /// HTTP does; 404 for an unknown agent, 413 for an oversize body, 401 for a missing or
    /// refused credential, 403 for a MAP permission the caller lacks, 429 for a MAP rate limit
    /// or quota, 503 while the gateway's MAP session cannot be opened).
    pub status: StatusCode,
    /// When to try again (a rate limit): sent as `Retry-After` (whole seconds, rounded up).
    pub retry_after: Option<std::time::Duration>,
    /// `google.rpc.ErrorInfo.metadata` of an A2A error (v1.0 answers carry it, see
    /// [`A2aError::error_info`]): e.g. `taskId`.
    pub metadata: Vec<(&'static str, String)>,
}

impl A2aError {
    fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            status: StatusCode::OK,
            retry_after: None,
            metadata: Vec::new(),
        }
    }

    /// With one more `ErrorInfo.metadata` entry.
    pub fn with_metadata(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.metadata.push((key, value.into()));
        self
    }

    /// The `ErrorInfo.reason` of an A2A-specific error (-32001 … -32009, A2A 1.0 §5.4), `None`
    /// for the JSON-RPC ones and MAP's limits.
    pub fn reason(&self) -> Option<&'static str> {
        Some(match self.code {
            code::TASK_NOT_FOUND => "TASK_NOT_FOUND",
            code::TASK_NOT_CANCELABLE => "TASK_NOT_CANCELABLE",
            code::PUSH_NOTIFICATION_NOT_SUPPORTED => "PUSH_NOTIFICATION_NOT_SUPPORTED",
            code::UNSUPPORTED_OPERATION => "UNSUPPORTED_OPERATION",
            code::CONTENT_TYPE_NOT_SUPPORTED => "CONTENT_TYPE_NOT_SUPPORTED",
            -32006 => "INVALID_AGENT_RESPONSE",
            code::EXTENDED_CARD_NOT_CONFIGURED => "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
            -32008 => "EXTENSION_SUPPORT_REQUIRED",
            code::VERSION_NOT_SUPPORTED => "VERSION_NOT_SUPPORTED",
            _ => return None,
        })
    }

    /// The `error.data` of a v1.0 answer (A2A 1.0 §9.5, as `@a2a-js/sdk`'s `toJsonRpcError`
    /// writes it): `[{"@type": "type.googleapis.com/google.rpc.ErrorInfo", reason, domain:
    /// "a2a-protocol.org", metadata?}]` for an A2A-specific error; `None` for the others. v0.3
    /// answers carry no `data` (the SDK's v0.3 layer writes none either).
    pub fn error_info(&self) -> Option<serde_json::Value> {
        let reason = self.reason()?;
        let mut info = serde_json::json!({
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": reason,
            "domain": "a2a-protocol.org",
        });
        if !self.metadata.is_empty() {
            let m: serde_json::Map<String, serde_json::Value> = self
                .metadata
                .iter()
                .map(|(k, v)| ((*k).to_owned(), serde_json::Value::String(v.clone())))
                .collect();
            info["metadata"] = serde_json::Value::Object(m);
        }
        Some(serde_json::Value::Array(vec![info]))
    }

    /// With another HTTP status.
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// -32700.
    pub fn parse_error(detail: impl std::fmt::Display) -> Self {
        Self::new(code::PARSE_ERROR, format!("Parse error: {detail}"))
    }

    /// -32600.
    pub fn invalid_request(detail: impl std::fmt::Display) -> Self {
        Self::new(code::INVALID_REQUEST, format!("Invalid request: {detail}"))
    }

    /// -32601. A name longer than MAP's `MAX_ECHOED_METHOD` bytes is cut there (with `…`), as
    /// MAP does: a hostile name is not reflected back whole.
    pub fn method_not_found(method: &str) -> Self {
        let max = crate::protocol::jsonrpc::MAX_ECHOED_METHOD;
        let shown = if method.len() > max {
            let mut cut = max;
            while !method.is_char_boundary(cut) {
                cut -= 1;
            }
            format!("{}…", &method[..cut])
        } else {
            method.to_owned()
        };
        Self::new(code::METHOD_NOT_FOUND, format!("Method not found: {shown}"))
    }

    /// -32602.
    pub fn invalid_params(detail: impl std::fmt::Display) -> Self {
        Self::new(code::INVALID_PARAMS, format!("Invalid params: {detail}"))
    }

    /// -32603.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        Self::new(code::INTERNAL_ERROR, format!("Internal error: {detail}"))
    }

    /// -32001.
    pub fn task_not_found(id: &str) -> Self {
        Self::new(code::TASK_NOT_FOUND, format!("Task not found: {id}")).with_metadata("taskId", id)
    }

    /// -32002.
    pub fn not_cancelable(id: &str, state: &str) -> Self {
        Self::new(
            code::TASK_NOT_CANCELABLE,
            format!("Task cannot be canceled: {id} is {state}"),
        )
        .with_metadata("taskId", id)
        .with_metadata("state", state)
    }

    /// -32003.
    pub fn push_not_supported() -> Self {
        Self::new(
            code::PUSH_NOTIFICATION_NOT_SUPPORTED,
            "Push Notification is not supported",
        )
    }

    /// -32004.
    pub fn unsupported(detail: impl std::fmt::Display) -> Self {
        Self::new(
            code::UNSUPPORTED_OPERATION,
            format!("This operation is not supported: {detail}"),
        )
    }

    /// -32007.
    pub fn no_extended_card() -> Self {
        Self::new(
            code::EXTENDED_CARD_NOT_CONFIGURED,
            "Extended Agent Card not configured",
        )
    }

    /// -32009: an `A2A-Version` the gateway does not speak.
    pub fn version_not_supported(requested: &str) -> Self {
        let shown: String = requested.chars().take(32).collect();
        Self::new(
            code::VERSION_NOT_SUPPORTED,
            format!(
                "Version not supported: A2A-Version {shown:?}; this endpoint speaks {}",
                SUPPORTED_VERSIONS.join(", ")
            ),
        )
        .with_metadata("requestedVersion", shown)
        .with_metadata("supportedVersions", SUPPORTED_VERSIONS.join(","))
    }

    /// -32005: the body is not declared JSON (`application/json`, `application/a2a+json`).
    pub fn content_type_not_supported(found: Option<&str>) -> Self {
        let found = found.map_or_else(
            || "none".to_owned(),
            |f| format!("{:?}", f.chars().take(64).collect::<String>()),
        );
        Self::new(
            code::CONTENT_TYPE_NOT_SUPPORTED,
            format!(
                "Incompatible content types: Content-Type {found}; expected application/json or application/a2a+json"
            ),
        )
    }

    /// The caller's own request rate was reached (the gateway's bucket for its principal, or
    /// its address): 4001 with HTTP 429 and `Retry-After`.
    pub fn caller_rate_limited(wait: std::time::Duration, rate: (u32, u32)) -> Self {
        let mut e = Self::new(
            code::RATE_LIMITED,
            format!(
                "Rate limited: this caller's A2A request rate ({}/s, bursts of {}) was reached; retry after {} ms",
                rate.0,
                rate.1,
                wait.as_millis().max(1)
            ),
        )
        .with_status(StatusCode::TOO_MANY_REQUESTS);
        e.retry_after = Some(wait);
        e
    }

    /// A request larger than a limit (the body, or what MAP would carry): -32600 with HTTP 413.
    pub fn too_large(detail: impl std::fmt::Display) -> Self {
        Self::invalid_request(detail).with_status(StatusCode::PAYLOAD_TOO_LARGE)
    }

    /// A permission the caller lacks (a MAP grant of its principal): -32600 with HTTP 403.
    pub fn forbidden(detail: impl std::fmt::Display) -> Self {
        Self::invalid_request(format!("permission denied: {detail}"))
            .with_status(StatusCode::FORBIDDEN)
    }

    /// An agent id or name that names no agent the caller may see: -32602 with HTTP 404.
    pub fn unknown_agent(id: &str) -> Self {
        Self::invalid_params(format!("no agent {id:?} on this router"))
            .with_status(StatusCode::NOT_FOUND)
    }

    /// A MAP error from a call the gateway made for `task` (when it was about one).
    pub fn from_map(e: &ClientError, task: Option<&str>) -> Self {
        match (e, task) {
            // 14001: task not found (or invisible).
            (ClientError::Rpc { code, .. }, Some(id)) if code.0 == 14001 => {
                Self::task_not_found(id)
            }
            (ClientError::Rpc { code, message, .. }, _) if code.0 == 1003 || code.0 == 14003 => {
                Self::forbidden(message)
            }
            (ClientError::Rpc { code, data, .. }, _) if code.0 == code::RATE_LIMITED => {
                let wait = data
                    .as_ref()
                    .and_then(|d| d.get("retryAfterMs"))
                    .and_then(serde_json::Value::as_u64)
                    .map(std::time::Duration::from_millis);
                let mut e = Self::new(
                    code::RATE_LIMITED,
                    match wait {
                        Some(w) => format!(
                            "Rate limited: MAP's request rate limit was reached; retry after {} ms",
                            w.as_millis()
                        ),
                        None => "Rate limited: MAP's request rate limit was reached".into(),
                    },
                )
                .with_status(StatusCode::TOO_MANY_REQUESTS);
                e.retry_after = wait;
                e
            }
            (ClientError::Rpc { code, message, .. }, _) if code.0 == code::QUOTA_EXCEEDED => {
                Self::new(code::QUOTA_EXCEEDED, message.clone())
                    .with_status(StatusCode::TOO_MANY_REQUESTS)
            }
            (ClientError::Auth(a), _) => {
                Self::new(code::INVALID_REQUEST, format!("Authentication failed: {a}"))
                    .with_status(StatusCode::UNAUTHORIZED)
            }
            (other, _) => Self::internal(other),
        }
    }
}

impl std::fmt::Display for A2aError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}
