//! The `map-router` user commands, built on [`crate::client`]: `agent` (bridge a program's
//! stdio to the router), `watch` (tail events), `send`, `agents`, `scopes` and `spawn`.
//!
//! Every command takes `--url` (env `MAP_ROUTER_URL`, default `ws://127.0.0.1:4500/`; `wss://`
//! for a router serving TLS, and `http(s)://` is taken as `ws(s)://`) and `--ca-file` (env
//! `MAP_ROUTER_CA_FILE`: a PEM CA to trust besides the system's roots). Commands
//! that need agent rights (`spawn`, `send` to a group) connect as participant type `agent`
//! without registering an agent; the others connect as `client`. Output goes to stdout; errors
//! go to stderr as `map-router: <what>: <MAP error>` with exit code 1.

mod bridge;
mod format;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use futures::StreamExt;
use serde_json::Value;

use crate::client::{Client, ClientError, ClientOptions, ReconnectPolicy};
use crate::protocol::event::SubscriptionFilter;
use crate::protocol::message::Address;
use crate::protocol::methods::agents::{
    CommandSpec, RegisterParams, RestartMode, RestartPolicy, SpawnParams,
};
use crate::protocol::methods::session::{AgentBehavior, DisconnectParams, DisconnectPolicy};

/// Default router URL of the user commands.
pub const DEFAULT_URL: &str = "ws://127.0.0.1:4500/";

/// The user commands (flattened into `map-router`'s subcommands).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a program as a MAP agent: its stdin/stdout speak MAP as NDJSON (one JSON-RPC
    /// message per line) and are bridged to the router over one WebSocket. Exits with the
    /// program's exit code.
    Agent(AgentArgs),
    /// Tail events: one line per event (UTC time, type, source, data), or JSON lines.
    Watch(WatchArgs),
    /// Send a message and print the result (`{messageId, delivered}`).
    Send(SendArgs),
    /// List agents.
    Agents(ListArgs),
    /// List scopes.
    Scopes(ListArgs),
    /// Ask the router to launch and supervise a program as a child agent.
    Spawn(SpawnArgs),
}

/// Where the router is, and the credentials it wants (when authentication is on).
#[derive(Debug, Clone, Args)]
pub struct UrlArgs {
    /// The router's URL: ws://HOST:PORT/, or wss://HOST:PORT/ when it serves TLS (http:// and
    /// https:// are taken as ws:// and wss://).
    #[arg(long, env = "MAP_ROUTER_URL", default_value = DEFAULT_URL)]
    pub url: String,
    /// A CA certificate (PEM) to trust for a wss:// router, besides the system's root
    /// certificates: the CA that signed the router's certificate (or that certificate itself
    /// when it is self-signed).
    #[arg(long, env = "MAP_ROUTER_CA_FILE", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// A JWT to authenticate with (`bearer`). Prefer the environment variable: a flag is
    /// visible to every user in `ps`.
    #[arg(
        long,
        env = "MAP_ROUTER_TOKEN",
        hide_env_values = true,
        conflicts_with = "api_key"
    )]
    pub token: Option<String>,
    /// An API key to authenticate with (`api-key`). Prefer the environment variable.
    #[arg(long, env = "MAP_ROUTER_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

impl UrlArgs {
    /// The `auth` object of `map/connect`, if credentials were given.
    pub fn credentials(&self) -> Option<crate::protocol::methods::session::AuthCredentials> {
        let (method, credential) = match (&self.token, &self.api_key) {
            (Some(t), _) => ("bearer", t),
            (None, Some(k)) => ("api-key", k),
            (None, None) => return None,
        };
        Some(crate::protocol::methods::session::AuthCredentials {
            method: method.into(),
            credential: Some(credential.clone()),
            token: None,
            metadata: None,
        })
    }
}

