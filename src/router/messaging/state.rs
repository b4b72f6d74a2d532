//! `Messaging`: what the message handlers keep between calls: messages kept for agents that
//! are away (`meta.delivery` acknowledged or guaranteed), bounded per agent, and an index of
//! recent deliveries that links a reply to the request it answers. The handlers are in
//! [`super::ops`].

use std::collections::VecDeque;
use std::sync::Arc;

use serde_json::value::RawValue;

use crate::protocol::ids::{AgentId, EventId, MessageId};
use crate::protocol::json::RawJson;
use crate::router::events::log::{Audience, FilterKeys};
use crate::router::ids::{IdMap, Shrink};
use crate::router::outbox::SharedText;

/// Most messages kept for one agent while it is away.
pub const MAX_OFFLINE_MESSAGES: usize = 1000;

/// A sent message, with what its later delivery events need (kept while a recipient is away).
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub(crate) id: MessageId,
    pub(crate) correlation: Option<String>,
    pub(crate) from: Arc<str>,
    pub(crate) to: RawJson,
    pub(crate) timestamp: u64,
    pub(crate) delivered_correlation: Option<String>,
    pub(crate) payload_json: Option<RawJson>,
    pub(crate) message_json: Box<RawValue>,
    pub(crate) frame: SharedText,
    pub(crate) sent: EventId,
    pub(crate) keys: FilterKeys,
    pub(crate) audience: Audience,
    /// The message's trace context (or its request's), stamped on its events.
    pub(crate) trace: Option<crate::protocol::trace::TraceContext>,
}

/// How many recent deliveries are remembered for linking replies to requests.
const DELIVERY_INDEX_CAP: usize = 16_384;

/// Requests remembered per correlation id (the newest).
const REQUESTS_PER_CORRELATION: usize = 8;

/// Recent deliveries, so a reply (`meta.isResult` with the request's `correlationId`) can name
/// the delivery of the request it answers as its cause, and reach the request's sender even when
/// the replier may not see it (`resolve`: the sender showed itself by asking). Bounded: the
/// oldest messages are forgotten once more than [`DELIVERY_INDEX_CAP`] deliveries are
/// remembered.
///
/// One entry per message (its recipients in a short list), not one per delivery: a scope send
/// to K agents costs one map insertion and K pushes instead of K insertions, K removals and 2K
/// string copies (this index was 7 % of the router's time in the fan-out benchmark,
/// docs/performance.md).
#[derive(Debug, Default)]
pub(crate) struct DeliveryIndex {
    by_message: IdMap<MessageId, Deliveries>,
    /// The requests that used each correlation id, newest last (at most
    /// [`REQUESTS_PER_CORRELATION`]): two requesters may pick the same id (`"q1"`), and one must
    /// not hide the other's request from its replier.
    by_correlation: IdMap<String, Vec<MessageId>>,
    /// Messages oldest first, with their correlation id.
    order: std::collections::VecDeque<(MessageId, Option<String>)>,
    /// Deliveries remembered in `by_message`.
    deliveries: usize,
}

/// One message's deliveries.
#[derive(Debug)]
struct Deliveries {
    /// Its sender (`from`), whom a reply to it may reach.
    from: Arc<str>,
    /// Its recipients and the event of each delivery.
    to: Vec<(Box<str>, EventId)>,
}

impl DeliveryIndex {
    pub(crate) fn record(
        &mut self,
        message: &MessageId,
        from: &Arc<str>,
        recipient: Box<str>,
        correlation: Option<&str>,
        event: EventId,
    ) {
        while self.deliveries >= DELIVERY_INDEX_CAP {
            let Some((m, c)) = self.order.pop_front() else {
                break;
            };
            if let Some(d) = self.by_message.remove(&m) {
                self.deliveries -= d.to.len();
            }
            if let Some(c) = c {
                if let Some(list) = self.by_correlation.get_mut(&c) {
                    list.retain(|x| x != &m);
                    if list.is_empty() {
                        self.by_correlation.remove(&c);
                    }
                }
            }
        }
        let d = match self.by_message.get_mut(message) {
            Some(d) => d,
            None => {
                if let Some(c) = correlation {
                    let list = self.by_correlation.entry(c.to_owned()).or_default();
                    if list.len() == REQUESTS_PER_CORRELATION {
                        list.remove(0);
                    }
                    list.push(message.clone());
                }
                self.order
                    .push_back((message.clone(), correlation.map(str::to_owned)));
                self.by_message
                    .entry(message.clone())
                    .or_insert_with(|| Deliveries {
                        from: from.clone(),
                        to: Vec::new(),
                    })
            }
        };
        d.to.push((recipient, event));
        self.deliveries += 1;
    }

