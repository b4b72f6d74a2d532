//! Outbound MAMP: a MAP agent's message to a configured remote MAMP agent becomes a
//! `POST <endpoint>/mamp/v1/messages` with the seed's envelope.
//!
//! The conversation id is kept as the seed's `send_to_agent` keeps it: the first message of
//! one of our conversations goes without `conversation_id`, the remote answers with its own,
//! and later messages of the same conversation carry that one (`PeerTable::map_conversation`).
//! Our conversation is the message's `meta.mail.conversationId`, else that of the message it
//! answers (`threads.rs`: a reply is threaded into the conversation it answers); a message
//! with neither belongs to the sender's direct conversation with the remote. A conversation
//! the remote started here is known to it by our id, which `mamp/mod.rs` records as "theirs".
//!
//! HTTP: the gateways' one outbound client (`gateway::egress::client`), one connection per
//! message, to the endpoint's messages URL as parsed and allowed by the endpoint's own origin
//! (the operator configured it: its host's addresses may be loopback or private, and nobody
//! else's are reached through it), every wait bounded by `[gateways.mamp] request_timeout`.
//! `http://` only for now (the config check says so too). Trace context: the POST carries
//! `traceparent` / `tracestate`, the router's span of the delivery when the `map/message` frame
//! names one, else the message's own valid `meta.traceparent` (`gateway::trace`).

use std::time::Duration;

use axum::http::Method;
use bytes::Bytes;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::gateway::config::RemoteMamp;
use crate::gateway::context::GatewayContext;
use crate::gateway::egress::client::{self, Body, Waits};
use crate::gateway::egress::{AllowList, Allowed};
use crate::gateway::wire::iso8601;
use crate::protocol::message::Message;
use crate::protocol::trace::TraceContext;

/// Largest answer read from a remote MAMP server.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// The seed's envelope, with `content` and `metadata` spliced in as JSON text.
#[derive(Serialize)]
struct Envelope<'a> {
    protocol: &'a str,
    message_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    conversation_id: Option<&'a str>,
    from: &'a str,
    to: &'a str,
    content: &'a RawValue,
    metadata: serde_json::Value,
}

/// POSTs `message` to `remote` (with `trace` as `traceparent` / `tracestate` headers) and
/// records the conversation mapping from the answer. Failures are logged: the MAP side already
/// saw the message delivered to the remote's MAP agent.
pub async fn deliver(
    ctx: &GatewayContext,
    remote: &RemoteMamp,
    message: &Message,
    trace: Option<&TraceContext>,
) {
    match post(ctx, remote, message, trace).await {
        Ok(()) => {}
        Err(why) => tracing::warn!(
            remote = %remote.uri,
            message = %message.id,
            error = %why,
            "outbound MAMP message failed"
        ),
    }
}

/// The seed's envelope of `message` to `to`, in `conversation_id` (what the recipient calls
/// the conversation); `ours`: our conversation id, shown as `metadata.map_conversation_id`.
pub fn envelope(
    ctx: &GatewayContext,
    to: &str,
    message: &Message,
    conversation_id: Option<&str>,
    ours: Option<&str>,
) -> Result<Vec<u8>, String> {
    let empty = RawValue::from_string("\"\"".into()).map_err(|e| e.to_string())?;
    let content = message.payload.as_ref().map_or(&*empty, |p| p.as_raw());
    let from = ctx.uri_of(&message.from);
    let mut metadata = serde_json::json!({ "timestamp": iso8601(message.timestamp) });
    if let Some(ours) = ours {
        metadata["map_conversation_id"] = ours.into();
    }
    let envelope = Envelope {
        protocol: "mamp/1.0",
        message_id: message.id.as_str(),
        conversation_id,
        from: &from,
        to,
        content,
        metadata,
    };
    serde_json::to_vec(&envelope).map_err(|e| e.to_string())
}

