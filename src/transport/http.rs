//! HTTP + Server-Sent Events transport: `POST /map/rpc` for calls, `GET /map/events` for the
//! notifications the router queues, `DELETE /map/session` to leave.
//!
//! Owns the HTTP side only: the table of HTTP connections, their tokens, bodies, status codes,
//! the SSE framing and the replay ring. It never touches routing state: each HTTP connection
//! (`HttpConn`) is an ordinary router connection (`Command::Attach` with its own outbox) with
//! an [`RpcSession`], exactly like a WebSocket. It does not use the stream driver of
//! [`super::connection`] (a POST is not a frame on a stream), but the same pieces: `RpcSession`
//! for JSON-RPC, the outbox for everything the router sends, `Command::Drained` for room.
//!
//! Decisions:
//! - **Identity.** An HTTP connection is named by an opaque random token, returned in the
//!   `MAP-Session` response header and as the cookie `map_session` (`Path=/map; HttpOnly;
//!   SameSite=Strict`); requests send it back in `MAP-Session` (preferred) or the cookie. An
//!   HTTP connection exists only while it holds a MAP session: a token-less POST that does not
//!   end connected (no successful `map/connect`) is detached at once and gets no token, so
//!   random POSTs leave no state; a POST that ends the MAP session (`map/disconnect`) closes the
//!   HTTP connection and clears the cookie.
//! - **Responses go in the POST body**, not the outbox: `RpcSession::handle`, then the
//!   follow-ups (`RpcSession::deliver` with the response taken out). 200 with the frame, 202
//!   with no body when nothing answers (notifications only). What is refused before the JSON-RPC
//!   layer gets a 4xx with a JSON-RPC error body (`id: null`): 404 unknown token, 413 body above
//!   `max_frame_bytes` (-32600), 400 body not UTF-8 (-32700); everything the JSON-RPC layer
//!   answers, errors included, is a 200. POSTs of one connection run one at a time, in
//!   arrival order, each in its own task so a client that hangs up cannot cancel a call
//!   half-way.
//! - **Events.** `GET /map/events` streams the outbox as SSE: `id: <n>`, `event: <method>`,
//!   `data: <the whole JSON-RPC notification>`. It drains in batches and, like the WebSocket
//!   writer, sends `Command::Drained` after a batch when the router asked for room. While no
//!   stream is attached the outbox fills and the router pauses subscriptions (their events wait
//!   in its log): nothing is lost. One stream per connection: a new GET ends the previous one.
//!   Keep-alive comments every 15 s. A stream ends with `event: close` (`{code, reason}`) on
//!   shutdown (1001), when replaced or closed (1000), or when the MAP session was resumed on
//!   another connection (the router's 4000); the connection is then closed as well.
//! - **Resume is by frame counter, not MAP event id.** `n` counts frames per HTTP connection.
//!   One connection carries several subscriptions whose deliveries interleave out of log order
//!   when a paused subscription catches up, so no single event id is a consistent resume point.
//!   A bounded ring keeps the last frames written (1024 frames, 4 MiB); `Last-Event-ID: n`
//!   resends the frames after `n`, then continues live. When `n` is older than the ring, an
//!   `event: gap` with `{"lastEventId":n,"firstAvailable":m}` comes first: never a silent
//!   hole. Every `map/event` still carries its `eventId`, usable with `map/replay`.
//! - **Expiry.** A connection with no POST in flight and no stream for `idle_timeout` (60 s
//!   when unset) is detached, and so is one whose stream has not been able to write for
//!   `idle_timeout` beyond a keep-alive period (a peer that stopped reading). The router then
//!   applies its transport-loss rules; the MAP session can be resumed with its `resumeToken`
//!   from a new HTTP connection. A periodic sweep (a quarter of the timeout, at most 1 s) does it.
//! - **Limits.** A new HTTP session takes a network-connection slot (`transport::admission`)
//!   for as long as it lives, like a WebSocket does; over the limit its `map/connect` POST is
//!   answered `503` / `429` with a JSON-RPC error body. A request body must arrive within
//!   `body_timeout` (else `408`). Depth and rate limits are the same as on every transport.
//! - **Shutdown.** Streams flush what is queued, send `event: close`, and end; every
//!   connection is detached. Drain guards are held only by live connections, streams and
//!   in-flight POSTs, so `Server::shutdown` can finish.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Extension, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router as HttpRouter;
use bytes::BytesMut;
use futures::StreamExt;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::protocol::ids::random_token;
use crate::protocol::jsonrpc::ErrorObject;
use crate::protocol::methods::notifications;
use crate::router::outbox::outbox;
use crate::router::outbox::Outbound;
use crate::router::outbox::OutboxReceiver;
use crate::router::rpc::RpcSession;
use crate::router::rpc::SessionLimits;
use crate::router::sessions::table::{ConnOrigin, Transport};
use crate::router::Command;
use crate::router::ConnId;
use crate::router::RouterError;
use crate::transport::admission::PeerInfo;
use crate::transport::admission::{Admission, Slot};
use crate::transport::connection::ConnectionOptions;
use crate::transport::TransportContext;

