//! Micro-benchmarks for the hot paths: frame decode, event encode, filter matching, fan-out
//! of one event to N filtered, permission-checked subscribers, and dispatch of a cheap method
//! through the whole stack (in-process transport, connection driver, router task).
//!
//! Run with `cargo bench --bench codec`. Report ratios and medians (docs/performance.md); the
//! machine is shared and noisy.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use map_router::protocol::capabilities::ParticipantType;
use map_router::protocol::event::{EventType, SubscriptionFilter};
use map_router::protocol::jsonrpc::classify;
use map_router::router::agents::registry::Registry;
use map_router::router::events::bus::{EventBus, SubState, Subscription};
use map_router::router::events::filter::CompiledFilter;
use map_router::router::events::log::{Audience, EventDraft, EventLog, FilterKeys, Retention};
use map_router::router::outbox::{outbox, CausedBy, Delivery, OutboxReceiver};
use map_router::router::scopes::table::Scopes;
use map_router::router::views::AgentView;
use map_router::router::ConnId;

const SEND: &str = r#"{"jsonrpc":"2.0","id":42,"method":"map/send","params":{"to":{"scope":"team"},"payload":{"text":"hello","n":1},"meta":{"correlationId":"c-1","priority":"high"}}}"#;

fn draft() -> EventDraft {
    EventDraft {
        kind: EventType::MessageDelivered,
        source: Some("agent-1".into()),
        data: r#"{"messageId":"01M80HY5C69CJBW54QZMBSQASG","from":"agent-1","deliveredTo":["agent-2"],"timestamp":1795315144070,"message":{"id":"01M80HY5C69CJBW54QZMBSQASG","from":"agent-1","to":{"scope":"team"},"timestamp":1795315144070,"payload":{"text":"hello","n":1}}}"#.into(),
        caused_by: vec![],
        keys: FilterKeys {
            scopes: vec!["team".into()],
            priority: Some("high".into()),
            ..FilterKeys::default()
        },
        audience: Audience::Everyone,
    }
}

/// The draft with one of four audiences in turn: everyone, named participants, an agent's
/// scope mates (checked against the registry), and both of the last two (a message between
/// agents): the permission checks of a real mix of events.
fn mixed_draft(k: usize) -> EventDraft {
    let mut d = draft();
    let named = || Audience::Participants {
        who: (0..8).map(|i| format!("p-{}", i * 3).into()).collect(),
    };
    let scoped = || Audience::Scoped {
        owner: Some("p-1".into()),
        scopes: vec!["team".into()],
    };
    d.audience = match k % 4 {
        0 => Audience::Everyone,
        1 => named(),
        2 => scoped(),
        _ => named().and(scoped()),
    };
    d
}

fn codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec");
    g.bench_function("classify_request", |b| {
        let raw: &serde_json::value::RawValue = serde_json::from_str(SEND).unwrap();
        b.iter(|| std::hint::black_box(classify(raw)));
    });
    g.bench_function("decode_send_params", |b| {
        b.iter(|| {
            let v: map_router::protocol::methods::messaging::SendParams =
                serde_json::from_str(r#"{"to":{"scope":"team"},"payload":{"text":"hello","n":1},"meta":{"correlationId":"c-1"}}"#).unwrap();
            std::hint::black_box(v)
        });
    });
    let mut log = EventLog::new(Retention {
        max_events: 1000,
        max_bytes: 1 << 24,
    });
    let rec = log.append(draft(), None);
    g.bench_function("encode_event_delivery", |b| {
        let d = Delivery {
            subscription: "01M80HY5AK95PT2NRGZR7TGR7V".into(),
            sequence: 12345,
            record: rec.clone(),
            caused_by: CausedBy::None,
        };
        let mut out = String::with_capacity(1024);
        b.iter(|| {
            out.clear();
            d.encode(&mut out);
            std::hint::black_box(out.len())
        });
    });
    g.finish();
}

fn filters(c: &mut Criterion) {
    let mut log = EventLog::new(Retention {
        max_events: 1000,
        max_bytes: 1 << 24,
    });
    let rec = log.append(draft(), None);
    let f: SubscriptionFilter = serde_json::from_str(
        r#"{"eventTypes":["message.*"],"scopes":["team"],"priorities":["high","urgent"]}"#,
    )
    .unwrap();
    let compiled = CompiledFilter::compile(Some(&f)).unwrap();
    c.bench_function("filter_match", |b| {
        b.iter(|| std::hint::black_box(compiled.matches(&rec, |_| None)))
    });
}