/// `map-router agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// Agent name: exported as MAP_AGENT_NAME and filled into `map/connect` and
    /// `map/agents/register` when the program leaves `name` out.
    #[arg(long)]
    name: Option<String>,
    /// Agent role: exported as MAP_AGENT_ROLE and filled into `map/agents/register` when the
    /// program leaves `role` out.
    #[arg(long)]
    role: Option<String>,
    /// The program and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// `map-router watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// A full subscription filter as JSON (e.g. `{"eventTypes":["agent.*"]}`); the flags below
    /// add to it.
    #[arg(long, value_name = "JSON")]
    filter: Option<String>,
    /// Only these event types (repeatable; either spelling, `prefix.*` and `*` work).
    #[arg(long = "type", value_name = "TYPE")]
    types: Vec<String>,
    /// Only events caused by these agents (repeatable).
    #[arg(long = "agent", value_name = "AGENT")]
    agents: Vec<String>,
    /// Only events in these scopes or their descendants (repeatable).
    #[arg(long = "scope", value_name = "SCOPE")]
    scopes: Vec<String>,
    /// Print each event's `map/event` params as one JSON line.
    #[arg(long)]
    json: bool,
}

/// `map-router send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// Recipient: an agent id, or any MAP address as JSON (`{"scope":"team"}`,
    /// `{"role":"worker"}`, `{"broadcast":true}`).
    #[arg(long, value_name = "ADDRESS")]
    to: String,
    /// The payload as JSON (text that is not JSON is sent as a string).
    #[arg(long, value_name = "JSON")]
    payload: Option<String>,
    /// Register an agent with this name for the duration of the send, so the message comes
    /// from it.
    #[arg(long, value_name = "NAME")]
    as_agent: Option<String>,
}

/// `map-router agents` and `map-router scopes`.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// `map-router spawn`.
#[derive(Debug, Args)]
pub struct SpawnArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// Parent agent id.
    #[arg(long)]
    parent: Option<String>,
    /// Agent name.
    #[arg(long)]
    name: Option<String>,
    /// Agent role.
    #[arg(long)]
    role: Option<String>,
    /// Scopes to join (repeatable).
    #[arg(long = "scope", value_name = "SCOPE")]
    scopes: Vec<String>,
    /// When the router restarts the program after it exits.
    #[arg(long, value_enum, default_value_t = Restart::Never)]
    restart: Restart,
    /// The program and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// `--restart` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Restart {
    /// Never restart.
    Never,
    /// Restart after a non-zero exit or a signal.
    OnFailure,
    /// Restart after any exit that was not requested.
    Always,
}

impl From<Restart> for RestartMode {
    fn from(r: Restart) -> Self {
        match r {
            Restart::Never => RestartMode::Never,
            Restart::OnFailure => RestartMode::OnFailure,
            Restart::Always => RestartMode::Always,
        }
    }
}

/// A failed command: what was being done, and why.
#[derive(Debug)]
struct Failure {
    what: String,
    error: String,
}

fn fail(what: impl Into<String>) -> impl FnOnce(ClientError) -> Failure {
    let what = what.into();
    move |e| Failure {
        what,
        error: e.to_string(),
    }
}

/// The multi-threaded runtime every command runs on; prints why when it cannot start.
///
/// # Errors
/// The exit code to return when the runtime cannot be built.
pub fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("map-router: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        })
}

/// Runs a user command to completion on its own runtime.
pub fn run(command: Command) -> ExitCode {
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = runtime.block_on(async move {
        match command {
            Command::Agent(args) => bridge::run(args).await,
            Command::Watch(args) => watch(args).await,
            Command::Send(args) => send(args).await,
            Command::Agents(args) => agents(args).await,
            Command::Scopes(args) => scopes(args).await,
            Command::Spawn(args) => spawn(args).await,
        }
    });
    // Nothing may linger on a blocking thread (a stdin read) and delay the exit.
    runtime.shutdown_background();
    match result {
        Ok(code) => code,
        Err(f) => {
            eprintln!("map-router: {}: {}", f.what, f.error);
            ExitCode::FAILURE
        }
    }
}

