//! The `map-router` command line: parse arguments, build the configuration, run the server;
//! or run one of the user commands of `map_router::cli` (`agent`, `watch`, `send`, `agents`,
//! `scopes`, `spawn`), which talk to a running router.
//!
//! Logs go to stderr (stdout stays clean for machine output and stdio transports).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use map_router::server::config::DEFAULT_DATA_DIR;
use map_router::server::{Config, Server};

// NB: the binary's allocator, not the library's: glibc's malloc took about 16 % of the
// router's CPU in fan-out (events of about 1 KB made and freed on different threads);
// docs/performance.md has the A/B. The `system-alloc` feature leaves malloc in place for heap
// profilers.
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "map-router",
    version,
    about = "A router for MAP, the Multi-Agent Protocol"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the router (the default when no command is given).
    Serve(ServeArgs),
    /// Serve one MAP session over this process's stdin/stdout (NDJSON, one message per line);
    /// listens on network addresses too only when `--listen` is given. Exits at EOF.
    Stdio(ServeArgs),
    /// Write (or check) the JSON Schema files generated from the protocol types.
    Schema {
        /// Directory to write into.
        #[arg(long, default_value = "schema")]
        out: PathBuf,
        /// Only check that the directory is up to date; exit 1 if not.
        #[arg(long)]
        check: bool,
    },
    /// List this router's federation peers (`[[federation.peer]]`) and test each link it
    /// dials as the router would: connect, authenticate, `map/federation/connect`. Exits 1
    /// when a link cannot be opened.
    Peers(ServeArgs),
    #[command(flatten)]
    User(map_router::cli::Command),
}

#[derive(Debug, Clone, clap::Args)]
struct ServeArgs {
    /// Address to listen on (repeatable). Overrides the config file. Default 127.0.0.1:4500.
    #[arg(long, env = "MAP_ROUTER_LISTEN", value_delimiter = ',')]
    listen: Vec<SocketAddr>,
    /// Serve the AIP gateway (gRPC, docs/aip.md) on this address. Overrides `[aip] listen`.
    #[arg(long, env = "MAP_ROUTER_AIP_LISTEN")]
    aip_listen: Option<SocketAddr>,
    /// TOML configuration file.
    #[arg(long, env = "MAP_ROUTER_CONFIG")]
    config: Option<PathBuf>,
    /// Largest accepted text frame, in bytes.
    #[arg(long, env = "MAP_ROUTER_MAX_FRAME_BYTES")]
    max_frame_bytes: Option<usize>,
    /// Directory of the durable event store. `serve` defaults to ./map-router-data; `stdio`
    /// keeps events in memory unless this (or the config file) names a directory.
    #[arg(long, env = "MAP_ROUTER_DATA_DIR", conflicts_with = "ephemeral")]
    data_dir: Option<PathBuf>,
    /// Keep events in memory only: nothing is written to disk and nothing survives a restart.
    #[arg(long)]
    ephemeral: bool,
    /// This system's federation id (docs/federation.md). Overrides `[federation] system_id`;
    /// default: the host name.
    #[arg(long, env = "MAP_ROUTER_SYSTEM_ID")]
    system_id: Option<String>,
    /// Cluster mode: keep the event log in NATS JetStream at this URL (`nats://HOST:PORT`)
    /// instead of SQLite. Overrides `[cluster] url`; docs/cluster-notes.md.
    #[arg(long, env = "MAP_ROUTER_CLUSTER", conflicts_with = "ephemeral")]
    cluster: Option<String>,
    /// Cluster mode: when another live node writes the stream, wait as its standby (answering
    /// 503 "standby") and take over when it stops, instead of refusing to start.
    #[arg(long, env = "MAP_ROUTER_STANDBY")]
    standby: bool,
    /// PEM certificate chain: serve wss:// and https:// (needs --tls-key).
    #[arg(long, env = "MAP_ROUTER_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, env = "MAP_ROUTER_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Network connections at once (0: unlimited).
    #[arg(long, env = "MAP_ROUTER_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// Network connections at once from one IP address (0: unlimited).
    #[arg(long, env = "MAP_ROUTER_MAX_CONNECTIONS_PER_IP")]
    max_connections_per_ip: Option<usize>,
    /// Requests per second per connection (0: unlimited).
    #[arg(long, env = "MAP_ROUTER_RATE_PER_CONNECTION")]
    rate_per_connection: Option<u32>,
    /// Requests per second per principal, or per IP address without one (0: unlimited).
    #[arg(long, env = "MAP_ROUTER_RATE_PER_PRINCIPAL")]
    rate_per_principal: Option<u32>,
    /// Close connections that have not completed map/connect within this many ms (0: never).
    #[arg(long, env = "MAP_ROUTER_HANDSHAKE_TIMEOUT_MS")]
    handshake_timeout_ms: Option<u64>,
    #[command(flatten)]
    auth: AuthArgs,
}

