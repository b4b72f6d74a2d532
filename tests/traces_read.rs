//! `map/traces/get` (docs/traces.md, "Reading a trace back"): a trace read back from the log
//! over a real WebSocket, as the dashboard's waterfall reads it. The hops of a three-agent
//! exchange in order with their parents and timings, equal to what the OTLP export sent; a
//! failed and a queued-then-delivered hop; what each principal may see (no existence oracle, no
//! hidden agent's name, a principal without the grant refused); a trace read back after the
//! router was killed and restarted; hostile params.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::otlp::Receiver;
use common::*;
use serde_json::{json, Value};

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const WAIT: Duration = Duration::from_secs(10);
/// A ULID no event or message of these tests has.
const UNKNOWN_ULID: &str = "01HZX3K5N7Q8R9S0T1V2W3X4Y5";
const SECRET_NAME: &str = "Alice Secret Planner";

fn spans(r: &Value) -> &Vec<Value> {
    r["spans"].as_array().expect("spans")
}

fn named<'a>(r: &'a Value, name: &str) -> Vec<&'a Value> {
    spans(r)
        .iter()
        .filter(|s| s["name"] == json!(name))
        .collect()
}

fn one<'a>(r: &'a Value, name: &str) -> &'a Value {
    let found = named(r, name);
    assert_eq!(found.len(), 1, "one {name}: {r:#}");
    found[0]
}

fn ms(s: &Value, key: &str) -> u64 {
    s[key].as_u64().unwrap_or_else(|| panic!("{key} in {s}"))
}

/// Spans are sorted by start time, each ends no earlier than it starts, ids are unique and every
/// parent is a span of the answer (or `root`, a caller's span).
fn assert_well_formed(r: &Value, root: Option<&str>) {
    let all = spans(r);
    let ids: BTreeSet<&str> = all.iter().map(|s| s["spanId"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), all.len(), "unique span ids: {r:#}");
    let mut last = 0;
    for s in all {
        assert_eq!(s["traceId"], r["traceId"], "{s}");
        let (start, end) = (ms(s, "startTimeMs"), ms(s, "endTimeMs"));
        assert!(start >= last, "sorted by start: {r:#}");
        assert!(end >= start, "{s}");
        last = start;
        if let Some(p) = s.get("parentSpanId").and_then(Value::as_str) {
            assert!(
                ids.contains(p) || Some(p) == root,
                "{} has an unknown parent {p}: {r:#}",
                s["name"]
            );
        }
    }
}

