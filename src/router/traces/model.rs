//! The span model: every hop between agents as a span, computed from logged events alone.
//!
//! Owns: [`SpanModel`], the two bounded tables it needs to follow work across events (sent
//! messages in flight, [`MAX_MESSAGES`]; deliveries a reply may answer, [`MAX_HOPS`]), and the
//! rules that turn an event into spans. It reads nothing but the event records it is given and
//! a closure naming agents, so the same events always give the same spans: the exporter
//! (`server::telemetry`) runs it on the events as they are logged, and a reader of the log (the
//! dashboard's trace waterfall) runs it on the same events read back.
//!
//! The rules (docs/traces.md says them for users):
//! - A message M (its `message_sent` event E) has one span S_M, whose id is derived from E's id.
//!   Sent to one recipient (`{agent}`, a bare id, `{participant}`, `{parent}`), S_M is that
//!   hop: `invoke_agent {agent name}` (CLIENT), ended by its outcome event (delivered, queued,
//!   failed). Sent to a group, S_M is `send {address form}` (PRODUCER) and each recipient's
//!   hop is a child `invoke_agent {agent name}` (at most [`MAX_RECIPIENT_SPANS`] per event).
//! - S_M's parent is the message's trace context (`event._meta.traceparent`: the message's
//!   `meta.traceparent`, else the call's `params._meta.traceparent`), a *parent*, never a
//!   link. A reply (its `message_sent` caused by the delivery of the request it answers) with
//!   no context of its own, or with exactly its request's, is a child of that delivery's hop.
//!   Otherwise S_M starts a trace whose id is E's 128-bit ULID.
//! - A delivery from an offline queue is a child `invoke_agent` of S_M.
//! - A request's hop (`meta.expectsResponse`, delivered to one recipient) lasts until the
//!   reply that answers it, or is ended at its delivery once `reply_wait_ms` ([`REPLY_WAIT_MS`]) of event time
//!   passed without one ([`SpanModel::flush_due`], [`SpanModel::finish`]).
//! - Events a call with a trace context causes (spawn, `map/inject`, task changes,
//!   checkpoints) are spans under that context.
//!
//! Span ids: a 64-bit mix of the event id (and, for a group's recipient, of the recipient's
//! id), never zero. Trace ids: the caller's, or E's ULID. Timestamps are the events' (ms).

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::Value;

use crate::protocol::event::EventType;
use crate::protocol::ids::EventId;
use crate::protocol::message::Address;
use crate::protocol::trace::TraceContext;
use crate::store::record::EventRecord;

/// Sent messages remembered until their outcome (and for later deliveries from a queue).
pub const MAX_MESSAGES: usize = 16_384;
/// Deliveries remembered for the replies that may answer them.
pub const MAX_HOPS: usize = 65_536;
/// Recipient spans made from one outcome event of a send to a group; the rest are counted in
/// the parent's `map.recipients.omitted`.
pub const MAX_RECIPIENT_SPANS: usize = 64;
/// How long (event time) a request's hop waits for its reply by default before it is ended at
/// its delivery (`[telemetry] reply_wait_ms`): a hop answered in time lasts until the answer,
/// so the waterfall shows how long the agent worked.
pub const REPLY_WAIT_MS: u64 = 60_000;
/// Requests' hops waiting for their replies at most (the oldest is ended first).
pub const MAX_AWAITING: usize = 16_384;
/// The longest payload text exported with `capture_content` (longer text is cut, and
/// `map.message.payload.truncated` says so).
pub const MAX_CONTENT: usize = 16 * 1024;

/// What a span is to its trace (OpenTelemetry's span kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// The router calling an agent.
    Client,
    /// A message handed to a group.
    Producer,
    /// Work inside the router.
    Internal,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    /// Text (shared: a message's attributes are on each of its hops).
    Str(Arc<str>),
    /// An integer.
    Int(i64),
    /// A flag.
    Bool(bool),
    /// A number.
    F64(f64),
}

/// What the model needs to know of an agent (the router's registry answers, or whoever reads
/// the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentFacts {
    /// Its name (its id when it has none).
    pub name: Arc<str>,
    /// Its role (`tool` for an AIP tool: a request to it is a tool call).
    pub role: Option<Arc<str>>,
}

impl AttrValue {
    /// Text.
    pub fn str(v: impl Into<Arc<str>>) -> Self {
        AttrValue::Str(v.into())
    }
}

/// One finished span.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// The trace it belongs to.
    pub trace_id: [u8; 16],
    /// Its id.
    pub span_id: [u8; 8],
    /// Its parent's id, when it has one.
    pub parent_id: Option<[u8; 8]>,
    /// Whether the parent is a span of another process (a caller's `traceparent`).
    pub parent_remote: bool,
    /// The caller's `tracestate`, carried on.
    pub trace_state: Option<Arc<str>>,
    /// Name (`invoke_agent planner`).
    pub name: String,
    /// Kind.
    pub kind: SpanKind,
    /// Start, Unix ms.
    pub start_ms: u64,
    /// End, Unix ms (never before the start).
    pub end_ms: u64,
    /// Attributes, in the order they were set.
    pub attributes: Vec<(&'static str, AttrValue)>,
    /// The failure's description, for a hop that failed.
    pub error: Option<String>,
}

