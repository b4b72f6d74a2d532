//! Opening a store's file: configuring the writer's connection (WAL, `synchronous`, cache),
//! opening the readers' read-only connections, and recovering the log's position from the file
//! (first and next seq, last id and time, even after retention emptied the table), the byte
//! total retention starts from, the newest rows, the claims and the kept tables' counts.
//!
//! Owns the connections' settings and what [`SqliteStore::open`](super::SqliteStore::open)
//! learns from the file before it starts the threads; it keeps no state of its own.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use crate::store::sqlite::kept;
use crate::store::sqlite::options::Synchronous;
use crate::store::sqlite::reader::select_rows;
use crate::store::sqlite::sql::{
    from_sql_int, parse_id, query_rows, read_meta, sql_err, META_LAST_ID, META_LAST_TS,
    META_NEXT_SEQ, ROW_BYTES_SQL,
};
use crate::store::Recovered;
use crate::store::StoreError;

/// The writer's page cache, KiB (SQLite's default is 2 MiB). Appends touch the right edges of
/// the tables and indexes and retention their left edges: a few dozen pages. The cache stays
/// resident for the router's life, so it is part of the memory a soak leaves behind.
const WRITER_CACHE_KIB: i64 = 512;

/// Each reader's page cache, KiB. A reader's cache is dropped whenever the writer has committed
/// since its last read, which under load is every read: a large one only holds memory.
const READER_CACHE_KIB: i64 = 128;

/// How long a connection waits on a lock held by another connection (an external `sqlite3`,
/// a checkpoint) before an operation fails and is retried.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Truncate the WAL file to at most this after a checkpoint, so that a burst does not leave a
/// large file behind.
const JOURNAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// What `recover` found, beyond [`Recovered`].
pub(super) struct OpenState {
    pub(super) recovered: Recovered,
    /// Bytes of `json` + `meta` in the table.
    pub(super) bytes: u64,
}

pub(super) fn configure_writer(
    conn: &Connection,
    synchronous: Synchronous,
    path: &Path,
) -> Result<(), StoreError> {
    let context = format!("configuring {}", path.display());
    let err = |e| sql_err(&context, e);
    conn.busy_timeout(BUSY_TIMEOUT).map_err(err)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(err)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Io(format!(
            "{context}: could not switch to WAL mode (journal_mode is {mode})"
        )));
    }
    conn.pragma_update(None, "synchronous", synchronous.pragma())
        .map_err(err)?;
    conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)
        .map_err(err)?;
    conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)
        .map_err(err)?;
    Ok(())
}

pub(super) fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "cache_size", -READER_CACHE_KIB)?;
    Ok(conn)
}

pub(super) fn recover(conn: &Connection, recent_rows: usize) -> Result<OpenState, StoreError> {
    let context = "recovering the event store";
    let err = |e| sql_err(context, e);
    // Two queries rather than `min(seq), max(seq)`: each alone is a single b-tree probe.
    let first: Option<i64> = conn
        .query_row("SELECT seq FROM events ORDER BY seq LIMIT 1", [], |r| {
            r.get(0)
        })
        .optional()
        .map_err(err)?;
    let last: Option<(i64, String, i64)> = conn
        .query_row(
            "SELECT seq, id, ts FROM events ORDER BY seq DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()
        .map_err(err)?;

    let mut recovered = Recovered::default();
    match (first, last) {
        (Some(first), Some((last_seq, last_id, last_ts))) => {
            recovered.first_seq = from_sql_int(first, "seq")?;
            recovered.next_seq = from_sql_int(last_seq, "seq")? + 1;
            recovered.last_id = Some(parse_id(&last_id)?);
            recovered.last_timestamp = from_sql_int(last_ts, "ts")?;
        }
        _ => {
            // Empty: retention may have deleted everything; continue where it left off.
            if let Some(next) = read_meta(conn, META_NEXT_SEQ).map_err(err)? {
                recovered.next_seq = next
                    .parse()
                    .map_err(|_| StoreError::Corrupt(format!("bad meta next_seq {next:?}")))?;
            }
            if let Some(id) = read_meta(conn, META_LAST_ID).map_err(err)? {
                recovered.last_id = Some(parse_id(&id)?);
            }
            if let Some(ts) = read_meta(conn, META_LAST_TS).map_err(err)? {
                recovered.last_timestamp = ts
                    .parse()
                    .map_err(|_| StoreError::Corrupt(format!("bad meta last_ts {ts:?}")))?;
            }
            recovered.first_seq = recovered.next_seq;
        }
    }

    // `octet_length` reads the size from the record header: no row content is loaded.
    let bytes: i64 = conn
        .query_row(
            &format!("SELECT COALESCE(SUM({ROW_BYTES_SQL}), 0) FROM events"),
            [],
            |r| r.get(0),
        )
        .map_err(err)?;

    let recent_from = recovered
        .next_seq
        .saturating_sub(recent_rows as u64)
        .max(recovered.first_seq);
    if recent_rows > 0 && recent_from < recovered.next_seq {
        recovered.recent = select_rows(conn, recent_from, recent_rows)?;
    }
    recovered.claims = query_rows(
        conn,
        "SELECT seq, id, ts, kind, meta, json FROM claims ORDER BY seq",
        &[],
        1024,
    )?;
    recovered.kept_counts = kept::counts(conn).map_err(err)?;
    Ok(OpenState {
        recovered,
        bytes: from_sql_int(bytes, "byte total")?,
    })
}
