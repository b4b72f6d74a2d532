//! `map/traces/get`: one trace read back from the event log as spans (docs/traces.md,
//! "Reading a trace back").
//!
//! Owns the reading of a trace: which part of the log is read (around an anchor, or the newest
//! hour for a bare trace id), its bounds ([`MAX_WINDOW_MS`], [`MAX_EXAMINED`], [`MAX_SPANS`]),
//! and the agent names the spans may carry. The log is read with `map/replay`'s machinery
//! (`events::ops::scan_step`): chunk by chunk, each event admitted only when the caller may
//! see it, so the spans are built from nothing the caller could not replay. The span model
//! ([`super::model`], the exporter's) runs here, on the caller's task, never on the router's:
//! nothing is spent when nobody asks, and the exporter's tap is not touched.
//!
//! An anchor (a message or an event) is read in two passes over the same window: the first,
//! up to the anchor, learns its trace (the model's answer: a reply's trace is its request's);
//! the second keeps that trace's spans. A caller that may not see the anchor is told exactly
//! what a caller naming an unknown one is told.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use crate::protocol::event::EventType;
use crate::protocol::ids::{now_ms, AgentId, EventId, Ulid};
use crate::protocol::methods::traces::{SpanStatus, TraceSpan, TracesGetParams, TracesGetResult};
use crate::router::error::RouterError;
use crate::router::events::filter::CompiledFilter;
use crate::router::events::log::EventRecord;
use crate::router::events::ops::{log_bounds, resolve, scan_step, Position};
use crate::router::handle::RouterHandle;
use crate::router::ids::ConnId;
use crate::router::permissions::can_see_agent;

use super::model::{hex, span_id, AgentFacts, AttrValue, Sampler, Settings, Span, SpanKind};
use super::SpanModel;

/// How far around an anchor the log is read by default (ms, each side).
pub const DEFAULT_WINDOW_MS: u64 = 10 * 60_000;
/// The widest `windowMs`.
pub const MAX_WINDOW_MS: u64 = 60 * 60_000;
/// How far back a bare trace id is looked for (ms before now).
pub const NEWEST_MS: u64 = 60 * 60_000;
/// Events one call examines at most (per pass).
pub const MAX_EXAMINED: u64 = 200_000;
/// Spans one answer holds at most.
pub const MAX_SPANS: usize = 2_000;

/// The event types the model reads (and `agent_registered`, for the names of agents gone
/// since): the only ones a trace read copies out of the log.
const READ: [EventType; 12] = [
    EventType::MessageSent,
    EventType::MessageDelivered,
    EventType::MessageQueued,
    EventType::MessageFailed,
    EventType::AgentSpawning,
    EventType::AgentInjected,
    EventType::TaskCreated,
    EventType::TaskStatus,
    EventType::TaskUpdated,
    EventType::TaskAssigned,
    EventType::TrajectoryCheckpoint,
    EventType::AgentRegistered,
];

/// What the caller asked for.
#[derive(Debug, Clone)]
enum Anchor {
    Trace([u8; 16]),
    Message(String),
    Event(EventId),
}

impl Anchor {
    /// When a message or event anchor happened (its ULID's time; 0 for a message id that is
    /// no ULID); `None` for a bare trace id, which has no place in the log.
    fn at_ms(&self) -> Option<u64> {
        match self {
            Anchor::Trace(_) => None,
            Anchor::Message(m) => Some(Ulid::parse(m).map_or(0, Ulid::timestamp_ms)),
            Anchor::Event(e) => Some(e.0.timestamp_ms()),
        }
    }

    /// How the caller named it (the text of the not-found error, the same whether it is
    /// unknown or hidden from the caller).
    fn named(&self, p: &TracesGetParams) -> String {
        match self {
            Anchor::Trace(_) => format!("traceId {}", p.trace_id.as_deref().unwrap_or("")),
            Anchor::Message(m) => format!("messageId {m}"),
            Anchor::Event(e) => format!("eventId {e}"),
        }
    }
}

