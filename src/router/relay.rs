//! Relayed calls: how a follower (`RouterConfig::follower`) has the calls it does not serve
//! itself run by the node that writes the log, under the caller's own principal.
//!
//! Owns the per-connection relay state of an [`RpcSession`](super::rpc::RpcSession) on a
//! follower ([`RelayState`]): the link to the connection's *relay session* on the writer, the
//! `map/connect` that opens it, the ids of the calls it forwards, and the task that hands
//! the writer's frames to the connection. The link itself (a NATS subject pair in cluster
//! mode) is the server's ([`Relay`]): the router knows no socket.
//!
//! - A `map/connect` is the writer's: this node checks the credential, opens the relay
//!   session admitted as the principal it proved (never one the caller names) and forwards
//!   the connect without its credential (sessions, resume tokens and participant ids are the
//!   writer's, so a client resumes on any node). Its session here takes the participant id
//!   the writer gave, and the client gets the writer's answer.
//! - No usable resume token crosses NATS: a connect's `resumeToken` goes as its digest
//!   (`resumeTokenDigest`), and for every call whose answer carries a new token (connect,
//!   disconnect, `map/session/load`) this node draws it and sends its digest only
//!   (`nextResumeTokenDigest`); the writer keeps the digest and answers an empty token, which
//!   this node fills in with the one it drew (or the connection's current one). The writer
//!   takes both parameters from a relay session only (`sessions::ops`); from a client they
//!   are refused, here and there.
//! - When traces are exported ([`Relay::spans`]), every call forwarded by [`RelayState::call`]
//!   or [`RelayState::send_pipelined`] gets a span of this node's, `relay {method}`, under the
//!   call's trace context (a message's `meta.traceparent`, else `params._meta.traceparent`) or
//!   as the root of a new trace, ended when the writer answers. The call goes with its context
//!   as the relay-only `relayTraceparent` parameter (spliced in front; the rest of the params
//!   are the client's bytes), which the writer takes from a relay session only and makes the
//!   call's trace context, winning over the message's own: what the call causes there is a
//!   child of this node's span. A client's own `relayTraceparent` is refused (-32602), here
//!   and there.
//!   (A connect this node cannot prove at once, `map/authenticate` after `authRequired`,
//!   opens its session here and the relay session at the first call it cannot serve.)
//! - Subscriptions and replay are served here (that is where a standby saves the writer's
//!   fan-out), and so are the reads of agents and scopes ([`reads_saved_image`]: from the
//!   writer's saved records as followed, `router::handover`; once a call of the session
//!   went to the writer, only after following the stream to its end, so the read shows what
//!   the call changed), unless the session speaks as an agent (the writer's answer to its
//!   connect or resume says `agent` or lists agents it owns or reclaimed, it registered an
//!   agent, or it loaded another session): what an agent viewer is shown depends on its own
//!   agent's record and rules, which the writer applies. `map/unsubscribe` and `map/subscribe.ack` go where the subscription is.
//! - Every other call, and every other notification from the client, goes to the writer;
//!   `map/disconnect` ends both sessions (the client gets the writer's answer).
//! - Calls are forwarded in order, each with an id of the relay's own; the writer's answer
//!   (its `result` byte for byte, or its error) is the call's answer. A `map/send` on a
//!   connection that pipelines (stream transports) does not wait: the connection reads on, and
//!   the answer, given the caller's id, takes the call's place in the connection's answer
//!   queue (`router::pipeline`), so answers still leave in request order, as on the writer.
//!   Every other call waits for its answer. Every other frame the writer sends the session
//!   (`map/message`, `map/event` of a subscription made there) goes to the connection's
//!   outbox as it is.
//! - The writer ending the relay session (it stopped, or dropped a relay it could not keep
//!   up with) closes the connection with 1011 and a reason: a client never waits for
//!   frames that will not come. A relay that lost a frame on the way
//!   ([`RelayLink::frames_lost`]) closes it with [`FRAMES_LOST_CLOSE`] (1012): the client
//!   resumes with its token and replays from its last event; it is never handed a spliced
//!   frame or a silent gap.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};

use crate::protocol::jsonrpc::{ErrorObject, Id};
use crate::protocol::methods::session::Principal;
use crate::router::ids::ConnId;
use crate::router::outbox::Outbound;
use crate::router::outbox::Outbox;
use crate::router::traces::{RelaySpan, RelaySpans};

/// Longest wait for the writer's answer to one forwarded call.
pub const RELAY_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Frames from the writer that may wait for the connection (its outbox is bounded too).
pub const RELAY_INBOX: usize = 1024;

/// Pipelined calls past which those the connection gave up on are swept from the table
/// (the connection itself has at most `router::pipeline::MAX_WAITING` waiting).
const PIPELINED_SWEEP: usize = 1024;

/// The WebSocket close code of a connection whose relay lost a frame on the way (RFC 6455
/// "service restart": reconnect; the client resumes and replays, losing nothing).
pub const FRAMES_LOST_CLOSE: u16 = 1012;

/// Both ends of one relay session, as the server's [`Relay`] opens it.
#[derive(Debug)]
pub struct RelayLink {
    /// JSON-RPC frames for the writer's relay session. Dropping it ends the session.
    pub tx: mpsc::Sender<String>,
    /// Every frame the writer's relay session sends; ends when the writer ends it.
    pub rx: mpsc::Receiver<String>,
    /// Set before `rx` ends when the relay ended because a frame was lost on the way (either
    /// direction): the connection is closed with [`FRAMES_LOST_CLOSE`].
    pub frames_lost: Arc<std::sync::atomic::AtomicBool>,
}

/// Opens relay sessions on the node that writes the log (the server's, over NATS).
pub trait Relay: Send + Sync + std::fmt::Debug {
    /// Opens a relay session for connection `conn`, admitted on the writer as `principal`
    /// (the principal this node authenticated; `None` with authentication off).
    ///
    /// # Errors
    /// A reason, when no link can be opened now.
    fn open(&self, conn: ConnId, principal: Option<Principal>) -> Result<RelayLink, String>;

    /// Where this node's spans of relayed calls go, when traces are exported.
    fn spans(&self) -> Option<RelaySpans> {
        None
    }
}

