//! The authorization matrix: for every kind of viewer (the owner, the owner of a parent, an
//! agent sharing a scope, an unrelated agent, a client, a system participant) and every kind
//! of target (public, parent-only, scope-visible, system-only, hidden by the system's exposure
//! config), the expected allow or deny on every path: `map/agents/list`, `map/agents/get`,
//! `map/structure/graph`, `map/scopes/members`, live events, `map/replay`, `map/send`, and the
//! lifecycle and steering calls. The expectations are written out as tables here, not derived
//! from the router's code. Zero leaks: no event a viewer receives, live or replayed, even
//! mentions a target it may not see.
//!
//! Also: scope visibility, join and send policies; `acceptsFrom` role rules; hidden event
//! types; capability overrides per participant type; `map/permissions/update`.

mod common;

use common::*;
use serde_json::{json, Value};

/// Viewers, in table order.
const VIEWERS: [&str; 6] = ["owner", "parent", "mate", "stranger", "client", "system"];
/// Targets, in table order.
const TARGETS: [&str; 5] = ["t-pub", "t-po", "t-sc", "t-hid", "internal-x"];

/// Who sees which target (rows: VIEWERS, columns: TARGETS).
const SEES: [[bool; 5]; 6] = [
    // pub   po     sc     hid    internal
    [true, true, true, false, false], // owner (system-only and exposure-hidden: not even it)
    [true, true, false, false, false], // owner of the parent
    [true, false, true, false, false], // owns an agent in the same scope
    [true, false, false, false, false], // unrelated agent
    [true, false, false, false, false], // client
    [true, true, true, true, true],   // system
];

/// Who may suspend/resume/inject: `Ok` allowed, `Err(code)` refused with that code.
const LIFECYCLE: [[Result<(), i64>; 5]; 6] = [
    [Ok(()), Ok(()), Ok(()), Err(2001), Err(2001)],
    [Err(1003), Ok(()), Err(2001), Err(2001), Err(2001)], // controls po through its parent
    [Err(1003), Err(2001), Err(1003), Err(2001), Err(2001)],
    [Err(1003), Err(2001), Err(2001), Err(2001), Err(2001)],
    [Ok(()), Err(2001), Err(2001), Err(2001), Err(2001)], // clients are operators by default
    [Ok(()), Ok(()), Ok(()), Ok(()), Ok(())],
];

const CONFIG: &str = r#"
[permissions.exposure.agents]
hidden = ["internal-*"]
[permissions.exposure.scopes]
hidden = ["secret-*"]
"#;

struct World {
    /// One connection per viewer, in VIEWERS order, each with an unfiltered subscription.
    viewers: Vec<(WsClient, String)>,
}

async fn world(url: &str) -> World {
    let mut viewers = Vec::new();
    for v in VIEWERS {
        let mut c = match v {
            "client" => WsClient::client(url).await,
            "system" => WsClient::system(url).await,
            _ => WsClient::connect_as(url, "agent", json!({})).await,
        };
        let sub = c.subscribe(Value::Null).await;
        viewers.push((c, sub));
    }
    let idx = |name: &str| VIEWERS.iter().position(|v| *v == name).unwrap();
    let sys = idx("system");
    viewers[sys]
        .0
        .ok("map/scopes/create", json!({"scopeId": "s-team"}))
        .await;
    viewers[idx("parent")]
        .0
        .register_agent(json!({"agentId": "lead"}))
        .await;
    viewers[idx("mate")]
        .0
        .register_agent(json!({"agentId": "mate", "scopes": ["s-team"]}))
        .await;
    viewers[idx("stranger")]
        .0
        .register_agent(json!({"agentId": "stranger"}))
        .await;
    let owner = &mut viewers[idx("owner")].0;
    owner.register_agent(json!({"agentId": "t-pub"})).await;
    owner
        .register_agent(json!({"agentId": "t-po", "visibility": "parent-only", "parent": "lead"}))
        .await;
    owner
        .register_agent(json!({"agentId": "t-sc", "visibility": "scope", "scopes": ["s-team"]}))
        .await;
    owner
        .register_agent(json!({"agentId": "t-hid", "visibility": "system"}))
        .await;
    owner.register_agent(json!({"agentId": "internal-x"})).await;
    // A state change and a message per target (by the system participant, who sees them all).
    for t in TARGETS {
        let sys = &mut viewers[sys].0;
        sys.ok("map/agents/update", json!({"agentId": t, "state": "busy"}))
            .await;
        sys.send(json!({"agent": t}), json!({"for": t})).await;
    }
    World { viewers }
}

