//! Ids that exist only inside the router: [`ConnId`], one per transport attachment; and the
//! maps the router's tables keep by id ([`IdMap`], [`IdSet`]).

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

/// Identifies one transport connection inside the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conn-{}", self.0)
    }
}
