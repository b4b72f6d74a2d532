//! Entry points for fuzzing: the three places where a peer's bytes meet our code, wrapped so
//! the cargo-fuzz targets in `fuzz/` and the property tests in `tests/fuzz_prop.rs` drive
//! exactly the same code paths (`docs/security.md`, "Fuzzing").
//!
//! - [`decode_frames`]: bytes → NDJSON lines ([`NdjsonCodec`], fed in arbitrary chunks) →
//!   frame-level checks ([`jsonrpc::parse_frame`]: depth, syntax, batch) → per-entry
//!   classification ([`jsonrpc::classify`]). Pure, no runtime.
//! - [`DispatchHarness`]: frames through a real router and the real connection driver, over an
//!   in-memory link (like [`crate::transport::in_process`], but the close frame is kept). A
//!   fresh router per run, so a finding replays from its input alone.
//! - [`check_filter`]: bytes → `SubscriptionFilter` (serde, as in `map/subscribe`) →
//!   [`CompiledFilter`] → matched against one sample event of every type.
//!
//! Each entry point has a checker that returns `Err(what went wrong)` when an invariant fails,
//! so a fuzz target or a property test only has to `assert!` on it. Nothing here is a stable
//! API (the module is `#[doc(hidden)]`); it is public only because `fuzz/` is a separate crate.
//!
//! Departure from STYLE.md's "one room per concept": this module owns no concept, it only
//! reaches into several rooms on behalf of the fuzzers. It holds no logic of its own that the
//! server runs, so the fuzzers test the server's code and not a copy of it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_util::codec::Decoder;

use crate::protocol::event::{EventType, SubscriptionFilter};
use crate::protocol::jsonrpc::{self, ErrorCode, Frame, Incoming};
use crate::router::dispatch::Dispatcher;
use crate::router::events::filter::CompiledFilter;
use crate::router::events::log::Audience;
use crate::router::events::log::EventRecord;
use crate::router::events::log::FilterKeys;
use crate::router::Router;
use crate::router::RouterParts;
use crate::transport::connection::{ConnectionOptions, InFrame, OutFrame};
use crate::transport::ndjson::NdjsonCodec;
use crate::transport::TransportContext;

/// The line cap the fuzzers use: small, so the oversize path is reached by small inputs.
pub const FUZZ_MAX_LINE: usize = 4096;

/// The frame-size cap of [`DispatchHarness`] (text frames above it get `-32600`).
pub const FUZZ_MAX_FRAME: usize = 64 * 1024;

/// The batch cap of [`DispatchHarness`] and [`decode_frames`].
pub const FUZZ_MAX_BATCH: usize = 32;

/// The most frames one [`DispatchHarness::run`] sends (the rest of the input is ignored).
pub const FUZZ_MAX_FRAMES: usize = 64;

/// How one entry of a frame was classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A request: answered exactly once, with this id (JSON text, verbatim).
    Request {
        /// The id as sent.
        id: String,
        /// The method.
        method: String,
    },
    /// A notification: never answered.
    Notification {
        /// The method.
        method: String,
    },
    /// A response from the peer: dropped.
    Response,
    /// Not a JSON-RPC message: answered `-32600` with this id (`null` when none was readable).
    Invalid {
        /// The id the error goes to.
        id: String,
    },
    /// Valid JSON that is not an object: answered `-32600` with `id: null`.
    NotObject,
}

impl Entry {
    /// The id of the one response this entry gets, if it gets one.
    pub fn answered_with(&self) -> Option<&str> {
        match self {
            Self::Request { id, .. } | Self::Invalid { id } => Some(id),
            Self::NotObject => Some("null"),
            Self::Notification { .. } | Self::Response => None,
        }
    }
}

/// One frame as the decoder and the frame-level checks saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// The transport refused the frame before any JSON was read: too long or not UTF-8.
    /// Answered once with `id: null` and this code.
    Refused {
        /// `-32600` (too long) or `-32700` (not UTF-8).
        code: i32,
    },
    /// Text whose frame-level checks failed: answered once with `id: null` and this code.
    Rejected {
        /// The line.
        text: String,
        /// `-32600` or `-32700`.
        code: i32,
    },
    /// A single message.
    One {
        /// The line.
        text: String,
        /// Its classification.
        entry: Entry,
    },
    /// A batch.
    Batch {
        /// The line.
        text: String,
        /// Its entries, in order.
        entries: Vec<Entry>,
    },
}

