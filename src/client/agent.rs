//! The agent side: [`AgentHandle`] (a registered agent), its [`Messages`] inbox, request/reply,
//! and [`MessageExt`] to recognise control messages and injected content.
//!
//! The routing of incoming messages is documented on [`AgentHandle`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::client::command::{Command, Internal};
use crate::client::error::ClientError;
use crate::client::handle::Client;
use crate::client::inbox::{Inbox, Messages};
use crate::protocol::agent::{Agent, AgentState};
use crate::protocol::ids::AgentId;
use crate::protocol::message::Message;
use crate::protocol::methods::agents::{RegisterParams, SpawnParams, SpawnResult, UpdateParams};
use crate::protocol::methods::messaging::SendResult;

/// A registered agent, from [`Client::register`].
///
/// Cheap to clone. The agent stays registered while the session lives; dropping the last
/// handle only stops routing its messages to it (they then go to [`Client::messages`]). Use
/// [`AgentHandle::unregister`] to remove it from the router.
///
/// # Which inbox gets a `map/message`
///
/// The router sends each message once per connection, however many of the connection's agents
/// it addresses. The client hands it:
/// 1. to the waiting [`Client::request`] when it is a reply (`meta.isResult: true`) whose
///    `meta.correlationId` matches one;
/// 2. else, when `to` names agents explicitly (`"id"`, `"agent:id"`, `{agent}`, `{agents}`),
///    to the inbox of each of those agents that has a live [`AgentHandle`];
/// 3. else (scope, role, broadcast, hierarchy, participant addresses) to every agent handle;
/// 4. and anything no handle takes (no agent registered, or addressed to an agent this session
///    owns without a handle, such as a spawned child) to [`Client::messages`].
///
/// Inboxes are bounded ([`ClientOptions::message_buffer`](super::ClientOptions::message_buffer),
/// 1 024 by default). A message that finds its inbox full is dropped with a warning in the log
/// and counted in [`AgentHandle::dropped_messages`]; the router has already reported it as
/// delivered. Read your inbox (or use [`AgentHandle::on_message`]) to avoid this.
///
/// ```no_run
/// # async fn demo() -> Result<(), map_router::client::ClientError> {
/// use map_router::client::{Client, ClientOptions, MessageExt};
/// use map_router::protocol::methods::agents::RegisterParams;
///
/// let client = Client::connect_ws("ws://127.0.0.1:4500/", ClientOptions::agent()).await?;
/// let agent = client
///     .register(RegisterParams { name: Some("echo".into()), role: Some("echo".into()), ..Default::default() })
///     .await?;
/// agent.on_message(|agent, message| async move {
///     if message.control().is_some() {
///         return; // stop / suspend / resume from the router
///     }
///     let _ = agent.reply(&message, serde_json::json!({"echo": message.payload})).await;
/// });
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct AgentHandle {
    inner: Arc<AgentInner>,
}

struct AgentInner {
    client: Client,
    agent: Agent,
    inbox: Arc<Inbox>,
    internal: mpsc::UnboundedSender<Internal>,
}

impl Drop for AgentInner {
    fn drop(&mut self) {
        let _ = self
            .internal
            .send(Internal::DropAgent(self.agent.id.clone()));
    }
}

impl std::fmt::Debug for AgentHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentHandle")
            .field("id", &self.inner.agent.id)
            .finish_non_exhaustive()
    }
}

impl AgentHandle {
    pub(crate) fn new(
        client: Client,
        agent: Agent,
        inbox: Arc<Inbox>,
        internal: mpsc::UnboundedSender<Internal>,
    ) -> Self {
        Self {
            inner: Arc::new(AgentInner {
                client,
                agent,
                inbox,
                internal,
            }),
        }
    }

    /// The agent's id.
    pub fn id(&self) -> &AgentId {
        &self.inner.agent.id
    }

    /// The agent record as the router returned it at registration.
    pub fn agent(&self) -> &Agent {
        &self.inner.agent
    }

    /// The client this agent speaks through.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The agent's messages. There is one stream per agent: a second call returns a stream
    /// that has already ended. Messages that arrived since registration are waiting in it.
    pub fn messages(&self) -> Messages {
        self.inner.inbox.take().unwrap_or_else(|| {
            tracing::warn!(agent = %self.id(), "messages() called twice; the second stream is empty");
            Messages::ended()
        })
    }

