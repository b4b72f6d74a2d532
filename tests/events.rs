//! Events and subscriptions (docs/compatibility.md §7–8): the envelope, ordering against the
//! subscribe response, filters, gap-free sequencing under concurrent senders, unsubscribe,
//! `replayFrom` / `startAfter`, `map/replay`, and the events of transport loss.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// The event types of a list of envelopes.
fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["event"]["type"].as_str().expect("type").to_owned())
        .collect()
}

/// Reads `n` events of `sub`.
async fn take(c: &mut WsClient, sub: &str, n: usize) -> Vec<Value> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(c.next_event(sub).await);
    }
    out
}

/// Does a fixed series of actions that emits one event of many types, from a fresh agent
/// `act-1` (plus `act-2`) and a fresh client. Returns the types emitted, in order.
async fn act(url: &str) -> Vec<&'static str> {
    let mut a = WsClient::agent(url, "act-1", json!({"role": "worker"})).await;
    a.ok("map/scopes/create", json!({"scopeId": "act-s"})).await;
    a.ok(
        "map/scopes/join",
        json!({"scopeId": "act-s", "agentId": "act-1"}),
    )
    .await;
    a.ok(
        "map/agents/update",
        json!({"agentId": "act-1", "state": "busy"}),
    )
    .await;
    a.ok(
        "map/agents/update",
        json!({"agentId": "act-1", "metadata": {"m": 1}}),
    )
    .await;
    a.ok(
        "map/agents/update",
        json!({"agentId": "act-1", "environment": {"os": "linux"}}),
    )
    .await;
    a.register_agent(json!({"agentId": "act-2"})).await;
    a.send(json!({"agent": "act-2"}), json!("x")).await;
    a.ok("map/agents/unregister", json!({"agentId": "act-2"}))
        .await;
    a.ok("map/scopes/delete", json!({"scopeId": "act-s"})).await;
    a.ok(
        "map/disconnect",
        json!({"policy": {"agentBehavior": "orphan"}}),
    )
    .await;
    vec![
        "participant_connected",
        "agent_registered",
        "scope_created",
        "scope_member_joined",
        "agent_state_changed",
        "agent.metadata.changed",
        "agent_environment_changed",
        "agent_registered",
        "message_sent",
        "message_delivered",
        "agent_unregistered",
        "scope_deleted",
        "scope_member_left",
        "participant_disconnected",
        "agent_orphaned",
        "agent.presence.changed",
    ]
}

#[tokio::test]
async fn the_envelope_has_every_documented_field() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let sub = obs.subscribe(Value::Null).await;
    let cl = WsClient::connect_as(&url, "client", json!({"name": "cli-2"})).await;
    let env = obs.next_event(&sub).await;
    assert_eq!(env["subscriptionId"], json!(sub));
    assert_eq!(env["sequenceNumber"], json!(1));
    let id = env["eventId"].as_str().expect("eventId");
    assert_eq!(id.len(), 26, "a ULID: {id}");
    assert!(env["timestamp"].is_u64());
    let ev = &env["event"];
    assert_eq!(ev["id"], json!(id), "event.id == eventId");
    assert_eq!(ev["type"], json!("participant_connected"));
    assert!(ev["timestamp"].is_u64());
    assert_eq!(ev["source"], json!(cl.pid()));
    assert_eq!(
        ev["data"],
        json!({"participantId": cl.pid(), "participantType": "client", "name": "cli-2"})
    );
    assert!(env.get("causedBy").is_none(), "no cause: {env}");
}

