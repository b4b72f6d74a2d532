//! The background task that owns a client's transport.
//!
//! One task per client owns the link and every piece of routing state, the way the router
//! owns its own: handles (`Client`, `Subscription`, `AgentHandle`) send it
//! [`Command`]s and get answers on oneshots. The task
//! - is the **single writer** of the link: frames are queued and written in order; writing is
//!   one branch of its `select!`, so a router that is slow to read never stops the reader;
//! - **reads** every frame and routes it: responses to their pending request by id, `map/event`
//!   to subscriptions, `map/message` to request waiters and agent inboxes;
//! - **reconnects** when the transport is lost (WebSocket only): new link, `map/connect` with the
//!   resume token, every live subscription re-subscribed with `replayFrom`, then the calls that
//!   arrived meanwhile.
//!
//! NB. It never awaits a consumer: subscription buffers pause and resume instead
//! (`subscription.rs`), inboxes drop what does not fit (`agent.rs`), waiters are oneshots.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::future::poll_fn;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{ready, StreamExt};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::client::command::{Command, Internal};
use crate::client::error::ClientError;
use crate::client::feed::{EventEnvelope, Offer, SubShared};
use crate::client::inbox::{delivery_trace, explicit_agents, Inbox};
use crate::client::options::ClientOptions;
use crate::client::options::ConnectionState;
use crate::client::transport::Connector;
use crate::client::transport::FrameSink;
use crate::client::transport::FrameStream;
use crate::client::transport::Link;
use crate::protocol::ids::{now_ms, AgentId, SubscriptionId};
use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::message::Message;
use crate::protocol::methods::agents::{
    AgentsRegister, AgentsUnregister, RegisterParams, RegisterResult,
};
use crate::protocol::methods::auth::{AuthError, AuthErrorCode, AuthRequiredResult};
use crate::protocol::methods::events::{Subscribe, SubscribeParams, SubscribeResult, Unsubscribe};
use crate::protocol::methods::messaging::{self, SendResult};
use crate::protocol::methods::notifications;
use crate::protocol::methods::session::{
    Connect, ConnectResult, Disconnect, DisconnectParams, DisconnectResult,
};
use crate::protocol::methods::Method;

/// Frames queued for the writer before the driver stops taking new commands (back-pressure to
/// callers while the router is slow to read).
const MAX_QUEUED_FRAMES: usize = 256;
/// How often abandoned waiters (callers that timed out) are swept.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

use crate::client::command::Reply;

/// What a request in flight is for.
enum Pending {
    Call {
        method: String,
        reply: Reply<String>,
    },
    Connect,
    Subscribe {
        key: u64,
        reply: Option<Reply<Arc<SubShared>>>,
    },
    Unsubscribe {
        reply: Option<Reply<()>>,
    },
    Register {
        params: Option<Box<RegisterParams>>,
        reply: Option<Reply<(RegisterResult, Arc<Inbox>)>>,
    },
    Request {
        correlation_id: String,
        reply: Reply<SendResult>,
    },
    Disconnect,
}

/// Where the driver stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// A link is open and `map/connect` is in flight; other calls wait.
    Handshaking,
    /// Calls go out at once.
    Connected,
    /// No link; the next attempt is due at `reconnect_at`.
    Waiting,
    /// `map/disconnect` is in flight; the client closes when it is answered.
    Closing,
    /// Done: the loop ends.
    Closed,
}

/// What the handles share with the driver.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The latest connect result.
    pub session: Mutex<Option<ConnectResult>>,
    pub state: watch::Sender<ConnectionState>,
    /// Why the connection was last lost, or why the latest reconnect attempt failed.
    pub last_error: Mutex<Option<ClientError>>,
    /// Messages no agent handle takes.
    pub unclaimed: Arc<Inbox>,
    /// The stdio child's process id.
    pub child_id: Option<u32>,
}

struct SubEntry {
    shared: Arc<SubShared>,
    params: SubscribeParams,
    /// Router subscription id, while subscribed.
    server_id: Option<SubscriptionId>,
    /// When the first subscribe was sent (Unix ms): the resume point of a subscription that
    /// has not received any event yet.
    since_ms: u64,
}

struct AgentEntry {
    id: AgentId,
    params: RegisterParams,
    inbox: Arc<Inbox>,
}

/// Outgoing frames and the sink they go to.
struct Writer {
    sink: FrameSink,
    queue: VecDeque<String>,
    unflushed: bool,
}

impl Writer {
    fn wants_write(&self) -> bool {
        !self.queue.is_empty() || self.unflushed
    }

    /// Writes every queued frame and flushes. Cancel-safe: a frame leaves the queue only in the
    /// same poll that hands it to the sink.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ClientError>> {
        while !self.queue.is_empty() {
            ready!(self.sink.as_mut().poll_ready(cx))?;
            if let Some(frame) = self.queue.pop_front() {
                self.sink.as_mut().start_send(frame)?;
                self.unflushed = true;
            }
        }
        if self.unflushed {
            ready!(self.sink.as_mut().poll_flush(cx))?;
            self.unflushed = false;
        }
        Poll::Ready(Ok(()))
    }
}