/// Path of the JSON-RPC endpoint.
pub const RPC_PATH: &str = "/map/rpc";
/// Path of the event stream.
pub const EVENTS_PATH: &str = "/map/events";
/// Path of the session resource (`DELETE` closes it).
pub const SESSION_PATH: &str = "/map/session";
/// Request and response header carrying the HTTP connection token.
pub const SESSION_HEADER: &str = "map-session";
/// Cookie carrying the same token, for browsers.
pub const SESSION_COOKIE: &str = "map_session";

/// Default replay ring size in frames: a reconnect after a short network blip (seconds of
/// events at a busy rate) finds everything it missed.
pub const DEFAULT_RING_FRAMES: usize = 1024;
/// Default replay ring size in bytes: bounds the memory a connection pins when its frames are
/// large (1024 frames of 4 KiB).
pub const DEFAULT_RING_BYTES: usize = 4 << 20;
/// Default SSE keep-alive interval: below the 30-60 s idle cut-offs of common proxies.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Idle timeout when the connection options set none: an HTTP connection has no socket whose
/// loss would tell us the peer left, so it always expires.
pub const DEFAULT_HTTP_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings specific to the HTTP transport.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Frames kept per connection for `Last-Event-ID` resume.
    pub ring_frames: usize,
    /// Bytes kept per connection for resume (the ring drops its oldest frames beyond this).
    pub ring_bytes: usize,
    /// Interval of SSE keep-alive comments.
    pub keep_alive: Duration,
    /// Counters that HTTP sessions take a place in (`None`: not counted).
    pub admission: Option<Arc<Admission>>,
    /// A request body must arrive within this (`None`: no limit).
    pub body_timeout: Option<Duration>,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            ring_frames: DEFAULT_RING_FRAMES,
            ring_bytes: DEFAULT_RING_BYTES,
            keep_alive: DEFAULT_KEEP_ALIVE,
            admission: None,
            body_timeout: Some(Duration::from_secs(10)),
        }
    }
}

/// The HTTP+SSE routes with default [`HttpSettings`], to merge into the server's router.
pub fn routes(ctx: TransportContext, options: ConnectionOptions) -> HttpRouter {
    routes_with(ctx, options, HttpSettings::default())
}

/// The HTTP+SSE routes with explicit settings.
pub fn routes_with(
    ctx: TransportContext,
    options: ConnectionOptions,
    settings: HttpSettings,
) -> HttpRouter {
    let hard = crate::transport::ws::hard_limit(options.max_frame_bytes);
    let shared = Arc::new(Shared {
        ctx,
        options,
        settings,
        table: Mutex::new(Table::default()),
        sweeper_started: AtomicBool::new(false),
    });
    HttpRouter::new()
        .route(RPC_PATH, post(post_rpc))
        .route(EVENTS_PATH, get(get_events))
        .route(SESSION_PATH, delete(delete_session))
        // NB: we read the body ourselves and answer oversize bodies with a JSON-RPC 413; axum's
        // 2 MB default must never answer first.
        .layer(DefaultBodyLimit::max(hard))
        .with_state(shared)
}

/// State shared by the routes.
#[derive(Debug)]
struct Shared {
    /// Router, method table, shutdown signal; a tracker token is held by each live
    /// connection, stream and POST.
    ctx: TransportContext,
    options: ConnectionOptions,
    settings: HttpSettings,
    /// Live HTTP connections by token. A std mutex: never held across an await.
    table: Mutex<Table>,
    /// The sweep task starts with the first connection (routes may be built outside a runtime).
    sweeper_started: AtomicBool,
}

#[derive(Debug, Default)]
struct Table {
    conns: HashMap<Arc<str>, Arc<HttpConn>>,
    /// Set once on shutdown: no connection is added afterwards.
    shut: bool,
}

/// One HTTP connection: a router connection with its JSON-RPC session and event pump.
#[derive(Debug)]
struct HttpConn {
    conn: ConnId,
    token: Arc<str>,
    /// POSTs take this in arrival order (tokio's mutex is fair), so calls apply one at a time.
    rpc: tokio::sync::Mutex<RpcSession>,
    /// The outbox receiver, frame counter and ring. Held by a stream only while it takes a
    /// batch, never while the peer's socket is blocked, so a new stream can always take over.
    pump: tokio::sync::Mutex<Pump>,
    activity: Mutex<Activity>,
    /// Bumped by each GET; a stream whose number is no longer current ends.
    generation: watch::Sender<u64>,
    /// Flips to true when the connection is closed (detached).
    closed: watch::Sender<bool>,
    /// Keeps `Server::shutdown` waiting while the connection lives; dropped on close.
    drain_guard: Mutex<Option<TaskTrackerToken>>,
    /// Its place among the server's network connections, released with the connection.
    _slot: Option<Slot>,
}

#[derive(Debug)]
struct Activity {
    in_flight: usize,
    streams: usize,
    /// When the last POST or stream ended (or the connection was created).
    idle_since: Instant,
    /// When the attached stream last asked for more to write.
    progress: Instant,
}