#[tokio::test]
async fn the_subscribe_response_precedes_replayed_history() {
    let (_server, url) = default_server().await;
    let _ = act(&url).await;
    let mut obs = WsClient::client(&url).await;
    obs.send_raw(
        r#"{"jsonrpc":"2.0","id":"sub","method":"map/subscribe","params":{"replayFrom":0}}"#,
    )
    .await;
    let first = obs.read_json().await;
    assert_eq!(
        first["id"],
        json!("sub"),
        "the response comes first: {first}"
    );
    let sub = first["result"]["subscriptionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["sequenceNumber"], json!(1));
    assert_eq!(ev["event"]["type"], json!("participant_connected"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscribe_response_precedes_live_events_under_load() {
    let (_server, url) = default_server().await;
    let mut busy = WsClient::agent(&url, "busy-1", json!({})).await;
    // Events keep flowing until every round has seen one (bounded in count).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = tokio::spawn({
        let stop = stop.clone();
        async move {
            for n in 0..100_000 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                busy.ok(
                    "map/agents/update",
                    json!({"agentId": "busy-1", "metadata": {"n": n}}),
                )
                .await;
            }
        }
    });
    let mut obs = WsClient::client(&url).await;
    for round in 0..10 {
        let id = format!("s{round}");
        obs.send_raw(&format!(
            r#"{{"jsonrpc":"2.0","id":"{id}","method":"map/subscribe","params":{{"filter":{{"eventTypes":["agent.metadata.changed"]}}}}}}"#
        ))
        .await;
        let mut before = Vec::new();
        let response = loop {
            let f = obs.read_json().await;
            if is_notification(&f) {
                before.push(f);
            } else {
                break f;
            }
        };
        assert_eq!(response["id"], json!(id));
        let sub = response["result"]["subscriptionId"].clone();
        assert!(
            before.iter().all(|f| f["params"]["subscriptionId"] != sub),
            "an event of {sub} overtook its subscribe response"
        );
        let first = obs.next_event(sub.as_str().unwrap()).await;
        assert_eq!(first["sequenceNumber"], json!(1));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    with_timeout(flood).await.expect("flood task");
}

/// Our vendor event types, which only a filter naming them gets (docs/compatibility.md §7).
fn is_vendor(t: &str) -> bool {
    map_router::protocol::event::EventType::vendor().any(|v| v.as_str() == t)
}

fn standard(all: &[&'static str]) -> Vec<&'static str> {
    all.iter().copied().filter(|t| !is_vendor(t)).collect()
}

#[tokio::test]
async fn no_filter_means_every_event() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let empty = obs.subscribe_with(json!({})).await;
    let empty_filter = obs.subscribe(json!({})).await;
    let absent = obs.subscribe_with(Value::Null).await;
    let everything = obs
        .subscribe(json!({"eventTypes": map_router::protocol::event::EventType::every_type()}))
        .await;
    let all = act(&url).await;
    // Every standard type; a vendor type only where it is named.
    let expected = standard(&all);
    assert!(
        expected.len() < all.len(),
        "the act emits vendor events too"
    );
    let got = take(&mut obs, &everything, all.len()).await;
    assert_eq!(types(&got), all);
    for sub in [&empty, &empty_filter, &absent] {
        let got = take(&mut obs, sub, expected.len()).await;
        assert_eq!(types(&got), expected, "subscription {sub}");
        for (i, e) in got.iter().enumerate() {
            assert_eq!(e["sequenceNumber"], json!(i + 1));
        }
        obs.assert_no_event(sub).await;
    }
}

#[tokio::test]
async fn event_type_filters_accept_both_spellings_and_wildcards() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (
            json!(["agent_registered"]),
            vec!["agent_registered", "agent_registered"],
        ),
        (
            json!(["agent.registered"]),
            vec!["agent_registered", "agent_registered"],
        ),
        (
            json!(["agent.*"]),
            vec![
                "agent_registered",
                "agent_state_changed",
                "agent_environment_changed",
                "agent_registered",
                "agent_unregistered",
                "agent_orphaned",
            ],
        ),
        (
            json!(["agent.presence.changed"]),
            vec!["agent.presence.changed"],
        ),
        (
            json!(["scope.*"]),
            vec![
                "scope_created",
                "scope_member_joined",
                "scope_deleted",
                "scope_member_left",
            ],
        ),
        (
            json!(["message_delivered", "scope.created", "participant.*"]),
            vec![
                "participant_connected",
                "scope_created",
                "message_delivered",
                "participant_disconnected",
            ],
        ),
        (
            json!(["agent_metadata_changed"]),
            vec!["agent.metadata.changed"],
        ),
        (json!([]), vec![]), // replaced below by the full list
    ];
    let mut subs = Vec::new();
    for (types_filter, _) in &cases {
        subs.push(obs.subscribe(json!({"eventTypes": types_filter})).await);
    }
    let star = obs.subscribe(json!({"eventTypes": ["*"]})).await;
    let all = standard(&act(&url).await);
    for ((filter, expected), sub) in cases.iter().zip(&subs) {
        let expected: Vec<&str> = if expected.is_empty() {
            all.clone()
        } else {
            expected.clone()
        };
        let got = take(&mut obs, sub, expected.len()).await;
        assert_eq!(types(&got), expected, "filter {filter}");
        obs.assert_no_event(sub).await;
    }
    let got = take(&mut obs, &star, all.len()).await;
    assert_eq!(types(&got), all);
    assert_invalid_params(
        &obs.err("map/subscribe", json!({"filter": {"eventTypes": [""]}}))
            .await,
    );
}

#[tokio::test]
async fn from_agents_matches_the_source_and_source_less_events_fail() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut x = WsClient::agent(&url, "fa-x", json!({})).await;
    let mut y = WsClient::agent(&url, "fa-y", json!({})).await;
    let sub = obs.subscribe(json!({"fromAgents": ["fa-x"]})).await;
    let alias = obs.subscribe(json!({"agents": ["fa-x"]})).await;
    let by_pid = obs.subscribe(json!({"fromAgents": [y.pid()]})).await;
    y.send(json!({"agent": "fa-x"}), json!(1)).await;
    x.send(json!({"agent": "fa-y"}), json!(2)).await;
    x.ok(
        "map/agents/update",
        json!({"agentId": "fa-x", "state": "idle"}),
    )
    .await;
    let _z = WsClient::client(&url).await; // participant_connected: source is its pid
    for s in [&sub, &alias] {
        let got = take(&mut obs, s, 3).await;
        assert_eq!(
            types(&got),
            vec!["message_sent", "message_delivered", "agent_state_changed"]
        );
        for e in &got {
            assert_eq!(e["event"]["source"], json!("fa-x"));
        }
        obs.assert_no_event(s).await;
    }
    // y's messages carry its agent id as source, not its participant id.
    obs.assert_no_event(&by_pid).await;
}