/// A, B and C: A asks B (a request), B asks C under the context it was given, C answers B, B
/// answers A. Read back by A's message id (a trace the router started: no caller context), the
/// hops come in order, nested as the export nests them, with the same ids.
#[tokio::test]
async fn a_three_agent_exchange_reads_back_in_order_with_its_parents() {
    let receiver = Receiver::start().await;
    let base = receiver.base();
    let (_server, url) = start_server(move |c| {
        c.telemetry.endpoint = Some(base);
        c.telemetry.delay_ms = 20;
    })
    .await;
    let mut a = WsClient::agent(&url, "agent-a", json!({"name": "A"})).await;
    let mut b = WsClient::agent(&url, "agent-b", json!({"name": "B"})).await;
    let mut c = WsClient::agent(&url, "agent-c", json!({"name": "C"})).await;

    let sent = a
        .ok(
            "map/send",
            json!({"to": {"agent": "agent-b"}, "payload": {"q": "plan"},
                   "meta": {"expectsResponse": true, "correlationId": "q1"}}),
        )
        .await;
    let a_msg = sent["messageId"].as_str().unwrap().to_owned();
    let at_b = b.notification("map/message").await;
    let b_ctx = at_b["params"]["_meta"]["traceparent"]
        .as_str()
        .unwrap()
        .to_owned();
    b.ok(
        "map/send",
        json!({"to": {"agent": "agent-c"}, "payload": {"q": "research"},
               "meta": {"traceparent": b_ctx, "expectsResponse": true, "correlationId": "q2"}}),
    )
    .await;
    c.notification("map/message").await;
    c.ok(
        "map/send",
        json!({"to": {"agent": "agent-b"}, "payload": {"a": "found"},
               "meta": {"isResult": true, "correlationId": "q2"}}),
    )
    .await;
    b.notification("map/message").await;
    b.ok(
        "map/send",
        json!({"to": {"agent": "agent-a"}, "payload": {"a": "done"},
               "meta": {"isResult": true, "correlationId": "q1"}}),
    )
    .await;
    a.notification("map/message").await;

    let mut dash = WsClient::system(&url).await;
    let r = dash.ok("map/traces/get", json!({"messageId": a_msg})).await;
    assert_well_formed(&r, None);
    assert_eq!(r["truncated"], json!(false));
    assert!(r["examined"].as_u64().unwrap() >= 8, "{r:#}");
    let names: Vec<&str> = spans(&r)
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "invoke_agent B",
            "invoke_agent C",
            "invoke_agent B",
            "invoke_agent A"
        ],
        "the hops in order: {r:#}"
    );
    let all = spans(&r);
    let (to_b, to_c, c_reply, b_reply) = (&all[0], &all[1], &all[2], &all[3]);
    assert!(to_b.get("parentSpanId").is_none(), "the root: {to_b}");
    assert_eq!(to_b["attributes"]["messaging.message.id"], json!(a_msg));
    assert_eq!(
        b_ctx,
        format!(
            "00-{}-{}-01",
            r["traceId"].as_str().unwrap(),
            to_b["spanId"].as_str().unwrap()
        ),
        "the context B was handed is A's hop"
    );
    assert_eq!(
        to_c["parentSpanId"], to_b["spanId"],
        "B's request under A's hop"
    );
    assert_eq!(
        c_reply["parentSpanId"], to_c["spanId"],
        "C's reply under B's request"
    );
    assert_eq!(
        b_reply["parentSpanId"], to_b["spanId"],
        "B's reply under A's request"
    );
    assert_eq!(to_b["kind"], json!("client"));
    assert_eq!(to_b["status"], json!({"code": "unset"}));
    for (hop, agent) in [(to_b, "agent-b"), (to_c, "agent-c"), (b_reply, "agent-a")] {
        assert_eq!(hop["attributes"]["gen_ai.agent.id"], json!(agent), "{hop}");
        assert_eq!(hop["attributes"]["map.outcome"], json!("delivered"));
    }
    assert_eq!(b_reply["attributes"]["map.is_result"], json!(true));
    // A request lasts until its answer; the timings never go back.
    assert_eq!(to_b["attributes"]["map.replied"], json!(true));
    assert_eq!(to_c["attributes"]["map.replied"], json!(true));
    assert!(ms(to_b, "endTimeMs") >= ms(b_reply, "startTimeMs"));
    assert!(ms(to_c, "endTimeMs") >= ms(c_reply, "startTimeMs"));
    assert!(ms(to_b, "startTimeMs") <= ms(to_c, "startTimeMs"));
    assert!(ms(c_reply, "startTimeMs") <= ms(b_reply, "startTimeMs"));

    // The same spans as the export sent (ids, parents, names).
    let trace = r["traceId"].as_str().unwrap().to_owned();
    let exported = receiver
        .wait_for(WAIT, "the four hops", |s| {
            s.iter().filter(|s| s.trace_id == trace).count() >= 4
        })
        .await;
    let exported: BTreeSet<(String, String, String)> = exported
        .into_iter()
        .filter(|s| s.trace_id == trace)
        .map(|s| (s.span_id, s.parent_id, s.name))
        .collect();
    let read: BTreeSet<(String, String, String)> = all
        .iter()
        .map(|s| {
            (
                s["spanId"].as_str().unwrap().to_owned(),
                s["parentSpanId"].as_str().unwrap_or("").to_owned(),
                s["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        read, exported,
        "one span model: the log gives what was exported"
    );

    // Any event of the trace, or the trace id, gives the same trace.
    let events = replay_all(&mut dash, None).await;
    let c_reply_delivered = events
        .iter()
        .find(|e| {
            e["event"]["type"] == json!("message_delivered")
                && e["event"]["data"]["message"]["meta"]["correlationId"] == json!("q2")
        })
        .expect("the delivery of C's reply");
    let by_event = dash
        .ok(
            "map/traces/get",
            json!({"eventId": c_reply_delivered["eventId"], "windowMs": 60_000}),
        )
        .await;
    assert_eq!(by_event["spans"], r["spans"]);
    let by_trace = dash.ok("map/traces/get", json!({"traceId": trace})).await;
    assert_eq!(by_trace["spans"], r["spans"]);
    // An event in no trace is not found, as an unknown one is.
    let registered = events
        .iter()
        .find(|e| e["event"]["type"] == json!("agent_registered"))
        .unwrap();
    let e = dash
        .err("map/traces/get", json!({"eventId": registered["eventId"]}))
        .await;
    assert_eq!(e["code"], json!(17001), "{e}");
}

/// A message to an agent that is away: a fire-and-forget one fails (an error status and its
/// reason), a guaranteed one is queued, then delivered from the queue when the agent is back
/// (a child hop with `map.from_queue`).
#[tokio::test]
async fn a_failed_hop_and_a_queued_then_delivered_one() {
    let (_server, url) = start_server(|c| c.router.resume_window_ms = 5_000).await;
    let mut obs = WsClient::system(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["agent_orphaned"]}))
        .await;
    let mut sender = WsClient::agent(&url, "q-sender", json!({"name": "Sender"})).await;
    let away = WsClient::agent(&url, "q-away", json!({"name": "Away"})).await;
    away.drop_abruptly();
    obs.event_of_type(&sub, "agent_orphaned").await;

    let failed = sender
        .ok("map/send", json!({"to": {"agent": "q-away"}, "payload": 0}))
        .await;
    let kept = sender
        .ok(
            "map/send",
            json!({"to": {"agent": "q-away"}, "payload": 1, "meta": {"delivery": "guaranteed"}}),
        )
        .await;
    assert_eq!(kept["queued"], json!(["q-away"]));
    let mut back = WsClient::connect_as(&url, "agent", json!({"participantId": "q-away"})).await;
    back.ok("map/agents/register", json!({"agentId": "q-away"}))
        .await;
    back.next_message().await;

    let r = obs
        .ok("map/traces/get", json!({"messageId": failed["messageId"]}))
        .await;
    assert_well_formed(&r, None);
    let hop = one(&r, "invoke_agent Away");
    assert_eq!(hop["status"]["code"], json!("error"), "{hop}");
    assert_eq!(hop["status"]["message"], json!("recipient_offline"));
    assert_eq!(hop["attributes"]["map.outcome"], json!("failed"));
    assert_eq!(
        hop["attributes"]["map.failure.reason"],
        json!("recipient_offline")
    );
    assert_eq!(spans(&r).len(), 1, "{r:#}");

    let r = obs
        .ok("map/traces/get", json!({"messageId": kept["messageId"]}))
        .await;
    assert_well_formed(&r, None);
    let hops = named(&r, "invoke_agent Away");
    assert_eq!(
        hops.len(),
        2,
        "queued, then delivered from the queue: {r:#}"
    );
    let (queued, later) = (hops[0], hops[1]);
    assert_eq!(queued["attributes"]["map.outcome"], json!("queued"));
    assert!(queued["attributes"].get("map.from_queue").is_none());
    assert_eq!(queued["status"]["code"], json!("unset"));
    assert_eq!(later["parentSpanId"], queued["spanId"]);
    assert_eq!(later["attributes"]["map.from_queue"], json!(true));
    assert_eq!(later["attributes"]["map.outcome"], json!("delivered"));
    assert!(ms(later, "startTimeMs") >= ms(queued, "startTimeMs"));
}

