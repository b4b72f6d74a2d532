//! Traces out (docs/traces.md) against a loopback OTLP/HTTP receiver (tests/common/otlp.rs,
//! protobuf decoded with opentelemetry-proto): the span tree of a multi-agent exchange under a
//! caller's `traceparent`, replies nested under their requests, a send to a group, a trace the
//! router starts, what an agent is given to continue from, content kept out unless asked for,
//! and the exporter's behaviour when the collector is slow or down.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use std::sync::Arc;

use common::otlp::{Got, Receiver};
use common::*;
use map_router::router::traces::{AgentFacts, Settings, SpanModel};
use serde_json::json;

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const SECRET_TEXT: &str = "the-launch-code-is-4711";
const WAIT: Duration = Duration::from_secs(10);

fn caller_parent() -> String {
    format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")
}

async fn traced_server(receiver: &Receiver, content: bool) -> (map_router::server::Server, String) {
    let base = receiver.base();
    start_server(move |c| {
        c.telemetry.endpoint = Some(base);
        c.telemetry.delay_ms = 20;
        c.telemetry.capture_content = content;
        c.telemetry.headers.insert("x-team".into(), "blue".into());
        c.telemetry.service_name = Some("router-under-test".into());
    })
    .await
}

fn in_trace<'a>(spans: &'a [Got], trace: &str) -> Vec<&'a Got> {
    spans.iter().filter(|s| s.trace_id == trace).collect()
}

fn by_name<'a>(spans: &[&'a Got], name: &str) -> Vec<&'a Got> {
    spans.iter().copied().filter(|s| s.name == name).collect()
}

/// Every span's parent is a span of the set, or `root` (the caller's span).
fn assert_one_tree(spans: &[&Got], root: Option<&str>) {
    let ids: BTreeSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    assert_eq!(ids.len(), spans.len(), "span ids are unique: {spans:#?}");
    for s in spans {
        let known = ids.contains(s.parent_id.as_str())
            || Some(s.parent_id.as_str()) == root
            || (root.is_none() && s.parent_id.is_empty());
        assert!(
            known,
            "{} has an unknown parent {:?}: {spans:#?}",
            s.name, s.parent_id
        );
    }
}

