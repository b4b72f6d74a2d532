//! The mail extension (`urn:map:ext:mail:1`, stable): conversations that outlive a connection.
//! Participants create conversations, join, leave and invite, record turns (directly with
//! `mail/turn`, or by sending a `map/send` whose `meta.mail` names the conversation), split them
//! into threads, and read them back. Shapes follow the SDK 0.1.15 types (`Conversation`,
//! `ConversationParticipant`, `Turn`, `Thread`, `Mail*RequestParams`), which its
//! `createConversation`, `recordTurn`, `listTurns`, `sendWithMail`, ... send as they are.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::capabilities::Capability;
use crate::protocol::ids::{AgentId, MessageId};
use crate::protocol::json::RawJson;
use crate::protocol::methods::method::method;

/// `ConversationType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[allow(missing_docs)]
pub enum ConversationType {
    UserSession,
    AgentTask,
    #[default]
    MultiAgent,
    Mixed,
}

/// `ConversationStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[allow(missing_docs)]
pub enum ConversationStatus {
    #[default]
    Active,
    Paused,
    Completed,
    Failed,
    Archived,
}

/// `ParticipantRole` (within a conversation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[allow(missing_docs)]
pub enum Role {
    Initiator,
    #[default]
    Assistant,
    Worker,
    Observer,
    Moderator,
}

/// `ConversationPermissions.historyAccess`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[allow(missing_docs)]
pub enum HistoryAccess {
    None,
    FromJoin,
    #[default]
    Full,
}

/// `ConversationPermissions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Permissions {
    pub can_send: bool,
    pub can_observe: bool,
    pub can_invite: bool,
    pub can_remove: bool,
    pub can_create_threads: bool,
    pub history_access: HistoryAccess,
    pub can_see_internal: bool,
}

impl Permissions {
    /// The grant of a new participant with `role`: everyone sends, observes, makes threads
    /// and reads the whole history; initiators and moderators also invite and remove;
    /// observers only observe.
    pub fn for_role(role: Role) -> Self {
        let leads = matches!(role, Role::Initiator | Role::Moderator);
        let observer = role == Role::Observer;
        Self {
            can_send: !observer,
            can_observe: true,
            can_invite: leads,
            can_remove: leads,
            can_create_threads: !observer,
            history_access: HistoryAccess::Full,
            can_see_internal: leads,
        }
    }

    /// These permissions with the flags `over` gives.
    pub fn overlaid(mut self, over: &PermissionsInput) -> Self {
        let set = |v: &mut bool, o: Option<bool>| {
            if let Some(o) = o {
                *v = o;
            }
        };
        set(&mut self.can_send, over.can_send);
        set(&mut self.can_observe, over.can_observe);
        set(&mut self.can_invite, over.can_invite);
        set(&mut self.can_remove, over.can_remove);
        set(&mut self.can_create_threads, over.can_create_threads);
        set(&mut self.can_see_internal, over.can_see_internal);
        if let Some(h) = over.history_access {
            self.history_access = h;
        }
        self
    }
}

/// `Partial<ConversationPermissions>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct PermissionsInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub can_send: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub can_observe: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub can_invite: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub can_remove: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub can_create_threads: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_access: Option<HistoryAccess>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub can_see_internal: Option<bool>,
}

/// `Conversation`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Conversation {
    /// `conv-<ULID>`.
    pub id: String,
    /// Kind.
    #[serde(rename = "type")]
    pub kind: ConversationType,
    /// Status (`completed` once closed).
    pub status: ConversationStatus,
    /// Subject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// Participants that have not left.
    pub participant_count: u32,
    /// The conversation this one was spawned from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_conversation_id: Option<String>,
    /// The turn of the parent it was spawned from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_turn_id: Option<String>,
    /// Unix ms.
    pub created_at: u64,
    /// Unix ms of the last change or turn.
    pub updated_at: u64,
    /// Unix ms of the close.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_at: Option<u64>,
    /// The mail participant id of its creator.
    pub created_by: String,
    /// The creator's metadata, byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RawJson>,
}

/// `ConversationParticipant.agentInfo`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentInfo {
    pub agent_id: AgentId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
}

/// `ConversationParticipant`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Participant {
    /// An agent id, or a MAP participant id (a session without an agent).
    pub id: String,
    /// `user`, `agent` or `system`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Role in the conversation.
    pub role: Role,
    /// Unix ms.
    pub joined_at: u64,
    /// Unix ms, once it left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_at: Option<u64>,
    /// What it may do here.
    pub permissions: Permissions,
    /// The agent, when the participant is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_info: Option<AgentInfo>,
}

