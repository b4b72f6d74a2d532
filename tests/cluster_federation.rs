//! A federated cluster (issue 47, item 4): system `alpha` is a cluster of two nodes on a real
//! `nats-server -js` (a live node and a standby), linked to system `beta` (one router).
//! The live node holds the peer link; an agent on alpha sends to beta's agent all the while;
//! the live node is killed with kill -9 at a random point; the standby takes over, dials beta
//! again and routes what waited. Beta gets every message alpha acknowledged, once, in order.
//!
//! Every await is bounded. Needs `nats-server` on PATH (fails, never skips, without it).
#![cfg(feature = "cluster")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::cluster::{free_port, health_until, keys_file, node_args, serving};
use common::nats::Nats;
use common::*;
use map_router::client::{Client, ClientOptions};
use map_router::protocol::methods::agents::RegisterParams;
use serde_json::{json, Value};

const ALICE_KEY: &str = "ak-agents-of-alpha-0123456789abcdef";
const BOB_KEY: &str = "ak-agents-of-beta-0123456789abcdef";
const LINK_KEY: &str = "ak-link-alpha-to-beta-0123456789abcdef";

/// A router process with `env`, keeping its log; `listening` fires on its listening line.
struct Proc {
    child: tokio::process::Child,
    listening: Option<tokio::sync::oneshot::Receiver<()>>,
    log: Arc<Mutex<Vec<String>>>,
}

fn spawn(args: Vec<std::ffi::OsString>, env: &[(&str, &str)]) -> Proc {
    use tokio::io::AsyncBufReadExt;
    let mut child = binary_command(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the router");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let (tx, listening) = tokio::sync::oneshot::channel();
    let log = Arc::new(Mutex::new(Vec::new()));
    let kept = log.clone();
    tokio::spawn(async move {
        let mut tx = Some(tx);
        while let Ok(Some(line)) = lines.next_line().await {
            if line.starts_with("map-router listening on ") {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(());
                }
            }
            kept.lock().unwrap().push(line);
        }
    });
    Proc {
        child,
        listening: Some(listening),
        log,
    }
}

impl Proc {
    async fn listening(&mut self, limit: Duration) {
        let rx = self.listening.take().expect("once");
        if within(limit, rx).await.is_err() {
            panic!("never listened:\n{}", self.log.lock().unwrap().join("\n"));
        }
    }
}

async fn agent_client(url: &str, key: &str) -> Client {
    let options = ClientOptions::agent()
        .api_key(key)
        .reconnect(map_router::client::ReconnectPolicy::disabled());
    with_timeout(Client::connect_ws(url, options))
        .await
        .unwrap()
}

/// `(n, message id)` of every `message_sent` from alpha's alice in `c`'s view of beta's log.
async fn arrived(c: &Client) -> Vec<u64> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = with_timeout(c.call_raw(
            "map/replay",
            json!({"afterEventId": after, "limit": 1000, "filter": {"eventTypes": ["message_sent"]}}),
        ))
        .await
        .unwrap();
        let events = page["events"].as_array().cloned().unwrap_or_default();
        for e in &events {
            if e["event"]["data"]["from"] == json!("alpha:agent:alice") {
                out.push(e["event"]["data"]["payload"]["n"].as_u64().unwrap());
            }
        }
        if page["hasMore"] != json!(true) || events.is_empty() {
            return out;
        }
        after = events
            .last()
            .and_then(|e| e["eventId"].as_str().map(str::to_owned));
    }
}

#[test]
fn a_federated_clusters_standby_takes_over_the_peer_link_and_loses_nothing_acknowledged() {
    on_big_stack(takeover);
}

