//! [`Identities`]: the owner of every participant id and agent id taken by an authenticated
//! principal, with a bound per principal.
//!
//! Invariants:
//! - an id has at most one owner, the subject (`id`, `issuer`) of the principal that first took
//!   it; only a release ([`Identities::release`]) or an eviction frees it;
//! - each principal owns at most `cap` ids: past that, its least recently taken id that is not
//!   in use is evicted (so one principal's churn never grows the table for everyone, and costs
//!   only that principal's oldest unused claims);
//! - `by_owner` lists exactly the ids of `claims`, each once, by the tick of its last use.

use std::collections::{BTreeMap, HashMap};

use crate::protocol::methods::session::Principal;

/// Which kind of id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IdKind {
    /// A participant id (`map/connect`'s `participantId`).
    Participant,
    /// An agent id (`map/agents/register`'s `agentId`, and every agent id created).
    Agent,
}

impl IdKind {
    /// The prefix of the durable claim's key (`participant:<id>`, `agent:<id>`).
    pub fn prefix(self) -> &'static str {
        match self {
            Self::Participant => "participant",
            Self::Agent => "agent",
        }
    }

    /// The kind a durable claim's key prefix names.
    pub fn from_prefix(s: &str) -> Option<Self> {
        match s {
            "participant" => Some(Self::Participant),
            "agent" => Some(Self::Agent),
            _ => None,
        }
    }
}

/// The key of a durable claim: `participant:<id>` or `agent:<id>`.
pub fn key_of(kind: IdKind, id: &str) -> String {
    format!("{}:{id}", kind.prefix())
}

/// The subject of a principal: who owns an id.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Owner {
    /// The principal's id.
    pub id: String,
    /// Its issuer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
}

impl Owner {
    /// The owner `p` stands for.
    pub fn of(p: &Principal) -> Self {
        Self {
            id: p.id.clone(),
            issuer: p.issuer.clone(),
        }
    }

    /// Whether `p` is this owner.
    pub fn is(&self, p: &Principal) -> bool {
        self.id == p.id && self.issuer == p.issuer
    }
}

/// An owned id.
type Key = (IdKind, Box<str>);

#[derive(Debug)]
struct Claim {
    owner: Owner,
    tick: u64,
    /// Where (log seq) and when (unix ms) this claim was last logged: the stream's limits
    /// delete it from there, so the live node logs it again before (`Identities::due`).
    logged: (u64, u64),
}

/// The claims.
#[derive(Debug)]
pub struct Identities {
    claims: HashMap<Key, Claim>,
    by_owner: HashMap<Owner, BTreeMap<u64, Key>>,
    tick: u64,
    cap: usize,
}

/// Default bound on the ids one principal owns.
pub const DEFAULT_IDS_PER_PRINCIPAL: usize = 10_000;

impl Default for Identities {
    fn default() -> Self {
        Self::new(DEFAULT_IDS_PER_PRINCIPAL)
    }
}

impl Identities {
    /// An empty table; each principal owns at most `cap` ids (at least 1).
    pub fn new(cap: usize) -> Self {
        Self {
            claims: HashMap::new(),
            by_owner: HashMap::new(),
            tick: 0,
            cap: cap.max(1),
        }
    }

    /// The table of what the store kept: the newest claim of each id still owned (oldest
    /// first, so recency is kept). A row that cannot be read is skipped with a warning.
    pub fn recover(rows: &[crate::store::record::StoredRow], cap: usize) -> Self {
        let mut t = Self::new(cap);
        for row in rows {
            t.apply_stored(row);
        }
        t
    }

    /// Applies one logged `identity.claimed` or `identity.released` row as the node that
    /// wrote it decided (a follower folds the writer's claims as it follows them; recovery
    /// folds the kept ones): a claim takes the id from whoever held it here. Other rows are
    /// ignored; an unreadable one is skipped with a warning.
    pub fn apply_stored(&mut self, row: &crate::store::record::StoredRow) {
        #[derive(serde::Deserialize)]
        struct Claim {
            id: String,
            owner: Option<Owner>,
        }
        #[derive(serde::Deserialize)]
        struct Data {
            claim: Claim,
        }
        #[derive(serde::Deserialize)]
        struct Event {
            data: Data,
        }
        let claimed = match row.kind.as_str() {
            "identity.claimed" => true,
            "identity.released" => false,
            _ => return,
        };
        let parsed = serde_json::from_str::<Event>(&row.json).ok().and_then(|e| {
            let (kind, id) = e.data.claim.id.split_once(':')?;
            Some((
                IdKind::from_prefix(kind)?,
                id.to_owned(),
                e.data.claim.owner,
            ))
        });
        match parsed {
            Some((kind, id, Some(owner))) if claimed => {
                if self.owner(kind, &id).is_some_and(|o| o != &owner) {
                    self.release(kind, &id);
                }
                self.claim(kind, &id, &owner, |_, _| true);
                self.logged(kind, &id, row.seq, row.timestamp);
            }
            Some((kind, id, _)) if !claimed => {
                self.release(kind, &id);
            }
            _ => tracing::warn!(event = %row.id, "skipping an unreadable stored claim"),
        }
    }