/// `Thread`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Thread {
    pub id: String,
    pub conversation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    pub root_turn_id: String,
    pub turn_count: u32,
    pub participant_count: u32,
    pub created_at: u64,
    pub updated_at: u64,
    pub created_by: String,
}

/// `TurnSource`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum TurnSource {
    /// Recorded with `mail/turn`.
    Explicit {
        /// Always `mail/turn`.
        method: String,
    },
    /// Recorded from a `map/send` with `meta.mail`.
    #[serde(rename_all = "camelCase")]
    Intercepted {
        /// The message.
        message_id: MessageId,
    },
}

/// `TurnVisibility`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum TurnVisibility {
    /// Every participant.
    All,
    /// These participants (and the author).
    Participants {
        /// Mail participant ids.
        ids: Vec<String>,
    },
    /// Participants with these roles (and the author).
    Role {
        /// Roles.
        roles: Vec<Role>,
    },
    /// The author only.
    Private,
}

/// `TurnStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[allow(missing_docs)]
pub enum TurnStatus {
    Pending,
    Streaming,
    Complete,
    Failed,
}

/// `Turn`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Turn {
    /// `turn-<ULID>`.
    pub id: String,
    /// Its conversation.
    pub conversation_id: String,
    /// Its author (a mail participant id).
    pub participant: String,
    /// Unix ms.
    pub timestamp: u64,
    /// `text`, `data`, `event`, `reference` or `x-*`.
    pub content_type: String,
    /// The content, byte for byte.
    pub content: RawJson,
    /// Its thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    /// The turn it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<String>,
    /// How it was recorded.
    pub source: TurnSource,
    /// Who may see it (absent: every participant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility: Option<TurnVisibility>,
    /// Content lifecycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<TurnStatus>,
    /// The author's metadata, byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RawJson>,
}

/// A participant to add (`initialParticipants[]`, `mail/invite`'s `participant`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ParticipantInput {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<PermissionsInput>,
}

/// `initialTurn`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct InitialTurn {
    pub content_type: String,
    pub content: RawJson,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility: Option<TurnVisibility>,
}

/// `mail/create` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct CreateParams {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<ConversationType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_conversation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_turn_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_participants: Option<Vec<ParticipantInput>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_turn: Option<InitialTurn>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RawJson>,
}

/// `mail/create` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct CreateResult {
    pub conversation: Conversation,
    pub participant: Participant,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_turn: Option<Turn>,
}

/// `mail/get` `include`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct GetInclude {
    #[serde(default)]
    pub participants: bool,
    #[serde(default)]
    pub threads: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_turns: Option<u32>,
    #[serde(default)]
    pub stats: bool,
}

/// `mail/get` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct GetParams {
    pub conversation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<GetInclude>,
}

/// `mail/get` stats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Stats {
    pub total_turns: u64,
    pub turns_by_content_type: std::collections::BTreeMap<String, u64>,
    pub active_participants: u32,
    pub thread_count: u32,
}

/// `mail/get` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct GetResult {
    pub conversation: Conversation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub participants: Option<Vec<Participant>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<Vec<Thread>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_turns: Option<Vec<Turn>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
}

/// `mail/list` filter.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ListFilter {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<Vec<ConversationType>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Vec<ConversationStatus>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub participant_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_after: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_before: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_conversation_id: Option<String>,
}

/// `mail/list` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ListParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<ListFilter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// `mail/list` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ListResult {
    pub conversations: Vec<Conversation>,
    pub has_more: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `mail/close` and `mail/leave` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct CloseParams {
    pub conversation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `{conversation}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ConversationResult {
    pub conversation: Conversation,
}

/// `mail/join` `catchUp`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct CatchUp {
    /// A turn id (after it) or a timestamp (from it).
    pub from: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(default)]
    pub include_summary: bool,
}

/// `mail/join` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct JoinParams {
    pub conversation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<CatchUp>,
}

/// `mail/join` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct JoinResult {
    pub conversation: Conversation,
    pub participant: Participant,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<Turn>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_cursor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// `mail/leave` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct LeaveResult {
    pub success: bool,
    pub left_at: u64,
}

/// `mail/invite` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct InviteParams {
    pub conversation_id: String,
    pub participant: ParticipantInput,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `mail/invite` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct InviteResult {
    pub invited: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub participant: Option<Participant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<bool>,
}

/// `mail/turn` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct TurnParams {
    pub conversation_id: String,
    pub content_type: String,
    pub content: RawJson,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility: Option<TurnVisibility>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RawJson>,
}

/// `{turn}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct TurnResult {
    pub turn: Turn,
}

/// Which turns `mail/turns/list` returns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct TurnsFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_all_threads: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_types: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub participant_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_turn_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_turn_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_timestamp: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_timestamp: Option<u64>,
}

