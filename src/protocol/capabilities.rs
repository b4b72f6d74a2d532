//! Participant types and capabilities (wire.md §8).
//!
//! Owns the `ParticipantCapabilities` wire shape, the default grant per participant type, the
//! SDK's intersection rule, and the `Capability` names that methods require. Checking a
//! capability against a session is the router's job (`router::permissions`).

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Who a participant says it is (`map/connect` `participantType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ParticipantType {
    /// Registers agents and receives `map/message`.
    Agent,
    /// Observes and steers: dashboards, orchestrators, CLIs.
    Client,
    /// Trusted server-side component; every capability.
    System,
    /// Bridges another system (federation).
    Gateway,
}

impl ParticipantType {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Client => "client",
            Self::System => "system",
            Self::Gateway => "gateway",
        }
    }
}

impl fmt::Display for ParticipantType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `observation` group.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ObservationCaps {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_observe: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_query: Option<bool>,
}

/// `messaging` group.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct MessagingCaps {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_send: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_receive: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_broadcast: Option<bool>,
}

/// `lifecycle` group.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct LifecycleCaps {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_spawn: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_register: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_unregister: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_steer: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_stop: Option<bool>,
}

/// `scopes` group.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ScopeCaps {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_create_scopes: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_manage_scopes: Option<bool>,
}

/// `streaming` group: what the server's event streams support (read by the SDK client to decide
/// whether it sends `map/subscribe.ack`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct StreamingCaps {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub supports_ack: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub supports_flow_control: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub supports_pause: Option<bool>,
}

/// `trajectory` group (SDK `ParticipantCapabilities.trajectory`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct TrajectoryCaps {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_report: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_query: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_request_content: Option<bool>,
}

/// `tasks` group (SDK `ParticipantCapabilities.tasks`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct TasksCaps {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_create: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_assign: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_update: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_list: Option<bool>,
}

/// `mail` group (SDK `ParticipantCapabilities.mail`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct MailCaps {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_create: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_join: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_invite: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_view_history: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_create_threads: Option<bool>,
}

/// `ParticipantCapabilities`. Groups we do not interpret (workspace, resources, ...) are kept verbatim in
/// `other` so a client's declaration round-trips.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParticipantCapabilities {
    /// Observing the system: events and queries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observation: Option<ObservationCaps>,
    /// Sending and receiving messages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messaging: Option<MessagingCaps>,
    /// Agent lifecycle control.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<LifecycleCaps>,
    /// Scope management.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scopes: Option<ScopeCaps>,
    /// The trajectory extension.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trajectory: Option<TrajectoryCaps>,
    /// The tasks extension.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tasks: Option<TasksCaps>,
    /// The mail extension.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mail: Option<MailCaps>,
    /// Event stream features (server → client only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub streaming: Option<StreamingCaps>,
    /// Extension groups and keys we pass through untouched.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// One capability flag, named `group.flag` as in `meta.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Capability {
    CanObserve,
    CanQuery,
    CanSend,
    CanReceive,
    CanBroadcast,
    CanSpawn,
    CanRegister,
    CanUnregister,
    CanSteer,
    CanStop,
    CanCreateScopes,
    CanManageScopes,
    CanReportTrajectory,
    CanQueryTrajectory,
    CanRequestTrajectoryContent,
    CanCreateTasks,
    CanAssignTasks,
    CanUpdateTasks,
    CanListTasks,
    CanCreateConversations,
    CanJoinConversations,
    CanInviteToConversations,
    CanViewConversationHistory,
    CanCreateThreads,
}

impl Capability {
    /// The `group.flag` path used in error messages (`Permission denied: <path>`).
    pub fn path(self) -> &'static str {
        match self {
            Self::CanObserve => "observation.canObserve",
            Self::CanQuery => "observation.canQuery",
            Self::CanSend => "messaging.canSend",
            Self::CanReceive => "messaging.canReceive",
            Self::CanBroadcast => "messaging.canBroadcast",
            Self::CanSpawn => "lifecycle.canSpawn",
            Self::CanRegister => "lifecycle.canRegister",
            Self::CanUnregister => "lifecycle.canUnregister",
            Self::CanSteer => "lifecycle.canSteer",
            Self::CanStop => "lifecycle.canStop",
            Self::CanCreateScopes => "scopes.canCreateScopes",
            Self::CanManageScopes => "scopes.canManageScopes",
            Self::CanReportTrajectory => "trajectory.canReport",
            Self::CanQueryTrajectory => "trajectory.canQuery",
            Self::CanRequestTrajectoryContent => "trajectory.canRequestContent",
            Self::CanCreateTasks => "tasks.canCreate",
            Self::CanAssignTasks => "tasks.canAssign",
            Self::CanUpdateTasks => "tasks.canUpdate",
            Self::CanListTasks => "tasks.canList",
            Self::CanCreateConversations => "mail.canCreate",
            Self::CanJoinConversations => "mail.canJoin",
            Self::CanInviteToConversations => "mail.canInvite",
            Self::CanViewConversationHistory => "mail.canViewHistory",
            Self::CanCreateThreads => "mail.canCreateThreads",
        }
    }
}

