//! [`Im`]: the IM gateway's state (the live IM sessions by URI, to send as them) and its one
//! operation, [`Im::deliver`]: a message from an IM agent (or any URI) to an agent, as a
//! `map/send` with `meta.mail` in a new or given conversation. Used by `POST /gateway/send`
//! and by the `send` frame of `connect.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::client::{Client, ClientError};
use crate::gateway::context::{resolve, GatewayContext};
use crate::gateway::peers;
use crate::gateway::wire::{error_response, gateway_error_response, AgentUri, GatewayError};
use crate::protocol::json::RawJson;
use crate::protocol::methods::messaging::SendParams;

/// The IM gateway's state: the context and the live IM sessions by URI.
#[derive(Debug)]
pub struct Im {
    pub(crate) ctx: Arc<GatewayContext>,
    pub(crate) sessions: Mutex<HashMap<String, Client>>,
}

/// 404 for an agent URI nobody knows.
pub(crate) fn unknown_agent(uri: &str) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "agent_not_found",
        &format!("Agent {uri} not found"),
    )
}

impl Im {
    /// The state of a new IM gateway.
    pub fn new(ctx: Arc<GatewayContext>) -> Self {
        Self {
            ctx,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// Sends `content` from `from` to `to` in `conversation` (a new one when `None`):
    /// `(conversation id, MAP message id)`.
    pub(crate) async fn deliver(
        &self,
        headers: &HeaderMap,
        from: &str,
        to: &str,
        content: &RawValue,
        conversation: Option<&str>,
    ) -> Result<(String, String), Response> {
        let ctx = &self.ctx;
        let service = ctx
            .service()
            .await
            .map_err(|e| gateway_error_response(&e))?;
        let target = match AgentUri::parse(to) {
            Some(uri) => match service.client.get_agent(to).await {
                Ok(a) => Some(a),
                Err(_) if ctx.is_local_host(&uri.host, headers) => {
                    resolve(&service.client, &uri.id).await
                }
                _ => None,
            },
            None if !to.is_empty() => resolve(&service.client, to).await,
            None => None,
        }
        .ok_or_else(|| unknown_agent(to))?;
        let live = self.sessions.lock().ok().and_then(|s| s.get(from).cloned());
        if live.is_none() && service.directory.was_im(from) {
            // Its MAP agent waits, orphaned, for the agent to connect again: a peer session
            // must not take it over.
            return Err(error_response(
                StatusCode::CONFLICT,
                "agent_offline",
                &format!(
                    "{from} is an IM agent that is not connected: it sends only while connected"
                ),
            ));
        }
        let client = match live {
            Some(c) => c,
            None => {
                peers::get_or_open(ctx, from, "im")
                    .await
                    .map_err(|e| gateway_error_response(&e))?
                    .client
            }
        };
        let conversation = match conversation {
            Some(c) => c.to_owned(),
            None => {
                let created = client
                    .call_raw(
                        "mail/create",
                        json!({
                            "initialParticipants": [{ "id": target.id }],
                            "metadata": { "protocol": "im", "im": { "from": from, "to": to } },
                        }),
                    )
                    .await
                    .map_err(|e| gateway_error_response(&GatewayError::Map(e)))?;
                created
                    .pointer("/conversation/id")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        error_response(
                            StatusCode::BAD_GATEWAY,
                            "map_error",
                            "mail/create answered without an id",
                        )
                    })?
            }
        };
        let params = SendParams {
            to: RawJson::from(json!({ "agent": target.id })),
            payload: Some(RawJson::from_text(content.get()).unwrap_or_else(|_| RawJson::null())),
            meta: Some(RawJson::from(json!({
                "mail": { "conversationId": conversation },
                "protocol": "im",
                "im": { "from": from, "to": to },
            }))),
        };
        let mut sent = client.send_with(params.clone()).await;
        if matches!(&sent, Err(ClientError::Rpc { code, .. }) if code.0 == 10002) {
            let joined = client
                .call_raw("mail/join", json!({ "conversationId": conversation }))
                .await;
            if joined.is_ok() {
                sent = client.send_with(params).await;
            }
        }
        match sent {
            Ok(r) => Ok((conversation, r.message_id.to_string())),
            Err(ClientError::Rpc { code, .. }) if code.0 == 10000 || code.0 == 10002 => {
                Err(error_response(
                    StatusCode::NOT_FOUND,
                    "conversation_not_found",
                    &format!("Conversation {conversation} not found"),
                ))
            }
            Err(ClientError::Rpc { code, .. }) if code.0 == 2001 => Err(unknown_agent(to)),
            Err(e) => Err(gateway_error_response(&GatewayError::Map(e))),
        }
    }
}
