//! Events: the `map/event` envelope, the event types we emit with their `data` payloads, and the
//! subscription filter (events.md §1–4).
//!
//! Event type strings are the SDK's `EVENT_TYPES` wire strings (underscore spelling for the core
//! set), because SDK code compares them literally (`client.request()` looks for
//! `message_delivered`). Filters accept either spelling.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::agent::AgentState;
use crate::protocol::capabilities::ParticipantCapabilities;
use crate::protocol::capabilities::ParticipantType;
use crate::protocol::ids::AgentId;
use crate::protocol::ids::EventId;
use crate::protocol::ids::MessageId;
use crate::protocol::ids::ParticipantId;
use crate::protocol::ids::ScopeId;
use crate::protocol::ids::SubscriptionId;
use crate::protocol::json::RawJson;
use crate::protocol::message::Message;

/// The event types this router emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[allow(missing_docs)]
pub enum EventType {
    #[serde(rename = "agent_registered")]
    AgentRegistered,
    #[serde(rename = "agent_unregistered")]
    AgentUnregistered,
    #[serde(rename = "agent_state_changed")]
    AgentStateChanged,
    #[serde(rename = "agent_orphaned")]
    AgentOrphaned,
    #[serde(rename = "agent_environment_changed")]
    AgentEnvironmentChanged,
    #[serde(rename = "agent.metadata.changed")]
    AgentMetadataChanged,
    #[serde(rename = "participant_connected")]
    ParticipantConnected,
    #[serde(rename = "participant_disconnected")]
    ParticipantDisconnected,
    #[serde(rename = "message_sent")]
    MessageSent,
    #[serde(rename = "message_delivered")]
    MessageDelivered,
    #[serde(rename = "message_failed")]
    MessageFailed,
    #[serde(rename = "scope_created")]
    ScopeCreated,
    #[serde(rename = "scope_deleted")]
    ScopeDeleted,
    #[serde(rename = "scope_member_joined")]
    ScopeMemberJoined,
    #[serde(rename = "scope_member_left")]
    ScopeMemberLeft,
    #[serde(rename = "subscription.overflow")]
    SubscriptionOverflow,
    #[serde(rename = "agent.injected")]
    AgentInjected,
    #[serde(rename = "agent.stderr")]
    AgentStderr,
    #[serde(rename = "agent.diagnostic")]
    AgentDiagnostic,
    #[serde(rename = "message.queued")]
    MessageQueued,
    #[serde(rename = "agent.spawning")]
    AgentSpawning,
    #[serde(rename = "agent.spawn.failed")]
    AgentSpawnFailed,
    #[serde(rename = "permissions_client_updated")]
    PermissionsClientUpdated,
    #[serde(rename = "permissions_agent_updated")]
    PermissionsAgentUpdated,
    #[serde(rename = "trajectory.checkpoint")]
    TrajectoryCheckpoint,
    #[serde(rename = "task.created")]
    TaskCreated,
    #[serde(rename = "task.assigned")]
    TaskAssigned,
    #[serde(rename = "task.status")]
    TaskStatus,
    #[serde(rename = "task.completed")]
    TaskCompleted,
    #[serde(rename = "task.updated")]
    TaskUpdated,
    #[serde(rename = "agent.presence.changed")]
    AgentPresenceChanged,
    #[serde(rename = "mail.created")]
    MailCreated,
    #[serde(rename = "mail.closed")]
    MailClosed,
    #[serde(rename = "mail.participant.joined")]
    MailParticipantJoined,
    #[serde(rename = "mail.participant.left")]
    MailParticipantLeft,
    #[serde(rename = "mail.turn.added")]
    MailTurnAdded,
    #[serde(rename = "mail.thread.created")]
    MailThreadCreated,
    /// Internal (never delivered): a principal took an id (`router::identities`).
    #[serde(rename = "identity.claimed")]
    IdentityClaimed,
    /// Internal (never delivered): an id was freed.
    #[serde(rename = "identity.released")]
    IdentityReleased,
    /// Internal (never delivered), cluster mode: the newest record of a session, agent or
    /// scope, which the node that takes the log over restores (`router::handover`).
    #[serde(rename = "state.saved")]
    StateSaved,
    /// Internal (never delivered), cluster mode: a saved session, agent or scope is gone.
    #[serde(rename = "state.dropped")]
    StateDropped,
}

