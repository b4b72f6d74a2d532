//! The event bus: the log, the subscriptions, and fan-out from one to the other.
//!
//! Each subscription is a cursor into the log. A subscription is in one of three states:
//! - `Pending`: created, but its `map/subscribe` response may not be on the wire yet. No event
//!   may overtake that response (the SDK drops events for ids it does not know yet), so nothing
//!   is delivered until the session activates it.
//! - `Live`: caught up; each appended event is offered to it directly.
//! - `Paused`: behind. Its outbox was full (or it was just activated); the events it has not
//!   read stay in the log, not in memory per subscriber, and it is caught up from its cursor when
//!   the connection's writer reports room (`Command::Drained`).
//!
//! If a paused subscription's cursor falls behind retention, it receives one
//! `subscription.overflow` notice (with how many log entries it lost) and continues from the
//! oldest retained event: loss is always signalled, never silent.
//!
//! The bus decides visibility per delivery with `router::permissions`, so a change takes effect
//! on the next event.

pub mod filter;
pub mod log;

use std::collections::HashMap;
use std::sync::Arc;

use crate::protocol::capabilities::ParticipantType;
use crate::protocol::event::{EventType, SubscriptionOverflowData};
use crate::protocol::ids::{ParticipantId, SessionId, SubscriptionId};

use self::filter::CompiledFilter;
use self::log::{Audience, EventLog, EventRecord, Lookup};
use super::outbox::{CausedBy, Delivery, Outbound, Outbox, PushError};
use super::permissions::{audience_allows, Viewer};
use super::registry::Registry;
use super::ConnId;

/// Subscription state (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubState {
    /// Awaiting activation after its response is queued.
    Pending,
    /// Caught up.
    Live,
    /// Behind; waiting for room in the outbox.
    Paused,
}

/// One subscription.
#[derive(Debug)]
pub struct Subscription {
    /// Wire id.
    pub id: SubscriptionId,
    /// Owning session.
    pub session: SessionId,
    /// The connection it delivers to.
    pub conn: ConnId,
    /// Subscriber identity (for visibility).
    pub participant: ParticipantId,
    /// Subscriber type.
    pub participant_type: ParticipantType,
    /// Compiled filter.
    pub filter: CompiledFilter,
    /// Skip events caused by the subscriber itself.
    pub exclude_own: bool,
    /// Next log sequence number to examine.
    pub cursor: u64,
    /// First log sequence number this subscription could see.
    pub start: u64,
    /// Last `sequenceNumber` sent (0 = none yet).
    pub sequence: u64,
    /// State.
    pub state: SubState,
    /// Where deliveries go.
    pub outbox: Outbox,
}

/// Outcome of offering one event to a subscription.
enum Offer {
    /// Delivered or filtered out; the cursor moved on.
    Advanced,
    /// The outbox is full; the cursor stays.
    Full,
    /// The connection is gone; stop delivering to it.
    Gone,
}

/// Log + subscriptions.
#[derive(Debug)]
pub struct EventBus {
    /// The log.
    pub log: EventLog,
    subs: HashMap<SubscriptionId, Subscription>,
}

impl EventBus {
    /// A bus over an empty log.
    pub fn new(log: EventLog) -> Self {
        Self {
            log,
            subs: HashMap::new(),
        }
    }

    /// Number of subscriptions.
    pub fn len(&self) -> usize {
        self.subs.len()
    }

    /// Whether there are no subscriptions.
    pub fn is_empty(&self) -> bool {
        self.subs.is_empty()
    }

    /// Looks a subscription up.
    pub fn get(&self, id: &str) -> Option<&Subscription> {
        self.subs.get(id)
    }

    /// Adds a pending subscription.
    pub fn insert(&mut self, sub: Subscription) {
        self.subs.insert(sub.id.clone(), sub);
    }

    /// Removes a subscription.
    pub fn remove(&mut self, id: &str) -> Option<Subscription> {
        self.subs.remove(id)
    }

    /// Offers a freshly appended event to every live subscription.
    pub fn publish(&mut self, rec: &Arc<EventRecord>, reg: &Registry) {
        let Self { log, subs } = self;
        for sub in subs.values_mut() {
            if sub.state != SubState::Live || sub.cursor != rec.seq {
                continue;
            }
            match offer(sub, rec, log, reg) {
                Offer::Advanced => {}
                Offer::Full => sub.state = SubState::Paused,
                Offer::Gone => sub.state = SubState::Paused,
            }
        }
    }

    /// Moves a pending subscription to catching up, and catches it up as far as its outbox
    /// allows.
    pub fn activate(&mut self, id: &str, reg: &Registry) {
        if let Some(sub) = self.subs.get_mut(id) {
            if sub.state == SubState::Pending {
                sub.state = SubState::Paused;
            }
        }
        self.catch_up(id, reg);
    }

    /// Catches every paused subscription of a connection up (its writer reported room).
    pub fn resume_conn(&mut self, conn: ConnId, reg: &Registry) {
        let ids: Vec<SubscriptionId> = self
            .subs
            .values()
            .filter(|s| s.conn == conn && s.state == SubState::Paused)
            .map(|s| s.id.clone())
            .collect();
        for id in ids {
            self.catch_up(id.as_str(), reg);
        }
    }

