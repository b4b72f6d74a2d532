//! Closing out the previous run after a restart.
//!
//! Owns the fold of the durable log's lifecycle events into "who was still there when the
//! previous process stopped", and the events that end those participants and agents. Sessions
//! and the registry live in memory only, so after a restart (clean or after a crash) every
//! participant and agent of the previous run is gone; without these events a dashboard that
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
//! ([`LifecycleFold`]: read once at its start, then each followed row), and hands it to the
//! router that takes the stream over in the same process, which reads only the rows after
//! it instead of every lifecycle event the stream holds; a debug build also reads them all
//! and asserts that both folds are the same.

use std::collections::HashMap;
use std::sync::Arc;

use crate::protocol::agent::{Agent, AgentState};
use crate::protocol::capabilities::{ParticipantCapabilities, ParticipantType};
use crate::protocol::event::{
    AgentUnregisteredData, EventType, ParticipantDisconnectedData, ScopeDeletedData,
};
use crate::protocol::ids::{AgentId, EventId, ParticipantId, ScopeId};
use crate::protocol::json::RawJson;
use crate::store::{EventStore, StoreError};

use crate::router::core::Router;
use crate::router::events::log::Audience;
use crate::router::events::log::EventDraft;
use crate::router::events::log::EventRecord;
use crate::router::events::log::FilterKeys;

/// The `reason` of the closing events.
pub const RESTART_REASON: &str = "router_restarted";

/// Rows read per store request while folding.
const PAGE: usize = 10_000;

/// A participant still connected at the end of the previous run.
#[derive(Debug, Clone, PartialEq)]
struct OpenParticipant {
    seq: u64,
    id: ParticipantId,
    kind: ParticipantType,
}

/// An agent still registered at the end of the previous run.
#[derive(Debug, Clone, PartialEq)]
struct OpenAgent {
    seq: u64,
    id: AgentId,
    owner: Option<ParticipantId>,
    audience: Audience,
    keys: FilterKeys,
}

/// A scope the log created and never deleted.
#[derive(Debug, Clone, PartialEq)]
struct OpenScope {
    seq: u64,
    id: ScopeId,
    audience: Audience,
    keys: FilterKeys,
}

/// One change of an agent the log records after its registration.
#[derive(Debug, Clone, PartialEq)]
enum AgentChange {
    State(AgentState),
    Metadata(RawJson),
    Environment(serde_json::Map<String, serde_json::Value>),
    Overrides(serde_json::Map<String, serde_json::Value>),
    Joined(ScopeId),
    Left(ScopeId),
}

impl AgentChange {
    /// Whether this change, logged after `earlier`, makes it irrelevant.
    fn supersedes(&self, earlier: &AgentChange) -> bool {
        use AgentChange::*;
        match (self, earlier) {
            (State(_), State(_))
            | (Metadata(_), Metadata(_))
            | (Environment(_), Environment(_)) => true,
            (Joined(a) | Left(a), Joined(b) | Left(b)) => a == b,
            _ => false,
        }
    }
}

/// The values of `open`, by the seq of the event that opened each.
fn oldest_first<T>(open: HashMap<String, T>, seq: impl Fn(&T) -> u64) -> Vec<T> {
    let mut v: Vec<T> = open.into_values().collect();
    v.sort_by_key(|t| seq(t));
    v
}

/// What the log says after the lifecycle events (cluster mode only): the last word about
/// each scope, client permission and agent change, by seq.
#[derive(Debug, Default, PartialEq)]
struct Tails {
    /// Scope id → (seq of its last `scope_created` / `scope_deleted`, deleted).
    scope_last: HashMap<String, (u64, bool)>,
    /// Scopes created and not deleted since.
    open_scopes: HashMap<String, OpenScope>,
    /// Participant id → (seq, effective capabilities) of its last `permissions_client_updated`.
    permissions: HashMap<String, (u64, ParticipantCapabilities)>,
    /// Agent id → its changes since its last registration, oldest first (each field's and
    /// scope's last only).
    agents: HashMap<String, Vec<(u64, AgentChange)>>,
}

/// What the previous run left open, by id (a takeover takes thousands out one by one;
/// `oldest_first` orders what is left when it is closed).
#[derive(Debug, Default)]
pub struct PreviousRun {
    participants: HashMap<String, OpenParticipant>,
    agents: HashMap<String, OpenAgent>,
    /// The seq of the last lifecycle event of every participant and agent id the log holds.
    last_participant: HashMap<String, u64>,
    last_agent: HashMap<String, u64>,
    tails: Tails,
    /// Scopes the log created that nothing restored.
    open_scopes: HashMap<String, OpenScope>,
}

