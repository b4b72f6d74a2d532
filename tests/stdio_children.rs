//! The minimal stdio agents of `docs/supervision.md` (`examples/stdio-agent/agent.py` and
//! `agent.mjs`) work as documented, driven only by the CLI: launched by the router
//! (`map-router spawn`) and bridged (`map-router agent --`), asked with `map-router request`,
//! stopped with `map-router stop`, and seen `stopped`. The docs show the files whole, so the
//! check that the docs' copies are the files (tests/docs_examples.rs) keeps them from drifting.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::docs::{doc_script, root};
use common::*;
use futures::StreamExt;
use map_router::client::{Client, ClientOptions};
use map_router::protocol::event::SubscriptionFilter;
use serde_json::{json, Value};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_map-router");

/// Generous: a Python or Node start on a busy 2-core machine.
const STEP: Duration = Duration::from_secs(30);

/// The children, as `(label, program, script)` relative to the repository.
const CHILDREN: [(&str, &str, &str); 2] = [
    ("py", "python3", "examples/stdio-agent/agent.py"),
    ("node", "node", "examples/stdio-agent/agent.mjs"),
];

fn cli(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env("MAP_ROUTER_URL", url)
        .env_remove("RUST_LOG")
        .current_dir(root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Runs a CLI command to its end; returns stdout, and panics with stderr when it failed.
async fn run(url: &str, args: &[&str]) -> String {
    let out = within(STEP, cli(url, args).output())
        .await
        .expect("the CLI runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "map-router {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The agent named `name` in `map-router agents --json`, if listed.
async fn listed(url: &str, name: &str) -> Option<Value> {
    let out = run(url, &["agents", "--json"]).await;
    let agents: Value = serde_json::from_str(&out).expect("agents --json is JSON");
    agents
        .as_array()
        .expect("a list")
        .iter()
        .find(|a| a["name"] == json!(name))
        .cloned()
}

/// Asks `name` through the CLI and checks the echo.
async fn ask(url: &str, name: &str) {
    let out = run(
        url,
        &["request", "--to", name, "--payload", r#"{"q":"ping?"}"#],
    )
    .await;
    let reply: Value = serde_json::from_str(&out).expect("the reply's payload is JSON");
    assert_eq!(reply, json!({"echo": {"q": "ping?"}, "by": name}), "{out}");
}

async fn router() -> (tokio::process::Child, String) {
    start_binary(["serve", "--listen", "127.0.0.1:0", "--ephemeral"]).await
}

#[tokio::test]
async fn the_documented_commands_run_as_written() {
    let (_router, url) = router().await;
    let dir = PathBuf::from(BIN).parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = doc_script("docs/supervision.md", "stdio-children");
    let out = within(
        STEP * 3,
        Command::new("sh")
            .arg("-ec")
            .arg(&script)
            .env("PATH", path)
            .env("MAP_ROUTER_URL", &url)
            .current_dir(root())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script}\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(r#""by": "echo""#), "{stdout}");
    assert!(stdout.contains(r#""stopping": true"#), "{stdout}");
    wait_stopped(&url, "echo").await;
}

/// Waits (bounded) until `name` is listed as `stopped`.
async fn wait_stopped(url: &str, name: &str) {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let agent = listed(url, name).await;
        if agent
            .as_ref()
            .is_some_and(|a| a["state"] == json!("stopped"))
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never became stopped: {agent:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn each_documented_child_under_spawn() {
    let (_router, url) = router().await;
    for (label, program, script) in CHILDREN {
        let name = format!("spawned-{label}");
        let out = run(&url, &["spawn", "--name", &name, "--", program, script]).await;
        let spawned: Value = serde_json::from_str(&out).expect("spawn prints JSON");
        assert_eq!(spawned["agent"]["name"], json!(name), "{out}");
        assert!(spawned["process"]["pid"].as_u64().is_some(), "{out}");
        ask(&url, &name).await;
        let stopped = run(&url, &["stop", &name]).await;
        assert!(stopped.contains(r#""stopping": true"#), "{stopped}");
        wait_stopped(&url, &name).await;
    }
}

#[tokio::test]
async fn each_documented_child_through_the_bridge() {
    let (_router, url) = router().await;
    // A dashboard's view of it all.
    let watcher = with_timeout(Client::connect_ws(&url, ClientOptions::new()))
        .await
        .unwrap();
    let mut events = with_timeout(watcher.subscribe(SubscriptionFilter {
        event_types: Some(vec!["agent.*".into()]),
        ..Default::default()
    }))
    .await
    .unwrap();
    for (label, program, script) in CHILDREN {
        let name = format!("bridged-{label}");
        let mut bridge = cli(&url, &["agent", "--name", &name, "--", program, script])
            .spawn()
            .unwrap();
        // Registered (the bridge made it an agent although it did not say so).
        let deadline = tokio::time::Instant::now() + STEP;
        let id = loop {
            if let Some(agent) = listed(&url, &name).await {
                break agent["id"].clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} never registered"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        ask(&url, &name).await;
        run(&url, &["stop", &name]).await;
        // The program exits 0 on the stop, and so does the bridge.
        let status = within(STEP, bridge.wait()).await.unwrap();
        assert!(status.success(), "the bridge exited with {status}");
        // Observers saw it stopped, then unregistered (not left orphaned).
        let mut states = Vec::new();
        let gone = within(STEP, async {
            while let Some(e) = events.next().await {
                let data = e.data();
                if data["agentId"] != id {
                    continue;
                }
                match e.kind().to_string().as_str() {
                    "agent_state_changed" => {
                        states.push(data["newState"].as_str().unwrap_or("").to_owned())
                    }
                    "agent_unregistered" => return data["reason"].clone(),
                    _ => {}
                }
            }
            panic!("the event stream ended");
        })
        .await;
        assert_eq!(states, ["stopping", "stopped"], "{name}");
        assert_eq!(gone, json!("owner_disconnected"), "{name}");
        assert!(
            listed(&url, &name).await.is_none(),
            "{name} is still listed"
        );
    }
}
