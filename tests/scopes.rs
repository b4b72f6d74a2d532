//! Scopes (docs/compatibility.md §5): create, get, list, join, leave, members, delete, their
//! events, visibility and errors.

mod common;

use common::*;
use serde_json::{json, Value};

fn scope_not_found(id: &str) -> Value {
    map_error(2002, &format!("Scope not found: {id}"), "routing")
}

#[tokio::test]
async fn create_stores_every_field_and_emits_scope_created() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut a = WsClient::agent(&url, "sc-a", json!({})).await;
    let sub = obs.subscribe(Value::Null).await;
    let spec = json!({
        "scopeId": "team",
        "name": "Team",
        "description": "the team",
        "joinPolicy": "open",
        "autoJoinRoles": ["worker"],
        "visibility": "public",
        "messageVisibility": "public",
        "sendPolicy": "members",
        "persistent": true,
        "autoDelete": false,
        "metadata": {"k": 1}
    });
    let r = a.ok("map/scopes/create", spec).await;
    assert_eq!(
        r["scope"],
        json!({
            "id": "team",
            "name": "Team",
            "description": "the team",
            "joinPolicy": "open",
            "autoJoinRoles": ["worker"],
            "visibility": "public",
            "messageVisibility": "public",
            "sendPolicy": "members",
            "persistent": true,
            "autoDelete": false,
            "metadata": {"k": 1}
        })
    );
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["type"], json!("scope_created"));
    assert_eq!(ev["event"]["source"], json!("sc-a"));
    assert_eq!(ev["event"]["data"]["scopeId"], json!("team"));
    assert_eq!(ev["event"]["data"]["name"], json!("Team"));

    let child = a
        .ok(
            "map/scopes/create",
            json!({"scopeId": "team-sub", "parent": "team"}),
        )
        .await;
    assert_eq!(child["scope"]["parent"], json!("team"));
    let ev = obs.next_event(&sub).await;
    assert_eq!(
        ev["event"]["data"],
        json!({"scopeId": "team-sub", "parent": "team"})
    );
    // Without scopeId an id is generated.
    let gen = a.ok("map/scopes/create", json!({"name": "anon"})).await;
    assert!(gen["scope"]["id"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(
        a.ok("map/scopes/get", json!({"scopeId": "team"})).await["scope"]["metadata"],
        json!({"k": 1})
    );
}

#[tokio::test]
async fn create_errors() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "sce-a", json!({})).await;
    a.ok("map/scopes/create", json!({"scopeId": "dup"})).await;
    assert_invalid_params(&a.err("map/scopes/create", json!({"scopeId": "dup"})).await);
    assert_eq!(
        a.err(
            "map/scopes/create",
            json!({"scopeId": "orphan", "parent": "ghost"})
        )
        .await,
        scope_not_found("ghost")
    );
    assert_invalid_params(
        &a.err(
            "map/scopes/create",
            json!({"scopeId": "bad", "visibility": "secret"}),
        )
        .await,
    );
    let mut c = WsClient::client(&url).await;
    assert_eq!(
        c.err("map/scopes/create", json!({"scopeId": "c"})).await,
        map_error(1003, "Permission denied: scopes.canCreateScopes", "auth")
    );
    assert_eq!(
        c.err("map/scopes/delete", json!({"scopeId": "dup"})).await,
        map_error(1003, "Permission denied: scopes.canManageScopes", "auth")
    );
    let listed = c.ok("map/scopes/list", Value::Null).await;
    assert_eq!(
        listed["scopes"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
}

#[tokio::test]
async fn get_and_list_with_parent() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "sl-a", json!({})).await;
    for (id, parent) in [
        ("root1", None),
        ("root2", None),
        ("r1-a", Some("root1")),
        ("r1-b", Some("root1")),
        ("r1-a-x", Some("r1-a")),
    ] {
        let mut p = json!({"scopeId": id});
        if let Some(parent) = parent {
            p["parent"] = json!(parent);
        }
        a.ok("map/scopes/create", p).await;
    }
    let mut c = WsClient::client(&url).await;
    let scope_ids = |v: &Value| ids(&v["scopes"]);
    assert_eq!(
        scope_ids(&c.ok("map/scopes/list", Value::Null).await),
        vec!["root1", "root2", "r1-a", "r1-b", "r1-a-x"]
    );
    assert_eq!(
        scope_ids(&c.ok("map/scopes/list", json!({"parent": "root1"})).await),
        vec!["r1-a", "r1-b"]
    );
    assert_eq!(
        scope_ids(&c.ok("map/scopes/list", json!({"parent": "r1-a"})).await),
        vec!["r1-a-x"]
    );
    assert_eq!(
        scope_ids(&c.ok("map/scopes/list", json!({"parent": "root2"})).await),
        Vec::<String>::new()
    );
    assert_eq!(
        c.ok("map/scopes/get", json!({"scopeId": "r1-a"})).await,
        json!({"scope": {"id": "r1-a", "parent": "root1"}})
    );
    assert_eq!(
        c.err("map/scopes/get", json!({"scopeId": "nope"})).await,
        scope_not_found("nope")
    );
}

