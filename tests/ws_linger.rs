//! `?linger=MS` on a WebSocket URL (the dashboard's `/map?linger=100`): the connection's writer
//! may hold events and messages that long to write them together, never an answer to a request;
//! nothing is lost or reordered; a bad value is refused with why (docs/dashboard.md, "Under
//! load"; `transport::ws::linger`).

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

#[test]
fn the_query_is_read_and_bounded() {
    use map_router::transport::ws::linger;
    assert_eq!(linger(None), Ok(None));
    assert_eq!(linger(Some("token=x")), Ok(None));
    assert_eq!(
        linger(Some("linger=100")),
        Ok(Some(Duration::from_millis(100)))
    );
    assert_eq!(
        linger(Some("a=1&linger=250")),
        Ok(Some(Duration::from_millis(250)))
    );
    for bad in [
        "linger=0",
        "linger=251",
        "linger=-5",
        "linger=abc",
        "linger=",
        "linger=1e3",
    ] {
        let why = linger(Some(bad)).unwrap_err();
        assert!(why.contains("from 1 to 250"), "{bad}: {why}");
    }
    // A huge value is not echoed whole.
    let why = linger(Some(&format!("linger={}", "9".repeat(10_000)))).unwrap_err();
    assert!(why.len() < 200, "{why}");
}

#[tokio::test]
async fn a_bad_linger_is_refused_before_the_upgrade() {
    let (_server, url) = start_server(|_| {}).await;
    let refused = with_timeout(tokio_tungstenite::connect_async(format!(
        "{url}map?linger=9999"
    )))
    .await
    .expect_err("a bad linger is refused");
    match refused {
        tokio_tungstenite::tungstenite::Error::Http(r) => {
            assert_eq!(r.status(), 400);
            let body =
                String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into_owned();
            assert!(body.contains("linger must be"), "{body}");
        }
        other => panic!("not an HTTP refusal: {other}"),
    }
    let (ok, _) = with_timeout(tokio_tungstenite::connect_async(format!(
        "{url}map?linger=50"
    )))
    .await
    .expect("a good linger upgrades");
    drop(ok);
}

#[tokio::test]
async fn events_held_for_company_arrive_all_in_order_and_answers_are_not_held() {
    let (_server, url) = start_server(|_| {}).await;
    let mut watcher = WsClient::connect(&format!("{}map?linger=250", url)).await;
    watcher
        .ok(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": "client"}),
        )
        .await;
    watcher
        .subscribe(json!({"eventTypes": ["message_sent"]}))
        .await;
    let mut sender = WsClient::client(&url).await;
    let mut agent = WsClient::agent(&url, "held-1", json!({})).await;
    for n in 0..20 {
        sender
            .ok(
                "map/send",
                json!({"to": {"agent": "held-1"}, "payload": {"n": n}}),
            )
            .await;
    }
    // Every event, once, in order.
    let mut seen = Vec::new();
    while seen.len() < 20 {
        let e = watcher
            .next_notification_where(|n| n["params"]["event"]["type"] == "message_sent")
            .await;
        seen.push(
            e["params"]["event"]["data"]["payload"]["n"]
                .as_u64()
                .unwrap(),
        );
    }
    assert_eq!(seen, (0..20).collect::<Vec<_>>());
    // An answer is written at once, not after the linger: well under 250 ms, ten times in a
    // row (each time the writer holds nothing else).
    for _ in 0..10 {
        let started = std::time::Instant::now();
        watcher.ok("map/agents/list", json!({})).await;
        assert!(
            started.elapsed() < Duration::from_millis(200),
            "an answer waited {:?}",
            started.elapsed()
        );
    }
    // The agent got its messages (the sender's connection has no linger).
    for n in 0..20 {
        let m = agent
            .next_notification_where(|f| f["method"] == "map/message")
            .await;
        assert_eq!(m["params"]["message"]["payload"]["n"], n);
    }
}
