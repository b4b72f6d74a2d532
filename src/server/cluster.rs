//! Which event store the server opens (SQLite, JetStream in cluster mode, or none), the
//! standby's wait for the stream in cluster mode, and the NATS connection's state for
//! `GET /health` and `/metrics`.
//!
//! Owns only the choice, the standby page (served on the listeners while another node writes
//! the stream, `[cluster] standby`, whose store follows the stream meanwhile:
//! `store::jetstream::follower::Follower`), the follower router a standby serves MAP
//! subscriptions and replay with ([`Serving`]), and a probe of the open JetStream store
//! (`store::jetstream::JetStreamStore::connected` / `diverged`); the store itself belongs to
//! the router. docs/cluster.md says how to run it; docs/cluster-notes.md what is missing.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;

use crate::server::listener::ListenerSettings;

use crate::server::config::Config;
use crate::store::sqlite::SqliteStore;
use crate::store::{EventStore, Recovered};

/// What `/health` and `/metrics` say of the cluster, from this node.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    /// Whether the NATS connection is up.
    pub connected: bool,
    /// Why the store stopped publishing, if it did.
    pub diverged: Option<String>,
    /// The nodes that answered the last roll call (this one included), sorted by name.
    pub nodes: Vec<Node>,
    /// On a standby: the saved sessions, agents and scopes it holds, which it restores if it
    /// takes over (`router::handover`).
    pub handover: Option<crate::store::SavedCounts>,
}

/// A node of the stream, as it answered the roll call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Its `[cluster] node` name.
    pub name: String,
    /// `writer` or `standby`.
    pub role: String,
    /// The seq after the newest event it holds (committed, or followed).
    pub position: u64,
    /// The process that answered (`store::jetstream::NodeStatus::incarnation`).
    pub incarnation: String,
}

/// The cluster's state now.
pub type Probe = Arc<dyn Fn() -> ClusterState + Send + Sync>;

/// How long a roll call gathers the nodes' answers (how often it is held:
/// `[cluster] roll_call_ms`, [`roll_call_every`]).
#[cfg(feature = "cluster")]
const ROLL_CALL_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// An opened store with what it recovered.
pub type Opened = (Arc<dyn EventStore>, Recovered);

use crate::router::sessions::lifecycle::LifecycleFold;

/// What the writer hosts the standbys' relay sessions with (`server::relay::host`): its
/// NATS connection and the stream's name.
#[cfg(feature = "cluster")]
pub type Relays = Option<(async_nats::Client, String)>;
/// Without the cluster feature there are no relays.
#[cfg(not(feature = "cluster"))]
pub type Relays = Option<std::convert::Infallible>;

/// The server's bound sockets, which a standby answers on until it takes over, and what its
/// follower router admits callers with.
#[derive(Debug)]
pub struct Listeners<'a> {
    /// The sockets (the server serves them afterwards).
    pub sockets: &'a [Arc<TcpListener>],
    /// Admission, TLS and timeouts, as for the server.
    pub settings: &'a ListenerSettings,
    /// The server's authenticator (`[auth]`), built once for both routers.
    pub auth: Option<&'a Arc<crate::auth::Authenticator>>,
    /// The AIP gateway's listener (`[aip] listen`), which a standby serves its own AIP gateway
    /// on until it takes over.
    pub aip: Option<&'a Arc<TcpListener>>,
}

