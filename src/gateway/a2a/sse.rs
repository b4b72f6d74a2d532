//! The A2A streams (`SendStreamingMessage`, `SubscribeToTask` and their v0.3 names) as
//! Server-Sent Events: every `data:` line is a whole JSON-RPC response carrying the request's
//! id, whose `result` is the task first (`{task}` in v1.0, a `kind: "task"` object in v0.3),
//! then one `statusUpdate` / `artifactUpdate` per update of the task.
//!
//! Owns: the per-stream pump task. It sends the task as the gateway read it, then each update
//! from the [`Feed`](super::feed::Feed) watcher whose `meta.a2a.seq` is newer (so none is sent
//! twice, although MAP may emit two events for one update), and ends after the update that
//! leaves the task terminal or interrupted (input-required, auth-required; a `SubscribeToTask`
//! stream only at a terminal state), at shutdown, or when the caller goes away. An error of a
//! streaming method goes to a v0.3 caller as a one-event stream ([`error_response`]). A comment line every [`KEEP_ALIVE`] keeps proxies from closing an
//! idle stream.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, watch};

use crate::gateway::a2a::error::A2aError;
use crate::gateway::a2a::frame::{error_frame, result_frame};
use crate::gateway::a2a::record::Record;
use crate::gateway::a2a::record::Snapshot;
use crate::gateway::a2a::wire::{self, Update, Version};

/// Interval of the keep-alive comment on a quiet stream.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Frames buffered between the pump and the HTTP body. The pump waits when it is full, and its
/// watcher's queue then fills, which ends a stream whose reader has stalled.
const BODY_QUEUE: usize = 16;

/// One stream to serve.
#[derive(Debug)]
pub struct Stream {
    /// The request id, echoed in every frame.
    pub id: Box<RawValue>,
    /// The version of the request.
    pub version: Version,
    /// The task.
    pub task_id: String,
    /// The task as first read (or created).
    pub first: Record,
    /// Its changes from then on.
    pub watcher: mpsc::Receiver<Snapshot>,
    /// History messages per task frame.
    pub history_length: Option<u32>,
    /// The server's shutdown signal.
    pub shutdown: watch::Receiver<bool>,
    /// Whether the stream ends only at a terminal state (`SubscribeToTask`: a subscriber to an
    /// interrupted task waits for what comes next), rather than also at an interrupted one
    /// (`SendStreamingMessage`, whose caller must answer).
    pub until_terminal: bool,
}

fn data(frame: &str) -> Bytes {
    Bytes::from(format!("data: {frame}\n\n"))
}

fn sse_headers() -> [(header::HeaderName, HeaderValue); 2] {
    [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ]
}

/// A stream that carries only the error `e` (one `data:` event, then the end).
pub fn error_response(id: &RawValue, e: &A2aError, v: Version) -> Response {
    // As a stream (chunked, then the end), as every other event stream here.
    let event = data(&error_frame(Some(id), e, v));
    let body = Body::from_stream(futures::stream::once(
        async move { Ok::<_, Infallible>(event) },
    ));
    (e.status, sse_headers(), body).into_response()
}

/// Starts the pump and answers with its output.
pub fn respond(stream: Stream) -> Response {
    let (tx, mut rx) = mpsc::channel::<Bytes>(BODY_QUEUE);
    tokio::spawn(pump(stream, tx));
    let body = Body::from_stream(futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|b| b.map(Ok::<_, Infallible>))
    }));
    (StatusCode::OK, sse_headers(), body).into_response()
}

async fn pump(s: Stream, tx: mpsc::Sender<Bytes>) {
    let Stream {
        id,
        version,
        task_id,
        first,
        mut watcher,
        history_length,
        mut shutdown,
        until_terminal,
    } = s;
    let ends = |state: wire::TaskState| {
        if until_terminal {
            state.is_terminal()
        } else {
            state.ends_stream()
        }
    };
    let frame = result_frame(
        &id,
        &wire::task_result(version, &first.view(&task_id), history_length),
    );
    if tx.send(data(&frame)).await.is_err() || ends(first.state) {
        return;
    }
    let mut seen = first.seq;
    let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
    keep_alive.reset();
    loop {
        tokio::select! {
            next = watcher.recv() => {
                let Some(snapshot) = next else {
                    // The watcher was dropped as too slow, or the feed ended: say so, and end.
                    let e = A2aError::internal("the task's update stream ended; resubscribe (SubscribeToTask) to continue");
                    let _ = tx.send(data(&error_frame(Some(&id), &e, version))).await;
                    return;
                };
                if snapshot.seq() <= seen {
                    continue;
                }
                seen = snapshot.seq();
                let record = snapshot.record;
                let update = record.update.clone().unwrap_or_else(Update::status);
                let view = record.view(&task_id);
                // An agent that answered with a message: that message is the last event.
                let result = wire::direct_answer(version, &view, record.message_only)
                    .filter(|_| update.artifact.is_none())
                    .unwrap_or_else(|| wire::update_json(version, &view, &update));
                let frame = result_frame(&id, &result);
                if tx.send(data(&frame)).await.is_err() {
                    return;
                }
                if update.artifact.is_none() && ends(record.state) {
                    return;
                }
            }
            _ = keep_alive.tick() => {
                if tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                    return;
                }
            }
            _ = shutdown.changed() => return,
            () = tx.closed() => return,
        }
    }
}
