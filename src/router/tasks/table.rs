//! [`Tasks`]: every task the router knows, by id and in creation order.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::protocol::methods::tasks::{AnyTaskData, Task};
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

/// The task table.
#[derive(Debug, Default)]
pub struct Tasks {
    by_id: HashMap<String, Arc<Entry>>,
    order: BTreeSet<OrderKey>,
}

impl Tasks {
    /// The table of what the store kept: the newest `task.*` event of each task. A row that
    /// cannot be read is skipped with a warning (it stays in the database).
    pub fn recover(rows: &[StoredRow]) -> Self {
        let mut t = Self::default();
        for row in rows {
            match EventRecord::from_row(row.clone()).and_then(|rec| entry_of(&rec)) {
                Ok(entry) => t.put(entry),
                Err(e) => tracing::warn!(event = %row.id, error = %e, "skipping a stored task"),
            }
        }
        t
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// A task by id.
    pub fn get(&self, id: &str) -> Option<&Arc<Entry>> {
        self.by_id.get(id)
    }

    /// Adds a task, or replaces the one with the same id (its creation time does not change).
    pub fn put(&mut self, entry: Entry) {
        if let Some(old) = self.by_id.remove(&entry.task.id) {
            self.order.remove(&old.key());
        }
        self.order.insert(entry.key());
        self.by_id.insert(entry.task.id.clone(), Arc::new(entry));
    }

    /// Tasks in creation order, strictly after `after` when given.
    pub fn in_order<'a>(
        &'a self,
        after: Option<&OrderKey>,
    ) -> Box<dyn Iterator<Item = &'a Arc<Entry>> + 'a> {
        let keys: Box<dyn Iterator<Item = &OrderKey>> = match after {
            Some(a) => Box::new(self.order.range((
                std::ops::Bound::Excluded(a.clone()),
                std::ops::Bound::Unbounded,
            ))),
            None => Box::new(self.order.iter()),
        };
        Box::new(keys.filter_map(|k| self.by_id.get(&k.1)))
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
