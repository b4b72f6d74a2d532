//! map-router: a fast, dependable router for MAP, the Multi-Agent Protocol (JSON-RPC 2.0).
//!
//! The crate is laid out in layers, lowest first (each imports only those above it in this
//! list; `tests/layering.rs` checks it):
//!
//! - [`protocol`]: wire types only (serde + schemars, no I/O): JSON-RPC envelopes, MAP records,
//!   one type per method, events, and the JSON Schema generator behind `schema/`.
//! - [`metrics`]: the Prometheus families and the `GET /metrics` text (the lowest layer: the
//!   router, the store and the sessions report into it; the router's own state is read at
//!   scrape time).
//! - [`auth`]: authentication: API keys and JWTs from the configuration, checked into a
//!   principal (what a verdict means for a session is the router's business).
//! - [`store`]: durable storage of the event log (SQLite by default; NATS JetStream in cluster
//!   mode).
//! - [`router`]: the core. One task owns every session, agent, scope, subscription and the
//!   event log, each table owned by one part; transports talk to it through a
//!   [`router::RouterHandle`]. It opens no sockets and launches nothing.
//! - [`transport`]: framing and connection loops: WebSocket, NDJSON over stdio, in-process
//!   channels, HTTP + SSE, each adapted to the one connection driver (a reader and a single
//!   writer).
//! - [`process`]: supervised subprocess agents (launch, pipes, stderr, restart, stop, reap).
//! - [`client`]: a Rust MAP client (WebSocket, stdio child, in-process): typed calls,
//!   subscriptions, agents with request/reply, reconnect with resume.
//! - [`gateway`]: other agent protocols translated to MAP: A2A 1.0 / 0.3, MAMP 1.0 and the
//!   agent IM gateway on the same HTTP server, AIP over gRPC on a listener of its own. Each is
//!   an ordinary in-process MAP participant (its callers' sessions, opened as their
//!   principals), never a part of the router.
//! - [`server`]: listeners, configuration, the dashboard, the cluster's relays and graceful
//!   shutdown.
//! - [`cli`]: the `map-router` user commands (`serve`, `agent`, `watch`, `send`, ...), built on
//!   the server and the client.
//! - [`sync`]: the poison-tolerant mutex lock every layer uses.
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
