//! Relayed calls: how a follower (`RouterConfig::follower`) has the calls it does not serve
//! itself run by the node that writes the log, under the caller's own principal.
//!
//! Owns the per-connection relay state of an [`RpcSession`](super::rpc::RpcSession) on a
//! follower ([`RelayState`]): the link to the connection's *relay session* on the writer, the
//! `map/connect` that opens it, the ids of the calls it forwards, and the task that hands
//! the writer's frames to the connection. The link itself (a NATS subject pair in cluster
//! mode) is the server's ([`Relay`]): the router knows no socket.
//!
//! - The relay session is opened at the first call the follower cannot serve: a
//!   `map/connect` with the connection's own parameters (its credential left out), its
//!   participant id, and the principal this node authenticated, never one the caller names.
//! - From then on every call of the connection goes to the writer (subscriptions and replay
//!   too: the writer knows the agents the session registered, which decide what an agent
//!   viewer is shown), except `map/unsubscribe` of a subscription made here before.
//! - Calls are forwarded one at a time, in order, each with an id of the relay's own; the
//!   writer's answer (its `result` byte for byte, or its error) is the call's answer. Every
//!   other frame the writer sends the session (`map/message`, `map/event` of a subscription
//!   made there) goes to the connection's outbox as it is.
//! - The writer ending the relay session (it stopped, or dropped a relay it could not keep
//!   up with) closes the connection with 1011 and a reason: a client never waits for
//!   frames that will not come.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use tokio::sync::mpsc;

use crate::protocol::jsonrpc::ErrorObject;
use crate::protocol::methods::session::Principal;
use crate::router::ids::ConnId;
use crate::router::outbox::Outbound;
use crate::router::outbox::Outbox;

/// Longest wait for the writer's answer to one forwarded call.
pub const RELAY_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Frames from the writer that may wait for the connection (its outbox is bounded too).
pub const RELAY_INBOX: usize = 1024;

/// Both ends of one relay session, as the server's [`Relay`] opens it.
#[derive(Debug)]
pub struct RelayLink {
    /// JSON-RPC frames for the writer's relay session. Dropping it ends the session.
    pub tx: mpsc::Sender<String>,
    /// Every frame the writer's relay session sends; ends when the writer ends it.
    pub rx: mpsc::Receiver<String>,
}

/// Opens relay sessions on the node that writes the log (the server's, over NATS).
pub trait Relay: Send + Sync + std::fmt::Debug {
    /// Opens a relay session for connection `conn`, admitted on the writer as `principal`
    /// (the principal this node authenticated; `None` with authentication off).
    ///
    /// # Errors
    /// A reason, when no link can be opened now.
    fn open(&self, conn: ConnId, principal: Option<Principal>) -> Result<RelayLink, String>;
}

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
    /// The `map/connect` parameters the connection's session was opened with (credential
    /// removed) and the participant id it got: what the relay session is opened with.
    connect: Option<(serde_json::Map<String, serde_json::Value>, Option<Principal>)>,
    /// Subscriptions this node serves for the connection.
    local_subs: HashSet<String>,
    link: Option<Open>,
    next_id: u64,
}

#[derive(Debug)]
struct Open {
    tx: mpsc::Sender<String>,
    answers: mpsc::Receiver<String>,
    pump: tokio::task::JoinHandle<()>,
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

impl RelayState {
    /// Where `method` goes for this connection (`params`: a `map/unsubscribe`'s).
    pub fn route(&self, method: &str, params: Option<&RawValue>, relay: bool) -> Route {
        use crate::protocol::methods::auth::{AuthRefresh, Authenticate};
        use crate::protocol::methods::events::{Replay, Subscribe, Unsubscribe};
        use crate::protocol::methods::session::{Connect, Disconnect};
        use crate::protocol::methods::Method;
        let served = crate::router::dispatch::served_by_follower(method);
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
        if (method == Subscribe::NAME || method == Replay::NAME) && self.link.is_none() {
            return Route::Here;
        }
        Route::Writer
    }

    /// Records the parameters of a `map/connect` made here: what the relay session will be
    /// opened with (the credential stays here: this node verified it; a resume is of this
    /// node's session).
    pub fn connect_params(&mut self, params: Option<&RawValue>) {
        let mut connect: serde_json::Map<String, serde_json::Value> = params
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or_default();
        for key in ["auth", "sessionId", "resumeToken"] {
            connect.remove(key);
        }
        self.connect = Some((connect, None));
    }

