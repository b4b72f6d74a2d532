//! The mail extension over real WebSockets: conversations are created, joined, left and
//! closed; turns are recorded with `mail/turn` and by `map/send` with `meta.mail` (whose agent
//! recipients join); turns are listed, replayed, threaded and summarised; `mail.*` events reach
//! exactly the conversation's participants (and `mail` filters narrow them); a participant
//! outside a conversation sees nothing of it; everything survives a restart.

mod common;

use common::*;
use map_router::server::Server;
use serde_json::{json, Value};

fn turn_contents(page: &Value) -> Vec<Value> {
    page["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["content"].clone())
        .collect()
}

async fn durable(dir: &TempDir) -> (Server, String) {
    let data = dir.path.clone();
    start_server(move |c| c.storage.data_dir = Some(data)).await
}

#[tokio::test]
async fn a_conversation_records_sends_and_turns_and_only_its_participants_see_it() {
    let (_server, url) = default_server().await;
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    let mut bob = WsClient::agent(&url, "bob", json!({})).await;
    let mut eve = WsClient::agent(&url, "eve", json!({})).await;
    let bob_sub = bob.subscribe(json!({"eventTypes": ["mail.*"]})).await;
    let eve_sub = eve.subscribe(json!({"eventTypes": ["mail.*"]})).await;

    let created = alice
        .ok(
            "mail/create",
            json!({"subject": "plan", "metadata": {"b": 1, "a": 2.0},
                   "initialTurn": {"contentType": "text", "content": "let us plan"}}),
        )
        .await;
    let conv = &created["conversation"];
    let id = conv["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("conv-"), "{conv}");
    assert_eq!(conv["type"], json!("multi-agent"));
    assert_eq!(conv["status"], json!("active"));
    assert_eq!(conv["createdBy"], json!("alice"));
    assert_eq!(conv["participantCount"], json!(1));
    assert_eq!(conv["metadata"]["a"].to_string(), "2.0");
    assert_eq!(created["participant"]["role"], json!("initiator"));
    assert_eq!(created["participant"]["type"], json!("agent"));
    assert_eq!(created["initialTurn"]["content"], json!("let us plan"));

    // A send with meta.mail is routed, recorded, and its agent recipient joins.
    let sent = alice
        .ok(
            "map/send",
            json!({"to": {"agent": "bob"}, "payload": {"ask": "schedule?"},
                   "meta": {"mail": {"conversationId": id}}}),
        )
        .await;
    let msg = bob.next_message().await;
    assert_eq!(msg["meta"]["mail"]["conversationId"], json!(id));
    let joined = bob.event_of_type(&bob_sub, "mail.participant.joined").await;
    assert_eq!(joined["event"]["data"]["participant"]["id"], json!("bob"));
    let added = bob.event_of_type(&bob_sub, "mail.turn.added").await;
    let turn = &added["event"]["data"]["turn"];
    assert_eq!(turn["participant"], json!("alice"));
    assert_eq!(turn["contentType"], json!("data"));
    assert_eq!(turn["content"], json!({"ask": "schedule?"}));
    assert_eq!(
        turn["source"],
        json!({"type": "intercepted", "messageId": sent["messageId"]})
    );
    // Bob answers in the conversation, as sendWithMail does.
    bob.ok(
        "map/send",
        json!({"to": {"agent": "alice"}, "payload": "tuesday",
               "meta": {"mail": {"conversationId": id}}}),
    )
    .await;
    let t = bob
        .ok(
            "mail/turn",
            json!({"conversationId": id, "contentType": "x-note", "content": {"n": 1}}),
        )
        .await;
    assert_eq!(
        t["turn"]["source"],
        json!({"type": "explicit", "method": "mail/turn"})
    );

    let page = alice
        .ok("mail/turns/list", json!({"conversationId": id}))
        .await;
    assert_eq!(
        turn_contents(&page),
        [
            json!("let us plan"),
            json!({"ask": "schedule?"}),
            json!("tuesday"),
            json!({"n": 1})
        ]
    );
    let page2 = alice
        .ok(
            "mail/turns/list",
            json!({"conversationId": id, "limit": 2, "order": "desc"}),
        )
        .await;
    assert_eq!(turn_contents(&page2), [json!({"n": 1}), json!("tuesday")]);
    assert_eq!(page2["hasMore"], json!(true));
    let got = alice
        .ok(
            "mail/get",
            json!({"conversationId": id, "include": {"participants": true, "stats": true, "recentTurns": 1}}),
        )
        .await;
    assert_eq!(got["conversation"]["participantCount"], json!(2));
    assert_eq!(got["stats"]["totalTurns"], json!(4));
    assert_eq!(
        got["stats"]["turnsByContentType"],
        json!({"text": 2, "data": 1, "x-note": 1})
    );
    assert_eq!(got["recentTurns"][0]["content"], json!({"n": 1}));

    // Eve takes no part: nothing of it exists for her.
    for (method, params) in [
        ("mail/get", json!({"conversationId": id})),
        ("mail/turns/list", json!({"conversationId": id})),
        (
            "mail/turn",
            json!({"conversationId": id, "contentType": "text", "content": "hi"}),
        ),
        ("mail/join", json!({"conversationId": id})),
    ] {
        let err = eve.err(method, params).await;
        assert_eq!(err["code"], json!(10000), "{method}: {err}");
        assert_eq!(err["data"]["category"], json!("mail"), "{err}");
    }
    let err = eve
        .err(
            "map/send",
            json!({"to": {"agent": "bob"}, "payload": 1, "meta": {"mail": {"conversationId": id}}}),
        )
        .await;
    assert_eq!(err["code"], json!(10000), "{err}");
    let list = eve.ok("mail/list", json!({})).await;
    assert_eq!(list["conversations"], json!([]));
    eve.assert_no_event(&eve_sub).await;
    let theirs = bob.ok("mail/list", json!({})).await;
    assert_eq!(theirs["conversations"][0]["id"], json!(id));
}

#[tokio::test]
async fn leave_close_threads_and_errors() {
    let (_server, url) = default_server().await;
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    let mut bob = WsClient::agent(&url, "bob", json!({})).await;
    let created = alice
        .ok(
            "mail/create",
            json!({"initialParticipants": [{"id": "bob", "role": "worker"}],
                   "initialTurn": {"contentType": "text", "content": "root"}}),
        )
        .await;
    let id = created["conversation"]["id"].as_str().unwrap().to_owned();
    let root = created["initialTurn"]["id"].as_str().unwrap().to_owned();
    let thread = bob
        .ok(
            "mail/thread/create",
            json!({"conversationId": id, "rootTurnId": root, "subject": "details"}),
        )
        .await;
    let th = thread["thread"]["id"].as_str().unwrap().to_owned();
    bob.ok(
        "mail/turn",
        json!({"conversationId": id, "contentType": "text", "content": "in thread", "threadId": th, "inReplyTo": root}),
    )
    .await;
    let threads = alice
        .ok("mail/thread/list", json!({"conversationId": id}))
        .await;
    assert_eq!(threads["threads"][0]["turnCount"], json!(1));
    assert_eq!(threads["threads"][0]["subject"], json!("details"));
    let in_thread = alice
        .ok(
            "mail/turns/list",
            json!({"conversationId": id, "filter": {"threadId": th}}),
        )
        .await;
    assert_eq!(turn_contents(&in_thread), [json!("in thread")]);
    let replay = alice
        .ok(
            "mail/replay",
            json!({"conversationId": id, "fromTurnId": root}),
        )
        .await;
    assert_eq!(replay["missedCount"], json!(1));
    let summary = alice
        .ok("mail/summary", json!({"conversationId": id}))
        .await;
    assert!(
        summary["summary"]
            .as_str()
            .unwrap()
            .contains("2 turns by 2 participants"),
        "{summary}"
    );

    for (params, code) in [
        (
            json!({"conversationId": id, "contentType": "text", "content": 5}),
            10006,
        ),
        (
            json!({"conversationId": id, "contentType": "weird", "content": "x"}),
            10006,
        ),
        (
            json!({"conversationId": id, "contentType": "text", "content": "x", "threadId": "nope"}),
            10005,
        ),
        (
            json!({"conversationId": id, "contentType": "text", "content": "x", "inReplyTo": "nope"}),
            10004,
        ),
        (
            json!({"conversationId": "conv-nope", "contentType": "text", "content": "x"}),
            10000,
        ),
    ] {
        let err = bob.err("mail/turn", params.clone()).await;
        assert_eq!(err["code"], json!(code), "{params}: {err}");
    }
    // A worker may not close; a participant that left may not speak but still reads.
    let err = bob.err("mail/close", json!({"conversationId": id})).await;
    assert_eq!(err["code"], json!(10003), "{err}");
    let left = bob
        .ok(
            "mail/leave",
            json!({"conversationId": id, "reason": "done"}),
        )
        .await;
    assert_eq!(left["success"], json!(true));
    let err = bob
        .err(
            "mail/turn",
            json!({"conversationId": id, "contentType": "text", "content": "late"}),
        )
        .await;
    assert_eq!(err["code"], json!(10002), "{err}");
    bob.ok("mail/turns/list", json!({"conversationId": id}))
        .await;
    let back = bob
        .ok(
            "mail/join",
            json!({"conversationId": id, "catchUp": {"from": 0, "includeSummary": true}}),
        )
        .await;
    assert_eq!(back["participant"]["role"], json!("worker"));
    assert_eq!(back["history"].as_array().unwrap().len(), 2);
    let err = bob.err("mail/join", json!({"conversationId": id})).await;
    assert_eq!(err["code"], json!(10007), "{err}");

    let closed = alice
        .ok(
            "mail/close",
            json!({"conversationId": id, "reason": "shipped"}),
        )
        .await;
    assert_eq!(closed["conversation"]["status"], json!("completed"));
    assert!(closed["conversation"]["closedAt"].is_u64());
    let err = bob
        .err(
            "map/send",
            json!({"to": {"agent": "alice"}, "payload": "x", "meta": {"mail": {"conversationId": id}}}),
        )
        .await;
    assert_eq!(err["code"], json!(10001), "{err}");
    bob.assert_no_message().await;
    let err = alice.err("mail/close", json!({"conversationId": id})).await;
    assert_eq!(err["code"], json!(10001), "{err}");
    let err = alice
        .err(
            "map/send",
            json!({"to": {"agent": "bob"}, "payload": "x", "meta": {"mail": {"conversationId": 7}}}),
        )
        .await;
    assert_eq!(err["code"], json!(-32602), "{err}");
}

#[tokio::test]
async fn mail_filters_narrow_the_stream_and_private_turns_stay_private() {
    let (_server, url) = default_server().await;
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    let mut bob = WsClient::agent(&url, "bob", json!({})).await;
    let mut watcher = WsClient::system(&url).await;
    let a = alice
        .ok(
            "mail/create",
            json!({"initialParticipants": [{"id": "bob"}]}),
        )
        .await["conversation"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let b = alice.ok("mail/create", json!({})).await["conversation"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let only_a_text = watcher
        .subscribe(json!({"mail": {"conversationId": a, "contentType": "text"}}))
        .await;
    let bob_sub = bob.subscribe(json!({"mail": {}})).await;
    alice
        .ok(
            "mail/turn",
            json!({"conversationId": b, "contentType": "text", "content": "b"}),
        )
        .await;
    alice
        .ok(
            "mail/turn",
            json!({"conversationId": a, "contentType": "data", "content": 1}),
        )
        .await;
    alice
        .ok(
            "mail/turn",
            json!({"conversationId": a, "contentType": "text", "content": "secret", "visibility": {"type": "private"}}),
        )
        .await;
    alice
        .ok(
            "mail/turn",
            json!({"conversationId": a, "contentType": "text", "content": "a"}),
        )
        .await;
    let e1 = watcher.next_event(&only_a_text).await;
    assert_eq!(e1["event"]["data"]["turn"]["content"], json!("secret"));
    let e2 = watcher.next_event(&only_a_text).await;
    assert_eq!(e2["event"]["data"]["turn"]["content"], json!("a"));
    watcher.assert_no_event(&only_a_text).await;
    // Bob (in a, not in b) sees a's public turns only.
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(bob.next_event(&bob_sub).await["event"]["data"]["turn"]["content"].clone());
    }
    assert_eq!(seen, [json!(1), json!("a")]);
    bob.assert_no_event(&bob_sub).await;
    let page = bob
        .ok("mail/turns/list", json!({"conversationId": a}))
        .await;
    assert_eq!(turn_contents(&page), [json!(1), json!("a")]);
}

#[tokio::test]
async fn conversations_and_turns_survive_a_restart() {
    let dir = TempDir::new("mail");
    let (server, url) = durable(&dir).await;
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    let _bob = WsClient::agent(&url, "bob", json!({})).await;
    let created = alice
        .ok(
            "mail/create",
            json!({"subject": "kept", "initialTurn": {"contentType": "text", "content": "one"}}),
        )
        .await;
    let id = created["conversation"]["id"].as_str().unwrap().to_owned();
    alice
        .ok(
            "map/send",
            json!({"to": {"agent": "bob"}, "payload": {"two": 2.50}, "meta": {"mail": {"conversationId": id}}}),
        )
        .await;
    let root = created["initialTurn"]["id"].as_str().unwrap().to_owned();
    alice
        .ok(
            "mail/thread/create",
            json!({"conversationId": id, "rootTurnId": root}),
        )
        .await;
    drop(alice);
    drop(_bob);
    with_timeout(server.shutdown()).await;

    let (server, url) = durable(&dir).await;
    let mut sys = WsClient::system(&url).await;
    let got = sys
        .ok(
            "mail/get",
            json!({"conversationId": id, "include": {"participants": true, "threads": true}}),
        )
        .await;
    assert_eq!(got["conversation"]["subject"], json!("kept"));
    let ids: Vec<&str> = got["participants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alice", "bob"]);
    assert_eq!(got["threads"].as_array().unwrap().len(), 1);
    let page = sys
        .ok("mail/turns/list", json!({"conversationId": id}))
        .await;
    assert_eq!(turn_contents(&page), [json!("one"), json!({"two": 2.50})]);
    assert_eq!(page["turns"][1]["content"]["two"].to_string(), "2.5");
    // Alice comes back (a new session for the same agent id) and goes on.
    let mut alice = WsClient::agent(&url, "alice", json!({})).await;
    alice
        .ok(
            "mail/turn",
            json!({"conversationId": id, "contentType": "text", "content": "three"}),
        )
        .await;
    let page = alice
        .ok("mail/turns/list", json!({"conversationId": id}))
        .await;
    assert_eq!(page["turns"].as_array().unwrap().len(), 3);
    let _ = within(std::time::Duration::from_secs(10), server.shutdown()).await;
}
