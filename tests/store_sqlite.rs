//! The SQLite event store through its public API: append and commit, reads and positions,
//! recovery, retention, group commit, and a real crash (the test binary re-runs itself as a
//! child writer and is killed with SIGKILL mid-write).
//!
//! Every test works in its own directory under the system temp dir, removed at the end, and
//! every await is bounded by a timeout.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use map_router::protocol::event::EventType;
use map_router::protocol::ids::{now_ms, EventId, Ulid};
use map_router::router::events::log::{
    Audience, EventDraft, EventLog, FilterKeys, Retention, StoredRow,
};
use map_router::store::sqlite::{SqliteOptions, SqliteStore, Synchronous, DB_FILE_NAME};
use map_router::store::{EventStore, StoreError};

/// The bound on every single await.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A fixed base timestamp (Unix ms), so rows can be rebuilt exactly from their seq.
const BASE_TS: u64 = 1_700_000_000_000;

/// Set in the crash test's child process: the durability level it writes with.
const CRASH_CHILD_ENV: &str = "STORE_CRASH_CHILD";
/// The child's store directory.
const CRASH_DIR_ENV: &str = "STORE_CRASH_DIR";

async fn within<F: Future>(fut: F) -> F::Output {
    match tokio::time::timeout(TIMEOUT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {TIMEOUT:?}"),
    }
}

/// A unique directory under the temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "map-router-store-{}-{name}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The id of the row at `seq` with timestamp `ts`: increasing with seq while ts does not
/// decrease.
fn id_for(seq: u64, ts: u64) -> EventId {
    EventId(Ulid::from_parts(ts, u128::from(seq)))
}