/// Opens the event store `config` names: JetStream with `[cluster] url`, else SQLite with a
/// data directory, else none. Returns the probe of a JetStream store.
///
/// In cluster mode with `[cluster] standby`, while another live node writes the stream, this
/// waits: the listeners answer 503 "standby" (naming the writer) and the store is opened when
/// the writer is gone (docs/cluster.md, "Standby and failover").
///
/// # Errors
/// The store could not be opened (for JetStream: NATS unreachable within the connect timeout,
/// the stream unusable, or another live node writing to it and no standby).
pub async fn open_store(
    config: &Config,
    metrics: Option<&crate::metrics::Metrics>,
    listeners: &Listeners<'_>,
) -> std::io::Result<(Option<Opened>, Option<Probe>, Relays, Option<LifecycleFold>)> {
    #[cfg(feature = "cluster")]
    if let Some(options) = config.cluster.jetstream_options(&config.router.name) {
        let options = options.map_err(|e| std::io::Error::other(format!("cluster: {e}")))?;
        if config.cluster.tls_ca.is_none() {
            for host in plaintext_remote_hosts(config.cluster.url.as_deref().unwrap_or_default()) {
                tracing::warn!(
                    %host,
                    "cluster: talking to NATS without TLS on a non-loopback address: relayed \
                     frames, the log and the NATS credentials cross the network in clear; set [cluster] tls_ca (docs/cluster.md, \"NATS users, \
                     permissions and TLS\")"
                );
            }
        }
        let stream = options.stream.clone();
        let (store, recovered, fold) = open_jetstream(config, options, listeners).await?;
        let relays = Some((store.nats(), stream));
        let nodes = roll_calls(&store, roll_call_every(config), |s| async move {
            s.nodes(ROLL_CALL_WAIT).await
        });
        let probe_store = Arc::clone(&store);
        let probe: Probe = Arc::new(move || ClusterState {
            connected: probe_store.connected(),
            diverged: probe_store.diverged(),
            nodes: crate::sync::lock(&nodes).clone(),
            handover: None,
        });
        return Ok((
            Some((store as Arc<dyn EventStore>, recovered)),
            Some(probe),
            relays,
            fold,
        ));
    }
    #[cfg(not(feature = "cluster"))]
    let _ = listeners;
    #[cfg(not(feature = "cluster"))]
    if config.cluster.url.is_some() {
        return Err(std::io::Error::other(
            "[cluster] needs a binary built with the `cluster` feature",
        ));
    }
    let Some(mut options) = config.storage.sqlite_options() else {
        return Ok((None, None, None, None));
    };
    options.metrics = metrics.map(|m| m.store());
    let (store, recovered) = tokio::task::spawn_blocking(move || SqliteStore::open(options))
        .await
        .map_err(std::io::Error::other)?
        .map_err(std::io::Error::other)?;
    Ok((
        Some((store as Arc<dyn EventStore>, recovered)),
        None,
        None,
        None,
    ))
}

/// The hosts of a `[cluster] url` (one or several, comma-separated) reached without TLS that
/// are not loopback (`127.0.0.0/8`, `::1`, `localhost`): what the start warns about. A
/// `tls://` URL is TLS.
#[cfg(feature = "cluster")]
pub fn plaintext_remote_hosts(urls: &str) -> Vec<String> {
    crate::store::jetstream::server_list(urls)
        .into_iter()
        .filter_map(|url| {
            let (scheme, rest) = url.split_once("://").unwrap_or(("nats", url));
            if scheme.eq_ignore_ascii_case("tls") {
                return None;
            }
            // Without credentials (never logged) and path.
            let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
            let rest = rest.split('/').next().unwrap_or_default();
            let host = match rest.strip_prefix('[') {
                Some(v6) => v6.split(']').next().unwrap_or_default(),
                None => rest.split(':').next().unwrap_or_default(),
            };
            let loopback = host.eq_ignore_ascii_case("localhost")
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            (!loopback).then(|| host.to_owned())
        })
        .collect()
}

/// How often this node holds the roll call (`[cluster] roll_call_ms`).
pub fn roll_call_every(config: &Config) -> std::time::Duration {
    std::time::Duration::from_millis(config.cluster.roll_call_ms.max(100))
}

/// Asks every node of the stream who it is, `every` ([`roll_call_every`]), for as long as the
/// store is open; the answers gathered last are in the returned list (empty while NATS is
/// away). Handlers read the list: a scrape sends nothing to NATS.
/// `ask` is the store's (the writer's) or the follower's (a standby's) roll call.
#[cfg(feature = "cluster")]
fn roll_calls<T, F, Fut>(
    source: &Arc<T>,
    every: std::time::Duration,
    ask: F,
) -> Arc<std::sync::Mutex<Vec<Node>>>
where
    T: Send + Sync + 'static,
    F: Fn(Arc<T>) -> Fut + Send + 'static,
    Fut: std::future::Future<
            Output = Result<Vec<crate::store::jetstream::NodeStatus>, crate::store::StoreError>,
        > + Send,
{
    let nodes: Arc<std::sync::Mutex<Vec<Node>>> = Arc::default();
    let cache = Arc::clone(&nodes);
    let source = Arc::downgrade(source);
    tokio::spawn(async move {
        loop {
            let Some(open) = source.upgrade() else { return };
            let answered = ask(open).await;
            let answered: Vec<Node> = answered
                .unwrap_or_default()
                .into_iter()
                .map(|n| Node {
                    name: n.node,
                    role: n.role,
                    position: n.position,
                    incarnation: n.incarnation,
                })
                .collect();
            *crate::sync::lock(&cache) = answered;
            tokio::time::sleep(every).await;
        }
    });
    nodes
}

