//! Answers that wait for the durable store, in request order, without holding up reading.
//!
//! Owns the per-connection queue of handled requests whose events must be committed before
//! their response may be sent (durability `durable`). Without it, a connection would read its
//! next request only after the store committed the previous one, so a client with several
//! requests in flight (a publisher sending as fast as it can) would get one commit per
//! request. With it, the router applies requests strictly in arrival order as before, the
//! store commits them in groups, and responses leave strictly in request order, each only once
//! its own events are committed. A response that is not waiting for anything still queues
//! behind those that are, so order is never broken. The queue is bounded
//! ([`MAX_WAITING`]): when it is full the connection stops reading until the head commits.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::protocol::jsonrpc::{self, Id};

use crate::router::error::RouterError;
use crate::router::reply::Handled;

/// Handled requests a connection may have waiting for commits before it stops reading.
pub const MAX_WAITING: usize = 256;

/// One handled frame and what must be committed before its response goes out.
#[derive(Debug)]
struct Waiting {
    /// The log position to be committed, and the request id (for the error if it is not).
    commit: Option<(u64, Id)>,
    /// On a follower, a call relayed to the writer without waiting (`router::relay`).
    relayed: Option<Relayed>,
    /// When to give up on the commit (or the relayed answer) and answer with an error.
    deadline: Instant,
    handled: Handled,
}

/// A call relayed to the writer: its response frame comes on `answer` (kept in `got` once
/// it came: `Err` when the relay session ended first); `id`, for the error if it does not.
#[derive(Debug)]
struct Relayed {
    answer: oneshot::Receiver<String>,
    got: Option<Result<String, ()>>,
    id: Id,
}

impl Relayed {
    /// Takes the answer into `got` if it came; whether it has.
    fn poll_answer(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        use std::future::Future;
        if self.got.is_none() {
            match std::pin::Pin::new(&mut self.answer).poll(cx) {
                std::task::Poll::Pending => return std::task::Poll::Pending,
                std::task::Poll::Ready(r) => self.got = Some(r.map_err(drop)),
            }
        }
        std::task::Poll::Ready(())
    }
}

/// The queue; see the module docs.
#[derive(Debug)]
pub struct Pipeline {
    committed: watch::Receiver<u64>,
    timeout: Duration,
    queue: VecDeque<Waiting>,
}

