//! The load generator: drives a MAP server over real WebSocket connections on loopback and
//! prints one JSON line per test, with its parameters, on stdout.
//!
//! Tests (`--test`, repeatable; default all):
//! - `fanout`: P publisher agents send M messages (`map/send` to a scope, a window of requests in
//!   flight, optionally paced to `--rate`) to a scope of K member agents while S client
//!   subscribers watch the message events. Reports messages/s accepted, deliveries/s and
//!   end-to-end latency (a send timestamp in the payload, an HDR histogram), overall, to the
//!   agents and to the subscribers. Publishers, agents and subscribers may each connect to
//!   other nodes of a cluster (`--publisher-url`, `--agent-url`, `--subscriber-url`).
//! - `rtt`: `map/agents/list` round trips, sequential on one connection, then concurrent.
//! - `connections`: opens C idle sessions; time to connect all, and the server's VmRSS before
//!   and after (from `/proc/<pid>/status`).
//! - `slow`: the fan-out run twice, the second time with one more subscriber that never reads:
//!   the others' throughput with and without it, and the server's memory.
//! - `churn`: W waves of N agents join one scope, one of them sends a payload to it, then half
//!   leave cleanly (`map/disconnect`) and half drop their socket (their agents stay orphaned for
//!   the resume window, so later sends find more and more silent members). Reports what one send
//!   costs: events and bytes a subscriber to every event receives per send, and, with
//!   `--data-dir` (the server's), the growth of its store per send.
//!
//! It talks only to the server it is given (`--url ws://127.0.0.1:PORT/`); without `--url` it
//! starts map-router in this process on `127.0.0.1:0` (then RSS includes the generator).
//! It works against the TypeScript reference too (`benches/reference/server.mjs`): it reads
//! agent and scope ids from results rather than choosing them, and subscribes with a filter.
//!
//! Modes: `cargo bench --bench load -- [options]` passes `--bench` and runs at full size;
//! `cargo test --benches` runs it without `--bench`: a smoke run at tiny size against an
//! in-process server that checks that every line parses and every count adds up (never timing).
//! Every loop is bounded in count and every wait in time. `scripts/bench-compare.sh` runs it
//! against both servers; docs/performance.md has the figures.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

#[path = "common/latency.rs"]
mod latency;
use latency::{histogram, now_us, percentiles, record, Arrivals};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;
type Tx = SplitSink<Ws, Message>;
type Rx = SplitStream<Ws>;
type Res<T> = Result<T, String>;

/// Bound on one setup call or one frame wait.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on frames skipped while waiting for one response.
const MAX_SKIPPED_FRAMES: usize = 1_000_000;
/// Connection handshakes in flight at once in the `connections` test.
const CONNECT_PARALLELISM: usize = 128;

#[derive(Debug, Parser)]
#[command(name = "load", about = "MAP load generator (loopback only)")]
struct Args {
    /// Set by `cargo bench`: full-size run. Without it: the tiny smoke run with checks.
    #[arg(long)]
    bench: bool,
    /// Server to load (`ws://127.0.0.1:PORT/`). Default: map-router in this process.
    #[arg(long)]
    url: Option<String>,
    /// Process whose VmRSS is reported (default: this process when the server is in-process).
    #[arg(long)]
    server_pid: Option<u32>,
    /// Label for the server in the output.
    #[arg(long, default_value = "map-router")]
    server: String,
    /// Tests to run: fanout, rtt, connections, slow, churn (repeatable; default all).
    #[arg(long = "test")]
    tests: Vec<String>,
    /// Fan-out: agents in the scope (K).
    #[arg(long)]
    agents: Option<usize>,
    /// Fan-out: client subscribers (S).
    #[arg(long)]
    subscribers: Option<usize>,
    /// Fan-out: where the subscribers connect, in turn (repeatable; default `--url`): the
    /// standbys of a cluster serve subscriptions from the stream (docs/cluster.md).
    #[arg(long = "subscriber-url")]
    subscriber_urls: Vec<String>,
    /// Fan-out: where the publisher agents connect, in turn (repeatable; default `--url`): a
    /// standby relays their sends to the live node (cross-node messages).
    #[arg(long = "publisher-url")]
    publisher_urls: Vec<String>,
    /// Fan-out: where the member agents connect, in turn (repeatable; default `--url`): on a
    /// standby, the live node's deliveries reach them through their relay sessions.
    #[arg(long = "agent-url")]
    agent_urls: Vec<String>,
    /// Fan-out: publisher agents (P).
    #[arg(long)]
    publishers: Option<usize>,
    /// Fan-out: messages in total (M), split across publishers.
    #[arg(long)]
    messages: Option<u64>,
    /// Fan-out: target send rate in messages/s over all publishers (0: as fast as the window allows).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Fan-out: requests in flight per publisher.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Fan-out: padding bytes in each payload.
    #[arg(long)]
    payload_bytes: Option<usize>,
    /// Fan-out: subscribers watch every event (`all`) or only `message_sent` (`sent`, one per message).
    #[arg(long, default_value = "sent")]
    events: String,
    /// Round trips: calls in total per mode.
    #[arg(long)]
    calls: Option<u64>,
    /// Round trips: connections in the concurrent mode.
    #[arg(long)]
    concurrency: Option<usize>,
    /// Connections test: sessions to open (C).
    #[arg(long)]
    connections: Option<usize>,
    /// Churn: waves.
    #[arg(long)]
    waves: Option<usize>,
    /// Churn: agents per wave.
    #[arg(long)]
    wave_agents: Option<usize>,
    /// Churn: the server's data directory, to measure its store's growth per send.
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    /// Bound on each test, in seconds.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
}