impl PreviousRun {
    /// Nothing to close.
    pub fn is_empty(&self) -> bool {
        self.participants.is_empty() && self.agents.is_empty()
    }

    /// The seq of the participant's last `participant_connected` / `_disconnected` (0: none).
    pub fn participant_seq(&self, id: &ParticipantId) -> u64 {
        self.last_participant.get(id.as_str()).copied().unwrap_or(0)
    }

    /// The seq of the agent's last `agent_registered` / `_unregistered` (0: none).
    pub fn agent_seq(&self, id: &AgentId) -> u64 {
        self.last_agent.get(id.as_str()).copied().unwrap_or(0)
    }

    /// Takes the participant out of those left connected; whether it was.
    pub fn take_participant(&mut self, id: &ParticipantId) -> bool {
        self.participants.remove(id.as_str()).is_some()
    }

    /// Takes the agent out of those left registered.
    pub fn take_agent(&mut self, id: &AgentId) {
        self.agents.remove(id.as_str());
    }

    /// Whether a scope's record saved at `seq` is the log's last word about it: no
    /// `scope_created` or `scope_deleted` of that id came after it.
    pub fn scope_current(&self, id: &ScopeId, seq: u64) -> bool {
        self.tails
            .scope_last
            .get(id.as_str())
            .is_none_or(|(last, _)| *last < seq)
    }

    /// Takes the scope out of those the log left created (it was restored).
    pub fn take_scope(&mut self, id: &ScopeId) {
        self.open_scopes.remove(id.as_str());
    }

    /// The effective capabilities of the participant's `permissions_client_updated` logged
    /// after `seq`, if any (the newest).
    pub fn permissions_after(
        &self,
        id: &ParticipantId,
        seq: u64,
    ) -> Option<&ParticipantCapabilities> {
        self.tails
            .permissions
            .get(id.as_str())
            .filter(|(at, _)| *at > seq)
            .map(|(_, caps)| caps)
    }

    /// Applies to `agent` (its record saved at `seq`) the changes the log holds after that
    /// record: state, metadata, environment, permission overrides (memberships:
    /// [`PreviousRun::memberships_after`]). Whether any applied.
    pub fn settle_agent(&self, agent: &mut Agent, seq: u64) -> bool {
        let mut applied = false;
        for change in self.changes_after(&agent.id, seq) {
            match change.clone() {
                AgentChange::State(state) => agent.state = state,
                AgentChange::Metadata(m) => agent.metadata = Some(m),
                AgentChange::Environment(e) => agent.environment = Some(e),
                AgentChange::Overrides(o) => crate::router::agents::ops::merge_sections(
                    agent
                        .permission_overrides
                        .get_or_insert_with(serde_json::Map::new),
                    &o,
                ),
                AgentChange::Joined(_) | AgentChange::Left(_) => continue,
            }
            applied = true;
        }
        applied
    }

    /// The agent's memberships the log changed after its record saved at `seq`, in order:
    /// (scope, joined).
    pub fn memberships_after(&self, id: &AgentId, seq: u64) -> Vec<(ScopeId, bool)> {
        self.changes_after(id, seq)
            .filter_map(|change| match change {
                AgentChange::Joined(s) => Some((s.clone(), true)),
                AgentChange::Left(s) => Some((s.clone(), false)),
                _ => None,
            })
            .collect()
    }

    fn changes_after(&self, id: &AgentId, seq: u64) -> impl Iterator<Item = &AgentChange> {
        self.tails
            .agents
            .get(id.as_str())
            .into_iter()
            .flatten()
            .filter(move |(at, _)| *at > seq)
            .map(|(_, change)| change)
    }
}

const KINDS: [EventType; 4] = [
    EventType::ParticipantConnected,
    EventType::ParticipantDisconnected,
    EventType::AgentRegistered,
    EventType::AgentUnregistered,
];

/// The kinds folded into [`Tails`] as well, in cluster mode.
const TAIL_KINDS: [EventType; 9] = [
    EventType::ScopeCreated,
    EventType::ScopeDeleted,
    EventType::ScopeMemberJoined,
    EventType::ScopeMemberLeft,
    EventType::PermissionsClientUpdated,
    EventType::AgentStateChanged,
    EventType::AgentMetadataChanged,
    EventType::AgentEnvironmentChanged,
    EventType::PermissionsAgentUpdated,
];

