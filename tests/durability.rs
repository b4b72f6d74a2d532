//! The durable event log end to end: replay and resume across a restart (in-process servers on
//! one data directory), the explicit gap signal when retention has removed what a client asks
//! for, and a `kill -9` of the real binary under load: every event of an answered call is still
//! there after the restart, every event a live subscriber was shown is too (read-committed
//! delivery, at 20 random kill points), and a dashboard resumes from its last seen event id
//! with no duplicate and no hole.

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::load::{env_number, env_seed, sender, CrashLoad, Rng};
use common::*;
use map_router::server::{Config, Server};
use serde_json::{json, Value};

/// A server on loopback keeping its log in `dir`, with a tiny memory window so that replay and
/// catch-up read the store.
async fn durable_server(dir: &Path, tweak: impl FnOnce(&mut Config)) -> (Server, String) {
    let dir = dir.to_owned();
    start_server(move |c| {
        c.storage.data_dir = Some(dir);
        c.events.retention_events = 16;
        tweak(c);
    })
    .await
}

/// Every event id `map/replay` returns to `c` after `after` (all when `None`), paging.
async fn replay_ids(c: &mut WsClient, after: Option<&str>) -> Vec<String> {
    ids_of(&replay_all(c, after).await)
}

/// Reads `n` events of `sub`, checking that sequence numbers continue from `seq`; returns ids.
async fn read_events(c: &mut WsClient, sub: &str, n: usize, seq: &mut u64) -> Vec<Value> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let p = c.next_event(sub).await;
        *seq += 1;
        assert_eq!(p["sequenceNumber"], json!(*seq), "numbering: {p}");
        out.push(p);
    }
    out
}

fn ids_of(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|p| p["eventId"].as_str().unwrap().to_owned())
        .collect()
}

// NB: on a big stack: a debug build without incremental compilation (CI) overflowed the test
// thread's 2 MiB here, with two in-process servers and their clients on one thread.
#[test]
fn replay_and_resume_work_across_a_restart() {
    on_big_stack(replay_and_resume);
}

async fn replay_and_resume() {
    let dir = TempDir::new("restart");
    let (server, url) = durable_server(&dir.path, |_| {}).await;
    let mut dash = WsClient::system(&url).await;
    let sub = dash.subscribe_with(json!({"replayFrom": 0})).await;
    let mut a = WsClient::agent(&url, "r-a", json!({})).await;
    let _b = WsClient::agent(&url, "r-b", json!({})).await;
    for i in 0..60 {
        a.send(json!({"agent": "r-b"}), json!({"i": i})).await;
    }
    // The dashboard has read what came before the sends and a few of them, then goes away.
    let mut seq = 0;
    let seen = read_events(&mut dash, &sub, 40, &mut seq).await;
    let last_seen = seen.last().unwrap()["eventId"].as_str().unwrap().to_owned();
    let before = replay_ids(&mut dash, None).await;
    assert!(before.len() >= 120, "two events per send: {}", before.len());
    assert_eq!(ids_of(&seen), before[..40], "live order is log order");
    dash.drop_abruptly();
    drop((a, _b));
    with_timeout(server.shutdown()).await;

    let (server, url) = durable_server(&dir.path, |_| {}).await;
    let mut c = WsClient::system(&url).await;
    let after = replay_ids(&mut c, None).await;
    assert!(
        after.starts_with(&before),
        "everything logged before the restart is replayed after it, in order"
    );
    let mut sorted = after.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(
        sorted, after,
        "ids keep increasing across the restart, no duplicate"
    );
    // The clean shutdown left the agents orphaned; the new run ends them.
    let ends = c
        .ok(
            "map/replay",
            json!({"afterEventId": before.last().unwrap(), "filter": {"eventTypes": ["agent_unregistered", "participant_disconnected"]}}),
        )
        .await;
    let ends: Vec<(String, String)> = ends["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let d = &e["event"]["data"];
            (
                d["agentId"].as_str().unwrap_or("-").to_owned(),
                d["reason"].as_str().unwrap().to_owned(),
            )
        })
        // The dropped connections close as `transport_closed` or `shutdown`, depending on
        // whether the shutdown overtook them.
        .filter(|(_, reason)| reason == "router_restarted")
        .collect();
    assert_eq!(
        ends,
        [
            ("r-a".to_owned(), "router_restarted".to_owned()),
            ("r-b".to_owned(), "router_restarted".to_owned())
        ],
        "the agents orphaned at shutdown are ended; no participant was left connected"
    );
    let page = c
        .ok("map/replay", json!({"afterEventId": before[9], "limit": 5}))
        .await;
    assert_eq!(
        ids_of(page["events"].as_array().unwrap()),
        before[10..15],
        "afterEventId reads the store (the memory window is 16 events)"
    );
    assert_eq!(page["hasMore"], json!(true));
    assert!(page.get("gap").is_none(), "{page}");

    // The dashboard resumes from its last seen event: the rest of the old log, then live.
    let mut dash = WsClient::system(&url).await;
    let sub = dash.subscribe_with(json!({"replayFrom": last_seen})).await;
    let missed = replay_ids(&mut dash, Some(&last_seen)).await;
    let mut seq = 0;
    let got = read_events(&mut dash, &sub, missed.len(), &mut seq).await;
    assert_eq!(ids_of(&got), missed, "exactly the missed events, in order");
    let mut agent = WsClient::agent(&url, "r-new", json!({})).await;
    agent
        .ok(
            "map/agents/update",
            json!({"agentId": "r-new", "state": "busy"}),
        )
        .await;
    let live = dash.event_of_type(&sub, "agent_state_changed").await;
    assert_eq!(live["event"]["data"]["agentId"], json!("r-new"));
    let everything = replay_ids(&mut dash, Some(&last_seen)).await;
    let position = everything
        .iter()
        .position(|id| live["eventId"] == json!(id))
        .expect("the live event is logged");
    assert_eq!(
        live["sequenceNumber"],
        json!(position as u64 + 1),
        "one numbering from the replayed history into live events: no gap, no duplicate"
    );
    with_timeout(server.shutdown()).await;
}

