//! Who may take an id, and recording who did (docs/security.md, "Identity").
//!
//! Rules:
//! - A **reserved** id (`RouterConfig::reserved_ids`: the gateways' own), and its
//!   node-qualified forms `<id>@<node>` (the gateways of a cluster's standbys), are only for
//!   the router's service principal.
//! - With authentication on, an id belongs to the principal that first took it: connecting as a
//!   participant id, registering or spawning an agent id (explicitly or not). Only that
//!   principal, or a `system` session, may take it again: reclaim the orphaned agent, take the
//!   detached participant id, register the agent id after a restart. Anyone else gets a fresh
//!   participant id, or 1003 for an agent id it names.
//! - With authentication off nobody is anybody: nothing is recorded and only reserved ids are
//!   refused (as before ownership existed).
//! - A claim is logged once, and again before the stream's limits would delete it (cluster
//!   mode with limits: `Router::refresh_saved`), so every node that opens the stream knows
//!   every owner.

use crate::auth::is_service;
use crate::protocol::methods::session::Principal;

use crate::protocol::capabilities::ParticipantType;
use crate::protocol::event::EventType;
use crate::protocol::methods::identities::{
    IdentityOwner, IdentityReleaseParams, IdentityReleaseResult,
};
use crate::router::caller::Ctx;
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::events::log::{Audience, EventDraft, FilterKeys};
use crate::router::identities::table::{key_of, IdKind, Owner};

/// Why an id may not be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Reserved for the router's services.
    Reserved,
    /// Another principal owns it.
    Owned,
}

impl Refusal {
    /// The 1003 error for an agent id named explicitly.
    pub fn agent_error(&self, id: &str) -> RouterError {
        RouterError::PermissionDenied(match self {
            Self::Reserved => format!("agent id {id} is reserved for the router's gateways"),
            Self::Owned => format!(
                "agent id {id} belongs to another principal: only its owner or a system \\
                 participant may register or reclaim it"
            ),
        })
    }
}

impl Router {
    /// `map/identities/release`: a system participant frees an id (an operator's decision, for
    /// example to hand a departed user's agent id to someone else).
    ///
    /// # Errors
    /// 1003 for anyone but a system participant; -32602 unless exactly one id is given.
    pub fn handle_identity_release(
        &mut self,
        ctx: &Ctx,
        p: IdentityReleaseParams,
    ) -> Result<IdentityReleaseResult, RouterError> {
        let caller = self.caller(ctx)?;
        if caller.kind != ParticipantType::System {
            return Err(RouterError::PermissionDenied(
                "map/identities/release is for system participants".into(),
            ));
        }
        let (kind, id) = match (p.participant_id, p.agent_id) {
            (Some(id), None) => (IdKind::Participant, id),
            (None, Some(id)) => (IdKind::Agent, id),
            _ => {
                return Err(RouterError::InvalidParams(
                    "give exactly one of participantId and agentId".into(),
                ))
            }
        };
        let previous = self.identities.release(kind, &id);
        if previous.is_some() {
            self.record_claim(kind, &id, None);
        }
        Ok(IdentityReleaseResult {
            released: previous.is_some(),
            previous_owner: previous.map(|o| IdentityOwner {
                id: o.id,
                issuer: o.issuer,
            }),
        })
    }

    /// Whether `id` is reserved for the service principal: a reserved id, one of its
    /// node-qualified forms `<reserved id>@<node>` (a cluster standby's gateway sessions), or
    /// the federated form `<system>:agent:<id>`, which names another system's agent (as the
    /// sender of a routed message and the address of its reply): no local participant may
    /// pose as one (`router::federation`).
    pub(crate) fn is_reserved(&self, id: &str) -> bool {
        if crate::protocol::methods::federation::Federated::Agent
            .split(id)
            .is_some()
        {
            return true;
        }
        let base = id.split_once('@').map_or(id, |(base, _)| base);
        self.config
            .reserved_ids
            .iter()
            .any(|r| r == id || r == base)
    }

