//! Who reads which conversation through the mail reads (`mail/list`, `mail/get`,
//! `mail/turns/list`), as a viewer such as the dashboard (a `client` session) does (issue 46,
//! item 4), against a real server over loopback with API keys.
//!
//! Four principals: `ops` (a system principal, in `auth.system_principals`), `alice` (runs the
//! agents `alice-bot` and `alice-helper`, which talk in one conversation), `bob` (runs `bob-bot`,
//! which has a conversation of its own) and `nobody` (no `mail.canViewHistory`). A system
//! principal's session reads every conversation whatever its participant type: an operator's
//! dashboard connects as `client`. Everyone else reads the conversations its session takes part
//! in, and nothing of the others.
mod common;

use common::*;
use serde_json::{json, Value};

const OPS: &str = "ak-ops-0123456789abcdef";
const ALICE: &str = "ak-alice-0123456789abcdef";
const BOB: &str = "ak-bob-0123456789abcdef";
const NOBODY: &str = "ak-nobody-0123456789abcdef";

async fn server() -> (map_router::server::Server, String) {
    start_server(|c| {
        let mut t = map_router::server::Config::from_toml(
            r#"
[auth]
system_principals = ["ops"]
[permissions.principals."nobody".mail]
canViewHistory = false
"#,
        )
        .expect("config");
        t.listen = c.listen.clone();
        t.auth.api_keys.inline = Some(map_router::auth::config::Secret(format!(
            "{OPS} ops,{ALICE} alice,{BOB} bob,{NOBODY} nobody"
        )));
        *c = t;
    })
    .await
}

/// An agent session of the principal of `key`, registered as `id`.
async fn agent(url: &str, key: &str, id: &str) -> WsClient {
    let (mut c, _) = connect_with_key(url, key, "agent", json!({})).await;
    let a = c.register_agent(json!({"agentId": id, "name": id})).await;
    assert_eq!(a["id"], json!(id));
    c
}

/// A dashboard's session: a `client` of the principal of `key`.
async fn dashboard(url: &str, key: &str) -> WsClient {
    connect_with_key(url, key, "client", json!({"name": "map-router-dashboard"}))
        .await
        .0
}

/// The subjects of the conversations `mail/list` gives `c`.
async fn subjects(c: &mut WsClient) -> Vec<String> {
    let list = c.ok("mail/list", json!({})).await;
    list["conversations"]
        .as_array()
        .expect("conversations")
        .iter()
        .map(|c| c["subject"].as_str().unwrap_or("").to_owned())
        .collect()
}

fn turn_contents(page: &Value) -> Vec<Value> {
    page["turns"]
        .as_array()
        .expect("turns")
        .iter()
        .map(|t| t["content"].clone())
        .collect()
}

#[test]
fn a_system_principal_reads_every_conversation_others_only_their_own() {
    on_big_stack(a_system_principal_reads_every_conversation_others_only_their_own_body);
}

