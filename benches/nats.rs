//! The fan-out case of the load generator (`benches/load.rs`), spoken to NATS instead of MAP:
//! the broker a user would otherwise pick, measured with the same shape so that
//! `scripts/bench-compare.sh nats` can put the server CPU per delivery of both side by side.
//!
//! The shape: P publishers (`--publishers`, each its own connection) send M messages
//! (`--messages`) of `--message-bytes` bytes (261 by default: the size of the `map/message`
//! frame map-router's agents receive in the load generator's fan-out at its default payload) to
//! one subject, at most `--window` (64) unanswered each, while K "agents" (`--agents`) and S
//! "subscribers" (`--subscribers`), each on its own connection, receive every message: K + S
//! deliveries per message, what map-router's K members and S `message_sent` watchers are.
//!
//! Modes (`--mode`):
//! - `core`: plain subscriptions; a publisher's window is a flush (PING/PONG) every `--window`
//!   messages, since core NATS answers nothing per message.
//! - `jetstream`: a file-backed stream with one replica; each publish waits for its stream
//!   acknowledgement (the window counts unacknowledged publishes), each receiver reads through an
//!   ordered consumer from the start of the stream (`--consumer push`, the default and the
//!   cheapest for the server, or `pull`): durable messages, like map-router's as shipped.
//!
//! Without `--url` it starts a `nats-server -js` of its own on a free loopback port (the
//! smoke run of `cargo test --benches`, which checks the counts, never timing). It talks only to
//! loopback. Prints one JSON line like the load generator's `fanout` line.

use std::collections::VecDeque;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use clap::Parser;
use futures::StreamExt;
use serde_json::{json, Value};

#[path = "common/latency.rs"]
mod latency;
use latency::{histogram, now_us, percentiles, Arrivals};

type Res<T> = Result<T, String>;

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Full size (passed by `cargo bench`); without it, a smoke run that checks counts.
    #[arg(long)]
    bench: bool,
    /// Only `fanout` (accepted so that a script can pass the load generator's arguments).
    #[arg(long, default_value = "fanout")]
    test: String,
    /// nats://127.0.0.1:PORT (default: a nats-server -js started here).
    #[arg(long)]
    url: Option<String>,
    /// `core` or `jetstream`.
    #[arg(long, default_value = "core")]
    mode: String,
    /// JetStream: how receivers read the stream: `push` (an ordered push consumer: the server
    /// sends as it stores, the cheapest for it) or `pull` (an ordered pull consumer).
    #[arg(long, default_value = "push")]
    consumer: String,
    /// Receivers that stand for the scope's member agents (K).
    #[arg(long)]
    agents: Option<usize>,
    /// Receivers that stand for the event subscribers (S).
    #[arg(long)]
    subscribers: Option<usize>,
    /// Publishing connections (P).
    #[arg(long)]
    publishers: Option<usize>,
    /// Messages in total (M), split across publishers.
    #[arg(long)]
    messages: Option<u64>,
    /// Unanswered publishes per publisher.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Bytes in each message.
    #[arg(long, default_value_t = 261)]
    message_bytes: usize,
    /// Bound on the run, in seconds.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
    /// Printed as `server` in the line.
    #[arg(long, default_value = "nats")]
    server: String,
}

/// A message of exactly `size` bytes (or its minimum) carrying the send timestamp.
fn message(size: usize, seq: u64) -> bytes::Bytes {
    let head = format!(r#"{{"bts":{},"seq":{seq},"pad":""#, now_us());
    let pad = size.saturating_sub(head.len() + 2);
    let mut text = head;
    text.extend(std::iter::repeat_n('x', pad));
    text.push_str("\"}");
    text.into()
}

/// A `nats-server -js` on a free loopback port, killed on drop.
struct OwnServer {
    child: Child,
    dir: std::path::PathBuf,
    url: String,
}

impl OwnServer {
    fn start() -> Res<Self> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let dir = std::env::temp_dir().join(format!("bench-nats-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("cannot start nats-server ({e}); Debian: apt-get install nats-server")
            })?;
        let server = Self {
            child,
            dir,
            url: format!("nats://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("nats-server did not listen within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Messages sent by every publisher, and received by each receiver: how far the core
/// publishers are ahead ([`CORE_LEAD`]).
struct Progress {
    sent: AtomicU64,
    received: Vec<AtomicU64>,
}

impl Progress {
    /// Messages sent that the slowest receiver has not had yet.
    fn lead(&self) -> u64 {
        let slowest = self
            .received
            .iter()
            .map(|r| r.load(Ordering::Relaxed))
            .min();
        self.sent
            .load(Ordering::Relaxed)
            .saturating_sub(slowest.unwrap_or(0))
    }
}

/// Receiver `me`: counts messages until `expected` arrived or the deadline.
async fn receive(
    mut messages: impl futures::Stream<Item = bytes::Bytes> + Unpin,
    expected: u64,
    deadline: Instant,
    progress: Arc<Progress>,
    me: usize,
) -> Arrivals {
    let mut out = Arrivals::new();
    while out.count < expected {
        match tokio::time::timeout_at(deadline.into(), messages.next()).await {
            Ok(Some(payload)) => out.saw(std::str::from_utf8(&payload).unwrap_or("")),
            _ => break,
        }
        progress.received[me].store(out.count, Ordering::Relaxed);
    }
    out
}

/// How far core publishers may run ahead of the slowest receiver, in messages. Core NATS
/// answers nothing per message and drops what a slow consumer cannot take (at most once): this
/// bound keeps the generator, which reads every delivery on one core, from being that slow
/// consumer, so that every run delivers everything and counts alike.
const CORE_LEAD: u64 = 4096;

/// A consumer's messages as their payloads (a failed read ends nothing: the receiver's count
/// and deadline decide).
fn payloads<E: Send + 'static>(
    messages: impl futures::Stream<Item = Result<jetstream::Message, E>> + Send + 'static,
) -> futures::stream::BoxStream<'static, bytes::Bytes> {
    messages
        .filter_map(|m| async move { m.ok().map(|m| m.message.payload) })
        .boxed()
}

async fn connect(url: &str) -> Res<async_nats::Client> {
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))
}

