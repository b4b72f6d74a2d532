//! Handlers of the tasks extension: create, assign, update, get (each one router step on the
//! cached task, loaded first when it is not in memory: `router::kept`), and list (an
//! asynchronous method that pages through the store's `tasks` table, filtering each chunk on
//! the router task).

use std::sync::Arc;

use crate::protocol::capabilities::Capability;
use crate::protocol::capabilities::ParticipantType;
use crate::protocol::event::EventType;
use crate::protocol::ids::{now_ms, AgentId, EventId};
use crate::protocol::json::RawJson;
use crate::protocol::methods::tasks::{
    AssignParams, AssignedData, CompletedData, CreateParams, CreatedData, GetParams, ListFilter,
    ListParams, ListResult, StatusData, StatusFilter, Task, TaskResult, TaskStatus, UpdateParams,
    UpdatedData,
};
use crate::router::caller::{Caller, Ctx};
use crate::router::core::{to_json, Router};
use crate::router::error::RouterError;
use crate::router::events::log::{EventDraft, FilterKeys};
use crate::router::handle::RouterHandle;
use crate::router::ids::ConnId;
use crate::router::kept::need::Need;
use crate::router::kept::ops::{paged_read, read_one, rows, settle};
use crate::router::page::scan_page;
use crate::router::permissions;
use crate::router::quota_checks::Created;
use crate::router::tasks::table::{entry_of_row, Entry, OrderKey};
use crate::store::kept::{KeptQuery, PageQuery};
use crate::store::record::Audience;

/// Longest task id accepted.
pub const MAX_ID_LEN: usize = 256;
/// Default `map/tasks/list` page.
pub const DEFAULT_PAGE: u32 = 100;
/// Largest `map/tasks/list` page.
pub const MAX_PAGE: u32 = 1000;
/// Most stored rows read per step of a listing.
pub const SCAN_CHUNK: usize = 1024;

impl Router {
    /// Whether `caller` may see a task: system participants, its creator, and whoever its
    /// newest event's audience (its assignee's, or everyone) admits.
    fn sees_task(&self, caller: &Caller, e: &Entry) -> bool {
        caller.kind == ParticipantType::System
            || e.task.created_by.as_ref() == Some(&caller.participant)
            || permissions::can_see_event(
                &caller.viewer(),
                EventType::TaskCreated.as_str(),
                &e.audience,
                e.task.assignee.as_ref(),
                self.agent_view(),
            )
    }

    /// Whether the task's `meta` holds a gateway's record (a member of
    /// `RouterConfig::reserved_task_meta`, which only the service principal writes: the A2A
    /// gateway's `meta.a2a`, with the caller's messages as `history`), and then the agent that
    /// carried those messages (the record's `gateway`, when it names one).
    fn gateway_record(&self, task: &Task) -> Option<Option<AgentId>> {
        #[derive(serde::Deserialize)]
        struct Carrier {
            gateway: Option<String>,
        }
        let members = task.meta.as_ref()?.members()?;
        let record = self
            .config
            .reserved_task_meta
            .iter()
            .find_map(|k| members.get(k.as_str()))?;
        Some(
            serde_json::from_str::<Carrier>(record.get())
                .ok()
                .and_then(|c| c.gateway)
                .map(AgentId::from),
        )
    }

    /// Who may read the messages a task's gateway record copies: whoever may see a
    /// `message_sent` event from the agent that carried them to the task's assignee (`audience`,
    /// the task's). `None`: the task holds no record. A record whose carrier is unknown or
    /// gone is for the parties only (system participants, the creator, the assignee's owner).
    fn record_audience(
        &self,
        task: &Task,
        audience: &Audience,
    ) -> Option<(Audience, Option<AgentId>)> {
        let carrier = self.gateway_record(task)?;
        let policy = &self.config.permissions;
        let carried = carrier
            .as_ref()
            .and_then(|c| self.registry.get(c))
            .filter(|_| permissions::event_type_exposed(policy, EventType::MessageSent.as_str()))
            .map_or(Audience::System, |r| {
                permissions::agent_audience(r.agent(), self.agent_view(), policy)
            });
        Some((audience.clone().and(carried), carrier))
    }

