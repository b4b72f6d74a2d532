//! Bounded memory (issue 23, item 5): what one caller creates is paged from the store behind
//! a bounded cache and capped by per-principal quotas, and a group send's record of its silent
//! recipients is a bounded sample. Sizes and RSS are measured by `scripts/soak-memory.sh`, not
//! here: these tests check counts, order and bounds.

mod common;

use common::*;
use serde_json::json;

/// A send to a scope whose members are mostly orphaned records a sample of them, not the list.
#[tokio::test]
async fn a_group_send_names_at_most_a_sample_of_its_silent_recipients() {
    let (_server, url) = default_server().await;
    let mut watcher = WsClient::system(&url).await;
    let sub = watcher
        .subscribe(json!({"eventTypes": ["message_failed", "message_delivered"]}))
        .await;
    let mut owner = WsClient::agent(&url, "owner", json!({})).await;
    owner
        .ok(
            "map/scopes/create",
            json!({"scopeId": "crowd", "sendPolicy": "any"}),
        )
        .await;
    let mut gone = WsClient::connect_as(&url, "agent", json!({})).await;
    let mut silent = Vec::new();
    for i in 0..100 {
        let id = format!("m{i:03}");
        gone.register_agent(json!({"agentId": id, "scopes": ["crowd"]}))
            .await;
        silent.push(id);
    }
    let mut here = WsClient::agent(&url, "here", json!({"scopes": ["crowd"]})).await;
    // The members' connection drops: its 100 agents stay, orphaned, for the grace period.
    gone.drop_abruptly();
    let mut sender = WsClient::agent(&url, "sender", json!({})).await;
    let r = loop {
        let r = sender
            .send(json!({"scope": "crowd"}), json!({"n": 1}))
            .await;
        if r["delivered"] == json!(["here"]) {
            break r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let _ = here.next_message().await;
    // The outcome events of that message.
    let failed = loop {
        let ev = watcher.next_event(&sub).await;
        if ev["event"]["data"]["messageId"] == r["messageId"]
            && ev["event"]["type"] == json!("message_failed")
        {
            break ev["event"]["data"].clone();
        }
    };
    assert_eq!(failed["reason"], json!("recipient_offline"));
    assert_eq!(failed["recipientCount"], json!(100), "{failed}");
    let named: Vec<&str> = failed["recipients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(named.len(), 32, "{failed}");
    assert!(named.iter().all(|n| silent.iter().any(|s| s == n)));
    assert!(
        failed.to_string().len() < 2048,
        "the record stays small: {failed}"
    );
    // A send to one of them keeps its own per-recipient event.
    let one = sender.send(json!({"agent": "m007"}), json!(2)).await;
    let ev = loop {
        let ev = watcher.next_event(&sub).await;
        if ev["event"]["data"]["messageId"] == one["messageId"] {
            break ev;
        }
    };
    assert_eq!(ev["event"]["data"]["recipient"], json!("m007"), "{ev}");
    assert!(ev["event"]["data"].get("recipientCount").is_none());
}