impl ParticipantCapabilities {
    /// The flag's value; an absent group or flag counts as `false` (SDK `hasCapability`).
    pub fn has(&self, cap: Capability) -> bool {
        let v = match cap {
            Capability::CanObserve => self.observation.as_ref().and_then(|g| g.can_observe),
            Capability::CanQuery => self.observation.as_ref().and_then(|g| g.can_query),
            Capability::CanSend => self.messaging.as_ref().and_then(|g| g.can_send),
            Capability::CanReceive => self.messaging.as_ref().and_then(|g| g.can_receive),
            Capability::CanBroadcast => self.messaging.as_ref().and_then(|g| g.can_broadcast),
            Capability::CanSpawn => self.lifecycle.as_ref().and_then(|g| g.can_spawn),
            Capability::CanRegister => self.lifecycle.as_ref().and_then(|g| g.can_register),
            Capability::CanUnregister => self.lifecycle.as_ref().and_then(|g| g.can_unregister),
            Capability::CanSteer => self.lifecycle.as_ref().and_then(|g| g.can_steer),
            Capability::CanStop => self.lifecycle.as_ref().and_then(|g| g.can_stop),
            Capability::CanCreateScopes => self.scopes.as_ref().and_then(|g| g.can_create_scopes),
            Capability::CanManageScopes => self.scopes.as_ref().and_then(|g| g.can_manage_scopes),
            Capability::CanReportTrajectory => self.trajectory.as_ref().and_then(|g| g.can_report),
            Capability::CanQueryTrajectory => self.trajectory.as_ref().and_then(|g| g.can_query),
            Capability::CanRequestTrajectoryContent => {
                self.trajectory.as_ref().and_then(|g| g.can_request_content)
            }
            Capability::CanCreateTasks => self.tasks.as_ref().and_then(|g| g.can_create),
            Capability::CanAssignTasks => self.tasks.as_ref().and_then(|g| g.can_assign),
            Capability::CanUpdateTasks => self.tasks.as_ref().and_then(|g| g.can_update),
            Capability::CanListTasks => self.tasks.as_ref().and_then(|g| g.can_list),
            Capability::CanCreateConversations => self.mail.as_ref().and_then(|g| g.can_create),
            Capability::CanJoinConversations => self.mail.as_ref().and_then(|g| g.can_join),
            Capability::CanInviteToConversations => self.mail.as_ref().and_then(|g| g.can_invite),
            Capability::CanViewConversationHistory => {
                self.mail.as_ref().and_then(|g| g.can_view_history)
            }
            Capability::CanCreateThreads => self.mail.as_ref().and_then(|g| g.can_create_threads),
        };
        v.unwrap_or(false)
    }

