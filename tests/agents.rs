//! Agent methods (docs/compatibility.md §4): register, spawn, unregister, update, stop,
//! suspend, resume, list, get, structure graph, control checks and visibility.

mod common;

use common::*;
use serde_json::{json, Value};

fn not_found(id: &str) -> Value {
    map_error(2001, &format!("Agent not found: {id}"), "routing")
}

fn state_invalid(action: &str, state: &str) -> Value {
    map_error(
        3001,
        &format!("Cannot {action} agent in state: {state}"),
        "agent",
    )
}

#[tokio::test]
async fn register_without_id_uses_the_participant_id_for_the_first_agent() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::connect_as(&url, "agent", json!({"name": "ag"})).await;
    let pid = a.pid();
    let first = a
        .register_agent(json!({"name": "w", "role": "worker"}))
        .await;
    assert_eq!(first["id"], json!(pid));
    assert_eq!(first["ownerId"], json!(pid));
    assert_eq!(first["state"], json!("registered"));
    assert_eq!(first["scopes"], json!([]));
    assert_eq!(first["name"], json!("w"));
    assert_eq!(first["role"], json!("worker"));
    assert!(first["lifecycle"]["createdAt"]
        .as_u64()
        .is_some_and(|t| t > 0));
    assert!(
        first.get("visibility").is_none(),
        "absent visibility means public: {first}"
    );
    let second = a.register_agent(json!({})).await;
    assert_ne!(second["id"], json!(pid));
    assert!(second["id"].as_str().is_some_and(|s| !s.is_empty()));
    // A system participant registering without an id gets a generated one.
    let mut s = WsClient::system(&url).await;
    let sys_agent = s.register_agent(json!({})).await;
    assert_ne!(sys_agent["id"], json!(s.pid()));
}

#[tokio::test]
async fn register_honours_agent_id_parent_scopes_visibility_and_metadata() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut a = WsClient::agent(&url, "reg-parent", json!({})).await;
    a.ok("map/scopes/create", json!({"scopeId": "reg-s1"}))
        .await;
    a.ok("map/scopes/create", json!({"scopeId": "reg-s2"}))
        .await;
    let sub = obs.subscribe(Value::Null).await;
    let agent = a
        .register_agent(json!({
            "agentId": "reg-child",
            "name": "child",
            "description": "does things",
            "role": "worker",
            "parent": "reg-parent",
            "scopes": ["reg-s1", "reg-s2"],
            "visibility": "public",
            "metadata": {"k": "v"},
            "environment": {"os": {"type": "linux"}},
            "capabilityDescriptor": {"tags": ["t1"]}
        }))
        .await;
    assert_eq!(agent["id"], json!("reg-child"));
    assert_eq!(agent["parent"], json!("reg-parent"));
    assert_eq!(agent["description"], json!("does things"));
    assert_eq!(agent["scopes"], json!(["reg-s1", "reg-s2"]));
    assert_eq!(agent["visibility"], json!("public"));
    assert_eq!(agent["metadata"], json!({"k": "v"}));
    assert_eq!(agent["environment"], json!({"os": {"type": "linux"}}));
    assert_eq!(agent["capabilityDescriptor"], json!({"tags": ["t1"]}));
    assert_eq!(agent["ownerId"], json!(a.pid()));

    let reg = obs.next_event(&sub).await;
    assert_eq!(reg["event"]["type"], json!("agent_registered"));
    assert_eq!(reg["event"]["source"], json!("reg-child"));
    let data = &reg["event"]["data"];
    assert_eq!(data["agentId"], json!("reg-child"));
    assert_eq!(data["name"], json!("child"));
    assert_eq!(data["role"], json!("worker"));
    assert_eq!(data["ownerId"], json!(a.pid()));
    for scope in ["reg-s1", "reg-s2"] {
        let joined = obs.next_event(&sub).await;
        assert_eq!(joined["event"]["type"], json!("scope_member_joined"));
        assert_eq!(
            joined["event"]["data"],
            json!({"scopeId": scope, "agentId": "reg-child"})
        );
        assert_eq!(joined["causedBy"], json!([reg["eventId"]]));
    }
    // The parent now lists the child.
    let parent = a
        .ok("map/agents/get", json!({"agentId": "reg-parent"}))
        .await;
    assert_eq!(parent["agent"]["children"], json!(["reg-child"]));
}

#[tokio::test]
async fn register_errors_3000_2001_2002_1003() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "taken", json!({})).await;
    assert_eq!(
        a.err("map/agents/register", json!({"agentId": "taken"}))
            .await,
        map_error(3000, "Agent already exists: taken", "agent")
    );
    let mut b = WsClient::connect_as(&url, "agent", json!({})).await;
    assert_eq!(
        b.err("map/agents/register", json!({"agentId": "taken"}))
            .await,
        map_error(3000, "Agent already exists: taken", "agent")
    );
    assert_eq!(
        b.err(
            "map/agents/register",
            json!({"agentId": "x1", "parent": "ghost"})
        )
        .await,
        not_found("ghost")
    );
    assert_eq!(
        b.err(
            "map/agents/register",
            json!({"agentId": "x2", "scopes": ["nos"]})
        )
        .await,
        map_error(2002, "Scope not found: nos", "routing")
    );
    assert_invalid_params(
        &b.err(
            "map/agents/register",
            json!({"agentId": "x3", "visibility": "secret"}),
        )
        .await,
    );
    let mut c = WsClient::client(&url).await;
    assert_eq!(
        c.err("map/agents/register", json!({"agentId": "x4"})).await,
        map_error(1003, "Permission denied: lifecycle.canRegister", "auth")
    );
    // None of the failed registrations left an agent behind.
    assert_eq!(
        ids(&c.ok("map/agents/list", Value::Null).await["agents"]),
        vec!["taken"]
    );
}