#[tokio::test]
async fn a_three_agent_exchange_is_one_tree_under_the_callers_span() {
    let receiver = Receiver::start().await;
    let (_server, url) = traced_server(&receiver, false).await;
    let mut caller = WsClient::client(&url).await;
    let mut planner = WsClient::agent(&url, "planner-1", json!({"name": "planner"})).await;
    let mut researcher = WsClient::agent(&url, "researcher-1", json!({"name": "researcher"})).await;
    let mut writer = WsClient::agent(&url, "writer-1", json!({"name": "writer"})).await;
    planner
        .ok("map/scopes/create", json!({"scopeId": "team"}))
        .await;
    researcher
        .ok(
            "map/scopes/join",
            json!({"scopeId": "team", "agentId": "researcher-1"}),
        )
        .await;
    writer
        .ok(
            "map/scopes/join",
            json!({"scopeId": "team", "agentId": "writer-1"}),
        )
        .await;

    // 1. The caller asks the planner, under its own span.
    caller
        .ok(
            "map/send",
            json!({"to": {"agent": "planner-1"}, "payload": {"text": SECRET_TEXT},
                   "meta": {"traceparent": caller_parent(), "tracestate": "rojo=1"}}),
        )
        .await;
    let frame = planner.notification("map/message").await;
    let planner_ctx = frame["params"]["_meta"]["traceparent"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        frame["params"]["message"]["meta"]["traceparent"],
        json!(caller_parent()),
        "the sender's meta is untouched"
    );
    assert!(
        planner_ctx.starts_with(&format!("00-{CALLER_TRACE}-")),
        "{planner_ctx}"
    );

    // 2. The planner continues from the span it was given: asks the researcher (a request).
    planner
        .ok(
            "map/send",
            json!({"to": {"agent": "researcher-1"}, "payload": {"text": SECRET_TEXT},
                   "meta": {"traceparent": planner_ctx, "expectsResponse": true,
                            "correlationId": "q1"}}),
        )
        .await;
    let request = researcher.notification("map/message").await;
    let request_id = request["params"]["message"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let researcher_ctx = request["params"]["_meta"]["traceparent"]
        .as_str()
        .unwrap()
        .to_owned();
    // 3. The researcher answers with no trace context of its own: nested under the request.
    researcher
        .ok(
            "map/send",
            json!({"to": {"agent": "planner-1"}, "payload": {"text": SECRET_TEXT},
                   "meta": {"isResult": true, "correlationId": "q1"}}),
        )
        .await;
    let reply = planner.notification("map/message").await;
    assert_eq!(
        reply["params"]["message"]["meta"]["correlationId"],
        json!("q1")
    );
    // 4. The planner tells the team (a scope: a send span with a child per member).
    planner
        .ok(
            "map/send",
            json!({"to": {"scope": "team"}, "payload": {"text": "go"},
                   "meta": {"traceparent": planner_ctx}}),
        )
        .await;
    writer.notification("map/message").await;
    researcher.notification("map/message").await;

    let spans = receiver
        .wait_for(WAIT, "the exchange's spans", |s| {
            s.iter().filter(|s| s.trace_id == CALLER_TRACE).count() >= 6
        })
        .await;
    let trace = in_trace(&spans, CALLER_TRACE);
    assert_one_tree(&trace, Some(CALLER_SPAN));
    // Two hops reach the planner: the caller's question and the researcher's answer.
    let planner_hops = by_name(&trace, "invoke_agent planner");
    assert_eq!(planner_hops.len(), 2, "{trace:#?}");
    let planner_span = planner_hops
        .iter()
        .find(|s| s.parent_id == CALLER_SPAN)
        .expect("parented under the caller, not linked");
    assert_eq!(
        planner_ctx,
        format!("00-{CALLER_TRACE}-{}-01", planner_span.span_id)
    );
    assert_eq!(planner_span.kind, 3, "CLIENT");
    for (k, v) in [
        ("gen_ai.operation.name", "invoke_agent"),
        ("gen_ai.agent.id", "planner-1"),
        ("gen_ai.agent.name", "planner"),
        ("map.outcome", "delivered"),
        ("map.address", "agent"),
    ] {
        assert_eq!(
            planner_span.attributes.get(k).map(String::as_str),
            Some(v),
            "{k}: {planner_span:#?}"
        );
    }
    assert_eq!(
        planner_span
            .resource
            .get("service.name")
            .map(String::as_str),
        Some("router-under-test")
    );

    let researcher_spans = by_name(&trace, "invoke_agent researcher");
    let asked = researcher_spans
        .iter()
        .find(|s| s.attributes.get("messaging.message.id") == Some(&request_id))
        .expect("the request's hop");
    assert_eq!(
        asked.parent_id, planner_span.span_id,
        "the planner's call is its child"
    );
    assert_eq!(
        researcher_ctx,
        format!("00-{CALLER_TRACE}-{}-01", asked.span_id)
    );
    let answer = planner_hops
        .iter()
        .find(|s| s.attributes.get("map.is_result").map(String::as_str) == Some("true"))
        .expect("the reply's hop");
    assert_eq!(
        answer.parent_id, asked.span_id,
        "the reply is nested under the request it answers"
    );
    // The request's hop waited for its answer: it lasts until the reply was sent.
    assert!(asked.end_ns >= answer.start_ns, "{asked:#?} {answer:#?}");
    assert_eq!(
        asked.attributes.get("map.replied").map(String::as_str),
        Some("true")
    );

    let send = by_name(&trace, "send scope");
    assert_eq!(send.len(), 1, "{trace:#?}");
    assert_eq!(send[0].kind, 4, "PRODUCER");
    assert_eq!(
        send[0].attributes.get("map.scope").map(String::as_str),
        Some("team")
    );
    let members: BTreeSet<&str> = trace
        .iter()
        .filter(|s| s.parent_id == send[0].span_id)
        .map(|s| s.attributes["gen_ai.agent.id"].as_str())
        .collect();
    assert_eq!(members, BTreeSet::from(["researcher-1", "writer-1"]));

    // No payload text anywhere by default.
    for s in &spans {
        for v in s.attributes.values() {
            assert!(!v.contains(SECRET_TEXT), "payload text exported: {s:#?}");
        }
    }
    // The operator's headers went with every export.
    assert!(receiver
        .headers()
        .iter()
        .all(|h| h.get("x-team").is_some_and(|v| v == "blue")));

    // One model: the same spans from the log read back (what the dashboard's waterfall draws).
    let mut system = WsClient::system(&url).await;
    let events = replay_all(&mut system, None).await;
    let names: BTreeMap<&str, &str> = [
        ("planner-1", "planner"),
        ("researcher-1", "researcher"),
        ("writer-1", "writer"),
    ]
    .into();
    let mut model = SpanModel::new(Settings::default());
    let mut from_log = BTreeSet::new();
    for e in &events {
        let text = e["event"].to_string();
        for s in model.observe_logged(&text, &|id| {
            names.get(id).map(|n| AgentFacts {
                name: Arc::from(*n),
                role: None,
            })
        }) {
            let parent = s.parent_id.map(|p| hex(&p)).unwrap_or_default();
            from_log.insert((hex(&s.trace_id), hex(&s.span_id), parent, s.name));
        }
    }
    for s in model.finish() {
        let parent = s.parent_id.map(|p| hex(&p)).unwrap_or_default();
        from_log.insert((hex(&s.trace_id), hex(&s.span_id), parent, s.name));
    }
    let exported: BTreeSet<_> = receiver
        .spans()
        .into_iter()
        .map(|s| (s.trace_id, s.span_id, s.parent_id, s.name))
        .collect();
    assert_eq!(
        from_log, exported,
        "the log gives the spans that were exported"
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[tokio::test]
async fn an_untraced_send_starts_a_trace_and_content_is_exported_only_when_asked() {
    for content in [false, true] {
        let receiver = Receiver::start().await;
        let (_server, url) = traced_server(&receiver, content).await;
        let mut alice = WsClient::agent(&url, "alice", json!({})).await;
        let mut bob = WsClient::agent(&url, "bob", json!({"name": "Bob"})).await;
        let sent = alice
            .ok(
                "map/send",
                json!({"to": {"agent": "bob"}, "payload": {"text": SECRET_TEXT}}),
            )
            .await;
        let frame = bob.notification("map/message").await;
        assert!(
            frame["params"]["message"]["meta"].is_null(),
            "no meta added to the message: {frame}"
        );
        let ctx = frame["params"]["_meta"]["traceparent"]
            .as_str()
            .unwrap()
            .to_owned();
        let spans = receiver
            .wait_for(WAIT, "the root span", |s| !s.is_empty())
            .await;
        let root = &spans[0];
        assert_eq!(root.name, "invoke_agent Bob");
        assert!(root.parent_id.is_empty(), "a root: {root:#?}");
        assert_eq!(ctx, format!("00-{}-{}-01", root.trace_id, root.span_id));
        assert_eq!(
            root.attributes["messaging.message.id"],
            sent["messageId"].as_str().unwrap()
        );
        let exported = root.attributes.get("map.message.payload");
        if content {
            assert!(
                exported.is_some_and(|p| p.contains(SECRET_TEXT)),
                "{root:#?}"
            );
        } else {
            assert!(exported.is_none(), "{root:#?}");
        }
    }
}

#[tokio::test]
async fn without_telemetry_frames_are_as_before() {
    let (_server, url) = default_server().await;
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    let mut bob = WsClient::agent(&url, "bob", json!({})).await;
    alice.send(json!({"agent": "bob"}), json!({"x": 1})).await;
    let frame = bob.notification("map/message").await;
    assert!(frame["params"].get("_meta").is_none(), "{frame}");
}

#[tokio::test]
async fn a_collector_down_or_slow_costs_spans_not_sends() {
    // Nothing listens there: every export fails.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let (server, url) = start_server(move |c| {
        c.telemetry.endpoint = Some(format!("http://127.0.0.1:{port}"));
        c.telemetry.delay_ms = 10;
        c.telemetry.queue = 8;
        c.telemetry.batch = 4;
        c.telemetry.timeout_ms = 200;
        c.metrics.enabled = true;
        c.metrics.public = true;
    })
    .await;
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    let mut bob = WsClient::agent(&url, "bob", json!({})).await;
    for i in 0..200 {
        within(
            Duration::from_secs(2),
            alice.send(json!({"agent": "bob"}), json!({"i": i})),
        )
        .await;
    }
    for _ in 0..200 {
        bob.notification("map/message").await;
    }
    let addr = server.local_addrs()[0];
    let until = tokio::time::Instant::now() + WAIT;
    loop {
        let text = metrics_text(addr).await;
        let dropped = counter(&text, "map_telemetry_spans_dropped_total");
        assert_eq!(counter(&text, "map_telemetry_spans_exported_total"), 0);
        if dropped == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "dropped {dropped} of 200:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn metrics_text(addr: std::net::SocketAddr) -> String {
    let r = common::http::request(addr, "GET", "/metrics", &[], b"").await;
    assert_eq!(r.status, 200);
    String::from_utf8(r.body).unwrap()
}

fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.trim().parse::<f64>().ok())
        })
        .unwrap_or_else(|| panic!("no {name} in\n{text}")) as u64
}

