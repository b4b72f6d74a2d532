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
//! (`watch`, `send`, `control`, `spawn`, `list`, `release`), output formats in `format`.

mod bridge;
mod common;
mod control;
mod format;
mod list;
mod release;
mod resolve;
mod send;
mod spawn;
mod watch;

use std::process::ExitCode;

use clap::Subcommand;

pub use bridge::AgentArgs;
pub use common::{UrlArgs, AUTH_HINT, CLI_ID_PREFIX, CLI_NAME, DEFAULT_URL};
pub use control::{AgentRef, InjectArgs, StopArgs, SuspendArgs};
pub use list::ListArgs;
pub use send::{RequestArgs, SendArgs};
pub use spawn::{Restart, SpawnArgs};
pub use watch::WatchArgs;

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
    /// Free a participant id or an agent id (system principals only), so that a principal
    /// other than the one that owns it may take it (docs/security.md, "Identity"). Prints the
    /// owner it had.
    ReleaseId(release::ReleaseArgs),
}

/// The multi-threaded runtime every command runs on; prints why when it cannot start.
///
/// # Errors
/// The exit code to return when the runtime cannot be built.
pub fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    runtime_with_idle_hook(|| {})
}

/// [`runtime`], with `on_idle` run by each worker thread whenever it runs out of work (tokio's
/// `on_thread_park`): the binary gives its allocator's freed pages back there.
///
/// # Errors
/// The exit code to leave with (the message is printed) when the runtime cannot start.
pub fn runtime_with_idle_hook(on_idle: fn()) -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(on_idle)
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
            Command::ReleaseId(args) => release::run(args).await,
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
