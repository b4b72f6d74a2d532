//! A loopback OTLP/HTTP receiver for the trace tests: an axum server on 127.0.0.1 that takes
//! `POST /v1/traces` (protobuf `ExportTraceServiceRequest`, decoded with `opentelemetry-proto`),
//! keeps every span it received, and records each request's headers. It can be told to answer
//! slowly or with an error, as a collector in trouble does.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message;

/// One received span, simplified.
#[derive(Debug, Clone)]
pub struct Got {
    pub trace_id: String,
    pub span_id: String,
    pub parent_id: String,
    pub name: String,
    /// OTLP's number: 1 internal, 2 server, 3 client, 4 producer, 5 consumer.
    pub kind: i32,
    pub attributes: BTreeMap<String, String>,
    pub resource: BTreeMap<String, String>,
    pub status_code: i32,
    pub start_ns: u64,
    pub end_ns: u64,
}

#[derive(Default)]
struct Inner {
    spans: Vec<Got>,
    headers: Vec<HeaderMap>,
    delay: Duration,
    status: Option<StatusCode>,
}

/// The receiver.
#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
}

fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn take(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Vec<u8>) {
    let (delay, status) = {
        let i = inner.lock().unwrap();
        (i.delay, i.status)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(s) = status {
        return (s, Vec::new());
    }
    let Ok(req) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, Vec::new());
    };
    let mut got = Vec::new();
    for rs in req.resource_spans {
        let resource: BTreeMap<String, String> = rs
            .resource
            .map(|r| {
                r.attributes
                    .into_iter()
                    .map(|kv| (kv.key, text(&kv.value)))
                    .collect()
            })
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                got.push(Got {
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_id: hex(&s.parent_span_id),
                    name: s.name,
                    kind: s.kind,
                    attributes: s
                        .attributes
                        .into_iter()
                        .map(|kv| (kv.key, text(&kv.value)))
                        .collect(),
                    resource: resource.clone(),
                    status_code: s.status.map_or(0, |st| st.code),
                    start_ns: s.start_time_unix_nano,
                    end_ns: s.end_time_unix_nano,
                });
            }
        }
    }
    let mut i = inner.lock().unwrap();
    i.spans.extend(got);
    i.headers.push(headers);
    (
        StatusCode::OK,
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

impl Receiver {
    /// Starts a receiver on a free loopback port.
    pub async fn start() -> Self {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = axum::Router::new()
            .route("/v1/traces", post(take))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, inner }
    }

    /// The base URL (`[telemetry] endpoint`).
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Got> {
        self.inner.lock().unwrap().spans.clone()
    }

    /// The headers of every request received so far.
    pub fn headers(&self) -> Vec<HeaderMap> {
        self.inner.lock().unwrap().headers.clone()
    }

    /// Answers after `d` from now on.
    pub fn set_delay(&self, d: Duration) {
        self.inner.lock().unwrap().delay = d;
    }

    /// Answers `s` (without reading) from now on; `None` accepts again.
    pub fn set_status(&self, s: Option<StatusCode>) {
        self.inner.lock().unwrap().status = s;
    }

    /// Waits (bounded by `limit`) until `pred` holds for the spans received; returns them.
    pub async fn wait_for(
        &self,
        limit: Duration,
        what: &str,
        pred: impl Fn(&[Got]) -> bool,
    ) -> Vec<Got> {
        let until = tokio::time::Instant::now() + limit;
        loop {
            let spans = self.spans();
            if pred(&spans) {
                return spans;
            }
            if tokio::time::Instant::now() > until {
                let names: Vec<_> = spans
                    .iter()
                    .map(|s| (&s.name, &s.trace_id, &s.parent_id))
                    .collect();
                panic!(
                    "waited {limit:?} for {what}; received {}: {names:#?}",
                    spans.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
