//! A TCP proxy on loopback that the test can cut and heal: while cut it closes every
//! connection it carries and closes each new one at once (a refused link as a peer sees it:
//! the connection ends before any byte). The fault tests put one between every router node and
//! every NATS server, and one on each direction of every NATS route.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A proxy from its own port to `target`, running until dropped.
pub struct Proxy {
    pub port: u16,
    target: Arc<AtomicU16>,
    up: Arc<watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `127.0.0.1:target`.
    pub async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a proxy");
        let port = listener.local_addr().expect("bound").port();
        let up = Arc::new(watch::channel(true).0);
        let target = Arc::new(AtomicU16::new(target));
        let task = tokio::spawn(serve(listener, Arc::clone(&target), Arc::clone(&up)));
        Self {
            port,
            target,
            up,
            task,
        }
    }

    /// Cuts (`false`) or heals (`true`) the link.
    pub fn set(&self, up: bool) {
        self.up.send_replace(up);
    }

    /// Where new connections go from now on (the ones it carries stay).
    pub fn retarget(&self, target: u16) {
        self.target.store(target, Ordering::Relaxed);
    }

    /// Where new connections go.
    pub fn target(&self) -> u16 {
        self.target.load(Ordering::Relaxed)
    }

    /// Whether the link is up.
    pub fn is_up(&self) -> bool {
        *self.up.borrow()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        // Ends the connections it carries.
        self.up.send_replace(false);
    }
}

async fn serve(listener: TcpListener, target: Arc<AtomicU16>, up: Arc<watch::Sender<bool>>) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        if !*up.borrow() {
            drop(inbound);
            continue;
        }
        let mut watch = up.subscribe();
        let target = target.load(Ordering::Relaxed);
        tokio::spawn(async move {
            let Ok(Ok(outbound)) = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                TcpStream::connect(("127.0.0.1", target)),
            )
            .await
            else {
                return;
            };
            let (mut a, mut b) = (inbound, outbound);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                _ = watch.wait_for(|up| !*up) => {}
            }
            let _ = a.shutdown().await;
            let _ = b.shutdown().await;
        });
    }
}