fn invalid(msg: impl Into<String>) -> RouterError {
    RouterError::InvalidParams(msg.into())
}

/// Checks the params: exactly one anchor, well formed; the window within its bounds.
fn anchor_of(p: &TracesGetParams) -> Result<(Anchor, u64), RouterError> {
    let given = [&p.trace_id, &p.message_id, &p.event_id]
        .iter()
        .filter(|v| v.is_some())
        .count();
    if given != 1 {
        return Err(invalid("give exactly one of traceId, messageId or eventId"));
    }
    let window = match p.window_ms {
        None => DEFAULT_WINDOW_MS,
        Some(0) => return Err(invalid("windowMs must be at least 1")),
        Some(w) if w > MAX_WINDOW_MS => {
            return Err(invalid(format!(
                "windowMs must be at most {MAX_WINDOW_MS} (one hour)"
            )))
        }
        Some(w) => w,
    };
    let ulid = |s: &str, field: &str| {
        Ulid::parse(s).filter(|_| s.len() == 26).ok_or_else(|| {
            invalid(format!(
                "{field} must be a 26-character ULID (the router's ids are)"
            ))
        })
    };
    let anchor = if let Some(t) = &p.trace_id {
        let ok = t.len() == 32
            && t.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            && t.bytes().any(|b| b != b'0');
        if !ok {
            return Err(invalid(
                "traceId must be 32 lowercase hex digits, not all zero",
            ));
        }
        let mut id = [0u8; 16];
        for (i, b) in id.iter_mut().enumerate() {
            *b = u8::from_str_radix(&t[i * 2..i * 2 + 2], 16).map_err(|_| invalid("traceId"))?;
        }
        Anchor::Trace(id)
    } else if let Some(m) = &p.message_id {
        ulid(m, "messageId")?;
        Anchor::Message(m.clone())
    } else {
        let e = p.event_id.as_deref().unwrap_or("");
        Anchor::Event(EventId(ulid(e, "eventId")?))
    };
    Ok((anchor, window))
}

/// The event object, as the model reads it.
fn render(rec: &EventRecord) -> String {
    rec.json.to_string()
}

/// The agents the spans may name, as the caller may see them: asked of the registry (the
/// caller's view) for each id once, else learned from `agent_registered` events the caller
/// was shown (an agent gone since, or a router restarted since).
#[derive(Default)]
struct Names {
    /// The registry's answer: `Some(facts)` visible, `None` registered but hidden from the
    /// caller (never named, whatever an old registration said).
    registry: HashMap<String, Option<AgentFacts>>,
    /// Registrations the caller was shown.
    registered: HashMap<String, AgentFacts>,
}

impl Names {
    fn facts(&self, id: &str) -> Option<AgentFacts> {
        match self.registry.get(id) {
            Some(known) => known.clone(),
            None => self.registered.get(id).cloned(),
        }
    }

