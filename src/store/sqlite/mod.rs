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
//! - **Writer** (`map-store-writer`): owns the only read-write connection. It blocks for the
//!   first queued row, takes whatever else is queued (up to [`SqliteOptions::max_batch_rows`]),
//!   waits at most [`SqliteOptions::group_commit_delay`] for more, commits them in one
//!   transaction (one fsync for the whole group), then publishes `committed` on a `watch`
//!   channel. A failed commit is logged and retried with backoff, keeping the rows: `committed`
//!   never moves past a row that is not in the file. Retention runs here too, after commits.
//! - **Readers** (`map-store-reader-N`): [`READER_THREADS`] threads, each with a read-only
//!   connection. WAL lets them read concurrently with the writer; each request carries a tokio
//!   oneshot for its answer, so a [`StoreFuture`] is a plain future and the router never blocks.
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
//! At most once per [`SqliteOptions::retention_interval`], after a commit (or while idle when
//! rows can expire by age), the writer deletes rows older than `max_age`, then the oldest rows
//! while the log holds more than `max_events` rows or more than `max_bytes` bytes of
//! `json` + `meta` (the byte total is computed once at open and tracked after that). Deletes go
//! in chunks so that a large backlog never stalls commits for long. When retention empties the
//! table, the position (next seq, last id and timestamp) is kept in the `meta` table so that
//! numbering continues after a restart.
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
//! TEXT UNIQUE, ts INTEGER, kind TEXT, meta TEXT, json TEXT)` with indexes on `ts` and
//! `(kind, seq)`, `meta(key, value)` holding `schema_version`, and the kept tables (`kept.rs`:
//! the newest row per key of tasks, checkpoints, conversations, turns and threads, with the
//! columns the router pages them by, written in the same transaction as their events;
//! `claims`). A file written by a newer schema version is refused rather than misread.
//!
//! Files: `mod.rs` (opening, the writer, the readers), `schema.rs`, `kept.rs`, `sql.rs` (the
//! helpers they share).

mod dir_lock;
mod kept;
mod open;
mod reader;
mod retention;
mod schema;
mod sql;

pub use dir_lock::LOCK_FILE_NAME;
pub use reader::READER_THREADS;
pub use schema::SCHEMA_VERSION;

use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, TransactionBehavior};
use tokio::sync::{oneshot, watch};

use crate::protocol::ids::EventId;
use crate::store::record::EventRecord;
use crate::store::record::StoredRow;
use crate::store::sqlite::sql::{sql_err, sql_int};
use crate::store::EventStore;
use crate::store::Recovered;
use crate::store::StoreError;
use crate::store::StoreFuture;
use dir_lock::lock_dir;
use open::{configure_writer, open_reader, recover};
use reader::{reader_loop, ReadRequest};
use retention::{row_bytes, IDLE_RETENTION_MIN};

/// The database file inside [`SqliteOptions::dir`].
pub const DB_FILE_NAME: &str = "events.sqlite3";

/// How long the writer waits for more rows after the first one before committing. Zero by
/// default: the writer already batches everything that queued during the previous commit, so a
/// burst shares fsyncs without any wait (measured: the same bulk throughput at 0 and 2 ms), and
/// a lone event is not delayed. Raise it on disks where an fsync costs several milliseconds.
pub const DEFAULT_GROUP_COMMIT_DELAY: Duration = Duration::ZERO;

/// The most rows in one transaction. 4096 rows of a few hundred bytes are 1 to 2 MB of WAL:
/// large enough that the fsync is amortized, small enough that one commit stays in the
/// millisecond range and `committed` advances steadily under a flood.
pub const DEFAULT_MAX_BATCH_ROWS: usize = 4096;

/// Retention by count: ten million events, a few GB at most, replayable for days at typical
/// rates. The byte bound usually binds first.
pub const DEFAULT_MAX_EVENTS: u64 = 10_000_000;

/// Retention by size of `json` + `meta`: 1 GiB, comfortable on any server disk and still quick
/// to scan at open.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

/// How often retention may run: once a second keeps the overshoot small (one second of
/// events) without spending a delete transaction per commit.
pub const DEFAULT_RETENTION_INTERVAL: Duration = Duration::from_secs(1);

/// How many of the newest rows [`SqliteStore::open`] returns to warm the in-memory window:
/// 100 000 rows (tens of MB) cover the typical resume gap without a disk read.
pub const DEFAULT_RECENT_ROWS: usize = 100_000;

/// The first wait after a failed commit; doubled at each further failure.
const RETRY_BACKOFF_START: Duration = Duration::from_millis(10);