impl EventType {
    /// Its position in [`EventType::ALL`] (the declaration order, which `ALL` keeps): a bit in
    /// a filter's type mask, a slot in the subscription index.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Every type, for tests and the schema.
    pub const ALL: [EventType; 41] = [
        Self::AgentRegistered,
        Self::AgentUnregistered,
        Self::AgentStateChanged,
        Self::AgentOrphaned,
        Self::AgentEnvironmentChanged,
        Self::AgentMetadataChanged,
        Self::ParticipantConnected,
        Self::ParticipantDisconnected,
        Self::MessageSent,
        Self::MessageDelivered,
        Self::MessageFailed,
        Self::ScopeCreated,
        Self::ScopeDeleted,
        Self::ScopeMemberJoined,
        Self::ScopeMemberLeft,
        Self::SubscriptionOverflow,
        Self::AgentInjected,
        Self::AgentStderr,
        Self::AgentDiagnostic,
        Self::MessageQueued,
        Self::AgentSpawning,
        Self::AgentSpawnFailed,
        Self::PermissionsClientUpdated,
        Self::PermissionsAgentUpdated,
        Self::TrajectoryCheckpoint,
        Self::TaskCreated,
        Self::TaskAssigned,
        Self::TaskStatus,
        Self::TaskCompleted,
        Self::TaskUpdated,
        Self::AgentPresenceChanged,
        Self::MailCreated,
        Self::MailClosed,
        Self::MailParticipantJoined,
        Self::MailParticipantLeft,
        Self::MailTurnAdded,
        Self::MailThreadCreated,
        Self::IdentityClaimed,
        Self::IdentityReleased,
        Self::StateSaved,
        Self::StateDropped,
    ];

