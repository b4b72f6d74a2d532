//! Listeners, the HTTP routes, embedding, and graceful shutdown.
//!
//! [`Server::start`] starts the router task, binds every configured address (possibly none,
//! when the router is embedded or serves stdio only), and serves WebSocket upgrades at `/` and
//! `/map`, `GET /health`, the probes `GET /livez` and `GET /readyz` (`probes.rs`), Prometheus metrics at `GET /metrics` (`metrics.rs`), the web
//! dashboard's static files at `/ui` (`ui.rs`), and the gateways' routes (`crate::gateway`:
//! A2A at `/.well-known/agent-card.json` and `/a2a/...`; MAMP at `/mamp/v1/*`; the agent IM
//! gateway at `/gateway/*` and `/api/*`). The same server hands out in-process connections
//! ([`Server::connect_in_process`]) and serves byte-stream pairs ([`Server::serve_io`]), all on
//! the one connection driver.
//!
//! With `[storage] data_dir` set, [`Server::start`] first opens the SQLite event store there
//! (recovering the log's position and its newest events) and hands it to the router; with
//! `[cluster] url` set, the JetStream store instead (`cluster.rs`).
//!
//! [`Server::shutdown`] drains: stop accepting, tell every connection to finish (each queues a
//! close behind its pending output), wait for the connection tasks up to the drain timeout,
//! then stop the router, then close the store (which commits everything queued). This is mini-redis's shape: a broadcast shutdown signal and a guard
//! channel whose last sender dropping means "everyone is done".

pub mod cluster;
pub mod config;
mod gateways;
pub mod listener;
pub mod metrics;
pub mod origins;
pub mod probes;
#[cfg(feature = "cluster")]
pub mod relay;
pub mod telemetry;
pub mod tls;
pub mod ui;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router as HttpRouter;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::process::Supervisor;
use crate::protocol::methods::session::Principal;
use crate::router::dispatch::Dispatcher;
use crate::router::sessions::table::ConnOrigin;
use crate::router::Command;
use crate::router::Router;
use crate::router::RouterConfig;
use crate::router::RouterHandle;
use crate::router::RouterParts;
use crate::store::EventStore;
use crate::transport::connection::ConnectionOptions;
use crate::transport::in_process::{self, InProcessLink};
use crate::transport::ws::{upgrade, WsState};
use crate::transport::{http, stdio, TransportContext};
use gateways::{connect_as, gateway_context, gateway_routes, A2aAllow};

pub use config::Config;

/// A running server.
#[derive(Debug)]
pub struct Server {
    addrs: Vec<SocketAddr>,
    ctx: TransportContext,
    options: ConnectionOptions,
    router_task: JoinHandle<()>,
    http_tasks: Vec<JoinHandle<()>>,
    supervisor: Supervisor,
    shutdown: watch::Sender<bool>,
    drain_timeout: Duration,
    store: Option<Arc<dyn EventStore>>,
    /// The MAMP and IM gateways' shared state (their tables' sizes are read from it).
    gateways: Arc<crate::gateway::GatewayContext>,
    /// The AIP gateway and its bound address, when `[aip] listen` is set.
    aip: Option<(Arc<crate::gateway::aip::AipGateway>, SocketAddr)>,
}

/// How long shutdown waits for the store to commit what is queued (its own limit for a failing
/// disk is 10 s).
const STORE_CLOSE_TIMEOUT: Duration = Duration::from_secs(15);

