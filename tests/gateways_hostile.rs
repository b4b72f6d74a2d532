//! Issue 23 (MAMP and IM) and issue 30's IM path, against hostile callers over real sockets on
//! 127.0.0.1 (and 127.0.0.2, another loopback address, where a second source address is
//! needed). Each finding of the probe has a test that failed on the old code; each asserts what
//! must not happen (a rate limit reported as "not found", a message on the wrong socket, a
//! stalled connection kept, a table growing past its cap, a queued message lost or twice), and
//! a MAP canary (a plain WebSocket client listing agents) must keep answering within 2 s while
//! the attack runs.
//!
//! Time: the tests run in parallel; the longest waits are the default body deadline (10 s, to
//! show a stalled body is cut within 15 s) and the kill -9 rounds.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::http::{connect_from, find, read_response, request_from, HttpResponse};
use common::{start_binary, start_server, with_timeout, within, TempDir, WsClient, QUIET};
use futures::{SinkExt, StreamExt};
use map_router::auth::config::Secret;
use map_router::client::{AgentHandle, Client, ClientOptions};
use map_router::protocol::methods::agents::RegisterParams;
use map_router::protocol::methods::messaging::SendParams;
use map_router::server::{Config, Server};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message as Ws;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const OPS: &str = "key-ops-0123456789";
const ALICE: &str = "key-alice-0123456789";
const BOB: &str = "key-bob-0123456789";
const CAROL: &str = "key-carol-0123456789";
const KEYS: &str = "key-ops-0123456789 ops,key-alice-0123456789 alice,\
                    key-bob-0123456789 bob,key-carol-0123456789 carol";

/// A server on 127.0.0.1:0 with `tweak`; its address and MAP URL.
async fn server(tweak: impl FnOnce(&mut Config)) -> (Server, SocketAddr, String) {
    let (server, url) = start_server(tweak).await;
    let addr = server.local_addrs()[0];
    (server, addr, url)
}

/// Authentication on: API keys for ops (system), alice, bob and carol.
fn with_auth(c: &mut Config) {
    c.auth.api_keys.inline = Some(Secret(KEYS.into()));
    c.auth.system_principals = vec!["ops".into()];
}

// ---------------------------------------------------------------------------------------------
// HTTP as a principal (requests from a chosen loopback address: common::http::request_from)

fn bearer(key: Option<&str>) -> Option<String> {
    key.map(|k| format!("Bearer {k}"))
}

async fn get_as(addr: SocketAddr, path: &str, key: Option<&str>) -> HttpResponse {
    let auth = bearer(key);
    let mut h = Vec::new();
    if let Some(a) = &auth {
        h.push(("Authorization", a.as_str()));
    }
    request_from(None, addr, "GET", path, &h, b"").await
}

async fn post_as(addr: SocketAddr, path: &str, body: &Value, key: Option<&str>) -> HttpResponse {
    post_from(None, addr, path, body, key).await
}

async fn post_from(
    from: Option<IpAddr>,
    addr: SocketAddr,
    path: &str,
    body: &Value,
    key: Option<&str>,
) -> HttpResponse {
    let auth = bearer(key);
    let mut h = vec![("Content-Type", "application/json")];
    if let Some(a) = &auth {
        h.push(("Authorization", a.as_str()));
    }
    request_from(from, addr, "POST", path, &h, body.to_string().as_bytes()).await
}

fn text(r: &HttpResponse) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// The seeds' error body with `status`.
fn assert_error(r: &HttpResponse, status: u16, error: &str) {
    assert_eq!(r.status, status, "{}", text(r));
    let v = r.json();
    assert_eq!(v["error"], error, "{v}");
    assert_eq!(v["status_code"], status, "{v}");
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
}

fn mamp(from: &str, to: &str, content: Value) -> Value {
    static N: AtomicU64 = AtomicU64::new(0);
    json!({
        "protocol": "mamp/1.0",
        "message_id": format!("msg-{}", N.fetch_add(1, Ordering::Relaxed)),
        "from": from,
        "to": to,
        "content": content,
        "metadata": {"timestamp": "2026-03-04T10:00:00Z"},
    })
}

fn encoded(uri: &str) -> String {
    uri.replace(':', "%3A").replace('/', "%2F")
}

