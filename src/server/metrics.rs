//! `GET /metrics`: the Prometheus scrape endpoint (docs/metrics.md).
//!
//! Owns only the route and its access check. What is measured lives in `crate::metrics`, and
//! the router's part of each scrape is one router command
//! ([`RouterHandle::render_metrics`]). With `[auth]` on and `[metrics] public = false` (the
//! default), a scrape must carry `Authorization: Bearer <credential>`, checked by the same
//! [`Authenticator`] that admits MAP sessions (an API key or a JWT); otherwise it is `401` with
//! a `WWW-Authenticate` header.
//!
//! The format follows `Accept`: OpenMetrics for scrapers that ask for it (Prometheus does),
//! Prometheus's classic text format (0.0.4) for everything else (`curl`, `promtool`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router as HttpRouter;

use crate::auth::Authenticator;
use crate::gateway::caller::{Admission, Refusal};
use crate::gateway::wire::bearer;
use crate::router::RouterHandle;

/// More metric families for each scrape, in OpenMetrics text without `# EOF` (the AIP
/// gateway's, `gateway::aip::AipGateway::render_metrics`).
pub type Extra = Arc<dyn Fn() -> String + Send + Sync>;

#[derive(Clone)]
struct MetricsState {
    router: RouterHandle,
    /// `Some` when scrapes must authenticate.
    auth: Option<Admission>,
    extra: Option<Extra>,
}

/// The `/metrics` route. `auth`: the authenticator scrapes must pass, or `None` when the
/// endpoint is public (no `[auth]`, or `[metrics] public = true`).
pub fn routes(router: RouterHandle, auth: Option<Arc<Authenticator>>) -> HttpRouter {
    routes_with(router, auth, None)
}

/// As [`routes`], with `extra` families appended to each scrape.
pub fn routes_with(
    router: RouterHandle,
    auth: Option<Arc<Authenticator>>,
    extra: Option<Extra>,
) -> HttpRouter {
    HttpRouter::new()
        .route("/metrics", get(scrape))
        .with_state(MetricsState {
            router,
            auth: auth.map(|a| Admission::new(Some(a))),
            extra,
        })
}

/// `text` with `extra`'s families before its `# EOF`.
fn splice(text: String, extra: Option<&Extra>) -> String {
    let Some(extra) = extra else { return text };
    let more = extra();
    match text.rfind("# EOF") {
        Some(at) => format!("{}{more}{}", &text[..at], &text[at..]),
        None => text + &more,
    }
}

fn unauthorized(why: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"map-router metrics\""),
        )],
        format!("{why}\n"),
    )
        .into_response()
}

async fn scrape(State(state): State<MetricsState>, headers: HeaderMap) -> Response {
    if let Some(admission) = &state.auth {
        match admission.admit(bearer(&headers), None) {
            Ok(_) => {}
            Err(Refusal::Missing) => return unauthorized(
                "metrics need `Authorization: Bearer <API key or JWT>` (or `[metrics] public = true`)",
            ),
            Err(Refusal::Refused(why)) => {
                return unauthorized(&format!("credential refused: {why}"))
            }
        }
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let openmetrics = crate::metrics::wants_openmetrics(accept);
    let rendered = state.router.render_metrics().await;
    let rendered = rendered.map(|t| splice(t, state.extra.as_ref()));
    match rendered {
        Ok(text) if openmetrics => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
            )],
            text,
        )
            .into_response(),
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(crate::metrics::CLASSIC_CONTENT_TYPE),
            )],
            crate::metrics::classic_text(&text),
        )
            .into_response(),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "router unavailable\n").into_response(),
    }
}
