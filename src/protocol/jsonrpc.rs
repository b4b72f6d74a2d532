//! JSON-RPC 2.0 envelopes: classifying incoming frames, and writing responses.
//!
//! Owns the rules from `wire.md` §2: what counts as a request, a notification or a response; how
//! ids are echoed (byte for byte, so a number stays a number); that an absent `params` means `{}`;
//! and that every success response carries `result`. Nothing here knows a MAP method.

use std::fmt::Write as _;

use schemars::JsonSchema;
use serde::de::Deserializer;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The JSON-RPC request id, kept as the exact JSON text the peer sent (`7`, `"a"`, `null`).
/// Echoing the text guarantees the SDK's strict `===` match on its integer ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Id(Box<str>);

impl Id {
    /// The `null` id used for errors that cannot be tied to a request.
    pub fn null() -> Self {
        Self("null".into())
    }

    /// An integer id (used by tests and the Rust client).
    pub fn number(n: u64) -> Self {
        Self(n.to_string().into())
    }

    /// Validates raw JSON as an id: a string, a number or `null` (JSON-RPC 2.0 §4).
    ///
    /// A number must also fit a double (`1e400` does not): the id is echoed verbatim, and a
    /// response that a strict JSON parser cannot read would never reach its caller.
    pub fn from_raw(raw: &RawValue) -> Option<Self> {
        let text = raw.get().trim();
        match text.as_bytes().first()? {
            b'"' => Some(Self(text.into())),
            b'-' | b'0'..=b'9' => serde_json::from_str::<serde_json::Number>(text)
                .ok()
                .map(|_| Self(text.into())),
            b'n' if text == "null" => Some(Self(text.into())),
            _ => None,
        }
    }

    /// The id as JSON text.
    pub fn as_json(&self) -> &str {
        &self.0
    }
}

/// A JSON-RPC error code. A newtype rather than an enum so MAP can add codes freely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct ErrorCode(pub i32);

#[allow(missing_docs)]
impl ErrorCode {
    // JSON-RPC 2.0
    pub const PARSE_ERROR: Self = Self(-32700);
    pub const INVALID_REQUEST: Self = Self(-32600);
    pub const METHOD_NOT_FOUND: Self = Self(-32601);
    pub const INVALID_PARAMS: Self = Self(-32602);
    pub const INTERNAL_ERROR: Self = Self(-32603);
    // MAP auth (1xxx)
    pub const AUTH_REQUIRED: Self = Self(1000);
    pub const AUTH_FAILED: Self = Self(1001);
    pub const TOKEN_EXPIRED: Self = Self(1002);
    pub const PERMISSION_DENIED: Self = Self(1003);
    pub const INSUFFICIENT_SCOPE: Self = Self(1004);
    pub const METHOD_NOT_SUPPORTED: Self = Self(1005);
    pub const INVALID_CREDENTIALS: Self = Self(1006);
    // MAP routing (2xxx)
    pub const ADDRESS_NOT_FOUND: Self = Self(2000);
    pub const AGENT_NOT_FOUND: Self = Self(2001);
    pub const SCOPE_NOT_FOUND: Self = Self(2002);
    pub const DELIVERY_FAILED: Self = Self(2003);
    pub const ADDRESS_AMBIGUOUS: Self = Self(2004);
    // MAP agent (3xxx)
    pub const AGENT_EXISTS: Self = Self(3000);
    pub const STATE_INVALID: Self = Self(3001);
    pub const NOT_RESPONDING: Self = Self(3002);
    pub const TERMINATED: Self = Self(3003);
    pub const SPAWN_FAILED: Self = Self(3004);
    // MAP resources (4xxx)
    pub const EXHAUSTED: Self = Self(4000);
    pub const RATE_LIMITED: Self = Self(4001);
    pub const QUOTA_EXCEEDED: Self = Self(4002);
    // MAP federation (5xxx)
    pub const FEDERATION_UNAVAILABLE: Self = Self(5000);
    pub const FEDERATION_SYSTEM_NOT_FOUND: Self = Self(5001);
    pub const FEDERATION_NOT_ALLOWED: Self = Self(5003);
    pub const FEDERATION_LOOP: Self = Self(5010);
    pub const FEDERATION_MAX_HOPS: Self = Self(5011);
    // Mail extension (10xxx, `urn:map:ext:mail:1`; the SDK's MAIL_ERROR_CODES).
    pub const MAIL_CONVERSATION_NOT_FOUND: Self = Self(10000);
    pub const MAIL_CONVERSATION_CLOSED: Self = Self(10001);
    pub const MAIL_NOT_A_PARTICIPANT: Self = Self(10002);
    pub const MAIL_PERMISSION_DENIED: Self = Self(10003);
    pub const MAIL_TURN_NOT_FOUND: Self = Self(10004);
    pub const MAIL_THREAD_NOT_FOUND: Self = Self(10005);
    pub const MAIL_INVALID_TURN_CONTENT: Self = Self(10006);
    pub const MAIL_PARTICIPANT_ALREADY_JOINED: Self = Self(10007);
    pub const MAIL_HISTORY_ACCESS_DENIED: Self = Self(10009);
    pub const MAIL_PARENT_CONVERSATION_NOT_FOUND: Self = Self(10010);
    // Trajectory extension (13xxx, `urn:map:ext:trajectory:1`).
    pub const CHECKPOINT_NOT_FOUND: Self = Self(13001);
    pub const CONTENT_UNAVAILABLE: Self = Self(13002);
    pub const TRAJECTORY_PERMISSION_DENIED: Self = Self(13004);
    // Tasks extension (14xxx, `urn:map:ext:tasks:1`).
    pub const TASK_NOT_FOUND: Self = Self(14001);
    pub const TASK_ASSIGNMENT_FAILED: Self = Self(14002);
    pub const TASK_PERMISSION_DENIED: Self = Self(14003);
    // Sessions extension (16xxx, `urn:map:ext:sessions:1`'s range; the codes are ours).
    pub const SESSION_NOT_FOUND: Self = Self(16000);
    pub const SESSION_IN_USE: Self = Self(16001);
    // Traces (17xxx, ours: `map/traces/get`).
    pub const TRACE_NOT_FOUND: Self = Self(17001);

