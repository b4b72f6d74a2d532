//! Shared helpers for the integration tests: an in-process server on `127.0.0.1:0`, a raw
//! WebSocket JSON-RPC client that never loses an interleaved notification, and a timeout around
//! every await (STYLE.md §10).
//!
//! Every test file does `mod common;` and uses what it needs, so some helpers are unused in a
//! given test crate.

#![allow(dead_code)]

#[cfg(feature = "cluster")]
pub mod cluster;
pub mod docs;
#[cfg(feature = "cluster")]
pub mod faults;
pub mod http;
pub mod load;
#[cfg(feature = "cluster")]
pub mod nats;
pub mod otlp;
pub mod phoenix;
pub mod ports;
#[cfg(feature = "cluster")]
pub mod proxy;
pub mod raw;

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir {
    pub path: std::path::PathBuf,
}

impl TempDir {
    pub fn new(label: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "map-router-test-{label}-{}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create a temp dir");
        Self { path }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use map_router::server::{Config, Server};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Bytes, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// The bound on every single await in the tests.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// How long "nothing arrives" is watched for.
pub const QUIET: Duration = Duration::from_millis(250);

/// Awaits `fut` for at most [`TIMEOUT`].
///
/// # Panics
/// When the timeout expires.
pub async fn with_timeout<F: Future>(fut: F) -> F::Output {
    within(TIMEOUT, fut).await
}

/// Awaits `fut` for at most `limit`.
///
/// # Panics
/// When the limit expires.
pub async fn within<F: Future>(limit: Duration, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}"),
    }
}

/// Starts a server on `127.0.0.1:0` with the defaults changed by `tweak`; returns it and its
/// WebSocket URL (`ws://127.0.0.1:PORT/`).
pub async fn start_server(tweak: impl FnOnce(&mut Config)) -> (Server, String) {
    let mut cfg = Config {
        listen: vec!["127.0.0.1:0".parse().expect("valid address")],
        ..Config::default()
    };
    tweak(&mut cfg);
    let server = with_timeout(Server::start(cfg))
        .await
        .expect("server starts");
    let addr = server.local_addrs()[0];
    assert!(addr.ip().is_loopback(), "tests listen on loopback only");
    (server, format!("ws://{addr}/"))
}

/// Runs the Node script `tests/interop/<script>` (an official SDK client) with `args`,
/// bounded by `limit`; asserts it succeeded and returns the one JSON line it printed.
pub async fn node_json(script: &str, args: &[&str], limit: Duration) -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(script);
    let out = within(
        limit,
        tokio::process::Command::new("node")
            .arg(&path)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).expect("one JSON line")
}

/// Starts the built `map-router` binary with `args` (which must make it listen), waits for its
/// listening line, and keeps draining its stderr. Returns the child (killed on drop) and its URL.
pub async fn start_binary<I, S>(args: I) -> (tokio::process::Child, String)
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    start_binary_with_env(args, std::iter::empty::<(&str, &str)>()).await
}

/// The built binary with `args`, none of the router's environment variables, no stdin, killed
/// on drop: how every test runs it ([`start_binary`], or `.output()` for a run expected to end).
pub fn binary_command<I, S>(args: I) -> tokio::process::Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_map-router"));
    cmd.args(args)
        .env_remove("MAP_ROUTER_CONFIG")
        .env_remove("MAP_ROUTER_LISTEN")
        .env_remove("MAP_ROUTER_DATA_DIR")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// As [`start_binary`], with these environment variables set for the binary.
pub async fn start_binary_with_env<I, S, E, K, V>(
    args: I,
    env: E,
) -> (tokio::process::Child, String)
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
    E: IntoIterator<Item = (K, V)>,
    K: AsRef<std::ffi::OsStr>,
    V: AsRef<std::ffi::OsStr>,
{
    use tokio::io::AsyncBufReadExt;
    let mut child = binary_command(args)
        .envs(env)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the binary");
    let stderr = child.stderr.take().expect("piped stderr");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let url = with_timeout(async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            if let Some(url) = line.strip_prefix("map-router listening on ") {
                return url.to_owned();
            }
        }
        panic!("the binary exited before listening");
    })
    .await;
    let pid = child.id().unwrap_or_default();
    // Shown with a failing test's output (the test harness captures it otherwise).
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("[binary {pid}] {line}");
        }
    });
    (child, url)
}

