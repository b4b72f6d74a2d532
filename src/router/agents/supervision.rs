//! The router's side of supervised agents: reservations, registration of a supervised
//! process, exits, and the process output it turns into events.
//!
//! The router decides agent state; the supervisor (`crate::process`) owns the processes. They
//! talk through two narrow channels: the router sends [`ProcessControl`] (stop, suspend, resume)
//! with `try_send` (it never waits), and the supervisor calls back through the router handle
//! (`reserve_supervised`, `supervised_exited`, `supervised_output`, ...).
//!
//! Lifecycle of one supervised agent:
//! 1. `map/agents/spawn` with a `command` reserves the agent id and a waiter
//!    ([`Router::reserve_supervised`]); the supervisor launches the process.
//! 2. The process connects over its pipes (a connection with origin `Supervised`) and
//!    registers: whatever id it asks for, it becomes the reserved agent, child of the spawner
//!    (`Router::register_supervised`); the waiter gets the agent and the spawn call returns.
//! 3. The process exits: the supervisor reports the exit ([`Router::supervised_exited`]); the
//!    agent goes `failed` (crash) or `stopped` (clean exit or requested stop) with exit code,
//!    signal and stderr tail in the event. If the process is restarted, its next registration
//!    takes the agent back (`registered`, reason `restarted`); if not, the agent is unregistered
//!    (reason `process_exited`) after the resume window, so late viewers still see how it
//!    ended.
//! 4. A process that exits before registering fails the spawn (3004) and is not restarted.

use crate::router::agents::supervised::{
    spawn_failure_cause, ExitInfo, ProcessControl, SpawnWaiter, Supervised,
};
use crate::router::identities::table::IdKind;
use std::time::Instant;

use tokio::sync::oneshot;

use crate::protocol::agent::{Agent, AgentState};
use crate::protocol::event::{
    AgentDiagnosticData, AgentSpawnFailedData, AgentSpawningData, AgentStateChangedData,
    AgentStderrData, EventType,
};
use crate::protocol::ids::{AgentId, ParticipantId};
use crate::protocol::methods::agents::{RegisterParams, SpawnParams};

use crate::router::caller::Caller;
use crate::router::caller::Ctx;
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::sessions::table::ConnOrigin;
use crate::router::timers::Deadline;

impl Router {
    /// Reserves an agent id for a process about to be launched, checking what a spawn must
    /// check: `parent` (default: the spawner's agent) must be controlled by the spawner, and the
    /// id must be free. `spawner` is `None` for agents the router starts from its config.
    ///
    /// # Errors
    /// 2001 / 1003 for the parent, 3000 for a taken id, 1000 without a session.
    pub fn reserve_supervised(
        &mut self,
        spawner: Option<&Ctx>,
        p: &SpawnParams,
    ) -> Result<(AgentId, Option<AgentId>, SpawnWaiter), RouterError> {
        let caller = spawner.map(|ctx| self.caller(ctx)).transpose()?;
        let parent = p
            .register
            .parent
            .clone()
            .or_else(|| caller.as_ref().and_then(|c| c.primary_agent.clone()));
        if let (Some(parent), Some(caller)) = (&parent, &caller) {
            self.controlled_agent(caller, parent)?;
        }
        let id = match &p.register.agent_id {
            Some(id) if id.as_str().is_empty() => {
                return Err(RouterError::InvalidParams(
                    "agentId must not be empty".into(),
                ))
            }
            Some(id) => id.clone(),
            None => AgentId::generate(),
        };
        if self.registry.contains(&id) || self.supervised.contains(&id) {
            return Err(RouterError::AgentExists(id.to_string()));
        }
        // The id is the spawner's principal's (router::identities); the process that runs it
        // registers it through its reservation.
        let principal = caller
            .as_ref()
            .and_then(|c| self.principal_of(&c.participant))
            .cloned();
        if let Some(caller) = &caller {
            let system = caller.kind == crate::protocol::capabilities::ParticipantType::System;
            self.may_take(IdKind::Agent, id.as_str(), principal.as_ref(), system)
                .map_err(|r| r.agent_error(id.as_str()))?;
        }
        let scopes = p.register.scopes.as_deref().unwrap_or_default();
        match &caller {
            Some(caller) => {
                self.check_initial_scopes(caller, &id, p.register.role.as_deref(), scopes)?;
            }
            // Agents from the router's own configuration: trusted, the scopes must exist.
            None => {
                if let Some(scope) = scopes.iter().find(|s| !self.scopes.contains(s)) {
                    return Err(RouterError::ScopeNotFound(scope.to_string()));
                }
            }
        }
        let mut template = p.register.clone();
        if let Some(extra) = &p.requested_scopes {
            template
                .scopes
                .get_or_insert_with(Vec::new)
                .extend(extra.iter().cloned());
        }
        let (tx, rx) = oneshot::channel();
        self.supervised.insert(
            id.clone(),
            Supervised {
                parent: parent.clone(),
                template,
                waiter: Some(tx),
                registered_once: false,
                spawner: caller.as_ref().map(Caller::address),
                spawning: None,
            },
        );
        self.claim(IdKind::Agent, id.as_str(), principal.as_ref());
        Ok((id, parent, rx))
    }

