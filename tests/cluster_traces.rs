//! Traces out in a cluster (issue 45, item 5: "spans from every node of a cluster join the same
//! traces; a relayed call is a child of the standby's span"), end to end on the real binary, a
//! real `nats-server -js` and a loopback OTLP/HTTP receiver (tests/common/otlp.rs) that both
//! nodes export to:
//!
//! - a client on the standby sends under a caller's `traceparent` to an agent on the live node
//!   and to one on the standby: the receiver gets the standby's `relay map/send` span (CLIENT,
//!   its resource's `service.instance.id` the standby's node name) under the caller's span,
//!   and the live node's `invoke_agent` span under the relay span; one tree, no unknown
//!   parents; the agent is given the `invoke_agent` span to continue from, and the message's
//!   `meta` is the sender's, untouched;
//! - an untraced send through the standby: the standby's span starts the trace and the live
//!   node's spans join it;
//! - the relay-only `relayTraceparent` parameter from a client is refused with -32602, on the
//!   live node and through the standby, and nothing is sent;
//! - a second principal's relayed calls never land in the first principal's traces.
//!
//! Every await is bounded. Needs `nats-server` on PATH (the test fails, never skips, without it).
#![cfg(feature = "cluster")]

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::cluster::{free_port, health_until, node_args, serving, start, Started};
use common::nats::Nats;
use common::otlp::{Got, Receiver};
use common::*;
use serde_json::{json, Value};

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const CALLER_SPAN_2: &str = "00f067aa0ba902b8";
const BOB_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const BOB_SPAN: &str = "b7ad6b7169203331";
const WAIT: Duration = Duration::from_secs(15);

const ALICE: &str = "key-alice-0123456789abcdef";
const BOB: &str = "key-bob-0123456789abcdef";
const AGENTS: &str = "key-agents-0123456789abcdef";

fn parent(trace: &str, span: &str) -> String {
    format!("00-{trace}-{span}-01")
}

/// The API keys file under `dir` (mode 0600): alice, bob and the agents' principal.
fn keys_file(dir: &Path) -> String {
    common::cluster::keys_file(dir, &[(ALICE, "alice"), (BOB, "bob"), (AGENTS, "agents")])
}

/// Starts node `name` (a standby with `standby`) on `nats`, exporting spans to `receiver`,
/// with authentication on (`keys`), and waits until its port accepts.
async fn spawn(
    nats: &Nats,
    dir: &Path,
    name: &str,
    standby: bool,
    keys: &str,
    receiver: &Receiver,
) -> Started {
    let port = free_port();
    let standby = if standby {
        "\nstandby = true\ntakeover_poll_ms = 100"
    } else {
        ""
    };
    // `more` goes at the end of node_args's `[cluster]`: the sections it opens end where
    // node_args's `[storage]` begins.
    let more = format!(
        "node = \"{name}\"{standby}\n\
         [auth]\n[auth.api_keys]\nfile = {keys:?}\n\
         [telemetry]\nendpoint = \"{}\"\ndelay_ms = 20",
        receiver.base()
    );
    start(node_args(&nats.url(), &dir.join(name), port, &more), port).await
}

/// An agent of the `agents` principal on `url`, registered as `id`.
async fn agent(url: &str, id: &str) -> WsClient {
    let (mut c, _) = connect_with_key(url, AGENTS, "agent", json!({})).await;
    let agent = c.register_agent(json!({"agentId": id, "name": id})).await;
    assert_eq!(agent["id"], json!(id));
    assert!(
        !agent.to_string().contains("relayTraceparent"),
        "the relay's parameter is nobody's data: {agent}"
    );
    c
}

fn in_trace<'a>(spans: &'a [Got], trace: &str) -> Vec<&'a Got> {
    spans.iter().filter(|s| s.trace_id == trace).collect()
}

fn named<'a>(spans: &[&'a Got], name: &str) -> Vec<&'a Got> {
    spans.iter().copied().filter(|s| s.name == name).collect()
}

