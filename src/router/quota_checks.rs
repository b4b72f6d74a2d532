//! The quota checks handlers make before they create state (`impl Router`): the numbers and
//! their reasons are in [`super::quotas`].

use crate::protocol::ids::ParticipantId;
use crate::router::caller::Ctx;
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::quotas::exceeded;

impl Router {
    /// Before `map/subscribe` creates a subscription for the caller's session.
    ///
    /// # Errors
    /// `QuotaExceeded` at the limit; `NotConnected` without a session.
    pub(crate) fn check_subscription_quota(&self, ctx: &Ctx) -> Result<(), RouterError> {
        let limit = self.config.quotas.max_subscriptions_per_session;
        if limit == 0 {
            return Ok(());
        }
        let session = self.session_of(ctx)?;
        if self.bus.count_for_session(&session.id) >= limit {
            return Err(exceeded("subscriptions per session", limit));
        }
        Ok(())
    }

    /// Before an agent is registered or spawned for `owner` (a participant id).
    ///
    /// # Errors
    /// `QuotaExceeded` at the limit.
    pub(crate) fn check_agent_quota(&self, owner: &ParticipantId) -> Result<(), RouterError> {
        let limit = self.config.quotas.max_agents_per_session;
        if limit > 0 && self.registry.owned_count(owner) >= limit {
            return Err(exceeded("agents per session", limit));
        }
        Ok(())
    }

    /// Before a session with this principal attaches (new or resumed).
    ///
    /// # Errors
    /// `QuotaExceeded` when the principal already has that many attached sessions.
    pub(crate) fn check_principal_quota(&self, principal: &str) -> Result<(), RouterError> {
        let limit = self.config.quotas.max_sessions_per_principal;
        if limit == 0 {
            return Ok(());
        }
        let attached = self
            .sessions
            .iter()
            .filter(|s| s.conn.is_some())
            .filter(|s| s.principal.as_ref().is_some_and(|p| p.id == principal))
            .count();
        if attached >= limit {
            return Err(exceeded("sessions per principal", limit));
        }
        Ok(())
    }
}
