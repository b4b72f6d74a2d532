//! [`RpcSession`]: the per-connection JSON-RPC state every transport runs for each incoming
//! text frame. It classifies the frame (request, notification, batch, garbage), refuses
//! everything but `map/connect` and `map/authenticate` before a session exists (`1000`), calls
//! the method table ([`Dispatcher`]), holds the answer until the store has committed what the
//! call appended (in place, or in the connection's [`Pipeline`] for methods whose table entry
//! says [`Answer::Pipelined`]), and queues the response in the connection's outbox.
//!
//! Requests from one connection are handled one at a time, in arrival order, so state-changing
//! calls apply in the order they were sent; the router itself applies calls from all
//! connections in one total order.
//!
//! Ordering guarantee: a `map/subscribe` response is queued *before* the subscription is
//! activated, so no `map/event` can overtake it.
//!
//! Limits applied here, before anything is parsed into values or reaches the router
//! ([`SessionLimits`]): JSON nesting depth (checked on the raw text, `-32600`), batch size
//! (`-32600`), and the request rate (`4001` with `data.retryAfterMs`, see [`super::rate`]).

use std::sync::Arc;

use serde_json::value::RawValue;

use crate::protocol::jsonrpc::{self, ErrorObject, Frame, Id, Incoming};
use crate::protocol::methods;

use crate::router::core::Command;

use crate::router::core::Router;
use crate::router::dispatch::Answer;
use crate::router::dispatch::Dispatcher;
use crate::router::error::RouterError;
use crate::router::handle::RouterHandle;
use crate::router::ids::ConnId;
use crate::router::outbox::Outbound;
use crate::router::outbox::Outbox;
use crate::router::pipeline::Pipeline;
use crate::router::rate::retry_after_ms;
use crate::router::rate::ConnRate;
use crate::router::reply::AfterReply;
use crate::router::reply::Handled;
use crate::router::reply::Reply;

/// What [`RpcSession`] refuses before dispatch (besides the batch size).
#[derive(Debug)]
pub struct SessionLimits {
    /// Deepest JSON nesting accepted in one frame (see [`jsonrpc::check_depth`]).
    pub max_depth: usize,
    /// The connection's request-rate buckets.
    pub rate: ConnRate,
    /// Longest wait for a rate token before a paced notification (an ack) is applied anyway.
    pub pace_limit: std::time::Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            max_depth: jsonrpc::DEFAULT_MAX_DEPTH,
            rate: ConnRate::default(),
            pace_limit: std::time::Duration::from_secs(1),
        }
    }
}

/// Per-connection JSON-RPC state, shared by every transport.
#[derive(Debug)]
pub struct RpcSession {
    router: RouterHandle,
    dispatcher: Arc<Dispatcher>,
    conn: ConnId,
    outbox: Outbox,
    connected: bool,
    /// `map/connect` answered `authRequired` and nothing succeeded since.
    awaiting_auth: bool,
    max_batch: usize,
    /// Answers waiting for store commits (stream transports with a durable store).
    pipeline: Option<Pipeline>,
    /// What the request just handled needs committed before its answer (with its id).
    needs_commit: Option<(u64, Id)>,
    /// Handling a batch (whose answers are never pipelined).
    in_batch: bool,
    limits: SessionLimits,
    /// On a follower: the connection's relay session on the writer (`router::relay`).
    relay: LazyRelay,
    /// The request just handled was relayed without waiting: where its answer comes.
    relayed: Option<(tokio::sync::oneshot::Receiver<String>, Id)>,
}

/// A connection's relay state, allocated the first time it is needed (only followers and
/// delegated sessions use it): an idle connection's session does not carry its 280 bytes.
#[derive(Debug, Default)]
struct LazyRelay(Option<Box<crate::router::relay::RelayState>>);

impl LazyRelay {
    /// The state, allocated now if it was not yet.
    fn get(&mut self) -> &mut crate::router::relay::RelayState {
        self.0.get_or_insert_with(Box::default)
    }

    /// Whether the connection has a relay session now (allocating nothing).
    fn is_open(&self) -> bool {
        self.0.as_deref().is_some_and(|r| r.is_open())
    }

    /// The principal the connection was admitted as by its opener, if any.
    fn delegated_principal(&self) -> Option<&methods::session::Principal> {
        self.0.as_deref().and_then(|r| r.delegated_principal())
    }
}

/// The connection's writer (or the router) is gone; stop reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterGone;

