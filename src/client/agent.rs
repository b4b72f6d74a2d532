//! The agent side: [`AgentHandle`] (a registered agent), its [`Messages`] inbox, request/reply,
//! and [`MessageExt`] to recognise control messages and injected content.
//!
//! The routing of incoming messages is documented on [`AgentHandle`].

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::{Stream, StreamExt};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::client::driver::Internal;
use crate::client::Client;
use crate::client::ClientError;
use crate::protocol::agent::{Agent, AgentState};
use crate::protocol::ids::AgentId;
use crate::protocol::message::Message;
use crate::protocol::methods::agents::{SpawnParams, SpawnResult, UpdateParams};
use crate::protocol::methods::messaging::SendResult;

/// A bounded message queue filled by the driver and read by one [`Messages`] stream.
#[derive(Debug)]
pub(crate) struct Inbox {
    state: Mutex<InboxQueue>,
    capacity: usize,
    dropped: AtomicU64,
    /// A name for log lines (the agent id, or `client`).
    label: String,
}

#[derive(Debug)]
struct InboxQueue {
    buf: VecDeque<Message>,
    waker: Option<Waker>,
    taken: bool,
    ended: bool,
}

impl Inbox {
    pub fn new(capacity: usize, label: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(InboxQueue {
                buf: VecDeque::new(),
                waker: None,
                taken: false,
                ended: false,
            }),
            capacity: capacity.max(1),
            dropped: AtomicU64::new(0),
            label: label.into(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, InboxQueue> {
        // Critical sections are a few field updates; a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a message, or drops it (logged and counted) when the inbox is full.
    pub fn push(&self, message: Message) {
        let mut q = self.lock();
        if q.ended {
            return;
        }
        if q.buf.len() >= self.capacity {
            drop(q);
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n == 1 || n.is_power_of_two() {
                tracing::warn!(
                    inbox = %self.label,
                    dropped = n,
                    message = %message.id,
                    "message inbox full: message dropped (read the inbox faster or raise message_buffer)"
                );
            }
            return;
        }
        q.buf.push_back(message);
        if let Some(w) = q.waker.take() {
            w.wake();
        }
    }

    /// Ends the stream after the queued messages.
    pub fn end(&self) {
        let mut q = self.lock();
        q.ended = true;
        if let Some(w) = q.waker.take() {
            w.wake();
        }
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The one stream over this inbox; `None` when it was already taken.
    pub fn take(self: &Arc<Self>) -> Option<Messages> {
        let mut q = self.lock();
        if q.taken {
            return None;
        }
        q.taken = true;
        Some(Messages {
            inbox: Some(self.clone()),
        })
    }
}

/// A stream of [`Message`]s delivered to an agent (or, from [`Client::messages`], to the
/// connection). Ends when the client closes or the agent handle is dropped or unregistered.
#[derive(Debug)]
pub struct Messages {
    inbox: Option<Arc<Inbox>>,
}

impl Messages {
    /// A stream that has already ended (returned when the inbox was taken before).
    pub(crate) fn ended() -> Self {
        Self { inbox: None }
    }
}

impl Stream for Messages {
    type Item = Message;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Message>> {
        let Some(inbox) = &self.inbox else {
            return Poll::Ready(None);
        };
        let mut q = inbox.lock();
        if let Some(m) = q.buf.pop_front() {
            return Poll::Ready(Some(m));
        }
        if q.ended {
            return Poll::Ready(None);
        }
        q.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

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

/// What a control message from the router asks an agent to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControlAction {
    /// `map/agents/stop`: finish up and stop.
    Stop,
    /// `map/agents/suspend`: pause work until resumed.
    Suspend,
    /// `map/agents/resume`: continue.
    Resume,
    /// A control word this client does not know.
    Other(String),
}

/// A control message: `{from: "system", payload: {control, agentId, reason?, force?}}`, sent by
/// the router when someone stops, suspends or resumes the agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Control {
    /// What to do.
    pub action: ControlAction,
    /// The agent it is about.
    pub agent_id: Option<AgentId>,
    /// Why, as given by the caller.
    pub reason: Option<String>,
    /// For stop: the router already stopped the agent.
    pub force: bool,
}

/// Content injected with `map/inject`: `{from: "system", meta: {_meta: {inject: {...}}}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Injection {
    /// `queue`, `steer`, `interrupt` or `best-effort`.
    pub delivery: String,
    /// Who injected it (agent or participant id).
    pub injected_by: Option<String>,
    /// `interrupt` delivery: abandon the current step.
    pub interrupt: bool,
    /// The injected content (the message payload).
    pub content: Value,
}

/// Helpers to recognise special messages.
///
/// ```
/// use map_router::client::{ControlAction, MessageExt};
/// use map_router::protocol::message::Message;
///
/// let m: Message = serde_json::from_value(serde_json::json!({
///     "id": "m1", "from": "system", "to": {"agent": "a1"}, "timestamp": 0,
///     "payload": {"control": "stop", "agentId": "a1", "reason": "done"}
/// })).unwrap();
/// assert_eq!(m.control().unwrap().action, ControlAction::Stop);
/// assert!(m.injection().is_none());
/// ```
pub trait MessageExt {
    /// The control request, when this is a control message from the router.
    fn control(&self) -> Option<Control>;
    /// The injection, when this is content injected with `map/inject`.
    fn injection(&self) -> Option<Injection>;
    /// `meta.isResult == true`: a reply to a request.
    fn is_reply(&self) -> bool;
}

impl MessageExt for Message {
    fn control(&self) -> Option<Control> {
        if self.from != "system" {
            return None;
        }
        let payload = self.payload.as_ref()?.as_object()?;
        let word = payload.get("control")?.as_str()?;
        let action = match word {
            "stop" => ControlAction::Stop,
            "suspend" => ControlAction::Suspend,
            "resume" => ControlAction::Resume,
            other => ControlAction::Other(other.to_owned()),
        };
        Some(Control {
            action,
            agent_id: payload
                .get("agentId")
                .and_then(Value::as_str)
                .map(AgentId::from),
            reason: payload
                .get("reason")
                .and_then(Value::as_str)
                .map(str::to_owned),
            force: payload
                .get("force")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        })
    }

    fn injection(&self) -> Option<Injection> {
        if self.from != "system" {
            return None;
        }
        let inject = self
            .meta
            .as_ref()?
            .get("_meta")?
            .get("inject")?
            .as_object()?;
        Some(Injection {
            delivery: inject
                .get("delivery")
                .and_then(Value::as_str)
                .unwrap_or("queue")
                .to_owned(),
            injected_by: inject
                .get("injectedBy")
                .and_then(Value::as_str)
                .map(str::to_owned),
            interrupt: inject
                .get("interrupt")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            content: self.payload.clone().unwrap_or(Value::Null),
        })
    }

    fn is_reply(&self) -> bool {
        self.meta
            .as_ref()
            .and_then(|m| m.get("isResult"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
}

/// The agent ids a `to` address names explicitly, or `None` for group addresses.
pub(crate) fn explicit_agents(to: &Value) -> Option<Vec<&str>> {
    match to {
        Value::String(s) if s.starts_with("scope:") => None,
        Value::String(s) => Some(vec![s.strip_prefix("agent:").unwrap_or(s)]),
        Value::Object(o) if o.get("system").is_none() => {
            if let Some(a) = o.get("agent").and_then(Value::as_str) {
                Some(vec![a])
            } else {
                o.get("agents")
                    .and_then(Value::as_array)
                    .map(|list| list.iter().filter_map(Value::as_str).collect())
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(v: Value) -> Message {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn injections_and_replies_are_recognised() {
        let m = msg(
            json!({"id": "m", "from": "system", "to": {"agent": "a"}, "timestamp": 1,
            "payload": {"hint": "x"},
            "meta": {"priority": "urgent", "_meta": {"inject": {"delivery": "interrupt", "injectedBy": "boss", "interrupt": true}}}}),
        );
        let i = m.injection().unwrap();
        assert_eq!(i.delivery, "interrupt");
        assert!(i.interrupt);
        assert_eq!(i.injected_by.as_deref(), Some("boss"));
        assert_eq!(i.content, json!({"hint": "x"}));
        assert!(m.control().is_none());
        let r = msg(
            json!({"id": "r", "from": "a", "to": {"agent": "b"}, "timestamp": 1,
            "meta": {"isResult": true, "correlationId": "c"}}),
        );
        assert!(r.is_reply());
        assert!(r.injection().is_none());
    }

    #[test]
    fn explicit_addresses_name_agents() {
        assert_eq!(explicit_agents(&json!("a")), Some(vec!["a"]));
        assert_eq!(explicit_agents(&json!("agent:a")), Some(vec!["a"]));
        assert_eq!(explicit_agents(&json!({"agent": "a"})), Some(vec!["a"]));
        assert_eq!(
            explicit_agents(&json!({"agents": ["a", "b"]})),
            Some(vec!["a", "b"])
        );
        assert_eq!(explicit_agents(&json!({"scope": "s"})), None);
        assert_eq!(explicit_agents(&json!("scope:s")), None);
        assert_eq!(explicit_agents(&json!({"broadcast": true})), None);
    }
}
