//! The scope tree and its membership.
//!
//! Pure data with queries, like the registry: the scope handlers in `router::scopes::ops` emit
//! events and check permissions.
//!
//! Owns scope membership, stored once: scope → members, with its reverse index agent → scopes
//! kept beside it by the same two writes ([`Scopes::join`], [`Scopes::leave`]; a removed scope
//! or agent leaves every index). The registry keeps no scope list: an agent's `scopes` on the
//! wire is derived from [`Scopes::of_agent`] when a snapshot is built
//! (`router::views::AgentView::snapshot`).
//!
//! Invariants: `by_agent[a]` lists exactly the scopes whose `members` hold `a`, in the order
//! it joined them, each once; no entry is empty.

use std::collections::{BTreeMap, BTreeSet};

use crate::router::ids::{IdMap, Shrink};

use crate::protocol::ids::{AgentId, ParticipantId, ScopeId};
use crate::protocol::scope::Scope;

/// One scope plus router-side state. Read through its accessors; only this table writes it.
#[derive(Debug, Clone)]
pub struct ScopeRecord {
    /// The wire record.
    scope: Scope,
    /// Creation order (listing order).
    order: u64,
    /// Member agents.
    members: BTreeSet<AgentId>,
    /// Child scopes.
    children: BTreeSet<ScopeId>,
    /// The participant that created it (may invite under `joinPolicy: invite`).
    creator: Option<ParticipantId>,
}

impl ScopeRecord {
    /// The wire record.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Its id.
    pub fn id(&self) -> &ScopeId {
        &self.scope.id
    }

    /// Creation order (listing order).
    pub fn order(&self) -> u64 {
        self.order
    }

    /// Member agents, in id order.
    pub fn members(&self) -> &BTreeSet<AgentId> {
        &self.members
    }

    /// Child scopes.
    pub fn children(&self) -> &BTreeSet<ScopeId> {
        &self.children
    }

    /// The participant that created it.
    pub fn creator(&self) -> Option<&ParticipantId> {
        self.creator.as_ref()
    }

    /// A record with no members, for the unit tests of other parts.
    #[cfg(test)]
    pub(crate) fn for_test(scope: Scope, creator: Option<ParticipantId>) -> Self {
        Self {
            scope,
            order: 0,
            members: BTreeSet::new(),
            children: BTreeSet::new(),
            creator,
        }
    }
}

/// All scopes.
#[derive(Debug, Default)]
pub struct Scopes {
    scopes: IdMap<ScopeId, ScopeRecord>,
    order: BTreeMap<u64, ScopeId>,
    /// The reverse of every `members`: the scopes of each member agent, in joining order.
    by_agent: IdMap<AgentId, Vec<ScopeId>>,
    next_order: u64,
    /// Scopes changed since the last save (cluster mode only).
    pub(crate) changed: crate::router::changes::Changes<ScopeId>,
    /// Agents whose membership changed since the last save (cluster mode only): their saved
    /// records carry their scopes.
    pub(crate) members_changed: crate::router::changes::Changes<AgentId>,
}

impl Scopes {
    /// Looks a scope up.
    pub fn get(&self, id: &ScopeId) -> Option<&ScopeRecord> {
        self.scopes.get(id)
    }

    /// Adds `agent` to `scope`'s members. False when the scope is unknown or the agent was
    /// already a member.
    pub fn join(&mut self, scope: &ScopeId, agent: &AgentId) -> bool {
        let Some(rec) = self.scopes.get_mut(scope) else {
            return false;
        };
        if !rec.members.insert(agent.clone()) {
            return false;
        }
        self.members_changed.mark(agent);
        self.by_agent
            .entry(agent.clone())
            .or_default()
            .push(scope.clone());
        true
    }

    /// Removes `agent` from `scope`'s members. False when it was not a member.
    pub fn leave(&mut self, scope: &ScopeId, agent: &AgentId) -> bool {
        let Some(rec) = self.scopes.get_mut(scope) else {
            return false;
        };
        if !rec.members.remove(agent) {
            return false;
        }
        self.members_changed.mark(agent);
        self.unindex_member(scope, agent);
        true
    }

    fn unindex_member(&mut self, scope: &ScopeId, agent: &AgentId) {
        if let Some(list) = self.by_agent.get_mut(agent) {
            list.retain(|s| s != scope);
            if list.is_empty() {
                self.by_agent.remove(agent);
                self.by_agent.shrink_if_sparse();
            }
        }
    }

    /// The scopes `agent` is a member of, in the order it joined them.
    pub fn of_agent(&self, agent: &AgentId) -> &[ScopeId] {
        self.by_agent.get(agent).map_or(&[], Vec::as_slice)
    }

    /// Whether the id exists.
    pub fn contains(&self, id: &ScopeId) -> bool {
        self.scopes.contains_key(id)
    }

    /// Memberships, over every scope (for stats).
    pub fn memberships(&self) -> usize {
        self.scopes.values().map(|s| s.members.len()).sum()
    }

    /// Entries of the reverse membership index (for stats: equals [`Scopes::memberships`]
    /// unless it leaks).
    pub fn member_index_len(&self) -> usize {
        self.by_agent.values().map(Vec::len).sum()
    }

    /// A scope another node saved (`router::handover`), restored with no members (they join
    /// as their agents are restored). Its parent, if any, is restored first.
    pub fn restore(&mut self, scope: Scope, creator: Option<ParticipantId>) {
        if !self.contains(&scope.id) {
            self.insert(scope, creator);
        }
    }

