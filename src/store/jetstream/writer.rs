//! The writer task: publishes queued rows in windows, turns acknowledgements into the
//! `committed` watch, and retries what was not acknowledged.
//!
//! Owns the queue of rows not yet acknowledged (oldest first; its front is always the row at
//! `committed`). Each round publishes up to `max_in_flight` rows from the front, each with
//! `Nats-Expected-Last-Sequence: seq - 1`, then collects their acks in whatever order they
//! resolve and moves `committed` over the contiguous acknowledged prefix only (once for the
//! acks that are in together, not once per ack: each move wakes every waiting call and the
//! router's delivery). Anything after the first unacknowledged row is republished next round;
//! the event id as `Nats-Msg-Id` makes a republished row a duplicate the server acknowledges
//! with its original sequence. Every row behind the front also carries
//! `Nats-Expected-Last-Msg-Id` (its predecessor's id), so a row never lands after another
//! writer's row that took the front's position.
//!
//! Fencing: a writer cut off from NATS may have been replaced meanwhile (a standby saw no
//! writer answer, claimed the writer lock and took over). Before it publishes again after its
//! connection to NATS was re-established, or after a round that was not acknowledged, the
//! writer reads the writer lock: if the newest claim is not its own, it stops publishing as a
//! diverged writer does and stops answering as the writer (so standbys and relays see only the
//! new one), instead of landing its queued rows in front of the new writer's first row.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::Context;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt as _};
use tokio::sync::{mpsc, watch};

use super::codec;
use super::reader::{lock, Reader, Shared};
use crate::store::record::{EventRecord, StoredRow};
use crate::store::StoreError;

const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What the writer task receives.
pub(super) enum Incoming {
    Rows(Vec<StoredRow>),
    Records(Vec<Arc<EventRecord>>),
}

/// What the writer is built from.
pub(super) struct WriterConfig {
    pub js: Context,
    pub prefix: String,
    pub max_in_flight: usize,
    pub close_timeout: Duration,
    pub next_seq: u64,
    pub committed: watch::Sender<u64>,
    pub shared: Arc<Shared>,
    pub reader: Reader,
    /// The largest message the NATS server takes (`max_payload` of its INFO).
    pub max_payload: usize,
    /// The writer lock this writer holds (`None`: a store opened without `exclusive`).
    pub fence: Option<Fence>,
}

/// The writer lock claim a writer holds, checked after its connection to NATS came back.
#[derive(Debug)]
pub(super) struct Fence {
    pub client: async_nats::Client,
    /// The lock stream.
    pub lock: async_nats::jetstream::stream::Stream,
    pub subject: String,
    /// Our claim's sequence in the lock stream.
    pub seq: u64,
    /// The connection's `connects` count when the claim was last seen to be ours.
    pub connects: u64,
    pub timeout: Duration,
}

impl Fence {
    fn connects_now(&self) -> u64 {
        self.client
            .statistics()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the claim must be read again before publishing.
    fn due(&self, stalled: bool) -> bool {
        stalled || self.connects_now() != self.connects
    }

    /// Reads the newest claim: `Ok(())` while it is ours.
    async fn check(&mut self) -> Result<(), Stall> {
        let connects = self.connects_now();
        let newest = tokio::time::timeout(
            self.timeout,
            self.lock.get_last_raw_message_by_subject(&self.subject),
        )
        .await;
        match newest {
            Ok(Ok(msg)) if msg.sequence == self.seq => {
                self.connects = connects;
                Ok(())
            }
            Ok(Ok(msg)) => Err(Stall::Diverged(format!(
                "another node took over the stream: the writer lock's newest claim is {:?} (lock                  seq {}), not this node's (lock seq {})",
                String::from_utf8_lossy(&msg.payload),
                msg.sequence,
                self.seq
            ))),
            Ok(Err(e)) => Err(Stall::Transient(format!("reading the writer lock: {e}"))),
            Err(_) => Err(Stall::Transient(format!(
                "reading the writer lock: no answer within {:?}",
                self.timeout
            ))),
        }
    }
}

/// Room kept in a message for its headers (id, timestamp, kind, lengths, and the expected
/// sequence and id the writer adds).
const HEADER_ROOM: usize = 1024;

pub(super) struct Writer {
    c: WriterConfig,
    queue: VecDeque<StoredRow>,
    /// The seq the next incoming row must have.
    expected: u64,
    /// Every seq below this is acknowledged (the queue's front is at this seq).
    committed_next: u64,
}

/// Why a round made no progress.
enum Stall {
    /// NATS unreachable, slow or restarting: retry with backoff.
    Transient(String),
    /// The stream holds something else at our position: stop publishing.
    Diverged(String),
}

impl Writer {
    pub(super) fn new(c: WriterConfig) -> Self {
        Self {
            expected: c.next_seq,
            committed_next: c.next_seq,
            c,
            queue: VecDeque::new(),
        }
    }

