//! Reading a delivered [`Message`]: whether it is a reply, a control message from the router
//! ([`Control`]: stop, suspend, resume) or injected content ([`Injection`], `map/inject`), as
//! the [`MessageExt`] trait.

use serde_json::Value;

use crate::protocol::ids::AgentId;
use crate::protocol::message::Message;

/// What a control message from the router asks an agent to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControlAction {
    /// `map/agents/stop`: finish up and stop.
    Stop,
    /// `map/agents/suspend`: pause work until resumed.
    Suspend,
    /// `map/agents/resume`: continue.
    Resume,
    /// A control word this client does not know.
    Other(String),
}

/// A control message: `{from: "system", payload: {control, agentId, reason?, force?}}`, sent by
/// the router when someone stops, suspends or resumes the agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Control {
    /// What to do.
    pub action: ControlAction,
    /// The agent it is about.
    pub agent_id: Option<AgentId>,
    /// Why, as given by the caller.
    pub reason: Option<String>,
    /// For stop: the router already stopped the agent.
    pub force: bool,
}

/// Content injected with `map/inject`: `{from: "system", meta: {_meta: {inject: {...}}}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Injection {
    /// `queue`, `steer`, `interrupt` or `best-effort`.
    pub delivery: String,
    /// Who injected it (agent or participant id).
    pub injected_by: Option<String>,
    /// `interrupt` delivery: abandon the current step.
    pub interrupt: bool,
    /// The injected content (the message payload).
    pub content: Value,
}

/// Helpers to recognise special messages.
///
/// ```
/// use map_router::client::{ControlAction, MessageExt};
/// use map_router::protocol::message::Message;
///
/// let m: Message = serde_json::from_value(serde_json::json!({
///     "id": "m1", "from": "system", "to": {"agent": "a1"}, "timestamp": 0,
///     "payload": {"control": "stop", "agentId": "a1", "reason": "done"}
/// })).unwrap();
/// assert_eq!(m.control().unwrap().action, ControlAction::Stop);
/// assert!(m.injection().is_none());
/// ```
pub trait MessageExt {
    /// The control request, when this is a control message from the router.
    fn control(&self) -> Option<Control>;
    /// The injection, when this is content injected with `map/inject`.
    fn injection(&self) -> Option<Injection>;
    /// `meta.isResult == true`: a reply to a request.
    fn is_reply(&self) -> bool;
}

impl MessageExt for Message {
    fn control(&self) -> Option<Control> {
        if self.from != "system" {
            return None;
        }
        let payload = self.payload.as_ref()?.to_value();
        let payload = payload.as_object()?;
        let word = payload.get("control")?.as_str()?;
        let action = match word {
            "stop" => ControlAction::Stop,
            "suspend" => ControlAction::Suspend,
            "resume" => ControlAction::Resume,
            other => ControlAction::Other(other.to_owned()),
        };
        Some(Control {
            action,
            agent_id: payload
                .get("agentId")
                .and_then(Value::as_str)
                .map(AgentId::from),
            reason: payload
                .get("reason")
                .and_then(Value::as_str)
                .map(str::to_owned),
            force: payload
                .get("force")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        })
    }

    fn injection(&self) -> Option<Injection> {
        if self.from != "system" {
            return None;
        }
        let meta = self.meta.as_ref()?.to_value();
        let inject = meta.get("_meta")?.get("inject")?.as_object()?;
        Some(Injection {
            delivery: inject
                .get("delivery")
                .and_then(Value::as_str)
                .unwrap_or("queue")
                .to_owned(),
            injected_by: inject
                .get("injectedBy")
                .and_then(Value::as_str)
                .map(str::to_owned),
            interrupt: inject
                .get("interrupt")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            content: self.payload_value().unwrap_or(Value::Null),
        })
    }

    fn is_reply(&self) -> bool {
        self.is_result()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(v: Value) -> Message {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn injections_and_replies_are_recognised() {
        let m = msg(
            json!({"id": "m", "from": "system", "to": {"agent": "a"}, "timestamp": 1,
            "payload": {"hint": "x"},
            "meta": {"priority": "urgent", "_meta": {"inject": {"delivery": "interrupt", "injectedBy": "boss", "interrupt": true}}}}),
        );
        let i = m.injection().unwrap();
        assert_eq!(i.delivery, "interrupt");
        assert!(i.interrupt);
        assert_eq!(i.injected_by.as_deref(), Some("boss"));
        assert_eq!(i.content, json!({"hint": "x"}));
        assert!(m.control().is_none());
        let r = msg(
            json!({"id": "r", "from": "a", "to": {"agent": "b"}, "timestamp": 1,
            "meta": {"isResult": true, "correlationId": "c"}}),
        );
        assert!(r.is_reply());
        assert!(r.injection().is_none());
    }
}
