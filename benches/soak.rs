//! The memory soaks (issue 23, item 5): what the server's memory does when participants create
//! a lot, and after connection churn. Prints one JSON line per soak with its parameters and
//! results. Run by `scripts/soak-memory.sh` against a built binary (`--url`, `--server-pid`);
//! docs/performance.md ("Memory soaks") has the figures.
//!
//! - `items`: `--owners` agent sessions (each its own quota owner) create `--tasks` tasks,
//!   `--checkpoints` checkpoints and `--turns` turns (in conversations of
//!   `--conversation-turns`), `--window` requests in flight per session; then a system client
//!   reads every item back once through the listings (`map/tasks/list`, `trajectory/list`,
//!   `mail/turns/list`, pages of `--page`) and gets `--gets` tasks by id. Reports the server's
//!   RSS before, after creating (and its peak), after reading back, and bytes per item.
//! - `churn`: for `--duration-s`, waves of `--wave-agents` agents connect, register, join one
//!   scope, one sends a `--payload-bytes` message to it, then half disconnect and half drop
//!   their socket (their agents stay orphaned for the resume window); a client subscribed to
//!   every event counts what it receives. Then it waits `--settle-s` (past the resume window).
//!   Reports message-event bytes per send, the store's growth per send (with `--data-dir`),
//!   the server's RSS before, at its peak and after, and the router's table entries
//!   (`map_router_table_entries` from `GET /metrics`) before and after.
//!
//! Without `--bench` (`cargo test --benches`) it runs both at a tiny size against a router in
//! this process and checks that the counts add up (never timing or memory). Loopback only;
//! every wait is bounded.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Mutex};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;
type Res<T> = Result<T, String>;

/// Bound on one call.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Parser)]
#[command(name = "soak", about = "MAP memory soaks (loopback only)")]
struct Args {
    /// Set by `cargo bench`: full size. Without it: a tiny smoke run with checks.
    #[arg(long)]
    bench: bool,
    /// Server (`ws://127.0.0.1:PORT/`). Default: map-router in this process.
    #[arg(long)]
    url: Option<String>,
    /// Process whose VmRSS is reported.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Soaks to run: items, churn (repeatable; default both).
    #[arg(long = "test")]
    tests: Vec<String>,
    /// Items: tasks to create.
    #[arg(long, default_value_t = 100_000)]
    tasks: u64,
    /// Items: turns to record.
    #[arg(long, default_value_t = 100_000)]
    turns: u64,
    /// Items: checkpoints to report.
    #[arg(long, default_value_t = 50_000)]
    checkpoints: u64,
    /// Items: turns per conversation.
    #[arg(long, default_value_t = 5_000)]
    conversation_turns: u64,
    /// Items: creating sessions (each its own quota owner).
    #[arg(long, default_value_t = 4)]
    owners: usize,
    /// Items: requests in flight per session.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Items: page size of the read-back.
    #[arg(long, default_value_t = 1000)]
    page: u64,
    /// Items: tasks got by id after the listings.
    #[arg(long, default_value_t = 5_000)]
    gets: u64,
    /// Churn: how long waves are started, in seconds.
    #[arg(long, default_value_t = 20)]
    duration_s: u64,
    /// Churn: agents per wave.
    #[arg(long, default_value_t = 40)]
    wave_agents: usize,
    /// Churn: payload padding.
    #[arg(long, default_value_t = 512)]
    payload_bytes: usize,
    /// Churn: wait after the waves (longer than the server's resume window), in seconds.
    #[arg(long, default_value_t = 75)]
    settle_s: u64,
    /// Churn: the server's data directory, for the store's growth per send.
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
}

