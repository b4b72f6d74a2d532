//! `map/send` never reaches an agent the sender may not see (found by the Python suite).
//!
//! The SDK's `AgentConnection` and our Python client connect with the agent's id as their
//! participant id. An address naming an agent the sender may not see used to fall back to the
//! participant of the same id, and so reached the hidden agent's connection and listed it in
//! `delivered`, while `map/agents/get` said 2001. docs/security.md ("Invisible things answer not
//! found") and docs/compatibility.md §9a say what must happen instead, and these tests hold the
//! router to it, over real WebSockets, for every address form:
//!
//! - an explicit address (`"id"`, `"agent:id"`, `{agent}`, `{agents}` alone or beside a visible
//!   id, `{participant}`, `{system: <ours>, agent}`) to an invisible agent answers exactly what
//!   the same address answers for an id that does not exist;
//! - a group address (`{broadcast}`, `{role}`, `{scope}`, a bare scope id, `{participants}`)
//!   reaches the visible members and leaves the invisible one out of `delivered`;
//! - a reply to an invisible agent's request (`{agent: <the request's from>}` with its
//!   `correlationId` and `isResult`, as the SDK's `reply()` sends it) reaches it: the asker showed
//!   itself by asking. Without `isResult`, with another correlation id, from one the request did
//!   not reach, or sent again without a request, the same message answers as for an absent id;
//! - in every case the invisible agent's socket receives nothing, and nothing the sender
//!   receives mentions it; a system participant still reaches it.
//!
//! Once without authentication (a hidden `[permissions.exposure.agents]` glob), once with four
//! principals (`ops` system, `alice` and `bob` ordinary, `viewer` without `messaging.canSend`) and
//! a `parent-only` agent of alice's attacked by bob and viewer.

mod common;

use common::*;
use serde_json::{json, Value};

/// An agent connected as the SDK connects one: participant id = agent id.
async fn sdk_agent(url: &str, id: &str, extra: Value) -> WsClient {
    let mut c = WsClient::connect_as(url, "agent", json!({"participantId": id})).await;
    assert_eq!(c.pid(), id, "the participant id is the agent's");
    register(&mut c, id, extra).await;
    c
}

/// The same, authenticated with an API key.
async fn sdk_agent_with_key(url: &str, key: &str, id: &str, extra: Value) -> WsClient {
    let (mut c, r) = connect_with_key(url, key, "agent", json!({"participantId": id})).await;
    assert_eq!(
        r["participantId"],
        json!(id),
        "the participant id is the agent's"
    );
    c.session = r;
    register(&mut c, id, extra).await;
    c
}

async fn register(c: &mut WsClient, id: &str, extra: Value) {
    let mut params = json!({"agentId": id});
    merge(&mut params, extra);
    assert_eq!(c.register_agent(params).await["id"], json!(id));
}

/// The explicit address forms naming `id` (`beside`: a visible agent named with it).
fn explicit_forms(id: &str, beside: &str) -> Vec<Value> {
    vec![
        json!(id),
        json!(format!("agent:{id}")),
        json!({"agent": id}),
        json!({"agents": [id]}),
        json!({"agents": [beside, id]}),
        json!({"participant": id}),
        json!({"system": "map-router", "agent": id}),
    ]
}

/// `to` with every occurrence of `from` replaced by `by`.
fn renamed(to: &Value, from: &str, by: &str) -> Value {
    serde_json::from_str(&to.to_string().replace(from, by)).unwrap()
}

/// Sends to each explicit form naming `hidden` and to the same form naming `absent` (an id
/// nobody has); asserts both are refused with the same error, the id aside.
async fn refused_as_if_absent(sender: &mut WsClient, hidden: &str, absent: &str, beside: &str) {
    for to in explicit_forms(hidden, beside) {
        let params = |to: &Value| json!({"to": to, "payload": {"probe": to}});
        let got = sender.call("map/send", params(&to)).await;
        let baseline = sender
            .call("map/send", params(&renamed(&to, hidden, absent)))
            .await;
        let (Err(got), Err(baseline)) = (got, baseline) else {
            panic!("to {to}: expected two refusals");
        };
        assert_eq!(
            got,
            renamed(&baseline, absent, hidden),
            "to {to}: the answer differs from an absent id's"
        );
    }
}

/// Sends `to` and returns the result; asserts `hidden` is not in `delivered` and `visible` is.
async fn group_send(sender: &mut WsClient, to: Value, visible: &str, hidden: &str) -> Value {
    let r = sender.send(to.clone(), json!({"group": to})).await;
    let delivered = sorted_strings(&r["delivered"]);
    assert!(delivered.contains(&visible.to_owned()), "to {to}: {r}");
    assert!(!delivered.contains(&hidden.to_owned()), "to {to}: {r}");
    assert!(!r.to_string().contains(hidden), "to {to}: {r}");
    r
}

/// The group forms reaching both `visible` and `hidden` (same role, same open scope) were
/// they both visible.
fn group_forms() -> Vec<Value> {
    vec![
        json!({"broadcast": true}),
        json!({"role": "worker"}),
        json!({"scope": "team"}),
        json!("team"),
        json!("scope:team"),
        json!({"participants": "agents"}),
        json!({"participants": "all"}),
    ]
}