/// Folds the lifecycle events of everything `store` holds (with `tails`, the changes a
/// takeover settles its saved records with as well).
///
/// # Errors
/// The store could not be read. Unreadable rows are skipped with a warning.
pub async fn previous_run(store: &dyn EventStore, tails: bool) -> Result<PreviousRun, StoreError> {
    Ok(read_into(store, tails, LifecycleFold::default(), None)
        .await?
        .folding
        .finish())
}

/// Folds into `fold` the rows of the folded kinds from its position on (below `until` when
/// given, which becomes its position).
async fn read_into(
    store: &dyn EventStore,
    tails: bool,
    mut fold: LifecycleFold,
    until: Option<u64>,
) -> Result<LifecycleFold, StoreError> {
    let mut kinds: Vec<String> = KINDS.iter().map(|k| k.as_str().to_owned()).collect();
    if tails {
        kinds.extend(TAIL_KINDS.iter().map(|k| k.as_str().to_owned()));
    }
    let mut from = fold.upto;
    'pages: loop {
        let rows = store.read_kinds(kinds.clone(), from, PAGE).await?;
        let Some(last) = rows.last() else { break };
        from = last.seq + 1;
        let full = rows.len() == PAGE;
        for row in rows {
            if until.is_some_and(|until| row.seq >= until) {
                break 'pages;
            }
            let rec = match EventRecord::from_row(row) {
                Ok(rec) => rec,
                Err(e) => {
                    tracing::warn!(error = %e, "skipping an unreadable event while recovering");
                    continue;
                }
            };
            fold.folding.fold(&rec);
        }
        if !full {
            break;
        }
    }
    fold.upto = until.unwrap_or(from).max(fold.upto);
    Ok(fold)
}

/// A cluster standby's fold of the lifecycle events (and the changes a takeover settles saved
/// records with) of the stream it follows: read once when it starts, then kept up to date
/// with every row it follows, and handed to the router of the same process that takes the
/// stream over, which then reads only what the standby had not followed yet instead of every
/// such event the stream holds (75–110 ms of a 5 000-agent takeover). What retention deleted
/// is forgotten ([`LifecycleFold::prune`]), so it holds what a fresh read would find; a
/// debug build checks that at every takeover.
#[derive(Debug, Default)]
pub struct LifecycleFold {
    folding: Folding,
    /// Every row below this seq is folded (or was never there).
    upto: u64,
}

impl LifecycleFold {
    /// Folds a followed record, unless the fold is past it.
    pub(crate) fn follow(&mut self, rec: &EventRecord) {
        if rec.seq < self.upto {
            return;
        }
        self.upto = rec.seq + 1;
        if KINDS.contains(&rec.kind) || TAIL_KINDS.contains(&rec.kind) {
            self.folding.fold(rec);
        }
    }

    /// Forgets what the fold learnt from rows before `first` (the stream's oldest: retention
    /// deleted the others), as a fresh read would not see them. Each entry names the seq of
    /// the row it came from, and later rows replace or remove entries by id, so keeping the
    /// entries at or after `first` is the fold of the rows at or after it.
    pub(crate) fn prune(&mut self, first: u64) {
        let f = &mut self.folding;
        f.participants.retain(|_, p| p.seq >= first);
        f.agents.retain(|_, a| a.seq >= first);
        f.last_participant.retain(|_, seq| *seq >= first);
        f.last_agent.retain(|_, seq| *seq >= first);
        let t = &mut f.tails;
        t.scope_last.retain(|_, (seq, _)| *seq >= first);
        t.open_scopes.retain(|_, s| s.seq >= first);
        t.permissions.retain(|_, (seq, _)| *seq >= first);
        t.agents.retain(|_, changes| {
            changes.retain(|(seq, _)| *seq >= first);
            !changes.is_empty()
        });
    }
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

/// Folds `rows` (all the kinds a cluster node folds), for the unit tests of the takeover.
#[cfg(test)]
pub(crate) fn fold_rows(rows: Vec<crate::store::record::StoredRow>) -> PreviousRun {
    let mut folding = Folding::default();
    for row in rows {
        folding.fold(&EventRecord::from_row(row).expect("a readable row"));
    }
    folding.finish()
}

/// The lifecycle events folded so far: who is still open, and the seq of each id's last
/// lifecycle event.
#[derive(Debug, Default, PartialEq)]
struct Folding {
    participants: HashMap<String, OpenParticipant>,
    agents: HashMap<String, OpenAgent>,
    last_participant: HashMap<String, u64>,
    last_agent: HashMap<String, u64>,
    tails: Tails,
}

impl Folding {
    fn finish(self) -> PreviousRun {
        let mut tails = self.tails;
        PreviousRun {
            participants: self.participants,
            agents: self.agents,
            last_participant: self.last_participant,
            last_agent: self.last_agent,
            // Only the run reads them from here on (a takeover takes the restored ones out).
            open_scopes: std::mem::take(&mut tails.open_scopes),
            tails,
        }
    }

