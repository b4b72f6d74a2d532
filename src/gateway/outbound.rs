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
//! HTTP: hyper's own HTTP/1 client connection (`hyper::client::conn::http1`) over a tokio
//! `TcpStream`, one connection per message: hyper is already built for the server, so this
//! adds no crate (docs/architecture.md, "Dependencies and why"). `http://` only for now.

use axum::body::Body;
use axum::http::{header, Method, Request};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::net::TcpStream;

use crate::gateway::config::RemoteMamp;
use crate::gateway::context::GatewayContext;
use crate::gateway::wire::iso8601;
use crate::protocol::message::Message;

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

/// POSTs `message` to `remote` and records the conversation mapping from the answer. Failures
/// are logged: the MAP side already saw the message delivered to the remote's MAP agent.
pub async fn deliver(ctx: &GatewayContext, remote: &RemoteMamp, message: &Message) {
    match post(ctx, remote, message).await {
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

async fn post(ctx: &GatewayContext, remote: &RemoteMamp, message: &Message) -> Result<(), String> {
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
        http_post(&remote.endpoint, remote.token.as_deref(), body),
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

/// `endpoint` → (`host:port`, path of the messages URL).
fn split_endpoint(endpoint: &str) -> Result<(String, String), String> {
    let rest = endpoint
        .strip_prefix("http://")
        .ok_or_else(|| format!("endpoint `{endpoint}` is not http://"))?;
    let (authority, path) = match rest.split_once('/') {
        Some((a, p)) => (a, format!("/{p}")),
        None => (rest, String::new()),
    };
    if authority.is_empty() {
        return Err(format!("endpoint `{endpoint}` has no host"));
    }
    let authority = if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let path = if path.ends_with("/mamp/v1/messages") {
        path
    } else {
        format!("{}/mamp/v1/messages", path.trim_end_matches('/'))
    };
    Ok((authority, path))
}

/// One POST on a fresh connection; the answer's body when the status is 2xx.
async fn http_post(endpoint: &str, token: Option<&str>, body: Vec<u8>) -> Result<Vec<u8>, String> {
    let (authority, path) = split_endpoint(endpoint)?;
    let stream = TcpStream::connect(&authority)
        .await
        .map_err(|e| format!("connect {authority}: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Body>(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(&path)
        .header(header::HOST, &authority)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(Body::from(body))
        .map_err(|e| format!("request: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = response.status();
    let bytes = axum::body::to_bytes(Body::new(response.into_body()), MAX_ANSWER_BYTES)
        .await
        .map_err(|e| format!("read answer: {e}"))?;
    driver.abort();
    if !status.is_success() {
        return Err(format!(
            "status {status}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
        ));
    }
    Ok(bytes.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            split_endpoint("http://127.0.0.1:9/").unwrap(),
            ("127.0.0.1:9".into(), "/mamp/v1/messages".into())
        );
        assert_eq!(
            split_endpoint("http://h/base/mamp/v1/messages").unwrap(),
            ("h:80".into(), "/base/mamp/v1/messages".into())
        );
        assert!(split_endpoint("https://h/").is_err());
    }
}
