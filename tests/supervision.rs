//! Supervised subprocess agents with small real child programs (`tests/children/*.sh`): a
//! well-behaved agent, one that crashes, one that ignores SIGTERM, one that dies during its
//! handshake, one that writes garbage on its MAP channel, one that floods stderr. Asserts the
//! events, restarts, kill escalation, and that no child outlives the router (read from the
//! process table, bounded in time).

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn spawn_params(name: &str, script: &str, extra: Value) -> Value {
    let mut command = json!({"program": child_program(script)});
    merge(&mut command, extra);
    json!({"name": name, "command": command})
}

/// Whether a process with this pid exists and is not a zombie.
fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|rest| rest.trim().to_owned()))
        .is_some_and(|rest| !rest.starts_with('Z'))
}

/// The process state letter from /proc (R, S, T, Z, ...).
fn state(pid: u64) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')').next()?.trim().chars().next()
}

/// Pids of live (non-zombie) processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<u64> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(marker) && alive(pid) {
            out.push(pid);
        }
    }
    out
}

async fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_spawned_process_is_a_child_agent_that_stops_gracefully() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["agent_registered", "agent_state_changed"]}))
        .await;
    let mut boss = WsClient::agent(&url, "sp-boss", json!({})).await;
    let log = std::env::temp_dir().join(format!("map-router-echo-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let r = boss
        .ok(
            "map/agents/spawn",
            spawn_params(
                "kid",
                "echo_agent.sh",
                json!({"env": {"LOG": log.display().to_string()}}),
            ),
        )
        .await;
    let kid = r["agent"]["id"].as_str().unwrap().to_owned();
    let pid = r["process"]["pid"].as_u64().unwrap();
    assert_eq!(r["agent"]["parent"], json!("sp-boss"));
    assert_eq!(r["agent"]["name"], json!("kid"));
    assert_eq!(r["agent"]["state"], json!("registered"));
    assert!(alive(pid));
    let ev = obs
        .next_notification_where(|v| {
            v["params"]["event"]["type"] == json!("agent_registered")
                && v["params"]["event"]["data"]["agentId"] == json!(kid)
        })
        .await;
    assert_eq!(ev["params"]["event"]["data"]["parent"], json!("sp-boss"));

    // A message reaches the process over its stdin.
    let sent = boss
        .send(json!({"agent": kid}), json!({"hello": "kid"}))
        .await;
    assert_eq!(sent["delivered"], json!([kid]));

    boss.ok("map/agents/stop", json!({"agentId": kid})).await;
    let stopping = obs.event_of_type(&sub, "agent_state_changed").await;
    assert_eq!(stopping["event"]["data"]["newState"], json!("stopping"));
    let stopped = obs.event_of_type(&sub, "agent_state_changed").await;
    assert_eq!(stopped["event"]["data"]["newState"], json!("stopped"));
    assert_eq!(stopped["event"]["data"]["exitCode"], json!(0));
    wait_until("the child to be reaped", Duration::from_secs(5), || {
        !alive(pid)
    })
    .await;
    let seen = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        seen.contains("\"hello\":\"kid\""),
        "the child got the message: {seen}"
    );
    assert!(
        seen.contains("\"control\":\"stop\""),
        "the child got the stop: {seen}"
    );
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn a_crashing_child_is_restarted_with_backoff_up_to_the_limit() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["agent_state_changed"]}))
        .await;
    let mut boss = WsClient::agent(&url, "cr-boss", json!({})).await;
    let r = boss
        .ok(
            "map/agents/spawn",
            spawn_params(
                "crasher",
                "crash_agent.sh",
                json!({"restart": {"mode": "on-failure", "maxRestarts": 2, "backoffMs": 50}}),
            ),
        )
        .await;
    let id = r["agent"]["id"].as_str().unwrap().to_owned();
    let mut crashes = 0;
    let mut restarts = 0;
    for _ in 0..20 {
        let ev = obs.next_event(&sub).await;
        let data = &ev["event"]["data"];
        assert_eq!(data["agentId"], json!(id));
        match data["newState"].as_str() {
            Some("failed") => {
                crashes += 1;
                assert_eq!(data["exitCode"], json!(3));
                assert!(
                    data["stderrTail"]
                        .as_array()
                        .unwrap()
                        .contains(&json!("fatal: something broke")),
                    "{data}"
                );
                if crashes <= 2 {
                    assert_eq!(data["reason"], json!("crashed; restarting"));
                } else {
                    assert_eq!(data["reason"], json!("crashed"));
                    break;
                }
            }
            Some("registered") => {
                restarts += 1;
                assert_eq!(data["reason"], json!("restarted"));
            }
            other => panic!("unexpected state {other:?}: {data}"),
        }
    }
    assert_eq!((crashes, restarts), (3, 2));
    let agent = boss.ok("map/agents/get", json!({"agentId": id})).await;
    assert_eq!(agent["agent"]["state"], json!("failed"));
    assert_eq!(agent["agent"]["ownerId"], Value::Null);
    assert_eq!(agent["agent"]["lifecycle"]["exitCode"], json!(3));
}

