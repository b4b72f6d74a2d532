//! In-process transport: a participant inside the same program talks to the router over
//! bounded channels, with no socket and no serialization beyond the JSON frames themselves.
//!
//! The router side runs the same connection driver as every other transport, so dispatch,
//! ordering, back-pressure and shutdown behave exactly as over WebSocket. Only the timers
//! differ: no ping, no idle timeout and no handshake timeout (the peer is this program).

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};

use super::connection::{ConnectionOptions, InFrame, OutFrame};
use super::TransportContext;

/// Frames buffered in each direction of an in-process link.
pub const LINK_CAPACITY: usize = 256;

/// The participant's end of an in-process connection: send JSON-RPC frames on `tx`, read
/// responses and notifications from `rx`. Dropping `tx` is a clean disconnect; `rx` ends when
/// the router closes the connection.
#[derive(Debug)]
pub struct InProcessLink {
    /// Frames to the router.
    pub tx: mpsc::Sender<String>,
    /// Frames from the router.
    pub rx: mpsc::Receiver<String>,
}

/// Opens an in-process connection served by a task spawned on the current runtime.
pub fn connect(ctx: &TransportContext, opts: ConnectionOptions) -> InProcessLink {
    let (client_tx, server_rx) = mpsc::channel::<String>(LINK_CAPACITY);
    let (server_tx, client_rx) = mpsc::channel::<String>(LINK_CAPACITY);
    let mut opts = opts;
    opts.ping_interval = None;
    opts.idle_timeout = None;
    // The embedding program is trusted to connect when it likes.
    opts.handshake_timeout = None;
    let stream = server_rx.map(|text| Ok(InFrame::Text(text)));
    let sink = server_tx.with_flat_map(|frame: OutFrame| {
        futures::stream::iter(match frame {
            OutFrame::Text(text) => Some(Ok(text)),
            OutFrame::Ping | OutFrame::Close { .. } => None,
        })
    });
    let ctx = ctx.clone();
    tokio::spawn(async move {
        ctx.serve(Box::pin(stream), Box::pin(sink), opts).await;
    });
    InProcessLink {
        tx: client_tx,
        rx: client_rx,
    }
}
