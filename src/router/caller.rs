//! Who is calling: [`Ctx`] (the connection a call came on) and [`Caller`] (what a handler
//! needs to know about its session: identity, type, the agent it speaks as, the policy).

use std::sync::Arc;

use crate::protocol::capabilities::ParticipantType;
use crate::protocol::ids::{AgentId, ParticipantId, SessionId};
use crate::router::ids::ConnId;
use crate::router::permissions;

/// The caller of an operation.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    /// The calling connection.
    pub conn: ConnId,
}

/// What an operation needs to know about its caller's session.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Session id.
    pub session: SessionId,
    /// Participant id.
    pub participant: ParticipantId,
    /// Participant type.
    pub kind: ParticipantType,
    /// The agent the session speaks as, if any.
    pub primary_agent: Option<AgentId>,
    /// The principal the session authenticated as (none with authentication off).
    pub principal: Option<crate::protocol::methods::session::Principal>,
    /// The permission policy.
    pub policy: permissions::SharedPolicy,
}

impl Caller {
    /// The permission-check view of this caller.
    pub fn viewer(&self) -> permissions::Viewer<'_> {
        permissions::Viewer {
            participant: &self.participant,
            kind: self.kind,
            agent: self.primary_agent.as_ref(),
            principal: self.principal.as_ref(),
            policy: &self.policy,
        }
    }

    /// `from` of messages this caller sends, and `source` of events it causes.
    pub fn address(&self) -> Arc<str> {
        match &self.primary_agent {
            Some(a) => a.as_arc().clone(),
            None => self.participant.as_arc().clone(),
        }
    }
}
