//! The A2A gateway's client side over real sockets: a scripted A2A agent (axum on
//! `127.0.0.1:0`, raw JSON as the A2A spec writes it) registered by card URL, and MAP clients
//! (the Rust client over WebSocket) that message it. The SDK-served agents of
//! `tests/interop/a2a_remote.mjs` cover the happy paths; here are the answers an SDK server
//! does not easily give: JSON-RPC errors, direct messages, a task left working (polled), a
//! stream that ends early, input-required and its follow-up, a remote that goes away, and the
//! registration errors. Every await is bounded.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use common::http::request;
use common::*;
use map_router::client::{Client, ClientOptions};
use map_router::protocol::message::Message as MapMessage;
use serde_json::{json, Value};

/// What the scripted agent saw: `(method, A2A-Version header, params)`.
type Log = Arc<Mutex<Vec<(String, Option<String>, Value)>>>;

#[derive(Clone)]
struct Fake {
    base: String,
    log: Log,
    streaming: bool,
    v03: bool,
}

fn js(v: Value) -> Response {
    ([("content-type", "application/json")], v.to_string()).into_response()
}

fn text_of(params: &Value) -> String {
    params["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn task(id: &str, state: &str, artifacts: Value) -> Value {
    json!({"id": id, "contextId": "ctx-1", "status": {"state": state}, "artifacts": artifacts})
}

async fn card(axum::extract::State(f): axum::extract::State<Fake>) -> Response {
    let card = if f.v03 {
        json!({"name": "Old Fake", "url": format!("{}/rpc", f.base), "protocolVersion": "0.3.0",
               "version": "1", "capabilities": {"streaming": f.streaming}, "skills": []})
    } else {
        json!({"name": "Fake Agent", "description": "scripted",
               "supportedInterfaces": [{"url": "/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
               "version": "1", "capabilities": {"streaming": f.streaming},
               "skills": [{"id": "s1", "name": "Skill", "tags": ["z", "a"]}]})
    };
    js(card).into_response()
}

async fn rpc(
    axum::extract::State(f): axum::extract::State<Fake>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let req: Value = serde_json::from_str(&body).expect("JSON-RPC");
    let method = req["method"].as_str().unwrap_or_default().to_owned();
    let params = req["params"].clone();
    let id = req["id"].clone();
    let version = headers
        .get("a2a-version")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    f.log
        .lock()
        .unwrap()
        .push((method.clone(), version, params.clone()));
    let ok = |result: Value| js(json!({"jsonrpc": "2.0", "id": id, "result": result}));
    match method.as_str() {
        "SendMessage" | "message/send" => {
            let text = text_of(&params);
            let wrap = |kind: &str, v: Value| {
                if f.v03 {
                    let mut v = v;
                    v["kind"] = json!(kind);
                    v
                } else {
                    json!({ kind: v })
                }
            };
            match text.as_str() {
                "error" => js(json!({"jsonrpc": "2.0", "id": id,
                    "error": {"code": -32603, "message": "boom"}}))
                .into_response(),
                "message" => ok(wrap(
                    "message",
                    json!({"messageId": "r1", "role": "ROLE_AGENT",
                    "parts": [{"text": "direct"}]}),
                ))
                .into_response(),
                "slow" => ok(wrap(
                    "task",
                    task("t-slow", "TASK_STATE_WORKING", json!([])),
                ))
                .into_response(),
                "input" => ok(wrap(
                    "task",
                    task("t-in", "TASK_STATE_INPUT_REQUIRED", json!([])),
                ))
                .into_response(),
                _ if params["message"]["taskId"] == "t-in" => ok(wrap(
                    "task",
                    task(
                        "t-in",
                        "TASK_STATE_COMPLETED",
                        json!([{"artifactId": "a", "parts": [{"text": "thanks"}]}]),
                    ),
                ))
                .into_response(),
                _ => {
                    // Echo the parts as the artifact, byte for byte.
                    #[derive(serde::Deserialize)]
                    struct M<'a> {
                        #[serde(borrow)]
                        parts: &'a serde_json::value::RawValue,
                    }
                    #[derive(serde::Deserialize)]
                    struct P<'a> {
                        #[serde(borrow)]
                        message: M<'a>,
                    }
                    #[derive(serde::Deserialize)]
                    struct R<'a> {
                        #[serde(borrow)]
                        params: P<'a>,
                    }
                    let r: R = serde_json::from_str(&body).unwrap();
                    let state = if f.v03 {
                        "completed"
                    } else {
                        "TASK_STATE_COMPLETED"
                    };
                    let kind = if f.v03 { r#""kind":"task","# } else { "" };
                    let inner = format!(
                        r#"{{{kind}"id":"t-echo","contextId":"ctx-1","status":{{"state":"{state}"}},"artifacts":[{{"artifactId":"a","parts":{}}}]}}"#,
                        r.params.message.parts.get()
                    );
                    let result = if f.v03 {
                        inner
                    } else {
                        format!(r#"{{"task":{inner}}}"#)
                    };
                    (
                        [("content-type", "application/json")],
                        format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#),
                    )
                        .into_response()
                }
            }
        }
        "GetTask" | "tasks/get" if params["id"] == "t-slow" => ok(json!({"task": task(
            "t-slow",
            "TASK_STATE_COMPLETED",
            json!([{"artifactId": "a", "parts": [{"text": "done later"}]}])
        )}))
        .into_response(),
        "SendStreamingMessage" => {
            // Working, then the stream just ends (no final state).
            let event = json!({"jsonrpc": "2.0", "id": id, "result": {"statusUpdate":
                {"taskId": "t-early", "contextId": "ctx-1", "status": {"state": "TASK_STATE_WORKING"}}}});
            (
                [("content-type", "text/event-stream")],
                format!("data: {event}\n\n"),
            )
                .into_response()
        }
        _ => js(json!({"jsonrpc": "2.0", "id": id,
            "error": {"code": -32001, "message": "task not found"}}))
        .into_response(),
    }
}

/// Serves a scripted agent; the returned handle stops it when aborted.
async fn fake(streaming: bool, v03: bool) -> (Fake, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let f = Fake {
        base: format!("http://{addr}"),
        log: Log::default(),
        streaming,
        v03,
    };
    let app = axum::Router::new()
        .route("/.well-known/agent-card.json", get(card))
        .route("/.well-known/agent.json", get(card))
        .route("/rpc", post(rpc))
        .with_state(f.clone());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (f, task)
}

/// Allows registering the scripted agents `fakes` by request (their card and endpoint are on
/// loopback, which only an entry naming the host and port allows).
fn allow(c: &mut map_router::server::Config, fakes: &[&Fake]) {
    c.a2a.remote_allow = fakes.iter().map(|f| format!("{}/", f.base)).collect();
}

async fn register(addr: SocketAddr, body: Value) -> (u16, Value) {
    let r = request(
        addr,
        "POST",
        "/a2a/remote",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
    .await;
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    )
}

async fn sender(url: &str) -> Client {
    with_timeout(Client::connect_ws(url, ClientOptions::new().name("sender")))
        .await
        .expect("sender connects")
}

/// `request()` to `agent` with `payload`: the final reply (an `isResult` message).
async fn ask(c: &Client, agent: &str, payload: Value) -> MapMessage {
    c.request(json!({ "agent": agent }), payload, Duration::from_secs(10))
        .await
        .expect("a final reply")
}

/// Sends `payload` (JSON text, verbatim) with `meta` and waits in `inbox` for the `isResult`
/// message with the same `correlationId`.
async fn ask_raw(
    c: &Client,
    inbox: &mut map_router::client::Messages,
    agent: &str,
    payload: &str,
    meta_value: Value,
) -> MapMessage {
    use futures::StreamExt;
    let correlation = meta_value["correlationId"].clone();
    with_timeout(
        c.send_with(map_router::protocol::methods::messaging::SendParams {
            to: json!({ "agent": agent }).into(),
            payload: Some(map_router::protocol::json::RawJson::from_text(payload).unwrap()),
            meta: Some(meta_value.into()),
        }),
    )
    .await
    .unwrap();
    within(Duration::from_secs(10), async {
        loop {
            let m = inbox.next().await.expect("inbox open");
            if meta(&m)["correlationId"] == correlation && meta(&m)["isResult"] == true {
                return m;
            }
        }
    })
    .await
}

fn meta(m: &MapMessage) -> Value {
    m.meta.as_ref().map(|r| r.to_value()).unwrap_or(Value::Null)
}

#[tokio::test]
async fn every_kind_of_answer_comes_back_as_one_result() {
    let (f, _task) = fake(false, false).await;
    let (server, url) = start_server(|c| allow(c, &[&f])).await;
    let addr = server.local_addrs()[0];
    let (status, body) = register(
        addr,
        json!({"cardUrl": format!("{}/.well-known/agent-card.json", f.base)}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["agent"]["id"], "fake-agent");
    assert_eq!(body["agent"]["role"], "a2a-remote");
    assert_eq!(body["remote"]["url"], format!("{}/rpc", f.base));
    // The skills are the card's, byte for byte (key order kept).
    let c = sender(&url).await;
    let listed = with_timeout(c.get_agent("fake-agent")).await.unwrap();
    assert!(listed
        .metadata
        .as_ref()
        .unwrap()
        .get()
        .contains(r#""skills":[{"id":"s1","name":"Skill","tags":["z","a"]}]"#));

    // A completed task: its artifact's content; {"parts": [...]} goes as those parts, verbatim.
    let r = ask(&c, "fake-agent", json!("hello")).await;
    assert_eq!(r.payload_value(), Some(json!("hello")));
    assert_eq!(meta(&r)["a2a"]["state"], "completed");
    assert_eq!(meta(&r)["isResult"], true);
    assert_eq!(r.from, "fake-agent");
    let mut inbox = c.messages();
    let r = ask_raw(
        &c,
        &mut inbox,
        "fake-agent",
        r#"{"parts":[{"text":"a"},{"data":{"z":1,"a":2}}]}"#,
        json!({"correlationId": "parts-1"}),
    )
    .await;
    assert_eq!(
        r.payload.as_ref().unwrap().get(),
        r#"{"parts":[{"text":"a"},{"data":{"z":1,"a":2}}]}"#
    );
    // A JSON-RPC error: a failed result that says so.
    let r = ask(&c, "fake-agent", json!("error")).await;
    assert_eq!(meta(&r)["a2a"]["state"], "failed");
    let why = r.payload_value().unwrap()["a2a"]["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(why.contains("-32603") && why.contains("boom"), "{why}");
    // A direct message.
    let r = ask(&c, "fake-agent", json!("message")).await;
    assert_eq!(r.payload_value(), Some(json!("direct")));
    assert_eq!(meta(&r)["a2a"]["kind"], "message");
    // A task left working: polled with GetTask until it completes.
    let r = ask(&c, "fake-agent", json!("slow")).await;
    assert_eq!(r.payload_value(), Some(json!("done later")));
    assert!(f
        .log
        .lock()
        .unwrap()
        .iter()
        .any(|(m, _, p)| m == "GetTask" && p["id"] == "t-slow"));
    // input-required ends the call; a follow-up naming the task completes it.
    let r = ask(&c, "fake-agent", json!("input")).await;
    assert_eq!(meta(&r)["a2a"]["state"], "input-required");
    assert_eq!(r.payload_value().unwrap()["a2a"]["state"], "input-required");
    // The follow-up names the task in meta.a2a; request() sets its own meta, so send by hand.
    let done = ask_raw(
        &c,
        &mut inbox,
        "fake-agent",
        r#""here you go""#,
        json!({"correlationId": "follow-1", "a2a": {"taskId": "t-in", "contextId": "ctx-1"}}),
    )
    .await;
    assert_eq!(done.payload_value(), Some(json!("thanks")));
    let log = f.log.lock().unwrap().clone();
    let follow = log
        .iter()
        .rev()
        .find(|(m, _, _)| m == "SendMessage")
        .unwrap();
    assert_eq!(follow.2["message"]["taskId"], "t-in");
    assert_eq!(follow.2["message"]["contextId"], "ctx-1");
    // Every call spoke 1.0 with the header.
    assert!(log.iter().all(|(_, v, _)| v.as_deref() == Some("1.0")));
    // The MAP task of the input-required turn and its follow-up is one task, completed.
    let t = with_timeout(c.call_raw(
        "map/tasks/get",
        json!({"taskId": "a2a-remote:fake-agent:t-in"}),
    ))
    .await
    .unwrap();
    assert_eq!(t["task"]["status"], "completed");
    assert_eq!(t["task"]["meta"]["a2aRemote"]["state"], "completed");
    server.shutdown().await;
}

#[tokio::test]
async fn failures_are_reported_not_lost() {
    let (f, task) = fake(true, true).await;
    let (server, url) = start_server(|c| {
        allow(c, &[&f]);
        c.a2a.remote_allow.push("http://127.0.0.1:9/".into());
    })
    .await;
    let addr = server.local_addrs()[0];
    // Registration errors: bad URL, outside the allow-list, unreachable card, taken id.
    let (status, body) = register(addr, json!({"cardUrl": "https://x.example/c"})).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("https"), "{body}");
    let (status, body) = register(addr, json!({"cardUrl": "http://127.0.0.1:10/c"})).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("remote_allow"),
        "{body}"
    );
    let (status, body) = register(addr, json!({"cardUrl": "http://127.0.0.1:9/c"})).await;
    assert_eq!(status, 502, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("remote unreachable"),
        "{body}"
    );
    let (status, _) = register(addr, json!({"url": "x"})).await;
    assert_eq!(status, 400);

    // A streaming v0.3 agent whose stream ends early, then goes away.
    let card_url = format!("{}/.well-known/agent.json", f.base);
    let (status, body) = register(addr, json!({"cardUrl": card_url, "name": "old"})).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["remote"]["protocolVersion"], "0.3");
    let (status, _) = register(addr, json!({"cardUrl": card_url, "name": "old"})).await;
    assert_eq!(status, 409);
    let c = sender(&url).await;
    // v0.3 streaming is message/stream; the fake answers it like the v1.0 method (404-ish
    // JSON-RPC error), so the call fails with the remote's reason.
    let r = ask(&c, "old", json!("hi")).await;
    assert_eq!(meta(&r)["a2a"]["state"], "failed");
    assert!(f
        .log
        .lock()
        .unwrap()
        .iter()
        .any(|(m, v, _)| m == "message/stream" && v.is_none()));

    task.abort();
    let _ = task.await;
    let r = ask(&c, "old", json!("anyone?")).await;
    assert_eq!(meta(&r)["a2a"]["state"], "failed");
    let why = r.payload_value().unwrap()["a2a"]["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        why.contains("remote unreachable") || why.contains("broke"),
        "{why}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_stream_that_ends_early_fails_the_call_and_the_map_task() {
    let (f, _task) = fake(true, false).await;
    let (server, url) = start_server(|c| allow(c, &[&f])).await;
    let addr = server.local_addrs()[0];
    let (status, body) = register(
        addr,
        json!({"cardUrl": format!("{}/.well-known/agent-card.json", f.base), "name": "early"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let c = sender(&url).await;
    let r = ask(&c, "early", json!("go")).await;
    assert_eq!(meta(&r)["a2a"]["state"], "failed");
    assert_eq!(meta(&r)["a2a"]["taskId"], "t-early");
    let t = with_timeout(c.call_raw(
        "map/tasks/get",
        json!({"taskId": "a2a-remote:early:t-early"}),
    ))
    .await
    .unwrap();
    assert_eq!(t["task"]["status"], "failed");
    assert_eq!(t["task"]["assignee"], "early");
    // Listing and unregistering.
    let r = request(addr, "GET", "/a2a/remote", &[], b"").await;
    let list: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(list["remotes"][0]["agentId"], "early");
    let r = request(addr, "DELETE", "/a2a/remote/early", &[], b"").await;
    assert_eq!(r.status, 200);
    let r = request(addr, "DELETE", "/a2a/remote/early", &[], b"").await;
    assert_eq!(r.status, 404);
    assert!(with_timeout(c.get_agent("early")).await.is_err());
    server.shutdown().await;
}

#[tokio::test]
async fn with_auth_on_registering_needs_a_credential() {
    const KEY: &str = "ak-admin-0123456789abcdef";
    let dir = TempDir::new("a2a-remote-auth");
    let keys = dir.path.join("api-keys");
    std::fs::write(&keys, format!("{KEY} admin\n")).unwrap();
    let (f, _task) = fake(false, false).await;
    // No trusted transport: the remote agent's MAP session is opened as the registering
    // principal.
    let (server, _url) = start_server(|c| {
        c.auth.api_keys.file = Some(keys);
        allow(c, &[&f]);
    })
    .await;
    let addr = server.local_addrs()[0];
    let body = json!({"cardUrl": format!("{}/.well-known/agent-card.json", f.base)}).to_string();
    let r = request(
        addr,
        "POST",
        "/a2a/remote",
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 401, "{}", String::from_utf8_lossy(&r.body));
    let r = request(addr, "GET", "/a2a/remote", &[], b"").await;
    assert_eq!(r.status, 401);
    let bearer = format!("Bearer {KEY}");
    let r = request(
        addr,
        "POST",
        "/a2a/remote",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", &bearer),
        ],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    server.shutdown().await;
}
