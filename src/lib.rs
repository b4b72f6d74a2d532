//! map-router: a fast, dependable router for MAP, the Multi-Agent Protocol (JSON-RPC 2.0).
//!
//! The crate is laid out the way a request flows:
//!
//! - [`protocol`]: wire types only (serde + schemars, no I/O): JSON-RPC envelopes, MAP records,
//!   one type per method, events, and the JSON Schema generator behind `schema/`.
//! - [`transport`]: framing and connection loops. Each transport adapts its medium (WebSocket
//!   today) to frames and runs the one connection driver: a reader and a single writer.
//! - [`router`]: the core. One task owns every session, agent, scope, subscription and the
//!   event log; transports talk to it through a [`router::RouterHandle`]. It opens no sockets.
//! - [`auth`]: authentication: API keys and JWTs from the configuration, checked into a
//!   principal (what a verdict means for a session is the router's business).
//! - [`process`]: supervised subprocess agents (launch, pipes, stderr, restart, stop, reap).
//! - [`store`]: durable storage of the event log (SQLite by default).
//! - [`metrics`]: the Prometheus families and the `GET /metrics` text (the lowest layer: the
//!   router, the store and the sessions report into it; the router's own state is read at
//!   scrape time).
//! - [`gateway`]: translators from other agent protocols (MAMP 1.0, the agent IM gateway) to
//!   MAP, on the same HTTP server; each opens in-process MAP sessions like any participant.
//! - [`server`]: listeners, configuration and graceful shutdown.
//! - [`gateway`]: other agent protocols (A2A) translated to MAP: each gateway is an ordinary
//!   in-process MAP participant whose HTTP routes the server merges into its own.
//! - [`client`]: a Rust MAP client (WebSocket, stdio child, in-process): typed calls,
//!   subscriptions, agents with request/reply, reconnect with resume. [`cli`] builds the
//!   `map-router` user commands (`agent`, `watch`, `send`, ...) on it.
//!
//! - [`sync`]: the poison-tolerant mutex lock every layer uses.
//!
//! - `fuzzing` (hidden): entry points shared by the cargo-fuzz targets in `fuzz/` and
//!   `tests/fuzz_prop.rs`; not a stable API.
//!
//! `docs/architecture.md` describes who owns what and how requests and events flow;
//! `docs/compatibility.md` records every choice between the SDK, the spec and the reference
//! servers.

pub mod auth;
pub mod cli;
pub mod client;
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
pub mod metrics;
pub mod process;
pub mod protocol;
pub mod router;
pub mod server;
pub mod store;
pub mod sync;
pub mod transport;
