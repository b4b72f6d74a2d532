//! [`Client::call_tool`]: a typed call of a tool agent, such as an AIP tool the router's AIP
//! gateway stands for (`docs/aip.md`): a request whose payload is `{"tool", "arguments"}` and
//! whose reply is `{"isError", "errorMessage", "parts"}`. Any MAP agent that answers requests
//! in that shape can be called this way.
//!
//! Owns nothing.

use std::time::Duration;

use serde_json::{json, Value};

use crate::client::error::ClientError;
use crate::client::handle::Client;
use crate::protocol::message::Message;

/// What a tool answered.
#[derive(Debug, Clone)]
pub struct ToolResult {
    /// The tool reported an error (AIP `is_error`).
    pub is_error: bool,
    /// Its error message (AIP `error_message`), when it gave one.
    pub error_message: Option<String>,
    /// The content, as MAP payload parts (`{"kind": "text", "text"}`, `{"kind": "image" |
    /// "audio" | "embedded", "bytes": <base64>}`).
    pub parts: Vec<Value>,
    /// The reply as it arrived.
    pub message: Message,
}

impl ToolResult {
    /// The text parts, joined with newlines.
    pub fn text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Client {
    /// Calls tool `name` of the agent `tool` with `arguments` and waits up to `timeout` for its
    /// answer. A reply that is not in the tool shape is one text part (a string) or its JSON.
    ///
    /// # Errors
    /// As [`Client::request`]; a failure of the call itself (the tool's server unreachable, its
    /// gRPC error) is a [`ClientError::Rpc`] with the gateway's code and message.
    pub async fn call_tool(
        &self,
        tool: &str,
        name: &str,
        arguments: serde_json::Map<String, Value>,
        timeout: Duration,
    ) -> Result<ToolResult, ClientError> {
        let mut meta = serde_json::Map::new();
        meta.insert("protocol".into(), json!("aip"));
        meta.insert(
            "aip".into(),
            json!({ "kind": "tool_call", "toolName": name }),
        );
        let message = self
            .request_with(
                tool,
                json!({ "tool": name, "arguments": arguments }),
                meta,
                timeout,
            )
            .await?;
        let payload = message.payload_value().unwrap_or(Value::Null);
        if let Some(error) = payload.get("error") {
            return Err(ClientError::Rpc {
                code: crate::protocol::jsonrpc::ErrorCode(
                    error
                        .get("code")
                        .and_then(Value::as_i64)
                        .and_then(|c| i32::try_from(c).ok())
                        .unwrap_or(-32603),
                ),
                message: error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("tool call failed")
                    .to_owned(),
                data: error.get("data").cloned(),
            });
        }
        let parts = match payload.get("parts").and_then(Value::as_array) {
            Some(p) => p.clone(),
            None => match &payload {
                Value::String(s) => vec![json!({ "kind": "text", "text": s })],
                Value::Null => Vec::new(),
                other => vec![json!({ "kind": "text", "text": other.to_string() })],
            },
        };
        Ok(ToolResult {
            is_error: payload.get("isError").and_then(Value::as_bool) == Some(true),
            error_message: payload
                .get("errorMessage")
                .and_then(Value::as_str)
                .map(str::to_owned),
            parts,
            message,
        })
    }
}
