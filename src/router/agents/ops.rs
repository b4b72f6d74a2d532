//! Agent handlers: register, spawn, unregister, update, stop, suspend, resume, list, get and
//! the structure graph.
//!
//! Each handler validates, changes the registry, then emits the matching events, causes first.
//! Decisions (see `docs/compatibility.md`): the first agent an agent-type session registers
//! without an id gets the participant id as its id, so `reply()` and `delivered` agree;
//! re-registering an orphaned agent's id reclaims it (the SDK's reconnect does this); update and
//! unregister require control of the agent (owner, an ancestor's owner, or system); stop,
//! suspend and resume require `lifecycle.canStop` and tell the agent through a `map/message`
//! from `system`.

use std::sync::Arc;

use crate::protocol::agent::{Agent, AgentLifecycle, AgentState};
use crate::protocol::capabilities::ParticipantType;
use crate::protocol::event::{
    AgentEnvironmentChangedData, AgentMetadataChangedData, AgentRegisteredData,
    AgentStateChangedData, AgentUnregisteredData, EventType, PermissionsAgentUpdatedData,
    ScopeMemberData,
};
use crate::protocol::ids::{now_ms, AgentId, EventId, MessageId};
use crate::protocol::json::RawJson;
use crate::protocol::message::Message;
use crate::protocol::methods::agents::*;

use crate::router::agents::supervised::ProcessControl;
use crate::router::caller::Caller;
use crate::router::caller::Ctx;
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::identities::table::IdKind;
use crate::router::permissions::can_control_agent;
use crate::router::permissions::can_manage_lifecycle;
use crate::router::permissions::can_see_agent;
use crate::router::permissions::parse_overrides;
use crate::router::permissions::resolve_agent_permissions;

type JsonMap = serde_json::Map<String, serde_json::Value>;

/// Control messages the router sends to an agent's connection for lifecycle calls.
const CONTROL_SENDER: &str = "system";

impl Router {
    /// Looks up an agent the caller may see; invisible agents are reported as not found.
    pub(crate) fn visible_agent(
        &self,
        caller: &Caller,
        id: &AgentId,
    ) -> Result<&Agent, RouterError> {
        self.registry
            .get(id)
            .map(|r| &r.agent)
            .filter(|a| can_see_agent(&caller.viewer(), a, self.agent_view()))
            .ok_or_else(|| RouterError::AgentNotFound(id.to_string()))
    }

    /// Looks up an agent the caller may control.
    pub(crate) fn controlled_agent(
        &self,
        caller: &Caller,
        id: &AgentId,
    ) -> Result<Agent, RouterError> {
        let agent = self.visible_agent(caller, id)?;
        if !can_control_agent(&caller.viewer(), agent, self.agent_view()) {
            return Err(RouterError::PermissionDenied(format!(
                "agent {id} is not owned by this participant or its ancestors"
            )));
        }
        Ok(self.agent_view().complete(agent.clone()))
    }

    /// Looks up an agent the caller may stop, suspend, resume or steer
    /// ([`can_manage_lifecycle`]).
    pub(crate) fn lifecycle_agent(
        &self,
        caller: &Caller,
        id: &AgentId,
    ) -> Result<Agent, RouterError> {
        let agent = self.visible_agent(caller, id)?;
        if !can_manage_lifecycle(&caller.viewer(), agent, self.agent_view()) {
            return Err(RouterError::PermissionDenied(format!(
                "agent {id} is not controlled by this participant"
            )));
        }
        Ok(self.agent_view().complete(agent.clone()))
    }

    /// `map/agents/register`.
    pub fn handle_register(
        &mut self,
        ctx: &Ctx,
        p: RegisterParams,
    ) -> Result<RegisterResult, RouterError> {
        let caller = self.caller(ctx)?;
        let supervised = self
            .supervised_origin(ctx)
            .filter(|agent| !self.registry.is_owned_by(agent, &caller.participant));
        let (agent, resumed) = match supervised {
            Some(agent) => self.register_supervised(&caller, &agent, p)?,
            None => self.register_agent(&caller, p, Vec::new())?,
        };
        Ok(RegisterResult {
            agent,
            resumed: resumed.then_some(true),
        })
    }