    /// Every code this router sends (the documented set: wire.md §3 and `docs/security.md`).
    /// The fuzz property tests check that no other code ever reaches a peer.
    pub const ALL: [Self; 49] = [
        Self::PARSE_ERROR,
        Self::INVALID_REQUEST,
        Self::METHOD_NOT_FOUND,
        Self::INVALID_PARAMS,
        Self::INTERNAL_ERROR,
        Self::AUTH_REQUIRED,
        Self::AUTH_FAILED,
        Self::TOKEN_EXPIRED,
        Self::PERMISSION_DENIED,
        Self::INSUFFICIENT_SCOPE,
        Self::METHOD_NOT_SUPPORTED,
        Self::INVALID_CREDENTIALS,
        Self::ADDRESS_NOT_FOUND,
        Self::AGENT_NOT_FOUND,
        Self::SCOPE_NOT_FOUND,
        Self::DELIVERY_FAILED,
        Self::ADDRESS_AMBIGUOUS,
        Self::AGENT_EXISTS,
        Self::STATE_INVALID,
        Self::NOT_RESPONDING,
        Self::TERMINATED,
        Self::SPAWN_FAILED,
        Self::EXHAUSTED,
        Self::RATE_LIMITED,
        Self::QUOTA_EXCEEDED,
        Self::FEDERATION_UNAVAILABLE,
        Self::FEDERATION_SYSTEM_NOT_FOUND,
        Self::FEDERATION_NOT_ALLOWED,
        Self::FEDERATION_LOOP,
        Self::FEDERATION_MAX_HOPS,
        Self::MAIL_CONVERSATION_NOT_FOUND,
        Self::MAIL_CONVERSATION_CLOSED,
        Self::MAIL_NOT_A_PARTICIPANT,
        Self::MAIL_PERMISSION_DENIED,
        Self::MAIL_TURN_NOT_FOUND,
        Self::MAIL_THREAD_NOT_FOUND,
        Self::MAIL_INVALID_TURN_CONTENT,
        Self::MAIL_PARTICIPANT_ALREADY_JOINED,
        Self::MAIL_HISTORY_ACCESS_DENIED,
        Self::MAIL_PARENT_CONVERSATION_NOT_FOUND,
        Self::CHECKPOINT_NOT_FOUND,
        Self::CONTENT_UNAVAILABLE,
        Self::TRAJECTORY_PERMISSION_DENIED,
        Self::TASK_NOT_FOUND,
        Self::TASK_ASSIGNMENT_FAILED,
        Self::TASK_PERMISSION_DENIED,
        Self::SESSION_NOT_FOUND,
        Self::SESSION_IN_USE,
        Self::TRACE_NOT_FOUND,
    ];