    /// The connection's session was opened here (`result`: the `map/connect` or
    /// `map/authenticate` result): the relay session takes its participant id and principal.
    pub fn admitted(&mut self, result: &str) {
        let result: serde_json::Value = serde_json::from_str(result).unwrap_or_default();
        let Some((connect, principal)) = self.connect.as_mut() else {
            return;
        };
        let session = result.get("session").unwrap_or(&result);
        if let Some(id) = session.get("participantId").or_else(|| result.get("participantId")) {
            connect.insert("participantId".into(), id.clone());
        }
        *principal = result
            .get("principal")
            .or_else(|| session.get("principal"))
            .and_then(|p| serde_json::from_value(p.clone()).ok());
        self.link = None;
    }

    /// The session ended here: so does its relay session.
    pub fn disconnected(&mut self) {
        self.connect = None;
        self.link = None;
        self.local_subs.clear();
    }

    /// Records the result of a `map/subscribe` or `map/unsubscribe` this node served.
    pub fn served(&mut self, method: &str, params: Option<&RawValue>, result: &str) {
        use crate::protocol::methods::events::{Subscribe, Unsubscribe};
        use crate::protocol::methods::Method;
        if method == Subscribe::NAME {
            if let Some(id) = subscription_of(RawValue::from_string(result.to_owned()).ok().as_deref()) {
                self.local_subs.insert(id);
            }
        } else if method == Unsubscribe::NAME {
            if let Some(id) = subscription_of(params) {
                self.local_subs.remove(&id);
            }
        }
    }

    /// Runs `method` on the writer: opens the relay session first if needed, then forwards the
    /// call and waits (bounded) for its answer. Returns the `result` JSON text.
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
        if self.link.is_none() {
            self.open(relay, conn, outbox).await?;
        }
        let result = self.forward(method, params).await;
        if result.is_err() && self.link.as_ref().is_some_and(|l| l.tx.is_closed()) {
            self.link = None;
        }
        result
    }

    async fn open(
        &mut self,
        relay: &Arc<dyn Relay>,
        conn: ConnId,
        outbox: &Outbox,
    ) -> Result<(), ErrorObject> {
        let Some((params, principal)) = self.connect.clone() else {
            return Err(unreachable_writer("this connection has no session"));
        };
        let RelayLink { tx, mut rx } =
            relay.open(conn, principal).map_err(|e| unreachable_writer(&e))?;
        let (answers_tx, answers) = mpsc::channel(4);
        let outbox = outbox.clone();
        let pump = tokio::spawn(async move {
            while let Some(frame) = rx.recv().await {
                if is_answer(&frame) {
                    // The session waits for at most one answer at a time; a late one (its
                    // call timed out) is dropped there.
                    if answers_tx.send(frame).await.is_err() {
                        return;
                    }
                } else if outbox.push(Outbound::Frame(frame)).await.is_err() {
                    return;
                }
            }
            let _ = outbox
                .push(Outbound::Close {
                    code: 1011,
                    reason: "the node that writes the log ended this connection's session".into(),
                })
                .await;
        });
        self.link = Some(Open { tx, answers, pump });
        let params = serde_json::Value::Object(params).to_string();
        let params = RawValue::from_string(params).map_err(|e| unreachable_writer(&e.to_string()))?;
        use crate::protocol::methods::session::Connect;
        use crate::protocol::methods::Method;
        if let Err(e) = self.forward(Connect::NAME, Some(&params)).await {
            self.link = None;
            return Err(e);
        }
        Ok(())
    }

    async fn forward(&mut self, method: &str, params: Option<&RawValue>) -> Result<String, ErrorObject> {
        let Some(link) = self.link.as_mut() else {
            return Err(unreachable_writer("no relay session"));
        };
        self.next_id += 1;
        let id = self.next_id;
        let mut frame = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"#);
        frame.push_str(&serde_json::Value::from(method).to_string());
        if let Some(p) = params {
            frame.push_str(r#","params":"#);
            frame.push_str(p.get());
        }
        frame.push('}');
        if link.tx.send(frame).await.is_err() {
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
    serde_json::from_str::<Sub>(params?.get()).ok().map(|s| s.subscription_id)
}

fn unreachable_writer(why: &str) -> ErrorObject {
    ErrorObject::internal(format!(
        "this node forwards the call to the node that writes the log, which cannot be reached: {why}"
    ))
    .retryable()
}