/// The loop's state.
pub(crate) struct Driver {
    client_options: ClientOptions,
    connector: Option<Connector>,
    shared: Arc<Shared>,
    cmd_rx: mpsc::Receiver<Command>,
    internal_rx: mpsc::UnboundedReceiver<Internal>,
    /// Keeps `internal_rx` open while every handle is gone.
    _internal_tx: mpsc::UnboundedSender<Internal>,
    stream: Option<FrameStream>,
    writer: Option<Writer>,
    child: Option<tokio::process::Child>,
    phase: Phase,
    next_id: u64,
    pending: HashMap<u64, Pending>,
    /// Commands that arrived while no session was established.
    deferred: VecDeque<Command>,
    next_sub: u64,
    subs: BTreeMap<u64, SubEntry>,
    routes: HashMap<SubscriptionId, u64>,
    agents: Vec<AgentEntry>,
    waiters: HashMap<String, oneshot::Sender<Message>>,
    resume_token: Option<String>,
    participant_id: Option<String>,
    attempt: u32,
    reconnect_at: Instant,
    /// When a `map/connect` in flight is given up.
    handshake_deadline: Instant,
    /// Whether the session was ever established (the first handshake failing closes).
    established: bool,
    initial: Option<Reply<ConnectResult>>,
    reconnect_waiters: Vec<Reply<ConnectResult>>,
    close_waiters: Vec<Reply<Option<DisconnectResult>>>,
    disconnect_result: Option<Result<DisconnectResult, ClientError>>,
    /// Why the client closed, for subscriptions that end.
    close_reason: Option<ClientError>,
}

/// Everything `Client::start` needs from the driver.
pub(crate) struct Started {
    pub cmd_tx: mpsc::Sender<Command>,
    pub internal_tx: mpsc::UnboundedSender<Internal>,
    pub shared: Arc<Shared>,
    pub initial: oneshot::Receiver<Result<ConnectResult, ClientError>>,
}

/// Spawns the driver over `link` and starts the handshake.
pub(crate) fn spawn(link: Link, connector: Option<Connector>, options: ClientOptions) -> Started {
    let (cmd_tx, cmd_rx) = mpsc::channel(64);
    let (internal_tx, internal_rx) = mpsc::unbounded_channel();
    let (state, _) = watch::channel(ConnectionState::Connecting);
    let shared = Arc::new(Shared {
        session: Mutex::new(None),
        state,
        last_error: Mutex::new(None),
        unclaimed: Inbox::new(options.message_buffer, "client"),
        child_id: link.child.as_ref().and_then(tokio::process::Child::id),
    });
    let (initial_tx, initial_rx) = oneshot::channel();
    let mut driver = Driver {
        client_options: options.clone(),
        resume_token: options.resume_token.clone(),
        connector,
        shared: shared.clone(),
        cmd_rx,
        internal_rx,
        _internal_tx: internal_tx.clone(),
        stream: None,
        writer: None,
        child: None,
        phase: Phase::Handshaking,
        next_id: 1,
        pending: HashMap::new(),
        deferred: VecDeque::new(),
        next_sub: 1,
        subs: BTreeMap::new(),
        routes: HashMap::new(),
        agents: Vec::new(),
        waiters: HashMap::new(),
        participant_id: None,
        attempt: 0,
        reconnect_at: Instant::now(),
        handshake_deadline: Instant::now(),
        established: false,
        initial: Some(initial_tx),
        reconnect_waiters: Vec::new(),
        close_waiters: Vec::new(),
        disconnect_result: None,
        close_reason: None,
    };
    driver.install(link);
    driver.send_connect();
    tokio::spawn(driver.run());
    Started {
        cmd_tx,
        internal_tx,
        shared,
        initial: initial_rx,
    }
}