    /// The `data.category` the SDK associates with this code (wire.md §3).
    pub fn category(self) -> ErrorCategory {
        match self.0 {
            -32603 => ErrorCategory::Internal,
            c if c < 0 => ErrorCategory::Protocol,
            1000..=1999 => ErrorCategory::Auth,
            2000..=2999 => ErrorCategory::Routing,
            3000..=3999 => ErrorCategory::Agent,
            4000..=4999 => ErrorCategory::Resource,
            5000..=5999 => ErrorCategory::Federation,
            10000..=10999 => ErrorCategory::Mail,
            13000..=13999 => ErrorCategory::Trajectory,
            // Tasks and sessions are resources: `task` and `session` are in neither the
            // schema's closed `ErrorCategory` nor the SDK's (docs/compatibility.md §2).
            14000..=14999 | 16000..=17999 => ErrorCategory::Resource,
            _ => ErrorCategory::Internal,
        }
    }
}

/// `data.category` of a MAP error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(missing_docs)]
pub enum ErrorCategory {
    Protocol,
    Auth,
    Routing,
    Agent,
    Resource,
    Federation,
    Mail,
    Trajectory,
    Internal,
}

/// `error.data` of a MAP error (all fields optional; extra keys allowed by the spec).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ErrorData {
    /// Which family the error belongs to.
    pub category: ErrorCategory,
    /// Whether retrying the same call may succeed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
    /// For rate limits: how long to wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Free-form detail, e.g. which field failed to parse.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
}

/// A JSON-RPC error object as MAP shapes it: `{code, message, data: {category, ...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorObject {
    /// The numeric code.
    pub code: ErrorCode,
    /// A human-readable message, matching the SDK's factory messages where one exists.
    pub message: String,
    /// Category and optional details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<ErrorData>,
}

impl ErrorObject {
    /// An error with `data.category` derived from the code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: Some(ErrorData {
                category: code.category(),
                retryable: None,
                retry_after_ms: None,
                details: None,
            }),
        }
    }

    /// Adds `data.details: {"reason": detail}`: the schema's `MAPErrorData.details` and the
    /// SDK's type are objects, so the reason a request was refused goes in one member.
    pub fn with_reason(self, detail: impl Into<String>) -> Self {
        let reason: String = detail.into();
        self.with_details(serde_json::json!({ "reason": reason }))
    }

    /// Adds `data.details`.
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        if let Some(d) = self.data.as_mut() {
            d.details = Some(details);
        }
        self
    }

    /// Marks the error retryable.
    pub fn retryable(mut self) -> Self {
        if let Some(d) = self.data.as_mut() {
            d.retryable = Some(true);
        }
        self
    }

    /// `-32700 Parse error`.
    pub fn parse_error(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::PARSE_ERROR, "Parse error").with_reason(detail)
    }

    /// `-32600 Invalid request`.
    pub fn invalid_request(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::INVALID_REQUEST, "Invalid request").with_reason(detail)
    }

    /// `-32601 Method not found: <m>` (the SDK's exact message). A method name longer than
    /// [`MAX_ECHOED_METHOD`] bytes is cut there (with `…`), so a hostile name is not reflected
    /// back whole.
    pub fn method_not_found(method: &str) -> Self {
        let shown = if method.len() > MAX_ECHOED_METHOD {
            let mut cut = MAX_ECHOED_METHOD;
            while !method.is_char_boundary(cut) {
                cut -= 1;
            }
            format!("{}…", &method[..cut])
        } else {
            method.to_owned()
        };
        Self::new(
            ErrorCode::METHOD_NOT_FOUND,
            format!("Method not found: {shown}"),
        )
    }

    /// `-32602 Invalid params` with the reason in `data.details`.
    pub fn invalid_params(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::INVALID_PARAMS, "Invalid params").with_reason(detail)
    }

    /// `-32603 Internal error`.
    pub fn internal(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::INTERNAL_ERROR, detail)
    }

    /// `4001 Rate limited` (the SDK's message), retryable, with `data.retryAfterMs`: how long
    /// until the same call would be admitted.
    pub fn rate_limited(retry_after_ms: u64) -> Self {
        let mut e = Self::new(ErrorCode::RATE_LIMITED, "Rate limited").retryable();
        if let Some(d) = e.data.as_mut() {
            d.retry_after_ms = Some(retry_after_ms);
        }
        e
    }
}

/// The longest method name echoed in full in `-32601`.
pub const MAX_ECHOED_METHOD: usize = 128;

