//! [`Cache`]: the kept items of one kind the router holds in memory, at most `capacity` of
//! them (least recently used out first), keyed by id.
//!
//! Invariant: an item is dropped only once the store has it. Each slot remembers the log
//! position of the router's newest write to it (`written`); the owner of the cache passes the
//! position below which everything is in the store and no load in flight may have missed it
//! (`safe_below`, see `kept::Kept`), and [`Cache::trim`] drops only slots written below that.
//! So the cache can hold a little more than `capacity` while writes wait for their commit,
//! and a later load of a dropped item always reads its newest state.
//!
//! A slot may also say that the store has *no* such item (`None`), so that an operation on a
//! missing id asks the store once per attempt, not in a loop. Such a slot is exact for as
//! long as it is cached: every creation goes through the cache and replaces it.
//!
//! Cost per item: the key twice (the map and the LRU order), a slot (value `Arc`, two
//! integers) and the map and tree overhead: about 100 bytes plus the key and the value.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// One cached item.
#[derive(Debug)]
struct Slot<V> {
    /// The item, or `None` when the store has no item with this key.
    value: Option<Arc<V>>,
    /// Its place in the LRU order.
    tick: u64,
    /// The log position of the router's newest write to it, if it wrote it.
    written: Option<u64>,
}

/// A bounded cache of kept items.
#[derive(Debug)]
pub struct Cache<V> {
    slots: HashMap<String, Slot<V>>,
    lru: BTreeMap<u64, String>,
    tick: u64,
    capacity: usize,
}

impl<V> Cache<V> {
    /// A cache of at most about `capacity` items (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            slots: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            capacity: capacity.max(1),
        }
    }

    /// Items held (known-absent keys included).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// How many it keeps once everything is committed.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// `None` when the key is not cached; `Some(None)` when the store has no such item;
    /// `Some(Some(item))` otherwise. Does not count as a use.
    pub fn peek(&self, key: &str) -> Option<Option<&Arc<V>>> {
        self.slots.get(key).map(|s| s.value.as_ref())
    }

    /// As [`Cache::peek`], and counts as a use (it moves to the back of the LRU order).
    pub fn get(&mut self, key: &str) -> Option<Option<&Arc<V>>> {
        self.touch(key);
        self.peek(key)
    }

    fn touch(&mut self, key: &str) {
        if let Some(slot) = self.slots.get_mut(key) {
            self.lru.remove(&slot.tick);
            self.tick += 1;
            slot.tick = self.tick;
            self.lru.insert(self.tick, key.to_owned());
        }
    }

    /// Stores the router's own write of `key` (logged at position `written`).
    pub fn put(&mut self, key: &str, value: Arc<V>, written: u64) {
        self.set(key, Some(value), Some(written));
    }

    /// Marks `key` written at position `written` (after a change through [`Cache::get_mut`]).
    pub fn written(&mut self, key: &str, written: u64) {
        if let Some(slot) = self.slots.get_mut(key) {
            slot.written = Some(slot.written.map_or(written, |w| w.max(written)));
        }
    }

    /// Stores what a load found (`None`: no such item), unless the key is cached already: the
    /// cached one is at least as new.
    pub fn fill(&mut self, key: &str, value: Option<Arc<V>>) {
        if !self.slots.contains_key(key) {
            self.set(key, value, None);
        }
    }

    fn set(&mut self, key: &str, value: Option<Arc<V>>, written: Option<u64>) {
        self.tick += 1;
        let tick = self.tick;
        match self.slots.get_mut(key) {
            Some(slot) => {
                self.lru.remove(&slot.tick);
                slot.tick = tick;
                slot.value = value;
                if written.is_some() {
                    slot.written = written;
                }
            }
            None => {
                self.slots.insert(
                    key.to_owned(),
                    Slot {
                        value,
                        tick,
                        written,
                    },
                );
            }
        }
        self.lru.insert(tick, key.to_owned());
    }

    /// Drops the least recently used items beyond the capacity, skipping those written at or
    /// after `safe_below` (the store may not have them yet). Looks at a bounded number of
    /// items, so a burst of uncommitted writes costs nothing here until they are committed.
    pub fn trim(&mut self, safe_below: u64) {
        let excess = self.slots.len().saturating_sub(self.capacity);
        if excess == 0 {
            return;
        }
        let mut drop = Vec::with_capacity(excess);
        for (tick, key) in self.lru.iter().take(excess + 64) {
            if drop.len() == excess {
                break;
            }
            let dirty = self
                .slots
                .get(key)
                .and_then(|s| s.written)
                .is_some_and(|w| w >= safe_below);
            if !dirty {
                drop.push((*tick, key.clone()));
            }
        }
        for (tick, key) in drop {
            self.lru.remove(&tick);
            self.slots.remove(&key);
        }
    }
}

impl<V: Clone> Cache<V> {
    /// The cached item, to change it (cloned first if someone else holds it). Call
    /// [`Cache::written`] after changing it.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.touch(key);
        self.slots
            .get_mut(key)
            .and_then(|s| s.value.as_mut())
            .map(Arc::make_mut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_most_recently_used_and_never_drops_an_uncommitted_write() {
        let mut c: Cache<u32> = Cache::new(2);
        c.fill("a", Some(Arc::new(1)));
        c.fill("b", Some(Arc::new(2)));
        c.put("c", Arc::new(3), 10);
        assert!(c.get("a").is_some());
        c.trim(5);
        // `b` was the least recently used; `c` is not committed yet (10 >= 5).
        assert!(c.peek("b").is_none());
        assert_eq!(c.len(), 2);
        c.fill("d", None);
        c.trim(5);
        assert_eq!(c.peek("c").map(|v| v.map(|v| **v)), Some(Some(3)));
        c.trim(11);
        assert!(c.len() <= 2);
        // A load never replaces what is cached.
        c.put("e", Arc::new(5), 12);
        c.fill("e", Some(Arc::new(0)));
        assert_eq!(c.peek("e").map(|v| v.map(|v| **v)), Some(Some(5)));
    }

    #[test]
    fn a_change_in_place_marks_the_item_written() {
        let mut c: Cache<Vec<u32>> = Cache::new(1);
        c.fill("a", Some(Arc::new(vec![1])));
        c.get_mut("a").unwrap().push(2);
        c.written("a", 7);
        c.fill("b", Some(Arc::new(vec![])));
        c.trim(7);
        assert!(c.peek("a").is_some(), "written at 7: not committed below 7");
        c.trim(8);
        assert_eq!(c.len(), 1);
    }
}
