//! Issue 43: every gateway HTTP route is behind its group's gate (`gateway::guard`), so none
//! can miss the body cap or the rate limit. The routes are the ones the server built
//! (`GatewayContext::routes`, recorded by `server::gateways`), not a list written here; and a
//! route added only in this test through the same public builder (`GatedRoutes`) is gated
//! too. Real sockets on 127.0.0.1:0, a timeout on every await, bounded loops.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use common::http::{read_response, HttpResponse};
use common::{start_server, with_timeout};
use map_router::auth::config::Secret;
use map_router::gateway::caller::Admission;
use map_router::gateway::guard::{
    Gate, GatedRoute, GatedRoutes, Guard, GuardSettings, Refused, Render,
};
use map_router::server::Config;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const ALICE: &str = "key-alice-0123456789";

/// Authentication on (alice's API key), every gateway on, the callers' rates as given
/// (`0`: unlimited); anonymous loopback callers (the public cards') are not exempt.
fn with(rate: u32, burst: u32) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| {
        c.auth.api_keys.inline = Some(Secret(format!("{ALICE} alice")));
        c.limits.exempt_loopback = false;
        c.gateways.rate_per_caller = rate;
        c.gateways.burst_per_caller = burst;
        c.a2a.rate_per_caller = rate;
        c.a2a.burst_per_caller = burst;
    }
}

/// A concrete path for a route pattern: every `{param}` / `{*rest}` segment becomes `x`.
fn concrete(pattern: &str) -> String {
    pattern
        .split('/')
        .map(|seg| if seg.starts_with('{') { "x" } else { seg })
        .collect::<Vec<_>>()
        .join("/")
}

/// One request on a fresh connection: the head declares `declared` body bytes, of which
/// `body` is sent (the gate may answer from the head alone); the whole answer is read.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    declared: usize,
    body: &[u8],
) -> HttpResponse {
    with_timeout(async {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
             Authorization: Bearer {ALICE}\r\nContent-Type: application/json\r\n\
             Content-Length: {declared}\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.expect("write head");
        // The server may answer and close before reading a refused body: not an error here.
        let _ = s.write_all(body).await;
        read_response(&mut s).await
    })
    .await
}

/// The routes the server built, checked to be the gateways' (not an empty or partial list).
fn routes_of(server: &map_router::server::Server) -> Vec<GatedRoute> {
    let routes = server.gateways().routes();
    for expected in [
        "/mamp/v1/card",
        "/mamp/v1/messages",
        "/gateway/connect",
        "/gateway/send",
        "/a2a",
        "/a2a/agents/{agent}",
        "/.well-known/agent-card.json",
        "/a2a/remote",
    ] {
        assert!(
            routes.iter().any(|r| r.path == expected),
            "{expected} is among the gateway routes: {routes:?}"
        );
    }
    routes
}

#[tokio::test]
async fn every_gateway_route_refuses_an_oversize_body() {
    let (server, _url) = start_server(with(0, 0)).await;
    let addr = server.local_addrs()[0];
    let routes = routes_of(&server);
    for route in &routes {
        let path = concrete(route.path);
        let r = send(addr, route.method.as_str(), &path, route.max_body + 1, b"").await;
        assert_eq!(
            r.status,
            413,
            "{} {path} ({}) refuses {} bytes: {}",
            route.method,
            route.group,
            route.max_body + 1,
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.header("connection"), Some("close"), "{path}: body unread");
    }
}

#[tokio::test]
async fn every_gateway_route_refuses_a_flood() {
    let (server, _url) = start_server(with(1, 1)).await;
    let addr = server.local_addrs()[0];
    let routes = routes_of(&server);
    for route in &routes {
        let path = concrete(route.path);
        let mut limited = None;
        // One token a second, a burst of one: at most a few requests pass before a refusal.
        for _ in 0..6 {
            let r = send(addr, route.method.as_str(), &path, 2, b"{}").await;
            if r.status == 429 {
                limited = Some(r);
                break;
            }
        }
        let r = limited.unwrap_or_else(|| panic!("{} {path} was never rate limited", route.method));
        assert!(
            r.header("retry-after").is_some(),
            "{path}: a rate limit says when to try again"
        );
    }
}

/// A gate whose refusals are plain statuses, over `rate`.
fn test_gate(rate: Option<(u32, u32)>, max_body: usize) -> Gate {
    let guard = Arc::new(Guard::new(GuardSettings {
        rate,
        body_timeout: Duration::from_secs(2),
        ..GuardSettings::default()
    }));
    let render: Render = Arc::new(|refused: &Refused, _: &HeaderMap| {
        let status = match refused {
            Refused::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Refused::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Refused::Timeout { .. } => StatusCode::REQUEST_TIMEOUT,
            _ => StatusCode::BAD_REQUEST,
        };
        (status, format!("{refused:?}")).into_response()
    });
    Gate::new(Admission::new(None), guard, max_body, render)
}

/// Serves `router` on a fresh loopback port; the address and the serving task.
async fn serve(router: axum::Router) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("address");
    let served = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (addr, served)
}

/// A POST to `/extra` with these `headers` and `body` written as they are (no credential);
/// the whole answer.
async fn post_raw(addr: SocketAddr, headers: &str, body: &str) -> HttpResponse {
    with_timeout(async {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let request = format!(
            "POST /extra HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\r\n{body}"
        );
        s.write_all(request.as_bytes()).await.expect("write");
        read_response(&mut s).await
    })
    .await
}

/// A chunked JSON body of 32 bytes: its size is not in the head.
fn chunked_32() -> (&'static str, String) {
    (
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n",
        format!("20\r\n{}\r\n0\r\n\r\n", "x".repeat(32)),
    )
}

#[tokio::test]
async fn a_route_the_gateways_never_had_is_gated_too() {
    let gated = GatedRoutes::new("test", test_gate(Some((1, 2)), 16))
        .post(
            "/extra",
            |body: Bytes| async move { body.len().to_string() },
        )
        .with_state(());
    assert_eq!(gated.routes.len(), 1, "the builder lists what it built");
    assert_eq!(gated.routes[0].path, "/extra");
    let (addr, served) = serve(gated.router).await;
    // Within the cap: the handler gets the body the gate read.
    let ok = send(addr, "POST", "/extra", 2, b"{}").await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.body, b"2");
    // Past the cap: refused from the head, the body unread.
    let big = send(addr, "POST", "/extra", 17, b"").await;
    assert_eq!(big.status, 413, "{}", String::from_utf8_lossy(&big.body));
    // The bucket (burst 2) is spent by now: a flood is refused before the body matters.
    let (headers, body) = chunked_32();
    let chunked = post_raw(addr, headers, &body).await;
    assert_eq!(
        chunked.status,
        429,
        "{}",
        String::from_utf8_lossy(&chunked.body)
    );
    let unlimited = GatedRoutes::new("test", test_gate(None, 16))
        .post(
            "/extra",
            |body: Bytes| async move { body.len().to_string() },
        )
        .with_state(());
    let (addr2, served2) = serve(unlimited.router).await;
    // A cap the head does not declare is kept while reading (a chunked body).
    let chunked = post_raw(addr2, headers, &body).await;
    assert_eq!(
        chunked.status,
        413,
        "{}",
        String::from_utf8_lossy(&chunked.body)
    );
    let form = post_raw(
        addr2,
        "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 3\r\n",
        "a=b",
    )
    .await;
    assert_eq!(
        form.status,
        400,
        "not JSON: {}",
        String::from_utf8_lossy(&form.body)
    );
    assert!(String::from_utf8_lossy(&form.body).contains("NotJson"));
    served.abort();
    served2.abort();
}
