//! Who learns that a session connected (issue 46, found by the dashboard's conversations view):
//! with authentication on, a session's `participant_connected` and `participant_disconnected`
//! (its participant id, type and the name it chose, often its agent's name) reach only the
//! sessions of its own principal and system participants, live and in `map/replay`. Another
//! principal's dashboard learns nothing of them; with authentication off nothing changes.

mod common;

use common::*;
use serde_json::{json, Value};

const OPS: &str = "key-ops-0123456789abcdef";
const ALICE: &str = "key-alice-0123456789abcdef";
const BOB: &str = "key-bob-0123456789abcdef";

fn about(events: &[Value], participant: &str) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            if e.get("event").is_some() {
                &e["event"]
            } else {
                e
            }
        })
        .filter(|e| {
            let t = e["type"].as_str().unwrap_or("");
            t.starts_with("participant") && e["data"]["participantId"] == participant
        })
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_sessions_comings_and_goings_reach_its_principal_and_operators_only() {
    let (_server, url) = start_server(|c| {
        c.auth.api_keys.inline = Some(map_router::auth::config::Secret(format!(
            "{OPS} ops\n{ALICE} alice\n{BOB} bob"
        )));
        c.auth.system_principals = vec!["ops".into()];
    })
    .await;
    // Watching before alice's agent connects: bob (an ordinary principal's dashboard), ops (an
    // operator, as system) and alice's own dashboard.
    let (mut bob, _) = connect_with_key(&url, BOB, "client", json!({"name": "bob-dash"})).await;
    let (mut ops, _) = connect_with_key(&url, OPS, "system", json!({"name": "ops-dash"})).await;
    let (mut mine, _) =
        connect_with_key(&url, ALICE, "client", json!({"name": "alice-dash"})).await;
    for c in [&mut bob, &mut ops, &mut mine] {
        c.subscribe(json!({"eventTypes": ["participant_connected", "participant_disconnected"]}))
            .await;
    }
    let (agent, r) = connect_with_key(
        &url,
        ALICE,
        "agent",
        json!({"name": "alice-secret-planner"}),
    )
    .await;
    let pid = r["participantId"].as_str().unwrap().to_owned();
    agent.close().await;
    // Those who may: both events, live, with the name.
    for c in [&mut ops, &mut mine] {
        let connected = c
            .next_notification_where(|n| {
                n["params"]["event"]["type"] == "participant_connected"
                    && n["params"]["event"]["data"]["participantId"] == pid.as_str()
            })
            .await;
        assert_eq!(
            connected["params"]["event"]["data"]["name"],
            "alice-secret-planner"
        );
        c.next_notification_where(|n| {
            n["params"]["event"]["type"] == "participant_disconnected"
                && n["params"]["event"]["data"]["participantId"] == pid.as_str()
        })
        .await;
    }
    // Bob: nothing live...
    bob.assert_none_where("alice's session on bob's socket", |n| {
        n.to_string().contains(pid.as_str()) || n.to_string().contains("alice-secret-planner")
    })
    .await;
    // ...and nothing in the log, while he still sees his own.
    let log = replay_all(&mut bob, None).await;
    let text = serde_json::to_string(&log).unwrap();
    assert!(about(&log, &pid).is_empty(), "bob replays alice's session");
    assert!(!text.contains("alice-secret-planner") && !text.contains("alice-dash"));
    assert!(text.contains("bob-dash"), "bob sees his own connect");
    // Alice and the operator replay both.
    for c in [&mut ops, &mut mine] {
        let log = replay_all(c, None).await;
        assert_eq!(
            about(&log, &pid),
            ["participant_connected", "participant_disconnected"]
        );
    }
}

#[tokio::test]
async fn without_authentication_everyone_sees_every_session_as_before() {
    let (_server, url) = start_server(|_| {}).await;
    let mut watcher = WsClient::client(&url).await;
    watcher
        .subscribe(json!({"eventTypes": ["participant_connected"]}))
        .await;
    let other = WsClient::connect_as(&url, "agent", json!({"name": "someone"})).await;
    let pid = other.pid();
    let seen = watcher
        .next_notification_where(|n| n["params"]["event"]["data"]["participantId"] == pid.as_str())
        .await;
    assert_eq!(seen["params"]["event"]["data"]["name"], "someone");
}
