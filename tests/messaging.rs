//! `map/send` (docs/compatibility.md §6): every address form, `delivered`, sender exclusion,
//! de-duplication per connection, capability checks, strict and lenient recipients, `from`,
//! replies to clients, and the message events.

mod common;

use common::*;
use serde_json::{json, Value};

/// Agents `a` (+ `a2` on the same connection), `b`, `c`, a client, scopes `team` = {a, b},
/// `team2` = {b, c}, `solo` = {a}.
struct World {
    a: WsClient,
    b: WsClient,
    c: WsClient,
    cl: WsClient,
}

async fn world(url: &str) -> World {
    let mut a = WsClient::agent(url, "a", json!({"role": "worker"})).await;
    a.register_agent(json!({"agentId": "a2", "role": "helper"}))
        .await;
    // `team` takes messages from anyone (the default `sendPolicy` is members only, which
    // tests/authz.rs covers).
    a.ok(
        "map/scopes/create",
        json!({"scopeId": "team", "sendPolicy": "any"}),
    )
    .await;
    for s in ["team2", "solo"] {
        a.ok("map/scopes/create", json!({"scopeId": s})).await;
    }
    a.ok(
        "map/scopes/join",
        json!({"scopeId": "team", "agentId": "a"}),
    )
    .await;
    a.ok(
        "map/scopes/join",
        json!({"scopeId": "solo", "agentId": "a"}),
    )
    .await;
    let b = WsClient::agent(
        url,
        "b",
        json!({"role": "worker", "scopes": ["team", "team2"]}),
    )
    .await;
    let c = WsClient::agent(url, "c", json!({"role": "boss", "scopes": ["team2"]})).await;
    let cl = WsClient::client(url).await;
    World { a, b, c, cl }
}

/// Sends and returns the sorted `delivered` list.
async fn delivered(sender: &mut WsClient, to: Value) -> Vec<String> {
    let r = sender.send(to, json!({"n": 1})).await;
    assert!(
        r["messageId"].as_str().is_some_and(|s| !s.is_empty()),
        "{r}"
    );
    sorted_strings(&r["delivered"])
}

#[tokio::test]
async fn string_addresses_with_and_without_prefixes() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    let r = w.a.send(json!("b"), json!({"hi": 1})).await;
    assert_eq!(r["delivered"], json!(["b"]));
    let msg = w.b.next_message().await;
    assert_eq!(msg["id"], r["messageId"]);
    assert_eq!(msg["from"], json!("a"));
    assert_eq!(msg["to"], json!("b"), "to is kept exactly as sent");
    assert_eq!(msg["payload"], json!({"hi": 1}));
    assert!(msg["timestamp"].as_u64().is_some_and(|t| t > 0));

    assert_eq!(delivered(&mut w.a, json!("agent:b")).await, strings(&["b"]));
    assert_eq!(w.b.next_message().await["to"], json!("agent:b"));
    assert_eq!(
        delivered(&mut w.a, json!("scope:team")).await,
        strings(&["b"])
    );
    assert_eq!(
        delivered(&mut w.c, json!("team")).await,
        strings(&["a", "b"])
    );
    // A string naming a participant reaches that participant.
    let cl_pid = w.cl.pid();
    assert_eq!(
        delivered(&mut w.a, json!(cl_pid.clone())).await,
        vec![cl_pid]
    );
    assert_eq!(w.cl.next_message().await["from"], json!("a"));
    // Unknown.
    assert_eq!(
        w.a.err("map/send", json!({"to": "nothing"})).await,
        map_error(2000, "Address not found: nothing", "routing")
    );
    assert_eq!(
        w.a.err("map/send", json!({"to": "agent:ghost"})).await,
        map_error(2001, "Agent not found: ghost", "routing")
    );
    assert_eq!(
        w.a.err("map/send", json!({"to": "scope:ghost"})).await,
        map_error(2002, "Scope not found: ghost", "routing")
    );
    // An id naming both an agent and a scope.
    w.a.ok("map/scopes/create", json!({"scopeId": "c"})).await;
    assert_eq!(
        w.a.err("map/send", json!({"to": "c"})).await,
        map_error(2004, "Address is ambiguous: c", "routing")
    );
    assert_eq!(delivered(&mut w.a, json!("agent:c")).await, strings(&["c"]));
    assert_invalid_params(&w.a.err("map/send", json!({"to": ""})).await);
}

