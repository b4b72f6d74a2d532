//! Hostile input over real sockets (WebSocket, the NDJSON stdio path, HTTP): every attack gets
//! its exact JSON-RPC error or a close with a reason, and a healthy client connected alongside
//! keeps full service (round trips and events) during and after each one. Also the limits of
//! `[limits]`: rates, quotas, connection counts, handshake and header timeouts, a peer that
//! never reads. docs/security.md lists what this suite found.

mod common;

use std::time::Duration;

use common::*;
use futures::{SinkExt, StreamExt};
use map_router::server::{Config, Server};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame as WsFrame;
use tokio_tungstenite::tungstenite::Message;

/// A well-behaved agent next to the attacks: each check is a round trip plus the event it
/// causes, so a stalled or crashed router fails it.
struct Healthy {
    c: WsClient,
    id: String,
    sub: String,
    n: u64,
}

impl Healthy {
    async fn new(url: &str, id: &str) -> Self {
        let mut c = WsClient::agent(url, id, json!({})).await;
        let sub = c
            .subscribe(json!({"eventTypes": ["agent.metadata.changed"], "fromAgents": [id]}))
            .await;
        let mut h = Self {
            c,
            id: id.to_owned(),
            sub,
            n: 0,
        };
        h.check().await;
        h
    }

    async fn check(&mut self) {
        self.n += 1;
        let n = self.n;
        let r = self
            .c
            .ok(
                "map/agents/update",
                json!({"agentId": self.id, "metadata": {"n": n}}),
            )
            .await;
        assert_eq!(r["agent"]["metadata"]["n"], json!(n), "{r}");
        let ev = self.c.next_event(&self.sub).await;
        assert_eq!(ev["event"]["type"], json!("agent.metadata.changed"));
        assert_eq!(ev["event"]["data"]["changes"]["n"], json!(n), "{ev}");
        assert_eq!(ev["sequenceNumber"], json!(n));
        let got = self
            .c
            .ok("map/agents/get", json!({"agentId": self.id}))
            .await;
        assert_eq!(got["agent"]["id"], json!(self.id));
    }
}

async fn server(tweak: impl FnOnce(&mut Config)) -> (Server, String) {
    // Every test peer is on loopback: apply the per-address limits to it too.
    start_server(|c| {
        c.limits.exempt_loopback = false;
        tweak(c);
    })
    .await
}

/// The error object of a single response, checking the envelope and the id.
fn error_of(r: &Value, id: &Value) -> Value {
    assert_eq!(r["jsonrpc"], json!("2.0"), "{r}");
    assert_eq!(&r["id"], id, "id of {r}");
    assert!(r.get("result").is_none(), "{r}");
    r["error"].clone()
}

const STREAMS: [Transport; 4] = [
    Transport::Ws,
    Transport::Stdio,
    Transport::Http,
    Transport::InProcess,
];

