//! The bounded outbox between the router (and a session's own responses) and the connection's
//! single writer.
//!
//! Owns the queue and its back-pressure contract, nothing else:
//! - The router only ever uses [`Outbox::try_push`]. When the queue is full the router learns it
//!   at once, keeps the undelivered work in its own log/queues, and asks to be woken
//!   ([`Outbox::request_wakeup`]). It never waits on a peer.
//! - The session pushes its responses with [`Outbox::push`], which waits: a client that does
//!   not read its responses stops being read (async-lsp's "a flooding client is slowed by its own
//!   unread responses").
//! - The writer drains the queue and, once it has room again, tells the router
//!   (`Command::Drained`), which then catches paused subscriptions up from the event log.
//!
//! Wake-up protocol (no lost wake-ups): the router sets `wants_wakeup` *before* its final
//! `try_push` attempt. If that attempt fails, the queue holds items the writer has not taken yet,
//! so the writer will see the flag after taking them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::protocol::ids::{EventId, SubscriptionId};
use crate::router::events::log::EventRecord;

/// Which causes to write in a delivery's envelope `causedBy`.
#[derive(Debug, Clone)]
pub enum CausedBy {
    /// The event has no causes, or none was delivered on this subscription.
    None,
    /// All of the event's causes.
    All,
    /// Only these.
    Some(Vec<EventId>),
}

/// One event delivery on one subscription. The event's JSON is shared; only this small envelope
/// is per delivery.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The subscription.
    pub subscription: SubscriptionId,
    /// Its `sequenceNumber`.
    pub sequence: u64,
    /// The shared, already-serialized event.
    pub record: Arc<EventRecord>,
    /// Envelope causes.
    pub caused_by: CausedBy,
}

/// Something for the writer to put on the wire.
#[derive(Debug)]
pub enum Outbound {
    /// A complete JSON-RPC frame (response, error, or a one-off notification).
    Frame(String),
    /// A complete frame shared by several recipients (a `map/message`).
    Shared(Arc<str>),
    /// A `map/event` to encode.
    Event(Delivery),
    /// Close the connection after writing what came before (WebSocket close code and reason).
    Close {
        /// Close code (e.g. 1000 normal, 1001 going away, 1008 policy).
        code: u16,
        /// Human-readable reason.
        reason: String,
    },
}

/// Result of a non-blocking push.
#[derive(Debug)]
pub enum PushError {
    /// The queue is full; the item is returned.
    Full(Outbound),
    /// The writer is gone (the connection is closing); the item is returned.
    Closed(Outbound),
}

#[derive(Debug, Default)]
struct Shared {
    wants_wakeup: AtomicBool,
    /// Signalled after a push that must not wait for company: a frame (an answer) or a close.
    /// A writer holding events ([`OutboxReceiver::linger`]) waits on this, not on every push.
    urgent: tokio::sync::Notify,
}

impl Shared {
    fn pushed(&self, urgent: bool) {
        if urgent {
            self.urgent.notify_one();
        }
    }
}

impl Outbound {
    /// Whether the writer should write it without waiting for more (see
    /// [`OutboxReceiver::linger`]).
    fn is_urgent(&self) -> bool {
        matches!(self, Outbound::Frame(_) | Outbound::Close { .. })
    }
}

/// The sending side, held by the router (in its connection table) and by the session.
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Outbound>,
    shared: Arc<Shared>,
}

/// The receiving side, owned by the connection's writer task.
#[derive(Debug)]
pub struct OutboxReceiver {
    rx: mpsc::Receiver<Outbound>,
    shared: Arc<Shared>,
    capacity: usize,
}

/// Creates an outbox holding at most `capacity` frames.
pub fn outbox(capacity: usize) -> (Outbox, OutboxReceiver) {
    let capacity = capacity.max(1);
    let (tx, rx) = mpsc::channel(capacity);
    let shared = Arc::new(Shared::default());
    (
        Outbox {
            tx,
            shared: shared.clone(),
        },
        OutboxReceiver {
            rx,
            shared,
            capacity,
        },
    )
}

impl Outbox {
    /// Pushes without waiting (router side).
    pub fn try_push(&self, item: Outbound) -> Result<(), PushError> {
        let urgent = item.is_urgent();
        self.tx.try_send(item).map_err(|e| match e {
            mpsc::error::TrySendError::Full(item) => PushError::Full(item),
            mpsc::error::TrySendError::Closed(item) => PushError::Closed(item),
        })?;
        self.shared.pushed(urgent);
        Ok(())
    }

    /// Pushes, waiting for room (session side). Fails only when the writer is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: if cancelled, the item was not queued.
    pub async fn push(&self, item: Outbound) -> Result<(), Outbound> {
        let urgent = item.is_urgent();
        self.tx.send(item).await.map_err(|e| e.0)?;
        self.shared.pushed(urgent);
        Ok(())
    }

    /// Asks the writer to send `Command::Drained` once the queue has room again. Call *before*
    /// the last `try_push` attempt (see the module docs).
    pub fn request_wakeup(&self) {
        self.shared.wants_wakeup.store(true, Ordering::Release);
    }