/// Authentication flags (docs/security.md). Each overrides `[auth]` of the config file.
#[derive(Debug, Clone, clap::Args)]
struct AuthArgs {
    /// Authentication methods: `none`, or `api-key` and/or `jwt` (comma-separated). Default:
    /// the methods whose keys are configured.
    #[arg(long = "auth", env = "MAP_ROUTER_AUTH", value_delimiter = ',')]
    methods: Vec<map_router::auth::config::AuthMethodName>,
    /// API keys file: one `KEY [PRINCIPAL]` per line.
    #[arg(long, env = "MAP_ROUTER_API_KEYS_FILE")]
    api_keys_file: Option<PathBuf>,
    /// API keys inline, `KEY [PRINCIPAL]` entries separated by commas. Prefer the environment
    /// variable: a flag is visible to every user in `ps`.
    #[arg(long, env = "MAP_ROUTER_API_KEYS", hide_env_values = true)]
    api_keys: Option<String>,
    /// HS256 secret file for JWTs.
    #[arg(long, env = "MAP_ROUTER_JWT_SECRET_FILE")]
    jwt_secret_file: Option<PathBuf>,
    /// HS256 secret for JWTs, inline. Prefer the environment variable or a file.
    #[arg(long, env = "MAP_ROUTER_JWT_SECRET", hide_env_values = true)]
    jwt_secret: Option<String>,
    /// JWKS file with the public keys of RS256/ES256 tokens (chosen by `kid`).
    #[arg(long, env = "MAP_ROUTER_JWKS_FILE")]
    jwks_file: Option<PathBuf>,
    /// Accepted JWT issuers (`iss`), comma-separated.
    #[arg(long, env = "MAP_ROUTER_JWT_ISSUER", value_delimiter = ',')]
    jwt_issuer: Vec<String>,
    /// Accepted JWT audiences (`aud`), comma-separated.
    #[arg(long, env = "MAP_ROUTER_JWT_AUDIENCE", value_delimiter = ',')]
    jwt_audience: Vec<String>,
    /// Transports admitted without credentials: `supervised`, `in-process`, `stdio`, or `none`
    /// (comma-separated). Default `supervised`.
    #[arg(long, env = "MAP_ROUTER_TRUSTED_TRANSPORTS", value_delimiter = ',')]
    trusted_transports: Vec<String>,
    /// Principal ids that may connect as `participantType: "system"` (comma-separated).
    #[arg(long, env = "MAP_ROUTER_SYSTEM_PRINCIPALS", value_delimiter = ',')]
    system_principals: Vec<String>,
}

