//! Gateways: translators between other agent protocols and MAP, on the router's own HTTP
//! server (`docs/gateways.md`).
//!
//! A gateway owns no routing state. It opens in-process MAP sessions like any participant (one
//! per outside agent it speaks for), calls the ordinary methods (`map/send` with `meta.mail`,
//! `mail/create`, `map/agents/*`, `map/subscribe`), and folds the event log into the read
//! models its protocol wants. So everything it does is in the event log, obeys permissions and
//! is visible to every observer; the router core knows nothing about it.
//!
//! - `mamp/`: MAMP 1.0 (seed 000): cards, `POST /mamp/v1/messages`, outbound POSTs to
//!   configured remote MAMP agents.
//! - `im/`: the agent IM gateway (seed 002): `WS /gateway/connect`, `/gateway/*`, contacts and
//!   collaborators.
//! - shared: `context.rs` (settings, the in-process links, the service session),
//!   `directory.rs` (the read model folded from the event log), `peers.rs` and
//!   `peer_table.rs` (the sessions that stand for outside agents), `wire.rs` (URIs, times,
//!   error bodies), `config.rs` (`[gateways]`).
//!
//! This module only declares the gateways and merges their routes ([`routes`]).

pub mod config;
pub mod context;
pub mod directory;
pub mod im;
pub mod mamp;
pub mod outbound;
pub mod peer_table;
pub mod peers;
pub mod wire;

use std::sync::Arc;

use axum::Router as HttpRouter;

pub use config::GatewaySettings;
pub use context::GatewayContext;

/// The HTTP routes of every enabled gateway, to merge into the server's router.
pub fn routes(ctx: Arc<GatewayContext>) -> HttpRouter {
    let mut app = HttpRouter::new();
    if ctx.settings.mamp.enabled {
        app = app.merge(mamp::routes(Arc::clone(&ctx)));
    }
    if ctx.settings.im.enabled {
        app = app.merge(im::routes(Arc::clone(&ctx)));
    }
    app
}
