//! The sessions extension (`map/session/list`, `map/session/load`, `map/session/close`): a
//! participant sees and acts on its own sessions only. "Its own" means the sessions of the same
//! authenticated principal (same `id` and issuer) or, without authentication, of the same
//! participant id; anything else is "not found", so existence does not leak.
//!
//! - **list**: the caller's sessions, attached and detached, oldest first.
//! - **load**: moves the calling connection to one of its detached sessions, as a resume
//!   would (its orphaned agents are reclaimed, `participant_connected {reconnected: true}`);
//!   the session the connection had is detached as if its transport had closed (reason
//!   `session_loaded`), so it can be loaded back within the resume window.
//! - **close**: ends a session for good. The caller's own: as `map/disconnect` with the
//!   `unregister` policy, and it cannot be resumed. Another (detached) one: it is removed and
//!   the agents it left orphaned are unregistered now (reason `session_closed`, or the
//!   caller's). A session attached to another connection is refused (16001): close it there.

use crate::protocol::agent::AgentState;
use crate::protocol::ids::{now_ms, AgentId, SessionId};
use crate::protocol::methods::session::{
    AgentBehavior, DisconnectPolicy, SessionCloseParams, SessionCloseResult, SessionInfo,
    SessionListParams, SessionListResult, SessionLoadParams, SessionLoadResult, SessionSummary,
};
use crate::router::caller::Ctx;
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::sessions::auth::same_principal;
use crate::router::sessions::table::Session;

/// Why the connection's previous session was detached by `map/session/load`.
const LOADED_REASON: &str = "session_loaded";
/// Why a closed session's agents went, when the caller gives no reason.
const CLOSED_REASON: &str = "session_closed";

/// Whether `caller` may see and act on `s`.
fn owns(caller: &Session, s: &Session) -> bool {
    match (&caller.principal, &s.principal) {
        (None, None) => caller.participant == s.participant,
        (a, b) => b.is_some() && same_principal(b.as_ref(), a.as_ref()),
    }
}

impl Router {
    /// `map/session/list`.
    ///
    /// # Errors
    /// `NotConnected` without a session.
    pub fn handle_session_list(
        &mut self,
        ctx: &Ctx,
        _p: SessionListParams,
    ) -> Result<SessionListResult, RouterError> {
        let me = self.session_of(ctx)?.clone();
        let mut sessions: Vec<SessionSummary> = self
            .sessions
            .iter()
            .filter(|s| owns(&me, s))
            .map(|s| {
                let mut agents = self.registry.owned_by(&s.participant);
                agents.extend(s.orphaned.iter().cloned());
                SessionSummary {
                    id: s.id.clone(),
                    created_at: s.created_at,
                    last_active_at: Some(s.last_active_at),
                    participant_id: s.participant.clone(),
                    participant_type: s.kind,
                    name: s.name.clone(),
                    state: if s.conn.is_some() {
                        "attached"
                    } else {
                        "detached"
                    }
                    .into(),
                    current: s.id == me.id,
                    agents,
                }
            })
            .collect();
        sessions.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(SessionListResult { sessions })
    }

    /// The caller's session `id`, refused as "not found" when it is not the caller's.
    fn own_session(&self, me: &Session, id: &SessionId) -> Result<Session, RouterError> {
        self.sessions
            .get(id)
            .filter(|s| owns(me, s))
            .cloned()
            .ok_or_else(|| RouterError::SessionNotFound(id.to_string()))
    }

    /// `map/session/load`.
    ///
    /// # Errors
    /// `SessionNotFound` (16000) for a session the caller does not own (or that ended),
    /// `SessionInUse` (16001) for one attached to another connection.
    pub fn handle_session_load(
        &mut self,
        ctx: &Ctx,
        p: SessionLoadParams,
    ) -> Result<SessionLoadResult, RouterError> {
        let me = self.session_of(ctx)?.clone();
        self.check_relay_digests(
            ctx.conn,
            &[(
                "nextResumeTokenDigest",
                p.next_resume_token_digest.as_deref(),
            )],
        )?;
        if p.session_id == me.id {
            return Ok(SessionLoadResult {
                session_id: me.id.clone(),
                restored: false,
                participant_id: me.participant.clone(),
                reclaimed_agents: Vec::new(),
                resume_token: me.resume_token.clone(),
            });
        }
        let target = self.own_session(&me, &p.session_id)?;
        if target.conn.is_some() {
            return Err(RouterError::SessionInUse(target.id.to_string()));
        }
        // The connection's current session goes as if its transport had closed: resumable,
        // loadable back, its agents following its own policy.
        let policy = crate::router::sessions::table::policy_when_lost(Some(&me));
        self.detach(ctx.conn, &policy, LOADED_REASON, false);
        let resumed = self.resume_session(
            ctx.conn,
            &target.id,
            None,
            p.next_resume_token_digest.as_deref(),
        );
        Ok(SessionLoadResult {
            session_id: resumed.session_id,
            restored: true,
            participant_id: resumed.participant_id,
            reclaimed_agents: resumed.reclaimed_agents,
            resume_token: resumed.resume_token,
        })
    }

    /// `map/session/close`.
    ///
    /// # Errors
    /// As [`Router::handle_session_load`].
    pub fn handle_session_close(
        &mut self,
        ctx: &Ctx,
        p: SessionCloseParams,
    ) -> Result<SessionCloseResult, RouterError> {
        let me = self.session_of(ctx)?.clone();
        let reason = p.reason.unwrap_or_else(|| CLOSED_REASON.to_owned());
        let target = match &p.session_id {
            None => me.clone(),
            Some(id) if *id == me.id => me.clone(),
            Some(id) => self.own_session(&me, id)?,
        };
        let info = SessionInfo {
            id: target.id.clone(),
            created_at: target.created_at,
            closed_at: Some(now_ms()),
        };
        let current = target.id == me.id;
        if current {
            let policy = DisconnectPolicy {
                agent_behavior: AgentBehavior::Unregister,
                grace_period_ms: None,
                notify_subscribers: None,
            };
            self.detach(ctx.conn, &policy, &reason, false);
            self.sessions.remove(&target.id);
        } else {
            if target.conn.is_some() {
                return Err(RouterError::SessionInUse(target.id.to_string()));
            }
            self.sessions.remove(&target.id);
            self.release_orphans(&target.orphaned, &reason);
        }
        Ok(SessionCloseResult {
            closed: true,
            session: info,
            current,
        })
    }

    /// Unregisters the agents a closed session left orphaned (children before parents), unless
    /// someone reclaimed them meanwhile.
    fn release_orphans(&mut self, orphaned: &[AgentId], reason: &str) {
        let mut still: Vec<AgentId> = orphaned
            .iter()
            .filter(|a| {
                self.registry.get(a).is_some_and(|r| {
                    r.agent().owner_id.is_none() && r.agent().state == AgentState::ORPHANED
                })
            })
            .cloned()
            .collect();
        still.sort_by_key(|a| std::cmp::Reverse(self.registry.ancestors(a, None).len()));
        for agent in still {
            let hint = self.take_cause_hint(&agent);
            self.remove_agent(&agent, reason, hint);
        }
    }
}
