//! The client's transports: each one becomes a [`Link`], a stream of incoming JSON-RPC text
//! frames plus a sink for outgoing ones, which the client's driver owns.
//!
//! - WebSocket ([`WsEndpoint`]): one JSON-RPC message per text frame (tokio-tungstenite),
//!   `ws://` or `wss://` (rustls, trust from `client::tls`); `http://` and `https://` URLs are
//!   taken as `ws://` and `wss://`, so the router's own https URL works as it is.
//! - stdio ([`spawn_stdio`]): a child process speaking NDJSON on its stdin/stdout
//!   ([`NdjsonCodec`]); the link owns the child and kills and reaps it when it shuts down.
//! - in-process ([`in_process`]): the channels of an in-process link to a router in this
//!   program (a `server::Server` opens them).
//! - anything else that is a `Stream<Item = String>` + `Sink<String>` ([`custom`]).

use std::path::Path;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::error::{Error as WsError, ProtocolError};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::Connector as TlsConnector;
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::client::error::ClientError;
use crate::client::tls;
use crate::client::tls::TlsFailure;
use crate::client::tls::Trust;
use crate::transport::connection::InFrame;
use crate::transport::in_process::InProcessLinks;
use crate::transport::ndjson::NdjsonCodec;

/// Largest frame the client reads: a `map/replay` page of 1 000 events can exceed the router's
/// 1 MiB *inbound* limit, so the client is more generous than the router.
pub const MAX_INBOUND_FRAME: usize = 64 << 20;

/// How long a stdio child gets to exit on its own after its stdin is closed, before it is killed.
pub const CHILD_EXIT_GRACE: Duration = Duration::from_secs(2);

pub(crate) type FrameStream = Pin<Box<dyn Stream<Item = Result<String, ClientError>> + Send>>;
pub(crate) type FrameSink = Pin<Box<dyn Sink<String, Error = ClientError> + Send>>;

/// Opens a fresh link (used to reconnect).
pub(crate) type Connector =
    Arc<dyn Fn() -> BoxFuture<'static, Result<Link, ClientError>> + Send + Sync>;

/// One open transport.
pub(crate) struct Link {
    pub stream: FrameStream,
    pub sink: FrameSink,
    /// The child process behind a stdio link.
    pub child: Option<Child>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("child", &self.child)
            .finish_non_exhaustive()
    }
}

/// Where a WebSocket client connects: the URL with its scheme made `ws` or `wss`, and for
/// `wss://` what the client trusts. Built once per client and kept for its reconnects.
#[derive(Debug, Clone)]
pub(crate) struct WsEndpoint {
    url: Arc<str>,
    /// `Some` exactly for `wss://`.
    tls: Option<Trust>,
}

impl WsEndpoint {
    /// `url` with scheme `ws`, `wss`, `http` (taken as `ws`) or `https` (taken as `wss`).
    /// `ca_file` is read only for a TLS URL (a plain one ignores it).
    ///
    /// # Errors
    /// [`ClientError::Transport`] for a URL of another scheme or none; [`ClientError::CaFile`]
    /// for an unusable CA file.
    pub(crate) fn new(url: &str, ca_file: Option<&Path>) -> Result<Self, ClientError> {
        let (url, secure) = ws_url(url)?;
        let tls = if secure {
            Some(tls::trust(ca_file)?)
        } else {
            None
        };
        Ok(Self {
            url: url.into(),
            tls,
        })
    }

