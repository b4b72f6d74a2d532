//! Tasks a restart interrupted: from the gateway's first use after a start, every A2A task the
//! previous run left in flight is resumed when its agent is back, and ended when it is not.
//!
//! Owns the rule (docs/a2a.md, "After a restart"):
//!
//! - a server-side task (`meta.a2a`) in `submitted` or `working` waits for an answer to a
//!   message the previous run sent its agent. An agent that reconnects under its id (what the
//!   SDKs' `AgentConnection` does) still holds the request, and its replies reach the gateway
//!   agent, whose id does not change: the task is **resumed** as it is, and streams can
//!   resubscribe to it. An agent that is not back within [`RECONNECT_GRACE`] of the router's
//!   start (or, past that, at the gateway's first use) cannot answer: the task ends `failed`,
//!   with the status message [`REASON`]. (Sending the message again instead would make an agent
//!   that did act on it act twice.) An agent of the same name under a new id is a new process
//!   that never got the request: it does not resume the task.
//! - `input-required` and `auth-required` tasks wait for their caller, not for a call: they are
//!   left as they are; a follow-up continues them.
//! - a remote call's mirror task (`meta.a2aRemote`) that is `open` or `in_progress` stood for
//!   an HTTP call of the previous run, which died with it: it ends `failed` at once, the same
//!   way (`state: failed`, `error` = [`REASON`]).
//!
//! Only tasks last changed before the gateway was made are touched, and each is read again by
//! the task writer (`tasks/writer.rs`), in order with its other changes, before it is ended,
//! so nothing this run did (a follow-up, a cancel, the agent's reply) is overwritten. Failures
//! are logged; the sweep is bounded ([`MAX_PAGES`] pages of [`PAGE`]).

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::client::Client;
use crate::gateway::a2a::record::MapTask;
use crate::gateway::a2a::wire::TaskState;
use crate::protocol::json::RawJson;
use crate::protocol::methods::tasks::{TasksList, TasksUpdate};
use crate::protocol::methods::Method;

/// The status message of a task ended because the restart interrupted it.
pub const REASON: &str = "the router restarted while the task was in flight";

/// How long after the router's start an agent may take to reconnect and so resume its tasks
/// (the SDKs reconnect within a few seconds).
pub const RECONNECT_GRACE: Duration = Duration::from_secs(10);

/// Tasks read per page.
pub const PAGE: u32 = 100;

/// Pages read at most (100 000 tasks in flight).
pub const MAX_PAGES: usize = 1000;

/// Now, in Unix ms (what the gateway notes when it is made: its run began then).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// When a task last changed, as `map/tasks/*` has it.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Times {
    pub(super) id: String,
    #[serde(default)]
    pub(super) updated_at: u64,
}