#[tokio::test]
async fn agent_and_agents_addresses_dedupe_per_connection() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    assert_eq!(
        delivered(&mut w.b, json!({"agent": "a"})).await,
        strings(&["a"])
    );
    assert_eq!(w.a.next_message().await["to"], json!({"agent": "a"}));
    let r =
        w.b.send(json!({"agents": ["a", "a2", "c", "a"]}), json!(null))
            .await;
    assert_eq!(sorted_strings(&r["delivered"]), strings(&["a", "a2", "c"]));
    // One map/message per connection, however many of its agents were addressed.
    let m = w.a.next_message().await;
    assert_eq!(m["id"], r["messageId"]);
    assert_eq!(w.c.next_message().await["id"], r["messageId"]);
    w.a.assert_no_message().await;
    w.b.assert_no_message().await;
    assert_eq!(
        w.b.err("map/send", json!({"to": {"agent": "ghost"}})).await,
        map_error(2001, "Agent not found: ghost", "routing")
    );
    assert_eq!(
        w.b.err("map/send", json!({"to": {"agents": ["a", "ghost"]}}))
            .await,
        map_error(2001, "Agent not found: ghost", "routing")
    );
    // Nothing was delivered by the failed multi-send.
    w.a.assert_no_message().await;
    assert_invalid_params(&w.b.err("map/send", json!({"to": {"agents": []}})).await);
}

#[tokio::test]
async fn scope_addresses_exclude_the_sender() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    assert_eq!(
        delivered(&mut w.a, json!({"scope": "team"})).await,
        strings(&["b"])
    );
    assert_eq!(w.b.next_message().await["to"], json!({"scope": "team"}));
    w.a.assert_no_message().await;
    assert_eq!(
        delivered(&mut w.c, json!({"scope": "team"})).await,
        strings(&["a", "b"])
    );
    assert_eq!(
        delivered(&mut w.a, json!({"scope": "solo"})).await,
        Vec::<String>::new()
    );
    assert_eq!(
        w.a.err("map/send", json!({"to": {"scope": "ghost"}})).await,
        map_error(2002, "Scope not found: ghost", "routing")
    );
}

#[tokio::test]
async fn role_addresses_with_and_without_within() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    assert_eq!(
        delivered(&mut w.c, json!({"role": "worker"})).await,
        strings(&["a", "b"])
    );
    assert_eq!(
        delivered(&mut w.a, json!({"role": "worker"})).await,
        strings(&["b"])
    );
    assert_eq!(
        delivered(&mut w.c, json!({"role": "worker", "within": "team2"})).await,
        strings(&["b"])
    );
    assert_eq!(
        delivered(&mut w.c, json!({"role": "helper"})).await,
        strings(&["a2"])
    );
    assert_eq!(
        delivered(&mut w.c, json!({"role": "nobody"})).await,
        Vec::<String>::new()
    );
    assert_eq!(
        w.c.err(
            "map/send",
            json!({"to": {"role": "worker", "within": "ghost"}})
        )
        .await,
        map_error(2002, "Scope not found: ghost", "routing")
    );
}

#[tokio::test]
async fn broadcast_reaches_every_agent_but_the_senders_and_no_client() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    let r = w.b.send(json!({"broadcast": true}), json!("all")).await;
    assert_eq!(sorted_strings(&r["delivered"]), strings(&["a", "a2", "c"]));
    assert_eq!(w.a.next_message().await["id"], r["messageId"]);
    w.a.assert_no_message().await;
    assert_eq!(w.c.next_message().await["id"], r["messageId"]);
    w.b.assert_no_message().await;
    w.cl.assert_no_message().await;
}

#[tokio::test]
async fn system_address_delivers_to_nobody() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    let r = w.cl.send(json!({"system": true}), json!({"ping": 1})).await;
    assert_eq!(r["delivered"], json!([]));
    w.a.assert_no_message().await;
}