async fn next_frame(stream: &mut Option<FrameStream>) -> Option<Result<String, ClientError>> {
    match stream {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

async fn write_frames(writer: &mut Option<Writer>) -> Result<(), ClientError> {
    match writer {
        Some(w) => poll_fn(|cx| w.poll_write(cx)).await,
        None => std::future::pending().await,
    }
}

/// The parts of a frame the driver looks at; params and result stay raw.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default, borrow)]
    id: Option<&'a RawValue>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default, borrow)]
    params: Option<&'a RawValue>,
    #[serde(default, borrow)]
    result: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<WireError>,
}

#[derive(Deserialize)]
struct WireError {
    code: i32,
    #[serde(default)]
    message: String,
    #[serde(default)]
    data: Option<serde_json::Value>,
}

impl From<WireError> for ClientError {
    fn from(e: WireError) -> Self {
        ClientError::Rpc {
            code: ErrorCode(e.code),
            message: e.message,
            data: e.data,
        }
    }
}

impl Driver {
    async fn run(mut self) {
        let mut sweep = tokio::time::interval(SWEEP_INTERVAL);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while self.phase != Phase::Closed {
            let accepting = self
                .writer
                .as_ref()
                .is_none_or(|w| w.queue.len() < MAX_QUEUED_FRAMES);
            let wants_write = self.writer.as_ref().is_some_and(Writer::wants_write);
            let waiting = self.phase == Phase::Waiting;
            let handshaking = self.phase == Phase::Handshaking;
            tokio::select! {
                biased;
                Some(msg) = self.internal_rx.recv() => self.on_internal(msg),
                res = write_frames(&mut self.writer), if wants_write => {
                    if let Err(e) = res {
                        self.on_lost(e.to_string());
                    }
                }
                frame = next_frame(&mut self.stream) => match frame {
                    Some(Ok(text)) => self.on_frame(&text),
                    Some(Err(e)) => self.on_lost(e.to_string()),
                    None => self.on_lost("closed by the router".into()),
                },
                cmd = self.cmd_rx.recv(), if accepting => match cmd {
                    Some(cmd) => self.on_command(cmd),
                    // Every handle is gone: nobody can use the connection any more.
                    None => self.phase = Phase::Closed,
                },
                () = tokio::time::sleep_until(self.reconnect_at), if waiting => {
                    self.attempt_reconnect().await;
                }
                () = tokio::time::sleep_until(self.handshake_deadline), if handshaking => {
                    let limit = self.client_options.connect_timeout;
                    self.on_lost(format!("no map/connect response within {limit:?}"));
                }
                _ = sweep.tick() => self.sweep(),
            }
        }
        self.finish().await;
    }

    // ---------------------------------------------------------------------------------------
    // Link and handshake
    // ---------------------------------------------------------------------------------------

    fn install(&mut self, link: Link) {
        let Link {
            stream,
            sink,
            child,
        } = link;
        self.stream = Some(stream);
        self.writer = Some(Writer {
            sink,
            queue: VecDeque::new(),
            unflushed: false,
        });
        if child.is_some() {
            self.child = child;
        }
    }

    fn send_connect(&mut self) {
        let mut params = self.client_options.connect_params();
        params.resume_token = self.resume_token.clone();
        if let Some(p) = &self.participant_id {
            params.participant_id = Some(p.as_str().into());
        }
        self.phase = Phase::Handshaking;
        self.handshake_deadline = Instant::now() + self.client_options.connect_timeout;
        self.send_request(Connect::NAME, &params, Pending::Connect);
    }

    fn set_state(&self, state: ConnectionState) {
        self.shared.state.send_replace(state);
    }

    /// Records why the connection was lost or an attempt failed, before the state says so.
    fn set_last_error(&self, error: ClientError) {
        if let Ok(mut last) = self.shared.last_error.lock() {
            *last = Some(error);
        }
    }

    /// Records a connect (or disconnect) result's token.
    fn remember_token(&mut self, raw: &str) {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Token {
            resume_token: Option<String>,
        }
        if let Ok(Token {
            resume_token: Some(t),
        }) = serde_json::from_str::<Token>(raw)
        {
            self.resume_token = Some(t);
        }
    }

    fn on_connected(&mut self, result: Result<String, ClientError>) {
        let result = result.and_then(|raw| {
            if let Ok(refused) = serde_json::from_str::<AuthRequiredResult>(&raw) {
                return Err(ClientError::Auth(refused.error.unwrap_or_else(|| {
                    AuthError::new(
                        AuthErrorCode::AuthRequired,
                        format!(
                            "the router requires authentication (it accepts {}); give credentials \
                             with ClientOptions::api_key, ::bearer_token or ::auth",
                            refused.auth_required.methods.join(", ")
                        ),
                    )
                })));
            }
            serde_json::from_str::<ConnectResult>(&raw)
                .map_err(|e| ClientError::decode("map/connect result", e))
        });
        let result = match result {
            Ok(r) => r,
            Err(e) if !self.established => {
                self.close_reason = Some(e.clone());
                if let Some(tx) = self.initial.take() {
                    let _ = tx.send(Err(e));
                }
                self.phase = Phase::Closed;
                return;
            }
            Err(e @ ClientError::Auth(_)) => {
                // The same credentials will not do better on the next attempt.
                tracing::warn!(error = %e, "the router refused the credentials; not reconnecting");
                self.set_last_error(e.clone());
                self.drop_link(&e.to_string());
                for tx in self.reconnect_waiters.drain(..) {
                    let _ = tx.send(Err(e.clone()));
                }
                self.close_reason = Some(e);
                self.phase = Phase::Closed;
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "resuming the session failed");
                self.drop_link(&e.to_string());
                self.schedule_retry(e);
                return;
            }
        };
        self.resume_token = Some(result.resume_token.clone());
        self.participant_id = Some(result.participant_id.to_string());
        if let Ok(mut s) = self.shared.session.lock() {
            *s = Some(result.clone());
        }
        self.phase = Phase::Connected;
        self.attempt = 0;
        self.set_state(ConnectionState::Connected);
        if self.established {
            tracing::info!(
                reconnected = result.reconnected,
                "connection re-established"
            );
            self.restore(result.reconnected);
            for tx in self.reconnect_waiters.drain(..) {
                let _ = tx.send(Ok(result.clone()));
            }
        } else {
            self.established = true;
            if let Some(tx) = self.initial.take() {
                let _ = tx.send(Ok(result));
            }
        }
        while self.phase == Phase::Connected {
            let Some(cmd) = self.deferred.pop_front() else {
                break;
            };
            self.on_command(cmd);
        }
    }

    /// After a reconnect: re-subscribe live subscriptions from where they stopped and, when the
    /// session was not resumed (its token had expired), register the agents again.
    fn restore(&mut self, resumed: bool) {
        let keys: Vec<u64> = self.subs.keys().copied().collect();
        for key in keys {
            self.resubscribe(key);
        }
        if !resumed {
            let again: Vec<RegisterParams> = self
                .agents
                .iter()
                .map(|a| {
                    let mut p = a.params.clone();
                    p.agent_id = Some(a.id.clone());
                    p
                })
                .collect();
            for params in again {
                self.send_request(
                    AgentsRegister::NAME,
                    &params,
                    Pending::Register {
                        params: None,
                        reply: None,
                    },
                );
            }
        }
    }

    /// (Re-)subscribes `key` after the last event it buffered, if its consumer wants events.
    fn resubscribe(&mut self, key: u64) {
        let Some(sub) = self.subs.get(&key) else {
            return;
        };
        if sub.server_id.is_some() || !sub.shared.wants_delivery() {
            return;
        }
        let mut params = sub.params.clone();
        params.start_after = None;
        params.replay_from = Some(match sub.shared.last_event_id() {
            Some(id) => serde_json::Value::String(id),
            None => serde_json::Value::from(sub.since_ms),
        });
        self.send_request(
            Subscribe::NAME,
            &params,
            Pending::Subscribe { key, reply: None },
        );
    }

    /// Drops the link after a transport failure and decides what comes next.
    fn on_lost(&mut self, reason: String) {
        if self.stream.is_none() && self.writer.is_none() {
            return;
        }
        tracing::debug!(%reason, "transport lost");
        self.set_last_error(ClientError::Transport(format!("connection lost: {reason}")));
        self.drop_link(&reason);
        if self.phase == Phase::Closing || self.phase == Phase::Closed {
            self.phase = Phase::Closed;
            return;
        }
        if !self.established {
            let e = ClientError::Transport(format!("connection lost during map/connect: {reason}"));
            self.close_reason = Some(e.clone());
            if let Some(tx) = self.initial.take() {
                let _ = tx.send(Err(e));
            }
            self.phase = Phase::Closed;
            return;
        }
        let can_retry = self.connector.is_some()
            && !crate::client::transport::is_takeover(&reason)
            && (self.client_options.reconnect.is_enabled() || !self.reconnect_waiters.is_empty());
        if !can_retry {
            self.close_reason = Some(ClientError::Transport(format!("connection lost: {reason}")));
            self.phase = Phase::Closed;
            return;
        }
        if self.phase == Phase::Handshaking {
            // Lost while resuming: that attempt failed.
            self.schedule_retry(ClientError::Transport(format!(
                "connection lost during map/connect: {reason}"
            )));
            return;
        }
        self.attempt = 0;
        // The first attempt goes out almost at once: most losses are a dropped socket, not a
        // router that is down.
        self.reconnect_at = Instant::now()
            + self
                .client_options
                .reconnect
                .delay(1)
                .min(Duration::from_millis(50));
        self.phase = Phase::Waiting;
        self.set_state(ConnectionState::Reconnecting { attempt: 0 });
    }

    /// Closes the link's halves and fails what was in flight on it.
    fn drop_link(&mut self, reason: &str) {
        self.stream = None;
        self.writer = None;
        let lost = || ClientError::Transport(format!("connection lost: {reason}"));
        for (_, p) in self.pending.drain() {
            match p {
                Pending::Call { reply, .. } => {
                    let _ = reply.send(Err(lost()));
                }
                Pending::Subscribe { key, reply } => {
                    if let Some(reply) = reply {
                        // A subscribe that never completed: the caller gets the error.
                        if let Some(sub) = self.subs.remove(&key) {
                            sub.shared.end(Some(lost()));
                        }
                        let _ = reply.send(Err(lost()));
                    }
                }
                Pending::Unsubscribe { reply } => {
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(()));
                    }
                }
                Pending::Register { reply, .. } => {
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(lost()));
                    }
                }
                Pending::Request {
                    correlation_id,
                    reply,
                } => {
                    self.waiters.remove(&correlation_id);
                    let _ = reply.send(Err(lost()));
                }
                Pending::Connect => {}
                Pending::Disconnect => {
                    self.disconnect_result = Some(Err(lost()));
                }
            }
        }
        self.routes.clear();
        for sub in self.subs.values_mut() {
            sub.server_id = None;
            sub.shared.set_server_id(None);
        }
    }

    async fn attempt_reconnect(&mut self) {
        let Some(connector) = self.connector.clone() else {
            self.phase = Phase::Closed;
            return;
        };
        self.attempt += 1;
        self.set_state(ConnectionState::Reconnecting {
            attempt: self.attempt,
        });
        tracing::debug!(attempt = self.attempt, "reconnecting");
        match tokio::time::timeout(self.client_options.connect_timeout, connector()).await {
            Ok(Ok(link)) => {
                self.install(link);
                self.send_connect();
            }
            Ok(Err(e)) => self.schedule_retry(e),
            Err(_) => {
                self.schedule_retry(ClientError::Timeout(self.client_options.connect_timeout))
            }
        }
    }

    fn schedule_retry(&mut self, error: ClientError) {
        self.set_last_error(error.clone());
        let policy = self.client_options.reconnect;
        let max = if self.reconnect_waiters.is_empty() {
            policy.max_attempts
        } else {
            policy.max_attempts.max(1)
        };
        if self.attempt >= max {
            tracing::warn!(attempts = self.attempt, error = %error, "giving up reconnecting");
            for tx in self.reconnect_waiters.drain(..) {
                let _ = tx.send(Err(error.clone()));
            }
            self.close_reason = Some(error);
            self.phase = Phase::Closed;
            return;
        }
        self.reconnect_at = Instant::now() + policy.delay(self.attempt + 1);
        self.phase = Phase::Waiting;
    }

    // ---------------------------------------------------------------------------------------
    // Writing
    // ---------------------------------------------------------------------------------------

    /// Queues a request frame and records what its response is for.
    fn send_request<P: serde::Serialize + ?Sized>(
        &mut self,
        method: &str,
        params: &P,
        pending: Pending,
    ) {
        match serde_json::to_string(params) {
            Ok(text) => self.send_request_text(method, &text, pending),
            Err(e) => fail_pending(pending, ClientError::decode("params", e)),
        }
    }

    fn send_request_text(&mut self, method: &str, params: &str, pending: Pending) {
        let Some(writer) = self.writer.as_mut() else {
            fail_pending(pending, ClientError::Transport("not connected".into()));
            return;
        };
        let id = self.next_id;
        self.next_id += 1;
        let mut frame = String::with_capacity(48 + method.len() + params.len());
        let _ = write!(
            frame,
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":{},\"params\":{params}}}",
            serde_json::Value::from(method)
        );
        writer.queue.push_back(frame);
        self.pending.insert(id, pending);
    }

    fn send_notification(&mut self, method: &str, params: &str) {
        if let Some(writer) = self.writer.as_mut() {
            let mut frame = String::new();
            let _ = write!(
                frame,
                "{{\"jsonrpc\":\"2.0\",\"method\":{},\"params\":{params}}}",
                serde_json::Value::from(method)
            );
            writer.queue.push_back(frame);
        }
    }

    // ---------------------------------------------------------------------------------------
    // Commands
    // ---------------------------------------------------------------------------------------

    fn on_command(&mut self, cmd: Command) {
        match (self.phase, cmd) {
            (_, Command::Close { disconnect, reply }) => self.on_close(disconnect, reply),
            (_, Command::Reconnect { reply }) => self.on_reconnect(reply),
            (Phase::Handshaking | Phase::Waiting, cmd) => self.deferred.push_back(cmd),
            (Phase::Closing | Phase::Closed, cmd) => fail_command(cmd, ClientError::Closed),
            (Phase::Connected, cmd) => self.execute(cmd),
        }
    }

    fn execute(&mut self, cmd: Command) {
        match cmd {
            Command::Call {
                method,
                params,
                reply,
            } => {
                if reply.is_closed() {
                    return; // The caller gave up while the call was deferred.
                }
                let m = method.clone();
                self.send_request_text(&m, &params, Pending::Call { method, reply });
            }
            Command::Notify { method, params } => self.send_notification(&method, &params),
            Command::Subscribe { params, reply } => {
                let key = self.next_sub;
                self.next_sub += 1;
                let shared = SubShared::new(key, self.client_options.subscription_buffer);
                self.subs.insert(
                    key,
                    SubEntry {
                        shared,
                        params: params.clone(),
                        server_id: None,
                        since_ms: now_ms(),
                    },
                );
                self.send_request(
                    Subscribe::NAME,
                    &params,
                    Pending::Subscribe {
                        key,
                        reply: Some(reply),
                    },
                );
            }
            Command::Unsubscribe { key, reply } => match self.remove_sub(key, None) {
                Some(server_id) => self.send_request(
                    Unsubscribe::NAME,
                    &serde_json::json!({ "subscriptionId": server_id }),
                    Pending::Unsubscribe { reply: Some(reply) },
                ),
                None => {
                    let _ = reply.send(Ok(()));
                }
            },
            Command::Register { params, reply } => {
                self.send_request(
                    AgentsRegister::NAME,
                    &params,
                    Pending::Register {
                        params: Some(Box::new(params.clone())),
                        reply: Some(reply),
                    },
                );
            }
            Command::Request {
                params,
                correlation_id,
                waiter,
                reply,
            } => {
                // NB. The waiter is in place before the request leaves: the reply can overtake
                // the `map/send` response.
                self.waiters.insert(correlation_id.clone(), waiter);
                self.send_request(
                    messaging::Send::NAME,
                    &params,
                    Pending::Request {
                        correlation_id,
                        reply,
                    },
                );
            }
            Command::Reconnect { .. } | Command::Close { .. } => {
                unreachable!("handled before execute")
            }
        }
    }

    fn on_close(
        &mut self,
        disconnect: Option<DisconnectParams>,
        reply: Reply<Option<DisconnectResult>>,
    ) {
        self.close_waiters.push(reply);
        match (disconnect, self.phase) {
            (Some(params), Phase::Connected) => {
                self.send_request(Disconnect::NAME, &params, Pending::Disconnect);
                self.phase = Phase::Closing;
            }
            (Some(_), Phase::Closing) => {}
            (Some(_), _) => {
                self.disconnect_result = Some(Err(ClientError::Transport(
                    "not connected: closed without map/disconnect".into(),
                )));
                self.phase = Phase::Closed;
            }
            (None, _) => self.phase = Phase::Closed,
        }
    }

    fn on_reconnect(&mut self, reply: Reply<ConnectResult>) {
        if self.connector.is_none() {
            let _ = reply.send(Err(ClientError::Transport(
                "this transport cannot reconnect (only WebSocket clients can)".into(),
            )));
            return;
        }
        match self.phase {
            Phase::Closing | Phase::Closed => {
                let _ = reply.send(Err(ClientError::Closed));
            }
            Phase::Waiting => {
                self.reconnect_waiters.push(reply);
                self.reconnect_at = Instant::now();
            }
            Phase::Handshaking => self.reconnect_waiters.push(reply),
            Phase::Connected => {
                self.reconnect_waiters.push(reply);
                self.drop_link("reconnect requested");
                self.attempt = 0;
                self.reconnect_at = Instant::now();
                self.phase = Phase::Waiting;
                self.set_state(ConnectionState::Reconnecting { attempt: 0 });
            }
        }
    }

    fn on_internal(&mut self, msg: Internal) {
        match msg {
            Internal::DropSubscription(key) => {
                if let Some(server_id) = self.remove_sub(key, None) {
                    self.send_request(
                        Unsubscribe::NAME,
                        &serde_json::json!({ "subscriptionId": server_id }),
                        Pending::Unsubscribe { reply: None },
                    );
                }
            }
            Internal::ResumeSubscription(key) => {
                if self.phase == Phase::Connected {
                    self.resubscribe(key);
                }
            }
            Internal::DropAgent(id) => {
                if let Some(i) = self.agents.iter().position(|a| a.id == id) {
                    let entry = self.agents.remove(i);
                    entry.inbox.end();
                }
            }
        }
    }

    /// Forgets a subscription; returns its router id when it had one.
    fn remove_sub(&mut self, key: u64, error: Option<ClientError>) -> Option<SubscriptionId> {
        let sub = self.subs.remove(&key)?;
        sub.shared.end(error);
        let id = sub.server_id?;
        self.routes.remove(&id);
        Some(id)
    }

    fn sweep(&mut self) {
        self.waiters.retain(|_, w| !w.is_closed());
    }

    // ---------------------------------------------------------------------------------------
    // Reading
    // ---------------------------------------------------------------------------------------

    fn on_frame(&mut self, text: &str) {
        let env: Envelope<'_> = match serde_json::from_str(text) {
            Ok(env) => env,
            Err(e) => {
                tracing::warn!(error = %e, "unreadable frame from the router; ignored");
                return;
            }
        };
        match (env.method.as_deref(), env.id) {
            (Some(method), None) => self.on_notification(method, env.params),
            (None, Some(id)) => {
                let Some(id) = id.get().parse::<u64>().ok() else {
                    if let Some(e) = env.error {
                        tracing::warn!(code = e.code, message = %e.message, "router error not tied to a request");
                    }
                    return;
                };
                let result = match env.error {
                    Some(e) => Err(ClientError::from(e)),
                    None => Ok(env.result.map_or("null", RawValue::get).to_owned()),
                };
                self.on_response(id, result);
            }
            (None, None) => {
                if let Some(e) = env.error {
                    tracing::warn!(code = e.code, message = %e.message, "router error not tied to a request");
                }
            }
            // Requests from the router: MAP routers send none.
            (Some(_), Some(_)) => tracing::debug!("ignoring a request from the router"),
        }
    }

    fn on_response(&mut self, id: u64, result: Result<String, ClientError>) {
        let Some(pending) = self.pending.remove(&id) else {
            return;
        };
        match pending {
            Pending::Call { method, reply } => {
                if let Ok(raw) = &result {
                    if method == Connect::NAME || method == Disconnect::NAME {
                        self.remember_token(raw);
                    } else if method == AgentsUnregister::NAME {
                        self.forget_unregistered(raw);
                    }
                }
                let _ = reply.send(result);
            }
            Pending::Connect => self.on_connected(result),
            Pending::Subscribe { key, reply } => self.on_subscribed(key, result, reply),
            Pending::Unsubscribe { reply } => {
                if let Some(reply) = reply {
                    let _ = reply.send(result.map(|_| ()));
                }
            }
            Pending::Register { params, reply } => self.on_registered(result, params, reply),
            Pending::Request {
                correlation_id,
                reply,
            } => {
                let result = result
                    .and_then(|raw| {
                        serde_json::from_str::<SendResult>(&raw)
                            .map_err(|e| ClientError::decode("map/send result", e))
                    })
                    .and_then(|sent| {
                        // NB. Nobody to answer: fail now rather than at the timeout.
                        if sent.delivered.is_empty() && sent.queued.is_empty() {
                            Err(ClientError::NoRecipient {
                                message_id: sent.message_id.to_string(),
                            })
                        } else {
                            Ok(sent)
                        }
                    });
                if result.is_err() {
                    self.waiters.remove(&correlation_id);
                }
                let _ = reply.send(result);
            }
            Pending::Disconnect => {
                if let Ok(raw) = &result {
                    self.remember_token(raw);
                }
                self.disconnect_result = Some(result.and_then(|raw| {
                    serde_json::from_str::<DisconnectResult>(&raw)
                        .map_err(|e| ClientError::decode("map/disconnect result", e))
                }));
                self.phase = Phase::Closed;
            }
        }
    }

    fn on_subscribed(
        &mut self,
        key: u64,
        result: Result<String, ClientError>,
        reply: Option<Reply<Arc<SubShared>>>,
    ) {
        let result = result.and_then(|raw| {
            serde_json::from_str::<SubscribeResult>(&raw)
                .map_err(|e| ClientError::decode("map/subscribe result", e))
        });
        match result {
            Ok(r) => {
                let Some(sub) = self.subs.get_mut(&key) else {
                    // Dropped while subscribing: undo on the router.
                    self.send_request(
                        Unsubscribe::NAME,
                        &serde_json::json!({ "subscriptionId": r.subscription_id }),
                        Pending::Unsubscribe { reply: None },
                    );
                    return;
                };
                // NB. Registered before anyone sees the subscription: the router sends its
                // first event only after this response, so nothing is missed.
                self.routes.insert(r.subscription_id.clone(), key);
                sub.server_id = Some(r.subscription_id.clone());
                sub.shared.set_server_id(Some(r.subscription_id));
                sub.shared.unpause();
                if let Some(reply) = reply {
                    let _ = reply.send(Ok(sub.shared.clone()));
                }
            }
            Err(e) => match reply {
                Some(reply) => {
                    self.remove_sub(key, Some(e.clone()));
                    let _ = reply.send(Err(e));
                }
                None => {
                    tracing::warn!(error = %e, "re-subscribing failed; the subscription ends");
                    self.remove_sub(key, Some(e));
                }
            },
        }
    }

    fn on_registered(
        &mut self,
        result: Result<String, ClientError>,
        params: Option<Box<RegisterParams>>,
        reply: Option<Reply<(RegisterResult, Arc<Inbox>)>>,
    ) {
        let result = result.and_then(|raw| {
            serde_json::from_str::<RegisterResult>(&raw)
                .map_err(|e| ClientError::decode("map/agents/register result", e))
        });
        let Some(reply) = reply else {
            if let Err(e) = result {
                tracing::warn!(error = %e, "registering an agent again after reconnecting failed");
            }
            return;
        };
        match result {
            Ok(r) => {
                let inbox = Inbox::new(self.client_options.message_buffer, r.agent.id.as_str());
                // What the router kept for a reclaimed agent arrives before the register answer
                // (it is flushed while the call is handled), when the driver does not know the
                // agent yet: it went to the connection's inbox. It is the agent's: move it, in
                // order, so that nothing queued for it is lost to the reclaim.
                let id = r.agent.id.as_str();
                for (m, trace) in self.shared.unclaimed.take_matching(|m| {
                    explicit_agents(&m.to.to_value()).is_some_and(|ids| ids.contains(&id))
                }) {
                    inbox.push(m, trace);
                }
                let mut params = params.map(|p| *p).unwrap_or_default();
                params.agent_id = Some(r.agent.id.clone());
                self.agents.push(AgentEntry {
                    id: r.agent.id.clone(),
                    params,
                    inbox: inbox.clone(),
                });
                let _ = reply.send(Ok((r, inbox)));
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    fn forget_unregistered(&mut self, raw: &str) {
        #[derive(Deserialize)]
        struct Unregistered {
            agent: IdOnly,
        }
        #[derive(Deserialize)]
        struct IdOnly {
            id: AgentId,
        }
        if let Ok(u) = serde_json::from_str::<Unregistered>(raw) {
            self.on_internal(Internal::DropAgent(u.agent.id));
        }
    }

    fn on_notification(&mut self, method: &str, params: Option<&RawValue>) {
        let Some(params) = params else {
            return;
        };
        match method {
            notifications::EVENT => self.on_event(params),
            notifications::MESSAGE | "map/send" => self.on_message(params),
            other => tracing::debug!(method = other, "ignoring notification"),
        }
    }

    fn on_event(&mut self, params: &RawValue) {
        let env: EventEnvelope = match serde_json::from_str(params.get()) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "undecodable map/event; ignored");
                return;
            }
        };
        let Some(&key) = self.routes.get(&env.subscription_id) else {
            return; // Unsubscribed, paused or superseded: replay covers what matters.
        };
        let Some(sub) = self.subs.get_mut(&key) else {
            return;
        };
        if sub.shared.offer(env) != Offer::Paused {
            return;
        }
        // The consumer is behind: stop delivery on the router; the subscription resumes from
        // the last buffered event once the consumer has caught up.
        let paused = sub.server_id.take();
        sub.shared.set_server_id(None);
        if let Some(id) = paused {
            self.routes.remove(&id);
            tracing::debug!(subscription = %id, "subscription buffer full: paused");
            self.send_request(
                Unsubscribe::NAME,
                &serde_json::json!({ "subscriptionId": id }),
                Pending::Unsubscribe { reply: None },
            );
        }
    }

    fn on_message(&mut self, params: &RawValue) {
        #[derive(Deserialize)]
        struct Wrapped {
            message: Message,
        }
        let trace = delivery_trace(params);
        let message = match serde_json::from_str::<Wrapped>(params.get()) {
            Ok(w) => w.message,
            // The legacy shape puts the message itself in params.
            Err(_) => match serde_json::from_str::<Message>(params.get()) {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "undecodable map/message; ignored");
                    return;
                }
            },
        };
        if crate::client::message::MessageExt::is_reply(&message) {
            if let Some(waiter) = message
                .correlation_id()
                .and_then(|c| self.waiters.remove(&c))
            {
                let _ = waiter.send(message);
                return;
            }
        }
        if self.agents.is_empty() {
            self.shared.unclaimed.push(message, trace);
            return;
        }
        match explicit_agents(&message.to.to_value()) {
            Some(ids) => {
                let targets: Vec<&AgentEntry> = self
                    .agents
                    .iter()
                    .filter(|a| ids.contains(&a.id.as_str()))
                    .collect();
                if targets.is_empty() {
                    self.shared.unclaimed.push(message, trace);
                } else {
                    for a in targets {
                        a.inbox.push(message.clone(), trace.clone());
                    }
                }
            }
            None => {
                for a in &self.agents {
                    a.inbox.push(message.clone(), trace.clone());
                }
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // The end
    // ---------------------------------------------------------------------------------------

    async fn finish(mut self) {
        self.set_state(ConnectionState::Closed);
        let reason = self.close_reason.clone();
        let closed = || reason.clone().unwrap_or(ClientError::Closed);
        if let Some(tx) = self.initial.take() {
            let _ = tx.send(Err(closed()));
        }
        for (_, p) in self.pending.drain() {
            fail_pending(p, closed());
        }
        for cmd in self.deferred.drain(..) {
            fail_command(cmd, closed());
        }
        for tx in self.reconnect_waiters.drain(..) {
            let _ = tx.send(Err(closed()));
        }
        self.waiters.clear();
        for (_, sub) in std::mem::take(&mut self.subs) {
            sub.shared.end(reason.clone());
        }
        for a in self.agents.drain(..) {
            a.inbox.end();
        }
        self.shared.unclaimed.end();
        // Let queued frames (a disconnect's last words) go out, briefly.
        if let Some(w) = self.writer.as_mut() {
            let _ =
                tokio::time::timeout(Duration::from_secs(1), poll_fn(|cx| w.poll_write(cx))).await;
        }
        let link = match (self.stream.take(), self.writer.take()) {
            (Some(stream), Some(w)) => Some(Link {
                stream,
                sink: w.sink,
                child: self.child.take(),
            }),
            _ => None,
        };
        match link {
            Some(link) => link.shutdown().await,
            None => {
                if let Some(child) = self.child.take() {
                    crate::client::transport::reap(child).await;
                }
            }
        }
        let result = self.disconnect_result.take();
        for tx in self.close_waiters.drain(..) {
            let r = match &result {
                Some(Ok(d)) => Ok(Some(d.clone())),
                Some(Err(e)) => Err(e.clone()),
                None => Ok(None),
            };
            let _ = tx.send(r);
        }
        // Commands still queued in the channel fail when it is dropped (their repliers drop).
    }
}

fn fail_pending(p: Pending, e: ClientError) {
    match p {
        Pending::Call { reply, .. } => {
            let _ = reply.send(Err(e));
        }
        Pending::Subscribe {
            reply: Some(reply), ..
        } => {
            let _ = reply.send(Err(e));
        }
        Pending::Unsubscribe { reply: Some(reply) } => {
            let _ = reply.send(Err(e));
        }
        Pending::Register {
            reply: Some(reply), ..
        } => {
            let _ = reply.send(Err(e));
        }
        Pending::Request { reply, .. } => {
            let _ = reply.send(Err(e));
        }
        _ => {}
    }
}

fn fail_command(cmd: Command, e: ClientError) {
    match cmd {
        Command::Call { reply, .. } => {
            let _ = reply.send(Err(e));
        }
        Command::Notify { .. } => {}
        Command::Subscribe { reply, .. } => {
            let _ = reply.send(Err(e));
        }
        Command::Unsubscribe { reply, .. } => {
            let _ = reply.send(Err(e));
        }
        Command::Register { reply, .. } => {
            let _ = reply.send(Err(e));
        }
        Command::Request { reply, .. } => {
            let _ = reply.send(Err(e));
        }
        Command::Reconnect { reply } => {
            let _ = reply.send(Err(e));
        }
        Command::Close { reply, .. } => {
            let _ = reply.send(Err(e));
        }
    }
}