impl Decoded {
    /// The ids of the responses this frame gets, in order (`"null"` for `id: null`).
    pub fn expected_ids(&self) -> Vec<String> {
        match self {
            Self::Refused { .. } | Self::Rejected { .. } => vec!["null".into()],
            Self::One { entry, .. } => entry
                .answered_with()
                .map(str::to_owned)
                .into_iter()
                .collect(),
            Self::Batch { entries, .. } => entries
                .iter()
                .filter_map(Entry::answered_with)
                .map(str::to_owned)
                .collect(),
        }
    }

    /// The frame as the transport hands it to the session.
    fn in_frame(&self) -> InFrame {
        match self {
            Self::Refused { code: -32700 } => InFrame::BadUtf8,
            Self::Refused { .. } => InFrame::TooLarge {
                len: FUZZ_MAX_LINE + 1,
            },
            Self::Rejected { text, .. } | Self::One { text, .. } | Self::Batch { text, .. } => {
                InFrame::Text(text.clone())
            }
        }
    }
}

fn entry(raw: &serde_json::value::RawValue) -> Entry {
    if !raw.get().trim_start().starts_with('{') {
        return Entry::NotObject;
    }
    match jsonrpc::classify(raw) {
        Incoming::Request { id, method, .. } => Entry::Request {
            id: id.as_json().to_owned(),
            method: method.to_owned(),
        },
        Incoming::Notification { method, .. } => Entry::Notification {
            method: method.to_owned(),
        },
        Incoming::Response => Entry::Response,
        Incoming::Invalid { id, .. } => Entry::Invalid {
            id: id.as_json().to_owned(),
        },
    }
}

/// Classifies one text frame exactly as [`crate::router::rpc::RpcSession`] does.
pub fn classify_text(text: &str, max_depth: usize, max_batch: usize) -> Decoded {
    match jsonrpc::parse_frame(text, max_depth, max_batch) {
        Err(e) => Decoded::Rejected {
            text: text.to_owned(),
            code: e.code.0,
        },
        Ok(Frame::One(raw)) => Decoded::One {
            text: text.to_owned(),
            entry: entry(raw),
        },
        Ok(Frame::Batch(items)) => Decoded::Batch {
            text: text.to_owned(),
            entries: items.into_iter().map(entry).collect(),
        },
    }
}

/// Splits `bytes` into NDJSON frames with a [`NdjsonCodec`] capped at `max_line`, feeding the
/// decoder `chunk` bytes at a time (as a socket would), then classifies each frame.
pub fn decode_frames(bytes: &[u8], max_line: usize, chunk: usize) -> Vec<Decoded> {
    let mut codec = NdjsonCodec::new(max_line);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut push = |frame: InFrame| {
        frames.push(match frame {
            InFrame::Text(text) => classify_text(&text, jsonrpc::DEFAULT_MAX_DEPTH, FUZZ_MAX_BATCH),
            InFrame::BadUtf8 => Decoded::Refused { code: -32700 },
            // The codec makes nothing else.
            _ => Decoded::Refused { code: -32600 },
        });
    };
    for piece in bytes.chunks(chunk.max(1)) {
        buf.extend_from_slice(piece);
        while let Ok(Some(frame)) = codec.decode(&mut buf) {
            push(frame);
        }
    }
    while let Ok(Some(frame)) = codec.decode_eof(&mut buf) {
        push(frame);
    }
    frames
}

