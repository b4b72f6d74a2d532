//! One connection driver for every transport: a reader loop and a single writer task over any
//! `Stream` of incoming frames and `Sink` of outgoing frames.
//!
//! A transport adapts its socket or pipe to [`InFrame`] / [`OutFrame`] and calls
//! [`serve_connection`]; everything else (JSON-RPC, sessions, ordering, back-pressure,
//! keep-alive, shutdown) is the same for all of them.
//!
//! - The **reader** hands each text frame to the connection's [`RpcSession`] and waits for it to
//!   queue its response, so a peer that floods requests without reading responses is slowed by
//!   its own full outbox.
//! - The **writer** is the only code that touches the sink, so frames never interleave. It
//!   drains the outbox in batches (feed several frames, flush once) and reports room to the
//!   router when the router asked for it.
//! - Keep-alive: the reader queues a ping every `ping_interval` (the writer writes it in turn);
//!   the reader closes the connection when nothing (not even a pong) arrived for `idle_timeout`.
//! - On shutdown the reader queues a close frame behind what is already queued, so pending
//!   responses and events still go out; the writer gets `drain_timeout` to finish.
//! - Handshake: a connection that has no MAP session `handshake_timeout` after it opened (or
//!   after its session ended) is closed with 1008 and a reason; on pipes, which have no close
//!   frame, the connection just ends.
//! - A peer that stops reading: the writer gives up when one write or flush takes longer than
//!   `idle_timeout`; the reader notices at once (the outbox closes) and ends the connection.
//!   Until then the outbox is bounded, so the stalled peer pins a bounded amount of memory.

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::future::{Either, FusedFuture, FutureExt};
use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::protocol::jsonrpc::{ErrorObject, DEFAULT_MAX_DEPTH};
use crate::router::dispatch::Dispatcher;
use crate::router::dispatch::DEFAULT_MAX_BATCH;
use crate::router::outbox::outbox;
use crate::router::outbox::Outbound;
use crate::router::outbox::OutboxReceiver;
use crate::router::outbox::SharedText;
use crate::router::rate::RateLimits;
use crate::router::rpc::RpcSession;
use crate::router::rpc::SessionLimits;
use crate::router::rpc::WriterGone;
use crate::router::sessions::table::{ConnOrigin, Transport};
use crate::router::Command;
use crate::router::ConnId;
use crate::router::RouterHandle;

/// A frame from the peer, as the transport decoded it.
#[derive(Debug)]
pub enum InFrame {
    /// A text frame: one JSON value (object or batch).
    Text(String),
    /// A binary frame (not supported by MAP over WebSocket).
    Binary,
    /// A frame larger than the configured limit.
    TooLarge {
        /// Its size in bytes.
        len: usize,
    },
    /// A frame that was not valid UTF-8.
    BadUtf8,
    /// Proof of life (ping, pong) with no content.
    Alive,
    /// The peer closed.
    Close,
}

/// A frame for the peer.
#[derive(Debug)]
pub enum OutFrame {
    /// A text frame.
    Text(String),
    /// A text frame several recipients share (a `map/message`): a socket that takes `Bytes`
    /// writes it without a copy per recipient.
    Shared(SharedText),
    /// A keep-alive ping.
    Ping,
    /// A close frame.
    Close {
        /// Close code.
        code: u16,
        /// Reason.
        reason: String,
    },
}

impl OutFrame {
    /// The text of a text frame as a `String` of its own (a shared frame is copied), or `None`
    /// for a ping or a close: for sinks that carry strings (in-process links, tests).
    pub fn into_text(self) -> Option<String> {
        match self {
            OutFrame::Text(text) => Some(text),
            OutFrame::Shared(text) => Some(text.as_str().to_owned()),
            OutFrame::Ping | OutFrame::Close { .. } => None,
        }
    }
}

/// Why a transport's stream failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The peer sent a message beyond the hard limit; the connection cannot continue.
    #[error("message exceeds the hard limit of {limit} bytes")]
    Oversized {
        /// The hard limit.
        limit: usize,
    },
    /// A WebSocket text frame that is not UTF-8: the connection must fail (RFC 6455 §8.1).
    #[error("a text frame is not valid UTF-8")]
    InvalidText,
    /// Any other I/O or protocol failure.
    #[error("{0}")]
    Other(String),
}

