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

use std::collections::HashMap;
use std::sync::Arc;

use crate::protocol::capabilities::ParticipantType;
use crate::protocol::event::{AgentUnregisteredData, EventType, ParticipantDisconnectedData};
use crate::protocol::ids::{AgentId, EventId, ParticipantId};
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
#[derive(Debug, Clone)]
struct OpenParticipant {
    seq: u64,
    id: ParticipantId,
    kind: ParticipantType,
}

/// An agent still registered at the end of the previous run.
#[derive(Debug, Clone)]
struct OpenAgent {
    seq: u64,
    id: AgentId,
    owner: Option<ParticipantId>,
    audience: Audience,
    keys: FilterKeys,
}

/// What the previous run left open, oldest first.
#[derive(Debug, Default)]
pub struct PreviousRun {
    participants: Vec<OpenParticipant>,
    agents: Vec<OpenAgent>,
    /// The seq of the last lifecycle event of every participant and agent id the log holds.
    last_participant: HashMap<String, u64>,
    last_agent: HashMap<String, u64>,
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
        let before = self.participants.len();
        self.participants.retain(|p| &p.id != id);
        self.participants.len() != before
    }

    /// Takes the agent out of those left registered.
    pub fn take_agent(&mut self, id: &AgentId) {
        self.agents.retain(|a| &a.id != id);
    }
}

const KINDS: [EventType; 4] = [
    EventType::ParticipantConnected,
    EventType::ParticipantDisconnected,
    EventType::AgentRegistered,
    EventType::AgentUnregistered,
];

/// Folds the lifecycle events of everything `store` holds.
///
/// # Errors
/// The store could not be read. Unreadable rows are skipped with a warning.
pub async fn previous_run(store: &dyn EventStore) -> Result<PreviousRun, StoreError> {
    let kinds: Vec<String> = KINDS.iter().map(|k| k.as_str().to_owned()).collect();
    let mut folding = Folding::default();
    let mut from = 0;
    loop {
        let rows = store.read_kinds(kinds.clone(), from, PAGE).await?;
        let Some(last) = rows.last() else { break };
        from = last.seq + 1;
        let full = rows.len() == PAGE;
        for row in rows {
            let rec = match EventRecord::from_row(row) {
                Ok(rec) => rec,
                Err(e) => {
                    tracing::warn!(error = %e, "skipping an unreadable event while recovering");
                    continue;
                }
            };
            folding.fold(rec);
        }
        if !full {
            break;
        }
    }
    let mut run = PreviousRun {
        participants: folding.participants.into_values().collect(),
        agents: folding.agents.into_values().collect(),
        last_participant: folding.last_participant,
        last_agent: folding.last_agent,
    };
    run.participants.sort_by_key(|p| p.seq);
    run.agents.sort_by_key(|a| a.seq);
    Ok(run)
}

/// The lifecycle events folded so far: who is still open, and the seq of each id's last
/// lifecycle event.
#[derive(Default)]
struct Folding {
    participants: HashMap<String, OpenParticipant>,
    agents: HashMap<String, OpenAgent>,
    last_participant: HashMap<String, u64>,
    last_agent: HashMap<String, u64>,
}

impl Folding {
    fn fold(&mut self, rec: EventRecord) {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(&rec.json) else {
            return;
        };
        let data = &event["data"];
        let text = |k: &str| data[k].as_str().map(str::to_owned);
        let (field, last) = match rec.kind {
            EventType::ParticipantConnected | EventType::ParticipantDisconnected => {
                ("participantId", &mut self.last_participant)
            }
            EventType::AgentRegistered | EventType::AgentUnregistered => {
                ("agentId", &mut self.last_agent)
            }
            _ => return,
        };
        let Some(id) = text(field) else { return };
        last.insert(id.clone(), rec.seq);
        match rec.kind {
            EventType::ParticipantConnected => {
                let Ok(kind) =
                    serde_json::from_value::<ParticipantType>(data["participantType"].clone())
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
                self.agents.insert(
                    id.clone(),
                    OpenAgent {
                        seq: rec.seq,
                        id: AgentId::from(id.as_str()),
                        owner: text("ownerId").map(|o| ParticipantId::from(o.as_str())),
                        audience: rec.audience,
                        keys: rec.keys,
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
            // The writer is alive and owns what is open; the node that takes over closes it.
            return;
        }
        let saved = std::mem::take(&mut self.saved_at_open);
        match previous_run(&*store).await {
            Ok(mut run) => {
                // Cluster mode: what the previous live node saved comes back (router::handover).
                let connected = self.restore_saved(saved, &mut run);
                self.close_previous_run(run);
                self.detach_restored(connected);
            }
            Err(e) => {
                tracing::error!(error = %e, "could not read the previous run's lifecycle events")
            }
        }
        self.recover_queues().await;
        self.flush_store();
    }

    /// Emits the events that end what the previous run left open.
    pub(crate) fn close_previous_run(&mut self, run: PreviousRun) {
        if run.is_empty() {
            return;
        }
        tracing::info!(
            participants = run.participants.len(),
            agents = run.agents.len(),
            "closing out what the previous run left connected"
        );
        let mut disconnected: HashMap<ParticipantId, EventId> = HashMap::new();
        for p in run.participants {
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
        for a in run.agents {
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