    /// Registers (or reclaims) an agent for `caller`; shared by register and spawn.
    fn register_agent(
        &mut self,
        caller: &Caller,
        p: RegisterParams,
        caused_by: Vec<EventId>,
    ) -> Result<(Agent, bool), RouterError> {
        if p.agent_id.as_ref().is_some_and(|id| id.as_str().is_empty()) {
            return Err(RouterError::InvalidParams(
                "agentId must not be empty".into(),
            ));
        }
        check_object("metadata", p.metadata.as_ref())?;
        let principal = self.principal_of(&caller.participant).cloned();
        if let Some(id) = &p.agent_id {
            self.may_take(
                IdKind::Agent,
                id.as_str(),
                principal.as_ref(),
                caller.kind == ParticipantType::System,
            )
            .map_err(|r| r.agent_error(id.as_str()))?;
            if let Some(existing) = self.registry.get(id) {
                if existing.agent.owner_id.is_none() && existing.agent.state == AgentState::ORPHANED
                {
                    let agent = self
                        .reclaim_orphan(id, &caller.participant, caused_by)
                        .ok_or_else(|| RouterError::AgentExists(id.to_string()))?;
                    let agent = self.apply_reregistration(&agent.id, &p).unwrap_or(agent);
                    self.adopt_primary(caller, &agent.id);
                    return Ok((agent, true));
                }
                return Err(RouterError::AgentExists(id.to_string()));
            }
        }
        self.check_agent_quota(&caller.participant)?;
        if let Some(parent) = &p.parent {
            self.visible_agent(caller, parent)?;
        }
        let id = match p.agent_id.clone() {
            Some(id) => id,
            None => {
                let own = AgentId::new(caller.participant.as_arc().clone());
                let free = !self.registry.contains(&own)
                    && self
                        .may_take(IdKind::Agent, own.as_str(), principal.as_ref(), false)
                        .is_ok();
                if caller.kind == ParticipantType::Agent && free {
                    own
                } else {
                    AgentId::generate()
                }
            }
        };
        self.check_initial_scopes(
            caller,
            &id,
            p.role.as_deref(),
            p.scopes.as_deref().unwrap_or_default(),
        )?;
        if let Some(overrides) = &p.permission_overrides {
            parse_overrides(overrides).map_err(RouterError::InvalidParams)?;
        }
        let agent = self.create_agent(caller, id, p, caused_by);
        self.claim(IdKind::Agent, agent.id.as_str(), principal.as_ref());
        Ok((agent, false))
    }

    /// Inserts a new agent owned by `caller` (the id must be free; `parent` and `scopes` are
    /// taken as given, unknown scopes skipped), emits `agent_registered` and one
    /// `scope_member_joined` per scope, and returns the stored record.
    pub(crate) fn create_agent(
        &mut self,
        caller: &Caller,
        id: AgentId,
        p: RegisterParams,
        caused_by: Vec<EventId>,
    ) -> Agent {
        let now = now_ms();
        let mut agent = Agent::new(id.clone(), Some(caller.participant.clone()));
        agent.name = p.name;
        agent.description = p.description;
        agent.parent = p.parent.filter(|parent| self.registry.contains(parent));
        agent.relationships = p.relationships;
        agent.role = p.role;
        agent.visibility = p.visibility;
        agent.permission_overrides = p.permission_overrides;
        agent.lifecycle = Some(AgentLifecycle {
            created_at: Some(now),
            ..AgentLifecycle::default()
        });
        agent.capabilities = p.capabilities;
        agent.environment = p.environment;
        agent.capability_descriptor = p.capability_descriptor;
        agent.persistent_identity = p.persistent_identity;
        agent.metadata = p.metadata;
        agent.presence = Some(
            crate::protocol::agent::Presence::online(now)
                .on(self.node_of(&caller.participant).as_deref()),
        );
        self.registry.insert(agent.clone());
        self.adopt_primary(caller, &id);
        // Announced with the scopes it is joining, so that a `scope`-visible agent's
        // registration reaches the participants it will be visible to.
        let mut announced = agent.clone();
        announced.scopes = p
            .scopes
            .iter()
            .flatten()
            .filter(|s| self.scopes.contains(s))
            .cloned()
            .collect();
        let registered = self.emit_agent_event(
            EventType::AgentRegistered,
            &announced,
            &AgentRegisteredData {
                agent_id: id.clone(),
                name: agent.name.clone(),
                role: agent.role.clone(),
                owner_id: agent.owner_id.clone(),
                parent: agent.parent.clone(),
                resumed: None,
                metadata: agent.metadata.clone(),
            },
            caused_by,
        );
        for scope in p.scopes.into_iter().flatten() {
            self.add_member(&scope, &id, vec![registered]);
        }
        // Messages the previous run left queued for this id (messaging::recovery): only its
        // owner principal can have registered it again.
        self.flush_offline(&id, Some(registered));
        self.agent_view().whole(&id).unwrap_or(agent)
    }