/// One publisher's part: `n` messages, at most `window` unanswered.
#[allow(clippy::too_many_arguments)]
async fn publish(
    client: async_nats::Client,
    mode: &str,
    subject: String,
    n: u64,
    window: usize,
    size: usize,
    first_seq: u64,
    progress: Arc<Progress>,
    deadline: Instant,
) -> Res<u64> {
    let window = window.max(1);
    if mode == "core" {
        for i in 0..n {
            while progress.lead() > CORE_LEAD {
                if Instant::now() > deadline {
                    return Err("the receivers stopped".into());
                }
                tokio::task::yield_now().await;
            }
            progress.sent.fetch_add(1, Ordering::Relaxed);
            client
                .publish(subject.clone(), message(size, first_seq + i))
                .await
                .map_err(|e| e.to_string())?;
            if (i + 1) % window as u64 == 0 {
                tokio::time::timeout(Duration::from_secs(10), client.flush())
                    .await
                    .map_err(|_| "flush timed out")?
                    .map_err(|e| e.to_string())?;
            }
        }
        client.flush().await.map_err(|e| e.to_string())?;
        return Ok(n);
    }
    let js = jetstream::new(client);
    let mut pending = VecDeque::with_capacity(window);
    let mut acked = 0;
    for i in 0..n {
        if pending.len() == window {
            let ack: jetstream::context::PublishAckFuture =
                pending.pop_front().expect("a full window");
            ack.await.map_err(|e| e.to_string())?;
            acked += 1;
        }
        let ack = js
            .publish(subject.clone(), message(size, first_seq + i))
            .await
            .map_err(|e| e.to_string())?;
        pending.push_back(ack);
    }
    for ack in pending {
        ack.await.map_err(|e| e.to_string())?;
        acked += 1;
    }
    Ok(acked)
}

