//! Session state transitions: connect, resume, disconnect, transport loss, expiry.
//!
//! Decisions recorded in `docs/compatibility.md`:
//! - A connection without a session may only call `map/connect` (and `map/authenticate`).
//! - With authentication on, a connect is first admitted (`sessions::auth`): without an accepted
//!   credential (or a trusted transport) it answers `authRequired` and opens no session.
//! - A new session's capabilities are `permissions::grant` for its type and its authenticated
//!   principal (`[permissions.principals."<id>"]`), whether the credential came with
//!   `map/connect` or with the `map/authenticate` that completed it; a resume keeps them,
//!   re-admitted as a fresh connect would be (`Router::readmit`: a `system` session resumed
//!   over a connection that may not be `system` is a `client`; a takeover re-grants too).
//! - `map/connect` on a connection that already has a session returns that session again (with
//!   a fresh resume token) if the participant type matches, else `-32600`.
//! - A resume token (or the id of a *detached* session) resumes that session: same session and
//!   participant id, its orphaned agents reclaimed, `reconnected: true`. An unknown or expired
//!   token is not an error: a new session starts. A token for a session that is still attached
//!   takes the session over (the old connection is closed), which is what a client behind a
//!   half-open TCP connection needs. With authentication on, only the session's own principal
//!   (same `id` and `issuer`) can resume it; anyone else gets a new session.
//! - On `map/disconnect` owned agents are unregistered (policy `unregister`) unless the session
//!   chose otherwise; on transport loss they are orphaned and unregistered if nobody reclaims
//!   them within the resume window (policy `grace-period`).

use std::time::Instant;

use crate::protocol::agent::{Agent, AgentState};
use crate::protocol::capabilities::{Capability, ParticipantType, StreamingCaps};
use crate::protocol::event::{
    AgentOrphanedData, AgentPresenceChangedData, AgentStateChangedData, EventType,
    ParticipantConnectedData, ParticipantDisconnectedData, PermissionsClientUpdatedData,
};
use crate::protocol::ids::{now_ms, random_token, AgentId, EventId, ParticipantId, SessionId};
use crate::protocol::methods::auth::ConnectResponse;
use crate::protocol::methods::permissions::{PermissionsUpdateParams, PermissionsUpdateResult};
use crate::protocol::methods::session::{
    AgentBehavior, ConnectParams, ConnectResult, DisconnectParams, DisconnectPolicy,
    DisconnectResult, Principal, SessionInfo, SystemInfo,
};
use crate::protocol::PROTOCOL_VERSION;

use crate::router::agents::registry::Reclaimed;
use crate::router::caller::Ctx;
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::events::log::Audience;
use crate::router::events::log::EventDraft;
use crate::router::events::log::FilterKeys;
use crate::router::identities::table::IdKind;
use crate::router::ids::ConnId;
use crate::router::outbox::Outbound;
use crate::router::sessions::auth::same_principal;
use crate::router::sessions::auth::Admission;
use crate::router::sessions::auth::Verdict;
use crate::router::sessions::table::Session;
use crate::router::timers::Deadline;

/// The `streaming` block we advertise: acks are honoured (`map/subscribe.ack`), and a
/// subscription that acks gets a credit window (flow control); there is no server-side pause
/// method.
pub(super) fn streaming_caps() -> StreamingCaps {
    StreamingCaps {
        supports_ack: Some(true),
        supports_flow_control: Some(true),
        supports_pause: Some(false),
    }
}

impl Router {
    /// `map/connect`, verifying its credentials on the router task (the method table verifies
    /// them on the connection's task instead and calls [`Router::handle_connect_verified`]).
    pub fn handle_connect(
        &mut self,
        ctx: &Ctx,
        p: ConnectParams,
    ) -> Result<ConnectResponse, RouterError> {
        let verdict = self
            .config
            .auth
            .clone()
            .and_then(|a| crate::router::sessions::auth::verify_connect(&a, &p));
        self.handle_connect_verified(ctx, p, verdict)
    }

