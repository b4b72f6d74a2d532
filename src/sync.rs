//! The one poison-tolerant mutex lock every part of the crate uses: a `std::sync::Mutex` whose
//! holders do short inserts, removes and reads (tables, counters, handles), which a panic
//! cannot leave half done, so its data stays valid and is taken even after a holder panicked.
//!
//! Owns nothing. Any layer may import it; it imports nothing of ours (`tests/layering.rs`).

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking the data even if a holder panicked (see the module docs).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
