//! Gateways: the other agent protocols of our design documents, reaching MAP agents through
//! the router (`docs/spec`'s gateways page says where each lives on the server).
//!
//! A gateway is a translator on the same HTTP server and nothing more: it opens MAP sessions
//! in-process like any participant (`client::Client::in_process` over the
//! `transport::in_process::InProcessLinks` the server gives it) and calls the ordinary MAP
//! methods, so what it does is logged, permission-checked, replayable and visible to
//! dashboards. It must not reach into the router: the router core learns nothing about the
//! protocols here. `server` merges each gateway's axum routes into its own.
//!
//! - [`a2a`]: Agent2Agent (A2A) 1.0 and 0.3 over JSON-RPC + SSE (`docs/a2a.md`).

pub mod a2a;