    /// Whether `viewer` is a party to a task's messages: a system participant, its creator,
    /// or the owner of its assignee (who received them).
    fn task_party(&self, viewer: &permissions::Viewer<'_>, task: &Task) -> bool {
        viewer.is_system()
            || task.created_by.as_ref() == Some(viewer.participant)
            || task
                .assignee
                .as_ref()
                .is_some_and(|a| self.registry.is_owned_by(a, viewer.participant))
    }

    /// Whether `viewer` may read a task's gateway record (true when it has none): a party, or
    /// whoever may see the `message_sent` events it copies (their audience, the event type's
    /// exposure and the viewer agent's `canSee` of the carrier).
    fn sees_record(
        &self,
        viewer: &permissions::Viewer<'_>,
        task: &Task,
        audience: &Audience,
    ) -> bool {
        let Some((carried, carrier)) = self.record_audience(task, audience) else {
            return true;
        };
        self.task_party(viewer, task)
            || permissions::can_see_event(
                viewer,
                EventType::MessageSent.as_str(),
                &carried,
                carrier.as_ref(),
                self.agent_view(),
            )
    }

    /// The task as `caller` may read it: without its gateway record (and `meta.result`) when
    /// the caller may not read the messages the record copies (docs/tasks.md, "Who sees and who
    /// changes a task").
    fn shown(&self, caller: &Caller, e: &Entry) -> Task {
        let mut task = e.task.clone();
        if !self.sees_record(&caller.viewer(), &e.task, &e.audience) {
            // The record, and `result` (the answer, which `task.completed` reports: copied
            // from the agent's reply, a message as well).
            let mut hidden = self.config.reserved_task_meta.clone();
            hidden.push("result".to_owned());
            task.meta = task.meta.as_ref().and_then(|m| without_members(m, &hidden));
        }
        task
    }

    /// The audience of an event carrying `task`: the task's, narrowed, when the task holds a
    /// gateway record, to those who may read it (`record_audience`). A viewer's `canSee` is not
    /// an audience, nor is "a party": when either decides for a session the audience does not
    /// already decide for, the event names the sessions that may read it now, the parties
    /// included. One pass over the sessions, the record read once.
    fn task_event_audience(&self, task: &Task, audience: &Audience) -> Audience {
        let Some((carried, carrier)) = self.record_audience(task, audience) else {
            return audience.clone();
        };
        let view = self.agent_view();
        let mut by_name = false;
        let mut who = Vec::new();
        for s in self.sessions.iter() {
            let viewer = permissions::Viewer {
                participant: s.participant(),
                kind: s.kind(),
                agent: s.primary_agent(),
                principal: s.principal(),
                policy: &self.config.permissions,
            };
            if viewer.is_system() {
                continue;
            }
            let admitted = permissions::audience_allows(&viewer, &carried, view);
            let reads = self.task_party(&viewer, task)
                || (admitted
                    && permissions::can_see_event(
                        &viewer,
                        EventType::MessageSent.as_str(),
                        &carried,
                        carrier.as_ref(),
                        view,
                    ));
            if reads {
                who.push(s.participant().clone());
            }
            by_name |= reads != admitted;
        }
        if by_name {
            audience.clone().and(Audience::Participants { who })
        } else {
            carried
        }
    }

    /// A task the caller may see, else "not found" (existence does not leak); `NeedsLoad`
    /// when it is not in memory.
    fn visible_task(&mut self, caller: &Caller, id: &str) -> Result<Arc<Entry>, RouterError> {
        let entry = match self.tasks.cache.get(id) {
            None => return Err(RouterError::NeedsLoad(vec![Need::Task(id.to_owned())])),
            Some(e) => e.cloned(),
        };
        entry
            .filter(|e| self.sees_task(caller, e))
            .ok_or_else(|| RouterError::TaskNotFound(id.to_owned()))
    }

