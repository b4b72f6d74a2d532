//! [`Router::metrics_snapshot`]: every part's tables read once, at scrape time.

use std::collections::BTreeMap;

use crate::metrics::RouterGauges;
use crate::protocol::capabilities::ParticipantType;
use crate::router::core::Router;
use crate::router::metrics::counters::EXIT_REASONS;
use crate::router::sessions::table::Transport;

fn participant_label(kind: ParticipantType) -> &'static str {
    match kind {
        ParticipantType::Agent => "agent",
        ParticipantType::Client => "client",
        ParticipantType::System => "system",
        ParticipantType::Gateway => "gateway",
    }
}

impl Router {
    /// Everything `GET /metrics` reports about the router, at this moment.
    pub fn metrics_snapshot(&self) -> RouterGauges {
        let mut connections = [0u64; Transport::ALL.len()];
        let mut outbox_frames = 0u64;
        let mut outbox_frames_max = 0u64;
        let mut pending_messages = 0u64;
        for (_, conn) in self.conns.iter() {
            connections[conn.transport() as usize] += 1;
            let depth = conn.outbox().depth() as u64;
            outbox_frames += depth;
            outbox_frames_max = outbox_frames_max.max(depth);
            pending_messages += conn.pending_len() as u64;
        }
        let mut sessions: BTreeMap<(&'static str, &'static str), u64> = BTreeMap::new();
        for session in self.sessions.iter() {
            let transport = session
                .conn()
                .and_then(|c| self.conns.get(&c))
                .map_or("detached", |c| c.transport().as_str());
            *sessions
                .entry((transport, participant_label(session.kind())))
                .or_default() += 1;
        }
        let mut agents: BTreeMap<&'static str, u64> = BTreeMap::new();
        for rec in self.registry.iter_ordered(None) {
            *agents
                .entry(rec.agent().state.standard().unwrap_or("custom"))
                .or_default() += 1;
        }
        let bus = self.bus.counts();
        let per_transport = |counts: &[u64]| {
            Transport::ALL
                .iter()
                .zip(counts)
                .map(|(t, n)| (t.as_str(), *n))
                .collect()
        };
        RouterGauges {
            connections: per_transport(&connections),
            connections_opened: per_transport(&self.counters.connections_opened),
            sessions: sessions.into_iter().collect(),
            agents: agents.into_iter().collect(),
            events_appended: self.counters.events_appended,
            event_deliveries: bus.deliveries,
            message_deliveries: self.counters.messages_queued,
            outbox_frames,
            outbox_frames_max,
            pending_messages,
            subscriptions: ["pending", "live", "paused"]
                .into_iter()
                .zip(bus.by_state)
                .collect(),
            subscription_overflows: bus.overflows,
            processes: self.supervised.len() as u64,
            process_exits: EXIT_REASONS
                .iter()
                .copied()
                .zip(self.counters.exits)
                .collect(),
            process_restarts: self.counters.restarts,
            checkpoints: self.trajectories.len() as u64,
            tasks: self.tasks.len() as u64,
            conversations: self.mailboxes.len() as u64,
            log_next_seq: self.bus.log.next_seq(),
            tables: {
                let t = self.table_sizes();
                [
                    ("timers", t.timers),
                    ("session_index", t.session_index),
                    ("agent_index", t.agent_index),
                    ("scope_members", t.scope_members),
                    ("offline_agents", t.offline_agents),
                    ("offline_messages", t.offline_messages),
                    ("reply_index", t.reply_index),
                    ("identities", t.identities),
                    ("content_requests", t.content_requests),
                    ("cached_tasks", t.cached_tasks),
                    ("cached_checkpoints", t.cached_checkpoints),
                    ("cached_conversations", t.cached_conversations),
                    ("cached_turns", t.cached_turns),
                    ("cached_quota_counts", t.cached_quota_counts),
                    ("kept_loads", t.loads),
                ]
                .into_iter()
                .map(|(k, v)| (k, v as u64))
                .collect()
            },
            // Every dialled peer, 0 included, so a dashboard sees the peer before a message.
            federation_queued: {
                let waiting = self.federation.outbound.lens();
                self.config
                    .federation
                    .outbound
                    .iter()
                    .map(|p| {
                        let n = waiting.iter().find(|(q, _)| q == p).map_or(0, |(_, n)| *n);
                        (p.clone(), n as u64)
                    })
                    .collect()
            },
        }
    }
}