/// A row with about `pad` bytes of payload.
fn row_with(seq: u64, ts: u64, pad: usize) -> StoredRow {
    StoredRow {
        seq,
        id: id_for(seq, ts).to_string(),
        timestamp: ts,
        kind: "agent_registered".into(),
        meta: r#"{"audience":{"kind":"everyone"}}"#.into(),
        json: format!(r#"{{"seq":{seq},"pad":"{}"}}"#, "x".repeat(pad)),
    }
}

fn row(seq: u64) -> StoredRow {
    row_with(seq, BASE_TS + seq, 16)
}

fn rows(range: std::ops::Range<u64>) -> Vec<StoredRow> {
    range.map(row).collect()
}

fn open(options: SqliteOptions) -> (Arc<SqliteStore>, map_router::store::Recovered) {
    SqliteStore::open(options).expect("open the store")
}

async fn wait_committed(store: &SqliteStore, n: u64) {
    let mut committed = store.committed();
    within(committed.wait_for(|&c| c >= n))
        .await
        .expect("the writer is running");
}

async fn wait_first_seq(store: &SqliteStore, n: u64) {
    within(async {
        while store.first_seq() < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

async fn read_all(store: &SqliteStore, from: u64) -> Vec<StoredRow> {
    within(store.read(from, usize::MAX)).await.expect("read")
}

#[tokio::test]
async fn append_commits_and_publishes() {
    let dir = TempDir::new("commit");
    let (store, recovered) = open(SqliteOptions::new(dir.path()));
    assert_eq!(recovered.next_seq, 0);
    assert_eq!(recovered.first_seq, 0);
    assert!(recovered.last_id.is_none());
    assert!(recovered.recent.is_empty());
    assert!(store.path().ends_with(DB_FILE_NAME));

    let mut committed = store.committed();
    assert_eq!(*committed.borrow_and_update(), 0);
    store.append(rows(0..3));
    store.append(Vec::new());
    store.append(rows(3..10));
    wait_committed(&store, 10).await;
    assert_eq!(*store.committed().borrow(), 10);
    assert!(within(committed.changed()).await.is_ok());
    assert_eq!(store.first_seq(), 0);
    assert_eq!(read_all(&store, 0).await, rows(0..10));
    within(store.close()).await.expect("close");
    // A clean close checkpoints the WAL into the database file and removes it.
    let wal = dir.path().join(format!("{DB_FILE_NAME}-wal"));
    assert!(!wal.exists(), "{} is left after close", wal.display());
}

/// The router hands the store logged events, which the writer thread turns into rows: what
/// is read back is exactly the rows the records make, in order.
#[tokio::test]
async fn logged_events_are_stored_as_their_rows() {
    let dir = TempDir::new("records");
    let (store, _) = open(SqliteOptions::new(dir.path()));
    let mut log = EventLog::new(Retention {
        max_events: 100,
        max_bytes: 1 << 20,
    });
    let records: Vec<_> = (0..20)
        .map(|n| {
            log.append(
                EventDraft {
                    kind: EventType::ScopeCreated,
                    source: Some("agent-1".into()),
                    data: format!("{{\"n\":{n}}}"),
                    caused_by: vec![],
                    keys: FilterKeys::default(),
                    audience: Audience::Everyone,
                },
                None,
            )
        })
        .collect();
    let expected: Vec<StoredRow> = records.iter().filter_map(|r| r.to_row()).collect();
    assert_eq!(expected.len(), 20);
    store.append_records(records[..5].to_vec());
    store.append_records(Vec::new());
    store.append_records(records[5..].to_vec());
    wait_committed(&store, 20).await;
    assert_eq!(read_all(&store, 0).await, expected);
    within(store.close()).await.expect("close");
}

#[tokio::test]
async fn reads_return_ranges_in_order() {
    let dir = TempDir::new("read");
    let (store, _) = open(SqliteOptions::new(dir.path()));
    store.append(rows(0..100));
    wait_committed(&store, 100).await;

    assert_eq!(within(store.read(0, 10)).await.unwrap(), rows(0..10));
    assert_eq!(within(store.read(40, 5)).await.unwrap(), rows(40..45));
    assert_eq!(within(store.read(95, 10)).await.unwrap(), rows(95..100));
    assert!(within(store.read(100, 10)).await.unwrap().is_empty());
    assert!(within(store.read(u64::MAX, 10)).await.unwrap().is_empty());
    assert!(within(store.read(0, 0)).await.unwrap().is_empty());
    assert_eq!(read_all(&store, 0).await.len(), 100);

    // Many reads at once are all answered.
    let reads: Vec<_> = (0..50).map(|i| store.read(i * 2, 3)).collect();
    for (i, read) in reads.into_iter().enumerate() {
        let i = i as u64;
        assert_eq!(
            within(read).await.unwrap(),
            rows(i * 2..(i * 2 + 3).min(100))
        );
    }
    within(store.close()).await.unwrap();
}

#[tokio::test]
async fn positions_by_id_and_time() {
    let dir = TempDir::new("positions");
    let (store, _) = open(SqliteOptions::new(dir.path()));
    store.append(rows(0..100));
    wait_committed(&store, 100).await;

    let seq_after = |id: EventId| within(store.seq_after(id));
    // A stored id: the next one.
    assert_eq!(seq_after(id_for(0, BASE_TS)).await.unwrap(), 1);
    assert_eq!(seq_after(id_for(10, BASE_TS + 10)).await.unwrap(), 11);
    // Between two stored ids.
    let between = EventId(Ulid(id_for(10, BASE_TS + 10).0 .0 + 1));
    assert_eq!(seq_after(between).await.unwrap(), 11);
    // Before everything.
    assert_eq!(seq_after(EventId(Ulid(0))).await.unwrap(), 0);
    // The last id and beyond the end: the next seq.
    assert_eq!(seq_after(id_for(99, BASE_TS + 99)).await.unwrap(), 100);
    let future = EventId(Ulid::from_parts(BASE_TS + 1_000_000, 0));
    assert_eq!(seq_after(future).await.unwrap(), 100);

    let at_time = |ts: u64| within(store.seq_at_or_after_time(ts));
    assert_eq!(at_time(0).await.unwrap(), 0);
    assert_eq!(at_time(BASE_TS).await.unwrap(), 0);
    assert_eq!(at_time(BASE_TS + 10).await.unwrap(), 10);
    assert_eq!(at_time(BASE_TS + 99).await.unwrap(), 99);
    assert_eq!(at_time(BASE_TS + 100).await.unwrap(), 100);
    assert_eq!(at_time(u64::MAX).await.unwrap(), 100);

    // Equal timestamps: the first row with that timestamp.
    store.append(vec![
        row_with(100, BASE_TS + 500, 4),
        row_with(101, BASE_TS + 500, 4),
        row_with(102, BASE_TS + 500, 4),
    ]);
    wait_committed(&store, 103).await;
    assert_eq!(at_time(BASE_TS + 200).await.unwrap(), 100);
    assert_eq!(at_time(BASE_TS + 500).await.unwrap(), 100);
    assert_eq!(at_time(BASE_TS + 501).await.unwrap(), 103);
    within(store.close()).await.unwrap();
}

#[tokio::test]
async fn reopening_recovers_the_position_and_recent_rows() {
    let dir = TempDir::new("recover");
    let mut options = SqliteOptions::new(dir.path());
    options.recent_rows = 100;
    let (store, _) = open(options.clone());
    store.append(rows(0..300));
    wait_committed(&store, 300).await;
    within(store.close()).await.unwrap();
    drop(store);

    let (store, recovered) = open(options.clone());
    assert_eq!(recovered.next_seq, 300);
    assert_eq!(recovered.first_seq, 0);
    assert_eq!(recovered.last_id, Some(id_for(299, BASE_TS + 299)));
    assert_eq!(recovered.last_timestamp, BASE_TS + 299);
    assert_eq!(recovered.recent, rows(200..300));
    assert_eq!(*store.committed().borrow(), 300);

    // Appending continues where the file left off.
    store.append(rows(300..310));
    wait_committed(&store, 310).await;
    assert_eq!(read_all(&store, 295).await, rows(295..310));
    within(store.close()).await.unwrap();
    drop(store);

    // More recent rows asked for than stored: all of them.
    options.recent_rows = 1000;
    let (store, recovered) = open(options.clone());
    assert_eq!(recovered.recent, rows(0..310));
    within(store.close()).await.unwrap();
    drop(store);

    options.recent_rows = 0;
    let (store, recovered) = open(options);
    assert!(recovered.recent.is_empty());
    assert_eq!(recovered.next_seq, 310);
    within(store.close()).await.unwrap();
}

#[tokio::test]
async fn close_commits_everything_queued() {
    let dir = TempDir::new("close");
    let mut options = SqliteOptions::new(dir.path());
    // A long delay: only close can make the writer commit early.
    options.group_commit_delay = Duration::from_secs(3);
    let (store, _) = open(options.clone());
    for i in 0..20 {
        store.append(rows(i * 50..(i + 1) * 50));
    }
    let started = Instant::now();
    within(store.close()).await.expect("close");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(*store.committed().borrow(), 1000);

    // After close: reads fail, a second close is a no-op, appends are refused (logged).
    assert!(matches!(
        within(store.read(0, 1)).await,
        Err(StoreError::Closed)
    ));
    assert!(matches!(
        within(store.seq_after(id_for(0, BASE_TS))).await,
        Err(StoreError::Closed)
    ));
    within(store.close()).await.expect("second close");
    store.append(rows(1000..1001));
    drop(store);

    let (store, recovered) = open(options);
    assert_eq!(recovered.next_seq, 1000);
    assert_eq!(read_all(&store, 0).await, rows(0..1000));
    within(store.close()).await.unwrap();
}

#[tokio::test]
async fn dropping_the_store_still_commits() {
    let dir = TempDir::new("drop");
    let (store, _) = open(SqliteOptions::new(dir.path()));
    let mut committed = store.committed();
    store.append(rows(0..500));
    drop(store);
    within(committed.wait_for(|&c| c >= 500))
        .await
        .expect("committed before the writer ended");
}

#[tokio::test]
async fn a_second_opener_of_the_same_directory_is_refused() {
    let dir = TempDir::new("lock");
    let (first, _) = open(SqliteOptions::new(dir.path()));
    let err = SqliteStore::open(SqliteOptions::new(dir.path())).unwrap_err();
    assert!(matches!(err, StoreError::Locked(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("pid {}", std::process::id())),
        "names the owner: {text}"
    );
    within(first.close()).await.unwrap();
    let (again, _) = open(SqliteOptions::new(dir.path()));
    within(again.close()).await.unwrap();
}

#[tokio::test]
async fn a_reused_sequence_number_is_rejected_without_wedging() {
    let dir = TempDir::new("dup");
    let (store, _) = open(SqliteOptions::new(dir.path()));
    store.append(rows(0..10));
    let mut dup = row(5);
    dup.json = "{\"dup\":true}".into();
    store.append(vec![dup]);
    store.append(rows(10..20));
    wait_committed(&store, 20).await;
    assert_eq!(read_all(&store, 0).await, rows(0..20));
    within(store.close()).await.unwrap();
}

#[tokio::test]
async fn retention_by_count() {
    let dir = TempDir::new("count");
    let mut options = SqliteOptions::new(dir.path());
    options.max_events = 100;
    options.retention_interval = Duration::ZERO;
    let (store, _) = open(options.clone());
    for i in 0..5 {
        store.append(rows(i * 50..(i + 1) * 50));
    }
    wait_committed(&store, 250).await;
    wait_first_seq(&store, 150).await;
    assert_eq!(store.first_seq(), 150);
    // A read from before the start returns what is left.
    assert_eq!(read_all(&store, 0).await, rows(150..250));
    assert_eq!(within(store.read(10, 5)).await.unwrap(), rows(150..155));
    // Positions before the start are the start.
    assert_eq!(
        within(store.seq_after(id_for(3, BASE_TS + 3)))
            .await
            .unwrap(),
        150
    );
    assert_eq!(within(store.seq_at_or_after_time(0)).await.unwrap(), 150);
    within(store.close()).await.unwrap();
    drop(store);

    // A lower limit applies as soon as the file is reopened.
    options.max_events = 10;
    let (store, recovered) = open(options);
    assert_eq!(recovered.first_seq, 150);
    wait_first_seq(&store, 240).await;
    assert_eq!(read_all(&store, 0).await, rows(240..250));
    within(store.close()).await.unwrap();
}

#[tokio::test]
async fn retention_by_bytes() {
    let dir = TempDir::new("bytes");
    // Each row is exactly 1000 bytes of json + meta.
    let sized = |seq: u64| {
        let mut r = row(seq);
        r.meta = "{}".into();
        r.json = format!("{seq:0>998}");
        r
    };
    let mut options = SqliteOptions::new(dir.path());
    options.max_bytes = 10_000;
    options.retention_interval = Duration::ZERO;
    let (store, _) = open(options.clone());
    store.append((0..50).map(sized).collect());
    wait_committed(&store, 50).await;
    wait_first_seq(&store, 40).await;
    assert_eq!(store.first_seq(), 40);
    let left = read_all(&store, 0).await;
    assert_eq!(left, (40..50).map(sized).collect::<Vec<_>>());
    within(store.close()).await.unwrap();
    drop(store);

    // The byte total is recomputed at open: one more row evicts exactly one.
    let (store, recovered) = open(options);
    assert_eq!(recovered.first_seq, 40);
    store.append(vec![sized(50)]);
    wait_committed(&store, 51).await;
    wait_first_seq(&store, 41).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(store.first_seq(), 41);
    within(store.close()).await.unwrap();
}

#[tokio::test]
async fn retention_by_age() {
    let dir = TempDir::new("age");
    let mut options = SqliteOptions::new(dir.path());
    options.max_age = Some(Duration::from_secs(60));
    options.retention_interval = Duration::ZERO;
    let (store, _) = open(options.clone());
    let now = now_ms();
    let old = now - 3_600_000;
    let mut batch: Vec<StoredRow> = (0..20).map(|s| row_with(s, old + s, 8)).collect();
    batch.extend((20..30).map(|s| row_with(s, now + s, 8)));
    store.append(batch.clone());
    wait_committed(&store, 30).await;
    wait_first_seq(&store, 20).await;
    assert_eq!(store.first_seq(), 20);
    assert_eq!(read_all(&store, 0).await, batch[20..].to_vec());
    within(store.close()).await.unwrap();
    drop(store);

    // Rows also expire while nothing is appended; an emptied log keeps its position.
    options.max_age = Some(Duration::from_millis(300));
    let (store, recovered) = open(options.clone());
    assert_eq!(recovered.next_seq, 30);
    wait_first_seq(&store, 30).await;
    assert!(read_all(&store, 0).await.is_empty());
    assert_eq!(within(store.seq_at_or_after_time(0)).await.unwrap(), 30);
    within(store.close()).await.unwrap();
    drop(store);

    let (store, recovered) = open(options);
    assert_eq!(recovered.next_seq, 30);
    assert_eq!(recovered.first_seq, 30);
    assert_eq!(recovered.last_id, Some(id_for(29, now + 29)));
    assert_eq!(recovered.last_timestamp, now + 29);
    assert!(recovered.recent.is_empty());
    assert_eq!(
        within(store.seq_after(id_for(3, old + 3))).await.unwrap(),
        30
    );
    within(store.close()).await.unwrap();
}

#[tokio::test]
async fn group_commit_batches_rows() {
    let dir = TempDir::new("group");
    let (store, _) = open(SqliteOptions::new(dir.path()));
    // One row per append, as fast as possible.
    for seq in 0..10_000 {
        store.append(vec![row(seq)]);
    }
    wait_committed(&store, 10_000).await;
    let commits = store.commit_count();
    assert!(
        (3..=500).contains(&commits),
        "10 000 rows took {commits} commits"
    );
    assert_eq!(read_all(&store, 0).await.len(), 10_000);

    // A single large append is split by max_batch_rows.
    let dir = TempDir::new("group-max");
    let mut options = SqliteOptions::new(dir.path());
    options.max_batch_rows = 100;
    let (small, _) = open(options);
    small.append(rows(0..1000));
    wait_committed(&small, 1000).await;
    assert_eq!(small.commit_count(), 10);
    within(small.close()).await.unwrap();
    within(store.close()).await.unwrap();
}

#[tokio::test]
async fn a_failing_commit_is_retried_and_committed_waits() {
    let dir = TempDir::new("retry");
    let (store, _) = open(SqliteOptions::new(dir.path()));
    store.append(rows(0..10));
    wait_committed(&store, 10).await;

    // Another process's write lock, held past the store's busy timeout (5 s): the writer's
    // commit fails, is logged, and is retried until the lock goes.
    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE_NAME)).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    store.append(rows(10..20));
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    assert_eq!(
        *store.committed().borrow(),
        10,
        "committed moved while locked"
    );
    store.append(rows(20..30));
    conn.execute_batch("ROLLBACK").unwrap();
    drop(conn);

    wait_committed(&store, 30).await;
    assert_eq!(read_all(&store, 0).await, rows(0..30));
    within(store.close()).await.unwrap();
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let dir = TempDir::new("schema");
    let (store, _) = open(SqliteOptions::new(dir.path()));
    within(store.close()).await.unwrap();
    drop(store);

    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE_NAME)).unwrap();
    conn.execute(
        "UPDATE meta SET value = '99' WHERE key = 'schema_version'",
        [],
    )
    .unwrap();
    drop(conn);
    let err = SqliteStore::open(SqliteOptions::new(dir.path())).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("99") && text.contains("newer"), "{text}");

    // Not a database at all.
    let dir = TempDir::new("garbage");
    std::fs::create_dir_all(dir.path()).unwrap();
    std::fs::write(dir.path().join(DB_FILE_NAME), vec![0x5a; 8192]).unwrap();
    assert!(SqliteStore::open(SqliteOptions::new(dir.path())).is_err());
}

