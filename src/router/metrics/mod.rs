//! What the router reports to `GET /metrics`: a few running counts it keeps itself
//! ([`Counters`], plain integers on the router task: no atomics on the hot path), and the
//! scrape-time snapshot ([`Router::metrics_snapshot`](crate::router::core::Router::metrics_snapshot)) that reads every other part's tables
//! (connections, sessions, agents, subscriptions, outboxes, supervised processes).
//!
//! The snapshot is one router command per scrape; it walks the tables once (O(connections +
//! sessions + agents + subscriptions)), which is cheap next to a scrape interval.

pub mod counters;
pub mod snapshot;

pub use counters::{Counters, EXIT_REASONS};