fn rate(n: u64, d: Duration) -> f64 {
    if d.is_zero() {
        return 0.0;
    }
    (n as f64 / d.as_secs_f64()).round()
}

/// VmRSS of `pid` in kB, when it can be read.
fn rss_kb(pid: Option<u32>) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

// ---------------------------------------------------------------------------------------------
// One connection

/// A WebSocket JSON-RPC connection for setup calls; split for the measured phase.
struct Conn {
    tx: Tx,
    rx: Rx,
    next_id: u64,
}

impl Conn {
    async fn open(url: &str) -> Res<Self> {
        let (ws, _) = tokio::time::timeout(
            CALL_TIMEOUT,
            tokio_tungstenite::connect_async_with_config(url, None, true),
        )
        .await
        .map_err(|_| format!("connecting to {url} timed out"))?
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
        let (tx, rx) = ws.split();
        Ok(Self { tx, rx, next_id: 1 })
    }

    /// Opens a connection and sends `map/connect` as `kind` (`agent` or `client`).
    async fn session(url: &str, kind: &str, name: &str) -> Res<Self> {
        let mut c = Self::open(url).await?;
        c.call(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": kind, "name": name}),
        )
        .await?;
        Ok(c)
    }

    /// An agent session with one registered agent; returns the connection and the agent id.
    async fn agent(url: &str, name: &str) -> Res<(Self, String)> {
        let mut c = Self::session(url, "agent", name).await?;
        let r = c.call("map/agents/register", json!({"name": name})).await?;
        let id = r["agent"]["id"]
            .as_str()
            .ok_or_else(|| format!("register result without agent.id: {r}"))?
            .to_owned();
        Ok((c, id))
    }

    /// An agent session whose agent joined `scope`.
    async fn member(url: &str, name: &str, scope: &str) -> Res<Self> {
        let (mut c, id) = Self::agent(url, name).await?;
        c.call("map/scopes/join", json!({"scopeId": scope, "agentId": id}))
            .await?;
        Ok(c)
    }

    /// Creates a scope anyone may send to (`scopeId` `<prefix>-<pid>-<run>`; the reference
    /// ignores it) and returns the id the server gave it.
    async fn create_scope(&mut self, prefix: &str, run: u64) -> Res<String> {
        let created = self
            .call(
                "map/scopes/create",
                json!({"scopeId": format!("{prefix}-{}-{run}", std::process::id()), "name": prefix, "sendPolicy": "any"}),
            )
            .await?;
        created["scope"]["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("scopes/create result without scope.id: {created}"))
    }

    /// Sends a request and returns its result; notifications before the response are skipped.
    async fn call(&mut self, method: &str, params: Value) -> Res<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.tx
            .send(Message::text(frame.to_string()))
            .await
            .map_err(|e| format!("{method}: send failed: {e}"))?;
        for _ in 0..MAX_SKIPPED_FRAMES {
            let msg = tokio::time::timeout(CALL_TIMEOUT, self.rx.next())
                .await
                .map_err(|_| format!("{method}: no response in {CALL_TIMEOUT:?}"))?;
            let text = match msg {
                Some(Ok(Message::Text(t))) => t,
                Some(Ok(Message::Close(_))) | None => {
                    return Err(format!("{method}: connection closed"))
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(format!("{method}: {e}")),
            };
            let v: Value = serde_json::from_str(&text).map_err(|e| format!("bad JSON: {e}"))?;
            if v.get("id") == Some(&json!(id)) {
                if let Some(err) = v.get("error") {
                    return Err(format!("{method}: error {err}"));
                }
                return Ok(v.get("result").cloned().unwrap_or(Value::Null));
            }
        }
        Err(format!(
            "{method}: no response among {MAX_SKIPPED_FRAMES} frames"
        ))
    }
}

/// Runs `f(i)` for `0..n`, at most `parallel` at a time, and returns the results in order.
async fn parallel<T, F, Fut>(n: usize, parallel: usize, f: F) -> Vec<T>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    futures::stream::iter(0..n)
        .map(f)
        .buffered(parallel.max(1))
        .collect()
        .await
}

