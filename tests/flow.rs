//! Acknowledgements and credit-based flow control (`map/subscribe.ack`, `options.ackWindow`),
//! and that credit never loses or reorders events.

mod common;

use common::*;
use serde_json::json;

async fn send_n(sender: &mut WsClient, from: u64, n: u64) {
    for i in from..from + n {
        sender.send(json!({"system": true}), json!({"n": i})).await;
    }
}

fn ack(sub: &str, up_to: u64) -> String {
    json!({"jsonrpc": "2.0", "method": "map/subscribe.ack", "params": {"subscriptionId": sub, "upToSequence": up_to}}).to_string()
}

#[tokio::test]
async fn a_credit_window_holds_events_until_they_are_acknowledged() {
    let (_server, url) = default_server().await;
    let mut sender = WsClient::agent(&url, "cw-src", json!({})).await;
    let mut sub_client = WsClient::client(&url).await;
    assert_eq!(
        sub_client.session["capabilities"]["streaming"]["supportsAck"],
        json!(true)
    );
    let sub = sub_client
        .subscribe_with(
            json!({"filter": {"eventTypes": ["message_sent"]}, "options": {"ackWindow": 5}}),
        )
        .await;
    send_n(&mut sender, 0, 20).await;
    let mut seen = Vec::new();
    for _ in 0..5 {
        let ev = sub_client.next_event(&sub).await;
        seen.push(ev["event"]["data"]["payload"]["n"].as_u64().unwrap());
    }
    sub_client.assert_no_event(&sub).await;
    // Acknowledging 3 opens 3 more slots.
    sub_client.send_raw(&ack(&sub, 3)).await;
    for _ in 0..3 {
        let ev = sub_client.next_event(&sub).await;
        seen.push(ev["event"]["data"]["payload"]["n"].as_u64().unwrap());
    }
    sub_client.assert_no_event(&sub).await;
    // Acknowledging beyond what was sent counts only what was sent.
    sub_client.send_raw(&ack(&sub, 1_000)).await;
    for _ in 0..5 {
        let ev = sub_client.next_event(&sub).await;
        seen.push(ev["event"]["data"]["payload"]["n"].as_u64().unwrap());
    }
    sub_client.assert_no_event(&sub).await;
    sub_client.send_raw(&ack(&sub, 13)).await;
    for _ in 0..5 {
        let ev = sub_client.next_event(&sub).await;
        seen.push(ev["event"]["data"]["payload"]["n"].as_u64().unwrap());
    }
    sub_client.send_raw(&ack(&sub, 18)).await;
    for _ in 0..2 {
        let ev = sub_client.next_event(&sub).await;
        seen.push(ev["event"]["data"]["payload"]["n"].as_u64().unwrap());
    }
    assert_eq!(seen, (0..20).collect::<Vec<_>>(), "every event, in order");
    // Acks are notifications: never answered.
    sub_client.assert_silent().await;
}

#[tokio::test]
async fn the_first_ack_turns_on_the_default_window_and_foreign_acks_are_ignored() {
    let (_server, url) = default_server().await;
    let mut sender = WsClient::agent(&url, "fa-src", json!({})).await;
    let mut owner = WsClient::client(&url).await;
    let mut other = WsClient::client(&url).await;
    let sub = owner
        .subscribe(json!({"eventTypes": ["message_sent"]}))
        .await;
    // Another connection acking this subscription changes nothing (and gets no answer).
    other.send_raw(&ack(&sub, 1)).await;
    other.assert_silent().await;
    // A malformed ack is ignored too.
    owner
        .send_raw(r#"{"jsonrpc":"2.0","method":"map/subscribe.ack","params":{"upToSequence":"x"}}"#)
        .await;
    send_n(&mut sender, 0, 3).await;
    for i in 0..3 {
        assert_eq!(
            owner.next_event(&sub).await["event"]["data"]["payload"]["n"],
            json!(i)
        );
    }
    // After an ack the subscription keeps flowing (the default window is large).
    owner.send_raw(&ack(&sub, 3)).await;
    send_n(&mut sender, 3, 50).await;
    for i in 3..53 {
        assert_eq!(
            owner.next_event(&sub).await["event"]["data"]["payload"]["n"],
            json!(i)
        );
    }
}