#[tokio::test]
async fn malformed_and_truncated_json_is_a_parse_error_on_every_transport() {
    let (server, url) = server(|_| {}).await;
    let mut healthy = Healthy::new(&url, "h-parse").await;
    let garbage = [
        "{",
        r#"{"jsonrpc":"2.0","id":1,"method":"map/conn"#,
        r#"[{"jsonrpc":"2.0","id":1"#,
        "nul",
        r#""unterminated"#,
        r#"{"a":1}}"#,
        "{}garbage",
        r#"{"jsonrpc":"2.0","id":1,,}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":01}}"#,
        "\u{0}",
        r#"{"jsonrpc":"2.0","id":"\ud800","method":"x"#,
    ];
    for t in STREAMS {
        let mut c = WsClient::open(t, &server).await;
        for g in garbage {
            let r = c.request_raw(g).await;
            assert_protocol_error(&error_of(&r, &Value::Null), -32700, "Parse error");
        }
        // Still usable on the same connection (HTTP: each POST stands alone).
        let r = c
            .request_raw(r#"{"jsonrpc":"2.0","id":"after","method":"map/connect"}"#)
            .await;
        assert_eq!(r["id"], json!("after"), "{t:?}: {r}");
        assert!(r["result"]["sessionId"].is_string(), "{t:?}: {r}");
        healthy.check().await;
    }
}

#[tokio::test]
async fn wrong_types_get_invalid_request_or_invalid_params() {
    let (server, url) = server(|_| {}).await;
    let mut healthy = Healthy::new(&url, "h-types").await;
    for t in STREAMS {
        let mut c = WsClient::open(t, &server).await;
        for (frame, id, code) in [
            (r#"{"jsonrpc":"2.0","id":1,"method":42}"#, json!(1), -32600),
            (
                r#"{"jsonrpc":"2.0","id":2,"method":["map/connect"]}"#,
                json!(2),
                -32600,
            ),
            (
                r#"{"jsonrpc":2,"id":3,"method":"map/connect"}"#,
                json!(3),
                -32600,
            ),
            (
                r#"{"jsonrpc":"2.0","id":true,"method":"x"}"#,
                Value::Null,
                -32600,
            ),
            (
                r#"{"jsonrpc":"2.0","id":4,"method":"map/connect","params":"x"}"#,
                json!(4),
                -32600,
            ),
            (
                r#"{"jsonrpc":"2.0","id":5,"method":"map/connect","params":{"participantType":5}}"#,
                json!(5),
                -32602,
            ),
            (
                r#"{"jsonrpc":"2.0","id":6,"method":"map/connect","params":{"protocolVersion":"one"}}"#,
                json!(6),
                -32602,
            ),
        ] {
            let r = c.request_raw(frame).await;
            let e = error_of(&r, &id);
            let message = if code == -32600 {
                "Invalid request"
            } else {
                "Invalid params"
            };
            assert_protocol_error(&e, code, message);
        }
        healthy.check().await;
    }
    // After connect, params of the wrong shape for each method family.
    let mut c = WsClient::agent(&url, "typed", json!({})).await;
    for (method, params) in [
        ("map/agents/get", json!({"agentId": [1]})),
        ("map/agents/list", json!({"filter": {"roles": "lead"}})),
        ("map/subscribe", json!({"filter": "everything"})),
        ("map/replay", json!({"limit": "ten"})),
        ("map/replay", json!({"limit": -1})),
        ("map/replay", json!({"limit": 1.5})),
        ("map/send", json!({"to": {"agent": 7}})),
        ("map/scopes/create", json!({"scopeId": {}})),
        ("map/agents/update", json!({"agentId": "typed", "state": 3})),
        ("map/inject", json!({"agentId": "typed"})),
        ("map/unsubscribe", json!({"subscriptionId": null})),
    ] {
        let e = c.err(method, params.clone()).await;
        assert_eq!(e["code"], json!(-32602), "{method} {params}: {e}");
        healthy.check().await;
    }
}

#[tokio::test]
async fn deeply_nested_values_are_refused_before_parsing() {
    let (server, url) = server(|_| {}).await;
    let mut healthy = Healthy::new(&url, "h-deep").await;
    let open = "[".repeat(100_000);
    let arrays = format!("{open}{}", "]".repeat(100_000));
    let unterminated = open.clone();
    let objects = format!("{}1{}", r#"{"a":"#.repeat(50_000), "}".repeat(50_000));
    let payload_70 = format!("{}{}", "[".repeat(70), "]".repeat(70));
    let in_params = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"map/send","params":{{"to":{{"system":true}},"payload":{payload_70}}}}}"#
    );
    let in_batch = format!("[{in_params}]");
    for t in [Transport::Ws, Transport::Stdio, Transport::Http] {
        let mut c = WsClient::open(t, &server).await;
        for frame in [&arrays, &unterminated, &objects, &in_params, &in_batch] {
            let r = c.request_raw(frame).await;
            let e = error_of(&r, &Value::Null);
            assert_protocol_error(&e, -32600, "Invalid request");
            assert_eq!(
                e["data"]["details"]["reason"],
                json!("JSON nesting exceeds the limit of 64 levels")
            );
            healthy.check().await;
        }
    }
    // Within the limit, deep payloads are fine and delivered untouched.
    let mut a = WsClient::agent(&url, "deep-ok", json!({})).await;
    let mut payload = json!(1);
    for _ in 0..58 {
        payload = json!([payload]);
    }
    let r = a.send(json!({"agent": "h-deep"}), payload.clone()).await;
    assert_eq!(r["delivered"], json!(["h-deep"]));
    assert_eq!(healthy.c.next_message().await["payload"], payload);
    healthy.check().await;
}

