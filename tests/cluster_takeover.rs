//! Takeover correctness (issue 44, items 2, 4, 5 and 6), end to end: the real `map-router`
//! binary with `serve --cluster nats://...` against a real `nats-server -js` on loopback.
//!
//! - A session handed over is re-admitted under the config of the node that restores it
//!   (participant type, capability grants); what it loses is answered 1003 and logged.
//! - Identity claims survive the stream's limits as saved records do.
//! - A takeover restores the log's last word for scopes, memberships and agent states, wherever
//!   the kill falls.
//! - A standby shows every viewer what the live node would, whatever made a session an agent,
//!   and after a revocation of `observation.canObserve`.
//!
//! Every await is bounded. Needs `nats-server` on PATH (the tests fail, never skip, without it).
#![cfg(feature = "cluster")]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::nats::Nats;
use common::*;
use map_router::store::jetstream::{JetStreamOptions, JetStreamStore};
use map_router::store::record::StoredRow;
use map_router::store::EventStore;
use serde_json::json;

/// The arguments of a cluster node with `cluster` added to `[cluster]` and `storage` as the
/// `[storage]` section (and what follows it).
fn node_args_with(
    nats: &Nats,
    data: &Path,
    cluster: &str,
    storage: &str,
) -> Vec<std::ffi::OsString> {
    let config = data.with_extension("toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nrequest_timeout_ms = 1000\nconnect_timeout_ms = 3000\n{cluster}\n\
             [storage]\n{storage}\n"
        ),
    )
    .unwrap();
    vec![
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--cluster".into(),
        nats.url().into(),
        "--data-dir".into(),
        data.into(),
        "--config".into(),
        config.into(),
    ]
}

fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("ws://")
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

async fn health(url: &str) -> (u16, String) {
    let r = with_timeout(http::request(addr_of(url), "GET", "/health", &[], b"")).await;
    (r.status, String::from_utf8_lossy(&r.body).into_owned())
}

