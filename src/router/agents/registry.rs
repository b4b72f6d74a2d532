//! The agent registry: agent records, the parent/child tree and the owner index.
//!
//! Pure data with queries; it emits no events and checks no permissions (the handlers in
//! `router::agents` do). Listing order is registration order, which is also what pagination
//! cursors encode.
//!
//! Owns every agent record. Only the agents part writes a record field by field
//! (`get_mut`, `insert`, `remove`, `set_owner` are `pub(in crate::router::agents)`); the other
//! parts change an agent through the methods below that name what happens
//! ([`Registry::orphan`], [`Registry::reclaim`], [`Registry::restore`]) and read it through
//! [`AgentRecord`]'s accessors or `router::views::AgentView`.
//!
//! Invariants: `order` and `by_owner` index exactly the records of `agents`; a record's
//! `children` are the registered agents whose `parent` it is; a stored [`Agent`] has no
//! `scopes` (membership is the scopes part's, derived into snapshots) and no `children`.

use std::collections::{BTreeMap, BTreeSet};

use crate::router::ids::{IdMap, Shrink};

use std::time::Instant;

use crate::protocol::agent::{Agent, AgentState, Presence};
use crate::protocol::ids::{AgentId, EventId, ParticipantId};

/// One registered agent plus what the router needs beyond the wire record. Its fields are the
/// agents part's; everyone else reads them through the accessors.
#[derive(Debug, Clone)]
pub struct AgentRecord {
    /// The wire record (without `children` and `scopes`, which snapshots derive).
    pub(in crate::router::agents) agent: Agent,
    /// Registration order (pagination key).
    pub(in crate::router::agents) order: u64,
    /// Child ids.
    pub(in crate::router::agents) children: BTreeSet<AgentId>,
    /// The state to return to on `map/agents/resume`.
    pub(in crate::router::agents) state_before_suspend: Option<AgentState>,
    /// The state to return to when an orphan is reclaimed.
    pub(in crate::router::agents) state_before_orphan: Option<AgentState>,
    /// When an orphan is unregistered if nobody reclaims it (`None`: never).
    pub(in crate::router::agents) orphan_expires: Option<Instant>,
    /// The `reason` of that unregistration (default `owner_disconnected`).
    pub(in crate::router::agents) expiry_reason: Option<&'static str>,
    /// The event the agent's next state change follows from (a stop request, its orphaning,
    /// a crash it is restarted after), when nothing more specific is known.
    pub(in crate::router::agents) cause_hint: Option<EventId>,
}

impl AgentRecord {
    /// The wire record as stored: no `children`, no `scopes` (see
    /// `router::views::AgentView::snapshot` for the record as the wire shows it).
    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    /// Registration order (pagination key).
    pub fn order(&self) -> u64 {
        self.order
    }

    /// Child ids.
    pub fn children(&self) -> &BTreeSet<AgentId> {
        &self.children
    }

    /// The state `map/agents/resume` returns to.
    pub fn state_before_suspend(&self) -> Option<&AgentState> {
        self.state_before_suspend.as_ref()
    }

    /// The state a reclaim returns to.
    pub fn state_before_orphan(&self) -> Option<&AgentState> {
        self.state_before_orphan.as_ref()
    }

    /// Whether it is an orphan (no owner, state `orphaned`).
    pub fn is_orphan(&self) -> bool {
        self.agent.owner_id.is_none() && self.agent.state == AgentState::ORPHANED
    }
}

/// What [`Registry::reclaim`] did.
#[derive(Debug)]
pub struct Reclaimed {
    /// The state the agent returned to.
    pub restored: AgentState,
    /// The event its orphaning followed from, if noted.
    pub hint: Option<EventId>,
}

/// All agents.
#[derive(Debug, Default)]
pub struct Registry {
    agents: IdMap<AgentId, AgentRecord>,
    order: BTreeMap<u64, AgentId>,
    by_owner: IdMap<ParticipantId, BTreeSet<AgentId>>,
    next_order: u64,
    /// Agents changed since the last save (cluster mode only).
    pub(crate) changed: crate::router::changes::Changes<AgentId>,
}