#[tokio::test]
async fn scope_filters_include_descendant_scopes_and_scope_messages() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut a = WsClient::agent(&url, "sf-a", json!({})).await;
    a.ok("map/scopes/create", json!({"scopeId": "sf-p"})).await;
    let sub = obs.subscribe(json!({"scopes": ["sf-p"]})).await;
    a.ok(
        "map/scopes/create",
        json!({"scopeId": "sf-c", "parent": "sf-p"}),
    )
    .await;
    a.ok("map/scopes/create", json!({"scopeId": "sf-other"}))
        .await;
    a.ok(
        "map/scopes/join",
        json!({"scopeId": "sf-other", "agentId": "sf-a"}),
    )
    .await;
    a.ok(
        "map/scopes/join",
        json!({"scopeId": "sf-c", "agentId": "sf-a"}),
    )
    .await;
    a.register_agent(json!({"agentId": "sf-b", "scopes": ["sf-p"]}))
        .await;
    a.send(json!({"scope": "sf-p"}), json!(1)).await;
    a.ok(
        "map/agents/update",
        json!({"agentId": "sf-a", "state": "idle"}),
    )
    .await;
    let got = take(&mut obs, &sub, 5).await;
    assert_eq!(
        types(&got),
        vec![
            "scope_created",
            "scope_member_joined",
            "scope_member_joined",
            "message_sent",
            "message_delivered"
        ]
    );
    assert_eq!(got[0]["event"]["data"]["scopeId"], json!("sf-c"));
    assert_eq!(got[1]["event"]["data"]["scopeId"], json!("sf-c"));
    assert_eq!(
        got[2]["event"]["data"],
        json!({"scopeId": "sf-p", "agentId": "sf-b"})
    );
    obs.assert_no_event(&sub).await;
}

#[tokio::test]
async fn role_priority_correlation_and_metadata_filters() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut w = WsClient::agent(&url, "rf-w", json!({"role": "worker"})).await;
    let mut b = WsClient::agent(&url, "rf-b", json!({"role": "boss"})).await;
    let from_roles = obs
        .subscribe(json!({"fromRoles": ["worker"], "eventTypes": ["message_sent"]}))
        .await;
    let roles = obs
        .subscribe(json!({"roles": ["boss"], "eventTypes": ["agent_state_changed"]}))
        .await;
    let urgent = obs.subscribe(json!({"priorities": ["urgent"]})).await;
    let normal = obs
        .subscribe(json!({"priorities": ["normal"], "eventTypes": ["message_sent"]}))
        .await;
    let meta = obs
        .subscribe(json!({
            "metadataMatch": {"team": "red", "level": {"n": 1}},
            "eventTypes": ["*", "agent.metadata.changed"]
        }))
        .await;
    w.ok(
        "map/send",
        json!({"to": {"agent": "rf-b"}, "payload": 1, "meta": {"priority": "urgent"}}),
    )
    .await;
    b.send(json!({"agent": "rf-w"}), json!(2)).await;
    b.ok(
        "map/agents/update",
        json!({"agentId": "rf-b", "state": "busy"}),
    )
    .await;
    w.ok(
        "map/agents/update",
        json!({"agentId": "rf-w", "state": "busy"}),
    )
    .await;
    w.ok(
        "map/agents/update",
        json!({"agentId": "rf-w", "metadata": {"team": "blue", "level": {"n": 1}}}),
    )
    .await;
    w.ok(
        "map/agents/update",
        json!({"agentId": "rf-w", "metadata": {"team": "red"}}),
    )
    .await;

    let got = obs.next_event(&from_roles).await;
    assert_eq!(got["event"]["source"], json!("rf-w"));
    obs.assert_no_event(&from_roles).await;
    let got = obs.next_event(&roles).await;
    assert_eq!(got["event"]["data"]["agentId"], json!("rf-b"));
    obs.assert_no_event(&roles).await;
    let got = take(&mut obs, &urgent, 2).await;
    assert_eq!(types(&got), vec!["message_sent", "message_delivered"]);
    assert_eq!(got[0]["event"]["source"], json!("rf-w"));
    obs.assert_no_event(&urgent).await;
    let got = obs.next_event(&normal).await;
    assert_eq!(
        got["event"]["source"],
        json!("rf-b"),
        "default priority is normal"
    );
    obs.assert_no_event(&normal).await;
    let got = obs.next_event(&meta).await;
    assert_eq!(got["event"]["type"], json!("agent.metadata.changed"));
    assert_eq!(
        got["event"]["data"]["metadata"],
        json!({"team": "red", "level": {"n": 1}})
    );
    obs.assert_no_event(&meta).await;
}