/// An in-memory byte pipe that `server` serves as NDJSON with `opts` (the stdio code path).
/// Returns the client's end and the serving task.
pub fn ndjson_pipe(
    server: &Server,
    opts: map_router::transport::connection::ConnectionOptions,
) -> (tokio::io::DuplexStream, tokio::task::JoinHandle<()>) {
    let (client, served) = tokio::io::duplex(1 << 16);
    let (server_read, server_write) = tokio::io::split(served);
    let ctx = server.context().clone();
    let serving = tokio::spawn(async move {
        map_router::transport::stdio::serve_io(&ctx, server_read, server_write, opts).await;
    });
    (client, serving)
}

/// The path of a test child program in `tests/children/`.
pub fn child_program(name: &str) -> String {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/children")
        .join(name)
        .display()
        .to_string()
}

/// Starts a server with the default configuration.
pub async fn default_server() -> (Server, String) {
    start_server(|_| {}).await
}

/// The exact MAP error object `{code, message, data: {category}}`.
pub fn map_error(code: i64, message: &str, category: &str) -> Value {
    json!({"code": code, "message": message, "data": {"category": category}})
}

/// Asserts a JSON-RPC core error (`-32600`, `-32602`, `-32700`): exact code and message,
/// category `protocol`, and a non-empty `data.details` explaining why.
pub fn assert_protocol_error(err: &Value, code: i64, message: &str) {
    assert_eq!(err["code"], json!(code), "code of {err}");
    assert_eq!(err["message"], json!(message), "message of {err}");
    assert_eq!(
        err["data"]["category"],
        json!("protocol"),
        "category of {err}"
    );
    let details = &err["data"]["details"];
    assert!(
        details.as_str().is_some_and(|d| !d.is_empty()) || details.is_object(),
        "details explain the error: {err}"
    );
}

/// Asserts `-32602 Invalid params`.
pub fn assert_invalid_params(err: &Value) {
    assert_protocol_error(err, -32602, "Invalid params");
}

/// What a read from the socket produced.
#[derive(Debug)]
pub enum Frame {
    /// A text frame holding JSON.
    Json(Value),
    /// The server closed the connection (with its close code, if any).
    Closed(Option<u16>),
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The transports a test client can use, to run one scenario over each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// WebSocket on the server's listener.
    Ws,
    /// The server's in-process channel pair.
    InProcess,
    /// NDJSON over an in-memory byte pipe, served by `Server::serve_io` (the stdio code path).
    Stdio,
    /// `POST /map/rpc` plus the SSE stream `GET /map/events`.
    Http,
}

impl Transport {
    /// Every transport.
    pub const ALL: [Transport; 4] = [
        Transport::Ws,
        Transport::InProcess,
        Transport::Stdio,
        Transport::Http,
    ];
}

/// What carries a test client's frames.
enum Link {
    Ws(Box<Ws>),
    InProcess(map_router::transport::in_process::InProcessLink),
    Stdio {
        writer: tokio::io::WriteHalf<tokio::io::DuplexStream>,
        lines: tokio::io::Lines<tokio::io::BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    },
    Http(Box<HttpLink>),
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Link::Ws(_) => "Ws",
            Link::InProcess(_) => "InProcess",
            Link::Stdio { .. } => "Stdio",
            Link::Http(_) => "Http",
        })
    }
}

/// The HTTP transport as a frame link: each sent frame is a POST whose response body is the
/// next frame read; notifications come from the SSE stream, opened once a token is issued.
struct HttpLink {
    addr: std::net::SocketAddr,
    token: Option<String>,
    responses: VecDeque<Value>,
    sse: Option<http::Sse>,
}

/// A raw JSON-RPC client over any transport (WebSocket by default).
///
/// `call` numbers requests 1, 2, 3, ... and queues every notification that arrives before the
/// response, so `notification`, `next_event` and `next_message` still see them, in order.
#[derive(Debug)]
pub struct WsClient {
    ws: Link,
    next_id: u64,
    queue: VecDeque<Value>,
    /// The last `map/connect` result (`Value::Null` before).
    pub session: Value,
}

