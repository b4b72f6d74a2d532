//! Scope methods: list, get, create, delete, join, leave, members (methods.md §3).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::agent::Agent;
use crate::protocol::capabilities::Capability;
use crate::protocol::ids::{AgentId, EventId, ScopeId};
use crate::protocol::json::RawJson;
use crate::protocol::methods::method::method;
use crate::protocol::scope::{JoinPolicy, Scope, ScopeVisibility, SendPolicy};

/// `map/scopes/list` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ScopesListParams {
    /// Only direct children of this scope.
    pub parent: Option<ScopeId>,
}

/// `map/scopes/list` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ScopesListResult {
    /// Visible scopes, in creation order.
    pub scopes: Vec<Scope>,
    /// The newest event in the log when this answer was made (absent when the log is empty):
    /// the answer shows the state as of that event. `map/subscribe` with `replayFrom` set to
    /// it continues exactly from there, with no gap and no duplicate (a map-router extension).
    #[serde(default, rename = "asOf", skip_serializing_if = "Option::is_none")]
    pub as_of: Option<EventId>,
}

/// Params naming one scope (`get`, `delete`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScopeRef {
    /// The scope.
    pub scope_id: ScopeId,
    /// For delete: also delete child scopes (otherwise a scope with children is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_descendants: Option<bool>,
}

/// `{scope}` result (`get`, `create`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ScopeResult {
    /// The scope.
    pub scope: Scope,
}

/// `map/scopes/create` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
#[allow(missing_docs)]
pub struct ScopesCreateParams {
    /// Requested id (generated when absent).
    pub scope_id: Option<ScopeId>,
    pub name: Option<String>,
    pub description: Option<String>,
    pub parent: Option<ScopeId>,
    pub join_policy: Option<JoinPolicy>,
    pub auto_join_roles: Option<Vec<String>>,
    pub visibility: Option<ScopeVisibility>,
    pub message_visibility: Option<ScopeVisibility>,
    pub send_policy: Option<SendPolicy>,
    pub persistent: Option<bool>,
    pub auto_delete: Option<bool>,
    pub metadata: Option<RawJson>,
}

/// `map/scopes/delete` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScopesDeleteResult {
    /// The scope as it was.
    pub scope: Scope,
    /// Always true on success.
    pub deleted: bool,
    /// Child scopes deleted with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted_descendants: Vec<ScopeId>,
}

/// `map/scopes/join` and `map/scopes/leave` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MembershipParams {
    /// The scope.
    pub scope_id: ScopeId,
    /// The agent.
    pub agent_id: AgentId,
}

/// `map/scopes/join` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JoinResult {
    /// The scope.
    pub scope: Scope,
    /// The agent after joining.
    pub agent: Agent,
    /// Always true on success.
    pub joined: bool,
}

/// `map/scopes/leave` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaveResult {
    /// The scope.
    pub scope: Scope,
    /// The agent after leaving.
    pub agent: Agent,
    /// Always true on success.
    pub left: bool,
}

/// `map/scopes/members` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MembersParams {
    /// The scope.
    pub scope_id: ScopeId,
    /// Page size.
    #[serde(default)]
    pub limit: Option<u32>,
    /// Opaque cursor from `nextCursor`.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// `map/scopes/members` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MembersResult {
    /// Member agent ids, sorted.
    pub members: Vec<AgentId>,
    /// Present when more members follow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

method!(
    /// `map/scopes/list`.
    ScopesList, "map/scopes/list", Some(Capability::CanQuery), ScopesListParams, ScopesListResult
);
method!(
    /// `map/scopes/get`.
    ScopesGet, "map/scopes/get", Some(Capability::CanQuery), ScopeRef, ScopeResult
);
method!(
    /// `map/scopes/create`.
    ScopesCreate, "map/scopes/create", Some(Capability::CanCreateScopes), ScopesCreateParams, ScopeResult
);
method!(
    /// `map/scopes/delete`.
    ScopesDelete, "map/scopes/delete", Some(Capability::CanManageScopes), ScopeRef, ScopesDeleteResult
);
method!(
    /// `map/scopes/join`.
    ScopesJoin, "map/scopes/join", None, MembershipParams, JoinResult
);
method!(
    /// `map/scopes/leave`.
    ScopesLeave, "map/scopes/leave", None, MembershipParams, LeaveResult
);
method!(
    /// `map/scopes/members`.
    ScopesMembers, "map/scopes/members", Some(Capability::CanQuery), MembersParams, MembersResult
);