impl Server {
    /// Starts the router and binds the listeners in `config.listen` (none is fine).
    ///
    /// # Errors
    /// An address could not be bound, the event store could not be opened (its directory is
    /// unwritable, in use by another router, or holds a file this version cannot read), or the
    /// authentication keys could not be read (`[auth]`).
    pub async fn start(config: Config) -> std::io::Result<Self> {
        let auth = config
            .auth
            .build(&config.router.name)
            .map_err(|e| std::io::Error::other(format!("auth: {e}")))?;
        let tls = config.tls.files().map(|f| tls::acceptor(&f)).transpose()?;
        let a2a_allow = A2aAllow::of(&config)?;
        let aip_listener = match config.aip.listen {
            Some(addr) => Some(Arc::new(TcpListener::bind(addr).await?)),
            None => None,
        };
        let mut listeners = Vec::new();
        for addr in &config.listen {
            listeners.push(Arc::new(TcpListener::bind(addr).await?));
        }
        let addrs = listeners
            .iter()
            .map(|l| l.local_addr())
            .collect::<std::io::Result<Vec<_>>>()?;
        let options = config.connection_options();
        let admission = config.admission();
        let listener_settings = listener::ListenerSettings {
            admission: admission.clone(),
            tls,
            header_timeout: config.header_timeout(),
            drain_timeout: options.drain_timeout,
        };
        let metrics = config.metrics.enabled.then(crate::metrics::Metrics::new);
        let (store, probe, relays, carried_fold) = cluster::open_store(
            &config,
            metrics.as_deref(),
            &cluster::Listeners {
                sockets: &listeners,
                settings: &listener_settings,
                auth: auth.as_ref(),
                aip: aip_listener.as_ref(),
            },
        )
        .await?;
        let store_handle = store.as_ref().map(|(s, _)| Arc::clone(s));
        let (supervisor, process_control) =
            Supervisor::start(config.supervisor_settings(), options.clone())?;
        let metrics_auth = auth.clone().filter(|_| !config.metrics.public);
        let telemetry_counts = metrics
            .as_ref()
            .map_or_else(Default::default, |m| m.telemetry());
        let traces = telemetry::tap(
            &config.telemetry,
            config.cluster.node.as_deref(),
            telemetry_counts.clone(),
        )
        .map_err(std::io::Error::other)?;
        let gateway_auth = auth.clone();
        let a2a_auth = auth.clone();
        let (router, router_task) = Router::start(
            RouterConfig {
                auth,
                ..config.router_config()
            },
            RouterParts {
                process_control: Some(process_control),
                store,
                metrics: metrics.clone(),
                traces,
                carried_fold,
            },
        );
        let (shutdown, shutdown_rx) = watch::channel(false);
        let ctx = TransportContext {
            router,
            dispatcher: Arc::new(Dispatcher::with_spawner(Arc::new(supervisor.downgrade()))),
            shutdown: shutdown_rx.clone(),
            connections: tokio_util::task::TaskTracker::new(),
        };
        supervisor.bind(ctx.clone());
        for agent in &config.agents {
            let supervisor = supervisor.clone();
            let params = agent.spawn_params();
            let label = agent.name.clone().unwrap_or_else(|| agent.program.clone());
            tokio::spawn(async move {
                match supervisor.spawn(None, params).await {
                    Ok(r) => {
                        tracing::info!(agent = %r.agent.id, name = %label, "started configured agent")
                    }
                    Err(e) => {
                        tracing::error!(name = %label, code = e.code.0, error = %e.message, "configured agent failed to start")
                    }
                }
            });
        }
        let app = HttpRouter::new()
            .route("/", get(upgrade))
            .route("/map", get(upgrade))
            .route(
                "/health",
                get({
                    let probe = probe.clone();
                    move || async move { cluster::health(probe.as_ref()) }
                }),
            )
            .with_state(WsState {
                ctx: ctx.clone(),
                options: options.clone(),
            })
            .merge(probes::routes(
                probes::Role::Live,
                probe.clone().map(cluster::probe_nats),
            ))
            .merge(http::routes_with(
                ctx.clone(),
                options.clone(),
                http::HttpSettings {
                    admission: Some(admission.clone()),
                    body_timeout: Some(config.header_timeout()),
                    ..http::HttpSettings::default()
                },
            ))
            .merge(ui::routes());
        let gateways = gateway_context(&config, &ctx, &options, gateway_auth, &addrs);
        let gateway_context = Arc::clone(&gateways);
        let aip = match aip_listener {
            Some(tcp) => {
                let (gateway, tls) = gateways::aip_gateway(&config, &gateways)?;
                Some((gateway, tcp.local_addr()?, tcp, tls))
            }
            None => None,
        };
        let app = app.merge(gateway_routes(
            &config,
            &ctx,
            &options,
            &gateways,
            a2a_auth,
            a2a_allow,
            &shutdown_rx,
            None,
        ));
        if !config.gateways.mamp.remote.is_empty() && config.gateways.mamp.enabled {
            tokio::spawn(crate::gateway::peers::open_configured(gateways));
        }
        let peers = config
            .federation
            .peer_links(addrs.first().copied())
            .map_err(std::io::Error::other)?;
        let peer_links = crate::gateway::federation::PeerLinks::new(&peers);
        let mut link_tasks = Vec::new();
        if !peers.is_empty() {
            let links = Arc::new(gateways::GatewayLinks {
                ctx: ctx.clone(),
                options: options.clone(),
            });
            for peer in peers {
                link_tasks.push(tokio::spawn(crate::gateway::federation::run(
                    Arc::clone(&links),
                    peer,
                    peer_links.clone(),
                    shutdown_rx.clone(),
                )));
            }
        }
        let app = if metrics.is_some() {
            let aip_gateway = aip.as_ref().map(|(gateway, ..)| Arc::clone(gateway));
            let traffic = gateway_context.traffic();
            let extra = Some({
                let probe = probe.clone();
                let peer_links = peer_links.clone();
                Arc::new(move || {
                    let mut out = traffic.render();
                    out.push_str(&peer_links.render());
                    out.push_str(
                        &aip_gateway
                            .as_ref()
                            .map(|g| g.render_metrics())
                            .unwrap_or_default(),
                    );
                    if let Some(p) = &probe {
                        out.push_str(&cluster::render_metrics(p));
                    }
                    out
                }) as metrics::Extra
            });
            app.merge(metrics::routes_with(
                ctx.router.clone(),
                metrics_auth,
                extra,
            ))
        } else {
            app
        };
        let app = origins::guard(app, &config);
        let mut http_tasks = link_tasks;
        let aip = aip.map(|(gateway, addr, tcp, tls)| {
            http_tasks.push(tokio::spawn(crate::gateway::aip::listener::serve(
                Arc::clone(&gateway),
                tcp,
                tls,
                shutdown_rx.clone(),
            )));
            (gateway, addr)
        });
        #[cfg(feature = "cluster")]
        if let Some((client, stream)) = relays {
            http_tasks.push(host_relays(
                client,
                stream,
                &ctx,
                &options,
                probe.clone(),
                cluster::roll_call_every(&config),
                shutdown_rx.clone(),
            ));
        }
        #[cfg(not(feature = "cluster"))]
        let _ = relays;
        for tcp in listeners {
            http_tasks.push(tokio::spawn(listener::serve(
                tcp,
                app.clone(),
                listener_settings.clone(),
                shutdown_rx.clone(),
            )));
        }
        Ok(Self {
            addrs,
            drain_timeout: options.drain_timeout,
            ctx,
            options,
            router_task,
            http_tasks,
            supervisor,
            shutdown,
            store: store_handle,
            gateways: gateway_context,
            aip,
        })
    }