    /// Whether `caller` may change a task: system participants, its creator, and the owner of
    /// its assignee.
    fn may_change_task(&self, caller: &Caller, task: &Task) -> bool {
        caller.kind == ParticipantType::System
            || task.created_by.as_ref() == Some(&caller.participant)
            || task
                .assignee
                .as_ref()
                .is_some_and(|a| self.registry.is_owned_by(a, &caller.participant))
    }

    /// An agent a task can be assigned to: registered and visible to the caller.
    fn assignable(&self, caller: &Caller, agent: &AgentId) -> Result<(), RouterError> {
        self.visible_agent(caller, agent).map(|_| ()).map_err(|_| {
            RouterError::TaskAssignmentFailed(format!(
                "agent {agent} is not registered or not visible to this session"
            ))
        })
    }

    /// Who may see a task's events: its assignee's audience, or everyone when unassigned.
    fn task_audience(&self, task: &Task) -> Audience {
        match &task.assignee {
            None => Audience::Everyone,
            Some(a) => match self.registry.get(a) {
                Some(rec) => permissions::agent_audience(
                    rec.agent(),
                    self.agent_view(),
                    &self.config.permissions,
                ),
                // Assigned to an agent that is gone: as private as an unknown agent's events.
                None => Audience::System,
            },
        }
    }

    /// Emits one `task.*` event about `task`, caused by `caller`, and returns its id. `owner`:
    /// the quota owner the store records with a new task.
    #[allow(clippy::too_many_arguments)]
    fn emit_task_event(
        &mut self,
        caller: &Caller,
        kind: EventType,
        data: String,
        task: &Task,
        audience: Audience,
        caused_by: Vec<EventId>,
        owner: Option<&str>,
    ) -> EventId {
        let audience = self.task_event_audience(task, &audience);
        let role: Option<Arc<str>> = task
            .assignee
            .as_ref()
            .and_then(|a| self.registry.get(a))
            .and_then(|r| r.agent().role.as_deref())
            .map(Arc::from);
        self.emit(EventDraft {
            kind,
            source: Some(caller.address()),
            data,
            caused_by,
            keys: FilterKeys {
                agent_id: task.assignee.clone(),
                subject_role: role,
                task_id: Some(Arc::from(task.id.as_str())),
                owner: owner.map(Arc::from),
                ..FilterKeys::default()
            },
            audience,
        })
    }

    /// Stores `task` with its audience (its newest event was just emitted).
    fn keep_task(&mut self, task: &Task, audience: Audience) {
        let written = self.last_seq();
        self.tasks.put(
            Entry {
                task: task.clone(),
                audience,
            },
            written,
        );
        self.trim_kept();
    }

    /// Refuses a `meta` that writes a member only the service principal may write
    /// (`RouterConfig::reserved_task_meta`: a gateway's record of the task, such as whose it
    /// is), unless the caller's session is the service principal's.
    ///
    /// # Errors
    /// `TaskDenied` (14003), naming the member.
    fn check_reserved_meta(&self, ctx: &Ctx, meta: Option<&RawJson>) -> Result<(), RouterError> {
        let Some(members) = meta.and_then(RawJson::members) else {
            return Ok(());
        };
        let Some(key) = self
            .config
            .reserved_task_meta
            .iter()
            .find(|k| members.contains_key(k.as_str()))
        else {
            return Ok(());
        };
        let service = self
            .session_of(ctx)?
            .principal()
            .is_some_and(crate::auth::is_service);
        if service {
            return Ok(());
        }
        Err(RouterError::TaskDenied(format!(
            "meta.{key} is written by the router's gateway only"
        )))
    }

