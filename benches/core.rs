//! The ceiling of the core, apart from the network: a router in-process (no sockets), K member
//! agents and S subscribers on in-process links, one publisher agent sending to their scope
//! with up to 64 sends in flight. Each message is K `map/message` deliveries plus S `map/event`
//! (`message_sent`) deliveries, all encoded to JSON text as they would be for a socket; the
//! links carry the text. Everything runs on one thread (a current-thread runtime), so the
//! figure is deliveries per second on one core, router, connection drivers and readers
//! included.
//!
//! Run with `cargo bench --bench core`. Criterion reports elements (deliveries) per second;
//! docs/performance.md gives the medians and ns per delivery.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use futures::{SinkExt, StreamExt};
use map_router::server::{Config, Server};
use map_router::transport::in_process::InProcessLink;
use serde_json::{json, Value};

/// The binary's allocator (src/main.rs), so that the figure is the shipped router's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sends in flight at most.
const WINDOW: u64 = 64;

async fn call(link: &mut InProcessLink, id: u64, method: &str, params: Value) -> Value {
    let req = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    link.tx.send(req.to_string()).await.expect("router up");
    loop {
        let text = link.rx.next().await.expect("router up");
        let v: Value = serde_json::from_str(&text).expect("JSON");
        if v["id"] == json!(id) {
            assert!(v.get("error").is_none(), "{method}: {v}");
            return v["result"].clone();
        }
    }
}

async fn connect(server: &Server, kind: &str) -> InProcessLink {
    let mut link = server.connect_in_process();
    call(
        &mut link,
        0,
        "map/connect",
        json!({"protocolVersion": 1, "participantType": kind}),
    )
    .await;
    link
}

/// A router with the publisher, K members in one scope and S subscribers to `message_sent`.
struct Setup {
    server: Server,
    publisher: InProcessLink,
    scope: String,
    /// How many members.
    k: usize,
    members: Vec<InProcessLink>,
    subscribers: Vec<InProcessLink>,
}

async fn setup(k: usize, s: usize) -> Setup {
    let mut config = Config {
        listen: Vec::new(),
        ..Config::default()
    };
    // Readers share the one thread with the router: let members fall behind by a whole
    // sample rather than have messages refused as backlogged (which `run` would report).
    config.router.pending_messages = 1 << 22;
    // In-process links have no loopback exemption: lift the per-connection request rate.
    config.limits.rate_per_connection = 0;
    config.limits.rate_per_principal = 0;
    let server = Server::start(config).await.expect("server");
    let mut publisher = connect(&server, "agent").await;
    call(
        &mut publisher,
        1,
        "map/agents/register",
        json!({"agentId": "pub"}),
    )
    .await;
    let created = call(
        &mut publisher,
        2,
        "map/scopes/create",
        json!({"scopeId": "core", "name": "core", "sendPolicy": "any"}),
    )
    .await;
    let scope = created["scope"]["id"]
        .as_str()
        .expect("scope id")
        .to_owned();
    let mut members = Vec::new();
    for i in 0..k {
        let mut m = connect(&server, "agent").await;
        let id = format!("m-{i}");
        call(&mut m, 1, "map/agents/register", json!({"agentId": id})).await;
        call(
            &mut m,
            2,
            "map/scopes/join",
            json!({"scopeId": scope, "agentId": id}),
        )
        .await;
        members.push(m);
    }
    let mut subscribers = Vec::new();
    for _ in 0..s {
        let mut c = connect(&server, "client").await;
        call(
            &mut c,
            1,
            "map/subscribe",
            json!({"filter": {"eventTypes": ["message_sent"]}}),
        )
        .await;
        subscribers.push(c);
    }
    Setup {
        server,
        publisher,
        scope,
        k,
        members,
        subscribers,
    }
}

/// Reads `n` notifications from a link; returns the link.
async fn drain(mut link: InProcessLink, n: u64) -> InProcessLink {
    for _ in 0..n {
        tokio::time::timeout(Duration::from_secs(30), link.rx.next())
            .await
            .expect("a delivery within 30 s")
            .expect("router up");
    }
    link
}

/// Reads one `map/send` answer and checks that it reached all `k` members (a refused delivery
/// would leave a reader waiting forever).
async fn answer(publisher: &mut InProcessLink, k: usize) {
    let text = tokio::time::timeout(Duration::from_secs(30), publisher.rx.next())
        .await
        .expect("an answer within 30 s")
        .expect("router up");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    let reached = v["result"]["delivered"].as_array().map_or(0, Vec::len);
    assert_eq!(reached, k, "a send did not reach every member: {text}");
}

/// Sends `n` messages with at most [`WINDOW`] unanswered while every member and subscriber
/// reads its `n` deliveries; returns the elapsed time.
async fn run(setup: &mut Setup, n: u64, next_id: &mut u64) -> Duration {
    let started = Instant::now();
    let readers: Vec<_> = setup
        .members
        .drain(..)
        .chain(setup.subscribers.drain(..))
        .map(|link| tokio::spawn(drain(link, n)))
        .collect();
    let publisher = &mut setup.publisher;
    let mut in_flight = 0;
    for i in 0..n {
        *next_id += 1;
        let frame = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"map/send","params":{{"to":{{"scope":"{}"}},"payload":{{"seq":{i},"text":"a small payload of about sixty bytes, as agents send"}}}}}}"#,
            *next_id, setup.scope
        );
        publisher.tx.send(frame).await.expect("router up");
        in_flight += 1;
        while in_flight >= WINDOW {
            answer(publisher, setup.k).await;
            in_flight -= 1;
        }
    }
    while in_flight > 0 {
        answer(publisher, setup.k).await;
        in_flight -= 1;
    }
    let mut links = Vec::with_capacity(readers.len());
    for r in readers {
        links.push(r.await.expect("reader"));
    }
    let elapsed = started.elapsed();
    // Members first, then subscribers, as they were chained.
    setup.subscribers = links.split_off(setup.k);
    setup.members = links;
    elapsed
}

/// (K members, S subscribers).
const SIZES: [(usize, usize); 2] = [(10, 2), (100, 10)];

fn core(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("core/fanout");
    for (k, s) in SIZES {
        let mut setup = runtime.block_on(setup(k, s));
        let mut next_id = 10;
        g.throughput(Throughput::Elements((k + s) as u64));
        g.bench_with_input(
            BenchmarkId::from_parameter(format!("{k}+{s}")),
            &(),
            |b, ()| {
                b.iter_custom(|iters| runtime.block_on(run(&mut setup, iters, &mut next_id)));
            },
        );
        let Setup {
            server,
            publisher,
            members,
            subscribers,
            ..
        } = setup;
        drop((publisher, members, subscribers));
        runtime.block_on(server.shutdown());
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
}

criterion_group! {
    name = benches;
    config = config();
    targets = core
}
criterion_main!(benches);
