//! [`Client`]: the cheap, clonable handle to one connection's background task (the driver,
//! which owns the transport). Connecting, typed calls, messages, agents and scopes; the parts
//! of its API that return agent handles and subscriptions are in `agent.rs` and
//! `subscription.rs`.

use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

use crate::client::command::{Command, Internal};
use crate::client::driver::Shared;
use crate::client::error::ClientError;
use crate::client::options::{ClientOptions, ConnectionState};
use crate::client::transport::{self, Link};

use crate::protocol::agent::Agent;
use crate::protocol::event::ReplayedEvent;
use crate::protocol::ids::{AgentId, ParticipantId, ScopeId};
use crate::protocol::json::RawJson;
use crate::protocol::message::Message;
use crate::protocol::methods::agents::*;
use crate::protocol::methods::events::{Replay, ReplayParams};
use crate::protocol::methods::messaging::{self, SendParams, SendResult};
use crate::protocol::methods::scopes::*;
use crate::protocol::methods::session::{ConnectResult, DisconnectParams, DisconnectResult};
use crate::protocol::methods::steering::{Inject, InjectDelivery, InjectParams, InjectResult};
use crate::protocol::methods::Method;
use crate::protocol::scope::Scope;
use crate::transport::in_process::InProcessLinks;

/// Most pages a convenience listing follows (`list_agents`, `scopes().members`).
const MAX_PAGES: usize = 10_000;

/// Where a router listens by default (`map-router serve`).
pub const DEFAULT_ROUTER_URL: &str = "ws://127.0.0.1:4500/";

/// The router URL a program should use: `MAP_ROUTER_URL` (what the CLI reads), else `MAP_URL`
/// (accepted for older scripts), else [`DEFAULT_ROUTER_URL`]. Empty values count as unset.
pub fn router_url_from_env() -> String {
    ["MAP_ROUTER_URL", "MAP_URL"]
        .iter()
        .filter_map(|k| std::env::var(k).ok())
        .find(|v| !v.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_ROUTER_URL.to_owned())
}

/// A connection to a MAP router. Cheap to clone; every clone shares the connection.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) cmd_tx: mpsc::Sender<Command>,
    pub(crate) internal_tx: mpsc::UnboundedSender<Internal>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) request_timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("state", &self.state())
            .field("participant_id", &self.participant_id())
            .finish_non_exhaustive()
    }
}

impl Client {
    // -----------------------------------------------------------------------------------------
    // Connecting
    // -----------------------------------------------------------------------------------------

    /// Connects over WebSocket (`ws://host:port/`, or `wss://host:port/` to a router serving
    /// TLS) and opens a session (`map/connect`). `http://` and `https://` URLs are taken as
    /// `ws://` and `wss://`. Over TLS the client trusts the platform's root certificates plus
    /// [`ClientOptions::ca_file`]. Lost connections are re-established according to the
    /// options' [`ReconnectPolicy`](crate::client::ReconnectPolicy).
    ///
    /// # Errors
    /// [`ClientError::Transport`] when the socket cannot be opened (or the URL is not a
    /// WebSocket URL), [`ClientError::UntrustedCertificate`] when the router's certificate is
    /// not trusted, [`ClientError::CaFile`] when the CA file cannot be used, the router's error
    /// when `map/connect` fails, [`ClientError::Timeout`] after the connect timeout.
    pub async fn connect_ws(url: &str, options: ClientOptions) -> Result<Self, ClientError> {
        let limit = options.connect_timeout;
        let endpoint = transport::WsEndpoint::new(url, options.ca_file.as_deref())?;
        let link = tokio::time::timeout(limit, endpoint.connect())
            .await
            .map_err(|_| ClientError::Timeout(limit))??;
        Self::start(link, Some(transport::ws_connector(endpoint)), options).await
    }