    /// The supervisor launched the process for a reserved agent: emits `agent.spawning`, which
    /// the agent's registration will follow from.
    pub fn supervised_launched(&mut self, agent: &AgentId, pid: u32, program: &str) {
        let Some(ticket) = self.supervised.get(agent) else {
            return;
        };
        if ticket.registered_once {
            return;
        }
        let data = AgentSpawningData {
            agent_id: agent.clone(),
            parent: ticket.parent.clone(),
            program: program.to_owned(),
            pid,
        };
        let source = ticket.spawner.clone();
        let ev = self.emit_reserved(EventType::AgentSpawning, source, agent, &data, Vec::new());
        if let Some(ticket) = self.supervised.get_mut(agent) {
            ticket.spawning = Some(ev);
        }
    }

    /// Drops a reservation whose process could not be started or did not register in time.
    pub fn cancel_supervised(&mut self, agent: &AgentId, error: RouterError) {
        if let Some(mut s) = self.supervised.remove(agent) {
            self.emit_spawn_failed(agent, &s, &error);
            if let Some(w) = s.waiter.take() {
                let _ = w.send(Err(error));
            }
        }
        if self.registry.contains(agent) {
            self.remove_agent(agent, "spawn_failed", Vec::new());
        }
    }

    fn emit_spawn_failed(&mut self, agent: &AgentId, ticket: &Supervised, error: &RouterError) {
        if ticket.registered_once {
            return;
        }
        let data = AgentSpawnFailedData {
            agent_id: agent.clone(),
            error: error.to_string(),
        };
        let caused_by = ticket.spawning.into_iter().collect();
        self.emit_reserved(
            EventType::AgentSpawnFailed,
            ticket.spawner.clone(),
            agent,
            &data,
            caused_by,
        );
    }

    /// Emits an event about a reserved agent that is not registered (yet): nobody knows its
    /// visibility, but the exposure rules already apply to its id (a hidden id is seen by system
    /// observers only, as it will be once registered).
    fn emit_reserved<D: serde::Serialize>(
        &mut self,
        kind: EventType,
        source: Option<std::sync::Arc<str>>,
        agent: &AgentId,
        data: &D,
        caused_by: Vec<crate::protocol::ids::EventId>,
    ) -> crate::protocol::ids::EventId {
        let audience = if crate::router::permissions::agent_exposed(
            &self.config.permissions,
            agent.as_str(),
        ) {
            crate::router::events::log::Audience::Everyone
        } else {
            crate::router::events::log::Audience::System
        };
        self.emit(crate::router::events::log::EventDraft {
            kind,
            source,
            data: crate::router::core::to_json(data),
            caused_by,
            keys: crate::router::events::log::FilterKeys {
                agent_id: Some(agent.clone()),
                ..Default::default()
            },
            audience,
        })
    }

    /// Whether the router supervises a process for this agent.
    pub fn is_supervised(&self, agent: &AgentId) -> bool {
        self.supervised.contains(agent)
    }

