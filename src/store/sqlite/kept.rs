//! The kept tables in SQLite: their indexed columns, the writer's upserts (in the transaction
//! of the events they come from), and the readers' answers to [`KeptQuery`]s.
//!
//! What is kept, under which key and with which columns is `store::kept`'s business
//! ([`kept_of`]); this file only says how SQLite stores and finds it. Every query is served by
//! an index (the `CREATE INDEX`es of [`INDEXES`]), so a page costs a range scan of the page,
//! not of the table.

use rusqlite::types::Value as SqlValue;
use rusqlite::{params_from_iter, Connection, OptionalExtension, Transaction};

use crate::store::kept::{
    kept_of, Columns, ConversationLoad, KeptAnswer, KeptCounts, KeptQuery, KeptRow, KeptTable,
    KeptWrite, OwnerCounts, PageQuery, ThreadAuthor,
};
use crate::store::record::StoredRow;
use crate::store::sqlite::sql::{from_sql_int, sql_err, sql_int, stored_row};
use crate::store::StoreError;

/// The columns every kept table has (schema version 1): the key, then the stored row.
pub(super) fn base_columns(table: KeptTable) -> String {
    format!(
        "{key} TEXT PRIMARY KEY,
         seq  INTEGER NOT NULL,
         id   TEXT NOT NULL,
         ts   INTEGER NOT NULL,
         kind TEXT NOT NULL,
         meta TEXT NOT NULL,
         json TEXT NOT NULL",
        key = table.key()
    )
}

/// The indexed columns each table gained in schema version 2, with their SQL types. `owner`
/// is written once, with a key's first row, and never updated.
pub(super) fn extra_columns(table: KeptTable) -> &'static [(&'static str, &'static str)] {
    match table {
        KeptTable::Tasks => &[
            ("owner", "TEXT"),
            ("created_at", "INTEGER NOT NULL DEFAULT 0"),
            ("status", "TEXT NOT NULL DEFAULT ''"),
            ("assignee", "TEXT"),
        ],
        KeptTable::Checkpoints => &[
            ("owner", "TEXT"),
            ("agent", "TEXT NOT NULL DEFAULT ''"),
            ("cts", "INTEGER NOT NULL DEFAULT 0"),
        ],
        KeptTable::Conversations => &[
            ("owner", "TEXT"),
            ("created_at", "INTEGER NOT NULL DEFAULT 0"),
        ],
        KeptTable::Turns => &[
            ("conversation", "TEXT NOT NULL DEFAULT ''"),
            ("thread", "TEXT"),
            ("participant", "TEXT NOT NULL DEFAULT ''"),
            ("tts", "INTEGER NOT NULL DEFAULT 0"),
        ],
        KeptTable::Threads => &[("conversation", "TEXT NOT NULL DEFAULT ''")],
    }
}

