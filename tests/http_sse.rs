//! The HTTP + Server-Sent Events transport over real sockets: `POST /map/rpc`, `GET
//! /map/events`, `DELETE /map/session`, tokens (header and cookie), status codes, numbered SSE
//! frames, `Last-Event-ID` resume with gap reporting, idle expiry and shutdown.
//!
//! The HTTP/1.1 client is a few lines over `TcpStream` (one request per connection,
//! `Connection: close`); SSE bodies are de-chunked and parsed incrementally.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::http::*;
use common::*;
use map_router::server::{Config, Server};
use map_router::transport::http::{routes_with, HttpSettings};
use serde_json::{json, Value};

use tokio::net::{TcpListener, TcpStream};

// ---------------------------------------------------------------------------------------------
// A MAP client over POST.

struct HttpClient {
    addr: SocketAddr,
    token: String,
    next_id: u64,
    session: Value,
}

impl HttpClient {
    /// `map/connect` with `participantType: kind` plus `extra`, over a token-less POST.
    async fn connect(addr: SocketAddr, kind: &str, extra: Value) -> Self {
        let mut params = json!({"protocolVersion": 1, "participantType": kind});
        merge(&mut params, extra);
        let r = post(addr, None, &rpc(1, "map/connect", params)).await;
        assert_eq!(r.status, 200, "{r:?}");
        let body = r.json();
        let session = body["result"].clone();
        assert!(session.is_object(), "connect failed: {body}");
        let token = r.token().expect("a MAP-Session token");
        Self {
            addr,
            token,
            next_id: 2,
            session,
        }
    }

    fn pid(&self) -> String {
        self.session["participantId"].as_str().unwrap().to_owned()
    }

    async fn post(&self, body: &str) -> HttpResponse {
        post(self.addr, Some(&self.token), body).await
    }

    async fn call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.next_id;
        self.next_id += 1;
        let r = self.post(&rpc(id, method, params)).await;
        assert_eq!(r.status, 200, "{method}: {r:?}");
        let v = r.json();
        assert_eq!(v["id"], json!(id), "{v}");
        match (v.get("result"), v.get("error")) {
            (Some(r), None) => Ok(r.clone()),
            (None, Some(e)) => Err(e.clone()),
            _ => panic!("bad response {v}"),
        }
    }

    async fn ok(&mut self, method: &str, params: Value) -> Value {
        match self.call(method, params.clone()).await {
            Ok(v) => v,
            Err(e) => panic!("{method} {params} failed: {e}"),
        }
    }

    async fn subscribe(&mut self, filter: Value) -> String {
        self.ok("map/subscribe", json!({ "filter": filter })).await["subscriptionId"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    async fn events(&self, last_event_id: Option<u64>) -> Sse {
        Sse::open(self.addr, &self.token, last_event_id).await
    }
}

async fn server_with(tweak: impl FnOnce(&mut Config)) -> (Server, SocketAddr, String) {
    let (server, url) = start_server(tweak).await;
    let addr = server.local_addrs()[0];
    (server, addr, url)
}

fn unknown_session_body() -> Value {
    json!({"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request","data":{"category":"protocol","details":{"reason":"unknown or expired HTTP session; call map/connect without MAP-Session"}}}})
}

/// Asserts a `map/event` SSE frame numbered `id` for `sub` of type `kind`; returns its params.
fn assert_map_event(ev: &SseEvent, id: u64, sub: &str, kind: &str) -> Value {
    assert_eq!(ev.id, Some(id), "{ev:?}");
    assert_eq!(ev.event, "map/event", "{ev:?}");
    let frame = ev.json();
    assert_eq!(frame["jsonrpc"], json!("2.0"));
    assert_eq!(frame["method"], json!("map/event"));
    assert!(frame.get("id").is_none(), "a notification: {frame}");
    assert_eq!(frame["params"]["subscriptionId"], json!(sub));
    assert_eq!(frame["params"]["event"]["type"], json!(kind), "{frame}");
    assert!(
        frame["params"]["event"]["id"].is_string(),
        "eventId kept: {frame}"
    );
    frame["params"].clone()
}

// ---------------------------------------------------------------------------------------------
// POST

