//! `GET /metrics` over real sockets, after a known load: request counts and error codes per
//! method, connections and sessions by transport and participant type, agents by state,
//! deliveries that match what a live subscriber was shown, store commits, supervised process
//! exits and restarts; and the access rules: `401` without or with a bad bearer credential when
//! `[auth]` is on, `200` with an API key, public when configured, absent when disabled.
//!
//! The exposition is parsed with `prometheus-parse` (an independent parser), so a malformed
//! line fails the test.

mod common;

use std::net::SocketAddr;

use common::http::*;
use common::*;
use serde_json::json;

/// One parsed scrape.
struct Scrape {
    samples: Vec<prometheus_parse::Sample>,
}

impl Scrape {
    /// The value of `name` with exactly these labels (0 when absent).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| {
                s.labels.len() == labels.len()
                    && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
            })
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                ref other => panic!("{name}: unexpected value {other:?}"),
            })
            .collect();
        assert!(found.len() <= 1, "{name} {labels:?} appears twice");
        found.first().copied().unwrap_or(0.0)
    }

    /// The sum of every sample of `name`.
    fn sum(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.metric == name)
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
                _ => 0.0,
            })
            .sum()
    }

    /// The observation count of a histogram with these labels (its `+Inf` bucket).
    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        for s in self.samples.iter().filter(|s| s.metric == name) {
            if labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)) {
                if let prometheus_parse::Value::Histogram(buckets) = &s.value {
                    return buckets.last().map_or(0.0, |b| b.count) as u64;
                }
            }
        }
        0
    }
}

fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("ws://")
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

async fn get_metrics(addr: SocketAddr, headers: &[(&str, &str)]) -> HttpResponse {
    request(addr, "GET", "/metrics", headers, b"").await
}

/// A scrape as Prometheus makes it (asking for OpenMetrics), parsed.
async fn scrape(addr: SocketAddr, headers: &[(&str, &str)]) -> Scrape {
    let mut headers = headers.to_vec();
    headers.push((
        "Accept",
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    ));
    let r = get_metrics(addr, &headers).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        r.header("content-type")
            .is_some_and(|t| t.starts_with("application/openmetrics-text")),
        "{:?}",
        r.headers
    );
    let text = String::from_utf8(r.body).expect("UTF-8 exposition");
    assert!(text.ends_with("# EOF\n"), "{text}");
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let parsed = prometheus_parse::Scrape::parse(lines).expect("a valid exposition");
    Scrape {
        samples: parsed.samples,
    }
}

