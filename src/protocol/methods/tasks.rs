//! The tasks extension (`urn:map:ext:tasks:1`, staging): a minimal task board. Participants
//! create tasks, assign them to agents, move them through `open → in_progress → blocked →
//! completed | failed`, and list them; each change is a `task.*` event. Shapes follow the SDK
//! 0.1.15 types (`MAPTask`, `Tasks*RequestParams`, `Task*EventData`), which its `createTask`,
//! `assignTask`, `updateTask` and `listTasks` send as they are. `map/tasks/get` is ours.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::capabilities::Capability;
use crate::protocol::ids::{AgentId, ParticipantId};
use crate::protocol::json::RawJson;
use crate::protocol::methods::method::method;

/// `MAPTaskStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum TaskStatus {
    #[default]
    Open,
    InProgress,
    Blocked,
    Completed,
    Failed,
}

impl TaskStatus {
    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::InProgress => "in_progress",
            Self::Blocked => "blocked",
            Self::Completed => "completed",
            Self::Failed => "failed",
        }
    }
}

/// `MAPTask`, with what the router adds (`createdBy`, `createdAt`, `updatedAt`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    /// The task id.
    pub id: String,
    /// The agent it is assigned to (`null`: unassigned).
    #[serde(default)]
    pub assignee: Option<AgentId>,
    /// Human-readable title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Current status.
    pub status: TaskStatus,
    /// Description or instructions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Provider metadata, byte for byte (shallow-merged by `map/tasks/update`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<RawJson>,
    /// The participant that created it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<ParticipantId>,
    /// Unix ms of its creation.
    #[serde(default)]
    pub created_at: u64,
    /// Unix ms of its last change.
    #[serde(default)]
    pub updated_at: u64,
}

/// The task given to `map/tasks/create` (every field optional).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskInput {
    /// The id; the router makes one (`task-<ULID>`) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The agent to assign it to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignee: Option<AgentId>,
    /// Title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Initial status (`open` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<TaskStatus>,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Provider metadata (an object), byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<RawJson>,
}

/// `map/tasks/create` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateParams {
    /// The task.
    pub task: TaskInput,
}

/// The result of create, assign, update and get: `{task}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskResult {
    /// The task after the call.
    pub task: Task,
}

/// `map/tasks/assign` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AssignParams {
    /// The task.
    pub task_id: String,
    /// The agent to assign it to.
    pub agent_id: AgentId,
}

/// `map/tasks/update` params: each field present is changed; `assignee: null` unassigns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateParams {
    /// The task.
    pub task_id: String,
    /// New status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<TaskStatus>,
    /// New title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// New description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// New assignee; `null` unassigns (absent: unchanged).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<AgentId>")]
    pub assignee: Option<Option<AgentId>>,
    /// Members to set in the task's meta (a shallow merge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<RawJson>,
}

/// Tells "absent" (`None`, by `default`) from "null" (`Some(None)`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// `map/tasks/get` params (ours).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GetParams {
    /// The task.
    pub task_id: String,
}

/// One status or a list of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum StatusFilter {
    /// This status.
    One(TaskStatus),
    /// Any of these.
    Any(Vec<TaskStatus>),
}

impl StatusFilter {
    /// Whether `s` passes.
    pub fn admits(&self, s: TaskStatus) -> bool {
        match self {
            Self::One(one) => *one == s,
            Self::Any(any) => any.is_empty() || any.contains(&s),
        }
    }
}

/// `map/tasks/list` filter.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListFilter {
    /// Only tasks assigned to this agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignee: Option<AgentId>,
    /// Only tasks in this status (or these).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusFilter>,
}

/// `map/tasks/list` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListParams {
    /// Filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<ListFilter>,
    /// Page size (default 100, at most 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// `nextCursor` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// `map/tasks/list` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListResult {
    /// Tasks in creation order.
    pub tasks: Vec<Task>,
    /// Whether another page follows.
    pub has_more: bool,
    /// Where the next page starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `task.created` data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedData {
    /// The new task.
    pub task: Task,
}

/// `task.assigned` data (with the whole task: ours).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AssignedData {
    /// The task.
    pub task_id: String,
    /// Its new assignee.
    pub agent_id: AgentId,
    /// The task after the change.
    pub task: Task,
}

/// `task.status` data (with the whole task: ours).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusData {
    /// The task.
    pub task_id: String,
    /// The status before.
    pub previous: TaskStatus,
    /// The status now.
    pub current: TaskStatus,
    /// The task after the change.
    pub task: Task,
}

/// `task.completed` data (with the whole task: ours).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompletedData {
    /// The task.
    pub task_id: String,
    /// `meta.result` of the task, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<RawJson>,
    /// The task after the change.
    pub task: Task,
}

/// `task.updated` data (ours: a change of title, description, assignee or meta without a
/// status change).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdatedData {
    /// The task.
    pub task_id: String,
    /// The task after the change.
    pub task: Task,
}

/// The `task` member every `task.*` event's data carries (how the store and the gateways read
/// a task from any of its events).
#[derive(Debug, Clone, Deserialize)]
pub struct AnyTaskData {
    /// The task after the change.
    pub task: Task,
}

method!(
    /// `map/tasks/create`.
    TasksCreate,
    "map/tasks/create",
    Some(Capability::CanCreateTasks),
    CreateParams,
    TaskResult
);
method!(
    /// `map/tasks/assign`.
    TasksAssign,
    "map/tasks/assign",
    Some(Capability::CanAssignTasks),
    AssignParams,
    TaskResult
);
method!(
    /// `map/tasks/update`.
    TasksUpdate,
    "map/tasks/update",
    Some(Capability::CanUpdateTasks),
    UpdateParams,
    TaskResult
);
method!(
    /// `map/tasks/get` (ours).
    TasksGet,
    "map/tasks/get",
    Some(Capability::CanListTasks),
    GetParams,
    TaskResult
);
method!(
    /// `map/tasks/list`.
    TasksList,
    "map/tasks/list",
    Some(Capability::CanListTasks),
    ListParams,
    ListResult
);
