//! A2A callers act as themselves (issue 22): the security probe's findings, reproduced against a
//! real server over loopback HTTP with five principals (API keys and JWTs), and what must not
//! happen asserted beside what must.
//!
//! - `ops`: a system principal (`auth.system_principals`);
//! - `alice`, `bob`: ordinary principals;
//! - `viewer`: without `messaging.canSend`, `lifecycle.canRegister`, `tasks.canCreate`,
//!   `mail.canCreate`;
//! - `dev`: runs the MAP agent `worker` (so it owns the agent every task goes to);
//! - `carol`: may send, but not create tasks (`tasks.canCreate = false`).
//!
//! Findings: H2 (A2A tasks shared by everyone who sees the agent), M1 (squatting the gateway's
//! ids), M2 (a MAP session per credential string), the default (auth on, no trusted
//! transports), 401 before the body, and MAP's limits reported as such. Every await is bounded.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::http::{find, request, HttpResponse};
use common::*;
use futures::StreamExt;
use map_router::auth::config::{OneOrMany, Secret};
use map_router::client::{AgentHandle, Client, ClientOptions};
use map_router::protocol::json::RawJson;
use map_router::protocol::message::Message as MapMessage;
use map_router::protocol::methods::agents::RegisterParams;
use map_router::protocol::methods::messaging::SendParams;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

const OPS: &str = "ak-ops-0123456789abcdef";
const ALICE: &str = "ak-alice-0123456789abcdef";
const BOB: &str = "ak-bob-0123456789abcdef";
const VIEWER: &str = "ak-viewer-0123456789abcdef";
const DEV: &str = "ak-dev-0123456789abcdef";
const CAROL: &str = "ak-carol-0123456789abcdef";

const ISS: &str = "https://issuer.test";
const AUD: &str = "map-router-test";
const SECRET: &str = "a-shared-hs256-secret-of-32-bytes-or-more";

/// A server with `[auth]` on (API keys of the six principals, HS256 JWTs), no trusted
/// transports for in-process links (the default), `ops` a system principal, the `viewer` and
/// `carol` grants narrowed; `extra` TOML is appended in `[a2a]` (e.g. `push_allow`).
async fn server(extra: &str) -> (map_router::server::Server, SocketAddr, String) {
    let (server, url) = start_server(|c| {
        let mut t = map_router::server::Config::from_toml(&format!(
            r#"
[auth]
system_principals = ["ops"]

[permissions.principals."viewer".messaging]
canSend = false
[permissions.principals."viewer".lifecycle]
canRegister = false
[permissions.principals."viewer".tasks]
canCreate = false
[permissions.principals."viewer".mail]
canCreate = false

[permissions.principals."carol".tasks]
canCreate = false

[a2a]
{extra}
"#
        ))
        .expect("config");
        t.listen = c.listen.clone();
        t.auth.api_keys.inline = Some(Secret(format!(
            "{OPS} ops,{ALICE} alice,{BOB} bob,{VIEWER} viewer,{DEV} dev,{CAROL} carol"
        )));
        t.auth.jwt.secret = Some(Secret(SECRET.into()));
        t.auth.jwt.issuer = OneOrMany::One(ISS.into());
        t.auth.jwt.audience = OneOrMany::One(AUD.into());
        *c = t;
    })
    .await;
    let addr = server.local_addrs()[0];
    (server, addr, url)
}

/// An HS256 JWT for `sub`, made distinct by `jti`.
fn jwt(sub: &str, jti: usize) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = json!({"sub": sub, "iss": ISS, "aud": AUD, "iat": now, "exp": now + 600, "jti": format!("t-{jti}")});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .expect("sign")
}

