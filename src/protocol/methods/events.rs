//! `map/subscribe`, `map/unsubscribe` and `map/replay` (events.md §4–5).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::protocol::capabilities::Capability;
use crate::protocol::event::{ReplayedEvent, SubscriptionFilter};
use crate::protocol::ids::SubscriptionId;
use crate::protocol::methods::method::method;

/// `options` of `map/subscribe`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct SubscribeOptions {
    /// Skip events whose source is this session's participant or one of its agents.
    pub exclude_own_events: Option<bool>,
    /// Accepted for compatibility; payloads are always included.
    pub include_message_payloads: Option<bool>,
    /// Credit window: at most this many events unacknowledged (`map/subscribe.ack`) in flight.
    /// Without it, a subscription enters credit mode (1024) on its first ack.
    pub ack_window: Option<u64>,
    /// When the subscription falls behind everything retained: `skip` (default: after an
    /// overflow notice, continue live) or `close` (after the notice, end).
    pub on_overflow: Option<OverflowPolicy>,
}

/// `map/subscribe` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct SubscribeParams {
    /// Which events (all when absent).
    pub filter: Option<SubscriptionFilter>,
    /// Delivery options.
    pub options: Option<SubscribeOptions>,
    /// Deliver retained history first: after this event id (string), or from this timestamp
    /// (integer, Unix ms, inclusive).
    pub replay_from: Option<serde_json::Value>,
    /// MAPServer's spelling of `replayFrom` with an event id.
    pub start_after: Option<String>,
}

/// `map/subscribe` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubscribeResult {
    /// Used in every `map/event` of this subscription.
    pub subscription_id: SubscriptionId,
    /// Set when `replayFrom` (or `startAfter`) names an event id the log does not have (and
    /// not because retention removed it: that is `subscription.overflow`). The subscription
    /// starts after that id in log order (ids are time-ordered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_event_id: Option<bool>,
}

/// `map/unsubscribe` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnsubscribeParams {
    /// The subscription.
    pub subscription_id: SubscriptionId,
}

/// The closed subscription.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClosedSubscription {
    /// Its id.
    pub id: SubscriptionId,
    /// When it closed (Unix ms).
    pub closed_at: u64,
}

/// `map/unsubscribe` result. Unsubscribing an unknown id succeeds with `unsubscribed: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnsubscribeResult {
    /// Whether a subscription was closed by this call.
    pub unsubscribed: bool,
    /// The subscription.
    pub subscription: ClosedSubscription,
}

/// `map/replay` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ReplayParams {
    /// Exclusive position (a ULID; need not be a retained event).
    pub after_event_id: Option<String>,
    /// Inclusive lower time bound (Unix ms); ignored when `afterEventId` is given.
    pub from_timestamp: Option<u64>,
    /// Inclusive upper time bound (Unix ms).
    pub to_timestamp: Option<u64>,
    /// Same shape as a subscription filter.
    pub filter: Option<SubscriptionFilter>,
    /// Page size, 1..=1000 (default 100).
    pub limit: Option<u32>,
}

/// A replayed event already in wire form.
#[derive(Debug, Clone, Deserialize)]
pub struct RawReplayedEvent(pub Box<RawValue>);

impl Serialize for RawReplayedEvent {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl JsonSchema for RawReplayedEvent {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        ReplayedEvent::schema_name()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        ReplayedEvent::json_schema(g)
    }
}

/// `map/replay` result.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplayResult {
    /// Matching events, oldest first.
    pub events: Vec<RawReplayedEvent>,
    /// More matching events exist after the last one returned.
    pub has_more: bool,
    /// How many retained events match in total (across all pages); left out when counting
    /// would mean scanning more than a bounded number of events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_count: Option<u64>,
    /// Set when `afterEventId` points before the oldest retained event: the events between it
    /// and the first returned one are gone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap: Option<bool>,
    /// Set when `afterEventId` is an id the log does not have (and not because retention
    /// removed it: that is `gap`). The replay continues after that id in log order (ids are
    /// time-ordered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_event_id: Option<bool>,
}

/// What a subscription does when it falls behind everything the log retains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OverflowPolicy {
    /// After the `subscription.overflow` notice, continue with live events.
    #[default]
    Skip,
    /// After the notice, end the subscription.
    Close,
}

method!(
    /// `map/subscribe`.
    Subscribe, "map/subscribe", Some(Capability::CanObserve), SubscribeParams, SubscribeResult
);
method!(
    /// `map/unsubscribe`.
    Unsubscribe, "map/unsubscribe", Some(Capability::CanObserve), UnsubscribeParams, UnsubscribeResult
);
method!(
    /// `map/replay`.
    Replay, "map/replay", Some(Capability::CanObserve), ReplayParams, ReplayResult
);