/// Every span's parent is a span of the set or one of `roots` (empty: no parent).
fn assert_one_tree(spans: &[&Got], roots: &[&str]) {
    let ids: BTreeSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    assert_eq!(ids.len(), spans.len(), "span ids are unique: {spans:#?}");
    for s in spans {
        assert!(
            ids.contains(s.parent_id.as_str()) || roots.contains(&s.parent_id.as_str()),
            "{} has an unknown parent {:?}: {spans:#?}",
            s.name,
            s.parent_id
        );
    }
}

/// The `traceparent` an agent was given with a message (`params._meta.traceparent`).
fn given(frame: &Value) -> String {
    frame["params"]["_meta"]["traceparent"]
        .as_str()
        .unwrap_or_else(|| panic!("the frame carries the router's span: {frame}"))
        .to_owned()
}

fn node_of(s: &Got) -> &str {
    s.resource
        .get("service.instance.id")
        .map_or("", String::as_str)
}

/// The relay span of the standby `n1` for `map/send` under `parent_span` (in `trace`), and
/// the live node's `invoke_agent {agent}` span under it.
fn relayed_hop<'a>(
    spans: &'a [Got],
    trace: &str,
    parent_span: &str,
    agent: &str,
) -> (&'a Got, &'a Got) {
    let spans = in_trace(spans, trace);
    let relay: Vec<&Got> = named(&spans, "relay map/send")
        .into_iter()
        .filter(|s| s.parent_id == parent_span)
        .collect();
    assert_eq!(
        relay.len(),
        1,
        "one relay span under {parent_span}: {spans:#?}"
    );
    let relay = relay[0];
    assert_eq!(node_of(relay), "n1", "the standby made it: {relay:#?}");
    assert_eq!(relay.kind, 3, "CLIENT: {relay:#?}");
    assert_eq!(
        relay.attributes.get("map.node").map(String::as_str),
        Some("n1")
    );
    assert_eq!(
        relay.attributes.get("rpc.method").map(String::as_str),
        Some("map/send")
    );
    assert!(relay.end_ns >= relay.start_ns, "{relay:#?}");
    let hop: Vec<&Got> = named(&spans, &format!("invoke_agent {agent}"))
        .into_iter()
        .filter(|s| s.parent_id == relay.span_id)
        .collect();
    assert_eq!(
        hop.len(),
        1,
        "one invoke_agent under the relay span: {spans:#?}"
    );
    assert_eq!(
        node_of(hop[0]),
        "n0",
        "the live node made it: {:#?}",
        hop[0]
    );
    (relay, hop[0])
}