/// The membership index of conversations, and every index the queries use.
pub(super) const INDEXES: &str = "
    CREATE TABLE IF NOT EXISTS conversation_members (
        participant  TEXT NOT NULL,
        created_at   INTEGER NOT NULL,
        conversation TEXT NOT NULL,
        PRIMARY KEY (participant, created_at, conversation)
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS tasks_order ON tasks (created_at, task);
    CREATE INDEX IF NOT EXISTS tasks_assignee ON tasks (assignee, created_at, task);
    CREATE INDEX IF NOT EXISTS tasks_owner ON tasks (owner) WHERE owner IS NOT NULL;
    CREATE INDEX IF NOT EXISTS checkpoints_order ON checkpoints (cts, seq, checkpoint);
    CREATE INDEX IF NOT EXISTS checkpoints_agent ON checkpoints (agent, cts, seq, checkpoint);
    CREATE INDEX IF NOT EXISTS checkpoints_owner ON checkpoints (owner) WHERE owner IS NOT NULL;
    CREATE INDEX IF NOT EXISTS conversations_order ON conversations (created_at, conversation);
    CREATE INDEX IF NOT EXISTS conversations_owner ON conversations (owner) WHERE owner IS NOT NULL;
    CREATE INDEX IF NOT EXISTS turns_order ON turns (conversation, seq);
    CREATE INDEX IF NOT EXISTS turns_time ON turns (conversation, tts);
    CREATE INDEX IF NOT EXISTS turns_threads ON turns (conversation, thread, participant)
        WHERE thread IS NOT NULL;
    CREATE INDEX IF NOT EXISTS threads_order ON threads (conversation, seq);
";

/// The values of [`extra_columns`] for a write, in that order.
fn extra_values(w: &KeptWrite) -> Vec<SqlValue> {
    let text = |s: &str| SqlValue::Text(s.to_owned());
    let opt = |s: &Option<String>| s.as_deref().map_or(SqlValue::Null, text);
    let int = |v: u64| SqlValue::Integer(sql_int(v));
    match &w.columns {
        Columns::Task {
            created_at,
            status,
            assignee,
        } => vec![opt(&w.owner), int(*created_at), text(status), opt(assignee)],
        Columns::Checkpoint { agent, timestamp } => {
            vec![opt(&w.owner), text(agent), int(*timestamp)]
        }
        Columns::Conversation { created_at, .. } => vec![opt(&w.owner), int(*created_at)],
        Columns::Turn {
            conversation,
            thread,
            participant,
            timestamp,
        } => vec![
            text(conversation),
            opt(thread),
            text(participant),
            int(*timestamp),
        ],
        Columns::Thread { conversation } => vec![text(conversation)],
    }
}

/// The upsert of a kept row: every column but `owner` follows the newest row.
fn upsert_sql(table: KeptTable) -> String {
    let extra = extra_columns(table);
    let names: Vec<&str> = extra.iter().map(|(n, _)| *n).collect();
    let marks: Vec<String> = (1..=7 + names.len()).map(|i| format!("?{i}")).collect();
    let mut updates = vec![
        "seq = excluded.seq".to_owned(),
        "id = excluded.id".to_owned(),
        "ts = excluded.ts".to_owned(),
        "kind = excluded.kind".to_owned(),
        "meta = excluded.meta".to_owned(),
        "json = excluded.json".to_owned(),
    ];
    updates.extend(
        names
            .iter()
            .filter(|n| **n != "owner")
            .map(|n| format!("{n} = excluded.{n}")),
    );
    format!(
        "INSERT INTO {t} ({k}, seq, id, ts, kind, meta, json{comma}{names}) VALUES ({marks}) \
         ON CONFLICT ({k}) DO UPDATE SET {updates}",
        t = table.name(),
        k = table.key(),
        comma = if names.is_empty() { "" } else { ", " },
        names = names.join(", "),
        marks = marks.join(", "),
        updates = updates.join(", ")
    )
}

/// Writes `row` into its kept table when its type is kept (in the caller's transaction). A kept
/// type whose data lacks its key is logged and left to the log alone.
pub(super) fn write(tx: &Transaction<'_>, row: &StoredRow) -> rusqlite::Result<()> {
    let w = match kept_of(&row.kind, &row.json, &row.meta) {
        None => return Ok(()),
        Some(Ok(w)) => w,
        Some(Err(e)) => {
            tracing::warn!(event = %row.id, kind = %row.kind, error = %e, "an event without the id it is kept by");
            return Ok(());
        }
    };
    let mut values = vec![
        SqlValue::Text(w.key.clone()),
        SqlValue::Integer(sql_int(row.seq)),
        SqlValue::Text(row.id.clone()),
        SqlValue::Integer(sql_int(row.timestamp)),
        SqlValue::Text(row.kind.clone()),
        SqlValue::Text(row.meta.clone()),
        SqlValue::Text(row.json.clone()),
    ];
    values.extend(extra_values(&w));
    tx.prepare_cached(&upsert_sql(w.table))?
        .execute(params_from_iter(values))?;
    add_members(tx, &w)
}

/// A conversation's participants into the membership index (never removed: those that left
/// still read the conversation).
fn add_members(conn: &Connection, w: &KeptWrite) -> rusqlite::Result<()> {
    if let Columns::Conversation {
        created_at,
        members,
    } = &w.columns
    {
        let mut stmt = conn.prepare_cached(
            "INSERT OR IGNORE INTO conversation_members (participant, created_at, conversation) \
             VALUES (?1, ?2, ?3)",
        )?;
        for m in members {
            stmt.execute(rusqlite::params![m, sql_int(*created_at), w.key])?;
        }
    }
    Ok(())
}

/// Fills the columns of schema version 2 from the rows a version-1 file holds (their owners
/// stay unknown: version 1 did not record them), and the membership index.
pub(super) fn backfill(tx: &Transaction<'_>) -> rusqlite::Result<u64> {
    let mut done = 0;
    for table in KeptTable::ALL {
        let rows: Vec<(String, String, String, String)> = {
            let mut stmt = tx.prepare(&format!(
                "SELECT {}, kind, meta, json FROM {}",
                table.key(),
                table.name()
            ))?;
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows
        };
        let extra = extra_columns(table);
        let sets: Vec<String> = extra
            .iter()
            .enumerate()
            .map(|(i, (n, _))| format!("{n} = ?{}", i + 2))
            .collect();
        let sql = format!(
            "UPDATE {} SET {} WHERE {} = ?1",
            table.name(),
            sets.join(", "),
            table.key()
        );
        for (key, kind, meta, json) in rows {
            let Some(Ok(w)) = kept_of(&kind, &json, &meta) else {
                tracing::warn!(table = table.name(), key = %key, "a kept row this version cannot index");
                continue;
            };
            let mut values = vec![SqlValue::Text(key)];
            values.extend(extra_values(&w));
            tx.prepare_cached(&sql)?.execute(params_from_iter(values))?;
            add_members(tx, &w)?;
            done += 1;
        }
    }
    Ok(done)
}

/// How many tasks, conversations and checkpoints are kept.
pub(super) fn counts(conn: &Connection) -> rusqlite::Result<KeptCounts> {
    let n = |t: KeptTable| -> rusqlite::Result<u64> {
        conn.query_row(&format!("SELECT count(*) FROM {}", t.name()), [], |r| {
            r.get::<_, i64>(0)
        })
        .map(|v| v.max(0) as u64)
    };
    Ok(KeptCounts {
        tasks: n(KeptTable::Tasks)?,
        conversations: n(KeptTable::Conversations)?,
        checkpoints: n(KeptTable::Checkpoints)?,
    })
}

/// The stored columns of a kept table, and for conversations the newest turn's timestamp.
fn select_list(table: KeptTable, alias: &str) -> String {
    let cols =
        format!("{alias}.seq, {alias}.id, {alias}.ts, {alias}.kind, {alias}.meta, {alias}.json");
    match table {
        KeptTable::Conversations => format!(
            "{cols}, (SELECT max(tts) FROM turns t WHERE t.conversation = {alias}.conversation)"
        ),
        _ => format!("{cols}, NULL"),
    }
}

/// Runs a query selecting [`select_list`].
fn kept_rows(
    conn: &Connection,
    sql: &str,
    values: Vec<SqlValue>,
) -> rusqlite::Result<Vec<KeptRow>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt
        .query_map(params_from_iter(values), |r| {
            let last: Option<i64> = r.get(6)?;
            Ok(KeptRow {
                row: stored_row(r, 0)?,
                last_turn_at: last.map(|v| v.max(0) as u64),
            })
        })?
        .collect();
    rows
}