fn mentions(event: &Value, id: &str) -> bool {
    event.to_string().contains(&format!("\"{id}\""))
}

/// Events received (live) so far, for a viewer: reads until the marker.
async fn live_events(c: &mut WsClient, sub: &str, marker: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for _ in 0..10_000 {
        let ev = c.next_event(sub).await;
        let done = ev["event"]["data"]["scopeId"] == json!(marker);
        out.push(ev["event"].clone());
        if done {
            return out;
        }
    }
    panic!("no marker");
}

async fn replay_all(c: &mut WsClient) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for _ in 0..100 {
        let mut params = json!({"limit": 1000});
        if let Some(last) = out.last() {
            params["afterEventId"] = last["id"].clone();
        }
        let r = c.ok("map/replay", params).await;
        out.extend(
            r["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["event"].clone()),
        );
        if r["hasMore"] != json!(true) {
            return out;
        }
    }
    panic!("replay did not end");
}

#[tokio::test]
async fn every_path_shows_exactly_what_each_viewer_may_see() {
    let (_server, url) = start_server(|c| {
        c.permissions = toml::from_str::<toml::Value>(CONFIG).unwrap()["permissions"]
            .clone()
            .try_into()
            .unwrap();
    })
    .await;
    let mut w = world(&url).await;
    // A public marker scope ends every viewer's live stream of the setup.
    let sys = VIEWERS.len() - 1;
    w.viewers[sys]
        .0
        .ok("map/scopes/create", json!({"scopeId": "s-marker"}))
        .await;

    for (vi, viewer) in VIEWERS.iter().enumerate() {
        let (c, sub) = &mut w.viewers[vi];
        let live = live_events(c, sub, "s-marker").await;
        let replayed = replay_all(c).await;
        let listed = ids(&c.ok("map/agents/list", Value::Null).await["agents"]);
        let graph = c.ok("map/structure/graph", Value::Null).await;
        let graph_ids = ids(&graph["nodes"]);
        let members = c
            .ok("map/scopes/members", json!({"scopeId": "s-team"}))
            .await["members"]
            .clone();
        for (ti, target) in TARGETS.iter().enumerate() {
            let sees = SEES[vi][ti];
            let at = format!("{viewer} / {target}");
            assert_eq!(
                listed.contains(&target.to_string()),
                sees,
                "agents/list: {at}"
            );
            assert_eq!(graph_ids.contains(&target.to_string()), sees, "graph: {at}");
            match c.call("map/agents/get", json!({"agentId": target})).await {
                Ok(r) => {
                    assert!(sees, "agents/get leaks: {at}");
                    assert_eq!(r["agent"]["id"], json!(target));
                }
                Err(e) => {
                    assert!(!sees, "agents/get refused: {at}: {e}");
                    assert_eq!(e["code"], json!(2001), "{at}: {e}");
                }
            }
            if *target == "t-sc" {
                assert_eq!(
                    members.as_array().unwrap().contains(&json!(target)),
                    sees,
                    "scopes/members: {at}"
                );
            }
            for (path, events) in [("live", &live), ("replay", &replayed)] {
                let about: Vec<&Value> = events.iter().filter(|e| mentions(e, target)).collect();
                if sees {
                    for kind in [
                        "agent_registered",
                        "agent_state_changed",
                        "message_delivered",
                    ] {
                        assert!(
                            about.iter().any(|e| e["type"] == json!(kind)),
                            "{path}: {at} misses {kind}"
                        );
                    }
                } else {
                    assert!(about.is_empty(), "{path} leaks {at}: {about:?}");
                }
            }
        }
    }

    // Sending to each target, then the lifecycle and steering calls.
    for (vi, viewer) in VIEWERS.iter().enumerate() {
        for (ti, target) in TARGETS.iter().enumerate() {
            let at = format!("{viewer} / {target}");
            let c = &mut w.viewers[vi].0;
            match c
                .call("map/send", json!({"to": {"agent": target}, "payload": 1}))
                .await
            {
                Ok(r) => {
                    assert!(SEES[vi][ti], "send reaches an invisible agent: {at}");
                    assert_eq!(r["delivered"], json!([target]), "{at}");
                }
                Err(e) => {
                    assert!(!SEES[vi][ti], "send refused: {at}: {e}");
                    assert_eq!(e["code"], json!(2001), "{at}: {e}");
                }
            }
            let expected = LIFECYCLE[vi][ti];
            let suspended = c
                .call("map/agents/suspend", json!({"agentId": target}))
                .await;
            match (expected, suspended) {
                (Ok(()), Ok(r)) => {
                    assert_eq!(r["agent"]["state"], json!("suspended"), "{at}");
                    c.ok("map/agents/resume", json!({"agentId": target})).await;
                }
                (Err(code), Err(e)) => assert_eq!(e["code"], json!(code), "suspend {at}: {e}"),
                (want, got) => panic!("suspend {at}: expected {want:?}, got {got:?}"),
            }
            let injected = c
                .call(
                    "map/inject",
                    json!({"agentId": target, "content": "hint", "delivery": "best-effort"}),
                )
                .await;
            match (expected, injected) {
                (Ok(()), Ok(_)) => {}
                (Err(code), Err(e)) => assert_eq!(e["code"], json!(code), "inject {at}: {e}"),
                (want, got) => panic!("inject {at}: expected {want:?}, got {got:?}"),
            }
        }
    }

    // Nothing of the above leaked into a stream either.
    for (vi, viewer) in VIEWERS.iter().enumerate() {
        let (c, _) = &mut w.viewers[vi];
        let replayed = replay_all(c).await;
        for (ti, target) in TARGETS.iter().enumerate() {
            if !SEES[vi][ti] {
                let leaked: Vec<&Value> = replayed.iter().filter(|e| mentions(e, target)).collect();
                assert!(leaked.is_empty(), "{viewer} / {target}: {leaked:?}");
            }
        }
    }
}

