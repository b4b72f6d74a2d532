//! [`Remote`]: one remote A2A agent as the gateway knows it (how it was registered, its card,
//! its endpoint, its MAP session and agent), and [`RemoteSpec`], how to register one.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::Deserialize;
use serde_json::json;

use crate::client::{AgentHandle, Client};
use crate::gateway::a2a::remote::card::RemoteCard;
use crate::gateway::a2a::remote::http;
use crate::gateway::a2a::wire::Version;

/// A remote agent to register: `[[a2a.remote]]`, or the body of `POST /a2a/remote`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteSpec {
    /// The card's URL (`http://host:port/.well-known/agent-card.json`, or a v0.3
    /// `.../agent.json`).
    #[serde(alias = "cardUrl")]
    pub card_url: String,
    /// The MAP agent id (default: the card's name, lower-cased, with `-` for anything but
    /// letters, digits, `-` and `_`).
    #[serde(default)]
    pub name: Option<String>,
    /// A bearer token sent to the remote agent (`Authorization: Bearer <token>`).
    #[serde(default)]
    pub token: Option<String>,
}

/// One remote agent.
#[derive(Debug)]
pub struct Remote {
    /// Its MAP agent id.
    pub agent_id: String,
    /// How it was registered.
    pub spec: RemoteSpec,
    /// What its card says.
    pub card: RemoteCard,
    /// Its JSON-RPC endpoint.
    pub endpoint: http::Target,
    /// Its MAP session.
    pub(super) client: Client,
    /// Its MAP agent, until unregistered.
    pub(super) agent: Mutex<Option<AgentHandle>>,
    /// The remote task of each call in flight, by the request's correlation id: what a cancel
    /// notice names (a std mutex, never held across an await).
    pub(super) in_flight: Mutex<HashMap<String, String>>,
}

impl Remote {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        // Inserts and removes only: a panic cannot leave it inconsistent.
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes that the call answering `correlation` works on remote task `task`.
    pub fn track(&self, correlation: &str, task: &str) {
        self.table().insert(correlation.to_owned(), task.to_owned());
    }

    /// The call answering `correlation` is over.
    pub fn untrack(&self, correlation: &str) {
        self.table().remove(correlation);
    }

    /// The remote task of the call answering `correlation`, if in flight.
    pub fn tracked(&self, correlation: &str) -> Option<String> {
        self.table().get(correlation).cloned()
    }

    /// What `GET /a2a/remote` shows of it.
    pub fn describe(&self) -> serde_json::Value {
        json!({
            "agentId": self.agent_id,
            "cardUrl": self.spec.card_url,
            "name": self.card.name,
            "url": self.endpoint.url(),
            "protocolVersion": version_name(self.card.version),
            "streaming": self.card.streaming,
        })
    }
}

/// `1.0` or `0.3`.
pub fn version_name(v: Version) -> &'static str {
    match v {
        Version::V1 => "1.0",
        Version::V03 => "0.3",
    }
}
