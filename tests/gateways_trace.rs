//! W3C trace context through the gateways (issue 45): an A2A, MAMP or IM caller's HTTP
//! `traceparent` / `tracestate` headers become the `meta.traceparent` / `meta.tracestate` of the
//! MAP message the gateway sends for it (and the `params._meta` of the MAP calls it makes for
//! that request), and the A2A gateway's own outbound calls (remote A2A agents, push webhooks)
//! carry the context as headers. Real server on 127.0.0.1, MAP agents over WebSocket, raw HTTP
//! callers, loopback HTTP sinks. Every await is bounded.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use common::http::{request, HttpResponse};
use common::*;
use futures::StreamExt;
use map_router::auth::config::Secret;
use map_router::client::{AgentHandle, Client, ClientOptions, Messages};
use map_router::protocol::message::Message as MapMessage;
use map_router::protocol::methods::agents::RegisterParams;
use serde_json::{json, Value};
use tokio::sync::mpsc;

const TP_A: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TP_B: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const STATE: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";

const ALICE: &str = "ak-alice-0123456789abcdef";
const BOB: &str = "ak-bob-0123456789abcdef";

async fn server(
    tweak: impl FnOnce(&mut map_router::server::Config),
) -> (map_router::server::Server, SocketAddr, String) {
    let (server, url) = start_server(tweak).await;
    let addr = server.local_addrs()[0];
    (server, addr, url)
}

/// `[auth]` on with the API keys of `alice` and `bob` (and no trusted in-process transport).
fn with_auth(c: &mut map_router::server::Config) {
    c.auth.api_keys.inline = Some(Secret(format!("{ALICE} alice,{BOB} bob")));
}

/// A MAP agent `name` (of `key`'s principal when given) and its inbox.
async fn agent(url: &str, name: &str, key: Option<&str>) -> (Client, AgentHandle, Messages) {
    let mut options = ClientOptions::agent().name(name);
    if let Some(k) = key {
        options = options.api_key(k);
    }
    let client = with_timeout(Client::connect_ws(url, options))
        .await
        .expect("agent connects");
    let handle = with_timeout(client.register(RegisterParams {
        name: Some(name.into()),
        ..RegisterParams::default()
    }))
    .await
    .expect("agent registers");
    let inbox = handle.messages();
    (client, handle, inbox)
}

fn meta(m: &MapMessage) -> Value {
    m.meta.as_ref().map(|r| r.to_value()).unwrap_or(Value::Null)
}

async fn next(inbox: &mut Messages) -> MapMessage {
    with_timeout(inbox.next()).await.expect("inbox open")
}

/// POSTs `body` to `path` with JSON content and `extra` headers.
async fn post_json<'a>(
    addr: SocketAddr,
    path: &str,
    extra: impl IntoIterator<Item = (&'a str, &'a str)>,
    body: &[u8],
) -> HttpResponse {
    let mut headers = vec![("Content-Type", "application/json")];
    headers.extend(extra);
    request(addr, "POST", path, &headers, body).await
}

fn a2a_send(method: &str, text: &str) -> Vec<u8> {
    let params = if method == "SendMessage" {
        json!({"message": {"messageId": format!("m-{text}"), "role": "ROLE_USER",
                           "parts": [{"text": text}]},
               "configuration": {"returnImmediately": true}})
    } else {
        json!({"message": {"kind": "message", "messageId": format!("m-{text}"), "role": "user",
                           "parts": [{"kind": "text", "text": text}]},
               "configuration": {"blocking": false}})
    };
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        .to_string()
        .into_bytes()
}

/// Asserts that `meta` carries no trace context at any depth of its own members.
fn assert_untraced(meta: &Value) {
    assert!(meta.get("traceparent").is_none(), "{meta}");
    assert!(meta.get("tracestate").is_none(), "{meta}");
}

// ---------------------------------------------------------------------------------------------
// A2A, inbound