    /// Messages dropped because the inbox was full.
    pub fn dropped_messages(&self) -> u64 {
        self.inner.inbox.dropped()
    }

    /// Spawns a task that calls `handler` for each message, one at a time, in order. The
    /// handler may await calls on the same client (replies, requests): the client's reader runs
    /// elsewhere, so this cannot deadlock. The task ends when the message stream ends; abort
    /// the returned handle to stop it earlier.
    pub fn on_message<F, Fut>(&self, mut handler: F) -> JoinHandle<()>
    where
        F: FnMut(AgentHandle, Message) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut messages = self.messages();
        let me = self.clone();
        tokio::spawn(async move {
            while let Some(message) = messages.next().await {
                handler(me.clone(), message).await;
            }
        })
    }

    /// Replies to `message`: sends `payload` to `{agent: message.from}` with
    /// `meta {correlationId, isResult: true}` (see [`Client::reply`]).
    ///
    /// # Errors
    /// As [`Client::send`].
    pub async fn reply(
        &self,
        message: &Message,
        payload: Value,
    ) -> Result<SendResult, ClientError> {
        self.inner.client.reply(message, payload).await
    }

    /// Sends `payload` to `to` and waits up to `timeout` for the reply (see
    /// [`Client::request`]). The message's `from` is the session's primary agent: the first
    /// agent it registered.
    ///
    /// # Errors
    /// As [`Client::request`].
    pub async fn request(
        &self,
        to: impl Into<Value>,
        payload: Value,
        timeout: Duration,
    ) -> Result<Message, ClientError> {
        self.inner.client.request(to, payload, timeout).await
    }

    /// Sends a message (see [`Client::send`]).
    ///
    /// # Errors
    /// As [`Client::send`].
    pub async fn send(
        &self,
        to: impl Into<Value>,
        payload: Value,
    ) -> Result<SendResult, ClientError> {
        self.inner.client.send(to, payload).await
    }

    /// Sets the agent's state (`active`, `busy`, `idle`, `stopped`, `x-<custom>`, ...).
    ///
    /// # Errors
    /// The router's error (e.g. 3001 when leaving `stopped`).
    pub async fn set_state(&self, state: AgentState) -> Result<Agent, ClientError> {
        self.inner
            .client
            .update_agent(UpdateParams {
                agent_id: self.id().clone(),
                state: Some(state),
                environment: None,
                metadata: None,
                permission_overrides: None,
            })
            .await
    }

    /// Spawns a child of this agent (`parent` is set to this agent).
    ///
    /// # Errors
    /// The router's error (1003 without `lifecycle.canSpawn`).
    pub async fn spawn(&self, mut params: SpawnParams) -> Result<SpawnResult, ClientError> {
        params.register.parent = Some(self.id().clone());
        self.inner.client.spawn(params).await
    }

    /// Unregisters the agent and ends its message stream.
    ///
    /// # Errors
    /// The router's error.
    pub async fn unregister(self) -> Result<Agent, ClientError> {
        self.inner.client.unregister(self.id().clone()).await
    }
}

impl Client {
    /// Messages delivered to this connection that no [`AgentHandle`] takes (see
    /// [`AgentHandle`]'s docs for the routing). One stream per client: a second call returns an
    /// ended stream.
    pub fn messages(&self) -> Messages {
        self.inner
            .shared
            .unclaimed
            .take()
            .unwrap_or_else(Messages::ended)
    }

    /// Registers an agent owned by this session and returns its handle, whose inbox receives
    /// the agent's messages from the moment the registration is answered. Needs
    /// `lifecycle.canRegister` (connect with [`ClientOptions::agent`](crate::client::ClientOptions::agent)).
    ///
    /// If the session cannot be resumed after a reconnect (its token expired), the client
    /// registers its agents again with the same ids.
    ///
    /// # Errors
    /// As [`Client::call`]: 3000 when the id is taken, 1003 for `client` participants.
    pub async fn register(&self, params: RegisterParams) -> Result<AgentHandle, ClientError> {
        let (reply, rx) = oneshot::channel();
        let (result, inbox) = self
            .command(Command::Register { params, reply }, rx)
            .await?;
        Ok(AgentHandle::new(
            self.clone(),
            result.agent,
            inbox,
            self.inner.internal_tx.clone(),
        ))
    }
}
