//! [`ImTable`]: the IM gateway's own state: the live IM connections by URI (their MAP
//! sessions, to send as them) and who registered each IM URI, which decides who may send as it
//! and whose it is in the read models (docs/gateways.md, "Identity").
//!
//! Rules it keeps:
//! - an IM `from` is proven, not claimed: it must be a URI the caller's [`Subject`] registered
//!   over IM, with a live connection (else 409 `agent_offline` for its owner, 403 for anybody
//!   else);
//! - a URI another subject registered is not registered again by anybody else (the router's
//!   ownership of agent ids says the same, durably; this refuses it before a session is opened).
//!
//! Bounds: the live WebSockets themselves, counted from the upgrade on ([`ImTable::admit`]):
//! at most `gateways.im.max_connections` in all and `max_connections_per_caller` per caller
//! (principal, or address without authentication; an exempt loopback address has only the
//! total), refused before the upgrade; one live entry per registered connection (each is a MAP
//! session of its principal, also bounded by that principal's session quota); and at most
//! [`MAX_REMEMBERED_OWNERS`] owners of URIs no longer connected, the oldest forgotten first (in
//! memory: a restart forgets them, and the router's own ownership of the agent ids still
//! applies). NB. A std mutex, never held across an await.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;

use crate::client::Client;
use crate::gateway::caller::CallerKey;
use crate::gateway::caller::Subject;
use crate::gateway::wire::Failure;

/// Owners of IM URIs not connected any more that are remembered (to refuse them to others and
/// to answer their owners as theirs): far more than the IM agents of a router, few bytes each.
pub const MAX_REMEMBERED_OWNERS: usize = 65_536;

#[derive(Debug, Clone)]
struct Live {
    client: Client,
    owner: Subject,
    /// Which connection (a new one under the same URI gets a new number).
    conn: u64,
}

#[derive(Debug, Default)]
struct Inner {
    live: HashMap<String, Live>,
    owners: HashMap<String, Subject>,
    /// URIs in `owners` in the order they were last registered.
    order: VecDeque<String>,
    next_conn: u64,
    /// Live WebSockets in all, and per caller key.
    sockets: usize,
    sockets_of: HashMap<CallerKey, usize>,
}

/// One admitted IM WebSocket: counted until dropped.
#[derive(Debug)]
pub struct Admitted {
    table: Arc<ImTable>,
    key: Option<CallerKey>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut t = lock(&self.table.inner);
        t.sockets = t.sockets.saturating_sub(1);
        if let Some(key) = &self.key {
            if let Some(n) = t.sockets_of.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    t.sockets_of.remove(key);
                }
            }
        }
    }
}

/// The IM gateway's table.
#[derive(Debug, Default)]
pub struct ImTable {
    inner: Mutex<Inner>,
}

use crate::sync::lock;

impl ImTable {
    /// Counts a new WebSocket of the caller `key` (`None`: one with no per-caller cap), within
    /// `total` in all and `per_caller` per key.
    ///
    /// # Errors
    /// 503 over the total, 429 `quota_exceeded` over the caller's own cap.
    pub fn admit(
        self: &Arc<Self>,
        key: Option<CallerKey>,
        total: usize,
        per_caller: usize,
    ) -> Result<Admitted, Failure> {
        let mut t = lock(&self.inner);
        if t.sockets >= total {
            return Err(Failure::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_connections",
                format!("the IM gateway holds its most connections ({total}); try again later"),
            ));
        }
        if let Some(k) = &key {
            let mine = t.sockets_of.get(k).copied().unwrap_or(0);
            if mine >= per_caller {
                return Err(Failure::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "quota_exceeded",
                    format!(
                        "Quota exceeded: IM connections per caller (limit {per_caller}, \
                         gateways.im.max_connections_per_caller)"
                    ),
                ));
            }
            *t.sockets_of.entry(k.clone()).or_insert(0) += 1;
        }
        t.sockets += 1;
        Ok(Admitted {
            table: Arc::clone(self),
            key,
        })
    }

    /// Live WebSockets (registered or not).
    pub fn connections(&self) -> usize {
        lock(&self.inner).sockets
    }

    /// Owners of IM URIs remembered.
    pub fn owners(&self) -> usize {
        lock(&self.inner).owners.len()
    }

    /// Who registered `uri` over IM (in this process), if anybody.
    pub fn owner(&self, uri: &str) -> Option<Subject> {
        lock(&self.inner).owners.get(uri).cloned()
    }

    /// Whether `uri` was registered over IM by `who`.
    pub fn is_owned_by(&self, uri: &str, who: &Subject) -> bool {
        lock(&self.inner).owners.get(uri) == Some(who)
    }

    /// Records a registered connection; its number, for [`ImTable::disconnected`].
    pub fn connected(&self, uri: &str, client: Client, owner: Subject) -> u64 {
        let mut t = lock(&self.inner);
        t.next_conn += 1;
        let conn = t.next_conn;
        t.live.insert(
            uri.to_owned(),
            Live {
                client,
                owner: owner.clone(),
                conn,
            },
        );
        if t.owners.insert(uri.to_owned(), owner).is_some() {
            t.order.retain(|u| u != uri);
        }
        t.order.push_back(uri.to_owned());
        // Forget the oldest owners of URIs not connected (a live one goes to the back).
        let mut scanned = 0;
        while t.owners.len() > MAX_REMEMBERED_OWNERS && scanned < t.order.len() {
            let Some(old) = t.order.pop_front() else {
                break;
            };
            if t.live.contains_key(&old) {
                t.order.push_back(old);
                scanned += 1;
            } else {
                t.owners.remove(&old);
            }
        }
        conn
    }

    /// Connection `conn` of `uri` ended.
    pub fn disconnected(&self, uri: &str, conn: u64) {
        let mut t = lock(&self.inner);
        if t.live.get(uri).is_some_and(|l| l.conn == conn) {
            t.live.remove(uri);
        }
    }

    /// The session `who` may send as `from` through: its live IM connection.
    ///
    /// # Errors
    /// 403 `forbidden` when `from` is not an IM URI `who` registered; 409 `agent_offline` when
    /// it is but its connection ended.
    pub fn sender(&self, from: &str, who: &Subject) -> Result<Client, Failure> {
        let t = lock(&self.inner);
        match t.live.get(from) {
            Some(l) if &l.owner == who => return Ok(l.client.clone()),
            Some(_) => return Err(not_yours(from)),
            None => {}
        }
        if t.owners.get(from) == Some(who) {
            return Err(Failure::new(
                StatusCode::CONFLICT,
                "agent_offline",
                format!(
                    "{from} is an IM agent that is not connected: it sends only while connected"
                ),
            ));
        }
        Err(not_yours(from))
    }
}

fn not_yours(from: &str) -> Failure {
    Failure::forbidden(format!(
        "from `{from}` is not an IM agent your credential registered: send as an IM agent of \
         your own (connected on /gateway/connect), or leave `from` out to send as yourself"
    ))
}
