//! `map-router send` (fire and report who got it) and `map-router request` (send and wait for
//! the correlated reply).
//!
//! `--to` is an agent name or id (see `resolve`), or a MAP address as JSON or prefixed text.
//! A group address (scope, role, broadcast, ...) needs `messaging.canBroadcast`, so those
//! connect as participant type `agent`; so does `send --as-agent`, which registers a temporary
//! agent (id `map-router-cli-<random>`, the given name) for the duration of the send.
//! `send --guaranteed` sends with `meta.delivery: "guaranteed"`: an agent that is away gets it
//! when it is back (`queued` in the result). When nobody received the message (`delivered` and
//! `queued` empty) `send` exits [`EXIT_NOT_RECEIVED`].

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use crate::cli::common::address_is_group;
use crate::cli::common::cli_id;
use crate::cli::common::connect;
use crate::cli::common::fail;
use crate::cli::common::json_or_string;
use crate::cli::common::leave;
use crate::cli::common::one_shot;
use crate::cli::common::pretty;
use crate::cli::common::print_line;
use crate::cli::common::Failure;
use crate::cli::common::UrlArgs;
use crate::cli::resolve::To;
use crate::client::{ClientError, ClientOptions};
use crate::protocol::methods::agents::RegisterParams;
use crate::protocol::methods::messaging::{SendParams, SendResult};

/// Exit code of `send` when nobody received the message and nobody will (1 is an error, 2 a
/// usage error).
pub const EXIT_NOT_RECEIVED: u8 = 3;

/// `map-router send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// Recipient: an agent's id or unique name, or any MAP address as JSON
    /// (`{"scope":"team"}`, `{"role":"worker"}`, `{"broadcast":true}`) or prefixed text
    /// (`scope:team`, `agent:<id>`).
    #[arg(long, value_name = "AGENT|ADDRESS")]
    to: String,
    /// The payload as JSON (text that is not JSON is sent as a string).
    #[arg(long, value_name = "JSON")]
    payload: Option<String>,
    /// Register an agent with this name for the duration of the send, so the message comes
    /// from it.
    #[arg(long, value_name = "NAME")]
    as_agent: Option<String>,
    /// Send with `meta.delivery: "guaranteed"`: an agent that is away (its connection lost,
    /// within the resume window) gets the message when it is back.
    #[arg(long)]
    guaranteed: bool,
    /// Accepted for scripts written before it became the default: `send` exits 3 whenever
    /// nobody received the message.
    #[arg(long, hide = true)]
    strict: bool,
}

/// `map-router request`.
#[derive(Debug, Args)]
pub struct RequestArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// Recipient: an agent's id or unique name, or a MAP address (as for `send`); the first
    /// reply counts.
    #[arg(long, value_name = "AGENT|ADDRESS")]
    to: String,
    /// The payload as JSON (text that is not JSON is sent as a string; none sends `null`).
    #[arg(long, value_name = "JSON")]
    payload: Option<String>,
    /// How long to wait for the reply.
    #[arg(long, value_name = "N", default_value_t = 30_000)]
    timeout_ms: u64,
    /// Print the whole reply message as JSON, not just its payload.
    #[arg(long)]
    json: bool,
}

/// The participant type a message to `to` needs.
fn options_for(to: &To, temporary_agent: bool) -> ClientOptions {
    let group = matches!(to, To::Address(v) if address_is_group(v));
    if group || temporary_agent {
        ClientOptions::agent()
    } else {
        ClientOptions::new()
    }
}

pub(super) async fn send(args: SendArgs) -> Result<ExitCode, Failure> {
    let to = To::parse(&args.to)?;
    let payload = args.payload.as_deref().map(json_or_string);
    let options = options_for(&to, args.as_agent.is_some());
    let client = connect(&args.url, one_shot(options)).await?;
    let result = async {
        let to = to.address(&client, "--to").await?;
        if let Some(name) = &args.as_agent {
            client
                .register(RegisterParams {
                    agent_id: Some(cli_id().into()),
                    name: Some(name.clone()),
                    ..RegisterParams::default()
                })
                .await
                .map_err(fail("map/agents/register"))?;
        }
        client
            .send_with(SendParams {
                to: to.into(),
                payload: payload.map(Into::into),
                meta: args
                    .guaranteed
                    .then(|| serde_json::json!({"delivery": "guaranteed"}).into()),
            })
            .await
            .map_err(fail("map/send"))
    }
    .await;
    // The temporary agent goes with the session.
    leave(&client).await;
    let result = result?;
    print_line(&serde_json::to_string(&result).unwrap_or_default());
    let _ = args.strict;
    Ok(report(&result))
}

/// Says on stderr when nobody got the message (exit 3), or some will get it later.
fn report(result: &SendResult) -> ExitCode {
    if !result.queued.is_empty() {
        eprintln!(
            "map-router: send: queued for {} (away now; delivered when they are back)",
            result.queued.join(", ")
        );
    }
    if result.delivered.is_empty() && result.queued.is_empty() {
        eprintln!(
            "map-router: send: nobody received the message (no recipient is connected; \
             --guaranteed keeps it for an agent that is away)"
        );
        return ExitCode::from(EXIT_NOT_RECEIVED);
    }
    ExitCode::SUCCESS
}

pub(super) async fn request(args: RequestArgs) -> Result<ExitCode, Failure> {
    let to = To::parse(&args.to)?;
    let payload = args
        .payload
        .as_deref()
        .map(json_or_string)
        .unwrap_or(Value::Null);
    let wait = Duration::from_millis(args.timeout_ms);
    let client = connect(&args.url, one_shot(options_for(&to, false))).await?;
    let reply = async {
        let to = to.address(&client, "--to").await?;
        client
            .request(to, payload, wait)
            .await
            .map_err(|e| match e {
                ClientError::Timeout(_) => Failure::new(
                    "request",
                    format!(
                        "no reply within {} ms (is the agent running, and does it reply to \
                         requests?)",
                        args.timeout_ms
                    ),
                ),
                e => fail("map/send")(e),
            })
    }
    .await;
    leave(&client).await;
    let reply = reply?;
    if args.json {
        print_line(&pretty(&reply));
    } else {
        // The payload exactly as the agent wrote it.
        print_line(reply.payload.as_ref().map_or("null", |p| p.get()));
    }
    Ok(ExitCode::SUCCESS)
}
