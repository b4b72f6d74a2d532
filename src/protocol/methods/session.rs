//! `map/connect` and `map/disconnect` (wire.md §4–5). The `authRequired` answer of
//! `map/connect` and the other auth methods are in [`super::auth`].

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::agent::Agent;
use crate::protocol::capabilities::{ParticipantCapabilities, ParticipantType};
use crate::protocol::ids::{AgentId, ParticipantId, SessionId};
use crate::protocol::methods::method::method;

/// What to do with a session's agents when it goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AgentBehavior {
    /// Unregister them (children first).
    Unregister,
    /// Keep them, owner `null`, state `orphaned`, until someone re-registers their id.
    Orphan,
    /// Orphan them, then unregister them if nobody reclaims them within the grace period.
    GracePeriod,
}

/// `disconnectPolicy` of `map/connect`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DisconnectPolicy {
    /// What happens to owned agents.
    pub agent_behavior: AgentBehavior,
    /// For `grace-period`: how long agents wait to be reclaimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period_ms: Option<u64>,
    /// Accepted for compatibility; events are always emitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify_subscribers: Option<bool>,
}

/// Credentials, in either spelling the SDK sends (`credential` or `token`). `Debug` never
/// shows the secret.
#[derive(Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthCredentials {
    /// `bearer`, `api-key`, `mtls`, `none`, `did:wba` or `x-*`.
    pub method: String,
    /// The credential (docs / `client.connect({auth})` spelling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// The credential (static factory / schema spelling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Free-form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
}

impl std::fmt::Debug for AuthCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redact = |v: &Option<String>| v.as_ref().map(|_| "***");
        f.debug_struct("AuthCredentials")
            .field("method", &self.method)
            .field("credential", &redact(&self.credential))
            .field("token", &redact(&self.token))
            .field("metadata", &self.metadata)
            .finish()
    }
}

impl AuthCredentials {
    /// The credential, from whichever spelling was sent.
    ///
    /// # Errors
    /// Neither `credential` nor `token` (or an empty one), or both with different values.
    pub fn secret(&self) -> Result<&str, AuthError> {
        let missing = || {
            AuthError::new(
                AuthErrorCode::AuthRequired,
                "no credential: send it in `credential` (or `token`)",
            )
        };
        match (self.credential.as_deref(), self.token.as_deref()) {
            (Some(a), Some(b)) if a != b => Err(AuthError::new(
                AuthErrorCode::InvalidCredentials,
                "`credential` and `token` differ: send one of them",
            )),
            (Some(c), _) | (None, Some(c)) if !c.is_empty() => Ok(c),
            _ => Err(missing()),
        }
    }
}

/// `map/connect` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ConnectParams {
    /// Must be 1 when present.
    pub protocol_version: Option<serde_json::Value>,
    /// Who the participant is; `client` when absent.
    pub participant_type: Option<ParticipantType>,
    /// Requested participant id (AgentConnection sends its agent id here on reconnect).
    pub participant_id: Option<ParticipantId>,
    /// Display name.
    pub name: Option<String>,
    /// Capabilities the participant asks for; they can only narrow the default grant.
    pub capabilities: Option<ParticipantCapabilities>,
    /// Resume this session (only while it is detached).
    pub session_id: Option<SessionId>,
    /// Resume the session this token was issued for.
    pub resume_token: Option<String>,
    /// Agents to reclaim on resume (default: all the session owned).
    pub reclaim_agents: Option<Vec<AgentId>>,
    /// What happens to this session's agents when it goes away.
    pub disconnect_policy: Option<DisconnectPolicy>,
    /// Credentials.
    pub auth: Option<AuthCredentials>,
    /// Relay sessions between cluster nodes only (refused from a client): the SHA-256 (hex)
    /// of the resume token the standby's client gave, so the token itself never crosses NATS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(skip)]
    pub resume_token_digest: Option<String>,
    /// Relay sessions between cluster nodes only (refused from a client): the SHA-256 (hex)
    /// of the resume token the standby drew for the session's next token; the node that
    /// writes the log keeps only this digest and answers an empty `resumeToken`, which the
    /// standby fills in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(skip)]
    pub next_resume_token_digest: Option<String>,
}

/// `systemInfo` of the connect result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SystemInfo {
    /// Router name.
    pub name: String,
    /// Router version.
    pub version: String,
}

