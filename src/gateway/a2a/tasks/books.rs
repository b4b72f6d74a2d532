//! [`Books`]: the gateway's bookkeeping sessions, and reading and writing one A2A task's record
//! through them.
//!
//! Owns: the pool of `system` sessions ([`BOOKS`](super::BOOKS): `a2a-gateway-tasks`, which also
//! holds the feed and the watch of other gateways, and `a2a-gateway-tasks-1` …), each task's
//! calls always on the same one (by its id), so the router's per-connection rate is not one
//! budget for every caller's tasks; what MAP would refuse, refused before it is sent
//! ([`Books::fits`]); and the reads the task rules need (is an agent live, is a gateway gone).
//!
//! It does not order anything: a read-modify-write of a task's record is made only by the task
//! writer (`writer.rs`), which applies one change of a task at a time. The task itself is the
//! source of truth: nothing about a task is kept in memory here.

use serde::Serialize;
use serde_json::json;

use crate::client::Client;
use crate::gateway::a2a::error::A2aError;
use crate::gateway::a2a::limits::{Limits, MAP_ENVELOPE_BYTES};
use crate::gateway::a2a::record::{MapTask, Record};
use crate::protocol::agent::PresenceStatus;
use crate::protocol::json::RawJson;
use crate::protocol::trace::TraceContext;

use super::ids::is_gateway_agent;
use super::target::Target;

/// The `map/tasks/*` methods (docs/tasks.md), called with JSON text so that the verbatim
/// members of `meta.a2a` keep their bytes both ways.
pub(super) mod methods {
    use crate::protocol::methods::tasks::{TasksCreate, TasksGet, TasksList, TasksUpdate};
    use crate::protocol::methods::Method;
    pub const CREATE: &str = TasksCreate::NAME;
    pub const UPDATE: &str = TasksUpdate::NAME;
    pub const GET: &str = TasksGet::NAME;
    pub const LIST: &str = TasksList::NAME;
}

/// The books sessions, the limits MAP applies, and which gateway agent is this gateway's.
#[derive(Debug)]
pub(super) struct Books {
    /// The `system` sessions; the first also carries calls about no task.
    sessions: Vec<Client>,
    /// What MAP takes.
    limits: Limits,
    /// This gateway's agent id (`a2a-gateway`, or `a2a-gateway@<node>` on a standby): a task
    /// whose message another gateway sent waits on that one.
    gateway: String,
}

/// Calls `method` on `client` with JSON text both ways (so that the verbatim members of
/// `meta.a2a` keep their bytes), in A2A's words on failure.
pub(super) async fn call(
    client: &Client,
    method: &str,
    params: String,
    task: Option<&str>,
) -> Result<String, A2aError> {
    client
        .call_text(method, params)
        .await
        .map_err(|e| A2aError::from_map(&e, task))
}

impl Books {
    /// The pool (`sessions` in [`BOOKS`](super::BOOKS) order, at least one).
    pub(super) fn new(sessions: Vec<Client>, limits: Limits, gateway: String) -> Self {
        Self {
            sessions,
            limits,
            gateway,
        }
    }

    /// The first session: the feed's, and the one for calls about no task.
    pub(super) fn first(&self) -> &Client {
        &self.sessions[0]
    }

    /// The limits MAP applies.
    pub(super) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The session of task `id` (always the same one for a task).
    fn for_task(&self, id: &str) -> &Client {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        id.hash(&mut h);
        let n = usize::try_from(h.finish() % self.sessions.len() as u64).unwrap_or(0);
        &self.sessions[n]
    }

    /// Calls `method` about task `task` (or none: the first session).
    pub(super) async fn call(
        &self,
        method: &str,
        params: String,
        task: Option<&str>,
    ) -> Result<String, A2aError> {
        let books = task.map_or(self.first(), |t| self.for_task(t));
        call(books, method, params, task).await
    }

    /// Whether MAP would take a request with these `params` (JSON text): the frame within
    /// `max_frame_bytes`, nested at most `max_depth` deep.
    ///
    /// # Errors
    /// 413 (-32600) naming the limit and `what` would have broken it.
    pub(super) fn fits(&self, params: &str, what: &str) -> Result<(), A2aError> {
        let bytes = params.len() + MAP_ENVELOPE_BYTES;
        if bytes > self.limits.max_frame_bytes {
            return Err(A2aError::too_large(format!(
                "{what} would be a MAP request of {bytes} bytes, over the router's limit of {} ([limits] max_frame_bytes)",
                self.limits.max_frame_bytes
            )));
        }
        // The envelope adds one level.
        let depth = self.limits.max_depth.saturating_sub(1);
        crate::protocol::jsonrpc::check_depth(params, depth).map_err(|_| {
            A2aError::too_large(format!(
                "{what} would nest deeper than the router's limit of {} levels ([limits] max_depth)",
                self.limits.max_depth
            ))
        })
    }