// ---------------------------------------------------------------------------------------------
// Fan-out

#[derive(Debug, Clone)]
struct FanoutSpec {
    agents: usize,
    subscribers: usize,
    publishers: usize,
    messages: u64,
    rate: f64,
    window: usize,
    payload_bytes: usize,
    all_events: bool,
    /// Subscribers that subscribe and then never read.
    laggards: usize,
}

impl FanoutSpec {
    fn params(&self) -> Value {
        json!({
            "agents": self.agents,
            "subscribers": self.subscribers,
            "publishers": self.publishers,
            "messages": self.messages,
            "rate": self.rate,
            "window": self.window,
            "payload_bytes": self.payload_bytes,
            "events": if self.all_events { "all" } else { "sent" },
            "laggards": self.laggards,
        })
    }

    /// Frames each subscriber should get per message.
    fn events_per_message(&self) -> u64 {
        if self.all_events {
            // message_sent + one message_delivered listing the scope's members (map-router;
            // the reference sends one per recipient, so its readers stop early).
            1 + u64::from(self.agents > 0)
        } else {
            1
        }
    }

    fn expected_deliveries(&self) -> u64 {
        self.messages * (self.agents as u64 + self.subscribers as u64 * self.events_per_message())
    }
}

/// Counts frames whose method is `marker` until `expected` arrived or `stop` flips; records the
/// latency of each one carrying a `"bts":` send timestamp.
async fn read_deliveries(
    mut rx: Rx,
    marker: &'static str,
    expected: u64,
    mut stop: watch::Receiver<bool>,
) -> Arrivals {
    let mut out = Arrivals::new();
    while out.count < expected {
        let msg = tokio::select! {
            m = rx.next() => m,
            _ = stop.changed() => break,
        };
        let text = match msg {
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(_)) => continue,
            _ => break,
        };
        if text.contains(marker) {
            out.saw(&text);
        }
    }
    out
}

/// What one publisher did.
struct PublisherOut {
    accepted: u64,
    errors: u64,
    ack: Histogram<u64>,
    last: Option<Instant>,
}

/// Sends `n` messages to `scope` with at most `window` unanswered, paced to one per `interval`.
async fn publish(
    conn: Conn,
    scope: String,
    n: u64,
    window: usize,
    interval: Option<Duration>,
    padding: Arc<str>,
    start: Instant,
) -> Res<PublisherOut> {
    let Conn {
        mut tx,
        mut rx,
        next_id,
    } = conn;
    let permits = Arc::new(Semaphore::new(window.max(1)));
    let sent_at = Arc::new(std::sync::Mutex::new(VecDeque::<u64>::with_capacity(
        window,
    )));
    let reader = {
        let permits = permits.clone();
        let sent_at = sent_at.clone();
        tokio::spawn(async move {
            let mut out = PublisherOut {
                accepted: 0,
                errors: 0,
                ack: histogram(),
                last: None,
            };
            while out.accepted + out.errors < n {
                let msg = match tokio::time::timeout(CALL_TIMEOUT, rx.next()).await {
                    Ok(Some(Ok(Message::Text(t)))) => t,
                    Ok(Some(Ok(_))) => continue,
                    _ => break,
                };
                // Responses have no method (a map/send result holds no such key); skip anything
                // else, though publishers are sent no notifications.
                if msg.contains("\"method\":") {
                    continue;
                }
                if msg.contains("\"error\":") {
                    out.errors += 1;
                } else if msg.contains("\"result\":") {
                    out.accepted += 1;
                } else {
                    continue;
                }
                let now = now_us();
                out.last = Some(Instant::now());
                // NB. Both servers answer one connection's requests in order.
                if let Some(t) = sent_at.lock().expect("not poisoned").pop_front() {
                    record(&mut out.ack, now.saturating_sub(t));
                }
                permits.add_permits(1);
            }
            out
        })
    };
    for i in 0..n {
        if let Some(every) = interval {
            tokio::time::sleep_until((start + every.mul_f64(i as f64)).into()).await;
        }
        match tokio::time::timeout(CALL_TIMEOUT, permits.acquire()).await {
            Ok(Ok(p)) => p.forget(),
            _ => break,
        }
        let ts = now_us();
        sent_at.lock().expect("not poisoned").push_back(ts);
        let frame = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"map/send","params":{{"to":{{"scope":"{scope}"}},"payload":{{"bts":{ts},"seq":{i},"pad":"{padding}"}}}}}}"#,
            next_id + i
        );
        if tx.send(Message::text(frame)).await.is_err() {
            break;
        }
    }
    let out = reader.await.map_err(|e| e.to_string())?;
    drop(tx);
    Ok(out)
}

