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

use tokio::sync::watch;
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
    /// When to give up on the commit and answer with an error.
    deadline: Instant,
    handled: Handled,
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
            deadline: Instant::now() + self.timeout,
            handled,
        });
    }

    /// Resolves when the head may be answered (committed, timed out, or the store stopped).
    /// Never resolves while the queue is empty. Cancel-safe: it only watches.
    pub async fn head_ready(&mut self) {
        let Some(head) = self.queue.front() else {
            return std::future::pending().await;
        };
        let Some((until, _)) = &head.commit else {
            return;
        };
        let (until, deadline) = (*until, head.deadline);
        let _ = tokio::time::timeout_at(deadline, self.committed.wait_for(|c| *c >= until)).await;
    }

    /// Takes the head if it may be answered now, with its response replaced by an error
    /// when its events were not committed in time. `None` when the head must still wait.
    pub fn pop_ready(&mut self) -> Option<Handled> {
        let head = self.queue.front()?;
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