    /// Task `id` as MAP has it (`{"task": ...}`, JSON text).
    ///
    /// # Errors
    /// MAP's refusals (-32001 for an unknown task).
    pub(super) async fn get(&self, id: &str) -> Result<String, A2aError> {
        self.call(methods::GET, json!({ "taskId": id }).to_string(), Some(id))
            .await
    }

    /// The A2A task `id`, as the books have it, when `target` serves it (no caller rule).
    ///
    /// # Errors
    /// -32001 (404 at a former agent's URL) when there is no such task, it is not an A2A
    /// task, or `target` does not serve it.
    pub(super) async fn load(&self, target: &Target, id: &str) -> Result<Record, A2aError> {
        let text = self.get(id).await.map_err(|e| {
            if e.code == crate::gateway::a2a::error::code::TASK_NOT_FOUND {
                target.not_found(id)
            } else {
                e
            }
        })?;
        let record = MapTask::from_wrapped(&text)
            .and_then(|t| t.record())
            .ok_or_else(|| target.not_found(id))?;
        if !self.serves(target, &record).await {
            return Err(target.not_found(id));
        }
        Ok(record)
    }

    /// Writes `record` as the task's new state: `status` follows the A2A state; `result`, when
    /// given, becomes `meta.result` (what `task.completed` reports); `trace`, the context of
    /// the request or report that changed it, the call's `params._meta`. Only the task writer
    /// calls it (module docs).
    pub(super) async fn write(
        &self,
        id: &str,
        record: &Record,
        result: Option<&RawJson>,
        trace: Option<&TraceContext>,
    ) -> Result<(), A2aError> {
        #[derive(Serialize)]
        struct Meta<'a> {
            a2a: &'a Record,
            #[serde(skip_serializing_if = "Option::is_none")]
            result: Option<&'a RawJson>,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Update<'a> {
            task_id: &'a str,
            status: &'a str,
            meta: Meta<'a>,
        }
        let params = serde_json::to_string(&Update {
            task_id: id,
            status: record.state.map_status(),
            meta: Meta {
                a2a: record,
                result,
            },
        })
        .map_err(A2aError::internal)?;
        let params = crate::gateway::trace::with_meta_text(params, trace);
        self.fits(&params, &format!("task {id}"))?;
        self.call(methods::UPDATE, params, Some(id)).await.map(drop)
    }

    /// Whether `target` serves `record`: the router endpoint serves every task; an agent's URL
    /// the tasks of that agent and, when their agent is gone, those of an agent of the same
    /// name (a restart gave it a new id); a former agent's URL the tasks of the agent that had
    /// that id or name.
    async fn serves(&self, target: &Target, record: &Record) -> bool {
        match target {
            Target::Router => true,
            Target::Agent(a) if a.id.as_str() == record.agent => true,
            Target::Agent(a) => {
                a.name.is_some()
                    && a.name == record.agent_name
                    && !self.agent_live(&record.agent).await
            }
            Target::Former(s) => {
                &record.agent == s || record.agent_name.as_deref() == Some(s.as_str())
            }
        }
    }

    /// Whether the agent `id` is registered now.
    pub(super) async fn agent_live(&self, id: &str) -> bool {
        self.first().get_agent(id).await.is_ok()
    }

    /// Whether the agent `id` is registered and online now (an orphaned one is offline).
    async fn agent_online(&self, id: &str) -> bool {
        self.first().get_agent(id).await.is_ok_and(|a| {
            a.presence
                .is_none_or(|p| p.status == PresenceStatus::Online)
        })
    }

    /// Whether `record` waits for a reply that another node's gateway agent was to receive,
    /// and that gateway is gone (unregistered, or offline: its node died).
    pub(super) async fn sender_gone(&self, record: &Record) -> bool {
        match record.gateway.as_deref() {
            Some(g) if g != self.gateway && is_gateway_agent(g) => !self.agent_online(g).await,
            _ => false,
        }
    }
}
