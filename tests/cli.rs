//! The built binary's user commands against a router started in the test (127.0.0.1:0):
//! `agents`, `scopes`, `send`, `request`, `watch --json`, `agent -- <cmd>`, `spawn`, `stop`,
//! `suspend`, `resume` and `inject`; agent names, the authentication hint, and `watch` across
//! router restarts.

mod common;

use std::process::{Output, Stdio};
use std::time::Duration;

use futures::StreamExt;
use map_router::client::{AgentHandle, Client, ClientOptions, ControlAction, MessageExt};
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
        .env_remove("MAP_ROUTER_API_KEY")
        .env_remove("MAP_ROUTER_TOKEN")
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
    assert_eq!(stderr(&out), "", "delivered: nothing to warn about");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["delivered"], json!(["t1"]));
    let m = with_timeout(inbox.next()).await.unwrap();
    assert_eq!(m.payload_value(), Some(json!({"x": 1})));
    assert_eq!(m.id.as_str(), result["messageId"].as_str().unwrap());

    // Text that is not JSON is sent as a string; a group address connects as an agent.
    let out = run(
        &url,
        &["send", "--to", r#"{"role":"r"}"#, "--payload", "hello"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        with_timeout(inbox.next()).await.unwrap().payload_value(),
        Some(json!("hello"))
    );

    // --as-agent: the message comes from a temporary agent with that name.
    let out = run(&url, &["send", "--to", "t1", "--as-agent", "courier"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let m = with_timeout(inbox.next()).await.unwrap();
    let registered = with_timeout(registrations.next()).await.unwrap();
    assert_eq!(registered.data()["name"], json!("courier"));
    assert_eq!(m.from, registered.event.source.unwrap());

    // MAP errors are printed clearly, with a non-zero exit code.
    let out = run(&url, &["send", "--to", r#"{"agent":"nobody"}"#]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("map/send: MAP error 2001: Agent not found: nobody"),
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
# The answer to the garbage and the ping may come in either order (the ping is sent as soon as
# the agent is registered): wait for both, then answer the ping and exit.
complained=; pinged=
while read -r line; do
  case "$line" in
    *'"map/message"'*) pinged=1;;
    *'-32700'*) echo "router said: $line" >&2; complained=1;;
  esac
  if [ -n "$complained" ] && [ -n "$pinged" ]; then
    printf '%s\n' '{"jsonrpc":"2.0","id":3,"method":"map/send","params":{"to":"observer","payload":"pong"}}'
    read -r sent
    exit 5
  fi
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
    assert_eq!(pong.payload_value(), Some(json!("pong")));
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
    // An unknown parent is a clear error; a known one can be named.
    let out = run(&url, &["spawn", "--parent", "nope", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("map-router: --parent: no agent has the id or name `nope`"),
        "{}",
        stderr(&out)
    );
    // (A parent the CLI's session does not own is the router's to refuse: the error names the
    // agent the name resolved to.)
    let out = run(&url, &["spawn", "--parent", "kid", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("map/agents/spawn: MAP error 1003") && err.contains(id),
        "{err}"
    );
    // A spawned agent is stopped by name, from the command line.
    let out = run(&url, &["stop", "kid", "--force"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let stopped: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stopped["agent"]["id"], json!(id));
    assert_eq!(stopped["agent"]["state"], json!("stopped"));
    with_timeout(server.shutdown()).await;
}

/// Registers an agent with this id, name and role on `owner`.
async fn register(owner: &Client, id: &str, name: &str, role: &str) -> AgentHandle {
    with_timeout(owner.register(RegisterParams {
        agent_id: Some(id.into()),
        name: Some(name.into()),
        role: Some(role.into()),
        ..Default::default()
    }))
    .await
    .unwrap()
}

#[tokio::test]
async fn agents_are_named_by_id_or_unique_name() {
    let (server, url) = start_server().await;
    let owner = agent_client(&url).await;
    let writer = register(&owner, "w1", "writer", "pen").await;
    let mut writer_inbox = writer.messages();
    let _twin_a = register(&owner, "tw-a", "twin", "left").await;
    let twin_b = register(&owner, "tw-b", "twin", "right").await;
    with_timeout(owner.suspend_agent(twin_b.id().clone(), None))
        .await
        .unwrap();
    // An id beats a name: x9 is named `w1`, which is also the id of `writer`.
    let _impostor = register(&owner, "x9", "w1", "fake").await;

    // A unique name works, and so does an id.
    let out = run(&url, &["send", "--to", "writer", "--payload", "1"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["delivered"], json!(["w1"]));
    assert_eq!(
        with_timeout(writer_inbox.next())
            .await
            .unwrap()
            .payload_value(),
        Some(json!(1))
    );
    let out = run(&url, &["send", "--to", "w1", "--payload", "2"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        result["delivered"],
        json!(["w1"]),
        "the id wins over x9's name"
    );

    // An unknown name says so and lists the agents there are.
    let out = run(&url, &["send", "--to", "nobody"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("map-router: --to: no agent has the id or name `nobody`; agents: "),
        "{err}"
    );
    for listed in ["writer (w1)", "twin (tw-a)", "twin (tw-b)", "w1 (x9)"] {
        assert!(err.contains(listed), "{listed} in {err}");
    }

    // An ambiguous name lists the matches (id, role, state) and asks for an id; nothing happens.
    let out = run(&url, &["stop", "twin"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("map-router: stop: 2 agents are named `twin`; give one's id instead:"),
        "{err}"
    );
    assert!(err.contains("ID    ROLE   STATE"), "{err}");
    assert!(err.contains("tw-a  left   registered"), "{err}");
    assert!(err.contains("tw-b  right  suspended"), "{err}");
    assert_eq!(stdout(&out), "");
    let a = with_timeout(owner.get_agent("tw-a")).await.unwrap();
    assert_eq!(a.state.to_string(), "registered", "not stopped");
    // With the id it works.
    let out = run(&url, &["resume", "tw-b"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    server.shutdown().await;
}

#[tokio::test]
async fn stop_suspend_resume_and_inject_reach_the_agent() {
    let (server, url) = start_server().await;
    let owner = agent_client(&url).await;
    let worker = register(&owner, "wk", "worker-1", "worker").await;
    let mut inbox = worker.messages();
    let control =
        |m: &map_router::protocol::message::Message| m.control().expect("a control message");

    let out = run(&url, &["suspend", "worker-1", "--reason", "tea"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let agent: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(agent["id"], json!("wk"));
    assert_eq!(agent["state"], json!("suspended"));
    let m = with_timeout(inbox.next()).await.unwrap();
    assert_eq!(control(&m).action, ControlAction::Suspend);
    assert_eq!(control(&m).reason.as_deref(), Some("tea"));

    let out = run(&url, &["resume", "worker-1"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let agent: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_ne!(agent["state"], json!("suspended"));
    let now = with_timeout(owner.get_agent("wk")).await.unwrap();
    assert_eq!(json!(now.state), agent["state"]);
    let m = with_timeout(inbox.next()).await.unwrap();
    assert_eq!(control(&m).action, ControlAction::Resume);

    // JSON content, and text that is not JSON.
    let out = run(
        &url,
        &[
            "inject",
            "worker-1",
            "--content",
            r#"{"hint":"look left"}"#,
            "--delivery",
            "interrupt",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["injected"], json!(true));
    assert_eq!(result["deliveredTo"], json!(["wk"]));
    let m = with_timeout(inbox.next()).await.unwrap();
    let injected = m.injection().expect("an injection");
    assert_eq!(injected.content, json!({"hint": "look left"}));
    assert_eq!(injected.delivery, "interrupt");
    assert!(injected.interrupt);
    let out = run(&url, &["inject", "wk", "--content", "plain words"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let m = with_timeout(inbox.next()).await.unwrap();
    let injected = m.injection().expect("an injection");
    assert_eq!(injected.content, json!("plain words"));
    assert_eq!(injected.delivery, "queue");

    let out = run(&url, &["stop", "worker-1", "--reason", "done"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["stopping"], json!(true));
    assert_eq!(result["agent"]["state"], json!("stopping"));
    let m = with_timeout(inbox.next()).await.unwrap();
    assert_eq!(control(&m).action, ControlAction::Stop);
    assert_eq!(control(&m).reason.as_deref(), Some("done"));

    // --force: stopped at once.
    let other = register(&owner, "ot", "other", "worker").await;
    let out = run(&url, &["stop", "other", "--force"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["agent"]["state"], json!("stopped"), "{result}");
    drop(other);

    // Router errors are clear, with exit code 1.
    let out = run(&url, &["resume", "wk"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("map-router: map/agents/resume: MAP error"),
        "{}",
        stderr(&out)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn request_prints_the_correlated_reply() {
    let (server, url) = start_server().await;
    let owner = agent_client(&url).await;
    let echo = register(&owner, "echo-1", "echo", "echo").await;
    echo.on_message(|agent, message| async move {
        if message.control().is_some() {
            return;
        }
        agent
            .reply(&message, json!({"echo": message.payload}))
            .await
            .expect("reply sent");
    });
    // Registered, never answers.
    let _silent = register(&owner, "mute-1", "mute", "mute").await;

    let out = run(
        &url,
        &["request", "--to", "echo", "--payload", r#"{"q":1}"#],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply, json!({"echo": {"q": 1}}));

    let out = run(
        &url,
        &["request", "--to", "echo-1", "--payload", "hi", "--json"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let message: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(message["payload"], json!({"echo": "hi"}));
    assert_eq!(message["from"], json!("echo-1"));
    assert_eq!(message["meta"]["isResult"], json!(true));
    assert!(
        message["meta"]["correlationId"]
            .as_str()
            .is_some_and(|c| c.starts_with("req-")),
        "{message}"
    );

    let out = run(
        &url,
        &[
            "request",
            "--to",
            "mute",
            "--payload",
            "1",
            "--timeout-ms",
            "300",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("map-router: request: no reply within 300 ms"),
        "{}",
        stderr(&out)
    );
    server.shutdown().await;
}

/// A stdio agent for `spawn`: records its working directory and `$GREETING` in `./seen`, then
/// connects, registers and idles.
const RECORDING_AGENT: &str = r#"printf '%s %s\n' "$(pwd -P)" "$GREETING" > seen
printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"protocolVersion":1,"participantType":"agent"}}'
read -r connected
printf '%s\n' '{"jsonrpc":"2.0","id":2,"method":"map/agents/register","params":{}}'
read -r registered
while read -r line; do :; done
"#;

#[tokio::test]
async fn spawn_runs_relative_paths_from_the_callers_directory() {
    let (server, url) = start_server().await;
    let dir = common::TempDir::new("cli-spawn");
    let sub = dir.path.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    for d in [&dir.path, &sub] {
        let script = d.join("agent.sh");
        std::fs::write(&script, RECORDING_AGENT).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let seen = |d: &std::path::Path| std::fs::read_to_string(d.join("seen")).unwrap();
    let physical = |d: &std::path::Path| std::fs::canonicalize(d).unwrap().display().to_string();

    // `sh agent.sh`: the argument is found where the caller is; --env reaches the program.
    let mut cmd = cli(
        &url,
        &[
            "spawn",
            "--name",
            "rel",
            "--env",
            "GREETING=hi",
            "--",
            "sh",
            "agent.sh",
        ],
    );
    cmd.current_dir(&dir.path);
    let out = with_timeout(cmd.output()).await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["agent"]["name"], json!("rel"));
    assert_eq!(seen(&dir.path), format!("{} hi\n", physical(&dir.path)));

    // `./agent.sh` as the program, with a relative --cwd: both from the caller's directory.
    let mut cmd = cli(&url, &["spawn", "--cwd", "sub", "--", "./agent.sh"]);
    cmd.current_dir(&dir.path);
    let out = with_timeout(cmd.output()).await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(seen(&sub), format!("{} \n", physical(&sub)));

    // A bad --env is refused before anything is sent.
    let out = run(&url, &["spawn", "--env", "NOEQUALS", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(2), "clap's usage error");
    assert!(
        stderr(&out).contains("is not KEY=VALUE"),
        "{}",
        stderr(&out)
    );
    with_timeout(server.shutdown()).await;
}

#[tokio::test]
async fn authentication_errors_name_the_cli_flags() {
    let dir = common::TempDir::new("cli-auth");
    let keys = dir.path.join("api-keys");
    std::fs::write(&keys, "ak-cli-test-0123456789abcdef tester\n").unwrap();
    let mut config = Config {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        ..Config::default()
    };
    config.auth.api_keys.file = Some(keys);
    let server = with_timeout(Server::start(config)).await.unwrap();
    let url = format!("ws://{}/", server.local_addrs()[0]);

    let out = run(&url, &["agents"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "map-router: connect: the router requires authentication: pass --api-key KEY or \
         --token JWT (or set MAP_ROUTER_API_KEY / MAP_ROUTER_TOKEN)\n"
    );
    let out = run(
        &url,
        &["agents", "--api-key", "ak-cli-wrong-0123456789abcdef"],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("authentication refused (invalid_credentials)")
            && err.contains("check --api-key / --token"),
        "{err}"
    );
    let mut ok = cli(&url, &["agents"]);
    ok.env("MAP_ROUTER_API_KEY", "ak-cli-test-0123456789abcdef");
    let out = with_timeout(ok.output()).await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "no agents\n");
    server.shutdown().await;
}

#[tokio::test]
async fn send_says_when_nobody_received_the_message() {
    let (server, url) = start_server().await;
    // An agent whose connection is gone: registered (orphaned), but nobody to deliver to.
    let away = agent_client(&url).await;
    register(&away, "gone-1", "gone", "r").await;
    with_timeout(away.close()).await.unwrap();
    let observer = with_timeout(Client::connect_ws(&url, ClientOptions::new()))
        .await
        .unwrap();
    within(TIMEOUT, async {
        while with_timeout(observer.get_agent("gone-1"))
            .await
            .unwrap()
            .owner_id
            .is_some()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    // Nobody received it: exit 3 (issue 44: a script must not take it for a delivery), with
    // the result still printed. `--strict` (the old opt-in) is the same.
    let out = run(&url, &["send", "--to", "gone", "--payload", "1"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["delivered"], json!([]));
    assert_eq!(
        stderr(&out),
        "map-router: send: nobody received the message (no recipient is connected; \
         --guaranteed keeps it for an agent that is away)\n"
    );
    let out = run(&url, &["send", "--to", "gone", "--strict"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("nobody received"), "{}", stderr(&out));
    server.shutdown().await;
}

#[tokio::test]
async fn a_guaranteed_send_to_an_away_agent_is_kept_and_delivered_when_it_is_back() {
    let (server, url) = start_server().await;
    let away = agent_client(&url).await;
    register(&away, "gone-1", "gone", "r").await;
    with_timeout(away.close()).await.unwrap();
    let observer = with_timeout(Client::connect_ws(&url, ClientOptions::new()))
        .await
        .unwrap();
    within(TIMEOUT, async {
        while with_timeout(observer.get_agent("gone-1"))
            .await
            .unwrap()
            .owner_id
            .is_some()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let out = run(
        &url,
        &[
            "send",
            "--to",
            "gone",
            "--payload",
            "{\"n\":7}",
            "--guaranteed",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["delivered"], json!([]), "{result}");
    assert_eq!(result["queued"], json!(["gone-1"]), "{result}");
    assert_eq!(
        stderr(&out),
        "map-router: send: queued for gone-1 (away now; delivered when they are back)\n"
    );
    // The agent comes back (re-registering its id reclaims it): the message reaches it, once.
    let back = agent_client(&url).await;
    let handle = register(&back, "gone-1", "gone", "r").await;
    let mut messages = handle.messages();
    let m = with_timeout(messages.next())
        .await
        .expect("the kept message");
    assert_eq!(m.payload.as_ref().unwrap().get(), r#"{"n":7}"#);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), messages.next())
            .await
            .is_err(),
        "delivered once"
    );
    server.shutdown().await;
}

/// Starts `watch` with `args` and waits (bounded) until it prints: scopes `probe<n>` are created
/// until a `scope_created` line shows (it is then surely subscribed). Returns the child and its
/// stdout lines.
async fn start_watch(
    url: &str,
    maker: &Client,
    args: &[&str],
) -> (
    tokio::process::Child,
    tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) {
    let mut child = cli(url, args).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    for probe in 0..100 {
        with_timeout(maker.scopes().create(ScopesCreateParams {
            scope_id: Some(format!("probe-{tag}-{probe}").into()),
            ..Default::default()
        }))
        .await
        .unwrap();
        if let Ok(line) = tokio::time::timeout(Duration::from_millis(100), lines.next_line()).await
        {
            let line = line.unwrap().expect("a line");
            assert!(line.contains("probe-"), "{line}");
            return (child, lines);
        }
    }
    panic!("the watcher never printed an event");
}

/// Reads lines until one contains `marker`; returns those before it.
async fn lines_until(
    lines: &mut tokio::io::Lines<impl tokio::io::AsyncBufRead + Unpin>,
    marker: &str,
) -> Vec<String> {
    line_with(lines, marker).await.0
}

/// Reads lines until one contains `marker`; returns those before it, and that line.
async fn line_with(
    lines: &mut tokio::io::Lines<impl tokio::io::AsyncBufRead + Unpin>,
    marker: &str,
) -> (Vec<String>, String) {
    let mut before = Vec::new();
    for _ in 0..1000 {
        let line = with_timeout(lines.next_line())
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("ended before {marker}: {before:#?}"));
        if line.contains(marker) {
            return (before, line);
        }
        before.push(line);
    }
    panic!("no {marker} in 1000 lines");
}

fn interrupt(child: &tokio::process::Child) {
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
}

#[tokio::test]
async fn watch_hides_the_clis_own_connections_unless_asked() {
    let (server, url) = start_server().await;
    let maker = agent_client(&url).await;
    let target = register(&maker, "t1", "target", "r").await;
    let mut inbox = target.messages();
    let (mut quiet, mut quiet_lines) = start_watch(&url, &maker, &["watch", "--json"]).await;
    let (mut all, mut all_lines) = start_watch(&url, &maker, &["watch", "--json", "--all"]).await;

    let out = run(&url, &["agents"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(&url, &["send", "--to", "target", "--as-agent", "courier"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let courier = with_timeout(inbox.next()).await.unwrap().from;
    assert!(courier.starts_with("map-router-cli-"), "{courier}");
    with_timeout(maker.scopes().create(ScopesCreateParams {
        scope_id: Some("marker".into()),
        ..Default::default()
    }))
    .await
    .unwrap();

    let kinds = |lines: &[String]| -> Vec<(String, Value)> {
        lines
            .iter()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                (
                    v["event"]["type"].as_str().unwrap().to_owned(),
                    v["event"]["data"].clone(),
                )
            })
            .collect()
    };
    let shown = kinds(&lines_until(&mut quiet_lines, "marker").await);
    for (kind, data) in &shown {
        assert!(
            !kind.starts_with("participant_") && !kind.starts_with("agent"),
            "hidden: {kind} {data}"
        );
    }
    assert!(
        shown
            .iter()
            .any(|(k, d)| k == "message_sent" && d["from"] == json!(courier)),
        "what the CLI does is shown: {shown:?}"
    );
    let everything = kinds(&lines_until(&mut all_lines, "marker").await);
    let cli_connections = everything
        .iter()
        .filter(|(k, d)| k == "participant_connected" && d["name"] == json!("map-router-cli"))
        .count();
    assert_eq!(cli_connections, 2, "agents and send: {everything:?}");
    assert!(
        everything
            .iter()
            .any(|(k, d)| k == "participant_disconnected"
                && d["participantId"]
                    .as_str()
                    .unwrap()
                    .starts_with("map-router-cli-")),
        "{everything:?}"
    );
    assert!(
        everything
            .iter()
            .any(|(k, d)| k == "agent_registered" && d["agentId"] == json!(courier)),
        "{everything:?}"
    );
    for child in [&quiet, &all] {
        interrupt(child);
    }
    assert_eq!(with_timeout(quiet.wait()).await.unwrap().code(), Some(0));
    assert_eq!(with_timeout(all.wait()).await.unwrap().code(), Some(0));
    server.shutdown().await;
}

/// Starts a server on `addr` (retrying briefly while the old listener's port is released).
async fn start_server_on(addr: std::net::SocketAddr) -> Server {
    for _ in 0..50 {
        let config = Config {
            listen: vec![addr],
            ..Config::default()
        };
        match with_timeout(Server::start(config)).await {
            Ok(server) => return server,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("cannot listen on {addr} again");
}

#[tokio::test]
async fn watch_reports_losing_and_regaining_the_router() {
    let (server, url) = start_server().await;
    let addr = server.local_addrs()[0];
    let maker = agent_client(&url).await;
    let (mut watch, mut out_lines) = start_watch(
        &url,
        &maker,
        &["watch", "--json", "--type", "scope_created"],
    )
    .await;
    let mut err_lines = BufReader::new(watch.stderr.take().unwrap()).lines();
    drop(maker);
    with_timeout(server.shutdown()).await;
    let (before, lost) = line_with(&mut err_lines, "map-router: watch: connection lost (").await;
    assert!(before.is_empty(), "{before:?}");
    assert!(lost.ends_with("); reconnecting…"), "{lost}");

    // A new router on the same port: the watcher finds it.
    let server = start_server_on(addr).await;
    let (before, back) = line_with(&mut err_lines, "map-router: watch: reconnected after ").await;
    assert!(before.is_empty(), "{before:?}");
    // The new router did not know the session.
    assert!(
        back.ends_with("(new session: the router restarted or had forgotten this one); resuming after the last event shown"),
        "{back}"
    );
    let maker = agent_client(&url).await;
    with_timeout(maker.scopes().create(ScopesCreateParams {
        scope_id: Some("back".into()),
        ..Default::default()
    }))
    .await
    .unwrap();
    lines_until(&mut out_lines, "\"back\"").await;
    let before = lines_until(&mut err_lines, "map-router: watch: no events missed").await;
    assert!(before.is_empty(), "{before:?}");
    interrupt(&watch);
    assert_eq!(with_timeout(watch.wait()).await.unwrap().code(), Some(0));
    server.shutdown().await;
}

#[tokio::test]
async fn watch_gives_up_clearly() {
    let (server, url) = start_server().await;
    let maker = agent_client(&url).await;
    let (watch, _lines) = start_watch(
        &url,
        &maker,
        &[
            "watch",
            "--reconnect-attempts",
            "2",
            "--type",
            "scope_created",
        ],
    )
    .await;
    drop(maker);
    with_timeout(server.shutdown()).await;
    let out = with_timeout(watch.wait_with_output()).await.unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with("map-router: watch: connection lost ("),
        "{err}"
    );
    assert!(
        err.contains("map-router: watch: gave up reconnecting after 2 attempts ("),
        "{err}"
    );
    assert_eq!(err.lines().count(), 2, "nothing else: {err}");
}
