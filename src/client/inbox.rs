//! An inbox: the bounded queue the driver fills with `map/message`s for one agent (or for the
//! connection) and the one [`Messages`] stream that reads it; and which agents a message names
//! explicitly (the driver's routing rule). Each queued message keeps the trace context of the
//! frame that delivered it (`params._meta`, the router's span of the delivery when the router
//! exports traces), which [`Messages::delivered_trace`] tells after the message is read.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures::Stream;
use serde_json::Value;

use crate::protocol::message::Message;
use crate::protocol::trace::TraceContext;

/// A bounded message queue filled by the driver and read by one [`Messages`] stream.
#[derive(Debug)]
pub(crate) struct Inbox {
    state: Mutex<InboxQueue>,
    capacity: usize,
    dropped: AtomicU64,
    /// A name for log lines (the agent id, or `client`).
    label: String,
}

#[derive(Debug)]
struct InboxQueue {
    buf: VecDeque<(Message, Option<TraceContext>)>,
    waker: Option<Waker>,
    taken: bool,
    ended: bool,
}

impl Inbox {
    pub fn new(capacity: usize, label: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(InboxQueue {
                buf: VecDeque::new(),
                waker: None,
                taken: false,
                ended: false,
            }),
            capacity: capacity.max(1),
            dropped: AtomicU64::new(0),
            label: label.into(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, InboxQueue> {
        // Critical sections are a few field updates; a poisoned lock is still consistent.
        crate::sync::lock(&self.state)
    }

    /// Queues a message (with its frame's trace context), or drops it (logged and counted)
    /// when the inbox is full.
    pub fn push(&self, message: Message, trace: Option<TraceContext>) {
        let mut q = self.lock();
        if q.ended {
            return;
        }
        if q.buf.len() >= self.capacity {
            drop(q);
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n == 1 || n.is_power_of_two() {
                tracing::warn!(
                    inbox = %self.label,
                    dropped = n,
                    message = %message.id,
                    "message inbox full: message dropped (read the inbox faster or raise message_buffer)"
                );
            }
            return;
        }
        q.buf.push_back((message, trace));
        if let Some(w) = q.waker.take() {
            w.wake();
        }
    }

    /// Removes and returns the queued messages `pred` selects, in order (the others stay).
    pub fn take_matching(
        &self,
        pred: impl Fn(&Message) -> bool,
    ) -> Vec<(Message, Option<TraceContext>)> {
        let mut q = self.lock();
        type Queued = VecDeque<(Message, Option<TraceContext>)>;
        let (taken, kept): (Queued, Queued) = std::mem::take(&mut q.buf)
            .into_iter()
            .partition(|(m, _)| pred(m));
        q.buf = kept;
        taken.into()
    }

    /// Ends the stream after the queued messages.
    pub fn end(&self) {
        let mut q = self.lock();
        q.ended = true;
        if let Some(w) = q.waker.take() {
            w.wake();
        }
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The one stream over this inbox; `None` when it was already taken.
    pub fn take(self: &Arc<Self>) -> Option<Messages> {
        let mut q = self.lock();
        if q.taken {
            return None;
        }
        q.taken = true;
        Some(Messages {
            inbox: Some(self.clone()),
            last_trace: None,
        })
    }
}

/// A stream of [`Message`]s delivered to an agent (or, from [`Client::messages`](crate::client::Client::messages), to the
/// connection). Ends when the client closes or the agent handle is dropped or unregistered.
#[derive(Debug)]
pub struct Messages {
    inbox: Option<Arc<Inbox>>,
    /// The trace context of the frame that delivered the message read last.
    last_trace: Option<TraceContext>,
}

impl Messages {
    /// A stream that has already ended (returned when the inbox was taken before).
    pub(crate) fn ended() -> Self {
        Self {
            inbox: None,
            last_trace: None,
        }
    }

    /// The trace context the router gave the delivery of the message this stream yielded
    /// last: the `map/message` frame's `params._meta.traceparent` / `tracestate` (the
    /// router's span of the delivery, when it exports traces; docs/trace-context.md), if
    /// valid. Not the message's own `meta.traceparent`, which the message itself carries.
    pub fn delivered_trace(&self) -> Option<&TraceContext> {
        self.last_trace.as_ref()
    }
}

impl Stream for Messages {
    type Item = Message;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Message>> {
        let this = self.get_mut();
        let Some(inbox) = &this.inbox else {
            return Poll::Ready(None);
        };
        let mut q = inbox.lock();
        if let Some((m, trace)) = q.buf.pop_front() {
            drop(q);
            this.last_trace = trace;
            return Poll::Ready(Some(m));
        }
        if q.ended {
            return Poll::Ready(None);
        }
        q.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// The trace context of a `map/message` frame's `params._meta` (`traceparent`, `tracestate`),
/// when it has a valid one. A malformed `_meta` is ignored, never a reason to drop the message.
pub(crate) fn delivery_trace(params: &serde_json::value::RawValue) -> Option<TraceContext> {
    #[derive(serde::Deserialize)]
    struct Frame {
        #[serde(default, rename = "_meta")]
        meta: Option<Value>,
    }
    if !params.get().contains("_meta") {
        return None;
    }
    let meta = serde_json::from_str::<Frame>(params.get()).ok()?.meta?;
    TraceContext::new(
        meta.get("traceparent")?.as_str()?,
        meta.get("tracestate").and_then(Value::as_str),
    )
}

/// The agent ids a `to` address names explicitly, or `None` for group addresses.
pub(crate) fn explicit_agents(to: &Value) -> Option<Vec<&str>> {
    match to {
        Value::String(s) if s.starts_with("scope:") => None,
        Value::String(s) => Some(vec![s.strip_prefix("agent:").unwrap_or(s)]),
        Value::Object(o) if o.get("system").is_none() => {
            if let Some(a) = o.get("agent").and_then(Value::as_str) {
                Some(vec![a])
            } else {
                o.get("agents")
                    .and_then(Value::as_array)
                    .map(|list| list.iter().filter_map(Value::as_str).collect())
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn raw(v: Value) -> Box<serde_json::value::RawValue> {
        serde_json::value::RawValue::from_string(v.to_string()).unwrap()
    }

    fn message(id: &str, meta: Value) -> Message {
        serde_json::from_value(json!({"id": id, "from": "a", "to": {"agent": "b"},
            "timestamp": 0, "meta": meta}))
        .unwrap()
    }

    #[test]
    fn the_frames_trace_context_is_read_leniently() {
        let t = delivery_trace(&raw(json!({"message": {}, "_meta": {"traceparent": TP,
            "tracestate": "a=1"}})))
        .unwrap();
        assert_eq!(
            (&*t.traceparent, t.tracestate.as_deref()),
            (TP, Some("a=1"))
        );
        for bad in [
            json!({"message": {}}),
            json!({"message": {}, "_meta": 3}),
            json!({"message": {}, "_meta": {"traceparent": 3}}),
            json!({"message": {}, "_meta": {"traceparent": TP.to_uppercase()}}),
            // The message's own meta is not the frame's.
            json!({"message": {"meta": {"traceparent": TP}}}),
        ] {
            assert!(delivery_trace(&raw(bad.clone())).is_none(), "{bad}");
        }
    }

    #[tokio::test]
    async fn each_message_read_tells_its_own_delivery_trace() {
        use futures::StreamExt;
        let inbox = Inbox::new(8, "t");
        let t = TraceContext::new(TP, None);
        inbox.push(message("m1", json!({})), t.clone());
        inbox.push(message("m2", json!({"traceparent": TP})), None);
        let mut messages = inbox.take().unwrap();
        assert!(messages.delivered_trace().is_none());
        assert_eq!(messages.next().await.unwrap().id.as_str(), "m1");
        assert_eq!(messages.delivered_trace(), t.as_ref());
        assert_eq!(messages.next().await.unwrap().id.as_str(), "m2");
        assert!(messages.delivered_trace().is_none());
    }

    #[test]
    fn explicit_addresses_name_agents() {
        assert_eq!(explicit_agents(&json!("a")), Some(vec!["a"]));
        assert_eq!(explicit_agents(&json!("agent:a")), Some(vec!["a"]));
        assert_eq!(explicit_agents(&json!({"agent": "a"})), Some(vec!["a"]));
        assert_eq!(
            explicit_agents(&json!({"agents": ["a", "b"]})),
            Some(vec!["a", "b"])
        );
        assert_eq!(explicit_agents(&json!({"scope": "s"})), None);
        assert_eq!(explicit_agents(&json!("scope:s")), None);
        assert_eq!(explicit_agents(&json!({"broadcast": true})), None);
    }
}