    /// Applies the descriptive fields of a re-registration to a reclaimed agent.
    pub(crate) fn apply_reregistration(
        &mut self,
        id: &AgentId,
        p: &RegisterParams,
    ) -> Option<Agent> {
        let rec = self.registry.get_mut(id)?;
        let a = &mut rec.agent;
        if p.name.is_some() {
            a.name = p.name.clone();
        }
        if p.description.is_some() {
            a.description = p.description.clone();
        }
        if p.role.is_some() {
            a.role = p.role.clone();
        }
        if p.visibility.is_some() {
            a.visibility = p.visibility;
        }
        if p.capabilities.is_some() {
            a.capabilities = p.capabilities.clone();
        }
        self.agent_view().whole(id)
    }

    pub(crate) fn adopt_primary(&mut self, caller: &Caller, id: &AgentId) {
        let registry = &self.registry;
        self.sessions
            .adopt_primary(&caller.session, id, |a, p| registry.is_owned_by(a, p));
    }

    /// `map/agents/spawn`: a child of an agent the caller controls, plus an optional first
    /// message.
    pub fn handle_spawn(&mut self, ctx: &Ctx, p: SpawnParams) -> Result<SpawnResult, RouterError> {
        let caller = self.caller(ctx)?;
        let parent = p.register.parent.clone().ok_or_else(|| {
            RouterError::InvalidParams("map/agents/spawn requires `parent`".into())
        })?;
        self.controlled_agent(&caller, &parent)?;
        if p.register
            .agent_id
            .as_ref()
            .is_some_and(|id| self.registry.contains(id))
        {
            return Err(RouterError::AgentExists(
                p.register
                    .agent_id
                    .as_ref()
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
            ));
        }
        let mut register = p.register;
        if register.agent_id.is_none() {
            register.agent_id = Some(AgentId::generate());
        }
        if let Some(extra) = p.requested_scopes {
            register.scopes.get_or_insert_with(Vec::new).extend(extra);
        }
        let (agent, _) = self.register_agent(&caller, register, Vec::new())?;
        let mut message_id = None;
        if let Some(initial) = p.initial_message {
            let to = RawJson::from(serde_json::json!({ "agent": agent.id }));
            let d = self.deliver_message(&caller, to, initial.payload, initial.meta, Vec::new())?;
            message_id = Some(d.message_id);
        }
        Ok(SpawnResult {
            agent,
            message_id,
            process: None,
        })
    }

    /// `map/agents/unregister`.
    pub fn handle_unregister(
        &mut self,
        ctx: &Ctx,
        p: UnregisterParams,
    ) -> Result<UnregisterResult, RouterError> {
        let caller = self.caller(ctx)?;
        let agent = self.controlled_agent(&caller, &p.agent_id)?;
        let reason = p.reason.unwrap_or_else(|| "unregistered".into());
        self.remove_agent(&agent.id, &reason, Vec::new());
        Ok(UnregisterResult {
            agent,
            unregistered: true,
        })
    }

    /// Removes an agent: leaves its scopes, emits `agent_unregistered` then one
    /// `scope_member_left` per scope (caused by the unregistration). Children stay registered.
    pub(crate) fn remove_agent(&mut self, id: &AgentId, reason: &str, caused_by: Vec<EventId>) {
        let Some(mut snapshot) = self.agent_view().whole(id) else {
            return;
        };
        let mut caused_by = caused_by;
        if snapshot.state == AgentState::STOPPING {
            // It was asked to stop, and it went: observers see it `stopped`, then gone.
            if let Some((agent, ev)) =
                self.transition(id, AgentState::STOPPED, Some(reason.to_owned()))
            {
                snapshot = agent;
                caused_by.push(ev);
            }
        }
        // An unregistered agent's process has nothing left to do.
        self.control_process(crate::router::agents::supervised::ProcessControl::Stop {
            agent: id.clone(),
            force: false,
        });
        self.supervised.remove(id);
        let unregistered = self.emit_agent_event(
            EventType::AgentUnregistered,
            &snapshot,
            &AgentUnregisteredData {
                agent_id: id.clone(),
                reason: Some(reason.into()),
            },
            caused_by,
        );
        for scope in &snapshot.scopes {
            self.scopes.leave(scope, id);
            self.emit_scope_member_event(
                EventType::ScopeMemberLeft,
                scope,
                &snapshot,
                vec![unregistered],
            );
        }
        // Messages kept for it fail now that it will not come back.
        self.drop_offline(id);
        self.registry.remove(id);
        let registry = &self.registry;
        self.messaging
            .agent_removed(|r| registry.get_by_text(r).is_none());
    }