    /// `map/tasks/create`: stores the task and emits `task.created`.
    ///
    /// # Errors
    /// `InvalidParams` for an empty, overlong or taken id, or a `meta` that is not an object;
    /// `TaskAssignmentFailed` (14002) for an assignee the caller may not see.
    pub fn handle_tasks_create(
        &mut self,
        ctx: &Ctx,
        p: CreateParams,
    ) -> Result<TaskResult, RouterError> {
        let caller = self.caller(ctx)?;
        let owner = self.quota_owner(ctx)?;
        let input = p.task;
        if let Some(id) = &input.id {
            if id.is_empty() || id.len() > MAX_ID_LEN {
                return Err(RouterError::InvalidParams(format!(
                    "task.id must be 1 to {MAX_ID_LEN} bytes"
                )));
            }
        }
        // Everything this needs from the store, in one load.
        let mut needs = self.created_needs(owner.as_deref(), Created::Tasks);
        if let Some(id) = &input.id {
            if self.tasks.cache.get(id).is_none() {
                needs.push(Need::Task(id.clone()));
            }
        }
        if !needs.is_empty() {
            return Err(RouterError::NeedsLoad(needs));
        }
        let id = match input.id {
            Some(id) => {
                if matches!(self.tasks.cache.peek(&id), Some(Some(_))) {
                    return Err(RouterError::InvalidParams(format!(
                        "task id {id} is already taken"
                    )));
                }
                id
            }
            None => format!("task-{}", crate::protocol::ids::Ulid::random()),
        };
        check_meta(input.meta.as_ref())?;
        self.check_reserved_meta(ctx, input.meta.as_ref())?;
        if let Some(a) = &input.assignee {
            self.assignable(&caller, a)?;
        }
        self.check_created(owner.as_deref(), Created::Tasks)?;
        let now = now_ms();
        let task = Task {
            id,
            assignee: input.assignee,
            title: input.title,
            status: input.status.unwrap_or_default(),
            description: input.description,
            meta: input.meta,
            created_by: Some(caller.participant.clone()),
            created_at: now,
            updated_at: now,
        };
        let audience = self.task_audience(&task);
        let data = to_json(&CreatedData { task: task.clone() });
        self.emit_task_event(
            &caller,
            EventType::TaskCreated,
            data,
            &task,
            audience.clone(),
            Vec::new(),
            owner.as_deref(),
        );
        self.keep_task(&task, audience);
        self.tasks.total += 1;
        self.count_created(owner.as_deref(), Created::Tasks);
        Ok(TaskResult { task })
    }

    /// `map/tasks/assign`: sets the assignee and emits `task.assigned` (nothing when it is
    /// already that agent).
    ///
    /// # Errors
    /// `TaskNotFound` (14001); `TaskAssignmentFailed` (14002) for an agent the caller may not
    /// see; `TaskDenied` (14003) when the caller may not change the task (and is not claiming
    /// an unassigned one for an agent of its own).
    pub fn handle_tasks_assign(
        &mut self,
        ctx: &Ctx,
        p: AssignParams,
    ) -> Result<TaskResult, RouterError> {
        let caller = self.caller(ctx)?;
        let e = self.visible_task(&caller, &p.task_id)?;
        self.assignable(&caller, &p.agent_id)?;
        let claim = e.task.assignee.is_none()
            && self.registry.is_owned_by(&p.agent_id, &caller.participant);
        if !claim && !self.may_change_task(&caller, &e.task) {
            return Err(RouterError::TaskDenied(format!(
                "task {} is not this session's to assign",
                p.task_id
            )));
        }
        if e.task.assignee.as_ref() == Some(&p.agent_id) {
            return Ok(TaskResult {
                task: e.task.clone(),
            });
        }
        let mut task = e.task.clone();
        task.assignee = Some(p.agent_id.clone());
        task.updated_at = now_ms();
        let audience = self.task_audience(&task);
        let data = to_json(&AssignedData {
            task_id: task.id.clone(),
            agent_id: p.agent_id,
            task: task.clone(),
        });
        self.emit_task_event(
            &caller,
            EventType::TaskAssigned,
            data,
            &task,
            audience.clone(),
            Vec::new(),
            None,
        );
        self.keep_task(&task, audience);
        Ok(TaskResult { task })
    }

