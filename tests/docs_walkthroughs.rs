//! The walkthroughs in `docs/` run as written: the blocks marked `<!-- doc: test NAME -->` are
//! joined in order and run with `sh -e` against the built router on 127.0.0.1, and what they
//! printed (and left behind) is checked.

mod common;

use std::time::Duration;

use common::docs::doc_script;
use common::*;

/// Runs `script` with `sh -e` in `dir` with `env`, bounded by `limit`; returns stdout, and
/// panics with both streams when it fails.
async fn run_script(
    script: &str,
    dir: &std::path::Path,
    env: &[(&str, &str)],
    limit: Duration,
) -> String {
    let out = within(
        limit,
        tokio::process::Command::new("sh")
            .arg("-ec")
            .arg(script)
            .current_dir(dir)
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("sh runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the script failed ({}):\n{script}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    stdout
}

#[tokio::test]
async fn the_http_and_sse_walkthrough_with_curl() {
    let dir = TempDir::new("http-walkthrough");
    let (_router, url) = start_binary(["serve", "--listen", "127.0.0.1:0", "--ephemeral"]).await;
    let http = url.trim_end_matches('/').replacen("ws://", "http://", 1);
    let script = doc_script("docs/http.md", "http-walkthrough");
    let out = run_script(
        &script,
        &dir.path,
        &[("MAP_HTTP", &http)],
        Duration::from_secs(30),
    )
    .await;
    let session = out
        .lines()
        .find_map(|l| l.strip_prefix("session: "))
        .expect("the session line");
    assert!(session.starts_with("http_"), "{out}");
    let agent = out
        .lines()
        .find_map(|l| l.strip_prefix("agent: "))
        .expect("the agent line");
    assert!(!agent.is_empty(), "{out}");
    assert!(out.contains(r#""subscriptionId":"#), "{out}");
    assert!(
        out.contains(&format!(r#""delivered":["{agent}"]"#)),
        "{out}"
    );
    // The stream, in order: message_sent, the message, message_delivered, close.
    let events = std::fs::read_to_string(dir.path.join("events.txt")).expect("events.txt");
    let at = |needle: &str| {
        events
            .find(needle)
            .unwrap_or_else(|| panic!("no {needle} in the stream:\n{events}"))
    };
    let sent = at(r#""type":"message_sent""#);
    let message = at("event: map/message");
    let delivered = at(r#""type":"message_delivered""#);
    let close = at("event: close");
    assert!(
        sent < message && message < delivered && delivered < close,
        "{events}"
    );
    assert!(
        events.contains(r#""payload":{"hello":"from curl"}"#),
        "{events}"
    );
}

/// The README's command-line session, against the built binary (on the `PATH`, as after
/// `cargo install --path .`), from the repository's root.
#[tokio::test]
async fn the_readme_command_line_session() {
    let (_router, url) = start_binary(["serve", "--listen", "127.0.0.1:0", "--ephemeral"]).await;
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_map-router"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = doc_script("README.md", "readme-cli");
    let out = run_script(
        &script,
        &common::docs::root(),
        &[("PATH", &path), ("MAP_ROUTER_URL", &url)],
        Duration::from_secs(60),
    )
    .await;
    // spawn, agents, send, request, suspend, resume, inject, stop, stdio: each said its piece.
    for needle in [
        r#""name": "worker-1""#,   // spawn's result
        "worker-1  echo",          // the agents table
        r#""delivered":"#,         // send's result
        r#""by": "worker-1""#,     // request: the reply's payload
        r#""state": "suspended""#, // suspend
        r#""injected": true"#,     // inject
        r#""stopping": true"#,     // stop
        r#""protocolVersion":1"#,  // map-router stdio answered map/connect
    ] {
        assert!(out.contains(needle), "no {needle} in:\n{out}");
    }
}

/// The README's configuration file runs as copied: saved beside the minimal agent it starts
/// (a copy of the repository's layout), the router starts on it (its `listen` replaced by a
/// free port), keeps its log next to the file, and the configured agent answers.
#[tokio::test]
async fn the_readme_config_file_runs_as_copied() {
    let dir = TempDir::new("readme-config");
    let config = doc_script("README.md", "readme-config");
    std::fs::write(dir.path.join("router.toml"), &config).unwrap();
    std::fs::create_dir_all(dir.path.join("examples/stdio-agent")).unwrap();
    std::fs::copy(
        common::docs::root().join("examples/stdio-agent/agent.py"),
        dir.path.join("examples/stdio-agent/agent.py"),
    )
    .unwrap();
    // Started from elsewhere: the file's relative paths must not depend on the working directory.
    let config_path = dir.path.join("router.toml");
    let (_router, url) = start_binary([
        "serve",
        "--config",
        config_path.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ])
    .await;
    assert!(
        dir.path.join("map-router-data/events.sqlite3").exists(),
        "the log is beside the file"
    );
    let bin = env!("CARGO_BIN_EXE_map-router");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = within(
            Duration::from_secs(30),
            tokio::process::Command::new(bin)
                .args(["request", "--url", &url, "--to", "echo", "--payload", "1"])
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status.success() {
            assert!(stdout.contains(r#""by": "echo""#), "{stdout}");
            break;
        }
        // The agent may still be starting: "no agent has the id or name `echo`".
        assert!(
            tokio::time::Instant::now() < deadline,
            "the configured agent never answered: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The binary on `PATH`, the router's addresses in the walkthroughs' variables, the
/// repository as the working directory: as a reader runs docs/gateways.md's sessions.
async fn gateway_walkthrough(script: String) -> String {
    let (_router, url) = start_binary(["serve", "--listen", "127.0.0.1:0", "--ephemeral"]).await;
    let host = url
        .trim_start_matches("ws://")
        .trim_end_matches('/')
        .to_owned();
    let http = format!("http://{host}");
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_map-router"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    run_script(
        &script,
        &common::docs::root(),
        &[
            ("PATH", &path),
            ("MAP_ROUTER_URL", &url),
            ("MAP_HTTP", &http),
            ("MAP_HOST", &host),
        ],
        Duration::from_secs(60),
    )
    .await
}

#[tokio::test]
async fn the_mamp_walkthrough_with_curl() {
    let out = gateway_walkthrough(doc_script("docs/gateways.md", "mamp-walkthrough")).await;
    assert!(out.contains(r#""protocol":"mamp/1.0""#), "{out}");
    assert!(out.contains(r#""max_message_size":262144"#), "{out}");
    let first = out
        .lines()
        .find_map(|l| l.strip_prefix("first: "))
        .expect("the first answer");
    let first: serde_json::Value = serde_json::from_str(first).unwrap();
    assert_eq!(first["status"], "received", "{out}");
    let conv = first["conversation_id"].as_str().unwrap();
    assert!(
        out.contains(&format!(
            r#"{{"conversation_id":"{conv}","message_id":"msg-2","status":"received"}}"#
        )),
        "{out}"
    );
    // Both replies, fetched once each, in the sender's conversation, content byte for byte.
    let replies = out
        .lines()
        .find_map(|l| l.strip_prefix("replies: "))
        .expect("the replies");
    assert_eq!(replies.matches(r#""by": "echo""#).count(), 2, "{out}");
    assert_eq!(
        replies
            .matches(&format!(r#""conversation_id":"{conv}""#))
            .count(),
        2,
        "{out}"
    );
    assert!(
        replies.contains(r#""to":"agent://your-domain.com/agent-123""#),
        "{out}"
    );
}

#[tokio::test]
async fn the_im_walkthrough_with_curl_and_python() {
    let out = gateway_walkthrough(doc_script("docs/gateways.md", "im-walkthrough")).await;
    let status = out
        .lines()
        .find(|l| l.contains(r#""agent_uri":"agent://internal/my-agent""#))
        .expect("the status line");
    assert!(status.contains(r#""status":"online""#), "{out}");
    assert!(out.contains(r#""status":"sent""#), "{out}");
    assert!(out.contains(r#""type": "registered""#), "{out}");
    assert!(out.contains(r#""type": "message""#), "{out}");
    assert!(out.contains(r#""content": "帮我分析代码""#), "{out}");
    assert!(
        out.contains(r#""capabilities":["file_read","bash"]"#),
        "{out}"
    );
}
