//! The Rust client (`map_router::client`) against the real server over WebSocket on
//! 127.0.0.1:0: typed calls, error mapping, subscriptions (first event, order, slow consumers),
//! agents with request/reply and control messages, and reconnect with resume through a TCP
//! proxy that can cut the connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use map_router::client::{
    Client, ClientError, ClientOptions, ConnectionState, ControlAction, EventEnvelope, MessageExt,
    ReconnectPolicy, Subscription,
};
use map_router::protocol::agent::AgentState;
use map_router::protocol::event::{AgentRegisteredData, SubscriptionFilter};
use map_router::protocol::jsonrpc::ErrorCode;
use map_router::protocol::methods::agents::{
    AgentFilter, AgentsList, AgentsListParams, RegisterParams,
};
use map_router::protocol::methods::events::{ReplayParams, SubscribeParams};
use map_router::protocol::methods::scopes::ScopesCreateParams;
use map_router::protocol::methods::steering::InjectDelivery;
use map_router::server::{Config, Server};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

// Self-contained helpers (this file does not share `tests/common`, which other suites evolve).

/// The bound on every single await.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Awaits `fut` for at most `limit`; panics after.
async fn within<F: std::future::Future>(limit: Duration, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}"),
    }
}

/// Awaits `fut` for at most [`TIMEOUT`].
async fn with_timeout<F: std::future::Future>(fut: F) -> F::Output {
    within(TIMEOUT, fut).await
}

/// How long "nothing arrives" is watched for.
const QUIET: Duration = Duration::from_millis(250);

/// A router on 127.0.0.1:0 and its WebSocket URL.
async fn default_server() -> (Server, String) {
    let config = Config {
        listen: vec!["127.0.0.1:0".parse().expect("valid address")],
        ..Config::default()
    };
    let server = with_timeout(Server::start(config))
        .await
        .expect("server starts");
    let addr = server.local_addrs()[0];
    assert!(addr.ip().is_loopback());
    (server, format!("ws://{addr}/"))
}

async fn connect(url: &str, options: ClientOptions) -> Client {
    with_timeout(Client::connect_ws(url, options))
        .await
        .expect("client connects")
}

fn register(name: &str, role: &str) -> RegisterParams {
    RegisterParams {
        name: Some(name.into()),
        role: Some(role.into()),
        ..Default::default()
    }
}

fn scope_events() -> SubscriptionFilter {
    SubscriptionFilter {
        event_types: Some(vec!["scope_created".into()]),
        ..Default::default()
    }
}

async fn create_scopes(client: &Client, names: impl IntoIterator<Item = String>) {
    for name in names {
        with_timeout(client.scopes().create(ScopesCreateParams {
            scope_id: Some(name.as_str().into()),
            name: Some(name),
            ..Default::default()
        }))
        .await
        .expect("scope created");
    }
}

/// Reads `n` events from `sub`, each within the timeout.
async fn take(sub: &mut Subscription, n: usize) -> Vec<EventEnvelope> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let e = with_timeout(sub.next())
            .await
            .expect("the stream continues");
        out.push(e);
    }
    out
}

