//! Request rate limits: one token bucket per connection and one per principal (GCRA, from the
//! `governor` crate).
//!
//! Owns the buckets and the rule of what counts; [`crate::router::rpc::RpcSession`] asks before
//! each request and answers `4001 Rate limited` with `data.retryAfterMs` when a bucket is empty.
//!
//! What counts: every request, including each request inside a batch and requests sent before
//! `map/connect`. Notifications do not take tokens from the request budget: unknown ones are
//! dropped without any work, and `map/subscribe.ack` must never be refused (a dropped ack would
//! stall a credit-window subscription forever). Acks are instead *paced*: over the rate the
//! reader waits for a token before applying the ack, so a peer that floods acks is slowed by
//! its own socket, not answered.
//!
//! The principal bucket is keyed on the authenticated principal id when the session has one
//! ([`ConnRate::set_principal`]); without a principal it is keyed on the remote IP address of a
//! network connection (WebSocket, HTTP), so anonymous peers cannot multiply their budget by
//! opening connections; pipes and in-process links, which have neither, only have their
//! per-connection bucket.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

/// A sustained rate and a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Requests per second, sustained.
    pub per_second: u32,
    /// Requests that may arrive at once after a quiet period.
    pub burst: u32,
}

impl Rate {
    fn quota(self) -> Option<Quota> {
        let per_second = NonZeroU32::new(self.per_second)?;
        let burst = NonZeroU32::new(self.burst.max(1)).unwrap_or(per_second);
        Some(Quota::per_second(per_second).allow_burst(burst))
    }
}

/// Default per-connection rate: 1000 requests/s sustained, bursts of 2000. Far above what an
/// interactive agent or dashboard sends (and above a 1000-entry batch), low enough that one
/// connection cannot monopolise the router task.
pub const DEFAULT_CONNECTION_RATE: Rate = Rate {
    per_second: 1000,
    burst: 2000,
};

/// Default per-principal (or per-IP) rate: 5000 requests/s, bursts of 10000: several busy
/// connections of one identity, bounded together.
pub const DEFAULT_PRINCIPAL_RATE: Rate = Rate {
    per_second: 5000,
    burst: 10000,
};

/// Whose bucket a connection shares.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum RateKey {
    Principal(Arc<str>),
    Ip(IpAddr),
}

type Direct = RateLimiter<NotKeyed, InMemoryState, DefaultClock>;
type Keyed = RateLimiter<RateKey, DefaultKeyedStateStore<RateKey>, DefaultClock>;

/// Forget idle principal buckets after this many checks (bounds the keyed table).
const SWEEP_EVERY: u32 = 4096;

/// The server-wide rate settings and the shared per-principal buckets.
#[derive(Debug)]
pub struct RateLimits {
    connection: Option<Quota>,
    principal: Option<Keyed>,
    checks: AtomicU32,
    /// Loopback peers get no per-connection bucket and no per-address bucket.
    exempt_loopback: bool,
}

impl RateLimits {
    /// Limits with the given rates (`None`, or a rate of 0 per second: unlimited); with
    /// `exempt_loopback`, loopback peers get neither a per-connection nor a per-address bucket
    /// (`limits.exempt_loopback`; an authenticated principal's bucket still applies).
    pub fn new(
        per_connection: Option<Rate>,
        per_principal: Option<Rate>,
        exempt_loopback: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            connection: per_connection.and_then(Rate::quota),
            principal: per_principal
                .and_then(Rate::quota)
                .map(RateLimiter::hashmap),
            checks: AtomicU32::new(0),
            exempt_loopback,
        })
    }

    /// No limits at all.
    pub fn unlimited() -> Arc<Self> {
        Self::new(None, None, false)
    }

    /// The buckets of a new connection from `peer` (a network address, when it has one).
    pub fn connection(self: &Arc<Self>, peer: Option<IpAddr>) -> ConnRate {
        if self.exempt_loopback && peer.is_some_and(|ip| ip.is_loopback()) {
            return ConnRate {
                own: None,
                shared: Arc::clone(self),
                key: None,
            };
        }
        ConnRate {
            own: self.connection.map(RateLimiter::direct),
            shared: Arc::clone(self),
            key: peer.map(RateKey::Ip),
        }
    }

    fn check_key(&self, key: &RateKey) -> Result<(), Duration> {
        let Some(limiter) = &self.principal else {
            return Ok(());
        };
        if self.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            limiter.retain_recent();
        }
        limiter
            .check_key(key)
            .map_err(|not_until| not_until.wait_time_from(limiter.clock().now()))
    }
}