#[tokio::test]
async fn a2a_headers_become_the_map_message_meta_and_the_task_calls_meta() {
    let (_server, addr, url) = server(|_| {}).await;
    let (_c, h, mut inbox) = agent(&url, "worker", None).await;
    let path = format!("/a2a/agents/{}", h.id());
    // A raw observer of task events: `event._meta` is the create call's `params._meta`.
    let mut obs = WsClient::system(&url).await;
    let sub = obs.subscribe(json!({"eventTypes": ["task.created"]})).await;

    for method in ["SendMessage", "message/send"] {
        let r = post_json(
            addr,
            &path,
            [("traceparent", TP_A), ("tracestate", STATE)],
            &a2a_send(method, "hello"),
        )
        .await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert!(r.json().get("error").is_none(), "{}", r.json());
        let m = next(&mut inbox).await;
        let meta = meta(&m);
        assert_eq!(meta["traceparent"], TP_A, "{meta}");
        assert_eq!(meta["tracestate"], STATE, "{meta}");
        assert_eq!(meta["protocol"], "a2a");
        assert_eq!(meta["a2a"]["method"], method, "{meta}");
        let created = obs.event_of_type(&sub, "task.created").await;
        assert_eq!(
            created["event"]["_meta"]["traceparent"], TP_A,
            "the task create call carries the caller's context: {created}"
        );
        assert_eq!(created["event"]["_meta"]["tracestate"], STATE, "{created}");
    }

    // Without a header: no trace context anywhere, and the method still named.
    let r = post_json(addr, &path, [], &a2a_send("SendMessage", "plain")).await;
    assert_eq!(r.status, 200);
    let m = next(&mut inbox).await;
    assert_untraced(&meta(&m));
    assert_eq!(meta(&m)["a2a"]["method"], "SendMessage");
    let created = obs.event_of_type(&sub, "task.created").await;
    assert!(created["event"].get("_meta").is_none(), "{created}");
}

#[tokio::test]
async fn a2a_task_updates_carry_the_context_of_what_changed_them() {
    let (_server, addr, url) = server(|_| {}).await;
    let (c, h, mut inbox) = agent(&url, "worker", None).await;
    let path = format!("/a2a/agents/{}", h.id());
    let mut obs = WsClient::system(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["task.*", "task.updated"]}))
        .await;
    let r = post_json(
        addr,
        &path,
        [("traceparent", TP_A)],
        &a2a_send("SendMessage", "work"),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let m = next(&mut inbox).await;
    let task = meta(&m)["a2a"]["taskId"].as_str().unwrap().to_owned();
    // The agent answers in a trace of its own (its reply's `meta.traceparent`).
    with_timeout(
        c.send_with(map_router::protocol::methods::messaging::SendParams {
            to: json!({"agent": m.from}).into(),
            payload: Some(json!("finished").into()),
            meta: Some(
                json!({"correlationId": meta(&m)["correlationId"], "isResult": true,
                   "traceparent": TP_B})
                .into(),
            ),
        }),
    )
    .await
    .unwrap();
    let mut before_reply = 0;
    let mut completed = false;
    for _ in 0..20 {
        let ev = obs.next_event(&sub).await;
        let e = &ev["event"];
        assert_eq!(e["data"]["task"]["id"], task.as_str(), "{ev}");
        let a2a = &e["data"]["task"]["meta"]["a2a"];
        // The task as made (no record yet, seq 0: submitted, seq 1: working) is the caller's
        // request; from seq 2 on, the agent's reply (an artifact, then completed).
        if a2a["seq"].as_u64().is_some_and(|n| n >= 2) {
            assert_eq!(e["_meta"]["traceparent"], TP_B, "{ev}");
            if a2a["state"] == "completed" {
                completed = true;
                break;
            }
            continue;
        }
        assert_eq!(e["_meta"]["traceparent"], TP_A, "{ev}");
        before_reply += 1;
    }
    assert!(completed && before_reply >= 2, "{before_reply}");
}

#[tokio::test]
async fn a2a_streaming_sends_name_their_method_too() {
    let (_server, addr, url) = server(|_| {}).await;
    let (_c, h, mut inbox) = agent(&url, "streamer", None).await;
    let path = format!("/a2a/agents/{}", h.id());
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "message/stream", "params": {
        "message": {"kind": "message", "messageId": "m-s", "role": "user",
                    "parts": [{"kind": "text", "text": "go"}]}}})
    .to_string();
    // The stream stays open; its head is enough.
    let mut s = common::http::connect_from(None, addr, None).await;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\ntraceparent: {TP_B}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::io::AsyncWriteExt::write_all(&mut s, req.as_bytes())
        .await
        .unwrap();
    let m = next(&mut inbox).await;
    assert_eq!(meta(&m)["a2a"]["method"], "message/stream");
    assert_eq!(meta(&m)["traceparent"], TP_B);
    assert_untraced(&meta(&m)["a2a"]);
}

