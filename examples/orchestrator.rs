//! An orchestrator: create a scope, spawn two children into it, message the scope, ask the echo
//! agent (`cargo run --example agent`) a question and wait for its answer, then stop everyone.
//! Waits up to `--wait-seconds N` (default 10) for an echo agent to show up.
//!
//! ```sh
//! MAP_ROUTER_URL=ws://127.0.0.1:4500/ cargo run --example orchestrator
//! ```

use std::time::{Duration, Instant};

use futures::StreamExt;
use map_router::client::{Client, ClientError, ClientOptions};
use map_router::protocol::agent::AgentState;
use map_router::protocol::methods::agents::{AgentFilter, RegisterParams, SpawnParams};
use map_router::protocol::methods::scopes::ScopesCreateParams;
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), ClientError> {
    let url = map_router::client::router_url_from_env();
    let wait = Duration::from_secs_f64(number_arg("--wait-seconds").unwrap_or(10.0));

    // Agents may create scopes and spawn; clients may not.
    let client = Client::connect_ws(&url, ClientOptions::agent().name("orchestrator")).await?;
    let boss = client
        .register(RegisterParams {
            name: Some("orchestrator".into()),
            role: Some("lead".into()),
            ..Default::default()
        })
        .await?;
    let team = client
        .scopes()
        .create(ScopesCreateParams {
            name: Some("team".into()),
            ..Default::default()
        })
        .await?;

    let mut kids = Vec::new();
    for name in ["researcher", "writer"] {
        let spawned = boss
            .spawn(SpawnParams {
                register: RegisterParams {
                    name: Some(name.into()),
                    role: Some("worker".into()),
                    scopes: Some(vec![team.id.clone()]),
                    ..Default::default()
                },
                ..Default::default()
            })
            .await?;
        kids.push(spawned.agent);
    }
    println!(
        "spawned {} into scope {}",
        kids.iter()
            .map(|k| format!("{}={}", k.name.as_deref().unwrap_or("?"), k.id))
            .collect::<Vec<_>>()
            .join(", "),
        team.id
    );

    // Children spawned without a command belong to this connection: a message to their scope
    // arrives here, once, in the agent's inbox.
    let mut inbox = boss.messages();
    let sent = boss
        .send(
            json!({"scope": team.id}),
            json!({"task": "summarize the logs"}),
        )
        .await?;
    println!("scope message delivered to {:?}", sent.delivered);
    if let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(5), inbox.next()).await {
        println!("message for {}: {}", m.to, m.payload.unwrap_or_default());
    }

    // Ask the echo agent and wait for its reply.
    let started = Instant::now();
    let echo = loop {
        let found = client
            .list_agents(AgentFilter {
                roles: Some(vec!["echo".into()]),
                // A stopped, failed or orphaned echo agent cannot answer.
                states: Some(AgentState::LIVE.to_vec()),
                ..Default::default()
            })
            .await?;
        if let Some(a) = found.into_iter().next() {
            break a;
        }
        if started.elapsed() > wait {
            eprintln!("no echo agent within {wait:?}: start `cargo run --example agent` first");
            std::process::exit(1);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let reply = boss
        .request(
            json!({"agent": echo.id}),
            json!({"question": "ping?"}),
            Duration::from_secs(5),
        )
        .await?;
    println!("echo replied: {}", reply.payload.unwrap_or_default());

    // Stop everyone. The children are ours to stop. The echo agent belongs to another
    // session: agents may not stop agents they do not control, but clients are operators and
    // may stop any agent they see (docs/security.md), so stop it through a client connection.
    // It gets a control message and exits.
    let operator = Client::connect_ws(&url, ClientOptions::new().name("orchestrator-ops")).await?;
    for (kid, by) in kids
        .iter()
        .map(|k| (k, &client))
        .chain([(&echo, &operator)])
    {
        let stopped = by.stop_agent(kid.id.clone(), Some("done"), false).await?;
        println!(
            "{} is {}",
            kid.name.as_deref().unwrap_or("?"),
            stopped.agent.state
        );
    }
    let graph = client.structure_graph(Default::default()).await?;
    println!(
        "graph edges: {}",
        graph
            .edges
            .iter()
            .map(|e| format!("{}->{}", e.from, e.to))
            .collect::<Vec<_>>()
            .join(", ")
    );
    operator.disconnect().await?;
    client.disconnect().await?;
    Ok(())
}

/// A number after `flag` on the command line.
fn number_arg(flag: &str) -> Option<f64> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1)?.parse().ok()
}
