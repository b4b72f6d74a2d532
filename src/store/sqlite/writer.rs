//! The writer thread (`map-store-writer`): owns the only read-write connection. It blocks for
//! the first queued row, takes whatever else is queued (up to
//! [`SqliteOptions::max_batch_rows`](super::SqliteOptions::max_batch_rows)), waits at most
//! [`SqliteOptions::group_commit_delay`](super::SqliteOptions::group_commit_delay) for more,
//! commits them in one transaction (one fsync for the whole group: the events, their kept rows
//! and claims), then publishes `committed` on a `watch` channel. A failed commit is logged and
//! retried with backoff, keeping the rows: `committed` never moves past a row that is not in the
//! file. Retention (`retention.rs`) runs on this thread too, after commits.
//!
//! Owns the queue of rows not yet committed, the group being committed, the log's position as
//! committed (next seq, last id and time, byte total) and the `committed` sender. Only this
//! thread writes the file.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, TransactionBehavior};
use tokio::sync::watch;

use crate::store::record::{EventRecord, StoredRow};
use crate::store::sqlite::kept;
use crate::store::sqlite::options::Shared;
use crate::store::sqlite::sql::{row_bytes, sql_int, IDLE_RETENTION_MIN};
use crate::store::StoreError;

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

/// What the writer thread receives: rows, or logged events it turns into rows itself.
pub(super) enum Incoming {
    Rows(Vec<StoredRow>),
    Records(Vec<Arc<EventRecord>>),
}

impl Incoming {
    /// How many, and the first sequence number (for error reports).
    pub(super) fn extent(&self) -> (usize, u64) {
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

/// The writer thread's state. Only this thread writes the file.
pub(super) struct Writer {
    pub(super) conn: Connection,
    pub(super) rx: mpsc::Receiver<Incoming>,
    pub(super) group_commit_delay: Duration,
    pub(super) max_batch_rows: usize,
    pub(super) max_age: Option<Duration>,
    pub(super) max_events: u64,
    pub(super) max_bytes: u64,
    pub(super) retention_interval: Duration,
    pub(super) metrics: Option<crate::metrics::StoreMetrics>,
    /// Received, not yet in a transaction.
    pub(super) queue: VecDeque<StoredRow>,
    /// The group being committed; kept across failed attempts.
    pub(super) batch: Vec<StoredRow>,
    /// Every sender is gone (closed or dropped): commit what is left and stop.
    pub(super) disconnected: bool,
    /// The seq the next received row should have.
    pub(super) expected_seq: u64,
    /// One past the last committed seq.
    pub(super) committed_next: u64,
    /// The oldest retained seq (mirrored in `shared.first_seq`).
    pub(super) first_seq: u64,
    /// Id and timestamp of the last committed row, kept in `meta` when retention empties the
    /// table.
    pub(super) last_id: Option<String>,
    pub(super) last_ts: u64,
    /// Bytes of `json` + `meta` in the table.
    pub(super) bytes: u64,
    pub(super) shared: Arc<Shared>,
    pub(super) committed: watch::Sender<u64>,
    /// When retention may next run.
    pub(super) retention_due: Instant,
    /// The last pass ran out of time with rows still to delete.
    pub(super) retention_backlog: bool,
    /// Rows were committed since the last pass, which was too recent to run again.
    pub(super) retention_pending: bool,
}

impl Writer {
    /// Commits groups until every sender is gone and everything queued is committed.
    ///
    /// # Errors
    /// Only after a close, when rows could not be committed within [`CLOSE_RETRY_LIMIT`].
    pub(super) fn run(&mut self) -> Result<(), StoreError> {
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
        self.receive_until(deadline, self.max_batch_rows);
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
        self.receive_until(deadline, usize::MAX);
        if self.disconnected {
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
        }
    }

    /// Queues what arrives until `deadline`, the channel closes, or `full` rows are queued.
    fn receive_until(&mut self, deadline: Instant, full: usize) {
        while self.queue.len() < full && !self.disconnected {
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
}