    /// Opens a WebSocket (and for `wss://` its TLS session) to the endpoint.
    ///
    /// # Errors
    /// [`ClientError::UntrustedCertificate`] when the router's certificate is refused;
    /// [`ClientError::Transport`] for everything else (refused, unreachable, not TLS, ...).
    pub(crate) async fn connect(&self) -> Result<Link, ClientError> {
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_INBOUND_FRAME))
            .max_frame_size(Some(MAX_INBOUND_FRAME));
        let connector = match &self.tls {
            Some(trust) => TlsConnector::Rustls(trust.config.clone()),
            None => TlsConnector::Plain,
        };
        let (ws, _) = tokio_tungstenite::connect_async_tls_with_config(
            &*self.url,
            Some(config),
            true,
            Some(connector),
        )
        .await
        .map_err(|e| self.connect_error(&e))?;
        Ok(ws_link(ws))
    }

    /// The error for a connection that could not be opened, saying when TLS was the cause.
    fn connect_error(&self, e: &WsError) -> ClientError {
        let url = self.url.to_string();
        match tls::classify(e) {
            Some(TlsFailure::Untrusted(mut reason)) => {
                if self.tls.as_ref().is_some_and(|t| t.trusts_nothing) {
                    reason.push_str("; no system root certificates were found");
                }
                ClientError::UntrustedCertificate { url, reason }
            }
            Some(TlsFailure::NotTls(reason)) => ClientError::Transport(format!(
                "cannot connect to {url}: TLS handshake failed ({reason}); is the router \
                 serving TLS on this port? A router without TLS takes ws://"
            )),
            Some(TlsFailure::Handshake(reason)) => ClientError::Transport(format!(
                "cannot connect to {url}: TLS handshake failed ({reason})"
            )),
            // A TLS listener answers a plain request with an alert, which is no HTTP.
            None if self.tls.is_none()
                && matches!(e, WsError::Protocol(ProtocolError::HttparseError(_))) =>
            {
                ClientError::Transport(format!(
                    "cannot connect to {url}: {e}; is the router serving TLS? Then use wss://"
                ))
            }
            None => ClientError::Transport(format!("cannot connect to {url}: {e}")),
        }
    }
}

/// Maps `url`'s scheme to `ws` / `wss` (`http` / `https` too, case-insensitively); says
/// whether it is TLS.
fn ws_url(url: &str) -> Result<(String, bool), ClientError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(ClientError::Transport(format!(
            "not a router URL: `{url}` (expected ws://HOST:PORT/ or wss://HOST:PORT/)"
        )));
    };
    let secure = match scheme.to_ascii_lowercase().as_str() {
        "ws" | "http" => false,
        "wss" | "https" => true,
        _ => {
            return Err(ClientError::Transport(format!(
            "unsupported URL scheme `{scheme}` in `{url}`: use ws://, wss://, http:// or https://"
        )))
        }
    };
    let scheme = if secure { "wss" } else { "ws" };
    Ok((format!("{scheme}://{rest}"), secure))
}

/// A [`Link`] over an open WebSocket.
fn ws_link<S>(ws: tokio_tungstenite::WebSocketStream<S>) -> Link
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sink, stream) = ws.split();
    let stream = stream.filter_map(|msg| {
        futures::future::ready(match msg {
            Ok(WsMessage::Text(text)) => Some(Ok(text.as_str().to_owned())),
            Ok(WsMessage::Close(frame)) => Some(Err(ClientError::Transport(match frame {
                Some(f) => closed_by_router(u16::from(f.code), &f.reason),
                None => "closed by the router".to_owned(),
            }))),
            // Pings are answered by tungstenite itself; MAP sends no binary frames.
            Ok(_) => None,
            Err(e) => Some(Err(ClientError::Transport(e.to_string()))),
        })
    });
    let sink = sink
        .with(|text: String| futures::future::ready(Ok(WsMessage::Text(text.into()))))
        .sink_map_err(|e: WsError| ClientError::Transport(e.to_string()));
    Link {
        stream: Box::pin(stream),
        sink: Box::pin(sink),
        child: None,
    }
}

/// The close code a router sends when another connection resumed this session.
pub(crate) const TAKEOVER_CLOSE_CODE: u16 = 4000;

/// The transport error text for a close frame from the router.
pub(crate) fn closed_by_router(code: u16, reason: &str) -> String {
    if reason.is_empty() {
        format!("closed by the router ({code})")
    } else {
        format!("closed by the router ({code} {reason})")
    }
}

/// Whether a transport error text says the session was taken over by another connection:
/// reconnecting would only fight over it.
pub(crate) fn is_takeover(reason: &str) -> bool {
    reason.contains(&format!("closed by the router ({TAKEOVER_CLOSE_CODE}"))
}

/// A connector that opens a new WebSocket to `endpoint` each time (with the same trust).
pub(crate) fn ws_connector(endpoint: WsEndpoint) -> Connector {
    Arc::new(move || {
        let endpoint = endpoint.clone();
        Box::pin(async move { endpoint.connect().await })
    })
}