/// The reads a follower answers from the live node's saved agents and scopes, as it follows
/// them (`router::handover`), for a session that does not speak as an agent (an agent's view
/// depends on its own record's rules, which the writer applies): `map/agents/list` and `get`,
/// `map/scopes/list`, `get` and `members`. Answered with this node's permission checks on the
/// caller's principal, as the writer would; after a call of the session's went to the writer,
/// only once this node has followed the stream to its end (read your writes).
pub fn reads_saved_image(method: &str) -> bool {
    use crate::protocol::methods::agents::{AgentsGet, AgentsList};
    use crate::protocol::methods::scopes::{ScopesGet, ScopesList, ScopesMembers};
    use crate::protocol::methods::Method;
    [
        AgentsList::NAME,
        AgentsGet::NAME,
        ScopesList::NAME,
        ScopesGet::NAME,
        ScopesMembers::NAME,
    ]
    .contains(&method)
}

/// Longest wait of a read on a follower for the rows its session's relayed calls wrote
/// (`RouterHandle::followed_to_the_end`); past it the read goes to the writer.
pub const READ_YOUR_WRITES_WAIT: Duration = Duration::from_secs(2);

/// Where a follower's call goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Served by this node.
    Here,
    /// Forwarded to the writer.
    Writer,
    /// Refused: this follower has no relay (`RouterError::NotOnFollower`).
    Refused,
}

/// One connection's relay, on a follower router.
#[derive(Debug, Default)]
pub struct RelayState {
    /// The `map/connect` parameters of a session opened here without the writer (after
    /// `authRequired`) and the principal it got: what the relay session is opened with.
    pending: Option<(
        serde_json::Map<String, serde_json::Value>,
        Option<Principal>,
    )>,
    /// Subscriptions this node serves for the connection.
    local_subs: HashSet<String>,
    /// The session speaks as an agent: its subscriptions and replay are the writer's.
    agent: bool,
    /// A call went to the writer since a read was last answered here: the next read served
    /// here first follows the stream to its end (`RouterHandle::followed_to_the_end`), so
    /// that it shows what that call changed.
    wrote: bool,
    link: Option<Open>,
    next_id: u64,
    /// The principal the connection was admitted as by whoever opened it (an in-process link
    /// opened as a principal: a gateway's session on this node): its `map/connect` is relayed
    /// as that principal's, whether or not authentication is on (`RpcSession::proved`).
    delegated: Option<Principal>,
    /// The resume token this node drew for the connection's session and gave its client (the
    /// writer holds its digest only): what an answer that repeats it is filled in with.
    token: Option<String>,
}

#[derive(Debug)]
struct Open {
    tx: mpsc::Sender<String>,
    answers: mpsc::Receiver<String>,
    pump: tokio::task::JoinHandle<()>,
    /// Pipelined calls waiting for their answers ([`RelayState::send_pipelined`]).
    inflight: Arc<Inflight>,
    /// The contexts the connection's messages came with, when traces are exported.
    given: Option<Arc<Given>>,
}

/// Requests delivered to the connection recently, when traces are exported: each one's
/// correlation id (its `meta.correlationId`, and its message id), the `traceparent` the
/// writer gave with it (`params._meta`) and the one it carried (`meta.traceparent`), so that
/// a reply with no trace context of its own, or with exactly its request's, is relayed under
/// the span its request was given (as the writer nests such a reply under its request), not
/// in a trace of its own. Bounded: the oldest are forgotten first.
#[derive(Debug, Default)]
struct Given(std::sync::Mutex<GivenTable>);

/// [`Given`]'s table: the contexts given and carried by correlation id, and the ids oldest
/// first.
type GivenTable = (
    HashMap<String, (Arc<str>, Option<Arc<str>>)>,
    std::collections::VecDeque<String>,
);

/// Correlation ids [`Given`] remembers per connection.
const GIVEN_MAX: usize = 512;

impl Given {
    /// Remembers the context of a `map/message` frame from the writer (other frames: nothing).
    fn saw(&self, frame: &str) {
        #[derive(serde::Deserialize)]
        struct Frame<'a> {
            #[serde(borrow)]
            method: std::borrow::Cow<'a, str>,
            #[serde(borrow)]
            params: Params<'a>,
        }
        #[derive(serde::Deserialize)]
        struct Params<'a> {
            #[serde(borrow)]
            message: Msg<'a>,
            #[serde(rename = "_meta", borrow)]
            given: Trace<'a>,
        }
        #[derive(serde::Deserialize)]
        struct Msg<'a> {
            #[serde(borrow)]
            id: std::borrow::Cow<'a, str>,
            #[serde(borrow, default)]
            meta: Option<Meta<'a>>,
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Meta<'a> {
            #[serde(borrow, default)]
            correlation_id: Option<std::borrow::Cow<'a, str>>,
            #[serde(borrow, default)]
            traceparent: Option<std::borrow::Cow<'a, str>>,
        }
        #[derive(serde::Deserialize)]
        struct Trace<'a> {
            #[serde(borrow)]
            traceparent: std::borrow::Cow<'a, str>,
        }
        if !frame.contains("\"_meta\"") {
            return;
        }
        let Ok(f) = serde_json::from_str::<Frame<'_>>(frame) else {
            return;
        };
        if f.method != crate::protocol::methods::notifications::MESSAGE
            || !crate::protocol::trace::valid_traceparent(&f.params.given.traceparent)
        {
            return;
        }
        let traceparent: Arc<str> = Arc::from(&*f.params.given.traceparent);
        let (correlation, carried) = f
            .params
            .message
            .meta
            .map_or((None, None), |m| (m.correlation_id, m.traceparent));
        let carried: Option<Arc<str>> = carried.map(|c| Arc::from(&*c));
        let keys = std::iter::once(f.params.message.id.into_owned())
            .chain(correlation.map(std::borrow::Cow::into_owned));
        let mut guard = crate::sync::lock(&self.0);
        let (by_key, order) = &mut *guard;
        for key in keys {
            if by_key
                .insert(key.clone(), (Arc::clone(&traceparent), carried.clone()))
                .is_none()
            {
                order.push_back(key);
            }
            while order.len() > GIVEN_MAX {
                if let Some(old) = order.pop_front() {
                    by_key.remove(&old);
                }
            }
        }
    }

    /// The context the request a reply answers (`meta.isResult` with `meta.correlationId`)
    /// was given, for a reply whose own context (`own`) is none, or its request's.
    fn answered(
        &self,
        params: Option<&RawValue>,
        own: Option<&crate::protocol::trace::TraceContext>,
    ) -> Option<crate::protocol::trace::TraceContext> {
        #[derive(serde::Deserialize)]
        struct Params {
            #[serde(default)]
            meta: Option<Meta>,
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Meta {
            #[serde(default)]
            is_result: bool,
            #[serde(default)]
            correlation_id: Option<String>,
        }
        let raw = params?.get();
        if !raw.contains("correlationId") {
            return None;
        }
        let meta = serde_json::from_str::<Params>(raw).ok()?.meta?;
        let key = meta.correlation_id.filter(|_| meta.is_result)?;
        let (given, carried) = crate::sync::lock(&self.0).0.get(&key).cloned()?;
        if own.is_some_and(|own| Some(&own.traceparent) != carried.as_ref()) {
            return None;
        }
        crate::protocol::trace::TraceContext::new(&given, None)
    }
}

