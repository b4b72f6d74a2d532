//! Tasks nobody will answer: those a restart interrupted (`recovery.rs` finds them and asks
//! [`Core::end_if_interrupted`]) and those whose message another cluster node's gateway sent
//! before that node died ([`watch_other_gateways`], [`Core::end_if_orphaned`]).
//!
//! Owns the check that such a task may be ended ([`EndWhen`]: still `submitted` or `working`,
//! and still as the condition says on the task as read), and ending it `failed` with a status
//! message that says why ([`end_failed`], run by the task writer in order with the task's
//! other changes, so a follow-up, a cancel or the agent's reply that came first is never
//! overwritten).

use std::sync::{Arc, Weak};

use futures::StreamExt;

use crate::gateway::a2a::record::MapTask;
use crate::gateway::a2a::wire::{Message, TaskState};
use crate::protocol::agent::PresenceStatus;

use super::books::Books;
use super::{is_gateway_agent, Core, SENDER_GONE};

/// Why a task in flight may be ended, checked on the task as the writer reads it.
#[derive(Debug, Clone)]
pub(super) enum EndWhen {
    /// Last changed before `started` (Unix ms, the gateway's start) and its agent is not back
    /// (or another node's gateway, now gone, sent its message).
    Interrupted {
        /// When this gateway was made.
        started: u64,
    },
    /// Its message was sent by `gateway`, another node's gateway agent, now gone.
    Orphaned {
        /// That gateway agent's id.
        gateway: String,
    },
}

impl Core {
    /// Ends task `id` with the status message `reason` if it is still as the previous run left
    /// it (last changed before `started`, `submitted` or `working`) and its agent is not back
    /// (or its message was sent by another node's gateway, now gone). Whether it ended it.
    pub(super) async fn end_if_interrupted(&self, id: &str, started: u64, reason: &str) -> bool {
        let when = EndWhen::Interrupted { started };
        self.writer.end(id, reason.to_owned(), when).await
    }

    /// Ends task `id` if it still waits (`submitted`, `working`) for a reply that `gateway`,
    /// another node's gateway agent now gone, was to receive: that reply can reach no gateway
    /// that would apply it. Whether it ended it.
    pub(super) async fn end_if_orphaned(&self, id: &str, gateway: &str) -> bool {
        let node = gateway.split_once('@').map_or("?", |(_, n)| n);
        let reason =
            format!("{SENDER_GONE} (node {node}, whose gateway sent the agent the message)");
        let when = EndWhen::Orphaned {
            gateway: gateway.to_owned(),
        };
        self.writer.end(id, reason, when).await
    }
}

/// Ends task `id` `failed` with the status message `reason` if it is still in flight
/// (`submitted`, `working`) and `when` holds for what was read. Whether it ended it.
pub(super) async fn end_failed(books: &Books, id: &str, reason: &str, when: EndWhen) -> bool {
    #[derive(serde::Deserialize)]
    struct Wrapped {
        task: crate::gateway::a2a::recovery::Times,
    }
    let Ok(text) = books.get(id).await else {
        return false;
    };
    let Some(mut record) = MapTask::from_wrapped(&text).and_then(|t| t.record()) else {
        return false;
    };
    if !record.state.awaits_agent() {
        return false;
    }
    let still = match &when {
        EndWhen::Interrupted { started } => {
            serde_json::from_str::<Wrapped>(&text).is_ok_and(|w| w.task.updated_at < *started)
                && (!books.agent_live(&record.agent).await || books.sender_gone(&record).await)
        }
        EndWhen::Orphaned { gateway } => {
            record.gateway.as_deref() == Some(gateway.as_str()) && books.sender_gone(&record).await
        }
    };
    if !still {
        return false;
    }
    let message = Message::agent_text(reason, id, &record.context_id);
    record.set_state(TaskState::Failed, Some(message));
    match books.write(id, &record, None).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(task = %id, error = %e, reason, "a2a gateway: a task in flight could not be ended");
            false
        }
    }
}

/// Follows `events` (the gateway agents' `agent_unregistered` and `agent.presence.changed`)
/// for the live node's gateway: when another node's gateway agent goes (its node died), the
/// tasks waiting on it end ([`Core::end_if_orphaned`]). Ends with the subscription or the
/// gateway.
pub(super) async fn watch_other_gateways(
    core: Weak<Core>,
    mut events: crate::client::Subscription,
) {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Gone {
        agent_id: String,
        #[serde(default)]
        status: Option<PresenceStatus>,
    }
    while let Some(envelope) = events.next().await {
        let Some(gone) = envelope
            .event
            .data
            .as_ref()
            .and_then(|d| serde_json::from_str::<Gone>(d.get()).ok())
        else {
            continue;
        };
        let offline = gone.status.is_none_or(|s| s == PresenceStatus::Offline);
        // Another node's (`a2a-gateway@<node>`): this gateway's own never goes while it runs.
        if !offline || !is_gateway_agent(&gone.agent_id) || !gone.agent_id.contains('@') {
            continue;
        }
        let Some(core) = core.upgrade() else { return };
        tokio::spawn(end_waiting_on(core, gone.agent_id));
    }
}

/// Ends the tasks that wait on `gateway`, a gone node's gateway agent.
async fn end_waiting_on(core: Arc<Core>, gateway: String) {
    let waiting = crate::gateway::a2a::recovery::waiting_on(core.books.first(), &gateway).await;
    let mut ended = 0;
    for id in waiting {
        if core.end_if_orphaned(&id, &gateway).await {
            ended += 1;
        }
    }
    if ended > 0 {
        tracing::info!(gateway = %gateway, tasks = ended, "a2a gateway: ended the tasks another node's gateway was waiting on");
    }
}
