//! The scope tree and its membership.
//!
//! Pure data with queries, like the registry: the scope handlers in `router::scopes::ops` emit
//! events and check permissions. Membership is kept on both sides (scope → members here,
//! agent → `Agent.scopes` in the registry); the handlers keep the two in step.

use std::collections::{BTreeMap, BTreeSet};

use crate::router::ids::{IdMap, Shrink};

use crate::protocol::ids::{AgentId, ParticipantId, ScopeId};
use crate::protocol::scope::Scope;

/// One scope plus router-side state.
#[derive(Debug, Clone)]
pub struct ScopeRecord {
    /// The wire record.
    pub scope: Scope,
    /// Creation order (listing order).
    pub order: u64,
    /// Member agents.
    pub members: BTreeSet<AgentId>,
    /// Child scopes.
    pub children: BTreeSet<ScopeId>,
    /// The participant that created it (may invite under `joinPolicy: invite`).
    pub creator: Option<ParticipantId>,
}

/// All scopes.
#[derive(Debug, Default)]
pub struct Scopes {
    scopes: IdMap<ScopeId, ScopeRecord>,
    order: BTreeMap<u64, ScopeId>,
    next_order: u64,
    /// Scopes changed since the last save (cluster mode only).
    pub(crate) changed: crate::router::changes::Changes<ScopeId>,
}

impl Scopes {
    /// Looks a scope up.
    pub fn get(&self, id: &ScopeId) -> Option<&ScopeRecord> {
        self.scopes.get(id)
    }

    /// Mutable access (do not change `scope.parent` through it).
    pub fn get_mut(&mut self, id: &ScopeId) -> Option<&mut ScopeRecord> {
        self.changed.mark(id);
        self.scopes.get_mut(id)
    }

    /// Whether the id exists.
    pub fn contains(&self, id: &ScopeId) -> bool {
        self.scopes.contains_key(id)
    }

    /// Memberships, over every scope (for stats).
    pub fn memberships(&self) -> usize {
        self.scopes.values().map(|s| s.members.len()).sum()
    }

    /// Inserts a scope whose id is free and whose parent, if any, exists.
    pub fn insert(&mut self, scope: Scope, creator: Option<ParticipantId>) {
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

    /// Removes one scope (not its children).
    pub fn remove(&mut self, id: &ScopeId) -> Option<ScopeRecord> {
        self.changed.mark(id);
        let rec = self.scopes.remove(id)?;
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
}
