//! The checks every gateway route makes before it does any work (issues 23 and 43), shared
//! by A2A, MAMP and IM so that each answers the same way, and applied by one layer, the
//! [`Gate`], to every route of a route group built with [`GatedRoutes`], so that a new
//! route cannot miss them:
//!
//! - **who**: the caller's credential, read and verified once (`caller.rs`, [`Admission`]),
//!   per the group's [`Access`]; the [`Caller`] is put in the request's extensions;
//! - **how often**: a token bucket per caller, keyed by principal (or address without one)
//!   ([`Guard::rate`]), so one flooder spends its own budget, never another caller's;
//! - **what**: a POST body must be `application/json` ([`json_content_type`]), which no HTML
//!   form can send without a CORS preflight;
//! - **how much and how fast**: the body is read by the gate with the group's size cap and
//!   the body deadline ([`read_body`]), so a slow or endless body is cut, never held; the
//!   handler gets the bytes;
//! - **where from**: a browser's `Origin` must be the router's own or listed
//!   ([`Guard::origin_allowed`], applied by `server::origins` to the whole listener).
//!
//! In that order; a refusal is a [`Refused`], answered by the group's renderer in its
//! gateway's shape (the seeds' `{"error", "message", "status_code"}`, A2A's JSON-RPC errors
//! or `{error, code}`), with `Retry-After` for a rate limit and `Connection: close` when a
//! body was left unread. The IM WebSocket's frames and AIP's RPCs spend the same buckets
//! ([`Guard::rate`]), since they are not HTTP requests.
//!
//! Owns: the allow-list and the keyed buckets (bounded: idle keys are forgotten), and the
//! gate's settings per route group; nothing about what the routes do.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody as _};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::handler::Handler;
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::MethodRouter;
use axum::Router as HttpRouter;
use futures::StreamExt;
use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

use crate::gateway::caller::{credential, Accepts, Admission, Caller, CallerKey, Refusal};
use crate::gateway::traffic::{self, Outcome, Traffic};
use crate::gateway::wire::closing;
use crate::transport::admission::PeerInfo;

pub use crate::transport::http::json_content_type;

/// Default time a request body may take to arrive (as `/map/rpc`'s, below the 15 s a stalled
/// connection may be held).
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Default rate per caller: 200 requests/s sustained, bursts of 400.
pub const DEFAULT_RATE: (u32, u32) = (200, 400);

/// Forget idle buckets after this many checks.
const SWEEP_EVERY: u32 = 4096;

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
    /// Where the gates count their requests (`traffic.rs`; the gateway context's table).
    pub traffic: Option<Arc<Traffic>>,
}

impl Default for GuardSettings {
    fn default() -> Self {
        Self {
            allowed_origins: Vec::new(),
            body_timeout: DEFAULT_BODY_TIMEOUT,
            rate: Some(DEFAULT_RATE),
            traffic: None,
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

/// How a route group treats a request's credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Required (with authentication on): none, or a refused one, is a 401.
    Required,
    /// Optional: without one the caller is anonymous (known by its address); a refused one is
    /// still a 401 (A2A's router card: its skills are what the caller may see).
    Optional,
    /// Not read: every caller is anonymous (MAMP's router card, which says how to
    /// authenticate).
    Public,
}

/// Why the [`Gate`] refused a request before its handler ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No credential, or a refused one (401).
    Caller(Refusal),
    /// The caller's bucket is empty: try again after `after`; `rate` is its budget (429).
    RateLimited {
        /// When to try again.
        after: Duration,
        /// Requests per second and burst.
        rate: (u32, u32),
    },
    /// A POST whose body is not JSON: the `Content-Type` found (415, A2A: -32005).
    NotJson(Option<String>),
    /// A body larger than the group's `max` bytes (413).
    TooLarge {
        /// The group's cap.
        max: usize,
    },
    /// A body that did not arrive within `deadline` (408).
    Timeout {
        /// The body deadline.
        deadline: Duration,
    },
    /// The client went away mid-body (400).
    Broken,
}

/// How a route group answers a [`Refused`], given the request's headers (A2A's JSON-RPC
/// errors take their version from `A2A-Version`).
pub type Render = Arc<dyn Fn(&Refused, &HeaderMap) -> Response + Send + Sync>;

/// The one admission-and-limits layer of a route group (module docs): who may call, the
/// caller's rate, a JSON body, the body's size cap and deadline. Cheap to clone.
#[derive(Clone)]
pub struct Gate {
    /// The route group's name (set by [`GatedRoutes::new`]); its first word names the gateway.
    group: &'static str,
    admission: Admission,
    accepts: Accepts,
    access: Access,
    guard: Arc<Guard>,
    exempt_loopback: bool,
    max_body: usize,
    render: Render,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("admission", &self.admission)
            .field("accepts", &self.accepts)
            .field("access", &self.access)
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

impl Gate {
    /// A gate admitting callers with `admission` (credentials in the forms `accepts` allows,
    /// `Access::Required`), spending `guard`'s buckets, reading bodies of at most `max_body`
    /// bytes, answering refusals with `render`.
    pub fn new(admission: Admission, guard: Arc<Guard>, max_body: usize, render: Render) -> Self {
        Self {
            group: "",
            admission,
            accepts: Accepts::default(),
            access: Access::Required,
            guard,
            exempt_loopback: false,
            max_body,
            render,
        }
    }