    /// The default grant for a participant type: the design-spec matrix (wire.md §8), where a
    /// "depends" (✓*) entry is granted. `streaming` is filled in by the router, which knows
    /// what its streams support.
    pub fn defaults_for(kind: ParticipantType) -> Self {
        let (obs, send, recv, bcast, spawn, reg, steer_stop, scopes) = match kind {
            ParticipantType::Client => (true, true, false, false, false, false, true, false),
            ParticipantType::Agent => (true, true, true, true, true, true, true, true),
            ParticipantType::System => (true, true, true, true, true, true, true, true),
            ParticipantType::Gateway => (true, true, true, false, false, false, false, false),
        };
        Self {
            observation: Some(ObservationCaps {
                can_observe: Some(obs),
                can_query: Some(obs),
            }),
            messaging: Some(MessagingCaps {
                can_send: Some(send),
                can_receive: Some(recv),
                can_broadcast: Some(bcast),
            }),
            lifecycle: Some(LifecycleCaps {
                can_spawn: Some(spawn),
                can_register: Some(reg),
                can_unregister: Some(reg),
                can_steer: Some(steer_stop),
                can_stop: Some(steer_stop),
            }),
            scopes: Some(ScopeCaps {
                can_create_scopes: Some(scopes),
                can_manage_scopes: Some(scopes),
            }),
            // Every participant may read trajectories (filtered by what it may see); reporting
            // is for agents (and system participants).
            trajectory: Some(TrajectoryCaps {
                enabled: Some(true),
                can_report: Some(reg),
                can_query: Some(obs),
                can_request_content: Some(obs),
            }),
            // Every participant may list the tasks it may see; working on them is for those
            // that may send (clients hand out work, agents and gateways do it).
            tasks: Some(TasksCaps {
                enabled: Some(true),
                can_create: Some(send),
                can_assign: Some(send),
                can_update: Some(send),
                can_list: Some(obs),
            }),
            // Conversations: whoever may send takes part in them; whoever may observe reads
            // the ones it takes part in.
            mail: Some(MailCaps {
                enabled: Some(true),
                can_create: Some(send),
                can_join: Some(send),
                can_invite: Some(send),
                can_view_history: Some(obs),
                can_create_threads: Some(send),
            }),
            streaming: None,
            other: serde_json::Map::new(),
        }
    }

    /// Sets every flag `over` states (either value), keeping the others: how configuration and
    /// `map/permissions/update` change a grant (a per-group merge, as the TestServer does).
    pub fn overlaid_by(mut self, over: &ParticipantCapabilities) -> Self {
        fn set(granted: &mut Option<bool>, over: Option<bool>) {
            if over.is_some() {
                *granted = over;
            }
        }
        if let Some(o) = &over.observation {
            let g = self.observation.get_or_insert_with(Default::default);
            set(&mut g.can_observe, o.can_observe);
            set(&mut g.can_query, o.can_query);
        }
        if let Some(o) = &over.messaging {
            let g = self.messaging.get_or_insert_with(Default::default);
            set(&mut g.can_send, o.can_send);
            set(&mut g.can_receive, o.can_receive);
            set(&mut g.can_broadcast, o.can_broadcast);
        }
        if let Some(o) = &over.lifecycle {
            let g = self.lifecycle.get_or_insert_with(Default::default);
            set(&mut g.can_spawn, o.can_spawn);
            set(&mut g.can_register, o.can_register);
            set(&mut g.can_unregister, o.can_unregister);
            set(&mut g.can_steer, o.can_steer);
            set(&mut g.can_stop, o.can_stop);
        }
        if let Some(o) = &over.scopes {
            let g = self.scopes.get_or_insert_with(Default::default);
            set(&mut g.can_create_scopes, o.can_create_scopes);
            set(&mut g.can_manage_scopes, o.can_manage_scopes);
        }
        if let Some(o) = &over.trajectory {
            let g = self.trajectory.get_or_insert_with(Default::default);
            set(&mut g.enabled, o.enabled);
            set(&mut g.can_report, o.can_report);
            set(&mut g.can_query, o.can_query);
            set(&mut g.can_request_content, o.can_request_content);
        }
        if let Some(o) = &over.tasks {
            let g = self.tasks.get_or_insert_with(Default::default);
            set(&mut g.enabled, o.enabled);
            set(&mut g.can_create, o.can_create);
            set(&mut g.can_assign, o.can_assign);
            set(&mut g.can_update, o.can_update);
            set(&mut g.can_list, o.can_list);
        }
        if let Some(o) = &over.mail {
            let g = self.mail.get_or_insert_with(Default::default);
            set(&mut g.enabled, o.enabled);
            set(&mut g.can_create, o.can_create);
            set(&mut g.can_join, o.can_join);
            set(&mut g.can_invite, o.can_invite);
            set(&mut g.can_view_history, o.can_view_history);
            set(&mut g.can_create_threads, o.can_create_threads);
        }
        self
    }