/// A pipelined call waiting for its answer: the caller's id, where its response frame goes,
/// and its span, if traces are exported.
type Waiting = (Id, oneshot::Sender<String>, Option<RelaySpan>);

/// Pipelined calls of one relay session: the relay's id of each, the caller's id, and where
/// its response frame goes. Shared by the session and the task that reads the writer's frames.
#[derive(Debug, Default)]
struct Inflight(std::sync::Mutex<HashMap<u64, Waiting>>);

impl Inflight {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waiting>> {
        // Inserts and removes only: a panic cannot leave the table inconsistent.
        crate::sync::lock(&self.0)
    }

    /// Hands an answer from the writer to its pipelined call, as the caller's response frame.
    /// Gives the frame back when it answers no pipelined call.
    fn answer(&self, frame: String) -> Option<String> {
        let Ok(answer) = serde_json::from_str::<Answer<'_>>(&frame) else {
            return Some(frame);
        };
        let Some(relay_id) = answer.id else {
            return Some(frame);
        };
        let Some((id, tx, span)) = self.table().remove(&relay_id) else {
            return Some(frame);
        };
        let mut out = String::new();
        let failed = match (answer.result, answer.error) {
            (Some(result), _) => {
                crate::protocol::jsonrpc::write_success(&mut out, &id, result.get());
                None
            }
            (None, Some(error)) => {
                crate::protocol::jsonrpc::write_error(&mut out, &id, &error);
                Some(error.message)
            }
            (None, None) => {
                let error = unreachable_writer("an answer without result or error");
                crate::protocol::jsonrpc::write_error(&mut out, &id, &error);
                Some(error.message)
            }
        };
        if let Some(span) = span {
            span.end(failed);
        }
        let _ = tx.send(out);
        None
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

/// The answer a forwarded call got.
#[derive(serde::Deserialize)]
struct Answer<'a> {
    #[serde(default)]
    id: Option<u64>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<ErrorObject>,
}

/// A `map/connect`'s parameters as an object (none: empty).
pub fn params_object(params: Option<&RawValue>) -> serde_json::Map<String, serde_json::Value> {
    params
        .and_then(|p| serde_json::from_str(p.get()).ok())
        .unwrap_or_default()
}

/// A JSON object as raw params.
///
/// # Errors
/// Never in practice (a serialized object is valid JSON).
pub fn to_raw(
    object: serde_json::Map<String, serde_json::Value>,
) -> Result<Box<RawValue>, ErrorObject> {
    RawValue::from_string(serde_json::Value::Object(object).to_string())
        .map_err(|e| ErrorObject::internal(e.to_string()))
}

impl RelayState {
    /// Whether the connection has a relay session now.
    pub fn is_open(&self) -> bool {
        self.link.is_some()
    }

    /// Where `method` goes for this connection (`params`: an unsubscribe's); `relay`: this
    /// follower has one; `served`: a follower serves the method itself
    /// (`dispatch::served_by_follower`).
    pub fn route(
        &self,
        method: &str,
        params: Option<&RawValue>,
        relay: bool,
        served: bool,
    ) -> Route {
        use crate::protocol::methods::auth::{AuthRefresh, Authenticate};
        use crate::protocol::methods::events::{Replay, Subscribe, Unsubscribe};
        use crate::protocol::methods::session::{Connect, Disconnect};
        use crate::protocol::methods::Method;
        if [
            Connect::NAME,
            Authenticate::NAME,
            AuthRefresh::NAME,
            Disconnect::NAME,
        ]
        .contains(&method)
        {
            return Route::Here;
        }
        if !relay {
            return if served { Route::Here } else { Route::Refused };
        }
        if method == Unsubscribe::NAME {
            let here = subscription_of(params).is_some_and(|id| self.local_subs.contains(&id));
            return if here || self.link.is_none() {
                Route::Here
            } else {
                Route::Writer
            };
        }
        if (method == Subscribe::NAME || method == Replay::NAME || reads_saved_image(method))
            && (self.link.is_none() || !self.agent)
        {
            return Route::Here;
        }
        Route::Writer
    }

    /// Whether a call went to the writer since the last read served here; clears it.
    pub fn take_wrote(&mut self) -> bool {
        std::mem::take(&mut self.wrote)
    }

    /// Whether a notification from the client goes to the writer: every one once the relay
    /// session is open, but the acknowledgement of a subscription served here.
    pub fn forwards_notification(&self, method: &str, params: Option<&RawValue>) -> bool {
        self.link.is_some()
            && !(method == crate::protocol::methods::notifications::SUBSCRIBE_ACK
                && subscription_of(params).is_some_and(|id| self.local_subs.contains(&id)))
    }

    /// Forwards a notification from the client to the relay session (nothing is answered).
    pub async fn notify(&mut self, method: &str, params: Option<&RawValue>) {
        if let Some(link) = self.link.as_ref() {
            let _ = link.tx.send(frame(None, method, params)).await;
        }
    }