impl Registry {
    /// Looks an agent up.
    pub fn get(&self, id: &AgentId) -> Option<&AgentRecord> {
        self.agents.get(id)
    }

    /// Looks an agent up by an id that arrives as text (a message recipient's id, an event's
    /// `source`), without building an [`AgentId`]: on the hot paths of delivery only.
    pub fn get_by_text(&self, id: &str) -> Option<&AgentRecord> {
        self.agents.get(id)
    }

    /// Whether the agent named by `id` (text, as in [`Registry::get_by_text`]) is owned by
    /// `owner`.
    pub fn text_is_owned_by(&self, id: &str, owner: &ParticipantId) -> bool {
        self.by_owner.get(owner).is_some_and(|s| s.contains(id))
    }

    /// Mutable access, for the agents part. Changing `agent.owner_id` or `agent.parent`
    /// through this breaks the indexes: use [`Registry::set_owner`].
    pub(in crate::router::agents) fn get_mut(&mut self, id: &AgentId) -> Option<&mut AgentRecord> {
        self.changed.mark(id);
        self.agents.get_mut(id)
    }

    /// Whether the id is registered.
    pub fn contains(&self, id: &AgentId) -> bool {
        self.agents.contains_key(id)
    }

    /// Entries of the order and owner indexes (for stats: the order index holds one per
    /// agent, the owner index one per owned agent).
    pub fn index_len(&self) -> usize {
        self.order.len() + self.by_owner.values().map(BTreeSet::len).sum::<usize>()
    }

    /// Number of agents.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// Whether there are no agents.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// Inserts a new agent (the id must be free and the parent, if any, registered). Its
    /// `scopes` and `children` are not kept (the scopes part and the tree hold them).
    pub(in crate::router::agents) fn insert(&mut self, mut agent: Agent) {
        agent.scopes = Vec::new();
        agent.children = None;
        self.changed.mark(&agent.id);
        let order = self.next_order;
        self.next_order += 1;
        if let Some(parent) = agent.parent.as_ref().and_then(|p| self.agents.get_mut(p)) {
            parent.children.insert(agent.id.clone());
        }
        if let Some(owner) = &agent.owner_id {
            self.by_owner
                .entry(owner.clone())
                .or_default()
                .insert(agent.id.clone());
        }
        self.order.insert(order, agent.id.clone());
        self.agents.insert(
            agent.id.clone(),
            AgentRecord {
                agent,
                order,
                children: BTreeSet::new(),
                state_before_suspend: None,
                state_before_orphan: None,
                orphan_expires: None,
                expiry_reason: None,
                cause_hint: None,
            },
        );
    }

    /// Removes an agent. Its children keep their `parent` field (they become roots of their own
    /// subtrees in queries); callers remove children first when they mean to.
    pub(in crate::router::agents) fn remove(&mut self, id: &AgentId) -> Option<AgentRecord> {
        self.changed.mark(id);
        let rec = self.agents.remove(id)?;
        self.order.remove(&rec.order);
        if let Some(parent) = rec
            .agent
            .parent
            .as_ref()
            .and_then(|p| self.agents.get_mut(p))
        {
            parent.children.remove(id);
        }
        if let Some(owner) = &rec.agent.owner_id {
            self.unindex_owner(owner, id);
        }
        self.agents.shrink_if_sparse();
        Some(rec)
    }

    fn unindex_owner(&mut self, owner: &ParticipantId, id: &AgentId) {
        if let Some(set) = self.by_owner.get_mut(owner) {
            set.remove(id);
            if set.is_empty() {
                self.by_owner.remove(owner);
                self.by_owner.shrink_if_sparse();
            }
        }
    }

