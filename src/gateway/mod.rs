//! Gateways: the other agent protocols of our design documents, reaching MAP agents through
//! the router (`docs/spec`'s gateways page says where each lives on the server;
//! `docs/gateways.md`, `docs/a2a.md`).
//!
//! A gateway is a translator on the same HTTP server and nothing more: it opens MAP sessions
//! in-process like any participant (`client::Client::in_process` over the
//! `transport::in_process::InProcessLinks` the server gives it) and calls the ordinary MAP
//! methods, so what it does is logged, permission-checked, replayable and visible to
//! dashboards. It must not reach into the router: the router core learns nothing about the
//! protocols here. `server` merges each gateway's axum routes into its own.
//!
//! - [`a2a`]: Agent2Agent (A2A) 1.0 and 0.3 over JSON-RPC + SSE (`docs/a2a.md`).
//! - [`aip`]: AIP (seed 003) over gRPC, on a listener of its own (`docs/aip.md`).
//! - [`mamp`]: MAMP 1.0 (seed 000): cards, `POST /mamp/v1/messages`, outbound POSTs to
//!   configured remote MAMP agents (`docs/gateways.md`).
//! - [`federation`]: MAP-to-MAP, outbound: this router's links to its peer systems, which
//!   route what waits for each peer (`router::federation`) to its `map/federation/route`
//!   (docs/federation.md).
//! - [`im`]: the agent IM gateway (seed 002): `WS /gateway/connect`, `/gateway/*`, contacts
//!   and collaborators (`docs/gateways.md`).
//! - shared by every gateway: `caller.rs` (who calls: the one admission of a credential),
//!   `guard.rs` (the one gate every HTTP route is built behind: credential, rate per caller,
//!   JSON bodies with a size cap and a deadline; [`guard::GatedRoutes`]), `callers.rs` (the
//!   one opener of MAP sessions, keyed by principal).
//! - shared by MAMP and IM:
//!   `context.rs` (settings, the in-process links, the callers' and the service's sessions),
//!   `senders.rs` (who may post as which MAMP `from`), `directory.rs` (the read model folded
//!   from the event log, answered per caller), `peers.rs` and `peer_table.rs` (the sessions
//!   that stand for outside agents), `outbound.rs` (MAMP POSTs), `wire.rs` (URIs, times, error
//!   bodies, [`wire::Failure`]), `config.rs` (`[gateways]`).
//! - `egress/`: where every gateway may send requests of its own (allow-lists on parsed URLs,
//!   checked addresses) and the one outbound HTTP client (A2A remotes and push, MAMP).
//! - `trace.rs`: a caller's W3C trace context (HTTP `traceparent` / `tracestate`) into the
//!   MAP messages and calls made for its request, and out on the gateways' own calls.
//! - `threads.rs`: the conversation of each message sent for an outside caller (replies);
//!   `recency.rs`: least-recently-used order for the bounded tables.
//!
//! This module only declares the gateways and merges the MAMP and IM routes ([`routes`]).

pub mod a2a;
pub mod aip;
pub mod caller;
pub mod callers;
pub mod config;
pub mod context;
pub mod directory;
pub mod egress;
pub mod federation;
pub mod guard;
pub mod im;
pub mod mamp;
pub mod outbound;
pub mod peer_table;
pub mod peers;
pub mod recency;
pub mod senders;
pub mod threads;
pub mod trace;
pub mod traffic;
pub mod wire;

use std::sync::Arc;

use guard::Gated;

pub use config::GatewaySettings;
pub use context::GatewayContext;

/// The participant ids and agent ids of the gateways' own sessions and agents: the router lets
/// only its service principal (`auth::service_principal`, which the gateways' bookkeeping
/// sessions connect as) take them, so nobody can squat one before a gateway's first use.
pub const RESERVED_IDS: &[&str] = &[
    a2a::tasks::GATEWAY_AGENT,
    a2a::tasks::BOOKS[0],
    a2a::tasks::BOOKS[1],
    a2a::tasks::BOOKS[2],
    a2a::tasks::BOOKS[3],
];

/// The members of a task's `meta` only the service principal (the gateways' bookkeeping
/// sessions) may write: `a2a`, the A2A gateway's record of the task, which names its owner
/// (docs/a2a.md, "Who owns a task"). Without this, anyone who may create tasks could put one
/// with a made-up owner into another principal's `ListTasks`.
pub const RESERVED_TASK_META: &[&str] = &["a2a"];

/// The ids only the service principal may take: [`RESERVED_IDS`] and, so that nobody takes a
/// configured remote MAMP agent's URI before (or instead of) the gateway's own session, every
/// `[[gateways.mamp.remote]]` URI.
pub fn reserved_ids(settings: &GatewaySettings) -> Vec<String> {
    RESERVED_IDS
        .iter()
        .map(|s| (*s).to_owned())
        .chain(settings.mamp.remote.iter().map(|r| r.uri.clone()))
        .collect()
}

/// The HTTP routes of the MAMP and IM gateways (those enabled), each behind its gate, to
/// merge into the server's router.
pub fn routes(ctx: Arc<GatewayContext>) -> Gated {
    let mut app = Gated::default();
    if ctx.settings.mamp.enabled {
        app = app.merge(mamp::routes(Arc::clone(&ctx)));
    }
    if ctx.settings.im.enabled {
        app = app.merge(im::routes(Arc::clone(&ctx)));
    }
    app
}
