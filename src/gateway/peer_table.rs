//! [`PeerTable`]: the sessions that stand for outside agents (`peers.rs` opens them), each
//! with its owner, and the MAMP conversation-id mapping (ours ↔ a remote agent's), all in
//! memory: a restart opens the sessions again on first use, and a remote conversation started
//! before it is a new one after.
//!
//! Owners and bounds (docs/gateways.md, "Identity"):
//! - a configured remote agent's peer belongs to the router's service (`owner: None`): opened
//!   at start-up, never closed for idleness, never evicted; their number is bounded by the
//!   configuration (`config::MAX_MAMP_REMOTES`);
//! - an outside sender's peer belongs to the caller that posted as it (a [`Subject`]): a
//!   session of the caller's own principal, so it uses that principal's session quota and
//!   nobody else's. At most [`MAX_PEERS_PER_OWNER`] per principal and [`MAX_PEERS`] in all
//!   (with authentication off, the one anonymous caller has only the latter): past either,
//!   the least recently used one (of that owner, then of anybody) is closed to make room, which costs nothing but a new session on its next message (nobody outside can
//!   receive what is sent to it). The sweeper (`peers.rs`) closes those unused for
//!   `[gateways] session_idle_ms`.
//!
//! NB. A std mutex, never held across an await: a peer is opened outside it, once, through
//! the slot's `OnceCell` (two first messages from one sender open one session).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

use crate::client::{AgentHandle, Client, ConnectionState};
use crate::gateway::caller::Subject;
use crate::gateway::wire::GatewayError;

/// Most outside senders' sessions one caller holds at once. Below the router's default
/// `max_sessions_per_principal` (64), so that a principal's outside senders leave room for
/// its own session and its IM connections; a principal posting as more senders than this
/// recycles its least recently used ones.
pub const MAX_PEERS_PER_OWNER: usize = 32;
/// Most outside senders' sessions in all (each is a session and an agent of the router's).
pub const MAX_PEERS: usize = 4096;

/// One outside agent's session and MAP agent.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The outside agent's URI, also its MAP agent id.
    pub uri: String,
    /// Its session.
    pub client: Client,
    /// Its MAP agent (kept so that the agent's messages reach the pump).
    pub agent: AgentHandle,
}

#[derive(Debug)]
struct Slot {
    /// `None`: the router's service (a configured remote agent).
    owner: Option<Subject>,
    cell: Arc<OnceCell<Peer>>,
    last_used: Instant,
}

impl Slot {
    fn fresh(owner: Option<Subject>) -> Self {
        Self {
            owner,
            cell: Arc::new(OnceCell::new()),
            last_used: Instant::now(),
        }
    }

    /// An open peer that may be closed to make room or for idleness (never the service's,
    /// never one still opening).
    fn recyclable(&self) -> bool {
        self.owner.is_some() && self.cell.initialized()
    }
}

/// A slot handed to `peers.rs`: the cell to open (or find) the peer in, and the peers closed
/// to make room for it, for the caller to disconnect outside the lock.
#[derive(Debug)]
pub struct Claimed {
    /// The slot's cell.
    pub cell: Arc<OnceCell<Peer>>,
    /// Peers evicted to make room.
    pub evicted: Vec<Peer>,
}

/// The peer table and the MAMP conversation mapping.
#[derive(Debug, Default)]
pub struct PeerTable {
    slots: Mutex<HashMap<String, Slot>>,
    /// MAMP conversation ids: (remote URI, our conversation) ↔ (remote URI, theirs).
    conversations: Mutex<ConversationMap>,
    /// Whether the idle sweeper runs (started with the first peer).
    pub(crate) sweeping: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Default)]
