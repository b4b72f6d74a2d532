//! The probes a load balancer understands (issue 44, item 14; docs/http.md, "Probes"):
//! `/livez` (the process answers), `/readyz` (200 on every node that serves clients, 503 while
//! it cannot) and `/readyz?role=live` (200 only on the node that writes the log), on a single
//! node and on a live + standby pair of the real binary on a real `nats-server`, through a
//! takeover and a NATS outage. `/health` keeps its meaning (503 on a standby).
//!
//! Every await is bounded. Needs `nats-server` on PATH (the pair test fails, never skips,
//! without it).

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::nats::Nats;
use common::ports::free_port;
use common::*;

fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("ws://")
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let r = with_timeout(http::request(addr, "GET", path, &[], b"")).await;
    (r.status, String::from_utf8_lossy(&r.body).into_owned())
}

/// The statuses of `/livez`, `/readyz`, `/readyz?role=live`, `/readyz?role=standby`, `/health`.
async fn probes(addr: SocketAddr) -> [u16; 5] {
    let mut out = [0; 5];
    for (i, path) in [
        "/livez",
        "/readyz",
        "/readyz?role=live",
        "/readyz?role=standby",
        "/health",
    ]
    .into_iter()
    .enumerate()
    {
        out[i] = get(addr, path).await.0;
    }
    out
}

/// Polls until the probes of `addr` answer `want` (within 20 s).
async fn probes_until(addr: SocketAddr, what: &str, want: [u16; 5]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = probes(addr).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: probes (livez, readyz, role=live, role=standby, health) answer {got:?}, \
             not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_single_node_is_alive_ready_and_live() {
    let (server, _url) = start_server(|_| {}).await;
    let addr = server.local_addrs()[0];
    assert_eq!(probes(addr).await, [200, 200, 200, 503, 200]);
    let (_, body) = get(addr, "/readyz").await;
    assert_eq!(body, "ready\nrole: live\n");
    assert_eq!(get(addr, "/livez").await.1, "alive\n");
    let (status, body) = get(addr, "/readyz?role=leader").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("`live` or `standby`"), "{body}");
    // /health keeps its words.
    assert_eq!(get(addr, "/health").await.1, "ok\n");
}

/// The arguments of a cluster node named `name` on `nats` (`standby = true` when asked).
fn node_args(
    nats: &Nats,
    data: &Path,
    name: &str,
    standby: bool,
    port: u16,
) -> Vec<std::ffi::OsString> {
    let config = data.with_extension("toml");
    let standby = if standby {
        "standby = true\ntakeover_poll_ms = 100\n"
    } else {
        ""
    };
    std::fs::write(
        &config,
        format!(
            "[cluster]\nnode = \"{name}\"\n{standby}request_timeout_ms = 1000\n\
             connect_timeout_ms = 3000\n[storage]\ncommit_timeout_ms = 1500\n"
        ),
    )
    .unwrap();
    vec![
        "--listen".into(),
        format!("127.0.0.1:{port}").into(),
        "--cluster".into(),
        nats.url().into(),
        "--data-dir".into(),
        data.into(),
        "--config".into(),
        config.into(),
    ]
}

#[tokio::test]
async fn a_live_standby_pair_answers_each_probe_through_a_takeover_and_a_nats_outage() {
    let mut nats = Nats::start("probes");
    let dir = TempDir::new("probes-pair");
    let (mut live, live_url) =
        start_binary(node_args(&nats, &dir.path.join("n0"), "n0", false, 0)).await;
    let live_addr = addr_of(&live_url);
    // The standby prints "listening on" only once it takes over: wait for its port instead.
    let port = free_port();
    let mut standby = binary_command(node_args(&nats, &dir.path.join("n1"), "n1", true, port))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start a standby");
    let standby_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    within(Duration::from_secs(20), async {
        while tokio::net::TcpStream::connect(standby_addr).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    // The live node: alive, ready, live. The standby, once its follower router serves:
    // alive, ready (it serves clients), not live; /health 503 as before.
    probes_until(live_addr, "live n0", [200, 200, 200, 503, 200]).await;
    probes_until(standby_addr, "standby n1", [200, 200, 503, 200, 503]).await;
    let (_, body) = get(standby_addr, "/readyz?role=live").await;
    assert!(body.contains("role: standby"), "{body}");
    let (_, body) = get(standby_addr, "/health").await;
    assert!(
        body.starts_with("standby"),
        "/health keeps its meaning: {body}"
    );

    // SIGKILL the live node: the standby takes over and becomes the live one.
    live.start_kill().expect("SIGKILL");
    let _ = with_timeout(live.wait()).await;
    probes_until(
        standby_addr,
        "n1 after the takeover",
        [200, 200, 200, 503, 200],
    )
    .await;

    // NATS stops: the node cannot serve (503 ready, 503 live) but is alive (a liveness probe
    // must not restart it).
    nats.kill();
    probes_until(standby_addr, "n1 without NATS", [200, 503, 503, 503, 503]).await;
    let (_, body) = get(standby_addr, "/readyz").await;
    assert!(body.contains("NATS disconnected"), "{body}");
    // Back: ready and live again, by itself.
    nats.restart();
    probes_until(standby_addr, "n1 with NATS back", [200, 200, 200, 503, 200]).await;
    let _ = standby.start_kill();
}

/// The README's prerequisites table names every program of `scripts/test-deps.txt` (the list
/// `tests/setup_deps.rs` keeps equal to what the tests start), so a newcomer installs them all.
#[test]
fn the_readme_prerequisites_name_every_program_the_tests_start() {
    let root = common::docs::root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme
        .find("| Program | Debian package |")
        .expect("the table");
    let table: String = readme[start..]
        .lines()
        .take_while(|l| l.trim_start().starts_with('|'))
        .collect::<Vec<_>>()
        .join("\n");
    let deps = std::fs::read_to_string(root.join("scripts/test-deps.txt")).unwrap();
    let mut missing = Vec::new();
    for line in deps.lines() {
        let mut words = line.split_whitespace();
        let (Some("program"), Some(name)) = (words.next(), words.next()) else {
            continue;
        };
        // cargo: the README's Rust bullet, above the table.
        if name != "cargo" && !table.contains(&format!("`{name}`")) {
            missing.push(name.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "README.md's prerequisites table lacks {missing:?}"
    );
}
