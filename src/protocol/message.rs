//! Messages and addresses (methods.md §0, "Message", "Address (`MAPAddress`) forms").
//!
//! `Address` is parsed from the `to` value a sender wrote; the message itself keeps `to` exactly
//! as sent, because recipients compare it and the SDK's `reply()` reads `from`, not `to`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::ids::AgentId;
use crate::protocol::ids::MessageId;
use crate::protocol::ids::ParticipantId;
use crate::protocol::ids::ScopeId;
use crate::protocol::json::RawJson;

/// A message as recipients get it in `map/message` and as message events carry it. `to`,
/// `payload` and `meta` are the sender's JSON text, passed on byte for byte ([`RawJson`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Message {
    /// The message id.
    pub id: MessageId,
    /// The sender: its agent id when it has one, else its participant id. `reply()` sends to
    /// `{agent: from}`, which the router resolves either way.
    pub from: String,
    /// The address exactly as the sender wrote it.
    #[schemars(with = "AddressSchema")]
    pub to: RawJson,
    /// When the router accepted the message (Unix ms).
    pub timestamp: u64,
    /// The payload, exactly as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<RawJson>,
    /// Message metadata, exactly as sent (extension keys such as `protocol` are allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<MessageMeta>")]
    pub meta: Option<RawJson>,
}

impl Message {
    /// The fields of `meta` the router and the clients read (parsed on each call: read it
    /// once when several are needed).
    pub fn meta_view(&self) -> MetaView {
        MetaView::of(self.meta.as_ref())
    }

    /// `meta.correlationId`, if a string.
    pub fn correlation_id(&self) -> Option<String> {
        self.meta_view().correlation_id
    }

    /// `meta.expectsResponse === true`.
    pub fn expects_response(&self) -> bool {
        self.meta_view().expects_response
    }

    /// `meta.isResult === true` (a reply).
    pub fn is_result(&self) -> bool {
        self.meta_view().is_result
    }

    /// The payload as a [`serde_json::Value`] (a parsed copy), if there is one.
    pub fn payload_value(&self) -> Option<serde_json::Value> {
        self.payload.as_ref().map(RawJson::to_value)
    }
}

/// What the router reads in a message's `meta`: each field only when it has the right type
/// (a `correlationId` that is not a string is not a correlation id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetaView {
    /// `meta.correlationId`.
    pub correlation_id: Option<String>,
    /// `meta.expectsResponse === true`.
    pub expects_response: bool,
    /// `meta.isResult === true`.
    pub is_result: bool,
    /// `meta.delivery`.
    pub delivery: Option<String>,
    /// `meta.priority`.
    pub priority: Option<String>,
}

impl MetaView {
    /// Reads `meta` (one pass over its text; absent or not an object: all defaults).
    pub fn of(meta: Option<&RawJson>) -> Self {
        let Some(members) = meta.and_then(RawJson::members) else {
            return Self::default();
        };
        let text = |k: &str| {
            members
                .get(k)
                .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok())
        };
        let flag = |k: &str| {
            members
                .get(k)
                .and_then(|raw| serde_json::from_str::<bool>(raw.get()).ok())
                .unwrap_or(false)
        };
        Self {
            correlation_id: text("correlationId"),
            expects_response: flag("expectsResponse"),
            is_result: flag("isResult"),
            delivery: text("delivery"),
            priority: text("priority"),
        }
    }

    /// Whether `meta.delivery` asks for more than fire-and-forget (`acknowledged` or
    /// `guaranteed`): such messages wait for a recipient that is away.
    pub fn delivery_guaranteed(&self) -> bool {
        matches!(
            self.delivery.as_deref(),
            Some("acknowledged" | "guaranteed" | "at-least-once" | "exactly-once")
        )
    }

    /// `meta.priority`, defaulting to `normal`.
    pub fn priority(&self) -> &str {
        self.priority.as_deref().unwrap_or("normal")
    }
}

/// Documented shape of `MessageMeta` (schema only: the router keeps `meta` verbatim).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageMeta {
    /// Sender's clock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<u64>,
    /// `parent-to-child`, `child-to-parent`, `peer` or `broadcast`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relationship: Option<String>,
    /// The sender waits for a reply carrying the same `correlationId`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expects_response: Option<bool>,
    /// Ties a reply to its request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// Marks a reply.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_result: Option<bool>,
    /// `urgent`, `high`, `normal` (default) or `low`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// `fire-and-forget` (default), `acknowledged` or `guaranteed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery: Option<String>,
    /// Time to live.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// Which participants a `{participants: ...}` address names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ParticipantGroup {
    /// Every connected participant.
    All,
    /// Participants of type agent.
    Agents,
    /// Participants of type client.
    Clients,
}