    /// Delivers from the cursor until caught up (→ `Live`) or the outbox is full (stays
    /// `Paused`, with a wake-up requested).
    fn catch_up(&mut self, id: &str, reg: &Registry) {
        let Self { log, subs } = self;
        let Some(sub) = subs.get_mut(id) else { return };
        if sub.state != SubState::Paused {
            return;
        }
        loop {
            match log.get(sub.cursor) {
                Lookup::Future => {
                    sub.state = SubState::Live;
                    return;
                }
                Lookup::Evicted => {
                    let lost = log.first_seq() - sub.cursor;
                    if !push_overflow(sub, lost, log) {
                        return;
                    }
                    sub.cursor = log.first_seq();
                }
                Lookup::Present(rec) => {
                    let rec = rec.clone();
                    match offer(sub, &rec, log, reg) {
                        Offer::Advanced => {}
                        Offer::Full | Offer::Gone => return,
                    }
                }
            }
        }
    }

    /// Removes every subscription of a session; returns their ids.
    pub fn remove_session(&mut self, session: &SessionId) -> Vec<SubscriptionId> {
        let ids: Vec<SubscriptionId> = self
            .subs
            .values()
            .filter(|s| &s.session == session)
            .map(|s| s.id.clone())
            .collect();
        for id in &ids {
            self.subs.remove(id.as_str());
        }
        ids
    }

    /// Whether a subscription would deliver `rec` (filter + visibility + own-events rule).
    pub fn admits(sub: &Subscription, rec: &EventRecord, reg: &Registry) -> bool {
        admits(sub, rec, reg)
    }
}

fn admits(sub: &Subscription, rec: &EventRecord, reg: &Registry) -> bool {
    let viewer = Viewer {
        participant: &sub.participant,
        kind: sub.participant_type,
    };
    if !audience_allows(&viewer, &rec.audience, reg) {
        return false;
    }
    if sub.exclude_own {
        if let Some(src) = rec.source.as_deref() {
            if src == sub.participant.as_str() || reg.is_owned_by(src, sub.participant.as_str()) {
                return false;
            }
        }
    }
    sub.filter.matches(rec, |agent| {
        reg.get(agent).and_then(|r| r.agent.environment.as_ref())
    })
}

/// Offers `rec` (which must be at `sub.cursor`) to `sub`.
fn offer(sub: &mut Subscription, rec: &Arc<EventRecord>, log: &EventLog, reg: &Registry) -> Offer {
    if !admits(sub, rec, reg) {
        sub.cursor = rec.seq + 1;
        return Offer::Advanced;
    }
    let delivery = Delivery {
        subscription: sub.id.clone(),
        sequence: sub.sequence + 1,
        record: rec.clone(),
        caused_by: delivered_causes(sub, rec, log, reg),
    };
    match push(&sub.outbox, Outbound::Event(delivery)) {
        Ok(()) => {
            sub.sequence += 1;
            sub.cursor = rec.seq + 1;
            Offer::Advanced
        }
        Err(PushError::Full(_)) => Offer::Full,
        Err(PushError::Closed(_)) => Offer::Gone,
    }
}

/// Tries to queue; on a full queue requests a wake-up and tries once more (see `outbox`).
pub(crate) fn push(outbox: &Outbox, item: Outbound) -> Result<(), PushError> {
    match outbox.try_push(item) {
        Err(PushError::Full(item)) => {
            outbox.request_wakeup();
            outbox.try_push(item)
        }
        other => other,
    }
}

/// The envelope `causedBy`: only causes this subscription was shown (a cause it never saw would
/// make a client-side causal buffer wait for nothing).
fn delivered_causes(
    sub: &Subscription,
    rec: &EventRecord,
    log: &EventLog,
    reg: &Registry,
) -> CausedBy {
    if rec.caused_by.is_empty() {
        return CausedBy::None;
    }
    let seen: Vec<_> = rec
        .caused_by
        .iter()
        .copied()
        .filter(|id| {
            log.find(*id)
                .is_some_and(|cause| cause.seq >= sub.start && admits(sub, cause, reg))
        })
        .collect();
    if seen.is_empty() {
        CausedBy::None
    } else if seen.len() == rec.caused_by.len() {
        CausedBy::All
    } else {
        CausedBy::Some(seen)
    }
}

/// Queues the overflow notice. Returns false when the outbox is full (try again later).
fn push_overflow(sub: &mut Subscription, lost: u64, log: &EventLog) -> bool {
    let data = SubscriptionOverflowData {
        subscription_id: sub.id.clone(),
        events_dropped: lost,
        resumes_at: log.oldest_id(),
        recommendation: "the events in the gap are no longer retained; re-read current state (map/agents/list, map/scopes/list)".into(),
    };
    let json = serde_json::to_string(&data).unwrap_or_else(|_| "{}".into());
    let rec = Arc::new(EventRecord::synthetic(
        EventType::SubscriptionOverflow,
        json,
        Audience::Everyone,
    ));
    let delivery = Delivery {
        subscription: sub.id.clone(),
        sequence: sub.sequence + 1,
        record: rec,
        caused_by: CausedBy::None,
    };
    match push(&sub.outbox, Outbound::Event(delivery)) {
        Ok(()) => {
            sub.sequence += 1;
            true
        }
        Err(_) => false,
    }
}
