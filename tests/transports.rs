//! One scenario suite, run over every transport (WebSocket, in-process, stdio NDJSON, HTTP +
//! SSE) against the same server, so a transport cannot drift: sessions and errors, agents and
//! events, messages in both directions with a WebSocket peer, scopes, replay, steering.

mod common;

use common::*;
use map_router::server::Server;
use serde_json::{json, Value};

async fn server() -> Server {
    start_server(|_| {}).await.0
}

async fn sessions_and_errors(t: Transport) {
    let server = server().await;
    let mut c = WsClient::open(t, &server).await;
    // Nothing before map/connect.
    assert_eq!(
        c.err("map/agents/list", Value::Null).await,
        map_error(1000, "Not connected: call map/connect first", "auth")
    );
    let r = c
        .ok(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": "client", "name": "t"}),
        )
        .await;
    assert_eq!(r["protocolVersion"], json!(1));
    assert!(r["resumeToken"].as_str().is_some());
    c.session = r;
    assert_eq!(
        c.err("map/nope", json!({})).await,
        map_error(-32601, "Method not found: map/nope", "protocol")
    );
    assert_invalid_params(&c.err("map/agents/get", json!({})).await);
    assert_eq!(
        c.err("map/agents/get", json!({"agentId": "ghost"})).await,
        map_error(2001, "Agent not found: ghost", "routing")
    );
    let bye = c.ok("map/disconnect", Value::Null).await;
    assert_eq!(bye["acknowledged"], json!(true));
    let token = bye["resumeToken"].as_str().unwrap().to_owned();
    // The session resumes from a new connection of the same transport.
    let resumed = WsClient::open(t, &server)
        .await
        .ok(
            "map/connect",
            json!({"participantType": "client", "resumeToken": token}),
        )
        .await;
    assert_eq!(resumed["reconnected"], json!(true));
    assert_eq!(resumed["sessionId"], c.session["sessionId"]);
}

async fn agents_and_events(t: Transport) {
    let server = server().await;
    let mut obs = WsClient::open_as(t, &server, "client", json!({})).await;
    let sub = obs.subscribe(json!({"eventTypes": ["agent.*"]})).await;
    let mut a = WsClient::open_agent(t, &server, "tr-a", json!({"role": "lead"})).await;
    let child = a
        .ok(
            "map/agents/spawn",
            json!({"agentId": "tr-child", "parent": "tr-a"}),
        )
        .await;
    assert_eq!(child["agent"]["parent"], json!("tr-a"));
    a.ok(
        "map/agents/update",
        json!({"agentId": "tr-a", "state": "busy"}),
    )
    .await;
    let list = obs
        .ok("map/agents/list", json!({"filter": {"roles": ["lead"]}}))
        .await;
    assert_eq!(ids(&list["agents"]), vec!["tr-a"]);
    let expected = [
        ("agent_registered", "tr-a"),
        ("agent_registered", "tr-child"),
        ("agent_state_changed", "tr-a"),
    ];
    for (i, (kind, agent)) in expected.iter().enumerate() {
        let ev = obs.next_event(&sub).await;
        assert_eq!(ev["sequenceNumber"], json!(i as u64 + 1), "gap-free: {ev}");
        assert_eq!(ev["event"]["type"], json!(kind));
        assert_eq!(ev["event"]["data"]["agentId"], json!(agent));
        assert_eq!(ev["event"]["id"], ev["eventId"]);
    }
    let u = obs
        .ok("map/unsubscribe", json!({"subscriptionId": sub}))
        .await;
    assert_eq!(u["unsubscribed"], json!(true));
    a.ok(
        "map/agents/update",
        json!({"agentId": "tr-a", "state": "idle"}),
    )
    .await;
    obs.assert_no_event(&sub).await;
}