static RUN: AtomicU64 = AtomicU64::new(0);

/// Whether `url` is `ws://` to loopback.
fn loopback(url: &str) -> bool {
    url.strip_prefix("ws://")
        .is_some_and(|h| h.starts_with("127.0.0.1:") || h.starts_with("localhost:"))
}

/// Where each kind of fan-out connection connects, in turn (loopback URLs, none empty).
#[derive(Debug, Clone, Copy)]
struct Places<'a> {
    publishers: &'a [String],
    agents: &'a [String],
    subscribers: &'a [String],
}

impl<'a> Places<'a> {
    /// Everything on one node.
    fn one(url: &'a [String]) -> Self {
        Self {
            publishers: url,
            agents: url,
            subscribers: url,
        }
    }
}

async fn fanout(
    places: Places<'_>,
    spec: &FanoutSpec,
    pid: Option<u32>,
    limit: Duration,
) -> Res<Value> {
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let deadline = Instant::now() + limit;
    // Setup: publishers (the first creates the scope), members, subscribers.
    let mut publishers = Vec::new();
    for p in 0..spec.publishers.max(1) {
        let url = &places.publishers[p % places.publishers.len()];
        let (c, _) = Conn::agent(url, &format!("bench-pub-{run}-{p}")).await?;
        publishers.push(c);
    }
    let scope = publishers[0].create_scope("bench", run).await?;
    let scope_ref = &scope;
    let agents = parallel(spec.agents, 32, |i| async move {
        let url = &places.agents[i % places.agents.len()];
        Conn::member(url, &format!("bench-agent-{run}-{i}"), scope_ref).await
    })
    .await
    .into_iter()
    .collect::<Res<Vec<_>>>()?;
    let filter = if spec.all_events {
        json!({})
    } else {
        json!({"eventTypes": ["message.sent"]})
    };
    let subscribe = |i: usize, tag: &'static str| {
        let filter = filter.clone();
        let url = places.subscribers[i % places.subscribers.len()].as_str();
        async move {
            let mut c = Conn::session(url, "client", &format!("bench-{tag}-{run}-{i}")).await?;
            c.call("map/subscribe", json!({ "filter": filter })).await?;
            Res::Ok(c)
        }
    };
    let subscribers = parallel(spec.subscribers, 32, |i| subscribe(i, "sub"))
        .await
        .into_iter()
        .collect::<Res<Vec<_>>>()?;
    let laggards = parallel(spec.laggards, 8, |i| subscribe(i, "laggard"))
        .await
        .into_iter()
        .collect::<Res<Vec<_>>>()?;

    let rss_before = rss_kb(pid);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut readers = Vec::new();
    let mut keep = Vec::new(); // write halves stay open while measuring
    for c in agents {
        keep.push(c.tx);
        readers.push(tokio::spawn(read_deliveries(
            c.rx,
            "\"map/message\"",
            spec.messages,
            stop_rx.clone(),
        )));
    }
    let agent_readers = readers.len();
    for c in subscribers {
        keep.push(c.tx);
        readers.push(tokio::spawn(read_deliveries(
            c.rx,
            "\"map/event\"",
            spec.messages * spec.events_per_message(),
            stop_rx.clone(),
        )));
    }

    // Measured phase.
    let padding: Arc<str> = "x".repeat(spec.payload_bytes).into();
    let per = spec.messages / publishers.len() as u64;
    let extra = spec.messages % publishers.len() as u64;
    let interval =
        (spec.rate > 0.0).then(|| Duration::from_secs_f64(publishers.len() as f64 / spec.rate));
    let start = Instant::now();
    let mut pubs = Vec::new();
    for (p, c) in publishers.into_iter().enumerate() {
        let n = per + u64::from((p as u64) < extra);
        pubs.push(tokio::spawn(publish(
            c,
            scope.clone(),
            n,
            spec.window,
            interval,
            padding.clone(),
            start,
        )));
    }
    let mut accepted = 0;
    let mut errors = 0;
    let mut ack = histogram();
    let mut send_end = start;
    for p in pubs {
        let out = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), p)
            .await
            .map_err(|_| "publishers did not finish in time".to_owned())?
            .map_err(|e| e.to_string())??;
        accepted += out.accepted;
        errors += out.errors;
        ack.add(&out.ack).expect("same bounds");
        send_end = send_end.max(out.last.unwrap_or(start));
    }
    // Give deliveries until the deadline (at most 30 s more) to arrive, then stop the readers.
    let drain = deadline
        .saturating_duration_since(Instant::now())
        .min(Duration::from_secs(30));
    let stopper = tokio::spawn(async move {
        tokio::time::sleep(drain).await;
        let _ = stop_tx.send(true);
    });
    let mut deliveries = 0;
    let mut latency = histogram();
    let mut event_latency = histogram();
    let mut agent_latency = histogram();
    let mut end = send_end;
    for (i, r) in readers.into_iter().enumerate() {
        let out = r.await.map_err(|e| e.to_string())?;
        deliveries += out.count;
        latency.add(&out.latency).expect("same bounds");
        if i >= agent_readers {
            event_latency.add(&out.latency).expect("same bounds");
        } else {
            agent_latency.add(&out.latency).expect("same bounds");
        }
        end = end.max(out.last.unwrap_or(start));
    }
    stopper.abort();
    let rss_after = rss_kb(pid);
    drop(keep);
    drop(laggards);
    let expected = spec.expected_deliveries();
    let mut line = json!({
        "test": "fanout",
        "accepted": accepted,
        "errors": errors,
        "deliveries": deliveries,
        "expected_deliveries": expected,
        "complete": deliveries == expected && accepted == spec.messages,
        "send_s": (send_end - start).as_secs_f64(),
        "duration_s": (end - start).as_secs_f64(),
        "msgs_per_s": rate(accepted, send_end - start),
        "deliveries_per_s": rate(deliveries, end - start),
        "latency_ms": percentiles(&latency),
        "event_latency_ms": percentiles(&event_latency),
        "agent_latency_ms": percentiles(&agent_latency),
        "subscriber_nodes": places.subscribers.len(),
        "publisher_nodes": places.publishers.len(),
        "agent_nodes": places.agents.len(),
        "ack_ms": percentiles(&ack),
        "rss_before_kb": rss_before,
        "rss_after_kb": rss_after,
    });
    merge(&mut line, spec.params());
    Ok(line)
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

