//! A standby answers the reads of agents and scopes itself (issue 48), end to end on the real
//! binary and a real `nats-server -js` on loopback, with authentication on and four
//! principals: `ops` (a system principal), `alice` and `bob` (ordinary ones, each owning
//! agents, some hidden from the other), `nobody` (without `observation.canQuery`):
//!
//! - every principal's client gets, on the standby, the answers it gets on the live node to
//!   `map/agents/list`, `map/agents/get` (each agent, or the same refusal),
//!   `map/scopes/list`, `map/scopes/get` and `map/scopes/members`; what one principal may not
//!   see is not shown to it there either (bob is never shown alice's parent-only agent,
//!   nobody is refused);
//! - the standby answers them with the live node stopped (SIGSTOP): served there, not relayed;
//! - read your writes: a scope created or deleted through the standby is there, or gone, in
//!   the very next read on the standby, every time, while two agents keep the live node
//!   writing and twenty subscribers on the standby make its following lag behind the relayed
//!   answers (without the wait for the stream's end, one run in two read a scope as missing).
//!
//! Every await is bounded. Needs `nats-server` on PATH (the test fails, never skips, without it).
#![cfg(feature = "cluster")]

mod common;

use std::time::Duration;

use common::cluster::{free_port, health_until, keys_file, node_args, serving, start, Started};
use common::nats::Nats;
use common::*;
use serde_json::{json, Value};

const KEYS: [(&str, &str); 4] = [
    ("key-ops-0123456789abcdef", "ops"),
    ("key-alice-0123456789abcdef", "alice"),
    ("key-bob-0123456789abcdef", "bob"),
    ("key-nobody-0123456789abcdef", "nobody"),
];

fn key(principal: &str) -> &'static str {
    KEYS.iter().find(|(_, p)| *p == principal).unwrap().0
}

/// Starts node `name` on `nats` with `cluster` added to its `[cluster]`, and `[auth]` with the
/// four principals' keys (the file `keys`), `ops` a system principal, `nobody` without
/// `observation.canQuery`.
async fn start_node(nats: &Nats, dir: &TempDir, keys: &str, name: &str, cluster: &str) -> Started {
    let port = free_port();
    let args = node_args(
        &nats.url(),
        &dir.path.join(name),
        port,
        &format!("node = \"{name}\"\n{cluster}"),
    );
    let config = std::path::PathBuf::from(args.last().unwrap());
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!(
            "{text}\n[auth]\nsystem_principals = [\"ops\"]\n[auth.api_keys]\nfile = {keys:?}\n\
             [permissions.principals.\"nobody\".observation]\ncanQuery = false\n"
        ),
    )
    .unwrap();
    start(args, port).await
}

/// A call's outcome as compared across nodes: the result (without `asOf`, the newest event
/// each node has) or the error's code.
async fn outcome(c: &mut WsClient, method: &str, params: Value) -> Value {
    match c.call(method, params).await {
        Ok(mut r) => {
            if let Some(o) = r.as_object_mut() {
                o.remove("asOf");
            }
            r
        }
        Err(e) => json!({"error": e["code"]}),
    }
}

/// Every read under test, as `c` gets them.
async fn reads(c: &mut WsClient, agents: &[&str]) -> Vec<Value> {
    let mut out = vec![
        outcome(c, "map/agents/list", json!({})).await,
        outcome(c, "map/agents/list", json!({"limit": 2})).await,
        outcome(c, "map/scopes/list", json!({})).await,
        outcome(c, "map/scopes/get", json!({"scopeId": "team-b"})).await,
        outcome(c, "map/scopes/members", json!({"scopeId": "team-b"})).await,
    ];
    for a in agents {
        let p = json!({"agentId": a, "include": {"children": true, "parent": true}});
        out.push(outcome(c, "map/agents/get", p).await);
    }
    out
}