const KEYS: &str = "key-ops-0123456789 ops,key-alice-0123456789 alice,key-bob-0123456789 bob,\
                    key-mallory-0123456789 mallory";

/// Several principals: a reply cannot be grafted into another's request, the router's span
/// reaches the recipient's socket only, and a principal without grants exports nothing.
#[tokio::test]
async fn principals_cannot_graft_spans_into_anothers_request() {
    let receiver = Receiver::start().await;
    let base = receiver.base();
    let (_server, url) = start_server(move |c| {
        c.telemetry.endpoint = Some(base);
        c.telemetry.delay_ms = 20;
        c.auth.api_keys.inline = Some(map_router::auth::config::Secret(KEYS.into()));
        c.auth.system_principals = vec!["ops".into()];
        c.permissions = toml::from_str("[principals.mallory.messaging]\ncanSend = true\n").unwrap();
    })
    .await;
    let (mut alice, _) = connect_with_key(&url, "key-alice-0123456789", "agent", json!({})).await;
    alice
        .register_agent(json!({"agentId": "alice-1", "name": "alice"}))
        .await;
    let (mut bob, _) = connect_with_key(&url, "key-bob-0123456789", "agent", json!({})).await;
    bob.register_agent(json!({"agentId": "bob-1", "name": "bob"}))
        .await;
    let (mut mallory, _) =
        connect_with_key(&url, "key-mallory-0123456789", "agent", json!({})).await;
    mallory
        .register_agent(json!({"agentId": "mallory-1"}))
        .await;

    alice
        .ok(
            "map/send",
            json!({"to": {"agent": "bob-1"}, "payload": {"q": 1},
                   "meta": {"traceparent": caller_parent(), "expectsResponse": true,
                            "correlationId": "ask-1"}}),
        )
        .await;
    let asked = bob.notification("map/message").await;
    let bob_ctx = asked["params"]["_meta"]["traceparent"]
        .as_str()
        .unwrap()
        .to_owned();
    // Mallory answers a request she never got, naming its correlation id.
    mallory
        .ok(
            "map/send",
            json!({"to": {"agent": "alice-1"}, "payload": {"forged": true},
                   "meta": {"isResult": true, "correlationId": "ask-1"}}),
        )
        .await;
    let forged = alice.notification("map/message").await;
    assert_eq!(forged["params"]["message"]["from"], json!("mallory-1"));
    // Bob's real answer.
    bob.ok(
        "map/send",
        json!({"to": {"agent": "alice-1"}, "payload": {"a": 1},
               "meta": {"isResult": true, "correlationId": "ask-1"}}),
    )
    .await;
    alice.notification("map/message").await;
    // The router's span for Bob reached Bob's socket only.
    mallory
        .assert_none_where("a map/message", |v| v["method"] == json!("map/message"))
        .await;

    let spans = receiver
        .wait_for(WAIT, "three hops", |s| s.len() >= 3)
        .await;
    let bob_hop = spans.iter().find(|s| s.name == "invoke_agent bob").unwrap();
    assert_eq!(bob_ctx, format!("00-{CALLER_TRACE}-{}-01", bob_hop.span_id));
    let answers: Vec<&Got> = spans
        .iter()
        .filter(|s| s.name == "invoke_agent alice")
        .collect();
    assert_eq!(answers.len(), 2, "{spans:#?}");
    let real = answers
        .iter()
        .find(|s| s.attributes["map.sender"] == "bob-1")
        .unwrap();
    assert_eq!(
        real.parent_id, bob_hop.span_id,
        "Bob's answer is nested under Bob's hop"
    );
    let fake = answers
        .iter()
        .find(|s| s.attributes["map.sender"] == "mallory-1")
        .unwrap();
    assert_ne!(
        fake.trace_id, CALLER_TRACE,
        "Mallory's answer is not grafted into Alice's trace"
    );
    assert!(fake.parent_id.is_empty(), "a trace of its own: {fake:#?}");
}