    /// Forgets every delivery to a recipient `gone` says has left: it can never reply, so its
    /// entries only hold memory (after a churn, thousands of them, until newer deliveries push
    /// them out). Gives the tables' room back.
    fn forget(&mut self, gone: impl Fn(&str) -> bool) {
        self.by_message.retain(|_, d| {
            d.to.retain(|(r, _)| !gone(r));
            !d.to.is_empty()
        });
        self.deliveries = self.by_message.values().map(|d| d.to.len()).sum();
        let kept = &self.by_message;
        self.order.retain(|(m, _)| kept.contains_key(m));
        self.by_correlation.retain(|_, list| {
            list.retain(|m| kept.contains_key(m));
            !list.is_empty()
        });
        self.by_message.shrink_if_sparse();
        self.by_correlation.shrink_if_sparse();
        self.order.shrink_if_sparse();
    }

    /// The delivery to `replier` of the request that `correlation` names (a correlation id,
    /// or the request's message id, as the SDK's `reply()` uses when there was none).
    pub(crate) fn request_delivery(&self, correlation: &str, replier: &str) -> Option<EventId> {
        self.request_to(correlation, replier).map(|(_, e)| e)
    }

    /// The sender of the request that `correlation` names, if it reached `replier`.
    pub(crate) fn request_sender(&self, correlation: &str, replier: &str) -> Option<&Arc<str>> {
        self.request_to(correlation, replier).map(|(from, _)| from)
    }

    /// The newest request that `correlation` names and that reached `replier`: its sender and
    /// the event of that delivery.
    fn request_to(&self, correlation: &str, replier: &str) -> Option<(&Arc<str>, EventId)> {
        let delivered_to_replier = |message: &MessageId| {
            let d = self.by_message.get(message)?;
            d.to.iter()
                .rev()
                .find(|(r, _)| &**r == replier)
                .map(|(_, e)| (&d.from, *e))
        };
        // The newest request with this correlation id that reached the replier.
        self.by_correlation
            .get(correlation)
            .and_then(|list| list.iter().rev().find_map(delivered_to_replier))
            .or_else(|| delivered_to_replier(&MessageId::from(correlation)))
    }
}

/// The messaging part of the router's state.
#[derive(Debug, Default)]
pub(crate) struct Messaging {
    /// Messages kept for agents that are away, oldest first.
    offline: IdMap<AgentId, VecDeque<Arc<Outgoing>>>,
    /// Recent deliveries, for linking a reply to the request it answers.
    deliveries: DeliveryIndex,
    /// Agents removed since the delivery index last forgot the departed.
    removed_since_forget: usize,
}

