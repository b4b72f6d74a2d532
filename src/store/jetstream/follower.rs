//! A warm standby's view of the stream: [`Follower`] follows the log another node writes,
//! keeping the kept tables, the claims, the saved records (`router::handover`), the position and the newest rows current, so that
//! taking over ([`Follower::promote`]) starts the writer at once instead of reading and
//! folding the whole retained log (about 95 µs per kept row in a debug build,
//! docs/cluster-notes.md).
//!
//! Owns its NATS connection, the follow task and what it folded ([`Followed`], plus the kept
//! tables in the reader's shared state, which the store it promotes to takes over). It never
//! publishes to the stream.
//!
//! A follower is also the read-only [`EventStore`] of a router that serves subscriptions and
//! replay on a standby node ([`Follower::serve`]): every row it applies after that call is
//! handed to that router, in stream order, through a bounded channel (the follow task waits
//! for room: a slow router slows following, never loses a row). Its `committed` is the
//! position followed; `append` is refused (a follower never writes the log).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use tokio::sync::{mpsc, watch};

use super::reader::{bounded, lock, Reader, Shared};
use super::{
    apply_limits, claim_writer, codec, fold, new_reader, nodes, open_stream, patiently,
    recover_and_fold, JetStreamOptions, JetStreamStore, NodeStatus,
};
use crate::protocol::ids::EventId;
use crate::store::kept::{KeptAnswer, KeptQuery};
use crate::store::record::StoredRow;
use crate::store::{EventStore, Recovered, StoreError, StoreFuture};

/// The pause before the follow task opens a new consumer after one failed.
const RETRY: Duration = Duration::from_millis(250);
/// The follow consumer's heartbeat.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// Rows the follow consumer asks for at once.
const BATCH: usize = 512;
/// How long a promotion waits for the follower to reach the stream's end before it recovers
/// cold instead.
const CATCH_UP: Duration = Duration::from_secs(5);
/// Rows waiting for the serving router ([`Follower::serve`]) before the follow task waits.
const FEED: usize = 4096;

/// What the follower folded besides the kept tables.
#[derive(Debug, Default)]
struct Followed {
    /// The seq after the newest row applied.
    next_seq: u64,
    last_id: Option<String>,
    last_timestamp: u64,
    /// The newest rows, oldest first (at most `recent_rows`).
    recent: VecDeque<StoredRow>,
    /// The newest claim of every id not released, the newest saved record of every key not
    /// dropped.
    whole: fold::Whole,
    /// Set when promoted: the follow task applies nothing more.
    stopped: bool,
    /// Set when promoted from what was followed (not recovered cold).
    warm: bool,
    /// Where applied rows go once a router serves from this follower ([`Follower::serve`]).
    feed: Option<mpsc::Sender<StoredRow>>,
}

/// A node following the stream without writing it (see the module docs).
#[derive(Debug)]
pub struct Follower {
    options: JetStreamOptions,
    client: async_nats::Client,
    js: async_nats::jetstream::Context,
    reader: Reader,
    state: Arc<Mutex<Followed>>,
    /// The position followed, as [`EventStore::committed`] reports it.
    committed: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
    /// Answers the roll call of nodes as a standby (`nodes.rs`).
    roll: tokio::task::JoinHandle<()>,
    /// Keeps [`EventStore::first_seq`] fresh.
    refresher: tokio::task::JoinHandle<()>,
}

impl Follower {
    /// Opens the stream as [`JetStreamStore::open`] does, without claiming it, folds what it
    /// retains and follows it from there (a pull consumer, see [`follow`]).
    ///
    /// # Errors
    /// As [`JetStreamStore::open`], but never [`StoreError::Locked`].
    pub async fn open(options: JetStreamOptions) -> Result<Self, StoreError> {
        let (client, js, stream) = open_stream(&options).await?;
        let reader = new_reader(stream, &options);
        // A NATS cluster just healed answers "JetStream system temporarily unavailable" for a
        // moment: waited out as the writer's open does (a standby that could not follow would
        // serve no MAP client until it takes over; seen in the fault suite).
        let recovered = patiently("following the stream", options.open_patience, || {
            recover_and_fold(&reader, &options)
        })
        .await?;
        let state = Arc::new(Mutex::new(Followed {
            next_seq: recovered.next_seq,
            last_id: recovered.last_id.map(|id| id.to_string()),
            last_timestamp: recovered.last_timestamp,
            recent: recovered.recent.into(),
            whole: fold::Whole::of(recovered.claims, recovered.saved),
            stopped: false,
            warm: false,
            feed: None,
        }));
        let (position, committed) = watch::channel(recovered.next_seq);
        let task = tokio::spawn(follow(
            reader.clone(),
            Arc::clone(&state),
            position,
            options.recent_rows,
        ));
        let refresher = tokio::spawn(super::reader::refresh_first_seq(reader.clone()));
        let roll = {
            let state = Arc::clone(&state);
            let node = options.node.clone();
            nodes::answer(client.clone(), &options.stream, move || NodeStatus {
                node: node.clone(),
                role: "standby".into(),
                position: lock(&state).next_seq,
                incarnation: String::new(),
            })
        };
        Ok(Self {
            options,
            client,
            js,
            reader,
            state,
            committed,
            task,
            roll,
            refresher,
        })
    }

