//! Prometheus metrics: the families, the hot-path observations, and the text exposition of
//! `GET /metrics`.
//!
//! Owns [`Metrics`], one per server, shared as an `Arc` by whoever observes something the
//! router task does not see: request latencies and error codes (per connection, in
//! `router::rpc`), and store commits (on the store's writer thread, [`StoreMetrics`]). All of
//! these are atomics or one short lock per observation.
//!
//! Everything the router task owns (connections, sessions, agents, subscriptions, outboxes,
//! deliveries, supervised processes) is *not* counted here on the hot path: the router keeps
//! plain counters in its own state and, at scrape time, fills a [`RouterGauges`] snapshot, which
//! [`Metrics::render`] writes next to the registry's families. A scrape therefore costs one
//! router command, and a delivery costs one integer increment.
//!
//! The lowest layer: it knows no router, store or socket, only `prometheus-client`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

/// The content type of [`Metrics::render`]'s output (OpenMetrics text, which Prometheus
/// scrapes natively).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of [`classic_text`]'s output (Prometheus's text format 0.0.4).
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a scrape's `Accept` header asks for OpenMetrics (Prometheus itself lists it first);
/// anything else (`curl`, `promtool`, older scrapers, no header) gets the classic text format.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').any(|part| {
            let media = part.split(';').next().unwrap_or_default().trim();
            media.eq_ignore_ascii_case("application/openmetrics-text")
        })
    })
}

/// The same metrics in Prometheus's classic text format (0.0.4), from [`Metrics::render`]'s
/// OpenMetrics text: a counter family's `HELP` and `TYPE` name its `_total` samples (what
/// `promtool check metrics` and classic parsers read), and the OpenMetrics-only lines (`UNIT`,
/// `EOF`) are left out.
pub fn classic_text(openmetrics: &str) -> String {
    let mut counters: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.strip_suffix(" counter") {
                counters.insert(name);
            }
        }
    }
    let mut out = String::with_capacity(openmetrics.len() + counters.len() * 16);
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let header = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match header {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(prefix);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                if !tail.is_empty() {
                    out.push(' ');
                    out.push_str(tail);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The method label of requests whose method is not in the method table (its name is the
/// peer's input and is never used as a label).
pub const UNKNOWN_METHOD: &str = "unknown";

/// The method label of errors answered before a method was looked up (a malformed frame, a
/// rate-limited request).
pub const NO_METHOD: &str = "none";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    method: &'static str,
    code: i64,
}

/// What the trace exporter counts (`server::telemetry`): read at each scrape.
#[derive(Debug, Default)]
pub struct TelemetryCounts {
    /// Spans the collector accepted.
    pub exported: std::sync::atomic::AtomicU64,
    /// Spans lost: the export queue was full, or their export failed or timed out.
    pub dropped: std::sync::atomic::AtomicU64,
}

#[derive(Debug)]
struct TelemetryCollector(Arc<TelemetryCounts>);

impl Collector for TelemetryCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        counter(
            &mut e,
            "telemetry_spans_exported",
            "Spans the OTLP collector accepted (docs/traces.md)",
            self.0.exported.load(Relaxed),
        )?;
        counter(
            &mut e,
            "telemetry_spans_dropped",
            "Spans lost because the export queue was full or their export failed or timed out",
            self.0.dropped.load(Relaxed),
        )
    }
}

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    telemetry: Arc<TelemetryCounts>,
    registry: Registry,
    requests: Family<MethodLabels, Histogram>,
    errors: Family<ErrorLabels, Counter>,
    store: StoreMetrics,
    /// The router's snapshot for the scrape in progress (read by the registered collector).
    gauges: Arc<Mutex<Option<RouterGauges>>>,
    /// One scrape at a time (the snapshot slot is shared).
    scrape: tokio::sync::Mutex<()>,
}

/// What the store's writer thread observes: one histogram sample pair per committed group.
#[derive(Debug, Clone)]
pub struct StoreMetrics {
    commit_seconds: Histogram,
    batch_events: Histogram,
}

impl StoreMetrics {
    /// One committed transaction of `events` rows that took `elapsed` (retries included).
    pub fn observe_commit(&self, elapsed: Duration, events: usize) {
        self.commit_seconds.observe(elapsed.as_secs_f64());
        self.batch_events.observe(events as f64);
    }
}

