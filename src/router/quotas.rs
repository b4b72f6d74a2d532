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
//!   (`transport::admission`).

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
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            max_subscriptions_per_session: DEFAULT_MAX_SUBSCRIPTIONS_PER_SESSION,
            max_agents_per_session: DEFAULT_MAX_AGENTS_PER_SESSION,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            max_sessions_per_principal: DEFAULT_MAX_SESSIONS_PER_PRINCIPAL,
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