impl Messaging {
    /// Keeps `out` for `agent` until it is back.
    ///
    /// # Errors
    /// The reason to report when the agent's queue is full ([`MAX_OFFLINE_MESSAGES`]).
    pub(crate) fn keep(
        &mut self,
        agent: &AgentId,
        out: &Arc<Outgoing>,
    ) -> Result<(), &'static str> {
        let queue = self.offline.entry(agent.clone()).or_default();
        if queue.len() >= MAX_OFFLINE_MESSAGES {
            return Err("recipient_offline_queue_full");
        }
        queue.push_back(out.clone());
        Ok(())
    }

    /// Takes what was kept for `agent`, oldest first.
    pub(crate) fn take_kept(&mut self, agent: &AgentId) -> Option<VecDeque<Arc<Outgoing>>> {
        let kept = self.offline.remove(agent);
        self.offline.shrink_if_sparse();
        kept
    }

    /// Remembers that `out` was delivered to `recipient` by event `delivered`.
    pub(crate) fn record_delivery(
        &mut self,
        out: &Outgoing,
        recipient: Box<str>,
        delivered: EventId,
    ) {
        self.deliveries.record(
            &out.id,
            &out.from,
            recipient,
            out.correlation.as_deref(),
            delivered,
        );
    }

    /// An agent has left for good: once enough have (an eighth of the remembered deliveries,
    /// at least 64, so the sweep costs O(1) amortized per removal), the delivery index forgets
    /// every delivery to an agent `gone` says has left.
    pub(crate) fn agent_removed(&mut self, gone: impl Fn(&str) -> bool) {
        self.removed_since_forget += 1;
        if self.deliveries.deliveries > 0
            && self.removed_since_forget >= (self.deliveries.deliveries / 8).max(64)
        {
            self.removed_since_forget = 0;
            self.deliveries.forget(gone);
        }
    }

    /// The delivery to `replier` of the request that `correlation` names.
    pub(crate) fn request_delivery(&self, correlation: &str, replier: &str) -> Option<EventId> {
        self.deliveries.request_delivery(correlation, replier)
    }

    /// The sender of the request that `correlation` names, if it reached `replier`.
    pub(crate) fn request_sender(&self, correlation: &str, replier: &str) -> Option<&Arc<str>> {
        self.deliveries.request_sender(correlation, replier)
    }

    /// Agents with kept messages, and messages kept in all (for stats).
    pub(crate) fn offline_len(&self) -> (usize, usize) {
        (
            self.offline.len(),
            self.offline.values().map(VecDeque::len).sum(),
        )
    }

    /// Deliveries remembered for reply correlation (for stats; bounded).
    pub(crate) fn deliveries_len(&self) -> usize {
        self.deliveries.deliveries
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ids::Ulid;

    #[test]
    fn departed_recipients_are_forgotten_and_the_living_kept() {
        let mut m = Messaging::default();
        let ev = |n: u128| EventId(Ulid(n));
        let from: Arc<str> = Arc::from("asker");
        for i in 0..100u128 {
            let msg = MessageId::from(format!("m{i}").as_str());
            let corr = format!("c{i}");
            m.deliveries
                .record(&msg, &from, "stays".into(), Some(&corr), ev(2 * i));
            m.deliveries.record(
                &msg,
                &from,
                format!("gone{i}").into(),
                Some(&corr),
                ev(2 * i + 1),
            );
        }
        assert_eq!(m.deliveries_len(), 200);
        let gone = |r: &str| r.starts_with("gone");
        // Fewer removals than the threshold (64): nothing is swept yet.
        for _ in 0..63 {
            m.agent_removed(gone);
        }
        assert_eq!(m.deliveries_len(), 200);
        assert_eq!(m.request_delivery("c7", "gone7"), Some(ev(15)));
        assert_eq!(m.request_sender("c7", "gone7").map(|f| &**f), Some("asker"));
        assert_eq!(
            m.request_sender("c7", "elsewhere"),
            None,
            "not delivered there"
        );
        m.agent_removed(gone);
        assert_eq!(
            m.deliveries_len(),
            100,
            "every delivery to a departed agent forgotten"
        );
        assert_eq!(m.request_delivery("c7", "gone7"), None);
        assert_eq!(m.request_delivery("c7", "stays"), Some(ev(14)));
        assert_eq!(m.deliveries.order.len(), 100);
        // Everyone gone: the index is empty, correlations included.
        for _ in 0..64 {
            m.agent_removed(|_| true);
        }
        assert_eq!(m.deliveries_len(), 0);
        assert!(m.deliveries.by_correlation.is_empty());
        assert!(m.deliveries.order.is_empty());
        assert_eq!(m.request_delivery("c7", "stays"), None);
    }
}