    /// With `accepts`.
    pub fn accepts(mut self, accepts: Accepts) -> Self {
        self.accepts = accepts;
        self
    }

    /// With `access`.
    pub fn access(mut self, access: Access) -> Self {
        self.access = access;
        self
    }

    /// Anonymous loopback callers skip the per-address bucket (`[limits] exempt_loopback`, as
    /// over MAP); principals never do.
    pub fn exempt_loopback(mut self, exempt: bool) -> Self {
        self.exempt_loopback = exempt;
        self
    }

    /// With a body cap of `max_body` bytes (a route group of the same gateway with its own
    /// size).
    pub fn max_body(mut self, max_body: usize) -> Self {
        self.max_body = max_body;
        self
    }

    /// The body cap.
    pub fn body_cap(&self) -> usize {
        self.max_body
    }

    /// The caller of a request, or why it is refused (headers only).
    fn caller(&self, request: &Request, ip: Option<IpAddr>) -> Result<Caller, Refusal> {
        if self.access == Access::Public {
            return Ok(self.admission.anonymous(ip));
        }
        let secret = credential(request.headers(), request.uri(), self.accepts);
        if secret.is_none() && self.access == Access::Optional {
            return Ok(self.admission.anonymous(ip));
        }
        self.admission.admit(secret.as_deref(), ip)
    }