#[tokio::test]
async fn join_and_leave_emit_events_once_and_are_idempotent() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut a = WsClient::agent(&url, "jl-a", json!({"role": "worker"})).await;
    a.ok("map/scopes/create", json!({"scopeId": "jl-s"})).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["scope_member_joined", "scope_member_left"]}))
        .await;

    let r = a
        .ok(
            "map/scopes/join",
            json!({"scopeId": "jl-s", "agentId": "jl-a"}),
        )
        .await;
    assert_eq!(r["joined"], json!(true));
    assert_eq!(r["scope"]["id"], json!("jl-s"));
    assert_eq!(r["agent"]["id"], json!("jl-a"));
    assert_eq!(r["agent"]["scopes"], json!(["jl-s"]));
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["type"], json!("scope_member_joined"));
    assert_eq!(ev["event"]["source"], json!("jl-a"));
    assert_eq!(
        ev["event"]["data"],
        json!({"scopeId": "jl-s", "agentId": "jl-a"})
    );

    // Joining again succeeds without an event.
    let again = a
        .ok(
            "map/scopes/join",
            json!({"scopeId": "jl-s", "agentId": "jl-a"}),
        )
        .await;
    assert_eq!(again["joined"], json!(true));
    assert_eq!(again["agent"]["scopes"], json!(["jl-s"]));

    let r = a
        .ok(
            "map/scopes/leave",
            json!({"scopeId": "jl-s", "agentId": "jl-a"}),
        )
        .await;
    assert_eq!(r["left"], json!(true));
    assert_eq!(r["agent"]["scopes"], json!([]));
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["type"], json!("scope_member_left"));
    assert_eq!(
        ev["sequenceNumber"],
        json!(2),
        "the second join made no event"
    );
    assert_eq!(
        ev["event"]["data"],
        json!({"scopeId": "jl-s", "agentId": "jl-a"})
    );
    let again = a
        .ok(
            "map/scopes/leave",
            json!({"scopeId": "jl-s", "agentId": "jl-a"}),
        )
        .await;
    assert_eq!(again["left"], json!(true));
    obs.assert_no_event(&sub).await;

    assert_eq!(
        a.err(
            "map/scopes/join",
            json!({"scopeId": "ghost", "agentId": "jl-a"})
        )
        .await,
        scope_not_found("ghost")
    );
    assert_eq!(
        a.err(
            "map/scopes/join",
            json!({"scopeId": "jl-s", "agentId": "ghost"})
        )
        .await,
        map_error(2001, "Agent not found: ghost", "routing")
    );
    assert_eq!(
        a.err(
            "map/scopes/leave",
            json!({"scopeId": "ghost", "agentId": "jl-a"})
        )
        .await,
        scope_not_found("ghost")
    );
    assert_eq!(
        a.err(
            "map/scopes/leave",
            json!({"scopeId": "jl-s", "agentId": "ghost"})
        )
        .await,
        map_error(2001, "Agent not found: ghost", "routing")
    );
    assert_invalid_params(&a.err("map/scopes/join", json!({"scopeId": "jl-s"})).await);
}