// ---------------------------------------------------------------------------------------------
// Round trips

async fn round_trips(conn: &mut Conn, calls: u64, h: &mut Histogram<u64>) -> Res<u64> {
    let mut ok = 0;
    for _ in 0..calls {
        let t = now_us();
        conn.call("map/agents/list", json!({})).await?;
        record(h, now_us() - t);
        ok += 1;
    }
    Ok(ok)
}

async fn rtt(url: &str, calls: u64, concurrency: usize) -> Res<Vec<Value>> {
    let mut lines = Vec::new();
    // Sequential: one connection, one call at a time (after a short warm-up).
    let mut c = Conn::session(url, "client", "bench-rtt").await?;
    round_trips(&mut c, calls.min(100), &mut histogram()).await?;
    let mut h = histogram();
    let t = Instant::now();
    let ok = round_trips(&mut c, calls, &mut h).await?;
    lines.push(json!({
        "test": "rtt", "mode": "sequential", "method": "map/agents/list",
        "connections": 1, "calls": calls, "ok": ok,
        "calls_per_s": rate(ok, t.elapsed()), "latency_ms": percentiles(&h),
    }));
    // Concurrent: `concurrency` connections, each one call at a time.
    let conns = parallel(concurrency, 32, |i| async move {
        Conn::session(url, "client", &format!("bench-rtt-{i}")).await
    })
    .await
    .into_iter()
    .collect::<Res<Vec<_>>>()?;
    let each = (calls / concurrency.max(1) as u64).max(1);
    let t = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let mut h = histogram();
                let ok = round_trips(&mut c, each, &mut h).await;
                ok.map(|ok| (ok, h))
            })
        })
        .collect();
    let mut h = histogram();
    let mut ok = 0;
    for task in tasks {
        let (n, part) = task.await.map_err(|e| e.to_string())??;
        ok += n;
        h.add(&part).expect("same bounds");
    }
    lines.push(json!({
        "test": "rtt", "mode": "concurrent", "method": "map/agents/list",
        "connections": concurrency, "calls": each * concurrency as u64, "ok": ok,
        "calls_per_s": rate(ok, t.elapsed()), "latency_ms": percentiles(&h),
    }));
    Ok(lines)
}