    /// Changes an agent's owner, keeping the owner index right.
    pub(in crate::router::agents) fn set_owner(
        &mut self,
        id: &AgentId,
        owner: Option<ParticipantId>,
    ) {
        self.changed.mark(id);
        let Some(old) = self.agents.get(id).map(|r| r.agent.owner_id.clone()) else {
            return;
        };
        if let Some(old) = &old {
            self.unindex_owner(old, id);
        }
        if let Some(new) = &owner {
            self.by_owner
                .entry(new.clone())
                .or_default()
                .insert(id.clone());
        }
        if let Some(rec) = self.agents.get_mut(id) {
            rec.agent.owner_id = owner;
        }
    }

    /// Its owner went away: the agent becomes an orphan (no owner, state `orphaned`, presence
    /// offline since `now` on the node it was on), to be unregistered at `expires` unless
    /// reclaimed. Returns the state it had, to return to on reclaim; `None` if unknown.
    pub fn orphan(
        &mut self,
        id: &AgentId,
        expires: Option<Instant>,
        now: u64,
    ) -> Option<AgentState> {
        let previous = self.agents.get(id)?.agent.state.clone();
        self.set_owner(id, None);
        let rec = self.get_mut(id)?;
        rec.state_before_orphan = Some(previous.clone());
        rec.orphan_expires = expires;
        rec.agent.state = AgentState::ORPHANED;
        rec.agent
            .lifecycle
            .get_or_insert_with(Default::default)
            .orphaned_at = Some(now);
        let was_on = rec.agent.presence.as_ref().and_then(|p| p.node.clone());
        rec.agent.presence = Some(Presence::offline(now).on(was_on.as_deref()));
        Some(previous)
    }

    /// An orphan is taken back by `owner` (online on `node`, `None`: here): it returns to the
    /// state it had before. `None` when the agent is unknown or not an orphan.
    pub fn reclaim(
        &mut self,
        id: &AgentId,
        owner: &ParticipantId,
        node: Option<&str>,
        now: u64,
    ) -> Option<Reclaimed> {
        let rec = self.agents.get(id)?;
        if !rec.is_orphan() {
            return None;
        }
        let restored = rec
            .state_before_orphan
            .clone()
            .unwrap_or(AgentState::REGISTERED);
        self.set_owner(id, Some(owner.clone()));
        let rec = self.get_mut(id)?;
        rec.state_before_orphan = None;
        rec.orphan_expires = None;
        rec.agent.state = restored.clone();
        if let Some(l) = rec.agent.lifecycle.as_mut() {
            l.orphaned_at = None;
        }
        rec.agent.presence = Some(Presence::online(now).on(node));
        Some(Reclaimed {
            restored,
            hint: rec.cause_hint.take(),
        })
    }

    /// An agent another node saved (`router::handover`), restored as it was; an orphan is
    /// unregistered at `orphan_expires` unless reclaimed. The id must be free.
    pub fn restore(
        &mut self,
        agent: Agent,
        state_before_suspend: Option<AgentState>,
        state_before_orphan: Option<AgentState>,
        orphan_expires: Option<Instant>,
    ) {
        let id = agent.id.clone();
        self.insert(agent);
        if let Some(rec) = self.get_mut(&id) {
            rec.state_before_suspend = state_before_suspend;
            rec.state_before_orphan = state_before_orphan;
            rec.orphan_expires = orphan_expires;
        }
    }

    /// An agent as the live node last saved it (`router::handover`), on a follower that
    /// answers reads from what it follows: replaced in place when known (its place in the
    /// order and its children kept), inserted otherwise.
    pub fn follow(
        &mut self,
        agent: Agent,
        state_before_suspend: Option<AgentState>,
        state_before_orphan: Option<AgentState>,
    ) {
        let id = agent.id.clone();
        let kept = self.remove(&id).map(|r| (r.order, r.children));
        self.insert(agent);
        let Some(rec) = self.agents.get_mut(&id) else {
            return;
        };
        rec.state_before_suspend = state_before_suspend;
        rec.state_before_orphan = state_before_orphan;
        if let Some((order, children)) = kept {
            self.order.remove(&rec.order);
            rec.order = order;
            rec.children = children;
            self.order.insert(order, id);
        }
    }

