//! The JetStream event store (feature `cluster`) against a real `nats-server` on loopback:
//! append and commit, reads and positions as the SQLite store answers them, a second store
//! instance (a second node) on the same stream, de-duplication, conflicting writers, retention,
//! and the server killed with SIGKILL and restarted on the same store directory.
//!
//! Each test starts its own `nats-server -js` (`common::nats`) on 127.0.0.1 with a free port and a temporary
//! store directory. The server is required: when `nats-server` is not installed the tests
//! fail (never skip), saying how to install it. Every await is bounded by a timeout.
//!
//! Run: `cargo test --test store_jetstream`. The latency measurement is
//! ignored by default: `cargo test --release --test store_jetstream --
//! --ignored --nocapture measure`.
#![cfg(feature = "cluster")]

mod common;

use std::future::Future;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::nats::Nats;
use common::TempDir;
use map_router::protocol::ids::{EventId, Ulid};
use map_router::store::jetstream::follower::Follower;
use map_router::store::jetstream::{JetStreamOptions, JetStreamStore};
use map_router::store::kept::{KeptAnswer, KeptQuery, KeptTable};
use map_router::store::memory::MemoryKept;
use map_router::store::record::StoredRow;
use map_router::store::sqlite::{SqliteOptions, SqliteStore};
use map_router::store::{EventStore, StoreError};

/// The bound on every single await.
const TIMEOUT: Duration = Duration::from_secs(20);

/// A fixed base timestamp (Unix ms), so rows can be rebuilt exactly from their seq.
const BASE_TS: u64 = 1_700_000_000_000;

async fn within<F: Future>(fut: F) -> F::Output {
    match tokio::time::timeout(TIMEOUT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {TIMEOUT:?}"),
    }
}

/// The id of the row at `seq` with timestamp `ts`: increasing with seq while ts does not
/// decrease.
fn id_for(seq: u64, ts: u64) -> EventId {
    EventId(Ulid::from_parts(ts, u128::from(seq)))
}

fn ts_of(seq: u64) -> u64 {
    BASE_TS + seq * 10
}

const KINDS: [&str; 3] = ["agent_registered", "message.sent", "task_created"];