fn subscription(
    i: usize,
    conn: ConnId,
    outbox: map_router::router::outbox::Outbox,
) -> Subscription {
    // A mix: half match-all, a quarter filtered in, a quarter filtered out.
    let filter = match i % 4 {
        0 | 1 => None,
        2 => Some(r#"{"eventTypes":["message_delivered"]}"#),
        _ => Some(r#"{"eventTypes":["agent.*"]}"#),
    }
    .map(|j| serde_json::from_str::<SubscriptionFilter>(j).unwrap());
    Subscription {
        id: format!("sub-{i}").into(),
        session: format!("s-{i}").into(),
        conn,
        participant: format!("p-{i}").into(),
        participant_type: if i.is_multiple_of(10) {
            ParticipantType::System
        } else {
            ParticipantType::Client
        },
        agent: None,
        principal: None,
        policy: Default::default(),
        filter: CompiledFilter::compile(f_ref(&filter)).unwrap(),
        exclude_own: i.is_multiple_of(7),
        cursor: 0,
        start: 0,
        sequence: 0,
        acked: 0,
        window: None,
        overflow: Default::default(),
        disk_pending: false,
        disk_failures: 0,
        overflows: 0,
        state: SubState::Live,
        outbox,
    }
}

fn f_ref(f: &Option<SubscriptionFilter>) -> Option<&SubscriptionFilter> {
    f.as_ref()
}

/// A bus over a log of 4 096 events, for the fan-out benchmarks.
fn bus() -> EventBus {
    EventBus::new(EventLog::new(Retention {
        max_events: 4096,
        max_bytes: 1 << 26,
    }))
}

fn fanout(c: &mut Criterion) {
    let mut g = c.benchmark_group("fanout");
    for n in [1usize, 10, 100, 1000] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            let mut bus = bus();
            let registry = Registry::default();
            let scopes = Scopes::default();
            let mut receivers: Vec<OutboxReceiver> = Vec::new();
            for i in 0..n {
                let (tx, rx) = outbox(1 << 16);
                receivers.push(rx);
                bus.insert(subscription(i, ConnId(i as u64), tx));
            }
            let mut k = 0usize;
            b.iter(|| {
                k += 1;
                let rec = bus.log.append(mixed_draft(k), None);
                bus.publish(&rec, AgentView::new(&registry, &scopes));
                for rx in &mut receivers {
                    while rx.try_recv().is_some() {}
                }
            });
        });
    }
    g.finish();
}

/// 10 000 live subscriptions, each filtered to one scope (`scopes`) or one agent
/// (`fromAgents`) with ten subscriptions per scope or agent: an event matches 10 of them. What
/// an event costs (append, index, filters, permissions, the 10 queued deliveries): issue 48's
/// target is at most 5 µs.
fn fanout_filtered(c: &mut Criterion) {
    let mut g = c.benchmark_group("fanout_filtered");
    const N: usize = 10_000;
    for by in ["scope", "agent"] {
        g.throughput(Throughput::Elements(10));
        g.bench_function(BenchmarkId::new(by, N), |b| {
            let mut bus = bus();
            let registry = Registry::default();
            let scopes = Scopes::default();
            let mut receivers: Vec<OutboxReceiver> = Vec::new();
            for i in 0..N {
                let (tx, rx) = outbox(1 << 10);
                receivers.push(rx);
                let field = if by == "scope" {
                    "scopes"
                } else {
                    "fromAgents"
                };
                let filter: SubscriptionFilter = serde_json::from_str(&format!(
                    r#"{{"eventTypes":["message.*"],"{field}":["{by}-{}"]}}"#,
                    i / 10
                ))
                .unwrap();
                let mut sub = subscription(i, ConnId(i as u64), tx);
                sub.filter = CompiledFilter::compile(Some(&filter)).unwrap();
                sub.participant_type = ParticipantType::Client;
                sub.exclude_own = false;
                bus.insert(sub);
            }
            let mut k = 0usize;
            b.iter(|| {
                k += 1;
                let target = format!("{by}-{}", k % (N / 10));
                let mut d = draft();
                if by == "scope" {
                    d.keys.scopes = vec![target.as_str().into()];
                } else {
                    d.source = Some(target.as_str().into());
                }
                let rec = bus.log.append(d, None);
                bus.publish(&rec, AgentView::new(&registry, &scopes));
                for i in 0..10 {
                    let rx = &mut receivers[(k % (N / 10)) * 10 + i];
                    assert!(
                        rx.try_recv().is_some(),
                        "subscription {i} of {target} got the event"
                    );
                }
            });
        });
    }
    g.finish();
}

/// One `map/agents/list` request through an in-process connection: frame decode, dispatch
/// table, a hop to the router task and back, result encoding, the outbox and the writer.
fn dispatch(c: &mut Criterion) {
    use futures::{SinkExt, StreamExt};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (server, mut link) = runtime.block_on(async {
        let config = map_router::server::Config {
            listen: Vec::new(),
            ..Default::default()
        };
        let server = map_router::server::Server::start(config).await.unwrap();
        let mut link = server.connect_in_process();
        link.tx
            .send(r#"{"jsonrpc":"2.0","id":0,"method":"map/connect","params":{"protocolVersion":1,"participantType":"client"}}"#.into())
            .await
            .unwrap();
        link.rx.next().await.unwrap();
        (server, link)
    });
    c.bench_function("dispatch/agents_list", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let start = std::time::Instant::now();
                for i in 0..iters {
                    let frame = format!(
                        r#"{{"jsonrpc":"2.0","id":{},"method":"map/agents/list"}}"#,
                        i + 1
                    );
                    link.tx.send(frame).await.unwrap();
                    std::hint::black_box(link.rx.next().await.unwrap());
                }
                start.elapsed()
            })
        });
    });
    drop(link);
    runtime.block_on(server.shutdown());
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = codec, filters, fanout, fanout_filtered, dispatch
}
criterion_main!(benches);