    /// An agent the live node dropped from its saved records, on a follower
    /// ([`Registry::follow`]).
    pub fn unfollow(&mut self, id: &AgentId) {
        self.remove(id);
    }

    /// Why an orphan whose deadline has passed at `now` is to be unregistered (`None`: it
    /// is no orphan, or not yet due).
    pub fn orphan_expired(&self, id: &AgentId, now: Instant) -> Option<&'static str> {
        let r = self.agents.get(id)?;
        (r.agent.owner_id.is_none() && r.orphan_expires.is_some_and(|at| at <= now))
            .then(|| r.expiry_reason.unwrap_or("owner_disconnected"))
    }

    /// Inserts an agent, for the unit tests of other parts.
    #[cfg(test)]
    pub(crate) fn insert_for_test(&mut self, agent: Agent) {
        self.insert(agent);
    }

    /// Agents owned by a participant, in id order.
    pub fn owned_by(&self, owner: &ParticipantId) -> Vec<AgentId> {
        self.by_owner
            .get(owner)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// How many agents `owner` owns (for the agents-per-session quota).
    pub fn owned_count(&self, owner: &ParticipantId) -> usize {
        self.by_owner.get(owner).map_or(0, BTreeSet::len)
    }

    /// Whether `owner` owns any agent.
    pub fn owns_any(&self, owner: &ParticipantId) -> bool {
        self.by_owner.contains_key(owner)
    }

    /// Whether `owner` owns `agent`.
    pub fn is_owned_by(&self, agent: &AgentId, owner: &ParticipantId) -> bool {
        self.by_owner.get(owner).is_some_and(|s| s.contains(agent))
    }

    /// All agents in registration order, starting after order `after` (exclusive).
    pub fn iter_ordered(&self, after: Option<u64>) -> impl Iterator<Item = &AgentRecord> {
        let start = after.map_or(0, |a| a.saturating_add(1));
        self.order
            .range(start..)
            .filter_map(|(_, id)| self.agents.get(id))
    }

    /// Children ids.
    pub fn children(&self, id: &AgentId) -> Vec<AgentId> {
        self.agents
            .get(id)
            .map(|r| r.children.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Ancestors, nearest first, up to `depth` levels (unlimited when `None`). Stops at a
    /// missing parent and on cycles.
    pub fn ancestors(&self, id: &AgentId, depth: Option<u32>) -> Vec<AgentId> {
        let mut out = Vec::new();
        let mut cur = self.agents.get(id).and_then(|r| r.agent.parent.clone());
        while let Some(p) = cur {
            if depth.is_some_and(|d| out.len() as u32 >= d) || out.contains(&p) || p == *id {
                break;
            }
            cur = self.agents.get(&p).and_then(|r| r.agent.parent.clone());
            if !self.agents.contains_key(&p) {
                break;
            }
            out.push(p);
        }
        out
    }

    /// Descendants in depth-first pre-order, down to `depth` levels (unlimited when `None`).
    pub fn descendants(&self, id: &AgentId, depth: Option<u32>) -> Vec<AgentId> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        self.walk_down(id, 1, depth, &mut out, &mut seen);
        out
    }

    fn walk_down(
        &self,
        id: &AgentId,
        level: u32,
        depth: Option<u32>,
        out: &mut Vec<AgentId>,
        seen: &mut BTreeSet<AgentId>,
    ) {
        if depth.is_some_and(|d| level > d) {
            return;
        }
        let Some(rec) = self.agents.get(id) else {
            return;
        };
        for child in &rec.children {
            if seen.insert(child.clone()) {
                out.push(child.clone());
                self.walk_down(child, level + 1, depth, out, seen);
            }
        }
    }

    /// Agents with the same parent, excluding `id`; empty when `id` has no parent.
    pub fn siblings(&self, id: &AgentId) -> Vec<AgentId> {
        let Some(parent) = self.agents.get(id).and_then(|r| r.agent.parent.clone()) else {
            return Vec::new();
        };
        self.children(&parent)
            .into_iter()
            .filter(|c| c != id)
            .collect()
    }

    /// The wire record with `children` filled in (its `scopes` are the scopes part's:
    /// `router::views::AgentView::snapshot` adds them).
    pub(crate) fn expanded(&self, id: &AgentId) -> Option<Agent> {
        let rec = self.agents.get(id)?;
        let mut agent = rec.agent.clone();
        if !rec.children.is_empty() {
            agent.children = Some(rec.children.iter().cloned().collect());
        }
        Some(agent)
    }
}

/// Per-section merge of permission overrides (`canSee`, `canMessage`, `acceptsFrom`).
pub(crate) fn merge_sections(
    current: &mut serde_json::Map<String, serde_json::Value>,
    changes: &serde_json::Map<String, serde_json::Value>,
) {
    for (section, value) in changes {
        match (current.get_mut(section), value) {
            (Some(serde_json::Value::Object(cur)), serde_json::Value::Object(new)) => {
                for (k, v) in new {
                    cur.insert(k.clone(), v.clone());
                }
            }
            _ => {
                current.insert(section.clone(), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str, parent: Option<&str>, owner: &str) -> Agent {
        let mut a = Agent::new(id.into(), Some(owner.into()));
        a.parent = parent.map(AgentId::from);
        a
    }

    fn tree() -> Registry {
        let mut r = Registry::default();
        r.insert(agent("root", None, "p1"));
        r.insert(agent("a", Some("root"), "p1"));
        r.insert(agent("b", Some("root"), "p2"));
        r.insert(agent("a1", Some("a"), "p1"));
        r.insert(agent("a1x", Some("a1"), "p1"));
        r
    }

    #[test]
    fn hierarchy_queries() {
        let r = tree();
        assert_eq!(
            r.children(&"root".into()),
            vec![AgentId::from("a"), "b".into()]
        );
        assert_eq!(
            r.ancestors(&"a1x".into(), None),
            vec![AgentId::from("a1"), "a".into(), "root".into()]
        );
        assert_eq!(
            r.ancestors(&"a1x".into(), Some(1)),
            vec![AgentId::from("a1")]
        );
        assert_eq!(
            r.descendants(&"root".into(), None),
            vec![AgentId::from("a"), "a1".into(), "a1x".into(), "b".into()]
        );
        assert_eq!(
            r.descendants(&"root".into(), Some(1)),
            vec![AgentId::from("a"), "b".into()]
        );
        assert_eq!(r.siblings(&"a".into()), vec![AgentId::from("b")]);
        assert!(r.siblings(&"root".into()).is_empty());
    }

    #[test]
    fn owner_index_follows_changes() {
        let mut r = tree();
        assert_eq!(r.owned_by(&"p2".into()), vec![AgentId::from("b")]);
        r.set_owner(&"b".into(), None);
        assert!(r.owned_by(&"p2".into()).is_empty());
        assert!(!r.owns_any(&"p2".into()));
        r.set_owner(&"b".into(), Some("p3".into()));
        assert!(r.is_owned_by(&"b".into(), &"p3".into()));
        r.remove(&"b".into());
        assert!(!r.owns_any(&"p3".into()));
        assert_eq!(r.children(&"root".into()), vec![AgentId::from("a")]);
    }

    #[test]
    fn ordered_iteration_resumes_after_a_cursor() {
        let r = tree();
        let first_two: Vec<_> = r.iter_ordered(None).take(2).map(|a| a.order).collect();
        let rest: Vec<_> = r
            .iter_ordered(Some(first_two[1]))
            .map(|a| a.agent.id.clone())
            .collect();
        assert_eq!(rest, vec![AgentId::from("b"), "a1".into(), "a1x".into()]);
    }
}
