//! Bounded memory (issue 23, item 5): what one caller creates is paged from the store behind
//! a bounded cache and capped by per-principal quotas, and a group send's record of its silent
//! recipients is a bounded sample. Sizes and RSS are measured by `scripts/soak-memory.sh`, not
//! here: these tests check counts, order and bounds.

mod common;

use common::*;
use map_router::auth::config::Secret;
use map_router::server::Server;
use serde_json::{json, Value};

const ALICE: &str = "ak-alice-0123456789abcdef";
const BOB: &str = "ak-bob-0123456789abcdef";

/// Items of each kind the router caches in these tests: far fewer than they create.
const CACHE: usize = 8;

fn key(k: &str) -> Value {
    json!({"auth": {"method": "api-key", "credential": k}})
}

fn strings(list: &Value, field: &str, member: &str) -> Vec<String> {
    list[field]
        .as_array()
        .unwrap_or_else(|| panic!("{field} in {list}"))
        .iter()
        .map(|t| t[member].as_str().unwrap().to_owned())
        .collect()
}

/// A server with a small cache, durable in `dir` (or in memory).
async fn small_cache(dir: Option<&TempDir>) -> (Server, String) {
    let data = dir.map(|d| d.path.clone());
    start_server(move |c| {
        c.storage.data_dir = data;
        c.storage.cache_items = CACHE;
    })
    .await
}

/// Every page of a listing, `limit` at a time, by its `nextCursor`.
async fn all_pages(c: &mut WsClient, method: &str, mut params: Value, field: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for _ in 0..1000 {
        let page = c.ok(method, params.clone()).await;
        out.extend(page[field].as_array().unwrap().iter().cloned());
        match page["nextCursor"].as_str() {
            Some(next) => {
                assert_eq!(page["hasMore"], json!(true), "{page}");
                params["cursor"] = json!(next);
            }
            None => {
                assert_eq!(page["hasMore"], json!(false), "{page}");
                return out;
            }
        }
    }
    panic!("{method} did not end");
}

/// What `fill` makes: tasks `t000`.., checkpoints `c000`.. (oldest first), and one
/// conversation's turns, each numbered.
const TASKS: usize = 60;
const CHECKPOINTS: usize = 40;
const TURNS: usize = 45;

