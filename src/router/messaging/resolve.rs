//! Address resolution: which recipients an address names for a caller, and which of them it
//! may message. A pure function of read-only views of the agents, scopes and sessions
//! (`router::views`), so every address form can be tested without a router.
//!
//! Rules (methods.md "Address → recipients", REC column; choices in `docs/compatibility.md`):
//! - `{agent: X}` names agent X; if no visible agent has that id but a participant does, it
//!   names that participant (how `AgentConnection.reply()` reaches a client).
//! - Unknown explicit agents, scopes and participants are errors (2001/2002/2000) unless
//!   `strict` is off.
//! - Scope, role and broadcast exclude the sending agent; recipients are de-duplicated.
//! - Only agents the caller may see are named; a scope must be visible and take messages from
//!   the caller (`sendPolicy`).
//!
//! Owns nothing.

use std::collections::HashSet;

use crate::protocol::capabilities::ParticipantType;
use crate::protocol::ids::{AgentId, ParticipantId, ScopeId};
use crate::protocol::message::{Address, ParticipantGroup};
use crate::router::caller::Caller;
use crate::router::error::RouterError;
use crate::router::permissions::{
    can_message_agent, can_see_agent, can_see_scope, can_send_to_scope,
};
use crate::router::views::{AgentView, ScopeView, SessionView};

/// What resolution reads.
#[derive(Debug, Clone, Copy)]
pub struct Views<'a> {
    /// The agents (with their scopes).
    pub agents: AgentView<'a>,
    /// The scopes.
    pub scopes: ScopeView<'a>,
    /// The sessions.
    pub sessions: SessionView<'a>,
}

/// A resolved recipient.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Recipient {
    /// An agent (delivered to its owner's connection).
    Agent(AgentId),
    /// A participant (delivered to its connection).
    Participant(ParticipantId),
}

impl Recipient {
    /// Its id (an agent's or a participant's).
    pub fn id(&self) -> &str {
        match self {
            Self::Agent(a) => a.as_str(),
            Self::Participant(p) => p.as_str(),
        }
    }
}

/// Keeps the recipients the sender may message (`canMessage` of its agent, `acceptsFrom` of
/// each target). A refused explicit target is an error; refused members of a group are
/// left out.
pub fn permitted(
    agents: AgentView<'_>,
    caller: &Caller,
    recipients: Vec<Recipient>,
    explicit: bool,
) -> Result<Vec<Recipient>, RouterError> {
    let viewer = caller.viewer();
    let sender = caller.primary_agent.as_ref().and_then(|a| agents.get(a));
    let mut out = Vec::with_capacity(recipients.len());
    for r in recipients {
        let allowed = match &r {
            Recipient::Agent(id) => agents
                .get(id)
                .is_some_and(|t| can_message_agent(&viewer, sender, t, agents)),
            Recipient::Participant(_) => true,
        };
        if allowed {
            out.push(r);
        } else if explicit {
            return Err(RouterError::PermissionDenied(format!(
                "agent {} does not accept messages from {}",
                r.id(),
                caller.address()
            )));
        }
    }
    Ok(out)
}

