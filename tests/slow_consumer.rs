//! A subscriber that reads nothing while others run at full speed: the real binary's memory
//! (RSS, from /proc) stays bounded although far more event data flows than the bound, the
//! fast subscriber gets every event while the slow one is stalled, and the slow one then
//! catches up completely from the durable log: the same events, in the same order, numbered
//! without a gap.

#![cfg(target_os = "linux")]

mod common;

use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// Messages sent by each of the two publishers.
const PER_PUBLISHER: u64 = 2_500;
/// Payload bytes per message. Each message logs two events (sent and delivered), each carrying
/// the payload twice (as `payload` and inside `message`): about 4 × this per message.
const PAYLOAD: usize = 4096;
/// The most the router's RSS may grow over its warmed-up size while the slow subscriber is
/// stalled: a few outboxes of frames, socket buffers, the memory window and SQLite's caches.
/// Buffering the stalled subscriber's events would take several times this.
const RSS_GROWTH_LIMIT_KB: u64 = 32 * 1024;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// One call on a raw socket, skipping notifications; panics on failure.
async fn rpc(ws: &mut Ws, n: u64, method: &str, params: Value) -> Value {
    let req = json!({"jsonrpc": "2.0", "id": n, "method": method, "params": params});
    with_timeout(ws.send(Message::text(req.to_string())))
        .await
        .expect("send");
    loop {
        let msg = with_timeout(ws.next()).await.expect("open").expect("read");
        let Message::Text(t) = msg else { continue };
        let v: Value = serde_json::from_str(t.as_str()).unwrap();
        if v["id"] == json!(n) {
            assert!(v.get("result").is_some(), "{method}: {v}");
            return v["result"].clone();
        }
    }
}

async fn open(url: &str, kind: &str) -> Ws {
    let (mut ws, _) = with_timeout(tokio_tungstenite::connect_async(url))
        .await
        .expect("connect");
    rpc(
        &mut ws,
        1,
        "map/connect",
        json!({"protocolVersion": 1, "participantType": kind}),
    )
    .await;
    ws
}

/// Reads `map/event` notifications of a socket into `ids` until `want` have arrived, checking
/// the numbering.
async fn read_events(ws: &mut Ws, want: usize, ids: &Mutex<Vec<String>>, limit: Duration) {
    within(limit, async {
        let mut seq = ids.lock().unwrap().len() as u64;
        while ids.lock().unwrap().len() < want {
            let msg = ws.next().await.expect("open").expect("read");
            let Message::Text(t) = msg else { continue };
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            if v["method"] != json!("map/event") {
                continue;
            }
            let p = &v["params"];
            assert_ne!(p["event"]["type"], json!("subscription.overflow"), "{p}");
            seq += 1;
            assert_eq!(p["sequenceNumber"], json!(seq), "numbering");
            ids.lock()
                .unwrap()
                .push(p["eventId"].as_str().unwrap().to_owned());
        }
    })
    .await;
}

#[tokio::test]
async fn a_stalled_subscriber_costs_bounded_memory_and_catches_up_from_the_log() {
    let dir = TempDir::new("slow");
    let config = dir.path.join("router.toml");
    std::fs::write(
        &config,
        "[events]\nretention_events = 2000\nretention_bytes = 4194304\n[router]\noutbox_frames = 256\n",
    )
    .unwrap();
    let data = dir.path.join("data");
    let (mut child, url) = start_binary([
        OsStr::new("--listen"),
        OsStr::new("127.0.0.1:0"),
        OsStr::new("--data-dir"),
        data.as_os_str(),
        OsStr::new("--config"),
        config.as_os_str(),
    ])
    .await;
    let pid = child.id().unwrap();

    let filter = json!({"filter": {"eventTypes": ["message_sent", "message_delivered"]}});
    let mut slow = open(&url, "system").await;
    rpc(&mut slow, 2, "map/subscribe", filter.clone()).await;
    let mut fast = open(&url, "system").await;
    rpc(&mut fast, 2, "map/subscribe", filter).await;
    let total = (2 * PER_PUBLISHER * 2) as usize;
    let fast_ids = Arc::new(Mutex::new(Vec::new()));
    let fast_task = {
        let ids = fast_ids.clone();
        tokio::spawn(async move {
            read_events(&mut fast, total, &ids, Duration::from_secs(300)).await;
            fast
        })
    };

    // The recipient reads its messages.
    let mut sink = open(&url, "agent").await;
    rpc(
        &mut sink,
        2,
        "map/agents/register",
        json!({"agentId": "sink"}),
    )
    .await;
    let sink_task = tokio::spawn(async move { while let Some(Ok(_)) = sink.next().await {} });

    let sent = Arc::new(AtomicU64::new(0));
    let payload = "x".repeat(PAYLOAD);
    let publishers: Vec<_> = (0..2)
        .map(|i| {
            let (url, sent, payload) = (url.clone(), sent.clone(), payload.clone());
            tokio::spawn(async move {
                let mut ws = open(&url, "agent").await;
                rpc(
                    &mut ws,
                    2,
                    "map/agents/register",
                    json!({"agentId": format!("pub-{i}")}),
                )
                .await;
                for n in 0..PER_PUBLISHER {
                    let params =
                        json!({"to": {"agent": "sink"}, "payload": {"n": n, "pad": payload}});
                    rpc(&mut ws, 3 + n, "map/send", params).await;
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();

    // Warmed up: the slow subscriber's socket and outbox are full well before this.
    within(Duration::from_secs(120), async {
        while sent.load(Ordering::Relaxed) < 400 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let baseline = rss_kb(pid);
    let mut peak = baseline;
    let all_sent = within(Duration::from_secs(300), async {
        loop {
            peak = peak.max(rss_kb(pid));
            if publishers.iter().all(|p| p.is_finished()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    all_sent.await;
    for p in publishers {
        with_timeout(p).await.expect("publisher");
    }
    let _fast = within(Duration::from_secs(300), fast_task)
        .await
        .expect("fast reader");
    peak = peak.max(rss_kb(pid));
    let published_kb = (2 * PER_PUBLISHER * 4 * PAYLOAD as u64) / 1024;
    eprintln!(
        "RSS baseline {baseline} kB, peak {peak} kB, growth {} kB; event payload data {published_kb} kB",
        peak - baseline
    );
    assert!(
        peak - baseline < RSS_GROWTH_LIMIT_KB,
        "RSS grew {} kB while a subscriber was stalled ({published_kb} kB of event data)",
        peak - baseline
    );
    assert!(
        published_kb > 2 * RSS_GROWTH_LIMIT_KB,
        "the test moves more data than the bound"
    );
    // The fast subscriber got everything while the slow one read nothing.
    assert_eq!(fast_ids.lock().unwrap().len(), total);

    // Now the slow one reads: everything, same order, no gap.
    let slow_ids = Mutex::new(Vec::new());
    read_events(&mut slow, total, &slow_ids, Duration::from_secs(300)).await;
    assert_eq!(*slow_ids.lock().unwrap(), *fast_ids.lock().unwrap());
    // And it is live again.
    let mut late = open(&url, "agent").await;
    rpc(
        &mut late,
        2,
        "map/agents/register",
        json!({"agentId": "late"}),
    )
    .await;
    rpc(
        &mut late,
        3,
        "map/send",
        json!({"to": {"agent": "sink"}, "payload": "late"}),
    )
    .await;
    read_events(&mut slow, total + 2, &slow_ids, Duration::from_secs(10)).await;

    child.start_kill().unwrap();
    let _ = with_timeout(child.wait()).await;
    sink_task.abort();
}