    /// The AIP gateway's bound address, when it is on (`[aip] listen`, `--aip-listen`).
    pub fn aip_addr(&self) -> Option<SocketAddr> {
        self.aip.as_ref().map(|(_, a)| *a)
    }

    /// The AIP gateway, when it is on.
    pub fn aip(&self) -> Option<&Arc<crate::gateway::aip::AipGateway>> {
        self.aip.as_ref().map(|(g, _)| g)
    }

    /// The MAMP and IM gateways' shared state: settings, tables (`sizes()`), sessions.
    pub fn gateways(&self) -> &Arc<crate::gateway::GatewayContext> {
        &self.gateways
    }

    /// The bound addresses (useful with port 0).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// A handle to the router.
    pub fn router(&self) -> &RouterHandle {
        &self.ctx.router
    }

    /// What transports need to serve connections on this server.
    pub fn context(&self) -> &TransportContext {
        &self.ctx
    }

    /// The process supervisor.
    pub fn supervisor(&self) -> &Supervisor {
        &self.supervisor
    }

    /// Opens an in-process connection (no socket) to this server's router (origin
    /// `InProcess`: admitted without credentials when `auth.trusted_transports` says so).
    pub fn connect_in_process(&self) -> InProcessLink {
        let options = ConnectionOptions {
            origin: ConnOrigin::InProcess,
            ..self.options.clone()
        };
        in_process::connect(&self.ctx, options)
    }

