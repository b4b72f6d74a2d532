//! Durable storage for the event log, behind a small trait.
//!
//! The router's in-memory event log is the hot window
//! that live delivery reads; an [`EventStore`] is where every event is also appended so that it
//! survives restarts, can be replayed beyond the memory window, and bounds what a slow
//! subscriber can fall behind by retention on disk rather than in memory. The default store is
//! SQLite ([`sqlite`]); the trait is small so that a NATS JetStream store can be added for
//! multi-node deployments. With no store (`--ephemeral`) everything lives in memory.
//!
//! Contract:
//! - `append` (rows) and `append_records` (logged events, which the store turns into rows on
//!   its own thread) are called by the router task only, in sequence order and contiguous with
//!   everything appended before; they never block (the store queues and commits on its own
//!   thread, in groups).
//! - `committed` reports durability: every sequence number below its value is committed as the
//!   store's durability level defines. Callers that must not answer before their events are
//!   durable wait on it.
//! - Reads (`read`, positions) run on the store's own threads and never block the router.
//! - Retention may delete the oldest rows at any time; `first_seq` says where the log now
//!   starts, and a read from before it returns what is left (the caller detects the gap).
//! - The kept tables ([`kept`]: tasks, checkpoints, conversations, turns, threads, claims) hold
//!   the newest row per key of some event types, and retention never trims them. They are
//!   written in the same transaction as their events, so a kept row is committed exactly when
//!   its event is; [`EventStore::kept`] reads them (committed rows only) on the reader threads.
//!   Only the claims come back whole at open: the router pages the others on demand.

#[cfg(feature = "cluster")]
pub mod jetstream;
pub mod kept;
pub mod memory;
pub mod record;
pub mod sqlite;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::watch;

use crate::protocol::ids::EventId;
use crate::store::record::EventRecord;
use crate::store::record::StoredRow;

/// A store operation's result, resolved on the store's threads.
pub type StoreFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

/// The storage rows of logged events (records without an id, which are never logged, have
/// none).
pub fn rows_of(records: &[Arc<EventRecord>]) -> Vec<StoredRow> {
    records.iter().filter_map(|r| r.to_row()).collect()
}

/// A storage failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database could not be opened, read or written.
    #[error("event store: {0}")]
    Io(String),
    /// A stored row this version cannot read.
    #[error("event store: corrupt record: {0}")]
    Corrupt(String),
    /// The store was closed.
    #[error("event store is closed")]
    Closed,
    /// Another process holds the data directory.
    #[error("event store: {0}")]
    Locked(String),
}

/// What a store found when it opened.
#[derive(Debug, Clone, Default)]
pub struct Recovered {
    /// The sequence number the next event gets.
    pub next_seq: u64,
    /// The oldest retained sequence number (`next_seq` when empty).
    pub first_seq: u64,
    /// The id of the newest stored event, so new ids continue after it.
    pub last_id: Option<EventId>,
    /// The timestamp of the newest stored event, so timestamps never go backwards.
    pub last_timestamp: u64,
    /// The newest rows, oldest first, to warm the in-memory window.
    pub recent: Vec<StoredRow>,
    /// How many tasks, conversations and checkpoints the kept tables hold (the rows
    /// themselves stay in the store: the router pages them, `EventStore::kept`).
    pub kept_counts: kept::KeptCounts,
    /// The row of the newest `identity.claimed` event of every id still owned (a release
    /// deletes its id's row), which retention does not trim.
    pub claims: Vec<StoredRow>,
    /// Cluster mode: the newest `state.saved` row of every session, agent and scope not
    /// dropped since (`router::handover`), oldest first. Only the JetStream store folds them;
    /// a single router writes none.
    pub saved: Vec<StoredRow>,
}

/// How many saved records (`Recovered::saved`) a standby holds, by kind: what a takeover
/// would restore now (`router::handover`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SavedCounts {
    /// Sessions.
    pub sessions: usize,
    /// Agents.
    pub agents: usize,
    /// Scopes.
    pub scopes: usize,
}

/// Where the event log is kept durably.
pub trait EventStore: Send + Sync + std::fmt::Debug {
    /// Queues rows for durable append: in sequence order, contiguous with what came before.
    /// Never blocks.
    fn append(&self, rows: Vec<StoredRow>);

    /// Queues logged events for durable append, with the same contract as [`Self::append`].
    /// The router calls this one, so that a store can turn records into rows on its own
    /// thread (building a row copies the event's JSON); this default converts here.
    fn append_records(&self, records: Vec<Arc<EventRecord>>) {
        self.append(rows_of(&records));
    }

    /// Durability progress: every sequence number below the value is committed.
    fn committed(&self) -> watch::Receiver<u64>;

    /// The oldest retained sequence number (moves forward as retention deletes rows).
    fn first_seq(&self) -> u64;

    /// The position after the newest row the log holds now, as its writer committed it: what
    /// this store has committed, for the store a router writes; the stream's own end, asked of
    /// NATS, for a follower's (what a read must wait to have followed to show a relayed
    /// call's changes, `router::relay`).
    fn head(&self) -> StoreFuture<u64> {
        let committed = *self.committed().borrow();
        Box::pin(async move { Ok(committed) })
    }

    /// The sequence number of the first event a fresh store holds (SQLite's 0; JetStream
    /// numbers from 1). A `first_seq` at or below it means retention never deleted anything.
    fn origin(&self) -> u64 {
        0
    }

    /// Up to `limit` rows with `seq >= from`, in sequence order.
    fn read(&self, from: u64, limit: usize) -> StoreFuture<Vec<StoredRow>>;

    /// The first sequence number whose event id is greater than `id`. Ids are monotonic, so
    /// this is a position even for an id that was never stored or has been deleted.
    fn seq_after(&self, id: EventId) -> StoreFuture<u64>;

    /// The first sequence number whose timestamp is at least `ts` (Unix ms).
    fn seq_at_or_after_time(&self, ts: u64) -> StoreFuture<u64>;

    /// Up to `limit` rows whose `kind` is one of `kinds`, with `seq >= from`, in sequence order
    /// (recovery reads the lifecycle events of the previous run with it).
    fn read_kinds(
        &self,
        kinds: Vec<String>,
        from: u64,
        limit: usize,
    ) -> StoreFuture<Vec<StoredRow>>;

    /// The retained rows with these event ids, in sequence order (recovery finds the message of
    /// each message still queued with it).
    fn read_ids(&self, ids: Vec<EventId>) -> StoreFuture<Vec<StoredRow>>;

    /// Reads the kept tables ([`kept::KeptQuery`]): committed rows only.
    fn kept(&self, query: kept::KeptQuery) -> StoreFuture<kept::KeptAnswer>;

    /// Commits what is queued, then stops the store's threads.
    fn close(&self) -> StoreFuture<()>;
}