    /// Accepts incoming rows that continue the queue; logs and drops the others (a reused or
    /// skipped sequence number can never be published at its position).
    fn take(&mut self, incoming: Incoming) {
        let rows = match incoming {
            Incoming::Rows(rows) => rows,
            Incoming::Records(records) => crate::store::rows_of(&records),
        };
        for mut row in rows {
            if row.seq == self.expected {
                self.fit(&mut row);
                self.expected += 1;
                self.queue.push_back(row);
            } else {
                tracing::error!(
                    seq = row.seq,
                    expected = self.expected,
                    "event store (JetStream): a row out of sequence; not stored"
                );
            }
        }
    }

    /// A row larger than one NATS message cannot be stored at its position, and the stream's
    /// positions are dense: its event is stored as a stand-in that keeps its id, type and
    /// timestamp and says what was left out (logged as an error), so that the rows behind it
    /// are stored. docs/cluster.md says to set NATS `max_payload` so that this never happens.
    fn fit(&self, row: &mut StoredRow) {
        let bytes = row.meta.len() + row.json.len();
        // NB: 0 when the server did not say (never on a live connection): no limit known.
        if self.c.max_payload == 0 || bytes + HEADER_ROOM <= self.c.max_payload {
            return;
        }
        tracing::error!(
            seq = row.seq,
            id = %row.id,
            kind = %row.kind,
            bytes,
            max_payload = self.c.max_payload,
            "event store (JetStream): an event larger than a NATS message; its data is not \
             stored (raise max_payload in nats-server)"
        );
        row.json = serde_json::json!({
            "id": row.id,
            "type": row.kind,
            "timestamp": row.timestamp,
            "data": {"omitted": {
                "bytes": bytes,
                "reason": format!(
                    "the event was larger than a NATS message ({} bytes)",
                    self.c.max_payload
                ),
            }},
        })
        .to_string();
    }

