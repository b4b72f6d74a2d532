//! Scope handlers: create, delete, list, get, join, leave, members.
//!
//! Membership changes go through the scopes table's `join` / `leave` (membership is stored
//! there once; an agent's `scopes` is derived when its snapshot is built) and emit
//! `scope_member_joined` / `scope_member_left`. Visibility follows `Scope.visibility`
//! (`public`, `members` = the viewer owns a member agent, `system`; its creator always sees it);
//! an invisible scope is reported as not found. Join and leave require control of the agent (its owner, an ancestor's
//! owner, system) or being the scope's creator.

use crate::protocol::agent::Agent;
use crate::protocol::event::{EventType, ScopeCreatedData, ScopeDeletedData};
use crate::protocol::ids::{AgentId, EventId, ScopeId};
use crate::protocol::methods::scopes::*;
use crate::protocol::scope::{Scope, ScopeVisibility};

use crate::router::caller::Caller;
use crate::router::caller::Ctx;
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::events::log::Audience;
use crate::router::events::log::FilterKeys;
use crate::router::permissions::can_control_agent;
use crate::router::permissions::can_join_scope;
use crate::router::permissions::can_see_agent;
use crate::router::permissions::can_see_scope;
use crate::router::scopes::table::ScopeRecord;

impl Router {
    fn can_see_scope(&self, caller: &Caller, scope: &ScopeRecord) -> bool {
        can_see_scope(&caller.viewer(), scope, self.agent_view())
    }

    fn visible_scope(&self, caller: &Caller, id: &ScopeId) -> Result<&ScopeRecord, RouterError> {
        self.scopes
            .get(id)
            .filter(|s| self.can_see_scope(caller, s))
            .ok_or_else(|| RouterError::ScopeNotFound(id.to_string()))
    }

    /// Checks that a new agent `id` (with `role`, owned by the caller) may start in `scopes`:
    /// each must be visible (else 2002) and admit it under its `joinPolicy` (else 1003).
    pub(crate) fn check_initial_scopes(
        &self,
        caller: &Caller,
        id: &AgentId,
        role: Option<&str>,
        scopes: &[ScopeId],
    ) -> Result<(), RouterError> {
        let mut prospective = Agent::new(id.clone(), Some(caller.participant.clone()));
        prospective.role = role.map(str::to_owned);
        for scope in scopes {
            let record = self.visible_scope(caller, scope)?;
            can_join_scope(&caller.viewer(), record, &prospective, self.agent_view())
                .map_err(RouterError::PermissionDenied)?;
        }
        Ok(())
    }

    /// The scope and its ancestors, as filter keys.
    pub(crate) fn scope_keys(&self, scope: &ScopeId) -> Vec<ScopeId> {
        let keys = self.scopes.with_ancestors(scope);
        if keys.is_empty() {
            vec![scope.clone()]
        } else {
            keys
        }
    }

    /// Who may see events about a scope (and about `agent` in it).
    pub(crate) fn scope_audience(&self, scope: &ScopeId, agent: Option<&Agent>) -> Audience {
        let agent_audience = agent.map(|a| {
            crate::router::permissions::agent_audience(
                a,
                self.agent_view(),
                &self.config.permissions,
            )
        });
        let scope_vis = self
            .scopes
            .get(scope)
            .and_then(|s| s.scope().visibility)
            .unwrap_or_default();
        let creator = self.scopes.get(scope).and_then(|s| s.creator().cloned());
        let scope_audience = match scope_vis {
            _ if !crate::router::permissions::scope_exposed(
                &self.config.permissions,
                scope.as_str(),
            ) =>
            {
                Audience::System
            }
            ScopeVisibility::Public => Audience::Everyone,
            ScopeVisibility::System => Audience::System,
            ScopeVisibility::Members => Audience::Scoped {
                owner: creator,
                scopes: vec![scope.clone()],
            },
        };
        // Whoever may see both the agent and the scope.
        match agent_audience {
            Some(a) => a.and(scope_audience),
            None => scope_audience,
        }
    }

