//! The kept tables of the JetStream store: a fold of the log into a [`MemoryKept`].
//!
//! Owns nothing itself: the [`MemoryKept`] lives in the store's shared state. A kept row is by
//! design the exact row of the newest event about its key (`store::kept`), so the tables are a
//! pure function of the committed log and every node that reads the same stream folds the same
//! tables. At open, [`load`] reads the retained rows of the kept kinds (and the claims and
//! saved records) in
//! sequence order; after that the writer feeds each row to [`MemoryKept::ingest`] once it is
//! acknowledged, before `committed` moves over it, so a query never sees an uncommitted row.
//!
//! **Why per-subject consumers, not a full scan or `read_kinds`.** Rows go to
//! `<prefix>.<kind>`, so the kept kinds are five subject filters (`task.>`,
//! `trajectory.checkpoint`, `mail.>`, `identity.>`, `state.>`); the server skips every other row without
//! sending it. Each filter is read by an ephemeral pull consumer (no acks, `Reader::scan`) in
//! batches of 1024: one round trip per batch, where `read_kinds` spends one direct get (about
//! 190 µs here) per row and does not take wildcards. Server 2.9 has only one filter per
//! consumer, hence five of them. Tables never depend on each other's order, and each filter
//! keeps its own rows in sequence order, which is all a fold per key needs (a claim and its
//! release are both under `identity.>`).
//!
//! **Memory and retention.** Every kept item is in memory (SQLite keeps them on disk and pages
//! them). And the stream's retention limits *do* trim the events kept rows come from: a store
//! reopened after retention deleted a task's last event no longer has that task.
//! `docs/cluster-notes.md` says both.

use std::collections::HashMap;

use super::reader::Reader;
use crate::protocol::event::EventType;
use crate::store::kept::{claim_key, saved_key, saved_records, SavedRecord};
use crate::store::memory::MemoryKept;
use crate::store::record::StoredRow;
use crate::store::{SavedCounts, StoreError};

/// The subjects (after the prefix) whose rows the fold reads.
const FILTERS: [&str; 5] = [
    "task.>",
    "trajectory.checkpoint",
    "mail.>",
    "identity.>",
    "state.>",
];

/// The rows that come back whole at open, newest per key: the claims still owned and the
/// saved sessions, agents and scopes not dropped (`router::handover`).
#[derive(Debug, Default)]
pub(super) struct Whole {
    pub claims: HashMap<String, StoredRow>,
    pub saved: HashMap<String, StoredRow>,
}

impl Whole {
    /// The maps of what a store's open returned (`Recovered::claims` and `saved`).
    pub(super) fn of(claims: Vec<StoredRow>, saved: Vec<StoredRow>) -> Self {
        Self {
            claims: claims
                .into_iter()
                .filter_map(|row| claim_key(&row.json).map(|key| (key, row)))
                .collect(),
            saved: saved
                .into_iter()
                .filter_map(|row| saved_key(&row.json).map(|key| (key, row)))
                .collect(),
        }
    }

    /// The saved records by kind.
    pub(super) fn saved_counts(&self) -> SavedCounts {
        let mut c = SavedCounts::default();
        for key in self.saved.keys() {
            match key.split_once(':').map(|(kind, _)| kind) {
                Some("session") => c.sessions += 1,
                Some("agent") => c.agents += 1,
                Some("scope") => c.scopes += 1,
                _ => {}
            }
        }
        c
    }

    /// Both sets as a store's open returns them: oldest first.
    pub(super) fn rows(&self) -> (Vec<StoredRow>, Vec<StoredRow>) {
        let sorted = |m: &HashMap<String, StoredRow>| {
            let mut rows: Vec<StoredRow> = m.values().cloned().collect();
            rows.sort_by_key(|r| r.seq);
            rows
        };
        (sorted(&self.claims), sorted(&self.saved))
    }
}

/// What the fold found at open: the kept tables, the claims still owned and the saved records
/// (both oldest first).
pub(super) struct Loaded {
    pub kept: MemoryKept,
    pub claims: Vec<StoredRow>,
    pub saved: Vec<StoredRow>,
}

/// The claims' and saved records' kinds: what [`fold_row`] folds besides the kept tables'.
const CLAIMED: &str = EventType::IdentityClaimed.as_str();
const RELEASED: &str = EventType::IdentityReleased.as_str();
const SAVED: &str = EventType::StateSaved.as_str();
const DROPPED: &str = EventType::StateDropped.as_str();

/// Whether [`fold_row`] keeps anything of a row of `kind`: most rows (messages, lifecycle
/// events) it ignores, and a follower need not copy them for it.
pub(super) fn folds(kind: &str) -> bool {
    matches!(kind, CLAIMED | RELEASED | SAVED | DROPPED)
        || crate::store::kept::KeptTable::of_kind(kind).is_some()
}

/// Folds one row: a claim or its release into `whole.claims` (the newest claim of each id not
/// released), a saved record or its drop into `whole.saved`, any other row into the kept
/// tables (which ignore rows of kinds they do not keep, [`folds`]). The fold at open and a
/// following standby (`follower.rs`) both fold with it.
pub(super) fn fold_row(kept: &mut MemoryKept, whole: &mut Whole, row: StoredRow) {
    if row.kind == SAVED {
        if let Some(records) = saved_records(&row.json) {
            fold_records(whole, &row, records);
            return;
        }
    }
    let (map, key, keep) = match row.kind.as_str() {
        CLAIMED | RELEASED => (&mut whole.claims, claim_key(&row.json), row.kind == CLAIMED),
        SAVED | DROPPED => (&mut whole.saved, saved_key(&row.json), row.kind == SAVED),
        _ => {
            kept.ingest(row);
            return;
        }
    };
    match key {
        Some(key) if keep => {
            map.insert(key, row);
        }
        Some(key) => {
            map.remove(&key);
        }
        None => tracing::warn!(event = %row.id, kind = %row.kind, "a kept record without its key"),
    }
}

