//! [`MemoryKept`]: the kept tables of a router without a store (`--ephemeral`), in memory.
//!
//! Owns every kept row of such a router (there is nowhere else to page them from) and answers
//! the same [`KeptQuery`]s as the SQLite store, with the same order and the same results
//! (`kept.rs` defines them). The router owns one, feeds it each kept event as it is logged
//! (`ingest`), and queries it on its own task; nothing else touches it. Its size grows with
//! what participants create, bounded by the per-principal quotas (`router::quotas`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use crate::store::kept::{
    kept_of, Columns, ConversationLoad, KeptAnswer, KeptCounts, KeptQuery, KeptRow, KeptTable,
    OwnerCounts, PageQuery, ThreadAuthor,
};
use crate::store::record::StoredRow;

/// One kept row with what it is indexed by.
#[derive(Debug)]
struct Stored {
    row: StoredRow,
    columns: Columns,
}

/// The kept tables, in memory.
#[derive(Debug, Default)]
pub struct MemoryKept {
    rows: HashMap<KeptTable, HashMap<String, Stored>>,
    tasks: BTreeSet<(u64, String)>,
    checkpoints: BTreeSet<(u64, u64, String)>,
    conversations: BTreeSet<(u64, String)>,
    /// Participant id → the conversations it takes (or took) part in, in creation order.
    members: HashMap<String, BTreeSet<(u64, String)>>,
    /// Conversation → its turns by seq.
    turns: HashMap<String, BTreeMap<u64, String>>,
    /// Conversation → the newest timestamp of its turns.
    last_turn_at: HashMap<String, u64>,
    /// Conversation → its threads by seq.
    threads: HashMap<String, BTreeMap<u64, String>>,
    /// Quota owner → what it created; the owner of a key is the one of its first row.
    owners: HashMap<String, OwnerCounts>,
    /// Key → its owner (only keys with one).
    owner_of: HashMap<(KeptTable, String), String>,
}

impl MemoryKept {
    /// Keeps a logged event's row when its type is kept (the newest per key wins, as in the
    /// store). A kept type whose data lacks its key is skipped with a warning.
    pub fn ingest(&mut self, row: StoredRow) {
        let write = match kept_of(&row.kind, &row.json, &row.meta) {
            None => return,
            Some(Ok(w)) => w,
            Some(Err(e)) => {
                tracing::warn!(event = %row.id, kind = %row.kind, error = %e, "an event without the id it is kept by");
                return;
            }
        };
        let table = write.table;
        let key = write.key;
        let old = self.rows.get_mut(&table).and_then(|t| t.remove(&key));
        match &old {
            Some(old) => self.unindex(table, &key, old),
            None => {
                if let Some(owner) = write.owner {
                    let counts = self.owners.entry(owner.clone()).or_default();
                    match table {
                        KeptTable::Tasks => counts.tasks += 1,
                        KeptTable::Checkpoints => counts.checkpoints += 1,
                        KeptTable::Conversations => counts.conversations += 1,
                        KeptTable::Turns | KeptTable::Threads => {}
                    }
                    self.owner_of.insert((table, key.clone()), owner);
                }
            }
        }
        let stored = Stored {
            columns: write.columns,
            row,
        };
        self.index(table, &key, &stored);
        self.rows.entry(table).or_default().insert(key, stored);
    }

    fn index(&mut self, table: KeptTable, key: &str, s: &Stored) {
        match &s.columns {
            Columns::Task { created_at, .. } => {
                self.tasks.insert((*created_at, key.to_owned()));
            }
            Columns::Checkpoint { timestamp, .. } => {
                self.checkpoints
                    .insert((*timestamp, s.row.seq, key.to_owned()));
            }
            Columns::Conversation {
                created_at,
                members,
            } => {
                self.conversations.insert((*created_at, key.to_owned()));
                for m in members {
                    self.members
                        .entry(m.clone())
                        .or_default()
                        .insert((*created_at, key.to_owned()));
                }
            }
            Columns::Turn {
                conversation,
                timestamp,
                ..
            } => {
                self.turns
                    .entry(conversation.clone())
                    .or_default()
                    .insert(s.row.seq, key.to_owned());
                let last = self.last_turn_at.entry(conversation.clone()).or_default();
                *last = (*last).max(*timestamp);
            }
            Columns::Thread { conversation } => {
                self.threads
                    .entry(conversation.clone())
                    .or_default()
                    .insert(s.row.seq, key.to_owned());
            }
        }
        let _ = table;
    }