    /// Starts handing the rows it applies to a router that serves from this follower: returns
    /// what was followed so far (the router's starting point, as a store's open returns it) and
    /// the rows after it, in order, with nothing missed or repeated between the two.
    ///
    /// # Errors
    /// Called twice, or after a promotion.
    pub fn serve(&self) -> Result<(Recovered, mpsc::Receiver<StoredRow>), StoreError> {
        let mut state = lock(&self.state);
        if state.feed.is_some() || state.stopped {
            return Err(StoreError::Io(
                "NATS JetStream: this follower serves a router already, or was promoted".into(),
            ));
        }
        let recovered = snapshot(&state, self.reader.first_seq(), &self.reader.shared)?;
        let (tx, rx) = mpsc::channel(FEED);
        state.feed = Some(tx);
        Ok((recovered, rx))
    }

    /// Whether its NATS connection is up.
    pub fn connected(&self) -> bool {
        super::is_connected(&self.client)
    }

    /// Its NATS connection (a handle), for what the server relays over core NATS between
    /// the nodes of the stream (`server::relay`).
    pub fn nats(&self) -> async_nats::Client {
        self.client.clone()
    }

    /// Asks every node of the stream who it is, as [`JetStreamStore::nodes`] does.
    ///
    /// # Errors
    /// NATS is unreachable.
    pub async fn nodes(&self, wait: Duration) -> Result<Vec<NodeStatus>, StoreError> {
        nodes::roll_call(&self.client, &self.options.stream, wait).await
    }

    /// The seq after the newest row followed.
    pub fn position(&self) -> u64 {
        lock(&self.state).next_seq
    }

    /// The saved sessions, agents and scopes followed so far: what a takeover would restore.
    pub fn saved_counts(&self) -> crate::store::SavedCounts {
        lock(&self.state).whole.saved_counts()
    }