#[tokio::test]
async fn participant_addresses() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    let cl_pid = w.cl.pid();
    let r =
        w.a.send(json!({"participant": cl_pid}), json!({"acp": {}}))
            .await;
    assert_eq!(r["delivered"], json!([cl_pid]));
    let m = w.cl.next_message().await;
    assert_eq!(m["from"], json!("a"));
    assert_eq!(m["to"], json!({"participant": cl_pid}));
    assert_eq!(
        w.a.err("map/send", json!({"to": {"participant": "ghost"}}))
            .await,
        map_error(2000, "Address not found: ghost", "routing")
    );
    let (a_pid, c_pid) = (w.a.pid(), w.c.pid());
    assert_eq!(
        delivered(&mut w.b, json!({"participants": "clients"})).await,
        strings(&[&cl_pid])
    );
    assert_eq!(
        delivered(&mut w.b, json!({"participants": "agents"})).await,
        strings(&[&a_pid, &c_pid])
    );
    assert_eq!(
        delivered(&mut w.b, json!({"participants": "all"})).await,
        strings(&[&a_pid, &c_pid, &cl_pid])
    );
    assert_invalid_params(
        &w.b.err("map/send", json!({"to": {"participants": "robots"}}))
            .await,
    );
}

#[tokio::test]
async fn federated_addresses_are_5001_and_arrays_are_invalid() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    assert_eq!(
        w.a.err("map/send", json!({"to": {"system": "other", "agent": "x"}}))
            .await,
        map_error(5001, "System not found: other", "federation")
    );
    assert_invalid_params(
        &w.a.err("map/send", json!({"to": [{"agent": "b"}, {"agent": "c"}]}))
            .await,
    );
    assert_invalid_params(&w.a.err("map/send", json!({"to": 5})).await);
    assert_invalid_params(&w.a.err("map/send", json!({"to": {}})).await);
    w.b.assert_no_message().await;
}

#[tokio::test]
async fn hierarchical_addresses_are_relative_to_the_senders_agent() {
    let (_server, url) = default_server().await;
    let mut r = WsClient::agent(&url, "h-root", json!({})).await;
    let mut k1 = WsClient::agent(&url, "h-k1", json!({"parent": "h-root"})).await;
    let mut k2 = WsClient::agent(&url, "h-k2", json!({"parent": "h-root"})).await;
    let mut g = WsClient::agent(&url, "h-g", json!({"parent": "h-k1"})).await;
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        ("k1", json!({"parent": true}), vec!["h-root"]),
        ("k1", json!({"children": true}), vec!["h-g"]),
        ("k1", json!({"siblings": true}), vec!["h-k2"]),
        ("k1", json!({"ancestors": true}), vec!["h-root"]),
        ("k1", json!({"descendants": true}), vec!["h-g"]),
        (
            "k1",
            json!({"parent": true, "siblings": true}),
            vec!["h-k2", "h-root"],
        ),
        ("root", json!({"children": true}), vec!["h-k1", "h-k2"]),
        (
            "root",
            json!({"children": true, "depth": 2}),
            vec!["h-g", "h-k1", "h-k2"],
        ),
        (
            "root",
            json!({"descendants": true}),
            vec!["h-g", "h-k1", "h-k2"],
        ),
        (
            "root",
            json!({"descendants": true, "depth": 1}),
            vec!["h-k1", "h-k2"],
        ),
        ("g", json!({"ancestors": true}), vec!["h-k1", "h-root"]),
        ("g", json!({"ancestors": true, "depth": 1}), vec!["h-k1"]),
        ("g", json!({"siblings": true}), vec![]),
        ("root", json!({"siblings": true}), vec![]),
    ];
    for (who, to, expected) in cases {
        let sender = match who {
            "k1" => &mut k1,
            "root" => &mut r,
            _ => &mut g,
        };
        assert_eq!(
            delivered(sender, to.clone()).await,
            strings(&expected),
            "{who} → {to}"
        );
    }
    // The recipients got the messages (spot check, in order).
    assert_eq!(k2.next_message().await["to"], json!({"siblings": true}));
    // A sender without a parent, and a sender without an agent.
    assert_eq!(
        r.err("map/send", json!({"to": {"parent": true}})).await["code"],
        json!(2000)
    );
    let mut cl = WsClient::client(&url).await;
    let e = cl.err("map/send", json!({"to": {"children": true}})).await;
    assert_eq!(e["code"], json!(2000), "{e}");
    assert_eq!(e["data"]["category"], json!("routing"));
    assert_invalid_params(
        &k1.err("map/send", json!({"to": {"children": true, "depth": 0}}))
            .await,
    );
}

