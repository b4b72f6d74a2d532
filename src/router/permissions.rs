//! Permission decisions as pure functions of (viewer, target, registry).
//!
//! Owns *what is allowed*; it never mutates state and never produces wire errors (callers map a
//! `false` to `RouterError::PermissionDenied` or, where existence must not leak, to "not
//! found"). Rules follow `../shared/spec/permissions.md`:
//! - layer 2: capabilities per method (checked in the router's call path);
//! - layer 4: agent visibility (`public`, `parent-only`, `scope`, `system`), applied to list,
//!   get, graph, scope members and events;
//! - control: who may update, unregister or otherwise act on an agent as its owner.

use crate::protocol::agent::{Agent, AgentVisibility};
use crate::protocol::capabilities::ParticipantType;
use crate::protocol::ids::ParticipantId;

use super::events::log::Audience;
use super::registry::Registry;

/// The participant a decision is about.
#[derive(Debug, Clone, Copy)]
pub struct Viewer<'a> {
    /// Its participant id.
    pub participant: &'a ParticipantId,
    /// Its declared type.
    pub kind: ParticipantType,
}

impl Viewer<'_> {
    fn is_system(&self) -> bool {
        self.kind == ParticipantType::System
    }
}

/// Whether `viewer` owns an agent that is a member of any of `scopes`.
fn shares_scope(
    viewer: &Viewer<'_>,
    scopes: &[crate::protocol::ids::ScopeId],
    reg: &Registry,
) -> bool {
    if scopes.is_empty() {
        return false;
    }
    reg.owned_by(viewer.participant.as_str()).iter().any(|a| {
        reg.get(a.as_str())
            .is_some_and(|r| r.agent.scopes.iter().any(|s| scopes.contains(s)))
    })
}

/// Layer 4: may `viewer` see `agent`?
///
/// `scope` visibility means "the viewer owns an agent sharing a scope with it" (the SDK helper
/// always allows it; permissions.md §5 fixes that).
pub fn can_see_agent(viewer: &Viewer<'_>, agent: &Agent, reg: &Registry) -> bool {
    if viewer.is_system() {
        return true;
    }
    let owns = |id: &str| reg.is_owned_by(id, viewer.participant.as_str());
    match agent.visibility.unwrap_or_default() {
        AgentVisibility::Public => true,
        AgentVisibility::System => false,
        AgentVisibility::ParentOnly => {
            owns(agent.id.as_str()) || agent.parent.as_ref().is_some_and(|p| owns(p.as_str()))
        }
        AgentVisibility::Scope => {
            owns(agent.id.as_str()) || shares_scope(viewer, &agent.scopes, reg)
        }
    }
}

/// The audience of events about `agent`, fixed when the event is emitted.
pub fn agent_audience(agent: &Agent, reg: &Registry) -> Audience {
    match agent.visibility.unwrap_or_default() {
        AgentVisibility::Public => Audience::Everyone,
        AgentVisibility::System => Audience::System,
        AgentVisibility::ParentOnly => {
            let mut who: Vec<ParticipantId> = agent.owner_id.iter().cloned().collect();
            if let Some(parent_owner) = agent
                .parent
                .as_ref()
                .and_then(|p| reg.get(p.as_str()))
                .and_then(|p| p.agent.owner_id.clone())
            {
                who.push(parent_owner);
            }
            Audience::Participants { who }
        }
        AgentVisibility::Scope => Audience::Scoped {
            owner: agent.owner_id.clone(),
            scopes: agent.scopes.clone(),
        },
    }
}

/// May `viewer` see an event with this audience?
pub fn audience_allows(viewer: &Viewer<'_>, audience: &Audience, reg: &Registry) -> bool {
    if viewer.is_system() {
        return true;
    }
    match audience {
        Audience::Everyone => true,
        Audience::System => false,
        Audience::Participants { who } => who.contains(viewer.participant),
        Audience::Scoped { owner, scopes } => {
            owner.as_ref() == Some(viewer.participant) || shares_scope(viewer, scopes, reg)
        }
    }
}

/// May `viewer` act on `agent` as its controller (update, unregister)? System participants, the
/// owner, and the owner of any ancestor may.
pub fn can_control_agent(viewer: &Viewer<'_>, agent: &Agent, reg: &Registry) -> bool {
    if viewer.is_system() || agent.owner_id.as_ref() == Some(viewer.participant) {
        return true;
    }
    reg.ancestors(agent.id.as_str(), None)
        .iter()
        .any(|a| reg.is_owned_by(a.as_str(), viewer.participant.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ids::AgentId;

    fn agent(id: &str, parent: Option<&str>, owner: &str, vis: AgentVisibility) -> Agent {
        let mut a = Agent::new(id.into(), Some(owner.into()));
        a.parent = parent.map(AgentId::from);
        a.visibility = Some(vis);
        a
    }

    #[test]
    fn visibility_table() {
        let mut reg = Registry::default();
        reg.insert(agent("parent", None, "p-owner", AgentVisibility::Public));
        let child = agent(
            "child",
            Some("parent"),
            "c-owner",
            AgentVisibility::ParentOnly,
        );
        reg.insert(child.clone());
        let hidden = agent("hidden", None, "c-owner", AgentVisibility::System);
        reg.insert(hidden.clone());

        let (po, co, other, sys) = (
            ParticipantId::from("p-owner"),
            ParticipantId::from("c-owner"),
            ParticipantId::from("other"),
            ParticipantId::from("sys"),
        );
        let v = |p| Viewer {
            participant: p,
            kind: ParticipantType::Client,
        };
        assert!(can_see_agent(&v(&po), &child, &reg), "parent's owner");
        assert!(can_see_agent(&v(&co), &child, &reg), "owner");
        assert!(!can_see_agent(&v(&other), &child, &reg));
        assert!(
            !can_see_agent(&v(&co), &hidden, &reg),
            "system-only even for its owner"
        );
        let system = Viewer {
            participant: &sys,
            kind: ParticipantType::System,
        };
        assert!(can_see_agent(&system, &hidden, &reg));

        let audience = agent_audience(&child, &reg);
        assert!(audience_allows(&v(&po), &audience, &reg));
        assert!(!audience_allows(&v(&other), &audience, &reg));
    }

    #[test]
    fn control_follows_ownership_up_the_tree() {
        let mut reg = Registry::default();
        reg.insert(agent("root", None, "boss", AgentVisibility::Public));
        let leaf = agent("leaf", Some("root"), "worker", AgentVisibility::Public);
        reg.insert(leaf.clone());
        let (boss, worker, other) = (
            ParticipantId::from("boss"),
            ParticipantId::from("worker"),
            ParticipantId::from("other"),
        );
        let v = |p| Viewer {
            participant: p,
            kind: ParticipantType::Agent,
        };
        assert!(can_control_agent(&v(&worker), &leaf, &reg));
        assert!(can_control_agent(&v(&boss), &leaf, &reg));
        assert!(!can_control_agent(&v(&other), &leaf, &reg));
    }
}
