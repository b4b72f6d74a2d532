//! What a [`SqliteStore`](super::SqliteStore) is opened with ([`SqliteOptions`], the
//! defaults, [`Synchronous`]) and the counters its threads share with the handle ([`Shared`]).
//! Imports nothing of the store's other files, so each of them may use it.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

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

/// How many of the newest rows [`SqliteStore::open`](super::SqliteStore::open) returns to warm the in-memory window:
/// 100 000 rows (tens of MB) cover the typical resume gap without a disk read.
pub const DEFAULT_RECENT_ROWS: usize = 100_000;

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
    pub(super) fn pragma(self) -> &'static str {
        match self {
            Self::Full => "FULL",
            Self::Normal => "NORMAL",
        }
    }
}

/// How to open a [`SqliteStore`](super::SqliteStore).
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
    /// Newest rows returned in [`Recovered::recent`](crate::store::Recovered::recent) ([`DEFAULT_RECENT_ROWS`]).
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
pub(super) struct Shared {
    /// The oldest retained seq; written by the writer after each retention delete.
    pub(super) first_seq: AtomicU64,
    /// Transactions that appended rows.
    pub(super) commits: AtomicU64,
}
