//! The span exporter: the router's spans leave the process here, off its hot path.
//!
//! Owns: the bounded queue between the router and the export task ([`Exporter::offer`] never
//! waits: a full queue drops the span and counts it), the export task (batches of at most
//! `batch` spans, sent when full or after `delay`, each export under its `timeout`), the
//! counts (`map_telemetry_spans_exported_total`, `map_telemetry_spans_dropped_total`) and the
//! warning about lost spans, logged at most once a minute.
//!
//! Spans are converted to the OpenTelemetry SDK's `SpanData` and posted by
//! `opentelemetry-otlp`'s HTTP exporter (protobuf) through [`EgressHttp`], the gateways' one
//! outbound client: the collector's URL passes the egress check like any outbound URL (the
//! operator's configured origin, and nothing else).

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind as OtelKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue, Value};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};
use opentelemetry_sdk::Resource;
use tokio::sync::mpsc;

use super::config::Resolved;
use crate::gateway::egress::client::{self, Body, Waits};
use crate::gateway::egress::{AllowList, Allowed};
use crate::metrics::TelemetryCounts as Counts;
use crate::router::traces::{AttrValue, Span, SpanKind, SpanSink};

/// At most one warning about lost spans per this long.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The router's side of the exporter: a [`SpanSink`] over a bounded queue.
#[derive(Debug)]
pub struct Exporter {
    tx: mpsc::Sender<Span>,
    counts: Arc<Counts>,
    warned: Arc<Mutex<Option<Instant>>>,
}

impl SpanSink for Exporter {
    fn offer(&self, span: Span) {
        if self.tx.try_send(span).is_err() {
            self.dropped(1);
        }
    }

    fn has_room(&self) -> bool {
        self.tx.capacity() > 0
    }

    fn dropped(&self, n: u64) {
        self.counts.dropped.fetch_add(n, Ordering::Relaxed);
        warn_lost(
            &self.warned,
            "the export queue is full (the collector is slow or down)",
        );
    }
}

impl Exporter {
    /// Starts the export task for `settings`; `node` is this process's name in a cluster
    /// (`service.instance.id`).
    ///
    /// # Errors
    /// The endpoint is not a URL the router may call, or the exporter cannot be built.
    pub fn start(
        settings: &Resolved,
        node: Option<&str>,
        counts: Arc<Counts>,
    ) -> Result<Arc<Self>, String> {
        let allow = AllowList::origin_of(&settings.url)
            .map_err(|e| format!("telemetry: the OTLP endpoint {:?}: {e}", settings.url))?;
        let target = allow
            .check(&settings.url)
            .map_err(|e| format!("telemetry: the OTLP endpoint {:?}: {e}", settings.url))?;
        let http = EgressHttp {
            target,
            timeout: settings.timeout,
        };
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(http)
            .with_endpoint(settings.url.clone())
            .with_timeout(settings.timeout)
            .with_headers(settings.headers.clone().into_iter().collect())
            .with_retry_policy(
                opentelemetry_otlp::RetryPolicy::default()
                    .with_max_retries(2)
                    .with_initial_delay(Duration::from_millis(100))
                    .with_max_delay(Duration::from_secs(1)),
            )
            .build()
            .map_err(|e| format!("telemetry: cannot build the OTLP exporter: {e}"))?;
        let mut attributes: Vec<KeyValue> = settings
            .resource
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
            .collect();
        attributes.push(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
        if let Some(node) = node {
            attributes.push(KeyValue::new("service.instance.id", node.to_owned()));
        }
        exporter.set_resource(
            &Resource::builder_empty()
                .with_service_name(settings.service_name.clone())
                .with_attributes(attributes)
                .build(),
        );
        let (tx, rx) = mpsc::channel(settings.queue);
        let warned = Arc::new(Mutex::new(None));
        tokio::spawn(run(
            exporter,
            rx,
            settings.batch,
            settings.delay,
            settings.timeout,
            counts.clone(),
            warned.clone(),
        ));
        tracing::info!(url = %settings.url, service = %settings.service_name, "traces are exported over OTLP/HTTP");
        Ok(Arc::new(Self { tx, counts, warned }))
    }

    /// The counts.
    pub fn counts(&self) -> &Arc<Counts> {
        &self.counts
    }
}

/// The export task: batches from the queue, one export at a time, until the router is gone.
async fn run(
    exporter: opentelemetry_otlp::SpanExporter,
    mut rx: mpsc::Receiver<Span>,
    batch: usize,
    delay: Duration,
    timeout: Duration,
    counts: Arc<Counts>,
    warned: Arc<Mutex<Option<Instant>>>,
) {
    let scope = InstrumentationScope::builder("map-router")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    let mut pending: Vec<Span> = Vec::with_capacity(batch);
    loop {
        let first = match rx.recv().await {
            Some(s) => s,
            None => break,
        };
        pending.push(first);
        let until = tokio::time::Instant::now() + delay;
        while pending.len() < batch {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(s)) => pending.push(s),
                Ok(None) | Err(_) => break,
            }
        }
        let n = pending.len() as u64;
        let data: Vec<SpanData> = pending.drain(..).map(|s| span_data(s, &scope)).collect();
        // NB: the exporter's own deadline covers its retries; this one covers the rest.
        match tokio::time::timeout(timeout + Duration::from_secs(1), exporter.export(data)).await {
            Ok(Ok(())) => {
                counts.exported.fetch_add(n, Ordering::Relaxed);
            }
            Ok(Err(e)) => {
                counts.dropped.fetch_add(n, Ordering::Relaxed);
                warn_lost(&warned, &format!("an export failed: {e}"));
            }
            Err(_) => {
                counts.dropped.fetch_add(n, Ordering::Relaxed);
                warn_lost(&warned, "an export took longer than its deadline");
            }
        }
    }
}

