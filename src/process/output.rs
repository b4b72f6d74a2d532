//! A supervised child's stderr: line by line into the router's log, `agent.stderr` events and
//! a bounded tail, at a bounded rate.
//!
//! Lines are batched (at most [`BATCH_LINES`] per event, flushed after [`BATCH_DELAY`]) and
//! rate-limited to [`LINES_PER_SECOND`] per child; lines over the limit are not published but
//! counted, and the count rides on the next event as `dropped`, so a flood is visible without
//! flooding the event log. Every line, published or not, enters the tail that exit events
//! carry.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::io::AsyncRead;
use tokio::time::Instant;
use tokio_util::codec::FramedRead;

use crate::protocol::ids::AgentId;
use crate::router::RouterHandle;
use crate::transport::connection::InFrame;
use crate::transport::ndjson::NdjsonCodec;

/// Longest stderr line kept (longer lines are truncated).
pub const MAX_LINE: usize = 4096;
/// Lines kept in the tail.
pub const TAIL_LINES: usize = 20;
/// Most lines in one `agent.stderr` event.
pub const BATCH_LINES: usize = 50;
/// Longest a line waits before its batch is published.
pub const BATCH_DELAY: Duration = Duration::from_millis(100);
/// Most lines published per second per child.
pub const LINES_PER_SECOND: usize = 200;

/// The last lines a child wrote to stderr.
#[derive(Debug, Default, Clone)]
pub struct Tail(Arc<Mutex<VecDeque<String>>>);

impl Tail {
    fn push(&self, line: String) {
        // A poisoned lock only means another reader panicked mid-copy; the data is still a
        // valid deque of strings.
        let mut t = crate::sync::lock(&self.0);
        if t.len() == TAIL_LINES {
            t.pop_front();
        }
        t.push_back(line);
    }

    /// A copy of the tail, oldest line first.
    pub fn lines(&self) -> Vec<String> {
        crate::sync::lock(&self.0).iter().cloned().collect()
    }

    /// Forgets everything (a restarted process starts a new tail).
    pub fn clear(&self) {
        crate::sync::lock(&self.0).clear();
    }
}

fn text(frame: InFrame) -> Option<String> {
    match frame {
        InFrame::Text(t) => Some(t),
        InFrame::TooLarge { len } => Some(format!("<line of {len} bytes, longer than {MAX_LINE}>")),
        InFrame::BadUtf8 => Some("<line that is not UTF-8>".into()),
        _ => None,
    }
}

/// Reads `stderr` to its end, publishing as described in the module docs.
pub async fn collect<R>(stderr: R, agent: AgentId, pid: u32, router: RouterHandle, tail: Tail)
where
    R: AsyncRead + Unpin + Send,
{
    let mut lines = FramedRead::new(stderr, NdjsonCodec::new(MAX_LINE));
    let mut batch: Vec<String> = Vec::new();
    let mut dropped: u64 = 0;
    let mut budget = LINES_PER_SECOND;
    let mut window = Instant::now();
    let mut flush_at: Option<Instant> = None;
    loop {
        let frame = tokio::select! {
            frame = lines.next() => frame,
            () = sleep_until(flush_at) => {
                flush(&router, &agent, pid, &mut batch, &mut dropped).await;
                flush_at = None;
                continue;
            }
        };
        let line = match frame {
            Some(Ok(frame)) => match text(frame) {
                Some(line) => line,
                None => continue,
            },
            Some(Err(_)) | None => break,
        };
        tail.push(line.clone());
        if window.elapsed() >= Duration::from_secs(1) {
            window = Instant::now();
            budget = LINES_PER_SECOND;
        }
        if budget == 0 {
            dropped += 1;
        } else {
            budget -= 1;
            tracing::info!(target: "map_router::child", agent = %agent, pid, "stderr: {line}");
            batch.push(line);
        }
        if batch.len() >= BATCH_LINES {
            flush(&router, &agent, pid, &mut batch, &mut dropped).await;
            flush_at = None;
        } else if flush_at.is_none() {
            flush_at = Some(Instant::now() + BATCH_DELAY);
        }
    }
    flush(&router, &agent, pid, &mut batch, &mut dropped).await;
}

async fn flush(
    router: &RouterHandle,
    agent: &AgentId,
    pid: u32,
    batch: &mut Vec<String>,
    dropped: &mut u64,
) {
    if batch.is_empty() && *dropped == 0 {
        return;
    }
    if *dropped > 0 {
        tracing::warn!(target: "map_router::child", agent = %agent, pid, dropped = *dropped, "stderr lines over the rate limit were not published");
    }
    let lines = std::mem::take(batch);
    let n = std::mem::take(dropped);
    let agent = agent.clone();
    let _ = router
        .with(move |r| r.supervised_output(&agent, pid, lines, n))
        .await;
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