/// Hostile and odd input: an invalid traceparent starts a trace of the router's own; a
/// caller that said "not sampled" gets no spans and no context in the frame; a failed hop has
/// an error status; a message queued for an agent that is away and delivered when it is back
/// is a child of the message's span.
#[tokio::test]
async fn invalid_unsampled_failed_and_queued_messages() {
    let receiver = Receiver::start().await;
    let (_server, url) = traced_server(&receiver, false).await;
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    let mut bob = WsClient::agent(&url, "bob", json!({})).await;

    for bad in [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\",\"x\":\"",
    ] {
        alice
            .ok(
                "map/send",
                json!({"to": {"agent": "bob"}, "payload": 1, "meta": {"traceparent": bad}}),
            )
            .await;
        let frame = bob.notification("map/message").await;
        let ctx = frame["params"]["_meta"]["traceparent"].as_str().unwrap();
        assert!(!ctx.contains(CALLER_TRACE), "{bad}: {ctx}");
        assert_eq!(
            frame["params"]["message"]["meta"]["traceparent"],
            json!(bad),
            "kept as sent"
        );
    }
    let unsampled = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-00");
    alice
        .ok(
            "map/send",
            json!({"to": {"agent": "bob"}, "payload": 2, "meta": {"traceparent": unsampled}}),
        )
        .await;
    let frame = bob.notification("map/message").await;
    assert!(
        frame["params"].get("_meta").is_none(),
        "not sampled: no context handed on: {frame}"
    );

    // A failed hop: an agent whose outbox is gone (a participant id that left).
    let mut carol = WsClient::agent(&url, "carol", json!({"name": "Carol"})).await;
    carol
        .ok(
            "map/agents/update",
            json!({"agentId": "carol", "metadata": {}}),
        )
        .await;
    carol.drop_abruptly();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = alice
        .call("map/send", json!({"to": {"agent": "carol"}, "payload": 3}))
        .await;
    // Queued (if carol may come back) or failed: both end the hop, with its outcome.
    let _ = r;
    let spans = receiver
        .wait_for(WAIT, "the carol hop", |s| {
            s.iter().any(|s| s.name == "invoke_agent Carol")
        })
        .await;
    let carol_hop = spans
        .iter()
        .find(|s| s.name == "invoke_agent Carol")
        .unwrap();
    let outcome = carol_hop.attributes["map.outcome"].as_str();
    assert!(matches!(outcome, "failed" | "queued"), "{carol_hop:#?}");
    if outcome == "failed" {
        assert_eq!(carol_hop.status_code, 2, "an error status: {carol_hop:#?}");
        assert!(carol_hop.attributes.contains_key("map.failure.reason"));
    }
    assert!(
        !spans.iter().any(|s| s.trace_id == CALLER_TRACE),
        "no span of the unsampled or invalid contexts: {spans:#?}"
    );
}

