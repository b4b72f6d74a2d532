//! The dashboard's HTTP routes over real sockets: `/ui`, `/ui/` and `/ui/<asset>` serve the
//! embedded files with their content types and caching headers; unknown names and traversal
//! attempts find nothing; the page refers only to files that are embedded; `map-router serve`
//! prints the dashboard's URL, which serves the page. (What the page does is tested in a real
//! browser by tests/browser/run.mjs.)

mod common;

use std::net::SocketAddr;

use common::http::*;
use common::*;
use map_router::server::ui::{find, ASSETS};

async fn addr() -> (map_router::server::Server, SocketAddr) {
    let (server, _) = default_server().await;
    let addr = server.local_addrs()[0];
    (server, addr)
}

fn assert_common_headers(r: &HttpResponse, path: &str) {
    assert_eq!(r.header("cache-control"), Some("no-cache"), "{path}");
    assert_eq!(
        r.header("x-content-type-options"),
        Some("nosniff"),
        "{path}"
    );
    let csp = r
        .header("content-security-policy")
        .unwrap_or_else(|| panic!("{path}: no CSP"));
    assert!(
        csp.contains("script-src 'self'") && csp.contains("connect-src 'self'"),
        "{path}: {csp}"
    );
}

#[tokio::test]
async fn every_embedded_file_is_served_with_its_content_type() {
    let (_server, addr) = addr().await;
    let index = find("index.html").expect("index.html is embedded");
    for path in ["/ui", "/ui/", "/ui/index.html"] {
        let r = request(addr, "GET", path, &[], b"").await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(
            r.header("content-type"),
            Some("text/html; charset=utf-8"),
            "{path}"
        );
        assert_eq!(r.body, index.body, "{path}");
        assert_common_headers(&r, path);
    }
    for asset in ASSETS {
        let path = format!("/ui/{}", asset.name);
        let r = request(addr, "GET", &path, &[], b"").await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("content-type"), Some(asset.content_type), "{path}");
        assert_eq!(r.body, asset.body, "{path}");
        assert_common_headers(&r, &path);
    }
    let js = find("app.js").unwrap();
    assert_eq!(js.content_type, "text/javascript; charset=utf-8");
    assert_eq!(
        find("style.css").unwrap().content_type,
        "text/css; charset=utf-8"
    );
    let head = request(addr, "HEAD", "/ui/app.js", &[], b"").await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    assert_eq!(
        head.header("content-length"),
        Some(js.body.len().to_string().as_str())
    );
}

#[tokio::test]
async fn unknown_names_and_traversal_attempts_find_nothing() {
    let (_server, addr) = addr().await;
    for path in [
        "/ui/nope.js",
        "/ui/INDEX.HTML",
        "/ui/index.html/",
        "/ui/./index.html",
        "/ui/ui/index.html",
        "/ui/../Cargo.toml",
        "/ui/../../Cargo.toml",
        "/ui/%2e%2e/Cargo.toml",
        "/ui/..%2fCargo.toml",
        "/ui/%2e%2e%2fsrc%2fmain.rs",
        "/ui/..%5cCargo.toml",
        "/ui//etc/passwd",
        "/ui/%2fetc%2fpasswd",
        "/ui/app.js%00",
        "/ui/server/ui.rs",
        "/uix",
    ] {
        let r = request(addr, "GET", path, &[], b"").await;
        assert_eq!(r.status, 404, "{path}");
        let body = String::from_utf8_lossy(&r.body);
        assert!(
            !body.contains("[package]") && !body.contains("root:") && body.len() < 200,
            "{path} answered {body:?}"
        );
    }
}

