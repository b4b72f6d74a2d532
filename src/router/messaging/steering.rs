//! `map/inject`: put content in front of a running agent, whatever its transport.
//!
//! The content travels as a `map/message` from `"system"` to the agent's connection (the SDK
//! has no inject notification; `AgentConnection.onMessage` is the channel every agent already
//! handles), with `meta._meta.inject = {delivery, injectedBy}`. Delivery modes, documented in
//! `docs/steering.md`:
//! - `queue`: behind messages already queued for the connection;
//! - `steer`: ahead of queued messages not yet handed to the writer, `priority: urgent`;
//! - `interrupt`: as `steer`, plus `meta._meta.inject.interrupt = true`;
//! - `best-effort`: only if the connection can take it right now.
//!
//! Every call emits `agent.injected` (also when nothing was delivered, with `injected: false`).

use crate::protocol::event::{AgentInjectedData, EventType};
use crate::protocol::ids::{now_ms, MessageId};
use crate::protocol::json::RawJson;
use crate::protocol::message::Message;
use crate::protocol::methods::steering::{InjectDelivery, InjectParams, InjectResult};

use crate::router::caller::Ctx;
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::messaging::ops::message_frame;

fn delivery_name(d: InjectDelivery) -> &'static str {
    match d {
        InjectDelivery::Queue => "queue",
        InjectDelivery::Steer => "steer",
        InjectDelivery::Interrupt => "interrupt",
        InjectDelivery::BestEffort => "best-effort",
    }
}

impl Router {
    /// `map/inject`.
    pub fn handle_inject(
        &mut self,
        ctx: &Ctx,
        p: InjectParams,
    ) -> Result<InjectResult, RouterError> {
        let caller = self.caller(ctx)?;
        self.config.quotas.check_payload(Some(&p.content))?;
        let agent = self.lifecycle_agent(&caller, &p.agent_id)?;
        let delivery = p.delivery.unwrap_or_default();
        let urgent = matches!(delivery, InjectDelivery::Steer | InjectDelivery::Interrupt);
        let mut inject = serde_json::json!({
            "delivery": delivery_name(delivery),
            "injectedBy": caller.address().to_string(),
        });
        if delivery == InjectDelivery::Interrupt {
            inject["interrupt"] = true.into();
        }
        let mut meta = serde_json::Map::new();
        meta.insert(
            "priority".into(),
            if urgent { "urgent" } else { "normal" }.into(),
        );
        meta.insert("_meta".into(), serde_json::json!({ "inject": inject }));
        let message = Message {
            id: MessageId::generate(),
            from: "system".into(),
            to: RawJson::from(serde_json::json!({ "agent": agent.id })),
            timestamp: now_ms(),
            payload: Some(p.content.clone()),
            meta: Some(RawJson::from(meta)),
        };
        let frame = message_frame(&message);
        let injected = match self.agent_conn(&agent.id) {
            None => false,
            Some(conn) => match delivery {
                InjectDelivery::Queue => self.push_message(conn, frame),
                InjectDelivery::Steer | InjectDelivery::Interrupt => {
                    self.push_message_front(conn, frame)
                }
                InjectDelivery::BestEffort => self.conns.send_now(conn, frame),
            },
        };
        self.emit_agent_event(
            EventType::AgentInjected,
            &agent,
            &AgentInjectedData {
                agent_id: agent.id.clone(),
                delivery: delivery_name(delivery).into(),
                injected,
                message_id: message.id.clone(),
                injected_by: caller.address().to_string(),
                content: p.content,
            },
            Vec::new(),
        );
        Ok(InjectResult {
            injected,
            delivery,
            delivered_to: if injected { vec![agent.id] } else { Vec::new() },
            message_id: message.id,
        })
    }

    /// Queues a frame ahead of the connection's pending messages. Returns false when the
    /// connection is gone or its bounded queue is full.
    fn push_message_front(
        &mut self,
        conn: crate::router::ids::ConnId,
        frame: crate::router::outbox::SharedText,
    ) -> bool {
        let queued = self
            .conns
            .push_message_front(conn, frame, self.config.pending_messages);
        if queued {
            self.counters.message_queued();
        }
        queued
    }
}