/// The authenticated identity behind a session (see docs/security.md): the JWT `sub` and `iss`,
/// the principal an API key maps to, or the documented identity of a trusted transport
/// (`issuer: "map-router"`). Two principals are the same subject when `id` and `issuer` match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Principal {
    /// Subject.
    pub id: String,
    /// Token issuer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// Expiry (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
}

impl Principal {
    /// Whether `other` names the same subject (`id` and `issuer`), whatever the expiry.
    pub fn same_subject(&self, other: &Principal) -> bool {
        self.id == other.id && self.issuer == other.issuer
    }
}

/// `map/connect` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectResult {
    /// Always 1.
    pub protocol_version: u32,
    /// The session (stable across resumes).
    pub session_id: SessionId,
    /// This participant's id.
    pub participant_id: ParticipantId,
    /// The type the participant declared.
    pub participant_type: ParticipantType,
    /// What this participant may do, and what the streams support.
    pub capabilities: ParticipantCapabilities,
    /// Router name and version.
    pub system_info: SystemInfo,
    /// True when an existing session was resumed.
    pub reconnected: bool,
    /// Ids of agents this session owns.
    pub owned_agents: Vec<AgentId>,
    /// Agents reclaimed on resume.
    pub reclaimed_agents: Vec<Agent>,
    /// Single-use token for resuming this session.
    pub resume_token: String,
    /// The authenticated principal, when authentication happened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<Principal>,
}

/// `map/disconnect` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct DisconnectParams {
    /// Why (recorded in events).
    pub reason: Option<String>,
    /// Overrides the session's disconnect policy for this disconnect.
    pub policy: Option<DisconnectPolicy>,
    /// Relay sessions between cluster nodes only (refused from a client): the SHA-256 (hex)
    /// of the resume token the standby drew for the session's next token; the node that
    /// writes the log keeps only this digest and answers an empty `resumeToken`, which the
    /// standby fills in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(skip)]
    pub next_resume_token_digest: Option<String>,
}

/// Session summary in the disconnect result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionInfo {
    /// Session id.
    pub id: SessionId,
    /// When the session was created (Unix ms).
    pub created_at: u64,
    /// When this disconnect happened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closed_at: Option<u64>,
}

/// `map/disconnect` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DisconnectResult {
    /// Always true.
    pub acknowledged: bool,
    /// The session that ended.
    pub session: SessionInfo,
    /// Token to resume the session within the resume window.
    pub resume_token: String,
}

/// The string codes of auth failures (the SDK's `AuthErrorCode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuthErrorCode {
    /// The credential is unknown, malformed, badly signed, or for another issuer or audience.
    InvalidCredentials,
    /// The credential has expired.
    Expired,
    /// The credential is valid but does not grant enough (not produced by this router yet).
    InsufficientScope,
    /// The `method` is not one this router accepts.
    MethodNotSupported,
    /// No credential was given, or the call needs a `map/connect` first.
    AuthRequired,
}

impl AuthErrorCode {
    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidCredentials => "invalid_credentials",
            Self::Expired => "expired",
            Self::InsufficientScope => "insufficient_scope",
            Self::MethodNotSupported => "method_not_supported",
            Self::AuthRequired => "auth_required",
        }
    }
}

/// Why authentication failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AuthError {
    /// Machine-readable reason.
    pub code: AuthErrorCode,
    /// What was wrong, for people (never echoes the credential).
    pub message: String,
}

impl AuthError {
    /// An error with this code and message.
    pub fn new(code: AuthErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// `authRequired` of a `map/connect` result: what this router accepts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthRequiredInfo {
    /// Accepted `auth.method` values (`bearer` for JWTs, `api-key`).
    pub methods: Vec<String>,
    /// Always true: this router has no optional authentication.
    pub required: bool,
    /// The configured realm (defaults to the router name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realm: Option<String>,
}

/// The `map/connect` result when authentication is required and was missing or failed: no
/// session exists yet. Complete it with `map/authenticate` on the same connection, or call
/// `map/connect` again with `auth`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthRequiredResult {
    /// What the router accepts.
    pub auth_required: AuthRequiredInfo,
    /// Why the credentials sent were refused (absent when none were sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<AuthError>,
}

/// The `map/connect` result: a session, or the request to authenticate. Serialized as the
/// variant's object (untagged); read back by whether `authRequired` is present (not by trying
/// each shape: verbatim JSON inside an agent cannot be read through serde's buffering).
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum ConnectResponse {
    /// Connected (or resumed).
    Connected(Box<ConnectResult>),
    /// Authentication is required first; there is no session.
    AuthRequired(AuthRequiredResult),
}