    /// [`Self::position`] as a function that outlives this borrow (for a status page).
    pub fn position_probe(&self) -> impl Fn() -> u64 + Send + Sync + 'static {
        let state = Arc::clone(&self.state);
        move || lock(&state).next_seq
    }

    /// Whether [`Self::promote`] opened the store from what was followed (false before it
    /// did, and after a cold recovery).
    pub fn promoted_warm(&self) -> bool {
        lock(&self.state).warm
    }

    /// Claims the stream as its writer and opens the store from what was followed: the writer
    /// starts at once, with no second read of the log. If the follower does not reach the
    /// stream's end within a few seconds after the claim (it was cut off from NATS, or the
    /// newest row was deleted), the store recovers cold as [`JetStreamStore::open`] does.
    /// Once it returns `Ok`, this follower is spent (its task stopped; drop it).
    ///
    /// # Errors
    /// [`StoreError::Locked`] while another live node writes (the follower goes on
    /// following: ask again later), or NATS failing; after an error other than `Locked`
    /// the claim is given up, so another node may take over.
    pub async fn promote(&self) -> Result<(Arc<JetStreamStore>, Recovered), StoreError> {
        if lock(&self.state).stopped {
            return Err(StoreError::Io(
                "NATS JetStream: this follower was promoted already".into(),
            ));
        }
        let responder = patiently(
            "claiming the writer lock",
            self.options.open_patience,
            || claim_writer(&self.client, &self.js, &self.options),
        )
        .await?;
        match self.take_over().await {
            Ok(recovered) => {
                self.task.abort();
                self.roll.abort();
                self.refresher.abort();
                let store = JetStreamStore::start(
                    self.client.clone(),
                    self.js.clone(),
                    self.reader.clone(),
                    &recovered,
                    Some(responder),
                    &self.options,
                );
                Ok((store, recovered))
            }
            Err(e) => {
                responder.responder.abort();
                Err(e)
            }
        }
    }

    /// After the claim: the stream's limits, then what was followed up to the stream's end
    /// (or a cold recovery).
    async fn take_over(&self) -> Result<Recovered, StoreError> {
        // The limits are compared with the stream as it is now: the handle's info is from
        // when following began, and the update keeps every other field as it finds it.
        let mut stream = self.reader.stream.clone();
        bounded(self.reader.timeout, "reading the stream", stream.info()).await?;
        apply_limits(&self.js, &stream, &self.options).await?;
        let (first, next) = self.reader.bounds().await?;
        let deadline = Instant::now() + CATCH_UP;
        while self.position() < next && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let followed = {
            let mut state = lock(&self.state);
            state.stopped = true;
            state.warm = state.next_seq == next;
            state.next_seq
        };
        if followed != next {
            tracing::warn!(
                followed,
                stream_next = next,
                "standby: the follower is not at the stream's end; recovering cold"
            );
            self.task.abort();
            return recover_and_fold(&self.reader, &self.options).await;
        }
        let recovered = snapshot(&lock(&self.state), first, &self.reader.shared)?;
        tracing::info!(
            stream = %self.options.stream,
            next_seq = recovered.next_seq,
            "standby: took over from what it followed"
        );
        Ok(recovered)
    }
}

/// What was followed, as a store's open returns it (`first`: the stream's oldest seq).
fn snapshot(state: &Followed, first: u64, shared: &Shared) -> Result<Recovered, StoreError> {
    let last_id = match &state.last_id {
        None => None,
        Some(id) => Some(EventId::parse(id).ok_or_else(|| {
            StoreError::Corrupt(format!("bad event id {id} at seq {}", state.next_seq - 1))
        })?),
    };
    let (claims, saved) = state.whole.rows();
    Ok(Recovered {
        next_seq: state.next_seq,
        first_seq: first.min(state.next_seq),
        last_id,
        last_timestamp: state.last_timestamp,
        recent: state.recent.iter().cloned().collect(),
        kept_counts: lock(&shared.kept).counts(),
        claims,
        saved,
    })
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
        self.roll.abort();
        self.refresher.abort();
    }
}

/// The store of a router serving from a follower ([`Follower::serve`]): reads as the writer's
/// store answers them, `committed` is the position followed, and nothing is ever appended.
impl EventStore for Follower {
    fn append(&self, rows: Vec<StoredRow>) {
        // The serving router refuses every call that would log (router::dispatch); reaching
        // this is a bug, said loudly rather than written to a log another node owns.
        if !rows.is_empty() {
            tracing::error!(
                rows = rows.len(),
                first_seq = rows[0].seq,
                "a follower was asked to append to the event log; refused (a bug)"
            );
        }
    }

    fn committed(&self) -> watch::Receiver<u64> {
        self.committed.clone()
    }

    fn first_seq(&self) -> u64 {
        self.reader.first_seq()
    }

    fn origin(&self) -> u64 {
        1
    }

    fn read(&self, from: u64, limit: usize) -> StoreFuture<Vec<StoredRow>> {
        self.reader.read_owned(from, limit)
    }

    fn head(&self) -> StoreFuture<u64> {
        let reader = self.reader.clone();
        Box::pin(async move { reader.bounds().await.map(|(_, next)| next) })
    }

    fn seq_after(&self, id: EventId) -> StoreFuture<u64> {
        self.reader.seq_after_owned(id)
    }

    fn seq_at_or_after_time(&self, ts: u64) -> StoreFuture<u64> {
        self.reader.seq_at_or_after_time_owned(ts)
    }

    fn read_kinds(
        &self,
        kinds: Vec<String>,
        from: u64,
        limit: usize,
    ) -> StoreFuture<Vec<StoredRow>> {
        self.reader.read_kinds_owned(kinds, from, limit)
    }

    fn read_ids(&self, ids: Vec<EventId>) -> StoreFuture<Vec<StoredRow>> {
        self.reader.read_ids_owned(ids)
    }