    /// Takes one request from `caller`'s bucket.
    fn rate(&self, caller: &Caller) -> Result<(), Refused> {
        let Some(key) = caller.key(self.exempt_loopback) else {
            return Ok(());
        };
        self.guard.rate(&key).map_err(|after| Refused::RateLimited {
            after,
            rate: self.guard.settings().rate.unwrap_or(DEFAULT_RATE),
        })
    }
}

/// The gate's middleware (module docs); the handler gets the [`Caller`] in the request's
/// extensions and the body read whole.
async fn gate(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    let traffic = gate.guard.settings().traffic.clone();
    let gateway = traffic::gateway_of(gate.group);
    let count = |caller: Option<&Caller>, outcome: Outcome| {
        if let Some(t) = &traffic {
            t.observe(gateway, caller.and_then(|c| c.key(false)).as_ref(), outcome);
        }
    };
    let ip = request.extensions().get::<PeerInfo>().map(|p| p.addr.ip());
    let has_body = request.body().size_hint().exact() != Some(0);
    // Answered from the head: the body, if any, was not read, so the connection closes.
    let early = |refused: Refused, headers: &HeaderMap| {
        let response = (gate.render)(&refused, headers);
        if has_body {
            closing(response)
        } else {
            response
        }
    };
    let caller = match gate.caller(&request, ip) {
        Ok(c) => c,
        Err(refusal) => {
            count(None, Outcome::Refused);
            return early(Refused::Caller(refusal), request.headers());
        }
    };
    if let Err(refused) = gate.rate(&caller) {
        count(Some(&caller), Outcome::Refused);
        return early(refused, request.headers());
    }
    let posts = matches!(
        *request.method(),
        Method::POST | Method::PUT | Method::PATCH
    );
    if posts && !json_content_type(request.headers()) {
        let found = request
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        count(Some(&caller), Outcome::Refused);
        return early(Refused::NotJson(found), request.headers());
    }
    let (mut parts, body) = request.into_parts();
    let body = if has_body {
        let deadline = gate.guard.settings().body_timeout;
        match read_body(&parts.headers, body, gate.max_body, deadline).await {
            Ok(bytes) => Body::from(bytes),
            Err(e) => {
                let refused = match e {
                    BodyError::TooLarge(_) => Refused::TooLarge { max: gate.max_body },
                    BodyError::Timeout => Refused::Timeout { deadline },
                    BodyError::Broken => Refused::Broken,
                };
                count(Some(&caller), Outcome::Refused);
                return closing((gate.render)(&refused, &parts.headers));
            }
        }
    } else {
        body
    };
    let key = traffic.as_ref().and_then(|_| caller.key(false));
    parts.extensions.insert(caller);
    let response = next.run(Request::from_parts(parts, body)).await;
    if let Some(t) = &traffic {
        let outcome = if response.status().as_u16() >= 400 {
            Outcome::Error
        } else {
            Outcome::Ok
        };
        t.observe(gateway, key.as_ref(), outcome);
    }
    response
}

/// One gateway route behind a [`Gate`], as listed by [`Gated::routes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatedRoute {
    /// The method.
    pub method: Method,
    /// The path, as given to axum (`{agent}`, `{*rest}`).
    pub path: &'static str,
    /// The route group (its gate).
    pub group: &'static str,
    /// The group's body cap.
    pub max_body: usize,
}

/// The one way a gateway's HTTP routes are built: every route added here is behind the
/// group's [`Gate`], and listed.
pub struct GatedRoutes<S> {
    group: &'static str,
    gate: Gate,
    router: HttpRouter<S>,
    routes: Vec<GatedRoute>,
}

impl<S> std::fmt::Debug for GatedRoutes<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatedRoutes")
            .field("group", &self.group)
            .field("gate", &self.gate)
            .field("routes", &self.routes)
            .finish_non_exhaustive()
    }
}

impl<S: Clone + Send + Sync + 'static> GatedRoutes<S> {
    /// An empty group named `group`, behind `gate`.
    pub fn new(group: &'static str, mut gate: Gate) -> Self {
        gate.group = group;
        Self {
            group,
            gate,
            router: HttpRouter::new(),
            routes: Vec::new(),
        }
    }

    fn add(mut self, method: Method, path: &'static str, route: MethodRouter<S>) -> Self {
        self.router = self.router.route(path, route);
        self.routes.push(GatedRoute {
            method,
            path,
            group: self.group,
            max_body: self.gate.max_body,
        });
        self
    }

    /// `GET path`.
    pub fn get<H, T>(self, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, S>,
        T: 'static,
    {
        self.add(Method::GET, path, axum::routing::get(handler))
    }

    /// `POST path`.
    pub fn post<H, T>(self, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, S>,
        T: 'static,
    {
        self.add(Method::POST, path, axum::routing::post(handler))
    }

    /// `DELETE path`.
    pub fn delete<H, T>(self, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, S>,
        T: 'static,
    {
        self.add(Method::DELETE, path, axum::routing::delete(handler))
    }

    /// The group's routes over `state`, behind its gate. The gate reads bodies with its own
    /// cap, so axum's default body limit is lifted for these routes.
    pub fn with_state(self, state: S) -> Gated {
        let router = self
            .router
            .route_layer(DefaultBodyLimit::disable())
            .route_layer(axum::middleware::from_fn_with_state(self.gate, gate))
            .with_state(state);
        Gated {
            router,
            routes: self.routes,
        }
    }
}

/// Gateway routes, each behind its group's gate, and their list.
#[derive(Debug, Default)]
pub struct Gated {
    /// The routes, to merge into the server's router.
    pub router: HttpRouter,
    /// What they are.
    pub routes: Vec<GatedRoute>,
}

impl Gated {
    /// Both sets.
    pub fn merge(mut self, other: Gated) -> Gated {
        self.router = self.router.merge(other.router);
        self.routes.extend(other.routes);
        self
    }
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
