//! The A2A gateway over real sockets: an in-process server on `127.0.0.1:0`, MAP agents written
//! with the Rust client over WebSocket (they know nothing of A2A), and raw HTTP requests as an
//! A2A client would send them (v1.0 and v0.3 method names). Every await is bounded.

mod common;

use std::net::SocketAddr;

use common::http::{find, parse_head, request, HttpResponse, Sse};
use common::*;
use futures::StreamExt;
use map_router::client::{AgentHandle, Client, ClientOptions};
use map_router::protocol::event::SubscriptionFilter;
use map_router::protocol::json::RawJson;
use map_router::protocol::message::Message as MapMessage;
use map_router::protocol::methods::agents::RegisterParams;
use map_router::protocol::methods::messaging::SendParams;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

// ---------------------------------------------------------------------------------------------
// Helpers

async fn start() -> (map_router::server::Server, SocketAddr, String) {
    let (server, url) = start_server(|_| {}).await;
    let addr = server.local_addrs()[0];
    (server, addr, url)
}

/// A MAP agent named `name` whose messages go to the returned channel (the test answers).
async fn agent(
    url: &str,
    name: &str,
) -> (Client, AgentHandle, mpsc::UnboundedReceiver<MapMessage>) {
    let client = with_timeout(Client::connect_ws(url, ClientOptions::agent().name(name)))
        .await
        .expect("agent connects");
    let handle = with_timeout(client.register(RegisterParams {
        name: Some(name.into()),
        description: Some(format!("test agent {name}")),
        ..RegisterParams::default()
    }))
    .await
    .expect("agent registers");
    let (tx, rx) = mpsc::unbounded_channel();
    let mut messages = handle.messages();
    tokio::spawn(async move {
        while let Some(m) = messages.next().await {
            if tx.send(m).is_err() {
                break;
            }
        }
    });
    (client, handle, rx)
}

/// An agent that replies to every message with its payload, byte for byte (an ordinary MAP
/// reply: `{agent: from}`, `correlationId`, `isResult`).
async fn echo(url: &str, name: &str) -> (Client, AgentHandle) {
    let (client, handle, mut rx) = agent(url, name).await;
    let c = client.clone();
    tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if m.payload
                .as_ref()
                .is_some_and(|p| p.get().contains("\"cancel\""))
            {
                continue;
            }
            reply_raw(&c, &m, m.payload.clone().unwrap_or_default(), true).await;
        }
    });
    (client, handle)
}

/// Sends `payload` (verbatim) back to the sender of `m` with its correlation id.
async fn reply_raw(c: &Client, m: &MapMessage, payload: RawJson, is_result: bool) {
    let correlation = m.correlation_id().unwrap_or_else(|| m.id.to_string());
    let meta = if is_result {
        json!({"correlationId": correlation, "isResult": true})
    } else {
        json!({"correlationId": correlation})
    };
    with_timeout(c.send_with(SendParams {
        to: RawJson::from(json!({"agent": m.from})),
        payload: Some(payload),
        meta: Some(RawJson::from(meta)),
    }))
    .await
    .expect("agent sends");
}

async fn report(c: &Client, m: &MapMessage, payload: Value) {
    reply_raw(c, m, RawJson::from(payload), false).await;
}

fn rpc_body(id: Value, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

async fn post(addr: SocketAddr, path: &str, body: &str) -> HttpResponse {
    request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json"), ("A2A-Version", "1.0")],
        body.as_bytes(),
    )
    .await
}

async fn call(addr: SocketAddr, path: &str, method: &str, params: Value) -> Value {
    let r = post(addr, path, &rpc_body(json!(1), method, params)).await;
    assert_eq!(
        r.status,
        200,
        "{method}: {}",
        String::from_utf8_lossy(&r.body)
    );
    let v = r.json();
    assert_eq!(v["jsonrpc"], "2.0");
    assert_eq!(v["id"], 1);
    v
}

async fn result(addr: SocketAddr, path: &str, method: &str, params: Value) -> Value {
    let v = call(addr, path, method, params).await;
    assert!(v.get("error").is_none(), "{method}: {v}");
    v["result"].clone()
}

async fn error_code(addr: SocketAddr, path: &str, method: &str, params: Value) -> i64 {
    let v = call(addr, path, method, params).await;
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("{method}: no error in {v}"))
}

async fn get(addr: SocketAddr, path: &str) -> HttpResponse {
    request(addr, "GET", path, &[("A2A-Version", "1.0")], b"").await
}

fn v1_text(text: &str) -> Value {
    json!({"messageId": format!("m-{text}"), "role": "ROLE_USER", "parts": [{"text": text}]})
}

/// POSTs a streaming request and returns the SSE reader (asserting 200 + text/event-stream).
async fn post_stream(addr: SocketAddr, path: &str, body: &str) -> Sse {
    with_timeout(async {
        let mut socket = TcpStream::connect(addr).await.expect("connect");
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(req.as_bytes()).await.expect("write");
        let mut raw = Vec::new();
        let split = loop {
            if let Some(i) = find(&raw, b"\r\n\r\n") {
                break i;
            }
            let mut buf = [0u8; 4096];
            let n = socket.read(&mut buf).await.expect("read head");
            assert!(n > 0, "closed before the response head");
            raw.extend_from_slice(&buf[..n]);
        };
        let (status, headers) = parse_head(&raw[..split]);
        assert_eq!(status, 200);
        let ct = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            .map(|(_, v)| v.clone());
        assert_eq!(ct.as_deref(), Some("text/event-stream"));
        let chunked = headers.iter().any(|(k, v)| {
            k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
        });
        raw.drain(..split + 4);
        let mut sse = Sse {
            socket,
            raw,
            text: Vec::new(),
            chunked,
            ended: false,
        };
        sse.decode();
        sse
    })
    .await
}

/// Every frame of a stream until it ends: the JSON-RPC responses, each checked for the id.
async fn frames(sse: &mut Sse, id: &Value) -> Vec<Value> {
    let events = with_timeout(sse.until_end()).await;
    events
        .iter()
        .map(|e| {
            let v = e.json();
            assert_eq!(v["jsonrpc"], "2.0");
            assert_eq!(&v["id"], id, "every frame carries the request id");
            assert!(v.get("error").is_none(), "frame {v}");
            v["result"].clone()
        })
        .collect()
}

async fn map_task(observer: &Client, id: &str) -> Value {
    with_timeout(observer.call_raw("map/tasks/get", json!({"taskId": id})))
        .await
        .expect("map/tasks/get")["task"]
        .clone()
}

// ---------------------------------------------------------------------------------------------
// Cards