async fn connect(url: &UrlArgs, options: ClientOptions) -> Result<Client, Failure> {
    let options = match url.credentials() {
        Some(c) => options.auth(c),
        None => options,
    };
    let options = match &url.ca_file {
        Some(path) => options.ca_file(path),
        None => options,
    };
    Client::connect_ws(&url.url, options.name("map-router-cli"))
        .await
        .map_err(connect_failure)
}

/// A failed connection, with the CLI's remedy when the router's certificate is not trusted.
fn connect_failure(e: ClientError) -> Failure {
    match e {
        ClientError::UntrustedCertificate { url, reason } => Failure {
            what: format!("cannot connect to {url}"),
            error: format!(
                "TLS certificate not trusted ({reason}); pass the router's CA with --ca-file \
                 or MAP_ROUTER_CA_FILE"
            ),
        },
        e => fail("connect")(e),
    }
}

/// One-shot commands do not reconnect: they fail fast.
fn one_shot(options: ClientOptions) -> ClientOptions {
    options.reconnect(ReconnectPolicy::disabled())
}

/// Whether `to` reaches a group (which needs `messaging.canBroadcast`, i.e. an `agent`
/// participant).
fn address_is_group(to: &Value) -> bool {
    match Address::parse(to) {
        Ok(Address::Text(s)) => s.starts_with("scope:"),
        Ok(a) => a.is_multicast(),
        Err(_) => false,
    }
}

/// Parses JSON, or keeps the text as a JSON string when it is not JSON.
fn json_or_string(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// Writes one line to stdout; `false` when stdout is gone (a closed pipe ends the command).
fn print_line(line: &str) -> bool {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
}

fn pretty(v: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("<unprintable: {e}>"))
}

// ---------------------------------------------------------------------------------------------
// watch
// ---------------------------------------------------------------------------------------------

fn watch_filter(args: &WatchArgs) -> Result<SubscriptionFilter, Failure> {
    let mut filter: SubscriptionFilter = match &args.filter {
        Some(text) => serde_json::from_str(text).map_err(|e| Failure {
            what: "--filter".into(),
            error: format!("not a subscription filter: {e}"),
        })?,
        None => SubscriptionFilter::default(),
    };
    let add = |list: &mut Option<Vec<String>>, more: &[String]| {
        if !more.is_empty() {
            list.get_or_insert_with(Vec::new)
                .extend(more.iter().cloned());
        }
    };
    add(&mut filter.event_types, &args.types);
    add(&mut filter.from_agents, &args.agents);
    add(&mut filter.scopes, &args.scopes);
    Ok(filter)
}

async fn watch(args: WatchArgs) -> Result<ExitCode, Failure> {
    let filter = watch_filter(&args)?;
    // A watcher outlives router restarts for a while: it keeps reconnecting.
    let client = connect(
        &args.url,
        ClientOptions::new().reconnect(ReconnectPolicy::default().max_attempts(30)),
    )
    .await?;
    let mut events = client
        .subscribe(filter)
        .await
        .map_err(fail("map/subscribe"))?;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        tokio::select! {
            _ = &mut interrupted => break,
            next = events.next() => {
                let Some(event) = next else {
                    return match events.error() {
                        Some(e) => Err(fail("the event stream ended")(e)),
                        None => Ok(ExitCode::SUCCESS),
                    };
                };
                let line = if args.json {
                    serde_json::to_string(&event).unwrap_or_default()
                } else {
                    format::event_line(&event)
                };
                if !print_line(&line) {
                    break;
                }
            }
        }
    }
    let _ = client.close().await;
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------------------------
// send
// ---------------------------------------------------------------------------------------------