/// The invariants of [`decode_frames`] on one input: the chunk size changes nothing, every
/// text frame is one trimmed line within the cap, and every rejection is `-32600`/`-32700`.
///
/// # Errors
/// What failed, for the fuzzer's report.
pub fn check_decode(bytes: &[u8], chunk: usize) -> Result<Vec<Decoded>, String> {
    let whole = decode_frames(bytes, FUZZ_MAX_LINE, bytes.len().max(1));
    let chunked = decode_frames(bytes, FUZZ_MAX_LINE, chunk);
    if whole != chunked {
        return Err(format!(
            "chunks of {chunk} bytes decode differently:\n{whole:?}\nvs\n{chunked:?}"
        ));
    }
    let lines = bytes.split(|b| *b == b'\n').count();
    if whole.len() > lines {
        return Err(format!("{} frames from {lines} lines", whole.len()));
    }
    for frame in &whole {
        match frame {
            Decoded::Refused { code } | Decoded::Rejected { code, .. }
                if *code != -32600 && *code != -32700 =>
            {
                return Err(format!("frame-level code {code}"));
            }
            _ => {}
        }
        if let Decoded::Rejected { text, .. }
        | Decoded::One { text, .. }
        | Decoded::Batch { text, .. } = frame
        {
            if text.contains('\n') || text.len() > FUZZ_MAX_LINE || text != text.trim() {
                return Err(format!("bad line {text:?}"));
            }
            if text.is_empty() {
                return Err("an empty line became a frame".into());
            }
        }
        if let Decoded::Batch { entries, .. } = frame {
            if entries.is_empty() || entries.len() > FUZZ_MAX_BATCH {
                return Err(format!("a batch of {} entries got through", entries.len()));
            }
        }
    }
    Ok(whole)
}

/// What one connection saw: the frames sent (classified), the text frames received, and the
/// close frame, if the router sent one.
#[derive(Debug, Default)]
pub struct Transcript {
    /// The frames sent, in order.
    pub sent: Vec<Decoded>,
    /// Text frames received, in order (responses and notifications).
    pub received: Vec<String>,
    /// The close frame (code, reason), if any.
    pub close: Option<(u16, String)>,
}

/// Response ids of one received frame, checking each response's envelope on the way.
fn response_ids(frame: &str) -> Result<Vec<String>, String> {
    let value: Value =
        serde_json::from_str(frame).map_err(|e| format!("received invalid JSON ({e}): {frame}"))?;
    let objects = match &value {
        Value::Array(items) if !items.is_empty() => items.iter().collect(),
        Value::Array(_) => return Err("received an empty batch response".into()),
        other => vec![other],
    };
    let batch = value.is_array();
    let mut ids = Vec::new();
    for obj in objects {
        let Some(map) = obj.as_object() else {
            return Err(format!("received a non-object: {frame}"));
        };
        if map.get("jsonrpc") != Some(&Value::from("2.0")) {
            return Err(format!("no jsonrpc 2.0: {frame}"));
        }
        if map.contains_key("method") {
            if batch || map.contains_key("id") {
                return Err(format!("a request or a notification in a batch: {frame}"));
            }
            continue; // a notification (map/event, map/message, ...)
        }
        let Some(id) = map.get("id") else {
            return Err(format!("a response without id: {frame}"));
        };
        match (map.get("result"), map.get("error")) {
            (Some(_), None) => {}
            (None, Some(error)) => {
                let code = error.get("code").and_then(Value::as_i64);
                let known =
                    code.is_some_and(|c| ErrorCode::ALL.iter().any(|k| i64::from(k.0) == c));
                if !known {
                    return Err(format!("undocumented error code: {frame}"));
                }
                if !error.get("message").is_some_and(Value::is_string) {
                    return Err(format!("an error without a message: {frame}"));
                }
            }
            _ => return Err(format!("not exactly one of result and error: {frame}")),
        }
        ids.push(id.clone());
    }
    // Ids compare as JSON values, not text: the echo is verbatim, so this is stricter only
    // where serde_json normalises (never for text we produced).
    Ok(ids
        .into_iter()
        .map(|v| serde_json::to_string(&v).unwrap_or_default())
        .collect())
}

fn normalise_id(id: &str) -> String {
    serde_json::from_str::<Value>(id)
        .map(|v| serde_json::to_string(&v).unwrap_or_default())
        .unwrap_or_else(|_| id.to_owned())
}

