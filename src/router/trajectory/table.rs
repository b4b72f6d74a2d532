//! [`Trajectories`]: the checkpoints the router holds in memory, a bounded cache of the store's
//! `checkpoints` table (which has every checkpoint: the router pages the rest from it,
//! `router::kept`), how many there are, and the content requests waiting for an agent's answer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::protocol::json::RawJson;
use crate::protocol::methods::trajectory::{Checkpoint, CheckpointResult};
use crate::router::ids::ConnId;
use crate::router::kept::cache::Cache;
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

/// The checkpoints' part in memory.
#[derive(Debug)]
pub struct Trajectories {
    /// Checkpoints by id: those in use, at most about its capacity, plus writes not yet
    /// committed.
    pub cache: Cache<Entry>,
    /// How many checkpoints exist (the gauge `map_checkpoints`).
    pub total: u64,
    /// Content requests waiting on agents (each ends with an answer, its connection closing,
    /// or its caller's timeout).
    pending: HashMap<String, PendingContent>,
    next_request: u64,
}

impl Trajectories {
    /// A cache of `capacity` checkpoints, over `total` stored ones.
    pub fn new(capacity: usize, total: u64) -> Self {
        Self {
            cache: Cache::new(capacity),
            total,
            pending: HashMap::new(),
            next_request: 0,
        }
    }

    /// Number of checkpoints.
    pub fn len(&self) -> usize {
        self.total as usize
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Content requests waiting (for stats).
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Stores the router's write of a checkpoint (its event at `written`).
    pub fn put(&mut self, entry: Entry, written: u64) {
        let id = entry.checkpoint.id.clone();
        self.cache.put(&id, Arc::new(entry), written);
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

/// The entry of a `trajectory.checkpoint` event.
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

/// The entry of a stored checkpoint row.
///
/// # Errors
/// A row this version cannot read.
pub fn entry_of_row(row: StoredRow) -> Result<Entry, String> {
    entry_of(&EventRecord::from_row(row)?)
}
