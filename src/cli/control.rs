//! Operating on one agent: `stop`, `suspend`, `resume` (`map/agents/stop|suspend|resume`) and
//! `inject` (`map/inject`).
//!
//! Each takes the agent by name or id (see `resolve`), connects as participant type `client`
//! (clients hold `lifecycle.canStop` / `canSteer` and, by default, act as operators on every
//! agent they can see; an `agent` participant could only act on agents it controls), prints the
//! router's result as JSON and exits 0, or prints the error and exits 1.

use std::process::ExitCode;

use clap::Args;

use crate::cli::common::connect;
use crate::cli::common::fail;
use crate::cli::common::json_or_string;
use crate::cli::common::leave;
use crate::cli::common::one_shot;
use crate::cli::common::pretty;
use crate::cli::common::print_line;
use crate::cli::common::Failure;
use crate::cli::common::UrlArgs;
use crate::cli::resolve;
use crate::client::{Client, ClientError, ClientOptions};
use crate::protocol::ids::AgentId;
use crate::protocol::methods::steering::InjectDelivery;

/// `map-router resume`: just the agent.
#[derive(Debug, Args)]
pub struct AgentRef {
    #[command(flatten)]
    url: UrlArgs,
    /// The agent: its id, or its name when no other agent has it.
    #[arg(value_name = "AGENT")]
    agent: String,
}

/// `map-router stop`.
#[derive(Debug, Args)]
pub struct StopArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// The agent: its id, or its name when no other agent has it.
    #[arg(value_name = "AGENT")]
    agent: String,
    /// Why (sent in the control message and the state-change event).
    #[arg(long, value_name = "R")]
    reason: Option<String>,
    /// Stop and unregister it at once instead of asking it to stop (a supervised process is
    /// terminated).
    #[arg(long)]
    force: bool,
}

/// `map-router suspend`.
#[derive(Debug, Args)]
pub struct SuspendArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// The agent: its id, or its name when no other agent has it.
    #[arg(value_name = "AGENT")]
    agent: String,
    /// Why (sent in the control message).
    #[arg(long, value_name = "R")]
    reason: Option<String>,
}

/// `map-router inject`.
#[derive(Debug, Args)]
pub struct InjectArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// The agent: its id, or its name when no other agent has it.
    #[arg(value_name = "AGENT")]
    agent: String,
    /// What to inject, as JSON (text that is not JSON is injected as a string).
    #[arg(long, value_name = "JSON|TEXT")]
    content: String,
    /// How it is delivered (docs/steering.md).
    #[arg(long, value_enum, default_value_t = Delivery::Queue)]
    delivery: Delivery,
}

/// `--delivery` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Delivery {
    /// In order, behind messages already queued for the agent.
    Queue,
    /// Ahead of queued messages, marked urgent.
    Steer,
    /// Like steer, and flagged so the agent abandons its current step.
    Interrupt,
    /// Only if the agent's connection can take it now; otherwise not injected.
    BestEffort,
}

impl From<Delivery> for InjectDelivery {
    fn from(d: Delivery) -> Self {
        match d {
            Delivery::Queue => InjectDelivery::Queue,
            Delivery::Steer => InjectDelivery::Steer,
            Delivery::Interrupt => InjectDelivery::Interrupt,
            Delivery::BestEffort => InjectDelivery::BestEffort,
        }
    }
}

/// Connects as a client, resolves the agent, runs `op`, leaves, and prints the result.
async fn on_agent<T, F, Fut>(
    url: &UrlArgs,
    command: &str,
    method: &str,
    agent: &str,
    op: F,
) -> Result<T, Failure>
where
    T: serde::Serialize,
    F: FnOnce(Client, AgentId) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let client = connect(url, one_shot(ClientOptions::new())).await?;
    let result = async {
        let id = resolve::agent(&client, command, agent).await?;
        op(client.clone(), id).await.map_err(fail(method))
    }
    .await;
    leave(&client).await;
    let result = result?;
    print_line(&pretty(&result));
    Ok(result)
}

pub(super) async fn stop(args: StopArgs) -> Result<ExitCode, Failure> {
    let StopArgs {
        url,
        agent,
        reason,
        force,
    } = args;
    on_agent(
        &url,
        "stop",
        "map/agents/stop",
        &agent,
        |c, id| async move { c.stop_agent(id, reason.as_deref(), force).await },
    )
    .await?;
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn suspend(args: SuspendArgs) -> Result<ExitCode, Failure> {
    let SuspendArgs { url, agent, reason } = args;
    on_agent(
        &url,
        "suspend",
        "map/agents/suspend",
        &agent,
        |c, id| async move { c.suspend_agent(id, reason.as_deref()).await },
    )
    .await?;
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn resume(args: AgentRef) -> Result<ExitCode, Failure> {
    on_agent(
        &args.url,
        "resume",
        "map/agents/resume",
        &args.agent,
        |c, id| async move { c.resume_agent(id).await },
    )
    .await?;
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn inject(args: InjectArgs) -> Result<ExitCode, Failure> {
    let content = json_or_string(&args.content);
    let delivery = args.delivery.into();
    let result = on_agent(
        &args.url,
        "inject",
        "map/inject",
        &args.agent,
        |c, id| async move { c.inject(id, content, delivery).await },
    )
    .await?;
    if !result.injected {
        eprintln!(
            "map-router: inject: not injected (the agent has no live connection or its queue \
             is full; with best-effort: it could not take it right now)"
        );
    }
    Ok(ExitCode::SUCCESS)
}