async fn send(args: SendArgs) -> Result<ExitCode, Failure> {
    let to = if args.to.trim_start().starts_with(['{', '[']) {
        serde_json::from_str::<Value>(&args.to).map_err(|e| Failure {
            what: "--to".into(),
            error: format!("not valid JSON: {e}"),
        })?
    } else {
        Value::String(args.to.clone())
    };
    let payload = args.payload.as_deref().map(json_or_string);
    let needs_agent = args.as_agent.is_some() || address_is_group(&to);
    let options = if needs_agent {
        ClientOptions::agent()
    } else {
        ClientOptions::new()
    };
    let client = connect(&args.url, one_shot(options)).await?;
    if let Some(name) = &args.as_agent {
        client
            .register(RegisterParams {
                name: Some(name.clone()),
                ..RegisterParams::default()
            })
            .await
            .map_err(fail("map/agents/register"))?;
    }
    let result = client
        .send_with(crate::protocol::methods::messaging::SendParams {
            to,
            payload,
            meta: None,
        })
        .await
        .map_err(fail("map/send"));
    // The temporary agent goes with the session.
    let _ = client.disconnect().await;
    let result = result?;
    print_line(&serde_json::to_string(&result).unwrap_or_default());
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------------------------
// agents, scopes
// ---------------------------------------------------------------------------------------------

async fn agents(args: ListArgs) -> Result<ExitCode, Failure> {
    let client = connect(&args.url, one_shot(ClientOptions::new())).await?;
    let agents = client
        .list_agents(Default::default())
        .await
        .map_err(fail("map/agents/list"));
    let _ = client.disconnect().await;
    let agents = agents?;
    if args.json {
        print_line(&pretty(&agents));
    } else if agents.is_empty() {
        print_line("no agents");
    } else {
        print_line(format::agents_table(&agents).trim_end());
    }
    Ok(ExitCode::SUCCESS)
}

async fn scopes(args: ListArgs) -> Result<ExitCode, Failure> {
    let client = connect(&args.url, one_shot(ClientOptions::new())).await?;
    let listed = async {
        let scopes = client.scopes().list().await?;
        let mut rows = Vec::with_capacity(scopes.len());
        for scope in scopes {
            let members = client.scopes().members(scope.id.clone()).await?;
            rows.push((scope, members));
        }
        Ok::<_, ClientError>(rows)
    }
    .await
    .map_err(fail("map/scopes/list"));
    let _ = client.disconnect().await;
    let rows = listed?;
    if args.json {
        let json: Vec<Value> = rows
            .iter()
            .map(|(scope, members)| {
                let mut v = serde_json::to_value(scope).unwrap_or(Value::Null);
                if let Some(o) = v.as_object_mut() {
                    o.insert("members".into(), serde_json::json!(members));
                }
                v
            })
            .collect();
        print_line(&pretty(&json));
    } else if rows.is_empty() {
        print_line("no scopes");
    } else {
        print_line(format::scopes_table(&rows).trim_end());
    }
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------------------------
// spawn
// ---------------------------------------------------------------------------------------------

async fn spawn(args: SpawnArgs) -> Result<ExitCode, Failure> {
    let mut command = args.command.into_iter();
    let program = command.next().unwrap_or_default();
    let params = SpawnParams {
        register: RegisterParams {
            name: args.name,
            role: args.role,
            parent: args.parent.map(Into::into),
            scopes: (!args.scopes.is_empty())
                .then(|| args.scopes.into_iter().map(Into::into).collect()),
            ..RegisterParams::default()
        },
        command: Some(CommandSpec {
            program,
            args: command.collect(),
            restart: Some(RestartPolicy {
                mode: args.restart.into(),
                ..RestartPolicy::default()
            }),
            ..CommandSpec::default()
        }),
        ..SpawnParams::default()
    };
    let client = connect(&args.url, one_shot(ClientOptions::agent())).await?;
    let result = client.spawn(params).await.map_err(fail("map/agents/spawn"));
    // Leave without taking anything down with this session.
    let _ = client
        .call::<crate::protocol::methods::session::Disconnect>(DisconnectParams {
            reason: Some("map-router spawn done".into()),
            policy: Some(DisconnectPolicy {
                agent_behavior: AgentBehavior::Orphan,
                grace_period_ms: None,
                notify_subscribers: None,
            }),
        })
        .await;
    let _ = client.close().await;
    let result = result?;
    print_line(&pretty(&result));
    Ok(ExitCode::SUCCESS)
}
