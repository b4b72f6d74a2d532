//! [`Im`]: the IM gateway's state (its [`ImTable`]) and its one operation, [`Im::deliver`]: a
//! message from a session of the caller's (its live IM agent's, or its own) to an agent, as a
//! `map/send` with `meta.mail` in a new or given conversation. Used by `POST /gateway/send`
//! and by the `send` frame of `connect.rs`; failures are [`Failure`]s, which each edge renders
//! (an HTTP answer, an error frame).

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::client::{Client, ClientError};
use crate::gateway::context::{granted, resolve_target, GatewayContext};
use crate::gateway::im::table::ImTable;
use crate::gateway::wire::{Failure, GatewayError};
use crate::protocol::capabilities::Capability;
use crate::protocol::json::RawJson;
use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::methods::messaging::SendParams;
use crate::protocol::trace::TraceContext;

/// The IM gateway's state: the context and the table of IM URIs.
#[derive(Debug)]
pub struct Im {
    pub(crate) ctx: Arc<GatewayContext>,
    pub(crate) table: Arc<ImTable>,
}

/// 404 for an agent URI nobody (that the caller may see) knows.
pub(crate) fn unknown_agent(uri: &str) -> Failure {
    Failure::new(
        StatusCode::NOT_FOUND,
        "agent_not_found",
        format!("Agent {uri} not found"),
    )
}

/// 403 for a grant the sending session lacks.
fn lacks(client: &Client, cap: Capability) -> Failure {
    let who = client.session().and_then(|s| s.principal).map_or_else(
        || "this caller".to_owned(),
        |p| format!("principal {}", p.id),
    );
    Failure::forbidden(format!("Permission denied: {who} lacks {}", cap.path()))
}

/// What one send asks for: the target URI, the content (verbatim), the conversation (`None`:
/// a new one) and the request's trace context (`gateway::trace`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sending<'a> {
    pub to: &'a str,
    pub content: &'a RawValue,
    pub conversation: Option<&'a str>,
    pub trace: Option<&'a TraceContext>,
}

impl Im {
    /// The state of a new IM gateway.
    pub fn new(ctx: Arc<GatewayContext>) -> Self {
        Self {
            table: Arc::clone(&ctx.im_table),
            ctx,
        }
    }

    /// Sends `sending.content` through `client` (a session of the caller's: its IM agent's, or
    /// its own), shown as `from`, to `sending.to` (as `client` may see it) in
    /// `sending.conversation` (a new one when `None`), with the request's trace context in its
    /// `meta` (and the new conversation's `mail/create` `_meta`): `(conversation id, MAP message
    /// id)`. Nothing is created unless the session may send (`messaging.canSend`) and, for a new
    /// conversation, create one (`mail.canCreate`).
    ///
    /// # Errors
    /// 404 for an unknown or invisible target or conversation; 403 for a missing grant; the
    /// router's other refusals mapped by [`Failure`].
    pub(crate) async fn deliver(
        &self,
        client: &Client,
        from: &str,
        headers: &HeaderMap,
        sending: Sending<'_>,
    ) -> Result<(String, String), Failure> {
        let Sending {
            to,
            content,
            conversation,
            trace,
        } = sending;
        let target = resolve_target(&self.ctx, client, to, headers)
            .await?
            .ok_or_else(|| unknown_agent(to))?;
        self.ctx.check_payload(content.get())?;
        if !granted(client, Capability::CanSend) {
            return Err(lacks(client, Capability::CanSend));
        }
        let conversation = match conversation {
            Some(c) => c.to_owned(),
            None => {
                if !granted(client, Capability::CanCreateConversations) {
                    return Err(lacks(client, Capability::CanCreateConversations));
                }
                let created = client
                    .call_raw(
                        "mail/create",
                        crate::gateway::trace::with_meta(
                            json!({
                                "initialParticipants": [{ "id": target.id }],
                                "metadata": { "protocol": "im", "im": { "from": from, "to": to } },
                            }),
                            trace,
                        ),
                    )
                    .await
                    .map_err(|e| Failure::from(GatewayError::Map(e)))?;
                created
                    .pointer("/conversation/id")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        Failure::new(
                            StatusCode::BAD_GATEWAY,
                            "map_error",
                            "mail/create answered without an id",
                        )
                    })?
            }
        };
        let mut meta = serde_json::Map::new();
        meta.insert("mail".into(), json!({ "conversationId": conversation }));
        meta.insert("protocol".into(), json!("im"));
        meta.insert("im".into(), json!({ "from": from, "to": to }));
        crate::gateway::trace::insert_meta(&mut meta, trace);
        let params = SendParams {
            to: RawJson::from(json!({ "agent": target.id })),
            payload: Some(RawJson::from_text(content.get()).unwrap_or_else(|_| RawJson::null())),
            meta: Some(RawJson::from(meta)),
        };
        let mut sent = client.send_with(params.clone()).await;
        if matches!(&sent, Err(e) if e.code() == Some(ErrorCode::MAIL_NOT_A_PARTICIPANT)) {
            let joined = client
                .call_raw("mail/join", json!({ "conversationId": conversation }))
                .await;
            if joined.is_ok() {
                sent = client.send_with(params).await;
            }
        }
        match sent {
            Ok(r) => {
                // A reply to it reaches `from` in this conversation (threads.rs).
                self.ctx
                    .threads
                    .record(r.message_id.as_str(), &conversation);
                Ok((conversation, r.message_id.to_string()))
            }
            Err(e) => Err(send_failure(e, &conversation, to)),
        }
    }
}

/// A refused `map/send` in the seeds' terms.
fn send_failure(e: ClientError, conversation: &str, to: &str) -> Failure {
    match e.code() {
        Some(ErrorCode::MAIL_CONVERSATION_NOT_FOUND | ErrorCode::MAIL_NOT_A_PARTICIPANT) => {
            Failure::new(
                StatusCode::NOT_FOUND,
                "conversation_not_found",
                format!("Conversation {conversation} not found"),
            )
        }
        Some(ErrorCode::MAIL_CONVERSATION_CLOSED) => Failure::new(
            StatusCode::CONFLICT,
            "conversation_closed",
            format!("Conversation {conversation} is closed"),
        ),
        Some(ErrorCode::AGENT_NOT_FOUND) => unknown_agent(to),
        _ => Failure::from(GatewayError::Map(e)),
    }
}
