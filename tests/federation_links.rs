//! Federation between real routers (issue 47): each system the built binary as its own
//! process, with its own data directory, API keys and `[[federation.peer]]` links to the others
//! over loopback WebSockets. A message for `{system, agent}` waits in its router's queue for
//! the peer link, which routes it in order; the reply comes back the same way; a loop or the
//! hop limit stops a message with the spec's code, which its sender sees; a peer killed with
//! kill -9 and restarted loses nothing acknowledged and gets nothing twice, and what overflows
//! the bounded queue meanwhile is reported to its sender.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use map_router::client::{AgentHandle, Client, ClientOptions};
use map_router::protocol::json::RawJson;
use map_router::protocol::methods::agents::RegisterParams;
use map_router::protocol::methods::messaging::SendParams;
use serde_json::{json, Value};

/// The key `from`'s router presents to `to`'s, which knows it as principal `<from>-gw`.
fn link_key(from: &str, to: &str) -> String {
    format!("ak-link-{from}-to-{to}-0123456789abcdef")
}

/// The key of `system`'s own agents (principal `agents-<system>`).
fn agent_key(system: &str) -> String {
    format!("ak-agents-of-{system}-0123456789abcdef")
}

/// One system: a router process and how to start it again.
struct System {
    name: &'static str,
    port: u16,
    dir: PathBuf,
    env: Vec<(String, String)>,
    child: Option<tokio::process::Child>,
}

impl System {
    /// Writes `name`'s config: its keys, its peers (`(peer, dialled)`: each peer's gateway may
    /// link in; a dialled one is dialled at its port in `ports`) and `extra` in `[federation]`.
    fn new(
        name: &'static str,
        ports: &[(&str, u16)],
        peers: &[(&str, bool)],
        extra: &str,
        dir: &TempDir,
    ) -> Self {
        let port = ports.iter().find(|(n, _)| *n == name).expect("a port").1;
        let mut keys = format!("{} agents-{name}\n", agent_key(name));
        keys.push_str("ak-nogrant-principal-0123456789 nogrant\n");
        let mut config = format!(
            "[auth.api_keys]\nfile = {:?}\n\n[federation]\nsystem_id = \"{name}\"\n{extra}\n",
            dir.path.join(format!("{name}-keys"))
        );
        let mut env = Vec::new();
        for (peer, dialled) in peers {
            keys.push_str(&format!("{} {peer}-gw\n", link_key(peer, name)));
            config.push_str(&format!(
                "[[federation.peer]]\nsystem_id = \"{peer}\"\nprincipal = \"{peer}-gw\"\n"
            ));
            if *dialled {
                let at = ports.iter().find(|(n, _)| n == peer).expect("a port").1;
                let var = format!("FED_KEY_{}", peer.to_uppercase());
                config.push_str(&format!(
                    "endpoint = \"ws://127.0.0.1:{at}/\"\napi_key_env = \"{var}\"\n"
                ));
                env.push((var, link_key(name, peer)));
            }
        }
        std::fs::write(dir.path.join(format!("{name}-keys")), keys).unwrap();
        std::fs::write(dir.path.join(format!("{name}.toml")), config).unwrap();
        Self {
            name,
            port,
            dir: dir.path.clone(),
            env,
            child: None,
        }
    }

    async fn start(&mut self) {
        let (child, _url) = start_binary_with_env(
            [
                "--listen".to_owned(),
                format!("127.0.0.1:{}", self.port),
                "--config".to_owned(),
                self.dir
                    .join(format!("{}.toml", self.name))
                    .display()
                    .to_string(),
                "--data-dir".to_owned(),
                self.dir.join(self.name).display().to_string(),
            ],
            self.env.clone(),
        )
        .await;
        self.child = Some(child);
    }

