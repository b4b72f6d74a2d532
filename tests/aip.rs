//! The AIP gateway from Rust (issue 25; the Python suite in tests/aip_py/ is the acceptance):
//! AIP nodes served by tonic on loopback register through the gateway's gRPC listener, and a
//! MAP agent of the Rust client reaches them: the typed `Client::call_tool` (a result, a tool
//! error, a failed call) and a plain request to the AIP agent. The limits: a
//! dial-back address outside the allow-list, an unknown receiver.

mod common;

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use map_router::client::{Client, ClientError, ClientOptions};
use map_router::gateway::aip::proto::agent_message::SessionStatus;
use map_router::gateway::aip::proto::agent_service_server::{AgentService, AgentServiceServer};
use map_router::gateway::aip::proto::gateway_service_client::GatewayServiceClient;
use map_router::gateway::aip::proto::tool_service_server::{ToolService, ToolServiceServer};
use map_router::gateway::aip::proto::{
    content_item, AgentInfo, AgentMessage, ContentItem, GetNodesRequest, ToolInfo, ToolRequest,
    ToolResponse,
};
use map_router::protocol::methods::agents::RegisterParams;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request, Response, Status, Streaming};

use common::{start_server, with_timeout};

fn text(t: &str) -> ContentItem {
    ContentItem {
        data: Some(content_item::Data::Text(t.into())),
    }
}

/// A function tool as upstream's: `add`, anything else raises.
struct Adder;

#[tonic::async_trait]
impl ToolService for Adder {
    async fn call_tool(&self, r: Request<ToolRequest>) -> Result<Response<ToolResponse>, Status> {
        let r = r.into_inner();
        if r.tool_name == "crash" {
            return Err(Status::internal("Handling request failure: crashed"));
        }
        let args = map_router::gateway::aip::proto::arguments(&r.arguments).unwrap();
        let sum = || -> Option<i64> {
            Some(args.get("a")?.parse::<i64>().ok()? + args.get("b")?.parse::<i64>().ok()?)
        };
        let (is_error, error_message, content) = match (r.tool_name.as_str(), sum()) {
            ("add", Some(s)) => (false, "No Error".to_owned(), vec![text(&s.to_string())]),
            (other, _) => (true, format!("Error executing tool: boom {other}"), vec![]),
        };
        Ok(Response::new(ToolResponse {
            sender_id: r.receiver_id,
            receiver_id: r.sender_id,
            session_id: r.session_id,
            is_error,
            error_message,
            content,
        }))
    }
}

/// An agent that answers every quest with `<id> heard: <text>`, as upstream's server does.
struct Echo;

type Answers = Pin<Box<dyn Stream<Item = Result<AgentMessage, Status>> + Send>>;

#[tonic::async_trait]
impl AgentService for Echo {
    type CallAgentStream = Answers;