    /// `map/scopes/create`.
    pub fn handle_scopes_create(
        &mut self,
        ctx: &Ctx,
        p: ScopesCreateParams,
    ) -> Result<ScopeResult, RouterError> {
        let caller = self.caller(ctx)?;
        if let Some(id) = &p.scope_id {
            if id.as_str().is_empty() {
                return Err(RouterError::InvalidParams(
                    "scopeId must not be empty".into(),
                ));
            }
            if self.scopes.contains(id) {
                return Err(RouterError::InvalidParams(format!(
                    "scope already exists: {id}"
                )));
            }
        }
        if let Some(parent) = &p.parent {
            self.visible_scope(&caller, parent)?;
        }
        crate::router::agents::ops::check_object("metadata", p.metadata.as_ref())?;
        let scope = Scope {
            id: p.scope_id.unwrap_or_else(ScopeId::generate),
            name: p.name,
            description: p.description,
            parent: p.parent,
            join_policy: p.join_policy,
            auto_join_roles: p.auto_join_roles,
            visibility: p.visibility,
            message_visibility: p.message_visibility,
            send_policy: p.send_policy,
            persistent: p.persistent,
            auto_delete: p.auto_delete,
            metadata: p.metadata,
        };
        self.scopes
            .insert(scope.clone(), Some(caller.participant.clone()));
        let keys = FilterKeys {
            scopes: self.scope_keys(&scope.id),
            ..FilterKeys::default()
        };
        let audience = self.scope_audience(&scope.id, None);
        self.emit(crate::router::events::log::EventDraft {
            kind: EventType::ScopeCreated,
            source: Some(caller.address()),
            data: crate::router::core::to_json(&ScopeCreatedData {
                scope_id: scope.id.clone(),
                name: scope.name.clone(),
                parent: scope.parent.clone(),
            }),
            caused_by: Vec::new(),
            keys,
            audience,
        });
        Ok(ScopeResult { scope })
    }

    /// `map/scopes/delete`.
    pub fn handle_scopes_delete(
        &mut self,
        ctx: &Ctx,
        p: ScopeRef,
    ) -> Result<ScopesDeleteResult, RouterError> {
        let caller = self.caller(ctx)?;
        let scope = self.visible_scope(&caller, &p.scope_id)?.scope().clone();
        let descendants = self.scopes.descendants_deepest_first(&p.scope_id);
        if !descendants.is_empty() && p.delete_descendants != Some(true) {
            return Err(RouterError::InvalidParams(format!(
                "scope {} has child scopes; pass deleteDescendants: true to delete them too",
                p.scope_id
            )));
        }
        let keys = FilterKeys {
            scopes: self.scope_keys(&scope.id),
            ..FilterKeys::default()
        };
        let audience = self.scope_audience(&scope.id, None);
        let deleted = self.emit(crate::router::events::log::EventDraft {
            kind: EventType::ScopeDeleted,
            source: Some(caller.address()),
            data: crate::router::core::to_json(&ScopeDeletedData {
                scope_id: scope.id.clone(),
                deleted_descendants: (!descendants.is_empty()).then(|| descendants.clone()),
            }),
            caused_by: Vec::new(),
            keys,
            audience,
        });
        for id in descendants.iter().chain(std::iter::once(&scope.id)) {
            let members: Vec<AgentId> = self
                .scopes
                .get(id)
                .map(|s| s.members().iter().cloned().collect())
                .unwrap_or_default();
            for agent in members {
                self.remove_member(id, &agent, vec![deleted]);
            }
            self.scopes.remove(id);
        }
        Ok(ScopesDeleteResult {
            scope,
            deleted: true,
            deleted_descendants: descendants,
        })
    }

    /// `map/scopes/list`.
    pub fn handle_scopes_list(
        &mut self,
        ctx: &Ctx,
        p: ScopesListParams,
    ) -> Result<ScopesListResult, RouterError> {
        let caller = self.caller(ctx)?;
        let scopes = self
            .scopes
            .iter_ordered()
            .filter(|s| p.parent.is_none() || s.scope().parent == p.parent)
            .filter(|s| self.can_see_scope(&caller, s))
            .map(|s| s.scope().clone())
            .collect();
        Ok(ScopesListResult {
            scopes,
            as_of: self.bus.log.newest_id(),
        })
    }

    /// `map/scopes/get`.
    pub fn handle_scopes_get(
        &mut self,
        ctx: &Ctx,
        p: ScopeRef,
    ) -> Result<ScopeResult, RouterError> {
        let caller = self.caller(ctx)?;
        Ok(ScopeResult {
            scope: self.visible_scope(&caller, &p.scope_id)?.scope().clone(),
        })
    }

    /// Checks a join (`joinPolicy`) or a leave (the agent's controllers or the scope's creator).
    fn check_membership_change(
        &self,
        caller: &Caller,
        p: &MembershipParams,
        joining: bool,
    ) -> Result<Agent, RouterError> {
        let scope = self.visible_scope(caller, &p.scope_id)?;
        let agent = self
            .registry
            .get(&p.agent_id)
            .map(|r| r.agent())
            .filter(|a| can_see_agent(&caller.viewer(), a, self.agent_view()))
            .ok_or_else(|| RouterError::AgentNotFound(p.agent_id.to_string()))?;
        if joining {
            // Joining again is a no-op for whoever controls the agent (its policy allowed it
            // in once); anyone else must pass the policy.
            let again = scope.members().contains(&p.agent_id)
                && can_control_agent(&caller.viewer(), agent, self.agent_view());
            if !again {
                can_join_scope(&caller.viewer(), scope, agent, self.agent_view())
                    .map_err(RouterError::PermissionDenied)?;
            }
            return Ok(self.agent_view().complete(agent.clone()));
        }
        let creator = scope.creator() == Some(&caller.participant);
        if !creator && !can_control_agent(&caller.viewer(), agent, self.agent_view()) {
            return Err(RouterError::PermissionDenied(format!(
                "agent {} is not controlled by this participant",
                p.agent_id
            )));
        }
        Ok(self.agent_view().complete(agent.clone()))
    }

