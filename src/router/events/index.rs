//! The subscriptions an event can match: an index of the live subscriptions by the one filter
//! field that narrows each the most, so that offering an event examines only the subscriptions
//! that could admit it, not every subscription of the router.
//!
//! Owns the buckets, nothing else: the subscriptions themselves (their state, cursor, outbox)
//! stay in the bus. Each subscription sits under one key, chosen at subscribe time from its
//! compiled filter ([`CompiledFilter::index_key`]):
//! - `scopes`: under each scope it names (an event is a candidate for the subscriptions under
//!   any of its scopes);
//! - else `fromAgents`: under each agent (the event's source);
//! - else event types: under each standard type its mask lets through;
//! - else (no narrowing field): in `any`, a candidate for every event.
//!
//! Every key is a necessary condition of the filter (`CompiledFilter::matches` fails without
//! it), so the candidates are a superset of the subscriptions the filter admits; the bus then
//! applies the whole filter and the permissions as before. A subscription with several scopes
//! may be a candidate twice for one event; the bus's cursor check makes the second a no-op.

use crate::protocol::event::EventType;
use crate::protocol::ids::SubscriptionId;
use crate::router::events::filter::{CompiledFilter, IndexKey};
use crate::router::events::log::EventRecord;
use crate::router::ids::IdHasher;

type HashMap<K, V> = std::collections::HashMap<K, V, IdHasher>;

/// Subscriptions by the key that narrows them.
#[derive(Debug, Default)]
pub struct SubIndex {
    by_scope: HashMap<String, Vec<SubscriptionId>>,
    by_agent: HashMap<String, Vec<SubscriptionId>>,
    /// Indexed by the position of the type in `EventType::ALL`.
    by_type: Vec<Vec<SubscriptionId>>,
    any: Vec<SubscriptionId>,
}

fn remove_from(list: &mut Vec<SubscriptionId>, id: &SubscriptionId) {
    if let Some(at) = list.iter().position(|x| x == id) {
        list.swap_remove(at);
    }
}

fn remove_keyed(map: &mut HashMap<String, Vec<SubscriptionId>>, key: &str, id: &SubscriptionId) {
    if let Some(list) = map.get_mut(key) {
        remove_from(list, id);
        if list.is_empty() {
            map.remove(key);
        }
    }
}

impl SubIndex {
    /// Files a subscription under its filter's key.
    pub fn insert(&mut self, id: &SubscriptionId, filter: &CompiledFilter) {
        match filter.index_key() {
            IndexKey::Scopes(scopes) => {
                for s in scopes {
                    self.by_scope.entry(s.clone()).or_default().push(id.clone());
                }
            }
            IndexKey::Agents(agents) => {
                for a in agents {
                    self.by_agent.entry(a.clone()).or_default().push(id.clone());
                }
            }
            IndexKey::Types(mask) => {
                if self.by_type.is_empty() {
                    self.by_type = vec![Vec::new(); EventType::ALL.len()];
                }
                for (i, list) in self.by_type.iter_mut().enumerate() {
                    if mask & (1u64 << i) != 0 {
                        list.push(id.clone());
                    }
                }
            }
            IndexKey::Any => self.any.push(id.clone()),
        }
    }

    /// Takes a subscription out (its filter gives the buckets it is in).
    pub fn remove(&mut self, id: &SubscriptionId, filter: &CompiledFilter) {
        match filter.index_key() {
            IndexKey::Scopes(scopes) => {
                for s in scopes {
                    remove_keyed(&mut self.by_scope, s, id);
                }
            }
            IndexKey::Agents(agents) => {
                for a in agents {
                    remove_keyed(&mut self.by_agent, a, id);
                }
            }
            IndexKey::Types(mask) => {
                for (i, list) in self.by_type.iter_mut().enumerate() {
                    if mask & (1u64 << i) != 0 {
                        remove_from(list, id);
                    }
                }
            }
            IndexKey::Any => remove_from(&mut self.any, id),
        }
    }

    /// Calls `f` with every subscription that could admit `rec` (some more than once, see the
    /// module docs).
    pub fn candidates(&self, rec: &EventRecord, mut f: impl FnMut(&SubscriptionId)) {
        self.any.iter().for_each(&mut f);
        if let Some(list) = self.by_type.get(rec.kind.index()) {
            list.iter().for_each(&mut f);
        }
        if let Some(list) = rec.source.as_deref().and_then(|s| self.by_agent.get(s)) {
            list.iter().for_each(&mut f);
        }
        for scope in &rec.keys.scopes {
            if let Some(list) = self.by_scope.get(scope.as_str()) {
                list.iter().for_each(&mut f);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::protocol::event::SubscriptionFilter;
    use crate::router::events::filter::CompiledFilter;

    /// One filter of each kind the index files (and combinations).
    pub(crate) const FILTERS: [Option<&str>; 7] = [
        None,
        Some(r#"{"scopes":["s1"]}"#),
        Some(r#"{"scopes":["s1","s2"],"eventTypes":["message.*"]}"#),
        Some(r#"{"fromAgents":["a2"]}"#),
        Some(r#"{"eventTypes":["agent.*"]}"#),
        Some(r#"{"eventTypes":["message_sent"],"priorities":["high"]}"#),
        Some(r#"{"fromAgents":["a1"],"scopes":["s3"]}"#),
    ];

    /// Removed subscriptions leave the index: an event for their key examines nothing.
    #[test]
    fn removed_subscriptions_leave_no_entry() {
        let mut index = super::SubIndex::default();
        let mut filters = Vec::new();
        for (i, f) in FILTERS.iter().enumerate() {
            let f = f.map(|j| serde_json::from_str::<SubscriptionFilter>(j).unwrap());
            let c = CompiledFilter::compile(f.as_ref()).unwrap();
            index.insert(&format!("sub-{i}").into(), &c);
            filters.push(c);
        }
        for (i, c) in filters.iter().enumerate() {
            index.remove(&format!("sub-{i}").into(), c);
        }
        assert!(index.by_scope.is_empty() && index.by_agent.is_empty() && index.any.is_empty());
        assert!(index.by_type.iter().all(Vec::is_empty));
    }
}