impl Metrics {
    /// Fresh families, registered under the `map_` prefix.
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("map");
        let requests = Family::<MethodLabels, Histogram>::new_with_constructor(|| {
            // 50 µs .. 13 s.
            Histogram::new(exponential_buckets(0.000_05, 4.0, 10))
        });
        registry.register_with_unit(
            "request_duration",
            "Time from reading a request to its answer being ready, by method (a pipelined answer's wait for its commit is not included)",
            Unit::Seconds,
            requests.clone(),
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "request_errors",
            "Requests answered with an error, by method and JSON-RPC error code",
            errors.clone(),
        );
        let store = StoreMetrics {
            // 50 µs .. 3.3 s.
            commit_seconds: Histogram::new(exponential_buckets(0.000_05, 4.0, 9)),
            // 1 .. 4096 rows.
            batch_events: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
        };
        registry.register_with_unit(
            "store_commit_duration",
            "Time to commit one group of events to the durable store",
            Unit::Seconds,
            store.commit_seconds.clone(),
        );
        registry.register(
            "store_commit_batch_events",
            "Events per committed group",
            store.batch_events.clone(),
        );
        let telemetry = Arc::new(TelemetryCounts::default());
        registry.register_collector(Box::new(TelemetryCollector(telemetry.clone())));
        let gauges = Arc::new(Mutex::new(None));
        registry.register_collector(Box::new(RouterCollector {
            gauges: Arc::clone(&gauges),
        }));
        Arc::new(Self {
            telemetry,
            registry,
            requests,
            errors,
            store,
            gauges,
            scrape: tokio::sync::Mutex::new(()),
        })
    }

    /// The trace exporter's counts.
    pub fn telemetry(&self) -> Arc<TelemetryCounts> {
        self.telemetry.clone()
    }

    /// One request answered after `elapsed`; `error` is its error code, if it failed.
    /// `method` is a name from the method table, [`UNKNOWN_METHOD`] or [`NO_METHOD`].
    pub fn observe_request(&self, method: &'static str, elapsed: Duration, error: Option<i64>) {
        self.requests
            .get_or_create(&MethodLabels { method })
            .observe(elapsed.as_secs_f64());
        if let Some(code) = error {
            self.count_error(method, code);
        }
    }

    /// One error answered without a method call (a refused frame or a rate-limited request).
    pub fn count_error(&self, method: &'static str, code: i64) {
        self.errors
            .get_or_create(&ErrorLabels { method, code })
            .inc();
    }

    /// The handle the store's writer thread observes commits with.
    pub fn store(&self) -> StoreMetrics {
        self.store.clone()
    }

    /// The text exposition: the registry's families and the router's snapshot.
    pub async fn render(&self, router: RouterGauges) -> String {
        let _one = self.scrape.lock().await;
        *crate::sync::lock(&self.gauges) = Some(router);
        let mut out = String::with_capacity(8192);
        // NB. Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        *crate::sync::lock(&self.gauges) = None;
        out
    }
}