/// Polls `GET path` (as `key`) until `pred` holds (bounded).
async fn poll(
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
    pred: impl Fn(&HttpResponse) -> bool,
) -> HttpResponse {
    within(Duration::from_secs(10), async {
        loop {
            let r = get_as(addr, path, key).await;
            if pred(&r) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// MAP

async fn map_agent(url: &str, key: Option<&str>, id: &str) -> (Client, AgentHandle) {
    let mut options = ClientOptions::agent().name(id);
    if let Some(k) = key {
        options = options.api_key(k);
    }
    let client = with_timeout(Client::connect_ws(url, options))
        .await
        .expect("MAP client");
    let agent = with_timeout(client.register(RegisterParams {
        agent_id: Some(id.into()),
        name: Some(id.into()),
        ..RegisterParams::default()
    }))
    .await
    .expect("register");
    (client, agent)
}

/// A MAP client that lists agents every 50 ms until stopped: every call must be answered
/// within 2 s.
struct Canary {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(usize, Duration)>,
}

impl Canary {
    async fn start(url: &str, key: Option<&str>) -> Self {
        let extra = match key {
            Some(k) => json!({"auth": {"method": "api-key", "credential": k}}),
            None => json!({}),
        };
        let mut c = WsClient::connect_as(url, "client", extra).await;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let (mut calls, mut slowest) = (0, Duration::ZERO);
            while !flag.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = within(Duration::from_secs(2), c.call("map/agents/list", json!({}))).await;
                assert!(r.is_ok(), "the MAP canary was refused: {r:?}");
                slowest = slowest.max(t.elapsed());
                calls += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (calls, slowest)
        });
        Self { stop, task }
    }

    /// Stops it; panics if any call failed or took 2 s or more.
    async fn finish(self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        let (calls, slowest) = within(Duration::from_secs(5), self.task)
            .await
            .expect("the canary ran to the end");
        assert!(calls > 0, "the canary made no call");
        assert!(
            slowest < Duration::from_secs(2),
            "slowest MAP call {slowest:?}"
        );
        slowest
    }
}

// ---------------------------------------------------------------------------------------------
// IM WebSockets

async fn ws_as(addr: SocketAddr, key: Option<&str>) -> Socket {
    let url = match key {
        Some(k) => format!("ws://{addr}/gateway/connect?token={k}"),
        None => format!("ws://{addr}/gateway/connect"),
    };
    let (s, _) = with_timeout(tokio_tungstenite::connect_async(url))
        .await
        .expect("IM upgrade");
    s
}

async fn send_frame(s: &mut Socket, v: Value) {
    with_timeout(s.send(Ws::Text(v.to_string().into())))
        .await
        .unwrap();
}

/// The next text frame (heartbeat acks skipped).
async fn frame(s: &mut Socket) -> Value {
    loop {
        match with_timeout(s.next()).await {
            Some(Ok(Ws::Text(t))) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                if v["type"] != "heartbeat_ack" {
                    return v;
                }
            }
            Some(Ok(Ws::Ping(_) | Ws::Pong(_))) => continue,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

/// An IM agent registered by `key` under `uri`; the `registered` frame.
async fn registered(addr: SocketAddr, key: Option<&str>, uri: &str) -> (Socket, Value) {
    let mut s = ws_as(addr, key).await;
    send_frame(
        &mut s,
        json!({"type": "register", "agent_uri": uri, "capabilities": ["code_analysis"]}),
    )
    .await;
    let f = frame(&mut s).await;
    assert_eq!(f["type"], "registered", "{uri}: {f}");
    (s, f)
}

/// No `message` frame arrives on `s` for a while.
async fn assert_no_message(s: &mut Socket) {
    let quiet = tokio::time::timeout(Duration::from_millis(400), async {
        loop {
            match s.next().await {
                Some(Ok(Ws::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap();
                    assert_ne!(v["type"], "message", "a message reached this socket: {v}");
                }
                Some(Ok(_)) => continue,
                _ => return,
            }
        }
    })
    .await;
    assert!(quiet.is_err(), "the socket ended");
}

/// The close code the server ends `s` with (`None`: no close frame).
async fn close_code(s: &mut Socket, limit: Duration) -> Option<u16> {
    within(limit, async {
        loop {
            match s.next().await {
                Some(Ok(Ws::Close(c))) => return c.map(|c| u16::from(c.code)),
                Some(Ok(_)) => continue,
                _ => return None,
            }
        }
    })
    .await
}

/// A hand-made client WebSocket (for what a well-behaved library will not do: stop reading,
/// send invalid UTF-8).
struct RawWs {
    stream: TcpStream,
}

impl RawWs {
    async fn open(addr: SocketAddr, rcvbuf: Option<u32>) -> Self {
        let mut stream = connect_from(None, addr, rcvbuf).await;
        let req = format!(
            "GET /gateway/connect HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        );
        with_timeout(stream.write_all(req.as_bytes()))
            .await
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            with_timeout(stream.read_exact(&mut byte)).await.unwrap();
            head.push(byte[0]);
        }
        assert!(
            head.starts_with(b"HTTP/1.1 101"),
            "{}",
            String::from_utf8_lossy(&head)
        );
        Self { stream }
    }

    /// A masked client frame.
    fn encode(opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [0x12u8, 0x34, 0x56, 0x78];
        let mut out = vec![0x80 | opcode];
        match payload.len() {
            n if n < 126 => out.push(0x80 | n as u8),
            n if n < 65536 => {
                out.push(0x80 | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(0x80 | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    async fn send(&mut self, opcode: u8, payload: &[u8]) -> std::io::Result<()> {
        tokio::time::timeout(
            Duration::from_secs(2),
            self.stream.write_all(&Self::encode(opcode, payload)),
        )
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
    }

    async fn text(&mut self, v: &Value) -> std::io::Result<()> {
        self.send(1, v.to_string().as_bytes()).await
    }

    /// The next server frame: `(opcode, payload)`; `None` at the end of the stream.
    async fn read(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut h = [0u8; 2];
        self.stream.read_exact(&mut h).await.ok()?;
        let len = match h[1] & 0x7f {
            126 => {
                let mut b = [0u8; 2];
                self.stream.read_exact(&mut b).await.ok()?;
                u16::from_be_bytes(b) as usize
            }
            127 => {
                let mut b = [0u8; 8];
                self.stream.read_exact(&mut b).await.ok()?;
                u64::from_be_bytes(b) as usize
            }
            n => n as usize,
        };
        let mut payload = vec![0u8; len];
        self.stream.read_exact(&mut payload).await.ok()?;
        Some((h[0] & 0x0f, payload))
    }

    /// The next text frame as JSON.
    async fn json(&mut self) -> Value {
        loop {
            match with_timeout(self.read()).await {
                Some((1, p)) => return serde_json::from_slice(&p).unwrap(),
                Some((8, p)) => panic!("closed: {p:?}"),
                Some(_) => continue,
                None => panic!("the stream ended"),
            }
        }
    }

    /// Reads everything to the end: the close code, if a close frame came.
    async fn close_code(&mut self, limit: Duration) -> Option<u16> {
        within(limit, async {
            while let Some((op, p)) = self.read().await {
                if op == 8 {
                    return (p.len() >= 2).then(|| u16::from_be_bytes([p[0], p[1]]));
                }
            }
            None
        })
        .await
    }
}

// ---------------------------------------------------------------------------------------------
// H7: one flooder, one budget: its own

#[tokio::test]
async fn h7_a_flooder_spends_its_own_budget_and_nobody_elses() {
    let (_server, addr, url) = server(|c| {
        with_auth(c);
        c.gateways.rate_per_caller = 40;
        c.gateways.burst_per_caller = 40;
    })
    .await;
    let canary = Canary::start(&url, Some(OPS)).await;
    let (_desk_client, desk) = map_agent(&url, Some(OPS), "desk").await;
    let mut desk_inbox = desk.messages();
    let desk_uri = format!("agent://{addr}/desk");
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new([
        AtomicU64::new(0), // bob: limited (429 / rate_limited frames)
        AtomicU64::new(0), // bob: answered 404 (must stay 0)
        AtomicU64::new(0), // bob: Retry-After present on a 429
    ]);

    // bob: four IM sockets flooding `send` frames...
    let mut floods = Vec::new();
    for i in 0..4 {
        let (s, _) = registered(addr, Some(BOB), &format!("agent://bob.example/pc{i}")).await;
        let (stop, counts, to) = (Arc::clone(&stop), Arc::clone(&counts), desk_uri.clone());
        floods.push(tokio::spawn(async move {
            let (mut tx, mut rx) = s.split();
            let reader = tokio::spawn({
                let counts = Arc::clone(&counts);
                async move {
                    while let Some(Ok(m)) = rx.next().await {
                        if let Ws::Text(t) = m {
                            let v: Value = serde_json::from_str(t.as_str()).unwrap();
                            if v["error"] == "rate_limited" {
                                assert!(v["retry_after_ms"].as_u64().is_some(), "{v}");
                                counts[0].fetch_add(1, Ordering::Relaxed);
                            }
                            if v["error"] == "agent_not_found" {
                                counts[1].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            });
            while !stop.load(Ordering::Relaxed) {
                let f =
                    json!({"type": "send", "to": to, "content": "flood", "conversation_id": null});
                if tokio::time::timeout(
                    Duration::from_secs(1),
                    tx.send(Ws::Text(f.to_string().into())),
                )
                .await
                .is_err()
                {
                    tokio::task::yield_now().await;
                }
            }
            reader.abort();
        }));
    }
    // ...and two HTTP loops (IM sends and MAMP posts).
    for route in ["/gateway/send", "/mamp/v1/messages"] {
        let (stop, counts, to) = (Arc::clone(&stop), Arc::clone(&counts), desk_uri.clone());
        floods.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let body = if route == "/gateway/send" {
                    json!({"to": to, "content": "flood"})
                } else {
                    mamp("agent://bob@remote.example/flood", &to, json!("flood"))
                };
                let r = post_as(addr, route, &body, Some(BOB)).await;
                match r.status {
                    429 => {
                        counts[0].fetch_add(1, Ordering::Relaxed);
                        if r.header("retry-after").is_some() && r.json()["error"] == "rate_limited"
                        {
                            counts[2].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    404 => {
                        counts[1].fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // alice, meanwhile: 40 sends at her own pace, by IM and by MAMP; carol reads.
    let mut ok = 0;
    let mut slowest_read = Duration::ZERO;
    for i in 0..40 {
        let r = if i % 2 == 0 {
            post_as(
                addr,
                "/gateway/send",
                &json!({"to": desk_uri, "content": {"alice": i}}),
                Some(ALICE),
            )
            .await
        } else {
            post_as(
                addr,
                "/mamp/v1/messages",
                &mamp(
                    "agent://alice@remote.example/a",
                    &desk_uri,
                    json!(format!("alice {i}")),
                ),
                Some(ALICE),
            )
            .await
        };
        assert_ne!(
            r.status,
            404,
            "alice's target was reported missing: {}",
            text(&r)
        );
        if r.status == 200 {
            ok += 1;
        } else {
            eprintln!("h7: alice's call {i}: {} {}", r.status, text(&r));
        }
        let t = Instant::now();
        let read = within(
            Duration::from_secs(2),
            get_as(addr, "/gateway/agents", Some(CAROL)),
        )
        .await;
        assert_eq!(read.status, 200, "{}", text(&read));
        slowest_read = slowest_read.max(t.elapsed());
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for f in floods {
        let _ = within(Duration::from_secs(5), f).await;
    }
    let limited = counts[0].load(Ordering::Relaxed);
    eprintln!(
        "h7: alice {ok}/40 ok; bob limited {limited} times; carol's slowest read {slowest_read:?}"
    );
    assert!(ok * 100 >= 40 * 95, "alice kept only {ok} of 40 calls");
    assert!(limited > 0, "bob's flood was never limited");
    assert!(
        counts[2].load(Ordering::Relaxed) > 0,
        "no 429 carried Retry-After"
    );
    assert_eq!(
        counts[1].load(Ordering::Relaxed),
        0,
        "a rate limit was reported as not found"
    );
    // Every one of alice's accepted messages reached the desk (bob's too, within his budget).
    let mut from_alice = 0;
    within(Duration::from_secs(10), async {
        while from_alice < ok {
            let m = desk_inbox.next().await.expect("inbox open");
            if m.payload
                .as_ref()
                .is_some_and(|p| p.get().contains("alice"))
            {
                from_alice += 1;
            }
        }
    })
    .await;
    canary.finish().await;
}

#[tokio::test]
async fn h7_without_auth_each_address_has_its_own_budget() {
    // Loopback callers are not exempt here, so 127.0.0.1 and 127.0.0.2 are two callers.
    let (_server, addr, url) = server(|c| {
        c.limits.exempt_loopback = false;
        c.gateways.rate_per_caller = 20;
        c.gateways.burst_per_caller = 20;
    })
    .await;
    let canary = Canary::start(&url, None).await;
    let (_c, desk) = map_agent(&url, None, "desk").await;
    let _inbox = desk.messages();
    let flooder: IpAddr = "127.0.0.2".parse().unwrap();
    let to = format!("agent://{addr}/desk");
    let mut limited = 0;
    for _ in 0..60 {
        let r = post_from(
            Some(flooder),
            addr,
            "/gateway/send",
            &json!({"to": to, "content": "flood"}),
            None,
        )
        .await;
        assert_ne!(r.status, 404, "{}", text(&r));
        if r.status == 429 {
            assert_error(&r, 429, "rate_limited");
            assert!(r.header("retry-after").is_some());
            limited += 1;
        }
    }
    assert!(limited > 0, "the flooding address was never limited");
    // The other address is untouched.
    for i in 0..10 {
        let r = post_from(
            None,
            addr,
            "/gateway/send",
            &json!({"to": to, "content": {"n": i}}),
            None,
        )
        .await;
        assert_eq!(r.status, 200, "{}", text(&r));
    }
    canary.finish().await;
}

// ---------------------------------------------------------------------------------------------
// M3: bodies with a deadline

#[tokio::test]
async fn m3_a_stalled_body_is_cut_within_15_s_and_nobody_waits_for_it() {
    // The default deadline (10 s): what an operator gets without configuring anything.
    let (_server, addr, url) = server(|_| {}).await;
    let canary = Canary::start(&url, None).await;
    let started = Instant::now();
    let mut stalled = Vec::new();
    for path in ["/mamp/v1/messages", "/gateway/send"] {
        for _ in 0..5 {
            let mut s = connect_from(None, addr, None).await;
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
                 Content-Length: 1000\r\n\r\n{{\"to\":"
            );
            with_timeout(s.write_all(head.as_bytes())).await.unwrap();
            stalled.push(tokio::spawn(async move {
                let r = within(Duration::from_secs(15), read_response(&mut s)).await;
                (r, started.elapsed())
            }));
        }
    }
    // Others are served meanwhile.
    for _ in 0..5 {
        let t = Instant::now();
        let r = get_as(addr, "/gateway/agents", None).await;
        assert_eq!(r.status, 200);
        assert!(t.elapsed() < Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for s in stalled {
        let (r, at) = within(Duration::from_secs(16), s).await.unwrap();
        assert_error(&r, 408, "request_timeout");
        assert_eq!(
            r.header("connection"),
            Some("close"),
            "the connection is not kept"
        );
        assert!(
            at >= Duration::from_secs(9) && at < Duration::from_secs(15),
            "cut after {at:?}"
        );
    }
    canary.finish().await;
}

// ---------------------------------------------------------------------------------------------
// M4: an IM peer that stops reading is dropped

#[tokio::test]
async fn m4_a_deaf_im_peer_is_dropped_by_its_unanswered_pings() {
    let (_server, addr, url) = server(|c| {
        c.gateways.im.ping_interval_ms = 300;
        c.gateways.im.write_timeout_ms = 700;
        c.gateways.im.heartbeat_timeout_ms = 60_000;
    })
    .await;
    let canary = Canary::start(&url, None).await;
    let uri = "agent://deaf.example/pc";
    let mut deaf = RawWs::open(addr, None).await;
    deaf.text(&json!({"type": "register", "agent_uri": uri}))
        .await
        .unwrap();
    assert_eq!(deaf.json().await["type"], "registered");
    // It keeps sending heartbeats, so the heartbeat timeout is not what drops it; it reads
    // nothing, so it never answers a ping.
    let started = Instant::now();
    let beating = tokio::spawn(async move {
        while deaf.text(&json!({"type": "heartbeat"})).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if started.elapsed() > Duration::from_secs(8) {
                break;
            }
        }
        deaf
    });
    poll(
        addr,
        &format!("/gateway/status/{}", encoded(uri)),
        None,
        |r| r.status == 200 && r.json()["status"] == "offline",
    )
    .await;
    let dropped_after = started.elapsed();
    eprintln!("m4: a deaf peer (sending heartbeats) dropped after {dropped_after:?}");
    assert!(dropped_after < Duration::from_secs(3), "{dropped_after:?}");
    let mut deaf = within(Duration::from_secs(10), beating).await.unwrap();
    // What it finally reads: what was queued, then the close frame (1008), then the end.
    assert_eq!(deaf.close_code(Duration::from_secs(5)).await, Some(1008));
    canary.finish().await;
}

#[tokio::test]
async fn m4_a_deaf_im_peer_is_dropped_when_its_writes_stall() {
    let (_server, addr, url) = server(|c| {
        c.gateways.im.ping_interval_ms = 0;
        c.gateways.im.write_timeout_ms = 800;
        c.gateways.im.send_queue = 4;
        c.gateways.im.heartbeat_timeout_ms = 60_000;
    })
    .await;
    let canary = Canary::start(&url, None).await;
    let (sender, _agent) = map_agent(&url, None, "firehose").await;
    let uri = "agent://deaf.example/reader";
    let mut deaf = RawWs::open(addr, Some(4096)).await;
    deaf.text(&json!({"type": "register", "agent_uri": uri}))
        .await
        .unwrap();
    assert_eq!(deaf.json().await["type"], "registered");
    // A healthy IM agent beside it must keep getting its messages.
    let (mut healthy, _) = registered(addr, None, "agent://fine.example/reader").await;
    let started = Instant::now();
    let big = "x".repeat(100_000);
    let mut offline = false;
    for i in 0..200 {
        let r = with_timeout(sender.send(json!({"agent": uri}), json!({"n": i, "pad": big}))).await;
        if r.is_err() || r.is_ok_and(|r| r.delivered.is_empty()) {
            offline = true;
            break;
        }
        if started.elapsed() > Duration::from_secs(8) {
            break;
        }
    }
    let st = poll(
        addr,
        &format!("/gateway/status/{}", encoded(uri)),
        None,
        |r| r.status == 200 && r.json()["status"] == "offline",
    )
    .await;
    let dropped_after = started.elapsed();
    eprintln!("m4: a peer whose writes stalled dropped after {dropped_after:?} (offline seen by sends: {offline})");
    assert_eq!(st.json()["status"], "offline");
    assert!(dropped_after < Duration::from_secs(10), "{dropped_after:?}");
    // Nothing meant for the deaf socket reached the healthy one, which still gets its own.
    with_timeout(sender.send(
        json!({"agent": "agent://fine.example/reader"}),
        json!("still here"),
    ))
    .await
    .unwrap();
    let f = frame(&mut healthy).await;
    assert_eq!(f["content"], "still here", "{f}");
    assert_no_message(&mut healthy).await;
    drop(deaf);
    canary.finish().await;
}

// ---------------------------------------------------------------------------------------------
// L3: close codes

#[tokio::test]
async fn l3_oversize_and_invalid_frames_close_with_maps_codes() {
    let (_server, addr, url) = server(|c| c.gateways.im.max_frame_bytes = 4096).await;
    let canary = Canary::start(&url, None).await;
    // Oversize: 1009, and the agent goes offline.
    let (mut big, _) = registered(addr, None, "agent://big.example/x").await;
    let huge = json!({"type": "send", "to": "x", "content": "y".repeat(10_000)});
    let _ = with_timeout(big.send(Ws::Text(huge.to_string().into()))).await;
    assert_eq!(
        close_code(&mut big, Duration::from_secs(5)).await,
        Some(1009)
    );
    poll(
        addr,
        &format!("/gateway/status/{}", encoded("agent://big.example/x")),
        None,
        |r| r.status == 200 && r.json()["status"] == "offline",
    )
    .await;
    // Before registering too.
    let mut s = RawWs::open(addr, None).await;
    s.send(1, "z".repeat(8000).as_bytes()).await.unwrap();
    assert_eq!(s.close_code(Duration::from_secs(5)).await, Some(1009));
    // A text frame that is not UTF-8: 1007.
    let mut bad = RawWs::open(addr, None).await;
    bad.text(&json!({"type": "register", "agent_uri": "agent://bad.example/x"}))
        .await
        .unwrap();
    assert_eq!(bad.json().await["type"], "registered");
    bad.send(1, &[b'{', 0xff, 0xfe, b'}']).await.unwrap();
    assert_eq!(bad.close_code(Duration::from_secs(5)).await, Some(1007));
    // A JSON frame of the wrong shape is answered, and the connection stays.
    let (mut ok, _) = registered(addr, None, "agent://ok.example/x").await;
    send_frame(&mut ok, json!({"type": 7})).await;
    assert_eq!(frame(&mut ok).await["error"], "invalid_frame");
    send_frame(&mut ok, json!({"type": "heartbeat"})).await;
    assert_eq!(
        within(Duration::from_secs(5), async {
            loop {
                if let Some(Ok(Ws::Text(t))) = ok.next().await {
                    return serde_json::from_str::<Value>(t.as_str()).unwrap();
                }
            }
        })
        .await["type"],
        "heartbeat_ack"
    );
    canary.finish().await;
}

// ---------------------------------------------------------------------------------------------
// M7: big requests are refused up front; what is accepted is delivered

#[tokio::test]
async fn m7_oversize_requests_get_413_at_once_and_the_advertised_limit_is_true() {
    let (_server, addr, url) = server(|_| {}).await;
    let canary = Canary::start(&url, None).await;
    let (_c, agent) = map_agent(&url, None, "analyst").await;
    let mut inbox = agent.messages();
    let to = format!("agent://{addr}/analyst");
    let card = get_as(addr, "/mamp/v1/card", None).await.json();
    let max = card["capabilities"]["max_message_size"].as_u64().unwrap() as usize;
    assert_eq!(max, 256 * 1024, "the card says what MAP delivers");

    // Declared too large: answered from the head alone, within milliseconds, connection closed.
    for (path, len) in [("/gateway/send", 1_100_000), ("/mamp/v1/messages", 5 << 20)] {
        let mut s = connect_from(None, addr, None).await;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {len}\r\n\r\n"
        );
        let t = Instant::now();
        with_timeout(s.write_all(head.as_bytes())).await.unwrap();
        let r = within(Duration::from_secs(2), read_response(&mut s)).await;
        assert_error(&r, 413, "message_too_large");
        assert_eq!(r.header("connection"), Some("close"));
        eprintln!(
            "m7: {path} with Content-Length {len}: 413 after {:?}",
            t.elapsed()
        );
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
    }
    // Sent whole, a body over the limit is refused as fast (no hang), and nothing is delivered.
    let t = Instant::now();
    let over = mamp("agent://remote.example/big", &to, json!("x".repeat(max)));
    assert_error(
        &post_as(addr, "/mamp/v1/messages", &over, None).await,
        413,
        "message_too_large",
    );
    let over = json!({"to": to, "content": "x".repeat(600_000)});
    assert_error(
        &post_as(addr, "/gateway/send", &over, None).await,
        413,
        "message_too_large",
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(
        tokio::time::timeout(QUIET, inbox.next()).await.is_err(),
        "a refused message was delivered"
    );
    // Just under the limit: delivered, byte for byte.
    let content = "y".repeat(max - 1024);
    let r = post_as(
        addr,
        "/mamp/v1/messages",
        &mamp("agent://remote.example/big", &to, json!(content)),
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let m = within(Duration::from_secs(5), inbox.next()).await.unwrap();
    assert_eq!(m.payload.unwrap().get(), format!("\"{content}\""));
    canary.finish().await;
}

#[tokio::test]
async fn posts_must_be_json() {
    let (_server, addr, url) = server(|_| {}).await;
    let (_c, agent) = map_agent(&url, None, "analyst").await;
    let mut inbox = agent.messages();
    let to = format!("agent://{addr}/analyst");
    let bodies = [
        (
            "/mamp/v1/messages",
            mamp("agent://remote.example/x", &to, json!("hi")),
        ),
        ("/gateway/send", json!({"to": to, "content": "hi"})),
    ];
    for (path, body) in &bodies {
        for ct in [
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            None,
        ] {
            let mut h = Vec::new();
            if let Some(ct) = ct {
                h.push(("Content-Type", ct));
            }
            let r = request_from(None, addr, "POST", path, &h, body.to_string().as_bytes()).await;
            assert_error(&r, 415, "unsupported_media_type");
        }
    }
    assert!(
        tokio::time::timeout(QUIET, inbox.next()).await.is_err(),
        "a refused message was delivered"
    );
    for (path, body) in &bodies {
        assert_eq!(post_as(addr, path, body, None).await.status, 200);
    }
}

/// A lone UTF-16 surrogate escape (`"\ud800"`) is valid JSON syntax that no reader can turn
/// into text (serde_json refuses it, so our own client would). CI's fuzzer found MAP passing one
/// through to an answer; every entry refuses it now, with a clear error, and delivers nothing:
/// MAMP and IM bodies (400), an IM frame (`invalid_frame`, the socket stays), and a MAP request
/// (`-32600` under its own id, the session stays). A surrogate pair still passes byte for byte.
#[tokio::test]
async fn lone_surrogates_are_refused_at_every_entry_and_nothing_is_delivered() {
    let (_server, addr, url) = server(|_| {}).await;
    let (_c, agent) = map_agent(&url, None, "analyst").await;
    let mut inbox = agent.messages();
    let to = format!("agent://{addr}/analyst");
    let post_raw = |path: &'static str, body: String| async move {
        request_from(
            None,
            addr,
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )
        .await
    };
    let lone = |v: Value| v.to_string().replace("LONE", "\\u0000\\ud800");
    for (path, body) in [
        (
            "/mamp/v1/messages",
            lone(mamp("agent://remote.example/x", &to, json!("hi LONE"))),
        ),
        (
            "/mamp/v1/messages",
            lone(mamp(
                "agent://remote.example/x",
                &to,
                json!([{"type": "text", "text": "LONE"}]),
            )),
        ),
        ("/gateway/send", lone(json!({"to": to, "content": "LONE"}))),
        (
            "/gateway/send",
            lone(json!({"to": to, "content": {"k": ["LONE"]}})),
        ),
    ] {
        let r = post_raw(path, body).await;
        assert_error(&r, 400, "invalid_message");
        assert!(text(&r).contains("surrogate"), "{}", text(&r));
    }
    // An IM frame: answered, and the connection keeps working.
    let (mut im, _) = registered(addr, None, "agent://im.example/x").await;
    let bad = lone(json!({"type": "send", "to": to, "content": "LONE"}));
    with_timeout(im.send(Ws::Text(bad.into()))).await.unwrap();
    let answer = frame(&mut im).await;
    assert_eq!(answer["error"], "invalid_frame", "{answer}");
    // MAP: answered under the request's id, and the session goes on.
    let mut map = WsClient::client(&url).await;
    let answer = map
        .request_raw(&lone(json!({
            "jsonrpc": "2.0", "id": 41, "method": "map/send",
            "params": {"to": {"agent": "analyst"}, "payload": "LONE"}
        })))
        .await;
    assert_eq!(answer["id"], 41, "{answer}");
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    assert!(
        tokio::time::timeout(QUIET, inbox.next()).await.is_err(),
        "a refused message was delivered"
    );
    // A pair passes, byte for byte, on each path.
    let pair = |v: Value| v.to_string().replace("PAIR", "\\ud83d\\ude00");
    let r = post_raw(
        "/mamp/v1/messages",
        pair(mamp("agent://remote.example/x", &to, json!("PAIR"))),
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let r = post_raw("/gateway/send", pair(json!({"to": to, "content": "PAIR"}))).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    send_frame(&mut im, json!({"type": "send", "to": to, "content": "ok"})).await;
    assert_eq!(frame(&mut im).await["type"], "sent");
    let answer = map
        .request_raw(&pair(json!({
            "jsonrpc": "2.0", "id": 42, "method": "map/send",
            "params": {"to": {"agent": "analyst"}, "payload": "PAIR"}
        })))
        .await;
    assert_eq!(answer["id"], 42, "{answer}");
    assert!(answer.get("result").is_some(), "{answer}");
    let mut payloads = Vec::new();
    for _ in 0..4 {
        let m = within(Duration::from_secs(5), inbox.next()).await.unwrap();
        payloads.push(m.payload.unwrap().get().to_owned());
    }
    assert_eq!(
        payloads
            .iter()
            .filter(|p| p.as_str() == "\"\\ud83d\\ude00\"")
            .count(),
        3,
        "{payloads:?}"
    );
    assert!(payloads.contains(&"\"ok\"".to_owned()), "{payloads:?}");
}

// ---------------------------------------------------------------------------------------------
// Memory one caller controls

#[tokio::test]
async fn churn_leaves_every_table_under_its_cap() {
    let (server, addr, url) = server(|c| {
        c.gateways.max_contacts = 40;
        c.gateways.max_conversations = 40;
        c.gateways.session_idle_ms = 400;
        c.gateways.im.max_connections = 30;
    })
    .await;
    let canary = Canary::start(&url, None).await;
    let (_c, agent) = map_agent(&url, None, "analyst").await;
    let mut inbox = agent.messages();
    let to = format!("agent://{addr}/analyst");
    // 150 outside senders, each starting a conversation.
    for i in 0..150 {
        let r = post_as(
            addr,
            "/mamp/v1/messages",
            &mamp(&format!("agent://churn.example/s{i}"), &to, json!("x")),
            None,
        )
        .await;
        assert_eq!(r.status, 200, "{}", text(&r));
    }
    // 60 IM agents come, send, and go.
    for i in 0..60 {
        let (mut s, _) = registered(addr, None, &format!("agent://churn.example/im{i}")).await;
        send_frame(&mut s, json!({"type": "send", "to": to, "content": "hi"})).await;
        assert_eq!(frame(&mut s).await["type"], "sent");
        with_timeout(s.close(None)).await.unwrap();
    }
    for _ in 0..210 {
        within(Duration::from_secs(5), inbox.next()).await.unwrap();
    }
    // The IM connection cap holds while they are open.
    let mut open = Vec::new();
    for i in 0..30 {
        open.push(
            registered(addr, None, &format!("agent://cap.example/{i}"))
                .await
                .0,
        );
    }
    let refused = tokio_tungstenite::connect_async(format!("ws://{addr}/gateway/connect")).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 503),
        other => panic!("the 31st connection was not refused: {other:?}"),
    }
    drop(open);
    let gw = server.gateways();
    let sizes = within(Duration::from_secs(10), async {
        loop {
            let s = gw.sizes();
            // The directory forgets an agent once it has followed its going offline (an
            // event it reads after the connection closed): CI once read 55 contacts, ten
            // agents still online in the directory's view, right after the close.
            if s.peers == 0 && s.im_connections == 0 && s.live == 0 && s.contacts <= 40 + 5 {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    eprintln!("after the churn: {sizes:?}");
    // Online agents are always kept (the analyst, the canary's and the directory's own are
    // participants); everything else is within the caps.
    assert!(sizes.contacts <= 40 + 5, "{sizes:?}");
    assert!(sizes.conversations <= 40, "{sizes:?}");
    assert!(sizes.peers <= map_router::gateway::peer_table::MAX_PEERS_PER_OWNER);
    assert!(sizes.caller_sessions <= 1, "{sizes:?}");
    assert!(sizes.threads <= map_router::gateway::threads::MAX_THREADS);
    let contacts = get_as(addr, "/api/contacts", None).await.json();
    assert!(
        contacts["contacts"].as_array().unwrap().len() <= 45,
        "{contacts}"
    );
    canary.finish().await;
}

// ---------------------------------------------------------------------------------------------
// First hour: one URI per agent, replies, capabilities

#[tokio::test]
async fn one_uri_per_agent_with_or_without_the_port() {
    let (_server, addr, url) = server(|_| {}).await;
    let (_c, agent) = map_agent(&url, None, "analyst").await;
    let mut inbox = agent.messages();
    let card = get_as(addr, "/mamp/v1/card", None).await.json();
    assert_eq!(card["agent_id"], format!("agent://{addr}/map-router"));
    let with_port = format!("agent://{addr}/analyst");
    let without = format!("agent://{}/analyst", addr.ip());
    // The analyst's own card names its canonical URI, asked either way.
    for form in [&with_port, &without] {
        let r = get_as(
            addr,
            &format!("/mamp/v1/agents/{}/card", encoded(form)),
            None,
        )
        .await;
        assert_eq!(r.status, 200, "{form}: {}", text(&r));
        assert_eq!(r.json()["agent_id"], with_port.as_str());
    }
    // An IM agent of our host, registered without the port, is the canonical agent.
    let (mut im, reg) = registered(addr, None, &format!("agent://{}/pc", addr.ip())).await;
    let canonical = format!("agent://{addr}/pc");
    assert_eq!(reg["agent_uri"], canonical.as_str(), "{reg}");
    // Both forms reach the same agents, over HTTP and over the socket.
    for form in [&with_port, &without] {
        let r = post_as(
            addr,
            "/gateway/send",
            &json!({"to": form, "content": "http"}),
            None,
        )
        .await;
        assert_eq!(r.status, 200, "{form}: {}", text(&r));
        inbox.next().await.unwrap();
        let r = post_as(
            addr,
            "/mamp/v1/messages",
            &mamp("agent://remote.example/x", form, json!("mamp")),
            None,
        )
        .await;
        assert_eq!(r.status, 200, "{form}: {}", text(&r));
        inbox.next().await.unwrap();
        send_frame(
            &mut im,
            json!({"type": "send", "to": form, "content": "ws"}),
        )
        .await;
        assert_eq!(frame(&mut im).await["type"], "sent");
        inbox.next().await.unwrap();
    }
    for form in [canonical.clone(), format!("agent://{}/pc", addr.ip())] {
        let r = post_as(
            addr,
            "/gateway/send",
            &json!({"to": form, "content": "to pc"}),
            None,
        )
        .await;
        assert_eq!(r.status, 200, "{form}: {}", text(&r));
        assert_eq!(frame(&mut im).await["content"], "to pc");
        let st = get_as(addr, &format!("/gateway/status/{}", encoded(&form)), None).await;
        assert_eq!(st.json()["status"], "online", "{form}");
    }
    // One MAP agent, not two.
    let agents = get_as(addr, "/gateway/agents", None).await.json();
    assert_eq!(agents["agents"].as_array().unwrap().len(), 1, "{agents}");
    // A port we do not listen on is another router's host.
    let elsewhere = format!("agent://{}:1/analyst", addr.ip());
    assert_error(
        &post_as(
            addr,
            "/gateway/send",
            &json!({"to": elsewhere, "content": "x"}),
            None,
        )
        .await,
        404,
        "agent_not_found",
    );
    assert!(tokio::time::timeout(QUIET, inbox.next()).await.is_err());
}

#[tokio::test]
async fn replies_reach_the_caller_in_its_conversation_by_the_documented_rule() {
    let (_server, addr, url) = server(|c| {
        with_auth(c);
        c.gateways.session_idle_ms = 500;
    })
    .await;
    let (map, agent) = map_agent(&url, Some(OPS), "analyst").await;
    let mut inbox = agent.messages();
    let to = format!("agent://{addr}/analyst");

    // IM: the agent's plain reply() lands on the socket in the IM agent's conversation.
    let (mut pc, _) = registered(addr, Some(ALICE), "agent://alice.example/pc").await;
    send_frame(
        &mut pc,
        json!({"type": "send", "to": to, "content": "question"}),
    )
    .await;
    let sent = frame(&mut pc).await;
    let conv = sent["conversation_id"].as_str().unwrap().to_owned();
    let m = within(Duration::from_secs(5), inbox.next()).await.unwrap();
    with_timeout(map.reply(&m, json!("answer"))).await.unwrap();
    let pushed = frame(&mut pc).await;
    assert_eq!(pushed["content"], "answer");
    assert_eq!(pushed["conversation_id"], conv.as_str(), "{pushed}");
    // ...and the read model threads it into that conversation (question + answer).
    poll(
        addr,
        "/api/contacts/agent%3A%2F%2Falice.example%2Fpc/conversations",
        Some(ALICE),
        |r| {
            r.status == 200
                && r.json()["conversations"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["conversation_id"] == conv.as_str() && c["total_messages"] == 2)
                })
        },
    )
    .await;

    // MAMP without an endpoint: fetched by its owner, once, in its conversation.
    let from = "agent://alice@remote.example/desk";
    let r = post_as(
        addr,
        "/mamp/v1/messages",
        &mamp(from, &to, json!("q1")),
        Some(ALICE),
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let mconv = r.json()["conversation_id"].as_str().unwrap().to_owned();
    let m = within(Duration::from_secs(5), inbox.next()).await.unwrap();
    let reply = with_timeout(map.reply(&m, json!("a1"))).await.unwrap();
    assert_eq!(reply.delivered, vec![from.to_owned()]);
    let path = format!("/mamp/v1/messages?agent={}", encoded(from));
    // Not to anybody else.
    assert_error(&get_as(addr, &path, Some(BOB)).await, 403, "forbidden");
    let got = get_as(addr, &path, Some(ALICE)).await;
    assert_eq!(got.status, 200, "{}", text(&got));
    let got = got.json();
    let list = got["messages"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{got}");
    assert_eq!(list[0]["content"], "a1");
    assert_eq!(list[0]["conversation_id"], mconv.as_str());
    assert_eq!(list[0]["from"], to.as_str());
    assert_eq!(list[0]["to"], from);
    assert_eq!(list[0]["protocol"], "mamp/1.0");
    let again = get_as(addr, &path, Some(ALICE)).await.json();
    assert_eq!(again["messages"], json!([]), "fetched twice");

    // Once its session closed for idleness, nothing is reported delivered that nobody holds:
    // a plain reply fails, a guaranteed one waits and comes with the next fetch.
    let agent_id = from.to_owned();
    within(Duration::from_secs(10), async {
        loop {
            let a = map.get_agent(agent_id.as_str()).await.unwrap();
            if a.state == map_router::protocol::agent::AgentState::ORPHANED {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let lost = with_timeout(map.send(json!({"agent": from}), json!("plain"))).await;
    assert!(
        lost.as_ref().map_or(true, |r| r.delivered.is_empty()),
        "reported delivered to nobody: {lost:?}"
    );
    let kept = with_timeout(map.send_with(SendParams {
        to: json!({"agent": from}).into(),
        payload: Some(json!("kept").into()),
        meta: Some(json!({"delivery": "guaranteed"}).into()),
    }))
    .await
    .unwrap();
    assert!(kept.delivered.is_empty(), "{kept:?}");
    let got = get_as(addr, &path, Some(ALICE)).await.json();
    let contents: Vec<&Value> = got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["content"])
        .collect();
    assert_eq!(contents, vec![&json!("kept")], "{got}");
}

#[tokio::test]
async fn a_remote_agent_gets_replies_in_the_conversation_it_started() {
    // A fake remote MAMP server on loopback records what it is POSTed.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let remote_addr = listener.local_addr().unwrap();
    let (tx, mut posted) = tokio::sync::mpsc::unbounded_channel::<Value>();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut raw = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    raw.extend_from_slice(&buf[..n]);
                    if let Some(at) = find(&raw, b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if raw.len() >= at + 4 + len {
                            let body: Value =
                                serde_json::from_slice(&raw[at + 4..at + 4 + len]).unwrap();
                            let _ = tx.send(body);
                            let answer = r#"{"conversation_id":"their-new","message_id":"x","status":"received"}"#;
                            let _ = s
                                .write_all(
                                    format!(
                                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                                        answer.len()
                                    )
                                    .as_bytes(),
                                )
                                .await;
                            return;
                        }
                    }
                }
            });
        }
    });
    let remote = "agent://other.example/analyst";
    let (_server, addr, url) = server(|c| {
        c.gateways.mamp.remote = vec![map_router::gateway::config::RemoteMamp {
            uri: remote.into(),
            endpoint: format!("http://{remote_addr}"),
            token: None,
            name: None,
            principal: None,
        }];
    })
    .await;
    let (map, agent) = map_agent(&url, None, "desk").await;
    let mut inbox = agent.messages();
    // The remote starts a conversation here; the desk replies with a plain reply().
    let r = post_as(
        addr,
        "/mamp/v1/messages",
        &mamp(remote, &format!("agent://{addr}/desk"), json!("hello")),
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let ours = r.json()["conversation_id"].as_str().unwrap().to_owned();
    let m = within(Duration::from_secs(5), inbox.next()).await.unwrap();
    with_timeout(map.reply(&m, json!("hi back"))).await.unwrap();
    let out = within(Duration::from_secs(5), posted.recv()).await.unwrap();
    assert_eq!(out["content"], "hi back");
    assert_eq!(
        out["conversation_id"],
        ours.as_str(),
        "the reply went out as a new conversation: {out}"
    );
    assert_eq!(out["to"], remote);
}

#[tokio::test]
async fn contacts_keep_their_last_capabilities() {
    let (_server, addr, _url) = server(|_| {}).await;
    let uri = "agent://caps.example/pc";
    let (s, _) = registered(addr, None, uri).await;
    let path = format!("/api/contacts/{}", encoded(uri));
    let live = poll(addr, &path, None, |r| r.status == 200).await.json();
    assert_eq!(live["card"]["capabilities"], json!(["code_analysis"]));
    drop(s);
    let gone = poll(addr, &path, None, |r| {
        r.status == 200 && r.json()["status"] == "offline"
    })
    .await
    .json();
    assert_eq!(
        gone["card"]["capabilities"],
        json!(["code_analysis"]),
        "{gone}"
    );
}

// ---------------------------------------------------------------------------------------------
// Issue 30, IM path: what was queued for an IM agent reaches it when it registers again

async fn guaranteed(sender: &mut WsClient, to: &str, n: u64) -> Value {
    sender
        .ok(
            "map/send",
            json!({"to": {"agent": to}, "payload": {"n": n}, "meta": {"delivery": "guaranteed"}}),
        )
        .await
}

/// Waits until `uri`'s MAP agent is orphaned (its IM agent offline).
async fn until_orphaned(sender: &mut WsClient, uri: &str) {
    within(Duration::from_secs(10), async {
        loop {
            let a = sender.ok("map/agents/get", json!({"agentId": uri})).await;
            if a["agent"]["state"] == "orphaned" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// The next `n` pushed messages' contents; then nothing more for a while.
async fn exactly(s: &mut Socket, n: usize) -> Vec<Value> {
    let mut got = Vec::new();
    while got.len() < n {
        let f = within(Duration::from_secs(10), frame(s)).await;
        assert_eq!(f["type"], "message", "{f}");
        got.push(f["content"].clone());
    }
    assert_no_message(s).await;
    got
}

#[tokio::test]
async fn issue30_an_im_agent_registering_again_gets_what_was_queued_once_in_order() {
    let (_server, addr, url) = server(|_| {}).await;
    let uri = "agent://queue.example/pc";
    let (s, _) = registered(addr, None, uri).await;
    let (mut other, _) = registered(addr, None, "agent://queue.example/other").await;
    drop(s);
    let mut sender = WsClient::agent(&url, "sender", json!({})).await;
    until_orphaned(&mut sender, uri).await;
    let before = sender.ok("map/agents/get", json!({"agentId": uri})).await;
    for n in [1, 2] {
        let r = guaranteed(&mut sender, uri, n).await;
        assert_eq!(r["queued"], json!([uri]), "{r}");
    }
    let (mut back, reg) = registered(addr, None, uri).await;
    assert_eq!(reg["agent_id"], uri);
    assert_eq!(
        exactly(&mut back, 2).await,
        vec![json!({"n": 1}), json!({"n": 2})]
    );
    assert_no_message(&mut other).await;
    // It is the same MAP agent, reclaimed (not unregistered and registered anew).
    let a = sender.ok("map/agents/get", json!({"agentId": uri})).await;
    assert_ne!(a["agent"]["state"], "orphaned", "{a}");
    assert_eq!(
        a["agent"]["lifecycle"]["createdAt"], before["agent"]["lifecycle"]["createdAt"],
        "{a}"
    );
}

#[tokio::test]
async fn issue30_the_queue_survives_kill_9_of_the_router_while_the_im_agent_is_away() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    for round in 0..3u64 {
        let delay = seed.wrapping_mul(round + 7) % 150;
        eprintln!("round {round}: kill -9 {delay} ms after the second message was queued");
        let dir = TempDir::new("im-kill9");
        let config = dir.path.join("map-router.toml");
        std::fs::write(&config, "[router]\nresume_window_ms = 20000\n").unwrap();
        let data = dir.path.join("data");
        let args = |data: &std::path::Path| {
            vec![
                "serve".to_owned(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--config".into(),
                config.display().to_string(),
                "--data-dir".into(),
                data.display().to_string(),
            ]
        };
        let (mut router, url) = start_binary(args(&data)).await;
        let addr: SocketAddr = url
            .trim_start_matches("ws://")
            .trim_end_matches('/')
            .parse()
            .unwrap();
        let uri = format!("agent://kill9.example/pc{round}");
        let (s, _) = registered(addr, None, &uri).await;
        drop(s);
        let mut sender = WsClient::agent(&url, "sender", json!({})).await;
        until_orphaned(&mut sender, &uri).await;
        for n in [1, 2] {
            let r = guaranteed(&mut sender, &uri, n).await;
            assert_eq!(r["queued"], json!([uri]), "{r}");
        }
        tokio::time::sleep(Duration::from_millis(delay)).await;
        router.start_kill().expect("SIGKILL");
        with_timeout(router.wait()).await.expect("the router ended");

        let (_router, url) = start_binary(args(&data)).await;
        let addr: SocketAddr = url
            .trim_start_matches("ws://")
            .trim_end_matches('/')
            .parse()
            .unwrap();
        let (mut back, _) = registered(addr, None, &uri).await;
        assert_eq!(
            exactly(&mut back, 2).await,
            vec![json!({"n": 1}), json!({"n": 2})],
            "round {round}"
        );
    }
}