#[tokio::test]
async fn spawn_creates_a_child_of_the_callers_agent_and_sends_the_initial_message() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "sp-parent", json!({})).await;
    let r = a
        .ok(
            "map/agents/spawn",
            json!({
                "agentId": "sp-child",
                "parent": "sp-parent",
                "role": "helper",
                "initialMessage": {"payload": {"task": "go"}, "meta": {"priority": "high"}}
            }),
        )
        .await;
    assert_eq!(r["agent"]["id"], json!("sp-child"));
    assert_eq!(r["agent"]["parent"], json!("sp-parent"));
    assert_eq!(r["agent"]["ownerId"], json!(a.pid()));
    assert_eq!(r["agent"]["role"], json!("helper"));
    let message_id = r["messageId"].as_str().expect("messageId").to_owned();
    // The child is owned by the spawner's session: the message arrives on this connection.
    let msg = a.next_message().await;
    assert_eq!(msg["id"], json!(message_id));
    assert_eq!(msg["from"], json!("sp-parent"));
    assert_eq!(msg["to"], json!({"agent": "sp-child"}));
    assert_eq!(msg["payload"], json!({"task": "go"}));
    assert_eq!(msg["meta"]["priority"], json!("high"));
    // Without initialMessage there is no messageId and no message.
    let r = a
        .ok(
            "map/agents/spawn",
            json!({"agentId": "sp-child2", "parent": "sp-parent"}),
        )
        .await;
    assert!(r.get("messageId").is_none(), "{r}");
    a.assert_no_message().await;
}

#[tokio::test]
async fn spawn_errors() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "spe-a", json!({})).await;
    let mut b = WsClient::agent(&url, "spe-b", json!({})).await;
    assert_invalid_params(&a.err("map/agents/spawn", json!({"agentId": "c1"})).await);
    assert_eq!(
        a.err(
            "map/agents/spawn",
            json!({"agentId": "c2", "parent": "ghost"})
        )
        .await,
        not_found("ghost")
    );
    let denied = b
        .err(
            "map/agents/spawn",
            json!({"agentId": "c3", "parent": "spe-a"}),
        )
        .await;
    assert_eq!(denied["code"], json!(1003), "{denied}");
    assert_eq!(denied["data"]["category"], json!("auth"));
    assert_eq!(
        a.err(
            "map/agents/spawn",
            json!({"agentId": "spe-b", "parent": "spe-a"})
        )
        .await,
        map_error(3000, "Agent already exists: spe-b", "agent")
    );
    let mut c = WsClient::client(&url).await;
    assert_eq!(
        c.err("map/agents/spawn", json!({"parent": "spe-a"})).await,
        map_error(1003, "Permission denied: lifecycle.canSpawn", "auth")
    );
    assert_eq!(
        sorted_strings(&json!(ids(
            &c.ok("map/agents/list", Value::Null).await["agents"]
        ))),
        strings(&["spe-a", "spe-b"])
    );
}

#[tokio::test]
async fn unregister_removes_the_agent_leaves_its_scopes_and_keeps_children() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut a = WsClient::agent(&url, "un-p", json!({})).await;
    a.ok("map/scopes/create", json!({"scopeId": "un-s"})).await;
    a.ok(
        "map/scopes/join",
        json!({"scopeId": "un-s", "agentId": "un-p"}),
    )
    .await;
    a.ok(
        "map/agents/spawn",
        json!({"agentId": "un-c", "parent": "un-p"}),
    )
    .await;
    let sub = obs.subscribe(Value::Null).await;
    let r = a
        .ok(
            "map/agents/unregister",
            json!({"agentId": "un-p", "reason": "done"}),
        )
        .await;
    assert_eq!(r["unregistered"], json!(true));
    assert_eq!(r["agent"]["id"], json!("un-p"));
    let gone = obs.next_event(&sub).await;
    assert_eq!(gone["event"]["type"], json!("agent_unregistered"));
    assert_eq!(
        gone["event"]["data"],
        json!({"agentId": "un-p", "reason": "done"})
    );
    let left = obs.next_event(&sub).await;
    assert_eq!(left["event"]["type"], json!("scope_member_left"));
    assert_eq!(
        left["event"]["data"],
        json!({"scopeId": "un-s", "agentId": "un-p"})
    );
    assert_eq!(left["causedBy"], json!([gone["eventId"]]));
    assert_eq!(
        obs.err("map/agents/get", json!({"agentId": "un-p"})).await,
        not_found("un-p")
    );
    let child = obs.ok("map/agents/get", json!({"agentId": "un-c"})).await;
    assert_eq!(child["agent"]["state"], json!("registered"));
    assert_eq!(
        obs.ok("map/scopes/members", json!({"scopeId": "un-s"}))
            .await["members"],
        json!([])
    );
    assert_eq!(
        a.err("map/agents/unregister", json!({"agentId": "un-p"}))
            .await,
        not_found("un-p")
    );
}

