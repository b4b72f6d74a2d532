//! Server configuration: defaults, the TOML file, and the mapping to router and connection
//! settings. Command-line flags and environment variables are applied on top by `main.rs`.
//!
//! Every limit has a named default here, with the reason for its value.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::process::SupervisorSettings;
use crate::protocol::jsonrpc::{DEFAULT_MAX_DEPTH, MAX_DEPTH_LIMIT};
use crate::protocol::methods::agents::{
    CommandSpec, RegisterParams, RestartMode, RestartPolicy, SpawnParams,
};
use crate::router::config::Delivery;
use crate::router::dispatch::DEFAULT_MAX_BATCH;
use crate::router::events::log::Retention;
use crate::router::permissions::Policy;
use crate::router::quotas;
use crate::router::quotas::Quotas;
use crate::router::rate;
use crate::router::rate::Rate;
use crate::router::rate::RateLimits;
use crate::router::Durability;
use crate::router::RouterConfig;
use crate::router::DEFAULT_COMMIT_TIMEOUT;
use crate::router::DEFAULT_LOG_BYTES;
use crate::router::DEFAULT_LOG_EVENTS;
use crate::router::DEFAULT_OUTBOX_FRAMES;
use crate::router::DEFAULT_PENDING_MESSAGES;
use crate::store::sqlite::{self, SqliteOptions, Synchronous};
use crate::transport::admission::{self, Admission};
use crate::transport::connection::ConnectionOptions;

/// Default listen address: loopback only, so a fresh install exposes nothing.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:4500";
/// Default largest text frame: 1 MiB, far above any MAP message we have seen, small enough that
/// a hostile peer cannot make us buffer much.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 1 << 20;
/// Default WebSocket ping interval.
pub const DEFAULT_PING_INTERVAL_MS: u64 = 20_000;
/// Default idle timeout: three missed pings.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;
/// Default time a closing connection gets to flush, and the server to drain on shutdown.
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 5_000;
/// Default resume window (ms).
pub const DEFAULT_RESUME_WINDOW_MS: u64 = 60_000;
/// Default time a new connection has to complete `map/connect`: the SDK's own open timeout
/// (10 s); a peer that has not said who it is by then is holding a connection for nothing.
pub const DEFAULT_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// Default time for a TLS handshake and for each HTTP request's headers (including the
/// WebSocket upgrade request): generous for slow networks, short enough that a slow-loris
/// peer trickling header bytes holds its connection slot only briefly.
pub const DEFAULT_HEADER_TIMEOUT_MS: u64 = 10_000;
/// The data directory `map-router serve` uses when neither the config file nor `--data-dir`
/// names one (relative to the working directory). The library default is ephemeral.
pub const DEFAULT_DATA_DIR: &str = "map-router-data";

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Addresses to listen on (WebSocket at `/` and `/map`).
    pub listen: Vec<SocketAddr>,
    /// Limits.
    pub limits: Limits,
    /// TLS for the listeners (`wss://`, `https://`).
    pub tls: TlsSettings,
    /// WebSocket keep-alive.
    pub websocket: WebSocketSettings,
    /// Router behaviour.
    pub router: RouterSettings,
    /// Event log.
    pub events: EventSettings,
    /// Durable storage of the event log.
    pub storage: StorageSettings,
    /// Cluster mode: the event log in a NATS JetStream stream (`[cluster]`, feature `cluster`).
    pub cluster: ClusterSettings,
    /// Who may see and do what (exposure, capability overrides, agent rules).
    pub permissions: Policy,
    /// Timeouts for supervised processes.
    pub supervisor: SupervisorConfig,
    /// Agent processes to start with the router (`[[agents]]`).
    pub agents: Vec<AgentConfig>,
    /// Authentication (`[auth]`; off by default).
    pub auth: crate::auth::AuthSettings,
    /// Prometheus metrics at `GET /metrics` (`[metrics]`).
    pub metrics: MetricsSettings,
    /// The A2A gateway (`[a2a]`, docs/a2a.md).
    pub a2a: A2aSettings,
    /// The MAMP and IM gateways (`[gateways]`, docs/gateways.md; on by default).
    pub gateways: crate::gateway::GatewaySettings,
    /// The AIP gateway over gRPC (`[aip]`, docs/aip.md; off unless `listen` is set).
    pub aip: crate::gateway::aip::AipSettings,
    /// Traces out over OTLP/HTTP (`[telemetry]`, docs/traces.md; off unless an endpoint is set
    /// here or in `OTEL_EXPORTER_OTLP_*`).
    pub telemetry: crate::server::telemetry::TelemetrySettings,
    /// Federation with other MAP systems (`[federation]`, docs/federation.md).
    pub federation: FederationSettings,
}

/// `[federation]`: this system's id and the peers whose gateways may link to it
/// (docs/federation.md, "Receiving routed messages").
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FederationSettings {
    /// This system's id (default: the host name; `--system-id` on `serve`).
    pub system_id: Option<String>,
    /// Hop limit when an envelope sets none (default 10, the SDK's; at most 64).
    pub max_hops: Option<u64>,
    /// Accept envelopes only from these source systems (default: any).
    pub allowed_sources: Option<Vec<String>>,
    /// Accept envelopes only for these target systems (default: any).
    pub allowed_targets: Option<Vec<String>>,
    /// The peer systems (`[[federation.peer]]`).
    pub peer: Vec<FederationPeer>,
    /// The endpoint this system announces to the peers it dials (default: `ws://` and the
    /// first listen address).
    pub endpoint: Option<String>,
    /// Systems reached through a peer that dials them in turn: `{ <target> = "<peer>" }`.
    pub routes: std::collections::BTreeMap<String, String>,
    /// Most messages waiting for one peer while it is unreachable (default 1000); the rest
    /// fail, reported to their senders.
    pub max_queued: Option<usize>,
    /// How long a message passing through waits for the next system's answer before the
    /// previous system is told it was routed (ms, default 5000).
    pub forward_wait_ms: Option<u64>,
}

/// `[[federation.peer]]`: a peer system and the principal its inbound link authenticates as.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FederationPeer {
    /// The peer's system id.
    pub system_id: String,
    /// The auth principal (API key name or JWT `sub`) a link for that system must have
    /// connected as; a gateway of any other principal claiming the id is refused.
    pub principal: String,
    /// Where this router dials the peer (`ws://` or `wss://` URL of its MAP endpoint): set,
    /// messages for the peer's agents wait here until the link takes them
    /// (`gateway::federation`). Unset, the peer only links in.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The environment variable holding the API key this router presents to the peer.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The environment variable holding a bearer token (JWT) to present instead.
    #[serde(default)]
    pub token_env: Option<String>,
}

