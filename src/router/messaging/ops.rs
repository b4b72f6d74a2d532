//! `map/send`: address resolution, delivery to connections, and the message events.
//!
//! Resolution rules (methods.md "Address → recipients", REC column) and the choices recorded in
//! `docs/compatibility.md`:
//! - `{agent: X}` reaches agent X's owning connection; if no agent has that id but a
//!   participant does, it reaches that participant (this is how `AgentConnection.reply()`
//!   reaches a client: `reply` addresses `{agent: original.from}`).
//! - Unknown explicit agents, scopes and participants are errors (2001/2002/2000) unless the
//!   router runs with `strict_recipients = false`.
//! - Scope, role and broadcast exclude the sending agent; recipients are de-duplicated, and a
//!   connection gets one `map/message` however many of its agents were addressed.
//! - A recipient that is offline (orphaned agent, detached session) or whose connection is
//!   backlogged beyond its bounded queue is not delivered to: it is left out of `delivered` and
//!   a `message_failed` event says why. Nothing is dropped silently.
//!
//! Events: `message_sent` first, then one `message_delivered` per recipient with
//! `causedBy: [message_sent]`. `message_delivered.data.correlationId` is left out when the
//! message expects a response, so the SDK's `client.request()` does not mistake its own request
//! for the reply (reference-server.md §1.1 #15).

use std::sync::Arc;

use serde::Serialize;
use serde_json::value::RawValue;

use crate::protocol::capabilities::Capability;
use crate::protocol::event::{EventType, MessageFailedData, MessageQueuedData};
use crate::protocol::ids::{now_ms, AgentId, EventId, MessageId, ScopeId};
use crate::protocol::json::RawJson;
use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::message::{Address, Message, MetaView};
use crate::protocol::methods::messaging::{SendParams, SendResult};
use crate::protocol::methods::notifications;
use crate::protocol::scope::ScopeVisibility;

use crate::router::caller::Caller;
use crate::router::caller::Ctx;
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::events::log::Audience;
use crate::router::events::log::EventDraft;
use crate::router::events::log::FilterKeys;
use crate::router::ids::{ConnId, IdSet};
use crate::router::messaging::resolve::{permitted, resolve, Recipient, Views};
use crate::router::messaging::state::Outgoing;
use crate::router::outbox::SharedText;
use crate::router::permissions::agent_audience;

/// What became of a message.
#[derive(Debug)]
pub struct Delivered {
    /// Its id.
    pub message_id: MessageId,
    /// Recipients it reached.
    pub delivered: Vec<String>,
    /// Recipients that are away and get it when they are back.
    pub queued: Vec<String>,
}

/// The `map/message` frame for a message, shared by all its recipients.
pub fn message_frame(message: &Message) -> SharedText {
    message_frame_of(&crate::router::core::to_json(message))
}

/// The `map/message` frame around a message's JSON.
pub(crate) fn message_frame_of(message_json: &str) -> SharedText {
    message_frame_traced(message_json, None)
}