    /// `map/agents/update`.
    pub fn handle_update(
        &mut self,
        ctx: &Ctx,
        p: UpdateParams,
    ) -> Result<AgentResult, RouterError> {
        let caller = self.caller(ctx)?;
        let before = self.controlled_agent(&caller, &p.agent_id)?;
        check_object("metadata", p.metadata.as_ref())?;
        if let Some(overrides) = &p.permission_overrides {
            parse_overrides(overrides).map_err(RouterError::InvalidParams)?;
        }
        if let Some(state) = &p.state {
            if *state == AgentState::ORPHANED {
                return Err(RouterError::InvalidParams(
                    "state `orphaned` is set by the router, not by update".into(),
                ));
            }
            if before.state.is_terminal() && *state != before.state {
                return Err(RouterError::StateInvalid {
                    action: "update",
                    state: before.state.to_string(),
                });
            }
        }
        let Some(rec) = self.registry.get_mut(&p.agent_id) else {
            return Err(RouterError::AgentNotFound(p.agent_id.to_string()));
        };
        let now = now_ms();
        let lifecycle = rec.agent.lifecycle.get_or_insert_with(Default::default);
        lifecycle.last_active_at = Some(now);
        if let Some(state) = &p.state {
            if *state == AgentState::STOPPED {
                lifecycle.stopped_at = Some(now);
            }
            if (*state == AgentState::ACTIVE || *state == AgentState::BUSY)
                && lifecycle.started_at.is_none()
            {
                lifecycle.started_at = Some(now);
            }
            rec.agent.state = state.clone();
        }
        if let Some(env) = &p.environment {
            rec.agent.environment = Some(env.clone());
        }
        if let Some(changes) = &p.metadata {
            // A shallow merge of the texts: each value stays byte for byte.
            rec.agent.metadata = Some(match &rec.agent.metadata {
                Some(current) => current.merged(changes).unwrap_or_else(|| changes.clone()),
                None => changes.clone(),
            });
        }
        if let Some(overrides) = &p.permission_overrides {
            let current = rec
                .agent
                .permission_overrides
                .get_or_insert_with(JsonMap::new);
            crate::router::agents::registry::merge_sections(current, overrides);
        }
        let after = rec.agent.clone();
        let after = self.agent_view().complete(after);
        if let Some(state) = &p.state {
            if *state != before.state {
                let hint = self.take_cause_hint(&after.id);
                self.emit_agent_event(
                    EventType::AgentStateChanged,
                    &after,
                    &AgentStateChangedData::new(
                        after.id.clone(),
                        before.state.clone(),
                        state.clone(),
                        None,
                    ),
                    hint,
                );
            }
        }
        if let Some(env) = &p.environment {
            self.emit_agent_event(
                EventType::AgentEnvironmentChanged,
                &after,
                &AgentEnvironmentChangedData {
                    agent_id: after.id.clone(),
                    environment: env.clone(),
                    previous_environment: before.environment.clone(),
                },
                Vec::new(),
            );
        }
        if let Some(changes) = p.metadata {
            self.emit_agent_event(
                EventType::AgentMetadataChanged,
                &after,
                &AgentMetadataChangedData {
                    agent_id: after.id.clone(),
                    changes,
                    metadata: after
                        .metadata
                        .clone()
                        .unwrap_or_else(|| RawJson::from_text("{}").unwrap_or_default()),
                },
                Vec::new(),
            );
        }
        if let Some(changes) = p.permission_overrides {
            let effective = resolve_agent_permissions(&after, &self.config.permissions);
            self.emit_agent_event(
                EventType::PermissionsAgentUpdated,
                &after,
                &PermissionsAgentUpdatedData {
                    agent_id: after.id.clone(),
                    changes,
                    effective_permissions: serde_json::to_value(effective).unwrap_or_default(),
                    updated_by: caller.participant.clone(),
                },
                Vec::new(),
            );
        }
        Ok(AgentResult { agent: after })
    }