impl Span {
    /// The attribute named `key`.
    pub fn attr(&self, key: &str) -> Option<&AttrValue> {
        self.attributes
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }

    /// The W3C `traceparent` naming this span (flags `01`: it is sampled, or it would not be).
    pub fn traceparent(&self) -> String {
        traceparent(&self.trace_id, &self.span_id, true)
    }
}

/// Which traces are kept (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampler {
    /// Every trace.
    AlwaysOn,
    /// None.
    AlwaysOff,
    /// A fraction of traces, by trace id (the SDKs' rule: the low 8 bytes under a bound).
    Ratio(f64),
    /// A caller's decision (its `traceparent` flags) when there is one, else the inner rule.
    ParentBased(Root),
}

/// The rule of a [`Sampler::ParentBased`] for traces the router starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Root {
    /// Every one.
    AlwaysOn,
    /// None.
    AlwaysOff,
    /// A fraction, by trace id.
    Ratio(f64),
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler::ParentBased(Root::AlwaysOn)
    }
}

impl Sampler {
    /// Parses `OTEL_TRACES_SAMPLER` and its argument (the ratio, default 1.0).
    ///
    /// # Errors
    /// The reason, naming the values allowed.
    pub fn parse(name: &str, arg: Option<f64>) -> Result<Self, String> {
        let ratio = arg.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&ratio) {
            return Err(format!("the sampler's ratio is {ratio}, not within 0..1"));
        }
        Ok(match name.trim() {
            "always_on" => Sampler::AlwaysOn,
            "always_off" => Sampler::AlwaysOff,
            "traceidratio" => Sampler::Ratio(ratio),
            "parentbased_always_on" => Sampler::ParentBased(Root::AlwaysOn),
            "parentbased_always_off" => Sampler::ParentBased(Root::AlwaysOff),
            "parentbased_traceidratio" => Sampler::ParentBased(Root::Ratio(ratio)),
            other => {
                return Err(format!(
                    "unknown sampler {other:?}: always_on, always_off, traceidratio, \
                     parentbased_always_on, parentbased_always_off or parentbased_traceidratio"
                ))
            }
        })
    }

    /// Whether a trace is kept: `trace` its id, `parent_sampled` the caller's flag if any.
    pub fn keeps(&self, trace: &[u8; 16], parent_sampled: Option<bool>) -> bool {
        let ratio = |r: f64| {
            // The SDKs' rule: the trace id's low 8 bytes below ratio * 2^63.
            let low = u64::from_be_bytes(trace[8..16].try_into().unwrap_or([0; 8])) >> 1;
            (low as f64) < r * (1u64 << 63) as f64
        };
        match self {
            Sampler::AlwaysOn => true,
            Sampler::AlwaysOff => false,
            Sampler::Ratio(r) => ratio(*r),
            Sampler::ParentBased(root) => match parent_sampled {
                Some(flag) => flag,
                None => match root {
                    Root::AlwaysOn => true,
                    Root::AlwaysOff => false,
                    Root::Ratio(r) => ratio(*r),
                },
            },
        }
    }
}

/// How the model is set up.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a request's hop waits for its reply (event time, ms).
    pub reply_wait_ms: u64,
    /// Export payloads (`[telemetry] capture_content`). Secrets never: the router has none in
    /// messages, and credentials never reach the log.
    pub capture_content: bool,
    /// Which traces are kept.
    pub sampler: Sampler,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            reply_wait_ms: REPLY_WAIT_MS,
            capture_content: false,
            sampler: Sampler::default(),
        }
    }
}

/// A trace position: the trace, the span that is the parent of what comes next, and whether
/// the trace is kept.
#[derive(Debug, Clone)]
struct Context {
    trace: [u8; 16],
    span: Option<[u8; 8]>,
    remote: bool,
    sampled: bool,
    state: Option<Arc<str>>,
}

/// What the model remembers of a sent message until its outcome.
#[derive(Debug, Clone)]
struct Sent {
    /// Where S_M sits (its parent).
    parent: Context,
    /// S_M's id.
    span: [u8; 8],
    /// Whether S_M is the one recipient's hop (else a `send` span with a child per recipient).
    direct: bool,
    /// Whether S_M (a direct hop) has been made.
    made: bool,
    start: u64,
    /// The `traceparent` the message carried, for telling a reply that copied it.
    carried: Option<Arc<str>>,
    /// The attributes every hop of this message has.
    common: Vec<(&'static str, AttrValue)>,
    /// The AIP tool this message calls, if it is a tool call.
    tool: Option<String>,
    /// The payload's `tool` member, which names the tool when the recipient is a tool.
    asked_tool: Option<String>,
    /// Whether the sender waits for a reply (`meta.expectsResponse`).
    expects_response: bool,
    /// Sampled, but not built (the sink was full when it was sent): its hops are counted as
    /// dropped, never exported without their attributes.
    skip: bool,
}

/// A delivery a reply may answer.
#[derive(Debug, Clone)]
struct Hop {
    trace: [u8; 16],
    /// The hop's span, when the delivery was a direct one; else the child is computed from
    /// the delivery event and the replier.
    span: Option<[u8; 8]>,
    sampled: bool,
    state: Option<Arc<str>>,
    /// The `traceparent` the request carried.
    carried: Option<Arc<str>>,
}

/// A table of at most `cap` entries that forgets its oldest first.
#[derive(Debug)]
struct Bounded<K, V> {
    map: HashMap<K, V>,
    order: VecDeque<K>,
    cap: usize,
}

impl<K: std::hash::Hash + Eq + Clone, V> Bounded<K, V> {
    fn new(cap: usize) -> Self {
        Self {
            map: HashMap::new(),
            order: VecDeque::new(),
            cap,
        }
    }

