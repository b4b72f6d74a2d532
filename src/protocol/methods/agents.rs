//! Agent methods: list, get, register, spawn, unregister, update, stop, suspend, resume, and
//! `map/structure/graph` (methods.md §2).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::agent::{Agent, AgentRelationship, AgentState, AgentVisibility};
use crate::protocol::capabilities::{Capability, ParticipantCapabilities};
use crate::protocol::ids::{AgentId, EventId, MessageId, ParticipantId, ScopeId};
use crate::protocol::json::RawJson;
use crate::protocol::methods::method::method;

type JsonMap = serde_json::Map<String, serde_json::Value>;

/// `filter` of `map/agents/list`: AND across fields, OR within lists.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
#[allow(missing_docs)]
pub struct AgentFilter {
    pub states: Option<Vec<AgentState>>,
    pub roles: Option<Vec<String>>,
    /// Any overlap with the agent's scopes.
    pub scopes: Option<Vec<ScopeId>>,
    pub parent: Option<AgentId>,
    pub has_children: Option<bool>,
    pub owner_id: Option<ParticipantId>,
    /// An id in `capabilityDescriptor.capabilities[].id`.
    pub capability_id: Option<String>,
    /// Any overlap with `capabilityDescriptor.tags`.
    pub tags: Option<Vec<String>>,
    /// A content type in `capabilityDescriptor.accepts`.
    pub accepts: Option<String>,
    /// `persistentIdentity.persistentId`.
    pub persistent_id: Option<String>,
}

/// `map/agents/list` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct AgentsListParams {
    /// Which agents.
    pub filter: Option<AgentFilter>,
    /// Page size (all when absent).
    pub limit: Option<u32>,
    /// Opaque cursor from a previous page's `nextCursor`.
    pub cursor: Option<String>,
}

/// `map/agents/list` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentsListResult {
    /// Visible agents, in registration order.
    pub agents: Vec<Agent>,
    /// Present when more agents follow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// The newest event in the log when this answer was made (absent when the log is empty):
    /// the answer shows the state as of that event. `map/subscribe` with `replayFrom` set to
    /// it continues exactly from there, with no gap and no duplicate (a map-router extension).
    #[serde(default, rename = "asOf", skip_serializing_if = "Option::is_none")]
    pub as_of: Option<EventId>,
}

/// `include` of `map/agents/get`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
#[allow(missing_docs)]
pub struct AgentInclude {
    pub parent: Option<bool>,
    pub children: Option<bool>,
    pub siblings: Option<bool>,
    pub ancestors: Option<bool>,
    pub descendants: Option<bool>,
    /// Depth limit for ancestors and descendants (default unlimited).
    pub max_depth: Option<u32>,
}

/// `map/agents/get` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentsGetParams {
    /// The agent.
    pub agent_id: AgentId,
    /// Relatives to include.
    #[serde(default)]
    pub include: Option<AgentInclude>,
}

/// `map/agents/get` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentsGetResult {
    pub agent: Agent,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<Agent>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub children: Option<Vec<Agent>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub siblings: Option<Vec<Agent>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ancestors: Option<Vec<Agent>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub descendants: Option<Vec<Agent>>,
}

/// `map/agents/register` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
#[allow(missing_docs)]
pub struct RegisterParams {
    /// Requested id. Re-registering an orphaned agent's id reclaims it.
    pub agent_id: Option<AgentId>,
    pub name: Option<String>,
    pub description: Option<String>,
    pub role: Option<String>,
    pub parent: Option<AgentId>,
    /// Scopes to join on registration.
    pub scopes: Option<Vec<ScopeId>>,
    pub visibility: Option<AgentVisibility>,
    pub capabilities: Option<ParticipantCapabilities>,
    pub environment: Option<JsonMap>,
    pub capability_descriptor: Option<JsonMap>,
    pub persistent_identity: Option<JsonMap>,
    pub resume_persistent_identity: Option<bool>,
    /// Free-form, kept byte for byte.
    pub metadata: Option<RawJson>,
    pub permission_overrides: Option<JsonMap>,
    pub relationships: Option<Vec<AgentRelationship>>,
}

/// `map/agents/register` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegisterResult {
    /// The registered agent.
    pub agent: Agent,
    /// True when an orphaned agent with this id was reclaimed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed: Option<bool>,
}

