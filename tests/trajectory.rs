//! The trajectory extension over real WebSockets: an agent reports checkpoints (the router fills
//! the timestamp and publishes `trajectory.checkpoint`), observers list them newest first with
//! filters and paging, get one, and ask for its content, which the router fetches from the
//! agent (inline, or streamed in chunks when large); checkpoints survive a restart and are
//! hidden from whoever may not see their agent.

mod common;

use base64::Engine as _;
use common::*;
use map_router::auth::config::Secret;
use map_router::server::Server;
use serde_json::{json, Value};
use sha2::Digest as _;

const ALICE: &str = "ak-alice-0123456789abcdef";
const BOB: &str = "ak-bob-0123456789abcdef";

fn key(k: &str) -> Value {
    json!({"auth": {"method": "api-key", "credential": k}})
}

fn ids(list: &Value) -> Vec<String> {
    list["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn durable(dir: &TempDir) -> (Server, String) {
    let data = dir.path.clone();
    start_server(move |c| c.storage.data_dir = Some(data)).await
}

#[tokio::test]
async fn a_checkpoint_is_stamped_published_and_read_back() {
    let (_server, url) = default_server().await;
    let mut watcher = WsClient::system(&url).await;
    let sub = watcher
        .subscribe(json!({"trajectory": {"agentId": "worker"}}))
        .await;
    let other = watcher
        .subscribe(json!({"trajectory": {"agentId": "someone-else"}}))
        .await;
    let mut agent = WsClient::agent(&url, "worker", json!({})).await;
    let before = map_router::protocol::ids::now_ms();
    let r = agent
        .ok(
            "trajectory/checkpoint",
            json!({"checkpoint": {"id": "cp-1", "agentId": "worker", "label": "planned",
                   "sessionId": "w-1", "metadata": {"usage": {"inputTokens": 10}}}}),
        )
        .await;
    let cp = &r["checkpoint"];
    assert_eq!(cp["id"], json!("cp-1"));
    assert_eq!(cp["agentId"], json!("worker"));
    assert!(cp["timestamp"].as_u64().unwrap() >= before, "{cp}");
    assert_eq!(cp["metadata"], json!({"usage": {"inputTokens": 10}}));

    let ev = watcher.event_of_type(&sub, "trajectory.checkpoint").await;
    assert_eq!(ev["event"]["data"]["checkpoint"], *cp);
    assert_eq!(ev["event"]["source"], json!("worker"));
    watcher
        .assert_none_where("an event for another agent's trajectory filter", |v| {
            v["params"]["subscriptionId"] == json!(other)
        })
        .await;

    let mut client = WsClient::client(&url).await;
    let got = client
        .ok("trajectory/get", json!({"checkpointId": "cp-1"}))
        .await;
    assert_eq!(got["checkpoint"], *cp);
    let err = client
        .err("trajectory/get", json!({"checkpointId": "nope"}))
        .await;
    assert_eq!(err["code"], json!(13001), "{err}");
    assert_eq!(err["data"]["category"], json!("trajectory"), "{err}");
}

#[tokio::test]
async fn list_pages_newest_first_with_filters() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "a", json!({})).await;
    let mut b = WsClient::agent(&url, "b", json!({})).await;
    for i in 1..=5u64 {
        a.ok(
            "trajectory/checkpoint",
            json!({"checkpoint": {"id": format!("a{i}"), "agentId": "a", "timestamp": 1000 + i,
                   "sessionId": if i % 2 == 0 { "even" } else { "odd" }}}),
        )
        .await;
    }
    b.ok(
        "trajectory/checkpoint",
        json!({"checkpoint": {"id": "b1", "agentId": "b", "timestamp": 1003}}),
    )
    .await;
    let mut c = WsClient::client(&url).await;
    let all = c.ok("trajectory/list", json!({})).await;
    assert_eq!(ids(&all), ["a5", "a4", "b1", "a3", "a2", "a1"]);
    assert_eq!(all["hasMore"], json!(false));
    assert!(all.get("nextCursor").is_none(), "{all}");

    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let mut params = json!({"filter": {"agentId": "a"}, "limit": 2});
        if let Some(c) = &cursor {
            params["cursor"] = json!(c);
        }
        let page = c.ok("trajectory/list", params).await;
        pages.push(ids(&page));
        match page["nextCursor"].as_str() {
            Some(next) => {
                assert_eq!(page["hasMore"], json!(true));
                cursor = Some(next.to_owned());
            }
            None => break,
        }
    }
    assert_eq!(
        pages,
        [vec!["a5", "a4"], vec!["a3", "a2"], vec!["a1"]],
        "pages of 2"
    );

    let window = c
        .ok(
            "trajectory/list",
            json!({"filter": {"afterTimestamp": 1001, "beforeTimestamp": 1005}}),
        )
        .await;
    assert_eq!(ids(&window), ["a4", "b1", "a3", "a2"]);
    let even = c
        .ok("trajectory/list", json!({"filter": {"sessionId": "even"}}))
        .await;
    assert_eq!(ids(&even), ["a4", "a2"]);
    let bad = c
        .err("trajectory/list", json!({"cursor": "no-such-checkpoint"}))
        .await;
    assert_eq!(bad["code"], json!(-32602), "{bad}");
}