    /// Opens the relay session for a `map/connect` made on this connection: admitted on the
    /// writer as `principal` (proved here), connected there with `params` (the credential
    /// already removed). Returns the writer's `map/connect` result.
    ///
    /// # Errors
    /// The writer's refusal, or an internal error when it cannot be reached.
    pub async fn open_connect(
        &mut self,
        relay: &Arc<dyn Relay>,
        conn: ConnId,
        outbox: &Outbox,
        principal: Option<Principal>,
        params: serde_json::Map<String, serde_json::Value>,
        agent: bool,
    ) -> Result<String, ErrorObject> {
        use crate::protocol::methods::session::Connect;
        use crate::protocol::methods::Method;
        self.link = None;
        self.agent = agent;
        let (params, next) = with_token_digests(Connect::NAME, params)?;
        let RelayLink {
            tx,
            mut rx,
            frames_lost,
        } = relay
            .open(conn, principal)
            .map_err(|e| unreachable_writer(&e))?;
        let (answers_tx, answers) = mpsc::channel(4);
        let outbox = outbox.clone();
        let inflight = Arc::new(Inflight::default());
        let pending = Arc::clone(&inflight);
        let given = relay.spans().map(|_| Arc::new(Given::default()));
        let saw = given.clone();
        let pump = tokio::spawn(async move {
            while let Some(frame) = rx.recv().await {
                if is_answer(&frame) {
                    let Some(frame) = pending.answer(frame) else {
                        continue;
                    };
                    // The session waits for at most one other answer at a time; a late one
                    // (its call timed out) is dropped there.
                    if answers_tx.send(frame).await.is_err() {
                        return;
                    }
                } else {
                    if let Some(saw) = &saw {
                        saw.saw(&frame);
                    }
                    if outbox.push(Outbound::Frame(frame)).await.is_err() {
                        return;
                    }
                }
            }
            let close = if frames_lost.load(std::sync::atomic::Ordering::Relaxed) {
                Outbound::Close {
                    code: FRAMES_LOST_CLOSE,
                    reason: "frames between this node and the node that writes the log were \
                             lost on the way (NATS); reconnect and resume"
                        .into(),
                }
            } else {
                Outbound::Close {
                    code: 1011,
                    reason: "the node that writes the log ended this connection's session".into(),
                }
            };
            let _ = outbox.push(close).await;
        });
        self.link = Some(Open {
            tx,
            answers,
            pump,
            inflight,
            given,
        });
        let params = to_raw(params)?;
        let result = self.forward(Connect::NAME, Some(&params)).await;
        let result = result.map(|answer| self.fill_token(Connect::NAME, answer, next));
        match &result {
            Ok(answer) => self.agent |= speaks_as_agent(Connect::NAME, answer),
            Err(_) => self.link = None,
        }
        result
    }

    /// Records a session opened here without the writer (`map/authenticate` after
    /// `authRequired`): its connect parameters (credential removed) and, once admitted
    /// (`result`), its participant id and principal. The relay session opens at the first
    /// call this node cannot serve.
    pub fn opened_here(
        &mut self,
        params: Option<serde_json::Map<String, serde_json::Value>>,
        result: Option<&str>,
    ) {
        if let Some(mut connect) = params {
            for key in ["auth", "sessionId", "resumeToken"] {
                connect.remove(key);
            }
            self.agent = connect.get("participantType") == Some(&serde_json::json!("agent"));
            self.pending = Some((connect, None));
        }
        let Some(result) = result else {
            return;
        };
        let result: serde_json::Value = serde_json::from_str(result).unwrap_or_default();
        if let Some((connect, principal)) = self.pending.as_mut() {
            if let Some(id) = result.get("participantId") {
                connect.insert("participantId".into(), id.clone());
            }
            *principal = result
                .get("principal")
                .and_then(|p| serde_json::from_value(p.clone()).ok());
        }
    }

    /// The connection was admitted as `principal` by its opener (`ConnOrigin::Delegated`).
    pub fn delegated(&mut self, principal: Principal) {
        self.delegated = Some(principal);
    }

    /// The principal the connection was admitted as by its opener, if any.
    pub fn delegated_principal(&self) -> Option<&Principal> {
        self.delegated.as_ref()
    }

    /// The session ended here: so does its relay session.
    pub fn disconnected(&mut self) {
        self.pending = None;
        self.token = None;
        self.link = None;
        self.local_subs.clear();
        self.agent = false;
    }

    /// Records the result of a `map/subscribe` or `map/unsubscribe` this node served.
    pub fn served(&mut self, method: &str, params: Option<&RawValue>, result: &str) {
        use crate::protocol::methods::events::{Subscribe, Unsubscribe};
        use crate::protocol::methods::Method;
        if method == Subscribe::NAME {
            let result = RawValue::from_string(result.to_owned()).ok();
            if let Some(id) = subscription_of(result.as_deref()) {
                self.local_subs.insert(id);
            }
        } else if method == Unsubscribe::NAME {
            if let Some(id) = subscription_of(params) {
                self.local_subs.remove(&id);
            }
        }
    }