#[tokio::test]
async fn exclude_own_events_hides_what_the_subscriber_caused() {
    let (_server, url) = default_server().await;
    let mut me = WsClient::agent(&url, "own-1", json!({})).await;
    let sub = me
        .subscribe_with(json!({"options": {"excludeOwnEvents": true}}))
        .await;
    let all = me.subscribe(Value::Null).await;
    me.ok(
        "map/agents/update",
        json!({"agentId": "own-1", "state": "busy"}),
    )
    .await;
    me.register_agent(json!({"agentId": "own-2"})).await;
    let mut other = WsClient::agent(&url, "other-1", json!({})).await;
    other
        .ok(
            "map/agents/update",
            json!({"agentId": "other-1", "state": "busy"}),
        )
        .await;
    let got = take(&mut me, &sub, 3).await;
    assert_eq!(
        types(&got),
        vec![
            "participant_connected",
            "agent_registered",
            "agent_state_changed"
        ]
    );
    assert_eq!(got[1]["event"]["data"]["agentId"], json!("other-1"));
    assert_eq!(got[0]["sequenceNumber"], json!(1));
    me.assert_no_event(&sub).await;
    // Without the option, the subscriber's own events come too.
    let got = take(&mut me, &all, 5).await;
    assert_eq!(got[0]["event"]["data"]["agentId"], json!("own-1"));
    assert_eq!(got[1]["event"]["data"]["agentId"], json!("own-2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_senders_produce_ordered_gap_free_events() {
    const SENDERS: usize = 4;
    const PER_SENDER: usize = 50;
    const TOTAL: usize = SENDERS * PER_SENDER;
    let (_server, url) = default_server().await;
    let mut sink = WsClient::agent(&url, "sink", json!({})).await;
    let mut senders = Vec::new();
    for i in 0..SENDERS {
        senders.push(WsClient::agent(&url, &format!("snd-{i}"), json!({})).await);
    }
    let mut obs = WsClient::client(&url).await;
    let sub = obs.subscribe(Value::Null).await;

    let reader = tokio::spawn(async move {
        let mut events = Vec::new();
        let mut delivered = 0;
        for _ in 0..10 * TOTAL {
            let ev = obs.next_event(&sub).await;
            if ev["event"]["type"] == json!("message_delivered") {
                delivered += 1;
            }
            events.push(ev);
            if delivered == TOTAL {
                break;
            }
        }
        // Nothing extra (e.g. a duplicate) follows.
        obs.assert_no_event(&sub).await;
        events
    });
    let mut tasks = Vec::new();
    for (i, mut s) in senders.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for n in 0..PER_SENDER {
                let r = s
                    .send(json!({"agent": "sink"}), json!({"i": i, "n": n}))
                    .await;
                assert_eq!(r["delivered"], json!(["sink"]));
                ids.push(r["messageId"].as_str().unwrap().to_owned());
            }
            (s, ids)
        }));
    }
    let mut sent_ids = HashSet::new();
    let mut keep = Vec::new();
    for t in tasks {
        let (s, ids) = within(Duration::from_secs(30), t).await.expect("sender");
        sent_ids.extend(ids);
        keep.push(s);
    }
    assert_eq!(sent_ids.len(), TOTAL);
    let events = within(Duration::from_secs(30), reader)
        .await
        .expect("reader");

    let mut last_id = String::new();
    let mut sent_at: HashMap<String, usize> = HashMap::new();
    let mut delivered: HashMap<String, usize> = HashMap::new();
    for (i, ev) in events.iter().enumerate() {
        assert_eq!(ev["sequenceNumber"], json!(i + 1), "gap-free sequence");
        let id = ev["eventId"].as_str().unwrap().to_owned();
        assert!(
            id > last_id,
            "eventIds strictly increase: {last_id} then {id}"
        );
        last_id = id;
        let mid = ev["event"]["data"]["messageId"].as_str().map(str::to_owned);
        match ev["event"]["type"].as_str().unwrap() {
            "message_sent" => {
                assert!(
                    sent_at.insert(mid.unwrap(), i).is_none(),
                    "one message_sent each"
                );
            }
            "message_delivered" => {
                let mid = mid.unwrap();
                let at = sent_at.get(&mid).expect("message_sent comes first");
                assert!(*at < i);
                *delivered.entry(mid).or_default() += 1;
            }
            other => panic!("unexpected event {other}"),
        }
    }
    assert_eq!(delivered.len(), TOTAL);
    assert!(
        delivered.values().all(|&n| n == 1),
        "each delivered exactly once"
    );
    assert_eq!(delivered.keys().cloned().collect::<HashSet<_>>(), sent_ids);

    // The sink got every message exactly once, each sender's in its sending order.
    let mut got = HashSet::new();
    let mut next_n = [0u64; SENDERS];
    for _ in 0..TOTAL {
        let m = sink.next_message().await;
        assert!(got.insert(m["id"].as_str().unwrap().to_owned()));
        let i = m["payload"]["i"].as_u64().unwrap() as usize;
        assert_eq!(m["payload"]["n"], json!(next_n[i]), "per-sender order");
        next_n[i] += 1;
    }
    assert_eq!(got, sent_ids);
    sink.assert_no_message().await;
}

