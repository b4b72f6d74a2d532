//! A generic JSON-RPC 2.0 WebSocket client (jsonrpsee) can use the router: connect, call,
//! receive typed errors, subscribe and get `map/event` notifications.

mod common;

use common::*;
use jsonrpsee_core::client::{ClientT, Error, SubscriptionClientT};
use jsonrpsee_core::params::ObjectParams;
use jsonrpsee_ws_client::WsClientBuilder;
use serde_json::{json, Value};

fn params(pairs: &[(&str, Value)]) -> ObjectParams {
    let mut p = ObjectParams::new();
    for (k, v) in pairs {
        p.insert(k, v).expect("serializable");
    }
    p
}

#[tokio::test]
async fn jsonrpsee_connects_calls_and_receives_events() {
    let (_server, url) = default_server().await;
    let client = with_timeout(WsClientBuilder::default().build(&url))
        .await
        .expect("jsonrpsee connects");

    let connected: Value = with_timeout(client.request(
        "map/connect",
        params(&[
            ("protocolVersion", json!(1)),
            ("participantType", json!("client")),
            ("name", json!("jsonrpsee")),
        ]),
    ))
    .await
    .expect("map/connect");
    assert_eq!(connected["protocolVersion"], json!(1));
    assert_eq!(connected["participantType"], json!("client"));

    // Typed errors come back as JSON-RPC errors.
    let err = with_timeout(client.request::<Value, _>("map/nope", ObjectParams::new()))
        .await
        .expect_err("unknown method");
    match err {
        Error::Call(e) => {
            assert_eq!(e.code(), -32601);
            assert_eq!(e.message(), "Method not found: map/nope");
        }
        other => panic!("expected a call error, got {other:?}"),
    }
    let err = with_timeout(
        client.request::<Value, _>("map/agents/get", params(&[("agentId", json!("ghost"))])),
    )
    .await
    .expect_err("unknown agent");
    match err {
        Error::Call(e) => {
            assert_eq!(e.code(), 2001);
            assert_eq!(e.message(), "Agent not found: ghost");
            let data: Value = serde_json::from_str(e.data().expect("data").get()).unwrap();
            assert_eq!(data, json!({"category": "routing"}));
        }
        other => panic!("expected a call error, got {other:?}"),
    }

    // Notifications of method `map/event`, then the subscription itself.
    let mut events = with_timeout(client.subscribe_to_method::<Value>("map/event"))
        .await
        .expect("notification handler");
    let sub: Value = with_timeout(client.request(
        "map/subscribe",
        params(&[(
            "filter",
            json!({"eventTypes": ["participant_connected", "agent_registered"]}),
        )]),
    ))
    .await
    .expect("map/subscribe");
    let sub_id = sub["subscriptionId"].clone();
    assert!(sub_id.is_string());

    let agent = WsClient::agent(&url, "generic-1", json!({})).await;
    let first = with_timeout(events.next())
        .await
        .expect("stream open")
        .expect("valid notification");
    assert_eq!(first["subscriptionId"], sub_id);
    assert_eq!(first["sequenceNumber"], json!(1));
    assert_eq!(first["event"]["type"], json!("participant_connected"));
    assert_eq!(first["event"]["data"]["participantId"], json!(agent.pid()));
    let second = with_timeout(events.next())
        .await
        .expect("stream open")
        .expect("valid notification");
    assert_eq!(second["sequenceNumber"], json!(2));
    assert_eq!(second["event"]["type"], json!("agent_registered"));
    assert_eq!(second["event"]["data"]["agentId"], json!("generic-1"));

    // Absent params are accepted (jsonrpsee sends none for an empty ObjectParams).
    let list: Value = with_timeout(client.request("map/agents/list", ObjectParams::new()))
        .await
        .expect("map/agents/list");
    assert_eq!(ids(&list["agents"]), vec!["generic-1"]);
}