/// One incoming JSON object, classified the way the SDK classifies messages (wire.md §2).
#[derive(Debug)]
pub enum Incoming<'a> {
    /// Has `id` and `method`: must be answered.
    Request {
        /// Echoed verbatim in the response.
        id: Id,
        /// The method name.
        method: &'a str,
        /// Raw params; `None` when absent or `null` (treated as `{}` by dispatch).
        params: Option<&'a RawValue>,
    },
    /// Has `method` and no `id` key at all: never answered.
    Notification {
        /// The method name.
        method: &'a str,
        /// Raw params, if any.
        params: Option<&'a RawValue>,
    },
    /// Has `id` and no `method`: a response to a server request. We never send requests, so
    /// these are dropped.
    Response,
    /// Valid JSON that is not a valid JSON-RPC message; answered with `-32600`.
    Invalid {
        /// The id, when one could be read, so the error reaches the right caller.
        id: Id,
        /// What was wrong.
        reason: String,
    },
}

/// The envelope fields, borrowed from the frame. Unknown fields are ignored.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    jsonrpc: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    method: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

/// Deserializes a field that is present (even when its value is `null`) as `Some`.
fn present<'de, D>(d: D) -> Result<Option<&'de RawValue>, D::Error>
where
    D: Deserializer<'de>,
{
    <&'de RawValue as Deserialize<'de>>::deserialize(d).map(Some)
}

/// Classifies one JSON value (already known to be an object) from a frame.
pub fn classify(raw: &RawValue) -> Incoming<'_> {
    let env: Envelope<'_> = match serde_json::from_str(raw.get()) {
        Ok(env) => env,
        Err(e) => {
            return Incoming::Invalid {
                id: Id::null(),
                reason: format!("not a JSON-RPC object: {e}"),
            }
        }
    };
    let id = match env.id {
        None => None,
        Some(raw_id) => match Id::from_raw(raw_id) {
            Some(id) => Some(id),
            None => {
                return Incoming::Invalid {
                    id: Id::null(),
                    reason: "id must be a string, a number (within the range of a double) or null"
                        .into(),
                }
            }
        },
    };
    let reply_id = || id.clone().unwrap_or_else(Id::null);
    if let Err(reason) = crate::protocol::json::refuse_lone_surrogate(raw.get().as_bytes()) {
        // An id holding it cannot be echoed: the answer would not be JSON.
        let in_id = env
            .id
            .is_some_and(|i| crate::protocol::json::lone_surrogate(i.get()).is_some());
        return Incoming::Invalid {
            id: if in_id { Id::null() } else { reply_id() },
            reason,
        };
    }
    if env.jsonrpc.map(RawValue::get) != Some("\"2.0\"") {
        return Incoming::Invalid {
            id: reply_id(),
            reason: "jsonrpc must be exactly \"2.0\"".into(),
        };
    }
    let Some(method_raw) = env.method else {
        if id.is_some() && (env.result.is_some() || env.error.is_some()) {
            return Incoming::Response;
        }
        return Incoming::Invalid {
            id: reply_id(),
            reason: "missing method".into(),
        };
    };
    let method: &str = match serde_json::from_str::<&str>(method_raw.get()) {
        Ok(m) => m,
        // A method string with escapes cannot be borrowed; no MAP method name has escapes, so
        // reporting it as invalid is accurate enough.
        Err(_) => {
            return Incoming::Invalid {
                id: reply_id(),
                reason: "method must be a plain string".into(),
            }
        }
    };
    let params = match env.params {
        None => None,
        Some(p) => match p.get().trim_start().as_bytes().first() {
            Some(b'{') | Some(b'[') => Some(p),
            Some(b'n') => None,
            _ => {
                return Incoming::Invalid {
                    id: reply_id(),
                    reason: "params must be an object or an array".into(),
                }
            }
        },
    };
    match id {
        Some(id) => Incoming::Request { id, method, params },
        None => Incoming::Notification { method, params },
    }
}

/// Writes a success response. `result` must already be JSON text.
pub fn write_success(out: &mut String, id: &Id, result: &str) {
    out.reserve(32 + id.as_json().len() + result.len());
    out.push_str("{\"jsonrpc\":\"2.0\",\"id\":");
    out.push_str(id.as_json());
    out.push_str(",\"result\":");
    out.push_str(result);
    out.push('}');
}