impl Default for RateLimits {
    fn default() -> Self {
        Self {
            connection: None,
            principal: None,
            checks: AtomicU32::new(0),
            exempt_loopback: false,
        }
    }
}

/// One connection's view: its own bucket and its share of a principal's.
#[derive(Debug)]
pub struct ConnRate {
    own: Option<Direct>,
    shared: Arc<RateLimits>,
    key: Option<RateKey>,
}

impl Default for ConnRate {
    fn default() -> Self {
        RateLimits::unlimited().connection(None)
    }
}

impl ConnRate {
    /// From now on, share the bucket of this authenticated principal (instead of the remote
    /// address's).
    pub fn set_principal(&mut self, id: &str) {
        self.key = Some(RateKey::Principal(Arc::from(id)));
    }

    /// Takes one token from each bucket.
    ///
    /// # Errors
    /// How long until a token is available, when a bucket is empty.
    pub fn check(&self) -> Result<(), Duration> {
        if let Some(own) = &self.own {
            own.check()
                .map_err(|not_until| not_until.wait_time_from(own.clock().now()))?;
        }
        match &self.key {
            Some(key) => self.shared.check_key(key),
            None => Ok(()),
        }
    }

    /// Waits (bounded by `limit`) until [`ConnRate::check`] admits; used to pace
    /// notifications that must not be dropped.
    pub async fn pace(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        for _ in 0..64 {
            match self.check() {
                Ok(()) => return,
                Err(wait) => {
                    let until = (tokio::time::Instant::now() + wait).min(deadline);
                    tokio::time::sleep_until(until).await;
                    if tokio::time::Instant::now() >= deadline {
                        return;
                    }
                }
            }
        }
    }
}

/// Milliseconds to tell a client in `retryAfterMs`: rounded up, at least 1.
pub fn retry_after_ms(wait: Duration) -> u64 {
    let ms = wait.as_micros().div_ceil(1000);
    u64::try_from(ms).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_bucket_refuses_past_its_burst_and_says_when_to_retry() {
        let limits = RateLimits::new(
            Some(Rate {
                per_second: 10,
                burst: 3,
            }),
            None,
            false,
        );
        let c = limits.connection(None);
        for _ in 0..3 {
            assert!(c.check().is_ok());
        }
        let wait = c.check().unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(100));
        assert!(retry_after_ms(wait) >= 1);
        // Another connection has its own bucket.
        assert!(limits.connection(None).check().is_ok());
    }

    #[test]
    fn loopback_peers_are_exempt_when_configured_but_principals_are_not() {
        let rate = Some(Rate {
            per_second: 1,
            burst: 1,
        });
        let limits = RateLimits::new(rate, rate, true);
        let lo: IpAddr = "::1".parse().unwrap();
        let mut local = limits.connection(Some(lo));
        for _ in 0..100 {
            assert!(local.check().is_ok());
        }
        let remote = limits.connection(Some("10.0.0.1".parse().unwrap()));
        assert!(remote.check().is_ok());
        assert!(remote.check().is_err(), "remote peers keep their buckets");
        local.set_principal("alice");
        assert!(local.check().is_ok());
        assert!(
            local.check().is_err(),
            "an authenticated principal's bucket applies"
        );
    }

    #[test]
    fn connections_from_one_address_or_principal_share_a_bucket() {
        let limits = RateLimits::new(
            None,
            Some(Rate {
                per_second: 1,
                burst: 2,
            }),
            false,
        );
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let a = limits.connection(Some(ip));
        let b = limits.connection(Some(ip));
        assert!(a.check().is_ok());
        assert!(b.check().is_ok());
        assert!(a.check().is_err(), "the address's burst is spent");
        // A principal has its own bucket, whatever the address.
        let mut p = limits.connection(Some(ip));
        p.set_principal("alice");
        assert!(p.check().is_ok());
        // No address and no principal: no shared bucket.
        assert!(limits.connection(None).check().is_ok());
    }

    #[test]
    fn zero_means_unlimited() {
        let limits = RateLimits::new(
            Some(Rate {
                per_second: 0,
                burst: 0,
            }),
            None,
            false,
        );
        let c = limits.connection(None);
        for _ in 0..10_000 {
            assert!(c.check().is_ok());
        }
    }
}