/// Ends or resumes what the previous run left in flight (module docs), the previous run being
/// everything last changed before `started` (Unix ms). Runs beside the gateway (spawned by
/// `Core::start`, which gives it `end`: ends one server-side task if it is still interrupted
/// and its agent not back, through the task writer); returns how many tasks it ended.
pub(super) async fn run<F, Fut>(books: Client, started: u64, end: F) -> usize
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = bool>,
{
    let mut waiting = Vec::new();
    let mut remote = Vec::new();
    each_in_flight(&books, |times, task| {
        if times.updated_at >= started {
            return;
        }
        if let Some(record) = task.record() {
            if record.state.awaits_agent() {
                waiting.push(times.id);
            }
        } else if let Some(params) = remote_update(&task) {
            remote.push((times.id, params));
        }
    })
    .await;
    let mut ended = 0;
    for (id, params) in remote {
        match books.call_text(TasksUpdate::NAME, params).await {
            Ok(_) => ended += 1,
            Err(e) => {
                tracing::warn!(task = %id, error = %e, "a2a gateway: an interrupted remote call's task could not be ended");
            }
        }
    }
    if !waiting.is_empty() {
        // Give the agents the grace to come back, counted from the router's start.
        let grace_ends =
            started.saturating_add(u64::try_from(RECONNECT_GRACE.as_millis()).unwrap_or(0));
        let left = grace_ends.saturating_sub(now_ms());
        tokio::time::sleep(Duration::from_millis(left)).await;
        for id in waiting {
            if end(id).await {
                ended += 1;
            }
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

/// The server-side tasks in flight (`submitted`, `working`) whose latest message the gateway
/// agent `gateway` sent (`Record::gateway`), at most [`MAX_PAGES`] pages of them.
pub(super) async fn waiting_on(books: &Client, gateway: &str) -> Vec<String> {
    let mut waiting = Vec::new();
    each_in_flight(books, |times, task| {
        if task
            .record()
            .is_some_and(|r| r.gateway.as_deref() == Some(gateway) && r.state.awaits_agent())
        {
            waiting.push(times.id);
        }
    })
    .await;
    waiting
}

/// Hands every task in flight (MAP `open`, `in_progress`) to `each`, page by page, at most
/// [`MAX_PAGES`] pages of [`PAGE`]; stops at a listing that fails (logged by [`page`]).
async fn each_in_flight(books: &Client, mut each: impl FnMut(Times, MapTask)) {
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let Some((tasks, next)) = page(books, cursor.as_deref()).await else {
            return;
        };
        for (times, task) in tasks {
            each(times, task);
        }
        match next {
            Some(n) => cursor = Some(n),
            None => return,
        }
    }
}

/// One page of the tasks in flight (`open`, `in_progress`): each with its times, and the next
/// cursor. `None` when the listing failed (logged).
async fn page(
    books: &Client,
    cursor: Option<&str>,
) -> Option<(Vec<(Times, MapTask)>, Option<String>)> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Page {
        tasks: Vec<Box<serde_json::value::RawValue>>,
        #[serde(default)]
        next_cursor: Option<String>,
    }
    let mut params = json!({
        "filter": { "status": ["open", "in_progress"] },
        "limit": PAGE,
    });
    if let Some(c) = cursor {
        params["cursor"] = json!(c);
    }
    let text = match books.call_text(TasksList::NAME, params.to_string()).await {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "a2a gateway: the tasks in flight before the restart could not be listed");
            return None;
        }
    };
    let page: Page = serde_json::from_str(&text).ok()?;
    let tasks = page
        .tasks
        .iter()
        .filter_map(|raw| {
            let times = serde_json::from_str::<Times>(raw.get()).ok()?;
            let task = MapTask::from_wrapped(&format!(r#"{{"task":{}}}"#, raw.get()))?;
            Some((times, task))
        })
        .collect();
    Some((tasks, page.next_cursor))
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
    Some(format!(
        r#"{{"taskId":{},"status":"failed","meta":{{"a2aRemote":{}}}}}"#,
        serde_json::to_string(&task.id).ok()?,
        changed.get()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_calls_task_keeps_its_bytes_and_fails() {
        let task = MapTask::from_wrapped(
            r#"{"task":{"id":"a2a-remote:x:t","status":"in_progress","meta":{"a2aRemote":{"state":"working","artifacts":[{"parts":[{"data":{"z":1.50,"a":[]}}]}],"agent":"x"}}}}"#,
        )
        .unwrap();
        let params = remote_update(&task).unwrap();
        assert_eq!(
            params,
            r#"{"taskId":"a2a-remote:x:t","status":"failed","meta":{"a2aRemote":{"state":"failed","artifacts":[{"parts":[{"data":{"z":1.50,"a":[]}}]}],"agent":"x","error":"the router restarted while the task was in flight"}}}"#
        );
        // A task that is no remote call's is left alone.
        let other = MapTask::from_wrapped(r#"{"task":{"id":"t","meta":{"x":1}}}"#).unwrap();
        assert!(remote_update(&other).is_none());
    }
}
