//! Closing out the previous run after a restart.
//!
//! Owns the events that end the participants and agents the previous process left open (the
//! fold that finds them, "who was still there when it stopped", is `sessions::lifecycle`),
//! and on a cluster standby the keeping of that fold. Sessions and the registry live in
//! memory only, so after a restart (clean or after a crash) every participant and agent of
//! the previous run is gone; without these events a dashboard that
//! rebuilds its view from the log (or resumes from an event id) would show them forever. At
//! start-up, before it handles any command, the router emits:
//!
//! - `participant_disconnected {reason: "router_restarted"}` for every participant whose last
//!   lifecycle event is `participant_connected`;
//! - `agent_unregistered {reason: "router_restarted"}` for every agent whose last lifecycle
//!   event is `agent_registered`, with the registration's audience and filter keys (so a hidden
//!   agent's end is as hidden as its start), caused by its owner's disconnect when that is
//!   among them.
//!
//! Only what retention kept can be folded: an agent whose registration was deleted is not
//! known and gets no event.
//!
//! In cluster mode the fold also keeps what the log says last about each scope (created or
//! deleted), each client's permissions and each agent's state, metadata, environment,
//! permission overrides and memberships (`Tails`), so that a takeover restores the log's
//! last word where the previous live node died between an event and its saved record
//! (`router::handover`); a scope the log created without a record to restore it from is
//! deleted (`scope_deleted`), as an agent without one is unregistered.
//!
//! A cluster standby's router keeps the same fold as it follows the stream
//! (`LifecycleFold`: read once at its start, then each followed row), and hands it to the
//! router that takes the stream over in the same process, which reads only the rows after
//! it instead of every lifecycle event the stream holds; a debug build also reads them all
//! and asserts that both folds are the same.

use std::collections::HashMap;
use std::sync::Arc;

use crate::protocol::event::{
    AgentUnregisteredData, EventType, ParticipantDisconnectedData, ScopeDeletedData,
};
use crate::protocol::ids::{EventId, ParticipantId};
use crate::store::{EventStore, StoreError};

use crate::router::core::Router;
use crate::router::events::log::EventDraft;
use crate::router::events::log::EventRecord;
use crate::router::sessions::lifecycle::{previous_run, read_into, LifecycleFold, PreviousRun};

/// The `reason` of the closing events.
pub const RESTART_REASON: &str = "router_restarted";

/// The values of `open`, by the seq of the event that opened each.
fn oldest_first<T>(open: HashMap<String, T>, seq: impl Fn(&T) -> u64) -> Vec<T> {
    let mut v: Vec<T> = open.into_values().collect();
    v.sort_by_key(|t| seq(t));
    v
}

impl Router {
    /// A cluster standby's router (a follower with a node name) folds the lifecycle events up
    /// to where it follows from, once, before any command ([`LifecycleFold`]).
    pub(crate) async fn start_lifecycle_fold(&mut self) {
        let (Some(store), true) = (self.store.clone(), self.config.node.is_some()) else {
            return;
        };
        let until = self.bus.log.next_seq();
        match read_into(&*store, true, LifecycleFold::default(), Some(until)).await {
            Ok(mut fold) => {
                fold.prune(store.first_seq());
                self.standby_fold = Some(fold);
            }
            Err(e) => tracing::warn!(
                error = %e,
                "standby: could not fold the lifecycle events; a takeover reads them again"
            ),
        }
    }

    /// The standby's fold, for the router that takes the stream over.
    pub fn take_lifecycle_fold(&mut self) -> Option<LifecycleFold> {
        self.standby_fold.take()
    }

    /// Folds followed records into the standby's fold, forgetting what retention deleted now
    /// and then (every 4 096 rows).
    pub(crate) fn fold_followed(&mut self, rec: &EventRecord) {
        let Some(fold) = self.standby_fold.as_mut() else {
            return;
        };
        fold.follow(rec);
        if rec.seq.is_multiple_of(4096) {
            if let Some(store) = &self.store {
                fold.prune(store.first_seq());
            }
        }
    }

    /// The previous run's fold for a takeover: the standby's, carried over and brought up to
    /// the stream's end, else a fresh read.
    async fn fold_previous_run(
        &mut self,
        store: &dyn EventStore,
        tails: bool,
    ) -> Result<PreviousRun, StoreError> {
        let Some(mut fold) = self
            .carried_fold
            .take()
            .filter(|f| tails && f.upto <= self.bus.log.next_seq())
        else {
            return previous_run(store, tails).await;
        };
        fold.prune(store.first_seq());
        let from = fold.upto;
        let fold = read_into(store, tails, fold, None).await?;
        tracing::info!(
            from,
            "the standby's fold of the lifecycle events carried over"
        );
        #[cfg(debug_assertions)]
        {
            // What a fresh read folds, to the row: any difference is a bug of the carried fold.
            let fresh = read_into(store, tails, LifecycleFold::default(), None).await?;
            assert!(
                fresh.folding == fold.folding,
                "the carried lifecycle fold differs from a fresh read: carried {:?}, fresh {:?}",
                fold.folding,
                fresh.folding
            );
        }
        Ok(fold.folding.finish())
    }
}

