//! Federation, inbound (`urn:map:ext:federation:1`, `../shared/spec/federation.md`): owns the
//! table of connected peer links ([`table::Links`]): which session speaks for which peer
//! system, and as which principal. Bounded ([`table::MAX_LINKS`]); a link's entry goes when its
//! session detaches. The handlers ([`ops`]) prove a link's system id by its session's principal
//! (the `[[federation.peer]]` entries, passed in `RouterConfig::federation`), check routed
//! envelopes (forged source or relay, then the spec's order through
//! `protocol::methods::federation::process`) and deliver a message addressed to this system
//! through normal routing, under the federated sender id `<system>:agent:<from>`.
//!
//! Not here yet: dialling peers, forwarding to another system (answered 5001), outage buffers.

pub mod ops;
pub mod table;
