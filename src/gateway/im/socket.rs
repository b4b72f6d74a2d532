//! One IM WebSocket's outbound side: a bounded queue of frames and the one writer task that
//! owns the sink, so a peer that stops reading is noticed and dropped, never waited on
//! (docs/gateways.md, "The connection"):
//!
//! - the queue holds at most `gateways.im.send_queue` frames; a frame that finds no room
//!   within `write_timeout_ms` means the peer is not reading ([`Outbound::send`] fails);
//! - each write to the socket must finish within `write_timeout_ms`, else the writer gives up
//!   and the connection ends ([`Outbound::dead`] resolves);
//! - closing queues a close frame with its code behind what is queued, and waits (bounded) for
//!   the writer to send it; a writer that cannot is dropped with the TCP connection.
//!
//! Also the close codes of what the socket's reader saw go wrong ([`close_for`]): 1009 for a
//! frame above `max_frame_bytes`, 1007 for a text frame that is not UTF-8, as MAP's own
//! WebSocket answers (docs/compatibility.md §1).
//!
//! Owns the sink and the queue; lives as long as the connection.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message as WsMessage, WebSocket};
use futures::stream::SplitSink;
use futures::SinkExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Close code: the peer broke a rule of the connection (here: it stopped reading).
pub const CLOSE_POLICY: u16 = 1008;
/// Close code: a frame above the size limit.
pub const CLOSE_TOO_BIG: u16 = 1009;
/// Close code: a text frame that is not UTF-8.
pub const CLOSE_INVALID_TEXT: u16 = 1007;
/// Close code: the server's side failed (its MAP session ended).
pub const CLOSE_INTERNAL: u16 = 1011;

enum Item {
    Frame(WsMessage),
    Close(u16, String),
}

/// The reader's handle on the writer.
#[derive(Debug)]
pub struct Outbound {
    tx: mpsc::Sender<Item>,
    writer: JoinHandle<()>,
    write_timeout: Duration,
}

impl std::fmt::Debug for Item {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Item::Frame(_) => f.write_str("Frame"),
            Item::Close(code, _) => write!(f, "Close({code})"),
        }
    }
}

/// The peer does not take what is sent to it (or the connection is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotReading;

impl Outbound {
    /// Starts the writer over `sink`.
    pub fn start(
        sink: SplitSink<WebSocket, WsMessage>,
        queue: usize,
        write_timeout: Duration,
    ) -> Self {
        let (tx, rx) = mpsc::channel(queue.max(1));
        let writer = tokio::spawn(write_loop(sink, rx, write_timeout));
        Self {
            tx,
            writer,
            write_timeout,
        }
    }

    /// Queues `frame`, waiting at most the write timeout for room.
    ///
    /// # Errors
    /// [`NotReading`]: no room came (the peer stopped reading), or the writer ended.
    pub async fn send(&self, frame: WsMessage) -> Result<(), NotReading> {
        match tokio::time::timeout(self.write_timeout, self.tx.send(Item::Frame(frame))).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(NotReading),
        }
    }

    /// Queues a JSON text frame (as [`Outbound::send`]).
    ///
    /// # Errors
    /// As [`Outbound::send`].
    pub async fn json(&self, value: &serde_json::Value) -> Result<(), NotReading> {
        self.send(WsMessage::Text(value.to_string().into())).await
    }

    /// Resolves when the writer gave up (a write took longer than the write timeout, or the
    /// socket failed).
    pub async fn dead(&self) {
        self.tx.closed().await;
    }

    /// Ends the connection: a close frame with `code` behind what is queued (when `code` is
    /// given and there is room), then waits at most the write timeout for the writer to
    /// finish; a writer still stuck then is dropped with the socket.
    pub async fn close(self, code: Option<u16>, reason: &str) {
        if let Some(code) = code {
            let _ = self.tx.try_send(Item::Close(code, reason.to_owned()));
        }
        drop(self.tx);
        let abort = self.writer.abort_handle();
        if tokio::time::timeout(self.write_timeout, self.writer)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}

async fn write_loop(
    mut sink: SplitSink<WebSocket, WsMessage>,
    mut rx: mpsc::Receiver<Item>,
    limit: Duration,
) {
    while let Some(item) = rx.recv().await {
        let (frame, last) = match item {
            Item::Frame(f) => (f, false),
            Item::Close(code, reason) => (
                WsMessage::Close(Some(CloseFrame {
                    code,
                    reason: reason.into(),
                })),
                true,
            ),
        };
        match tokio::time::timeout(limit, sink.send(frame)).await {
            Ok(Ok(())) if !last => {}
            _ => break,
        }
    }
    // Dropping the receiver tells the reader (`Outbound::dead`).
    drop(rx);
    let _ = tokio::time::timeout(limit, sink.close()).await;
}

/// The close code and reason for a failed read of the socket (axum's error, whose text is
/// tungstenite's): 1009 above the size limit, 1007 for text that is not UTF-8, else none (the
/// connection is broken; there is nobody to tell).
pub fn close_for(error: &axum::Error, max: usize) -> Option<(u16, String)> {
    let text = error.to_string();
    if text.contains("too long") || text.contains("limit") || text.contains("Space") {
        Some((CLOSE_TOO_BIG, format!("frame exceeds {max} bytes")))
    } else if text.contains("UTF-8") || text.contains("utf-8") {
        Some((CLOSE_INVALID_TEXT, "text frame is not valid UTF-8".into()))
    } else {
        None
    }
}