#[tokio::test]
async fn a2a_invalid_or_injecting_headers_are_ignored() {
    let (_server, addr, url) = server(|_| {}).await;
    let (_c, h, mut inbox) = agent(&url, "worker", None).await;
    let path = format!("/a2a/agents/{}", h.id());
    let invalid = [
        TP_A.to_uppercase(),
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01".to_owned(),
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        "00-4bf92f35".to_owned(),
        // JSON injection: a version-00 header is exactly 55 characters.
        format!("{TP_A}\",\"isResult\":true,\"x\":{{\"y\":\""),
        format!("{TP_A}\"}}"),
    ];
    for bad in &invalid {
        let r = post_json(
            addr,
            &path,
            [("traceparent", bad.as_str()), ("tracestate", STATE)],
            &a2a_send("SendMessage", "x"),
        )
        .await;
        assert_eq!(r.status, 200, "{bad}: {}", String::from_utf8_lossy(&r.body));
        let m = next(&mut inbox).await;
        let meta = meta(&m);
        assert_untraced(&meta);
        assert!(
            meta.get("isResult").is_none() && meta.get("x").is_none(),
            "{meta}"
        );
    }
    // Two traceparent headers: invalid (W3C: more than one is not a context).
    let r = post_json(
        addr,
        &path,
        [("traceparent", TP_A), ("traceparent", TP_B)],
        &a2a_send("SendMessage", "two"),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_untraced(&meta(&next(&mut inbox).await));

    // A later version may append `-…`: kept as one JSON string (escaped), nothing injected.
    let future = format!("01{}-\"}},\"isResult\":true,\"z\":{{\"", &TP_A[2..]);
    let hostile_state = "a=\"},\"isResult\":true,\"w\":{\"";
    let r = post_json(
        addr,
        &path,
        [
            ("traceparent", future.as_str()),
            ("tracestate", hostile_state),
        ],
        &a2a_send("SendMessage", "future"),
    )
    .await;
    assert_eq!(r.status, 200);
    let m = next(&mut inbox).await;
    let meta = meta(&m);
    assert_eq!(meta["traceparent"], future.as_str(), "{meta}");
    assert_eq!(meta["tracestate"], hostile_state, "{meta}");
    assert!(
        meta.get("isResult").is_none() && meta.get("z").is_none() && meta.get("w").is_none(),
        "{meta}"
    );
    assert_eq!(meta["correlationId"], meta["a2a"]["taskId"]);
}

#[tokio::test]
async fn a2a_a_callers_context_never_reaches_another_callers_message() {
    let (_server, addr, url) = server(with_auth).await;
    let (_ca, ha, mut inbox_a) = agent(&url, "worker-a", Some(ALICE)).await;
    let (_cb, hb, mut inbox_b) = agent(&url, "worker-b", Some(BOB)).await;
    let bearer_a = format!("Bearer {ALICE}");
    let bearer_b = format!("Bearer {BOB}");
    let (path_a, path_b) = (
        format!("/a2a/agents/{}", ha.id()),
        format!("/a2a/agents/{}", hb.id()),
    );
    // Concurrent requests of two principals, each with its own context, several rounds; and
    // a request of alice's without a header among them (nothing sticks to her session).
    for round in 0..5 {
        let body_a = a2a_send("SendMessage", &format!("a{round}"));
        let body_b = a2a_send("SendMessage", &format!("b{round}"));
        let body_plain = a2a_send("SendMessage", &format!("p{round}"));
        let (ra, rb, rp) = tokio::join!(
            post_json(
                addr,
                &path_a,
                [("Authorization", bearer_a.as_str()), ("traceparent", TP_A)],
                &body_a
            ),
            post_json(
                addr,
                &path_b,
                [("Authorization", bearer_b.as_str()), ("traceparent", TP_B)],
                &body_b
            ),
            post_json(
                addr,
                &path_b,
                [("Authorization", bearer_a.as_str())],
                &body_plain
            ),
        );
        for r in [&ra, &rb, &rp] {
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            assert!(r.json().get("error").is_none(), "{}", r.json());
        }
        let ma = next(&mut inbox_a).await;
        assert_eq!(meta(&ma)["traceparent"], TP_A, "{}", meta(&ma));
        // worker-b gets bob's message and alice's plain one, in either order.
        for _ in 0..2 {
            let m = next(&mut inbox_b).await;
            let text = m.payload.as_ref().unwrap().get().to_owned();
            if text.contains(&format!("b{round}")) {
                assert_eq!(meta(&m)["traceparent"], TP_B, "{}", meta(&m));
            } else {
                assert!(text.contains(&format!("p{round}")), "{text}");
                assert_untraced(&meta(&m));
            }
        }
    }
    // Nothing else arrived.
    let quiet = tokio::time::timeout(QUIET, inbox_a.next()).await;
    assert!(quiet.is_err(), "an unexpected message: {quiet:?}");
}

// ---------------------------------------------------------------------------------------------
// A2A, outbound

/// What a loopback sink saw: the headers of each request.
type Seen = Arc<Mutex<Vec<HeaderMap>>>;

/// A scripted remote A2A agent (v1.0, not streaming) whose answer is a completed message; its
/// request headers go to `seen` and a signal to the returned channel.
async fn remote_agent() -> (String, Seen, mpsc::UnboundedReceiver<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Seen::default();
    let (tx, rx) = mpsc::unbounded_channel();
    let card = json!({"name": "Traced Remote", "description": "scripted",
        "supportedInterfaces": [{"url": "/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
        "version": "1", "capabilities": {"streaming": false}, "skills": []});
    let (s, t) = (Arc::clone(&seen), tx);
    let app = axum::Router::new()
        .route(
            "/.well-known/agent-card.json",
            get(move || {
                let card = card.clone();
                async move { js(&card) }
            }),
        )
        .route(
            "/rpc",
            post(move |headers: HeaderMap, body: String| {
                let (s, t) = (Arc::clone(&s), t.clone());
                async move {
                    crate::lock(&s).push(headers);
                    let _ = t.send(());
                    let req: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                    // A completed task: the call also mirrors it as a MAP task.
                    let n = crate::lock(&s).len();
                    js(
                        &json!({"jsonrpc": "2.0", "id": req["id"], "result": {"task": {
                        "id": format!("rt-{n}"), "contextId": "ctx-r",
                        "status": {"state": "TASK_STATE_COMPLETED"},
                        "artifacts": [{"artifactId": "a", "parts": [{"text": "done"}]}]}}}),
                    )
                }
            }),
        );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (base, seen, rx)
}

fn obj(v: Value) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}

fn js(v: &Value) -> Response {
    ([("content-type", "application/json")], v.to_string()).into_response()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn a2a_remote_calls_carry_the_messages_trace_context() {
    let (base, seen, mut hits) = remote_agent().await;
    let allow = format!("{base}/");
    let (_server, addr, url) = server(|c| c.a2a.remote_allow = vec![allow]).await;
    let r = request(
        addr,
        "POST",
        "/a2a/remote",
        &[("Content-Type", "application/json")],
        json!({"cardUrl": format!("{base}/.well-known/agent-card.json"), "name": "traced"})
            .to_string()
            .as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let remote = r.json()["agent"]["id"].as_str().unwrap().to_owned();
    let sender = with_timeout(Client::connect_ws(
        &url,
        ClientOptions::new().name("sender"),
    ))
    .await
    .unwrap();
    let mut obs = WsClient::system(&url).await;
    let sub = obs.subscribe(json!({"eventTypes": ["task.created"]})).await;

    // A traced message: the call carries its context (the router's span for it when the
    // router exports traces, else the message's own context, as here).
    let reply = with_timeout(sender.request_with(
        json!({"agent": remote}),
        json!("traced"),
        obj(json!({"traceparent": TP_A, "tracestate": STATE})),
        Duration::from_secs(5),
    ))
    .await
    .expect("a reply");
    assert_eq!(reply.payload.as_ref().unwrap().get(), "\"done\"");
    with_timeout(hits.recv()).await.unwrap();
    {
        let seen = lock(&seen);
        assert_eq!(seen.len(), 1);
        assert_eq!(header(&seen[0], "traceparent"), Some(TP_A));
        assert_eq!(header(&seen[0], "tracestate"), Some(STATE));
    }
    // The MAP task mirroring the remote task is made with the same context.
    let created = obs.event_of_type(&sub, "task.created").await;
    assert_eq!(created["event"]["_meta"]["traceparent"], TP_A, "{created}");

    // An untraced one, and one with an invalid context: no trace headers at all.
    for meta in [json!({}), json!({"traceparent": TP_A.to_uppercase()})] {
        with_timeout(sender.request_with(
            json!({"agent": remote}),
            json!("untraced"),
            obj(meta),
            Duration::from_secs(5),
        ))
        .await
        .expect("a reply");
        with_timeout(hits.recv()).await.unwrap();
        {
            let seen = lock(&seen);
            let last = seen.last().unwrap();
            assert!(header(last, "traceparent").is_none(), "{last:?}");
            assert!(header(last, "tracestate").is_none(), "{last:?}");
        }
        let created = obs.event_of_type(&sub, "task.created").await;
        assert!(created["event"].get("_meta").is_none(), "{created}");
    }
}

/// A webhook sink: each POST's headers go to the channel.
async fn webhook() -> (String, mpsc::UnboundedReceiver<HeaderMap>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/hook",
        post(move |headers: HeaderMap| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(headers);
                "ok"
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, rx)
}

#[tokio::test]
async fn a2a_push_notifications_carry_the_senders_trace_context() {
    let (hook, mut hooked) = webhook().await;
    let (hook2, mut hooked2) = webhook().await;
    let allowed = vec![hook.clone(), hook2.clone()];
    let (_server, addr, url) = server(|c| c.a2a.push_allow = allowed).await;
    let (_c, h, mut inbox) = agent(&url, "worker", None).await;
    let path = format!("/a2a/agents/{}", h.id());
    let send = |hook: &str, text: &str| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
            "message": {"messageId": format!("m-{text}"), "role": "ROLE_USER", "parts": [{"text": text}]},
            "configuration": {"returnImmediately": true,
                              "taskPushNotificationConfig": {"url": hook}}}})
        .to_string()
    };
    let r = post_json(
        addr,
        &path,
        [("traceparent", TP_A), ("tracestate", STATE)],
        send(&hook, "traced").as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // The first notification (the task as made).
    let got = within(Duration::from_secs(10), hooked.recv())
        .await
        .unwrap();
    assert_eq!(header(&got, "traceparent"), Some(TP_A), "{got:?}");
    assert_eq!(header(&got, "tracestate"), Some(STATE), "{got:?}");
    next(&mut inbox).await;

    // Another caller's untraced task, with its own webhook: none.
    let r = post_json(addr, &path, [], send(&hook2, "plain").as_bytes()).await;
    assert_eq!(r.status, 200);
    let got = within(Duration::from_secs(10), hooked2.recv())
        .await
        .unwrap();
    assert!(header(&got, "traceparent").is_none(), "{got:?}");
    assert!(header(&got, "tracestate").is_none(), "{got:?}");
    next(&mut inbox).await;
}

// ---------------------------------------------------------------------------------------------
// MAMP and IM, inbound

fn mamp_envelope(addr: SocketAddr, to: &str, text: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "protocol": "mamp/1.0",
        "message_id": format!("msg-{text}"),
        "from": "agent://remote.example/caller",
        "to": format!("agent://{}/{to}", addr.ip()),
        "content": text,
        "metadata": {"timestamp": "2026-03-04T10:00:00Z"},
    }))
    .unwrap()
}

