//! Turning what the user typed into what the router wants: an agent **name or id** into an
//! agent id, and `--to` into a MAP address.
//!
//! The rule, for every command that takes an agent (`stop`, `suspend`, `resume`, `inject`,
//! `send --to`, `request --to`, `spawn --parent`, `watch --agent`):
//! 1. an agent whose id is exactly the text wins;
//! 2. else the one agent, among those the caller can list (`map/agents/list`), whose name is the
//!    text;
//! 3. several agents with that name are an error that lists them (id, role, state) and asks for
//!    an id: ambiguity is not settled by preferring live agents;
//! 4. no such agent is an error that lists a few of the agents there are (`watch --agent`
//!    instead keeps the text as an id, to watch for an agent yet to come).
//!
//! `--to` also takes a MAP address as JSON (`{"scope":"team"}`, `{"role":"worker"}`,
//! `{"broadcast":true}`) or a prefixed text address (`scope:team`, `agent:a1`): those go to the
//! router as they are.

use serde_json::Value;

use crate::cli::common::describe;
use crate::cli::common::Failure;
use crate::cli::format;
use crate::client::{Client, ClientError};
use crate::protocol::agent::Agent;
use crate::protocol::ids::AgentId;
use crate::protocol::jsonrpc::ErrorCode;

/// Most agents an "unknown agent" error names.
const MAX_LISTED: usize = 8;

/// What `--to` was, before anything is asked of the router.
#[derive(Debug, Clone, PartialEq)]
pub enum To {
    /// A MAP address to send as it is (JSON, or a prefixed text address).
    Address(Value),
    /// An agent name or id, resolved once connected.
    Agent(String),
}

impl To {
    /// Parses `--to`.
    ///
    /// # Errors
    /// Text that starts like JSON but is not.
    pub fn parse(text: &str) -> Result<Self, Failure> {
        if text.trim_start().starts_with(['{', '[']) {
            return serde_json::from_str::<Value>(text)
                .map(To::Address)
                .map_err(|e| Failure::new("--to", format!("not valid JSON: {e}")));
        }
        if text.starts_with("scope:") || text.starts_with("agent:") {
            return Ok(To::Address(Value::String(text.to_owned())));
        }
        Ok(To::Agent(text.to_owned()))
    }

    /// The address to send to: an agent resolved by [`agent`], or the address as given.
    ///
    /// # Errors
    /// As [`agent`].
    pub async fn address(self, client: &Client, what: &str) -> Result<Value, Failure> {
        match self {
            To::Address(v) => Ok(v),
            To::Agent(text) => Ok(Value::String(agent(client, what, &text).await?.to_string())),
        }
    }
}

/// What a name or id matched.
#[derive(Debug, Clone, PartialEq)]
enum Found {
    /// This agent.
    One(AgentId),
    /// No agent has that id or name; here are the agents there are.
    None(Vec<Agent>),
    /// Several agents have that name.
    Several(Vec<Agent>),
}

/// Resolves `text` (an agent id or name) to an agent id; `what` labels errors (`--to`, `stop`).
///
/// # Errors
/// An unknown or ambiguous name (with the agents it could be), or the router's error.
pub async fn agent(client: &Client, what: &str, text: &str) -> Result<AgentId, Failure> {
    match lookup(client, text)
        .await
        .map_err(|e| lookup_failed(what, &e))?
    {
        Found::One(id) => Ok(id),
        Found::None(all) => Err(Failure::new(what, unknown(text, &all))),
        Found::Several(matching) => Err(Failure::new(what, ambiguous(text, &matching))),
    }
}

/// Like [`agent`], but text that matches no agent is kept as an id (for filters that may name
/// an agent yet to come).
///
/// # Errors
/// An ambiguous name, or the router's error.
pub async fn agent_or_as_is(client: &Client, what: &str, text: &str) -> Result<String, Failure> {
    match lookup(client, text)
        .await
        .map_err(|e| lookup_failed(what, &e))?
    {
        Found::One(id) => Ok(id.to_string()),
        Found::None(_) => Ok(text.to_owned()),
        Found::Several(matching) => Err(Failure::new(what, ambiguous(text, &matching))),
    }
}

fn lookup_failed(what: &str, e: &ClientError) -> Failure {
    Failure::new(format!("{what}: looking up the agent"), describe(e))
}

async fn lookup(client: &Client, text: &str) -> Result<Found, ClientError> {
    match client.get_agent(text).await {
        Ok(agent) => return Ok(Found::One(agent.id)),
        // Not an id (or not a well-formed one): try names.
        Err(e)
            if matches!(
                e.code(),
                Some(ErrorCode::AGENT_NOT_FOUND | ErrorCode::INVALID_PARAMS)
            ) => {}
        Err(e) => return Err(e),
    }
    let all = client.list_agents(Default::default()).await?;
    Ok(by_name(text, all))
}