/// Polls `/health` until `pred` holds (within 20 s).
async fn health_until(url: &str, what: &str, pred: impl Fn(u16, &str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = health(url).await;
        if pred(status, &body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/health never showed {what}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every row of the stream, whole.
async fn stream_whole(nats: &Nats) -> Vec<StoredRow> {
    let (store, _) = with_timeout(JetStreamStore::open(JetStreamOptions::new(nats.url())))
        .await
        .expect("open the stream for reading");
    let rows = with_timeout(store.read(0, usize::MAX)).await.expect("read");
    with_timeout(store.close()).await.expect("close");
    rows
}

async fn sigkill(child: &mut tokio::process::Child) {
    child.start_kill().expect("SIGKILL");
    let status = with_timeout(child.wait()).await.unwrap();
    assert!(!status.success(), "killed: {status:?}");
}

/// A node started with `standby = true` (as tests/cluster.rs starts one), keeping every line
/// it logs.
struct StandbyNode {
    child: tokio::process::Child,
    url: String,
    took_over: tokio::sync::oneshot::Receiver<bool>,
    log: Arc<Mutex<Vec<String>>>,
}

impl StandbyNode {
    /// The lines logged so far that contain every one of `words`.
    fn logged(&self, words: &[&str]) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| words.iter().all(|w| l.contains(w)))
            .cloned()
            .collect()
    }
}

/// Waits up to `limit` for standby `s` to take over, then for its `/health` 200.
async fn taken_over(s: &mut StandbyNode, limit: Duration) {
    within(limit, &mut s.took_over)
        .await
        .expect("the standby stopped before it took over");
    health_until(&s.url, "ok after the takeover", |st, _| st == 200).await;
}

async fn start_standby_in(
    nats: &Nats,
    data: &Path,
    name: &str,
    cluster: &str,
    storage: &str,
) -> StandbyNode {
    use tokio::io::AsyncBufReadExt;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut args = node_args_with(
        nats,
        data,
        &format!("node = \"{name}\"\nstandby = true\ntakeover_poll_ms = 100\n{cluster}"),
        storage,
    );
    args[1] = format!("127.0.0.1:{port}").into();
    let mut child = binary_command(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start a standby");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let (tx, took_over) = tokio::sync::oneshot::channel();
    let log = Arc::new(Mutex::new(Vec::new()));
    let kept = log.clone();
    tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut warm = false;
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("standby: took over the stream") {
                warm = line.contains("from_followed=true");
            }
            if line.starts_with("map-router listening on ") {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(warm);
                }
            }
            kept.lock().unwrap().push(line);
        }
    });
    let url = format!("ws://127.0.0.1:{port}/");
    within(Duration::from_secs(20), async {
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let body = health_until(&url, "standby", |s, b| s == 503 && b.starts_with("standby")).await;
    assert!(body.contains("nats: connected"), "{body}");
    health_until(&url, "serving", |s, b| s == 503 && b.contains("serving:")).await;
    StandbyNode {
        child,
        url,
        took_over,
        log,
    }
}

const OPS: &str = "key-ops-0123456789abcdef";
const ALICE: &str = "key-alice-0123456789abcdef";
const BOB: &str = "key-bob-0123456789abcdef";
const CAROL: &str = "key-carol-0123456789abcdef";

/// The API keys of ops, alice, bob and carol in a file under `dir` (mode 0600): its path.
fn keys_file(dir: &Path) -> String {
    common::cluster::keys_file(
        dir,
        &[
            (OPS, "ops"),
            (ALICE, "alice"),
            (BOB, "bob"),
            (CAROL, "carol"),
        ],
    )
}

/// A node's `[storage]` section and what follows it: `[auth]` on with the keys of
/// [`keys_file`], `system` the system principals, `extra` appended.
fn auth_config(keys: &str, system: &[&str], extra: &str) -> String {
    format!(
        "commit_timeout_ms = 1500\n[auth]\nsystem_principals = {system:?}\n\
         [auth.api_keys]\nfile = {keys:?}\n{extra}"
    )
}

// ---------------------------------------------------------------------------------------------
// Item 2: a restored session is re-admitted under the restoring node's config.

#[test]
fn a_handed_over_session_is_readmitted_under_the_config_of_the_node_that_restores_it() {
    on_big_stack(readmitted);
}

/// Node A lists bob in `system_principals`; its standby B (the documented rolling upgrade: a
/// new config on the next node) does not, and denies him `messaging.canSend`. Bob connects to A
/// as system; A is SIGKILLed; on B, bob's resume as system is refused with 1003, his resume
/// without a type gets his session back as the client B would admit him as, without
/// `canSend`; his sends are refused with 1003, and B's log names him and what he lost. Alice,
/// whom neither config changes, resumes as she was.
async fn readmitted() {
    let nats = Nats::start("takeover-readmit");
    let dir = TempDir::new("cluster-takeover-readmit");
    let keys = keys_file(&dir.path);
    let config_a = auth_config(&keys, &["ops", "bob"], "");
    let config_b = auth_config(
        &keys,
        &["ops"],
        "[permissions.principals.\"bob\".messaging]\ncanSend = false\n",
    );
    let (mut live, a) = start_binary(node_args_with(
        &nats,
        &dir.path.join("n0"),
        "node = \"n0\"",
        &config_a,
    ))
    .await;
    let mut b = start_standby_in(&nats, &dir.path.join("n1"), "n1", "", &config_b).await;

    let (mut bob, r) =
        connect_with_key(&a, BOB, "system", json!({"participantId": "bob-ops"})).await;
    assert_eq!(r["participantType"], json!("system"), "{r}");
    let token = r["resumeToken"].as_str().unwrap().to_owned();
    let session = r["sessionId"].clone();
    bob.register_agent(json!({"agentId": "bob-bot"})).await;
    let (_alice, r) =
        connect_with_key(&a, ALICE, "agent", json!({"participantId": "alice-desk"})).await;
    let alice_token = r["resumeToken"].as_str().unwrap().to_owned();
    let alice_caps = r["capabilities"].clone();
    health_until(&b.url, "the handover's records", |_, body| {
        body.contains("handover: 2 sessions")
    })
    .await;

    sigkill(&mut live).await;
    drop(bob);
    taken_over(&mut b, Duration::from_secs(20)).await;

    // As system: refused as a fresh connect as system would be.
    let mut c = WsClient::connect(&b.url).await;
    let e = c
        .err(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": "system", "resumeToken": token,
                   "auth": {"method": "api-key", "credential": BOB}}),
        )
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    // Without a type: his session, as the client B admits him as.
    let mut c = WsClient::connect(&b.url).await;
    let r = c
        .ok(
            "map/connect",
            json!({"protocolVersion": 1, "resumeToken": token,
                   "auth": {"method": "api-key", "credential": BOB}}),
        )
        .await;
    assert_eq!(r["sessionId"], session, "resumed: {r}");
    assert_eq!(r["participantType"], json!("client"), "{r}");
    assert_eq!(
        r["capabilities"]["messaging"]["canSend"],
        json!(false),
        "{r}"
    );
    let e = c
        .err(
            "map/send",
            json!({"to": {"broadcast": true}, "payload": {"from": "bob"}}),
        )
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    let e = c
        .err(
            "map/send",
            json!({"to": {"agent": "bob-bot"}, "payload": 1}),
        )
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    // A system-only call is refused too.
    let e = c
        .err(
            "map/permissions/update",
            json!({"clientId": "alice-desk", "permissions": {"messaging": {"canSend": false}}}),
        )
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    let said = b.logged(&["bob", "system"]);
    assert!(
        said.iter().any(|l| l.contains("canSend")),
        "B's log names bob and what he lost: {said:?}"
    );

    // Alice, whom neither config changes, resumes as she was.
    let (_alice, r) =
        connect_with_key(&b.url, ALICE, "agent", json!({"resumeToken": alice_token})).await;
    assert_eq!(r["participantId"], json!("alice-desk"), "{r}");
    assert_eq!(r["participantType"], json!("agent"), "{r}");
    assert_eq!(r["capabilities"], alice_caps, "{r}");
    assert!(b.logged(&["alice"]).iter().all(|l| !l.contains("lost")));
}

