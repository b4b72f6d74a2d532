//! The NATS JetStream event store (feature `cluster`): the event log as one JetStream stream,
//! shared by every router node that points at it. The first building block of cluster mode
//! (issue 24); `docs/cluster-notes.md` says what exists, why, and what is still missing.
//!
//! Owns one NATS connection, the writer task that publishes rows, and a small task that keeps
//! [`EventStore::first_seq`] fresh. The stream itself belongs to the NATS deployment: the store
//! creates it when missing (with the limits of [`JetStreamOptions`]) and otherwise uses it as it
//! is. The store never interprets a row's `meta` or `json`.
//!
//! # Mapping
//! - **Position.** The stream sequence *is* the MAP sequence number: row `seq` is published with
//!   `Nats-Expected-Last-Sequence: seq - 1`, so it lands at stream sequence `seq` or not at all
//!   (no silent renumbering when another writer got there first). JetStream numbers from 1, so a
//!   fresh stream recovers `next_seq = 1`.
//! - **Id.** The event id is the `Nats-Msg-Id`: a retried publish (lost ack, reconnect) is a
//!   duplicate the server answers with the original sequence, within the stream's
//!   `duplicate_window`.
//! - **Commit.** The publish acknowledgement is the commit. Acks may resolve in any order; the
//!   `committed` watch moves only over a contiguous prefix of acknowledged rows.
//! - **Subject** `<prefix>.<kind>`, so [`EventStore::read_kinds`] is a per-subject walk.
//! - **Row encoding** (`codec.rs`): headers `Nats-Msg-Id`, `Map-Ts`, `Map-Kind`, `Map-Meta-Len`;
//!   the payload is `meta` followed by `json`, byte for byte (no escaping, no re-encoding).
//! - **Lookups by id and time** are binary searches over the stream with direct gets (ids and
//!   timestamps never decrease along the log). No second index to keep in step with the log:
//!   see `docs/cluster-notes.md` for why not a KV bucket or a subject per id.
//! - **Retention** is the stream's own limits (`max_msgs`, `max_bytes`, `max_age`, discard old),
//!   with the replicas brought to the options by every open that gets past the writer check.
//!
//! # Failures
//! Reads are bounded by [`JetStreamOptions::request_timeout`] and fail with
//! [`StoreError::Io`] naming NATS when it is unreachable. Appends never fail at the call: the
//! writer keeps unacknowledged rows and republishes them with backoff until they are
//! acknowledged (de-duplication makes that safe), so `committed` simply stops while NATS is down
//! and resumes after the client reconnects by itself. The queue of unacknowledged rows is not
//! bounded here (as with SQLite's writer queue); the router's own bounds apply upstream. If the
//! stream holds a *different* event at a row's position (another writer), the store reports
//! [`JetStreamStore::diverged`], logs an error and stops publishing: `committed` never claims a
//! row that is not in the log.
//!
//! # Kept tables
//! Tasks, checkpoints, conversations, turns, threads and claims are a fold of the committed log
//! into memory (`fold.rs`): read at open, then fed by the writer with each acknowledged row.
//! Every kept item is in memory, and the stream's retention trims what a reopened store folds.

mod codec;
mod fold;
pub mod follower;
mod nodes;
mod reader;
mod writer;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream;
use tokio::sync::{mpsc, oneshot, watch};

use reader::{bounded, lock, nats_err, refresh_first_seq, Reader, Shared};
use writer::Incoming;

use crate::protocol::ids::EventId;
use crate::store::kept::{KeptAnswer, KeptQuery};
use crate::store::record::{EventRecord, StoredRow};
use crate::store::{EventStore, Recovered, StoreError, StoreFuture};

pub use codec::{decode, encode};
pub use nodes::NodeStatus;

/// The default stream name.
pub const DEFAULT_STREAM: &str = "MAP_EVENTS";
/// The default subject prefix (rows go to `<prefix>.<kind>`).
pub const DEFAULT_SUBJECT_PREFIX: &str = "map.ev";