#[tokio::test]
async fn control_is_required_for_update_and_unregister() {
    let (_server, url) = default_server().await;
    let mut owner = WsClient::agent(&url, "ctl-root", json!({})).await;
    let mut other = WsClient::agent(&url, "ctl-other", json!({})).await;
    owner
        .ok("map/scopes/create", json!({"scopeId": "ctl-scope"}))
        .await;
    other
        .ok("map/scopes/create", json!({"scopeId": "ctl-scope2"}))
        .await;
    for (method, params) in [
        ("map/agents/unregister", json!({"agentId": "ctl-root"})),
        (
            "map/agents/update",
            json!({"agentId": "ctl-root", "state": "busy"}),
        ),
        (
            "map/scopes/join",
            json!({"scopeId": "ctl-scope", "agentId": "ctl-root"}),
        ),
        (
            "map/scopes/leave",
            json!({"scopeId": "ctl-scope", "agentId": "ctl-root"}),
        ),
    ] {
        let e = other.err(method, params).await;
        assert_eq!(e["code"], json!(1003), "{method}: {e}");
        assert_eq!(e["data"]["category"], json!("auth"));
    }
    // The creator of a scope may add any agent to it.
    other
        .ok(
            "map/scopes/join",
            json!({"scopeId": "ctl-scope2", "agentId": "ctl-root"}),
        )
        .await;
    // The owner of an ancestor controls the descendants, even when another session owns them.
    other
        .register_agent(json!({"agentId": "ctl-grandchild", "parent": "ctl-root"}))
        .await;
    let r = owner
        .ok(
            "map/agents/update",
            json!({"agentId": "ctl-grandchild", "state": "idle"}),
        )
        .await;
    assert_eq!(r["agent"]["state"], json!("idle"));
    // ... but not the other way round.
    let e = other
        .err(
            "map/agents/update",
            json!({"agentId": "ctl-root", "metadata": {"a": 1}}),
        )
        .await;
    assert_eq!(e["code"], json!(1003));
    // A system participant controls everything.
    let mut sys = WsClient::system(&url).await;
    sys.ok(
        "map/agents/update",
        json!({"agentId": "ctl-root", "state": "busy"}),
    )
    .await;
    let r = sys
        .ok("map/agents/unregister", json!({"agentId": "ctl-other"}))
        .await;
    assert_eq!(r["unregistered"], json!(true));
}

#[tokio::test]
async fn update_state_metadata_and_environment_emit_their_events() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut a = WsClient::agent(
        &url,
        "up-1",
        json!({"metadata": {"a": 1}, "environment": {"os": "linux"}}),
    )
    .await;
    // agent.metadata.changed is a vendor type: named (docs/compatibility.md §7).
    let sub = obs
        .subscribe(json!({"eventTypes": ["*", "agent.metadata.changed"]}))
        .await;

    let r = a
        .ok(
            "map/agents/update",
            json!({"agentId": "up-1", "state": "busy"}),
        )
        .await;
    assert_eq!(r["agent"]["state"], json!("busy"));
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["type"], json!("agent_state_changed"));
    assert_eq!(ev["event"]["source"], json!("up-1"));
    assert_eq!(ev["event"]["data"]["agentId"], json!("up-1"));
    assert_eq!(ev["event"]["data"]["previousState"], json!("registered"));
    assert_eq!(ev["event"]["data"]["newState"], json!("busy"));

    // The same state again: no event.
    a.ok(
        "map/agents/update",
        json!({"agentId": "up-1", "state": "busy"}),
    )
    .await;
    let r = a
        .ok(
            "map/agents/update",
            json!({"agentId": "up-1", "metadata": {"b": 2}}),
        )
        .await;
    assert_eq!(r["agent"]["metadata"], json!({"a": 1, "b": 2}));
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["type"], json!("agent.metadata.changed"));
    assert_eq!(
        ev["event"]["data"],
        json!({"agentId": "up-1", "changes": {"b": 2}, "metadata": {"a": 1, "b": 2}})
    );

    let r = a
        .ok(
            "map/agents/update",
            json!({"agentId": "up-1", "environment": {"os": "macos", "arch": "arm64"}}),
        )
        .await;
    assert_eq!(
        r["agent"]["environment"],
        json!({"os": "macos", "arch": "arm64"})
    );
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["type"], json!("agent_environment_changed"));
    assert_eq!(
        ev["event"]["data"],
        json!({
            "agentId": "up-1",
            "environment": {"os": "macos", "arch": "arm64"},
            "previousEnvironment": {"os": "linux"}
        })
    );

    // Custom x- states are accepted; unknown states and `orphaned` are not.
    let r = a
        .ok(
            "map/agents/update",
            json!({"agentId": "up-1", "state": "x-thinking"}),
        )
        .await;
    assert_eq!(r["agent"]["state"], json!("x-thinking"));
    assert_invalid_params(
        &a.err(
            "map/agents/update",
            json!({"agentId": "up-1", "state": "orphaned"}),
        )
        .await,
    );
    assert_invalid_params(
        &a.err(
            "map/agents/update",
            json!({"agentId": "up-1", "state": "sleeping"}),
        )
        .await,
    );
    assert_eq!(
        a.err(
            "map/agents/update",
            json!({"agentId": "ghost", "state": "idle"})
        )
        .await,
        not_found("ghost")
    );
}

