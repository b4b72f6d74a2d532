//! The AIP gateway against hostile principals (issue 44, items 8 to 11). One router with
//! `[auth]` on and four principals: `ops` (system), `alice` and `bob` (ordinary), `viewer`
//! (no grants to register or send). AIP nodes are tonic servers on loopback; MAP agents are the
//! Rust client over WebSocket. Each test says what must happen and asserts what must not:
//! - a third agent (bob's, and even a system one) cannot answer or end a session another node
//!   started: it is refused with 1003 and nothing reaches the AIP caller's stream (item 8);
//! - sessions MAP agents open with AIP agents and calls they make to AIP tools count against
//!   `[aip] max_sessions` (RESOURCE_EXHAUSTED past it, and the node never sees the extra one),
//!   and a session remembers a bounded number of unanswered correlation ids (item 9);
//! - `GetNodes` lists the router's facts (the agent's own id, the registered address), never an
//!   agent's claim about another id or address (item 10);
//! - a subscriber id belongs to its principal: bob taking `alice-node` first does not keep
//!   alice out, and neither can end the other's subscription (item 11).

mod common;

use std::pin::Pin;
use std::time::Duration;

use base64::Engine as _;
use futures::{Stream, StreamExt};
use map_router::auth::config::Secret;
use map_router::client::{Client, ClientError, ClientOptions, Messages};
use map_router::gateway::aip::proto::agent_message::SessionStatus;
use map_router::gateway::aip::proto::agent_service_server::{AgentService, AgentServiceServer};
use map_router::gateway::aip::proto::gateway_service_client::GatewayServiceClient;
use map_router::gateway::aip::proto::node_update::UpdateType;
use map_router::gateway::aip::proto::peer::InfoType;
use map_router::gateway::aip::proto::tool_service_server::{ToolService, ToolServiceServer};
use map_router::gateway::aip::proto::{
    content_item, AgentInfo, AgentMessage, ContentItem, GetNodesRequest, Peer, ToolInfo,
    ToolRequest, ToolResponse, UnsubscribeRequest, UpdateSubscriptionRequest,
};
use map_router::protocol::json::RawJson;
use map_router::protocol::message::Message;
use map_router::protocol::methods::agents::RegisterParams;
use map_router::protocol::methods::messaging::SendParams;
use prost::Message as _;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status, Streaming};

use common::{start_server, with_timeout};

const OPS: &str = "ak-ops-0123456789abcdef";
const ALICE: &str = "ak-alice-0123456789abcdef";
const BOB: &str = "ak-bob-0123456789abcdef";
const VIEWER: &str = "ak-viewer-0123456789abcdef";

/// A router with `[auth]` on, the four principals, and the AIP gateway with `max_sessions`.
async fn router(max_sessions: usize) -> (map_router::server::Server, String) {
    router_with(|aip| aip.max_sessions = max_sessions).await
}

/// A router with `[auth]` on, the four principals, and the AIP gateway as `tweak` sets it.
async fn router_with(
    tweak: impl FnOnce(&mut map_router::gateway::aip::AipSettings),
) -> (map_router::server::Server, String) {
    start_server(|c| {
        let mut t = map_router::server::Config::from_toml(
            r#"
[auth]
system_principals = ["ops"]
[permissions.principals."viewer".messaging]
canSend = false
[permissions.principals."viewer".lifecycle]
canRegister = false
"#,
        )
        .expect("config");
        t.listen = c.listen.clone();
        t.auth.api_keys.inline = Some(Secret(format!(
            "{OPS} ops,{ALICE} alice,{BOB} bob,{VIEWER} viewer"
        )));
        t.aip.listen = Some("127.0.0.1:0".parse().unwrap());
        t.aip.tool_timeout_ms = 5000;
        tweak(&mut t.aip);
        *c = t;
    })
    .await
}

/// `message` with metadata `authorization: Bearer <key>`.
fn as_<T>(key: &str, message: T) -> Request<T> {
    let mut r = Request::new(message);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    r
}