    /// Runs `method` on the writer, opening the relay session first for a session opened
    /// here; waits (bounded) for its answer. Returns the `result` JSON text.
    ///
    /// # Errors
    /// The writer's error, or an internal error when the writer cannot be reached.
    pub async fn call(
        &mut self,
        relay: &Arc<dyn Relay>,
        conn: ConnId,
        outbox: &Outbox,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<String, ErrorObject> {
        refuse_relay_trace(params)?;
        self.ensure_open(relay, conn, outbox).await?;
        self.wrote = true;
        if method == <crate::protocol::methods::agents::AgentsRegister as crate::protocol::methods::Method>::NAME {
            self.agent = true;
        }
        let span = self.begin_span(relay, method, params);
        let result = if carries_token(method) {
            let (object, next) = with_token_digests(method, params_object(params))?;
            let params = to_raw(object)?;
            let with_span = traced(Some(&params), span.as_ref());
            let result = self
                .forward(method, Some(with_span.as_deref().unwrap_or(&params)))
                .await;
            result.map(|answer| self.fill_token(method, answer, next))
        } else {
            let with_span = traced(params, span.as_ref());
            self.forward(method, with_span.as_deref().or(params)).await
        };
        if let Some(span) = span {
            span.end(result.as_ref().err().map(|e| e.message.clone()));
        }
        if let Ok(answer) = &result {
            self.agent |= speaks_as_agent(method, answer);
        }
        if result.is_err() && self.link.as_ref().is_some_and(|l| l.tx.is_closed()) {
            self.link = None;
        }
        result
    }

    /// The writer's answer to `method` with the resume token its client holds in place of
    /// the empty one the writer answers (it has the digest only): `next`, the token this node
    /// drew for the call, once the writer took it (a `map/session/load` of the session the
    /// connection already has keeps the current one).
    fn fill_token(&mut self, method: &str, answer: String, next: String) -> String {
        use crate::protocol::methods::session::SessionLoad;
        use crate::protocol::methods::Method;
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Shape {
            #[serde(default)]
            resume_token: Option<String>,
            #[serde(default)]
            restored: Option<bool>,
        }
        let Ok(shape) = serde_json::from_str::<Shape>(&answer) else {
            return answer;
        };
        if method != SessionLoad::NAME || shape.restored != Some(false) {
            self.token = Some(next);
        }
        match (shape.resume_token.as_deref(), self.token.as_deref()) {
            (Some(""), Some(token)) => with_token(answer, token),
            _ => answer,
        }
    }

    /// Opens the relay session of a session opened here, if it is not open.
    async fn ensure_open(
        &mut self,
        relay: &Arc<dyn Relay>,
        conn: ConnId,
        outbox: &Outbox,
    ) -> Result<(), ErrorObject> {
        if self.link.is_some() {
            return Ok(());
        }
        let Some((params, principal)) = self.pending.clone() else {
            return Err(unreachable_writer("this connection has no relay session"));
        };
        let agent = self.agent;
        self.open_connect(relay, conn, outbox, principal, params, agent)
            .await
            .map(drop)
    }

    /// The span of a call of `method` relayed now, when traces are exported: under the call's
    /// trace context, or, for a reply with none (or its request's), the context its request
    /// was given.
    fn begin_span(
        &self,
        relay: &Arc<dyn Relay>,
        method: &str,
        params: Option<&RawValue>,
    ) -> Option<RelaySpan> {
        let spans = relay.spans()?;
        let own = crate::router::traces::call_context(params);
        let answered = self
            .link
            .as_ref()
            .and_then(|l| l.given.as_ref())
            .and_then(|g| g.answered(params, own.as_ref()));
        Some(spans.begin(method, answered.or(own).as_ref()))
    }

    /// Sends `method` (request `id`) to the writer without waiting for its answer: the
    /// returned receiver gets the response frame, with `id`, once the writer answers. The
    /// writer runs the calls of a relay session in order, so a pipelined call is still
    /// applied before every later one; the connection sends the answers in request order
    /// (`router::pipeline`). For `map/send`, whose answer changes nothing here.
    ///
    /// # Errors
    /// The writer cannot be reached.
    pub async fn send_pipelined(
        &mut self,
        relay: &Arc<dyn Relay>,
        conn: ConnId,
        outbox: &Outbox,
        id: &Id,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<oneshot::Receiver<String>, ErrorObject> {
        refuse_relay_trace(params)?;
        self.ensure_open(relay, conn, outbox).await?;
        let span = self.begin_span(relay, method, params);
        let Some(link) = self.link.as_mut() else {
            return Err(unreachable_writer("no relay session"));
        };
        self.next_id += 1;
        let relay_id = self.next_id;
        let (tx, rx) = oneshot::channel();
        let with_span = traced(params, span.as_ref());
        let params = with_span.as_deref().or(params);
        {
            let mut table = link.inflight.table();
            if table.len() >= PIPELINED_SWEEP {
                // Calls the connection gave up on (timed out) are dropped here (their spans
                // with them: they never ended).
                table.retain(|_, (_, tx, _)| !tx.is_closed());
            }
            table.insert(relay_id, (id.clone(), tx, span));
        }
        if link
            .tx
            .send(frame(Some(relay_id), method, params))
            .await
            .is_err()
        {
            link.inflight.table().remove(&relay_id);
            self.link = None;
            return Err(unreachable_writer("the relay session ended"));
        }
        Ok(rx)
    }

    async fn forward(
        &mut self,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<String, ErrorObject> {
        let Some(link) = self.link.as_mut() else {
            return Err(unreachable_writer("no relay session"));
        };
        self.next_id += 1;
        let id = self.next_id;
        if link.tx.send(frame(Some(id), method, params)).await.is_err() {
            return Err(unreachable_writer("the relay session ended"));
        }
        let deadline = tokio::time::Instant::now() + RELAY_CALL_TIMEOUT;
        loop {
            let text = match tokio::time::timeout_at(deadline, link.answers.recv()).await {
                Ok(Some(text)) => text,
                Ok(None) => return Err(unreachable_writer("the relay session ended")),
                Err(_) => {
                    return Err(unreachable_writer(&format!(
                        "no answer within {} s",
                        RELAY_CALL_TIMEOUT.as_secs()
                    )))
                }
            };
            let Ok(answer) = serde_json::from_str::<Answer<'_>>(&text) else {
                continue;
            };
            if answer.id != Some(id) {
                continue;
            }
            return match (answer.result, answer.error) {
                (Some(result), _) => Ok(result.get().to_owned()),
                (None, Some(error)) => Err(error),
                (None, None) => Err(unreachable_writer("an answer without result or error")),
            };
        }
    }
}

/// Whether the writer's answer to `method` leaves the session speaking as an agent (its
/// subscriptions and reads are then the writer's): a connect or resume that answers an
/// `agent` session or one with agents (owned, reclaimed), a `map/session/load` (the
/// connection is another session now, which this node's own session for it is not), and a
/// `map/session/close` of the connection's own session (`current`: it has no session there
/// now, and the writer refuses its calls until it connects again; this node's session would
/// have answered them).
fn speaks_as_agent(method: &str, answer: &str) -> bool {
    use crate::protocol::methods::session::{Connect, SessionClose, SessionLoad};
    use crate::protocol::methods::Method;
    if method == SessionLoad::NAME {
        return true;
    }
    if method == SessionClose::NAME {
        let answer: serde_json::Value = serde_json::from_str(answer).unwrap_or_default();
        return answer["current"] == serde_json::json!(true);
    }
    if method != Connect::NAME {
        return false;
    }
    let answer: serde_json::Value = serde_json::from_str(answer).unwrap_or_default();
    let listed = |k: &str| answer[k].as_array().is_some_and(|a| !a.is_empty());
    answer["participantType"] == serde_json::json!("agent")
        || listed("ownedAgents")
        || listed("reclaimedAgents")
}

/// The relay-only parameters by which a standby names resume tokens to the writer by their
/// digests (the writer accepts them from a relay session only).
const TOKEN_DIGEST: &str = "resumeTokenDigest";
const NEXT_TOKEN_DIGEST: &str = "nextResumeTokenDigest";

/// The relay-only parameter by which a standby names its span of a relayed call to the writer
/// (`router::traces::RelaySpans`; the writer accepts it from a relay session only).
const RELAY_TRACE: &str = "relayTraceparent";

/// Refuses a client's own [`RELAY_TRACE`] (it would hang its calls under any span).
///
/// # Errors
/// Invalid params when the client sent it.
fn refuse_relay_trace(params: Option<&RawValue>) -> Result<(), ErrorObject> {
    let Some(params) = params.filter(|p| p.get().contains(RELAY_TRACE)) else {
        return Ok(());
    };
    if params_object(Some(params)).contains_key(RELAY_TRACE) {
        return Err(ErrorObject::invalid_params(format!(
            "`{RELAY_TRACE}` is sent only by a cluster node's relay session, never by a client"
        )));
    }
    Ok(())
}

/// `params` with [`RELAY_TRACE`] naming `span`, spliced in front of the client's members (the
/// rest stays the client's bytes: a message's `meta` is untouched); `None` (the params go as
/// they are) without a span, or for params that are not an object (the writer refuses those).
fn traced(params: Option<&RawValue>, span: Option<&RelaySpan>) -> Option<Box<RawValue>> {
    let member = format!(
        r#""{RELAY_TRACE}":{}"#,
        serde_json::Value::from(span?.traceparent())
    );
    let text = match params.map(|p| p.get().trim_start()) {
        None => format!("{{{member}}}"),
        Some(p) if p.starts_with('{') => {
            let rest = &p[1..];
            let comma = if rest.trim_start().starts_with('}') {
                ""
            } else {
                ","
            };
            format!("{{{member}{comma}{rest}")
        }
        Some(_) => return None,
    };
    RawValue::from_string(text).ok()
}

/// Whether the writer's answer to `method` carries the session's resume token (it rotates it,
/// or repeats it): what the relay forwards with [`with_token_digests`].
fn carries_token(method: &str) -> bool {
    use crate::protocol::methods::session::{Connect, Disconnect, SessionLoad};
    use crate::protocol::methods::Method;
    [Connect::NAME, Disconnect::NAME, SessionLoad::NAME].contains(&method)
}

/// The parameters of a call whose answer carries a resume token, as the writer gets them, so
/// that no usable token crosses NATS: the client's `resumeToken` (a connect's) as its digest
/// (`resumeTokenDigest`), and the digest of a fresh token drawn here for the session's next
/// one (`nextResumeTokenDigest`), which is returned. The relay-only parameters from the
/// client itself are refused.
///
/// # Errors
/// Invalid params when the client sent a relay-only parameter.
fn with_token_digests(
    method: &str,
    mut params: serde_json::Map<String, serde_json::Value>,
) -> Result<(serde_json::Map<String, serde_json::Value>, String), ErrorObject> {
    use crate::router::sessions::table::token_key;
    for key in [TOKEN_DIGEST, NEXT_TOKEN_DIGEST] {
        if params.contains_key(key) {
            return Err(ErrorObject::invalid_params(format!(
                "`{key}` is sent only by a cluster node's relay session, never by a client"
            )));
        }
    }
    if method
        == <crate::protocol::methods::session::Connect as crate::protocol::methods::Method>::NAME
    {
        if let Some(serde_json::Value::String(token)) = params.remove("resumeToken") {
            params.insert(TOKEN_DIGEST.into(), token_key(&token).into());
        }
    }
    let next = crate::protocol::ids::random_token("resume_");
    params.insert(NEXT_TOKEN_DIGEST.into(), token_key(&next).into());
    Ok((params, next))
}

/// `answer` (a JSON object whose `resumeToken` is empty) with `token` in its place. The text
/// is changed there only (the rest stays the writer's bytes): the last `"resumeToken":""` is
/// the object's own, as every answer that carries one lists it after every nested object
/// (agents' metadata) and before only the principal, which has none.
fn with_token(answer: String, token: &str) -> String {
    const EMPTY: &str = r#""resumeToken":"""#;
    let Some(at) = answer.rfind(EMPTY) else {
        return answer;
    };
    let mut out = String::with_capacity(answer.len() + token.len() + 2);
    out.push_str(&answer[..at]);
    out.push_str(r#""resumeToken":"#);
    out.push_str(&serde_json::Value::from(token).to_string());
    out.push_str(&answer[at + EMPTY.len()..]);
    out
}

/// A JSON-RPC request (with `id`) or notification for the writer.
fn frame(id: Option<u64>, method: &str, params: Option<&RawValue>) -> String {
    let mut frame = String::from(r#"{"jsonrpc":"2.0","#);
    if let Some(id) = id {
        frame.push_str(&format!(r#""id":{id},"#));
    }
    frame.push_str(r#""method":"#);
    frame.push_str(&serde_json::Value::from(method).to_string());
    if let Some(p) = params {
        frame.push_str(r#","params":"#);
        frame.push_str(p.get());
    }
    frame.push('}');
    frame
}

/// Whether a frame from the writer is an answer (has an `id` and no `method`).
fn is_answer(frame: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Shape<'a> {
        #[serde(borrow, default)]
        method: Option<&'a RawValue>,
        #[serde(borrow, default)]
        id: Option<&'a RawValue>,
    }
    // NB: a batch answer never comes: calls are forwarded one by one.
    serde_json::from_str::<Shape<'_>>(frame).is_ok_and(|s| s.method.is_none() && s.id.is_some())
}

fn subscription_of(params: Option<&RawValue>) -> Option<String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Sub {
        subscription_id: String,
    }
    serde_json::from_str::<Sub>(params?.get())
        .ok()
        .map(|s| s.subscription_id)
}

/// The error of a relayed call the writer did not answer (`retryable`).
pub(crate) fn unreachable_writer(why: &str) -> ErrorObject {
    ErrorObject::internal(format!(
        "this node forwards the call to the node that writes the log, which cannot be reached: {why}"
    ))
    .retryable()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn without_a_relay_only_the_followers_own_methods_are_served() {
        let state = RelayState::default();
        assert_eq!(state.route("map/subscribe", None, false, true), Route::Here);
        assert_eq!(state.route("map/send", None, false, false), Route::Refused);
        assert_eq!(state.route("map/connect", None, false, true), Route::Here);
    }

    #[test]
    fn a_pipelined_calls_answer_carries_the_callers_id_and_the_writers_bytes() {
        let inflight = Inflight::default();
        let (tx, mut rx) = oneshot::channel();
        let id = Id::from_raw(&raw(r#""req-7""#)).unwrap();
        inflight.table().insert(3, (id, tx, None));
        // Another call's answer is given back, untouched.
        let other = r#"{"jsonrpc":"2.0","id":2,"result":{}}"#;
        assert_eq!(inflight.answer(other.to_owned()).as_deref(), Some(other));
        let mine = r#"{"jsonrpc":"2.0","id":3,"result":{"messageId":"m1","delivered":["a", "b"]}}"#;
        assert_eq!(inflight.answer(mine.to_owned()), None);
        let frame = rx.try_recv().unwrap();
        let v: serde_json::Value = serde_json::from_str(&frame).unwrap();
        assert_eq!(v["id"], "req-7");
        assert!(
            frame.contains(r#"{"messageId":"m1","delivered":["a", "b"]}"#),
            "{frame}"
        );
        assert!(inflight.table().is_empty());
        // An error answer keeps its code.
        let (tx, mut rx) = oneshot::channel();
        inflight.table().insert(4, (Id::number(9), tx, None));
        let err = r#"{"jsonrpc":"2.0","id":4,"error":{"code":1003,"message":"no"}}"#;
        assert_eq!(inflight.answer(err.to_owned()), None);
        let v: serde_json::Value = serde_json::from_str(&rx.try_recv().unwrap()).unwrap();
        assert_eq!(
            (v["id"].clone(), v["error"]["code"].clone()),
            (serde_json::json!(9), serde_json::json!(1003))
        );
    }

    #[tokio::test]
    async fn subscriptions_stay_here_unless_the_session_speaks_as_an_agent() {
        let (tx, _rx) = mpsc::channel(1);
        let mut state = RelayState {
            link: Some(Open {
                tx,
                answers: mpsc::channel(1).1,
                pump: tokio::spawn(async {}),
                inflight: Arc::default(),
                given: None,
            }),
            ..RelayState::default()
        };
        assert_eq!(state.route("map/send", None, true, false), Route::Writer);
        assert_eq!(state.route("map/subscribe", None, true, true), Route::Here);
        assert_eq!(state.route("map/replay", None, true, true), Route::Here);
        state.served("map/subscribe", None, r#"{"subscriptionId":"here-1"}"#);
        let here = raw(r#"{"subscriptionId":"here-1"}"#);
        let there = raw(r#"{"subscriptionId":"there-1"}"#);
        assert_eq!(
            state.route("map/unsubscribe", Some(&here), true, true),
            Route::Here
        );
        assert_eq!(
            state.route("map/unsubscribe", Some(&there), true, true),
            Route::Writer
        );
        assert!(!state.forwards_notification("map/subscribe.ack", Some(&here)));
        assert!(state.forwards_notification("map/subscribe.ack", Some(&there)));
        assert!(state.forwards_notification("trajectory/content.response", None));
        // An agent session's subscriptions are the writer's (its registry decides).
        state.agent = true;
        assert_eq!(
            state.route("map/subscribe", None, true, true),
            Route::Writer
        );
        assert_eq!(state.route("map/replay", None, true, true), Route::Writer);
        // Sessions are always this node's to open and close (the relay follows).
        assert_eq!(state.route("map/disconnect", None, true, true), Route::Here);
        state.disconnected();
        assert!(!state.is_open());
        assert_eq!(state.route("map/subscribe", None, true, true), Route::Here);
    }

    #[test]
    fn the_writers_answer_says_when_a_session_speaks_as_an_agent() {
        let connect = |answer: &str| speaks_as_agent("map/connect", answer);
        assert!(connect(r#"{"participantType":"agent","ownedAgents":[]}"#));
        assert!(connect(
            r#"{"participantType":"client","ownedAgents":["a"]}"#
        ));
        assert!(connect(
            r#"{"participantType":"client","reclaimedAgents":[{"id":"a"}]}"#
        ));
        assert!(!connect(r#"{"participantType":"client","ownedAgents":[]}"#));
        assert!(!connect("not json"));
        assert!(speaks_as_agent("map/session/load", r#"{"restored":true}"#));
        assert!(speaks_as_agent(
            "map/session/close",
            r#"{"closed":true,"current":true}"#
        ));
        assert!(!speaks_as_agent("map/session/close", r#"{"closed":true}"#));
        assert!(!speaks_as_agent(
            "map/send",
            r#"{"participantType":"agent"}"#
        ));
    }

    #[test]
    fn a_relayed_connect_names_tokens_by_their_digests_only() {
        use crate::router::sessions::table::token_key;
        let client = params_object(Some(&raw(
            r#"{"participantType":"agent","resumeToken":"resume_abc","name":"a"}"#,
        )));
        let (theirs, next) = with_token_digests("map/connect", client).unwrap();
        let text = serde_json::Value::Object(theirs.clone()).to_string();
        assert!(
            !text.contains("resume_abc") && !text.contains(&next),
            "{text}"
        );
        assert_eq!(theirs["resumeTokenDigest"], json!(token_key("resume_abc")));
        assert_eq!(theirs["nextResumeTokenDigest"], json!(token_key(&next)));
        assert_eq!(theirs["name"], json!("a"));
        // A disconnect names the next token only; a client's own digest is refused.
        let (theirs, _) = with_token_digests("map/disconnect", Default::default()).unwrap();
        assert!(!theirs.contains_key("resumeTokenDigest"));
        for key in ["resumeTokenDigest", "nextResumeTokenDigest"] {
            let mut client = serde_json::Map::new();
            client.insert(key.into(), json!(token_key("resume_abc")));
            let err = with_token_digests("map/connect", client).unwrap_err();
            assert!(format!("{err:?}").contains(key), "{err:?}");
        }
        assert!(carries_token("map/session/load") && !carries_token("map/send"));
    }

    #[test]
    fn the_clients_token_fills_the_writers_empty_one_and_nothing_else() {
        // Agent metadata may hold the same key: only the answer's own field changes.
        let answer = r#"{"reclaimedAgents":[{"metadata":{"resumeToken":""}}],"resumeToken":"","principal":{"id":"p"}}"#;
        assert_eq!(
            with_token(answer.to_owned(), "resume_1"),
            r#"{"reclaimedAgents":[{"metadata":{"resumeToken":""}}],"resumeToken":"resume_1","principal":{"id":"p"}}"#
        );
        let mut state = RelayState::default();
        let filled = state.fill_token("map/connect", answer.to_owned(), "resume_2".into());
        assert!(filled.contains(r#""resumeToken":"resume_2""#), "{filled}");
        // A load of the session it has keeps the token; one that restores another takes the
        // new one; an answer with a token already (never from this version) is left alone.
        let same = r#"{"restored":false,"resumeToken":""}"#;
        let filled = state.fill_token("map/session/load", same.to_owned(), "resume_3".into());
        assert_eq!(filled, r#"{"restored":false,"resumeToken":"resume_2"}"#);
        let other = r#"{"restored":true,"resumeToken":""}"#;
        let filled = state.fill_token("map/session/load", other.to_owned(), "resume_4".into());
        assert_eq!(filled, r#"{"restored":true,"resumeToken":"resume_4"}"#);
        let clear = r#"{"resumeToken":"resume_x"}"#;
        assert_eq!(
            state.fill_token("map/disconnect", clear.to_owned(), "resume_5".into()),
            clear
        );
    }

    #[test]
    fn a_relayed_call_names_its_span_in_front_and_keeps_the_clients_bytes() {
        use crate::router::traces::{Sampler, Span, SpanSink};
        #[derive(Debug)]
        struct Nowhere;
        impl SpanSink for Nowhere {
            fn offer(&self, _: Span) {}
        }
        let spans = RelaySpans::new(Arc::new(Nowhere), Sampler::default(), "n1");
        let span = spans.begin("map/send", None);
        let tp = span.traceparent();
        let client = r#"{ "to":{"agent":"a"},"meta":{"b":2, "a":1}}"#;
        let with = traced(Some(&raw(client)), Some(&span)).unwrap();
        assert_eq!(
            with.get(),
            format!(
                r#"{{"relayTraceparent":"{tp}", "to":{{"agent":"a"}},"meta":{{"b":2, "a":1}}}}"#
            )
        );
        assert_eq!(
            traced(Some(&raw("{ }")), Some(&span)).unwrap().get(),
            format!(r#"{{"relayTraceparent":"{tp}" }}"#)
        );
        assert_eq!(
            traced(None, Some(&span)).unwrap().get(),
            format!(r#"{{"relayTraceparent":"{tp}"}}"#)
        );
        assert!(traced(Some(&raw("[1]")), Some(&span)).is_none());
        assert!(traced(Some(&raw(client)), None).is_none());
        // A client's own is refused; a member of its meta by that name is not.
        let err = refuse_relay_trace(Some(&raw(r#"{"relayTraceparent":"x"}"#))).unwrap_err();
        assert!(err.message.contains("Invalid") || format!("{err:?}").contains("relayTraceparent"));
        refuse_relay_trace(Some(&raw(r#"{"meta":{"relayTraceparent":"x"}}"#))).unwrap();
    }

    #[test]
    fn an_untraced_reply_goes_under_the_context_its_request_was_given() {
        let given = Given::default();
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01";
        let other = "00-4bf92f3577b34da6a3ce929d0e0e4736-2222222222222222-01";
        given.saw(&format!(
            r#"{{"jsonrpc":"2.0","method":"map/message","params":{{"message":{{"id":"m1","from":"a","to":"b","timestamp":1,"payload":{{}},"meta":{{"correlationId":"q1","traceparent":"{caller}"}}}},"_meta":{{"traceparent":"{tp}"}}}}}}"#
        ));
        let reply = |meta: &str| raw(&format!(r#"{{"to":{{"agent":"a"}},"meta":{meta}}}"#));
        let parent = |meta: &str| {
            let params = reply(meta);
            let own = crate::router::traces::call_context(Some(&params));
            given
                .answered(Some(&params), own.as_ref())
                .map(|t| t.traceparent)
        };
        assert_eq!(
            parent(r#"{"isResult":true,"correlationId":"q1"}"#).as_deref(),
            Some(tp)
        );
        assert_eq!(
            parent(r#"{"isResult":true,"correlationId":"m1"}"#).as_deref(),
            Some(tp)
        );
        assert_eq!(parent(r#"{"correlationId":"q1"}"#), None, "not a reply");
        // A reply that copied its request's context is one too; one with another is not.
        let copied =
            format!(r#"{{"isResult":true,"correlationId":"q1","traceparent":"{caller}"}}"#);
        assert_eq!(parent(&copied).as_deref(), Some(tp));
        let own = format!(r#"{{"isResult":true,"correlationId":"q1","traceparent":"{other}"}}"#);
        assert_eq!(parent(&own), None);
        assert_eq!(parent(r#"{"isResult":true,"correlationId":"q2"}"#), None);
        // Other frames are not remembered, and the table is bounded.
        given.saw(
            r#"{"jsonrpc":"2.0","method":"map/event","params":{"_meta":{"traceparent":"x"}}}"#,
        );
        for i in 0..GIVEN_MAX {
            given.saw(&format!(
                r#"{{"method":"map/message","params":{{"message":{{"id":"n{i}"}},"_meta":{{"traceparent":"{tp}"}}}}}}"#
            ));
        }
        let table = crate::sync::lock(&given.0);
        assert_eq!((table.0.len(), table.1.len()), (GIVEN_MAX, GIVEN_MAX));
        assert!(!table.0.contains_key("q1"), "the oldest are forgotten");
    }

    #[test]
    fn a_forwarded_frame_names_its_method_and_params_as_given() {
        let params = raw(r#"{"to":{"agent":"a"},"payload":{"x":1}}"#);
        assert_eq!(
            frame(Some(7), "map/send", Some(&params)),
            r#"{"jsonrpc":"2.0","id":7,"method":"map/send","params":{"to":{"agent":"a"},"payload":{"x":1}}}"#
        );
        assert_eq!(
            frame(None, "map/subscribe.ack", None),
            r#"{"jsonrpc":"2.0","method":"map/subscribe.ack"}"#
        );
        assert!(is_answer(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#));
        assert!(!is_answer(
            r#"{"jsonrpc":"2.0","method":"map/message","params":{}}"#
        ));
    }
}