    /// Whether a session of `principal` (`system`: its type is `system`) may take `id`.
    ///
    /// # Errors
    /// Why not.
    pub(crate) fn may_take(
        &self,
        kind: IdKind,
        id: &str,
        principal: Option<&Principal>,
        system: bool,
    ) -> Result<(), Refusal> {
        if self.is_reserved(id) {
            return if principal.is_some_and(is_service) {
                Ok(())
            } else {
                Err(Refusal::Reserved)
            };
        }
        let (Some(_), Some(p)) = (&self.config.auth, principal) else {
            return Ok(());
        };
        match self.identities.owner(kind, id) {
            Some(owner) if !owner.is(p) && !system => Err(Refusal::Owned),
            // A follower claims nothing (it writes no log): an id is the caller's there only
            // once the writer's log says so.
            None if self.config.follower && !system => Err(Refusal::Owned),
            _ => Ok(()),
        }
    }

    /// On a follower: the writer gave participant id `id` to `principal` (its answer to a
    /// relayed `map/connect`, `router::relay`) before this node followed the claim. Recorded
    /// here as the writer's claim will say; an id this node knows another owner of is left
    /// alone (the log decides), and nothing is evicted (the writer applies the cap).
    pub(crate) fn relayed_claim(&mut self, id: &str, principal: Option<&Principal>) {
        let (true, Some(_), Some(p)) = (self.config.follower, &self.config.auth, principal) else {
            return;
        };
        if self.identities.owner(IdKind::Participant, id).is_none() {
            let owner = crate::router::identities::table::Owner::of(p);
            self.identities
                .claim(IdKind::Participant, id, &owner, |_, _| true);
        }
    }

    /// Records that a session of `principal` took `id` (with authentication on; nothing
    /// otherwise). Ids the principal loses to its cap are those it used least recently and no
    /// live session or agent holds.
    pub(crate) fn claim(&mut self, kind: IdKind, id: &str, principal: Option<&Principal>) {
        let (Some(_), Some(p)) = (&self.config.auth, principal) else {
            return;
        };
        if self.config.follower {
            return; // a follower writes no claim (see `may_take`)
        }
        if self.identities.owner(kind, id).is_some_and(|o| !o.is(p)) {
            // A system session took someone else's id: the id keeps its owner.
            return;
        }
        let owner = Owner::of(p);
        let sessions = &self.sessions;
        let registry = &self.registry;
        let in_use = |k: IdKind, i: &str| match k {
            IdKind::Participant => sessions.by_participant(&i.into()).is_some(),
            IdKind::Agent => registry.contains(&i.into()),
        };
        let (new, evicted) = self.identities.claim(kind, id, &owner, in_use);
        if new {
            self.record_claim(kind, id, Some(&owner));
        }
        for (k, i) in evicted {
            self.record_claim(k, &i, None);
        }
    }

    /// The principal of the session behind `participant`, if any.
    pub(crate) fn principal_of(
        &self,
        participant: &crate::protocol::ids::ParticipantId,
    ) -> Option<&Principal> {
        self.sessions
            .by_participant(participant)
            .and_then(|s| s.principal())
    }

    /// Makes a claim (or, `owner: None`, a release) durable: an internal `identity.claimed` /
    /// `identity.released` event, which the store keeps (table `claims`) and no subscriber is
    /// ever shown.
    pub(crate) fn record_claim(&mut self, kind: IdKind, id: &str, owner: Option<&Owner>) {
        #[derive(serde::Serialize)]
        struct Claim<'a> {
            id: String,
            #[serde(skip_serializing_if = "Option::is_none")]
            owner: Option<&'a Owner>,
        }
        #[derive(serde::Serialize)]
        struct Data<'a> {
            claim: Claim<'a>,
        }
        let data = crate::router::core::to_json(&Data {
            claim: Claim {
                id: key_of(kind, id),
                owner,
            },
        });
        if owner.is_some() {
            // Where it is logged, to log it again before the stream's limits delete it
            // (`Router::refresh_saved`).
            let seq = self.bus.log.next_seq();
            self.identities
                .logged(kind, id, seq, crate::protocol::ids::now_ms());
        }
        self.emit(EventDraft {
            kind: if owner.is_some() {
                EventType::IdentityClaimed
            } else {
                EventType::IdentityReleased
            },
            source: None,
            data,
            caused_by: Vec::new(),
            keys: FilterKeys::default(),
            audience: Audience::System,
        });
    }
}
