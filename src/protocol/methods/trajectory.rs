//! The trajectory extension (`urn:map:ext:trajectory:1`): an agent reports checkpoints of its
//! work (`trajectory/checkpoint`), observers list and read them (`trajectory/list`,
//! `trajectory/get`) and ask for their content (`trajectory/content`, inline or streamed as
//! `trajectory/content.chunk` notifications). Shapes follow the SDK 0.1.15 types
//! (`TrajectoryCheckpoint`, `Trajectory*RequestParams`), which its `callExtension` sends as is.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::capabilities::Capability;
use crate::protocol::ids::AgentId;
use crate::protocol::json::RawJson;
use crate::protocol::methods::method::method;

/// Notification names of the extension.
pub mod notifications {
    /// Server → requester: one chunk of a streamed artifact.
    pub const CONTENT_CHUNK: &str = "trajectory/content.chunk";
    /// Server → the checkpoint's agent: send the content of a checkpoint.
    pub const CONTENT_REQUEST: &str = "trajectory/content.request";
    /// Agent → server: the content asked for by a `trajectory/content.request`.
    pub const CONTENT_RESPONSE: &str = "trajectory/content.response";
}

/// A checkpoint as reported: `timestamp` may be absent (the router fills it) and `agentId`
/// may be absent (the caller's agent is meant).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointInput {
    /// The checkpoint id, chosen by the agent (unique per router).
    pub id: String,
    /// The agent whose work this is; the caller must own it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<AgentId>,
    /// Unix milliseconds; filled with the router's clock when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<u64>,
    /// A short human-readable label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The agent's own work-session id (not a MAP session id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Anything the agent attaches, kept byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RawJson>,
    /// Protocol metadata, kept byte for byte.
    #[serde(default, rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<RawJson>,
}

/// A stored checkpoint (`TrajectoryCheckpoint`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// The checkpoint id.
    pub id: String,
    /// The agent whose work this is.
    pub agent_id: AgentId,
    /// Unix milliseconds.
    pub timestamp: u64,
    /// A short human-readable label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The agent's own work-session id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The agent's metadata, byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RawJson>,
    /// Protocol metadata, byte for byte.
    #[serde(default, rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<RawJson>,
}

/// `trajectory/checkpoint` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointParams {
    /// The checkpoint.
    pub checkpoint: CheckpointInput,
}

/// `trajectory/checkpoint` and `trajectory/get` result; also the `trajectory.checkpoint`
/// event's data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointResult {
    /// The checkpoint as stored (timestamp filled).
    pub checkpoint: Checkpoint,
}

/// `trajectory/list` filter.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListFilter {
    /// Only this agent's checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<AgentId>,
    /// Only this work session's checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Only checkpoints with `timestamp > afterTimestamp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_timestamp: Option<u64>,
    /// Only checkpoints with `timestamp < beforeTimestamp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_timestamp: Option<u64>,
}

/// `trajectory/list` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListParams {
    /// Which checkpoints.
    #[serde(default)]
    pub filter: Option<ListFilter>,
    /// Page size (default 50, at most 1000).
    #[serde(default)]
    pub limit: Option<u32>,
    /// `nextCursor` of the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// `trajectory/list` result: newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListResult {
    /// One page of checkpoints, newest first.
    pub checkpoints: Vec<Checkpoint>,
    /// Whether more follow.
    pub has_more: bool,
    /// Where the next page starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `trajectory/get` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GetParams {
    /// The checkpoint id.
    pub checkpoint_id: String,
}

/// `trajectory/content` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContentParams {
    /// The checkpoint id.
    pub checkpoint_id: String,
    /// Which artifacts (default: all the agent has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<Vec<String>>,
}

/// How a streamed artifact arrives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StreamInfo {
    /// Bytes of the artifact's JSON text.
    pub total_bytes: u64,
    /// Number of `trajectory/content.chunk` notifications.
    pub total_chunks: u64,
    /// Always `base64`.
    pub encoding: String,
}

/// `TrajectoryContentResult`: inline (`streaming: false`) or streaming one artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Content {
    /// The checkpoint id.
    pub checkpoint_id: String,
    /// Artifacts delivered inline, each byte for byte as the agent sent it.
    pub artifacts: std::collections::BTreeMap<String, RawJson>,
    /// Whether one artifact follows as chunks.
    pub streaming: bool,
    /// Correlates the chunks (streaming only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_id: Option<String>,
    /// Which artifact is streamed (streaming only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_artifact: Option<String>,
    /// Size of the stream (streaming only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_info: Option<StreamInfo>,
}

/// `trajectory/content` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContentResult {
    /// The content.
    pub content: Content,
    /// The `trajectory/content.chunk` frames that follow the answer on the connection (not
    /// part of the result).
    #[serde(skip)]
    #[schemars(skip)]
    pub chunks: Vec<String>,
}

/// `trajectory/content.chunk` params: one base64 piece of a streamed artifact's JSON text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContentChunk {
    /// From the streaming answer.
    pub stream_id: String,
    /// 0-based.
    pub index: u64,
    /// Base64 of this piece.
    pub data: String,
    /// On the last chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#final: Option<bool>,
    /// Hex SHA-256 of the whole artifact text (last chunk only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
}

/// `trajectory/content.request` params (server → the checkpoint's agent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContentRequest {
    /// Echo it in the response.
    pub request_id: String,
    /// The checkpoint asked about.
    pub checkpoint_id: String,
    /// The agent the checkpoint belongs to.
    pub agent_id: AgentId,
    /// Which artifacts (absent: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<Vec<String>>,
}

/// `trajectory/content.response` params (agent → server).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContentResponse {
    /// From the request.
    pub request_id: String,
    /// Named artifacts, byte for byte.
    #[serde(default)]
    pub artifacts: Option<std::collections::BTreeMap<String, RawJson>>,
    /// Set instead of `artifacts` when the agent has no content to give.
    #[serde(default)]
    pub error: Option<String>,
}

method!(
    /// `trajectory/checkpoint`.
    TrajectoryCheckpoint, "trajectory/checkpoint", Some(Capability::CanReportTrajectory),
    CheckpointParams, CheckpointResult
);
method!(
    /// `trajectory/list`.
    TrajectoryList, "trajectory/list", Some(Capability::CanQueryTrajectory),
    ListParams, ListResult
);
method!(
    /// `trajectory/get`.
    TrajectoryGet, "trajectory/get", Some(Capability::CanQueryTrajectory),
    GetParams, CheckpointResult
);
method!(
    /// `trajectory/content`.
    TrajectoryContent, "trajectory/content", Some(Capability::CanRequestTrajectoryContent),
    ContentParams, ContentResult
);