/// Writes an error response.
pub fn write_error(out: &mut String, id: &Id, error: &ErrorObject) {
    out.push_str("{\"jsonrpc\":\"2.0\",\"id\":");
    out.push_str(id.as_json());
    out.push_str(",\"error\":");
    match serde_json::to_string(error) {
        Ok(json) => out.push_str(&json),
        // Serializing plain strings and numbers cannot fail; keep the frame valid regardless.
        Err(_) => {
            let _ = write!(
                out,
                "{{\"code\":{},\"message\":\"Internal error\"}}",
                -32603
            );
        }
    }
    out.push('}');
}

/// Writes a notification frame whose params are already JSON text.
pub fn write_notification(out: &mut String, method: &str, params: &str) {
    out.push_str("{\"jsonrpc\":\"2.0\",\"method\":\"");
    out.push_str(method);
    out.push_str("\",\"params\":");
    out.push_str(params);
    out.push('}');
}

/// A request as a client writes it (used by the Rust client and tests).
#[derive(Debug, Serialize)]
pub struct OutgoingRequest<'a, P: Serialize> {
    /// Always "2.0".
    pub jsonrpc: &'static str,
    /// Request id.
    pub id: u64,
    /// Method name.
    pub method: &'a str,
    /// Params.
    pub params: P,
}

/// Reads JSON text as a `Box<RawValue>`, mapping failures to `-32700`.
pub fn parse_raw(text: &str) -> Result<&RawValue, ErrorObject> {
    serde_json::from_str::<&RawValue>(text).map_err(|e| ErrorObject::parse_error(e.to_string()))
}

/// Default cap on JSON nesting depth (objects and arrays) of one frame. MAP messages nest a
/// handful of levels (envelope, params, payload, a user's own structure); 64 leaves room for
/// rich payloads while staying well under serde_json's recursion limit of 128, so a hostile
/// frame is refused by a linear scan before any value is built.
pub const DEFAULT_MAX_DEPTH: usize = 64;

/// The largest `max_depth` that can be configured: serde_json itself refuses deeper input.
pub const MAX_DEPTH_LIMIT: usize = 128;

/// Checks that `text` nests objects and arrays at most `max` levels deep (a batch counts as one
/// level). One pass over the bytes, tracking strings and escapes, no allocation: cheap enough
/// to run on every frame before parsing it.
///
/// Only nesting is judged; malformed JSON within the limit is left to the parser.
///
/// # Errors
/// `-32600 Invalid request` naming the limit when the text nests deeper.
pub fn check_depth(text: &str, max: usize) -> Result<(), ErrorObject> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in text.as_bytes() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return Err(ErrorObject::invalid_request(format!(
                        "JSON nesting exceeds the limit of {max} levels"
                    )));
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// The shape of one text frame once its frame-level checks passed (see [`parse_frame`]).
#[derive(Debug)]
pub enum Frame<'a> {
    /// One JSON value that is not an array (normally an object; anything else is answered
    /// `-32600` by the session).
    One(&'a RawValue),
    /// A batch: between 1 and `max_batch` entries, in order.
    Batch(Vec<&'a RawValue>),
}

/// The frame-level checks every transport's text goes through before any entry is classified,
/// in this order: nesting depth (a linear scan, before any value is built: `-32600`), JSON
/// syntax (`-32700`), then for a batch its syntax, emptiness and size (`-32600`). An `Err` is
/// answered once with `id: null`.
///
/// # Errors
/// The error object to send with `id: null`.
pub fn parse_frame(
    text: &str,
    max_depth: usize,
    max_batch: usize,
) -> Result<Frame<'_>, ErrorObject> {
    check_depth(text, max_depth)?;
    let raw = parse_raw(text)?;
    if !raw.get().trim_start().starts_with('[') {
        return Ok(Frame::One(raw));
    }
    let items = split_batch(raw)?;
    if items.is_empty() {
        return Err(ErrorObject::invalid_request("empty batch"));
    }
    if items.len() > max_batch {
        return Err(ErrorObject::invalid_request(format!(
            "batch of {} exceeds the limit of {}",
            items.len(),
            max_batch
        )));
    }
    Ok(Frame::Batch(items))
}

/// Splits a JSON array's raw text into its elements (for batches).
pub fn split_batch(raw: &RawValue) -> Result<Vec<&RawValue>, ErrorObject> {
    serde_json::from_str::<Vec<&RawValue>>(raw.get())
        .map_err(|e| ErrorObject::parse_error(e.to_string()))
}

