//! An inbox: the bounded queue the driver fills with `map/message`s for one agent (or for the
//! connection) and the one [`Messages`] stream that reads it; and which agents a message names
//! explicitly (the driver's routing rule).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures::Stream;
use serde_json::Value;

use crate::protocol::message::Message;

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
    buf: VecDeque<Message>,
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

    /// Queues a message, or drops it (logged and counted) when the inbox is full.
    pub fn push(&self, message: Message) {
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
        q.buf.push_back(message);
        if let Some(w) = q.waker.take() {
            w.wake();
        }
    }

    /// Removes and returns the queued messages `pred` selects, in order (the others stay).
    pub fn take_matching(&self, pred: impl Fn(&Message) -> bool) -> Vec<Message> {
        let mut q = self.lock();
        let (taken, kept): (VecDeque<Message>, VecDeque<Message>) = std::mem::take(&mut q.buf)
            .into_iter()
            .partition(|m| pred(m));
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
        })
    }
}

/// A stream of [`Message`]s delivered to an agent (or, from [`Client::messages`](crate::client::Client::messages), to the
/// connection). Ends when the client closes or the agent handle is dropped or unregistered.
#[derive(Debug)]
pub struct Messages {
    inbox: Option<Arc<Inbox>>,
}

impl Messages {
    /// A stream that has already ended (returned when the inbox was taken before).
    pub(crate) fn ended() -> Self {
        Self { inbox: None }
    }
}

impl Stream for Messages {
    type Item = Message;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Message>> {
        let Some(inbox) = &self.inbox else {
            return Poll::Ready(None);
        };
        let mut q = inbox.lock();
        if let Some(m) = q.buf.pop_front() {
            return Poll::Ready(Some(m));
        }
        if q.ended {
            return Poll::Ready(None);
        }
        q.waker = Some(cx.waker().clone());
        Poll::Pending
    }
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