async fn run(args: Args) -> Res<Value> {
    let full = args.bench;
    let agents = args.agents.unwrap_or(if full { 10 } else { 3 });
    let subscribers = args.subscribers.unwrap_or(2);
    let publishers = args.publishers.unwrap_or(1).max(1);
    let messages = args.messages.unwrap_or(if full { 20_000 } else { 50 });
    let mode = args.mode.as_str();
    if args.test != "fanout" {
        return Err(format!(
            "only the fanout test speaks NATS, not {}",
            args.test
        ));
    }
    if !matches!(mode, "core" | "jetstream") {
        return Err(format!("--mode must be core or jetstream, not {mode}"));
    }
    if !matches!(args.consumer.as_str(), "push" | "pull") {
        return Err(format!(
            "--consumer must be push or pull, not {}",
            args.consumer
        ));
    }
    let own = match &args.url {
        Some(url) => {
            let host = url
                .strip_prefix("nats://")
                .ok_or("--url must be nats://…")?;
            if !(host.starts_with("127.0.0.1:") || host.starts_with("localhost:")) {
                return Err("the load generator only talks to loopback".into());
            }
            None
        }
        None => Some(OwnServer::start()?),
    };
    let url = args
        .url
        .clone()
        .unwrap_or_else(|| own.as_ref().expect("started").url.clone());
    let deadline = Instant::now() + Duration::from_secs(args.timeout_s);
    let run_id = format!("{}{}", std::process::id(), now_us());
    let subject = format!("bench.fanout.{run_id}");
    let receivers = agents + subscribers;

    // Receivers first, each on its own connection, every one subscribed before the first publish.
    let setup = Instant::now();
    let mut streams = Vec::new();
    let mut clients = Vec::new();
    if mode == "jetstream" {
        let js = jetstream::new(connect(&url).await?);
        js.create_stream(jetstream::stream::Config {
            name: format!("BENCH{run_id}"),
            subjects: vec![subject.clone()],
            storage: jetstream::stream::StorageType::File,
            num_replicas: 1,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("cannot create the stream: {e}"))?;
    }
    for _ in 0..receivers {
        let client = connect(&url).await?;
        let stream: futures::stream::BoxStream<'static, bytes::Bytes> = if mode == "core" {
            let sub = client
                .subscribe(subject.clone())
                .await
                .map_err(|e| e.to_string())?;
            sub.map(|m| m.payload).boxed()
        } else {
            let js = jetstream::new(client.clone());
            let stream = js
                .get_stream(format!("BENCH{run_id}"))
                .await
                .map_err(|e| e.to_string())?;
            if args.consumer == "pull" {
                let consumer = stream
                    .create_consumer(jetstream::consumer::pull::OrderedConfig::default())
                    .await
                    .map_err(|e| e.to_string())?;
                payloads(consumer.messages().await.map_err(|e| e.to_string())?)
            } else {
                let consumer = stream
                    .create_consumer(jetstream::consumer::push::OrderedConfig {
                        deliver_subject: client.new_inbox(),
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                payloads(consumer.messages().await.map_err(|e| e.to_string())?)
            }
        };
        // Core subscriptions exist once the server saw the SUB: a flush makes sure.
        client.flush().await.map_err(|e| e.to_string())?;
        streams.push(stream);
        clients.push(client);
    }
    let mut pubs = Vec::new();
    for _ in 0..publishers {
        pubs.push(connect(&url).await?);
    }
    let setup_s = setup.elapsed().as_secs_f64();

    let start = Instant::now();
    let progress = Arc::new(Progress {
        sent: AtomicU64::new(0),
        received: (0..receivers).map(|_| AtomicU64::new(0)).collect(),
    });
    let readers: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(me, s)| tokio::spawn(receive(s, messages, deadline, progress.clone(), me)))
        .collect();
    let per = messages / publishers as u64;
    let mut tasks = Vec::new();
    for (p, client) in pubs.into_iter().enumerate() {
        let n = if p + 1 == publishers {
            messages - per * (publishers as u64 - 1)
        } else {
            per
        };
        let subject = subject.clone();
        let mode = mode.to_string();
        let (window, size) = (args.window, args.message_bytes);
        let progress = progress.clone();
        tasks.push(tokio::spawn(async move {
            publish(
                client,
                &mode,
                subject,
                n,
                window,
                size,
                per * p as u64,
                progress,
                deadline,
            )
            .await
        }));
    }
    let mut accepted = 0;
    let mut published_at = start;
    for t in tasks {
        accepted += t.await.map_err(|e| e.to_string())??;
        published_at = Instant::now();
    }
    let mut deliveries = 0;
    let mut last = start;
    let mut latency = histogram();
    for r in readers {
        let r = r.await.map_err(|e| e.to_string())?;
        deliveries += r.count;
        last = last.max(r.last.unwrap_or(start));
        latency.add(&r.latency).map_err(|e| e.to_string())?;
    }
    drop(clients);
    let expected = messages * receivers as u64;
    let rate = |n: u64, d: Duration| (n as f64 / d.as_secs_f64().max(1e-9)).round();
    let line = json!({
        "test": "fanout",
        "server": args.server,
        "mode": mode,
        "full": full,
        "params": {
            "agents": agents, "subscribers": subscribers, "publishers": publishers,
            "messages": messages, "window": args.window, "message_bytes": args.message_bytes,
            "consumer": if mode == "jetstream" { Some(&args.consumer) } else { None },
        },
        "setup_s": setup_s,
        "accepted": accepted,
        "msgs_per_s": rate(accepted, published_at - start),
        "deliveries": deliveries,
        "expected_deliveries": expected,
        "deliveries_per_s": rate(deliveries, last - start),
        "complete": deliveries == expected && accepted == messages,
        "latency_ms": percentiles(&latency),
    });
    drop(own);
    Ok(line)
}

fn main() {
    // `cargo test` may pass harness flags; only ours are parsed.
    let args = Args::parse_from(std::env::args().filter(|a| {
        !matches!(
            a.as_str(),
            "--nocapture" | "--quiet" | "-q" | "--show-output" | "--ignored"
        )
    }));
    let bench = args.bench;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let modes = if bench {
        vec![(args.mode.clone(), args.consumer.clone())]
    } else {
        // The smoke run checks every mode.
        [
            ("core", "push"),
            ("jetstream", "push"),
            ("jetstream", "pull"),
        ]
        .map(|(m, c)| (m.to_string(), c.to_string()))
        .to_vec()
    };
    for (mode, consumer) in modes {
        let args = Args {
            mode,
            consumer,
            ..args.clone()
        };
        match runtime.block_on(run(args)) {
            Ok(line) => {
                println!("{line}");
                if !bench && line["complete"] != true {
                    eprintln!("nats: the counts do not add up");
                    std::process::exit(1);
                }
            }
            Err(e) => {
                eprintln!("nats: {e}");
                std::process::exit(1);
            }
        }
    }
}
