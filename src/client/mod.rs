//! A Rust client for MAP: typed calls, event subscriptions, agents with request/reply, and
//! reconnect with resume, over WebSocket, a stdio child process, or in-process.
//!
//! ```no_run
//! use futures::StreamExt;
//! use map_router::client::{Client, ClientOptions};
//! use map_router::protocol::event::SubscriptionFilter;
//!
//! # async fn demo() -> Result<(), map_router::client::ClientError> {
//! let client = Client::connect_ws("ws://127.0.0.1:4500/", ClientOptions::new().name("dash")).await?;
//! for agent in client.list_agents(Default::default()).await? {
//!     println!("{} {}", agent.id, agent.state);
//! }
//! let mut events = client.subscribe(SubscriptionFilter::default()).await?;
//! while let Some(e) = events.next().await {
//!     println!("{} {}", e.kind(), e.event.source.as_deref().unwrap_or("-"));
//! }
//! # Ok(()) }
//! ```
//!
//! # Shape
//!
//! A [`Client`] is a cheap, clonable handle to one background task that owns the transport
//! (the single writer, and the reader that routes responses, events and messages). Handles
//! created from it ([`Subscription`], [`AgentHandle`]) keep the connection open too; it closes
//! when [`Client::close`] or [`Client::disconnect`] is called, or when every handle is dropped.
//!
//! - **Calls**: [`Client::call`] for any method type of [`protocol::methods`](crate::protocol::methods)
//!   (`call::<AgentsList>(params)`), plus convenience methods. Router errors come back as
//!   [`ClientError::Rpc`] with the MAP code, message and data. Every call is bounded by the
//!   request timeout (30 s by default).
//! - **Events**: [`Client::subscribe`] returns a [`Subscription`] stream; see its docs for
//!   the no-loss guarantees and the slow-consumer policy (pause, then resume by replay).
//! - **Agents**: [`Client::register`] returns an [`AgentHandle`] with its own inbox,
//!   [`AgentHandle::on_message`], [`AgentHandle::reply`] and [`Client::request`]
//!   (request/response correlated by `meta.correlationId`).
//! - **Reconnect** (WebSocket): when the socket is lost, the client reconnects with backoff,
//!   resumes the session with its resume token (the router reclaims the session's agents), and
//!   re-subscribes every live subscription from the last event it delivered, so streams continue
//!   without gap or duplicate. Calls in flight fail with a retryable
//!   [`ClientError::Transport`]; calls made during the outage wait for the new session (up to
//!   their timeout). [`Client::reconnect`] does the same on demand.
//!
//! `docs/client.md` walks through all of it; `examples/` has runnable programs.

mod agent;
mod command;
mod driver;
mod error;
mod feed;
mod handle;
mod inbox;
mod message;
mod options;
mod subscription;
pub(crate) mod tls;
mod tool;
pub(crate) mod transport;

pub use agent::AgentHandle;
pub use error::ClientError;
pub use feed::EventEnvelope;
pub use handle::{router_url_from_env, Client, ReplayPage, Scopes, DEFAULT_ROUTER_URL};
pub use inbox::Messages;
pub use message::{Control, ControlAction, Injection, MessageExt};
pub use options::{
    ClientOptions, ConnectionState, ReconnectPolicy, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MESSAGE_BUFFER, DEFAULT_REQUEST_TIMEOUT, DEFAULT_SUBSCRIPTION_BUFFER,
};
pub use subscription::Subscription;
pub use tool::ToolResult;
pub use transport::{CHILD_EXIT_GRACE, MAX_INBOUND_FRAME};