impl FederationSettings {
    /// This system's id: the configured one, else the host name, else `map-router`.
    pub fn system_id(&self) -> String {
        self.system_id.clone().unwrap_or_else(host_name)
    }

    fn validate(&self) -> Result<(), String> {
        use crate::protocol::methods::federation::{check_system_id, MAX_HOPS_LIMIT};
        let ids = self
            .system_id
            .iter()
            .chain(self.allowed_sources.iter().flatten())
            .chain(self.allowed_targets.iter().flatten())
            .chain(self.peer.iter().map(|p| &p.system_id));
        for id in ids {
            check_system_id(id).map_err(|e| format!("federation: {id:?}: {e}"))?;
        }
        if self.max_hops.is_some_and(|h| h == 0 || h > MAX_HOPS_LIMIT) {
            return Err(format!(
                "federation.max_hops must be between 1 and {MAX_HOPS_LIMIT}"
            ));
        }
        if let Some(p) = self.peer.iter().find(|p| p.principal.is_empty()) {
            return Err(format!(
                "federation.peer {}: principal must not be empty",
                p.system_id
            ));
        }
        for p in &self.peer {
            if let Some(e) = &p.endpoint {
                if !(e.starts_with("ws://") || e.starts_with("wss://")) {
                    return Err(format!(
                        "federation.peer {}: endpoint must be a ws:// or wss:// URL",
                        p.system_id
                    ));
                }
            }
        }
        for (target, via) in &self.routes {
            check_system_id(target).map_err(|e| format!("federation.routes: {target:?}: {e}"))?;
            if !self
                .peer
                .iter()
                .any(|p| p.system_id == *via && p.endpoint.is_some())
            {
                return Err(format!(
                    "federation.routes: {target} goes through {via}, which is no peer with an endpoint"
                ));
            }
        }
        if self.max_queued == Some(0) {
            return Err("federation.max_queued must be at least 1".into());
        }
        Ok(())
    }

    /// The links this router dials (`gateway::federation`), with their credentials read from
    /// the environment.
    ///
    /// # Errors
    /// A credential's environment variable is not set.
    pub fn peer_links(
        &self,
        first_listen: Option<std::net::SocketAddr>,
    ) -> Result<Vec<crate::gateway::federation::PeerLink>, String> {
        let me = self.system_id();
        let announce = self
            .endpoint
            .clone()
            .unwrap_or_else(|| first_listen.map_or_else(String::new, |a| format!("ws://{a}/")));
        self.peer
            .iter()
            .filter_map(|p| p.endpoint.as_ref().map(|e| (p, e)))
            .map(|(p, endpoint)| {
                let read = |var: &String| {
                    std::env::var(var).map_err(|_| {
                        format!(
                            "federation.peer {}: the environment variable {var} is not set",
                            p.system_id
                        )
                    })
                };
                let credential = match (&p.api_key_env, &p.token_env) {
                    (Some(v), _) => Some(("api-key", read(v)?)),
                    (None, Some(v)) => Some(("bearer", read(v)?)),
                    (None, None) => None,
                };
                Ok(crate::gateway::federation::PeerLink {
                    system: p.system_id.clone(),
                    endpoint: endpoint.clone(),
                    me: me.clone(),
                    announce: announce.clone(),
                    credential,
                })
            })
            .collect()
    }

    /// What the router core needs.
    pub fn router_federation(&self) -> crate::router::config::Federation {
        crate::router::config::Federation {
            rules: crate::protocol::methods::federation::RoutingRules {
                system_id: self.system_id(),
                max_hops: self.max_hops,
                allowed_sources: self.allowed_sources.clone(),
                allowed_targets: self.allowed_targets.clone(),
            },
            peers: self
                .peer
                .iter()
                .map(|p| (p.system_id.clone(), p.principal.clone()))
                .collect(),
            outbound: self
                .peer
                .iter()
                .filter(|p| p.endpoint.is_some())
                .map(|p| p.system_id.clone())
                .collect(),
            routes: self
                .routes
                .iter()
                .map(|(t, v)| (t.clone(), v.clone()))
                .collect(),
            max_queued: self
                .max_queued
                .unwrap_or(crate::router::config::DEFAULT_FEDERATION_QUEUE),
            forward_wait: std::time::Duration::from_millis(self.forward_wait_ms.unwrap_or(5000)),
        }
    }
}

/// The host name (the kernel's, else `/etc/hostname`, else `$HOSTNAME`), or `map-router` when
/// there is none usable as a system id.
fn host_name() -> String {
    let name = ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|f| std::fs::read_to_string(f).ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|n| n.trim().to_owned())
        .unwrap_or_default();
    if crate::protocol::methods::federation::check_system_id(&name).is_ok() {
        name
    } else {
        "map-router".into()
    }
}

/// `[a2a]`: the A2A gateway (docs/a2a.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct A2aSettings {
    /// Serve the A2A routes (default true). Off: `/.well-known/agent-card.json`, `/a2a/...` are
    /// absent (404).
    pub enabled: bool,
    /// Largest JSON-RPC request body, in bytes (default 4 MiB; larger is refused with 413).
    pub max_body_bytes: usize,
    /// Where push-notification webhooks may be, as `scheme://host[:port][/path]` entries
    /// matched on parsed, normalised URLs (`gateway::egress`), e.g.
    /// `["https://hooks.example.com/a2a/"]` (default none: push notifications are off, and the
    /// cards say `pushNotifications: false`). The router POSTs to these URLs on callers' behalf:
    /// list only endpoints meant to receive them.
    pub push_allow: Vec<String>,
    /// Where remote A2A agents registered by request (`POST /a2a/remote`) may be: their card
    /// URLs and the endpoints their cards name, in the form of `push_allow` (default none:
    /// registering by request is off).
    pub remote_allow: Vec<String>,
    /// Remote A2A agents to register as MAP agents at start (`[[a2a.remote]]`: `card_url`,
    /// `name?`, `token?`; docs/a2a.md). Their card URL's origin is allowed for them.
    pub remote: Vec<crate::gateway::a2a::remote::RemoteSpec>,
    /// A2A requests per second per caller (principal, or IP without authentication); 0:
    /// unlimited.
    pub rate_per_caller: u32,
    /// A2A requests a caller may send at once.
    pub burst_per_caller: u32,
    /// Remote agents one principal may register by request.
    pub max_remotes_per_principal: usize,
    /// Push-notification configs one principal may hold (over all its tasks).
    pub max_push_configs_per_principal: usize,
    /// The agent (id, or unique name) whose card the router serves at
    /// `/.well-known/agent-card.json` (default none: the router's own card, whose skills are
    /// the agents). For clients that know only a host, such as the A2A conformance kit:
    /// the card's interface is that agent's endpoint, where new tasks start.
    pub default_agent: Option<String>,
}

