//! Causality (docs/streams.md): every event caused by another carries `causedBy`, causes are
//! delivered before their effects on every subscription, and messages for an agent that is away
//! wait for it when the sender asked for more than fire-and-forget.

mod common;

use common::*;
use serde_json::{json, Value};

fn caused_by(ev: &Value) -> Vec<String> {
    ev["event"]["causedBy"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_reply_follows_from_the_delivery_of_its_request() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::system(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["message_sent", "message_delivered"]}))
        .await;
    let mut asker = WsClient::agent(&url, "c-asker", json!({})).await;
    let mut answerer = WsClient::agent(&url, "c-answerer", json!({})).await;
    asker
        .ok(
            "map/send",
            json!({"to": {"agent": "c-answerer"}, "payload": {"q": 1}, "meta": {"expectsResponse": true, "correlationId": "corr-1"}}),
        )
        .await;
    let request = answerer.next_message().await;
    answerer
        .ok(
            "map/send",
            json!({"to": {"agent": request["from"]}, "payload": {"a": 1}, "meta": {"isResult": true, "correlationId": "corr-1"}}),
        )
        .await;
    let sent = obs.next_event(&sub).await;
    let delivered = obs.next_event(&sub).await;
    assert_eq!(
        caused_by(&delivered),
        vec![sent["eventId"].as_str().unwrap()]
    );
    let reply_sent = obs.next_event(&sub).await;
    assert_eq!(reply_sent["event"]["data"]["from"], json!("c-answerer"));
    assert_eq!(
        caused_by(&reply_sent),
        vec![delivered["eventId"].as_str().unwrap()],
        "the reply follows from the request's delivery"
    );
    let reply_delivered = obs.next_event(&sub).await;
    assert_eq!(
        caused_by(&reply_delivered),
        vec![reply_sent["eventId"].as_str().unwrap()]
    );
    // The SDK's reply() without a correlation id on the request uses the request's message id.
    asker
        .ok(
            "map/send",
            json!({"to": {"agent": "c-answerer"}, "payload": {"q": 2}}),
        )
        .await;
    let plain = answerer.next_message().await;
    let sent2 = obs.next_event(&sub).await;
    let delivered2 = obs.next_event(&sub).await;
    assert_eq!(
        caused_by(&delivered2),
        vec![sent2["eventId"].as_str().unwrap()]
    );
    answerer
        .ok(
            "map/send",
            json!({"to": {"agent": "c-asker"}, "payload": {"a": 2}, "meta": {"isResult": true, "correlationId": plain["id"]}}),
        )
        .await;
    let reply2 = obs.next_event(&sub).await;
    assert_eq!(
        caused_by(&reply2),
        vec![delivered2["eventId"].as_str().unwrap()]
    );
}

#[tokio::test]
async fn a_call_can_declare_what_it_follows_from() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::system(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["agent_state_changed", "message_delivered"]}))
        .await;
    let mut boss = WsClient::agent(&url, "d-boss", json!({})).await;
    let mut worker = WsClient::agent(&url, "d-worker", json!({})).await;
    boss.send(json!({"agent": "d-worker"}), json!({"task": "go"}))
        .await;
    let delivered = obs.next_event(&sub).await;
    let delivered_id = delivered["eventId"].as_str().unwrap().to_owned();
    // The worker got the task and goes busy "because of" it.
    worker
        .ok(
            "map/agents/update",
            json!({"agentId": "d-worker", "state": "busy", "_meta": {"causedBy": [delivered_id, "not-an-id", "7ZZZZZZZZZZZZZZZZZZZZZZZZZ"]}}),
        )
        .await;
    let busy = obs.next_event(&sub).await;
    assert_eq!(busy["event"]["data"]["newState"], json!("busy"));
    assert_eq!(
        caused_by(&busy),
        vec![delivered_id.clone()],
        "malformed and never-issued ids are dropped"
    );
    assert_eq!(
        busy["causedBy"],
        json!([delivered_id]),
        "delivered on this subscription"
    );
}

#[tokio::test]
async fn lifecycle_chains_name_their_causes() {
    let (_server, url) = start_server(|c| c.router.resume_window_ms = 200).await;
    let mut obs = WsClient::system(&url).await;
    let sub = obs
        .subscribe(
            json!({"eventTypes": ["agent_state_changed", "agent_orphaned", "agent_unregistered"]}),
        )
        .await;
    let mut a = WsClient::agent(&url, "l-a", json!({})).await;
    obs.ok("map/agents/stop", json!({"agentId": "l-a"})).await;
    let stopping = obs.next_event(&sub).await;
    assert_eq!(stopping["event"]["data"]["newState"], json!("stopping"));
    // The agent's own "stopped" follows from the stop request.
    a.ok(
        "map/agents/update",
        json!({"agentId": "l-a", "state": "stopped"}),
    )
    .await;
    let stopped = obs.next_event(&sub).await;
    assert_eq!(
        caused_by(&stopped),
        vec![stopping["eventId"].as_str().unwrap()]
    );
    // An orphan that is not reclaimed is unregistered because it was orphaned.
    let b = WsClient::agent(&url, "l-b", json!({})).await;
    b.drop_abruptly();
    let orphaned = obs.event_of_type(&sub, "agent_orphaned").await;
    let gone = obs.event_of_type(&sub, "agent_unregistered").await;
    assert_eq!(gone["event"]["data"]["reason"], json!("owner_disconnected"));
    assert_eq!(
        caused_by(&gone),
        vec![orphaned["eventId"].as_str().unwrap()]
    );
    drop(a);
}