impl Pipeline {
    /// A queue following the store's commit progress; answers not committed within
    /// `timeout` become `NotDurable` errors.
    pub fn new(committed: watch::Receiver<u64>, timeout: Duration) -> Self {
        Self {
            committed,
            timeout,
            queue: VecDeque::new(),
        }
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether the queue is at its bound.
    pub fn is_full(&self) -> bool {
        self.queue.len() >= MAX_WAITING
    }

    /// Queues a handled frame; `commit` says what must be committed first.
    pub fn push(&mut self, handled: Handled, commit: Option<(u64, Id)>) {
        self.queue.push_back(Waiting {
            commit,
            relayed: None,
            deadline: Instant::now() + self.timeout,
            handled,
        });
    }

    /// Queues a call relayed to the writer (request `id`) whose response frame comes on
    /// `answer`, replacing `handled`'s; given up with an error after `timeout`.
    pub fn push_relayed(
        &mut self,
        handled: Handled,
        answer: oneshot::Receiver<String>,
        id: Id,
        timeout: Duration,
    ) {
        self.queue.push_back(Waiting {
            commit: None,
            relayed: Some(Relayed {
                answer,
                got: None,
                id,
            }),
            deadline: Instant::now() + timeout,
            handled,
        });
    }

    /// Resolves when the head may be answered (committed, timed out, or the store stopped).
    /// Never resolves while the queue is empty. Cancel-safe: it only watches.
    pub async fn head_ready(&mut self) {
        let Some(head) = self.queue.front_mut() else {
            return std::future::pending().await;
        };
        let deadline = head.deadline;
        if let Some(relayed) = head.relayed.as_mut() {
            // NB: cancel-safe: an answer that came is kept in `got` in the same poll.
            let _ = tokio::time::timeout_at(
                deadline,
                std::future::poll_fn(|cx| relayed.poll_answer(cx)),
            )
            .await;
            return;
        }
        let Some((until, _)) = &head.commit else {
            return;
        };
        let (until, deadline) = (*until, head.deadline);
        let _ = tokio::time::timeout_at(deadline, self.committed.wait_for(|c| *c >= until)).await;
    }

    /// Takes the head if it may be answered now, with its response replaced by an error
    /// when its events were not committed in time. `None` when the head must still wait.
    pub fn pop_ready(&mut self) -> Option<Handled> {
        let head = self.queue.front_mut()?;
        if let Some(relayed) = head.relayed.as_mut() {
            let waker = futures::task::noop_waker();
            let _ = relayed.poll_answer(&mut std::task::Context::from_waker(&waker));
            let response = match relayed.got.take() {
                Some(Ok(frame)) => frame,
                Some(Err(())) => relayed_error(&relayed.id, "the relay session ended"),
                None if Instant::now() < head.deadline => return None,
                None => relayed_error(&relayed.id, "no answer in time"),
            };
            let mut w = self.queue.pop_front()?;
            w.handled.response = Some(response);
            return Some(w.handled);
        }
        let committed = *self.committed.borrow();
        let ok = match &head.commit {
            None => true,
            Some((until, _)) => committed >= *until,
        };
        let store_gone = self.committed.has_changed().is_err();
        if !ok && !store_gone && Instant::now() < head.deadline {
            return None;
        }
        let mut w = self.queue.pop_front()?;
        if !ok {
            if let Some((_, id)) = &w.commit {
                let error = RouterError::not_committed(store_gone, self.timeout);
                let mut frame = String::new();
                jsonrpc::write_error(&mut frame, id, &error.to_error_object());
                w.handled.response = Some(frame);
                w.handled.after.clear();
            }
        }
        Some(w.handled)
    }
}

/// The answer to relayed call `id` that got none from the writer.
fn relayed_error(id: &Id, why: &str) -> String {
    let mut frame = String::new();
    jsonrpc::write_error(
        &mut frame,
        id,
        &crate::router::relay::unreachable_writer(why),
    );
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handled(text: &str) -> Handled {
        Handled {
            response: Some(text.to_owned()),
            after: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_relayed_answer_takes_its_place_in_order() {
        let (_committed, rx) = watch::channel(0);
        let mut p = Pipeline::new(rx, Duration::from_secs(5));
        let (a_tx, a_rx) = oneshot::channel();
        p.push_relayed(
            handled("placeholder"),
            a_rx,
            Id::number(1),
            Duration::from_secs(5),
        );
        p.push(handled("b"), None);
        assert!(
            p.pop_ready().is_none(),
            "the relayed head waits for its answer"
        );
        a_tx.send("a".to_owned()).unwrap();
        tokio::time::timeout(Duration::from_secs(1), p.head_ready())
            .await
            .expect("ready once answered");
        assert_eq!(p.pop_ready().unwrap().response.as_deref(), Some("a"));
        assert_eq!(p.pop_ready().unwrap().response.as_deref(), Some("b"));
        assert!(p.is_empty());
    }

    #[tokio::test]
    async fn a_relayed_call_without_an_answer_gets_an_error_with_its_id() {
        let (_committed, rx) = watch::channel(0);
        let mut p = Pipeline::new(rx, Duration::from_secs(5));
        let (gone, rx_gone) = oneshot::channel::<String>();
        p.push_relayed(handled("x"), rx_gone, Id::number(7), Duration::from_secs(5));
        let (_late, rx_late) = oneshot::channel::<String>();
        p.push_relayed(
            handled("y"),
            rx_late,
            Id::number(8),
            Duration::from_millis(20),
        );
        drop(gone);
        let first = p.pop_ready().unwrap().response.unwrap();
        assert!(
            first.contains(r#""id":7"#) && first.contains("relay session ended"),
            "{first}"
        );
        assert!(p.pop_ready().is_none());
        tokio::time::timeout(Duration::from_secs(1), p.head_ready())
            .await
            .expect("ready at its deadline");
        let second = p.pop_ready().unwrap().response.unwrap();
        assert!(
            second.contains(r#""id":8"#) && second.contains("no answer in time"),
            "{second}"
        );
    }
}