    /// `map/tasks/update`: changes the fields given (`meta` shallow-merged) and emits
    /// `task.status` (then `task.completed` when it became completed) or `task.updated`;
    /// nothing when nothing changed.
    ///
    /// # Errors
    /// `TaskNotFound` (14001); `TaskAssignmentFailed` (14002) for a new assignee the caller may
    /// not see; `TaskDenied` (14003) when the caller may not change the task; `InvalidParams`
    /// for a `meta` that is not an object.
    pub fn handle_tasks_update(
        &mut self,
        ctx: &Ctx,
        p: UpdateParams,
    ) -> Result<TaskResult, RouterError> {
        let caller = self.caller(ctx)?;
        let e = self.visible_task(&caller, &p.task_id)?;
        if !self.may_change_task(&caller, &e.task) {
            return Err(RouterError::TaskDenied(format!(
                "task {} is not this session's to change",
                p.task_id
            )));
        }
        check_meta(p.meta.as_ref())?;
        self.check_reserved_meta(ctx, p.meta.as_ref())?;
        if let Some(Some(a)) = &p.assignee {
            self.assignable(&caller, a)?;
        }
        let before = &e.task;
        let mut task = before.clone();
        if let Some(s) = p.status {
            task.status = s;
        }
        if let Some(t) = p.title {
            task.title = Some(t);
        }
        if let Some(d) = p.description {
            task.description = Some(d);
        }
        if let Some(a) = p.assignee {
            task.assignee = a;
        }
        if let Some(changes) = p.meta {
            task.meta = Some(match &task.meta {
                Some(old) => old.merged(&changes).unwrap_or(changes),
                None => changes,
            });
        }
        if task == *before {
            return Ok(TaskResult { task });
        }
        task.updated_at = now_ms();
        let audience = self.task_audience(&task);
        if task.status != before.status {
            let data = to_json(&StatusData {
                task_id: task.id.clone(),
                previous: before.status,
                current: task.status,
                task: task.clone(),
            });
            let status_event = self.emit_task_event(
                &caller,
                EventType::TaskStatus,
                data,
                &task,
                audience.clone(),
                Vec::new(),
                None,
            );
            if task.status == TaskStatus::Completed {
                let result = task
                    .meta
                    .as_ref()
                    .and_then(|m| m.members())
                    .and_then(|m| m.get("result").map(|r| r.get().to_owned()))
                    .and_then(|text| RawJson::from_text(text).ok());
                let data = to_json(&CompletedData {
                    task_id: task.id.clone(),
                    result,
                    task: task.clone(),
                });
                self.emit_task_event(
                    &caller,
                    EventType::TaskCompleted,
                    data,
                    &task,
                    audience.clone(),
                    vec![status_event],
                    None,
                );
            }
        } else {
            let data = to_json(&UpdatedData {
                task_id: task.id.clone(),
                task: task.clone(),
            });
            self.emit_task_event(
                &caller,
                EventType::TaskUpdated,
                data,
                &task,
                audience.clone(),
                Vec::new(),
                None,
            );
        }
        self.keep_task(&task, audience);
        Ok(TaskResult { task })
    }

    /// `map/tasks/get`.
    ///
    /// # Errors
    /// `TaskNotFound` (14001) for an unknown task or one the caller may not see.
    pub fn handle_tasks_get(&mut self, ctx: &Ctx, p: GetParams) -> Result<TaskResult, RouterError> {
        let caller = self.caller(ctx)?;
        let e = self.visible_task(&caller, &p.task_id)?;
        Ok(TaskResult {
            task: self.shown(&caller, &e),
        })
    }