#[tokio::test]
async fn connect_over_post_issues_a_token_accepted_in_header_and_cookie() {
    let (_server, addr, _) = server_with(|_| {}).await;
    let r = post(
        addr,
        None,
        &rpc(7, "map/connect", json!({"protocolVersion": 1})),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body = r.json();
    assert_eq!(body["id"], json!(7));
    assert!(body["result"]["sessionId"].is_string(), "{body}");
    let token = r.token().expect("MAP-Session header");
    assert!(token.len() >= 24, "an unguessable token: {token}");
    assert_eq!(
        r.headers_named("set-cookie"),
        vec![format!("map_session={token}; Path=/map; HttpOnly; SameSite=Strict").as_str()]
    );

    let list = rpc(8, "map/agents/list", Value::Null);
    let by_header = post(addr, Some(&token), &list).await;
    assert_eq!(by_header.status, 200);
    assert!(
        by_header.json()["result"]["agents"].is_array(),
        "{:?}",
        by_header
    );
    assert_eq!(by_header.token().as_deref(), Some(token.as_str()));

    let cookie = format!("theme=dark; map_session={token}");
    let by_cookie = request(
        addr,
        "POST",
        "/map/rpc",
        &[
            ("Cookie", cookie.as_str()),
            ("Content-Type", "application/json"),
        ],
        list.as_bytes(),
    )
    .await;
    assert_eq!(by_cookie.status, 200);
    assert!(by_cookie.json()["result"]["agents"].is_array());

    // The header wins over a stale cookie.
    let both = request(
        addr,
        "POST",
        "/map/rpc",
        &[
            ("Cookie", "map_session=stale"),
            ("MAP-Session", token.as_str()),
            ("Content-Type", "application/json"),
        ],
        list.as_bytes(),
    )
    .await;
    assert_eq!(both.status, 200);
    assert!(both.json()["result"]["agents"].is_array());
}

#[tokio::test]
async fn unknown_tokens_get_404_with_a_json_rpc_error() {
    let (_server, addr, _) = server_with(|_| {}).await;
    let list = rpc(1, "map/agents/list", Value::Null);
    let r = post(addr, Some("http_nope"), &list).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json(), unknown_session_body());
    let r = request(
        addr,
        "POST",
        "/map/rpc",
        &[
            ("Cookie", "map_session=x"),
            ("Content-Type", "application/json"),
        ],
        list.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json(), unknown_session_body());
    let (status, _, _) = Sse::try_open(addr, "http_nope", None).await;
    assert_eq!(status, 404);
    let r = request(addr, "GET", "/map/events", &[], b"").await;
    assert_eq!((r.status, r.json()), (404, unknown_session_body()));
    let r = request(addr, "DELETE", "/map/session", &[("MAP-Session", "x")], b"").await;
    assert_eq!((r.status, r.json()), (404, unknown_session_body()));
}

#[tokio::test]
async fn notifications_only_get_202_with_no_body() {
    let (_server, addr, _) = server_with(|_| {}).await;
    let c = HttpClient::connect(addr, "client", json!({})).await;
    let ack = json!({"jsonrpc": "2.0", "method": "map/subscribe.ack", "params": {}}).to_string();
    let r = c.post(&ack).await;
    assert_eq!(r.status, 202);
    assert!(r.body.is_empty());
    let r = c.post(&format!("[{ack},{ack}]")).await;
    assert_eq!(r.status, 202);
    assert!(r.body.is_empty());
}

#[tokio::test]
async fn oversize_bodies_get_413_and_bad_utf8_400() {
    let (_server, addr, _) = server_with(|c| c.limits.max_frame_bytes = 4096).await;
    let big = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"map/connect\",\"params\":{{\"name\":\"{}\"}}}}",
        "x".repeat(5000)
    );
    let r = post(addr, None, &big).await;
    assert_eq!(r.status, 413);
    let body = r.json();
    assert_eq!(body["id"], Value::Null);
    assert_protocol_error(&body["error"], -32600, "Invalid request");
    assert!(r.token().is_none());

    let c = HttpClient::connect(addr, "client", json!({})).await;
    let r = c.post(&big).await;
    assert_eq!(r.status, 413);
    assert_protocol_error(&r.json()["error"], -32600, "Invalid request");

    let r = request(
        addr,
        "POST",
        "/map/rpc",
        &[
            ("MAP-Session", c.token.as_str()),
            ("Content-Type", "application/json"),
        ],
        &[0xff, 0xfe, b'{'],
    )
    .await;
    assert_eq!(r.status, 400);
    let body = r.json();
    assert_eq!(body["id"], Value::Null);
    assert_protocol_error(&body["error"], -32700, "Parse error");

    // Still usable: within the limit is fine.
    let mut c = c;
    c.ok("map/agents/list", Value::Null).await;
}

