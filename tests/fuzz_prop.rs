//! The short, bounded fuzz pass that runs with every `cargo test`: proptest drives the same
//! three entry points as the cargo-fuzz targets in `fuzz/` (`map_router::fuzzing`), with
//! generators for both arbitrary bytes and structurally plausible but wrong JSON-RPC: wrong
//! types, deep nesting, huge numbers, unknown fields, batches (also over the cap), duplicate
//! ids and keys, escapes.
//!
//! Asserted on every case: nothing panics; every request gets exactly one response with its
//! id, in order, or the connection closed with a reason; every error code is in the documented
//! set (`ErrorCode::ALL`); every well-formed request the generator built is answered. Each
//! dispatch run is bounded by the harness (10 s, or it panics); case counts keep the whole file
//! to a few seconds in a debug build. Findings of the long cargo-fuzz runs are pinned at the
//! end as plain tests (`docs/security.md`, "Fuzzing").

use map_router::fuzzing::{
    check_decode, check_filter, filter_matches, Decoded, DispatchHarness, Transcript, CONNECT,
    FUZZ_MAX_BATCH,
};
use proptest::prelude::*;
use serde_json::Value;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        max_shrink_iters: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Bytes that look a little like NDJSON: JSON punctuation, digits, letters, newlines, escapes
/// and a few bytes that are not UTF-8.
fn jsonish_bytes() -> impl Strategy<Value = Vec<u8>> {
    let alphabet: Vec<u8> = b"{}[]\",:.-+0123456789eEtrufalsn \\\n\r\tu\xc3\xa9\xff\x00".to_vec();
    proptest::collection::vec(proptest::sample::select(alphabet), 0..600)
}

fn any_bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..600)
}

const METHODS: &[&str] = &[
    "map/connect",
    "map/disconnect",
    "map/send",
    "map/subscribe",
    "map/unsubscribe",
    "map/replay",
    "map/agents/list",
    "map/agents/get",
    "map/agents/register",
    "map/agents/spawn",
    "map/agents/unregister",
    "map/agents/update",
    "map/agents/stop",
    "map/agents/suspend",
    "map/agents/resume",
    "map/structure/graph",
    "map/scopes/list",
    "map/scopes/get",
    "map/scopes/create",
    "map/scopes/delete",
    "map/scopes/join",
    "map/scopes/leave",
    "map/scopes/members",
    "map/inject",
    "map/permissions/update",
    "trajectory/checkpoint",
    "trajectory/list",
    "map/tasks/create",
    "map/tasks/assign",
    "map/tasks/update",
    "map/tasks/get",
    "map/tasks/list",
    "mail/create",
    "mail/get",
    "mail/list",
    "mail/close",
    "mail/join",
    "mail/leave",
    "mail/invite",
    "mail/turn",
    "mail/turns/list",
    "mail/thread/create",
    "mail/thread/list",
    "mail/summary",
    "mail/replay",
    "map/subscribe.ack",
    "map/nope",
    "",
    "MAP/CONNECT",
    "map/agents/list/../../connect",
];

/// JSON text for a scalar that is often the wrong type or out of range.
fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("-0".to_owned()),
        Just("1e308".to_owned()),
        Just("-1e308".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("-9223372036854775809".to_owned()),
        Just("0.000000000000000000000000001".to_owned()),
        Just("\"\"".to_owned()),
        Just("\"\\u0000\\ud800\"".to_owned()),
        Just("\"a1\"".to_owned()),
        Just("\"root\"".to_owned()),
        Just("\"*\"".to_owned()),
        Just("\"agent.*\"".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| f.to_string()),
        "[a-z_.*/]{0,12}".prop_map(|s| format!("{s:?}")),
        (1usize..3000).prop_map(|n| format!("\"{}\"", "x".repeat(n))),
    ]
}

/// JSON text for a value: scalars, objects with MAP field names and unknown ones, arrays, and
/// sometimes nesting deeper than the limit.
fn value() -> impl Strategy<Value = String> {
    let leaf = scalar();
    let tree = leaf.prop_recursive(4, 32, 6, |inner| {
        let key = prop_oneof![
            Just("agentId"),
            Just("scopeId"),
            Just("to"),
            Just("payload"),
            Just("filter"),
            Just("eventTypes"),
            Just("name"),
            Just("role"),
            Just("subscriptionId"),
            Just("participantType"),
            Just("protocolVersion"),
            Just("metadata"),
            Just("capabilities"),
            Just("_meta"),
            Just("task"),
            Just("taskId"),
            Just("status"),
            Just("conversationId"),
            Just("contentType"),
            Just("content"),
            Just("mail"),
            Just("unknownField"),
            Just(""),
        ];
        prop_oneof![
            proptest::collection::vec((key, inner.clone()), 0..5).prop_map(|kv| {
                let fields: Vec<String> = kv.iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
                format!("{{{}}}", fields.join(","))
            }),
            proptest::collection::vec(inner, 0..5).prop_map(|v| format!("[{}]", v.join(","))),
        ]
    });
    prop_oneof![
        8 => tree,
        1 => (50usize..140).prop_map(|d| format!("{}1{}", "[".repeat(d), "]".repeat(d))),
        1 => (50usize..140).prop_map(|d| format!("{}1{}", "{\"a\":".repeat(d), "}".repeat(d))),
    ]
}