impl WsClient {
    /// Opens a WebSocket to `url` (no `map/connect`).
    pub async fn connect(url: &str) -> Self {
        let config = WebSocketConfig::default()
            .max_message_size(Some(64 << 20))
            .max_frame_size(Some(64 << 20));
        let (ws, _) = with_timeout(tokio_tungstenite::connect_async_with_config(
            url,
            Some(config),
            true,
        ))
        .await
        .unwrap_or_else(|e| panic!("WebSocket connect to {url}: {e}"));
        Self::with_link(Link::Ws(Box::new(ws)))
    }

    fn with_link(ws: Link) -> Self {
        Self {
            ws,
            next_id: 1,
            queue: VecDeque::new(),
            session: Value::Null,
        }
    }

    /// Opens a connection over `transport` to `server` (no `map/connect`).
    pub async fn open(transport: Transport, server: &Server) -> Self {
        match transport {
            Transport::Ws => {
                let url = format!("ws://{}/", server.local_addrs()[0]);
                Self::connect(&url).await
            }
            Transport::InProcess => Self::with_link(Link::InProcess(server.connect_in_process())),
            Transport::Stdio => {
                let (client, _serving) = ndjson_pipe(server, Default::default());
                let (read, writer) = tokio::io::split(client);
                use tokio::io::AsyncBufReadExt;
                Self::with_link(Link::Stdio {
                    writer,
                    lines: tokio::io::BufReader::new(read).lines(),
                })
            }
            Transport::Http => Self::with_link(Link::Http(Box::new(HttpLink {
                addr: server.local_addrs()[0],
                token: None,
                responses: VecDeque::new(),
                sse: None,
            }))),
        }
    }

    /// Opens a connection over `transport` and calls `map/connect` as `kind` plus `extra`.
    pub async fn open_as(transport: Transport, server: &Server, kind: &str, extra: Value) -> Self {
        let c = Self::open(transport, server).await;
        c.connected_as(kind, extra).await
    }

    /// An `agent` participant over `transport` that registered `agentId: id` plus `extra`.
    pub async fn open_agent(transport: Transport, server: &Server, id: &str, extra: Value) -> Self {
        let mut c = Self::open_as(transport, server, "agent", json!({})).await;
        let mut params = json!({"agentId": id});
        merge(&mut params, extra);
        let agent = c.register_agent(params).await;
        assert_eq!(agent["id"], json!(id));
        c
    }

    async fn connected_as(mut self, kind: &str, extra: Value) -> Self {
        let mut params = json!({"protocolVersion": 1, "participantType": kind});
        merge(&mut params, extra);
        let result = self.ok("map/connect", params).await;
        assert_eq!(result["participantType"], json!(kind));
        self.session = result;
        self
    }

    /// Opens a WebSocket and calls `map/connect` with `participantType: kind` plus `extra`.
    pub async fn connect_as(url: &str, kind: &str, extra: Value) -> Self {
        let mut c = Self::connect(url).await;
        let mut params = json!({"protocolVersion": 1, "participantType": kind});
        merge(&mut params, extra);
        let result = c.ok("map/connect", params).await;
        assert_eq!(result["participantType"], json!(kind));
        c.session = result;
        c
    }

    /// A connected `client` participant.
    pub async fn client(url: &str) -> Self {
        Self::connect_as(url, "client", json!({})).await
    }

    /// A connected `system` participant.
    pub async fn system(url: &str) -> Self {
        Self::connect_as(url, "system", json!({})).await
    }

    /// An `agent` participant that registered one agent with `agentId: id` plus `extra`.
    pub async fn agent(url: &str, id: &str, extra: Value) -> Self {
        let mut c = Self::connect_as(url, "agent", json!({})).await;
        let mut params = json!({"agentId": id});
        merge(&mut params, extra);
        let agent = c.register_agent(params).await;
        assert_eq!(agent["id"], json!(id));
        c
    }

    /// This connection's participant id (after `map/connect`).
    pub fn pid(&self) -> String {
        self.session["participantId"]
            .as_str()
            .expect("connected: participantId")
            .to_owned()
    }