/// Listing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(missing_docs)]
pub enum Order {
    #[default]
    Asc,
    Desc,
}

/// `mail/turns/list` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct TurnsListParams {
    pub conversation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<TurnsFilter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<Order>,
    /// `nextCursor` of the previous page (ours: the SDK's params have none, so its pages
    /// continue with `afterTurnId`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// `{turns, hasMore, nextCursor?}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct TurnsPage {
    pub turns: Vec<Turn>,
    pub has_more: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `mail/thread/create` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ThreadCreateParams {
    pub conversation_id: String,
    pub root_turn_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_thread_id: Option<String>,
}

/// `{thread}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ThreadResult {
    pub thread: Thread,
}

/// `mail/thread/list` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ThreadListParams {
    pub conversation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// `mail/thread/list` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ThreadListResult {
    pub threads: Vec<Thread>,
    pub has_more: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `mail/summary` scope.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct SummaryScope {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_turn_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_turn_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
}

/// `mail/summary` params (`regenerate` and `include` are accepted and change nothing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct SummaryParams {
    pub conversation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<SummaryScope>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regenerate: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<serde_json::Value>,
}

/// `mail/summary` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct SummaryResult {
    pub summary: String,
    pub generated: bool,
}

/// `mail/replay` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ReplayParams {
    pub conversation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_turn_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_timestamp: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_types: Option<Vec<String>>,
}

/// `mail/replay` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ReplayResult {
    pub turns: Vec<Turn>,
    pub has_more: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// How many turns follow the starting point (all pages).
    pub missed_count: u64,
}

/// `meta.mail` of a `map/send` (`MailMessageMeta`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct MailMeta {
    pub conversation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility: Option<TurnVisibility>,
}

/// The conversation and its participants after a change: what `mail.created`, `mail.closed`
/// and `mail.participant.*` events carry besides the SDK's fields (ours), so that the store
/// can keep a conversation from its newest event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationState {
    /// The conversation.
    pub conversation: Conversation,
    /// Every participant, those that left included.
    pub participants: Vec<Participant>,
}

method!(
    /// `mail/create`.
    MailCreate,
    "mail/create",
    Some(Capability::CanCreateConversations),
    CreateParams,
    CreateResult
);
method!(
    /// `mail/get`.
    MailGet,
    "mail/get",
    Some(Capability::CanViewConversationHistory),
    GetParams,
    GetResult
);
method!(
    /// `mail/list`.
    MailList,
    "mail/list",
    Some(Capability::CanViewConversationHistory),
    ListParams,
    ListResult
);
method!(
    /// `mail/close`.
    MailClose,
    "mail/close",
    None,
    CloseParams,
    ConversationResult
);
method!(
    /// `mail/join`.
    MailJoin,
    "mail/join",
    Some(Capability::CanJoinConversations),
    JoinParams,
    JoinResult
);
method!(
    /// `mail/leave`.
    MailLeave,
    "mail/leave",
    None,
    CloseParams,
    LeaveResult
);
method!(
    /// `mail/invite`.
    MailInvite,
    "mail/invite",
    Some(Capability::CanInviteToConversations),
    InviteParams,
    InviteResult
);
method!(
    /// `mail/turn`.
    MailTurn,
    "mail/turn",
    None,
    TurnParams,
    TurnResult
);
method!(
    /// `mail/turns/list`.
    MailTurnsList,
    "mail/turns/list",
    Some(Capability::CanViewConversationHistory),
    TurnsListParams,
    TurnsPage
);
method!(
    /// `mail/thread/create`.
    MailThreadCreate,
    "mail/thread/create",
    Some(Capability::CanCreateThreads),
    ThreadCreateParams,
    ThreadResult
);
method!(
    /// `mail/thread/list`.
    MailThreadList,
    "mail/thread/list",
    Some(Capability::CanViewConversationHistory),
    ThreadListParams,
    ThreadListResult
);
method!(
    /// `mail/summary`.
    MailSummary,
    "mail/summary",
    Some(Capability::CanViewConversationHistory),
    SummaryParams,
    SummaryResult
);
method!(
    /// `mail/replay`.
    MailReplay,
    "mail/replay",
    Some(Capability::CanViewConversationHistory),
    ReplayParams,
    ReplayResult
);