    fn kept(&self, query: KeptQuery) -> StoreFuture<KeptAnswer> {
        self.reader.kept_owned(&query)
    }

    fn close(&self) -> StoreFuture<()> {
        // The follower is the server's to promote or drop; a router closing its store stops
        // nothing here.
        Box::pin(async { Ok(()) })
    }
}

/// Follows the stream from the state's position, for ever, with an ephemeral pull consumer
/// (no acks) that sends a heartbeat every [`HEARTBEAT`]: a lost connection or a restarted
/// server is noticed within about two of them, and a new consumer continues from the position.
/// (async-nats's ordered consumer does the same with a fixed 15 s heartbeat: a follower was
/// 14 s behind after a NATS restart.)
///
/// A consumer delivers the stream's rows in order; a row after a hole is taken only as the
/// first row of a fresh consumer, which says that nothing is left in the hole (retention or a
/// deletion took it). A hole in the middle of a consumer's delivery (a message lost on the
/// way) opens a new consumer at the position instead.
async fn follow(
    reader: Reader,
    state: Arc<Mutex<Followed>>,
    position: watch::Sender<u64>,
    recent_rows: usize,
) {
    let what = "following the stream";
    loop {
        let from = lock(&state).next_seq;
        let consumer = reader.consumer(what, &reader.every_subject(), from).await;
        let messages = match consumer {
            Ok(consumer) => {
                bounded(
                    reader.timeout,
                    what,
                    consumer
                        .stream()
                        .max_messages_per_batch(BATCH)
                        .expires(HEARTBEAT * 4)
                        .heartbeat(HEARTBEAT)
                        .messages(),
                )
                .await
            }
            Err(e) => Err(e),
        };
        let mut messages = match messages {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "standby: cannot follow the stream; trying again");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        let mut fresh = true;
        while let Some(msg) = messages.next().await {
            let row = msg.map_err(|e| e.to_string()).and_then(|msg| {
                let seq = msg.info().map_err(|e| e.to_string())?.stream_sequence;
                codec::decode_parts(seq, msg.headers.as_ref(), &msg.payload)
                    .map_err(|e| e.to_string())
            });
            let row = match row {
                Ok(row) => row,
                Err(e) => {
                    tracing::warn!(error = %e, "standby: following the stream failed");
                    break;
                }
            };
            let expected = lock(&state).next_seq;
            if row.seq > expected && !fresh {
                tracing::warn!(
                    expected,
                    got = row.seq,
                    "standby: a hole in what the stream sent; following again from the hole"
                );
                break;
            }
            fresh = false;
            let feed = match apply(&state, &reader.shared, row, recent_rows) {
                Applied::Stopped => return,
                Applied::Seen => continue,
                Applied::Row(feed) => feed,
            };
            position.send_replace(lock(&state).next_seq);
            if let Some((tx, row)) = feed {
                // Waits for room: the serving router is behind, so following waits too.
                if tx.send(row).await.is_err() {
                    lock(&state).feed = None; // the router stopped
                }
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// What [`apply`] did with a row.
enum Applied {
    /// The follower was promoted: nothing more is applied.
    Stopped,
    /// A row it had (a consumer opened again from an older position).
    Seen,
    /// Folded; the row goes on to the serving router when one was attached at that moment
    /// (decided under the lock that [`Follower::serve`] takes, so the router gets each row
    /// either in its snapshot or from the channel, never both).
    Row(Option<(mpsc::Sender<StoredRow>, StoredRow)>),
}

/// Folds one followed row.
fn apply(state: &Mutex<Followed>, shared: &Shared, row: StoredRow, recent_rows: usize) -> Applied {
    let mut s = lock(state);
    if s.stopped {
        return Applied::Stopped;
    }
    if row.seq < s.next_seq {
        return Applied::Seen;
    }
    s.next_seq = row.seq + 1;
    // Into the id kept from the row before (no allocation per row).
    s.last_id
        .get_or_insert_with(String::new)
        .clone_from(&row.id);
    s.last_timestamp = row.timestamp;
    if fold::folds(&row.kind) {
        fold::fold_row(&mut lock(&shared.kept), &mut s.whole, row.clone());
    }
    let feed = s.feed.clone().map(|tx| (tx, row.clone()));
    s.recent.push_back(row);
    while s.recent.len() > recent_rows {
        s.recent.pop_front();
    }
    Applied::Row(feed)
}
