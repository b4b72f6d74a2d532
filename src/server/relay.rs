//! Relay sessions over core NATS between the nodes of a cluster: a standby forwards the calls
//! its follower router does not serve to the node that writes the log (`router::relay`).
//!
//! Owns the two ends of the NATS link and the table of relay sessions on each:
//! - [`FollowerRelay`] (on a standby): publishes each connection's frames to
//!   `_MAP.relay.<stream>.<node>.<relay>` (the first with the header `Map-Relay: open` and the
//!   principal this node authenticated, the last with `Map-Relay: close`), and hands what
//!   arrives on `_MAP.conn.<stream>.<node>.<relay>` to that connection (`<relay>` numbers
//!   the node's relay sessions).
//! - [`host`] (on the writer): opens, for each relay, an in-process MAP session admitted as
//!   that principal (origin `Delegated`, as a gateway does for its caller; with
//!   authentication off, an ordinary remote session), feeds it the frames, and publishes
//!   every frame the session sends back. It closes the relays of a node that left the roll
//!   call (the node died: its sessions end once, on the writer, as any disconnect does) and a
//!   relay that sends faster than its session reads.
//!
//! Core NATS keeps one publisher's messages in order, which is all a relay needs; a message
//! lost while NATS is away ends as a bounded wait (`router::relay::RELAY_CALL_TIMEOUT`) and a
//! clear error, never as a wrong answer. Trust: whoever may publish on `_MAP.relay.>` may
//! name a principal, so NATS permissions must give `_MAP.>` to router nodes only
//! (docs/cluster.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::mpsc;

use crate::protocol::methods::session::Principal;
use crate::router::ids::ConnId;
use crate::router::relay::{Relay, RelayLink, RELAY_INBOX};
use crate::transport::in_process::InProcessLink;

const HEADER: &str = "Map-Relay";
const PRINCIPAL: &str = "Map-Principal";
const OPEN: &str = "open";
const CLOSE: &str = "close";
/// From the writer: the relay session ended (or never existed).
const CLOSED: &str = "closed";

/// How long a relay's node may be missing from the roll call after the relay opened before the
/// writer takes it for dead (a node that just started may not have answered one yet), in
/// roll calls.
const GRACE_ROLL_CALLS: u32 = 3;
/// Roll calls in a row a node must miss before its relay sessions end: a node that answers one
/// late is not taken for dead; a dead one is noticed within about 1 to 3 roll calls
/// (`[cluster] roll_call_ms`, 2 s by default).
const MISSED_ROLL_CALLS: u32 = 2;

