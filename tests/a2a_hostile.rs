//! The A2A gateway under abuse (issue 23): real processes on loopback, each case asserting
//! what must NOT happen. A canary HTTP listener on loopback stands for every internal service
//! and must receive nothing; while an attack runs, an unrelated A2A caller must be answered
//! within 2 s and a MAP client (WebSocket) must keep getting answers; a flooder's victim keeps
//! at least 95 % of its calls; a stalled body is cut within 15 s; after kill -9 no task is left
//! `working` without a live agent. Every await is bounded; every loop is bounded in count and
//! time.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::response::IntoResponse;
use common::http::{find, parse_head, request, HttpResponse};
use common::*;
use futures::StreamExt;
use map_router::client::{AgentHandle, Client, ClientOptions};
use map_router::protocol::json::RawJson;
use map_router::protocol::message::Message as MapMessage;
use map_router::protocol::methods::agents::RegisterParams;
use map_router::protocol::methods::messaging::SendParams;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

/// How long an unrelated caller may wait while an attack runs.
const ANSWERED_WITHIN: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------------
// Canaries

/// A listener on loopback standing for an internal service (an admin port, the metadata
/// service): it answers anything with a secret, and must never be reached.
struct Canary {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
}

impl Canary {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&hits);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let body = r#"{"name":"CANARY-SECRET","url":"http://127.0.0.1:1/"}"#;
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            }
        });
        Self { addr, hits }
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn assert_untouched(&self, what: &str) {
        assert_eq!(
            self.hits.load(Ordering::SeqCst),
            0,
            "{what}: the internal canary was reached"
        );
    }
}

/// A MAP client over WebSocket asking the router something every 50 ms while an attack runs;
/// [`MapCanary::finish`] asserts every answer came within [`ANSWERED_WITHIN`].
struct MapCanary {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<(usize, Duration)>,
}

impl MapCanary {
    /// With authentication on, `key` is the canary's credential.
    async fn start(url: &str, key: Option<&str>) -> Self {
        let mut options = ClientOptions::new().name("map-canary");
        if let Some(k) = key {
            options = options.api_key(k);
        }
        let client = with_timeout(Client::connect_ws(url, options))
            .await
            .expect("the MAP canary connects");
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let (mut n, mut worst) = (0usize, Duration::ZERO);
            // Bounded: at most 2000 asks (100 s at 50 ms).
            for _ in 0..2000 {
                if *stopped.borrow() {
                    break;
                }
                let t = Instant::now();
                within(ANSWERED_WITHIN, client.list_agents(Default::default()))
                    .await
                    .expect("the MAP canary is answered");
                worst = worst.max(t.elapsed());
                n += 1;
                let _ = tokio::time::timeout(Duration::from_millis(50), stopped.changed()).await;
            }
            (n, worst)
        });
        Self { stop, task }
    }

    async fn finish(self, what: &str) -> Duration {
        self.stop.send_replace(true);
        let (n, worst) = within(Duration::from_secs(5), self.task)
            .await
            .expect("the MAP canary did not panic");
        assert!(n > 0, "{what}: the MAP canary was answered");
        assert!(worst < ANSWERED_WITHIN, "{what}: MAP answered in {worst:?}");
        worst
    }
}