    /// Changes state and emits `agent_state_changed`; returns the new agent and the event id.
    fn transition(
        &mut self,
        id: &AgentId,
        to: AgentState,
        reason: Option<String>,
    ) -> Option<(Agent, EventId)> {
        let rec = self.registry.get_mut(id)?;
        let previous = std::mem::replace(&mut rec.agent.state, to.clone());
        if to == AgentState::STOPPED {
            rec.agent
                .lifecycle
                .get_or_insert_with(Default::default)
                .stopped_at = Some(now_ms());
        }
        let caused_by: Vec<EventId> = rec.cause_hint.take().into_iter().collect();
        let agent = rec.agent.clone();
        let agent = self.agent_view().complete(agent);
        let leads_on = to == AgentState::STOPPING || to == AgentState::SUSPENDED;
        let ev = self.emit_agent_event(
            EventType::AgentStateChanged,
            &agent,
            &AgentStateChangedData::new(id.clone(), previous, to, reason),
            caused_by,
        );
        if leads_on {
            // What follows a stop or suspend request (the agent stopping, being resumed)
            // follows from it.
            self.set_cause_hint(id, ev);
        }
        Some((agent, ev))
    }

    /// Records the event an agent's next state change follows from.
    pub(crate) fn set_cause_hint(&mut self, id: &AgentId, event: EventId) {
        if let Some(rec) = self.registry.get_mut(id) {
            rec.cause_hint = Some(event);
        }
    }

    /// Takes the event an agent's next state change follows from.
    pub(crate) fn take_cause_hint(&mut self, id: &AgentId) -> Vec<EventId> {
        self.registry
            .get_mut(id)
            .and_then(|r| r.cause_hint.take())
            .into_iter()
            .collect()
    }

    /// Tells an agent's connection about a lifecycle call: a `map/message` from `system` whose
    /// payload is `{"control": "<stop|suspend|resume>", "agentId", "reason"?, "force"?}`.
    fn send_control(
        &mut self,
        agent: &Agent,
        control: &str,
        reason: Option<&str>,
        force: Option<bool>,
    ) {
        let mut payload = serde_json::json!({ "control": control, "agentId": agent.id });
        if let Some(r) = reason {
            payload["reason"] = r.into();
        }
        if let Some(f) = force {
            payload["force"] = f.into();
        }
        let mut meta = JsonMap::new();
        meta.insert("priority".into(), "urgent".into());
        meta.insert(
            "_meta".into(),
            serde_json::json!({ "mapRouter": { "control": control } }),
        );
        let message = Message {
            id: MessageId::generate(),
            from: CONTROL_SENDER.into(),
            to: RawJson::from(serde_json::json!({ "agent": agent.id })),
            timestamp: now_ms(),
            payload: Some(RawJson::from(payload)),
            meta: Some(RawJson::from(meta)),
        };
        if let Some(conn) = self.agent_conn(&agent.id) {
            let frame = crate::router::messaging::ops::message_frame(&message);
            self.push_message(conn, frame);
        }
    }

    /// `map/agents/stop`.
    pub fn handle_stop(&mut self, ctx: &Ctx, p: StopParams) -> Result<StopResult, RouterError> {
        let caller = self.caller(ctx)?;
        let agent = self.lifecycle_agent(&caller, &p.agent_id)?;
        let force = p.force.unwrap_or(false);
        if agent.state == AgentState::STOPPED {
            return Err(RouterError::StateInvalid {
                action: "stop",
                state: agent.state.to_string(),
            });
        }
        if force {
            let (agent, ev) = self
                .transition(&agent.id, AgentState::STOPPED, p.reason.clone())
                .ok_or_else(|| RouterError::AgentNotFound(p.agent_id.to_string()))?;
            self.send_control(&agent, "stop", p.reason.as_deref(), Some(true));
            self.control_process(ProcessControl::Stop {
                agent: agent.id.clone(),
                force: true,
            });
            self.remove_agent(&agent.id, "stopped", vec![ev]);
            return Ok(StopResult {
                stopping: true,
                agent,
            });
        }
        if agent.state == AgentState::STOPPING {
            return Ok(StopResult {
                stopping: true,
                agent,
            });
        }
        // A graceful stop needs someone to finish it: a supervised process, or the live
        // connection of an owner other than the caller. With nobody left (the caller stops its
        // own agent, or the owner is away), the agent is `stopped` at once, still registered,
        // as its own `done()` would leave it (upstream's core conformance pack expects this;
        // docs/compatibility.md §4).
        let finisher = self.supervised.contains(&agent.id)
            || agent.owner_id.as_ref().is_some_and(|owner| {
                *owner != caller.participant
                    && self
                        .sessions
                        .by_participant(owner)
                        .is_some_and(|s| s.conn().is_some())
            });
        if !finisher {
            let (agent, _) = self
                .transition(&agent.id, AgentState::STOPPED, p.reason.clone())
                .ok_or_else(|| RouterError::AgentNotFound(p.agent_id.to_string()))?;
            return Ok(StopResult {
                stopping: false,
                agent,
            });
        }
        let (agent, _) = self
            .transition(&agent.id, AgentState::STOPPING, p.reason.clone())
            .ok_or_else(|| RouterError::AgentNotFound(p.agent_id.to_string()))?;
        self.send_control(&agent, "stop", p.reason.as_deref(), Some(false));
        self.control_process(ProcessControl::Stop {
            agent: agent.id.clone(),
            force: false,
        });
        Ok(StopResult {
            stopping: true,
            agent,
        })
    }