fn error_frame(id: &Id, error: &ErrorObject) -> String {
    let mut out = String::new();
    jsonrpc::write_error(&mut out, id, error);
    out
}

impl RpcSession {
    /// State for a new connection.
    pub fn new(
        router: RouterHandle,
        dispatcher: Arc<Dispatcher>,
        conn: ConnId,
        outbox: Outbox,
        max_batch: usize,
    ) -> Self {
        Self {
            router,
            dispatcher,
            conn,
            outbox,
            connected: false,
            awaiting_auth: false,
            max_batch: max_batch.max(1),
            limits: SessionLimits::default(),
            pipeline: None,
            needs_commit: None,
            in_batch: false,
            relay: LazyRelay::default(),
            relayed: None,
        }
    }

    /// Lets `map/send` answers wait for their commits in a queue (see [`Pipeline`]) instead of
    /// holding up the requests behind them. For stream transports that call
    /// [`RpcSession::commit_ready`] and [`RpcSession::flush_committed`]; without a durable
    /// store this does nothing.
    #[must_use]
    pub fn with_pipelining(mut self) -> Self {
        self.pipeline = self
            .router
            .commit_progress()
            .map(|(committed, timeout)| Pipeline::new(committed, timeout));
        self
    }

    /// Resolves when the oldest waiting answer may be sent; never while none waits.
    /// Cancel-safe.
    pub async fn commit_ready(&mut self) {
        match self.pipeline.as_mut() {
            Some(p) => p.head_ready().await,
            None => std::future::pending().await,
        }
    }

    /// Whether answers wait for their commits (so [`Self::commit_ready`] can resolve).
    pub fn has_pending(&self) -> bool {
        self.pipeline.as_ref().is_some_and(|p| !p.is_empty())
    }

    /// Sends the waiting answers that may go now, in order; with `all`, waits for every one
    /// (each bounded by the commit timeout).
    ///
    /// # Errors
    /// [`WriterGone`] when the connection's writer has stopped.
    pub async fn flush_committed(&mut self, all: bool) -> Result<(), WriterGone> {
        loop {
            let Some(p) = self.pipeline.as_mut() else {
                return Ok(());
            };
            match p.pop_ready() {
                Some(handled) => self.deliver(handled).await?,
                None if all && !p.is_empty() => p.head_ready().await,
                None => return Ok(()),
            }
        }
    }

    /// The same session with these limits (depth, rate).
    pub fn with_limits(mut self, limits: SessionLimits) -> Self {
        self.limits = limits;
        self
    }

    /// A connection admitted as `principal` by its opener (`ConnOrigin::Delegated`): on a
    /// follower, its relay session is opened as that principal (with authentication off too,
    /// where `map/connect` answers no principal).
    pub fn with_delegated(mut self, principal: Option<&methods::session::Principal>) -> Self {
        if let Some(p) = principal {
            self.relay.get().delegated(p.clone());
        }
        self
    }

    /// Keys the session's shared rate bucket on an authenticated principal from now on (called
    /// when `map/connect` returns a `principal`; authentication may call it too).
    pub fn set_principal(&mut self, id: &str) {
        self.limits.rate.set_principal(id);
    }

    /// The router's id for this connection.
    pub fn conn(&self) -> ConnId {
        self.conn
    }

    /// Whether `map/connect` has succeeded on this connection (and no disconnect since).
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// Handles one text frame (an object or a batch) and queues its response in the outbox
    /// before running follow-ups. This is what stream transports (WebSocket, stdio,
    /// in-process) use.
    ///
    /// # Errors
    /// [`WriterGone`] when the connection's writer has stopped.
    pub async fn handle_text(&mut self, text: &str) -> Result<(), WriterGone> {
        let handled = self.handle(text).await;
        let commit = self.needs_commit.take();
        let relayed = self.relayed.take();
        match self.pipeline.as_mut() {
            Some(p) if commit.is_some() || relayed.is_some() || !p.is_empty() => {
                match relayed {
                    Some((answer, id)) => p.push_relayed(
                        handled,
                        answer,
                        id,
                        crate::router::relay::RELAY_CALL_TIMEOUT,
                    ),
                    None => p.push(handled, commit),
                }
                if p.is_full() {
                    // Stop reading until the oldest answer can go.
                    p.head_ready().await;
                }
                self.flush_committed(false).await
            }
            _ => self.deliver(handled).await,
        }
    }