/// Spawns `command` with piped stdin/stdout (stderr as configured, inherited by default) and
/// speaks NDJSON over the pipes.
pub(crate) fn spawn_stdio(mut command: Command) -> Result<Link, ClientError> {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    let program = command
        .as_std()
        .get_program()
        .to_string_lossy()
        .into_owned();
    let mut child = command
        .spawn()
        .map_err(|e| ClientError::Transport(format!("cannot start `{program}`: {e}")))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(ClientError::Transport(format!(
            "`{program}` has no piped stdin/stdout"
        )));
    };
    let stream =
        FramedRead::new(stdout, NdjsonCodec::new(MAX_INBOUND_FRAME)).filter_map(move |frame| {
            futures::future::ready(match frame {
                Ok(InFrame::Text(text)) => Some(Ok(text)),
                Ok(other) => {
                    tracing::warn!(frame = ?other, "unreadable line from the stdio child; skipped");
                    None
                }
                Err(e) => Some(Err(ClientError::Transport(e.to_string()))),
            })
        });
    let sink = SinkExt::<String>::sink_map_err(
        FramedWrite::new(stdin, NdjsonCodec::new(MAX_INBOUND_FRAME)),
        |e: std::io::Error| ClientError::Transport(e.to_string()),
    );
    Ok(Link {
        stream: Box::pin(stream),
        sink: Box::pin(sink),
        child: Some(child),
    })
}

/// An in-process link to `server` (no socket), admitted as `principal` when one is given
/// ([`InProcessLinks::connect_as`]).
pub(crate) fn in_process<S: InProcessLinks + ?Sized>(
    server: &S,
    principal: Option<crate::protocol::methods::session::Principal>,
) -> Link {
    let link = match principal {
        Some(p) => server.connect_as(p),
        None => server.connect_in_process(),
    };
    custom(
        link.rx,
        link.tx
            .sink_map_err(|e| ClientError::Transport(format!("in-process link: {e}"))),
    )
}

/// Any stream of text frames and sink of text frames.
pub(crate) fn custom<St, Si>(stream: St, sink: Si) -> Link
where
    St: Stream<Item = String> + Send + 'static,
    Si: Sink<String> + Send + 'static,
    Si::Error: std::fmt::Display,
{
    Link {
        stream: Box::pin(stream.map(Ok)),
        sink: Box::pin(sink.sink_map_err(|e| ClientError::Transport(e.to_string()))),
        child: None,
    }
}

impl Link {
    /// Closes the link: a close frame on WebSocket, EOF on a child's stdin. A child then gets
    /// [`CHILD_EXIT_GRACE`] to exit before it is killed; either way it is reaped.
    pub(crate) async fn shutdown(self) {
        let Link {
            stream,
            mut sink,
            child,
        } = self;
        let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
        drop(sink);
        drop(stream);
        if let Some(child) = child {
            reap(child).await;
        }
    }
}

/// Waits for `child` to exit (bounded), then kills it; always reaps it.
pub(crate) async fn reap(mut child: Child) {
    if tokio::time::timeout(CHILD_EXIT_GRACE, child.wait())
        .await
        .is_err()
    {
        tracing::debug!("stdio child did not exit after EOF; killing it");
        let _ = child.kill().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_urls_are_taken_as_websocket_urls() {
        let cases = [
            ("ws://127.0.0.1:4500/", "ws://127.0.0.1:4500/", false),
            ("wss://router.example/", "wss://router.example/", true),
            ("http://127.0.0.1:4500/", "ws://127.0.0.1:4500/", false),
            (
                "https://localhost:4500/map",
                "wss://localhost:4500/map",
                true,
            ),
            ("HTTPS://localhost:4500/", "wss://localhost:4500/", true),
        ];
        for (given, url, secure) in cases {
            assert_eq!(ws_url(given).unwrap(), (url.to_owned(), secure), "{given}");
        }
        let e = ws_url("ftp://127.0.0.1/").unwrap_err().to_string();
        assert!(e.contains("unsupported URL scheme `ftp`"), "{e}");
        let e = ws_url("127.0.0.1:4500").unwrap_err().to_string();
        assert!(e.contains("not a router URL"), "{e}");
    }

    #[test]
    fn a_plain_url_never_reads_the_ca_file() {
        let endpoint = WsEndpoint::new(
            "ws://127.0.0.1:4500/",
            Some(Path::new("/nonexistent/map-router-ca.pem")),
        )
        .expect("ws:// ignores the CA file");
        assert!(endpoint.tls.is_none());
        let e = WsEndpoint::new(
            "wss://127.0.0.1:4500/",
            Some(Path::new("/nonexistent/map-router-ca.pem")),
        )
        .unwrap_err();
        assert!(matches!(e, ClientError::CaFile { .. }), "{e:?}");
    }
}
