//! The checks every gateway route makes before it does any work (issue 23), shared by A2A,
//! MAMP and IM so that each answers the same way:
//!
//! - **where from**: a browser's `Origin` must be the router's own or listed
//!   ([`Guard::origin_allowed`]): a page on another site can neither open a WebSocket nor POST;
//! - **what**: a POST body must be `application/json` ([`json_content_type`]), which no HTML
//!   form can send without a CORS preflight;
//! - **how much and how fast**: a body is read with a size cap and a deadline
//!   ([`read_body`]), so a slow or endless body is cut, never held;
//! - **how often**: a token bucket per caller, keyed by principal (or IP without one)
//!   ([`Guard::rate`]), so one flooder spends its own budget, never another caller's.
//!
//! Owns: the allow-list and the keyed buckets (bounded: idle keys are forgotten).

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap};
use futures::StreamExt;
use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

pub use crate::transport::http::json_content_type;

/// Default time a request body may take to arrive (as `/map/rpc`'s, below the 15 s a stalled
/// connection may be held).
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Default rate per caller: 200 requests/s sustained, bursts of 400.
pub const DEFAULT_RATE: (u32, u32) = (200, 400);

/// Forget idle buckets after this many checks.
const SWEEP_EVERY: u32 = 4096;

/// Who a bucket is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CallerKey {
    /// An authenticated principal (`id`, `issuer`).
    Principal(String, Option<String>),
    /// An anonymous caller's address.
    Ip(IpAddr),
    /// An anonymous caller whose address is unknown (all share one bucket).
    Unknown,
}

type Keyed = RateLimiter<CallerKey, DefaultKeyedStateStore<CallerKey>, DefaultClock>;

/// Settings of a [`Guard`].
#[derive(Debug, Clone)]
pub struct GuardSettings {
    /// Origins allowed besides the router's own (`scheme://host[:port]`, exact, lowercase);
    /// `*` allows every origin.
    pub allowed_origins: Vec<String>,
    /// Longest a request body may take to arrive.
    pub body_timeout: Duration,
    /// Requests per second and burst per caller; `None`: unlimited.
    pub rate: Option<(u32, u32)>,
}

impl Default for GuardSettings {
    fn default() -> Self {
        Self {
            allowed_origins: Vec::new(),
            body_timeout: DEFAULT_BODY_TIMEOUT,
            rate: Some(DEFAULT_RATE),
        }
    }
}

/// One gateway's guard.
pub struct Guard {
    settings: GuardSettings,
    limiter: Option<Keyed>,
    checks: AtomicU32,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Why a body was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// Larger than allowed (the declared size, when there was one).
    TooLarge(Option<usize>),
    /// It did not arrive within the deadline.
    Timeout,
    /// The client went away mid-body.
    Broken,
}

impl Guard {
    /// A guard with `settings`.
    pub fn new(settings: GuardSettings) -> Self {
        let limiter = settings.rate.and_then(|(per_second, burst)| {
            let per_second = NonZeroU32::new(per_second)?;
            let burst = NonZeroU32::new(burst.max(1)).unwrap_or(per_second);
            Some(RateLimiter::keyed(
                Quota::per_second(per_second).allow_burst(burst),
            ))
        });
        Self {
            settings,
            limiter,
            checks: AtomicU32::new(0),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &GuardSettings {
        &self.settings
    }

    /// Whether the request may come from where its `Origin` says: no `Origin` (not a browser),
    /// the router's own origin (the `Host` the request was sent to), or a listed one.
    pub fn origin_allowed(&self, headers: &HeaderMap) -> bool {
        let Some(origin) = headers.get(header::ORIGIN) else {
            return true;
        };
        let Ok(origin) = origin.to_str() else {
            return false;
        };
        let origin = origin.trim().to_ascii_lowercase();
        if self
            .settings
            .allowed_origins
            .iter()
            .any(|o| o == "*" || o.eq_ignore_ascii_case(&origin))
        {
            return true;
        }
        // The router's own pages (the dashboard) and same-origin tools.
        let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
            return false;
        };
        let host = host.trim().to_ascii_lowercase();
        let bare = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        bare == Some(host.as_str())
    }

    /// Takes one request from `key`'s bucket: `Err(retry_after)` when it is empty.
    pub fn rate(&self, key: &CallerKey) -> Result<(), Duration> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        if self.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
        limiter.check_key(key).map_err(|not_until| {
            not_until
                .wait_time_from(DefaultClock::default().now())
                .max(Duration::from_millis(1))
        })
    }
}

