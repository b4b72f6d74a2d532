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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// A message id: the trace of that message (around its `message_sent` event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// An event id: the trace of that event (around it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// How far around the anchor to read, in ms (default 600 000, at most 3 600 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
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
