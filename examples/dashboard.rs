//! A dashboard: list the agents, then print every event this client may see, for `--seconds N`
//! (or until Ctrl-C).
//!
//! ```sh
//! MAP_ROUTER_URL=ws://127.0.0.1:4500/ cargo run --example dashboard -- --seconds 10
//! ```

use std::time::Duration;

use futures::StreamExt;
use map_router::client::{Client, ClientError, ClientOptions};
use map_router::protocol::event::SubscriptionFilter;

#[tokio::main]
async fn main() -> Result<(), ClientError> {
    let url = map_router::client::router_url_from_env();
    let seconds = seconds_arg();
    let client = Client::connect_ws(&url, ClientOptions::new().name("dashboard")).await?;

    let agents = client.list_agents(Default::default()).await?;
    println!("{} agents", agents.len());
    for a in &agents {
        println!(
            "  {} {} ({})",
            a.id,
            a.name.as_deref().unwrap_or("-"),
            a.state
        );
    }

    // No filter: every event. Narrow it with e.g. `event_types: Some(vec!["agent.*".into()])`.
    let mut events = client.subscribe(SubscriptionFilter::default()).await?;
    let stop = tokio::time::sleep(seconds.unwrap_or(Duration::MAX));
    tokio::pin!(stop);
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(e) => println!(
                    "#{} {} from {}: {}",
                    e.sequence_number,
                    e.kind(),
                    e.event.source.as_deref().unwrap_or("-"),
                    e.event.data.as_ref().map(|d| d.to_string()).unwrap_or_default()
                ),
                None => break,
            },
            () = &mut stop => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    client.disconnect().await?;
    Ok(())
}

/// `--seconds N` from the command line.
fn seconds_arg() -> Option<Duration> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == "--seconds")?;
    let n: f64 = args.get(i + 1)?.parse().ok()?;
    Some(Duration::from_secs_f64(n))
}