    /// This connection's session id (after `map/connect`).
    pub fn sid(&self) -> String {
        self.session["sessionId"]
            .as_str()
            .expect("connected: sessionId")
            .to_owned()
    }

    /// Sends a text frame as is.
    pub async fn send_raw(&mut self, text: &str) {
        match &mut self.ws {
            Link::Ws(ws) => with_timeout(ws.send(Message::text(text.to_owned())))
                .await
                .expect("send text frame"),
            Link::InProcess(link) => with_timeout(link.tx.send(text.to_owned()))
                .await
                .expect("send in-process frame"),
            Link::Stdio { writer, .. } => {
                use tokio::io::AsyncWriteExt;
                with_timeout(writer.write_all(format!("{text}\n").as_bytes()))
                    .await
                    .expect("write line");
            }
            Link::Http(h) => {
                let r = http::post(h.addr, h.token.as_deref(), text).await;
                if h.token.is_none() {
                    if let Some(token) = r.token() {
                        h.sse = Some(http::Sse::open(h.addr, &token, None).await);
                        h.token = Some(token);
                    }
                }
                if !r.body.is_empty() {
                    h.responses.push_back(r.json());
                }
            }
        }
    }

    fn ws(&mut self) -> &mut Ws {
        match &mut self.ws {
            Link::Ws(ws) => ws,
            other => panic!("a WebSocket operation on a {other:?} link"),
        }
    }

    /// Sends a binary frame.
    pub async fn send_binary(&mut self, bytes: &[u8]) {
        with_timeout(
            self.ws()
                .send(Message::Binary(Bytes::copy_from_slice(bytes))),
        )
        .await
        .expect("send binary frame");
    }

    /// Sends a JSON value as one text frame.
    pub async fn send_json(&mut self, v: &Value) {
        self.send_raw(&v.to_string()).await;
    }

    /// Sends a close frame and waits (bounded) for the server to finish the close handshake.
    pub async fn close(mut self) {
        if let Link::Ws(ws) = &mut self.ws {
            let _ = with_timeout((**ws).close(None)).await;
            let _ = tokio::time::timeout(TIMEOUT, async {
                while let Some(Ok(_)) = ws.next().await {}
            })
            .await;
        }
    }

    /// Drops the TCP connection without a close handshake (an abrupt transport loss).
    pub fn drop_abruptly(self) {
        drop(self);
    }

    /// Reads the next frame from the socket, skipping pings and pongs; bypasses the queue.
    pub async fn read_frame(&mut self) -> Frame {
        within(TIMEOUT, self.read_frame_unbounded()).await
    }

