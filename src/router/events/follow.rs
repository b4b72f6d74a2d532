//! A follower's log: a router on a standby node serves subscriptions and replay from the event
//! log another node writes (`[cluster] standby`, docs/cluster.md).
//!
//! Owns nothing: [`Router::ingest_followed`] appends the rows the store's follower hands over
//! (stream order, ids, timestamps and sequence numbers as the writer gave them) to the bus's
//! log and offers each to the live subscriptions, with the same filter and visibility checks
//! as any event; the identity claims among them go to the identities table, so that an id is
//! a principal's on a follower exactly when it is on the writer, and a participant's new
//! permissions (`permissions_client_updated`) go to its session here, so that what this node
//! serves it (subscriptions, replay) follows them; the live node's saved records of agents and
//! scopes (`state.saved`) go to this router's registry and scopes (`router::handover`), from
//! which it answers `map/agents/*` and `map/scopes/*` reads; and on a cluster standby each row
//! goes to its fold of the lifecycle events (`sessions::lifecycle::LifecycleFold`), which the
//! router that takes the stream over starts from. Every row arrives committed,
//! so a follower delivers at once. What a follower
//! refuses (everything that would write the log) is decided by the method table
//! (`router::dispatch::served_by_follower`).

use std::sync::Arc;

use crate::protocol::event::EventType;
use crate::router::core::Router;
use crate::router::events::log::{EventRecord, StoredRow};

impl Router {
    /// Appends rows the writer committed to the log, in order, and offers them to the live
    /// subscriptions. Rows the log has already are skipped; a row this version cannot read is
    /// skipped and logged (the log's window starts again after it: replay reads around it from
    /// the store, as on the writer).
    pub fn ingest_followed(&mut self, rows: Vec<StoredRow>) {
        for row in rows {
            let seq = row.seq;
            if row.seq >= self.bus.log.next_seq() {
                // Who owns which id, as the writer decided (`router::identities`).
                self.identities.apply_stored(&row);
            }
            let record = match EventRecord::from_row(row) {
                Ok(r) => Arc::new(r),
                Err(e) => {
                    tracing::warn!(seq, error = %e, "follower: skipping an event this version cannot read");
                    continue;
                }
            };
            if seq > self.bus.log.next_seq() {
                // The stream's retention took rows before they were followed: the window
                // starts again here, and live subscriptions still waiting for the lost rows
                // move on as on one node when retention passes them (the store, else the
                // overflow notice), to this row, which they are then offered.
                self.bus.log.restart_at(seq);
                let (bus, agents) = self.bus_and_agents();
                bus.catch_up_behind(seq, agents);
            }
            if self.bus.log.push_followed(Arc::clone(&record)) {
                // Who is open, for a takeover by this node (`sessions::recovery`).
                self.fold_followed(&record);
                if matches!(record.kind, EventType::StateSaved | EventType::StateDropped) {
                    // The live node's agents and scopes, for the reads served here
                    // (`router::handover`).
                    self.follow_saved(record.kind, &record.json);
                }
                let (bus, agents) = self.bus_and_agents();
                bus.publish(&record, agents);
                // A participant's new permissions reach its session here too, as on the
                // writer (`router::sessions`).
                self.followed_permissions(&record);
            }
        }
    }
}
