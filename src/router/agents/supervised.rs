//! `Supervision`: the router's record of supervised agents (reservations made by
//! `map/agents/spawn` with a `command`, the spawner waiting for the first registration, the
//! template of the registration) and the channel to the process supervisor. The handlers
//! that use it are in [`super::supervision`]; processes themselves are `crate::process`'s.

use std::collections::HashMap;

use tokio::sync::{mpsc, oneshot};

use crate::protocol::agent::Agent;
use crate::protocol::ids::AgentId;
use crate::protocol::methods::agents::RegisterParams;
use crate::router::error::RouterError;

/// What the router asks the supervisor to do to a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessControl {
    /// Stop it: wait for a graceful exit (unless `force`), then SIGTERM, then SIGKILL.
    Stop {
        /// The agent.
        agent: AgentId,
        /// Skip the graceful wait.
        force: bool,
    },
    /// SIGSTOP its process group.
    Suspend {
        /// The agent.
        agent: AgentId,
    },
    /// SIGCONT its process group.
    Resume {
        /// The agent.
        agent: AgentId,
    },
}

/// How a supervised process ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExitInfo {
    /// Exit code, if it exited.
    pub code: Option<i32>,
    /// Signal, if one killed it.
    pub signal: Option<i32>,
    /// The last lines it wrote to stderr.
    pub stderr_tail: Vec<String>,
    /// The exit was asked for (`map/agents/stop`, unregister, shutdown).
    pub requested: bool,
    /// The restart policy would restart it (the router still decides).
    pub policy_restarts: bool,
    /// The last JSON-RPC error the router answered the process (`method → code message`),
    /// which often says why it never registered.
    pub last_error: Option<String>,
}

/// The cause of a failed spawn, for its 3004 message: the process's last error answer and its
/// stderr tail, each when there is one (`"; last error answer: …; stderr: …"`).
pub fn spawn_failure_cause(last_error: Option<&str>, stderr_tail: &[String]) -> String {
    let mut out = String::new();
    if let Some(e) = last_error {
        out.push_str("; last error answer: ");
        out.push_str(e);
    }
    if !stderr_tail.is_empty() {
        out.push_str("; stderr: ");
        out.push_str(&stderr_tail.join("\n"));
    }
    out
}

impl ExitInfo {
    pub(crate) fn clean(&self) -> bool {
        self.code == Some(0)
    }

    pub(crate) fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("signal {s}"),
            (None, None) => "unknown status".into(),
        }
    }
}

/// The reservation a spawner waits on.
pub type SpawnWaiter = oneshot::Receiver<Result<Agent, RouterError>>;

/// Router-side record of one supervised agent.
#[derive(Debug)]
pub(crate) struct Supervised {
    /// Parent link for the agent.
    pub(crate) parent: Option<AgentId>,
    /// Registration fields from the spawn call; the process's own register fills gaps.
    pub(crate) template: RegisterParams,
    /// The spawner, until the first registration.
    pub(crate) waiter: Option<oneshot::Sender<Result<Agent, RouterError>>>,
    /// Whether the agent has registered at least once.
    pub(crate) registered_once: bool,
    /// Who asked for it (`source` of `agent.spawning`).
    pub(crate) spawner: Option<std::sync::Arc<str>>,
    /// The `agent.spawning` event, which its first registration follows from.
    pub(crate) spawning: Option<crate::protocol::ids::EventId>,
}

/// The supervised agents, and the channel to the process supervisor (the server installs
/// it; without one, nothing is supervised and controls go nowhere).
#[derive(Debug, Default)]
pub(crate) struct Supervision {
    agents: HashMap<AgentId, Supervised>,
    control: Option<mpsc::Sender<ProcessControl>>,
}

impl Supervision {
    /// The table, sending controls on `control`.
    pub(crate) fn new(control: Option<mpsc::Sender<ProcessControl>>) -> Self {
        Self {
            agents: HashMap::new(),
            control,
        }
    }

    /// How many agents are supervised (reserved or running).
    pub(crate) fn len(&self) -> usize {
        self.agents.len()
    }

    /// Whether `agent` is supervised (reserved or running).
    pub(crate) fn contains(&self, agent: &AgentId) -> bool {
        self.agents.contains_key(agent)
    }

    /// The record of a supervised agent.
    pub(crate) fn get(&self, agent: &AgentId) -> Option<&Supervised> {
        self.agents.get(agent)
    }

    /// The record of a supervised agent, to change it.
    pub(crate) fn get_mut(&mut self, agent: &AgentId) -> Option<&mut Supervised> {
        self.agents.get_mut(agent)
    }

    /// Reserves `agent` for a process.
    pub(crate) fn insert(&mut self, agent: AgentId, record: Supervised) {
        self.agents.insert(agent, record);
    }

    /// Forgets a supervised agent (its process will not be restarted for it).
    pub(crate) fn remove(&mut self, agent: &AgentId) -> Option<Supervised> {
        self.agents.remove(agent)
    }

    /// Tells the supervisor to act on an agent's process, if it has one. Never waits: a full
    /// queue drops the control with a warning (the supervisor still reaps the process).
    pub(crate) fn control(&self, control: ProcessControl) {
        let agent = match &control {
            ProcessControl::Stop { agent, .. }
            | ProcessControl::Suspend { agent }
            | ProcessControl::Resume { agent } => agent,
        };
        if !self.agents.contains_key(agent) {
            return;
        }
        if let Some(tx) = &self.control {
            if tx.try_send(control.clone()).is_err() {
                tracing::warn!(%agent, ?control, "supervisor queue full; process control dropped");
            }
        }
    }
}