async fn takeover() {
    let nats = Nats::start("fed-cluster");
    let dir = TempDir::new("fed-cluster");
    // Beta: one router; alpha's link authenticates as alpha-gw.
    let beta_keys = dir.path.join("beta-keys");
    std::fs::write(
        &beta_keys,
        format!("{BOB_KEY} agents-beta\n{LINK_KEY} alpha-gw\n"),
    )
    .unwrap();
    let beta_port = free_port();
    let beta_config = dir.path.join("beta.toml");
    std::fs::write(
        &beta_config,
        format!(
            "[auth.api_keys]\nfile = {beta_keys:?}\n[federation]\nsystem_id = \"beta\"\n\
             [[federation.peer]]\nsystem_id = \"alpha\"\nprincipal = \"alpha-gw\"\n"
        ),
    )
    .unwrap();
    let mut beta = spawn(
        vec![
            "--listen".into(),
            format!("127.0.0.1:{beta_port}").into(),
            "--config".into(),
            beta_config.into(),
            "--data-dir".into(),
            dir.path.join("beta").into(),
        ],
        &[],
    );
    beta.listening(Duration::from_secs(20)).await;
    let beta_url = format!("ws://127.0.0.1:{beta_port}/");
    let bob_client = agent_client(&beta_url, BOB_KEY).await;
    let _bob = with_timeout(bob_client.register(RegisterParams {
        agent_id: Some("bob".into()),
        ..Default::default()
    }))
    .await
    .unwrap();

    // Alpha: two nodes of one cluster, both configured to dial beta.
    let alpha_keys = keys_file(&dir.path, &[(ALICE_KEY, "agents-alpha")]);
    let alpha_node = |name: &str, standby: bool| {
        let port = free_port();
        let data = dir.path.join(name);
        let args = node_args(
            &nats.url(),
            &data,
            port,
            &format!(
                "node = \"{name}\"\n{}",
                if standby {
                    "standby = true\ntakeover_poll_ms = 100\n"
                } else {
                    ""
                }
            ),
        );
        let config = data.with_extension("toml");
        let mut text = std::fs::read_to_string(&config).unwrap();
        text.push_str(&format!(
            "[auth.api_keys]\nfile = {alpha_keys:?}\n[federation]\nsystem_id = \"alpha\"\n\
             [[federation.peer]]\nsystem_id = \"beta\"\nprincipal = \"beta-gw\"\n\
             endpoint = \"{beta_url}\"\napi_key_env = \"FED_KEY_BETA\"\n"
        ));
        std::fs::write(&config, text).unwrap();
        (
            spawn(args, &[("FED_KEY_BETA", LINK_KEY)]),
            format!("ws://127.0.0.1:{port}/"),
        )
    };
    let (mut a1, a1_url) = alpha_node("a1", false);
    a1.listening(Duration::from_secs(20)).await;
    let (mut a2, a2_url) = alpha_node("a2", true);
    let a2_addr = a2_url
        .trim_start_matches("ws://")
        .trim_end_matches('/')
        .to_owned();
    within(Duration::from_secs(20), async {
        while tokio::net::TcpStream::connect(&a2_addr).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    health_until(
        &a2_url,
        Duration::from_secs(20),
        "a serving standby",
        serving,
    )
    .await;

    // Alice sends all the while: to a1, then (after its kill) to a2.
    let sender = {
        let (a1_url, a2_url) = (a1_url.clone(), a2_url.clone());
        tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut unsure = Vec::new();
            let mut n = 0u64;
            for (i, url) in [a1_url, a2_url].into_iter().enumerate() {
                if i == 1 {
                    // The standby serves while it waits; it is alpha once its /health is 200.
                    health_until(&url, Duration::from_secs(30), "the takeover", |s, _| {
                        s == 200
                    })
                    .await;
                }
                let client = agent_client(&url, ALICE_KEY).await;
                let alice = with_timeout(client.register(RegisterParams {
                    agent_id: Some("alice".into()),
                    ..Default::default()
                }))
                .await
                .unwrap();
                for _ in 0..150 {
                    let sent = tokio::time::timeout(
                        Duration::from_secs(10),
                        alice.send(json!({"system": "beta", "agent": "bob"}), json!({"n": n})),
                    )
                    .await;
                    match sent {
                        Ok(Ok(r)) => {
                            assert_eq!(r.queued, vec!["beta:agent:bob".to_owned()], "n {n}");
                            acked.push(n);
                            n += 1;
                        }
                        // The node went away: this one may or may not have been kept.
                        Ok(Err(_)) | Err(_) => {
                            unsure.push(n);
                            n += 1;
                            break;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            (acked, unsure)
        })
    };
    let kill_after = 100 + (map_router::protocol::ids::random_u128() % 500) as u64;
    tokio::time::sleep(Duration::from_millis(kill_after)).await;
    a1.child.start_kill().unwrap();
    with_timeout(a1.child.wait()).await.unwrap();
    a2.listening(Duration::from_secs(30)).await;
    let (acked, unsure) = within(Duration::from_secs(60), sender).await.unwrap();
    assert!(
        acked.len() > 150,
        "alice sent to both nodes: {}",
        acked.len()
    );

    // Beta gets every acknowledged message once, in order (an unsure one at most once, in its
    // place).
    let reader = agent_client(&beta_url, BOB_KEY).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let got =
        loop {
            let got = arrived(&reader).await;
            let all = acked.iter().all(|n| got.contains(n));
            if all {
                break got;
            }
            assert!(
            tokio::time::Instant::now() < deadline,
            "beta never got them all (killed after {kill_after} ms): missing {:?}\na2's log:\n{}",
            acked.iter().filter(|n| !got.contains(n)).collect::<Vec<_>>(),
            a2.log.lock().unwrap().join("\n")
        );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "once each, in order (killed after {kill_after} ms): {got:?}"
    );
    assert!(
        got.iter().all(|n| acked.contains(n) || unsure.contains(n)),
        "nothing alpha did not send: {got:?}"
    );
    // The standby's link is the one up now.
    let link_up = a2
        .log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("federation link up") && l.contains("peer=beta"));
    assert!(link_up, "a2 dialled beta");
    let _: Value = json!(unsure);
}