#[test]
fn scope_visibility_exposure_join_and_send_policies() {
    // Its future's frame is over 1 MiB in a debug build: it overflowed the 2 MiB test thread.
    on_big_stack(scope_policies);
}

async fn scope_policies() {
    let (_server, url) = start_server(|c| {
        c.permissions = toml::from_str::<toml::Value>(CONFIG).unwrap()["permissions"]
            .clone()
            .try_into()
            .unwrap();
    })
    .await;
    let mut sys = WsClient::system(&url).await;
    let mut member = WsClient::agent(&url, "member", json!({"role": "worker"})).await;
    let mut outsider = WsClient::agent(&url, "outsider", json!({"role": "worker"})).await;
    let mut lead = WsClient::agent(&url, "boss", json!({"role": "lead"})).await;
    let mut client = WsClient::client(&url).await;
    let watch = client
        .subscribe(json!({"eventTypes": ["scope_created"]}))
        .await;
    for (id, extra) in [
        ("s-open", json!({})),
        ("s-members", json!({"visibility": "members"})),
        ("s-system", json!({"visibility": "system"})),
        ("secret-1", json!({})),
        ("s-invite", json!({"joinPolicy": "invite"})),
        (
            "s-role",
            json!({"joinPolicy": "role", "autoJoinRoles": ["lead"]}),
        ),
        ("s-sysjoin", json!({"joinPolicy": "system"})),
        ("s-any", json!({"sendPolicy": "any"})),
    ] {
        let mut params = json!({"scopeId": id});
        merge(&mut params, extra);
        sys.ok("map/scopes/create", params).await;
    }
    sys.ok(
        "map/scopes/join",
        json!({"scopeId": "s-members", "agentId": "member"}),
    )
    .await;

    let listed = |v: &Value| -> Vec<String> {
        let mut out: Vec<String> = v["scopes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect();
        out.sort();
        out
    };
    let all = listed(&sys.ok("map/scopes/list", Value::Null).await);
    assert!(all.contains(&"secret-1".to_owned()) && all.contains(&"s-system".to_owned()));
    let seen_by_member = listed(&member.ok("map/scopes/list", Value::Null).await);
    assert!(seen_by_member.contains(&"s-members".to_owned()));
    for hidden in ["s-system", "secret-1"] {
        assert!(!seen_by_member.contains(&hidden.to_owned()), "{hidden}");
    }
    let seen_by_outsider = listed(&outsider.ok("map/scopes/list", Value::Null).await);
    for hidden in ["s-members", "s-system", "secret-1"] {
        assert!(!seen_by_outsider.contains(&hidden.to_owned()), "{hidden}");
        let e = outsider
            .err("map/scopes/get", json!({"scopeId": hidden}))
            .await;
        assert_eq!(e["code"], json!(2002), "{hidden}: {e}");
    }
    // The client saw scope_created for the scopes it may see, in order, and only those.
    let mut created = Vec::new();
    for _ in 0..5 {
        created.push(client.next_event(&watch).await["event"]["data"]["scopeId"].clone());
    }
    assert_eq!(
        created,
        [
            json!("s-open"),
            json!("s-invite"),
            json!("s-role"),
            json!("s-sysjoin"),
            json!("s-any")
        ]
    );
    client.assert_no_event(&watch).await;

    // joinPolicy.
    let join = |scope: &str, agent: &str| json!({"scopeId": scope, "agentId": agent});
    member.ok("map/scopes/join", join("s-open", "member")).await;
    let e = member
        .err("map/scopes/join", join("s-invite", "member"))
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    sys.ok("map/scopes/join", join("s-invite", "member")).await;
    let e = member
        .err("map/scopes/join", join("s-role", "member"))
        .await;
    assert_eq!(e["code"], json!(1003), "a worker: {e}");
    lead.ok("map/scopes/join", join("s-role", "boss")).await;
    let e = lead.err("map/scopes/join", join("s-sysjoin", "boss")).await;
    assert_eq!(e["code"], json!(1003), "{e}");
    let e = outsider
        .err("map/scopes/join", join("s-open", "member"))
        .await;
    assert_eq!(e["code"], json!(1003), "not its agent: {e}");
    // Registering into a scope obeys the same policy.
    let e = outsider
        .err(
            "map/agents/register",
            json!({"agentId": "o2", "scopes": ["s-invite"]}),
        )
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    let e = outsider
        .err(
            "map/agents/register",
            json!({"agentId": "o3", "scopes": ["secret-1"]}),
        )
        .await;
    assert_eq!(e["code"], json!(2002), "hidden scopes do not exist: {e}");

    // sendPolicy: members (default) and any.
    let r = member.send(json!({"scope": "s-open"}), json!(1)).await;
    assert_eq!(r["delivered"], json!([]), "it is the only member");
    let e = outsider
        .err("map/send", json!({"to": {"scope": "s-open"}, "payload": 1}))
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    outsider
        .ok("map/scopes/join", join("s-any", "outsider"))
        .await;
    member.ok("map/scopes/join", join("s-any", "member")).await;
    let r = lead.send(json!({"scope": "s-any"}), json!(1)).await;
    assert_eq!(
        sorted_strings(&r["delivered"]),
        strings(&["member", "outsider"])
    );
    let e = outsider
        .err(
            "map/send",
            json!({"to": {"scope": "secret-1"}, "payload": 1}),
        )
        .await;
    assert_eq!(e["code"], json!(2002), "{e}");
}

#[tokio::test]
async fn accepts_from_rules_event_type_exposure_and_type_overrides() {
    let (_server, url) = start_server(|c| {
        c.permissions = toml::from_str(
            r#"
client_lifecycle = "controlled"
[exposure]
hidden_event_types = ["agent.metadata.changed"]
[types.client.messaging]
canBroadcast = true
[roles.vault.acceptsFrom]
clients = "none"
agents = "hierarchy"
"#,
        )
        .unwrap();
    })
    .await;
    let mut sys = WsClient::system(&url).await;
    let sys_sub = sys
        .subscribe(json!({"eventTypes": ["*", "agent.metadata.changed"]}))
        .await;
    let mut client = WsClient::client(&url).await;
    let client_sub = client
        .subscribe(json!({"eventTypes": ["*", "agent.metadata.changed"]}))
        .await;
    assert_eq!(
        client.session["capabilities"]["messaging"]["canBroadcast"],
        json!(true),
        "the type override widens the default grant"
    );
    let mut lead = WsClient::agent(&url, "v-lead", json!({})).await;
    lead.register_agent(json!({"agentId": "v-vault", "role": "vault", "parent": "v-lead"}))
        .await;
    let mut other = WsClient::agent(&url, "v-other", json!({})).await;

    // acceptsFrom: its parent yes, a stranger agent no, clients no, system yes.
    lead.send(json!({"agent": "v-vault"}), json!(1)).await;
    let e = other
        .err(
            "map/send",
            json!({"to": {"agent": "v-vault"}, "payload": 1}),
        )
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    let e = client
        .err(
            "map/send",
            json!({"to": {"agent": "v-vault"}, "payload": 1}),
        )
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    sys.send(json!({"agent": "v-vault"}), json!(1)).await;
    // In a broadcast the refusing agent is left out, not an error.
    let r = client.send(json!({"broadcast": true}), json!(1)).await;
    assert_eq!(
        sorted_strings(&r["delivered"]),
        strings(&["v-lead", "v-other"])
    );

    // Hidden event types reach system observers only.
    other
        .ok(
            "map/agents/update",
            json!({"agentId": "v-other", "metadata": {"k": 1}}),
        )
        .await;
    sys.event_of_type(&sys_sub, "agent.metadata.changed").await;
    client
        .assert_none_where("metadata event", |v| {
            v["params"]["subscriptionId"] == json!(client_sub)
                && v["params"]["event"]["type"] == json!("agent.metadata.changed")
        })
        .await;
    let replay = client
        .ok(
            "map/replay",
            json!({"filter": {"eventTypes": ["agent.metadata.changed"]}}),
        )
        .await;
    assert_eq!(replay["events"], json!([]));

    // client_lifecycle = controlled: clients control no agent.
    let e = client
        .err("map/agents/suspend", json!({"agentId": "v-other"}))
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    let e = client
        .err("map/agents/stop", json!({"agentId": "v-other"}))
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
}

#[tokio::test]
async fn permissions_update_is_for_system_and_applies_at_once() {
    let (_server, url) = default_server().await;
    let mut sys = WsClient::system(&url).await;
    let mut client = WsClient::client(&url).await;
    let sub = client.subscribe(Value::Null).await;
    let mut agent = WsClient::agent(&url, "pu-a", json!({})).await;
    let cid = client.pid();

    let e = agent
        .err(
            "map/permissions/update",
            json!({"clientId": cid, "permissions": {"messaging": {"canSend": false}}}),
        )
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    let e = sys
        .err(
            "map/permissions/update",
            json!({"clientId": "nobody", "permissions": {}}),
        )
        .await;
    assert_eq!(e["code"], json!(-32602), "{e}");

    let r = sys
        .ok(
            "map/permissions/update",
            json!({"clientId": cid, "permissions": {"messaging": {"canSend": false}}}),
        )
        .await;
    assert_eq!(r["success"], json!(true));
    assert_eq!(
        r["effectivePermissions"]["messaging"]["canSend"],
        json!(false)
    );
    assert_eq!(
        r["effectivePermissions"]["observation"]["canObserve"],
        json!(true)
    );
    let ev = client
        .event_of_type(&sub, "permissions_client_updated")
        .await;
    let data = &ev["event"]["data"];
    assert_eq!(data["clientId"], json!(cid));
    assert_eq!(data["changedBy"], json!(sys.pid()));
    assert_eq!(data["updatedBy"], json!(sys.pid()));
    let e = client
        .err("map/send", json!({"to": {"agent": "pu-a"}, "payload": 1}))
        .await;
    assert_eq!(e["code"], json!(1003), "the next request: {e}");

    // Revoking observation ends its subscriptions; the next subscribe is refused.
    sys.ok(
        "map/permissions/update",
        json!({"clientId": cid, "permissions": {"observation": {"canObserve": false}}}),
    )
    .await;
    client
        .event_of_type(&sub, "permissions_client_updated")
        .await;
    agent
        .ok(
            "map/agents/update",
            json!({"agentId": "pu-a", "state": "busy"}),
        )
        .await;
    client.assert_no_event(&sub).await;
    let e = client.err("map/subscribe", json!({})).await;
    assert_eq!(e["code"], json!(1003), "{e}");
    // Other participants never saw the change.
    let mut third = WsClient::client(&url).await;
    let r = third
        .ok(
            "map/replay",
            json!({"filter": {"eventTypes": ["permissions_client_updated"]}}),
        )
        .await;
    assert_eq!(r["events"], json!([]));
}

#[tokio::test]
async fn a_message_is_seen_only_by_those_who_see_both_ends() {
    let (_server, url) = default_server().await;
    let mut sys = WsClient::system(&url).await;
    for s in ["m-s1", "m-s2"] {
        sys.ok(
            "map/scopes/create",
            json!({"scopeId": s, "sendPolicy": "any"}),
        )
        .await;
    }
    // `a1` is visible to those sharing m-s1, `b1` to those sharing m-s1 or m-s2.
    let mut a = WsClient::agent(
        &url,
        "a1",
        json!({"visibility": "scope", "scopes": ["m-s1"]}),
    )
    .await;
    let _b = WsClient::agent(
        &url,
        "b1",
        json!({"visibility": "scope", "scopes": ["m-s1", "m-s2"]}),
    )
    .await;
    // `e` shares only m-s2: it sees b1 but not a1.
    let mut e = WsClient::agent(&url, "e1", json!({"scopes": ["m-s2"]})).await;
    let e_sub = e
        .subscribe(json!({"eventTypes": ["message_sent", "message_delivered"]}))
        .await;
    let listed = ids(&e.ok("map/agents/list", Value::Null).await["agents"]);
    assert!(listed.contains(&"b1".to_owned()) && !listed.contains(&"a1".to_owned()));
    let sys_sub = sys
        .subscribe(json!({"eventTypes": ["message_delivered"]}))
        .await;
    a.send(json!({"agent": "b1"}), json!("psst")).await;
    sys.next_event(&sys_sub).await;
    e.assert_no_event(&e_sub).await;
    let r = e
        .ok(
            "map/replay",
            json!({"filter": {"eventTypes": ["message_sent", "message_delivered"]}}),
        )
        .await;
    assert_eq!(r["events"], json!([]), "nor in replay");
}

/// `participant_connected` / `participant_disconnected` name the participant, and the SDK's
/// `AgentConnection` uses its agent's id as the participant id: they must not reveal a hidden
/// agent. The system sees them all.
#[tokio::test]
async fn participant_events_do_not_reveal_hidden_agents() {
    let (_server, url) = start_server(|c| {
        c.permissions = toml::from_str(
            r#"
[exposure.agents]
hidden = ["internal-*"]
"#,
        )
        .unwrap();
    })
    .await;
    let kinds = json!({"eventTypes": ["participant_connected", "participant_disconnected"]});
    let mut sys = WsClient::system(&url).await;
    let sys_sub = sys.subscribe(kinds.clone()).await;
    let mut watcher = WsClient::client(&url).await;
    let sub = watcher.subscribe(kinds).await;
    sys.ok("map/scopes/create", json!({"scopeId": "p-s"})).await;

    // Hidden by exposure: the participant id is the agent id, as with the SDK.
    let mut hidden =
        WsClient::connect_as(&url, "agent", json!({"participantId": "internal-1"})).await;
    assert_eq!(hidden.pid(), "internal-1");
    hidden
        .register_agent(json!({"agentId": "internal-1"}))
        .await;
    // Scope-visible: its disconnect is seen only by those who may see it.
    let mut scoped = WsClient::connect_as(&url, "agent", json!({"participantId": "p-sc"})).await;
    scoped
        .register_agent(json!({"agentId": "p-sc", "visibility": "scope", "scopes": ["p-s"]}))
        .await;
    // A public one, whose events everyone sees (the positive control).
    let open = WsClient::connect_as(&url, "agent", json!({"participantId": "p-open"})).await;
    drop(hidden);
    drop(scoped);
    drop(open);

    let mut seen_by_system = Vec::new();
    for _ in 0..20 {
        if seen_by_system.len() == 6 {
            break;
        }
        let e = sys.next_event(&sys_sub).await;
        let id = e["event"]["data"]["participantId"].clone();
        if ["internal-1", "p-sc", "p-open"]
            .iter()
            .any(|x| id == json!(x))
        {
            seen_by_system.push((e["event"]["type"].clone(), id));
        }
    }
    for id in ["internal-1", "p-sc", "p-open"] {
        for kind in ["participant_connected", "participant_disconnected"] {
            assert!(
                seen_by_system.contains(&(json!(kind), json!(id))),
                "system sees {kind} of {id}: {seen_by_system:?}"
            );
        }
    }
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let e = watcher.next_event(&sub).await;
        seen.push((
            e["event"]["type"].clone(),
            e["event"]["data"]["participantId"].clone(),
        ));
    }
    watcher.assert_no_event(&sub).await;
    assert!(
        seen.contains(&(json!("participant_connected"), json!("p-sc"))),
        "{seen:?}"
    );
    assert!(
        seen.contains(&(json!("participant_connected"), json!("p-open"))),
        "{seen:?}"
    );
    assert!(
        seen.contains(&(json!("participant_disconnected"), json!("p-open"))),
        "{seen:?}"
    );
    let r = watcher
        .ok(
            "map/replay",
            json!({"filter": {"eventTypes": ["participant_connected", "participant_disconnected"]}}),
        )
        .await;
    let replayed: Vec<_> = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"]["data"]["participantId"].clone())
        .collect();
    assert!(
        !replayed.contains(&json!("internal-1")),
        "nor in replay: {replayed:?}"
    );
}