// ---------------------------------------------------------------------------------------------
// Idle connections

async fn connections(url: &str, n: usize, pid: Option<u32>) -> Res<Value> {
    let rss_before = rss_kb(pid);
    let t = Instant::now();
    let results = parallel(n, CONNECT_PARALLELISM, |i| async move {
        Conn::session(url, "client", &format!("bench-idle-{i}")).await
    })
    .await;
    let connect_s = t.elapsed().as_secs_f64();
    let mut first_error = None;
    let mut held = Vec::with_capacity(n);
    for r in results {
        match r {
            Ok(c) => held.push(c),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    // Let the server settle (buffers, lazily freed memory) before reading its RSS.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after = rss_kb(pid);
    let connected = held.len();
    drop(held);
    let per = match (rss_before, rss_after) {
        (Some(b), Some(a)) if connected > 0 => {
            Some((a.saturating_sub(b) * 1024) / connected as u64)
        }
        _ => None,
    };
    Ok(json!({
        "test": "connections", "connections": n, "connected": connected,
        "failed": n - connected, "first_error": first_error,
        "connect_s": connect_s, "rss_before_kb": rss_before, "rss_after_kb": rss_after,
        "bytes_per_connection": per,
    }))
}

// ---------------------------------------------------------------------------------------------
// Slow consumer

async fn slow(url: &str, spec: &FanoutSpec, pid: Option<u32>, limit: Duration) -> Res<Value> {
    let here = [url.to_owned()];
    let baseline = fanout(Places::one(&here), spec, pid, limit).await?;
    let lag = FanoutSpec {
        laggards: 1,
        ..spec.clone()
    };
    let with = fanout(Places::one(&here), &lag, pid, limit).await?;
    let ratio = |k: &str| {
        let a = baseline[k].as_f64().unwrap_or(0.0);
        let b = with[k].as_f64().unwrap_or(0.0);
        if a > 0.0 {
            ((b / a) * 1000.0).round() / 1000.0
        } else {
            0.0
        }
    };
    let mut line = json!({
        "test": "slow",
        "deliveries_per_s_ratio": ratio("deliveries_per_s"),
        "msgs_per_s_ratio": ratio("msgs_per_s"),
        "baseline": baseline,
        "with_laggard": with,
    });
    merge(&mut line, spec.params());
    Ok(line)
}

// ---------------------------------------------------------------------------------------------
// Churn

#[derive(Debug, Clone)]
struct ChurnSpec {
    waves: usize,
    agents: usize,
    payload_bytes: usize,
}

/// Bytes of the files under `dir` (recursively).
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

/// What the churn observer received: `map/event` frames and their bytes, all and message
/// events (`message_*`, `message.*`) only.
#[derive(Default)]
struct Observed {
    frames: u64,
    bytes: u64,
    message_frames: u64,
    message_bytes: u64,
}

/// Counts `map/event` frames and their bytes until `stop` flips.
async fn read_events(mut rx: Rx, mut stop: watch::Receiver<bool>) -> Observed {
    let mut o = Observed::default();
    loop {
        let msg = tokio::select! {
            m = rx.next() => m,
            _ = stop.changed() => break,
        };
        match msg {
            Some(Ok(Message::Text(t))) if t.contains("\"map/event\"") => {
                o.frames += 1;
                o.bytes += t.len() as u64;
                if t.contains("\"type\":\"message") {
                    o.message_frames += 1;
                    o.message_bytes += t.len() as u64;
                }
            }
            Some(Ok(_)) => {}
            _ => break,
        }
    }
    o
}

async fn churn(
    url: &str,
    spec: &ChurnSpec,
    data_dir: Option<&std::path::Path>,
    pid: Option<u32>,
    limit: Duration,
) -> Res<Value> {
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let deadline = Instant::now() + limit;
    let (mut owner, _) = Conn::agent(url, &format!("churn-owner-{run}")).await?;
    let scope = owner.create_scope("churn", run).await?;
    let mut observer = Conn::session(url, "client", &format!("churn-observer-{run}")).await?;
    observer
        .call("map/subscribe", json!({"filter": {}}))
        .await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let Conn {
        tx: observer_tx,
        rx,
        ..
    } = observer;
    let reader = tokio::spawn(read_events(rx, stop_rx));
    let store_before = data_dir.map(dir_bytes);
    let padding = "x".repeat(spec.payload_bytes);
    let start = Instant::now();
    let (mut sends, mut delivered) = (0u64, 0u64);
    for wave in 0..spec.waves {
        if Instant::now() > deadline {
            return Err(format!(
                "churn: wave {wave} of {} past the time limit",
                spec.waves
            ));
        }
        let scope_ref = &scope;
        let members = parallel(spec.agents, 32, |i| async move {
            Conn::member(url, &format!("churn-{run}-{wave}-{i}"), scope_ref).await
        })
        .await
        .into_iter()
        .collect::<Res<Vec<_>>>()?;
        let mut members = members.into_iter();
        let Some(mut sender) = members.next() else {
            continue;
        };
        let r = sender
            .call(
                "map/send",
                json!({"to": {"scope": scope}, "payload": {"wave": wave, "pad": padding}}),
            )
            .await?;
        sends += 1;
        delivered += r["delivered"].as_array().map_or(0, |a| a.len() as u64);
        // Half leave cleanly, half drop their socket.
        for (i, mut c) in std::iter::once(sender).chain(members).enumerate() {
            if i % 2 == 0 {
                c.call("map/disconnect", json!({})).await?;
                let _ = c.tx.close().await;
            } else {
                drop(c);
            }
        }
    }
    let send_s = start.elapsed().as_secs_f64();
    // Let the last events reach the observer and the store commit them.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = stop_tx.send(true);
    let seen = tokio::time::timeout(CALL_TIMEOUT, reader)
        .await
        .map_err(|_| "churn: observer did not stop".to_owned())?
        .map_err(|e| e.to_string())?;
    drop(observer_tx);
    let store_after = data_dir.map(dir_bytes);
    let per_send = |n: u64| {
        if sends == 0 {
            0.0
        } else {
            (n as f64 / sends as f64).round()
        }
    };
    let store_growth = match (store_before, store_after) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    Ok(json!({
        "test": "churn",
        "waves": spec.waves,
        "wave_agents": spec.agents,
        "payload_bytes": spec.payload_bytes,
        "sends": sends,
        "delivered": delivered,
        "send_s": send_s,
        "observer_events": seen.frames,
        "observer_bytes": seen.bytes,
        "observer_events_per_send": per_send(seen.frames),
        "observer_bytes_per_send": per_send(seen.bytes),
        "message_events_per_send": per_send(seen.message_frames),
        "message_bytes_per_send": per_send(seen.message_bytes),
        "store_bytes": store_growth,
        "store_bytes_per_send": store_growth.map(per_send),
        "rss_after_kb": rss_kb(pid),
    }))
}

// ---------------------------------------------------------------------------------------------
// Main

/// Sizes for the full run and for the smoke run.
struct Sizes {
    fanout: FanoutSpec,
    slow: FanoutSpec,
    calls: u64,
    concurrency: usize,
    connections: usize,
    churn: ChurnSpec,
}

fn sizes(args: &Args) -> Sizes {
    let full = args.bench;
    let fanout = FanoutSpec {
        agents: args.agents.unwrap_or(if full { 10 } else { 3 }),
        subscribers: args.subscribers.unwrap_or(2),
        publishers: args.publishers.unwrap_or(1),
        messages: args.messages.unwrap_or(if full { 20_000 } else { 50 }),
        rate: args.rate,
        window: args.window,
        payload_bytes: args.payload_bytes.unwrap_or(64),
        all_events: args.events == "all",
        laggards: 0,
    };
    let slow = FanoutSpec {
        messages: args.messages.unwrap_or(if full { 20_000 } else { 200 }),
        payload_bytes: args.payload_bytes.unwrap_or(if full { 1024 } else { 256 }),
        ..fanout.clone()
    };
    Sizes {
        fanout,
        slow,
        calls: args.calls.unwrap_or(if full { 5_000 } else { 50 }),
        concurrency: args.concurrency.unwrap_or(if full { 8 } else { 2 }),
        connections: args.connections.unwrap_or(if full { 1_000 } else { 20 }),
        churn: ChurnSpec {
            waves: args.waves.unwrap_or(if full { 40 } else { 4 }),
            agents: args.wave_agents.unwrap_or(if full { 40 } else { 6 }),
            payload_bytes: args.payload_bytes.unwrap_or(512),
        },
    }
}

/// Smoke-run checks: the counts add up (never timing).
fn check(line: &Value) -> Res<()> {
    let text = line.to_string();
    let parsed: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let fail = |what: &str| Err(format!("{what}: {text}"));
    match parsed["test"].as_str() {
        Some("fanout") => {
            if parsed["complete"] != json!(true) || parsed["errors"] != json!(0) {
                return fail("fan-out counts do not add up");
            }
            if parsed["latency_ms"]["count"] != parsed["deliveries"] {
                return fail("a delivery without a latency");
            }
        }
        Some("rtt") => {
            if parsed["ok"] != parsed["calls"] {
                return fail("round trips missing");
            }
        }
        Some("connections") => {
            if parsed["connected"] != parsed["connections"] {
                return fail("connections failed");
            }
        }
        Some("slow") => {
            check(&parsed["baseline"])?;
            check(&parsed["with_laggard"])?;
        }
        Some("churn") => {
            if parsed["sends"] != parsed["waves"] || parsed["observer_events"] == json!(0) {
                return fail("churn sends or events missing");
            }
        }
        _ => return fail("unknown test"),
    }
    Ok(())
}

fn main() {
    // `cargo test` may pass harness flags; only ours are parsed.
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
        eprintln!("load: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Res<()> {
    let sizes = sizes(&args);
    let limit = Duration::from_secs(args.timeout_s);
    let (server, url, pid) = match &args.url {
        Some(url) => {
            let host = url
                .strip_prefix("ws://")
                .ok_or("--url must be ws://127.0.0.1:PORT/")?;
            if !loopback(url) {
                return Err("the load generator only talks to loopback".into());
            }
            let _ = host;
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
            let pid = args.server_pid.or(Some(std::process::id()));
            (Some(server), url, pid)
        }
    };
    let or_url = |urls: &[String], flag: &str| -> Res<Vec<String>> {
        if !urls.iter().all(|u| loopback(u)) {
            return Err(format!(
                "{flag} must be ws://127.0.0.1:PORT/ (loopback only)"
            ));
        }
        Ok(if urls.is_empty() {
            vec![url.clone()]
        } else {
            urls.to_vec()
        })
    };
    let sub_urls = or_url(&args.subscriber_urls, "--subscriber-url")?;
    let pub_urls = or_url(&args.publisher_urls, "--publisher-url")?;
    let agent_urls = or_url(&args.agent_urls, "--agent-url")?;
    let places = Places {
        publishers: &pub_urls,
        agents: &agent_urls,
        subscribers: &sub_urls,
    };
    let tests: Vec<&str> = if args.tests.is_empty() {
        vec!["rtt", "fanout", "slow", "connections", "churn"]
    } else {
        args.tests.iter().map(String::as_str).collect()
    };
    let label = if server.is_some() {
        format!("{} (in-process)", args.server)
    } else {
        args.server.clone()
    };
    for test in tests {
        let lines = match test {
            "fanout" => vec![fanout(places, &sizes.fanout, pid, limit).await?],
            "rtt" => rtt(&url, sizes.calls, sizes.concurrency).await?,
            "connections" => vec![connections(&url, sizes.connections, pid).await?],
            "slow" => vec![slow(&url, &sizes.slow, pid, limit).await?],
            "churn" => vec![churn(&url, &sizes.churn, args.data_dir.as_deref(), pid, limit).await?],
            other => return Err(format!("unknown test {other}")),
        };
        for mut line in lines {
            merge(&mut line, json!({"server": label, "full": args.bench}));
            println!("{line}");
            if !args.bench {
                check(&line)?;
            }
        }
    }
    if let Some(server) = server {
        server.shutdown().await;
    }
    Ok(())
}
