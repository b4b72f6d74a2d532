//! Free ports on 127.0.0.1 for the external servers the tests start (nats-server, Phoenix):
//! each held by a listener until the server is about to bind it, never one handed out twice.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;

/// `n` distinct free ports on 127.0.0.1, each held by a listener until the caller drops it,
/// never one this test process handed out before (the kernel may give a released port again,
/// and a nats-server restarts on its old port).
pub fn reserve(n: usize) -> Vec<TcpListener> {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    let mut held = Vec::with_capacity(n);
    let mut refused = Vec::new();
    while held.len() < n {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = listener.local_addr().expect("a bound port").port();
        if given.insert(port) {
            held.push(listener);
        } else {
            // Keep it bound so the next bind cannot return it again.
            refused.push(listener);
            assert!(refused.len() < 1000, "no fresh port after 1000 tries");
        }
    }
    held
}
