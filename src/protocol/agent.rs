//! The `Agent` record and its parts, exactly as they appear on the wire (methods.md §0).

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use crate::protocol::capabilities::ParticipantCapabilities;
use crate::protocol::ids::AgentId;
use crate::protocol::ids::ParticipantId;
use crate::protocol::ids::ScopeId;
use crate::protocol::json::RawJson;

/// An agent's state: one of the SDK's states, or a custom `x-<name>` state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct AgentState(std::borrow::Cow<'static, str>);

impl JsonSchema for AgentState {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "AgentState".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A standard agent state, or a custom `x-<name>` state",
            "anyOf": [
                {"type": "string", "enum": Self::KNOWN},
                {"type": "string", "pattern": "^x-[a-z][a-z0-9-]*$"}
            ]
        })
    }
}

#[allow(missing_docs)]
impl AgentState {
    pub const REGISTERED: Self = Self::known("registered");
    pub const ACTIVE: Self = Self::known("active");
    pub const BUSY: Self = Self::known("busy");
    pub const IDLE: Self = Self::known("idle");
    pub const SUSPENDED: Self = Self::known("suspended");
    pub const STOPPING: Self = Self::known("stopping");
    pub const STOPPED: Self = Self::known("stopped");
    pub const FAILED: Self = Self::known("failed");
    pub const ORPHANED: Self = Self::known("orphaned");
    /// The states of an agent that is up and taking messages (for example a filter that
    /// should skip stopped, failed, suspended and orphaned agents).
    pub const LIVE: [Self; 4] = [Self::REGISTERED, Self::ACTIVE, Self::BUSY, Self::IDLE];

    const KNOWN: [&'static str; 9] = [
        "registered",
        "active",
        "busy",
        "idle",
        "suspended",
        "stopping",
        "stopped",
        "failed",
        "orphaned",
    ];

    const fn known(s: &'static str) -> Self {
        Self(std::borrow::Cow::Borrowed(s))
    }

    /// Validates a state string: a known state, or `x-` followed by `[a-z][a-z0-9-]*`.
    pub fn parse(s: &str) -> Option<Self> {
        if let Some(k) = Self::KNOWN.iter().find(|k| **k == s) {
            return Some(Self::known(k));
        }
        let custom = s.strip_prefix("x-")?;
        let mut chars = custom.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase());
        let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        (first_ok && rest_ok && s.len() <= 64).then(|| Self(s.to_owned().into()))
    }

    /// The state string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The state's name when it is one of the standard states (`None` for an `x-` state).
    pub fn standard(&self) -> Option<&'static str> {
        Self::KNOWN.iter().copied().find(|k| *k == self.0)
    }

    /// Terminal states: nothing may move an agent out of them.
    pub fn is_terminal(&self) -> bool {
        *self == Self::STOPPED
    }
}

impl<'de> Deserialize<'de> for AgentState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        AgentState::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown agent state `{s}` (expected one of {} or x-<name>)",
                Self::KNOWN.join(", ")
            ))
        })
    }
}

impl fmt::Display for AgentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who may see an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AgentVisibility {
    /// Everyone.
    #[default]
    Public,
    /// Its owner and the owner of its parent.
    ParentOnly,
    /// Participants owning an agent that shares a scope with it.
    Scope,
    /// System participants only.
    System,
}

/// A declared relationship to another agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentRelationship {
    /// `peer`, `supervisor`, `supervised` or `collaborator`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The other agent.
    pub agent_id: AgentId,
    /// Free-form.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Lifecycle timestamps (Unix ms) and exit information.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentLifecycle {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_active_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orphaned_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_reason: Option<String>,
}

/// An agent as the wire shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Agent {
    /// The agent's id.
    pub id: AgentId,
    /// The participant that owns (answers for) this agent; `null` while orphaned.
    pub owner_id: Option<ParticipantId>,
    /// Display name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Free text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Parent agent, for spawned children.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<AgentId>,
    /// Child ids; only present when a query expands them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub children: Option<Vec<AgentId>>,
    /// Declared relationships to other agents.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relationships: Option<Vec<AgentRelationship>>,
    /// Current state.
    pub state: AgentState,
    /// Role, used by role addressing and filters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Scopes the agent is a member of.
    pub scopes: Vec<ScopeId>,
    /// Who may see the agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub visibility: Option<AgentVisibility>,
    /// Per-agent permission overrides (`canSee`, `canMessage`, `acceptsFrom`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permission_overrides: Option<serde_json::Map<String, serde_json::Value>>,
    /// Lifecycle timestamps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<AgentLifecycle>,
    /// Capabilities the agent declared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<ParticipantCapabilities>,
    /// Where the agent runs (host, os, cloud, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub environment: Option<serde_json::Map<String, serde_json::Value>>,
    /// What the agent can do, for discovery (`capabilities[].id`, `tags`, `accepts`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capability_descriptor: Option<serde_json::Map<String, serde_json::Value>>,
    /// A persistent identity (`persistentId`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_identity: Option<serde_json::Map<String, serde_json::Value>>,
    /// Free-form metadata, exactly as the agent (or its updates) wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RawJson>,
    /// Whether the agent is connected now, and since when (ours; `docs/compatibility.md`). On
    /// the wire it is vendor data, where the schema allows it: `_meta.mapRouter.presence` (the
    /// schema's `Agent` has `additionalProperties: false`, and the SDK's `Agent` has no such
    /// field).
    #[serde(
        default,
        rename = "_meta",
        skip_serializing_if = "Option::is_none",
        with = "presence_meta"
    )]
    #[schemars(rename = "_meta", with = "Option<PresenceMeta>")]
    pub presence: Option<Presence>,
}