    /// `map/connect` with its credentials already checked (`verdict`: `None` when none were
    /// sent or authentication is off).
    pub fn handle_connect_verified(
        &mut self,
        ctx: &Ctx,
        p: ConnectParams,
        verdict: Verdict,
    ) -> Result<ConnectResponse, RouterError> {
        if let Some(v) = &p.protocol_version {
            if v.as_u64() != Some(u64::from(PROTOCOL_VERSION)) {
                return Err(RouterError::InvalidParams(format!(
                    "unsupported protocolVersion {v}; this router speaks {PROTOCOL_VERSION}"
                )));
            }
        }
        self.check_relay_digests(
            ctx.conn,
            &[
                ("resumeTokenDigest", p.resume_token_digest.as_deref()),
                (
                    "nextResumeTokenDigest",
                    p.next_resume_token_digest.as_deref(),
                ),
            ],
        )?;
        let conn = self.conns.get(&ctx.conn).ok_or(RouterError::Unavailable)?;
        let kind = p
            .participant_type
            .unwrap_or_else(|| conn.origin.default_participant_type());

        // A second connect on a connected transport.
        if let Some(existing) = conn.session.clone() {
            let s = self
                .sessions
                .get(&existing)
                .ok_or(RouterError::Unavailable)?;
            if s.kind != kind {
                return Err(RouterError::InvalidRequest(format!(
                    "this connection already has a session as {}; disconnect before connecting as {kind}",
                    s.kind
                )));
            }
            self.rotate_token(ctx.conn, &existing, p.next_resume_token_digest.as_deref());
            return Ok(ConnectResponse::Connected(Box::new(self.connect_result(
                &existing,
                true,
                Vec::new(),
            ))));
        }

        let principal = match self.admit(ctx.conn, verdict) {
            Admission::Admitted(principal) => principal,
            Admission::Refused(answer) => {
                if let Some(c) = self.conns.get_mut(&ctx.conn) {
                    c.pending_auth = Some(Box::new(p));
                }
                return Ok(ConnectResponse::AuthRequired(answer));
            }
        };
        self.open_session(ctx, p, principal)
            .map(|r| ConnectResponse::Connected(Box::new(r)))
    }

