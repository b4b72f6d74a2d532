//! The orchestrator's whole loop in a few lines: spawn three agent *processes* under the
//! router's supervision, put them in a scope, send them work, watch their events, stop them.
//!
//! Each worker here is a tiny shell program that speaks MAP over its stdin/stdout (connect,
//! register, then report each message it gets on stderr); any program doing that works, such as
//! an SDK `AgentConnection` over `ndJsonStream`.
//!
//! ```sh
//! cargo run --release -- serve &            # a router on ws://127.0.0.1:4500/
//! cargo run --example supervise             # MAP_ROUTER_URL overrides the address
//! ```

use std::error::Error;
use std::time::Duration;

use futures::StreamExt;
use map_router::client::{Client, ClientOptions};
use map_router::protocol::event::SubscriptionFilter;
use map_router::protocol::methods::agents::{CommandSpec, RegisterParams, SpawnParams};
use map_router::protocol::methods::scopes::ScopesCreateParams;
use serde_json::json;

/// A worker: registers, then writes each message it receives to stderr, and exits when asked
/// to stop (or when the router closes its stdin).
const WORKER: &str = r#"
printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"participantType":"agent"}}'
printf '%s\n' '{"jsonrpc":"2.0","id":2,"method":"map/agents/register","params":{}}'
while IFS= read -r line; do
  case "$line" in
    *'"control":"stop"'*) exit 0 ;;
    *'"method":"map/message"'*) echo "$MAP_AGENT_NAME got work" >&2 ;;
  esac
done
"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let url = map_router::client::router_url_from_env();
    let boss = Client::connect_ws(&url, ClientOptions::agent().name("orchestrator")).await?;
    boss.register(RegisterParams {
        name: Some("orchestrator".into()),
        ..RegisterParams::default()
    })
    .await?;
    let team = boss
        .scopes()
        .create(ScopesCreateParams {
            name: Some("team".into()),
            ..ScopesCreateParams::default()
        })
        .await?;
    let mut events = boss
        .subscribe(SubscriptionFilter {
            event_types: Some(vec!["agent.stderr".into(), "agent_state_changed".into()]),
            ..SubscriptionFilter::default()
        })
        .await?;

    let mut workers = Vec::new();
    for name in ["alpha", "beta", "gamma"] {
        let spawned = boss
            .spawn(SpawnParams {
                register: RegisterParams {
                    name: Some(name.into()),
                    scopes: Some(vec![team.id.clone()]),
                    ..RegisterParams::default()
                },
                command: Some(CommandSpec {
                    program: "sh".into(),
                    args: vec!["-c".into(), WORKER.into()],
                    ..CommandSpec::default()
                }),
                ..SpawnParams::default()
            })
            .await?;
        let pid = spawned.process.map(|p| p.pid).unwrap_or_default();
        println!("spawned {name} as {} (pid {pid})", spawned.agent.id);
        workers.push(spawned.agent.id);
    }

    let sent = boss
        .send(json!({ "scope": team.id }), json!({"task": "summarize"}))
        .await?;
    println!("work sent to {} workers", sent.delivered.len());

    let mut acknowledged = 0;
    let mut stopped = 0;
    let mut stop_requested = false;
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(e) = events.next().await {
            let data = e.data();
            match e.kind() {
                "agent.stderr" => {
                    for line in data["lines"].as_array().into_iter().flatten() {
                        println!("  stderr: {}", line.as_str().unwrap_or_default());
                        acknowledged += 1;
                    }
                }
                "agent_state_changed" => {
                    println!("  {} -> {}", data["agentId"], data["newState"]);
                    if data["newState"] == "stopped" {
                        stopped += 1;
                    }
                }
                _ => {}
            }
            if acknowledged == workers.len() && !stop_requested {
                stop_requested = true;
                for id in &workers {
                    boss.stop_agent(id.clone(), Some("done"), false).await?;
                }
            }
            if stopped == workers.len() {
                break;
            }
        }
        Ok::<(), Box<dyn Error>>(())
    })
    .await
    .map_err(|_| "timed out waiting for the workers")??;
    println!("all {} workers stopped", workers.len());
    boss.close().await?;
    Ok(())
}
