//! Event subscriptions: [`Subscription`] (a `Stream` of [`EventEnvelope`]s) and the bounded
//! buffer the driver fills. The guarantees are documented on [`Subscription`].

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures::Stream;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::client::driver::Command;
use crate::client::driver::Internal;
use crate::client::Client;
use crate::client::ClientError;
use crate::protocol::event::Event;
use crate::protocol::ids::SubscriptionId;

/// One `map/event` notification: the router's envelope around an [`Event`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventEnvelope {
    /// The router subscription that delivered it.
    pub subscription_id: SubscriptionId,
    /// 1 for the first event of that router subscription, +1 per event.
    pub sequence_number: u64,
    /// The event's id (a ULID; equal to `event.id`). Absent only on `subscription.overflow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// When the router recorded the event (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<u64>,
    /// Causes already delivered on this subscription.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caused_by: Option<Vec<String>>,
    /// The event.
    pub event: Event,
}

impl EventEnvelope {
    /// The event type (`agent_registered`, `message_delivered`, ...).
    pub fn kind(&self) -> &str {
        &self.event.kind
    }

    /// Decodes `event.data` into one of the typed payloads of
    /// [`protocol::event`](crate::protocol::event) (e.g. `AgentRegisteredData`).
    ///
    /// # Errors
    /// [`ClientError::Decode`] when the data is absent or has another shape.
    pub fn data_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, ClientError> {
        let data = self.event.data.clone().unwrap_or(serde_json::Value::Null);
        serde_json::from_value(data).map_err(|e| ClientError::decode(&self.event.kind, e))
    }
}

/// The buffer between the driver (producer) and a [`Subscription`] (consumer).
#[derive(Debug)]
pub(crate) struct SubShared {
    pub key: u64,
    state: Mutex<SubQueue>,
}

#[derive(Debug)]
struct SubQueue {
    buf: VecDeque<EventEnvelope>,
    capacity: usize,
    waker: Option<Waker>,
    /// The driver stopped delivering because the buffer filled up.
    paused: bool,
    /// The consumer asked the driver to resume.
    resume_requested: bool,
    /// `Some` once the stream has ended (with the reason, if it was an error).
    ended: Option<Option<ClientError>>,
    /// The current router subscription id.
    server_id: Option<SubscriptionId>,
    /// The id of the last event buffered (the replay cursor).
    last_event_id: Option<String>,
}

/// What happened to an event the driver offered.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Offer {
    /// Buffered; room remains.
    Buffered,
    /// Buffered, and now the buffer is full: the subscription is paused.
    Paused,
}

