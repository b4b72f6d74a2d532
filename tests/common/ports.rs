//! Free ports on 127.0.0.1 for the servers the tests start (router nodes, nats-server,
//! Phoenix): never one handed out twice by a test process, and never one from the kernel's
//! ephemeral range.
//!
//! A port found free with `bind(0)` and released comes from the ephemeral range
//! (`net.ipv4.ip_local_port_range`), which is also where the kernel draws the source port of
//! every outgoing connection: between the release and the server's own bind, a client's
//! connection (a node's to NATS, a test's to a node) can take it, and the server fails to
//! start ("address already in use"; seen in CI with a NATS route port). Ports below that range
//! are only ever taken by a bind that names them, so a port checked free there stays free
//! until the server binds it, unless another process picks the same one in that moment.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;

/// The lowest port handed out.
const LOWEST: u16 = 10_000;

/// The first port of the kernel's ephemeral range (32768 when it cannot be read).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// What this process handed out, and where its search goes on from.
struct Handed {
    ports: HashSet<u16>,
    /// The next port tried is `LOWEST + (cursor + 1) % span`.
    cursor: u32,
    /// The ports between `LOWEST` and the ephemeral range (0 when there is no room there).
    span: u32,
}

impl Handed {
    fn new() -> Self {
        let top = ephemeral_start();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Self {
            ports: HashSet::new(),
            // Test processes start at different points, so two that run at once rarely try
            // the same port at the same moment.
            cursor: std::process::id().wrapping_mul(7_919) ^ nanos,
            span: if top > LOWEST + 1_000 {
                u32::from(top - LOWEST)
            } else {
                0
            },
        }
    }

    /// Binds a port never handed out before, below the ephemeral range when there is room
    /// there (else from `bind(0)`), and returns the listener holding it.
    fn take(&mut self) -> TcpListener {
        for _ in 0..self.span {
            self.cursor = self.cursor.wrapping_add(1);
            let port = LOWEST + (self.cursor % self.span) as u16;
            if self.ports.contains(&port) {
                continue;
            }
            if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
                self.ports.insert(port);
                return listener;
            }
        }
        let mut refused = Vec::new();
        loop {
            let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
            let port = listener.local_addr().expect("a bound port").port();
            if self.ports.insert(port) {
                return listener;
            }
            // Keep it bound so the next bind cannot return it again.
            refused.push(listener);
            assert!(refused.len() < 1000, "no fresh port after 1000 tries");
        }
    }
}

/// Ports handed out by this process.
static HANDED: Mutex<Option<Handed>> = Mutex::new(None);

/// `n` distinct free ports on 127.0.0.1, each held by a listener until the caller drops it
/// (just before its server binds it), never one this test process handed out before (a
/// nats-server restarts on its old port).
pub fn reserve(n: usize) -> Vec<TcpListener> {
    let mut handed = HANDED.lock().unwrap_or_else(|e| e.into_inner());
    let handed = handed.get_or_insert_with(Handed::new);
    (0..n).map(|_| handed.take()).collect()
}

/// A free port on 127.0.0.1 for a server the caller starts at once (a router node binds its
/// `--listen` port itself, so nothing can hold it meanwhile): never one this process handed
/// out before, and outside the ephemeral range.
pub fn free_port() -> u16 {
    let listener = reserve(1).pop().expect("one port");
    listener.local_addr().expect("a bound port").port()
}
