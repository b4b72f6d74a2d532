//! Handing sessions, agents and scopes over from one live node of a cluster to the next.
//!
//! Owns the *saved image* of those three tables and its two halves:
//!
//! - **Saving** (the live node): each table records which ids changed
//!   ([`Changes`](crate::router::changes::Changes)); after
//!   every call, and after every batch of timers and transport events, [`Router::save_changed`]
//!   writes the newest record of each changed one as an internal `state.saved` event
//!   (`state.dropped` once it is gone), which the log keeps and no subscriber is shown. A
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
//! With stream limits (`RouterConfig::saved_refresh`), the live node also writes a record
//! again before the limits would delete it ([`Router::refresh_saved`]), so the stream always
//! holds the newest record of every key, for a standby that starts later.
//!
//! Saved: the sessions of network clients (directly or through a standby's relay session)
//! and their agents; not the sessions of in-process links (the gateways, which start again on
//! the new node) nor of supervised processes (which died with their node). A record is
//! trusted only when it is newer than the log's last lifecycle event of its participant or
//! agent (a node killed between an event and its record leaves the record behind: that
//! participant or agent is ended as after a restart, `sessions::recovery`). Only a router
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

/// `data` of a `state.saved` (one of the three records) or `state.dropped` (the key only).
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

/// The `data` of a `state.dropped`.
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

impl Router {
    /// Writes the records of what changed since the last call (see the module doc).
    pub(crate) fn save_changed(&mut self) {
        let Some(mut saver) = self.handover.take() else {
            return;
        };
        for id in self.scopes.changed.take() {
            let record = self.scopes.get(&id).map(|r| Record {
                key: scope_key(&id),
                scope: Some(SavedScope {
                    scope: r.scope().clone(),
                    creator: r.creator().cloned(),
                }),
                ..Record::default()
            });
            self.put(&mut saver, scope_key(&id), record);
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
            self.put(&mut saver, session_key(&id), record);
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
            self.put(&mut saver, agent_key(&id), record);
        }
        self.handover = Some(saver);
    }

    /// Saves `record` under `key` if it changed, or drops the key (`None`) if it was saved.
    fn put(&mut self, saver: &mut Saver, key: String, record: Option<Record>) {
        let (kind, data) = match record {
            Some(record) => {
                let data = crate::router::core::to_json(&record);
                let d = digest(&data);
                if !saver.changed(key, d, self.bus.log.next_seq()) {
                    return;
                }
                (EventType::StateSaved, data)
            }
            None => {
                if !saver.forget(&key) {
                    return;
                }
                (EventType::StateDropped, dropped(key))
            }
        };
        self.emit_record(kind, data);
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
        self.save_changed();
    }

    /// Logs one internal record (`state.saved` / `state.dropped`): shown to nobody.
    fn emit_record(&mut self, kind: EventType, data: String) {
        self.emit(EventDraft {
            kind,
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
        run: &mut crate::router::sessions::recovery::PreviousRun,
    ) -> Vec<SessionId> {
        if saved.is_empty() {
            return Vec::new();
        }
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
                scopes.push(s);
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
            self.scopes.restore(s.scope, s.creator);
        }

        // Sessions newer than their participant's last lifecycle event.
        let mut connected = Vec::new();
        // Records not restored are dropped, so that the stream's fold forgets them.
        let mut stale = Vec::new();
        for (seq, s) in sessions {
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
        for key in stale {
            self.emit_record(EventType::StateDropped, dropped(key));
        }
        let agents: Vec<SavedAgent> = agents.into_iter().map(|(_, a)| a).collect();
        for a in parents_first(agents, |a| a.agent.id.clone(), |a| a.agent.parent.clone()) {
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
    use super::parents_first;

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