    /// Spawns `command` (for example `map-router stdio`) and speaks MAP as NDJSON over its
    /// stdin/stdout. The child's stderr is inherited unless the command says otherwise. When the
    /// client closes (or every handle is dropped) the child's stdin is closed; the child gets
    /// [`CHILD_EXIT_GRACE`](crate::client::CHILD_EXIT_GRACE) to exit, then it is killed, and it is always reaped. A stdio client
    /// does not reconnect: when the child exits, the client closes.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), map_router::client::ClientError> {
    /// use map_router::client::{Client, ClientOptions};
    /// let mut cmd = tokio::process::Command::new("map-router");
    /// cmd.arg("stdio");
    /// let client = Client::spawn_stdio(cmd, ClientOptions::agent()).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ClientError::Transport`] when the program cannot be started, else as
    /// [`Client::connect_ws`].
    pub async fn spawn_stdio(
        command: tokio::process::Command,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        let link = transport::spawn_stdio(command)?;
        Self::start(link, None, options).await
    }

    /// Connects to a router running in this process, with no socket (see
    /// `Server::connect_in_process`). The link ends only when the server shuts down; it is not
    /// re-established.
    ///
    /// # Errors
    /// As [`Client::connect_ws`] (the router's `map/connect` error, or a timeout).
    pub async fn in_process<S: InProcessLinks + ?Sized>(
        server: &S,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        Self::start(transport::in_process(server, None), None, options).await
    }

    /// As [`Client::in_process`], over a link admitted as `principal`
    /// ([`InProcessLinks::connect_as`]: a principal the caller has verified, or the router's
    /// own service principal). The session has that principal's grants, quotas and visibility.
    ///
    /// # Errors
    /// As [`Client::connect_ws`].
    pub async fn in_process_as<S: InProcessLinks + ?Sized>(
        server: &S,
        principal: crate::protocol::methods::session::Principal,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        Self::start(
            transport::in_process(server, Some(principal)),
            None,
            options,
        )
        .await
    }

    /// Runs the client over any transport that carries one JSON-RPC message per item: a stream
    /// of incoming text frames and a sink for outgoing ones. It does not reconnect.
    ///
    /// # Errors
    /// As [`Client::connect_ws`].
    pub async fn from_transport<St, Si>(
        stream: St,
        sink: Si,
        options: ClientOptions,
    ) -> Result<Self, ClientError>
    where
        St: futures::Stream<Item = String> + Send + 'static,
        Si: futures::Sink<String> + Send + 'static,
        Si::Error: std::fmt::Display,
    {
        Self::start(transport::custom(stream, sink), None, options).await
    }

