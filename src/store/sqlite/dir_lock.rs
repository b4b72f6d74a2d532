//! The directory lock: while a store is open it holds an exclusive lock on `<dir>/LOCK`
//! (released by the OS if the process dies), with its pid written inside, so that a second
//! router pointed at the same directory is refused with the first one's pid instead of
//! interleaving writes.
//!
//! Owns the lock file only; the writer thread keeps the returned handle open and drops it once
//! the database file is closed.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::store::StoreError;

/// The lock file inside [`SqliteOptions::dir`](super::SqliteOptions::dir): locked exclusively
/// while a store is open, and holding the owner's pid (for the error a second opener gets).
pub const LOCK_FILE_NAME: &str = "LOCK";

/// How long `open` waits for another store to release the directory: long enough for a store
/// closed or dropped a moment ago in this process to finish its threads, short enough that a
/// second router fails fast.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Takes the directory's exclusive lock (waiting up to [`LOCK_WAIT`]) and writes our pid into
/// the lock file. The lock lasts as long as the returned file is open.
pub(super) fn lock_dir(dir: &Path) -> Result<std::fs::File, StoreError> {
    use std::io::{Read as _, Seek as _, Write as _};
    let path = dir.join(LOCK_FILE_NAME);
    let io =
        |what: &str, e: std::io::Error| StoreError::Io(format!("{what} {}: {e}", path.display()));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| io("opening", e))?;
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut owner = String::new();
                let _ = file.read_to_string(&mut owner);
                let owner = owner.trim();
                let owner = if owner.is_empty() { "unknown" } else { owner };
                return Err(StoreError::Locked(format!(
                    "{} is in use by another map-router process (pid {owner})",
                    dir.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io("locking", e)),
        }
    }
    file.set_len(0).map_err(|e| io("writing", e))?;
    file.rewind().map_err(|e| io("writing", e))?;
    writeln!(file, "{}", std::process::id()).map_err(|e| io("writing", e))?;
    Ok(file)
}
