//! `map/send` (methods.md §1).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::capabilities::Capability;
use crate::protocol::ids::MessageId;
use crate::protocol::json::RawJson;
use crate::protocol::message::MessageMeta;
use crate::protocol::methods::method::method;

/// `map/send` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SendParams {
    /// Where to send: any address form (see `Address`), kept as written.
    #[schemars(with = "serde_json::Value")]
    pub to: RawJson,
    /// The payload, delivered byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<RawJson>,
    /// Message metadata, delivered byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<MessageMeta>")]
    pub meta: Option<RawJson>,
}

/// `map/send` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SendResult {
    /// The message id.
    pub message_id: MessageId,
    /// Who received it: agent ids for agent recipients, participant ids for participant
    /// recipients. Possibly empty (for example a scope with no other members).
    pub delivered: Vec<String>,
    /// Agents that are away (their connection dropped, their process restarting) and will get
    /// the message when they are back: only for `meta.delivery` `acknowledged` or `guaranteed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queued: Vec<String>,
}

method!(
    /// `map/send`.
    Send, "map/send", Some(Capability::CanSend), SendParams, SendResult
);