/// A node name as one subject token (`.`, `*`, `>` and blanks would split or widen it).
pub fn token(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn relay_subject(stream: &str, node: &str, conn: u64) -> String {
    format!("_MAP.relay.{stream}.{node}.{conn}")
}

fn conn_subject(stream: &str, node: &str, conn: u64) -> String {
    format!("_MAP.conn.{stream}.{node}.{conn}")
}

/// The part of a frame a message carries, as `i/n`, when the frame is larger than one NATS
/// message may be (`max_payload`, 1 MiB by default, which a frame as large as the router
/// accepts exceeds with its envelope).
const PART: &str = "Map-Relay-Part";
/// The most bytes of a frame in one message.
const PART_BYTES: usize = 256 * 1024;
/// The largest frame reassembled (bounds what a relay may buffer).
const MAX_FRAME_BYTES: usize = 64 << 20;

/// Publishes one frame, in parts when it is large (core NATS keeps them in order).
async fn publish_frame(
    client: &async_nats::Client,
    subject: &str,
    frame: String,
) -> Result<(), async_nats::PublishError> {
    let bytes = bytes::Bytes::from(frame);
    if bytes.len() <= PART_BYTES {
        return client.publish(subject.to_owned(), bytes).await;
    }
    let parts = bytes.len().div_ceil(PART_BYTES);
    for i in 0..parts {
        let chunk = bytes.slice(i * PART_BYTES..((i + 1) * PART_BYTES).min(bytes.len()));
        let headers = header(PART, &format!("{}/{parts}", i + 1));
        client
            .publish_with_headers(subject.to_owned(), headers, chunk)
            .await?;
    }
    Ok(())
}

/// Reassembles the frames of one relay from its messages.
#[derive(Debug, Default)]
struct Parts {
    buf: Vec<u8>,
}

impl Parts {
    /// The whole frame once `msg` completes it; `Err` for parts out of order or too large.
    fn take(&mut self, msg: &async_nats::Message) -> Result<Option<String>, &'static str> {
        let part = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(PART))
            .map(|v| v.as_str().to_owned());
        let Some(part) = part else {
            if !self.buf.is_empty() {
                return Err("a frame's parts were cut short");
            }
            return String::from_utf8(msg.payload.to_vec())
                .map(Some)
                .map_err(|_| "a frame that is not UTF-8");
        };
        let (i, n) = part
            .split_once('/')
            .and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n.parse::<usize>().ok()?)))
            .ok_or("an unreadable part header")?;
        if i == 1 && !self.buf.is_empty() {
            return Err("a frame's parts were cut short");
        }
        if self.buf.len() + msg.payload.len() > MAX_FRAME_BYTES {
            self.buf = Vec::new();
            return Err("a frame larger than a relay carries");
        }
        self.buf.extend_from_slice(&msg.payload);
        if i < n {
            return Ok(None);
        }
        String::from_utf8(std::mem::take(&mut self.buf))
            .map(Some)
            .map_err(|_| "a frame that is not UTF-8")
    }
}

fn header(name: &str, value: &str) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(name, value);
    headers
}

type Routes = Arc<Mutex<HashMap<u64, Route>>>;

/// Where the writer's frames for one relay session go, and its parts so far.
#[derive(Debug)]
struct Route {
    tx: mpsc::Sender<String>,
    parts: Parts,
}

use crate::sync::lock;

/// A standby's end of the relays (see the module docs).
#[derive(Debug)]
pub struct FollowerRelay {
    client: async_nats::Client,
    stream: String,
    node: String,
    routes: Routes,
    /// Numbers each relay session of this node (a connection's second one never shares the
    /// first's subjects).
    next: std::sync::atomic::AtomicU64,
    /// Set once the subscription to the writer's frames is in place.
    ready: tokio::sync::watch::Receiver<bool>,
    demux: tokio::task::JoinHandle<()>,
}

impl FollowerRelay {
    /// Starts listening for the writer's frames to this node's connections.
    pub fn start(client: async_nats::Client, stream: &str, node: &str) -> Arc<Self> {
        let node = token(node);
        let routes: Routes = Arc::default();
        let (set_ready, ready) = tokio::sync::watch::channel(false);
        let demux = {
            let client = client.clone();
            let routes = Arc::clone(&routes);
            let subject = format!("_MAP.conn.{stream}.{node}.*");
            tokio::spawn(async move {
                let mut sub = subscribe(&client, subject).await;
                let _ = set_ready.send(true);
                while let Some(msg) = sub.next().await {
                    let Some(conn) = msg.subject.rsplit('.').next().and_then(|c| c.parse().ok())
                    else {
                        continue;
                    };
                    let closed = msg
                        .headers
                        .as_ref()
                        .and_then(|h| h.get(HEADER))
                        .is_some_and(|v| v.as_str() == CLOSED);
                    let mut routes = lock(&routes);
                    if closed {
                        routes.remove(&conn);
                        continue;
                    }
                    let Some(route) = routes.get_mut(&conn) else {
                        continue;
                    };
                    let text = match route.parts.take(&msg) {
                        Ok(Some(text)) => text,
                        Ok(None) => continue,
                        Err(why) => {
                            tracing::warn!(conn, why, "relay: a frame from the writer is unusable; closing the connection");
                            routes.remove(&conn);
                            continue;
                        }
                    };
                    if let Err(e) = route.tx.try_send(text) {
                        // A connection that does not read what its relay session sends is
                        // closed (its relay ends), never fed with holes.
                        if matches!(e, mpsc::error::TrySendError::Full(_)) {
                            tracing::warn!(
                                conn,
                                "relay: the connection is not reading; closing it"
                            );
                        }
                        routes.remove(&conn);
                    }
                }
            })
        };
        Arc::new(Self {
            client,
            stream: stream.to_owned(),
            node,
            routes,
            next: std::sync::atomic::AtomicU64::new(1),
            ready,
            demux,
        })
    }
}