#[tokio::test]
async fn clients_may_send_directly_but_not_broadcast() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    let denied = map_error(1003, "Permission denied: messaging.canBroadcast", "auth");
    for to in [
        json!({"scope": "team"}),
        json!({"role": "worker"}),
        json!({"broadcast": true}),
        json!({"participants": "all"}),
    ] {
        assert_eq!(
            w.cl.err("map/send", json!({"to": to})).await,
            denied,
            "{to}"
        );
    }
    w.a.assert_no_message().await;
    w.b.assert_no_message().await;
    let r = w.cl.send(json!({"agent": "a"}), json!({"q": 1})).await;
    assert_eq!(r["delivered"], json!(["a"]));
    assert_eq!(w.a.next_message().await["from"], json!(w.cl.pid()));
    // Without canSend nothing goes.
    let mut mute = WsClient::connect_as(
        &url,
        "client",
        json!({"capabilities": {"messaging": {"canSend": false}}}),
    )
    .await;
    assert_eq!(
        mute.err("map/send", json!({"to": {"agent": "a"}})).await,
        map_error(1003, "Permission denied: messaging.canSend", "auth")
    );
}

#[tokio::test]
async fn a_string_scope_address_also_needs_can_broadcast() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    let denied = map_error(1003, "Permission denied: messaging.canBroadcast", "auth");
    for to in [json!("scope:team"), json!("team")] {
        assert_eq!(
            w.cl.err("map/send", json!({"to": to})).await,
            denied,
            "{to}"
        );
    }
    w.a.assert_no_message().await;
}

#[tokio::test]
async fn lenient_recipients_skip_unknown_targets() {
    let (_server, url) = start_server(|c| c.router.strict_recipients = false).await;
    let mut w = world(&url).await;
    for to in [
        json!({"agent": "ghost"}),
        json!({"scope": "ghost"}),
        json!("ghost"),
        json!({"participant": "ghost"}),
        json!({"role": "worker", "within": "ghost"}),
    ] {
        let r = w.a.send(to.clone(), json!(1)).await;
        assert_eq!(r["delivered"], json!([]), "{to}");
    }
    let r = w.a.send(json!({"agents": ["b", "ghost"]}), json!(1)).await;
    assert_eq!(r["delivered"], json!(["b"]));
    // Federated addresses are still an error.
    assert_eq!(
        w.a.err("map/send", json!({"to": {"system": "x", "agent": "y"}}))
            .await["code"],
        json!(5001)
    );
}

#[tokio::test]
async fn an_agent_replies_to_a_client_with_agent_from() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    w.cl.send(json!({"agent": "a"}), json!({"question": "?"}))
        .await;
    let request = w.a.next_message().await;
    let from = request["from"].clone();
    assert_eq!(from, json!(w.cl.pid()));
    let r =
        w.a.ok(
            "map/send",
            json!({"to": {"agent": from}, "payload": {"answer": 42},
                   "meta": {"isResult": true, "correlationId": request["id"]}}),
        )
        .await;
    assert_eq!(r["delivered"], json!([w.cl.pid()]));
    let reply = w.cl.next_message().await;
    assert_eq!(reply["from"], json!("a"));
    assert_eq!(reply["payload"], json!({"answer": 42}));
    assert_eq!(reply["meta"]["correlationId"], request["id"]);
}