#[tokio::test]
async fn batches_are_answered_with_an_array() {
    let (_server, addr, _) = server_with(|_| {}).await;
    let c = HttpClient::connect(addr, "client", json!({})).await;
    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "map/agents/list"},
        {"jsonrpc": "2.0", "method": "map/subscribe.ack", "params": {}},
        {"jsonrpc": "2.0", "id": "two", "method": "map/scopes/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "no/such"}
    ]);
    let r = c.post(&batch.to_string()).await;
    assert_eq!(r.status, 200);
    let v = r.json();
    let items = v.as_array().expect("an array");
    assert_eq!(items.len(), 3, "{v}");
    assert_eq!(items[0]["id"], json!(1));
    assert!(items[0]["result"]["agents"].is_array());
    assert_eq!(items[1]["id"], json!("two"));
    assert!(items[1]["result"].is_object());
    assert_eq!(items[2]["error"]["code"], json!(-32601));
}

#[tokio::test]
async fn a_post_without_a_session_leaves_nothing_behind() {
    let (_server, addr, _) = server_with(|_| {}).await;
    // Not connected: refused, and no token issued.
    let r = post(addr, None, &rpc(1, "map/agents/list", Value::Null)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["error"]["code"], json!(1000));
    assert!(r.token().is_none(), "{r:?}");
    assert!(r.headers_named("set-cookie").is_empty(), "{r:?}");
    // A failed connect: no token either.
    let r = post(
        addr,
        None,
        &rpc(2, "map/connect", json!({"protocolVersion": 99})),
    )
    .await;
    assert_eq!(r.json()["error"]["code"], json!(-32602));
    assert!(r.token().is_none());
    // Garbage and notifications: no token.
    let r = post(addr, None, "{not json").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["error"]["code"], json!(-32700));
    assert!(r.token().is_none());
    let r = post(addr, None, "{\"jsonrpc\":\"2.0\",\"method\":\"x\"}").await;
    assert_eq!(r.status, 202);
    assert!(r.token().is_none());
}

// ---------------------------------------------------------------------------------------------
// SSE

#[tokio::test]
async fn subscribed_events_arrive_as_numbered_sse_frames() {
    let (_server, addr, url) = server_with(|_| {}).await;
    let mut c = HttpClient::connect(addr, "client", json!({})).await;
    let sub = c
        .subscribe(json!({"eventTypes": ["agent_registered"]}))
        .await;
    let mut sse = c.events(None).await;
    let mut a = WsClient::connect_as(&url, "agent", json!({})).await;
    for id in ["sse-1", "sse-2", "sse-3"] {
        a.register_agent(json!({"agentId": id})).await;
    }
    for (n, id) in (1..).zip(["sse-1", "sse-2", "sse-3"]) {
        let ev = sse.next().await;
        let params = assert_map_event(&ev, n, &sub, "agent_registered");
        assert_eq!(params["event"]["data"]["agentId"], json!(id), "{params}");
    }
    sse.assert_quiet().await;
}

#[tokio::test]
async fn a_message_from_a_websocket_agent_reaches_the_http_agent() {
    let (_server, addr, url) = server_with(|_| {}).await;
    let mut h = HttpClient::connect(addr, "agent", json!({})).await;
    h.ok("map/agents/register", json!({"agentId": "http-agent"}))
        .await;
    let mut sse = h.events(None).await;
    let mut w = WsClient::agent(&url, "ws-agent", json!({})).await;
    let sent = w
        .send(json!({"agent": "http-agent"}), json!({"hello": "sse"}))
        .await;
    let ev = sse.next().await;
    assert_eq!(ev.id, Some(1));
    assert_eq!(ev.event, "map/message");
    let frame = ev.json();
    assert_eq!(frame["method"], json!("map/message"));
    let message = &frame["params"]["message"];
    assert_eq!(message["payload"], json!({"hello": "sse"}));
    assert_eq!(message["from"], json!("ws-agent"));
    assert_eq!(message["id"], sent["messageId"]);
}