#[tokio::test]
async fn reaching_past_retention_is_an_explicit_gap() {
    let dir = TempDir::new("gap");
    let (server, url) = durable_server(&dir.path, |c| c.storage.max_events = 40).await;
    let mut sys = WsClient::system(&url).await;
    let first = replay_ids(&mut sys, None).await[0].clone();
    let mut a = WsClient::agent(&url, "g-a", json!({})).await;
    for i in 0..80 {
        a.ok(
            "map/agents/update",
            // A standard event each time (agent.metadata.changed is a vendor type, left out of
            // an unfiltered replay).
            json!({"agentId": "g-a", "state": if i % 2 == 0 { "busy" } else { "idle" }}),
        )
        .await;
    }
    // Retention runs on the store's writer thread; wait until it has cut the log.
    let mut replay = Value::Null;
    for _ in 0..100 {
        replay = sys
            .ok("map/replay", json!({"afterEventId": first, "limit": 10}))
            .await;
        if replay["gap"] == json!(true) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        replay["gap"],
        json!(true),
        "replay says events are gone: {replay}"
    );
    assert_eq!(replay["events"].as_array().unwrap().len(), 10);

    for (policy, closes) in [("close", true), ("skip", false)] {
        let mut dash = WsClient::system(&url).await;
        let sub = dash
            .subscribe_with(json!({"replayFrom": first, "options": {"onOverflow": policy}}))
            .await;
        let notice = dash.next_event(&sub).await;
        assert_eq!(notice["sequenceNumber"], json!(1));
        assert_eq!(
            notice["event"]["type"],
            json!("subscription.overflow"),
            "{notice}"
        );
        let dropped = notice["event"]["data"]["eventsDropped"].as_u64().unwrap();
        assert!(dropped > 0, "{notice}");
        if closes {
            dash.assert_no_event(&sub).await;
            let r = dash
                .ok("map/unsubscribe", json!({"subscriptionId": sub}))
                .await;
            assert_eq!(r["unsubscribed"], json!(false), "already closed: {r}");
        } else {
            // Then live events, numbered on from the notice.
            a.ok(
                "map/agents/update",
                json!({"agentId": "g-a", "state": "busy"}),
            )
            .await;
            let next = dash.next_event(&sub).await;
            assert_eq!(next["sequenceNumber"], json!(2), "{next}");
            assert_eq!(
                next["event"]["type"],
                json!("agent_state_changed"),
                "{next}"
            );
        }
    }
    // A time before retention is a gap as well.
    let r = sys
        .ok("map/replay", json!({"fromTimestamp": 0, "limit": 1}))
        .await;
    assert_eq!(r["gap"], json!(true), "{r}");
    with_timeout(server.shutdown()).await;
}

