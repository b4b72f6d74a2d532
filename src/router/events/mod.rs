//! Events: the append-only log ([`log`]), compiled filters ([`filter`]), subscriptions with a
//! cursor each and their fan-out, catch-up and overflow ([`bus`]), and the subscribe,
//! unsubscribe and replay handlers ([`ops`]), and a follower's intake of another node's log
//! ([`follow`]).

pub mod bus;
pub mod filter;
pub mod follow;
pub mod index;
pub mod log;
pub mod ops;