    /// Opens (or resumes) the session of an admitted connect.
    pub(crate) fn open_session(
        &mut self,
        ctx: &Ctx,
        p: ConnectParams,
        principal: Option<Principal>,
    ) -> Result<ConnectResult, RouterError> {
        let kind = p.participant_type.unwrap_or_else(|| {
            self.conns
                .get(&ctx.conn)
                .map_or(ParticipantType::Client, |c| {
                    c.origin.default_participant_type()
                })
        });
        self.may_take_type(ctx.conn, kind, principal.as_ref())?;
        if let Some(c) = self.conns.get_mut(&ctx.conn) {
            c.pending_auth = None;
        }

        // Resume? Without `participantType` the session's own type is taken; a different one
        // is refused rather than silently starting a fresh session.
        let resumable = p
            .resume_token
            .as_deref()
            .and_then(|t| self.sessions.by_token(t))
            .or_else(|| {
                // A relay session's: the token's digest (checked: only a cluster node's relay
                // session may send it, `check_relay_digests`).
                p.resume_token_digest
                    .as_deref()
                    .filter(|_| self.is_relay(ctx.conn))
                    .and_then(|key| self.sessions.by_token_key(key))
            })
            .or_else(|| {
                p.session_id
                    .as_ref()
                    .and_then(|id| self.sessions.get(id))
                    .filter(|s| s.conn.is_none())
            })
            .filter(|s| {
                same_principal(s.principal.as_ref(), principal.as_ref())
                    || (kind == ParticipantType::System
                        && s.principal.is_some()
                        && principal.is_some())
            })
            .map(|s| s.id.clone());
        if let Some(session_id) = resumable {
            // Re-admitted as a fresh connect here would be (a system session over a
            // connection that may not be system is not system any more).
            self.readmit(&session_id, Some(ctx.conn), false);
            let session_kind = self.sessions.get(&session_id).map_or(kind, |s| s.kind);
            if p.participant_type.is_some_and(|k| k != session_kind) {
                return Err(RouterError::InvalidParams(format!(
                    "the session to resume is a {session_kind} session; connect as {session_kind} to resume it"
                )));
            }
            let detached_principal = self
                .sessions
                .get(&session_id)
                .filter(|s| s.conn.is_none())
                .and_then(|s| s.principal.as_ref())
                .filter(|p| !crate::auth::is_service(p))
                .map(|p| p.id.clone());
            if let Some(principal) = detached_principal {
                self.check_principal_quota(&principal)?;
            }
            self.renew_principal(&session_id, principal);
            return Ok(self.resume_session(
                ctx.conn,
                &session_id,
                p.reclaim_agents.as_deref(),
                p.next_resume_token_digest.as_deref(),
            ));
        }

        // A new session. An id another principal owns (or a reserved one) is not taken: the
        // newcomer gets a fresh one (router::identities).
        let system = kind == ParticipantType::System;
        let participant = match &p.participant_id {
            Some(id)
                if !id.as_str().is_empty()
                    && self
                        .may_take(IdKind::Participant, id.as_str(), principal.as_ref(), system)
                        .is_ok() =>
            {
                match self.sessions.by_participant(id) {
                    Some(s) if s.conn.is_some() => ParticipantId::generate(),
                    Some(s)
                        if !system && !same_principal(s.principal.as_ref(), principal.as_ref()) =>
                    {
                        ParticipantId::generate()
                    }
                    Some(detached) => {
                        // The detached session loses its id to the newcomer of the same
                        // principal; its orphaned agents stay orphaned until reclaimed or their
                        // grace period ends.
                        let old = detached.id.clone();
                        self.sessions.remove(&old);
                        id.clone()
                    }
                    None => id.clone(),
                }
            }
            _ => ParticipantId::generate(),
        };
        // `[permissions.principals."<id>"]` applies to the authenticated principal (a resumed
        // session keeps the grant it got here: resuming needs the same principal).
        let mut capabilities = crate::router::permissions::grant(
            &self.config.permissions,
            kind,
            principal.as_ref().map(|p| p.id.as_str()),
            p.capabilities.as_ref(),
        );
        capabilities.streaming = Some(streaming_caps());
        let session = Session {
            id: SessionId::generate(),
            participant: participant.clone(),
            kind,
            name: p.name.clone(),
            capabilities,
            created_at: now_ms(),
            last_active_at: now_ms(),
            conn: Some(ctx.conn),
            resume_token: random_token("resume_"),
            token_key: "".into(),
            policy: p.disconnect_policy.clone(),
            primary_agent: None,
            orphaned: Vec::new(),
            detached_at: None,
            principal,
            auth_epoch: 0,
            handed_over: self.conns.get(&ctx.conn).is_some_and(|c| {
                c.origin == crate::router::sessions::table::ConnOrigin::Remote || c.node.is_some()
            }),
        };
        // NB: the router's service principal (the gateways' own sessions) is not an identity
        // to bound: its sessions are the router's, a fixed few.
        if let Some(principal) = session
            .principal
            .as_ref()
            .filter(|p| !crate::auth::is_service(p))
        {
            self.check_principal_quota(&principal.id)?;
        }
        let session_id = session.id.clone();
        let owner = session.principal.clone();
        self.sessions.insert(session);
        if self.is_relay(ctx.conn) {
            self.rotate_token(ctx.conn, &session_id, p.next_resume_token_digest.as_deref());
        }
        self.claim(IdKind::Participant, participant.as_str(), owner.as_ref());
        self.arm_credential(&session_id);
        if let Some(c) = self.conns.get_mut(&ctx.conn) {
            c.session = Some(session_id.clone());
        }
        self.emit_participant_event(
            EventType::ParticipantConnected,
            &participant.clone(),
            &[],
            &ParticipantConnectedData {
                participant_id: participant,
                participant_type: kind,
                name: p.name,
                reconnected: None,
            },
            Vec::new(),
        );
        Ok(self.connect_result(&session_id, false, Vec::new()))
    }