/// Opens the JetStream store, as a standby first when `[cluster] standby` says so and another
/// node writes.
#[cfg(feature = "cluster")]
async fn open_jetstream(
    config: &Config,
    options: crate::store::jetstream::JetStreamOptions,
    listeners: &Listeners<'_>,
) -> std::io::Result<(
    Arc<crate::store::jetstream::JetStreamStore>,
    Recovered,
    Option<LifecycleFold>,
)> {
    use crate::store::jetstream::follower::Follower;
    use crate::store::jetstream::{wait_for_takeover, JetStreamStore};
    use crate::store::StoreError;
    let failed = |e: StoreError| std::io::Error::other(format!("cluster: {e}"));
    let poll = std::time::Duration::from_millis(config.cluster.takeover_poll_ms.max(1));
    let mut standby: Option<Standby> = None;
    // A standby follows the stream (kept tables, claims, position), so that taking over
    // starts the writer without reading the log again, and serves subscriptions and replay
    // from it meanwhile.
    // With the follower, what the standby sees of the cluster (its roll call).
    let mut follower: Option<(Arc<Follower>, Probe)> = None;
    let mut serving: Option<Serving> = None;
    // Whether this node has stood by (then failures are retried, never fatal).
    let mut waiting = false;
    loop {
        let attempt = match &follower {
            Some((f, _)) => f.promote().await,
            None => JetStreamStore::open(options.clone()).await,
        };
        match attempt {
            Ok(opened) => {
                if let Some(page) = standby.take() {
                    page.stop().await;
                    let warm = follower.as_ref().is_some_and(|(f, _)| f.promoted_warm());
                    tracing::info!(node = %options.node, stream = %options.stream, from_followed = warm, "standby: took over the stream");
                }
                // The fold is the followed stream's only when the follower was promoted.
                let fold = match serving.take() {
                    Some(s) => s.stop().await.filter(|_| follower.is_some()),
                    None => None,
                };
                if follower.is_none() {
                    // Not checked as a standby: another live process with this name?
                    if let Err(e) =
                        refuse_a_namesake(opened.0.nodes(ROLL_CALL_WAIT).await, &options.node)
                    {
                        let _ = opened.0.close().await;
                        return Err(e);
                    }
                }
                return Ok((opened.0, opened.1, fold));
            }
            Err(StoreError::Locked(why)) if config.cluster.standby => {
                if standby.is_none() {
                    tracing::info!(node = %options.node, "standby: {why}");
                }
                if follower.is_none() {
                    match Follower::open(options.clone()).await {
                        Ok(f) => {
                            let f = Arc::new(f);
                            let probe = follower_probe(&f, roll_call_every(config));
                            refuse_a_namesake(f.nodes(ROLL_CALL_WAIT).await, &options.node)?;
                            let relay = crate::server::relay::FollowerRelay::start(
                                f.nats(),
                                &options.stream,
                                &options.node,
                                crate::store::jetstream::NodeStatus::this_incarnation(),
                            );
                            match Serving::start(
                                config,
                                listeners,
                                &f,
                                Arc::clone(&probe),
                                relay,
                                &options.node,
                            ) {
                                Ok(s) => serving = Some(s),
                                Err(e) => tracing::warn!(
                                    error = %e,
                                    "standby: cannot serve subscriptions from the stream"
                                ),
                            }
                            follower = Some((f, probe));
                            // Served again below, with the follower's router and position.
                            if let Some(page) = standby.take() {
                                page.stop().await;
                            }
                        }
                        Err(e) => tracing::warn!(
                            error = %e,
                            "standby: cannot follow the stream; it is read at the takeover"
                        ),
                    }
                }
                let page = standby.get_or_insert_with(|| {
                    Standby::serve(
                        listeners,
                        &options.stream,
                        follower.as_ref().map(|(f, probe)| {
                            (Box::new(f.position_probe()) as Position, Arc::clone(probe))
                        }),
                        serving.as_ref().map(|s| s.app.clone()),
                    )
                });
                waiting = true;
                // Watching the writer fails while NATS is away (or goes away while the
                // watch connects): the standby keeps serving and watches again.
                let watch = async {
                    loop {
                        let writer = Arc::clone(&page.writer);
                        let watched = wait_for_takeover(&options, poll, move |node| {
                            tracing::info!(writer = ?node, "standby: the stream's writer");
                            *crate::sync::lock(&writer) = Some(node.map(str::to_owned));
                        })
                        .await;
                        match watched {
                            Ok(()) => break,
                            Err(e) => {
                                tracing::warn!(error = %e, "standby: cannot watch the stream's writer; trying again");
                                tokio::time::sleep(poll.max(WATCH_AGAIN)).await;
                            }
                        }
                    }
                };
                if follower.is_some() {
                    watch.await;
                } else if tokio::time::timeout(FOLLOW_AGAIN, watch).await.is_err() {
                    // Not following (it could not open): try again now and then, so that
                    // the standby serves subscriptions and replay as soon as it can, not
                    // only after a takeover.
                    continue;
                }
            }
            // Once waiting, a failed takeover (NATS restarting, a request timing out) is
            // tried again; at start, it is an answer for the operator.
            Err(e) if waiting => {
                tracing::warn!(error = %e, "standby: the takeover failed; trying again");
                // A follower whose promotion failed may be spent: the next try opens the
                // store as a restarted node does (and follows and serves again if it is
                // refused). Meanwhile the listeners answer as a standby's, never refuse.
                follower = None;
                if let Some(s) = serving.take() {
                    let _ = s.stop().await;
                }
                if let Some(page) = standby.take() {
                    let writer = crate::sync::lock(&page.writer).clone();
                    page.stop().await;
                    let plain = Standby::serve(listeners, &options.stream, None, None);
                    *crate::sync::lock(&plain.writer) = writer;
                    standby = Some(plain);
                }
                tokio::time::sleep(poll).await;
            }
            Err(e) => return Err(failed(e)),
        }
    }
}