impl SubShared {
    pub fn new(key: u64, capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            key,
            state: Mutex::new(SubQueue {
                buf: VecDeque::new(),
                capacity: capacity.max(2),
                waker: None,
                paused: false,
                resume_requested: false,
                ended: None,
                server_id: None,
                last_event_id: None,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SubQueue> {
        // A panic while holding this lock cannot leave the queue inconsistent (every critical
        // section is a few field updates), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Buffers an event (driver side).
    pub fn offer(&self, env: EventEnvelope) -> Offer {
        let mut q = self.lock();
        if let Some(id) = &env.event_id {
            q.last_event_id = Some(id.clone());
        }
        q.buf.push_back(env);
        if let Some(w) = q.waker.take() {
            w.wake();
        }
        if q.buf.len() >= q.capacity {
            q.paused = true;
            q.resume_requested = false;
            Offer::Paused
        } else {
            Offer::Buffered
        }
    }

    /// The router subscription id changed (subscribed, re-subscribed, or lost: `None`).
    pub fn set_server_id(&self, id: Option<SubscriptionId>) {
        self.lock().server_id = id;
    }

    /// A re-subscription after a pause succeeded: deliver again.
    pub fn unpause(&self) {
        let mut q = self.lock();
        q.paused = false;
        q.resume_requested = false;
    }

    /// Whether the driver should (re-)subscribe this subscription now: not paused, or paused
    /// and the consumer has caught up.
    pub fn wants_delivery(&self) -> bool {
        let q = self.lock();
        !q.paused || q.resume_requested
    }

    /// Where a re-subscription starts: after the last buffered event.
    pub fn last_event_id(&self) -> Option<String> {
        self.lock().last_event_id.clone()
    }

    /// Ends the stream (after the buffered events).
    pub fn end(&self, error: Option<ClientError>) {
        let mut q = self.lock();
        if q.ended.is_none() {
            q.ended = Some(error);
        }
        q.server_id = None;
        if let Some(w) = q.waker.take() {
            w.wake();
        }
    }
}

/// A live event subscription: a [`Stream`] of [`EventEnvelope`]s in the router's order.
///
/// Created by [`Client::subscribe`]. The stream ends when the subscription is unsubscribed or
/// the client closes ([`Subscription::error`] then says why). Dropping it unsubscribes.
///
/// # No event lost, none duplicated
///
/// - The client registers a subscription's buffer while it handles the `map/subscribe`
///   *response*, before the caller gets the `Subscription`; the router never sends a
///   subscription's first event before that response, so the first event cannot be missed.
/// - A consumer that falls behind is never skipped silently. When the buffer
///   ([`ClientOptions::subscription_buffer`](super::ClientOptions::subscription_buffer), 1 024
///   events by default) is full, the client **pauses** the subscription: it unsubscribes on the
///   router and drops what arrives after that. Once the consumer has drained half of the
///   buffer, the client subscribes again with `replayFrom` = the id of the last event it
///   buffered, so the router replays the rest from its retained log and then continues live,
///   without gap or duplicate. Should the router no longer retain those events, the stream
///   yields the router's `subscription.overflow` notice (with `eventsDropped`) first.
/// - After a reconnect every live subscription is re-subscribed the same way. A subscription
///   that had not received any event yet resumes from the time it was created (by this
///   machine's clock).
///
/// The router's `subscriptionId` and `sequenceNumber` belong to one router subscription: after
/// a pause or a reconnect the stream continues under a new id whose numbers start again at 1.
///
/// ```no_run
/// # async fn demo(client: map_router::client::Client) -> Result<(), map_router::client::ClientError> {
/// use futures::StreamExt;
/// use map_router::protocol::event::SubscriptionFilter;
///
/// let mut events = client
///     .subscribe(SubscriptionFilter {
///         event_types: Some(vec!["agent.*".into()]),
///         ..Default::default()
///     })
///     .await?;
/// while let Some(e) = events.next().await {
///     println!("{} from {:?}", e.kind(), e.event.source);
/// }
/// # Ok(()) }
/// ```
pub struct Subscription {
    shared: Arc<SubShared>,
    client: Client,
    internal: mpsc::UnboundedSender<Internal>,
    /// Set once unsubscribed explicitly (no second unsubscribe on drop).
    done: bool,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    pub(crate) fn new(
        shared: Arc<SubShared>,
        client: Client,
        internal: mpsc::UnboundedSender<Internal>,
    ) -> Self {
        Self {
            shared,
            client,
            internal,
            done: false,
        }
    }

    /// The current router subscription id (`None` while reconnecting or paused).
    pub fn id(&self) -> Option<SubscriptionId> {
        self.shared.lock().server_id.clone()
    }

    /// The id of the last event received (where a resume starts).
    pub fn last_event_id(&self) -> Option<String> {
        self.shared.last_event_id()
    }

    /// Events buffered and not yet read.
    pub fn backlog(&self) -> usize {
        self.shared.lock().buf.len()
    }

    /// Why the stream ended, when it ended with an error (e.g. the client closed after
    /// reconnecting failed).
    pub fn error(&self) -> Option<ClientError> {
        self.shared.lock().ended.clone().flatten()
    }

    /// Unsubscribes on the router and ends the stream.
    ///
    /// # Errors
    /// The router's error, or a transport error (the subscription ends on the client anyway).
    pub async fn unsubscribe(mut self) -> Result<(), ClientError> {
        self.done = true;
        let (reply, rx) = oneshot::channel();
        self.client
            .command(
                Command::Unsubscribe {
                    key: self.shared.key,
                    reply,
                },
                rx,
            )
            .await
    }
}

impl Stream for Subscription {
    type Item = EventEnvelope;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<EventEnvelope>> {
        let this = self.get_mut();
        let mut q = this.shared.lock();
        if let Some(item) = q.buf.pop_front() {
            if q.paused && !q.resume_requested && q.buf.len() <= q.capacity / 2 {
                q.resume_requested = true;
                let _ = this
                    .internal
                    .send(Internal::ResumeSubscription(this.shared.key));
            }
            return Poll::Ready(Some(item));
        }
        if q.ended.is_some() {
            return Poll::Ready(None);
        }
        q.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if !self.done {
            let _ = self
                .internal
                .send(Internal::DropSubscription(self.shared.key));
        }
    }
}