/// The longest wait between commit attempts: a transient fault (a full disk being cleaned, a
/// lock held by an external `sqlite3`) is retried promptly, a lasting one is not spun on.
const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// After `close` (or the store being dropped), how long a failing commit is still retried
/// before the writer gives up and reports the queued rows as not stored. Without a bound a
/// broken disk would make shutdown hang forever.
const CLOSE_RETRY_LIMIT: Duration = Duration::from_secs(10);

/// The claims table (`router::identities`): the newest claim per id; a release deletes it, so
/// the table holds exactly the ids owned now. (The other kept tables are `kept.rs`'s.)
const CLAIMS_UPSERT: &str = "INSERT INTO claims (claim, seq, id, ts, kind, meta, json) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (claim) DO UPDATE SET seq = excluded.seq, \
     id = excluded.id, ts = excluded.ts, kind = excluded.kind, meta = excluded.meta, \
     json = excluded.json";
const CLAIMS_DELETE: &str = "DELETE FROM claims WHERE claim = ?1";

const INSERT_SQL: &str =
    "INSERT INTO events (seq, id, ts, kind, meta, json) VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

/// How the writer syncs commits (SQLite `PRAGMA synchronous`, in WAL mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Synchronous {
    /// fsync at every commit: a committed event survives power loss.
    #[default]
    Full,
    /// fsync at checkpoints only: a committed event survives a crash of the router process; the
    /// last commits before a power loss may be lost. Never corrupts.
    Normal,
}

impl Synchronous {
    /// The `PRAGMA synchronous` value.
    fn pragma(self) -> &'static str {
        match self {
            Self::Full => "FULL",
            Self::Normal => "NORMAL",
        }
    }
}

/// How to open a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// Directory holding the database (created if missing).
    pub dir: PathBuf,
    /// Durability level.
    pub synchronous: Synchronous,
    /// Wait for more rows after the first before committing ([`DEFAULT_GROUP_COMMIT_DELAY`]).
    pub group_commit_delay: Duration,
    /// Most rows per transaction ([`DEFAULT_MAX_BATCH_ROWS`]).
    pub max_batch_rows: usize,
    /// Delete rows older than this (by event timestamp); `None` keeps them by age.
    pub max_age: Option<Duration>,
    /// Keep at most this many rows ([`DEFAULT_MAX_EVENTS`]).
    pub max_events: u64,
    /// Keep at most this many bytes of `json` + `meta` ([`DEFAULT_MAX_BYTES`]).
    pub max_bytes: u64,
    /// Run retention at most this often ([`DEFAULT_RETENTION_INTERVAL`]).
    pub retention_interval: Duration,
    /// Newest rows returned in [`Recovered::recent`] ([`DEFAULT_RECENT_ROWS`]).
    pub recent_rows: usize,
    /// Where each commit's duration and size are observed (`None`: not measured).
    pub metrics: Option<crate::metrics::StoreMetrics>,
}

impl SqliteOptions {
    /// The defaults, with the database in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            synchronous: Synchronous::default(),
            group_commit_delay: DEFAULT_GROUP_COMMIT_DELAY,
            max_batch_rows: DEFAULT_MAX_BATCH_ROWS,
            max_age: None,
            max_events: DEFAULT_MAX_EVENTS,
            max_bytes: DEFAULT_MAX_BYTES,
            retention_interval: DEFAULT_RETENTION_INTERVAL,
            recent_rows: DEFAULT_RECENT_ROWS,
            metrics: None,
        }
    }
}

/// Counters shared between the writer thread and the handle.
#[derive(Debug, Default)]
struct Shared {
    /// The oldest retained seq; written by the writer after each retention delete.
    first_seq: AtomicU64,
    /// Transactions that appended rows.
    commits: AtomicU64,
}

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

use crate::sync::lock;

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

/// What the writer thread receives: rows, or logged events it turns into rows itself.
enum Incoming {
    Rows(Vec<StoredRow>),
    Records(Vec<Arc<EventRecord>>),
}

impl Incoming {
    /// How many, and the first sequence number (for error reports).
    fn extent(&self) -> (usize, u64) {
        match self {
            Self::Rows(rows) => (rows.len(), rows.first().map_or(0, |r| r.seq)),
            Self::Records(records) => (records.len(), records.first().map_or(0, |r| r.seq)),
        }
    }

