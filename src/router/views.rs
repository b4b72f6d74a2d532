//! Read-only views of the parts' tables: what one part may read of another's.
//!
//! Each part owns its table and writes it alone (`router::agents::registry`,
//! `router::scopes::table`, `router::sessions::table`). The places that decide from several
//! tables at once — `router::permissions`, the event bus's delivery checks, address
//! resolution (`router::messaging::resolve`) — take these small `Copy` views instead of whole
//! tables, so they can read and never write, and a reader of their signatures sees what they
//! depend on.
//!
//! Owns nothing: a view borrows the tables for the length of one decision.

use crate::protocol::agent::Agent;
use crate::protocol::ids::{AgentId, ParticipantId, ScopeId};
use crate::router::agents::registry::{AgentRecord, Registry};
use crate::router::scopes::table::{ScopeRecord, Scopes};
use crate::router::sessions::table::{SessionFacts, Sessions};

/// The agents as others read them: records, the tree, owners, and each agent's scopes
/// (derived from the scopes part's membership, which is stored there once).
#[derive(Debug, Clone, Copy)]
pub struct AgentView<'a> {
    registry: &'a Registry,
    scopes: &'a Scopes,
}

impl<'a> AgentView<'a> {
    /// A view of `registry`, with the membership of `scopes`.
    pub fn new(registry: &'a Registry, scopes: &'a Scopes) -> Self {
        Self { registry, scopes }
    }

    /// The stored wire record of an agent (no `children`, no `scopes`: see
    /// [`AgentView::snapshot`]).
    pub fn get(&self, id: &AgentId) -> Option<&'a Agent> {
        self.registry.get(id).map(AgentRecord::agent)
    }

    /// [`AgentView::get`] by an id that arrives as text.
    pub fn get_by_text(&self, id: &str) -> Option<&'a Agent> {
        self.registry.get_by_text(id).map(AgentRecord::agent)
    }

    /// The whole record.
    pub fn record(&self, id: &AgentId) -> Option<&'a AgentRecord> {
        self.registry.get(id)
    }

    /// Whether the id is registered.
    pub fn contains(&self, id: &AgentId) -> bool {
        self.registry.contains(id)
    }

    /// The scopes `id` is a member of, in joining order.
    pub fn scopes_of(&self, id: &AgentId) -> &'a [ScopeId] {
        self.scopes.of_agent(id)
    }

    /// The record as the wire shows it: `children` and `scopes` filled in.
    pub fn snapshot(&self, id: &AgentId) -> Option<Agent> {
        let mut agent = self.registry.expanded(id)?;
        agent.scopes = self.scopes_of(id).to_vec();
        Some(agent)
    }

    /// The stored record with its `scopes` filled in (no `children`: see
    /// [`AgentView::snapshot`]).
    pub fn whole(&self, id: &AgentId) -> Option<Agent> {
        self.get(id).map(|a| self.complete(a.clone()))
    }

    /// A stored record made whole for the wire (its `scopes` filled in), when the caller
    /// already holds it.
    pub fn complete(&self, mut agent: Agent) -> Agent {
        agent.scopes = self.scopes_of(&agent.id).to_vec();
        agent
    }

    /// Whether `owner` owns `agent`.
    pub fn is_owned_by(&self, agent: &AgentId, owner: &ParticipantId) -> bool {
        self.registry.is_owned_by(agent, owner)
    }

    /// [`AgentView::is_owned_by`] by an agent id that arrives as text.
    pub fn text_is_owned_by(&self, agent: &str, owner: &ParticipantId) -> bool {
        self.registry.text_is_owned_by(agent, owner)
    }

    /// The agents `owner` owns, in id order.
    pub fn owned_by(&self, owner: &ParticipantId) -> Vec<AgentId> {
        self.registry.owned_by(owner)
    }

    /// Ancestors, nearest first, up to `depth` levels.
    pub fn ancestors(&self, id: &AgentId, depth: Option<u32>) -> Vec<AgentId> {
        self.registry.ancestors(id, depth)
    }

    /// Descendants in depth-first pre-order, down to `depth` levels.
    pub fn descendants(&self, id: &AgentId, depth: Option<u32>) -> Vec<AgentId> {
        self.registry.descendants(id, depth)
    }

    /// Agents with the same parent, excluding `id`.
    pub fn siblings(&self, id: &AgentId) -> Vec<AgentId> {
        self.registry.siblings(id)
    }

    /// Every agent in registration order.
    pub fn iter_ordered(&self) -> impl Iterator<Item = &'a Agent> + 'a {
        self.registry.iter_ordered(None).map(AgentRecord::agent)
    }
}

/// The scopes as others read them.
#[derive(Debug, Clone, Copy)]
pub struct ScopeView<'a> {
    scopes: &'a Scopes,
}

impl<'a> ScopeView<'a> {
    /// A view of `scopes`.
    pub fn new(scopes: &'a Scopes) -> Self {
        Self { scopes }
    }

    /// A scope.
    pub fn get(&self, id: &ScopeId) -> Option<&'a ScopeRecord> {
        self.scopes.get(id)
    }
}

/// The sessions as others read them: who is connected, as what.
#[derive(Debug, Clone, Copy)]
pub struct SessionView<'a> {
    sessions: &'a Sessions,
}

impl<'a> SessionView<'a> {
    /// A view of `sessions`.
    pub fn new(sessions: &'a Sessions) -> Self {
        Self { sessions }
    }

    /// The session of a participant.
    pub fn by_participant(&self, participant: &ParticipantId) -> Option<SessionFacts<'a>> {
        self.sessions.by_participant(participant).map(|s| s.facts())
    }

    /// Every session.
    pub fn iter(&self) -> impl Iterator<Item = SessionFacts<'a>> + 'a {
        self.sessions.iter().map(|s| s.facts())
    }
}
