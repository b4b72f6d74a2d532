//! Authentication as the router applies it: admission of a connect, `map/authenticate`,
//! `map/auth/refresh`, and the end of a session's credential.
//!
//! Credentials are verified before the call reaches the router (on the connection's task, see
//! `dispatch.rs`); the handlers here get the verdict and decide what it means for the
//! connection. Rules (docs/security.md, docs/compatibility.md §3):
//! - **Admission.** Authentication off: everyone is admitted, without a principal. On: a
//!   connect with an accepted credential gets its principal; one without credentials over a
//!   trusted transport gets the transport's principal; anything else answers `authRequired`
//!   (plus `error` when a credential was refused), opens no session, and keeps the connect's
//!   params on the connection until `map/authenticate` completes it.
//! - **System participants.** With authentication on, `participantType: "system"` (which
//!   passes every permission rule) is only for principals listed in `auth.system_principals`
//!   and for connections over a trusted transport; anyone else gets 1003.
//! - **Resume** needs the same principal (`id` and `issuer`) as the session: a resume token
//!   alone never opens a session when authentication is on. The session is re-admitted as a
//!   fresh connect would be (`Router::readmit`): `system` only where its principal may be
//!   system; a session a takeover restored also gets this node's grant (`router::handover`).
//! - **Refresh** swaps the credential for one of the same principal; the session's expiry moves.
//! - **Expiry.** `map/auth/expiring` goes out once, `expiry_notice` (at most half the remaining
//!   life) before `exp`. At `exp` + leeway the session is detached as on a lost transport
//!   (reason `credential_expired`, agents orphaned for the resume window) and the connection is
//!   closed with code 4001; resuming then needs a new credential of the same principal.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::auth::{trusted_principal, Authenticator, TrustedTransport};
use crate::protocol::capabilities::ParticipantType;
use crate::protocol::ids::{now_ms, SessionId};
use crate::protocol::methods::auth::{
    AuthError, AuthErrorCode, AuthExpiringParams, AuthRequiredResult, AuthenticateResult,
    RefreshParams, RefreshResult,
};
use crate::protocol::methods::notifications;
use crate::protocol::methods::session::{AuthCredentials, ConnectParams, Principal};

use crate::router::caller::Ctx;
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::ids::ConnId;
use crate::router::outbox::Outbound;
use crate::router::sessions::table::ConnOrigin;
use crate::router::timers::Deadline;

/// The outcome of verifying a call's credentials: `None` when none were sent (or
/// authentication is off).
pub type Verdict = Option<Result<Principal, AuthError>>;

/// WebSocket close code for a session whose credential expired (private range; 4000 is the
/// takeover by a resume).
pub const CLOSE_CREDENTIAL_EXPIRED: u16 = 4001;

/// What a connect is allowed.
#[derive(Debug)]
pub(crate) enum Admission {
    /// Open a session with this principal (`None`: authentication is off).
    Admitted(Option<Principal>),
    /// Answer `authRequired`.
    Refused(AuthRequiredResult),
}

/// Verifies `map/connect`'s `auth` (`{method: "none"}` counts as no credentials).
pub fn verify_connect(auth: &Authenticator, p: &ConnectParams) -> Verdict {
    let c = p.auth.as_ref().filter(|c| c.method != "none")?;
    Some(auth.verify(c))
}

/// Verifies `map/authenticate`'s params.
pub fn verify_authenticate(auth: &Authenticator, p: &AuthCredentials) -> Verdict {
    Some(auth.verify(p))
}

/// Verifies `map/auth/refresh`'s new credential.
pub fn verify_refresh(auth: &Authenticator, p: &RefreshParams) -> Verdict {
    Some(auth.verify_refresh(p))
}

/// Whether a session with principal `session` may be resumed by a connect with `caller`.
pub(crate) fn same_principal(session: Option<&Principal>, caller: Option<&Principal>) -> bool {
    match (session, caller) {
        (None, None) => true,
        (Some(s), Some(c)) => s.same_subject(c),
        _ => false,
    }
}

fn trusted_transport(origin: &ConnOrigin) -> Option<(TrustedTransport, Option<&str>)> {
    match origin {
        ConnOrigin::Remote | ConnOrigin::Delegated(_) => None,
        ConnOrigin::InProcess => Some((TrustedTransport::InProcess, None)),
        ConnOrigin::Stdio => Some((TrustedTransport::Stdio, None)),
        ConnOrigin::Supervised { agent, .. } => {
            Some((TrustedTransport::Supervised, Some(agent.as_str())))
        }
    }
}

