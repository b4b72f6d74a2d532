//! `map/inject` (steering extension): put context in front of a running agent.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::capabilities::Capability;
use crate::protocol::ids::{AgentId, MessageId};
use crate::protocol::json::RawJson;
use crate::protocol::methods::method::method;

/// How injected content is delivered (see `docs/steering.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum InjectDelivery {
    /// In order, behind messages already queued for the agent.
    #[default]
    Queue,
    /// Ahead of messages queued for the agent but not yet written, marked urgent.
    Steer,
    /// Like `steer`, and flagged so the agent abandons its current step.
    Interrupt,
    /// Only if the agent's connection can take it now; otherwise not injected.
    BestEffort,
}

/// `map/inject` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InjectParams {
    /// The target agent.
    pub agent_id: AgentId,
    /// What to inject (any JSON), delivered byte for byte.
    pub content: RawJson,
    /// Delivery mode (default `queue`).
    #[serde(default)]
    pub delivery: Option<InjectDelivery>,
}

/// `map/inject` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InjectResult {
    /// Whether the content reached the agent's connection.
    pub injected: bool,
    /// The delivery mode used.
    pub delivery: InjectDelivery,
    /// Who received it (the agent id), empty when not injected.
    pub delivered_to: Vec<AgentId>,
    /// Id of the `map/message` that carried it.
    pub message_id: MessageId,
}

method!(
    /// `map/inject`.
    Inject, "map/inject", Some(Capability::CanSteer), InjectParams, InjectResult
);
