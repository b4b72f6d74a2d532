//! Resume tokens and the relay (issue 44, item 3: "resume tokens never cross NATS in clear
//! when the relay can avoid it"), end to end on the real binary and a real `nats-server -js`
//! on loopback, three nodes (one live, two standbys):
//!
//! - a NATS observer subscribed to `>` (same account, as a mis-scoped monitoring user would
//!   be) records every message (payload and headers) while a client connects through a
//!   standby, calls `map/session/load` and `map/disconnect` there, resumes through the
//!   standby, on the live node directly, through the other standby, and after a takeover on the
//!   node that took over and through the standby left; none of the tokens the client was given
//!   ever appears there, in clear, as its secret part, in base64 or quoted;
//! - every one of those resumes works (the same session, `reconnected`), and the answers the
//!   client gets through a standby carry the fields a direct connection's do;
//! - the relay-only `resumeTokenDigest` / `nextResumeTokenDigest` parameters are refused on an
//!   ordinary client connection, on the live node and on a standby: a client that learned a
//!   session's digest cannot resume it (the session stays the owner's, its token unchanged).
//!
//! Every await is bounded. Needs `nats-server` on PATH (the test fails, never skips, without it).
#![cfg(feature = "cluster")]

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::cluster::{free_port, health, health_until, node_args, serving, start as spawn};
use common::nats::Nats;
use common::*;
use serde_json::json;

/// Every byte that crossed between the nodes and NATS, each connection's both directions.
type Seen = Arc<Mutex<Vec<Vec<u8>>>>;

/// A loopback TCP proxy in front of the NATS server at `upstream` that records every byte
/// both ways: what a passive reader of every subject (`>`) would see, and more (headers,
/// requests, JetStream's API), without being a subscriber (a subscriber on `>` would answer
/// nothing yet keep the nodes' requests from being told "no responders"). Returns its URL.
async fn record(upstream: &str) -> (String, Seen) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = upstream.trim_start_matches("nats://").to_owned();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("nats://{}", listener.local_addr().unwrap());
    let seen: Seen = Arc::default();
    let all = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                continue;
            };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            for (mut from, mut to) in [
                (
                    Box::new(cr) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                    Box::new(sw) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
                ),
                (Box::new(sr), Box::new(cw)),
            ] {
                let index = {
                    let mut all = all.lock().unwrap();
                    all.push(Vec::new());
                    all.len() - 1
                };
                let all = Arc::clone(&all);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match from.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        all.lock().unwrap()[index].extend_from_slice(&buf[..n]);
                        if to.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown().await;
                });
            }
        }
    });
    (url, seen)
}

/// The forms of `token` a reader could use: as is, its random part, quoted and base64 (every
/// alignment, standard and URL-safe, without the partial characters at the ends).
fn forms(token: &str) -> Vec<String> {
    let mut forms = vec![
        token.to_owned(),
        token.trim_start_matches("resume_").to_owned(),
        serde_json::Value::from(token).to_string(),
    ];
    for skip in 0..3 {
        let bytes = &token.as_bytes()[skip..];
        for enc in [data_encoding::BASE64, data_encoding::BASE64URL] {
            let text = enc.encode(bytes);
            let text = text.trim_end_matches('=');
            forms.push(text[..text.len() - 3].to_owned());
        }
    }
    forms
}

