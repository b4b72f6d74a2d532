//! A real `nats-server -js` on 127.0.0.1 with a free port and a temporary store directory,
//! killed on drop; SIGKILL and restart on the same port and directory. The cluster tests need
//! it: when `nats-server` is missing they fail (never skip), saying how to install it.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::ports::reserve;
use super::TempDir;

/// A `nats-server -js`, killed on drop.
pub struct Nats {
    child: Option<Child>,
    /// More arguments for nats-server (TLS).
    extra: Vec<std::ffi::OsString>,
    pub port: u16,
    dir: TempDir,
}

impl Nats {
    /// Starts one and waits until it listens.
    pub fn start(name: &str) -> Self {
        Self::start_with(name, Vec::new())
    }

    /// Starts one requiring TLS with this certificate and key (PEM files).
    pub fn start_tls(name: &str, cert: &std::path::Path, key: &std::path::Path) -> Self {
        Self::start_with(
            name,
            vec![
                "--tls".into(),
                "--tlscert".into(),
                cert.into(),
                "--tlskey".into(),
                key.into(),
            ],
        )
    }

    /// Starts one with more arguments and waits until it listens.
    pub fn start_with(name: &str, extra: Vec<std::ffi::OsString>) -> Self {
        let held = reserve(1).pop().expect("one port");
        Self::start_on(name, extra, held)
    }

    /// Starts one on the port `held` reserves (released just before nats-server binds it).
    fn start_on(name: &str, extra: Vec<std::ffi::OsString>, held: TcpListener) -> Self {
        let port = held.local_addr().expect("a reserved port").port();
        let mut nats = Self {
            child: None,
            extra,
            port,
            dir: TempDir::new(&format!("nats-{name}")),
        };
        drop(held);
        nats.spawn();
        nats
    }

    /// Three servers in one NATS cluster (routes between them, JetStream clustered), each with
    /// its own port and store directory, on 127.0.0.1; waits until each one listens (a
    /// stream with replicas 3 can be created once their metadata leader is elected).
    pub fn cluster(name: &str) -> Vec<Self> {
        // Six distinct ports (three client, three route), all held until their server starts:
        // a client port picked after the route ports were released once came back equal to one
        // of them ("Error listening on router port ... address already in use").
        let mut held = reserve(6);
        let clients = held.split_off(3);
        let mut route_held = held;
        let routes: Vec<u16> = route_held
            .iter()
            .map(|l| l.local_addr().expect("a reserved port").port())
            .collect();
        let all = routes
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        clients
            .into_iter()
            .zip(routes.iter())
            .enumerate()
            .map(|(i, (client, route))| {
                let extra = vec![
                    "-n".into(),
                    format!("{name}-{i}").into(),
                    "--cluster_name".into(),
                    name.into(),
                    "--cluster".into(),
                    format!("nats://127.0.0.1:{route}").into(),
                    "--routes".into(),
                    all.clone().into(),
                ];
                drop(std::mem::replace(
                    &mut route_held[i],
                    TcpListener::bind("127.0.0.1:0").expect("a placeholder listener"),
                ));
                Self::start_on(&format!("{name}-{i}"), extra, client)
            })
            .collect()
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path.join("server.log"))
            .expect("open the server log");
        let child = Command::new("nats-server")
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.dir.path.join("store"))
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start nats-server ({e}): the cluster tests need it on PATH \
                     (Debian: apt-get install nats-server)"
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("nats-server exited at start ({status}): {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen within 10 s: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path.join("server.log")).unwrap_or_default()
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL nats-server");
            child.wait().expect("reap nats-server");
        }
    }

    /// Starts again on the same port and store directory (after [`Self::kill`], or kills first).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}
