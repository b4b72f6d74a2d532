//! WebSocket transport (axum): one JSON-RPC message per text frame, no trailing newline.
//!
//! Adapts axum's `WebSocket` to the connection driver's frames. Frame limits are two-level: a
//! text frame above `max_frame_bytes` is answered with `-32600` and the connection continues;
//! a message above the hard limit (the WebSocket library's own cap, a multiple of the
//! configured limit) cannot be buffered at all, so the connection is closed with 1009.
//!
//! A text frame that is not UTF-8 fails the connection with 1007, as RFC 6455 §8.1 requires
//! (NDJSON, which has no such rule, answers `-32700` and carries on).
//!
//! Reading compatibility: the SDK writes bare JSON per frame; some tools write NDJSON into one
//! frame. A frame that holds several newline-separated objects is handled object by object.

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use futures::{FutureExt, SinkExt, StreamExt};

use crate::transport::admission::PeerInfo;
use crate::transport::connection::ConnectionOptions;
use crate::transport::connection::InFrame;
use crate::transport::connection::OutFrame;
use crate::transport::connection::TransportError;
use crate::transport::TransportContext;

/// What the WebSocket route needs.
#[derive(Debug, Clone)]
pub struct WsState {
    /// Router, method table, shutdown signal, connection tracker.
    pub ctx: TransportContext,
    /// Per-connection settings.
    pub options: ConnectionOptions,
}

/// The hard cap handed to the WebSocket library: beyond it a message cannot be read at all.
pub fn hard_limit(max_frame_bytes: usize) -> usize {
    max_frame_bytes
        .saturating_mul(4)
        .max(max_frame_bytes + (1 << 20))
}

/// Initial capacity of a connection's WebSocket read buffer, and the most one read takes. The
/// library's default (128 KiB, allocated up front) made an idle connection cost about 140 KiB
/// of router memory; requests are small, and the buffer still grows to hold a larger frame.
/// 4 KiB → 1 KiB took 3 KB off every idle session with no measurable cost in fan-out
/// (publishers' reads take about five requests each instead of twenty; docs/performance.md).
pub const READ_BUFFER_BYTES: usize = 1024;

/// The axum handler for `GET /` and `GET /map` with an upgrade.
///
/// The connection's [`PeerInfo`] (from the listener) stays with the socket: its admission
/// slot is released when the WebSocket ends, and its address keys the shared rate bucket.
pub async fn upgrade(
    ws: WebSocketUpgrade,
    peer: Option<Extension<PeerInfo>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    State(mut state): State<WsState>,
) -> Response {
    match linger(query.as_deref()) {
        Ok(l) => state.options.linger = l,
        Err(why) => {
            return (axum::http::StatusCode::BAD_REQUEST, format!("{why}\n")).into_response();
        }
    }
    let hard = hard_limit(state.options.max_frame_bytes);
    let peer = peer.map(|Extension(p)| p);
    state.options.peer = peer.as_ref().map(|p| p.addr);
    // NB: the connection runs in a task of its own, not in axum's upgrade task: that task
    // keeps room for the handshake's socket, settings and this callback beside whatever the
    // callback returns (about 1 KB per connection), and ends once the callback has spawned.
    // The captures are boxed for the same reason while the handshake runs.
    let captured = Box::new((state, peer));
    ws.max_message_size(hard)
        .max_frame_size(hard)
        .read_buffer_size(READ_BUFFER_BYTES)
        .on_upgrade(move |socket| {
            let (state, peer) = *captured;
            // NB: boxed: 40 bytes beside the connection's future would take its task past
            // an allocator class (tokio aligns tasks to 128 bytes).
            let peer = peer.map(Box::new);
            let serve = serve_socket(socket, state);
            tokio::spawn(serve.map(move |()| drop(peer)));
            std::future::ready(())
        })
}

