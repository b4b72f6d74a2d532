//! The tasks extension over real WebSockets: create (with a generated or given id), assign,
//! update (meta shallow-merged, status transitions), get and list (filters, paging); every
//! change is a `task.*` event carrying the whole task, which a `tasks` filter narrows to one
//! task; tasks survive a restart; who may not see a task's assignee sees nothing of it, and
//! who may see a task but did not make it and does not own its assignee cannot change it.

mod common;

use common::*;
use map_router::auth::config::Secret;
use map_router::server::Server;
use serde_json::{json, Value};

const ALICE: &str = "ak-alice-0123456789abcdef";
const BOB: &str = "ak-bob-0123456789abcdef";

fn key(k: &str) -> Value {
    json!({"auth": {"method": "api-key", "credential": k}})
}

fn ids(list: &Value) -> Vec<String> {
    list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn durable(dir: &TempDir) -> (Server, String) {
    let data = dir.path.clone();
    start_server(move |c| c.storage.data_dir = Some(data)).await
}

#[tokio::test]
async fn a_task_goes_from_created_to_completed_and_every_step_is_an_event() {
    let (_server, url) = default_server().await;
    let mut watcher = WsClient::system(&url).await;
    // task.updated is one of our vendor types: named.
    let all = watcher
        .subscribe(json!({"eventTypes": ["task.*", "task.updated"]}))
        .await;
    let mut worker = WsClient::agent(&url, "worker", json!({})).await;
    let mut boss = WsClient::client(&url).await;

    let created = boss
        .ok(
            "map/tasks/create",
            json!({"task": {"title": "write the report", "meta": {"priority": 2, "x": {"keep": [1, 2.50]}}}}),
        )
        .await;
    let task = &created["task"];
    let id = task["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("task-"), "{task}");
    assert_eq!(task["status"], json!("open"));
    assert_eq!(task["assignee"], Value::Null);
    assert_eq!(task["createdBy"], json!(boss.pid()));
    let ev = watcher.event_of_type(&all, "task.created").await;
    assert_eq!(ev["event"]["data"]["task"], *task);
    // The source is who made the change (the caller's agent, else its participant id).
    assert_eq!(ev["event"]["source"], json!(boss.pid()), "{ev}");

    // Another subscription narrowed to this task.
    // task.updated is a vendor type: named (docs/compatibility.md §7).
    let this = watcher
        .subscribe(json!({"tasks": {"taskIds": [id]}, "eventTypes": ["*", "task.updated"]}))
        .await;
    let other = watcher
        .subscribe(json!({"tasks": {"taskIds": ["someone-elses"]}}))
        .await;

    let assigned = boss
        .ok(
            "map/tasks/assign",
            json!({"taskId": id, "agentId": "worker"}),
        )
        .await;
    assert_eq!(assigned["task"]["assignee"], json!("worker"));
    let ev = watcher.event_of_type(&this, "task.assigned").await;
    assert_eq!(ev["event"]["data"]["taskId"], json!(id));
    assert_eq!(ev["event"]["data"]["agentId"], json!("worker"));
    assert_eq!(ev["event"]["data"]["task"], assigned["task"]);

    // The assignee's owner moves it; meta merges shallowly, the untouched member keeps its text.
    let started = worker
        .ok(
            "map/tasks/update",
            json!({"taskId": id, "status": "in_progress", "meta": {"progress": 0.5}}),
        )
        .await;
    assert_eq!(started["task"]["status"], json!("in_progress"));
    assert_eq!(
        started["task"]["meta"],
        json!({"priority": 2, "x": {"keep": [1, 2.50]}, "progress": 0.5})
    );
    let ev = watcher.event_of_type(&this, "task.status").await;
    assert_eq!(ev["event"]["data"]["previous"], json!("open"));
    assert_eq!(ev["event"]["data"]["current"], json!("in_progress"));
    assert_eq!(ev["event"]["source"], json!("worker"), "{ev}");

    // A title change alone is a task.updated.
    worker
        .ok(
            "map/tasks/update",
            json!({"taskId": id, "title": "the report"}),
        )
        .await;
    let ev = watcher.event_of_type(&this, "task.updated").await;
    assert_eq!(ev["event"]["data"]["task"]["title"], json!("the report"));
    // No change: no event.
    let same = worker
        .ok(
            "map/tasks/update",
            json!({"taskId": id, "title": "the report"}),
        )
        .await;
    assert_eq!(same["task"]["title"], json!("the report"));

    let done = worker
        .ok(
            "map/tasks/update",
            json!({"taskId": id, "status": "completed", "meta": {"result": {"pages": 3}}}),
        )
        .await;
    let status = watcher.event_of_type(&this, "task.status").await;
    assert_eq!(status["event"]["data"]["current"], json!("completed"));
    let completed = watcher.next_event(&this).await;
    assert_eq!(completed["event"]["type"], json!("task.completed"));
    assert_eq!(completed["event"]["data"]["result"], json!({"pages": 3}));
    assert_eq!(completed["event"]["data"]["task"], done["task"]);
    assert_eq!(
        completed["event"]["causedBy"],
        json!([status["event"]["id"]])
    );
    watcher.assert_no_event(&this).await;
    watcher
        .assert_none_where("an event for another task's filter", |v| {
            v["params"]["subscriptionId"] == json!(other)
        })
        .await;

    let got = boss.ok("map/tasks/get", json!({"taskId": id})).await;
    assert_eq!(got["task"], done["task"]);
    let missing = boss.err("map/tasks/get", json!({"taskId": "nope"})).await;
    assert_eq!(missing["code"], json!(14001), "{missing}");
    assert_eq!(missing["data"]["category"], json!("resource"), "{missing}");
    let missing = boss
        .err(
            "map/tasks/update",
            json!({"taskId": "nope", "status": "failed"}),
        )
        .await;
    assert_eq!(missing["code"], json!(14001), "{missing}");
}

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::client(&url).await;
    let mut watcher = WsClient::system(&url).await;
    let sub = watcher.subscribe(json!({"eventTypes": ["task.*"]})).await;
    c.ok("map/tasks/create", json!({"task": {"id": "t1"}}))
        .await;
    watcher.event_of_type(&sub, "task.created").await;
    for (method, params) in [
        ("map/tasks/create", json!({"task": {"id": "t1"}})),
        ("map/tasks/create", json!({"task": {"id": ""}})),
        ("map/tasks/create", json!({"task": {"id": "x".repeat(300)}})),
        ("map/tasks/create", json!({"task": {"status": "done"}})),
        ("map/tasks/create", json!({"task": {"meta": [1]}})),
        ("map/tasks/create", json!({})),
        (
            "map/tasks/update",
            json!({"taskId": "t1", "status": "bogus"}),
        ),
        ("map/tasks/update", json!({"taskId": "t1", "meta": "text"})),
        ("map/tasks/update", json!({"status": "open"})),
        ("map/tasks/list", json!({"cursor": "no-such-task"})),
        ("map/tasks/list", json!({"filter": {"status": 3}})),
    ] {
        let err = c.err(method, params.clone()).await;
        assert_eq!(err["code"], json!(-32602), "{method} {params}: {err}");
    }
    for (method, params) in [
        ("map/tasks/create", json!({"task": {"assignee": "ghost"}})),
        (
            "map/tasks/assign",
            json!({"taskId": "t1", "agentId": "ghost"}),
        ),
        (
            "map/tasks/update",
            json!({"taskId": "t1", "assignee": "ghost"}),
        ),
    ] {
        let err = c.err(method, params.clone()).await;
        assert_eq!(err["code"], json!(14002), "{method} {params}: {err}");
    }
    watcher.assert_no_event(&sub).await;
    let list = c.ok("map/tasks/list", json!({})).await;
    assert_eq!(ids(&list), ["t1"]);
    assert_eq!(list["tasks"][0]["status"], json!("open"));
}

#[tokio::test]
async fn list_filters_and_pages_in_creation_order() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "a", json!({})).await;
    let _b = WsClient::agent(&url, "b", json!({})).await;
    let mut c = WsClient::client(&url).await;
    for i in 1..=7 {
        let assignee = if i % 2 == 0 { "a" } else { "b" };
        let status = if i % 3 == 0 { "blocked" } else { "open" };
        c.ok(
            "map/tasks/create",
            json!({"task": {"id": format!("t{i}"), "assignee": assignee, "status": status}}),
        )
        .await;
        // Distinct creation times keep creation order unambiguous.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let all = c.ok("map/tasks/list", json!({})).await;
    assert_eq!(ids(&all), ["t1", "t2", "t3", "t4", "t5", "t6", "t7"]);
    assert_eq!(all["hasMore"], json!(false));
    let of_a = a
        .ok("map/tasks/list", json!({"filter": {"assignee": "a"}}))
        .await;
    assert_eq!(ids(&of_a), ["t2", "t4", "t6"]);
    let blocked = c
        .ok("map/tasks/list", json!({"filter": {"status": "blocked"}}))
        .await;
    assert_eq!(ids(&blocked), ["t3", "t6"]);
    let either = c
        .ok(
            "map/tasks/list",
            json!({"filter": {"status": ["blocked", "completed"], "assignee": "b"}}),
        )
        .await;
    assert_eq!(ids(&either), ["t3"]);
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let mut params = json!({"limit": 3});
        if let Some(cur) = &cursor {
            params["cursor"] = json!(cur);
        }
        let page = c.ok("map/tasks/list", params).await;
        pages.push(ids(&page));
        match page["nextCursor"].as_str() {
            Some(next) => {
                assert_eq!(page["hasMore"], json!(true));
                cursor = Some(next.to_owned());
            }
            None => {
                assert_eq!(page["hasMore"], json!(false));
                break;
            }
        }
    }
    assert_eq!(
        pages,
        [vec!["t1", "t2", "t3"], vec!["t4", "t5", "t6"], vec!["t7"]]
    );
}

