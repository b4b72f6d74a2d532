//! Tasks a restart interrupted: on the gateway's first use after a start (before it serves
//! anyone), every A2A task the previous run left in flight is ended.
//!
//! Owns the rule (docs/a2a.md, "After a restart"):
//!
//! - a server-side task (`meta.a2a`) in `submitted` or `working` was waiting for an agent's
//!   answer to a message the previous run sent. That call cannot continue: the gateway's agent
//!   session that would have taken the reply is gone, and whether the agent still works on it
//!   cannot be known. It ends `failed`, with the status message "the router restarted while the
//!   task was in flight". (Resuming instead would mean sending the message again, which an
//!   agent that did act on it would do twice.) `input-required` and `auth-required` tasks wait
//!   for their caller, not for a call: they are left as they are, and a follow-up continues
//!   them.
//! - a remote call's mirror task (`meta.a2aRemote`) that is `open` or `in_progress` stood for
//!   an HTTP call of the previous run, which died with it: it ends `failed` the same way.
//!
//! Only tasks last changed before this process started are touched, so nothing of this run is
//! ended. The books session reads and updates them (a `system` session sees every task).
//! Failures are logged; the sweep is bounded ([`MAX_PAGES`] pages of [`PAGE`]).

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::client::Client;
use crate::gateway::a2a::record::{MapTask, Record};
use crate::gateway::a2a::wire::{Message, TaskState};
use crate::protocol::json::RawJson;
use crate::protocol::methods::tasks::{TasksList, TasksUpdate};
use crate::protocol::methods::Method;

/// The status message of a task this sweep ended.
pub const REASON: &str = "the router restarted while the task was in flight";

/// Tasks read per page.
pub const PAGE: u32 = 100;

/// Pages read at most (100 000 tasks in flight).
pub const MAX_PAGES: usize = 1000;

/// Now, in Unix ms (what the gateway notes when it is made: its process's run began then).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A task as a `map/tasks/list` page has it: its id and when it last changed.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Times {
    id: String,
    #[serde(default)]
    updated_at: u64,
}

/// Ends what the previous run left in flight (module docs): tasks last changed before
/// `started` (Unix ms). Returns how many tasks it ended.
pub async fn end_interrupted(books: &Client, started: u64) -> usize {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Page {
        tasks: Vec<Box<serde_json::value::RawValue>>,
        #[serde(default)]
        next_cursor: Option<String>,
    }
    let mut cursor: Option<String> = None;
    let mut ended = 0;
    for _ in 0..MAX_PAGES {
        let mut params = json!({
            "filter": { "status": ["open", "in_progress"] },
            "limit": PAGE,
        });
        if let Some(c) = &cursor {
            params["cursor"] = json!(c);
        }
        let text = match books.call_text(TasksList::NAME, params.to_string()).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "a2a gateway: tasks in flight before the restart could not be listed");
                return ended;
            }
        };
        let Ok(page) = serde_json::from_str::<Page>(&text) else {
            return ended;
        };
        for raw in &page.tasks {
            let (Ok(times), Some(task)) = (
                serde_json::from_str::<Times>(raw.get()),
                MapTask::from_wrapped(&format!(r#"{{"task":{}}}"#, raw.get())),
            ) else {
                continue;
            };
            if times.updated_at >= started {
                continue;
            }
            let update = if let Some(record) = task.record() {
                a2a_update(&times.id, record)
            } else {
                remote_update(&task)
            };
            let Some(params) = update else { continue };
            match books.call_text(TasksUpdate::NAME, params).await {
                Ok(_) => ended += 1,
                Err(e) => {
                    tracing::warn!(task = %times.id, error = %e, "a2a gateway: an interrupted task could not be ended");
                }
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if ended > 0 {
        tracing::info!(
            tasks = ended,
            "a2a gateway: ended the tasks the restart interrupted"
        );
    }
    ended
}

/// The update that fails a server-side task waiting for its agent, if it is one.
fn a2a_update(id: &str, mut record: Record) -> Option<String> {
    if !matches!(record.state, TaskState::Submitted | TaskState::Working) {
        return None;
    }
    let message = Message::agent_text(REASON, id, &record.context_id);
    record.set_state(TaskState::Failed, Some(message));
    #[derive(serde::Serialize)]
    struct Meta<'a> {
        a2a: &'a Record,
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Update<'a> {
        task_id: &'a str,
        status: &'a str,
        meta: Meta<'a>,
    }
    serde_json::to_string(&Update {
        task_id: id,
        status: record.state.map_status(),
        meta: Meta { a2a: &record },
    })
    .ok()
}

/// The update that fails a remote call's mirror task, if it is one (its `meta.a2aRemote` keeps
/// its bytes; `state` and `error` are set).
fn remote_update(task: &MapTask) -> Option<String> {
    let meta = task.meta.as_ref()?;
    let members = meta.members()?;
    let remote = RawJson::from_text(members.get("a2aRemote")?.get()).ok()?;
    let changed = remote.merged(&RawJson::from_value(&json!({
        "state": TaskState::Failed.v03_name(),
        "error": REASON,
    })))?;
    let params = format!(
        r#"{{"taskId":{},"status":"failed","meta":{{"a2aRemote":{}}}}}"#,
        serde_json::to_string(&task.id).ok()?,
        changed.get()
    );
    Some(params)
}