    /// Frames queued and not yet taken by the writer.
    pub fn depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Whether the writer has gone away.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Completes when the writer has gone away (it gave up on a peer that stopped reading, or
    /// the connection is closing).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }
}

impl OutboxReceiver {
    /// Waits for the next item; `None` when every sender is gone.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn recv(&mut self) -> Option<Outbound> {
        self.rx.recv().await
    }

    /// Waits until `until`, or until a frame or a close is pushed (possibly one pushed since
    /// the last linger: at worst the wait ends early). Events and messages pushed meanwhile do
    /// not wake the writer: they wait in the queue, and a full queue pauses the router's
    /// deliveries as always (no loss). A writer that lingers takes what came with
    /// [`OutboxReceiver::try_recv`] afterwards.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn linger(&mut self, until: tokio::time::Instant) {
        let _ = tokio::time::timeout_at(until, self.shared.urgent.notified()).await;
    }

    /// Takes an item if one is ready.
    pub fn try_recv(&mut self) -> Option<Outbound> {
        self.rx.try_recv().ok()
    }

    /// Whether the router asked for a wake-up and the queue is at most half full. Clears the
    /// request when it returns true.
    pub fn take_wakeup(&self) -> bool {
        self.rx.len() <= self.capacity / 2 && self.shared.wants_wakeup.swap(false, Ordering::AcqRel)
    }

    /// Stops accepting new items; queued items can still be received.
    pub fn close(&mut self) {
        self.rx.close();
    }
}

impl Delivery {
    /// Writes the `map/event` frame: the per-subscription envelope around the shared event
    /// JSON.
    pub fn encode(&self, out: &mut String) {
        use std::fmt::Write as _;
        let rec = &self.record;
        out.reserve(rec.json.len() + rec.envelope_head.len() + 128);
        out.push_str(
            "{\"jsonrpc\":\"2.0\",\"method\":\"map/event\",\"params\":{\"subscriptionId\":",
        );
        // Subscription ids are router-generated ULIDs, but escape anyway: it costs little.
        push_json_str(out, self.subscription.as_str());
        let _ = write!(out, ",\"sequenceNumber\":{}", self.sequence);
        out.push_str(&rec.envelope_head);
        match &self.caused_by {
            CausedBy::None => {}
            CausedBy::All => {
                out.push_str(",\"causedBy\":");
                crate::router::events::log::push_id_array(out, &rec.caused_by);
            }
            CausedBy::Some(ids) => {
                out.push_str(",\"causedBy\":");
                crate::router::events::log::push_id_array(out, ids);
            }
        }
        out.push_str(",\"event\":");
        out.push_str(&rec.json);
        out.push_str("}}");
    }
}

fn push_json_str(out: &mut String, s: &str) {
    if s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into()));
    }
}

impl Outbound {
    /// The text frame to write, or `None` for `Close`.
    pub fn into_text(self) -> Option<String> {
        match self {
            Outbound::Frame(s) => Some(s),
            Outbound::Shared(s) => Some(s.to_string()),
            Outbound::Event(d) => {
                let mut s = String::new();
                d.encode(&mut s);
                Some(s)
            }
            Outbound::Close { .. } => None,
        }
    }
}

/// Tries to queue; on a full queue requests a wake-up and tries once more (the writer then
/// reports room with `Command::Drained`).
pub(crate) fn push(outbox: &Outbox, item: Outbound) -> Result<(), PushError> {
    match outbox.try_push(item) {
        Err(PushError::Full(item)) => {
            outbox.request_wakeup();
            outbox.try_push(item)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The channel allocates its first block of 32 slots when a connection opens, so every
    /// byte of `Outbound` is paid 32 times per idle connection.
    #[test]
    fn a_queued_frame_stays_small() {
        let size = std::mem::size_of::<Outbound>();
        assert!(size <= 56, "Outbound takes {size} bytes");
    }

    #[tokio::test]
    async fn full_queue_returns_the_item_and_wakeup_fires_after_draining() {
        let (tx, mut rx) = outbox(2);
        tx.try_push(Outbound::Frame("a".into())).unwrap();
        tx.try_push(Outbound::Frame("b".into())).unwrap();
        tx.request_wakeup();
        match tx.try_push(Outbound::Frame("c".into())) {
            Err(PushError::Full(Outbound::Frame(s))) => assert_eq!(s, "c"),
            other => panic!("{other:?}"),
        }
        assert!(!rx.take_wakeup(), "still full");
        assert!(rx.try_recv().is_some());
        assert!(rx.take_wakeup(), "half empty and requested");
        assert!(!rx.take_wakeup(), "request consumed");
    }

    #[tokio::test]
    async fn closed_writer_is_reported() {
        let (tx, rx) = outbox(2);
        drop(rx);
        assert!(matches!(
            tx.try_push(Outbound::Frame("x".into())),
            Err(PushError::Closed(_))
        ));
        assert!(tx.is_closed());
    }
}