    fn insert(&mut self, k: K, v: V) {
        if self.map.insert(k.clone(), v).is_none() {
            self.order.push_back(k);
            while self.order.len() > self.cap {
                if let Some(old) = self.order.pop_front() {
                    self.map.remove(&old);
                }
            }
        }
    }

    fn get(&self, k: &K) -> Option<&V> {
        self.map.get(k)
    }

    fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        self.map.get_mut(k)
    }
}

/// Spans from events (module docs).
#[derive(Debug)]
pub struct SpanModel {
    settings: Settings,
    sent: Bounded<String, Sent>,
    hops: Bounded<u128, Hop>,
    /// Requests' hops waiting for their replies, by delivery event; oldest first in `due`.
    awaiting: HashMap<u128, Span>,
    due: VecDeque<(u64, u128)>,
    /// Whether spans are built (off while the sink has no room: they would be dropped).
    building: bool,
    /// Spans not built since the last [`SpanModel::take_skipped`].
    skipped: u64,
}

impl SpanModel {
    /// An empty model.
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            sent: Bounded::new(MAX_MESSAGES),
            hops: Bounded::new(MAX_HOPS),
            awaiting: HashMap::new(),
            due: VecDeque::new(),
            building: true,
            skipped: 0,
        }
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Builds spans (`true`, the default) or only follows the work and counts the spans it
    /// would have built (`false`: the sink is full and would drop them; nothing is spent on
    /// them). The tables are kept either way, so later spans still find their parents.
    pub fn set_building(&mut self, on: bool) {
        self.building = on;
    }

    /// How many spans were not built since the last call.
    pub fn take_skipped(&mut self) -> u64 {
        std::mem::take(&mut self.skipped)
    }

    /// The `traceparent` an agent receiving the message that `sent` (its `message_sent`
    /// event) logged should continue from: S_M, when its trace is kept. Called after
    /// [`SpanModel::observe`] has seen that event.
    pub fn delivered_context(&self, message_id: &str) -> Option<String> {
        let s = self.sent.get(&message_id.to_owned())?;
        s.parent
            .sampled
            .then(|| traceparent(&s.parent.trace, &s.span, true))
    }

    /// The requests' hops whose replies are overdue at `now_ms` (event time): ended at their
    /// delivery. The router calls it every few seconds, so an idle router still exports them.
    pub fn flush_due(&mut self, now_ms: u64) -> Vec<Span> {
        let mut out = Vec::new();
        self.end_unanswered(now_ms, &mut out);
        out
    }

    /// Every hop still waiting for its reply, ended at its delivery (the end of a log read).
    pub fn finish(&mut self) -> Vec<Span> {
        let mut out = Vec::new();
        self.end_unanswered(u64::MAX, &mut out);
        out
    }

    fn end_unanswered(&mut self, now_ms: u64, out: &mut Vec<Span>) {
        while let Some(&(start, delivery)) = self.due.front() {
            let overdue =
                now_ms == u64::MAX || start.saturating_add(self.settings.reply_wait_ms) < now_ms;
            // NB: `due` also holds hops answered since (their entries go when they fall due),
            // so it is bounded by count as well as by time.
            if !overdue && self.awaiting.len() <= MAX_AWAITING && self.due.len() <= 4 * MAX_AWAITING
            {
                break;
            }
            self.due.pop_front();
            if let Some(span) = self.awaiting.remove(&delivery) {
                out.push(span);
            }
        }
    }

    /// The spans `rec` finishes, in order. `agent_name` names an agent by id (`None`: the id is
    /// not an agent's, or the agent is gone).
    pub fn observe(
        &mut self,
        rec: &EventRecord,
        agent_name: &dyn Fn(&str) -> Option<AgentFacts>,
    ) -> Vec<Span> {
        let Some(id) = rec.id else {
            return Vec::new();
        };
        self.observe_event(
            &Ev {
                id,
                kind: rec.kind,
                timestamp: rec.timestamp,
                source: rec.source.as_deref(),
                caused_by: &rec.caused_by,
                json: &rec.json,
            },
            agent_name,
        )
    }

    /// [`SpanModel::observe`] for an event read back from the log: the `event` object as
    /// `map/replay` or a subscription gives it (its `id`, `type`, `timestamp`, `source`,
    /// `causedBy`, `data` and `_meta`). Events it cannot read give no spans.
    pub fn observe_logged(
        &mut self,
        event_json: &str,
        agent_name: &dyn Fn(&str) -> Option<AgentFacts>,
    ) -> Vec<Span> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Head<'a> {
            #[serde(borrow)]
            id: Cow<'a, str>,
            #[serde(rename = "type", borrow)]
            kind: Cow<'a, str>,
            timestamp: u64,
            #[serde(borrow, default)]
            source: Option<Cow<'a, str>>,
            #[serde(default)]
            caused_by: Vec<EventId>,
        }
        let Ok(head) = serde_json::from_str::<Head<'_>>(event_json) else {
            return Vec::new();
        };
        let (Some(id), Some(kind)) = (
            EventId::parse(&head.id),
            EventType::ALL
                .iter()
                .copied()
                .find(|k| k.as_str() == head.kind),
        ) else {
            return Vec::new();
        };
        self.observe_event(
            &Ev {
                id,
                kind,
                timestamp: head.timestamp,
                source: head.source.as_deref(),
                caused_by: &head.caused_by,
                json: event_json,
            },
            agent_name,
        )
    }

    fn observe_event(
        &mut self,
        ev: &Ev<'_>,
        agent_name: &dyn Fn(&str) -> Option<AgentFacts>,
    ) -> Vec<Span> {
        let mut out = Vec::new();
        self.end_unanswered(ev.timestamp, &mut out);
        match ev.kind {
            EventType::MessageSent => self.sent_event(ev, &mut out),
            EventType::MessageDelivered | EventType::MessageQueued | EventType::MessageFailed => {
                self.outcome_event(ev, agent_name, &mut out)
            }
            EventType::AgentSpawning
            | EventType::AgentInjected
            | EventType::TaskCreated
            | EventType::TaskStatus
            | EventType::TaskUpdated
            | EventType::TaskAssigned
            | EventType::TrajectoryCheckpoint => {
                self.traced_event(ev, agent_name, &mut out);
            }
            _ => {}
        }
        out
    }

    fn sent_event(&mut self, ev: &Ev<'_>, out: &mut Vec<Span>) {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Message<'a> {
            #[serde(borrow, default)]
            meta: Option<&'a RawValue>,
            #[serde(borrow, default)]
            payload: Option<&'a RawValue>,
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Data<'a> {
            #[serde(borrow)]
            message_id: Cow<'a, str>,
            #[serde(borrow)]
            from: Cow<'a, str>,
            #[serde(borrow)]
            to: &'a RawValue,
            #[serde(borrow, default)]
            correlation_id: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            priority: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            payload: Option<&'a RawValue>,
            #[serde(borrow, default)]
            message: Option<Message<'a>>,
        }
        let Some((meta_of_event, data)) = parse::<Data<'_>>(ev.json) else {
            return;
        };
        let id = ev.id;
        let message_id: &str = &data.message_id;
        let meta: Value = data
            .message
            .as_ref()
            .and_then(|m| m.meta)
            .and_then(|m| serde_json::from_str(m.get()).ok())
            .unwrap_or(Value::Null);
        let own = meta_of_event;
        let carried = own.as_ref().map(|t| t.traceparent.clone());
        // A reply: caused by the delivery of the request it answers.
        let answered = ev
            .caused_by
            .iter()
            .find_map(|c| self.hops.get(&c.0 .0).map(|h| (c.0 .0, h.clone())));
        let from: &str = &data.from;
        if let Some((delivery, _)) = &answered {
            // The answer ends the request's hop (it waited for it).
            if let Some(mut span) = self.awaiting.remove(delivery) {
                span.end_ms = span.end_ms.max(ev.timestamp);
                span.attributes.push(("map.replied", AttrValue::Bool(true)));
                out.push(span);
            }
        }
        let parent = match (&own, answered) {
            (own, Some((delivery, hop)))
                if own.is_none()
                    || own.as_ref().map(|t| &t.traceparent) == hop.carried.as_ref() =>
            {
                Context {
                    trace: hop.trace,
                    span: Some(hop.span.unwrap_or_else(|| child_id(delivery, from))),
                    remote: false,
                    sampled: hop.sampled,
                    state: hop.state,
                }
            }
            (Some(t), _) => context_of(t, &self.settings.sampler),
            (None, _) => {
                let trace = id.0 .0.to_be_bytes();
                Context {
                    trace,
                    span: None,
                    remote: false,
                    sampled: self.settings.sampler.keeps(&trace, None),
                    state: None,
                }
            }
        };
        let address = serde_json::from_str::<Value>(data.to.get())
            .ok()
            .and_then(|to| Address::parse(&to).ok());
        let direct = address.as_ref().is_some_and(Address::names_one);
        if !parent.sampled || !self.building {
            // Nothing of this message is exported (not sampled, or the sink is full: counted
            // as dropped); its recipients and replies follow.
            let skip = parent.sampled;
            if skip && !direct {
                self.skipped += 1;
            }
            self.sent.insert(
                message_id.to_owned(),
                Sent {
                    parent,
                    span: span_id(id),
                    direct: false,
                    made: true,
                    start: ev.timestamp,
                    carried,
                    common: Vec::new(),
                    tool: None,
                    asked_tool: None,
                    expects_response: false,
                    skip,
                },
            );
            return;
        }
        let mut common = vec![
            (
                "messaging.message.id",
                AttrValue::str(message_id.to_owned()),
            ),
            ("map.sender", AttrValue::str(from.to_owned())),
            ("gen_ai.caller.name", AttrValue::str(from.to_owned())),
            (
                "map.address",
                AttrValue::str(address.as_ref().map_or("invalid", form).to_owned()),
            ),
        ];
        if let Some(scope) = address.as_ref().and_then(scope_of) {
            common.push(("map.scope", AttrValue::str(scope)));
        }
        if let Some(c) = &data.correlation_id {
            common.push(("map.correlation_id", AttrValue::str(c.to_string())));
        }
        if meta.get("isResult").and_then(Value::as_bool) == Some(true) {
            common.push(("map.is_result", AttrValue::Bool(true)));
        }
        if let Some(p) = &data.priority {
            common.push(("map.priority", AttrValue::str(p.to_string())));
        }
        let protocol = meta.get("protocol").and_then(Value::as_str);
        if let Some(p) = protocol {
            common.push(("map.protocol", AttrValue::str(p.to_owned())));
        }
        let conversation = meta
            .pointer("/mail/conversationId")
            .or_else(|| meta.pointer("/a2a/contextId"))
            .or_else(|| meta.pointer("/aip/sessionId"))
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty());
        if let Some(c) = conversation {
            common.push(("gen_ai.conversation.id", AttrValue::str(c.to_owned())));
        }
        if let Some(a2a) = meta.get("a2a").filter(|_| protocol == Some("a2a")) {
            for (key, member) in [
                ("a2a.method.name", "method"),
                ("a2a.task.id", "taskId"),
                ("a2a.message.id", "messageId"),
            ] {
                if let Some(v) = a2a.get(member).and_then(Value::as_str) {
                    common.push((key, AttrValue::str(v.to_owned())));
                }
            }
        }
        let payload = data
            .payload
            .or_else(|| data.message.as_ref().and_then(|m| m.payload));
        // (A substring test first: most payloads name no tool, and parsing them is waste.)
        let asked_tool = payload
            .filter(|p| p.get().contains("\"tool\""))
            .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
            .and_then(|p| p.get("tool").and_then(Value::as_str).map(str::to_owned));
        let tool = (protocol == Some("aip") || meta.pointer("/aip/toolName").is_some())
            .then(|| {
                asked_tool.clone().or_else(|| {
                    meta.pointer("/aip/toolName")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
            })
            .flatten();
        if self.settings.capture_content {
            if let Some(p) = payload {
                // The sender's text, as it sent it.
                let mut text = p.get().to_owned();
                if text.len() > MAX_CONTENT {
                    let mut cut = MAX_CONTENT;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    text.truncate(cut);
                    common.push(("map.message.payload.truncated", AttrValue::Bool(true)));
                }
                common.push(("map.message.payload", AttrValue::str(text)));
            }
        }
        let span = span_id(id);
        let start = ev.timestamp;
        if !direct && !self.building {
            self.skipped += 1;
        } else if !direct {
            let mut attributes = common.clone();
            attributes.push(("messaging.operation.type", AttrValue::str("send")));
            out.push(Span {
                trace_id: parent.trace,
                span_id: span,
                parent_id: parent.span,
                parent_remote: parent.remote,
                trace_state: parent.state.clone(),
                name: format!("send {}", address.as_ref().map_or("message", form)),
                kind: SpanKind::Producer,
                start_ms: start,
                end_ms: start,
                attributes,
                error: None,
            });
        }
        self.sent.insert(
            message_id.to_owned(),
            Sent {
                parent,
                span,
                direct,
                made: false,
                start,
                carried,
                common,
                tool,
                asked_tool,
                expects_response: meta.get("expectsResponse").and_then(Value::as_bool)
                    == Some(true),
                skip: false,
            },
        );
    }

    fn outcome_event(
        &mut self,
        ev: &Ev<'_>,
        agent_name: &dyn Fn(&str) -> Option<AgentFacts>,
        out: &mut Vec<Span>,
    ) {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Data<'a> {
            #[serde(borrow)]
            message_id: Cow<'a, str>,
            #[serde(borrow, default)]
            delivered_to: Vec<Cow<'a, str>>,
            #[serde(borrow, default)]
            recipients: Vec<Cow<'a, str>>,
            #[serde(borrow, default)]
            recipient: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            reason: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            message: Option<&'a RawValue>,
        }
        let Some((_, data)) = parse::<Data<'_>>(ev.json) else {
            return;
        };
        let id = ev.id;
        let message_id: &str = &data.message_id;
        let Some(sent) = self.sent.get(&message_id.to_owned()).cloned() else {
            return;
        };
        let (outcome, reason) = match ev.kind {
            EventType::MessageDelivered => ("delivered", None),
            EventType::MessageQueued => ("queued", None),
            _ => (
                "failed",
                Some(data.reason.as_deref().unwrap_or("failed").to_owned()),
            ),
        };
        let mut recipients: Vec<&str> = Vec::new();
        recipients.extend(data.delivered_to.iter().map(|r| &**r));
        recipients.extend(data.recipients.iter().map(|r| &**r));
        recipients.extend(data.recipient.as_deref());
        // Per-recipient events carry the message (or name one recipient); a group's list them.
        let one = recipients.len() == 1 && (data.message.is_some() || data.recipient.is_some());
        // A later delivery (from an offline queue) has a second cause.
        let later = ev.caused_by.len() > 1 || sent.made;
        let record_hop = outcome == "delivered";
        if sent.direct && one && !later {
            if let Some(s) = self.sent.get_mut(&message_id.to_owned()) {
                s.made = true;
            }
            if record_hop {
                self.hops.insert(
                    id.0 .0,
                    Hop {
                        trace: sent.parent.trace,
                        span: Some(sent.span),
                        sampled: sent.parent.sampled,
                        state: sent.parent.state.clone(),
                        carried: sent.carried.clone(),
                    },
                );
            }
            if sent.parent.sampled && !self.building {
                self.skipped += 1;
            } else if sent.parent.sampled {
                let span = hop_span(
                    &sent,
                    sent.span,
                    sent.parent.span,
                    sent.parent.remote,
                    recipients[0],
                    outcome,
                    reason.as_deref(),
                    ev.timestamp,
                    false,
                    agent_name,
                );
                if record_hop && sent.expects_response {
                    // Held until its answer (or REPLY_WAIT_MS).
                    self.due.push_back((sent.start, id.0 .0));
                    self.awaiting.insert(id.0 .0, span);
                    self.end_unanswered(ev.timestamp, out);
                } else {
                    out.push(span);
                }
            }
            return;
        }
        // Children of S_M: a group's recipients, or a later delivery from a queue.
        if record_hop {
            self.hops.insert(
                id.0 .0,
                Hop {
                    trace: sent.parent.trace,
                    span: None,
                    sampled: sent.parent.sampled,
                    state: sent.parent.state.clone(),
                    carried: sent.carried.clone(),
                },
            );
        }
        if !sent.parent.sampled {
            return;
        }
        if !self.building || sent.skip {
            self.skipped += recipients.len().min(MAX_RECIPIENT_SPANS) as u64;
            return;
        }
        let omitted = recipients.len().saturating_sub(MAX_RECIPIENT_SPANS);
        for r in recipients.iter().take(MAX_RECIPIENT_SPANS) {
            let mut span = hop_span(
                &sent,
                child_id(id.0 .0, r),
                Some(sent.span),
                false,
                r,
                outcome,
                reason.as_deref(),
                ev.timestamp,
                later,
                agent_name,
            );
            if later {
                span.start_ms = span.end_ms;
            }
            out.push(span);
        }
        if omitted > 0 {
            if let Some(last) = out.last_mut() {
                last.attributes
                    .push(("map.recipients.omitted", AttrValue::Int(omitted as i64)));
            }
        }
    }

    fn traced_event(
        &mut self,
        ev: &Ev<'_>,
        agent_name: &dyn Fn(&str) -> Option<AgentFacts>,
        out: &mut Vec<Span>,
    ) {
        let Some((Some(trace), data)) = parse::<Value>(ev.json) else {
            return;
        };
        let id = ev.id;
        let parent = context_of(&trace, &self.settings.sampler);
        if !parent.sampled {
            return;
        }
        let agent = data
            .get("agentId")
            .or_else(|| data.pointer("/checkpoint/agentId"))
            .and_then(Value::as_str)
            .or(ev.source)
            .unwrap_or("")
            .to_owned();
        let name_of = |a: &str| agent_name(a).map_or_else(|| a.to_owned(), |f| f.name.to_string());
        let mut attributes = Vec::new();
        let (name, kind) = match ev.kind {
            EventType::AgentSpawning => {
                attributes.push(("gen_ai.operation.name", AttrValue::str("create_agent")));
                attributes.push(("gen_ai.agent.id", AttrValue::str(agent.clone())));
                attributes.push(("gen_ai.agent.name", AttrValue::str(name_of(&agent))));
                if let Some(p) = data.get("parent").and_then(Value::as_str) {
                    attributes.push(("map.parent", AttrValue::str(p.to_owned())));
                }
                (
                    format!("create_agent {}", name_of(&agent)),
                    SpanKind::Internal,
                )
            }
            EventType::AgentInjected => {
                attributes.push(("gen_ai.agent.id", AttrValue::str(agent.clone())));
                for (key, member) in [
                    ("map.inject.delivery", "delivery"),
                    ("map.inject.by", "injectedBy"),
                ] {
                    if let Some(v) = data.get(member).and_then(Value::as_str) {
                        attributes.push((key, AttrValue::str(v.to_owned())));
                    }
                }
                if let Some(v) = data.get("injected").and_then(Value::as_bool) {
                    attributes.push(("map.inject.injected", AttrValue::Bool(v)));
                }
                if self.settings.capture_content {
                    if let Some(c) = data.get("content") {
                        attributes.push(("map.inject.content", AttrValue::str(c.to_string())));
                    }
                }
                (
                    format!("map.inject {}", name_of(&agent)),
                    SpanKind::Internal,
                )
            }
            EventType::TrajectoryCheckpoint => {
                let cp = data.get("checkpoint").unwrap_or(&Value::Null);
                attributes.push(("gen_ai.agent.id", AttrValue::str(agent.clone())));
                if let Some(c) = cp.get("id").and_then(Value::as_str) {
                    attributes.push(("map.checkpoint.id", AttrValue::str(c.to_owned())));
                }
                let usage = cp.pointer("/metadata/usage");
                for (key, member) in [
                    ("gen_ai.usage.input_tokens", "inputTokens"),
                    ("gen_ai.usage.output_tokens", "outputTokens"),
                ] {
                    if let Some(n) = usage.and_then(|u| u.get(member)).and_then(Value::as_i64) {
                        attributes.push((key, AttrValue::Int(n)));
                    }
                }
                if let Some(c) = usage.and_then(|u| u.get("costUsd")).and_then(Value::as_f64) {
                    attributes.push(("map.usage.cost_usd", AttrValue::F64(c)));
                }
                (
                    format!("checkpoint {}", name_of(&agent)),
                    SpanKind::Internal,
                )
            }
            _ => {
                let task = data.get("task").unwrap_or(&Value::Null);
                let task_id = data
                    .get("taskId")
                    .or_else(|| task.get("id"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let status = task.get("status").and_then(Value::as_str).unwrap_or("");
                attributes.push(("map.task.id", AttrValue::str(task_id.to_owned())));
                attributes.push(("map.task.status", AttrValue::str(status.to_owned())));
                if let Some(a2a) = task.pointer("/meta/a2a") {
                    // The A2A gateway's tasks are MAP tasks of the same id.
                    let t = a2a.get("taskId").and_then(Value::as_str).unwrap_or(task_id);
                    attributes.push(("a2a.task.id", AttrValue::str(t.to_owned())));
                    if let Some(s) = a2a
                        .get("state")
                        .or_else(|| a2a.pointer("/status/state"))
                        .and_then(Value::as_str)
                    {
                        attributes.push(("a2a.task.state", AttrValue::str(s.to_owned())));
                    }
                }
                (format!("task {}", ev.kind.as_str()), SpanKind::Internal)
            }
        };
        out.push(Span {
            trace_id: parent.trace,
            span_id: span_id(id),
            parent_id: parent.span,
            parent_remote: parent.remote,
            trace_state: parent.state,
            name,
            kind,
            start_ms: ev.timestamp,
            end_ms: ev.timestamp,
            attributes,
            error: None,
        });
    }
}

/// A recipient's hop.
#[allow(clippy::too_many_arguments)]
fn hop_span(
    sent: &Sent,
    span: [u8; 8],
    parent: Option<[u8; 8]>,
    parent_remote: bool,
    recipient: &str,
    outcome: &str,
    reason: Option<&str>,
    end: u64,
    later: bool,
    agent_name: &dyn Fn(&str) -> Option<AgentFacts>,
) -> Span {
    let mut attributes = sent.common.clone();
    let agent = agent_name(recipient);
    // A tool call: marked so by the sender (the AIP gateway, `call_tool`), or a message to an
    // agent whose role is `tool` (an AIP tool), named by its payload's `tool` or the agent.
    let tool = sent.tool.clone().or_else(|| {
        let facts = agent.as_ref()?;
        (facts.role.as_deref() == Some("tool")).then(|| {
            sent.asked_tool
                .clone()
                .unwrap_or_else(|| facts.name.to_string())
        })
    });
    let agent = agent.map(|f| f.name);
    let name = match (&tool, &agent) {
        (Some(tool), _) => {
            attributes.push(("gen_ai.operation.name", AttrValue::str("execute_tool")));
            attributes.push(("gen_ai.tool.name", AttrValue::str(tool.clone())));
            if let Some(AttrValue::Str(m)) = sent
                .common
                .iter()
                .find(|(k, _)| *k == "messaging.message.id")
                .map(|(_, v)| v)
            {
                attributes.push(("gen_ai.tool.call.id", AttrValue::str(m.clone())));
            }
            format!("execute_tool {tool}")
        }
        (None, Some(name)) => {
            attributes.push(("gen_ai.operation.name", AttrValue::str("invoke_agent")));
            format!("invoke_agent {name}")
        }
        (None, None) => format!("deliver {recipient}"),
    };
    if agent.is_some() {
        attributes.push(("gen_ai.agent.id", AttrValue::str(recipient.to_owned())));
        attributes.push((
            "gen_ai.agent.name",
            AttrValue::str(agent.map_or_else(|| recipient.to_owned(), |n| n.to_string())),
        ));
    } else {
        attributes.push(("map.recipient", AttrValue::str(recipient.to_owned())));
    }
    attributes.push(("map.outcome", AttrValue::str(outcome.to_owned())));
    if let Some(r) = reason {
        attributes.push(("map.failure.reason", AttrValue::str(r.to_owned())));
    }
    if later {
        attributes.push(("map.from_queue", AttrValue::Bool(true)));
    }
    Span {
        trace_id: sent.parent.trace,
        span_id: span,
        parent_id: parent,
        parent_remote,
        trace_state: sent.parent.state.clone(),
        name,
        kind: if tool.is_some() {
            SpanKind::Internal
        } else {
            SpanKind::Client
        },
        start_ms: sent.start,
        end_ms: end.max(sent.start),
        attributes,
        error: reason.map(str::to_owned),
    }
}

/// An event as the model reads it.
struct Ev<'a> {
    id: EventId,
    kind: EventType,
    timestamp: u64,
    source: Option<&'a str>,
    caused_by: &'a [EventId],
    /// The `event` object.
    json: &'a str,
}