/// What the router reports at scrape time (filled on the router task).
#[derive(Debug, Clone, Default)]
pub struct RouterGauges {
    /// Attached connections by transport (`websocket`, `http`, `stdio`, `in_process`, `pipes`).
    pub connections: Vec<(&'static str, u64)>,
    /// Connections attached since start, by transport.
    pub connections_opened: Vec<(&'static str, u64)>,
    /// Sessions by transport (`detached` for one waiting in its resume window) and
    /// participant type.
    pub sessions: Vec<((&'static str, &'static str), u64)>,
    /// Registered agents by state (`custom` for any `x-` state).
    pub agents: Vec<(&'static str, u64)>,
    /// Events appended to the log since start.
    pub events_appended: u64,
    /// `map/event` deliveries queued to subscribers since start.
    pub event_deliveries: u64,
    /// `map/message` deliveries queued to agents since start.
    pub message_deliveries: u64,
    /// Frames waiting in all connection outboxes.
    pub outbox_frames: u64,
    /// The fullest outbox.
    pub outbox_frames_max: u64,
    /// Messages waiting for room in outboxes (behind full outboxes).
    pub pending_messages: u64,
    /// Subscriptions by state (`pending`, `live`, `paused`).
    pub subscriptions: Vec<(&'static str, u64)>,
    /// Overflow notices sent since start (a subscription fell behind retention).
    pub subscription_overflows: u64,
    /// Supervised processes the router tracks now.
    pub processes: u64,
    /// Supervised process exits since start, by reason (`stopped`, `exited`, `crashed`,
    /// `spawn_failed`).
    pub process_exits: Vec<(&'static str, u64)>,
    /// Supervised process restarts since start.
    pub process_restarts: u64,
    /// Trajectory checkpoints held.
    pub checkpoints: u64,
    /// Tasks held (the tasks extension).
    pub tasks: u64,
    /// Conversations held (the mail extension).
    pub conversations: u64,
    /// The sequence number the next event gets.
    pub log_next_seq: u64,
    /// Entries of the router's other tables and indexes, by table (timers, indexes, queues,
    /// caches): what must shrink back once sessions and agents are gone.
    pub tables: Vec<(&'static str, u64)>,
    /// Messages waiting for each peer system this router dials.
    pub federation_queued: Vec<(String, u64)>,
}

/// Writes the router's snapshot during an encode.
#[derive(Debug)]
struct RouterCollector {
    gauges: Arc<Mutex<Option<RouterGauges>>>,
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> std::fmt::Result {
    let c = ConstCounter::new(value);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> std::fmt::Result {
    let g = ConstGauge::new(value as i64);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

/// A family of one label.
fn family(
    e: &mut DescriptorEncoder,
    kind: MetricType,
    (name, help, label): (&str, &str, &'static str),
    values: &[(&'static str, u64)],
) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, kind)?;
    for (value, n) in values {
        let labels = [(label, *value)];
        match kind {
            MetricType::Counter => ConstCounter::new(*n).encode(m.encode_family(&labels)?)?,
            _ => ConstGauge::new(*n as i64).encode(m.encode_family(&labels)?)?,
        }
    }
    Ok(())
}

impl Collector for RouterCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let guard = crate::sync::lock(&self.gauges);
        let Some(g) = guard.as_ref() else {
            return Ok(());
        };
        let e = &mut e;
        family(
            e,
            MetricType::Gauge,
            (
                "connections",
                "Attached connections, by transport",
                "transport",
            ),
            &g.connections,
        )?;
        family(
            e,
            MetricType::Counter,
            (
                "connections_opened",
                "Connections attached since start, by transport",
                "transport",
            ),
            &g.connections_opened,
        )?;
        {
            let mut m = e.encode_descriptor(
                "sessions",
                "Sessions, by transport (detached: waiting in the resume window) and participant type",
                None,
                MetricType::Gauge,
            )?;
            for ((transport, kind), n) in &g.sessions {
                let labels = [("transport", *transport), ("participant_type", *kind)];
                ConstGauge::new(*n as i64).encode(m.encode_family(&labels)?)?;
            }
        }
        family(
            e,
            MetricType::Gauge,
            ("agents", "Registered agents, by state", "state"),
            &g.agents,
        )?;
        counter(
            e,
            "events_appended",
            "Events appended to the event log since start",
            g.events_appended,
        )?;
        gauge(
            e,
            "event_log_next_sequence",
            "The log position the next event gets",
            g.log_next_seq,
        )?;
        counter(
            e,
            "event_deliveries",
            "map/event notifications queued to subscribers since start",
            g.event_deliveries,
        )?;
        counter(
            e,
            "message_deliveries",
            "map/message notifications queued to agents since start",
            g.message_deliveries,
        )?;
        gauge(
            e,
            "outbox_frames",
            "Frames waiting in connection outboxes, summed",
            g.outbox_frames,
        )?;
        gauge(
            e,
            "outbox_frames_max",
            "Frames waiting in the fullest connection outbox",
            g.outbox_frames_max,
        )?;
        gauge(
            e,
            "pending_messages",
            "Messages waiting for room behind full outboxes",
            g.pending_messages,
        )?;
        family(
            e,
            MetricType::Gauge,
            (
                "subscriptions",
                "Event subscriptions, by state (paused: behind, waiting for room, credit or the store)",
                "state",
            ),
            &g.subscriptions,
        )?;
        counter(
            e,
            "subscription_overflows",
            "Overflow notices sent since start (a subscriber fell behind retention)",
            g.subscription_overflows,
        )?;
        gauge(
            e,
            "supervised_processes",
            "Supervised processes the router tracks",
            g.processes,
        )?;
        family(
            e,
            MetricType::Counter,
            (
                "process_exits",
                "Supervised process exits since start, by reason",
                "reason",
            ),
            &g.process_exits,
        )?;
        counter(
            e,
            "process_restarts",
            "Supervised processes restarted since start",
            g.process_restarts,
        )?;
        gauge(
            e,
            "trajectory_checkpoints",
            "Trajectory checkpoints held",
            g.checkpoints,
        )?;
        gauge(e, "tasks", "Tasks held (the tasks extension)", g.tasks)?;
        gauge(
            e,
            "conversations",
            "Conversations held (the mail extension)",
            g.conversations,
        )?;
        family(
            e,
            MetricType::Gauge,
            (
                "router_table_entries",
                "Entries of the router's tables and indexes (timers, indexes, queues, caches)",
                "table",
            ),
            &g.tables,
        )?;
        {
            let mut m = e.encode_descriptor(
                "federation_queued",
                "Messages waiting for a peer system (in the durable log) until its link routes them",
                None,
                MetricType::Gauge,
            )?;
            for (peer, n) in &g.federation_queued {
                let labels = [("peer", peer.as_str())];
                ConstGauge::new(*n as i64).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn renders_registry_and_snapshot_in_openmetrics_text() {
        let m = Metrics::new();
        m.observe_request("map/send", Duration::from_micros(120), None);
        m.observe_request("map/send", Duration::from_millis(2), Some(4001));
        m.count_error(NO_METHOD, -32600);
        m.store().observe_commit(Duration::from_micros(900), 17);
        let text = m
            .render(RouterGauges {
                connections: vec![("websocket", 3)],
                sessions: vec![(("websocket", "agent"), 2)],
                agents: vec![("active", 2)],
                event_deliveries: 41,
                ..RouterGauges::default()
            })
            .await;
        for line in [
            "map_request_duration_seconds_count{method=\"map/send\"} 2",
            "map_request_errors_total{method=\"map/send\",code=\"4001\"} 1",
            "map_request_errors_total{method=\"none\",code=\"-32600\"} 1",
            "map_store_commit_batch_events_sum 17.0",
            "map_connections{transport=\"websocket\"} 3",
            "map_sessions{transport=\"websocket\",participant_type=\"agent\"} 2",
            "map_agents{state=\"active\"} 2",
            "map_event_deliveries_total 41",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
        // The snapshot is not kept between scrapes.
        assert!(m.gauges.lock().unwrap().is_none());
    }
}