    pub(crate) fn connect_result(
        &self,
        session_id: &SessionId,
        reconnected: bool,
        reclaimed: Vec<Agent>,
    ) -> ConnectResult {
        // Only called with a session id that exists.
        let s = self
            .sessions
            .get(session_id)
            .cloned()
            .unwrap_or_else(|| unreachable_session(session_id));
        ConnectResult {
            protocol_version: PROTOCOL_VERSION,
            session_id: s.id.clone(),
            participant_id: s.participant.clone(),
            participant_type: s.kind,
            capabilities: s.capabilities.clone(),
            system_info: SystemInfo {
                name: self.config.name.clone(),
                version: self.config.version.clone(),
            },
            reconnected,
            owned_agents: self.registry.owned_by(&s.participant),
            reclaimed_agents: reclaimed,
            resume_token: s.resume_token.clone(),
            principal: s.principal.clone(),
        }
    }

    /// Attaches `conn` to an existing session.
    pub(crate) fn resume_session(
        &mut self,
        conn: ConnId,
        session_id: &SessionId,
        reclaim_only: Option<&[AgentId]>,
        next_token_key: Option<&str>,
    ) -> ConnectResult {
        // Take the session over from a connection that still holds it.
        if let Some(old_conn) = self.sessions.get(session_id).and_then(|s| s.conn) {
            if old_conn != conn {
                self.bus.remove_session(session_id);
                if let Some(c) = self.conns.get_mut(&old_conn) {
                    c.session = None;
                    let _ = c.outbox.try_push(Outbound::Close {
                        code: 4000,
                        reason: "session resumed on another connection".into(),
                    });
                }
            }
        }
        let Some(s) = self.sessions.get_mut(session_id) else {
            return unreachable_session(session_id);
        };
        s.conn = Some(conn);
        s.detached_at = None;
        let participant = s.participant.clone();
        let kind = s.kind;
        let name = s.name.clone();
        let orphaned = std::mem::take(&mut s.orphaned);
        self.rotate_token(conn, session_id, next_token_key);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.session = Some(session_id.clone());
        }
        let reclaiming: Vec<AgentId> = orphaned
            .iter()
            .filter(|a| reclaim_only.is_none_or(|only| only.contains(*a)))
            .cloned()
            .collect();
        let connected = self.emit_participant_event(
            EventType::ParticipantConnected,
            &participant,
            &reclaiming,
            &ParticipantConnectedData {
                participant_id: participant.clone(),
                participant_type: kind,
                name,
                reconnected: Some(true),
            },
            Vec::new(),
        );
        let mut reclaimed = Vec::new();
        for agent in orphaned {
            if reclaim_only.is_some_and(|only| !only.contains(&agent)) {
                continue;
            }
            if let Some(a) = self.reclaim_orphan(&agent, &participant, vec![connected]) {
                reclaimed.push(a);
            }
        }
        if let Some(s) = self.sessions.get_mut(session_id) {
            if s.primary_agent.is_none() {
                s.primary_agent = reclaimed.first().map(|a| a.id.clone());
            }
        }
        self.connect_result(session_id, true, reclaimed)
    }

    /// Whether `conn` is a relay session a cluster node opened for one of its connections
    /// (`server::relay`; its `node` is the standby's).
    pub(super) fn is_relay(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_some_and(|c| c.node.is_some())
    }

    /// Refuses the relay-only token digests (`resumeTokenDigest`, `nextResumeTokenDigest`:
    /// hex SHA-256) unless `conn` is a cluster node's relay session: a digest is a usable
    /// credential there, so a client may never send one, on any node.
    pub(super) fn check_relay_digests(
        &self,
        conn: ConnId,
        digests: &[(&str, Option<&str>)],
    ) -> Result<(), RouterError> {
        for (name, digest) in digests {
            let Some(digest) = digest else {
                continue;
            };
            if !self.is_relay(conn) {
                return Err(RouterError::InvalidParams(format!(
                    "`{name}` is sent only by a cluster node's relay session, never by a client"
                )));
            }
            if digest.len() != 64
                || !digest
                    .bytes()
                    .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            {
                return Err(RouterError::InvalidParams(format!(
                    "`{name}` must be a SHA-256 digest in lowercase hex"
                )));
            }
        }
        Ok(())
    }

    /// The relay-only `relayTraceparent` of a call (`relay`: as sent): refused unless `conn`
    /// is a cluster node's relay session (a client could otherwise hang its calls under any
    /// span, or another's trace); there, a valid W3C `traceparent` naming that node's span for
    /// the call (`router::relay`), which becomes the call's trace context.
    pub(crate) fn relay_trace(
        &self,
        conn: ConnId,
        relay: Option<&str>,
    ) -> Result<Option<crate::protocol::trace::TraceContext>, RouterError> {
        const NAME: &str = "relayTraceparent";
        let Some(relay) = relay else {
            return Ok(None);
        };
        if !self.is_relay(conn) {
            return Err(RouterError::InvalidParams(format!(
                "`{NAME}` is sent only by a cluster node's relay session, never by a client"
            )));
        }
        crate::protocol::trace::TraceContext::new(relay, None)
            .map(Some)
            .ok_or_else(|| {
                RouterError::InvalidParams(format!("`{NAME}` must be a W3C traceparent"))
            })
    }

    /// Gives session `id` its next resume token. On a relay session (`conn`), this node never
    /// holds the token in clear, so none crosses NATS: it keeps the digest the standby sent
    /// (`next`, the standby puts the token it drew in its client's answer), or the digest of a
    /// token nobody holds when none was sent; its answers carry an empty `resumeToken`.
    /// Elsewhere a fresh token.
    pub(super) fn rotate_token(&mut self, conn: ConnId, id: &SessionId, next: Option<&str>) {
        if self.is_relay(conn) {
            let key = next.map_or_else(
                || crate::router::sessions::table::token_key(&random_token("resume_")),
                str::to_owned,
            );
            self.sessions.set_token_key(id, key);
        } else {
            self.sessions.set_token(id, random_token("resume_"));
        }
    }

    /// Gives an orphaned agent back to `owner`. Returns the agent if it was orphaned.
    pub(crate) fn reclaim_orphan(
        &mut self,
        agent: &AgentId,
        owner: &ParticipantId,
        caused_by: Vec<EventId>,
    ) -> Option<Agent> {
        let node = self.node_of(owner);
        let Reclaimed { restored, hint } =
            self.registry
                .reclaim(agent, owner, node.as_deref(), now_ms())?;
        let snapshot = self.agent_view().whole(agent)?;
        let caused_by = if caused_by.is_empty() {
            hint.into_iter().collect()
        } else {
            caused_by
        };
        let reclaimed = self.emit_agent_event(
            EventType::AgentStateChanged,
            &snapshot,
            &AgentStateChangedData::new(
                agent.clone(),
                AgentState::ORPHANED,
                restored,
                Some("reclaimed".into()),
            ),
            caused_by,
        );
        self.emit_presence(&snapshot, vec![reclaimed]);
        // Messages kept while it was away (meta.delivery acknowledged/guaranteed).
        self.flush_offline(agent, Some(reclaimed));
        Some(snapshot)
    }

    /// `map/disconnect`.
    pub fn handle_disconnect(
        &mut self,
        ctx: &Ctx,
        p: DisconnectParams,
    ) -> Result<DisconnectResult, RouterError> {
        let caller = self.caller(ctx)?;
        let policy = p
            .policy
            .or_else(|| {
                self.sessions
                    .get(&caller.session)
                    .and_then(|s| s.policy.clone())
            })
            .unwrap_or(DisconnectPolicy {
                agent_behavior: AgentBehavior::Unregister,
                grace_period_ms: None,
                notify_subscribers: None,
            });
        self.check_relay_digests(
            ctx.conn,
            &[(
                "nextResumeTokenDigest",
                p.next_resume_token_digest.as_deref(),
            )],
        )?;
        let reason = p.reason.unwrap_or_else(|| "disconnect".into());
        // Its result carries a fresh token (a relay session's: the standby's, by digest).
        self.rotate_token(
            ctx.conn,
            &caller.session,
            p.next_resume_token_digest.as_deref(),
        );
        self.detach(ctx.conn, &policy, &reason, false);
        let s = self
            .sessions
            .get(&caller.session)
            .ok_or(RouterError::Unavailable)?;
        Ok(DisconnectResult {
            acknowledged: true,
            session: SessionInfo {
                id: s.id.clone(),
                created_at: s.created_at,
                closed_at: Some(now_ms()),
            },
            resume_token: s.resume_token.clone(),
        })
    }

    /// The transport of `conn` closed (or the router is shutting down).
    pub(crate) fn handle_transport_closed(&mut self, conn: ConnId) {
        self.trajectories.connection_closed(conn);
        let has_session = self.conns.get(&conn).is_some_and(|c| c.session.is_some());
        if has_session {
            let policy = crate::router::sessions::table::policy_when_lost(
                self.conns
                    .get(&conn)
                    .and_then(|c| c.session.as_ref())
                    .and_then(|s| self.sessions.get(s)),
            );
            let reason = if self.shutting_down {
                "shutdown"
            } else {
                "transport_closed"
            };
            // The peer is gone and never sees a new token: keep the one it holds.
            self.detach(conn, &policy, reason, false);
        }
        self.conns.remove(&conn);
    }

    /// Detaches the session on `conn`: emits `participant_disconnected`, applies the agent
    /// policy, drops subscriptions and schedules expiry. `rotate_token` issues a fresh resume
    /// token (for `map/disconnect`, whose result carries it); after a lost transport the token
    /// the client already holds stays valid.
    pub(super) fn detach(
        &mut self,
        conn: ConnId,
        policy: &DisconnectPolicy,
        reason: &str,
        rotate_token: bool,
    ) {
        let Some(session_id) = self.conns.get_mut(&conn).and_then(|c| c.session.take()) else {
            return;
        };
        if let Some(c) = self.conns.get_mut(&conn) {
            c.pending.clear();
        }
        self.bus.remove_session(&session_id);
        if rotate_token {
            self.sessions
                .set_token(&session_id, random_token("resume_"));
        }
        let supervised = self.conns.get(&conn).is_some_and(|c| {
            matches!(
                c.origin,
                crate::router::sessions::table::ConnOrigin::Supervised { .. }
            )
        });
        self.detach_session(&session_id, supervised, policy, reason);
    }

    /// The detach of a session whose connection is gone (see [`Router::detach`]); also the
    /// sessions a cluster's previous live node left connected (`router::handover`).
    pub(crate) fn detach_session(
        &mut self,
        session_id: &SessionId,
        supervised: bool,
        policy: &DisconnectPolicy,
        reason: &str,
    ) {
        let session_id = session_id.clone();
        // A peer link speaks for its system only while its session is attached.
        self.federation.links.session_gone(&session_id);
        self.federation.outbound.session_gone(&session_id);
        let Some(s) = self.sessions.get_mut(&session_id) else {
            return;
        };
        s.conn = None;
        s.detached_at = Some(Instant::now());
        let participant = s.participant.clone();
        let kind = s.kind;

        let disconnected = self.emit_participant_event(
            EventType::ParticipantDisconnected,
            &participant,
            &[],
            &ParticipantDisconnectedData {
                participant_id: participant.clone(),
                participant_type: kind,
                reason: reason.into(),
            },
            Vec::new(),
        );

        if supervised {
            // The supervisor reports the process's exit; that decides the agent's fate.
            self.release_supervised(&participant);
            let window = self.config.resume_window;
            self.schedule(Instant::now() + window, Deadline::SessionExpiry(session_id));
            return;
        }

        // Children before parents, so an unregister never leaves a live child under a removed
        // parent it owns.
        let mut owned = self.registry.owned_by(&participant);
        owned.sort_by_key(|a| std::cmp::Reverse(self.registry.ancestors(a, None).len()));
        match policy.agent_behavior {
            AgentBehavior::Unregister => {
                for agent in owned {
                    self.remove_agent(&agent, "owner_disconnected", vec![disconnected]);
                }
            }
            AgentBehavior::Orphan | AgentBehavior::GracePeriod => {
                let grace = match policy.agent_behavior {
                    AgentBehavior::GracePeriod => Some(
                        policy
                            .grace_period_ms
                            .map(std::time::Duration::from_millis)
                            .unwrap_or(self.config.resume_window),
                    ),
                    _ => None,
                };
                let expires = grace.map(|g| Instant::now() + g);
                for agent in &owned {
                    self.orphan_agent(agent, &participant, vec![disconnected], expires);
                    if let Some(at) = expires {
                        self.schedule(at, Deadline::OrphanExpiry(agent.clone()));
                    }
                }
                if let Some(s) = self.sessions.get_mut(&session_id) {
                    s.orphaned = owned;
                }
            }
        }
        let window = self.config.resume_window;
        self.schedule(Instant::now() + window, Deadline::SessionExpiry(session_id));
    }

    /// In cluster mode, the node participant `p`'s connection is on: the standby whose relay
    /// session it is, or this node. `None` on a single router.
    pub(crate) fn node_of(&self, p: &ParticipantId) -> Option<String> {
        let here = self.config.node.as_deref()?;
        let conn = self.sessions.by_participant(p).and_then(|s| s.conn);
        let there = conn
            .and_then(|c| self.conns.get(&c))
            .and_then(|c| c.node.clone());
        Some(there.as_deref().unwrap_or(here).to_owned())
    }

    /// Emits `agent.presence.changed` with the agent's presence as recorded.
    fn emit_presence(&mut self, agent: &Agent, caused_by: Vec<EventId>) {
        let Some(p) = agent.presence.clone() else {
            return;
        };
        self.emit_agent_event(
            EventType::AgentPresenceChanged,
            agent,
            &AgentPresenceChangedData {
                agent_id: agent.id.clone(),
                status: p.status,
                since: p.since,
                last_seen: p.last_seen,
                node: p.node,
            },
            caused_by,
        );
    }

    fn orphan_agent(
        &mut self,
        agent: &AgentId,
        previous_owner: &ParticipantId,
        caused_by: Vec<EventId>,
        expires: Option<Instant>,
    ) {
        if self.registry.orphan(agent, expires, now_ms()).is_none() {
            return;
        }
        let Some(snapshot) = self.agent_view().whole(agent) else {
            return;
        };
        let orphaned = self.emit_agent_event(
            EventType::AgentOrphaned,
            &snapshot,
            &AgentOrphanedData {
                agent_id: agent.clone(),
                previous_owner: previous_owner.clone(),
            },
            caused_by,
        );
        self.emit_presence(&snapshot, vec![orphaned]);
        self.set_cause_hint(agent, orphaned);
    }

    pub(crate) fn expire_session(&mut self, session: &SessionId) {
        let expired = self
            .sessions
            .get(session)
            .and_then(|s| s.detached_at)
            .is_some_and(|at| {
                at.elapsed() + std::time::Duration::from_millis(5) >= self.config.resume_window
            });
        if expired {
            self.sessions.remove(session);
        }
    }

    pub(crate) fn expire_orphan(&mut self, agent: &AgentId) {
        let expired = self.registry.orphan_expired(agent, Instant::now());
        if let Some(reason) = expired {
            // Descendants orphaned by the same detach carry the same deadline and were queued
            // before their ancestors (see `detach`), so they are already gone.
            let hint = self.take_cause_hint(agent);
            self.remove_agent(agent, reason, hint);
        }
    }
}