#[tokio::test]
async fn mamp_headers_become_the_map_message_meta() {
    let (_server, addr, url) = server(|_| {}).await;
    let (_c, _h, mut inbox) = agent(&url, "analyst", None).await;
    let path = "/mamp/v1/messages";
    let r = post_json(
        addr,
        path,
        [("traceparent", TP_A), ("tracestate", STATE)],
        &mamp_envelope(addr, "analyst", "traced"),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let m = next(&mut inbox).await;
    let first = meta(&m);
    assert_eq!(first["traceparent"], TP_A, "{first}");
    assert_eq!(first["tracestate"], STATE, "{first}");
    assert_eq!(first["protocol"], "mamp");
    assert_eq!(m.payload.as_ref().unwrap().get(), "\"traced\"");

    let injecting = format!("{TP_A}\",\"isResult\":true,\"x\":\"");
    for headers in [
        vec![],
        vec![("traceparent", TP_A.to_uppercase())],
        vec![("traceparent", injecting)],
    ] {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = post_json(addr, path, h, &mamp_envelope(addr, "analyst", "plain")).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let meta = meta(&next(&mut inbox).await);
        assert_untraced(&meta);
        assert!(
            meta.get("isResult").is_none() && meta.get("x").is_none(),
            "{meta}"
        );
    }
}

#[tokio::test]
async fn im_headers_become_the_map_message_meta_and_stay_with_their_caller() {
    let (_server, addr, url) = server(with_auth).await;
    let (_c, _h, mut inbox) = agent(&url, "analyst", Some(ALICE)).await;
    let to = format!("agent://{}/analyst", addr.ip());
    let body = |text: &str| json!({"to": to, "content": text}).to_string();
    let bearer_a = format!("Bearer {ALICE}");
    let bearer_b = format!("Bearer {BOB}");
    for round in 0..3 {
        let (a, b, plain) = (
            body(&format!("a{round}")),
            body(&format!("b{round}")),
            body(&format!("p{round}")),
        );
        let (ra, rb, rp) = tokio::join!(
            post_json(
                addr,
                "/gateway/send",
                [
                    ("Authorization", bearer_a.as_str()),
                    ("traceparent", TP_A),
                    ("tracestate", STATE)
                ],
                a.as_bytes()
            ),
            post_json(
                addr,
                "/gateway/send",
                [("Authorization", bearer_b.as_str()), ("traceparent", TP_B)],
                b.as_bytes()
            ),
            post_json(
                addr,
                "/gateway/send",
                [("Authorization", bearer_a.as_str())],
                plain.as_bytes()
            ),
        );
        for r in [&ra, &rb, &rp] {
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        }
        for _ in 0..3 {
            let m = next(&mut inbox).await;
            let meta = meta(&m);
            assert_eq!(meta["protocol"], "im");
            let text = m.payload.as_ref().unwrap().get().to_owned();
            if text.contains('a') {
                assert_eq!(meta["traceparent"], TP_A, "{meta}");
                assert_eq!(meta["tracestate"], STATE, "{meta}");
            } else if text.contains('b') {
                assert_eq!(meta["traceparent"], TP_B, "{meta}");
                assert!(meta.get("tracestate").is_none(), "{meta}");
            } else {
                assert_untraced(&meta);
            }
        }
    }
    // An invalid header: nothing.
    let bad_tp = format!("{TP_A}\"}}");
    let r = post_json(
        addr,
        "/gateway/send",
        [
            ("Authorization", bearer_a.as_str()),
            ("traceparent", bad_tp.as_str()),
        ],
        body("bad").as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_untraced(&meta(&next(&mut inbox).await));
}

/// A remote MAMP agent's endpoint: each POST's headers go to the channel.
async fn mamp_endpoint() -> (String, mpsc::UnboundedReceiver<HeaderMap>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/mamp/v1/messages",
        post(move |headers: HeaderMap| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(headers);
                js(&json!({"conversation_id": "theirs-1", "status": "received"}))
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (base, rx)
}

#[tokio::test]
async fn mamp_posts_to_remote_agents_carry_the_messages_trace_context() {
    let (endpoint, mut posted) = mamp_endpoint().await;
    let (_server, _addr, url) = server(|c| {
        c.gateways.mamp.remote = vec![map_router::gateway::config::RemoteMamp {
            uri: "agent://other.example/analyst".into(),
            endpoint,
            token: None,
            name: Some("Remote Analyst".into()),
            principal: None,
        }];
    })
    .await;
    let client = with_timeout(Client::connect_ws(&url, ClientOptions::new().name("c")))
        .await
        .unwrap();
    within(Duration::from_secs(5), async {
        while client
            .get_agent("agent://other.example/analyst")
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    for (meta, expected) in [
        (
            json!({"traceparent": TP_A, "tracestate": STATE}),
            Some(TP_A),
        ),
        (json!({}), None),
        (json!({"traceparent": TP_A.to_uppercase()}), None),
    ] {
        with_timeout(
            client.send_with(map_router::protocol::methods::messaging::SendParams {
                to: json!({"agent": "agent://other.example/analyst"}).into(),
                payload: Some(json!("hello").into()),
                meta: Some(meta.into()),
            }),
        )
        .await
        .unwrap();
        let h = with_timeout(posted.recv()).await.unwrap();
        assert_eq!(header(&h, "traceparent"), expected, "{h:?}");
        assert_eq!(header(&h, "tracestate"), expected.map(|_| STATE), "{h:?}");
    }
}

#[tokio::test]
async fn im_send_frames_carry_their_own_context_not_the_connections() {
    use futures::SinkExt;
    use tokio_tungstenite::tungstenite::Message as Ws;
    let (_server, addr, url) = server(|_| {}).await;
    let (_c, _h, mut inbox) = agent(&url, "analyst", None).await;
    // The upgrade carries a context: it is no message's.
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        format!("ws://{addr}/gateway/connect"),
    )
    .unwrap();
    req.headers_mut()
        .insert("traceparent", TP_B.parse().unwrap());
    let (mut s, _) = with_timeout(tokio_tungstenite::connect_async(req))
        .await
        .unwrap();
    let frame = async |s: &mut _, v: Value| -> Value {
        let s: &mut tokio_tungstenite::WebSocketStream<_> = s;
        with_timeout(s.send(Ws::Text(v.to_string().into())))
            .await
            .unwrap();
        loop {
            match with_timeout(s.next()).await {
                Some(Ok(Ws::Text(t))) => return serde_json::from_str(t.as_str()).unwrap(),
                Some(Ok(Ws::Ping(_) | Ws::Pong(_))) => continue,
                other => panic!("expected a text frame, got {other:?}"),
            }
        }
    };
    let reg = frame(
        &mut s,
        json!({"type": "register", "agent_uri": "agent://internal/pc-agent"}),
    )
    .await;
    assert_eq!(reg["type"], "registered", "{reg}");
    let to = format!("agent://{}/analyst", addr.ip());
    for (extra, expected) in [
        (
            json!({"traceparent": TP_A, "tracestate": STATE}),
            Some(TP_A),
        ),
        (json!({}), None),
        (json!({"traceparent": format!("{TP_A}\"}}")}), None),
        (json!({"traceparent": 7}), None),
    ] {
        let mut f = json!({"type": "send", "to": to, "content": "hi"});
        for (k, v) in extra.as_object().unwrap() {
            f[k] = v.clone();
        }
        let sent = frame(&mut s, f).await;
        assert_eq!(sent["type"], "sent", "{sent}");
        let meta = meta(&next(&mut inbox).await);
        match expected {
            Some(tp) => {
                assert_eq!(meta["traceparent"], tp, "{meta}");
                assert_eq!(meta["tracestate"], STATE, "{meta}");
            }
            None => assert_untraced(&meta),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// AIP: gRPC metadata both ways

mod aip {
    use super::*;
    use map_router::gateway::aip::proto::gateway_service_client::GatewayServiceClient;
    use map_router::gateway::aip::proto::tool_service_server::{ToolService, ToolServiceServer};
    use map_router::gateway::aip::proto::{
        content_item, ContentItem, ToolInfo, ToolRequest, ToolResponse,
    };
    use map_router::protocol::json::RawJson;
    use map_router::protocol::methods::messaging::SendParams;
    use tonic::transport::server::TcpIncoming;
    use tonic::{Request, Response, Status};

    /// A tool that reports the trace metadata of each call (`traceparent`, `tracestate`).
    struct Recorder(mpsc::UnboundedSender<(Option<String>, Option<String>)>);

    #[tonic::async_trait]
    impl ToolService for Recorder {
        async fn call_tool(
            &self,
            r: Request<ToolRequest>,
        ) -> Result<Response<ToolResponse>, Status> {
            let md = |k: &str| {
                r.metadata()
                    .get(k)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let _ = self.0.send((md("traceparent"), md("tracestate")));
            let r = r.into_inner();
            Ok(Response::new(ToolResponse {
                sender_id: r.receiver_id,
                receiver_id: r.sender_id,
                session_id: r.session_id,
                is_error: false,
                error_message: "No Error".into(),
                content: vec![ContentItem {
                    data: Some(content_item::Data::Text("ok".into())),
                }],
            }))
        }
    }

    async fn aip_server() -> (map_router::server::Server, String, String) {
        let (server, url) =
            start_server(|c| c.aip.listen = Some("127.0.0.1:0".parse().unwrap())).await;
        let gw = format!("http://{}", server.aip_addr().unwrap());
        (server, url, gw)
    }

    #[tokio::test]
    async fn map_to_aip_tool_calls_carry_only_a_valid_context() {
        let (_server, url, gw) = aip_server().await;
        let (tx, mut calls) = mpsc::unbounded_channel();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tool_addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(ToolServiceServer::new(Recorder(tx)))
                .serve_with_incoming(TcpIncoming::from(listener))
                .await;
        });
        let mut gateway = with_timeout(GatewayServiceClient::connect(gw))
            .await
            .unwrap();
        with_timeout(gateway.register_tool(ToolInfo {
            tool_id: "tr-tool".into(),
            address: tool_addr,
            name: "tr-tool".into(),
            domain: "rust".into(),
            ..Default::default()
        }))
        .await
        .unwrap();
        let client = with_timeout(Client::connect_ws(&url, ClientOptions::new().name("c")))
            .await
            .unwrap();
        let call = |meta: Value| {
            let mut m = obj(meta);
            m.insert("protocol".into(), json!("aip"));
            m.insert(
                "aip".into(),
                json!({"kind": "tool_call", "toolName": "echo"}),
            );
            client.request_with(
                "tr-tool",
                json!({"tool": "echo", "arguments": {}}),
                m,
                Duration::from_secs(5),
            )
        };
        with_timeout(call(json!({"traceparent": TP_A, "tracestate": STATE})))
            .await
            .expect("the tool answers");
        let seen = with_timeout(calls.recv()).await.unwrap();
        assert_eq!(seen, (Some(TP_A.to_owned()), Some(STATE.to_owned())));
        for meta in [
            json!({}),
            json!({"traceparent": TP_A.to_uppercase(), "tracestate": STATE}),
            json!({"tracestate": STATE}),
        ] {
            with_timeout(call(meta.clone()))
                .await
                .expect("the tool answers");
            let seen = with_timeout(calls.recv()).await.unwrap();
            assert_eq!(seen, (None, None), "{meta}");
        }
    }

    #[tokio::test]
    async fn aip_to_map_tool_calls_put_only_a_valid_context_in_meta() {
        let (_server, url, gw) = aip_server().await;
        let (c, h, mut inbox) = agent(&url, "mapper", None).await;
        let mapper = h.id().to_string();
        let gateway = with_timeout(GatewayServiceClient::connect(gw))
            .await
            .unwrap();
        let cases: [(Option<&str>, Option<&str>, Option<&str>); 4] = [
            (Some(TP_B), Some(STATE), Some(TP_B)),
            (None, None, None),
            (
                Some("00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"),
                Some(STATE),
                None,
            ),
            (None, Some(STATE), None),
        ];
        for (parent, state, expected) in cases {
            let mut request = Request::new(ToolRequest {
                sender_id: "outside".into(),
                receiver_id: mapper.clone(),
                session_id: "s-1".into(),
                tool_name: "look".into(),
                arguments: Default::default(),
            });
            if let Some(p) = parent {
                request
                    .metadata_mut()
                    .insert("traceparent", p.parse().unwrap());
            }
            if let Some(s) = state {
                request
                    .metadata_mut()
                    .insert("tracestate", s.parse().unwrap());
            }
            let mut g = gateway.clone();
            let pending = tokio::spawn(async move { g.route_tool_calling(request).await });
            let m = next(&mut inbox).await;
            let meta = meta(&m);
            assert_eq!(meta["protocol"], "aip", "{meta}");
            match expected {
                Some(tp) => {
                    assert_eq!(meta["traceparent"], tp, "{meta}");
                    assert_eq!(meta["tracestate"], STATE, "{meta}");
                }
                None => assert_untraced(&meta),
            }
            with_timeout(c.send_with(SendParams {
                to: RawJson::from(json!({"agent": m.from})),
                payload: Some(RawJson::from(json!("seen"))),
                meta: Some(RawJson::from(json!({
                    "correlationId": meta["correlationId"], "isResult": true
                }))),
            }))
            .await
            .unwrap();
            let answer = with_timeout(pending).await.unwrap();
            assert!(answer.is_ok(), "{answer:?}");
        }
    }
}