fn row(seq: u64) -> StoredRow {
    StoredRow {
        seq,
        id: id_for(seq, ts_of(seq)).to_string(),
        timestamp: ts_of(seq),
        kind: KINDS[(seq % 3) as usize].into(),
        meta: r#"{"keys":{},"audience":{"kind":"everyone"}}"#.into(),
        json: format!(r#"{{"n":{seq},"text":"é ✓ \"quoted\"\n"}}"#),
    }
}

fn rows(range: std::ops::Range<u64>) -> Vec<StoredRow> {
    range.map(row).collect()
}

fn options(nats: &Nats) -> JetStreamOptions {
    let mut o = JetStreamOptions::new(nats.url());
    o.request_timeout = Duration::from_millis(1500);
    o.close_timeout = Duration::from_secs(3);
    o
}

async fn open(o: JetStreamOptions) -> (Arc<JetStreamStore>, map_router::store::Recovered) {
    within(JetStreamStore::open(o))
        .await
        .expect("open the store")
}

async fn wait_committed(store: &JetStreamStore, n: u64) {
    let mut committed = store.committed();
    within(committed.wait_for(|&c| c >= n))
        .await
        .expect("the writer is running");
}

async fn read_all(store: &JetStreamStore, from: u64) -> Vec<StoredRow> {
    within(store.read(from, usize::MAX)).await.expect("read")
}

#[tokio::test]
async fn append_commits_in_order_and_reads_ranges() {
    let nats = Nats::start("append");
    let (store, recovered) = open(options(&nats)).await;
    assert_eq!(recovered.next_seq, 1, "a fresh stream numbers from 1");
    assert_eq!(recovered.first_seq, 1);
    assert!(recovered.last_id.is_none() && recovered.recent.is_empty());
    assert_eq!(*store.committed().borrow(), 1);

    store.append(rows(1..11));
    store.append(rows(11..21));
    wait_committed(&store, 21).await;
    assert_eq!(read_all(&store, 1).await, rows(1..21));
    assert_eq!(
        read_all(&store, 0).await,
        rows(1..21),
        "from before the start"
    );
    assert_eq!(within(store.read(5, 3)).await.unwrap(), rows(5..8));
    assert!(within(store.read(21, 10)).await.unwrap().is_empty());
    assert!(within(store.read(500, 10)).await.unwrap().is_empty());
    assert_eq!(store.first_seq(), 1);

    // A reused or skipped sequence number is refused without wedging the writer.
    let mut dup = row(5);
    dup.json = "{\"dup\":true}".into();
    store.append(vec![dup, row(40)]);
    store.append(rows(21..31));
    wait_committed(&store, 31).await;
    assert_eq!(read_all(&store, 1).await, rows(1..31));
    assert!(store.diverged().is_none());
    within(store.close()).await.unwrap();
}

#[tokio::test]
async fn positions_by_id_and_time() {
    let nats = Nats::start("positions");
    let (store, _) = open(options(&nats)).await;
    // Empty: every position is the next seq.
    assert_eq!(
        within(store.seq_after(id_for(1, ts_of(1)))).await.unwrap(),
        1
    );
    assert_eq!(within(store.seq_at_or_after_time(0)).await.unwrap(), 1);

    store.append(rows(1..51));
    wait_committed(&store, 51).await;
    for seq in [1, 2, 17, 49, 50] {
        assert_eq!(
            within(store.seq_after(id_for(seq, ts_of(seq))))
                .await
                .unwrap(),
            seq + 1,
            "after the id of {seq}"
        );
        assert_eq!(
            within(store.seq_at_or_after_time(ts_of(seq)))
                .await
                .unwrap(),
            seq
        );
        assert_eq!(
            within(store.seq_at_or_after_time(ts_of(seq) - 1))
                .await
                .unwrap(),
            seq
        );
    }
    // Ids never stored are positions too.
    let between = EventId(Ulid::from_parts(ts_of(17), 1_000_000));
    assert_eq!(within(store.seq_after(between)).await.unwrap(), 18);
    let before = EventId(Ulid::from_parts(BASE_TS - 1, 0));
    assert_eq!(within(store.seq_after(before)).await.unwrap(), 1);
    let after = EventId(Ulid::from_parts(ts_of(1000), 0));
    assert_eq!(within(store.seq_after(after)).await.unwrap(), 51);
    assert_eq!(
        within(store.seq_at_or_after_time(ts_of(1000)))
            .await
            .unwrap(),
        51
    );
    assert_eq!(within(store.seq_at_or_after_time(0)).await.unwrap(), 1);
    within(store.close()).await.unwrap();
}

#[tokio::test]
async fn reads_by_kind_and_by_id() {
    let nats = Nats::start("kinds");
    let (store, _) = open(options(&nats)).await;
    store.append(rows(1..61));
    wait_committed(&store, 61).await;

    let kinds = |ks: &[&str]| ks.iter().map(|k| (*k).to_owned()).collect::<Vec<_>>();
    let expect = |ks: &[&str], from: u64, limit: usize| -> Vec<StoredRow> {
        rows(from.max(1)..61)
            .into_iter()
            .filter(|r| ks.contains(&r.kind.as_str()))
            .take(limit)
            .collect()
    };
    for (ks, from, limit) in [
        (&["message.sent"][..], 1, usize::MAX),
        (&["agent_registered", "task_created"][..], 7, 9),
        (
            &["task_created", "message.sent", "message.sent"][..],
            0,
            1000,
        ),
        (&["task_created"][..], 58, 10),
        (&["no_such_kind"][..], 1, 10),
        (&["message"][..], 1, 10),
    ] {
        assert_eq!(
            within(store.read_kinds(kinds(ks), from, limit))
                .await
                .unwrap(),
            expect(ks, from, limit),
            "{ks:?} from {from} limit {limit}"
        );
    }

    let missing = EventId(Ulid::from_parts(ts_of(30), 999_999));
    let ids = vec![
        id_for(45, ts_of(45)),
        missing,
        id_for(3, ts_of(3)),
        id_for(60, ts_of(60)),
        id_for(1, ts_of(1)),
    ];
    let got = within(store.read_ids(ids)).await.unwrap();
    assert_eq!(got, vec![row(1), row(3), row(45), row(60)]);
    within(store.close()).await.unwrap();
}

#[tokio::test]
async fn a_second_node_on_the_same_stream_sees_the_same_log() {
    let nats = Nats::start("two-nodes");
    let mut o = options(&nats);
    o.stream = "MAP_TEST_SHARED".into();
    o.subject_prefix = "maptest.ev".into();
    let (a, _) = open(o.clone()).await;
    a.append(rows(1..11));
    wait_committed(&a, 11).await;

    let (b, recovered) = open(o.clone()).await;
    assert_eq!(recovered.next_seq, 11);
    assert_eq!(recovered.first_seq, 1);
    assert_eq!(recovered.last_id, Some(id_for(10, ts_of(10))));
    assert_eq!(recovered.last_timestamp, ts_of(10));
    assert_eq!(recovered.recent, rows(1..11));
    assert_eq!(read_all(&b, 1).await, rows(1..11));

    // B continues the log; A reads B's rows at the same positions, with the same ids.
    b.append(rows(11..16));
    wait_committed(&b, 16).await;
    assert_eq!(read_all(&a, 1).await, rows(1..16));
    assert_eq!(
        within(a.seq_after(id_for(13, ts_of(13)))).await.unwrap(),
        14
    );
    within(a.close()).await.unwrap();
    within(b.close()).await.unwrap();
}

#[tokio::test]
async fn conflicting_writers_never_renumber_and_the_loser_says_so() {
    let nats = Nats::start("conflict");
    let (a, _) = open(options(&nats)).await;
    let (b, _) = open(options(&nats)).await;
    a.append(rows(1..4));
    wait_committed(&a, 4).await;

    // B believes the log is empty and writes its own events at seqs 1..=5, in one window: its
    // row 4 expects last sequence 3, which A's row 3 satisfies, so only the expected last
    // message id (B's row 3) keeps it from landing after A's rows.
    let theirs: Vec<StoredRow> = (1..6)
        .map(|seq| {
            let mut r = row(seq);
            r.id = EventId(Ulid::from_parts(ts_of(seq), 424_242 + u128::from(seq))).to_string();
            r
        })
        .collect();
    b.append(theirs);
    within(async {
        while b.diverged().is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let why = b.diverged().unwrap();
    assert!(why.contains("another writer"), "{why}");
    assert_eq!(*b.committed().borrow(), 1, "the loser commits nothing");
    assert_eq!(
        read_all(&a, 1).await,
        rows(1..4),
        "the log holds A's rows only"
    );
    let closed = within(b.close()).await;
    assert!(
        matches!(closed, Err(StoreError::Io(ref e)) if e.contains("diverged")),
        "{closed:?}"
    );
    within(a.close()).await.unwrap();
}

#[tokio::test]
async fn a_republished_event_id_is_a_duplicate() {
    let nats = Nats::start("dedup");
    let (a, _) = open(options(&nats)).await;
    a.append(rows(1..6));
    wait_committed(&a, 6).await;

    // The server itself: the same Nats-Msg-Id again is acknowledged as a duplicate, same seq.
    let client = within(async_nats::connect(nats.url())).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let (headers, payload) = map_router::store::jetstream::encode(&row(3)).unwrap();
    let ack = within(async {
        js.publish_with_headers("map.ev.agent_registered", headers, payload)
            .await
            .unwrap()
            .await
    })
    .await
    .unwrap();
    assert!(ack.duplicate);
    assert_eq!(ack.sequence, 3);

    // Through a second node: an event id already in the log is not stored twice.
    let (b, recovered) = open(options(&nats)).await;
    assert_eq!(recovered.next_seq, 6);
    let mut again = row(2);
    again.seq = 6;
    b.append(vec![again]);
    within(async {
        while b.diverged().is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let why = b.diverged().unwrap();
    assert!(why.contains("already in the stream at seq 2"), "{why}");
    assert_eq!(read_all(&a, 1).await, rows(1..6));
    let _ = within(b.close()).await;
    within(a.close()).await.unwrap();
}

/// Reads of more than 64 rows go through an ephemeral consumer (`Reader::scan`) instead of one
/// direct get per row: the same rows as the short path, deleted rows skipped, early stops at
/// the limit, no consumer left behind, and a clear bounded error while NATS is down.
#[tokio::test]
async fn long_reads_give_the_same_rows_skip_deleted_ones_and_leave_no_consumer() {
    let mut nats = Nats::start("long-reads");
    let (store, _) = open(options(&nats)).await;
    store.append(rows(1..301));
    wait_committed(&store, 301).await;
    let client = within(async_nats::connect(nats.url())).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = within(js.get_stream("MAP_EVENTS")).await.unwrap();
    for seq in [100, 250] {
        assert!(within(stream.delete_message(seq)).await.unwrap());
    }
    let kept = |range: std::ops::Range<u64>| -> Vec<StoredRow> {
        rows(range)
            .into_iter()
            .filter(|r| r.seq != 100 && r.seq != 250)
            .collect()
    };

    assert_eq!(read_all(&store, 1).await, kept(1..301), "the whole log");
    assert_eq!(
        within(store.read(90, 100)).await.unwrap(),
        kept(90..190),
        "a range with a hole: the hole is skipped, as a direct read skips it"
    );
    assert_eq!(
        within(store.read(2, 64)).await.unwrap(),
        kept(2..66),
        "a short read (direct gets)"
    );
    // The long and the short path agree, window by window.
    let mut short = Vec::new();
    for from in (1..301).step_by(50) {
        short.extend(within(store.read(from, 50)).await.unwrap());
    }
    assert_eq!(short, read_all(&store, 1).await);

    let by_kind = |kind: &str, from: u64, limit: usize| -> Vec<StoredRow> {
        kept(from..301)
            .into_iter()
            .filter(|r| r.kind == kind)
            .take(limit)
            .collect()
    };
    for (kind, from, limit) in [
        ("message.sent", 1, 1000),
        ("message.sent", 1, 70),
        ("task_created", 120, 65),
        ("agent_registered", 299, 100),
    ] {
        assert_eq!(
            within(store.read_kinds(vec![kind.to_owned()], from, limit))
                .await
                .unwrap(),
            by_kind(kind, from, limit),
            "{kind} from {from} limit {limit}"
        );
    }
    let info = within(stream.get_info()).await.unwrap();
    assert_eq!(
        info.state.consumer_count, 0,
        "every read deleted its consumer"
    );

    nats.kill();
    let started = Instant::now();
    let e = within(store.read(1, 300)).await.unwrap_err();
    assert!(
        matches!(&e, StoreError::Io(m) if m.contains("NATS JetStream")),
        "{e}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let _ = within(store.close()).await;
}

#[tokio::test]
async fn retention_is_the_stream_limits() {
    let nats = Nats::start("retention");
    let mut o = options(&nats);
    o.max_events = Some(10);
    let (store, _) = open(o.clone()).await;
    store.append(rows(1..31));
    wait_committed(&store, 31).await;
    assert_eq!(read_all(&store, 1).await, rows(21..31));
    within(async {
        while store.first_seq() < 21 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(within(store.seq_at_or_after_time(0)).await.unwrap(), 21);
    within(store.close()).await.unwrap();
    let (again, recovered) = open(o.clone()).await;
    assert_eq!((recovered.first_seq, recovered.next_seq), (21, 31));
    within(again.close()).await.unwrap();

    // Limits follow the configuration of the node that opens the stream as its writer: lifted
    // here (and an age limit set), so what comes next is all kept.
    let client = within(async_nats::connect(nats.url())).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let config = || async {
        let mut stream = within(js.get_stream("MAP_EVENTS")).await.unwrap();
        within(stream.info()).await.unwrap().config.clone()
    };
    assert_eq!(config().await.max_messages, 10);
    let mut lifted = o.clone();
    lifted.max_events = None;
    lifted.max_age = Some(Duration::from_secs(3600));
    lifted.exclusive = true;
    lifted.node = "writer".into();
    let (writer, _) = open(lifted).await;
    let c = config().await;
    assert_eq!((c.max_messages, c.max_age), (-1, Duration::from_secs(3600)));
    writer.append(rows(31..51));
    wait_committed(&writer, 51).await;
    assert_eq!(
        read_all(&writer, 1).await,
        rows(21..51),
        "nothing more trimmed"
    );

    // A node refused as a second writer changes nothing.
    let mut second = o;
    second.max_events = Some(3);
    second.exclusive = true;
    second.node = "second".into();
    let refused = within(JetStreamStore::open(second)).await;
    assert!(
        matches!(&refused, Err(StoreError::Locked(m)) if m.contains("writer")),
        "{:?}",
        refused.as_ref().err()
    );
    assert_eq!(config().await.max_messages, -1);
    assert_eq!(read_all(&writer, 1).await, rows(21..51));
    within(writer.close()).await.unwrap();
}

#[tokio::test]
async fn an_existing_stream_with_other_subjects_is_refused() {
    let nats = Nats::start("subjects");
    let (store, _) = open(options(&nats)).await;
    let mut other = options(&nats);
    other.subject_prefix = "elsewhere.ev".into();
    let err = within(JetStreamStore::open(other)).await.unwrap_err();
    assert!(err.to_string().contains("exists with subjects"), "{err}");
    within(store.close()).await.unwrap();
}

/// A kept event's row at `seq`: `kind` with `data` (the JSON the router would log).
fn kept_row(seq: u64, kind: &str, data: serde_json::Value, owner: Option<&str>) -> StoredRow {
    let ts = ts_of(seq);
    let meta = match owner {
        Some(o) => serde_json::json!({"keys": {"owner": o}, "audience": {"kind": "everyone"}}),
        None => serde_json::json!({"keys": {}, "audience": {"kind": "everyone"}}),
    };
    StoredRow {
        seq,
        id: id_for(seq, ts).to_string(),
        timestamp: ts,
        kind: kind.into(),
        meta: meta.to_string(),
        json: serde_json::json!({"type": kind, "timestamp": ts, "data": data}).to_string(),
    }
}

/// A log with every kind of kept row, rows that are not kept between them, rewrites of the
/// same keys, a claim released and one kept, and a kept kind without its key.
fn kept_log(from: u64) -> Vec<StoredRow> {
    use serde_json::json;
    let mut out = Vec::new();
    let mut seq = from;
    let mut push = |kind: &str, data: serde_json::Value, owner: Option<&str>| {
        out.push(kept_row(seq, kind, data, owner));
        seq += 1;
    };
    for i in 0..6u64 {
        let task = |status: &str| {
            json!({"task": {"id": format!("t{i}"), "createdAt": 100 + (i % 3), "status": status,
                "assignee": if i % 2 == 0 { Some("a1") } else { None }}})
        };
        push("task.created", task("open"), Some("alice"));
        push("message.sent", json!({"n": i}), None);
        if i % 3 == 0 {
            push("task.updated", task("done"), Some("bob"));
        }
        push(
            "trajectory.checkpoint",
            json!({"checkpoint": {"id": format!("c{i}"), "agentId": format!("a{}", i % 2),
                "timestamp": 1000 + i * 7 % 5}}),
            Some("alice"),
        );
    }
    for c in 0..3u64 {
        let conv = |parts: &[&str], status: &str| {
            json!({"conversation": {"id": format!("m{c}"), "createdAt": 50 - c, "status": status},
                "participants": parts.iter().map(|p| json!({"id": p})).collect::<Vec<_>>()})
        };
        push("mail.created", conv(&["a1"], "open"), Some("carol"));
        push("mail.participant.joined", conv(&["a1", "a2"], "open"), None);
        push(
            "mail.thread.created",
            json!({"thread": {"id": format!("th{c}"), "conversationId": format!("m{c}")}}),
            None,
        );
        for t in 0..4u64 {
            push(
                "mail.turn.added",
                json!({"turn": {"id": format!("u{c}-{t}"), "conversationId": format!("m{c}"),
                    "threadId": if t % 2 == 0 { Some(format!("th{c}")) } else { None },
                    "participant": format!("a{}", 1 + t % 2), "timestamp": 2000 + t * 3}}),
                None,
            );
        }
        if c == 1 {
            push("mail.closed", conv(&["a1", "a2"], "closed"), None);
        }
    }
    push("task.created", json!({"no": "task"}), None);
    push("identity.claimed", json!({"claim": {"id": "alpha"}}), None);
    push("identity.claimed", json!({"claim": {"id": "beta"}}), None);
    push("identity.released", json!({"claim": {"id": "alpha"}}), None);
    push("identity.claimed", json!({"claim": {"id": "gamma"}}), None);
    out
}

/// Every kind of kept query, with pages that cut through the orders.
fn kept_queries() -> Vec<KeptQuery> {
    use map_router::store::kept::PageQuery;
    let mut q = vec![
        KeptQuery::Get {
            table: KeptTable::Tasks,
            keys: vec!["t0".into(), "t3".into(), "nope".into()],
        },
        KeptQuery::Get {
            table: KeptTable::Checkpoints,
            keys: vec!["c1".into()],
        },
        KeptQuery::Get {
            table: KeptTable::Turns,
            keys: vec!["u1-2".into()],
        },
        KeptQuery::Conversation { id: "m1".into() },
        KeptQuery::Conversation { id: "nope".into() },
        KeptQuery::TurnSeqAt {
            conversation: "m2".into(),
            ts: 2004,
        },
        KeptQuery::OwnerCounts {
            owner: "alice".into(),
        },
        KeptQuery::OwnerCounts {
            owner: "bob".into(),
        },
        KeptQuery::OwnerCounts {
            owner: "carol".into(),
        },
    ];
    for limit in [1, 2, 100] {
        q.push(KeptQuery::Page(PageQuery::Tasks {
            after: None,
            assignee: None,
            statuses: vec![],
            limit,
        }));
        q.push(KeptQuery::Page(PageQuery::Tasks {
            after: Some((100, "t0".into())),
            assignee: Some("a1".into()),
            statuses: vec!["open".into()],
            limit,
        }));
        q.push(KeptQuery::Page(PageQuery::Checkpoints {
            before: None,
            agent: Some("a0".into()),
            after_ts: None,
            before_ts: None,
            limit,
        }));
        q.push(KeptQuery::Page(PageQuery::Checkpoints {
            before: None,
            agent: None,
            after_ts: Some(1000),
            before_ts: Some(1004),
            limit,
        }));
        q.push(KeptQuery::Page(PageQuery::Conversations {
            after: None,
            members: Some(vec!["a2".into()]),
            limit,
        }));
        q.push(KeptQuery::Page(PageQuery::Conversations {
            after: Some((48, "m2".into())),
            members: None,
            limit,
        }));
        q.push(KeptQuery::Page(PageQuery::Turns {
            conversation: "m0".into(),
            after_seq: None,
            before_seq: None,
            desc: true,
            limit,
        }));
    }
    q
}

async fn kept_answers<S: EventStore + ?Sized>(store: &S) -> Vec<KeptAnswer> {
    let mut out = Vec::new();
    for q in kept_queries() {
        out.push(within(store.kept(q)).await.expect("a kept query"));
    }
    out
}

#[tokio::test]
async fn kept_tables_answer_as_sqlite_and_memory_do_and_survive_reopening() {
    let nats = Nats::start("kept");
    let log = kept_log(1);
    let n = log.len() as u64;

    // The reference answers: the same rows in an in-memory fold and in SQLite.
    let mut memory = MemoryKept::default();
    for r in &log {
        memory.ingest(r.clone());
    }
    let expected: Vec<KeptAnswer> = kept_queries().iter().map(|q| memory.query(q)).collect();
    let dir = TempDir::new("kept-sqlite");
    let (sqlite, sqlite_recovered) =
        SqliteStore::open(SqliteOptions::new(&dir.path)).expect("open SQLite");
    // SQLite numbers from 0; its kept answers do not depend on where the log starts, but the
    // rows carry their seq, so it gets the same seqs by an unkept first row at 0.
    assert_eq!(sqlite_recovered.next_seq, 0);
    let mut sqlite_log = vec![kept_row(0, "message.sent", serde_json::json!({}), None)];
    sqlite_log.extend(log.iter().cloned());
    sqlite.append(sqlite_log);
    let mut c = sqlite.committed();
    within(c.wait_for(|&c| c > n))
        .await
        .expect("SQLite commits");
    assert_eq!(
        kept_answers(&*sqlite).await,
        expected,
        "SQLite and memory agree"
    );
    let sqlite_claims: Vec<String> = {
        within(sqlite.close()).await.expect("close SQLite");
        let (sqlite, r) = SqliteStore::open(SqliteOptions::new(&dir.path)).expect("reopen SQLite");
        within(sqlite.close()).await.expect("close SQLite");
        r.claims.iter().map(|r| r.id.clone()).collect()
    };

    // Fed by the writer as the rows are acknowledged.
    let (store, recovered) = open(options(&nats)).await;
    assert_eq!(recovered.kept_counts, Default::default());
    assert!(recovered.claims.is_empty());
    store.append(log.clone());
    wait_committed(&store, n + 1).await;
    assert_eq!(kept_answers(&*store).await, expected, "fed by the writer");
    within(store.close()).await.unwrap();

    // Folded from the stream at open (and fed again after that).
    let (store, recovered) = open(options(&nats)).await;
    assert_eq!(recovered.next_seq, n + 1);
    assert_eq!(recovered.kept_counts, memory.counts());
    assert_eq!(
        (
            recovered.kept_counts.tasks,
            recovered.kept_counts.conversations,
            recovered.kept_counts.checkpoints
        ),
        (6, 3, 6)
    );
    let claims: Vec<String> = recovered.claims.iter().map(|r| r.id.clone()).collect();
    assert_eq!(claims, sqlite_claims, "the claims SQLite recovers");
    assert_eq!(claims.len(), 2, "beta and gamma; alpha was released");
    assert_eq!(kept_answers(&*store).await, expected, "folded at open");

    // A second node on the same stream folds the same tables.
    let (other, _) = open(options(&nats)).await;
    assert_eq!(kept_answers(&*other).await, expected, "a second node");
    within(other.close()).await.unwrap();

    // New rows after the fold: a task moves on; the answers follow, only once committed.
    let task = kept_row(
        n + 1,
        "task.updated",
        serde_json::json!({"task": {"id": "t1", "createdAt": 101, "status": "failed"}}),
        None,
    );
    memory.ingest(task.clone());
    store.append(vec![task]);
    wait_committed(&store, n + 2).await;
    let expected: Vec<KeptAnswer> = kept_queries().iter().map(|q| memory.query(q)).collect();
    assert_eq!(kept_answers(&*store).await, expected, "after the fold");
    within(store.close()).await.unwrap();
}

async fn wait_position(follower: &Follower, n: u64) {
    within(async {
        while follower.position() < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// A follower (a warm standby) keeps the kept tables, the claims, the position and the newest
/// rows current while another node writes, through a NATS restart. It cannot take over while
/// the writer lives; once the writer is gone it does, recovering exactly what a cold open of
/// the stream recovers, and writes on from there.
#[tokio::test]
async fn a_follower_keeps_up_and_takes_over_where_the_stream_ends() {
    let mut nats = Nats::start("follower");
    let log = kept_log(1);
    let n = log.len() as u64;
    assert!(n > 45, "the log has three parts");
    let mut o = options(&nats);
    o.exclusive = true;
    o.recent_rows = 8;
    let mut w = o.clone();
    w.node = "writer".into();
    let (writer, _) = open(w).await;
    writer.append(log[..20].to_vec());
    wait_committed(&writer, 21).await;
    let mut f = o.clone();
    f.node = "follower".into();
    let follower = within(Follower::open(f)).await.expect("follow");
    assert_eq!(follower.position(), 21, "folded what was there");
    writer.append(log[20..40].to_vec());
    wait_committed(&writer, 41).await;
    wait_position(&follower, 41).await;

    let refused = within(follower.promote()).await;
    assert!(
        matches!(&refused, Err(StoreError::Locked(m)) if m.contains("\"writer\"")),
        "{:?}",
        refused.as_ref().err()
    );
    nats.kill();
    nats.restart();
    writer.append(log[40..].to_vec());
    wait_committed(&writer, n + 1).await;
    wait_position(&follower, n + 1).await;
    assert_eq!(follower.position(), n + 1, "nothing applied twice");
    within(writer.close()).await.unwrap();
    drop(writer);
    // Someone changes a limit while the follower waits: the takeover compares the limits with
    // the stream as it is then (not as the follower first saw it) and brings them back to its
    // configuration (no limit).
    let js = async_nats::jetstream::new(within(async_nats::connect(nats.url())).await.unwrap());
    let config = || async {
        let mut stream = within(js.get_stream("MAP_EVENTS")).await.unwrap();
        within(stream.info()).await.unwrap().config.clone()
    };
    let mut changed = config().await;
    changed.max_messages = 100_000;
    within(js.update_stream(changed)).await.unwrap();

    let (store, warm) = within(async {
        loop {
            match follower.promote().await {
                Ok(opened) => break opened,
                Err(StoreError::Locked(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(e) => panic!("promote: {e}"),
            }
        }
    })
    .await;
    assert_eq!(
        config().await.max_messages,
        -1,
        "the follower's limits applied"
    );
    assert!(
        follower.promoted_warm(),
        "from what it followed, not read again"
    );
    let mut c = options(&nats);
    c.recent_rows = 8;
    let (cold_store, cold) = open(c).await;
    assert_eq!(
        (
            warm.next_seq,
            warm.first_seq,
            warm.last_id,
            warm.last_timestamp
        ),
        (
            cold.next_seq,
            cold.first_seq,
            cold.last_id,
            cold.last_timestamp
        )
    );
    assert_eq!(warm.next_seq, n + 1);
    assert_eq!(warm.recent, cold.recent);
    assert_eq!(warm.recent, log[log.len() - 8..].to_vec());
    assert_eq!(warm.kept_counts, cold.kept_counts);
    let ids = |r: &map_router::store::Recovered| -> Vec<String> {
        r.claims.iter().map(|c| c.id.clone()).collect()
    };
    assert_eq!(ids(&warm), ids(&cold));
    assert_eq!(ids(&warm).len(), 2, "beta and gamma; alpha was released");
    let mut memory = MemoryKept::default();
    for r in &log {
        memory.ingest(r.clone());
    }
    let expected: Vec<KeptAnswer> = kept_queries().iter().map(|q| memory.query(q)).collect();
    assert_eq!(kept_answers(&*store).await, expected, "the followed fold");
    assert_eq!(kept_answers(&*cold_store).await, expected, "the cold fold");
    within(cold_store.close()).await.unwrap();

    // The promoted store writes on at the stream's end; the follower is spent.
    let task = kept_row(
        n + 1,
        "task.updated",
        serde_json::json!({"task": {"id": "t1", "createdAt": 101, "status": "failed"}}),
        None,
    );
    store.append(vec![task.clone()]);
    wait_committed(&store, n + 2).await;
    assert_eq!(read_all(&store, n + 1).await, vec![task]);
    assert!(store.diverged().is_none());
    assert!(within(follower.promote()).await.is_err());
    within(store.close()).await.unwrap();
}

#[tokio::test]
async fn opening_without_a_server_fails_within_the_bound() {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let mut o = JetStreamOptions::new(format!("nats://127.0.0.1:{port}"));
    o.connect_timeout = Duration::from_secs(1);
    let started = Instant::now();
    let err = within(JetStreamStore::open(o)).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(err.to_string().contains("NATS"), "{err}");
}

#[tokio::test]
async fn sigkill_and_restart_lose_nothing_acknowledged() {
    let mut nats = Nats::start("kill");
    let (store, _) = open(options(&nats)).await;
    store.append(rows(1..101));
    wait_committed(&store, 101).await;

    // NATS down: reads fail with a clear error within the bound; appends wait.
    nats.kill();
    let started = Instant::now();
    let err = within(store.read(1, 10)).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(err.to_string().contains("NATS"), "{err}");
    assert!(within(store.seq_after(id_for(5, ts_of(5)))).await.is_err());
    store.append(rows(101..111));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        *store.committed().borrow(),
        101,
        "nothing commits while down"
    );
    assert!(!store.connected());

    // Back on the same store directory: the store reconnects by itself and commits the rest.
    nats.restart();
    wait_committed(&store, 111).await;
    assert_eq!(read_all(&store, 1).await, rows(1..111));

    // Killed with publishes in flight: everything acknowledged is there, and the retries
    // (de-duplicated) leave no duplicate and no hole.
    store.append(rows(111..3111));
    within(store.committed().wait_for(|&c| c > 300))
        .await
        .unwrap();
    nats.kill();
    let acknowledged = *store.committed().borrow();
    eprintln!("killed with {} of 3110 rows acknowledged", acknowledged - 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    nats.restart();
    let (fresh, recovered) = open(options(&nats)).await;
    assert!(
        recovered.next_seq >= acknowledged,
        "acknowledged up to {acknowledged}, recovered {}",
        recovered.next_seq
    );
    eprintln!("the restarted server holds {}", recovered.next_seq - 1);
    assert_eq!(read_all(&fresh, 1).await, rows(1..recovered.next_seq));
    wait_committed(&store, 3111).await;
    assert_eq!(read_all(&fresh, 1).await, rows(1..3111));
    assert!(store.diverged().is_none());
    within(store.close()).await.unwrap();
    within(fresh.close()).await.unwrap();
}

#[tokio::test]
async fn close_commits_what_is_queued_and_is_bounded_when_nats_is_down() {
    let mut nats = Nats::start("close");
    let (store, _) = open(options(&nats)).await;
    store.append(rows(1..501));
    within(store.close()).await.unwrap();
    let (again, recovered) = open(options(&nats)).await;
    assert_eq!(recovered.next_seq, 501);

    nats.kill();
    again.append(rows(501..511));
    let started = Instant::now();
    let closed = within(again.close()).await;
    assert!(
        matches!(closed, Err(StoreError::Io(ref e)) if e.contains("not acknowledged")),
        "{closed:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn dropping_the_store_still_commits() {
    let nats = Nats::start("drop");
    let (store, _) = open(options(&nats)).await;
    store.append(rows(1..201));
    drop(store);
    let (again, recovered) = open(options(&nats)).await;
    let mut next = recovered.next_seq;
    within(async {
        while next < 201 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            next = again
                .read(1, usize::MAX)
                .await
                .map_or(0, |r| r.len() as u64 + 1);
        }
    })
    .await;
    assert_eq!(read_all(&again, 1).await, rows(1..201));
    within(again.close()).await.unwrap();
}

#[tokio::test]
async fn every_read_fails_clearly_while_nats_is_down() {
    let mut nats = Nats::start("down");
    let (store, _) = open(options(&nats)).await;
    store.append(rows(1..11));
    wait_committed(&store, 11).await;
    nats.kill();
    let started = Instant::now();
    let errors = [
        within(store.read(1, 10)).await.map(|_| ()).unwrap_err(),
        within(store.read_kinds(vec!["message.sent".into()], 1, 10))
            .await
            .map(|_| ())
            .unwrap_err(),
        within(store.read_ids(vec![id_for(3, ts_of(3))]))
            .await
            .map(|_| ())
            .unwrap_err(),
        within(store.seq_at_or_after_time(0))
            .await
            .map(|_| ())
            .unwrap_err(),
    ];
    for e in &errors {
        assert!(
            matches!(e, StoreError::Io(m) if m.contains("NATS JetStream")),
            "{e}"
        );
    }
    // Four failed reads, each bounded by the request timeout (1.5 s here).
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    nats.restart();
    within(async {
        while store.read(1, 10).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(read_all(&store, 1).await, rows(1..11));
    within(store.close()).await.unwrap();
}

/// Append + ack latency, one row at a time, and a batch's throughput. Prints; asserts nothing
/// beyond completion. `cargo test --release --test store_jetstream --
/// --ignored --nocapture measure`
#[tokio::test]
#[ignore = "a measurement: run by hand"]
async fn measure_append_latency() {
    let nats = Nats::start("measure");
    let (store, _) = open(options(&nats)).await;
    let mut lat = Vec::new();
    for seq in 1..2001 {
        let t = Instant::now();
        store.append(vec![row(seq)]);
        wait_committed(&store, seq + 1).await;
        lat.push(t.elapsed());
    }
    lat.sort();
    let p = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    println!(
        "one row at a time (2000): p50 {:?} p90 {:?} p99 {:?} max {:?}",
        p(0.5),
        p(0.9),
        p(0.99),
        lat[lat.len() - 1]
    );
    let n = 20_000;
    let t = Instant::now();
    store.append(rows(2001..2001 + n));
    wait_committed(&store, 2001 + n).await;
    let took = t.elapsed();
    println!(
        "batch of {n}: {:?}, {:.0} rows/s",
        took,
        n as f64 / took.as_secs_f64()
    );
    let t = Instant::now();
    let got = within(store.read(1, 10_000)).await.unwrap();
    println!("read 10000 rows: {:?}", t.elapsed());
    assert_eq!(got.len(), 10_000);
    let t = Instant::now();
    for seq in (1..2001).step_by(100) {
        within(store.seq_after(id_for(seq, ts_of(seq))))
            .await
            .unwrap();
    }
    println!("seq_after over 22000 rows: {:?} each", t.elapsed() / 20);
    within(store.close()).await.unwrap();
}

#[tokio::test]
#[ignore = "a measurement: run by hand"]
async fn measure_kept_fold_at_open() {
    let nats = Nats::start("measure-fold");
    let (store, _) = open(options(&nats)).await;
    // 10,000 tasks, each created then updated, with an unkept row after every kept one.
    let n = 10_000u64;
    let mut log = Vec::new();
    let mut seq = 1;
    for i in 0..n {
        for status in ["open", "done"] {
            let data = serde_json::json!({"task": {"id": format!("t{i}"), "createdAt": i, "status": status}});
            log.push(kept_row(seq, "task.updated", data, Some("owner")));
            log.push(kept_row(
                seq + 1,
                "message.sent",
                serde_json::json!({"i": i}),
                None,
            ));
            seq += 2;
        }
    }
    store.append(log);
    wait_committed(&store, seq).await;
    within(store.close()).await.unwrap();
    let t = Instant::now();
    let (store, recovered) = open(options(&nats)).await;
    let took = t.elapsed();
    assert_eq!(recovered.kept_counts.tasks, n);
    println!(
        "open with {} rows ({} kept, {n} tasks): {took:?}",
        seq - 1,
        2 * n
    );
    let t = Instant::now();
    within(store.read(seq - 1024, 1024)).await.unwrap();
    println!(
        "of which reading the 1024 recent rows: about {:?}",
        t.elapsed()
    );
    within(store.close()).await.unwrap();

    // A warm standby: it follows the stream, then takes over from what it folded.
    let mut o = options(&nats);
    o.exclusive = true;
    let follower = within(Follower::open(o)).await.unwrap();
    wait_position(&follower, seq).await;
    let t = Instant::now();
    let (store, recovered) = within(follower.promote()).await.unwrap();
    let took = t.elapsed();
    assert!(follower.promoted_warm());
    assert_eq!(recovered.kept_counts.tasks, n);
    println!("a follower's takeover (claim + stream state + writer): {took:?}");
    within(store.close()).await.unwrap();
}

/// Claims at the same moment leave one writer: eight stores open with `exclusive` at once,
/// ten times over; each time exactly one opens and the others are refused, naming it. The
/// winner closes (its answer on `_MAP.writer.<stream>` goes with it), and the next round's
/// claims are from the lock's next sequence.
#[tokio::test]
async fn simultaneous_claims_leave_exactly_one_writer() {
    let nats = Nats::start("claims");
    for round in 0..10 {
        let claims = (0..8).map(|i| {
            let mut o = options(&nats);
            o.exclusive = true;
            o.node = format!("r{round}-n{i}");
            tokio::spawn(JetStreamStore::open(o))
        });
        let results = within(futures::future::join_all(claims)).await;
        let mut winners = Vec::new();
        let mut refusals = Vec::new();
        for r in results {
            match r.expect("join") {
                Ok((store, _)) => winners.push(store),
                Err(StoreError::Locked(why)) => refusals.push(why),
                Err(e) => panic!("round {round}: {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {refusals:?}");
        assert_eq!(refusals.len(), 7, "round {round}");
        for why in &refusals {
            assert!(why.contains("being written by live node"), "{why}");
        }
        // A late opener hears the winner.
        let mut late = options(&nats);
        late.exclusive = true;
        late.node = format!("r{round}-late");
        match within(JetStreamStore::open(late)).await {
            Err(StoreError::Locked(why)) => {
                assert!(why.contains(&format!("\"r{round}-n")), "{why}")
            }
            Ok(_) => panic!("round {round}: a second writer opened"),
            Err(e) => panic!("round {round}: {e}"),
        }
        within(winners[0].close()).await.expect("close");
    }
}
