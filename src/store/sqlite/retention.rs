//! Retention on disk, run by the writer thread between commits: at most once per
//! [`SqliteOptions::retention_interval`](super::SqliteOptions::retention_interval), after a
//! commit (or while idle when rows can expire by age), it deletes rows older than `max_age`,
//! then the oldest rows while the log holds more than `max_events` rows or more than
//! `max_bytes` bytes of `json` + `meta` (the byte total is computed once at open and tracked
//! after that). Deletes go in chunks of [`RETENTION_CHUNK_ROWS`] and a pass stops after
//! [`RETENTION_PASS_BUDGET`], so a large backlog never stalls commits for long. When retention
//! empties the table, the position (next seq, last id and timestamp) is kept in the `meta`
//! table so that numbering continues after a restart.
//!
//! Owns the deletes and the cut arithmetic (pure functions, tested here); the state they keep
//! (first seq, byte total, when the next pass is due) is the [`Writer`]'s.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rusqlite::{params, TransactionBehavior};

use crate::protocol::ids::now_ms;
use crate::store::sqlite::reader::first_seq_at_time;
use crate::store::sqlite::sql::{
    sql_int, write_meta, IDLE_RETENTION_MIN, META_LAST_ID, META_LAST_TS, META_NEXT_SEQ,
    ROW_BYTES_SQL,
};
use crate::store::sqlite::writer::Writer;

/// Rows deleted per retention transaction: bounds how long one delete holds the writer.
const RETENTION_CHUNK_ROWS: u64 = 10_000;

/// How long one retention pass may work before it yields to pending commits; the rest is done
/// in the next pass, which then runs without waiting for the interval.
const RETENTION_PASS_BUDGET: Duration = Duration::from_millis(100);

impl Writer {
    /// Runs a retention pass and schedules the next one. Failures are logged and retried at
    /// the next interval; they never hold up commits.
    pub(super) fn retain(&mut self) {
        let now = Instant::now();
        self.retention_pending = false;
        match self.retention_pass(now) {
            Ok(true) => {
                self.retention_due = now + self.retention_interval;
                self.retention_backlog = false;
            }
            // Over budget with work left: the next pass may run right away.
            Ok(false) => {
                self.retention_due = Instant::now();
                self.retention_backlog = true;
            }
            Err(e) => {
                tracing::warn!(error = %e, "event store: retention failed; retrying later");
                self.retention_due = now + self.retention_interval.max(IDLE_RETENTION_MIN);
                self.retention_backlog = false;
            }
        }
    }

    /// Deletes by age and count, then by bytes. `Ok(false)` when the time budget ran out first.
    fn retention_pass(&mut self, started: Instant) -> rusqlite::Result<bool> {
        let mut target = count_cut(self.first_seq, self.committed_next, self.max_events);
        if let Some(max_age) = self.max_age {
            let cutoff =
                now_ms().saturating_sub(u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX));
            let first_young = first_seq_at_time(&self.conn, cutoff)?;
            let first_young = first_young.map_or(self.committed_next, |s| s.max(0) as u64);
            target = target.max(first_young);
        }
        let target = target.min(self.committed_next);
        while self.first_seq < target {
            self.delete_before(target.min(self.first_seq + RETENTION_CHUNK_ROWS))?;
            if started.elapsed() >= RETENTION_PASS_BUDGET {
                return Ok(self.first_seq >= target && self.bytes <= self.max_bytes);
            }
        }
        while self.bytes > self.max_bytes && self.first_seq < self.committed_next {
            let cut = self.bytes_cut()?;
            self.delete_before(cut)?;
            if started.elapsed() >= RETENTION_PASS_BUDGET {
                return Ok(self.bytes <= self.max_bytes);
            }
        }
        Ok(true)
    }

    /// Where to cut so that the remaining bytes fit `max_bytes`, looking at most
    /// [`RETENTION_CHUNK_ROWS`] rows ahead.
    fn bytes_cut(&mut self) -> rusqlite::Result<u64> {
        let excess = self.bytes - self.max_bytes;
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT seq, {ROW_BYTES_SQL} FROM events WHERE seq >= ?1 ORDER BY seq LIMIT ?2"
        ))?;
        let sizes = stmt
            .query_map(
                params![sql_int(self.first_seq), sql_int(RETENTION_CHUNK_ROWS)],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?.max(0) as u64,
                        r.get::<_, i64>(1)?.max(0) as u64,
                    ))
                },
            )?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(match bytes_cut(&sizes, excess) {
            Some(cut) => cut,
            None if sizes.is_empty() => {
                // The tracked total disagrees with an empty table: trust the table.
                self.bytes = 0;
                self.committed_next
            }
            None => sizes
                .last()
                .map_or(self.committed_next, |&(seq, _)| seq + 1),
        })
    }

    /// Deletes every row with `seq < cut` in one transaction, with the log's position kept in
    /// `meta` in case the table ends up empty.
    fn delete_before(&mut self, cut: u64) -> rusqlite::Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let freed: i64 = tx.query_row(
            &format!("SELECT COALESCE(SUM({ROW_BYTES_SQL}), 0) FROM events WHERE seq < ?1"),
            [sql_int(cut)],
            |r| r.get(0),
        )?;
        tx.execute("DELETE FROM events WHERE seq < ?1", [sql_int(cut)])?;
        if let Some(last_id) = &self.last_id {
            write_meta(&tx, META_NEXT_SEQ, &self.committed_next.to_string())?;
            write_meta(&tx, META_LAST_ID, last_id)?;
            write_meta(&tx, META_LAST_TS, &self.last_ts.to_string())?;
        }
        tx.commit()?;
        self.bytes = self.bytes.saturating_sub(freed.max(0) as u64);
        self.first_seq = self.first_seq.max(cut);
        self.shared
            .first_seq
            .store(self.first_seq, Ordering::Release);
        tracing::debug!(
            first_seq = self.first_seq,
            bytes = self.bytes,
            "event store: retention"
        );
        Ok(())
    }
}