/// Creates more of each kind than the cache holds; returns the conversation's id.
async fn fill(url: &str) -> String {
    let mut worker = WsClient::agent(url, "worker", json!({})).await;
    for i in 0..TASKS {
        worker
            .ok(
                "map/tasks/create",
                json!({"task": {"id": format!("t{i:03}"), "title": format!("task {i}"),
                       "meta": {"n": i, "f": 2.50}}}),
            )
            .await;
    }
    for i in (0..TASKS).step_by(3) {
        worker
            .ok(
                "map/tasks/update",
                json!({"taskId": format!("t{i:03}"), "status": "completed"}),
            )
            .await;
    }
    for i in 0..CHECKPOINTS {
        worker
            .ok(
                "trajectory/checkpoint",
                json!({"checkpoint": {"id": format!("c{i:03}"), "timestamp": 1000 + i as u64,
                       "metadata": {"step": i}}}),
            )
            .await;
    }
    let conv = worker.ok("mail/create", json!({"subject": "long"})).await["conversation"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut previous: Option<String> = None;
    for i in 0..TURNS {
        let mut params =
            json!({"conversationId": conv, "contentType": "data", "content": {"i": i}});
        if let Some(p) = &previous {
            params["inReplyTo"] = json!(p);
        }
        let turn = worker.ok("mail/turn", params).await;
        previous = turn["turn"]["id"].as_str().map(str::to_owned);
    }
    // Many conversations too, each with a turn.
    for i in 0..20 {
        worker
            .ok(
                "mail/create",
                json!({"subject": format!("c{i}"), "initialTurn": {"contentType": "text", "content": "hi"}}),
            )
            .await;
    }
    conv
}

/// Reads everything `fill` made back, through list (pages of 7) and get, and checks order and
/// content.
async fn read_back(url: &str, conv: &str) {
    let mut c = WsClient::system(url).await;
    let tasks = all_pages(&mut c, "map/tasks/list", json!({"limit": 7}), "tasks").await;
    let ids: Vec<String> = tasks
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    let want: Vec<String> = (0..TASKS).map(|i| format!("t{i:03}")).collect();
    assert_eq!(ids, want);
    for (i, t) in tasks.iter().enumerate() {
        let status = if i % 3 == 0 { "completed" } else { "open" };
        assert_eq!(t["status"], json!(status), "{t}");
        assert_eq!(
            t["meta"]["f"].to_string(),
            "2.5",
            "meta passes through: {t}"
        );
        let got = c.ok("map/tasks/get", json!({"taskId": t["id"]})).await;
        assert_eq!(&got["task"], t);
    }
    let done = all_pages(
        &mut c,
        "map/tasks/list",
        json!({"limit": 4, "filter": {"status": "completed"}}),
        "tasks",
    )
    .await;
    assert_eq!(done.len(), TASKS.div_ceil(3));
    let cps = all_pages(
        &mut c,
        "trajectory/list",
        json!({"limit": 7}),
        "checkpoints",
    )
    .await;
    let ids: Vec<String> = cps
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    let want: Vec<String> = (0..CHECKPOINTS).rev().map(|i| format!("c{i:03}")).collect();
    assert_eq!(ids, want, "newest first");
    for cp in &cps {
        let got = c
            .ok("trajectory/get", json!({"checkpointId": cp["id"]}))
            .await;
        assert_eq!(&got["checkpoint"], cp);
    }
    let turns = all_pages(
        &mut c,
        "mail/turns/list",
        json!({"conversationId": conv, "limit": 7}),
        "turns",
    )
    .await;
    let n: Vec<u64> = turns
        .iter()
        .map(|t| t["content"]["i"].as_u64().unwrap())
        .collect();
    assert_eq!(n, (0..TURNS as u64).collect::<Vec<_>>());
    let newest = all_pages(
        &mut c,
        "mail/turns/list",
        json!({"conversationId": conv, "limit": 6, "order": "desc"}),
        "turns",
    )
    .await;
    assert_eq!(newest.len(), TURNS);
    assert_eq!(newest[0]["content"]["i"], json!(TURNS - 1));
    // A turn far back answers to its predecessor (found in the store, not in memory).
    assert_eq!(turns[3]["inReplyTo"], turns[2]["id"]);
    let got = c
        .ok(
            "mail/get",
            json!({"conversationId": conv, "include": {"recentTurns": 3, "stats": true}}),
        )
        .await;
    assert_eq!(got["stats"]["totalTurns"], json!(TURNS));
    let recent: Vec<u64> = got["recentTurns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["content"]["i"].as_u64().unwrap())
        .collect();
    let t = TURNS as u64;
    assert_eq!(recent, [t - 3, t - 2, t - 1]);
    let replay = c
        .ok(
            "mail/replay",
            json!({"conversationId": conv, "fromTurnId": turns[9]["id"], "limit": 5}),
        )
        .await;
    assert_eq!(replay["missedCount"], json!(TURNS - 10));
    assert_eq!(replay["turns"][0]["content"]["i"], json!(10));
    let convs = all_pages(&mut c, "mail/list", json!({"limit": 6}), "conversations").await;
    assert_eq!(convs.len(), 21);
    assert_eq!(convs[0]["id"], json!(conv));
    assert_eq!(convs[0]["subject"], json!("long"));
    // Creation order is (createdAt, id): conversations of one millisecond in id order.
    let keys: Vec<(u64, String)> = convs
        .iter()
        .map(|c| {
            (
                c["createdAt"].as_u64().unwrap(),
                c["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    let mut subjects: Vec<&str> = convs[1..]
        .iter()
        .map(|c| c["subject"].as_str().unwrap())
        .collect();
    subjects.sort_by_key(|s| s[1..].parse::<u32>().unwrap());
    let want: Vec<String> = (0..20).map(|i| format!("c{i}")).collect();
    assert_eq!(subjects, want);
    // The worker's own view of its conversations (through the membership index).
    let mut worker = WsClient::agent(url, "worker", json!({})).await;
    let mine = all_pages(
        &mut worker,
        "mail/list",
        json!({"limit": 5}),
        "conversations",
    )
    .await;
    assert_eq!(mine.len(), 21);
}

/// The router's caches, in items.
async fn cached(server: &Server) -> (usize, usize, usize, usize) {
    let t = with_timeout(server.router().stats()).await.unwrap().tables;
    (
        t.cached_tasks,
        t.cached_checkpoints,
        t.cached_conversations,
        t.cached_turns,
    )
}

/// A bound on what the caches may hold once everything is committed: their capacity, plus
/// one load.
fn assert_bounded(sizes: (usize, usize, usize, usize)) {
    let (tasks, checkpoints, convs, turns) = sizes;
    assert!(tasks <= CACHE + 2, "{sizes:?}");
    assert!(checkpoints <= CACHE + 2, "{sizes:?}");
    assert!(convs <= CACHE + 2, "{sizes:?}");
    assert!(turns <= 4 * CACHE + 3, "{sizes:?}");
}

/// More tasks, checkpoints, conversations and turns than the cache holds are read back in
/// order, through list and get, from the store and across a restart; the cache stays within
/// its bound.
#[tokio::test]
async fn paging_reads_everything_back_across_a_restart_and_the_cache_stays_bounded() {
    let dir = TempDir::new("memory-paging");
    let (server, url) = small_cache(Some(&dir)).await;
    let conv = fill(&url).await;
    assert_bounded(cached(&server).await);
    read_back(&url, &conv).await;
    assert_bounded(cached(&server).await);
    with_timeout(server.shutdown()).await;

    let (server, url) = small_cache(Some(&dir)).await;
    assert_eq!(
        cached(&server).await,
        (0, 0, 0, 0),
        "nothing is loaded at start"
    );
    read_back(&url, &conv).await;
    assert_bounded(cached(&server).await);
    // Changes after the restart land on the stored items.
    let mut c = WsClient::system(&url).await;
    c.ok(
        "map/tasks/update",
        json!({"taskId": "t001", "status": "failed", "meta": {"g": 1}}),
    )
    .await;
    let got = c.ok("map/tasks/get", json!({"taskId": "t001"})).await;
    assert_eq!(got["task"]["status"], json!("failed"));
    assert_eq!(got["task"]["meta"], json!({"n": 1, "f": 2.50, "g": 1}));
    let err = c
        .err("map/tasks/create", json!({"task": {"id": "t002"}}))
        .await;
    assert_invalid_params(&err);
    with_timeout(server.shutdown()).await;
}

/// The same reads against a router without a store (its kept tables are in memory).
#[tokio::test]
async fn paging_reads_the_same_without_a_store() {
    let (server, url) = small_cache(None).await;
    let conv = fill(&url).await;
    read_back(&url, &conv).await;
    assert_bounded(cached(&server).await);
}

/// A send to a scope whose members are mostly orphaned records a sample of them, not the list.
#[tokio::test]
async fn a_group_send_names_at_most_a_sample_of_its_silent_recipients() {
    let (_server, url) = default_server().await;
    let mut watcher = WsClient::system(&url).await;
    let sub = watcher
        .subscribe(json!({"eventTypes": ["message_failed", "message_delivered"]}))
        .await;
    let mut owner = WsClient::agent(&url, "owner", json!({})).await;
    owner
        .ok(
            "map/scopes/create",
            json!({"scopeId": "crowd", "sendPolicy": "any"}),
        )
        .await;
    let mut gone = WsClient::connect_as(&url, "agent", json!({})).await;
    let mut silent = Vec::new();
    for i in 0..100 {
        let id = format!("m{i:03}");
        gone.register_agent(json!({"agentId": id, "scopes": ["crowd"]}))
            .await;
        silent.push(id);
    }
    let mut here = WsClient::agent(&url, "here", json!({"scopes": ["crowd"]})).await;
    // The members' connection drops: its 100 agents stay, orphaned, for the grace period.
    gone.drop_abruptly();
    let mut sender = WsClient::agent(&url, "sender", json!({})).await;
    let r = loop {
        let r = sender
            .send(json!({"scope": "crowd"}), json!({"n": 1}))
            .await;
        if r["delivered"] == json!(["here"]) {
            break r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let _ = here.next_message().await;
    // The outcome events of that message.
    let failed = loop {
        let ev = watcher.next_event(&sub).await;
        if ev["event"]["data"]["messageId"] == r["messageId"]
            && ev["event"]["type"] == json!("message_failed")
        {
            break ev["event"]["data"].clone();
        }
    };
    assert_eq!(failed["reason"], json!("recipient_offline"));
    assert_eq!(failed["recipientCount"], json!(100), "{failed}");
    let named: Vec<&str> = failed["recipients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(named.len(), 32, "{failed}");
    assert!(named.iter().all(|n| silent.iter().any(|s| s == n)));
    assert!(
        failed.to_string().len() < 2048,
        "the record stays small: {failed}"
    );
    // A send to one of them keeps its own per-recipient event.
    let one = sender.send(json!({"agent": "m007"}), json!(2)).await;
    let ev = loop {
        let ev = watcher.next_event(&sub).await;
        if ev["event"]["data"]["messageId"] == one["messageId"] {
            break ev;
        }
    };
    assert_eq!(ev["event"]["data"]["recipient"], json!("m007"), "{ev}");
    assert!(ev["event"]["data"].get("recipientCount").is_none());
}

/// Each quota refuses the one item too many with 4002 naming it; another principal is not
/// affected; the counts survive a restart; replacing a checkpoint is not a new one.
#[test]
fn quotas_refuse_what_one_principal_creates_past_its_limit() {
    // Two servers (a restart) and their connections run on the test's thread: more than the
    // default 2 MiB of stack in a debug build.
    common::on_big_stack(quotas_past_their_limit);
}

async fn quotas_past_their_limit() {
    let dir = TempDir::new("memory-quotas");
    let start = |dir: &TempDir| {
        let data = dir.path.clone();
        start_server(move |c| {
            c.storage.data_dir = Some(data);
            c.storage.cache_items = 2;
            c.auth.api_keys.inline = Some(Secret(format!("{ALICE} alice\n{BOB} bob")));
            c.limits.max_tasks_per_principal = 3;
            c.limits.max_conversations_per_principal = 2;
            c.limits.max_turns_per_conversation = 3;
            c.limits.max_checkpoints_per_principal = 2;
        })
    };
    let quota = |err: &Value, what: &str, limit: u64| {
        assert_eq!(err["code"], json!(4002), "{err}");
        assert_eq!(
            err["message"],
            json!(format!("Quota exceeded: {what} (limit {limit})")),
            "{err}"
        );
    };
    let (server, url) = start(&dir).await;
    // Two sessions of alice share her counts.
    let mut a1 = WsClient::connect_as(&url, "agent", key(ALICE)).await;
    a1.register_agent(json!({"agentId": "a1"})).await;
    let mut a2 = WsClient::connect_as(&url, "agent", key(ALICE)).await;
    a2.register_agent(json!({"agentId": "a2"})).await;
    let mut bob = WsClient::connect_as(&url, "agent", key(BOB)).await;
    bob.register_agent(json!({"agentId": "b"})).await;

    for i in 0..3 {
        let who = if i % 2 == 0 { &mut a1 } else { &mut a2 };
        who.ok(
            "map/tasks/create",
            json!({"task": {"title": format!("{i}")}}),
        )
        .await;
    }
    let err = a2.err("map/tasks/create", json!({"task": {}})).await;
    quota(&err, "tasks per principal", 3);
    bob.ok("map/tasks/create", json!({"task": {}})).await;

    a1.ok(
        "trajectory/checkpoint",
        json!({"checkpoint": {"id": "k1", "agentId": "a1"}}),
    )
    .await;
    a2.ok(
        "trajectory/checkpoint",
        json!({"checkpoint": {"id": "k2", "agentId": "a2"}}),
    )
    .await;
    // Reporting an id again replaces it: not a new checkpoint.
    a1.ok(
        "trajectory/checkpoint",
        json!({"checkpoint": {"id": "k1", "agentId": "a1", "label": "again"}}),
    )
    .await;
    let err = a1
        .err(
            "trajectory/checkpoint",
            json!({"checkpoint": {"id": "k3", "agentId": "a1"}}),
        )
        .await;
    quota(&err, "checkpoints per principal", 2);
    bob.ok(
        "trajectory/checkpoint",
        json!({"checkpoint": {"id": "kb", "agentId": "b"}}),
    )
    .await;

    let conv = a1
        .ok(
            "mail/create",
            json!({"initialParticipants": [{"id": "b"}],
                   "initialTurn": {"contentType": "text", "content": "1"}}),
        )
        .await["conversation"]["id"]
        .clone();
    a2.ok("mail/create", json!({})).await;
    let err = a1.err("mail/create", json!({})).await;
    quota(&err, "conversations per principal", 2);
    bob.ok("mail/create", json!({})).await;

    // Turns per conversation: the initial turn, one recorded, one sent.
    a1.ok(
        "mail/turn",
        json!({"conversationId": conv, "contentType": "text", "content": "2"}),
    )
    .await;
    bob.ok(
        "map/send",
        json!({"to": {"agent": "a1"}, "payload": "3", "meta": {"mail": {"conversationId": conv}}}),
    )
    .await;
    assert_eq!(a1.next_message().await["payload"], json!("3"));
    let err = bob
        .err(
            "mail/turn",
            json!({"conversationId": conv, "contentType": "text", "content": "4"}),
        )
        .await;
    quota(&err, "turns per conversation", 3);
    // A refused send delivers nothing.
    let err = bob
        .err(
            "map/send",
            json!({"to": {"agent": "a1"}, "payload": "5", "meta": {"mail": {"conversationId": conv}}}),
        )
        .await;
    quota(&err, "turns per conversation", 3);
    a1.assert_no_message().await;
    drop((a1, a2, bob));
    with_timeout(server.shutdown()).await;

    // The counts are the store's: a restart does not reset them.
    let (server, url) = start(&dir).await;
    let mut a = WsClient::connect_as(&url, "client", key(ALICE)).await;
    let err = a.err("map/tasks/create", json!({"task": {}})).await;
    quota(&err, "tasks per principal", 3);
    let err = a.err("mail/create", json!({})).await;
    quota(&err, "conversations per principal", 2);
    let mut b = WsClient::connect_as(&url, "client", key(BOB)).await;
    b.ok("map/tasks/create", json!({"task": {}})).await;
    with_timeout(server.shutdown()).await;
}

/// A data directory written by the previous layout (schema 1: the kept tables without their
/// indexed columns) opens, is migrated, and reads back; it then takes new items.
#[tokio::test]
async fn a_data_dir_of_the_old_layout_opens_and_reads_back() {
    const CONV: &str = "conv-01M8A5PMEE9BC96WXDRQDDA6GA";
    const THREAD: &str = "thread-01M8A5PMET81YTTM05GC31Z08D";
    const ROOT: &str = "turn-01M8A5PMEE8K38TN222QCW14W4";
    let dir = TempDir::new("memory-v1");
    let db = dir.path.join("events.sqlite3");
    {
        let sql = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-v1.sql"),
        )
        .unwrap();
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(&sql).unwrap();
    }
    let (server, url) = small_cache(Some(&dir)).await;
    let mut c = WsClient::system(&url).await;
    let tasks = c.ok("map/tasks/list", json!({})).await;
    assert_eq!(strings(&tasks, "tasks", "id"), ["t1", "t2", "t3"]);
    assert_eq!(tasks["tasks"][1]["status"], json!("completed"));
    assert_eq!(tasks["tasks"][2]["assignee"], json!("bob"));
    assert_eq!(tasks["tasks"][0]["meta"]["raw"]["a"].to_string(), "2.0");
    let by_bob = c
        .ok("map/tasks/list", json!({"filter": {"assignee": "bob"}}))
        .await;
    assert_eq!(strings(&by_bob, "tasks", "id"), ["t3"]);
    let cps = c
        .ok("trajectory/list", json!({"filter": {"agentId": "alice"}}))
        .await;
    assert_eq!(strings(&cps, "checkpoints", "id"), ["c3", "c2", "c1"]);
    let got = c
        .ok(
            "mail/get",
            json!({"conversationId": CONV, "include": {"participants": true, "threads": true, "stats": true}}),
        )
        .await;
    assert_eq!(got["conversation"]["subject"], json!("kept"));
    assert_eq!(strings(&got, "participants", "id"), ["alice", "bob"]);
    assert_eq!(got["threads"][0]["id"], json!(THREAD));
    assert_eq!(got["threads"][0]["turnCount"], json!(1), "{got}");
    assert_eq!(got["stats"]["totalTurns"], json!(3));
    let turns = c
        .ok("mail/turns/list", json!({"conversationId": CONV}))
        .await;
    assert_eq!(turns["turns"].as_array().unwrap().len(), 3);
    assert_eq!(turns["turns"][0]["id"], json!(ROOT));
    assert_eq!(turns["turns"][2]["inReplyTo"], json!(ROOT));
    let in_thread = c
        .ok(
            "mail/turns/list",
            json!({"conversationId": CONV, "filter": {"threadId": THREAD}}),
        )
        .await;
    assert_eq!(in_thread["turns"][0]["content"], json!("three"));
    // The conversation's members are indexed: alice finds it in her own list.
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    let mine = alice.ok("mail/list", json!({})).await;
    assert_eq!(strings(&mine, "conversations", "id"), [CONV]);
    alice
        .ok(
            "mail/turn",
            json!({"conversationId": CONV, "contentType": "text", "content": "four", "inReplyTo": ROOT}),
        )
        .await;
    c.ok("map/tasks/create", json!({"task": {"id": "t4"}}))
        .await;
    drop((c, alice));
    with_timeout(server.shutdown()).await;
    let version: String = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(version, "2");
    let (server, url) = small_cache(Some(&dir)).await;
    let mut c = WsClient::system(&url).await;
    let tasks = c.ok("map/tasks/list", json!({})).await;
    assert_eq!(strings(&tasks, "tasks", "id"), ["t1", "t2", "t3", "t4"]);
    let turns = c
        .ok("mail/turns/list", json!({"conversationId": CONV}))
        .await;
    assert_eq!(turns["turns"].as_array().unwrap().len(), 4);
    with_timeout(server.shutdown()).await;
}
