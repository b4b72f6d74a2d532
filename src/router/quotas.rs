//! Per-session and per-principal quotas: how much router state one participant may hold.
//!
//! Owns the numbers and the checks; handlers call them before they create state. Every refusal
//! is `4002 Quota exceeded: <what> (limit N)`: fatal to the
//! request only, and not retryable as such (the participant must first release something).
//!
//! - subscriptions per session (`map/subscribe`);
//! - agents owned per session (`map/agents/register`, `map/agents/spawn`); an agent's owner is
//!   its session's participant, so a resumed session keeps its count;
//! - payload bytes of one `map/send` (and of `map/inject` content): a message is copied into the
//!   log and to every recipient, so it is bounded well below the frame limit;
//! - sessions attached at once per authenticated principal. Sessions without a principal are
//!   not counted here: anonymous peers are bounded per remote address when they connect
//!   (`transport::admission`);
//! - what a caller creates that the store keeps for good (nothing deletes them): tasks,
//!   conversations and checkpoints per **quota owner**, and turns per conversation. The quota
//!   owner of a session is its principal (every session of one principal shares the count),
//!   or its participant id when it has none (anonymous); the router's service principal (the
//!   gateways' own sessions) is not bounded. The counts are the store's (`owner` columns of
//!   the kept tables), cached per owner like the items themselves (`router::kept`), so they
//!   survive restarts. Rows written before the store recorded owners count for nobody.

use crate::protocol::json::RawJson;
use crate::router::error::RouterError;

/// Default subscriptions per session: a dashboard uses a handful; 100 leaves room while
/// bounding the per-event fan-out work one participant can cause.
pub const DEFAULT_MAX_SUBSCRIPTIONS_PER_SESSION: usize = 100;
/// Default agents owned per session: an orchestrator with a large team, not an unbounded
/// registry growth from one peer.
pub const DEFAULT_MAX_AGENTS_PER_SESSION: usize = 1000;
/// Default largest `map/send` payload (serialized): 256 KiB. Each message is stored in the
/// event log (`message_sent`, one `message_delivered` per recipient) and queued per recipient.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 256 * 1024;
/// Default sessions attached at once per authenticated principal.
pub const DEFAULT_MAX_SESSIONS_PER_PRINCIPAL: usize = 64;
/// Default tasks one quota owner creates: a task is kept for good (about 1 KB of store each),
/// and the A2A gateway makes one per A2A task of its caller, so the bound is high: 100 000
/// tasks is about 100 MB of store per owner.
pub const DEFAULT_MAX_TASKS_PER_PRINCIPAL: usize = 100_000;
/// Default conversations one quota owner creates: a conversation is a durable thread of work,
/// not a message; 10 000 is far more than an agent or a gateway caller keeps open, and with
/// the turn bound caps what one owner's mail can take.
pub const DEFAULT_MAX_CONVERSATIONS_PER_PRINCIPAL: usize = 10_000;
/// Default turns in one conversation: every turn is kept for good, and listing, summarizing
/// or replaying a conversation reads its turns; 10 000 turns is a very long conversation.
pub const DEFAULT_MAX_TURNS_PER_CONVERSATION: usize = 10_000;
/// Default checkpoints one quota owner reports: an agent reports one per step of its work,
/// and checkpoints are kept for good (about 1 KB of store each): 100 000 is a long history.
pub const DEFAULT_MAX_CHECKPOINTS_PER_PRINCIPAL: usize = 100_000;

/// The quotas (0 = unlimited for each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    /// Subscriptions one session may hold.
    pub max_subscriptions_per_session: usize,
    /// Agents one session may own.
    pub max_agents_per_session: usize,
    /// Largest serialized `map/send` payload or `map/inject` content.
    pub max_payload_bytes: usize,
    /// Sessions attached at once per authenticated principal.
    pub max_sessions_per_principal: usize,
    /// Tasks one quota owner creates (`map/tasks/create`).
    pub max_tasks_per_principal: usize,
    /// Conversations one quota owner creates (`mail/create`).
    pub max_conversations_per_principal: usize,
    /// Turns in one conversation (`mail/turn`, `map/send` with `meta.mail`).
    pub max_turns_per_conversation: usize,
    /// Checkpoints (distinct ids) one quota owner reports (`trajectory/checkpoint`).
    pub max_checkpoints_per_principal: usize,
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            max_subscriptions_per_session: DEFAULT_MAX_SUBSCRIPTIONS_PER_SESSION,
            max_agents_per_session: DEFAULT_MAX_AGENTS_PER_SESSION,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            max_sessions_per_principal: DEFAULT_MAX_SESSIONS_PER_PRINCIPAL,
            max_tasks_per_principal: DEFAULT_MAX_TASKS_PER_PRINCIPAL,
            max_conversations_per_principal: DEFAULT_MAX_CONVERSATIONS_PER_PRINCIPAL,
            max_turns_per_conversation: DEFAULT_MAX_TURNS_PER_CONVERSATION,
            max_checkpoints_per_principal: DEFAULT_MAX_CHECKPOINTS_PER_PRINCIPAL,
        }
    }
}

pub(crate) fn exceeded(what: &str, limit: usize) -> RouterError {
    RouterError::QuotaExceeded(format!("{what} (limit {limit})"))
}

impl Quotas {
    /// Checks a message payload (or injected content) against `max_payload_bytes`.
    ///
    /// # Errors
    /// `QuotaExceeded` when it is larger.
    pub fn check_payload(&self, payload: Option<&RawJson>) -> Result<(), RouterError> {
        let (Some(payload), limit) = (payload, self.max_payload_bytes) else {
            return Ok(());
        };
        if limit == 0 {
            return Ok(());
        }
        let len = payload.len();
        if len > limit {
            return Err(RouterError::QuotaExceeded(format!(
                "payload of {len} bytes exceeds {limit} bytes"
            )));
        }
        Ok(())
    }
}