#[tokio::test]
async fn hidden_tasks_stay_hidden_and_only_their_people_change_them() {
    let (_server, url) = start_server(|c| {
        c.auth.api_keys.inline = Some(Secret(format!("{ALICE} alice\n{BOB} bob")));
    })
    .await;
    let mut alice = WsClient::connect_as(&url, "agent", key(ALICE)).await;
    alice
        .register_agent(json!({"agentId": "secret", "visibility": "parent-only"}))
        .await;
    let mut bob = WsClient::connect_as(&url, "agent", key(BOB)).await;
    bob.register_agent(json!({"agentId": "bobs"})).await;
    let bob_sub = bob.subscribe(json!({"eventTypes": ["task.*"]})).await;

    alice
        .ok(
            "map/tasks/create",
            json!({"task": {"id": "hidden", "assignee": "secret", "title": "classified"}}),
        )
        .await;
    alice
        .ok(
            "map/tasks/update",
            json!({"taskId": "hidden", "status": "in_progress"}),
        )
        .await;
    let err = bob.err("map/tasks/get", json!({"taskId": "hidden"})).await;
    assert_eq!(err["code"], json!(14001), "{err}");
    let err = bob
        .err(
            "map/tasks/update",
            json!({"taskId": "hidden", "status": "failed"}),
        )
        .await;
    assert_eq!(err["code"], json!(14001), "{err}");
    let list = bob.ok("map/tasks/list", json!({})).await;
    assert!(ids(&list).is_empty(), "{list}");
    bob.assert_no_event(&bob_sub).await;

    // A public task: bob sees it but may not change it, and may claim it only for his own agent.
    alice
        .ok("map/tasks/create", json!({"task": {"id": "open-task"}}))
        .await;
    let ev = bob.event_of_type(&bob_sub, "task.created").await;
    assert_eq!(ev["event"]["data"]["task"]["id"], json!("open-task"));
    let err = bob
        .err(
            "map/tasks/update",
            json!({"taskId": "open-task", "status": "completed"}),
        )
        .await;
    assert_eq!(err["code"], json!(14003), "{err}");
    let claimed = bob
        .ok(
            "map/tasks/assign",
            json!({"taskId": "open-task", "agentId": "bobs"}),
        )
        .await;
    assert_eq!(claimed["task"]["assignee"], json!("bobs"));
    // Now that bob owns the assignee, he may move it; alice (its creator) still may too.
    bob.ok(
        "map/tasks/update",
        json!({"taskId": "open-task", "status": "in_progress"}),
    )
    .await;
    alice
        .ok(
            "map/tasks/update",
            json!({"taskId": "open-task", "description": "by alice"}),
        )
        .await;
    // Bob cannot take it back from himself for alice's hidden agent (he cannot see it).
    let err = bob
        .err(
            "map/tasks/assign",
            json!({"taskId": "open-task", "agentId": "secret"}),
        )
        .await;
    assert_eq!(err["code"], json!(14002), "{err}");
    let mine = alice.ok("map/tasks/list", json!({})).await;
    assert_eq!(ids(&mine), ["hidden", "open-task"]);
}