/// Per-connection settings.
#[derive(Debug, Clone)]
pub struct ConnectionOptions {
    /// Largest accepted text frame; larger frames get a `-32600` and the connection continues.
    pub max_frame_bytes: usize,
    /// Largest accepted batch.
    pub max_batch: usize,
    /// How often the connection pings (`None`: never).
    pub ping_interval: Option<Duration>,
    /// Close the connection when nothing arrives for this long (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// How long the writer may take to flush after the reader stops.
    pub drain_timeout: Duration,
    /// How many queued frames the writer feeds before it flushes.
    pub write_batch: usize,
    /// Who is on the other end (a supervised child's pipes, or a remote peer).
    pub origin: ConnOrigin,
    /// The medium (set by each transport's entry point; a metrics label).
    pub transport: Transport,
    /// Deepest JSON nesting accepted in a frame.
    pub max_depth: usize,
    /// Close a connection that has no MAP session this long after it opened (`None`: never).
    pub handshake_timeout: Option<Duration>,
    /// Request-rate limits (shared by every connection of a server).
    pub rate: Arc<RateLimits>,
    /// The peer's network address, when it has one (keys the shared rate bucket of an
    /// unauthenticated peer).
    pub peer: Option<std::net::SocketAddr>,
    /// In cluster mode, the node the connection is really on when it is not this one: a
    /// standby's connection, whose relay session this is (`server::relay`).
    pub node: Option<Arc<str>>,
    /// How long the writer may hold events and messages to put more of them in one write
    /// (`?linger=` on a WebSocket URL, at most [`MAX_LINGER`]); answers to requests are never
    /// held. `None`: each batch is written as soon as the outbox has nothing more.
    pub linger: Option<Duration>,
}

/// The longest a connection may ask its writer to hold events ([`ConnectionOptions::linger`]).
pub const MAX_LINGER: Duration = Duration::from_millis(250);

impl Default for ConnectionOptions {
    fn default() -> Self {
        Self {
            max_frame_bytes: 1 << 20,
            max_batch: DEFAULT_MAX_BATCH,
            ping_interval: Some(Duration::from_secs(20)),
            idle_timeout: Some(Duration::from_secs(60)),
            drain_timeout: Duration::from_secs(5),
            write_batch: 64,
            origin: ConnOrigin::Remote,
            transport: Transport::WebSocket,
            max_depth: DEFAULT_MAX_DEPTH,
            handshake_timeout: Some(Duration::from_secs(10)),
            rate: RateLimits::unlimited(),
            peer: None,
            node: None,
            linger: None,
        }
    }
}