/// Deserialization helper: accepts `null` as the type's default.
pub fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Turns a serde error into the `details` text of `-32602`.
pub fn params_error(e: impl std::fmt::Display) -> ErrorObject {
    ErrorObject::invalid_params(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> &RawValue {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn an_entry_with_a_lone_surrogate_is_invalid_and_keeps_its_id() {
        // The case CI's fuzzer found: answered under its own id, so the caller's request ends.
        let found = r#"{"jsonrpc":"2.0","id":0,"method":"mail/create","params":{"metadata":{"agentId":"\u0000\ud800"}}}"#;
        match classify(raw(found)) {
            Incoming::Invalid { id, reason } => {
                assert_eq!(id.as_json(), "0");
                assert!(reason.contains("\\ud800"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        // In the id itself it cannot be echoed.
        match classify(raw(r#"{"jsonrpc":"2.0","id":"\udc00x","method":"m"}"#)) {
            Incoming::Invalid { id, .. } => assert_eq!(id.as_json(), "null"),
            other => panic!("{other:?}"),
        }
        // A pair is fine.
        assert!(matches!(
            classify(raw(
                r#"{"jsonrpc":"2.0","id":1,"method":"m","params":["\ud83d\ude00"]}"#
            )),
            Incoming::Request { .. }
        ));
    }

    #[test]
    fn request_notification_response_are_told_apart() {
        match classify(raw(r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{}}"#)) {
            Incoming::Request { id, method, params } => {
                assert_eq!(id.as_json(), "1");
                assert_eq!(method, "m");
                assert_eq!(params.unwrap().get(), "{}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            classify(raw(r#"{"jsonrpc":"2.0","method":"m"}"#)),
            Incoming::Notification {
                method: "m",
                params: None
            }
        ));
        assert!(matches!(
            classify(raw(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#)),
            Incoming::Response
        ));
    }

    #[test]
    fn null_id_is_a_request_and_ids_echo_verbatim() {
        match classify(raw(r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#)) {
            Incoming::Request { id, .. } => assert_eq!(id.as_json(), "null"),
            other => panic!("{other:?}"),
        }
        match classify(raw(r#"{"jsonrpc":"2.0","id":"abc","method":"m"}"#)) {
            Incoming::Request { id, .. } => assert_eq!(id.as_json(), "\"abc\""),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn invalid_envelopes_keep_the_id_when_readable() {
        match classify(raw(r#"{"jsonrpc":"1.0","id":7,"method":"m"}"#)) {
            Incoming::Invalid { id, .. } => assert_eq!(id.as_json(), "7"),
            other => panic!("{other:?}"),
        }
        match classify(raw(r#"{"jsonrpc":"2.0","id":{"x":1},"method":"m"}"#)) {
            Incoming::Invalid { id, .. } => assert_eq!(id.as_json(), "null"),
            other => panic!("{other:?}"),
        }
        match classify(raw(r#"{"jsonrpc":"2.0","id":3,"method":"m","params":5}"#)) {
            Incoming::Invalid { id, .. } => assert_eq!(id.as_json(), "3"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            classify(raw(r#"{"jsonrpc":"2.0","id":3}"#)),
            Incoming::Invalid { .. }
        ));
    }

    #[test]
    fn rate_limited_serializes_exactly() {
        assert_eq!(
            serde_json::to_string(&ErrorObject::rate_limited(250)).unwrap(),
            r#"{"code":4001,"message":"Rate limited","data":{"category":"resource","retryable":true,"retryAfterMs":250}}"#
        );
    }

    #[test]
    fn depth_is_counted_outside_strings_only() {
        assert!(check_depth(r#"{"a":[{"b":1}]}"#, 3).is_ok());
        assert!(check_depth(r#"{"a":[{"b":1}]}"#, 2).is_err());
        // Brackets inside strings (escaped quotes included) do not count.
        assert!(check_depth(r#"{"a":"[[[[\"{{{{"}"#, 1).is_ok());
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        let e = check_depth(&deep, 64).unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_REQUEST);
        assert!(check_depth(&deep, 100).is_ok());
        // Unbalanced closers never underflow.
        assert!(check_depth("]]]]{}", 1).is_ok());
    }

    #[test]
    fn responses_serialize_exactly() {
        let mut out = String::new();
        write_success(&mut out, &Id::number(4), "{}");
        assert_eq!(out, r#"{"jsonrpc":"2.0","id":4,"result":{}}"#);
        out.clear();
        write_error(&mut out, &Id::null(), &ErrorObject::method_not_found("x/y"));
        assert_eq!(
            out,
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32601,"message":"Method not found: x/y","data":{"category":"protocol"}}}"#
        );
    }
}
