//! The read side of the JetStream store: the stream's bounds, direct gets, range reads (direct
//! gets when short, an ephemeral consumer when long: [`Reader::scan`]), the binary searches by
//! id and time, reads by kind; and the state the handle and the writer share.
//!
//! Owns nothing but a stream handle (cheap to clone into each read's future). Every request is
//! bounded by the store's request timeout and fails as [`StoreError::Io`] naming NATS.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, Consumer, DeliverPolicy};
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{
    DirectGetError, DirectGetErrorKind, RawMessageError, RawMessageErrorKind, Stream,
};
use futures::StreamExt as _;

use super::codec::{self, decode};
use crate::protocol::ids::EventId;
use crate::store::kept::{KeptAnswer, KeptQuery};
use crate::store::memory::MemoryKept;
use crate::store::record::StoredRow;
use crate::store::{Recovered, StoreError, StoreFuture};

/// Direct gets issued at once by a short range read.
const READ_CONCURRENCY: usize = 64;
/// Rows up to which a read uses direct gets; a longer one reads through a consumer
/// ([`Reader::scan`]): creating it costs two round trips, after which 1024 rows come per
/// round trip instead of one per direct get.
const DIRECT_READ_MAX: u64 = 64;
/// Messages per fetch of a scan.
const SCAN_BATCH: usize = 1024;
/// How often `first_seq` is refreshed from the stream's state.
const FIRST_SEQ_REFRESH: Duration = Duration::from_secs(1);

/// State shared by the handle, the writer and the refresher.
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) first_seq: AtomicU64,
    pub(super) diverged: Mutex<Option<String>>,
    /// Stops this node answering as the stream's writer ([`super::writer_subject`]) once it
    /// may no longer write (diverged, or another node took the writer lock).
    pub(super) responder: Mutex<Option<tokio::task::AbortHandle>>,
    /// The kept tables, folded from the committed log (`fold.rs`).
    pub(super) kept: Mutex<MemoryKept>,
}

pub(super) use crate::sync::lock;

/// What reads need: cheap to clone into each read's future.
#[derive(Debug, Clone)]
pub(super) struct Reader {
    pub(super) stream: Stream,
    pub(super) prefix: Arc<str>,
    pub(super) timeout: Duration,
    pub(super) shared: Arc<Shared>,
}

pub(super) fn nats_err(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(format!("NATS JetStream: {what}: {e}"))
}

/// Runs `fut` within `limit`, mapping both failures to [`StoreError::Io`].
pub(super) async fn bounded<T, E: std::fmt::Display>(
    limit: Duration,
    what: &str,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map_err(|e| nats_err(what, e)),
        Err(_) => Err(nats_err(what, format!("no answer within {limit:?}"))),
    }
}

pub(super) async fn refresh_first_seq(reader: Reader) {
    loop {
        tokio::time::sleep(FIRST_SEQ_REFRESH).await;
        let _ = reader.bounds().await;
    }
}

/// The reads of [`crate::store::EventStore`] as its futures, for the stores that answer them
/// from the stream (the writer's store and a standby's follower).
impl Reader {
    /// The oldest retained seq as last seen (kept fresh by [`refresh_first_seq`]).
    pub(super) fn first_seq(&self) -> u64 {
        self.shared.first_seq.load(Ordering::Acquire)
    }

    pub(super) fn read_owned(&self, from: u64, limit: usize) -> StoreFuture<Vec<StoredRow>> {
        let r = self.clone();
        Box::pin(async move { r.read(from, limit).await })
    }

    pub(super) fn seq_after_owned(&self, id: EventId) -> StoreFuture<u64> {
        let r = self.clone();
        let id = id.to_string();
        Box::pin(async move { r.lower_bound(|row| row.id.as_str() > id.as_str()).await })
    }

    pub(super) fn seq_at_or_after_time_owned(&self, ts: u64) -> StoreFuture<u64> {
        let r = self.clone();
        Box::pin(async move { r.lower_bound(|row| row.timestamp >= ts).await })
    }

