//! NDJSON over a pair of byte streams: the router's own stdin/stdout (`map-router stdio`), or
//! the pipes of a child process the router supervises.
//!
//! Only frames are written to the output stream; logs go to stderr. EOF on the input is a
//! clean disconnect. There is no ping on pipes and no idle timeout: a pipe's peer is a process,
//! whose death the router sees as EOF.

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::router::outbox::SharedText;
use crate::router::sessions::table::Transport;
use crate::transport::connection::ConnectionOptions;
use crate::transport::connection::InFrame;
use crate::transport::connection::OutFrame;
use crate::transport::connection::TransportError;
use crate::transport::ndjson::NdjsonCodec;
use crate::transport::TransportContext;

/// Connection settings suited to pipes: no pings, no idle timeout.
pub fn pipe_options(mut opts: ConnectionOptions) -> ConnectionOptions {
    opts.ping_interval = None;
    opts.idle_timeout = None;
    opts
}

/// One line for the codec: a frame of its own, or the bytes of one several recipients share
/// (neither is copied before the codec writes it).
enum Line {
    Own(String),
    Shared(SharedText),
}

impl AsRef<[u8]> for Line {
    fn as_ref(&self) -> &[u8] {
        match self {
            Line::Own(text) => text.as_bytes(),
            Line::Shared(text) => text.as_bytes(),
        }
    }
}

/// Frames NDJSON over a reader/writer pair: a stream of incoming frames and a sink of
/// outgoing ones, as the connection driver wants them.
pub fn framed<R, W>(
    reader: R,
    writer: W,
    max_line: usize,
) -> (
    impl futures::Stream<Item = Result<InFrame, TransportError>> + Unpin + Send,
    impl futures::Sink<OutFrame, Error = std::io::Error> + Unpin + Send + 'static,
)
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let codec = NdjsonCodec::new(max_line);
    let stream = FramedRead::new(reader, codec.clone()).map(|r| match r {
        Ok(frame) => Ok(frame),
        Err(e) => Err(TransportError::Other(e.to_string())),
    });
    let sink = FramedWrite::new(writer, codec).with_flat_map(|frame: OutFrame| {
        futures::stream::iter(match frame {
            OutFrame::Text(text) => Some(Ok(Line::Own(text))),
            OutFrame::Shared(text) => Some(Ok(Line::Shared(text))),
            // Pipes have no ping and no close frame: closing the pipe is the close.
            OutFrame::Ping | OutFrame::Close { .. } => None,
        })
    });
    (stream, Box::pin(sink))
}

/// Serves one MAP connection over `reader` (incoming NDJSON) and `writer` (outgoing NDJSON)
/// until EOF, a write failure, or shutdown.
pub async fn serve_io<R, W>(ctx: &TransportContext, reader: R, writer: W, opts: ConnectionOptions)
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut opts = pipe_options(opts);
    opts.transport = Transport::Stdio;
    let (stream, sink) = framed(reader, writer, opts.max_frame_bytes);
    ctx.serve(stream, sink, opts).await;
}