// ---------------------------------------------------------------------------------------------
// Item 5: a takeover restores the log's last word, wherever the kill falls.

/// Scope churn on `url` until the router goes away: an agent `{prefix}bot` creates scopes
/// `{prefix}{i}` one after another, joins each, and then deletes one in three, leaves one in
/// three, and keeps the rest.
async fn scope_churn(url: String, prefix: String) {
    use common::load::rpc;
    let Ok((mut ws, _)) = tokio_tungstenite::connect_async(url.as_str()).await else {
        return;
    };
    let bot = format!("{prefix}bot");
    let connect = json!({"protocolVersion": 1, "participantType": "agent"});
    if rpc(&mut ws, 1, "map/connect", connect).await.is_none()
        || rpc(&mut ws, 2, "map/agents/register", json!({"agentId": bot}))
            .await
            .is_none()
    {
        return;
    }
    let mut n = 3;
    for i in 0u64.. {
        let scope = format!("{prefix}{i}");
        let member = json!({"scopeId": scope, "agentId": bot});
        let mut steps = vec![
            ("map/scopes/create", json!({"scopeId": scope})),
            ("map/scopes/join", member.clone()),
        ];
        match i % 3 {
            0 => steps.push(("map/scopes/delete", json!({"scopeId": scope}))),
            1 => steps.push(("map/scopes/leave", member)),
            _ => {}
        }
        for (method, params) in steps {
            n += 1;
            if rpc(&mut ws, n, method, params).await.is_none() {
                return;
            }
        }
    }
}