impl Router {
    /// With a durable store: reads the previous run's lifecycle events and ends what it left
    /// open (the router's first act, before any command).
    pub(crate) async fn recover_previous_run(&mut self) {
        let Some(store) = self.store.clone() else {
            return;
        };
        if self.config.follower {
            // The writer is alive and owns what is open; the node that takes over closes it
            // (with this node's fold, when this node is a standby).
            self.start_lifecycle_fold().await;
            return;
        }
        let saved = std::mem::take(&mut self.saved_at_open);
        // Cluster mode (a node that saves): the changes that settle the saved records too.
        let tails = self.handover.is_some();
        let started = std::time::Instant::now();
        let first = self.bus.log.next_seq();
        match self.fold_previous_run(&*store, tails).await {
            Ok(mut run) => {
                let read = started.elapsed();
                // Cluster mode: what the previous live node saved comes back (router::handover).
                let connected = self.restore_saved(saved, &mut run);
                let restored = started.elapsed();
                self.close_previous_run(run);
                self.detach_restored(connected);
                let closed = started.elapsed();
                // The records of what the takeover changed (`router::handover`).
                self.save_changed();
                tracing::info!(
                    read_ms = read.as_millis() as u64,
                    restored_ms = restored.as_millis() as u64,
                    closed_ms = closed.as_millis() as u64,
                    saved_ms = started.elapsed().as_millis() as u64,
                    "recovered the previous run"
                );
            }
            Err(e) => {
                tracing::error!(error = %e, "could not read the previous run's lifecycle events")
            }
        }
        self.recover_queues().await;
        self.flush_store();
        self.log_when_committed(started, first);
    }

    /// Logs how long after `started` the store committed what the recovery appended from
    /// `first` on (a takeover's first answers wait for it), if it appended anything.
    fn log_when_committed(&self, started: std::time::Instant, first: u64) {
        let Some(mut progress) = self.store_progress.clone() else {
            return;
        };
        let until = self.bus.log.next_seq();
        if *progress.borrow() >= until {
            return;
        }
        tokio::spawn(async move {
            let limit = std::time::Duration::from_secs(60);
            if let Ok(Ok(_)) = tokio::time::timeout(limit, progress.wait_for(|c| *c >= until)).await
            {
                tracing::info!(
                    rows = until.saturating_sub(first),
                    committed_ms = started.elapsed().as_millis() as u64,
                    "the recovery's events are committed"
                );
            }
        });
    }

    /// Emits the events that end what the previous run left open.
    pub(crate) fn close_previous_run(&mut self, run: PreviousRun) {
        // Scopes the log created that no record restored: deleted, so the log's last word is
        // what the new live node holds (deepest first, each once).
        let nothing_connected = run.is_empty();
        let PreviousRun {
            participants,
            agents,
            open_scopes,
            ..
        } = run;
        for s in oldest_first(open_scopes, |s| s.seq).iter().rev() {
            if self.scopes.contains(&s.id) {
                continue;
            }
            tracing::info!(scope = %s.id, "deleting a scope the previous live node created without saving it");
            self.emit(EventDraft {
                kind: EventType::ScopeDeleted,
                source: None,
                data: crate::router::core::to_json(&ScopeDeletedData {
                    scope_id: s.id.clone(),
                    deleted_descendants: None,
                }),
                caused_by: Vec::new(),
                keys: s.keys.clone(),
                audience: s.audience.clone(),
            });
        }
        if nothing_connected {
            return;
        }
        tracing::info!(
            participants = participants.len(),
            agents = agents.len(),
            "closing out what the previous run left connected"
        );
        let mut disconnected: HashMap<ParticipantId, EventId> = HashMap::new();
        for p in oldest_first(participants, |p| p.seq) {
            let id = self.emit_participant_event(
                EventType::ParticipantDisconnected,
                &p.id,
                &[],
                &ParticipantDisconnectedData {
                    participant_id: p.id.clone(),
                    participant_type: p.kind,
                    reason: RESTART_REASON.into(),
                },
                Vec::new(),
            );
            disconnected.insert(p.id, id);
        }
        for a in oldest_first(agents, |a| a.seq) {
            let caused_by = a
                .owner
                .as_ref()
                .and_then(|o| disconnected.get(o))
                .copied()
                .into_iter()
                .collect();
            let data = AgentUnregisteredData {
                agent_id: a.id.clone(),
                reason: Some(RESTART_REASON.into()),
            };
            self.emit(EventDraft {
                kind: EventType::AgentUnregistered,
                source: Some(Arc::from(a.id.as_str())),
                data: serde_json::to_string(&data).unwrap_or_else(|_| "{}".into()),
                caused_by,
                keys: a.keys,
                audience: a.audience,
            });
        }
    }
}
