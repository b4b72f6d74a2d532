//! The quota checks handlers make before they create state (`impl Router`): the numbers and
//! their reasons are in [`super::quotas`].

use crate::protocol::ids::ParticipantId;
use crate::router::caller::Ctx;
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::kept::need::Need;
use crate::router::quotas::exceeded;
use crate::store::kept::OwnerCounts;

/// What a quota owner creates that is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Created {
    Tasks,
    Conversations,
    Checkpoints,
}

impl Created {
    fn what(self) -> &'static str {
        match self {
            Self::Tasks => "tasks per principal",
            Self::Conversations => "conversations per principal",
            Self::Checkpoints => "checkpoints per principal",
        }
    }

    fn count(self, c: &OwnerCounts) -> u64 {
        match self {
            Self::Tasks => c.tasks,
            Self::Conversations => c.conversations,
            Self::Checkpoints => c.checkpoints,
        }
    }

    fn count_mut(self, c: &mut OwnerCounts) -> &mut u64 {
        match self {
            Self::Tasks => &mut c.tasks,
            Self::Conversations => &mut c.conversations,
            Self::Checkpoints => &mut c.checkpoints,
        }
    }
}

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
        if self.bus.count_for_session(session.id()) >= limit {
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
            .filter(|s| s.conn().is_some())
            .filter(|s| s.principal().as_ref().is_some_and(|p| p.id == principal))
            .count();
        if attached >= limit {
            return Err(exceeded("sessions per principal", limit));
        }
        Ok(())
    }

    /// The quota owner of the caller's session: its principal, else (anonymous) its
    /// participant id; `None` for the router's service principal, which is not bounded.
    ///
    /// # Errors
    /// `NotConnected` without a session.
    pub(crate) fn quota_owner(&self, ctx: &Ctx) -> Result<Option<String>, RouterError> {
        let session = self.session_of(ctx)?;
        Ok(match &session.principal() {
            Some(p) if crate::auth::is_service(p) => None,
            Some(p) => Some(format!(
                "principal:{}",
                serde_json::to_string(&(&p.id, &p.issuer)).unwrap_or_default()
            )),
            None => Some(format!("participant:{}", session.participant())),
        })
    }

    fn created_limit(&self, kind: Created) -> usize {
        let q = &self.config.quotas;
        match kind {
            Created::Tasks => q.max_tasks_per_principal,
            Created::Conversations => q.max_conversations_per_principal,
            Created::Checkpoints => q.max_checkpoints_per_principal,
        }
    }

    /// What must be loaded before [`Router::check_created`] can decide: the owner's counts,
    /// when it is bounded and they are not in memory.
    pub(crate) fn created_needs(&mut self, owner: Option<&str>, kind: Created) -> Vec<Need> {
        match owner {
            Some(o) if self.created_limit(kind) > 0 && self.created.get(o).is_none() => {
                vec![Need::Counts(o.to_owned())]
            }
            _ => Vec::new(),
        }
    }

    /// Before `owner` creates one more `kind`.
    ///
    /// # Errors
    /// `NeedsLoad` when its counts are not in memory; `QuotaExceeded` at the limit.
    pub(crate) fn check_created(
        &mut self,
        owner: Option<&str>,
        kind: Created,
    ) -> Result<(), RouterError> {
        let limit = self.created_limit(kind);
        let Some(owner) = owner.filter(|_| limit > 0) else {
            return Ok(());
        };
        let counts = match self.created.get(owner) {
            None => return Err(RouterError::NeedsLoad(vec![Need::Counts(owner.to_owned())])),
            Some(c) => c.map(|c| **c).unwrap_or_default(),
        };
        if kind.count(&counts) >= limit as u64 {
            return Err(exceeded(kind.what(), limit));
        }
        Ok(())
    }

    /// After `owner` created one more `kind` (its event was just emitted).
    pub(crate) fn count_created(&mut self, owner: Option<&str>, kind: Created) {
        let Some(owner) = owner else { return };
        let written = self.last_seq();
        match self.created.get_mut(owner) {
            Some(c) => *kind.count_mut(c) += 1,
            // Not in memory: the store counts it (the next load reads it).
            None => return,
        }
        self.created.written(owner, written);
    }

    /// Before a turn is added to a conversation that has `turns` already.
    ///
    /// # Errors
    /// `QuotaExceeded` at the limit.
    pub(crate) fn check_turn_quota(&self, turns: u64) -> Result<(), RouterError> {
        let limit = self.config.quotas.max_turns_per_conversation;
        if limit > 0 && turns >= limit as u64 {
            return Err(exceeded("turns per conversation", limit));
        }
        Ok(())
    }
}