    /// Queues a handled frame's response, then runs its follow-ups.
    ///
    /// # Errors
    /// [`WriterGone`] when the connection's writer has stopped.
    pub async fn deliver(&mut self, handled: Handled) -> Result<(), WriterGone> {
        let Handled { response, after } = handled;
        if let Some(frame) = response {
            self.push(frame).await?;
        }
        self.complete(after).await
    }

    /// Handles one text frame without queueing anything: the caller writes `response` where it
    /// belongs (the outbox, an HTTP body) and then calls [`RpcSession::complete`].
    pub async fn handle(&mut self, text: &str) -> Handled {
        // NB: the depth is checked before parsing, so a deeply nested frame costs one linear
        // scan and no values.
        match jsonrpc::parse_frame(text, self.limits.max_depth, self.max_batch) {
            Err(e) => {
                self.count_error(&e);
                Self::error(&e)
            }
            Ok(Frame::Batch(items)) => self.handle_batch(items).await,
            Ok(Frame::One(raw)) => {
                if !raw.get().trim_start().starts_with('{') {
                    return Self::error(&ErrorObject::invalid_request(
                        "a JSON-RPC message must be an object or a batch",
                    ));
                }
                let mut after = Vec::new();
                let response = self.handle_one(raw, &mut after).await;
                Handled { response, after }
            }
        }
    }

    /// A frame-level error (oversize frame, binary frame, bad UTF-8) answered with `id: null`.
    pub fn error(error: &ErrorObject) -> Handled {
        Handled {
            response: Some(error_frame(&Id::null(), error)),
            after: Vec::new(),
        }
    }

    /// Queues a frame-level error.
    ///
    /// # Errors
    /// [`WriterGone`] when the connection's writer has stopped.
    pub async fn reject_frame(&mut self, error: &ErrorObject) -> Result<(), WriterGone> {
        self.count_error(error);
        self.deliver(Self::error(error)).await
    }

    /// Counts an error answered before any method was looked up.
    fn count_error(&self, error: &ErrorObject) {
        if let Some(m) = self.router.metrics() {
            m.count_error(crate::metrics::NO_METHOD, i64::from(error.code.0));
        }
    }

    async fn handle_batch(&mut self, items: Vec<&RawValue>) -> Handled {
        let mut responses = Vec::new();
        let mut after = Vec::new();
        self.in_batch = true;
        for item in items {
            if !item.get().trim_start().starts_with('{') {
                responses.push(error_frame(
                    &Id::null(),
                    &ErrorObject::invalid_request("batch entries must be objects"),
                ));
                continue;
            }
            if let Some(frame) = self.handle_one(item, &mut after).await {
                responses.push(frame);
            }
        }
        self.in_batch = false;
        let response = (!responses.is_empty()).then(|| {
            let mut frame =
                String::with_capacity(responses.iter().map(|r| r.len() + 1).sum::<usize>() + 2);
            frame.push('[');
            frame.push_str(&responses.join(","));
            frame.push(']');
            frame
        });
        Handled { response, after }
    }

    /// Handles one message object; returns its response frame, if it gets one.
    async fn handle_one(&mut self, raw: &RawValue, afters: &mut Vec<AfterReply>) -> Option<String> {
        match jsonrpc::classify(raw) {
            Incoming::Request { id, method, params } => {
                let mut out = String::new();
                if let Err(wait) = self.limits.rate.check() {
                    let e = ErrorObject::rate_limited(retry_after_ms(wait));
                    self.count_error(&e);
                    jsonrpc::write_error(&mut out, &id, &e);
                    return Some(out);
                }
                let started = std::time::Instant::now();
                let result = self.call(&id, method, params).await;
                if let Some(m) = self.router.metrics() {
                    let label = self
                        .dispatcher
                        .name_of(method)
                        .unwrap_or(crate::metrics::UNKNOWN_METHOD);
                    let code = result.as_ref().err().map(|e| i64::from(e.code.0));
                    m.observe_request(label, started.elapsed(), code);
                }
                match result {
                    Ok(reply) => {
                        jsonrpc::write_success(&mut out, &id, &reply.result);
                        match &reply.after {
                            AfterReply::Connected => {
                                self.connected = true;
                                self.awaiting_auth = false;
                                // NB: the router's service principal (the gateways' own
                                // sessions, doing work their callers ask for) shares no
                                // principal bucket: callers' traffic would empty it for
                                // everyone. Its connections keep their own buckets.
                                if let Some(principal) = principal_of(&reply.result)
                                    .filter(|p| !crate::auth::is_service(p))
                                {
                                    self.set_principal(&principal.id);
                                }
                            }
                            AfterReply::AuthRequired => {
                                self.connected = false;
                                self.awaiting_auth = true;
                            }
                            AfterReply::Disconnected => self.connected = false,
                            _ => {}
                        }
                        afters.push(reply.after);
                    }
                    Err(e) => jsonrpc::write_error(&mut out, &id, &e),
                }
                Some(out)
            }
            Incoming::Notification { method, params } => {
                self.notification(method, params).await;
                None
            }
            Incoming::Response => None,
            Incoming::Invalid { id, reason } => {
                let e = ErrorObject::invalid_request(reason);
                self.count_error(&e);
                Some(error_frame(&id, &e))
            }
        }
    }

