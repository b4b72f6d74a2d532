//! [`PeerTable`]: the sessions that stand for outside agents (`peers.rs` opens them), each
//! with its owner; the mailboxes of outside senders that have no endpoint (what MAP agents
//! sent them, until they fetch it); and the MAMP conversation-id mapping (ours ↔ what a remote
//! agent calls it), all in memory: a restart opens the sessions again on first use, and a
//! remote conversation started before it is a new one after.
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
//! - a mailbox holds at most [`MAILBOX_MESSAGES`] messages (its peer's session is closed when
//!   it is full, so the router queues or fails what follows instead of delivering it), and is
//!   kept [`MAILBOX_TTL`] after its last message; at most [`MAX_PEERS`] mailboxes in all;
//! - the conversation mapping keeps at most [`MAX_CONVERSATION_MAPPINGS`] pairs, the least
//!   recently used forgotten first.
//!
//! NB. A std mutex, never held across an await: a peer is opened outside it, once, through
//! the slot's `OnceCell` (two first messages from one sender open one session).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OnceCell};

use crate::client::{AgentHandle, Client, ConnectionState};
use crate::gateway::caller::Subject;
use crate::gateway::recency::BoundedMap;
use crate::gateway::wire::GatewayError;
use crate::protocol::message::Message;

/// Most messages kept for one outside sender until it fetches them.
pub const MAILBOX_MESSAGES: usize = 64;
/// How long an unfetched mailbox is kept after its last message.
pub const MAILBOX_TTL: Duration = Duration::from_secs(600);
/// Most MAMP conversation-id pairs remembered.
pub const MAX_CONVERSATION_MAPPINGS: usize = 65_536;

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
    /// When its session was opened (a fetch right after waits for what the router delivers
    /// on reclaiming the agent).
    pub opened_at: Instant,
}

/// What MAP agents sent an outside sender that has no endpoint, until it fetches it
/// (`GET /mamp/v1/messages?agent=<uri>`).
#[derive(Debug, Default)]
pub struct Mailbox {
    queue: Mutex<VecDeque<Message>>,
    arrived: Notify,
}

impl Mailbox {
    /// Keeps `message`; whether the mailbox is now full.
    pub fn push(&self, message: Message) -> bool {
        let mut q = lock(&self.queue);
        q.push_back(message);
        let full = q.len() >= MAILBOX_MESSAGES;
        drop(q);
        self.arrived.notify_waiters();
        full
    }

    /// Everything kept, oldest first.
    pub fn take(&self) -> Vec<Message> {
        lock(&self.queue).drain(..).collect()
    }

    /// Messages kept.
    pub fn len(&self) -> usize {
        lock(&self.queue).len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until nothing new arrived for `quiet` (at most `limit` in all).
    pub async fn settle(&self, quiet: Duration, limit: Duration) {
        let _ = tokio::time::timeout(limit, async {
            while tokio::time::timeout(quiet, self.arrived.notified())
                .await
                .is_ok()
            {}
        })
        .await;
    }
}

#[derive(Debug)]
struct MailboxSlot {
    owner: Option<Subject>,
    mailbox: Arc<Mailbox>,
    last: Instant,
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
    /// Outside senders' mailboxes, by URI.
    mailboxes: Mutex<HashMap<String, MailboxSlot>>,
    /// MAMP conversation ids: (remote URI, our conversation) ↔ (remote URI, theirs).
    conversations: Mutex<ConversationMap>,
    /// Whether the idle sweeper runs (started with the first peer).
    pub(crate) sweeping: std::sync::atomic::AtomicBool,
}

#[derive(Debug)]
struct ConversationMap {
    ours_to_theirs: BoundedMap<(String, String), String>,
    theirs_to_ours: BoundedMap<(String, String), String>,
}

impl Default for ConversationMap {
    fn default() -> Self {
        Self {
            ours_to_theirs: BoundedMap::new(MAX_CONVERSATION_MAPPINGS),
            theirs_to_ours: BoundedMap::new(MAX_CONVERSATION_MAPPINGS),
        }
    }
}

use crate::sync::lock;

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

    /// What the remote calls our conversation `ours`: its own id (a conversation our side
    /// started there), or ours (one it started here).
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

    /// Conversation-id pairs remembered.
    pub fn conversation_mappings(&self) -> usize {
        lock(&self.conversations).ours_to_theirs.len()
    }

    /// The mailbox of outside sender `uri` (of `owner`), made when there is none; `None` when
    /// another owner holds it.
    pub fn mailbox(&self, uri: &str, owner: Option<&Subject>) -> Option<Arc<Mailbox>> {
        let mut boxes = lock(&self.mailboxes);
        if let Some(slot) = boxes.get_mut(uri) {
            if slot.owner.as_ref() != owner {
                return None;
            }
            slot.last = Instant::now();
            return Some(Arc::clone(&slot.mailbox));
        }
        if boxes.len() >= MAX_PEERS {
            // Room: the mailbox unused for longest (its messages are dropped, and logged).
            let oldest = boxes
                .iter()
                .min_by_key(|(_, s)| s.last)
                .map(|(k, _)| k.clone());
            if let Some(old) = oldest.and_then(|k| boxes.remove(&k).map(|s| (k, s))) {
                dropped(&old.0, &old.1, "the mailboxes' cap");
            }
        }
        let mailbox = Arc::new(Mailbox::default());
        boxes.insert(
            uri.to_owned(),
            MailboxSlot {
                owner: owner.cloned(),
                mailbox: Arc::clone(&mailbox),
                last: Instant::now(),
            },
        );
        Some(mailbox)
    }

    /// The mailbox of `uri` if `owner` holds one.
    pub fn mailbox_of(&self, uri: &str, owner: Option<&Subject>) -> Option<Arc<Mailbox>> {
        lock(&self.mailboxes)
            .get(uri)
            .filter(|s| s.owner.as_ref() == owner)
            .map(|s| Arc::clone(&s.mailbox))
    }

    /// Forgets mailboxes that are empty and unused for `idle`, or unfetched for
    /// [`MAILBOX_TTL`] (their messages are dropped, and logged), except those whose peer is
    /// still open.
    pub fn sweep_mailboxes(&self, idle: Duration) {
        let now = Instant::now();
        let open: std::collections::HashSet<String> = lock(&self.slots).keys().cloned().collect();
        let mut boxes = lock(&self.mailboxes);
        let stale: Vec<String> = boxes
            .iter()
            .filter(|(uri, s)| {
                let age = now.duration_since(s.last);
                !open.contains(uri.as_str())
                    && ((s.mailbox.is_empty() && age >= idle) || age >= MAILBOX_TTL)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for uri in stale {
            if let Some(slot) = boxes.remove(&uri) {
                dropped(&uri, &slot, "its time to live");
            }
        }
    }

    /// Mailboxes held.
    pub fn mailboxes(&self) -> usize {
        lock(&self.mailboxes).len()
    }
}

/// Logs the messages of a mailbox forgotten before they were fetched.
fn dropped(uri: &str, slot: &MailboxSlot, why: &str) {
    let n = slot.mailbox.len();
    if n > 0 {
        tracing::warn!(
            sender = %uri,
            messages = n,
            "an outside sender's unfetched messages were dropped ({why})"
        );
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
