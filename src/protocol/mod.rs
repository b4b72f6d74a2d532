//! Wire types: JSON-RPC envelopes, MAP records, methods, notifications and events.
//!
//! Serde + schemars only: nothing in here imports tokio or does I/O. Everything the router and
//! the transports put on the wire is defined here, and `schema/` is generated from these types
//! (see [`schema`]).

pub mod agent;
pub mod capabilities;
pub mod event;
pub mod ids;
pub mod json;
pub mod jsonrpc;
pub mod message;
pub mod methods;
pub mod schema;
pub mod scope;
pub mod trace;

/// The only protocol version MAP defines.
pub const PROTOCOL_VERSION: u32 = 1;