#[tokio::test]
async fn members_are_sorted_and_paginated() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::connect_as(&url, "agent", json!({})).await;
    a.ok("map/scopes/create", json!({"scopeId": "mem"})).await;
    for id in ["m-d", "m-b", "m-e", "m-a", "m-c"] {
        a.register_agent(json!({"agentId": id, "scopes": ["mem"]}))
            .await;
    }
    let mut c = WsClient::client(&url).await;
    assert_eq!(
        c.ok("map/scopes/members", json!({"scopeId": "mem"})).await,
        json!({"members": ["m-a", "m-b", "m-c", "m-d", "m-e"]})
    );
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0..10 {
        let mut p = json!({"scopeId": "mem", "limit": 2});
        if let Some(cur) = &cursor {
            p["cursor"] = json!(cur);
        }
        let r = c.ok("map/scopes/members", p).await;
        let got = r["members"].as_array().unwrap().clone();
        assert!(got.len() <= 2, "page {page}: {r}");
        seen.extend(got);
        match r.get("nextCursor") {
            Some(n) => cursor = Some(n.as_str().unwrap().to_owned()),
            None => break,
        }
    }
    assert_eq!(json!(seen), json!(["m-a", "m-b", "m-c", "m-d", "m-e"]));
    assert_eq!(
        c.err("map/scopes/members", json!({"scopeId": "ghost"}))
            .await,
        scope_not_found("ghost")
    );
    assert_invalid_params(
        &c.err("map/scopes/members", json!({"scopeId": "mem", "limit": 0}))
            .await,
    );
}

#[tokio::test]
async fn delete_needs_delete_descendants_for_child_scopes_and_emits_left_events() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let mut a = WsClient::agent(&url, "del-a", json!({})).await;
    a.register_agent(json!({"agentId": "del-b"})).await;
    a.ok("map/scopes/create", json!({"scopeId": "del-p"})).await;
    a.ok(
        "map/scopes/create",
        json!({"scopeId": "del-c", "parent": "del-p"}),
    )
    .await;
    a.ok(
        "map/scopes/join",
        json!({"scopeId": "del-p", "agentId": "del-a"}),
    )
    .await;
    a.ok(
        "map/scopes/join",
        json!({"scopeId": "del-c", "agentId": "del-b"}),
    )
    .await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["scope_deleted", "scope_member_left"]}))
        .await;

    assert_invalid_params(
        &a.err("map/scopes/delete", json!({"scopeId": "del-p"}))
            .await,
    );
    // Nothing was deleted.
    a.ok("map/scopes/get", json!({"scopeId": "del-c"})).await;

    let r = a
        .ok(
            "map/scopes/delete",
            json!({"scopeId": "del-p", "deleteDescendants": true}),
        )
        .await;
    assert_eq!(r["deleted"], json!(true));
    assert_eq!(r["scope"]["id"], json!("del-p"));
    assert_eq!(r["deletedDescendants"], json!(["del-c"]));

    let deleted = obs.next_event(&sub).await;
    assert_eq!(deleted["event"]["type"], json!("scope_deleted"));
    assert_eq!(
        deleted["event"]["data"],
        json!({"scopeId": "del-p", "deletedDescendants": ["del-c"]})
    );
    let mut left = Vec::new();
    for _ in 0..2 {
        let ev = obs.next_event(&sub).await;
        assert_eq!(ev["event"]["type"], json!("scope_member_left"));
        assert_eq!(ev["causedBy"], json!([deleted["eventId"]]));
        left.push(ev["event"]["data"].clone());
    }
    left.sort_by_key(|v| v.to_string());
    assert_eq!(
        json!(left),
        json!([
            {"scopeId": "del-p", "agentId": "del-a"},
            {"scopeId": "del-c", "agentId": "del-b"}
        ])
    );
    obs.assert_no_event(&sub).await;
    for id in ["del-p", "del-c"] {
        assert_eq!(
            a.err("map/scopes/get", json!({"scopeId": id})).await,
            scope_not_found(id)
        );
    }
    let agent = a.ok("map/agents/get", json!({"agentId": "del-b"})).await;
    assert_eq!(agent["agent"]["scopes"], json!([]));
    assert_eq!(
        a.err("map/scopes/delete", json!({"scopeId": "del-p"}))
            .await,
        scope_not_found("del-p")
    );

    // A leaf scope needs no flag and reports no descendants.
    a.ok("map/scopes/create", json!({"scopeId": "leaf"})).await;
    let r = a.ok("map/scopes/delete", json!({"scopeId": "leaf"})).await;
    assert_eq!(r["deleted"], json!(true));
    assert!(r.get("deletedDescendants").is_none(), "{r}");
    let ev = obs.next_event(&sub).await;
    assert_eq!(ev["event"]["data"], json!({"scopeId": "leaf"}));
}

