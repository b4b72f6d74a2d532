//! Which ids of a table changed since they were last saved, and what was last saved (cluster
//! mode, `router::handover`). The registry, the scopes and the sessions each hold a
//! [`Changes`] and mark an id on every write; the router holds the [`Saver`]. Imports nothing
//! of ours, so any table may hold it.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

/// The ids a table changed since they were last saved; records nothing until
/// [`Changes::track`] (a single router, a follower: nothing is saved there).
#[derive(Debug)]
pub struct Changes<K>(Option<BTreeSet<K>>);

impl<K> Default for Changes<K> {
    fn default() -> Self {
        Self(None)
    }
}

impl<K: Ord + Clone> Changes<K> {
    /// Starts recording.
    pub fn track(&mut self) {
        self.0.get_or_insert_with(BTreeSet::new);
    }

    /// Records that `id` changed (inserted, modified or removed).
    pub fn mark(&mut self, id: &K) {
        if let Some(set) = &mut self.0 {
            if !set.contains(id) {
                set.insert(id.clone());
            }
        }
    }

    /// The ids changed since the last call.
    pub fn take(&mut self) -> Vec<K> {
        self.0
            .as_mut()
            .map(|set| std::mem::take(set).into_iter().collect())
            .unwrap_or_default()
    }
}

/// What the live node last saved: a digest of each key's record, and where and when it was
/// written (to write it again before the stream's limits delete it).
#[derive(Debug, Default)]
pub struct Saver {
    saved: HashMap<String, Saved>,
}

#[derive(Debug, Clone, Copy)]
struct Saved {
    digest: u64,
    seq: u64,
    at: Instant,
}

impl Saver {
    /// Records `digest` as `key`'s, written at `seq` now; whether it differs from what was
    /// saved before (the caller writes it only then).
    pub fn changed(&mut self, key: String, digest: u64, seq: u64) -> bool {
        if self.saved.get(&key).is_some_and(|s| s.digest == digest) {
            return false;
        }
        let at = Instant::now();
        self.saved.insert(key, Saved { digest, seq, at });
        true
    }

    /// Forgets `key`; whether it had been saved.
    pub fn forget(&mut self, key: &str) -> bool {
        self.saved.remove(key).is_some()
    }

    /// The keys written before `seq`, or before `at` when given: due to be written again.
    pub fn due(&self, seq: u64, at: Option<Instant>) -> Vec<String> {
        self.saved
            .iter()
            .filter(|(_, s)| s.seq < seq || at.is_some_and(|at| s.at < at))
            .map(|(k, _)| k.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{Changes, Saver};
    use std::time::Instant;

    #[test]
    fn changes_are_recorded_only_once_tracked_and_taken_once() {
        let mut c: Changes<u32> = Changes::default();
        c.mark(&1);
        assert!(c.take().is_empty(), "not tracked: nothing recorded");
        c.track();
        c.mark(&2);
        c.mark(&1);
        c.mark(&2);
        assert_eq!(c.take(), vec![1, 2]);
        assert!(c.take().is_empty());
    }

    #[test]
    fn the_saver_says_whether_a_record_changed_and_which_are_due_again() {
        let mut s = Saver::default();
        assert!(s.changed("agent:a".into(), 7, 10));
        assert!(
            !s.changed("agent:a".into(), 7, 11),
            "same digest: not written again"
        );
        assert!(s.changed("agent:b".into(), 5, 12));
        assert_eq!(s.due(11, None), vec!["agent:a".to_owned()]);
        assert!(s.changed("agent:a".into(), 8, 13));
        assert_eq!(s.due(13, None), vec!["agent:b".to_owned()]);
        assert!(s.due(12, None).is_empty());
        let later = Instant::now() + std::time::Duration::from_secs(1);
        assert_eq!(
            s.due(0, Some(later)).len(),
            2,
            "both written before `later`"
        );
        assert!(s.forget("agent:a"));
        assert!(!s.forget("agent:a"), "dropped once");
    }
}