    /// Asks the registry about the agents `events` name that it was not asked about yet.
    async fn learn(
        &mut self,
        router: &RouterHandle,
        conn: ConnId,
        events: &[String],
    ) -> Result<(), RouterError> {
        #[derive(serde::Deserialize, Default)]
        #[serde(rename_all = "camelCase", default)]
        struct Data {
            agent_id: Option<String>,
            name: Option<String>,
            role: Option<String>,
            delivered_to: Vec<String>,
            recipients: Vec<String>,
            recipient: Option<String>,
            checkpoint: Option<Checkpoint>,
        }
        #[derive(serde::Deserialize, Default)]
        #[serde(rename_all = "camelCase", default)]
        struct Checkpoint {
            agent_id: Option<String>,
        }
        #[derive(serde::Deserialize)]
        struct Ev {
            #[serde(rename = "type")]
            kind: String,
            #[serde(default)]
            source: Option<String>,
            #[serde(default)]
            data: Data,
        }
        let mut ask: Vec<String> = Vec::new();
        for text in events {
            // A message_sent names no agent the model asks about.
            if head(text).is_some_and(|(_, t)| t == EventType::MessageSent.as_str()) {
                continue;
            }
            let Ok(ev) = serde_json::from_str::<Ev>(text) else {
                continue;
            };
            let d = ev.data;
            if ev.kind == EventType::AgentRegistered.as_str() {
                if let Some(id) = &d.agent_id {
                    let name = d.name.clone().unwrap_or_else(|| id.clone());
                    self.registered.insert(
                        id.clone(),
                        AgentFacts {
                            name: Arc::from(name),
                            role: d.role.as_deref().map(Arc::from),
                        },
                    );
                }
                continue;
            }
            let ids = d
                .delivered_to
                .into_iter()
                .chain(d.recipients)
                .chain(d.recipient)
                .chain(d.agent_id)
                .chain(d.checkpoint.and_then(|c| c.agent_id))
                .chain(ev.source);
            for id in ids {
                if !self.registry.contains_key(&id) && !ask.contains(&id) {
                    ask.push(id);
                }
            }
        }
        if ask.is_empty() {
            return Ok(());
        }
        let answers = router
            .call(
                conn,
                Some(crate::protocol::capabilities::Capability::CanObserve),
                true,
                move |r, ctx| {
                    let caller = r.caller(ctx)?;
                    Ok(ask
                        .into_iter()
                        .filter_map(|id| {
                            let rec = r.registry.get(&AgentId::from(id.as_str()))?;
                            let agent = rec.agent();
                            let facts = can_see_agent(&caller.viewer(), agent, r.agent_view())
                                .then(|| AgentFacts {
                                    name: agent
                                        .name
                                        .as_deref()
                                        .map_or_else(|| Arc::from(id.as_str()), Arc::from),
                                    role: agent.role.as_deref().map(Arc::from),
                                });
                            Some((id, facts))
                        })
                        .collect::<Vec<_>>())
                },
            )
            .await?;
        self.registry.extend(answers);
        Ok(())
    }
}

/// The model as a reader of the log runs it: every trace kept (the exporter's sampler decides
/// what leaves the process, not what the log holds), no content.
fn model() -> SpanModel {
    SpanModel::new(Settings {
        sampler: Sampler::AlwaysOn,
        ..Settings::default()
    })
}

/// The `messageId` of a message event.
fn message_of(text: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Data {
        message_id: String,
    }
    #[derive(serde::Deserialize)]
    struct Ev {
        data: Data,
    }
    serde_json::from_str::<Ev>(text)
        .ok()
        .map(|e| e.data.message_id)
}

/// An event's id and type, read from the head of its JSON (`{"id":"…","type":"…",`, as the log
/// writes every event), else parsed.
fn head(text: &str) -> Option<(EventId, &str)> {
    let fast = || {
        let rest = text.strip_prefix("{\"id\":\"")?;
        let id = EventId::parse(rest.get(..26)?)?;
        let rest = rest.get(26..)?.strip_prefix("\",\"type\":\"")?;
        Some((id, rest.get(..rest.find('"')?)?))
    };
    fast().or_else(|| {
        #[derive(serde::Deserialize)]
        struct Ev<'a> {
            id: EventId,
            #[serde(rename = "type", borrow)]
            kind: std::borrow::Cow<'a, str>,
        }
        let ev = serde_json::from_str::<Ev<'_>>(text).ok()?;
        let kind = EventType::ALL
            .iter()
            .find(|k| k.as_str() == ev.kind)?
            .as_str();
        Some((ev.id, kind))
    })
}

fn id_of(text: &str) -> Option<EventId> {
    head(text).map(|(id, _)| id)
}

/// The trace a `traceparent` names (read by the model's one reader of a context's parts).
fn trace_of_context(tp: &str) -> Option<[u8; 16]> {
    let context = crate::protocol::trace::TraceContext::new(tp, None)?;
    super::model::parts(&context).map(|(trace, ..)| trace)
}

