//! The sessions extension over real WebSockets: `map/session/list` shows a principal its own
//! sessions only; `map/session/load` moves a connection to one of its detached sessions (and
//! the agents it left orphaned come back); `map/session/close` ends a session for good and
//! releases its agents with the usual events. Another principal's session is "not found".

mod common;

use common::*;
use map_router::auth::config::Secret;
use serde_json::{json, Value};

const ALICE: &str = "ak-alice-0123456789abcdef";
const BOB: &str = "ak-bob-0123456789abcdef";
/// A system principal, to watch everything.
const OPS: &str = "ak-ops-0123456789abcdef";

async fn keyed_server() -> (map_router::server::Server, String) {
    start_server(|c| {
        c.auth.api_keys.inline = Some(Secret(format!("{ALICE} alice\n{BOB} bob\n{OPS} ops")));
        c.auth.system_principals = vec!["ops".into()];
    })
    .await
}

fn key(k: &str) -> Value {
    json!({"auth": {"method": "api-key", "credential": k}})
}

/// The listed session with this id.
fn listed<'a>(list: &'a Value, id: &str) -> Option<&'a Value> {
    list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == json!(id))
}

#[tokio::test]
async fn a_principal_lists_its_own_sessions_attached_and_detached() {
    let (_server, url) = keyed_server().await;
    let mut a1 = WsClient::connect_as(&url, "agent", key(ALICE)).await;
    let a1_session = a1.sid();
    a1.register_agent(json!({"name": "a1-agent"})).await;
    let mut a2 = WsClient::connect_as(&url, "client", key(ALICE)).await;
    let mut b = WsClient::connect_as(&url, "client", key(BOB)).await;
    let list = a2.ok("map/session/list", Value::Null).await;
    let sessions = list["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 2, "{list}");
    let first = listed(&list, &a1_session).unwrap();
    assert_eq!(first["state"], json!("attached"));
    assert_eq!(first["current"], json!(false));
    assert_eq!(first["participantType"], json!("agent"));
    assert_eq!(first["agents"].as_array().unwrap().len(), 1, "{first}");
    assert!(first["createdAt"].as_u64().is_some() && first["lastActiveAt"].as_u64().is_some());
    let mine = listed(&list, &a2.sid()).unwrap();
    assert_eq!(mine["current"], json!(true));
    // Bob sees only his own.
    let bobs = b.ok("map/session/list", json!({})).await;
    assert_eq!(bobs["sessions"].as_array().unwrap().len(), 1, "{bobs}");
    assert_eq!(bobs["sessions"][0]["id"], json!(b.sid()));
    // A dropped transport leaves the session detached (and listed) for the resume window.
    a1.drop_abruptly();
    let mut state = Value::Null;
    for _ in 0..100 {
        let list = a2.ok("map/session/list", json!({})).await;
        state = listed(&list, &a1_session).unwrap()["state"].clone();
        if state == json!("detached") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(state, json!("detached"));
}

#[tokio::test]
async fn load_moves_the_connection_to_a_detached_session_and_its_agents_come_back() {
    let (_server, url) = keyed_server().await;
    let mut watcher = WsClient::connect_as(&url, "system", key(OPS)).await;
    let sub = watcher
        .subscribe(json!({"eventTypes": ["participant_connected", "participant_disconnected", "agent_orphaned", "agent_state_changed"]}))
        .await;
    let mut old = WsClient::connect_as(&url, "agent", key(ALICE)).await;
    let old_session = old.sid();
    let agent = old.register_agent(json!({"name": "worker"})).await;
    let agent_id = agent["id"].as_str().unwrap().to_owned();
    old.drop_abruptly();
    let mut now = WsClient::connect_as(&url, "agent", key(ALICE)).await;
    let new_session = now.sid();
    // Wait (bounded) until the router saw the drop.
    let mut detached = false;
    for _ in 0..100 {
        let list = now.ok("map/session/list", json!({})).await;
        if listed(&list, &old_session).is_some_and(|s| s["state"] == json!("detached")) {
            detached = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(detached);
    let loaded = now
        .ok("map/session/load", json!({"sessionId": old_session}))
        .await;
    assert_eq!(loaded["sessionId"], json!(old_session));
    assert_eq!(loaded["restored"], json!(true));
    assert_eq!(
        loaded["reclaimedAgents"][0]["id"],
        json!(agent_id),
        "{loaded}"
    );
    assert!(loaded["resumeToken"].as_str().is_some());
    // The agent is owned again (by the loaded session's participant), and the session this
    // connection had is now the detached one.
    let got = now.ok("map/agents/get", json!({"agentId": agent_id})).await;
    assert_eq!(got["agent"]["ownerId"], loaded["participantId"], "{got}");
    let list = now.ok("map/session/list", json!({})).await;
    assert_eq!(listed(&list, &old_session).unwrap()["current"], json!(true));
    assert_eq!(
        listed(&list, &new_session).unwrap()["state"],
        json!("detached")
    );
    // Loading the current session changes nothing.
    let again = now
        .ok("map/session/load", json!({"sessionId": old_session}))
        .await;
    assert_eq!(again["restored"], json!(false));
    // Observers saw the reconnection, with the load as the reason the other session left.
    let mut saw_reconnect = false;
    let mut saw_loaded = false;
    for _ in 0..20 {
        let e = watcher.next_event(&sub).await;
        let data = &e["event"]["data"];
        if e["event"]["type"] == json!("participant_connected")
            && data["reconnected"] == json!(true)
        {
            saw_reconnect = true;
        }
        if e["event"]["type"] == json!("participant_disconnected")
            && data["reason"] == json!("session_loaded")
        {
            saw_loaded = true;
        }
        if saw_reconnect && saw_loaded {
            break;
        }
    }
    assert!(saw_reconnect && saw_loaded);
}

#[tokio::test]
async fn other_principals_sessions_are_not_found_and_attached_ones_are_in_use() {
    let (_server, url) = keyed_server().await;
    let mut alice = WsClient::connect_as(&url, "client", key(ALICE)).await;
    let alice2 = WsClient::connect_as(&url, "client", key(ALICE)).await;
    let mut bob = WsClient::connect_as(&url, "client", key(BOB)).await;
    for method in ["map/session/load", "map/session/close"] {
        let e = bob.err(method, json!({"sessionId": alice.sid()})).await;
        assert_eq!(e["code"], json!(16000), "{method}: {e}");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .starts_with("Session not found"),
            "{e}"
        );
        let e = bob
            .err(method, json!({"sessionId": "no-such-session"}))
            .await;
        assert_eq!(e["code"], json!(16000), "{method}: {e}");
        let e = alice.err(method, json!({"sessionId": alice2.sid()})).await;
        assert_eq!(e["code"], json!(16001), "{method}: {e}");
    }
    // Without authentication, a session is its participant's own.
    let (_server2, url2) = default_server().await;
    let mut anon = WsClient::client(&url2).await;
    let other = WsClient::client(&url2).await;
    let list = anon.ok("map/session/list", json!({})).await;
    assert_eq!(list["sessions"].as_array().unwrap().len(), 1, "{list}");
    let e = anon
        .err("map/session/close", json!({"sessionId": other.sid()}))
        .await;
    assert_eq!(e["code"], json!(16000), "{e}");
}

#[tokio::test]
async fn close_ends_a_session_for_good_and_releases_its_agents() {
    let (_server, url) = keyed_server().await;
    let mut watcher = WsClient::connect_as(&url, "system", key(OPS)).await;
    let sub = watcher
        .subscribe(json!({"eventTypes": ["agent_unregistered"]}))
        .await;
    // A detached session with an orphaned agent, closed from another connection.
    let mut gone = WsClient::connect_as(&url, "agent", key(ALICE)).await;
    let gone_session = gone.sid();
    let orphan = gone.register_agent(json!({"name": "orphan"})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    gone.drop_abruptly();
    let mut me = WsClient::connect_as(&url, "agent", key(ALICE)).await;
    let mut closed = Value::Null;
    for _ in 0..100 {
        match me
            .call(
                "map/session/close",
                json!({"sessionId": gone_session, "reason": "tidy up"}),
            )
            .await
        {
            Ok(r) => {
                closed = r;
                break;
            }
            // Still attached until the router sees the drop.
            Err(e) if e["code"] == json!(16001) => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(closed["closed"], json!(true), "{closed}");
    assert_eq!(closed["current"], json!(false));
    assert_eq!(closed["session"]["id"], json!(gone_session));
    assert!(closed["session"]["closedAt"].as_u64().is_some());
    let e = watcher.event_of_type(&sub, "agent_unregistered").await;
    assert_eq!(e["event"]["data"]["agentId"], json!(orphan));
    assert_eq!(e["event"]["data"]["reason"], json!("tidy up"));
    let list = me.ok("map/session/list", json!({})).await;
    assert!(listed(&list, &gone_session).is_none(), "{list}");
    // It can no longer be resumed or loaded.
    let e = me
        .err("map/session/load", json!({"sessionId": gone_session}))
        .await;
    assert_eq!(e["code"], json!(16000));

    // Closing its own session: the agents go, and the connection must connect again.
    let mine = me.register_agent(json!({"name": "mine"})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let own = me.ok("map/session/close", json!({})).await;
    assert_eq!(own["current"], json!(true));
    let e = watcher.event_of_type(&sub, "agent_unregistered").await;
    assert_eq!(e["event"]["data"]["agentId"], json!(mine));
    let e = me.err("map/agents/list", json!({})).await;
    assert_eq!(e["code"], json!(1000), "{e}");
    let r = me
        .ok(
            "map/connect",
            json!({"protocolVersion": 1, "auth": {"method": "api-key", "credential": ALICE}}),
        )
        .await;
    assert_eq!(r["reconnected"], json!(false), "{r}");
}
