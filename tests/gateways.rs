//! The MAMP and IM gateways over real sockets on 127.0.0.1 (docs/gateways.md): hostile input
//! (malformed JSON, huge bodies, unknown agents, bad URIs, frames of the wrong type), and what
//! a MAP observer subscribed to `mail.*` and `message_*` saw of the gateways' traffic. The
//! seed-shaped client flows are in `tests/gateways/` (Python, run by scripts/test.sh).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::http::{request, HttpResponse};
use common::{start_server, with_timeout, within};
use futures::{SinkExt, StreamExt};
use map_router::client::{Client, ClientOptions, EventEnvelope, Subscription};
use map_router::protocol::capabilities::ParticipantType;
use map_router::protocol::event::SubscriptionFilter;
use map_router::protocol::methods::agents::RegisterParams;
use map_router::protocol::methods::messaging::SendParams;
use map_router::server::{Config, Server};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message as Ws;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn server(tweak: impl FnOnce(&mut Config)) -> (Server, SocketAddr, String) {
    let (server, url) = start_server(tweak).await;
    let addr = server.local_addrs()[0];
    (server, addr, url)
}

async fn post(addr: SocketAddr, path: &str, body: &[u8], bearer: Option<&str>) -> HttpResponse {
    let auth = bearer.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    request(addr, "POST", path, &headers, body).await
}

async fn get(addr: SocketAddr, path: &str) -> HttpResponse {
    request(addr, "GET", path, &[], b"").await
}

fn envelope(addr: SocketAddr, to: &str, conversation: Option<&str>, content: Value) -> Vec<u8> {
    let mut e = json!({
        "protocol": "mamp/1.0",
        "message_id": format!("msg-{}", rand_id()),
        "from": "agent://remote.example/caller",
        "to": format!("agent://{}/{to}", addr.ip()),
        "content": content,
        "metadata": {"timestamp": "2026-03-04T10:00:00Z"},
    });
    if let Some(c) = conversation {
        e["conversation_id"] = c.into();
    }
    serde_json::to_vec(&e).unwrap()
}

fn rand_id() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// The seeds' error body with `status`.
fn assert_error(r: &HttpResponse, status: u16, error: &str) {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["error"], error, "{v}");
    assert_eq!(v["status_code"], status, "{v}");
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
}

async fn map_agent(url: &str, name: &str) -> (Client, map_router::client::AgentHandle) {
    let client = with_timeout(Client::connect_ws(url, ClientOptions::agent().name(name)))
        .await
        .unwrap();
    let agent = with_timeout(client.register(RegisterParams {
        name: Some(name.into()),
        ..RegisterParams::default()
    }))
    .await
    .unwrap();
    (client, agent)
}

async fn observer(url: &str) -> (Client, Subscription) {
    let client = with_timeout(Client::connect_ws(
        url,
        ClientOptions::new().participant_type(ParticipantType::System),
    ))
    .await
    .unwrap();
    let sub = with_timeout(client.subscribe(SubscriptionFilter {
        event_types: Some(vec![
            "mail.*".into(),
            "message_sent".into(),
            "message_delivered".into(),
        ]),
        ..SubscriptionFilter::default()
    }))
    .await
    .unwrap();
    (client, sub)
}

/// Events until `pred` holds for the collected list (bounded).
async fn events_until(
    sub: &mut Subscription,
    pred: impl Fn(&[EventEnvelope]) -> bool,
) -> Vec<EventEnvelope> {
    let mut seen = Vec::new();
    within(Duration::from_secs(10), async {
        while !pred(&seen) {
            seen.push(sub.next().await.expect("subscription open"));
        }
    })
    .await;
    seen
}

async fn ws(addr: SocketAddr) -> Socket {
    let (s, _) = with_timeout(tokio_tungstenite::connect_async(format!(
        "ws://{addr}/gateway/connect"
    )))
    .await
    .unwrap();
    s
}

async fn send(s: &mut Socket, v: Value) {
    with_timeout(s.send(Ws::Text(v.to_string().into())))
        .await
        .unwrap();
}