fn scope_id(e: &EventEnvelope) -> String {
    e.data()["scopeId"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn typed_calls_and_router_errors() {
    let (server, url) = default_server().await;
    let client = connect(&url, ClientOptions::agent().name("typed")).await;
    let session = client.session().expect("connected");
    assert_eq!(client.state(), ConnectionState::Connected);
    assert!(session.resume_token.starts_with("resume_"));

    let agent = with_timeout(client.register(register("worker", "w")))
        .await
        .unwrap();
    assert_eq!(agent.agent().name.as_deref(), Some("worker"));
    let listed = with_timeout(client.list_agents(AgentFilter {
        roles: Some(vec!["w".into()]),
        ..Default::default()
    }))
    .await
    .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(&listed[0].id, agent.id());
    let page = with_timeout(client.call::<AgentsList>(AgentsListParams {
        limit: Some(1),
        ..Default::default()
    }))
    .await
    .unwrap();
    assert_eq!(page.agents.len(), 1);

    // A router error keeps its code, message and data.
    let err = with_timeout(client.get_agent("nope")).await.unwrap_err();
    assert_eq!(
        err,
        ClientError::Rpc {
            code: ErrorCode::AGENT_NOT_FOUND,
            message: "Agent not found: nope".into(),
            data: Some(json!({"category": "routing"})),
        }
    );
    assert_eq!(err.category(), Some("routing"));
    assert!(!err.is_retryable());
    let err = with_timeout(client.call_raw("map/nope", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::METHOD_NOT_FOUND));
    let err = with_timeout(client.call_raw("map/agents/get", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::INVALID_PARAMS));
    assert!(err.details().is_some(), "{err}");

    // Scopes, end to end.
    let scopes = client.scopes();
    let team = with_timeout(scopes.create(ScopesCreateParams {
        scope_id: Some("team".into()),
        name: Some("Team".into()),
        ..Default::default()
    }))
    .await
    .unwrap();
    assert_eq!(team.id.as_str(), "team");
    with_timeout(scopes.join("team", agent.id().clone()))
        .await
        .unwrap();
    assert_eq!(
        with_timeout(scopes.members("team")).await.unwrap(),
        vec![agent.id().clone()]
    );
    assert_eq!(with_timeout(scopes.list()).await.unwrap().len(), 1);
    assert_eq!(
        with_timeout(scopes.get("team"))
            .await
            .unwrap()
            .name
            .as_deref(),
        Some("Team")
    );
    let left = with_timeout(scopes.leave("team", agent.id().clone()))
        .await
        .unwrap();
    assert!(left.left);
    assert!(
        with_timeout(scopes.delete("team", false))
            .await
            .unwrap()
            .deleted
    );
    assert_eq!(
        with_timeout(scopes.get("team")).await.unwrap_err().code(),
        Some(ErrorCode::SCOPE_NOT_FOUND)
    );

    // Lifecycle and graph.
    let child = with_timeout(agent.spawn(Default::default())).await.unwrap();
    let graph = with_timeout(client.structure_graph(Default::default()))
        .await
        .unwrap();
    assert_eq!(graph.nodes.len(), 2);
    assert_eq!(graph.edges[0].from, *agent.id());
    assert_eq!(graph.edges[0].to, child.agent.id);
    let suspended = with_timeout(client.suspend_agent(child.agent.id.clone(), Some("nap")))
        .await
        .unwrap();
    assert_eq!(suspended.state, AgentState::SUSPENDED);
    let resumed = with_timeout(client.resume_agent(child.agent.id.clone()))
        .await
        .unwrap();
    assert_eq!(resumed.state, AgentState::REGISTERED);
    let stopped = with_timeout(client.stop_agent(child.agent.id.clone(), None, false))
        .await
        .unwrap();
    // The client owns the child itself: nobody else is left to finish a graceful stop, so it
    // is stopped at once (docs/compatibility.md §4).
    assert_eq!(stopped.agent.state, AgentState::STOPPED);
    assert!(!stopped.stopping);
    let busy = with_timeout(agent.set_state(AgentState::BUSY))
        .await
        .unwrap();
    assert_eq!(busy.state, AgentState::BUSY);
    let gone = with_timeout(client.unregister(child.agent.id.clone()))
        .await
        .unwrap();
    assert_eq!(gone.id, child.agent.id);

    // Replay sees what happened, decoded.
    let page = with_timeout(client.replay(ReplayParams {
        limit: Some(1000),
        ..Default::default()
    }))
    .await
    .unwrap();
    assert!(page
        .events
        .iter()
        .any(|e| e.event.kind == "agent_registered"));
    assert!(!page.has_more);

    // Disconnect ends the session; the client is closed afterwards.
    let bye = with_timeout(client.disconnect()).await.unwrap();
    assert!(bye.acknowledged);
    assert_eq!(client.state(), ConnectionState::Closed);
    assert_eq!(
        with_timeout(client.list_agents(Default::default()))
            .await
            .unwrap_err(),
        ClientError::Closed
    );
    server.shutdown().await;
}

#[tokio::test]
async fn client_participants_cannot_register() {
    let (server, url) = default_server().await;
    let client = connect(&url, ClientOptions::new()).await;
    let err = with_timeout(client.register(register("x", "y")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::PERMISSION_DENIED));
    assert_eq!(err.category(), Some("auth"));
    server.shutdown().await;
}

#[tokio::test]
async fn connecting_to_nothing_is_a_transport_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let err = with_timeout(Client::connect_ws(
        &format!("ws://{addr}/"),
        ClientOptions::new(),
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, ClientError::Transport(_)), "{err:?}");
}

#[tokio::test]
async fn history_right_after_the_subscribe_response_is_not_lost() {
    let (server, url) = default_server().await;
    let maker = connect(&url, ClientOptions::agent()).await;
    create_scopes(&maker, (0..50).map(|i| format!("s{i}"))).await;
    let watcher = connect(&url, ClientOptions::new()).await;
    // The router sends the 50 retained events immediately after the response.
    let mut sub = with_timeout(watcher.subscribe_with(SubscribeParams {
        filter: Some(scope_events()),
        replay_from: Some(json!(0)),
        ..Default::default()
    }))
    .await
    .unwrap();
    let events = take(&mut sub, 50).await;
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.sequence_number, i as u64 + 1);
        assert_eq!(scope_id(e), format!("s{i}"));
        assert_eq!(Some(&e.subscription_id), sub.id().as_ref());
    }
    server.shutdown().await;
}