#[tokio::test]
async fn meta_and_to_are_kept_untouched() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    let meta = json!({
        "protocol": "acp",
        "correlationId": "x-1",
        "priority": "high",
        "delivery": "fire-and-forget",
        "custom": {"nested": [1, 2, {"k": null}]}
    });
    let to = json!({"agents": ["b"], "extra": "kept"});
    w.a.ok("map/send", json!({"to": to, "payload": "p", "meta": meta}))
        .await;
    let m = w.b.next_message().await;
    assert_eq!(m["meta"], meta);
    assert_eq!(m["to"], to);
    assert_eq!(m["payload"], json!("p"));
    // Payload and meta may be absent.
    w.a.ok("map/send", json!({"to": {"agent": "b"}})).await;
    let m = w.b.next_message().await;
    assert!(m.get("payload").is_none() || m["payload"].is_null(), "{m}");
}

#[tokio::test]
async fn message_sent_precedes_message_delivered_which_names_its_cause() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    let sub =
        w.cl.subscribe(json!({"eventTypes": ["message_sent", "message_delivered"]}))
            .await;
    let r =
        w.a.ok(
            "map/send",
            json!({"to": {"agents": ["b", "c"]}, "payload": {"x": 1},
                   "meta": {"correlationId": "corr-1", "priority": "high"}}),
        )
        .await;
    let message_id = r["messageId"].clone();
    let sent = w.cl.next_event(&sub).await;
    assert_eq!(sent["event"]["type"], json!("message_sent"));
    assert_eq!(sent["event"]["source"], json!("a"));
    assert_eq!(sent["eventId"], sent["event"]["id"]);
    let data = &sent["event"]["data"];
    assert_eq!(data["messageId"], message_id);
    assert_eq!(data["from"], json!("a"));
    assert_eq!(data["to"], json!({"agents": ["b", "c"]}));
    assert!(data["timestamp"].is_u64());
    assert_eq!(data["correlationId"], json!("corr-1"));
    assert_eq!(data["priority"], json!("high"));
    assert_eq!(data["payload"], json!({"x": 1}));
    assert_eq!(data["message"]["id"], message_id);
    assert_eq!(data["message"]["from"], json!("a"));

    // A send to a group: one message_delivered listing every recipient, without the payload
    // (it is in message_sent).
    let d = w.cl.next_event(&sub).await;
    assert_eq!(d["event"]["type"], json!("message_delivered"));
    assert_eq!(d["event"]["source"], json!("a"));
    assert_eq!(d["causedBy"], json!([sent["eventId"]]));
    assert_eq!(d["event"]["causedBy"], json!([sent["eventId"]]));
    let data = &d["event"]["data"];
    assert_eq!(data["messageId"], message_id);
    assert_eq!(data["from"], json!("a"));
    assert_eq!(data["correlationId"], json!("corr-1"));
    assert!(data.get("payload").is_none(), "{data}");
    assert!(data.get("message").is_none(), "{data}");
    assert!(data["timestamp"].is_u64());
    let mut recipients: Vec<String> = data["deliveredTo"]
        .as_array()
        .expect("deliveredTo")
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    recipients.sort();
    assert_eq!(recipients, strings(&["b", "c"]));
    w.cl.assert_no_event(&sub).await;

    // A send to one agent: its own message_delivered, with the message.
    w.a.send(json!({"agent": "b"}), json!({"y": 2})).await;
    let sent = w.cl.next_event(&sub).await;
    assert_eq!(sent["event"]["type"], json!("message_sent"));
    let d = w.cl.next_event(&sub).await;
    assert_eq!(d["event"]["type"], json!("message_delivered"));
    assert_eq!(d["causedBy"], json!([sent["eventId"]]));
    let data = &d["event"]["data"];
    assert_eq!(data["deliveredTo"], json!(["b"]));
    assert_eq!(data["payload"], json!({"y": 2}));
    assert_eq!(data["message"]["payload"], json!({"y": 2}));
    w.cl.assert_no_event(&sub).await;
}