#[tokio::test]
async fn causes_always_arrive_before_their_effects_under_concurrent_senders() {
    let (server, url) = default_server().await;
    let mut obs = WsClient::system(&url).await;
    let sub = obs.subscribe(Value::Null).await;
    let mut target = WsClient::agent(&url, "cc-target", json!({})).await;
    let mut tasks = Vec::new();
    for i in 0..4 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = WsClient::agent(&url, &format!("cc-{i}"), json!({})).await;
            for n in 0..25 {
                s.send(json!({"agent": "cc-target"}), json!({"n": n})).await;
            }
        }));
    }
    for t in tasks {
        with_timeout(t).await.unwrap();
    }
    let mut seen = std::collections::HashSet::new();
    let mut delivered = 0;
    while delivered < 100 {
        let ev = obs.next_event(&sub).await;
        for cause in caused_by(&ev) {
            assert!(
                seen.contains(&cause),
                "cause {cause} arrived before its effect"
            );
        }
        if ev["event"]["type"] == json!("message_delivered") {
            delivered += 1;
        }
        seen.insert(ev["eventId"].as_str().unwrap().to_owned());
    }
    for _ in 0..100 {
        target.next_message().await;
    }
    drop(server);
}

#[tokio::test]
async fn guaranteed_messages_wait_for_an_agent_that_is_away() {
    let (_server, url) = start_server(|c| c.router.resume_window_ms = 2_000).await;
    let mut obs = WsClient::system(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["message.*", "message.queued", "agent_state_changed"]}))
        .await;
    let mut sender = WsClient::agent(&url, "g-sender", json!({})).await;
    let away = WsClient::agent(&url, "g-away", json!({})).await;
    away.drop_abruptly();
    // Wait until the router has seen the connection go.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let a = sender
            .ok("map/agents/get", json!({"agentId": "g-away"}))
            .await;
        if a["agent"]["state"] == json!("orphaned") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never orphaned");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let kept = sender
        .ok(
            "map/send",
            json!({"to": {"agent": "g-away"}, "payload": {"keep": 1}, "meta": {"delivery": "guaranteed"}}),
        )
        .await;
    assert_eq!(kept["delivered"], json!([]));
    assert_eq!(kept["queued"], json!(["g-away"]));
    let dropped = sender
        .ok(
            "map/send",
            json!({"to": {"agent": "g-away"}, "payload": {"keep": 0}}),
        )
        .await;
    assert!(
        dropped.get("queued").is_none(),
        "fire-and-forget is not kept"
    );
    let queued_ev = obs.event_of_type(&sub, "message.queued").await;
    assert_eq!(queued_ev["event"]["data"]["recipient"], json!("g-away"));
    let failed = obs.event_of_type(&sub, "message_failed").await;
    assert_eq!(
        failed["event"]["data"]["reason"],
        json!("recipient_offline")
    );

    // It comes back (as the SDK's reconnect does: same agent id) and gets the kept message.
    let mut back = WsClient::connect_as(&url, "agent", json!({"participantId": "g-away"})).await;
    let reg = back
        .ok("map/agents/register", json!({"agentId": "g-away"}))
        .await;
    assert_eq!(reg["resumed"], json!(true));
    let msg = back.next_message().await;
    assert_eq!(msg["payload"], json!({"keep": 1}));
    back.assert_no_message().await;
    let reclaimed = obs.event_of_type(&sub, "agent_state_changed").await;
    let delivered = obs.event_of_type(&sub, "message_delivered").await;
    let causes = caused_by(&delivered);
    assert_eq!(causes.len(), 2, "{delivered}");
    assert_eq!(causes[1], reclaimed["eventId"].as_str().unwrap());
}

#[tokio::test]
async fn kept_messages_fail_when_the_agent_never_comes_back() {
    let (_server, url) = start_server(|c| c.router.resume_window_ms = 300).await;
    let mut obs = WsClient::system(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["message_failed", "message.queued"]}))
        .await;
    let mut sender = WsClient::agent(&url, "n-sender", json!({})).await;
    let away = WsClient::agent(&url, "n-away", json!({})).await;
    away.drop_abruptly();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let a = sender
            .ok("map/agents/get", json!({"agentId": "n-away"}))
            .await;
        if a["agent"]["state"] == json!("orphaned") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never orphaned");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    sender
        .ok(
            "map/send",
            json!({"to": {"agent": "n-away"}, "payload": 1, "meta": {"delivery": "acknowledged"}}),
        )
        .await;
    obs.event_of_type(&sub, "message.queued").await;
    let failed = obs.event_of_type(&sub, "message_failed").await;
    assert_eq!(failed["event"]["data"]["reason"], json!("recipient_gone"));
}
