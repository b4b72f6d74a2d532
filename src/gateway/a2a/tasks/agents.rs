//! Which MAP agent an A2A request addresses, as its caller sees them: the agents a caller may
//! address ([`Core::agents`]), the one a path names ([`Core::resolve`], [`Core::target`]), and
//! the one a follow-up goes to ([`Core::agent_of`]: after a restart, the agent that now has
//! the task's agent's name).
//!
//! Owns no state: every answer is a MAP call made *as the caller* (its own session), so the
//! agents' visibility to that caller applies; the gateway's own agent is never one.

use crate::client::{Client, ClientError};
use crate::gateway::a2a::access::Caller;
use crate::gateway::a2a::error::A2aError;
use crate::gateway::a2a::record::Record;
use crate::protocol::agent::Agent;
use crate::protocol::methods::agents::AgentFilter;

use super::{is_gateway_agent, Core, Target};

impl Core {
    /// The agents an A2A caller may address: those `viewer` sees, but the gateway.
    ///
    /// # Errors
    /// The listing failed.
    pub async fn agents(&self, viewer: &Client) -> Result<Vec<Agent>, A2aError> {
        let agents = viewer
            .list_agents(AgentFilter::default())
            .await
            .map_err(|e| A2aError::from_map(&e, None))?;
        Ok(agents
            .into_iter()
            .filter(|a| !is_gateway_agent(a.id.as_str()))
            .collect())
    }

    /// The agent an A2A path names: by id, else by a unique name.
    ///
    /// # Errors
    /// [`A2aError::unknown_agent`] when none (or several, by name) match; MAP's refusals (a
    /// missing `observation.canQuery` is 403, a rate limit 429).
    pub async fn resolve(&self, viewer: &Client, id_or_name: &str) -> Result<Agent, A2aError> {
        if is_gateway_agent(id_or_name) {
            return Err(A2aError::unknown_agent(id_or_name));
        }
        match viewer.get_agent(id_or_name).await {
            Ok(agent) => return Ok(agent),
            Err(e) if refusal(&e) => return Err(A2aError::from_map(&e, None)),
            Err(_) => {}
        }
        let named: Vec<Agent> = self
            .agents(viewer)
            .await?
            .into_iter()
            .filter(|a| a.name.as_deref() == Some(id_or_name))
            .collect();
        match <[Agent; 1]>::try_from(named) {
            Ok([agent]) => Ok(agent),
            Err(_) => Err(A2aError::unknown_agent(id_or_name)),
        }
    }

    /// The target a path's `agentId` names: a live agent `viewer` sees, else, when `former`
    /// (a request about one task: new tasks and listings need a live agent), the agent that had
    /// that id or name before.
    ///
    /// # Errors
    /// MAP's refusals (403, 429); [`A2aError::unknown_agent`] for a path that names no live
    /// agent when not `former`.
    pub async fn target(
        &self,
        viewer: &Client,
        id_or_name: &str,
        former: bool,
    ) -> Result<Target, A2aError> {
        match self.resolve(viewer, id_or_name).await {
            Ok(agent) => Ok(Target::Agent(Box::new(agent))),
            Err(e)
                if e.status == axum::http::StatusCode::NOT_FOUND
                    && !is_gateway_agent(id_or_name)
                    && former =>
            {
                Ok(Target::Former(id_or_name.to_owned()))
            }
            Err(e) => Err(e),
        }
    }

    /// The agent a follow-up to `record` goes to, as `caller` sees it: the task's agent, or,
    /// when that one is gone (a restart gave the agent a new id), the one agent that has its
    /// name now.
    ///
    /// # Errors
    /// 403 when the caller sees no such agent; MAP's refusals.
    pub(super) async fn agent_of(
        &self,
        caller: &Caller,
        record: &Record,
        id: &str,
    ) -> Result<Agent, A2aError> {
        let hidden = || {
            A2aError::forbidden(format!(
                "agent {} of task {id} is not one this caller may see",
                record.agent
            ))
        };
        match self.resolve(caller.session(), &record.agent).await {
            Ok(a) => Ok(a),
            Err(e) if e.status == axum::http::StatusCode::NOT_FOUND => {
                let Some(name) = &record.agent_name else {
                    return Err(hidden());
                };
                match self.resolve(caller.session(), name).await {
                    Ok(a) if a.name.as_deref() == Some(name) => Ok(a),
                    Ok(_) => Err(hidden()),
                    Err(e) if e.status == axum::http::StatusCode::NOT_FOUND => Err(hidden()),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }
}

/// Whether a MAP error is a refusal to pass on (a grant, a rate limit, a quota), rather than
/// "no such agent".
fn refusal(e: &ClientError) -> bool {
    matches!(e, ClientError::Rpc { code, .. } if [1003, 4001, 4002].contains(&code.0))
}