/// Reads `body` whole, refusing more than `max` bytes (at once when `Content-Length` says so)
/// and giving up after `deadline`.
///
/// # Errors
/// [`BodyError`].
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    max: usize,
    deadline: Duration,
) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > max) {
        return Err(BodyError::TooLarge(declared));
    }
    let read = async {
        let mut out = Vec::with_capacity(declared.unwrap_or(0).min(max));
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|_| BodyError::Broken)?;
            if out.len() + chunk.len() > max {
                return Err(BodyError::TooLarge(declared));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(out))
    };
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or(Err(BodyError::Timeout))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn origins_the_routers_own_listed_or_none() {
        let g = Guard::new(GuardSettings {
            allowed_origins: vec!["https://app.example".into()],
            ..GuardSettings::default()
        });
        assert!(g.origin_allowed(&headers(&[("host", "127.0.0.1:4500")])));
        assert!(g.origin_allowed(&headers(&[
            ("host", "127.0.0.1:4500"),
            ("origin", "http://127.0.0.1:4500")
        ])));
        assert!(g.origin_allowed(&headers(&[
            ("host", "router:4500"),
            ("origin", "https://APP.example")
        ])));
        for evil in ["http://evil.example", "null", "http://127.0.0.1:4501"] {
            assert!(
                !g.origin_allowed(&headers(&[("host", "127.0.0.1:4500"), ("origin", evil)])),
                "{evil}"
            );
        }
    }

    #[test]
    fn json_bodies_only() {
        assert!(json_content_type(&headers(&[(
            "content-type",
            "application/json; charset=utf-8"
        )])));
        assert!(json_content_type(&headers(&[(
            "content-type",
            "application/a2a+json"
        )])));
        for other in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ] {
            assert!(
                !json_content_type(&headers(&[("content-type", other)])),
                "{other}"
            );
        }
        assert!(!json_content_type(&HeaderMap::new()));
    }

    #[test]
    fn one_callers_bucket_is_its_own() {
        let g = Guard::new(GuardSettings {
            rate: Some((1, 2)),
            ..GuardSettings::default()
        });
        let bob = CallerKey::Principal("bob".into(), None);
        let alice = CallerKey::Principal("alice".into(), None);
        assert!(g.rate(&bob).is_ok());
        assert!(g.rate(&bob).is_ok());
        let wait = g.rate(&bob).expect_err("bob's burst is spent");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(1),
            "{wait:?}"
        );
        assert!(g.rate(&alice).is_ok(), "alice keeps her own budget");
    }

    #[tokio::test]
    async fn bodies_are_capped_and_timed() {
        let h = headers(&[("content-length", "100")]);
        let err = read_body(&h, Body::from("x"), 10, Duration::from_secs(1)).await;
        assert_eq!(err, Err(BodyError::TooLarge(Some(100))));
        let ok = read_body(
            &HeaderMap::new(),
            Body::from("{}"),
            10,
            Duration::from_secs(1),
        )
        .await;
        assert_eq!(ok.unwrap(), Bytes::from_static(b"{}"));
        let endless = futures::stream::pending::<Result<Bytes, std::io::Error>>();
        let err = read_body(
            &HeaderMap::new(),
            Body::from_stream(endless),
            10,
            Duration::from_millis(50),
        )
        .await;
        assert_eq!(err, Err(BodyError::Timeout));
    }
}
