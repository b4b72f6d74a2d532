//! Slow consumers (docs/compatibility.md §6–7): a subscriber that stops reading never slows the
//! router or other subscribers; when it reads again it gets every retained event in order (or
//! one `subscription.overflow` notice, then live events or the end, when it fell behind
//! retention); a backlogged message
//! recipient gets `message_failed`, never a silent drop.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// Large enough that a few hundred events overflow every socket buffer on the way.
const PAYLOAD_BYTES: usize = 32 * 1024;
const MESSAGES: u64 = 300;
const LONG: Duration = Duration::from_secs(60);

fn big_payload(n: u64) -> Value {
    json!({"n": n, "pad": "p".repeat(PAYLOAD_BYTES)})
}

/// Sends `MESSAGES` messages to `{system: true}` (so only `message_sent` events exist) in
/// lockstep with the fast subscriber, which must see each one immediately and in order.
async fn send_in_lockstep(sender: &mut WsClient, fast: &mut WsClient, fast_sub: &str) {
    for n in 0..MESSAGES {
        let r = sender.send(json!({"system": true}), big_payload(n)).await;
        assert_eq!(r["delivered"], json!([]));
        let ev = fast.next_event(fast_sub).await;
        assert_eq!(ev["sequenceNumber"], json!(n + 1));
        assert_eq!(ev["event"]["type"], json!("message_sent"));
        assert_eq!(ev["event"]["data"]["payload"]["n"], json!(n));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_subscriber_catches_up_from_the_log_without_gaps() {
    let (_server, url) = start_server(|c| c.router.outbox_frames = 8).await;
    let mut sender = WsClient::agent(&url, "bp-src", json!({})).await;
    let mut fast = WsClient::client(&url).await;
    let mut slow = WsClient::client(&url).await;
    let filter = json!({"eventTypes": ["message_sent"]});
    let slow_sub = slow.subscribe(filter.clone()).await;
    let fast_sub = fast.subscribe(filter).await;

    // The slow subscriber reads nothing while everything is sent; nobody waits for it.
    within(LONG, send_in_lockstep(&mut sender, &mut fast, &fast_sub)).await;
    // The router still answers promptly.
    sender.ok("map/agents/list", Value::Null).await;

    // Now it reads: every event, in order, no gap, no duplicate.
    let mut last_id = String::new();
    within(LONG, async {
        for n in 0..MESSAGES {
            let ev = slow.next_event(&slow_sub).await;
            assert_eq!(ev["sequenceNumber"], json!(n + 1), "no gap");
            assert_eq!(
                ev["event"]["type"],
                json!("message_sent"),
                "no overflow notice"
            );
            assert_eq!(ev["event"]["data"]["payload"]["n"], json!(n));
            let id = ev["eventId"].as_str().unwrap().to_owned();
            assert!(id > last_id);
            last_id = id;
        }
    })
    .await;
    slow.assert_no_event(&slow_sub).await;
    fast.assert_no_event(&fast_sub).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_behind_retention_gets_one_overflow_notice_then_continues_live() {
    let (_server, url) = start_server(|c| {
        c.router.outbox_frames = 8;
        c.events.retention_events = 20;
    })
    .await;
    let mut sender = WsClient::agent(&url, "ov-src", json!({})).await;
    let mut fast = WsClient::client(&url).await;
    let mut slow = WsClient::client(&url).await;
    let filter = json!({"eventTypes": ["message_sent"]});
    let slow_sub = slow.subscribe(filter.clone()).await;
    let fast_sub = fast.subscribe(filter).await;

    within(LONG, send_in_lockstep(&mut sender, &mut fast, &fast_sub)).await;

    // What the slow one gets: what fitted its outbox, then the notice, and nothing older.
    let mut before: Vec<u64> = Vec::new();
    let mut overflow: Option<Value> = None;
    let mut expected_seq = 1u64;
    within(LONG, async {
        loop {
            let ev = slow.next_event(&slow_sub).await;
            assert_eq!(
                ev["sequenceNumber"],
                json!(expected_seq),
                "no gap in sequence numbers"
            );
            expected_seq += 1;
            match ev["event"]["type"].as_str() {
                Some("subscription.overflow") => {
                    assert!(ev.get("eventId").is_none(), "no eventId: {ev}");
                    overflow = Some(ev);
                    break;
                }
                Some("message_sent") => {
                    before.push(ev["event"]["data"]["payload"]["n"].as_u64().unwrap());
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await;
    slow.assert_no_event(&slow_sub).await;
    let overflow = overflow.expect("the slow subscriber fell behind retention");
    let data = &overflow["event"]["data"];
    assert_eq!(data["subscriptionId"], json!(slow_sub));
    assert_eq!(data["policy"], json!("skip"));
    assert!(data["recommendation"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
    let consecutive = |v: &[u64]| v.windows(2).all(|w| w[1] == w[0] + 1);
    assert!(consecutive(&before), "{before:?}");
    assert_eq!(before.first().copied().unwrap_or(0), 0);
    let skipped = MESSAGES - before.len() as u64;
    assert!(
        data["eventsDropped"].as_u64().unwrap() >= skipped,
        "the notice counts at least what was skipped: {data}"
    );

    // Then live: the next message arrives, in sequence.
    let r = sender
        .send(json!({"system": true}), json!({"n": MESSAGES}))
        .await;
    assert_eq!(r["delivered"], json!([]));
    let live = slow.next_event(&slow_sub).await;
    assert_eq!(live["sequenceNumber"], json!(expected_seq));
    assert_eq!(live["event"]["data"]["payload"]["n"], json!(MESSAGES));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_with_the_close_policy_is_ended_after_the_notice() {
    let (_server, url) = start_server(|c| {
        c.router.outbox_frames = 8;
        c.events.retention_events = 20;
    })
    .await;
    let mut sender = WsClient::agent(&url, "oc-src", json!({})).await;
    let mut fast = WsClient::client(&url).await;
    let mut slow = WsClient::client(&url).await;
    let filter = json!({"eventTypes": ["message_sent"]});
    let slow_sub = slow
        .subscribe_with(json!({"filter": filter, "options": {"onOverflow": "close"}}))
        .await;
    let fast_sub = fast.subscribe(filter).await;
    within(LONG, send_in_lockstep(&mut sender, &mut fast, &fast_sub)).await;
    let notice = within(LONG, slow.event_of_type(&slow_sub, "subscription.overflow")).await;
    assert_eq!(notice["event"]["data"]["policy"], json!("close"));
    // Closed: later events do not arrive, and unsubscribing finds nothing to close.
    sender.send(json!({"system": true}), json!({"n": -1})).await;
    slow.assert_no_event(&slow_sub).await;
    let u = slow
        .ok("map/unsubscribe", json!({"subscriptionId": slow_sub}))
        .await;
    assert_eq!(u["unsubscribed"], json!(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_to_a_backlogged_connection_fail_visibly() {
    let (_server, url) = start_server(|c| {
        c.router.outbox_frames = 8;
        c.router.pending_messages = 4;
    })
    .await;
    let mut dst = WsClient::agent(&url, "bl-dst", json!({})).await;
    let mut src = WsClient::agent(&url, "bl-src", json!({})).await;
    let mut obs = WsClient::client(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["message_failed"]}))
        .await;

    // dst reads nothing. Send until the router refuses, then a few more.
    let mut delivered_ids = Vec::new();
    let mut failed_ids = Vec::new();
    within(LONG, async {
        for n in 0..2000u64 {
            let r = src.send(json!({"agent": "bl-dst"}), big_payload(n)).await;
            let id = r["messageId"].as_str().unwrap().to_owned();
            if r["delivered"] == json!(["bl-dst"]) {
                assert!(
                    failed_ids.is_empty(),
                    "a later message overtook a failed one"
                );
                delivered_ids.push(id);
            } else {
                assert_eq!(r["delivered"], json!([]), "{r}");
                failed_ids.push(id);
                if failed_ids.len() == 3 {
                    break;
                }
            }
        }
    })
    .await;
    assert_eq!(failed_ids.len(), 3, "the recipient became backlogged");

    for id in &failed_ids {
        let ev = obs.next_event(&sub).await;
        assert_eq!(
            ev["event"]["data"],
            json!({
                "messageId": id,
                "from": "bl-src",
                "to": {"agent": "bl-dst"},
                "recipient": "bl-dst",
                "reason": "recipient_backlogged",
                "code": 2003
            })
        );
    }
    obs.assert_no_event(&sub).await;

    // When dst reads, it gets exactly the delivered messages, in order.
    within(LONG, async {
        for id in &delivered_ids {
            let m = dst.next_message().await;
            assert_eq!(m["id"], json!(id));
        }
    })
    .await;
    dst.assert_no_message().await;
    // And it is reachable again.
    let r = src.send(json!({"agent": "bl-dst"}), json!("again")).await;
    assert_eq!(r["delivered"], json!(["bl-dst"]));
    assert_eq!(dst.next_message().await["payload"], json!("again"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_vanishes_costs_nothing_after_its_session_ends() {
    let (server, url) = start_server(|c| c.router.outbox_frames = 8).await;
    let base = with_timeout(server.router().stats()).await.unwrap();
    let mut sender = WsClient::agent(&url, "bp-gone", json!({})).await;
    let mut fast = WsClient::client(&url).await;
    let fast_sub = fast
        .subscribe(json!({"eventTypes": ["message_sent"]}))
        .await;
    let mut ghost = WsClient::client(&url).await;
    for _ in 0..3 {
        ghost
            .subscribe(json!({"eventTypes": ["message_sent"]}))
            .await;
    }
    // Paused far behind, then gone without unsubscribing.
    within(LONG, send_in_lockstep(&mut sender, &mut fast, &fast_sub)).await;
    let during = with_timeout(server.router().stats()).await.unwrap();
    assert_eq!(during.subscriptions, base.subscriptions + 4);
    ghost.drop_abruptly();
    let after = within(LONG, async {
        loop {
            let s = server.router().stats().await.unwrap();
            if s.connections == during.connections - 1 {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(
        after.subscriptions,
        base.subscriptions + 1,
        "its three subscriptions went with its session"
    );
    // The others are unaffected.
    sender.send(json!({"system": true}), json!("after")).await;
    assert_eq!(
        fast.next_event(&fast_sub).await["sequenceNumber"],
        json!(MESSAGES + 1)
    );
}