    async fn start(
        link: Link,
        connector: Option<transport::Connector>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        let limit = options.connect_timeout;
        let request_timeout = options.request_timeout;
        let started = crate::client::driver::spawn(link, connector, options);
        let client = Client {
            inner: Arc::new(Inner {
                cmd_tx: started.cmd_tx,
                internal_tx: started.internal_tx,
                shared: started.shared,
                request_timeout,
            }),
        };
        // On failure the client is dropped here, which ends the driver (and reaps a child).
        match tokio::time::timeout(limit, started.initial).await {
            Ok(Ok(Ok(_))) => Ok(client),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(ClientError::Closed),
            Err(_) => Err(ClientError::Timeout(limit)),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Session state
    // -----------------------------------------------------------------------------------------

    /// The latest `map/connect` result (refreshed by every reconnect).
    pub fn session(&self) -> Option<ConnectResult> {
        self.inner.shared.session.lock().ok()?.clone()
    }

    /// This participant's id.
    pub fn participant_id(&self) -> Option<ParticipantId> {
        self.session().map(|s| s.participant_id)
    }

    /// Where the connection stands now.
    pub fn state(&self) -> ConnectionState {
        *self.inner.shared.state.borrow()
    }

    /// A receiver that sees every change of [`Client::state`].
    pub fn state_changes(&self) -> watch::Receiver<ConnectionState> {
        self.inner.shared.state.subscribe()
    }

    /// Why the connection was last lost, or why the latest reconnect attempt failed (the
    /// error a [`ConnectionState::Reconnecting`] or [`ConnectionState::Closed`] state is
    /// about). `None` until the connection is first lost; not cleared by a reconnect. Read it
    /// when [`Client::state_changes`] reports a change:
    ///
    /// ```no_run
    /// # async fn demo(client: map_router::client::Client) {
    /// use map_router::client::ConnectionState;
    /// let mut states = client.state_changes();
    /// while states.changed().await.is_ok() {
    ///     let state = *states.borrow_and_update();
    ///     if let ConnectionState::Reconnecting { attempt } = state {
    ///         eprintln!("reconnecting (attempt {attempt}): {:?}", client.last_connection_error());
    ///     }
    /// }
    /// # }
    /// ```
    pub fn last_connection_error(&self) -> Option<ClientError> {
        self.inner.shared.last_error.lock().ok()?.clone()
    }

    /// The process id of the child behind a [`Client::spawn_stdio`] client.
    pub fn child_id(&self) -> Option<u32> {
        self.inner.shared.child_id
    }

    /// Closes the connection without `map/disconnect`: for the router this is a lost transport
    /// (owned agents are orphaned and can be reclaimed within the resume window). Waits until
    /// the transport is closed and a stdio child has exited.
    ///
    /// # Errors
    /// None in practice; closing an already closed client succeeds.
    pub async fn close(&self) -> Result<(), ClientError> {
        let (reply, rx) = oneshot::channel();
        match self
            .command_within(
                Command::Close {
                    disconnect: None,
                    reply,
                },
                rx,
                None,
            )
            .await
        {
            Ok(_) | Err(ClientError::Closed) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Ends the session with `map/disconnect` (owned agents are unregistered, unless the
    /// session's disconnect policy says otherwise), then closes the connection. The result
    /// carries a resume token valid for the router's resume window.
    ///
    /// # Errors
    /// The router's error, or [`ClientError::Transport`] when not connected (the client closes
    /// anyway).
    pub async fn disconnect(&self) -> Result<DisconnectResult, ClientError> {
        let (reply, rx) = oneshot::channel();
        let cmd = Command::Close {
            disconnect: Some(DisconnectParams::default()),
            reply,
        };
        match self.command(cmd, rx).await? {
            Some(result) => Ok(result),
            None => Err(ClientError::Closed),
        }
    }

    /// Opens a new transport now and resumes the session on it (the router closes the old one
    /// if it is still open). Subscriptions continue without gap. Only WebSocket clients can
    /// reconnect. Tries at least once, and up to the reconnect policy's attempts.
    ///
    /// # Errors
    /// The last attempt's error; [`ClientError::Transport`] for transports that cannot
    /// reconnect.
    pub async fn reconnect(&self) -> Result<ConnectResult, ClientError> {
        let (reply, rx) = oneshot::channel();
        self.command_within(Command::Reconnect { reply }, rx, None)
            .await
    }

    // -----------------------------------------------------------------------------------------
    // Generic calls
    // -----------------------------------------------------------------------------------------

    /// Calls any MAP method with typed params and result.
    ///
    /// ```no_run
    /// # async fn demo(client: map_router::client::Client) -> Result<(), map_router::client::ClientError> {
    /// use map_router::protocol::methods::agents::{AgentsList, AgentsListParams};
    /// let page = client
    ///     .call::<AgentsList>(AgentsListParams { limit: Some(10), ..Default::default() })
    ///     .await?;
    /// println!("{} agents, more: {}", page.agents.len(), page.next_cursor.is_some());
    /// # Ok(()) }
    /// ```
    ///
    /// `map/subscribe` and `map/agents/register` made this way get no stream or inbox: use
    /// [`Client::subscribe`] and [`Client::register`] for those.
    ///
    /// # Errors
    /// [`ClientError::Rpc`] with the router's error, [`ClientError::Timeout`],
    /// [`ClientError::Transport`] when the connection was lost meanwhile,
    /// [`ClientError::Closed`], or [`ClientError::Decode`] when the result has another shape.
    pub async fn call<M: Method>(&self, params: M::Params) -> Result<M::Result, ClientError>
    where
        M::Params: Serialize,
        M::Result: DeserializeOwned,
    {
        let params = serde_json::to_string(&params).map_err(|e| ClientError::decode(M::NAME, e))?;
        let raw = self.call_text(M::NAME, params).await?;
        serde_json::from_str(&raw).map_err(|e| ClientError::decode(M::NAME, e))
    }

    /// Calls a method by name with untyped params (for methods this crate has no type for).
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn call_raw(&self, method: &str, params: Value) -> Result<Value, ClientError> {
        let raw = self.call_text(method, params.to_string()).await?;
        serde_json::from_str(&raw).map_err(|e| ClientError::decode(method, e))
    }

    /// Sends a notification (no response).
    ///
    /// # Errors
    /// [`ClientError::Closed`] when the client is closed.
    pub async fn notify(&self, method: &str, params: Value) -> Result<(), ClientError> {
        self.inner
            .cmd_tx
            .send(Command::Notify {
                method: method.to_owned(),
                params: params.to_string(),
            })
            .await
            .map_err(|_| ClientError::Closed)
    }

    /// Calls a method by name with params as JSON text, and returns the result as the JSON text
    /// the router sent: nothing in between parses and re-serializes a participant's JSON, so
    /// payloads and metadata inside keep their bytes (key order, number spelling).
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn call_text(&self, method: &str, params: String) -> Result<String, ClientError> {
        let (reply, rx) = oneshot::channel();
        let cmd = Command::Call {
            method: method.to_owned(),
            params,
            reply,
        };
        self.command(cmd, rx).await
    }

    pub(crate) async fn command<T>(
        &self,
        cmd: Command,
        rx: oneshot::Receiver<Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        self.command_within(cmd, rx, Some(self.inner.request_timeout))
            .await
    }

    async fn command_within<T>(
        &self,
        cmd: Command,
        rx: oneshot::Receiver<Result<T, ClientError>>,
        limit: Option<Duration>,
    ) -> Result<T, ClientError> {
        let exchange = async {
            self.inner
                .cmd_tx
                .send(cmd)
                .await
                .map_err(|_| ClientError::Closed)?;
            rx.await.map_err(|_| ClientError::Closed)?
        };
        match limit {
            Some(limit) => tokio::time::timeout(limit, exchange)
                .await
                .map_err(|_| ClientError::Timeout(limit))?,
            None => exchange.await,
        }
    }

    // -----------------------------------------------------------------------------------------
    // Events
    // -----------------------------------------------------------------------------------------

    /// Reads retained events (`map/replay`), decoded.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn replay(&self, params: ReplayParams) -> Result<ReplayPage, ClientError> {
        let result = self.call::<Replay>(params).await?;
        let events = result
            .events
            .iter()
            .map(|raw| {
                serde_json::from_str::<ReplayedEvent>(raw.0.get())
                    .map_err(|e| ClientError::decode("replayed event", e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ReplayPage {
            events,
            has_more: result.has_more,
            total_count: result.total_count,
            gap: result.gap.unwrap_or(false),
        })
    }

    // -----------------------------------------------------------------------------------------
    // Messages
    // -----------------------------------------------------------------------------------------

    /// Sends `payload` to `to`: an agent id (`"a1"`), or any MAP address as JSON
    /// (`json!({"scope": "team"})`, `json!({"role": "worker"})`, `json!({"broadcast": true})`).
    ///
    /// # Errors
    /// As [`Client::call`]: 2001 unknown agent, 2000 unknown address, 1003 for group addresses
    /// without `messaging.canBroadcast`.
    pub async fn send(
        &self,
        to: impl Into<Value>,
        payload: Value,
    ) -> Result<SendResult, ClientError> {
        self.send_with(SendParams {
            to: RawJson::from(to.into()),
            payload: Some(payload.into()),
            meta: None,
        })
        .await
    }

    /// Sends a message with explicit `meta`.
    ///
    /// # Errors
    /// As [`Client::send`].
    pub async fn send_with(&self, params: SendParams) -> Result<SendResult, ClientError> {
        self.call::<messaging::Send>(params).await
    }

    /// Sends `payload` to `to` with `meta {expectsResponse: true, correlationId}` and waits up
    /// to `timeout` for the reply: a `map/message` with the same `meta.correlationId` and
    /// `meta.isResult: true` (what [`Client::reply`] and the SDK's `reply()` send). The reply
    /// goes to this call only, never to an inbox.
    ///
    /// # Errors
    /// [`ClientError::NoRecipient`] at once when the router says nobody received the request
    /// (delivered to no one, queued for no one); [`ClientError::Timeout`] when no reply arrives
    /// in time; else as [`Client::send`].
    pub async fn request(
        &self,
        to: impl Into<Value>,
        payload: Value,
        timeout: Duration,
    ) -> Result<Message, ClientError> {
        self.request_with(to, payload, serde_json::Map::new(), timeout)
            .await
    }

    /// As [`Client::request`], with more members in `meta` (`protocol`, an extension's own
    /// key, ...); `expectsResponse` and `correlationId` are set over them.
    ///
    /// # Errors
    /// As [`Client::request`].
    pub async fn request_with(
        &self,
        to: impl Into<Value>,
        payload: Value,
        mut meta: serde_json::Map<String, Value>,
        timeout: Duration,
    ) -> Result<Message, ClientError> {
        let correlation_id = format!("req-{}", uuid::Uuid::new_v4().simple());
        meta.insert("expectsResponse".into(), Value::Bool(true));
        meta.insert(
            "correlationId".into(),
            Value::String(correlation_id.clone()),
        );
        let (waiter, reply_rx) = oneshot::channel();
        let (reply, rx) = oneshot::channel();
        let cmd = Command::Request {
            params: SendParams {
                to: RawJson::from(to.into()),
                payload: Some(payload.into()),
                meta: Some(meta.into()),
            },
            correlation_id,
            waiter,
            reply,
        };
        let exchange = async {
            self.command(cmd, rx).await?;
            reply_rx.await.map_err(|_| ClientError::Closed)
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
    }

    /// Replies to `message`: sends `payload` to `{agent: message.from}` with
    /// `meta {correlationId: <the request's correlationId, else its id>, isResult: true}`.
    ///
    /// # Errors
    /// As [`Client::send`].
    pub async fn reply(
        &self,
        message: &Message,
        payload: Value,
    ) -> Result<SendResult, ClientError> {
        let mut meta = serde_json::Map::new();
        let correlation = message
            .correlation_id()
            .unwrap_or_else(|| message.id.to_string());
        meta.insert("correlationId".into(), Value::String(correlation));
        meta.insert("isResult".into(), Value::Bool(true));
        self.send_with(SendParams {
            to: RawJson::from(serde_json::json!({ "agent": message.from })),
            payload: Some(payload.into()),
            meta: Some(meta.into()),
        })
        .await
    }

    /// Puts `content` in front of a running agent (`map/inject`, see `docs/steering.md`).
    ///
    /// # Errors
    /// As [`Client::call`]: 2001 for an unknown agent.
    pub async fn inject(
        &self,
        agent_id: impl Into<AgentId>,
        content: Value,
        delivery: InjectDelivery,
    ) -> Result<InjectResult, ClientError> {
        self.call::<Inject>(InjectParams {
            agent_id: agent_id.into(),
            content: content.into(),
            delivery: Some(delivery),
        })
        .await
    }

    // -----------------------------------------------------------------------------------------
    // Agents
    // -----------------------------------------------------------------------------------------

    /// Every agent matching `filter` (the default filter matches all visible agents).
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn list_agents(&self, filter: AgentFilter) -> Result<Vec<Agent>, ClientError> {
        let mut agents = Vec::new();
        let mut cursor = None;
        for _ in 0..MAX_PAGES {
            let page = self
                .call::<AgentsList>(AgentsListParams {
                    filter: Some(filter.clone()),
                    limit: None,
                    cursor: cursor.take(),
                })
                .await?;
            agents.extend(page.agents);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        Ok(agents)
    }

    /// One agent.
    ///
    /// # Errors
    /// As [`Client::call`]: 2001 when it does not exist or is not visible.
    pub async fn get_agent(&self, id: impl Into<AgentId>) -> Result<Agent, ClientError> {
        let r = self
            .call::<AgentsGet>(AgentsGetParams {
                agent_id: id.into(),
                include: None,
            })
            .await?;
        Ok(r.agent)
    }

    /// Spawns a child agent (`map/agents/spawn`). Without `command`, the child belongs to this
    /// session and its messages arrive on this connection ([`Client::messages`], or an
    /// [`AgentHandle`](crate::client::AgentHandle) inbox when addressed to a group). With `command`, the router launches and
    /// supervises the program as the child.
    ///
    /// # Errors
    /// As [`Client::call`]: 1003 without `lifecycle.canSpawn`, 2001 for an unknown parent.
    pub async fn spawn(&self, params: SpawnParams) -> Result<SpawnResult, ClientError> {
        self.call::<AgentsSpawn>(params).await
    }

    /// Unregisters an agent; returns it as it was.
    ///
    /// # Errors
    /// As [`Client::call`]: 2001, 1003 without control of the agent.
    pub async fn unregister(&self, id: impl Into<AgentId>) -> Result<Agent, ClientError> {
        let r = self
            .call::<AgentsUnregister>(UnregisterParams {
                agent_id: id.into(),
                reason: None,
            })
            .await?;
        Ok(r.agent)
    }

    /// Updates an agent's state, metadata, environment or permission overrides.
    ///
    /// # Errors
    /// As [`Client::call`]: 3001 for a transition out of `stopped`.
    pub async fn update_agent(&self, params: UpdateParams) -> Result<Agent, ClientError> {
        Ok(self.call::<AgentsUpdate>(params).await?.agent)
    }

    /// Asks an agent to stop (it gets a `stop` control message and goes `stopping`), or, with
    /// `force`, stops and unregisters it at once.
    ///
    /// # Errors
    /// As [`Client::call`]: 3001 when already stopped.
    pub async fn stop_agent(
        &self,
        id: impl Into<AgentId>,
        reason: Option<&str>,
        force: bool,
    ) -> Result<StopResult, ClientError> {
        self.call::<AgentsStop>(StopParams {
            agent_id: id.into(),
            reason: reason.map(str::to_owned),
            force: Some(force),
        })
        .await
    }

    /// Suspends an agent (it gets a `suspend` control message).
    ///
    /// # Errors
    /// As [`Client::call`]: 3001 when it cannot be suspended from its state.
    pub async fn suspend_agent(
        &self,
        id: impl Into<AgentId>,
        reason: Option<&str>,
    ) -> Result<Agent, ClientError> {
        let r = self
            .call::<AgentsSuspend>(SuspendParams {
                agent_id: id.into(),
                reason: reason.map(str::to_owned),
            })
            .await?;
        Ok(r.agent)
    }

    /// Resumes a suspended agent (it gets a `resume` control message).
    ///
    /// # Errors
    /// As [`Client::call`]: 3001 when it is not suspended.
    pub async fn resume_agent(&self, id: impl Into<AgentId>) -> Result<Agent, ClientError> {
        let r = self
            .call::<AgentsResume>(ResumeParams {
                agent_id: id.into(),
            })
            .await?;
        Ok(r.agent)
    }

    /// The agent tree (`map/structure/graph`).
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn structure_graph(&self, params: GraphParams) -> Result<GraphResult, ClientError> {
        self.call::<StructureGraph>(params).await
    }

    /// Scope operations: `client.scopes().create(..)`, `.list()`, `.join(..)`, ...
    pub fn scopes(&self) -> Scopes<'_> {
        Scopes { client: self }
    }
}

/// A decoded `map/replay` page.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayPage {
    /// Matching events, oldest first.
    pub events: Vec<ReplayedEvent>,
    /// More matching events follow the last one (ask again with its id as `afterEventId`).
    pub has_more: bool,
    /// Retained events matching, across all pages (absent when the router would have had to
    /// scan too far to count them).
    pub total_count: Option<u64>,
    /// `afterEventId` pointed before the oldest retained event: some events are gone.
    pub gap: bool,
}

/// Scope methods, from [`Client::scopes`].
#[derive(Debug, Clone, Copy)]
pub struct Scopes<'a> {
    client: &'a Client,
}

impl Scopes<'_> {
    /// Creates a scope (needs `scopes.canCreateScopes`: agents have it, clients do not).
    ///
    /// # Errors
    /// As [`Client::call`]: `-32602` for a taken id, 2002 for an unknown parent.
    pub async fn create(&self, params: ScopesCreateParams) -> Result<Scope, ClientError> {
        Ok(self.client.call::<ScopesCreate>(params).await?.scope)
    }

    /// Every visible scope.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn list(&self) -> Result<Vec<Scope>, ClientError> {
        Ok(self
            .client
            .call::<ScopesList>(ScopesListParams::default())
            .await?
            .scopes)
    }

    /// The direct children of `parent`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn children(&self, parent: impl Into<ScopeId>) -> Result<Vec<Scope>, ClientError> {
        Ok(self
            .client
            .call::<ScopesList>(ScopesListParams {
                parent: Some(parent.into()),
            })
            .await?
            .scopes)
    }

    /// One scope.
    ///
    /// # Errors
    /// As [`Client::call`]: 2002 when unknown or invisible.
    pub async fn get(&self, id: impl Into<ScopeId>) -> Result<Scope, ClientError> {
        Ok(self
            .client
            .call::<ScopesGet>(ScopeRef {
                scope_id: id.into(),
                delete_descendants: None,
            })
            .await?
            .scope)
    }

    /// Adds an agent to a scope.
    ///
    /// # Errors
    /// As [`Client::call`]: 2002, 2001, 1003.
    pub async fn join(
        &self,
        scope: impl Into<ScopeId>,
        agent: impl Into<AgentId>,
    ) -> Result<JoinResult, ClientError> {
        self.client
            .call::<ScopesJoin>(MembershipParams {
                scope_id: scope.into(),
                agent_id: agent.into(),
            })
            .await
    }

    /// Removes an agent from a scope.
    ///
    /// # Errors
    /// As [`Client::call`]: 2002, 2001, 1003.
    pub async fn leave(
        &self,
        scope: impl Into<ScopeId>,
        agent: impl Into<AgentId>,
    ) -> Result<LeaveResult, ClientError> {
        self.client
            .call::<ScopesLeave>(MembershipParams {
                scope_id: scope.into(),
                agent_id: agent.into(),
            })
            .await
    }

    /// Every member's agent id, sorted.
    ///
    /// # Errors
    /// As [`Client::call`]: 2002.
    pub async fn members(&self, scope: impl Into<ScopeId>) -> Result<Vec<AgentId>, ClientError> {
        let scope = scope.into();
        let mut members = Vec::new();
        let mut cursor = None;
        for _ in 0..MAX_PAGES {
            let page = self
                .client
                .call::<ScopesMembers>(MembersParams {
                    scope_id: scope.clone(),
                    limit: None,
                    cursor: cursor.take(),
                })
                .await?;
            members.extend(page.members);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        Ok(members)
    }

    /// Deletes a scope (with its child scopes when `descendants` is true; a scope with children
    /// is refused otherwise).
    ///
    /// # Errors
    /// As [`Client::call`]: 2002, `-32602`, 1003 without `scopes.canManageScopes`.
    pub async fn delete(
        &self,
        id: impl Into<ScopeId>,
        descendants: bool,
    ) -> Result<ScopesDeleteResult, ClientError> {
        let params = ScopeRef {
            scope_id: id.into(),
            delete_descendants: descendants.then_some(true),
        };
        let params = serde_json::to_value(&params)
            .map_err(|e| ClientError::decode(ScopesDelete::NAME, e))?;
        let mut result = self.client.call_raw(ScopesDelete::NAME, params).await?;
        // The router leaves out an empty `deletedDescendants`, which the result type requires.
        if let Some(obj) = result.as_object_mut() {
            obj.entry("deletedDescendants")
                .or_insert_with(|| Value::Array(Vec::new()));
        }
        serde_json::from_value(result).map_err(|e| ClientError::decode(ScopesDelete::NAME, e))
    }
}
