//! Sessions (docs/compatibility.md §2–3): the "not connected" gate, `map/connect` variants and
//! capabilities, `map/disconnect`, resume by token and by session id, takeover, expiry.

mod common;

use common::*;
use serde_json::{json, Value};

/// Every capability flag of the design matrix, in order.
const FLAGS: [&str; 12] = [
    "/observation/canObserve",
    "/observation/canQuery",
    "/messaging/canSend",
    "/messaging/canReceive",
    "/messaging/canBroadcast",
    "/lifecycle/canSpawn",
    "/lifecycle/canRegister",
    "/lifecycle/canUnregister",
    "/lifecycle/canSteer",
    "/lifecycle/canStop",
    "/scopes/canCreateScopes",
    "/scopes/canManageScopes",
];

fn assert_caps(caps: &Value, expected: [bool; 12]) {
    for (flag, want) in FLAGS.iter().zip(expected) {
        assert_eq!(
            caps.pointer(flag),
            Some(&json!(want)),
            "capability {flag} in {caps}"
        );
    }
    assert_eq!(
        caps["streaming"],
        json!({"supportsAck": true, "supportsFlowControl": true, "supportsPause": false})
    );
}

#[tokio::test]
async fn calls_before_connect_are_refused_with_1000() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&url).await;
    let not_connected = map_error(1000, "Not connected: call map/connect first", "auth");
    for (method, params) in [
        ("map/agents/list", Value::Null),
        ("map/subscribe", json!({})),
        ("map/send", json!({"to": "x"})),
        ("map/disconnect", Value::Null),
        ("map/replay", json!({})),
        ("map/agents/register", json!({})),
        ("map/scopes/create", json!({})),
        // Bad params still report "not connected" first.
        ("map/agents/get", json!({})),
    ] {
        assert_eq!(c.err(method, params).await, not_connected, "{method}");
    }
    // After connect the same calls work.
    c.ok("map/connect", json!({"protocolVersion": 1})).await;
    assert_eq!(
        without_as_of(&c.ok("map/agents/list", Value::Null).await),
        json!({"agents": []})
    );
}

#[tokio::test]
async fn connect_result_has_every_documented_field() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&url).await;
    let r = c
        .ok(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": "client", "name": "cli"}),
        )
        .await;
    assert_eq!(r["protocolVersion"], json!(1));
    assert!(r["sessionId"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(r["participantId"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(r["participantType"], json!("client"));
    assert_eq!(r["systemInfo"]["name"], json!("map-router"));
    assert!(r["systemInfo"]["version"].is_string());
    assert_eq!(r["reconnected"], json!(false));
    assert_eq!(r["ownedAgents"], json!([]));
    assert_eq!(r["reclaimedAgents"], json!([]));
    assert!(r["resumeToken"].as_str().is_some_and(|s| !s.is_empty()));
    // Two connections get different sessions and participants.
    let other = WsClient::client(&url).await;
    assert_ne!(other.sid(), r["sessionId"].as_str().unwrap());
    assert_ne!(other.pid(), r["participantId"].as_str().unwrap());
}

#[tokio::test]
async fn protocol_version_other_than_1_is_invalid_params() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&url).await;
    for v in [json!(2), json!(0), json!("2024-12"), json!("1")] {
        assert_invalid_params(&c.err("map/connect", json!({"protocolVersion": v})).await);
    }
    // Still not connected after the failures.
    assert_eq!(
        c.err("map/agents/list", Value::Null).await["code"],
        json!(1000)
    );
    let r = c.ok("map/connect", json!({})).await;
    assert_eq!(r["protocolVersion"], json!(1), "absent version is accepted");
}

#[tokio::test]
async fn participant_type_defaults_to_client_and_rejects_unknown_values() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&url).await;
    assert_invalid_params(
        &c.err(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": "robot"}),
        )
        .await,
    );
    let r = c.ok("map/connect", json!({"protocolVersion": 1})).await;
    assert_eq!(r["participantType"], json!("client"));
}