#[tokio::test]
async fn cards_describe_the_router_and_each_agent() {
    let (_server, addr, url) = start().await;
    let (_c, echo_agent) = echo(&url, "echo").await;
    let id = echo_agent.id().to_string();

    let r = get(addr, "/.well-known/agent-card.json").await;
    assert_eq!(r.status, 200);
    let card = r.json();
    let skills: Vec<&str> = card["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        skills,
        vec![id.as_str()],
        "the gateway's own agent is not a skill"
    );
    assert_eq!(
        card["supportedInterfaces"][0]["url"],
        format!("http://{addr}/a2a")
    );

    // By name and by id, v1.0.
    for key in ["echo", id.as_str()] {
        let r = get(
            addr,
            &format!("/a2a/agents/{key}/.well-known/agent-card.json"),
        )
        .await;
        assert_eq!(r.status, 200, "card of {key}");
        let card = r.json();
        assert_eq!(card["name"], "echo");
        assert_eq!(card["description"], "test agent echo");
        let iface = &card["supportedInterfaces"][0];
        assert_eq!(iface["url"], format!("http://{addr}/a2a/agents/{id}"));
        assert_eq!(iface["protocolBinding"], "JSONRPC");
        assert_eq!(iface["protocolVersion"], "1.0");
        assert_eq!(card["capabilities"]["streaming"], true);
        assert_eq!(card["capabilities"]["pushNotifications"], false);
        assert!(card.get("securitySchemes").is_none(), "no auth configured");
    }
    // v0.3.
    let card = get(addr, "/a2a/agents/echo/.well-known/agent.json")
        .await
        .json();
    assert_eq!(card["protocolVersion"], "0.3.0");
    assert_eq!(card["url"], format!("http://{addr}/a2a/agents/{id}"));
    assert_eq!(card["preferredTransport"], "JSONRPC");
    let card = get(addr, "/.well-known/agent.json").await.json();
    assert_eq!(card["skills"][0]["id"], id);

    // Without the trailing slash, URL resolution drops the agent: a 404 that says so.
    let r = get(addr, "/a2a/agents/.well-known/agent-card.json").await;
    assert_eq!(r.status, 404);
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("trailing slash"));

    // Unknown agents, and the gateway itself, have no card.
    for bad in ["nobody", "a2a-gateway", "%2e%2e"] {
        let r = get(
            addr,
            &format!("/a2a/agents/{bad}/.well-known/agent-card.json"),
        )
        .await;
        assert_eq!(r.status, 404, "{bad}");
    }
}

// ---------------------------------------------------------------------------------------------
// SendMessage, GetTask, CancelTask (v1.0)