    async fn read_frame_unbounded(&mut self) -> Frame {
        let parse = |t: &str| -> Frame {
            Frame::Json(
                serde_json::from_str(t)
                    .unwrap_or_else(|e| panic!("server sent invalid JSON ({e}): {t}")),
            )
        };
        let ws = match &mut self.ws {
            Link::Ws(ws) => ws,
            Link::InProcess(link) => {
                return match link.rx.next().await {
                    Some(t) => parse(&t),
                    None => Frame::Closed(None),
                }
            }
            Link::Stdio { lines, .. } => {
                return match lines.next_line().await {
                    Ok(Some(t)) => parse(&t),
                    _ => Frame::Closed(None),
                }
            }
            Link::Http(h) => {
                if let Some(v) = h.responses.pop_front() {
                    return Frame::Json(v);
                }
                let Some(sse) = h.sse.as_mut() else {
                    panic!("nothing to read: no pending response and no event stream yet");
                };
                return match sse.next_unbounded().await {
                    Some(ev) if ev.event == "close" => {
                        Frame::Closed(ev.json()["code"].as_u64().map(|c| c as u16))
                    }
                    Some(ev) => Frame::Json(ev.json()),
                    None => Frame::Closed(None),
                };
            }
        };
        loop {
            match ws.next().await {
                None => return Frame::Closed(None),
                // The peer went away without a close frame (a killed router resets the
                // connection): the connection ended, as a stream end says.
                Some(Err(
                    tokio_tungstenite::tungstenite::Error::Io(_)
                    | tokio_tungstenite::tungstenite::Error::ConnectionClosed
                    | tokio_tungstenite::tungstenite::Error::AlreadyClosed
                    | tokio_tungstenite::tungstenite::Error::Protocol(
                        tokio_tungstenite::tungstenite::error::ProtocolError::ResetWithoutClosingHandshake,
                    ),
                )) => return Frame::Closed(None),
                Some(Err(e)) => panic!("WebSocket read failed: {e}"),
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str())
                        .unwrap_or_else(|e| panic!("server sent invalid JSON ({e}): {t}"));
                    return Frame::Json(v);
                }
                Some(Ok(Message::Binary(b))) => panic!("server sent a binary frame: {b:?}"),
                Some(Ok(Message::Close(frame))) => {
                    return Frame::Closed(frame.map(|f| u16::from(f.code)))
                }
                Some(Ok(_)) => continue,
            }
        }
    }

    /// Reads the next JSON frame from the socket (bypassing the queue).
    ///
    /// # Panics
    /// When the connection closes instead.
    pub async fn read_json(&mut self) -> Value {
        match self.read_frame().await {
            Frame::Json(v) => v,
            Frame::Closed(code) => panic!("connection closed (code {code:?}) instead of a frame"),
        }
    }

    /// Reads frames until the server closes; returns the close code. Notifications that arrive
    /// first are queued. Responses are not expected.
    pub async fn expect_close(&mut self) -> Option<u16> {
        loop {
            match self.read_frame().await {
                Frame::Closed(code) => return code,
                Frame::Json(v) if is_notification(&v) => self.queue.push_back(v),
                Frame::Json(v) => panic!("unexpected frame while waiting for close: {v}"),
            }
        }
    }

    /// Sends a request frame (text as given) and returns the next frame that is not a
    /// notification (a response object or a batch array). Notifications are queued.
    pub async fn request_raw(&mut self, text: &str) -> Value {
        self.send_raw(text).await;
        self.next_non_notification().await
    }

    /// The next frame that is not a notification; notifications are queued.
    pub async fn next_non_notification(&mut self) -> Value {
        for _ in 0..100_000 {
            let v = self.read_json().await;
            if is_notification(&v) {
                self.queue.push_back(v);
            } else {
                return v;
            }
        }
        panic!("no response among 100000 frames");
    }

    /// Calls `method`. `params` of `Value::Null` sends no `params` key. Returns the `result` or
    /// the `error` object.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.next_id;
        self.next_id += 1;
        let mut req = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if !params.is_null() {
            req["params"] = params;
        }
        self.send_json(&req).await;
        let resp = self.next_non_notification().await;
        assert_eq!(resp["jsonrpc"], json!("2.0"), "response envelope: {resp}");
        assert_eq!(resp["id"], json!(id), "response to request {id}: {resp}");
        match (resp.get("result"), resp.get("error")) {
            (Some(r), None) => Ok(r.clone()),
            (None, Some(e)) => Err(e.clone()),
            _ => panic!("a response has exactly one of result/error: {resp}"),
        }
    }

    /// Calls `method` and expects success.
    pub async fn ok(&mut self, method: &str, params: Value) -> Value {
        match self.call(method, params.clone()).await {
            Ok(v) => v,
            Err(e) => panic!("{method} {params} failed: {e}"),
        }
    }

    /// Calls `method` and expects an error; returns the error object.
    pub async fn err(&mut self, method: &str, params: Value) -> Value {
        match self.call(method, params.clone()).await {
            Ok(v) => panic!("{method} {params} succeeded with {v}; expected an error"),
            Err(e) => e,
        }
    }

    /// `map/agents/register`; returns the agent record.
    pub async fn register_agent(&mut self, params: Value) -> Value {
        self.ok("map/agents/register", params).await["agent"].clone()
    }

    /// `map/subscribe` with `filter` (`Value::Null`: no filter); returns the subscription id.
    pub async fn subscribe(&mut self, filter: Value) -> String {
        let params = if filter.is_null() {
            json!({})
        } else {
            json!({ "filter": filter })
        };
        self.subscribe_with(params).await
    }

    /// `map/subscribe` with the given params; returns the subscription id.
    pub async fn subscribe_with(&mut self, params: Value) -> String {
        let r = self.ok("map/subscribe", params).await;
        r["subscriptionId"]
            .as_str()
            .expect("subscriptionId is a string")
            .to_owned()
    }

    /// `map/send`; returns the result `{messageId, delivered}`.
    pub async fn send(&mut self, to: Value, payload: Value) -> Value {
        self.ok("map/send", json!({"to": to, "payload": payload}))
            .await
    }

    /// The next notification matching `pred` (queued ones first, in order); notifications
    /// that do not match stay queued.
    pub async fn next_notification_where(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(pos) = self.queue.iter().position(&pred) {
            return self.queue.remove(pos).expect("position is valid");
        }
        for _ in 0..100_000 {
            let v = self.read_json().await;
            assert!(
                is_notification(&v),
                "unexpected response while waiting for a notification: {v}"
            );
            if pred(&v) {
                return v;
            }
            self.queue.push_back(v);
        }
        panic!("no matching notification among 100000 frames");
    }

    /// The next notification with `method`; returns the whole frame.
    pub async fn notification(&mut self, method: &str) -> Value {
        self.next_notification_where(|v| v["method"] == json!(method))
            .await
    }

    /// The `params` of the next `map/event` for subscription `sub`.
    pub async fn next_event(&mut self, sub: &str) -> Value {
        let frame = self
            .next_notification_where(|v| {
                v["method"] == json!("map/event") && v["params"]["subscriptionId"] == json!(sub)
            })
            .await;
        frame["params"].clone()
    }

    /// Reads events of `sub` until one of type `kind` arrives; returns it (earlier events of
    /// `sub` are discarded).
    pub async fn event_of_type(&mut self, sub: &str, kind: &str) -> Value {
        for _ in 0..10_000 {
            let ev = self.next_event(sub).await;
            if ev["event"]["type"] == json!(kind) {
                return ev;
            }
        }
        panic!("no {kind} event among 10000");
    }

    /// The `message` of the next `map/message`.
    pub async fn next_message(&mut self) -> Value {
        self.notification("map/message").await["params"]["message"].clone()
    }

    /// Asserts that no notification satisfying `pred` is queued or arrives within [`QUIET`]
    /// (other notifications are queued).
    pub async fn assert_none_where(&mut self, what: &str, pred: impl Fn(&Value) -> bool) {
        if let Some(v) = self.queue.iter().find(|v| pred(v)) {
            panic!("unexpected {what}: {v}");
        }
        let deadline = tokio::time::Instant::now() + QUIET;
        loop {
            let frame = match tokio::time::timeout_at(deadline, self.read_frame_unbounded()).await {
                Err(_) => return,
                Ok(f) => f,
            };
            match frame {
                Frame::Json(v) => {
                    assert!(!pred(&v), "unexpected {what}: {v}");
                    self.queue.push_back(v);
                }
                Frame::Closed(code) => panic!("connection closed ({code:?}) while quiet"),
            }
        }
    }

    /// Asserts that no event for `sub` is queued or arrives within [`QUIET`].
    pub async fn assert_no_event(&mut self, sub: &str) {
        let sub = sub.to_owned();
        self.assert_none_where("event", move |v| {
            v["method"] == json!("map/event") && v["params"]["subscriptionId"] == json!(sub)
        })
        .await;
    }

    /// Asserts that no `map/message` is queued or arrives within [`QUIET`].
    pub async fn assert_no_message(&mut self) {
        self.assert_none_where("map/message", |v| v["method"] == json!("map/message"))
            .await;
    }

    /// Asserts that nothing at all is queued or arrives within [`QUIET`].
    pub async fn assert_silent(&mut self) {
        self.assert_none_where("frame", |_| true).await;
    }

    /// Removes and returns every queued notification.
    pub fn take_queued(&mut self) -> Vec<Value> {
        self.queue.drain(..).collect()
    }
}

