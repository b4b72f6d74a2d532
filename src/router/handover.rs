//! Handing sessions, agents and scopes over from one live node of a cluster to the next.
//!
//! Owns the *saved image* of those three tables and its three parts:
//!
//! - **Saving** (the live node): each table records which ids changed
//!   ([`Changes`](crate::router::changes::Changes)); after
//!   every call, and after every batch of timers and transport events, [`Router::save_changed`]
//!   writes the newest record of each changed one, all of them in one internal `state.saved`
//!   event (`data.records`; a record with only its key once it is gone; a row holds at most
//!   [`BATCH_BYTES`] of records), which the log keeps and no subscriber is shown. A
//!   record unchanged since it was last saved is not written again ([`Saver`] keeps a digest
//!   per key). A call's answer waits for the commit of its records too, so what a client was
//!   told is saved.
//! - **Restoring** (the node that takes the log over): every standby folds the records as it
//!   follows the stream (`store::jetstream::fold`), so the new live node starts with the
//!   newest record of each key (`Recovered::saved`), and [`Router::restore_saved`] puts them
//!   back instead of ending them: scopes as they were; sessions detached, resumable with their
//!   token (only its digest is saved) for the resume window; agents with their owner. The
//!   sessions that were connected when the old live node died then go through the detach of
//!   a lost connection (`participant_disconnected` with reason `router_restarted`, then their
//!   disconnect policy: agents orphaned, or unregistered), once, by the new live node.
//!
//! - **Following** (a standby's router, `RouterConfig::follower`): the agents and scopes
//!   records go into the follower's own registry and scopes as it follows them
//!   ([`Router::follow_saved`]; those it starts from, [`Router::follow_saved_rows`]), newest
//!   record wins, a drop removes; sessions' records are not taken. From them the standby
//!   answers `map/agents/*` and `map/scopes/*` reads (`router::relay::reads_saved_image`).
//!   That router is dropped at a takeover: the new live node restores as above.
//!
//! With stream limits (`RouterConfig::saved_refresh`), the live node also writes a record
//! again before the limits would delete it ([`Router::refresh_saved`]), so the stream always
//! holds the newest record of every key, for a standby that starts later; identity claims
//! (`router::identities`) are logged again the same way.
//!
//! A restored session is re-admitted under this node's configuration, as a fresh connect of
//! its principal would be (`Router::readmit`, `sessions::auth`): a takeover is how a rolling
//! configuration change reaches the sessions that keep resuming.
//!
//! Saved: the sessions of network clients (directly or through a standby's relay session)
//! and their agents; not the sessions of in-process links (the gateways, which start again on
//! the new node) nor of supervised processes (which died with their node). A record is
//! trusted only when it is newer than the log's last lifecycle event of its participant or
//! agent (a node killed between an event and its record leaves the record behind: that
//! participant or agent is ended as after a restart, `sessions::recovery`). The log's last
//! word wins elsewhere too: a scope record older than the scope's last `scope_created` /
//! `scope_deleted` is not restored (a scope the log created without a record is deleted),
//! and an agent's or client's changes logged after its record (state, metadata, environment,
//! permission overrides, memberships, `permissions_client_updated`) are applied to it. Only a router
//! with a node name (cluster mode) that writes the log saves; a single router saves nothing
//! and a restart still ends everything.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::protocol::agent::{Agent, AgentState};
use crate::protocol::capabilities::{ParticipantCapabilities, ParticipantType};
use crate::protocol::event::EventType;
use crate::protocol::ids::{AgentId, ParticipantId, ScopeId, SessionId};
use crate::protocol::methods::session::{DisconnectPolicy, Principal};
use crate::protocol::scope::Scope;
use crate::store::record::StoredRow;

use crate::router::changes::Saver;
use crate::router::core::Router;
use crate::router::events::log::{Audience, EventDraft, FilterKeys};
use crate::router::sessions::table::SessionSeed;
use crate::router::timers::Deadline;

/// Records of one `state.saved` row at most (bytes of their JSON; one larger record goes alone).
const BATCH_BYTES: usize = 64 * 1024;

/// How often the live node looks for saved records to write again
/// (`RouterConfig::saved_refresh`).
pub const REFRESH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The saved record of a session.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SavedSession {
    id: SessionId,
    participant_id: ParticipantId,
    participant_type: ParticipantType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    capabilities: ParticipantCapabilities,
    created_at: u64,
    token_key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    policy: Option<DisconnectPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    primary_agent: Option<AgentId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    orphaned: Vec<AgentId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    principal: Option<Principal>,
    /// Whether a connection held it when it was saved.
    #[serde(default)]
    attached: bool,
}

