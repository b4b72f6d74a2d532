//! The MAMP 1.0 wire shapes (seed 000): the message envelope as it arrives, its checks, and
//! the cards. Pure: no I/O, no MAP calls.
//!
//! `content` and `metadata` are kept as the JSON text the sender wrote ([`RawValue`]): they
//! reach the MAP agent byte for byte (`content` as the payload, `metadata` under
//! `meta.mamp.metadata`).

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::gateway::wire::AgentUri;

/// The protocol identifier of MAMP 1.0.
pub const PROTOCOL: &str = "mamp/1.0";
/// The content block types MAMP 1.0 defines (and this gateway passes through).
pub const CONTENT_TYPES: &[&str] = &["text", "image", "code", "file"];
/// Longest `message_id` / `conversation_id` accepted.
const MAX_ID_BYTES: usize = 256;

/// `POST /mamp/v1/messages` body, as received.
#[derive(Debug, Deserialize)]
pub struct Envelope {
    /// Must be `"mamp/1.0"`.
    pub protocol: String,
    /// The sender's message id.
    pub message_id: String,
    /// Absent or null: a new conversation.
    #[serde(default)]
    pub conversation_id: Option<String>,
    /// The sender's `agent://` URI.
    pub from: String,
    /// The recipient's `agent://` URI.
    pub to: String,
    /// A string, or an array of content blocks.
    pub content: Box<RawValue>,
    /// An object (`timestamp`, ...).
    pub metadata: Box<RawValue>,
}

/// A checked envelope.
#[derive(Debug)]
pub struct Checked {
    /// The envelope.
    pub envelope: Envelope,
    /// `from`, parsed.
    pub from: AgentUri,
    /// `to`, parsed.
    pub to: AgentUri,
}