/// `n` events from agent `u-a`, then a pause, so that what follows is in a later millisecond.
async fn burst(a: &mut WsClient, n: usize) {
    for i in 0..n {
        a.ok(
            "map/agents/update",
            // A standard event each time (agent.metadata.changed is a vendor type, left out of
            // an unfiltered replay).
            json!({"agentId": "u-a", "state": if i % 2 == 0 { "busy" } else { "idle" }}),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
}

/// Resuming or replaying from an event id the log never had is not silent: the answer says
/// `unknownEventId: true` and continues after that id in log order (ids are time-ordered), both
/// when the position is in the store and when it is in the memory window. A known id is not
/// flagged.
#[tokio::test]
async fn an_unknown_event_id_is_flagged_and_the_stream_continues_after_it() {
    let dir = TempDir::new("unknown-id");
    let (server, url) = durable_server(&dir.path, |_| {}).await;
    let mut sys = WsClient::system(&url).await;
    let mut a = WsClient::agent(&url, "u-a", json!({})).await;
    burst(&mut a, 30).await;
    let in_store = replay_ids(&mut sys, None).await.last().unwrap().clone();
    burst(&mut a, 30).await;
    let in_memory = replay_ids(&mut sys, None).await.last().unwrap().clone();
    burst(&mut a, 5).await;
    // The memory window holds 16 events: `in_store` is only on disk, `in_memory` in both.
    for known in [&in_store, &in_memory] {
        // An id in the same millisecond after every real one: strictly between two events.
        let unknown = format!("{}ZZZZZZZZZZZZZZZZ", &known[..10]);
        let expected = replay_ids(&mut sys, Some(known)).await;
        assert!(!expected.is_empty());

        let r = sys
            .ok(
                "map/replay",
                json!({"afterEventId": unknown, "limit": 1000}),
            )
            .await;
        assert_eq!(r["unknownEventId"], json!(true), "{r}");
        assert!(r.get("gap").is_none(), "{r}");
        let got: Vec<&str> = r["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["eventId"].as_str().unwrap())
            .collect();
        // (Later events may have come meanwhile: the previous round's dashboard leaving.)
        assert_eq!(
            got[..expected.len()],
            expected[..],
            "continues after the unknown id"
        );
        let r = sys
            .ok("map/replay", json!({"afterEventId": known, "limit": 1}))
            .await;
        assert!(r.get("unknownEventId").is_none(), "a known id: {r}");

        let mut dash = WsClient::system(&url).await;
        let r = dash
            .ok("map/subscribe", json!({"replayFrom": unknown}))
            .await;
        assert_eq!(r["unknownEventId"], json!(true), "{r}");
        let sub = r["subscriptionId"].as_str().unwrap().to_owned();
        let first = dash.next_event(&sub).await;
        assert_eq!(first["eventId"], json!(expected[0]), "{first}");
        let r = dash.ok("map/subscribe", json!({"replayFrom": known})).await;
        assert!(r.get("unknownEventId").is_none(), "a known id: {r}");
    }
    with_timeout(server.shutdown()).await;
}

// ---------------------------------------------------------------------------------------------
// kill -9 of the real binary

/// Starts the binary on `data` with the store waiting 10 ms to group commits (so that a
/// kill lands between an event's append and its commit often, and an answer given before the
/// commit would be caught); returns it and its URL.
async fn start_router(data: &Path) -> (tokio::process::Child, String) {
    let config = data.with_extension("toml");
    std::fs::write(&config, "[storage]\ngroup_commit_delay_ms = 10\n").unwrap();
    common::start_binary([
        OsStr::new("--listen"),
        OsStr::new("127.0.0.1:0"),
        OsStr::new("--data-dir"),
        data.as_os_str(),
        OsStr::new("--config"),
        config.as_os_str(),
    ])
    .await
}

#[tokio::test]
async fn kill_9_under_load_loses_nothing_answered_and_resume_has_no_gap() {
    let dir = TempDir::new("kill9");
    let data = dir.path.join("data");
    let (mut child, url) = start_router(&data).await;

    // A dashboard that reads everything live, recording what it saw.
    let mut dash = WsClient::system(&url).await;
    let sub = dash.subscribe_with(json!({"replayFrom": 0})).await;
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let dash_task = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut seq = 0u64;
            loop {
                match dash.read_frame().await {
                    Frame::Json(v) if v["params"]["subscriptionId"] == json!(sub) => {
                        seq += 1;
                        assert_eq!(v["params"]["sequenceNumber"], json!(seq), "{v}");
                        let id = v["params"]["eventId"].as_str().unwrap().to_owned();
                        seen.lock().unwrap().push(id);
                    }
                    Frame::Json(_) => {}
                    Frame::Closed(_) => return,
                }
            }
        })
    };
    // The recipient: reads its messages.
    let mut sink = WsClient::agent(&url, "k-sink", json!({})).await;
    let sink_task =
        tokio::spawn(async move { while let Frame::Json(_) = sink.read_frame().await {} });

    let acked = Arc::new(Mutex::new(Vec::new()));
    let senders: Vec<_> = (0..3)
        .map(|i| {
            tokio::spawn(sender(
                url.clone(),
                format!("k-{i}"),
                "k-sink".into(),
                acked.clone(),
                20_000,
            ))
        })
        .collect();
    // Kill mid-stream, once a good number of sends are answered.
    within(Duration::from_secs(60), async {
        while acked.lock().unwrap().len() < 600 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    child.start_kill().expect("SIGKILL");
    let status = with_timeout(child.wait()).await.unwrap();
    assert!(!status.success(), "killed: {status:?}");
    for s in senders {
        with_timeout(s).await.unwrap();
    }
    let _ = with_timeout(dash_task).await;
    let _ = with_timeout(sink_task).await;
    let acked = acked.lock().unwrap().clone();
    let seen = seen.lock().unwrap().clone();

    let (mut child, url) = start_router(&data).await;
    let mut c = WsClient::system(&url).await;
    let log = replay_ids(&mut c, None).await;
    // The restarted router's first events end what the killed one left open: every
    // participant connected and every agent registered at the kill.
    let closing: Vec<Value> = c
        .ok(
            "map/replay",
            json!({"filter": {"eventTypes": ["participant_disconnected", "agent_unregistered"]}, "limit": 1000}),
        )
        .await["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"]["data"]["reason"] == json!("router_restarted"))
        .cloned()
        .collect();
    let (gone, unregistered): (Vec<_>, Vec<_>) = closing
        .iter()
        .partition(|e| e["event"]["type"] == json!("participant_disconnected"));
    assert_eq!(
        gone.len(),
        5,
        "the dashboard, the sink and three senders: {closing:?}"
    );
    let mut agents: Vec<&str> = unregistered
        .iter()
        .map(|e| e["event"]["data"]["agentId"].as_str().unwrap())
        .collect();
    agents.sort_unstable();
    assert_eq!(agents, ["k-0", "k-1", "k-2", "k-sink"]);
    for e in &unregistered {
        let cause = e["causedBy"][0]
            .as_str()
            .expect("caused by its owner's disconnect");
        assert!(gone.iter().any(|g| g["eventId"] == json!(cause)), "{e}");
    }
    let listed = c.ok("map/agents/list", Value::Null).await;
    assert_eq!(listed["agents"], json!([]), "the registry starts empty");
    let first_new = closing[0]["eventId"].as_str().unwrap().to_owned();
    let boundary = log.iter().position(|id| *id == first_new).unwrap();
    let pre_crash = &log[..boundary];

    // Every answered send has its `message_sent` in the log.
    let mut sent_ids = std::collections::HashSet::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10_000 {
        let mut params = json!({"limit": 1000, "filter": {"eventTypes": ["message_sent"]}});
        if let Some(id) = &cursor {
            params["afterEventId"] = json!(id);
        }
        let r = c.ok("map/replay", params).await;
        for e in r["events"].as_array().unwrap() {
            sent_ids.insert(e["event"]["data"]["messageId"].as_str().unwrap().to_owned());
            cursor = Some(e["eventId"].as_str().unwrap().to_owned());
        }
        if r["hasMore"] != json!(true) {
            break;
        }
    }
    let missing: Vec<_> = acked.iter().filter(|m| !sent_ids.contains(*m)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} answered sends lost: {missing:?}",
        missing.len(),
        acked.len()
    );

    // Read-committed delivery: what the dashboard saw live is a prefix of what survived on
    // disk (it may have lagged, but it was shown nothing the crash erased).
    assert!(
        seen.len() > 600,
        "the dashboard followed the load: {} seen",
        seen.len()
    );
    assert!(
        seen.len() <= pre_crash.len(),
        "{} seen live, only {} kept",
        seen.len(),
        pre_crash.len()
    );
    assert_eq!(
        seen[..],
        pre_crash[..seen.len()],
        "the durable log and the live stream agree on order"
    );

    // Resume from the last seen event: exactly what the log holds after it, then live.
    let last = seen.last().unwrap().clone();
    let mut dash = WsClient::system(&url).await;
    let sub = dash.subscribe_with(json!({"replayFrom": last})).await;
    let expected = replay_ids(&mut c, Some(&last)).await;
    let mut seq = 0;
    let got = read_events(&mut dash, &sub, expected.len(), &mut seq).await;
    assert_eq!(ids_of(&got), expected, "no duplicate, no hole");
    assert!(
        got.iter()
            .all(|p| p["eventId"].as_str().unwrap() > last.as_str()),
        "nothing at or before the resume point"
    );
    let mut agent = WsClient::agent(&url, "k-after", json!({})).await;
    agent
        .ok(
            "map/agents/update",
            json!({"agentId": "k-after", "state": "busy"}),
        )
        .await;
    let live = dash.event_of_type(&sub, "agent_state_changed").await;
    assert_eq!(live["event"]["data"]["agentId"], json!("k-after"));

    child.start_kill().unwrap();
    let _ = with_timeout(child.wait()).await;
}

