//! A follower router (`RouterConfig::follower`, what a standby serves with in cluster mode)
//! fed rows directly, without NATS: what its subscribers are shown when the rows it follows
//! have a hole (the stream's retention took rows before they were followed), and that it logs
//! nothing of its own. The cluster end to end is in tests/cluster.rs.

mod common;

use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use map_router::protocol::event::EventType;
use map_router::router::dispatch::Dispatcher;
use map_router::router::events::log::{
    Audience, EventDraft, EventLog, FilterKeys, Retention, StoredRow,
};
use map_router::router::{Router, RouterConfig, RouterHandle, RouterParts};
use map_router::transport::connection::ConnectionOptions;
use map_router::transport::in_process::{self, InProcessLink};
use map_router::transport::TransportContext;
use serde_json::{json, Value};

/// `n` rows as a writer's log makes them (seq from 0).
fn written(n: u32) -> Vec<StoredRow> {
    let mut log = EventLog::new(Retention {
        max_events: 1000,
        max_bytes: 1 << 20,
    });
    (0..n)
        .map(|i| {
            log.append(
                EventDraft {
                    kind: EventType::ScopeCreated,
                    source: None,
                    data: format!("{{\"scopeId\":\"s{i}\"}}"),
                    caused_by: vec![],
                    keys: FilterKeys::default(),
                    audience: Audience::Everyone,
                },
                None,
            )
            .to_row()
            .expect("a logged event has a row")
        })
        .collect()
}

async fn next(link: &mut InProcessLink) -> Value {
    let text = common::with_timeout(link.rx.next()).await.expect("open");
    serde_json::from_str(&text).unwrap()
}

async fn call(link: &mut InProcessLink, id: u64, method: &str, params: Value) -> Value {
    let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    link.tx.send(frame.to_string()).await.unwrap();
    loop {
        let v = next(link).await;
        if v["id"] == json!(id) {
            return v;
        }
    }
}

fn follower() -> (RouterHandle, TransportContext) {
    let (router, _task) = Router::start(
        RouterConfig {
            follower: true,
            retention: Retention {
                max_events: 1000,
                max_bytes: 1 << 20,
            },
            ..RouterConfig::default()
        },
        RouterParts {
            process_control: None,
            store: None,
            metrics: None,
            traces: None,
            carried_fold: None,
        },
    );
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    std::mem::forget(stop); // the context lives as long as the test
    let ctx = TransportContext {
        router: router.clone(),
        dispatcher: Arc::new(Dispatcher::new()),
        shutdown,
        connections: tokio_util::task::TaskTracker::new(),
    };
    (router, ctx)
}

#[tokio::test]
async fn a_hole_in_what_is_followed_moves_live_subscribers_on_instead_of_stalling_them() {
    let (router, ctx) = follower();
    let mut viewer = in_process::connect(&ctx, ConnectionOptions::default());
    let r = call(
        &mut viewer,
        1,
        "map/connect",
        json!({"protocolVersion": 1, "participantType": "system"}),
    )
    .await;
    assert!(r["result"]["sessionId"].is_string(), "{r}");
    let r = call(&mut viewer, 2, "map/subscribe", json!({})).await;
    let sub = r["result"]["subscriptionId"].clone();
    let rows = written(8);
    let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    // Rows 0-2, then (3 and 4 lost to retention) 5-7.
    let (first, rest) = (rows[..3].to_vec(), rows[5..].to_vec());
    router
        .with(move |r| r.ingest_followed(first))
        .await
        .unwrap();
    router.with(move |r| r.ingest_followed(rest)).await.unwrap();
    let mut shown = Vec::new();
    let mut overflowed = false;
    while shown.len() < 6 {
        let v = next(&mut viewer).await;
        if v["params"]["subscriptionId"] != sub {
            continue;
        }
        match v["params"]["eventId"].as_str() {
            Some(id) => shown.push(id.to_owned()),
            None if v.to_string().contains("overflow") => overflowed = true,
            None => panic!("{v}"),
        }
    }
    let expected: Vec<String> = [0, 1, 2, 5, 6, 7].iter().map(|&i| ids[i].clone()).collect();
    assert_eq!(
        shown, expected,
        "the rows before and after the hole, in order"
    );
    assert!(
        overflowed,
        "the viewer is told it missed events, as past retention on one node"
    );
    // The follower logged nothing of its own (not its viewer's connect): its log ends with
    // the last followed row, and holds the rows after the hole.
    let stats = router.stats().await.unwrap();
    assert_eq!((stats.next_seq, stats.log_events), (8, 3), "{stats:?}");
}
