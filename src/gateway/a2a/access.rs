//! Who may act on an A2A task, and [`Caller`]: one request's caller as that rule needs it.
//!
//! Owns: the rule, in one place ([`Caller::controls`]), and the per-request view of the caller
//! (its verified principal, its MAP session from `gateway::callers::CallerSessions`, whether
//! it is a system principal, and what its request says beside its body: the A2A method's
//! name and the W3C trace context of its headers, `gateway::trace`). It keeps nothing between
//! requests: the session is shared by the principal's requests, the rest is this request's.
//!
//! The rule (docs/a2a.md, "Who may act on a task"). With authentication on, a task is read
//! (`GetTask`, `ListTasks`, `SubscribeToTask`), canceled, followed up, and its push configs
//! listed or changed only by a principal that **controls** it:
//! - its owner, `meta.a2a.owner`: the principal whose `SendMessage` created it;
//! - a system principal: listed in `auth.system_principals`, or a caller whose MAP session is
//!   `system`;
//! - the principal owning the task's agent: the agent belongs to one of that principal's MAP
//!   sessions, as `map/session/list` (asked through the caller's own session) answers.
//!
//! To anyone else the task does not exist (-32001, as an unknown id): its existence does not
//! leak. With authentication off nobody is anybody, as for every MAP participant then: every
//! caller controls every task (the behaviour before owners were recorded).
//!
//! Grants: the caller's MAP capabilities (its principal's `[permissions.principals]` grant)
//! are checked before the gateway acts for it ([`Caller::require`]): a missing one is 403,
//! named as MAP names it.

use tokio::sync::OnceCell;

use crate::client::Client;
use crate::gateway::a2a::error::A2aError;
use crate::gateway::a2a::record::{Owner, Record};
use crate::protocol::capabilities::{Capability, ParticipantType};
use crate::protocol::ids::AgentId;
use crate::protocol::methods::session::{Principal, SessionList, SessionListParams};
use crate::protocol::trace::TraceContext;

/// The caller of one A2A request.
#[derive(Debug)]
pub struct Caller {
    /// Its MAP session (one per principal, shared by its requests; the anonymous one with
    /// authentication off).
    session: Client,
    /// Its verified principal; `None` with authentication off.
    principal: Option<Principal>,
    /// Whether it passes every task rule (a system principal, or a `system` session).
    system: bool,
    /// The agents of its principal's MAP sessions, asked once per request when needed.
    agents: OnceCell<Vec<AgentId>>,
    /// The A2A method of this request, as named (`meta.a2a.method` of the message it sends).
    method: &'static str,
    /// This request's trace context (its `traceparent` / `tracestate` headers, when valid).
    trace: Option<TraceContext>,
}

impl Caller {
    /// The caller with `principal` (`None`: authentication off) over `session`;
    /// `system_principal` says whether the configuration lists it in `auth.system_principals`.
    pub fn new(session: Client, principal: Option<Principal>, system_principal: bool) -> Self {
        let system_session = session
            .session()
            .is_some_and(|s| s.participant_type == ParticipantType::System);
        Self {
            session,
            system: principal.is_some() && (system_principal || system_session),
            principal,
            agents: OnceCell::new(),
            method: "",
            trace: None,
        }
    }

    /// The same caller making request `method` (its name as the caller wrote it) with `trace`.
    #[must_use]
    pub fn making(mut self, method: &'static str, trace: Option<TraceContext>) -> Self {
        self.method = method;
        self.trace = trace;
        self
    }

    /// The A2A method of this request (empty before [`Caller::making`]).
    pub fn method(&self) -> &'static str {
        self.method
    }

    /// This request's trace context.
    pub fn trace(&self) -> Option<&TraceContext> {
        self.trace.as_ref()
    }

    /// Its MAP session: what it sees (agents) and what it does as itself (creating tasks).
    pub fn session(&self) -> &Client {
        &self.session
    }

    /// Who a task it creates, or a webhook it sets, belongs to (`None` with authentication off).
    pub fn owner(&self) -> Option<Owner> {
        self.principal.as_ref().map(Owner::of)
    }

    /// Whether it is a system principal (or its session is `system`).
    pub fn is_system(&self) -> bool {
        self.system
    }

    /// Whether its principal's grant includes `cap` (as MAP granted it to its session).
    pub fn may(&self, cap: Capability) -> bool {
        self.session
            .session()
            .is_some_and(|s| s.capabilities.has(cap))
    }

    /// [`Caller::may`], else 403 naming the capability.
    ///
    /// # Errors
    /// 403 (-32600) `permission denied: Permission denied: <group.flag>`, MAP's own words.
    pub fn require(&self, cap: Capability) -> Result<(), A2aError> {
        if self.may(cap) {
            return Ok(());
        }
        Err(A2aError::forbidden(format!(
            "Permission denied: {}",
            cap.path()
        )))
    }

    /// Whether this caller controls the task `record` describes (the module's rule).
    pub async fn controls(&self, record: &Record) -> bool {
        let Some(me) = &self.principal else {
            return true;
        };
        if self.system || record.owner.as_ref().is_some_and(|o| o.is(me)) {
            return true;
        }
        self.owns_agent(&record.agent).await
    }

    /// Whether `agent` belongs to one of the caller's principal's MAP sessions.
    async fn owns_agent(&self, agent: &str) -> bool {
        let agents = self
            .agents
            .get_or_init(|| async {
                match self.session.call::<SessionList>(SessionListParams {}).await {
                    Ok(list) => list.sessions.into_iter().flat_map(|s| s.agents).collect(),
                    Err(e) => {
                        tracing::debug!(error = %e, "a2a gateway: the caller's sessions could not be listed");
                        Vec::new()
                    }
                }
            })
            .await;
        agents.iter().any(|a| a.as_str() == agent)
    }
}