/// Sends `n` `map/send` requests (ids 1..=n) and one `map/agents/list` (id n + 1) after
/// request `list_after`, all without waiting; returns the responses in arrival order.
async fn pipelined(c: &mut WsClient, to: &str, n: u64, list_after: u64) -> Vec<Value> {
    for i in 1..=n {
        let send = json!({"jsonrpc": "2.0", "id": i, "method": "map/send",
            "params": {"to": {"agent": to}, "payload": {"i": i}}});
        c.send_raw(&send.to_string()).await;
        if i == list_after {
            let list = json!({"jsonrpc": "2.0", "id": n + 1, "method": "map/agents/list"});
            c.send_raw(&list.to_string()).await;
        }
    }
    let mut out = Vec::new();
    for _ in 0..=n {
        let frame = c.read_json().await;
        assert!(
            frame.get("id").is_some(),
            "only responses expected: {frame}"
        );
        out.push(frame);
    }
    out
}

/// With a durable store, a connection keeps reading while its `map/send` answers wait for
/// their commits, and the answers still leave in request order.
#[tokio::test]
async fn pipelined_sends_are_answered_in_request_order() {
    let dir = TempDir::new("pipeline-order");
    let (_server, url) = durable_server(&dir.path, |_| {}).await;
    let mut bob = WsClient::agent(&url, "bob", json!({})).await;
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    let responses = pipelined(&mut alice, "bob", 200, 100).await;
    let ids: Vec<u64> = responses
        .iter()
        .map(|r| r["id"].as_u64().unwrap())
        .collect();
    let mut want: Vec<u64> = (1..=100).collect();
    want.push(201);
    want.extend(101..=200);
    assert_eq!(ids, want, "answers in request order");
    for r in &responses {
        assert!(r.get("result").is_some(), "{r}");
    }
    // Every message arrived, in order, and every event is in the store.
    for i in 1..=200u64 {
        let m = bob.next_message().await;
        assert_eq!(m["payload"]["i"], json!(i));
    }
    let logged = replay_ids(&mut alice, None).await;
    assert!(
        logged.len() >= 400,
        "sent + delivered for each: {}",
        logged.len()
    );
}