    /// `map/agents/suspend`.
    pub fn handle_suspend(
        &mut self,
        ctx: &Ctx,
        p: SuspendParams,
    ) -> Result<SuspendResult, RouterError> {
        let caller = self.caller(ctx)?;
        let agent = self.lifecycle_agent(&caller, &p.agent_id)?;
        let s = &agent.state;
        if *s == AgentState::SUSPENDED
            || *s == AgentState::STOPPED
            || *s == AgentState::STOPPING
            || *s == AgentState::ORPHANED
        {
            return Err(RouterError::StateInvalid {
                action: "suspend",
                state: s.to_string(),
            });
        }
        if let Some(rec) = self.registry.get_mut(&agent.id) {
            rec.state_before_suspend = Some(agent.state.clone());
        }
        let (agent, _) = self
            .transition(&agent.id, AgentState::SUSPENDED, p.reason.clone())
            .ok_or_else(|| RouterError::AgentNotFound(p.agent_id.to_string()))?;
        self.send_control(&agent, "suspend", p.reason.as_deref(), None);
        self.control_process(ProcessControl::Suspend {
            agent: agent.id.clone(),
        });
        Ok(SuspendResult {
            suspended: true,
            agent,
        })
    }

    /// `map/agents/resume`.
    pub fn handle_resume(
        &mut self,
        ctx: &Ctx,
        p: ResumeParams,
    ) -> Result<ResumeResult, RouterError> {
        let caller = self.caller(ctx)?;
        let agent = self.lifecycle_agent(&caller, &p.agent_id)?;
        if agent.state != AgentState::SUSPENDED {
            return Err(RouterError::StateInvalid {
                action: "resume",
                state: agent.state.to_string(),
            });
        }
        let back_to = self
            .registry
            .get_mut(&agent.id)
            .and_then(|r| r.state_before_suspend.take())
            .unwrap_or(AgentState::ACTIVE);
        self.control_process(ProcessControl::Resume {
            agent: agent.id.clone(),
        });
        let (agent, _) = self
            .transition(&agent.id, back_to, None)
            .ok_or_else(|| RouterError::AgentNotFound(p.agent_id.to_string()))?;
        self.send_control(&agent, "resume", None, None);
        Ok(ResumeResult {
            resumed: true,
            agent,
        })
    }

    /// `map/agents/list`.
    pub fn handle_agents_list(
        &mut self,
        ctx: &Ctx,
        p: AgentsListParams,
    ) -> Result<AgentsListResult, RouterError> {
        let caller = self.caller(ctx)?;
        let after = match &p.cursor {
            Some(c) => Some(c.parse::<u64>().map_err(|_| {
                RouterError::InvalidParams(format!("cursor `{c}` was not issued by this router"))
            })?),
            None => None,
        };
        if p.limit == Some(0) {
            return Err(RouterError::InvalidParams(
                "limit must be at least 1".into(),
            ));
        }
        let limit = p.limit.map_or(usize::MAX, |l| l as usize);
        let filter = p.filter.unwrap_or_default();
        let mut agents = Vec::new();
        let mut next_cursor = None;
        for rec in self.registry.iter_ordered(after) {
            if !can_see_agent(&caller.viewer(), &rec.agent, self.agent_view())
                || !agent_matches(&filter, rec, self.scopes.of_agent(&rec.agent.id))
            {
                continue;
            }
            if agents.len() == limit {
                next_cursor = Some(
                    agents_last_id(&agents)
                        .and_then(|id| self.registry.get(id))
                        .map(|r| r.order.to_string())
                        .unwrap_or_default(),
                );
                break;
            }
            agents.push(self.agent_view().complete(rec.agent.clone()));
        }
        Ok(AgentsListResult {
            agents,
            next_cursor,
            as_of: self.bus.log.newest_id(),
        })
    }