    /// kill -9, and wait until it is gone.
    async fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        child.start_kill().unwrap();
        with_timeout(child.wait()).await.unwrap();
    }

    fn url(&self) -> String {
        format!("ws://127.0.0.1:{}/", self.port)
    }

    /// A client of this system's agents' principal.
    async fn client(&self) -> Client {
        with_timeout(Client::connect_ws(
            &self.url(),
            ClientOptions::agent().api_key(agent_key(self.name)),
        ))
        .await
        .unwrap()
    }

    /// An agent `id` of this system.
    async fn agent(&self, id: &str) -> AgentHandle {
        let c = self.client().await;
        with_timeout(c.register(RegisterParams {
            agent_id: Some(id.into()),
            ..Default::default()
        }))
        .await
        .unwrap()
    }

    /// `/metrics` text (with a credential: `[auth]` is on).
    async fn metrics(&self) -> String {
        http_get_text(
            &format!("http://127.0.0.1:{}/metrics", self.port),
            &agent_key(self.name),
        )
        .await
    }
}

/// A GET's answer, with `key` as the bearer credential.
async fn http_get_text(url: &str, key: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = with_timeout(tokio::net::TcpStream::connect(host))
        .await
        .unwrap();
    s.write_all(format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    with_timeout(s.read_to_string(&mut out)).await.unwrap();
    out
}

/// Every event of `types` in `client`'s view of its router's log, oldest first (`data` and
/// `type` of each).
async fn log_of(client: &Client, types: &[&str]) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = with_timeout(client.call_raw(
            "map/replay",
            json!({"afterEventId": after, "limit": 1000, "filter": {"eventTypes": types}}),
        ))
        .await
        .unwrap();
        let events = page["events"].as_array().cloned().unwrap_or_default();
        for e in &events {
            out.push(e["event"].clone());
        }
        if page["hasMore"] != json!(true) || events.is_empty() {
            return out;
        }
        after = events
            .last()
            .and_then(|e| e["eventId"].as_str().map(str::to_owned));
    }
}