    pub(super) fn read_kinds_owned(
        &self,
        kinds: Vec<String>,
        from: u64,
        limit: usize,
    ) -> StoreFuture<Vec<StoredRow>> {
        let r = self.clone();
        Box::pin(async move { r.read_kinds(kinds, from, limit).await })
    }

    pub(super) fn read_ids_owned(&self, ids: Vec<EventId>) -> StoreFuture<Vec<StoredRow>> {
        let r = self.clone();
        Box::pin(async move { r.read_ids(ids).await })
    }

    /// The kept tables, answered from memory at once (the fold holds committed rows only).
    pub(super) fn kept_owned(&self, query: &KeptQuery) -> StoreFuture<KeptAnswer> {
        let answer = lock(&self.shared.kept).query(query);
        Box::pin(async move { Ok(answer) })
    }
}

impl Reader {
    /// The stream's `(first, next)`: the oldest retained seq and the one after the newest.
    /// Also refreshes `first_seq`.
    pub(super) async fn bounds(&self) -> Result<(u64, u64), StoreError> {
        let info = bounded(
            self.timeout,
            "reading the stream state",
            self.stream.get_info(),
        )
        .await?;
        let next = info.state.last_sequence + 1;
        let first = if info.state.messages == 0 {
            next
        } else {
            info.state.first_sequence
        };
        self.shared.first_seq.fetch_max(first, Ordering::AcqRel);
        Ok((first, next))
    }

    /// The row at `seq`, `None` when there is none (not yet written, or deleted).
    pub(super) async fn get(&self, seq: u64) -> Result<Option<StoredRow>, StoreError> {
        let what = format!("reading seq {seq}");
        let direct = self.stream.direct_get(seq);
        let found = self
            .settled(&what, direct, || self.stream.get_raw_message(seq))
            .await?;
        found.map(|msg| decode(&msg)).transpose()
    }

    /// The first message on `subject` at or after `seq`, `None` when there is none.
    async fn next_for_subject(
        &self,
        subject: &str,
        seq: u64,
    ) -> Result<Option<StreamMessage>, StoreError> {
        let direct = self
            .stream
            .direct_get_next_for_subject(subject.to_owned(), Some(seq));
        self.settled("reading by kind", direct, || {
            self.stream.get_first_raw_message_by_subject(subject, seq)
        })
        .await
    }

    /// The message a direct get answers, its "not found" asked again of the stream's leader
    /// (`leader`) before it is believed: any replica answers a direct get, and one behind the
    /// leader (a NATS server just back from a partition, or one that has not applied the
    /// newest commit yet) says "not found" for a row the stream holds. Believed at once, a
    /// hole taken for deletion lost a catch-up its events, a binary search stepped past its
    /// answer, and the writer took a lagging replica for a purged stream. Each request is
    /// bounded by the request timeout; `what` names the read in errors.
    async fn settled<L>(
        &self,
        what: &str,
        direct: impl std::future::Future<Output = Result<StreamMessage, DirectGetError>>,
        leader: impl FnOnce() -> L,
    ) -> Result<Option<StreamMessage>, StoreError>
    where
        L: std::future::Future<Output = Result<StreamMessage, RawMessageError>>,
    {
        let no_answer = || nats_err(what, format!("no answer within {:?}", self.timeout));
        match tokio::time::timeout(self.timeout, direct).await {
            Err(_) => return Err(no_answer()),
            Ok(Ok(msg)) => return Ok(Some(msg)),
            Ok(Err(e)) if e.kind() == DirectGetErrorKind::NotFound => {}
            Ok(Err(e)) => return Err(nats_err(what, e)),
        }
        match tokio::time::timeout(self.timeout, leader()).await {
            Err(_) => Err(no_answer()),
            Ok(Ok(msg)) => Ok(Some(msg)),
            Ok(Err(e)) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
            Ok(Err(e)) => Err(nats_err(what, e)),
        }
    }