/// The first pass: reads from `cursor` up to the anchor and returns the trace the model puts
/// it in (`None`: the caller sees no such anchor in the window, or it is in no trace).
async fn find_trace(
    router: &RouterHandle,
    conn: ConnId,
    filter: &Arc<CompiledFilter>,
    mut cursor: u64,
    to: u64,
    anchor: &Anchor,
    names: &mut Names,
) -> Result<Option<[u8; 16]>, RouterError> {
    let mut m = model();
    let mut examined = 0u64;
    let needle = match anchor {
        Anchor::Message(id) => format!("\"messageId\":\"{id}\""),
        Anchor::Event(id) => format!("\"id\":\"{id}\""),
        Anchor::Trace(_) => return Ok(None),
    };
    loop {
        let chunk = scan_step(router, conn, filter, cursor, Some(to), render).await?;
        names.learn(router, conn, &chunk.matched).await?;
        for text in &chunk.matched {
            let candidate = text.contains(&needle);
            let spans = m.observe_logged(text, &|id| names.facts(id));
            if !candidate {
                continue;
            }
            let hit = match anchor {
                Anchor::Message(mid) => {
                    head(text).is_some_and(|(_, t)| t == EventType::MessageSent.as_str())
                        && message_of(text).as_ref() == Some(mid)
                }
                Anchor::Event(id) => id_of(text) == Some(*id),
                Anchor::Trace(_) => false,
            };
            if !hit {
                continue;
            }
            // The anchor's own span (spawn, inject, task, checkpoint), else its message's.
            if let Anchor::Event(id) = anchor {
                if let Some(s) = spans.iter().find(|s| s.span_id == span_id(*id)) {
                    return Ok(Some(s.trace_id));
                }
            }
            return Ok(message_of(text)
                .and_then(|mid| m.delivered_context(&mid))
                .and_then(|tp| trace_of_context(&tp)));
        }
        examined += chunk.examined;
        cursor = chunk.next;
        if chunk.end || examined >= MAX_EXAMINED {
            return Ok(None);
        }
    }
}

/// `map/traces/get`.
///
/// # Errors
/// `-32602` for bad params; 1003 without `observation.canObserve`; `TraceNotFound` for a
/// trace, message or event the caller sees nothing of (unknown or hidden alike); a storage
/// error.
pub async fn get(
    router: RouterHandle,
    conn: ConnId,
    p: TracesGetParams,
) -> Result<TracesGetResult, RouterError> {
    let (anchor, window) = anchor_of(&p)?;
    let not_found = || RouterError::TraceNotFound(anchor.named(&p));
    let (_oldest, head) = log_bounds(&router, conn).await?;
    let types: Vec<&str> = READ.iter().map(|t| t.as_str()).collect();
    let wire: crate::protocol::event::SubscriptionFilter =
        serde_json::from_value(serde_json::json!({ "eventTypes": types }))
            .map_err(|e| RouterError::Storage(e.to_string()))?;
    let filter =
        Arc::new(CompiledFilter::compile(Some(&wire)).map_err(|e| {
            RouterError::Storage(format!("the trace reader's filter: {}", e.message))
        })?);
    let mut names = Names::default();
    let mut truncated = false;
    let (trace, from_ms, to_ms, start) = match (&anchor, anchor.at_ms()) {
        (Anchor::Trace(t), _) => {
            let to_ms = now_ms();
            let from_ms = to_ms.saturating_sub(NEWEST_MS);
            let mut start = resolve(&router, conn, Position::AtTime(from_ms)).await?;
            if head.saturating_sub(start) > MAX_EXAMINED {
                start = head - MAX_EXAMINED;
                truncated = true;
            }
            (*t, from_ms, to_ms, start)
        }
        (_, at) => {
            let at = at.unwrap_or_default();
            around(
                &router,
                conn,
                &filter,
                &anchor,
                at,
                window,
                &mut names,
                &mut truncated,
            )
            .await?
            .ok_or_else(not_found)?
        }
    };
    // The second pass: the trace's spans.
    let mut m = model();
    let mut spans: Vec<Span> = Vec::new();
    let mut cursor = start;
    let mut examined = 0u64;
    // The log's order of the events spans are named after (a span id is derived from its
    // event's id): what orders spans that start in the same millisecond.
    let mut order: HashMap<[u8; 8], u64> = HashMap::new();
    let keep = |found: Vec<Span>, spans: &mut Vec<Span>, truncated: &mut bool| {
        for s in found.into_iter().filter(|s| s.trace_id == trace) {
            if spans.len() < MAX_SPANS {
                spans.push(s);
            } else {
                *truncated = true;
            }
        }
    };
    loop {
        let chunk = scan_step(&router, conn, &filter, cursor, Some(to_ms), render).await?;
        names.learn(&router, conn, &chunk.matched).await?;
        for text in &chunk.matched {
            if let Some(id) = id_of(text) {
                let n = order.len() as u64;
                order.insert(span_id(id), n);
            }
            let found = m.observe_logged(text, &|id| names.facts(id));
            keep(found, &mut spans, &mut truncated);
        }
        examined += chunk.examined;
        cursor = chunk.next;
        if chunk.end {
            break;
        }
        if examined >= MAX_EXAMINED {
            truncated = true;
            break;
        }
    }
    keep(m.finish(), &mut spans, &mut truncated);
    if spans.is_empty() {
        return Err(not_found());
    }
    Ok(TracesGetResult {
        trace_id: hex(&trace),
        spans: wire_spans(spans, &order),
        examined,
        from_ms,
        to_ms,
        truncated,
    })
}