fn warn_lost(warned: &Mutex<Option<Instant>>, why: &str) {
    // NB: called for every dropped span; when another thread holds the lock, it is warning.
    let Ok(mut last) = warned.try_lock() else {
        return;
    };
    if last.is_some_and(|t| t.elapsed() < WARN_EVERY) {
        return;
    }
    *last = Some(Instant::now());
    tracing::warn!("traces: spans are being dropped: {why} (map_telemetry_spans_dropped_total counts them; this warning repeats at most once a minute)");
}

fn span_data(s: Span, scope: &InstrumentationScope) -> SpanData {
    let state = s
        .trace_state
        .as_deref()
        .and_then(|t| t.parse::<TraceState>().ok())
        .unwrap_or_default();
    SpanData {
        span_context: SpanContext::new(
            TraceId::from_bytes(s.trace_id),
            SpanId::from_bytes(s.span_id),
            TraceFlags::SAMPLED,
            false,
            state,
        ),
        parent_span_id: s.parent_id.map_or(SpanId::INVALID, SpanId::from_bytes),
        parent_span_is_remote: s.parent_remote,
        span_kind: match s.kind {
            SpanKind::Client => OtelKind::Client,
            SpanKind::Producer => OtelKind::Producer,
            SpanKind::Internal => OtelKind::Internal,
        },
        name: Cow::Owned(s.name),
        start_time: at(s.start_ms),
        end_time: at(s.end_ms),
        attributes: s
            .attributes
            .into_iter()
            .map(|(k, v)| {
                KeyValue::new(
                    k,
                    match v {
                        AttrValue::Str(t) => Value::String(t.into()),
                        AttrValue::Int(i) => Value::I64(i),
                        AttrValue::Bool(b) => Value::Bool(b),
                        AttrValue::F64(f) => Value::F64(f),
                    },
                )
            })
            .collect(),
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: match s.error {
            Some(e) => Status::error(e),
            None => Status::Unset,
        },
        instrumentation_scope: scope.clone(),
    }
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// `opentelemetry-otlp`'s HTTP client, over the gateways' one outbound client: the request
/// goes to the configured (checked) URL only.
#[derive(Debug)]
struct EgressHttp {
    target: Allowed,
    timeout: Duration,
}

/// Largest collector answer read (an OTLP answer is a few bytes).
const MAX_ANSWER: usize = 64 * 1024;

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for EgressHttp {
    async fn send_bytes(
        &self,
        request: axum::http::Request<Bytes>,
    ) -> Result<axum::http::Response<Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let content_type: &'static str = match parts
            .headers
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
        {
            Some("application/json") => "application/json",
            _ => "application/x-protobuf",
        };
        let headers: Vec<(axum::http::HeaderName, String)> = parts
            .headers
            .iter()
            .filter(|(k, _)| {
                *k != axum::http::header::CONTENT_TYPE && *k != axum::http::header::CONTENT_LENGTH
            })
            .filter_map(|(k, v)| Some((k.clone(), v.to_str().ok()?.to_owned())))
            .collect();
        let waits = Waits {
            connect: self.timeout,
            head: self.timeout,
        };
        let answer = client::send_named(
            &self.target,
            parts.method,
            &headers,
            Some(Body {
                bytes: body,
                content_type,
            }),
            waits,
        )
        .await
        .map_err(|e| Box::new(e) as opentelemetry_http::HttpError)?;
        let status = answer.status();
        let bytes = answer
            .body(MAX_ANSWER, self.timeout)
            .await
            .map_err(|e| Box::new(e) as opentelemetry_http::HttpError)?;
        axum::http::Response::builder()
            .status(status)
            .body(bytes)
            .map_err(|e| Box::new(e) as opentelemetry_http::HttpError)
    }
}