#[tokio::test]
async fn unsubscribe_stops_events_and_is_idempotent() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let gone = obs.subscribe(Value::Null).await;
    let stays = obs.subscribe(Value::Null).await;
    let r = obs
        .ok("map/unsubscribe", json!({"subscriptionId": gone}))
        .await;
    assert_eq!(r["unsubscribed"], json!(true));
    assert_eq!(r["subscription"]["id"], json!(gone));
    assert!(r["subscription"]["closedAt"].is_u64());
    let _c = WsClient::client(&url).await;
    let ev = obs.next_event(&stays).await;
    assert_eq!(ev["event"]["type"], json!("participant_connected"));
    obs.ok("map/agents/list", Value::Null).await;
    obs.assert_no_event(&gone).await;
    // Again, or an unknown id: not an error.
    let again = obs
        .ok("map/unsubscribe", json!({"subscriptionId": gone}))
        .await;
    assert_eq!(again["unsubscribed"], json!(false));
    assert_eq!(again["subscription"]["id"], json!(gone));
    let unknown = obs
        .ok("map/unsubscribe", json!({"subscriptionId": "nope"}))
        .await;
    assert_eq!(unknown["unsubscribed"], json!(false));
    // Another session cannot close it.
    let mut other = WsClient::client(&url).await;
    let r = other
        .ok("map/unsubscribe", json!({"subscriptionId": stays}))
        .await;
    assert_eq!(r["unsubscribed"], json!(false));
    let _d = WsClient::client(&url).await;
    assert_eq!(
        obs.next_event(&stays).await["event"]["type"],
        json!("participant_connected")
    );
}

/// Emits `n` metadata events from agent `rp-1`; returns their replay records.
/// `map/replay` params that match our vendor types too, unless they give a filter: these
/// tests make their events with metadata updates, and `agent.metadata.changed` is a vendor type.
fn every(mut params: Value) -> Value {
    if params.get("filter").is_none() {
        params["filter"] =
            json!({"eventTypes": map_router::protocol::event::EventType::every_type()});
    }
    params
}

async fn metadata_events(url: &str, n: usize) -> (WsClient, Vec<Value>) {
    let mut a = WsClient::agent(url, "rp-1", json!({})).await;
    for i in 1..=n {
        a.ok(
            "map/agents/update",
            json!({"agentId": "rp-1", "metadata": {"n": i}}),
        )
        .await;
    }
    let r = a
        .ok(
            "map/replay",
            json!({"filter": {"eventTypes": ["agent.metadata.changed"]}}),
        )
        .await;
    let events = r["events"].as_array().unwrap().clone();
    assert_eq!(events.len(), n);
    (a, events)
}

fn meta_n(ev: &Value) -> Value {
    ev["event"]["data"]["changes"]["n"].clone()
}

#[tokio::test]
async fn replay_from_an_event_id_delivers_history_then_live_without_duplicates() {
    let (_server, url) = default_server().await;
    let (mut a, history) = metadata_events(&url, 5).await;
    let mut obs = WsClient::client(&url).await;
    let filter = json!({"eventTypes": ["agent.metadata.changed"]});
    let by_replay = obs
        .subscribe_with(json!({"filter": filter, "replayFrom": history[1]["eventId"]}))
        .await;
    let by_start = obs
        .subscribe_with(json!({"filter": filter, "startAfter": history[1]["eventId"]}))
        .await;
    a.ok(
        "map/agents/update",
        json!({"agentId": "rp-1", "metadata": {"n": 6}}),
    )
    .await;
    for sub in [&by_replay, &by_start] {
        let got = take(&mut obs, sub, 4).await;
        let ns: Vec<Value> = got.iter().map(meta_n).collect();
        assert_eq!(ns, vec![json!(3), json!(4), json!(5), json!(6)], "{sub}");
        for (i, e) in got.iter().enumerate() {
            assert_eq!(e["sequenceNumber"], json!(i + 1));
        }
        assert_eq!(got[0]["eventId"], history[2]["eventId"]);
        obs.assert_no_event(sub).await;
    }
    assert_invalid_params(
        &obs.err("map/subscribe", json!({"replayFrom": "not-an-id"}))
            .await,
    );
    assert_invalid_params(&obs.err("map/subscribe", json!({"replayFrom": true})).await);
}

#[tokio::test]
async fn replay_from_a_timestamp_is_inclusive() {
    let (_server, url) = default_server().await;
    let (_a, history) = metadata_events(&url, 5).await;
    let ts = history[2]["timestamp"].as_u64().unwrap();
    let expected: Vec<Value> = history
        .iter()
        .filter(|e| e["timestamp"].as_u64().unwrap() >= ts)
        .map(|e| e["eventId"].clone())
        .collect();
    let mut obs = WsClient::client(&url).await;
    let sub = obs
        .subscribe_with(json!({
            "filter": {"eventTypes": ["agent.metadata.changed"]},
            "replayFrom": ts
        }))
        .await;
    let got = take(&mut obs, &sub, expected.len()).await;
    let got_ids: Vec<Value> = got.iter().map(|e| e["eventId"].clone()).collect();
    assert_eq!(got_ids, expected);
    obs.assert_no_event(&sub).await;
}

