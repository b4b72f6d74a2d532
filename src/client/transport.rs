//! The client's transports: each one becomes a [`Link`], a stream of incoming JSON-RPC text
//! frames plus a sink for outgoing ones, which the client's driver owns.
//!
//! - WebSocket ([`connect_ws`]): one JSON-RPC message per text frame (tokio-tungstenite, `ws://`).
//! - stdio ([`spawn_stdio`]): a child process speaking NDJSON on its stdin/stdout
//!   ([`NdjsonCodec`]); the link owns the child and kills and reaps it when it shuts down.
//! - in-process ([`in_process`]): the channels of a [`Server`]'s in-process link.
//! - anything else that is a `Stream<Item = String>` + `Sink<String>` ([`custom`]).

use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::ClientError;
use crate::server::Server;
use crate::transport::connection::InFrame;
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

/// Opens a WebSocket to `url` (`ws://` only).
pub(crate) async fn connect_ws(url: &str) -> Result<Link, ClientError> {
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_INBOUND_FRAME))
        .max_frame_size(Some(MAX_INBOUND_FRAME));
    let (ws, _) = tokio_tungstenite::connect_async_with_config(url, Some(config), true)
        .await
        .map_err(|e| ClientError::Transport(format!("cannot connect to {url}: {e}")))?;
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
        .sink_map_err(|e: tokio_tungstenite::tungstenite::Error| {
            ClientError::Transport(e.to_string())
        });
    Ok(Link {
        stream: Box::pin(stream),
        sink: Box::pin(sink),
        child: None,
    })
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

/// A connector that opens a new WebSocket to `url` each time.
pub(crate) fn ws_connector(url: String) -> Connector {
    let url: Arc<str> = url.into();
    Arc::new(move || {
        let url = url.clone();
        Box::pin(async move { connect_ws(&url).await })
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
    let sink = FramedWrite::new(stdin, NdjsonCodec::new(MAX_INBOUND_FRAME))
        .sink_map_err(|e: std::io::Error| ClientError::Transport(e.to_string()));
    Ok(Link {
        stream: Box::pin(stream),
        sink: Box::pin(sink),
        child: Some(child),
    })
}

/// An in-process link to `server` (no socket).
pub(crate) fn in_process(server: &Server) -> Link {
    let link = server.connect_in_process();
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