impl Transcript {
    /// The dispatch invariants: every received frame is valid JSON-RPC with a documented error
    /// code; the responses' ids are exactly the ids the sent frames call for, in order; when
    /// responses are missing, the router closed the connection and said why.
    ///
    /// # Errors
    /// What failed, for the fuzzer's report.
    pub fn check(&self) -> Result<(), String> {
        let expected: Vec<String> = self
            .sent
            .iter()
            .flat_map(Decoded::expected_ids)
            .map(|id| normalise_id(&id))
            .collect();
        let mut got = Vec::new();
        for frame in &self.received {
            got.extend(response_ids(frame)?);
        }
        if got == expected {
            return Ok(());
        }
        let closed_with_reason = self
            .close
            .as_ref()
            .is_some_and(|(code, reason)| *code != 1000 && !reason.is_empty());
        if closed_with_reason && expected.starts_with(&got) {
            return Ok(());
        }
        Err(format!(
            "response ids {got:?} but the frames call for {expected:?} (close: {:?})",
            self.close
        ))
    }

    /// How many responses carried each error code.
    pub fn error_codes(&self) -> HashMap<i64, usize> {
        let mut codes = HashMap::new();
        for frame in &self.received {
            let Ok(value) = serde_json::from_str::<Value>(frame) else {
                continue;
            };
            let items = match value {
                Value::Array(items) => items,
                other => vec![other],
            };
            for item in items {
                if let Some(code) = item.pointer("/error/code").and_then(Value::as_i64) {
                    *codes.entry(code).or_default() += 1;
                }
            }
        }
        codes
    }
}

/// A `map/connect` frame that always succeeds (the first frame of most fuzz runs).
pub const CONNECT: &str = r#"{"jsonrpc":"2.0","id":"fuzz-connect","method":"map/connect","params":{"protocolVersion":1,"participantType":"client","name":"fuzz"}}"#;

/// Runs frames through a real router over the real connection driver. Each run gets a new
/// router (default configuration, no store, no process supervisor: a fuzzed `map/agents/spawn`
/// never starts a program) on the harness's single-threaded runtime, so runs do not share
/// state. Request rates are not limited (the rate limiter depends on the clock, which would
/// make findings hard to replay; it has tests of its own).
#[derive(Debug)]
pub struct DispatchHarness {
    rt: tokio::runtime::Runtime,
    /// The bound on one run; a run that takes longer panics (a hang is a finding too).
    pub run_timeout: Duration,
}

impl Default for DispatchHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl DispatchHarness {
    /// A harness with its own current-thread runtime.
    ///
    /// # Panics
    /// When the runtime cannot be built.
    pub fn new() -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime");
        Self {
            rt,
            run_timeout: Duration::from_secs(10),
        }
    }

    /// Splits `bytes` into NDJSON frames (as the stdio transport would) and sends at most
    /// [`FUZZ_MAX_FRAMES`] of them on one new connection, after a [`CONNECT`] when `connect`.
    pub fn run_bytes(&self, bytes: &[u8], connect: bool) -> Transcript {
        let mut frames: Vec<Decoded> = Vec::new();
        if connect {
            frames.push(classify_text(
                CONNECT,
                jsonrpc::DEFAULT_MAX_DEPTH,
                FUZZ_MAX_BATCH,
            ));
        }
        frames.extend(decode_frames(bytes, FUZZ_MAX_LINE, bytes.len().max(1)));
        frames.truncate(FUZZ_MAX_FRAMES);
        self.run(frames)
    }

    /// Sends text frames, in order, on one new connection (no implicit connect).
    pub fn run_texts<S: AsRef<str>>(&self, texts: &[S]) -> Transcript {
        let frames = texts
            .iter()
            .take(FUZZ_MAX_FRAMES)
            .map(|t| {
                let t = t.as_ref();
                if t.len() > FUZZ_MAX_FRAME {
                    Decoded::Refused { code: -32600 }
                } else {
                    classify_text(t, jsonrpc::DEFAULT_MAX_DEPTH, FUZZ_MAX_BATCH)
                }
            })
            .collect();
        self.run(frames)
    }

    /// Sends classified frames on one new connection, then ends it (as a peer that hangs up)
    /// and collects everything the router wrote.
    ///
    /// # Panics
    /// When the run takes longer than [`DispatchHarness::run_timeout`], or the router task
    /// panicked.
    pub fn run(&self, frames: Vec<Decoded>) -> Transcript {
        let limit = self.run_timeout;
        self.rt.block_on(async move {
            match tokio::time::timeout(limit, serve(frames)).await {
                Ok(transcript) => transcript,
                Err(_) => panic!("a dispatch run took longer than {limit:?}"),
            }
        })
    }
}