/// Reads one `map/message` per group form on `visible`'s socket, in order.
async fn received_each_group_send(visible: &mut WsClient) {
    for to in group_forms() {
        let m = visible.next_message().await;
        assert_eq!(m["payload"]["group"], to, "{m}");
    }
}

/// No `map/event` on `c` (queued or within the quiet period) mentions `id`.
async fn no_event_mentions(c: &mut WsClient, id: &str) {
    let quoted = format!("\"{id}\"");
    c.assert_none_where("an event naming the invisible agent", |v| {
        v["method"] == json!("map/event") && v.to_string().contains(&quoted)
    })
    .await;
}

/// `asker` (invisible to `replier` and `bystander`) sends `replier` a request. Only the reply
/// to it, from the agent it reached, with its correlation id and `isResult` (what the SDK's
/// `reply()` sends), reaches `asker`. Sent with another correlation id, without `isResult`, or
/// by `bystander` (whom the request did not reach), the same message answers what it answers
/// for `absent`, an id nobody has.
async fn asks_and_only_its_answer_arrives(
    asker: &mut WsClient,
    replier: &mut WsClient,
    bystander: &mut WsClient,
    absent: &str,
) {
    let me = asker.pid();
    let to = replier.pid();
    let r = asker.send(json!({"agent": to}), json!({"ask": 1})).await;
    assert_eq!(r["delivered"], json!([to]));
    let asked = replier.next_message().await;
    assert_eq!(asked["from"], json!(me));
    let reply = |correlation: &Value, is_result: bool| {
        json!({"to": {"agent": me}, "payload": {"answer": 1},
               "meta": {"correlationId": correlation, "isResult": is_result}})
    };
    as_if_absent(replier, reply(&json!("no-such-request"), true), &me, absent).await;
    as_if_absent(replier, reply(&asked["id"], false), &me, absent).await;
    as_if_absent(bystander, reply(&asked["id"], true), &me, absent).await;
    let r = replier.ok("map/send", reply(&asked["id"], true)).await;
    assert_eq!(r["delivered"], json!([me]));
    let answer = asker.next_message().await;
    assert_eq!(answer["payload"], json!({"answer": 1}));
    assert_eq!(answer["from"], json!(to));
    // Answering once does not make it visible.
    as_if_absent(
        replier,
        json!({"to": {"agent": me}, "payload": 2}),
        &me,
        absent,
    )
    .await;
}

/// Sends `params` (naming `hidden`) and the same naming `absent`; asserts the same refusal.
async fn as_if_absent(c: &mut WsClient, params: Value, hidden: &str, absent: &str) {
    let got = c.err("map/send", params.clone()).await;
    let baseline = c.err("map/send", renamed(&params, hidden, absent)).await;
    assert_eq!(got, renamed(&baseline, absent, hidden), "{params}");
}

#[tokio::test]
async fn without_authentication_a_hidden_agent_is_never_reached_by_an_explicit_address() {
    let (_server, url) = start_server(|c| {
        c.permissions = toml::from_str::<toml::Value>(
            "[permissions.exposure.agents]\nhidden = [\"hid-*\"]\n\
             [permissions.exposure.scopes]\nhidden = [\"hid-*\"]\n",
        )
        .unwrap()["permissions"]
            .clone()
            .try_into()
            .unwrap();
    })
    .await;
    let mut sys = WsClient::system(&url).await;
    sys.ok(
        "map/scopes/create",
        json!({"scopeId": "team", "sendPolicy": "any"}),
    )
    .await;
    let worker = json!({"role": "worker", "scopes": ["team"]});
    let mut hidden = sdk_agent(&url, "hid-1", worker.clone()).await;
    let mut visible = sdk_agent(&url, "pub-1", worker).await;
    let mut sender = sdk_agent(&url, "snd-1", json!({"role": "lead"})).await;
    sender.subscribe(Value::Null).await;

    // What the Python suite sent, and what it must get.
    let e = sender
        .err(
            "map/send",
            json!({"to": {"agent": "hid-1"}, "payload": {"x": 1}}),
        )
        .await;
    assert_eq!(
        e,
        json!({"code": 2001, "message": "Agent not found: hid-1", "data": {"category": "routing"}})
    );
    let got = sender
        .err("map/agents/get", json!({"agentId": "hid-1"}))
        .await;
    assert_eq!(got["code"], json!(2001), "{got}");
    refused_as_if_absent(&mut sender, "hid-1", "hid-9", "pub-1").await;

    // Groups reach the visible agent only.
    for to in group_forms() {
        group_send(&mut sender, to, "pub-1", "hid-1").await;
    }
    received_each_group_send(&mut visible).await;
    visible.assert_no_message().await;

    // The hidden agent asks the sender something: the answer reaches it (the asker showed
    // itself by asking), and nothing else addressed to it does.
    asks_and_only_its_answer_arrives(&mut hidden, &mut sender, &mut visible, "hid-9").await;

    hidden.assert_no_message().await;
    no_event_mentions(&mut sender, "hid-1").await;

    // A client (no `messaging.canBroadcast`) naming a hidden scope by its bare id learns
    // nothing either: not the 1003 a scope it may see would give, but an absent id's 2000.
    sys.ok("map/scopes/create", json!({"scopeId": "hid-room"}))
        .await;
    let mut client = WsClient::client(&url).await;
    let got = client
        .err("map/send", json!({"to": "hid-room", "payload": 1}))
        .await;
    let absent = client
        .err("map/send", json!({"to": "hid-none", "payload": 1}))
        .await;
    assert_eq!(got, renamed(&absent, "hid-none", "hid-room"));
    assert_eq!(got["code"], json!(2000), "{got}");
    let visible = client
        .err("map/send", json!({"to": "team", "payload": 1}))
        .await;
    assert_eq!(visible["code"], json!(1003), "a visible scope: {visible}");

    // A system participant still reaches it, alone and in a group.
    let r = sys
        .send(json!({"agent": "hid-1"}), json!({"from": "ops"}))
        .await;
    assert_eq!(r["delivered"], json!(["hid-1"]));
    assert_eq!(
        hidden.next_message().await["payload"],
        json!({"from": "ops"})
    );
    let r = sys.send(json!({"role": "worker"}), json!({"all": 1})).await;
    assert_eq!(
        sorted_strings(&r["delivered"]),
        strings(&["hid-1", "pub-1"])
    );
    assert_eq!(hidden.next_message().await["payload"], json!({"all": 1}));
    hidden.assert_no_message().await;
}