#[tokio::test]
async fn only_an_agents_owner_reports_for_it_and_ids_are_not_stolen() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "a", json!({})).await;
    let mut b = WsClient::agent(&url, "b", json!({})).await;
    a.ok(
        "trajectory/checkpoint",
        json!({"checkpoint": {"id": "shared", "agentId": "a"}}),
    )
    .await;
    let denied = b
        .err(
            "trajectory/checkpoint",
            json!({"checkpoint": {"id": "x", "agentId": "a"}}),
        )
        .await;
    assert_eq!(denied["code"], json!(13004), "{denied}");
    let taken = b
        .err(
            "trajectory/checkpoint",
            json!({"checkpoint": {"id": "shared", "agentId": "b"}}),
        )
        .await;
    assert_eq!(taken["code"], json!(13004), "{taken}");
    // Without agentId, the session's agent is meant.
    let own = b
        .ok(
            "trajectory/checkpoint",
            json!({"checkpoint": {"id": "mine"}}),
        )
        .await;
    assert_eq!(own["checkpoint"]["agentId"], json!("b"));
    // A client holds no agent and may not report.
    let mut c = WsClient::client(&url).await;
    let refused = c
        .err(
            "trajectory/checkpoint",
            json!({"checkpoint": {"id": "c", "agentId": "a"}}),
        )
        .await;
    assert_eq!(refused["code"], json!(1003), "{refused}");
    // The same id from the same agent replaces the checkpoint.
    a.ok(
        "trajectory/checkpoint",
        json!({"checkpoint": {"id": "shared", "agentId": "a", "label": "v2"}}),
    )
    .await;
    let got = c
        .ok("trajectory/get", json!({"checkpointId": "shared"}))
        .await;
    assert_eq!(got["checkpoint"]["label"], json!("v2"));
    let list = c
        .ok("trajectory/list", json!({"filter": {"agentId": "a"}}))
        .await;
    assert_eq!(ids(&list), ["shared"]);
}

#[tokio::test]
async fn another_principal_cannot_read_a_hidden_agents_checkpoints() {
    let (_server, url) = start_server(|c| {
        c.auth.api_keys.inline = Some(Secret(format!("{ALICE} alice\n{BOB} bob")));
    })
    .await;
    let mut alice = WsClient::connect_as(&url, "agent", key(ALICE)).await;
    alice
        .register_agent(json!({"agentId": "secret", "visibility": "parent-only"}))
        .await;
    alice
        .ok(
            "trajectory/checkpoint",
            json!({"checkpoint": {"id": "s1", "agentId": "secret"}}),
        )
        .await;
    let mut bob = WsClient::connect_as(&url, "client", key(BOB)).await;
    let err = bob
        .err("trajectory/get", json!({"checkpointId": "s1"}))
        .await;
    assert_eq!(err["code"], json!(13001), "{err}");
    let list = bob.ok("trajectory/list", json!({})).await;
    assert!(ids(&list).is_empty(), "{list}");
    let content = bob
        .err("trajectory/content", json!({"checkpointId": "s1"}))
        .await;
    assert_eq!(content["code"], json!(13001), "{content}");
    // Its owner sees it.
    let mine = alice.ok("trajectory/list", json!({})).await;
    assert_eq!(ids(&mine), ["s1"]);
}

#[tokio::test]
async fn checkpoints_survive_a_restart() {
    let dir = TempDir::new("trajectory");
    let (server, url) = durable(&dir).await;
    let mut a = WsClient::agent(&url, "a", json!({})).await;
    for i in 1..=3 {
        a.ok(
            "trajectory/checkpoint",
            json!({"checkpoint": {"id": format!("c{i}"), "agentId": "a", "timestamp": 100 + i,
                   "metadata": {"step": i}}}),
        )
        .await;
    }
    drop(a);
    with_timeout(server.shutdown()).await;
    let (server, url) = durable(&dir).await;
    let mut c = WsClient::system(&url).await;
    let list = c.ok("trajectory/list", json!({})).await;
    assert_eq!(ids(&list), ["c3", "c2", "c1"]);
    let got = c.ok("trajectory/get", json!({"checkpointId": "c2"})).await;
    assert_eq!(got["checkpoint"]["metadata"], json!({"step": 2}));
    assert_eq!(got["checkpoint"]["timestamp"], json!(102));
    let _ = within(std::time::Duration::from_secs(10), server.shutdown()).await;
}