/// Step 2 to 4 of the rule, over the listed agents.
fn by_name(text: &str, all: Vec<Agent>) -> Found {
    // An id match found by listing (the rule's step 1, should `get` have missed it).
    if let Some(a) = all.iter().find(|a| a.id.as_str() == text) {
        return Found::One(a.id.clone());
    }
    let matching: Vec<Agent> = all
        .iter()
        .filter(|a| a.name.as_deref() == Some(text))
        .cloned()
        .collect();
    match matching.len() {
        0 => Found::None(all),
        1 => Found::One(matching[0].id.clone()),
        _ => Found::Several(matching),
    }
}

fn unknown(text: &str, all: &[Agent]) -> String {
    let mut out = format!("no agent has the id or name `{text}`");
    if all.is_empty() {
        out.push_str(" (there are no agents)");
        return out;
    }
    let listed: Vec<String> = all
        .iter()
        .take(MAX_LISTED)
        .map(|a| match a.name.as_deref().filter(|n| !n.is_empty()) {
            Some(name) => format!("{name} ({})", a.id),
            None => a.id.to_string(),
        })
        .collect();
    out.push_str("; agents: ");
    out.push_str(&listed.join(", "));
    if all.len() > MAX_LISTED {
        out.push_str(&format!(
            ", and {} more (`map-router agents` lists them all)",
            all.len() - MAX_LISTED
        ));
    }
    out
}

fn ambiguous(text: &str, matching: &[Agent]) -> String {
    let rows: Vec<Vec<String>> = matching
        .iter()
        .map(|a| {
            vec![
                a.id.to_string(),
                a.role.clone().unwrap_or_else(|| "-".into()),
                a.state.to_string(),
            ]
        })
        .collect();
    let table = format::table(&["ID", "ROLE", "STATE"], &rows);
    let mut out = format!(
        "{} agents are named `{text}`; give one's id instead:\n",
        matching.len()
    );
    for line in table.lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    out.trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn agent(id: &str, name: Option<&str>, state: &str) -> Agent {
        serde_json::from_value(json!({
            "id": id, "ownerId": null, "name": name, "state": state, "role": "worker", "scopes": []
        }))
        .unwrap()
    }

    #[test]
    fn to_is_json_a_prefixed_address_or_an_agent() {
        assert_eq!(
            To::parse(r#"{"scope":"team"}"#).unwrap(),
            To::Address(json!({"scope": "team"}))
        );
        assert_eq!(
            To::parse("scope:team").unwrap(),
            To::Address(json!("scope:team"))
        );
        assert_eq!(To::parse("worker-1").unwrap(), To::Agent("worker-1".into()));
        let bad = To::parse("{not json").unwrap_err();
        assert_eq!(bad.what, "--to");
    }

    #[test]
    fn ids_win_then_unique_names() {
        let all = vec![
            agent("a1", Some("x"), "registered"),
            agent("x", Some("other"), "registered"),
            agent("a3", Some("solo"), "stopped"),
        ];
        assert_eq!(by_name("x", all.clone()), Found::One("x".into()));
        assert_eq!(by_name("solo", all.clone()), Found::One("a3".into()));
        assert!(matches!(by_name("nobody", all), Found::None(ref v) if v.len() == 3));
    }

    #[test]
    fn ambiguous_names_list_id_role_and_state() {
        let all = vec![
            agent("a1", Some("w"), "registered"),
            agent("a2", Some("w"), "stopped"),
        ];
        let Found::Several(matching) = by_name("w", all) else {
            panic!("ambiguous");
        };
        let text = ambiguous("w", &matching);
        assert!(
            text.starts_with("2 agents are named `w`; give one's id"),
            "{text}"
        );
        assert!(text.contains("ID  ROLE    STATE"), "{text}");
        assert!(text.contains("a1  worker  registered"), "{text}");
        assert!(text.contains("a2  worker  stopped"), "{text}");
    }

    #[test]
    fn unknown_names_list_a_few_agents() {
        assert_eq!(
            unknown("n", &[]),
            "no agent has the id or name `n` (there are no agents)"
        );
        let all: Vec<Agent> = (0..10)
            .map(|i| {
                agent(
                    &format!("a{i}"),
                    (i % 2 == 0).then_some("even"),
                    "registered",
                )
            })
            .collect();
        let text = unknown("n", &all);
        assert!(
            text.starts_with("no agent has the id or name `n`; agents: even (a0), a1, even (a2)"),
            "{text}"
        );
        assert!(
            text.ends_with(", and 2 more (`map-router agents` lists them all)"),
            "{text}"
        );
    }
}