#[tokio::test]
async fn members_and_system_scopes_are_invisible_to_outsiders() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "vs-a", json!({})).await;
    a.ok(
        "map/scopes/create",
        json!({"scopeId": "vs-members", "visibility": "members"}),
    )
    .await;
    a.ok(
        "map/scopes/create",
        json!({"scopeId": "vs-system", "visibility": "system"}),
    )
    .await;
    a.ok("map/scopes/create", json!({"scopeId": "vs-public"}))
        .await;
    // `members` visibility: only participants owning a member (and the creator) see it; the
    // creator adds another participant's agent.
    let mut b = WsClient::agent(&url, "vs-b", json!({})).await;
    assert_eq!(
        b.err("map/scopes/get", json!({"scopeId": "vs-members"}))
            .await,
        scope_not_found("vs-members")
    );
    a.ok(
        "map/scopes/join",
        json!({"scopeId": "vs-members", "agentId": "vs-b"}),
    )
    .await;
    let mut out = WsClient::client(&url).await;
    assert_eq!(
        ids(&out.ok("map/scopes/list", Value::Null).await["scopes"]),
        vec!["vs-public"]
    );
    for id in ["vs-members", "vs-system"] {
        assert_eq!(
            out.err("map/scopes/get", json!({"scopeId": id})).await,
            scope_not_found(id)
        );
        assert_eq!(
            out.err("map/scopes/members", json!({"scopeId": id})).await,
            scope_not_found(id)
        );
    }
    // A member's owner sees the members scope; the creator sees what it created; a system
    // participant sees all.
    assert_eq!(
        ids(&b.ok("map/scopes/list", Value::Null).await["scopes"]),
        vec!["vs-members", "vs-public"]
    );
    assert_eq!(
        ids(&a.ok("map/scopes/list", Value::Null).await["scopes"]),
        vec!["vs-members", "vs-system", "vs-public"]
    );
    let mut sys = WsClient::system(&url).await;
    assert_eq!(
        ids(&sys.ok("map/scopes/list", Value::Null).await["scopes"]),
        vec!["vs-members", "vs-system", "vs-public"]
    );
}

#[tokio::test]
async fn the_creator_of_a_members_scope_can_add_its_first_member() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "cr-a", json!({})).await;
    a.ok(
        "map/scopes/create",
        json!({"scopeId": "cr-private", "visibility": "members"}),
    )
    .await;
    assert_eq!(
        a.ok("map/scopes/get", json!({"scopeId": "cr-private"}))
            .await["scope"]["id"],
        json!("cr-private")
    );
    let joined = a
        .ok(
            "map/scopes/join",
            json!({"scopeId": "cr-private", "agentId": "cr-a"}),
        )
        .await;
    assert_eq!(joined["joined"], json!(true));
    assert_eq!(joined["agent"]["scopes"], json!(["cr-private"]));
    let mut other = WsClient::client(&url).await;
    assert_eq!(
        other
            .err("map/scopes/get", json!({"scopeId": "cr-private"}))
            .await,
        scope_not_found("cr-private")
    );
}