    /// Folds one of the [`TAIL_KINDS`].
    fn fold_tail(&mut self, rec: &EventRecord, data: &serde_json::Value) {
        let text = |k: &str| data[k].as_str().map(str::to_owned);
        let tails = &mut self.tails;
        match rec.kind {
            EventType::ScopeCreated => {
                let Some(id) = text("scopeId") else { return };
                tails.scope_last.insert(id.clone(), (rec.seq, false));
                tails.open_scopes.insert(
                    id.clone(),
                    OpenScope {
                        seq: rec.seq,
                        id: ScopeId::from(id.as_str()),
                        audience: rec.audience.clone(),
                        keys: rec.keys.clone(),
                    },
                );
            }
            EventType::ScopeDeleted => {
                let descendants = data["deletedDescendants"].as_array().into_iter().flatten();
                for id in text("scopeId")
                    .into_iter()
                    .chain(descendants.filter_map(|d| d.as_str().map(str::to_owned)))
                {
                    tails.open_scopes.remove(&id);
                    tails.scope_last.insert(id, (rec.seq, true));
                }
            }
            EventType::PermissionsClientUpdated => {
                let (Some(id), Ok(caps)) = (
                    text("clientId"),
                    serde_json::from_value(data["effectivePermissions"].clone()),
                ) else {
                    return;
                };
                tails.permissions.insert(id, (rec.seq, caps));
            }
            _ => {
                let Some(id) = text("agentId") else { return };
                let scope = || text("scopeId").map(|s| ScopeId::from(s.as_str()));
                let change = match rec.kind {
                    EventType::ScopeMemberJoined => scope().map(AgentChange::Joined),
                    EventType::ScopeMemberLeft => scope().map(AgentChange::Left),
                    EventType::AgentStateChanged => {
                        serde_json::from_value(data["newState"].clone())
                            .ok()
                            .map(AgentChange::State)
                    }
                    EventType::AgentMetadataChanged => data["metadata"]
                        .is_object()
                        .then(|| RawJson::from_text(data["metadata"].to_string()).ok())
                        .flatten()
                        .map(AgentChange::Metadata),
                    EventType::AgentEnvironmentChanged => data["environment"]
                        .as_object()
                        .cloned()
                        .map(AgentChange::Environment),
                    EventType::PermissionsAgentUpdated => data["changes"]
                        .as_object()
                        .cloned()
                        .map(AgentChange::Overrides),
                    _ => None,
                };
                if let Some(change) = change {
                    // A later change of the same field (or membership) supersedes an
                    // earlier one whatever the record's seq, so the earlier one is dropped:
                    // an agent's entry stays as small as its fields and scopes (overrides,
                    // which merge, are kept in order).
                    let changes = tails.agents.entry(id).or_default();
                    changes.retain(|(_, old)| !change.supersedes(old));
                    changes.push((rec.seq, change));
                }
            }
        }
    }

