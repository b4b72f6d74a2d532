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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::Notify;

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

/// The text of a frame several recipients share (a `map/message`): the bytes of one `String`
/// behind a reference count (`bytes::Bytes`), so each recipient's socket takes them without a
/// copy of its own (an `Arc<str>` became a new `String` per recipient in the writer). Built only
/// from text, so always UTF-8.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedText(Bytes);

impl SharedText {
    /// The bytes, shared (for a socket that takes `Bytes`).
    pub fn into_bytes(self) -> Bytes {
        self.0
    }

    /// The UTF-8 bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The text. Checks the bytes again (the crate allows no `unsafe`): for tests and cold
    /// paths; the writers take the bytes.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("a SharedText is built from text")
    }
}

impl From<String> for SharedText {
    /// Takes the string's buffer (no copy of the text).
    fn from(s: String) -> Self {
        SharedText(Bytes::from(s))
    }
}

impl From<&str> for SharedText {
    fn from(s: &str) -> Self {
        SharedText(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl AsRef<[u8]> for SharedText {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Something for the writer to put on the wire.
#[derive(Debug)]
pub enum Outbound {
    /// A complete JSON-RPC frame (response, error, or a one-off notification).
    Frame(String),
    /// A complete frame shared by several recipients (a `map/message`).
    Shared(SharedText),
    /// A `map/event` to encode.
    Event(Delivery),
    /// A keep-alive probe, queued by the connection's own reader every ping interval (a
    /// WebSocket ping frame; pipes and event streams write nothing for it).
    Ping,
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

/// The queue itself: allocated on the first push, so an idle connection holds no slots (the
/// channel this replaced allocated a block of 32 when the connection opened: about 2 KB of
/// every idle session, docs/performance.md).
#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<Outbound>,
    /// Outbox handles alive (the router's and the session's); at 0 the writer's `recv` ends.
    senders: usize,
}

/// A drained queue keeps at most this many slots (a burst's memory goes back).
const KEEP_SLOTS: usize = 32;

#[derive(Debug)]
struct Shared {
    queue: Mutex<Queue>,
    capacity: usize,
    /// The writer is gone (or closed the queue): pushes fail.
    closed: AtomicBool,
    wants_wakeup: AtomicBool,
    /// Signalled after a push that must not wait for company: a frame (an answer) or a close.
    /// A writer holding events ([`OutboxReceiver::linger`]) waits on this, not on every push.
    urgent: Notify,
    /// Signalled after every push and when the last sender goes: the writer's `recv`.
    item: Notify,
    /// Signalled when the writer takes an item or goes: a session waiting in `push`.
    room: Notify,
    /// Signalled once when the writer goes: `Outbox::closed`.
    gone: Notify,
}

impl Shared {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        // NB. Nothing panics while holding the lock; a poisoned queue is still consistent.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pushed(&self, urgent: bool) {
        self.item.notify_one();
        if urgent {
            self.urgent.notify_one();
        }
    }

    /// Queues `item` if there is room and the writer is there.
    fn try_push(&self, item: Outbound) -> Result<(), PushError> {
        let urgent = item.is_urgent();
        {
            let mut q = self.queue();
            if self.closed.load(Ordering::Acquire) {
                return Err(PushError::Closed(item));
            }
            if q.items.len() >= self.capacity {
                return Err(PushError::Full(item));
            }
            if q.items.capacity() == 0 {
                // NB: one slot first, not the four `VecDeque` starts with: a connection that
                // had only its `map/connect` answered holds 56 bytes, not 224 (a second item
                // grows it as usual).
                q.items.reserve_exact(1);
            }
            q.items.push_back(item);
        }
        self.pushed(urgent);
        Ok(())
    }

    fn take(&self) -> Option<Outbound> {
        let item = {
            let mut q = self.queue();
            let item = q.items.pop_front();
            if q.items.is_empty() && q.items.capacity() > KEEP_SLOTS {
                q.items.shrink_to(KEEP_SLOTS);
            }
            item
        };
        if item.is_some() {
            self.room.notify_one();
        }
        item
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.room.notify_waiters();
        self.gone.notify_waiters();
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
#[derive(Debug)]
pub struct Outbox {
    shared: Arc<Shared>,
}

impl Clone for Outbox {
    fn clone(&self) -> Self {
        self.shared.queue().senders += 1;
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        let last = {
            let mut q = self.shared.queue();
            q.senders -= 1;
            q.senders == 0
        };
        if last {
            self.shared.item.notify_one();
        }
    }
}

/// The receiving side, owned by the connection's writer task.
#[derive(Debug)]
pub struct OutboxReceiver {
    shared: Arc<Shared>,
}

impl Drop for OutboxReceiver {
    fn drop(&mut self) {
        self.shared.close();
    }
}

/// Creates an outbox holding at most `capacity` frames.
pub fn outbox(capacity: usize) -> (Outbox, OutboxReceiver) {
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue {
            items: VecDeque::new(),
            senders: 1,
        }),
        capacity: capacity.max(1),
        closed: AtomicBool::new(false),
        wants_wakeup: AtomicBool::new(false),
        urgent: Notify::new(),
        item: Notify::new(),
        room: Notify::new(),
        gone: Notify::new(),
    });
    (
        Outbox {
            shared: shared.clone(),
        },
        OutboxReceiver { shared },
    )
}

impl Outbox {
    /// Pushes without waiting (router side).
    pub fn try_push(&self, item: Outbound) -> Result<(), PushError> {
        self.shared.try_push(item)
    }

    /// Pushes, waiting for room (session side). Fails only when the writer is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: if cancelled, the item was not queued.
    pub async fn push(&self, mut item: Outbound) -> Result<(), Outbound> {
        loop {
            let room = self.shared.room.notified();
            tokio::pin!(room);
            // Registered before the check: a take between the check and the wait still wakes us.
            room.as_mut().enable();
            match self.shared.try_push(item) {
                Ok(()) => return Ok(()),
                Err(PushError::Closed(back)) => return Err(back),
                Err(PushError::Full(back)) => item = back,
            }
            room.await;
        }
    }

    /// Asks the writer to send `Command::Drained` once the queue has room again. Call *before*
    /// the last `try_push` attempt (see the module docs).
    pub fn request_wakeup(&self) {
        self.shared.wants_wakeup.store(true, Ordering::Release);
    }

    /// Frames queued and not yet taken by the writer.
    pub fn depth(&self) -> usize {
        self.shared.queue().items.len()
    }

    /// Whether the writer has gone away.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Completes when the writer has gone away (it gave up on a peer that stopped reading, or
    /// the connection is closing).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn closed(&self) {
        let gone = self.shared.gone.notified();
        tokio::pin!(gone);
        gone.as_mut().enable();
        if self.is_closed() {
            return;
        }
        gone.await;
    }
}

impl OutboxReceiver {
    /// Waits for the next item; `None` when every sender is gone and the queue is empty.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn recv(&mut self) -> Option<Outbound> {
        loop {
            let item = self.shared.item.notified();
            tokio::pin!(item);
            item.as_mut().enable();
            if let Some(next) = self.shared.take() {
                return Some(next);
            }
            if self.shared.queue().senders == 0 {
                return self.shared.take();
            }
            item.await;
        }
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
        self.shared.take()
    }

