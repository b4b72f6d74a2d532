//! `Timers`: what happens later (a detached session's expiry, an orphan's grace period, a
//! credential's expiry), kept in time order and fired from the router task's loop.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::protocol::ids::{AgentId, SessionId};

/// Things that happen later.
#[derive(Debug, Clone)]
pub(crate) enum Deadline {
    /// A detached session can no longer be resumed.
    SessionExpiry(SessionId),
    /// An orphaned agent was not reclaimed in time.
    OrphanExpiry(AgentId),
    /// Messages the previous run left queued for an agent were not taken in time.
    QueueExpiry(AgentId),
    /// Time to send `map/auth/expiring` (for the session's credential of this epoch).
    CredentialExpiring(SessionId, u64),
    /// The session's credential (of this epoch) has expired.
    CredentialExpired(SessionId, u64),
    /// Time to write again the saved records the stream's limits would soon delete
    /// (`router::handover`).
    RefreshSaved,
    /// Time to end the traced requests' hops whose replies are overdue (`router::traces`).
    FlushSpans,
}

/// Deadlines by time. Several may fall on one instant.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    at: BTreeMap<Instant, Vec<Deadline>>,
}

impl Timers {
    /// Fires `d` at `at` (or the first loop turn after it).
    pub(crate) fn schedule(&mut self, at: Instant, d: Deadline) {
        self.at.entry(at).or_default().push(d);
    }

    /// Deadlines waiting (for stats).
    pub(crate) fn len(&self) -> usize {
        self.at.values().map(Vec::len).sum()
    }

    /// The earliest deadline, if any.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.at.keys().next().copied()
    }

    /// Removes and returns every deadline due at `now`, earliest first.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<Deadline> {
        let mut due = Vec::new();
        while let Some(entry) = self.at.first_entry() {
            if *entry.key() > now {
                break;
            }
            due.extend(entry.remove());
        }
        due
    }
}
