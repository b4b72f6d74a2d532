//! Typed router errors and their single mapping to wire errors.
//!
//! Every handler returns `RouterError`; the only place a code and message are chosen is
//! [`RouterError::to_error_object`]. Messages match the SDK's factory messages (wire.md §9) so
//! clients that compare text keep working. Every error here is fatal to the request only, never
//! to the connection.

use crate::protocol::jsonrpc::{ErrorCode, ErrorObject};

/// An error from a router operation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RouterError {
    /// The connection has no session: `map/connect` first.
    #[error("Not connected: call map/connect first")]
    NotConnected,
    /// `map/connect` answered `authRequired`: only `map/authenticate` (or another `map/connect`)
    /// is allowed until a credential is accepted.
    #[error("Authentication required: call map/authenticate (or map/connect with auth) first")]
    AuthRequired,
    /// A capability or ownership check failed. The text names what was missing.
    #[error("Permission denied: {0}")]
    PermissionDenied(String),
    /// Unknown (or invisible) agent.
    #[error("Agent not found: {0}")]
    AgentNotFound(String),
    /// Unknown (or invisible) scope.
    #[error("Scope not found: {0}")]
    ScopeNotFound(String),
    /// An address that resolves to nothing.
    #[error("Address not found: {0}")]
    AddressNotFound(String),
    /// A bare string address naming both an agent and a scope.
    #[error("Address is ambiguous: {0}")]
    AddressAmbiguous(String),
    /// A federated address to a system we are not connected to.
    #[error("System not found: {0}")]
    SystemNotFound(String),
    /// `agentId` already registered to a live owner.
    #[error("Agent already exists: {0}")]
    AgentExists(String),
    /// A state transition that is not allowed.
    #[error("Cannot {action} agent in state: {state}")]
    StateInvalid {
        /// What was attempted.
        action: &'static str,
        /// The agent's current state.
        state: String,
    },
    /// A supervised process could not be started or did not complete its handshake.
    #[error("Failed to spawn agent: {0}")]
    SpawnFailed(String),
    /// The recipient could not take the message now.
    #[error("Message delivery failed: {0}")]
    DeliveryFailed(String),
    /// Params that parse but make no sense.
    #[error("Invalid params: {0}")]
    InvalidParams(String),
    /// A request that is not allowed in the session's state.
    #[error("Invalid request: {0}")]
    InvalidRequest(String),
    /// A configured limit was reached.
    #[error("Resource exhausted: {0}")]
    Exhausted(String),
    /// A per-session or per-principal quota was reached (`[limits]`).
    #[error("Quota exceeded: {0}")]
    QuotaExceeded(String),
    /// No session with that id that the caller may see (unknown, ended, or another
    /// principal's: existence does not leak).
    #[error("Session not found: {0}")]
    SessionNotFound(String),
    /// The session is attached to another connection.
    #[error("Session in use: {0} is attached to another connection")]
    SessionInUse(String),
    /// No checkpoint with that id that the caller may see.
    #[error("Checkpoint not found: {0}")]
    CheckpointNotFound(String),
    /// A checkpoint's content cannot be had (its agent is gone, has none, or did not answer).
    #[error("Content unavailable: {0}")]
    ContentUnavailable(String),
    /// A trajectory operation on an agent the caller does not own.
    #[error("Permission denied: {0}")]
    TrajectoryDenied(String),
    /// No task with that id that the caller may see.
    #[error("Task not found: {0}")]
    TaskNotFound(String),
    /// A task cannot be assigned to that agent.
    #[error("Task assignment failed: {0}")]
    TaskAssignmentFailed(String),
    /// A change to a task the caller may see but not modify.
    #[error("Task permission denied: {0}")]
    TaskDenied(String),
    /// No trace, message or event of that id that the caller may see (`map/traces/get`:
    /// unknown and hidden alike).
    #[error("Trace not found: {0}")]
    TraceNotFound(String),
    /// A mail extension error: its code and message.
    #[error("{1}")]
    Mail(crate::protocol::jsonrpc::ErrorCode, String),
    /// A federation error (5000–5999): its code and message (`router::federation`).
    #[error("{1}")]
    Federation(crate::protocol::jsonrpc::ErrorCode, String),
    /// The durable store failed.
    #[error("Storage error: {0}")]
    Storage(String),
    /// The call took effect but its events were not confirmed durable in time.
    #[error("Not durable: {0}")]
    NotDurable(String),
    /// A call that would write the log, made on a follower (`RouterConfig::follower`).
    #[error(
        "Method not supported on this node: {0} changes state, and this node follows the event \
         log another node writes (it serves map/subscribe and map/replay); call the writer \
         (GET /health names it)"
    )]
    NotOnFollower(String),
    /// The router is shutting down or gone.
    #[error("Router unavailable")]
    Unavailable,
    /// Not an answer: the operation needs kept items the router does not hold in memory. It
    /// changed nothing; `kept::ops::paged` loads them (on the store's threads) and runs it
    /// again. Never sent to a peer.
    #[error("Internal error: kept items not loaded")]
    NeedsLoad(Vec<crate::router::kept::need::Need>),
}

