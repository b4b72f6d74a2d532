//! The `map-router` user commands, built on [`crate::client`]: `agent` (bridge a program's
//! stdio to the router), `watch` (tail events), `send` and `request` (messages), `agents` and
//! `scopes` (listings), `spawn` (a supervised child), and `stop`, `suspend`, `resume`, `inject`
//! (operate on an agent).
//!
//! Every command takes `--url` (env `MAP_ROUTER_URL`, default `ws://127.0.0.1:4500/`; `wss://`
//! for a router serving TLS, and `http(s)://` is taken as `ws(s)://`), `--ca-file` (env
//! `MAP_ROUTER_CA_FILE`: a PEM CA to trust besides the system's roots) and the
//! credentials of [`UrlArgs`]. Commands that need agent rights (`spawn`, `send`/`request` to a
//! group, `send --as-agent`) connect as participant type `agent` without registering an agent;
//! the others connect as `client` (clients may stop and steer every agent they can see by
//! default). Every connection is recognisably the CLI's: name `map-router-cli`, participant id
//! `map-router-cli-<random>` (and so are `send --as-agent`'s temporary agents), which is how
//! `watch` hides the CLI's own comings and goings. Output goes to stdout; errors go to stderr
//! as `map-router: <what>: <error>` with exit code 1.
//!
//! Where things are: agent names → ids in `resolve`, each command family in its own module
//! (`watch`, `send`, `control`, `spawn`, `list`), output formats in `format`.

mod bridge;
mod control;
mod format;
mod list;
mod resolve;
mod send;
mod spawn;
mod watch;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::Value;

use crate::client::{Client, ClientError, ClientOptions, ReconnectPolicy};
use crate::protocol::message::Address;

pub use control::{AgentRef, InjectArgs, StopArgs, SuspendArgs};
pub use list::ListArgs;
pub use send::{RequestArgs, SendArgs};
pub use spawn::{Restart, SpawnArgs};
pub use watch::WatchArgs;

/// Default router URL of the user commands.
pub const DEFAULT_URL: &str = "ws://127.0.0.1:4500/";

/// The name every CLI connection gives in `map/connect`.
pub const CLI_NAME: &str = "map-router-cli";
/// How the participant ids of CLI connections, and the ids of the CLI's temporary agents,
/// begin (`watch` hides their connection events unless `--all`).
pub const CLI_ID_PREFIX: &str = "map-router-cli-";

/// What the CLI says when the router wants credentials it was not given.
pub const AUTH_HINT: &str =
    "the router requires authentication: pass --api-key KEY or --token JWT \
     (or set MAP_ROUTER_API_KEY / MAP_ROUTER_TOKEN)";

/// The user commands (flattened into `map-router`'s subcommands).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a program as a MAP agent: its stdin/stdout speak MAP as NDJSON (one JSON-RPC
    /// message per line) and are bridged to the router over one WebSocket. Exits with the
    /// program's exit code.
    Agent(AgentArgs),
    /// Tail events: one line per event (UTC time, type, source, data), or JSON lines.
    #[command(long_about = watch::LONG_ABOUT)]
    Watch(WatchArgs),
    /// Send a message and print the result (`{messageId, delivered}`); warns when nobody
    /// received it.
    Send(SendArgs),
    /// Send a message and wait for the correlated reply; print the reply's payload.
    Request(RequestArgs),
    /// List agents.
    Agents(ListArgs),
    /// List scopes.
    Scopes(ListArgs),
    /// Ask the router to launch and supervise a program as a child agent.
    Spawn(SpawnArgs),
    /// Stop an agent: it gets a `stop` control message and goes `stopping` (with `--force`: it
    /// is stopped and unregistered at once). Prints the result.
    Stop(StopArgs),
    /// Suspend an agent (it gets a `suspend` control message). Prints the agent.
    Suspend(SuspendArgs),
    /// Resume a suspended agent (it gets a `resume` control message). Prints the agent.
    Resume(AgentRef),
    /// Put content in front of a running agent (`map/inject`, see docs/steering.md). Prints
    /// the result.
    Inject(InjectArgs),
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

/// A failed command: what was being done, and why.
#[derive(Debug)]
struct Failure {
    what: String,
    error: String,
}

impl Failure {
    fn new(what: impl Into<String>, error: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            error: error.into(),
        }
    }
}

fn fail(what: impl Into<String>) -> impl FnOnce(ClientError) -> Failure {
    let what = what.into();
    move |e| Failure {
        what,
        error: describe(&e),
    }
}

/// A client error in the CLI's words: authentication problems name the CLI's flags, not the
/// Rust API.
fn describe(e: &ClientError) -> String {
    match e {
        e if e.is_auth_required() => AUTH_HINT.to_owned(),
        ClientError::Auth(_) => {
            format!("{e}; check --api-key / --token (or MAP_ROUTER_API_KEY / MAP_ROUTER_TOKEN)")
        }
        e => e.to_string(),
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
            Command::Watch(args) => watch::run(args).await,
            Command::Send(args) => send::send(args).await,
            Command::Request(args) => send::request(args).await,
            Command::Agents(args) => list::agents(args).await,
            Command::Scopes(args) => list::scopes(args).await,
            Command::Spawn(args) => spawn::run(args).await,
            Command::Stop(args) => control::stop(args).await,
            Command::Suspend(args) => control::suspend(args).await,
            Command::Resume(args) => control::resume(args).await,
            Command::Inject(args) => control::inject(args).await,
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
    Client::connect_ws(&url.url, cli_identity(options))
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

/// Makes a connection recognisably the CLI's: name [`CLI_NAME`], participant id
/// [`CLI_ID_PREFIX`]`<random>`.
fn cli_identity(options: ClientOptions) -> ClientOptions {
    options.name(CLI_NAME).participant_id(cli_id())
}

/// A fresh id that begins with [`CLI_ID_PREFIX`].
fn cli_id() -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{CLI_ID_PREFIX}{}", &random[..16])
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

/// Leaves a one-shot session: `map/disconnect` (the session's own agents go with it), then
/// close.
async fn leave(client: &Client) {
    let _ = client.disconnect().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::methods::auth::{AuthError, AuthErrorCode};

    #[test]
    fn auth_errors_name_the_cli_flags() {
        let missing = ClientError::Auth(AuthError::new(AuthErrorCode::AuthRequired, "rust hint"));
        assert_eq!(describe(&missing), AUTH_HINT);
        let refused = ClientError::Auth(AuthError::new(AuthErrorCode::InvalidCredentials, "bad"));
        let text = describe(&refused);
        assert!(
            text.starts_with("authentication refused (invalid_credentials): bad; check --api-key"),
            "{text}"
        );
        assert_eq!(describe(&ClientError::Closed), "the client is closed");
    }

    #[test]
    fn cli_ids_are_recognisable_and_fresh() {
        let (a, b) = (cli_id(), cli_id());
        assert!(
            a.starts_with(CLI_ID_PREFIX) && a.len() == CLI_ID_PREFIX.len() + 16,
            "{a}"
        );
        assert_ne!(a, b);
    }
}
