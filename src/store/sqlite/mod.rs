//! The SQLite event store: one database file, one writer thread with group commit, a small pool
//! of reader threads, retention on disk.
//!
//! Owns `<dir>/events.sqlite3` (plus SQLite's `-wal` and `-shm` files beside it), the lock file
//! `<dir>/LOCK`, and the threads that touch them. While a store is open it holds an exclusive
//! lock on `LOCK` (released by the OS if the process dies), so a second router pointed at the
//! same directory is refused with the first one's pid instead of interleaving writes. Nothing
//! else opens the file; the router only talks to it through
//! [`EventStore`]. The store never interprets a row's `meta` or `json`: it keeps what
//! [`StoredRow`] carries, byte for byte.
//!
//! # Threads
//! - **Writer** (`map-store-writer`, `writer.rs`): owns the only read-write connection. It
//!   blocks for the first queued row, takes whatever else is queued (up to
//!   [`SqliteOptions::max_batch_rows`]), waits at most [`SqliteOptions::group_commit_delay`] for
//!   more, commits them in one transaction (one fsync for the whole group), then publishes
//!   `committed` on a `watch` channel. A failed commit is logged and retried with backoff,
//!   keeping the rows: `committed` never moves past a row that is not in the file. Retention
//!   (`retention.rs`) runs here too, after commits.
//! - **Readers** (`map-store-reader-N`, `reader.rs`): [`READER_THREADS`] threads, each with a
//!   read-only connection. WAL lets them read concurrently with the writer; each request
//!   carries a tokio oneshot for its answer, so a [`StoreFuture`] is a plain future and the
//!   router never blocks.
//!
//! # Durability
//! The file is in WAL mode and every group is one transaction, so a crash (kill -9, panic, power
//! loss) never leaves a half-written group or a corrupt file: reopening recovers exactly a
//! prefix of the log. What that prefix contains depends on [`Synchronous`]:
//! - [`Synchronous::Full`] (default): the WAL is fsynced at each commit, so an event below
//!   `committed` survives power loss and OS crashes.
//! - [`Synchronous::Normal`]: the WAL is fsynced only at checkpoints, so an event below
//!   `committed` survives a crash of the router process, but the last commits before a power
//!   loss or OS crash may be lost. Several times faster on slow disks.
//!
//! # Retention
//! At most once per [`SqliteOptions::retention_interval`], the writer deletes rows older than
//! `max_age`, then the oldest rows beyond `max_events` rows or `max_bytes` bytes of
//! `json` + `meta`, in chunks that never stall commits for long (`retention.rs` says when and
//! how). When retention empties the table, the position (next seq, last id and timestamp) is
//! kept in the `meta` table so that numbering continues after a restart.
//!
//! # Inspecting the file
//! The `sqlite3` CLI can read the file while the router runs (WAL readers do not block the
//! writer); open it read-only:
//!
//! ```text
//! sqlite3 -readonly <dir>/events.sqlite3 \
//!   "SELECT seq, id, datetime(ts / 1000, 'unixepoch'), kind FROM events ORDER BY seq DESC LIMIT 20"
//! sqlite3 -readonly <dir>/events.sqlite3 "SELECT json FROM events WHERE id = '01J...'"
//! sqlite3 -readonly <dir>/events.sqlite3 "SELECT * FROM meta"
//! ```
//!
//! Schema (`schema.rs`, which also migrates older files): `events(seq INTEGER PRIMARY KEY, id
//! TEXT UNIQUE, ts INTEGER, kind TEXT, meta TEXT, json TEXT)` with an index on `(kind, seq)`
//! (a time is found by binary search on `seq`: `reader::first_seq_at_time`), `meta(key,
//! value)` holding `schema_version`, and the kept tables (`kept.rs`: the newest row per key
//! of tasks, checkpoints, conversations, turns and threads, with the columns the router pages
//! them by, written in the same transaction as their events; `claims`). A file written by a
//! newer schema version is refused rather than misread.
//!
//! # Files
//! - `mod.rs`: [`SqliteStore`] (the handle: `open` starts the threads, the [`EventStore`] impl
//!   sends rows to the writer and requests to the readers, `close` waits for them).
//! - `options.rs`: [`SqliteOptions`] and their defaults, [`Synchronous`], the counters the
//!   threads share with the handle. A leaf, so that no file imports in a circle
//!   (`tests/layering.rs`).
//! - `dir_lock.rs`: the directory's `LOCK` file.
//! - `open.rs`: the connections' settings and the recovery of the position at open.
//! - `writer.rs`: the writer thread, group commit, retries.
//! - `retention.rs`: the writer's retention passes.
//! - `reader.rs`: the reader threads and their queries.
//! - `schema.rs`, `kept.rs`, `sql.rs`: the schema and its migration, the kept tables, the
//!   helpers they all share (among them a row's bytes, which the writer counts and retention
//!   budgets).