#[tokio::test]
async fn a_known_load_is_counted_as_it_happened() {
    let dir = TempDir::new("metrics");
    let data = dir.path.clone();
    let (_server, url) = start_server(|c| c.storage.data_dir = Some(data)).await;
    let addr = addr_of(&url);

    let mut watcher = WsClient::system(&url).await;
    let sub = watcher.subscribe(json!({})).await;
    let mut bob = WsClient::agent(&url, "bob", json!({})).await;
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    for n in 0..5 {
        alice.send(json!({"agent": "bob"}), json!({"n": n})).await;
        bob.next_message().await;
    }
    // Errors: an unknown method (its name is never a label), a frame that is not JSON, and a
    // known method with bad params.
    let e = alice.err("no/such/method", json!({})).await;
    assert_eq!(e["code"], json!(-32601));
    let garbage = alice.request_raw("{not json").await;
    assert_eq!(garbage["error"]["code"], json!(-32700));
    let e = alice.err("map/send", json!({"to": 17})).await;
    assert_eq!(e["code"], json!(-32602));

    let m = scrape(addr, &[]).await;
    let send = [("method", "map/send")];
    assert_eq!(
        m.histogram("map_request_duration_seconds", &send),
        6,
        "5 sends and 1 refused"
    );
    assert_eq!(
        m.value(
            "map_request_errors_total",
            &[("method", "map/send"), ("code", "-32602")]
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "map_request_errors_total",
            &[("method", "unknown"), ("code", "-32601")]
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "map_request_errors_total",
            &[("method", "none"), ("code", "-32700")]
        ),
        1.0
    );
    assert!(
        !m.samples
            .iter()
            .any(|s| s.labels.values().any(|v| v.contains("no/such"))),
        "a peer's method name is never a label"
    );
    assert_eq!(
        m.value("map_connections", &[("transport", "websocket")]),
        3.0
    );
    assert_eq!(m.value("map_connections", &[("transport", "http")]), 0.0);
    assert_eq!(
        m.value(
            "map_connections_opened_total",
            &[("transport", "websocket")]
        ),
        3.0
    );
    assert_eq!(
        m.value(
            "map_sessions",
            &[("transport", "websocket"), ("participant_type", "agent")]
        ),
        2.0
    );
    assert_eq!(
        m.value(
            "map_sessions",
            &[("transport", "websocket"), ("participant_type", "system")]
        ),
        1.0
    );
    assert_eq!(m.sum("map_agents"), 2.0);
    assert_eq!(m.value("map_message_deliveries_total", &[]), 5.0);
    assert_eq!(m.value("map_subscriptions", &[("state", "live")]), 1.0);
    assert_eq!(m.value("map_subscriptions", &[("state", "paused")]), 0.0);
    let appended = m.value("map_events_appended_total", &[]);
    assert!(
        appended >= 5.0 * 2.0,
        "sent + delivered per message: {appended}"
    );
    let commits = m.histogram("map_store_commit_duration_seconds", &[]);
    assert!(commits >= 1, "the durable store committed");
    assert_eq!(m.histogram("map_store_commit_batch_events", &[]), commits);

    // The deliveries counted are exactly what the one subscriber was shown: read its stream
    // up to that count, then nothing more is pending for it.
    let delivered = m.value("map_event_deliveries_total", &[]) as u64;
    assert!(delivered >= 10, "{delivered}");
    let mut seen = 0;
    while seen < delivered {
        let ev = watcher.next_event(&sub).await;
        seen = ev["sequenceNumber"].as_u64().expect("a sequence number");
    }
    assert_eq!(seen, delivered);

    // An agent drops its socket: its session waits in the resume window, detached.
    bob.drop_abruptly();
    let mut detached = 0.0;
    for _ in 0..100 {
        let m = scrape(addr, &[]).await;
        detached = m.value(
            "map_sessions",
            &[("transport", "detached"), ("participant_type", "agent")],
        );
        if detached == 1.0 {
            assert_eq!(
                m.value("map_connections", &[("transport", "websocket")]),
                2.0
            );
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(detached, 1.0);
}

#[tokio::test]
async fn supervised_exits_and_restarts_are_counted() {
    let (_server, url) = default_server().await;
    let addr = addr_of(&url);
    let mut obs = WsClient::client(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["agent_state_changed"]}))
        .await;
    let mut boss = WsClient::agent(&url, "m-boss", json!({})).await;
    boss.ok(
        "map/agents/spawn",
        json!({"name": "crasher", "command": {
            "program": child_program("crash_agent.sh"),
            "restart": {"mode": "on-failure", "maxRestarts": 1, "backoffMs": 50}
        }}),
    )
    .await;
    // Crash, restart, crash for good.
    let mut failed = 0;
    while failed < 2 {
        let ev = obs.next_event(&sub).await;
        if ev["event"]["data"]["newState"] == json!("failed") {
            failed += 1;
        }
    }
    let m = scrape(addr, &[]).await;
    assert_eq!(
        m.value("map_process_exits_total", &[("reason", "crashed")]),
        2.0
    );
    assert_eq!(m.value("map_process_restarts_total", &[]), 1.0);
    assert_eq!(m.value("map_agents", &[("state", "failed")]), 1.0);
}

const KEY: &str = "ak-metrics-0123456789abcdef";