fn unreachable_session<T>(id: &SessionId) -> T {
    // Callers only pass ids they just looked up on the same (single-threaded) router task.
    panic!("session {id} vanished while the router held it")
}

impl Router {
    /// On a follower: the writer changed a participant's permissions (a followed
    /// `permissions_client_updated`, after it was offered to the subscriptions): its session
    /// here takes the effective permissions, and loses the subscriptions this node serves it
    /// once `observation.canObserve` is revoked, as on the writer.
    pub(crate) fn followed_permissions(
        &mut self,
        record: &crate::router::events::log::EventRecord,
    ) {
        if !self.config.follower || record.kind != EventType::PermissionsClientUpdated {
            return;
        }
        #[derive(serde::Deserialize)]
        struct Event {
            data: PermissionsClientUpdatedData,
        }
        let Ok(event) = serde_json::from_str::<Event>(&record.json) else {
            tracing::warn!(event = %record.seq, "follower: an unreadable permissions_client_updated");
            return;
        };
        let Some(session) = self
            .sessions
            .by_participant(&event.data.client_id)
            .map(|s| s.id.clone())
        else {
            return;
        };
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        let mut effective = event.data.effective_permissions;
        effective.streaming = Some(streaming_caps());
        let observe = effective.has(Capability::CanObserve);
        s.capabilities = effective;
        if !observe {
            self.bus.remove_session(&session);
        }
    }