/// The message to hand a freshly spawned child.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct InitialMessage {
    /// Payload of the first message, delivered byte for byte.
    pub payload: Option<RawJson>,
    /// Its metadata, delivered byte for byte.
    pub meta: Option<RawJson>,
}

/// When a supervised child process is restarted after it exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RestartMode {
    /// Never restart.
    #[default]
    Never,
    /// Restart after a non-zero exit or a signal, not after a clean exit.
    OnFailure,
    /// Restart after any exit that was not requested (`map/agents/stop`, shutdown).
    Always,
}

/// Restart policy of a supervised child process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct RestartPolicy {
    /// When to restart.
    pub mode: RestartMode,
    /// At most this many restarts (default 5); then the agent stays `failed`.
    pub max_restarts: Option<u32>,
    /// First backoff delay in ms (default 500); doubles per consecutive restart.
    pub backoff_ms: Option<u64>,
    /// Backoff ceiling in ms (default 30 000).
    pub max_backoff_ms: Option<u64>,
}

/// A program for the router to launch and supervise as the spawned agent. It speaks MAP as
/// NDJSON on its stdin/stdout; its stderr is captured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct CommandSpec {
    /// Executable (looked up in `PATH` when it has no slash).
    pub program: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Extra environment variables (the router's environment is inherited).
    pub env: std::collections::BTreeMap<String, String>,
    /// Working directory.
    pub cwd: Option<String>,
    /// Restart policy (default: never).
    pub restart: Option<RestartPolicy>,
    /// How long the child has to connect and register before the spawn fails (default 10 000).
    pub handshake_timeout_ms: Option<u64>,
    /// After a graceful stop request, how long before SIGTERM (default 5 000).
    pub stop_timeout_ms: Option<u64>,
    /// After SIGTERM, how long before SIGKILL (default 5 000).
    pub kill_timeout_ms: Option<u64>,
}

/// `map/agents/spawn` params: the child's registration fields and the spawn's own, in one
/// object. Read with a hand-written `Deserialize` (the registration's verbatim metadata cannot
/// pass through serde's buffering of flattened fields).
#[derive(Debug, Clone, Default, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct SpawnParams {
    /// The child's registration. `parent` defaults to the caller's agent; it is required
    /// unless `command` is given.
    #[serde(flatten)]
    pub register: RegisterParams,
    /// Launch and supervise this program as the child.
    pub command: Option<CommandSpec>,
    /// Sent to the child right after it is registered.
    pub initial_message: Option<InitialMessage>,
    /// Extra scopes to join.
    pub requested_scopes: Option<Vec<ScopeId>>,
    /// Accepted; not enforced by this router yet.
    pub ttl_minutes: Option<u64>,
}

impl<'de> Deserialize<'de> for SpawnParams {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase", default)]
        #[derive(Default)]
        struct Own {
            command: Option<CommandSpec>,
            initial_message: Option<InitialMessage>,
            requested_scopes: Option<Vec<ScopeId>>,
            ttl_minutes: Option<u64>,
        }
        let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
        let register: RegisterParams = serde_json::from_str(raw.get()).map_err(D::Error::custom)?;
        let own: Own = serde_json::from_str(raw.get()).map_err(D::Error::custom)?;
        Ok(Self {
            register,
            command: own.command,
            initial_message: own.initial_message,
            requested_scopes: own.requested_scopes,
            ttl_minutes: own.ttl_minutes,
        })
    }
}

/// The process behind a supervised agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProcessInfo {
    /// Operating-system process id.
    pub pid: u32,
    /// The program.
    pub program: String,
}

/// `map/agents/spawn` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpawnResult {
    /// The child.
    pub agent: Agent,
    /// Id of the initial message, when one was sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id: Option<MessageId>,
    /// The supervised process, when `command` was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessInfo>,
}

/// `map/agents/unregister` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnregisterParams {
    /// The agent.
    pub agent_id: AgentId,
    /// Recorded in the event.
    #[serde(default)]
    pub reason: Option<String>,
}

/// `map/agents/unregister` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnregisterResult {
    /// The agent as it was when removed.
    pub agent: Agent,
    /// Always true.
    pub unregistered: bool,
}