/// Work a traced call causes (here a task's creation and status change under a caller's span):
/// read back by the event's id, a span under the caller's span, in the caller's trace.
#[tokio::test]
async fn a_traced_task_change_reads_back_by_its_event() {
    let (_server, url) = default_server().await;
    let mut sys = WsClient::system(&url).await;
    let parent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    sys.ok(
        "map/tasks/create",
        json!({"task": {"id": "t-traced"}, "_meta": {"traceparent": parent}}),
    )
    .await;
    // The same task changed without a context: in no trace.
    sys.ok(
        "map/tasks/update",
        json!({"taskId": "t-traced", "status": "in_progress"}),
    )
    .await;
    let events = replay_all(&mut sys, None).await;
    let of = |kind: &str| {
        events
            .iter()
            .find(|e| e["event"]["type"] == json!(kind))
            .unwrap_or_else(|| panic!("a {kind} event"))["eventId"]
            .clone()
    };
    let r = sys
        .ok("map/traces/get", json!({"eventId": of("task.created")}))
        .await;
    assert_eq!(r["traceId"], json!(CALLER_TRACE));
    let task = one(&r, "task task.created");
    assert_eq!(task["parentSpanId"], json!(CALLER_SPAN));
    assert_eq!(task["kind"], json!("internal"));
    assert_eq!(task["attributes"]["map.task.id"], json!("t-traced"));
    assert_eq!(spans(&r).len(), 1, "{r:#}");
    let untraced = events
        .iter()
        .filter(|e| {
            e["event"]["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("task."))
        })
        .find(|e| e["event"].get("_meta").is_none())
        .expect("the untraced change")["eventId"]
        .clone();
    let e = sys
        .err("map/traces/get", json!({"eventId": untraced}))
        .await;
    assert_eq!(e["code"], json!(17001), "{e}");
}

const KEYS: &str = "key-ops-0123456789 ops,key-alice-0123456789 alice,key-bob-0123456789 bob,\
                    key-carol-0123456789 carol";

/// Alice's private agent (parent-only: only she sees it), her public one, and Bob's. Bob reads
/// nothing of Alice's private trace (told what an unknown id is told), only his own hop of a
/// mixed trace, and never the private agent's name; the operator reads everything; a principal
/// without `observation.canObserve` is refused.
// NB: on a big stack, as tests/durability.rs: five clients' futures on one test thread overflow
// its 2 MiB in a debug build.
#[test]
fn each_principal_reads_only_what_it_may_see() {
    on_big_stack(principals);
}

async fn principals() {
    let (_server, url) = start_server(|c| {
        c.auth.api_keys.inline = Some(map_router::auth::config::Secret(KEYS.into()));
        c.auth.system_principals = vec!["ops".into()];
        c.permissions =
            toml::from_str("[principals.carol.observation]\ncanObserve = false\n").unwrap();
    })
    .await;
    let (mut alice, _) = connect_with_key(&url, "key-alice-0123456789", "agent", json!({})).await;
    alice
        .register_agent(json!({"agentId": "alice-pub", "name": "Alice Public"}))
        .await;
    alice
        .register_agent(json!({"agentId": "alice-secret", "name": SECRET_NAME,
                               "visibility": "parent-only"}))
        .await;
    let (mut bob, _) = connect_with_key(&url, "key-bob-0123456789", "agent", json!({})).await;
    bob.register_agent(json!({"agentId": "bob-1", "name": "Bob"}))
        .await;
    let (mut ops, _) = connect_with_key(&url, "key-ops-0123456789", "system", json!({})).await;
    let (mut carol, _) = connect_with_key(&url, "key-carol-0123456789", "client", json!({})).await;

    // Alice's private trace: her public agent asks her private one (a trace the router starts).
    let private = alice
        .ok(
            "map/send",
            json!({"to": {"agent": "alice-secret"}, "payload": {"p": 1}}),
        )
        .await;
    let private_msg = private["messageId"].as_str().unwrap().to_owned();
    alice.notification("map/message").await;
    // A mixed trace under a caller's span: to the private agent, to both, to a scope both are
    // members of, and to Bob.
    ops.ok("map/scopes/create", json!({"scopeId": "s-mixed"}))
        .await;
    for (c, agent) in [(&mut alice, "alice-secret"), (&mut bob, "bob-1")] {
        c.ok(
            "map/scopes/join",
            json!({"scopeId": "s-mixed", "agentId": agent}),
        )
        .await;
    }
    let parent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    for to in [
        json!({"agent": "alice-secret"}),
        json!({"agents": ["alice-secret", "bob-1"]}),
        json!({"scope": "s-mixed"}),
        json!({"agent": "bob-1"}),
    ] {
        alice
            .ok(
                "map/send",
                json!({"to": to, "payload": {"m": 1}, "meta": {"traceparent": parent}}),
            )
            .await;
    }
    let bob_msgs = [
        bob.notification("map/message").await,
        bob.notification("map/message").await,
        bob.notification("map/message").await,
    ];
    let bob_msg = bob_msgs[2]["params"]["message"]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Alice and the operator read her private trace.
    for reader in [&mut alice, &mut ops] {
        let r = reader
            .ok("map/traces/get", json!({"messageId": private_msg}))
            .await;
        assert_eq!(
            one(&r, &format!("invoke_agent {SECRET_NAME}"))["attributes"]["gen_ai.agent.id"],
            json!("alice-secret")
        );
    }
    let private_trace = ops
        .ok("map/traces/get", json!({"messageId": private_msg}))
        .await["traceId"]
        .as_str()
        .unwrap()
        .to_owned();
    // Bob: exactly what an unknown message or trace gives.
    let hidden = bob
        .err("map/traces/get", json!({"messageId": private_msg}))
        .await;
    let unknown = bob
        .err("map/traces/get", json!({"messageId": UNKNOWN_ULID}))
        .await;
    assert_eq!(hidden["code"], json!(17001), "{hidden}");
    assert_eq!(
        hidden.to_string().replace(&private_msg, "X"),
        unknown.to_string().replace(UNKNOWN_ULID, "X"),
        "no existence oracle"
    );
    let hidden = bob
        .err("map/traces/get", json!({"traceId": private_trace}))
        .await;
    let missing = "0123456789abcdef0123456789abcdef";
    let unknown = bob.err("map/traces/get", json!({"traceId": missing})).await;
    assert_eq!(
        hidden.to_string().replace(&private_trace, "X"),
        unknown.to_string().replace(missing, "X")
    );

    // The mixed trace: the operator sees every hop, Bob only what he may see, never the name
    // (or the id) of the private agent.
    let all = ops
        .ok("map/traces/get", json!({"traceId": CALLER_TRACE}))
        .await;
    assert_well_formed(&all, Some(CALLER_SPAN));
    assert_eq!(
        named(&all, &format!("invoke_agent {SECRET_NAME}")).len(),
        3,
        "{all:#}"
    );
    assert_eq!(named(&all, "invoke_agent Bob").len(), 3, "{all:#}");
    assert_eq!(named(&all, "send agents").len(), 1, "{all:#}");
    assert_eq!(named(&all, "send scope").len(), 1, "{all:#}");
    let seen = bob
        .ok("map/traces/get", json!({"traceId": CALLER_TRACE}))
        .await;
    assert_well_formed(&seen, Some(CALLER_SPAN));
    let text = seen.to_string();
    assert!(
        !text.contains(SECRET_NAME),
        "a hidden agent's name: {seen:#}"
    );
    assert!(
        !text.contains("alice-secret"),
        "a hidden agent's id: {seen:#}"
    );
    let direct = named(&seen, "invoke_agent Bob");
    assert!(
        direct
            .iter()
            .any(|s| s["attributes"]["messaging.message.id"] == json!(bob_msg)),
        "his own hop: {seen:#}"
    );
    assert!(spans(&seen).len() < spans(&all).len(), "{seen:#}");
    let by_message = bob
        .ok("map/traces/get", json!({"messageId": bob_msg}))
        .await;
    assert_eq!(by_message["spans"], seen["spans"]);

    // An agent Bob could see when it was messaged, hidden since (registered again, parent-only,
    // under another name): the hop he may see is there, no name of it is.
    alice
        .register_agent(json!({"agentId": "alice-temp", "name": "Temp Public"}))
        .await;
    let temp = alice
        .ok(
            "map/send",
            json!({"to": {"agent": "alice-temp"}, "payload": 1}),
        )
        .await;
    alice.notification("map/message").await;
    alice
        .ok("map/agents/unregister", json!({"agentId": "alice-temp"}))
        .await;
    alice
        .register_agent(json!({"agentId": "alice-temp", "name": "Temp Secret Name",
                               "visibility": "parent-only"}))
        .await;
    let now_hidden = bob
        .ok("map/traces/get", json!({"messageId": temp["messageId"]}))
        .await;
    let hop = &spans(&now_hidden)[0];
    assert_eq!(hop["name"], json!("deliver alice-temp"), "{now_hidden:#}");
    assert!(
        hop["attributes"].get("gen_ai.agent.name").is_none(),
        "{hop}"
    );
    let text = now_hidden.to_string();
    assert!(
        !text.contains("Temp Secret Name") && !text.contains("Temp Public"),
        "{text}"
    );
    let operator = ops
        .ok("map/traces/get", json!({"messageId": temp["messageId"]}))
        .await;
    assert_eq!(
        spans(&operator)[0]["name"],
        json!("invoke_agent Temp Secret Name")
    );

    // No grant: refused, whatever is asked.
    for params in [
        json!({"traceId": CALLER_TRACE}),
        json!({"messageId": private_msg}),
        json!({"messageId": UNKNOWN_ULID}),
    ] {
        let e = carol.err("map/traces/get", params).await;
        assert_eq!(e["code"], json!(1003), "{e}");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("observation.canObserve"),
            "{e}"
        );
    }
}