async fn gateway(server: &map_router::server::Server) -> GatewayServiceClient<Channel> {
    let addr = format!("http://{}", server.aip_addr().unwrap());
    with_timeout(GatewayServiceClient::connect(addr))
        .await
        .unwrap()
}

/// A MAP agent `id` of the principal whose API key is `key`, and its inbox.
async fn map_agent(
    url: &str,
    key: &str,
    id: &str,
    scopes: &[&str],
    metadata: Option<Value>,
) -> (Client, Messages) {
    let client = with_timeout(Client::connect_ws(url, ClientOptions::agent().api_key(key)))
        .await
        .unwrap();
    let agent = with_timeout(client.register(RegisterParams {
        agent_id: Some(id.into()),
        scopes: Some(scopes.iter().map(|s| (*s).into()).collect()),
        metadata: metadata.map(RawJson::from),
        ..Default::default()
    }))
    .await
    .unwrap();
    let inbox = agent.messages();
    // The handle stays alive with the client (the agent is the session's).
    std::mem::forget(agent);
    (client, inbox)
}

async fn next(inbox: &mut Messages) -> Message {
    with_timeout(inbox.next()).await.expect("inbox ended")
}

fn text(t: &str) -> ContentItem {
    ContentItem {
        data: Some(content_item::Data::Text(t.into())),
    }
}

fn texts(m: &AgentMessage) -> Vec<String> {
    m.content
        .iter()
        .filter_map(|c| match &c.data {
            Some(content_item::Data::Text(t)) => Some(t.clone()),
            _ => None,
        })
        .collect()
}

type Answers = Pin<Box<dyn Stream<Item = Result<AgentMessage, Status>> + Send>>;

/// An AIP agent that reports every `CallAgent` stream it is given (its first message) and
/// holds it open without answering until the caller ends it.
struct Holder(mpsc::UnboundedSender<AgentMessage>);

#[tonic::async_trait]
impl AgentService for Holder {
    type CallAgentStream = Answers;

