//! The router embedded in a program: a `Server` with no listeners, and clients connected to it
//! in-process (no sockets). An echo agent answers a question while a dashboard watches, then
//! everything shuts down.
//!
//! ```sh
//! cargo run --example embedded
//! ```

use std::time::Duration;

use futures::StreamExt;
use map_router::client::{Client, ClientOptions};
use map_router::protocol::event::SubscriptionFilter;
use map_router::protocol::methods::agents::RegisterParams;
use map_router::server::{Config, Server};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = Server::start(Config {
        listen: Vec::new(), // no sockets at all
        ..Config::default()
    })
    .await?;

    let dashboard = Client::in_process(&server, ClientOptions::new().name("dashboard")).await?;
    let mut events = dashboard
        .subscribe(SubscriptionFilter {
            event_types: Some(vec!["agent.*".into(), "message.*".into()]),
            ..Default::default()
        })
        .await?;

    let worker = Client::in_process(&server, ClientOptions::agent().name("echo")).await?;
    let echo = worker
        .register(RegisterParams {
            name: Some("echo".into()),
            role: Some("echo".into()),
            ..Default::default()
        })
        .await?;
    echo.on_message(|agent, message| async move {
        let _ = agent
            .reply(&message, json!({"echo": message.payload}))
            .await;
    });

    let reply = dashboard
        .request(
            echo.id().to_string(),
            json!("hello"),
            Duration::from_secs(5),
        )
        .await?;
    println!("reply: {}", reply.payload.unwrap_or_default());

    // agent_registered, message_sent + delivered (request), message_sent + delivered (reply).
    for _ in 0..5 {
        match tokio::time::timeout(Duration::from_secs(5), events.next()).await {
            Ok(Some(e)) => println!("event #{}: {}", e.sequence_number, e.kind()),
            _ => return Err("an expected event did not arrive".into()),
        }
    }

    worker.disconnect().await?;
    dashboard.disconnect().await?;
    server.shutdown().await;
    println!("done");
    Ok(())
}