async fn post(
    ctx: &GatewayContext,
    remote: &RemoteMamp,
    message: &Message,
    trace: Option<&TraceContext>,
) -> Result<(), String> {
    let threaded = ctx.threads.conversation_of(message);
    let local_conv = threaded
        .clone()
        .unwrap_or_else(|| format!("direct:{}", message.from));
    let theirs = ctx.peers.theirs(&remote.uri, &local_conv);
    let body = envelope(
        ctx,
        &remote.uri,
        message,
        theirs.as_deref(),
        threaded.as_deref(),
    )?;
    let limit = ctx.settings.mamp.request_timeout();
    let answer = tokio::time::timeout(
        limit,
        http_post(
            &remote.endpoint,
            remote.token.as_deref(),
            trace,
            body,
            limit,
        ),
    )
    .await
    .map_err(|_| format!("no answer within {limit:?}"))??;
    let answer: serde_json::Value =
        serde_json::from_slice(&answer).map_err(|e| format!("answer is not JSON: {e}"))?;
    if let Some(conv) = answer.get("conversation_id").and_then(|v| v.as_str()) {
        if theirs.as_deref() != Some(conv) {
            ctx.peers.map_conversation(&remote.uri, &local_conv, conv);
        }
    }
    Ok(())
}

/// The messages URL of `endpoint` (`<endpoint>/mamp/v1/messages`, or `endpoint` itself when it
/// already ends so), parsed and allowed by the endpoint's own origin: the operator named this
/// host, so its addresses may be private or loopback (`gateway::egress`).
fn messages_url(endpoint: &str) -> Result<Allowed, String> {
    let mut url = url::Url::parse(endpoint).map_err(|e| format!("endpoint `{endpoint}`: {e}"))?;
    if url.scheme() != "http" {
        return Err(format!("endpoint `{endpoint}` is not http://"));
    }
    if !url.path().ends_with("/mamp/v1/messages") {
        let path = format!("{}/mamp/v1/messages", url.path().trim_end_matches('/'));
        url.set_path(&path);
    }
    AllowList::origin_of(endpoint)
        .and_then(|list| list.check_parsed(url).map_err(|e| e.to_string()))
        .map_err(|e| format!("endpoint `{endpoint}`: {e}"))
}

/// One POST through the gateways' client, every wait bounded by `limit`; the answer's body
/// (at most [`MAX_ANSWER_BYTES`]) when the status is 2xx.
async fn http_post(
    endpoint: &str,
    token: Option<&str>,
    trace: Option<&TraceContext>,
    body: Vec<u8>,
    limit: Duration,
) -> Result<Bytes, String> {
    let target = messages_url(endpoint)?;
    let mut headers = crate::gateway::trace::headers(trace);
    headers.extend(token.map(|t| ("authorization", format!("Bearer {t}"))));
    let body = Body {
        bytes: Bytes::from(body),
        content_type: "application/json",
    };
    let waits = Waits {
        connect: limit,
        head: limit,
    };
    let answer = client::send(&target, Method::POST, &headers, Some(body), waits)
        .await
        .map_err(|e| format!("{}: {e}", target.as_str()))?;
    let status = answer.status();
    let bytes = answer
        .body(MAX_ANSWER_BYTES, limit)
        .await
        .map_err(|e| format!("read answer: {e}"))?;
    if !status.is_success() {
        return Err(format!(
            "status {status}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let url = |e: &str| messages_url(e).map(|a| a.as_str().to_owned());
        assert_eq!(
            url("http://127.0.0.1:9/").unwrap(),
            "http://127.0.0.1:9/mamp/v1/messages"
        );
        assert_eq!(
            url("http://h/base/mamp/v1/messages").unwrap(),
            "http://h/base/mamp/v1/messages"
        );
        assert_eq!(
            url("http://h/base/").unwrap(),
            "http://h/base/mamp/v1/messages"
        );
        assert!(url("https://h/").is_err());
        assert!(url("http://u@h/").is_err());
        assert!(url("h:80").is_err());
    }
}