    async fn call_agent(
        &self,
        r: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Answers>, Status> {
        let mut inbound = r.into_inner();
        let seen = self.0.clone();
        let (tx, rx) = mpsc::channel::<Result<AgentMessage, Status>>(8);
        tokio::spawn(async move {
            if let Ok(Some(m)) = inbound.message().await {
                let _ = seen.send(m);
            }
            while let Ok(Some(_)) = inbound.message().await {}
            drop(tx);
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// An AIP tool that reports each call and answers it only when told (one permit per answer).
struct Gate {
    seen: mpsc::UnboundedSender<String>,
    open: std::sync::Arc<tokio::sync::Semaphore>,
}

#[tonic::async_trait]
impl ToolService for Gate {
    async fn call_tool(&self, r: Request<ToolRequest>) -> Result<Response<ToolResponse>, Status> {
        let r = r.into_inner();
        let _ = self.seen.send(r.sender_id.clone());
        let _permit = self
            .open
            .acquire()
            .await
            .map_err(|_| Status::aborted("closed"))?;
        Ok(Response::new(ToolResponse {
            sender_id: r.receiver_id,
            receiver_id: r.sender_id,
            session_id: r.session_id,
            is_error: false,
            error_message: "No Error".into(),
            content: vec![text("done")],
        }))
    }
}

/// Serves `router` on a fresh loopback port: its address, and the task.
async fn serve(router: tonic::transport::server::Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        let _ = router
            .serve_with_incoming(TcpIncoming::from(listener))
            .await;
    });
    (addr, task)
}

async fn holder() -> (
    String,
    mpsc::UnboundedReceiver<AgentMessage>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (addr, task) =
        serve(tonic::transport::Server::builder().add_service(AgentServiceServer::new(Holder(tx))))
            .await;
    (addr, rx, task)
}

fn agent_info(id: &str, address: &str, domain: &str) -> AgentInfo {
    AgentInfo {
        agent_id: id.into(),
        address: address.into(),
        name: id.into(),
        domain: domain.into(),
        ..Default::default()
    }
}

fn quest(from: &str, to: &str, session: &str, status: SessionStatus, t: &str) -> AgentMessage {
    AgentMessage {
        sender_id: from.into(),
        receiver_id: to.into(),
        session_id: session.into(),
        session_status: status as i32,
        content: vec![text(t)],
        ..Default::default()
    }
}

/// Sends `payload` with `meta` from `client` to agent `to`.
async fn send(client: &Client, to: &str, payload: Value, meta: Value) -> Result<(), ClientError> {
    with_timeout(client.send_with(SendParams {
        to: RawJson::from(json!({ "agent": to })),
        payload: Some(RawJson::from(payload)),
        meta: Some(RawJson::from(meta)),
    }))
    .await
    .map(|_| ())
}

fn payload(m: &Message) -> Value {
    m.payload_value().unwrap_or(Value::Null)
}

fn meta(m: &Message) -> Value {
    m.meta.as_ref().map_or(Value::Null, RawJson::to_value)
}

#[tokio::test]
async fn only_the_receiver_answers_or_ends_a_session() {
    let (server, url) = router(16).await;
    let mut gw = gateway(&server).await;
    let (addr, _seen, _task) = holder().await;
    with_timeout(gw.register_agent(as_(ALICE, agent_info("alice-node", &addr, "trip"))))
        .await
        .unwrap();
    let (planner, mut planner_inbox) = map_agent(&url, ALICE, "planner", &[], None).await;
    let (mallory, mut mallory_inbox) = map_agent(&url, BOB, "mallory", &[], None).await;
    let (root, mut root_inbox) = map_agent(&url, OPS, "root", &[], None).await;
    let viewer = with_timeout(Client::connect_ws(
        &url,
        ClientOptions::agent().api_key(VIEWER),
    ))
    .await
    .unwrap();

    // alice's node opens a session with her MAP agent `planner`.
    let (to_gateway, outbound) = mpsc::channel(8);
    to_gateway
        .send(quest(
            "alice-node",
            "planner",
            "s1",
            SessionStatus::StartQuest,
            "plan",
        ))
        .await
        .unwrap();
    let mut answers = with_timeout(gw.route_agent_calling(as_(
        ALICE,
        tokio_stream::wrappers::ReceiverStream::new(outbound),
    )))
    .await
    .unwrap()
    .into_inner();
    let start = next(&mut planner_inbox).await;
    assert_eq!(start.from, "alice-node");
    let correlation = start
        .correlation_id()
        .expect("a quest carries a correlation id");

    // A third agent forges the answer every way the gateway reads one: a STOP_RESPONSE in
    // `meta.aip`, an error in `meta.aip`, and a MAP reply to the quest's correlation id.
    let forgeries = [
        json!({"isResult": true, "correlationId": correlation, "protocol": "aip",
               "aip": {"sessionId": "s1", "sessionStatus": "STOP_RESPONSE"}}),
        json!({"isResult": true, "correlationId": correlation, "protocol": "aip",
               "aip": {"sessionId": "s1", "error": {"code": 1, "message": "cancelled by mallory"}}}),
        json!({"isResult": true, "correlationId": correlation}),
    ];
    for (who, client, inbox) in [
        ("bob", &mallory, &mut mallory_inbox),
        ("ops (system)", &root, &mut root_inbox),
    ] {
        for forged in &forgeries {
            send(
                client,
                "alice-node",
                json!({"parts": [{"kind": "text", "text": "forged"}]}),
                forged.clone(),
            )
            .await
            .unwrap();
            // The forger is told, with MAP's permission error.
            let refusal = next(inbox).await;
            assert_eq!(refusal.from, "alice-node", "{who}");
            assert_eq!(
                payload(&refusal)["error"]["code"],
                1003,
                "{who}: {}",
                payload(&refusal)
            );
        }
    }
    // The agent without grants cannot even send.
    let e = send(&viewer, "alice-node", json!("forged"), forgeries[0].clone())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ClientError::Rpc { code, .. } if code.0 == 1003),
        "{e:?}"
    );

    // A flood of forgeries is refused too, but costs alice's node a bounded number of sends
    // (16 refusals a second): bob's hostility does not spend alice's budget.
    let flood = std::time::Instant::now();
    for _ in 0..100 {
        send(
            &mallory,
            "alice-node",
            json!("forged"),
            forgeries[0].clone(),
        )
        .await
        .unwrap();
    }

    // Nothing of that reached alice's caller: the first answer is planner's, and the session
    // lives on until planner ends it.
    with_timeout(planner.reply(&start, json!({"parts": [{"kind": "text", "text": "real"}]})))
        .await
        .unwrap();
    let first = with_timeout(answers.message()).await.unwrap().unwrap();
    let seconds = flood.elapsed().as_secs() + 1;
    let mut refused = 0;
    while let Ok(Some(m)) =
        tokio::time::timeout(Duration::from_millis(200), mallory_inbox.next()).await
    {
        assert_eq!(payload(&m)["error"]["code"], 1003, "{m:?}");
        refused += 1;
    }
    assert!(
        (1..=16 * (seconds + 1)).contains(&refused),
        "{refused} refusals for 100 forgeries in {seconds} s"
    );
    assert_eq!(texts(&first), ["real"], "{first:?}");
    assert_eq!(first.sender_id, "planner");
    assert_eq!(first.session_status, SessionStatus::HoldResponse as i32);
    to_gateway
        .send(quest(
            "alice-node",
            "planner",
            "s1",
            SessionStatus::StopQuest,
            "",
        ))
        .await
        .unwrap();
    let stop = next(&mut planner_inbox).await;
    with_timeout(planner.reply(&stop, json!("bye")))
        .await
        .unwrap();
    let last = with_timeout(answers.message()).await.unwrap().unwrap();
    assert_eq!(texts(&last), ["bye"]);
    assert_eq!(last.session_status, SessionStatus::StopResponse as i32);
    assert!(with_timeout(answers.message()).await.unwrap().is_none());
    // The forgers got nothing else (no answer of alice's session leaked to them).
    for inbox in [&mut mallory_inbox, &mut root_inbox] {
        let extra = tokio::time::timeout(Duration::from_millis(200), inbox.next()).await;
        assert!(extra.is_err(), "{extra:?}");
    }
    drop((to_gateway, answers, gw));
    server.shutdown().await;
}

#[tokio::test]
async fn sessions_from_map_to_aip_agents_are_bounded() {
    let (server, url) = router(2).await;
    let mut gw = gateway(&server).await;
    let (addr, mut seen, _task) = holder().await;
    with_timeout(gw.register_agent(as_(ALICE, agent_info("alice-node", &addr, "trip"))))
        .await
        .unwrap();
    let (bob, mut bob_inbox) = map_agent(&url, BOB, "bob-agent", &[], None).await;
    let start = |session: &str| {
        json!({"protocol": "aip", "expectsResponse": true,
               "correlationId": format!("c-{session}"),
               "aip": {"sessionId": session, "sessionStatus": "START_QUEST"}})
    };
    for s in ["q1", "q2"] {
        send(&bob, "alice-node", json!("hi"), start(s))
            .await
            .unwrap();
        let opened = with_timeout(seen.recv()).await.unwrap();
        assert_eq!(opened.session_id, s);
    }
    // The third is past `max_sessions`: bob is told RESOURCE_EXHAUSTED in the session's error,
    // and alice's server never sees it.
    send(&bob, "alice-node", json!("hi"), start("q3"))
        .await
        .unwrap();
    let refusal = next(&mut bob_inbox).await;
    let aip = &meta(&refusal)["aip"];
    assert_eq!(aip["sessionId"], "q3", "{refusal:?}");
    assert_eq!(
        aip["error"]["code"],
        Code::ResourceExhausted as i32,
        "{refusal:?}"
    );
    assert!(seen.try_recv().is_err(), "a third stream reached the node");
    // A one-message session is refused the same way (a MAP error reply).
    let e = with_timeout(bob.request("alice-node", json!("one shot"), Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(
        payload(&e)["error"]["data"]["grpcCode"],
        Code::ResourceExhausted as i32
    );
    assert!(
        seen.try_recv().is_err(),
        "a one-shot stream reached the node"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn tool_calls_are_bounded() {
    let (server, url) = router(2).await;
    let mut gw = gateway(&server).await;
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let open = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let (addr, _task) = serve(tonic::transport::Server::builder().add_service(
        ToolServiceServer::new(Gate {
            seen: seen_tx,
            open: open.clone(),
        }),
    ))
    .await;
    with_timeout(gw.register_tool(as_(
        ALICE,
        ToolInfo {
            tool_id: "alice-tool".into(),
            address: addr,
            domain: "math".into(),
            ..Default::default()
        },
    )))
    .await
    .unwrap();
    let (bob, _bob_inbox) = map_agent(&url, BOB, "bob-agent", &[], None).await;
    let call = |bob: Client| async move {
        bob.call_tool(
            "alice-tool",
            "slow",
            Default::default(),
            Duration::from_secs(5),
        )
        .await
    };
    let held: Vec<_> = (0..2).map(|_| tokio::spawn(call(bob.clone()))).collect();
    for _ in 0..2 {
        assert_eq!(with_timeout(seen.recv()).await.unwrap(), "bob-agent");
    }
    // Both slots are taken by calls in flight: a third MAP call and an AIP caller's
    // RouteToolCalling are answered RESOURCE_EXHAUSTED, and the tool never sees them.
    match with_timeout(call(bob.clone())).await.unwrap_err() {
        ClientError::Rpc { data, .. } => {
            assert_eq!(data.unwrap()["grpcCode"], Code::ResourceExhausted as i32)
        }
        other => panic!("{other:?}"),
    }
    let e = with_timeout(gw.route_tool_calling(as_(
        BOB,
        ToolRequest {
            receiver_id: "alice-tool".into(),
            tool_name: "slow".into(),
            ..Default::default()
        },
    )))
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        seen.try_recv().is_err(),
        "a call past the bound reached the tool"
    );
    open.add_permits(2);
    for h in held {
        let r = with_timeout(h).await.unwrap().unwrap();
        assert_eq!(r.text(), "done");
    }
    // The slots are free again.
    open.add_permits(1);
    assert_eq!(
        with_timeout(call(bob.clone())).await.unwrap().text(),
        "done"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_long_session_remembers_a_bounded_number_of_correlations() {
    let (server, url) = router(16).await;
    let aip = server.aip().unwrap().clone();
    let mut gw = gateway(&server).await;
    let (addr, _seen, _task) = holder().await;
    with_timeout(gw.register_agent(as_(ALICE, agent_info("alice-node", &addr, "trip"))))
        .await
        .unwrap();
    let (planner, mut inbox) = map_agent(&url, ALICE, "planner", &[], None).await;
    let (to_gateway, outbound) = mpsc::channel(512);
    to_gateway
        .send(quest(
            "alice-node",
            "planner",
            "long",
            SessionStatus::StartQuest,
            "0",
        ))
        .await
        .unwrap();
    let mut answers = with_timeout(gw.route_agent_calling(as_(
        ALICE,
        tokio_stream::wrappers::ReceiverStream::new(outbound),
    )))
    .await
    .unwrap()
    .into_inner();
    let n = 300;
    for i in 1..n {
        to_gateway
            .send(quest(
                "alice-node",
                "planner",
                "long",
                SessionStatus::HoldQuest,
                &i.to_string(),
            ))
            .await
            .unwrap();
    }
    let mut last = None;
    for _ in 0..n {
        last = Some(next(&mut inbox).await);
    }
    let last = last.unwrap();
    assert_eq!(payload(&last)["parts"][0]["text"], (n - 1).to_string());
    let remembered = aip.correlations_open();
    assert!(
        (1..=64).contains(&remembered),
        "{remembered} correlation ids remembered for one session of {n} unanswered quests"
    );
    // The newest is still answered; an answer is forgotten once delivered.
    with_timeout(planner.reply(&last, json!("latest")))
        .await
        .unwrap();
    let a = with_timeout(answers.message()).await.unwrap().unwrap();
    assert_eq!(texts(&a), ["latest"]);
    assert_eq!(aip.correlations_open(), remembered - 1);
    to_gateway
        .send(quest(
            "alice-node",
            "planner",
            "long",
            SessionStatus::StopQuest,
            "",
        ))
        .await
        .unwrap();
    let stop = next(&mut inbox).await;
    with_timeout(planner.reply(&stop, json!("bye")))
        .await
        .unwrap();
    let a = with_timeout(answers.message()).await.unwrap().unwrap();
    assert_eq!(a.session_status, SessionStatus::StopResponse as i32);
    assert_eq!(
        aip.correlations_open(),
        0,
        "an ended session forgets its ids"
    );
    drop((to_gateway, answers, gw));
    server.shutdown().await;
}

#[tokio::test]
async fn the_domains_registrants_make_are_bounded() {
    let (server, url) = router_with(|aip| aip.max_domains = 2).await;
    let mut gw = gateway(&server).await;
    let mut held = Vec::new();
    for (who, id, domain) in [(ALICE, "a1", "one"), (BOB, "b1", "two")] {
        let (addr, _seen, task) = holder().await;
        held.push(task);
        with_timeout(gw.register_agent(as_(who, agent_info(id, &addr, domain))))
            .await
            .unwrap();
    }
    // A third domain is one too many, whoever asks; the known ones still take nodes.
    let (addr, _seen, _task) = holder().await;
    let e = with_timeout(gw.register_agent(as_(OPS, agent_info("o1", &addr, "three"))))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    with_timeout(gw.register_agent(as_(OPS, agent_info("o1", &addr, "one"))))
        .await
        .expect("a known domain");
    // No scope was made for it, and no agent left behind.
    let ops = with_timeout(Client::connect_ws(&url, ClientOptions::new().api_key(OPS)))
        .await
        .unwrap();
    let scopes: Vec<String> = with_timeout(ops.scopes().list())
        .await
        .unwrap()
        .iter()
        .map(|s| s.id.to_string())
        .filter(|s| s.starts_with("aip:"))
        .collect();
    assert_eq!(scopes.len(), 2, "{scopes:?}");
    assert!(!scopes.contains(&"aip:three".to_owned()), "{scopes:?}");
    drop(gw);
    server.shutdown().await;
}

#[tokio::test]
async fn get_nodes_lists_router_facts_not_claims() {
    let (server, url) = router(16).await;
    let mut gw = gateway(&server).await;
    let (alice_addr, _seen, _task) = holder().await;
    with_timeout(gw.register_agent(as_(ALICE, agent_info("alice-node", &alice_addr, "math"))))
        .await
        .unwrap();
    // bob's MAP agent joins `aip:math` claiming to be alice's node, at an address of his.
    let forged = Peer {
        info_type: Some(InfoType::AgentInfo(agent_info(
            "alice-node",
            "127.0.0.1:6666",
            "math",
        ))),
    };
    let claim = json!({"aip": {
        "kind": "agent", "domain": "math", "address": "127.0.0.1:6666",
        "info": base64::engine::general_purpose::STANDARD.encode(forged.encode_to_vec()),
    }});
    let (_bob, _inbox) = map_agent(&url, BOB, "bob-fake", &["aip:math"], Some(claim)).await;
    for key in [OPS, ALICE, BOB] {
        let peers = with_timeout(gw.get_nodes(as_(
            key,
            GetNodesRequest {
                agent_id: String::new(),
                domain: "math".into(),
            },
        )))
        .await
        .unwrap()
        .into_inner()
        .peers;
        let mut listed: Vec<(String, String)> = peers
            .iter()
            .map(|p| match &p.info_type {
                Some(InfoType::AgentInfo(a)) => (a.agent_id.clone(), a.address.clone()),
                Some(InfoType::ToolInfo(t)) => (t.tool_id.clone(), t.address.clone()),
                None => panic!("{p:?}"),
            })
            .collect();
        listed.sort();
        assert_eq!(
            listed,
            [
                ("alice-node".to_owned(), alice_addr.clone()),
                ("bob-fake".to_owned(), String::new())
            ],
            "every peer is listed under its own id, at the address the gateway registered"
        );
    }
    server.shutdown().await;
}

#[tokio::test]
async fn subscriber_ids_belong_to_their_principal() {
    let (server, _url) = router(16).await;
    let mut gw = gateway(&server).await;
    let subscribe = |key: &str, id: &str| {
        as_(
            key,
            UpdateSubscriptionRequest {
                subscriber_id: id.into(),
                node_ids: vec![],
            },
        )
    };
    // bob takes alice's future node id as his subscriber id first.
    let mut bobs = with_timeout(gw.subscribe_to_updates(subscribe(BOB, "alice-node")))
        .await
        .unwrap()
        .into_inner();
    let (addr, _seen, _task) = holder().await;
    with_timeout(gw.register_agent(as_(ALICE, agent_info("alice-node", &addr, "trip"))))
        .await
        .unwrap();
    let u = with_timeout(bobs.message()).await.unwrap().unwrap();
    assert_eq!(
        (u.node_id.as_str(), u.update_type),
        ("alice-node", UpdateType::Added as i32)
    );
    // alice subscribes under her own node's id all the same.
    let mut alices = with_timeout(gw.subscribe_to_updates(subscribe(ALICE, "alice-node")))
        .await
        .expect("alice's subscriber id is hers")
        .into_inner();
    let u = with_timeout(alices.message()).await.unwrap().unwrap();
    assert_eq!(u.node_id, "alice-node");
    // Now that alice's node exists, nobody else subscribes under its id.
    let e = with_timeout(gw.subscribe_to_updates(subscribe(VIEWER, "alice-node")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    // bob's Unsubscribe ends his own subscription, not alice's.
    let r = with_timeout(gw.unsubscribe(as_(
        BOB,
        UnsubscribeRequest {
            subscriber_id: "alice-node".into(),
            node_ids: vec![],
        },
    )))
    .await
    .unwrap()
    .into_inner();
    assert!(r.success);
    let (addr2, _seen2, _task2) = holder().await;
    with_timeout(gw.register_agent(as_(ALICE, agent_info("alice-second", &addr2, "trip"))))
        .await
        .unwrap();
    let u = with_timeout(alices.message()).await.unwrap().unwrap();
    assert_eq!(
        (u.node_id.as_str(), u.update_type),
        ("alice-second", UpdateType::Added as i32)
    );
    // bob's ended (at most what was already on its way, then the end).
    let rest = with_timeout(async {
        let mut rest = Vec::new();
        while let Ok(Some(u)) = bobs.message().await {
            rest.push(u.node_id);
        }
        rest
    })
    .await;
    assert!(rest.iter().all(|id| id == "alice-second"), "{rest:?}");
    // An unknown subscriber of bob's is unknown, whoever else uses that id.
    let r = with_timeout(gw.unsubscribe(as_(
        OPS,
        UnsubscribeRequest {
            subscriber_id: "alice-node".into(),
            node_ids: vec![],
        },
    )))
    .await
    .unwrap()
    .into_inner();
    assert!(!r.success, "ops holds no subscription under that id");
    drop((alices, gw));
    server.shutdown().await;
}