/// How to open a [`JetStreamStore`].
#[derive(Debug, Clone)]
pub struct JetStreamOptions {
    /// The NATS server, `nats://host:port`.
    pub url: String,
    /// The stream holding the log ([`DEFAULT_STREAM`]).
    pub stream: String,
    /// Subject prefix ([`DEFAULT_SUBJECT_PREFIX`]); the stream takes `<prefix>.>`.
    pub subject_prefix: String,
    /// The stream's replicas (1 on a single server): set when the store creates the stream,
    /// and brought to this value when a store opens it (so do the limits below).
    pub replicas: usize,
    /// Retention by count (stream `max_msgs`); `None`: unlimited.
    pub max_events: Option<i64>,
    /// Retention by bytes (stream `max_bytes`); `None`: unlimited.
    pub max_bytes: Option<i64>,
    /// Retention by age (stream `max_age`); `None`: unlimited.
    pub max_age: Option<Duration>,
    /// How long the server remembers a message id for de-duplication (2 minutes).
    pub duplicate_window: Duration,
    /// The bound on every request to NATS: a publish ack, a read, an info (2 s).
    pub request_timeout: Duration,
    /// The bound on connecting at open (5 s).
    pub connect_timeout: Duration,
    /// Publishes awaiting their ack at once (256).
    pub max_in_flight: usize,
    /// How long `close` keeps trying to commit what is queued (10 s).
    pub close_timeout: Duration,
    /// How long opening (claiming the writer lock, reading the stream) keeps trying while
    /// NATS, once connected, does not answer (30 s): a stream or lock just created on a NATS
    /// cluster answers only once its leader is elected, and nodes started together create them
    /// at the same time. Each retry is logged; a refusal (another live writer) is not retried.
    pub open_patience: Duration,
    /// Newest rows returned in [`Recovered::recent`] (1024).
    pub recent_rows: usize,
    /// This node's name: in the NATS connection name and in the answer to other writers.
    pub node: String,
    /// Refuse to open when another live store with `exclusive` writes to the stream, and
    /// answer the same check for others while open (see [`writer_subject`]). Off by default
    /// (tests open several handles on one stream); the server turns it on.
    pub exclusive: bool,
    /// TLS to NATS: trust these root certificates (PEM) and require TLS. `None`: plain text
    /// unless the server asks for TLS (then the system's roots are not loaded: give this).
    pub tls_ca: Option<std::path::PathBuf>,
    /// TLS client certificate and key (PEM), for a server that verifies clients.
    pub tls_client: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// How the node proves itself to NATS (besides a TLS client certificate).
    pub credentials: NatsCredentials,
}

/// A NATS user's secret. `Debug` never shows it.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum NatsCredentials {
    /// None (or only a TLS client certificate).
    #[default]
    None,
    /// A token (`nats-server --auth`, `authorization { token }`).
    Token(String),
    /// A user and its password.
    UserPassword(String, String),
    /// An NKey seed (`authorization { users = [{ nkey: "U..." }] }`): it signs the server's
    /// nonce; the seed itself never leaves the process.
    NKey(String),
    /// The text of a `.creds` file: a user JWT and its NKey seed (NATS operator mode, as
    /// `nsc` makes them).
    Creds(String),
}

impl std::fmt::Debug for NatsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::Token(_) => f.write_str("Token(<redacted>)"),
            Self::UserPassword(user, _) => write!(f, "UserPassword({user:?}, <redacted>)"),
            Self::NKey(_) => f.write_str("NKey(<redacted>)"),
            Self::Creds(_) => f.write_str("Creds(<redacted>)"),
        }
    }
}

/// The core NATS subject on which the live writer of `stream` answers who it is (outside the
/// stream's subjects, so nothing is stored).
pub fn writer_subject(stream: &str) -> String {
    format!("_MAP.writer.{stream}")
}

/// Whether `client`'s connection to NATS is up now (the writer's store and a follower).
fn is_connected(client: &async_nats::Client) -> bool {
    matches!(
        client.connection_state(),
        async_nats::connection::State::Connected
    )
}

impl JetStreamOptions {
    /// The defaults, for the server at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            stream: DEFAULT_STREAM.into(),
            subject_prefix: DEFAULT_SUBJECT_PREFIX.into(),
            replicas: 1,
            max_events: None,
            max_bytes: None,
            max_age: None,
            duplicate_window: Duration::from_secs(120),
            request_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            max_in_flight: 256,
            close_timeout: Duration::from_secs(10),
            open_patience: Duration::from_secs(30),
            recent_rows: 1024,
            node: "map-router".into(),
            exclusive: false,
            tls_ca: None,
            tls_client: None,
            credentials: NatsCredentials::None,
        }
    }
}