/// The next text frame as JSON.
async fn frame(s: &mut Socket) -> Value {
    loop {
        match with_timeout(s.next()).await {
            Some(Ok(Ws::Text(t))) => return serde_json::from_str(t.as_str()).unwrap(),
            Some(Ok(Ws::Ping(_) | Ws::Pong(_))) => continue,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

/// Polls `GET path` until `pred` holds on its JSON (bounded).
async fn poll(addr: SocketAddr, path: &str, pred: impl Fn(&HttpResponse) -> bool) -> HttpResponse {
    within(Duration::from_secs(10), async {
        loop {
            let r = get(addr, path).await;
            if pred(&r) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// MAMP

#[tokio::test]
async fn mamp_card_has_the_seeds_shape() {
    let (_server, addr, url) = server(|_| {}).await;
    let r = get(addr, "/mamp/v1/card").await;
    assert_eq!(r.status, 200);
    let card = r.json();
    assert_eq!(card["protocol"], "mamp/1.0");
    // One URI per agent: the card names the router's canonical host (its listen address).
    assert_eq!(card["agent_id"], format!("agent://{addr}/map-router"));
    assert_eq!(
        card["capabilities"]["content_types"],
        json!(["text", "image", "code", "file"])
    );
    // What the router delivers (limits.max_payload_bytes), not the seed's 10 MiB.
    assert_eq!(card["capabilities"]["max_message_size"], 256 * 1024);
    assert_eq!(card["access"]["require_auth"], false);

    let (_c, agent) = map_agent(&url, "analyst").await;
    let r = get(addr, "/mamp/v1/agents/analyst/card").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let card = r.json();
    assert_eq!(card["protocol"], "mamp/1.0");
    assert_eq!(card["agent_id"], format!("agent://{addr}/{}", agent.id()));
    assert_eq!(card["name"], "analyst");
    assert_error(
        &get(addr, "/mamp/v1/agents/nobody/card").await,
        404,
        "agent_not_found",
    );
}

#[tokio::test]
async fn mamp_refuses_hostile_input() {
    let (_server, addr, url) = server(|c| c.gateways.mamp.max_message_size = 4096).await;
    let (_c, _agent) = map_agent(&url, "analyst").await;
    let path = "/mamp/v1/messages";
    assert_error(
        &post(addr, path, b"{not json", None).await,
        400,
        "invalid_message",
    );
    assert_error(&post(addr, path, b"[]", None).await, 400, "invalid_message");
    let mut wrong: Value =
        serde_json::from_slice(&envelope(addr, "analyst", None, json!("hi"))).unwrap();
    wrong["protocol"] = "mamp/9.9".into();
    assert_error(
        &post(addr, path, wrong.to_string().as_bytes(), None).await,
        400,
        "unsupported_protocol",
    );
    let mut bad_uri = wrong.clone();
    bad_uri["protocol"] = "mamp/1.0".into();
    bad_uri["from"] = "not a uri".into();
    assert_error(
        &post(addr, path, bad_uri.to_string().as_bytes(), None).await,
        400,
        "invalid_message",
    );
    let bad_block = envelope(
        addr,
        "analyst",
        None,
        json!([{"type": "video", "url": "x"}]),
    );
    assert_error(
        &post(addr, path, &bad_block, None).await,
        400,
        "unsupported_content_type",
    );
    let no_text = envelope(addr, "analyst", None, json!([{"type": "text"}]));
    assert_error(
        &post(addr, path, &no_text, None).await,
        400,
        "invalid_message",
    );
    let huge = envelope(addr, "analyst", None, json!("x".repeat(10_000)));
    assert_error(
        &post(addr, path, &huge, None).await,
        413,
        "message_too_large",
    );
    let nobody = envelope(addr, "nobody", None, json!("hi"));
    assert_error(
        &post(addr, path, &nobody, None).await,
        404,
        "agent_not_found",
    );
    let mut elsewhere: Value =
        serde_json::from_slice(&envelope(addr, "analyst", None, json!("hi"))).unwrap();
    elsewhere["to"] = "agent://other.example/analyst".into();
    assert_error(
        &post(addr, path, elsewhere.to_string().as_bytes(), None).await,
        404,
        "agent_not_found",
    );
    let bogus = envelope(addr, "analyst", Some("conv-bogus"), json!("hi"));
    assert_error(
        &post(addr, path, &bogus, None).await,
        404,
        "conversation_not_found",
    );
    // Still serving after all that.
    let ok = envelope(addr, "analyst", None, json!("hi"));
    assert_eq!(post(addr, path, &ok, None).await.status, 200);
}

#[tokio::test]
async fn mamp_checks_the_bearer_with_the_routers_auth() {
    // Authentication on, and nothing else configured: no trusted transport is needed.
    std::env::set_var("GW_TEST_KEYS", "secret-key-0123456789 tester");
    let (_server, addr, _url) = server(|c| {
        c.auth = toml::from_str("[api_keys]\nkeys_env = \"GW_TEST_KEYS\"\n").unwrap();
    })
    .await;
    let card = get(addr, "/mamp/v1/card").await.json();
    assert_eq!(card["access"]["require_auth"], true);
    let body = envelope(addr, "analyst", None, json!("hi"));
    assert_error(
        &post(addr, "/mamp/v1/messages", &body, None).await,
        401,
        "unauthorized",
    );
    assert_error(
        &post(addr, "/mamp/v1/messages", &body, Some("wrong")).await,
        401,
        "unauthorized",
    );
    // A good key gets past authentication; its `from` must then be its own...
    assert_error(
        &post(
            addr,
            "/mamp/v1/messages",
            &body,
            Some("secret-key-0123456789"),
        )
        .await,
        403,
        "forbidden",
    );
    // ...as one in its default namespace is (and there is no such agent).
    let mut own: Value = serde_json::from_slice(&body).unwrap();
    own["from"] = "agent://tester@remote.example/caller".into();
    assert_error(
        &post(
            addr,
            "/mamp/v1/messages",
            own.to_string().as_bytes(),
            Some("secret-key-0123456789"),
        )
        .await,
        404,
        "agent_not_found",
    );
    assert_error(&get(addr, "/gateway/agents").await, 401, "unauthorized");
}

#[tokio::test]
async fn mamp_messages_are_turns_of_one_conversation_and_every_observer_sees_them() {
    let (_server, addr, url) = server(|_| {}).await;
    let (_oc, mut events) = observer(&url).await;
    let (_c, agent) = map_agent(&url, "analyst").await;
    let mut inbox = agent.messages();
    let path = "/mamp/v1/messages";

    let first = post(
        addr,
        path,
        &envelope(addr, "analyst", None, json!("帮我分析这段代码的性能")),
        None,
    )
    .await;
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let first = first.json();
    assert_eq!(first["status"], "received");
    let conv = first["conversation_id"].as_str().unwrap().to_owned();
    assert!(first["message_id"].as_str().unwrap().starts_with("msg-"));

    let blocks = r#"[{"type":"text","text":"分析这张图片"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]"#;
    let second_body =
        String::from_utf8(envelope(addr, agent.id().as_str(), Some(&conv), json!("X")))
            .unwrap()
            .replace("\"content\":\"X\"", &format!("\"content\":{blocks}"));
    let second = post(addr, path, second_body.as_bytes(), None).await;
    assert_eq!(
        second.status,
        200,
        "{}",
        String::from_utf8_lossy(&second.body)
    );
    assert_eq!(second.json()["conversation_id"], conv.as_str());

    let m1 = within(Duration::from_secs(5), inbox.next()).await.unwrap();
    let m2 = within(Duration::from_secs(5), inbox.next()).await.unwrap();
    assert_eq!(m1.from, "agent://remote.example/caller");
    assert_eq!(
        m1.payload.as_ref().unwrap().get(),
        "\"帮我分析这段代码的性能\""
    );
    assert_eq!(
        m2.payload.as_ref().unwrap().get(),
        blocks,
        "content passes byte for byte"
    );
    for m in [&m1, &m2] {
        let meta = m.meta.as_ref().unwrap().to_value();
        assert_eq!(meta["mail"]["conversationId"], conv.as_str());
        assert_eq!(meta["protocol"], "mamp");
        assert_eq!(
            meta["mamp"]["metadata"]["timestamp"],
            "2026-03-04T10:00:00Z"
        );
    }

    let seen = events_until(&mut events, |s| {
        s.iter().filter(|e| e.kind() == "mail.turn.added").count() >= 2
            && s.iter().filter(|e| e.kind() == "message_delivered").count() >= 2
    })
    .await;
    assert!(seen
        .iter()
        .any(|e| e.kind() == "mail.created" && e.data()["conversationId"] == conv.as_str()));
    for e in seen.iter().filter(|e| e.kind() == "mail.turn.added") {
        assert_eq!(e.data()["conversationId"], conv.as_str());
    }
    assert!(seen.iter().filter(|e| e.kind() == "message_sent").count() >= 2);
}

// ---------------------------------------------------------------------------------------------
// IM

#[tokio::test]
async fn im_refuses_frames_of_the_wrong_type_and_bad_uris() {
    let (_server, addr, _url) = server(|_| {}).await;
    let mut s = ws(addr).await;
    with_timeout(s.send(Ws::Text("{nope".into())))
        .await
        .unwrap();
    assert_eq!(frame(&mut s).await["error"], "invalid_frame");
    send(&mut s, json!({"type": "heartbeat"})).await;
    assert_eq!(frame(&mut s).await["error"], "not_registered");
    send(
        &mut s,
        json!({"type": "register", "agent_uri": "internal/x", "capabilities": []}),
    )
    .await;
    assert_eq!(frame(&mut s).await["error"], "invalid_agent_uri");
    with_timeout(s.send(Ws::Binary(vec![1, 2, 3].into())))
        .await
        .unwrap();
    assert_eq!(frame(&mut s).await["error"], "unsupported_frame");
    send(
        &mut s,
        json!({"type": "register", "agent_uri": "agent://internal/x", "capabilities": ["bash"]}),
    )
    .await;
    let reg = frame(&mut s).await;
    assert_eq!(reg["type"], "registered", "{reg}");
    send(&mut s, json!({"type": "dance"})).await;
    assert_eq!(frame(&mut s).await["error"], "unknown_frame_type");
    send(
        &mut s,
        json!({"type": "register", "agent_uri": "agent://internal/y"}),
    )
    .await;
    assert_eq!(frame(&mut s).await["error"], "already_registered");
    send(&mut s, json!({"type": "heartbeat"})).await;
    assert_eq!(frame(&mut s).await["type"], "heartbeat_ack");

    // A second socket cannot take the same URI.
    let mut twin = ws(addr).await;
    send(
        &mut twin,
        json!({"type": "register", "agent_uri": "agent://internal/x"}),
    )
    .await;
    assert_eq!(frame(&mut twin).await["error"], "agent_uri_in_use");

    assert_error(
        &get(addr, "/gateway/status/not-a-uri").await,
        400,
        "invalid_agent_uri",
    );
    assert_error(
        &get(addr, "/gateway/status/agent%3A%2F%2Finternal%2Fnobody").await,
        404,
        "agent_not_found",
    );
    assert_error(
        &post(addr, "/gateway/send", b"{\"to\":", None).await,
        400,
        "invalid_message",
    );
    assert_error(
        &post(
            addr,
            "/gateway/send",
            br#"{"to":"agent://internal/nobody","content":"hi"}"#,
            None,
        )
        .await,
        404,
        "agent_not_found",
    );
    assert_error(
        &get(addr, "/api/contacts/agent%3A%2F%2Fnowhere%2Fnobody").await,
        404,
        "agent_not_found",
    );
    assert_error(
        &get(addr, "/api/traces/conv-nothing/collaborators").await,
        404,
        "trace_not_found",
    );
}

#[tokio::test]
async fn im_presence_follows_the_connection_and_its_heartbeats() {
    let (_server, addr, _url) = server(|c| c.gateways.im.heartbeat_timeout_ms = 400).await;
    let mut s = ws(addr).await;
    send(&mut s, json!({"type": "register", "agent_uri": "agent://internal/pc-agent", "capabilities": ["file_read"]})).await;
    assert_eq!(frame(&mut s).await["type"], "registered");
    for path in [
        "/gateway/status/agent%3A%2F%2Finternal%2Fpc-agent",
        "/gateway/status/agent://internal/pc-agent",
    ] {
        let r = get(addr, path).await;
        assert_eq!(r.status, 200, "{path}");
        let v = r.json();
        assert_eq!(v["agent_uri"], "agent://internal/pc-agent");
        assert_eq!(v["status"], "online");
    }
    let agents = get(addr, "/gateway/agents").await.json();
    assert_eq!(
        agents["agents"][0]["agent_uri"],
        "agent://internal/pc-agent"
    );
    assert_eq!(agents["agents"][0]["capabilities"], json!(["file_read"]));
    // Heartbeats keep it online past the timeout...
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        send(&mut s, json!({"type": "heartbeat"})).await;
        assert_eq!(frame(&mut s).await["type"], "heartbeat_ack");
    }
    assert_eq!(
        get(addr, "/gateway/status/agent://internal/pc-agent")
            .await
            .json()["status"],
        "online"
    );
    // ...and when they stop the gateway closes the connection and the agent is offline.
    let closed = within(Duration::from_secs(5), async {
        loop {
            match s.next().await {
                Some(Ok(Ws::Close(c))) => return c,
                Some(Ok(_)) => continue,
                _ => return None,
            }
        }
    })
    .await;
    assert_eq!(closed.map(|c| u16::from(c.code)), Some(4008));
    let r = poll(addr, "/gateway/status/agent://internal/pc-agent", |r| {
        r.json()["status"] == "offline"
    })
    .await;
    assert!(r.json()["last_seen"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));
    assert_eq!(
        get(addr, "/gateway/agents").await.json()["agents"],
        json!([])
    );
    // Away, it cannot send; back under the same URI, it is the same MAP agent, online again.
    let away = post(
        addr,
        "/gateway/send",
        br#"{"from":"agent://internal/pc-agent","to":"agent://internal/pc-agent","content":"x"}"#,
        None,
    )
    .await;
    assert_error(&away, 409, "agent_offline");
    let mut again = ws(addr).await;
    send(
        &mut again,
        json!({"type": "register", "agent_uri": "agent://internal/pc-agent"}),
    )
    .await;
    let reg = frame(&mut again).await;
    assert_eq!(reg["type"], "registered", "{reg}");
    assert_eq!(reg["agent_id"], "agent://internal/pc-agent");
    assert_eq!(
        get(addr, "/gateway/status/agent://internal/pc-agent")
            .await
            .json()["status"],
        "online"
    );
}

#[tokio::test]
async fn im_and_map_agents_message_each_other() {
    let (_server, addr, url) = server(|_| {}).await;
    let (_oc, mut events) = observer(&url).await;
    let (map_client, agent) = map_agent(&url, "analyst").await;
    let mut inbox = agent.messages();
    let mut s = ws(addr).await;
    send(
        &mut s,
        json!({"type": "register", "agent_uri": "agent://internal/pc-agent", "capabilities": []}),
    )
    .await;
    assert_eq!(frame(&mut s).await["type"], "registered");

    // HTTP send → pushed frame.
    let r = post(
        addr,
        "/gateway/send",
        r#"{"to":"agent://internal/pc-agent","content":"帮我分析代码"}"#.as_bytes(),
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let conv = r.json()["conversation_id"].as_str().unwrap().to_owned();
    let pushed = frame(&mut s).await;
    assert_eq!(pushed["type"], "message");
    assert_eq!(pushed["content"], "帮我分析代码");
    assert_eq!(pushed["conversation_id"], conv.as_str());

    // IM agent → MAP agent (a frame on its own socket) in a new conversation.
    send(
        &mut s,
        json!({"type": "send", "to": agent.id().as_str(), "content": {"ask": 1}}),
    )
    .await;
    let sent = frame(&mut s).await;
    assert_eq!(sent["type"], "sent", "{sent}");
    let m = within(Duration::from_secs(5), inbox.next()).await.unwrap();
    assert_eq!(m.from, "agent://internal/pc-agent");
    let im_conv = m.meta.as_ref().unwrap().to_value()["mail"]["conversationId"].clone();
    assert_eq!(im_conv, sent["conversation_id"]);

    // MAP agent → IM agent: its reply in that conversation is pushed.
    with_timeout(map_client.send_with(SendParams {
        to: json!({"agent": "agent://internal/pc-agent"}).into(),
        payload: Some(json!({"answer": 42}).into()),
        meta: Some(json!({"mail": {"conversationId": im_conv}}).into()),
    }))
    .await
    .unwrap();
    let pushed = frame(&mut s).await;
    assert_eq!(pushed["type"], "message");
    assert_eq!(pushed["content"], json!({"answer": 42}));
    assert_eq!(pushed["from"], format!("agent://{addr}/{}", agent.id()));
    assert_eq!(pushed["conversation_id"], im_conv);

    let seen = events_until(&mut events, |s| {
        s.iter().filter(|e| e.kind() == "mail.turn.added").count() >= 3
    })
    .await;
    assert!(
        seen.iter()
            .filter(|e| e.kind() == "message_delivered")
            .count()
            >= 2
    );

    // The read models caught up: three messages for the IM agent, and the conversation's
    // collaborators.
    let c = poll(
        addr,
        "/api/contacts/agent%3A%2F%2Finternal%2Fpc-agent",
        |r| r.status == 200 && r.json()["stats"]["total_messages"] == 3,
    )
    .await
    .json();
    assert_eq!(c["stats"]["total_conversations"], 2);
    let convs = get(
        addr,
        "/api/contacts/agent://internal/pc-agent/conversations",
    )
    .await
    .json();
    assert_eq!(convs["conversations"].as_array().unwrap().len(), 2);
    let collab = get(
        addr,
        &format!("/api/traces/{}/collaborators", im_conv.as_str().unwrap()),
    )
    .await
    .json();
    let uris: Vec<&str> = collab["collaborators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["agent_uri"].as_str().unwrap())
        .collect();
    assert!(uris.contains(&"agent://internal/pc-agent"), "{collab}");
    let all = get(addr, "/api/contacts").await.json();
    assert!(all["contacts"].as_array().unwrap().len() >= 2);
}

#[tokio::test]
async fn im_oversize_frames_close_the_connection_and_the_agent_goes_offline() {
    let (_server, addr, _url) = server(|c| c.gateways.im.max_frame_bytes = 1024).await;
    let mut s = ws(addr).await;
    send(
        &mut s,
        json!({"type": "register", "agent_uri": "agent://internal/big"}),
    )
    .await;
    assert_eq!(frame(&mut s).await["type"], "registered");
    let huge = json!({"type": "send", "to": "x", "content": "y".repeat(4096)});
    let _ = with_timeout(s.send(Ws::Text(huge.to_string().into()))).await;
    let ended = within(Duration::from_secs(5), async {
        loop {
            match s.next().await {
                Some(Ok(Ws::Close(_))) | None | Some(Err(_)) => return true,
                Some(Ok(_)) => continue,
            }
        }
    })
    .await;
    assert!(ended);
    poll(addr, "/gateway/status/agent://internal/big", |r| {
        r.status == 200 && r.json()["status"] == "offline"
    })
    .await;
}

#[tokio::test]
async fn mamp_remote_agents_are_map_agents_and_a_dead_endpoint_breaks_nothing() {
    // Port 9 (discard) on loopback: nothing listens there in the test machine's namespace.
    let (_server, addr, url) = server(|c| {
        c.gateways.mamp.request_timeout_ms = 1000;
        c.gateways.mamp.remote = vec![map_router::gateway::config::RemoteMamp {
            uri: "agent://other.example/code-analyst".into(),
            endpoint: "http://127.0.0.1:9".into(),
            token: None,
            name: Some("Code Analyst".into()),
            principal: None,
        }];
    })
    .await;
    let (client, agent) = map_agent(&url, "analyst").await;
    let remote = within(Duration::from_secs(5), async {
        loop {
            if let Ok(a) = client.get_agent("agent://other.example/code-analyst").await {
                return a;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(remote.name.as_deref(), Some("Code Analyst"));
    let sent = with_timeout(client.send(
        json!({"agent": "agent://other.example/code-analyst"}),
        json!("hello"),
    ))
    .await
    .unwrap();
    assert_eq!(
        sent.delivered,
        vec!["agent://other.example/code-analyst".to_owned()]
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The gateway still serves, and the MAP agent can still be reached from outside.
    let ok = post(
        addr,
        "/mamp/v1/messages",
        &envelope(addr, agent.id().as_str(), None, json!("hi")),
        None,
    )
    .await;
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
}
