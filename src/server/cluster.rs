//! Which event store the server opens (SQLite, JetStream in cluster mode, or none), and the
//! NATS connection's state for `GET /health` and `/metrics` in cluster mode.
//!
//! Owns only the choice and a probe of the open JetStream store
//! (`store::jetstream::JetStreamStore::connected` / `diverged`); the store itself belongs to
//! the router. docs/cluster-notes.md says what cluster mode does and does not do yet.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::server::config::Config;
use crate::store::sqlite::SqliteStore;
use crate::store::{EventStore, Recovered};

/// The state of the NATS connection: whether it is up, and why the store stopped publishing
/// if it did.
pub type Probe = Arc<dyn Fn() -> (bool, Option<String>) + Send + Sync>;

/// An opened store with what it recovered.
pub type Opened = (Arc<dyn EventStore>, Recovered);

/// Opens the event store `config` names: JetStream with `[cluster] url`, else SQLite with a
/// data directory, else none. Returns the probe of a JetStream store.
///
/// # Errors
/// The store could not be opened (for JetStream: NATS unreachable within the connect timeout,
/// the stream unusable, or another live node writing to it).
pub async fn open_store(
    config: &Config,
    metrics: Option<&crate::metrics::Metrics>,
) -> std::io::Result<(Option<Opened>, Option<Probe>)> {
    #[cfg(feature = "cluster")]
    if let Some(options) = config.cluster.jetstream_options(&config.router.name) {
        let (store, recovered) = crate::store::jetstream::JetStreamStore::open(options)
            .await
            .map_err(|e| std::io::Error::other(format!("cluster: {e}")))?;
        let probe_store = Arc::clone(&store);
        let probe: Probe = Arc::new(move || (probe_store.connected(), probe_store.diverged()));
        return Ok((Some((store as Arc<dyn EventStore>, recovered)), Some(probe)));
    }
    #[cfg(not(feature = "cluster"))]
    if config.cluster.url.is_some() {
        return Err(std::io::Error::other(
            "[cluster] needs a binary built with the `cluster` feature",
        ));
    }
    let Some(mut options) = config.storage.sqlite_options() else {
        return Ok((None, None));
    };
    options.metrics = metrics.map(|m| m.store());
    let (store, recovered) = tokio::task::spawn_blocking(move || SqliteStore::open(options))
        .await
        .map_err(std::io::Error::other)?
        .map_err(std::io::Error::other)?;
    Ok((Some((store as Arc<dyn EventStore>, recovered)), None))
}

/// `GET /health`: `ok` (200), or in cluster mode with NATS down or the log diverged,
/// `unavailable` (503); in cluster mode a second line says the NATS state.
pub fn health(probe: Option<&Probe>) -> Response {
    let Some(probe) = probe else {
        return "ok\n".into_response();
    };
    match probe() {
        (_, Some(why)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unavailable\nnats: diverged: {why}\n"),
        )
            .into_response(),
        (false, None) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable\nnats: disconnected (the event log cannot be written or read)\n",
        )
            .into_response(),
        (true, None) => "ok\nnats: connected\n".into_response(),
    }
}

/// The cluster's metric families (OpenMetrics text without `# EOF`).
pub fn render_metrics(probe: &Probe) -> String {
    let (connected, diverged) = probe();
    format!(
        "# TYPE map_cluster_nats_connected gauge\n\
         # HELP map_cluster_nats_connected 1 while the NATS connection of the event log is up.\n\
         map_cluster_nats_connected {}\n\
         # TYPE map_cluster_diverged gauge\n\
         # HELP map_cluster_diverged 1 once the stream holds another writer's event at one of \
         this node's positions (publishing stopped).\n\
         map_cluster_diverged {}\n",
        u8::from(connected),
        u8::from(diverged.is_some()),
    )
}
