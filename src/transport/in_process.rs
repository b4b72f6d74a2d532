//! In-process transport: a participant inside the same program talks to the router over
//! bounded channels, with no socket and no serialization beyond the JSON frames themselves.
//!
//! The router side runs the same connection driver as every other transport, so dispatch,
//! ordering, back-pressure and shutdown behave exactly as over WebSocket. Only the timers
//! differ: no ping, no idle timeout and no handshake timeout (the peer is this program).

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};

use crate::protocol::methods::session::Principal;
use crate::router::sessions::table::Transport;
use crate::transport::connection::ConnectionOptions;
use crate::transport::connection::InFrame;
use crate::transport::connection::OutFrame;
use crate::transport::TransportContext;

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

/// Something that opens in-process connections to a router (the server does): what
/// `client::Client::in_process` takes, so that the client needs no server.
pub trait InProcessLinks {
    /// Opens one in-process connection.
    fn connect_in_process(&self) -> InProcessLink;

    /// Opens one in-process connection admitted as `principal`, which the caller has verified
    /// (a gateway acting for its HTTP caller), or the router's own service principal
    /// (`auth::service_principal`): origin `Delegated`. Its `map/connect` needs no credential,
    /// and the session gets exactly that principal's grants, quotas and visibility. The
    /// principal's expiry is dropped: the opener checks each request's credential itself.
    fn connect_as(&self, principal: Principal) -> InProcessLink;
}

/// Opens an in-process connection served by a task spawned on the current runtime.
pub fn connect(ctx: &TransportContext, opts: ConnectionOptions) -> InProcessLink {
    let (client_tx, server_rx) = mpsc::channel::<String>(LINK_CAPACITY);
    let (server_tx, client_rx) = mpsc::channel::<String>(LINK_CAPACITY);
    let mut opts = opts;
    opts.transport = Transport::InProcess;
    opts.ping_interval = None;
    opts.idle_timeout = None;
    // The embedding program is trusted to connect when it likes.
    opts.handshake_timeout = None;
    let stream = server_rx.map(|text| Ok(InFrame::Text(text)));
    let sink =
        server_tx.with_flat_map(|frame: OutFrame| futures::stream::iter(frame.into_text().map(Ok)));
    tokio::spawn(ctx.serve(Box::pin(stream), Box::pin(sink), opts));
    InProcessLink {
        tx: client_tx,
        rx: client_rx,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::router::dispatch::Dispatcher;
    use crate::router::Router;
    use crate::router::RouterParts;

    /// An idle connection's task is this future (its reader is boxed beside it, its writer is
    /// a task of its own);
    /// every byte of it is paid per connection (docs/performance.md, "Idle sessions").
    /// Building the future inside an `async` block instead of returning it once cost about
    /// 3 KB.
    #[tokio::test]
    async fn a_connection_future_stays_small() {
        let (router, _task) = Router::start(
            crate::router::RouterConfig::default(),
            RouterParts {
                process_control: None,
                store: None,
                metrics: None,
                traces: None,
                carried_fold: None,
            },
        );
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let ctx = TransportContext {
            router,
            dispatcher: Arc::new(Dispatcher::new()),
            shutdown,
            connections: tokio_util::task::TaskTracker::new(),
        };
        let (_tx, rx) = mpsc::channel::<String>(1);
        let (tx, _rx) = mpsc::channel::<String>(1);
        let stream = rx.map(|text| Ok(InFrame::Text(text)));
        let sink = tx.with(|frame: OutFrame| async move {
            Ok::<_, mpsc::SendError>(frame.into_text().unwrap_or_default())
        });
        let serve = ctx.serve(
            Box::pin(stream),
            Box::pin(sink),
            ConnectionOptions::default(),
        );
        let size = std::mem::size_of_val(&serve);
        assert!(size <= 160, "a connection's future takes {size} bytes");
    }
}