    /// The tasks of a chunk of stored rows that pass `filter` and that the caller may see,
    /// each as the router has it now (the cached version when there is one), and the position
    /// of the chunk's last row.
    fn pick_tasks(
        &self,
        ctx: &Ctx,
        rows: Vec<crate::store::kept::KeptRow>,
        filter: &ListFilter,
    ) -> Result<(Vec<Task>, Option<OrderKey>), RouterError> {
        let caller = self.caller(ctx)?;
        let mut last = None;
        let mut picked = Vec::new();
        for row in rows {
            let stored = match entry_of_row(row.row) {
                Ok(e) => Arc::new(e),
                Err(e) => {
                    tracing::warn!(error = %e, "skipping a stored task this version cannot read");
                    continue;
                }
            };
            last = Some(stored.key());
            let e = match self.tasks.cache.peek(&stored.task.id) {
                Some(Some(cached)) => cached.clone(),
                _ => stored,
            };
            let t = &e.task;
            let admitted = filter
                .assignee
                .as_ref()
                .is_none_or(|a| t.assignee.as_ref() == Some(a))
                && filter.status.as_ref().is_none_or(|s| s.admits(t.status))
                && self.sees_task(&caller, &e);
            if admitted {
                picked.push(self.shown(&caller, &e));
            }
        }
        Ok((picked, last))
    }
}

/// `map/tasks/list`: creation order, only what the caller may see. Pages through the store's
/// `tasks` table (after the changes answered before it are committed), a chunk at a time, each
/// chunk filtered on the router task.
///
/// # Errors
/// `InvalidParams` for a cursor that names no task the caller may see; a storage error.
pub async fn list(
    router: RouterHandle,
    conn: ConnId,
    p: ListParams,
) -> Result<ListResult, RouterError> {
    const CAP: Option<Capability> = Some(Capability::CanListTasks);
    let limit = p.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE) as usize;
    let filter = p.filter.unwrap_or_default();
    let after = match p.cursor {
        Some(c) => Some(
            paged_read(&router, conn, CAP, move |r, ctx| {
                let caller = r.caller(ctx)?;
                match r.visible_task(&caller, &c) {
                    Ok(e) => Ok(e.key()),
                    Err(RouterError::NeedsLoad(n)) => Err(RouterError::NeedsLoad(n)),
                    Err(_) => Err(RouterError::InvalidParams(format!("unknown cursor {c:?}"))),
                }
            })
            .await?,
        ),
        None => None,
    };
    settle(&router, conn, CAP).await?;
    let statuses: Vec<String> = match &filter.status {
        None => Vec::new(),
        Some(StatusFilter::One(s)) => vec![s.as_str().to_owned()],
        Some(StatusFilter::Any(any)) => any.iter().map(|s| s.as_str().to_owned()).collect(),
    };
    let chunk = (limit + 1).clamp(64, SCAN_CHUNK);
    let assignee = filter.assignee.as_ref().map(|a| a.to_string());
    let page = scan_page(
        after,
        limit,
        |after| {
            let (router, filter) = (&router, filter.clone());
            let query = KeptQuery::Page(PageQuery::Tasks {
                after,
                assignee: assignee.clone(),
                statuses: statuses.clone(),
                limit: chunk,
            });
            async move {
                let rows = rows(read_one(router, query).await?);
                let end = rows.len() < chunk;
                let (picked, last) = router
                    .call(conn, CAP, true, move |r, ctx| {
                        r.pick_tasks(ctx, rows, &filter)
                    })
                    .await?;
                Ok((picked, last, end))
            }
        },
        |t: &Task| t.id.clone(),
    )
    .await?;
    Ok(ListResult {
        tasks: page.items,
        has_more: page.has_more,
        next_cursor: page.next_cursor,
    })
}

/// `meta` without the members named in `keys` (the text of the others kept, in their order).
fn without_members(meta: &RawJson, keys: &[String]) -> Option<RawJson> {
    let members = meta.ordered_members()?;
    let mut out = String::with_capacity(meta.len());
    out.push('{');
    for (k, v) in members.iter().filter(|(k, _)| !keys.contains(k)) {
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str(&serde_json::to_string(k).unwrap_or_default());
        out.push(':');
        out.push_str(v.get());
    }
    out.push('}');
    RawJson::from_text(out).ok()
}

/// A task's `meta` must be an object.
fn check_meta(meta: Option<&RawJson>) -> Result<(), RouterError> {
    match meta {
        Some(m) if !m.is_object() => Err(RouterError::InvalidParams(
            "task meta must be an object".into(),
        )),
        _ => Ok(()),
    }
}