/// The `map/message` frame around a message's JSON, with `params._meta.traceparent` when
/// traces are exported: the router's span for the message, which the recipient continues from
/// (docs/traces.md). The message itself, `meta` included, is the sender's text.
pub(crate) fn message_frame_traced(message_json: &str, traceparent: Option<&str>) -> SharedText {
    let mut params = String::with_capacity(message_json.len() + 80);
    params.push_str("{\"message\":");
    params.push_str(message_json);
    if let Some(tp) = traceparent {
        // NB: a traceparent is 55 characters of hex and dashes: nothing to escape.
        params.push_str(",\"_meta\":{\"traceparent\":\"");
        params.push_str(tp);
        params.push_str("\"}");
    }
    params.push('}');
    let mut frame = String::with_capacity(params.len() + 64);
    crate::protocol::jsonrpc::write_notification(&mut frame, notifications::MESSAGE, &params);
    frame.into()
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SentData<'a> {
    message_id: &'a MessageId,
    from: &'a str,
    to: &'a RawJson,
    timestamp: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    correlation_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a RawJson>,
    message: &'a RawValue,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DeliveredData<'a> {
    message_id: &'a MessageId,
    from: &'a str,
    delivered_to: [&'a str; 1],
    timestamp: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    correlation_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a RawJson>,
    message: &'a RawValue,
}

/// `message_delivered` of a multicast: every recipient of one audience, and no copy of the
/// message (it is in `message_sent`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MulticastDeliveredData<'a> {
    message_id: &'a MessageId,
    from: &'a str,
    delivered_to: &'a [String],
    timestamp: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    correlation_id: Option<&'a str>,
}

/// How many of a multicast's recipients one `message_failed` lists by name; past that it also
/// counts them all (`recipientCount`). Under connection churn a scope can hold thousands of orphaned
/// members, and listing each one in every send's record made that record grow with the
/// scope (about 29 bytes per member); 32 names are enough to show who, and the log tells the
/// rest (docs/streams.md, "Message events").
pub const FAILED_RECIPIENTS_SAMPLE: usize = 32;

/// What became of one recipient of a multicast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Delivered,
    Queued,
    Failed(&'static str),
}

/// A multicast's recipients grouped by outcome and by who may see them: one event per group.
#[derive(Default)]
struct Outcomes(Vec<(Outcome, Audience, Vec<String>)>);

impl Outcomes {
    fn add(&mut self, outcome: Outcome, audience: Audience, recipient: &str) {
        match self
            .0
            .iter_mut()
            .find(|(o, a, _)| *o == outcome && *a == audience)
        {
            Some((_, _, list)) => list.push(recipient.to_owned()),
            None => self.0.push((outcome, audience, vec![recipient.to_owned()])),
        }
    }
}

fn raw(json: String) -> Box<RawValue> {
    // `json` comes from serde_json::to_string, so it is valid JSON.
    RawValue::from_string(json)
        .unwrap_or_else(|_| RawValue::from_string("null".into()).expect("null is valid JSON"))
}

impl Router {
    /// `map/send`.
    pub fn handle_send(&mut self, ctx: &Ctx, p: SendParams) -> Result<SendResult, RouterError> {
        let caller = self.caller(ctx)?;
        self.config.quotas.check_payload(p.payload.as_ref())?;
        // `meta.mail` also records the message as a turn of that conversation (mail
        // extension): checked before routing, recorded after.
        // (A substring test first: most sends have no `mail`, and parsing their meta is waste.)
        let mail = match p
            .meta
            .as_ref()
            .filter(|m| m.get().contains("\"mail\""))
            .and_then(|m| m.members()?.get("mail").copied())
        {
            Some(raw) => Some(
                serde_json::from_str::<crate::protocol::methods::mail::MailMeta>(raw.get())
                    .map_err(|e| RouterError::InvalidParams(format!("meta.mail: {e}")))?,
            ),
            None => None,
        };
        let author = match &mail {
            Some(m) => Some(self.check_mail_send(&caller, m)?),
            None => None,
        };
        let payload = mail.as_ref().and(p.payload.clone());
        let d = self.deliver_message(&caller, p.to, p.payload, p.meta, Vec::new())?;
        if let (Some(m), Some(author)) = (mail, author) {
            let reached: Vec<String> = d.delivered.iter().chain(&d.queued).cloned().collect();
            self.record_mail_send(&caller, m, author, d.message_id.clone(), payload, &reached);
        }
        Ok(SendResult {
            message_id: d.message_id,
            delivered: d.delivered,
            queued: d.queued,
        })
    }

    /// Resolves, delivers and records one message from `caller`.
    pub(crate) fn deliver_message(
        &mut self,
        caller: &Caller,
        to: RawJson,
        payload: Option<RawJson>,
        meta: Option<RawJson>,
        caused_by: Vec<EventId>,
    ) -> Result<Delivered, RouterError> {
        self.deliver_message_as(caller, caller.address(), None, to, payload, meta, caused_by)
    }

    /// Resolves, delivers and records one message that `caller` passes on with the sender
    /// `from` (a federated sender id, `router::federation`; else the caller's own address),
    /// under the id `id` (a federated message's; else a new one).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn deliver_message_as(
        &mut self,
        caller: &Caller,
        from: Arc<str>,
        id: Option<MessageId>,
        to: RawJson,
        payload: Option<RawJson>,
        meta: Option<RawJson>,
        caused_by: Vec<EventId>,
    ) -> Result<Delivered, RouterError> {
        let address = Address::parse_raw(&to).map_err(RouterError::InvalidParams)?;
        let multicast = address.is_multicast()
            || matches!(&address, Address::Text(t) if self.text_names_scope(caller, t));
        // Outcomes are one event per recipient only when the address names one recipient.
        let aggregate = multicast || !address.names_one();
        if multicast && !self.session_has(caller, Capability::CanBroadcast) {
            return Err(RouterError::PermissionDenied(
                Capability::CanBroadcast.path().into(),
            ));
        }
        // A reply may name the sender of the request it answers, seen or not (`resolve`).
        // (A substring test first: most sends are no replies, and parsing their meta is waste.)
        let answering: Option<Arc<str>> = meta
            .as_ref()
            .filter(|m| m.get().contains("\"isResult\""))
            .map(|m| MetaView::of(Some(m)))
            .filter(|v| v.is_result)
            .and_then(|v| v.correlation_id)
            .and_then(|c| self.messaging.request_sender(&c, &from).cloned());
        let views = self.resolve_views();
        let strict = self.config.strict_recipients;
        let answering = answering.as_deref();
        let recipients = resolve(views, caller, &address, strict, answering)?;
        let recipients = permitted(views.agents, caller, recipients, !multicast, answering)?;
        let message = Message {
            id: id.unwrap_or_else(MessageId::generate),
            from: from.to_string(),
            to,
            timestamp: now_ms(),
            payload,
            meta,
        };
        // NB: serialized once; `to`, `payload` and `meta` are the sender's text, spliced in.
        let message_json = raw(crate::router::core::to_json(&message));
        let frame = message_frame_of(message_json.get());
        let payload_json = message.payload.clone();
        let view = message.meta_view();
        // The message's own trace context, else the request's (`params._meta`); a call a
        // cluster node relayed carries that node's span, which wins (`router::relay`).
        let trace = if self.call_relayed {
            self.call_trace.clone()
        } else {
            message
                .meta
                .as_ref()
                .and_then(crate::protocol::trace::TraceContext::from_meta)
                .or_else(|| self.call_trace.clone())
        };
        let correlation = view.correlation_id.as_deref();
        let priority = view.priority();
        let source_role: Option<Arc<str>> = caller
            .primary_agent
            .as_ref()
            .and_then(|a| self.registry.get(a))
            .and_then(|r| r.agent().role.as_deref())
            .map(Arc::from);
        let scope = match &address {
            Address::Scope(s) => Some(s.clone()),
            Address::Role { within, .. } => within.clone(),
            _ => None,
        };
        let keys = FilterKeys {
            agent_id: caller.primary_agent.clone(),
            source_role: source_role.clone(),
            subject_role: source_role,
            scopes: scope
                .as_ref()
                .map(|s| self.scope_keys(s))
                .unwrap_or_default(),
            priority: Some(Arc::from(priority)),
            correlation_ids: correlation.map(Arc::from).into_iter().collect(),
            metadata: None,
            work_session: None,
            task_id: None,
            mail: None,
            owner: None,
        };
        // Seen only by those who may see the sender's agent (and, for `message_sent`, every
        // agent the address names).
        let sender_audience = caller
            .primary_agent
            .as_ref()
            .and_then(|a| self.registry.get(a))
            .map_or(Audience::Everyone, |r| {
                agent_audience(r.agent(), self.agent_view(), &self.config.permissions)
            });
        let audience = self
            .message_audience(caller, scope.as_ref())
            .and(sender_audience);
        let sent_audience = if multicast {
            audience.clone()
        } else {
            recipients.iter().fold(audience.clone(), |acc, r| {
                acc.and(self.recipient_audience(r.id()))
            })
        };
        let mut caused_by = caused_by;
        if view.is_result {
            if let Some(request) =
                correlation.and_then(|c| self.messaging.request_delivery(c, &from))
            {
                caused_by.push(request);
            }
        }
        let sent = self.emit_traced(
            EventDraft {
                kind: EventType::MessageSent,
                source: Some(from.clone()),
                data: crate::router::core::to_json(&SentData {
                    message_id: &message.id,
                    from: &from,
                    to: &message.to,
                    timestamp: message.timestamp,
                    correlation_id: correlation,
                    priority: view.priority.as_deref(),
                    payload: payload_json.as_ref(),
                    message: &message_json,
                }),
                caused_by,
                keys: keys.clone(),
                audience: sent_audience,
            },
            trace.as_ref(),
        );

        let frame = match self
            .traces
            .as_ref()
            .and_then(|t| t.delivered_context(message.id.as_str()))
        {
            Some(tp) => message_frame_traced(message_json.get(), Some(&tp)),
            None => frame,
        };
        let out = Arc::new(Outgoing {
            id: message.id.clone(),
            // A result is not a request: only requests are indexed for their replies (a
            // reply indexed under its request's id would hide the request from the next one).
            correlation: correlation.filter(|_| !view.is_result).map(str::to_owned),
            from: from.clone(),
            to: message.to.clone(),
            timestamp: message.timestamp,
            delivered_correlation: if view.expects_response {
                None
            } else {
                correlation.map(str::to_owned)
            },
            payload_json,
            message_json,
            frame,
            sent,
            keys,
            audience,
            trace,
        });
        let queueable = view.delivery_guaranteed();
        let mut delivered = Vec::new();
        let mut queued = Vec::new();
        let mut reached: IdSet<ConnId> = IdSet::default();
        // A send to a group records its outcomes as one event per outcome (and audience),
        // listing the recipients; a send to one agent keeps the per-recipient events the SDK
        // reads.
        let mut outcomes = Outcomes::default();
        for recipient in recipients {
            // An agent of another system: kept for the link to its system (`router::federation`).
            if let Recipient::Remote { system, agent, id } = &recipient {
                let outcome = match self.federation_keep(system, agent, id, &out) {
                    Ok(routing) => {
                        queued.push(id.clone());
                        if !aggregate {
                            self.emit_queued(&out, id, "federation", routing);
                            continue;
                        }
                        Outcome::Queued
                    }
                    Err(reason) => Outcome::Failed(reason),
                };
                match outcome {
                    _ if aggregate => outcomes.add(outcome, self.recipient_audience(id), id),
                    Outcome::Failed(reason) => self.emit_failed(&out, id, reason),
                    _ => {}
                }
                continue;
            }
            let outcome = match self.recipient_conn(&recipient) {
                None => Err("recipient_offline"),
                Some(conn) if reached.contains(&conn) => Ok(()),
                Some(conn) => {
                    if self.push_message(conn, out.frame.clone()) {
                        reached.insert(conn);
                        Ok(())
                    } else {
                        Err("recipient_backlogged")
                    }
                }
            };
            let id = recipient.id();
            let outcome = match (outcome, &recipient) {
                (Ok(()), _) => {
                    delivered.push(id.to_owned());
                    Outcome::Delivered
                }
                (Err("recipient_offline"), Recipient::Agent(agent))
                    if queueable && self.can_come_back(agent) =>
                {
                    match self.messaging.keep(agent, &out) {
                        Ok(()) => {
                            queued.push(agent.to_string());
                            Outcome::Queued
                        }
                        Err(reason) => Outcome::Failed(reason),
                    }
                }
                (Err(reason), _) => Outcome::Failed(reason),
            };
            // A participant (a client, which reads messages only from `message_delivered`
            // events) keeps its own event with the message, even in a group.
            if aggregate && matches!(recipient, Recipient::Agent(_)) {
                outcomes.add(outcome, self.recipient_audience(id), id);
                continue;
            }
            match outcome {
                Outcome::Delivered => {
                    self.emit_delivered(&out, id, None);
                }
                Outcome::Queued => self.emit_queued(&out, id, "recipient_offline", None),
                Outcome::Failed(reason) => self.emit_failed(&out, id, reason),
            }
        }
        for (outcome, audience, list) in outcomes.0 {
            self.emit_outcome(&out, outcome, audience, list);
        }
        Ok(Delivered {
            message_id: out.id.clone(),
            delivered,
            queued,
        })
    }

    /// Emits `message_delivered` for one recipient; returns its id.
    pub(crate) fn emit_delivered(
        &mut self,
        out: &Outgoing,
        recipient: &str,
        extra_cause: Option<EventId>,
    ) -> EventId {
        let data = crate::router::core::to_json(&DeliveredData {
            message_id: &out.id,
            from: &out.from,
            delivered_to: [recipient],
            timestamp: out.timestamp,
            correlation_id: out.delivered_correlation.as_deref(),
            payload: out.payload_json.as_ref(),
            message: &out.message_json,
        });
        let audience = self.recipient_audience(recipient);
        let delivered = self.emit_about(
            out,
            EventType::MessageDelivered,
            data,
            audience,
            extra_cause,
        );
        self.messaging
            .record_delivery(out, recipient.into(), delivered);
        delivered
    }

    /// Emits an event about what became of `out` for some of its recipients: caused by its
    /// `message_sent` (and `extra_cause`), with its filter keys and trace context, seen by
    /// those who may see the message and `audience` (its recipients').
    fn emit_about(
        &mut self,
        out: &Outgoing,
        kind: EventType,
        data: String,
        audience: Audience,
        extra_cause: Option<EventId>,
    ) -> EventId {
        let mut caused_by = vec![out.sent];
        caused_by.extend(extra_cause);
        self.emit_traced(
            EventDraft {
                kind,
                source: Some(out.from.clone()),
                data,
                caused_by,
                keys: out.keys.clone(),
                audience: out.audience.clone().and(audience),
            },
            out.trace.as_ref(),
        )
    }

    /// Emits the one event of a multicast's recipients with the same outcome and audience.
    fn emit_outcome(
        &mut self,
        out: &Outgoing,
        outcome: Outcome,
        audience: Audience,
        recipients: Vec<String>,
    ) {
        let (kind, data) = match outcome {
            Outcome::Delivered => (
                EventType::MessageDelivered,
                crate::router::core::to_json(&MulticastDeliveredData {
                    message_id: &out.id,
                    from: &out.from,
                    delivered_to: &recipients,
                    timestamp: out.timestamp,
                    correlation_id: out.delivered_correlation.as_deref(),
                }),
            ),
            Outcome::Queued => (
                EventType::MessageQueued,
                crate::router::core::to_json(&MessageQueuedData {
                    message_id: out.id.clone(),
                    from: out.from.to_string(),
                    recipient: None,
                    recipients: Some(
                        recipients
                            .iter()
                            .map(|r| AgentId::from(r.as_str()))
                            .collect(),
                    ),
                    reason: "recipient_offline".into(),
                    federation: None,
                }),
            ),
            Outcome::Failed(reason) => (
                EventType::MessageFailed,
                crate::router::core::to_json(&MessageFailedData {
                    message_id: out.id.clone(),
                    from: out.from.to_string(),
                    to: out.to.clone(),
                    recipient: None,
                    // NB: a sample, so that a send to a group with thousands of silent
                    // members stays a small record (docs/streams.md, "Message events").
                    recipients: Some(
                        recipients
                            .iter()
                            .take(FAILED_RECIPIENTS_SAMPLE)
                            .cloned()
                            .collect(),
                    ),
                    recipient_count: (recipients.len() > FAILED_RECIPIENTS_SAMPLE)
                        .then_some(recipients.len() as u64),
                    reason: reason.into(),
                    code: ErrorCode::DELIVERY_FAILED.0,
                }),
            ),
        };
        let event = self.emit_about(out, kind, data, audience, None);
        if outcome == Outcome::Delivered {
            // NB. The names move into the reply index (no copy per recipient).
            for r in recipients {
                self.messaging
                    .record_delivery(out, r.into_boxed_str(), event);
            }
        }
    }

    /// Emits `message_failed` for one recipient.
    pub(crate) fn report_failed(&mut self, out: &Outgoing, recipient: &str, reason: &str) {
        self.emit_failed(out, recipient, reason);
    }

    /// Emits `message_failed` for one recipient.
    fn emit_failed(&mut self, out: &Outgoing, recipient: &str, reason: &str) {
        self.emit_failed_code(out, recipient, reason, ErrorCode::DELIVERY_FAILED.0);
    }

    /// Emits `message_failed` for one recipient, with the code of the refusal (another
    /// system's, `router::federation`).
    pub(crate) fn emit_failed_code(
        &mut self,
        out: &Outgoing,
        recipient: &str,
        reason: &str,
        code: i32,
    ) {
        let data = crate::router::core::to_json(&MessageFailedData {
            message_id: out.id.clone(),
            from: out.from.to_string(),
            to: out.to.clone(),
            recipient: Some(recipient.to_owned()),
            recipients: None,
            recipient_count: None,
            reason: reason.into(),
            code,
        });
        let audience = self.recipient_audience(recipient);
        self.emit_about(out, EventType::MessageFailed, data, audience, None);
    }

    /// Whether an agent without a connection may get one back: orphaned within its grace
    /// period, between restarts of its process, or owned by a detached session.
    fn can_come_back(&self, agent: &AgentId) -> bool {
        let Some(rec) = self.registry.get(agent) else {
            return false;
        };
        match &rec.agent().owner_id {
            None => rec.agent().state != crate::protocol::agent::AgentState::STOPPED,
            Some(owner) => self
                .sessions
                .by_participant(owner)
                .is_some_and(|s| s.conn().is_none()),
        }
    }

    /// Emits `message.queued` for a message kept for one agent that is away.
    pub(crate) fn emit_queued(
        &mut self,
        out: &Arc<Outgoing>,
        agent: &str,
        reason: &str,
        federation: Option<crate::protocol::methods::federation::FederationRouting>,
    ) {
        let data = crate::router::core::to_json(&MessageQueuedData {
            message_id: out.id.clone(),
            from: out.from.to_string(),
            recipient: Some(AgentId::from(agent)),
            recipients: None,
            reason: reason.into(),
            federation,
        });
        let audience = self.recipient_audience(agent);
        self.emit_about(out, EventType::MessageQueued, data, audience, None);
    }

    /// Delivers what was kept for an agent that is back (resumed, reclaimed, restarted).
    pub(crate) fn flush_offline(&mut self, agent: &AgentId, cause: Option<EventId>) {
        let Some(conn) = self.agent_conn(agent) else {
            return;
        };
        let Some(queue) = self.messaging.take_kept(agent) else {
            return;
        };
        for out in queue {
            if self.push_message(conn, out.frame.clone()) {
                self.emit_delivered(&out, agent.as_str(), cause);
            } else {
                self.emit_failed(&out, agent.as_str(), "recipient_backlogged");
            }
        }
    }

    /// Fails what was kept for an agent that will not come back.
    pub(crate) fn drop_offline(&mut self, agent: &AgentId) {
        if let Some(queue) = self.messaging.take_kept(agent) {
            for out in queue {
                self.emit_failed(&out, agent.as_str(), "recipient_gone");
            }
        }
    }

    /// Whether a string address resolves to a scope for `caller` (`resolve::names_scope`: a
    /// scope it may not see is absent, so whether the send is a multicast leaks nothing).
    fn text_names_scope(&self, caller: &Caller, text: &str) -> bool {
        crate::router::messaging::resolve::names_scope(self.resolve_views(), caller, text)
    }

    fn session_has(&self, caller: &Caller, cap: Capability) -> bool {
        self.sessions
            .get(&caller.session)
            .is_some_and(|s| s.capabilities().has(cap))
    }

    /// Who may see events naming `recipient`: its agent's audience (a participant recipient
    /// narrows nothing).
    fn recipient_audience(&self, recipient: &str) -> Audience {
        self.registry
            .get_by_text(recipient)
            .map_or(Audience::Everyone, |r| {
                agent_audience(r.agent(), self.agent_view(), &self.config.permissions)
            })
    }

    /// Who may see events about a message: everyone, unless it went to a scope whose
    /// `messageVisibility` narrows it.
    fn message_audience(&self, caller: &Caller, scope: Option<&ScopeId>) -> Audience {
        let vis = scope
            .and_then(|s| self.scopes.get(s))
            .and_then(|s| s.scope().message_visibility)
            .unwrap_or_default();
        match (vis, scope) {
            (ScopeVisibility::Public, _) | (_, None) => Audience::Everyone,
            (ScopeVisibility::System, _) => Audience::System,
            (ScopeVisibility::Members, Some(s)) => Audience::Scoped {
                owner: Some(caller.participant.clone()),
                scopes: vec![s.clone()],
            },
        }
    }

    /// The connection that receives messages for a recipient, if it is online.
    fn recipient_conn(&self, r: &Recipient) -> Option<ConnId> {
        match r {
            Recipient::Agent(a) => self.agent_conn(a),
            Recipient::Participant(p) => self.sessions.by_participant(p)?.conn(),
            Recipient::Remote { .. } => None,
        }
    }

    /// The connection of an agent's owner.
    pub(crate) fn agent_conn(&self, agent: &AgentId) -> Option<ConnId> {
        let owner = self.registry.get(agent)?.agent().owner_id.as_ref()?;
        self.sessions.by_participant(owner)?.conn()
    }

    /// Queues a `map/message` frame for a connection without waiting. Returns false when the
    /// connection is gone or its bounded queue is full.
    pub(crate) fn push_message(&mut self, conn: ConnId, frame: SharedText) -> bool {
        let queued = self
            .conns
            .push_message(conn, frame, self.config.pending_messages);
        if queued {
            self.counters.message_queued();
        }
        queued
    }

    /// What address resolution reads: agents, scopes, sessions.
    fn resolve_views(&self) -> Views<'_> {
        Views {
            agents: self.agent_view(),
            scopes: self.scope_view(),
            sessions: self.session_view(),
            systems: &self.config.federation,
        }
    }
}
