//! What handling one request produces, shared by the method table ([`super::dispatch`]), the
//! per-connection session ([`super::rpc`]) and the commit pipeline ([`super::pipeline`]): the
//! result, the follow-up the connection runs once the response is queued, and the log
//! position that must be committed before the response may be sent.

use crate::protocol::ids::SubscriptionId;

/// What the session must do after a response is queued.
#[derive(Debug, Clone, PartialEq)]
pub enum AfterReply {
    /// Nothing.
    Nothing,
    /// The connection now has a session.
    Connected,
    /// `map/connect` answered `authRequired`: no session until `map/authenticate` succeeds.
    AuthRequired,
    /// The connection's session ended.
    Disconnected,
    /// Activate this subscription.
    Activate(SubscriptionId),
    /// Write these frames after the response (a streamed `trajectory/content`).
    Frames(Vec<String>),
}

/// A successful call: the result JSON and the follow-up.
#[derive(Debug)]
pub struct Reply {
    /// The `result` value as JSON text.
    pub result: String,
    /// Follow-up.
    pub after: AfterReply,
    /// The log position every event of this call lies below, when the call appended events
    /// and the store's commits are waited for: the answer goes out once it is committed.
    pub commit: Option<u64>,
}

/// The outcome of one frame: the response to write (if any) and follow-ups that must run
/// once that response is queued (see [`RpcSession::complete`](crate::router::rpc::RpcSession::complete)).
#[derive(Debug, Default)]
#[must_use = "follow-ups must run once the response is queued"]
pub struct Handled {
    /// The response frame: one object, or an array for a batch.
    pub response: Option<String>,
    /// Follow-ups for [`RpcSession::complete`](crate::router::rpc::RpcSession::complete), to run once the response is written.
    pub after: Vec<AfterReply>,
}