#[tokio::test]
async fn nothing_leaves_stopped_but_metadata_may_still_change() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "st-1", json!({})).await;
    let r = a
        .ok(
            "map/agents/update",
            json!({"agentId": "st-1", "state": "stopped"}),
        )
        .await;
    assert_eq!(r["agent"]["state"], json!("stopped"));
    assert!(r["agent"]["lifecycle"]["stoppedAt"].is_u64());
    for state in ["idle", "active", "registered"] {
        assert_eq!(
            a.err(
                "map/agents/update",
                json!({"agentId": "st-1", "state": state})
            )
            .await,
            state_invalid("update", "stopped")
        );
    }
    let r = a
        .ok(
            "map/agents/update",
            json!({"agentId": "st-1", "metadata": {"result": "ok"}}),
        )
        .await;
    assert_eq!(r["agent"]["metadata"], json!({"result": "ok"}));
    assert_eq!(r["agent"]["state"], json!("stopped"));
    // Stopping, suspending or resuming a stopped agent is 3001 too.
    assert_eq!(
        a.err("map/agents/stop", json!({"agentId": "st-1"})).await,
        state_invalid("stop", "stopped")
    );
    assert_eq!(
        a.err("map/agents/suspend", json!({"agentId": "st-1"}))
            .await,
        state_invalid("suspend", "stopped")
    );
    assert_eq!(
        a.err("map/agents/resume", json!({"agentId": "st-1"})).await,
        state_invalid("resume", "stopped")
    );
}

#[tokio::test]
async fn stop_moves_to_stopping_and_tells_the_agent() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut a = WsClient::agent(&url, "stop-1", json!({})).await;
    let sub = obs.subscribe(Value::Null).await;
    let r = obs
        .ok(
            "map/agents/stop",
            json!({"agentId": "stop-1", "reason": "maintenance"}),
        )
        .await;
    assert_eq!(r["stopping"], json!(true));
    assert_eq!(r["agent"]["state"], json!("stopping"));
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["type"], json!("agent_state_changed"));
    assert_eq!(ev["event"]["data"]["previousState"], json!("registered"));
    assert_eq!(ev["event"]["data"]["newState"], json!("stopping"));

    let msg = a.next_message().await;
    assert_eq!(msg["from"], json!("system"));
    assert_eq!(msg["to"], json!({"agent": "stop-1"}));
    assert!(msg["id"].is_string() && msg["timestamp"].is_u64(), "{msg}");
    assert_eq!(
        msg["payload"],
        json!({"control": "stop", "agentId": "stop-1", "reason": "maintenance", "force": false})
    );
    assert_eq!(msg["meta"]["priority"], json!("urgent"));
    assert_eq!(msg["meta"]["_meta"]["mapRouter"]["control"], json!("stop"));

    // Control messages emit no message events.
    obs.ok("map/agents/list", Value::Null).await;
    obs.assert_no_event(&sub).await;

    // Stopping a stopping agent succeeds unchanged, with no new state event.
    let r = obs
        .ok("map/agents/stop", json!({"agentId": "stop-1"}))
        .await;
    assert_eq!(r, json!({"stopping": true, "agent": r["agent"]}));
    assert_eq!(r["agent"]["state"], json!("stopping"));
    obs.assert_no_event(&sub).await;
    assert_eq!(
        obs.err("map/agents/stop", json!({"agentId": "ghost"}))
            .await,
        not_found("ghost")
    );
}

#[tokio::test]
async fn force_stop_stops_then_unregisters() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut a = WsClient::agent(&url, "fs-1", json!({})).await;
    let sub = obs.subscribe(Value::Null).await;
    let r = obs
        .ok("map/agents/stop", json!({"agentId": "fs-1", "force": true}))
        .await;
    assert_eq!(r["stopping"], json!(true));
    assert_eq!(r["agent"]["state"], json!("stopped"));
    let changed = obs.next_event(&sub).await;
    assert_eq!(changed["event"]["type"], json!("agent_state_changed"));
    assert_eq!(
        changed["event"]["data"]["previousState"],
        json!("registered")
    );
    assert_eq!(changed["event"]["data"]["newState"], json!("stopped"));
    let gone = obs.next_event(&sub).await;
    assert_eq!(gone["event"]["type"], json!("agent_unregistered"));
    assert_eq!(
        gone["event"]["data"],
        json!({"agentId": "fs-1", "reason": "stopped"})
    );
    let msg = a.next_message().await;
    assert_eq!(msg["payload"]["control"], json!("stop"));
    assert_eq!(msg["payload"]["force"], json!(true));
    assert_eq!(
        obs.err("map/agents/get", json!({"agentId": "fs-1"})).await,
        not_found("fs-1")
    );
}

