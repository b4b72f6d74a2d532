//! Which nodes serve a stream: every node (the writer and each standby) answers a roll call on
//! the core NATS subject `_MAP.nodes.<stream>` (outside the stream: nothing is stored) with its
//! [`NodeStatus`], and [`roll_call`] asks them all at once and gathers the answers for a short,
//! fixed time.
//!
//! Owns the answering task of a node (its caller keeps the handle and aborts it) and this
//! process's *incarnation* ([`incarnation`]): a random id each answer carries, so that a node
//! restarted under the same name is told from its predecessor (the live node ends the
//! predecessor's relay sessions, `server::relay`), and a second live process with a node's
//! name is seen (it refuses to start, `server::cluster`).
//! A node killed with SIGKILL stops answering at once (its connection is gone); a host that
//! vanishes without closing its socket answers no more either, so it drops out of the next
//! roll call.

use std::time::Duration;

use futures::StreamExt as _;
use serde::{Deserialize, Serialize};

use super::reader::nats_err;
use crate::store::StoreError;

/// Answers gathered by one roll call at most (a bound on what a misbehaving peer can add).
const MAX_NODES: usize = 256;

/// What a node says of itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Its `[cluster] node` name.
    pub node: String,
    /// `writer` (it writes the stream), `standby` (it follows it and takes over) or
    /// `diverged` (it wrote the stream until another node took over or the stream diverged
    /// from its log: it publishes nothing more).
    pub role: String,
    /// The seq after the newest row it holds: committed for the writer, followed for a
    /// standby (a standby behind the writer is catching up).
    pub position: u64,
    /// The process that answered: random per process ([`incarnation`]; set by [`answer`],
    /// whatever the status says), empty from a node of an older version.
    #[serde(default)]
    pub incarnation: String,
}

/// This process's incarnation: 16 random hex digits, drawn once (a subject token).
pub(super) fn incarnation() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| uuid::Uuid::new_v4().simple().to_string()[..16].to_owned())
}

impl NodeStatus {
    /// This process's incarnation (what its roll call answers carry).
    pub fn this_incarnation() -> &'static str {
        incarnation()
    }
}

/// The roll call's subject for `stream`.
fn subject(stream: &str) -> String {
    format!("_MAP.nodes.{stream}")
}

/// Answers roll calls on `stream` with what `status` says at the time, until aborted.
pub(super) fn answer(
    client: async_nats::Client,
    stream: &str,
    status: impl Fn() -> NodeStatus + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let subject = subject(stream);
    tokio::spawn(async move {
        let mut sub = match client.subscribe(subject).await {
            Ok(sub) => sub,
            Err(e) => {
                tracing::warn!(error = %e, "cluster: cannot answer the roll call of nodes");
                return;
            }
        };
        while let Some(msg) = sub.next().await {
            let Some(reply) = msg.reply else { continue };
            let status = NodeStatus {
                incarnation: incarnation().to_owned(),
                ..status()
            };
            match serde_json::to_vec(&status) {
                Ok(body) => {
                    let _ = client.publish(reply, body.into()).await;
                }
                Err(e) => tracing::warn!(error = %e, "cluster: roll call answer"),
            }
        }
    })
}

/// Asks every node of `stream` and gathers what answers within `wait`, sorted by name.
///
/// # Errors
/// NATS is unreachable (the question cannot be sent).
pub(super) async fn roll_call(
    client: &async_nats::Client,
    stream: &str,
    wait: Duration,
) -> Result<Vec<NodeStatus>, StoreError> {
    let what = "the roll call of nodes";
    let inbox = client.new_inbox();
    let mut answers = client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| nats_err(what, e))?;
    client
        .publish_with_reply(subject(stream), inbox, bytes::Bytes::new())
        .await
        .map_err(|e| nats_err(what, e))?;
    let deadline = tokio::time::Instant::now() + wait;
    let mut nodes = Vec::new();
    while nodes.len() < MAX_NODES {
        match tokio::time::timeout_at(deadline, answers.next()).await {
            Ok(Some(msg)) => match serde_json::from_slice::<NodeStatus>(&msg.payload) {
                Ok(node) => nodes.push(node),
                Err(e) => tracing::debug!(error = %e, "cluster: a roll call answer not understood"),
            },
            Ok(None) | Err(_) => break,
        }
    }
    let _ = answers.unsubscribe().await;
    nodes.sort_by(|a, b| a.node.cmp(&b.node).then(a.role.cmp(&b.role)));
    Ok(nodes)
}