/// The hierarchical flags of an address, relative to the sender's agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hierarchy {
    /// The sender's parent.
    pub parent: bool,
    /// The sender's children (down to `depth`, default 1).
    pub children: bool,
    /// The sender's ancestors (up to `depth`, default unlimited).
    pub ancestors: bool,
    /// The sender's descendants (down to `depth`, default unlimited).
    pub descendants: bool,
    /// Agents with the same parent, excluding the sender.
    pub siblings: bool,
    /// Depth limit, at least 1.
    pub depth: Option<u32>,
}

/// A parsed `map/send` address.
#[derive(Debug, Clone, PartialEq)]
pub enum Address {
    /// A bare string: an agent id, else a participant id; `agent:`/`scope:` prefixes allowed.
    Text(String),
    /// `{agent}`.
    Agent(AgentId),
    /// `{agents: [...]}`.
    Agents(Vec<AgentId>),
    /// `{scope}`.
    Scope(ScopeId),
    /// `{role, within?}`.
    Role {
        /// The role.
        role: String,
        /// Only members of this scope.
        within: Option<ScopeId>,
    },
    /// `{parent|children|ancestors|descendants|siblings: true, depth?}`.
    Hierarchical(Hierarchy),
    /// `{broadcast: true}`: every agent except the sender's.
    Broadcast,
    /// `{system: true}`: the router itself.
    System,
    /// `{participant}`.
    Participant(ParticipantId),
    /// `{participants: all|agents|clients}`.
    Participants(ParticipantGroup),
    /// `{system: "<id>", agent}`: an agent in another system.
    Federated {
        /// The remote system.
        system: String,
        /// The agent there.
        agent: AgentId,
    },
}

impl Address {
    /// Parses the `to` of `map/send` as the sender wrote it.
    ///
    /// # Errors
    /// The reason, for a `-32602`.
    pub fn parse_raw(to: &RawJson) -> Result<Self, String> {
        Self::parse(&to.to_value())
    }