/// Whether a frame is a notification (an object with `method` and no `id` key).
pub fn is_notification(v: &Value) -> bool {
    v.get("method").is_some() && v.get("id").is_none()
}

/// Shallow-merges the keys of `extra` (an object, or null) into `base`.
pub fn merge(base: &mut Value, extra: Value) {
    match extra {
        Value::Null => {}
        Value::Object(map) => {
            for (k, v) in map {
                base[k] = v;
            }
        }
        other => panic!("extra params must be an object, got {other}"),
    }
}

/// The sorted string values of a JSON array (for order-insensitive comparisons).
pub fn sorted_strings(v: &Value) -> Vec<String> {
    let mut out: Vec<String> = v
        .as_array()
        .unwrap_or_else(|| panic!("expected an array, got {v}"))
        .iter()
        .map(|x| {
            x.as_str()
                .unwrap_or_else(|| panic!("expected strings in {v}"))
                .to_owned()
        })
        .collect();
    out.sort();
    out
}

/// Sorted owned strings from literals.
pub fn strings(items: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = items.iter().map(|s| (*s).to_owned()).collect();
    v.sort();
    v
}

/// The ids of an array of agent records, in order.
pub fn ids(agents: &Value) -> Vec<String> {
    agents
        .as_array()
        .unwrap_or_else(|| panic!("expected an array of agents, got {agents}"))
        .iter()
        .map(|a| a["id"].as_str().expect("agent id").to_owned())
        .collect()
}

