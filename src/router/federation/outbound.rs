//! [`Outbound`]: the messages waiting for each peer system this router dials, oldest first,
//! bounded per peer, and how many of them the router's link to that peer has taken and not
//! acknowledged yet.
//!
//! Invariants:
//! - a queue holds at most the configured bound (`config::Federation::max_queued`): a message
//!   over it is refused here, and its sender told (`message_failed`);
//! - `taken <= items.len()`, and the taken ones are the oldest: the link routes in order, and
//!   a new link (`restart`) or the link's session ending takes them again from the oldest;
//! - an item leaves only on its acknowledgement (routed, or refused by the peer), so a message
//!   is never lost between the link taking it and the peer answering.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::{oneshot, Notify};

use crate::protocol::ids::{MessageId, SessionId};
use crate::protocol::methods::federation::{FederationEnvelope, OutboundItem, RouteRefusal};
use crate::router::ids::IdMap;
use crate::router::messaging::state::Outgoing;

/// Most messages one `map/federation/outbound/next` hands out.
pub const MAX_TAKE: usize = 64;

/// What a message passing through this system waits for: the next system's answer.
pub type Waiter = oneshot::Sender<Result<(), RouteRefusal>>;

/// One message waiting for a peer.
#[derive(Debug)]
pub(crate) struct Waiting {
    /// The message as it was recorded here.
    pub(crate) out: Arc<Outgoing>,
    /// How its events name the recipient (`<system>:agent:<agent>`).
    pub(crate) recipient: String,
    /// What to route to the peer.
    pub(crate) envelope: FederationEnvelope,
    /// A route passing through, waiting for the answer (gone once it stopped waiting).
    pub(crate) waiter: Option<Waiter>,
    /// The trace context the route carries to the peer.
    pub(crate) trace: Option<crate::protocol::trace::TraceContext>,
}

#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<Waiting>,
    taken: usize,
    /// The session of the link that took them.
    carrier: Option<SessionId>,
    /// Woken when a message is queued.
    ready: Arc<Notify>,
}

/// The messages waiting for each peer.
#[derive(Debug, Default)]
pub struct Outbound {
    queues: IdMap<String, Queue>,
}

impl Outbound {
    /// Queues `item` for `peer`.
    ///
    /// # Errors
    /// The item back when `peer`'s queue already holds `cap` messages.
    pub(crate) fn push(
        &mut self,
        peer: &str,
        item: Waiting,
        cap: usize,
    ) -> Result<(), Box<Waiting>> {
        let q = self.queues.entry(peer.to_owned()).or_default();
        if q.items.len() >= cap {
            return Err(Box::new(item));
        }
        q.items.push_back(item);
        q.ready.notify_one();
        Ok(())
    }

    /// Hands the link on `session` up to `max` messages for `peer` it has not taken yet
    /// (all of them again from the oldest with `restart`, or when another session took them).
    pub fn take(
        &mut self,
        peer: &str,
        session: &SessionId,
        restart: bool,
        max: usize,
    ) -> Vec<OutboundItem> {
        let q = self.queues.entry(peer.to_owned()).or_default();
        if restart || q.carrier.as_ref() != Some(session) {
            q.taken = 0;
            q.carrier = Some(session.clone());
        }
        let items: Vec<OutboundItem> = q
            .items
            .iter()
            .skip(q.taken)
            .take(max.clamp(1, MAX_TAKE))
            .map(|w| OutboundItem {
                message_id: w.out.id.clone(),
                envelope: w.envelope.clone(),
                traceparent: w.trace.as_ref().map(|t| t.traceparent.to_string()),
                tracestate: w
                    .trace
                    .as_ref()
                    .and_then(|t| t.tracestate.as_ref().map(|s| s.to_string())),
            })
            .collect();
        q.taken += items.len();
        items
    }

    /// What wakes a link waiting for `peer`'s next message.
    pub fn ready(&mut self, peer: &str) -> Arc<Notify> {
        self.queues
            .entry(peer.to_owned())
            .or_default()
            .ready
            .clone()
    }

    /// The peer answered the route of message `id`: it leaves the queue.
    pub(crate) fn ack(&mut self, peer: &str, id: &MessageId) -> Option<Waiting> {
        let q = self.queues.get_mut(peer)?;
        let at = q.items.iter().position(|w| w.out.id == *id)?;
        if at < q.taken {
            q.taken -= 1;
        }
        q.items.remove(at)
    }

    /// `session` ended: what its link took and did not acknowledge is handed out again.
    pub fn session_gone(&mut self, session: &SessionId) {
        for q in self.queues.values_mut() {
            if q.carrier.as_ref() == Some(session) {
                q.carrier = None;
                q.taken = 0;
            }
        }
    }

    /// Messages waiting for each peer.
    pub fn lens(&self) -> Vec<(String, usize)> {
        let mut v: Vec<(String, usize)> = self
            .queues
            .iter()
            .map(|(p, q)| (p.clone(), q.items.len()))
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::json::RawJson;
    use crate::protocol::methods::federation::FederationRouting;

    fn item(id: &str) -> Waiting {
        let out = Outgoing {
            id: MessageId::from(id),
            correlation: None,
            from: Arc::from("a"),
            to: RawJson::from(serde_json::json!({"agent": "b"})),
            timestamp: 1,
            delivered_correlation: None,
            payload_json: None,
            message_json: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
            frame: crate::router::outbox::SharedText::from(""),
            sent: crate::protocol::ids::EventId(crate::protocol::ids::Ulid::random()),
            keys: Default::default(),
            audience: crate::router::events::log::Audience::Everyone,
            trace: None,
        };
        Waiting {
            out: Arc::new(out),
            recipient: "beta:agent:b".into(),
            envelope: FederationEnvelope {
                payload: RawJson::from(serde_json::json!({})),
                federation: FederationRouting {
                    source_system: "alpha".into(),
                    target_system: "beta".into(),
                    hop_count: 0,
                    max_hops: None,
                    path: None,
                    origin_timestamp: 1,
                    correlation_id: None,
                    signature: None,
                },
            },
            waiter: None,
            trace: None,
        }
    }

    fn ids(v: &[OutboundItem]) -> Vec<&str> {
        v.iter().map(|i| i.message_id.as_str()).collect()
    }

    #[test]
    fn bounded_in_order_and_nothing_leaves_before_its_ack() {
        let mut o = Outbound::default();
        let (s1, s2) = (SessionId::new("s1"), SessionId::new("s2"));
        for i in 0..3 {
            o.push("beta", item(&format!("m{i}")), 3).unwrap();
        }
        assert!(o.push("beta", item("m3"), 3).is_err(), "bounded");
        assert_eq!(ids(&o.take("beta", &s1, false, 2)), ["m0", "m1"]);
        assert_eq!(ids(&o.take("beta", &s1, false, 2)), ["m2"]);
        assert!(o.take("beta", &s1, false, 2).is_empty());
        assert!(o.ack("beta", &MessageId::from("m0")).is_some());
        assert!(o.ack("beta", &MessageId::from("m0")).is_none(), "once");
        // The link went away: what it took comes back, oldest first, to the next one.
        o.session_gone(&s1);
        assert_eq!(ids(&o.take("beta", &s2, false, 64)), ["m1", "m2"]);
        // Another session taking over starts from the oldest too.
        assert_eq!(ids(&o.take("beta", &s1, false, 64)), ["m1", "m2"]);
        assert_eq!(ids(&o.take("beta", &s1, true, 1)), ["m1"]);
        assert_eq!(o.lens(), vec![("beta".to_owned(), 2)]);
    }
}