#[tokio::test]
async fn suspend_and_resume_restore_the_previous_state() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut a = WsClient::agent(&url, "sus-1", json!({})).await;
    a.ok(
        "map/agents/update",
        json!({"agentId": "sus-1", "state": "busy"}),
    )
    .await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["agent_state_changed"]}))
        .await;

    let r = obs
        .ok(
            "map/agents/suspend",
            json!({"agentId": "sus-1", "reason": "pause"}),
        )
        .await;
    assert_eq!(r["suspended"], json!(true));
    assert_eq!(r["agent"]["state"], json!("suspended"));
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["data"]["previousState"], json!("busy"));
    assert_eq!(ev["event"]["data"]["newState"], json!("suspended"));
    let msg = a.next_message().await;
    assert_eq!(msg["from"], json!("system"));
    assert_eq!(
        msg["payload"],
        json!({"control": "suspend", "agentId": "sus-1", "reason": "pause"})
    );
    assert_eq!(
        msg["meta"]["_meta"]["mapRouter"]["control"],
        json!("suspend")
    );

    assert_eq!(
        obs.err("map/agents/suspend", json!({"agentId": "sus-1"}))
            .await,
        state_invalid("suspend", "suspended")
    );

    let r = obs
        .ok("map/agents/resume", json!({"agentId": "sus-1"}))
        .await;
    assert_eq!(r["resumed"], json!(true));
    assert_eq!(r["agent"]["state"], json!("busy"));
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["data"]["previousState"], json!("suspended"));
    assert_eq!(ev["event"]["data"]["newState"], json!("busy"));
    let msg = a.next_message().await;
    assert_eq!(
        msg["payload"],
        json!({"control": "resume", "agentId": "sus-1"})
    );
    assert_eq!(
        obs.err("map/agents/resume", json!({"agentId": "sus-1"}))
            .await,
        state_invalid("resume", "busy")
    );
    // A stopping agent cannot be suspended.
    obs.ok("map/agents/stop", json!({"agentId": "sus-1"})).await;
    assert_eq!(
        obs.err("map/agents/suspend", json!({"agentId": "sus-1"}))
            .await,
        state_invalid("suspend", "stopping")
    );
}

#[tokio::test]
async fn suspending_an_orphaned_agent_is_3001() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["agent_orphaned"]}))
        .await;
    let a = WsClient::agent(&url, "sus-orph", json!({})).await;
    a.drop_abruptly();
    obs.next_event(&sub).await;
    assert_eq!(
        obs.err("map/agents/suspend", json!({"agentId": "sus-orph"}))
            .await,
        state_invalid("suspend", "orphaned")
    );
}

#[tokio::test]
async fn lifecycle_calls_need_can_stop() {
    let (_server, url) = default_server().await;
    let _a = WsClient::agent(&url, "lc-1", json!({})).await;
    let mut g = WsClient::connect_as(&url, "gateway", json!({})).await;
    for method in ["map/agents/stop", "map/agents/suspend", "map/agents/resume"] {
        assert_eq!(
            g.err(method, json!({"agentId": "lc-1"})).await,
            map_error(1003, "Permission denied: lifecycle.canStop", "auth"),
            "{method}"
        );
    }
    let mut narrowed = WsClient::connect_as(
        &url,
        "client",
        json!({"capabilities": {"lifecycle": {"canStop": false}}}),
    )
    .await;
    assert_eq!(
        narrowed
            .err("map/agents/stop", json!({"agentId": "lc-1"}))
            .await,
        map_error(1003, "Permission denied: lifecycle.canStop", "auth")
    );
}

#[tokio::test]
async fn list_honours_every_filter_field() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "lf-root", json!({"role": "boss"})).await;
    let mut b = WsClient::connect_as(&url, "agent", json!({})).await;
    a.ok("map/scopes/create", json!({"scopeId": "lf-s"})).await;
    a.register_agent(json!({
        "agentId": "lf-w1", "role": "worker", "parent": "lf-root", "scopes": ["lf-s"],
        "capabilityDescriptor": {
            "capabilities": [{"id": "summarize"}],
            "tags": ["fast", "cheap"],
            "accepts": ["text/plain"]
        }
    }))
    .await;
    b.register_agent(json!({
        "agentId": "lf-w2", "role": "worker", "parent": "lf-w1",
        "persistentIdentity": {"persistentId": "pid-xyz", "identityType": "keypair"},
        "capabilityDescriptor": {"accepts": [{"contentType": "application/json"}], "tags": ["slow"]}
    }))
    .await;
    b.ok(
        "map/agents/update",
        json!({"agentId": "lf-w2", "state": "busy"}),
    )
    .await;
    let mut c = WsClient::client(&url).await;
    let list = |filter: Value| json!({ "filter": filter });
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (json!({}), vec!["lf-root", "lf-w1", "lf-w2"]),
        (json!({"states": ["busy"]}), vec!["lf-w2"]),
        (
            json!({"states": ["busy", "registered"]}),
            vec!["lf-root", "lf-w1", "lf-w2"],
        ),
        (json!({"states": []}), vec!["lf-root", "lf-w1", "lf-w2"]),
        (json!({"roles": ["worker"]}), vec!["lf-w1", "lf-w2"]),
        (json!({"roles": ["boss", "nobody"]}), vec!["lf-root"]),
        (json!({"scopes": ["lf-s"]}), vec!["lf-w1"]),
        (json!({"parent": "lf-root"}), vec!["lf-w1"]),
        (json!({"hasChildren": true}), vec!["lf-root", "lf-w1"]),
        (json!({"hasChildren": false}), vec!["lf-w2"]),
        (json!({"ownerId": b.pid()}), vec!["lf-w2"]),
        (json!({"ownerId": a.pid()}), vec!["lf-root", "lf-w1"]),
        (json!({"capabilityId": "summarize"}), vec!["lf-w1"]),
        (json!({"tags": ["cheap", "slow"]}), vec!["lf-w1", "lf-w2"]),
        (json!({"tags": ["slow"]}), vec!["lf-w2"]),
        (json!({"accepts": "text/plain"}), vec!["lf-w1"]),
        (json!({"accepts": "application/json"}), vec!["lf-w2"]),
        (json!({"persistentId": "pid-xyz"}), vec!["lf-w2"]),
        (
            json!({"roles": ["worker"], "states": ["registered"]}),
            vec!["lf-w1"],
        ),
        (
            json!({"roles": ["worker"], "parent": "lf-root", "states": ["busy"]}),
            vec![],
        ),
    ];
    for (filter, expected) in cases {
        let r = c.ok("map/agents/list", list(filter.clone())).await;
        assert_eq!(ids(&r["agents"]), expected, "filter {filter}");
        assert!(
            r.get("nextCursor").is_none(),
            "no limit: no cursor ({filter})"
        );
    }
}