impl AuthArgs {
    /// Applies the flags on top of the config file's `[auth]`.
    fn apply(&self, auth: &mut map_router::auth::AuthSettings) -> Result<(), String> {
        use map_router::auth::config::{OneOrMany, Secret};
        if !self.methods.is_empty() {
            auth.methods = Some(self.methods.clone());
        }
        if let Some(f) = &self.api_keys_file {
            auth.api_keys.file = Some(f.clone());
        }
        if let Some(k) = &self.api_keys {
            auth.api_keys.inline = Some(Secret(k.clone()));
        }
        if let Some(f) = &self.jwt_secret_file {
            auth.jwt.secret_file = Some(f.clone());
        }
        if let Some(s) = &self.jwt_secret {
            auth.jwt.secret = Some(Secret(s.clone()));
        }
        if let Some(f) = &self.jwks_file {
            auth.jwt.jwks_file = Some(f.clone());
        }
        if !self.jwt_issuer.is_empty() {
            auth.jwt.issuer = OneOrMany::Many(self.jwt_issuer.clone());
        }
        if !self.jwt_audience.is_empty() {
            auth.jwt.audience = OneOrMany::Many(self.jwt_audience.clone());
        }
        if !self.trusted_transports.is_empty() {
            auth.trusted_transports = self
                .trusted_transports
                .iter()
                .filter(|t| t.trim() != "none")
                .map(|t| t.parse())
                .collect::<Result<_, _>>()?;
        }
        if !self.system_principals.is_empty() {
            auth.system_principals = self.system_principals.clone();
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // User commands print results on stdout: only warnings and errors go to the log, and not
    // the client driver's warnings about the connection, which the commands report in their
    // own words (`watch`: connection lost, reconnected, gave up).
    let quiet = matches!(cli.command, Some(Cmd::User(_) | Cmd::Peers(_)));
    init_logging(if quiet {
        "warn,map_router::client::driver=error"
    } else {
        "info"
    });
    match cli.command {
        Some(Cmd::User(command)) => map_router::cli::run(command),
        Some(Cmd::Schema { out, check }) => schema(&out, check),
        Some(Cmd::Serve(args)) => serve(args, Mode::Listen),
        Some(Cmd::Stdio(args)) => serve(args, Mode::Stdio),
        Some(Cmd::Peers(args)) => peers(&args),
        None => serve(cli.serve, Mode::Listen),
    }
}

/// `map-router peers`: one line per peer, `<system>  <how>  ok|FAILED ...`.
fn peers(args: &ServeArgs) -> ExitCode {
    let config = match build_config(args, Mode::Listen) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("map-router: {e}");
            return ExitCode::from(2);
        }
    };
    let links = match config.federation.peer_links(config.listen.first().copied()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("map-router: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match map_router::cli::runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    println!(
        "this system: {} ({} peers)",
        config.federation.system_id(),
        config.federation.peer.len()
    );
    let mut failed = false;
    for p in &config.federation.peer {
        let Some(link) = links.iter().find(|l| l.system == p.system_id) else {
            println!(
                "{}  links in as principal {}  (not dialled: no endpoint)",
                p.system_id, p.principal
            );
            continue;
        };
        match runtime.block_on(map_router::gateway::federation::probe(link)) {
            Ok(answer) => println!(
                "{}  dialled at {}  ok: linked as {} ({} {})",
                p.system_id,
                link.endpoint,
                link.me,
                answer["systemInfo"]["name"].as_str().unwrap_or("?"),
                answer["systemInfo"]["version"].as_str().unwrap_or("?"),
            ),
            Err(e) => {
                failed = true;
                println!("{}  dialled at {}  FAILED: {e}", p.system_id, link.endpoint);
            }
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Network listeners only.
    Listen,
    /// One session over stdin/stdout, plus listeners if asked for.
    Stdio,
}

fn build_config(args: &ServeArgs, mode: Mode) -> Result<Config, String> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path).map_err(|e| e.to_string())?,
        None => Config::default(),
    };
    if args.aip_listen.is_some() {
        config.aip.listen = args.aip_listen;
    }
    if !args.listen.is_empty() {
        config.listen = args.listen.clone();
    } else if mode == Mode::Stdio && args.config.is_none() {
        config.listen.clear();
    }
    if mode == Mode::Listen && config.listen.is_empty() {
        return Err("nothing to serve: `listen` names no address".into());
    }
    if let Some(n) = args.max_frame_bytes {
        config.limits.max_frame_bytes = n;
    }
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        config.tls.cert = Some(cert.clone());
        config.tls.key = Some(key.clone());
    }
    let l = &mut config.limits;
    if let Some(n) = args.max_connections {
        l.max_connections = n;
    }
    if let Some(n) = args.max_connections_per_ip {
        l.max_connections_per_ip = n;
    }
    if let Some(n) = args.rate_per_connection {
        l.rate_per_connection = n;
    }
    if let Some(n) = args.rate_per_principal {
        l.rate_per_principal = n;
    }
    if let Some(n) = args.handshake_timeout_ms {
        l.handshake_timeout_ms = n;
    }
    if args.ephemeral {
        config.storage.ephemeral = true;
    } else if let Some(dir) = &args.data_dir {
        config.storage.data_dir = Some(dir.clone());
        config.storage.ephemeral = false;
    } else if mode == Mode::Listen && config.storage.data_dir.is_none() {
        config.storage.data_dir = Some(DEFAULT_DATA_DIR.into());
    }
    if let Some(url) = &args.cluster {
        config.cluster.url = Some(url.clone());
    }
    if let Some(id) = &args.system_id {
        config.federation.system_id = Some(id.clone());
    }
    config.cluster.standby |= args.standby;
    if config.cluster.standby && config.cluster.url.is_none() {
        return Err("--standby is for cluster mode: it needs --cluster (or [cluster] url)".into());
    }
    args.auth.apply(&mut config.auth)?;
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

