//! [`CallerSessions`]: the one opener of the gateways' MAP sessions, every one of them a
//! principal's, over `InProcessLinks::connect_as`, so the router applies that principal's
//! grants, quotas and visibility exactly as over MAP:
//!
//! - [`CallerSessions::get`] / [`CallerSessions::get_for`]: the caller's shared session, one
//!   per caller principal (never one per credential string: a principal rotating its JWTs keeps
//!   one session), reused while in use and closed once idle;
//! - [`CallerSessions::open`]: a session of its own for one purpose, of a principal (an IM
//!   connection's agent, an outside MAMP sender, an AIP node, a remote agent's caller);
//! - [`CallerSessions::open_service`]: a session of the router's service principal (the
//!   gateways' own bookkeeping), which no participant can connect as.
//!
//! No other gateway code calls `Client::in_process*`. Owns the table `caller key → session`,
//! keyed by the gateway layer's one key ([`CallerKey`], as the rate buckets). With
//! authentication off there are no principals: callers are told apart by address
//! ([`CallerSessions::get_for`]), so one address's flood spends its own session's rate budget,
//! not everybody's; callers with no address (or on an exempt loopback address) share one
//! anonymous session (every MAP participant is anybody then).
//!
//! Bounds: one session per principal (or address) that called within `idle`; a sweeper closes
//! the others. At most [`MAX_ADDRESS_SESSIONS`] address sessions: past that the least recently
//! used one is closed. The router's per-principal session quota applies to these sessions as
//! to any other, and they use one slot of it each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

use crate::client::{Client, ClientError, ClientOptions, ConnectionState};
use crate::gateway::caller::CallerKey;
use crate::protocol::methods::session::Principal;
use crate::transport::in_process::InProcessLinks;

/// Default time a caller's session stays open after its last use.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(60);

/// Most sessions of anonymous callers told apart by address (authentication off).
pub const MAX_ADDRESS_SESSIONS: usize = 256;

/// Who a session is for: a principal, an anonymous caller's address (authentication off),
/// or every other anonymous caller ([`CallerKey::Unknown`]).
type Key = CallerKey;

#[derive(Debug)]
struct Slot {
    cell: Arc<OnceCell<Client>>,
    last_used: Instant,
}

/// The callers' sessions of one gateway.
pub struct CallerSessions {
    links: Arc<dyn InProcessLinks + Send + Sync>,
    idle: Duration,
    slots: Mutex<HashMap<Key, Slot>>,
}

impl std::fmt::Debug for CallerSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerSessions")
            .field("idle", &self.idle)
            .field("open", &self.len())
            .finish_non_exhaustive()
    }
}

use crate::sync::lock;