/// A listing result (`map/agents/list`, `map/scopes/list`, `map/structure/graph`) without its
/// `asOf`, after checking that `asOf`, when present, is an event id (26-character ULID).
pub fn without_as_of(result: &Value) -> Value {
    let mut r = result.clone();
    if let Some(o) = r.as_object_mut() {
        if let Some(as_of) = o.remove("asOf") {
            let id = as_of.as_str().unwrap_or_default();
            assert!(
                id.len() == 26 && id.chars().all(|c| c.is_ascii_alphanumeric()),
                "asOf is not an event id: {as_of}"
            );
        }
    }
    r
}

/// Runs `promtool check metrics` (Prometheus's own linter) on `text` (the classic text format) and
/// fails the test with promtool's complaint and the text if it does not pass.
pub async fn promtool_check(text: &str) {
    use tokio::io::AsyncWriteExt;
    let mut promtool = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("promtool is installed (scripts/setup.sh installs Debian's prometheus)");
    let mut stdin = promtool.stdin.take().unwrap();
    with_timeout(stdin.write_all(text.as_bytes()))
        .await
        .unwrap();
    drop(stdin);
    let out = with_timeout(promtool.wait_with_output()).await.unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every event `map/replay` returns to `c` after `after` (all when `None`), paging by 1000.
pub async fn replay_all(c: &mut WsClient, after: Option<&str>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    let mut cursor = after.map(str::to_owned);
    for _ in 0..10_000 {
        let mut params = json!({"limit": 1000});
        if let Some(id) = &cursor {
            params["afterEventId"] = json!(id);
        }
        let r = c.ok("map/replay", params).await;
        out.extend(r["events"].as_array().expect("events").iter().cloned());
        cursor = out
            .last()
            .map(|e| e["eventId"].as_str().unwrap().to_owned());
        if r["hasMore"] != json!(true) {
            return out;
        }
    }
    panic!("replay did not end");
}

/// Opens a WebSocket to `url` and calls `map/connect` as `kind` with the API key `key` (and
/// `extra` connect params); panics unless admitted. Returns the client and the result.
pub async fn connect_with_key(url: &str, key: &str, kind: &str, extra: Value) -> (WsClient, Value) {
    let mut c = WsClient::connect(url).await;
    let mut params = json!({"protocolVersion": 1, "participantType": kind,
        "auth": {"method": "api-key", "credential": key}});
    merge(&mut params, extra);
    let r = c.ok("map/connect", params).await;
    assert!(r.get("sessionId").is_some(), "not admitted: {r}");
    (c, r)
}

/// Runs `test` on a thread of its own with a 16 MiB stack and a current-thread runtime: some
/// tests' futures overflow the test thread's 2 MiB stack in a debug build.
pub fn on_big_stack<F>(test: impl FnOnce() -> F + Send + 'static)
where
    F: Future<Output = ()>,
{
    std::thread::Builder::new()
        .stack_size(16 << 20)
        .spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(test());
        })
        .unwrap()
        .join()
        .unwrap();
}