mod dir_lock;
mod kept;
mod open;
mod options;
mod reader;
mod retention;
mod schema;
mod sql;
mod writer;

pub use dir_lock::LOCK_FILE_NAME;
pub use options::{
    SqliteOptions, Synchronous, DB_FILE_NAME, DEFAULT_GROUP_COMMIT_DELAY, DEFAULT_MAX_BATCH_ROWS,
    DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS, DEFAULT_RECENT_ROWS, DEFAULT_RETENTION_INTERVAL,
};
pub use reader::READER_THREADS;
pub use schema::SCHEMA_VERSION;

use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use rusqlite::Connection;
use tokio::sync::{oneshot, watch};

use crate::protocol::ids::EventId;
use crate::store::record::EventRecord;
use crate::store::record::StoredRow;
use crate::store::sqlite::sql::sql_err;
use crate::store::EventStore;
use crate::store::Recovered;
use crate::store::StoreError;
use crate::store::StoreFuture;
use crate::sync::lock;
use dir_lock::lock_dir;
use open::{configure_writer, open_reader, recover};
use options::Shared;
use reader::{reader_loop, ReadRequest};
use writer::{Incoming, Writer};

/// What `close` waits for.
struct Exits {
    /// The writer's final result (`Err` when queued rows could not be committed), sent once
    /// every thread is done with the file.
    writer: oneshot::Receiver<Result<(), StoreError>>,
    /// Joined after that signal, when the threads are already returning.
    threads: Vec<JoinHandle<()>>,
}

/// The SQLite [`EventStore`]. Open it with [`SqliteStore::open`].
pub struct SqliteStore {
    path: PathBuf,
    /// Rows to the writer; `None` once closed.
    writer: Mutex<Option<mpsc::Sender<Incoming>>>,
    /// Requests to the readers; `None` once closed.
    readers: Mutex<Option<mpsc::Sender<ReadRequest>>>,
    committed: watch::Receiver<u64>,
    shared: Arc<Shared>,
    exits: Mutex<Option<Exits>>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .field("first_seq", &self.first_seq())
            .field("committed", &*self.committed.borrow())
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (or creates) the database in `options.dir`, recovers its position, and starts the
    /// writer and reader threads.
    ///
    /// # Errors
    /// The directory or file cannot be created or opened, the file is not a database, was
    /// written by a newer schema version, or holds a row this version cannot read.
    pub fn open(options: SqliteOptions) -> Result<(Arc<SqliteStore>, Recovered), StoreError> {
        std::fs::create_dir_all(&options.dir)
            .map_err(|e| StoreError::Io(format!("creating {}: {e}", options.dir.display())))?;
        let dir_lock = lock_dir(&options.dir)?;
        let path = options.dir.join(DB_FILE_NAME);
        let context = |what: &str| format!("{what} {}", path.display());

        let mut conn = Connection::open(&path).map_err(|e| sql_err(&context("opening"), e))?;
        configure_writer(&conn, options.synchronous, &path)?;
        schema::init_schema(&mut conn, &path)?;
        let state = recover(&conn, options.recent_rows)?;
        tracing::info!(
            path = %path.display(),
            next_seq = state.recovered.next_seq,
            first_seq = state.recovered.first_seq,
            bytes = state.bytes,
            "event store opened"
        );

        let shared = Arc::new(Shared {
            first_seq: AtomicU64::new(state.recovered.first_seq),
            commits: AtomicU64::new(0),
        });
        let (committed_tx, committed_rx) = watch::channel(state.recovered.next_seq);

        let mut threads = Vec::with_capacity(READER_THREADS + 1);
        let mut reader_exits = Vec::with_capacity(READER_THREADS);
        let (read_tx, read_rx) = mpsc::channel::<ReadRequest>();
        let read_rx = Arc::new(Mutex::new(read_rx));
        for i in 0..READER_THREADS {
            let conn = open_reader(&path).map_err(|e| sql_err(&context("opening"), e))?;
            let (exit_tx, exit_rx) = oneshot::channel();
            let rx = Arc::clone(&read_rx);
            let committed = committed_rx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("map-store-reader-{i}"))
                .spawn(move || reader_loop(conn, &rx, &committed, exit_tx))
                .map_err(|e| StoreError::Io(format!("starting a reader thread: {e}")))?;
            threads.push(handle);
            reader_exits.push(exit_rx);
        }