/// The JetStream event store. Open it inside a tokio runtime (its tasks run there).
#[derive(Debug)]
pub struct JetStreamStore {
    client: async_nats::Client,
    reader: Reader,
    writer: Mutex<Option<mpsc::UnboundedSender<Incoming>>>,
    writer_exit: Mutex<Option<oneshot::Receiver<Result<(), StoreError>>>>,
    committed: watch::Receiver<u64>,
    shared: Arc<Shared>,
    refresher: tokio::task::JoinHandle<()>,
    /// Answers [`writer_subject`] while open (with `exclusive`).
    responder: Option<tokio::task::JoinHandle<()>>,
    /// Answers the roll call of nodes (`nodes.rs`) as the writer.
    roll: tokio::task::JoinHandle<()>,
    stream: String,
    close_timeout: Duration,
}

impl JetStreamStore {
    /// Connects, creates the stream when missing (or brings its limits and replicas to
    /// `options`), recovers the position and starts the writer.
    ///
    /// # Errors
    /// NATS is unreachable within `connect_timeout`, JetStream is not enabled, the stream cannot
    /// be created or read, or its newest row cannot be decoded.
    pub async fn open(options: JetStreamOptions) -> Result<(Arc<Self>, Recovered), StoreError> {
        let (client, js, stream) = open_stream(&options).await?;
        // Connected: what fails from here on with NATS answering late or not at all (a stream
        // just created on a NATS cluster has no leader for a moment) is tried again, within
        // `open_patience`, instead of ending the node's start.
        let (responder, reader, recovered) =
            patiently("opening the stream", options.open_patience, || async {
                let responder = if options.exclusive {
                    Some(claim_writer(&client, &js, &options).await?)
                } else {
                    None
                };
                let result = async {
                    // Only the writer (`exclusive`) sets the limits: a handle that reads (a
                    // tool, a test) must not change the stream, e.g. its replicas to its
                    // default of 1.
                    if options.exclusive {
                        apply_limits(&js, &stream, &options).await?;
                    }
                    let reader = new_reader(stream.clone(), &options);
                    let recovered = recover_and_fold(&reader, &options).await?;
                    Ok((reader, recovered))
                }
                .await;
                match result {
                    Ok((reader, recovered)) => Ok((responder, reader, recovered)),
                    Err(e) => {
                        if let Some(c) = responder {
                            c.responder.abort();
                        }
                        Err(e)
                    }
                }
            })
            .await?;
        let store = Self::start(client, js, reader, &recovered, responder, &options);
        Ok((store, recovered))
    }

    /// Starts the writer and the refresher on a recovered stream: the store is open.
    fn start(
        client: async_nats::Client,
        js: async_nats::jetstream::Context,
        reader: Reader,
        recovered: &Recovered,
        claimed: Option<Claimed>,
        options: &JetStreamOptions,
    ) -> Arc<Self> {
        let shared = Arc::clone(&reader.shared);
        let (responder, fence) = match claimed {
            Some(c) => (Some(c.responder), Some(c.fence)),
            None => (None, None),
        };
        if let Some(r) = &responder {
            *lock(&shared.responder) = Some(r.abort_handle());
        }
        let (committed_tx, committed_rx) = watch::channel(recovered.next_seq);
        let (tx, rx) = mpsc::unbounded_channel();
        let (exit_tx, exit_rx) = oneshot::channel();
        let writer = writer::Writer::new(writer::WriterConfig {
            js,
            prefix: options.subject_prefix.clone(),
            max_in_flight: options.max_in_flight.max(1),
            close_timeout: options.close_timeout,
            next_seq: recovered.next_seq,
            committed: committed_tx,
            shared: Arc::clone(&shared),
            reader: reader.clone(),
            max_payload: client.server_info().max_payload,
            fence,
        });
        tokio::spawn(async move {
            let result = writer.run(rx).await;
            let _ = exit_tx.send(result);
        });
        let refresher = tokio::spawn(refresh_first_seq(reader.clone()));
        let roll = {
            let committed = committed_rx.clone();
            let node = options.node.clone();
            let shared = Arc::clone(&shared);
            nodes::answer(client.clone(), &options.stream, move || NodeStatus {
                node: node.clone(),
                // A writer fenced off or diverged writes nothing more: never called writer.
                role: if lock(&shared.diverged).is_some() {
                    "diverged".into()
                } else {
                    "writer".into()
                },
                position: *committed.borrow(),
                incarnation: String::new(),
            })
        };
        Arc::new(Self {
            client,
            reader,
            writer: Mutex::new(Some(tx)),
            writer_exit: Mutex::new(Some(exit_rx)),
            committed: committed_rx,
            shared,
            refresher,
            responder,
            roll,
            stream: options.stream.clone(),
            close_timeout: options.close_timeout,
        })
    }