    /// The wire string.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::AgentRegistered => "agent_registered",
            Self::AgentUnregistered => "agent_unregistered",
            Self::AgentStateChanged => "agent_state_changed",
            Self::AgentOrphaned => "agent_orphaned",
            Self::AgentEnvironmentChanged => "agent_environment_changed",
            Self::AgentMetadataChanged => "agent.metadata.changed",
            Self::ParticipantConnected => "participant_connected",
            Self::ParticipantDisconnected => "participant_disconnected",
            Self::MessageSent => "message_sent",
            Self::MessageDelivered => "message_delivered",
            Self::MessageFailed => "message_failed",
            Self::ScopeCreated => "scope_created",
            Self::ScopeDeleted => "scope_deleted",
            Self::ScopeMemberJoined => "scope_member_joined",
            Self::ScopeMemberLeft => "scope_member_left",
            Self::SubscriptionOverflow => "subscription.overflow",
            Self::AgentInjected => "agent.injected",
            Self::AgentStderr => "agent.stderr",
            Self::AgentDiagnostic => "agent.diagnostic",
            Self::MessageQueued => "message.queued",
            Self::AgentSpawning => "agent.spawning",
            Self::AgentSpawnFailed => "agent.spawn.failed",
            Self::PermissionsClientUpdated => "permissions_client_updated",
            Self::PermissionsAgentUpdated => "permissions_agent_updated",
            Self::TrajectoryCheckpoint => "trajectory.checkpoint",
            Self::TaskCreated => "task.created",
            Self::TaskAssigned => "task.assigned",
            Self::TaskStatus => "task.status",
            Self::TaskCompleted => "task.completed",
            Self::TaskUpdated => "task.updated",
            Self::AgentPresenceChanged => "agent.presence.changed",
            Self::MailCreated => "mail.created",
            Self::MailClosed => "mail.closed",
            Self::MailParticipantJoined => "mail.participant.joined",
            Self::MailParticipantLeft => "mail.participant.left",
            Self::MailTurnAdded => "mail.turn.added",
            Self::MailThreadCreated => "mail.thread.created",
            Self::IdentityClaimed => "identity.claimed",
            Self::IdentityReleased => "identity.released",
            Self::StateSaved => "state.saved",
            Self::StateDropped => "state.dropped",
        }
    }

    /// The dotted spelling that filters compare against (`agent_registered` → `agent.registered`).
    pub fn normalized(self) -> &'static str {
        match self {
            Self::AgentRegistered => "agent.registered",
            Self::AgentUnregistered => "agent.unregistered",
            Self::AgentStateChanged => "agent.state.changed",
            Self::AgentOrphaned => "agent.orphaned",
            Self::AgentEnvironmentChanged => "agent.environment.changed",
            Self::AgentMetadataChanged => "agent.metadata.changed",
            Self::ParticipantConnected => "participant.connected",
            Self::ParticipantDisconnected => "participant.disconnected",
            Self::MessageSent => "message.sent",
            Self::MessageDelivered => "message.delivered",
            Self::MessageFailed => "message.failed",
            Self::ScopeCreated => "scope.created",
            Self::ScopeDeleted => "scope.deleted",
            Self::ScopeMemberJoined => "scope.member.joined",
            Self::ScopeMemberLeft => "scope.member.left",
            Self::SubscriptionOverflow => "subscription.overflow",
            Self::AgentInjected => "agent.injected",
            Self::AgentStderr => "agent.stderr",
            Self::AgentDiagnostic => "agent.diagnostic",
            Self::MessageQueued => "message.queued",
            Self::AgentSpawning => "agent.spawning",
            Self::AgentSpawnFailed => "agent.spawn.failed",
            Self::PermissionsClientUpdated => "permissions.client.updated",
            Self::PermissionsAgentUpdated => "permissions.agent.updated",
            Self::TrajectoryCheckpoint => "trajectory.checkpoint",
            Self::TaskCreated => "task.created",
            Self::TaskAssigned => "task.assigned",
            Self::TaskStatus => "task.status",
            Self::TaskCompleted => "task.completed",
            Self::TaskUpdated => "task.updated",
            Self::AgentPresenceChanged => "agent.presence.changed",
            Self::MailCreated => "mail.created",
            Self::MailClosed => "mail.closed",
            Self::MailParticipantJoined => "mail.participant.joined",
            Self::MailParticipantLeft => "mail.participant.left",
            Self::MailTurnAdded => "mail.turn.added",
            Self::MailThreadCreated => "mail.thread.created",
            Self::IdentityClaimed => "identity.claimed",
            Self::IdentityReleased => "identity.released",
            Self::StateSaved => "state.saved",
            Self::StateDropped => "state.dropped",
        }
    }

    /// Whether this is one of our own (vendor) event types: in neither the MAP schema's
    /// `EventType` enum, nor the SDK's `EVENT_TYPES`, nor the spec's descriptions. A strict
    /// client would refuse them, so they reach only subscriptions that name them exactly in
    /// `eventTypes` (never `*`, `agent.*` or an absent filter; docs/compatibility.md §7).
    pub fn is_vendor(self) -> bool {
        matches!(
            self,
            Self::AgentPresenceChanged
                | Self::AgentMetadataChanged
                | Self::MessageQueued
                | Self::AgentInjected
                | Self::AgentStderr
                | Self::AgentDiagnostic
                | Self::AgentSpawning
                | Self::AgentSpawnFailed
                | Self::TaskUpdated
        )
    }

    /// The vendor types ([`EventType::is_vendor`]), for clients of ours that want them.
    pub fn vendor() -> impl Iterator<Item = EventType> {
        Self::ALL.into_iter().filter(|t| t.is_vendor())
    }

    /// An `eventTypes` list that matches every type, ours included: `*` and each vendor type
    /// by name.
    pub fn every_type() -> Vec<String> {
        std::iter::once("*".to_owned())
            .chain(Self::vendor().map(|t| t.as_str().to_owned()))
            .collect()
    }

    /// Whether this is one of the router's internal records, which are logged (and kept) but
    /// never delivered to any subscriber, replayed, or matched by a filter.
    pub fn is_internal(self) -> bool {
        matches!(
            self,
            Self::IdentityClaimed | Self::IdentityReleased | Self::StateSaved | Self::StateDropped
        )
    }

    /// Whether this is a task event (the only kind a `tasks` filter can match).
    pub fn is_task(self) -> bool {
        matches!(
            self,
            Self::TaskCreated
                | Self::TaskAssigned
                | Self::TaskStatus
                | Self::TaskCompleted
                | Self::TaskUpdated
        )
    }

    /// Whether this is a mail event (the only kind a `mail` filter can match).
    pub fn is_mail(self) -> bool {
        matches!(
            self,
            Self::MailCreated
                | Self::MailClosed
                | Self::MailParticipantJoined
                | Self::MailParticipantLeft
                | Self::MailTurnAdded
                | Self::MailThreadCreated
        )
    }

    /// Whether this is a message event (the only kind `priorities` filters can match).
    pub fn is_message(self) -> bool {
        matches!(
            self,
            Self::MessageSent | Self::MessageDelivered | Self::MessageFailed | Self::MessageQueued
        )
    }
}

