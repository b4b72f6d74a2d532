//! An agent that answers every message with `{"echo": <payload>}`. It exits when it is asked to
//! stop (`map/agents/stop`), after `--seconds N`, or on Ctrl-C.
//!
//! ```sh
//! MAP_ROUTER_URL=ws://127.0.0.1:4500/ cargo run --example agent -- --seconds 60
//! ```

use std::time::Duration;

use map_router::client::{Client, ClientError, ClientOptions, ControlAction, MessageExt};
use map_router::protocol::agent::AgentState;
use map_router::protocol::methods::agents::RegisterParams;
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), ClientError> {
    let url = map_router::client::router_url_from_env();
    let seconds = seconds_arg();
    let client = Client::connect_ws(&url, ClientOptions::agent().name("echo")).await?;
    let agent = client
        .register(RegisterParams {
            name: Some("echo".into()),
            role: Some("echo".into()),
            ..Default::default()
        })
        .await?;
    println!("registered as {}", agent.id());

    let (stopped_tx, mut stopped) = tokio::sync::mpsc::channel::<()>(1);
    agent.on_message(move |agent, message| {
        let stopped_tx = stopped_tx.clone();
        async move {
            if let Some(control) = message.control() {
                println!(
                    "control: {:?} ({})",
                    control.action,
                    control.reason.unwrap_or_default()
                );
                if control.action == ControlAction::Stop {
                    let _ = stopped_tx.send(()).await;
                }
                return;
            }
            if let Some(injection) = message.injection() {
                println!("injected ({}): {}", injection.delivery, injection.content);
                return;
            }
            println!(
                "from {}: {}",
                message.from,
                message.payload.clone().unwrap_or_default()
            );
            // Awaiting inside the handler is fine: the client reads on its own task.
            if let Err(e) = agent
                .reply(&message, json!({"echo": message.payload}))
                .await
            {
                eprintln!("reply failed: {e}");
            }
        }
    });

    let limit = tokio::time::sleep(seconds.unwrap_or(Duration::MAX));
    tokio::select! {
        _ = stopped.recv() => {
            agent.set_state(AgentState::STOPPED).await?;
            println!("stopped on request");
        }
        () = limit => println!("time is up"),
        _ = tokio::signal::ctrl_c() => println!("interrupted"),
    }
    client.disconnect().await?; // unregisters the agent
    Ok(())
}

/// `--seconds N` from the command line.
fn seconds_arg() -> Option<Duration> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == "--seconds")?;
    let n: f64 = args.get(i + 1)?.parse().ok()?;
    Some(Duration::from_secs_f64(n))
}