/// The `group.flag` paths `before` grants and `after` does not.
fn lost_flags(
    before: &crate::protocol::capabilities::ParticipantCapabilities,
    after: &crate::protocol::capabilities::ParticipantCapabilities,
) -> Vec<String> {
    if before == after {
        // The common case (a takeover re-admits thousands under the same configuration):
        // nothing to lose, and no JSON to build for each session.
        return Vec::new();
    }
    let (before, after) = (
        serde_json::to_value(before).unwrap_or_default(),
        serde_json::to_value(after).unwrap_or_default(),
    );
    let mut lost = Vec::new();
    if let Some(groups) = before.as_object() {
        for (group, flags) in groups {
            for (flag, on) in flags.as_object().into_iter().flatten() {
                if on == &serde_json::Value::Bool(true)
                    && after[group][flag] != serde_json::Value::Bool(true)
                {
                    lost.push(format!("{group}.{flag}"));
                }
            }
        }
    }
    lost
}

fn failed(error: AuthError) -> AuthenticateResult {
    AuthenticateResult {
        success: false,
        session: None,
        error: Some(error),
    }
}

impl Router {
    fn authenticator(&self) -> Option<Arc<Authenticator>> {
        self.config.auth.clone()
    }

    /// Decides whether a connect on `conn` may open a session, and as whom.
    pub(crate) fn admit(&self, conn: ConnId, verdict: Verdict) -> Admission {
        if let Some(ConnOrigin::Delegated(principal)) = self.conns.get(&conn).map(|c| &c.origin) {
            // Verified by whoever opened the link (a gateway, for its caller), or the router's
            // own service. With authentication off only the service keeps its principal: the
            // others act as every participant does then, without one.
            if self.authenticator().is_some() || crate::auth::is_service(principal) {
                return Admission::Admitted(Some(principal.clone()));
            }
            return Admission::Admitted(None);
        }
        let Some(auth) = self.authenticator() else {
            return Admission::Admitted(None);
        };
        match verdict {
            Some(Ok(principal)) => Admission::Admitted(Some(principal)),
            Some(Err(e)) => {
                tracing::info!(%conn, code = ?e.code, reason = %e.message, "connect refused: credential not accepted");
                Admission::Refused(auth.auth_required(Some(e)))
            }
            None => {
                let trusted = self
                    .conns
                    .get(&conn)
                    .and_then(|c| trusted_transport(&c.origin))
                    .filter(|(t, _)| auth.trusts(*t));
                match trusted {
                    Some((t, agent)) => Admission::Admitted(Some(trusted_principal(t, agent))),
                    None => Admission::Refused(auth.auth_required(None)),
                }
            }
        }
    }

    /// Whether a session of type `kind` may be opened on `conn` for `principal`: with
    /// authentication on, `system` needs a principal in `auth.system_principals` or a trusted
    /// transport.
    ///
    /// # Errors
    /// `PermissionDenied` naming the setting.
    pub(crate) fn may_take_type(
        &self,
        conn: ConnId,
        kind: ParticipantType,
        principal: Option<&Principal>,
    ) -> Result<(), RouterError> {
        if kind != ParticipantType::System || self.may_be_system(Some(conn), principal) {
            return Ok(());
        }
        Err(RouterError::PermissionDenied(format!(
            "principal {} may not connect as system: list it in auth.system_principals",
            principal.map_or("(none)", |p| p.id.as_str())
        )))
    }

    /// Whether `principal` may be a system participant here (authentication off, a trusted
    /// transport `conn`, the router's service, or a principal in `auth.system_principals`).
    fn may_be_system(&self, conn: Option<ConnId>, principal: Option<&Principal>) -> bool {
        let Some(auth) = self.authenticator() else {
            return true;
        };
        let trusted = conn
            .and_then(|c| self.conns.get(&c))
            .and_then(|c| trusted_transport(&c.origin))
            .is_some_and(|(t, _)| auth.trusts(t));
        trusted
            || principal.is_some_and(|p| crate::auth::is_service(p) || auth.may_be_system(&p.id))
    }