/// The trace context stamped on an event (`_meta`) and its `data`, read as `D` (borrowing
/// from the text where it can: the payload is skipped, not copied).
fn parse<'a, D: serde::Deserialize<'a>>(json: &'a str) -> Option<(Option<TraceContext>, D)> {
    #[derive(serde::Deserialize)]
    struct Meta<'a> {
        #[serde(borrow, default)]
        traceparent: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        tracestate: Option<Cow<'a, str>>,
    }
    #[derive(serde::Deserialize)]
    struct Event<'a, D> {
        data: D,
        #[serde(rename = "_meta", borrow, default)]
        meta: Option<Meta<'a>>,
    }
    let event: Event<'a, D> = serde_json::from_str(json).ok()?;
    let trace = event
        .meta
        .and_then(|m| TraceContext::new(m.traceparent.as_deref()?, m.tracestate.as_deref()));
    Some((trace, event.data))
}

/// A valid context's parts: its trace id, its span (the parent of what follows), whether the
/// caller keeps the trace (the sampled flag), and its `tracestate`.
pub type Parts = ([u8; 16], [u8; 8], bool, Option<Arc<str>>);

/// The [`Parts`] of a valid context (`TraceContext::new` checked its syntax).
pub fn parts(t: &TraceContext) -> Option<Parts> {
    let trace = unhex::<16>(t.trace_id())?;
    let span = unhex::<8>(t.traceparent.get(36..52)?)?;
    let flags = unhex::<1>(t.traceparent.get(53..55)?)?;
    Some((trace, span, flags[0] & 1 == 1, t.tracestate.clone()))
}