/// The least pause before a standby watches the writer again after the watch failed.
#[cfg(feature = "cluster")]
const WATCH_AGAIN: std::time::Duration = std::time::Duration::from_millis(250);

/// How often a standby that could not follow the stream tries again.
#[cfg(feature = "cluster")]
const FOLLOW_AGAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Refuses to start (a clear error) when another live process answers the roll call with this
/// node's name (`nodes`: the roll call's answers, this process's own among them): two
/// processes with one name would be taken for one node (whose sessions end when either
/// leaves). The default name is the router's, the same on every node unless `[cluster] node`
/// is set. A node restarted after a crash is not refused: its predecessor's connection to
/// NATS closed with it (a host that vanished without closing it answers no more either, but
/// NATS notices that only at its ping timeout: until then the new process is refused).
#[cfg(feature = "cluster")]
fn refuse_a_namesake(
    nodes: Result<Vec<crate::store::jetstream::NodeStatus>, crate::store::StoreError>,
    node: &str,
) -> std::io::Result<()> {
    let mine = crate::store::jetstream::NodeStatus::this_incarnation();
    let Ok(nodes) = nodes else {
        // NATS is away: the relay's incarnations still tell the two apart.
        return Ok(());
    };
    match nodes
        .iter()
        .find(|n| n.node == node && n.incarnation != mine)
    {
        Some(other) => Err(std::io::Error::other(format!(
            "cluster: another live process answers as node \"{}\" ({}, process {}): every \
             node needs its own `[cluster] node` name (it defaults to `[router] name`, the \
             same on every node)",
            printable(node),
            printable(&other.role),
            printable(&other.incarnation),
        ))),
        None => Ok(()),
    }
}