        let (write_tx, write_rx) = mpsc::channel();
        let (writer_exit_tx, writer_exit_rx) = oneshot::channel();
        let writer = Writer {
            conn,
            rx: write_rx,
            group_commit_delay: options.group_commit_delay,
            max_batch_rows: options.max_batch_rows.max(1),
            max_age: options.max_age,
            max_events: options.max_events,
            max_bytes: options.max_bytes,
            retention_interval: options.retention_interval,
            metrics: options.metrics.clone(),
            queue: VecDeque::new(),
            batch: Vec::new(),
            disconnected: false,
            expected_seq: state.recovered.next_seq,
            committed_next: state.recovered.next_seq,
            first_seq: state.recovered.first_seq,
            last_id: state.recovered.last_id.map(|id| id.to_string()),
            last_ts: state.recovered.last_timestamp,
            bytes: state.bytes,
            shared: Arc::clone(&shared),
            committed: committed_tx,
            // Due at once: limits lowered since the last run apply right after open.
            retention_due: Instant::now(),
            retention_backlog: true,
            retention_pending: false,
        };
        let handle = std::thread::Builder::new()
            .name("map-store-writer".into())
            .spawn(move || {
                let mut writer = writer;
                let result = writer.run();
                // NB. The readers end when their channel closes, which happens with the writer's.
                // Waiting for them before closing the write connection makes it the last one, so
                // SQLite checkpoints the WAL into the main file and removes it on a clean close.
                for reader in reader_exits {
                    let _ = reader.blocking_recv();
                }
                drop(writer);
                // The directory is free for the next opener once the file is closed.
                drop(dir_lock);
                // Nothing touches the file once `close` learns the result.
                let _ = writer_exit_tx.send(result);
            })
            .map_err(|e| StoreError::Io(format!("starting the writer thread: {e}")))?;
        threads.push(handle);

        let store = Arc::new(SqliteStore {
            path,
            writer: Mutex::new(Some(write_tx)),
            readers: Mutex::new(Some(read_tx)),
            committed: committed_rx,
            shared,
            exits: Mutex::new(Some(Exits {
                writer: writer_exit_rx,
                threads,
            })),
        });
        Ok((store, state.recovered))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Transactions that appended rows since open (group commit makes this far smaller than the
    /// number of rows). For tests and metrics.
    pub fn commit_count(&self) -> u64 {
        self.shared.commits.load(Ordering::Relaxed)
    }

    /// Sends a request to the reader threads and returns the answer as a future.
    fn ask<T: Send + 'static>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> ReadRequest,
    ) -> StoreFuture<T> {
        let (reply, answer) = oneshot::channel();
        let sent = lock(&self.readers)
            .as_ref()
            .is_some_and(|tx| tx.send(make(reply)).is_ok());
        Box::pin(async move {
            if !sent {
                return Err(StoreError::Closed);
            }
            // A dropped reply means the reader thread ended (closed or panicked).
            answer.await.unwrap_or(Err(StoreError::Closed))
        })
    }
}

