//! Listeners, the HTTP routes, and graceful shutdown.
//!
//! [`Server::start`] binds every configured address, starts the router task, and serves
//! WebSocket upgrades at `/` and `/map` (plus `GET /health`). [`Server::shutdown`] drains:
//! stop accepting, tell every connection to finish (each queues a close frame behind its pending
//! output), wait for the connection tasks up to the drain timeout, then stop the router. This is
//! mini-redis's shape: a broadcast shutdown signal and a guard channel whose last sender
//! dropping means "everyone is done".

pub mod config;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router as HttpRouter;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::router::dispatch::Dispatcher;
use crate::router::{Command, Router, RouterHandle};
use crate::transport::ws::{upgrade, WsState};

pub use config::Config;

/// A running server.
#[derive(Debug)]
pub struct Server {
    addrs: Vec<SocketAddr>,
    router: RouterHandle,
    router_task: JoinHandle<()>,
    http_tasks: Vec<JoinHandle<()>>,
    shutdown: watch::Sender<bool>,
    drained: mpsc::Receiver<()>,
    drain_timeout: Duration,
}

impl Server {
    /// Binds the listeners and starts serving.
    ///
    /// # Errors
    /// An address could not be bound.
    pub async fn start(config: Config) -> std::io::Result<Self> {
        let mut listeners = Vec::new();
        for addr in &config.listen {
            listeners.push(TcpListener::bind(addr).await?);
        }
        let addrs = listeners
            .iter()
            .map(TcpListener::local_addr)
            .collect::<std::io::Result<Vec<_>>>()?;
        let (router, router_task) = Router::spawn(config.router_config());
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (drain_guard, drained) = mpsc::channel(1);
        let state = WsState {
            router: router.clone(),
            dispatcher: Arc::new(Dispatcher::new()),
            options: config.connection_options(),
            shutdown: shutdown_rx.clone(),
            drain_guard,
        };
        let app = HttpRouter::new()
            .route("/", get(upgrade))
            .route("/map", get(upgrade))
            .route("/health", get(|| async { "ok\n" }))
            .with_state(state);
        let mut http_tasks = Vec::new();
        for listener in listeners {
            let app = app.clone();
            let mut stop = shutdown_rx.clone();
            http_tasks.push(tokio::spawn(async move {
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await;
                if let Err(e) = served {
                    tracing::error!(error = %e, "listener failed");
                }
            }));
        }
        Ok(Self {
            addrs,
            router,
            router_task,
            http_tasks,
            shutdown,
            drained,
            drain_timeout: config.connection_options().drain_timeout,
        })
    }

    /// The bound addresses (useful with port 0).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// A handle to the router (for in-process use and tests).
    pub fn router(&self) -> &RouterHandle {
        &self.router
    }

    /// Drains and stops: no new connections, every connection flushes and closes with 1001,
    /// then the router stops.
    pub async fn shutdown(self) {
        let Self {
            router,
            router_task,
            http_tasks,
            shutdown,
            mut drained,
            drain_timeout,
            ..
        } = self;
        let _ = shutdown.send(true);
        // Every connection task holds a guard clone; `recv` returns None once all are gone.
        // The HTTP state holds one clone too, released when the listeners stop.
        for task in http_tasks {
            let _ = tokio::time::timeout(drain_timeout, task).await;
        }
        if tokio::time::timeout(drain_timeout + Duration::from_secs(1), drained.recv())
            .await
            .is_err()
        {
            tracing::warn!("some connections did not close within the drain timeout");
        }
        let _ = router.send(Command::Shutdown).await;
        drop(router);
        let _ = tokio::time::timeout(drain_timeout, router_task).await;
    }
}
