//! `map-router spawn`: ask the router to launch and supervise a program as a child agent
//! (`map/agents/spawn` with `command`).
//!
//! The program runs where the caller is: the command sends its working directory as
//! `command.cwd` (or `--cwd DIR`, a relative one taken from the caller's), and a program path
//! with a slash (`./agent.sh`) is made absolute against that directory, so relative paths mean
//! what they mean in the caller's shell. (The router must see the same file system: it runs on
//! the same machine, or the directory exists there too.) The session connects as participant
//! type `agent` and leaves with the `orphan` policy, so the child outlives it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use crate::cli::common::connect;
use crate::cli::common::fail;
use crate::cli::common::one_shot;
use crate::cli::common::pretty;
use crate::cli::common::print_line;
use crate::cli::common::Failure;
use crate::cli::common::UrlArgs;
use crate::cli::resolve;
use crate::client::ClientOptions;
use crate::protocol::methods::agents::{
    CommandSpec, RegisterParams, RestartMode, RestartPolicy, SpawnParams,
};
use crate::protocol::methods::session::{
    AgentBehavior, Disconnect, DisconnectParams, DisconnectPolicy,
};

/// `map-router spawn`.
#[derive(Debug, Args)]
pub struct SpawnArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// Parent agent: its id, or its name when no other agent has it.
    #[arg(long, value_name = "AGENT")]
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
    /// The program's working directory (default: this command's; a relative one is taken
    /// from this command's).
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,
    /// An environment variable for the program, on top of the router's environment
    /// (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    env: Vec<(String, String)>,
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

fn parse_env(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("`{text}` is not KEY=VALUE")),
    }
}

/// The program's working directory: `--cwd` against `here`, or `here`.
fn working_dir(here: &Path, cwd: Option<&Path>) -> PathBuf {
    match cwd {
        Some(dir) => here.join(dir),
        None => here.to_owned(),
    }
}

/// A relative program path with a slash, made absolute against `dir`; others (`python3`, looked
/// up in `PATH`, or absolute) as they are.
fn program_path(program: &str, dir: &Path) -> String {
    let path = Path::new(program);
    if program.contains('/') && path.is_relative() {
        // Collecting the components drops the `.` of `./a.sh`.
        dir.join(path)
            .components()
            .collect::<PathBuf>()
            .display()
            .to_string()
    } else {
        program.to_owned()
    }
}

fn utf8(dir: &Path) -> Result<String, Failure> {
    dir.to_str()
        .map(str::to_owned)
        .ok_or_else(|| Failure::new("--cwd", format!("{} is not UTF-8", dir.display())))
}

pub(super) async fn run(args: SpawnArgs) -> Result<ExitCode, Failure> {
    let here = std::env::current_dir()
        .map_err(|e| Failure::new("spawn", format!("cannot read the current directory: {e}")))?;
    let dir = working_dir(&here, args.cwd.as_deref());
    let cwd = utf8(&dir)?;
    let mut command = args.command.into_iter();
    let program = program_path(&command.next().unwrap_or_default(), &dir);
    let client = connect(&args.url, one_shot(ClientOptions::agent())).await?;
    let result = async {
        let parent = match &args.parent {
            Some(p) => Some(resolve::agent(&client, "--parent", p).await?),
            None => None,
        };
        let params = SpawnParams {
            register: RegisterParams {
                name: args.name,
                role: args.role,
                parent,
                scopes: (!args.scopes.is_empty())
                    .then(|| args.scopes.into_iter().map(Into::into).collect()),
                ..RegisterParams::default()
            },
            command: Some(CommandSpec {
                program,
                args: command.collect(),
                env: args.env.into_iter().collect(),
                cwd: Some(cwd),
                restart: Some(RestartPolicy {
                    mode: args.restart.into(),
                    ..RestartPolicy::default()
                }),
                ..CommandSpec::default()
            }),
            ..SpawnParams::default()
        };
        client.spawn(params).await.map_err(fail("map/agents/spawn"))
    }
    .await;
    // Leave without taking anything down with this session.
    let _ = client
        .call::<Disconnect>(DisconnectParams {
            reason: Some("map-router spawn done".into()),
            policy: Some(DisconnectPolicy {
                agent_behavior: AgentBehavior::Orphan,
                grace_period_ms: None,
                notify_subscribers: None,
            }),
            ..DisconnectParams::default()
        })
        .await;
    let _ = client.close().await;
    let result = result?;
    print_line(&pretty(&result));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_taken_from_the_callers_directory() {
        let here = Path::new("/home/u/proj");
        assert_eq!(working_dir(here, None), here);
        assert_eq!(
            working_dir(here, Some(Path::new("sub"))),
            Path::new("/home/u/proj/sub")
        );
        assert_eq!(
            working_dir(here, Some(Path::new("/srv"))),
            Path::new("/srv")
        );
        assert_eq!(program_path("python3", here), "python3");
        assert_eq!(program_path("./a.sh", here), "/home/u/proj/a.sh");
        assert_eq!(program_path("../b/a.sh", here), "/home/u/proj/../b/a.sh");
        assert_eq!(program_path("bin/a", here), "/home/u/proj/bin/a");
        assert_eq!(program_path("/bin/sh", here), "/bin/sh");
    }

    #[test]
    fn env_pairs_need_a_key_and_an_equals_sign() {
        assert_eq!(parse_env("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert_eq!(parse_env("A="), Ok(("A".into(), String::new())));
        assert!(parse_env("=x").is_err());
        assert!(parse_env("novalue").is_err());
    }
}
