//! Event subscriptions: [`Subscription`] (a `Stream` of [`EventEnvelope`]s) and the bounded
//! buffer the driver fills. The guarantees are documented on [`Subscription`].

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use tokio::sync::{mpsc, oneshot};

use crate::client::command::{Command, Internal};
use crate::client::error::ClientError;
use crate::client::feed::{EventEnvelope, SubShared};
use crate::client::handle::Client;
use crate::protocol::event::SubscriptionFilter;
use crate::protocol::ids::SubscriptionId;
use crate::protocol::methods::events::SubscribeParams;

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
impl Client {
    /// Subscribes to the events matching `filter` (the default filter matches everything this
    /// participant may see).
    ///
    /// # Errors
    /// As [`Client::call`] (`-32602` for a malformed filter).
    pub async fn subscribe(&self, filter: SubscriptionFilter) -> Result<Subscription, ClientError> {
        self.subscribe_with(SubscribeParams {
            filter: Some(filter),
            ..SubscribeParams::default()
        })
        .await
    }

    /// Subscribes with every `map/subscribe` option: `options.excludeOwnEvents`, and
    /// `replayFrom` (an event id or a Unix-ms timestamp) to start with retained history.
    ///
    /// # Errors
    /// As [`Client::subscribe`].
    pub async fn subscribe_with(
        &self,
        params: SubscribeParams,
    ) -> Result<Subscription, ClientError> {
        let (reply, rx) = oneshot::channel();
        let shared = self
            .command(Command::Subscribe { params, reply }, rx)
            .await?;
        Ok(Subscription::new(
            shared,
            self.clone(),
            self.inner.internal_tx.clone(),
        ))
    }
}