    /// Removes a row's index entries (before its key's newer row is indexed). Membership and
    /// a turn's newest timestamp only grow, as in the store.
    fn unindex(&mut self, _table: KeptTable, key: &str, s: &Stored) {
        match &s.columns {
            Columns::Task { created_at, .. } => {
                self.tasks.remove(&(*created_at, key.to_owned()));
            }
            Columns::Checkpoint { timestamp, .. } => {
                self.checkpoints
                    .remove(&(*timestamp, s.row.seq, key.to_owned()));
            }
            Columns::Conversation { created_at, .. } => {
                self.conversations.remove(&(*created_at, key.to_owned()));
            }
            Columns::Turn { conversation, .. } => {
                if let Some(t) = self.turns.get_mut(conversation) {
                    t.remove(&s.row.seq);
                }
            }
            Columns::Thread { conversation } => {
                if let Some(t) = self.threads.get_mut(conversation) {
                    t.remove(&s.row.seq);
                }
            }
        }
    }

    /// How many items each paged table holds.
    pub fn counts(&self) -> KeptCounts {
        let n = |t| self.rows.get(&t).map_or(0, |r| r.len() as u64);
        KeptCounts {
            tasks: n(KeptTable::Tasks),
            conversations: n(KeptTable::Conversations),
            checkpoints: n(KeptTable::Checkpoints),
        }
    }

    fn stored(&self, table: KeptTable, key: &str) -> Option<&Stored> {
        self.rows.get(&table)?.get(key)
    }

    fn kept_row(&self, table: KeptTable, key: &str) -> Option<KeptRow> {
        let s = self.stored(table, key)?;
        Some(KeptRow {
            row: s.row.clone(),
            last_turn_at: match table {
                KeptTable::Conversations => self.last_turn_at.get(key).copied(),
                _ => None,
            },
        })
    }

    /// Answers a query, as the store would.
    pub fn query(&self, q: &KeptQuery) -> KeptAnswer {
        match q {
            KeptQuery::Get { table, keys } => KeptAnswer::Rows(
                keys.iter()
                    .filter_map(|k| self.kept_row(*table, k))
                    .collect(),
            ),
            KeptQuery::Page(p) => KeptAnswer::Rows(self.page(p)),
            KeptQuery::Conversation { id } => KeptAnswer::Conversation(
                self.kept_row(KeptTable::Conversations, id)
                    .map(|row| Box::new(self.conversation(id, row))),
            ),
            KeptQuery::TurnSeqAt { conversation, ts } => KeptAnswer::Seq(
                self.turns
                    .get(conversation)
                    .into_iter()
                    .flatten()
                    .find(|(_, key)| {
                        matches!(
                            self.stored(KeptTable::Turns, key).map(|s| &s.columns),
                            Some(Columns::Turn { timestamp, .. }) if timestamp >= ts
                        )
                    })
                    .map(|(seq, _)| *seq),
            ),
            KeptQuery::OwnerCounts { owner } => {
                KeptAnswer::Counts(self.owners.get(owner).copied().unwrap_or_default())
            }
        }
    }

    fn conversation(&self, id: &str, row: KeptRow) -> ConversationLoad {
        let threads = self
            .threads
            .get(id)
            .into_iter()
            .flatten()
            .filter_map(|(_, key)| self.stored(KeptTable::Threads, key))
            .map(|s| s.row.clone())
            .collect();
        let mut authors: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        let mut turns = 0;
        for key in self.turns.get(id).into_iter().flatten().map(|(_, k)| k) {
            turns += 1;
            if let Some(Columns::Turn {
                thread: Some(thread),
                participant,
                timestamp,
                ..
            }) = self.stored(KeptTable::Turns, key).map(|s| &s.columns)
            {
                let e = authors
                    .entry((thread.clone(), participant.clone()))
                    .or_default();
                e.0 += 1;
                e.1 = e.1.max(*timestamp);
            }
        }
        let thread_authors = authors
            .into_iter()
            .map(|((thread, author), (turns, last_at))| ThreadAuthor {
                thread,
                author,
                turns,
                last_at,
            })
            .collect();
        ConversationLoad {
            row,
            threads,
            turns,
            thread_authors,
        }
    }