/// The `event` object inside `map/event` and in replay results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Equal to the envelope's `eventId`.
    pub id: String,
    /// The event type.
    #[serde(rename = "type")]
    pub kind: String,
    /// When the router recorded it (Unix ms).
    pub timestamp: u64,
    /// The agent or participant that caused it (`"system"` for the router itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Type-specific payload (see the `*Data` types), exactly as the router wrote it (and so,
    /// where it carries a participant's JSON, exactly as the participant wrote that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<RawJson>,
    /// Event ids that causally precede this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caused_by: Option<Vec<EventId>>,
}

/// `map/event` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventNotificationParams {
    /// The subscription this delivery belongs to.
    pub subscription_id: SubscriptionId,
    /// 1 for the first event on the subscription, +1 per event.
    pub sequence_number: u64,
    /// The event's id (absent only on the synthetic `subscription.overflow` notice).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<EventId>,
    /// When the event was recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<u64>,
    /// Causes already delivered on this subscription.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caused_by: Option<Vec<EventId>>,
    /// The event.
    pub event: Event,
}

/// `map/message` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MessageNotificationParams {
    /// The delivered message.
    pub message: Message,
}

/// A subscription filter. AND across fields, OR within a list; an absent or empty field places
/// no constraint. Unknown fields are ignored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct SubscriptionFilter {
    /// Event types, in either spelling; `prefix.*` and `*` wildcards.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
    /// The event's `source` must be one of these.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_agents: Option<Vec<String>>,
    /// Alias of `fromAgents` (schema spelling).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<String>>,
    /// The source agent's role must be one of these.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_roles: Option<Vec<String>>,
    /// The role of the agent the event is about (else the source agent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roles: Option<Vec<String>>,
    /// The event's scope (or a descendant scope of one of these).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<String>>,
    /// Message priority (message events only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priorities: Option<Vec<String>>,
    /// `data.correlationId` or `data.message.meta.correlationId`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_ids: Option<Vec<String>>,
    /// Each key must deep-equal `data.metadata[key]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata_match: Option<serde_json::Map<String, serde_json::Value>>,
    /// Dot paths into the related agent's `environment`, each must equal the value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub environment_match: Option<serde_json::Map<String, serde_json::Value>>,
    /// Mail extension filter (SDK `MailSubscriptionFilter`): only `mail.*` events match,
    /// narrowed by its fields.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mail: Option<MailFilter>,
    /// Trajectory extension filter: only `trajectory.*` events match, narrowed to the
    /// checkpoint's `agentId` and `sessionId` when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trajectory: Option<TrajectoryFilter>,
    /// Tasks extension filter (ours): only `task.*` events match, narrowed to these task ids
    /// when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<TasksFilter>,
}

/// The `mail` member of a subscription filter (SDK `MailSubscriptionFilter`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MailFilter {
    /// Only events of this conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<String>,
    /// Only turns and threads of this thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    /// Only events about or by this mail participant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub participant_id: Option<String>,
    /// Only turns of this content type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
}

/// The `tasks` member of a subscription filter (this router's addition: the SDK has none).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TasksFilter {
    /// Only events of these tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_ids: Option<Vec<String>>,
}

/// The `trajectory` member of a subscription filter (SDK `TrajectorySubscriptionFilter`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrajectoryFilter {
    /// Only checkpoints of this agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// Only checkpoints of this work session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// One event in a `map/replay` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplayedEvent {
    /// The event id (a position for `afterEventId`).
    pub event_id: EventId,
    /// When it was recorded.
    pub timestamp: u64,
    /// Its causes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caused_by: Option<Vec<EventId>>,
    /// The event.
    pub event: Event,
}