async fn a_system_principal_reads_every_conversation_others_only_their_own_body() {
    let (_server, url) = server().await;
    let mut alice = agent(&url, ALICE, "alice-bot").await;
    let mut helper = agent(&url, ALICE, "alice-helper").await;
    let mut bob = agent(&url, BOB, "bob-bot").await;

    let created = alice
        .ok(
            "mail/create",
            json!({"subject": "alice's plan",
                   "initialTurn": {"contentType": "text", "content": "first"}}),
        )
        .await;
    let alices = created["conversation"]["id"].as_str().unwrap().to_owned();
    alice
        .ok(
            "map/send",
            json!({"to": {"agent": "alice-helper"}, "payload": "second",
                   "meta": {"mail": {"conversationId": alices}}}),
        )
        .await;
    helper.next_message().await;
    helper
        .ok(
            "mail/turn",
            json!({"conversationId": alices, "contentType": "text", "content": "third"}),
        )
        .await;
    let bobs = bob
        .ok("mail/create", json!({"subject": "bob's plan"}))
        .await["conversation"]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // The operator's dashboard: a client session of a system principal reads them all.
    let mut ops = dashboard(&url, OPS).await;
    assert_eq!(subjects(&mut ops).await, ["alice's plan", "bob's plan"]);
    let got = ops
        .ok(
            "mail/get",
            json!({"conversationId": alices, "include": {"participants": true}}),
        )
        .await;
    let ids: Vec<&str> = got["participants"]
        .as_array()
        .expect("participants")
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alice-bot", "alice-helper"], "{got}");
    let turns = ops
        .ok("mail/turns/list", json!({"conversationId": alices}))
        .await;
    assert_eq!(
        turn_contents(&turns),
        [json!("first"), json!("second"), json!("third")]
    );
    ops.ok("mail/get", json!({"conversationId": bobs})).await;
    let summary = ops
        .ok("mail/summary", json!({"conversationId": alices}))
        .await;
    let text = summary["summary"].as_str().unwrap_or_default();
    assert!(text.contains("3 turns by 2 participants"), "{summary}");
    // It reads; it changes nothing it does not take part in: no turn, close, invite, join or
    // send into it (the same 10000 as before), and the conversation is as it was.
    for (method, params) in [
        (
            "mail/turn",
            json!({"conversationId": alices, "contentType": "text", "content": "ops was here"}),
        ),
        ("mail/close", json!({"conversationId": alices})),
        (
            "mail/invite",
            json!({"conversationId": alices, "participant": {"id": "bob-bot"}}),
        ),
        ("mail/join", json!({"conversationId": alices})),
        (
            "map/send",
            json!({"to": {"agent": "alice-bot"}, "payload": "x",
                   "meta": {"mail": {"conversationId": alices}}}),
        ),
    ] {
        let err = ops.err(method, params).await;
        assert_eq!(err["code"], json!(10000), "{method}: {err}");
    }
    let got = ops
        .ok(
            "mail/get",
            json!({"conversationId": alices, "include": {"participants": true, "stats": true}}),
        )
        .await;
    assert_eq!(got["conversation"]["status"], json!("active"), "{got}");
    assert_eq!(got["participants"].as_array().unwrap().len(), 2, "{got}");
    assert_eq!(got["stats"]["totalTurns"], json!(3), "{got}");
    // alice's agents got nothing from it.
    alice.assert_no_message().await;
    // The events of the conversation still go to its participants only (and to sessions of
    // type system): the operator's client reads, it is not sent them.
    let sub = ops.subscribe(json!({"eventTypes": ["mail.*"]})).await;
    helper
        .ok(
            "mail/turn",
            json!({"conversationId": alices, "contentType": "text", "content": "fourth"}),
        )
        .await;
    ops.assert_no_event(&sub).await;

    // alice's agents read hers and not bob's; bob reads his and not alice's.
    assert_eq!(subjects(&mut alice).await, ["alice's plan"]);
    let turns = alice
        .ok("mail/turns/list", json!({"conversationId": alices}))
        .await;
    assert_eq!(
        turn_contents(&turns),
        [
            json!("first"),
            json!("second"),
            json!("third"),
            json!("fourth")
        ]
    );
    assert_eq!(subjects(&mut helper).await, ["alice's plan"]);
    assert_eq!(subjects(&mut bob).await, ["bob's plan"]);
    for (method, params) in [
        ("mail/get", json!({"conversationId": alices})),
        ("mail/turns/list", json!({"conversationId": alices})),
        ("mail/summary", json!({"conversationId": alices})),
    ] {
        let err = bob.err(method, params.clone()).await;
        assert_eq!(err["code"], json!(10000), "{method}: {err}");
    }
    let err = alice
        .err("mail/turns/list", json!({"conversationId": bobs}))
        .await;
    assert_eq!(err["code"], json!(10000), "{err}");

    // Ordinary principals' dashboards take part in nothing: they read nothing, and a cursor
    // naming a conversation of someone else is not one (its existence does not leak).
    for key in [ALICE, BOB] {
        let mut d = dashboard(&url, key).await;
        assert_eq!(subjects(&mut d).await, Vec::<String>::new());
        let err = d
            .err("mail/turns/list", json!({"conversationId": alices}))
            .await;
        assert_eq!(err["code"], json!(10000), "{err}");
        let err = d.err("mail/list", json!({"cursor": alices})).await;
        assert_eq!(err["code"], json!(-32602), "{err}");
    }

    // Without the grant, the reads are refused.
    let mut nobody = dashboard(&url, NOBODY).await;
    for (method, params) in [
        ("mail/list", json!({})),
        ("mail/get", json!({"conversationId": alices})),
        ("mail/turns/list", json!({"conversationId": alices})),
    ] {
        let err = nobody.err(method, params).await;
        assert_eq!(err["code"], json!(1003), "{method}: {err}");
    }
}

#[test]
fn a_system_principal_as_an_agent_reads_every_conversation_too() {
    on_big_stack(a_system_principal_as_an_agent_reads_every_conversation_too_body);
}

async fn a_system_principal_as_an_agent_reads_every_conversation_too_body() {
    let (_server, url) = server().await;
    let mut bob = agent(&url, BOB, "bob-bot").await;
    let bobs = bob
        .ok(
            "mail/create",
            json!({"subject": "bob's plan",
                   "initialTurn": {"contentType": "text", "content": "hello"}}),
        )
        .await["conversation"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ops = agent(&url, OPS, "ops-bot").await;
    assert_eq!(subjects(&mut ops).await, ["bob's plan"]);
    let turns = ops
        .ok("mail/turns/list", json!({"conversationId": bobs}))
        .await;
    assert_eq!(turn_contents(&turns), [json!("hello")]);
}