#[tokio::test]
async fn list_paginates_with_an_opaque_cursor_in_registration_order() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::connect_as(&url, "agent", json!({})).await;
    let names = ["pg-e", "pg-a", "pg-d", "pg-b", "pg-c"];
    for id in names {
        a.register_agent(json!({"agentId": id})).await;
    }
    let mut c = WsClient::client(&url).await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0..10 {
        let mut params = json!({"limit": 2});
        if let Some(cur) = &cursor {
            params["cursor"] = json!(cur);
        }
        let r = c.ok("map/agents/list", params).await;
        let got = ids(&r["agents"]);
        assert!(got.len() <= 2, "page {page}: {r}");
        seen.extend(got);
        match r.get("nextCursor") {
            Some(next) => cursor = Some(next.as_str().expect("cursor string").to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, names);
    assert_invalid_params(&c.err("map/agents/list", json!({"limit": 0})).await);
    // The last full page does not pretend there is more.
    let r = c.ok("map/agents/list", json!({"limit": 5})).await;
    assert_eq!(ids(&r["agents"]), names);
    assert!(r.get("nextCursor").is_none(), "{r}");
}

#[tokio::test]
async fn get_includes_relatives_with_max_depth() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "g-root", json!({})).await;
    for (id, parent) in [
        ("g-a", "g-root"),
        ("g-b", "g-root"),
        ("g-a1", "g-a"),
        ("g-a1x", "g-a1"),
    ] {
        a.register_agent(json!({"agentId": id, "parent": parent}))
            .await;
    }
    let mut c = WsClient::client(&url).await;
    let bare = c.ok("map/agents/get", json!({"agentId": "g-a"})).await;
    assert_eq!(bare["agent"]["children"], json!(["g-a1"]));
    for key in ["parent", "children", "siblings", "ancestors", "descendants"] {
        assert!(bare.get(key).is_none(), "{key} only when included: {bare}");
    }
    let leaf = c.ok("map/agents/get", json!({"agentId": "g-b"})).await;
    assert!(
        leaf["agent"].get("children").is_none(),
        "no children key: {leaf}"
    );

    let r = c
        .ok(
            "map/agents/get",
            json!({"agentId": "g-a1", "include": {
                "parent": true, "children": true, "siblings": true,
                "ancestors": true, "descendants": true
            }}),
        )
        .await;
    assert_eq!(r["agent"]["id"], json!("g-a1"));
    assert_eq!(r["parent"]["id"], json!("g-a"));
    assert_eq!(ids(&r["children"]), vec!["g-a1x"]);
    assert_eq!(ids(&r["siblings"]), Vec::<String>::new());
    assert_eq!(
        sorted_strings(&json!(ids(&r["ancestors"]))),
        strings(&["g-a", "g-root"])
    );
    assert_eq!(ids(&r["descendants"]), vec!["g-a1x"]);

    let r = c
        .ok(
            "map/agents/get",
            json!({"agentId": "g-a", "include": {"siblings": true}}),
        )
        .await;
    assert_eq!(ids(&r["siblings"]), vec!["g-b"]);

    let r = c
        .ok(
            "map/agents/get",
            json!({"agentId": "g-root", "include": {"descendants": true, "maxDepth": 1}}),
        )
        .await;
    assert_eq!(
        sorted_strings(&json!(ids(&r["descendants"]))),
        strings(&["g-a", "g-b"])
    );
    let r = c
        .ok(
            "map/agents/get",
            json!({"agentId": "g-root", "include": {"descendants": true}}),
        )
        .await;
    assert_eq!(
        sorted_strings(&json!(ids(&r["descendants"]))),
        strings(&["g-a", "g-a1", "g-a1x", "g-b"])
    );
    let r = c
        .ok(
            "map/agents/get",
            json!({"agentId": "g-a1x", "include": {"ancestors": true, "maxDepth": 2}}),
        )
        .await;
    assert_eq!(
        sorted_strings(&json!(ids(&r["ancestors"]))),
        strings(&["g-a", "g-a1"])
    );
    assert_eq!(
        c.err("map/agents/get", json!({"agentId": "nope"})).await,
        not_found("nope")
    );
}

