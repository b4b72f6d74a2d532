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
pub(super) const SEQ_AT_TIME_SQL: &str =
    "SELECT seq FROM events WHERE ts >= ?1 ORDER BY ts, seq LIMIT 1";

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
                let _ = reply.send(seq_where(&conn, SEQ_AT_TIME_SQL, &sql_int(ts), committed));
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