    /// Re-admits a session another router admitted under this router's configuration, as a
    /// fresh connect of its principal would be: a `system` session whose principal may not be
    /// system here (see [`Router::may_take_type`]; `conn` is the connection resuming it, if
    /// any) becomes a `client`; with `regrant` (a session restored by a takeover) its
    /// capabilities become this router's grant for its type and principal, narrowed by what
    /// the session had (what it asked for, what `map/permissions/update` revoked), so nothing
    /// the old node's configuration granted outlives the new one. What the session loses is
    /// logged, naming the principal; its calls that need it are answered 1003.
    pub(crate) fn readmit(&mut self, id: &SessionId, conn: Option<ConnId>, regrant: bool) {
        let Some(s) = self.sessions.get(id) else {
            return;
        };
        let kind = if s.kind == ParticipantType::System
            && !self.may_be_system(conn, s.principal.as_ref())
        {
            conn.and_then(|c| self.conns.get(&c))
                .map_or(ParticipantType::Client, |c| {
                    c.origin.default_participant_type()
                })
        } else {
            s.kind
        };
        if kind == s.kind && !regrant {
            return;
        }
        let principal = s.principal.as_ref().map(|p| p.id.clone());
        let mut caps = crate::router::permissions::grant(
            &self.config.permissions,
            kind,
            principal.as_deref(),
            Some(&s.capabilities),
        );
        caps.streaming = s.capabilities.streaming.clone();
        let lost = lost_flags(&s.capabilities, &caps);
        let was = s.kind;
        if kind != was || !lost.is_empty() {
            tracing::warn!(
                session = %id,
                participant = %s.participant,
                principal = principal.as_deref().unwrap_or("(none)"),
                participant_type = %was,
                readmitted_as = %kind,
                lost = %lost.join(","),
                "re-admitted under this node's config: the session lost what it no longer grants"
            );
        }
        if let Some(s) = self.sessions.get_mut(id) {
            s.kind = kind;
            s.capabilities = caps;
        }
    }

    /// `map/authenticate`: completes the connect that answered `authRequired`; on a connection
    /// that already has a session, re-authenticates it (same principal, like a refresh).
    ///
    /// # Errors
    /// Those of the connect it completes (a refused credential is a `success: false` result).
    pub fn handle_authenticate(
        &mut self,
        ctx: &Ctx,
        _p: AuthCredentials,
        verdict: Verdict,
    ) -> Result<AuthenticateResult, RouterError> {
        let conn = self.conns.get(&ctx.conn).ok_or(RouterError::Unavailable)?;
        let session = conn.session.clone();
        let Some(verdict) = verdict else {
            // Authentication is off: nothing to check.
            return Ok(match session {
                Some(s) => AuthenticateResult {
                    success: true,
                    session: Some(Box::new(self.connect_result(&s, false, Vec::new()))),
                    error: None,
                },
                None => failed(AuthError::new(
                    AuthErrorCode::AuthRequired,
                    "call map/connect first (authentication is not enabled on this router)",
                )),
            });
        };
        if let Some(session) = session {
            return Ok(match self.swap_credential(&session, verdict) {
                Ok(_) => AuthenticateResult {
                    success: true,
                    session: Some(Box::new(self.connect_result(&session, false, Vec::new()))),
                    error: None,
                },
                Err(e) => failed(e),
            });
        }
        let principal = match verdict {
            Ok(p) => p,
            Err(e) => {
                tracing::info!(conn = %ctx.conn, code = ?e.code, reason = %e.message, "map/authenticate refused");
                return Ok(failed(e));
            }
        };
        let Some(pending) = self
            .conns
            .get_mut(&ctx.conn)
            .and_then(|c| c.pending_auth.take())
        else {
            return Ok(failed(AuthError::new(
                AuthErrorCode::AuthRequired,
                "call map/connect first: map/authenticate completes a map/connect that answered authRequired",
            )));
        };
        let result = self.open_session(ctx, *pending, Some(principal))?;
        Ok(AuthenticateResult {
            success: true,
            session: Some(Box::new(result)),
            error: None,
        })
    }

    /// `map/auth/refresh`.
    ///
    /// # Errors
    /// None of its own (a refused credential is a `success: false` result); `NotConnected`
    /// without a session.
    pub fn handle_auth_refresh(
        &mut self,
        ctx: &Ctx,
        _p: RefreshParams,
        verdict: Verdict,
    ) -> Result<RefreshResult, RouterError> {
        let session = self.caller(ctx)?.session;
        let Some(verdict) = verdict else {
            return Ok(RefreshResult {
                success: false,
                principal: None,
                expires_at: None,
                error: Some(AuthError::new(
                    AuthErrorCode::MethodNotSupported,
                    "authentication is not enabled on this router: there is nothing to refresh",
                )),
            });
        };
        Ok(match self.swap_credential(&session, verdict) {
            Ok(principal) => RefreshResult {
                success: true,
                expires_at: principal.expires_at,
                principal: Some(principal),
                error: None,
            },
            Err(e) => RefreshResult {
                success: false,
                principal: None,
                expires_at: None,
                error: Some(e),
            },
        })
    }

