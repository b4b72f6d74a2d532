//! Relay sessions over core NATS between the nodes of a cluster: a standby forwards the calls
//! its follower router does not serve to the node that writes the log (`router::relay`).
//!
//! Owns the two ends of the NATS link and the table of relay sessions on each:
//! - [`FollowerRelay`] (on a standby): publishes each connection's frames to
//!   `_MAP.relay.<stream>.<node>.<incarnation>.<relay>` (the first with the header
//!   `Map-Relay: open` and the principal this node authenticated, the last with
//!   `Map-Relay: close`), and hands what arrives on
//!   `_MAP.conn.<stream>.<node>.<incarnation>.<relay>` to that connection (`<incarnation>`:
//!   this process's, drawn at start and carried by its roll call answers,
//!   `store::jetstream::NodeStatus::incarnation`; `<relay>` numbers the process's relay
//!   sessions). A node restarted under the same name is a new incarnation: its subjects are
//!   never its predecessor's, so no frame of a session of the dead process reaches a
//!   connection of the new one, and the new one serves at once.
//! - [`host`] (on the writer): opens, for each relay, an in-process MAP session admitted as
//!   that principal (origin `Delegated`, as a gateway does for its caller; with
//!   authentication off, an ordinary remote session), feeds it the frames, and publishes
//!   every frame the session sends back. It closes the relays of a node incarnation that left
//!   the roll call (the process died, even if a new one answers under its name: its sessions
//!   end once, on the writer, as any lost connection does) and a relay that sends faster than
//!   its session reads.
//!
//! Each direction of a relay numbers its messages, splits large frames and, once its frames
//! pause, says how many it sent (`frames`): a message NATS lost (core NATS delivers at most
//! once) ends the relay session, and the
//! client's connection is closed with 1012 and a reason (it resumes with its token and
//! replays), never handed a spliced frame or a silent gap. A message lost while NATS is away
//! at the end of a call ends as a bounded wait (`router::relay::RELAY_CALL_TIMEOUT`) and a
//! clear error, never as a wrong answer. Trust: whoever may publish on `_MAP.relay.>` may
//! name a principal, and whoever may subscribe there reads the relayed frames (never a usable
//! resume token: `router::relay` names tokens by their digests), so NATS must
//! give `_MAP.>` to router nodes only (docs/cluster.md, "NATS users").

mod frames;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::mpsc;

use crate::protocol::methods::session::Principal;
use crate::router::ids::ConnId;
use crate::router::relay::{Relay, RelayLink, RELAY_INBOX};
use crate::transport::in_process::InProcessLink;

const PRINCIPAL: &str = "Map-Principal";
const OPEN: &str = "open";
const CLOSE: &str = "close";
/// From the writer: the relay session ended (or never existed).
const CLOSED: &str = "closed";
/// From the writer: the relay session ended because a message of the standby's was lost.
const LOST: &str = "lost";

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

/// One relay session: the node (as a subject token), its incarnation, and the relay's number.
type Key = (String, String, u64);

fn relay_subject(stream: &str, (node, incarnation, conn): &Key) -> String {
    format!("_MAP.relay.{stream}.{node}.{incarnation}.{conn}")
}

fn conn_subject(stream: &str, (node, incarnation, conn): &Key) -> String {
    format!("_MAP.conn.{stream}.{node}.{incarnation}.{conn}")
}

/// The relay session a subject ends with (`...<node>.<incarnation>.<relay>`).
fn key_of(subject: &str) -> Option<Key> {
    let mut tokens = subject.rsplit('.');
    let conn = tokens.next()?.parse().ok()?;
    let incarnation = tokens.next()?.to_owned();
    let node = tokens.next()?.to_owned();
    Some((node, incarnation, conn))
}

use frames::{Inbound, Outbound, HEADER, MARK, READS_BATCHES};

fn header(name: &str, value: &str) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(name, value);
    headers
}

type Routes = Arc<Mutex<HashMap<u64, Route>>>;

/// Where the writer's frames for one relay session go, and its messages so far.
#[derive(Debug)]
struct Route {
    tx: mpsc::Sender<String>,
    inbound: Inbound,
    /// Set when the relay ends because a message was lost (`RelayLink::frames_lost`).
    lost: Arc<AtomicBool>,
    /// Set once the writer said it reads batches (`frames::READS_BATCHES`).
    writer_reads_batches: Arc<AtomicBool>,
}

use crate::sync::lock;

/// A standby's end of the relays (see the module docs).
#[derive(Debug)]
pub struct FollowerRelay {
    client: async_nats::Client,
    stream: String,
    node: String,
    /// This process's incarnation (its relay subjects are its own).
    incarnation: String,
    routes: Routes,
    /// Numbers each relay session of this node (a connection's second one never shares the
    /// first's subjects).
    next: std::sync::atomic::AtomicU64,
    /// Set once the subscription to the writer's frames is in place.
    ready: tokio::sync::watch::Receiver<bool>,
    demux: tokio::task::JoinHandle<()>,
    /// Where the spans of relayed calls go, once traces are exported (`set_spans`).
    spans: std::sync::OnceLock<crate::router::traces::RelaySpans>,
}