    /// Registration from a supervised process's connection.
    pub(crate) fn register_supervised(
        &mut self,
        caller: &Caller,
        agent: &AgentId,
        p: RegisterParams,
    ) -> Result<(Agent, bool), RouterError> {
        let Some(ticket) = self.supervised.get(agent) else {
            return Err(RouterError::InvalidRequest(format!(
                "the process for agent {agent} is no longer supervised"
            )));
        };
        let mut params = ticket.template.clone();
        params.agent_id = Some(agent.clone());
        params.parent = ticket.parent.clone();
        fill(&mut params.name, p.name);
        fill(&mut params.description, p.description);
        fill(&mut params.role, p.role);
        fill(&mut params.visibility, p.visibility);
        fill(&mut params.capabilities, p.capabilities);
        fill(&mut params.environment, p.environment);
        fill(&mut params.capability_descriptor, p.capability_descriptor);
        fill(&mut params.metadata, p.metadata);
        fill(&mut params.scopes, p.scopes);

        let resumed = match self.registry.get(agent) {
            Some(rec) if rec.agent.owner_id.is_some() => {
                return Err(RouterError::AgentExists(agent.to_string()))
            }
            Some(rec) => {
                // A restarted process takes its agent back.
                let previous = rec.agent.state.clone();
                self.registry
                    .set_owner(agent, Some(caller.participant.clone()));
                if let Some(rec) = self.registry.get_mut(agent) {
                    rec.agent.state = AgentState::REGISTERED;
                    rec.orphan_expires = None;
                    rec.expiry_reason = None;
                    rec.state_before_orphan = None;
                }
                let snapshot = self.apply_reregistration(agent, &params);
                let hint = self.take_cause_hint(agent);
                if let Some(snapshot) = snapshot {
                    let restarted = self.emit_agent_event(
                        EventType::AgentStateChanged,
                        &snapshot,
                        &AgentStateChangedData::new(
                            agent.clone(),
                            previous,
                            AgentState::REGISTERED,
                            Some("restarted".into()),
                        ),
                        hint,
                    );
                    self.adopt_primary(caller, agent);
                    self.flush_offline(agent, Some(restarted));
                } else {
                    self.adopt_primary(caller, agent);
                }
                true
            }
            None => {
                let caused_by = self
                    .supervised
                    .get(agent)
                    .and_then(|t| t.spawning)
                    .into_iter()
                    .collect();
                self.create_agent(caller, agent.clone(), params, caused_by);
                false
            }
        };
        let record = self
            .agent_view()
            .whole(agent)
            .ok_or_else(|| RouterError::AgentNotFound(agent.to_string()))?;
        if let Some(ticket) = self.supervised.get_mut(agent) {
            ticket.registered_once = true;
            if let Some(w) = ticket.waiter.take() {
                let _ = w.send(Ok(record.clone()));
            }
        }
        Ok((record, resumed))
    }

    /// A supervised process's connection went away: its agents lose their owner but keep
    /// their state; the exit report (or the restarted process) decides what happens next.
    pub(crate) fn release_supervised(&mut self, participant: &ParticipantId) {
        for agent in self.registry.owned_by(participant) {
            self.registry.set_owner(&agent, None);
        }
    }