/// A request nobody answers: its hop is ended at its delivery once `reply_wait_ms` passed, by
/// the next event or, on an idle router, by the router's flush every few seconds.
#[tokio::test]
async fn an_unanswered_request_is_ended_at_its_delivery() {
    let receiver = Receiver::start().await;
    let base = receiver.base();
    let (_server, url) = start_server(move |c| {
        c.telemetry.endpoint = Some(base);
        c.telemetry.delay_ms = 20;
        c.telemetry.reply_wait_ms = 200;
    })
    .await;
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    let mut bob = WsClient::agent(&url, "bob", json!({})).await;
    let ask = json!({"to": {"agent": "bob"}, "payload": 1, "meta": {"expectsResponse": true}});
    let first = alice.ok("map/send", ask.clone()).await;
    bob.notification("map/message").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(receiver.spans().is_empty(), "held while it may be answered");
    // The next event ends it.
    alice.send(json!({"agent": "bob"}), json!(2)).await;
    let spans = receiver
        .wait_for(WAIT, "the unanswered hop", |s| {
            s.iter().any(|s| {
                s.attributes["messaging.message.id"] == first["messageId"].as_str().unwrap()
            })
        })
        .await;
    let hop = spans
        .iter()
        .find(|s| s.attributes["messaging.message.id"] == first["messageId"].as_str().unwrap())
        .unwrap();
    assert!(!hop.attributes.contains_key("map.replied"), "{hop:#?}");
    assert!(
        hop.end_ns - hop.start_ns < 200_000_000,
        "ended at its delivery: {hop:#?}"
    );
    // An idle router: the flush ends it.
    let second = alice.ok("map/send", ask).await;
    bob.notification("map/message").await;
    receiver
        .wait_for(WAIT, "the idle router's flush", |s| {
            s.iter().any(|s| {
                s.attributes["messaging.message.id"] == second["messageId"].as_str().unwrap()
            })
        })
        .await;
}