    fn into_rows(self) -> Vec<StoredRow> {
        match self {
            Self::Rows(rows) => rows,
            Self::Records(records) => crate::store::rows_of(&records),
        }
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

// ---------------------------------------------------------------------------------------------
// The writer

/// The writer thread's state. Only this thread writes the file.
struct Writer {
    conn: Connection,
    rx: mpsc::Receiver<Incoming>,
    group_commit_delay: Duration,
    max_batch_rows: usize,
    max_age: Option<Duration>,
    max_events: u64,
    max_bytes: u64,
    retention_interval: Duration,
    metrics: Option<crate::metrics::StoreMetrics>,
    /// Received, not yet in a transaction.
    queue: VecDeque<StoredRow>,
    /// The group being committed; kept across failed attempts.
    batch: Vec<StoredRow>,
    /// Every sender is gone (closed or dropped): commit what is left and stop.
    disconnected: bool,
    /// The seq the next received row should have.
    expected_seq: u64,
    /// One past the last committed seq.
    committed_next: u64,
    /// The oldest retained seq (mirrored in `shared.first_seq`).
    first_seq: u64,
    /// Id and timestamp of the last committed row, kept in `meta` when retention empties the
    /// table.
    last_id: Option<String>,
    last_ts: u64,
    /// Bytes of `json` + `meta` in the table.
    bytes: u64,
    shared: Arc<Shared>,
    committed: watch::Sender<u64>,
    /// When retention may next run.
    retention_due: Instant,
    /// The last pass ran out of time with rows still to delete.
    retention_backlog: bool,
    /// Rows were committed since the last pass, which was too recent to run again.
    retention_pending: bool,
}

impl Writer {
    /// Commits groups until every sender is gone and everything queued is committed.
    ///
    /// # Errors
    /// Only after a close, when rows could not be committed within [`CLOSE_RETRY_LIMIT`].
    fn run(&mut self) -> Result<(), StoreError> {
        loop {
            if self.queue.is_empty() {
                if self.disconnected {
                    return Ok(());
                }
                self.wait_idle();
                continue;
            }
            self.gather();
            self.commit_batch()?;
            if Instant::now() >= self.retention_due {
                self.retain();
            } else {
                // Not due yet: the idle wait runs it when it is, so that the last commits
                // before a quiet spell are not left over the limits.
                self.retention_pending = true;
            }
        }
    }

    /// Blocks until rows arrive, waking for retention when rows may expire by age, commits
    /// happened since the last pass, or a previous pass left work.
    fn wait_idle(&mut self) {
        let received = if self.retention_backlog || self.retention_pending {
            let left = self.retention_due.saturating_duration_since(Instant::now());
            self.rx.recv_timeout(left)
        } else if self.max_age.is_some() {
            // NB. At least IDLE_RETENTION_MIN, so that a zero interval does not spin while idle.
            let left = self.retention_due.saturating_duration_since(Instant::now());
            self.rx.recv_timeout(left.max(IDLE_RETENTION_MIN))
        } else {
            self.rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
        };
        match received {
            Ok(rows) => self.enqueue(rows),
            Err(RecvTimeoutError::Timeout) => self.retain(),
            Err(RecvTimeoutError::Disconnected) => self.disconnected = true,
        }
    }

    /// Takes what is queued, waits up to the group commit delay for more, and moves up to
    /// `max_batch_rows` rows into the batch.
    fn gather(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(rows) => self.enqueue(rows),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.disconnected = true;
                    break;
                }
            }
        }
        let deadline = Instant::now() + self.group_commit_delay;
        while self.queue.len() < self.max_batch_rows && !self.disconnected {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match self.rx.recv_timeout(left) {
                Ok(rows) => self.enqueue(rows),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => self.disconnected = true,
            }
        }
        let n = self.queue.len().min(self.max_batch_rows);
        self.batch.extend(self.queue.drain(..n));
    }

    /// Queues received rows, checking the contract (contiguous seqs).
    fn enqueue(&mut self, incoming: Incoming) {
        for row in incoming.into_rows() {
            if row.seq < self.expected_seq {
                // Its position is already taken: inserting it would fail forever and wedge
                // every later commit. A caller bug, reported loudly.
                tracing::error!(
                    seq = row.seq,
                    expected = self.expected_seq,
                    id = %row.id,
                    "event store: rejected a row whose sequence number is already used"
                );
                continue;
            }
            if row.seq > self.expected_seq {
                tracing::warn!(
                    seq = row.seq,
                    expected = self.expected_seq,
                    "event store: gap in appended sequence numbers"
                );
            }
            self.expected_seq = row.seq + 1;
            self.queue.push_back(row);
        }
    }

    /// Commits the batch, retrying with backoff until it succeeds, then publishes `committed`.
    ///
    /// # Errors
    /// Only once the senders are gone and [`CLOSE_RETRY_LIMIT`] has passed; the rows still
    /// queued are reported as lost.
    fn commit_batch(&mut self) -> Result<(), StoreError> {
        let started = Instant::now();
        let mut backoff = RETRY_BACKOFF_START;
        let mut give_up_at: Option<Instant> = None;
        let mut retrying = false;
        loop {
            // NB. A commit can report an error after its frames reached the WAL (a failed
            // fsync, for one); inserting the rows again would then fail forever on their keys.
            if retrying && self.batch_is_stored() {
                tracing::warn!("event store: a commit reported as failed was stored after all");
                break;
            }
            retrying = true;
            let error = match self.insert_batch() {
                Ok(()) => break,
                Err(e) => e,
            };
            let first = self.batch.first().map_or(0, |r| r.seq);
            tracing::error!(
                error = %error,
                rows = self.batch.len(),
                first_seq = first,
                retry_in = ?backoff,
                "event store: commit failed; the rows are kept and retried"
            );
            if self.disconnected {
                let limit = *give_up_at.get_or_insert_with(|| Instant::now() + CLOSE_RETRY_LIMIT);
                if Instant::now() >= limit {
                    let lost = self.batch.len() + self.queue.len();
                    tracing::error!(
                        lost,
                        first_seq = first,
                        "event store: giving up at close; queued events were not stored"
                    );
                    self.batch.clear();
                    self.queue.clear();
                    return Err(StoreError::Io(format!(
                        "{lost} queued events (from seq {first}) could not be committed: {error}"
                    )));
                }
            }
            self.pause(backoff);
            backoff = next_backoff(backoff);
        }

        if let Some(m) = &self.metrics {
            m.observe_commit(started.elapsed(), self.batch.len());
        }
        let bytes: u64 = self.batch.iter().map(row_bytes).sum();
        if let Some(last) = self.batch.last() {
            self.committed_next = self.committed_next.max(last.seq + 1);
            self.last_ts = last.timestamp;
            self.last_id = Some(last.id.clone());
        }
        self.bytes += bytes;
        self.batch.clear();
        self.shared.commits.fetch_add(1, Ordering::Relaxed);
        self.committed.send_replace(self.committed_next);
        Ok(())
    }

    /// One transaction with every row of the batch.
    fn insert_batch(&mut self) -> rusqlite::Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let mut stmt = tx.prepare_cached(INSERT_SQL)?;
            for row in &self.batch {
                stmt.execute(params![
                    sql_int(row.seq),
                    row.id,
                    sql_int(row.timestamp),
                    row.kind,
                    row.meta,
                    row.json
                ])?;
            }
        }
        for row in &self.batch {
            kept::write(&tx, row)?;
            if row.kind != "identity.claimed" && row.kind != "identity.released" {
                continue;
            }
            let Some(key) = crate::store::kept::claim_key(&row.json) else {
                tracing::warn!(event = %row.id, kind = %row.kind, "a claim without its id");
                continue;
            };
            if row.kind == "identity.released" {
                tx.prepare_cached(CLAIMS_DELETE)?.execute(params![key])?;
                continue;
            }
            tx.prepare_cached(CLAIMS_UPSERT)?.execute(params![
                key,
                sql_int(row.seq),
                row.id,
                sql_int(row.timestamp),
                row.kind,
                row.meta,
                row.json
            ])?;
        }
        // On error the dropped transaction rolls back: nothing of the batch is in the file.
        tx.commit()
    }

    /// Whether every row of the batch is already in the file (checked before a retry).
    fn batch_is_stored(&self) -> bool {
        let (Some(first), Some(last)) = (self.batch.first(), self.batch.last()) else {
            return true;
        };
        let stored: rusqlite::Result<i64> = self.conn.query_row(
            "SELECT count(*) FROM events WHERE seq >= ?1 AND seq <= ?2",
            [sql_int(first.seq), sql_int(last.seq)],
            |r| r.get(0),
        );
        matches!(stored, Ok(n) if n == self.batch.len() as i64)
    }

    /// Waits `d` before a retry, still taking appended rows so that nothing is lost.
    fn pause(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        while !self.disconnected {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            match self.rx.recv_timeout(left) {
                Ok(rows) => self.enqueue(rows),
                Err(RecvTimeoutError::Timeout) => return,
                Err(RecvTimeoutError::Disconnected) => self.disconnected = true,
            }
        }
        std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
    }
}

/// The next wait after a failed attempt.
fn next_backoff(current: Duration) -> Duration {
    (current * 2).min(RETRY_BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let mut d = RETRY_BACKOFF_START;
        let mut seen = vec![d];
        for _ in 0..20 {
            d = next_backoff(d);
            seen.push(d);
        }
        assert_eq!(seen[1], RETRY_BACKOFF_START * 2);
        assert!(seen.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*seen.last().unwrap(), RETRY_BACKOFF_MAX);
    }

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