// ---------------------------------------------------------------------------------------------
// Crash: kill -9 a writing process, reopen, and find every row it saw committed.

/// A row of about 400 bytes, rebuildable from its seq.
fn crash_row(seq: u64) -> StoredRow {
    row_with(seq, BASE_TS + seq / 100, 340)
}

/// The child: writes forever (bounded by a watchdog), printing each committed value.
fn crash_child(dir: PathBuf, synchronous: Synchronous) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut options = SqliteOptions::new(dir);
        options.synchronous = synchronous;
        let (store, recovered) = SqliteStore::open(options).unwrap();
        let mut committed = store.committed();
        let mut next = recovered.next_seq;
        let watchdog = Instant::now() + Duration::from_secs(60);
        while Instant::now() < watchdog {
            store.append((next..next + 50).map(crash_row).collect());
            next += 50;
            // Keep a few hundred rows in flight, so that the kill lands mid-commit.
            while next - *committed.borrow() > 500 {
                tokio::time::timeout(TIMEOUT, committed.changed())
                    .await
                    .expect("commit progress")
                    .expect("writer alive");
                println!("COMMITTED {}", *committed.borrow_and_update());
            }
        }
    });
    std::process::exit(0);
}

/// Kills a writing child [`CRASH_CYCLES`] times in the same directory (each child continues
/// the file the previous one left), checking the file after each kill.
fn crash_and_check(test_name: &str, mode: &str) {
    let dir = TempDir::new(&format!("crash-{mode}"));
    std::fs::create_dir_all(dir.path()).unwrap();
    let mut floor = 0;
    for _ in 0..CRASH_CYCLES {
        floor = crash_once(dir.path(), test_name, mode, floor);
    }
}

