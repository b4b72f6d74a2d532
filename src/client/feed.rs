//! What the driver and a [`Subscription`](crate::client::Subscription) share: the envelope of
//! a `map/event` ([`EventEnvelope`]) and the subscription's bounded buffer with its pause and
//! resume bookkeeping.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::task::Waker;

use serde::{Deserialize, Serialize};

use crate::client::error::ClientError;
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

    /// `event.data` parsed into a [`serde_json::Value`] (`Null` when absent). The event keeps
    /// its text; use [`EventEnvelope::data_as`] for a typed payload.
    pub fn data(&self) -> serde_json::Value {
        self.event
            .data
            .as_ref()
            .map_or(serde_json::Value::Null, |d| d.to_value())
    }

    /// Decodes `event.data` into one of the typed payloads of
    /// [`protocol::event`](crate::protocol::event) (e.g. `AgentRegisteredData`).
    ///
    /// # Errors
    /// [`ClientError::Decode`] when the data is absent or has another shape.
    pub fn data_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, ClientError> {
        let data = self.event.data.as_ref().map_or("null", |d| d.get());
        serde_json::from_str(data).map_err(|e| ClientError::decode(&self.event.kind, e))
    }
}

/// The buffer between the driver (producer) and a [`Subscription`] (consumer).
#[derive(Debug)]
pub(crate) struct SubShared {
    pub key: u64,
    state: Mutex<SubQueue>,
}

#[derive(Debug)]
pub(crate) struct SubQueue {
    pub(crate) buf: VecDeque<EventEnvelope>,
    pub(crate) capacity: usize,
    pub(crate) waker: Option<Waker>,
    /// The driver stopped delivering because the buffer filled up.
    pub(crate) paused: bool,
    /// The consumer asked the driver to resume.
    pub(crate) resume_requested: bool,
    /// `Some` once the stream has ended (with the reason, if it was an error).
    pub(crate) ended: Option<Option<ClientError>>,
    /// The current router subscription id.
    pub(crate) server_id: Option<SubscriptionId>,
    /// The id of the last event buffered (the replay cursor).
    pub(crate) last_event_id: Option<String>,
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

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, SubQueue> {
        // A panic while holding this lock cannot leave the queue inconsistent (every critical
        // section is a few field updates), so a poisoned lock is still usable.
        crate::sync::lock(&self.state)
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
