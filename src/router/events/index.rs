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
mod tests {
    use std::sync::Arc;

    use crate::protocol::capabilities::ParticipantType;
    use crate::protocol::event::{EventType, SubscriptionFilter};
    use crate::router::agents::registry::Registry;
    use crate::router::events::bus::{EventBus, SubState, Subscription};
    use crate::router::events::filter::CompiledFilter;
    use crate::router::events::log::{Audience, EventDraft, EventLog, FilterKeys, Retention};
    use crate::router::ids::ConnId;
    use crate::router::outbox::{outbox, Outbound, OutboxReceiver};
    use crate::router::scopes::table::Scopes;
    use crate::router::views::AgentView;

    /// A small deterministic generator (xorshift), so a failure repeats.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    const FILTERS: [Option<&str>; 7] = [
        None,
        Some(r#"{"scopes":["s1"]}"#),
        Some(r#"{"scopes":["s1","s2"],"eventTypes":["message.*"]}"#),
        Some(r#"{"fromAgents":["a2"]}"#),
        Some(r#"{"eventTypes":["agent.*"]}"#),
        Some(r#"{"eventTypes":["message_sent"],"priorities":["high"]}"#),
        Some(r#"{"fromAgents":["a1"],"scopes":["s3"]}"#),
    ];

    fn sub(i: usize, filter: Option<&str>, capacity: usize) -> (Subscription, OutboxReceiver) {
        let f = filter.map(|j| serde_json::from_str::<SubscriptionFilter>(j).unwrap());
        let (tx, rx) = outbox(capacity);
        let sub = Subscription {
            id: format!("sub-{i}").into(),
            session: format!("s-{i}").into(),
            conn: ConnId(i as u64),
            participant: format!("p-{i}").into(),
            participant_type: ParticipantType::Client,
            agent: None,
            principal: None,
            policy: Default::default(),
            filter: CompiledFilter::compile(f.as_ref()).unwrap(),
            exclude_own: false,
            cursor: 0,
            start: 0,
            sequence: 0,
            acked: 0,
            window: None,
            overflow: Default::default(),
            disk_pending: false,
            overflows: 0,
            state: SubState::Pending,
            outbox: tx,
        };
        (sub, rx)
    }

    fn draft(rng: &mut Rng) -> EventDraft {
        let kind = [
            EventType::MessageSent,
            EventType::MessageDelivered,
            EventType::AgentRegistered,
        ][rng.below(3) as usize];
        let scopes = match rng.below(4) {
            0 => vec![],
            1 => vec!["s1".into()],
            2 => vec!["s2".into(), "s1".into()],
            _ => vec!["s3".into()],
        };
        EventDraft {
            kind,
            source: Some(["a1", "a2", "a3"][rng.below(3) as usize].into()),
            data: "{}".into(),
            caused_by: vec![],
            keys: FilterKeys {
                scopes,
                priority: (rng.below(2) == 0).then(|| "high".into()),
                ..FilterKeys::default()
            },
            audience: Audience::Everyone,
        }
    }

    fn seqs(rx: &mut OutboxReceiver, into: &mut Vec<u64>) {
        while let Some(item) = rx.try_recv() {
            if let Outbound::Event(d) = item {
                into.push(d.record.seq);
            }
        }
    }

    /// Every subscription gets exactly the events its filter admits, in log order, once each:
    /// however long it went without a candidate event, whether its outbox filled (and it
    /// caught up from the log later), and under read-committed delivery in batches.
    #[test]
    fn every_subscription_gets_exactly_what_its_filter_admits() {
        for (seed, committed) in [(1u64, false), (2, false), (3, true), (4, true)] {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seed);
            let mut bus = EventBus::new(EventLog::new(Retention {
                max_events: 100_000,
                max_bytes: 1 << 28,
            }));
            if committed {
                bus.deliver_committed_only(0);
            }
            let (registry, scopes) = (Registry::default(), Scopes::default());
            let reg = AgentView::new(&registry, &scopes);
            let mut rxs = Vec::new();
            let mut filters = Vec::new();
            for i in 0..21 {
                // Some outboxes are tiny, so those subscriptions pause and catch up.
                let (s, rx) = sub(i, FILTERS[i % FILTERS.len()], [2, 8, 4096][i % 3]);
                filters.push(s.filter.clone());
                let id = s.id.clone();
                bus.insert(s);
                bus.activate(&id, reg);
                rxs.push(rx);
            }
            let mut got = vec![Vec::new(); rxs.len()];
            let mut records = Vec::new();
            for n in 0..2_000u64 {
                let rec = bus.log.append(draft(&mut rng), None);
                bus.publish(&rec, reg);
                records.push(Arc::clone(&rec));
                if committed && rng.below(5) == 0 {
                    bus.committed(n + 1, reg);
                }
                // Readers drain at random moments; a drained connection is caught up.
                for (i, rx) in rxs.iter_mut().enumerate() {
                    if rng.below(7) == 0 {
                        seqs(rx, &mut got[i]);
                        bus.resume_conn(ConnId(i as u64), reg);
                    }
                }
            }
            if committed {
                bus.committed(2_000, reg);
            }
            for _ in 0..2_000 {
                for (i, rx) in rxs.iter_mut().enumerate() {
                    seqs(rx, &mut got[i]);
                    bus.resume_conn(ConnId(i as u64), reg);
                }
            }
            for (i, f) in filters.iter().enumerate() {
                let want: Vec<u64> = records
                    .iter()
                    .filter(|r| f.matches(r, |_| None))
                    .map(|r| r.seq)
                    .collect();
                assert!(!want.is_empty(), "subscription {i} matches something");
                assert_eq!(
                    got[i],
                    want,
                    "seed {seed}: subscription {i} ({:?})",
                    FILTERS[i % FILTERS.len()]
                );
            }
        }
    }

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
