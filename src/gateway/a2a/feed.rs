//! [`Feed`]: one MAP subscription to `task.*` events, fanned out to the A2A streams and
//! blocking sends that watch a task.
//!
//! Owns: the watcher table (task id → senders). A watcher registers *before* the gateway reads
//! or creates its task, so every event after that read reaches it; events it already saw in
//! the read are recognised by `meta.a2a.seq` and skipped by the watcher ([`Snapshot::seq`]).
//!
//! Slow watchers: each has a bounded queue ([`WATCHER_QUEUE`]); a watcher whose queue is full is
//! dropped (its stream ends, the caller resubscribes and reads the task again), never skipped
//! silently. The subscription itself is the Rust client's: it pauses and replays, losing
//! nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use tokio::sync::mpsc;

use crate::client::Subscription;
use crate::gateway::a2a::push::Push;
use crate::gateway::a2a::record::{MapTask, Snapshot};

/// Updates queued per watcher before it is dropped as too slow. A task has a handful of
/// updates; an agent streaming many artifact chunks to a stalled reader ends that reader's
/// stream rather than growing memory.
pub const WATCHER_QUEUE: usize = 256;

/// The watcher table.
#[derive(Debug, Default)]
pub struct Feed {
    // NB: a std mutex, never held across an await.
    watchers: Mutex<HashMap<String, Vec<mpsc::Sender<Snapshot>>>>,
}

impl Feed {
    /// Starts watching `task_id`. Dropping the receiver ends the watch (the sender is removed
    /// at the task's next event).
    pub fn watch(&self, task_id: &str) -> mpsc::Receiver<Snapshot> {
        let (tx, rx) = mpsc::channel(WATCHER_QUEUE);
        if let Ok(mut w) = self.watchers.lock() {
            // Watches that ended (a caller gone, a task never created) of tasks that have not
            // changed since go here, so the table holds live watches only.
            w.retain(|_, list| {
                list.retain(|tx| !tx.is_closed());
                !list.is_empty()
            });
            w.entry(task_id.to_owned()).or_default().push(tx);
        }
        rx
    }

    /// Hands one event's task to its watchers.
    fn publish(&self, snapshot: Snapshot) {
        let Ok(mut w) = self.watchers.lock() else {
            return;
        };
        let Some(list) = w.get_mut(&snapshot.task_id) else {
            return;
        };
        list.retain(|tx| tx.try_send(snapshot.clone()).is_ok());
        if list.is_empty() {
            w.remove(&snapshot.task_id);
        }
    }

    /// Reads the subscription until it ends, publishing every A2A task's change (to the
    /// watchers, and to `push` for the webhooks).
    pub async fn run(&self, mut events: Subscription, push: Arc<Push>) {
        while let Some(envelope) = events.next().await {
            if !envelope.kind().starts_with("task.") {
                continue;
            }
            let Some(data) = envelope.event.data.as_ref() else {
                continue;
            };
            let Some(task) = MapTask::from_wrapped(data.get()) else {
                continue;
            };
            if let Some(record) = task.record() {
                let snapshot = Snapshot {
                    task_id: task.id,
                    record,
                };
                push.notify(&snapshot);
                self.publish(snapshot);
            }
        }
        tracing::debug!("a2a gateway: task feed ended");
        // Ending every watch tells the streams the feed is gone.
        if let Ok(mut w) = self.watchers.lock() {
            w.clear();
        }
    }
}
