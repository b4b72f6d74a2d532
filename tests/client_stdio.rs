//! The Rust client over a stdio child: `map-router stdio` (the built binary) speaking NDJSON on
//! its stdin/stdout. The child is killed and reaped when the client goes away.

use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use map_router::client::{Client, ClientError, ClientOptions, ConnectionState};
use map_router::protocol::event::SubscriptionFilter;
use map_router::protocol::jsonrpc::ErrorCode;
use map_router::protocol::methods::agents::RegisterParams;
use tokio::process::Command;

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

const BIN: &str = env!("CARGO_BIN_EXE_map-router");

fn router_stdio() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("stdio")
        .env_remove("MAP_ROUTER_LISTEN")
        .env_remove("MAP_ROUTER_CONFIG")
        .env("RUST_LOG", "warn")
        .stderr(Stdio::null());
    cmd
}

/// Whether a process with this id exists (zombies included: a reaped child does not).
fn alive(pid: u32) -> bool {
    std::process::Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

async fn wait_gone(pid: u32, limit: Duration) {
    within(limit, async {
        while alive(pid) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_stdio_router_serves_typed_calls_and_events() {
    let client = with_timeout(Client::spawn_stdio(router_stdio(), ClientOptions::agent()))
        .await
        .expect("the child speaks MAP");
    let pid = client.child_id().expect("a child");
    assert!(alive(pid));
    let mut events = with_timeout(client.subscribe(SubscriptionFilter::default()))
        .await
        .unwrap();
    let agent = with_timeout(client.register(RegisterParams {
        name: Some("piped".into()),
        ..Default::default()
    }))
    .await
    .unwrap();
    let e = with_timeout(events.next()).await.unwrap();
    assert_eq!(e.kind(), "agent_registered");
    assert_eq!(e.sequence_number, 1);
    let err = with_timeout(client.get_agent("missing")).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::AGENT_NOT_FOUND));
    assert_eq!(
        with_timeout(client.get_agent(agent.id().clone()))
            .await
            .unwrap()
            .name
            .as_deref(),
        Some("piped")
    );
    // A stdio child cannot be reconnected to.
    assert!(matches!(
        with_timeout(client.reconnect()).await.unwrap_err(),
        ClientError::Transport(_)
    ));
    // close() returns once the child has exited and been reaped.
    with_timeout(client.close()).await.unwrap();
    assert!(!alive(pid), "reaped by close()");
    assert!(with_timeout(events.next()).await.is_none());
}

#[tokio::test]
async fn dropping_the_client_ends_the_child() {
    let client = with_timeout(Client::spawn_stdio(router_stdio(), ClientOptions::new()))
        .await
        .unwrap();
    let pid = client.child_id().unwrap();
    let sub = with_timeout(client.subscribe(Default::default()))
        .await
        .unwrap();
    drop(client);
    assert!(alive(pid), "a subscription keeps the connection open");
    drop(sub);
    wait_gone(pid, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_child_that_ignores_eof_is_killed() {
    // Answers map/connect, then ignores its stdin forever.
    let connect_result = r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1,"sessionId":"s","participantId":"p","participantType":"client","capabilities":{},"systemInfo":{"name":"stub","version":"0"},"reconnected":false,"ownedAgents":[],"reclaimedAgents":[],"resumeToken":"t"}}"#;
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(format!(
        "read line; printf '%s\\n' '{connect_result}'; exec sleep 60"
    ));
    let client = with_timeout(Client::spawn_stdio(cmd, ClientOptions::new()))
        .await
        .unwrap();
    assert_eq!(client.session().unwrap().system_info.name, "stub");
    let pid = client.child_id().unwrap();
    drop(client);
    // EOF, then the grace period, then a kill.
    wait_gone(
        pid,
        map_router::client::CHILD_EXIT_GRACE + Duration::from_secs(3),
    )
    .await;
}

#[tokio::test]
async fn a_child_that_exits_closes_the_client() {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg("read line; exit 3");
    let err = with_timeout(Client::spawn_stdio(cmd, ClientOptions::new()))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Transport(_)), "{err:?}");

    let client = with_timeout(Client::spawn_stdio(router_stdio(), ClientOptions::new()))
        .await
        .unwrap();
    let pid = client.child_id().unwrap();
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    let mut states = client.state_changes();
    with_timeout(states.wait_for(|s| *s == ConnectionState::Closed))
        .await
        .unwrap();
    wait_gone(pid, Duration::from_secs(5)).await;
}