#[tokio::test]
async fn live_events_arrive_in_order_with_typed_data() {
    let (server, url) = default_server().await;
    let watcher = connect(&url, ClientOptions::new()).await;
    let mut sub = with_timeout(watcher.subscribe(SubscriptionFilter {
        event_types: Some(vec!["agent_registered".into()]),
        ..Default::default()
    }))
    .await
    .unwrap();
    let maker = connect(&url, ClientOptions::agent()).await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let a = with_timeout(maker.register(register(&format!("a{i}"), "r")))
            .await
            .unwrap();
        ids.push(a.id().clone());
    }
    let events = take(&mut sub, 20).await;
    let mut last = String::new();
    for (e, id) in events.iter().zip(&ids) {
        let data: AgentRegisteredData = e.data_as().unwrap();
        assert_eq!(&data.agent_id, id);
        let eid = e.event_id.clone().unwrap();
        assert!(eid > last, "event ids increase");
        last = eid;
    }
    assert_eq!(sub.last_event_id(), Some(last));
    // Unsubscribing ends the stream.
    with_timeout(sub.unsubscribe()).await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn a_slow_consumer_is_paused_and_resumed_without_gap_or_duplicate() {
    let (server, url) = default_server().await;
    let watcher = connect(&url, ClientOptions::new().subscription_buffer(4)).await;
    let mut sub = with_timeout(watcher.subscribe(scope_events()))
        .await
        .unwrap();
    let maker = connect(&url, ClientOptions::agent()).await;
    create_scopes(&maker, (0..60).map(|i| format!("s{i}"))).await;
    // Nothing was read so far: the buffer filled at 4 and the subscription paused.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(sub.backlog() <= 4, "bounded: {}", sub.backlog());
    let events = take(&mut sub, 60).await;
    let names: Vec<String> = events.iter().map(scope_id).collect();
    let expected: Vec<String> = (0..60).map(|i| format!("s{i}")).collect();
    assert_eq!(names, expected, "every event once, in order");
    // And it is live again afterwards.
    create_scopes(&maker, ["late".to_owned()]).await;
    assert_eq!(scope_id(&take(&mut sub, 1).await[0]), "late");
    server.shutdown().await;
}