impl FollowerRelay {
    /// How many relay sessions this node has open now (`map_cluster_relay_sessions`).
    pub fn sessions(&self) -> usize {
        lock(&self.routes).len()
    }

    /// Starts listening for the writer's frames to this node's connections.
    /// `incarnation`: this process's (`store::jetstream::NodeStatus::this_incarnation`).
    pub fn start(
        client: async_nats::Client,
        stream: &str,
        node: &str,
        incarnation: &str,
    ) -> Arc<Self> {
        let node = token(node);
        let incarnation = token(incarnation);
        let routes: Routes = Arc::default();
        let (set_ready, ready) = tokio::sync::watch::channel(false);
        let demux = {
            let client = client.clone();
            let routes = Arc::clone(&routes);
            let subject = format!("_MAP.conn.{stream}.{node}.{incarnation}.*");
            tokio::spawn(async move {
                let mut sub = subscribe(&client, subject).await;
                let _ = set_ready.send(true);
                while let Some(msg) = sub.next().await {
                    let Some(conn) = msg.subject.rsplit('.').next().and_then(|c| c.parse().ok())
                    else {
                        continue;
                    };
                    let control = msg
                        .headers
                        .as_ref()
                        .and_then(|h| h.get(HEADER))
                        .map(|v| v.as_str().to_owned());
                    let mut routes = lock(&routes);
                    if control.as_deref() == Some(MARK) {
                        let Some(route) = routes.get_mut(&conn) else {
                            continue;
                        };
                        if let Err(why) = route.inbound.mark_message(&msg) {
                            tracing::warn!(
                                conn,
                                why,
                                "relay: frames from the writer were lost; closing the connection"
                            );
                            route.lost.store(true, std::sync::atomic::Ordering::Relaxed);
                            routes.remove(&conn);
                        }
                        continue;
                    }
                    if let Some(control) = control {
                        if let Some(route) = routes.remove(&conn) {
                            if control == LOST {
                                tracing::warn!(conn, "relay: the writer lost a message of this connection's; closing it");
                                route.lost.store(true, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                        continue;
                    }
                    let Some(route) = routes.get_mut(&conn) else {
                        continue;
                    };
                    if frames::says_it_reads_batches(&msg) {
                        route
                            .writer_reads_batches
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    let texts = match route.inbound.take_message(&msg) {
                        Ok(texts) => texts,
                        Err(why) => {
                            tracing::warn!(conn, why, "relay: a frame from the writer is unusable; closing the connection");
                            route.lost.store(true, std::sync::atomic::Ordering::Relaxed);
                            routes.remove(&conn);
                            continue;
                        }
                    };
                    for text in texts {
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
                            break;
                        }
                    }
                }
            })
        };
        Arc::new(Self {
            client,
            stream: stream.to_owned(),
            node,
            incarnation,
            routes,
            next: std::sync::atomic::AtomicU64::new(1),
            ready,
            demux,
            spans: std::sync::OnceLock::new(),
        })
    }

    /// Exports a span of this node's for each call it relays (`router::relay`); once.
    pub fn set_spans(&self, spans: crate::router::traces::RelaySpans) {
        let _ = self.spans.set(spans);
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
        let lost = Arc::new(AtomicBool::new(false));
        let writer_reads_batches = Arc::new(AtomicBool::new(false));
        lock(&self.routes).insert(
            conn,
            Route {
                tx: route,
                inbound: Inbound::default(),
                lost: Arc::clone(&lost),
                writer_reads_batches: Arc::clone(&writer_reads_batches),
            },
        );
        let principal = match principal {
            Some(p) => serde_json::to_string(&p).map_err(|e| e.to_string())?,
            None => String::new(),
        };
        let client = self.client.clone();
        let subject = relay_subject(
            &self.stream,
            &(self.node.clone(), self.incarnation.clone(), conn),
        );
        let routes = Arc::clone(&self.routes);
        let mut ready = self.ready.clone();
        tokio::spawn(async move {
            if ready.wait_for(|r| *r).await.is_ok() {
                let mut headers = header(HEADER, OPEN);
                headers.insert(PRINCIPAL, principal.as_str());
                headers.insert(READS_BATCHES, "1");
                if client
                    .publish_with_headers(subject.clone(), headers, bytes::Bytes::new())
                    .await
                    .is_ok()
                {
                    let frames = futures::stream::poll_fn(|cx| frames.poll_recv(cx));
                    let out = Outbound::default();
                    if let Err(e) =
                        frames::forward(&client, &subject, frames, out, &writer_reads_batches).await
                    {
                        tracing::warn!(error = %e, "relay: cannot publish; the relay ends");
                    }
                    let _ = client
                        .publish_with_headers(subject, header(HEADER, CLOSE), bytes::Bytes::new())
                        .await;
                }
            }
            lock(&routes).remove(&conn);
        });
        Ok(RelayLink {
            tx,
            rx,
            frames_lost: lost,
        })
    }

    fn spans(&self) -> Option<crate::router::traces::RelaySpans> {
        self.spans.get().cloned()
    }
}

/// Opens the writer's side of a relay: an in-process MAP session admitted as the principal,
/// on behalf of a connection of the node named (as a subject token).
pub type OpenSession = Arc<dyn Fn(Option<Principal>, &str) -> InProcessLink + Send + Sync>;

/// The nodes that answered the last roll call, each as its name (a subject token, [`token`])
/// and the incarnation that answered; empty when unknown.
pub type LiveNodes = Arc<dyn Fn() -> Vec<(String, String)> + Send + Sync>;

struct Hosted {
    tx: futures::channel::mpsc::Sender<String>,
    opened: Instant,
    inbound: Inbound,
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
    let mut sub = subscribe(&client, format!("_MAP.relay.{stream}.*.*.*")).await;
    let mut sessions: HashMap<Key, Hosted> = HashMap::new();
    let grace = roll_call * GRACE_ROLL_CALLS;
    let mut sweep = tokio::time::interval(roll_call);
    // Roll calls in a row each node incarnation with relay sessions was missing from (a node
    // restarted under its name answers with another incarnation: the old one is missing).
    let mut missed: HashMap<(String, String), u32> = HashMap::new();
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
                for (node, incarnation, _) in sessions.keys() {
                    let process = (node.clone(), incarnation.clone());
                    if alive.contains(&process) {
                        missed.remove(&process);
                    } else if !gone.contains(&process) {
                        gone.push(process);
                    }
                }
                for process in gone {
                    *missed.entry(process).or_default() += 1;
                }
                sessions.retain(|(node, incarnation, conn), s| {
                    let dead = s.opened.elapsed() >= grace
                        && missed
                            .get(&(node.clone(), incarnation.clone()))
                            .is_some_and(|m| *m >= MISSED_ROLL_CALLS);
                    if dead {
                        tracing::info!(%node, %incarnation, conn, "relay: the node's process left the roll call; its session ends");
                    }
                    !dead
                });
                missed.retain(|(node, incarnation), _| {
                    sessions.keys().any(|(n, i, _)| n == node && i == incarnation)
                });
                continue;
            }
        };
        let Some(key) = key_of(&msg.subject) else {
            continue;
        };
        let (node, conn) = (key.0.clone(), key.2);
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
                            closed(&client, &stream, &key, CLOSED).await;
                            continue;
                        }
                    }
                };
                let standby_reads_batches = AtomicBool::new(frames::says_it_reads_batches(&msg));
                let InProcessLink { tx, rx } = open(principal, &node);
                let client = client.clone();
                let stream = stream.clone();
                let back = key.clone();
                tokio::spawn(async move {
                    let subject = conn_subject(&stream, &back);
                    let out = Outbound::announcing();
                    if let Err(e) =
                        frames::forward(&client, &subject, rx, out, &standby_reads_batches).await
                    {
                        tracing::warn!(error = %e, "relay: cannot publish; the relay ends");
                    }
                    closed(&client, &stream, &back, CLOSED).await;
                });
                // A second open of one relay (it cannot come from the node, whose numbers
                // are never reused in one process) replaces the first, which ends.
                sessions.insert(
                    key,
                    Hosted {
                        tx,
                        opened: Instant::now(),
                        inbound: Inbound::default(),
                    },
                );
            }
            Some(CLOSE) => {
                sessions.remove(&key);
            }
            Some(MARK) => {
                let lost = sessions
                    .get(&key)
                    .and_then(|s| s.inbound.mark_message(&msg).err());
                if let Some(why) = lost {
                    tracing::warn!(%node, conn, why, "relay: frames from the standby were lost; closing the session");
                    sessions.remove(&key);
                    closed(&client, &stream, &key, LOST).await;
                }
            }
            _ => {
                let Some(session) = sessions.get_mut(&key) else {
                    // A frame for a session this node does not hold (it took over since, or
                    // closed it): the other end learns so at once.
                    closed(&client, &stream, &key, CLOSED).await;
                    continue;
                };
                let texts = match session.inbound.take_message(&msg) {
                    Ok(texts) => texts,
                    Err(why) => {
                        // Ends as a lost connection (the client resumes on its node).
                        tracing::warn!(node = %key.0, conn, why, "relay: an unusable frame; closing the session");
                        sessions.remove(&key);
                        closed(&client, &stream, &key, LOST).await;
                        continue;
                    }
                };
                if texts
                    .into_iter()
                    .any(|text| session.tx.try_send(text).is_err())
                {
                    tracing::warn!(node = %key.0, conn, "relay: the session does not keep up; closing it");
                    sessions.remove(&key);
                    closed(&client, &stream, &key, CLOSED).await;
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

/// Tells the standby that relay session `key` ended (`why`: [`CLOSED`] or [`LOST`]).
async fn closed(client: &async_nats::Client, stream: &str, key: &Key, why: &str) {
    let _ = client
        .publish_with_headers(
            conn_subject(stream, key),
            header(HEADER, why),
            bytes::Bytes::new(),
        )
        .await;
}