impl Drop for FollowerRelay {
    fn drop(&mut self) {
        self.demux.abort();
    }
}

impl Relay for FollowerRelay {
    fn open(&self, conn: ConnId, principal: Option<Principal>) -> Result<RelayLink, String> {
        let relay = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(%conn, relay, "relay: opening a relay session on the writer");
        let conn = relay;
        let (tx, mut frames) = mpsc::channel::<String>(16);
        let (route, rx) = mpsc::channel::<String>(RELAY_INBOX);
        lock(&self.routes).insert(
            conn,
            Route {
                tx: route,
                parts: Parts::default(),
            },
        );
        let principal = match principal {
            Some(p) => serde_json::to_string(&p).map_err(|e| e.to_string())?,
            None => String::new(),
        };
        let client = self.client.clone();
        let subject = relay_subject(&self.stream, &self.node, conn);
        let routes = Arc::clone(&self.routes);
        let mut ready = self.ready.clone();
        tokio::spawn(async move {
            if ready.wait_for(|r| *r).await.is_ok() {
                let mut headers = header(HEADER, OPEN);
                headers.insert(PRINCIPAL, principal.as_str());
                if client
                    .publish_with_headers(subject.clone(), headers, bytes::Bytes::new())
                    .await
                    .is_ok()
                {
                    while let Some(frame) = frames.recv().await {
                        if let Err(e) = publish_frame(&client, &subject, frame).await {
                            tracing::warn!(error = %e, "relay: cannot publish; the relay ends");
                            break;
                        }
                    }
                    let _ = client
                        .publish_with_headers(subject, header(HEADER, CLOSE), bytes::Bytes::new())
                        .await;
                }
            }
            lock(&routes).remove(&conn);
        });
        Ok(RelayLink { tx, rx })
    }
}

/// Opens the writer's side of a relay: an in-process MAP session admitted as the principal,
/// on behalf of a connection of the node named (as a subject token).
pub type OpenSession = Arc<dyn Fn(Option<Principal>, &str) -> InProcessLink + Send + Sync>;

/// The node names (as subject tokens) that answered the last roll call; empty when unknown.
pub type LiveNodes = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

struct Hosted {
    tx: futures::channel::mpsc::Sender<String>,
    opened: Instant,
    parts: Parts,
}

