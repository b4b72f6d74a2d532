//! HTTP + Server-Sent Events transport (being built): `POST /map/rpc` for calls, `GET
//! /map/events` for notifications.

use axum::Router as HttpRouter;

use super::connection::ConnectionOptions;
use super::TransportContext;

/// The HTTP+SSE routes, to merge into the server's router.
pub fn routes(_ctx: TransportContext, _options: ConnectionOptions) -> HttpRouter {
    HttpRouter::new()
}