#[tokio::test]
async fn with_auth_on_a_scrape_needs_a_bearer_credential_unless_public() {
    let dir = TempDir::new("metrics-auth");
    let keys = dir.path.join("api-keys");
    std::fs::write(&keys, format!("{KEY} prometheus\n")).unwrap();
    let (_server, url) = start_server(|c| c.auth.api_keys.file = Some(keys.clone())).await;
    let addr = addr_of(&url);

    let r = get_metrics(addr, &[]).await;
    assert_eq!(r.status, 401);
    assert!(
        r.header("www-authenticate")
            .is_some_and(|h| h.starts_with("Bearer")),
        "{:?}",
        r.headers
    );
    let r = get_metrics(
        addr,
        &[("Authorization", "Bearer ak-wrong-0123456789abcdef")],
    )
    .await;
    assert_eq!(r.status, 401);
    assert!(
        String::from_utf8_lossy(&r.body).contains("unknown API key"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let r = get_metrics(addr, &[("Authorization", "Basic cHJvbTpwcm9t")]).await;
    assert_eq!(r.status, 401, "only bearer credentials");
    let bearer = format!("Bearer {KEY}");
    let m = scrape(addr, &[("Authorization", &bearer)]).await;
    assert_eq!(
        m.value("map_connections", &[("transport", "websocket")]),
        0.0
    );
    assert!(
        m.samples
            .iter()
            .any(|s| s.metric == "map_events_appended_total"),
        "the router's part is there too"
    );

    // `[metrics] public = true`: open even with auth on.
    let (_public, url) = start_server(|c| {
        c.auth.api_keys.file = Some(keys.clone());
        c.metrics.public = true;
    })
    .await;
    scrape(addr_of(&url), &[]).await;

    // `[metrics] enabled = false`: no route.
    let (_off, url) = start_server(|c| c.metrics.enabled = false).await;
    let r = get_metrics(addr_of(&url), &[]).await;
    assert_eq!(r.status, 404);
}

/// A free loopback port (bound and released; Prometheus takes a fixed address).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Debian's Prometheus (`scripts/setup.sh` installs it) scrapes a router with auth on, using the bearer
/// credential in its own scrape config; its query API then returns our samples and `up == 1`.
#[tokio::test]
async fn a_real_prometheus_scrapes_the_router_with_a_bearer_credential() {
    let dir = TempDir::new("metrics-prometheus");
    let keys = dir.path.join("api-keys");
    std::fs::write(&keys, format!("{KEY} prometheus\n")).unwrap();
    let (_server, url) = start_server(|c| c.auth.api_keys.file = Some(keys.clone())).await;
    let target = addr_of(&url);
    let config = dir.path.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: map-router\n    authorization:\n      \
             type: Bearer\n      credentials: {KEY}\n    static_configs:\n      \
             - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let mut prometheus = tokio::process::Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("prometheus is installed (scripts/setup.sh installs Debian's package)");
    let api: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let _agent = WsClient::connect(&url).await;
    // Until Prometheus has scraped us (bounded: 60 tries, about 30 s).
    let mut last = String::new();
    for _ in 0..60 {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let listening = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            tokio::net::TcpStream::connect(api),
        )
        .await;
        if !matches!(listening, Ok(Ok(_))) {
            continue;
        }
        let r = request(
            api,
            "GET",
            "/api/v1/query?query=up%7Bjob%3D%22map-router%22%7D%20%2B%20on()%20group_left%20map_connections%7Btransport%3D%22websocket%22%7D",
            &[],
            b"",
        )
        .await;
        last = String::from_utf8_lossy(&r.body).into_owned();
        let v: serde_json::Value = serde_json::from_str(&last).unwrap_or_default();
        if let Some(sample) = v["data"]["result"].get(0) {
            // up (1) + connections (1: the client above; scrapes are not MAP connections).
            assert_eq!(sample["value"][1], json!("2"), "{last}");
            let _ = prometheus.start_kill();
            return;
        }
    }
    let _ = prometheus.start_kill();
    panic!("Prometheus never scraped the router: {last}");
}

/// Issue 23: `promtool check metrics` (Prometheus's own linter) passes on what a client that
/// does not ask for OpenMetrics gets (the classic text format, 0.0.4), after a known load.
#[tokio::test]
async fn the_classic_text_format_passes_promtool() {
    let (_server, url) = start_server(|_| {}).await;
    let addr = addr_of(&url);
    let mut bob = WsClient::agent(&url, "bob", json!({})).await;
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    alice.send(json!({"agent": "bob"}), json!({"n": 1})).await;
    bob.next_message().await;
    let r = get_metrics(addr, &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = String::from_utf8(r.body).unwrap();
    assert!(!text.contains("# EOF"), "{text}");
    assert!(
        text.contains("# TYPE map_events_appended_total counter"),
        "{text}"
    );
    common::promtool_check(&text).await;
    // Prometheus asks for OpenMetrics and gets it.
    let r = get_metrics(
        addr,
        &[("Accept", "application/openmetrics-text; version=1.0.0")],
    )
    .await;
    assert!(r
        .header("content-type")
        .is_some_and(|t| t.starts_with("application/openmetrics-text")));
}

/// The gateways' HTTP routes are counted per gateway by how each request ended, with the number
/// of distinct callers; several principals call, one with a bad key, and the exposition names
/// none of them (counts only: no principal id, no key).
#[tokio::test]
async fn gateway_requests_are_counted_per_gateway_without_naming_callers() {
    let (_server, url) = start_server(|c| {
        c.auth.api_keys.inline = Some(map_router::auth::config::Secret(
            "key-alice-0123456789 alice\nkey-bob-0123456789abc bob".into(),
        ));
    })
    .await;
    let addr = addr_of(&url);
    let alice = [("Authorization", "Bearer key-alice-0123456789")];
    let bob = [("Authorization", "Bearer key-bob-0123456789abc")];
    // MAMP: the public card (anonymous), bob's JSON post, alice's post that is not JSON (refused
    // by the gate), a post with a key nobody has (refused).
    assert_eq!(
        request(addr, "GET", "/mamp/v1/card", &[], b"").await.status,
        200
    );
    let plain = [alice[0], ("Content-Type", "text/plain")];
    assert_eq!(
        request(addr, "POST", "/mamp/v1/messages", &plain, b"x")
            .await
            .status,
        415
    );
    let forged = [
        ("Authorization", "Bearer key-mallory-000000000"),
        ("Content-Type", "application/json"),
    ];
    assert_eq!(
        request(addr, "POST", "/mamp/v1/messages", &forged, b"{}")
            .await
            .status,
        401
    );
    let json_bob = [bob[0], ("Content-Type", "application/json")];
    let bad = request(addr, "POST", "/mamp/v1/messages", &json_bob, b"{}")
        .await
        .status;
    assert!(
        bad >= 400,
        "an empty MAMP message is refused by its handler: {bad}"
    );
    // A2A: alice asks for an agent's card that does not exist (404).
    let missing = "/a2a/agents/nobody/.well-known/agent-card.json";
    assert_eq!(request(addr, "GET", missing, &alice, b"").await.status, 404);
    let s = scrape(addr, &alice).await;
    let count = |g: &str, o: &str| {
        s.value(
            "map_gateway_requests_total",
            &[("gateway", g), ("outcome", o)],
        )
    };
    assert_eq!(
        (
            count("mamp", "ok"),
            count("mamp", "refused"),
            count("mamp", "error")
        ),
        (1.0, 2.0, 1.0)
    );
    assert_eq!(
        (
            count("a2a", "ok"),
            count("a2a", "refused"),
            count("a2a", "error")
        ),
        (0.0, 0.0, 1.0)
    );
    // MAMP: the anonymous card reader (by address), alice and bob; the forged key is nobody.
    assert_eq!(s.value("map_gateway_callers", &[("gateway", "mamp")]), 3.0);
    assert_eq!(s.value("map_gateway_callers", &[("gateway", "a2a")]), 1.0);
    let text = String::from_utf8(get_metrics(addr, &alice).await.body).unwrap();
    for secret in ["alice", "bob", "mallory", "key-"] {
        assert!(!text.contains(secret), "/metrics names {secret}");
    }
}
