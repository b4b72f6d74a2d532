//! The `Scope` record as it appears on the wire (methods.md §0).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::ids::ScopeId;
use crate::protocol::json::RawJson;

/// Who may join a scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum JoinPolicy {
    /// Any agent may join itself.
    #[default]
    Open,
    /// Only the scope's creator (or a system participant) may add agents.
    Invite,
    /// Agents whose role is in `autoJoinRoles`.
    Role,
    /// System participants only.
    System,
}

/// Who may see a scope (and, for `messageVisibility`, the messages sent to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ScopeVisibility {
    /// Everyone.
    #[default]
    Public,
    /// Participants owning a member agent.
    Members,
    /// System participants only.
    System,
}

/// Who may send to a scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SendPolicy {
    /// Participants owning a member agent.
    #[default]
    Members,
    /// Anyone (`anyone` is accepted as an alias, from the older vocabulary).
    #[serde(alias = "anyone")]
    Any,
}

/// A scope: a named group of agents, optionally nested.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Scope {
    /// The scope's id.
    pub id: ScopeId,
    /// Display name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Free text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Parent scope.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<ScopeId>,
    /// Who may join.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub join_policy: Option<JoinPolicy>,
    /// Roles that may join under `joinPolicy: role`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_join_roles: Option<Vec<String>>,
    /// Who may see the scope.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub visibility: Option<ScopeVisibility>,
    /// Who may see messages sent to the scope.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_visibility: Option<ScopeVisibility>,
    /// Who may send to the scope.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub send_policy: Option<SendPolicy>,
    /// Whether the scope should survive a restart (recorded; the in-memory store keeps none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent: Option<bool>,
    /// Delete the scope when its last member leaves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_delete: Option<bool>,
    /// Free-form metadata, exactly as its creator wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RawJson>,
}