#[tokio::test]
async fn the_depth_limit_is_configurable() {
    let (_server, url) = server(|c| c.limits.max_depth = 4).await;
    let mut c = WsClient::connect(&url).await;
    let ok = c
        .request_raw(r#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"capabilities":{"observation":{}}}}"#)
        .await;
    assert!(ok["result"].is_object(), "{ok}");
    let r = c
        .request_raw(r#"{"jsonrpc":"2.0","id":2,"method":"map/agents/list","params":{"filter":{"metadataMatch":{"a":{}}}}}"#)
        .await;
    assert_eq!(
        error_of(&r, &Value::Null)["data"]["details"]["reason"],
        json!("JSON nesting exceeds the limit of 4 levels")
    );
}

#[tokio::test]
async fn huge_strings_and_numbers() {
    let (_server, url) = server(|_| {}).await;
    let mut healthy = Healthy::new(&url, "h-huge").await;
    let mut c = WsClient::agent(&url, "huge", json!({})).await;

    // A 500 KB method name is not reflected back whole.
    let long = "m".repeat(500_000);
    let r = c
        .request_raw(&format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{long}"}}"#))
        .await;
    let e = error_of(&r, &json!(1));
    let expected = format!("Method not found: {}…", "m".repeat(128));
    assert_eq!(e, map_error(-32601, &expected, "protocol"));
    healthy.check().await;

    // A 500 KB string id is echoed (ids are the caller's).
    let id = "i".repeat(500_000);
    let r = c
        .request_raw(&format!(
            r#"{{"jsonrpc":"2.0","id":"{id}","method":"map/agents/list"}}"#
        ))
        .await;
    assert_eq!(r["id"], json!(id));
    healthy.check().await;

    // Integer ids beyond 64 bits come back as the same digits.
    let big = "123456789012345678901234567890";
    c.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":{big},"method":"map/agents/list"}}"#
    ))
    .await;
    let frame = match c.read_frame().await {
        Frame::Json(v) => v,
        other => panic!("{other:?}"),
    };
    assert!(frame.get("result").is_some(), "{frame}");

    // Numbers that fit no field are invalid params, however large.
    for params in [
        json!({"limit": 1e300}),
        json!({"limit": 18446744073709551615u64}),
        json!({"fromTimestamp": -1}),
    ] {
        let e = c.err("map/replay", params.clone()).await;
        assert_eq!(e["code"], json!(-32602), "{params}: {e}");
    }
    for raw in [
        r#"{"jsonrpc":"2.0","id":7,"method":"map/replay","params":{"limit":1e400}}"#,
        r#"{"jsonrpc":"2.0","id":7,"method":"map/replay","params":{"limit":100000000000000000000000}}"#,
    ] {
        let r = c.request_raw(raw).await;
        assert_eq!(error_of(&r, &json!(7))["code"], json!(-32602), "{r}");
    }
    // Extreme positions and windows are accepted or refused, never a crash.
    for (method, params) in [
        ("map/replay", json!({"fromTimestamp": u64::MAX})),
        ("map/replay", json!({"toTimestamp": 0, "limit": 1000})),
        ("map/subscribe", json!({"replayFrom": u64::MAX})),
        ("map/subscribe", json!({"replayFrom": 0})),
        ("map/subscribe", json!({"options": {"ackWindow": u64::MAX}})),
        ("map/agents/list", json!({"limit": u64::MAX})),
        (
            "map/send",
            json!({"to": {"children": true, "depth": u32::MAX}, "payload": 1}),
        ),
    ] {
        let _ = c.call(method, params).await;
        healthy.check().await;
    }
    c.send_raw(r#"{"jsonrpc":"2.0","method":"map/subscribe.ack","params":{"subscriptionId":"x","upToSequence":18446744073709551615}}"#)
        .await;
    healthy.check().await;

    // A large payload under the payload limit is delivered whole; above it, 4002.
    let text = "p".repeat(200_000);
    let r = c.send(json!({"agent": "h-huge"}), json!(text)).await;
    assert_eq!(r["delivered"], json!(["h-huge"]));
    assert_eq!(healthy.c.next_message().await["payload"], json!(text));
    let e = c
        .err(
            "map/send",
            json!({"to": {"agent": "h-huge"}, "payload": "q".repeat(300_000)}),
        )
        .await;
    assert_eq!(
        e,
        map_error(
            4002,
            &format!(
                "Quota exceeded: payload of {} bytes exceeds {} bytes",
                300_002,
                256 * 1024
            ),
            "resource"
        )
    );
    healthy.check().await;
}

/// Sends raw bytes as one WebSocket text frame, valid UTF-8 or not.
async fn send_text_bytes(ws: &mut WsRaw, bytes: &[u8]) {
    let frame = WsFrame::message(bytes.to_vec(), OpCode::Data(Data::Text), true);
    with_timeout(ws.send(Message::Frame(frame)))
        .await
        .expect("send raw frame");
}

type WsRaw = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

async fn raw_ws(url: &str) -> WsRaw {
    with_timeout(tokio_tungstenite::connect_async(url))
        .await
        .expect("connect")
        .0
}

/// The next text frame as JSON, or the close code and reason.
async fn next_ws(ws: &mut WsRaw) -> Result<Value, Option<(u16, String)>> {
    within(TIMEOUT, async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => return Ok(serde_json::from_str(&t).unwrap()),
                Some(Ok(Message::Close(f))) => {
                    return Err(f.map(|f| (u16::from(f.code), f.reason.to_string())))
                }
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return Err(None),
            }
        }
    })
    .await
}