#[tokio::test]
async fn tasks_survive_a_restart_and_their_events_replay() {
    let dir = TempDir::new("tasks");
    let (server, url) = durable(&dir).await;
    let mut c = WsClient::client(&url).await;
    for i in 1..=3 {
        c.ok(
            "map/tasks/create",
            json!({"task": {"id": format!("t{i}"), "meta": {"n": i, "raw": {"b": 1, "a": 2.0}}}}),
        )
        .await;
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    c.ok(
        "map/tasks/update",
        json!({"taskId": "t2", "status": "completed"}),
    )
    .await;
    drop(c);
    with_timeout(server.shutdown()).await;
    let (server, url) = durable(&dir).await;
    let mut c = WsClient::system(&url).await;
    let list = c.ok("map/tasks/list", json!({})).await;
    assert_eq!(ids(&list), ["t1", "t2", "t3"]);
    assert_eq!(list["tasks"][1]["status"], json!("completed"));
    // The meta's text passed through: `2.0` stays a float's spelling.
    assert_eq!(list["tasks"][2]["meta"]["raw"]["a"].to_string(), "2.0");
    assert_eq!(list["tasks"][2]["meta"]["n"], json!(3));
    let replay = c
        .ok(
            "map/replay",
            json!({"filter": {"tasks": {"taskIds": ["t2"]}}, "limit": 100}),
        )
        .await;
    let kinds: Vec<&str> = replay["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["task.created", "task.status", "task.completed"]);
    // It continues: a new change is stored too.
    c.ok(
        "map/tasks/update",
        json!({"taskId": "t3", "status": "failed"}),
    )
    .await;
    let _ = within(std::time::Duration::from_secs(10), server.shutdown()).await;
    let (server, url) = durable(&dir).await;
    let mut c = WsClient::client(&url).await;
    let got = c.ok("map/tasks/get", json!({"taskId": "t3"})).await;
    assert_eq!(got["task"]["status"], json!("failed"));
    let _ = within(std::time::Duration::from_secs(10), server.shutdown()).await;
}
