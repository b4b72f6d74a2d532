//! What A2A callers ask of tasks, as MAP calls: read one ([`Core::task`]), send a message (a
//! new task, or the next turn of one: [`Core::send`]), cancel ([`Core::cancel`]), list
//! ([`Core::list`]).
//!
//! Owns the order of each request's steps: what is done *as the caller* (its own MAP session,
//! `access::Caller`: resolving the agent, creating the task so `tasks.canCreate` applies, the
//! `messaging.canSend` check, the `controls` rule on reads and changes) and what the books do;
//! every change of a task's record goes through the task writer (`writer.rs`), never written
//! here. What MAP would refuse is refused before anything is made or changed (the payload
//! limit here, the frame and depth limits in `books.rs`).

use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc;

use crate::gateway::a2a::access::Caller;
use crate::gateway::a2a::error::A2aError;
use crate::gateway::a2a::push::PushConfig;
use crate::gateway::a2a::record::{agent_payload, rfc3339_now, MapTask, Record, Snapshot};
use crate::gateway::a2a::wire::{Message, Role, TaskState, TaskView};
use crate::protocol::agent::Agent;
use crate::protocol::capabilities::Capability;
use crate::protocol::json::RawJson;
use crate::protocol::methods::messaging::SendParams as MapSendParams;

use super::books::call;
use super::books::methods;
use super::writer::Edit;
use super::{Core, Target, LIST_SCAN_PAGE, LIST_SCAN_PAGES};

impl Core {
    /// The A2A task `id` at `target`, when `caller` controls it (`access.rs`).
    ///
    /// # Errors
    /// -32001 when there is no such task, it is not an A2A task, it belongs to another agent
    /// than `target`, or `caller` does not control it: the same answer, so that existence
    /// does not leak (404 at a former agent's URL, also the same for all).
    pub async fn task(
        &self,
        caller: &Caller,
        target: &Target,
        id: &str,
    ) -> Result<Record, A2aError> {
        let record = self.books.load(target, id).await?;
        if !caller.controls(&record).await {
            return Err(target.not_found(id));
        }
        Ok(record)
    }

