//! Which browser pages may reach the server's routes: the `Origin` check in front of every
//! route (issue 23, M5), for the live node's routes and a standby's alike.
//!
//! Owns nothing but the check: `[limits] allowed_origins` is the config's.

use std::sync::Arc;

use axum::Router as HttpRouter;

use crate::server::config::Config;

/// Every route, first: a browser page from a site not allowed reaches nothing (issue 23, M5:
/// the WebSocket upgrades, /map/rpc and the gateways' POSTs).
pub fn guard(app: HttpRouter, config: &Config) -> HttpRouter {
    let origins = Arc::new(crate::gateway::guard::Guard::new(
        crate::gateway::guard::GuardSettings {
            allowed_origins: config
                .limits
                .allowed_origins
                .iter()
                .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
                .collect(),
            rate: None,
            ..Default::default()
        },
    ));
    app.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let origins = Arc::clone(&origins);
            async move {
                if origins.origin_allowed(request.headers()) {
                    next.run(request).await
                } else {
                    forbidden_origin(request.headers())
                }
            }
        },
    ))
}

/// 403 for a request whose `Origin` is neither the router's own nor allowed.
fn forbidden_origin(headers: &axum::http::HeaderMap) -> axum::response::Response {
    use axum::response::IntoResponse;
    let origin = headers
        .get(axum::http::header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?");
    let origin: String = origin.chars().take(200).collect();
    (
        axum::http::StatusCode::FORBIDDEN,
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        format!(
            "origin {origin} is not allowed: add it to [limits] allowed_origins to let pages \
             from it use this router\n"
        ),
    )
        .into_response()
}