#[tokio::test]
async fn request_and_reply_are_correlated() {
    let (server, url) = default_server().await;
    let echo_client = connect(&url, ClientOptions::agent()).await;
    let echo = with_timeout(echo_client.register(register("echo", "echo")))
        .await
        .unwrap();
    echo.on_message(|agent, message| async move {
        if message.control().is_some() {
            return;
        }
        // Awaiting a call inside the handler is fine.
        agent
            .reply(&message, json!({"echo": message.payload}))
            .await
            .expect("reply sent");
    });

    let asker_client = connect(&url, ClientOptions::agent()).await;
    let asker = with_timeout(asker_client.register(register("asker", "q")))
        .await
        .unwrap();
    let mut inbox = asker.messages();
    // Several requests in flight at once each get their own reply.
    let mut tasks = Vec::new();
    for i in 0..10 {
        let asker = asker.clone();
        let to = echo.id().to_string();
        tasks.push(tokio::spawn(async move {
            asker
                .request(to, json!({"n": i}), Duration::from_secs(5))
                .await
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let reply = with_timeout(t).await.unwrap().expect("a reply");
        assert_eq!(reply.payload_value(), Some(json!({"echo": {"n": i}})));
        assert!(reply.is_reply());
        assert_eq!(reply.from, echo.id().as_str());
    }
    // Replies go to their waiters, never to the inbox.
    assert!(
        tokio::time::timeout(QUIET, inbox.next()).await.is_err(),
        "no reply leaked into the inbox"
    );

    // A plain client can ask too; nobody answering is a timeout.
    let plain = connect(&url, ClientOptions::new()).await;
    let reply = with_timeout(plain.request(
        json!({"agent": echo.id()}),
        json!("hi"),
        Duration::from_secs(5),
    ))
    .await
    .unwrap();
    assert_eq!(reply.payload_value(), Some(json!({"echo": "hi"})));
    let err = with_timeout(asker.request(
        asker_client.participant_id().unwrap().to_string(),
        json!("to myself"),
        Duration::from_millis(200),
    ))
    .await
    .unwrap_err();
    assert_eq!(err, ClientError::Timeout(Duration::from_millis(200)));
    // ...and the request itself reached the inbox (it was addressed to the asker).
    let own = with_timeout(inbox.next()).await.unwrap();
    assert_eq!(own.payload_value(), Some(json!("to myself")));
    server.shutdown().await;
}

/// A request that the router delivered to nobody fails at once with `NoRecipient`, not after
/// its timeout: here the agent's connection dropped, so it is orphaned and offline.
#[tokio::test]
async fn a_request_nobody_received_fails_at_once() {
    let (server, url) = default_server().await;
    let gone = connect(&url, ClientOptions::agent()).await;
    let agent = with_timeout(gone.register(RegisterParams {
        name: Some("gone".into()),
        ..Default::default()
    }))
    .await
    .unwrap();
    let id = agent.id().to_string();
    with_timeout(gone.close()).await.unwrap();
    let asker = connect(&url, ClientOptions::new()).await;
    // Wait (bounded) until the router has seen the connection go.
    let mut orphaned = false;
    for _ in 0..100 {
        let a = with_timeout(asker.get_agent(id.clone())).await.unwrap();
        if a.owner_id.is_none() {
            orphaned = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(orphaned, "the agent was never orphaned");
    let started = std::time::Instant::now();
    let err = with_timeout(asker.request(
        json!({"agent": id}),
        json!("anyone?"),
        Duration::from_secs(30),
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, ClientError::NoRecipient { .. }), "{err:?}");
    assert!(err.to_string().contains("nobody received"), "{err}");
    // Long before the 30 s timeout (the bound is generous: machines are shared).
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    server.shutdown().await;
}

#[tokio::test]
async fn control_messages_and_injections_reach_the_agent() {
    let (server, url) = default_server().await;
    let agent_client = connect(&url, ClientOptions::agent()).await;
    let agent = with_timeout(agent_client.register(register("a", "r")))
        .await
        .unwrap();
    let mut inbox = agent.messages();
    let boss = connect(&url, ClientOptions::new()).await;

    let injected = with_timeout(boss.inject(
        agent.id().clone(),
        json!({"hint": "look left"}),
        InjectDelivery::Interrupt,
    ))
    .await
    .unwrap();
    assert!(injected.injected);
    let m = with_timeout(inbox.next()).await.unwrap();
    let inj = m.injection().expect("an injection");
    assert_eq!(inj.delivery, "interrupt");
    assert!(inj.interrupt);
    assert_eq!(inj.content, json!({"hint": "look left"}));

    with_timeout(boss.suspend_agent(agent.id().clone(), None))
        .await
        .unwrap();
    with_timeout(boss.resume_agent(agent.id().clone()))
        .await
        .unwrap();
    with_timeout(boss.stop_agent(agent.id().clone(), Some("done"), false))
        .await
        .unwrap();
    let mut actions = Vec::new();
    for _ in 0..3 {
        let m = with_timeout(inbox.next()).await.unwrap();
        let c = m.control().expect("a control message");
        assert_eq!(c.agent_id.as_ref(), Some(agent.id()));
        actions.push(c.action);
    }
    assert_eq!(
        actions,
        vec![
            ControlAction::Suspend,
            ControlAction::Resume,
            ControlAction::Stop
        ]
    );
    // The agent acknowledges by stopping.
    let stopped = with_timeout(agent.set_state(AgentState::STOPPED))
        .await
        .unwrap();
    assert_eq!(stopped.state, AgentState::STOPPED);
    server.shutdown().await;
}

#[tokio::test]
async fn group_messages_reach_agent_handles_and_others_the_client_inbox() {
    let (server, url) = default_server().await;
    let c = connect(&url, ClientOptions::agent()).await;
    let a = with_timeout(c.register(register("a", "r"))).await.unwrap();
    let b = with_timeout(c.register(register("b", "r"))).await.unwrap();
    let mut a_in = a.messages();
    let mut b_in = b.messages();
    let mut rest = c.messages();
    let child = with_timeout(a.spawn(Default::default())).await.unwrap();
    let sender = connect(&url, ClientOptions::agent()).await;
    with_timeout(sender.send(b.id().to_string(), json!("for b")))
        .await
        .unwrap();
    with_timeout(sender.send(json!({"role": "r"}), json!("for role r")))
        .await
        .unwrap();
    with_timeout(sender.send(json!({"agent": child.agent.id}), json!("for the child")))
        .await
        .unwrap();
    assert_eq!(
        with_timeout(b_in.next()).await.unwrap().payload_value(),
        Some(json!("for b"))
    );
    for inbox in [&mut a_in, &mut b_in] {
        assert_eq!(
            with_timeout(inbox.next()).await.unwrap().payload_value(),
            Some(json!("for role r"))
        );
    }
    assert_eq!(
        with_timeout(rest.next()).await.unwrap().payload_value(),
        Some(json!("for the child"))
    );
    assert!(tokio::time::timeout(QUIET, a_in.next()).await.is_err());
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Reconnect
// ---------------------------------------------------------------------------------------------

/// A TCP proxy in front of the router that can cut every connection at once (as a network
/// failure would) and hold client-to-router traffic.
struct Proxy {
    url: String,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    hold: Arc<AtomicBool>,
    accept: JoinHandle<()>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/", listener.local_addr().unwrap());
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let hold = Arc::new(AtomicBool::new(false));
        let (c, h) = (conns.clone(), hold.clone());
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = TcpStream::connect(target).await else {
                    continue;
                };
                let hold = h.clone();
                c.lock()
                    .unwrap()
                    .push(tokio::spawn(pipe(inbound, outbound, hold)));
            }
        });
        Self {
            url,
            conns,
            hold,
            accept,
        }
    }

    /// Drops every proxied connection abruptly.
    fn cut(&self) {
        for task in self.conns.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

async fn pipe(inbound: TcpStream, outbound: TcpStream, hold: Arc<AtomicBool>) {
    let (mut in_r, mut in_w) = inbound.into_split();
    let (mut out_r, mut out_w) = outbound.into_split();
    let up = async {
        let mut buf = vec![0u8; 16 << 10];
        loop {
            let n = match in_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            while hold.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if out_w.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    let down = tokio::io::copy(&mut out_r, &mut in_w);
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

fn fast_reconnect() -> ReconnectPolicy {
    ReconnectPolicy::default()
        .max_attempts(20)
        .delays(Duration::from_millis(20), Duration::from_millis(200))
}

async fn wait_connected(client: &Client) {
    let mut states = client.state_changes();
    within(
        Duration::from_secs(10),
        states.wait_for(|s| *s == ConnectionState::Connected),
    )
    .await
    .expect("the client reconnects");
}

#[tokio::test]
async fn a_cut_connection_resumes_the_session_and_the_subscription_continues() {
    let (server, url) = default_server().await;
    let proxy = Proxy::start(server.local_addrs()[0]).await;
    let client = connect(
        &proxy.url,
        ClientOptions::agent().reconnect(fast_reconnect()),
    )
    .await;
    let before = client.session().unwrap();
    let agent = with_timeout(client.register(register("survivor", "r")))
        .await
        .unwrap();
    let mut inbox = agent.messages();
    let mut sub = with_timeout(client.subscribe(scope_events()))
        .await
        .unwrap();
    let first_sub_id = sub.id().unwrap();

    let maker = connect(&url, ClientOptions::agent()).await;
    create_scopes(&maker, (0..10).map(|i| format!("a{i}"))).await;
    let seen = take(&mut sub, 5).await; // 5 read, 5 still buffered
    assert_eq!(scope_id(&seen[4]), "a4");

    // A request held in the proxy is in flight when the connection is cut: it fails with a
    // retryable error.
    proxy.hold.store(true, Ordering::SeqCst);
    let in_flight = {
        let client = client.clone();
        tokio::spawn(async move { client.list_agents(Default::default()).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.cut();
    proxy.hold.store(false, Ordering::SeqCst);
    let err = with_timeout(in_flight).await.unwrap().unwrap_err();
    assert!(matches!(err, ClientError::Transport(_)), "{err:?}");
    assert!(err.is_retryable());

    // Events keep happening during the outage.
    create_scopes(&maker, (10..20).map(|i| format!("a{i}"))).await;
    wait_connected(&client).await;
    let after = client.session().unwrap();
    assert!(after.reconnected);
    assert_eq!(after.session_id, before.session_id);
    assert_eq!(after.participant_id, before.participant_id);
    create_scopes(&maker, (20..25).map(|i| format!("a{i}"))).await;

    // The stream continues: every event once, in order, across the outage.
    let rest = take(&mut sub, 20).await;
    let names: Vec<String> = seen.iter().chain(&rest).map(scope_id).collect();
    let expected: Vec<String> = (0..25).map(|i| format!("a{i}")).collect();
    assert_eq!(names, expected);
    assert_ne!(sub.id().unwrap(), first_sub_id, "a new router subscription");
    assert!(
        tokio::time::timeout(QUIET, sub.next()).await.is_err(),
        "no duplicate"
    );

    // The agent was reclaimed: still ours, still reachable.
    let a = with_timeout(maker.get_agent(agent.id().clone()))
        .await
        .unwrap();
    assert_eq!(a.owner_id, Some(after.participant_id.clone()));
    assert_ne!(a.state, AgentState::ORPHANED);
    with_timeout(maker.send(agent.id().to_string(), json!("still there?")))
        .await
        .unwrap();
    assert_eq!(
        with_timeout(inbox.next()).await.unwrap().payload_value(),
        Some(json!("still there?"))
    );
    server.shutdown().await;
}

#[tokio::test]
async fn calls_made_during_an_outage_wait_for_the_new_session() {
    let (server, _) = default_server().await;
    let proxy = Proxy::start(server.local_addrs()[0]).await;
    let client = connect(&proxy.url, ClientOptions::new().reconnect(fast_reconnect())).await;
    // Hold the new connection's first bytes so the outage lasts until released.
    proxy.hold.store(true, Ordering::SeqCst);
    proxy.cut();
    assert_eq!(client.last_connection_error(), None, "never lost yet");
    let mut states = client.state_changes();
    with_timeout(states.wait_for(|s| matches!(s, ConnectionState::Reconnecting { .. })))
        .await
        .unwrap();
    // Why the connection went is known by the time the state says so.
    assert!(
        matches!(client.last_connection_error(), Some(ClientError::Transport(ref why)) if why.starts_with("connection lost")),
        "{:?}",
        client.last_connection_error()
    );
    let call = {
        let client = client.clone();
        tokio::spawn(async move { client.list_agents(Default::default()).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!call.is_finished(), "the call waits for the session");
    proxy.hold.store(false, Ordering::SeqCst);
    let agents = with_timeout(call)
        .await
        .unwrap()
        .expect("answered after reconnecting");
    assert!(agents.is_empty());
    assert_eq!(client.state(), ConnectionState::Connected);
    server.shutdown().await;
}

#[tokio::test]
async fn explicit_reconnect_takes_the_session_over() {
    let (server, url) = default_server().await;
    let client = connect(
        &url,
        ClientOptions::new().reconnect(ReconnectPolicy::disabled()),
    )
    .await;
    let mut sub = with_timeout(client.subscribe(scope_events()))
        .await
        .unwrap();
    let maker = connect(&url, ClientOptions::agent()).await;
    create_scopes(&maker, ["x0".to_owned()]).await;
    assert_eq!(scope_id(&take(&mut sub, 1).await[0]), "x0");
    let before = client.session().unwrap();
    let result = with_timeout(client.reconnect()).await.unwrap();
    assert!(result.reconnected);
    assert_eq!(result.session_id, before.session_id);
    assert_ne!(
        result.resume_token, before.resume_token,
        "tokens are single use"
    );
    create_scopes(&maker, ["x1".to_owned()]).await;
    assert_eq!(scope_id(&take(&mut sub, 1).await[0]), "x1");
    assert!(
        tokio::time::timeout(QUIET, sub.next()).await.is_err(),
        "no duplicate"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn when_reconnecting_gives_up_the_client_closes() {
    let (server, _) = default_server().await;
    let proxy = Proxy::start(server.local_addrs()[0]).await;
    let policy = ReconnectPolicy::default()
        .max_attempts(2)
        .delays(Duration::from_millis(10), Duration::from_millis(20));
    let client = connect(&proxy.url, ClientOptions::new().reconnect(policy)).await;
    let mut sub = with_timeout(client.subscribe(Default::default()))
        .await
        .unwrap();
    drop(proxy); // no listener any more: every attempt fails
    let mut states = client.state_changes();
    with_timeout(states.wait_for(|s| *s == ConnectionState::Closed))
        .await
        .unwrap();
    assert!(with_timeout(sub.next()).await.is_none(), "the stream ends");
    assert!(
        matches!(sub.error(), Some(ClientError::Transport(_))),
        "{:?}",
        sub.error()
    );
    // The last attempt's error, the same the stream ended with.
    assert_eq!(client.last_connection_error(), sub.error());
    assert_eq!(
        with_timeout(client.list_agents(Default::default()))
            .await
            .unwrap_err(),
        ClientError::Closed
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_session_taken_over_elsewhere_is_not_fought_for() {
    let (server, url) = default_server().await;
    let first = connect(&url, ClientOptions::new().reconnect(fast_reconnect())).await;
    let token = first.session().unwrap().resume_token;
    let second = connect(&url, ClientOptions::new().resume_token(token)).await;
    let resumed = second.session().unwrap();
    assert!(resumed.reconnected);
    assert_eq!(resumed.session_id, first.session().unwrap().session_id);
    // The router closes the first connection (4000); it does not reconnect.
    let mut states = first.state_changes();
    with_timeout(states.wait_for(|s| *s == ConnectionState::Closed))
        .await
        .unwrap();
    assert!(with_timeout(second.list_agents(Default::default()))
        .await
        .is_ok());
    server.shutdown().await;
}

#[tokio::test]
async fn an_idle_client_answers_pings_and_stays_connected() {
    let mut config = Config {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        ..Config::default()
    };
    config.websocket.ping_interval_ms = 50;
    config.websocket.idle_timeout_ms = 200;
    let server = with_timeout(Server::start(config)).await.unwrap();
    let url = format!("ws://{}/", server.local_addrs()[0]);
    let client = connect(
        &url,
        ClientOptions::new().reconnect(ReconnectPolicy::disabled()),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(client.state(), ConnectionState::Connected);
    assert!(with_timeout(client.list_agents(Default::default()))
        .await
        .is_ok());
    server.shutdown().await;
}
