//! The Rust client over an in-process link: a `Server` with no listeners, no sockets at all.

use std::time::Duration;

use futures::StreamExt;
use map_router::client::{Client, ClientError, ClientOptions, ConnectionState, MessageExt};
use map_router::protocol::event::SubscriptionFilter;
use map_router::protocol::methods::agents::RegisterParams;
use map_router::server::{Config, Server};
use serde_json::json;

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

async fn embedded() -> Server {
    let config = Config {
        listen: Vec::new(),
        ..Config::default()
    };
    let server = with_timeout(Server::start(config)).await.unwrap();
    assert!(server.local_addrs().is_empty(), "no sockets");
    server
}

#[tokio::test]
async fn in_process_clients_call_subscribe_and_exchange_messages() {
    let server = embedded().await;
    let watcher = with_timeout(Client::in_process(&server, ClientOptions::new().name("w")))
        .await
        .unwrap();
    let mut events = with_timeout(watcher.subscribe(SubscriptionFilter {
        event_types: Some(vec!["agent_registered".into()]),
        ..Default::default()
    }))
    .await
    .unwrap();

    let agent_client = with_timeout(Client::in_process(&server, ClientOptions::agent()))
        .await
        .unwrap();
    let echo = with_timeout(agent_client.register(RegisterParams {
        name: Some("echo".into()),
        ..Default::default()
    }))
    .await
    .unwrap();
    echo.on_message(|agent, m| async move {
        let _ = agent.reply(&m, json!({"echo": m.payload})).await;
    });
    let e = with_timeout(events.next()).await.unwrap();
    assert_eq!(e.kind(), "agent_registered");
    assert_eq!(e.event.source.as_deref(), Some(echo.id().as_str()));

    let reply =
        with_timeout(watcher.request(echo.id().to_string(), json!(1), Duration::from_secs(5)))
            .await
            .unwrap();
    assert!(reply.is_reply());
    assert_eq!(reply.payload_value(), Some(json!({"echo": 1})));
    assert_eq!(
        with_timeout(watcher.list_agents(Default::default()))
            .await
            .unwrap()
            .len(),
        1
    );

    // An in-process link cannot be re-established.
    let err = with_timeout(watcher.reconnect()).await.unwrap_err();
    assert!(matches!(err, ClientError::Transport(_)), "{err:?}");

    // Shutting the server down closes the clients and ends their streams.
    with_timeout(server.shutdown()).await;
    let mut states = watcher.state_changes();
    with_timeout(states.wait_for(|s| *s == ConnectionState::Closed))
        .await
        .unwrap();
    assert!(with_timeout(events.next()).await.is_none());
    assert!(matches!(
        with_timeout(watcher.list_agents(Default::default()))
            .await
            .unwrap_err(),
        ClientError::Closed | ClientError::Transport(_)
    ));
}

#[tokio::test]
async fn custom_transports_work_too() {
    let server = embedded().await;
    let link = server.connect_in_process();
    let client = with_timeout(Client::from_transport(
        link.rx,
        link.tx,
        ClientOptions::new(),
    ))
    .await
    .unwrap();
    assert!(client.session().is_some());
    with_timeout(client.close()).await.unwrap();
    assert_eq!(client.state(), ConnectionState::Closed);
    with_timeout(server.shutdown()).await;
}