    /// `map/permissions/update`: system participants only. The flags given are set on the
    /// target session (a per-group merge); the next request and the next event already see
    /// them. Revoking `observation.canObserve` ends the target's subscriptions after the
    /// `permissions_client_updated` event that announces it.
    pub fn handle_permissions_update(
        &mut self,
        ctx: &Ctx,
        p: PermissionsUpdateParams,
    ) -> Result<PermissionsUpdateResult, RouterError> {
        let caller = self.caller(ctx)?;
        if caller.kind != ParticipantType::System {
            return Err(RouterError::PermissionDenied(
                "map/permissions/update is for system participants".into(),
            ));
        }
        let session = self
            .sessions
            .by_participant(&p.client_id)
            .map(|s| s.id.clone())
            .ok_or_else(|| {
                RouterError::InvalidParams(format!("Client {} not found", p.client_id))
            })?;
        let s = self
            .sessions
            .get_mut(&session)
            .ok_or(RouterError::Unavailable)?;
        let mut effective = s.capabilities.clone().overlaid_by(&p.permissions);
        effective.streaming = Some(streaming_caps());
        s.capabilities = effective.clone();
        self.emit(EventDraft {
            kind: EventType::PermissionsClientUpdated,
            source: Some(caller.participant.as_arc().clone()),
            data: crate::router::core::to_json(&PermissionsClientUpdatedData {
                client_id: p.client_id.clone(),
                changes: p.permissions,
                effective_permissions: effective.clone(),
                changed_by: caller.participant.clone(),
                updated_by: caller.participant.clone(),
            }),
            caused_by: Vec::new(),
            keys: FilterKeys::default(),
            audience: Audience::Participants {
                who: vec![p.client_id],
            },
        });
        if !effective.has(Capability::CanObserve) {
            self.bus.remove_session(&session);
        }
        Ok(PermissionsUpdateResult {
            success: true,
            effective_permissions: effective,
        })
    }
}