#[tokio::test]
async fn capabilities_follow_the_matrix_per_participant_type() {
    let (_server, url) = default_server().await;
    let client = WsClient::connect_as(&url, "client", json!({})).await;
    assert_caps(
        &client.session["capabilities"],
        [
            true, true, true, false, false, false, false, false, true, true, false, false,
        ],
    );
    let agent = WsClient::connect_as(&url, "agent", json!({})).await;
    assert_caps(&agent.session["capabilities"], [true; 12]);
    let system = WsClient::connect_as(&url, "system", json!({})).await;
    assert_caps(&system.session["capabilities"], [true; 12]);
    let gateway = WsClient::connect_as(&url, "gateway", json!({})).await;
    assert_caps(
        &gateway.session["capabilities"],
        [
            true, true, true, true, false, false, false, false, false, false, false, false,
        ],
    );
}

#[tokio::test]
async fn requested_false_flags_narrow_the_grant_and_true_flags_never_widen_it() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect_as(
        &url,
        "client",
        json!({"capabilities": {
            "observation": {"canObserve": false},
            "lifecycle": {"canRegister": true, "canSpawn": true},
            "scopes": {"canCreateScopes": true}
        }}),
    )
    .await;
    assert_caps(
        &c.session["capabilities"],
        [
            false, true, true, false, false, false, false, false, true, true, false, false,
        ],
    );
    assert_eq!(
        c.err("map/subscribe", json!({})).await,
        map_error(1003, "Permission denied: observation.canObserve", "auth")
    );
    assert_eq!(
        c.err("map/agents/register", json!({})).await,
        map_error(1003, "Permission denied: lifecycle.canRegister", "auth")
    );
    // canQuery was not narrowed.
    c.ok("map/agents/list", Value::Null).await;

    let mut a = WsClient::connect_as(
        &url,
        "agent",
        json!({"capabilities": {"messaging": {"canBroadcast": false}}}),
    )
    .await;
    assert_eq!(
        a.session["capabilities"]["messaging"],
        json!({"canSend": true, "canReceive": true, "canBroadcast": false})
    );
    a.register_agent(json!({"agentId": "narrow-a"})).await;
    assert_eq!(
        a.err("map/send", json!({"to": {"broadcast": true}})).await,
        map_error(1003, "Permission denied: messaging.canBroadcast", "auth")
    );
}

#[tokio::test]
async fn a_second_connect_of_the_same_type_returns_the_same_session() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect_as(&url, "agent", json!({})).await;
    let first = c.session.clone();
    c.register_agent(json!({})).await;
    let again = c
        .ok(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": "agent"}),
        )
        .await;
    assert_eq!(again["sessionId"], first["sessionId"]);
    assert_eq!(again["participantId"], first["participantId"]);
    assert_eq!(again["reconnected"], json!(true));
    assert_eq!(again["ownedAgents"], json!([first["participantId"]]));
    assert!(again["resumeToken"].is_string());
    assert_ne!(again["resumeToken"], first["resumeToken"], "a fresh token");
    // A different participant type on the same connection is refused.
    let err = c
        .err(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": "client"}),
        )
        .await;
    assert_protocol_error(&err, -32600, "Invalid request");
    // The session is untouched.
    assert_eq!(
        c.ok("map/agents/list", Value::Null).await["agents"][0]["ownerId"],
        first["participantId"]
    );
}