/// Resolves an address to recipients (see the module docs).
pub fn resolve(
    views: Views<'_>,
    caller: &Caller,
    address: &Address,
    strict: bool,
) -> Result<Vec<Recipient>, RouterError> {
    let Views {
        agents,
        scopes,
        sessions,
    } = views;
    let viewer = caller.viewer();
    let visible_agent = |id: &AgentId| {
        agents
            .get(id)
            .is_some_and(|r| can_see_agent(&viewer, r, agents))
    };
    let sender_agent = caller.primary_agent.as_ref();
    let not_sender = |a: &AgentId| Some(a) != sender_agent;
    let scope_members = |id: &ScopeId| -> Result<Vec<Recipient>, RouterError> {
        match scopes.get(id).filter(|s| can_see_scope(&viewer, s, agents)) {
            Some(s) if !can_send_to_scope(&viewer, s, agents) => {
                Err(RouterError::PermissionDenied(format!(
                    "scope {id} takes messages from its members only (sendPolicy)"
                )))
            }
            Some(s) => Ok(s
                .members()
                .iter()
                .filter(|a| not_sender(a) && visible_agent(a))
                .cloned()
                .map(Recipient::Agent)
                .collect()),
            None if strict => Err(RouterError::ScopeNotFound(id.to_string())),
            None => Ok(Vec::new()),
        }
    };
    let agent_or_participant = |id: &str| -> Option<Recipient> {
        let agent = AgentId::from(id);
        if visible_agent(&agent) {
            Some(Recipient::Agent(agent))
        } else {
            sessions
                .by_participant(&ParticipantId::from(id))
                .map(|s| Recipient::Participant(s.participant.clone()))
        }
    };
    let mut out = match address {
        Address::Text(text) => {
            if let Some(id) = text.strip_prefix("agent:") {
                match agent_or_participant(id) {
                    Some(r) => vec![r],
                    None if strict => return Err(RouterError::AgentNotFound(id.into())),
                    None => Vec::new(),
                }
            } else if let Some(id) = text.strip_prefix("scope:") {
                scope_members(&ScopeId::from(id))?
            } else {
                let is_agent = visible_agent(&AgentId::from(text.as_str()));
                let is_scope = scopes
                    .get(&ScopeId::from(text.as_str()))
                    .is_some_and(|s| can_see_scope(&viewer, s, agents));
                match (is_agent, is_scope) {
                    (true, true) => return Err(RouterError::AddressAmbiguous(text.clone())),
                    (false, true) => scope_members(&ScopeId::from(text.as_str()))?,
                    _ => match agent_or_participant(text) {
                        Some(r) => vec![r],
                        None if strict => return Err(RouterError::AddressNotFound(text.clone())),
                        None => Vec::new(),
                    },
                }
            }
        }
        Address::Agent(id) => match agent_or_participant(id.as_str()) {
            Some(r) => vec![r],
            None if strict => return Err(RouterError::AgentNotFound(id.to_string())),
            None => Vec::new(),
        },
        Address::Agents(ids) => {
            let mut v = Vec::new();
            for id in ids {
                match agent_or_participant(id.as_str()) {
                    Some(r) => v.push(r),
                    None if strict => return Err(RouterError::AgentNotFound(id.to_string())),
                    None => {}
                }
            }
            v
        }
        Address::Scope(id) => scope_members(id)?,
        Address::Role { role, within } => {
            let members = match within {
                Some(scope) => match scopes
                    .get(scope)
                    .filter(|s| can_see_scope(&viewer, s, agents))
                {
                    Some(s) => Some(&s.members()),
                    None if strict => return Err(RouterError::ScopeNotFound(scope.to_string())),
                    None => return Ok(Vec::new()),
                },
                None => None,
            };
            agents
                .iter_ordered()
                .filter(|r| r.role.as_deref() == Some(role.as_str()))
                .filter(|r| members.is_none_or(|m| m.contains(&r.id)))
                .filter(|r| not_sender(&r.id) && visible_agent(&r.id))
                .map(|r| Recipient::Agent(r.id.clone()))
                .collect()
        }
        Address::Hierarchical(h) => {
            let me = sender_agent.ok_or_else(|| {
                RouterError::AddressNotFound(
                    "hierarchical address: the sender has no registered agent".into(),
                )
            })?;
            let mut v: Vec<AgentId> = Vec::new();
            if h.parent {
                match agents.get(me).and_then(|r| r.parent.clone()) {
                    Some(p) if agents.contains(&p) => v.push(p),
                    _ if strict && !(h.children || h.ancestors || h.descendants || h.siblings) => {
                        return Err(RouterError::AddressNotFound(format!(
                            "parent of {me} (it has none)"
                        )))
                    }
                    _ => {}
                }
            }
            if h.children {
                v.extend(agents.descendants(me, Some(h.depth.unwrap_or(1))));
            }
            if h.descendants {
                v.extend(agents.descendants(me, h.depth));
            }
            if h.ancestors {
                v.extend(agents.ancestors(me, h.depth));
            }
            if h.siblings {
                v.extend(agents.siblings(me));
            }
            v.into_iter()
                .filter(|a| a != me && visible_agent(a))
                .map(Recipient::Agent)
                .collect()
        }
        Address::Broadcast => agents
            .iter_ordered()
            .filter(|r| not_sender(&r.id) && visible_agent(&r.id))
            .map(|r| Recipient::Agent(r.id.clone()))
            .collect(),
        Address::System => Vec::new(),
        Address::Participant(p) => match sessions.by_participant(p) {
            Some(s) => vec![Recipient::Participant(s.participant.clone())],
            None if strict => return Err(RouterError::AddressNotFound(p.to_string())),
            None => Vec::new(),
        },
        Address::Participants(group) => sessions
            .iter()
            .filter(|s| s.attached && *s.participant != caller.participant)
            .filter(|s| match group {
                ParticipantGroup::All => true,
                ParticipantGroup::Agents => s.kind == ParticipantType::Agent,
                ParticipantGroup::Clients => s.kind == ParticipantType::Client,
            })
            .map(|s| Recipient::Participant(s.participant.clone()))
            .collect(),
        Address::Federated { system, .. } => {
            return Err(RouterError::SystemNotFound(system.clone()))
        }
    };
    let mut seen = HashSet::new();
    out.retain(|r| seen.insert(r.clone()));
    Ok(out)
}