/// The event side of a connection: the outbox receiver, the frame counter, and the replay ring
/// of rendered SSE frames with their numbers.
#[derive(Debug)]
struct Pump {
    rx: OutboxReceiver,
    /// The number of the next frame; frames are numbered from 1.
    next_id: u64,
    ring: VecDeque<(u64, Bytes)>,
    ring_bytes: usize,
    max_frames: usize,
    max_bytes: usize,
}

use crate::sync::lock;

impl Shared {
    fn idle_timeout(&self) -> Duration {
        self.options
            .idle_timeout
            .unwrap_or(DEFAULT_HTTP_IDLE_TIMEOUT)
    }

    /// Looks a token up and marks the connection in use (a POST or a stream) until the guard
    /// drops. Under the table lock, so the sweep cannot expire it in between.
    fn checkout(self: &Arc<Self>, token: &str, kind: Use) -> Option<InUse> {
        let table = lock(&self.table);
        let conn = table.conns.get(token)?.clone();
        let mut a = lock(&conn.activity);
        match kind {
            Use::Post => a.in_flight += 1,
            Use::Stream => {
                a.streams += 1;
                a.progress = Instant::now();
            }
        }
        drop(a);
        Some(InUse {
            conn,
            kind,
            _drain_guard: self.ctx.connections.token(),
        })
    }

    /// Adds a connection; false after shutdown.
    fn insert(self: &Arc<Self>, conn: Arc<HttpConn>) -> bool {
        {
            let mut table = lock(&self.table);
            if table.shut {
                return false;
            }
            table.conns.insert(conn.token.clone(), conn);
        }
        if !self.sweeper_started.swap(true, Ordering::AcqRel) {
            let every =
                (self.idle_timeout() / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
            tokio::spawn(sweep(
                Arc::downgrade(self),
                self.ctx.shutdown.clone(),
                every,
            ));
        }
        true
    }

    /// Removes the connection from the table and closes it.
    async fn close(&self, conn: &HttpConn) {
        let removed = {
            let mut table = lock(&self.table);
            match table.conns.get(&conn.token) {
                Some(c) if std::ptr::eq(Arc::as_ptr(c), conn) => table.conns.remove(&conn.token),
                _ => None,
            }
        };
        drop(removed);
        self.detach(conn).await;
    }

    /// Closes a connection already removed from the table: wakes its stream, detaches it from
    /// the router (which applies its transport-loss rules) and drops its drain guard. Idempotent.
    async fn detach(&self, conn: &HttpConn) {
        if conn.closed.send_replace(true) {
            return;
        }
        let _ = self
            .ctx
            .router
            .send(Command::Detach { conn: conn.conn })
            .await;
        lock(&conn.drain_guard).take();
        tracing::debug!(conn = %conn.conn, "HTTP connection closed");
    }

    /// Detaches connections that have been idle too long, or whose stream stopped writing.
    async fn expire_idle(&self) {
        let idle = self.idle_timeout();
        let stalled = idle + self.settings.keep_alive;
        let now = Instant::now();
        let expired: Vec<Arc<HttpConn>> = {
            let mut table = lock(&self.table);
            let tokens: Vec<Arc<str>> = table
                .conns
                .iter()
                .filter(|(_, c)| {
                    let a = lock(&c.activity);
                    a.in_flight == 0
                        && ((a.streams == 0 && now.duration_since(a.idle_since) >= idle)
                            || (a.streams > 0 && now.duration_since(a.progress) >= stalled))
                })
                .map(|(t, _)| t.clone())
                .collect();
            tokens
                .iter()
                .filter_map(|t| table.conns.remove(t))
                .collect()
        };
        for conn in expired {
            tracing::debug!(conn = %conn.conn, "HTTP connection expired");
            self.detach(&conn).await;
        }
    }

    /// Shutdown: no new connections, every connection detached.
    async fn close_all(&self) {
        let all: Vec<Arc<HttpConn>> = {
            let mut table = lock(&self.table);
            table.shut = true;
            table.conns.drain().map(|(_, c)| c).collect()
        };
        for conn in all {
            self.detach(&conn).await;
        }
    }
}

/// The periodic sweep: expiry, then everything on shutdown. Holds only a weak reference, so it
/// keeps neither the routes nor a drain guard alive.
async fn sweep(shared: Weak<Shared>, mut shutdown: watch::Receiver<bool>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stop = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => true,
            _ = tick.tick() => false,
        };
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if stop {
            shared.close_all().await;
            return;
        }
        shared.expire_idle().await;
    }
}

#[derive(Debug, Clone, Copy)]
enum Use {
    Post,
    Stream,
}

/// A connection in use by a POST or a stream; releases it (and its drain guard) on drop.
#[derive(Debug)]
struct InUse {
    conn: Arc<HttpConn>,
    kind: Use,
    _drain_guard: TaskTrackerToken,
}

impl Drop for InUse {
    fn drop(&mut self) {
        let mut a = lock(&self.conn.activity);
        match self.kind {
            Use::Post => a.in_flight = a.in_flight.saturating_sub(1),
            Use::Stream => a.streams = a.streams.saturating_sub(1),
        }
        a.idle_since = Instant::now();
    }
}