#[tokio::test]
async fn participant_id_is_honoured_when_free_and_replaced_when_taken() {
    let (_server, url) = default_server().await;
    let a = WsClient::connect_as(&url, "agent", json!({"participantId": "pid-1"})).await;
    assert_eq!(a.pid(), "pid-1");
    let b = WsClient::connect_as(&url, "agent", json!({"participantId": "pid-1"})).await;
    assert_ne!(b.pid(), "pid-1", "a connected session keeps its id");
    assert_eq!(b.session["reconnected"], json!(false));
    // A detached session's id is taken by the newcomer.
    a.close().await;
    let mut c = WsClient::connect(&url).await;
    let mut got = Value::Null;
    for _ in 0..50 {
        got = c
            .ok(
                "map/connect",
                json!({"participantType": "agent", "participantId": "pid-1"}),
            )
            .await;
        if got["participantId"] == json!("pid-1") {
            break;
        }
        // The old connection's detach may still be in flight: disconnect and retry.
        c.ok("map/disconnect", Value::Null).await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(got["participantId"], json!("pid-1"));
}

#[tokio::test]
async fn disconnect_returns_session_info_and_a_resume_token_and_keeps_the_socket() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::client(&url).await;
    let sid = c.sid();
    let r = c.ok("map/disconnect", json!({"reason": "bye"})).await;
    assert_eq!(r["acknowledged"], json!(true));
    assert_eq!(r["session"]["id"], json!(sid));
    let created = r["session"]["createdAt"].as_u64().expect("createdAt");
    let closed = r["session"]["closedAt"].as_u64().expect("closedAt");
    assert!(closed >= created);
    let token = r["resumeToken"].as_str().expect("resumeToken");
    assert_ne!(
        json!(token),
        c.session["resumeToken"],
        "tokens are single use"
    );
    // The connection has no session any more, but the transport is open.
    assert_eq!(
        c.err("map/agents/list", Value::Null).await["code"],
        json!(1000)
    );
    let again = c.ok("map/connect", json!({"resumeToken": token})).await;
    assert_eq!(again["sessionId"], json!(sid));
    assert_eq!(again["reconnected"], json!(true));
}

#[tokio::test]
async fn resume_by_token_restores_the_session_once() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::client(&url).await;
    let (sid, pid) = (c.sid(), c.pid());
    let token = c.ok("map/disconnect", Value::Null).await["resumeToken"]
        .as_str()
        .unwrap()
        .to_owned();
    c.close().await;

    let mut d = WsClient::connect(&url).await;
    let r = d
        .ok(
            "map/connect",
            json!({"protocolVersion": 1, "resumeToken": token}),
        )
        .await;
    assert_eq!(r["sessionId"], json!(sid));
    assert_eq!(r["participantId"], json!(pid));
    assert_eq!(r["reconnected"], json!(true));
    assert_ne!(r["resumeToken"], json!(token));

    // The token was single use: a second attempt starts a new session (not an error).
    let mut e = WsClient::connect(&url).await;
    let r2 = e
        .ok(
            "map/connect",
            json!({"protocolVersion": 1, "resumeToken": token}),
        )
        .await;
    assert_eq!(r2["reconnected"], json!(false));
    assert_ne!(r2["sessionId"], json!(sid));
    // Unknown tokens are not errors either.
    let mut f = WsClient::connect(&url).await;
    let r3 = f
        .ok("map/connect", json!({"resumeToken": "resume_bogus"}))
        .await;
    assert_eq!(r3["reconnected"], json!(false));
}

#[tokio::test]
async fn resume_takes_the_sessions_type_and_refuses_another() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::system(&url).await;
    let pid = c.pid();
    let token = c.ok("map/disconnect", Value::Null).await["resumeToken"]
        .as_str()
        .unwrap()
        .to_owned();
    c.close().await;

    let mut d = WsClient::connect(&url).await;
    let e = d
        .err(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": "client", "resumeToken": token}),
        )
        .await;
    assert_eq!(e["code"], json!(-32602), "{e}");
    assert!(
        e["data"]["details"]["reason"]
            .as_str()
            .unwrap()
            .contains("system session"),
        "{e}"
    );
    // Without a type, the session's own is taken.
    let r = d
        .ok(
            "map/connect",
            json!({"protocolVersion": 1, "resumeToken": token}),
        )
        .await;
    assert_eq!(r["reconnected"], json!(true), "{r}");
    assert_eq!(r["participantType"], json!("system"));
    assert_eq!(r["participantId"], json!(pid));
}

#[tokio::test]
async fn resume_by_session_id_of_a_detached_session() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::client(&url).await;
    let (sid, pid) = (c.sid(), c.pid());
    // While attached, a sessionId alone does not take the session.
    let mut spy = WsClient::connect(&url).await;
    let r = spy.ok("map/connect", json!({"sessionId": sid})).await;
    assert_ne!(r["sessionId"], json!(sid));
    assert_eq!(r["reconnected"], json!(false));

    c.ok("map/disconnect", Value::Null).await;
    let mut d = WsClient::connect(&url).await;
    let r = d.ok("map/connect", json!({"sessionId": sid})).await;
    assert_eq!(r["sessionId"], json!(sid));
    assert_eq!(r["participantId"], json!(pid));
    assert_eq!(r["reconnected"], json!(true));
}