#[tokio::test]
async fn invalid_utf8_in_websocket_text_frames_and_ndjson_lines() {
    let (server, url) = server(|_| {}).await;
    let mut healthy = Healthy::new(&url, "h-utf8").await;

    // WebSocket: a text frame must be UTF-8 (RFC 6455 §8.1): closed with 1007.
    let mut ws = raw_ws(&url).await;
    send_text_bytes(
        &mut ws,
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\xfe\"}",
    )
    .await;
    match next_ws(&mut ws).await {
        Err(Some((code, reason))) => {
            assert_eq!(code, 1007, "{reason}");
            assert!(!reason.is_empty());
        }
        other => panic!("expected a 1007 close, got {other:?}"),
    }
    healthy.check().await;

    // A binary frame is refused and the connection continues.
    let mut c = WsClient::connect(&url).await;
    c.send_binary(b"\xff\x00{}").await;
    let r = c.next_non_notification().await;
    assert_protocol_error(&error_of(&r, &Value::Null), -32600, "Invalid request");
    healthy.check().await;

    // NDJSON: a line that is not UTF-8 is a parse error; the next line is served.
    let (client, _serving) = ndjson_pipe(&server, Default::default());
    let (read, mut write) = tokio::io::split(client);
    let mut lines = tokio::io::BufReader::new(read).lines();
    with_timeout(write.write_all(
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xc3\x28\"}\n\xff\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"map/connect\"}\n",
    ))
    .await
    .unwrap();
    for _ in 0..2 {
        let line = with_timeout(lines.next_line()).await.unwrap().unwrap();
        let r: Value = serde_json::from_str(&line).unwrap();
        let e = error_of(&r, &Value::Null);
        assert_protocol_error(&e, -32700, "Parse error");
        assert_eq!(
            e["data"]["details"]["reason"],
            json!("frame is not valid UTF-8")
        );
    }
    let line = with_timeout(lines.next_line()).await.unwrap().unwrap();
    let r: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(r["id"], json!(2));
    assert!(r["result"]["sessionId"].is_string());
    healthy.check().await;

    // HTTP: a body that is not UTF-8 is a 400 with -32700.
    let addr = server.local_addrs()[0];
    let resp = http::request(
        addr,
        "POST",
        "/map/rpc",
        &[("Content-Type", "application/json")],
        b"{\"a\":\"\xff\"}",
    )
    .await;
    assert_eq!(resp.status, 400);
    assert_protocol_error(&error_of(&resp.json(), &Value::Null), -32700, "Parse error");
    healthy.check().await;
}

#[tokio::test]
async fn duplicate_request_ids_in_flight_and_in_one_batch_are_each_answered_in_order() {
    let (_server, url) = server(|_| {}).await;
    let mut healthy = Healthy::new(&url, "h-dup").await;
    let mut c = WsClient::agent(&url, "dup", json!({})).await;
    c.send_raw(r#"{"jsonrpc":"2.0","id":7,"method":"map/agents/list"}"#)
        .await;
    c.send_raw(r#"{"jsonrpc":"2.0","id":7,"method":"map/scopes/list"}"#)
        .await;
    let first = c.next_non_notification().await;
    let second = c.next_non_notification().await;
    assert_eq!(first["id"], json!(7));
    assert!(first["result"]["agents"].is_array(), "{first}");
    assert_eq!(second["id"], json!(7));
    assert_eq!(without_as_of(&second["result"]), json!({"scopes": []}));
    let r = c
        .request_raw(
            r#"[{"jsonrpc":"2.0","id":1,"method":"map/scopes/list"},{"jsonrpc":"2.0","id":1,"method":"nope"},{"jsonrpc":"2.0","id":1,"method":"map/scopes/list"}]"#,
        )
        .await;
    let all = r.as_array().expect("array");
    assert_eq!(all.len(), 3);
    assert!(all.iter().all(|x| x["id"] == json!(1)));
    assert_eq!(without_as_of(&all[0]["result"]), json!({"scopes": []}));
    assert_eq!(all[1]["error"]["code"], json!(-32601));
    assert_eq!(without_as_of(&all[2]["result"]), json!({"scopes": []}));
    healthy.check().await;
}

#[tokio::test]
async fn a_batch_of_10000_is_refused_whole_above_max_batch() {
    let (_server, url) = server(|_| {}).await;
    let mut healthy = Healthy::new(&url, "h-batch").await;
    let mut c = WsClient::agent(&url, "batcher", json!({})).await;
    let batch: Vec<Value> = (0..10_000)
        .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "map/scopes/list"}))
        .collect();
    let r = c.request_raw(&Value::Array(batch).to_string()).await;
    let e = error_of(&r, &Value::Null);
    assert_protocol_error(&e, -32600, "Invalid request");
    assert_eq!(
        e["data"]["details"]["reason"],
        json!("batch of 10000 exceeds the limit of 1000")
    );
    healthy.check().await;
}