#[tokio::test]
async fn map_replay_pages_counts_and_filters() {
    let (_server, url) = default_server().await;
    let (mut a, history) = metadata_events(&url, 5).await;
    let all = a.ok("map/replay", every(json!({}))).await;
    let all_events = all["events"].as_array().unwrap().clone();
    let total = all_events.len();
    // participant_connected, agent_registered, 5 metadata events
    assert_eq!(total, 7, "{all}");
    assert_eq!(all["totalCount"], json!(7));
    assert_eq!(all["hasMore"], json!(false));
    assert!(all.get("gap").is_none());
    for e in &all_events {
        assert_eq!(e["eventId"], e["event"]["id"]);
        assert!(e["timestamp"].is_u64());
    }

    // Paging with afterEventId.
    let mut seen = Vec::new();
    let mut after: Option<Value> = None;
    for _ in 0..10 {
        let mut p = json!({"limit": 3});
        if let Some(id) = &after {
            p["afterEventId"] = id.clone();
        }
        let page = a.ok("map/replay", every(p)).await;
        let events = page["events"].as_array().unwrap().clone();
        assert!(events.len() <= 3);
        seen.extend(events.iter().map(|e| e["eventId"].clone()));
        if page["hasMore"] != json!(true) {
            break;
        }
        after = Some(events.last().unwrap()["eventId"].clone());
    }
    let all_ids: Vec<Value> = all_events.iter().map(|e| e["eventId"].clone()).collect();
    assert_eq!(seen, all_ids);

    let first = a.ok("map/replay", every(json!({"limit": 2}))).await;
    assert_eq!(first["hasMore"], json!(true));
    assert_eq!(first["totalCount"], json!(7));
    let after = a
        .ok(
            "map/replay",
            every(json!({"afterEventId": history[2]["eventId"], "limit": 1})),
        )
        .await;
    assert_eq!(after["events"][0]["eventId"], history[3]["eventId"]);
    assert_eq!(
        after["totalCount"],
        json!(2),
        "matching events after the id"
    );
    assert_eq!(after["hasMore"], json!(true));

    let filtered = a
        .ok(
            "map/replay",
            every(json!({"filter": {"eventTypes": ["agent_registered"]}})),
        )
        .await;
    assert_eq!(filtered["totalCount"], json!(1));
    assert_eq!(
        filtered["events"][0]["event"]["data"]["agentId"],
        json!("rp-1")
    );
    // A well-formed id that was never logged is a position.
    let from_zero = a
        .ok(
            "map/replay",
            every(json!({"afterEventId": "00000000000000000000000000"})),
        )
        .await;
    assert_eq!(from_zero["totalCount"], json!(7));
    let from_end = a
        .ok(
            "map/replay",
            every(json!({"afterEventId": "7ZZZZZZZZZZZZZZZZZZZZZZZZZ"})),
        )
        .await;
    assert_eq!(from_end["events"], json!([]));
    assert_eq!(from_end["hasMore"], json!(false));
    // Timestamps.
    let ts = history[4]["timestamp"].as_u64().unwrap();
    let to = a.ok("map/replay", every(json!({"toTimestamp": ts}))).await;
    assert!(to["events"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["timestamp"].as_u64().unwrap() <= ts));
    assert!(to["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["eventId"] == history[4]["eventId"]));
    let from = a
        .ok("map/replay", every(json!({"fromTimestamp": ts})))
        .await;
    assert!(from["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["eventId"] == history[4]["eventId"]));
    assert!(from["events"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["timestamp"].as_u64().unwrap() >= ts));
    // Errors.
    assert_invalid_params(&a.err("map/replay", json!({"afterEventId": "xyz"})).await);
    assert_invalid_params(&a.err("map/replay", json!({"limit": 0})).await);
    let mut blind = WsClient::connect_as(
        &url,
        "client",
        json!({"capabilities": {"observation": {"canObserve": false}}}),
    )
    .await;
    assert_eq!(
        blind.err("map/replay", json!({})).await,
        map_error(1003, "Permission denied: observation.canObserve", "auth")
    );
}

#[tokio::test]
async fn replay_applies_visibility() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "rv-a", json!({})).await;
    a.register_agent(json!({"agentId": "rv-hidden", "visibility": "system"}))
        .await;
    let mut c = WsClient::client(&url).await;
    let r = c
        .ok(
            "map/replay",
            every(json!({"filter": {"eventTypes": ["agent_registered"]}})),
        )
        .await;
    assert_eq!(r["totalCount"], json!(1));
    assert_eq!(r["events"][0]["event"]["data"]["agentId"], json!("rv-a"));
}

#[tokio::test]
async fn a_transport_loss_orphans_agents_and_reregistering_reclaims_them() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut a = WsClient::agent(&url, "tl-1", json!({"role": "worker"})).await;
    a.ok(
        "map/agents/spawn",
        json!({"agentId": "tl-2", "parent": "tl-1"}),
    )
    .await;
    a.ok(
        "map/agents/update",
        json!({"agentId": "tl-1", "state": "busy"}),
    )
    .await;
    let pid = a.pid();
    // Every type, the vendor presence events included (they must be named).
    let sub = obs
        .subscribe(json!({"eventTypes": map_router::protocol::event::EventType::every_type()}))
        .await;
    a.drop_abruptly();

    let disc = obs.next_event(&sub).await;
    assert_eq!(disc["event"]["type"], json!("participant_disconnected"));
    assert_eq!(
        disc["event"]["data"],
        json!({"participantId": pid, "participantType": "agent", "reason": "transport_closed"})
    );
    let mut orphaned = Vec::new();
    for _ in 0..2 {
        let ev = obs.next_event(&sub).await;
        assert_eq!(ev["event"]["type"], json!("agent_orphaned"));
        assert_eq!(ev["causedBy"], json!([disc["eventId"]]));
        assert_eq!(ev["event"]["data"]["previousOwner"], json!(pid));
        let agent = ev["event"]["data"]["agentId"].as_str().unwrap().to_owned();
        // Each orphaning takes the agent offline.
        let presence = obs.next_event(&sub).await;
        assert_eq!(presence["event"]["type"], json!("agent.presence.changed"));
        assert_eq!(presence["event"]["data"]["agentId"], json!(agent));
        assert_eq!(presence["event"]["data"]["status"], json!("offline"));
        assert_eq!(presence["causedBy"], json!([ev["eventId"]]));
        orphaned.push(agent);
    }
    orphaned.sort();
    assert_eq!(orphaned, strings(&["tl-1", "tl-2"]));
    let got = obs.ok("map/agents/get", json!({"agentId": "tl-1"})).await;
    assert_eq!(got["agent"]["state"], json!("orphaned"));
    assert_eq!(got["agent"]["ownerId"], Value::Null);
    assert!(got["agent"]["lifecycle"]["orphanedAt"].is_u64());

    // The SDK's reconnect: a new connection re-registers the old id.
    let mut b = WsClient::connect_as(&url, "agent", json!({"participantId": "tl-1"})).await;
    let r = b
        .ok(
            "map/agents/register",
            json!({"agentId": "tl-1", "role": "worker"}),
        )
        .await;
    assert_eq!(r["resumed"], json!(true));
    assert_eq!(
        r["agent"]["state"],
        json!("busy"),
        "the state before orphaning"
    );
    assert_eq!(r["agent"]["ownerId"], json!(b.pid()));
    let ev = obs.event_of_type(&sub, "agent_state_changed").await;
    assert_eq!(
        ev["event"]["data"],
        json!({"agentId": "tl-1", "previousState": "orphaned", "newState": "busy", "reason": "reclaimed"})
    );
    // Its messages reach the new connection.
    obs.ok("map/send", json!({"to": {"agent": "tl-1"}, "payload": 1}))
        .await;
    assert_eq!(b.next_message().await["to"], json!({"agent": "tl-1"}));
    // Registering a live agent's id is still 3000.
    let mut c = WsClient::connect_as(&url, "agent", json!({})).await;
    assert_eq!(
        c.err("map/agents/register", json!({"agentId": "tl-1"}))
            .await,
        map_error(3000, "Agent already exists: tl-1", "agent")
    );
}

#[tokio::test]
async fn orphans_not_reclaimed_within_the_window_are_unregistered() {
    let (_server, url) = start_server(|c| c.router.resume_window_ms = 300).await;
    let mut obs = WsClient::client(&url).await;
    let a = WsClient::agent(&url, "exp-1", json!({})).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["agent_orphaned", "agent_unregistered"]}))
        .await;
    let started = std::time::Instant::now();
    a.drop_abruptly();
    let orphaned = obs.next_event(&sub).await;
    assert_eq!(orphaned["event"]["type"], json!("agent_orphaned"));
    let gone = obs.next_event(&sub).await;
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "not before the window: {:?}",
        started.elapsed()
    );
    assert_eq!(gone["event"]["type"], json!("agent_unregistered"));
    assert_eq!(
        gone["event"]["data"],
        json!({"agentId": "exp-1", "reason": "owner_disconnected"})
    );
    assert_eq!(
        obs.err("map/agents/get", json!({"agentId": "exp-1"})).await,
        map_error(2001, "Agent not found: exp-1", "routing")
    );
}