    /// Number of owned ids.
    pub fn len(&self) -> usize {
        self.claims.len()
    }

    /// Whether no id is owned.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    /// The owner of `id`, if any.
    pub fn owner(&self, kind: IdKind, id: &str) -> Option<&Owner> {
        self.claims.get(&(kind, Box::from(id))).map(|c| &c.owner)
    }

    /// Records that `owner` took `id` now. Returns whether this is a new claim (`false`: the
    /// owner already had it, and it is now its most recently used), and the ids evicted to
    /// keep the owner within the cap: its least recently used ones for which `in_use` is false.
    ///
    /// The caller has checked that `id` has no other owner; one it has is left alone (`false`).
    pub fn claim(
        &mut self,
        kind: IdKind,
        id: &str,
        owner: &Owner,
        in_use: impl Fn(IdKind, &str) -> bool,
    ) -> (bool, Vec<(IdKind, String)>) {
        self.tick += 1;
        let tick = self.tick;
        let key: Key = (kind, Box::from(id));
        let new = match self.claims.get_mut(&key) {
            Some(c) if &c.owner == owner => {
                let old = std::mem::replace(&mut c.tick, tick);
                if let Some(list) = self.by_owner.get_mut(owner) {
                    list.remove(&old);
                    list.insert(tick, key);
                }
                false
            }
            Some(_) => return (false, Vec::new()),
            None => {
                self.claims.insert(
                    key.clone(),
                    Claim {
                        owner: owner.clone(),
                        tick,
                        logged: (0, 0),
                    },
                );
                self.by_owner
                    .entry(owner.clone())
                    .or_default()
                    .insert(tick, key);
                true
            }
        };
        let mut evicted = Vec::new();
        if new {
            let list = self.by_owner.get(owner).map_or(0, BTreeMap::len);
            if list > self.cap {
                let victims: Vec<(u64, Key)> = self.by_owner[owner]
                    .iter()
                    .filter(|(t, (k, i))| **t != tick && !in_use(*k, i))
                    .take(list - self.cap)
                    .map(|(t, k)| (*t, k.clone()))
                    .collect();
                for (t, (k, i)) in victims {
                    if let Some(l) = self.by_owner.get_mut(owner) {
                        l.remove(&t);
                    }
                    self.claims.remove(&(k, i.clone()));
                    evicted.push((k, i.into_string()));
                }
            }
        }
        (new, evicted)
    }

    /// Records that the claim of `id` was logged at `seq`, at unix ms `at`.
    pub fn logged(&mut self, kind: IdKind, id: &str, seq: u64, at: u64) {
        if let Some(c) = self.claims.get_mut(&(kind, Box::from(id))) {
            c.logged = (seq, at);
        }
    }

    /// The claims last logged before `seq`, or before unix ms `at` when given (due to be
    /// logged again before the stream's limits delete them), with their owners.
    pub fn due(&self, seq: u64, at: Option<u64>) -> Vec<(IdKind, String, Owner)> {
        self.claims
            .iter()
            .filter(|(_, c)| c.logged.0 < seq || at.is_some_and(|at| c.logged.1 < at))
            .map(|((k, i), c)| (*k, i.to_string(), c.owner.clone()))
            .collect()
    }

    /// Frees `id`; returns its owner if it had one.
    pub fn release(&mut self, kind: IdKind, id: &str) -> Option<Owner> {
        let claim = self.claims.remove(&(kind, Box::from(id)))?;
        if let Some(list) = self.by_owner.get_mut(&claim.owner) {
            list.remove(&claim.tick);
            if list.is_empty() {
                self.by_owner.remove(&claim.owner);
            }
        }
        Some(claim.owner)
    }