/// One generated message: its text, and the id of a response it must get when the generator
/// built it as a plain well-formed request (judged independently of the router's classifier).
#[derive(Debug, Clone)]
struct Message {
    text: String,
    answered: Option<String>,
}

fn message() -> impl Strategy<Value = Message> {
    let id = prop_oneof![
        4 => (0u32..8).prop_map(|n| n.to_string()),
        1 => Just("\"dup\"".to_owned()),
        1 => Just("null".to_owned()),
        1 => Just("1.5".to_owned()),
        1 => Just("1e400".to_owned()),
        1 => Just("-0".to_owned()),
        1 => Just("{}".to_owned()),
        1 => Just("true".to_owned()),
        1 => Just("\"\\u0041\"".to_owned()),
    ];
    let method = prop_oneof![
        8 => proptest::sample::select(METHODS).prop_map(|m| format!("{m:?}")),
        1 => Just("\"map\\/connect\"".to_owned()),
        1 => scalar(),
    ];
    let version = prop_oneof![
        8 => Just(Some("\"2.0\"")),
        1 => Just(Some("\"1.0\"")),
        1 => Just(Some("2.0")),
        1 => Just(None),
    ];
    let params = prop_oneof![
        2 => Just(None),
        6 => value().prop_map(Some),
    ];
    let extra = prop_oneof![
        6 => Just(None),
        1 => Just(Some("\"result\":1")),
        1 => Just(Some("\"error\":{\"code\":1}")),
        1 => Just(Some("\"id\":99")),
        1 => Just(Some("\"zz\":[1,2,3]")),
    ];
    (
        proptest::option::weighted(0.85, id),
        method,
        version,
        params,
        extra,
    )
        .prop_map(|(id, method, version, params, extra)| {
            let mut fields = Vec::new();
            if let Some(v) = version {
                fields.push(format!("\"jsonrpc\":{v}"));
            }
            if let Some(id) = &id {
                fields.push(format!("\"id\":{id}"));
            }
            fields.push(format!("\"method\":{method}"));
            if let Some(p) = &params {
                fields.push(format!("\"params\":{p}"));
            }
            if let Some(e) = extra {
                fields.push(e.to_owned());
            }
            let text = format!("{{{}}}", fields.join(","));
            // Well formed by construction: version 2.0, a small integer id, a plain method
            // string, params absent or an object, no extra keys, shallow.
            let plain_id = id.as_deref().filter(|i| i.parse::<u32>().is_ok());
            let plain_method =
                serde_json::from_str::<String>(&method).is_ok() && !method.contains('\\');
            let plain_params = params
                .as_deref()
                .is_none_or(|p| p.starts_with('{') && depth(p) < 60);
            let answered =
                (version == Some("\"2.0\"") && plain_method && plain_params && extra.is_none())
                    .then(|| plain_id.map(str::to_owned))
                    .flatten();
            Message { text, answered }
        })
}

