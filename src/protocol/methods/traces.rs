//! `map/traces/get` (ours, a vendor method): one trace read back from the event log as spans,
//! the same spans the OTLP export makes (docs/traces.md, "Reading a trace back"). The
//! dashboard's trace waterfall draws them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::capabilities::Capability;
use crate::protocol::methods::method::method;

/// `map/traces/get` params: exactly one of `traceId`, `messageId`, `eventId`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TracesGetParams {
    /// A trace id: 32 lowercase hex digits. Its spans are looked for in the newest hour of the
    /// log (at most 200 000 events examined), unless an anchor names where to read.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "trace_id"
    )]
    pub trace_id: Option<String>,
    /// A message id: the trace of that message (around its `message_sent` event).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "message_id"
    )]
    pub message_id: Option<String>,
    /// An event id: the trace of that event (around it).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "event_id"
    )]
    pub event_id: Option<String>,
    /// How far around the anchor to read, in ms (default 600 000, at most 3 600 000).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "window_ms"
    )]
    pub window_ms: Option<u64>,
}

/// What a JSON value is, for an error that names a field's wrong type without echoing it.
fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn text<'de, D: serde::Deserializer<'de>>(d: D, field: &str) -> Result<Option<String>, D::Error> {
    match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(serde::de::Error::custom(format!(
            "{field} must be a string, not {}",
            kind(&other)
        ))),
    }
}

fn trace_id<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    text(d, "traceId")
}

fn message_id<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    text(d, "messageId")
}

fn event_id<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    text(d, "eventId")
}

fn window_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
        Some(other) => Err(serde::de::Error::custom(format!(
            "windowMs must be a whole number of milliseconds from 1 to 3600000, not {}",
            match &other {
                serde_json::Value::Number(_) => "a negative, fractional or huge number",
                v => kind(v),
            }
        ))),
    }
}

/// A span's status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpanStatus {
    /// `ok`, `error` or `unset`.
    pub code: String,
    /// What failed (`recipient_offline`, ...), for an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One span, as the OTLP export has it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TraceSpan {
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// The parent's id: a span of this result, or a caller's span (not in it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_span_id: Option<String>,
    /// `invoke_agent {name}`, `send {form}`, `execute_tool {tool}`, `create_agent {name}`, ...
    pub name: String,
    /// `client`, `producer` or `internal`.
    pub kind: String,
    /// Start, Unix ms.
    pub start_time_ms: u64,
    /// End, Unix ms (never before the start).
    pub end_time_ms: u64,
    /// Its status.
    pub status: SpanStatus,
    /// Its attributes (`gen_ai.agent.name`, `map.outcome`, `map.from_queue`, ...).
    pub attributes: serde_json::Map<String, serde_json::Value>,
}

/// `map/traces/get` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TracesGetResult {
    /// The trace.
    pub trace_id: String,
    /// Its spans the caller may see, by start time (at most 2 000).
    pub spans: Vec<TraceSpan>,
    /// Events read from the log.
    pub examined: u64,
    /// The log was read from this time (Unix ms, inclusive)...
    pub from_ms: u64,
    /// ...to this one (inclusive).
    pub to_ms: u64,
    /// Spans were left out: more than 2 000, or the read stopped at its bound (200 000 events)
    /// before `toMs`.
    pub truncated: bool,
}

method!(
    /// `map/traces/get` (ours).
    TracesGet, "map/traces/get", Some(Capability::CanObserve),
    TracesGetParams, TracesGetResult
);