/// What a standby answers on the listeners: `GET /health` and every other route that the
/// follower router does not serve get 503, naming the node that writes the stream.
#[cfg(feature = "cluster")]
struct Standby {
    /// Who writes the stream: not asked yet, nobody answers, or a node's name.
    writer: Arc<std::sync::Mutex<Option<Option<String>>>>,
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// A standby's follower router: MAP over WebSocket and HTTP on the standby's listeners, serving
/// `map/connect`, `map/subscribe` and `map/replay` from the stream the follower follows
/// (`router::events::follow`), and refusing every call that would write the log
/// (`router::dispatch::served_by_follower`). Stopped at the takeover: its connections close
/// (WebSocket 1001) and reconnect to the writer this node then becomes.
#[cfg(feature = "cluster")]
struct Serving {
    /// Its routes (without `/health`, which the standby page answers).
    app: axum::Router,
    ctx: crate::transport::TransportContext,
    shutdown: tokio::sync::watch::Sender<bool>,
    router_task: tokio::task::JoinHandle<()>,
    /// Hands the follower's rows to the router.
    feed: tokio::task::JoinHandle<()>,
    /// Serves its AIP gateway on the server's AIP listener (`[aip] listen`).
    aip: Option<tokio::task::JoinHandle<()>>,
    drain: std::time::Duration,
}

/// The spans of the calls a standby relays, when traces are exported (`[telemetry]`,
/// `OTEL_*`), into an exporter of its own (its resource names `node`); `None` when off, or
/// with a warning when the settings cannot be used (the live node's start refuses them).
#[cfg(feature = "cluster")]
fn relay_spans(
    config: &Config,
    metrics: Option<&crate::metrics::Metrics>,
    node: &str,
) -> Option<crate::router::traces::RelaySpans> {
    use crate::server::telemetry::export::Exporter;
    let counts = metrics.map_or_else(Default::default, crate::metrics::Metrics::telemetry);
    let started = config
        .telemetry
        .resolve(&|k| std::env::var(k).ok())
        .and_then(|resolved| {
            let Some(resolved) = resolved else {
                return Ok(None);
            };
            let exporter = Exporter::start(&resolved, Some(node), counts)?;
            Ok(Some(crate::router::traces::RelaySpans::new(
                exporter,
                resolved.model.sampler,
                node,
            )))
        });
    started.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "standby: relayed calls make no spans");
        None
    })
}

#[cfg(feature = "cluster")]
impl Serving {
    /// Starts a follower router on what `follower` has followed and the rows after it.
    fn start(
        config: &Config,
        listeners: &Listeners<'_>,
        follower: &Arc<crate::store::jetstream::follower::Follower>,
        probe: Probe,
        relay: Arc<crate::server::relay::FollowerRelay>,
        node: &str,
    ) -> std::io::Result<Self> {
        use crate::router::{Router, RouterConfig, RouterParts};
        use crate::transport::ws::{upgrade, WsState};
        let failed = |e: crate::store::StoreError| std::io::Error::other(format!("cluster: {e}"));
        let auth = listeners.auth.cloned();
        let (recovered, mut rows) = follower.serve().map_err(failed)?;
        let store: Arc<dyn EventStore> = Arc::clone(follower) as Arc<dyn EventStore>;
        let metrics = config.metrics.enabled.then(crate::metrics::Metrics::new);
        let metrics_auth = auth.clone().filter(|_| !config.metrics.public);
        // Traces: this node makes no span of the model (it writes no log), one per call it
        // relays (`router::relay`), exported as the live node's are.
        let relays = Arc::downgrade(&relay);
        if let Some(spans) = relay_spans(config, metrics.as_deref(), node) {
            relay.set_spans(spans);
        }
        let (router, router_task) = Router::start(
            RouterConfig {
                auth: auth.clone(),
                follower: true,
                relay: Some(relay as Arc<dyn crate::router::relay::Relay>),
                ..config.router_config()
            },
            RouterParts {
                process_control: None,
                store: Some((store, recovered)),
                metrics: metrics.clone(),
                traces: None,
                carried_fold: None,
            },
        );
        let feed = {
            let router = router.clone();
            tokio::spawn(async move {
                let mut batch = Vec::with_capacity(256);
                while rows.recv_many(&mut batch, 256).await > 0 {
                    let rows = std::mem::take(&mut batch);
                    if router.with(move |r| r.ingest_followed(rows)).await.is_err() {
                        return;
                    }
                }
            })
        };
        let options = config.connection_options();
        let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
        let ctx = crate::transport::TransportContext {
            router,
            dispatcher: Arc::new(crate::router::dispatch::Dispatcher::new()),
            shutdown: shutdown_rx,
            connections: tokio_util::task::TaskTracker::new(),
        };
        let app = axum::Router::new()
            .route("/", axum::routing::get(upgrade))
            .route("/map", axum::routing::get(upgrade))
            .with_state(WsState {
                ctx: ctx.clone(),
                options: options.clone(),
            })
            .merge(crate::transport::http::routes_with(
                ctx.clone(),
                options.clone(),
                crate::transport::http::HttpSettings {
                    admission: Some(config.admission()),
                    body_timeout: Some(config.header_timeout()),
                    ..crate::transport::http::HttpSettings::default()
                },
            ))
            .merge(crate::server::ui::routes());
        // The gateways (A2A, MAMP, IM, AIP), as on the live node, with sessions of this node's
        // own (relayed to the live node like any client's) and without what only one gateway
        // may do (docs/cluster.md, "Gateways on every node").
        let addrs = listeners
            .sockets
            .iter()
            .map(|l| l.local_addr())
            .collect::<std::io::Result<Vec<_>>>()?;
        let gateways =
            crate::server::gateways::gateway_context(config, &ctx, &options, auth.clone(), &addrs);
        let app = app.merge(crate::server::gateways::gateway_routes(
            config,
            &ctx,
            &options,
            &gateways,
            auth.clone(),
            crate::server::gateways::A2aAllow::of(config)?,
            &ctx.shutdown,
            Some(node),
        ));
        // AIP on the server's AIP listener, until the takeover (then the live node's gateway
        // serves it: `stop` waits for this one to let go).
        let aip = match listeners.aip {
            Some(tcp) => {
                let (gateway, tls) = crate::server::gateways::aip_gateway(config, &gateways)?;
                tracing::info!(addr = %tcp.local_addr()?, "standby: serving the AIP gateway");
                let task = tokio::spawn(crate::gateway::aip::listener::serve(
                    Arc::clone(&gateway),
                    Arc::clone(tcp),
                    tls,
                    ctx.shutdown.clone(),
                ));
                Some((gateway, task))
            }
            None => None,
        };
        // `/metrics`: the follower router's own families (its connections, subscriptions and
        // deliveries), and where it is in the stream.
        let app = if metrics.is_some() {
            let follower = Arc::downgrade(follower);
            let aip_gateway = aip.as_ref().map(|(g, _)| Arc::downgrade(g));
            let traffic = gateways.traffic();
            let extra: crate::server::metrics::Extra = Arc::new(move || {
                let position = follower.upgrade().map_or(0, |f| f.position());
                let relayed = relays.upgrade().map_or(0, |r| r.sessions());
                let aip = aip_gateway
                    .as_ref()
                    .and_then(std::sync::Weak::upgrade)
                    .map(|g| g.render_metrics())
                    .unwrap_or_default();
                traffic.render()
                    + &aip
                    + &render_metrics(&probe)
                    + &format!(
                        "# TYPE map_cluster_standby gauge\n\
                     # HELP map_cluster_standby 1 on a standby: it follows the stream another \
                     node writes and serves subscriptions and replay from it.\n\
                     map_cluster_standby 1\n\
                     # TYPE map_cluster_following_position gauge\n\
                     # HELP map_cluster_following_position The seq after the newest event this \
                     standby has followed.\n\
                     map_cluster_following_position {position}\n\
                     # TYPE map_cluster_relay_sessions gauge\n\
                     # HELP map_cluster_relay_sessions Sessions of this standby's clients whose \
                     calls it relays to the live node now.\n\
                     map_cluster_relay_sessions {relayed}\n"
                    )
            });
            app.merge(crate::server::metrics::routes_with(
                ctx.router.clone(),
                metrics_auth,
                Some(extra),
            ))
        } else {
            app
        };
        Ok(Self {
            app: crate::server::origins::guard(app, config),
            ctx,
            shutdown,
            router_task,
            feed,
            aip: aip.map(|(_, task)| task),
            drain: options.drain_timeout,
        })
    }