#[tokio::test]
async fn a_batch_of_10000_within_max_batch_is_answered_entry_by_entry_under_the_rate_limit() {
    let (_server, url) = server(|c| {
        c.limits.max_batch = 10_000;
        c.limits.rate_per_connection = 100;
        c.limits.burst_per_connection = 100;
        c.limits.rate_per_principal = 0;
    })
    .await;
    let mut healthy = Healthy::new(&url, "h-batch2").await;
    let mut c = WsClient::connect(&url).await;
    let batch: Vec<Value> = (0..10_000)
        .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "map/connect"}))
        .collect();
    let r = c.request_raw(&Value::Array(batch).to_string()).await;
    let all = r.as_array().expect("one response per entry");
    assert_eq!(all.len(), 10_000);
    let mut ok = 0;
    for (i, resp) in all.iter().enumerate() {
        assert_eq!(resp["id"], json!(i), "in order");
        if resp.get("result").is_some() {
            ok += 1;
        } else {
            let e = &resp["error"];
            assert_eq!(e["code"], json!(4001), "{resp}");
            assert_eq!(e["message"], json!("Rate limited"));
            assert_eq!(e["data"]["category"], json!("resource"));
            assert_eq!(e["data"]["retryable"], json!(true));
            assert!(e["data"]["retryAfterMs"].as_u64().is_some_and(|ms| ms >= 1));
        }
    }
    assert!(ok >= 99, "at least the burst is served: {ok}");
    assert!(ok < 10_000, "the rest is rate limited: {ok}");
    healthy.check().await;
}

#[tokio::test]
async fn unknown_fields_everywhere_are_ignored() {
    let (_server, url) = server(|_| {}).await;
    let mut healthy = Healthy::new(&url, "h-unknown").await;
    let mut c = WsClient::connect(&url).await;
    let r = c
        .request_raw(
            r#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"protocolVersion":1,"participantType":"agent","bogus":{"x":[1]},"capabilities":{"lifecycle":{"canFly":true},"nope":{}}},"extra":true,"result":null}"#,
        )
        .await;
    assert!(r["result"]["sessionId"].is_string(), "{r}");
    for (method, params) in [
        (
            "map/agents/register",
            json!({"agentId": "unk", "wings": 2, "metadata": {"a": 1}}),
        ),
        (
            "map/subscribe",
            json!({"filter": {"eventTypes": ["agent.*"], "colour": "red"}, "options": {"x": 1}, "z": null}),
        ),
        (
            "map/send",
            json!({"to": {"agent": "h-unknown", "via": "x"}, "payload": 1, "meta": {"custom": true}, "extra": 1}),
        ),
        (
            "map/agents/list",
            json!({"filter": {"shape": "round"}, "q": 1}),
        ),
        ("map/replay", json!({"limit": 1, "what": "ever"})),
    ] {
        let r = c.call(method, params.clone()).await;
        assert!(r.is_ok(), "{method} {params}: {r:?}");
    }
    assert_eq!(healthy.c.next_message().await["payload"], json!(1));
    healthy.check().await;
}

