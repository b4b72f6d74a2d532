//! The in-process server's lifecycle: graceful shutdown (pending output first, then close code
//! 1001), keep-alive (idle timeout, pings), and the `/health` route.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn shutdown_flushes_pending_output_then_closes_with_1001() {
    let (server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut raw = WsClient::connect(&url).await; // no session at all
    let mut a = WsClient::agent(&url, "sd-1", json!({})).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["agent_state_changed"]}))
        .await;
    // These events are queued for `obs` before shutdown starts; obs has not read them yet.
    for state in ["busy", "idle", "busy"] {
        a.ok(
            "map/agents/update",
            json!({"agentId": "sd-1", "state": state}),
        )
        .await;
    }
    let addr = url.clone();
    let stopping = tokio::spawn(server.shutdown());
    for state in ["busy", "idle", "busy"] {
        let ev = obs.next_event(&sub).await;
        assert_eq!(ev["event"]["data"]["newState"], json!(state));
    }
    assert_eq!(obs.expect_close().await, Some(1001));
    assert_eq!(raw.expect_close().await, Some(1001));
    assert_eq!(a.expect_close().await, Some(1001));
    within(Duration::from_secs(15), stopping)
        .await
        .expect("shutdown completes");
    let refused = tokio::time::timeout(
        Duration::from_secs(2),
        tokio_tungstenite::connect_async(addr.as_str()),
    )
    .await;
    assert!(
        !matches!(refused, Ok(Ok(_))),
        "no new connections after shutdown"
    );
}

#[tokio::test]
async fn silent_connections_are_closed_after_the_idle_timeout() {
    let (_server, url) = start_server(|c| {
        c.websocket.ping_interval_ms = 0;
        c.websocket.idle_timeout_ms = 1000;
    })
    .await;
    let mut silent = WsClient::client(&url).await;
    let mut chatty = WsClient::client(&url).await;
    let started = std::time::Instant::now();
    // The chatty one keeps talking past the silent one's deadline.
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        chatty.ok("map/agents/list", Value::Null).await;
    }
    assert_eq!(silent.expect_close().await, Some(1001));
    assert!(started.elapsed() >= Duration::from_millis(900));
    chatty.ok("map/agents/list", Value::Null).await;
}

#[tokio::test]
async fn pings_keep_a_responsive_peer_alive() {
    let (_server, url) = start_server(|c| {
        c.websocket.ping_interval_ms = 100;
        c.websocket.idle_timeout_ms = 1000;
    })
    .await;
    let mut c = WsClient::client(&url).await;
    // Reading lets tungstenite answer the pings; nothing else is sent for > idle timeout.
    for _ in 0..6 {
        c.assert_silent().await;
    }
    c.ok("map/agents/list", Value::Null).await;
}

#[tokio::test]
async fn health_answers_ok() {
    let (server, _url) = default_server().await;
    let addr = server.local_addrs()[0];
    let mut s = with_timeout(tokio::net::TcpStream::connect(addr))
        .await
        .expect("connect");
    with_timeout(
        s.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"),
    )
    .await
    .expect("write");
    let mut text = String::new();
    with_timeout(s.read_to_string(&mut text))
        .await
        .expect("read");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("ok\n"), "{text}");
}