    /// A scope as the live node last saved it (`router::handover`), on a follower that
    /// answers reads from what it follows: updated in place when known (its members, children
    /// and place in the order kept; a scope's parent never changes), inserted otherwise.
    pub fn follow(&mut self, scope: Scope, creator: Option<ParticipantId>) {
        match self.scopes.get_mut(&scope.id) {
            Some(rec) => {
                rec.scope = scope;
                rec.creator = creator;
            }
            None => self.insert(scope, creator),
        }
    }

    /// A scope the live node dropped from its saved records, on a follower
    /// ([`Scopes::follow`]); its members leave it.
    pub fn unfollow(&mut self, id: &ScopeId) {
        self.remove(id);
    }

    /// Inserts a scope whose id is free and whose parent, if any, exists.
    pub(in crate::router::scopes) fn insert(
        &mut self,
        scope: Scope,
        creator: Option<ParticipantId>,
    ) {
        self.changed.mark(&scope.id);
        let order = self.next_order;
        self.next_order += 1;
        if let Some(parent) = scope.parent.as_ref().and_then(|p| self.scopes.get_mut(p)) {
            parent.children.insert(scope.id.clone());
        }
        self.order.insert(order, scope.id.clone());
        self.scopes.insert(
            scope.id.clone(),
            ScopeRecord {
                scope,
                order,
                members: BTreeSet::new(),
                children: BTreeSet::new(),
                creator,
            },
        );
    }

    /// Removes one scope (not its children); its members leave it.
    pub(in crate::router::scopes) fn remove(&mut self, id: &ScopeId) -> Option<ScopeRecord> {
        self.changed.mark(id);
        let rec = self.scopes.remove(id)?;
        for m in &rec.members {
            self.members_changed.mark(m);
            self.unindex_member(id, m);
        }
        self.order.remove(&rec.order);
        if let Some(parent) = rec
            .scope
            .parent
            .as_ref()
            .and_then(|p| self.scopes.get_mut(p))
        {
            parent.children.remove(id);
        }
        self.scopes.shrink_if_sparse();
        Some(rec)
    }

    /// All scopes in creation order.
    pub fn iter_ordered(&self) -> impl Iterator<Item = &ScopeRecord> {
        self.order.values().filter_map(|id| self.scopes.get(id))
    }

    /// The scope followed by its ancestors (nearest first); empty when unknown.
    pub fn with_ancestors(&self, id: &ScopeId) -> Vec<ScopeId> {
        let mut out = Vec::new();
        let mut cur = self.scopes.get(id).map(|r| r.scope.id.clone());
        while let Some(s) = cur {
            if out.contains(&s) {
                break;
            }
            cur = self.scopes.get(&s).and_then(|r| r.scope.parent.clone());
            out.push(s);
        }
        out
    }

    /// All descendants of a scope, deepest first (the order to delete them in).
    pub fn descendants_deepest_first(&self, id: &ScopeId) -> Vec<ScopeId> {
        let mut out = Vec::new();
        self.collect_down(id, &mut out);
        out.reverse();
        out
    }

    fn collect_down(&self, id: &ScopeId, out: &mut Vec<ScopeId>) {
        if let Some(rec) = self.scopes.get(id) {
            for child in &rec.children {
                if !out.contains(child) {
                    out.push(child.clone());
                    self.collect_down(child, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(id: &str, parent: Option<&str>) -> Scope {
        Scope {
            id: id.into(),
            name: None,
            description: None,
            parent: parent.map(ScopeId::from),
            join_policy: None,
            auto_join_roles: None,
            visibility: None,
            message_visibility: None,
            send_policy: None,
            persistent: None,
            auto_delete: None,
            metadata: None,
        }
    }

    #[test]
    fn tree_queries() {
        let mut s = Scopes::default();
        s.insert(scope("org", None), None);
        s.insert(scope("team", Some("org")), None);
        s.insert(scope("squad", Some("team")), None);
        assert_eq!(
            s.with_ancestors(&"squad".into()),
            vec![ScopeId::from("squad"), "team".into(), "org".into()]
        );
        assert_eq!(
            s.descendants_deepest_first(&"org".into()),
            vec![ScopeId::from("squad"), "team".into()]
        );
        s.remove(&"squad".into());
        assert!(s.get(&"team".into()).unwrap().children.is_empty());
        assert_eq!(s.iter_ordered().count(), 2);
    }

    #[test]
    fn membership_is_indexed_both_ways_in_joining_order() {
        let mut s = Scopes::default();
        s.insert(scope("org", None), None);
        s.insert(scope("team", Some("org")), None);
        let a = AgentId::from("a");
        assert!(s.join(&"team".into(), &a));
        assert!(s.join(&"org".into(), &a));
        assert!(!s.join(&"org".into(), &a), "joined once");
        assert!(!s.join(&"nope".into(), &a), "unknown scope");
        assert_eq!(s.of_agent(&a), &[ScopeId::from("team"), "org".into()]);
        assert_eq!(s.memberships(), s.member_index_len());
        assert!(s.leave(&"team".into(), &a));
        assert!(!s.leave(&"team".into(), &a));
        assert_eq!(s.of_agent(&a), &[ScopeId::from("org")]);
        s.remove(&"org".into());
        assert!(s.of_agent(&a).is_empty());
        assert_eq!(s.member_index_len(), 0);
    }
}