impl RouterError {
    /// A call whose events were not committed: the store stopped, or it did not commit
    /// within `limit`.
    pub fn not_committed(store_stopped: bool, limit: std::time::Duration) -> Self {
        Self::NotDurable(if store_stopped {
            "the event store has stopped".into()
        } else {
            format!(
                "the event store did not commit within {} ms",
                limit.as_millis()
            )
        })
    }

    /// A call refused because `waiting` events already wait for their commit (over `limit`):
    /// the store is slow or away. Nothing was done.
    pub fn store_behind(waiting: u64, limit: u64) -> Self {
        Self::NotDurable(format!(
            "the event store is behind: {waiting} events wait for their commit (limit {limit}); \
             nothing was done, try again later"
        ))
    }

    /// The wire error.
    pub fn to_error_object(&self) -> ErrorObject {
        let msg = self.to_string();
        match self {
            Self::NotConnected | Self::AuthRequired => {
                ErrorObject::new(ErrorCode::AUTH_REQUIRED, msg)
            }
            Self::PermissionDenied(_) => ErrorObject::new(ErrorCode::PERMISSION_DENIED, msg),
            Self::AgentNotFound(_) => ErrorObject::new(ErrorCode::AGENT_NOT_FOUND, msg),
            Self::ScopeNotFound(_) => ErrorObject::new(ErrorCode::SCOPE_NOT_FOUND, msg),
            Self::AddressNotFound(_) => ErrorObject::new(ErrorCode::ADDRESS_NOT_FOUND, msg),
            Self::AddressAmbiguous(_) => ErrorObject::new(ErrorCode::ADDRESS_AMBIGUOUS, msg),
            Self::SystemNotFound(_) => {
                ErrorObject::new(ErrorCode::FEDERATION_SYSTEM_NOT_FOUND, msg)
            }
            Self::AgentExists(_) => ErrorObject::new(ErrorCode::AGENT_EXISTS, msg),
            Self::StateInvalid { .. } => ErrorObject::new(ErrorCode::STATE_INVALID, msg),
            Self::SpawnFailed(_) => ErrorObject::new(ErrorCode::SPAWN_FAILED, msg),
            Self::DeliveryFailed(_) => {
                ErrorObject::new(ErrorCode::DELIVERY_FAILED, msg).retryable()
            }
            Self::InvalidParams(detail) => ErrorObject::invalid_params(detail.clone()),
            Self::InvalidRequest(detail) => ErrorObject::invalid_request(detail.clone()),
            Self::Exhausted(_) => ErrorObject::new(ErrorCode::EXHAUSTED, msg).retryable(),
            Self::QuotaExceeded(_) => ErrorObject::new(ErrorCode::QUOTA_EXCEEDED, msg),
            Self::SessionNotFound(_) => ErrorObject::new(ErrorCode::SESSION_NOT_FOUND, msg),
            Self::SessionInUse(_) => ErrorObject::new(ErrorCode::SESSION_IN_USE, msg),
            Self::CheckpointNotFound(_) => ErrorObject::new(ErrorCode::CHECKPOINT_NOT_FOUND, msg),
            Self::ContentUnavailable(_) => ErrorObject::new(ErrorCode::CONTENT_UNAVAILABLE, msg),
            Self::TrajectoryDenied(_) => {
                ErrorObject::new(ErrorCode::TRAJECTORY_PERMISSION_DENIED, msg)
            }
            Self::TaskNotFound(_) => ErrorObject::new(ErrorCode::TASK_NOT_FOUND, msg),
            Self::TaskAssignmentFailed(_) => {
                ErrorObject::new(ErrorCode::TASK_ASSIGNMENT_FAILED, msg)
            }
            Self::TaskDenied(_) => ErrorObject::new(ErrorCode::TASK_PERMISSION_DENIED, msg),
            Self::TraceNotFound(_) => ErrorObject::new(ErrorCode::TRACE_NOT_FOUND, msg),
            Self::Mail(code, _) | Self::Federation(code, _) => ErrorObject::new(*code, msg),
            Self::NotDurable(_) => ErrorObject::new(ErrorCode::EXHAUSTED, msg),
            Self::Storage(_) => ErrorObject::internal(msg),
            Self::NotOnFollower(_) => ErrorObject::new(ErrorCode::METHOD_NOT_SUPPORTED, msg),
            Self::Unavailable => ErrorObject::internal("Router unavailable").retryable(),
            Self::NeedsLoad(_) => ErrorObject::internal(msg),
        }
    }
}

impl From<RouterError> for ErrorObject {
    fn from(e: RouterError) -> Self {
        e.to_error_object()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages_match_the_sdk() {
        let e = RouterError::AgentNotFound("nope".into()).to_error_object();
        assert_eq!(e.code, ErrorCode::AGENT_NOT_FOUND);
        assert_eq!(e.message, "Agent not found: nope");
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"code":2001,"message":"Agent not found: nope","data":{"category":"routing"}}"#
        );
        let e = RouterError::StateInvalid {
            action: "resume",
            state: "idle".into(),
        }
        .to_error_object();
        assert_eq!(e.code.0, 3001);
        assert_eq!(e.message, "Cannot resume agent in state: idle");
        assert_eq!(RouterError::NotConnected.to_error_object().code.0, 1000);
        assert_eq!(
            RouterError::PermissionDenied("lifecycle.canSpawn".into())
                .to_error_object()
                .message,
            "Permission denied: lifecycle.canSpawn"
        );
    }
}
