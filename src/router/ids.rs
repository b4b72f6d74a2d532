//! Ids that exist only inside the router: [`ConnId`], one per transport attachment; and the
//! maps the router's tables keep by id ([`IdMap`], [`IdSet`]), and how they give memory back
//! ([`Shrink`]).

use std::fmt;

/// The hasher of the router's tables keyed by ids (agents, participants, sessions, messages,
/// connections, subscriptions, scopes): foldhash's quality hasher, seeded at random per process
/// and per map. SipHash (the standard library's) was about 12 % of the core benchmark
/// (docs/performance.md); ids are chosen by peers, so the hasher stays seeded, not fixed.
pub type IdHasher = foldhash::quality::RandomState;
/// A hash map keyed by ids, with [`IdHasher`].
pub type IdMap<K, V> = std::collections::HashMap<K, V, IdHasher>;
/// A hash set of ids, with [`IdHasher`].
pub type IdSet<K> = std::collections::HashSet<K, IdHasher>;

/// Giving back the room of a table that has emptied. A `HashMap` never shrinks by itself: after a
/// churn of 40 000 sessions the router's tables kept the capacity of their peak for good (about
/// 12 MB of a 40 MB excess in the churn soak, docs/performance.md "Memory soaks"). Called after a
/// removal: when fewer than an eighth of the slots are in use it halves the table to twice its
/// length, so a rehash of `len` entries follows at least `len` removals (amortized O(1)); small
/// tables are left alone.
pub trait Shrink {
    /// Shrinks the table if it is mostly empty (see the trait).
    fn shrink_if_sparse(&mut self);
}

/// Tables at or below this capacity are never shrunk (not worth a rehash).
const SHRINK_FLOOR: usize = 256;

fn sparse(len: usize, capacity: usize) -> bool {
    capacity > SHRINK_FLOOR && len.saturating_mul(8) < capacity
}

impl<K: Eq + std::hash::Hash, V, S: std::hash::BuildHasher> Shrink
    for std::collections::HashMap<K, V, S>
{
    fn shrink_if_sparse(&mut self) {
        if sparse(self.len(), self.capacity()) {
            self.shrink_to(self.len() * 2);
        }
    }
}

impl<K: Eq + std::hash::Hash, S: std::hash::BuildHasher> Shrink
    for std::collections::HashSet<K, S>
{
    fn shrink_if_sparse(&mut self) {
        if sparse(self.len(), self.capacity()) {
            self.shrink_to(self.len() * 2);
        }
    }
}

impl<T> Shrink for std::collections::VecDeque<T> {
    fn shrink_if_sparse(&mut self) {
        if sparse(self.len(), self.capacity()) {
            self.shrink_to(self.len() * 2);
        }
    }
}

/// Identifies one transport connection inside the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conn-{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_gives_back_room_once_mostly_empty_and_not_before() {
        let mut m: IdMap<u64, u64> = IdMap::default();
        for i in 0..40_000 {
            m.insert(i, i);
        }
        let peak = m.capacity();
        // Three quarters removed: an eighth of the slots or more still in use, no rehash (the
        // capacity only loses the slots that removals left as tombstones).
        for i in 0..30_000 {
            m.remove(&i);
            m.shrink_if_sparse();
        }
        assert!(m.capacity() > peak / 2, "{} of {peak}", m.capacity());
        for i in 30_000..39_990 {
            m.remove(&i);
            m.shrink_if_sparse();
        }
        assert!(
            m.capacity() <= SHRINK_FLOOR,
            "capacity {} after emptying",
            m.capacity()
        );
        assert_eq!(m.len(), 10);
        assert!((39_990..40_000).all(|i| m.get(&i) == Some(&i)));
    }
}
