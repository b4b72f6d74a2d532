//! Issue 22 against the MAMP and IM gateways: with authentication on (and no trusted transport
//! configured), every request acts as its caller. Four principals, as in the security probe:
//! `ops` (a system principal), `alice` and `bob` (ordinary), `viewer` (without
//! `messaging.canSend`, `lifecycle.canRegister`, `tasks.canCreate`, `mail.canCreate`); plus
//! `partner`, bound to the configured remote MAMP agent. Each finding is reproduced over real
//! HTTP and WebSocket connections on 127.0.0.1, and each test asserts what must not happen
//! (nothing reaches an impostor, nothing is created by a refused sender, nothing hidden is read)
//! as well as what must.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::http::{request, HttpResponse};
use common::{start_server, with_timeout, within};
use futures::{SinkExt, StreamExt};
use map_router::auth::config::Secret;
use map_router::client::{AgentHandle, Client, ClientOptions, Subscription};
use map_router::gateway::config::RemoteMamp;
use map_router::protocol::capabilities::ParticipantType;
use map_router::protocol::event::SubscriptionFilter;
use map_router::protocol::methods::agents::RegisterParams;
use map_router::protocol::methods::messaging::SendParams;
use map_router::server::{Config, Server};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message as Ws;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const OPS: &str = "key-ops-0123456789";
const ALICE: &str = "key-alice-0123456789";
const BOB: &str = "key-bob-0123456789";
const VIEWER: &str = "key-viewer-0123456789";
const PARTNER_KEY: &str = "key-partner-0123456789";
const KEYS: &str = "key-ops-0123456789 ops,key-alice-0123456789 alice,key-bob-0123456789 bob,\
                    key-viewer-0123456789 viewer,key-partner-0123456789 partner";
/// The configured remote MAMP agent (its endpoint is a dead port: outbound POSTs fail, which
/// breaks nothing).
const PARTNER: &str = "agent://other.example/partner";

const PERMISSIONS: &str = r#"
[exposure.agents]
hidden = ["internal-*"]
[principals.viewer.messaging]
canSend = false
[principals.viewer.lifecycle]
canRegister = false
[principals.viewer.tasks]
canCreate = false
[principals.viewer.mail]
canCreate = false
"#;

/// A router with authentication on: API keys, `ops` a system principal, `viewer` narrowed,
/// `internal-*` hidden, one remote MAMP agent bound to `partner`. No trusted transport.
async fn identity_server(tweak: impl FnOnce(&mut Config)) -> (Server, SocketAddr, String) {
    let (server, url) = start_server(|c| {
        c.auth.api_keys.inline = Some(Secret(KEYS.into()));
        c.auth.system_principals = vec!["ops".into()];
        c.permissions = toml::from_str(PERMISSIONS).unwrap();
        c.gateways.mamp.request_timeout_ms = 500;
        c.gateways.mamp.remote = vec![RemoteMamp {
            uri: PARTNER.into(),
            endpoint: "http://127.0.0.1:9".into(),
            token: None,
            name: Some("Partner".into()),
            principal: Some("partner".into()),
        }];
        tweak(c);
        assert!(
            !c.auth
                .trusted_transports
                .contains(&map_router::auth::TrustedTransport::InProcess),
            "the gateways must work without trusting the in-process transport"
        );
    })
    .await;
    let addr = server.local_addrs()[0];
    (server, addr, url)
}

// ---------------------------------------------------------------------------------------------
// HTTP

async fn get_as(addr: SocketAddr, path: &str, key: Option<&str>) -> HttpResponse {
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut headers = Vec::new();
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    request(addr, "GET", path, &headers, b"").await
}

async fn post_as(addr: SocketAddr, path: &str, body: &Value, key: Option<&str>) -> HttpResponse {
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    request(addr, "POST", path, &headers, body.to_string().as_bytes()).await
}

fn text(r: &HttpResponse) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// The seeds' error body with `status`; its message.
fn assert_error(r: &HttpResponse, status: u16, error: &str) -> String {
    assert_eq!(r.status, status, "{}", text(r));
    let v = r.json();
    assert_eq!(v["error"], error, "{v}");
    assert_eq!(v["status_code"], status, "{v}");
    v["message"].as_str().unwrap_or_default().to_owned()
}