struct ConversationMap {
    ours_to_theirs: HashMap<(String, String), String>,
    theirs_to_ours: HashMap<(String, String), String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PeerTable {
    /// The slot for `uri`, owned by `owner` (`None`: the service), made when there is none
    /// (or its session ended), evicting to stay within the bounds.
    ///
    /// # Errors
    /// [`GatewayError::Forbidden`] when another owner holds `uri`.
    pub fn claim(&self, uri: &str, owner: Option<&Subject>) -> Result<Claimed, GatewayError> {
        let mut slots = lock(&self.slots);
        let mut evicted = Vec::new();
        if let Some(slot) = slots.get_mut(uri) {
            if slot.owner.as_ref() != owner {
                return Err(GatewayError::Forbidden(format!(
                    "{uri} is held by another sender's session"
                )));
            }
            let ended = slot
                .cell
                .get()
                .is_some_and(|p| matches!(p.client.state(), ConnectionState::Closed));
            if ended {
                *slot = Slot::fresh(owner.cloned());
            }
            slot.last_used = Instant::now();
            return Ok(Claimed {
                cell: Arc::clone(&slot.cell),
                evicted,
            });
        }
        if let Some(owner) = owner {
            while slots
                .values()
                .filter(|s| s.owner.as_ref() == Some(owner))
                .count()
                >= MAX_PEERS_PER_OWNER
            {
                let Some(p) = evict_lru(&mut slots, |s| s.owner.as_ref() == Some(owner)) else {
                    break;
                };
                evicted.push(p);
            }
            while slots.len() >= MAX_PEERS {
                let Some(p) = evict_lru(&mut slots, |_| true) else {
                    break;
                };
                evicted.push(p);
            }
            if slots.len() >= MAX_PEERS {
                return Err(GatewayError::Quota(format!(
                    "outside senders' sessions (limit {MAX_PEERS}, all opening)"
                )));
            }
        }
        let slot = Slot::fresh(owner.cloned());
        let cell = Arc::clone(&slot.cell);
        slots.insert(uri.to_owned(), slot);
        Ok(Claimed { cell, evicted })
    }

    /// Drops the slot for `uri` if it is still `cell` (its peer could not be opened).
    pub fn forget(&self, uri: &str, cell: &Arc<OnceCell<Peer>>) {
        let mut slots = lock(&self.slots);
        if slots.get(uri).is_some_and(|s| Arc::ptr_eq(&s.cell, cell)) {
            slots.remove(uri);
        }
    }

    /// Closes (hands back for disconnecting) `owner`'s least recently used open peer: room for
    /// a session the router refused on that principal's quota.
    pub fn evict_one_of(&self, owner: &Subject) -> Option<Peer> {
        evict_lru(&mut lock(&self.slots), |s| s.owner.as_ref() == Some(owner))
    }

    /// Removes the peer for `uri` when `owner` holds it (an IM agent of the same caller is
    /// connecting under that URI: its own session takes the agent id over).
    ///
    /// # Errors
    /// [`GatewayError::Forbidden`] when another owner (or the service) holds it.
    pub fn take(&self, uri: &str, owner: &Subject) -> Result<Option<Peer>, GatewayError> {
        let mut slots = lock(&self.slots);
        match slots.get(uri) {
            None => Ok(None),
            Some(s) if s.owner.as_ref() == Some(owner) => {
                Ok(slots.remove(uri).and_then(|s| s.cell.get().cloned()))
            }
            Some(_) => Err(GatewayError::Forbidden(format!(
                "{uri} is held by another sender's session"
            ))),
        }
    }

    /// Removes and returns the open peers (not the service's) unused for `idle`.
    pub fn idle(&self, idle: Duration) -> Vec<Peer> {
        let now = Instant::now();
        let mut slots = lock(&self.slots);
        let keys: Vec<String> = slots
            .iter()
            .filter(|(_, s)| s.recyclable() && now.duration_since(s.last_used) >= idle)
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter()
            .filter_map(|k| slots.remove(k))
            .filter_map(|s| s.cell.get().cloned())
            .collect()
    }

    /// Peers held (or opening).
    pub fn len(&self) -> usize {
        lock(&self.slots).len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Our conversation id for the remote's `theirs`, if a message of ours started it.
    pub fn ours(&self, remote: &str, theirs: &str) -> Option<String> {
        lock(&self.conversations)
            .theirs_to_ours
            .get(&(remote.to_owned(), theirs.to_owned()))
            .cloned()
    }

    /// The remote's conversation id for `ours`.
    pub fn theirs(&self, remote: &str, ours: &str) -> Option<String> {
        lock(&self.conversations)
            .ours_to_theirs
            .get(&(remote.to_owned(), ours.to_owned()))
            .cloned()
    }

    /// Records that `ours` is `theirs` at `remote`.
    pub fn map_conversation(&self, remote: &str, ours: &str, theirs: &str) {
        let mut map = lock(&self.conversations);
        map.ours_to_theirs
            .insert((remote.to_owned(), ours.to_owned()), theirs.to_owned());
        map.theirs_to_ours
            .insert((remote.to_owned(), theirs.to_owned()), ours.to_owned());
    }
}

/// Removes the least recently used recyclable slot that `which` admits; its peer.
fn evict_lru(slots: &mut HashMap<String, Slot>, which: impl Fn(&Slot) -> bool) -> Option<Peer> {
    let key = slots
        .iter()
        .filter(|(_, s)| s.recyclable() && which(s))
        .min_by_key(|(_, s)| s.last_used)
        .map(|(k, _)| k.clone())?;
    slots.remove(&key).and_then(|s| s.cell.get().cloned())
}
