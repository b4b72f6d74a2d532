//! The readers: [`READER_THREADS`] threads (`map-store-reader-N`), each with a read-only
//! connection, serving [`ReadRequest`]s taken from one shared queue. WAL lets them read
//! concurrently with the writer; each request carries a tokio oneshot for its answer, so a
//! [`StoreFuture`](crate::store::StoreFuture) is a plain future and the router never blocks.
//!
//! Owns the read queries (ranges, kinds, ids, positions by id and time, the kept tables'
//! answers through `kept.rs`); never writes the file.

use std::sync::mpsc;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension};
use tokio::sync::{oneshot, watch};

use crate::store::record::StoredRow;
use crate::store::sqlite::kept;
use crate::store::sqlite::sql::{from_sql_int, query_rows, sql_err, sql_int};
use crate::store::StoreError;
use crate::sync::lock;

/// Reader threads (each with its own connection): two, so that a long replay read does not hold
/// up a quick position lookup, without competing with the writer for the disk on small hosts.
pub const READER_THREADS: usize = 2;

const SELECT_ROWS_SQL: &str =
    "SELECT seq, id, ts, kind, meta, json FROM events WHERE seq >= ?1 ORDER BY seq LIMIT ?2";
const SEQ_AFTER_ID_SQL: &str = "SELECT seq FROM events WHERE id > ?1 ORDER BY id LIMIT 1";

/// The first row at or after a seq, with its time.
const ROW_TIME_FROM_SQL: &str = "SELECT seq, ts FROM events WHERE seq >= ?1 ORDER BY seq LIMIT 1";
const LAST_ROW_TIME_SQL: &str = "SELECT seq, ts FROM events ORDER BY seq DESC LIMIT 1";