fn mamp(from: &str, to: &str, content: &str) -> Value {
    json!({
        "protocol": "mamp/1.0",
        "message_id": format!("msg-{from}-{content}"),
        "from": from,
        "to": to,
        "content": content,
        "metadata": {"timestamp": "2026-03-04T10:00:00Z"},
    })
}

/// Our URI of local agent `id` (the host the gateway names: the first listen address).
fn ours(addr: SocketAddr, id: &str) -> String {
    format!("agent://{addr}/{id}")
}

fn encoded(uri: &str) -> String {
    uri.replace(':', "%3A").replace('/', "%2F")
}

/// Polls `GET path` as `key` until `pred` holds (bounded).
async fn poll_as(
    addr: SocketAddr,
    path: &str,
    key: &str,
    pred: impl Fn(&HttpResponse) -> bool,
) -> HttpResponse {
    within(Duration::from_secs(10), async {
        loop {
            let r = get_as(addr, path, Some(key)).await;
            if pred(&r) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// MAP

async fn map_agent(url: &str, key: &str, id: &str) -> (Client, AgentHandle) {
    let client = with_timeout(Client::connect_ws(
        url,
        ClientOptions::agent().name(id).api_key(key),
    ))
    .await
    .expect("MAP client");
    let agent = with_timeout(client.register(RegisterParams {
        agent_id: Some(id.into()),
        name: Some(id.into()),
        ..RegisterParams::default()
    }))
    .await
    .expect("register");
    (client, agent)
}

/// `ops` as a system participant, subscribed to conversations being created and messages
/// being sent.
async fn ops_observer(url: &str) -> (Client, Subscription) {
    let client = with_timeout(Client::connect_ws(
        url,
        ClientOptions::new()
            .participant_type(ParticipantType::System)
            .api_key(OPS),
    ))
    .await
    .expect("ops");
    let sub = with_timeout(client.subscribe(SubscriptionFilter {
        event_types: Some(vec!["mail.created".into(), "message_sent".into()]),
        ..SubscriptionFilter::default()
    }))
    .await
    .expect("subscribe");
    (client, sub)
}

async fn next_event(sub: &mut Subscription) -> (String, Value) {
    let e = within(Duration::from_secs(10), sub.next())
        .await
        .expect("subscription open");
    (e.kind().to_owned(), e.data())
}

// ---------------------------------------------------------------------------------------------
// IM WebSockets

async fn ws_as(addr: SocketAddr, key: &str) -> Socket {
    let (s, _) = with_timeout(tokio_tungstenite::connect_async(format!(
        "ws://{addr}/gateway/connect?token={key}"
    )))
    .await
    .expect("IM upgrade");
    s
}

async fn send_frame(s: &mut Socket, v: Value) {
    with_timeout(s.send(Ws::Text(v.to_string().into())))
        .await
        .unwrap();
}

/// The next text frame (heartbeat acks skipped).
async fn frame(s: &mut Socket) -> Value {
    loop {
        match with_timeout(s.next()).await {
            Some(Ok(Ws::Text(t))) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                if v["type"] != "heartbeat_ack" {
                    return v;
                }
            }
            Some(Ok(Ws::Ping(_) | Ws::Pong(_))) => continue,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

/// The close code the server ends with.
async fn close_code(s: &mut Socket) -> Option<u16> {
    within(Duration::from_secs(5), async {
        loop {
            match s.next().await {
                Some(Ok(Ws::Close(c))) => return c.map(|c| u16::from(c.code)),
                Some(Ok(_)) => continue,
                _ => return None,
            }
        }
    })
    .await
}

/// An IM agent registered by `key` under `uri`.
async fn registered(addr: SocketAddr, key: &str, uri: &str) -> Socket {
    let mut s = ws_as(addr, key).await;
    send_frame(
        &mut s,
        json!({"type": "register", "agent_uri": uri, "capabilities": []}),
    )
    .await;
    let f = frame(&mut s).await;
    assert_eq!(f["type"], "registered", "{uri}: {f}");
    s
}

/// A registration refused: its error frame and close code.
async fn refused(addr: SocketAddr, key: &str, uri: &str) -> (Value, Option<u16>) {
    let mut s = ws_as(addr, key).await;
    send_frame(
        &mut s,
        json!({"type": "register", "agent_uri": uri, "capabilities": []}),
    )
    .await;
    let f = frame(&mut s).await;
    assert_eq!(f["type"], "error", "{uri} was not refused: {f}");
    let code = close_code(&mut s).await;
    (f, code)
}

/// No `message` frame arrives on `s` for a while (heartbeats answered meanwhile).
async fn assert_no_message(s: &mut Socket) {
    let quiet = tokio::time::timeout(Duration::from_millis(500), async {
        loop {
            match s.next().await {
                Some(Ok(Ws::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap();
                    assert_ne!(v["type"], "message", "a message reached this socket: {v}");
                }
                Some(Ok(_)) => continue,
                _ => return,
            }
        }
    })
    .await;
    assert!(quiet.is_err(), "the socket ended");
}

async fn inbox_next(
    inbox: &mut map_router::client::Messages,
) -> map_router::protocol::message::Message {
    within(Duration::from_secs(10), inbox.next())
        .await
        .expect("inbox open")
}

/// Waits until the configured partner's MAP agent exists (it is opened at start-up).
async fn partner_agent(ops: &Client) -> map_router::protocol::agent::Agent {
    within(Duration::from_secs(10), async {
        loop {
            if let Ok(a) = ops.get_agent(PARTNER).await {
                return a;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// C1: IM URI takeover

#[tokio::test]
async fn c1_im_registration_takes_no_uri_that_is_not_the_callers() {
    let (_server, addr, url) = identity_server(|_| {}).await;
    let (ops, _events) = ops_observer(&url).await;
    let partner_before = partner_agent(&ops).await;
    let (alice_map, echo) = map_agent(&url, ALICE, "alice-echo").await;
    let mut echo_inbox = echo.messages();
    let mut bob_pc = registered(addr, BOB, "agent://bob.example/pc").await;

    // A MAP agent's URI, in both spellings of our host: refused, with a forbidden frame and 4003.
    for uri in [
        ours(addr, "alice-echo"),
        format!("agent://{}/alice-echo", addr.ip()),
    ] {
        let (f, code) = refused(addr, BOB, &uri).await;
        assert_eq!(f["error"], "forbidden", "{f}");
        assert_eq!(code, Some(4003));
    }
    // The configured remote agent's URI: refused; the gateway keeps its own session.
    let (f, code) = refused(addr, BOB, PARTNER).await;
    assert_eq!(f["error"], "forbidden", "{f}");
    assert_eq!(code, Some(4003));
    // viewer lacks lifecycle.canRegister: the router's refusal, as forbidden.
    let (f, code) = refused(addr, VIEWER, "agent://viewer.example/x").await;
    assert_eq!(f["error"], "forbidden", "{f}");
    assert!(
        f["message"].as_str().unwrap().contains("canRegister"),
        "{f}"
    );
    assert_eq!(code, Some(4003));

    // Another principal's IM URI once its socket closed: not bob's to take.
    let alice_pc_uri = "agent://alice.example/pc";
    let mut alice_pc = registered(addr, ALICE, alice_pc_uri).await;
    with_timeout(alice_pc.close(None)).await.unwrap();
    poll_as(
        addr,
        &format!("/gateway/status/{}", encoded(alice_pc_uri)),
        ALICE,
        |r| r.status == 200 && r.json()["status"] == "offline",
    )
    .await;
    let (f, code) = refused(addr, BOB, alice_pc_uri).await;
    assert_eq!(f["error"], "forbidden", "{f}");
    assert_eq!(code, Some(4003));

    // Traffic for alice-echo reaches alice-echo, by MAMP and by IM, however our host is spelled;
    // none of it reaches bob's socket.
    let r = post_as(
        addr,
        "/mamp/v1/messages",
        &mamp(
            "agent://bob@remote.example/x",
            &ours(addr, "alice-echo"),
            "via mamp",
        ),
        Some(BOB),
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let m = inbox_next(&mut echo_inbox).await;
    assert_eq!(m.from, "agent://bob@remote.example/x");
    send_frame(
        &mut bob_pc,
        json!({"type": "send", "to": format!("agent://{}/alice-echo", addr.ip()), "content": "via im"}),
    )
    .await;
    assert_eq!(frame(&mut bob_pc).await["type"], "sent");
    let m = inbox_next(&mut echo_inbox).await;
    assert_eq!(m.from, "agent://bob.example/pc");
    assert_eq!(m.payload.as_ref().unwrap().get(), "\"via im\"");
    assert_no_message(&mut bob_pc).await;

    // alice takes her own URI back: the same MAP agent.
    let again = registered(addr, ALICE, alice_pc_uri).await;
    drop(again);

    // The partner's session was never dropped: same agent, same owner, still reachable.
    let partner_after = ops.get_agent(PARTNER).await.unwrap();
    assert_eq!(partner_after.owner_id, partner_before.owner_id);
    assert_eq!(partner_after.state, partner_before.state);
    let sent = with_timeout(alice_map.send(json!({"agent": PARTNER}), json!("hello")))
        .await
        .unwrap();
    assert_eq!(sent.delivered, vec![PARTNER.to_owned()]);
}

// ---------------------------------------------------------------------------------------------
// H1: spoofed senders

#[tokio::test]
async fn h1_senders_are_proven_not_claimed() {
    let (_server, addr, url) = identity_server(|_| {}).await;
    let (ops, mut events) = ops_observer(&url).await;
    partner_agent(&ops).await;
    let (alice_map, echo) = map_agent(&url, ALICE, "alice-echo").await;
    let mut echo_inbox = echo.messages();
    let alice_pc_uri = "agent://alice.example/pc";
    let mut alice_pc = registered(addr, ALICE, alice_pc_uri).await;
    let echo_uri = ours(addr, "alice-echo");

    // bob as alice's live IM agent.
    let r = post_as(
        addr,
        "/gateway/send",
        &json!({"from": alice_pc_uri, "to": "alice-echo", "content": "spoof"}),
        Some(BOB),
    )
    .await;
    assert_error(&r, 403, "forbidden");
    // viewer: no canSend, with or without a from.
    let m = assert_error(
        &post_as(
            addr,
            "/gateway/send",
            &json!({"to": "alice-echo", "content": "spoof"}),
            Some(VIEWER),
        )
        .await,
        403,
        "forbidden",
    );
    assert!(m.contains("messaging.canSend"), "{m}");
    assert_error(
        &post_as(
            addr,
            "/gateway/send",
            &json!({"from": alice_pc_uri, "to": "alice-echo", "content": "spoof"}),
            Some(VIEWER),
        )
        .await,
        403,
        "forbidden",
    );
    // MAMP: viewer as alice-echo, as the partner, as the A2A gateway, as itself; bob as the
    // partner. All 403, not 502.
    for (key, from) in [
        (VIEWER, echo_uri.clone()),
        (VIEWER, format!("agent://{}/alice-echo", addr.ip())),
        (VIEWER, PARTNER.to_owned()),
        (VIEWER, ours(addr, "a2a-gateway")),
        (VIEWER, "agent://viewer@remote.example/me".to_owned()),
        (BOB, PARTNER.to_owned()),
        (BOB, "agent://alice@remote.example/x".to_owned()),
    ] {
        let r = post_as(
            addr,
            "/mamp/v1/messages",
            &mamp(&from, &echo_uri, "spoof"),
            Some(key),
        )
        .await;
        assert_error(&r, 403, "forbidden");
    }

    // Nothing of that created a conversation or sent a message: the first the observer sees
    // are alice's markers, and the first message alice-echo receives is hers.
    let created = with_timeout(alice_map.call_raw("mail/create", json!({"subject": "marker"})))
        .await
        .unwrap();
    let (kind, data) = next_event(&mut events).await;
    assert_eq!(kind, "mail.created");
    assert_eq!(
        data["conversationId"], created["conversation"]["id"],
        "{data}"
    );
    send_frame(
        &mut alice_pc,
        json!({"type": "send", "to": "alice-echo", "content": "marker"}),
    )
    .await;
    assert_eq!(frame(&mut alice_pc).await["type"], "sent");
    let m = inbox_next(&mut echo_inbox).await;
    assert_eq!(m.from, alice_pc_uri);
    assert_eq!(m.payload.as_ref().unwrap().get(), "\"marker\"");
    loop {
        let (kind, data) = next_event(&mut events).await;
        if kind == "message_sent" {
            assert_eq!(data["from"], alice_pc_uri, "{data}");
            break;
        }
    }

    // What is allowed: the partner as itself, bob from his namespace and as himself, alice
    // from her live IM agent.
    let r = post_as(
        addr,
        "/mamp/v1/messages",
        &mamp(PARTNER, &echo_uri, "from the partner"),
        Some(PARTNER_KEY),
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(inbox_next(&mut echo_inbox).await.from, PARTNER);
    let r = post_as(
        addr,
        "/mamp/v1/messages",
        &mamp(
            "agent://bob@remote.example/x",
            &echo_uri,
            "from bob's agent",
        ),
        Some(BOB),
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(
        inbox_next(&mut echo_inbox).await.from,
        "agent://bob@remote.example/x"
    );
    let r = post_as(
        addr,
        "/gateway/send",
        &json!({"to": "alice-echo", "content": "from bob"}),
        Some(BOB),
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    // From bob's own session: not alice's agent, nor any name bob could have claimed.
    let from_bob = inbox_next(&mut echo_inbox).await.from;
    assert!(
        ![alice_pc_uri, "alice-echo", PARTNER].contains(&from_bob.as_str()),
        "{from_bob}"
    );
    let r = post_as(
        addr,
        "/gateway/send",
        &json!({"from": alice_pc_uri, "to": "alice-echo", "content": "from alice's pc"}),
        Some(ALICE),
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(inbox_next(&mut echo_inbox).await.from, alice_pc_uri);

    // Once alice's IM agent is offline: 409 to alice, still 403 to bob.
    with_timeout(alice_pc.close(None)).await.unwrap();
    let away = json!({"from": alice_pc_uri, "to": "alice-echo", "content": "x"});
    let r = within(Duration::from_secs(5), async {
        loop {
            let r = post_as(addr, "/gateway/send", &away, Some(ALICE)).await;
            if r.status != 200 {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_error(&r, 409, "agent_offline");
    assert_error(
        &post_as(addr, "/gateway/send", &away, Some(BOB)).await,
        403,
        "forbidden",
    );
}

// ---------------------------------------------------------------------------------------------
// H4: reads with the caller's visibility

#[tokio::test]
async fn h4_reads_answer_with_the_callers_own_visibility() {
    let (_server, addr, url) = identity_server(|_| {}).await;
    let (alice_map, _echo) = map_agent(&url, ALICE, "alice-echo").await;
    let other = with_timeout(alice_map.register(RegisterParams {
        agent_id: Some("alice-other".into()),
        name: Some("alice-other".into()),
        ..RegisterParams::default()
    }))
    .await
    .unwrap();
    let _other_inbox = other.messages();
    // A hidden agent of ops's, which talks to alice-echo.
    let (billing, _b) = map_agent(&url, OPS, "internal-billing").await;
    with_timeout(billing.send(json!({"agent": "alice-echo"}), json!("invoice 42")))
        .await
        .unwrap();
    // alice's private conversation between her two agents.
    let created = with_timeout(alice_map.call_raw(
        "mail/create",
        json!({"subject": "secret plan", "initialParticipants": [{"id": "alice-other"}]}),
    ))
    .await
    .unwrap();
    let conv = created["conversation"]["id"].as_str().unwrap().to_owned();
    with_timeout(alice_map.send_with(SendParams {
        to: json!({"agent": "alice-other"}).into(),
        payload: Some(json!("the password is swordfish").into()),
        meta: Some(json!({"mail": {"conversationId": conv}}).into()),
    }))
    .await
    .unwrap();

    let echo = encoded(&ours(addr, "alice-echo"));
    let billing_uri = ours(addr, "internal-billing");
    // The read model has it all (ops sees everything)...
    poll_as(
        addr,
        &format!("/api/contacts/{echo}/conversations"),
        OPS,
        |r| r.status == 200 && text(r).contains("swordfish"),
    )
    .await;
    let all = poll_as(addr, "/api/contacts", OPS, |r| {
        text(r).contains("internal-billing")
    })
    .await;
    assert!(text(&all).contains("alice-echo"));
    assert_eq!(
        get_as(addr, "/mamp/v1/agents/internal-billing/card", Some(OPS))
            .await
            .status,
        200
    );
    assert_eq!(
        get_as(
            addr,
            &format!("/api/traces/{conv}/collaborators"),
            Some(OPS)
        )
        .await
        .status,
        200
    );
    // ...and alice reads her own conversation.
    let mine = get_as(
        addr,
        &format!("/api/contacts/{echo}/conversations"),
        Some(ALICE),
    )
    .await;
    assert!(text(&mine).contains("secret plan"), "{}", text(&mine));
    assert!(text(&mine).contains("swordfish"));
    let collab = get_as(
        addr,
        &format!("/api/traces/{conv}/collaborators"),
        Some(ALICE),
    )
    .await;
    assert_eq!(collab.status, 200, "{}", text(&collab));
    assert!(!text(&get_as(addr, "/api/contacts", Some(ALICE)).await).contains("internal-billing"));

    // bob sees alice-echo (public) but never the hidden agent, nor the conversation's subject
    // or last message.
    for path in [
        "/api/contacts".to_owned(),
        format!("/api/contacts/{echo}"),
        format!("/api/contacts/{echo}/conversations"),
        "/gateway/agents".to_owned(),
    ] {
        let r = get_as(addr, &path, Some(BOB)).await;
        assert_eq!(r.status, 200, "{path}: {}", text(&r));
        let body = text(&r);
        for secret in ["internal-billing", "swordfish", "secret plan", "invoice"] {
            assert!(
                !body.contains(secret),
                "{path} shows {secret} to bob: {body}"
            );
        }
    }
    assert!(text(&get_as(addr, "/api/contacts", Some(BOB)).await).contains("alice-echo"));
    assert_eq!(
        get_as(
            addr,
            &format!("/api/contacts/{echo}/conversations"),
            Some(BOB)
        )
        .await
        .json()["conversations"],
        json!([])
    );
    for path in [
        format!("/api/traces/{conv}/collaborators"),
        format!("/api/contacts/{}", encoded(&billing_uri)),
        format!("/api/contacts/{}/conversations", encoded(&billing_uri)),
        format!("/gateway/status/{billing_uri}"),
        "/mamp/v1/agents/internal-billing/card".to_owned(),
    ] {
        let r = get_as(addr, &path, Some(BOB)).await;
        assert_eq!(r.status, 404, "{path}: {}", text(&r));
    }
    // Nor can bob reach it by MAMP.
    assert_error(
        &post_as(
            addr,
            "/mamp/v1/messages",
            &mamp("agent://bob@remote.example/x", &billing_uri, "hi"),
            Some(BOB),
        )
        .await,
        404,
        "agent_not_found",
    );
    // viewer may read (it keeps observation.*) what bob may.
    let r = get_as(addr, "/api/contacts", Some(VIEWER)).await;
    assert_eq!(r.status, 200);
    assert!(!text(&r).contains("internal-billing"));
}

// ---------------------------------------------------------------------------------------------
// H6: the gateways' sessions are nobody's shared quota

#[tokio::test]
async fn h6_a_hundred_outside_senders_disable_nothing_for_anyone_else() {
    let (_server, addr, url) = identity_server(|_| {}).await;
    let (ops, _events) = ops_observer(&url).await;
    let (_alice_map, echo) = map_agent(&url, ALICE, "alice-echo").await;
    let mut echo_inbox = echo.messages();
    let echo_uri = ours(addr, "alice-echo");
    let peers = || async {
        ops.list_agents(Default::default())
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.role.as_deref() == Some("mamp-peer"))
            .count()
    };
    let before = peers().await;

    // The old attack: spoofed senders, each refused, none opening a session.
    for i in 0..60 {
        let r = post_as(
            addr,
            "/mamp/v1/messages",
            &mamp(&format!("agent://remote.example/v{i}"), &echo_uri, "x"),
            Some(VIEWER),
        )
        .await;
        assert_error(&r, 403, "forbidden");
    }
    assert_eq!(peers().await, before, "a refused sender opened a session");

    // bob posts as 100 distinct senders of his namespace; a MAP client is answered throughout.
    let started = Instant::now();
    let mut slowest_map_call = Duration::ZERO;
    for i in 0..100 {
        let r = post_as(
            addr,
            "/mamp/v1/messages",
            &mamp(&format!("agent://bob@remote.example/s{i}"), &echo_uri, "x"),
            Some(BOB),
        )
        .await;
        assert_eq!(r.status, 200, "post {i}: {}", text(&r));
        if i % 10 == 9 {
            let t = Instant::now();
            with_timeout(ops.list_agents(Default::default()))
                .await
                .expect("the MAP client is answered");
            slowest_map_call = slowest_map_call.max(t.elapsed());
        }
    }
    let elapsed = started.elapsed();
    eprintln!(
        "100 MAMP posts from distinct senders: {elapsed:?} ({:?} each); slowest MAP call \
         meanwhile {slowest_map_call:?}",
        elapsed / 100
    );
    for _ in 0..100 {
        inbox_next(&mut echo_inbox).await;
    }
    // Recycled senders are disconnected in the background: wait for them to go.
    let bound = before + map_router::gateway::peer_table::MAX_PEERS_PER_OWNER;
    within(Duration::from_secs(10), async {
        while peers().await > bound {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    eprintln!(
        "sender sessions held after 100 senders: {}",
        peers().await - before
    );

    // alice: IM registration, a send from her IM agent and one as herself all work.
    let mut pc = registered(addr, ALICE, "agent://alice.example/pc").await;
    let r = post_as(
        addr,
        "/gateway/send",
        &json!({"from": "agent://alice.example/pc", "to": "alice-echo", "content": "still here"}),
        Some(ALICE),
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(
        inbox_next(&mut echo_inbox).await.from,
        "agent://alice.example/pc"
    );
    let r = post_as(
        addr,
        "/gateway/send",
        &json!({"to": "agent://alice.example/pc", "content": "to the pc"}),
        Some(ALICE),
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(frame(&mut pc).await["content"], "to the pc");
    // And bob, whose own senders were recycled, still registers an IM agent.
    registered(addr, BOB, "agent://bob.example/pc").await;
}

#[tokio::test]
async fn quota_refusals_name_the_quota_and_stay_with_their_principal() {
    // Three, so that the service principal's own sessions (the read model, the public view,
    // the configured remote agent) fit under it too, where they are counted.
    let (_server, addr, _url) = identity_server(|c| c.limits.max_sessions_per_principal = 3).await;
    let _one = registered(addr, ALICE, "agent://alice.example/one").await;
    let mut two = registered(addr, ALICE, "agent://alice.example/two").await;
    let _three = registered(addr, ALICE, "agent://alice.example/three").await;
    let (f, code) = refused(addr, ALICE, "agent://alice.example/four").await;
    assert_eq!(f["error"], "quota_exceeded", "{f}");
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .contains("sessions per principal (limit 3)"),
        "{f}"
    );
    assert_eq!(code, Some(4029));
    let m = assert_error(
        &post_as(
            addr,
            "/gateway/send",
            &json!({"to": "agent://alice.example/one", "content": "x"}),
            Some(ALICE),
        )
        .await,
        429,
        "quota_exceeded",
    );
    assert!(m.contains("sessions per principal (limit 3)"), "{m}");
    // bob is not affected.
    let r = post_as(
        addr,
        "/gateway/send",
        &json!({"to": "agent://alice.example/two", "content": "from bob"}),
        Some(BOB),
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(frame(&mut two).await["content"], "from bob");
}

// ---------------------------------------------------------------------------------------------
// Authentication first, no trusted transport needed

/// A request head alone (its body never sent), and the status line of the answer.
async fn head_only(addr: SocketAddr, head: &str) -> String {
    with_timeout(async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 512];
        let n = s.read(&mut buf).await.unwrap();
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    })
    .await
}

#[tokio::test]
async fn unauthenticated_callers_get_401_before_anything_else() {
    let (_server, addr, _url) = identity_server(|_| {}).await;
    // Before the size check, the body read, the JSON and the URI checks.
    let line = head_only(
        addr,
        &format!(
            "POST /mamp/v1/messages HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: 50000000\r\n\r\n"
        ),
    )
    .await;
    assert!(line.contains(" 401 "), "{line}");
    let line = head_only(
        addr,
        &format!("POST /gateway/send HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 90000000\r\n\r\n"),
    )
    .await;
    assert!(line.contains(" 401 "), "{line}");
    for path in [
        "/gateway/status/not-a-uri",
        "/gateway/agents",
        "/api/contacts",
        "/api/contacts/agent%3A%2F%2Fx%2Fy",
        "/api/traces/conv-x/collaborators",
        "/mamp/v1/agents/nobody/card",
    ] {
        assert_error(&get_as(addr, path, None).await, 401, "unauthorized");
        assert_error(
            &get_as(addr, path, Some("not-a-key-0123456789")).await,
            401,
            "unauthorized",
        );
    }
    assert_error(
        &post_as(addr, "/gateway/send", &json!("nonsense"), None).await,
        401,
        "unauthorized",
    );
    // The IM upgrade: refused before it happens.
    let refused = with_timeout(tokio_tungstenite::connect_async(format!(
        "ws://{addr}/gateway/connect"
    )))
    .await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
        other => panic!("expected a 401 to the upgrade, got {other:?}"),
    }
    // The router card says how to authenticate, to anybody.
    let card = get_as(addr, "/mamp/v1/card", None).await;
    assert_eq!(card.status, 200);
    assert_eq!(card.json()["access"]["require_auth"], true);
    // A credential in the header works for the upgrade as `?token=` does.
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://{addr}/gateway/connect")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("Authorization", format!("Bearer {ALICE}").parse().unwrap());
    let (mut s, _) = with_timeout(tokio_tungstenite::connect_async(req))
        .await
        .unwrap();
    send_frame(
        &mut s,
        json!({"type": "register", "agent_uri": "agent://alice.example/hdr"}),
    )
    .await;
    assert_eq!(frame(&mut s).await["type"], "registered");
}

#[tokio::test]
async fn outside_senders_sessions_close_when_idle() {
    let (_server, addr, url) = identity_server(|c| c.gateways.session_idle_ms = 300).await;
    let (ops, _events) = ops_observer(&url).await;
    let (_alice_map, echo) = map_agent(&url, ALICE, "alice-echo").await;
    let mut inbox = echo.messages();
    let from = "agent://bob@remote.example/idle";
    let body = mamp(from, &ours(addr, "alice-echo"), "x");
    let post = || post_as(addr, "/mamp/v1/messages", &body, Some(BOB));
    assert_eq!(post().await.status, 200);
    inbox_next(&mut inbox).await;
    let peer = ops
        .get_agent(from)
        .await
        .expect("bob's sender has a MAP agent");
    assert_eq!(peer.role.as_deref(), Some("mamp-peer"));
    within(Duration::from_secs(5), async {
        while ops.get_agent(from).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // The next message opens it again.
    let r = post().await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(inbox_next(&mut inbox).await.from, from);
}

#[tokio::test]
async fn an_im_connection_ends_when_its_credential_expires() {
    const SECRET: &str = "a-shared-hs256-secret-of-32-bytes-or-more";
    let (_server, addr, _url) = identity_server(|c| {
        c.auth.jwt.secret = Some(Secret(SECRET.into()));
        c.auth.jwt.issuer = map_router::auth::config::OneOrMany::One("https://issuer.test".into());
        c.auth.jwt.audience = map_router::auth::config::OneOrMany::One("map-router-test".into());
        c.auth.jwt.leeway_secs = 0;
        c.gateways.im.heartbeat_timeout_ms = 60_000;
    })
    .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({"sub": "alice", "iss": "https://issuer.test", "aud": "map-router-test",
                "iat": now, "exp": now + 2}),
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap();
    let uri = "agent://alice.example/jwt";
    let mut s = registered(addr, &token, uri).await;
    // Still served before the expiry...
    send_frame(&mut s, json!({"type": "heartbeat"})).await;
    assert_eq!(
        within(Duration::from_secs(2), async {
            loop {
                if let Some(Ok(Ws::Text(t))) = s.next().await {
                    return serde_json::from_str::<Value>(t.as_str()).unwrap();
                }
            }
        })
        .await["type"],
        "heartbeat_ack"
    );
    // ...then closed with the router's own code, and the agent is offline.
    let code = within(Duration::from_secs(6), async {
        loop {
            match s.next().await {
                Some(Ok(Ws::Close(c))) => return c.map(|c| u16::from(c.code)),
                Some(Ok(_)) => continue,
                _ => return None,
            }
        }
    })
    .await;
    assert_eq!(code, Some(4001));
    poll_as(
        addr,
        &format!("/gateway/status/{}", encoded(uri)),
        ALICE,
        |r| r.status == 200 && r.json()["status"] == "offline",
    )
    .await;
}