fn sha256_hex(token: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Where any form of the `given` tokens appears in what the recorder saw (the NATS protocol
/// line before it names the subject); asserts the recorder saw the relay at all.
fn leaks(seen: &Seen, given: &[String]) -> Vec<String> {
    let seen: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
        .collect();
    assert!(
        seen.iter().any(|text| text.contains("PUB _MAP.relay.")),
        "the recorder saw the relay"
    );
    let mut leaks = Vec::new();
    for t in given {
        for form in forms(t) {
            for text in &seen {
                if let Some(at) = text.find(&form) {
                    let line = text[..at]
                        .rfind("PUB ")
                        .or_else(|| text[..at].rfind("MSG "))
                        .unwrap_or(at);
                    let head: String = text[line..].chars().take(100).collect();
                    leaks.push(format!("{t} (as {form}) in: {head}"));
                }
            }
        }
    }
    leaks
}

/// A `map/connect` resuming with `token` on `url`: the client and its answer.
async fn resume(url: &str, token: &str) -> (WsClient, serde_json::Value) {
    let mut c = WsClient::connect(url).await;
    let r = within(
        Duration::from_secs(12),
        c.ok(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": "agent", "resumeToken": token}),
        ),
    )
    .await;
    c.session = r.clone();
    (c, r)
}

/// The fields of a `map/connect` answer (what a client sees, whatever node answers).
fn fields(v: &serde_json::Value) -> Vec<String> {
    let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    keys
}

fn token_of(v: &serde_json::Value) -> String {
    let t = v["resumeToken"].as_str().expect("a resumeToken").to_owned();
    assert!(
        t.starts_with("resume_") && t.len() > 20,
        "a usable token: {v}"
    );
    t
}

#[tokio::test]
async fn resume_tokens_never_cross_nats_and_resume_on_every_node() {
    let nats = Nats::start("tokens");
    let dir = TempDir::new("cluster-tokens");
    let (url, seen) = record(&nats.url()).await;
    let live_port = free_port();
    let mut live = spawn(
        node_args(&url, &dir.path.join("n0"), live_port, "node = \"n0\""),
        live_port,
    )
    .await;
    health_until(&live.url, Duration::from_secs(20), "ok", |s, _| s == 200).await;
    let mut standbys = Vec::new();
    for name in ["n1", "n2"] {
        let port = free_port();
        let node = spawn(
            node_args(
                &url,
                &dir.path.join(name),
                port,
                &format!("node = \"{name}\"\nstandby = true\ntakeover_poll_ms = 100"),
            ),
            port,
        )
        .await;
        health_until(&node.url, Duration::from_secs(20), "serving", serving).await;
        standbys.push(node);
    }
    let (n1, n2) = (standbys[0].url.clone(), standbys[1].url.clone());
    let mut given: Vec<String> = Vec::new();

    // What a direct connection's answer looks like (the fields a client expects).
    let direct = WsClient::connect_as(&live.url, "agent", json!({})).await;
    let direct_fields = fields(&direct.session);
    given.push(token_of(&direct.session));
    drop(direct);

    // Connect through a standby, register an agent.
    let mut a = WsClient::agent(&n1, "tok-a", json!({})).await;
    let (sid, pid) = (a.sid(), a.pid());
    assert_eq!(fields(&a.session), direct_fields, "{}", a.session);
    let mut token = token_of(&a.session);
    given.push(token.clone());
    // map/session/load of its own session answers its current token.
    let loaded = a.ok("map/session/load", json!({"sessionId": sid})).await;
    assert_eq!(loaded["restored"], json!(false), "{loaded}");
    assert_eq!(loaded["resumeToken"], json!(token), "{loaded}");
    let listed = a.ok("map/session/list", json!({})).await;
    assert!(
        listed["sessions"].as_array().is_some_and(|s| !s.is_empty()),
        "{listed}"
    );
    // map/disconnect answers a fresh token, which resumes (through the same standby).
    let bye = a
        .ok(
            "map/disconnect",
            json!({"policy": {"agentBehavior": "orphan"}}),
        )
        .await;
    let fresh = token_of(&bye);
    assert_ne!(fresh, token);
    given.push(fresh.clone());
    a.close().await;
    let (c, r) = resume(&n1, &fresh).await;
    assert_eq!(
        (r["sessionId"].clone(), r["reconnected"].clone()),
        (json!(sid), json!(true)),
        "{r}"
    );
    assert_eq!(fields(&r), direct_fields, "{r}");
    token = token_of(&r);
    given.push(token.clone());
    drop(c);
    // The token the old one was replaced by works; the used one does not.
    let mut again = WsClient::connect(&n1).await;
    let stale = again
        .call(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": "agent", "resumeToken": fresh}),
        )
        .await;
    if let Ok(r) = &stale {
        assert_ne!(r["sessionId"], json!(sid), "a used token resumed: {r}");
    }
    drop(again);

    // On the live node directly.
    let (c, r) = resume(&live.url, &token).await;
    assert_eq!(r["sessionId"], json!(sid), "{r}");
    token = token_of(&r);
    given.push(token.clone());
    drop(c);
    // Through the other standby.
    let (c, r) = resume(&n2, &token).await;
    assert_eq!(
        (r["sessionId"].clone(), r["participantId"].clone()),
        (json!(sid), json!(pid)),
        "{r}"
    );
    assert_eq!(fields(&r), direct_fields, "{r}");
    token = token_of(&r);
    given.push(token.clone());
    drop(c);
    // Through the first standby again; it stays connected there.
    let (a, r) = resume(&n1, &token).await;
    assert_eq!(r["sessionId"], json!(sid), "{r}");
    token = token_of(&r);
    given.push(token.clone());

    drop(a);

    // The live node dies: a standby takes over; the session resumes there with its token.
    live.child.start_kill().unwrap();
    with_timeout(live.child.wait()).await.unwrap();
    let took = within(Duration::from_secs(20), async {
        loop {
            for url in [&n1, &n2] {
                if health(url).await.0 == 200 {
                    return url.clone();
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let other = if took == n1 { n2.clone() } else { n1.clone() };
    let (c, r) = resume(&took, &token).await;
    assert_eq!(
        (r["sessionId"].clone(), r["participantId"].clone()),
        (json!(sid), json!(pid)),
        "{r}"
    );
    token = token_of(&r);
    given.push(token.clone());
    drop(c);
    // And through the standby left, relaying to the new live node.
    health_until(&other, Duration::from_secs(20), "serving", serving).await;
    let (c, r) = resume(&other, &token).await;
    assert_eq!(r["sessionId"], json!(sid), "{r}");
    assert_eq!(fields(&r), direct_fields, "{r}");
    token = token_of(&r);
    given.push(token.clone());
    drop(c);

    // Let the last frames arrive, then look at everything NATS carried.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leaks = leaks(&seen, &given);
    assert!(
        leaks.is_empty(),
        "{} times a client's resume token crossed NATS:\n{}",
        leaks.len(),
        leaks.join("\n")
    );

    // A client that learned the session's digest: refused on every node (the live node that
    // took over, the standby), as connect parameters only relay sessions of cluster nodes send.
    let (mut a, r) = resume(&other, &token).await;
    assert_eq!(r["sessionId"], json!(sid), "{r}");
    let token = token_of(&r);
    let digest = sha256_hex(&token);
    for url in [&took, &other] {
        for key in ["resumeTokenDigest", "nextResumeTokenDigest"] {
            let mut thief = WsClient::connect(url).await;
            let mut params = json!({"protocolVersion": 1, "participantType": "agent"});
            params[key] = json!(digest);
            let err = thief.err("map/connect", params).await;
            assert_eq!(err["code"], json!(-32602), "{url} {key}: {err}");
            assert!(err.to_string().contains(key), "{err}");
        }
    }
    // The owner's connection was not taken over, and its token still resumes it.
    a.ok("map/session/list", json!({})).await;
    drop(a);
    let (_c, r) = resume(&took, &token).await;
    assert_eq!(r["sessionId"], json!(sid), "{r}");
}

const ALICE: &str = "key-alice-0123456789abcdef";
const BOB: &str = "key-bob-0123456789abcdef";

/// `[auth]` on, with API keys for `alice` and `bob` in a file under `dir` (mode 0600).
fn two_principals(dir: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let keys = dir.join("keys");
    std::fs::write(&keys, format!("{ALICE} alice\n{BOB} bob\n")).unwrap();
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o600)).unwrap();
    format!(
        "[auth]\n[auth.api_keys]\nfile = {:?}\n",
        keys.display().to_string()
    )
}

/// With authentication on (relay sessions admitted as the principal the standby proved): a
/// `map/session/load` of another detached session through a standby answers that session's
/// new token, filled in by the standby; the token resumes on the live node; a client of
/// another principal gets nothing with the digest; no token crosses NATS.
#[tokio::test]
async fn with_authentication_a_loaded_sessions_token_crosses_nats_as_a_digest_only() {
    let nats = Nats::start("tokens-auth");
    let dir = TempDir::new("cluster-tokens-auth");
    let (url, seen) = record(&nats.url()).await;
    let auth = two_principals(&dir.path);
    let live_port = free_port();
    let mut args = node_args(&url, &dir.path.join("n0"), live_port, "node = \"n0\"");
    let append = |args: &[std::ffi::OsString]| {
        let config = std::path::PathBuf::from(args.last().unwrap());
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(&config, format!("{text}{auth}")).unwrap();
    };
    append(&args);
    let live = spawn(std::mem::take(&mut args), live_port).await;
    health_until(&live.url, Duration::from_secs(20), "ok", |s, _| s == 200).await;
    let port = free_port();
    let args = node_args(
        &url,
        &dir.path.join("n1"),
        port,
        "node = \"n1\"\nstandby = true\ntakeover_poll_ms = 100",
    );
    append(&args);
    let standby = spawn(args, port).await;
    health_until(&standby.url, Duration::from_secs(20), "serving", serving).await;
    let mut given = Vec::new();

    // Two sessions of alice's through the standby; the first is left detached.
    let (first, r1) = connect_with_key(&standby.url, ALICE, "agent", json!({})).await;
    let s1 = r1["sessionId"].as_str().unwrap().to_owned();
    given.push(token_of(&r1));
    let (mut second, r2) = connect_with_key(&standby.url, ALICE, "agent", json!({})).await;
    given.push(token_of(&r2));
    first.close().await;
    // Loading the first (detached once the live node saw the close: bounded retries).
    let loaded = within(Duration::from_secs(10), async {
        loop {
            match second
                .call("map/session/load", json!({"sessionId": s1}))
                .await
            {
                Ok(v) => return v,
                Err(e) if e["code"] == json!(16001) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("map/session/load: {e}"),
            }
        }
    })
    .await;
    assert_eq!(
        (loaded["restored"].clone(), loaded["sessionId"].clone()),
        (json!(true), json!(s1)),
        "{loaded}"
    );
    let token = token_of(&loaded);
    given.push(token.clone());
    drop(second);

    // Bob, with the digest of alice's token, on either node: refused.
    for node in [&live.url, &standby.url] {
        let mut bob = WsClient::connect(node).await;
        let err = bob
            .err(
                "map/connect",
                json!({"protocolVersion": 1, "participantType": "agent",
                       "auth": {"method": "api-key", "credential": BOB},
                       "resumeTokenDigest": sha256_hex(&token)}),
            )
            .await;
        assert_eq!(err["code"], json!(-32602), "{node}: {err}");
    }
    // Alice resumes the loaded session with its token on the live node directly.
    let (_c, r) = connect_with_key(&live.url, ALICE, "agent", json!({"resumeToken": token})).await;
    assert_eq!(
        (r["sessionId"].clone(), r["reconnected"].clone()),
        (json!(s1), json!(true)),
        "{r}"
    );
    given.push(token_of(&r));

    tokio::time::sleep(Duration::from_millis(300)).await;
    let leaks = leaks(&seen, &given);
    assert!(
        leaks.is_empty(),
        "a resume token crossed NATS:\n{}",
        leaks.join("\n")
    );
}