    /// A supervised process exited. Returns whether the supervisor should restart it.
    pub fn supervised_exited(&mut self, agent: &AgentId, pid: u32, info: ExitInfo) -> bool {
        let Some(ticket) = self.supervised.get_mut(agent) else {
            return false;
        };
        if let Some(waiter) = ticket.waiter.take() {
            // Died during its handshake: the spawner gets the error, nothing restarts.
            let error = RouterError::SpawnFailed(format!(
                "process {pid} exited ({}) before registering{}",
                info.describe(),
                spawn_failure_cause(info.last_error.as_deref(), &info.stderr_tail)
            ));
            if let Some(ticket) = self.supervised.remove(agent) {
                self.emit_spawn_failed(agent, &ticket, &error);
            }
            self.counters.process_exited("spawn_failed", false);
            let _ = waiter.send(Err(error));
            return false;
        }
        let restart = info.policy_restarts && !info.requested && ticket.registered_once;
        let Some(rec) = self.registry.get(agent) else {
            self.supervised.remove(agent);
            return false;
        };
        let previous = rec.agent.state.clone();
        let new_state = if info.requested || info.clean() {
            AgentState::STOPPED
        } else {
            AgentState::FAILED
        };
        let reason = if info.requested {
            "stopped"
        } else if info.clean() {
            "exited"
        } else {
            "crashed"
        };
        self.counters.process_exited(reason, restart);
        self.registry.set_owner(agent, None);
        let expires = (!restart).then(|| Instant::now() + self.config.resume_window);
        let Some(rec) = self.registry.get_mut(agent) else {
            return false;
        };
        rec.agent.state = new_state.clone();
        rec.orphan_expires = expires;
        rec.expiry_reason = expires.map(|_| "process_exited");
        let lifecycle = rec.agent.lifecycle.get_or_insert_with(Default::default);
        lifecycle.stopped_at = Some(crate::protocol::ids::now_ms());
        lifecycle.exit_code = info.code.map(i64::from);
        lifecycle.exit_reason = Some(format!("{reason}: {}", info.describe()));
        let snapshot = rec.agent.clone();
        let snapshot = self.agent_view().complete(snapshot);
        let mut data = AgentStateChangedData::new(
            agent.clone(),
            previous,
            new_state,
            Some(if restart {
                format!("{reason}; restarting")
            } else {
                reason.to_owned()
            }),
        );
        data.exit_code = info.code;
        data.signal = info.signal;
        data.stderr_tail = Some(info.stderr_tail);
        // A requested stop follows from its `stopping`; a crash follows from nothing we saw.
        let hint = self.take_cause_hint(agent);
        let caused_by = if info.requested { hint } else { Vec::new() };
        let ended =
            self.emit_agent_event(EventType::AgentStateChanged, &snapshot, &data, caused_by);
        if restart {
            self.set_cause_hint(agent, ended);
        }
        if let Some(at) = expires {
            self.supervised.remove(agent);
            self.schedule(at, Deadline::OrphanExpiry(agent.clone()));
        }
        restart
    }

    /// Lines a supervised process wrote to stderr.
    pub fn supervised_output(
        &mut self,
        agent: &AgentId,
        pid: u32,
        lines: Vec<String>,
        dropped: u64,
    ) {
        let data = AgentStderrData {
            agent_id: agent.clone(),
            pid,
            lines,
            dropped: (dropped > 0).then_some(dropped),
        };
        self.emit_process_event(EventType::AgentStderr, agent, &data);
    }

    /// A line on a supervised process's stdout that is not JSON-RPC.
    pub fn supervised_diagnostic(
        &mut self,
        agent: &AgentId,
        pid: u32,
        line: String,
        error: String,
    ) {
        let data = AgentDiagnosticData {
            agent_id: agent.clone(),
            pid,
            stream: "stdout".into(),
            line,
            error,
        };
        self.emit_process_event(EventType::AgentDiagnostic, agent, &data);
    }

    fn emit_process_event<D: serde::Serialize>(
        &mut self,
        kind: EventType,
        agent: &AgentId,
        data: &D,
    ) {
        match self.agent_view().whole(agent) {
            Some(a) => {
                self.emit_agent_event(kind, &a, data, Vec::new());
            }
            None => {
                // Not registered (yet): the event is about the reservation.
                self.emit_reserved(kind, Some(agent.as_arc().clone()), agent, data, Vec::new());
            }
        }
    }

    /// Tells the supervisor to act on an agent's process, if it has one. Never waits.
    pub(crate) fn control_process(&self, control: ProcessControl) {
        self.supervised.control(control);
    }

    /// The supervised agent a connection runs as, if any.
    pub(crate) fn supervised_origin(&self, ctx: &Ctx) -> Option<AgentId> {
        match self.conns.get(&ctx.conn).map(|c| c.origin()) {
            Some(ConnOrigin::Supervised { agent, .. }) => Some(agent.clone()),
            _ => None,
        }
    }
}

fn fill<T>(slot: &mut Option<T>, value: Option<T>) {
    if slot.is_none() {
        *slot = value;
    }
}