/// `map/agents/update` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateParams {
    /// The agent.
    pub agent_id: AgentId,
    /// New state (refused out of `stopped`).
    #[serde(default)]
    pub state: Option<AgentState>,
    /// Replaces the environment.
    #[serde(default)]
    pub environment: Option<JsonMap>,
    /// Shallow-merged into the metadata: each value byte for byte.
    #[serde(default)]
    pub metadata: Option<RawJson>,
    /// Merged per section (`canSee`, `canMessage`, `acceptsFrom`).
    #[serde(default)]
    pub permission_overrides: Option<JsonMap>,
}

/// Result of update: `{agent}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentResult {
    /// The agent after the change.
    pub agent: Agent,
}

/// `map/agents/stop` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StopParams {
    /// The agent.
    pub agent_id: AgentId,
    /// Passed on to the agent.
    #[serde(default)]
    pub reason: Option<String>,
    /// Stop and unregister at once instead of asking the agent to finish.
    #[serde(default)]
    pub force: Option<bool>,
}

/// `map/agents/stop` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StopResult {
    /// True: the agent was asked to stop (or was stopped, with `force`).
    pub stopping: bool,
    /// The agent after the change.
    pub agent: Agent,
}

/// `map/agents/suspend` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SuspendParams {
    /// The agent.
    pub agent_id: AgentId,
    /// Passed on to the agent.
    #[serde(default)]
    pub reason: Option<String>,
}

/// `map/agents/suspend` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SuspendResult {
    /// Always true on success.
    pub suspended: bool,
    /// The agent after the change.
    pub agent: Agent,
}

/// `map/agents/resume` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResumeParams {
    /// The agent.
    pub agent_id: AgentId,
}

/// `map/agents/resume` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ResumeResult {
    /// Always true on success.
    pub resumed: bool,
    /// The agent after the change.
    pub agent: Agent,
}

/// `map/structure/graph` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct GraphParams {
    /// Only this agent's subtree.
    pub root_agent_id: Option<AgentId>,
    /// Levels below the root (default unlimited).
    pub depth: Option<u32>,
    /// Include `relationships[]` edges (default true).
    pub include_relationships: Option<bool>,
}

/// An edge of the structure graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GraphEdge {
    /// Source agent (the parent, for `parent-child`).
    pub from: AgentId,
    /// Target agent.
    pub to: AgentId,
    /// `parent-child`, `peer`, `supervisor`, `supervised` or `collaborator`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// `map/structure/graph` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GraphResult {
    /// Visible agents.
    pub nodes: Vec<Agent>,
    /// Edges between visible agents.
    pub edges: Vec<GraphEdge>,
    /// The newest event in the log when this answer was made (absent when the log is empty):
    /// the answer shows the state as of that event. `map/subscribe` with `replayFrom` set to
    /// it continues exactly from there, with no gap and no duplicate (a map-router extension).
    #[serde(default, rename = "asOf", skip_serializing_if = "Option::is_none")]
    pub as_of: Option<EventId>,
}

method!(
    /// `map/agents/list`.
    AgentsList, "map/agents/list", Some(Capability::CanQuery), AgentsListParams, AgentsListResult
);
method!(
    /// `map/agents/get`.
    AgentsGet, "map/agents/get", Some(Capability::CanQuery), AgentsGetParams, AgentsGetResult
);
method!(
    /// `map/agents/register`.
    AgentsRegister, "map/agents/register", Some(Capability::CanRegister), RegisterParams, RegisterResult
);
method!(
    /// `map/agents/spawn`.
    AgentsSpawn, "map/agents/spawn", Some(Capability::CanSpawn), SpawnParams, SpawnResult
);
method!(
    /// `map/agents/unregister`.
    AgentsUnregister, "map/agents/unregister", Some(Capability::CanUnregister), UnregisterParams, UnregisterResult
);
method!(
    /// `map/agents/update` (no capability: an owner may always update its agents).
    AgentsUpdate, "map/agents/update", None, UpdateParams, AgentResult
);
method!(
    /// `map/agents/stop`.
    AgentsStop, "map/agents/stop", Some(Capability::CanStop), StopParams, StopResult
);
method!(
    /// `map/agents/suspend`.
    AgentsSuspend, "map/agents/suspend", Some(Capability::CanStop), SuspendParams, SuspendResult
);
method!(
    /// `map/agents/resume`.
    AgentsResume, "map/agents/resume", Some(Capability::CanStop), ResumeParams, ResumeResult
);
method!(
    /// `map/structure/graph`.
    StructureGraph, "map/structure/graph", Some(Capability::CanQuery), GraphParams, GraphResult
);