#[tokio::test]
async fn a_call_relayed_by_a_standby_is_a_child_of_the_standbys_span() {
    let nats = Nats::start("traces-relay");
    let dir = TempDir::new("cluster-traces");
    let receiver = Receiver::start().await;
    let keys = keys_file(&dir.path);
    let live = spawn(&nats, &dir.path, "n0", false, &keys, &receiver).await;
    health_until(&live.url, Duration::from_secs(20), "ok", |s, _| s == 200).await;
    let standby = spawn(&nats, &dir.path, "n1", true, &keys, &receiver).await;
    health_until(&standby.url, Duration::from_secs(20), "serving", serving).await;

    let mut on_live = agent(&live.url, "live-a").await;
    let mut on_standby = agent(&standby.url, "standby-a").await;
    let (mut alice, _) = connect_with_key(&standby.url, ALICE, "client", json!({})).await;

    // 1. Under the caller's span, to the agent on the live node: its meta stays the sender's.
    let meta = json!({"traceparent": parent(CALLER_TRACE, CALLER_SPAN), "tracestate": "rojo=1",
                      "note": {"b": 2, "a": 1}});
    alice
        .ok(
            "map/send",
            json!({"to": {"agent": "live-a"}, "payload": {"n": 1}, "meta": meta}),
        )
        .await;
    let frame = on_live.notification("map/message").await;
    assert_eq!(frame["params"]["message"]["meta"], meta, "meta untouched");
    let live_given = given(&frame);
    // 2. Under another span of the caller's, to the agent on the standby.
    alice
        .ok(
            "map/send",
            json!({"to": {"agent": "standby-a"}, "payload": {"n": 2},
                   "meta": {"traceparent": parent(CALLER_TRACE, CALLER_SPAN_2)}}),
        )
        .await;
    let standby_given = given(&on_standby.notification("map/message").await);
    // 2b. The agent on the live node asks the one on the standby, under the caller's span;
    // the reply, with no trace context of its own, is relayed under the span the request was
    // given (and the live node nests it there).
    on_live
        .ok(
            "map/send",
            json!({"to": {"agent": "standby-a"}, "payload": {"q": 1},
                   "meta": {"traceparent": parent(CALLER_TRACE, CALLER_SPAN),
                            "expectsResponse": true, "correlationId": "q1"}}),
        )
        .await;
    let request_given = given(&on_standby.notification("map/message").await);
    assert!(
        request_given.starts_with(&format!("00-{CALLER_TRACE}-")),
        "{request_given}"
    );
    on_standby
        .ok(
            "map/send",
            json!({"to": {"agent": "live-a"}, "payload": {"a": 1},
                   "meta": {"isResult": true, "correlationId": "q1"}}),
        )
        .await;
    let reply_given = given(&on_live.notification("map/message").await);
    // 2c. Again, the reply copying its request's context (as the writer nests it, so here).
    on_live
        .ok(
            "map/send",
            json!({"to": {"agent": "standby-a"}, "payload": {"q": 2},
                   "meta": {"traceparent": parent(CALLER_TRACE, CALLER_SPAN),
                            "expectsResponse": true, "correlationId": "q2"}}),
        )
        .await;
    let request2_given = given(&on_standby.notification("map/message").await);
    on_standby
        .ok(
            "map/send",
            json!({"to": {"agent": "live-a"}, "payload": {"a": 2},
                   "meta": {"isResult": true, "correlationId": "q2",
                            "traceparent": parent(CALLER_TRACE, CALLER_SPAN)}}),
        )
        .await;
    let reply2_given = given(&on_live.notification("map/message").await);
    // 3. Untraced: the standby starts the trace, the live node's spans join it.
    alice
        .ok(
            "map/send",
            json!({"to": {"agent": "live-a"}, "payload": {"n": 3}}),
        )
        .await;
    let untraced_given = given(&on_live.notification("map/message").await);
    let untraced_trace = untraced_given[3..35].to_owned();
    assert_ne!(untraced_trace, CALLER_TRACE);

    // 4. A second principal, on the same standby: untraced, and under a trace of its own.
    let (mut bob, bob_session) = connect_with_key(&standby.url, BOB, "client", json!({})).await;
    bob.ok(
        "map/send",
        json!({"to": {"agent": "live-a"}, "payload": {"n": 4}}),
    )
    .await;
    let bob_untraced = given(&on_live.notification("map/message").await)[3..35].to_owned();
    bob.ok(
        "map/send",
        json!({"to": {"agent": "live-a"}, "payload": {"n": 5},
               "meta": {"traceparent": parent(BOB_TRACE, BOB_SPAN)}}),
    )
    .await;
    let bob_traced = given(&on_live.notification("map/message").await);
    assert!(
        bob_traced.starts_with(&format!("00-{BOB_TRACE}-")),
        "{bob_traced}"
    );
    for trace in [CALLER_TRACE, untraced_trace.as_str()] {
        assert_ne!(bob_untraced, trace, "bob's call is in a trace of its own");
    }

    // 5. The relay-only parameter from a client: refused on the live node and through the
    // standby; nothing is sent.
    let forged = parent(CALLER_TRACE, "1111111111111111");
    let (mut alice_live, _) = connect_with_key(&live.url, ALICE, "client", json!({})).await;
    for c in [&mut alice_live, &mut alice, &mut bob] {
        let err = c
            .err(
                "map/send",
                json!({"to": {"agent": "live-a"}, "payload": {"n": 6},
                       "relayTraceparent": forged}),
            )
            .await;
        assert_invalid_params(&err);
        assert!(
            err.to_string().contains("relayTraceparent"),
            "the refusal names the parameter: {err}"
        );
    }

    // The spans: relay spans of the standby, hops of the live node under them.
    let spans = receiver
        .wait_for(WAIT, "the relayed hops and their relay spans", |spans| {
            let n = |trace: &str, name: &str| {
                spans
                    .iter()
                    .filter(|s| s.trace_id == trace && s.name.starts_with(name))
                    .count()
            };
            n(CALLER_TRACE, "relay map/send") >= 4
                && n(CALLER_TRACE, "invoke_agent") >= 6
                && n(&untraced_trace, "relay map/send") >= 1
                && n(&untraced_trace, "invoke_agent") >= 1
                && n(&bob_untraced, "invoke_agent") >= 1
                && n(&bob_untraced, "relay map/send") >= 1
                && n(BOB_TRACE, "invoke_agent") >= 1
                && n(BOB_TRACE, "relay map/send") >= 1
        })
        .await;
    let (_, hop) = relayed_hop(&spans, CALLER_TRACE, CALLER_SPAN, "live-a");
    assert_eq!(
        live_given,
        parent(CALLER_TRACE, &hop.span_id),
        "the agent continues from its hop"
    );
    let (_, hop) = relayed_hop(&spans, CALLER_TRACE, CALLER_SPAN_2, "standby-a");
    assert_eq!(standby_given, parent(CALLER_TRACE, &hop.span_id));
    // The request from the live node, and the reply relayed under the span it was given.
    let caller = in_trace(&spans, CALLER_TRACE);
    let request = caller
        .iter()
        .find(|s| request_given == parent(CALLER_TRACE, &s.span_id))
        .unwrap_or_else(|| panic!("the request's hop: {caller:#?}"));
    assert_eq!(request.name, "invoke_agent standby-a");
    assert_eq!(request.parent_id, CALLER_SPAN);
    assert_eq!(node_of(request), "n0");
    let (_, hop) = relayed_hop(&spans, CALLER_TRACE, &request.span_id, "live-a");
    assert_eq!(reply_given, parent(CALLER_TRACE, &hop.span_id));
    let request2 = caller
        .iter()
        .find(|s| request2_given == parent(CALLER_TRACE, &s.span_id))
        .unwrap_or_else(|| panic!("the second request's hop: {caller:#?}"));
    let (_, hop) = relayed_hop(&spans, CALLER_TRACE, &request2.span_id, "live-a");
    assert_eq!(reply2_given, parent(CALLER_TRACE, &hop.span_id));
    assert_eq!(
        caller.len(),
        10,
        "the caller's trace holds its hops and the reply only: {caller:#?}"
    );
    assert_one_tree(&caller, &[CALLER_SPAN, CALLER_SPAN_2]);

    // The untraced send: the standby's span is the root, the live node's hop under it.
    let (relay, hop) = relayed_hop(&spans, &untraced_trace, "", "live-a");
    assert!(relay.parent_id.is_empty());
    assert_eq!(untraced_given, parent(&untraced_trace, &hop.span_id));
    let untraced = in_trace(&spans, &untraced_trace);
    assert_eq!(untraced.len(), 2, "{untraced:#?}");
    assert_one_tree(&untraced, &[""]);

    // Bob's calls are in traces of their own, and nothing of his is in alice's.
    relayed_hop(&spans, &bob_untraced, "", "live-a");
    relayed_hop(&spans, BOB_TRACE, BOB_SPAN, "live-a");
    let bob_pid = bob_session["participantId"].as_str().unwrap().to_owned();
    for s in caller.iter().chain(untraced.iter()) {
        assert!(
            !s.attributes.values().any(|v| v == &bob_pid),
            "bob in alice's trace: {s:#?}"
        );
    }
    // Refused calls made no span and reached nobody.
    assert!(
        !spans.iter().any(|s| s.parent_id == "1111111111111111"),
        "a forged relay context was used"
    );
    on_live.assert_no_message().await;
    on_standby.assert_no_message().await;
}