/// The trace is read from the durable log: the same after the router is killed (SIGKILL) and
/// started again on its data directory, its agents gone.
#[tokio::test]
async fn a_trace_reads_back_the_same_after_kill_9_and_a_restart() {
    let data = TempDir::new("traces-read-kill9");
    let dir = data.path.display().to_string();
    let args = ["--listen", "127.0.0.1:0", "--data-dir", dir.as_str()];
    let (mut router, url) = start_binary(args).await;
    let mut a = WsClient::agent(&url, "k-a", json!({"name": "Asker"})).await;
    let mut b = WsClient::agent(&url, "k-b", json!({"name": "Answerer"})).await;
    let sent = a
        .ok(
            "map/send",
            json!({"to": {"agent": "k-b"}, "payload": 1,
                   "meta": {"expectsResponse": true, "correlationId": "k1"}}),
        )
        .await;
    b.notification("map/message").await;
    b.ok(
        "map/send",
        json!({"to": {"agent": "k-a"}, "payload": 2,
               "meta": {"isResult": true, "correlationId": "k1"}}),
    )
    .await;
    a.notification("map/message").await;
    let ask = json!({"messageId": sent["messageId"]});
    let mut sys = WsClient::system(&url).await;
    let before = sys.ok("map/traces/get", ask.clone()).await;
    let names: Vec<&str> = spans(&before)
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["invoke_agent Answerer", "invoke_agent Asker"],
        "{before:#}"
    );
    assert_eq!(
        spans(&before)[1]["parentSpanId"],
        spans(&before)[0]["spanId"]
    );

    router.start_kill().unwrap();
    with_timeout(router.wait()).await.unwrap();
    drop((a, b, sys));
    let (_router, url) = start_binary(args).await;
    let mut sys = WsClient::system(&url).await;
    let gone = sys.ok("map/agents/list", json!({})).await;
    assert!(
        !gone.to_string().contains("k-b"),
        "its agents are gone: {gone}"
    );
    let after = sys.ok("map/traces/get", ask).await;
    assert_eq!(after["traceId"], before["traceId"]);
    assert_eq!(
        after["spans"], before["spans"],
        "the same trace from the log"
    );
}

