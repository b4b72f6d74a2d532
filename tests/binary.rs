//! The built `map-router` binary: it starts, prints its listening line, serves connections,
//! drains on SIGTERM (close code 1001, exit code 0), and refuses bad configuration with exit
//! code 2 and a clear message.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

const BIN: &str = env!("CARGO_BIN_EXE_map-router");

/// The binary with `args`, run in `cwd` (where its default data directory lands).
fn command(args: &[&str], cwd: &std::path::Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(cwd)
        .env_remove("MAP_ROUTER_LISTEN")
        .env_remove("MAP_ROUTER_CONFIG")
        .env_remove("MAP_ROUTER_MAX_FRAME_BYTES")
        .env_remove("MAP_ROUTER_DATA_DIR")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Spawns the binary in a fresh working directory, waits for its listening line, and keeps
/// draining stderr. Returns the child, the URL, the task collecting the rest of stderr, and the
/// working directory.
async fn spawn(args: &[&str]) -> (Child, String, JoinHandle<Vec<String>>, TempDir) {
    let cwd = TempDir::new("bin");
    let (child, url, rest) = spawn_in(args, &cwd.path).await;
    (child, url, rest, cwd)
}

/// [`spawn`] in a given working directory.
async fn spawn_in(
    args: &[&str],
    cwd: &std::path::Path,
) -> (Child, String, JoinHandle<Vec<String>>) {
    let mut child = command(args, cwd).spawn().expect("the binary starts");
    let stderr = child.stderr.take().expect("piped stderr");
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let url = loop {
        let line = with_timeout(lines.next_line())
            .await
            .expect("read stderr")
            .unwrap_or_else(|| panic!("stderr closed before the listening line: {seen:?}"));
        if let Some(url) = line.strip_prefix("map-router listening on ") {
            break url.to_owned();
        }
        seen.push(line);
        assert!(seen.len() < 100, "no listening line: {seen:?}");
    };
    let rest = tokio::spawn(async move {
        let mut out = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            out.push(line);
        }
        out
    });
    (child, url, rest)
}

fn assert_loopback_url(url: &str) {
    let port = url
        .strip_prefix("ws://127.0.0.1:")
        .and_then(|r| r.strip_suffix('/'))
        .unwrap_or_else(|| panic!("unexpected listening URL {url}"));
    let port: u16 = port.parse().expect("a port number");
    assert_ne!(port, 0, "the bound port is printed, not 0");
}

fn sigterm(child: &Child) {
    let pid = child.id().expect("running child has a pid");
    let status = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -TERM {pid}");
}

fn temp_config(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "map-router-test-{}-{name}.toml",
        std::process::id()
    ));
    std::fs::write(&path, text).expect("write temp config");
    path
}

#[tokio::test]
async fn the_binary_serves_and_drains_on_sigterm() {
    let (mut child, url, rest, cwd) = spawn(&["--listen", "127.0.0.1:0"]).await;
    assert_loopback_url(&url);

    let mut agent = WsClient::agent(&url, "bin-1", json!({})).await;
    let mut c = WsClient::client(&url).await;
    let sub = c
        .subscribe(json!({"eventTypes": ["agent_state_changed"]}))
        .await;
    agent
        .ok(
            "map/agents/update",
            json!({"agentId": "bin-1", "state": "busy"}),
        )
        .await;
    assert_eq!(
        c.next_event(&sub).await["event"]["data"]["newState"],
        json!("busy")
    );
    assert_eq!(
        ids(&c.ok("map/agents/list", Value::Null).await["agents"]),
        vec!["bin-1"]
    );

    sigterm(&child);
    assert_eq!(c.expect_close().await, Some(1001), "drained with 1001");
    assert_eq!(agent.expect_close().await, Some(1001));
    let status = within(Duration::from_secs(15), child.wait())
        .await
        .expect("wait for the child");
    assert_eq!(status.code(), Some(0), "clean exit after SIGTERM");
    let logs = with_timeout(rest).await.expect("stderr task");
    // Nothing accepts connections any more.
    let refused = tokio::time::timeout(
        Duration::from_secs(2),
        tokio_tungstenite::connect_async(url.as_str()),
    )
    .await;
    assert!(
        !matches!(refused, Ok(Ok(_))),
        "the listener is closed after shutdown; logs: {logs:?}"
    );
    let db = cwd.path.join("map-router-data").join("events.sqlite3");
    assert!(
        db.is_file(),
        "serve keeps events in ./map-router-data by default"
    );
}