impl SqliteStore {
    /// Hands rows or records to the writer thread; never blocks.
    fn send(&self, incoming: Incoming) {
        let (rows, first) = incoming.extent();
        if rows == 0 {
            return;
        }
        let guard = lock(&self.writer);
        let Some(tx) = guard.as_ref() else {
            tracing::error!(
                rows,
                first,
                "event store: append after close; rows not stored"
            );
            return;
        };
        if tx.send(incoming).is_err() {
            tracing::error!(
                rows,
                first,
                "event store: the writer thread has stopped; rows not stored"
            );
        }
    }
}

impl EventStore for SqliteStore {
    fn append(&self, rows: Vec<StoredRow>) {
        self.send(Incoming::Rows(rows));
    }

    fn append_records(&self, records: Vec<Arc<EventRecord>>) {
        self.send(Incoming::Records(records));
    }

    fn committed(&self) -> watch::Receiver<u64> {
        self.committed.clone()
    }

    fn first_seq(&self) -> u64 {
        self.shared.first_seq.load(Ordering::Acquire)
    }

    fn read(&self, from: u64, limit: usize) -> StoreFuture<Vec<StoredRow>> {
        self.ask(|reply| ReadRequest::Rows { from, limit, reply })
    }

    fn seq_after(&self, id: EventId) -> StoreFuture<u64> {
        let id = id.to_string();
        self.ask(|reply| ReadRequest::SeqAfter { id, reply })
    }

    fn seq_at_or_after_time(&self, ts: u64) -> StoreFuture<u64> {
        self.ask(|reply| ReadRequest::SeqAtTime { ts, reply })
    }

    fn read_kinds(
        &self,
        kinds: Vec<String>,
        from: u64,
        limit: usize,
    ) -> StoreFuture<Vec<StoredRow>> {
        self.ask(|reply| ReadRequest::Kinds {
            kinds,
            from,
            limit,
            reply,
        })
    }

    fn read_ids(&self, ids: Vec<EventId>) -> StoreFuture<Vec<StoredRow>> {
        let ids = ids.iter().map(ToString::to_string).collect();
        self.ask(|reply| ReadRequest::Ids { ids, reply })
    }

    fn kept(
        &self,
        query: crate::store::kept::KeptQuery,
    ) -> StoreFuture<crate::store::kept::KeptAnswer> {
        self.ask(|reply| ReadRequest::Kept { query, reply })
    }

    fn close(&self) -> StoreFuture<()> {
        // Dropping the senders is the stop signal: each thread first drains what was queued
        // before it (the writer commits it all), then ends.
        drop(lock(&self.writer).take());
        drop(lock(&self.readers).take());
        let exits = lock(&self.exits).take();
        Box::pin(async move {
            let Some(exits) = exits else {
                return Ok(());
            };
            let result = exits
                .writer
                .await
                .unwrap_or_else(|_| Err(StoreError::Io("the writer thread panicked".into())));
            // Each thread has signalled and is only returning now, so these joins are immediate.
            for thread in exits.threads {
                let _ = thread.join();
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let o = SqliteOptions::new("/tmp/x");
        assert_eq!(o.synchronous, Synchronous::Full);
        assert_eq!(o.max_events, 10_000_000);
        assert_eq!(o.max_bytes, 1 << 30);
        assert_eq!(o.max_age, None);
        assert_eq!(o.recent_rows, 100_000);
        assert_eq!(Synchronous::Normal.pragma(), "NORMAL");
    }
}