// ---------------------------------------------------------------------------------------------
// Tokens, cookies, responses.

/// The token a request carries: the `MAP-Session` header, else the `map_session` cookie.
fn request_token(headers: &HeaderMap) -> Option<String> {
    if let Some(v) = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) {
        let v = v.trim();
        if !v.is_empty() {
            return Some(v.to_owned());
        }
    }
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, value)| *name == SESSION_COOKIE && !value.is_empty())
        .map(|(_, value)| value.trim_matches('"').to_owned())
}

/// What a response says about the token.
enum TokenHeaders<'a> {
    /// The connection lives: header and cookie.
    Set(&'a str),
    /// The connection is gone: expire the cookie.
    Clear,
}

fn with_token(mut response: Response, token: TokenHeaders<'_>) -> Response {
    let headers = response.headers_mut();
    match token {
        TokenHeaders::Set(token) => {
            // Tokens are ours (hex), so they are always valid header values.
            if let Ok(v) = HeaderValue::from_str(token) {
                headers.insert(SESSION_HEADER, v);
            }
            let cookie = format!("{SESSION_COOKIE}={token}; Path=/map; HttpOnly; SameSite=Strict");
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                headers.append(SET_COOKIE, v);
            }
        }
        TokenHeaders::Clear => {
            headers.append(
                SET_COOKIE,
                HeaderValue::from_static(
                    "map_session=; Path=/map; Max-Age=0; HttpOnly; SameSite=Strict",
                ),
            );
        }
    }
    response
}

fn json_response(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (CONTENT_TYPE, HeaderValue::from_static("application/json")),
            (CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response()
}

/// A JSON-RPC error with `id: null` under an HTTP status.
fn error_response(status: StatusCode, error: &ErrorObject) -> Response {
    let body = RpcSession::error(error).response.unwrap_or_default();
    json_response(status, body)
}

fn unknown_session() -> Response {
    with_token(
        error_response(
            StatusCode::NOT_FOUND,
            &ErrorObject::invalid_request(
                "unknown or expired HTTP session; call map/connect without MAP-Session",
            ),
        ),
        TokenHeaders::Clear,
    )
}

fn unavailable() -> Response {
    error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &RouterError::Unavailable.to_error_object(),
    )
}

fn too_large(len: Option<usize>, limit: usize) -> Response {
    let detail = match len {
        Some(len) => format!("request body of {len} bytes exceeds the limit of {limit} bytes"),
        None => format!("request body exceeds the limit of {limit} bytes"),
    };
    error_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        &ErrorObject::invalid_request(detail),
    )
}

// ---------------------------------------------------------------------------------------------
// POST /map/rpc

enum BodyError {
    /// Larger than the hard limit (the exact size when the client declared it).
    TooLarge(Option<usize>),
    /// The client went away mid-body.
    Broken,
}

/// Reads the body up to `hard` bytes. Bodies between the frame limit and `hard` are read whole
/// so the 413 reaches a client that writes its body before reading.
async fn read_body(headers: &HeaderMap, body: Body, hard: usize) -> Result<Vec<u8>, BodyError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > hard) {
        return Err(BodyError::TooLarge(declared));
    }
    let mut out = Vec::with_capacity(declared.unwrap_or(0));
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| BodyError::Broken)?;
        if out.len() + chunk.len() > hard {
            return Err(BodyError::TooLarge(declared));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Whether `headers` declare a JSON body (`application/json`, or `application/<x>+json`, with
/// any parameters). An HTML form or a `no-cors` fetch can only send other types (or none)
/// without a CORS preflight, so requiring this keeps other sites' pages out (issue 23, M5).
pub fn json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

async fn post_rpc(
    State(shared): State<Arc<Shared>>,
    peer: Option<Extension<PeerInfo>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if !json_content_type(&headers) {
        return error_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &ErrorObject::invalid_request(
                "the request body must be sent with Content-Type: application/json",
            ),
        );
    }
    let peer = peer.map(|Extension(p)| p.addr);
    let limit = shared.options.max_frame_bytes;
    let read = read_body(&headers, body, crate::transport::ws::hard_limit(limit));
    let read = match shared.settings.body_timeout {
        Some(t) => tokio::time::timeout(t, read).await.ok(),
        None => Some(read.await),
    };
    let Some(read) = read else {
        return error_response(
            StatusCode::REQUEST_TIMEOUT,
            &ErrorObject::invalid_request("the request body did not arrive in time"),
        );
    };
    let body = match read {
        Ok(body) => body,
        Err(BodyError::TooLarge(len)) => return too_large(len, limit),
        Err(BodyError::Broken) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                &ErrorObject::invalid_request("the request body could not be read"),
            )
        }
    };
    let existing = match request_token(&headers) {
        Some(token) => match shared.checkout(&token, Use::Post) {
            Some(in_use) => Some(in_use),
            None => return unknown_session(),
        },
        None => None,
    };
    let token_headers = |r: Response| match &existing {
        Some(u) => with_token(r, TokenHeaders::Set(&u.conn.token)),
        None => r,
    };
    if body.len() > limit {
        return token_headers(too_large(Some(body.len()), limit));
    }
    let text = match String::from_utf8(body) {
        Ok(text) => text,
        Err(_) => {
            return token_headers(error_response(
                StatusCode::BAD_REQUEST,
                &ErrorObject::parse_error("request body is not valid UTF-8"),
            ))
        }
    };
    if existing.is_none() && *shared.ctx.shutdown.borrow() {
        return unavailable();
    }
    // NB: in its own task, so a client hanging up cannot cancel a call between the router
    // applying it and the follow-ups (or leave a fresh connection attached).
    let task = tokio::spawn(async move {
        match existing {
            Some(in_use) => post_existing(&shared, in_use, text).await,
            None => post_new(&shared, text, peer).await,
        }
    });
    task.await.unwrap_or_else(|e| {
        tracing::error!(error = %e, "HTTP request task failed");
        error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &ErrorObject::internal("request handling failed"),
        )
    })
}

