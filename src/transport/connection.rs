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
//! - Keep-alive: the writer pings every `ping_interval`; the reader closes the connection when
//!   nothing (not even a pong) arrived for `idle_timeout`.
//! - On shutdown the reader queues a close frame behind what is already queued, so pending
//!   responses and events still go out; the writer gets `drain_timeout` to finish.
//! - Handshake: a connection that has no MAP session `handshake_timeout` after it opened (or
//!   after its session ended) is closed with 1008 and a reason; on pipes, which have no close
//!   frame, the connection just ends.
//! - A peer that stops reading: the writer gives up when one write or flush takes longer than
//!   `idle_timeout`; the reader notices at once (the outbox closes) and ends the connection.
//!   Until then the outbox is bounded, so the stalled peer pins a bounded amount of memory.

use std::sync::Arc;
use std::time::Duration;

use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::protocol::jsonrpc::{ErrorObject, DEFAULT_MAX_DEPTH};
use crate::router::dispatch::Dispatcher;
use crate::router::dispatch::DEFAULT_MAX_BATCH;
use crate::router::outbox::outbox;
use crate::router::outbox::Outbound;
use crate::router::outbox::OutboxReceiver;
use crate::router::rate::RateLimits;
use crate::router::rpc::RpcSession;
use crate::router::rpc::SessionLimits;
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
    /// How often the writer pings (`None`: never).
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
/// # Cancel safety
/// Not cancel safe: cancelling it skips `Detach`, leaving the session attached to a dead
/// connection until the router stops. Let it finish; use `shutdown` to end it.
pub async fn serve_connection<St, Si>(
    router: RouterHandle,
    dispatcher: Arc<Dispatcher>,
    mut stream: St,
    sink: Si,
    opts: ConnectionOptions,
    mut shutdown: watch::Receiver<bool>,
) where
    St: Stream<Item = Result<InFrame, TransportError>> + Unpin + Send,
    Si: Sink<OutFrame> + Unpin + Send + 'static,
    Si::Error: std::fmt::Display,
{
    let conn = router.new_conn_id();
    let (tx, rx) = outbox(router.config().outbox_frames);
    // NB: the attach and the ending below are boxed: each is a state of this future only
    // while it runs, and an idle connection's task should not carry room for them.
    if Box::pin(router.send(Command::Attach {
        conn,
        outbox: tx.clone(),
        origin: opts.origin.clone(),
        transport: opts.transport,
        node: opts.node.clone(),
    }))
    .await
    .is_err()
    {
        return;
    }
    let writer = tokio::spawn(write_loop(
        rx,
        sink,
        router.clone(),
        conn,
        WriterOptions {
            ping_interval: opts.ping_interval,
            write_timeout: opts.idle_timeout,
            write_batch: opts.write_batch.max(1),
            linger: opts.linger.map(|l| l.min(MAX_LINGER)),
        },
    ));
    let mut session = RpcSession::new(router.clone(), dispatcher, conn, tx.clone(), opts.max_batch)
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
    let idle = opts.idle_timeout;
    let mut deadline = idle.map(|d| Instant::now() + d);
    // A supervised child's handshake is the supervisor's business (its own timeout).
    let handshake = match opts.origin {
        ConnOrigin::Remote | ConnOrigin::InProcess | ConnOrigin::Stdio => opts.handshake_timeout,
        ConnOrigin::Delegated(_) => None,
        ConnOrigin::Supervised { .. } => None,
    };
    let mut handshake_deadline = handshake.map(|d| Instant::now() + d);
    let close = |code: u16, reason: &str| Outbound::Close {
        code,
        reason: reason.into(),
    };

    let exit: Option<Outbound> = loop {
        if *shutdown.borrow() {
            break Some(close(1001, "server shutting down"));
        }
        let frame = tokio::select! {
            // NB: shutdown first, so a busy peer cannot starve it.
            biased;
            _ = shutdown.changed() => continue,
            () = tx.closed() => {
                tracing::debug!(%conn, "writer gave up (the peer is not reading); closing");
                break None;
            }
            () = sleep_until_opt(handshake_deadline) => {
                let ms = handshake.map_or(0, |d| d.as_millis());
                break Some(close(1008, &format!("handshake timeout: no map/connect within {ms} ms")));
            }
            () = session.commit_ready() => {
                if session.flush_committed(false).await.is_err() {
                    break None;
                }
                continue;
            }
            () = sleep_until_opt(deadline) => {
                break Some(close(1001, "idle timeout: no frames or pongs received"));
            }
            frame = stream.next() => frame,
        };
        if let Some(d) = idle {
            deadline = Some(Instant::now() + d);
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
                tracing::debug!(%conn, error = %e, "transport error");
                break None;
            }
            Some(Ok(InFrame::Alive)) => continue,
            Some(Ok(InFrame::Text(text))) => {
                if text.len() > opts.max_frame_bytes {
                    session
                        .reject_frame(&too_large(text.len(), opts.max_frame_bytes))
                        .await
                } else {
                    // NB: handling waits for room in the outbox when the peer reads slowly; a
                    // shutdown must still get through. Boxed: handling a request is the
                    // largest state of this loop, and an idle connection should not carry it.
                    tokio::select! {
                        r = Box::pin(session.handle_text(&text)) => r,
                        _ = shutdown.wait_for(|s| *s) => continue,
                    }
                }
            }
            Some(Ok(InFrame::TooLarge { len })) => {
                session
                    .reject_frame(&too_large(len, opts.max_frame_bytes))
                    .await
            }
            Some(Ok(InFrame::Binary)) => session
                .reject_frame(&ErrorObject::invalid_request(
                    "binary frames are not supported: send each JSON-RPC message as a text frame",
                ))
                .await,
            Some(Ok(InFrame::BadUtf8)) => {
                session
                    .reject_frame(&ErrorObject::parse_error("frame is not valid UTF-8"))
                    .await
            }
        };
        if result.is_err() {
            break None;
        }
        handshake_deadline = match (session.is_connected(), handshake_deadline) {
            (true, _) => None,
            // The session ended (map/disconnect): the clock starts again.
            (false, None) => handshake.map(|d| Instant::now() + d),
            (false, running) => running,
        };
    };

    Box::pin(finish(
        router,
        session,
        tx,
        writer,
        exit,
        opts.drain_timeout,
        conn,
    ))
    .await;
}

