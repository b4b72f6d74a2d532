//! An A2A task's record (`meta.a2a`: the caller's messages as `history`, the agent's answers)
//! and MAP's visibility rules (issue 44, items 12 and 13), against a real server over loopback.
//!
//! Five principals: `carol` is the A2A caller whose text is the secret; the viewers are `ops` (a
//! system principal), `alice` (runs the agent `worker` every task goes to, and reads through
//! that agent's session, which owns it), `bob` (runs the
//! agent `bob-bot` and speaks as it) and `nobody` (no grants: may neither observe nor list
//! tasks). For each rule the test reads, as every viewer, the task over `map/tasks/list` and
//! `map/tasks/get`, the `task.*` events and the `message_sent` events over `map/replay`, and
//! asserts that nobody reads the secret in a task who may not read it in the messages (the
//! parties: the assignee's owner, who received them, and system participants), and the exact
//! table of who reads what.

mod common;

use std::net::SocketAddr;

use common::http::request;
use common::*;
use futures::StreamExt;
use map_router::client::{AgentHandle, Client, ClientOptions};
use map_router::protocol::capabilities::ParticipantType;
use map_router::protocol::json::RawJson;
use map_router::protocol::message::Message as MapMessage;
use map_router::protocol::methods::agents::RegisterParams;
use map_router::protocol::methods::messaging::SendParams;
use serde_json::{json, Value};
use tokio::sync::mpsc;

const OPS: &str = "ak-ops-0123456789abcdef";
const ALICE: &str = "ak-alice-0123456789abcdef";
const BOB: &str = "ak-bob-0123456789abcdef";
const NOBODY: &str = "ak-nobody-0123456789abcdef";
const CAROL: &str = "ak-carol-0123456789abcdef";

const SECRET: &str = "carol's secret plan";
/// alice's agent's answer: a message too (in the record's artifacts and in `meta.result`).
const ANSWER: &str = "alice's secret answer";

/// A server with `[auth]` on, `ops` a system principal, `nobody` without observation and task
/// listing; `extra` TOML is appended at the top level (after `[permissions]`' own tables).
async fn server(extra: &str) -> (map_router::server::Server, SocketAddr, String) {
    let (server, url) = start_server(|c| {
        let mut t = map_router::server::Config::from_toml(&format!(
            r#"
[auth]
system_principals = ["ops"]

[permissions.principals."nobody".observation]
canObserve = false
[permissions.principals."nobody".tasks]
canList = false

{extra}

[a2a]
"#
        ))
        .expect("config");
        t.listen = c.listen.clone();
        t.auth.api_keys.inline = Some(map_router::auth::config::Secret(format!(
            "{OPS} ops,{ALICE} alice,{BOB} bob,{NOBODY} nobody,{CAROL} carol"
        )));
        *c = t;
    })
    .await;
    let addr = server.local_addrs()[0];
    (server, addr, url)
}

/// An agent registered with `register` (raw `map/agents/register` params) by the principal of
/// `key`, its messages on the returned channel.
async fn agent(
    url: &str,
    key: &str,
    register: Value,
) -> (Client, AgentHandle, mpsc::UnboundedReceiver<MapMessage>) {
    let name = register["name"].as_str().unwrap().to_owned();
    let client = with_timeout(Client::connect_ws(
        url,
        ClientOptions::agent().name(name).api_key(key),
    ))
    .await
    .expect("agent connects");
    let params: RegisterParams = serde_json::from_value(register).expect("register params");
    let handle: AgentHandle = with_timeout(client.register(params))
        .await
        .expect("agent registers");
    let (tx, rx) = mpsc::unbounded_channel();
    let mut messages = handle.messages();
    tokio::spawn(async move {
        while let Some(m) = messages.next().await {
            if tx.send(m).is_err() {
                break;
            }
        }
    });
    (client, handle, rx)
}

async fn client(url: &str, key: &str, system: bool) -> Client {
    let options = if system {
        ClientOptions::new().participant_type(ParticipantType::System)
    } else {
        ClientOptions::new()
    };
    with_timeout(Client::connect_ws(url, options.api_key(key)))
        .await
        .expect("client connects")
}