/// The POST's response: 200 with the frame, or 202 with nothing.
fn rpc_response(frame: Option<String>) -> Response {
    match frame {
        Some(frame) => json_response(StatusCode::OK, frame),
        None => (
            StatusCode::ACCEPTED,
            [(CACHE_CONTROL, HeaderValue::from_static("no-store"))],
        )
            .into_response(),
    }
}

/// Handles one body on a session: the response, then the follow-ups (which must run once the
/// response exists: a subscription activates only after its response is ready).
async fn handle_on(rpc: &mut RpcSession, text: &str) -> Option<String> {
    let mut handled = rpc.handle(text).await;
    let response = handled.response.take();
    // With the response taken out, `deliver` only runs the follow-ups.
    let _ = rpc.deliver(handled).await;
    response
}

async fn post_existing(shared: &Arc<Shared>, in_use: InUse, text: String) -> Response {
    let conn = in_use.conn.clone();
    let (frame, connected) = {
        let mut rpc = conn.rpc.lock().await;
        let frame = handle_on(&mut rpc, &text).await;
        (frame, rpc.is_connected())
    };
    drop(in_use);
    if connected && !*conn.closed.borrow() {
        with_token(rpc_response(frame), TokenHeaders::Set(&conn.token))
    } else {
        // The MAP session ended (map/disconnect), or the connection was closed meanwhile.
        shared.close(&conn).await;
        with_token(rpc_response(frame), TokenHeaders::Clear)
    }
}

async fn post_new(
    shared: &Arc<Shared>,
    text: String,
    peer: Option<std::net::SocketAddr>,
) -> Response {
    let _drain_guard = shared.ctx.connections.token();
    let slot = match &shared.settings.admission {
        Some(admission) => match admission.admit(peer.map(|p| p.ip())) {
            Ok(slot) => Some(slot),
            Err(refusal) => return crate::transport::admission::refusal_response(refusal),
        },
        None => None,
    };
    let router = &shared.ctx.router;
    let conn = router.new_conn_id();
    let (tx, rx) = outbox(router.config().outbox_frames);
    if router
        .send(Command::Attach {
            conn,
            outbox: tx.clone(),
            // An HTTP peer is never a supervised child's pipes.
            origin: ConnOrigin::Remote,
            transport: Transport::Http,
            node: None,
        })
        .await
        .is_err()
    {
        return unavailable();
    }
    let mut rpc = RpcSession::new(
        router.clone(),
        shared.ctx.dispatcher.clone(),
        conn,
        tx,
        shared.options.max_batch,
    )
    .with_limits(SessionLimits {
        max_depth: shared.options.max_depth,
        rate: shared.options.rate.connection(peer.map(|p| p.ip())),
        ..SessionLimits::default()
    });
    let frame = handle_on(&mut rpc, &text).await;
    if !rpc.is_connected() {
        // No MAP session: keep nothing.
        let _ = router.send(Command::Detach { conn }).await;
        return rpc_response(frame);
    }
    let now = Instant::now();
    let http = Arc::new(HttpConn {
        conn,
        token: random_token("http_").into(),
        rpc: tokio::sync::Mutex::new(rpc),
        pump: tokio::sync::Mutex::new(Pump::new(rx, &shared.settings)),
        activity: Mutex::new(Activity {
            in_flight: 0,
            streams: 0,
            idle_since: now,
            progress: now,
        }),
        generation: watch::Sender::new(0),
        closed: watch::Sender::new(false),
        drain_guard: Mutex::new(Some(shared.ctx.connections.token())),
        _slot: slot,
    });
    if !shared.insert(http.clone()) {
        // Shutting down: the session was created and is detached at once (resumable).
        shared.detach(&http).await;
        return rpc_response(frame);
    }
    tracing::debug!(%conn, "HTTP connection opened");
    with_token(rpc_response(frame), TokenHeaders::Set(&http.token))
}

// ---------------------------------------------------------------------------------------------
// DELETE /map/session

async fn delete_session(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let Some(in_use) = request_token(&headers).and_then(|t| shared.checkout(&t, Use::Post)) else {
        return unknown_session();
    };
    let conn = in_use.conn.clone();
    drop(in_use);
    shared.close(&conn).await;
    with_token(StatusCode::NO_CONTENT.into_response(), TokenHeaders::Clear)
}