impl CallerSessions {
    /// A table over `links`; sessions unused for `idle` are closed by a sweeper task (spawned
    /// on the current runtime; it ends with the table).
    pub fn new(links: Arc<dyn InProcessLinks + Send + Sync>, idle: Duration) -> Arc<Self> {
        let table = Arc::new(Self {
            links,
            idle,
            slots: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&table);
        tokio::spawn(sweep_loop(weak, idle));
        table
    }

    /// The session for `principal` (`None`: authentication is off), opened with `options` when
    /// there is none (or it ended). Concurrent first calls for one principal open one session.
    ///
    /// # Errors
    /// The router refused the session (its error says why: a quota, a missing grant).
    pub async fn get(
        &self,
        principal: Option<&Principal>,
        options: impl FnOnce() -> ClientOptions,
    ) -> Result<Client, ClientError> {
        let key = principal.map_or(CallerKey::Unknown, |p| {
            CallerKey::Principal(p.id.clone(), p.issuer.clone())
        });
        self.get_for(principal, key, options).await
    }

    /// As [`CallerSessions::get`], for a caller known by `key` (`Caller::key`): without a
    /// principal, an address key ([`CallerKey::Ip`]) keys a session of its own.
    ///
    /// # Errors
    /// As [`CallerSessions::get`].
    pub async fn get_for(
        &self,
        principal: Option<&Principal>,
        key: CallerKey,
        options: impl FnOnce() -> ClientOptions,
    ) -> Result<Client, ClientError> {
        let key = match principal {
            Some(p) => Key::Principal(p.id.clone(), p.issuer.clone()),
            None if matches!(key, Key::Ip(_)) => key,
            None => Key::Unknown,
        };
        let mut recycled = None;
        let cell = {
            let mut slots = lock(&self.slots);
            if matches!(key, Key::Ip(_)) && !slots.contains_key(&key) {
                let addresses = slots.keys().filter(|k| matches!(k, Key::Ip(_))).count();
                if addresses >= MAX_ADDRESS_SESSIONS {
                    let oldest = slots
                        .iter()
                        .filter(|(k, _)| matches!(k, Key::Ip(_)))
                        .min_by_key(|(_, s)| s.last_used)
                        .map(|(k, _)| k.clone());
                    recycled = oldest.and_then(|k| slots.remove(&k)).map(|s| s.cell);
                }
            }
            let fresh = || Slot {
                cell: Arc::new(OnceCell::new()),
                last_used: Instant::now(),
            };
            let slot = slots.entry(key.clone()).or_insert_with(fresh);
            let ended = slot
                .cell
                .get()
                .is_some_and(|c| matches!(c.state(), ConnectionState::Closed));
            if ended {
                *slot = fresh();
            }
            slot.last_used = Instant::now();
            Arc::clone(&slot.cell)
        };
        if let Some(old) = recycled.and_then(|c| c.get().cloned()) {
            tokio::spawn(async move {
                if old.disconnect().await.is_err() {
                    let _ = old.close().await;
                }
            });
        }
        let opened = cell
            .get_or_try_init(|| self.open(principal, options()))
            .await;
        match opened {
            Ok(client) => Ok(client.clone()),
            Err(e) => {
                // Nothing to keep: the next call tries again.
                let mut slots = lock(&self.slots);
                if slots.get(&key).is_some_and(|s| Arc::ptr_eq(&s.cell, &cell)) {
                    slots.remove(&key);
                }
                Err(e)
            }
        }
    }

    /// A new session of `principal` (`None`: authentication is off, and the session is
    /// anonymous like every MAP participant's) for one purpose, not shared: the caller closes
    /// it (or drops it) when that purpose ends.
    ///
    /// # Errors
    /// The router refused the session (its error says why: a quota, a missing grant).
    pub async fn open(
        &self,
        principal: Option<&Principal>,
        options: ClientOptions,
    ) -> Result<Client, ClientError> {
        match principal {
            Some(p) => Client::in_process_as(&*self.links, p.clone(), options).await,
            None => Client::in_process(&*self.links, options).await,
        }
    }

    /// A new session of the router's service principal (`auth::service_principal`), with or
    /// without `[auth]`: the gateways' own bookkeeping.
    ///
    /// # Errors
    /// As [`CallerSessions::open`].
    pub async fn open_service(&self, options: ClientOptions) -> Result<Client, ClientError> {
        self.open(Some(&crate::auth::service_principal()), options)
            .await
    }

    /// Sessions open (or opening).
    pub fn len(&self) -> usize {
        lock(&self.slots).len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes the sessions unused for longer than the idle time; returns how many.
    pub async fn sweep(&self) -> usize {
        let now = Instant::now();
        let idle: Vec<Arc<OnceCell<Client>>> = {
            let mut slots = lock(&self.slots);
            let keys: Vec<Key> = slots
                .iter()
                .filter(|(_, s)| now.duration_since(s.last_used) >= self.idle)
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter()
                .filter_map(|k| slots.remove(&k))
                .map(|s| s.cell)
                .collect()
        };
        let n = idle.len();
        for cell in idle {
            if let Some(client) = cell.get() {
                // `map/disconnect`: the session ends as a participant's would (what it
                // registered is unregistered), then the link closes.
                if client.disconnect().await.is_err() {
                    let _ = client.close().await;
                }
            }
        }
        n
    }
}

async fn sweep_loop(table: Weak<CallerSessions>, idle: Duration) {
    let period = (idle / 2).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(period).await;
        let Some(table) = table.upgrade() else { break };
        table.sweep().await;
    }
}