#[tokio::test]
async fn correlation_id_is_left_off_the_delivered_event_of_a_request() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    let sub =
        w.cl.subscribe(json!({"eventTypes": ["message_sent", "message_delivered"]}))
            .await;
    w.a.ok(
        "map/send",
        json!({"to": {"agent": "b"}, "payload": 1,
               "meta": {"correlationId": "req-1", "expectsResponse": true}}),
    )
    .await;
    let sent = w.cl.next_event(&sub).await;
    assert_eq!(sent["event"]["data"]["correlationId"], json!("req-1"));
    let delivered = w.cl.next_event(&sub).await;
    assert_eq!(delivered["event"]["type"], json!("message_delivered"));
    let data = &delivered["event"]["data"];
    assert!(data.get("correlationId").is_none(), "{data}");
    assert_eq!(data["message"]["meta"]["correlationId"], json!("req-1"));
    // The reply (not expecting a response) carries it.
    w.b.ok(
        "map/send",
        json!({"to": {"agent": "a"}, "payload": 2,
               "meta": {"correlationId": "req-1", "isResult": true}}),
    )
    .await;
    w.cl.next_event(&sub).await;
    let reply = w.cl.next_event(&sub).await;
    assert_eq!(reply["event"]["data"]["correlationId"], json!("req-1"));
    // A correlationIds filter matches both legs (the request via message.meta).
    let mut obs = WsClient::client(&url).await;
    let by_corr = obs
        .subscribe_with(json!({
            "filter": {"correlationIds": ["req-1"], "eventTypes": ["message_delivered"]},
            "replayFrom": 0
        }))
        .await;
    let first = obs.next_event(&by_corr).await;
    let second = obs.next_event(&by_corr).await;
    assert_eq!(first["event"]["data"]["deliveredTo"], json!(["b"]));
    assert_eq!(second["event"]["data"]["deliveredTo"], json!(["a"]));
}