/// Answers a query on a reader's connection.
pub(super) fn answer(conn: &Connection, q: &KeptQuery) -> Result<KeptAnswer, StoreError> {
    let err = |e| sql_err("reading the kept tables", e);
    match q {
        KeptQuery::Get { table, keys } => {
            const CHUNK: usize = 500;
            let mut out = Vec::new();
            for chunk in keys.chunks(CHUNK) {
                let marks = vec!["?"; chunk.len()].join(", ");
                let sql = format!(
                    "SELECT {} FROM {} k WHERE k.{} IN ({marks})",
                    select_list(*table, "k"),
                    table.name(),
                    table.key()
                );
                let values = chunk.iter().map(|k| SqlValue::Text(k.clone())).collect();
                out.extend(kept_rows(conn, &sql, values).map_err(err)?);
            }
            Ok(KeptAnswer::Rows(out))
        }
        KeptQuery::Page(p) => page(conn, p).map(KeptAnswer::Rows).map_err(err),
        KeptQuery::Conversation { id } => conversation(conn, id)
            .map(|c| KeptAnswer::Conversation(c.map(Box::new)))
            .map_err(err),
        KeptQuery::TurnSeqAt { conversation, ts } => conn
            .query_row(
                "SELECT seq FROM turns WHERE conversation = ?1 AND tts >= ?2 ORDER BY seq LIMIT 1",
                rusqlite::params![conversation, sql_int(*ts)],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .map_err(err)?
            .map(|s| from_sql_int(s, "seq"))
            .transpose()
            .map(KeptAnswer::Seq),
        KeptQuery::OwnerCounts { owner } => {
            let n = |t: KeptTable| -> Result<u64, StoreError> {
                conn.query_row(
                    &format!("SELECT count(*) FROM {} WHERE owner = ?1", t.name()),
                    [owner],
                    |r| r.get::<_, i64>(0),
                )
                .map(|v| v.max(0) as u64)
                .map_err(err)
            };
            Ok(KeptAnswer::Counts(OwnerCounts {
                tasks: n(KeptTable::Tasks)?,
                conversations: n(KeptTable::Conversations)?,
                checkpoints: n(KeptTable::Checkpoints)?,
            }))
        }
    }
}

fn page(conn: &Connection, p: &PageQuery) -> rusqlite::Result<Vec<KeptRow>> {
    let mut values: Vec<SqlValue> = Vec::new();
    let mut conds: Vec<String> = Vec::new();
    let bind = |v: SqlValue, values: &mut Vec<SqlValue>| {
        values.push(v);
        format!("?{}", values.len())
    };
    let text = |s: &str| SqlValue::Text(s.to_owned());
    let int = |v: u64| SqlValue::Integer(sql_int(v));
    let sql = match p {
        PageQuery::Tasks {
            after,
            assignee,
            statuses,
            limit,
        } => {
            if let Some((at, id)) = after {
                let a = bind(int(*at), &mut values);
                let b = bind(text(id), &mut values);
                conds.push(format!("(k.created_at, k.task) > ({a}, {b})"));
            }
            if let Some(a) = assignee {
                let a = bind(text(a), &mut values);
                conds.push(format!("k.assignee = {a}"));
            }
            if !statuses.is_empty() {
                let marks: Vec<String> = statuses
                    .iter()
                    .map(|s| bind(text(s), &mut values))
                    .collect();
                conds.push(format!("k.status IN ({})", marks.join(", ")));
            }
            let limit = bind(int(*limit as u64), &mut values);
            format!(
                "SELECT {} FROM tasks k {} ORDER BY k.created_at, k.task LIMIT {limit}",
                select_list(KeptTable::Tasks, "k"),
                where_clause(&conds)
            )
        }
        PageQuery::Checkpoints {
            before,
            agent,
            after_ts,
            before_ts,
            limit,
        } => {
            if let Some((ts, seq, id)) = before {
                let a = bind(int(*ts), &mut values);
                let b = bind(int(*seq), &mut values);
                let c = bind(text(id), &mut values);
                conds.push(format!("(k.cts, k.seq, k.checkpoint) < ({a}, {b}, {c})"));
            }
            if let Some(a) = agent {
                let a = bind(text(a), &mut values);
                conds.push(format!("k.agent = {a}"));
            }
            if let Some(t) = after_ts {
                let t = bind(int(*t), &mut values);
                conds.push(format!("k.cts > {t}"));
            }
            if let Some(t) = before_ts {
                let t = bind(int(*t), &mut values);
                conds.push(format!("k.cts < {t}"));
            }
            let limit = bind(int(*limit as u64), &mut values);
            format!(
                "SELECT {} FROM checkpoints k {} \
                 ORDER BY k.cts DESC, k.seq DESC, k.checkpoint DESC LIMIT {limit}",
                select_list(KeptTable::Checkpoints, "k"),
                where_clause(&conds)
            )
        }
        PageQuery::Conversations {
            after,
            members,
            limit,
        } => {
            let select = select_list(KeptTable::Conversations, "k");
            match members {
                None => {
                    if let Some((at, id)) = after {
                        let a = bind(int(*at), &mut values);
                        let b = bind(text(id), &mut values);
                        conds.push(format!("(k.created_at, k.conversation) > ({a}, {b})"));
                    }
                    let limit = bind(int(*limit as u64), &mut values);
                    format!(
                        "SELECT {select} FROM conversations k {} \
                         ORDER BY k.created_at, k.conversation LIMIT {limit}",
                        where_clause(&conds)
                    )
                }
                Some(ids) => {
                    if ids.is_empty() {
                        return Ok(Vec::new());
                    }
                    let marks: Vec<String> =
                        ids.iter().map(|s| bind(text(s), &mut values)).collect();
                    conds.push(format!("m.participant IN ({})", marks.join(", ")));
                    if let Some((at, id)) = after {
                        let a = bind(int(*at), &mut values);
                        let b = bind(text(id), &mut values);
                        conds.push(format!("(m.created_at, m.conversation) > ({a}, {b})"));
                    }
                    let limit = bind(int(*limit as u64), &mut values);
                    format!(
                        "SELECT {select} FROM conversations k JOIN (\
                             SELECT DISTINCT m.created_at, m.conversation \
                             FROM conversation_members m {} \
                             ORDER BY m.created_at, m.conversation LIMIT {limit}\
                         ) p ON p.conversation = k.conversation \
                         ORDER BY k.created_at, k.conversation",
                        where_clause(&conds)
                    )
                }
            }
        }
        PageQuery::Turns {
            conversation,
            after_seq,
            before_seq,
            desc,
            limit,
        } => {
            let c = bind(text(conversation), &mut values);
            conds.push(format!("k.conversation = {c}"));
            if let Some(s) = after_seq {
                let s = bind(int(*s), &mut values);
                conds.push(format!("k.seq > {s}"));
            }
            if let Some(s) = before_seq {
                let s = bind(int(*s), &mut values);
                conds.push(format!("k.seq < {s}"));
            }
            let limit = bind(int(*limit as u64), &mut values);
            format!(
                "SELECT {} FROM turns k {} ORDER BY k.conversation, k.seq {} LIMIT {limit}",
                select_list(KeptTable::Turns, "k"),
                where_clause(&conds),
                if *desc { "DESC" } else { "ASC" }
            )
        }
    };
    kept_rows(conn, &sql, values)
}

fn where_clause(conds: &[String]) -> String {
    if conds.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conds.join(" AND "))
    }
}