    /// Serves one NDJSON connection over a pair of byte streams until EOF or shutdown (what
    /// `map-router stdio` does with its own stdin/stdout; origin `Stdio`).
    pub async fn serve_io<R, W>(&self, reader: R, writer: W)
    where
        R: AsyncRead + Unpin + Send,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let options = ConnectionOptions {
            origin: ConnOrigin::Stdio,
            ..self.options.clone()
        };
        stdio::serve_io(&self.ctx, reader, writer, options).await;
    }

    /// Drains and stops: no new connections, every connection flushes and closes (code 1001 on
    /// WebSocket), then the router stops.
    pub async fn shutdown(self) {
        let Self {
            ctx,
            router_task,
            http_tasks,
            supervisor,
            shutdown,
            drain_timeout,
            store,
            ..
        } = self;
        // Connections close first (a supervised child sees EOF on its stdin, its cue to exit),
        // then children are stopped and reaped while the router can still record how they
        // ended. The router learns first, so that those disconnects say `shutdown`.
        let _ = tokio::time::timeout(drain_timeout, ctx.router.with(Router::begin_shutdown)).await;
        let _ = shutdown.send(true);
        supervisor.shutdown().await;
        for task in http_tasks {
            let _ = tokio::time::timeout(drain_timeout, task).await;
        }
        let TransportContext {
            router,
            connections,
            ..
        } = ctx;
        // Every connection task is tracked; the gateways' clones of the context are not.
        connections.close();
        if tokio::time::timeout(drain_timeout + Duration::from_secs(1), connections.wait())
            .await
            .is_err()
        {
            tracing::warn!("some connections did not close within the drain timeout");
        }
        let _ = router.send(Command::Shutdown).await;
        drop(router);
        let _ = tokio::time::timeout(drain_timeout, router_task).await;
        if let Some(store) = store {
            match tokio::time::timeout(STORE_CLOSE_TIMEOUT, store.close()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "event store did not close cleanly"),
                Err(_) => {
                    tracing::error!("event store did not close within {STORE_CLOSE_TIMEOUT:?}")
                }
            }
        }
    }
}

/// Hosts the standbys' relay sessions (`server::relay`) until shutdown: each an in-process
/// session admitted as the principal the standby authenticated (with authentication off, an
/// ordinary remote session: never a trusted transport's).
#[cfg(feature = "cluster")]
fn host_relays(
    client: async_nats::Client,
    stream: String,
    ctx: &TransportContext,
    options: &ConnectionOptions,
    probe: Option<cluster::Probe>,
    roll_call: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let open: relay::OpenSession = {
        let ctx = ctx.clone();
        // The standby applied the request rates to the client's own connection (its peer
        // address, its principal): counted again here (without the loopback exemption: an
        // in-process session has no peer address), callers the standby let through would be
        // throttled.
        let options = ConnectionOptions {
            rate: crate::router::rate::RateLimits::unlimited(),
            ..options.clone()
        };
        Arc::new(move |principal, node| {
            // The session's agents are on the standby's node (their presence says so).
            let options = ConnectionOptions {
                node: Some(node.into()),
                ..options.clone()
            };
            match principal {
                Some(p) => connect_as(&ctx, &options, p),
                None => in_process::connect(
                    &ctx,
                    ConnectionOptions {
                        origin: ConnOrigin::Remote,
                        ..options
                    },
                ),
            }
        })
    };
    let nodes: relay::LiveNodes = Arc::new(move || {
        probe
            .as_ref()
            .map(|p| {
                p().nodes
                    .iter()
                    .map(|n| (relay::token(&n.name), n.incarnation.clone()))
                    .collect()
            })
            .unwrap_or_default()
    });
    tokio::spawn(async move {
        tokio::select! {
            () = relay::host(client, stream, open, nodes, roll_call) => {}
            _ = shutdown.wait_for(|s| *s) => {}
        }
    })
}

impl in_process::InProcessLinks for Server {
    fn connect_in_process(&self) -> InProcessLink {
        Server::connect_in_process(self)
    }

    fn connect_as(&self, principal: Principal) -> InProcessLink {
        connect_as(&self.ctx, &self.options, principal)
    }
}