#[tokio::test]
async fn structure_graph_has_parent_child_and_relationship_edges() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "gr-root", json!({})).await;
    a.register_agent(json!({"agentId": "gr-a", "parent": "gr-root"}))
        .await;
    a.register_agent(json!({
        "agentId": "gr-b", "parent": "gr-root",
        "relationships": [{"type": "peer", "agentId": "gr-a"}]
    }))
    .await;
    a.register_agent(json!({"agentId": "gr-a1", "parent": "gr-a"}))
        .await;
    let mut c = WsClient::client(&url).await;
    let edge = |from: &str, to: &str, kind: &str| json!({"from": from, "to": to, "type": kind});
    let sort_edges = |v: &Value| {
        let mut e: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.to_string())
            .collect();
        e.sort();
        e
    };
    let g = c.ok("map/structure/graph", Value::Null).await;
    assert_eq!(
        sorted_strings(&json!(ids(&g["nodes"]))),
        strings(&["gr-a", "gr-a1", "gr-b", "gr-root"])
    );
    assert_eq!(
        sort_edges(&g["edges"]),
        sort_edges(&json!([
            edge("gr-root", "gr-a", "parent-child"),
            edge("gr-root", "gr-b", "parent-child"),
            edge("gr-a", "gr-a1", "parent-child"),
            edge("gr-b", "gr-a", "peer"),
        ]))
    );
    let g = c
        .ok(
            "map/structure/graph",
            json!({"includeRelationships": false}),
        )
        .await;
    assert_eq!(g["edges"].as_array().unwrap().len(), 3);
    let g = c
        .ok(
            "map/structure/graph",
            json!({"rootAgentId": "gr-a", "depth": 1}),
        )
        .await;
    assert_eq!(
        sorted_strings(&json!(ids(&g["nodes"]))),
        strings(&["gr-a", "gr-a1"])
    );
    assert_eq!(g["edges"], json!([edge("gr-a", "gr-a1", "parent-child")]));
    let g = c
        .ok(
            "map/structure/graph",
            json!({"rootAgentId": "gr-root", "depth": 1}),
        )
        .await;
    assert_eq!(
        sorted_strings(&json!(ids(&g["nodes"]))),
        strings(&["gr-a", "gr-b", "gr-root"])
    );
    assert_eq!(
        c.err("map/structure/graph", json!({"rootAgentId": "ghost"}))
            .await,
        not_found("ghost")
    );
    assert_invalid_params(&c.err("map/structure/graph", json!({"depth": 0})).await);
}

#[tokio::test]
async fn hidden_agents_are_invisible_to_others_in_get_list_graph_and_events() {
    let (_server, url) = default_server().await;
    let mut viewer = WsClient::connect_as(&url, "agent", json!({})).await;
    viewer
        .register_agent(json!({"agentId": "vis-viewer"}))
        .await;
    let sub = viewer
        .subscribe(json!({"eventTypes": ["agent_registered"]}))
        .await;
    let mut sys = WsClient::system(&url).await;
    let sys_sub = sys
        .subscribe(json!({"eventTypes": ["agent_registered"]}))
        .await;
    let mut owner = WsClient::agent(&url, "vis-parent", json!({})).await;
    owner
        .register_agent(
            json!({"agentId": "vis-po", "parent": "vis-parent", "visibility": "parent-only"}),
        )
        .await;
    owner
        .register_agent(json!({"agentId": "vis-sys", "visibility": "system"}))
        .await;
    owner
        .register_agent(json!({"agentId": "vis-pub", "visibility": "public"}))
        .await;

    // Events: the viewer sees vis-parent and vis-pub only, in order.
    let first = viewer.next_event(&sub).await;
    assert_eq!(first["event"]["data"]["agentId"], json!("vis-parent"));
    let second = viewer.next_event(&sub).await;
    assert_eq!(second["event"]["data"]["agentId"], json!("vis-pub"));
    assert_eq!(
        second["sequenceNumber"],
        json!(2),
        "no hidden event in between"
    );
    viewer.assert_no_event(&sub).await;
    // The system participant sees everything.
    let mut sys_seen = Vec::new();
    for _ in 0..4 {
        sys_seen.push(sys.next_event(&sys_sub).await["event"]["data"]["agentId"].clone());
    }
    assert_eq!(
        sys_seen,
        vec![
            json!("vis-parent"),
            json!("vis-po"),
            json!("vis-sys"),
            json!("vis-pub")
        ]
    );

    // get / list / graph.
    for hidden in ["vis-po", "vis-sys"] {
        assert_eq!(
            viewer
                .err("map/agents/get", json!({"agentId": hidden}))
                .await,
            not_found(hidden)
        );
        // Acting on it is "not found" too (existence does not leak).
        assert_eq!(
            viewer
                .err("map/agents/stop", json!({"agentId": hidden}))
                .await,
            not_found(hidden)
        );
    }
    let listed = ids(&viewer.ok("map/agents/list", Value::Null).await["agents"]);
    assert_eq!(listed, vec!["vis-viewer", "vis-parent", "vis-pub"]);
    let graph = viewer.ok("map/structure/graph", Value::Null).await;
    assert_eq!(
        ids(&graph["nodes"]),
        vec!["vis-viewer", "vis-parent", "vis-pub"]
    );
    let parent = viewer
        .ok(
            "map/agents/get",
            json!({"agentId": "vis-parent", "include": {"children": true}}),
        )
        .await;
    assert_eq!(parent["children"], json!([]), "hidden child not included");
    // The owner and the system participant see them.
    let listed = ids(&owner.ok("map/agents/list", Value::Null).await["agents"]);
    assert_eq!(
        listed,
        vec!["vis-viewer", "vis-parent", "vis-po", "vis-pub"]
    );
    assert_eq!(
        ids(&sys.ok("map/agents/list", Value::Null).await["agents"]).len(),
        5
    );
    // A message to a hidden agent: not found.
    assert_eq!(
        viewer
            .err(
                "map/send",
                json!({"to": {"agent": "vis-sys"}, "payload": 1})
            )
            .await,
        not_found("vis-sys")
    );
}