/// VmRSS of `pid` in kB.
fn rss_kb(pid: Option<u32>) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Samples VmRSS every 200 ms until dropped; keeps the largest.
struct PeakRss {
    peak: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl PeakRss {
    fn start(pid: Option<u32>) -> Self {
        let peak = Arc::new(AtomicU64::new(rss_kb(pid).unwrap_or(0)));
        let p = peak.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Some(kb) = rss_kb(pid) {
                    p.fetch_max(kb, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Self { peak, task }
    }

    fn stop(self) -> u64 {
        self.task.abort();
        self.peak.load(Ordering::Relaxed)
    }
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

// ---------------------------------------------------------------------------------------------
// A pipelining connection

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<Res<Value>>>>>;

/// A JSON-RPC connection that may have many requests in flight; `map/event` notifications go
/// to an optional counter (message events and their bytes).
struct Conn {
    tx: Arc<Mutex<SplitSink<Ws, Message>>>,
    waiters: Waiters,
    next: AtomicU64,
    events: Arc<EventCount>,
}

#[derive(Default, Debug)]
struct EventCount {
    all: AtomicU64,
    messages: AtomicU64,
    message_bytes: AtomicU64,
}

impl Conn {
    async fn open(url: &str) -> Res<Arc<Self>> {
        let (ws, _) = tokio::time::timeout(
            CALL_TIMEOUT,
            tokio_tungstenite::connect_async_with_config(url, None, true),
        )
        .await
        .map_err(|_| format!("connecting to {url} timed out"))?
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
        let (tx, rx) = ws.split();
        let conn = Arc::new(Self {
            tx: Arc::new(Mutex::new(tx)),
            waiters: Arc::default(),
            next: AtomicU64::new(1),
            events: Arc::default(),
        });
        tokio::spawn(read(rx, conn.waiters.clone(), conn.events.clone()));
        Ok(conn)
    }

    async fn session(url: &str, kind: &str) -> Res<Arc<Self>> {
        let c = Self::open(url).await?;
        c.call(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": kind}),
        )
        .await?;
        Ok(c)
    }

    /// An agent session with one agent; returns its agent id.
    async fn agent(url: &str) -> Res<(Arc<Self>, String)> {
        let c = Self::session(url, "agent").await?;
        let r = c.call("map/agents/register", json!({})).await?;
        let id = r["agent"]["id"]
            .as_str()
            .ok_or_else(|| format!("register: {r}"))?
            .to_owned();
        Ok((c, id))
    }

    async fn call(&self, method: &str, params: Value) -> Res<Value> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().await.insert(id, tx);
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.tx
            .lock()
            .await
            .send(Message::text(frame.to_string()))
            .await
            .map_err(|e| format!("{method}: {e}"))?;
        tokio::time::timeout(CALL_TIMEOUT, rx)
            .await
            .map_err(|_| format!("{method}: no answer in {CALL_TIMEOUT:?}"))?
            .map_err(|_| format!("{method}: connection closed"))?
            .map_err(|e| format!("{method}: {e}"))
    }

    async fn close(&self) {
        let _ = self.tx.lock().await.close().await;
    }
}

async fn read(mut rx: SplitStream<Ws>, waiters: Waiters, events: Arc<EventCount>) {
    while let Some(Ok(msg)) = rx.next().await {
        let Message::Text(text) = msg else { continue };
        if text.contains("\"map/event\"") {
            events.all.fetch_add(1, Ordering::Relaxed);
            if text.contains("\"type\":\"message") {
                events.messages.fetch_add(1, Ordering::Relaxed);
                events
                    .message_bytes
                    .fetch_add(text.len() as u64, Ordering::Relaxed);
            }
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let Some(id) = v.get("id").and_then(Value::as_u64) else {
            continue;
        };
        if let Some(w) = waiters.lock().await.remove(&id) {
            let _ = w.send(match v.get("error") {
                Some(e) => Err(e.to_string()),
                None => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
            });
        }
    }
    // Closed: whoever still waits gets an error (their senders drop).
    waiters.lock().await.clear();
}

/// Runs `calls` on `conn` with at most `window` in flight; fails on the first error.
async fn pipelined(conn: &Arc<Conn>, window: usize, calls: Vec<(&'static str, Value)>) -> Res<()> {
    let results: Vec<Res<Value>> = futures::stream::iter(calls)
        .map(|(m, p)| {
            let c = conn.clone();
            async move { c.call(m, p).await }
        })
        .buffer_unordered(window.max(1))
        .collect()
        .await;
    results.into_iter().collect::<Res<Vec<_>>>().map(drop)
}

/// Every item of a listing, a page at a time; returns how many.
async fn count_pages(conn: &Arc<Conn>, method: &str, params: Value, field: &str) -> Res<u64> {
    let mut params = params;
    let mut n = 0;
    for _ in 0..1_000_000 {
        let page = conn.call(method, params.clone()).await?;
        n += page[field].as_array().map_or(0, |a| a.len() as u64);
        match page["nextCursor"].as_str() {
            Some(c) => params["cursor"] = json!(c),
            None => return Ok(n),
        }
    }
    Err(format!("{method}: too many pages"))
}

/// `map_router_table_entries` (and `map_sessions`, `map_agents` totals) from `GET /metrics`.
async fn tables(url: &str) -> Value {
    let Some(addr) = url
        .strip_prefix("ws://")
        .map(|a| a.trim_end_matches('/').to_owned())
    else {
        return Value::Null;
    };
    let text = async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = TcpStream::connect(&addr).await.ok()?;
        s.write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).await.ok()?;
        Some(body)
    };
    let Ok(Some(text)) = tokio::time::timeout(Duration::from_secs(10), text).await else {
        return Value::Null;
    };
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        if let Some(rest) = name.strip_prefix("map_router_table_entries{table=\"") {
            out.insert(rest.trim_end_matches("\"}").to_owned(), v);
        } else if let Some(base) = ["map_sessions", "map_agents", "map_subscriptions"]
            .iter()
            .find(|b| name.starts_with(*b))
        {
            *out.entry((*base).to_owned()).or_default() += v;
        }
    }
    json!(out)
}

// ---------------------------------------------------------------------------------------------
// Items

struct ItemsSpec {
    tasks: u64,
    turns: u64,
    checkpoints: u64,
    conversation_turns: u64,
    owners: usize,
    window: usize,
    page: u64,
    gets: u64,
}

async fn items(url: &str, pid: Option<u32>, spec: &ItemsSpec) -> Res<Value> {
    let run = std::process::id();
    let mut owners = Vec::new();
    for _ in 0..spec.owners.max(1) {
        owners.push(Conn::agent(url).await?);
    }
    let reader = Conn::session(url, "system").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = rss_kb(pid);
    let tables_before = tables(url).await;
    let peak = PeakRss::start(pid);
    let started = Instant::now();
    let n = owners.len() as u64;
    let conversations = spec.turns.div_ceil(spec.conversation_turns.max(1));
    let mut convs = Vec::new();
    for k in 0..conversations {
        let (c, _) = &owners[(k % n) as usize];
        let r = c
            .call("mail/create", json!({"subject": format!("soak {k}")}))
            .await?;
        let id = r["conversation"]["id"]
            .as_str()
            .ok_or_else(|| format!("mail/create: {r}"))?
            .to_owned();
        convs.push((k % n, id));
    }
    let creators = owners.iter().enumerate().map(|(o, (c, agent))| {
        let o = o as u64;
        let mut calls: Vec<(&'static str, Value)> = Vec::new();
        for i in (o..spec.tasks).step_by(n as usize) {
            calls.push((
                "map/tasks/create",
                json!({"task": {"id": format!("soak-{run}-t{i}"), "title": format!("task {i}"),
                       "description": "a task of the memory soak", "meta": {"i": i}}}),
            ));
        }
        for i in (o..spec.checkpoints).step_by(n as usize) {
            calls.push((
                "trajectory/checkpoint",
                json!({"checkpoint": {"id": format!("soak-{run}-c{i}"), "agentId": agent,
                       "label": format!("step {i}"), "metadata": {"i": i}}}),
            ));
        }
        // Conversation k gets the turns k * conversation_turns.. of the total.
        let per = spec.conversation_turns.max(1);
        for (k, (owner, conv)) in convs.iter().enumerate() {
            if *owner != o {
                continue;
            }
            let first = k as u64 * per;
            for i in first..spec.turns.min(first + per) {
                calls.push((
                    "mail/turn",
                    json!({"conversationId": conv, "contentType": "text",
                           "content": format!("turn {i} of the memory soak")}),
                ));
            }
        }
        let c = c.clone();
        let window = spec.window;
        async move { pipelined(&c, window, calls).await }
    });
    futures::future::try_join_all(creators).await?;
    let create_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_created = rss_kb(pid);
    let tables_created = tables(url).await;
    // Every item once, through the listings.
    let read_started = Instant::now();
    let page = spec.page;
    let tasks_read =
        count_pages(&reader, "map/tasks/list", json!({"limit": page}), "tasks").await?;
    let checkpoints_read = count_pages(
        &reader,
        "trajectory/list",
        json!({"limit": page}),
        "checkpoints",
    )
    .await?;
    let mut turns_read = 0;
    for (_, id) in &convs {
        turns_read += count_pages(
            &reader,
            "mail/turns/list",
            json!({"conversationId": id, "limit": page}),
            "turns",
        )
        .await?;
    }
    let gets: Vec<(&'static str, Value)> = (0..spec.gets.min(spec.tasks))
        .map(|k| {
            let i = k * spec.tasks / spec.gets.max(1);
            (
                "map/tasks/get",
                json!({"taskId": format!("soak-{run}-t{i}")}),
            )
        })
        .collect();
    let got = gets.len() as u64;
    pipelined(&reader, spec.window, gets).await?;
    let read_s = read_started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_read = rss_kb(pid);
    let peak = peak.stop();
    let tables_read = tables(url).await;
    for (c, _) in &owners {
        c.close().await;
    }
    reader.close().await;
    let created = spec.tasks + spec.turns + spec.checkpoints;
    let per_item = |after: Option<u64>| match (rss_before, after) {
        (Some(b), Some(a)) if created > 0 => {
            Some(((a.saturating_sub(b)) as f64 * 1024.0 / created as f64).round())
        }
        _ => None,
    };
    Ok(json!({
        "test": "items",
        "tasks": spec.tasks, "turns": spec.turns, "checkpoints": spec.checkpoints,
        "conversations": conversations, "owners": n, "window": spec.window, "page": page,
        "create_s": create_s,
        "items_per_s": (created as f64 / create_s.max(1e-9)).round(),
        "read_s": read_s,
        "tasks_read": tasks_read, "checkpoints_read": checkpoints_read, "turns_read": turns_read,
        "tasks_got": got,
        "rss_before_kb": rss_before, "rss_created_kb": rss_created,
        "rss_read_kb": rss_read, "rss_peak_kb": peak,
        "bytes_per_item_created": per_item(rss_created),
        "bytes_per_item_read": per_item(rss_read),
        "tables_before": tables_before, "tables_created": tables_created,
        "tables_read": tables_read,
    }))
}

// ---------------------------------------------------------------------------------------------
// Churn

struct ChurnSpec {
    duration: Duration,
    agents: usize,
    payload_bytes: usize,
    settle: Duration,
}

async fn churn(
    url: &str,
    pid: Option<u32>,
    spec: &ChurnSpec,
    data_dir: Option<&std::path::Path>,
) -> Res<Value> {
    let (owner, _) = Conn::agent(url).await?;
    let scope = format!("soak-{}", std::process::id());
    owner
        .call(
            "map/scopes/create",
            json!({"scopeId": scope, "sendPolicy": "any"}),
        )
        .await?;
    let observer = Conn::session(url, "client").await?;
    observer
        .call("map/subscribe", json!({"filter": {}}))
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_before = rss_kb(pid);
    let tables_before = tables(url).await;
    let store_before = data_dir.map(dir_bytes);
    let peak = PeakRss::start(pid);
    let events_before = observer.events.message_bytes.load(Ordering::Relaxed);
    let messages_before = observer.events.messages.load(Ordering::Relaxed);
    let started = Instant::now();
    let padding = "x".repeat(spec.payload_bytes);
    let mut sends = 0u64;
    let mut wave = 0u64;
    while started.elapsed() < spec.duration {
        let members = futures::future::try_join_all((0..spec.agents).map(|_| async {
            let (c, id) = Conn::agent(url).await?;
            c.call("map/scopes/join", json!({"scopeId": scope, "agentId": id}))
                .await?;
            Ok::<_, String>(c)
        }))
        .await?;
        members[0]
            .call(
                "map/send",
                json!({"to": {"scope": scope}, "payload": {"wave": wave, "pad": padding}}),
            )
            .await?;
        sends += 1;
        wave += 1;
        for (i, c) in members.into_iter().enumerate() {
            if i % 2 == 0 {
                c.call("map/disconnect", json!({})).await?;
            }
            // Half leave cleanly (after `map/disconnect`), half just drop their socket.
            c.close().await;
        }
    }
    let waves_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let message_bytes = observer.events.message_bytes.load(Ordering::Relaxed) - events_before;
    let message_events = observer.events.messages.load(Ordering::Relaxed) - messages_before;
    let store_growth = match (store_before, data_dir.map(dir_bytes)) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    let rss_waves = rss_kb(pid);
    let tables_waves = tables(url).await;
    tokio::time::sleep(spec.settle).await;
    let rss_after = rss_kb(pid);
    let peak = peak.stop();
    let tables_after = tables(url).await;
    let per_send = |n: u64| (n as f64 / sends.max(1) as f64).round();
    let bound = rss_before.map(|b| b + b / 10 + 8 * 1024);
    Ok(json!({
        "test": "churn",
        "duration_s": spec.duration.as_secs(), "wave_agents": spec.agents,
        "payload_bytes": spec.payload_bytes, "settle_s": spec.settle.as_secs(),
        "waves": wave, "sends": sends, "waves_s": waves_s,
        "message_events_per_send": per_send(message_events),
        "message_bytes_per_send": per_send(message_bytes),
        "store_bytes_per_send": store_growth.map(per_send),
        "rss_before_kb": rss_before, "rss_after_waves_kb": rss_waves, "rss_peak_kb": peak,
        "rss_after_settle_kb": rss_after,
        "rss_bound_kb": bound,
        "rss_back_within_bound": match (rss_after, bound) {
            (Some(a), Some(b)) => Some(a <= b),
            _ => None,
        },
        "tables_before": tables_before, "tables_after_waves": tables_waves,
        "tables_after_settle": tables_after,
    }))
}

// ---------------------------------------------------------------------------------------------
// Main

fn main() {
    let args = Args::parse_from(std::env::args().filter(|a| {
        !matches!(
            a.as_str(),
            "--nocapture" | "--quiet" | "-q" | "--show-output" | "--ignored"
        )
    }));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if let Err(e) = runtime.block_on(run(args)) {
        eprintln!("soak: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Res<()> {
    let full = args.bench;
    let (server, url, pid) = match &args.url {
        Some(url) => {
            let host = url
                .strip_prefix("ws://")
                .ok_or("--url must be ws://127.0.0.1:PORT/")?;
            if !(host.starts_with("127.0.0.1:") || host.starts_with("localhost:")) {
                return Err("the soak only talks to loopback".into());
            }
            (None, url.clone(), args.server_pid)
        }
        None => {
            let config = map_router::server::Config {
                listen: vec!["127.0.0.1:0".parse().expect("valid address")],
                ..Default::default()
            };
            let server = map_router::server::Server::start(config)
                .await
                .map_err(|e| format!("cannot start map-router: {e}"))?;
            let url = format!("ws://{}/", server.local_addrs()[0]);
            (Some(server), url, Some(std::process::id()))
        }
    };
    let tests: Vec<&str> = if args.tests.is_empty() {
        vec!["items", "churn"]
    } else {
        args.tests.iter().map(String::as_str).collect()
    };
    for test in tests {
        let line = match test {
            "items" => {
                let spec = if full {
                    ItemsSpec {
                        tasks: args.tasks,
                        turns: args.turns,
                        checkpoints: args.checkpoints,
                        conversation_turns: args.conversation_turns,
                        owners: args.owners,
                        window: args.window,
                        page: args.page,
                        gets: args.gets,
                    }
                } else {
                    ItemsSpec {
                        tasks: 50,
                        turns: 40,
                        checkpoints: 30,
                        conversation_turns: 15,
                        owners: 2,
                        window: 8,
                        page: 7,
                        gets: 10,
                    }
                };
                let line = items(&url, pid, &spec).await?;
                if !full
                    && (line["tasks_read"] != json!(spec.tasks)
                        || line["turns_read"] != json!(spec.turns)
                        || line["checkpoints_read"] != json!(spec.checkpoints))
                {
                    return Err(format!("items read back do not add up: {line}"));
                }
                line
            }
            "churn" => {
                let spec = ChurnSpec {
                    duration: Duration::from_secs(if full { args.duration_s } else { 1 }),
                    agents: if full { args.wave_agents } else { 6 },
                    payload_bytes: args.payload_bytes,
                    settle: Duration::from_secs(if full { args.settle_s } else { 0 }),
                };
                let line = churn(&url, pid, &spec, args.data_dir.as_deref()).await?;
                if !full
                    && (line["sends"] == json!(0) || line["message_events_per_send"] == json!(0.0))
                {
                    return Err(format!("churn sends or events missing: {line}"));
                }
                line
            }
            other => return Err(format!("unknown soak {other}")),
        };
        println!("{line}");
    }
    if let Some(server) = server {
        server.shutdown().await;
    }
    Ok(())
}
