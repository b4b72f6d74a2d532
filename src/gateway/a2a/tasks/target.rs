//! [`Target`]: where an A2A request is addressed (an agent's URL, a gone agent's URL, the
//! router's endpoint), and the answer for a task it does not serve. Which tasks a target
//! serves is read in `books.rs` (it may ask whether an agent is live).

use crate::gateway::a2a::error::A2aError;
use crate::protocol::agent::Agent;

/// Where an A2A call is addressed: one MAP agent (`/a2a/agents/{id}`), the agent a path named
/// in a previous run, or the router's own endpoint (`/a2a`), which serves the tasks of every
/// agent.
#[derive(Debug, Clone)]
pub enum Target {
    /// One live agent: its tasks, and (after a restart) those of a gone agent of its name.
    Agent(Box<Agent>),
    /// A path naming no live agent (`/a2a/agents/<old id>`): the tasks of the agent that had
    /// this id or name. New tasks need a live agent.
    Former(String),
    /// The router endpoint.
    Router,
}

impl Target {
    /// The answer for a task not found at this target: at a former agent's URL the path itself
    /// names nothing (404, as before the rule), elsewhere -32001.
    pub(super) fn not_found(&self, id: &str) -> A2aError {
        match self {
            Self::Former(agent) => A2aError::unknown_agent(agent),
            _ => A2aError::task_not_found(id),
        }
    }
}
