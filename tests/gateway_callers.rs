//! The gateways' per-principal MAP sessions (`gateway::callers::CallerSessions`) against a real
//! server: one session per principal (not per credential), each with exactly its principal's
//! grants, closed when idle; and the reserved service principal and ids.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use map_router::auth::config::Secret;
use map_router::client::{Client, ClientOptions};
use map_router::gateway::callers::CallerSessions;
use map_router::protocol::methods::agents::RegisterParams;
use map_router::protocol::methods::session::Principal;

fn principal(id: &str) -> Principal {
    Principal {
        id: id.into(),
        issuer: None,
        expires_at: Some(1),
    }
}

#[tokio::test]
async fn one_session_per_principal_with_that_principals_grants_closed_when_idle() {
    let (server, _url) = start_server(|c| {
        c.auth.api_keys.inline = Some(Secret("key-alice-0123456789 alice".into()));
    })
    .await;
    let server = Arc::new(server);
    let links: Arc<dyn map_router::transport::in_process::InProcessLinks + Send + Sync> =
        server.clone();
    let table = CallerSessions::new(links, Duration::from_millis(400));
    let alice = with_timeout(table.get(Some(&principal("alice")), ClientOptions::new))
        .await
        .expect("alice's session");
    let again = with_timeout(table.get(Some(&principal("alice")), ClientOptions::new))
        .await
        .expect("alice's session again");
    assert_eq!(alice.participant_id(), again.participant_id(), "reused");
    let bob = with_timeout(table.get(Some(&principal("bob")), ClientOptions::new))
        .await
        .expect("bob's session");
    assert_ne!(alice.participant_id(), bob.participant_id());
    assert_eq!(table.len(), 2);
    // Each is its own principal, as a MAP participant would see: the session reports it.
    let who = alice.session().unwrap().principal.unwrap();
    assert_eq!(who.id, "alice");
    assert_eq!(
        who.expires_at, None,
        "the gateway checks expiry per request"
    );
    // Idle: closed by the sweeper.
    within(Duration::from_secs(5), async {
        while !table.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(matches!(
        alice.state(),
        map_router::client::ConnectionState::Closed
    ));
    // The next call opens a new one.
    let later = with_timeout(table.get(Some(&principal("alice")), ClientOptions::new))
        .await
        .expect("alice's new session");
    assert_ne!(later.participant_id(), alice.participant_id());
}

#[tokio::test]
async fn the_gateways_reserved_ids_are_for_the_service_principal_only() {
    let (server, url) = start_server(|_| {}).await;
    // A participant asking for the A2A gateway's id gets a fresh one, and may not register its
    // agent id.
    let mut squatter = WsClient::connect_as(
        &url,
        "agent",
        serde_json::json!({"participantId": "a2a-gateway"}),
    )
    .await;
    assert_ne!(squatter.pid(), "a2a-gateway");
    let err = squatter
        .err(
            "map/agents/register",
            serde_json::json!({"agentId": "a2a-gateway"}),
        )
        .await;
    assert_eq!(err["code"], 1003, "{err}");
    // The service principal takes both.
    let service = with_timeout(Client::in_process_as(
        &server,
        map_router::auth::service_principal(),
        ClientOptions::agent().participant_id("a2a-gateway"),
    ))
    .await
    .expect("service session");
    assert_eq!(service.participant_id().unwrap().as_str(), "a2a-gateway");
    with_timeout(service.register(RegisterParams {
        agent_id: Some("a2a-gateway".into()),
        ..RegisterParams::default()
    }))
    .await
    .expect("the service registers its reserved agent");
}