/// `?linger=MS` (1 to 250): the connection asks its writer to hold events and messages up to
/// that long to write more of them at once (a dashboard that redraws a few times a second loses
/// nothing by it; answers to its requests are never held). Absent: `None`; anything else is
/// refused with why.
///
/// # Errors
/// A `linger` that is not a whole number of milliseconds from 1 to 250.
pub fn linger(query: Option<&str>) -> Result<Option<std::time::Duration>, String> {
    let Some(value) = query
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "linger")
        .map(|(_, v)| v)
    else {
        return Ok(None);
    };
    let max = crate::transport::connection::MAX_LINGER.as_millis() as u64;
    match value.parse::<u64>() {
        Ok(ms) if (1..=max).contains(&ms) => Ok(Some(std::time::Duration::from_millis(ms))),
        _ => Err(format!(
            "linger must be a whole number of milliseconds from 1 to {max}, not {:?}",
            value.chars().take(16).collect::<String>()
        )),
    }
}

/// Builds the connection's future. Not an `async fn`: an idle connection's task holds only
/// the session loop, not also the socket, stream and sink it was built from (an `async fn`
/// keeps room for them beside the loop, about 3 KB per connection).
fn serve_socket(socket: WebSocket, state: WsState) -> impl std::future::Future<Output = ()> + Send {
    let hard = hard_limit(state.options.max_frame_bytes);
    let (sink, stream) = socket.split();
    let stream = stream
        .map(move |msg| -> Vec<Result<InFrame, TransportError>> {
            match msg {
                Ok(Message::Text(text)) => split_frame(text.as_str()),
                Ok(Message::Binary(_)) => vec![Ok(InFrame::Binary)],
                Ok(Message::Ping(_)) | Ok(Message::Pong(_)) => vec![Ok(InFrame::Alive)],
                Ok(Message::Close(_)) => vec![Ok(InFrame::Close)],
                Err(e) => {
                    let text = e.to_string();
                    if text.contains("too long") || text.contains("limit") || text.contains("Space")
                    {
                        vec![Err(TransportError::Oversized { limit: hard })]
                    } else if text.contains("UTF-8") || text.contains("utf-8") {
                        vec![Err(TransportError::InvalidText)]
                    } else {
                        vec![Err(TransportError::Other(text))]
                    }
                }
            }
        })
        .flat_map(futures::stream::iter);
    let sink = sink.with(|frame: OutFrame| async move {
        Ok::<_, axum::Error>(match frame {
            OutFrame::Text(s) => Message::Text(s.into()),
            // The recipients' shared bytes, not a copy each (axum checks them for UTF-8 again:
            // its `Utf8Bytes` has no unchecked constructor).
            OutFrame::Shared(s) => {
                Message::Text(Utf8Bytes::try_from(s.into_bytes()).map_err(axum::Error::new)?)
            }
            OutFrame::Ping => Message::Ping(Default::default()),
            OutFrame::Close { code, reason } => Message::Close(Some(CloseFrame {
                code,
                reason: reason.into(),
            })),
        })
    });
    state
        .ctx
        .serve(Box::pin(stream), Box::pin(sink), state.options)
}

/// One frame normally holds one JSON value (possibly pretty-printed); a frame that is not one
/// value but several newline-separated ones is split.
fn split_frame(text: &str) -> Vec<Result<InFrame, TransportError>> {
    let trimmed = text.trim_end_matches(['\n', '\r']);
    if !trimmed.contains('\n')
        || serde_json::from_str::<&serde_json::value::RawValue>(trimmed).is_ok()
    {
        return vec![Ok(InFrame::Text(trimmed.to_owned()))];
    }
    trimmed
        .split('\n')
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(|line| Ok(InFrame::Text(line.to_owned())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(v: Vec<Result<InFrame, TransportError>>) -> Vec<String> {
        v.into_iter()
            .map(|f| match f {
                Ok(InFrame::Text(t)) => t,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn frames_with_newlines_are_split() {
        assert_eq!(texts(split_frame("{\"a\":1}\n")), vec!["{\"a\":1}"]);
        assert_eq!(
            texts(split_frame("{\"a\":1}\n\n{\"b\":2}\n")),
            vec!["{\"a\":1}", "{\"b\":2}"]
        );
        // Pretty-printed JSON is one value spread over lines: it stays whole.
        assert_eq!(texts(split_frame("{\n  \"a\": 1\n}")).len(), 1);
    }
}
