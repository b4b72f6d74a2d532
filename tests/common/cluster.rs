//! Router nodes in cluster mode as real processes, for the tests that start, pause and kill
//! them (tests/cluster_faults.rs): each node the built `map-router` binary with its own TOML
//! config, listen port, data directory and captured log, and its role read from `/health`
//! without panicking while it is not (yet, or any more) listening.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// What a node's `/health` says now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Not listening (starting, paused, or gone).
    Down,
    /// `200`: the live node.
    Live,
    /// `503` with a body starting `standby`.
    Standby,
    /// Another answer (status and body).
    Other(u16, String),
}

/// A router node process, killed on drop.
pub struct Node {
    pub name: String,
    pub port: u16,
    pub child: tokio::process::Child,
    /// Every line it wrote to stderr so far.
    pub log: Arc<Mutex<Vec<String>>>,
}

/// A free port on 127.0.0.1 for a node to bind soon after ([`super::ports::free_port`]).
pub fn free_port() -> u16 {
    super::ports::free_port()
}

impl Node {
    /// Starts the binary as node `name` with `config` as its whole TOML config, listening on a
    /// free loopback port, its files under `dir`.
    pub fn spawn(name: &str, config: &str, dir: &Path) -> Self {
        Self::spawn_on(name, config, dir, free_port())
    }

    /// As [`Self::spawn`], listening on `port`.
    pub fn spawn_on(name: &str, config: &str, dir: &Path, port: u16) -> Self {
        let config_path: PathBuf = dir.join(format!("{name}.toml"));
        std::fs::write(&config_path, config).expect("write the node's config");
        let mut child = super::binary_command([
            std::ffi::OsString::from("--listen"),
            format!("127.0.0.1:{port}").into(),
            "--config".into(),
            config_path.into(),
            "--data-dir".into(),
            dir.join(name).into(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start a router node");
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("piped")).lines();
        let sink = Arc::clone(&log);
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                sink.lock().unwrap().push(line);
            }
        });
        Self {
            name: name.to_owned(),
            port,
            child,
            log,
        }
    }

    /// `ws://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("ws://127.0.0.1:{}/", self.port)
    }

    /// The log so far, one string.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Whether a log line so far contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// What its `/health` says now (bounded by 2 s).
    pub async fn role(&self) -> Role {
        role_of(self.port).await
    }

    /// The process id (while it runs).
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the node runs")
    }

    /// Sends `signal` (`STOP`, `CONT`, `KILL`, ...) with kill(1).
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.pid());
    }

    /// SIGKILL, and wait until it is gone.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

/// A node process started by [`start`] and its WebSocket URL (killed on drop).
pub struct Started {
    pub child: tokio::process::Child,
    pub url: String,
}

/// Starts the binary with `args` (listening on `port`, as [`node_args`] writes them) and waits
/// until its port accepts.
pub async fn start(args: Vec<std::ffi::OsString>, port: u16) -> Started {
    let child = super::binary_command(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start a node");
    super::within(Duration::from_secs(20), async {
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    Started {
        child,
        url: format!("ws://127.0.0.1:{port}/"),
    }
}

/// An API keys file under `dir` (mode 0600) with one `key principal` line per pair: its path.
pub fn keys_file(dir: &Path, keys: &[(&str, &str)]) -> String {
    let path = dir.join("keys");
    let text: String = keys.iter().map(|(k, p)| format!("{k} {p}\n")).collect();
    std::fs::write(&path, text).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    path.display().to_string()
}

/// The arguments of a cluster node listening on `port` on the NATS server at `url`, its config
/// file (`[cluster]` with short timeouts, `roll_call_ms = 500` and `cluster` added) written
/// next to `data`.
pub fn node_args(url: &str, data: &Path, port: u16, cluster: &str) -> Vec<std::ffi::OsString> {
    let config = data.with_extension("toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nrequest_timeout_ms = 1000\nconnect_timeout_ms = 3000\nroll_call_ms = 500\n\
             {cluster}\n[storage]\ncommit_timeout_ms = 1500\n"
        ),
    )
    .unwrap();
    vec![
        "--listen".into(),
        format!("127.0.0.1:{port}").into(),
        "--cluster".into(),
        url.into(),
        "--data-dir".into(),
        data.into(),
        "--config".into(),
        config.into(),
    ]
}

/// `GET /health` of the node at `url` (`ws://HOST:PORT/`): its status and body.
pub async fn health(url: &str) -> (u16, String) {
    let addr = url
        .trim_start_matches("ws://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let r = super::with_timeout(super::http::request(addr, "GET", "/health", &[], b"")).await;
    (r.status, String::from_utf8_lossy(&r.body).into_owned())
}

/// Polls `/health` until `pred` holds (within `limit`); how long it took.
pub async fn health_until(
    url: &str,
    limit: Duration,
    what: &str,
    pred: impl Fn(u16, &str) -> bool,
) -> Duration {
    let start = std::time::Instant::now();
    loop {
        let (status, body) = health(url).await;
        if pred(status, &body) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "/health never showed {what} within {limit:?}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A standby serving clients (its `/health`: 503 with `serving:` and the writer named).
pub fn serving(status: u16, body: &str) -> bool {
    status == 503 && body.contains("serving:") && body.contains("writer: ")
}

/// What `GET /health` on `127.0.0.1:port` says now (bounded by 2 s; [`Role::Down`] when
/// nothing answers).
pub async fn role_of(port: u16) -> Role {
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let status: u16 = text.split(' ').nth(1)?.parse().ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_owned();
        Some((status, body))
    };
    match tokio::time::timeout(Duration::from_secs(2), ask).await {
        Ok(Some((200, _))) => Role::Live,
        Ok(Some((503, body))) if body.starts_with("standby") => Role::Standby,
        Ok(Some((status, body))) => Role::Other(status, body),
        _ => Role::Down,
    }
}

/// The `[cluster]` config of docs/cluster.md's step 2 for node `name` on `url` (standby,
/// `replicas` copies of the log: 3 as in the doc, 1 on a single server), with `more` appended
/// to the section.
pub fn doc_config(url: &str, name: &str, replicas: usize, more: &str) -> String {
    format!(
        "[cluster]\nurl = \"{url}\"\nreplicas = {replicas}\nnode = \"{name}\"\nstandby = true\n\
         takeover_poll_ms = 250\n{more}\n"
    )
}