#[tokio::test]
async fn subscriptions_end_with_their_session() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let sub = obs.subscribe(Value::Null).await;
    let token = obs.ok("map/disconnect", Value::Null).await["resumeToken"].clone();
    let _c = WsClient::client(&url).await;
    obs.assert_no_event(&sub).await;
    // Resuming does not restore subscriptions.
    obs.ok("map/connect", json!({"resumeToken": token})).await;
    let _d = WsClient::client(&url).await;
    obs.assert_no_event(&sub).await;
}

#[tokio::test]
async fn envelope_caused_by_lists_only_causes_the_subscription_saw() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut a = WsClient::agent(&url, "cb-1", json!({})).await;
    let narrow = obs
        .subscribe(json!({"eventTypes": ["agent_unregistered"]}))
        .await;
    let wide = obs.subscribe(Value::Null).await;
    a.ok("map/disconnect", Value::Null).await;
    let ev = obs.next_event(&narrow).await;
    assert_eq!(ev["event"]["type"], json!("agent_unregistered"));
    let cause = ev["event"]["causedBy"].clone();
    assert_eq!(cause.as_array().map(Vec::len), Some(1), "{ev}");
    assert!(ev.get("causedBy").is_none(), "cause not shown here: {ev}");
    let disc = obs.next_event(&wide).await;
    assert_eq!(disc["event"]["type"], json!("participant_disconnected"));
    assert_eq!(json!([disc["eventId"]]), cause);
    let unreg = obs.next_event(&wide).await;
    assert_eq!(unreg["causedBy"], cause, "shown cause is listed");
}

