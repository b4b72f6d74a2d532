//! The AIP listener: tonic's HTTP/2 server over the gateway's own TCP listener, with TLS from
//! the router's `[tls]` certificate when set (ALPN `h2`), and the limits of `[aip]`: connections
//! at once (one more is closed as it is accepted), message size both ways (`RESOURCE_EXHAUSTED` past it, as gRPC does), concurrent streams per
//! connection (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`: the peer may not open more), TLS
//! handshakes with a deadline. Stops accepting when the server's shutdown signal fires.
//!
//! Owns the connections' IO ([`Io`]) only.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::proto::gateway_service_server::GatewayServiceServer;
use super::service::Service;
use super::state::AipGateway;

/// Longest TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// One accepted connection, plain or TLS, holding its slot of `max_connections`.
#[derive(Debug)]
pub struct Io {
    stream: Stream,
    remote: SocketAddr,
    _slot: OwnedSemaphorePermit,
}

#[derive(Debug)]
enum Stream {
    /// Plain TCP (h2c, what upstream's insecure channels speak).
    Plain(TcpStream),
    /// TLS.
    Tls(Box<TlsStream<TcpStream>>),
}

impl Connected for Io {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        let local = match &self.stream {
            Stream::Plain(s) => s.local_addr().ok(),
            Stream::Tls(s) => s.get_ref().0.local_addr().ok(),
        };
        TcpConnectInfo {
            local_addr: local,
            remote_addr: Some(self.remote),
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Serves the gateway on `listener` until `shutdown` turns true. The listener is shared: a
/// cluster standby serves its own gateway on it until it takes over, then the live node's
/// gateway takes it (`server::cluster`); the accept loop stops with `shutdown`.
pub async fn serve(
    gw: Arc<AipGateway>,
    listener: Arc<TcpListener>,
    tls: Option<TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) {
    let (tx, rx) = mpsc::channel::<io::Result<Io>>(64);
    let mut stop = shutdown.clone();
    let slots = Arc::new(Semaphore::new(gw.settings().max_connections.max(1)));
    let accept = tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stop.wait_for(|s| *s) => break,
            };
            let (tcp, remote) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "AIP listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                tracing::debug!(%remote, "AIP listener: max_connections reached; connection closed");
                drop(tcp);
                continue;
            };
            let _ = tcp.set_nodelay(true);
            match &tls {
                None => {
                    let io = Io {
                        stream: Stream::Plain(tcp),
                        remote,
                        _slot: slot,
                    };
                    if tx.send(Ok(io)).await.is_err() {
                        break;
                    }
                }
                Some(acceptor) => {
                    let (acceptor, tx) = (acceptor.clone(), tx.clone());
                    tokio::spawn(async move {
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(s)) => {
                                let io = Io {
                                    stream: Stream::Tls(Box::new(s)),
                                    remote,
                                    _slot: slot,
                                };
                                let _ = tx.send(Ok(io)).await;
                            }
                            Ok(Err(e)) => {
                                tracing::debug!(%remote, error = %e, "AIP TLS handshake failed")
                            }
                            Err(_) => tracing::debug!(%remote, "AIP TLS handshake timed out"),
                        }
                    });
                }
            }
        }
    });
    let max = gw.settings().max_message_bytes;
    let streams = gw.settings().max_streams_per_connection;
    // Every RPC passes the admission interceptor first (`service::admit`: credential, rate).
    let service = tonic::service::interceptor::InterceptedService::new(
        GatewayServiceServer::new(Service::new(Arc::clone(&gw)))
            .max_decoding_message_size(max)
            .max_encoding_message_size(max),
        super::service::admit(Arc::clone(&gw)),
    );
    let served = tonic::transport::Server::builder()
        .max_concurrent_streams(Some(streams))
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .add_service(service)
        .serve_with_incoming_shutdown(ReceiverStream::new(rx), async move {
            let _ = shutdown.wait_for(|s| *s).await;
        })
        .await;
    accept.abort();
    if let Err(e) = served {
        tracing::error!(error = %e, "the AIP listener stopped");
    }
}