#[tokio::test]
async fn last_event_id_resends_exactly_the_missed_frames() {
    let (_server, addr, url) = server_with(|_| {}).await;
    let mut c = HttpClient::connect(addr, "client", json!({})).await;
    let sub = c
        .subscribe(json!({"eventTypes": ["agent_registered"]}))
        .await;
    let mut a = WsClient::connect_as(&url, "agent", json!({})).await;

    let mut sse = c.events(None).await;
    for id in ["r-1", "r-2"] {
        a.register_agent(json!({"agentId": id})).await;
    }
    assert_map_event(&sse.next().await, 1, &sub, "agent_registered");
    assert_map_event(&sse.next().await, 2, &sub, "agent_registered");
    drop(sse); // the network blips

    for id in ["r-3", "r-4", "r-5"] {
        a.register_agent(json!({"agentId": id})).await;
    }
    let mut sse = c.events(Some(2)).await;
    for (n, id) in (3..).zip(["r-3", "r-4", "r-5"]) {
        let params = assert_map_event(&sse.next().await, n, &sub, "agent_registered");
        assert_eq!(params["event"]["data"]["agentId"], json!(id));
    }
    sse.assert_quiet().await;
    // Live again after the replay, numbering continues.
    a.register_agent(json!({"agentId": "r-6"})).await;
    assert_map_event(&sse.next().await, 6, &sub, "agent_registered");
    drop(sse);

    // Up to date, or beyond anything sent: nothing is resent.
    for last in [6, 1000] {
        let mut sse = c.events(Some(last)).await;
        sse.assert_quiet().await;
    }
}

#[tokio::test]
async fn a_new_stream_replaces_the_previous_one() {
    let (_server, addr, url) = server_with(|_| {}).await;
    let mut c = HttpClient::connect(addr, "client", json!({})).await;
    let sub = c
        .subscribe(json!({"eventTypes": ["agent_registered"]}))
        .await;
    let mut first = c.events(None).await;
    let mut second = c.events(None).await;
    let rest = first.until_end().await;
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert_eq!(rest[0].event, "close");
    assert_eq!(rest[0].json()["code"], json!(1000));
    let mut a = WsClient::connect_as(&url, "agent", json!({})).await;
    a.register_agent(json!({"agentId": "rep-1"})).await;
    assert_map_event(&second.next().await, 1, &sub, "agent_registered");
}

#[tokio::test]
async fn a_gap_event_comes_first_when_the_ring_was_exceeded() {
    // Our own listener, so the ring can be small.
    let cfg = Config {
        listen: Vec::new(),
        ..Config::default()
    };
    let options = cfg.connection_options();
    let server = with_timeout(Server::start(cfg)).await.expect("server");
    let app = routes_with(
        server.context().clone(),
        options,
        HttpSettings {
            ring_frames: 3,
            ..HttpSettings::default()
        },
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    let serving = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let mut c = HttpClient::connect(addr, "agent", json!({})).await;
    let sub = c
        .subscribe(json!({"eventTypes": ["agent_registered"]}))
        .await;
    let mut sse = c.events(None).await;
    for n in 1..=6u64 {
        c.ok("map/agents/register", json!({"agentId": format!("g-{n}")}))
            .await;
        assert_map_event(&sse.next().await, n, &sub, "agent_registered");
    }
    drop(sse);

    let mut sse = c.events(Some(1)).await;
    let gap = sse.next().await;
    assert_eq!(gap.event, "gap");
    assert_eq!(gap.id, None);
    assert_eq!(gap.json(), json!({"lastEventId": 1, "firstAvailable": 4}));
    for n in 4..=6 {
        let params = assert_map_event(&sse.next().await, n, &sub, "agent_registered");
        assert_eq!(params["event"]["data"]["agentId"], json!(format!("g-{n}")));
    }
    sse.assert_quiet().await;
    drop(sse);

    // Within the ring: no gap.
    let mut sse = c.events(Some(4)).await;
    assert_map_event(&sse.next().await, 5, &sub, "agent_registered");
    assert_map_event(&sse.next().await, 6, &sub, "agent_registered");
    sse.assert_quiet().await;
    serving.abort();
}

// ---------------------------------------------------------------------------------------------
// Lifecycle

#[tokio::test]
async fn an_idle_http_connection_expires_and_its_session_resumes_elsewhere() {
    let (_server, addr, url) = server_with(|c| {
        c.websocket.idle_timeout_ms = 300;
        c.websocket.ping_interval_ms = 100;
    })
    .await;
    let mut obs = WsClient::client(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["participant_disconnected"]}))
        .await;
    let c = HttpClient::connect(addr, "client", json!({})).await;
    let (pid, sid) = (c.pid(), c.session["sessionId"].clone());
    let resume = c.session["resumeToken"].as_str().unwrap().to_owned();
    // The observer reads (answering pings) while the HTTP side waits.
    let watching = tokio::spawn(async move {
        let ev = obs.next_event(&sub).await;
        (ev, Instant::now())
    });

    // An attached stream keeps the connection alive past the timeout.
    let sse = c.events(None).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut c = c;
    c.ok("map/agents/list", Value::Null).await;
    drop(sse);
    let idle_from = Instant::now();

    let (ev, at) = with_timeout(watching).await.expect("observer task");
    assert_eq!(ev["event"]["data"]["participantId"], json!(pid));
    assert_eq!(ev["event"]["data"]["reason"], json!("transport_closed"));
    assert!(
        at.duration_since(idle_from) >= Duration::from_millis(250),
        "expired after the idle timeout, not before"
    );

    let r = c.post(&rpc(50, "map/agents/list", Value::Null)).await;
    assert_eq!((r.status, r.json()), (404, unknown_session_body()));

    let r = post(
        addr,
        None,
        &rpc(
            1,
            "map/connect",
            json!({"protocolVersion": 1, "resumeToken": resume}),
        ),
    )
    .await;
    let result = r.json()["result"].clone();
    assert_eq!(result["sessionId"], sid, "{result}");
    assert_eq!(result["participantId"], json!(pid));
    assert_eq!(result["reconnected"], json!(true));
    let token = r.token().expect("a new HTTP connection");
    assert_ne!(token, c.token);
}

