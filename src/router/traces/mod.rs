//! Traces: every hop between agents as an OpenTelemetry-shaped span (docs/traces.md).
//!
//! Owns: the span model ([`model`]: spans as a function of logged events, the one model the
//! exporter and the dashboard's waterfall both use) and, when traces are exported, the
//! router's [`Tap`]: the model run on each event as it is logged, its finished spans handed to
//! a [`SpanSink`] that never blocks (the exporter's bounded queue, `server::telemetry`). The
//! router knows no collector, socket or HTTP: what leaves the process is the sink's business.

pub mod model;

/// How often the router ends the hops whose replies are overdue.
pub const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

use std::sync::Arc;

pub use model::{AgentFacts, AttrValue, Sampler, Settings, Span, SpanKind, SpanModel};

use crate::store::record::EventRecord;

/// Where finished spans go. `offer` must not block or fail loudly: a full queue drops the span
/// and counts it (the router's hot path calls it).
pub trait SpanSink: Send + Sync + std::fmt::Debug {
    /// Takes a finished span, or drops it.
    fn offer(&self, span: Span);
}

/// The model run on the router's own events, and where its spans go.
#[derive(Debug)]
pub struct Tap {
    model: SpanModel,
    sink: Arc<dyn SpanSink>,
}

impl Tap {
    /// A tap with `settings` into `sink`.
    pub fn new(settings: Settings, sink: Arc<dyn SpanSink>) -> Self {
        Self {
            model: SpanModel::new(settings),
            sink,
        }
    }

    /// Runs the model on a logged event and offers the spans it finishes.
    pub fn observe(&mut self, rec: &EventRecord, agent_name: &dyn Fn(&str) -> Option<AgentFacts>) {
        for span in self.model.observe(rec, agent_name) {
            self.sink.offer(span);
        }
    }

    /// Exports the requests' hops whose replies are overdue (called every few seconds).
    pub fn flush_due(&mut self, now_ms: u64) {
        for span in self.model.flush_due(now_ms) {
            self.sink.offer(span);
        }
    }

    /// The `traceparent` the recipients of a message just sent continue from (its span), when
    /// its trace is kept.
    pub fn delivered_context(&self, message_id: &str) -> Option<String> {
        self.model.delivered_context(message_id)
    }
}