#[tokio::test]
async fn a_child_that_ignores_sigterm_is_killed() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["agent_state_changed"]}))
        .await;
    let mut boss = WsClient::agent(&url, "st-boss", json!({})).await;
    let r = boss
        .ok(
            "map/agents/spawn",
            spawn_params(
                "stubborn",
                "stubborn_agent.sh",
                json!({"stopTimeoutMs": 200, "killTimeoutMs": 300}),
            ),
        )
        .await;
    let id = r["agent"]["id"].as_str().unwrap().to_owned();
    let pid = r["process"]["pid"].as_u64().unwrap();
    let started = std::time::Instant::now();
    boss.ok("map/agents/stop", json!({"agentId": id})).await;
    assert_eq!(
        obs.next_event(&sub).await["event"]["data"]["newState"],
        json!("stopping")
    );
    let stopped = obs.next_event(&sub).await;
    let data = &stopped["event"]["data"];
    assert_eq!(data["newState"], json!("stopped"), "{data}");
    assert_eq!(data["signal"], json!(9), "only SIGKILL ends it: {data}");
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "escalation waits stop + kill timeouts"
    );
    wait_until("the child to be reaped", Duration::from_secs(5), || {
        !alive(pid)
    })
    .await;
}

#[tokio::test]
async fn a_child_that_dies_or_stays_silent_during_its_handshake_fails_the_spawn() {
    let (_server, url) = default_server().await;
    let mut boss = WsClient::agent(&url, "hs-boss", json!({})).await;
    let err = boss
        .err(
            "map/agents/spawn",
            spawn_params("doomed", "handshake_death.sh", json!({})),
        )
        .await;
    assert_eq!(err["code"], json!(3004));
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("exit code 5"), "{message}");
    assert!(message.contains("cannot load model weights"), "{message}");

    let marker = format!("silent-{}", uuid_like());
    let err = boss
        .err(
            "map/agents/spawn",
            json!({"name": "silent", "command": {"program": "sh", "args": ["-c", "sleep 30", &marker], "handshakeTimeoutMs": 300}}),
        )
        .await;
    assert_eq!(err["code"], json!(3004));
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("did not register within 300 ms"),
        "{err}"
    );
    wait_until(
        "the silent child to be killed",
        Duration::from_secs(5),
        || processes_with(&marker).is_empty(),
    )
    .await;
    // Nothing was left registered.
    let list = boss.ok("map/agents/list", Value::Null).await;
    assert_eq!(ids(&list["agents"]), vec!["hs-boss"]);
    // An unknown program fails at once.
    let err = boss
        .err(
            "map/agents/spawn",
            json!({"command": {"program": "/nonexistent/agent"}}),
        )
        .await;
    assert_eq!(err["code"], json!(3004));
}

/// A child that connects without `participantType` is an agent (the docs' minimal children
/// rely on it); one that insists on being a client cannot register, and the failed spawn says
/// why: the child's last error answer and its stderr.
#[tokio::test]
async fn a_child_is_an_agent_by_default_and_a_failed_handshake_says_why() {
    let (_server, url) = default_server().await;
    let mut boss = WsClient::agent(&url, "why-boss", json!({})).await;
    let plain = r#"printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"map/connect"}' '{"jsonrpc":"2.0","id":2,"method":"map/agents/register","params":{"name":"plain"}}'; cat > /dev/null"#;
    let spawned = boss
        .ok(
            "map/agents/spawn",
            json!({"name": "plain", "command": {"program": "sh", "args": ["-c", plain], "handshakeTimeoutMs": 5000}}),
        )
        .await;
    assert_eq!(spawned["agent"]["name"], json!("plain"), "{spawned}");
    assert_eq!(spawned["agent"]["state"], json!("registered"), "{spawned}");

    let marker = format!("client-{}", uuid_like());
    let client = r#"printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"participantType":"client"}}' '{"jsonrpc":"2.0","id":"reg","method":"map/agents/register","params":{}}'; echo "waiting for my registration" >&2; sleep 30"#;
    let err = boss
        .err(
            "map/agents/spawn",
            json!({"name": "client", "command": {"program": "sh", "args": ["-c", client, &marker], "handshakeTimeoutMs": 1500}}),
        )
        .await;
    assert_eq!(err["code"], json!(3004), "{err}");
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains("did not register within 1500 ms"),
        "{message}"
    );
    assert!(
        message.contains("last error answer: map/agents/register → 1003"),
        "{message}"
    );
    assert!(message.contains("lifecycle.canRegister"), "{message}");
    assert!(
        message.contains("stderr: waiting for my registration"),
        "{message}"
    );
    wait_until(
        "the client child to be killed",
        Duration::from_secs(5),
        || processes_with(&marker).is_empty(),
    )
    .await;

    // One that gives up after the refusal: the exit and the refusal both reach the spawner.
    let quitter = r#"printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"participantType":"client"}}' '{"jsonrpc":"2.0","id":2,"method":"map/agents/register"}'; read -r a; read -r b; echo "refused: $b" >&2; exit 3"#;
    let err = boss
        .err(
            "map/agents/spawn",
            json!({"name": "quitter", "command": {"program": "sh", "args": ["-c", quitter], "handshakeTimeoutMs": 5000}}),
        )
        .await;
    assert_eq!(err["code"], json!(3004), "{err}");
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("exit code 3"), "{message}");
    assert!(
        message.contains("last error answer: map/agents/register → 1003"),
        "{message}"
    );
    assert!(message.contains("refused: "), "{message}");
}