/// Ends a connection: its last answers and close frame, the router told, the writer drained.
async fn finish(
    router: RouterHandle,
    mut session: RpcSession,
    tx: crate::router::outbox::Outbox,
    writer: tokio::task::JoinHandle<()>,
    exit: Option<Outbound>,
    drain_timeout: Duration,
    conn: ConnId,
) {
    if let Some(close) = exit {
        // Answers still waiting for their commits go first (each bounded by the commit
        // timeout, all by the drain timeout).
        let _ = tokio::time::timeout(drain_timeout, session.flush_committed(true)).await;
        // Behind everything already queued; bounded so a peer that reads nothing cannot hold us.
        let _ = tokio::time::timeout(drain_timeout, tx.push(close)).await;
    }
    let _ = router.send(Command::Detach { conn }).await;
    drop(session);
    drop(tx);
    // The router dropped its outbox handles on Detach; the writer ends when the queue is empty.
    let abort = writer.abort_handle();
    if tokio::time::timeout(drain_timeout, writer).await.is_err() {
        tracing::debug!(%conn, "writer did not drain in time; dropping the connection");
        abort.abort();
    }
}

fn too_large(len: usize, limit: usize) -> ErrorObject {
    ErrorObject::invalid_request(format!(
        "frame of {len} bytes exceeds the limit of {limit} bytes"
    ))
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

struct WriterOptions {
    ping_interval: Option<Duration>,
    /// A write or flush that takes longer than this means the peer stopped reading: give up.
    write_timeout: Option<Duration>,
    write_batch: usize,
    linger: Option<Duration>,
}

/// Runs a sink operation under the write timeout. `Err(())` means failed or timed out.
async fn bounded<F, E>(limit: Option<Duration>, conn: ConnId, what: &str, op: F) -> Result<(), ()>
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let result = match limit {
        Some(limit) => match tokio::time::timeout(limit, op).await {
            Ok(r) => r,
            Err(_) => {
                tracing::debug!(%conn, "{what} timed out: the peer is not reading");
                return Err(());
            }
        },
        None => op.await,
    };
    result.map_err(|e| tracing::debug!(%conn, error = %e, "{what} failed"))
}

/// The single writer: drains the outbox into the sink.
async fn write_loop<Si>(
    mut rx: OutboxReceiver,
    mut sink: Si,
    router: RouterHandle,
    conn: ConnId,
    opts: WriterOptions,
) where
    Si: Sink<OutFrame> + Unpin + Send,
    Si::Error: std::fmt::Display,
{
    let limit = opts.write_timeout;
    let mut ping = opts.ping_interval.map(|p| {
        let mut i = tokio::time::interval_at(Instant::now() + p, p);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    'outer: loop {
        let first = tokio::select! {
            item = rx.recv() => item,
            _ = tick(&mut ping) => {
                if bounded(limit, conn, "ping", sink.send(OutFrame::Ping)).await.is_err() {
                    break;
                }
                continue;
            }
        };
        let Some(mut item) = first else { break };
        let mut fed = 0;
        let mut yielded = false;
        // With a linger, events and messages wait for company until this instant; an answer
        // to a request (a `Frame`) in the batch ends the wait.
        let linger_until = opts.linger.map(|l| Instant::now() + l);
        let mut answered = false;
        loop {
            answered |= matches!(item, Outbound::Frame(_));
            match item {
                Outbound::Close { code, reason } => {
                    let _ = bounded(limit, conn, "flush", sink.flush()).await;
                    let close = OutFrame::Close { code, reason };
                    let _ = bounded(limit, conn, "close", sink.send(close)).await;
                    break 'outer;
                }
                other => {
                    if let Some(text) = other.into_text() {
                        let write = sink.feed(OutFrame::Text(text));
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
        if rx.take_wakeup() && router.send(Command::Drained { conn }).await.is_err() {
            break;
        }
    }
    rx.close();
    let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
}

async fn tick(ping: &mut Option<tokio::time::Interval>) {
    match ping {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}
