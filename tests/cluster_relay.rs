//! Cluster relay trust (issue 44, items 1 and 3), end to end on the real binary and a real
//! `nats-server -js` on loopback:
//!
//! - a standby SIGKILLed and started again at once under its own name and config serves at
//!   once; no frame of its predecessor's relay sessions reaches a connection of the new
//!   process; the live node ends the predecessor's sessions once, as lost connections;
//! - a second live process with a node's name (the default name too) refuses to start;
//! - the NATS configuration docs/cluster.md gives (read from the doc) keeps a second NATS user
//!   from reading relayed frames and from answering the writer lock's and the roll call's
//!   requests (the standby takes over in bounded time); a node talking to NATS without TLS off
//!   loopback warns at start, one on loopback does not;
//! - relayed messages lost on the way, and frames batched per NATS message (issue 48): in
//!   order and whole both ways, never to a node that did not say it reads batches, a forged
//!   batch refused whole.
//!
//! Every await is bounded. Needs `nats-server` on PATH (the tests fail, never skip, without it).
#![cfg(feature = "cluster")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{free_port, health_until, node_args, serving};
use common::nats::Nats;
use common::*;
use serde_json::json;

/// A node process with the lines of its stderr so far.
struct Node {
    child: tokio::process::Child,
    url: String,
    lines: Arc<Mutex<Vec<String>>>,
    exited: tokio::sync::watch::Receiver<bool>,
}