    /// The nodes of this stream that answer a roll call within `wait` (this one included),
    /// sorted by name.
    ///
    /// # Errors
    /// NATS is unreachable.
    pub async fn nodes(&self, wait: Duration) -> Result<Vec<NodeStatus>, StoreError> {
        nodes::roll_call(&self.client, &self.stream, wait).await
    }

    /// Why the store stopped publishing, when the stream holds another event at one of its
    /// positions (another writer appended there). `None` while it is in step with the stream.
    pub fn diverged(&self) -> Option<String> {
        lock(&self.shared.diverged).clone()
    }

    /// Whether the NATS connection is up now.
    pub fn connected(&self) -> bool {
        is_connected(&self.client)
    }

    /// Its NATS connection (a handle), for what the server relays over core NATS between
    /// the nodes of the stream (`server::relay`).
    pub fn nats(&self) -> async_nats::Client {
        self.client.clone()
    }

    fn send(&self, incoming: Incoming) {
        let guard = lock(&self.writer);
        let Some(tx) = guard.as_ref() else {
            tracing::error!("event store (JetStream): append after close; rows not stored");
            return;
        };
        if tx.send(incoming).is_err() {
            tracing::error!("event store (JetStream): the writer has stopped; rows not stored");
        }
    }
}

impl Drop for JetStreamStore {
    fn drop(&mut self) {
        self.refresher.abort();
        self.roll.abort();
        if let Some(r) = &self.responder {
            r.abort();
        }
    }
}

/// Connects and opens (or creates) the stream, refusing one that does not take our subjects.
async fn open_stream(
    options: &JetStreamOptions,
) -> Result<
    (
        async_nats::Client,
        async_nats::jetstream::Context,
        async_nats::jetstream::stream::Stream,
    ),
    StoreError,
> {
    let client = connect(options).await?;
    let mut js = async_nats::jetstream::new(client.clone());
    js.set_timeout(options.request_timeout);
    let stream = get_or_create(
        &js,
        stream_config(options),
        "opening the stream",
        options.request_timeout,
    )
    .await?;
    // An existing stream is used as it is: it must take our subjects, or every publish
    // would wait for a stream that never answers.
    let wanted = format!("{}.>", options.subject_prefix);
    let subjects = &stream.cached_info().config.subjects;
    if !subjects.iter().any(|s| *s == wanted || s == ">") {
        return Err(StoreError::Io(format!(
            "NATS JetStream: stream {} exists with subjects {subjects:?}, not {wanted:?} \
             (another prefix, or another stream of the same name)",
            options.stream
        )));
    }
    Ok((client, js, stream))
}

/// Brings the stream's limits and replicas to `options` (the writer does this once it holds
/// the stream; a standby changes nothing).
async fn apply_limits(
    js: &async_nats::jetstream::Context,
    stream: &async_nats::jetstream::stream::Stream,
    options: &JetStreamOptions,
) -> Result<(), StoreError> {
    let before = &stream.cached_info().config;
    let Some(update) = limits_update(before, options) else {
        return Ok(());
    };
    tracing::info!(
        stream = %options.stream,
        max_events = format!("{} -> {}", before.max_messages, update.max_messages),
        max_bytes = format!("{} -> {}", before.max_bytes, update.max_bytes),
        max_age = format!("{:?} -> {:?}", before.max_age, update.max_age),
        replicas = format!("{} -> {}", before.num_replicas, update.num_replicas),
        "updating the stream's limits to the configuration"
    );
    bounded(
        options.request_timeout * 2,
        "updating the stream's limits",
        js.update_stream(update),
    )
    .await?;
    Ok(())
}

/// A reader of `stream` with fresh shared state.
fn new_reader(stream: async_nats::jetstream::stream::Stream, options: &JetStreamOptions) -> Reader {
    Reader {
        stream,
        prefix: options.subject_prefix.as_str().into(),
        timeout: options.request_timeout,
        shared: Arc::new(Shared::default()),
    }
}

