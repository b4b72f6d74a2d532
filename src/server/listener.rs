//! The accept loop of one listening socket: admission, optional TLS, HTTP/1.1 with upgrades.
//!
//! Owns what happens between `accept()` and the HTTP routes; it replaces `axum::serve`, which
//! offers neither a header-read timeout nor TLS:
//! - **Admission.** Every TCP connection takes a slot (`transport::admission`). Over a limit
//!   the connection is still answered, once: `503` (server full) or `429` (this address has too
//!   many), `Connection: close`, `Retry-After: 1`, and a JSON-RPC error body (4000 / 4002), so a
//!   WebSocket client sees a clear HTTP status instead of a reset. At most
//!   [`MAX_REFUSING`] refusals are served at once; beyond that the socket is just closed.
//! - **Slow clients.** The TLS handshake and each request's headers must arrive within
//!   `header_timeout` (hyper's `header_read_timeout`); a slow-loris peer trickling bytes is cut
//!   off then, holding one slot meanwhile.
//! - **TLS** (rustls, ring provider) when the server has a certificate: the same routes behind
//!   `wss://` and `https://`. A plain-text request to a TLS port fails the handshake and is
//!   closed.
//! - **Peer info.** Each request carries a `PeerInfo` extension (remote address, admission
//!   slot); the WebSocket handler keeps it for the socket's lifetime, so an upgraded connection
//!   keeps its slot after hyper hands the socket over.
//! - **Shutdown.** Stop accepting, ask every connection to finish its in-flight request
//!   (hyper's graceful shutdown), and wait for them up to the drain timeout.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::Request;
use axum::Router as HttpRouter;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tower_service::Service;

use crate::transport::admission::{refusal_response, Admission, PeerInfo, Refusal};

/// At most this many over-limit connections are answered at once; more are closed unanswered.
pub const MAX_REFUSING: usize = 64;

/// What the accept loop needs.
#[derive(Clone)]
pub struct ListenerSettings {
    /// Connection counters.
    pub admission: Arc<Admission>,
    /// TLS, when the server has a certificate.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Deadline for the TLS handshake and for each request's headers.
    pub header_timeout: Duration,
    /// How long shutdown waits for connections to finish their request.
    pub drain_timeout: Duration,
}

impl std::fmt::Debug for ListenerSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerSettings")
            .field("admission", &self.admission)
            .field("tls", &self.tls.is_some())
            .field("header_timeout", &self.header_timeout)
            .field("drain_timeout", &self.drain_timeout)
            .finish()
    }
}

/// Completes once shutdown is signalled (or the signal is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// Accepts connections on `listener` and serves `app` on them until `shutdown` flips.
pub async fn serve(
    listener: Arc<TcpListener>,
    app: HttpRouter,
    settings: ListenerSettings,
    mut shutdown: watch::Receiver<bool>,
) {
    let refusing = Arc::new(AtomicUsize::new(0));
    let (guard, mut done) = mpsc::channel::<()>(1);
    loop {
        let (tcp, addr) = tokio::select! {
            () = stopped(&mut shutdown) => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let admitted = settings.admission.admit(Some(addr.ip()));
        let peer = match admitted {
            Ok(slot) => Ok(PeerInfo {
                addr,
                slot: Arc::new(slot),
            }),
            Err(refusal) => {
                if refusing.fetch_add(1, Ordering::AcqRel) >= MAX_REFUSING {
                    refusing.fetch_sub(1, Ordering::AcqRel);
                    tracing::debug!(%addr, "refused without an answer: too many refusals at once");
                    continue;
                }
                tracing::debug!(%addr, ?refusal, "connection refused");
                Err(RefusalGuard {
                    refusal,
                    counter: refusing.clone(),
                })
            }
        };
        let app = app.clone();
        let settings = settings.clone();
        let shutdown = shutdown.clone();
        let guard = guard.clone();
        tokio::spawn(async move {
            serve_tcp(tcp, peer, app, &settings, shutdown).await;
            drop(guard);
        });
    }
    drop(guard);
    let _ = tokio::time::timeout(settings.drain_timeout, done.recv()).await;
}

/// Counts a refusal being answered.
struct RefusalGuard {
    refusal: Refusal,
    counter: Arc<AtomicUsize>,
}

impl Drop for RefusalGuard {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn serve_tcp(
    tcp: TcpStream,
    peer: Result<PeerInfo, RefusalGuard>,
    app: HttpRouter,
    settings: &ListenerSettings,
    shutdown: watch::Receiver<bool>,
) {
    match &settings.tls {
        Some(acceptor) => {
            match tokio::time::timeout(settings.header_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => serve_http(tls, peer, app, settings, shutdown).await,
                Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!("TLS handshake timed out"),
            }
        }
        None => serve_http(tcp, peer, app, settings, shutdown).await,
    }
}

async fn serve_http<I>(
    io: I,
    peer: Result<PeerInfo, RefusalGuard>,
    app: HttpRouter,
    settings: &ListenerSettings,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_timeout);
    let io = TokioIo::new(io);
    match peer {
        Ok(peer) => {
            let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert(peer.clone());
                let mut app = app.clone();
                async move { app.call(req).await }
            });
            let conn = builder.serve_connection(io, service).with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "HTTP connection ended with an error");
                    }
                    return;
                }
                () = stopped(&mut shutdown) => conn.as_mut().graceful_shutdown(),
            }
            let _ = tokio::time::timeout(settings.drain_timeout, conn).await;
        }
        Err(refused) => {
            builder.keep_alive(false);
            let refusal = refused.refusal;
            let service = hyper::service::service_fn(move |_req: Request<Incoming>| async move {
                Ok::<_, std::convert::Infallible>(refusal_response(refusal))
            });
            let conn = builder.serve_connection(io, service);
            let _ = tokio::time::timeout(settings.header_timeout * 2, conn).await;
            drop(refused);
        }
    }
}