const OPS: &str = "key-ops-0123456789abcdef";
const ALICE: &str = "key-alice-0123456789abcdef";
const BOB: &str = "key-bob-0123456789abcdef";
const VIEWER: &str = "key-viewer-0123456789abcdef";

#[test]
fn between_principals_a_parent_only_agent_is_never_reached_by_another() {
    // Its future's frame is large in a debug build (see tests/authz.rs).
    on_big_stack(between_principals);
}

async fn between_principals() {
    let (_server, url) = start_server(|c| {
        c.auth.api_keys.inline = Some(map_router::auth::config::Secret(format!(
            "{OPS} ops\n{ALICE} alice\n{BOB} bob\n{VIEWER} viewer"
        )));
        c.auth.system_principals = vec!["ops".into()];
        c.permissions = toml::from_str::<toml::Value>(
            "[permissions.principals.\"viewer\".messaging]\ncanSend = false\n",
        )
        .unwrap()["permissions"]
            .clone()
            .try_into()
            .unwrap();
    })
    .await;
    let (mut ops, _) = connect_with_key(&url, OPS, "system", json!({})).await;
    ops.ok(
        "map/scopes/create",
        json!({"scopeId": "team", "sendPolicy": "any"}),
    )
    .await;
    let worker = json!({"role": "worker", "scopes": ["team"]});
    let mut private = sdk_agent_with_key(
        &url,
        ALICE,
        "al-1",
        json!({"role": "worker", "scopes": ["team"], "visibility": "parent-only"}),
    )
    .await;
    let mut public = sdk_agent_with_key(&url, ALICE, "al-pub", worker).await;
    let mut bob = sdk_agent_with_key(&url, BOB, "bob-1", json!({"role": "lead"})).await;
    let (mut viewer, _) = connect_with_key(&url, VIEWER, "client", json!({})).await;
    bob.subscribe(Value::Null).await;

    // Bob: every explicit form is "not found", exactly as for an id nobody has.
    let e = bob
        .err(
            "map/send",
            json!({"to": {"agent": "al-1"}, "payload": {"x": 1}}),
        )
        .await;
    assert_eq!(
        e,
        json!({"code": 2001, "message": "Agent not found: al-1", "data": {"category": "routing"}})
    );
    refused_as_if_absent(&mut bob, "al-1", "al-9", "al-pub").await;
    // Groups reach alice's public agent, never the private one.
    for to in group_forms() {
        group_send(&mut bob, to, "al-pub", "al-1").await;
    }
    received_each_group_send(&mut public).await;
    // Alice's private agent asks bob: his answer reaches it, nothing else of his does.
    asks_and_only_its_answer_arrives(&mut private, &mut bob, &mut public, "al-9").await;

    // The viewer may not send at all: the same 1003 whoever is named.
    for to in explicit_forms("al-1", "al-pub") {
        let got = viewer
            .err("map/send", json!({"to": to, "payload": 1}))
            .await;
        let absent = viewer
            .err(
                "map/send",
                json!({"to": renamed(&to, "al-1", "al-9"), "payload": 1}),
            )
            .await;
        assert_eq!(got["code"], json!(1003), "{got}");
        assert_eq!(got, absent, "to {to}");
    }

    private.assert_no_message().await;
    public.assert_no_message().await;
    no_event_mentions(&mut bob, "al-1").await;

    // The operator reaches it.
    let r = ops.send(json!({"agent": "al-1"}), json!({"op": 1})).await;
    assert_eq!(r["delivered"], json!(["al-1"]));
    assert_eq!(private.next_message().await["payload"], json!({"op": 1}));
    private.assert_no_message().await;
}