/// A MAP agent `name` run by the principal of `key`, whose messages go to the returned channel
/// (registered while the returned handle lives).
async fn agent(
    url: &str,
    key: &str,
    name: &str,
) -> (Client, AgentHandle, mpsc::UnboundedReceiver<MapMessage>) {
    let client = with_timeout(Client::connect_ws(
        url,
        ClientOptions::agent().name(name).api_key(key),
    ))
    .await
    .expect("agent connects");
    let handle = with_timeout(client.register(RegisterParams {
        name: Some(name.into()),
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

/// Replies to `m` with `payload` (an ordinary MAP result reply).
async fn reply(c: &Client, m: &MapMessage, payload: Value) {
    let correlation = m.correlation_id().unwrap_or_else(|| m.id.to_string());
    with_timeout(c.send_with(SendParams {
        to: RawJson::from(json!({"agent": m.from})),
        payload: Some(RawJson::from(payload)),
        meta: Some(RawJson::from(
            json!({"correlationId": correlation, "isResult": true}),
        )),
    }))
    .await
    .expect("reply");
}

fn rpc_body(method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string()
}

async fn post_as(addr: SocketAddr, path: &str, auth: &str, body: &str) -> HttpResponse {
    let bearer = format!("Bearer {auth}");
    request(
        addr,
        "POST",
        path,
        &[
            ("Content-Type", "application/json"),
            ("Authorization", bearer.as_str()),
        ],
        body.as_bytes(),
    )
    .await
}

/// One JSON-RPC call as `key`: the HTTP status and the whole answer, as text and as JSON.
async fn call(
    addr: SocketAddr,
    path: &str,
    key: &str,
    method: &str,
    params: Value,
) -> (u16, String, Value) {
    let r = post_as(addr, path, key, &rpc_body(method, params)).await;
    let text = String::from_utf8_lossy(&r.body).to_string();
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    (r.status, text, v)
}

/// The result of a call that must succeed.
async fn ok(addr: SocketAddr, path: &str, key: &str, method: &str, params: Value) -> Value {
    let (status, text, v) = call(addr, path, key, method, params).await;
    assert_eq!(status, 200, "{method}: {text}");
    assert!(v.get("error").is_none(), "{method}: {text}");
    v["result"].clone()
}

/// A webhook on 127.0.0.1:0: each request's head goes to the channel; answers 200.
async fn webhook() -> (String, mpsc::UnboundedReceiver<String>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut raw = Vec::new();
            let mut buf = [0u8; 4096];
            while find(&raw, b"\r\n\r\n").is_none() {
                let n = s.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                raw.extend_from_slice(&buf[..n]);
            }
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                .await;
            let _ = tx.send(String::from_utf8_lossy(&raw).to_string());
        }
    });
    (url, rx)
}

/// The MAP task `id` as the system principal `ops` reads it over MAP.
async fn map_task(ops: &Client, id: &str) -> Value {
    with_timeout(ops.call_raw("map/tasks/get", json!({"taskId": id})))
        .await
        .expect("map/tasks/get")["task"]
        .clone()
}

/// How many MAP tasks the system principal sees.
async fn task_count(ops: &Client) -> usize {
    with_timeout(ops.call_raw("map/tasks/list", json!({"limit": 1000})))
        .await
        .expect("map/tasks/list")["tasks"]
        .as_array()
        .unwrap()
        .len()
}

const SECRET_TEXT: &str = "alice's secret plan";

// ---------------------------------------------------------------------------------------------
// H2: an A2A task is its caller's

#[tokio::test]
async fn an_a2a_task_is_its_callers_and_no_other_principal_reaches_it() {
    let (hook, mut hooked) = webhook().await;
    let (_server, addr, url) = server(&format!("push_allow = [\"{hook}\"]\n")).await;
    let (dev, _worker, mut inbox) = agent(&url, DEV, "worker").await;
    let ops = with_timeout(Client::connect_ws(
        &url,
        ClientOptions::new()
            .participant_type(map_router::protocol::capabilities::ParticipantType::System)
            .api_key(OPS),
    ))
    .await
    .expect("ops connects as system");
    let at = "/a2a/agents/worker";

    // alice: a task (left working), with a webhook that carries her secrets.
    let res = ok(
        addr,
        at,
        ALICE,
        "SendMessage",
        json!({"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": SECRET_TEXT}]},
            "configuration": {"returnImmediately": true, "taskPushNotificationConfig":
                {"id": "alice-hook", "url": hook, "token": "alice-token",
                 "authentication": {"scheme": "Bearer", "credentials": "alice-cred"}}}}),
    )
    .await;
    let id = res["task"]["id"].as_str().unwrap().to_owned();
    let asked = with_timeout(inbox.recv()).await.unwrap();
    let before = ok(addr, "/a2a", ALICE, "GetTask", json!({"id": id})).await;
    assert_eq!(before["status"]["state"], "TASK_STATE_WORKING");
    assert_eq!(before["history"][0]["parts"][0]["text"], SECRET_TEXT);
    let listed = ok(addr, at, ALICE, "ListTasks", json!({})).await;
    assert_eq!(listed["tasks"][0]["id"], id.as_str());
    let mine = ok(
        addr,
        at,
        ALICE,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": id}),
    )
    .await;
    assert_eq!(mine["configs"][0]["token"], "alice-token");
    assert_eq!(
        mine["configs"][0]["authentication"]["credentials"],
        "alice-cred"
    );

    // The MAP task: created by alice's session (not the gateway), owned by her principal, and
    // no secret of hers in it.
    let task = map_task(&ops, &id).await;
    assert_eq!(task["meta"]["a2a"]["owner"], json!({"id": "alice"}));
    assert_ne!(task["createdBy"], "a2a-gateway");
    assert_ne!(task["createdBy"], "a2a-gateway-tasks");
    let text = task.to_string();
    assert!(!text.contains("alice-token") && !text.contains("alice-cred"));
    let tasks_before = task_count(&ops).await;

    // bob and viewer: every way in answers "task not found", and shows nothing of hers.
    for key in [BOB, VIEWER] {
        for path in ["/a2a", at] {
            let attempts: Vec<(&str, Value)> = vec![
                ("GetTask", json!({"id": id})),
                ("tasks/get", json!({"id": id})),
                ("CancelTask", json!({"id": id})),
                ("tasks/cancel", json!({"id": id})),
                (
                    "SendMessage",
                    json!({"message": {"messageId": "m-evil", "role": "ROLE_USER", "taskId": id,
                        "parts": [{"text": "follow-up by someone else"}]}}),
                ),
                ("ListTaskPushNotificationConfigs", json!({"taskId": id})),
                (
                    "GetTaskPushNotificationConfig",
                    json!({"taskId": id, "id": "alice-hook"}),
                ),
                (
                    "DeleteTaskPushNotificationConfig",
                    json!({"taskId": id, "id": "alice-hook"}),
                ),
                (
                    "CreateTaskPushNotificationConfig",
                    json!({"taskId": id, "id": "alice-hook", "url": hook, "token": "evil"}),
                ),
                ("tasks/pushNotificationConfig/list", json!({"id": id})),
                (
                    "tasks/pushNotificationConfig/delete",
                    json!({"id": id, "pushNotificationConfigId": "alice-hook"}),
                ),
            ];
            for (method, params) in attempts {
                let (status, text, v) = call(addr, path, key, method, params).await;
                assert_eq!(status, 200, "{method} at {path}: {text}");
                assert_eq!(v["error"]["code"], -32001, "{method} at {path}: {text}");
                for secret in [SECRET_TEXT, "alice-token", "alice-cred", "alice-hook"] {
                    assert!(
                        !text.contains(secret),
                        "{method} at {path} shows {secret}: {text}"
                    );
                }
            }
            // Subscribing is refused before any stream starts.
            let r = post_as(
                addr,
                path,
                key,
                &rpc_body("SubscribeToTask", json!({"id": id})),
            )
            .await;
            assert_eq!(r.header("content-type"), Some("application/json"));
            assert_eq!(r.json()["error"]["code"], -32001);
            // Listing shows none of hers.
            let (status, text, v) = call(addr, path, key, "ListTasks", json!({})).await;
            assert_eq!(status, 200, "{text}");
            assert_eq!(v["result"]["tasks"], json!([]), "{text}");
        }
    }

    // viewer may not send: 403, and no task is made, no message reaches the agent.
    let (status, text, v) = call(
        addr,
        at,
        VIEWER,
        "SendMessage",
        json!({"message": {"messageId": "m-v", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}),
    )
    .await;
    assert_eq!(status, 403, "{text}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("messaging.canSend"));
    // carol may send but not create tasks: MAP's own refusal, 403.
    let (status, text, v) = call(
        addr,
        at,
        CAROL,
        "SendMessage",
        json!({"message": {"messageId": "m-c", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}),
    )
    .await;
    assert_eq!(status, 403, "{text}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tasks.canCreate"),
        "{text}"
    );
    assert_eq!(task_count(&ops).await, tasks_before, "no task was made");

    // alice's task is as it was: same state and history, her webhook with its secrets, and the
    // agent got no follow-up and no cancel notice.
    let after = ok(addr, "/a2a", ALICE, "GetTask", json!({"id": id})).await;
    assert_eq!(after, before);
    let still = ok(
        addr,
        at,
        ALICE,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": id}),
    )
    .await;
    assert_eq!(still, mine);
    if let Ok(m) = tokio::time::timeout(QUIET, inbox.recv()).await {
        panic!("the agent got another message: {m:?}");
    }

    // ops (system) and dev (whose agent serves the task) may see it, and her webhook, but not
    // its secrets; dev may not delete it.
    for key in [OPS, DEV] {
        let got = ok(addr, "/a2a", key, "GetTask", json!({"id": id})).await;
        assert_eq!(got["history"][0]["parts"][0]["text"], SECRET_TEXT);
        let (status, text, v) = call(
            addr,
            at,
            key,
            "ListTaskPushNotificationConfigs",
            json!({"taskId": id}),
        )
        .await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(v["result"]["configs"][0]["url"], hook.as_str());
        assert_eq!(
            v["result"]["configs"][0]["authentication"],
            json!({"scheme": "Bearer"})
        );
        assert!(
            !text.contains("alice-token") && !text.contains("alice-cred"),
            "{text}"
        );
        let listed = ok(addr, "/a2a", key, "ListTasks", json!({})).await;
        assert_eq!(listed["tasks"][0]["id"], id.as_str());
    }
    let (status, text, _) = call(
        addr,
        at,
        DEV,
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": id, "id": "alice-hook"}),
    )
    .await;
    assert_eq!(status, 403, "{text}");
    let (_, _, v) = call(
        addr,
        at,
        DEV,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": id, "id": "alice-hook", "url": hook, "token": "dev"}),
    )
    .await;
    assert_eq!(v["error"]["code"], -32602, "her config's id is hers");
    assert_eq!(
        ok(
            addr,
            at,
            ALICE,
            "ListTaskPushNotificationConfigs",
            json!({"taskId": id})
        )
        .await,
        mine
    );

    // bob's own task is his alone.
    let res = ok(
        addr,
        at,
        BOB,
        "SendMessage",
        json!({"message": {"messageId": "m-b", "role": "ROLE_USER", "parts": [{"text": "bob's"}]},
            "configuration": {"returnImmediately": true}}),
    )
    .await;
    let bobs = res["task"]["id"].as_str().unwrap().to_owned();
    let bob_asked = with_timeout(inbox.recv()).await.unwrap();
    let list = ok(addr, "/a2a", BOB, "ListTasks", json!({})).await;
    let ids: Vec<&str> = list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![bobs.as_str()]);
    let list = ok(addr, "/a2a", ALICE, "ListTasks", json!({})).await;
    let ids: Vec<&str> = list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![id.as_str()]);
    let (_, _, v) = call(addr, "/a2a", ALICE, "GetTask", json!({"id": bobs})).await;
    assert_eq!(v["error"]["code"], -32001);

    // The agent answers both: alice's webhook gets her task's changes with her credential.
    reply(&dev, &asked, json!("done")).await;
    reply(&dev, &bob_asked, json!("done too")).await;
    let head = within(Duration::from_secs(10), hooked.recv())
        .await
        .unwrap();
    assert!(head.contains("Authorization: Bearer alice-cred"), "{head}");
    within(Duration::from_secs(5), async {
        loop {
            let t = ok(addr, "/a2a", ALICE, "GetTask", json!({"id": id})).await;
            if t["status"]["state"] == "TASK_STATE_COMPLETED" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// M1: the gateway's ids cannot be squatted

#[tokio::test]
async fn squatting_the_gateways_ids_fails_and_a2a_keeps_working() {
    let (_server, addr, url) = server("").await;
    // Before anyone used A2A: bob asks for the gateway's participant ids and agent id.
    let mut squatters = Vec::new();
    for id in ["a2a-gateway", "a2a-gateway-tasks"] {
        let mut bob = WsClient::connect_as(
            &url,
            "agent",
            json!({"participantId": id, "auth": {"method": "api-key", "credential": BOB}}),
        )
        .await;
        assert_ne!(bob.pid(), id, "bob got another participant id");
        let err = bob.err("map/agents/register", json!({"agentId": id})).await;
        assert_eq!(err["code"], 1003, "{err}");
        squatters.push(bob);
    }
    let squatter_pids: Vec<String> = squatters.iter().map(WsClient::pid).collect();

    // A2A works, and the gateway, not bob, sends the messages.
    let (dev, _worker, mut inbox) = agent(&url, DEV, "worker").await;
    let at = "/a2a/agents/worker";
    let res = ok(
        addr,
        at,
        ALICE,
        "SendMessage",
        json!({"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]},
            "configuration": {"returnImmediately": true}}),
    )
    .await;
    let id = res["task"]["id"].as_str().unwrap().to_owned();
    let asked = with_timeout(inbox.recv()).await.unwrap();
    assert_eq!(asked.from.as_str(), "a2a-gateway");
    reply(&dev, &asked, json!("hello")).await;
    within(Duration::from_secs(5), async {
        loop {
            let t = ok(addr, "/a2a", ALICE, "GetTask", json!({"id": id})).await;
            if t["status"]["state"] == "TASK_STATE_COMPLETED" {
                assert_eq!(t["artifacts"][0]["parts"][0]["text"], "hello");
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // bob is creator of nothing and sees nothing of it.
    let ops = with_timeout(Client::connect_ws(
        &url,
        ClientOptions::new()
            .participant_type(map_router::protocol::capabilities::ParticipantType::System)
            .api_key(OPS),
    ))
    .await
    .unwrap();
    let task = map_task(&ops, &id).await;
    assert!(!squatter_pids.contains(&task["createdBy"].as_str().unwrap().to_owned()));
    let (_, _, v) = call(addr, "/a2a", BOB, "GetTask", json!({"id": id})).await;
    assert_eq!(v["error"]["code"], -32001);
}

#[tokio::test]
async fn nobody_but_the_gateway_writes_an_a2a_record_so_no_owner_is_made_up() {
    let (_server, addr, url) = server("").await;
    let (dev, _worker, mut inbox) = agent(&url, DEV, "worker").await;
    let at = "/a2a/agents/worker";
    let connect = |key: &'static str, system: bool| {
        let url = url.clone();
        async move {
            let options = if system {
                ClientOptions::new()
                    .participant_type(map_router::protocol::capabilities::ParticipantType::System)
            } else {
                ClientOptions::new()
            };
            with_timeout(Client::connect_ws(&url, options.api_key(key)))
                .await
                .unwrap()
        }
    };
    let (bob, ops) = (connect(BOB, false).await, connect(OPS, true).await);
    let made_up = json!({"contextId": "ctx-x", "state": "TASK_STATE_WORKING", "agent": "worker",
        "owner": {"id": "alice"}, "history": [{"messageId": "x", "role": "ROLE_USER",
        "parts": [{"text": "planted by bob"}]}]});
    // bob makes a task claiming to be alice's A2A task: refused, nothing made. So does ops,
    // a system principal (only the gateway's own sessions write the record).
    for who in [&bob, &ops] {
        let before = task_count(&ops).await;
        let e = with_timeout(who.call_raw(
            "map/tasks/create",
            json!({"task": {"id": format!("planted-{}", before), "meta": {"a2a": made_up}}}),
        ))
        .await
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("meta.a2a is written by the router's gateway only"),
            "{e}"
        );
        assert_eq!(task_count(&ops).await, before, "nothing made");
    }
    // Nor added to a task of bob's own afterwards.
    let own = with_timeout(bob.call_raw("map/tasks/create", json!({"task": {"title": "mine"}})))
        .await
        .unwrap()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let e = with_timeout(bob.call_raw(
        "map/tasks/update",
        json!({"taskId": own, "meta": {"a2a": made_up}}),
    ))
    .await
    .unwrap_err();
    assert!(e.to_string().contains("meta.a2a"), "{e}");
    assert!(map_task(&ops, &own).await["meta"].get("a2a").is_none());
    // alice's A2A tasks are hers alone: nothing of bob's in her list.
    let listed = ok(addr, at, ALICE, "ListTasks", json!({})).await;
    assert_eq!(listed["tasks"], json!([]), "{listed}");

    // The gateway still makes hers, with the record (and the webhook-facing first state) as
    // before; the MAP task is created by her session, the record written by the gateway.
    let res = ok(
        addr,
        at,
        ALICE,
        "SendMessage",
        json!({"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "real"}]},
            "configuration": {"returnImmediately": true}}),
    )
    .await;
    let id = res["task"]["id"].as_str().unwrap().to_owned();
    let asked = with_timeout(inbox.recv()).await.unwrap();
    let task = map_task(&ops, &id).await;
    assert_eq!(task["meta"]["a2a"]["owner"], json!({"id": "alice"}));
    assert_eq!(task["meta"]["a2a"]["gateway"], "a2a-gateway");
    // ... and an agent (dev, the assignee's principal) cannot rewrite the record either.
    let e = with_timeout(dev.call_raw(
        "map/tasks/update",
        json!({"taskId": id, "meta": {"a2a": made_up}}),
    ))
    .await
    .unwrap_err();
    assert!(e.to_string().contains("meta.a2a"), "{e}");
    reply(&dev, &asked, json!("done")).await;
    within(Duration::from_secs(5), async {
        loop {
            let t = ok(addr, "/a2a", ALICE, "GetTask", json!({"id": id})).await;
            if t["status"]["state"] == "TASK_STATE_COMPLETED" {
                assert_eq!(t["history"][0]["parts"][0]["text"], "real");
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let listed = ok(addr, at, ALICE, "ListTasks", json!({})).await;
    assert_eq!(listed["tasks"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["tasks"][0]["id"], id.as_str());
}

// ---------------------------------------------------------------------------------------------
// M2: one MAP session per principal, whatever its credentials

#[tokio::test]
async fn many_credentials_of_one_principal_share_one_map_session_and_lock_nobody_out() {
    let (_server, addr, url) = server("").await;
    let (dev, _worker, mut inbox) = agent(&url, DEV, "worker").await;
    tokio::spawn(async move {
        while let Some(m) = inbox.recv().await {
            reply(&dev, &m, json!("ok")).await;
        }
    });
    // alice's own MAP client, answered throughout.
    let alice = with_timeout(Client::connect_ws(
        &url,
        ClientOptions::new().bearer_token(jwt("alice", 0)),
    ))
    .await
    .expect("alice connects over MAP");
    // 70 distinct JWTs of alice (the default max_sessions_per_principal is 64), each used once.
    for i in 1..=70 {
        let token = jwt("alice", i);
        let (status, text, v) = if i % 10 == 0 {
            call(
                addr,
                "/a2a/agents/worker",
                &token,
                "SendMessage",
                json!({"message": {"messageId": format!("m-{i}"), "role": "ROLE_USER", "parts": [{"text": "hi"}]}}),
            )
            .await
        } else {
            call(addr, "/a2a", &token, "GetTask", json!({"id": "task-none"})).await
        };
        assert_eq!(status, 200, "request {i}: {text}");
        if i % 10 == 0 {
            assert_eq!(
                v["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
                "{text}"
            );
        } else {
            assert_eq!(v["error"]["code"], -32001, "request {i}: {text}");
        }
        with_timeout(alice.list_agents(Default::default()))
            .await
            .unwrap_or_else(|e| panic!("alice's MAP client after request {i}: {e}"));
    }
    // alice's sessions: her MAP client and the gateway's one for her, no more.
    let sessions = with_timeout(alice.call_raw("map/session/list", json!({})))
        .await
        .unwrap();
    let n = sessions["sessions"].as_array().unwrap().len();
    assert!(n <= 2, "alice has {n} sessions: {sessions}");
    // Nobody is locked out: a new MAP session of alice, and bob over A2A.
    let again = with_timeout(Client::connect_ws(
        &url,
        ClientOptions::new().bearer_token(jwt("alice", 1000)),
    ))
    .await
    .expect("alice can still connect over MAP");
    with_timeout(again.list_agents(Default::default()))
        .await
        .unwrap();
    let (status, _, v) = call(addr, "/a2a", BOB, "GetTask", json!({"id": "task-none"})).await;
    assert_eq!((status, v["error"]["code"].clone()), (200, json!(-32001)));
}

// ---------------------------------------------------------------------------------------------
// 401 first; MAP's limits as they are

#[tokio::test]
async fn an_unauthenticated_caller_gets_401_before_its_body_is_read() {
    let (_server, addr, _url) = server("").await;
    for auth in ["", "Authorization: Bearer ak-nobody-0000000000\r\n"] {
        // The head promises a large body, none is sent: the answer must not wait for it.
        let mut s = with_timeout(TcpStream::connect(addr)).await.unwrap();
        let head = format!(
            "POST /a2a/agents/worker HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}Content-Length: 1000000\r\n\r\n"
        );
        with_timeout(s.write_all(head.as_bytes())).await.unwrap();
        let mut raw = Vec::new();
        with_timeout(async {
            let mut buf = [0u8; 4096];
            while find(&raw, b"\r\n\r\n").is_none() {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed without an answer");
                raw.extend_from_slice(&buf[..n]);
            }
        })
        .await;
        let text = String::from_utf8_lossy(&raw).to_ascii_lowercase();
        assert!(text.starts_with("http/1.1 401"), "{text}");
        assert!(text.contains("connection: close"), "{text}");
    }
    // With a credential the same route is served (here: no such agent yet).
    let (status, _, _) = call(
        addr,
        "/a2a/agents/worker",
        ALICE,
        "GetTask",
        json!({"id": "x"}),
    )
    .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn map_quotas_and_rate_limits_answer_429_with_the_routers_words() {
    // A quota: alice may hold one session, and holds it over MAP.
    let (_server, addr, url) = server("[limits]\nmax_sessions_per_principal = 1\n").await;
    let alice = with_timeout(Client::connect_ws(
        &url,
        ClientOptions::new().api_key(ALICE),
    ))
    .await
    .unwrap();
    let (status, text, v) = call(addr, "/a2a", ALICE, "GetTask", json!({"id": "x"})).await;
    assert_eq!(status, 429, "{text}");
    assert_eq!(v["error"]["code"], 4002, "{text}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("sessions per principal (limit 1)"),
        "{text}"
    );
    // Others are served (the gateway's own sessions are not alice's).
    let (status, _, v) = call(addr, "/a2a", BOB, "GetTask", json!({"id": "x"})).await;
    assert_eq!((status, v["error"]["code"].clone()), (200, json!(-32001)));
    drop(alice);

    // A rate: alice spends her principal's budget over MAP; her A2A calls are then 429 with
    // Retry-After, while bob's, and the gateway's own work, go on.
    let (_server, addr, url) = server(
        "[limits]\nrate_per_principal = 1\nburst_per_principal = 20\nexempt_loopback = true\n",
    )
    .await;
    let (_dev, _worker, _inbox) = agent(&url, DEV, "worker").await;
    let (status, _, _) = call(
        addr,
        "/a2a/agents/worker",
        ALICE,
        "GetTask",
        json!({"id": "x"}),
    )
    .await;
    assert_eq!(status, 200, "alice's session is open");
    let alice = with_timeout(Client::connect_ws(
        &url,
        ClientOptions::new().api_key(ALICE),
    ))
    .await
    .unwrap();
    with_timeout(async {
        loop {
            if let Err(e) = alice.list_agents(Default::default()).await {
                assert_eq!(e.code().map(|c| c.0), Some(4001), "{e}");
                break;
            }
        }
    })
    .await;
    let r = post_as(
        addr,
        "/a2a/agents/worker",
        ALICE,
        &rpc_body("GetTask", json!({"id": "x"})),
    )
    .await;
    assert_eq!(r.status, 429, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["error"]["code"], 4001);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("retry after"));
    assert!(r.header("retry-after").is_some());
    let (status, text, v) = call(
        addr,
        "/a2a/agents/worker",
        BOB,
        "GetTask",
        json!({"id": "x"}),
    )
    .await;
    assert_eq!(
        (status, v["error"]["code"].clone()),
        (200, json!(-32001)),
        "{text}"
    );
}

#[tokio::test]
async fn list_tasks_pages_through_the_callers_own_tasks_only() {
    let (_server, addr, url) = server("").await;
    let (_dev, _worker, _inbox) = agent(&url, DEV, "worker").await;
    let at = "/a2a/agents/worker";
    // Interleaved: alice, bob, alice, bob, alice.
    let mut made = Vec::new();
    for (i, key) in [ALICE, BOB, ALICE, BOB, ALICE].into_iter().enumerate() {
        let res = ok(
            addr,
            at,
            key,
            "SendMessage",
            json!({"message": {"messageId": format!("m-{i}"), "role": "ROLE_USER", "parts": [{"text": "t"}]},
                "configuration": {"returnImmediately": true}}),
        )
        .await;
        made.push((key, res["task"]["id"].as_str().unwrap().to_owned()));
    }
    for (key, size) in [(ALICE, 1), (BOB, 1), (ALICE, 2), (BOB, 50)] {
        let want: Vec<String> = made
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, id)| id.clone())
            .collect();
        let mut got: Vec<String> = Vec::new();
        let mut token = String::new();
        for _ in 0..10 {
            let page = ok(
                addr,
                "/a2a",
                key,
                "ListTasks",
                json!({"pageSize": size, "pageToken": token}),
            )
            .await;
            let tasks = page["tasks"].as_array().unwrap();
            assert!(tasks.len() <= size, "{page}");
            got.extend(tasks.iter().map(|t| t["id"].as_str().unwrap().to_owned()));
            token = page["nextPageToken"].as_str().unwrap().to_owned();
            if token.is_empty() {
                break;
            }
        }
        assert!(token.is_empty(), "the pages end");
        assert_eq!(
            got, want,
            "pageSize {size}: each of its own tasks once, in order, no other"
        );
    }
}
