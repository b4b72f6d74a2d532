//! Traces: every hop between agents as an OpenTelemetry-shaped span (docs/traces.md).
//!
//! Owns: the span model ([`model`]: spans as a function of logged events, the one model the
//! exporter and the dashboard's waterfall both use) and, when traces are exported, the
//! router's [`Tap`]: the model run on each event as it is logged, its finished spans handed to
//! a [`SpanSink`] that never blocks (the exporter's bounded queue, `server::telemetry`). The
//! router knows no collector, socket or HTTP: what leaves the process is the sink's business.
//!
//! Reading a trace back from the log (`map/traces/get`, the dashboard's waterfall) is
//! [`read`]'s: the same model, run on the events the caller may see.
//!
//! Also owns the spans a cluster's standby makes outside the model ([`RelaySpans`]): one per
//! call it relays to the node that writes the log, whose context the writer then uses as the
//! call's (`relayTraceparent`, `router::relay`), so that what the call causes there is its
//! child.

pub mod model;
pub mod read;

/// How often the router ends the hops whose replies are overdue.
pub const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

use std::sync::Arc;

pub use model::{AgentFacts, AttrValue, Sampler, Settings, Span, SpanKind, SpanModel};

use crate::protocol::trace::TraceContext;
use crate::store::record::EventRecord;

/// Where finished spans go. `offer` must not block or fail loudly: a full queue drops the span
/// and counts it (the router's hot path calls it).
pub trait SpanSink: Send + Sync + std::fmt::Debug {
    /// Takes a finished span, or drops it.
    fn offer(&self, span: Span);

    /// Whether a span offered now would be taken (a full queue: the model does not build
    /// spans that would be dropped).
    fn has_room(&self) -> bool {
        true
    }

    /// Counts `n` spans dropped without being built.
    fn dropped(&self, n: u64) {
        let _ = n;
    }
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
        self.model.set_building(self.sink.has_room());
        for span in self.model.observe(rec, agent_name) {
            self.sink.offer(span);
        }
        let skipped = self.model.take_skipped();
        if skipped > 0 {
            self.sink.dropped(skipped);
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

    /// Offers a span made outside the model (a relayed call's, [`RelaySpans`]).
    pub fn offer(&self, span: Span) {
        self.sink.offer(span);
    }
}

/// The trace context a request carries: its message's (`params.meta`, for `map/send`), else its
/// own (`params._meta`). Parses only params that mention `traceparent`.
pub fn call_context(params: Option<&serde_json::value::RawValue>) -> Option<TraceContext> {
    #[derive(serde::Deserialize)]
    struct Trace {
        #[serde(default)]
        traceparent: Option<serde_json::Value>,
        #[serde(default)]
        tracestate: Option<serde_json::Value>,
    }
    #[derive(serde::Deserialize)]
    struct Params {
        #[serde(default)]
        meta: Option<Trace>,
        #[serde(default, rename = "_meta")]
        own: Option<Trace>,
    }
    let raw = params?.get();
    if !raw.contains("traceparent") {
        return None;
    }
    let p: Params = serde_json::from_str(raw).ok()?;
    let of = |t: Option<Trace>| {
        let t = t?;
        TraceContext::new(
            t.traceparent.as_ref()?.as_str()?,
            t.tracestate.as_ref().and_then(|s| s.as_str()),
        )
    };
    of(p.meta).or_else(|| of(p.own))
}

/// The spans a standby makes for the calls it relays to the node that writes the log: one
/// `relay {method}` span (CLIENT, `map.node` this node, `rpc.method` the MAP method) per
/// call, under the call's trace context, or the root of a new trace when it has none. Only
/// when traces are exported (same settings as the writer's: the sampler decides alike).
#[derive(Debug, Clone)]
pub struct RelaySpans {
    sink: Arc<dyn SpanSink>,
    sampler: Sampler,
    node: Arc<str>,
}

/// A relayed call's span, from when it is forwarded until the writer answers
/// ([`RelaySpan::end`]). Dropped without an end, it is not exported.
#[derive(Debug)]
pub struct RelaySpan {
    span: Span,
    /// Where it goes when it ends, when its trace is kept.
    sink: Option<Arc<dyn SpanSink>>,
}

impl RelaySpans {
    /// Relay spans of node `node` into `sink`, kept as `sampler` says.
    pub fn new(sink: Arc<dyn SpanSink>, sampler: Sampler, node: &str) -> Self {
        Self {
            sink,
            sampler,
            node: Arc::from(node),
        }
    }

