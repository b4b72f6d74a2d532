//! The kept items: tasks, checkpoints, conversations and turns, which the store keeps apart from
//! the event log and retention never trims (`store::kept`). The store is their source of
//! truth; the router holds only a bounded cache of each ([`cache::Cache`], in the tasks,
//! trajectory and mail parts) and pages the rest from the store on demand.
//!
//! This module owns how the router reads them: the in-memory tables when it has no store
//! ([`Kept::memory`]: then they are all there is, bounded by the quotas), and the **loads in
//! flight**, so that no cache drops an item that a load may have read stale:
//!
//! - An operation that needs an item it does not have fails with `RouterError::NeedsLoad`
//!   before it changes anything; [`ops::paged`] opens a load ticket (recording the store's
//!   committed position as the load's *floor*), reads the items on the store's reader threads
//!   (never the router task), and runs the operation again with them, in one router step that
//!   first puts them in the caches (unless cached meanwhile: the cache is newer).
//! - A cache drops an item only when the router's newest write to it is below every open
//!   ticket's floor and below the committed position ([`Kept::safe_below`]): such a write is
//!   in what every load in flight reads. A write the store has not committed, or one a load
//!   in flight may have missed, stays in memory. Tickets expire after [`LOAD_TTL`] (a caller
//!   that went away); a load that comes back with an expired ticket is discarded and read
//!   again.
//!
//! Reads that go through many rows (the `*/list` methods, turns) page through the store in
//! chunks, each filtered on the router task by the permission functions ([`ops`]).

pub mod cache;
pub mod need;
pub mod ops;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::store::memory::MemoryKept;

/// How long a load ticket stays open: far longer than a store read takes, short enough that
/// a caller that went away mid-load holds back no cache for long.
pub const LOAD_TTL: Duration = Duration::from_secs(30);

/// Default number of items of each kind the router caches (tasks, checkpoints, conversations;
/// turn positions get four times as many): enough for the working set of a busy router (the
/// tasks and conversations in use), small enough that a million stored items cost a few MB
/// (docs/performance.md, "Memory soak").
pub const DEFAULT_CACHE_ITEMS: usize = 4096;

/// A load in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

/// How the router reads the kept items.
#[derive(Debug)]
pub struct Kept {
    /// The kept tables themselves, when the router has no store.
    pub memory: Option<MemoryKept>,
    /// The store's commit progress, when it has one.
    committed: Option<watch::Receiver<u64>>,
    /// Open tickets: their floor and when they were opened.
    loads: BTreeMap<u64, (u64, Instant)>,
    next_ticket: u64,
}

impl Kept {
    /// Reading the store whose commit progress is `committed`, or (`None`) in-memory tables.
    pub fn new(committed: Option<watch::Receiver<u64>>) -> Self {
        Self {
            memory: committed.is_none().then(MemoryKept::default),
            committed,
            loads: BTreeMap::new(),
            next_ticket: 0,
        }
    }

    /// Everything logged below this position is committed.
    fn committed(&self) -> u64 {
        self.committed.as_ref().map_or(u64::MAX, |c| *c.borrow())
    }

    /// Opens a ticket for a load about to start.
    pub fn open(&mut self) -> Ticket {
        self.next_ticket += 1;
        let floor = self.committed();
        self.loads.insert(self.next_ticket, (floor, Instant::now()));
        Ticket(self.next_ticket)
    }

    /// Closes a ticket; false when it had expired (what its load read must be read again).
    pub fn close(&mut self, t: Ticket) -> bool {
        self.loads.remove(&t.0).is_some()
    }

    /// The position below which a cached write may be dropped: committed, and seen by every
    /// load in flight. Expires old tickets.
    pub fn safe_below(&mut self) -> u64 {
        let now = Instant::now();
        self.loads
            .retain(|_, (_, opened)| now.duration_since(*opened) < LOAD_TTL);
        let floor = self.loads.values().map(|(f, _)| *f).min();
        floor.map_or(self.committed(), |f| f.min(self.committed()))
    }

    /// Loads in flight (for tests and metrics).
    pub fn loads_in_flight(&self) -> usize {
        self.loads.len()
    }
}
