//! The fold of the durable log's lifecycle events into "who was still there when the previous
//! process stopped" ([`PreviousRun`]), which `sessions::recovery` closes out after a restart
//! and a takeover settles its saved records with (`router::handover`).
//!
//! Owns the fold itself and what it keeps: the participants and agents left open, the seq of
//! each id's last lifecycle event, and in cluster mode the last word about each scope, client
//! permission and agent change (`Tails`). Read from the store at start-up
//! ([`previous_run`]), or on a cluster standby kept as it follows the stream
//! ([`LifecycleFold`]) and carried over to the router that takes the stream over. Knows no
//! router: data in, data out.

use std::collections::HashMap;

use crate::protocol::agent::{Agent, AgentState};
use crate::protocol::capabilities::{ParticipantCapabilities, ParticipantType};
use crate::protocol::event::EventType;
use crate::protocol::ids::{AgentId, ParticipantId, ScopeId};
use crate::protocol::json::RawJson;
use crate::store::{EventStore, StoreError};

use crate::router::events::log::Audience;
use crate::router::events::log::EventRecord;
use crate::router::events::log::FilterKeys;

/// Rows read per store request while folding.
const PAGE: usize = 10_000;

/// A participant still connected at the end of the previous run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OpenParticipant {
    pub(crate) seq: u64,
    pub(crate) id: ParticipantId,
    pub(crate) kind: ParticipantType,
}

/// An agent still registered at the end of the previous run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OpenAgent {
    pub(crate) seq: u64,
    pub(crate) id: AgentId,
    pub(crate) owner: Option<ParticipantId>,
    pub(crate) audience: Audience,
    pub(crate) keys: FilterKeys,
}

/// A scope the log created and never deleted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OpenScope {
    pub(crate) seq: u64,
    pub(crate) id: ScopeId,
    pub(crate) audience: Audience,
    pub(crate) keys: FilterKeys,
}

/// One change of an agent the log records after its registration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AgentChange {
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

/// What the log says after the lifecycle events (cluster mode only): the last word about
/// each scope, client permission and agent change, by seq.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Tails {
    /// Scope id → (seq of its last `scope_created` / `scope_deleted`, deleted).
    pub(crate) scope_last: HashMap<String, (u64, bool)>,
    /// Scopes created and not deleted since.
    pub(crate) open_scopes: HashMap<String, OpenScope>,
    /// Participant id → (seq, effective capabilities) of its last `permissions_client_updated`.
    pub(crate) permissions: HashMap<String, (u64, ParticipantCapabilities)>,
    /// Agent id → its changes since its last registration, oldest first (each field's and
    /// scope's last only).
    pub(crate) agents: HashMap<String, Vec<(u64, AgentChange)>>,
}

/// What the previous run left open, by id (a takeover takes thousands out one by one;
/// `oldest_first` orders what is left when it is closed).
#[derive(Debug, Default)]
pub struct PreviousRun {
    pub(crate) participants: HashMap<String, OpenParticipant>,
    pub(crate) agents: HashMap<String, OpenAgent>,
    /// The seq of the last lifecycle event of every participant and agent id the log holds.
    pub(crate) last_participant: HashMap<String, u64>,
    pub(crate) last_agent: HashMap<String, u64>,
    pub(crate) tails: Tails,
    /// Scopes the log created that nothing restored.
    pub(crate) open_scopes: HashMap<String, OpenScope>,
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
                AgentChange::Overrides(o) => crate::router::agents::registry::merge_sections(
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

pub(crate) const KINDS: [EventType; 4] = [
    EventType::ParticipantConnected,
    EventType::ParticipantDisconnected,
    EventType::AgentRegistered,
    EventType::AgentUnregistered,
];

/// The kinds folded into [`Tails`] as well, in cluster mode.
pub(crate) const TAIL_KINDS: [EventType; 9] = [
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
pub(crate) async fn read_into(
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
    pub(crate) folding: Folding,
    /// Every row below this seq is folded (or was never there).
    pub(crate) upto: u64,
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
pub(crate) struct Folding {
    pub(crate) participants: HashMap<String, OpenParticipant>,
    pub(crate) agents: HashMap<String, OpenAgent>,
    pub(crate) last_participant: HashMap<String, u64>,
    pub(crate) last_agent: HashMap<String, u64>,
    pub(crate) tails: Tails,
}

impl Folding {
    pub(crate) fn finish(self) -> PreviousRun {
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

    pub(crate) fn fold(&mut self, rec: &EventRecord) {
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