/// What the log says last about the scopes whose id starts with `prefix`: each live scope and
/// its members.
fn scopes_by_log(
    events: &[serde_json::Value],
    prefix: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let mut scopes = std::collections::BTreeMap::new();
    for e in events {
        let data = &e["event"]["data"];
        let Some(id) = data["scopeId"].as_str().filter(|id| id.starts_with(prefix)) else {
            continue;
        };
        let agent = data["agentId"].as_str().unwrap_or_default().to_owned();
        match e["event"]["type"].as_str() {
            Some("scope_created") => {
                scopes.insert(id.to_owned(), std::collections::BTreeSet::new());
            }
            Some("scope_deleted") => {
                scopes.remove(id);
                for d in data["deletedDescendants"].as_array().into_iter().flatten() {
                    scopes.remove(d.as_str().unwrap_or_default());
                }
            }
            Some("scope_member_joined") => {
                scopes.entry(id.to_owned()).or_default().insert(agent);
            }
            Some("scope_member_left") => {
                if let Some(m) = scopes.get_mut(id) {
                    m.remove(&agent);
                }
            }
            _ => {}
        }
    }
    scopes
}

/// What node `c` holds of the scopes whose id starts with `prefix`.
async fn scopes_held(
    c: &mut WsClient,
    prefix: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let list = c.ok("map/scopes/list", json!({})).await;
    let mut held = std::collections::BTreeMap::new();
    for s in list["scopes"].as_array().unwrap() {
        let id = s["id"].as_str().unwrap();
        if !id.starts_with(prefix) {
            continue;
        }
        let m = c
            .ok("map/scopes/members", json!({"scopeId": id, "limit": 1000}))
            .await;
        let members = m["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        held.insert(id.to_owned(), members);
    }
    held
}

/// Scope churners per round.
const CHURNERS: usize = 6;

#[test]
fn scopes_and_memberships_are_the_logs_last_word_after_a_kill_at_a_random_point() {
    on_big_stack(scope_kills);
}

/// Rounds (`MAP_TAKEOVER_ROUNDS`, default 3; seed `MAP_TAKEOVER_SEED`): scope churn on the
/// live node, which is SIGKILLed at a random point; the standby that takes over holds
/// exactly the scopes and memberships the log says last (no deleted scope resurrected, no
/// membership rolled back), and the next round kills it in turn.
async fn scope_kills() {
    use common::load::{env_number, env_seed, Rng};
    let rounds = env_number("MAP_TAKEOVER_ROUNDS").map_or(3, |n| n.clamp(1, 100));
    let seed = env_seed("MAP_TAKEOVER_SEED");
    eprintln!("takeover seed: {seed}, {rounds} rounds");
    let mut rng = Rng(seed);
    let nats = Nats::start("takeover-scope-kills");
    let dir = TempDir::new("cluster-takeover-scope-kills");
    let storage = "commit_timeout_ms = 1500";
    let (mut live, mut url) = start_binary(node_args_with(
        &nats,
        &dir.path.join("n0"),
        "node = \"n0\"",
        storage,
    ))
    .await;
    let mut standby = start_standby_in(&nats, &dir.path.join("n1"), "n1", "", storage).await;
    for round in 0..rounds {
        let prefix = format!("r{round}-");
        // Several at once: one batch of the live node then holds several calls' events
        // before their records, the window a kill must fall in.
        let churn: Vec<_> = (0..CHURNERS)
            .map(|j| tokio::spawn(scope_churn(url.clone(), format!("{prefix}{j}-"))))
            .collect();
        // Kill after a random number of the churn's scopes exist (or were deleted) in the log.
        let mut ops = WsClient::system(&url).await;
        let after = 3 + rng.below(40) as usize;
        within(Duration::from_secs(20), async {
            loop {
                let list = ops.ok("map/scopes/list", json!({})).await;
                let made = list["scopes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|s| s["id"].as_str().unwrap().starts_with(&prefix))
                    .count();
                if made >= after {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5 + rng.below(20))).await;
            }
        })
        .await;
        drop(ops);
        sigkill(&mut live).await;
        taken_over(&mut standby, Duration::from_secs(20)).await;
        for c in churn {
            let _ = within(Duration::from_secs(5), c).await;
        }

        let mut ops = WsClient::system(&standby.url).await;
        let events = replay_all(&mut ops, None).await;
        let by_log = scopes_by_log(&events, &prefix);
        let held = scopes_held(&mut ops, &prefix).await;
        assert!(!by_log.is_empty(), "round {round}: the churn made scopes");
        assert_eq!(
            held, by_log,
            "round {round} (seed {seed}): the scopes held are the log's last word"
        );
        eprintln!(
            "round {round}: {} scopes, {} memberships, as the log says",
            held.len(),
            held.values().map(|m| m.len()).sum::<usize>()
        );
        // The next round kills the new live node; a fresh standby waits behind it.
        live = standby.child;
        url = standby.url;
        let name = format!("n{}", round + 2);
        standby = start_standby_in(&nats, &dir.path.join(&name), &name, "", storage).await;
    }
    drop(live);
}

// ---------------------------------------------------------------------------------------------
// Item 4: identity claims survive the stream's limits.

#[test]
fn identity_claims_are_written_again_before_the_streams_limits_delete_them() {
    on_big_stack(claims_refresh);
}

/// As tests/cluster.rs's `saved_refresh`, for an identity claim: a stream that keeps 300
/// events; alice registered `alice-bot` long ago and unregistered it (her claim stays, her
/// agent is gone); after about 1 200 events a standby that starts (reading only what the
/// stream holds) and takes over still knows the id is alice's: bob's registration of it is
/// refused with 1003, alice's succeeds.
async fn claims_refresh() {
    let nats = Nats::start("takeover-claims-refresh");
    let dir = TempDir::new("cluster-takeover-claims-refresh");
    let keys = keys_file(&dir.path);
    let config = auth_config(&keys, &["ops"], "");
    let (mut live, w) = start_binary(node_args_with(
        &nats,
        &dir.path.join("n0"),
        "node = \"n0\"\nmax_events = 300",
        &config,
    ))
    .await;
    let (mut alice, _) = connect_with_key(&w, ALICE, "agent", json!({})).await;
    alice.register_agent(json!({"agentId": "alice-bot"})).await;
    alice
        .ok("map/agents/unregister", json!({"agentId": "alice-bot"}))
        .await;
    let (mut sink, _) = connect_with_key(&w, CAROL, "agent", json!({})).await;
    sink.register_agent(json!({"agentId": "sink"})).await;
    let (mut sender, _) = connect_with_key(&w, CAROL, "agent", json!({})).await;
    sender.register_agent(json!({"agentId": "sender"})).await;
    // About 1 200 events in bursts, with pauses longer than the refresh's look (1 s).
    for burst in 0..4 {
        for i in 0..150 {
            sender
                .send(json!({"agent": "sink"}), json!({"burst": burst, "i": i}))
                .await;
        }
        tokio::time::sleep(Duration::from_millis(1300)).await;
    }
    drop(sink.take_queued());
    let rows = stream_whole(&nats).await;
    assert!(rows.len() <= 300, "the limit holds: {}", rows.len());
    let about = |kind: &str| {
        rows.iter()
            .filter(|r| r.kind == kind && r.json.contains("alice-bot"))
            .count()
    };
    assert_eq!(about("agent_registered"), 0, "the registration was deleted");
    assert!(
        about("identity.claimed") >= 1,
        "the claim was written again"
    );

    // A standby that starts now reads only the stream, and takes over.
    let mut f = start_standby_in(
        &nats,
        &dir.path.join("n1"),
        "n1",
        "max_events = 300",
        &config,
    )
    .await;
    // Already on the standby (a relayed registration the live node refuses).
    let (mut bob, _) = connect_with_key(&f.url, BOB, "agent", json!({})).await;
    let e = bob
        .err("map/agents/register", json!({"agentId": "alice-bot"}))
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    drop(bob);
    sigkill(&mut live).await;
    taken_over(&mut f, Duration::from_secs(20)).await;
    let (mut bob, _) = connect_with_key(&f.url, BOB, "agent", json!({})).await;
    let e = bob
        .err("map/agents/register", json!({"agentId": "alice-bot"}))
        .await;
    assert_eq!(e["code"], json!(1003), "bob may not take alice's id: {e}");
    let (mut alice, _) = connect_with_key(&f.url, ALICE, "agent", json!({})).await;
    alice.register_agent(json!({"agentId": "alice-bot"})).await;
}

// ---------------------------------------------------------------------------------------------
// Item 6: a standby shows every viewer what the live node would, whatever made a session an
// agent.

/// The agent ids the events of `sub` on `c` name, up to and including the first
/// `agent_state_changed` of `marker` to `state` (bounded).
async fn agents_shown_until(c: &mut WsClient, sub: &str, marker: &str, state: &str) -> Vec<String> {
    let mut shown = Vec::new();
    for _ in 0..1000 {
        let e = c.next_event(sub).await;
        let id = e["event"]["data"]["agentId"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let done = e["event"]["type"] == json!("agent_state_changed")
            && id == marker
            && e["event"]["data"]["newState"] == json!(state);
        shown.push(id);
        if done {
            return shown;
        }
    }
    panic!("no state change of {marker} among 1000 events");
}

/// Alice's agent and then `bot` change state (busy, then idle, alternately): what a viewer
/// is shown between.
async fn alice_then(alice: &mut WsClient, bot_owner: &mut WsClient, bot: &str, round: usize) {
    let state = state_of(round);
    alice
        .ok(
            "map/agents/update",
            json!({"agentId": "alice-bot", "state": state}),
        )
        .await;
    bot_owner
        .ok("map/agents/update", json!({"agentId": bot, "state": state}))
        .await;
}

/// The state agents are put in in round `round`: busy, then idle, alternately.
fn state_of(round: usize) -> &'static str {
    if round.is_multiple_of(2) {
        "busy"
    } else {
        "idle"
    }
}

/// Waits until the live node shows `agent` orphaned (its owner's connection is gone).
async fn orphaned(ops: &mut WsClient, agent: &str) {
    within(Duration::from_secs(10), async {
        loop {
            let got = ops.ok("map/agents/get", json!({"agentId": agent})).await;
            if got["agent"]["state"] == json!("orphaned") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

#[test]
fn a_standby_applies_an_agents_can_see_rule_whatever_made_the_session_an_agent() {
    on_big_stack(agent_viewers);
}

/// Bob's agents see only themselves (`canSee.agents: direct`); alice's agent is not theirs
/// to see. On the standby, bob's session speaks as such an agent after each path: it
/// registered one, it resumed its agent session without naming a type, it resumed with
/// `reclaimAgents`, it loaded its agent session (`map/session/load`) from a client session.
/// After each, bob's subscription on the standby is shown what the same subscription on the
/// live node is (his own agent's change, never alice's agent's); carol, a client with no
/// rule, is shown alice's agent on both nodes.
async fn agent_viewers() {
    let nats = Nats::start("takeover-agent-viewers");
    let dir = TempDir::new("cluster-takeover-agent-viewers");
    let keys = keys_file(&dir.path);
    let config = auth_config(&keys, &["ops"], "");
    let (_live, w, f) = {
        let (live, w) = start_binary(node_args_with(
            &nats,
            &dir.path.join("n0"),
            "node = \"n0\"",
            &config,
        ))
        .await;
        let f = start_standby_in(&nats, &dir.path.join("n1"), "n1", "", &config).await;
        (live, w, f)
    };
    let (mut ops, _) = connect_with_key(&w, OPS, "system", json!({})).await;
    let (mut alice, _) = connect_with_key(&w, ALICE, "agent", json!({})).await;
    alice.register_agent(json!({"agentId": "alice-bot"})).await;
    let direct = json!({"canSee": {"agents": "direct"}});
    // Carol, on both nodes: shown alice's agent.
    let (mut carol_f, _) = connect_with_key(&f.url, CAROL, "client", json!({})).await;
    let (mut carol_w, _) = connect_with_key(&w, CAROL, "client", json!({})).await;
    let carol_subs = (
        carol_f.subscribe(json!({})).await,
        carol_w.subscribe(json!({})).await,
    );

    let resume = |token: &str, extra: serde_json::Value| {
        let mut p = json!({"protocolVersion": 1, "resumeToken": token,
                           "auth": {"method": "api-key", "credential": BOB}});
        merge(&mut p, extra);
        p
    };
    // The paths after which the standby showed bob's agent session alice's agent.
    let mut wrong = Vec::new();
    for (round, path) in ["register", "resume", "reclaimAgents", "session/load"]
        .into_iter()
        .enumerate()
    {
        let bot = format!("bob-bot-{round}");
        let (mut bob, r) = connect_with_key(&f.url, BOB, "agent", json!({})).await;
        let token = r["resumeToken"].as_str().unwrap().to_owned();
        let session = r["sessionId"].clone();
        bob.register_agent(json!({"agentId": bot, "permissionOverrides": direct}))
            .await;
        let mut bob = if path == "register" {
            bob
        } else {
            bob.drop_abruptly();
            orphaned(&mut ops, &bot).await;
            let mut c = WsClient::connect(&f.url).await;
            match path {
                "resume" => {
                    let r = c.ok("map/connect", resume(&token, json!({}))).await;
                    assert_eq!(r["sessionId"], session, "{r}");
                }
                "reclaimAgents" => {
                    let r = c
                        .ok(
                            "map/connect",
                            resume(&token, json!({"reclaimAgents": [bot]})),
                        )
                        .await;
                    assert_eq!(r["sessionId"], session, "{r}");
                }
                _ => {
                    let r = c
                        .ok(
                            "map/connect",
                            json!({"protocolVersion": 1, "participantType": "client",
                                   "auth": {"method": "api-key", "credential": BOB}}),
                        )
                        .await;
                    assert_ne!(r["sessionId"], session, "{r}");
                    let r = c
                        .ok("map/session/load", json!({"sessionId": session}))
                        .await;
                    assert_eq!(r["sessionId"], session, "{r}");
                }
            }
            c
        };
        let got = ops.ok("map/agents/get", json!({"agentId": bot})).await;
        assert_ne!(got["agent"]["state"], json!("orphaned"), "{path}: {got}");
        // The same viewer on the live node: bob's session there speaking as the same agent.
        let (mut twin, _) = connect_with_key(&w, BOB, "agent", json!({})).await;
        let twin_bot = format!("{bot}-twin");
        twin.register_agent(json!({"agentId": twin_bot, "permissionOverrides": direct}))
            .await;
        let sub_f = bob.subscribe(json!({})).await;
        let sub_w = twin.subscribe(json!({})).await;
        alice_then(&mut alice, &mut bob, &bot, round).await;
        let state = state_of(round);
        twin.ok(
            "map/agents/update",
            json!({"agentId": twin_bot, "state": state}),
        )
        .await;
        let on_standby = agents_shown_until(&mut bob, &sub_f, &bot, state).await;
        let on_live = agents_shown_until(&mut twin, &sub_w, &twin_bot, state).await;
        assert!(
            !on_live.iter().any(|a| a == "alice-bot"),
            "{path}: the live node hides alice's agent: {on_live:?}"
        );
        if on_standby.iter().any(|a| a == "alice-bot") {
            wrong.push(format!("{path}: {on_standby:?}"));
        }
        // Carol is shown alice's agent on both nodes.
        for (c, sub) in [(&mut carol_f, &carol_subs.0), (&mut carol_w, &carol_subs.1)] {
            let seen = agents_shown_until(c, sub, &bot, state).await;
            assert!(seen.iter().any(|a| a == "alice-bot"), "{path}: {seen:?}");
        }
    }
    assert!(
        wrong.is_empty(),
        "the standby showed bob's agent session alice's agent after: {wrong:?}"
    );
}

#[test]
fn a_revoked_observer_is_shown_nothing_more_on_a_standby_as_on_the_live_node() {
    on_big_stack(revoked_observer);
}

/// Carol (a client) subscribes on the standby and on the live node; ops revokes her
/// `observation.canObserve` (`map/permissions/update`, on the live node): on both nodes her
/// subscriptions end and show nothing of what follows, and a new `map/subscribe` is refused
/// with 1003, as on one node.
async fn revoked_observer() {
    let nats = Nats::start("takeover-revoked-observer");
    let dir = TempDir::new("cluster-takeover-revoked-observer");
    let keys = keys_file(&dir.path);
    let config = auth_config(&keys, &["ops"], "");
    let (_live, w) = start_binary(node_args_with(
        &nats,
        &dir.path.join("n0"),
        "node = \"n0\"",
        &config,
    ))
    .await;
    let f = start_standby_in(&nats, &dir.path.join("n1"), "n1", "", &config).await;
    let (mut ops, _) = connect_with_key(&w, OPS, "system", json!({})).await;
    let (mut alice, _) = connect_with_key(&w, ALICE, "agent", json!({})).await;
    alice.register_agent(json!({"agentId": "alice-bot"})).await;
    let (mut carol_f, r) = connect_with_key(&f.url, CAROL, "client", json!({})).await;
    let carol_f_id = r["participantId"].clone();
    let (mut carol_w, r) = connect_with_key(&w, CAROL, "client", json!({})).await;
    let carol_w_id = r["participantId"].clone();
    let sub_f = carol_f.subscribe(json!({})).await;
    let sub_w = carol_w.subscribe(json!({})).await;
    // Both are shown alice's agent at first.
    alice
        .ok(
            "map/agents/update",
            json!({"agentId": "alice-bot", "state": "busy"}),
        )
        .await;
    for (c, sub) in [(&mut carol_f, &sub_f), (&mut carol_w, &sub_w)] {
        let seen = agents_shown_until(c, sub, "alice-bot", "busy").await;
        assert!(seen.iter().any(|a| a == "alice-bot"), "{seen:?}");
    }
    for id in [carol_f_id, carol_w_id] {
        ops.ok(
            "map/permissions/update",
            json!({"clientId": id, "permissions": {"observation": {"canObserve": false}}}),
        )
        .await;
    }
    // What each is shown now: the update itself at most, and nothing of alice's agent.
    let (mut marker, _) = connect_with_key(&w, OPS, "system", json!({})).await;
    alice
        .ok(
            "map/agents/update",
            json!({"agentId": "alice-bot", "state": "idle"}),
        )
        .await;
    // The standby has followed the change once a standby subscriber of ops sees it.
    let (mut ops_f, _) = connect_with_key(&f.url, OPS, "system", json!({})).await;
    let sub = ops_f.subscribe_with(json!({"replayFrom": 0})).await;
    agents_shown_until(&mut ops_f, &sub, "alice-bot", "idle").await;
    drop(marker.take_queued());
    let mut wrong = Vec::new();
    for (name, c) in [("standby", &mut carol_f), ("live", &mut carol_w)] {
        let mut shown: Vec<serde_json::Value> = c.take_queued();
        while let Ok(v) = tokio::time::timeout(QUIET, c.read_json()).await {
            shown.push(v);
        }
        shown.retain(|v| v["method"] == json!("map/event"));
        if shown
            .iter()
            .any(|e| e["params"]["event"]["data"]["newState"] == json!("idle"))
        {
            wrong.push(format!("{name}: shown after the revocation: {shown:?}"));
        }
        match c.call("map/subscribe", json!({})).await {
            Err(e) if e["code"] == json!(1003) => {}
            other => wrong.push(format!("{name}: a new subscribe answered {other:?}")),
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