#[tokio::test]
async fn delete_and_disconnect_close_the_http_connection() {
    let (_server, addr, url) = server_with(|_| {}).await;
    let mut obs = WsClient::client(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["participant_disconnected"]}))
        .await;

    let c = HttpClient::connect(addr, "client", json!({})).await;
    let mut sse = c.events(None).await;
    let r = request(
        addr,
        "DELETE",
        "/map/session",
        &[("MAP-Session", c.token.as_str())],
        b"",
    )
    .await;
    assert_eq!(r.status, 204);
    assert!(r.body.is_empty());
    assert!(r
        .headers_named("set-cookie")
        .iter()
        .any(|c| c.starts_with("map_session=;") && c.contains("Max-Age=0")));
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["data"]["participantId"], json!(c.pid()));
    assert_eq!(ev["event"]["data"]["reason"], json!("transport_closed"));
    let rest = sse.until_end().await;
    assert_eq!(
        rest.last().map(|e| e.event.as_str()),
        Some("close"),
        "{rest:?}"
    );
    let r = c.post(&rpc(9, "map/agents/list", Value::Null)).await;
    assert_eq!(r.status, 404);

    // map/disconnect ends the MAP session, and with it the HTTP connection.
    let mut d = HttpClient::connect(addr, "client", json!({})).await;
    let bye = d.ok("map/disconnect", json!({"reason": "done"})).await;
    assert!(bye["resumeToken"].is_string());
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["data"]["participantId"], json!(d.pid()));
    let r = d.post(&rpc(9, "map/agents/list", Value::Null)).await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn shutdown_ends_the_event_stream_and_completes() {
    let (server, addr, url) = server_with(|_| {}).await;
    let mut c = HttpClient::connect(addr, "client", json!({})).await;
    let sub = c
        .subscribe(json!({"eventTypes": ["agent_registered"]}))
        .await;
    let mut sse = c.events(None).await;
    let mut a = WsClient::connect_as(&url, "agent", json!({})).await;
    a.register_agent(json!({"agentId": "sd-http"})).await;
    assert_map_event(&sse.next().await, 1, &sub, "agent_registered");

    let stopping = tokio::spawn(server.shutdown());
    let rest = sse.until_end().await;
    let close = rest.last().expect("a close event");
    assert_eq!(close.event, "close");
    assert_eq!(close.json()["code"], json!(1001));
    within(Duration::from_secs(15), stopping)
        .await
        .expect("shutdown completes");
    assert!(
        tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
            .await
            .map_or(true, |r| r.is_err()),
        "the listener is closed"
    );
}

#[tokio::test]
async fn resuming_the_session_elsewhere_ends_the_stream_and_the_http_connection() {
    let (_server, addr, url) = server_with(|_| {}).await;
    let c = HttpClient::connect(addr, "client", json!({})).await;
    let resume = c.session["resumeToken"].clone();
    let mut sse = c.events(None).await;
    let mut w = WsClient::connect(&url).await;
    let r = w
        .ok(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": "client", "resumeToken": resume}),
        )
        .await;
    assert_eq!(r["sessionId"], c.session["sessionId"]);
    let rest = sse.until_end().await;
    let close = rest.last().expect("a close event");
    assert_eq!(close.event, "close");
    assert_eq!(close.json()["code"], json!(4000));
    let r = c.post(&rpc(9, "map/agents/list", Value::Null)).await;
    assert_eq!((r.status, r.json()), (404, unknown_session_body()));
    // The WebSocket holds the session now.
    w.ok("map/agents/list", Value::Null).await;
}