/// Folds a row of several saved records (`store::kept::saved_records`): each kept one becomes
/// a row of its own, as a row of one record reads (`{"data": <record>}`, the batch row's seq,
/// id and time), so what a takeover restores is one row per key whichever way it was written.
fn fold_records(whole: &mut Whole, batch: &StoredRow, records: Vec<SavedRecord>) {
    for SavedRecord { key, json } in records {
        match json {
            Some(record) => {
                let row = StoredRow {
                    seq: batch.seq,
                    id: batch.id.clone(),
                    timestamp: batch.timestamp,
                    kind: SAVED.to_owned(),
                    meta: batch.meta.clone(),
                    json: format!("{{\"data\":{record}}}"),
                };
                whole.saved.insert(key, row);
            }
            None => {
                whole.saved.remove(&key);
            }
        }
    }
}

/// Folds the rows `[first, next)` of the kept kinds.
pub(super) async fn load(reader: &Reader, first: u64, next: u64) -> Result<Loaded, StoreError> {
    let mut kept = MemoryKept::default();
    let mut whole = Whole::default();
    if first < next {
        for filter in FILTERS {
            let subject = format!("{}.{filter}", reader.prefix);
            let what = format!("folding {subject}");
            reader
                .scan(&what, &subject, first, next, |row| {
                    fold_row(&mut kept, &mut whole, row);
                    true
                })
                .await?;
        }
    }
    let (claims, saved) = whole.rows();
    Ok(Loaded {
        kept,
        claims,
        saved,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::{fold_row, Whole};
    use crate::store::memory::MemoryKept;
    use crate::store::record::StoredRow;

    fn row(seq: u64, kind: &str, data: Value) -> StoredRow {
        StoredRow {
            seq,
            id: format!("id-{seq}"),
            timestamp: seq,
            kind: kind.into(),
            meta: "{}".into(),
            json: json!({"type": kind, "data": data}).to_string(),
        }
    }

    /// The saved record of each key the fold holds: (key, seq, `data` as restore reads it).
    fn held(whole: &Whole) -> Vec<(String, u64, Value)> {
        let mut v: Vec<(String, u64, Value)> = whole
            .saved
            .iter()
            .map(|(k, r)| {
                let event: Value = serde_json::from_str(&r.json).unwrap();
                (k.clone(), r.seq, event["data"].clone())
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    #[test]
    fn rows_of_several_records_fold_to_one_row_per_key_and_rows_of_one_still_fold() {
        let mut kept = MemoryKept::default();
        let mut whole = Whole::default();
        let a1 = json!({"key": "agent:a", "agent": {"agent": {"id": "a", "state": "active"}}});
        let s1 = json!({"key": "session:s", "session": {"id": "s"}});
        // A node before batches: one record, and a drop as its own kind.
        fold_row(
            &mut kept,
            &mut whole,
            row(
                1,
                "state.saved",
                json!({"key": "scope:t", "scope": {"scope": {"id": "t"}}}),
            ),
        );
        fold_row(
            &mut kept,
            &mut whole,
            row(2, "state.saved", json!({"records": [a1, s1]})),
        );
        assert_eq!(
            held(&whole),
            [
                ("agent:a".to_owned(), 2, a1.clone()),
                (
                    "scope:t".to_owned(),
                    1,
                    json!({"key": "scope:t", "scope": {"scope": {"id": "t"}}})
                ),
                ("session:s".to_owned(), 2, s1.clone()),
            ]
        );
        // A later row: the agent changed, the scope dropped (in the row), the session as it was.
        let a2 = json!({"key": "agent:a", "agent": {"agent": {"id": "a", "state": "orphaned"}}});
        fold_row(
            &mut kept,
            &mut whole,
            row(
                3,
                "state.saved",
                json!({"records": [a2, {"key": "scope:t"}]}),
            ),
        );
        assert_eq!(
            held(&whole),
            [
                ("agent:a".to_owned(), 3, a2.clone()),
                ("session:s".to_owned(), 2, s1.clone()),
            ]
        );
        fold_row(
            &mut kept,
            &mut whole,
            row(4, "state.dropped", json!({"key": "session:s"})),
        );
        // A record without its key is skipped; the rest of its row is not.
        fold_row(
            &mut kept,
            &mut whole,
            row(
                5,
                "state.saved",
                json!({"records": [{"agent": {}}, {"key": "agent:a"}]}),
            ),
        );
        assert!(held(&whole).is_empty(), "{:?}", held(&whole));
        // What a store's open returns goes back through `Whole::of` by the same keys.
        fold_row(
            &mut kept,
            &mut whole,
            row(6, "state.saved", json!({"records": [a1, s1]})),
        );
        let (_, saved) = whole.rows();
        let again = Whole::of(Vec::new(), saved);
        assert_eq!(held(&again), held(&whole));
        assert_eq!(held(&again).len(), 2);
    }
}