/// The seq of the first event logged at or after `ts` (ms), `None` when every event is older.
///
/// A binary search over `seq` (about 40 lookups of the primary key at most) instead of an index
/// on `ts`, which cost every append one more b-tree update: the log's times never go down as
/// its seqs go up (`router::events::log` takes the larger of the clock and the last event's
/// time, also across restarts), so the first row at or after a seq has a time that only grows
/// with that seq. Holes (rows retention deleted) are stepped over by the same lookup.
pub(super) fn first_seq_at_time(conn: &Connection, ts: u64) -> rusqlite::Result<Option<i64>> {
    let want = sql_int(ts);
    let mut from = conn.prepare_cached(ROW_TIME_FROM_SQL)?;
    let mut at = |seq: i64| -> rusqlite::Result<Option<(i64, i64)>> {
        from.query_row([seq], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
    };
    let Some((first, first_ts)) = at(i64::MIN)? else {
        return Ok(None);
    };
    if first_ts >= want {
        return Ok(Some(first));
    }
    let Some((last, last_ts)) = conn
        .prepare_cached(LAST_ROW_TIME_SQL)?
        .query_row([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
        .optional()?
    else {
        return Ok(None);
    };
    if last_ts < want {
        return Ok(None);
    }
    // The first row at or after `lo` is older than `ts`; the one at or after `hi` is not.
    let (mut lo, mut hi) = (first, last);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match at(mid)? {
            Some((_, t)) if t >= want => hi = mid,
            _ => lo = mid,
        }
    }
    Ok(at(hi)?.map(|(seq, _)| seq))
}

/// A read request, answered on a reader thread.
pub(super) enum ReadRequest {
    Rows {
        from: u64,
        limit: usize,
        reply: oneshot::Sender<Result<Vec<StoredRow>, StoreError>>,
    },
    SeqAfter {
        id: String,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    SeqAtTime {
        ts: u64,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    Kinds {
        kinds: Vec<String>,
        from: u64,
        limit: usize,
        reply: oneshot::Sender<Result<Vec<StoredRow>, StoreError>>,
    },
    Ids {
        ids: Vec<String>,
        reply: oneshot::Sender<Result<Vec<StoredRow>, StoreError>>,
    },
    Kept {
        query: crate::store::kept::KeptQuery,
        reply: oneshot::Sender<Result<crate::store::kept::KeptAnswer, StoreError>>,
    },
}

pub(super) fn reader_loop(
    conn: Connection,
    rx: &Mutex<mpsc::Receiver<ReadRequest>>,
    committed: &watch::Receiver<u64>,
    exit: oneshot::Sender<()>,
) {
    loop {
        // NB. The lock is held while waiting, so one idle reader waits in `recv` and the other
        // on the lock; the lock is released before the request is served.
        let request = lock(rx).recv();
        let Ok(request) = request else { break };
        match request {
            ReadRequest::Rows { from, limit, reply } => {
                let _ = reply.send(select_rows(&conn, from, limit));
            }
            ReadRequest::SeqAfter { id, reply } => {
                let _ = reply.send(seq_where(&conn, SEQ_AFTER_ID_SQL, &id, committed));
            }
            ReadRequest::SeqAtTime { ts, reply } => {
                let found = first_seq_at_time(&conn, ts)
                    .map_err(|e| sql_err("looking up a position", e))
                    .and_then(|seq| seq.map(|s| from_sql_int(s, "seq")).transpose());
                let _ = reply.send(match found {
                    Ok(Some(seq)) => Ok(seq),
                    Ok(None) => past_the_end(&conn, committed),
                    Err(e) => Err(e),
                });
            }
            ReadRequest::Kinds {
                kinds,
                from,
                limit,
                reply,
            } => {
                let _ = reply.send(select_kinds(&conn, &kinds, from, limit));
            }
            ReadRequest::Ids { ids, reply } => {
                let _ = reply.send(select_ids(&conn, &ids));
            }
            ReadRequest::Kept { query, reply } => {
                let _ = reply.send(kept::answer(&conn, &query));
            }
        }
    }
    drop(conn);
    drop(exit);
}

/// Up to `limit` rows with `seq >= from`, in order.
pub(super) fn select_rows(
    conn: &Connection,
    from: u64,
    limit: usize,
) -> Result<Vec<StoredRow>, StoreError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let params: [&dyn rusqlite::ToSql; 2] = [&sql_int(from), &sql_int(limit as u64)];
    query_rows(conn, SELECT_ROWS_SQL, &params, limit)
}

/// Up to `limit` rows of the given kinds with `seq >= from`, in order.
fn select_kinds(
    conn: &Connection,
    kinds: &[String],
    from: u64,
    limit: usize,
) -> Result<Vec<StoredRow>, StoreError> {
    if limit == 0 || kinds.is_empty() {
        return Ok(Vec::new());
    }
    let marks = vec!["?"; kinds.len()].join(", ");
    let sql = format!(
        "SELECT seq, id, ts, kind, meta, json FROM events WHERE kind IN ({marks}) AND seq >= ? \
         ORDER BY seq LIMIT ?"
    );
    let (from, limit_sql) = (sql_int(from), sql_int(limit as u64));
    let mut params: Vec<&dyn rusqlite::ToSql> =
        kinds.iter().map(|k| k as &dyn rusqlite::ToSql).collect();
    params.push(&from);
    params.push(&limit_sql);
    query_rows(conn, &sql, &params, limit)
}

/// The retained rows with these event ids, in sequence order (ids no longer stored are left
/// out). Asked in chunks, so that a long list stays under SQLite's parameter limit.
fn select_ids(conn: &Connection, ids: &[String]) -> Result<Vec<StoredRow>, StoreError> {
    const CHUNK: usize = 500;
    let mut out = Vec::new();
    for chunk in ids.chunks(CHUNK) {
        let marks = vec!["?"; chunk.len()].join(", ");
        let sql = format!("SELECT seq, id, ts, kind, meta, json FROM events WHERE id IN ({marks})");
        let params: Vec<&dyn rusqlite::ToSql> =
            chunk.iter().map(|k| k as &dyn rusqlite::ToSql).collect();
        out.extend(query_rows(conn, &sql, &params, chunk.len())?);
    }
    out.sort_by_key(|r| r.seq);
    Ok(out)
}

/// The first seq matched by `sql` (one parameter), else the end of the log.
fn seq_where(
    conn: &Connection,
    sql: &str,
    param: &dyn rusqlite::ToSql,
    committed: &watch::Receiver<u64>,
) -> Result<u64, StoreError> {
    let context = "looking up a position";
    let found: Option<i64> = conn
        .prepare_cached(sql)
        .and_then(|mut stmt| stmt.query_row([param], |r| r.get(0)).optional())
        .map_err(|e| sql_err(context, e))?;
    if let Some(seq) = found {
        return from_sql_int(seq, "seq");
    }
    past_the_end(conn, committed)
}

/// The seq after the last event: what a position past every event is.
fn past_the_end(conn: &Connection, committed: &watch::Receiver<u64>) -> Result<u64, StoreError> {
    let context = "looking up a position";
    // Past the end: the next seq. The file may already show a commit the writer has not
    // published yet, so take the larger of the two.
    let last: Option<i64> = conn
        .query_row(
            "SELECT seq FROM events ORDER BY seq DESC LIMIT 1",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| sql_err(context, e))?;
    let in_file = match last {
        Some(seq) => from_sql_int(seq, "seq")? + 1,
        None => 0,
    };
    Ok(in_file.max(*committed.borrow()))
}

#[cfg(test)]
mod tests {
    use rusqlite::{Connection, OptionalExtension};

    use super::first_seq_at_time;

    /// Against a scan, for every time around a log with holes and repeated times.
    #[test]
    fn the_binary_search_finds_what_a_scan_finds() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE events (seq INTEGER PRIMARY KEY, ts INTEGER NOT NULL);")
            .unwrap();
        assert_eq!(first_seq_at_time(&conn, 5).unwrap(), None, "an empty log");
        // Seqs from 7 with holes (every third missing, and a long gap), times rising in steps
        // with runs of equal times.
        let mut ts = 1_000i64;
        for seq in (7..300).chain(900..950) {
            if seq % 3 == 0 {
                continue;
            }
            if seq % 4 != 0 {
                ts += seq % 5;
            }
            conn.execute("INSERT INTO events (seq, ts) VALUES (?1, ?2)", [seq, ts])
                .unwrap();
        }
        for t in 990..ts + 10 {
            let scanned: Option<i64> = conn
                .query_row(
                    "SELECT seq FROM events WHERE ts >= ?1 ORDER BY seq LIMIT 1",
                    [t],
                    |r| r.get(0),
                )
                .optional()
                .unwrap();
            let t = u64::try_from(t).unwrap();
            assert_eq!(first_seq_at_time(&conn, t).unwrap(), scanned, "time {t}");
        }
    }
}