    async fn call_agent(
        &self,
        r: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Answers>, Status> {
        let mut inbound = r.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                let stop = m.session_status == SessionStatus::StopQuest as i32;
                let heard: Vec<String> = m
                    .content
                    .iter()
                    .filter_map(|c| match &c.data {
                        Some(content_item::Data::Text(t)) => Some(t.clone()),
                        _ => None,
                    })
                    .collect();
                let answer = AgentMessage {
                    sender_id: m.receiver_id.clone(),
                    receiver_id: m.sender_id.clone(),
                    session_id: m.session_id.clone(),
                    session_status: if stop {
                        SessionStatus::StopResponse
                    } else {
                        SessionStatus::HoldResponse
                    } as i32,
                    content: vec![text(&format!(
                        "{} heard: {}",
                        m.receiver_id,
                        heard.join(" ")
                    ))],
                    ..Default::default()
                };
                if tx.send(Ok(answer)).await.is_err() || stop {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// Serves `router` on a fresh loopback port: its address, and the task (abort to stop it).
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

fn tool_info(id: &str, address: &str) -> ToolInfo {
    ToolInfo {
        tool_id: id.into(),
        address: address.into(),
        name: id.into(),
        domain: "rust".into(),
        arguments: [
            ("a".to_owned(), "int".to_owned()),
            ("b".to_owned(), "int".to_owned()),
        ]
        .into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_map_agent_calls_aip_tools_and_agents() {
    let (server, url) = start_server(|c| c.aip.listen = Some("127.0.0.1:0".parse().unwrap())).await;
    let gw = format!("http://{}", server.aip_addr().unwrap());
    let mut gateway = with_timeout(GatewayServiceClient::connect(gw))
        .await
        .unwrap();
    let (tool_addr, _tool_task) =
        serve(tonic::transport::Server::builder().add_service(ToolServiceServer::new(Adder))).await;
    let (agent_addr, _agent_task) =
        serve(tonic::transport::Server::builder().add_service(AgentServiceServer::new(Echo))).await;
    with_timeout(gateway.register_tool(tool_info("rs-tool", &tool_addr)))
        .await
        .unwrap();
    with_timeout(gateway.register_agent(AgentInfo {
        agent_id: "rs-agent".into(),
        address: agent_addr,
        domain: "rust".into(),
        ..Default::default()
    }))
    .await
    .unwrap();
    let peers = with_timeout(gateway.get_nodes(GetNodesRequest {
        agent_id: String::new(),
        domain: "rust".into(),
    }))
    .await
    .unwrap()
    .into_inner()
    .peers;
    assert_eq!(peers.len(), 2, "{peers:?}");

    let client = with_timeout(Client::connect_ws(&url, ClientOptions::agent()))
        .await
        .unwrap();
    with_timeout(client.register(RegisterParams {
        agent_id: Some("caller".into()),
        ..Default::default()
    }))
    .await
    .unwrap();
    let args = |v: Value| v.as_object().unwrap().clone();
    let r = with_timeout(client.call_tool(
        "rs-tool",
        "add",
        args(json!({"a": 1, "b": "2"})),
        Duration::from_secs(5),
    ))
    .await
    .unwrap();
    assert!(!r.is_error);
    assert_eq!(r.text(), "3");
    assert_eq!(r.message.from, "rs-tool");
    let r =
        with_timeout(client.call_tool("rs-tool", "nope", args(json!({})), Duration::from_secs(5)))
            .await
            .unwrap();
    assert!(r.is_error);
    assert_eq!(
        r.error_message.as_deref(),
        Some("Error executing tool: boom nope")
    );

    // A plain request to the AIP agent: one START_QUEST / STOP_QUEST session, one reply.
    let reply = with_timeout(client.request(
        "rs-agent",
        json!({"parts": [{"kind": "text", "text": "hi"}]}),
        Duration::from_secs(5),
    ))
    .await
    .unwrap();
    let payload = reply.payload_value().unwrap();
    assert_eq!(
        payload["parts"][0]["text"], "rs-agent heard: hi",
        "{payload}"
    );
    assert_eq!(
        payload["aip"]["statuses"],
        json!(["HOLD_RESPONSE", "STOP_RESPONSE"])
    );

    // The tool's server fails the call itself (upstream: INTERNAL outside the handler): an
    // error with the gRPC code, not a result.
    let e =
        with_timeout(client.call_tool("rs-tool", "crash", args(json!({})), Duration::from_secs(5)))
            .await
            .unwrap_err();
    match e {
        ClientError::Rpc { message, data, .. } => {
            assert_eq!(message, "Handling request failure: crashed");
            assert_eq!(data.unwrap()["grpcCode"], Code::Internal as i32);
        }
        other => panic!("{other:?}"),
    }

    // The AIP families pass Prometheus's own linter with the rest of /metrics (they are spliced
    // into the router's text; promtool reads the classic format), and end up inside the
    // OpenMetrics text, before its `# EOF`.
    let addr = server.local_addrs()[0];
    let r = common::http::request(addr, "GET", "/metrics", &[], b"").await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body).unwrap();
    assert!(
        text.contains("# TYPE map_aip_tool_calls_total counter"),
        "{text}"
    );
    common::promtool_check(&text).await;
    let r = common::http::request(
        addr,
        "GET",
        "/metrics",
        &[("Accept", "application/openmetrics-text; version=1.0.0")],
        b"",
    )
    .await;
    let text = String::from_utf8(r.body).unwrap();
    let aip = text.find("map_aip_").expect("AIP families in OpenMetrics");
    assert!(
        text.trim_end().ends_with("# EOF") && aip < text.len() - 6,
        "{text}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn dial_back_outside_the_allow_list_and_unknown_receivers_are_refused() {
    let (server, _url) = start_server(|c| {
        c.aip.listen = Some("127.0.0.1:0".parse().unwrap());
        c.aip.dial_allow = vec!["127.0.0.1:1".into()];
    })
    .await;
    let gw = format!("http://{}", server.aip_addr().unwrap());
    let mut gateway = with_timeout(GatewayServiceClient::connect(gw))
        .await
        .unwrap();
    let e = with_timeout(gateway.register_tool(tool_info("t", "127.0.0.1:2")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let e = with_timeout(gateway.register_tool(tool_info("t", "localhost:1")))
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        Code::PermissionDenied,
        "names are not resolved: {e:?}"
    );
    let e = with_timeout(gateway.route_tool_calling(ToolRequest {
        receiver_id: "nobody".into(),
        ..Default::default()
    }))
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(e.message(), "Receiver not found");
    server.shutdown().await;
}

#[tokio::test]
async fn bytes_that_are_not_http2_close_only_their_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (server, url) = start_server(|c| {
        c.aip.listen = Some("127.0.0.1:0".parse().unwrap());
        c.aip.max_connections = 4;
    })
    .await;
    let aip = server.aip_addr().unwrap();
    let connect = || async {
        with_timeout(tokio::net::TcpStream::connect(aip))
            .await
            .unwrap()
    };
    for junk in [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        vec![0xff; 4096],
    ] {
        let mut tcp = connect().await;
        let _ = tcp.write_all(&junk).await;
        let mut sink = Vec::new();
        // Not an HTTP/2 preface: the server closes, the read ends.
        let _ = with_timeout(tcp.read_to_end(&mut sink)).await;
    }
    // A preface and half a frame, left hanging (HTTP/2 keep-alive pings end such a connection
    // later), on every slot of `max_connections`: one more is closed as it is accepted.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut tcp = connect().await;
        let _ = tcp
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x04\xff")
            .await;
        held.push(tcp);
    }
    let mut over = connect().await;
    let mut sink = Vec::new();
    let _ = with_timeout(over.read_to_end(&mut sink)).await;
    drop(held);
    // The gateway (its slots free again once it has seen those connections close) and MAP
    // still serve.
    let served = with_timeout(async {
        loop {
            if let Ok(mut gateway) = GatewayServiceClient::connect(format!("http://{aip}")).await {
                if let Ok(nodes) = gateway.get_nodes(GetNodesRequest::default()).await {
                    break nodes.into_inner();
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(served.peers.is_empty());
    let client = with_timeout(Client::connect_ws(&url, ClientOptions::new()))
        .await
        .unwrap();
    assert!(with_timeout(client.list_agents(Default::default()))
        .await
        .is_ok());
    server.shutdown().await;
}