// ---------------------------------------------------------------------------------------------
// `data` payloads, one per event type.
// ---------------------------------------------------------------------------------------------

/// `agent_registered`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentRegisteredData {
    pub agent_id: AgentId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    pub owner_id: Option<ParticipantId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<AgentId>,
    /// True when an orphaned agent was reclaimed by its reconnecting owner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RawJson>,
}

/// `agent_unregistered`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentUnregisteredData {
    pub agent_id: AgentId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `agent_state_changed`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentStateChangedData {
    pub agent_id: AgentId,
    pub previous_state: AgentState,
    pub new_state: AgentState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A supervised process's exit code, when it exited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended a supervised process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The last lines the process wrote to stderr.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<Vec<String>>,
}

impl AgentStateChangedData {
    /// A state change without process exit details.
    pub fn new(
        agent_id: AgentId,
        previous_state: AgentState,
        new_state: AgentState,
        reason: Option<String>,
    ) -> Self {
        Self {
            agent_id,
            previous_state,
            new_state,
            reason,
            exit_code: None,
            signal: None,
            stderr_tail: None,
        }
    }
}

/// `agent_orphaned`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentOrphanedData {
    pub agent_id: AgentId,
    pub previous_owner: ParticipantId,
}

/// `agent.presence.changed` (ours): an agent that stays registered went offline or came back.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentPresenceChangedData {
    pub agent_id: AgentId,
    pub status: crate::protocol::agent::PresenceStatus,
    pub since: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<u64>,
    /// In cluster mode, the node the agent's connection is (or was) on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// `agent_environment_changed`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentEnvironmentChangedData {
    pub agent_id: AgentId,
    pub environment: serde_json::Map<String, serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_environment: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `agent.metadata.changed`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentMetadataChangedData {
    pub agent_id: AgentId,
    /// The keys the update set, as the update wrote them.
    pub changes: RawJson,
    /// The merged metadata after the update.
    pub metadata: RawJson,
}

/// `participant_connected`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ParticipantConnectedData {
    pub participant_id: ParticipantId,
    pub participant_type: ParticipantType,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// True when a detached session was resumed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reconnected: Option<bool>,
}

/// `participant_disconnected`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ParticipantDisconnectedData {
    pub participant_id: ParticipantId,
    pub participant_type: ParticipantType,
    /// `disconnect` (map/disconnect), `transport_closed` (socket lost) or `shutdown`.
    pub reason: String,
}

/// `message_sent`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct MessageSentData {
    pub message_id: MessageId,
    pub from: String,
    pub to: RawJson,
    pub timestamp: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<RawJson>,
    pub message: Message,
}

/// `message_delivered`: one per recipient.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct MessageDeliveredData {
    pub message_id: MessageId,
    pub from: String,
    /// The recipient (one per event for a send to one agent), or every recipient the message
    /// reached (one event per multicast send, and per audience: docs/streams.md).
    pub delivered_to: Vec<String>,
    pub timestamp: u64,
    /// Omitted when the message expects a response (see docs/compatibility.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// The payload and the whole message: on the event of a send to one agent (the SDK's
    /// `request()` reads it there), and on deliveries from the offline queue. Left out of a
    /// multicast's event: the message is stored once, in its `message_sent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<RawJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
}

/// `message_failed`: a recipient could not be reached.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct MessageFailedData {
    pub message_id: MessageId,
    pub from: String,
    pub to: RawJson,
    /// The recipient that was not reached (a send to one agent, or a queued message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipient: Option<String>,
    /// The recipients not reached, for one reason (a multicast: one event per reason and
    /// audience): at most the first 32 of them, a sample (docs/streams.md says how the log
    /// gives the whole set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipients: Option<Vec<String>>,
    /// How many recipients of a multicast this event is about, when `recipients` lists only
    /// the first 32 of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipient_count: Option<u64>,
    /// `recipient_offline`, `recipient_backlogged` or `recipient_gone`.
    pub reason: String,
    pub code: i32,
}

/// `scope_created`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ScopeCreatedData {
    pub scope_id: ScopeId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<ScopeId>,
}

/// `scope_deleted`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ScopeDeletedData {
    pub scope_id: ScopeId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted_descendants: Option<Vec<ScopeId>>,
}

