//! Messages still queued when the previous run stopped (issue 30): a `message.queued` for an
//! agent that was away, with no `message_delivered` or `message_failed` for that agent after
//! it. The queue itself lives in memory, so after a restart (clean or kill -9) it is rebuilt
//! from the durable log: each such message is read back from its `message_sent` event (which
//! carries the message) and kept again for its agent, in the order it was queued.
//!
//! The agents themselves did not survive the restart (`sessions::recovery` ends them), so the
//! rebuilt queue waits for the agent id to be registered again, which only its owner principal
//! may do (`router::identities`): then it is delivered, once, in order. What is not claimed
//! within the resume window after start-up fails (`recipient_gone`), and a message whose
//! `message_sent` retention already removed fails at once (`recipient_queue_lost`): every queued
//! message is delivered or reported, never silently dropped.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde::Deserialize;

use crate::protocol::event::EventType;
use crate::protocol::ids::{AgentId, EventId, MessageId};
use crate::protocol::json::RawJson;
use crate::protocol::message::Message;
use crate::protocol::methods::federation::{Federated, FederationRouting};
use crate::store::record::{EventRecord, StoredRow};
use crate::store::{EventStore, StoreError};

use crate::router::messaging::state::Outgoing;

/// Rows read per store request while folding.
const PAGE: usize = 10_000;

/// One queued message of the previous run, for one agent.
#[derive(Debug)]
pub(crate) struct StillQueued {
    /// The agent it waits for.
    pub(crate) agent: AgentId,
    /// The message as it was kept, or `None` when its `message_sent` is gone from the log.
    pub(crate) out: Option<Arc<Outgoing>>,
    /// Its id and sender (to report a lost one).
    pub(crate) message_id: MessageId,
    pub(crate) from: String,
    /// Who saw its `message.queued` (a lost one's failure goes to the same audience).
    pub(crate) audience: crate::store::record::Audience,
    /// Passing through to another system: the routing its envelope had from here.
    pub(crate) federation: Option<FederationRouting>,
}

/// What the previous run left to do with messages.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    /// Its queued messages, in the order they were queued.
    pub(crate) queued: Vec<StillQueued>,
    /// The federated messages it delivered (their ids `<source>:message:<id>`), newest last, at
    /// most `federation::SEEN_CAP`: a peer sending one again is not delivered twice.
    pub(crate) federated: Vec<MessageId>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Outcome {
    message_id: String,
    #[serde(default)]
    from: String,
    #[serde(default)]
    recipient: Option<String>,
    #[serde(default)]
    recipients: Option<Vec<String>>,
    #[serde(default)]
    delivered_to: Option<Vec<String>>,
    #[serde(default)]
    federation: Option<FederationRouting>,
}

#[derive(Deserialize)]
struct Event<T> {
    data: T,
}

#[derive(Deserialize)]
struct Sent {
    message: Box<serde_json::value::RawValue>,
}

struct Queued {
    seq: u64,
    federation: Option<FederationRouting>,
    sent: Option<EventId>,
    from: String,
    audience: crate::store::record::Audience,
}

/// The messages the previous run left queued, in the order they were queued, and the
/// federated messages it delivered.
///
/// # Errors
/// The store could not be read. Unreadable rows are skipped with a warning.
pub(crate) async fn still_queued(store: &dyn EventStore) -> Result<Recovered, StoreError> {
    let kinds: Vec<String> = [
        EventType::MessageQueued,
        EventType::MessageDelivered,
        EventType::MessageFailed,
    ]
    .iter()
    .map(|k| k.as_str().to_owned())
    .collect();
    let mut pending: HashMap<(String, String), Queued> = HashMap::new();
    let mut federated: VecDeque<MessageId> = VecDeque::new();
    let mut from = 0;
    loop {
        let rows = store.read_kinds(kinds.clone(), from, PAGE).await?;
        let Some(last) = rows.last() else { break };
        from = last.seq + 1;
        let full = rows.len() == PAGE;
        for row in rows {
            fold(&mut pending, &mut federated, row);
        }
        if !full {
            break;
        }
    }
    let mut pending: Vec<((String, String), Queued)> = pending.into_iter().collect();
    pending.sort_by_key(|(_, q)| q.seq);
    let wanted: Vec<EventId> = pending.iter().filter_map(|(_, q)| q.sent).collect();
    let mut messages: HashMap<EventId, Arc<Outgoing>> = HashMap::new();
    if !wanted.is_empty() {
        for row in store.read_ids(wanted).await? {
            if let Some((id, out)) = outgoing_of(row) {
                messages.insert(id, out);
            }
        }
    }
    let queued = pending
        .into_iter()
        .map(|((message_id, agent), q)| StillQueued {
            agent: AgentId::from(agent.as_str()),
            out: q.sent.and_then(|s| messages.get(&s).cloned()),
            message_id: MessageId::from(message_id.as_str()),
            from: q.from,
            audience: q.audience,
            federation: q.federation,
        })
        .collect();
    Ok(Recovered {
        queued,
        federated: federated.into(),
    })
}

