//! Issues 22 and 30 over MAP itself: every identity belongs to a principal, across detach,
//! restart and kill -9, and a queued message reaches the agent that comes back, once, in order.
//!
//! The real binary, auth on with API keys for four principals, as in the security probe:
//! `ops` (a system principal), `alice` and `bob` (ordinary), and `viewer` (no send, register,
//! task or mail grants). Each test asserts what must not happen (bob never gets alice's id,
//! agent, messages, conversations or tasks), and that alice gets hers back.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const OPS: &str = "key-ops-0123456789abcdef";
const ALICE: &str = "key-alice-0123456789abcdef";
const BOB: &str = "key-bob-0123456789abcdef";
const VIEWER: &str = "key-viewer-0123456789abcdef";

/// A config with the four principals; `extra` is appended.
fn write_config(dir: &TempDir, extra: &str) -> std::path::PathBuf {
    let path = dir.path.join("map-router.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[router]
resume_window_ms = 3000

[auth]
system_principals = ["ops"]

[auth.api_keys]
keys_env = "IDENTITY_TEST_KEYS"

[permissions.principals."viewer".messaging]
canSend = false
[permissions.principals."viewer".lifecycle]
canRegister = false
[permissions.principals."viewer".tasks]
canCreate = false
[permissions.principals."viewer".mail]
canCreate = false
{extra}
"#
        ),
    )
    .unwrap();
    path
}

/// The router binary on `data` with the four principals' keys.
async fn start(
    config: &std::path::Path,
    data: &std::path::Path,
) -> (tokio::process::Child, String) {
    start_binary_with_env(
        [
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--data-dir".as_ref(),
            data.as_os_str(),
            "--config".as_ref(),
            config.as_os_str(),
        ],
        [(
            "IDENTITY_TEST_KEYS",
            format!("{OPS} ops,{ALICE} alice,{BOB} bob,{VIEWER} viewer"),
        )],
    )
    .await
}

/// Connects as `kind` with `key` (and `extra` connect params); panics unless admitted.
async fn connect(url: &str, k: &str, kind: &str, extra: Value) -> (WsClient, Value) {
    connect_with_key(url, k, kind, extra).await
}

/// Watches `c` for `QUIET`: no `map/message` arrives.
async fn no_message(c: &mut WsClient) {
    let got = tokio::time::timeout(
        QUIET,
        c.next_notification_where(|n| n["method"] == "map/message"),
    )
    .await;
    assert!(got.is_err(), "a message reached the wrong socket: {got:?}");
}

/// The payloads of the next `n` messages on `c`.
async fn messages(c: &mut WsClient, n: usize) -> Vec<Value> {
    let mut out = Vec::new();
    for _ in 0..n {
        let m = c
            .next_notification_where(|n| n["method"] == "map/message")
            .await;
        out.push(m["params"]["message"]["payload"].clone());
    }
    out
}