impl Default for A2aSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            max_body_bytes: crate::gateway::a2a::DEFAULT_MAX_BODY_BYTES,
            push_allow: Vec::new(),
            remote_allow: Vec::new(),
            remote: Vec::new(),
            rate_per_caller: crate::gateway::a2a::limits::DEFAULT_RATE_PER_CALLER,
            burst_per_caller: crate::gateway::a2a::limits::DEFAULT_BURST_PER_CALLER,
            max_remotes_per_principal:
                crate::gateway::a2a::limits::DEFAULT_MAX_REMOTES_PER_PRINCIPAL,
            default_agent: None,
            max_push_configs_per_principal:
                crate::gateway::a2a::limits::DEFAULT_MAX_PUSH_CONFIGS_PER_PRINCIPAL,
        }
    }
}

impl A2aSettings {
    /// The gateway's limits, with MAP's own from `limits` (what the router refuses) and the
    /// body deadline of `/map/rpc`.
    pub fn limits(&self, limits: &Limits) -> crate::gateway::a2a::limits::Limits {
        crate::gateway::a2a::limits::Limits {
            rate: (self.rate_per_caller > 0)
                .then_some((self.rate_per_caller, self.burst_per_caller)),
            exempt_loopback: limits.exempt_loopback,
            body_timeout: match limits.header_timeout_ms {
                0 => crate::gateway::guard::DEFAULT_BODY_TIMEOUT,
                ms => Duration::from_millis(ms),
            },
            max_frame_bytes: limits.max_frame_bytes,
            max_depth: limits.max_depth,
            max_payload_bytes: limits.max_payload_bytes,
            max_remotes_per_principal: self.max_remotes_per_principal,
            max_push_configs_per_principal: self.max_push_configs_per_principal,
        }
    }
}

/// `[metrics]`: Prometheus metrics at `GET /metrics` (docs/metrics.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSettings {
    /// Collect metrics and serve `GET /metrics` (default true). Off: nothing is measured and
    /// the route is absent (404).
    pub enabled: bool,
    /// Serve `GET /metrics` without credentials even when `[auth]` is on (default false: it
    /// then wants `Authorization: Bearer <API key or JWT>`, like a MAP session would).
    pub public: bool,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            public: false,
        }
    }
}

/// `[supervisor]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SupervisorConfig {
    /// Graceful stop request → SIGTERM, in ms.
    pub stop_timeout_ms: u64,
    /// SIGTERM → SIGKILL, in ms.
    pub kill_timeout_ms: u64,
    /// Launch → registration, in ms; a child that has not registered by then fails its spawn.
    pub handshake_timeout_ms: u64,
    /// Each escalation step when the router shuts down, in ms.
    pub shutdown_timeout_ms: u64,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        let d = SupervisorSettings::default();
        Self {
            stop_timeout_ms: d.stop_timeout.as_millis() as u64,
            kill_timeout_ms: d.kill_timeout.as_millis() as u64,
            handshake_timeout_ms: d.handshake_timeout.as_millis() as u64,
            shutdown_timeout_ms: d.shutdown_timeout.as_millis() as u64,
        }
    }
}

/// One `[[agents]]` entry: a process the router launches at start-up and supervises.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Agent id (generated when absent).
    #[serde(default)]
    pub id: Option<String>,
    /// Agent name.
    #[serde(default)]
    pub name: Option<String>,
    /// Agent role.
    #[serde(default)]
    pub role: Option<String>,
    /// Executable.
    pub program: String,
    /// Arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Working directory.
    #[serde(default)]
    pub cwd: Option<String>,
    /// `never` (default), `on-failure` or `always`.
    #[serde(default)]
    pub restart: Option<RestartMode>,
    /// Restart limit (default 5).
    #[serde(default)]
    pub max_restarts: Option<u32>,
    /// First restart backoff in ms (default 500).
    #[serde(default)]
    pub backoff_ms: Option<u64>,
}

impl AgentConfig {
    /// The spawn request this entry stands for.
    pub fn spawn_params(&self) -> SpawnParams {
        SpawnParams {
            register: RegisterParams {
                agent_id: self.id.as_deref().map(Into::into),
                name: self.name.clone(),
                role: self.role.clone(),
                ..RegisterParams::default()
            },
            command: Some(CommandSpec {
                program: self.program.clone(),
                args: self.args.clone(),
                env: self.env.clone(),
                cwd: self.cwd.clone(),
                restart: Some(RestartPolicy {
                    mode: self.restart.unwrap_or_default(),
                    max_restarts: self.max_restarts,
                    backoff_ms: self.backoff_ms,
                    max_backoff_ms: None,
                }),
                ..CommandSpec::default()
            }),
            ..SpawnParams::default()
        }
    }
}

/// `[limits]`. Every count or rate can be 0 to disable that limit (except the frame, batch and
/// depth limits, which always apply).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest text frame in bytes.
    pub max_frame_bytes: usize,
    /// Largest batch.
    pub max_batch: usize,
    /// Deepest JSON nesting (objects and arrays) in one frame; at most 128.
    pub max_depth: usize,
    /// Largest serialized `map/send` payload (and `map/inject` content) in bytes.
    pub max_payload_bytes: usize,
    /// Subscriptions one session may hold.
    pub max_subscriptions_per_session: usize,
    /// Agents one session may own.
    pub max_agents_per_session: usize,
    /// Sessions attached at once per authenticated principal.
    pub max_sessions_per_principal: usize,
    /// Tasks one principal (else participant) creates.
    pub max_tasks_per_principal: usize,
    /// Conversations one principal (else participant) creates.
    pub max_conversations_per_principal: usize,
    /// Turns in one conversation.
    pub max_turns_per_conversation: usize,
    /// Checkpoints one principal (else participant) reports (distinct ids).
    pub max_checkpoints_per_principal: usize,
    /// Network connections at once (TCP connections and HTTP sessions).
    pub max_connections: usize,
    /// Network connections at once from one IP address.
    pub max_connections_per_ip: usize,
    /// Requests per second per connection (sustained).
    pub rate_per_connection: u32,
    /// Requests a connection may send at once.
    pub burst_per_connection: u32,
    /// Requests per second per principal (else per remote IP address).
    pub rate_per_principal: u32,
    /// Requests a principal (or address) may send at once.
    pub burst_per_principal: u32,
    /// A connection without a MAP session this long is closed, in ms.
    pub handshake_timeout_ms: u64,
    /// TLS handshake and HTTP request headers must arrive within this, in ms.
    pub header_timeout_ms: u64,
    /// Loopback peers (local processes: spawned agents, local dashboards, benchmarks) skip the
    /// per-address limits (`max_connections_per_ip`, the per-address rate bucket) and the
    /// per-connection rate; every peer on one host shares 127.0.0.1, so those limits cannot
    /// tell them apart. `max_connections`, quotas and per-principal rates still apply.
    pub exempt_loopback: bool,
    /// Browser origins (`scheme://host[:port]`) allowed to open WebSockets and send requests
    /// besides the router's own (the `Host` a request was sent to); `"*"` allows every origin.
    /// A request with any other `Origin` header is refused with 403 before anything else, so a
    /// page on another site cannot reach the router through its visitors' browsers. Requests
    /// without `Origin` (every non-browser client) are not affected.
    pub allowed_origins: Vec<String>,
}