/// One A2A JSON-RPC call as `key`; the answer's `result` (which must be there).
async fn a2a(addr: SocketAddr, path: &str, key: &str, method: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
    let bearer = format!("Bearer {key}");
    let r = request(
        addr,
        "POST",
        path,
        &[
            ("Content-Type", "application/json"),
            ("Authorization", bearer.as_str()),
        ],
        body.as_bytes(),
    )
    .await;
    let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    assert_eq!(r.status, 200, "{method}: {v}");
    assert!(v.get("error").is_none(), "{method}: {v}");
    v["result"].clone()
}

/// `caller` sends
/// `SECRET` to `worker` over A2A; alice's agent answers; the task is completed. Returns the
/// task id.
async fn carol_asks(
    addr: SocketAddr,
    caller: &str,
    worker: &Client,
    inbox: &mut mpsc::UnboundedReceiver<MapMessage>,
) -> String {
    let res = a2a(
        addr,
        "/a2a/agents/worker",
        caller,
        "SendMessage",
        json!({"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": SECRET}]},
            "configuration": {"returnImmediately": true}}),
    )
    .await;
    let id = res["task"]["id"].as_str().unwrap().to_owned();
    let asked = with_timeout(inbox.recv()).await.unwrap();
    let correlation = asked
        .correlation_id()
        .unwrap_or_else(|| asked.id.to_string());
    with_timeout(worker.send_with(SendParams {
        to: RawJson::from(json!({"agent": asked.from})),
        payload: Some(RawJson::from(json!(ANSWER))),
        meta: Some(RawJson::from(
            json!({"correlationId": correlation, "isResult": true}),
        )),
    }))
    .await
    .expect("reply");
    within(std::time::Duration::from_secs(5), async {
        loop {
            let t = a2a(addr, "/a2a", caller, "GetTask", json!({"id": id})).await;
            if t["status"]["state"] == "TASK_STATE_COMPLETED" {
                // The record holds carol's text: what the rules below must protect.
                assert!(t["history"].to_string().contains(SECRET), "{t}");
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    id
}

/// What one viewer reads: the task (listed / got), with the secret in it; the secret in a
/// `task.*` event; the secret in a `message_sent` event.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Reads {
    task_listed: bool,
    secret_in_task: bool,
    secret_in_task_events: bool,
    secret_in_messages: bool,
}

async fn reads(c: &Client, task_id: &str) -> Reads {
    let listed = with_timeout(c.call_raw("map/tasks/list", json!({"limit": 1000}))).await;
    let (task_listed, secret_listed) = match &listed {
        Ok(l) => {
            let task = l["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["id"] == task_id)
                .cloned();
            let text = task.as_ref().map(Value::to_string).unwrap_or_default();
            // The question and the answer go together: both or neither.
            assert_eq!(text.contains(SECRET), text.contains(ANSWER), "{text}");
            (task.is_some(), text.contains(SECRET))
        }
        Err(_) => (false, false),
    };
    let got = with_timeout(c.call_raw("map/tasks/get", json!({"taskId": task_id}))).await;
    let secret_got = got.as_ref().is_ok_and(|t| t.to_string().contains(SECRET));
    assert_eq!(
        got.is_ok(),
        task_listed,
        "get and list agree on the task: {got:?}"
    );
    assert_eq!(
        secret_got, secret_listed,
        "get and list agree on the record"
    );
    let replay = |types: Vec<&str>| {
        let c = c.clone();
        let types: Vec<String> = types.into_iter().map(String::from).collect();
        async move {
            match with_timeout(c.call_raw(
                "map/replay",
                json!({"filter": {"eventTypes": types}, "limit": 10000}),
            ))
            .await
            {
                Ok(v) => v["events"].to_string().contains(SECRET),
                Err(_) => false,
            }
        }
    };
    Reads {
        task_listed,
        secret_in_task: secret_listed,
        secret_in_task_events: replay(vec!["task.*", "task.updated"]).await,
        secret_in_messages: replay(vec!["message_sent"]).await,
    }
}

/// Runs one rule: `extra` config, the registrations of the worker and of bob's agent, and what each viewer must read (`ops`, `alice`, `bob`, `nobody`,
/// as (task listed, secret in the task)).
struct Rule<'a> {
    name: &'a str,
    extra: &'a str,
    worker: Value,
    bob_bot: Value,
    expect: [(bool, bool); 4],
}

async fn rule(r: Rule<'_>) {
    let Rule {
        name,
        extra,
        worker,
        bob_bot,
        expect,
    } = r;
    let (_server, addr, url) = server(extra).await;
    let ops = client(&url, OPS, true).await;
    if worker.get("scopes").is_some() {
        with_timeout(ops.call_raw(
            "map/scopes/create",
            json!({"scopeId": "team", "messageVisibility": "members"}),
        ))
        .await
        .expect("scope");
    }
    let (worker_client, _worker, mut inbox) = agent(&url, ALICE, worker).await;
    let (bob, _bob_bot, _bob_inbox) = agent(&url, BOB, bob_bot).await;
    let nobody = client(&url, NOBODY, false).await;
    let task = carol_asks(addr, CAROL, &worker_client, &mut inbox).await;
    let mut table = Vec::new();
    for (who, c) in [
        ("ops", &ops),
        ("alice", &worker_client),
        ("bob", &bob),
        ("nobody", &nobody),
    ] {
        let r = reads(c, &task).await;
        // The rule of item 12: the task shows the record to nobody who may not read the
        // messages, except the parties (system, and alice, whose agent received them).
        let party = who == "ops" || who == "alice";
        if !party {
            assert!(
                !r.secret_in_task || r.secret_in_messages,
                "{name}: {who} reads carol's text in the task but not in the messages: {r:?}"
            );
            assert!(
                !r.secret_in_task_events || r.secret_in_messages,
                "{name}: {who} reads carol's text in task events but not in the messages: {r:?}"
            );
        }
        table.push((who, r));
    }
    let got: Vec<(bool, bool)> = table
        .iter()
        .map(|(_, r)| (r.task_listed, r.secret_in_task))
        .collect();
    assert_eq!(got, expect.to_vec(), "{name}: {table:?}");
}

fn worker(extra: Value) -> Value {
    let mut v = json!({"name": "worker", "agentId": "worker"});
    v.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    v
}

fn bob_bot(extra: Value) -> Value {
    named("bob-bot", extra)
}

fn named(name: &str, extra: Value) -> Value {
    let mut v = json!({"name": name, "agentId": name});
    v.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    v
}

const ALL: (bool, bool) = (true, true);
const TASK_ONLY: (bool, bool) = (true, false);
const NONE: (bool, bool) = (false, false);

fn plain(name: &'static str, extra: &'static str, worker: Value, bob_bot: Value) -> Rule<'static> {
    Rule {
        name,
        extra,
        worker,
        bob_bot,
        expect: [ALL; 4],
    }
}

#[tokio::test]
async fn by_default_whoever_sees_the_agent_and_the_messages_reads_the_history() {
    rule(Rule {
        expect: [ALL, ALL, ALL, NONE],
        ..plain("default", "", worker(json!({})), bob_bot(json!({})))
    })
    .await;
}

#[tokio::test]
async fn a_hidden_parent_only_or_scope_agent_gets_no_a2a_task_so_no_history_exists() {
    // The A2A caller's MAP session owns no agent: it sees only public, exposed agents, so an
    // A2A task is never made for a hidden, `parent-only` or `scope` agent; nothing is recorded
    // that a narrower viewer could read (the task's visibility follows that agent's).
    for (name, extra, register) in [
        ("visibility system", "", json!({"visibility": "system"})),
        ("parent-only", "", json!({"visibility": "parent-only"})),
        (
            "scope",
            "",
            json!({"visibility": "scope", "scopes": ["team"]}),
        ),
        (
            "exposure hides worker",
            "[permissions.exposure.agents]\nhidden = [\"worker\"]",
            json!({}),
        ),
    ] {
        let (_server, addr, url) = server(extra).await;
        let ops = client(&url, OPS, true).await;
        with_timeout(ops.call_raw(
            "map/scopes/create",
            json!({"scopeId": "team", "messageVisibility": "members"}),
        ))
        .await
        .expect("scope");
        let (_c, _worker, mut inbox) = agent(&url, ALICE, worker(register)).await;
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params":
            {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": SECRET}]}}})
        .to_string();
        let bearer = format!("Bearer {CAROL}");
        let r = request(
            addr,
            "POST",
            "/a2a/agents/worker",
            &[
                ("Content-Type", "application/json"),
                ("Authorization", bearer.as_str()),
            ],
            body.as_bytes(),
        )
        .await;
        let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        let why = v["error"]["message"].as_str().unwrap_or_default();
        assert!(why.contains("no agent \"worker\""), "{name}: {v}");
        let listed = with_timeout(ops.call_raw("map/tasks/list", json!({})))
            .await
            .unwrap();
        assert_eq!(listed["tasks"], json!([]), "{name}: no task made");
        assert!(
            inbox.try_recv().is_err(),
            "{name}: nothing reached the agent"
        );
    }
}

#[tokio::test]
async fn a_hidden_gateway_agent_hides_the_history_its_messages_carried() {
    // The messages come from `a2a-gateway`: hidden, they are system-only; the task (about the
    // public worker) stays listed, its record withheld from bob.
    rule(Rule {
        expect: [ALL, ALL, TASK_ONLY, NONE],
        ..plain(
            "exposure hides the gateway",
            "[permissions.exposure.agents]\nhidden = [\"a2a-gateway*\"]",
            worker(json!({})),
            bob_bot(json!({})),
        )
    })
    .await;
}

#[tokio::test]
async fn hidden_message_events_hide_the_history_they_carried() {
    rule(Rule {
        expect: [ALL, ALL, TASK_ONLY, NONE],
        ..plain(
            "hidden_event_types message_*",
            "[permissions.exposure]\nhidden_event_types = [\"message_*\"]",
            worker(json!({})),
            bob_bot(json!({})),
        )
    })
    .await;
}

#[tokio::test]
async fn can_see_rules_withhold_the_history_from_an_agent_that_may_not_see_its_sender() {
    // bob-bot may see the worker but not the gateway agent that sent it carol's messages: the
    // message events are not bob's to read, nor is the record.
    rule(Rule {
        expect: [ALL, ALL, TASK_ONLY, NONE],
        ..plain(
            "canSee include worker",
            "",
            worker(json!({})),
            bob_bot(
                json!({"permissionOverrides": {"canSee": {"agents": {"include": ["worker"]}}}}),
            ),
        )
    })
    .await;
    // bob-bot may see neither: the task is not his either.
    rule(Rule {
        expect: [ALL, ALL, NONE, NONE],
        ..plain(
            "canSee direct",
            "",
            worker(json!({})),
            bob_bot(json!({"permissionOverrides": {"canSee": {"agents": "direct"}}})),
        )
    })
    .await;
}

#[tokio::test]
async fn a_scopes_message_visibility_narrows_scope_messages_not_a2a_history() {
    // A2A messages are addressed to the agent, not to its scope: a scope whose messages are
    // for members does not narrow them, and the record follows the messages. bob reads both,
    // member of the scope or not.
    for (name, bob) in [
        ("scope member", json!({"scopes": ["team"]})),
        ("scope non-member", json!({})),
    ] {
        rule(Rule {
            expect: [ALL, ALL, ALL, NONE],
            ..plain(name, "", worker(json!({"scopes": ["team"]})), bob_bot(bob))
        })
        .await;
    }
}

// ---------------------------------------------------------------------------------------------
// Item 13: a forged `meta.a2a.owner`

/// The record a forger writes: alice's, with bob's words in it.
const FORGED: &str = r#"{"contextId":"ctx-x","state":"TASK_STATE_WORKING","agent":"worker","owner":{"id":"alice"},"gateway":"a2a-gateway","history":[{"messageId":"x","role":"ROLE_USER","parts":[{"text":"planted by bob"}]}]}"#;

#[tokio::test]
async fn no_spelling_of_meta_a2a_lets_a_participant_make_up_a_tasks_owner() {
    // The gateway reads `meta.a2a.owner` as the task's owner; only the gateway's own sessions
    // may write `meta.a2a` (docs/tasks.md). Every spelling a JSON reader folds into `a2a` is
    // refused as the plain one is: an escaped key, the key twice, the key after another, on
    // create and on update, by an ordinary and by a system principal.
    let (_server, addr, url) = server("").await;
    let (_alice, _worker, _inbox) = agent(&url, ALICE, worker(json!({}))).await;
    let ops = client(&url, OPS, true).await;
    let (mut bob, _) = connect_with_key(&url, BOB, "client", json!({})).await;
    let (mut sys, _) = connect_with_key(&url, OPS, "system", json!({})).await;
    let own = bob
        .request_raw(r#"{"jsonrpc":"2.0","id":1,"method":"map/tasks/create","params":{"task":{"id":"bobs","assignee":"worker"}}}"#)
        .await;
    assert!(own.get("error").is_none(), "{own}");
    let spellings = [
        format!(r#"{{"a2a":{FORGED}}}"#),
        format!(r#"{{"\u0061\u0032a":{FORGED}}}"#),
        format!(r#"{{"x":1,"a2a":{FORGED}}}"#),
        format!(r#"{{"a2a":null,"a2a":{FORGED}}}"#),
        format!(r#"{{"a2a":{FORGED},"a2a":null}}"#),
    ];
    for (i, meta) in spellings.iter().enumerate() {
        for (who, c) in [("bob", &mut bob), ("system", &mut sys)] {
            let create = format!(
                r#"{{"jsonrpc":"2.0","id":2,"method":"map/tasks/create","params":{{"task":{{"id":"forged-{who}-{i}","assignee":"worker","meta":{meta}}}}}}}"#
            );
            let update = format!(
                r#"{{"jsonrpc":"2.0","id":3,"method":"map/tasks/update","params":{{"taskId":"bobs","meta":{meta}}}}}"#
            );
            for call in [create, update] {
                let v = c.request_raw(&call).await;
                assert_eq!(v["error"]["code"], 14003, "{who} {meta}: {v}");
                assert!(
                    v["error"]["message"]
                        .as_str()
                        .unwrap_or_default()
                        .contains("meta.a2a is written by the router's gateway only"),
                    "{v}"
                );
            }
        }
    }
    // Nothing was made or changed: bob's own task has no record, no forged task exists.
    let listed = with_timeout(ops.call_raw("map/tasks/list", json!({"limit": 1000})))
        .await
        .unwrap();
    let tasks = listed["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{listed}");
    assert_eq!(tasks[0]["id"], "bobs");
    assert!(tasks[0]["meta"].get("a2a").is_none(), "{listed}");
    // alice's A2A view lists none of it, and the forged id is not hers to read.
    let mine = a2a(addr, "/a2a", ALICE, "ListTasks", json!({})).await;
    assert_eq!(mine["tasks"], json!([]), "{mine}");
}

// ---------------------------------------------------------------------------------------------
// docs/a2a.md's curl example (issue 44, item 16) runs as written

#[tokio::test]
async fn the_a2a_docs_curl_example_runs_as_written() {
    let script = common::docs::doc_script("docs/a2a.md", "a2a-curl");
    let (_router, url) = start_binary(["serve", "--listen", "127.0.0.1:0", "--ephemeral"]).await;
    let http = format!(
        "http://{}",
        url.trim_start_matches("ws://").trim_end_matches('/')
    );
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_map-router"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = within(
        std::time::Duration::from_secs(60),
        tokio::process::Command::new("sh")
            .arg("-ec")
            .arg(&script)
            .current_dir(common::docs::root())
            .env("PATH", &path)
            .env("MAP_ROUTER_URL", &url)
            .env("MAP_HTTP", &http)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("sh runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{script}\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let task = &answer["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{answer}");
    assert_eq!(task["history"][0]["role"], "ROLE_USER", "{answer}");
    assert_eq!(
        task["artifacts"][0]["parts"][0]["data"]["echo"], "hello",
        "{answer}"
    );
}
