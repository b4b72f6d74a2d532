//! The kept tables of the JetStream store: a fold of the log into a [`MemoryKept`].
//!
//! Owns nothing itself: the [`MemoryKept`] lives in the store's shared state. A kept row is by
//! design the exact row of the newest event about its key (`store::kept`), so the tables are a
//! pure function of the committed log and every node that reads the same stream folds the same
//! tables. At open, [`load`] reads the retained rows of the kept kinds (and the claims) in
//! sequence order; after that the writer feeds each row to [`MemoryKept::ingest`] once it is
//! acknowledged, before `committed` moves over it, so a query never sees an uncommitted row.
//!
//! **Why per-subject consumers, not a full scan or `read_kinds`.** Rows go to
//! `<prefix>.<kind>`, so the kept kinds are four subject filters (`task.>`,
//! `trajectory.checkpoint`, `mail.>`, `identity.>`); the server skips every other row without
//! sending it. Each filter is read by an ephemeral pull consumer (no acks, `Reader::scan`) in
//! batches of 1024: one round trip per batch, where `read_kinds` spends one direct get (about
//! 190 µs here) per row and does not take wildcards. Server 2.9 has only one filter per
//! consumer, hence four of them. Tables never depend on each other's order, and each filter
//! keeps its own rows in sequence order, which is all a fold per key needs (a claim and its
//! release are both under `identity.>`).
//!
//! **Memory and retention.** Every kept item is in memory (SQLite keeps them on disk and pages
//! them). And the stream's retention limits *do* trim the events kept rows come from: a store
//! reopened after retention deleted a task's last event no longer has that task.
//! `docs/cluster-notes.md` says both.

use std::collections::HashMap;

use super::reader::Reader;
use crate::store::kept::claim_key;
use crate::store::memory::MemoryKept;
use crate::store::record::StoredRow;
use crate::store::StoreError;

/// The subjects (after the prefix) whose rows the fold reads.
const FILTERS: [&str; 4] = ["task.>", "trajectory.checkpoint", "mail.>", "identity.>"];

/// What the fold found at open: the kept tables and the claims still owned (oldest first).
pub(super) struct Loaded {
    pub kept: MemoryKept,
    pub claims: Vec<StoredRow>,
}

/// Folds one row: a claim or its release into `claims` (the newest claim of each id not
/// released), any other row into the kept tables (which ignore rows of kinds they do not keep).
/// The fold at open and a following standby (`follower.rs`) both fold with it.
pub(super) fn fold_row(
    kept: &mut MemoryKept,
    claims: &mut HashMap<String, StoredRow>,
    row: StoredRow,
) {
    if row.kind != "identity.claimed" && row.kind != "identity.released" {
        kept.ingest(row);
        return;
    }
    match claim_key(&row.json) {
        Some(key) if row.kind == "identity.claimed" => {
            claims.insert(key, row);
        }
        Some(key) => {
            claims.remove(&key);
        }
        None => tracing::warn!(event = %row.id, "a claim without its id"),
    }
}

/// Folds the rows `[first, next)` of the kept kinds.
pub(super) async fn load(reader: &Reader, first: u64, next: u64) -> Result<Loaded, StoreError> {
    let mut kept = MemoryKept::default();
    let mut claims: HashMap<String, StoredRow> = HashMap::new();
    if first < next {
        for filter in FILTERS {
            let subject = format!("{}.{filter}", reader.prefix);
            let what = format!("folding {subject}");
            reader
                .scan(&what, &subject, first, next, |row| {
                    fold_row(&mut kept, &mut claims, row);
                    true
                })
                .await?;
        }
    }
    let mut claims: Vec<StoredRow> = claims.into_values().collect();
    claims.sort_by_key(|r| r.seq);
    Ok(Loaded { kept, claims })
}