/// Reads the stream's position and recent rows, and folds its kept tables into the reader's
/// shared state (a cold start: every retained kept row is read).
async fn recover_and_fold(
    reader: &Reader,
    options: &JetStreamOptions,
) -> Result<Recovered, StoreError> {
    let mut recovered = reader.recover(options.recent_rows).await?;
    let loaded = fold::load(reader, recovered.first_seq, recovered.next_seq).await?;
    recovered.kept_counts = loaded.kept.counts();
    recovered.claims = loaded.claims;
    recovered.saved = loaded.saved;
    *lock(&reader.shared.kept) = loaded.kept;
    tracing::info!(
        url = %options.url,
        stream = %options.stream,
        next_seq = recovered.next_seq,
        first_seq = recovered.first_seq,
        "event store opened (JetStream)"
    );
    Ok(recovered)
}

/// The servers of a `[cluster] url`: one URL, or several separated by commas.
pub fn server_list(urls: &str) -> Vec<&str> {
    urls.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

/// Connects to NATS as `options` say (TLS, timeouts, reconnecting forever).
async fn connect(options: &JetStreamOptions) -> Result<async_nats::Client, StoreError> {
    let mut connect = async_nats::ConnectOptions::new();
    if let Some(ca) = &options.tls_ca {
        connect = connect.require_tls(true).add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &options.tls_client {
        connect = connect.add_client_certificate(cert.clone(), key.clone());
    }
    match &options.credentials {
        NatsCredentials::None => {}
        NatsCredentials::Token(token) => connect = connect.token(token.clone()),
        NatsCredentials::UserPassword(user, password) => {
            connect = connect.user_and_password(user.clone(), password.clone());
        }
        NatsCredentials::NKey(seed) => connect = connect.nkey(seed.clone()),
        NatsCredentials::Creds(text) => {
            // The parser's errors name what is wrong, never the file's text.
            connect = connect.credentials(text).map_err(|e| {
                StoreError::Io(format!(
                    "NATS: the credentials (.creds) are not usable: {e}"
                ))
            })?;
        }
    }
    let connect = connect
        .name(format!("map-router/{}", options.node))
        .connection_timeout(options.connect_timeout)
        .request_timeout(Some(options.request_timeout))
        // Reconnect forever, quickly: the log is unavailable until then.
        .max_reconnects(None)
        .reconnect_delay_callback(|attempt| {
            Duration::from_millis(50 * 2u64.pow(attempt.min(5) as u32)).min(Duration::from_secs(1))
        })
        // `[cluster] url` may list several servers of one NATS cluster, comma-separated (the
        // client then reconnects to any of them).
        .connect(server_list(&options.url));
    tokio::time::timeout(options.connect_timeout, connect)
        .await
        .map_err(|_| {
            nats_err(
                &format!("connecting to {}", options.url),
                format!("timed out after {:?}", options.connect_timeout),
            )
        })?
        .map_err(|e| nats_err(&format!("connecting to {}", options.url), e))
}

/// How long "no responders" on the writer subject, with the lock unchanged, must hold before a
/// node claims the lock (longer than a subscription takes to reach every server of a NATS
/// cluster on a LAN).
const INTEREST_SETTLE: Duration = Duration::from_millis(200);

/// How long the stream's last sequence must stay still before a standby takes over.
const SETTLE: Duration = Duration::from_millis(100);

/// A standby's wait: returns once no live node writes to the stream of `options` and the
/// stream has stopped growing, so that [`JetStreamStore::open`] can claim it. Asks every
/// `poll`; `writer` is told who writes (or `None` while NATS does not answer), each time that
/// changes. A writer that crashed may still have publishes in flight when its connection is
/// gone: the stream's last sequence must stay the same for [`SETTLE`] (else the new writer's
/// first row would find one of them at its position, and stop).
///
/// # Errors
/// NATS is unreachable at the start (within `connect_timeout`). Later outages are waited out.
pub async fn wait_for_takeover(
    options: &JetStreamOptions,
    poll: Duration,
    writer: impl Fn(Option<&str>),
) -> Result<(), StoreError> {
    let client = connect(options).await?;
    let mut js = async_nats::jetstream::new(client.clone());
    js.set_timeout(options.request_timeout);
    let mut last: Option<Option<String>> = None;
    // Only "no responders" means the writer is gone; a question it does not answer within
    // `ask` is asked again at once (then at the poll's pace): a writer killed with the
    // question in hand never answers it (the server says "no responders" to the next one
    // at once), and waiting the whole request timeout for it made a takeover take 2 s more
    // (seen in scripts/bench-failover-load.sh). A slow writer is asked again, never taken for
    // dead.
    let ask = (poll * 2).clamp(ASK_MIN, options.request_timeout.max(ASK_MIN));
    let mut again = false;
    loop {
        let now = live_writer(&client, &options.stream, ask).await;
        let named = match &now {
            Ok(Some(node)) => Some(node.clone()),
            Ok(None) => None,
            Err(e) => {
                if again {
                    tracing::warn!(error = %e, "standby: cannot ask for the stream's writer");
                }
                None
            }
        };
        // (A first unanswered question does not change who is shown as the writer.)
        if last.as_ref() != Some(&named) && (now.is_ok() || again) {
            writer(named.as_deref());
            last = Some(named);
        }
        if matches!(now, Ok(None)) && settled(&js, &options.stream, options.request_timeout).await {
            let _ = tokio::time::timeout(Duration::from_secs(1), client.drain()).await;
            return Ok(());
        }
        again = now.is_err() && !again;
        if !again {
            tokio::time::sleep(poll).await;
        }
    }
}

/// The shortest wait for the writer's answer to "are you there?" (it answers from its NATS
/// connection's task, in well under a millisecond when idle).
const ASK_MIN: Duration = Duration::from_millis(100);

fn stream_not_found(e: &async_nats::jetstream::context::GetStreamError) -> bool {
    matches!(
        e.kind(),
        async_nats::jetstream::context::GetStreamErrorKind::JetStream(j)
            if j.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND
    )
}

/// Whether the stream's last sequence stays the same over [`SETTLE`] (a missing stream is
/// settled: the new writer creates it).
async fn settled(js: &async_nats::jetstream::Context, stream: &str, limit: Duration) -> bool {
    let last = || async {
        // `get_stream` reads the stream's info (STREAM.INFO): its state is fresh.
        match tokio::time::timeout(limit, js.get_stream(stream)).await {
            Ok(Ok(s)) => Some(s.cached_info().state.last_sequence),
            Ok(Err(e)) if stream_not_found(&e) => Some(0),
            _ => None,
        }
    };
    let Some(before) = last().await else {
        return false;
    };
    tokio::time::sleep(SETTLE).await;
    last().await == Some(before)
}

/// The subject of the writer lock of `stream` (in its own stream, [`lock_stream`]).
fn lock_subject(stream: &str) -> String {
    format!("_MAP.lock.{stream}")
}

/// The stream that holds the writer lock of `stream`: one message per claim, the newest is
/// the holder (a few are kept, as a history of who wrote when).
fn lock_stream(stream: &str) -> String {
    format!("{stream}_WRITER")
}

/// Who answers on [`writer_subject`] now: `Ok(Some(node))`, or `Ok(None)` when nobody
/// listens there (no responders: no live writer).
async fn live_writer(
    client: &async_nats::Client,
    stream: &str,
    limit: Duration,
) -> Result<Option<String>, StoreError> {
    bounded(limit, "asking for the stream's writer", async {
        match client
            .request(writer_subject(stream), bytes::Bytes::new())
            .await
        {
            Ok(reply) => Ok(Some(String::from_utf8_lossy(&reply.payload).into_owned())),
            Err(e) if e.kind() == async_nats::client::RequestErrorKind::NoResponders => Ok(None),
            Err(e) => Err(e),
        }
    })
    .await
}

/// Gets the stream `config` names, creating it if it does not exist, each try bounded by
/// twice `limit`. Nodes starting together race to create it: a loser is told "subjects
/// overlap with an existing stream" (or the like), or its request times out behind the
/// others' on a loaded server, and finds the winner's stream on the next try (three in all).
async fn get_or_create(
    js: &async_nats::jetstream::Context,
    config: stream::Config,
    what: &str,
    limit: Duration,
) -> Result<async_nats::jetstream::stream::Stream, StoreError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match bounded(limit * 2, what, js.get_or_create_stream(config.clone())).await {
            Ok(stream) => return Ok(stream),
            Err(e) if attempt < 3 => {
                tracing::debug!(error = %e, "{what}; trying again");
                tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Runs `attempt` until it succeeds, fails with anything but [`StoreError::Io`] (a refusal
/// such as [`StoreError::Locked`] is an answer, not a failure to get one), or `patience` has
/// passed: NATS answering late or not at all is waited out (each retry logged as a warning,
/// the pause doubling from 100 ms to 1 s); the last error is returned after `patience`.
async fn patiently<T, F, Fut>(
    what: &str,
    patience: Duration,
    mut attempt: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    let mut pause = Duration::from_millis(100);
    let mut tries = 0u32;
    loop {
        tries += 1;
        match attempt().await {
            Err(StoreError::Io(e)) if tokio::time::Instant::now() + pause < deadline => {
                tracing::warn!(
                    error = %e,
                    attempt = tries,
                    retry_in = ?pause,
                    patience = ?patience,
                    "event store (JetStream): {what}: NATS did not answer yet; trying again"
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(StoreError::Io(e)) if tries > 1 => {
                return Err(StoreError::Io(format!(
                    "{e} (still failing after {tries} tries within {patience:?})"
                )));
            }
            other => {
                if tries > 1 && other.is_ok() {
                    tracing::info!(attempt = tries, "event store (JetStream): {what}: done");
                }
                return other;
            }
        }
    }
}

/// One live writer per stream: liveness by core NATS, uniqueness by a compare-and-set in
/// JetStream (no lock of our own, no lease to expire).
///
/// 1. Read the newest claim in [`lock_stream`] (its subject sequence `L`; 0 when none).
/// 2. Ask [`writer_subject`]: a live writer answers, and the store refuses to open
///    ([`StoreError::Locked`], naming it). Its connection gone (crash, SIGKILL, NATS lost), the
///    server has no responder left at once.
/// 3. Subscribe to [`writer_subject`] (answering with the node's name) and flush, *then*
/// 4. publish a claim with `Nats-Expected-Last-Subject-Sequence: L`. Of two nodes that read the
///    same `L`, the server lands one claim; the other gets "wrong last sequence" and refuses.
///    A node that read `L + 1` did so after the winner's claim landed, so after the winner
///    subscribed: its question in step 2 was answered.
///
/// The answering task runs until the store closes.
async fn claim_writer(
    client: &async_nats::Client,
    js: &async_nats::jetstream::Context,
    options: &JetStreamOptions,
) -> Result<Claimed, StoreError> {
    use futures::StreamExt as _;
    let limit = options.request_timeout;
    let lock = get_or_create(
        js,
        stream::Config {
            name: lock_stream(&options.stream),
            subjects: vec![lock_subject(&options.stream)],
            storage: stream::StorageType::File,
            num_replicas: options.replicas.max(1),
            max_messages_per_subject: 16,
            discard: stream::DiscardPolicy::Old,
            ..Default::default()
        },
        "opening the writer lock",
        limit,
    )
    .await?;
    let read_held = || {
        bounded(limit, "reading the writer lock", async {
            match lock
                .get_last_raw_message_by_subject(&lock_subject(&options.stream))
                .await
            {
                Ok(msg) => Ok(msg.sequence),
                Err(e)
                    if e.kind()
                        == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
                {
                    Ok(0)
                }
                Err(e) => Err(e),
            }
        })
    };
    let held = read_held().await?;
    if let Some(node) = live_writer(client, &options.stream, limit).await? {
        return Err(locked(&options.stream, &node));
    }
    // On a NATS cluster, a claimant's subscription reaches the other servers a moment after it
    // subscribed: a node on another server that read the claimant's fresh claim could still be
    // told "no responders" and claim after it (two writers; seen in the fault suite,
    // tests/cluster_faults.rs). So the answer must hold for `INTEREST_SETTLE`, with the lock
    // unchanged, before claiming.
    tokio::time::sleep(INTEREST_SETTLE).await;
    if read_held().await? != held {
        return Err(locked(
            &options.stream,
            "(another node claimed it meanwhile)",
        ));
    }
    if let Some(node) = live_writer(client, &options.stream, limit).await? {
        return Err(locked(&options.stream, &node));
    }
    let mut sub = client
        .subscribe(writer_subject(&options.stream))
        .await
        .map_err(|e| nats_err("answering for the stream's writer", e))?;
    // Answering starts at once: a node asking while this claim is in flight is told to wait
    // (it asks again later), never left to time out.
    let responder = {
        let client = client.clone();
        let node = options.node.clone();
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                if let Some(reply) = msg.reply {
                    let _ = client.publish(reply, node.clone().into()).await;
                }
            }
        })
    };
    let claim = async {
        bounded(limit, "subscribing as the stream's writer", client.flush()).await?;
        let claim = PublishMessage::build()
            .payload(options.node.clone().into())
            .expected_last_subject_sequence(held);
        // `None`: another claim landed first ("wrong last sequence").
        let claimed = async {
            let ack = js
                .send_publish(lock_subject(&options.stream), claim)
                .await
                .map_err(|e| e.to_string())?
                .await;
            match ack {
                Ok(ack) => Ok(Some(ack.sequence)),
                Err(e) if e.to_string().contains("wrong last sequence") => Ok(None),
                Err(e) => Err(e.to_string()),
            }
        };
        match bounded(limit, "claiming the writer lock", claimed).await? {
            Some(seq) => Ok(seq),
            None => Err(locked(&options.stream, "(another node claimed it first)")),
        }
    };
    match claim.await {
        Ok(seq) => Ok(Claimed {
            responder,
            fence: writer::Fence {
                client: client.clone(),
                lock,
                subject: lock_subject(&options.stream),
                seq,
                connects: client
                    .statistics()
                    .connects
                    .load(std::sync::atomic::Ordering::Relaxed),
                timeout: limit,
            },
        }),
        Err(e) => {
            responder.abort();
            Err(e)
        }
    }
}

/// A writer lock this node holds: the task answering as the writer, and what the writer
/// checks the claim with before publishing again after its connection to NATS was lost.
struct Claimed {
    responder: tokio::task::JoinHandle<()>,
    fence: writer::Fence,
}

fn locked(stream: &str, node: &str) -> StoreError {
    StoreError::Locked(format!(
        "NATS JetStream: stream {stream} is being written by live node {node:?}; one live node \
         per stream (with `[cluster] standby = true` a node waits and takes over when the \
         writer stops)"
    ))
}

/// The stream's configuration with the limits and replicas of `o`, when any of them differs
/// from `current` (every other field as it is).
fn limits_update(current: &stream::Config, o: &JetStreamOptions) -> Option<stream::Config> {
    let wanted = stream_config(o);
    let same = current.max_messages == wanted.max_messages
        && current.max_bytes == wanted.max_bytes
        && current.max_age == wanted.max_age
        && current.num_replicas == wanted.num_replicas;
    (!same).then(|| stream::Config {
        max_messages: wanted.max_messages,
        max_bytes: wanted.max_bytes,
        max_age: wanted.max_age,
        num_replicas: wanted.num_replicas,
        ..current.clone()
    })
}

fn stream_config(o: &JetStreamOptions) -> stream::Config {
    stream::Config {
        name: o.stream.clone(),
        subjects: vec![format!("{}.>", o.subject_prefix)],
        storage: stream::StorageType::File,
        num_replicas: o.replicas.max(1),
        max_messages: o.max_events.unwrap_or(-1),
        max_bytes: o.max_bytes.unwrap_or(-1),
        max_age: o.max_age.unwrap_or(Duration::ZERO),
        discard: stream::DiscardPolicy::Old,
        duplicate_window: o.duplicate_window,
        allow_direct: true,
        ..Default::default()
    }
}

impl EventStore for JetStreamStore {
    fn append(&self, rows: Vec<StoredRow>) {
        if !rows.is_empty() {
            self.send(Incoming::Rows(rows));
        }
    }

    fn append_records(&self, records: Vec<Arc<EventRecord>>) {
        if !records.is_empty() {
            self.send(Incoming::Records(records));
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
        drop(lock(&self.writer).take());
        let exit = lock(&self.writer_exit).take();
        self.refresher.abort();
        if let Some(r) = &self.responder {
            r.abort();
        }
        let client = self.client.clone();
        // The writer gives up after `close_timeout` itself; this bound is a second fence.
        let limit = self.close_timeout + Duration::from_secs(5);
        Box::pin(async move {
            let Some(exit) = exit else {
                return Ok(());
            };
            let result = match tokio::time::timeout(limit, exit).await {
                Ok(r) => r.unwrap_or(Err(StoreError::Closed)),
                Err(_) => Err(StoreError::Io(format!(
                    "NATS JetStream: closing: the writer did not stop within {limit:?}"
                ))),
            };
            let _ = tokio::time::timeout(Duration::from_secs(1), client.drain()).await;
            result
        })
    }
}
