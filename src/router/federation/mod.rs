//! Federation (`urn:map:ext:federation:1`, `../shared/spec/federation.md`): owns
//! [`Federation`], the router's federation state:
//!
//! - the connected inbound peer links ([`table::Links`]): which session speaks for which peer
//!   system, and as which principal. Bounded ([`table::MAX_LINKS`]); a link's entry goes when
//!   its session detaches;
//! - the messages waiting for each peer this router dials ([`outbound::Outbound`]), bounded per
//!   peer, durable through their `message.queued` events (a restart keeps them again,
//!   `messaging::recovery`), handed to the server's link for that peer
//!   (`map/federation/outbound/next`) and gone only on its acknowledgement
//!   (`map/federation/outbound/ack`: `message_delivered`, or `message_failed` with the peer's
//!   code and reason);
//! - the federated messages delivered here lately ([`Seen`]), so that a route sent again after
//!   a lost answer (the peer's link broke, this router restarted) is not delivered twice;
//! - the agents each peer this router dials shows it (`directory`, as its link last listed
//!   them: at most [`MAX_REMOTE_AGENTS`] per peer), for `map/federation/agents`.
//!
//! The handlers ([`ops`]) prove a link's system id by its session's principal (the
//! `[[federation.peer]]` entries, passed in `RouterConfig::federation`), check routed envelopes
//! (forged source or relay, then the spec's order through
//! `protocol::methods::federation::process`) and deliver a message addressed to this system
//! through normal routing, under the federated sender id `<system>:agent:<from>`, or queue it
//! for the next system. The sockets are the gateway's (`gateway::federation`): the core only
//! queues, hands out and records.

pub mod ops;
pub mod outbound;
pub mod table;

use std::collections::VecDeque;

use crate::protocol::ids::MessageId;
use crate::protocol::methods::federation::FederationEnvelope;
use crate::router::ids::IdSet;

/// Most agents kept per peer system in the directory.
pub const MAX_REMOTE_AGENTS: usize = 1000;

/// Federated messages remembered as delivered (their local ids).
pub const SEEN_CAP: usize = 65_536;

/// The router's federation state (see the module docs).
#[derive(Debug, Default)]
pub struct Federation {
    /// Inbound links.
    pub links: table::Links,
    /// Messages waiting for peers.
    pub outbound: outbound::Outbound,
    /// Federated messages delivered lately.
    pub seen: Seen,
    /// The agents each dialled peer shows this system, and when its link listed them.
    pub directory: crate::router::ids::IdMap<
        String,
        (u64, Vec<crate::protocol::methods::federation::RemoteAgent>),
    >,
    /// The envelope (and waiter) of the route passing through that is being queued now: set
    /// by the route handler around its `deliver_message_as`, taken by the queueing.
    pub(crate) transit: Option<(FederationEnvelope, Option<outbound::Waiter>)>,
}

/// The local ids (`<source>:message:<id>`) of the federated messages delivered lately, oldest
/// forgotten first past [`SEEN_CAP`].
#[derive(Debug, Default)]
pub struct Seen {
    set: IdSet<MessageId>,
    order: VecDeque<MessageId>,
}

impl Seen {
    /// Remembers `id`.
    pub fn insert(&mut self, id: MessageId) {
        if self.set.insert(id.clone()) {
            self.order.push_back(id);
            if self.order.len() > SEEN_CAP {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }

    /// Whether `id` was delivered lately.
    pub fn contains(&self, id: &MessageId) -> bool {
        self.set.contains(id)
    }

    /// How many are remembered.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}