    /// Closes its connections and stops its router (as `Server::shutdown`, with no store to
    /// close: the follower is the caller's). Returns the router's fold of the lifecycle
    /// events it followed, for the router that takes the stream over.
    async fn stop(self) -> Option<LifecycleFold> {
        use crate::router::{Command, Router};
        let Self {
            ctx,
            shutdown,
            router_task,
            feed,
            aip,
            drain,
            ..
        } = self;
        feed.abort();
        // After the rows it was handed (the router takes calls in order).
        let fold = tokio::time::timeout(drain, ctx.router.with(Router::take_lifecycle_fold))
            .await
            .ok()
            .and_then(Result::ok)
            .flatten();
        let _ = tokio::time::timeout(drain, ctx.router.with(Router::begin_shutdown)).await;
        let _ = shutdown.send(true);
        ctx.connections.close();
        if tokio::time::timeout(
            drain + std::time::Duration::from_secs(1),
            ctx.connections.wait(),
        )
        .await
        .is_err()
        {
            tracing::warn!(
                "standby: some follower connections did not close within the drain timeout"
            );
        }
        // Its AIP listener stops accepting at once; calls in flight get the drain timeout.
        if let Some(mut task) = aip {
            if tokio::time::timeout(drain, &mut task).await.is_err() {
                tracing::warn!("standby: AIP calls did not end within the drain timeout");
                task.abort();
            }
        }
        let _ = ctx.router.send(Command::Shutdown).await;
        let _ = tokio::time::timeout(drain, router_task).await;
        fold
    }
}