async fn messages_both_ways(t: Transport) {
    let server = server().await;
    let url = format!("ws://{}/", server.local_addrs()[0]);
    let mut here = WsClient::open_agent(t, &server, "tr-here", json!({})).await;
    let mut there = WsClient::agent(&url, "ws-there", json!({})).await;
    let sent = there
        .send(json!({"agent": "tr-here"}), json!({"q": 1}))
        .await;
    assert_eq!(sent["delivered"], json!(["tr-here"]));
    let msg = here.next_message().await;
    assert_eq!(msg["from"], json!("ws-there"));
    assert_eq!(msg["payload"], json!({"q": 1}));
    // The reply addresses {agent: from}, as the SDK's reply() does.
    let reply = here
        .ok(
            "map/send",
            json!({"to": {"agent": msg["from"]}, "payload": {"a": 2}, "meta": {"correlationId": msg["id"], "isResult": true}}),
        )
        .await;
    assert_eq!(reply["delivered"], json!(["ws-there"]));
    let back = there.next_message().await;
    assert_eq!(back["from"], json!("tr-here"));
    assert_eq!(back["meta"]["correlationId"], msg["id"]);
    // A client on this transport is reached by a reply to its participant id.
    let mut client = WsClient::open_as(t, &server, "client", json!({})).await;
    let pid = client.pid();
    let sent = there
        .send(json!({"agent": pid}), json!({"to": "client"}))
        .await;
    assert_eq!(sent["delivered"], json!([pid]));
    assert_eq!(
        client.next_message().await["payload"],
        json!({"to": "client"})
    );
}

async fn scopes_replay_and_steering(t: Transport) {
    let server = server().await;
    let mut a = WsClient::open_agent(t, &server, "tr-s", json!({})).await;
    a.ok("map/scopes/create", json!({"scopeId": "tr-team"}))
        .await;
    let joined = a
        .ok(
            "map/scopes/join",
            json!({"scopeId": "tr-team", "agentId": "tr-s"}),
        )
        .await;
    assert_eq!(joined["joined"], json!(true));
    assert_eq!(
        a.ok("map/scopes/members", json!({"scopeId": "tr-team"}))
            .await["members"],
        json!(["tr-s"])
    );
    let page = a
        .ok(
            "map/replay",
            json!({"filter": {"eventTypes": ["scope.*"]}, "limit": 10}),
        )
        .await;
    let kinds: Vec<&str> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, vec!["scope_created", "scope_member_joined"]);
    assert_eq!(page["hasMore"], json!(false));
    // Steering reaches the agent whatever its transport.
    let mut operator = WsClient::open_as(Transport::Ws, &server, "client", json!({})).await;
    let r = operator
        .ok(
            "map/inject",
            json!({"agentId": "tr-s", "content": {"hint": "hurry"}, "delivery": "steer"}),
        )
        .await;
    assert_eq!(r["injected"], json!(true));
    let msg = a.next_message().await;
    assert_eq!(msg["from"], json!("system"));
    assert_eq!(msg["payload"], json!({"hint": "hurry"}));
    assert_eq!(msg["meta"]["_meta"]["inject"]["delivery"], json!("steer"));
    let left = a
        .ok(
            "map/scopes/leave",
            json!({"scopeId": "tr-team", "agentId": "tr-s"}),
        )
        .await;
    assert_eq!(left["left"], json!(true));
}

macro_rules! over_every_transport {
    ($($scenario:ident),* $(,)?) => {
        mod ws {
            $( #[tokio::test] async fn $scenario() { super::$scenario(super::Transport::Ws).await } )*
        }
        mod in_process {
            $( #[tokio::test] async fn $scenario() { super::$scenario(super::Transport::InProcess).await } )*
        }
        mod stdio {
            $( #[tokio::test] async fn $scenario() { super::$scenario(super::Transport::Stdio).await } )*
        }
        mod http {
            $( #[tokio::test] async fn $scenario() { super::$scenario(super::Transport::Http).await } )*
        }
    };
}

over_every_transport!(
    sessions_and_errors,
    agents_and_events,
    messages_both_ways,
    scopes_replay_and_steering,
);