/// `Agent._meta` as the router writes it: `{"mapRouter": {"presence": ...}}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct PresenceMeta {
    /// Our vendor data.
    #[serde(rename = "mapRouter", default, skip_serializing_if = "Option::is_none")]
    pub map_router: Option<RouterAgentMeta>,
}

/// `Agent._meta.mapRouter`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct RouterAgentMeta {
    /// The agent's presence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence: Option<Presence>,
}

/// Serializes [`Agent::presence`] as `_meta.mapRouter.presence` (and reads it back; any other
/// `_meta` content is ignored).
mod presence_meta {
    use super::{Presence, PresenceMeta, RouterAgentMeta};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(p: &Option<Presence>, s: S) -> Result<S::Ok, S::Error> {
        PresenceMeta {
            map_router: Some(RouterAgentMeta {
                presence: p.clone(),
            }),
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Presence>, D::Error> {
        let meta = Option::<PresenceMeta>::deserialize(d)?;
        Ok(meta.and_then(|m| m.map_router).and_then(|r| r.presence))
    }
}

/// `online` or `offline`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(missing_docs)]
pub enum PresenceStatus {
    Online,
    Offline,
}

/// An agent's presence: online while the session that owns it is attached to a live
/// connection; offline from the moment it is orphaned (its connection lost) until it is
/// reclaimed. Registered is not online: an orphaned agent is registered and offline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Presence {
    /// Online or offline.
    pub status: PresenceStatus,
    /// Unix ms when this status began.
    pub since: u64,
    /// Unix ms when the agent was last connected (offline only: the moment it went away).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<u64>,
    /// In cluster mode, the node the agent's connection is on (offline: was on), by its
    /// `[cluster] node` name; absent on a single router.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl Presence {
    /// Online from `now`.
    pub fn online(now: u64) -> Self {
        Self {
            status: PresenceStatus::Online,
            since: now,
            last_seen: None,
            node: None,
        }
    }

    /// Offline from `now`, last seen then.
    pub fn offline(now: u64) -> Self {
        Self {
            status: PresenceStatus::Offline,
            since: now,
            last_seen: Some(now),
            node: None,
        }
    }

    /// The same, on cluster node `node`.
    #[must_use]
    pub fn on(self, node: Option<&str>) -> Self {
        Self {
            node: node.map(str::to_owned),
            ..self
        }
    }
}

impl Agent {
    /// A freshly registered agent: state `registered`, every optional field empty.
    pub fn new(id: AgentId, owner: Option<ParticipantId>) -> Self {
        Self {
            id,
            owner_id: owner,
            name: None,
            description: None,
            parent: None,
            children: None,
            relationships: None,
            state: AgentState::REGISTERED,
            role: None,
            scopes: Vec::new(),
            visibility: None,
            permission_overrides: None,
            lifecycle: None,
            capabilities: None,
            environment: None,
            capability_descriptor: None,
            persistent_identity: None,
            metadata: None,
            presence: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_accept_the_sdk_set_and_custom_names_only() {
        assert_eq!(AgentState::parse("busy"), Some(AgentState::BUSY));
        assert!(AgentState::parse("x-thinking").is_some());
        assert!(AgentState::parse("x-").is_none());
        assert!(AgentState::parse("x-Bad").is_none());
        assert!(AgentState::parse("sleeping").is_none());
        let err = serde_json::from_str::<AgentState>("\"nope\"").unwrap_err();
        assert!(err.to_string().contains("unknown agent state"));
    }

    #[test]
    fn owner_id_is_always_present_even_when_null() {
        let mut agent = Agent::new("a".into(), None);
        agent.state = AgentState::ORPHANED;
        assert_eq!(
            serde_json::to_string(&agent).unwrap(),
            r#"{"id":"a","ownerId":null,"state":"orphaned","scopes":[]}"#
        );
    }
}