    /// Runs one request: checks it may be made now, calls its table entry, and holds the answer
    /// as the entry says ([`Answer`]): until the store has committed what the call appended, or
    /// (pipelined) records that commit for the connection's pipeline and returns at once.
    async fn call(
        &mut self,
        id: &Id,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<Reply, ErrorObject> {
        // NB: a handle of its own, so that the entry outlives the calls below that borrow the
        // session mutably.
        let dispatcher = Arc::clone(&self.dispatcher);
        let entry = dispatcher
            .get(method)
            .ok_or_else(|| ErrorObject::method_not_found(method))?;
        if entry.needs_session && !self.connected {
            let refusal = if self.awaiting_auth {
                RouterError::AuthRequired
            } else {
                RouterError::NotConnected
            };
            return Err(refusal.to_error_object());
        }
        if self.router.is_follower() {
            // NB: boxed: the follower's path (the relay) is the larger future, and every
            // connection's session would otherwise carry its size.
            return Box::pin(self.call_on_follower(entry, id, method, params)).await;
        }
        self.call_here(entry, id, method, params).await
    }

    /// A call on a follower: served here, forwarded to the writer over the connection's relay
    /// session (`router::relay`), or refused when this follower has no relay.
    async fn call_on_follower(
        &mut self,
        entry: &crate::router::dispatch::Entry,
        id: &Id,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<Reply, ErrorObject> {
        use crate::router::relay::{params_object, Route};
        use methods::session::{Connect, Disconnect};
        use methods::Method;
        let relay = self.router.config().relay.clone();
        if let Some(relay) = &relay {
            if method == Connect::NAME {
                if let Some(principal) = self.proved(params) {
                    return Box::pin(self.connect_relayed(relay, entry, id, params, principal))
                        .await;
                }
            }
            if method == Disconnect::NAME && self.relay.is_open() {
                let theirs = self
                    .relay
                    .get()
                    .call(relay, self.conn, &self.outbox, method, params)
                    .await;
                let mine = self.call_here(entry, id, method, params).await;
                self.relay.get().disconnected();
                return match (theirs, mine) {
                    (Ok(result), Ok(reply)) => Ok(Reply { result, ..reply }),
                    (_, mine) => mine,
                };
            }
        }
        let served = crate::router::dispatch::served_by_follower(method);
        let mut route = self
            .relay
            .get()
            .route(method, params, relay.is_some(), served);
        if route == Route::Here
            && relay.is_some()
            && crate::router::relay::reads_saved_image(method)
            && self.relay.get().take_wrote()
            && !self
                .router
                .followed_to_the_end(crate::router::relay::READ_YOUR_WRITES_WAIT)
                .await
        {
            // Read your writes: this node could not follow what the session's relayed calls
            // wrote in time (NATS slow or away), so the writer answers (and the next read
            // here waits again: forwarding marks the session).
            route = Route::Writer;
        }
        match (route, relay) {
            (Route::Writer, Some(relay)) => {
                use methods::messaging::Send;
                if method == Send::NAME && self.pipeline.is_some() && !self.in_batch {
                    // Pipelined, as on the writer: the connection reads on while the writer
                    // answers; the answer takes this one's place, in order (`pipeline.rs`).
                    let answer = self
                        .relay
                        .get()
                        .send_pipelined(&relay, self.conn, &self.outbox, id, method, params)
                        .await?;
                    self.relayed = Some((answer, id.clone()));
                    return Ok(Reply {
                        result: "null".to_owned(),
                        after: AfterReply::Nothing,
                        commit: None,
                    });
                }
                let result = self
                    .relay
                    .get()
                    .call(&relay, self.conn, &self.outbox, method, params)
                    .await?;
                return Ok(Reply {
                    result,
                    after: AfterReply::Nothing,
                    commit: None,
                });
            }
            (Route::Here, _) => {}
            _ => return Err(RouterError::NotOnFollower(method.to_owned()).to_error_object()),
        }
        let object = (method == Connect::NAME).then(|| params_object(params));
        let reply = self.call_here(entry, id, method, params).await?;
        match reply.after {
            AfterReply::Connected => self.relay.get().opened_here(object, Some(&reply.result)),
            AfterReply::AuthRequired => self.relay.get().opened_here(object, None),
            AfterReply::Disconnected => self.relay.get().disconnected(),
            _ => self.relay.get().served(method, params, &reply.result),
        }
        Ok(reply)
    }

    /// The principal a `map/connect` proves at once on a follower: the principal the
    /// connection's opener admitted it as (a gateway's session on this node), whatever
    /// `[auth]` says; else `Some(None)` with authentication off, `Some(principal)` for a
    /// credential this node accepts, `None` when it proves nothing yet (the connect is
    /// answered here: `authRequired`, or the refusal).
    fn proved(&self, params: Option<&RawValue>) -> Option<Option<methods::session::Principal>> {
        if let Some(p) = self.relay.delegated_principal() {
            return Some(Some(p.clone()));
        }
        let Some(auth) = self.router.config().auth.as_ref() else {
            return Some(None);
        };
        let connect: methods::session::ConnectParams =
            serde_json::from_str(params.map_or("{}", RawValue::get)).ok()?;
        auth.verify(connect.auth.as_ref()?).ok().map(Some)
    }

    /// A `map/connect` on a follower with a relay: the writer's session (participant id,
    /// session id, resume token) is opened first, as `principal`; the session here takes its
    /// participant id; the client gets the writer's answer.
    async fn connect_relayed(
        &mut self,
        relay: &Arc<dyn crate::router::relay::Relay>,
        entry: &crate::router::dispatch::Entry,
        id: &Id,
        params: Option<&RawValue>,
        principal: Option<methods::session::Principal>,
    ) -> Result<Reply, ErrorObject> {
        use crate::router::relay::params_object;
        use methods::session::Connect;
        use methods::Method;
        let mut theirs = params_object(params);
        theirs.remove("auth");
        let agent = theirs.get("participantType") == Some(&serde_json::json!("agent"));
        let result = if self.relay.is_open() {
            // A second connect on a live connection: the writer's session answers it.
            let theirs = crate::router::relay::to_raw(theirs)?;
            self.relay
                .get()
                .call(relay, self.conn, &self.outbox, Connect::NAME, Some(&theirs))
                .await?
        } else {
            self.relay
                .get()
                .open_connect(
                    relay,
                    self.conn,
                    &self.outbox,
                    principal.clone(),
                    theirs,
                    agent,
                )
                .await?
        };
        let writer: serde_json::Value = serde_json::from_str(&result).unwrap_or_default();
        let Some(participant) = writer
            .get("participantId")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
        else {
            self.relay.get().disconnected();
            return Err(ErrorObject::internal(
                "the writer's map/connect answer has no participantId",
            ));
        };
        {
            let participant = participant.clone();
            self.router
                .with(move |r| r.relayed_claim(&participant, principal.as_ref()))
                .await
                .map_err(ErrorObject::from)?;
        }
        let mut mine = params_object(params);
        for key in ["sessionId", "resumeToken", "reclaimAgents"] {
            mine.remove(key);
        }
        mine.insert("participantId".into(), participant.into());
        let mine = crate::router::relay::to_raw(mine)?;
        match self.call_here(entry, id, Connect::NAME, Some(&mine)).await {
            Ok(reply) => {
                // The principal as proved here, with its expiry (the writer's session is
                // admitted without it: this node checks it): what a client schedules its
                // refresh by.
                let local: serde_json::Value =
                    serde_json::from_str(&reply.result).unwrap_or_default();
                let result = match (writer, local.get("principal")) {
                    (serde_json::Value::Object(mut w), Some(p)) => {
                        w.insert("principal".into(), p.clone());
                        serde_json::Value::Object(w).to_string()
                    }
                    _ => result,
                };
                Ok(Reply { result, ..reply })
            }
            Err(e) => {
                self.relay.get().disconnected();
                Err(e)
            }
        }
    }

    async fn call_here(
        &mut self,
        entry: &crate::router::dispatch::Entry,
        id: &Id,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<Reply, ErrorObject> {
        let answer = entry.answer;
        // The request's span carries its trace id when it has a trace context (a message's
        // `meta.traceparent`, else `params._meta.traceparent`).
        let span = tracing::debug_span!("map.request", conn = %self.conn, method, trace_id = tracing::field::Empty);
        if let Some(trace) = crate::router::dispatch::trace_of_params(params) {
            span.record("trace_id", trace.trace_id());
        }
        let reply =
            tracing::Instrument::instrument(entry.call(&self.router, self.conn, params)?, span)
                .await?;
        let Some(until) = reply.commit else {
            return Ok(reply);
        };
        // Only a pipelined method on a pipelining connection, outside a batch, lets the next
        // request in before its commit: other calls may read the store or change what later
        // requests are allowed, so they keep waiting in line.
        if answer == Answer::Pipelined && self.pipeline.is_some() && !self.in_batch {
            self.needs_commit = Some((until, id.clone()));
        } else {
            self.router
                .wait_committed(until)
                .await
                .map_err(ErrorObject::from)?;
        }
        Ok(reply)
    }

    /// Client → server notifications: `map/subscribe.ack` records an acknowledgement,
    /// `trajectory/content.response` answers a content request; unknown notifications (and
    /// malformed ones) are ignored silently, as the spec requires: notifications are never
    /// answered.
    async fn notification(&mut self, method: &str, params: Option<&RawValue>) {
        if self.router.is_follower() && self.relay.get().forwards_notification(method, params) {
            self.relay.get().notify(method, params).await;
            return;
        }
        if method == methods::trajectory::notifications::CONTENT_RESPONSE {
            let text = params.map_or("{}", RawValue::get);
            match serde_json::from_str::<methods::trajectory::ContentResponse>(text) {
                Ok(response) => {
                    self.limits.rate.pace(self.limits.pace_limit).await;
                    let conn = self.conn;
                    let op: crate::router::core::Op = Box::new(move |r: &mut Router| {
                        r.handle_content_response(conn, response);
                    });
                    let _ = self.router.send(Command::Call(op)).await;
                }
                Err(e) => {
                    tracing::debug!(conn = %self.conn, error = %e, "ignoring a malformed trajectory/content.response");
                }
            }
            return;
        }
        if method != methods::notifications::SUBSCRIBE_ACK {
            tracing::debug!(conn = %self.conn, method, "ignoring unknown notification");
            return;
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Ack {
            subscription_id: crate::protocol::ids::SubscriptionId,
            up_to_sequence: u64,
        }
        let Ok(ack) = serde_json::from_str::<Ack>(params.map_or("{}", RawValue::get)) else {
            tracing::debug!(conn = %self.conn, "ignoring a malformed map/subscribe.ack");
            return;
        };
        // NB: paced, never dropped: a lost ack would stall a credit-window subscription.
        self.limits.rate.pace(self.limits.pace_limit).await;
        let conn = self.conn;
        let op: crate::router::core::Op = Box::new(move |r: &mut Router| {
            r.handle_ack(conn, &ack.subscription_id, ack.up_to_sequence);
        });
        let _ = self.router.send(Command::Call(op)).await;
    }

    /// Runs follow-ups; call once the response they follow is queued (or sent).
    ///
    /// # Errors
    /// [`WriterGone`] when the router has stopped.
    pub async fn complete(&mut self, after: Vec<AfterReply>) -> Result<(), WriterGone> {
        for after in after {
            match after {
                AfterReply::Activate(subscription) => {
                    self.router
                        .send(Command::Activate {
                            conn: self.conn,
                            subscription,
                        })
                        .await
                        .map_err(|_| WriterGone)?;
                }
                AfterReply::Frames(frames) => {
                    for frame in frames {
                        self.push(frame).await?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    async fn push(&mut self, frame: String) -> Result<(), WriterGone> {
        self.outbox
            .push(Outbound::Frame(frame))
            .await
            .map_err(|_| WriterGone)
    }
}

/// The principal in a `map/connect` result, if any.
fn principal_of(result: &str) -> Option<crate::protocol::methods::session::Principal> {
    #[derive(serde::Deserialize)]
    struct WithPrincipal {
        #[serde(default)]
        principal: Option<crate::protocol::methods::session::Principal>,
    }
    if !result.contains("\"principal\"") {
        return None;
    }
    serde_json::from_str::<WithPrincipal>(result)
        .ok()?
        .principal
}