    /// `map/agents/get`.
    pub fn handle_agents_get(
        &mut self,
        ctx: &Ctx,
        p: AgentsGetParams,
    ) -> Result<AgentsGetResult, RouterError> {
        let caller = self.caller(ctx)?;
        self.visible_agent(&caller, &p.agent_id)?;
        let id = &p.agent_id;
        let include = p.include.unwrap_or_default();
        let visible = |ids: Vec<AgentId>| -> Vec<Agent> {
            ids.iter()
                .filter_map(|a| self.registry.get(a))
                .filter(|r| can_see_agent(&caller.viewer(), &r.agent, self.agent_view()))
                .map(|r| self.agent_view().complete(r.agent.clone()))
                .collect()
        };
        let mut agent = self
            .agent_view()
            .snapshot(id)
            .ok_or_else(|| RouterError::AgentNotFound(id.to_string()))?;
        // Its `children` name only those the caller may see (a parent-only child's id is its
        // owner's and the parent's owner's to know).
        if let Some(children) = agent.children.as_mut() {
            children.retain(|c| {
                self.registry
                    .get(c)
                    .is_some_and(|r| can_see_agent(&caller.viewer(), &r.agent, self.agent_view()))
            });
        }
        let parent = if include.parent == Some(true) {
            agent
                .parent
                .clone()
                .and_then(|p| visible(vec![p]).into_iter().next())
        } else {
            None
        };
        let children =
            (include.children == Some(true)).then(|| visible(self.registry.children(id)));
        let siblings =
            (include.siblings == Some(true)).then(|| visible(self.registry.siblings(id)));
        let ancestors = (include.ancestors == Some(true))
            .then(|| visible(self.registry.ancestors(id, include.max_depth)));
        let descendants = (include.descendants == Some(true))
            .then(|| visible(self.registry.descendants(id, include.max_depth)));
        Ok(AgentsGetResult {
            agent,
            parent,
            children,
            siblings,
            ancestors,
            descendants,
        })
    }

    /// `map/structure/graph`.
    pub fn handle_graph(&mut self, ctx: &Ctx, p: GraphParams) -> Result<GraphResult, RouterError> {
        let caller = self.caller(ctx)?;
        if p.depth == Some(0) {
            return Err(RouterError::InvalidParams(
                "depth must be at least 1".into(),
            ));
        }
        let ids: Vec<AgentId> = match &p.root_agent_id {
            Some(root) => {
                self.visible_agent(&caller, root)?;
                let mut v = vec![root.clone()];
                v.extend(self.registry.descendants(root, p.depth));
                v
            }
            None => self
                .registry
                .iter_ordered(None)
                .map(|r| r.agent.id.clone())
                .collect(),
        };
        let nodes: Vec<Agent> = ids
            .iter()
            .filter_map(|a| self.registry.get(a))
            .filter(|r| can_see_agent(&caller.viewer(), &r.agent, self.agent_view()))
            .map(|r| self.agent_view().complete(r.agent.clone()))
            .collect();
        let in_graph: std::collections::HashSet<&str> =
            nodes.iter().map(|a| a.id.as_str()).collect();
        let mut edges = Vec::new();
        for node in &nodes {
            if let Some(parent) = &node.parent {
                if in_graph.contains(parent.as_str()) {
                    edges.push(GraphEdge {
                        from: parent.clone(),
                        to: node.id.clone(),
                        kind: "parent-child".into(),
                    });
                }
            }
            if p.include_relationships != Some(false) {
                for rel in node.relationships.iter().flatten() {
                    if in_graph.contains(rel.agent_id.as_str()) {
                        edges.push(GraphEdge {
                            from: node.id.clone(),
                            to: rel.agent_id.clone(),
                            kind: rel.kind.clone(),
                        });
                    }
                }
            }
        }
        Ok(GraphResult {
            nodes,
            edges,
            as_of: self.bus.log.newest_id(),
        })
    }