    /// Whether the router asked for a wake-up and the queue is at most half full. Clears the
    /// request when it returns true.
    pub fn take_wakeup(&self) -> bool {
        self.shared.queue().items.len() <= self.shared.capacity / 2
            && self.shared.wants_wakeup.swap(false, Ordering::AcqRel)
    }

    /// Stops accepting new items; queued items can still be received.
    pub fn close(&mut self) {
        self.shared.close();
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
            Outbound::Shared(s) => Some(s.as_str().to_owned()),
            Outbound::Event(d) => {
                let mut s = String::new();
                d.encode(&mut s);
                Some(s)
            }
            Outbound::Ping | Outbound::Close { .. } => None,
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

    /// A shared frame is the sender's buffer, and every recipient's copy is that buffer again:
    /// no copy when it is built from the `String`, none per recipient, none on the way to a
    /// socket that takes `Bytes`.
    #[test]
    fn a_shared_frame_is_one_buffer_for_every_recipient() {
        let text = String::from(r#"{"jsonrpc":"2.0","method":"map/message","params":{}}"#);
        let at = text.as_ptr();
        let shared = SharedText::from(text);
        assert_eq!(shared.as_bytes().as_ptr(), at, "built without a copy");
        let recipients: Vec<SharedText> = (0..10).map(|_| shared.clone()).collect();
        for r in &recipients {
            assert_eq!(
                r.as_bytes().as_ptr(),
                at,
                "a recipient's frame is the same bytes"
            );
            assert_eq!(
                r.as_str(),
                r#"{"jsonrpc":"2.0","method":"map/message","params":{}}"#
            );
        }
        let bytes = recipients.into_iter().next().unwrap().into_bytes();
        assert_eq!(bytes.as_ptr(), at, "handed to the socket without a copy");
        let (tx, mut rx) = outbox(4);
        tx.try_push(Outbound::Shared(shared.clone())).unwrap();
        match rx.try_recv() {
            Some(Outbound::Shared(s)) => assert_eq!(s.as_bytes().as_ptr(), at),
            other => panic!("expected the shared frame, got {other:?}"),
        }
    }

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