/// What a standby says of the cluster: its own NATS connection, and the nodes that answered
/// its roll call (every node asks, so that any node shows the whole cluster).
#[cfg(feature = "cluster")]
fn follower_probe(
    follower: &Arc<crate::store::jetstream::follower::Follower>,
    every: std::time::Duration,
) -> Probe {
    let nodes = roll_calls(
        follower,
        every,
        |f| async move { f.nodes(ROLL_CALL_WAIT).await },
    );
    let follower = Arc::downgrade(follower);
    Arc::new(move || {
        let f = follower.upgrade();
        ClusterState {
            connected: f.as_ref().is_some_and(|f| f.connected()),
            diverged: None,
            nodes: crate::sync::lock(&nodes).clone(),
            handover: f.map(|f| f.saved_counts()),
        }
    })
}

/// The position a follower has reached.
#[cfg(feature = "cluster")]
type Position = Box<dyn Fn() -> u64 + Send + Sync>;

#[cfg(feature = "cluster")]
impl Standby {
    /// Answers on the listeners; `following` says how far the follower is and what it sees
    /// of the cluster, `serving` is the follower router's routes.
    fn serve(
        listeners: &Listeners<'_>,
        stream: &str,
        following: Option<(Position, Probe)>,
        serving: Option<axum::Router>,
    ) -> Self {
        let writer: Arc<std::sync::Mutex<Option<Option<String>>>> = Arc::default();
        let following = Arc::new(following);
        let serves = serving.is_some();
        let answer = {
            let writer = Arc::clone(&writer);
            let following = Arc::clone(&following);
            let stream = stream.to_owned();
            move |health: bool| {
                let node = crate::sync::lock(&writer).clone();
                let who = match node {
                    None => "writer: (asking NATS)".to_owned(),
                    Some(None) => "no live writer answers (taking over)".to_owned(),
                    Some(Some(n)) => format!("writer: {n}"),
                };
                let body = if health {
                    // Without a follower, NATS answered the writer check just now.
                    let (nats, position, nodes) = match following.as_ref() {
                        Some((position, probe)) => {
                            let state = probe();
                            let handover = state.handover.map_or(String::new(), |h| {
                                format!(
                                    "handover: {} sessions, {} agents, {} scopes (restored if \
                                     this node takes over)\n",
                                    h.sessions, h.agents, h.scopes
                                )
                            });
                            (
                                if state.connected {
                                    "connected"
                                } else {
                                    "disconnected"
                                },
                                format!("following: position {}\n{handover}", position()),
                                node_lines(&state.nodes),
                            )
                        }
                        None => ("connected", String::new(), String::new()),
                    };
                    let serves = if serves {
                        "serving: map/subscribe and map/replay (calls that change state go to the writer)\n"
                    } else {
                        ""
                    };
                    format!("standby\nnats: {nats}\n{who}\n{position}{serves}{nodes}")
                } else {
                    format!(
                        "standby: another node writes the event log (stream {stream}; {who}); \
                         this node takes over when it stops\n"
                    )
                };
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(axum::http::header::RETRY_AFTER, "1")],
                    body,
                )
                    .into_response()
            }
        };
        let health = answer.clone();
        let probes = crate::server::probes::routes(
            crate::server::probes::Role::Standby { serving: serves },
            following
                .as_ref()
                .as_ref()
                .map(|(_, p)| probe_nats(Arc::clone(p))),
        );
        let app = serving.unwrap_or_default().merge(probes);
        let app = app
            .route(
                "/health",
                axum::routing::get(move || {
                    let health = health.clone();
                    async move { health(true) }
                }),
            )
            .fallback(move || {
                let answer = answer.clone();
                async move { answer(false) }
            });
        let (shutdown, stop) = tokio::sync::watch::channel(false);
        let tasks = listeners
            .sockets
            .iter()
            .map(|socket| {
                tokio::spawn(crate::server::listener::serve(
                    Arc::clone(socket),
                    app.clone(),
                    listeners.settings.clone(),
                    stop.clone(),
                ))
            })
            .collect();
        Self {
            writer,
            shutdown,
            tasks,
        }
    }

    /// Stops answering (the accept loops end; their connections get the drain timeout).
    async fn stop(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// What the probes (`server::probes`) read of `probe`: the NATS state.
pub fn probe_nats(probe: Probe) -> impl Fn() -> crate::server::probes::Nats + Clone + Send + Sync {
    move || {
        let state = probe();
        crate::server::probes::Nats {
            connected: state.connected,
            diverged: state.diverged,
        }
    }
}

/// `GET /health`: `ok` (200), or in cluster mode with NATS down or the log diverged,
/// `unavailable` (503); in cluster mode a second line says the NATS state.
pub fn health(probe: Option<&Probe>) -> Response {
    let Some(probe) = probe else {
        return "ok\n".into_response();
    };
    let state = probe();
    let (status, mut body) = match (&state.diverged, state.connected) {
        (Some(why), _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unavailable\nnats: diverged: {why}\n"),
        ),
        (None, false) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable\nnats: disconnected (the event log cannot be written or read)\n".into(),
        ),
        (None, true) => (StatusCode::OK, "ok\nnats: connected\n".to_owned()),
    };
    body.push_str(&node_lines(&state.nodes));
    (status, body).into_response()
}