/// Answers the next `trajectory/content.request` on `agent` with `artifacts`; returns the
/// request's params.
async fn answer_content(agent: &mut WsClient, artifacts: Value) -> Value {
    let req = agent.notification("trajectory/content.request").await;
    let params = req["params"].clone();
    agent
        .send_json(
            &json!({"jsonrpc": "2.0", "method": "trajectory/content.response",
            "params": {"requestId": params["requestId"], "artifacts": artifacts}}),
        )
        .await;
    params
}

#[tokio::test]
async fn content_comes_from_the_agent_inline_or_in_chunks() {
    let (_server, url) = default_server().await;
    let mut agent = WsClient::agent(&url, "a", json!({})).await;
    agent
        .ok(
            "trajectory/checkpoint",
            json!({"checkpoint": {"id": "c1", "agentId": "a"}}),
        )
        .await;
    let mut client = WsClient::client(&url).await;

    // Small: inline.
    let call = tokio::spawn(async move {
        let r = client
            .ok(
                "trajectory/content",
                json!({"checkpointId": "c1", "include": ["transcript"]}),
            )
            .await;
        (client, r)
    });
    let asked = with_timeout(answer_content(
        &mut agent,
        json!({"transcript": ["hello"], "extra": 1}),
    ))
    .await;
    assert_eq!(asked["checkpointId"], json!("c1"));
    assert_eq!(asked["include"], json!(["transcript"]));
    let (mut client, r) = with_timeout(call).await.unwrap();
    assert_eq!(r["content"]["streaming"], json!(false), "{r}");
    assert_eq!(
        r["content"]["artifacts"],
        json!({"transcript": ["hello"]}),
        "only what was asked for"
    );

    // Large: the biggest artifact is streamed after the answer.
    let big: Vec<String> = (0..12_000)
        .map(|i| format!("line {i} of the transcript"))
        .collect();
    let big_text = serde_json::to_string(&big).unwrap();
    let call = tokio::spawn(async move {
        let r = client
            .ok("trajectory/content", json!({"checkpointId": "c1"}))
            .await;
        (client, r)
    });
    with_timeout(answer_content(
        &mut agent,
        json!({"transcript": big, "summary": "short"}),
    ))
    .await;
    let (mut client, r) = with_timeout(call).await.unwrap();
    let content = &r["content"];
    assert_eq!(
        content["streaming"],
        json!(true),
        "{} bytes of artifacts were inlined",
        content.to_string().len()
    );
    assert_eq!(content["streamArtifact"], json!("transcript"));
    assert_eq!(content["artifacts"], json!({"summary": "short"}));
    let total = content["streamInfo"]["totalChunks"].as_u64().unwrap();
    assert!(total >= 2, "{}", content["streamInfo"]);
    let stream = content["streamId"].clone();
    let mut bytes = Vec::new();
    let mut checksum = None;
    for i in 0..total {
        let chunk = client.notification("trajectory/content.chunk").await["params"].clone();
        assert_eq!(chunk["streamId"], stream);
        assert_eq!(chunk["index"], json!(i));
        bytes.extend(
            base64::engine::general_purpose::STANDARD
                .decode(chunk["data"].as_str().unwrap())
                .unwrap(),
        );
        if i + 1 == total {
            assert_eq!(chunk["final"], json!(true));
            checksum = chunk["checksum"].as_str().map(str::to_owned);
        }
    }
    assert_eq!(
        bytes.len() as u64,
        content["streamInfo"]["totalBytes"].as_u64().unwrap()
    );
    let digest: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(checksum.as_deref(), Some(digest.as_str()));
    let streamed: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        streamed,
        serde_json::from_str::<Value>(&big_text).unwrap(),
        "the artifact, reassembled"
    );

    // The agent refuses: 13002 with its reason; the agent gone: 13002 at once.
    let call = tokio::spawn(async move {
        let e = client
            .err("trajectory/content", json!({"checkpointId": "c1"}))
            .await;
        (client, e)
    });
    let req = with_timeout(agent.notification("trajectory/content.request")).await;
    agent
        .send_json(
            &json!({"jsonrpc": "2.0", "method": "trajectory/content.response",
            "params": {"requestId": req["params"]["requestId"], "error": "transcript purged"}}),
        )
        .await;
    let (mut client, e) = with_timeout(call).await.unwrap();
    assert_eq!(e["code"], json!(13002), "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("transcript purged"),
        "{e}"
    );
    agent.close().await;
    let e = client
        .err("trajectory/content", json!({"checkpointId": "c1"}))
        .await;
    assert_eq!(e["code"], json!(13002), "{e}");
}