fn fold(
    pending: &mut HashMap<(String, String), Queued>,
    federated: &mut VecDeque<MessageId>,
    row: StoredRow,
) {
    let rec = match EventRecord::from_row(row) {
        Ok(rec) => rec,
        Err(e) => {
            tracing::warn!(error = %e, "skipping an unreadable event while recovering queues");
            return;
        }
    };
    let Ok(event) = serde_json::from_str::<Event<Outcome>>(&rec.json) else {
        return;
    };
    let o = event.data;
    // A federated message delivered here (or passed on): its outcome's id carries its source.
    if rec.kind != EventType::MessageQueued && Federated::Message.split(&o.message_id).is_some() {
        federated.push_back(MessageId::from(o.message_id.as_str()));
        if federated.len() > crate::router::federation::SEEN_CAP {
            federated.pop_front();
        }
    }
    let mut names: Vec<String> = o.recipient.into_iter().collect();
    names.extend(o.recipients.unwrap_or_default());
    names.extend(o.delivered_to.unwrap_or_default());
    for agent in names {
        let key = (o.message_id.clone(), agent);
        if rec.kind == EventType::MessageQueued {
            pending.insert(
                key,
                Queued {
                    seq: rec.seq,
                    federation: o.federation.clone(),
                    sent: rec.caused_by.first().copied(),
                    from: o.from.clone(),
                    audience: rec.audience.clone(),
                },
            );
        } else {
            pending.remove(&key);
        }
    }
}

/// The kept message a `message_sent` row describes.
fn outgoing_of(row: StoredRow) -> Option<(EventId, Arc<Outgoing>)> {
    let rec = EventRecord::from_row(row).ok()?;
    let sent = rec.id?;
    let event: Event<Sent> = serde_json::from_str(&rec.json).ok()?;
    let message: Message = serde_json::from_str(event.data.message.get()).ok()?;
    let view = message.meta_view();
    let correlation = view.correlation_id.clone();
    let trace = message
        .meta
        .as_ref()
        .and_then(crate::protocol::trace::TraceContext::from_meta);
    let payload_json: Option<RawJson> = message.payload.clone();
    let out = Outgoing {
        id: message.id.clone(),
        delivered_correlation: if view.expects_response {
            None
        } else {
            correlation.clone()
        },
        correlation,
        from: Arc::from(message.from.as_str()),
        to: message.to.clone(),
        timestamp: message.timestamp,
        payload_json,
        frame: crate::router::messaging::ops::message_frame_of(event.data.message.get()),
        message_json: event.data.message,
        sent,
        keys: rec.keys,
        audience: rec.audience,
        trace,
    };
    Some((sent, Arc::new(out)))
}

impl crate::router::core::Router {
    /// Keeps again what the previous run left queued (see the module docs); called once at
    /// start-up, after the previous run's agents were ended.
    pub(crate) async fn recover_queues(&mut self) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let Recovered { queued, federated } = match still_queued(&*store).await {
            Ok(q) => q,
            Err(e) => {
                tracing::error!(error = %e, "could not read the previous run's queued messages");
                return;
            }
        };
        for id in federated {
            self.federation.seen.insert(id);
        }
        if queued.is_empty() {
            return;
        }
        tracing::info!(
            messages = queued.len(),
            "keeping the previous run's queued messages for their agents"
        );
        let until = std::time::Instant::now() + self.config.resume_window;
        let mut agents = Vec::new();
        for q in queued {
            // For another system: back in its peer's queue, for as long as it takes.
            if let (Some(out), Some((system, agent))) = (
                q.out.as_ref(),
                self.config.federation.remote_agent(q.agent.as_str()),
            ) {
                let envelope = self.envelope_for(out, system, agent, q.federation.clone());
                let system = system.to_owned();
                if let Err(reason) =
                    self.queue_for_peer(&system, q.agent.as_str(), out, envelope, None)
                {
                    self.report_failed(out, q.agent.as_str(), reason);
                }
                continue;
            }
            match q.out {
                Some(out) => {
                    if let Err(reason) = self.messaging.keep(&q.agent, &out) {
                        self.report_failed(&out, q.agent.as_str(), reason);
                    } else if !agents.contains(&q.agent) {
                        agents.push(q.agent);
                    }
                }
                None => self.report_lost(&q),
            }
        }
        for agent in agents {
            self.schedule(until, crate::router::timers::Deadline::QueueExpiry(agent));
        }
    }

    /// A recovered queue's wait is over: what its agent has not taken fails (`recipient_gone`),
    /// unless the agent is back and merely orphaned again (its own grace period decides then).
    pub(crate) fn expire_recovered_queue(&mut self, agent: &AgentId) {
        if !self.registry.contains(agent) {
            self.drop_offline(agent);
        }
    }

    /// Reports a queued message whose `message_sent` retention removed: it cannot be delivered.
    fn report_lost(&mut self, q: &StillQueued) {
        use crate::protocol::event::MessageFailedData;
        use crate::protocol::jsonrpc::ErrorCode;
        let data = crate::router::core::to_json(&MessageFailedData {
            message_id: q.message_id.clone(),
            from: q.from.clone(),
            to: RawJson::from(serde_json::json!({ "agent": q.agent })),
            recipient: Some(q.agent.to_string()),
            recipients: None,
            recipient_count: None,
            reason: "recipient_queue_lost".into(),
            code: ErrorCode::DELIVERY_FAILED.0,
        });
        self.emit(crate::router::events::log::EventDraft {
            kind: EventType::MessageFailed,
            source: Some(Arc::from(q.from.as_str())),
            data,
            caused_by: Vec::new(),
            keys: crate::router::events::log::FilterKeys::default(),
            audience: q.audience.clone(),
        });
    }
}