fn listed(v: &Value) -> Vec<String> {
    v["agents"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|a| a["id"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_standby_answers_reads_as_the_live_node_would_for_every_principal() {
    let nats = Nats::start("reads");
    let dir = TempDir::new("cluster-reads");
    let keys = keys_file(&dir.path, &KEYS);
    let live = start_node(&nats, &dir, &keys, "n0", "").await;
    health_until(&live.url, Duration::from_secs(20), "ok", |s, _| s == 200).await;
    let standby = start_node(
        &nats,
        &dir,
        &keys,
        "n1",
        "standby = true\ntakeover_poll_ms = 100",
    )
    .await;
    health_until(&standby.url, Duration::from_secs(20), "serving", serving).await;

    // Agents and scopes, made on the live node: alice's public one, her parent-only child;
    // bob's scope-visible one in `team-b`, and a public one.
    let (mut ops, _) = connect_with_key(&live.url, key("ops"), "system", json!({})).await;
    ops.ok("map/scopes/create", json!({"scopeId": "team-b"}))
        .await;
    let (mut alice, _) = connect_with_key(&live.url, key("alice"), "agent", json!({})).await;
    alice
        .register_agent(json!({"agentId": "al-pub", "visibility": "public"}))
        .await;
    alice
        .register_agent(
            json!({"agentId": "al-po", "parent": "al-pub", "visibility": "parent-only"}),
        )
        .await;
    let (mut bob, _) = connect_with_key(&live.url, key("bob"), "agent", json!({})).await;
    bob.register_agent(json!({"agentId": "bo-sc", "visibility": "scope"}))
        .await;
    bob.register_agent(json!({"agentId": "bo-pub"})).await;
    bob.ok(
        "map/scopes/join",
        json!({"scopeId": "team-b", "agentId": "bo-sc"}),
    )
    .await;
    let agents = ["al-pub", "al-po", "bo-sc", "bo-pub", "no-such"];

    for principal in ["ops", "alice", "bob", "nobody"] {
        let kind = if principal == "ops" {
            "system"
        } else {
            "client"
        };
        let (mut here, _) = connect_with_key(&live.url, key(principal), kind, json!({})).await;
        let (mut there, _) = connect_with_key(&standby.url, key(principal), kind, json!({})).await;
        let want = reads(&mut here, &agents).await;
        let got = reads(&mut there, &agents).await;
        assert_eq!(
            got, want,
            "{principal}: the standby answers as the live node"
        );
        match principal {
            "ops" => assert_eq!(
                listed(&got[0]),
                ["al-pub", "al-po", "bo-sc", "bo-pub"],
                "a system principal sees every agent"
            ),
            "nobody" => {
                for (i, r) in got.iter().enumerate() {
                    assert_eq!(r["error"], json!(1003), "nobody may not query ({i}): {r}");
                }
            }
            _ => {
                // A client owns no agent: neither the parent-only child nor the scope-visible
                // agent is shown to it, on either node.
                assert_eq!(listed(&got[0]), ["al-pub", "bo-pub"], "{principal}");
                assert!(
                    got[6]["error"].is_number(),
                    "{principal}: al-po: {}",
                    got[6]
                );
                assert!(
                    got[7]["error"].is_number(),
                    "{principal}: bo-sc: {}",
                    got[7]
                );
                // Neither is named anywhere (al-pub's `children` leave al-po out).
                let text = got.iter().map(Value::to_string).collect::<String>();
                assert!(!text.contains("\"al-po\""), "{principal}: {text}");
                assert!(!text.contains("\"bo-sc\""), "{principal}: {text}");
            }
        }
    }

    // Served on the standby itself: with the live node stopped, its reads still answer.
    let (mut reader, _) = connect_with_key(&standby.url, key("alice"), "client", json!({})).await;
    let before = outcome(&mut reader, "map/agents/list", json!({})).await;
    signal(&live, "STOP");
    let during = within(
        Duration::from_secs(1),
        outcome(&mut reader, "map/agents/list", json!({})),
    )
    .await;
    signal(&live, "CONT");
    assert_eq!(
        during, before,
        "answered by the standby while the live node was stopped"
    );

    // Read your writes: what this session changes through the standby, the standby shows in
    // its next read, while other sessions keep the live node writing (so that the standby's
    // following lags behind the relayed answers).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut busy = Vec::new();
    for n in 0..2 {
        let (url, stop) = (live.url.clone(), std::sync::Arc::clone(&stop));
        let key = key("alice");
        busy.push(tokio::spawn(async move {
            let (mut c, _) = connect_with_key(&url, key, "agent", json!({})).await;
            c.register_agent(json!({"agentId": format!("busy-{n}")}))
                .await;
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 100_000 {
                c.send(json!({"agent": "al-pub"}), json!({"i": i})).await;
                i += 1;
            }
        }));
    }
    // And subscribers on the standby, whose fan-out its router does as it follows.
    let mut watchers = Vec::new();
    for _ in 0..20 {
        let (mut w, _) = connect_with_key(&standby.url, key("ops"), "system", json!({})).await;
        w.subscribe(Value::Null).await;
        watchers.push(w);
    }
    let (mut ops1, _) = connect_with_key(&standby.url, key("ops"), "system", json!({})).await;
    for i in 0..40 {
        let id = format!("ryw-{i}");
        ops1.ok("map/scopes/create", json!({"scopeId": id})).await;
        let got = ops1.ok("map/scopes/get", json!({"scopeId": id})).await;
        assert_eq!(got["scope"]["id"], json!(id), "created {id}: {got}");
        ops1.ok("map/scopes/delete", json!({"scopeId": id})).await;
        let gone = ops1.err("map/scopes/get", json!({"scopeId": id})).await;
        assert!(gone["code"].is_number(), "deleted {id}: {gone}");
    }
    // A session closed on the live node has no session on the standby either: its reads are
    // refused there, as on the live node (1000), until it connects again.
    ops1.ok("map/session/close", json!({})).await;
    let refused = ops1.err("map/agents/list", json!({})).await;
    assert_eq!(refused["code"], json!(1000), "{refused}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for b in busy {
        within(Duration::from_secs(10), b).await.unwrap();
    }
}

fn signal(node: &Started, sig: &str) {
    let pid = node.child.id().expect("running").to_string();
    let status = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid])
        .status()
        .unwrap();
    assert!(status.success());
}