#[tokio::test]
async fn a_token_of_an_attached_session_takes_it_over_and_closes_the_old_connection_with_4000() {
    let (_server, url) = default_server().await;
    let mut old = WsClient::client(&url).await;
    let token = old.session["resumeToken"].as_str().unwrap().to_owned();
    let mut new = WsClient::connect(&url).await;
    let r = new.ok("map/connect", json!({"resumeToken": token})).await;
    assert_eq!(r["sessionId"], json!(old.sid()));
    assert_eq!(r["reconnected"], json!(true));
    assert_eq!(old.expect_close().await, Some(4000));
    new.ok("map/agents/list", Value::Null).await;
}

#[tokio::test]
async fn after_a_transport_loss_the_connect_token_resumes_and_reclaims_the_agents() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["agent_orphaned"]}))
        .await;
    let a = WsClient::agent(&url, "lost-1", json!({"role": "worker"})).await;
    let (sid, pid) = (a.sid(), a.pid());
    let token = a.session["resumeToken"].as_str().unwrap().to_owned();
    a.drop_abruptly();
    // Wait until the router noticed the loss.
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["data"]["agentId"], json!("lost-1"));

    let mut b = WsClient::connect(&url).await;
    let r = b
        .ok(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": "agent", "resumeToken": token}),
        )
        .await;
    assert_eq!(
        r["sessionId"],
        json!(sid),
        "resumed with the token from connect: {r}"
    );
    assert_eq!(r["participantId"], json!(pid));
    assert_eq!(r["reconnected"], json!(true));
    assert_eq!(r["ownedAgents"], json!(["lost-1"]));
    let reclaimed = &r["reclaimedAgents"];
    assert_eq!(ids(reclaimed), vec!["lost-1"]);
    assert_eq!(reclaimed[0]["state"], json!("registered"));
    assert_eq!(reclaimed[0]["ownerId"], json!(pid));
    assert_eq!(reclaimed[0]["role"], json!("worker"));
}

#[tokio::test]
async fn resume_by_session_id_after_a_transport_loss_reclaims_only_the_requested_agents() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["agent_orphaned"]}))
        .await;
    let mut a = WsClient::agent(&url, "keep-1", json!({})).await;
    a.register_agent(json!({"agentId": "keep-2"})).await;
    let sid = a.sid();
    a.drop_abruptly();
    obs.next_event(&sub).await;
    obs.next_event(&sub).await;

    let mut b = WsClient::connect(&url).await;
    let r = b
        .ok(
            "map/connect",
            json!({"participantType": "agent", "sessionId": sid, "reclaimAgents": ["keep-2"]}),
        )
        .await;
    assert_eq!(r["sessionId"], json!(sid));
    assert_eq!(ids(&r["reclaimedAgents"]), vec!["keep-2"]);
    b.session = r;
    let list = b.ok("map/agents/list", Value::Null).await["agents"].clone();
    let state_of = |id: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|a| a["id"] == json!(id))
            .map(|a| (a["state"].clone(), a["ownerId"].clone()))
            .unwrap()
    };
    assert_eq!(state_of("keep-1"), (json!("orphaned"), Value::Null));
    assert_eq!(state_of("keep-2"), (json!("registered"), json!(b.pid())));
}

#[tokio::test]
async fn an_expired_token_starts_a_new_session() {
    let (_server, url) = start_server(|c| c.router.resume_window_ms = 150).await;
    let mut c = WsClient::client(&url).await;
    let sid = c.sid();
    let token = c.ok("map/disconnect", Value::Null).await["resumeToken"]
        .as_str()
        .unwrap()
        .to_owned();
    tokio::time::sleep(std::time::Duration::from_millis(450)).await;
    let mut d = WsClient::connect(&url).await;
    let r = d.ok("map/connect", json!({"resumeToken": token})).await;
    assert_eq!(r["reconnected"], json!(false));
    assert_ne!(r["sessionId"], json!(sid));
    // The session id is no longer resumable either.
    let mut e = WsClient::connect(&url).await;
    let r = e.ok("map/connect", json!({"sessionId": sid})).await;
    assert_ne!(r["sessionId"], json!(sid));
}