/// The `/health` lines of the roll call: `nodes: N`, then `node NAME: ROLE, position N` each
/// (nothing before the first answers).
fn node_lines(nodes: &[Node]) -> String {
    let mut out = String::new();
    if !nodes.is_empty() {
        out.push_str(&format!("nodes: {}\n", nodes.len()));
        for n in nodes {
            out.push_str(&format!(
                "node {}: {}, position {}\n",
                printable(&n.name),
                printable(&n.role),
                n.position
            ));
        }
    }
    out
}

/// `s` with control characters (a line break in a node's name) shown as `?`.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// `s` as an OpenMetrics label value (backslash, quote and line break escaped).
fn label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The cluster's metric families (OpenMetrics text without `# EOF`).
pub fn render_metrics(probe: &Probe) -> String {
    let ClusterState {
        connected,
        diverged,
        nodes,
        handover,
    } = probe();
    let mut out = format!(
        "# TYPE map_cluster_nats_connected gauge\n\
         # HELP map_cluster_nats_connected 1 while the NATS connection of the event log is up.\n\
         map_cluster_nats_connected {}\n\
         # TYPE map_cluster_diverged gauge\n\
         # HELP map_cluster_diverged 1 once the stream holds another writer's event at one of \
         this node's positions (publishing stopped).\n\
         map_cluster_diverged {}\n",
        u8::from(connected),
        u8::from(diverged.is_some()),
    );
    out.push_str(&format!(
        "# TYPE map_cluster_nodes gauge\n\
         # HELP map_cluster_nodes Nodes of the stream that answered this node's last roll call \
         (itself included).\n\
         map_cluster_nodes {}\n\
         # TYPE map_cluster_node_position gauge\n\
         # HELP map_cluster_node_position The seq after the newest event each node holds \
         (committed on the writer, followed on a standby).\n",
        nodes.len()
    ));
    for n in &nodes {
        out.push_str(&format!(
            "map_cluster_node_position{{node=\"{}\",role=\"{}\"}} {}\n",
            label(&n.name),
            label(&n.role),
            n.position
        ));
    }
    if let Some(h) = handover {
        out.push_str(&format!(
            "# TYPE map_cluster_handover_records gauge\n\
             # HELP map_cluster_handover_records On a standby: the saved sessions, agents and \
             scopes it holds, which it restores if it takes over.\n\
             map_cluster_handover_records{{kind=\"session\"}} {}\n\
             map_cluster_handover_records{{kind=\"agent\"}} {}\n\
             map_cluster_handover_records{{kind=\"scope\"}} {}\n",
            h.sessions, h.agents, h.scopes
        ));
    }
    out
}

#[cfg(all(test, feature = "cluster"))]
mod tests {
    use super::plaintext_remote_hosts;

    #[test]
    fn only_plaintext_urls_off_loopback_are_warned_about() {
        for quiet in [
            "nats://127.0.0.1:4222",
            "nats://localhost:4222",
            "nats://[::1]:4222",
            "127.0.0.2:4222",
            "tls://nats.example.com:4222",
            "nats://user:secret@127.0.0.1:4222",
        ] {
            assert!(plaintext_remote_hosts(quiet).is_empty(), "{quiet}");
        }
        assert_eq!(
            plaintext_remote_hosts(
                "nats://user:secret@10.0.0.5:4222, nats://127.0.0.1:4222,nats://[fd00::1]:4222,nats.example.com"
            ),
            ["10.0.0.5", "fd00::1", "nats.example.com"]
        );
        assert_eq!(plaintext_remote_hosts("nats://0.0.0.0:4222"), ["0.0.0.0"]);
    }
}