#[tokio::test]
async fn parent_only_agents_are_visible_to_the_parents_owner() {
    let (_server, url) = default_server().await;
    let mut parent_owner = WsClient::agent(&url, "po-parent", json!({})).await;
    let mut child_owner = WsClient::agent(&url, "po-other", json!({})).await;
    child_owner
        .register_agent(
            json!({"agentId": "po-child", "parent": "po-parent", "visibility": "parent-only"}),
        )
        .await;
    let r = parent_owner
        .ok("map/agents/get", json!({"agentId": "po-child"}))
        .await;
    assert_eq!(r["agent"]["visibility"], json!("parent-only"));
    let mut stranger = WsClient::client(&url).await;
    assert_eq!(
        stranger
            .err("map/agents/get", json!({"agentId": "po-child"}))
            .await,
        not_found("po-child")
    );
}

#[tokio::test]
async fn scope_visibility_shows_agents_to_participants_sharing_a_scope() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "sv-a", json!({})).await;
    a.ok("map/scopes/create", json!({"scopeId": "sv-s"})).await;
    a.register_agent(json!({"agentId": "sv-hidden", "visibility": "scope", "scopes": ["sv-s"]}))
        .await;
    let mut member = WsClient::agent(&url, "sv-member", json!({"scopes": ["sv-s"]})).await;
    let mut outsider = WsClient::agent(&url, "sv-out", json!({})).await;
    member
        .ok("map/agents/get", json!({"agentId": "sv-hidden"}))
        .await;
    assert_eq!(
        outsider
            .err("map/agents/get", json!({"agentId": "sv-hidden"}))
            .await,
        not_found("sv-hidden")
    );
    let members = outsider
        .ok("map/scopes/members", json!({"scopeId": "sv-s"}))
        .await;
    assert_eq!(
        members["members"],
        json!(["sv-member"]),
        "hidden member filtered"
    );
}

#[tokio::test]
async fn presence_follows_the_connection_not_the_registration() {
    let (_server, url) = default_server().await;
    let mut watcher = WsClient::system(&url).await;
    let sub = watcher
        .subscribe(json!({"eventTypes": ["agent.presence.changed"]}))
        .await;
    let before = map_router::protocol::ids::now_ms();
    let a = WsClient::agent(&url, "p1", json!({})).await;
    let got = watcher.ok("map/agents/get", json!({"agentId": "p1"})).await;
    assert_eq!(
        got["agent"]["_meta"]["mapRouter"]["presence"]["status"],
        json!("online"),
        "{got}"
    );
    assert!(
        got["agent"]["_meta"]["mapRouter"]["presence"]["since"]
            .as_u64()
            .unwrap()
            >= before
    );
    assert!(
        got["agent"]["_meta"]["mapRouter"]["presence"]
            .get("lastSeen")
            .is_none(),
        "{got}"
    );
    // Registration is its own event: no presence event for it.
    watcher.assert_no_event(&sub).await;

    a.drop_abruptly();
    let ev = watcher.next_event(&sub).await;
    assert_eq!(ev["event"]["data"]["agentId"], json!("p1"));
    assert_eq!(ev["event"]["data"]["status"], json!("offline"));
    let last_seen = ev["event"]["data"]["lastSeen"].as_u64().unwrap();
    assert!(last_seen >= before);
    // Still registered, and offline.
    let got = watcher.ok("map/agents/get", json!({"agentId": "p1"})).await;
    assert_eq!(got["agent"]["state"], json!("orphaned"));
    assert_eq!(
        got["agent"]["_meta"]["mapRouter"]["presence"]["status"],
        json!("offline")
    );
    assert_eq!(
        got["agent"]["_meta"]["mapRouter"]["presence"]["lastSeen"],
        json!(last_seen)
    );

    // Re-registering the id (what the SDK's reconnect does) brings it back online.
    let _a = WsClient::agent(&url, "p1", json!({})).await;
    let ev = watcher.next_event(&sub).await;
    assert_eq!(ev["event"]["data"]["status"], json!("online"));
    let got = watcher.ok("map/agents/get", json!({"agentId": "p1"})).await;
    assert_eq!(
        got["agent"]["_meta"]["mapRouter"]["presence"]["status"],
        json!("online")
    );
}