#[tokio::test]
async fn null_ids_are_requests_and_a_missing_jsonrpc_is_invalid() {
    let (_server, url) = server(|_| {}).await;
    let mut healthy = Healthy::new(&url, "h-null").await;
    let mut c = WsClient::connect(&url).await;
    let r = c
        .request_raw(r#"{"jsonrpc":"2.0","id":null,"method":"map/connect"}"#)
        .await;
    assert_eq!(r["id"], Value::Null);
    assert!(r["result"]["sessionId"].is_string(), "{r}");
    let r = c
        .request_raw(r#"{"id":4,"method":"map/agents/list"}"#)
        .await;
    assert_protocol_error(&error_of(&r, &json!(4)), -32600, "Invalid request");
    let r = c.request_raw(r#"{"method":"map/agents/list"}"#).await;
    assert_protocol_error(&error_of(&r, &Value::Null), -32600, "Invalid request");
    healthy.check().await;
}

/// Opens a TCP connection and starts an upgrade request whose headers never end.
async fn slow_loris(addr: std::net::SocketAddr) -> TcpStream {
    let mut s = with_timeout(TcpStream::connect(addr))
        .await
        .expect("connect");
    let head =
        format!("GET / HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n");
    with_timeout(s.write_all(head.as_bytes()))
        .await
        .expect("write");
    s
}

/// Keeps trickling header lines (bounded) until the server closes; returns whether it did.
async fn trickle_until_closed(mut s: TcpStream, lines: usize) -> bool {
    let mut buf = [0u8; 256];
    for i in 0..lines {
        tokio::select! {
            r = s.read(&mut buf) => match r {
                Ok(0) | Err(_) => return true,
                Ok(_) => continue,
            },
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        if s.write_all(format!("X-Slow-{i}: y\r\n").as_bytes())
            .await
            .is_err()
        {
            return true;
        }
    }
    false
}

#[tokio::test]
async fn slow_loris_handshakes_are_cut_off_and_cost_only_their_slot() {
    let (server, url) = server(|c| {
        c.limits.header_timeout_ms = 1000;
        c.limits.max_connections_per_ip = 6;
    })
    .await;
    let addr = server.local_addrs()[0];
    let mut healthy = Healthy::new(&url, "h-loris").await;
    // Attackers take the address's slots one by one until a real upgrade is refused.
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..10 {
        held.push(slow_loris(addr).await);
        match tokio_tungstenite::connect_async(url.as_str()).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                refused = Some(resp);
                break;
            }
            Ok((mut ws, _)) => {
                let _ = ws.close(None).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let resp = refused.expect("a connection over the per-address limit is refused");
    assert!(held.len() <= 5, "{} attackers", held.len());
    assert_eq!(resp.status().as_u16(), 429);
    let body: Value = serde_json::from_slice(resp.body().as_deref().unwrap_or_default()).unwrap();
    assert_eq!(
        body["error"],
        json!({"code": 4002, "message": "Quota exceeded: connections per address (limit 6)",
               "data": {"category": "resource", "retryable": true}})
    );
    healthy.check().await;
    // Each attacker is cut off by the header timeout, however it trickles.
    let attackers: Vec<_> = held
        .into_iter()
        .map(|s| tokio::spawn(trickle_until_closed(s, 200)))
        .collect();
    healthy.check().await;
    for a in attackers {
        assert!(
            within(Duration::from_secs(30), a).await.unwrap(),
            "the server cut the slow-loris connection off"
        );
    }
    // Their slots are free again.
    let mut c = WsClient::client(&url).await;
    c.ok("map/agents/list", Value::Null).await;
    healthy.check().await;
    // A TCP connection that says nothing at all is closed too.
    let mut s = with_timeout(TcpStream::connect(addr)).await.unwrap();
    let mut buf = [0u8; 16];
    let n = within(Duration::from_secs(10), s.read(&mut buf)).await;
    assert!(matches!(n, Ok(0) | Err(_)), "closed: {n:?}");
}

#[tokio::test]
async fn a_peer_that_never_reads_is_dropped_while_others_are_served() {
    // NB: the healthy client answers pings only while it reads (at each check): the idle
    // timeout must exceed the gap between checks on a loaded machine, or the router is right
    // to drop it too (seen under load with 1 s and a check every 50 sends).
    let (server, url) = server(|c| {
        c.router.outbox_frames = 64;
        c.websocket.idle_timeout_ms = 3000;
        c.websocket.ping_interval_ms = 200;
    })
    .await;
    let mut healthy = Healthy::new(&url, "h-stall").await;
    // The stalled peer subscribes to everything, then keeps sending and never reads.
    let mut stalled = raw_ws(&url).await;
    for frame in [
        r#"{"jsonrpc":"2.0","id":1,"method":"map/connect"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"map/subscribe","params":{}}"#,
    ] {
        with_timeout(stalled.send(Message::text(frame)))
            .await
            .unwrap();
    }
    let mut flooder = WsClient::agent(&url, "flooder", json!({})).await;
    let before = within(TIMEOUT, server.router().stats()).await.unwrap();
    let big = "f".repeat(32 * 1024);
    for n in 0..400u64 {
        flooder
            .send(json!({"system": true}), json!({"n": n, "pad": big}))
            .await;
        // The stalled peer also asks for more without reading the answers (bounded: its sends
        // may block once the kernel buffers are full).
        let _ = tokio::time::timeout(
            Duration::from_millis(5),
            stalled.send(Message::text(
                r#"{"jsonrpc":"2.0","id":3,"method":"map/agents/list"}"#,
            )),
        )
        .await;
        if n % 10 == 0 {
            healthy.check().await;
        }
    }
    healthy.check().await;
    // The stalled connection is closed by the router (bounded wait).
    let mut closed = false;
    for _ in 0..100 {
        let now = within(TIMEOUT, server.router().stats()).await.unwrap();
        if now.connections < before.connections {
            closed = true;
            break;
        }
        healthy.check().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(closed, "the router dropped the peer that never reads");
    healthy.check().await;
    drop(stalled);
}

#[tokio::test]
async fn connections_that_never_connect_are_closed_with_a_reason() {
    let (server, url) = server(|c| c.limits.handshake_timeout_ms = 300).await;
    let mut healthy = Healthy::new(&url, "h-hs").await;
    let mut ws = raw_ws(&url).await;
    match next_ws(&mut ws).await {
        Err(Some((code, reason))) => {
            assert_eq!(code, 1008);
            assert_eq!(reason, "handshake timeout: no map/connect within 300 ms");
        }
        other => panic!("expected a 1008 close, got {other:?}"),
    }
    // Requests before map/connect do not stop the clock.
    let mut c = WsClient::connect(&url).await;
    let e = c.err("map/agents/list", Value::Null).await;
    assert_eq!(e["code"], json!(1000));
    assert_eq!(c.expect_close().await, Some(1008));
    // Disconnecting starts it again.
    let mut c = WsClient::client(&url).await;
    c.ok("map/disconnect", Value::Null).await;
    assert_eq!(c.expect_close().await, Some(1008));
    healthy.check().await;
    // NDJSON: the connection just ends.
    let opts = map_router::transport::connection::ConnectionOptions {
        handshake_timeout: Some(Duration::from_millis(300)),
        ..Default::default()
    };
    let (client, serving) = ndjson_pipe(&server, opts);
    within(Duration::from_secs(5), serving).await.unwrap();
    let (read, _write) = tokio::io::split(client);
    let mut lines = tokio::io::BufReader::new(read).lines();
    assert!(with_timeout(lines.next_line()).await.unwrap().is_none());
    healthy.check().await;
}

#[tokio::test]
async fn rate_limits_per_connection_answer_4001_with_retry_after() {
    let (_server, url) = server(|c| {
        c.limits.rate_per_connection = 1;
        c.limits.burst_per_connection = 20;
        c.limits.rate_per_principal = 0;
    })
    .await;
    let mut healthy = Healthy::new(&url, "h-rate").await;
    let mut c = WsClient::client(&url).await;
    let mut limited = None;
    for _ in 0..40 {
        match c.call("map/agents/list", Value::Null).await {
            Ok(_) => {}
            Err(e) => {
                limited = Some(e);
                break;
            }
        }
    }
    let e = limited.expect("a request beyond the burst is refused");
    let wait = e["data"]["retryAfterMs"].as_u64().expect("retryAfterMs");
    assert!(wait >= 1);
    assert_eq!(
        e,
        json!({"code": 4001, "message": "Rate limited",
               "data": {"category": "resource", "retryable": true, "retryAfterMs": wait}})
    );
    // Other connections have their own budget.
    healthy.check().await;
    // After the advertised wait, the call goes through.
    tokio::time::sleep(Duration::from_millis(wait + 5)).await;
    c.ok("map/agents/list", Value::Null).await;
}

#[tokio::test]
async fn without_a_principal_connections_from_one_address_share_a_bucket() {
    let (_server, url) = server(|c| {
        c.limits.rate_per_connection = 0;
        c.limits.rate_per_principal = 4;
        c.limits.burst_per_principal = 4;
    })
    .await;
    let mut a = WsClient::connect(&url).await;
    let mut b = WsClient::connect(&url).await;
    a.ok("map/connect", json!({})).await;
    b.ok("map/connect", json!({})).await;
    a.ok("map/agents/list", Value::Null).await;
    b.ok("map/agents/list", Value::Null).await;
    let mut refused = false;
    for _ in 0..10 {
        if let Err(e) = a.call("map/agents/list", Value::Null).await {
            assert_eq!(e["code"], json!(4001));
            refused = true;
            break;
        }
    }
    assert!(refused, "the address's budget is spent by both connections");
}

#[tokio::test]
async fn quotas_on_subscriptions_agents_and_payloads_answer_4002() {
    let (_server, url) = server(|c| {
        c.limits.max_subscriptions_per_session = 2;
        c.limits.max_agents_per_session = 2;
        c.limits.max_payload_bytes = 1024;
    })
    .await;
    let mut healthy = Healthy::new(&url, "h-quota").await;
    let mut c = WsClient::agent(&url, "q-1", json!({})).await;
    let s1 = c.subscribe(Value::Null).await;
    c.subscribe(Value::Null).await;
    assert_eq!(
        c.err("map/subscribe", json!({})).await,
        map_error(
            4002,
            "Quota exceeded: subscriptions per session (limit 2)",
            "resource"
        )
    );
    c.ok("map/unsubscribe", json!({"subscriptionId": s1})).await;
    c.subscribe(Value::Null).await;

    c.ok(
        "map/agents/spawn",
        json!({"agentId": "q-2", "parent": "q-1"}),
    )
    .await;
    assert_eq!(
        c.err("map/agents/register", json!({"agentId": "q-3"}))
            .await,
        map_error(
            4002,
            "Quota exceeded: agents per session (limit 2)",
            "resource"
        )
    );
    assert_eq!(
        c.err(
            "map/agents/spawn",
            json!({"agentId": "q-3", "parent": "q-1"})
        )
        .await["code"],
        json!(4002)
    );
    c.ok("map/agents/unregister", json!({"agentId": "q-2"}))
        .await;
    c.register_agent(json!({"agentId": "q-3"})).await;

    let e = c
        .err(
            "map/send",
            json!({"to": {"agent": "h-quota"}, "payload": "x".repeat(2000)}),
        )
        .await;
    assert_eq!(
        e,
        map_error(
            4002,
            "Quota exceeded: payload of 2002 bytes exceeds 1024 bytes",
            "resource"
        )
    );
    let e = c
        .err(
            "map/inject",
            json!({"agentId": "h-quota", "content": "x".repeat(2000)}),
        )
        .await;
    assert_eq!(e["code"], json!(4002));
    healthy.check().await;
}

#[tokio::test]
async fn connection_limits_refuse_upgrades_and_http_sessions_with_a_status() {
    let (server, url) = server(|c| c.limits.max_connections_per_ip = 2).await;
    let addr = server.local_addrs()[0];
    let a = WsClient::client(&url).await;
    let b = WsClient::client(&url).await;
    match tokio_tungstenite::connect_async(url.as_str()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 429);
            assert_eq!(
                resp.headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()),
                Some("1")
            );
        }
        other => panic!("expected 429, got {:?}", other.map(|_| ())),
    }
    a.close().await;
    // The slot is released once the socket is gone (bounded wait).
    let mut c = None;
    for _ in 0..50 {
        if let Ok((ws, _)) = tokio_tungstenite::connect_async(url.as_str()).await {
            c = Some(ws);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(c.is_some(), "a freed slot admits a new connection");
    drop(c);
    b.close().await;

    // HTTP: a session holds a slot like a socket does.
    let (server2, _url) = start_server(|c| {
        c.limits.exempt_loopback = false;
        c.limits.max_connections_per_ip = 2;
    })
    .await;
    let addr2 = server2.local_addrs()[0];
    let first = http::post(addr2, None, &http::rpc(1, "map/connect", json!({}))).await;
    assert_eq!(first.status, 200);
    let token = first.token().expect("a session token");
    // One slot is the session, one the POST's own TCP connection: a second session is refused.
    let second = http::post(addr2, None, &http::rpc(1, "map/connect", json!({}))).await;
    assert_eq!(second.status, 429);
    assert_eq!(second.json()["error"]["code"], json!(4002));
    // The existing session keeps working.
    let r = http::post(
        addr2,
        Some(&token),
        &http::rpc(2, "map/agents/list", json!({})),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(without_as_of(&r.json()["result"]), json!({"agents": []}));
    let _ = addr;
}

#[tokio::test]
async fn the_total_connection_limit_answers_503() {
    let (_server, url) = server(|c| c.limits.max_connections = 1).await;
    let _a = WsClient::client(&url).await;
    match tokio_tungstenite::connect_async(url.as_str()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 503);
            let body: Value =
                serde_json::from_slice(resp.body().as_deref().unwrap_or_default()).unwrap();
            assert_eq!(
                body,
                json!({"jsonrpc": "2.0", "id": null, "error": {"code": 4000,
                       "message": "Resource exhausted: connections (limit 1)",
                       "data": {"category": "resource", "retryable": true}}})
            );
        }
        other => panic!("expected 503, got {:?}", other.map(|_| ())),
    }
}

/// Issue 23, M5: a page on another site reaches nothing through its visitors' browsers: its
/// WebSocket upgrade and its POSTs are refused (403) on every route, and `/map/rpc` takes only
/// JSON bodies (what a form or a `no-cors` fetch cannot send). Same-origin and listed origins,
/// and clients that send no `Origin` at all, are served.
#[tokio::test]
async fn cross_site_pages_are_refused_on_every_route() {
    let (server, url) = start_server(|c| {
        c.limits.allowed_origins = vec!["https://dash.example".into()];
    })
    .await;
    let addr = server.local_addrs()[0];
    let mut healthy = WsClient::client(&url).await;
    let upgrade = |origin: &'static str, path: &'static str| {
        let headers = vec![
            ("Origin", origin),
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ];
        async move { http::request(addr, "GET", path, &headers, b"").await }
    };
    for path in ["/", "/map", "/gateway/connect"] {
        let r = upgrade("http://evil.example", path).await;
        assert_eq!(
            r.status,
            403,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert!(String::from_utf8_lossy(&r.body).contains("allowed_origins"));
    }
    // The router's own origin and a listed one get their upgrade.
    for origin in [format!("http://{addr}"), "https://dash.example".to_owned()] {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut req = url.as_str().into_client_request().unwrap();
        req.headers_mut().insert("Origin", origin.parse().unwrap());
        let (ws, resp) = with_timeout(tokio_tungstenite::connect_async(req))
            .await
            .unwrap_or_else(|e| panic!("{origin}: {e}"));
        assert_eq!(resp.status(), 101);
        drop(ws);
    }
    // POSTs from another site: refused before the body is looked at.
    let connect = br#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{}}"#;
    for path in ["/map/rpc", "/a2a", "/mamp/v1/messages", "/a2a/remote"] {
        let r = http::request(
            addr,
            "POST",
            path,
            &[
                ("Origin", "http://evil.example"),
                ("Content-Type", "text/plain"),
            ],
            connect,
        )
        .await;
        assert_eq!(r.status, 403, "{path}");
    }
    // /map/rpc: text/plain (a form's type) and no type at all are 415; JSON is served.
    for ct in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let headers: Vec<(&str, &str)> = ct.map(|c| ("Content-Type", c)).into_iter().collect();
        let r = http::request(addr, "POST", "/map/rpc", &headers, connect).await;
        assert_eq!(r.status, 415, "{ct:?}");
        assert!(r.header("map-session").is_none(), "no session was opened");
    }
    let r = http::post(addr, None, std::str::from_utf8(connect).unwrap()).await;
    assert_eq!(r.status, 200);
    healthy.ok("map/agents/list", json!({})).await;
}