/// `[a2a] default_agent`: the host's card is that agent's card, whose interface is the agent's
/// endpoint, so a client that knows only the host (the A2A conformance kit) starts tasks there.
/// The card is the agent's as the caller may see it: no agent by that name, no card (404), and
/// the router's card is not served in its place.
#[tokio::test]
async fn a_default_agent_answers_for_the_host() {
    let (server, url) = start_server(|c| c.a2a.default_agent = Some("echo".to_owned())).await;
    let addr = server.local_addrs()[0];
    // Not registered yet: no card, not the router's.
    let r = get(addr, "/.well-known/agent-card.json").await;
    assert_eq!(r.status, 404, "{}", String::from_utf8_lossy(&r.body));
    let (_c, echo_agent) = echo(&url, "echo").await;
    let id = echo_agent.id().to_string();
    for path in [
        "/.well-known/agent-card.json",
        "/.well-known/agent.json",
        "/a2a/.well-known/agent-card.json",
    ] {
        let r = get(addr, path).await;
        assert_eq!(r.status, 200, "{path}");
        let card = r.json();
        assert_eq!(card["name"], "echo", "{path}: {card}");
        assert_eq!(
            card["description"], "test agent echo",
            "the agent's card, not the router's"
        );
        let endpoint = card["url"]
            .as_str()
            .or(card["supportedInterfaces"][0]["url"].as_str())
            .expect("an endpoint");
        assert_eq!(endpoint, format!("http://{addr}/a2a/agents/{id}"), "{path}");
    }
    // A new task at the endpoint the host's card names.
    let res = result(
        addr,
        &format!("/a2a/agents/{id}"),
        "SendMessage",
        json!({"message": v1_text("via the host card")}),
    )
    .await;
    assert_eq!(
        res["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{res}"
    );
}

#[tokio::test]
async fn send_message_completes_with_the_agents_reply() {
    let (_server, addr, url) = start().await;
    let (_c, echo_agent) = echo(&url, "echo").await;
    let observer = with_timeout(Client::connect_ws(&url, ClientOptions::new()))
        .await
        .unwrap();
    let path = "/a2a/agents/echo";

    let res = result(
        addr,
        path,
        "SendMessage",
        json!({"message": v1_text("hello")}),
    )
    .await;
    let task = &res["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{res}");
    assert_eq!(task["artifacts"][0]["parts"], json!([{"text": "hello"}]));
    assert_eq!(task["history"][0]["parts"], json!([{"text": "hello"}]));
    assert_eq!(task["history"][0]["role"], "ROLE_USER");
    let task_id = task["id"].as_str().unwrap().to_owned();
    let context = task["contextId"].as_str().unwrap().to_owned();
    assert!(!context.is_empty());

    // GetTask agrees.
    let got = result(addr, path, "GetTask", json!({"id": task_id})).await;
    assert_eq!(&got, task);
    let got = result(
        addr,
        path,
        "GetTask",
        json!({"id": task_id, "historyLength": 0}),
    )
    .await;
    assert_eq!(got["history"], json!([]));

    // The MAP task: assigned to the agent, completed, the A2A record in meta.a2a, the reply
    // as meta.result.
    let t = map_task(&observer, &task_id).await;
    assert_eq!(t["assignee"], echo_agent.id().to_string());
    assert_eq!(t["status"], "completed");
    assert_eq!(t["meta"]["a2a"]["state"], "completed");
    assert_eq!(t["meta"]["a2a"]["contextId"], context);
    assert_eq!(t["meta"]["result"], "hello");

    // A finished task cannot be canceled; an unknown one is not found.
    assert_eq!(
        error_code(addr, path, "CancelTask", json!({"id": task_id})).await,
        -32002
    );
    assert_eq!(
        error_code(addr, path, "GetTask", json!({"id": "task-nope"})).await,
        -32001
    );
    assert_eq!(
        error_code(addr, path, "CancelTask", json!({"id": "task-nope"})).await,
        -32001
    );

    // The same context goes on in a new task.
    let res = result(
        addr,
        path,
        "SendMessage",
        json!({"message": {"messageId": "m2", "role": "ROLE_USER", "contextId": context, "parts": [{"text": "again"}]}}),
    )
    .await;
    assert_eq!(res["task"]["contextId"], context);
    assert_ne!(res["task"]["id"], task_id);

    // ListTasks: both, newest MAP order; by context.
    let list = result(addr, path, "ListTasks", json!({"contextId": context})).await;
    assert_eq!(list["tasks"].as_array().unwrap().len(), 2, "{list}");
    // Another agent's endpoint does not see them.
    let (_c2, _other) = echo(&url, "other").await;
    let list = result(addr, "/a2a/agents/other", "ListTasks", json!({})).await;
    assert_eq!(list["tasks"], json!([]));
    assert_eq!(
        error_code(addr, "/a2a/agents/other", "GetTask", json!({"id": task_id})).await,
        -32001,
        "a task is found only at its agent's endpoint"
    );
    // The router endpoint sees every task.
    let got = result(addr, "/a2a", "GetTask", json!({"id": task_id})).await;
    assert_eq!(got["id"], task_id);
}

#[tokio::test]
async fn data_parts_and_payloads_pass_byte_for_byte() {
    let (_server, addr, url) = start().await;
    let (_c, _echo) = echo(&url, "echo").await;
    let data = r#"{"z":1,"a":1.50,"n":[1e2,"\u00e9"]}"#;
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":"x","method":"SendMessage","params":{{"message":{{"messageId":"m","role":"ROLE_USER","parts":[{{"data":{data}}}]}}}}}}"#
    );
    let r = post(addr, "/a2a/agents/echo", &body).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.clone()).unwrap();
    // In the history (the caller's message) and in the artifact (the agent's reply).
    assert_eq!(
        text.matches(&format!(r#"{{"data":{data}}}"#)).count(),
        2,
        "{text}"
    );
    assert_eq!(
        r.json()["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
}

// ---------------------------------------------------------------------------------------------
// v0.3

#[tokio::test]
async fn v03_names_answer_in_v03_shapes() {
    let (_server, addr, url) = start().await;
    let (_c, _echo) = echo(&url, "echo").await;
    let path = "/a2a/agents/echo";
    let msg = json!({"kind": "message", "messageId": "m1", "role": "user",
        "parts": [{"kind": "text", "text": "hi"}]});
    let task = result(addr, path, "message/send", json!({"message": msg})).await;
    assert_eq!(task["kind"], "task");
    assert_eq!(task["status"]["state"], "completed");
    assert_eq!(
        task["artifacts"][0]["parts"],
        json!([{"kind": "text", "text": "hi"}])
    );
    assert_eq!(task["history"][0]["role"], "user");
    assert_eq!(task["history"][0]["kind"], "message");
    let id = task["id"].as_str().unwrap();
    let got = result(addr, path, "tasks/get", json!({"id": id})).await;
    assert_eq!(got, task);
    assert_eq!(
        error_code(addr, path, "tasks/cancel", json!({"id": id})).await,
        -32002
    );
    assert_eq!(
        error_code(addr, path, "tasks/get", json!({"id": "nope"})).await,
        -32001
    );

    // A data reply that is not an object is wrapped the way the SDK's compat layer does.
    let msg = json!({"kind": "message", "messageId": "m2", "role": "user",
        "parts": [{"kind": "data", "data": {"value": [1, 2]}, "metadata": {"data_part_compat": true}}]});
    let task = result(addr, path, "message/send", json!({"message": msg})).await;
    assert_eq!(
        task["artifacts"][0]["parts"][0],
        json!({"kind": "data", "data": {"value": [1, 2]}, "metadata": {"data_part_compat": true}})
    );

    // Streams: kind-tagged frames, the last status update `final`.
    let body = rpc_body(
        json!(7),
        "message/stream",
        json!({"message": {"kind": "message",
        "messageId": "m3", "role": "user", "parts": [{"kind": "text", "text": "s"}]}}),
    );
    let mut sse = post_stream(addr, path, &body).await;
    let got = frames(&mut sse, &json!(7)).await;
    let kinds: Vec<&str> = got.iter().map(|f| f["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["task", "status-update", "artifact-update", "status-update"]
    );
    assert_eq!(got[0]["status"]["state"], "submitted");
    assert_eq!(got[1]["status"]["state"], "working");
    assert_eq!(got[1]["final"], false);
    assert_eq!(got[3]["status"]["state"], "completed");
    assert_eq!(got[3]["final"], true);
}

// ---------------------------------------------------------------------------------------------
// Streaming and the agent conventions

#[tokio::test]
async fn streaming_yields_task_working_artifact_completed() {
    let (_server, addr, url) = start().await;
    let (_c, _echo) = echo(&url, "echo").await;
    let body = rpc_body(
        json!("s1"),
        "SendStreamingMessage",
        json!({"message": v1_text("ping")}),
    );
    let mut sse = post_stream(addr, "/a2a/agents/echo", &body).await;
    let got = frames(&mut sse, &json!("s1")).await;
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(got[0]["task"]["status"]["state"], "TASK_STATE_SUBMITTED");
    let id = got[0]["task"]["id"].clone();
    assert_eq!(
        got[1]["statusUpdate"]["status"]["state"],
        "TASK_STATE_WORKING"
    );
    assert_eq!(
        got[2]["artifactUpdate"]["artifact"]["parts"],
        json!([{"text": "ping"}])
    );
    assert_eq!(got[2]["artifactUpdate"]["lastChunk"], true);
    assert_eq!(
        got[3]["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    for f in &got[1..] {
        let inner = f.as_object().unwrap().values().next().unwrap();
        assert_eq!(inner["taskId"], id);
    }
}

#[tokio::test]
async fn agents_report_progress_artifact_chunks_and_input_required() {
    let (_server, addr, url) = start().await;
    let (c, _worker, mut inbox) = agent(&url, "worker").await;
    let observer = with_timeout(Client::connect_ws(&url, ClientOptions::new()))
        .await
        .unwrap();
    let mut events = with_timeout(observer.subscribe(SubscriptionFilter {
        // task.updated is one of our vendor types: named, or a subscriber never gets it.
        event_types: Some(vec![
            "task.*".into(),
            "task.updated".into(),
            "message_*".into(),
        ]),
        ..SubscriptionFilter::default()
    }))
    .await
    .unwrap();

    let body = rpc_body(
        json!(1),
        "SendStreamingMessage",
        json!({"message": v1_text("work")}),
    );
    let mut sse = post_stream(addr, "/a2a/agents/worker", &body).await;
    let m = with_timeout(inbox.recv()).await.unwrap();
    // What the agent sees: the text, meta.protocol "a2a", the task id as correlation id.
    assert_eq!(m.payload.as_ref().unwrap().get(), r#""work""#);
    let meta = m.meta.as_ref().unwrap().to_value();
    assert_eq!(meta["protocol"], "a2a");
    let task_id = meta["correlationId"].as_str().unwrap().to_owned();
    assert_eq!(meta["a2a"]["taskId"], task_id);
    assert!(meta["a2a"]["contextId"].is_string());

    report(
        &c,
        &m,
        json!({"a2a": {"status": "working", "message": "thinking"}}),
    )
    .await;
    report(
        &c,
        &m,
        json!({"a2a": {"artifact": {"artifactId": "doc", "parts": [{"text": "part 1"}]}}}),
    )
    .await;
    report(&c, &m, json!({"a2a": {"artifact": {"artifactId": "doc", "parts": [{"text": "part 2"}]}, "append": true, "lastChunk": true}})).await;
    report(
        &c,
        &m,
        json!({"a2a": {"state": "input-required", "message": "which one?"}}),
    )
    .await;
    let got = frames(&mut sse, &json!(1)).await;
    let states: Vec<Value> = got[1..]
        .iter()
        .map(|f| {
            f.get("statusUpdate")
                .map(|u| u["status"]["state"].clone())
                .unwrap_or_else(|| json!("artifact"))
        })
        .collect();
    assert_eq!(
        states,
        [
            json!("TASK_STATE_WORKING"),
            json!("TASK_STATE_WORKING"),
            json!("artifact"),
            json!("artifact"),
            json!("TASK_STATE_INPUT_REQUIRED"),
        ]
    );
    assert_eq!(got[0]["task"]["status"]["state"], "TASK_STATE_SUBMITTED");
    assert_eq!(
        got[2]["statusUpdate"]["status"]["message"]["parts"],
        json!([{"text": "thinking"}])
    );
    assert_eq!(got[4]["artifactUpdate"]["append"], true);
    assert_eq!(
        got[5]["statusUpdate"]["status"]["message"]["parts"],
        json!([{"text": "which one?"}])
    );

    // The caller answers in the same task; the agent gets it with the same correlation id and
    // replies; the task completes with the appended artifact and the reply.
    let follow = json!({"message": {"messageId": "m-2", "role": "ROLE_USER", "taskId": task_id,
        "parts": [{"text": "the first"}]}, "configuration": {"returnImmediately": true}});
    let res = result(addr, "/a2a/agents/worker", "SendMessage", follow).await;
    assert_eq!(res["task"]["id"], task_id.as_str());
    let m2 = with_timeout(inbox.recv()).await.unwrap();
    assert_eq!(m2.correlation_id().as_deref(), Some(task_id.as_str()));
    reply_raw(&c, &m2, RawJson::from(json!("done")), true).await;
    let task = with_timeout(async {
        loop {
            let t = result(
                addr,
                "/a2a/agents/worker",
                "GetTask",
                json!({"id": task_id}),
            )
            .await;
            if t["status"]["state"] == "TASK_STATE_COMPLETED" {
                break t;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(task["artifacts"][0]["artifactId"], "doc");
    assert_eq!(
        task["artifacts"][0]["parts"],
        json!([{"text": "part 1"}, {"text": "part 2"}])
    );
    assert_eq!(task["artifacts"][1]["parts"], json!([{"text": "done"}]));
    let roles: Vec<&str> = task["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["ROLE_USER", "ROLE_AGENT", "ROLE_AGENT", "ROLE_USER"]
    );
    // A follow-up to a finished task is refused.
    let follow = json!({"message": {"messageId": "m-3", "role": "ROLE_USER", "taskId": task_id,
        "parts": [{"text": "more"}]}});
    assert_eq!(
        error_code(addr, "/a2a/agents/worker", "SendMessage", follow).await,
        -32004
    );

    // A MAP subscriber saw every step: the task's life and the messages both ways.
    let seen = with_timeout(async {
        let mut seen = Vec::new();
        while let Some(e) = events.next().await {
            let kind = e.kind().to_owned();
            let done = kind == "task.completed";
            seen.push(kind);
            if done {
                break;
            }
        }
        seen
    })
    .await;
    assert_eq!(
        seen.iter().filter(|k| *k == "task.created").count(),
        1,
        "{seen:?}"
    );
    assert!(
        seen.iter().filter(|k| k.starts_with("message_")).count() >= 6,
        "{seen:?}"
    );
    assert!(
        seen.iter().filter(|k| *k == "task.status").count() >= 4,
        "{seen:?}"
    );
    assert!(seen.contains(&"task.updated".to_owned()), "{seen:?}");
}

#[tokio::test]
async fn cancel_tells_the_agent_and_ends_the_task_canceled() {
    let (_server, addr, url) = start().await;
    let (_c, _sleeper, mut inbox) = agent(&url, "sleeper").await;
    let observer = with_timeout(Client::connect_ws(&url, ClientOptions::new()))
        .await
        .unwrap();
    let path = "/a2a/agents/sleeper";
    let res = result(
        addr,
        path,
        "SendMessage",
        json!({"message": v1_text("nap"), "configuration": {"returnImmediately": true}}),
    )
    .await;
    assert_eq!(res["task"]["status"]["state"], "TASK_STATE_WORKING");
    let id = res["task"]["id"].as_str().unwrap().to_owned();
    let _first = with_timeout(inbox.recv()).await.unwrap();

    // Someone resubscribes meanwhile: the task first, then the cancel, then the end.
    let body = rpc_body(json!(9), "SubscribeToTask", json!({"id": id}));
    let mut sse = post_stream(addr, path, &body).await;

    let canceled = result(addr, path, "CancelTask", json!({"id": id})).await;
    assert_eq!(canceled["status"]["state"], "TASK_STATE_CANCELED");
    let control = with_timeout(inbox.recv()).await.unwrap();
    assert_eq!(
        control.payload.as_ref().unwrap().to_value(),
        json!({"a2a": {"cancel": id}})
    );
    assert_eq!(control.correlation_id().as_deref(), Some(id.as_str()));
    let got = frames(&mut sse, &json!(9)).await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["task"]["status"]["state"], "TASK_STATE_WORKING");
    assert_eq!(
        got[1]["statusUpdate"]["status"]["state"],
        "TASK_STATE_CANCELED"
    );

    assert_eq!(
        error_code(addr, path, "CancelTask", json!({"id": id})).await,
        -32002
    );
    let t = map_task(&observer, &id).await;
    assert_eq!(t["status"], "failed");
    assert_eq!(t["meta"]["a2a"]["state"], "canceled");
    // Subscribing to a finished task: unsupported.
    assert_eq!(
        error_code(addr, path, "SubscribeToTask", json!({"id": id})).await,
        -32004
    );
}

#[tokio::test]
async fn an_agent_that_is_gone_fails_the_task() {
    let (_server, addr, url) = start().await;
    let (c, _h, _inbox) = agent(&url, "leaving").await;
    // Resolve it while it is there, then let it go.
    let r = get(addr, "/a2a/agents/leaving/.well-known/agent-card.json").await;
    assert_eq!(r.status, 200);
    with_timeout(c.close()).await.unwrap();
    let r = post(
        addr,
        "/a2a/agents/leaving",
        &rpc_body(json!(1), "SendMessage", json!({"message": v1_text("x")})),
    )
    .await;
    // Either the agent is already unregistered (404), or the message finds nobody (failed).
    if r.status == 200 {
        assert_eq!(
            r.json()["result"]["task"]["status"]["state"],
            "TASK_STATE_FAILED"
        );
    } else {
        assert_eq!(r.status, 404);
    }
}

// ---------------------------------------------------------------------------------------------
// Hostile input

#[tokio::test]
async fn hostile_input_gets_json_rpc_errors() {
    let (_server, addr, url) = start().await;
    let (_c, _echo) = echo(&url, "echo").await;
    let path = "/a2a/agents/echo";
    let code = |r: &HttpResponse| r.json()["error"]["code"].as_i64().unwrap();

    let r = post(addr, path, "{not json").await;
    assert_eq!((r.status, code(&r)), (200, -32700));
    assert_eq!(r.json()["id"], Value::Null);
    let r = post(addr, path, "[]").await;
    assert_eq!(code(&r), -32600);
    let r = post(
        addr,
        path,
        r#"{"jsonrpc":"2.0","method":"GetTask","params":{"id":"x"}}"#,
    )
    .await;
    assert_eq!(code(&r), -32600, "notifications are refused");
    let r = post(
        addr,
        path,
        r#"{"jsonrpc":"2.0","id":true,"method":"GetTask"}"#,
    )
    .await;
    assert_eq!(code(&r), -32600);
    let r = post(addr, path, r#"{"jsonrpc":"1.0","id":1,"method":"GetTask"}"#).await;
    assert_eq!(code(&r), -32600);
    let r = post(addr, path, "\u{0}\u{1}").await;
    assert_eq!(code(&r), -32700);
    assert_eq!(
        error_code(addr, path, "tasks/delete", json!({})).await,
        -32601
    );
    assert_eq!(
        error_code(addr, path, "GetTask", json!({"id": 5})).await,
        -32602
    );
    assert_eq!(error_code(addr, path, "GetTask", json!({})).await, -32602);
    assert_eq!(
        error_code(addr, path, "SendMessage", json!({})).await,
        -32602
    );
    // messageId and role are required (A2A 0.3 and 1.0; the SDK's server refuses a missing
    // messageId too), in both versions' methods.
    for (method, message) in [
        (
            "SendMessage",
            json!({"role": "ROLE_USER", "parts": [{"text": "hi"}]}),
        ),
        (
            "message/send",
            json!({"role": "user", "parts": [{"kind": "text", "text": "hi"}]}),
        ),
        (
            "message/send",
            json!({"messageId": "", "role": "user", "parts": [{"kind": "text", "text": "hi"}]}),
        ),
        (
            "SendMessage",
            json!({"messageId": "m", "parts": [{"text": "hi"}]}),
        ),
    ] {
        let r = call(addr, path, method, json!({ "message": message })).await;
        assert_eq!(r["error"]["code"], -32602, "{method} {message}: {r}");
        let text = r["error"]["message"].as_str().unwrap_or_default();
        assert!(text.contains("messageId") || text.contains("role"), "{r}");
    }
    assert_eq!(
        error_code(
            addr,
            path,
            "SendMessage",
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": []}})
        )
        .await,
        -32602
    );
    assert_eq!(
        error_code(addr, path, "SendMessage", json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"kind": "weird"}]}})).await,
        -32602
    );
    assert_eq!(
        error_code(
            addr,
            path,
            "SendMessage",
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{}]}})
        )
        .await,
        -32602
    );
    assert_eq!(
        error_code(
            addr,
            path,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": "t", "url": "http://x"})
        )
        .await,
        -32003
    );
    assert_eq!(
        error_code(addr, path, "GetExtendedAgentCard", json!({})).await,
        -32007
    );
    assert_eq!(
        error_code(
            addr,
            "/a2a",
            "SendMessage",
            json!({"message": v1_text("x")})
        )
        .await,
        -32602,
        "new tasks go to an agent's endpoint"
    );

    // A bad agent id: 404 with a JSON-RPC error.
    let r = post(
        addr,
        "/a2a/agents/nobody",
        &rpc_body(json!(1), "GetTask", json!({"id": "x"})),
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(code(&r), -32602);
    assert_eq!(r.json()["id"], 1);

    // A huge body: 413 from its Content-Length, before it is sent (so the answer does not wait
    // for it), and the server is fine afterwards.
    let mut s = with_timeout(TcpStream::connect(addr)).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        5 * 1024 * 1024
    );
    with_timeout(s.write_all(head.as_bytes())).await.unwrap();
    let mut raw = Vec::new();
    with_timeout(s.read_to_end(&mut raw)).await.unwrap();
    let split = find(&raw, b"\r\n\r\n").expect("an answer");
    let (status, _) = parse_head(&raw[..split]);
    assert_eq!(status, 413);
    let body: Value = serde_json::from_slice(&raw[split + 4..]).unwrap();
    assert_eq!(body["error"]["code"], -32600);
    let r = get(addr, "/a2a/agents/echo/.well-known/agent-card.json").await;
    assert_eq!(r.status, 200);
}

// ---------------------------------------------------------------------------------------------
// Authentication

const ALICE: &str = "ak-alice-0123456789abcdef";
const BOB: &str = "ak-bob-0123456789abcdef";

async fn post_as(addr: SocketAddr, path: &str, key: Option<&str>, body: &str) -> HttpResponse {
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    request(addr, "POST", path, &headers, body.as_bytes()).await
}

#[tokio::test]
async fn with_auth_calls_need_a_credential_and_act_as_its_principal() {
    let (_server, url) = start_server(|c| {
        let mut t = map_router::server::Config::from_toml(
            r#"
[auth]
trusted_transports = ["supervised", "in-process"]

[permissions.principals."bob".observation]
canQuery = false
"#,
        )
        .expect("config");
        t.listen = c.listen.clone();
        t.auth.api_keys.inline = Some(map_router::auth::config::Secret(format!(
            "{ALICE} alice,{BOB} bob"
        )));
        *c = t;
    })
    .await;
    let addr: SocketAddr = url
        .trim_start_matches("ws://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    // The agent authenticates as alice.
    let client = with_timeout(Client::connect_ws(
        &url,
        ClientOptions::agent().name("echo").api_key(ALICE),
    ))
    .await
    .expect("agent connects");
    let handle = with_timeout(client.register(RegisterParams {
        name: Some("echo".into()),
        ..RegisterParams::default()
    }))
    .await
    .unwrap();
    let mut inbox = handle.messages();
    let c = client.clone();
    tokio::spawn(async move {
        while let Some(m) = inbox.next().await {
            reply_raw(&c, &m, m.payload.clone().unwrap_or_default(), true).await;
        }
    });

    // The router card says how to authenticate, and lists no agent to a caller without a
    // credential; with one, the agents that principal may see.
    let card = get(addr, "/.well-known/agent-card.json").await.json();
    assert_eq!(
        card["securitySchemes"]["apiKey"]["apiKeySecurityScheme"]["name"],
        "X-API-Key"
    );
    assert_eq!(
        card["securityRequirements"][0]["schemes"]["apiKey"],
        json!({"list": []})
    );
    assert_eq!(card["skills"], json!([]));
    let card = request(
        addr,
        "GET",
        "/.well-known/agent-card.json",
        &[("X-API-Key", ALICE)],
        b"",
    )
    .await
    .json();
    assert_eq!(card["skills"][0]["id"], handle.id().to_string());
    let r = get(addr, "/a2a/agents/echo/.well-known/agent-card.json").await;
    assert_eq!(r.status, 401, "an agent's card needs a credential");

    let send = rpc_body(json!(1), "SendMessage", json!({"message": v1_text("hi")}));
    // No credential, a wrong one: 401.
    let r = post_as(addr, "/a2a/agents/echo", None, &send).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], -32600);
    let r = post_as(
        addr,
        "/a2a/agents/echo",
        Some("ak-nobody-000000000000"),
        &send,
    )
    .await;
    assert_eq!(r.status, 401);
    // alice: served.
    let r = post_as(addr, "/a2a/agents/echo", Some(ALICE), &send).await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(
        v["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{v}"
    );
    let id = v["result"]["task"]["id"].as_str().unwrap().to_owned();
    // bob may not query agents (his principal's grant): refused as for any MAP participant.
    let r = post_as(addr, "/a2a/agents/echo", Some(BOB), &send).await;
    assert_eq!(r.status, 403, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("observation.canQuery"));
    let get_task = rpc_body(json!(2), "GetTask", json!({"id": id}));
    let r = post_as(addr, "/a2a", Some(ALICE), &get_task).await;
    assert_eq!(
        r.json()["result"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    // The same credential reuses its MAP session: still served.
    let r = post_as(addr, "/a2a", Some(ALICE), &get_task).await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn with_auth_on_and_no_trusted_transports_the_gateway_serves_callers() {
    let (_server, url) = start_server(|c| {
        c.auth.api_keys.inline = Some(map_router::auth::config::Secret(format!("{ALICE} alice")));
    })
    .await;
    let addr: SocketAddr = url
        .trim_start_matches("ws://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let send = rpc_body(json!(1), "GetTask", json!({"id": "x"}));
    let r = post_as(addr, "/a2a", Some(ALICE), &send).await;
    // The gateway's own session runs as the router's service principal: no
    // `trusted_transports` edit is needed; alice is answered as herself (no such task).
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()["error"]["code"],
        -32001,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
}

// ---------------------------------------------------------------------------------------------
// Push notifications

/// A webhook on 127.0.0.1:0: every request's head and body go to the channel; the first
/// `fail_first` requests are answered 500, the others 200.
async fn webhook(fail_first: usize) -> (String, mpsc::UnboundedReceiver<(String, String)>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((mut s, _)) = listener.accept().await {
            n += 1;
            let mut raw = Vec::new();
            let mut buf = [0u8; 4096];
            let (head, body) = loop {
                let k = s.read(&mut buf).await.unwrap_or(0);
                if k == 0 {
                    break (String::new(), String::new());
                }
                raw.extend_from_slice(&buf[..k]);
                if let Some(i) = find(&raw, b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&raw[..i]).to_string();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    while raw.len() < i + 4 + len {
                        let k = s.read(&mut buf).await.unwrap_or(0);
                        if k == 0 {
                            break;
                        }
                        raw.extend_from_slice(&buf[..k]);
                    }
                    break (head, String::from_utf8_lossy(&raw[i + 4..]).to_string());
                }
            };
            let status = if n <= fail_first {
                "500 Internal Server Error"
            } else {
                "200 OK"
            };
            let _ = s
                .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                .await;
            if n > fail_first {
                let _ = tx.send((head, body));
            }
        }
    });
    (url, rx)
}

#[tokio::test]
async fn push_notifications_post_every_change_to_allowed_webhooks() {
    let (hook, mut hooked) = webhook(1).await;
    let (hook2, mut hooked2) = webhook(0).await;
    // Each webhook by its own URL: the allow-list matches scheme, host, port and path.
    let allowed = vec![hook.clone(), hook2.clone()];
    let (_server, url) = start_server(|c| c.a2a.push_allow = allowed).await;
    let addr: SocketAddr = url
        .trim_start_matches("ws://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let (c, _h, mut inbox) = agent(&url, "worker").await;
    let card = get(addr, "/a2a/agents/worker/.well-known/agent-card.json")
        .await
        .json();
    assert_eq!(card["capabilities"]["pushNotifications"], true);
    let path = "/a2a/agents/worker";

    // A webhook given with the message: every change of the task, in order (the first POST
    // is refused once and retried).
    let res = result(
        addr,
        path,
        "SendMessage",
        json!({"message": v1_text("go"), "configuration": {"returnImmediately": true,
            "taskPushNotificationConfig": {"url": hook, "token": "tok-1"}}}),
    )
    .await;
    let id = res["task"]["id"].as_str().unwrap().to_owned();
    let m = with_timeout(inbox.recv()).await.unwrap();
    reply_raw(&c, &m, RawJson::from(json!("ok")), true).await;
    let mut got = Vec::new();
    for _ in 0..4 {
        let (head, body) = within(std::time::Duration::from_secs(10), hooked.recv())
            .await
            .unwrap();
        assert!(head.starts_with("POST /hook HTTP/1.1"), "{head}");
        // Header names are case-insensitive (the client title-cases them: `X-A2a-...`).
        assert!(
            head.to_ascii_lowercase()
                .contains("x-a2a-notification-token: tok-1"),
            "{head}"
        );
        assert!(
            head.contains("Content-Type: application/a2a+json"),
            "{head}"
        );
        got.push(serde_json::from_str::<Value>(&body).unwrap());
    }
    assert_eq!(got[0]["task"]["status"]["state"], "TASK_STATE_SUBMITTED");
    assert_eq!(
        got[1]["statusUpdate"]["status"]["state"],
        "TASK_STATE_WORKING"
    );
    assert_eq!(
        got[2]["artifactUpdate"]["artifact"]["parts"],
        json!([{"text": "ok"}])
    );
    assert_eq!(
        got[3]["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    assert_eq!(got[3]["statusUpdate"]["taskId"], id.as_str());

    // The config methods, v1.0, on a running task.
    let res = result(
        addr,
        path,
        "SendMessage",
        json!({"message": v1_text("again"), "configuration": {"returnImmediately": true}}),
    )
    .await;
    let id = res["task"]["id"].as_str().unwrap().to_owned();
    let m = with_timeout(inbox.recv()).await.unwrap();
    let made = result(
        addr,
        path,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": id, "id": "w2", "url": hook2,
            "authentication": {"scheme": "Bearer", "credentials": "sekrit"}}),
    )
    .await;
    assert_eq!(made["id"], "w2");
    assert_eq!(made["taskId"], id.as_str());
    let got = result(
        addr,
        path,
        "GetTaskPushNotificationConfig",
        json!({"taskId": id, "id": "w2"}),
    )
    .await;
    assert_eq!(got, made);
    let list = result(
        addr,
        path,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": id}),
    )
    .await;
    assert_eq!(list["configs"], json!([made]));
    // v0.3 names see the same config, in v0.3 shape.
    let list = result(
        addr,
        path,
        "tasks/pushNotificationConfig/list",
        json!({"id": id}),
    )
    .await;
    assert_eq!(list[0]["pushNotificationConfig"]["id"], "w2");
    assert_eq!(
        list[0]["pushNotificationConfig"]["authentication"]["schemes"],
        json!(["Bearer"])
    );
    // The proto field names work as well (`task_id`), as protobuf JSON parsers take them.
    let snake = result(
        addr,
        path,
        "CreateTaskPushNotificationConfig",
        json!({"task_id": id, "id": "w3", "url": hook2}),
    )
    .await;
    assert_eq!(snake["taskId"], id.as_str());
    let got = result(
        addr,
        path,
        "GetTaskPushNotificationConfig",
        json!({"task_id": id, "id": "w3"}),
    )
    .await;
    assert_eq!(got["id"], "w3");
    result(
        addr,
        path,
        "DeleteTaskPushNotificationConfig",
        json!({"task_id": id, "id": "w3"}),
    )
    .await;
    reply_raw(&c, &m, RawJson::from(json!("done")), true).await;
    let (head, _body) = within(std::time::Duration::from_secs(10), hooked2.recv())
        .await
        .unwrap();
    assert!(head.contains("Authorization: Bearer sekrit"), "{head}");
    // A URL outside the allowlist, an unknown task, an unknown config.
    assert_eq!(
        error_code(
            addr,
            path,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "url": "http://10.1.2.3/x"})
        )
        .await,
        -32602
    );
    assert_eq!(
        error_code(
            addr,
            path,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": "task-nope", "url": hook2})
        )
        .await,
        -32001
    );
    assert_eq!(
        error_code(
            addr,
            path,
            "DeleteTaskPushNotificationConfig",
            json!({"taskId": id, "id": "nope"})
        )
        .await,
        -32602
    );
}

// ---------------------------------------------------------------------------------------------
// What the A2A conformance kit (a2aproject/a2a-tck) found (issue 31)

/// POSTs `body` with `A2A-Version: version` (none when `None`); the answer as JSON.
async fn post_versioned(addr: SocketAddr, path: &str, version: Option<&str>, body: &str) -> Value {
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(v) = version {
        headers.push(("A2A-Version", v));
    }
    let r = request(addr, "POST", path, &headers, body.as_bytes()).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

#[tokio::test]
async fn the_a2a_version_header_is_checked() {
    let (_server, addr, url) = start().await;
    let (_c, _h, mut inbox) = agent(&url, "quiet").await;
    let path = "/a2a/agents/quiet";
    // A version the gateway does not speak: -32009 with its ErrorInfo, and nothing is sent.
    let body = rpc_body(json!(7), "SendMessage", json!({"message": v1_text("hi")}));
    let v = post_versioned(addr, path, Some("99.0"), &body).await;
    assert_eq!(v["id"], 7);
    assert_eq!(v["error"]["code"], -32009, "{v}");
    let info = &v["error"]["data"][0];
    assert_eq!(info["@type"], "type.googleapis.com/google.rpc.ErrorInfo");
    assert_eq!(info["reason"], "VERSION_NOT_SUPPORTED");
    assert_eq!(info["domain"], "a2a-protocol.org");
    assert_eq!(info["metadata"]["requestedVersion"], "99.0");
    assert!(
        tokio::time::timeout(QUIET, inbox.recv()).await.is_err(),
        "nothing reaches the agent"
    );
    // 1.0, 0.3 (with or without a patch) and no header at all are served (absent means 0.3,
    // but the method's name says which shapes: every client keeps working).
    for version in [
        Some("1.0"),
        Some("1.0.0"),
        Some("0.3"),
        Some("0.3.0"),
        None,
        Some(""),
    ] {
        let body = rpc_body(json!(1), "GetTask", json!({"id": "nope"}));
        let v = post_versioned(addr, path, version, &body).await;
        assert_eq!(v["error"]["code"], -32001, "{version:?}: {v}");
    }
}

#[tokio::test]
async fn v1_errors_carry_an_error_info_and_v03_errors_do_not() {
    let (_server, addr, url) = start().await;
    let (_c, _h) = echo(&url, "echo").await;
    let path = "/a2a/agents/echo";
    let v = post_versioned(
        addr,
        path,
        Some("1.0"),
        &rpc_body(json!(1), "GetTask", json!({"id": "nope"})),
    )
    .await;
    assert_eq!(v["error"]["code"], -32001);
    assert_eq!(
        v["error"]["data"],
        json!([{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "TASK_NOT_FOUND",
            "domain": "a2a-protocol.org", "metadata": {"taskId": "nope"}}])
    );
    // v0.3 (the SDK's v0.3 layer writes no data either).
    let v = post_versioned(
        addr,
        path,
        Some("0.3"),
        &rpc_body(json!(1), "tasks/get", json!({"id": "nope"})),
    )
    .await;
    assert_eq!(v["error"]["code"], -32001);
    assert!(v["error"].get("data").is_none(), "{v}");
    // A body that is not declared JSON (verified: -32005 since issue 23), with its reason.
    let r = request(
        addr,
        "POST",
        path,
        &[("Content-Type", "text/plain"), ("A2A-Version", "1.0")],
        rpc_body(json!(1), "GetTask", json!({"id": "x"})).as_bytes(),
    )
    .await;
    let v = r.json();
    assert_eq!(v["error"]["code"], -32005, "{v}");
    assert_eq!(
        v["error"]["data"][0]["reason"],
        "CONTENT_TYPE_NOT_SUPPORTED"
    );
    // JSON-RPC's own errors have no A2A reason: no data.
    let v = post_versioned(
        addr,
        path,
        Some("1.0"),
        &rpc_body(json!(1), "Nope", json!({})),
    )
    .await;
    assert_eq!(v["error"]["code"], -32601);
    assert!(v["error"].get("data").is_none(), "{v}");
    // A finished task cannot be canceled: -32002, TASK_NOT_CANCELABLE.
    let done = result(addr, path, "SendMessage", json!({"message": v1_text("x")})).await;
    assert_eq!(done["task"]["status"]["state"], "TASK_STATE_COMPLETED");
    let id = done["task"]["id"].as_str().unwrap();
    let v = call(addr, path, "CancelTask", json!({"id": id})).await;
    assert_eq!(v["error"]["code"], -32002);
    assert_eq!(v["error"]["data"][0]["reason"], "TASK_NOT_CANCELABLE");
    assert_eq!(v["error"]["data"][0]["metadata"]["taskId"], id);
}

#[tokio::test]
async fn a_request_without_id_gets_its_real_error_with_id_null() {
    let (_server, addr, _url) = start().await;
    let path = "/a2a";
    for (body, code) in [
        (json!({"jsonrpc": "2.0", "method": "Nope"}), -32601),
        (
            json!({"jsonrpc": "2.0", "method": "GetTask", "params": [1]}),
            -32602,
        ),
        (
            json!({"jsonrpc": "2.0", "id": null, "method": "Nope"}),
            -32601,
        ),
        (json!({"jsonrpc": "1.0", "method": "GetTask"}), -32600),
        // Params the method cannot read (the v0.3 kit's case).
        (
            json!({"jsonrpc": "2.0", "method": "message/send", "params": {"": "not_a_dict"}}),
            -32602,
        ),
        (
            json!({"jsonrpc": "2.0", "method": "GetTask", "params": {"id": 5}}),
            -32602,
        ),
        // Nothing wrong but the missing id: notifications are not taken.
        (
            json!({"jsonrpc": "2.0", "method": "GetTask", "params": {"id": "x"}}),
            -32600,
        ),
    ] {
        let v = post_versioned(addr, path, Some("1.0"), &body.to_string()).await;
        assert_eq!(v["error"]["code"], code, "{body}: {v}");
        assert!(v["id"].is_null(), "{v}");
    }
}

#[tokio::test]
async fn params_are_read_in_either_spelling() {
    let (_server, addr, url) = start().await;
    let (_c, _h) = echo(&url, "echo").await;
    let path = "/a2a/agents/echo";
    // snake_case names, as protobuf JSON parsers take them.
    let done = result(
        addr,
        path,
        "SendMessage",
        json!({"message": {"message_id": "m-snake", "role": "ROLE_USER",
            "parts": [{"text": "hi"}]}, "configuration": {"history_length": 0}}),
    )
    .await;
    assert_eq!(done["task"]["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(done["task"]["history"], json!([]));
    let id = done["task"]["id"].as_str().unwrap().to_owned();
    let all = result(addr, path, "GetTask", json!({"id": id})).await;
    assert_eq!(all["history"][0]["messageId"], "m-snake");
    let none = result(
        addr,
        path,
        "GetTask",
        json!({"id": id, "history_length": 0}),
    )
    .await;
    assert_eq!(none["history"], json!([]));
    let listed = result(
        addr,
        path,
        "ListTasks",
        json!({"page_size": 1, "include_artifacts": false, "history_length": 0}),
    )
    .await;
    assert_eq!(listed["pageSize"], 1);
    assert_eq!(listed["tasks"][0]["artifacts"], json!([]));
    assert_eq!(listed["tasks"][0]["history"], json!([]));
}

#[tokio::test]
async fn cards_can_be_cached_and_come_in_the_version_asked_for() {
    let (_server, addr, url) = start().await;
    let (_c, _h) = echo(&url, "echo").await;
    for path in [
        "/.well-known/agent-card.json",
        "/a2a/agents/echo/.well-known/agent-card.json",
    ] {
        let r = request(addr, "GET", path, &[("A2A-Version", "1.0")], b"").await;
        assert_eq!(r.status, 200);
        let etag = r.header("etag").expect("ETag").to_owned();
        assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
        assert!(r.header("cache-control").unwrap().contains("max-age="));
        assert!(r.header("last-modified").unwrap().ends_with(" GMT"));
        assert!(r.header("vary").unwrap().contains("A2A-Version"));
        let v1 = r.json();
        assert!(v1["supportedInterfaces"].is_array() && v1.get("protocolVersion").is_none());
        // The same card again: 304, no body, the same ETag.
        let again = request(
            addr,
            "GET",
            path,
            &[("A2A-Version", "1.0"), ("If-None-Match", &etag)],
            b"",
        )
        .await;
        assert_eq!(again.status, 304);
        assert!(again.body.is_empty());
        assert_eq!(again.header("etag"), Some(etag.as_str()));
        let other = request(
            addr,
            "GET",
            path,
            &[("A2A-Version", "1.0"), ("If-None-Match", "\"x\"")],
            b"",
        )
        .await;
        assert_eq!(other.status, 200);
        // v0.3 asked for: the v0.3 card (another ETag).
        let r = request(addr, "GET", path, &[("A2A-Version", "0.3")], b"").await;
        let v03 = r.json();
        assert_eq!(v03["protocolVersion"], "0.3.0");
        assert!(v03.get("supportedInterfaces").is_none());
        assert_ne!(r.header("etag"), Some(etag.as_str()));
        // Nothing asked for (a v0.3 client, by A2A 1.0 §3.6.2): a card both versions read.
        let both = request(addr, "GET", path, &[], b"").await.json();
        assert_eq!(both["protocolVersion"], "0.3.0");
        assert_eq!(both["url"], v03["url"]);
        assert_eq!(both["supportedInterfaces"], v1["supportedInterfaces"]);
    }
    // `agent.json` is v0.3 whatever the header says.
    let r = get(addr, "/.well-known/agent.json").await;
    assert_eq!(r.json()["protocolVersion"], "0.3.0");
    assert!(r.header("etag").is_some());
}

/// POSTs a streaming request whose answer may be an error as one SSE event (v0.3).
async fn stream_error(addr: SocketAddr, path: &str, method: &str, params: Value) -> Value {
    let body = rpc_body(json!(5), method, params);
    let mut sse = post_stream(addr, path, &body).await;
    let events = with_timeout(sse.until_end()).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let v = events[0].json();
    assert_eq!(v["id"], 5);
    v
}

#[tokio::test]
async fn v03_stream_errors_come_as_an_event_stream_and_v1_ones_as_json() {
    let (_server, addr, url) = start().await;
    let (_c, _h) = echo(&url, "echo").await;
    let path = "/a2a/agents/echo";
    let v = stream_error(addr, path, "tasks/resubscribe", json!({"id": "nope"})).await;
    assert_eq!(v["error"]["code"], -32001, "{v}");
    assert!(v["error"].get("data").is_none());
    let v = stream_error(
        addr,
        path,
        "message/stream",
        json!({"message": {"parts": []}}),
    )
    .await;
    assert_eq!(v["error"]["code"], -32602, "{v}");
    // v1.0: a JSON answer, as the SDK's v1.0 server gives before the first event.
    let v = call(addr, path, "SubscribeToTask", json!({"id": "nope"})).await;
    assert_eq!(v["error"]["code"], -32001);
    assert_eq!(v["error"]["data"][0]["reason"], "TASK_NOT_FOUND");
}

#[tokio::test]
async fn a_subscription_to_an_interrupted_task_lasts_until_it_ends() {
    let (_server, addr, url) = start().await;
    let (c, _h, mut inbox) = agent(&url, "asker").await;
    let path = "/a2a/agents/asker";
    let res = result(
        addr,
        path,
        "SendMessage",
        json!({"message": v1_text("book"), "configuration": {"returnImmediately": true}}),
    )
    .await;
    let id = res["task"]["id"].as_str().unwrap().to_owned();
    let m = with_timeout(inbox.recv()).await.unwrap();
    report(
        &c,
        &m,
        json!({"a2a": {"state": "input-required", "message": "when?"}}),
    )
    .await;
    with_timeout(async {
        loop {
            let t = result(addr, path, "GetTask", json!({"id": id})).await;
            if t["status"]["state"] == "TASK_STATE_INPUT_REQUIRED" {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    for (method, state) in [
        ("SubscribeToTask", "TASK_STATE_INPUT_REQUIRED"),
        ("tasks/resubscribe", "input-required"),
    ] {
        let body = rpc_body(json!(3), method, json!({"id": id}));
        let mut sse = post_stream(addr, path, &body).await;
        let first = with_timeout(sse.next()).await.json();
        let task = first["result"].get("task").unwrap_or(&first["result"]);
        assert_eq!(task["status"]["state"], state, "{first}");
        // Still open: the task is waiting, not over.
        sse.assert_quiet().await;
        if method == "tasks/resubscribe" {
            // The caller answers; the agent finishes; the stream ends with the task.
            let follow = json!({"message": {"messageId": "m-2", "role": "ROLE_USER",
                "taskId": id, "parts": [{"text": "monday"}]},
                "configuration": {"returnImmediately": true}});
            result(addr, path, "SendMessage", follow).await;
            let m2 = with_timeout(inbox.recv()).await.unwrap();
            reply_raw(&c, &m2, RawJson::from(json!("booked")), true).await;
            let rest = frames(&mut sse, &json!(3)).await;
            let last = rest.last().expect("updates");
            assert_eq!(last["status"]["state"], "completed", "{rest:?}");
        }
    }
}

#[tokio::test]
async fn an_agent_may_answer_with_a_message_instead_of_a_task() {
    let (_server, addr, url) = start().await;
    let (c, _h, mut inbox) = agent(&url, "talker").await;
    tokio::spawn(async move {
        while let Some(m) = inbox.recv().await {
            let text = m.payload.as_ref().map(|p| p.to_value()).unwrap_or_default();
            let reply = if text == json!("data") {
                json!({"a2a": {"reply": {"parts": [{"data": {"n": 1.50}}], "metadata": {"k": 1}}}})
            } else {
                json!({"a2a": {"reply": format!("you said {}", text.as_str().unwrap_or(""))}})
            };
            reply_raw(&c, &m, RawJson::from(reply), true).await;
        }
    });
    let path = "/a2a/agents/talker";
    // v1.0: `{message}`, the agent's, in the caller's context, tied to no task.
    let res = result(
        addr,
        path,
        "SendMessage",
        json!({"message": {"messageId": "m-1", "role": "ROLE_USER", "contextId": "ctx-1",
            "parts": [{"text": "hi"}]}}),
    )
    .await;
    assert!(res.get("task").is_none(), "{res}");
    let m = &res["message"];
    assert_eq!(m["role"], "ROLE_AGENT");
    assert_eq!(m["parts"], json!([{"text": "you said hi"}]));
    assert_eq!(m["contextId"], "ctx-1");
    assert!(m.get("taskId").is_none(), "{m}");
    // Parts and metadata as the agent gave them.
    let res = result(
        addr,
        path,
        "SendMessage",
        json!({"message": v1_text("data")}),
    )
    .await;
    assert_eq!(res["message"]["parts"], json!([{"data": {"n": 1.5}}]));
    assert_eq!(res["message"]["metadata"], json!({"k": 1}));
    // v0.3: a `kind: "message"` result.
    let res = result(
        addr,
        path,
        "message/send",
        json!({"message": {"kind": "message", "messageId": "m-3", "role": "user",
            "parts": [{"kind": "text", "text": "yo"}]}}),
    )
    .await;
    assert_eq!(res["kind"], "message");
    assert_eq!(res["role"], "agent");
    assert_eq!(
        res["parts"],
        json!([{"kind": "text", "text": "you said yo"}])
    );
    // A stream: the task as it starts, then the message as the last event.
    let body = rpc_body(
        json!(4),
        "SendStreamingMessage",
        json!({"message": v1_text("streamed")}),
    );
    let mut sse = post_stream(addr, path, &body).await;
    let got = frames(&mut sse, &json!(4)).await;
    assert_eq!(got[0]["task"]["status"]["state"], "TASK_STATE_SUBMITTED");
    let last = got.last().unwrap();
    assert_eq!(
        last["message"]["parts"],
        json!([{"text": "you said streamed"}]),
        "{got:?}"
    );
}