/// The writer's end of the relays (see the module docs): runs until NATS closes the
/// subscription or the task is aborted. It compares its relays with the roll call (`nodes`)
/// as often as the roll call is held (`roll_call`).
pub async fn host(
    client: async_nats::Client,
    stream: String,
    open: OpenSession,
    nodes: LiveNodes,
    roll_call: Duration,
) {
    let mut sub = subscribe(&client, format!("_MAP.relay.{stream}.*.*")).await;
    let mut sessions: HashMap<(String, u64), Hosted> = HashMap::new();
    let grace = roll_call * GRACE_ROLL_CALLS;
    let mut sweep = tokio::time::interval(roll_call);
    // Roll calls in a row each node with relay sessions was missing from.
    let mut missed: HashMap<String, u32> = HashMap::new();
    loop {
        let msg = tokio::select! {
            msg = sub.next() => match msg {
                Some(msg) => msg,
                None => return,
            },
            _ = sweep.tick() => {
                let alive = nodes();
                if alive.is_empty() {
                    // NATS is away (no roll call): nobody is taken for dead.
                    missed.clear();
                    continue;
                }
                // A node must miss two roll calls in a row (a busy node may answer one late).
                let mut gone = Vec::new();
                for (node, _) in sessions.keys() {
                    if alive.contains(node) {
                        missed.remove(node);
                    } else if !gone.contains(node) {
                        gone.push(node.clone());
                    }
                }
                for node in gone {
                    *missed.entry(node).or_default() += 1;
                }
                sessions.retain(|(node, conn), s| {
                    let dead = s.opened.elapsed() >= grace
                        && missed.get(node).is_some_and(|m| *m >= MISSED_ROLL_CALLS);
                    if dead {
                        tracing::info!(%node, conn, "relay: the node left the roll call; its session ends");
                    }
                    !dead
                });
                missed.retain(|node, _| sessions.keys().any(|(n, _)| n == node));
                continue;
            }
        };
        let mut tokens = msg.subject.rsplit('.');
        let (Some(Ok(conn)), Some(node)) = (tokens.next().map(str::parse::<u64>), tokens.next())
        else {
            continue;
        };
        let key = (node.to_owned(), conn);
        let kind = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(HEADER))
            .map(|v| v.as_str().to_owned());
        match kind.as_deref() {
            Some(OPEN) => {
                let principal = msg
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(PRINCIPAL))
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default();
                let principal = if principal.is_empty() {
                    None
                } else {
                    match serde_json::from_str::<Principal>(&principal) {
                        Ok(p) => Some(p),
                        Err(e) => {
                            tracing::warn!(%node, conn, error = %e, "relay: an open with an unreadable principal; refused");
                            closed(&client, &stream, &key).await;
                            continue;
                        }
                    }
                };
                let InProcessLink { tx, mut rx } = open(principal, node);
                let client = client.clone();
                let stream = stream.clone();
                let back = key.clone();
                tokio::spawn(async move {
                    let subject = conn_subject(&stream, &back.0, back.1);
                    while let Some(frame) = rx.next().await {
                        if let Err(e) = publish_frame(&client, &subject, frame).await {
                            tracing::warn!(error = %e, "relay: cannot publish; the relay ends");
                            break;
                        }
                    }
                    closed(&client, &stream, &back).await;
                });
                sessions.insert(
                    key,
                    Hosted {
                        tx,
                        opened: Instant::now(),
                        parts: Parts::default(),
                    },
                );
            }
            Some(CLOSE) => {
                sessions.remove(&key);
            }
            _ => {
                let Some(session) = sessions.get_mut(&key) else {
                    // A frame for a session this node does not hold (it took over since, or
                    // closed it): the other end learns so at once.
                    closed(&client, &stream, &key).await;
                    continue;
                };
                let text = match session.parts.take(&msg) {
                    Ok(Some(text)) => text,
                    Ok(None) => continue,
                    Err(why) => {
                        tracing::warn!(node = %key.0, conn, why, "relay: an unusable frame; closing the session");
                        sessions.remove(&key);
                        closed(&client, &stream, &key).await;
                        continue;
                    }
                };
                if session.tx.try_send(text).is_err() {
                    tracing::warn!(node = %key.0, conn, "relay: the session does not keep up; closing it");
                    sessions.remove(&key);
                    closed(&client, &stream, &key).await;
                }
            }
        }
    }
}

/// Subscribes to `subject`, trying again every second until NATS takes it (the caller's task
/// is aborted when the relay stops).
async fn subscribe(client: &async_nats::Client, subject: String) -> async_nats::Subscriber {
    loop {
        match client.subscribe(subject.clone()).await {
            Ok(sub) => return sub,
            Err(e) => {
                tracing::warn!(error = %e, %subject, "relay: cannot subscribe; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

async fn closed(client: &async_nats::Client, stream: &str, (node, conn): &(String, u64)) {
    let _ = client
        .publish_with_headers(
            conn_subject(stream, node, *conn),
            header(HEADER, CLOSED),
            bytes::Bytes::new(),
        )
        .await;
}