async fn serve(frames: Vec<Decoded>) -> Transcript {
    let config = crate::server::Config::default();
    let (router, router_task) = Router::start(
        config.router_config(),
        RouterParts {
            process_control: None,
            store: None,
            metrics: None,
            traces: None,
            carried_fold: None,
        },
    );
    let (shutdown_tx, shutdown) = tokio::sync::watch::channel(false);
    let ctx = TransportContext {
        router,
        dispatcher: Arc::new(Dispatcher::new()),
        shutdown,
        connections: tokio_util::task::TaskTracker::new(),
    };
    let opts = ConnectionOptions {
        max_frame_bytes: FUZZ_MAX_FRAME,
        max_batch: FUZZ_MAX_BATCH,
        ping_interval: None,
        idle_timeout: None,
        handshake_timeout: None,
        ..config.connection_options()
    };
    let mut queue: VecDeque<InFrame> = frames.iter().map(Decoded::in_frame).collect();
    let (mut to_router, from_peer) = mpsc::channel::<InFrame>(queue.len() + 1);
    let (to_peer, mut from_router) = mpsc::unbounded::<OutFrame>();
    let stream = from_peer.map(Ok);
    let sink = to_peer.sink_map_err(|e| e.to_string());
    let conn = tokio::spawn(ctx.serve(stream, sink, opts));
    while let Some(frame) = queue.pop_front() {
        // Room for every frame was reserved above; a failure means the connection ended.
        if to_router.send(frame).await.is_err() {
            break;
        }
    }
    drop(to_router);
    let mut transcript = Transcript {
        sent: frames,
        ..Transcript::default()
    };
    while let Some(frame) = from_router.next().await {
        match frame {
            OutFrame::Close { code, reason } => transcript.close = Some((code, reason)),
            text => transcript.received.extend(text.into_text()),
        }
    }
    conn.await.expect("the connection task does not panic");
    ctx.connections.close();
    ctx.connections.wait().await;
    drop(ctx);
    drop(shutdown_tx);
    router_task.await.expect("the router task does not panic");
    transcript
}

/// Runs `filter` (JSON bytes, the `filter` of `map/subscribe`) against one sample event of
/// every type. `Ok(None)`: not a filter (serde refused it, as `map/subscribe` would with
/// `-32602`); `Err(code)`: the filter compiled to an error.
pub fn filter_matches(bytes: &[u8]) -> Result<Option<Vec<bool>>, i32> {
    let Ok(filter) = serde_json::from_slice::<SubscriptionFilter>(bytes) else {
        return Ok(None);
    };
    run_filter(&filter).map(Some)
}

fn run_filter(filter: &SubscriptionFilter) -> Result<Vec<bool>, i32> {
    let compiled = CompiledFilter::compile(Some(filter)).map_err(|e| e.code.0)?;
    let env = sample_environment();
    Ok(sample_events()
        .iter()
        .map(|rec| compiled.matches(rec, |_| Some(&env)))
        .collect())
}

fn sample_environment() -> serde_json::Map<String, Value> {
    match serde_json::json!({"os": {"type": "linux", "arch": "x86_64"}, "region": "eu", "n": 1}) {
        Value::Object(map) => map,
        _ => unreachable!("a literal object"),
    }
}