/// One conversation, its threads and its counts.
fn conversation(conn: &Connection, id: &str) -> rusqlite::Result<Option<ConversationLoad>> {
    let sql = format!(
        "SELECT {} FROM conversations k WHERE k.conversation = ?1",
        select_list(KeptTable::Conversations, "k")
    );
    let Some(row) = kept_rows(conn, &sql, vec![SqlValue::Text(id.to_owned())])?
        .into_iter()
        .next()
    else {
        return Ok(None);
    };
    let threads = conn
        .prepare_cached(
            "SELECT seq, id, ts, kind, meta, json FROM threads WHERE conversation = ?1 ORDER BY seq",
        )?
        .query_map([id], |r| stored_row(r, 0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let turns: i64 = conn.query_row(
        "SELECT count(*) FROM turns WHERE conversation = ?1",
        [id],
        |r| r.get(0),
    )?;
    let thread_authors = conn
        .prepare_cached(
            "SELECT thread, participant, count(*), max(tts) FROM turns \
             WHERE conversation = ?1 AND thread IS NOT NULL GROUP BY thread, participant",
        )?
        .query_map([id], |r| {
            Ok(ThreadAuthor {
                thread: r.get(0)?,
                author: r.get(1)?,
                turns: r.get::<_, i64>(2)?.max(0) as u64,
                last_at: r.get::<_, i64>(3)?.max(0) as u64,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(Some(ConversationLoad {
        row,
        threads,
        turns: turns.max(0) as u64,
        thread_authors,
    }))
}
