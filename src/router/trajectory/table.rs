//! [`Trajectories`]: every checkpoint the router knows, by id, in time order and by agent, and
//! the content requests waiting for an agent's answer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::protocol::ids::AgentId;
use crate::protocol::json::RawJson;
use crate::protocol::methods::trajectory::{Checkpoint, CheckpointResult};
use crate::router::ids::ConnId;
use crate::store::record::{Audience, EventRecord, StoredRow};

/// Where a checkpoint sits in time order: timestamp, then log position, then id.
pub type OrderKey = (u64, u64, String);

/// One stored checkpoint and who may see it.
#[derive(Debug)]
pub struct Entry {
    /// The checkpoint as answered.
    pub checkpoint: Checkpoint,
    /// Its place in time order.
    pub key: OrderKey,
    /// Who may see it: its event's audience.
    pub audience: Audience,
}

/// An agent's answer to a content request: artifacts, or why there are none.
pub type ContentAnswer = Result<BTreeMap<String, RawJson>, String>;

/// A content request waiting for the agent's `trajectory/content.response`.
#[derive(Debug)]
pub struct PendingContent {
    /// The agent's connection: only it may answer.
    pub conn: ConnId,
    /// Where the answer goes.
    pub reply: oneshot::Sender<ContentAnswer>,
}

/// The checkpoint index.
#[derive(Debug, Default)]
pub struct Trajectories {
    by_id: HashMap<String, Arc<Entry>>,
    order: BTreeSet<OrderKey>,
    by_agent: HashMap<AgentId, BTreeSet<OrderKey>>,
    pending: HashMap<String, PendingContent>,
    next_request: u64,
}

impl Trajectories {
    /// The index of what the store kept: rows of `trajectory.checkpoint` events. A row that
    /// cannot be read is skipped with a warning (it stays in the database).
    pub fn recover(rows: &[StoredRow]) -> Self {
        let mut t = Self::default();
        for row in rows {
            match EventRecord::from_row(row.clone()).and_then(|rec| entry_of(&rec)) {
                Ok(entry) => t.insert(entry),
                Err(e) => {
                    tracing::warn!(event = %row.id, error = %e, "skipping a stored checkpoint")
                }
            }
        }
        t
    }

    /// Number of checkpoints.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// A checkpoint by id.
    pub fn get(&self, id: &str) -> Option<&Arc<Entry>> {
        self.by_id.get(id)
    }

    /// Adds a checkpoint, replacing one with the same id.
    pub fn insert(&mut self, entry: Entry) {
        if let Some(old) = self.by_id.remove(&entry.checkpoint.id) {
            self.order.remove(&old.key);
            if let Some(set) = self.by_agent.get_mut(&old.checkpoint.agent_id) {
                set.remove(&old.key);
                if set.is_empty() {
                    self.by_agent.remove(&old.checkpoint.agent_id);
                }
            }
        }
        self.order.insert(entry.key.clone());
        self.by_agent
            .entry(entry.checkpoint.agent_id.clone())
            .or_default()
            .insert(entry.key.clone());
        self.by_id
            .insert(entry.checkpoint.id.clone(), Arc::new(entry));
    }

    /// Checkpoints newest first, strictly older than `before` when given, of `agent` only when
    /// given.
    pub fn newest_first<'a>(
        &'a self,
        agent: Option<&AgentId>,
        before: Option<&OrderKey>,
    ) -> Box<dyn Iterator<Item = &'a Arc<Entry>> + 'a> {
        let set = match agent {
            Some(a) => match self.by_agent.get(a) {
                Some(s) => s,
                None => return Box::new(std::iter::empty()),
            },
            None => &self.order,
        };
        let keys: Box<dyn Iterator<Item = &OrderKey>> = match before {
            Some(b) => Box::new(set.range(..b.clone()).rev()),
            None => Box::new(set.iter().rev()),
        };
        Box::new(keys.filter_map(|k| self.by_id.get(&k.2)))
    }

    /// Registers a content request for the agent on `conn`; returns its id.
    pub fn await_content(&mut self, conn: ConnId, reply: oneshot::Sender<ContentAnswer>) -> String {
        self.next_request += 1;
        let id = format!("content-{}", self.next_request);
        self.pending
            .insert(id.clone(), PendingContent { conn, reply });
        id
    }

    /// Hands an agent's answer to the waiting request, if `conn` is the one that was asked.
    pub fn answer(&mut self, conn: ConnId, request: &str, answer: ContentAnswer) -> bool {
        match self.pending.get(request) {
            Some(p) if p.conn == conn => {}
            _ => return false,
        }
        match self.pending.remove(request) {
            Some(p) => p.reply.send(answer).is_ok(),
            None => false,
        }
    }

    /// Forgets a request (its caller stopped waiting).
    pub fn forget(&mut self, request: &str) {
        self.pending.remove(request);
    }

    /// Ends the requests waiting on a connection that closed.
    pub fn connection_closed(&mut self, conn: ConnId) {
        let gone: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| p.conn == conn)
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            if let Some(p) = self.pending.remove(&id) {
                let _ = p.reply.send(Err(
                    "the agent's connection closed before it answered".into()
                ));
            }
        }
    }
}

/// The index entry of a `trajectory.checkpoint` event.
///
/// # Errors
/// When the event's data is not a checkpoint.
pub fn entry_of(rec: &EventRecord) -> Result<Entry, String> {
    #[derive(serde::Deserialize)]
    struct Event {
        data: CheckpointResult,
    }
    let ev: Event =
        serde_json::from_str(&rec.json).map_err(|e| format!("not a checkpoint event: {e}"))?;
    let checkpoint = ev.data.checkpoint;
    Ok(Entry {
        key: (checkpoint.timestamp, rec.seq, checkpoint.id.clone()),
        checkpoint,
        audience: rec.audience.clone(),
    })
}
