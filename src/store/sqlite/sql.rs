//! The small SQL helpers every part of the SQLite store shares: integer conversions, error
//! mapping, reading rows as [`StoredRow`]s and the `meta` table. No state, no threads.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension};

use crate::protocol::ids::EventId;
use crate::store::record::StoredRow;
use crate::store::StoreError;

/// The `meta` keys.
pub(super) const META_SCHEMA_VERSION: &str = "schema_version";
pub(super) const META_NEXT_SEQ: &str = "next_seq";
pub(super) const META_LAST_ID: &str = "last_id";
pub(super) const META_LAST_TS: &str = "last_ts";

/// A u64 as an SQLite integer, saturating (seqs and timestamps never get near 2^63).
pub(super) fn sql_int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// An SQLite integer that must be a u64.
pub(super) fn from_sql_int(v: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("negative {what} {v}")))
}

pub(super) fn parse_id(id: &str) -> Result<EventId, StoreError> {
    EventId::parse(id).ok_or_else(|| StoreError::Corrupt(format!("bad event id {id:?}")))
}

/// Maps an SQLite error: a value of the wrong type is a corrupt record, the rest is I/O.
pub(super) fn sql_err(context: &str, e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => {
            StoreError::Corrupt(format!("{context}: {e}"))
        }
        _ => StoreError::Io(format!("{context}: {e}")),
    }
}

/// A row's six stored columns (`seq, id, ts, kind, meta, json`, in that order from column
/// `first`) as a [`StoredRow`].
pub(super) fn stored_row(r: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<StoredRow> {
    let seq: i64 = r.get(first)?;
    let ts: i64 = r.get(first + 2)?;
    Ok(StoredRow {
        seq: u64::try_from(seq).unwrap_or_default(),
        id: r.get(first + 1)?,
        timestamp: u64::try_from(ts).unwrap_or_default(),
        kind: r.get(first + 3)?,
        meta: r.get(first + 4)?,
        json: r.get(first + 5)?,
    })
}

/// Runs a query selecting `seq, id, ts, kind, meta, json`.
pub(super) fn query_rows(
    conn: &Connection,
    sql: &str,
    params: &[&dyn rusqlite::ToSql],
    limit: usize,
) -> Result<Vec<StoredRow>, StoreError> {
    let context = "reading events";
    let mut stmt = conn.prepare_cached(sql).map_err(|e| sql_err(context, e))?;
    let raw = stmt
        .query_map(params, |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
            ))
        })
        .map_err(|e| sql_err(context, e))?;
    let mut rows = Vec::with_capacity(limit.min(1024));
    for item in raw {
        let (seq, id, ts, kind, meta, json) = item.map_err(|e| sql_err(context, e))?;
        rows.push(StoredRow {
            seq: from_sql_int(seq, "seq")?,
            id,
            timestamp: from_sql_int(ts, "ts")?,
            kind,
            meta,
            json,
        });
    }
    Ok(rows)
}

pub(super) fn read_meta(conn: &Connection, key: &str) -> rusqlite::Result<Option<String>> {
    conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .optional()
}

pub(super) fn write_meta(conn: &Connection, key: &str, value: &str) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO meta (key, value) VALUES (?1, ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        [key, value],
    )
    .map(drop)
}

/// While idle, retention by age wakes at most this often (even with a zero interval), so an
/// idle writer never spins.
pub(super) const IDLE_RETENTION_MIN: Duration = Duration::from_millis(10);

/// What [`row_bytes`] (retention's byte budget) counts, in SQL.
pub(super) const ROW_BYTES_SQL: &str = "octet_length(json) + octet_length(meta)";

/// The bytes a row counts for in the byte budget (what `octet_length(json) + octet_length(meta)`
/// gives in the file).
pub(super) fn row_bytes(row: &StoredRow) -> u64 {
    (row.json.len() + row.meta.len()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_convert_safely() {
        assert_eq!(sql_int(5), 5);
        assert_eq!(sql_int(u64::MAX), i64::MAX);
        assert_eq!(from_sql_int(7, "seq").unwrap(), 7);
        assert!(matches!(
            from_sql_int(-1, "seq"),
            Err(StoreError::Corrupt(_))
        ));
    }
}