// ---------------------------------------------------------------------------------------------
// GET /map/events

async fn get_events(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let Some(in_use) = request_token(&headers).and_then(|t| shared.checkout(&t, Use::Stream))
    else {
        return unknown_session();
    };
    let resume = match headers.get("last-event-id").map(|v| v.to_str()) {
        None => None,
        Some(Ok(v)) if v.trim().is_empty() => None,
        Some(Ok(v)) => match v.trim().parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    &ErrorObject::invalid_request(
                        "Last-Event-ID must be a frame number sent on this stream",
                    ),
                )
            }
        },
        Some(Err(_)) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                &ErrorObject::invalid_request("Last-Event-ID is not valid text"),
            )
        }
    };
    let conn = in_use.conn.clone();
    let mut mine = 0;
    // NB: ends the previous stream (it sees the number change), which releases the pump.
    conn.generation.send_modify(|g| {
        *g += 1;
        mine = *g;
    });
    let stream = EventStream {
        signals: EndSignals {
            generation: mine,
            generation_rx: conn.generation.subscribe(),
            closed: conn.closed.subscribe(),
            shutdown: shared.ctx.shutdown.clone(),
            gone: None,
        },
        shared,
        conn,
        resume,
        started: false,
        done: false,
        _in_use: in_use,
    };
    let body = Body::from_stream(futures::stream::unfold(stream, EventStream::next_chunk));
    (
        [
            (CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
            (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            // Proxies such as nginx must not buffer the stream.
            (
                axum::http::HeaderName::from_static("x-accel-buffering"),
                HeaderValue::from_static("no"),
            ),
        ],
        body,
    )
        .into_response()
}

/// Why a stream ends.
#[derive(Debug, Clone, Copy)]
enum End {
    Shutdown,
    Closed,
    Replaced,
}

#[derive(Debug)]
struct EndSignals {
    generation: u64,
    generation_rx: watch::Receiver<u64>,
    closed: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
    /// Set when a sender is gone (a dropped server counts as a shutdown), so `check` agrees
    /// with `ended` and nothing spins.
    gone: Option<End>,
}

impl EndSignals {
    fn check(&self) -> Option<End> {
        if self.gone.is_some() {
            self.gone
        } else if *self.shutdown.borrow() {
            Some(End::Shutdown)
        } else if *self.closed.borrow() {
            Some(End::Closed)
        } else if *self.generation_rx.borrow() != self.generation {
            Some(End::Replaced)
        } else {
            None
        }
    }

    /// Waits until the stream must end.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits on watch channels.
    async fn ended(&mut self) -> End {
        loop {
            if let Some(end) = self.check() {
                return end;
            }
            let gone = tokio::select! {
                r = self.shutdown.changed() => r.err().map(|_| End::Shutdown),
                r = self.closed.changed() => r.err().map(|_| End::Closed),
                r = self.generation_rx.changed() => r.err().map(|_| End::Closed),
            };
            if let Some(end) = gone {
                self.gone = Some(end);
                return end;
            }
        }
    }
}

/// One SSE response body.
#[derive(Debug)]
struct EventStream {
    shared: Arc<Shared>,
    conn: Arc<HttpConn>,
    signals: EndSignals,
    /// `Last-Event-ID`, used once.
    resume: Option<u64>,
    started: bool,
    done: bool,
    /// Counts as an attached stream (no idle expiry) and holds a drain guard until dropped.
    _in_use: InUse,
}

impl EventStream {
    /// The next chunk of the body: a batch of frames, a keep-alive, or the final `close`.
    async fn next_chunk(mut self) -> Option<(Result<Bytes, Infallible>, Self)> {
        if self.done {
            return None;
        }
        lock(&self.conn.activity).progress = Instant::now();
        let conn = self.conn.clone();
        let chunk = loop {
            if let Some(end) = self.signals.check() {
                self.done = true;
                break self.finish(end).await;
            }
            let mut pump = tokio::select! {
                biased;
                _ = self.signals.ended() => continue,
                pump = conn.pump.lock() => pump,
            };
            if self.signals.check().is_some() {
                continue;
            }
            let mut out = BytesMut::new();
            if !self.started {
                self.started = true;
                out.extend_from_slice(b": map-router event stream\n\n");
                if let Some(last) = self.resume.take() {
                    pump.replay_after(last, &mut out);
                }
                break out.freeze();
            }
            let first = tokio::select! {
                biased;
                _ = self.signals.ended() => continue,
                item = pump.rx.recv() => item,
                () = tokio::time::sleep(self.shared.settings.keep_alive) => {
                    break Bytes::from_static(b": keep-alive\n\n");
                }
            };
            let Some(first) = first else {
                self.done = true;
                drop(pump);
                break self.finish(End::Closed).await;
            };
            let mut closing = pump.take_batch(first, self.shared.options.write_batch, &mut out);
            if pump.rx.take_wakeup() {
                let drained = Command::Drained { conn: conn.conn };
                if self.shared.ctx.router.send(drained).await.is_err() {
                    closing.get_or_insert((1001, "server shutting down".into()));
                }
            }
            drop(pump);
            if let Some((code, reason)) = closing {
                // The router closed this connection (its MAP session was resumed elsewhere).
                render_close(&mut out, code, &reason);
                self.done = true;
                self.shared.close(&conn).await;
            }
            break out.freeze();
        };
        Some((Ok(chunk), self))
    }

    /// The last chunk: on shutdown or close, what is already queued (bounded), then `close`.
    async fn finish(&mut self, end: End) -> Bytes {
        let mut out = BytesMut::new();
        if matches!(end, End::Shutdown | End::Closed) {
            let limit = self.shared.options.drain_timeout;
            if let Ok(mut pump) = tokio::time::timeout(limit, self.conn.pump.lock()).await {
                let capacity = self.shared.ctx.router.config().outbox_frames;
                for _ in 0..capacity {
                    let Some(item) = pump.rx.try_recv() else {
                        break;
                    };
                    if pump.record(item, &mut out).is_some() {
                        break;
                    }
                }
            }
        }
        let (code, reason) = match end {
            End::Shutdown => (1001, "server shutting down"),
            End::Closed => (1000, "HTTP session closed"),
            End::Replaced => (1000, "replaced by a newer event stream"),
        };
        render_close(&mut out, code, reason);
        out.freeze()
    }
}

// ---------------------------------------------------------------------------------------------
// Frames, the ring, SSE text.

impl Pump {
    fn new(rx: OutboxReceiver, settings: &HttpSettings) -> Self {
        Self {
            rx,
            next_id: 1,
            ring: VecDeque::new(),
            ring_bytes: 0,
            max_frames: settings.ring_frames,
            max_bytes: settings.ring_bytes,
        }
    }

    /// Numbers `first` and up to `batch - 1` more ready items, renders them into `out` and
    /// keeps them in the ring. Returns the close the router asked for, if one came.
    fn take_batch(
        &mut self,
        first: Outbound,
        batch: usize,
        out: &mut BytesMut,
    ) -> Option<(u16, String)> {
        let mut item = first;
        for _ in 0..batch.max(1) {
            if let Some(close) = self.record(item, out) {
                return Some(close);
            }
            match self.rx.try_recv() {
                Some(next) => item = next,
                None => break,
            }
        }
        None
    }

    /// Renders one item as a numbered SSE frame into `out` and the ring.
    fn record(&mut self, item: Outbound, out: &mut BytesMut) -> Option<(u16, String)> {
        let (event, text) = match item {
            Outbound::Close { code, reason } => return Some((code, reason)),
            // An event stream's keep-alive is its own (a comment line on a timer).
            Outbound::Ping => return None,
            Outbound::Event(delivery) => {
                let mut text = String::new();
                delivery.encode(&mut text);
                (notifications::EVENT.to_owned(), text)
            }
            other => {
                let text = other.into_text().unwrap_or_default();
                (method_of(&text), text)
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        let mut frame = BytesMut::with_capacity(text.len() + event.len() + 32);
        render(&mut frame, Some(id), &event, &text);
        let frame = frame.freeze();
        out.extend_from_slice(&frame);
        self.ring_bytes += frame.len();
        self.ring.push_back((id, frame));
        while self.ring.len() > self.max_frames || self.ring_bytes > self.max_bytes {
            match self.ring.pop_front() {
                Some((_, old)) => self.ring_bytes -= old.len(),
                None => break,
            }
        }
        None
    }

    /// Resends the frames after `last`, preceded by a `gap` event when some of them are no
    /// longer in the ring. Nothing when `last` is the newest frame or beyond.
    fn replay_after(&self, last: u64, out: &mut BytesMut) {
        let newest = self.next_id - 1;
        if last >= newest {
            return;
        }
        // The ring is contiguous: it only ever loses frames at its front.
        let first = self.ring.front().map_or(self.next_id, |(id, _)| *id);
        if last + 1 < first {
            let data = format!("{{\"lastEventId\":{last},\"firstAvailable\":{first}}}");
            render(out, None, "gap", &data);
        }
        let skip = usize::try_from((last + 1).saturating_sub(first)).unwrap_or(usize::MAX);
        for (_, frame) in self.ring.iter().skip(skip) {
            out.extend_from_slice(frame);
        }
    }
}

/// Writes one SSE event. Data with line breaks (whitespace inside a client's raw JSON) becomes
/// several `data:` lines, which the client joins back with `\n`.
fn render(out: &mut BytesMut, id: Option<u64>, event: &str, data: &str) {
    use std::fmt::Write as _;
    let mut head = String::with_capacity(event.len() + 32);
    if let Some(id) = id {
        let _ = writeln!(head, "id: {id}");
    }
    let _ = writeln!(head, "event: {event}");
    out.extend_from_slice(head.as_bytes());
    for line in data.split(['\r', '\n']) {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.as_bytes());
        out.extend_from_slice(b"\n");
    }
    out.extend_from_slice(b"\n");
}

fn render_close(out: &mut BytesMut, code: u16, reason: &str) {
    let reason = serde_json::to_string(reason).unwrap_or_else(|_| "\"\"".into());
    render(
        out,
        None,
        "close",
        &format!("{{\"code\":{code},\"reason\":{reason}}}"),
    );
}

/// The method of a notification frame, for the SSE `event:` field. Frames the router writes
/// start with the envelope in a fixed order, so the common case is a prefix check.
fn method_of(frame: &str) -> String {
    const HEAD: &str = "{\"jsonrpc\":\"2.0\",\"method\":\"";
    let fast = frame
        .strip_prefix(HEAD)
        .and_then(|rest| rest.split_once('"'))
        .map(|(m, _)| m)
        .filter(|m| !m.contains('\\'));
    let method = match fast {
        Some(m) => m.to_owned(),
        None => {
            #[derive(serde::Deserialize)]
            struct Envelope {
                method: Option<String>,
            }
            serde_json::from_str::<Envelope>(frame)
                .ok()
                .and_then(|e| e.method)
                .unwrap_or_default()
        }
    };
    if method.is_empty() || method.contains(['\r', '\n']) {
        "message".to_owned()
    } else {
        method
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(b: &BytesMut) -> String {
        String::from_utf8(b.to_vec()).unwrap()
    }

    fn pump(frames: usize, bytes: usize) -> (crate::router::outbox::Outbox, Pump) {
        let (tx, rx) = outbox(64);
        let settings = HttpSettings {
            ring_frames: frames,
            ring_bytes: bytes,
            ..HttpSettings::default()
        };
        (tx, Pump::new(rx, &settings))
    }

    fn note(n: u32) -> Outbound {
        Outbound::Frame(format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"map/message\",\"params\":{{\"n\":{n}}}}}"
        ))
    }

    #[test]
    fn frames_are_numbered_and_named_by_method() {
        let (_tx, mut p) = pump(8, 1 << 20);
        let mut out = BytesMut::new();
        assert!(p.take_batch(note(1), 8, &mut out).is_none());
        assert_eq!(
            text(&out),
            "id: 1\nevent: map/message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"map/message\",\"params\":{\"n\":1}}\n\n"
        );
    }

    #[test]
    fn replay_resends_after_the_id_and_reports_gaps() {
        let (_tx, mut p) = pump(3, 1 << 20);
        let mut sink = BytesMut::new();
        for n in 1..=5 {
            let _ = p.record(note(n), &mut sink);
        }
        // Ring holds 3, 4, 5.
        let mut out = BytesMut::new();
        p.replay_after(3, &mut out);
        let t = text(&out);
        assert!(
            t.starts_with("id: 4\n") && t.contains("id: 5\n") && !t.contains("gap"),
            "{t}"
        );

        let mut out = BytesMut::new();
        p.replay_after(1, &mut out);
        let t = text(&out);
        assert!(
            t.starts_with("event: gap\ndata: {\"lastEventId\":1,\"firstAvailable\":3}\n\nid: 3\n"),
            "{t}"
        );

        for last in [5, 6, 1000] {
            let mut out = BytesMut::new();
            p.replay_after(last, &mut out);
            assert!(out.is_empty(), "nothing after {last}");
        }
    }

    #[test]
    fn ring_is_bounded_by_bytes() {
        let (_tx, mut p) = pump(100, 200);
        let mut sink = BytesMut::new();
        for n in 1..=10 {
            let _ = p.record(note(n), &mut sink);
        }
        assert!(p.ring_bytes <= 200 && !p.ring.is_empty());
        let first = p.ring.front().unwrap().0;
        assert_eq!(p.ring.back().unwrap().0, 10);
        assert_eq!(p.ring.len() as u64, 10 - first + 1, "contiguous");
    }

    #[test]
    fn multi_line_data_becomes_several_data_lines() {
        let mut out = BytesMut::new();
        render(&mut out, None, "x", "{\n\"a\":1\r\n}");
        assert_eq!(
            text(&out),
            "event: x\ndata: {\ndata: \"a\":1\ndata: \ndata: }\n\n"
        );
    }

    #[test]
    fn method_names() {
        assert_eq!(
            method_of("{\"jsonrpc\":\"2.0\",\"method\":\"map/message\"}"),
            "map/message"
        );
        assert_eq!(method_of("{\"method\":\"a/b\",\"jsonrpc\":\"2.0\"}"), "a/b");
        assert_eq!(method_of("{\"jsonrpc\":\"2.0\"}"), "message");
    }

    #[test]
    fn tokens_come_from_the_header_first_then_the_cookie() {
        let mut h = HeaderMap::new();
        h.insert(COOKIE, HeaderValue::from_static("a=b; map_session=c1"));
        assert_eq!(request_token(&h).as_deref(), Some("c1"));
        h.insert(SESSION_HEADER, HeaderValue::from_static("h1"));
        assert_eq!(request_token(&h).as_deref(), Some("h1"));
        let mut h = HeaderMap::new();
        h.insert(COOKIE, HeaderValue::from_static("map_session="));
        assert_eq!(request_token(&h), None);
    }
}
