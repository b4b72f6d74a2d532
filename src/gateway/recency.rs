//! [`Recency`]: the order in which keys were last used, for the gateways' bounded tables (the
//! read model's contacts and conversations, the reply threads, the MAMP conversation map): the
//! table keeps its values, this keeps which key is the least recently used, so a table over its
//! cap forgets that one first. `touch`, `remove` and `pop_oldest` are O(log n).
//!
//! Owns nothing but the order; the table that holds one owns the keys' values and decides what
//! is evicted (some tables keep entries out of the order, e.g. contacts that are online).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// Keys in the order of their last use.
#[derive(Debug)]
pub struct Recency<K> {
    tick: u64,
    at: HashMap<K, u64>,
    order: BTreeMap<u64, K>,
}

impl<K> Default for Recency<K> {
    fn default() -> Self {
        Self {
            tick: 0,
            at: HashMap::new(),
            order: BTreeMap::new(),
        }
    }
}

impl<K: Clone + Eq + Hash> Recency<K> {
    /// Marks `key` used now (adding it when new).
    pub fn touch(&mut self, key: &K) {
        self.tick += 1;
        if let Some(old) = self.at.insert(key.clone(), self.tick) {
            self.order.remove(&old);
        }
        self.order.insert(self.tick, key.clone());
    }

    /// Forgets `key`; whether it was there.
    pub fn remove(&mut self, key: &K) -> bool {
        match self.at.remove(key) {
            Some(t) => {
                self.order.remove(&t);
                true
            }
            None => false,
        }
    }

    /// Removes and returns the least recently used key.
    pub fn pop_oldest(&mut self) -> Option<K> {
        let (_, key) = self.order.pop_first()?;
        self.at.remove(&key);
        Some(key)
    }

    /// Keys tracked.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Whether `key` is tracked.
    pub fn contains(&self, key: &K) -> bool {
        self.at.contains_key(key)
    }
}

/// A map that holds at most `cap` entries, forgetting the least recently used one past that.
#[derive(Debug)]
pub struct BoundedMap<K, V> {
    cap: usize,
    map: HashMap<K, V>,
    order: Recency<K>,
}

impl<K: Clone + Eq + Hash, V> BoundedMap<K, V> {
    /// An empty map of at most `cap` entries (at least one).
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            map: HashMap::new(),
            order: Recency::default(),
        }
    }

    /// The value of `key`, marked used.
    pub fn get(&mut self, key: &K) -> Option<&V> {
        if self.map.contains_key(key) {
            self.order.touch(key);
        }
        self.map.get(key)
    }

    /// The value of `key`, not marking it used.
    pub fn peek(&self, key: &K) -> Option<&V> {
        self.map.get(key)
    }

    /// Sets `key` (marked used); returns the entries forgotten to stay within the cap.
    pub fn insert(&mut self, key: K, value: V) -> Vec<(K, V)> {
        self.order.touch(&key);
        self.map.insert(key, value);
        let mut evicted = Vec::new();
        while self.map.len() > self.cap {
            let Some(old) = self.order.pop_oldest() else {
                break;
            };
            if let Some(v) = self.map.remove(&old) {
                evicted.push((old, v));
            }
        }
        evicted
    }

    /// Removes `key`.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        self.order.remove(key);
        self.map.remove(key)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_goes_first() {
        let mut m = BoundedMap::new(2);
        assert!(m.insert("a", 1).is_empty());
        assert!(m.insert("b", 2).is_empty());
        assert_eq!(m.get(&"a"), Some(&1));
        assert_eq!(m.insert("c", 3), vec![("b", 2)]);
        assert_eq!(m.len(), 2);
        assert_eq!(m.peek(&"b"), None);
        let mut r = Recency::default();
        for k in [1, 2, 3] {
            r.touch(&k);
        }
        r.touch(&1);
        assert!(r.remove(&3));
        assert_eq!(r.pop_oldest(), Some(2));
        assert_eq!(r.pop_oldest(), Some(1));
        assert!(r.is_empty());
    }
}