/// `[tls]`: both or neither.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM certificate chain.
    pub cert: Option<PathBuf>,
    /// PEM private key.
    pub key: Option<PathBuf>,
}

impl TlsSettings {
    /// The files, when TLS is on.
    pub fn files(&self) -> Option<crate::server::tls::TlsFiles> {
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some(crate::server::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => None,
        }
    }
}

/// `[websocket]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebSocketSettings {
    /// Ping interval in ms (0 disables pings).
    pub ping_interval_ms: u64,
    /// Close connections silent for this long, in ms (0 disables).
    pub idle_timeout_ms: u64,
    /// Time a closing connection gets to flush, in ms.
    pub drain_timeout_ms: u64,
}

/// `[router]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterSettings {
    /// Name in `systemInfo`.
    pub name: String,
    /// Frames per connection outbox.
    pub outbox_frames: usize,
    /// `map/message` frames queued per connection beyond its outbox.
    pub pending_messages: usize,
    /// Resume window and orphan grace period, in ms.
    pub resume_window_ms: u64,
    /// Unknown explicit recipients are errors (true) or skipped (false).
    pub strict_recipients: bool,
}

/// `[events]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventSettings {
    /// Events kept in memory.
    pub retention_events: usize,
    /// Bytes of events kept in memory (about).
    pub retention_bytes: usize,
}

/// `[storage]`: where and how durably the event log is kept.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageSettings {
    /// Directory holding the SQLite event store. `None`: events live in memory only.
    pub data_dir: Option<PathBuf>,
    /// Keep events in memory only, even when `data_dir` is set or the binary would default one.
    pub ephemeral: bool,
    /// `durable` (default): a state-changing call is answered after its events are committed.
    /// `async`: answered at once, committed right after.
    pub durability: Durability,
    /// `full` (default): committed events survive power loss. `normal`: they survive a crash of
    /// the router process; the last commits before a power loss may be lost.
    pub synchronous: Synchronous,
    /// Events kept on disk.
    pub max_events: u64,
    /// Bytes of events kept on disk (about).
    pub max_bytes: u64,
    /// Events older than this many seconds are deleted from disk (0: no age limit).
    pub max_age_secs: u64,
    /// How long the writer waits for more events before committing, in ms (0: commit what is
    /// queued at once; a burst still shares commits).
    pub group_commit_delay_ms: u64,
    /// How long a durable call waits for its commit before it fails with 4000, in ms.
    pub commit_timeout_ms: u64,
    /// While more events than this wait for their commit (a stalled disk, NATS away in
    /// cluster mode), calls are refused at once with 4000 instead of queueing more (0: no
    /// bound). What is queued stays queued and is committed when the store is back.
    pub max_uncommitted_events: u64,
    /// `committed` (default): subscribers are shown events once committed (read-committed).
    /// `live`: shown at once; a crash can erase events a subscriber saw.
    pub delivery: Delivery,
    /// Tasks, checkpoints and conversations (each) the router caches in memory; the store
    /// keeps them all and the router pages in what is used (at least 1).
    pub cache_items: usize,
}

/// `[cluster]`: keep the event log in a NATS JetStream stream instead of SQLite
/// (docs/cluster-notes.md). Off unless `url` is set (or `serve --cluster URL`). Needs a binary
/// built with the `cluster` feature (the default). In this version one live node writes to a
/// stream; a second one pointed at it refuses to start.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSettings {
    /// The NATS server, `nats://HOST:PORT`. `None`: not in cluster mode.
    pub url: Option<String>,
    /// The JetStream stream holding the log (created when missing).
    pub stream: String,
    /// Subject prefix of the log's messages (`<prefix>.<kind>`).
    pub subject_prefix: String,
    /// The stream's replicas (3 on a three-server NATS cluster): set when the stream is
    /// created, and applied to an existing stream by the node that opens it as the writer.
    pub replicas: usize,
    /// This node's name (default: the router's name).
    pub node: Option<String>,
    /// Stream retention: events (0: unlimited, the default, because the kept tables (tasks,
    /// mail, checkpoints) are folded from the retained stream). Like `max_bytes`,
    /// `max_age_secs` and `replicas`, set on the stream by the node that opens it as the
    /// writer (a stream created with other limits is updated, and the change logged).
    pub max_events: u64,
    /// Stream retention: bytes (0: unlimited).
    pub max_bytes: u64,
    /// Stream retention: age in seconds (0: unlimited).
    pub max_age_secs: u64,
    /// The bound on every NATS request (publish ack, read), in ms.
    pub request_timeout_ms: u64,
    /// The bound on connecting at startup, in ms.
    pub connect_timeout_ms: u64,
    /// TLS to NATS: a PEM file of the root certificates to trust; set, TLS is required.
    pub tls_ca: Option<PathBuf>,
    /// TLS client certificate (PEM), for a NATS server that verifies clients (with `tls_key`).
    pub tls_cert: Option<PathBuf>,
    /// The key of `tls_cert` (PEM).
    pub tls_key: Option<PathBuf>,
    /// The NATS user (with `password_file`).
    pub user: Option<String>,
    /// A file holding the NATS user's password (its first line).
    pub password_file: Option<PathBuf>,
    /// A file holding a NATS token (its first line); not with `user`.
    pub token_file: Option<PathBuf>,
    /// A file holding an NKey seed (`SU...`, its first line), for a NATS user known by its
    /// public NKey; alone.
    pub nkey_file: Option<PathBuf>,
    /// A NATS `.creds` file (a user JWT and its seed, NATS operator mode); alone.
    pub creds_file: Option<PathBuf>,
    /// When another live node writes the stream: wait, answering 503 "standby", and take over
    /// when it stops (`true`), or refuse to start (`false`, the default).
    pub standby: bool,
    /// How often a standby asks whether the writer is still alive, in ms.
    pub takeover_poll_ms: u64,
    /// How often every node asks who is in the cluster (the roll call), in ms. A node missing
    /// from two roll calls in a row is taken for dead by the live node (its relay sessions
    /// end, its agents are orphaned or unregistered): within about 3 roll calls of its death.
    pub roll_call_ms: u64,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            url: None,
            stream: "MAP_EVENTS".into(),
            subject_prefix: "map.ev".into(),
            replicas: 1,
            node: None,
            max_events: 0,
            max_bytes: 0,
            max_age_secs: 0,
            request_timeout_ms: 2_000,
            connect_timeout_ms: 5_000,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            user: None,
            password_file: None,
            token_file: None,
            nkey_file: None,
            creds_file: None,
            standby: false,
            takeover_poll_ms: 250,
            roll_call_ms: 2_000,
        }
    }
}

