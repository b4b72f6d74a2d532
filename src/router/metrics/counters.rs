//! The running counts the router keeps for its metrics: plain integers owned by the router
//! task, bumped where things happen.

use crate::router::sessions::table::Transport;

/// Exit reasons of supervised processes, in label order.
pub const EXIT_REASONS: [&str; 4] = ["stopped", "exited", "crashed", "spawn_failed"];

/// Running counts the router keeps for the metrics.
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections attached, by transport (indexed like [`Transport::ALL`]).
    pub connections_opened: [u64; Transport::ALL.len()],
    /// Supervised process exits, by reason (indexed like [`EXIT_REASONS`]).
    pub exits: [u64; EXIT_REASONS.len()],
    /// Supervised process restarts.
    pub restarts: u64,
    /// `map/message` frames queued for connections.
    pub messages_queued: u64,
    /// Events appended to the log.
    pub events_appended: u64,
}

impl Counters {
    /// A connection attached.
    pub fn connection_opened(&mut self, transport: Transport) {
        self.connections_opened[transport as usize] += 1;
    }

    /// A supervised process ended (`reason` one of [`EXIT_REASONS`]); `restart` when the
    /// supervisor will start it again.
    pub fn process_exited(&mut self, reason: &str, restart: bool) {
        if let Some(i) = EXIT_REASONS.iter().position(|r| *r == reason) {
            self.exits[i] += 1;
        }
        self.restarts += u64::from(restart);
    }

    /// A `map/message` was queued for a connection.
    pub fn message_queued(&mut self) {
        self.messages_queued += 1;
    }

    /// An event was appended to the log.
    pub fn event_appended(&mut self) {
        self.events_appended += 1;
    }
}