/// Waits (bounded) until `agent` is orphaned, as `observer` sees it.
async fn wait_orphaned(observer: &mut WsClient, agent: &str) {
    within(Duration::from_secs(5), async {
        loop {
            let a = observer
                .ok("map/agents/get", json!({"agentId": agent}))
                .await;
            if a["agent"]["state"] == "orphaned" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

async fn guaranteed(sender: &mut WsClient, to: &str, n: u64) -> Value {
    sender
        .ok(
            "map/send",
            json!({"to": {"agent": to}, "payload": {"n": n}, "meta": {"delivery": "guaranteed"}}),
        )
        .await
}

#[tokio::test]
async fn an_orphaned_agent_is_reclaimed_by_its_own_principal_only_with_its_queue() {
    let dir = TempDir::new("identity-orphan");
    let config = write_config(&dir, "");
    let (_router, url) = start(&config, &dir.path.join("data")).await;

    let (mut alice, _) = connect(&url, ALICE, "agent", json!({})).await;
    alice.register_agent(json!({"agentId": "alice-echo"})).await;
    alice.drop_abruptly();
    let (mut sender, _) = connect(&url, OPS, "agent", json!({})).await;
    sender
        .register_agent(json!({"agentId": "ops-sender"}))
        .await;
    // Wait for the orphan, then queue two messages for it.
    wait_orphaned(&mut sender, "alice-echo").await;
    for n in [1, 2] {
        let r = guaranteed(&mut sender, "alice-echo", n).await;
        assert_eq!(r["queued"], json!(["alice-echo"]), "{r}");
    }

    // bob and viewer may not reclaim it: 1003, and nothing reaches their sockets.
    let (mut bob, _) = connect(&url, BOB, "agent", json!({})).await;
    let e = bob
        .err("map/agents/register", json!({"agentId": "alice-echo"}))
        .await;
    assert_eq!(e["code"], 1003, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("another principal"),
        "{e}"
    );
    let (mut viewer, _) = connect(&url, VIEWER, "agent", json!({})).await;
    let e = viewer
        .err("map/agents/register", json!({"agentId": "alice-echo"}))
        .await;
    assert_eq!(e["code"], 1003, "{e}");
    no_message(&mut bob).await;
    no_message(&mut viewer).await;
    let a = sender
        .ok("map/agents/get", json!({"agentId": "alice-echo"}))
        .await;
    assert_eq!(a["agent"]["state"], "orphaned", "still alice's: {a}");

    // alice, on a new connection, takes it back and gets both messages once, in order.
    let (mut alice, _) = connect(&url, ALICE, "agent", json!({})).await;
    let r = alice
        .ok("map/agents/register", json!({"agentId": "alice-echo"}))
        .await;
    assert_eq!(r["resumed"], json!(true), "{r}");
    assert_eq!(
        messages(&mut alice, 2).await,
        vec![json!({"n": 1}), json!({"n": 2})]
    );
    no_message(&mut alice).await;
    // The MAP canary kept answering throughout.
    sender.ok("map/agents/list", json!({})).await;
}

#[tokio::test]
async fn a_detached_participant_id_is_not_handed_to_another_principal() {
    let dir = TempDir::new("identity-detached");
    let config = write_config(&dir, "");
    let (_router, url) = start(&config, &dir.path.join("data")).await;

    let (mut alice, r) =
        connect(&url, ALICE, "agent", json!({"participantId": "alice-desk"})).await;
    assert_eq!(r["participantId"], "alice-desk");
    let conv = alice
        .ok("mail/create", json!({"subject": "alice's private plans"}))
        .await;
    let conv_id = conv["conversation"]["id"].as_str().unwrap().to_owned();
    alice
        .ok(
            "mail/turn",
            json!({"conversationId": conv_id, "contentType": "text", "content": "secret turn"}),
        )
        .await;
    let task = alice
        .ok(
            "map/tasks/create",
            json!({"task": {"title": "alice's task"}}),
        )
        .await;
    let task_id = task["task"]["id"].as_str().unwrap().to_owned();
    alice.drop_abruptly();
    tokio::time::sleep(Duration::from_millis(100)).await;

    // bob asks for the detached id: he gets a fresh one, and none of alice's data.
    let (mut bob, r) = connect(&url, BOB, "agent", json!({"participantId": "alice-desk"})).await;
    assert_ne!(r["participantId"], "alice-desk", "{r}");
    let listed = bob.ok("mail/list", json!({})).await;
    assert!(
        !listed.to_string().contains("alice's private plans"),
        "{listed}"
    );
    let e = bob
        .err("mail/turns/list", json!({"conversationId": conv_id}))
        .await;
    assert!(!e.to_string().contains("secret turn"), "{e}");
    let e = bob
        .err(
            "mail/turn",
            json!({"conversationId": conv_id, "contentType": "text", "content": "bob writes"}),
        )
        .await;
    assert!(e["code"].is_number(), "{e}");
    let e = bob
        .err(
            "map/tasks/update",
            json!({"taskId": task_id, "status": "completed"}),
        )
        .await;
    assert!(e["code"].is_number(), "{e}");
    // Nor does the system-less viewer.
    let (_viewer, r) = connect(
        &url,
        VIEWER,
        "client",
        json!({"participantId": "alice-desk"}),
    )
    .await;
    assert_ne!(r["participantId"], "alice-desk", "{r}");

    // alice gets her id back, with her history, and her task unchanged.
    let (mut alice, r) =
        connect(&url, ALICE, "agent", json!({"participantId": "alice-desk"})).await;
    assert_eq!(r["participantId"], "alice-desk", "{r}");
    let turns = alice
        .ok("mail/turns/list", json!({"conversationId": conv_id}))
        .await;
    assert!(turns.to_string().contains("secret turn"), "{turns}");
    assert!(!turns.to_string().contains("bob writes"), "{turns}");
    let t = alice.ok("map/tasks/get", json!({"taskId": task_id})).await;
    assert_ne!(t["task"]["status"], "completed", "{t}");
}

/// alice's ids, data and queue across a restart of the router (`kill`: SIGKILL, else SIGTERM).
async fn ids_keep_their_owner_across_a_restart(kill: bool, delay_ms: u64) {
    let dir = TempDir::new("identity-restart");
    let config = write_config(&dir, "");
    let data = dir.path.join("data");
    let (mut router, url) = start(&config, &data).await;

    let (mut alice, _) =
        connect(&url, ALICE, "agent", json!({"participantId": "alice-desk"})).await;
    alice
        .register_agent(json!({"agentId": "alice-agent"}))
        .await;
    let conv = alice
        .ok("mail/create", json!({"subject": "alice's private plans"}))
        .await;
    let conv_id = conv["conversation"]["id"].as_str().unwrap().to_owned();
    alice
        .ok(
            "mail/turn",
            json!({"conversationId": conv_id, "contentType": "text", "content": "secret turn"}),
        )
        .await;
    let task = alice
        .ok(
            "map/tasks/create",
            json!({"task": {"title": "alice's task", "assignee": "alice-agent"}}),
        )
        .await;
    let task_id = task["task"]["id"].as_str().unwrap().to_owned();
    // alice goes away; two guaranteed messages are queued for her agent.
    alice.drop_abruptly();
    let (mut sender, _) = connect(&url, OPS, "agent", json!({})).await;
    sender
        .register_agent(json!({"agentId": "ops-sender"}))
        .await;
    wait_orphaned(&mut sender, "alice-agent").await;
    for n in [1, 2] {
        let r = guaranteed(&mut sender, "alice-agent", n).await;
        assert_eq!(r["queued"], json!(["alice-agent"]), "{r}");
    }
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    if kill {
        router.start_kill().expect("SIGKILL");
    } else {
        let pid = router.id().expect("pid").to_string();
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
    }
    with_timeout(router.wait()).await.expect("the router ended");

    let (_router, url) = start(&config, &data).await;
    // bob asks first for alice's participant id and agent id: neither is his.
    let (mut bob, r) = connect(&url, BOB, "agent", json!({"participantId": "alice-desk"})).await;
    assert_ne!(r["participantId"], "alice-desk", "{r}");
    let e = bob
        .err("map/agents/register", json!({"agentId": "alice-agent"}))
        .await;
    assert_eq!(e["code"], 1003, "{e}");
    let listed = bob.ok("mail/list", json!({})).await;
    assert!(
        !listed.to_string().contains("alice's private plans"),
        "{listed}"
    );
    let e = bob
        .err(
            "map/tasks/update",
            json!({"taskId": task_id, "status": "completed"}),
        )
        .await;
    assert!(e["code"].is_number(), "{e}");
    let e = bob
        .err(
            "mail/turn",
            json!({"conversationId": conv_id, "contentType": "text", "content": "bob writes"}),
        )
        .await;
    assert!(e["code"].is_number(), "{e}");
    no_message(&mut bob).await;

    // alice gets both back, her history, and the two queued messages once, in order.
    let (mut alice, r) =
        connect(&url, ALICE, "agent", json!({"participantId": "alice-desk"})).await;
    assert_eq!(r["participantId"], "alice-desk", "{r}");
    alice
        .register_agent(json!({"agentId": "alice-agent"}))
        .await;
    assert_eq!(
        messages(&mut alice, 2).await,
        vec![json!({"n": 1}), json!({"n": 2})]
    );
    no_message(&mut alice).await;
    let turns = alice
        .ok("mail/turns/list", json!({"conversationId": conv_id}))
        .await;
    assert!(turns.to_string().contains("secret turn"), "{turns}");
    assert!(!turns.to_string().contains("bob writes"), "{turns}");
    let t = alice.ok("map/tasks/get", json!({"taskId": task_id})).await;
    assert_ne!(t["task"]["status"], "completed", "{t}");
}

#[tokio::test]
async fn ids_and_queues_survive_a_clean_restart() {
    ids_keep_their_owner_across_a_restart(false, 0).await;
}

#[tokio::test]
async fn ids_and_queues_survive_kill_9_at_random_points() {
    // Several rounds, the kill landing at a different point after the queueing each time.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    for round in 0..3u64 {
        let delay = (seed.wrapping_mul(round + 7)) % 120;
        eprintln!("round {round}: kill -9 {delay} ms after the second message was queued");
        ids_keep_their_owner_across_a_restart(true, delay).await;
    }
}

#[tokio::test]
async fn an_operator_releases_an_id_and_only_a_system_principal_may() {
    let dir = TempDir::new("identity-release");
    let config = write_config(&dir, "");
    let (_router, url) = start(&config, &dir.path.join("data")).await;
    let (alice, _) = connect(&url, ALICE, "agent", json!({"participantId": "alice-desk"})).await;
    alice.close().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (mut bob, _) = connect(&url, BOB, "client", json!({})).await;
    let e = bob
        .err(
            "map/identities/release",
            json!({"participantId": "alice-desk"}),
        )
        .await;
    assert_eq!(e["code"], 1003, "{e}");
    let (mut ops, _) = connect(&url, OPS, "system", json!({})).await;
    let r = ops
        .ok(
            "map/identities/release",
            json!({"participantId": "alice-desk"}),
        )
        .await;
    assert_eq!(r["released"], true, "{r}");
    assert_eq!(r["previousOwner"]["id"], "alice", "{r}");
    let e = ops
        .err(
            "map/identities/release",
            json!({"participantId": "x", "agentId": "y"}),
        )
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    // Now bob may take it (alice's session left with map/disconnect... or expired).
    within(Duration::from_secs(6), async {
        loop {
            let (_c, r) =
                connect(&url, BOB, "client", json!({"participantId": "alice-desk"})).await;
            if r["participantId"] == "alice-desk" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_system_principal_may_take_any_id_and_the_owner_keeps_it() {
    let dir = TempDir::new("identity-system");
    let config = write_config(&dir, "");
    let (_router, url) = start(&config, &dir.path.join("data")).await;
    let (mut alice, _) = connect(&url, ALICE, "agent", json!({})).await;
    alice.register_agent(json!({"agentId": "alice-bot"})).await;
    alice.drop_abruptly();
    let (mut ops, _) = connect(&url, OPS, "system", json!({})).await;
    wait_orphaned(&mut ops, "alice-bot").await;
    let r = ops
        .ok("map/agents/register", json!({"agentId": "alice-bot"}))
        .await;
    assert_eq!(r["resumed"], json!(true), "{r}");
    ops.ok("map/agents/unregister", json!({"agentId": "alice-bot"}))
        .await;
    // Still alice's: bob may not register it, alice may.
    let (mut bob, _) = connect(&url, BOB, "agent", json!({})).await;
    let e = bob
        .err("map/agents/register", json!({"agentId": "alice-bot"}))
        .await;
    assert_eq!(e["code"], 1003, "{e}");
    let (mut alice, _) = connect(&url, ALICE, "agent", json!({})).await;
    alice.register_agent(json!({"agentId": "alice-bot"})).await;
}

/// The Rust client (what the MAMP and IM gateways' peer sessions are built on): a reclaimed
/// agent's handle gets what was queued for it, although the router sends it before it answers
/// the registration (issue 30: an IM agent that came back lost its queue this way).
#[tokio::test]
async fn the_rust_client_hands_a_reclaimed_agent_what_was_queued_for_it() {
    use futures::StreamExt;
    use map_router::client::{Client, ClientOptions};
    use map_router::protocol::methods::agents::RegisterParams;
    let (server, url) = start_server(|_| {}).await;
    let first = with_timeout(Client::in_process(&server, ClientOptions::agent()))
        .await
        .unwrap();
    let agent = RegisterParams {
        agent_id: Some("im-peer".into()),
        ..RegisterParams::default()
    };
    with_timeout(first.register(agent.clone())).await.unwrap();
    with_timeout(first.close()).await.unwrap();
    let mut sender = WsClient::agent(&url, "sender", json!({})).await;
    wait_orphaned(&mut sender, "im-peer").await;
    for n in [1, 2] {
        let r = guaranteed(&mut sender, "im-peer", n).await;
        assert_eq!(r["queued"], json!(["im-peer"]), "{r}");
    }
    let second = with_timeout(Client::in_process(&server, ClientOptions::agent()))
        .await
        .unwrap();
    let handle = with_timeout(second.register(agent)).await.unwrap();
    let mut inbox = handle.messages();
    for n in [1, 2] {
        let m = with_timeout(inbox.next()).await.expect("a message");
        assert_eq!(m.payload.unwrap().to_value(), json!({"n": n}));
    }
    assert!(
        tokio::time::timeout(QUIET, inbox.next()).await.is_err(),
        "delivered once"
    );
    // Nothing was left on the connection's own inbox either.
    let mut rest = second.messages();
    assert!(tokio::time::timeout(QUIET, rest.next()).await.is_err());
}
