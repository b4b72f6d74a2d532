//! Tasks nobody will answer: those a restart interrupted (`recovery.rs` finds them and asks
//! [`Core::end_if_interrupted`]) and those whose message another cluster node's gateway sent
//! before that node died ([`Core::watch_other_gateways`], [`Core::end_if_orphaned`]).
//!
//! Owns finding them and why each ends (the status messages, [`SENDER_GONE`]); the ending
//! itself is a change like any other, applied by the task writer (`writer.rs`, `EndWhen`: the
//! task is read again there, in order with its other changes, and ended `failed` only if it
//! still waits and the condition still holds, so a follow-up, a cancel or the agent's reply
//! that came first is never overwritten).

use std::sync::{Arc, Weak};

use futures::StreamExt;

use crate::protocol::agent::PresenceStatus;

use super::ids::is_gateway_agent;
use super::writer::EndWhen;
use super::Core;

/// The status message of a task ended because the cluster node whose gateway sent its agent
/// the message died before the agent answered (its reply would go to that gateway).
pub(super) const SENDER_GONE: &str =
    "the router node that sent the task's message stopped before the agent answered";

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

    /// Follows `events` (the gateway agents' `agent_unregistered` and
    /// `agent.presence.changed`) for the live node's gateway: when another node's gateway agent
    /// goes (its node died), the tasks waiting on it end ([`Core::end_if_orphaned`]). Ends with
    /// the subscription or the gateway.
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
            tokio::spawn(Core::end_waiting_on(core, gone.agent_id));
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
}