#[tokio::test]
async fn disconnect_unregisters_owned_agents_children_first() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut a = WsClient::agent(&url, "dc-parent", json!({})).await;
    a.ok(
        "map/agents/spawn",
        json!({"agentId": "dc-child", "parent": "dc-parent"}),
    )
    .await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["participant_disconnected", "agent_unregistered"]}))
        .await;
    let pid = a.pid();
    a.ok("map/disconnect", Value::Null).await;
    let disc = obs.next_event(&sub).await;
    assert_eq!(disc["event"]["type"], json!("participant_disconnected"));
    assert_eq!(disc["event"]["data"]["participantId"], json!(pid));
    assert_eq!(disc["event"]["data"]["participantType"], json!("agent"));
    assert_eq!(disc["event"]["source"], json!(pid));
    let first = obs.next_event(&sub).await;
    let second = obs.next_event(&sub).await;
    for (ev, id) in [(&first, "dc-child"), (&second, "dc-parent")] {
        assert_eq!(ev["event"]["type"], json!("agent_unregistered"));
        assert_eq!(
            ev["event"]["data"],
            json!({"agentId": id, "reason": "owner_disconnected"})
        );
        assert_eq!(ev["causedBy"], json!([disc["eventId"]]));
        assert_eq!(ev["event"]["causedBy"], json!([disc["eventId"]]));
    }
    assert_eq!(
        without_as_of(&obs.ok("map/agents/list", Value::Null).await),
        json!({"agents": []})
    );
}

#[tokio::test]
async fn disconnect_policy_orphan_keeps_the_agents_orphaned() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut a = WsClient::agent(&url, "orph-1", json!({})).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["agent_orphaned"]}))
        .await;
    let pid = a.pid();
    a.ok(
        "map/disconnect",
        json!({"policy": {"agentBehavior": "orphan"}}),
    )
    .await;
    let ev = obs.next_event(&sub).await;
    assert_eq!(
        ev["event"]["data"],
        json!({"agentId": "orph-1", "previousOwner": pid})
    );
    let got = obs.ok("map/agents/get", json!({"agentId": "orph-1"})).await;
    assert_eq!(got["agent"]["state"], json!("orphaned"));
    assert_eq!(got["agent"]["ownerId"], Value::Null);
}

#[tokio::test]
async fn the_disconnect_policy_from_connect_applies() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["agent_orphaned", "agent_unregistered"]}))
        .await;
    let mut a = WsClient::connect_as(
        &url,
        "agent",
        json!({"disconnectPolicy": {"agentBehavior": "orphan"}}),
    )
    .await;
    a.register_agent(json!({"agentId": "pol-orphan"})).await;
    a.ok("map/disconnect", Value::Null).await;
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["type"], json!("agent_orphaned"));
    assert_eq!(ev["event"]["data"]["agentId"], json!("pol-orphan"));
    // `orphan` has no deadline: nothing unregisters it.
    obs.assert_no_event(&sub).await;

    let mut b = WsClient::connect_as(
        &url,
        "agent",
        json!({"disconnectPolicy": {"agentBehavior": "grace-period", "gracePeriodMs": 100}}),
    )
    .await;
    b.register_agent(json!({"agentId": "pol-grace"})).await;
    b.ok("map/disconnect", Value::Null).await;
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["type"], json!("agent_orphaned"));
    assert_eq!(ev["event"]["data"]["agentId"], json!("pol-grace"));
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["type"], json!("agent_unregistered"));
    assert_eq!(
        ev["event"]["data"],
        json!({"agentId": "pol-grace", "reason": "owner_disconnected"})
    );
    // An explicit policy on disconnect overrides the one from connect.
    let mut c = WsClient::connect_as(
        &url,
        "agent",
        json!({"disconnectPolicy": {"agentBehavior": "orphan"}}),
    )
    .await;
    c.register_agent(json!({"agentId": "pol-override"})).await;
    c.ok(
        "map/disconnect",
        json!({"policy": {"agentBehavior": "unregister"}}),
    )
    .await;
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["type"], json!("agent_unregistered"));
    assert_eq!(ev["event"]["data"]["agentId"], json!("pol-override"));
}