    pub(super) async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Incoming>,
    ) -> Result<(), StoreError> {
        let mut closing: Option<Instant> = None;
        let mut backoff = MIN_BACKOFF;
        loop {
            if self.queue.is_empty() {
                if closing.is_some() {
                    return Ok(());
                }
                match rx.recv().await {
                    Some(incoming) => self.take(incoming),
                    None => {
                        closing = Some(Instant::now() + self.c.close_timeout);
                        continue;
                    }
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(incoming) => self.take(incoming),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        closing.get_or_insert_with(|| Instant::now() + self.c.close_timeout);
                        break;
                    }
                }
            }
            let fenced = match self.c.fence.as_mut() {
                // Nothing is published while the connection is down: the client would buffer
                // it and send it on reconnecting, before the claim could be checked.
                Some(f)
                    if !matches!(
                        f.client.connection_state(),
                        async_nats::connection::State::Connected
                    ) =>
                {
                    Err(Stall::Transient("not connected to NATS".into()))
                }
                Some(f) if f.due(backoff != MIN_BACKOFF) => f.check().await,
                _ => Ok(()),
            };
            let outcome = match fenced {
                Ok(()) => self.round().await,
                Err(stall) => Err(stall),
            };
            match outcome {
                Ok(()) => backoff = MIN_BACKOFF,
                Err(Stall::Transient(e)) => {
                    if closing.is_some_and(|deadline| Instant::now() >= deadline) {
                        return Err(StoreError::Io(format!(
                            "NATS JetStream: closing with {} rows not acknowledged (from seq {}): {e}",
                            self.queue.len(),
                            self.committed_next
                        )));
                    }
                    tracing::warn!(
                        error = %e,
                        pending = self.queue.len(),
                        from = self.committed_next,
                        "event store (JetStream): publish not acknowledged; retrying"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(Stall::Diverged(why)) => {
                    tracing::error!(
                        why = %why,
                        pending = self.queue.len(),
                        "event store (JetStream): the stream diverged from this node's log; \
                         publishing stopped"
                    );
                    *lock(&self.c.shared.diverged) = Some(why.clone());
                    // No longer the writer: standbys asking who writes must not be told it is.
                    if let Some(responder) = lock(&self.c.shared.responder).take() {
                        responder.abort();
                    }
                    // Nothing more can be published at our positions: drain until closed.
                    while rx.recv().await.is_some() {}
                    return Err(StoreError::Io(format!("NATS JetStream: diverged: {why}")));
                }
            }
        }
    }

    /// Publishes one window from the front of the queue and collects its acks.
    async fn round(&mut self) -> Result<(), Stall> {
        let window = self.queue.len().min(self.c.max_in_flight);
        let mut acks = FuturesUnordered::new();
        let mut send_error = None;
        let mut previous: Option<&str> = None;
        for row in self.queue.iter().take(window) {
            let (headers, payload) = codec::encode(row).map_err(Stall::Diverged)?;
            let mut publish = PublishMessage::build()
                .headers(headers)
                .payload(payload)
                .expected_last_sequence(row.seq.saturating_sub(1));
            // Behind the window's front, the sequence check is not enough: if another writer
            // took the front's position, the next row would land right after *its* row. So
            // each later row also names its predecessor's id. (The front's predecessor is
            // committed, so it needs no such check, which also covers a server that does not
            // remember its last message id across a restart.)
            if let Some(id) = previous {
                publish = publish.expected_last_message_id(id);
            }
            previous = Some(row.id.as_str());
            let subject = codec::subject(&self.c.prefix, &row.kind);
            match self.c.js.send_publish(subject, publish).await {
                Ok(ack) => {
                    let seq = row.seq;
                    acks.push(async move { (seq, ack.await) });
                }
                Err(e) => {
                    send_error = Some(e.to_string());
                    break;
                }
            }
        }
        let front = self.committed_next;
        let mut acked = BTreeSet::new();
        let mut front_outcome = None;
        let mut next = acks.next().await;
        while let Some((seq, result)) = next {
            match result {
                Ok(ack) if ack.sequence == seq => {
                    acked.insert(seq);
                }
                other if seq == front => front_outcome = Some(other),
                _ => {}
            }
            // The acks already in move `committed` once: every move wakes each call waiting
            // for a commit and the router's delivery of committed events.
            next = match acks.next().now_or_never() {
                Some(ready) => ready,
                None => {
                    self.advance(&mut acked);
                    acks.next().await
                }
            };
        }
        self.advance(&mut acked);
        if self.committed_next > front {
            return Ok(());
        }
        match front_outcome {
            None => Err(Stall::Transient(
                send_error.unwrap_or_else(|| "nothing was acknowledged".into()),
            )),
            Some(Ok(ack)) => Err(Stall::Diverged(format!(
                "event {} (seq {front}) is already in the stream at seq {}",
                self.queue.front().map_or("?", |r| r.id.as_str()),
                ack.sequence
            ))),
            Some(Err(e)) if e.kind() == PublishErrorKind::WrongLastSequence => {
                self.check_position().await
            }
            Some(Err(e)) => Err(Stall::Transient(e.to_string())),
        }
    }

    /// The stream's last sequence was not `front - 1`: see what is at `front`.
    async fn check_position(&mut self) -> Result<(), Stall> {
        let Some(row) = self.queue.front() else {
            return Ok(());
        };
        let (seq, id) = (row.seq, row.id.clone());
        match self.c.reader.get(seq).await {
            Err(e) => Err(Stall::Transient(e.to_string())),
            // Ours (its ack was lost and the duplicate window has passed): committed.
            Ok(Some(there)) if there.id == id => {
                let mut acked = BTreeSet::from([seq]);
                self.advance(&mut acked);
                Ok(())
            }
            Ok(Some(there)) => Err(Stall::Diverged(format!(
                "seq {seq} holds event {} (another writer), not this node's {id}",
                there.id
            ))),
            Ok(None) => Err(Stall::Diverged(format!(
                "the stream ends before seq {}: acknowledged rows are gone (stream purged or \
                 recreated?)",
                seq.saturating_sub(1)
            ))),
        }
    }

    /// Moves `committed` over the acknowledged prefix of the queue, feeding each of its rows to
    /// the kept tables first.
    fn advance(&mut self, acked: &mut BTreeSet<u64>) {
        let before = self.committed_next;
        let mut kept = None;
        while acked.remove(&self.committed_next) {
            if let Some(row) = self.queue.pop_front() {
                // Into the kept tables before `committed` says the row is there.
                kept.get_or_insert_with(|| lock(&self.c.shared.kept))
                    .ingest(row);
            }
            self.committed_next += 1;
        }
        drop(kept);
        if self.committed_next != before {
            let next = self.committed_next;
            self.c.committed.send_modify(|c| *c = next);
        }
    }
}
