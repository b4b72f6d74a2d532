//! What a participant supplies as opaque JSON reaches everyone byte for byte: a message payload
//! with unsorted keys, numbers written `1.50` and `1e2`, escaped and unescaped Unicode, inner
//! whitespace, nested arrays and a 64 KiB string; agent metadata; `map/inject` content. Checked
//! on the raw text of the frames (this test's own WebSocket client never parses what it
//! compares): the recipient's `map/message`, the `message_sent` event, and `map/replay` after a
//! restart of the router on the same data directory.

mod common;

use std::time::Duration;

use common::raw::Raw;
use common::*;
use map_router::server::Server;
use serde_json::{json, Value};

/// The payload: everything a re-serialization would change.
fn payload() -> String {
    let big: String = "abcdefghijklmnopqrstuvwxyz012345".repeat(2048); // 64 KiB
    format!(
        r#"{{"zeta": 1.50,"alpha":1e2, "mid" :{{"b":2,"a":1}},"uni":"caf\u00e9 café \ud83d\ude00 😀 \"q\"","nested":[ 1, [ 2,[3 , []]],{{"y":null,"x":-0.0}} ],"big":"{big}"}}"#
    )
}

const METADATA: &str = r#"{ "z":1.0, "a" : [ "\u0041", 2e-3 ] , "m":{"k":"v"}}"#;
const CONTENT: &str = r#"{"hint" : "focus",  "score":0.50, "list":[3,1,2]}"#;

async fn durable(dir: &TempDir) -> (Server, String) {
    let data = dir.path.clone();
    start_server(move |c| c.storage.data_dir = Some(data)).await
}

#[tokio::test]
async fn opaque_json_passes_through_byte_for_byte_live_and_after_a_restart() {
    let dir = TempDir::new("byte-exact");
    let (server, url) = durable(&dir).await;
    let p = payload();

    let mut watcher = Raw::connect(&url, r#"{"participantType":"system"}"#).await;
    watcher
        .call(
            "map/subscribe",
            r#"{"filter":{"eventTypes":["message_sent","agent_registered"]}}"#,
        )
        .await;
    let mut bob = Raw::connect(&url, r#"{"participantType":"agent"}"#).await;
    let registered = bob
        .call(
            "map/agents/register",
            &format!(r#"{{"agentId":"bob","metadata":{METADATA}}}"#),
        )
        .await;
    assert!(registered.contains(METADATA), "{registered}");
    let mut alice = Raw::connect(&url, r#"{"participantType":"agent"}"#).await;
    alice
        .call("map/agents/register", r#"{"agentId":"alice"}"#)
        .await;

    // The metadata, as registered, in the event and in a lookup.
    let event = watcher.frame_with(r#""agent_registered""#).await;
    assert!(event.contains(METADATA), "{event}");
    let got = alice.call("map/agents/get", r#"{"agentId":"bob"}"#).await;
    assert!(got.contains(METADATA), "{got}");

    // The message, to the recipient and in its event.
    let sent = alice
        .call(
            "map/send",
            &format!(r#"{{"to":{{"agent":"bob"}},"payload":{p}}}"#),
        )
        .await;
    assert!(sent.contains(r#""delivered":["bob"]"#), "{sent}");
    let message = bob.frame_with(r#""method":"map/message""#).await;
    assert!(
        message.contains(&format!(r#""payload":{p}"#)),
        "the recipient's frame"
    );
    let event = watcher.frame_with(r#""message_sent""#).await;
    assert_eq!(
        event.matches(&p).count(),
        2,
        "payload and message.payload in message_sent"
    );

    // Injected content, as injected.
    let mut op = Raw::connect(&url, r#"{"participantType":"client"}"#).await;
    op.call(
        "map/inject",
        &format!(r#"{{"agentId":"bob","content":{CONTENT}}}"#),
    )
    .await;
    let injected = bob.frame_with(r#""inject""#).await;
    assert!(
        injected.contains(&format!(r#""payload":{CONTENT}"#)),
        "{injected}"
    );

    // The frames parse, and mean what was sent.
    let parsed: Value = serde_json::from_str(&message).unwrap();
    assert_eq!(
        parsed["params"]["message"]["payload"],
        serde_json::from_str::<Value>(&p).unwrap()
    );

    // After a restart on the same data directory, the log still has the exact text.
    drop((watcher, bob, alice, op));
    with_timeout(server.shutdown()).await;
    let (server, url) = durable(&dir).await;
    let mut reader = Raw::connect(&url, r#"{"participantType":"system"}"#).await;
    // `agent.injected` is one of our vendor types: replayed when named (docs/compatibility.md §7).
    let page = reader
        .call(
            "map/replay",
            r#"{"limit":1000,"filter":{"eventTypes":["*","agent.injected"]}}"#,
        )
        .await;
    // message_sent and message_delivered, each with `payload` and `message.payload`.
    assert_eq!(
        page.matches(&p).count(),
        4,
        "message events after the restart"
    );
    assert!(
        page.contains(METADATA),
        "agent_registered after the restart"
    );
    assert!(
        page.contains(&format!(r#""content":{CONTENT}"#)),
        "agent.injected after the restart"
    );
    let _ = within(Duration::from_secs(10), server.shutdown()).await;
}

/// Metadata must be an object; a shallow update keeps every value's text and the order.
#[tokio::test]
async fn metadata_updates_merge_without_rewriting() {
    let dir = TempDir::new("byte-exact-merge");
    let (_server, url) = durable(&dir).await;
    let mut a = Raw::connect(&url, r#"{"participantType":"agent"}"#).await;
    a.call(
        "map/agents/register",
        r#"{"agentId":"m","metadata":{"b": 1.50, "a": [1e2]}}"#,
    )
    .await;
    let updated = a
        .call(
            "map/agents/update",
            r#"{"agentId":"m","metadata":{"a": {"y":1, "x":2}, "c": 0.10}}"#,
        )
        .await;
    assert!(
        updated.contains(r#""metadata":{"b":1.50,"a":{"y":1, "x":2},"c":0.10}"#),
        "{updated}"
    );
    a.send(r#"{"jsonrpc":"2.0","id":99,"method":"map/agents/update","params":{"agentId":"m","metadata":[1]}}"#.into())
        .await;
    let refused = a.frame_with(r#""id":99"#).await;
    let v: Value = serde_json::from_str(&refused).unwrap();
    assert_eq!(v["error"]["code"], json!(-32602), "{refused}");
    assert!(
        v["error"]["data"]["details"]["reason"]
            .as_str()
            .unwrap()
            .contains("`metadata` must be an object"),
        "{refused}"
    );
}