/// An unrelated A2A caller: a `GetTask` of no task, answered -32001 within
/// [`ANSWERED_WITHIN`]. Returns how long it took.
async fn unrelated(addr: SocketAddr, key: Option<&str>) -> Duration {
    let t = Instant::now();
    let r = within(
        ANSWERED_WITHIN,
        post(
            addr,
            "/a2a",
            key,
            &rpc_body(json!(7), "GetTask", json!({"id": "task-none"})),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(r.json()["error"]["code"], -32001, "{}", text(&r));
    t.elapsed()
}

// ---------------------------------------------------------------------------------------------
// A2A over HTTP

fn rpc_body(id: Value, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

fn text(r: &HttpResponse) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

async fn post(addr: SocketAddr, path: &str, key: Option<&str>, body: &str) -> HttpResponse {
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    request(addr, "POST", path, &headers, body.as_bytes()).await
}

async fn call(
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
    method: &str,
    params: Value,
) -> Value {
    let r = post(addr, path, key, &rpc_body(json!(1), method, params)).await;
    serde_json::from_slice(&r.body).unwrap_or_else(|_| panic!("{method}: {}", text(&r)))
}

fn v1_text(text: &str) -> Value {
    json!({"messageId": format!("m-{}", map_router::protocol::ids::Ulid::random()), "role": "ROLE_USER", "parts": [{"text": text}]})
}

/// One raw HTTP exchange from the source address `from` (any 127/8 address is loopback):
/// status, `Retry-After`, body.
async fn post_from(
    from: IpAddr,
    addr: SocketAddr,
    path: &str,
    body: &str,
) -> (u16, Option<String>, Vec<u8>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let split = find(&raw, b"\r\n\r\n").expect("a response head");
    let (status, headers) = parse_head(&raw[..split]);
    let retry = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("retry-after"))
        .map(|(_, v)| v.clone());
    let mut rest = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        let mut out = Vec::new();
        common::http::dechunk(&mut rest, &mut out);
        rest = out;
    }
    (status, retry, rest)
}

/// A MAP agent that answers every message with `answer(payload)` (an ordinary reply).
async fn agent_answering(
    url: &str,
    name: &str,
    answer: impl Fn(&MapMessage) -> Option<RawJson> + Send + 'static,
) -> (Client, AgentHandle) {
    agent_as(url, None, name, answer).await
}

/// [`agent_answering`], with `key` as its credential when authentication is on.
async fn agent_as(
    url: &str,
    key: Option<&str>,
    name: &str,
    answer: impl Fn(&MapMessage) -> Option<RawJson> + Send + 'static,
) -> (Client, AgentHandle) {
    let mut options = ClientOptions::agent().name(name);
    if let Some(k) = key {
        options = options.api_key(k);
    }
    let client = with_timeout(Client::connect_ws(url, options))
        .await
        .expect("agent connects");
    let handle = with_timeout(client.register(RegisterParams {
        name: Some(name.into()),
        ..RegisterParams::default()
    }))
    .await
    .expect("agent registers");
    let mut messages = handle.messages();
    let c = client.clone();
    tokio::spawn(async move {
        while let Some(m) = messages.next().await {
            let Some(payload) = answer(&m) else { continue };
            let correlation = m.correlation_id().unwrap_or_else(|| m.id.to_string());
            let _ = c
                .send_with(SendParams {
                    to: RawJson::from(json!({"agent": m.from})),
                    payload: Some(payload),
                    meta: Some(RawJson::from(
                        json!({"correlationId": correlation, "isResult": true}),
                    )),
                })
                .await;
        }
    });
    (client, handle)
}

/// An agent that echoes (cancel notices aside).
async fn echo(url: &str, name: &str) -> (Client, AgentHandle) {
    echo_as(url, None, name).await
}

/// [`echo`] with a credential.
async fn echo_as(url: &str, key: Option<&str>, name: &str) -> (Client, AgentHandle) {
    agent_as(url, key, name, |m| {
        let p = m.payload.clone().unwrap_or_default();
        (!p.get().contains("\"cancel\"")).then_some(p)
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// H3: remote agents reach nothing internal

/// A scripted remote A2A agent on loopback: its card (whose endpoint is `endpoint`, absolute
/// or relative), an error page and a JSON page with a secret, and a JSON-RPC endpoint whose
/// tasks stay `working` forever. Counts the requests it gets.
struct Remote {
    base: String,
    requests: Arc<AtomicUsize>,
    polls: Arc<AtomicUsize>,
}

async fn remote(endpoint: String) -> Remote {
    use axum::routing::{get, post};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(AtomicUsize::new(0));
    let polls = Arc::new(AtomicUsize::new(0));
    let (r, p) = (Arc::clone(&requests), Arc::clone(&polls));
    let card = json!({"name": "Stuck", "supportedInterfaces": [
        {"url": endpoint, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
        "capabilities": {"streaming": false}, "skills": []});
    let app = axum::Router::new()
        .route(
            "/.well-known/agent-card.json",
            get(move || {
                let card = card.clone();
                async move { ([("content-type", "application/json")], card.to_string()) }
            }),
        )
        .route(
            "/error",
            get(|| async {
                (
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "REMOTE-SECRET stack trace",
                )
            }),
        )
        .route(
            "/notcard",
            get(|| async {
                (
                    [("content-type", "application/json")],
                    r#"["REMOTE-SECRET"]"#,
                )
            }),
        )
        .route(
            "/rpc",
            post(move |body: String| {
                let (r, p) = (Arc::clone(&r), Arc::clone(&p));
                async move {
                    r.fetch_add(1, Ordering::SeqCst);
                    let req: Value = serde_json::from_str(&body).unwrap_or_default();
                    if req["method"] == "GetTask" {
                        p.fetch_add(1, Ordering::SeqCst);
                    }
                    let task = json!({"id": "t-stuck", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}});
                    let result = if req["method"] == "GetTask" {
                        task
                    } else {
                        json!({ "task": task })
                    };
                    let v = json!({"jsonrpc": "2.0", "id": req["id"], "result": result});
                    ([("content-type", "application/json")], v.to_string()).into_response()
                }
            }),
        );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Remote {
        base,
        requests,
        polls,
    }
}

async fn register(addr: SocketAddr, key: Option<&str>, body: Value) -> (u16, Value, String) {
    let r = match key {
        Some(k) => {
            let bearer = format!("Bearer {k}");
            request(
                addr,
                "POST",
                "/a2a/remote",
                &[
                    ("Content-Type", "application/json"),
                    ("Authorization", &bearer),
                ],
                body.to_string().as_bytes(),
            )
            .await
        }
        None => {
            request(
                addr,
                "POST",
                "/a2a/remote",
                &[("Content-Type", "application/json")],
                body.to_string().as_bytes(),
            )
            .await
        }
    };
    let raw = text(&r);
    (
        r.status,
        serde_json::from_str(&raw).unwrap_or(Value::Null),
        raw,
    )
}

#[tokio::test]
async fn registering_remotes_reaches_nothing_internal_and_echoes_nothing() {
    let canary = Canary::start().await;
    let cport = canary.port();
    // Off by default: nothing is fetched.
    let (server, _url) = start_server(|_| {}).await;
    let addr = server.local_addrs()[0];
    let (status, body, _) = register(
        addr,
        None,
        json!({"cardUrl": format!("http://127.0.0.1:{cport}/")}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("remote_allow is empty"),
        "{body}"
    );
    server.shutdown().await;

    // A remote whose card names the canary as its endpoint; another whose endpoint is its own.
    let evil = remote(format!("http://127.0.0.1:{cport}/admin")).await;
    let evil_wild = remote(format!("http://localhost:{cport}/admin")).await;
    // A port with nothing listening: held until the router has its own port (it once got
    // this one, which the allow-list below names, and its own routes were then allowed).
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    // An open port that does not speak HTTP: it accepts and hangs up.
    let mute = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mute_port = mute.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = mute.accept().await {
            drop(s);
        }
    });
    let allow = vec![
        // Any host on the canary's port: never a loopback or private address, however spelled.
        format!("http://*:{cport}/"),
        "http://*/".to_owned(),
        format!("{}/", evil.base),
        format!("{}/", evil_wild.base),
        format!("http://127.0.0.1:{closed_port}/"),
        format!("http://127.0.0.1:{mute_port}/"),
    ];
    let (server, url) = start_server(move |c| c.a2a.remote_allow = allow).await;
    let addr = server.local_addrs()[0];
    drop(closed);
    let map = MapCanary::start(&url, None).await;
    let internal = [
        format!("http://127.0.0.1:{cport}/"),
        format!("http://localhost:{cport}/"),
        format!("http://0x7f000001:{cport}/"),
        format!("http://2130706433:{cport}/"),
        format!("http://0177.0.0.1:{cport}/"),
        format!("http://127.1:{cport}/"),
        format!("http://[::ffff:127.0.0.1]:{cport}/"),
        format!("http://[::ffff:7f00:1]:{cport}/"),
        format!("http://[::1]:{cport}/"),
        format!("http://0.0.0.0:{cport}/"),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://[fd00::1]/".to_owned(),
        "http://10.0.0.1/".to_owned(),
    ];
    for card in &internal {
        let t = Instant::now();
        let (status, body, raw) = register(addr, None, json!({"cardUrl": card})).await;
        assert_eq!(status, 403, "{card}: {raw}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "{card}: refused at once"
        );
        assert!(!raw.contains("CANARY"), "{card}: {body}");
    }
    // The router's own routes are not on the list at all.
    let own = format!("http://{addr}/metrics");
    let (status, _, raw) = register(addr, None, json!({"cardUrl": own})).await;
    assert_eq!(status, 403, "{raw}");
    // A card (from an allowed remote) that names an internal endpoint: refused at
    // registration, so no A2A message can ever be posted there.
    for r in [&evil, &evil_wild] {
        let (status, _, raw) = register(
            addr,
            None,
            json!({"cardUrl": format!("{}/.well-known/agent-card.json", r.base)}),
        )
        .await;
        assert_eq!(status, 403, "{raw}");
        assert!(raw.contains("endpoint the card names"), "{raw}");
    }
    // Error bodies and non-cards are not echoed.
    for path in ["/error", "/notcard"] {
        let (status, _, raw) = register(
            addr,
            None,
            json!({"cardUrl": format!("{}{path}", evil.base)}),
        )
        .await;
        assert_eq!(status, 502, "{raw}");
        assert!(!raw.contains("REMOTE-SECRET"), "{raw}");
    }
    // A closed port and an open one that hangs up read the same: no port scanning.
    let (s1, _, closed_text) = register(
        addr,
        None,
        json!({"cardUrl": format!("http://127.0.0.1:{closed_port}/c")}),
    )
    .await;
    let (s2, _, mute_text) = register(
        addr,
        None,
        json!({"cardUrl": format!("http://127.0.0.1:{mute_port}/c")}),
    )
    .await;
    assert_eq!((s1, s2), (502, 502));
    assert_eq!(
        closed_text.replace(&closed_port.to_string(), "PORT"),
        mute_text.replace(&mute_port.to_string(), "PORT"),
    );
    assert!(closed_text.contains("remote unreachable"), "{closed_text}");
    unrelated(addr, None).await;
    map.finish("registrations").await;
    canary.assert_untouched("registrations");
    assert_eq!(evil.requests.load(Ordering::SeqCst), 0, "no call was made");
    server.shutdown().await;
}

const OPS: &str = "ak-ops-0123456789abcdef";
const ALICE: &str = "ak-alice-0123456789abcdef";
const BOB: &str = "ak-bob-0123456789abcdef";

#[tokio::test]
async fn remotes_are_their_registrants_and_their_polls_are_bounded_and_stop_on_delete() {
    let stuck = remote("/rpc".into()).await;
    let card = format!("{}/.well-known/agent-card.json", stuck.base);
    let allow = vec![format!("{}/", stuck.base)];
    let (server, url) = start_server(move |c| {
        c.auth.api_keys.inline = Some(map_router::auth::config::Secret(format!(
            "{OPS} ops,{ALICE} alice,{BOB} bob"
        )));
        c.auth.system_principals = vec!["ops".into()];
        c.a2a.remote_allow = allow;
        c.a2a.max_remotes_per_principal = 2;
    })
    .await;
    let addr = server.local_addrs()[0];
    let list = |key: &'static str| async move {
        let bearer = format!("Bearer {key}");
        let r = request(
            addr,
            "GET",
            "/a2a/remote",
            &[("Authorization", &bearer)],
            b"",
        )
        .await;
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        v["remotes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["agentId"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let delete = |key: &'static str, id: &'static str| async move {
        let bearer = format!("Bearer {key}");
        request(
            addr,
            "DELETE",
            &format!("/a2a/remote/{id}"),
            &[("Authorization", &bearer)],
            b"",
        )
        .await
        .status
    };
    let (status, _, raw) =
        register(addr, Some(ALICE), json!({"cardUrl": card, "name": "stuck"})).await;
    assert_eq!(status, 201, "{raw}");
    let (status, _, raw) = register(
        addr,
        Some(ALICE),
        json!({"cardUrl": card, "name": "stuck-2"}),
    )
    .await;
    assert_eq!(status, 201, "{raw}");
    // A cap per principal: alice's third is refused, bob still registers his own.
    let (status, _, raw) = register(
        addr,
        Some(ALICE),
        json!({"cardUrl": card, "name": "stuck-3"}),
    )
    .await;
    assert_eq!(status, 429, "{raw}");
    assert!(raw.contains("per principal (limit 2)"), "{raw}");
    let (status, _, raw) =
        register(addr, Some(BOB), json!({"cardUrl": card, "name": "bobs"})).await;
    assert_eq!(status, 201, "{raw}");
    // Each sees its own; the system principal sees all; bob cannot delete alice's.
    assert_eq!(list(ALICE).await, ["stuck", "stuck-2"]);
    assert_eq!(list(BOB).await, ["bobs"]);
    assert_eq!(list(OPS).await, ["bobs", "stuck", "stuck-2"]);
    assert_eq!(delete(BOB, "stuck").await, 404);
    assert_eq!(list(ALICE).await, ["stuck", "stuck-2"]);
    assert_eq!(delete(OPS, "stuck-2").await, 200);

    // 16 messages to a remote whose tasks stay working: its polls share one budget.
    let sender = with_timeout(Client::connect_ws(
        &url,
        ClientOptions::new().api_key(ALICE),
    ))
    .await
    .unwrap();
    for n in 0..16 {
        with_timeout(sender.send_with(SendParams {
            to: RawJson::from(json!({"agent": "stuck"})),
            payload: Some(RawJson::from(json!(format!("work {n}")))),
            meta: None,
        }))
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let polls = stuck.polls.load(Ordering::SeqCst);
    let sends = stuck.requests.load(Ordering::SeqCst) - polls;
    assert_eq!(sends, 16, "each message is one call");
    // One poll per 500 ms per remote, whatever the number of calls (before: 16 every 500 ms).
    eprintln!("stuck remote: 16 calls, {polls} polls in 3 s");
    assert!(polls <= 8, "{polls} polls in 3 s");
    // Unregistered: no call of it polls again.
    assert_eq!(delete(ALICE, "stuck").await, 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = stuck.requests.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        stuck.requests.load(Ordering::SeqCst),
        after,
        "polling went on after the delete"
    );
    unrelated(addr, Some(BOB)).await;
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// L1: webhooks where push_allow says, after normalisation

#[tokio::test]
async fn webhooks_go_only_to_allowed_urls_as_normalised() {
    // The docs' old example, every loopback port at once, is refused at start.
    let bad = map_router::server::Server::start(map_router::server::Config {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        a2a: map_router::server::config::A2aSettings {
            push_allow: vec!["http://127.0.0.1:".into()],
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    assert!(bad.is_err(), "an entry without its port is refused");

    let canary = Canary::start().await;
    let hook = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_addr = hook.local_addr().unwrap();
    let (tx, mut heads) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = hook.accept().await {
            let mut raw = Vec::new();
            let mut buf = [0u8; 4096];
            while find(&raw, b"\r\n\r\n").is_none() {
                let n = s.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                raw.extend_from_slice(&buf[..n]);
            }
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                .await;
            let _ = tx.send(String::from_utf8_lossy(&raw).into_owned());
        }
    });
    let allowed = format!("http://{hook_addr}/hook/");
    let (server, url) = start_server(move |c| {
        c.a2a.push_allow = vec![allowed];
        c.a2a.max_push_configs_per_principal = 3;
    })
    .await;
    let addr = server.local_addrs()[0];
    let _later = agent_answering(&url, "later", |_| None).await;
    let res = call(
        addr,
        "/a2a/agents/later",
        None,
        "SendMessage",
        json!({"message": v1_text("go"), "configuration": {"returnImmediately": true}}),
    )
    .await;
    let id = res["result"]["task"]["id"].as_str().unwrap().to_owned();
    let cport = canary.port();
    let hp = hook_addr.port();
    for bad in [
        format!("http://127.0.0.1:{hp}/hook/../admin"),
        format!("http://127.0.0.1:{hp}/hook/%2e%2e/admin"),
        format!("http://127.0.0.1:{hp}/hook/.%2E/admin"),
        format!("http://127.0.0.1:{hp}/hook#frag"),
        format!("http://u:p@127.0.0.1:{hp}/hook/"),
        format!("http://127.0.0.1:{hp}/hookx"),
        format!("http://127.0.0.1:{cport}/hook/"),
        format!("http://localhost:{hp}/hook/"),
        format!("http://[::ffff:127.0.0.1]:{hp}/hook/"),
    ] {
        let v = call(
            addr,
            "/a2a/agents/later",
            None,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "url": bad}),
        )
        .await;
        assert_eq!(v["error"]["code"], -32602, "{bad}: {v}");
    }
    // Allowed, in another spelling: kept (and posted to) as normalised.
    let v = call(
        addr,
        "/a2a/agents/later",
        None,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": id, "id": "ok", "url": format!("http://0x7f000001:{hp}/hook/a/../b")}),
    )
    .await;
    assert_eq!(
        v["result"]["url"],
        format!("http://127.0.0.1:{hp}/hook/b"),
        "{v}"
    );
    // A cap per principal (over tasks).
    for n in 0..2 {
        let v = call(
            addr,
            "/a2a/agents/later",
            None,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "id": format!("more-{n}"), "url": format!("http://{hook_addr}/hook/")}),
        )
        .await;
        assert!(v.get("result").is_some(), "{v}");
    }
    let v = call(
        addr,
        "/a2a/agents/later",
        None,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": id, "id": "one-too-many", "url": format!("http://{hook_addr}/hook/")}),
    )
    .await;
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("per principal (limit 3)"),
        "{v}"
    );
    let v = call(addr, "/a2a", None, "CancelTask", json!({"id": id})).await;
    assert!(v.get("result").is_some(), "{v}");
    let head = within(Duration::from_secs(10), heads.recv()).await.unwrap();
    assert!(
        head.starts_with("POST /hook/b HTTP/1.1") || head.starts_with("POST /hook/ HTTP/1.1"),
        "{head}"
    );
    canary.assert_untouched("webhooks");
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// H5: a request the router would refuse is refused at once, and stalls nobody

/// `depth` nested arrays around a number.
fn nested(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

#[tokio::test]
async fn what_map_would_refuse_is_refused_at_once_and_stalls_nobody() {
    let (server, url) = start_server(|_| {}).await;
    let addr = server.local_addrs()[0];
    let _echo = echo(&url, "echo").await;
    // An agent that asks for more input each time: its task stays open for follow-ups.
    let _asker = agent_answering(&url, "asker", |_| {
        Some(RawJson::from(
            json!({"a2a": {"state": "input-required", "message": "more"}}),
        ))
    })
    .await;
    // An agent whose answer nests too deep to be kept in a task.
    let _deep = agent_answering(&url, "deep", |_| RawJson::from_text(nested(60)).ok()).await;
    let map = MapCanary::start(&url, None).await;

    let res = call(
        addr,
        "/a2a/agents/asker",
        None,
        "SendMessage",
        json!({"message": v1_text("hi")}),
    )
    .await;
    let task = res["result"]["task"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        res["result"]["task"]["status"]["state"],
        "TASK_STATE_INPUT_REQUIRED"
    );

    // A short follow-up with a data part nested 100 deep (over MAP's 64): -32600, id null,
    // before anything is parsed.
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"SendMessage","params":{{"message":{{"messageId":"d","role":"ROLE_USER","taskId":"{task}","parts":[{{"data":{}}}]}}}}}}"#,
        nested(100)
    );
    assert!(deep.len() < 600, "{} bytes", deep.len());
    let t = Instant::now();
    let r = post(addr, "/a2a", None, &deep).await;
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    eprintln!("deep follow-up (100 levels): refused in {:?}", t.elapsed());
    assert_eq!(r.json()["error"]["code"], -32600, "{}", text(&r));
    assert_eq!(r.json()["id"], Value::Null);
    // A lone surrogate escape (no reader can make it text; MAP refuses it): -32700, and the
    // task is not touched (checked below with GetTask).
    let lone = rpc_body(
        json!(4),
        "SendMessage",
        json!({"message": {"messageId": "l", "role": "ROLE_USER", "taskId": task, "parts": [{"text": "LONE"}]}}),
    )
    .replace("LONE", "\\ud800");
    let r = post(addr, "/a2a", None, &lone).await;
    assert_eq!(r.json()["error"]["code"], -32700, "{}", text(&r));
    assert!(text(&r).contains("surrogate"), "{}", text(&r));
    // Within the body's limit, but deeper than MAP once it is a task: 413 naming the limit.
    let t = Instant::now();
    let v = call(
        addr,
        "/a2a/agents/echo",
        None,
        "SendMessage",
        json!({"message": {"messageId": "d2", "role": "ROLE_USER", "parts": [{"data": serde_json::from_str::<Value>(&nested(57)).unwrap()}]}}),
    )
    .await;
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    eprintln!("data too deep inside a task: refused in {:?}", t.elapsed());
    assert_eq!(v["error"]["code"], -32600, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_depth"),
        "{v}"
    );
    // 1.1 MB of valid text: over MAP's payload limit, refused at once.
    let t = Instant::now();
    let big = rpc_body(
        json!(3),
        "SendMessage",
        json!({"message": v1_text(&"x".repeat(1_100_000))}),
    );
    let r = post(addr, "/a2a/agents/echo", None, &big).await;
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    eprintln!("1.1 MB message: refused in {:?}", t.elapsed());
    assert_eq!(r.status, 413, "{}", text(&r));
    assert_eq!(r.json()["error"]["code"], -32600);
    assert!(text(&r).contains("max_payload_bytes"), "{}", text(&r));
    // A history that grows past what a task may hold: refused once it would, at once; the
    // task stays as it was.
    let chunk = "y".repeat(200_000);
    let mut refused = None;
    for n in 0..8 {
        let t = Instant::now();
        let mut m = v1_text(&chunk);
        m["taskId"] = json!(task);
        let v = call(addr, "/a2a", None, "SendMessage", json!({"message": m})).await;
        if let Some(e) = v.get("error") {
            assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
            eprintln!("history past the frame: refused in {:?}", t.elapsed());
            assert_eq!(e["code"], -32600, "{v}");
            assert!(
                e["message"].as_str().unwrap().contains("max_frame_bytes"),
                "{v}"
            );
            refused = Some(n);
            break;
        }
        assert_eq!(
            v["result"]["task"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
            "{n}"
        );
    }
    assert!(refused.is_some_and(|n| n >= 3), "{refused:?}");
    let v = call(
        addr,
        "/a2a",
        None,
        "GetTask",
        json!({"id": task, "historyLength": 1}),
    )
    .await;
    assert_eq!(
        v["result"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{v}"
    );
    assert!(!v.to_string().contains("\\ud800"), "{v}");
    // An agent's answer too deep to keep: the task fails saying so (not left working).
    let t = Instant::now();
    let v = call(
        addr,
        "/a2a/agents/deep",
        None,
        "SendMessage",
        json!({"message": v1_text("q")}),
    )
    .await;
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(
        v["result"]["task"]["status"]["state"], "TASK_STATE_FAILED",
        "{v}"
    );
    assert!(v.to_string().contains("could not be recorded"), "{v}");
    unrelated(addr, None).await;
    map.finish("refusals").await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_stalled_follow_up_holds_up_no_other_caller() {
    // Before: one follow-up the router refused held the gateway-wide lock for 30 s.
    let (server, url) = start_server(|_| {}).await;
    let addr = server.local_addrs()[0];
    let _echo = echo(&url, "echo").await;
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"SendMessage","params":{{"message":{{"messageId":"d","role":"ROLE_USER","parts":[{{"data":{}}}]}}}}}}"#,
        nested(100)
    );
    let attack = tokio::spawn(async move {
        for _ in 0..20 {
            let r = post(addr, "/a2a/agents/echo", None, &deep).await;
            assert_eq!(r.json()["error"]["code"], -32600);
        }
    });
    for _ in 0..10 {
        let t = Instant::now();
        let v = within(
            ANSWERED_WITHIN,
            call(
                addr,
                "/a2a/agents/echo",
                None,
                "SendMessage",
                json!({"message": v1_text("hi")}),
            ),
        )
        .await;
        assert_eq!(
            v["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
            "{v}"
        );
        assert!(t.elapsed() < ANSWERED_WITHIN);
    }
    within(Duration::from_secs(10), attack).await.unwrap();
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// H7: a flooder spends its own budget
//
// A debug build on two shared cores serves about 100 `SendMessage`s a second, far below the
// 450 a second of the probe, so the budgets are scaled down with it: each caller may send 20 a
// second, and the router's per-connection rate (what the gateway's own sessions each have) is
// 100 a second. The old gateway, with one books session for every caller's task updates, ran
// that one connection's budget out under this flood and failed the victim's calls.

/// The scaled-down budgets (see above).
fn scaled(c: &mut map_router::server::Config) {
    c.a2a.rate_per_caller = 20;
    c.a2a.burst_per_caller = 20;
    c.limits.rate_per_connection = 100;
    c.limits.burst_per_connection = 100;
}

/// Floods `SendMessage` from `flood` (N connections in parallel, for `secs`) while `victim`
/// sends 10 a second and an unrelated caller asks every 200 ms. Returns (victim's successes,
/// victim's calls, flooder's 429s, worst unrelated latency).
async fn flood_and_watch(
    addr: SocketAddr,
    url: &str,
    flood: (IpAddr, Option<&'static str>),
    victim: (IpAddr, Option<&'static str>),
    other: Option<&'static str>,
    map_key: Option<&'static str>,
) -> (usize, usize, usize, Duration) {
    const SECS: u64 = 4;
    let map = MapCanary::start(url, map_key).await;
    let until = Instant::now() + Duration::from_secs(SECS);
    let limited = Arc::new(AtomicUsize::new(0));
    let sent = Arc::new(AtomicUsize::new(0));
    let mut flooders = Vec::new();
    for _ in 0..32 {
        let limited = Arc::clone(&limited);
        let sent = Arc::clone(&sent);
        flooders.push(tokio::spawn(async move {
            // Bounded: at most 20 000 requests per connection, and SECS seconds.
            for n in 0..20_000u32 {
                if Instant::now() >= until {
                    break;
                }
                let body = rpc_body(
                    json!(n),
                    "SendMessage",
                    json!({"message": v1_text("flood"), "configuration": {"returnImmediately": true}}),
                );
                let (status, retry, raw) = match flood.1 {
                    Some(k) => {
                        let r = post(addr, "/a2a/agents/echo", Some(k), &body).await;
                        let retry = r.header("retry-after").map(str::to_owned);
                        (r.status, retry, r.body)
                    }
                    None => within(TIMEOUT, post_from(flood.0, addr, "/a2a/agents/echo", &body)).await,
                };
                sent.fetch_add(1, Ordering::Relaxed);
                assert_ne!(status, 404, "a rate limit is never a 404");
                if status == 429 {
                    assert!(retry.is_some(), "429 comes with Retry-After");
                    let v: Value = serde_json::from_slice(&raw).unwrap();
                    assert_eq!(v["error"]["code"], 4001, "{v}");
                    limited.fetch_add(1, Ordering::Relaxed);
                } else {
                    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&raw));
                }
            }
        }));
    }
    let watcher = tokio::spawn(async move {
        let mut worst = Duration::ZERO;
        for _ in 0..(SECS * 5) {
            let t = Instant::now();
            unrelated(addr, other).await;
            worst = worst.max(t.elapsed());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        worst
    });
    let (mut ok, mut calls) = (0, 0);
    for n in 0..(SECS * 10) {
        let t = Instant::now();
        let body = rpc_body(
            json!(n),
            "SendMessage",
            json!({"message": v1_text("victim")}),
        );
        let (status, _, raw) = match victim.1 {
            Some(k) => {
                let r = post(addr, "/a2a/agents/echo", Some(k), &body).await;
                (r.status, None, r.body)
            }
            None => {
                within(
                    TIMEOUT,
                    post_from(victim.0, addr, "/a2a/agents/echo", &body),
                )
                .await
            }
        };
        calls += 1;
        let v: Value = serde_json::from_slice(&raw).unwrap_or_default();
        if status == 200 && v["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED" {
            ok += 1;
        }
        tokio::time::sleep(Duration::from_millis(100).saturating_sub(t.elapsed())).await;
    }
    for f in flooders {
        within(Duration::from_secs(10), f).await.unwrap();
    }
    let worst = within(Duration::from_secs(10), watcher).await.unwrap();
    map.finish("flood").await;
    eprintln!(
        "flood: {} requests in {SECS} s ({}/s), {} refused 429",
        sent.load(Ordering::Relaxed),
        sent.load(Ordering::Relaxed) as u64 / SECS,
        limited.load(Ordering::Relaxed)
    );
    (ok, calls, limited.load(Ordering::Relaxed), worst)
}

#[tokio::test]
async fn a_flooding_principal_spends_its_own_budget() {
    const FLOOD: &str = "ak-flood-0123456789abcdef";
    const VICTIM: &str = "ak-victim-0123456789abcdef";
    const OTHER: &str = "ak-other-0123456789abcdef";
    const AGENT: &str = "ak-agent-0123456789abcdef";
    let (server, url) = start_server(|c| {
        c.auth.api_keys.inline = Some(map_router::auth::config::Secret(format!(
            "{FLOOD} flood,{VICTIM} victim,{OTHER} other,{AGENT} agent"
        )));
        scaled(c);
    })
    .await;
    let addr = server.local_addrs()[0];
    let _echo = echo_as(&url, Some(AGENT), "echo").await;
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    let (ok, calls, limited, worst) = flood_and_watch(
        addr,
        &url,
        (lo, Some(FLOOD)),
        (lo, Some(VICTIM)),
        Some(OTHER),
        Some(AGENT),
    )
    .await;
    eprintln!("principals: victim {ok}/{calls}, flooder 429s {limited}, unrelated worst {worst:?}");
    assert!(limited > 0, "the flooder met its own limit");
    assert!(ok * 100 >= calls * 95, "victim {ok}/{calls}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_flooding_address_spends_its_own_budget() {
    // Without authentication the bucket is the caller's address (loopback not exempt here, so
    // that two local addresses stand for two hosts).
    let (server, url) = start_server(|c| {
        c.limits.exempt_loopback = false;
        scaled(c);
    })
    .await;
    let addr = server.local_addrs()[0];
    let _echo = echo(&url, "echo").await;
    let (ok, calls, limited, worst) = flood_and_watch(
        addr,
        &url,
        ("127.0.0.2".parse().unwrap(), None),
        ("127.0.0.3".parse().unwrap(), None),
        None,
        None,
    )
    .await;
    eprintln!("addresses: victim {ok}/{calls}, flooder 429s {limited}, unrelated worst {worst:?}");
    assert!(limited > 0, "the flooder met its own limit");
    assert!(ok * 100 >= calls * 95, "victim {ok}/{calls}");
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// M3 / M7, content type, L2: the envelope

#[tokio::test]
async fn bodies_are_cut_typed_and_never_echoed_whole() {
    let (server, url) = start_server(|_| {}).await;
    let addr = server.local_addrs()[0];
    let _echo = echo(&url, "echo").await;
    let map = MapCanary::start(&url, None).await;
    // A stalled body: cut when the body deadline (10 s) passes, well within 15 s.
    let stalled = tokio::spawn(async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /a2a/agents/echo HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"jsonrpc\""
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let t = Instant::now();
        let mut raw = Vec::new();
        within(Duration::from_secs(15), s.read_to_end(&mut raw))
            .await
            .unwrap();
        (t.elapsed(), String::from_utf8_lossy(&raw).into_owned())
    });
    // Content types: JSON (either kind) only; anything else -32005, id null.
    for (ct, ok) in [
        (Some("application/json; charset=utf-8"), true),
        (Some("application/a2a+json"), true),
        (Some("text/plain"), false),
        (Some("application/x-www-form-urlencoded"), false),
        (None, false),
    ] {
        let body = rpc_body(json!(1), "GetTask", json!({"id": "task-none"}));
        let headers: Vec<(&str, &str)> = ct.map(|c| ("Content-Type", c)).into_iter().collect();
        let r = request(addr, "POST", "/a2a", &headers, body.as_bytes()).await;
        let v = r.json();
        if ok {
            assert_eq!(v["error"]["code"], -32001, "{ct:?}: {v}");
        } else {
            assert_eq!(v["error"]["code"], -32005, "{ct:?}: {v}");
            assert_eq!(v["id"], Value::Null);
        }
    }
    // An id beyond a double: -32600 with id null (never echoed).
    let r = post(
        addr,
        "/a2a",
        None,
        r#"{"jsonrpc":"2.0","id":1e400,"method":"GetTask","params":{"id":"x"}}"#,
    )
    .await;
    assert_eq!(r.json()["error"]["code"], -32600, "{}", text(&r));
    assert_eq!(r.json()["id"], Value::Null);
    assert!(!text(&r).contains("1e400"));
    // A 1 MiB method name: -32601 with a short prefix of it.
    let name = "M".repeat(1 << 20);
    let r = post(addr, "/a2a", None, &rpc_body(json!(1), &name, json!({}))).await;
    assert_eq!(r.json()["error"]["code"], -32601);
    assert!(r.body.len() < 512, "{} bytes echoed", r.body.len());
    unrelated(addr, None).await;
    let (took, answer) = within(Duration::from_secs(16), stalled).await.unwrap();
    eprintln!("stalled body: cut after {took:?}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    map.finish("bodies").await;
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// L4 and the first hour: after a restart

#[tokio::test]
async fn after_a_restart_tasks_are_found_by_their_agents_name_and_none_is_left_working() {
    let data = TempDir::new("a2a-restart");
    let dir = data.path.clone();
    let (server, url) = start_server(|c| c.storage.data_dir = Some(dir)).await;
    let addr = server.local_addrs()[0];
    let (asker, asker_agent) = agent_answering(&url, "asker", |_| {
        Some(RawJson::from(
            json!({"a2a": {"state": "input-required", "message": "more"}}),
        ))
    })
    .await;
    let (quiet, _q) = agent_answering(&url, "quiet", |_| None).await;
    let old_id = asker_agent.agent().id.to_string();
    let v = call(
        addr,
        &format!("/a2a/agents/{old_id}"),
        None,
        "SendMessage",
        json!({"message": v1_text("hi")}),
    )
    .await;
    let waiting = v["result"]["task"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        v["result"]["task"]["status"]["state"],
        "TASK_STATE_INPUT_REQUIRED"
    );
    let v = call(
        addr,
        "/a2a/agents/quiet",
        None,
        "SendMessage",
        json!({"message": v1_text("work"), "configuration": {"returnImmediately": true}}),
    )
    .await;
    let working = v["result"]["task"]["id"].as_str().unwrap().to_owned();
    drop((asker, quiet));
    server.shutdown().await;

    let dir = data.path.clone();
    let (server, url) = start_server(|c| c.storage.data_dir = Some(dir)).await;
    let addr = server.local_addrs()[0];
    // The agent comes back under a new id (it registers without one), and answers now.
    let (_asker, asker_agent) = echo(&url, "asker").await;
    let new_id = asker_agent.agent().id.to_string();
    assert_ne!(new_id, old_id);
    // The task waiting for its agent's answer cannot get it (its agent is not back): failed,
    // saying why, once the agents' grace to reconnect is over.
    let v = failed_in_time(addr, &working).await;
    assert!(
        v.to_string()
            .contains("the router restarted while the task was in flight"),
        "{v}"
    );
    // The one waiting for its caller is found through the old URL, the agent's name and its
    // new id, and not through another agent's.
    for path in [
        format!("/a2a/agents/{old_id}"),
        "/a2a/agents/asker".into(),
        format!("/a2a/agents/{new_id}"),
    ] {
        let v = call(addr, &path, None, "GetTask", json!({"id": waiting})).await;
        assert_eq!(
            v["result"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
            "{path}: {v}"
        );
    }
    let _other = echo(&url, "other").await;
    let v = call(
        addr,
        "/a2a/agents/other",
        None,
        "GetTask",
        json!({"id": waiting}),
    )
    .await;
    assert_eq!(v["error"]["code"], -32001, "{v}");
    let r = post(
        addr,
        "/a2a/agents/nobody",
        None,
        &rpc_body(json!(1), "GetTask", json!({"id": waiting})),
    )
    .await;
    assert_eq!(r.status, 404);
    // A follow-up at the old URL reaches the agent of that name, whose reply completes it.
    let mut m = v1_text("here");
    m["taskId"] = json!(waiting);
    let v = call(
        addr,
        &format!("/a2a/agents/{old_id}"),
        None,
        "SendMessage",
        json!({"message": m}),
    )
    .await;
    assert_eq!(
        v["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{v}"
    );
    server.shutdown().await;
}

/// `GetTask` of `id` until it has failed: within the agents' grace to reconnect (10 s from the
/// router's start) and a margin.
async fn failed_in_time(addr: SocketAddr, id: &str) -> Value {
    within(Duration::from_secs(15), async {
        loop {
            let v = call(addr, "/a2a", None, "GetTask", json!({"id": id})).await;
            if v["result"]["status"]["state"] == "TASK_STATE_FAILED" {
                return v["result"].clone();
            }
            assert_eq!(v["result"]["status"]["state"], "TASK_STATE_WORKING", "{v}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await
}

/// An agent `keeper` registered under that id (as the SDKs' reconnect does), and its inbox.
async fn keeper(url: &str) -> (Client, AgentHandle) {
    let client = with_timeout(Client::connect_ws(
        url,
        ClientOptions::agent().name("keeper"),
    ))
    .await
    .expect("the keeper connects");
    let handle = with_timeout(client.register(RegisterParams {
        agent_id: Some("keeper".into()),
        name: Some("keeper".into()),
        ..RegisterParams::default()
    }))
    .await
    .expect("the keeper registers");
    (client, handle)
}

#[tokio::test]
async fn kill_9_with_streams_in_flight_leaves_no_task_working() {
    let data = TempDir::new("a2a-kill9");
    let dir = data.path.display().to_string();
    let args = ["--listen", "127.0.0.1:0", "--data-dir", dir.as_str()];
    let (mut router, url) = start_binary(args).await;
    let addr: SocketAddr = url
        .trim_start_matches("ws://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let (_sink, _h) = agent_answering(&url, "sink", |_| None).await;
    // An agent with an id of its own, which comes back after the restart: its task resumes.
    let (kept_client, kept) = keeper(&url).await;
    let mut kept_inbox = kept.messages();
    let v = call(
        addr,
        "/a2a/agents/keeper",
        None,
        "SendMessage",
        json!({"message": v1_text("keep"), "configuration": {"returnImmediately": true}}),
    )
    .await;
    let resumed = v["result"]["task"]["id"].as_str().unwrap().to_owned();
    let request = with_timeout(kept_inbox.next())
        .await
        .expect("the keeper gets the message");
    // Three streams in flight (each read to its `working` update), two tasks sent without
    // waiting.
    let mut streams = Vec::new();
    for n in 0..3 {
        let body = rpc_body(
            json!(n),
            "SendStreamingMessage",
            json!({"message": v1_text("stream")}),
        );
        let mut s = with_timeout(TcpStream::connect(addr)).await.unwrap();
        let req = format!(
            "POST /a2a/agents/sink HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        with_timeout(s.write_all(req.as_bytes())).await.unwrap();
        let mut raw = Vec::new();
        with_timeout(async {
            let mut buf = [0u8; 4096];
            while find(&raw, b"TASK_STATE_WORKING").is_none() {
                let k = s.read(&mut buf).await.unwrap();
                assert!(k > 0, "the stream ended early");
                raw.extend_from_slice(&buf[..k]);
            }
        })
        .await;
        streams.push(s);
    }
    for _ in 0..2 {
        let v = call(
            addr,
            "/a2a/agents/sink",
            None,
            "SendMessage",
            json!({"message": v1_text("bg"), "configuration": {"returnImmediately": true}}),
        )
        .await;
        assert_eq!(
            v["result"]["task"]["status"]["state"], "TASK_STATE_WORKING",
            "{v}"
        );
    }
    router.start_kill().expect("SIGKILL");
    with_timeout(router.wait()).await.expect("the router ended");
    drop((streams, kept_inbox, kept, kept_client));

    let (_router, url) = start_binary(args).await;
    let addr: SocketAddr = url
        .trim_start_matches("ws://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    // The keeper comes back under its id; the sink does not.
    let (kept_client, _kept) = keeper(&url).await;
    let v = call(addr, "/a2a", None, "ListTasks", json!({"pageSize": 100})).await;
    let tasks = v["result"]["tasks"].as_array().expect("tasks").clone();
    assert_eq!(tasks.len(), 6, "{v}");
    let mut ended = 0;
    for t in &tasks {
        let id = t["id"].as_str().unwrap();
        if id == resumed {
            continue;
        }
        let t = failed_in_time(addr, id).await;
        assert!(
            t.to_string()
                .contains("the router restarted while the task was in flight"),
            "{t}"
        );
        ended += 1;
    }
    assert_eq!(ended, 5);
    // The keeper's task is still working after the grace, and its reply completes it.
    let v = call(addr, "/a2a", None, "GetTask", json!({"id": resumed})).await;
    assert_eq!(v["result"]["status"]["state"], "TASK_STATE_WORKING", "{v}");
    with_timeout(kept_client.send_with(SendParams {
        to: RawJson::from(json!({"agent": request.from})),
        payload: Some(RawJson::from(json!("kept"))),
        meta: Some(RawJson::from(
            json!({"correlationId": resumed, "isResult": true}),
        )),
    }))
    .await
    .unwrap();
    within(Duration::from_secs(5), async {
        loop {
            let v = call(addr, "/a2a", None, "GetTask", json!({"id": resumed})).await;
            if v["result"]["status"]["state"] == "TASK_STATE_COMPLETED" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    // Over MAP too: nothing is left open or in progress.
    let mut ws = WsClient::client(&url).await;
    let listed = ws
        .ok(
            "map/tasks/list",
            json!({"filter": {"status": ["open", "in_progress"]}}),
        )
        .await;
    assert_eq!(listed["tasks"], json!([]), "{listed}");
}