/// Every `/ui/...` file the page loads, and every module a script imports, is in the table: a
/// file added to `src/server/ui/` but not to `ASSETS` would break the page.
#[test]
fn the_page_refers_only_to_embedded_files() {
    let index = std::str::from_utf8(find("index.html").unwrap().body).unwrap();
    let mut referenced = Vec::new();
    for part in index.split("\"/ui/").skip(1) {
        referenced.push(part.split('"').next().unwrap().to_owned());
    }
    for asset in ASSETS.iter().filter(|a| a.name.ends_with(".js")) {
        let text = std::str::from_utf8(asset.body).unwrap();
        for part in text.split("from './").skip(1) {
            referenced.push(part.split('\'').next().unwrap().to_owned());
        }
    }
    assert!(referenced.contains(&"app.js".to_owned()), "{referenced:?}");
    assert!(
        referenced.contains(&"model.js".to_owned()),
        "{referenced:?}"
    );
    for name in &referenced {
        assert!(
            find(name).is_some(),
            "{name} is referenced but not embedded"
        );
    }
    // ...and nothing in the page reaches beyond this origin (comments aside: the vendored
    // uPlot cites its sources in them).
    for asset in ASSETS {
        let text = String::from_utf8_lossy(asset.body);
        for line in text.lines().map(str::trim_start) {
            if line.starts_with("//") || line.starts_with('*') || line.starts_with("/*") {
                continue;
            }
            for scheme in ["http://", "https://", "//cdn"] {
                let external = line
                    .match_indices(scheme)
                    .any(|(i, _)| !line[i..].starts_with("http://www.w3.org/2000/svg"));
                assert!(!external, "{} refers to {scheme}: {line}", asset.name);
            }
        }
    }
}

#[tokio::test]
async fn serve_prints_the_dashboard_url_which_serves_the_page() {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_map-router"))
        .args(["serve", "--listen", "127.0.0.1:0", "--ephemeral"])
        .env_remove("MAP_ROUTER_CONFIG")
        .env_remove("MAP_ROUTER_LISTEN")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the binary");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let (ws, ui) = with_timeout(async {
        let mut ws = None;
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            if let Some(url) = line.strip_prefix("map-router listening on ") {
                ws = Some(url.to_owned());
            } else if let Some(url) = line.strip_prefix("map-router dashboard on ") {
                return (ws.expect("the listening line comes first"), url.to_owned());
            }
        }
        panic!("the binary exited before printing the dashboard URL");
    })
    .await;
    let host = ws
        .strip_prefix("ws://")
        .and_then(|s| s.strip_suffix('/'))
        .expect("ws://HOST:PORT/");
    assert_eq!(ui, format!("http://{host}/ui"));
    let addr: SocketAddr = host.parse().unwrap();
    let r = request(addr, "GET", "/ui", &[], b"").await;
    assert_eq!(r.status, 200);
    assert!(String::from_utf8_lossy(&r.body).contains("<title>map-router dashboard</title>"));
    child.kill().await.expect("kill");
}

/// The dashboard names every vendor event type in its subscription and replay filter (the
/// router sends those only to filters that name them): a vendor type added to the router but not
/// to the dashboard would silently vanish from it.
#[test]
fn the_dashboard_asks_for_every_vendor_event_type() {
    // The dashboard, and the browser suite's peer that compares the dashboard with the log.
    for (file, start) in [
        ("/src/server/ui/app.js", "const EVERY_TYPE = "),
        ("/tests/browser/run.mjs", "const filter = { eventTypes: ["),
    ] {
        let path = format!("{}{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("the file");
        let line = text
            .lines()
            .map(str::trim_start)
            .find(|l| l.starts_with(start))
            .expect("the list of every type");
        for t in map_router::protocol::event::EventType::every_type() {
            assert!(
                line.contains(&format!("'{t}'")),
                "{file} does not ask for {t}: {line}"
            );
        }
    }
}

/// The type filter offers every type a subscriber can get, seen or not: a type added to the
/// router but not to the dashboard's list would be missing from the filter.
#[test]
fn the_type_filter_offers_every_event_type() {
    let path = format!("{}/src/server/ui/views.js", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("views.js");
    let line = text
        .lines()
        .find(|l| l.starts_with("export const ALL_TYPES = "))
        .expect("ALL_TYPES");
    let listed = line.matches('\'').count() / 2;
    let mut expected = 0;
    for t in map_router::protocol::event::EventType::ALL {
        if t.is_internal() {
            assert!(
                !line.contains(&format!("'{}'", t.as_str())),
                "{} is internal",
                t.as_str()
            );
            continue;
        }
        expected += 1;
        assert!(
            line.contains(&format!("'{}'", t.as_str())),
            "views.js ALL_TYPES lacks {}",
            t.as_str()
        );
    }
    assert_eq!(
        listed, expected,
        "ALL_TYPES has a type the router does not know: {line}"
    );
}