/// `scope_member_joined` and `scope_member_left`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ScopeMemberData {
    pub scope_id: ScopeId,
    pub agent_id: AgentId,
}

/// `subscription.overflow`: this subscription fell further behind than the event log retains.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct SubscriptionOverflowData {
    pub subscription_id: SubscriptionId,
    /// How many log entries were evicted before this subscription read them (an upper bound on
    /// the events it missed: some of them might not have matched its filter).
    pub events_dropped: u64,
    /// The first event the subscription receives after the gap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumes_at: Option<EventId>,
    pub recommendation: String,
    /// The subscription's overflow policy: `skip` (it continues live) or `close` (it ended).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

/// `permissions_client_updated`: `map/permissions/update` changed a participant's capabilities.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct PermissionsClientUpdatedData {
    pub client_id: ParticipantId,
    /// The flags the update set.
    pub changes: ParticipantCapabilities,
    /// The capabilities now in force.
    pub effective_permissions: ParticipantCapabilities,
    /// Who changed them (the TestServer's name).
    pub changed_by: ParticipantId,
    /// The same (the SDK type's name).
    pub updated_by: ParticipantId,
}

/// `permissions_agent_updated`: an agent's `permissionOverrides` changed.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct PermissionsAgentUpdatedData {
    pub agent_id: AgentId,
    /// The overrides as given.
    pub changes: serde_json::Map<String, serde_json::Value>,
    /// The agent's resolved permissions (defaults, role, overrides).
    pub effective_permissions: serde_json::Value,
    pub updated_by: ParticipantId,
}

/// `agent.injected`: content was injected into an agent (`map/inject`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentInjectedData {
    pub agent_id: AgentId,
    /// `queue`, `steer`, `interrupt` or `best-effort`.
    pub delivery: String,
    /// Whether it reached the agent's connection.
    pub injected: bool,
    pub message_id: MessageId,
    /// Who injected it.
    pub injected_by: String,
    pub content: RawJson,
}

/// `agent.stderr`: lines a supervised process wrote to stderr (batched, rate-limited).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentStderrData {
    pub agent_id: AgentId,
    pub pid: u32,
    /// The lines, in order (each at most 4 KiB).
    pub lines: Vec<String>,
    /// Lines written since the previous event but not included (rate limit); they are
    /// counted, never silently lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped: Option<u64>,
}

/// `agent.diagnostic`: a supervised process wrote something on its MAP channel that is not a
/// JSON-RPC message.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentDiagnosticData {
    pub agent_id: AgentId,
    pub pid: u32,
    /// `stdout`.
    pub stream: String,
    /// The offending line (at most 1 KiB).
    pub line: String,
    /// Why it was rejected.
    pub error: String,
}

/// `message.queued`: a recipient is away; the message waits for it (`meta.delivery`
/// `acknowledged` or `guaranteed`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct MessageQueuedData {
    pub message_id: MessageId,
    pub from: String,
    /// The recipient that is away (a send to one agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipient: Option<AgentId>,
    /// The recipients that are away (a multicast: one event per audience). Every one of them
    /// (not a sample, unlike `message_failed`): each is owed a later outcome of its own, and
    /// a restart rebuilds their queues from this list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipients: Option<Vec<AgentId>>,
    pub reason: String,
    /// A message passed on to another system (`reason: "federation"`): the envelope's routing
    /// from here, when the message did not start here (a restart rebuilds the envelope).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub federation: Option<crate::protocol::methods::federation::FederationRouting>,
}

/// `agent.spawning`: a supervised process was launched for this agent and has not registered
/// yet.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentSpawningData {
    pub agent_id: AgentId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<AgentId>,
    pub program: String,
    pub pid: u32,
}

/// `agent.spawn.failed`: a supervised process could not be started or did not register.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentSpawnFailedData {
    pub agent_id: AgentId,
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::EventType;

    /// `index()` is the position in `ALL` (a filter's mask and the subscription index rely on
    /// it), and every position fits a 64-bit mask.
    #[test]
    fn index_is_the_position_in_all() {
        for (i, t) in EventType::ALL.iter().enumerate() {
            assert_eq!(t.index(), i, "{t:?}");
        }
        assert!(EventType::ALL.len() <= 64);
    }
}