impl Node {
    fn stderr(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

/// Starts the binary with `args` (listening on `port`) and waits until its port accepts.
async fn spawn(args: Vec<std::ffi::OsString>, port: u16) -> Node {
    use tokio::io::AsyncBufReadExt;
    let mut child = binary_command(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start a node");
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let (set_exited, exited) = tokio::sync::watch::channel(false);
    {
        let lines = Arc::clone(&lines);
        tokio::spawn(async move {
            while let Ok(Some(line)) = stderr.next_line().await {
                lines.lock().unwrap().push(line);
            }
            let _ = set_exited.send(true);
        });
    }
    let node = Node {
        child,
        url: format!("ws://127.0.0.1:{port}/"),
        lines,
        exited,
    };
    within(Duration::from_secs(20), async {
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    node
}

async fn sigkill(child: &mut tokio::process::Child) {
    child.start_kill().expect("SIGKILL");
    let status = with_timeout(child.wait()).await.unwrap();
    assert!(!status.success(), "killed: {status:?}");
}

/// How many events of the log (replayed on `sys`) satisfy `pred`.
async fn count(sys: &mut WsClient, pred: impl Fn(&serde_json::Value) -> bool) -> usize {
    replay_all(sys, None)
        .await
        .iter()
        .filter(|e| pred(&e["event"]))
        .count()
}

#[tokio::test]
async fn a_standby_restarted_under_its_name_serves_at_once_and_its_predecessor_ends_once() {
    let nats = Nats::start("relay-restart");
    let dir = TempDir::new("cluster-relay-restart");
    let live = live_n0(&nats, &dir).await;
    let port = free_port();
    let args = standby_n1_args(&nats, &dir, port);
    let mut standby = spawn(args.clone(), port).await;
    health_until(&standby.url, Duration::from_secs(20), "serving", serving).await;
    // An agent of the first process (its relay session is that process's first).
    let old = WsClient::agent(&standby.url, "old-a", json!({})).await;
    let old_pid = old.pid();
    let mut sys = WsClient::system(&live.url).await;

    sigkill(&mut standby.child).await;
    let restarted = Instant::now();
    let standby = spawn(args, port).await;
    let serves = health_until(&standby.url, Duration::from_secs(20), "serving", serving).await;
    // Its first connect (the process's first relay session again) is answered at once.
    let asked = Instant::now();
    let mut fresh = within(
        Duration::from_secs(3),
        WsClient::agent(&standby.url, "new-a", json!({})),
    )
    .await;
    let answered = asked.elapsed();
    eprintln!(
        "restarted standby: serving {} ms after the restart, its first map/connect and \
         register answered in {} ms",
        serves.as_millis(),
        answered.as_millis()
    );
    assert!(answered < Duration::from_secs(3), "{answered:?}");
    assert!(
        restarted.elapsed() < Duration::from_secs(15),
        "{:?}",
        restarted.elapsed()
    );
    // What the live node sends the predecessor's agent never reaches the new connection;
    // what it sends the new one does.
    for i in 0..3 {
        let _ = sys
            .call(
                "map/send",
                json!({"to": {"agent": "old-a"}, "payload": {"for": "old", "i": i}}),
            )
            .await;
    }
    sys.send(json!({"agent": "new-a"}), json!({"for": "new"}))
        .await;
    assert_eq!(fresh.next_message().await["payload"], json!({"for": "new"}));
    fresh.assert_no_message().await;
    // The predecessor's session ends once on the live node, as a lost connection.
    let ended = |e: &serde_json::Value| {
        e["type"] == json!("participant_disconnected")
            && e["data"]["participantId"] == json!(old_pid)
    };
    within(Duration::from_secs(10), async {
        while count(&mut sys, ended).await == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    eprintln!(
        "the predecessor's session ended {} ms after the restart",
        restarted.elapsed().as_millis()
    );
    // Three more roll calls: still once, and the new session is untouched.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(count(&mut sys, ended).await, 1);
    let agents = sys.ok("map/agents/list", json!({})).await;
    let state = |id: &str| {
        agents["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["id"] == json!(id))
            .map(|a| a["state"].clone())
    };
    assert_ne!(state("old-a"), Some(json!("active")), "{agents}");
    assert!(state("new-a").is_some(), "{agents}");
    fresh.assert_no_message().await;
    fresh.ok("map/agents/list", json!({})).await;
    drop(live);
}

#[tokio::test]
async fn a_second_live_process_with_a_nodes_name_refuses_to_start() {
    let nats = Nats::start("relay-namesake");
    let dir = TempDir::new("cluster-relay-namesake");
    let live_port = free_port();
    let live = spawn(
        node_args(
            &nats.url(),
            &dir.path.join("n0"),
            live_port,
            "node = \"n0\"",
        ),
        live_port,
    )
    .await;
    health_until(&live.url, Duration::from_secs(20), "ok", |s, _| s == 200).await;
    let standby = |name: &str, data: &str| {
        let port = free_port();
        let node = if name.is_empty() {
            String::new()
        } else {
            format!("node = \"{name}\"\n")
        };
        (
            node_args(
                &nats.url(),
                &dir.path.join(data),
                port,
                &format!("{node}standby = true\ntakeover_poll_ms = 100"),
            ),
            port,
        )
    };
    // A namesake of the live node, then of a standby, then two nodes left with the default.
    let (args, port) = standby("n1", "n1");
    let n1 = spawn(args, port).await;
    health_until(&n1.url, Duration::from_secs(20), "serving", serving).await;
    let (args, port) = standby("", "d1");
    let d1 = spawn(args, port).await;
    health_until(&d1.url, Duration::from_secs(20), "serving", serving).await;
    for (name, data, says) in [
        (
            "n0",
            "n0-again",
            "another live process answers as node \"n0\"",
        ),
        (
            "n1",
            "n1-again",
            "another live process answers as node \"n1\"",
        ),
        ("", "d2", "`[router] name`"),
    ] {
        let (args, port) = standby(name, data);
        let mut second = spawn(args, port).await;
        let status = within(Duration::from_secs(20), second.child.wait())
            .await
            .unwrap();
        let mut exited = second.exited.clone();
        within(Duration::from_secs(5), exited.wait_for(|e| *e))
            .await
            .unwrap();
        let stderr = second.stderr();
        assert!(!status.success(), "{name:?}: {stderr}");
        assert!(stderr.contains(says), "{name:?}: {stderr}");
    }
    // The first ones were not disturbed.
    for node in [&n1, &d1] {
        health_until(&node.url, Duration::from_secs(5), "serving", serving).await;
        WsClient::client(&node.url).await;
    }
}

/// The password of each NATS user in docs/cluster.md's configuration.
const ROUTER_PASSWORD: &str = "router-secret-change-me";
const APP_PASSWORD: &str = "app-secret-change-me";

#[tokio::test]
async fn nats_accounts_as_documented_keep_other_users_out_of_the_relay() {
    use futures::StreamExt;
    let conf_text = common::docs::doc_script("docs/cluster.md", "nats-accounts");
    assert!(
        conf_text.contains(ROUTER_PASSWORD) && conf_text.contains(APP_PASSWORD),
        "{conf_text}"
    );
    let dir = TempDir::new("cluster-relay-accounts");
    let conf = dir.path.join("nats.conf");
    std::fs::write(&conf, &conf_text).unwrap();
    let nats = Nats::start_with("relay-accounts", vec!["-c".into(), conf.into()]);
    let password = dir.path.join("nats-password");
    std::fs::write(&password, format!("{ROUTER_PASSWORD}\n")).unwrap();
    let creds = format!("user = \"map-router\"\npassword_file = {password:?}");
    // The other user, subscribed to everything its account may see, and answering the writer
    // lock's and the roll call's requests with a writer it made up.
    let app = with_timeout(
        async_nats::ConnectOptions::with_user_and_password("app".into(), APP_PASSWORD.into())
            .connect(nats.url()),
    )
    .await
    .expect("the app user connects");
    let mut everything = app.subscribe(">").await.unwrap();
    let mut requests = app.subscribe("_MAP.>").await.unwrap();
    let answers = Arc::new(Mutex::new(0usize));
    {
        let (app, answers) = (app.clone(), Arc::clone(&answers));
        tokio::spawn(async move {
            while let Some(msg) = requests.next().await {
                if let Some(reply) = msg.reply {
                    *answers.lock().unwrap() += 1;
                    let fake = json!({"node": "made-up", "role": "writer", "position": 1});
                    let _ = app.publish(reply, fake.to_string().into()).await;
                }
            }
        });
    }
    app.flush().await.unwrap();

    let live_port = free_port();
    let mut live = spawn(
        node_args(
            &nats.url(),
            &dir.path.join("n0"),
            live_port,
            &format!("node = \"n0\"\n{creds}"),
        ),
        live_port,
    )
    .await;
    health_until(&live.url, Duration::from_secs(20), "ok", |s, _| s == 200).await;
    // The standby reaches NATS by an address that is not loopback's (0.0.0.0 reaches the
    // local server): it warns that it talks to NATS without TLS.
    let port = free_port();
    let unspecified = nats.url().replace("127.0.0.1", "0.0.0.0");
    let standby = spawn(
        node_args(
            &unspecified,
            &dir.path.join("n1"),
            port,
            &format!("node = \"n1\"\nstandby = true\ntakeover_poll_ms = 100\n{creds}"),
        ),
        port,
    )
    .await;
    health_until(&standby.url, Duration::from_secs(20), "serving", serving).await;
    // A relayed session: connect (its resume token comes back through the relay), register,
    // send.
    let mut agent = WsClient::agent(&standby.url, "relayed", json!({})).await;
    let token = agent.session["resumeToken"].as_str().unwrap().to_owned();
    agent
        .send(json!({"agent": "relayed"}), json!({"secret": "payload-42"}))
        .await;
    assert_eq!(
        agent.next_message().await["payload"],
        json!({"secret": "payload-42"})
    );
    // The live node dies: the standby takes over in bounded time, whatever the app answers.
    sigkill(&mut live.child).await;
    let took = health_until(&standby.url, Duration::from_secs(10), "ok", |s, _| s == 200).await;
    eprintln!("took over {} ms after the kill", took.as_millis());
    // The app read nothing, and nothing asked it.
    let got = tokio::time::timeout(Duration::from_millis(300), everything.next()).await;
    if let Ok(Some(msg)) = got {
        let text = String::from_utf8_lossy(&msg.payload);
        panic!(
            "the app user read {} ({} bytes{})",
            msg.subject,
            text.len(),
            if text.contains(&token) {
                ", the resume token among them"
            } else {
                ""
            }
        );
    }
    assert_eq!(
        *answers.lock().unwrap(),
        0,
        "the app was asked and answered"
    );
    // The warning: on the standby (0.0.0.0), not on the live node (127.0.0.1).
    let warning = "talking to NATS without TLS on a non-loopback address";
    assert!(standby.stderr().contains(warning), "{}", standby.stderr());
    assert!(
        standby.stderr().contains("host=0.0.0.0"),
        "{}",
        standby.stderr()
    );
    assert!(!live.stderr().contains(warning), "{}", live.stderr());
    assert!(
        !standby.stderr().contains(ROUTER_PASSWORD) && !live.stderr().contains(ROUTER_PASSWORD)
    );
}

/// The live node `n0`, answering `/health` 200.
async fn live_n0(nats: &Nats, dir: &TempDir) -> Node {
    let port = free_port();
    let live = spawn(
        node_args(&nats.url(), &dir.path.join("n0"), port, "node = \"n0\""),
        port,
    )
    .await;
    health_until(&live.url, Duration::from_secs(20), "ok", |s, _| s == 200).await;
    live
}

/// The arguments of the standby `n1` listening on `port`.
fn standby_n1_args(nats: &Nats, dir: &TempDir, port: u16) -> Vec<std::ffi::OsString> {
    node_args(
        &nats.url(),
        &dir.path.join("n1"),
        port,
        "node = \"n1\"\nstandby = true\ntakeover_poll_ms = 100",
    )
}

/// A live node `n0` and a standby `n1` serving, and a NATS client subscribed to the relay
/// subjects of `n1`'s connections both ways: (live, standby, tap, to the connections, to the
/// writer).
async fn tapped_pair(
    nats: &Nats,
    dir: &TempDir,
) -> (
    Node,
    Node,
    async_nats::Client,
    async_nats::Subscriber,
    async_nats::Subscriber,
) {
    let live = live_n0(nats, dir).await;
    let port = free_port();
    let standby = spawn(standby_n1_args(nats, dir, port), port).await;
    health_until(&standby.url, Duration::from_secs(20), "serving", serving).await;
    let tap = with_timeout(async_nats::connect(nats.url())).await.unwrap();
    let to_conn = tap.subscribe("_MAP.conn.MAP_EVENTS.n1.>").await.unwrap();
    let to_writer = tap.subscribe("_MAP.relay.MAP_EVENTS.n1.>").await.unwrap();
    tap.flush().await.unwrap();
    (live, standby, tap, to_conn, to_writer)
}

/// Drains `sub` until it is quiet for 300 ms: the subject of the last message and the
/// highest `Map-Relay-Seq` seen on it.
async fn last_numbered(sub: &mut async_nats::Subscriber) -> (String, u64) {
    use futures::StreamExt;
    let mut last: Option<(String, u64)> = None;
    while let Ok(Some(msg)) = tokio::time::timeout(Duration::from_millis(300), sub.next()).await {
        let Some(seq) = msg
            .headers
            .as_ref()
            .and_then(|h| h.get("Map-Relay-Seq"))
            .and_then(|v| v.as_str().parse::<u64>().ok())
        else {
            continue;
        };
        let subject = msg.subject.to_string();
        last = match last {
            Some((s, n)) if s == subject => Some((s, n.max(seq))),
            _ => Some((subject, seq)),
        };
    }
    last.expect("a numbered relay message")
}

/// `c` is closed with 1012 (frames lost on the way) within 5 s, and was handed no
/// `map/message` before (`what`: the message of the failure).
async fn closed_1012_with_no_message(c: &mut WsClient, what: &str) {
    assert_eq!(
        within(Duration::from_secs(5), c.expect_close()).await,
        Some(1012)
    );
    assert!(
        c.take_queued()
            .iter()
            .all(|v| v["method"] != json!("map/message")),
        "{what}"
    );
}

/// Publishes `frame` on `subject` numbered `seq`.
async fn inject(tap: &async_nats::Client, subject: &str, seq: u64, frame: &str) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Map-Relay-Seq", seq.to_string().as_str());
    tap.publish_with_headers(subject.to_owned(), headers, frame.to_owned().into())
        .await
        .unwrap();
    tap.flush().await.unwrap();
}

/// Item 7: a relayed message lost on the way (made here by a message whose number skips one,
/// or a mark one ahead) closes the client's connection with 1012, without handing it the frame
/// after the gap; the client resumes with its token and loses nothing. Both directions.
#[tokio::test]
async fn a_relayed_message_lost_on_the_way_closes_the_connection_with_1012_and_it_resumes() {
    let nats = Nats::start("relay-gaps");
    let dir = TempDir::new("cluster-relay-gaps");
    let (live, standby, tap, mut to_conn, mut to_writer) = tapped_pair(&nats, &dir).await;
    let mut sys = WsClient::system(&live.url).await;

    // Writer -> standby: the message after the last one is lost; the next arrives.
    let mut a = WsClient::agent(&standby.url, "gap-a", json!({})).await;
    let token = a.session["resumeToken"].as_str().unwrap().to_owned();
    let (sid, pid) = (a.sid(), a.pid());
    let (subject, last) = last_numbered(&mut to_conn).await;
    let spliced = r#"{"jsonrpc":"2.0","method":"map/message","params":{"message":{"id":"x","from":"nobody","to":{"agent":"gap-a"},"payload":"after a gap"}}}"#;
    inject(&tap, &subject, last + 2, spliced).await;
    closed_1012_with_no_message(&mut a, "the frame after the gap was handed on").await;
    // It resumes with its token: the same session, its agent back, reached again.
    let resume = |token: String| {
        let url = standby.url.clone();
        async move {
            let mut c = WsClient::connect(&url).await;
            let r = c
                .ok(
                    "map/connect",
                    json!({"protocolVersion": 1, "participantType": "agent", "resumeToken": token}),
                )
                .await;
            c.session = r.clone();
            (c, r)
        }
    };
    let (mut back, r) = within(Duration::from_secs(10), resume(token)).await;
    assert_eq!(
        (r["sessionId"].clone(), r["participantId"].clone()),
        (json!(sid), json!(pid)),
        "{r}"
    );
    sys.send(json!({"agent": "gap-a"}), json!({"after": "the gap"}))
        .await;
    assert_eq!(
        back.next_message().await["payload"],
        json!({"after": "the gap"})
    );

    // Standby -> writer: a message of the standby's is lost; the live node ends the relay
    // session as a lost connection, and the client is closed with 1012 too.
    let (subject, last) = last_numbered(&mut to_writer).await;
    let call = r#"{"jsonrpc":"2.0","id":999,"method":"map/send","params":{"to":{"agent":"gap-a"},"payload":"after a gap"}}"#;
    let disconnects = |e: &serde_json::Value| {
        e["type"] == json!("participant_disconnected") && e["data"]["participantId"] == json!(pid)
    };
    let before = count(&mut sys, disconnects).await;
    let is_sent = |e: &serde_json::Value| e["type"] == json!("message_sent");
    let sent_before = count(&mut sys, is_sent).await;
    inject(&tap, &subject, last + 2, call).await;
    assert_eq!(
        within(Duration::from_secs(5), back.expect_close()).await,
        Some(1012)
    );
    within(Duration::from_secs(5), async {
        while count(&mut sys, disconnects).await == before {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // The call after the gap was never run.
    assert_eq!(count(&mut sys, is_sent).await, sent_before);
    let token = r["resumeToken"].as_str().unwrap().to_owned();
    let (mut again, r) = within(Duration::from_secs(10), resume(token)).await;
    assert_eq!(r["sessionId"], json!(sid), "{r}");

    // A loss at the end of a burst: the mark after it says one more message was sent than
    // arrived (made here by a mark one ahead).
    let (subject, last) = last_numbered(&mut to_conn).await;
    let mut mark = async_nats::HeaderMap::new();
    mark.insert("Map-Relay", "mark");
    mark.insert("Map-Relay-Seq", (last + 1).to_string().as_str());
    tap.publish_with_headers(subject, mark, bytes::Bytes::new())
        .await
        .unwrap();
    tap.flush().await.unwrap();
    assert_eq!(
        within(Duration::from_secs(5), again.expect_close()).await,
        Some(1012)
    );
}

/// Drains `sub` until it is quiet for 300 ms: every message as (its `Map-Relay-Batch` header,
/// its payload), control messages (open, close, mark) left out.
async fn drain_relayed(sub: &mut async_nats::Subscriber) -> Vec<(Option<String>, String)> {
    use futures::StreamExt;
    let mut out = Vec::new();
    while let Ok(Some(msg)) = tokio::time::timeout(Duration::from_millis(300), sub.next()).await {
        let header = |name: &str| {
            msg.headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_owned())
        };
        if header("Map-Relay").is_some() {
            continue;
        }
        out.push((
            header("Map-Relay-Batch"),
            String::from_utf8(msg.payload.to_vec()).unwrap(),
        ));
    }
    out
}

/// How many frames `relayed` (from [`drain_relayed`]) carries: a batch's header lists one
/// length per frame.
fn frames_in(relayed: &[(Option<String>, String)]) -> usize {
    relayed
        .iter()
        .map(|(batch, _)| batch.as_ref().map_or(1, |l| l.split(',').count()))
        .sum()
}

/// `n` `map/send` requests to `to`, written at once without waiting (ids from `first`),
/// then their `n` answers, each checked.
async fn pipelined_sends(c: &mut WsClient, to: serde_json::Value, first: u64, n: u64) {
    for i in 0..n {
        let req = json!({"jsonrpc": "2.0", "id": first + i, "method": "map/send",
            "params": {"to": to, "payload": {"i": i}}});
        c.send_raw(&req.to_string()).await;
    }
    for i in 0..n {
        let answer = c.next_non_notification().await;
        assert_eq!(answer["id"], json!(first + i), "{answer}");
        assert!(answer["result"].is_object(), "{answer}");
    }
}

/// Issue 48: frames ready together cross NATS as one message (a batch), in both directions of
/// a relay, and arrive whole and in order; a node of an older build, which never says it reads
/// batches, is sent one frame per message; a batch whose lengths do not describe its payload
/// (another NATS user's, or a corrupted one) closes the connection with 1012 and none of its
/// frames is handed on.
#[tokio::test]
async fn frames_ready_together_travel_as_batches_and_a_forged_batch_is_refused_whole() {
    const N: u64 = 300;
    let nats = Nats::start("relay-batches");
    let dir = TempDir::new("cluster-relay-batches");
    let (live, standby, tap, mut to_conn, mut to_writer) = tapped_pair(&nats, &dir).await;
    let mut sys = WsClient::system(&live.url).await;
    let mut a = WsClient::agent(&standby.url, "batch-a", json!({})).await;
    let mut b = WsClient::agent(&live.url, "batch-b", json!({})).await;
    drain_relayed(&mut to_conn).await;
    drain_relayed(&mut to_writer).await;

    // Writer -> standby: N messages to the standby's agent, sent at once.
    pipelined_sends(&mut sys, json!({"agent": "batch-a"}), 1_000, N).await;
    for i in 0..N {
        assert_eq!(a.next_message().await["payload"], json!({"i": i}));
    }
    let relayed = drain_relayed(&mut to_conn).await;
    let batches = relayed.iter().filter(|(batch, _)| batch.is_some()).count();
    assert_eq!(
        frames_in(&relayed) as u64,
        N,
        "one frame per message, no other"
    );
    assert!(batches >= 1, "no batch among {} messages", relayed.len());
    assert!(relayed.len() < N as usize);

    // Standby -> writer: N sends of the standby's agent, pipelined.
    pipelined_sends(&mut a, json!({"agent": "batch-b"}), 2_000, N).await;
    for i in 0..N {
        assert_eq!(b.next_message().await["payload"], json!({"i": i}));
    }
    let relayed = drain_relayed(&mut to_writer).await;
    assert!(
        relayed.iter().any(|(batch, _)| batch.is_some()),
        "no batch among {} messages",
        relayed.len()
    );

    // A node of an older build (played here on the tap, which answers the roll call as it):
    // its open does not say it reads batches, so every frame the writer sends it is a message
    // of its own.
    let mut roll_call = tap.subscribe("_MAP.nodes.MAP_EVENTS").await.unwrap();
    let answering = {
        let tap = tap.clone();
        tokio::spawn(async move {
            use futures::StreamExt;
            let status = json!({"node": "old-node", "role": "standby", "position": 0,
                "incarnation": "inc1"});
            while let Some(msg) = roll_call.next().await {
                if let Some(reply) = msg.reply {
                    let _ = tap.publish(reply, status.to_string().into()).await;
                }
            }
        })
    };
    let old = "_MAP.relay.MAP_EVENTS.old-node.inc1.1";
    let mut to_old = tap
        .subscribe("_MAP.conn.MAP_EVENTS.old-node.inc1.1")
        .await
        .unwrap();
    tap.flush().await.unwrap();
    let mut open = async_nats::HeaderMap::new();
    open.insert("Map-Relay", "open");
    open.insert("Map-Principal", "");
    tap.publish_with_headers(old, open, bytes::Bytes::new())
        .await
        .unwrap();
    let connect = r#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"protocolVersion":1,"participantType":"agent"}}"#;
    let register =
        r#"{"jsonrpc":"2.0","id":2,"method":"map/agents/register","params":{"agentId":"old-a"}}"#;
    inject(&tap, old, 1, connect).await;
    inject(&tap, old, 2, register).await;
    let answers = within(Duration::from_secs(10), async {
        let mut got = Vec::new();
        while got.len() < 2 {
            got.extend(drain_relayed(&mut to_old).await);
        }
        got
    })
    .await;
    assert!(answers[1].1.contains("old-a"), "{answers:?}");
    pipelined_sends(&mut sys, json!({"agent": "old-a"}), 3_000, N).await;
    let relayed = within(Duration::from_secs(10), async {
        let mut got = Vec::new();
        while frames_in(&got) < N as usize {
            got.extend(drain_relayed(&mut to_old).await);
        }
        got
    })
    .await;
    assert!(
        relayed.iter().all(|(batch, _)| batch.is_none()),
        "a batch to a node that never said it reads them"
    );
    for (i, (_, frame)) in relayed.iter().enumerate() {
        let frame: serde_json::Value = serde_json::from_str(frame).unwrap();
        assert_eq!(frame["params"]["message"]["payload"], json!({"i": i}));
    }
    answering.abort();

    // A forged batch to the standby's connection, numbered next: two well-formed messages
    // with a byte too many. The connection is closed with 1012 and handed neither.
    let (subject, last) = last_numbered(&mut to_conn).await;
    let forged = r#"{"jsonrpc":"2.0","method":"map/message","params":{"message":{"id":"f","from":"nobody","to":{"agent":"batch-a"},"payload":"forged"}}}"#;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Map-Relay-Seq", (last + 1).to_string().as_str());
    let lengths = format!("{},{}", forged.len(), forged.len());
    headers.insert("Map-Relay-Batch", lengths.as_str());
    tap.publish_with_headers(subject, headers, format!("{forged}{forged} ").into())
        .await
        .unwrap();
    tap.flush().await.unwrap();
    closed_1012_with_no_message(&mut a, "a frame of the forged batch was handed on").await;
    // The same to the writer, from the standby's side: the relay session ends as a lost
    // connection (the agent's owner disconnects), and nothing of it runs.
    let mut c = WsClient::agent(&standby.url, "batch-c", json!({})).await;
    let pid = c.pid();
    let (subject, last) = last_numbered(&mut to_writer).await;
    let call = r#"{"jsonrpc":"2.0","id":77,"method":"map/send","params":{"to":{"agent":"batch-b"},"payload":"forged"}}"#;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Map-Relay-Seq", (last + 1).to_string().as_str());
    headers.insert("Map-Relay-Batch", format!("{},3", call.len()).as_str());
    tap.publish_with_headers(subject, headers, format!("{call}{call}").into())
        .await
        .unwrap();
    tap.flush().await.unwrap();
    assert_eq!(
        within(Duration::from_secs(5), c.expect_close()).await,
        Some(1012)
    );
    let disconnects = |e: &serde_json::Value| {
        e["type"] == json!("participant_disconnected") && e["data"]["participantId"] == json!(pid)
    };
    within(Duration::from_secs(5), async {
        while count(&mut sys, disconnects).await == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    b.assert_none_where("the forged call's message", |v| {
        v["params"]["message"]["payload"] == json!("forged")
    })
    .await;
}