/// Nesting depth of generated text (whose strings hold no brackets).
fn depth(text: &str) -> usize {
    let (mut d, mut max) = (0usize, 0usize);
    for b in text.bytes() {
        match b {
            b'{' | b'[' => {
                d += 1;
                max = max.max(d);
            }
            b'}' | b']' => d = d.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// One frame: a message, a batch of messages (sometimes over the cap), or raw junk.
fn frame() -> impl Strategy<Value = Vec<Message>> {
    prop_oneof![
        8 => message().prop_map(|m| vec![m]),
        2 => proptest::collection::vec(message(), 0..(FUZZ_MAX_BATCH + 4)).prop_map(|ms| {
            let text = format!(
                "[{}]",
                ms.iter().map(|m| m.text.as_str()).collect::<Vec<_>>().join(",")
            );
            // A batch over the cap is refused whole; an empty one too.
            let ok = !ms.is_empty() && ms.len() <= FUZZ_MAX_BATCH && depth(&text) <= 64;
            let answered = ms.iter().filter_map(|m| m.answered.clone()).collect::<Vec<_>>();
            vec![Message {
                text,
                answered: (ok && answered.len() == 1).then(|| answered[0].clone()),
            }]
        }),
        1 => value().prop_map(|text| vec![Message { text, answered: None }]),
        1 => "[ -~]{0,40}".prop_map(|text| vec![Message { text, answered: None }]),
    ]
}

fn response_ids(t: &Transcript) -> Vec<Value> {
    let mut ids = Vec::new();
    for frame in &t.received {
        let items = match serde_json::from_str::<Value>(frame) {
            Ok(Value::Array(items)) => items,
            Ok(other) => vec![other],
            Err(_) => continue,
        };
        ids.extend(
            items
                .into_iter()
                .filter(|i| i.get("method").is_none())
                .filter_map(|i| i.get("id").cloned()),
        );
    }
    ids
}

/// One harness (and runtime) per test thread, kept for the life of the test binary.
fn harness() -> &'static DispatchHarness {
    thread_local! {
        static H: &'static DispatchHarness = Box::leak(Box::new(DispatchHarness::new()));
    }
    H.with(|h| *h)
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn decoding_any_bytes_is_chunk_independent(bytes in any_bytes(), chunk in 1usize..64) {
        if let Err(e) = check_decode(&bytes, chunk) {
            prop_assert!(false, "{e}");
        }
    }

    #[test]
    fn decoding_jsonish_bytes_is_chunk_independent(bytes in jsonish_bytes(), chunk in 1usize..64) {
        if let Err(e) = check_decode(&bytes, chunk) {
            prop_assert!(false, "{e}");
        }
    }

    #[test]
    fn filters_keep_their_invariants(text in value()) {
        if let Err(e) = check_filter(text.as_bytes()) {
            prop_assert!(false, "{e}");
        }
    }

    #[test]
    fn filters_from_plausible_objects_keep_their_invariants(
        fields in proptest::collection::vec(
            (
                proptest::sample::select(&[
                    "eventTypes", "fromAgents", "agents", "fromRoles", "roles", "scopes",
                    "priorities", "correlationIds", "metadataMatch", "environmentMatch",
                    "mail", "trajectory", "unknown",
                ][..]),
                prop_oneof![
                    proptest::collection::vec(
                        proptest::sample::select(&[
                            "\"agent_registered\"", "\"agent.*\"", "\"*\"", "\"message_sent\"",
                            "\"scope.member.joined\"", "\"a1\"", "\"worker\"", "\"root\"",
                            "\"high\"", "\"c1\"", "\"\"", "\".*\"", "\"agent.\"", "1", "null",
                        ][..]),
                        0..4,
                    ).prop_map(|v| format!("[{}]", v.join(","))),
                    Just("{\"team\":\"red\"}".to_owned()),
                    Just("{\"os.type\":\"linux\"}".to_owned()),
                    Just("{\"os\":{\"type\":\"linux\"}}".to_owned()),
                    Just("{\"nested\":{\"a\":[1,2]}}".to_owned()),
                    scalar(),
                ],
            ),
            0..5,
        )
    ) {
        let text = format!(
            "{{{}}}",
            fields.iter().map(|(k, v)| format!("{k:?}:{v}")).collect::<Vec<_>>().join(",")
        );
        if let Err(e) = check_filter(text.as_bytes()) {
            prop_assert!(false, "{e}");
        }
    }
}

proptest! {
    #![proptest_config(config(160))]

    #[test]
    fn dispatch_answers_every_request_once(
        frames in proptest::collection::vec(frame(), 1..16),
        connect in any::<bool>(),
    ) {
        let messages: Vec<Message> = frames.into_iter().flatten().collect();
        let mut texts: Vec<&str> = Vec::new();
        if connect {
            texts.push(CONNECT);
        }
        texts.extend(messages.iter().map(|m| m.text.as_str()));
        let t = harness().run_texts(&texts);
        if let Err(e) = t.check() {
            prop_assert!(false, "{e}\nsent: {texts:#?}\nreceived: {:#?}", t.received);
        }
        // Independently of the router's classifier: each well-formed request is answered.
        if t.close.is_none() {
            let ids = response_ids(&t);
            for m in &messages {
                if let Some(id) = &m.answered {
                    let id: Value = serde_json::from_str(id).expect("a generated id");
                    prop_assert!(ids.contains(&id), "no response to {}\n{:#?}", m.text, t.received);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn dispatch_survives_raw_bytes(bytes in prop_oneof![any_bytes(), jsonish_bytes()], connect in any::<bool>()) {
        let t = harness().run_bytes(&bytes, connect);
        if let Err(e) = t.check() {
            prop_assert!(false, "{e}\nreceived: {:#?}", t.received);
        }
    }
}

/// Hand-written hostile frames that every run must also survive (and the cases the generators
/// reach only rarely).
#[test]
fn pinned_hostile_frames() {
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let deep_params = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"map/agents/list","params":{}{}}}"#,
        "{\"a\":".repeat(70),
        "}".repeat(70)
    );
    let over_cap = format!(
        "[{}]",
        vec![r#"{"jsonrpc":"2.0","id":1,"method":"map/agents/list"}"#; FUZZ_MAX_BATCH + 1]
            .join(",")
    );
    let huge_frame = format!(
        r#"{{"jsonrpc":"2.0","id":8,"method":"map/send","params":{{"to":"x","payload":"{}"}}}}"#,
        "x".repeat(70_000)
    );
    let frames = [
        CONNECT,
        &deep,
        &deep_params,
        &over_cap,
        "[]",
        "[1,2]",
        r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"map/agents/list"}"#,
        r#"[{"jsonrpc":"2.0","id":3,"method":"map/agents/list"},{"jsonrpc":"2.0","id":3,"method":"map/agents/list"}]"#,
        r#"{"jsonrpc":"2.0","id":1e400,"method":"map/agents/list"}"#,
        r#"{"jsonrpc":"2.0","id":18446744073709551616,"method":"map/agents/list"}"#,
        r#"{"jsonrpc":"2.0","id":"\u0041","method":"map\/agents\/list"}"#,
        // CI's fuzzer found a lone surrogate passed through to an answer serde_json cannot read.
        r#"{"jsonrpc":"2.0","id":0,"method":"mail/create","params":{"metadata":{"agentId":"\u0000\ud800"}}}"#,
        r#"{"jsonrpc":"2.0","id":11,"method":"map/agents/register","params":{"name":"\udc00"}}"#,
        r#"{"jsonrpc":"2.0","id":4,"method":"map/subscribe","params":{"filter":{"eventTypes":[""]}}}"#,
        r#"{"jsonrpc":"2.0","id":5,"method":"map/subscribe","params":{"filter":{"eventTypes":1}}}"#,
        r#"{"jsonrpc":"2.0","id":6,"method":"map/agents/register","params":{"name":1e308,"metadata":[]}}"#,
        &huge_frame,
        r#"{"jsonrpc":"2.0","method":"map/subscribe.ack","params":{"subscriptionId":"x","upToSequence":-1}}"#,
        r#"{"jsonrpc":"2.0","id":9,"method":"map/disconnect"}"#,
        r#"{"jsonrpc":"2.0","id":10,"method":"map/agents/list"}"#,
        "null",
    ];
    let t = harness().run_texts(&frames);
    t.check().expect("the transcript keeps every invariant");
    assert!(
        t.close.is_none(),
        "the connection stays open: {:?}",
        t.close
    );
    let codes = t.error_codes();
    assert!(codes.get(&-32600).copied().unwrap_or(0) >= 4, "{codes:?}");
    assert!(codes.contains_key(&-32602), "{codes:?}");
    assert!(codes.contains_key(&1000), "after map/disconnect: {codes:?}");
    // Every frame was classified as the session saw it.
    assert_eq!(t.sent.len(), frames.len());
    assert!(matches!(t.sent[1], Decoded::Rejected { code: -32600, .. }));
}

#[test]
fn a_filter_that_constrains_nothing_matches_every_sample_event() {
    let all = filter_matches(b"{}").expect("compiles").expect("a filter");
    // Every standard type, no vendor one (a filter must name those).
    let want: Vec<bool> = map_router::protocol::event::EventType::ALL
        .iter()
        .map(|k| !k.is_vendor())
        .collect();
    assert_eq!(all, want);
    // A `mail` filter admits the mail family only.
    let mail = filter_matches(br#"{"mail":{}}"#)
        .expect("compiles")
        .expect("a filter");
    let families: Vec<bool> = map_router::protocol::event::EventType::ALL
        .iter()
        .map(|k| k.is_mail())
        .collect();
    assert_eq!(mail, families);
    assert_eq!(filter_matches(br#"{"eventTypes":[""]}"#), Err(-32602));
    assert_eq!(filter_matches(b"[1]"), Ok(None));
}

/// Regression (proptest on the frame_decode entry point): a line of Unicode-only whitespace is
/// skipped like a blank line instead of becoming an empty frame answered `-32700`.
#[test]
fn unicode_blank_lines_are_not_frames() {
    let frames = check_decode(b"\x0b\n\xe2\x80\xa8\r\n \t\n", 1).expect("invariants hold");
    assert!(frames.is_empty(), "{frames:?}");
}