/// Where retention by count cuts: keeps the newest `max_events` of `[first, next)`.
fn count_cut(first: u64, next: u64, max_events: u64) -> u64 {
    let count = next.saturating_sub(first);
    if count > max_events {
        first + (count - max_events)
    } else {
        first
    }
}

/// Given `(seq, bytes)` of the oldest rows in order, the first seq to keep so that at least
/// `excess` bytes are freed; `None` when these rows do not free enough.
fn bytes_cut(sizes: &[(u64, u64)], excess: u64) -> Option<u64> {
    let mut freed = 0u64;
    for &(seq, bytes) in sizes {
        freed += bytes;
        if freed >= excess {
            return Some(seq + 1);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use crate::store::record::StoredRow;
    use crate::store::sqlite::sql::row_bytes;

    use super::*;

    #[test]
    fn count_cut_keeps_the_newest() {
        assert_eq!(count_cut(0, 100, 1000), 0);
        assert_eq!(count_cut(0, 100, 100), 0);
        assert_eq!(count_cut(0, 100, 40), 60);
        assert_eq!(count_cut(50, 100, 10), 90);
        assert_eq!(count_cut(100, 100, 0), 100);
        assert_eq!(count_cut(0, 5, 0), 5);
    }

    #[test]
    fn bytes_cut_frees_at_least_the_excess() {
        let sizes = [(10, 100), (11, 100), (12, 100)];
        assert_eq!(bytes_cut(&sizes, 1), Some(11));
        assert_eq!(bytes_cut(&sizes, 100), Some(11));
        assert_eq!(bytes_cut(&sizes, 101), Some(12));
        assert_eq!(bytes_cut(&sizes, 300), Some(13));
        assert_eq!(bytes_cut(&sizes, 301), None);
        assert_eq!(bytes_cut(&[], 1), None);
    }

    #[test]
    fn row_bytes_counts_json_and_meta() {
        let row = StoredRow {
            seq: 0,
            id: "01ARZ3NDEKTSV4RRFFQ69G5FAV".into(),
            timestamp: 1,
            kind: "k".into(),
            meta: "{}".into(),
            json: "{\"é\":1}".into(),
        };
        assert_eq!(row_bytes(&row), 2 + 8);
        // The file counts the same bytes (octet_length of UTF-8 text, not characters).
        let conn = Connection::open_in_memory().unwrap();
        let in_sql: i64 = conn
            .query_row(
                &format!("SELECT {ROW_BYTES_SQL} FROM (SELECT ?1 AS json, ?2 AS meta)"),
                [&row.json, &row.meta],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(in_sql as u64, row_bytes(&row));
    }
}
