//! Transports: framing and connection loops. A transport knows bytes, not routing.
//!
//! Every transport adapts its medium to the frames of [`connection`] and runs the same
//! [`connection::serve_connection`] driver, so sessions, ordering and back-pressure behave the
//! same over each:
//! - [`ws`]: WebSocket (axum), one JSON-RPC message per text frame;
//! - [`stdio`]: NDJSON over any byte stream pair: the process's own stdin/stdout, or a
//!   supervised child's pipes;
//! - [`in_process`]: channels, for embedding the router in a Rust program;
//! - [`http`]: `POST /map/rpc` for calls and a Server-Sent-Events stream for notifications.

pub mod admission;
pub mod connection;
pub mod http;
pub mod in_process;
pub mod ndjson;
pub mod stdio;
pub mod ws;

use std::sync::Arc;

use tokio::sync::watch;

use crate::router::dispatch::Dispatcher;
use crate::router::RouterHandle;

/// What every transport needs to serve a connection: the router, the method table, the
/// shutdown signal, and a connection tracker (the server waits for every tracked connection on shutdown; a clone of the context, as the gateways keep, is not waited for).
#[derive(Debug, Clone)]
pub struct TransportContext {
    /// The router.
    pub router: RouterHandle,
    /// The method table.
    pub dispatcher: Arc<Dispatcher>,
    /// Flips to true on shutdown.
    pub shutdown: watch::Receiver<bool>,
    /// Tracks every connection task while it runs (`Server::shutdown` waits for them). A
    /// clone of the context is not a connection: gateways keep one for as long as they live.
    pub connections: tokio_util::task::TaskTracker,
}

impl TransportContext {
    /// Serves one connection over a frame stream and sink with this context (see
    /// [`connection::serve_connection`]), tracked while it runs.
    ///
    /// Not an `async fn`: the returned future owns what it needs (it does not borrow `self`),
    /// so a transport can build it in a plain function and spawn only the session loop.
    pub fn serve<St, Si>(
        &self,
        stream: St,
        sink: Si,
        opts: connection::ConnectionOptions,
    ) -> impl std::future::Future<Output = ()> + Send + use<St, Si>
    where
        St: futures::Stream<Item = Result<connection::InFrame, connection::TransportError>>
            + Unpin
            + Send,
        Si: futures::Sink<connection::OutFrame> + Unpin + Send + 'static,
        Si::Error: std::fmt::Display,
    {
        let serve = connection::serve_connection(
            self.router.clone(),
            self.dispatcher.clone(),
            stream,
            sink,
            opts,
            self.shutdown.clone(),
        );
        // NB: a wrapper, not `async move { serve.await }`: an async block would hold the
        // session loop's future twice (once as a local, once as the awaited value).
        self.connections.track_future(serve)
    }
}