#[cfg(feature = "cluster")]
impl ClusterSettings {
    /// The JetStream store to open, in cluster mode; `router_name` is the default node name.
    /// Reads the credentials file the section names.
    ///
    /// # Errors
    /// A credentials file cannot be read, is empty or is not what it should be, or more than
    /// one way to authenticate is set.
    pub fn jetstream_options(
        &self,
        router_name: &str,
    ) -> Option<std::io::Result<crate::store::jetstream::JetStreamOptions>> {
        let url = self.url.as_ref()?;
        Some(self.credentials().map(|credentials| {
            let mut o = self.options_without_credentials(url, router_name);
            o.credentials = credentials;
            o
        }))
    }

    /// The NATS credentials `user` + `password_file`, `token_file`, `nkey_file` or
    /// `creds_file` name (secrets read from their files, never from the configuration itself).
    fn credentials(&self) -> std::io::Result<crate::store::jetstream::NatsCredentials> {
        use crate::store::jetstream::NatsCredentials;
        let read = |path: &Path, what: &str| -> std::io::Result<String> {
            std::fs::read_to_string(path).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("[cluster] {what} {}: {e}", path.display()),
                )
            })
        };
        // A secret is its file's first line.
        let secret = |path: &Path, what: &str| -> std::io::Result<String> {
            let text = read(path, what)?;
            let line = text.lines().next().unwrap_or_default().trim().to_owned();
            if line.is_empty() {
                return Err(std::io::Error::other(format!(
                    "[cluster] {what} {} is empty",
                    path.display()
                )));
            }
            Ok(line)
        };
        let files = (&self.token_file, &self.nkey_file, &self.creds_file);
        match (&self.user, &self.password_file, files) {
            (None, None, (None, None, None)) => Ok(NatsCredentials::None),
            (None, None, (Some(token), None, None)) => {
                Ok(NatsCredentials::Token(secret(token, "token_file")?))
            }
            (Some(user), Some(password), (None, None, None)) => Ok(NatsCredentials::UserPassword(
                user.clone(),
                secret(password, "password_file")?,
            )),
            (None, None, (None, Some(seed), None)) => {
                Ok(NatsCredentials::NKey(secret(seed, "nkey_file")?))
            }
            (None, None, (None, None, Some(creds))) => {
                let text = read(creds, "creds_file")?;
                if !text.contains("BEGIN NATS USER JWT") || !text.contains("BEGIN USER NKEY SEED") {
                    return Err(std::io::Error::other(format!(
                        "[cluster] creds_file {} is not a NATS .creds file (a user JWT and its \
                         NKey seed)",
                        creds.display()
                    )));
                }
                Ok(NatsCredentials::Creds(text))
            }
            _ => Err(std::io::Error::other(
                "[cluster] takes one way to authenticate: user with password_file, or \
                 token_file, or nkey_file, or creds_file (or none)",
            )),
        }
    }

    fn options_without_credentials(
        &self,
        url: &str,
        router_name: &str,
    ) -> crate::store::jetstream::JetStreamOptions {
        let limit = |n: u64| (n > 0).then(|| i64::try_from(n).unwrap_or(i64::MAX));
        let mut o = crate::store::jetstream::JetStreamOptions::new(url);
        o.stream = self.stream.clone();
        o.subject_prefix = self.subject_prefix.clone();
        o.replicas = self.replicas.max(1);
        o.node = self.node.clone().unwrap_or_else(|| router_name.to_owned());
        o.max_events = limit(self.max_events);
        o.max_bytes = limit(self.max_bytes);
        o.max_age = (self.max_age_secs > 0).then(|| Duration::from_secs(self.max_age_secs));
        o.request_timeout = Duration::from_millis(self.request_timeout_ms.max(1));
        o.connect_timeout = Duration::from_millis(self.connect_timeout_ms.max(1));
        o.exclusive = true;
        o.tls_ca = self.tls_ca.clone();
        o.tls_client = self.tls_cert.clone().zip(self.tls_key.clone());
        o
    }
}

impl Default for StorageSettings {
    fn default() -> Self {
        Self {
            data_dir: None,
            ephemeral: false,
            durability: Durability::Durable,
            synchronous: Synchronous::Full,
            max_events: sqlite::DEFAULT_MAX_EVENTS,
            max_bytes: sqlite::DEFAULT_MAX_BYTES,
            max_age_secs: 0,
            group_commit_delay_ms: sqlite::DEFAULT_GROUP_COMMIT_DELAY.as_millis() as u64,
            commit_timeout_ms: DEFAULT_COMMIT_TIMEOUT.as_millis() as u64,
            max_uncommitted_events: crate::router::DEFAULT_MAX_UNCOMMITTED,
            delivery: Delivery::Committed,
            cache_items: crate::router::kept::DEFAULT_CACHE_ITEMS,
        }
    }
}