    fn page(&self, p: &PageQuery) -> Vec<KeptRow> {
        match p {
            PageQuery::Tasks {
                after,
                assignee,
                statuses,
                limit,
            } => {
                let range = match after {
                    Some(a) => self
                        .tasks
                        .range((Bound::Excluded(a.clone()), Bound::Unbounded)),
                    None => self.tasks.range(..),
                };
                range
                    .filter(|(_, key)| {
                        matches!(
                            self.stored(KeptTable::Tasks, key).map(|s| &s.columns),
                            Some(Columns::Task { status, assignee: a, .. })
                                if assignee.as_ref().is_none_or(|x| a.as_ref() == Some(x))
                                    && (statuses.is_empty() || statuses.contains(status))
                        )
                    })
                    .take(*limit)
                    .filter_map(|(_, key)| self.kept_row(KeptTable::Tasks, key))
                    .collect()
            }
            PageQuery::Checkpoints {
                before,
                agent,
                after_ts,
                before_ts,
                limit,
            } => {
                let range = match before {
                    Some(b) => self.checkpoints.range(..b.clone()),
                    None => self.checkpoints.range(..),
                };
                range
                    .rev()
                    .filter(|(ts, _, key)| {
                        after_ts.is_none_or(|t| *ts > t)
                            && before_ts.is_none_or(|t| *ts < t)
                            && agent.as_ref().is_none_or(|a| {
                                matches!(
                                    self.stored(KeptTable::Checkpoints, key).map(|s| &s.columns),
                                    Some(Columns::Checkpoint { agent: x, .. }) if x == a
                                )
                            })
                    })
                    .take(*limit)
                    .filter_map(|(_, _, key)| self.kept_row(KeptTable::Checkpoints, key))
                    .collect()
            }
            PageQuery::Conversations {
                after,
                members,
                limit,
            } => {
                let from = |set: &BTreeSet<(u64, String)>| -> Vec<(u64, String)> {
                    let range = match after {
                        Some(a) => set.range((Bound::Excluded(a.clone()), Bound::Unbounded)),
                        None => set.range(..),
                    };
                    range.take(*limit).cloned().collect()
                };
                let keys: Vec<(u64, String)> = match members {
                    None => from(&self.conversations),
                    Some(ids) => {
                        let mut all = BTreeSet::new();
                        for id in ids {
                            if let Some(set) = self.members.get(id) {
                                all.extend(from(set));
                            }
                        }
                        all.into_iter().take(*limit).collect()
                    }
                };
                keys.iter()
                    .filter_map(|(_, key)| self.kept_row(KeptTable::Conversations, key))
                    .collect()
            }
            PageQuery::Turns {
                conversation,
                after_seq,
                before_seq,
                desc,
                limit,
            } => {
                let Some(turns) = self.turns.get(conversation) else {
                    return Vec::new();
                };
                let lo = after_seq.map_or(Bound::Unbounded, Bound::Excluded);
                let hi = before_seq.map_or(Bound::Unbounded, Bound::Excluded);
                if matches!((after_seq, before_seq), (Some(a), Some(b)) if a >= b) {
                    return Vec::new();
                }
                let range = turns.range((lo, hi));
                let keys: Vec<&String> = if *desc {
                    range.rev().take(*limit).map(|(_, k)| k).collect()
                } else {
                    range.take(*limit).map(|(_, k)| k).collect()
                };
                keys.into_iter()
                    .filter_map(|k| self.kept_row(KeptTable::Turns, k))
                    .collect()
            }
        }
    }
}