    fn fold(&mut self, rec: &EventRecord) {
        use serde_json::value::RawValue;
        /// What the fold reads of a lifecycle event's `data`; the rest (a registration's whole
        /// agent) is skipped, not built into a `Value`.
        #[derive(serde::Deserialize)]
        struct Event<'a> {
            #[serde(borrow)]
            data: Data<'a>,
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Data<'a> {
            #[serde(borrow, default)]
            participant_id: Option<&'a RawValue>,
            #[serde(borrow, default)]
            agent_id: Option<&'a RawValue>,
            #[serde(borrow, default)]
            participant_type: Option<&'a RawValue>,
            #[serde(borrow, default)]
            owner_id: Option<&'a RawValue>,
        }
        if TAIL_KINDS.contains(&rec.kind) {
            let Ok(event) = serde_json::from_str::<serde_json::Value>(&rec.json) else {
                return;
            };
            self.fold_tail(rec, &event["data"]);
            return;
        }
        let Ok(Event { data }) = serde_json::from_str::<Event>(&rec.json) else {
            return;
        };
        // A string, else nothing (as `Value::as_str`).
        let text =
            |v: Option<&RawValue>| v.and_then(|v| serde_json::from_str::<String>(v.get()).ok());
        let (field, last) = match rec.kind {
            EventType::ParticipantConnected | EventType::ParticipantDisconnected => {
                (data.participant_id, &mut self.last_participant)
            }
            EventType::AgentRegistered | EventType::AgentUnregistered => {
                (data.agent_id, &mut self.last_agent)
            }
            _ => return,
        };
        let Some(id) = text(field) else { return };
        last.insert(id.clone(), rec.seq);
        match rec.kind {
            EventType::ParticipantConnected => {
                let Some(Ok(kind)) = data
                    .participant_type
                    .map(|t| serde_json::from_str::<ParticipantType>(t.get()))
                else {
                    return;
                };
                self.participants.insert(
                    id.clone(),
                    OpenParticipant {
                        seq: rec.seq,
                        id: ParticipantId::from(id.as_str()),
                        kind,
                    },
                );
            }
            EventType::ParticipantDisconnected => {
                self.participants.remove(&id);
            }
            EventType::AgentRegistered => {
                // A new registration: what the log said of an earlier one is over.
                self.tails.agents.remove(&id);
                self.agents.insert(
                    id.clone(),
                    OpenAgent {
                        seq: rec.seq,
                        id: AgentId::from(id.as_str()),
                        owner: text(data.owner_id).map(|o| ParticipantId::from(o.as_str())),
                        audience: rec.audience.clone(),
                        keys: rec.keys.clone(),
                    },
                );
            }
            EventType::AgentUnregistered => {
                self.agents.remove(&id);
            }
            _ => {}
        }
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
        let (Some(progress), until) = (self.store_progress.clone(), self.bus.log.next_seq()) else {
            return;
        };
        let mut progress = progress;
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

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::{Folding, LifecycleFold};
    use crate::protocol::ids::{EventId, Ulid};
    use crate::router::events::log::EventRecord;
    use crate::store::record::StoredRow;

    fn rec(seq: u64, kind: &str, data: Value) -> EventRecord {
        EventRecord::from_row(StoredRow {
            seq,
            id: EventId(Ulid::random()).to_string(),
            timestamp: seq,
            kind: kind.into(),
            meta: json!({"audience": {"kind": "everyone"}}).to_string(),
            json: json!({"type": kind, "data": data}).to_string(),
        })
        .unwrap()
    }

    /// A log with every kind the fold keeps, ids opened and closed on both sides of seq 8.
    fn log() -> Vec<EventRecord> {
        let p = |id: &str| json!({"participantId": id, "participantType": "agent"});
        let a = |id: &str, owner: &str| json!({"agentId": id, "ownerId": owner});
        let state =
            |id: &str, s: &str| json!({"agentId": id, "previousState": "active", "newState": s});
        vec![
            rec(1, "participant_connected", p("old")),
            rec(2, "agent_registered", a("old-bot", "old")),
            rec(3, "scope_created", json!({"scopeId": "team"})),
            rec(4, "agent_state_changed", state("old-bot", "busy")),
            rec(5, "participant_connected", p("alice")),
            rec(6, "agent_registered", a("bot", "alice")),
            rec(7, "agent_state_changed", state("bot", "busy")),
            rec(8, "message_sent", json!({})),
            rec(9, "agent_state_changed", state("bot", "idle")),
            rec(
                10,
                "scope_member_joined",
                json!({"scopeId": "team", "agentId": "bot"}),
            ),
            rec(11, "participant_disconnected", p("old")),
            rec(12, "participant_connected", p("bob")),
            rec(13, "agent_unregistered", json!({"agentId": "old-bot"})),
            rec(14, "scope_deleted", json!({"scopeId": "team"})),
        ]
    }

    fn fresh(rows: &[EventRecord], first: u64) -> Folding {
        let mut f = Folding::default();
        for r in rows.iter().filter(|r| r.seq >= first) {
            f.fold(r);
        }
        f
    }

    #[test]
    fn a_followed_fold_pruned_at_the_streams_first_row_is_what_a_fresh_read_folds() {
        let rows = log();
        for first in 1..=15 {
            let mut followed = LifecycleFold::default();
            for r in &rows {
                followed.follow(r);
            }
            followed.prune(first);
            assert_eq!(followed.folding, fresh(&rows, first), "first = {first}");
            assert_eq!(followed.upto, 15);
        }
        // A row it is past is not folded again.
        let mut followed = LifecycleFold::default();
        for r in &rows {
            followed.follow(r);
        }
        followed.follow(&rows[4]);
        followed.follow(&rows[10]);
        assert_eq!(followed.folding, fresh(&rows, 1));
        // The control: the fold does change with what it follows.
        assert_ne!(fresh(&rows, 1), fresh(&rows, 6));
    }
}