    /// Emits `scope_member_joined` / `scope_member_left` about `agent` in `scope`.
    pub(crate) fn emit_scope_member_event(
        &mut self,
        kind: EventType,
        scope: &crate::protocol::ids::ScopeId,
        agent: &Agent,
        caused_by: Vec<EventId>,
    ) -> EventId {
        let role: Option<Arc<str>> = agent.role.as_deref().map(Arc::from);
        let draft = crate::router::events::log::EventDraft {
            kind,
            source: Some(agent.id.as_arc().clone()),
            data: crate::router::core::to_json(&ScopeMemberData {
                scope_id: scope.clone(),
                agent_id: agent.id.clone(),
            }),
            caused_by,
            keys: crate::router::events::log::FilterKeys {
                agent_id: Some(agent.id.clone()),
                source_role: role.clone(),
                subject_role: role,
                scopes: self.scope_keys(scope),
                ..Default::default()
            },
            audience: self.scope_audience(scope, Some(agent)),
        };
        self.emit(draft)
    }
}

fn agents_last_id(agents: &[Agent]) -> Option<&AgentId> {
    agents.last().map(|a| &a.id)
}

/// The `map/agents/list` filter.
fn agent_matches(
    f: &AgentFilter,
    rec: &crate::router::agents::registry::AgentRecord,
    member_of: &[crate::protocol::ids::ScopeId],
) -> bool {
    let a = &rec.agent;
    let any = |list: &Option<Vec<String>>, v: Option<&str>| match list {
        Some(l) if !l.is_empty() => v.is_some_and(|v| l.iter().any(|x| x == v)),
        _ => true,
    };
    if let Some(states) = f.states.as_ref().filter(|s| !s.is_empty()) {
        if !states.contains(&a.state) {
            return false;
        }
    }
    if !any(&f.roles, a.role.as_deref()) {
        return false;
    }
    if let Some(scopes) = f.scopes.as_ref().filter(|s| !s.is_empty()) {
        if !member_of.iter().any(|s| scopes.contains(s)) {
            return false;
        }
    }
    if f.parent
        .as_ref()
        .is_some_and(|p| a.parent.as_ref() != Some(p))
    {
        return false;
    }
    if f.has_children.is_some_and(|h| h == rec.children.is_empty()) {
        return false;
    }
    if f.owner_id
        .as_ref()
        .is_some_and(|o| a.owner_id.as_ref() != Some(o))
    {
        return false;
    }
    let descriptor = a.capability_descriptor.as_ref();
    if let Some(cap) = &f.capability_id {
        let has = descriptor
            .and_then(|d| d.get("capabilities"))
            .and_then(|c| c.as_array())
            .is_some_and(|caps| {
                caps.iter()
                    .any(|c| c.get("id").and_then(|i| i.as_str()) == Some(cap))
            });
        if !has {
            return false;
        }
    }
    if let Some(tags) = f.tags.as_ref().filter(|t| !t.is_empty()) {
        let has = descriptor
            .and_then(|d| d.get("tags"))
            .and_then(|t| t.as_array())
            .is_some_and(|list| {
                list.iter()
                    .any(|t| t.as_str().is_some_and(|t| tags.iter().any(|x| x == t)))
            });
        if !has {
            return false;
        }
    }
    if let Some(mime) = &f.accepts {
        let has = descriptor
            .and_then(|d| d.get("accepts"))
            .and_then(|t| t.as_array())
            .is_some_and(|list| {
                list.iter().any(|item| {
                    item.as_str() == Some(mime)
                        || item.get("contentType").and_then(|c| c.as_str()) == Some(mime)
                })
            });
        if !has {
            return false;
        }
    }
    if let Some(pid) = &f.persistent_id {
        let has = a
            .persistent_identity
            .as_ref()
            .and_then(|p| p.get("persistentId"))
            .and_then(|v| v.as_str())
            == Some(pid.as_str());
        if !has {
            return false;
        }
    }
    true
}

/// A free-form field that must be a JSON object when given (`metadata`).
///
/// # Errors
/// `-32602` naming the field.
pub(crate) fn check_object(field: &str, value: Option<&RawJson>) -> Result<(), RouterError> {
    match value {
        Some(v) if !v.is_object() => Err(RouterError::InvalidParams(format!(
            "`{field}` must be an object"
        ))),
        _ => Ok(()),
    }
}
