//! The live web dashboard at `/ui`: a handful of static files (HTML, CSS, plain ES modules in
//! `src/server/ui/`) compiled into the binary with `include_bytes!`, served from a fixed table.
//!
//! There is no build step and nothing is fetched at run time: `cargo build` embeds the files as
//! they are in the repository. The page speaks MAP to this same router over its WebSocket
//! (`/map`), so it sees exactly what its principal may see; this module only hands out bytes.
//! What the dashboard shows and how it attaches is in `docs/dashboard.md`.
//!
//! Only the names in [`ASSETS`] exist: a request path is looked up in the table as a whole,
//! never joined to a directory, so `..`, encoded slashes and the like find nothing (404).
//! Every answer carries `Cache-Control: no-cache` (the files change with the binary, and they
//! are small), `X-Content-Type-Options: nosniff` and a Content-Security-Policy that allows
//! scripts, styles and connections to this origin only.

use std::net::SocketAddr;

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router as HttpRouter;

/// One embedded file.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// The name after `/ui/`.
    pub name: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static [u8],
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every file the dashboard is made of; `index.html` is also served at `/ui` and `/ui/`.
pub const ASSETS: [Asset; 18] = [
    Asset {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("ui/index.html"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("ui/style.css"),
    },
    Asset {
        name: "app.js",
        content_type: JS,
        body: include_bytes!("ui/app.js"),
    },
    Asset {
        name: "client.js",
        content_type: JS,
        body: include_bytes!("ui/client.js"),
    },
    Asset {
        name: "model.js",
        content_type: JS,
        body: include_bytes!("ui/model.js"),
    },
    Asset {
        name: "views.js",
        content_type: JS,
        body: include_bytes!("ui/views.js"),
    },
    Asset {
        name: "util.js",
        content_type: JS,
        body: include_bytes!("ui/util.js"),
    },
    Asset {
        name: "flow.js",
        content_type: JS,
        body: include_bytes!("ui/flow.js"),
    },
    Asset {
        name: "metrics.js",
        content_type: JS,
        body: include_bytes!("ui/metrics.js"),
    },
    Asset {
        name: "stats.js",
        content_type: JS,
        body: include_bytes!("ui/stats.js"),
    },
    Asset {
        name: "charts.js",
        content_type: JS,
        body: include_bytes!("ui/charts.js"),
    },
    Asset {
        name: "graph.js",
        content_type: JS,
        body: include_bytes!("ui/graph.js"),
    },
    Asset {
        name: "traces.js",
        content_type: JS,
        body: include_bytes!("ui/traces.js"),
    },
    Asset {
        name: "tasks.js",
        content_type: JS,
        body: include_bytes!("ui/tasks.js"),
    },
    Asset {
        name: "conversations.js",
        content_type: JS,
        body: include_bytes!("ui/conversations.js"),
    },
    Asset {
        name: "system.js",
        content_type: JS,
        body: include_bytes!("ui/system.js"),
    },
    // uPlot 1.6.32 (MIT, github.com/leeoniya/uPlot; uplot.LICENSE), the charts' library: its
    // ES module and stylesheet as npm ships them.
    Asset {
        name: "uplot.js",
        content_type: JS,
        body: include_bytes!("ui/uplot.js"),
    },
    Asset {
        name: "uplot.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("ui/uplot.css"),
    },
];

/// Scripts, styles and WebSocket connections from this origin only; no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The path the dashboard is served at.
pub const PATH: &str = "/ui";

/// The `/ui` routes (stateless; merged into the server's router).
pub fn routes() -> HttpRouter {
    HttpRouter::new()
        .route(PATH, get(index))
        .route("/ui/", get(index))
        .route("/ui/{*name}", get(asset))
}

/// The dashboard's URL for a listener bound to `addr` (`https` when it serves TLS).
pub fn url(addr: SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{addr}{PATH}")
}

/// Finds an embedded file by its exact name.
pub fn find(name: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.name == name)
}

async fn index() -> Response {
    serve(find("index.html"))
}

async fn asset(Path(name): Path<String>) -> Response {
    serve(find(&name))
}

fn serve(asset: Option<&'static Asset>) -> Response {
    let (status, content_type, body): (_, _, &'static [u8]) = match asset {
        Some(a) => (StatusCode::OK, a.content_type, a.body),
        None => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            b"not found: the dashboard is at /ui\n",
        ),
    };
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_plain_file_names() {
        for (i, a) in ASSETS.iter().enumerate() {
            assert!(
                !a.name.contains('/') && !a.name.starts_with('.'),
                "{}",
                a.name
            );
            assert!(!a.body.is_empty(), "{} is empty", a.name);
            assert!(
                ASSETS[..i].iter().all(|b| b.name != a.name),
                "{} twice",
                a.name
            );
        }
        assert!(find("index.html").is_some());
        assert!(find("../Cargo.toml").is_none());
        assert!(find("").is_none());
    }

    #[test]
    fn the_url_names_the_listener() {
        let addr: SocketAddr = "127.0.0.1:4500".parse().unwrap();
        assert_eq!(url(addr, false), "http://127.0.0.1:4500/ui");
        assert_eq!(url(addr, true), "https://127.0.0.1:4500/ui");
    }
}
