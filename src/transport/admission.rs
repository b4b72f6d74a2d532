//! Admission of network connections: how many may be open at once, in total and per remote IP
//! address.
//!
//! Owns the counters only. The listener asks for a [`Slot`] for every accepted TCP connection,
//! and the HTTP transport for every HTTP session it creates (an HTTP session outlives the TCP
//! connections that carry its POSTs); the slot is released when its last holder drops it (for
//! a WebSocket, when the socket closes). A refusal says which limit was reached, so the listener
//! can answer with a clear status (`503` total, `429` per address) instead of a silent reset.
//!
//! Pipes and in-process links are not network connections and are not counted. Per-principal
//! limits need an authenticated session and live in `router::quotas`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{header, HeaderValue, Response, StatusCode};

use crate::protocol::jsonrpc::{ErrorCode, ErrorObject};
use crate::router::rpc::RpcSession;

/// Default cap on network connections at once: 10 000 idle sessions fit (about 15 KB of router
/// memory each); the process's file-descriptor limit must allow it (`ulimit -n`), else accept
/// backs off on EMFILE.
pub const DEFAULT_MAX_CONNECTIONS: usize = 16384;
/// Default cap per remote IP address: one host cannot take the whole server.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 256;

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_connections` reached.
    Total(usize),
    /// `max_connections_per_ip` reached for this address.
    PerIp(usize),
}

impl Refusal {
    /// The HTTP status to answer with: 503 when the server is full, 429 when this address is.
    pub fn status(self) -> u16 {
        match self {
            Self::Total(_) => 503,
            Self::PerIp(_) => 429,
        }
    }

    /// The JSON-RPC error for the body: 4000 (the server's resource) or 4002 (this address's
    /// quota), retryable.
    pub fn error(self) -> ErrorObject {
        match self {
            Self::Total(limit) => ErrorObject::new(
                ErrorCode::EXHAUSTED,
                format!("Resource exhausted: connections (limit {limit})"),
            )
            .retryable(),
            Self::PerIp(limit) => ErrorObject::new(
                ErrorCode::QUOTA_EXCEEDED,
                format!("Quota exceeded: connections per address (limit {limit})"),
            )
            .retryable(),
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

/// The connection counters of one server.
#[derive(Debug)]
pub struct Admission {
    max_total: usize,
    max_per_ip: usize,
    /// Loopback addresses are not counted per address (every local process shares one).
    exempt_loopback: bool,
    counts: Mutex<Counts>,
}

/// One admitted connection; releases its place when dropped.
#[derive(Debug)]
pub struct Slot {
    admission: Arc<Admission>,
    ip: Option<IpAddr>,
}

impl Admission {
    /// Counters with these limits (0: unlimited); with `exempt_loopback`, loopback peers
    /// count towards the total only.
    pub fn new(max_total: usize, max_per_ip: usize, exempt_loopback: bool) -> Arc<Self> {
        Arc::new(Self {
            max_total,
            max_per_ip,
            exempt_loopback,
            counts: Mutex::new(Counts::default()),
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        // Plain counters: consistent even if a holder panicked.
        crate::sync::lock(&self.counts)
    }

    /// Takes a place for a connection from `ip`.
    ///
    /// # Errors
    /// The limit that is reached.
    pub fn admit(self: &Arc<Self>, ip: Option<IpAddr>) -> Result<Slot, Refusal> {
        let ip = ip.filter(|ip| !(self.exempt_loopback && ip.is_loopback()));
        let mut c = self.counts();
        if self.max_total > 0 && c.total >= self.max_total {
            return Err(Refusal::Total(self.max_total));
        }
        if let Some(ip) = ip {
            let n = c.per_ip.entry(ip).or_insert(0);
            if self.max_per_ip > 0 && *n >= self.max_per_ip {
                return Err(Refusal::PerIp(self.max_per_ip));
            }
            *n += 1;
        }
        c.total += 1;
        Ok(Slot {
            admission: Arc::clone(self),
            ip,
        })
    }

    /// Connections admitted and not yet released.
    pub fn open(&self) -> usize {
        self.counts().total
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.admission.counts();
        c.total = c.total.saturating_sub(1);
        if let Some(ip) = self.ip {
            if let Some(n) = c.per_ip.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    c.per_ip.remove(&ip);
                }
            }
        }
    }
}

/// Where a request came from, as a request extension.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The remote address.
    pub addr: SocketAddr,
    /// The admission slot of the TCP connection (released when the last clone drops).
    pub slot: Arc<Slot>,
}

/// The answer to a connection over a limit: a status, `Retry-After`, and a JSON-RPC error body.
pub fn refusal_response(refusal: Refusal) -> Response<Body> {
    let body = RpcSession::error(&refusal.error())
        .response
        .unwrap_or_default();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() =
        StatusCode::from_u16(refusal.status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_total_and_per_address_and_releases_on_drop() {
        let a = Admission::new(3, 2, false);
        let ip1: IpAddr = "10.0.0.1".parse().unwrap();
        let ip2: IpAddr = "10.0.0.2".parse().unwrap();
        let s1 = a.admit(Some(ip1)).unwrap();
        let _s2 = a.admit(Some(ip1)).unwrap();
        assert_eq!(a.admit(Some(ip1)).unwrap_err(), Refusal::PerIp(2));
        let _s3 = a.admit(Some(ip2)).unwrap();
        assert_eq!(a.admit(Some(ip2)).unwrap_err(), Refusal::Total(3));
        drop(s1);
        assert_eq!(a.open(), 2);
        let _s4 = a.admit(Some(ip1)).unwrap();
        assert_eq!(Refusal::Total(3).status(), 503);
        assert_eq!(Refusal::PerIp(2).error().code, ErrorCode::QUOTA_EXCEEDED);
    }

    #[test]
    fn loopback_peers_count_towards_the_total_only_when_exempt() {
        let a = Admission::new(5, 1, true);
        let lo4: IpAddr = "127.0.0.1".parse().unwrap();
        let lo6: IpAddr = "::1".parse().unwrap();
        let remote: IpAddr = "10.0.0.1".parse().unwrap();
        let local: Vec<_> = (0..3).map(|_| a.admit(Some(lo4)).unwrap()).collect();
        let _six = a.admit(Some(lo6)).unwrap();
        let _r = a.admit(Some(remote)).unwrap();
        assert_eq!(a.admit(Some(remote)).unwrap_err(), Refusal::Total(5));
        drop(local);
        assert_eq!(
            a.admit(Some(remote)).unwrap_err(),
            Refusal::PerIp(1),
            "remote still limited"
        );
        let strict = Admission::new(0, 1, false);
        let _one = strict.admit(Some(lo4)).unwrap();
        assert_eq!(strict.admit(Some(lo4)).unwrap_err(), Refusal::PerIp(1));
    }

    #[test]
    fn zero_is_unlimited() {
        let a = Admission::new(0, 0, false);
        let slots: Vec<_> = (0..1000).map(|_| a.admit(None).unwrap()).collect();
        assert_eq!(a.open(), 1000);
        drop(slots);
        assert_eq!(a.open(), 0);
    }
}