/// Serves one connection until the peer leaves, the transport fails, or `shutdown` flips.
///
/// The connection's task holds the boxed reader loop and the writer task's handle.
///
/// # Cancel safety
/// Not cancel safe: cancelling it skips `Detach`, leaving the session attached to a dead
/// connection until the router stops. Let it finish; use `shutdown` to end it.
pub fn serve_connection<St, Si>(
    router: RouterHandle,
    dispatcher: Arc<Dispatcher>,
    stream: St,
    sink: Si,
    opts: ConnectionOptions,
    shutdown: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send
where
    St: Stream<Item = Result<InFrame, TransportError>> + Unpin + Send,
    Si: Sink<OutFrame> + Unpin + Send + 'static,
    Si::Error: std::fmt::Display,
{
    // NB: not an `async fn`, and everything is built here, outside the future: an `async fn`
    // stores its arguments twice, and an idle connection should carry only its loops.
    let conn = router.new_conn_id();
    let (tx, rx) = outbox(router.config().outbox_frames);
    // NB: boxed, and taken out of its box before it is sent, so the box is freed then, not
    // when the connection ends.
    let mut attach = Some(Box::new(Command::Attach {
        conn,
        outbox: tx.clone(),
        origin: opts.origin.clone(),
        transport: opts.transport,
        node: opts.node.clone(),
    }));
    // NB: a task of its own, not a future polled beside the reader's. In one task every
    // wake-up polled both, and the reader's poll of the WebSocket flushes what the writer had
    // buffered (tungstenite writes pending frames before it reads), so batches broke up:
    // ephemeral fan-out cost 31 % more CPU per delivery; with a waker per half, 16 % more at
    // 100 + 10 (docs/performance.md). Spawned here, before the attach: it only waits for
    // the outbox until then, and ends when the outbox's last sender goes.
    let writer = tokio::spawn(write_loop(
        rx,
        sink,
        router.clone(),
        conn,
        WriterOptions {
            write_timeout: opts.idle_timeout,
            write_batch: opts.write_batch.max(1),
            linger: opts.linger.map(|l| l.min(MAX_LINGER)),
        },
    ));
    let session = RpcSession::new(router.clone(), dispatcher, conn, tx.clone(), opts.max_batch)
        .with_limits(SessionLimits {
            max_depth: opts.max_depth,
            rate: opts.rate.connection(opts.peer.map(|p| p.ip())),
            ..SessionLimits::default()
        })
        .with_delegated(match &opts.origin {
            ConnOrigin::Delegated(p) => Some(p),
            _ => None,
        })
        .with_pipelining();
    let limits = ReaderLimits {
        max_frame_bytes: opts.max_frame_bytes,
        idle: opts.idle_timeout,
        // A supervised child's handshake is the supervisor's business (its own timeout).
        handshake: match opts.origin {
            ConnOrigin::Remote | ConnOrigin::InProcess | ConnOrigin::Stdio => {
                opts.handshake_timeout
            }
            ConnOrigin::Delegated(_) | ConnOrigin::Supervised { .. } => None,
        },
        ping: opts.ping_interval,
    };
    let reader = Box::pin(read_loop(session, stream, tx, limits, shutdown));
    let drain_timeout = opts.drain_timeout;
    async move {
        // NB: the attach and the ending are boxed too: each is a state of this future only
        // while it runs.
        let sent = match attach.take() {
            Some(attach) => Box::pin(router.send(*attach)),
            None => return,
        };
        if sent.await.is_err() {
            return;
        }
        match futures::future::select(reader, writer).await {
            Either::Left((end, writer)) => {
                Box::pin(finish(router, end, Some(writer), drain_timeout, conn)).await;
            }
            Either::Right((_, reader)) => {
                // The writer gave up (the peer stopped reading, or the sink failed): the
                // reader sees the outbox closed at once.
                let end = reader.await;
                Box::pin(finish(router, end, None, drain_timeout, conn)).await;
            }
        }
    }
}

/// What the reader leaves when it stops (boxed: an idle connection's future should not carry
/// room for it).
struct ReaderEnd {
    session: RpcSession,
    tx: crate::router::outbox::Outbox,
    /// The close frame to send, if any.
    exit: Option<Outbound>,
}

/// What the reader loop checks each frame against.
struct ReaderLimits {
    max_frame_bytes: usize,
    /// Close the connection when nothing arrives for this long.
    idle: Option<Duration>,
    /// Close a connection that has no MAP session this long after it opened (or its session
    /// ended).
    handshake: Option<Duration>,
    /// Queue a ping this often.
    ping: Option<Duration>,
}

/// The reader: hands each frame to the session until the peer leaves, the transport fails, a
/// deadline passes or `shutdown` flips.
///
/// One timer serves both deadlines and the keep-alive ping, and it is not touched per frame:
/// each frame only notes the time, and when the timer fires the loop checks what really came
/// due and sets it again.
///
/// Not an `async fn`: its arguments would be stored twice (once as the call's, once as the
/// body's locals); the `async move` block holds each once.
#[allow(clippy::manual_async_fn)] // see above: an `async fn` would be larger
fn read_loop<St>(
    mut session: RpcSession,
    mut stream: St,
    tx: crate::router::outbox::Outbox,
    limits: ReaderLimits,
    mut shutdown: watch::Receiver<bool>,
) -> impl std::future::Future<Output = Box<ReaderEnd>> + Send
where
    St: Stream<Item = Result<InFrame, TransportError>> + Unpin + Send,
{
    async move {
        let close = |code: u16, reason: &str| Outbound::Close {
            code,
            reason: reason.into(),
        };
        let started = Instant::now();
        let mut last_frame = started;
        let mut handshake_deadline = limits.handshake.map(|d| started + d);
        let mut next_ping = limits.ping.map(|d| started + d);
        // The earliest of the deadlines and the next ping.
        let next_check =
            |handshake: Option<Instant>, last_frame: Instant, ping: Option<Instant>| {
                let idle = limits.idle.map(|d| last_frame + d);
                [handshake, idle, ping].into_iter().flatten().min()
            };
        let first = next_check(handshake_deadline, last_frame, next_ping);
        // Whether the timer stands for a deadline (at `timer.deadline()`).
        let mut armed = first.is_some();
        let mut timer = std::pin::pin!(tokio::time::sleep_until(first.unwrap_or(started)));
        let exit = {
            // NB: the shutdown and closed-outbox waits live as long as the loop, registered once,
            // instead of being built and dropped around every frame (the shutdown signal is one
            // for all connections).
            let mut stop = std::pin::pin!(async move {
                // A dropped sender (the server gone) stops the connection as well.
                let _ = shutdown.wait_for(|s| *s).await;
            }
            .fuse());
            let mut closed = std::pin::pin!(tx.closed());

            loop {
                if stop.is_terminated() {
                    break Some(close(1001, "server shutting down"));
                }
                let frame = tokio::select! {
                    // NB: shutdown first, so a busy peer cannot starve it.
                    biased;
                    () = stop.as_mut() => continue,
                    () = closed.as_mut() => {
                        tracing::debug!(conn = %session.conn(), "writer gave up (the peer is not reading); closing");
                        break None;
                    }
                    () = timer.as_mut(), if armed => {
                        let now = Instant::now();
                        if next_ping.is_some_and(|at| at <= now) {
                            // NB: a full outbox is traffic enough; the writer's own timeout
                            // notices a peer that stopped reading.
                            let _ = tx.try_push(Outbound::Ping);
                            next_ping = limits.ping.map(|d| now + d);
                        }
                        if handshake_deadline.is_some_and(|at| at <= now) {
                            let ms = limits.handshake.map_or(0, |d| d.as_millis());
                            break Some(close(1008, &format!("handshake timeout: no map/connect within {ms} ms")));
                        }
                        if limits.idle.is_some_and(|d| last_frame + d <= now) {
                            break Some(close(1001, "idle timeout: no frames or pongs received"));
                        }
                        let next = next_check(handshake_deadline, last_frame, next_ping);
                        armed = next.is_some();
                        if let Some(at) = next {
                            timer.as_mut().reset(at);
                        }
                        continue;
                    }
                    // NB: boxed, and only while answers wait: an idle connection carries no room
                    // for it.
                    () = boxed_or_never(session.has_pending().then(|| Box::pin(session.commit_ready()))) => {
                        if Box::pin(session.flush_committed(false)).await.is_err() {
                            break None;
                        }
                        continue;
                    }
                    frame = stream.next() => frame,
                };
                if limits.idle.is_some() {
                    last_frame = Instant::now();
                }
                let result = match frame {
                    None | Some(Ok(InFrame::Close)) => break None,
                    Some(Err(TransportError::Oversized { limit })) => {
                        break Some(close(1009, &format!("message exceeds {limit} bytes")));
                    }
                    Some(Err(TransportError::InvalidText)) => {
                        break Some(close(1007, "text frame is not valid UTF-8"));
                    }
                    Some(Err(e)) => {
                        tracing::debug!(conn = %session.conn(), error = %e, "transport error");
                        break None;
                    }
                    Some(Ok(InFrame::Alive)) => continue,
                    Some(Ok(InFrame::Text(text))) if text.len() <= limits.max_frame_bytes => {
                        // NB: handling waits for room in the outbox when the peer reads slowly; a
                        // shutdown must still get through. Boxed: handling a request is the
                        // largest state of this loop, and an idle connection should not carry it.
                        tokio::select! {
                            r = Box::pin(session.handle_text(&text)) => r,
                            () = stop.as_mut() => continue,
                        }
                    }
                    // NB: the rejections are boxed too (a rare path, and the largest state left).
                    Some(Ok(other)) => {
                        Box::pin(reject(&mut session, other, limits.max_frame_bytes)).await
                    }
                };
                if result.is_err() {
                    break None;
                }
                let before = handshake_deadline;
                handshake_deadline = match (session.is_connected(), handshake_deadline) {
                    (true, _) => None,
                    // The session ended (map/disconnect): the clock starts again.
                    (false, None) => limits.handshake.map(|d| Instant::now() + d),
                    (false, running) => running,
                };
                if handshake_deadline != before {
                    // The timer may now be late (a handshake clock started) or early (harmless: it
                    // fires, finds nothing expired and sets itself again).
                    let want = next_check(handshake_deadline, last_frame, next_ping);
                    if let Some(at) = want.filter(|w| !armed || *w < timer.deadline()) {
                        armed = true;
                        timer.as_mut().reset(at);
                    }
                }
            }
        };
        Box::new(ReaderEnd { session, tx, exit })
    }
}

/// Answers a frame the session cannot take (too large, binary, not UTF-8).
async fn reject(
    session: &mut RpcSession,
    frame: InFrame,
    max_frame_bytes: usize,
) -> Result<(), WriterGone> {
    let error = match frame {
        InFrame::Text(text) => too_large(text.len(), max_frame_bytes),
        InFrame::TooLarge { len } => too_large(len, max_frame_bytes),
        InFrame::Binary => ErrorObject::invalid_request(
            "binary frames are not supported: send each JSON-RPC message as a text frame",
        ),
        InFrame::BadUtf8 => ErrorObject::parse_error("frame is not valid UTF-8"),
        InFrame::Alive | InFrame::Close => return Ok(()),
    };
    session.reject_frame(&error).await
}

/// Ends a connection: its last answers and close frame, the router told, the writer (when it
/// still runs) given `drain_timeout` to write what is queued.
async fn finish(
    router: RouterHandle,
    end: Box<ReaderEnd>,
    writer: Option<tokio::task::JoinHandle<()>>,
    drain_timeout: Duration,
    conn: ConnId,
) {
    let ReaderEnd {
        mut session,
        tx,
        exit,
    } = *end;
    let ending = async move {
        if let Some(close) = exit {
            // Answers still waiting for their commits go first (each bounded by the commit
            // timeout, all by the drain timeout).
            let _ = tokio::time::timeout(drain_timeout, session.flush_committed(true)).await;
            // Behind everything already queued; bounded so a peer that reads nothing cannot
            // hold us.
            let _ = tokio::time::timeout(drain_timeout, tx.push(close)).await;
        }
        let _ = router.send(Command::Detach { conn }).await;
        // The router dropped its outbox handles on Detach; the writer ends when the queue is
        // empty.
        drop(session);
        drop(tx);
    };
    let Some(writer) = writer else {
        return ending.await;
    };
    let abort = writer.abort_handle();
    let ending = std::pin::pin!(ending);
    match futures::future::select(ending, writer).await {
        Either::Left(((), writer)) => {
            if tokio::time::timeout(drain_timeout, writer).await.is_err() {
                tracing::debug!(%conn, "writer did not drain in time; dropping the connection");
                abort.abort();
            }
        }
        Either::Right((_, ending)) => ending.await,
    }
}

fn too_large(len: usize, limit: usize) -> ErrorObject {
    ErrorObject::invalid_request(format!(
        "frame of {len} bytes exceeds the limit of {limit} bytes"
    ))
}

/// The boxed future's output, or never when there is none.
async fn boxed_or_never<F: std::future::Future>(f: Option<std::pin::Pin<Box<F>>>) -> F::Output {
    match f {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

struct WriterOptions {
    /// A write or flush that takes longer than this means the peer stopped reading: give up.
    write_timeout: Option<Duration>,
    write_batch: usize,
    linger: Option<Duration>,
}

/// Runs a sink operation under the write timeout. `Err(())` means failed or timed out.
///
/// The clock starts when the operation first has to wait: most writes go into the sink's
/// buffer at once, and a timer built for each of them read the clock per frame (`perf`: 1 %
/// of an ephemeral fan-out server in `clock_gettime` under the writer). A combinator, not an
/// `async fn`: the writer's future holds it at every write, and an `async fn` would keep the
/// operation twice (its argument and its awaited copy); the timer is boxed, made only when
/// waited for.
fn bounded<F, E>(
    limit: Option<Duration>,
    conn: ConnId,
    what: &'static str,
    op: F,
) -> impl std::future::Future<Output = Result<(), ()>>
where
    F: std::future::Future<Output = Result<(), E>> + Unpin,
    E: std::fmt::Display,
{
    let mut op = op;
    let mut timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    futures::future::poll_fn(move |cx| {
        if let Poll::Ready(r) = std::future::Future::poll(std::pin::Pin::new(&mut op), cx) {
            return Poll::Ready(r.map_err(|e| tracing::debug!(%conn, error = %e, "{what} failed")));
        }
        let Some(limit) = limit else {
            return Poll::Pending;
        };
        let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match std::future::Future::poll(timer.as_mut(), cx) {
            Poll::Ready(()) => {
                tracing::debug!(%conn, "{what} timed out: the peer is not reading");
                Poll::Ready(Err(()))
            }
            Poll::Pending => Poll::Pending,
        }
    })
}

/// The single writer: drains the outbox into the sink. (Not an `async fn`, as [`read_loop`].)
#[allow(clippy::manual_async_fn)] // as `read_loop`: an `async fn` would be larger
fn write_loop<Si>(
    mut rx: OutboxReceiver,
    mut sink: Si,
    router: RouterHandle,
    conn: ConnId,
    opts: WriterOptions,
) -> impl std::future::Future<Output = ()> + Send
where
    Si: Sink<OutFrame> + Unpin + Send,
    Si::Error: std::fmt::Display,
{
    async move {
        let limit = opts.write_timeout;
        'outer: loop {
            let Some(mut item) = rx.recv().await else {
                break;
            };
            let mut fed = 0;
            let mut yielded = false;
            // With a linger, events and messages wait for company until this instant; an answer
            // to a request (a `Frame`) in the batch ends the wait.
            let linger_until = opts.linger.map(|l| Instant::now() + l);
            let mut answered = false;
            loop {
                answered |= matches!(item, Outbound::Frame(_));
                match item {
                    Outbound::Ping => {
                        let write = sink.feed(OutFrame::Ping);
                        if bounded(limit, conn, "ping", write).await.is_err() {
                            break 'outer;
                        }
                    }
                    Outbound::Close { code, reason } => {
                        let _ = bounded(limit, conn, "flush", sink.flush()).await;
                        let close = OutFrame::Close { code, reason };
                        let _ = bounded(limit, conn, "close", sink.send(close)).await;
                        break 'outer;
                    }
                    other => {
                        let frame = match other {
                            Outbound::Shared(text) => Some(OutFrame::Shared(text)),
                            other => other.into_text().map(OutFrame::Text),
                        };
                        if let Some(frame) = frame {
                            let write = sink.feed(frame);
                            if bounded(limit, conn, "write", write).await.is_err() {
                                break 'outer;
                            }
                        }
                    }
                }
                fed += 1;
                if fed >= opts.write_batch {
                    break;
                }
                let next = match rx.try_recv() {
                    None if !yielded => {
                        // Once per flush, let the router (and other writers) run before the
                        // syscall: under fan-out the next frames are usually a moment away, and
                        // one write for several frames costs far less than one each.
                        yielded = true;
                        tokio::task::yield_now().await;
                        rx.try_recv()
                    }
                    next => next,
                };
                match next {
                    Some(next) => item = next,
                    None => match linger_until {
                        // NB: one wake-up at the end of the linger (or at an answer) for all the
                        // events that came meanwhile, not one per event.
                        Some(until) if !answered && Instant::now() < until => {
                            rx.linger(until).await;
                            match rx.try_recv() {
                                Some(next) => item = next,
                                None => break,
                            }
                        }
                        _ => break,
                    },
                }
            }
            if bounded(limit, conn, "flush", sink.flush()).await.is_err() {
                break;
            }
            if rx.take_wakeup()
                && Box::pin(router.send(Command::Drained { conn }))
                    .await
                    .is_err()
            {
                break;
            }
        }
        rx.close();
        let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;

    /// A write the peer never takes fails at the write timeout, counted from when it first had
    /// to wait; one that waits less succeeds; one that fails says so; without a limit a write
    /// waits as long as it takes.
    #[tokio::test(start_paused = true)]
    async fn a_write_waits_at_most_the_write_timeout_once_it_has_to_wait() {
        let conn = ConnId(1);
        let limit = Some(Duration::from_secs(5));
        let start = Instant::now();
        let never = std::future::pending::<Result<(), String>>();
        let gave_up = tokio::time::timeout(
            Duration::from_secs(60),
            bounded(limit, conn, "write", Box::pin(never)),
        )
        .await;
        assert_eq!(gave_up, Ok(Err(())));
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(5),
            "given up at the limit, not before"
        );

        let start = Instant::now();
        let slow = Box::pin(async {
            tokio::time::sleep(Duration::from_secs(4)).await;
            Ok::<(), String>(())
        });
        assert_eq!(bounded(limit, conn, "write", slow).await, Ok(()));
        assert_eq!(start.elapsed(), Duration::from_secs(4));

        let failed = std::future::ready(Err::<(), _>("broken pipe".to_owned()));
        assert_eq!(bounded(limit, conn, "write", failed).await, Err(()));

        let unbounded = Box::pin(async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok::<(), String>(())
        });
        let waited = tokio::time::timeout(
            Duration::from_secs(7200),
            bounded(None, conn, "write", unbounded),
        )
        .await;
        assert_eq!(waited, Ok(Ok(())), "no limit: an hour's wait is waited");
    }

    /// An idle connection is its task (the reader boxed beside it) and the writer's task.
    /// Each is kept at or below a size class (mimalloc's bins are 768, 1024, ...; tokio rounds
    /// a task up to 128 bytes), so a few bytes more would cost a whole class per connection
    /// (docs/performance.md, "NATS-class cost").
    #[tokio::test]
    async fn an_idle_connections_parts_stay_within_their_size_classes() {
        let (router, _task) = crate::router::Router::start(
            crate::router::RouterConfig::default(),
            crate::router::RouterParts {
                process_control: None,
                store: None,
                metrics: None,
                traces: None,
                carried_fold: None,
            },
        );
        let (_in, rx) = mpsc::channel::<String>(1);
        let (tx, _out) = mpsc::channel::<String>(1);
        let stream = Box::pin(rx.map(|text| Ok(InFrame::Text(text))));
        let sink = Box::pin(tx.with(|frame: OutFrame| async move {
            Ok::<_, mpsc::SendError>(frame.into_text().unwrap_or_default())
        }));
        let conn = router.new_conn_id();
        let (otx, orx) = outbox(8);
        let writer = write_loop(
            orx,
            sink,
            router.clone(),
            conn,
            WriterOptions {
                write_timeout: None,
                write_batch: 1,
                linger: None,
            },
        );
        let session = RpcSession::new(
            router.clone(),
            Arc::new(Dispatcher::new()),
            conn,
            otx.clone(),
            1,
        );
        let limits = ReaderLimits {
            max_frame_bytes: 1,
            idle: None,
            handshake: None,
            ping: None,
        };
        let reader = read_loop(session, stream, otx, limits, watch::channel(false).1);
        let (reader, writer) = (
            std::mem::size_of_val(&reader),
            std::mem::size_of_val(&writer),
        );
        assert!(reader <= 1024, "the reader's future takes {reader} bytes");
        // The writer's task: its future, tokio's header and trailer, in 768 bytes.
        assert!(writer <= 640, "the writer's future takes {writer} bytes");
        assert!(
            std::mem::size_of::<RouterHandle>() <= 16,
            "a router handle is held three times per connection"
        );
    }
}