#[tokio::test]
async fn environment_match_uses_the_current_environment() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut a = WsClient::agent(
        &url,
        "env-1",
        json!({"environment": {"os": {"type": "linux"}}}),
    )
    .await;
    a.register_agent(json!({"agentId": "env-2", "environment": {"os": {"type": "macos"}}}))
        .await;
    let sub = obs
        .subscribe_with(json!({
            "filter": {"environmentMatch": {"os.type": "linux"}, "eventTypes": ["agent_state_changed"]},
            "options": {"includeMessagePayloads": false}
        }))
        .await;
    for id in ["env-2", "env-1"] {
        a.ok("map/agents/update", json!({"agentId": id, "state": "busy"}))
            .await;
    }
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["data"]["agentId"], json!("env-1"));
    obs.assert_no_event(&sub).await;
    // After env-2 moves to linux, its events match.
    a.ok(
        "map/agents/update",
        json!({"agentId": "env-2", "environment": {"os": {"type": "linux"}}, "state": "idle"}),
    )
    .await;
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["data"]["agentId"], json!("env-2"));
}

#[tokio::test]
async fn replay_pages_are_capped_at_1000() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "cap-1", json!({})).await;
    let entry = |i: usize| {
        json!({"jsonrpc": "2.0", "id": format!("u{i}"), "method": "map/agents/update",
               "params": {"agentId": "cap-1", "metadata": {"i": i}}})
    };
    let batch: Vec<Value> = (0..1000).map(entry).collect();
    let r = a.request_raw(&Value::Array(batch).to_string()).await;
    assert_eq!(r.as_array().map(Vec::len), Some(1000));
    let batch: Vec<Value> = (1000..1005).map(entry).collect();
    a.request_raw(&Value::Array(batch).to_string()).await;
    let total = 2 + 1005;
    let page = a.ok("map/replay", every(json!({"limit": 5000}))).await;
    assert_eq!(page["events"].as_array().map(Vec::len), Some(1000));
    assert_eq!(page["hasMore"], json!(true));
    assert_eq!(page["totalCount"], json!(total));
    let default = a.ok("map/replay", every(json!({}))).await;
    assert_eq!(default["events"].as_array().map(Vec::len), Some(100));
    assert_eq!(default["hasMore"], json!(true));
}

#[tokio::test]
async fn replay_reports_a_gap_when_the_position_was_evicted() {
    let (_server, url) = start_server(|c| c.events.retention_events = 10).await;
    let mut a = WsClient::agent(&url, "gap-1", json!({})).await;
    let first = a.ok("map/replay", every(json!({}))).await["events"][0]["eventId"].clone();
    for i in 0..20 {
        a.ok(
            "map/agents/update",
            json!({"agentId": "gap-1", "metadata": {"i": i}}),
        )
        .await;
    }
    let r = a
        .ok("map/replay", every(json!({"afterEventId": first})))
        .await;
    assert_eq!(r["gap"], json!(true), "{}", r["totalCount"]);
    assert_eq!(r["totalCount"], json!(10), "only retained events");
    assert_eq!(r["events"][9]["event"]["data"]["changes"], json!({"i": 19}));
    // From a retained position there is no gap.
    let mid = r["events"][4]["eventId"].clone();
    let r = a
        .ok("map/replay", every(json!({"afterEventId": mid})))
        .await;
    assert!(r.get("gap").is_none(), "{r}");
    assert_eq!(r["totalCount"], json!(5));
}

/// A snapshot and a stream that meet exactly: `map/agents/list` (and scopes/list, graph) say
/// which event their answer is as of, and a subscription that replays from that id starts right
/// after it: what happened between the two calls arrives, what the snapshot already showed
/// does not.
#[tokio::test]
async fn a_snapshot_names_its_event_and_a_subscription_continues_from_it() {
    let (_server, url) = default_server().await;
    let _first = WsClient::agent(&url, "first", json!({})).await;
    let mut dash = WsClient::client(&url).await;
    let list = dash.ok("map/agents/list", json!({})).await;
    assert_eq!(ids(&list["agents"]), vec!["first"]);
    let as_of = list["asOf"].as_str().expect("asOf").to_owned();
    let scopes = dash.ok("map/scopes/list", json!({})).await;
    let graph = dash.ok("map/structure/graph", json!({})).await;
    assert_eq!(scopes["asOf"].as_str(), Some(as_of.as_str()), "{scopes}");
    assert_eq!(graph["asOf"].as_str(), Some(as_of.as_str()), "{graph}");
    // Something happens before the dashboard subscribes.
    let _second = WsClient::agent(&url, "second", json!({})).await;
    let sub = dash
        .subscribe_with(
            json!({"filter": {"eventTypes": ["agent_registered"]}, "replayFrom": as_of}),
        )
        .await;
    let e = dash.next_event(&sub).await;
    assert_eq!(e["event"]["data"]["agentId"], json!("second"), "{e}");
    dash.assert_no_event(&sub).await;
    // And the next snapshot is as of a later event.
    let later = dash.ok("map/agents/list", json!({})).await;
    assert!(later["asOf"].as_str().unwrap() > as_of.as_str(), "{later}");
}