#[tokio::test]
async fn garbage_on_the_map_channel_becomes_diagnostics_and_the_session_survives() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let sub = obs
        .subscribe(json!({"eventTypes": ["agent.diagnostic"]}))
        .await;
    let mut boss = WsClient::agent(&url, "gb-boss", json!({})).await;
    let r = boss
        .ok(
            "map/agents/spawn",
            spawn_params("noisy", "garbage_agent.sh", json!({})),
        )
        .await;
    let id = r["agent"]["id"].as_str().unwrap().to_owned();
    let first = obs.next_event(&sub).await;
    assert_eq!(first["event"]["data"]["line"], json!("Loading..."));
    assert_eq!(first["event"]["data"]["agentId"], json!(id));
    let second = obs.next_event(&sub).await;
    assert_eq!(second["event"]["data"]["line"], json!("[1, 2, oops"));
    // The session is intact: the agent is registered and owned, and it takes messages.
    let agent = boss.ok("map/agents/get", json!({"agentId": id})).await;
    assert_eq!(agent["agent"]["state"], json!("registered"));
    assert!(agent["agent"]["ownerId"].is_string());
    let sent = boss.send(json!({"agent": id}), json!({"ping": 1})).await;
    assert_eq!(sent["delivered"], json!([id]));
    obs.assert_no_event(&sub).await;
}

#[tokio::test]
async fn a_stderr_flood_is_rate_limited_counted_and_harmless() {
    let (_server, url) = default_server().await;
    let mut obs = WsClient::client(&url).await;
    let sub = obs.subscribe(json!({"eventTypes": ["agent.stderr"]})).await;
    let mut boss = WsClient::agent(&url, "fl-boss", json!({})).await;
    boss.ok(
        "map/agents/spawn",
        spawn_params("flood", "stderr_flood.sh", json!({})),
    )
    .await;
    let mut published = 0u64;
    let mut dropped = 0u64;
    let mut events = 0;
    while published + dropped < 5001 {
        let ev = obs.next_event(&sub).await;
        let data = &ev["event"]["data"];
        let lines = data["lines"].as_array().unwrap();
        assert!(lines.len() <= 50, "batches are bounded");
        published += lines.len() as u64;
        dropped += data["dropped"].as_u64().unwrap_or(0);
        events += 1;
        assert!(events < 200, "too many events for one flood");
    }
    assert_eq!(
        published + dropped,
        5001,
        "every line is published or counted"
    );
    assert!(dropped > 0, "a flood this fast is rate-limited");
    assert!(
        published <= 1200,
        "published lines are rate-limited: {published}"
    );
    // The router is unaffected.
    let list = boss.ok("map/agents/list", Value::Null).await;
    assert_eq!(list["agents"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn suspend_resume_and_unregister_reach_the_process() {
    let (_server, url) = default_server().await;
    let mut boss = WsClient::agent(&url, "sr-boss", json!({})).await;
    let r = boss
        .ok(
            "map/agents/spawn",
            spawn_params("sleepy", "echo_agent.sh", json!({})),
        )
        .await;
    let id = r["agent"]["id"].as_str().unwrap().to_owned();
    let pid = r["process"]["pid"].as_u64().unwrap();
    boss.ok("map/agents/suspend", json!({"agentId": id})).await;
    wait_until("SIGSTOP", Duration::from_secs(5), || {
        state(pid) == Some('T')
    })
    .await;
    boss.ok("map/agents/resume", json!({"agentId": id})).await;
    wait_until("SIGCONT", Duration::from_secs(5), || {
        state(pid).is_some_and(|s| s != 'T')
    })
    .await;
    boss.ok("map/agents/unregister", json!({"agentId": id}))
        .await;
    wait_until("the process to stop", Duration::from_secs(10), || {
        !alive(pid)
    })
    .await;
}

fn uuid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// Starts the built binary with `config`, waits for it to listen; returns the child.
async fn start_binary(config: &str) -> (tokio::process::Child, String, TempDir) {
    let dir = TempDir::new("sup");
    let path = dir.path.join("router.toml");
    std::fs::write(&path, config).unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_map-router"));
    cmd.arg("--config")
        .arg(&path)
        .arg("--data-dir")
        .arg(dir.path.join("data"))
        .arg("--listen")
        .arg("127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let url = with_timeout(async move {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.strip_prefix("map-router listening on ") {
                // Keep draining stderr so the router never blocks on it.
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                return rest.to_owned();
            }
        }
        panic!("router exited before listening");
    })
    .await;
    (child, url, dir)
}