    /// A new message from an A2A caller: a new task (or the next turn of the task it names)
    /// and a `map/send` to the agent. Returns the task's id, its record as created (seq 0,
    /// `submitted`) and, when `watch`, a watcher registered before the task existed.
    ///
    /// # Errors
    /// 403 when the caller may not send (`messaging.canSend`) or create tasks
    /// (`tasks.canCreate`); -32001 / -32004 for a follow-up to a task that is unknown, not the
    /// caller's to control, or over; MAP failures.
    pub async fn send(
        &self,
        caller: &Caller,
        target: &Target,
        mut message: Message,
        metadata: Option<RawJson>,
        push: Option<PushConfig>,
        watch: bool,
    ) -> Result<(String, Record, Option<mpsc::Receiver<Snapshot>>), A2aError> {
        message.role = Role::User;
        // NB: what MAP would refuse is refused here, before anything is made or changed.
        let payload = agent_payload(&message);
        let max_payload = self.books.limits().max_payload_bytes;
        if payload.len() > max_payload {
            return Err(A2aError::too_large(format!(
                "the message's content is {} bytes as a MAP message, over the router's limit of {} ([limits] max_payload_bytes)",
                payload.len(),
                max_payload
            )));
        }
        self.books.fits(payload.get(), "the message to the agent")?;
        let (id, first, watcher) = match message.task_id.clone() {
            Some(id) => {
                // The caller must control the task, and may still send to its agent: the
                // task's, or after a restart the one that has its agent's name now.
                let current = self.task(caller, target, &id).await?;
                caller.require(Capability::CanSend)?;
                let agent = self.agent_of(caller, &current, &id).await?;
                let watcher = watch.then(|| self.feed.watch(&id));
                let gateway = self.agent.id().to_string();
                let (task, mut turn) = (id.clone(), message.clone());
                let edit: Edit = Box::new(move |r| {
                    if r.state.is_terminal() {
                        return Err(A2aError::unsupported(format!(
                            "task {task} is {}; send a message without taskId to start a new task",
                            r.state.v03_name()
                        )));
                    }
                    if let Some(c) = &turn.context_id {
                        if c != &r.context_id {
                            return Err(A2aError::invalid_params(format!(
                                "task {task} belongs to context {}",
                                r.context_id
                            )));
                        }
                    }
                    turn.context_id = Some(r.context_id.clone());
                    r.history.push(turn);
                    r.agent = agent.id.to_string();
                    r.agent_name = agent.name;
                    r.gateway = Some(gateway);
                    r.set_state(TaskState::Working, None);
                    Ok(None)
                });
                let record = self
                    .writer
                    .edit(target, &id, edit, caller.trace().cloned())
                    .await?;
                if let Some(config) = push {
                    // After the change (a refused follow-up registers nothing); the webhook gets the
                    // changes from here on.
                    self.push.set(&id, config)?;
                }
                (id, record, watcher)
            }
            None => {
                let agent = match target {
                    Target::Agent(agent) => agent,
                    Target::Former(name) => return Err(A2aError::unknown_agent(name)),
                    Target::Router => {
                        return Err(A2aError::invalid_params(
                            "the router endpoint takes follow-ups only (message.taskId); send new tasks to /a2a/agents/{agentId}",
                        ))
                    }
                };
                // NB: checked before anything is made: a caller who may not send creates no task.
                caller.require(Capability::CanSend)?;
                let id = format!("task-{}", crate::protocol::ids::Ulid::random());
                let context_id = message
                    .context_id
                    .clone()
                    .unwrap_or_else(|| format!("ctx-{}", crate::protocol::ids::Ulid::random()));
                message.task_id = Some(id.clone());
                message.context_id = Some(context_id.clone());
                let record = Record {
                    context_id,
                    state: TaskState::Submitted,
                    status_message: None,
                    timestamp: Some(rfc3339_now()),
                    artifacts: Vec::new(),
                    history: vec![message.clone()],
                    seq: 0,
                    update: None,
                    agent: agent.id.to_string(),
                    agent_name: agent.name.clone(),
                    metadata,
                    owner: caller.owner(),
                    message_only: false,
                    gateway: Some(self.agent.id().to_string()),
                };
                let created = create_params(&id, agent, &message, &record)?;
                let first = record.clone();
                let mut working = record;
                working.set_state(TaskState::Working, None);
                // The record is written right after the task is made: too big, nothing is made.
                self.books.fits(
                    &serde_json::to_string(&working).map_err(A2aError::internal)?,
                    "the new task",
                )?;
                if let Some(config) = push {
                    self.push.set(&id, config)?;
                }
                let watcher = watch.then(|| self.feed.watch(&id));
                let created = crate::gateway::trace::with_meta_text(created, caller.trace());
                if let Err(e) = call(caller.session(), methods::CREATE, created, None).await {
                    self.push.forget(&id);
                    return Err(e);
                }
                // The record as made (`submitted`: webhooks get the task first), then
                // `working`.
                self.writer
                    .created(&id, first.clone(), working, caller.trace().cloned())
                    .await?;
                (id, first, watcher)
            }
        };
        let to = RawJson::from_value(&json!({ "agent": first.agent }));
        let mut meta = json!({
            "protocol": "a2a",
            "correlationId": id,
            "expectsResponse": true,
            "a2a": {
                "taskId": id,
                "contextId": first.context_id,
                "messageId": message.message_id,
                "method": caller.method(),
            }
        });
        if let Some(m) = meta.as_object_mut() {
            // The caller's context is the message's parent (its headers, `gateway::trace`).
            crate::gateway::trace::insert_meta(m, caller.trace());
        }
        let meta = RawJson::from_value(&meta);
        let sent = self
            .client
            .send_with(MapSendParams {
                to,
                payload: Some(payload),
                meta: Some(meta),
            })
            .await;
        let undelivered = match sent {
            Ok(r) if r.delivered.is_empty() && r.queued.is_empty() => {
                Some("the agent is not connected".to_owned())
            }
            Ok(_) => None,
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = undelivered {
            let (task, context) = (id.clone(), first.context_id.clone());
            let edit: Edit = Box::new(move |r| {
                r.set_state(
                    TaskState::Failed,
                    Some(Message::agent_text(
                        format!("could not deliver the message to agent {}: {why}", r.agent),
                        &task,
                        &context,
                    )),
                );
                Ok(None)
            });
            self.writer
                .edit(&Target::Router, &id, edit, caller.trace().cloned())
                .await?;
        }
        Ok((id, first, watcher))
    }

    /// `CancelTask`: tells the agent (`{"a2a": {"cancel": id}}`) and ends the task `canceled`.
    ///
    /// # Errors
    /// -32001 (also a task the caller does not control), or -32002 when the task has already
    /// ended.
    pub async fn cancel(
        &self,
        caller: &Caller,
        target: &Target,
        id: &str,
    ) -> Result<Record, A2aError> {
        self.task(caller, target, id).await?;
        let task = id.to_owned();
        let edit: Edit = Box::new(move |r| {
            if r.state.is_terminal() {
                return Err(A2aError::not_cancelable(&task, r.state.v03_name()));
            }
            r.set_state(TaskState::Canceled, None);
            Ok(None)
        });
        let record = self
            .writer
            .edit(target, id, edit, caller.trace().cloned())
            .await?;
        let mut meta = json!({
            "protocol": "a2a",
            "correlationId": id,
            "a2a": {
                "taskId": id,
                "contextId": record.context_id,
                "control": "cancel",
                "method": caller.method(),
            }
        });
        if let Some(m) = meta.as_object_mut() {
            crate::gateway::trace::insert_meta(m, caller.trace());
        }
        let control = MapSendParams {
            to: RawJson::from_value(&json!({ "agent": record.agent })),
            payload: Some(RawJson::from_value(&json!({ "a2a": { "cancel": id } }))),
            meta: Some(RawJson::from_value(&meta)),
        };
        if let Err(e) = self.client.send_with(control).await {
            tracing::debug!(task = id, error = %e, "a2a gateway: cancel notice not delivered");
        }
        Ok(record)
    }

    /// `ListTasks`: the A2A tasks of `target` that `caller` controls, in creation order, at
    /// most `limit`; and the token of the next page, if there may be one (the id of the last
    /// task looked at, a MAP cursor).
    ///
    /// The books list every task; the caller's are picked out page by page (`limit` tasks,
    /// then [`LIST_SCAN_PAGE`] tasks a page, at most [`LIST_SCAN_PAGES`] pages a call).
    ///
    /// # Errors
    /// MAP failures (an unknown page token is -32602).
    pub async fn list(
        &self,
        caller: &Caller,
        target: &Target,
        context_id: Option<&str>,
        state: Option<TaskState>,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<(Vec<TaskView>, Option<String>), A2aError> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Page {
            tasks: Vec<MapTask>,
            #[serde(default)]
            next_cursor: Option<String>,
        }
        let mut filter = serde_json::Map::new();
        if let Target::Agent(a) = target {
            filter.insert("assignee".into(), json!(a.id));
        }
        if let Some(s) = state {
            filter.insert("status".into(), json!(s.map_status()));
        }
        let mut out = Vec::new();
        let mut cursor = cursor.map(str::to_owned);
        for page in 0..LIST_SCAN_PAGES {
            let size = if page == 0 { limit } else { LIST_SCAN_PAGE };
            let mut params = json!({ "filter": filter, "limit": size });
            if let Some(c) = &cursor {
                params["cursor"] = json!(c);
            }
            let text = self
                .books
                .call(methods::LIST, params.to_string(), None)
                .await?;
            let page: Page = serde_json::from_str(&text).map_err(A2aError::internal)?;
            let last = page.tasks.len();
            for (i, t) in page.tasks.iter().enumerate() {
                let Some(record) = t.record() else { continue };
                let view = record.view(&t.id);
                if context_id.is_some_and(|c| view.context_id != c)
                    || state.is_some_and(|s| view.state != s)
                    || !caller.controls(&record).await
                {
                    continue;
                }
                out.push(view);
                if out.len() == limit as usize {
                    let more = i + 1 < last || page.next_cursor.is_some();
                    return Ok((out, more.then(|| t.id.clone())));
                }
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok((out, None)),
            }
        }
        Ok((out, cursor))
    }
}

/// The params of `map/tasks/create` for the A2A task `id` (made by the caller's session: MAP
/// applies the caller's `tasks.canCreate` and the assignee's visibility to the caller). Its
/// `meta.a2a` (the record, with the owner) is not in it: only the gateway's bookkeeping
/// sessions may write that member (`gateway::RESERVED_TASK_META`), which they do at once.
fn create_params(
    id: &str,
    agent: &Agent,
    message: &Message,
    record: &Record,
) -> Result<String, A2aError> {
    #[derive(Serialize)]
    struct Task<'a> {
        id: &'a str,
        assignee: &'a str,
        title: String,
        status: &'a str,
    }
    #[derive(Serialize)]
    struct Create<'a> {
        task: Task<'a>,
    }
    // Not the message's text: the task is seen by whoever may see its agent, the caller's
    // words only by whoever may read the messages (`meta.a2a`, docs/tasks.md "Visibility").
    let _ = message;
    let title = format!(
        "A2A task for {}",
        agent.name.as_deref().unwrap_or(agent.id.as_str())
    );
    serde_json::to_string(&Create {
        task: Task {
            id,
            assignee: agent.id.as_str(),
            title,
            status: record.state.map_status(),
        },
    })
    .map_err(A2aError::internal)
}