/// Hostile params: -32602 with a message naming what is wrong; nothing else answered.
#[tokio::test]
async fn hostile_params_are_refused_clearly() {
    let (_server, url) = default_server().await;
    let mut sys = WsClient::system(&url).await;
    let cases = [
        (json!({}), "exactly one"),
        (
            json!({"traceId": CALLER_TRACE, "messageId": UNKNOWN_ULID}),
            "exactly one",
        ),
        (
            json!({"messageId": UNKNOWN_ULID, "eventId": UNKNOWN_ULID}),
            "exactly one",
        ),
        (
            json!({"traceId": "4BF92F3577B34DA6A3CE929D0E0E4736"}),
            "32 lowercase hex",
        ),
        (json!({"traceId": "4bf92f3577b34da6"}), "32 lowercase hex"),
        (
            json!({"traceId": "4bf92f3577b34da6a3ce929d0e0e473g"}),
            "32 lowercase hex",
        ),
        (
            json!({"traceId": "00000000000000000000000000000000"}),
            "not all zero",
        ),
        (json!({"traceId": "é".repeat(16)}), "32 lowercase hex"),
        (json!({"messageId": "msg-1"}), "ULID"),
        (json!({"eventId": "x".repeat(100_000)}), "ULID"),
        (
            json!({"eventId": UNKNOWN_ULID, "windowMs": 3_600_001}),
            "at most",
        ),
        (
            json!({"eventId": UNKNOWN_ULID, "windowMs": 1e30}),
            "windowMs",
        ),
        (json!({"eventId": UNKNOWN_ULID, "windowMs": -5}), "windowMs"),
        (
            json!({"eventId": UNKNOWN_ULID, "windowMs": 0}),
            "at least 1",
        ),
        (
            json!({"eventId": UNKNOWN_ULID, "windowMs": "600000"}),
            "windowMs",
        ),
        (json!({"traceId": 42}), "traceId"),
        (
            json!({"messageId": ["01HZX3K5N7Q8R9S0T1V2W3X4Y5"]}),
            "messageId",
        ),
        (json!({"eventId": {"id": UNKNOWN_ULID}}), "eventId"),
        (json!([UNKNOWN_ULID]), "named params"),
    ];
    for (params, says) in cases {
        let e = sys.err("map/traces/get", params.clone()).await;
        assert_eq!(e["code"], json!(-32602), "{params}: {e}");
        let text = e.to_string();
        assert!(text.contains(says), "{params}: {e} should say {says}");
        assert!(text.len() < 1_000, "the error does not echo the input: {e}");
    }
    // Well formed but unknown: not found, for each anchor.
    for params in [
        json!({"traceId": CALLER_TRACE}),
        json!({"messageId": UNKNOWN_ULID}),
        json!({"eventId": UNKNOWN_ULID, "windowMs": 1}),
    ] {
        let e = sys.err("map/traces/get", params.clone()).await;
        assert_eq!(e["code"], json!(17001), "{params}: {e}");
    }
    // The connection still works.
    sys.ok("map/agents/list", json!({})).await;
}
