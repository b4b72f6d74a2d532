//! What the handles ([`Client`](crate::client::Client), agent handles, subscriptions) ask the
//! driver: [`Command`]s that get an answer, and [`Internal`] notices from places that cannot
//! wait (drops, stream polls).

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::client::error::ClientError;
use crate::client::feed::SubShared;
use crate::client::inbox::Inbox;
use crate::protocol::ids::AgentId;
use crate::protocol::message::Message;
use crate::protocol::methods::agents::{RegisterParams, RegisterResult};
use crate::protocol::methods::events::SubscribeParams;
use crate::protocol::methods::messaging::{SendParams, SendResult};
use crate::protocol::methods::session::{ConnectResult, DisconnectParams, DisconnectResult};

pub(crate) type Reply<T> = oneshot::Sender<Result<T, ClientError>>;

/// A request from a handle to the driver.
pub(crate) enum Command {
    /// Any method; params and result are JSON text.
    Call {
        method: String,
        params: String,
        reply: Reply<String>,
    },
    /// A notification (no response).
    Notify { method: String, params: String },
    /// `map/subscribe`, registering the buffer when the response arrives.
    Subscribe {
        params: SubscribeParams,
        reply: Reply<Arc<SubShared>>,
    },
    /// `map/unsubscribe` of a [`Subscription`].
    Unsubscribe { key: u64, reply: Reply<()> },
    /// `map/agents/register`, creating the agent's inbox when the response arrives.
    Register {
        params: RegisterParams,
        reply: Reply<(RegisterResult, Arc<Inbox>)>,
    },
    /// `map/send` with `expectsResponse`, plus a waiter for the reply.
    Request {
        params: SendParams,
        correlation_id: String,
        waiter: oneshot::Sender<Message>,
        reply: Reply<SendResult>,
    },
    /// Open a new transport and resume the session.
    Reconnect { reply: Reply<ConnectResult> },
    /// Close, after `map/disconnect` when params are given.
    Close {
        disconnect: Option<DisconnectParams>,
        reply: Reply<Option<DisconnectResult>>,
    },
}

/// Notifications from handles that cannot await (drops, stream polls).
#[derive(Debug)]
pub(crate) enum Internal {
    /// A [`Subscription`] was dropped.
    DropSubscription(u64),
    /// A paused subscription's consumer caught up.
    ResumeSubscription(u64),
    /// The last [`AgentHandle`] of an agent was dropped.
    DropAgent(AgentId),
}
