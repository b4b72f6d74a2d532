//! W3C trace context over real WebSockets: a message's `meta.traceparent` (and `tracestate`)
//! stays on the message and is stamped on the events it causes (`event._meta`), also when it
//! is queued for an agent that is away; a request's `params._meta.traceparent` is stamped on the
//! request's events; an invalid one is not propagated; a spawned child finds it in its
//! environment (`TRACEPARENT`, `TRACESTATE`).

mod common;

use common::*;
use serde_json::{json, Value};

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const STATE: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";

fn trace_meta() -> Value {
    json!({"traceparent": PARENT, "tracestate": STATE})
}

#[tokio::test]
async fn a_traced_message_stamps_its_events_and_keeps_its_meta() {
    let (_server, url) = default_server().await;
    let mut watcher = WsClient::system(&url).await;
    let sub = watcher
        .subscribe(json!({"eventTypes": ["message_sent", "message_delivered", "message.queued"]}))
        .await;
    let mut bob = WsClient::agent(&url, "bob", json!({})).await;
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    let meta = json!({"traceparent": PARENT, "tracestate": STATE, "priority": "high"});
    alice
        .ok(
            "map/send",
            json!({"to": {"agent": "bob"}, "payload": {"q": 1}, "meta": meta}),
        )
        .await;
    let message = bob.next_message().await;
    assert_eq!(message["meta"], meta, "the message keeps its meta");
    for kind in ["message_sent", "message_delivered"] {
        let ev = watcher.event_of_type(&sub, kind).await;
        assert_eq!(ev["event"]["_meta"], trace_meta(), "{kind}: {ev}");
    }

    // An untraced message's events have no _meta.
    alice
        .ok(
            "map/send",
            json!({"to": {"agent": "bob"}, "payload": {"q": 2}}),
        )
        .await;
    let ev = watcher.event_of_type(&sub, "message_sent").await;
    assert!(ev["event"].get("_meta").is_none(), "{ev}");

    // Queued for an agent that is away: message.queued carries it too.
    bob.drop_abruptly();
    let mut queued = None;
    for _ in 0..100 {
        let r = alice
            .ok(
                "map/send",
                json!({"to": {"agent": "bob"}, "payload": {"q": 3},
                       "meta": {"traceparent": PARENT, "delivery": "at-least-once"}}),
            )
            .await;
        if r["queued"].as_array().is_some_and(|q| !q.is_empty()) {
            queued = Some(r);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(queued.is_some(), "the message is queued for bob");
    let ev = watcher.event_of_type(&sub, "message.queued").await;
    assert_eq!(ev["event"]["_meta"], json!({"traceparent": PARENT}), "{ev}");
}

#[tokio::test]
async fn a_request_trace_context_stamps_its_events_and_an_invalid_one_is_dropped() {
    let (_server, url) = default_server().await;
    let mut watcher = WsClient::system(&url).await;
    let sub = watcher
        .subscribe(json!({"eventTypes": ["agent_state_changed"]}))
        .await;
    let mut a = WsClient::agent(&url, "a", json!({})).await;
    a.ok(
        "map/agents/update",
        json!({"agentId": "a", "state": "busy", "_meta": trace_meta()}),
    )
    .await;
    let ev = watcher.event_of_type(&sub, "agent_state_changed").await;
    assert_eq!(ev["event"]["_meta"], trace_meta(), "{ev}");

    a.ok(
        "map/agents/update",
        json!({"agentId": "a", "state": "idle",
               "_meta": {"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}}),
    )
    .await;
    let ev = watcher.event_of_type(&sub, "agent_state_changed").await;
    assert!(
        ev["event"].get("_meta").is_none(),
        "an all-zero trace id is invalid: {ev}"
    );
}

/// A stdio child that registers with its trace environment as metadata.
const CHILD: &str = r#"
import json, os, sys
def send(i, m, p):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": m, "params": p}) + "\n")
    sys.stdout.flush()
send(1, "map/connect", {"protocolVersion": 1, "participantType": "agent"})
send(2, "map/agents/register", {"agentId": os.environ["MAP_AGENT_ID"], "metadata": {
    "traceparent": os.environ.get("TRACEPARENT"), "tracestate": os.environ.get("TRACESTATE")}})
for line in sys.stdin:
    pass
"#;

#[tokio::test]
async fn a_spawned_child_finds_the_trace_context_in_its_environment() {
    let (_server, url) = default_server().await;
    let mut lead = WsClient::agent(&url, "lead", json!({})).await;
    let spawned = lead
        .ok(
            "map/agents/spawn",
            json!({"agentId": "traced-child",
                   "command": {"program": "python3", "args": ["-c", CHILD]},
                   "_meta": trace_meta()}),
        )
        .await;
    assert_eq!(spawned["agent"]["id"], json!("traced-child"), "{spawned}");
    let got = lead
        .ok("map/agents/get", json!({"agentId": "traced-child"}))
        .await;
    assert_eq!(got["agent"]["metadata"], trace_meta(), "{got}");

    // Without a trace context, the child's environment has none.
    let plain = lead
        .ok(
            "map/agents/spawn",
            json!({"agentId": "plain-child",
                   "command": {"program": "python3", "args": ["-c", CHILD]}}),
        )
        .await;
    assert_eq!(plain["agent"]["id"], json!("plain-child"));
    let got = lead
        .ok("map/agents/get", json!({"agentId": "plain-child"}))
        .await;
    assert_eq!(
        got["agent"]["metadata"],
        json!({"traceparent": null, "tracestate": null}),
        "{got}"
    );
    for id in ["traced-child", "plain-child"] {
        lead.ok("map/agents/stop", json!({"agentId": id})).await;
    }
}
