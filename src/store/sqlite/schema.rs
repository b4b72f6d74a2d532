//! The database's schema: creating it in a new file, and migrating the file of an older
//! version in place when it is opened.
//!
//! Versions:
//! - **1**: `events`, `meta`, and the kept tables (`checkpoints`, `tasks`, `conversations`,
//!   `turns`, `threads`, `claims`) holding only the key and the stored row.
//! - **2**: the kept tables gain the columns the router pages them by (`sqlite/kept.rs`:
//!   creation order, status and assignee of tasks; agent and time of checkpoints; creation
//!   order of conversations and the `conversation_members` index; conversation, thread,
//!   author and time of turns; conversation of threads; the quota owner of what is counted),
//!   and their indexes. A version-1 file is migrated in one transaction at open: the columns
//!   are added and filled from each row's event (owners stay unknown: version 1 did not
//!   record them, so what it created counts against nobody's quota).
//!
//! A file written by a newer version is refused rather than misread.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use crate::store::kept::KeptTable;
use crate::store::sqlite::kept;
use crate::store::sqlite::sql::{read_meta, sql_err, write_meta, META_SCHEMA_VERSION};
use crate::store::StoreError;

/// The schema this version writes and reads. Bump it with a migration when the tables change;
/// a file with a higher version is refused at open.
pub const SCHEMA_VERSION: u32 = 2;

/// The claims table (`router::identities`): the newest claim per id.
const CLAIMS: &str = "CREATE TABLE IF NOT EXISTS claims (
    claim TEXT PRIMARY KEY,
    seq  INTEGER NOT NULL,
    id   TEXT NOT NULL,
    ts   INTEGER NOT NULL,
    kind TEXT NOT NULL,
    meta TEXT NOT NULL,
    json TEXT NOT NULL
);";

/// Creates the tables on a new file; checks the schema version of an existing one and
/// migrates it when it is older.
///
/// # Errors
/// A file of a newer or unknown version, or SQLite failing.
pub(super) fn init_schema(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let context = format!("initializing {}", path.display());
    let err = |e| sql_err(&context, e);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(err)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
    )
    .map_err(err)?;
    let found = read_meta(&tx, META_SCHEMA_VERSION).map_err(err)?;
    let version = match &found {
        None => {
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS events (
                     seq  INTEGER PRIMARY KEY,
                     id   TEXT NOT NULL UNIQUE,
                     ts   INTEGER NOT NULL,
                     kind TEXT NOT NULL,
                     meta TEXT NOT NULL,
                     json TEXT NOT NULL
                 );",
            )
            .map_err(err)?;
            for table in KeptTable::ALL {
                let mut columns = kept::base_columns(table);
                for (name, kind) in kept::extra_columns(table) {
                    columns.push_str(&format!(",\n {name} {kind}"));
                }
                tx.execute_batch(&format!(
                    "CREATE TABLE IF NOT EXISTS {} ({columns});",
                    table.name()
                ))
                .map_err(err)?;
            }
            SCHEMA_VERSION
        }
        Some(found) => check_schema_version(found, path)?,
    };
    if version == 1 {
        migrate_1_to_2(&tx, path).map_err(err)?;
    }
    // Lets recovery read the lifecycle events of a long log without scanning it (and is built
    // once for a file that predates it).
    tx.execute_batch("CREATE INDEX IF NOT EXISTS events_kind ON events (kind, seq);")
        .map_err(err)?;
    // Files of earlier versions index `ts`, which cost every append a b-tree update: a time
    // is found by binary search on `seq` now (`reader::first_seq_at_time`). Dropping it is
    // all the migration there is (an earlier version reads the file as well without it).
    tx.execute_batch("DROP INDEX IF EXISTS events_ts;")
        .map_err(err)?;
    tx.execute_batch(CLAIMS).map_err(err)?;
    tx.execute_batch(kept::INDEXES).map_err(err)?;
    write_meta(&tx, META_SCHEMA_VERSION, &SCHEMA_VERSION.to_string()).map_err(err)?;
    tx.commit().map_err(err)
}

/// Adds and fills the columns of version 2 (the caller's transaction commits it with the new
/// version number, or rolls all of it back).
fn migrate_1_to_2(tx: &rusqlite::Transaction<'_>, path: &Path) -> rusqlite::Result<()> {
    for table in KeptTable::ALL {
        // A version-1 file may predate some kept tables: they start empty.
        tx.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {} ({});",
            table.name(),
            kept::base_columns(table)
        ))?;
        for (name, kind) in kept::extra_columns(table) {
            tx.execute_batch(&format!(
                "ALTER TABLE {} ADD COLUMN {name} {kind};",
                table.name()
            ))?;
        }
    }
    tx.execute_batch(kept::INDEXES)?;
    let rows = kept::backfill(tx)?;
    tracing::info!(path = %path.display(), rows, "event store: migrated schema 1 to 2");
    Ok(())
}

/// The version of a file this version can open (itself, or one it migrates).
fn check_schema_version(found: &str, path: &Path) -> Result<u32, StoreError> {
    match found.trim().parse::<u32>() {
        Ok(v) if v == SCHEMA_VERSION || v == 1 => Ok(v),
        Ok(v) if v > SCHEMA_VERSION => Err(StoreError::Io(format!(
            "{} has event store schema version {v}, newer than this map-router supports \
             ({SCHEMA_VERSION}); upgrade map-router or use another data directory",
            path.display()
        ))),
        _ => Err(StoreError::Corrupt(format!(
            "{} has unknown event store schema version {found:?}",
            path.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_versions() {
        let path = Path::new("/x/events.sqlite3");
        assert_eq!(check_schema_version("2", path).unwrap(), 2);
        assert_eq!(check_schema_version("1", path).unwrap(), 1);
        let newer = check_schema_version("3", path).unwrap_err().to_string();
        assert!(newer.contains("newer"), "{newer}");
        assert!(matches!(
            check_schema_version("0", path),
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            check_schema_version("x", path),
            Err(StoreError::Corrupt(_))
        ));
    }

    /// A file of an earlier build has an index on `ts`: opening drops it and keeps the rows.
    #[test]
    fn the_time_index_of_an_earlier_file_is_dropped() {
        let path = Path::new("events.sqlite3");
        let mut conn = Connection::open_in_memory().unwrap();
        init_schema(&mut conn, path).unwrap();
        conn.execute_batch(
            "CREATE INDEX events_ts ON events (ts);
             INSERT INTO events (seq, id, ts, kind, meta, json) VALUES (0, 'a', 5, 'k', '{}', '{}');",
        )
        .unwrap();
        let indexes = |conn: &Connection| -> Vec<String> {
            let mut stmt = conn
                .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events' ORDER BY name")
                .unwrap();
            let names = stmt.query_map([], |r| r.get(0)).unwrap();
            names.map(Result::unwrap).collect()
        };
        assert!(indexes(&conn).contains(&"events_ts".to_owned()));
        init_schema(&mut conn, path).unwrap();
        let left = indexes(&conn);
        assert!(!left.contains(&"events_ts".to_owned()), "{left:?}");
        assert!(left.contains(&"events_kind".to_owned()), "{left:?}");
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 1);
    }
}