/// Polls `check` every 100 ms until it gives a value (at most `limit`).
async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let until = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < until, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The next message of `inbox`, bounded.
async fn next(inbox: &mut map_router::client::Messages) -> map_router::protocol::message::Message {
    within(Duration::from_secs(20), inbox.next())
        .await
        .expect("the inbox ended")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_on_each_router_messages_and_replies_across_the_link() {
    let dir = TempDir::new("fed-links-two");
    let ports = [
        ("alpha", cluster_free_port()),
        ("beta", cluster_free_port()),
    ];
    let mut alpha = System::new("alpha", &ports, &[("beta", true)], "", &dir);
    let mut beta = System::new("beta", &ports, &[("alpha", true)], "", &dir);
    alpha.start().await;
    beta.start().await;
    let alice = alpha.agent("alice").await;
    let bob = beta.agent("bob").await;
    let mut alice_in = alice.messages();
    let mut bob_in = bob.messages();

    // Byte for byte, `meta` included; the answer says it waits for the link.
    let text = r#"{"text":"hello from alpha","n":1.50,"nested":{"k":[1,2]}}"#;
    let sent = with_timeout(alice.client().send_with(SendParams {
        to: RawJson::from(json!({"system": "beta", "agent": "bob"})),
        payload: Some(RawJson::from_text(text).unwrap()),
        meta: Some(RawJson::from_text(r#"{"trace":"x-1","w":2.0}"#).unwrap()),
    }))
    .await
    .unwrap();
    assert_eq!(sent.queued, vec!["beta:agent:bob".to_owned()]);
    assert!(sent.delivered.is_empty());
    let m = next(&mut bob_in).await;
    assert_eq!(m.from, "alpha:agent:alice", "never a local id");
    assert_eq!(
        m.payload.as_ref().map(|p| p.get().to_owned()),
        Some(text.to_owned())
    );
    assert_eq!(m.meta.as_ref().unwrap().get(), r#"{"trace":"x-1","w":2.0}"#);

    // The reply travels back over beta's own link to alpha.
    with_timeout(bob.reply(&m, json!({"text": "hi alice"})))
        .await
        .unwrap();
    let r = next(&mut alice_in).await;
    assert_eq!(r.from, "beta:agent:bob");
    assert_eq!(r.payload.unwrap().get(), r#"{"text":"hi alice"}"#);

    // Alpha's log says the message reached beta (delivered to the federated recipient).
    // (once the link has settled it: beta answered the route after delivering to bob)
    eventually(Duration::from_secs(10), "alpha logs the delivery", || {
        let c = alice.client().clone();
        let id = sent.message_id.to_string();
        async move {
            log_of(&c, &["message_delivered"])
                .await
                .iter()
                .any(|e| {
                    e["data"]["messageId"] == json!(id)
                        && e["data"]["deliveredTo"] == json!(["beta:agent:bob"])
                })
                .then_some(())
        }
    })
    .await;

    // A trace crosses the boundary: a send with its request's trace context (`_meta`) is
    // recorded on beta under the same trace.
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = with_timeout(alice.client().call_raw(
        "map/send",
        json!({"to": {"system": "beta", "agent": "bob"}, "payload": {"traced": true},
            "_meta": {"traceparent": tp}}),
    ))
    .await
    .unwrap();
    let m = next(&mut bob_in).await;
    assert_eq!(
        m.id.as_str(),
        format!("alpha:message:{}", traced["messageId"].as_str().unwrap())
    );
    // (delivered live at once; in the log once committed)
    let sent_here = eventually(Duration::from_secs(10), "beta's log has it", || {
        let c = bob.client().clone();
        let id = m.id.to_string();
        async move {
            log_of(&c, &["message_sent"])
                .await
                .into_iter()
                .find(|e| e["data"]["messageId"] == json!(id))
        }
    })
    .await;
    assert_eq!(
        sent_here["_meta"]["traceparent"]
            .as_str()
            .map(|t| &t[3..35]),
        Some("4bf92f3577b34da6a3ce929d0e0e4736"),
        "{sent_here}"
    );

    // Alpha lists beta's agents as beta shows them to alpha's link: bob, not beta's vault
    // (visible to beta's system participants only).
    let vault = beta.client().await;
    with_timeout(vault.register(RegisterParams {
        agent_id: Some("vault".into()),
        visibility: Some(map_router::protocol::agent::AgentVisibility::System),
        ..Default::default()
    }))
    .await
    .unwrap();
    // A public agent registered after the vault: once it is listed, the vault would be too.
    let _carol = beta.agent("carol").await;
    let listed = eventually(Duration::from_secs(10), "alpha lists carol", || {
        let c = alice.client().clone();
        async move {
            let r = with_timeout(c.call_raw("map/federation/agents", json!({})))
                .await
                .unwrap();
            let ids: Vec<String> = r["systems"][0]["agents"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["federatedId"].as_str().unwrap().to_owned())
                .collect();
            ids.contains(&"beta:agent:carol".to_owned())
                .then_some((r, ids))
        }
    })
    .await;
    assert_eq!(
        listed.0["systems"][0]["systemId"],
        json!("beta"),
        "{}",
        listed.0
    );
    assert!(
        listed.1.contains(&"beta:agent:bob".to_owned()),
        "{:?}",
        listed.1
    );
    assert!(
        !listed.1.iter().any(|i| i.contains("vault")),
        "{:?}",
        listed.1
    );

    // Nobody on alpha may pose as beta's agent, and an unknown system is 5001.
    let mallory = alpha.client().await;
    let e = with_timeout(mallory.register(RegisterParams {
        agent_id: Some("beta:agent:bob".into()),
        ..Default::default()
    }))
    .await
    .unwrap_err();
    assert!(
        e.to_string().contains("reserved") || e.to_string().contains("taken"),
        "{e}"
    );
    let e = with_timeout(alice.send(json!({"system": "zeta", "agent": "x"}), json!({})))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("5001"), "{e}");

    // A principal without a link key cannot link as alpha to beta.
    let intruder = with_timeout(Client::connect_ws(
        &beta.url(),
        ClientOptions::new()
            .participant_type(map_router::protocol::capabilities::ParticipantType::Gateway)
            .api_key("ak-nogrant-principal-0123456789"),
    ))
    .await
    .unwrap();
    let linked = with_timeout(intruder.call_raw(
        "map/federation/connect",
        json!({"systemId": "alpha", "endpoint": "ws://evil/"}),
    ))
    .await
    .unwrap();
    assert_eq!(linked["connected"], json!(false), "{linked}");
    // ... nor take or settle what waits for a peer.
    let e = with_timeout(
        intruder.call_raw("map/federation/outbound/next", json!({"systemId": "alpha"})),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("own peer links"), "{e}");
    // ... nor read beta's view of its peers' agents.
    let e = with_timeout(intruder.call_raw("map/federation/agents", json!({})))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("own participants"), "{e}");
    bob_in_is_quiet(&mut bob_in).await;

    // The links' state is on /metrics (the second route counted once beta has answered it).
    let metrics = eventually(
        Duration::from_secs(10),
        "two routed on /metrics",
        || async {
            let m = alpha.metrics().await;
            m.contains("map_federation_routed_total{peer=\"beta\"} 2")
                .then_some(m)
        },
    )
    .await;
    assert!(
        metrics.contains("map_federation_link_up{peer=\"beta\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("map_federation_queued{peer=\"beta\"} 0"),
        "{metrics}"
    );
}

async fn bob_in_is_quiet(inbox: &mut map_router::client::Messages) {
    assert!(
        tokio::time::timeout(Duration::from_millis(300), inbox.next())
            .await
            .is_err(),
        "no other message"
    );
}

/// A free port below Linux's ephemeral range (32768-60999). The routers start one after
/// another on ports chosen before, and those already up dial the others meanwhile: a port the
/// kernel handed out for binding 0 is in the range outbound connections take their source
/// ports from, and one was taken before its router bound it ("the binary exited before
/// listening", seen once in CI).
fn cluster_free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    const FIRST: u16 = 20_000;
    const SPAN: u16 = 12_000;
    // Test processes run one after another, but each starts at its own place.
    let start = (std::process::id() % u32::from(SPAN)) as u16;
    for _ in 0..SPAN {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) % SPAN;
        let port = FIRST + offset;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {FIRST}..{}", FIRST + SPAN);
}

/// The `message_failed` of message `id` in `client`'s view of its router's log.
async fn failure_of(client: &Client, id: &str) -> Option<Value> {
    log_of(client, &["message_failed"])
        .await
        .into_iter()
        .find(|e| e["data"]["messageId"] == json!(id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_routers_in_a_loop_stop_a_message_with_the_specs_code_and_its_sender_sees_why() {
    let dir = TempDir::new("fed-links-loop");
    let ports = [
        ("alpha", cluster_free_port()),
        ("beta", cluster_free_port()),
        ("gamma", cluster_free_port()),
    ];
    // alpha → beta → gamma → alpha, each routing `omega` to the next.
    let mut alpha = System::new(
        "alpha",
        &ports,
        &[("beta", true), ("gamma", false)],
        "routes = { omega = \"beta\" }",
        &dir,
    );
    let mut beta = System::new(
        "beta",
        &ports,
        &[("gamma", true), ("alpha", false)],
        "routes = { omega = \"gamma\" }",
        &dir,
    );
    let mut gamma = System::new(
        "gamma",
        &ports,
        &[("alpha", true), ("beta", false)],
        "routes = { omega = \"alpha\" }",
        &dir,
    );
    for s in [&mut alpha, &mut beta, &mut gamma] {
        s.start().await;
    }
    let alice = alpha.agent("alice").await;
    let sent = with_timeout(alice.send(json!({"system": "omega", "agent": "x"}), json!({"n": 1})))
        .await
        .unwrap();
    assert_eq!(sent.queued, vec!["omega:agent:x".to_owned()]);
    let id = sent.message_id.to_string();
    let failed = eventually(Duration::from_secs(20), "the loop is reported", || {
        let c = alice.client().clone();
        let id = id.clone();
        async move { failure_of(&c, &id).await }
    })
    .await;
    assert_eq!(failed["data"]["code"], json!(5010), "{failed}");
    assert_eq!(
        failed["data"]["reason"],
        json!("federation_refused: Loop detected: message already visited alpha"),
        "{failed}"
    );

    // The hop limit: gamma allows one hop; beta → gamma is the second.
    gamma.kill().await;
    let mut gamma = System::new(
        "gamma",
        &ports,
        &[("alpha", true), ("beta", false)],
        "routes = { omega = \"alpha\" }\nmax_hops = 1",
        &dir,
    );
    gamma.start().await;
    let sent = with_timeout(alice.send(json!({"system": "omega", "agent": "x"}), json!({"n": 2})))
        .await
        .unwrap();
    let id = sent.message_id.to_string();
    let failed = eventually(Duration::from_secs(30), "the hop limit is reported", || {
        let c = alice.client().clone();
        let id = id.clone();
        async move { failure_of(&c, &id).await }
    })
    .await;
    assert_eq!(failed["data"]["code"], json!(5011), "{failed}");
    assert_eq!(
        failed["data"]["reason"],
        json!("federation_refused: Message exceeded maximum hop count of 1"),
        "{failed}"
    );
    // Every router still serves.
    for s in [&alpha, &beta, &gamma] {
        let c = s.client().await;
        with_timeout(c.list_agents(Default::default()))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_killed_and_restarted_gets_every_message_once_in_order_and_overflow_is_reported() {
    const BOUND: usize = 12;
    const TOTAL: usize = 300;
    let dir = TempDir::new("fed-links-kill");
    let ports = [
        ("alpha", cluster_free_port()),
        ("beta", cluster_free_port()),
    ];
    let mut alpha = System::new(
        "alpha",
        &ports,
        &[("beta", true)],
        &format!("max_queued = {BOUND}"),
        &dir,
    );
    let mut beta = System::new("beta", &ports, &[("alpha", true)], "", &dir);
    alpha.start().await;
    beta.start().await;
    let alice = alpha.agent("alice").await;
    let bob = beta.agent("bob").await;

    // Alice sends all the while; beta is killed at a random point and restarted.
    let sender = {
        let alice = alice.clone();
        tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for n in 0..TOTAL {
                let sent = with_timeout(
                    alice.send(json!({"system": "beta", "agent": "bob"}), json!({"n": n})),
                )
                .await
                .unwrap();
                outcomes.push((n, sent.message_id.to_string(), !sent.queued.is_empty()));
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            outcomes
        })
    };
    let reader = |inbox: map_router::client::Messages| {
        tokio::spawn(async move {
            inbox
                .map(|m| {
                    let n = serde_json::from_str::<Value>(m.payload.unwrap().get()).unwrap()["n"]
                        .as_u64()
                        .unwrap() as usize;
                    (n, m.id.to_string())
                })
                .collect::<Vec<(usize, String)>>()
                .await
        })
    };
    let before = reader(bob.messages());
    let kill_after = 30 + (map_router::protocol::ids::random_u128() % 300) as u64;
    tokio::time::sleep(Duration::from_millis(kill_after)).await;
    beta.kill().await;
    drop(bob);
    tokio::time::sleep(Duration::from_millis(400)).await;
    beta.start().await;
    // Bob comes back: its id is its principal's.
    let bob = beta.agent("bob").await;
    let after = reader(bob.messages());
    let outcomes = with_timeout(sender).await.unwrap();
    let queued: Vec<(usize, String)> = outcomes
        .iter()
        .filter(|o| o.2)
        .map(|(n, id, _)| (*n, id.clone()))
        .collect();
    let refused: Vec<usize> = outcomes.iter().filter(|o| !o.2).map(|o| o.0).collect();
    assert!(
        !refused.is_empty(),
        "the bound overflowed while beta was away"
    );
    // Each refused one was reported to its sender: message_failed, queue full.
    let failures = log_of(alice.client(), &["message_failed"]).await;
    let full = failures
        .iter()
        .filter(|e| e["data"]["reason"] == json!("federation_queue_full"))
        .count();
    assert_eq!(full, refused.len(), "{failures:?}");

    // Everything queued reaches beta's log once, in order.
    let beta_reader = beta.client().await;
    let expected: Vec<usize> = queued.iter().map(|(n, _)| *n).collect();
    let got: Vec<usize> = eventually(
        Duration::from_secs(60),
        "every queued message reached beta",
        || {
            let c = beta_reader.clone();
            let want = expected.len();
            async move {
                let got: Vec<usize> = log_of(&c, &["message_sent"])
                    .await
                    .into_iter()
                    .filter(|e| e["data"]["from"] == json!("alpha:agent:alice"))
                    .map(|e| e["data"]["payload"]["n"].as_u64().unwrap() as usize)
                    .collect();
                (got.len() >= want).then_some(got)
            }
        },
    )
    .await;
    assert_eq!(
        got, expected,
        "once each, in order (killed after {kill_after} ms)"
    );
    // Alpha saw each delivered once, none left waiting.
    let delivered = log_of(alice.client(), &["message_delivered"]).await;
    for (n, id) in &queued {
        assert_eq!(
            delivered
                .iter()
                .filter(|e| e["data"]["messageId"] == json!(id))
                .count(),
            1,
            "message {n} delivered once in alpha's log"
        );
    }
    // Bob's live copies keep the order. One may come twice, with the same id, and only
    // across the kill: beta delivered it live in the instant before the kill, before it was
    // durable, so alpha sent it again (docs/federation.md, "Outages").
    drop(bob);
    let before = with_timeout(before).await.unwrap();
    let after = within(Duration::from_secs(5), after).await.unwrap();
    assert!(!after.is_empty(), "bob got messages after the restart");
    let strictly = |v: &[(usize, String)]| v.windows(2).all(|w| w[0].0 < w[1].0);
    assert!(
        strictly(&before) && strictly(&after),
        "in order: {before:?} {after:?}"
    );
    let again: Vec<&(usize, String)> = after.iter().filter(|m| before.contains(m)).collect();
    assert!(
        again.len() <= 1,
        "at most the one in flight at the kill: {again:?}"
    );
    if let Some(m) = again.first() {
        assert_eq!(Some(*m), before.last(), "the last one before the kill");
    }
    for (n, id) in before.iter().chain(&after) {
        let queued_id = &queued
            .iter()
            .find(|(q, _)| q == n)
            .expect("only queued ones")
            .1;
        assert_eq!(
            id,
            &format!("alpha:message:{queued_id}"),
            "one id per message, across systems"
        );
    }
    let metrics = alpha.metrics().await;
    assert!(
        !metrics.contains("map_federation_link_failures_total{peer=\"beta\"} 0"),
        "{metrics}"
    );
}

/// The SDK's own `AgentConnection` on each side (tests/interop/federation_agents.mjs): an agent
/// on beta addresses `{system: "alpha", agent}`, the agent on alpha receives it from
/// `beta:agent:<id>` and answers with the SDK's `reply()`, which comes back to the sender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_agent_connections_message_and_reply_across_two_routers() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let dir = TempDir::new("fed-links-sdk");
    let ports = [
        ("alpha", cluster_free_port()),
        ("beta", cluster_free_port()),
    ];
    let mut alpha = System::new("alpha", &ports, &[("beta", true)], "", &dir);
    let mut beta = System::new("beta", &ports, &[("alpha", true)], "", &dir);
    alpha.start().await;
    beta.start().await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop/federation_agents.mjs");
    let mut waiter = tokio::process::Command::new("node")
        .arg(&script)
        .args(["wait", &alpha.url(), &agent_key("alpha"), "carol"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs");
    let mut lines = BufReader::new(waiter.stdout.take().unwrap()).lines();
    let ready = within(Duration::from_secs(20), lines.next_line())
        .await
        .unwrap();
    assert_eq!(ready.as_deref(), Some("ready"));
    let sender = node_json(
        "federation_agents.mjs",
        &[
            "send",
            &beta.url(),
            &agent_key("beta"),
            "dave",
            "alpha",
            "carol",
        ],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        sender["sent"]["queued"],
        json!(["alpha:agent:carol"]),
        "{sender}"
    );
    let received: Value = serde_json::from_str(
        &within(Duration::from_secs(20), lines.next_line())
            .await
            .unwrap()
            .expect("the waiter's line"),
    )
    .unwrap();
    assert_eq!(received["from"], json!("beta:agent:dave"), "{received}");
    assert_eq!(received["payload"], json!({"hello": "from the SDK"}));
    assert_eq!(
        received["id"],
        json!(format!(
            "beta:message:{}",
            sender["sent"]["messageId"].as_str().unwrap()
        )),
        "one id across the systems"
    );
    assert_eq!(
        sender["reply"]["from"],
        json!("alpha:agent:carol"),
        "{sender}"
    );
    assert_eq!(
        sender["reply"]["payload"],
        json!({"echo": {"hello": "from the SDK"}})
    );
    // The SDK's reply correlates: its meta passed both routers byte for byte.
    assert_eq!(sender["reply"]["meta"]["isResult"], json!(true), "{sender}");
    drop(waiter.stdin.take());
    let _ = within(Duration::from_secs(10), waiter.wait()).await;
}

/// `map-router peers` lists the peers and tests each link as the router opens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peers_command_lists_and_tests_the_links() {
    let dir = TempDir::new("fed-links-cli");
    let ports = [
        ("alpha", cluster_free_port()),
        ("beta", cluster_free_port()),
    ];
    let alpha = System::new(
        "alpha",
        &ports,
        &[("beta", true), ("gamma", false)],
        "",
        &dir,
    );
    let mut beta = System::new("beta", &ports, &[("alpha", true)], "", &dir);
    beta.start().await;
    let peers = |env: Vec<(String, String)>| {
        let config = dir.path.join("alpha.toml");
        async move {
            let out = within(
                Duration::from_secs(30),
                binary_command(["peers".into(), "--config".into(), config.into_os_string()])
                    .envs(env)
                    .output(),
            )
            .await
            .unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        }
    };
    let (code, out) = peers(alpha.env.clone()).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("this system: alpha (2 peers)"), "{out}");
    assert!(out.contains("beta  dialled at ws://127.0.0.1:"), "{out}");
    assert!(out.contains("ok: linked as alpha (beta "), "{out}");
    assert!(
        out.contains("gamma  links in as principal gamma-gw"),
        "{out}"
    );
    // A key beta does not know as alpha's: refused, and said so.
    let (code, out) = peers(vec![("FED_KEY_BETA".into(), agent_key("alpha"))]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("beta  dialled at") && out.contains("FAILED"),
        "{out}"
    );
    // Beta down.
    beta.kill().await;
    let (code, out) = peers(alpha.env.clone()).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("FAILED: dialling ws://127.0.0.1:"), "{out}");
}

/// The SDK's own `GatewayConnection` (tests/interop/federation_gateway.mjs) links to alpha as
/// system `sdk` and routes to beta's agent: alpha passes the envelope on over its link to beta,
/// and answers with beta's answer. Bob gets it from `sdk:agent:alice`, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_gateway_connection_routes_through_one_router_to_another() {
    let dir = TempDir::new("fed-links-sdk-gw");
    let ports = [
        ("alpha", cluster_free_port()),
        ("beta", cluster_free_port()),
    ];
    let mut alpha = System::new("alpha", &ports, &[("beta", true), ("sdk", false)], "", &dir);
    let mut beta = System::new("beta", &ports, &[("alpha", true)], "", &dir);
    alpha.start().await;
    beta.start().await;
    let bob = beta.agent("bob").await;
    let mut bob_in = bob.messages();
    let got = node_json(
        "federation_gateway.mjs",
        &[
            alpha.url().as_str(),
            &link_key("sdk", "alpha"),
            "sdk",
            "beta",
            "bob",
        ],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(got["connect"]["connected"], json!(true), "{got}");
    assert_eq!(got["recorded"], json!(true), "{got}");
    assert_eq!(got["route"]["routed"], json!(true), "{got}");
    let m = next(&mut bob_in).await;
    assert_eq!(m.from, "sdk:agent:alice");
    assert_eq!(
        m.id.as_str(),
        "sdk:message:sdk-m-1",
        "one id across the systems"
    );
    assert_eq!(m.payload.unwrap().get(), r#"{"hello":"from the SDK"}"#);
}