impl StorageSettings {
    /// The store to open, if the log is durable.
    pub fn sqlite_options(&self) -> Option<SqliteOptions> {
        if self.ephemeral {
            return None;
        }
        let dir = self.data_dir.as_ref()?;
        Some(SqliteOptions {
            synchronous: self.synchronous,
            group_commit_delay: Duration::from_millis(self.group_commit_delay_ms),
            max_events: self.max_events,
            max_bytes: self.max_bytes,
            max_age: (self.max_age_secs > 0).then(|| Duration::from_secs(self.max_age_secs)),
            ..SqliteOptions::new(dir)
        })
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: vec![DEFAULT_LISTEN.parse().expect("valid default address")],
            limits: Limits::default(),
            tls: TlsSettings::default(),
            websocket: WebSocketSettings::default(),
            router: RouterSettings::default(),
            events: EventSettings::default(),
            storage: StorageSettings::default(),
            cluster: ClusterSettings::default(),
            permissions: Policy::default(),
            supervisor: SupervisorConfig::default(),
            agents: Vec::new(),
            auth: crate::auth::AuthSettings::default(),
            metrics: MetricsSettings::default(),
            gateways: crate::gateway::GatewaySettings::default(),
            a2a: A2aSettings::default(),
            aip: crate::gateway::aip::AipSettings::default(),
            telemetry: crate::server::telemetry::TelemetrySettings::default(),
            federation: FederationSettings::default(),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_batch: DEFAULT_MAX_BATCH,
            max_depth: DEFAULT_MAX_DEPTH,
            max_payload_bytes: quotas::DEFAULT_MAX_PAYLOAD_BYTES,
            max_subscriptions_per_session: quotas::DEFAULT_MAX_SUBSCRIPTIONS_PER_SESSION,
            max_agents_per_session: quotas::DEFAULT_MAX_AGENTS_PER_SESSION,
            max_sessions_per_principal: quotas::DEFAULT_MAX_SESSIONS_PER_PRINCIPAL,
            max_tasks_per_principal: quotas::DEFAULT_MAX_TASKS_PER_PRINCIPAL,
            max_conversations_per_principal: quotas::DEFAULT_MAX_CONVERSATIONS_PER_PRINCIPAL,
            max_turns_per_conversation: quotas::DEFAULT_MAX_TURNS_PER_CONVERSATION,
            max_checkpoints_per_principal: quotas::DEFAULT_MAX_CHECKPOINTS_PER_PRINCIPAL,
            max_connections: admission::DEFAULT_MAX_CONNECTIONS,
            max_connections_per_ip: admission::DEFAULT_MAX_CONNECTIONS_PER_IP,
            rate_per_connection: rate::DEFAULT_CONNECTION_RATE.per_second,
            burst_per_connection: rate::DEFAULT_CONNECTION_RATE.burst,
            rate_per_principal: rate::DEFAULT_PRINCIPAL_RATE.per_second,
            burst_per_principal: rate::DEFAULT_PRINCIPAL_RATE.burst,
            handshake_timeout_ms: DEFAULT_HANDSHAKE_TIMEOUT_MS,
            header_timeout_ms: DEFAULT_HEADER_TIMEOUT_MS,
            exempt_loopback: true,
            allowed_origins: Vec::new(),
        }
    }
}

impl Default for WebSocketSettings {
    fn default() -> Self {
        Self {
            ping_interval_ms: DEFAULT_PING_INTERVAL_MS,
            idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
            drain_timeout_ms: DEFAULT_DRAIN_TIMEOUT_MS,
        }
    }
}

impl Default for RouterSettings {
    fn default() -> Self {
        Self {
            name: "map-router".into(),
            outbox_frames: DEFAULT_OUTBOX_FRAMES,
            pending_messages: DEFAULT_PENDING_MESSAGES,
            resume_window_ms: DEFAULT_RESUME_WINDOW_MS,
            strict_recipients: true,
        }
    }
}

impl Default for EventSettings {
    fn default() -> Self {
        Self {
            retention_events: DEFAULT_LOG_EVENTS,
            retention_bytes: DEFAULT_LOG_BYTES,
        }
    }
}