    /// Replaces a session's credential with a verified one of the same principal and re-arms
    /// its expiry. Returns the new principal.
    fn swap_credential(
        &mut self,
        session: &SessionId,
        verdict: Result<Principal, AuthError>,
    ) -> Result<Principal, AuthError> {
        let new = verdict.inspect_err(|e| {
            tracing::info!(%session, code = ?e.code, reason = %e.message, "credential refresh refused");
        })?;
        let current = self.sessions.get(session).and_then(|s| s.principal.clone());
        if !current.as_ref().is_some_and(|c| c.same_subject(&new)) {
            return Err(AuthError::new(
                AuthErrorCode::InvalidCredentials,
                "the credential is for a different principal than this session's",
            ));
        }
        self.renew_principal(session, Some(new.clone()));
        Ok(new)
    }

    /// Gives a session a (newer) credential of its principal: a new expiry re-arms the
    /// deadlines, old ones are ignored from now on.
    pub(crate) fn renew_principal(&mut self, session: &SessionId, principal: Option<Principal>) {
        let Some(s) = self.sessions.get_mut(session) else {
            return;
        };
        if s.principal == principal {
            return;
        }
        s.principal = principal;
        s.auth_epoch += 1;
        self.arm_credential(session);
    }

    /// Schedules `map/auth/expiring` and the end of the session's current credential.
    pub(crate) fn arm_credential(&mut self, session: &SessionId) {
        let Some(auth) = self.authenticator() else {
            return;
        };
        let Some(s) = self.sessions.get(session) else {
            return;
        };
        let Some(expires_at) = s.principal.as_ref().and_then(|p| p.expires_at) else {
            return;
        };
        let epoch = s.auth_epoch;
        let now = Instant::now();
        let to_expiry = Duration::from_millis(expires_at.saturating_sub(now_ms()));
        let lead = auth.expiry_notice().min(to_expiry / 2);
        self.schedule(
            now + (to_expiry - lead),
            Deadline::CredentialExpiring(session.clone(), epoch),
        );
        self.schedule(
            now + to_expiry + auth.leeway(),
            Deadline::CredentialExpired(session.clone(), epoch),
        );
    }

    fn current_epoch(
        &self,
        session: &SessionId,
        epoch: u64,
    ) -> Option<&crate::router::sessions::table::Session> {
        self.sessions.get(session).filter(|s| s.auth_epoch == epoch)
    }

    /// Sends `map/auth/expiring` to the session's connection, if it is attached.
    pub(crate) fn credential_expiring(&mut self, session: &SessionId, epoch: u64) {
        let Some(s) = self.current_epoch(session, epoch) else {
            return;
        };
        let (Some(conn), Some(expires_at)) =
            (s.conn, s.principal.as_ref().and_then(|p| p.expires_at))
        else {
            return;
        };
        let params = AuthExpiringParams {
            expires_at,
            expires_in_ms: expires_at.saturating_sub(now_ms()),
            refresh_before: expires_at,
        };
        let frame = format!(
            r#"{{"jsonrpc":"2.0","method":"{}","params":{}}}"#,
            notifications::AUTH_EXPIRING,
            crate::router::core::to_json(&params)
        );
        if !self.push_message(conn, frame.into()) {
            tracing::debug!(%session, "could not queue map/auth/expiring: the connection is backlogged");
        }
    }

    /// Ends the session's access: its credential expired without a refresh.
    pub(crate) fn credential_expired(&mut self, session: &SessionId, epoch: u64) {
        let Some(s) = self.current_epoch(session, epoch) else {
            return;
        };
        let Some(conn) = s.conn else {
            // Detached: resuming needs a new credential anyway.
            return;
        };
        let policy = crate::router::sessions::table::policy_when_lost(Some(s));
        tracing::info!(%session, principal = ?s.principal.as_ref().map(|p| &p.id), "credential expired: ending the session's access");
        self.detach(conn, &policy, "credential_expired", false);
        if let Some(c) = self.conns.get(&conn) {
            let _ = c.outbox.try_push(Outbound::Close {
                code: CLOSE_CREDENTIAL_EXPIRED,
                reason: "credential expired".into(),
            });
        }
    }
}