/// The window around an anchor at `at` (ms): where the second pass starts, and the trace
/// the first pass found (`None`: no such anchor the caller may see).
#[allow(clippy::too_many_arguments)]
async fn around(
    router: &RouterHandle,
    conn: ConnId,
    filter: &Arc<CompiledFilter>,
    anchor: &Anchor,
    at: u64,
    window: u64,
    names: &mut Names,
    truncated: &mut bool,
) -> Result<Option<([u8; 16], u64, u64, u64)>, RouterError> {
    let from_ms = at.saturating_sub(window);
    let to_ms = at.saturating_add(window);
    let mut start = resolve(router, conn, Position::AtTime(from_ms)).await?;
    // At most half the events examined before the anchor: the rest are after it.
    let at_seq = resolve(router, conn, Position::AtTime(at)).await?;
    if at_seq.saturating_sub(start) > MAX_EXAMINED / 2 {
        start = at_seq - MAX_EXAMINED / 2;
        *truncated = true;
    }
    let trace = find_trace(router, conn, filter, start, to_ms, anchor, names).await?;
    Ok(trace.map(|t| (t, from_ms, to_ms, start)))
}

/// Start, log order of the origin event, depth, span id.
type SortKey = (u64, u64, usize, [u8; 8]);

/// Spans as the wire has them, by start time; those that start in the same millisecond in
/// the log's order of the events they come from (`order`, by span id; a group's recipient or
/// a delivery from a queue comes after its message's span), a parent before its children.
fn wire_spans(spans: Vec<Span>, order: &HashMap<[u8; 8], u64>) -> Vec<TraceSpan> {
    let parent: HashMap<[u8; 8], Option<[u8; 8]>> =
        spans.iter().map(|s| (s.span_id, s.parent_id)).collect();
    let depth = |s: &Span| {
        let mut d = 0usize;
        let mut at = s.parent_id;
        while let Some(p) = at {
            match parent.get(&p) {
                Some(next) if d < spans.len() => {
                    d += 1;
                    at = *next;
                }
                _ => break,
            }
        }
        d
    };
    let origin = |s: &Span| {
        order
            .get(&s.span_id)
            .or_else(|| s.parent_id.and_then(|p| order.get(&p)))
            .copied()
            .unwrap_or(u64::MAX)
    };
    let keys: HashMap<[u8; 8], SortKey> = spans
        .iter()
        .map(|s| (s.span_id, (s.start_ms, origin(s), depth(s), s.span_id)))
        .collect();
    let mut spans = spans;
    spans.sort_by_key(|s| keys.get(&s.span_id).copied());
    spans.into_iter().map(wire_span).collect()
}