/// A configuration file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A value is out of range.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Reads a TOML file.
    ///
    /// # Errors
    /// Unreadable file, invalid TOML, unknown keys, or out-of-range values.
    ///
    /// Relative paths in the file (`[tls]` cert and key, `[storage] data_dir`, the
    /// `[auth.*]` key files, an `[[agents]]` `cwd`) are taken relative to the file's
    /// directory, so a config works from wherever the router is started. (Flags and
    /// environment variables stay relative to the working directory.)
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let mut config = Self::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            config.resolve_paths(dir);
        }
        Ok(config)
    }

    /// Makes every relative path of the file settings relative to `dir` instead.
    fn resolve_paths(&mut self, dir: &Path) {
        let rebase = |p: &mut Option<PathBuf>| {
            if let Some(path) = p.as_mut().filter(|p| p.is_relative()) {
                *path = dir.join(&*path);
            }
        };
        rebase(&mut self.tls.cert);
        rebase(&mut self.tls.key);
        rebase(&mut self.storage.data_dir);
        rebase(&mut self.auth.api_keys.file);
        rebase(&mut self.auth.jwt.secret_file);
        rebase(&mut self.auth.jwt.jwks_file);
        rebase(&mut self.cluster.tls_ca);
        rebase(&mut self.cluster.tls_cert);
        rebase(&mut self.cluster.tls_key);
        rebase(&mut self.cluster.password_file);
        rebase(&mut self.cluster.token_file);
        rebase(&mut self.cluster.nkey_file);
        rebase(&mut self.cluster.creds_file);
        for agent in &mut self.agents {
            if let Some(cwd) = agent.cwd.as_mut().filter(|c| Path::new(c).is_relative()) {
                *cwd = dir.join(&*cwd).to_string_lossy().into_owned();
            }
        }
    }

    /// Parses TOML text.
    ///
    /// # Errors
    /// Invalid TOML, unknown keys, or out-of-range values.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: "<text>".into(),
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges.
    ///
    /// # Errors
    /// The first value out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.into()));
        if self.limits.max_frame_bytes < 1024 {
            return bad("limits.max_frame_bytes must be at least 1024");
        }
        if self.limits.max_batch == 0 {
            return bad("limits.max_batch must be at least 1");
        }
        if !(2..=MAX_DEPTH_LIMIT).contains(&self.limits.max_depth) {
            return bad("limits.max_depth must be between 2 and 128");
        }
        if self.limits.header_timeout_ms == 0 {
            return bad("limits.header_timeout_ms must be at least 1");
        }
        if self.tls.cert.is_some() != self.tls.key.is_some() {
            return bad("tls needs both cert and key (or neither)");
        }
        if self.cluster.tls_cert.is_some() != self.cluster.tls_key.is_some() {
            return bad("cluster needs both tls_cert and tls_key (or neither)");
        }
        if !(100..=600_000).contains(&self.cluster.roll_call_ms) {
            return bad("cluster.roll_call_ms must be between 100 and 600000");
        }
        if self.cluster.url.is_some() && !cfg!(feature = "cluster") {
            return bad("[cluster] needs a binary built with the `cluster` feature");
        }
        if self.router.outbox_frames < 2 {
            return bad("router.outbox_frames must be at least 2");
        }
        if let Some(a) = self.agents.iter().find(|a| a.program.trim().is_empty()) {
            return Err(ConfigError::Invalid(format!(
                "agents: entry {} has an empty program",
                a.name.as_deref().or(a.id.as_deref()).unwrap_or("(unnamed)")
            )));
        }
        for remote in &self.a2a.remote {
            crate::gateway::a2a::remote::http::check_configured(&remote.card_url)
                .map_err(|e| ConfigError::Invalid(format!("a2a.remote: {e}")))?;
        }
        crate::gateway::egress::AllowList::parse(&self.a2a.push_allow)
            .map_err(|e| ConfigError::Invalid(format!("a2a.push_allow: {e}")))?;
        crate::gateway::egress::AllowList::parse(&self.a2a.remote_allow)
            .map_err(|e| ConfigError::Invalid(format!("a2a.remote_allow: {e}")))?;
        if self.events.retention_events == 0 || self.events.retention_bytes < 4096 {
            return bad("events.retention_events must be at least 1 and events.retention_bytes at least 4096");
        }
        if self.storage.max_events == 0 || self.storage.max_bytes < 4096 {
            return bad(
                "storage.max_events must be at least 1 and storage.max_bytes at least 4096",
            );
        }
        if self.storage.commit_timeout_ms == 0 {
            return bad("storage.commit_timeout_ms must be at least 1");
        }
        if self.storage.cache_items == 0 {
            return bad("storage.cache_items must be at least 1");
        }
        if self
            .storage
            .data_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return bad("storage.data_dir must not be empty (set storage.ephemeral = true to keep events in memory only)");
        }
        self.auth.validate().map_err(ConfigError::Invalid)?;
        self.gateways.validate().map_err(ConfigError::Invalid)?;
        self.aip.validate().map_err(ConfigError::Invalid)?;
        self.federation.validate().map_err(ConfigError::Invalid)?;
        Ok(())
    }

    /// Router settings.
    pub fn router_config(&self) -> RouterConfig {
        RouterConfig {
            name: self.router.name.clone(),
            outbox_frames: self.router.outbox_frames,
            pending_messages: self.router.pending_messages,
            retention: Retention {
                max_events: self.events.retention_events,
                max_bytes: self.events.retention_bytes,
            },
            resume_window: Duration::from_millis(self.router.resume_window_ms),
            strict_recipients: self.router.strict_recipients,
            durability: self.storage.durability,
            delivery: self.storage.delivery,
            commit_timeout: Duration::from_millis(self.storage.commit_timeout_ms),
            max_uncommitted: self.storage.max_uncommitted_events,
            quotas: Quotas {
                max_subscriptions_per_session: self.limits.max_subscriptions_per_session,
                max_agents_per_session: self.limits.max_agents_per_session,
                max_payload_bytes: self.limits.max_payload_bytes,
                max_sessions_per_principal: self.limits.max_sessions_per_principal,
                max_tasks_per_principal: self.limits.max_tasks_per_principal,
                max_conversations_per_principal: self.limits.max_conversations_per_principal,
                max_turns_per_conversation: self.limits.max_turns_per_conversation,
                max_checkpoints_per_principal: self.limits.max_checkpoints_per_principal,
            },
            cache_items: self.storage.cache_items,
            permissions: std::sync::Arc::new(self.permissions.clone()),
            reserved_ids: crate::gateway::reserved_ids(&self.gateways),
            reserved_task_meta: crate::gateway::RESERVED_TASK_META
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            node: self.cluster.url.as_ref().map(|_| {
                self.cluster
                    .node
                    .clone()
                    .unwrap_or_else(|| self.router.name.clone())
            }),
            saved_refresh: self.cluster.url.as_ref().and_then(|_| {
                let by_position = self.cluster.max_events > 0 || self.cluster.max_bytes > 0;
                let older_than = (self.cluster.max_age_secs > 0)
                    .then(|| Duration::from_secs(self.cluster.max_age_secs) / 2);
                (by_position || older_than.is_some()).then_some(
                    crate::router::config::SavedRefresh {
                        by_position,
                        older_than,
                    },
                )
            }),
            federation: self.federation.router_federation(),
            ..RouterConfig::default()
        }
    }

    /// Supervisor timeouts.
    pub fn supervisor_settings(&self) -> SupervisorSettings {
        let s = &self.supervisor;
        SupervisorSettings {
            stop_timeout: Duration::from_millis(s.stop_timeout_ms),
            kill_timeout: Duration::from_millis(s.kill_timeout_ms),
            handshake_timeout: Duration::from_millis(s.handshake_timeout_ms),
            shutdown_timeout: Duration::from_millis(s.shutdown_timeout_ms),
        }
    }

    /// The request-rate limits (a fresh set of buckets: call once per server).
    pub fn rate_limits(&self) -> std::sync::Arc<RateLimits> {
        let l = &self.limits;
        RateLimits::new(
            Some(Rate {
                per_second: l.rate_per_connection,
                burst: l.burst_per_connection,
            }),
            Some(Rate {
                per_second: l.rate_per_principal,
                burst: l.burst_per_principal,
            }),
            l.exempt_loopback,
        )
    }

    /// The network connection counters (fresh: call once per server).
    pub fn admission(&self) -> std::sync::Arc<Admission> {
        Admission::new(
            self.limits.max_connections,
            self.limits.max_connections_per_ip,
            self.limits.exempt_loopback,
        )
    }

    /// Deadline for TLS handshakes and HTTP request headers.
    pub fn header_timeout(&self) -> Duration {
        Duration::from_millis(self.limits.header_timeout_ms)
    }

    /// Per-connection settings (with a fresh set of rate buckets).
    pub fn connection_options(&self) -> ConnectionOptions {
        let ms = |v: u64| (v > 0).then(|| Duration::from_millis(v));
        ConnectionOptions {
            max_frame_bytes: self.limits.max_frame_bytes,
            max_batch: self.limits.max_batch,
            max_depth: self.limits.max_depth,
            handshake_timeout: ms(self.limits.handshake_timeout_ms),
            rate: self.rate_limits(),
            ping_interval: ms(self.websocket.ping_interval_ms),
            idle_timeout: ms(self.websocket.idle_timeout_ms),
            drain_timeout: Duration::from_millis(self.websocket.drain_timeout_ms),
            ..ConnectionOptions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_federation_section_reaches_the_router_and_bad_ids_are_refused() {
        let c = Config::from_toml(
            "[federation]\nsystem_id = \"beta\"\nmax_hops = 4\nallowed_sources = [\"alpha\"]\n\
             [[federation.peer]]\nsystem_id = \"alpha\"\nprincipal = \"alpha-gw\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        let f = c.router_config().federation;
        assert_eq!(f.rules.system_id, "beta");
        assert_eq!(f.rules.max_hops, Some(4));
        assert_eq!(f.rules.allowed_sources, Some(vec!["alpha".to_owned()]));
        assert_eq!(f.peers, [("alpha".to_owned(), "alpha-gw".to_owned())]);
        // Default: the host name (or map-router), a valid system id.
        let id = Config::default().federation.system_id();
        assert!(
            crate::protocol::methods::federation::check_system_id(&id).is_ok(),
            "{id}"
        );
        for bad in [
            "[federation]\nsystem_id = \"a:b\"\n",
            "[federation]\nmax_hops = 0\n",
            "[federation]\nallowed_targets = [\"\"]\n",
            "[[federation.peer]]\nsystem_id = \"alpha\"\nprincipal = \"\"\n",
        ] {
            let refused = Config::from_toml(bad).and_then(|c| c.validate());
            assert!(refused.is_err(), "{bad}");
        }
    }

    #[test]
    fn relative_paths_in_a_file_are_relative_to_its_directory() {
        let dir = std::env::temp_dir().join(format!("map-router-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("router.toml");
        std::fs::write(
            &file,
            "[tls]\ncert = \"tls/cert.pem\"\nkey = \"/abs/key.pem\"\n\
             [storage]\ndata_dir = \"data\"\n\
             [auth.api_keys]\nfile = \"keys\"\n\
             [auth.jwt]\nissuer = \"i\"\naudience = \"a\"\njwks_file = \"../jwks.json\"\n\
             [[agents]]\nprogram = \"python3\"\ncwd = \"agents\"\n\
             [[agents]]\nprogram = \"python3\"\n",
        )
        .unwrap();
        let c = Config::from_file(&file).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(c.tls.cert, Some(dir.join("tls/cert.pem")));
        assert_eq!(c.tls.key, Some(PathBuf::from("/abs/key.pem")));
        assert_eq!(c.storage.data_dir, Some(dir.join("data")));
        assert_eq!(c.auth.api_keys.file, Some(dir.join("keys")));
        assert_eq!(c.auth.jwt.jwks_file, Some(dir.join("../jwks.json")));
        assert_eq!(c.agents[0].cwd.as_deref(), dir.join("agents").to_str());
        // No cwd: the router's own working directory, as before.
        assert_eq!(c.agents[1].cwd, None);
        // Text that is not a file has no directory to be relative to.
        let t = Config::from_toml("[storage]\ndata_dir = \"data\"\n").unwrap();
        assert_eq!(t.storage.data_dir, Some(PathBuf::from("data")));
    }

    #[test]
    fn defaults_are_valid_and_loopback() {
        let c = Config::default();
        c.validate().unwrap();
        assert!(c.listen[0].ip().is_loopback());
    }

    #[test]
    fn cluster_roll_call_is_bounded() {
        assert_eq!(Config::default().cluster.roll_call_ms, 2_000);
        let c = Config::from_toml("[cluster]\nroll_call_ms = 300\n").unwrap();
        assert_eq!(c.cluster.roll_call_ms, 300);
        for bad in ["0", "99", "600001"] {
            let err = Config::from_toml(&format!("[cluster]\nroll_call_ms = {bad}\n")).unwrap_err();
            assert!(err.to_string().contains("cluster.roll_call_ms"), "{err}");
        }
    }

    #[test]
    fn aip_section() {
        let c = Config::from_toml(
            "[aip]\nlisten = \"127.0.0.1:50050\"\ndial_allow = [\"10.0.0.0/8\", \"h:1\"]\non_silence = \"offline\"\n",
        )
        .unwrap();
        assert_eq!(c.aip.listen, Some("127.0.0.1:50050".parse().unwrap()));
        assert_eq!(c.aip.on_silence, crate::gateway::aip::Silence::Offline);
        assert!(Config::default().aip.listen.is_none(), "off by default");
        let err = Config::from_toml("[aip]\ndial_allow = [\"a b\"]\n").unwrap_err();
        assert!(err.to_string().contains("aip.dial_allow"), "{err}");
        assert!(Config::from_toml("[aip]\nnope = 1\n").is_err());
    }

    #[test]
    fn a2a_remote_agents() {
        let c = Config::from_toml(
            "[[a2a.remote]]\ncard_url = \"http://127.0.0.1:9/.well-known/agent-card.json\"\nname = \"x\"\ntoken = \"t\"\n[[a2a.remote]]\ncard_url = \"http://h/agent.json\"\n",
        )
        .unwrap();
        assert_eq!(c.a2a.remote.len(), 2);
        assert_eq!(c.a2a.remote[0].name.as_deref(), Some("x"));
        assert_eq!(c.a2a.remote[0].token.as_deref(), Some("t"));
        c.validate().unwrap();
        let err = Config::from_toml("[[a2a.remote]]\ncard_url = \"https://h/c\"\n").unwrap_err();
        assert!(err.to_string().contains("a2a.remote"), "{err}");
        assert!(Config::from_toml("[[a2a.remote]]\ncard = \"x\"\n").is_err());
    }

    #[test]
    fn toml_overrides_and_rejects_unknown_keys() {
        let c = Config::from_toml(
            "listen = [\"127.0.0.1:0\"]\n[limits]\nmax_frame_bytes = 4096\n[router]\nresume_window_ms = 10\n",
        )
        .unwrap();
        assert_eq!(c.limits.max_frame_bytes, 4096);
        assert_eq!(c.router.resume_window_ms, 10);
        assert_eq!(c.limits.max_batch, DEFAULT_MAX_BATCH, "untouched default");
        let err = Config::from_toml("[limits]\nmax_frame_byte = 1\n").unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
        let err = Config::from_toml("[limits]\nmax_frame_bytes = 10\n").unwrap_err();
        assert!(err.to_string().contains("at least 1024"), "{err}");
    }

    #[test]
    fn storage_is_ephemeral_by_default_and_configurable() {
        assert!(Config::default().storage.sqlite_options().is_none());
        let c = Config::from_toml(
            "[storage]\ndata_dir = \"/tmp/x\"\nsynchronous = \"normal\"\ndurability = \"async\"\nmax_age_secs = 60\n",
        )
        .unwrap();
        let o = c.storage.sqlite_options().unwrap();
        assert_eq!(o.dir, PathBuf::from("/tmp/x"));
        assert_eq!(o.synchronous, Synchronous::Normal);
        assert_eq!(o.max_age, Some(Duration::from_secs(60)));
        assert_eq!(c.router_config().durability, Durability::Async);
        let c = Config::from_toml("[storage]\ndata_dir = \"/tmp/x\"\nephemeral = true\n").unwrap();
        assert!(c.storage.sqlite_options().is_none(), "ephemeral wins");
        let err = Config::from_toml("[storage]\nsynchronous = \"off\"\n").unwrap_err();
        assert!(err.to_string().contains("unknown variant"), "{err}");
    }

    #[test]
    fn agents_to_start_become_spawn_requests() {
        let c = Config::from_toml(
            "[[agents]]\nname = \"indexer\"\nprogram = \"python3\"\nargs = [\"a.py\"]\nrestart = \"on-failure\"\nmax_restarts = 2\n",
        )
        .unwrap();
        let p = c.agents[0].spawn_params();
        assert_eq!(p.register.name.as_deref(), Some("indexer"));
        let cmd = p.command.unwrap();
        assert_eq!(cmd.program, "python3");
        assert_eq!(cmd.args, vec!["a.py"]);
        let restart = cmd.restart.unwrap();
        assert_eq!(restart.mode, RestartMode::OnFailure);
        assert_eq!(restart.max_restarts, Some(2));
        let err = Config::from_toml("[[agents]]\nprogram = \" \"\n").unwrap_err();
        assert!(err.to_string().contains("empty program"), "{err}");
    }
}