    pub(super) async fn recover(&self, recent_rows: usize) -> Result<Recovered, StoreError> {
        let (first, next) = self.bounds().await?;
        self.shared.first_seq.store(first, Ordering::Release);
        let mut recovered = Recovered {
            next_seq: next,
            first_seq: first,
            ..Recovered::default()
        };
        if first < next {
            let last = self.get(next - 1).await?.ok_or_else(|| {
                // A direct get may be answered by a replica that has not caught up yet (a NATS
                // server just back from a partition): an answer to wait for (the opens retry
                // `Io` within their patience), not a corrupt stream.
                StoreError::Io(format!(
                    "NATS JetStream: the newest row (seq {}) is not there yet (a replica behind \
                     the stream's leader?)",
                    next - 1
                ))
            })?;
            recovered.last_id = Some(EventId::parse(&last.id).ok_or_else(|| {
                StoreError::Corrupt(format!("bad event id {} at seq {}", last.id, last.seq))
            })?);
            recovered.last_timestamp = last.timestamp;
            let from = next.saturating_sub(recent_rows as u64).max(first);
            recovered.recent = self.read(from, recent_rows).await?;
        }
        Ok(recovered)
    }

    pub(super) async fn read(&self, from: u64, limit: usize) -> Result<Vec<StoredRow>, StoreError> {
        let (first, next) = self.bounds().await?;
        let from = from.max(first);
        let to = next.min(from.saturating_add(limit as u64));
        if to.saturating_sub(from) > DIRECT_READ_MAX {
            let mut out = Vec::with_capacity((to - from) as usize);
            self.scan("reading a range", &self.every_subject(), from, to, |row| {
                out.push(row);
                true
            })
            .await?;
            return Ok(out);
        }
        let rows: Vec<Result<Option<StoredRow>, StoreError>> = futures::stream::iter(from..to)
            .map(|seq| self.get(seq))
            .buffered(READ_CONCURRENCY)
            .collect()
            .await;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            // A hole is a row retention deleted while we read: skip it.
            if let Some(row) = row? {
                out.push(row);
            }
        }
        Ok(out)
    }

    /// `<prefix>.>`: the subjects of every row.
    pub(super) fn every_subject(&self) -> String {
        format!("{}.>", self.prefix)
    }

    /// An ephemeral pull consumer of the rows on `subject` (wildcards allowed) from seq
    /// `from`: no acks, in memory, gone by itself after 30 s without a pull (its owner
    /// deletes it sooner when it can). `what` names the read in errors.
    pub(super) async fn consumer(
        &self,
        what: &str,
        subject: &str,
        from: u64,
    ) -> Result<Consumer<pull::Config>, StoreError> {
        bounded(
            self.timeout,
            what,
            self.stream.create_consumer(pull::Config {
                filter_subject: subject.to_owned(),
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: from,
                },
                ack_policy: AckPolicy::None,
                memory_storage: true,
                inactive_threshold: Duration::from_secs(30),
                ..Default::default()
            }),
        )
        .await
    }

    /// Calls `f` with every row on `subject` (wildcards allowed) in `[first, next)`, in
    /// sequence order, until it returns false. Reads through an ephemeral pull consumer
    /// without acks, [`SCAN_BATCH`] rows per round trip; every request is bounded by the
    /// request timeout; the consumer is deleted afterwards (and expires by itself if that
    /// fails). `what` names the read in errors.
    pub(super) async fn scan(
        &self,
        what: &str,
        subject: &str,
        first: u64,
        next: u64,
        mut f: impl FnMut(StoredRow) -> bool,
    ) -> Result<(), StoreError> {
        let consumer = self.consumer(what, subject, first).await?;
        let result = async {
            // The next seq the range may hold: a batch asks for no more than are left before
            // `next`, so a short range on a long stream does not fetch a full batch.
            let mut cursor = first;
            loop {
                let left = usize::try_from(next.saturating_sub(cursor)).unwrap_or(usize::MAX);
                let mut batch = bounded(
                    self.timeout,
                    what,
                    consumer
                        .fetch()
                        .max_messages(left.clamp(1, SCAN_BATCH))
                        .messages(),
                )
                .await?;
                let mut got = 0;
                let mut done = false;
                loop {
                    let msg = match tokio::time::timeout(self.timeout, batch.next()).await {
                        Err(_) => return Err(nats_err(what, "no answer within the timeout")),
                        Ok(None) => break,
                        Ok(Some(Err(e))) => return Err(nats_err(what, e)),
                        Ok(Some(Ok(msg))) => msg,
                    };
                    got += 1;
                    let info = msg.info().map_err(|e| nats_err(what, e))?;
                    let (seq, pending) = (info.stream_sequence, info.pending);
                    if seq >= next {
                        done = true;
                        break;
                    }
                    cursor = seq + 1;
                    if !f(codec::decode_parts(
                        seq,
                        msg.headers.as_ref(),
                        &msg.payload,
                    )?) {
                        done = true;
                        break;
                    }
                    if pending == 0 || seq + 1 >= next {
                        done = true;
                        break;
                    }
                }
                if done || got == 0 {
                    return Ok(());
                }
            }
        }
        .await;
        let name = consumer.cached_info().name.clone();
        // Best effort: an ephemeral consumer also goes away by itself when inactive.
        let _ = tokio::time::timeout(self.timeout, self.stream.delete_consumer(&name)).await;
        result
    }

    /// The first seq in `[first, next)` whose row satisfies `pred` (false, then true, along
    /// the log), else `next`. Rows deleted meanwhile count as false (they were older).
    pub(super) async fn lower_bound(
        &self,
        pred: impl Fn(&StoredRow) -> bool,
    ) -> Result<u64, StoreError> {
        let (mut lo, mut hi) = self.bounds().await?;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.get(mid).await? {
                Some(row) if pred(&row) => hi = mid,
                _ => lo = mid + 1,
            }
        }
        Ok(lo)
    }

    /// The rows of `kinds` from `from` on, oldest first, at most `limit`. The kinds are read
    /// concurrently (each its own subject: a takeover reads thirteen, and one after another
    /// each waited out its own round trips).
    pub(super) async fn read_kinds(
        &self,
        kinds: Vec<String>,
        from: u64,
        limit: usize,
    ) -> Result<Vec<StoredRow>, StoreError> {
        let (first, next) = self.bounds().await?;
        let from = from.max(first);
        let mut kinds = kinds;
        kinds.sort();
        kinds.dedup();
        let each = kinds
            .into_iter()
            .map(|kind| self.read_kind(kind, from, next, limit));
        let mut out: Vec<StoredRow> = futures::future::try_join_all(each)
            .await?
            .into_iter()
            .flatten()
            .collect();
        out.sort_by_key(|r| r.seq);
        out.truncate(limit);
        Ok(out)
    }

    /// The rows of one kind in `[from, next)`, oldest first, at most `limit`.
    async fn read_kind(
        &self,
        kind: String,
        from: u64,
        next: u64,
        limit: usize,
    ) -> Result<Vec<StoredRow>, StoreError> {
        let mut out = Vec::new();
        let subject = codec::subject(&self.prefix, &kind);
        if limit as u64 > DIRECT_READ_MAX {
            // Many rows may be asked for: a consumer on the kind's subject (the server
            // skips every other row) instead of one direct get per row.
            let mut taken = 0;
            self.scan("reading by kind", &subject, from, next, |row| {
                if row.kind == kind {
                    out.push(row);
                    taken += 1;
                }
                taken < limit
            })
            .await?;
            return Ok(out);
        }
        let mut seq = from;
        let mut taken = 0;
        while taken < limit && seq < next {
            let Some(msg) = self.next_for_subject(&subject, seq).await? else {
                break;
            };
            if msg.sequence >= next {
                break;
            }
            seq = msg.sequence + 1;
            let row = decode(&msg)?;
            if row.kind == kind {
                out.push(row);
                taken += 1;
            }
        }
        Ok(out)
    }

    pub(super) async fn read_ids(&self, ids: Vec<EventId>) -> Result<Vec<StoredRow>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let id = id.to_string();
            let seq = self.lower_bound(|r| r.id.as_str() >= id.as_str()).await?;
            if let Some(row) = self.get(seq).await? {
                if row.id == id {
                    out.push(row);
                }
            }
        }
        out.sort_by_key(|r| r.seq);
        out.dedup_by_key(|r| r.seq);
        Ok(out)
    }
}