/// Why an envelope was refused (400): `(error, message)`.
pub type Refusal = (&'static str, String);

/// Parses and checks a body.
///
/// # Errors
/// The seed-style error code and a message naming the field.
pub fn check(body: &[u8]) -> Result<Checked, Refusal> {
    crate::protocol::json::refuse_lone_surrogate(body).map_err(|e| ("invalid_message", e))?;
    let envelope: Envelope = serde_json::from_slice(body)
        .map_err(|e| ("invalid_message", format!("not a MAMP 1.0 message: {e}")))?;
    if envelope.protocol != PROTOCOL {
        return Err((
            "unsupported_protocol",
            format!(
                "protocol `{}` is not supported (this gateway speaks {PROTOCOL})",
                envelope.protocol
            ),
        ));
    }
    if envelope.message_id.is_empty() || envelope.message_id.len() > MAX_ID_BYTES {
        return Err((
            "invalid_message",
            format!("message_id must be a non-empty string of at most {MAX_ID_BYTES} bytes"),
        ));
    }
    if let Some(c) = &envelope.conversation_id {
        if c.is_empty() || c.len() > MAX_ID_BYTES {
            return Err((
                "invalid_message",
                format!(
                    "conversation_id must be a non-empty string of at most {MAX_ID_BYTES} bytes"
                ),
            ));
        }
    }
    let from = AgentUri::parse(&envelope.from).ok_or_else(|| {
        (
            "invalid_message",
            format!("from `{}` is not an agent://HOST/ID URI", envelope.from),
        )
    })?;
    let to = AgentUri::parse(&envelope.to).ok_or_else(|| {
        (
            "invalid_message",
            format!("to `{}` is not an agent://HOST/ID URI", envelope.to),
        )
    })?;
    check_content(&envelope.content)?;
    if !envelope.metadata.get().trim_start().starts_with('{') {
        return Err(("invalid_message", "metadata must be an object".into()));
    }
    Ok(Checked { envelope, from, to })
}

/// `content`: a string, or a non-empty array of blocks each `{type: text|image|code|file}`
/// with that type's required field.
fn check_content(content: &RawValue) -> Result<(), Refusal> {
    let value: Value = serde_json::from_str(content.get())
        .map_err(|e| ("invalid_message", format!("content: {e}")))?;
    let blocks = match &value {
        Value::String(_) => return Ok(()),
        Value::Array(blocks) if !blocks.is_empty() => blocks,
        _ => {
            return Err((
                "invalid_message",
                "content must be a string or a non-empty array of content blocks".into(),
            ))
        }
    };
    for (i, block) in blocks.iter().enumerate() {
        let kind = block.get("type").and_then(Value::as_str).ok_or_else(|| {
            (
                "invalid_message",
                format!("content[{i}] must be an object with a string `type`"),
            )
        })?;
        let required = match kind {
            "text" => "text",
            "image" | "file" => "source",
            "code" => "code",
            other => {
                return Err((
                    "unsupported_content_type",
                    format!(
                        "content[{i}].type `{other}` is not one of {}",
                        CONTENT_TYPES.join(", ")
                    ),
                ))
            }
        };
        if block.get(required).is_none() {
            return Err((
                "invalid_message",
                format!("content[{i}] ({kind}) needs `{required}`"),
            ));
        }
    }
    Ok(())
}

/// The router's card (`GET /mamp/v1/card`).
pub fn router_card(
    agent_id: &str,
    name: &str,
    max_message_size: usize,
    require_auth: bool,
) -> Value {
    json!({
        "protocol": PROTOCOL,
        "agent_id": agent_id,
        "name": name,
        "description": "MAP router: its agents accept MAMP 1.0 messages at /mamp/v1/messages (to: agent://HOST/<agent id or name>)",
        "capabilities": {
            "content_types": CONTENT_TYPES,
            "max_message_size": max_message_size,
            "streaming": false,
            "async": true,
            "tools": [],
        },
        "access": {
            "public": !require_auth,
            "allowed_agents": ["*"],
            "require_auth": require_auth,
        },
    })
}

/// A MAP agent's card (`GET /mamp/v1/agents/{agentId}/card`).
pub fn agent_card(
    agent_id: &str,
    name: &str,
    description: Option<&str>,
    role: Option<&str>,
    max_message_size: usize,
    require_auth: bool,
) -> Value {
    let mut card = router_card(agent_id, name, max_message_size, require_auth);
    card["description"] = description
        .map(str::to_owned)
        .unwrap_or_else(|| format!("MAP agent {name}"))
        .into();
    if let Some(role) = role {
        card["capabilities"]["tools"] = json!([role]);
    }
    card
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(content: &str) -> Vec<u8> {
        format!(
            r#"{{"protocol":"mamp/1.0","message_id":"m1","from":"agent://a.com/x","to":"agent://b.com/y","content":{content},"metadata":{{"timestamp":"2026-03-04T10:00:00Z"}}}}"#
        )
        .into_bytes()
    }

    #[test]
    fn accepts_the_seeds_shapes() {
        assert!(check(&body(r#""纯文本消息""#)).is_ok());
        let blocks = r#"[{"type":"text","text":"t"},{"type":"image","source":{"type":"url","url":"https://x","media_type":"image/png"}},{"type":"code","language":"python","code":"def hello(): pass"},{"type":"file","name":"r.pdf","mime_type":"application/pdf","source":{"type":"url","url":"https://x"}}]"#;
        let c = check(&body(blocks)).unwrap();
        assert_eq!(c.envelope.content.get(), blocks);
        assert_eq!(c.to.id, "y");
    }

    #[test]
    fn refuses_what_is_wrong() {
        assert_eq!(check(b"{").unwrap_err().0, "invalid_message");
        assert_eq!(check(&body("42")).unwrap_err().0, "invalid_message");
        assert_eq!(check(&body("[]")).unwrap_err().0, "invalid_message");
        assert_eq!(
            check(&body(r#"[{"type":"video"}]"#)).unwrap_err().0,
            "unsupported_content_type"
        );
        assert_eq!(
            check(&body(r#"[{"type":"text"}]"#)).unwrap_err().0,
            "invalid_message"
        );
        let wrong = String::from_utf8(body(r#""x""#))
            .unwrap()
            .replace("mamp/1.0", "mamp/2.0");
        assert_eq!(
            check(wrong.as_bytes()).unwrap_err().0,
            "unsupported_protocol"
        );
        let wrong = String::from_utf8(body(r#""x""#))
            .unwrap()
            .replace("agent://a.com/x", "a.com/x");
        assert_eq!(check(wrong.as_bytes()).unwrap_err().0, "invalid_message");
    }
}
