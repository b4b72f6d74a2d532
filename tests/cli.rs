//! The built binary's user commands against a router started in the test (127.0.0.1:0):
//! `agents`, `scopes`, `send`, `watch --json`, `agent -- <cmd>` and `spawn`.

use std::process::{Output, Stdio};
use std::time::Duration;

use futures::StreamExt;
use map_router::client::{Client, ClientOptions};
use map_router::protocol::event::SubscriptionFilter;
use map_router::protocol::methods::agents::RegisterParams;
use map_router::protocol::methods::scopes::ScopesCreateParams;
use map_router::server::{Config, Server};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_map-router");

/// The bound on every single await.
const TIMEOUT: Duration = Duration::from_secs(10);

async fn within<F: std::future::Future>(limit: Duration, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}"),
    }
}

async fn with_timeout<F: std::future::Future>(fut: F) -> F::Output {
    within(TIMEOUT, fut).await
}

async fn start_server() -> (Server, String) {
    let config = Config {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        ..Config::default()
    };
    let server = with_timeout(Server::start(config)).await.unwrap();
    let url = format!("ws://{}/", server.local_addrs()[0]);
    (server, url)
}

fn cli(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    // `--url` goes right after the command name: after `--` it would be the program's.
    cmd.arg(args[0])
        .arg("--url")
        .arg(url)
        .args(&args[1..])
        .env_remove("MAP_ROUTER_URL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn run(url: &str, args: &[&str]) -> Output {
    with_timeout(cli(url, args).output()).await.unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

async fn agent_client(url: &str) -> Client {
    with_timeout(Client::connect_ws(url, ClientOptions::agent()))
        .await
        .unwrap()
}

#[tokio::test]
async fn agents_and_scopes_print_tables_and_json() {
    let (server, url) = start_server().await;
    let owner = agent_client(&url).await;
    let worker = with_timeout(owner.register(RegisterParams {
        agent_id: Some("w1".into()),
        name: Some("writer".into()),
        role: Some("worker".into()),
        ..Default::default()
    }))
    .await
    .unwrap();
    with_timeout(owner.scopes().create(ScopesCreateParams {
        scope_id: Some("team".into()),
        name: Some("The team".into()),
        ..Default::default()
    }))
    .await
    .unwrap();
    with_timeout(owner.scopes().join("team", worker.id().clone()))
        .await
        .unwrap();

    let out = run(&url, &["agents"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let mut lines = text.lines();
    assert!(lines.next().unwrap().starts_with("ID"), "{text}");
    let row = lines.next().unwrap();
    for cell in ["w1", "writer", "worker", "registered", "team"] {
        assert!(row.contains(cell), "{cell} in {row}");
    }

    let out = run(&url, &["agents", "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let agents: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(agents[0]["id"], json!("w1"));
    assert_eq!(agents[0]["scopes"], json!(["team"]));

    let out = run(&url, &["scopes"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let row = text.lines().nth(1).unwrap();
    assert!(
        row.starts_with("team") && row.contains("The team") && row.ends_with('1'),
        "{text}"
    );

    let out = run(&url, &["scopes", "--json"]).await;
    let scopes: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(scopes[0]["id"], json!("team"));
    assert_eq!(scopes[0]["members"], json!(["w1"]));
    server.shutdown().await;
}

#[tokio::test]
async fn send_prints_the_result_and_reports_map_errors() {
    let (server, url) = start_server().await;
    let owner = agent_client(&url).await;
    let target = with_timeout(owner.register(RegisterParams {
        agent_id: Some("t1".into()),
        role: Some("r".into()),
        ..Default::default()
    }))
    .await
    .unwrap();
    let mut inbox = target.messages();
    let mut registrations = with_timeout(owner.subscribe(SubscriptionFilter {
        event_types: Some(vec!["agent_registered".into()]),
        ..Default::default()
    }))
    .await
    .unwrap();

    let out = run(&url, &["send", "--to", "t1", "--payload", r#"{"x":1}"#]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["delivered"], json!(["t1"]));
    let m = with_timeout(inbox.next()).await.unwrap();
    assert_eq!(m.payload, Some(json!({"x": 1})));
    assert_eq!(m.id.as_str(), result["messageId"].as_str().unwrap());

    // Text that is not JSON is sent as a string; a group address connects as an agent.
    let out = run(
        &url,
        &["send", "--to", r#"{"role":"r"}"#, "--payload", "hello"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        with_timeout(inbox.next()).await.unwrap().payload,
        Some(json!("hello"))
    );

    // --as-agent: the message comes from a temporary agent with that name.
    let out = run(&url, &["send", "--to", "t1", "--as-agent", "courier"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let m = with_timeout(inbox.next()).await.unwrap();
    let registered = with_timeout(registrations.next()).await.unwrap();
    assert_eq!(
        registered.event.data.as_ref().unwrap()["name"],
        json!("courier")
    );
    assert_eq!(m.from, registered.event.source.unwrap());

    // MAP errors are printed clearly, with a non-zero exit code.
    let out = run(&url, &["send", "--to", "nobody"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("map/send: MAP error 2000: Address not found: nobody"),
        "{}",
        stderr(&out)
    );
    let out = run(&url, &["send", "--to", "{not json"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--to"), "{}", stderr(&out));
    server.shutdown().await;
}

#[tokio::test]
async fn commands_fail_clearly_without_a_router() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    drop(listener);
    let out = run(&url, &["agents"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("cannot connect"), "{}", stderr(&out));
}

#[tokio::test]
async fn watch_json_tails_events_until_interrupted() {
    let (server, url) = start_server().await;
    let maker = agent_client(&url).await;
    let mut child = cli(&url, &["watch", "--json", "--type", "scope_created"])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Create probe scopes until the watcher shows one: then it is surely subscribed.
    let mut probes = 0;
    let first = loop {
        assert!(probes < 100, "the watcher never printed an event");
        with_timeout(maker.scopes().create(ScopesCreateParams {
            scope_id: Some(format!("probe{probes}").into()),
            ..Default::default()
        }))
        .await
        .unwrap();
        probes += 1;
        if let Ok(line) = tokio::time::timeout(Duration::from_millis(100), lines.next_line()).await
        {
            break line.unwrap().expect("a line");
        }
    };
    let first: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["event"]["type"], json!("scope_created"));
    assert_eq!(first["sequenceNumber"], json!(1));
    for name in ["a", "b", "c"] {
        with_timeout(maker.scopes().create(ScopesCreateParams {
            scope_id: Some(name.into()),
            ..Default::default()
        }))
        .await
        .unwrap();
    }
    // Later probes may still be in flight; read until the three named scopes were seen.
    let mut seen = Vec::new();
    for _ in 0..(probes + 3) {
        let line = with_timeout(lines.next_line())
            .await
            .unwrap()
            .expect("a line");
        let v: Value = serde_json::from_str(&line).unwrap();
        let id = v["event"]["data"]["scopeId"].as_str().unwrap().to_owned();
        if !id.starts_with("probe") {
            seen.push(id);
        }
        if seen.len() == 3 {
            break;
        }
    }
    assert_eq!(seen, ["a", "b", "c"]);
    // Ctrl-C ends it cleanly.
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    let status = with_timeout(child.wait()).await.unwrap();
    assert_eq!(status.code(), Some(0));
    server.shutdown().await;
}

/// A shell-script agent: connects, registers as `shell-agent` (leaving name and role to the
/// bridge), sends a garbage line, and on its first `map/message` sends `pong` to `observer`
/// and exits 5.
const SHELL_AGENT: &str = r#"
printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"protocolVersion":1,"participantType":"agent"}}'
read -r connected
printf '%s\n' '{"jsonrpc":"2.0","id":2,"method":"map/agents/register","params":{"agentId":"shell-agent"}}'
read -r registered
echo "registered: $registered" >&2
printf '%s\n' 'this is not json'
read -r complaint
echo "router said: $complaint" >&2
while read -r line; do
  case "$line" in
    *'"map/message"'*)
      printf '%s\n' '{"jsonrpc":"2.0","id":3,"method":"map/send","params":{"to":"observer","payload":"pong"}}'
      read -r sent
      exit 5;;
  esac
done
"#;

#[tokio::test]
async fn agent_bridges_a_shell_script_agent() {
    let (server, url) = start_server().await;
    let owner = agent_client(&url).await;
    let observer = with_timeout(owner.register(RegisterParams {
        agent_id: Some("observer".into()),
        ..Default::default()
    }))
    .await
    .unwrap();
    let mut inbox = observer.messages();

    let child = cli(
        &url,
        &[
            "agent",
            "--name",
            "bob",
            "--role",
            "echo",
            "--",
            "sh",
            "-c",
            SHELL_AGENT,
        ],
    )
    .spawn()
    .unwrap();
    // Wait (bounded) for the script's agent to appear.
    let agent = within(TIMEOUT, async {
        loop {
            if let Ok(a) = owner.get_agent("shell-agent").await {
                break a;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(agent.name.as_deref(), Some("bob"), "--name filled in");
    assert_eq!(agent.role.as_deref(), Some("echo"), "--role filled in");

    with_timeout(owner.send("shell-agent", json!("ping")))
        .await
        .unwrap();
    let pong = with_timeout(inbox.next()).await.unwrap();
    assert_eq!(pong.payload, Some(json!("pong")));
    assert_eq!(pong.from, "shell-agent");

    let out = with_timeout(child.wait_with_output()).await.unwrap();
    assert_eq!(out.status.code(), Some(5), "the program's exit code");
    let err = stderr(&out);
    assert!(
        err.contains(r#"registered: {"jsonrpc":"2.0","id":2,"result""#),
        "{err}"
    );
    assert!(
        err.contains(r#""code":-32700"#),
        "the router answered the garbage: {err}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn agent_closes_the_programs_stdin_when_the_router_goes_away() {
    let (server, url) = start_server().await;
    let watcher = with_timeout(Client::connect_ws(&url, ClientOptions::new()))
        .await
        .unwrap();
    let mut connected = with_timeout(watcher.subscribe(SubscriptionFilter {
        event_types: Some(vec!["participant_connected".into()]),
        ..Default::default()
    }))
    .await
    .unwrap();
    // Connects, then reads until EOF and exits 4.
    let script = r#"printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"protocolVersion":1,"participantType":"agent"}}'; cat > /dev/null; exit 4"#;
    let child = cli(&url, &["agent", "--", "sh", "-c", script])
        .spawn()
        .unwrap();
    with_timeout(connected.next()).await.unwrap();
    drop(connected);
    watcher.close().await.unwrap();
    with_timeout(server.shutdown()).await;
    let out = with_timeout(child.wait_with_output()).await.unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("closing"), "{}", stderr(&out));
}

/// A supervised child for `spawn`: connects and registers over its stdio, then idles.
const SPAWNED: &str = r#"
printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"protocolVersion":1,"participantType":"agent"}}'
read -r connected
printf '%s\n' '{"jsonrpc":"2.0","id":2,"method":"map/agents/register","params":{}}'
read -r registered
while read -r line; do :; done
"#;

#[tokio::test]
async fn spawn_asks_the_router_to_supervise_a_program() {
    let (server, url) = start_server().await;
    let out = run(
        &url,
        &[
            "spawn",
            "--name",
            "kid",
            "--role",
            "worker",
            "--restart",
            "never",
            "--",
            "sh",
            "-c",
            SPAWNED,
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["agent"]["name"], json!("kid"));
    assert_eq!(result["agent"]["role"], json!("worker"));
    assert!(result["process"]["pid"].is_u64(), "{result}");
    // The child outlives the command's session.
    let observer = with_timeout(Client::connect_ws(&url, ClientOptions::new()))
        .await
        .unwrap();
    let id = result["agent"]["id"].as_str().unwrap();
    let agent = with_timeout(observer.get_agent(id)).await.unwrap();
    assert_eq!(agent.name.as_deref(), Some("kid"));
    // An unknown parent is a clear error.
    let out = run(&url, &["spawn", "--parent", "nope", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("map/agents/spawn: MAP error"),
        "{}",
        stderr(&out)
    );
    with_timeout(server.shutdown()).await;
}