#[tokio::test]
async fn an_offline_recipient_is_not_delivered_and_a_failure_event_says_so() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    let sub = w
        .cl
        .subscribe(json!({"eventTypes": ["agent_orphaned", "message_sent", "message_delivered", "message_failed"]}))
        .await;
    let World { a, .. } = w;
    let mut b = w.b;
    a.drop_abruptly();
    let ev = w.cl.next_event(&sub).await;
    assert_eq!(ev["event"]["type"], json!("agent_orphaned"));
    w.cl.next_event(&sub).await; // the second agent of that connection
    let r = b.send(json!({"agents": ["a", "c"]}), json!(1)).await;
    assert_eq!(r["delivered"], json!(["c"]));
    let sent = w.cl.next_event(&sub).await;
    assert_eq!(sent["event"]["type"], json!("message_sent"));
    let mut failed = None;
    let mut delivered_to = Vec::new();
    for _ in 0..2 {
        let ev = w.cl.next_event(&sub).await;
        assert_eq!(ev["causedBy"], json!([sent["eventId"]]));
        match ev["event"]["type"].as_str() {
            Some("message_failed") => failed = Some(ev["event"]["data"].clone()),
            Some("message_delivered") => {
                delivered_to.push(ev["event"]["data"]["deliveredTo"].clone())
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(delivered_to, vec![json!(["c"])]);
    assert_eq!(
        failed.expect("a message_failed event"),
        json!({
            "messageId": r["messageId"],
            "from": "b",
            "to": {"agents": ["a", "c"]},
            "recipients": ["a"],
            "reason": "recipient_offline",
            "code": 2003
        })
    );
}

#[tokio::test]
async fn a_detached_participant_is_offline_not_unknown() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    let sub =
        w.c.subscribe(json!({"eventTypes": ["message_failed"]}))
            .await;
    let pid = w.cl.pid();
    w.cl.ok("map/disconnect", Value::Null).await;
    let r = w.a.send(json!({"participant": pid}), json!(1)).await;
    assert_eq!(r["delivered"], json!([]));
    let ev = w.c.next_event(&sub).await;
    assert_eq!(ev["event"]["data"]["recipient"], json!(pid));
    assert_eq!(ev["event"]["data"]["reason"], json!("recipient_offline"));
    assert_eq!(ev["event"]["data"]["code"], json!(2003));
    w.cl.assert_no_message().await;
}

#[tokio::test]
async fn member_only_message_visibility_hides_scope_messages_from_outsiders() {
    let (_server, url) = default_server().await;
    let mut m1 = WsClient::agent(&url, "mv-1", json!({})).await;
    m1.ok(
        "map/scopes/create",
        json!({"scopeId": "mv", "messageVisibility": "members"}),
    )
    .await;
    m1.ok(
        "map/scopes/join",
        json!({"scopeId": "mv", "agentId": "mv-1"}),
    )
    .await;
    let mut m2 = WsClient::agent(&url, "mv-2", json!({"scopes": ["mv"]})).await;
    let mut outsider = WsClient::client(&url).await;
    let filter = json!({"eventTypes": ["message_sent", "message_delivered"]});
    let out_sub = outsider.subscribe(filter.clone()).await;
    let in_sub = m2.subscribe(filter).await;
    let r = m1.send(json!({"scope": "mv"}), json!("secret")).await;
    assert_eq!(r["delivered"], json!(["mv-2"]));
    let got: Vec<Value> = vec![m2.next_event(&in_sub).await, m2.next_event(&in_sub).await];
    assert_eq!(got[0]["event"]["type"], json!("message_sent"));
    assert_eq!(got[1]["event"]["type"], json!("message_delivered"));
    // A direct message is public.
    m1.send(json!({"agent": "mv-2"}), json!("open")).await;
    let ev = outsider.next_event(&out_sub).await;
    assert_eq!(ev["event"]["data"]["payload"], json!("open"));
    assert_eq!(
        ev["sequenceNumber"],
        json!(1),
        "the scope message was not shown"
    );
}

/// A group send's outcome events are split by audience: a viewer who may not see a recipient
/// (an agent with `system` visibility) gets an event listing only the recipients it may see,
/// and never one naming the hidden agent; a system viewer gets both.
#[tokio::test]
async fn a_group_delivery_never_names_a_hidden_recipient_to_those_who_may_not_see_it() {
    let (_server, url) = default_server().await;
    let mut w = world(&url).await;
    let mut h = WsClient::agent(
        &url,
        "hidden",
        json!({"visibility": "system", "scopes": ["team"]}),
    )
    .await;
    // A system participant sees (and so reaches) the hidden agent.
    let mut sys = WsClient::system(&url).await;
    let mut watcher = WsClient::system(&url).await;
    let types = json!({"eventTypes": ["message_sent", "message_delivered"]});
    let client_sub = w.cl.subscribe(types.clone()).await;
    let system_sub = watcher.subscribe(types).await;

    let r = sys.send(json!({"scope": "team"}), json!({"g": 1})).await;
    assert_eq!(
        sorted_strings(&r["delivered"]),
        strings(&["a", "b", "hidden"])
    );
    assert_eq!(h.next_message().await["id"], r["messageId"]);

    // The client: message_sent, then one message_delivered naming only `a` and `b`.
    let sent = w.cl.next_event(&client_sub).await;
    assert_eq!(sent["event"]["type"], json!("message_sent"));
    let d = w.cl.next_event(&client_sub).await;
    assert_eq!(d["event"]["type"], json!("message_delivered"));
    assert_eq!(
        sorted_strings(&d["event"]["data"]["deliveredTo"]),
        strings(&["a", "b"])
    );
    w.cl.assert_no_event(&client_sub).await;

    // The system viewer: both groups, one event each.
    let sent = watcher.next_event(&system_sub).await;
    assert_eq!(sent["event"]["type"], json!("message_sent"));
    let mut groups = Vec::new();
    for _ in 0..2 {
        let d = watcher.next_event(&system_sub).await;
        assert_eq!(d["event"]["type"], json!("message_delivered"));
        assert_eq!(d["causedBy"], json!([sent["eventId"]]));
        assert!(d["event"]["data"].get("payload").is_none());
        groups.push(sorted_strings(&d["event"]["data"]["deliveredTo"]));
    }
    groups.sort();
    assert_eq!(groups, vec![strings(&["a", "b"]), strings(&["hidden"])]);
    watcher.assert_no_event(&system_sub).await;
}