impl<'de> Deserialize<'de> for ConnectResponse {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Probe {
            #[serde(default)]
            auth_required: Option<serde::de::IgnoredAny>,
        }
        let probe: Probe = serde_json::from_str(raw.get()).map_err(D::Error::custom)?;
        if probe.auth_required.is_some() {
            serde_json::from_str(raw.get())
                .map(Self::AuthRequired)
                .map_err(D::Error::custom)
        } else {
            serde_json::from_str(raw.get())
                .map(Self::Connected)
                .map_err(D::Error::custom)
        }
    }
}

impl ConnectResponse {
    /// The session, when connected.
    pub fn connected(&self) -> Option<&ConnectResult> {
        match self {
            Self::Connected(r) => Some(r),
            Self::AuthRequired(_) => None,
        }
    }
}

/// `map/session/list` params (none besides `_meta`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct SessionListParams {}

/// One session of `map/session/list`: the spec's `{id, createdAt, lastActiveAt?}` plus who it
/// is and whether a connection holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionSummary {
    /// Session id.
    pub id: SessionId,
    /// When it was created (Unix ms).
    pub created_at: u64,
    /// When it last made a call (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_active_at: Option<u64>,
    /// Its participant.
    pub participant_id: ParticipantId,
    /// Its participant type.
    pub participant_type: ParticipantType,
    /// Its display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `attached` (a connection holds it) or `detached` (resumable, or loadable, until its
    /// resume window ends).
    pub state: String,
    /// Whether it is the session of the connection that asked.
    pub current: bool,
    /// Agents it owns (or that wait for it, orphaned, while it is detached).
    pub agents: Vec<AgentId>,
}

/// `map/session/list` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionListResult {
    /// The caller's sessions: those of its authenticated principal (or, without
    /// authentication, of its participant id), oldest first.
    pub sessions: Vec<SessionSummary>,
}

/// `map/session/load` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionLoadParams {
    /// The detached session to attach this connection to.
    pub session_id: SessionId,
    /// Relay sessions between cluster nodes only (refused from a client): the SHA-256 (hex)
    /// of the resume token the standby drew for the session's next token; the node that
    /// writes the log keeps only this digest and answers an empty `resumeToken`, which the
    /// standby fills in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(skip)]
    pub next_resume_token_digest: Option<String>,
}

/// `map/session/load` result: the spec's `{sessionId, restored}` plus what a resuming
/// `map/connect` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionLoadResult {
    /// The session now attached to this connection.
    pub session_id: SessionId,
    /// True when the connection moved to it; false when it already was the connection's.
    pub restored: bool,
    /// Its participant.
    pub participant_id: ParticipantId,
    /// Agents it took back from orphanhood.
    pub reclaimed_agents: Vec<Agent>,
    /// Its new single-use resume token.
    pub resume_token: String,
}

/// `map/session/close` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct SessionCloseParams {
    /// The session to end for good (absent: the caller's own).
    pub session_id: Option<SessionId>,
    /// Why (recorded in `participant_disconnected` and `agent_unregistered`).
    pub reason: Option<String>,
}

/// `map/session/close` result: the SDK's `{session}` and the schema's `{closed}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionCloseResult {
    /// Always true (a session that cannot be closed is an error).
    pub closed: bool,
    /// The session that ended.
    pub session: SessionInfo,
    /// Whether it was the calling connection's own session (the connection then has none:
    /// `map/connect` again to go on).
    pub current: bool,
}

method!(
    /// `map/connect`: open (or resume) a session.
    Connect, "map/connect", None, ConnectParams, ConnectResponse
);
method!(
    /// `map/disconnect`: end the session; the result carries a resume token.
    Disconnect, "map/disconnect", None, DisconnectParams, DisconnectResult
);
method!(
    /// `map/session/list` (sessions extension).
    SessionList, "map/session/list", None, SessionListParams, SessionListResult
);
method!(
    /// `map/session/load` (sessions extension).
    SessionLoad, "map/session/load", None, SessionLoadParams, SessionLoadResult
);
method!(
    /// `map/session/close` (sessions extension).
    SessionClose, "map/session/close", None, SessionCloseParams, SessionCloseResult
);