/// One event of every type, with filter keys that vary from one to the next.
fn sample_events() -> Vec<EventRecord> {
    let metadata = match serde_json::json!({"team": "red", "n": 1, "nested": {"a": [1, 2]}}) {
        Value::Object(map) => Arc::new(map),
        _ => unreachable!("a literal object"),
    };
    EventType::ALL
        .iter()
        .enumerate()
        .map(|(i, kind)| {
            let mut rec = EventRecord::synthetic(*kind, "{}".into(), Audience::Everyone);
            rec.source = (i % 3 != 0).then(|| Arc::from(["a1", "a2"][i % 2]));
            rec.keys = FilterKeys {
                agent_id: (i % 4 != 0).then(|| "a1".into()),
                source_role: (i % 2 == 0).then(|| Arc::from("worker")),
                subject_role: (i % 3 == 0).then(|| Arc::from(["worker", "boss"][i % 2])),
                scopes: if i % 2 == 0 {
                    vec!["child".into(), "root".into()]
                } else {
                    Vec::new()
                },
                priority: kind.is_message().then(|| Arc::from(["high", "low"][i % 2])),
                correlation_ids: if i % 5 == 0 {
                    vec![Arc::from("c1")]
                } else {
                    Vec::new()
                },
                metadata: (i % 2 == 1).then(|| metadata.clone()),
                work_session: (i % 2 == 0).then(|| Arc::from("w1")),
                task_id: kind.is_task().then(|| Arc::from(["t1", "t2"][i % 2])),
                mail: kind.is_mail().then(|| {
                    Arc::new(crate::store::record::MailKeys {
                        conversation_id: ["c1", "c2"][i % 2].into(),
                        thread_id: (i % 3 == 0).then(|| "th1".into()),
                        participant_id: Some(["a1", "a2"][i % 2].into()),
                        content_type: (i % 2 == 0).then(|| "text".into()),
                    })
                }),
                owner: None,
            };
            rec
        })
        .collect()
}

/// The filter invariants on one input: compiling refuses only with `-32602`; a filter that
/// constrains nothing matches every event; the two spellings of event types (`agent_registered`,
/// `agent.registered`) match the same events; and dropping any one field never matches fewer
/// events (AND across fields).
///
/// # Errors
/// What failed, for the fuzzer's report.
pub fn check_filter(bytes: &[u8]) -> Result<(), String> {
    let Ok(filter) = serde_json::from_slice::<SubscriptionFilter>(bytes) else {
        return Ok(());
    };
    let base = match run_filter(&filter) {
        Ok(m) => m,
        Err(-32602) => return Ok(()),
        Err(code) => return Err(format!("the filter was refused with {code}")),
    };
    let compiled = CompiledFilter::compile(Some(&filter)).map_err(|e| e.message)?;
    // A filter that constrains nothing admits every event of a standard type, and no vendor
    // type (those must be named).
    if compiled.is_match_all()
        && base
            .iter()
            .zip(EventType::ALL)
            .any(|(m, kind)| *m == kind.is_vendor())
    {
        return Err(format!("a match-all filter missed an event: {filter:?}"));
    }
    if let Some(types) = &filter.event_types {
        let respelled = SubscriptionFilter {
            event_types: Some(types.iter().map(|t| t.replace('_', ".")).collect()),
            ..filter.clone()
        };
        if run_filter(&respelled).as_ref() != Ok(&base) {
            return Err(format!(
                "event-type spelling changed the matches: {filter:?}"
            ));
        }
    }
    for looser in loosenings(&filter) {
        let Ok(matches) = run_filter(&looser) else {
            return Err(format!(
                "dropping a field made the filter invalid: {looser:?}"
            ));
        };
        if base
            .iter()
            .zip(&matches)
            .any(|(before, after)| *before && !after)
        {
            return Err(format!(
                "dropping a field matched fewer events: {filter:?} -> {looser:?}"
            ));
        }
    }
    Ok(())
}

/// `filter` with one field removed, for each field it has.
fn loosenings(filter: &SubscriptionFilter) -> Vec<SubscriptionFilter> {
    let mut out = Vec::new();
    let mut drop = |clear: fn(&mut SubscriptionFilter)| {
        let mut f = filter.clone();
        clear(&mut f);
        if f != *filter {
            out.push(f);
        }
    };
    drop(|f| f.event_types = None);
    drop(|f| {
        f.from_agents = None;
        f.agents = None;
    });
    drop(|f| f.from_roles = None);
    drop(|f| f.roles = None);
    drop(|f| f.scopes = None);
    drop(|f| f.priorities = None);
    drop(|f| f.correlation_ids = None);
    drop(|f| f.metadata_match = None);
    drop(|f| f.environment_match = None);
    drop(|f| {
        f.mail = None;
        f.trajectory = None;
        f.tasks = None;
    });
    out
}
