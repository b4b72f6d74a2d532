//! A remote agent's card, as far as calling it goes: where its JSON-RPC endpoint is, in which
//! A2A version, whether it streams, and what MAP shows of it (name, description, skills).
//!
//! Pure: reads card text, no I/O. A v1.0 card names its endpoints in
//! `supportedInterfaces[] {url, protocolBinding, protocolVersion}`; a v0.3 card has a top-level
//! `url` (transport `preferredTransport`, JSON-RPC when absent) and `protocolVersion: "0.3.x"`,
//! plus `additionalInterfaces[] {url, transport}`. We call JSON-RPC only, and prefer v1.0.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::gateway::a2a::wire::Version;
use crate::protocol::json::RawJson;

/// What the gateway needs from a remote agent's card.
#[derive(Debug, Clone)]
pub struct RemoteCard {
    /// `name`.
    pub name: String,
    /// `description`.
    pub description: Option<String>,
    /// `version` (the agent's own).
    pub agent_version: Option<String>,
    /// The JSON-RPC endpoint (absolute or relative to the card URL, as the card says).
    pub endpoint: String,
    /// The A2A version to speak there.
    pub version: Version,
    /// `capabilities.streaming`: call `SendStreamingMessage` / `message/stream`.
    pub streaming: bool,
    /// `skills`, verbatim (an empty array when absent).
    pub skills: RawJson,
}

/// Reads a card.
///
/// # Errors
/// Not JSON, no `name`, or no JSON-RPC interface of a version we speak.
pub fn parse(text: &[u8]) -> Result<RemoteCard, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Interface {
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        protocol_binding: Option<String>,
        #[serde(default)]
        protocol_version: Option<String>,
        /// v0.3 `additionalInterfaces[].transport`.
        #[serde(default)]
        transport: Option<String>,
    }
    #[derive(Deserialize, Default)]
    struct Capabilities {
        #[serde(default)]
        streaming: Option<bool>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Card {
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        description: Option<String>,
        #[serde(default)]
        version: Option<String>,
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        protocol_version: Option<String>,
        #[serde(default)]
        preferred_transport: Option<String>,
        #[serde(default)]
        supported_interfaces: Vec<Interface>,
        #[serde(default)]
        additional_interfaces: Vec<Interface>,
        #[serde(default)]
        capabilities: Option<Capabilities>,
        #[serde(default)]
        skills: Option<Box<RawValue>>,
    }
    let text = std::str::from_utf8(text).map_err(|_| "the card is not UTF-8".to_owned())?;
    // NB: serde's message may quote what it read: the answer is not echoed (module docs of
    // `http.rs`), only that it is not a card.
    let card: Card = serde_json::from_str(text)
        .map_err(|_| "the answer is not an A2A agent card (a JSON object)".to_owned())?;
    let name = card
        .name
        .filter(|n| !n.trim().is_empty())
        .ok_or("the card has no name")?;
    let jsonrpc = |i: &Interface| {
        i.protocol_binding
            .as_deref()
            .or(i.transport.as_deref())
            .is_none_or(|b| b.eq_ignore_ascii_case("JSONRPC"))
    };
    let major = |v: Option<&str>| v.map(|v| v.split('.').next().unwrap_or("").to_owned());
    let v1 = card
        .supported_interfaces
        .iter()
        .filter(|i| jsonrpc(i) && i.url.is_some())
        .find(|i| major(i.protocol_version.as_deref()).as_deref() == Some("1"));
    let v03 = card
        .supported_interfaces
        .iter()
        .filter(|i| jsonrpc(i) && i.url.is_some())
        .find(|i| {
            i.protocol_version
                .as_deref()
                .is_some_and(|v| v.starts_with("0.3"))
        });
    let legacy_top = card.url.as_ref().filter(|_| {
        card.preferred_transport
            .as_deref()
            .is_none_or(|t| t.eq_ignore_ascii_case("JSONRPC"))
            && card
                .protocol_version
                .as_deref()
                .is_none_or(|v| v.starts_with("0."))
    });
    let legacy_extra = card
        .additional_interfaces
        .iter()
        .find(|i| jsonrpc(i) && i.url.is_some());
    let (endpoint, version) = if let Some(i) = v1 {
        (i.url.clone(), Version::V1)
    } else if let Some(i) = v03 {
        (i.url.clone(), Version::V03)
    } else if let Some(u) = legacy_top {
        (Some(u.clone()), Version::V03)
    } else if let Some(i) = legacy_extra {
        (i.url.clone(), Version::V03)
    } else {
        return Err(
            "the card names no JSON-RPC endpoint of A2A 1.0 or 0.3 (supportedInterfaces[] with protocolBinding JSONRPC, or a v0.3 url)"
                .into(),
        );
    };
    let skills = card
        .skills
        .filter(|s| s.get().trim_start().starts_with('['))
        .map(|s| {
            RawJson::from_text(s.get())
                .unwrap_or_else(|_| RawJson::from_value(&serde_json::json!([])))
        })
        .unwrap_or_else(|| RawJson::from_value(&serde_json::json!([])));
    Ok(RemoteCard {
        name,
        description: card.description,
        agent_version: card.version,
        endpoint: endpoint.unwrap_or_default(),
        version,
        streaming: card
            .capabilities
            .unwrap_or_default()
            .streaming
            .unwrap_or(false),
        skills,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_cards_win() {
        let c = parse(
            br#"{"name":"e","supportedInterfaces":[
            {"url":"http://h/v03","protocolBinding":"JSONRPC","protocolVersion":"0.3"},
            {"url":"http://h/rest","protocolBinding":"HTTP+JSON","protocolVersion":"1.0"},
            {"url":"http://h/v1","protocolBinding":"JSONRPC","protocolVersion":"1.0"}],
            "capabilities":{"streaming":true},"skills":[{"id":"s","name":"S"}]}"#,
        )
        .unwrap();
        assert_eq!(c.endpoint, "http://h/v1");
        assert_eq!(c.version, Version::V1);
        assert!(c.streaming);
        assert_eq!(c.skills.get(), r#"[{"id":"s","name":"S"}]"#);
    }

    #[test]
    fn v03_cards() {
        let c = parse(
            br#"{"name":"e","url":"http://h/rpc","protocolVersion":"0.3.0","capabilities":{}}"#,
        )
        .unwrap();
        assert_eq!(c.endpoint, "http://h/rpc");
        assert_eq!(c.version, Version::V03);
        assert!(!c.streaming);
        assert_eq!(c.skills.get(), "[]");
        let c = parse(br#"{"name":"e","supportedInterfaces":[{"url":"http://h/x","protocolBinding":"JSONRPC","protocolVersion":"0.3"}]}"#).unwrap();
        assert_eq!(c.version, Version::V03);
    }

    #[test]
    fn unusable_cards() {
        assert!(parse(b"nope").is_err());
        assert!(parse(br#"{"url":"http://h"}"#)
            .unwrap_err()
            .contains("name"));
        assert!(parse(br#"{"name":"e","supportedInterfaces":[{"url":"http://h","protocolBinding":"GRPC","protocolVersion":"1.0"}]}"#)
            .unwrap_err()
            .contains("JSON-RPC"));
    }
}