    /// How many ids `owner` has.
    pub fn count_of(&self, owner: &Owner) -> usize {
        self.by_owner.get(owner).map_or(0, BTreeMap::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(id: &str) -> Owner {
        Owner {
            id: id.into(),
            issuer: None,
        }
    }

    fn row(kind: &str, claim: serde_json::Value) -> crate::store::record::StoredRow {
        crate::store::record::StoredRow {
            seq: 1,
            id: "01J00000000000000000000000".into(),
            timestamp: 1,
            kind: kind.into(),
            meta: "{}".into(),
            json: serde_json::json!({"type": kind, "data": {"claim": claim}}).to_string(),
        }
    }

    #[test]
    fn claims_logged_before_a_position_or_a_time_are_due_again() {
        let mut t = Identities::new(10);
        let mut stored = row(
            "identity.claimed",
            serde_json::json!({"id": "agent:alice-bot", "owner": {"id": "alice"}}),
        );
        stored.seq = 5;
        stored.timestamp = 1_000;
        t.apply_stored(&stored);
        t.claim(IdKind::Participant, "desk", &owner("bob"), |_, _| false);
        t.logged(IdKind::Participant, "desk", 9, 2_000);
        let keys = |due: Vec<(IdKind, String, Owner)>| -> Vec<String> {
            let mut k: Vec<String> = due.into_iter().map(|(_, i, _)| i).collect();
            k.sort();
            k
        };
        assert_eq!(keys(t.due(6, None)), ["alice-bot"], "logged at 5, before 6");
        assert!(t.due(5, None).is_empty());
        assert_eq!(
            keys(t.due(0, Some(1_500))),
            ["alice-bot"],
            "logged at 1 000 ms"
        );
        assert_eq!(keys(t.due(10, None)), ["alice-bot", "desk"]);
        // Logged again: not due any more.
        t.logged(IdKind::Agent, "alice-bot", 11, 3_000);
        assert_eq!(keys(t.due(10, Some(2_500))), ["desk"]);
        assert_eq!(t.due(10, None)[0].2, owner("bob"), "with its owner");
    }

    #[test]
    fn logged_claims_and_releases_are_applied_as_the_writer_decided() {
        let mut t = Identities::new(1);
        let alice = serde_json::json!({"id": "participant:desk", "owner": {"id": "alice"}});
        t.apply_stored(&row("identity.claimed", alice));
        assert_eq!(t.owner(IdKind::Participant, "desk"), Some(&owner("alice")));
        // The writer gave the id to bob (after alice's release, say): bob has it here too.
        let bob = serde_json::json!({"id": "participant:desk", "owner": {"id": "bob"}});
        t.apply_stored(&row("identity.claimed", bob));
        assert_eq!(t.owner(IdKind::Participant, "desk"), Some(&owner("bob")));
        assert_eq!(t.count_of(&owner("alice")), 0);
        // A follower never evicts on its own: the cap is the writer's to apply.
        let more = serde_json::json!({"id": "participant:other", "owner": {"id": "bob"}});
        t.apply_stored(&row("identity.claimed", more));
        assert_eq!(t.count_of(&owner("bob")), 2);
        t.apply_stored(&row(
            "identity.released",
            serde_json::json!({"id": "participant:desk"}),
        ));
        assert_eq!(t.owner(IdKind::Participant, "desk"), None);
        // Other rows and unreadable ones change nothing.
        t.apply_stored(&row(
            "message_sent",
            serde_json::json!({"id": "participant:other"}),
        ));
        t.apply_stored(&row(
            "identity.released",
            serde_json::json!({"id": "nonsense"}),
        ));
        assert_eq!(t.owner(IdKind::Participant, "other"), Some(&owner("bob")));
    }

    #[test]
    fn the_first_owner_keeps_an_id() {
        let mut t = Identities::new(10);
        let (new, _) = t.claim(IdKind::Participant, "desk", &owner("alice"), |_, _| false);
        assert!(new);
        let (new, _) = t.claim(IdKind::Participant, "desk", &owner("bob"), |_, _| false);
        assert!(!new);
        assert_eq!(t.owner(IdKind::Participant, "desk"), Some(&owner("alice")));
        // Kinds are separate namespaces.
        assert_eq!(t.owner(IdKind::Agent, "desk"), None);
        assert_eq!(t.release(IdKind::Participant, "desk"), Some(owner("alice")));
        assert_eq!(t.owner(IdKind::Participant, "desk"), None);
        assert_eq!(t.count_of(&owner("alice")), 0);
    }

    #[test]
    fn a_principal_past_its_cap_loses_its_least_recently_used_unused_ids_only() {
        let mut t = Identities::new(3);
        for id in ["a", "b", "c"] {
            t.claim(IdKind::Agent, id, &owner("alice"), |_, _| false);
        }
        t.claim(IdKind::Agent, "x", &owner("bob"), |_, _| false);
        // "a" is used again: now the most recent.
        t.claim(IdKind::Agent, "a", &owner("alice"), |_, _| false);
        // "b" is in use: "c" goes.
        let (_, evicted) = t.claim(IdKind::Agent, "d", &owner("alice"), |_, id| id == "b");
        assert_eq!(evicted, vec![(IdKind::Agent, "c".to_owned())]);
        assert_eq!(t.count_of(&owner("alice")), 3);
        assert_eq!(t.owner(IdKind::Agent, "c"), None);
        assert_eq!(t.owner(IdKind::Agent, "a"), Some(&owner("alice")));
        // Bob's claim is untouched by alice's churn.
        assert_eq!(t.owner(IdKind::Agent, "x"), Some(&owner("bob")));
        assert_eq!(t.len(), 4);
    }
}