/// How many times the crash tests kill a writer.
const CRASH_CYCLES: usize = 4;

/// Runs the child, kills it once it has reported progress, and checks the reopened file:
/// it must hold every row from 0 to at least the last reported commit (and `floor`, what the
/// previous cycle found). Returns the recovered next seq.
fn crash_once(dir: &Path, test_name: &str, mode: &str, floor: u64) -> u64 {
    let stderr_path = std::env::temp_dir().join(format!(
        "map-router-store-crash-{}-{mode}.stderr",
        std::process::id()
    ));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(CRASH_CHILD_ENV, mode)
        .env(CRASH_DIR_ENV, dir)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("spawn the child");

    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(n) = line.strip_prefix("COMMITTED ") {
                if tx.send(n.trim().parse().unwrap()).is_err() {
                    break;
                }
            }
        }
    });

    // Wait for a good amount of committed progress (bounded), then kill mid-write.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut reported = Vec::new();
    while reported.len() < 30 || reported.last().copied().unwrap_or(0) < floor + 10_000 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(n) => reported.push(n),
            Err(_) => break,
        }
    }
    // Let it write a little longer, a different time each cycle, so that the kill lands at an
    // arbitrary point of a commit rather than just after one.
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        % 20_000_000;
    let linger = Instant::now() + Duration::from_nanos(u64::from(jitter));
    while let Ok(n) = rx.recv_timeout(linger.saturating_duration_since(Instant::now())) {
        reported.push(n);
    }
    child.kill().expect("SIGKILL the child");
    let status = child.wait().unwrap();
    reader.join().unwrap();
    // Lines printed before the kill report commits too.
    reported.extend(rx.try_iter());
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let _ = std::fs::remove_file(&stderr_path);
    assert!(
        reported.len() >= 30,
        "the child reported only {reported:?}; status {status:?}; stderr:\n{stderr}"
    );
    assert!(
        reported.windows(2).all(|w| w[0] <= w[1]),
        "committed went backwards"
    );
    let last_reported = *reported.last().unwrap();
    assert!(
        reported[0] >= floor,
        "the child started below the previous end"
    );

    // The file is intact.
    let conn = rusqlite::Connection::open(dir.join(DB_FILE_NAME)).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    drop(conn);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut options = SqliteOptions::new(dir);
        options.recent_rows = 10;
        let (store, recovered) = SqliteStore::open(options).expect("reopen after the crash");
        assert!(
            recovered.next_seq >= last_reported,
            "reported {last_reported} committed, recovered only {}",
            recovered.next_seq
        );
        assert_eq!(recovered.first_seq, 0);
        let last = recovered.next_seq - 1;
        assert_eq!(recovered.last_id, Some(id_for(last, BASE_TS + last / 100)));
        // Every row from 0 up, contiguous and intact.
        let all = read_all(&store, 0).await;
        assert_eq!(all.len() as u64, recovered.next_seq);
        for (i, r) in all.iter().enumerate() {
            assert_eq!(*r, crash_row(i as u64), "row {i}");
        }
        // And the store keeps going.
        let next = recovered.next_seq;
        store.append((next..next + 10).map(crash_row).collect());
        wait_committed(&store, next + 10).await;
        within(store.close()).await.unwrap();
        next + 10
    })
}

#[test]
fn crash_kill_9_keeps_every_committed_row_full() {
    if let Ok(mode) = std::env::var(CRASH_CHILD_ENV) {
        let dir = std::env::var(CRASH_DIR_ENV).expect("child dir");
        assert_eq!(mode, "full");
        crash_child(dir.into(), Synchronous::Full);
    }
    crash_and_check("crash_kill_9_keeps_every_committed_row_full", "full");
}

#[test]
fn crash_kill_9_keeps_every_committed_row_normal() {
    if let Ok(mode) = std::env::var(CRASH_CHILD_ENV) {
        let dir = std::env::var(CRASH_DIR_ENV).expect("child dir");
        assert_eq!(mode, "normal");
        crash_child(dir.into(), Synchronous::Normal);
    }
    crash_and_check("crash_kill_9_keeps_every_committed_row_normal", "normal");
}