    /// Starts the span of a call of `method` relayed now, under `parent` (the call's trace
    /// context), or as the root of a new trace.
    pub fn begin(&self, method: &str, parent: Option<&TraceContext>) -> RelaySpan {
        let random = crate::protocol::ids::random_u128;
        let (trace_id, parent_id, sampled, trace_state) = match parent.and_then(model::parts) {
            Some((trace, span, flag, state)) => (
                trace,
                Some(span),
                self.sampler.keeps(&trace, Some(flag)),
                state,
            ),
            None => {
                let trace = random().to_be_bytes();
                (trace, None, self.sampler.keeps(&trace, None), None)
            }
        };
        let mut span_id = (random() as u64).to_be_bytes();
        if span_id == [0; 8] {
            span_id[7] = 1;
        }
        let now = crate::protocol::ids::now_ms();
        RelaySpan {
            span: Span {
                trace_id,
                span_id,
                parent_id,
                parent_remote: parent_id.is_some(),
                trace_state,
                name: format!("relay {method}"),
                kind: SpanKind::Client,
                start_ms: now,
                end_ms: now,
                attributes: vec![
                    ("map.node", AttrValue::str(self.node.to_string())),
                    ("rpc.system", AttrValue::str("jsonrpc")),
                    ("rpc.method", AttrValue::str(method.to_owned())),
                ],
                error: None,
            },
            sink: sampled.then(|| Arc::clone(&self.sink)),
        }
    }
}

impl RelaySpan {
    /// The W3C `traceparent` naming this span, what the writer parents the call's work under
    /// (flags `00` when its trace is not kept, so the writer drops it too).
    pub fn traceparent(&self) -> String {
        model::traceparent(&self.span.trace_id, &self.span.span_id, self.sink.is_some())
    }

    /// Ends the span now, failed with `error` if the writer refused the call or did not answer,
    /// and offers it when its trace is kept.
    pub fn end(mut self, error: Option<String>) {
        let Some(sink) = self.sink.take() else {
            return;
        };
        self.span.end_ms = crate::protocol::ids::now_ms().max(self.span.start_ms);
        self.span.error = error;
        sink.offer(self.span);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default)]
    struct Kept(std::sync::Mutex<Vec<Span>>);
    impl SpanSink for Kept {
        fn offer(&self, span: Span) {
            self.0.lock().unwrap().push(span);
        }
    }

    #[test]
    fn a_relay_span_sits_under_the_calls_context_or_starts_a_trace() {
        let kept = Arc::new(Kept::default());
        let spans = RelaySpans::new(kept.clone(), Sampler::default(), "n1");
        let caller = TraceContext::new(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            Some("rojo=1"),
        )
        .unwrap();
        let span = spans.begin("map/send", Some(&caller));
        let tp = span.traceparent();
        assert!(
            tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "{tp}"
        );
        assert!(
            tp.ends_with("-01") && !tp.contains("00f067aa0ba902b7"),
            "{tp}"
        );
        span.end(None);
        let root = spans.begin("map/agents/spawn", None);
        let root_tp = root.traceparent();
        root.end(Some("refused".into()));
        let got = kept.0.lock().unwrap().clone();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].name, "relay map/send");
        assert_eq!(got[0].parent_id, Some(*b"\x00\xf0\x67\xaa\x0b\xa9\x02\xb7"));
        assert_eq!(got[0].trace_state.as_deref(), Some("rojo=1"));
        assert_eq!(got[0].kind, SpanKind::Client);
        assert_eq!(got[0].attr("map.node"), Some(&AttrValue::str("n1")));
        assert_eq!(got[0].traceparent(), tp);
        assert_eq!(got[1].parent_id, None);
        assert_eq!(got[1].traceparent(), root_tp);
        assert_eq!(got[1].error.as_deref(), Some("refused"));
        // A caller that keeps nothing: the span is not exported, and its context says so.
        let unsampled = TraceContext::new(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            None,
        )
        .unwrap();
        let span = spans.begin("map/send", Some(&unsampled));
        assert!(span.traceparent().ends_with("-00"));
        span.end(None);
        assert_eq!(kept.0.lock().unwrap().len(), 2);
    }
}