/// The saved record of an agent: the wire record (owner, state, scopes...) and what the
/// router keeps beside it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SavedAgent {
    agent: Agent,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    state_before_suspend: Option<AgentState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    state_before_orphan: Option<AgentState>,
}

/// The saved record of a scope (its members are the agents' `scopes`, derived from the scopes
/// part's membership when an agent is saved).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SavedScope {
    scope: Scope,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    creator: Option<ParticipantId>,
}

/// One record of a `state.saved`'s `data.records`: one of the three, or the key only (dropped).
/// (A node before batches wrote one record as the whole `data`, and a drop as `state.dropped`;
/// both are still read, `store::kept`.)
#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    session: Option<SavedSession>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent: Option<SavedAgent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scope: Option<SavedScope>,
}

fn session_key(id: &SessionId) -> String {
    format!("session:{id}")
}

fn agent_key(id: &AgentId) -> String {
    format!("agent:{id}")
}

fn scope_key(id: &ScopeId) -> String {
    format!("scope:{id}")
}

/// A dropped key's record.
fn dropped(key: String) -> String {
    crate::router::core::to_json(&Record {
        key,
        ..Record::default()
    })
}

fn digest(text: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// The restore order for records with a parent: every parent before its children (a record
/// whose parent is not among them comes where its turn falls).
fn parents_first<T, K: Ord + Clone>(
    items: Vec<T>,
    id: impl Fn(&T) -> K,
    parent: impl Fn(&T) -> Option<K>,
) -> Vec<T> {
    let ids: BTreeSet<K> = items.iter().map(&id).collect();
    let mut placed: BTreeSet<K> = BTreeSet::new();
    let mut pending = items;
    let mut out = Vec::with_capacity(pending.len());
    while !pending.is_empty() {
        let before = pending.len();
        let (ready, rest): (Vec<T>, Vec<T>) = pending
            .into_iter()
            .partition(|t| parent(t).is_none_or(|p| !ids.contains(&p) || placed.contains(&p)));
        for t in &ready {
            placed.insert(id(t));
        }
        out.extend(ready);
        pending = rest;
        if pending.len() == before {
            // A cycle (never written by a router): take the rest as they come.
            out.append(&mut pending);
        }
    }
    out
}

/// What one followed saved record says of its key: its newest record, or that it is gone.
type Followed = (String, Option<Record>);

/// The records of a `state.saved` (or an older node's `state.dropped`) event's JSON: several
/// (`data.records`) or one (`data` itself, as the store's fold hands them over).
fn followed_records(kind: EventType, json: &str) -> Vec<Followed> {
    #[derive(Deserialize)]
    struct Event {
        data: Record,
    }
    let parse = |key: String, body: Option<&str>| -> Option<Followed> {
        let Some(body) = body else {
            return Some((key, None));
        };
        match serde_json::from_str::<Record>(body) {
            Ok(r) => Some((key, Some(r))),
            Err(e) => {
                tracing::warn!(key, error = %e, "follower: skipping an unreadable saved record");
                None
            }
        }
    };
    if kind == EventType::StateSaved {
        if let Some(records) = crate::store::kept::saved_records(json) {
            return records
                .into_iter()
                .filter_map(|r| parse(r.key, r.json.as_deref()))
                .collect();
        }
    }
    match serde_json::from_str::<Event>(json) {
        Ok(Event { data }) if kind == EventType::StateDropped => vec![(data.key, None)],
        Ok(Event { data }) => {
            let body = data.session.is_some() || data.agent.is_some() || data.scope.is_some();
            vec![(data.key.clone(), body.then_some(data))]
        }
        Err(e) => {
            tracing::warn!(error = %e, "follower: skipping an unreadable saved row");
            Vec::new()
        }
    }
}

impl Router {
    /// A follower: puts the saved records it starts from (`Recovered::saved`, one per key)
    /// into its own registry and scopes ([`Router::follow_saved`]).
    pub(crate) fn follow_saved_rows(&mut self, rows: &[StoredRow]) {
        let records = rows
            .iter()
            .flat_map(|row| {
                let kind = if row.kind == EventType::StateDropped.as_str() {
                    EventType::StateDropped
                } else {
                    EventType::StateSaved
                };
                followed_records(kind, &row.json)
            })
            .collect();
        self.apply_followed(records);
    }

    /// A follower: puts the records of one followed `state.saved` (or `state.dropped`) event
    /// into its own registry and scopes, so that it answers `map/agents/list` / `get` and
    /// `map/scopes/*` itself (`router::relay`) with the live node's data as of its last
    /// saved call. Sessions' records are the live node's business: not taken.
    pub(crate) fn follow_saved(&mut self, kind: EventType, json: &str) {
        self.apply_followed(followed_records(kind, json));
    }

    /// Scopes first (parents first), then agents (parents first, each with its memberships
    /// as saved), then what was dropped.
    fn apply_followed(&mut self, records: Vec<Followed>) {
        let (mut scopes, mut agents, mut dropped) = (Vec::new(), Vec::new(), Vec::new());
        for (key, record) in records {
            match record {
                None => dropped.push(key),
                Some(Record { scope: Some(s), .. }) => scopes.push(s),
                Some(Record { agent: Some(a), .. }) => agents.push(a),
                Some(_) => {}
            }
        }
        for s in parents_first(scopes, |s| s.scope.id.clone(), |s| s.scope.parent.clone()) {
            self.scopes.follow(s.scope, s.creator);
        }
        for a in parents_first(agents, |a| a.agent.id.clone(), |a| a.agent.parent.clone()) {
            let mut agent = a.agent;
            let id = agent.id.clone();
            let want: BTreeSet<ScopeId> = std::mem::take(&mut agent.scopes).into_iter().collect();
            self.registry
                .follow(agent, a.state_before_suspend, a.state_before_orphan);
            for scope in self.scopes.of_agent(&id).to_vec() {
                if !want.contains(&scope) {
                    self.scopes.leave(&scope, &id);
                }
            }
            for scope in &want {
                self.scopes.join(scope, &id);
            }
        }
        for key in dropped {
            match key.split_once(':') {
                Some(("agent", id)) => {
                    let id = AgentId::from(id);
                    for scope in self.scopes.of_agent(&id).to_vec() {
                        self.scopes.leave(&scope, &id);
                    }
                    self.registry.unfollow(&id);
                }
                Some(("scope", id)) => self.scopes.unfollow(&ScopeId::from(id)),
                _ => {}
            }
        }
    }
}

impl Router {
    /// Makes this router save (a cluster's live node): the tables start recording what
    /// changes, and [`Router::save_changed`] writes it.
    pub(crate) fn start_saving(&mut self) {
        self.handover = Some(Saver::default());
        self.sessions.changed.track();
        self.registry.changed.track();
        self.scopes.changed.track();
        self.scopes.members_changed.track();
    }

    /// Writes the records of what changed since the last call (see the module doc).
    pub(crate) fn save_changed(&mut self) {
        let Some(mut saver) = self.handover.take() else {
            return;
        };
        let mut out = Vec::new();
        for id in self.scopes.changed.take() {
            let record = self.scopes.get(&id).map(|r| Record {
                key: scope_key(&id),
                scope: Some(SavedScope {
                    scope: r.scope().clone(),
                    creator: r.creator().cloned(),
                }),
                ..Record::default()
            });
            self.put(&mut saver, scope_key(&id), record, &mut out);
        }
        for id in self.sessions.changed.take() {
            let record = self
                .sessions
                .get(&id)
                .filter(|s| s.handed_over())
                .map(|s| Record {
                    key: session_key(&id),
                    session: Some(SavedSession {
                        id: s.id().clone(),
                        participant_id: s.participant().clone(),
                        participant_type: s.kind(),
                        name: s.name().map(str::to_owned),
                        capabilities: s.capabilities().clone(),
                        created_at: s.created_at(),
                        token_key: s.token_key().to_owned(),
                        policy: s.policy().cloned(),
                        primary_agent: s.primary_agent().cloned(),
                        orphaned: s.orphaned().to_vec(),
                        principal: s.principal().cloned(),
                        attached: s.conn().is_some(),
                    }),
                    ..Record::default()
                });
            self.put(&mut saver, session_key(&id), record, &mut out);
        }
        // An agent's record carries its scopes: a membership change saves it too.
        let mut agents: BTreeSet<AgentId> = self.registry.changed.take().into_iter().collect();
        agents.extend(self.scopes.members_changed.take());
        for id in agents {
            let view = self.agent_view();
            let record = view
                .record(&id)
                .filter(|r| {
                    // An agent goes with its owner's session (an orphan on its own).
                    r.agent().owner_id.as_ref().is_none_or(|o| {
                        self.sessions
                            .by_participant(o)
                            .is_some_and(|s| s.handed_over())
                    })
                })
                .map(|r| Record {
                    key: agent_key(&id),
                    agent: Some(SavedAgent {
                        agent: view.complete(r.agent().clone()),
                        state_before_suspend: r.state_before_suspend().cloned(),
                        state_before_orphan: r.state_before_orphan().cloned(),
                    }),
                    ..Record::default()
                });
            self.put(&mut saver, agent_key(&id), record, &mut out);
        }
        self.handover = Some(saver);
        self.emit_records(out);
    }

    /// Adds `record` to `out` under `key` if it changed, or the key's drop (`None`) if it was
    /// saved.
    fn put(&self, saver: &mut Saver, key: String, record: Option<Record>, out: &mut Vec<String>) {
        match record {
            Some(record) => {
                let data = crate::router::core::to_json(&record);
                let d = digest(&data);
                if saver.changed(key, d, self.bus.log.next_seq()) {
                    out.push(data);
                }
            }
            None => {
                if saver.forget(&key) {
                    out.push(dropped(key));
                }
            }
        }
    }

    /// Writes again the saved records the stream's limits would delete next
    /// (`RouterConfig::saved_refresh`): those in the older half of the retained log, or saved
    /// longer ago than half the age limit. Then looks again in [`REFRESH_EVERY`].
    pub(crate) fn refresh_saved(&mut self) {
        let Some(refresh) = self.config.saved_refresh else {
            return;
        };
        self.schedule(Instant::now() + REFRESH_EVERY, Deadline::RefreshSaved);
        let first = self.store.as_ref().map_or(0, |s| s.first_seq());
        let next = self.bus.log.next_seq();
        let Some(saver) = self.handover.as_mut() else {
            return;
        };
        let seq = if refresh.by_position {
            first + next.saturating_sub(first) / 2
        } else {
            0
        };
        let at = refresh
            .older_than
            .and_then(|d| Instant::now().checked_sub(d));
        // Identity claims too: a node that opens the stream later must know who owns an id
        // (`router::identities`).
        let ms = refresh.older_than.map(|d| {
            crate::protocol::ids::now_ms()
                .saturating_sub(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        });
        let claims = self.identities.due(seq, ms);
        for key in saver.due(seq, at) {
            // Forgotten, so that `save_changed` writes it though it did not change.
            saver.forget(&key);
            match key.split_once(':') {
                Some(("session", id)) => self.sessions.changed.mark(&SessionId::from(id)),
                Some(("agent", id)) => self.registry.changed.mark(&AgentId::from(id)),
                Some(("scope", id)) => self.scopes.changed.mark(&ScopeId::from(id)),
                _ => {}
            }
        }
        for (kind, id, owner) in claims {
            self.record_claim(kind, &id, Some(&owner));
        }
        self.save_changed();
    }

    /// Logs `records` (each a [`Record`]'s JSON; a drop has only its key) as internal
    /// `state.saved` events of several records each (`data.records`), shown to nobody: one row
    /// for what a call changed, [`BATCH_BYTES`] of records at most per row (a takeover's
    /// thousands take a few rows, not one or two per agent).
    fn emit_records(&mut self, records: Vec<String>) {
        let mut data = String::new();
        for record in records {
            if !data.is_empty() && data.len() + record.len() + 2 > BATCH_BYTES {
                self.emit_batch(std::mem::take(&mut data));
            }
            data.push_str(if data.is_empty() {
                "{\"records\":["
            } else {
                ","
            });
            data.push_str(&record);
        }
        if !data.is_empty() {
            self.emit_batch(data);
        }
    }

    fn emit_batch(&mut self, mut data: String) {
        data.push_str("]}");
        self.emit(EventDraft {
            kind: EventType::StateSaved,
            source: None,
            data,
            caused_by: Vec::new(),
            keys: FilterKeys::default(),
            audience: Audience::System,
        });
    }

    /// Restores the saved records the store came back with (see the module doc), taking what
    /// it restores out of `run` (what the previous live node left open, which the caller then
    /// ends as after a restart). Returns the sessions that were connected when that node
    /// stopped, which the caller detaches once the rest is closed.
    pub(crate) fn restore_saved(
        &mut self,
        saved: Vec<StoredRow>,
        run: &mut crate::router::sessions::lifecycle::PreviousRun,
    ) -> Vec<SessionId> {
        if saved.is_empty() {
            return Vec::new();
        }
        // Records older than the log's last word about their key (the previous live node
        // died between an event and its record) are dropped or settled with what followed.
        let mut stale = Vec::new();
        let mut scopes = Vec::new();
        let mut sessions = Vec::new();
        let mut agents = Vec::new();
        for row in saved {
            #[derive(Deserialize)]
            struct Event {
                data: Record,
            }
            let Ok(event) = serde_json::from_str::<Event>(&row.json) else {
                tracing::warn!(event = %row.id, "skipping an unreadable saved record");
                continue;
            };
            let r = event.data;
            if let Some(s) = r.scope {
                if run.scope_current(&s.scope.id, row.seq) {
                    scopes.push(s);
                } else {
                    tracing::info!(scope = %s.scope.id, "not restoring a scope the log changed after its record");
                    stale.push(scope_key(&s.scope.id));
                }
            } else if let Some(s) = r.session {
                sessions.push((row.seq, s));
            } else if let Some(a) = r.agent {
                agents.push((row.seq, a));
            }
        }
        let now = Instant::now();
        let window = self.config.resume_window;

        // Scopes, parents first.
        for s in parents_first(scopes, |s| s.scope.id.clone(), |s| s.scope.parent.clone()) {
            run.take_scope(&s.scope.id);
            self.scopes.restore(s.scope, s.creator);
        }

        // Sessions newer than their participant's last lifecycle event.
        let mut connected = Vec::new();
        for (seq, mut s) in sessions {
            if run.participant_seq(&s.participant_id) >= seq
                || self.sessions.by_participant(&s.participant_id).is_some()
            {
                stale.push(session_key(&s.id));
                continue;
            }
            // Connected when the node died: its record says so (the log's
            // `participant_connected` may be gone with retention).
            if run.take_participant(&s.participant_id) || s.attached {
                connected.push(s.id.clone());
            } else {
                self.schedule(now + window, Deadline::SessionExpiry(s.id.clone()));
            }
            let id = s.id.clone();
            // A `map/permissions/update` logged after the record.
            if let Some(caps) = run.permissions_after(&s.participant_id, seq) {
                s.capabilities = caps.clone();
            }
            self.sessions.restore(
                SessionSeed {
                    id: s.id,
                    participant: s.participant_id,
                    kind: s.participant_type,
                    name: s.name,
                    capabilities: s.capabilities,
                    created_at: s.created_at,
                    token_key: s.token_key,
                    policy: s.policy,
                    primary_agent: s.primary_agent,
                    orphaned: s.orphaned,
                    principal: s.principal,
                },
                now,
            );
            // Under this node's configuration, as a fresh connect would be.
            self.readmit(&id, None, true);
        }

        // Agents newer than their last lifecycle event whose owner came back (or orphans).
        let (agents, gone): (Vec<_>, Vec<_>) = agents.into_iter().partition(|(seq, a)| {
            run.agent_seq(&a.agent.id) < *seq
                && !self.registry.contains(&a.agent.id)
                && a.agent
                    .owner_id
                    .as_ref()
                    .is_none_or(|o| self.sessions.by_participant(o).is_some())
        });
        stale.extend(gone.iter().map(|(_, a)| agent_key(&a.agent.id)));
        self.emit_records(stale.into_iter().map(dropped).collect());
        // Changes logged after an agent's record (state, metadata, overrides, memberships).
        let agents: Vec<(u64, SavedAgent)> = agents
            .into_iter()
            .map(|(seq, mut a)| {
                if run.settle_agent(&mut a.agent, seq) {
                    // Saved again as settled.
                    self.registry.changed.mark(&a.agent.id);
                }
                (seq, a)
            })
            .collect();
        for (seq, a) in parents_first(
            agents,
            |(_, a)| a.agent.id.clone(),
            |(_, a)| a.agent.parent.clone(),
        ) {
            let id = a.agent.id.clone();
            run.take_agent(&id);
            let mut agent = a.agent;
            let scopes = std::mem::take(&mut agent.scopes);
            let orphan = agent.owner_id.is_none() && agent.state == AgentState::ORPHANED;
            self.registry.restore(
                agent,
                a.state_before_suspend,
                a.state_before_orphan,
                orphan.then(|| now + window),
            );
            for scope in &scopes {
                self.scopes.join(scope, &id);
            }
            // Joined or left after the record.
            for (scope, joined) in run.memberships_after(&id, seq) {
                if joined {
                    self.scopes.join(&scope, &id);
                } else {
                    self.scopes.leave(&scope, &id);
                }
            }
            if orphan {
                self.schedule(now + window, Deadline::OrphanExpiry(id));
            }
        }
        tracing::info!(
            sessions = self.sessions.len(),
            connected = connected.len(),
            agents = self.registry.len(),
            scopes = self.scopes.iter_ordered().count(),
            "restored the sessions, agents and scopes the previous live node saved"
        );
        connected
    }

    /// Detaches the restored sessions that were connected when the previous live node
    /// stopped, as after a lost connection (their policy, or the grace period of one).
    pub(crate) fn detach_restored(&mut self, sessions: Vec<SessionId>) {
        for id in sessions {
            let policy = crate::router::sessions::table::policy_when_lost(self.sessions.get(&id));
            self.detach_session(
                &id,
                false,
                &policy,
                crate::router::sessions::recovery::RESTART_REASON,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{json, Value};

    use super::parents_first;
    use crate::protocol::agent::AgentState;
    use crate::protocol::capabilities::Capability;
    use crate::protocol::ids::{AgentId, EventId, ParticipantId, ScopeId, SessionId, Ulid};
    use crate::router::config::RouterConfig;
    use crate::router::core::Router;
    use crate::router::sessions::lifecycle::fold_rows;
    use crate::store::record::StoredRow;

    /// A row of the log: an event of `kind` with `data` at `seq`.
    fn row(seq: u64, kind: &str, data: Value) -> StoredRow {
        StoredRow {
            seq,
            id: EventId(Ulid::random()).to_string(),
            timestamp: 0,
            kind: kind.into(),
            meta: json!({"audience": {"kind": "everyone"}}).to_string(),
            json: json!({"type": kind, "data": data}).to_string(),
        }
    }

    fn saved_scope(seq: u64, id: &str) -> StoredRow {
        row(
            seq,
            "state.saved",
            json!({"key": format!("scope:{id}"), "scope": {"scope": {"id": id}}}),
        )
    }

    /// Alice's session (participant `alice`, attached when saved) at `seq`.
    fn saved_session(seq: u64) -> StoredRow {
        let caps = crate::protocol::capabilities::ParticipantCapabilities::defaults_for(
            crate::protocol::capabilities::ParticipantType::Agent,
        );
        row(
            seq,
            "state.saved",
            json!({"key": "session:s-alice", "session": {
                "id": "s-alice", "participantId": "alice", "participantType": "agent",
                "capabilities": caps, "createdAt": 1, "tokenKey": "k", "attached": true}}),
        )
    }

    /// Alice's agent `bot` at `seq`, active, in `scopes`.
    fn saved_agent(seq: u64, scopes: &[&str]) -> StoredRow {
        row(
            seq,
            "state.saved",
            json!({"key": "agent:bot", "agent": {"agent": {
                "id": "bot", "ownerId": "alice", "state": "active", "scopes": scopes,
                "metadata": {"k": 1}}}}),
        )
    }

    /// Alice connects at `seq` and registers her agent `bot` right after.
    fn alice_registers_bot(seq: u64) -> [StoredRow; 2] {
        [
            row(
                seq,
                "participant_connected",
                json!({"participantId": "alice", "participantType": "agent"}),
            ),
            row(
                seq + 1,
                "agent_registered",
                json!({"agentId": "bot", "ownerId": "alice"}),
            ),
        ]
    }

    /// A cluster node's router that restores `saved` over the log `events` (and closes what
    /// the log left open), as a takeover does.
    fn restored(saved: Vec<StoredRow>, events: Vec<StoredRow>) -> Router {
        let config = RouterConfig {
            node: Some("n1".into()),
            ..RouterConfig::default()
        };
        let mut router = Router::new(Arc::new(config));
        // A live node saves.
        router.start_saving();
        let mut run = fold_rows(events);
        let connected = router.restore_saved(saved, &mut run);
        router.close_previous_run(run);
        router.detach_restored(connected);
        router
    }

    fn logged(router: &Router, kind: &str) -> Vec<Value> {
        router
            .bus
            .log
            .iter_from(0)
            .filter(|e| e.kind.as_str() == kind)
            .map(|e| serde_json::from_str::<Value>(&e.json).unwrap()["data"].clone())
            .collect()
    }

    #[test]
    fn a_scope_deleted_after_its_record_is_not_restored() {
        let created = || row(1, "scope_created", json!({"scopeId": "team"}));
        // The control: the record is the log's last word.
        let r = restored(vec![saved_scope(2, "team")], vec![created()]);
        assert!(r.scopes.contains(&ScopeId::from("team")));
        // Deleted after its record (the node died before the record was dropped).
        let r = restored(
            vec![saved_scope(2, "team")],
            vec![
                created(),
                row(3, "scope_deleted", json!({"scopeId": "team"})),
            ],
        );
        assert!(!r.scopes.contains(&ScopeId::from("team")), "resurrected");
        // Its descendants with it.
        let r = restored(
            vec![saved_scope(2, "team"), saved_scope(4, "sub")],
            vec![
                created(),
                row(
                    3,
                    "scope_created",
                    json!({"scopeId": "sub", "parent": "team"}),
                ),
                row(
                    5,
                    "scope_deleted",
                    json!({"scopeId": "team", "deletedDescendants": ["sub"]}),
                ),
            ],
        );
        assert!(!r.scopes.contains(&ScopeId::from("sub")), "resurrected");
        assert!(!r.scopes.contains(&ScopeId::from("team")), "resurrected");
    }

    #[test]
    fn a_scope_created_without_a_record_is_deleted_in_the_log() {
        // Created twice over (deleted, then created again): the newer creation has no record.
        let r = restored(
            vec![saved_scope(2, "team")],
            vec![
                row(1, "scope_created", json!({"scopeId": "team"})),
                row(3, "scope_deleted", json!({"scopeId": "team"})),
                row(4, "scope_created", json!({"scopeId": "team"})),
                row(5, "scope_created", json!({"scopeId": "other"})),
            ],
        );
        assert!(!r.scopes.contains(&ScopeId::from("team")));
        let deleted: Vec<Value> = logged(&r, "scope_deleted");
        let ids: Vec<&Value> = deleted.iter().map(|d| &d["scopeId"]).collect();
        assert_eq!(ids, [&json!("other"), &json!("team")], "{deleted:?}");
    }

    #[test]
    fn agent_changes_logged_after_its_record_are_restored_not_rolled_back() {
        let lifecycle = || {
            let mut log = vec![
                row(1, "scope_created", json!({"scopeId": "team"})),
                row(2, "scope_created", json!({"scopeId": "ops"})),
            ];
            log.extend(alice_registers_bot(3));
            log
        };
        let saved = || {
            vec![
                saved_scope(5, "team"),
                saved_scope(6, "ops"),
                saved_session(7),
                saved_agent(8, &["team"]),
            ]
        };
        // The control: nothing after the records.
        let r = restored(saved(), lifecycle());
        let bot = AgentId::from("bot");
        assert_eq!(r.scopes.of_agent(&bot), [ScopeId::from("team")]);
        // State, metadata, overrides, memberships and alice's permissions changed after them.
        let mut events = lifecycle();
        events.extend([
            row(9, "agent_state_changed", json!({"agentId": "bot", "previousState": "active", "newState": "busy"})),
            row(10, "agent.metadata.changed", json!({"agentId": "bot", "changes": {"k": 2}, "metadata": {"k": 2}})),
            row(11, "permissions_agent_updated", json!({"agentId": "bot", "changes": {"canSee": {"agents": "direct"}}, "effectivePermissions": {}, "updatedBy": "ops"})),
            row(12, "scope_member_left", json!({"scopeId": "team", "agentId": "bot"})),
            row(13, "scope_member_joined", json!({"scopeId": "ops", "agentId": "bot"})),
            row(14, "permissions_client_updated", json!({"clientId": "alice", "changes": {}, "effectivePermissions": {"messaging": {"canSend": false}}, "changedBy": "ops", "updatedBy": "ops"})),
        ]);
        let r = restored(saved(), events);
        let agent = r.registry.get(&bot).expect("restored").agent().clone();
        assert_eq!(agent.state, AgentState::ORPHANED, "orphaned by the detach");
        let before = r.registry.get(&bot).unwrap().state_before_orphan().cloned();
        assert_eq!(
            before,
            Some(AgentState::BUSY),
            "the state the log says last"
        );
        assert_eq!(
            agent.metadata.as_ref().map(|m| m.get().to_owned()),
            Some(r#"{"k":2}"#.into())
        );
        assert_eq!(
            agent.permission_overrides.map(Value::Object),
            Some(json!({"canSee": {"agents": "direct"}}))
        );
        assert_eq!(r.scopes.of_agent(&bot), [ScopeId::from("ops")]);
        let s = r
            .sessions
            .get(&SessionId::from("s-alice"))
            .expect("restored");
        assert!(
            !s.capabilities().has(Capability::CanSend),
            "the revocation holds"
        );
        // Several changes of one field: the last one after the record, and a change before
        // the record that a later one superseded is not applied either.
        let mut events = lifecycle();
        events.extend([
            row(
                9,
                "agent_state_changed",
                json!({"agentId": "bot", "previousState": "active", "newState": "busy"}),
            ),
            row(
                10,
                "agent_state_changed",
                json!({"agentId": "bot", "previousState": "busy", "newState": "idle"}),
            ),
            row(
                11,
                "scope_member_joined",
                json!({"scopeId": "ops", "agentId": "bot"}),
            ),
            row(
                12,
                "scope_member_left",
                json!({"scopeId": "ops", "agentId": "bot"}),
            ),
        ]);
        let r = restored(saved(), events);
        let rec = r.registry.get(&bot).unwrap();
        assert_eq!(rec.state_before_orphan().cloned(), Some(AgentState::IDLE));
        assert_eq!(r.scopes.of_agent(&bot), [ScopeId::from("team")]);
        // Changes of an earlier registration of the same id are not applied to a newer record.
        let mut events = lifecycle();
        events.insert(
            3,
            row(
                2,
                "agent_state_changed",
                json!({"agentId": "bot", "previousState": "active", "newState": "busy"}),
            ),
        );
        let r = restored(saved(), events);
        let rec = r.registry.get(&bot).unwrap();
        assert_eq!(rec.state_before_orphan().cloned(), Some(AgentState::ACTIVE));
        let _ = ParticipantId::from("alice");
    }

    #[test]
    fn a_takeovers_records_are_written_several_to_a_row_drops_among_them() {
        let mut events = vec![
            row(1, "scope_created", json!({"scopeId": "old"})),
            row(3, "scope_deleted", json!({"scopeId": "old"})),
            row(4, "scope_created", json!({"scopeId": "team"})),
        ];
        events.extend(alice_registers_bot(5));
        let saved = vec![
            saved_scope(2, "old"),
            saved_scope(7, "team"),
            saved_session(8),
            saved_agent(9, &["team"]),
        ];
        let mut r = restored(saved, events);
        r.save_changed();
        assert!(
            logged(&r, "state.dropped").is_empty(),
            "drops go in the rows"
        );
        let rows = logged(&r, "state.saved");
        let keys: Vec<Vec<(String, bool)>> = rows
            .iter()
            .map(|d| {
                d["records"]
                    .as_array()
                    .expect("records")
                    .iter()
                    .map(|r| {
                        let body = r.get("session").or(r.get("agent")).or(r.get("scope"));
                        (r["key"].as_str().unwrap().to_owned(), body.is_some())
                    })
                    .collect()
            })
            .collect();
        // The stale record's drop (at the restore), then what the takeover changed: the
        // restored scope, alice's session and her agent, orphaned, in one row.
        assert_eq!(keys.len(), 2, "{rows:?}");
        assert_eq!(keys[0], [("scope:old".to_owned(), false)], "{rows:?}");
        let mut changed = keys[1].clone();
        changed.sort();
        assert_eq!(
            changed,
            [
                ("agent:bot".to_owned(), true),
                ("scope:team".to_owned(), true),
                ("session:s-alice".to_owned(), true)
            ],
            "{rows:?}"
        );
        let agent = rows[1]["records"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == json!("agent:bot"))
            .unwrap();
        assert_eq!(agent["agent"]["agent"]["state"], json!("orphaned"));
        // Nothing changed since: nothing written again.
        r.save_changed();
        assert_eq!(logged(&r, "state.saved").len(), 2);
    }

    #[test]
    fn parents_come_before_their_children_whatever_the_order_saved() {
        // (id, parent): c under b under a; d's parent is not among them; e alone.
        let items = vec![
            ("c", Some("b")),
            ("d", Some("gone")),
            ("b", Some("a")),
            ("e", None),
            ("a", None),
        ];
        let order: Vec<&str> = parents_first(items, |t| t.0, |t| t.1)
            .into_iter()
            .map(|t| t.0)
            .collect();
        let at = |id: &str| order.iter().position(|x| *x == id).unwrap();
        assert_eq!(order.len(), 5);
        assert!(at("a") < at("b") && at("b") < at("c"), "{order:?}");
        // A cycle (never written by a router) still comes out whole.
        let cycle = vec![("x", Some("y")), ("y", Some("x"))];
        assert_eq!(parents_first(cycle, |t| t.0, |t| t.1).len(), 2);
    }
}
