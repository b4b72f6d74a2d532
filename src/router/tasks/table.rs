//! [`Tasks`]: the tasks the router holds in memory, a bounded cache of the store's `tasks`
//! table (which has every task: the router pages the rest from it, `router::kept`), and how
//! many tasks there are.

use std::sync::Arc;

use crate::protocol::methods::tasks::{AnyTaskData, Task};
use crate::router::kept::cache::Cache;
use crate::store::record::{Audience, EventRecord, StoredRow};

/// Where a task sits in creation order: creation time, then id.
pub type OrderKey = (u64, String);

/// One task and who may see it.
#[derive(Debug)]
pub struct Entry {
    /// The task as answered.
    pub task: Task,
    /// Who may see it: the audience of its newest event.
    pub audience: Audience,
}

impl Entry {
    /// Its place in creation order.
    pub fn key(&self) -> OrderKey {
        (self.task.created_at, self.task.id.clone())
    }
}

/// The task table's part in memory.
#[derive(Debug)]
pub struct Tasks {
    /// Tasks by id: those in use, at most about its capacity, plus writes not yet committed.
    pub cache: Cache<Entry>,
    /// How many tasks exist (the gauge `map_tasks`).
    pub total: u64,
}

impl Tasks {
    /// A cache of `capacity` tasks, over `total` stored ones.
    pub fn new(capacity: usize, total: u64) -> Self {
        Self {
            cache: Cache::new(capacity),
            total,
        }
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.total as usize
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Stores the router's write of a task (its newest event at `written`).
    pub fn put(&mut self, entry: Entry, written: u64) {
        let id = entry.task.id.clone();
        self.cache.put(&id, Arc::new(entry), written);
    }
}

/// The table entry of a `task.*` event (its data's `task`, its audience).
///
/// # Errors
/// When the event's data carries no task.
pub fn entry_of(rec: &EventRecord) -> Result<Entry, String> {
    #[derive(serde::Deserialize)]
    struct Event {
        data: AnyTaskData,
    }
    let ev: Event =
        serde_json::from_str(&rec.json).map_err(|e| format!("not a task event: {e}"))?;
    Ok(Entry {
        task: ev.data.task,
        audience: rec.audience.clone(),
    })
}

/// The entry of a stored task row.
///
/// # Errors
/// A row this version cannot read.
pub fn entry_of_row(row: StoredRow) -> Result<Entry, String> {
    entry_of(&EventRecord::from_row(row)?)
}