#[tokio::test]
async fn the_binary_reads_a_config_file() {
    let path = temp_config(
        "good",
        "listen = [\"127.0.0.1:0\"]\n[limits]\nmax_batch = 2\n[router]\nname = \"from-file\"\n",
    );
    let (mut child, url, _rest, _cwd) = spawn(&["--config", path.to_str().unwrap()]).await;
    assert_loopback_url(&url);
    let c = WsClient::client(&url).await;
    assert_eq!(c.session["systemInfo"]["name"], json!("from-file"));
    let mut c = c;
    let entry = r#"{"jsonrpc":"2.0","id":1,"method":"map/agents/list"}"#;
    let r = c.request_raw(&format!("[{entry},{entry},{entry}]")).await;
    assert_eq!(
        r["error"]["code"],
        json!(-32600),
        "max_batch from the file: {r}"
    );
    sigterm(&child);
    let status = within(Duration::from_secs(15), child.wait())
        .await
        .expect("wait");
    assert_eq!(status.code(), Some(0));
    let _ = std::fs::remove_file(path);
}

async fn run_to_exit(args: &[&str]) -> (Option<i32>, String) {
    let cwd = TempDir::new("bin-exit");
    let out = within(Duration::from_secs(15), command(args, &cwd.path).output())
        .await
        .expect("run the binary");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn an_invalid_config_file_exits_with_code_2_and_says_why() {
    let unknown = temp_config("unknown-key", "[limits]\nmax_frame_byte = 1\n");
    let (code, stderr) = run_to_exit(&["--config", unknown.to_str().unwrap()]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("map-router: invalid config file"),
        "{stderr}"
    );
    assert!(
        stderr.contains(unknown.to_str().unwrap()),
        "names the file: {stderr}"
    );
    assert!(stderr.contains("unknown field"), "{stderr}");
    assert!(!stderr.contains("listening on"), "{stderr}");

    let range = temp_config("range", "[limits]\nmax_frame_bytes = 10\n");
    let (code, stderr) = run_to_exit(&["--config", range.to_str().unwrap()]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("at least 1024"), "{stderr}");

    let syntax = temp_config("syntax", "[limits\nmax_batch = \n");
    let (code, stderr) = run_to_exit(&["--config", syntax.to_str().unwrap()]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("map-router: invalid config file"),
        "{stderr}"
    );

    let missing = std::env::temp_dir().join("map-router-test-does-not-exist.toml");
    let (code, stderr) = run_to_exit(&["--config", missing.to_str().unwrap()]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("cannot read config file"), "{stderr}");

    for p in [unknown, range, syntax] {
        let _ = std::fs::remove_file(p);
    }
}

#[tokio::test]
async fn a_second_router_on_the_same_data_dir_is_refused() {
    let cwd = TempDir::new("bin-lock");
    let data = cwd.path.join("shared");
    let data = data.to_str().unwrap();
    let (mut first, url, _rest) =
        spawn_in(&["--listen", "127.0.0.1:0", "--data-dir", data], &cwd.path).await;
    let (code, stderr) = run_to_exit(&["--listen", "127.0.0.1:0", "--data-dir", data]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("map-router: cannot start")
            && stderr.contains("in use by another map-router process")
            && stderr.contains(&format!("pid {}", first.id().unwrap())),
        "says which process holds it: {stderr}"
    );
    // The first router is unaffected.
    let c = WsClient::client(&url).await;
    assert_eq!(c.session["systemInfo"]["name"], json!("map-router"));
    sigterm(&first);
    let status = within(Duration::from_secs(15), first.wait())
        .await
        .expect("wait");
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn ephemeral_writes_nothing_to_disk() {
    let (mut child, url, _rest, cwd) = spawn(&["--listen", "127.0.0.1:0", "--ephemeral"]).await;
    let mut agent = WsClient::agent(&url, "eph-1", json!({})).await;
    agent
        .ok(
            "map/agents/update",
            json!({"agentId": "eph-1", "state": "busy"}),
        )
        .await;
    sigterm(&child);
    let status = within(Duration::from_secs(15), child.wait())
        .await
        .expect("wait");
    assert_eq!(status.code(), Some(0));
    let entries: Vec<_> = std::fs::read_dir(&cwd.path).unwrap().collect();
    assert!(entries.is_empty(), "nothing written: {entries:?}");
}