async fn no_child_outlives(signal: &str) {
    let marker = format!("outlive-{signal}-{}", uuid_like());
    let config = format!(
        "[supervisor]\nshutdown_timeout_ms = 300\n\n[[agents]]\nname = \"stubborn\"\nprogram = \"{}\"\nargs = [\"{marker}\"]\n\n[[agents]]\nname = \"echo\"\nprogram = \"{}\"\nargs = [\"{marker}\"]\n",
        child_program("stubborn_agent.sh"),
        child_program("echo_agent.sh"),
    );
    let (mut router, _url, _dir) = start_binary(&config).await;
    wait_until("both children running", Duration::from_secs(10), || {
        processes_with(&marker).len() == 2
    })
    .await;
    let pid = router.id().unwrap().to_string();
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(&pid)
        .status()
        .unwrap();
    assert!(status.success());
    let exit = within(Duration::from_secs(15), router.wait())
        .await
        .unwrap();
    if signal != "KILL" {
        assert!(exit.success(), "graceful exit on SIG{signal}: {exit:?}");
    }
    wait_until(
        &format!("no child after SIG{signal}"),
        Duration::from_secs(10),
        || processes_with(&marker).is_empty(),
    )
    .await;
}

#[tokio::test]
async fn no_child_outlives_the_router_on_sigterm() {
    no_child_outlives("TERM").await;
}

#[tokio::test]
async fn no_child_outlives_the_router_on_sigint() {
    no_child_outlives("INT").await;
}

#[tokio::test]
async fn no_child_outlives_a_crashed_router() {
    no_child_outlives("KILL").await;
}

/// The exposure rules hide a supervised agent from its very first event: `agent.spawning` is
/// emitted before the child registers, and for an id the rules hide it reaches system observers
/// only, in live streams and in replay alike.
#[tokio::test]
async fn a_hidden_supervised_agent_is_hidden_from_its_first_event() {
    let (_server, url) = start_server(|c| {
        c.permissions = toml::from_str("[exposure.agents]\nhidden = [\"secret-*\"]\n")
            .expect("a valid [permissions] table");
    })
    .await;
    let mut watcher = WsClient::client(&url).await;
    let sub = watcher
        .subscribe(json!({"eventTypes": ["agent.*", "agent.spawning"]}))
        .await;
    let mut sys = WsClient::system(&url).await;
    for id in ["secret-kid", "public-kid"] {
        sys.ok(
            "map/agents/spawn",
            json!({"agentId": id, "name": id, "command": {"program": child_program("echo_agent.sh")}}),
        )
        .await;
    }
    // The public child's registration comes after the secret child's spawning in the log.
    let registered = watcher.event_of_type(&sub, "agent_registered").await;
    assert_eq!(registered["event"]["data"]["agentId"], json!("public-kid"));
    let about = |events: &Value, id: &str| -> Vec<String> {
        events["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["event"]["data"]["agentId"] == json!(id))
            .map(|e| e["event"]["type"].as_str().unwrap().to_owned())
            .collect()
    };
    // agent.spawning is one of our vendor types: replayed when named.
    let every = json!({"limit": 1000, "filter": {"eventTypes": ["*", "agent.spawning"]}});
    let seen = watcher.ok("map/replay", every.clone()).await;
    assert_eq!(about(&seen, "secret-kid"), Vec::<String>::new());
    assert!(about(&seen, "public-kid").contains(&"agent.spawning".to_owned()));
    let all = sys.ok("map/replay", every).await;
    assert!(about(&all, "secret-kid").contains(&"agent.spawning".to_owned()));
}