/// The W3C `traceparent` naming span `span` of trace `trace`, flagged sampled or not.
pub fn traceparent(trace: &[u8; 16], span: &[u8; 8], sampled: bool) -> String {
    let flags = if sampled { "01" } else { "00" };
    format!("00-{}-{}-{flags}", hex(trace), hex(span))
}

/// A caller's context as the parent of what the router makes.
fn context_of(t: &TraceContext, sampler: &Sampler) -> Context {
    let (trace, span, flag, state) = parts(t).unwrap_or(([0; 16], [0; 8], false, None));
    Context {
        trace,
        span: Some(span).filter(|s| *s != [0; 8]),
        remote: true,
        sampled: sampler.keeps(&trace, Some(flag)),
        state,
    }
}

/// The address form's name (`map.address`).
fn form(a: &Address) -> &'static str {
    match a {
        Address::Text(_) => "id",
        Address::Agent(_) => "agent",
        Address::Agents(_) => "agents",
        Address::Scope(_) => "scope",
        Address::Role { .. } => "role",
        Address::Hierarchical(h) if h.parent => "parent",
        Address::Hierarchical(h) if h.children => "children",
        Address::Hierarchical(h) if h.siblings => "siblings",
        Address::Hierarchical(h) if h.ancestors => "ancestors",
        Address::Hierarchical(_) => "descendants",
        Address::Broadcast => "broadcast",
        Address::System => "system",
        Address::Participant(_) => "participant",
        Address::Participants(_) => "participants",
        Address::Federated { .. } => "federated",
    }
}

fn scope_of(a: &Address) -> Option<String> {
    match a {
        Address::Scope(s) => Some(s.to_string()),
        Address::Role {
            within: Some(s), ..
        } => Some(s.to_string()),
        _ => None,
    }
}

/// A span id from an event id: the splitmix64 finalizer over both halves, never zero.
pub fn span_id(id: EventId) -> [u8; 8] {
    let v = id.0 .0;
    nonzero(mix(mix(v as u64) ^ (v >> 64) as u64))
}

/// A group recipient's span id: the delivery event's id mixed with the recipient's id.
pub fn child_id(event: u128, recipient: &str) -> [u8; 8] {
    // FNV-1a over the recipient's bytes: fixed, so every reader of the log computes the same.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in recipient.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    nonzero(mix(mix(event as u64) ^ (event >> 64) as u64 ^ mix(h)))
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn nonzero(v: u64) -> [u8; 8] {
    (if v == 0 { 1 } else { v }).to_be_bytes()
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != N * 2 {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}