fn serve(args: ServeArgs, mode: Mode) -> ExitCode {
    let config = match build_config(&args, mode) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("map-router: {e}");
            return ExitCode::from(2);
        }
    };
    let scheme = if config.tls.files().is_some() {
        "wss"
    } else {
        "ws"
    };
    let runtime = match map_router::cli::runtime_with_idle_hook(give_back_memory) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let code = runtime.block_on(async move {
        let mut signals = Signals::install();
        // A wake-up every 2 s, so a quiet server still gets to the idle hook (and a purge whose
        // delay has passed happens even if no worker parks again).
        tokio::spawn(async {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(2));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                collect_freed();
            }
        });
        // A start can last (a standby waits in it until it takes over): a signal meanwhile
        // stops the process, closing what the start had opened (a standby's viewers see their
        // connection close and reconnect elsewhere).
        let started = tokio::select! {
            started = Server::start(config) => started,
            () = signals.wait() => {
                tracing::info!("stopped before the server started (a standby stops here)");
                return ExitCode::SUCCESS;
            }
        };
        let server = match started {
            Ok(s) => s,
            Err(e) => {
                eprintln!("map-router: cannot start: {e}");
                return ExitCode::FAILURE;
            }
        };
        for addr in server.local_addrs() {
            // Stable, parseable line (tests and scripts read it to find the port).
            eprintln!("map-router listening on {scheme}://{addr}/");
            eprintln!(
                "map-router dashboard on {}",
                map_router::server::ui::url(*addr, scheme == "wss")
            );
        }
        if let Some(addr) = server.aip_addr() {
            // Stable, parseable line, as above.
            let tls = if scheme == "wss" { " (TLS)" } else { "" };
            eprintln!("map-router AIP gateway listening on {addr}{tls}");
        }
        match mode {
            Mode::Listen => signals.wait().await,
            Mode::Stdio => {
                tokio::select! {
                    () = server.serve_io(tokio::io::stdin(), tokio::io::stdout()) => {
                        tracing::info!("stdin closed");
                    }
                    () = signals.wait() => {}
                }
            }
        }
        tracing::info!("shutting down: draining connections");
        server.shutdown().await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    });
    // NB: tokio's stdin read runs on a blocking thread that only returns at EOF; do not let
    // it hold the process open after a signal.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    code
}

/// Run by each runtime worker when it runs out of work, at most once a second per thread: lets
/// the allocator take back the blocks other threads freed into this thread's pages, and return
/// pages freed more than its purge delay ago to the OS. mimalloc does both only when the owning
/// thread calls into it again; after a burst (the churn soak's 40 000 sessions) the workers go
/// quiet and RSS stayed about 20 MB above the live heap for good (docs/performance.md, "Memory
/// soaks"). One clock read per park otherwise.
fn give_back_memory() {
    use std::cell::Cell;
    use std::time::{Duration, Instant};
    const EVERY: Duration = Duration::from_secs(1);
    thread_local! {
        static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
    }
    let now = Instant::now();
    let due = LAST.with(|last| match last.get() {
        Some(t) if now.duration_since(t) < EVERY => false,
        _ => {
            last.set(Some(now));
            true
        }
    });
    if due {
        collect_freed();
    }
}

#[cfg(not(feature = "system-alloc"))]
#[allow(unsafe_code)]
fn collect_freed() {
    // SAFETY: `mi_collect` takes no pointer and may be called from any thread at any time.
    // `force = true` also frees this thread's delayed frees and purges freed pages now rather
    // than after the purge delay: it walks this thread's pages, which at most once a second on
    // a worker with nothing else to do is cheap (docs/performance.md, "Memory soaks").
    unsafe { libmimalloc_sys::mi_collect(true) }
}

#[cfg(feature = "system-alloc")]
fn collect_freed() {}

/// SIGINT and SIGTERM, with their handlers installed when this is created: before the server
/// starts anything (children included), so an early signal still drains instead of killing
/// the process outright.
struct Signals {
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Self {
                int: signal(SignalKind::interrupt()).ok(),
                term: signal(SignalKind::terminate()).ok(),
            }
        }
        #[cfg(not(unix))]
        {
            Self {}
        }
    }

    async fn wait(&mut self) {
        #[cfg(unix)]
        {
            async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                () = recv(&mut self.int) => {}
                () = recv(&mut self.term) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn schema(out: &std::path::Path, check: bool) -> ExitCode {
    let files = map_router::protocol::schema::generate_all();
    let mut stale = Vec::new();
    for (name, text) in &files {
        let path = out.join(name);
        let current = std::fs::read_to_string(&path).ok();
        if current.as_deref() == Some(text.as_str()) {
            continue;
        }
        if check {
            stale.push(name.clone());
            continue;
        }
        if let Some(dir) = path.parent() {
            if let Err(e) = std::fs::create_dir_all(dir) {
                eprintln!("map-router: cannot create {}: {e}", dir.display());
                return ExitCode::FAILURE;
            }
        }
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("map-router: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    if !stale.is_empty() {
        eprintln!(
            "map-router: schema/ is stale ({}); run `cargo run -- schema --out schema`",
            stale.join(", ")
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