    /// `map/scopes/join`. Joining twice is a no-op that still succeeds.
    pub fn handle_scopes_join(
        &mut self,
        ctx: &Ctx,
        p: MembershipParams,
    ) -> Result<JoinResult, RouterError> {
        let caller = self.caller(ctx)?;
        self.check_membership_change(&caller, &p, true)?;
        self.add_member(&p.scope_id, &p.agent_id, Vec::new());
        Ok(JoinResult {
            scope: self.scope_snapshot(&p.scope_id)?,
            agent: self.agent_snapshot(&p.agent_id)?,
            joined: true,
        })
    }

    /// `map/scopes/leave`. Leaving a scope the agent is not in is a no-op that still succeeds.
    pub fn handle_scopes_leave(
        &mut self,
        ctx: &Ctx,
        p: MembershipParams,
    ) -> Result<LeaveResult, RouterError> {
        let caller = self.caller(ctx)?;
        self.check_membership_change(&caller, &p, false)?;
        self.remove_member(&p.scope_id, &p.agent_id, Vec::new());
        Ok(LeaveResult {
            scope: self.scope_snapshot(&p.scope_id)?,
            agent: self.agent_snapshot(&p.agent_id)?,
            left: true,
        })
    }

    fn scope_snapshot(&self, id: &ScopeId) -> Result<Scope, RouterError> {
        self.scopes
            .get(id)
            .map(|s| s.scope().clone())
            .ok_or_else(|| RouterError::ScopeNotFound(id.to_string()))
    }

    fn agent_snapshot(&self, id: &AgentId) -> Result<Agent, RouterError> {
        self.agent_view()
            .whole(id)
            .ok_or_else(|| RouterError::AgentNotFound(id.to_string()))
    }

    /// `map/scopes/members`.
    pub fn handle_scopes_members(
        &mut self,
        ctx: &Ctx,
        p: MembersParams,
    ) -> Result<MembersResult, RouterError> {
        let caller = self.caller(ctx)?;
        if p.limit == Some(0) {
            return Err(RouterError::InvalidParams(
                "limit must be at least 1".into(),
            ));
        }
        let scope = self.visible_scope(&caller, &p.scope_id)?;
        let limit = p.limit.map_or(usize::MAX, |l| l as usize);
        let mut members = Vec::new();
        let mut next_cursor = None;
        let start = std::ops::Bound::Excluded(AgentId::from(p.cursor.clone().unwrap_or_default()));
        let range = match p.cursor {
            Some(_) => scope.members().range((start, std::ops::Bound::Unbounded)),
            None => scope.members().range::<AgentId, _>(..),
        };
        for id in range {
            let visible = self
                .registry
                .get(id)
                .is_some_and(|r| can_see_agent(&caller.viewer(), r.agent(), self.agent_view()));
            if !visible {
                continue;
            }
            if members.len() == limit {
                next_cursor = members.last().map(|m: &AgentId| m.to_string());
                break;
            }
            members.push(id.clone());
        }
        Ok(MembersResult {
            members,
            next_cursor,
        })
    }

    /// Adds `agent` to `scope` (both must exist) and emits `scope_member_joined`.
    pub(crate) fn add_member(&mut self, scope: &ScopeId, agent: &AgentId, caused_by: Vec<EventId>) {
        if !self.registry.contains(agent) || !self.scopes.join(scope, agent) {
            return;
        }
        let Some(snapshot) = self.agent_view().whole(agent) else {
            return;
        };
        self.emit_scope_member_event(EventType::ScopeMemberJoined, scope, &snapshot, caused_by);
    }

    /// Removes `agent` from `scope` and emits `scope_member_left`.
    pub(crate) fn remove_member(
        &mut self,
        scope: &ScopeId,
        agent: &AgentId,
        caused_by: Vec<EventId>,
    ) {
        if !self.scopes.leave(scope, agent) {
            return;
        }
        let Some(snapshot) = self.agent_view().whole(agent) else {
            return;
        };
        self.emit_scope_member_event(EventType::ScopeMemberLeft, scope, &snapshot, caused_by);
    }
}