fn wire_span(s: Span) -> TraceSpan {
    let attributes = s
        .attributes
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                AttrValue::Str(t) => Value::from(t.to_string()),
                AttrValue::Int(i) => Value::from(i),
                AttrValue::Bool(b) => Value::from(b),
                AttrValue::F64(f) => Value::from(f),
            };
            (k.to_owned(), v)
        })
        .collect();
    TraceSpan {
        trace_id: hex(&s.trace_id),
        span_id: hex(&s.span_id),
        parent_span_id: s.parent_id.map(|p| hex(&p)),
        name: s.name,
        kind: match s.kind {
            SpanKind::Client => "client",
            SpanKind::Producer => "producer",
            SpanKind::Internal => "internal",
        }
        .to_owned(),
        start_time_ms: s.start_ms,
        end_time_ms: s.end_ms,
        status: match s.error {
            Some(e) => SpanStatus {
                code: "error".into(),
                message: Some(e),
            },
            None => SpanStatus {
                code: "unset".into(),
                message: None,
            },
        },
        attributes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: Value) -> TracesGetParams {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn an_events_head_is_read_from_its_json() {
        let id = "01HZX3K5N7Q8R9S0T1V2W3X4Y5";
        let logged = format!(
            r#"{{"id":"{id}","type":"message_sent","timestamp":1,"data":{{"messageId":"m"}}}}"#
        );
        let (got, kind) = head(&logged).unwrap();
        assert_eq!(got.to_string(), id);
        assert_eq!(kind, "message_sent");
        // Another member order (not the log's): parsed.
        let other = format!(r#"{{"type":"task.created","timestamp":1,"id":"{id}"}}"#);
        assert_eq!(head(&other).map(|(_, k)| k), Some("task.created"));
        assert!(head(r#"{"id":"nope","type":"message_sent"}"#).is_none());
    }

    #[test]
    fn params_name_one_anchor_and_a_bounded_window() {
        let bad = |v: Value| match anchor_of(&params(v)) {
            Err(RouterError::InvalidParams(m)) => m,
            other => panic!("{other:?}"),
        };
        let id = "01HZX3K5N7Q8R9S0T1V2W3X4Y5";
        assert!(bad(serde_json::json!({})).contains("exactly one"));
        assert!(bad(
            serde_json::json!({"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "eventId": id})
        )
        .contains("exactly one"));
        for t in [
            "4BF92F3577B34DA6A3CE929D0E0E4736",
            "4bf92f3577b34da6a3ce929d0e0e473",
            "4bf92f3577b34da6a3ce929d0e0e47zz",
            "00000000000000000000000000000000",
        ] {
            assert!(bad(serde_json::json!({"traceId": t})).contains("32 lowercase hex"));
        }
        assert!(bad(serde_json::json!({"messageId": "m-1"})).contains("ULID"));
        assert!(bad(serde_json::json!({"eventId": id, "windowMs": 0})).contains("at least 1"));
        assert!(
            bad(serde_json::json!({"eventId": id, "windowMs": 3_600_001}))
                .contains("at most 3600000")
        );
        let (a, w) = anchor_of(&params(serde_json::json!({"eventId": id}))).unwrap();
        assert!(matches!(a, Anchor::Event(_)));
        assert_eq!(w, DEFAULT_WINDOW_MS);
        let (a, _) = anchor_of(&params(
            serde_json::json!({"traceId": "4bf92f3577b34da6a3ce929d0e0e4736"}),
        ))
        .unwrap();
        assert!(matches!(a, Anchor::Trace(t) if hex(&t) == "4bf92f3577b34da6a3ce929d0e0e4736"));
    }
}