    /// Parses the `to` value of `map/send`. The error is the reason, for a `-32602`.
    pub fn parse(value: &serde_json::Value) -> Result<Self, String> {
        use serde_json::Value;
        let bad = |why: &str| format!("invalid address `to`: {why}");
        let obj = match value {
            Value::String(s) if !s.is_empty() => return Ok(Address::Text(s.clone())),
            Value::String(_) => return Err(bad("empty string")),
            Value::Array(_) => {
                return Err(bad(
                    "an array of addresses is not supported; use {\"agents\": [...]}",
                ))
            }
            Value::Object(obj) => obj,
            _ => return Err(bad("must be a string or an object")),
        };
        let str_field = |k: &str| -> Result<Option<&str>, String> {
            match obj.get(k) {
                None => Ok(None),
                Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
                Some(_) => Err(bad(&format!("`{k}` must be a non-empty string"))),
            }
        };
        let flag = |k: &str| -> Result<bool, String> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(_) => Err(bad(&format!("`{k}` must be a boolean"))),
            }
        };
        if let Some(system) = obj.get("system") {
            match system {
                Value::String(s) => {
                    let agent = str_field("agent")?
                        .ok_or_else(|| bad("a federated address needs `agent`"))?;
                    return Ok(Address::Federated {
                        system: s.clone(),
                        agent: agent.into(),
                    });
                }
                Value::Bool(true) => return Ok(Address::System),
                Value::Bool(false) => {}
                _ => return Err(bad("`system` must be true or a system id")),
            }
        }
        if let Some(agent) = str_field("agent")? {
            return Ok(Address::Agent(agent.into()));
        }
        if let Some(agents) = obj.get("agents") {
            let list = agents
                .as_array()
                .ok_or_else(|| bad("`agents` must be an array of agent ids"))?;
            if list.is_empty() {
                return Err(bad("`agents` must not be empty"));
            }
            let ids = list
                .iter()
                .map(|v| match v {
                    Value::String(s) if !s.is_empty() => Ok(AgentId::from(s.as_str())),
                    _ => Err(bad("`agents` must be an array of agent ids")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(Address::Agents(ids));
        }
        if let Some(scope) = str_field("scope")? {
            return Ok(Address::Scope(scope.into()));
        }
        if let Some(role) = str_field("role")? {
            return Ok(Address::Role {
                role: role.to_owned(),
                within: str_field("within")?.map(ScopeId::from),
            });
        }
        let h = Hierarchy {
            parent: flag("parent")?,
            children: flag("children")?,
            ancestors: flag("ancestors")?,
            descendants: flag("descendants")?,
            siblings: flag("siblings")?,
            depth: match obj.get("depth") {
                None | Some(Value::Null) => None,
                Some(v) => match v.as_u64() {
                    Some(d) if d >= 1 => Some(d.min(u64::from(u32::MAX)) as u32),
                    _ => return Err(bad("`depth` must be an integer of at least 1")),
                },
            },
        };
        if h.parent || h.children || h.ancestors || h.descendants || h.siblings {
            return Ok(Address::Hierarchical(h));
        }
        if flag("broadcast")? {
            return Ok(Address::Broadcast);
        }
        if let Some(p) = str_field("participant")? {
            return Ok(Address::Participant(p.into()));
        }
        if let Some(group) = obj.get("participants") {
            let g: ParticipantGroup = serde_json::from_value(group.clone())
                .map_err(|_| bad("`participants` must be \"all\", \"agents\" or \"clients\""))?;
            return Ok(Address::Participants(g));
        }
        Err(bad("no recognised address form (agent, agents, scope, role, parent, children, ancestors, descendants, siblings, broadcast, system, participant, participants)"))
    }

    /// Whether this form names exactly one recipient (`{agent}`, `{participant}`, `{parent}`,
    /// `system`, a federated agent, or a bare id that is not a scope's). A send to any other form
    /// records its outcomes as one event per outcome, listing the recipients (docs/streams.md).
    pub fn names_one(&self) -> bool {
        match self {
            Address::Agent(_)
            | Address::Participant(_)
            | Address::System
            | Address::Federated { .. } => true,
            Address::Text(t) => !t.starts_with("scope:"),
            Address::Hierarchical(h) => {
                h.parent && !(h.children || h.ancestors || h.descendants || h.siblings)
            }
            _ => false,
        }
    }

    /// Whether this form reaches a group rather than one named recipient (requires
    /// `messaging.canBroadcast`).
    pub fn is_multicast(&self) -> bool {
        matches!(
            self,
            Address::Scope(_)
                | Address::Role { .. }
                | Address::Broadcast
                | Address::Participants(_)
        )
    }
}

/// Schema-only description of the address forms.
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum AddressSchema {
    /// An agent id (or `agent:<id>` / `scope:<id>`).
    Text(String),
    /// One agent.
    Direct { agent: AgentId },
    /// Several agents.
    Multi { agents: Vec<AgentId> },
    /// Members of a scope.
    Scope { scope: ScopeId },
    /// Agents with a role, optionally within a scope.
    Role {
        role: String,
        #[serde(default)]
        within: Option<ScopeId>,
    },
    /// Relatives of the sender's agent.
    Hierarchical {
        #[serde(default)]
        parent: Option<bool>,
        #[serde(default)]
        children: Option<bool>,
        #[serde(default)]
        ancestors: Option<bool>,
        #[serde(default)]
        descendants: Option<bool>,
        #[serde(default)]
        siblings: Option<bool>,
        #[serde(default)]
        depth: Option<u32>,
    },
    /// Every agent.
    Broadcast { broadcast: bool },
    /// The router itself.
    System { system: bool },
    /// One participant.
    Participant { participant: ParticipantId },
    /// A group of participants.
    Participants { participants: ParticipantGroup },
    /// An agent in another system.
    Federated { system: String, agent: AgentId },
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_form_parses() {
        let cases = [
            (json!("a1"), Address::Text("a1".into())),
            (json!({"agent": "a1"}), Address::Agent("a1".into())),
            (
                json!({"agents": ["a", "b"]}),
                Address::Agents(vec!["a".into(), "b".into()]),
            ),
            (json!({"scope": "s"}), Address::Scope("s".into())),
            (
                json!({"role": "w", "within": "s"}),
                Address::Role {
                    role: "w".into(),
                    within: Some("s".into()),
                },
            ),
            (json!({"broadcast": true}), Address::Broadcast),
            (json!({"system": true}), Address::System),
            (
                json!({"participant": "p"}),
                Address::Participant("p".into()),
            ),
            (
                json!({"participants": "clients"}),
                Address::Participants(ParticipantGroup::Clients),
            ),
            (
                json!({"system": "beta", "agent": "x"}),
                Address::Federated {
                    system: "beta".into(),
                    agent: "x".into(),
                },
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(Address::parse(&value).unwrap(), expected, "{value}");
        }
        match Address::parse(&json!({"descendants": true, "depth": 2})).unwrap() {
            Address::Hierarchical(h) => {
                assert!(h.descendants && !h.children);
                assert_eq!(h.depth, Some(2));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_addresses_are_invalid_params() {
        for value in [
            json!([{"agent": "a"}]),
            json!({"agents": []}),
            json!({"depth": 0, "children": true}),
            json!({"participants": "robots"}),
            json!({}),
            json!(5),
            json!(""),
        ] {
            let err = Address::parse(&value).unwrap_err();
            assert!(err.starts_with("invalid address"), "{value}: {err}");
        }
    }
}