    /// Narrows a grant by what the participant asked for: a flag the participant set to `false`
    /// becomes `false`; nothing the participant asks for can widen the grant. (This is the
    /// SDK's `intersectCapabilities` with the server default as the base.)
    pub fn narrowed_by(mut self, requested: &ParticipantCapabilities) -> Self {
        fn narrow(granted: &mut Option<bool>, requested: Option<bool>) {
            if requested == Some(false) {
                *granted = Some(false);
            }
        }
        if let (Some(g), Some(r)) = (self.observation.as_mut(), requested.observation.as_ref()) {
            narrow(&mut g.can_observe, r.can_observe);
            narrow(&mut g.can_query, r.can_query);
        }
        if let (Some(g), Some(r)) = (self.messaging.as_mut(), requested.messaging.as_ref()) {
            narrow(&mut g.can_send, r.can_send);
            narrow(&mut g.can_receive, r.can_receive);
            narrow(&mut g.can_broadcast, r.can_broadcast);
        }
        if let (Some(g), Some(r)) = (self.lifecycle.as_mut(), requested.lifecycle.as_ref()) {
            narrow(&mut g.can_spawn, r.can_spawn);
            narrow(&mut g.can_register, r.can_register);
            narrow(&mut g.can_unregister, r.can_unregister);
            narrow(&mut g.can_steer, r.can_steer);
            narrow(&mut g.can_stop, r.can_stop);
        }
        if let (Some(g), Some(r)) = (self.scopes.as_mut(), requested.scopes.as_ref()) {
            narrow(&mut g.can_create_scopes, r.can_create_scopes);
            narrow(&mut g.can_manage_scopes, r.can_manage_scopes);
        }
        if let (Some(g), Some(r)) = (self.trajectory.as_mut(), requested.trajectory.as_ref()) {
            narrow(&mut g.can_report, r.can_report);
            narrow(&mut g.can_query, r.can_query);
            narrow(&mut g.can_request_content, r.can_request_content);
        }
        if let (Some(g), Some(r)) = (self.tasks.as_mut(), requested.tasks.as_ref()) {
            narrow(&mut g.can_create, r.can_create);
            narrow(&mut g.can_assign, r.can_assign);
            narrow(&mut g.can_update, r.can_update);
            narrow(&mut g.can_list, r.can_list);
        }
        if let (Some(g), Some(r)) = (self.mail.as_mut(), requested.mail.as_ref()) {
            narrow(&mut g.can_create, r.can_create);
            narrow(&mut g.can_join, r.can_join);
            narrow(&mut g.can_invite, r.can_invite);
            narrow(&mut g.can_view_history, r.can_view_history);
            narrow(&mut g.can_create_threads, r.can_create_threads);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_defaults_follow_the_spec() {
        let client = ParticipantCapabilities::defaults_for(ParticipantType::Client);
        assert!(client.has(Capability::CanObserve));
        assert!(client.has(Capability::CanSend));
        assert!(client.has(Capability::CanStop));
        assert!(!client.has(Capability::CanReceive));
        assert!(!client.has(Capability::CanRegister));
        assert!(!client.has(Capability::CanCreateScopes));
        let agent = ParticipantCapabilities::defaults_for(ParticipantType::Agent);
        assert!(agent.has(Capability::CanRegister) && agent.has(Capability::CanSpawn));
        let gateway = ParticipantCapabilities::defaults_for(ParticipantType::Gateway);
        assert!(gateway.has(Capability::CanReceive) && !gateway.has(Capability::CanSpawn));
    }

    #[test]
    fn a_request_can_narrow_but_never_widen() {
        let requested: ParticipantCapabilities = serde_json::from_str(
            r#"{"observation":{"canObserve":false},"lifecycle":{"canRegister":true}}"#,
        )
        .unwrap();
        let granted =
            ParticipantCapabilities::defaults_for(ParticipantType::Client).narrowed_by(&requested);
        assert!(!granted.has(Capability::CanObserve));
        assert!(granted.has(Capability::CanQuery));
        assert!(!granted.has(Capability::CanRegister), "cannot widen");
    }

    #[test]
    fn unknown_groups_round_trip() {
        let caps: ParticipantCapabilities =
            serde_json::from_str(r#"{"mail":{"enabled":true},"protocols":["acp"]}"#).unwrap();
        let back = serde_json::to_value(&caps).unwrap();
        assert_eq!(back["mail"]["enabled"], true);
        assert_eq!(back["protocols"][0], "acp");
    }
}