/// An answer whose events are not committed within the commit timeout becomes a 4000 error,
/// and the answers behind it still wait their turn.
#[tokio::test]
async fn a_pipelined_send_not_committed_in_time_fails_in_order() {
    let dir = TempDir::new("pipeline-timeout");
    // NB. The timeout also bounds the connects and registrations below: short enough that the
    // blocked sends fail quickly, long enough for an fsync on a busy shared disk.
    let (_server, url) = durable_server(&dir.path, |c| {
        c.storage.commit_timeout_ms = 2_000;
    })
    .await;
    let _bob = WsClient::agent(&url, "bob", json!({})).await;
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    // Another writer holds the database: the store cannot commit until it lets go.
    let blocker = rusqlite::Connection::open(dir.path.join("events.sqlite3")).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let responses = pipelined(&mut alice, "bob", 2, 1).await;
    blocker.execute_batch("ROLLBACK").unwrap();
    drop(blocker);
    let ids: Vec<u64> = responses
        .iter()
        .map(|r| r["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [1, 3, 2], "{responses:?}");
    assert_eq!(responses[0]["error"]["code"], json!(4000), "{responses:?}");
    assert!(responses[1].get("result").is_some(), "{responses:?}");
    assert_eq!(responses[2]["error"]["code"], json!(4000), "{responses:?}");
    // The store catches up once the other writer is gone, and the connection works on.
    let r = alice
        .ok(
            "map/send",
            json!({"to": {"agent": "bob"}, "payload": "after"}),
        )
        .await;
    assert!(r.get("messageId").is_some(), "{r}");
}

/// While one answer waits for its commit, the connection's next requests are already applied:
/// the recipient gets every message before the sender gets any answer, and the answers follow,
/// in order, once the store commits.
#[tokio::test]
async fn a_waiting_answer_does_not_hold_up_the_next_requests() {
    let dir = TempDir::new("pipeline-overlap");
    let (_server, url) = durable_server(&dir.path, |c| {
        c.storage.commit_timeout_ms = 20_000;
    })
    .await;
    let mut bob = WsClient::agent(&url, "bob", json!({})).await;
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    let blocker = rusqlite::Connection::open(dir.path.join("events.sqlite3")).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    for i in 1..=3u64 {
        let send = json!({"jsonrpc": "2.0", "id": i, "method": "map/send",
            "params": {"to": {"agent": "bob"}, "payload": {"i": i}}});
        alice.send_raw(&send.to_string()).await;
    }
    for i in 1..=3u64 {
        assert_eq!(bob.next_message().await["payload"]["i"], json!(i));
    }
    alice.assert_silent().await;
    blocker.execute_batch("ROLLBACK").unwrap();
    drop(blocker);
    for i in 1..=3u64 {
        let r = alice.read_json().await;
        assert_eq!(r["id"], json!(i), "{r}");
        assert!(r.get("result").is_some(), "{r}");
    }
}

/// Read-committed delivery under `kill -9` at random moments, 20 times on one data directory:
/// after each restart, every event the live subscriber was shown is in the log, every answered
/// send has its `message_sent`, and no event id appears twice or out of order. (With
/// `[storage] delivery = "live"` this test fails within a few rounds.)
///
/// `MAP_KILL9_ROUNDS` (at most 2 000) runs more rounds, as `scripts/kill9.sh` does;
/// `MAP_KILL9_SEED` repeats the kill points of a printed seed.
#[tokio::test]
async fn kill_9_at_random_points_never_erases_what_a_subscriber_saw() {
    let rounds = env_number("MAP_KILL9_ROUNDS").map_or(20, |n| n.clamp(1, 2_000) as usize);
    let seed = env_seed("MAP_KILL9_SEED");
    eprintln!("kill points seed: {seed}, {rounds} rounds");
    let mut rng = Rng(seed);
    let dir = TempDir::new("kill9-rounds");
    let data = dir.path.join("data");
    let mut mark: Option<String> = None;
    let mut all_ids = std::collections::HashSet::new();
    let mut previous: Option<(Vec<String>, Vec<String>)> = None;
    let mut total_seen = 0;
    for round in 0..=rounds {
        let (mut child, url) = start_router(&data).await;
        // Check what the previous round left against what its observers saw.
        let mut c = WsClient::system(&url).await;
        let events = replay_all(&mut c, mark.as_deref()).await;
        let mut last = mark.clone().unwrap_or_default();
        let mut sent = std::collections::HashSet::new();
        for e in &events {
            let id = e["eventId"].as_str().unwrap().to_owned();
            assert!(id > last, "round {round}: {id} after {last} (seed {seed})");
            assert!(
                all_ids.insert(id.clone()),
                "round {round}: {id} repeats (seed {seed})"
            );
            if e["event"]["type"] == json!("message_sent") {
                sent.insert(e["event"]["data"]["messageId"].as_str().unwrap().to_owned());
            }
            last = id;
        }
        if let Some((seen, acked)) = previous.take() {
            let kept: std::collections::HashSet<&str> = events
                .iter()
                .map(|e| e["eventId"].as_str().unwrap())
                .collect();
            let erased: Vec<_> = seen
                .iter()
                .filter(|id| !kept.contains(id.as_str()))
                .collect();
            assert!(
                erased.is_empty(),
                "round {round}: {} events a subscriber saw are gone: {erased:?} (seed {seed})",
                erased.len()
            );
            let lost: Vec<_> = acked.iter().filter(|m| !sent.contains(*m)).collect();
            assert!(
                lost.is_empty(),
                "round {round}: answered sends lost: {lost:?} (seed {seed})"
            );
            total_seen += seen.len();
        }
        mark = Some(last);
        if round == rounds {
            child.start_kill().unwrap();
            let _ = with_timeout(child.wait()).await;
            break;
        }

        // Load: a live subscriber, a sink, two senders; kill -9 at a random moment.
        let mut dash = WsClient::system(&url).await;
        let sub = dash.subscribe(json!({})).await;
        let senders = [format!("r{round}-s0"), format!("r{round}-s1")];
        let load =
            CrashLoad::start(&url, dash, sub, &format!("r{round}-sink"), senders, 5_000).await;
        tokio::time::sleep(Duration::from_millis(10 + rng.below(250))).await;
        child.start_kill().expect("SIGKILL");
        with_timeout(child.wait()).await.unwrap();
        let (seen, acked) = load.finish().await;
        previous = Some((seen, acked));
    }
    assert!(
        total_seen > rounds * 10,
        "the subscribers saw the load: {total_seen} events in {rounds} rounds"
    );
}

/// A client reads its own writes: a replay sent right after a send was answered shows that
/// send's `message_sent`, every time. (Read-committed delivery learns of commits through a
/// channel of its own, which could reach the router after the answer had left.)
#[tokio::test]
async fn a_replay_right_after_an_answer_shows_the_answered_send() {
    let dir = TempDir::new("read-own-writes");
    let (mut child, url) = start_router(&dir.path.join("data")).await;
    let mut a = WsClient::agent(&url, "ryw-a", json!({})).await;
    let _b = WsClient::agent(&url, "ryw-b", json!({})).await;
    let mut last: Option<String> = None;
    for i in 0..300 {
        let r = a.send(json!({"agent": "ryw-b"}), json!({"i": i})).await;
        let mut params = json!({"limit": 1000, "filter": {"eventTypes": ["message_sent"]}});
        if let Some(id) = &last {
            params["afterEventId"] = json!(id);
        }
        let page = a.ok("map/replay", params).await;
        let events = page["events"].as_array().expect("events");
        assert!(
            events
                .iter()
                .any(|e| e["event"]["data"]["messageId"] == r["messageId"]),
            "send {i}: its message_sent is not in a replay sent after its answer: {page}"
        );
        last = events
            .last()
            .map(|e| e["eventId"].as_str().unwrap().to_owned());
    }
    child.start_kill().unwrap();
    let _ = with_timeout(child.wait()).await;
}
