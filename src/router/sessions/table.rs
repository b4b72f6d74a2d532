//! Sessions and connections as the router sees them.
//!
//! A *connection* is one transport attachment (a WebSocket, a stdio pipe, ...) with its outbox.
//! A *session* is a participant's logical presence: participant id, capabilities, resume token,
//! subscriptions. A session is attached to at most one connection; when its connection drops it
//! is detached and can be resumed with its token (or id) within the resume window.
//!
//! This module owns the tables and their indexes; the state transitions (connect, disconnect,
//! detach, resume) live in `router::sessions::ops`. The records' fields are the sessions
//! part's: other parts read them through accessors (or `router::views::SessionView`) and change
//! them through the methods that name what happens ([`Conns::attach`],
//! [`Conns::push_message`], [`Conns::push_message_front`], [`Conns::send_now`],
//! [`Conns::flush_pending`], [`Sessions::set_primary_agent`], [`Sessions::restore`]).
//!
//! Invariants: `by_participant` and `by_token` index exactly the sessions of `by_id` (a
//! session's `token_key` is the digest of its current token); a connection's `pending` holds at
//! most the router's `pending_messages` frames, and is non-empty only while its outbox is full
//! or was full when they arrived (frames leave it in order, before any new one).

use std::collections::VecDeque;

use crate::router::ids::{IdMap, Shrink};
use std::sync::Arc;
use std::time::Instant;

use crate::protocol::capabilities::{ParticipantCapabilities, ParticipantType};
use crate::protocol::ids::{AgentId, ParticipantId, SessionId};
use crate::protocol::methods::session::{ConnectParams, DisconnectPolicy, Principal};

use crate::router::ids::ConnId;
use crate::router::outbox::{push, Outbound, Outbox, PushError, SharedText};

/// Where a connection comes from (authentication may trust some origins: `[auth]
/// trusted_transports`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ConnOrigin {
    /// A peer that connected on its own over the network (WebSocket, HTTP), or any connection
    /// whose transport did not say otherwise.
    #[default]
    Remote,
    /// An in-process link of the program that embeds the router (`Server::connect_in_process`).
    InProcess,
    /// The router's own stdin/stdout (`map-router stdio`, `Server::serve_io`).
    Stdio,
    /// An in-process link opened for a principal that the opener already verified: a gateway
    /// acting for its HTTP caller, or the router's own service principal
    /// (`InProcessLinks::connect_as`). Admitted as that principal, without credentials and
    /// whatever `auth.trusted_transports` says.
    Delegated(Principal),
    /// The pipes of a process the router launched for this agent (`map/agents/spawn` with a
    /// `command`). Its first registration is that agent, whatever id it asks for.
    Supervised {
        /// The agent the process runs as.
        agent: AgentId,
        /// The process id.
        pid: u32,
    },
}

impl ConnOrigin {
    /// The participant type of a `map/connect` that leaves `participantType` out: `agent` on
    /// the pipes of a supervised process (a child launched to be an agent, which the docs tell
    /// to connect and register), `client` everywhere else (the MAP default). A participant
    /// that wants another type says so.
    pub fn default_participant_type(&self) -> ParticipantType {
        match self {
            ConnOrigin::Supervised { .. } => ParticipantType::Agent,
            _ => ParticipantType::Client,
        }
    }
}

/// The medium a connection runs over (a label of the connection metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Transport {
    /// A WebSocket (`/`, `/map`).
    #[default]
    WebSocket,
    /// The HTTP + SSE binding (`/http`).
    Http,
    /// The router's own stdin/stdout.
    Stdio,
    /// An in-process link.
    InProcess,
    /// A supervised child's pipes.
    Pipes,
}

impl Transport {
    /// Every transport, in label order.
    pub const ALL: [Self; 5] = [
        Self::WebSocket,
        Self::Http,
        Self::Stdio,
        Self::InProcess,
        Self::Pipes,
    ];

    /// The label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WebSocket => "websocket",
            Self::Http => "http",
            Self::Stdio => "stdio",
            Self::InProcess => "in_process",
            Self::Pipes => "pipes",
        }
    }
}

/// One transport attachment. Its fields are the sessions part's.
#[derive(Debug)]
pub struct Conn {
    /// Who is on the other end.
    pub(in crate::router::sessions) origin: ConnOrigin,
    /// The medium.
    pub(in crate::router::sessions) transport: Transport,
    /// In cluster mode, the node the connection is on when it is not this one (a relay
    /// session of a standby's connection; `None`: here).
    pub(in crate::router::sessions) node: Option<Arc<str>>,
    /// Where frames for this connection go.
    pub(in crate::router::sessions) outbox: Outbox,
    /// The session using this connection, once connected.
    pub(in crate::router::sessions) session: Option<SessionId>,
    /// `map/message` frames waiting for room in the outbox (bounded by config). Kept here, not
    /// in the outbox, so the router never waits on a slow peer.
    pub(in crate::router::sessions) pending: VecDeque<SharedText>,
    /// A `map/connect` that answered `authRequired`, completed by `map/authenticate`.
    pub(in crate::router::sessions) pending_auth: Option<Box<ConnectParams>>,
}

impl Conn {
    /// Who is on the other end.
    pub fn origin(&self) -> &ConnOrigin {
        &self.origin
    }

    /// The medium.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The node the connection is on when it is not this one.
    pub fn node(&self) -> Option<&Arc<str>> {
        self.node.as_ref()
    }

    /// Where frames for this connection go.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// The session using this connection, once connected.
    pub fn session(&self) -> Option<&SessionId> {
        self.session.as_ref()
    }

    /// How many `map/message` frames wait for room in the outbox.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
}

/// The attached connections, by id.
#[derive(Debug, Default)]
pub struct Conns {
    by_id: IdMap<ConnId, Conn>,
}

impl Conns {
    /// A connection.
    pub fn get(&self, id: &ConnId) -> Option<&Conn> {
        self.by_id.get(id)
    }

    /// A connection, to change it (the sessions part).
    pub(in crate::router::sessions) fn get_mut(&mut self, id: &ConnId) -> Option<&mut Conn> {
        self.by_id.get_mut(id)
    }

    /// A new connection with its outbox (its id is fresh: `RouterHandle::new_conn_id`), not
    /// yet connected.
    pub fn attach(
        &mut self,
        id: ConnId,
        outbox: Outbox,
        origin: ConnOrigin,
        transport: Transport,
        node: Option<Arc<str>>,
    ) {
        self.by_id.insert(
            id,
            Conn {
                origin,
                transport,
                node,
                outbox,
                session: None,
                pending: VecDeque::new(),
                pending_auth: None,
            },
        );
    }

    /// Queues a `map/message` frame for a connection without waiting: into its outbox, or
    /// behind the frames already waiting for room (at most `cap` of them). False when the
    /// connection is gone or its bounded queue is full.
    pub fn push_message(&mut self, id: ConnId, frame: SharedText, cap: usize) -> bool {
        self.queue_message(id, frame, cap, false)
    }

    /// Queues a frame ahead of the connection's waiting messages (steering). False when the
    /// connection is gone or its bounded queue is full.
    pub fn push_message_front(&mut self, id: ConnId, frame: SharedText, cap: usize) -> bool {
        self.queue_message(id, frame, cap, true)
    }

    /// Into the outbox when nothing waits and it has room, else into `pending` (behind the
    /// waiting frames, or ahead of them: `front`), at most `cap` of them.
    fn queue_message(&mut self, id: ConnId, frame: SharedText, cap: usize, front: bool) -> bool {
        let Some(c) = self.by_id.get_mut(&id) else {
            return false;
        };
        let frame = if c.pending.is_empty() {
            match push(&c.outbox, Outbound::Shared(frame)) {
                Ok(()) => return true,
                Err(PushError::Full(Outbound::Shared(frame))) if cap > 0 => frame,
                Err(_) => return false,
            }
        } else if c.pending.len() >= cap {
            return false;
        } else {
            c.outbox.request_wakeup();
            frame
        };
        if front {
            c.pending.push_front(frame);
        } else {
            c.pending.push_back(frame);
        }
        true
    }

    /// Sends a frame only if it can go at once (nothing waiting, room in the outbox).
    pub fn send_now(&self, id: ConnId, frame: SharedText) -> bool {
        self.by_id.get(&id).is_some_and(|c| {
            c.pending.is_empty() && c.outbox.try_push(Outbound::Shared(frame)).is_ok()
        })
    }

    /// Moves waiting messages into the outbox while it has room (its writer drained it).
    pub fn flush_pending(&mut self, id: ConnId) {
        if let Some(c) = self.by_id.get_mut(&id) {
            while let Some(frame) = c.pending.front().cloned() {
                match push(&c.outbox, Outbound::Shared(frame)) {
                    Ok(()) => {
                        c.pending.pop_front();
                    }
                    Err(_) => return,
                }
            }
        }
    }

    /// Removes a connection.
    pub(in crate::router::sessions) fn remove(&mut self, id: &ConnId) -> Option<Conn> {
        let conn = self.by_id.remove(id);
        self.by_id.shrink_if_sparse();
        conn
    }

    /// Every connection.
    pub fn iter(&self) -> impl Iterator<Item = (&ConnId, &Conn)> {
        self.by_id.iter()
    }

    /// Every connection id.
    pub fn ids(&self) -> Vec<ConnId> {
        self.by_id.keys().copied().collect()
    }

    /// Number of attached connections.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

/// A participant's session. Its fields are the sessions part's.
#[derive(Debug, Clone)]
pub struct Session {
    /// Session id.
    pub(in crate::router::sessions) id: SessionId,
    /// Participant id (stable across resumes).
    pub(in crate::router::sessions) participant: ParticipantId,
    /// Declared type.
    pub(in crate::router::sessions) kind: ParticipantType,
    /// Display name.
    pub(in crate::router::sessions) name: Option<String>,
    /// What it may do.
    pub(in crate::router::sessions) capabilities: ParticipantCapabilities,
    /// Creation time (Unix ms).
    pub(in crate::router::sessions) created_at: u64,
    /// When it last made a call (Unix ms).
    pub(in crate::router::sessions) last_active_at: u64,
    /// The connection, while attached.
    pub(in crate::router::sessions) conn: Option<ConnId>,
    /// The current single-use resume token (empty for a session restored from another node's
    /// saved record, `router::handover`, until it is resumed: only its digest was saved; and
    /// for a relay session's, whose token the standby keeps: `Sessions::set_token_key`).
    pub(in crate::router::sessions) resume_token: String,
    /// The token's digest ([`token_key`]), which the token index is keyed by.
    pub(in crate::router::sessions) token_key: Arc<str>,
    /// What to do with owned agents when the session goes away.
    pub(in crate::router::sessions) policy: Option<DisconnectPolicy>,
    /// The agent this session speaks as (`from` of its messages).
    pub(in crate::router::sessions) primary_agent: Option<AgentId>,
    /// Agents orphaned when the session detached, reclaimed on resume.
    pub(in crate::router::sessions) orphaned: Vec<AgentId>,
    /// When it was detached.
    pub(in crate::router::sessions) detached_at: Option<Instant>,
    /// Authenticated identity (`None` when authentication is off). Permissions and limits key
    /// on it; its `expires_at` is when the session's access ends unless refreshed.
    pub(in crate::router::sessions) principal: Option<Principal>,
    /// Bumped whenever the credential behind `principal` changes (refresh, resume with a new
    /// one), so expiry deadlines set for an older credential do nothing.
    pub(in crate::router::sessions) auth_epoch: u64,
    /// Whether a cluster's next live node gets this session (`router::handover`): a network
    /// client's, directly or through a standby's relay; not an in-process link's (a
    /// gateway's) nor a supervised process's.
    pub(in crate::router::sessions) handed_over: bool,
}

impl Session {
    /// Session id.
    pub fn id(&self) -> &SessionId {
        &self.id
    }

    /// Participant id.
    pub fn participant(&self) -> &ParticipantId {
        &self.participant
    }

    /// Declared type.
    pub fn kind(&self) -> ParticipantType {
        self.kind
    }

    /// Display name.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// What it may do.
    pub fn capabilities(&self) -> &ParticipantCapabilities {
        &self.capabilities
    }

    /// Creation time (Unix ms).
    pub fn created_at(&self) -> u64 {
        self.created_at
    }

    /// When it last made a call (Unix ms).
    pub fn last_active_at(&self) -> u64 {
        self.last_active_at
    }

    /// The connection, while attached.
    pub fn conn(&self) -> Option<ConnId> {
        self.conn
    }

    /// What to do with owned agents when the session goes away.
    pub fn policy(&self) -> Option<&DisconnectPolicy> {
        self.policy.as_ref()
    }

    /// The agent this session speaks as.
    pub fn primary_agent(&self) -> Option<&AgentId> {
        self.primary_agent.as_ref()
    }

    /// Agents orphaned when it detached, reclaimed on resume.
    pub fn orphaned(&self) -> &[AgentId] {
        &self.orphaned
    }

    /// When it was detached.
    pub fn detached_at(&self) -> Option<Instant> {
        self.detached_at
    }

    /// Its authenticated identity.
    pub fn principal(&self) -> Option<&Principal> {
        self.principal.as_ref()
    }

    /// The generation of its credential.
    pub fn auth_epoch(&self) -> u64 {
        self.auth_epoch
    }

    /// The digest of its resume token.
    pub fn token_key(&self) -> &str {
        &self.token_key
    }

    /// Whether a cluster's next live node gets it.
    pub fn handed_over(&self) -> bool {
        self.handed_over
    }

    /// What others read of it (`router::views::SessionView`).
    pub fn facts(&self) -> SessionFacts<'_> {
        SessionFacts {
            participant: &self.participant,
            kind: self.kind,
            attached: self.conn.is_some(),
        }
    }
}

/// One session as other parts read it (`router::views::SessionView`).
#[derive(Debug, Clone, Copy)]
pub struct SessionFacts<'a> {
    /// Its participant.
    pub participant: &'a ParticipantId,
    /// Its declared type.
    pub kind: ParticipantType,
    /// Whether a connection is attached.
    pub attached: bool,
}

/// What a saved session is restored from ([`Sessions::restore`]).
#[derive(Debug, Clone)]
pub struct SessionSeed {
    /// Session id.
    pub id: SessionId,
    /// Participant id.
    pub participant: ParticipantId,
    /// Declared type.
    pub kind: ParticipantType,
    /// Display name.
    pub name: Option<String>,
    /// What it may do.
    pub capabilities: ParticipantCapabilities,
    /// Creation time (Unix ms).
    pub created_at: u64,
    /// The digest of its resume token.
    pub token_key: String,
    /// Its disconnect policy.
    pub policy: Option<DisconnectPolicy>,
    /// The agent it speaks as.
    pub primary_agent: Option<AgentId>,
    /// Its orphaned agents.
    pub orphaned: Vec<AgentId>,
    /// Its authenticated identity.
    pub principal: Option<Principal>,
}

/// The digest a resume token is looked up (and saved) by: hex SHA-256. A saved record
/// (`router::handover`) carries the digest only, so the log never holds a usable token.
pub fn token_key(token: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(token.as_bytes());
    let mut out = String::with_capacity(64);
    for b in digest {
        use std::fmt::Write;
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// What a session's agents go through when its connection is lost (a transport closed, an
/// expired credential, a session loaded over it, the live node that held it gone): its own
/// disconnect policy, else a grace period of the resume window.
pub fn policy_when_lost(session: Option<&Session>) -> DisconnectPolicy {
    session
        .and_then(|s| s.policy.clone())
        .unwrap_or(DisconnectPolicy {
            agent_behavior: crate::protocol::methods::session::AgentBehavior::GracePeriod,
            grace_period_ms: None,
            notify_subscribers: None,
        })
}

/// All sessions and their indexes.
#[derive(Debug, Default)]
pub struct Sessions {
    /// Boxed: a session is a few hundred bytes, and a table keeps room for up to twice as
    /// many entries as it holds (docs/performance.md, "Idle sessions").
    by_id: IdMap<SessionId, Box<Session>>,
    by_participant: IdMap<ParticipantId, SessionId>,
    /// Keyed by the session's own `token_key` (shared, not a copy).
    by_token: IdMap<Arc<str>, SessionId>,
    /// Sessions changed since the last save (cluster mode only).
    pub(crate) changed: crate::router::changes::Changes<SessionId>,
}

impl Sessions {
    /// Looks a session up.
    pub fn get(&self, id: &SessionId) -> Option<&Session> {
        self.by_id.get(id).map(|s| &**s)
    }

    /// Mutable access, for the sessions part (use [`Sessions::set_token`] to change the
    /// token).
    pub(in crate::router::sessions) fn get_mut(&mut self, id: &SessionId) -> Option<&mut Session> {
        self.changed.mark(id);
        self.by_id.get_mut(id).map(|s| &mut **s)
    }

    /// The session of a participant.
    pub fn by_participant(&self, participant: &ParticipantId) -> Option<&Session> {
        self.by_participant
            .get(participant)
            .and_then(|s| self.get(s))
    }

    /// The session a resume token belongs to.
    pub fn by_token(&self, token: &str) -> Option<&Session> {
        self.by_token
            .get(token_key(token).as_str())
            .and_then(|s| self.get(s))
    }

    /// Makes `agent` the agent a session speaks as, unless it already speaks as one that
    /// `owns(agent, participant)` says it still owns.
    pub fn adopt_primary(
        &mut self,
        id: &SessionId,
        agent: &AgentId,
        owns: impl Fn(&AgentId, &ParticipantId) -> bool,
    ) {
        self.changed.mark(id);
        if let Some(s) = self.by_id.get_mut(id) {
            let current_valid = s
                .primary_agent
                .as_ref()
                .is_some_and(|a| owns(a, &s.participant));
            if !current_valid {
                s.primary_agent = Some(agent.clone());
            }
        }
    }

    /// A session another node saved (`router::handover`), detached since `now` and resumable
    /// with the token whose digest it carries. Its participant id must be free.
    pub fn restore(&mut self, seed: SessionSeed, now: Instant) {
        self.insert(Session {
            id: seed.id,
            participant: seed.participant,
            kind: seed.kind,
            name: seed.name,
            capabilities: seed.capabilities,
            created_at: seed.created_at,
            last_active_at: crate::protocol::ids::now_ms(),
            conn: None,
            resume_token: String::new(),
            token_key: seed.token_key.into(),
            policy: seed.policy,
            primary_agent: seed.primary_agent,
            orphaned: seed.orphaned,
            detached_at: Some(now),
            principal: seed.principal,
            auth_epoch: 0,
            handed_over: true,
        });
    }

    /// Adds a session (its participant id must be free). Its `token_key` is computed from
    /// `resume_token` unless given (a restored session has the digest only).
    pub(in crate::router::sessions) fn insert(&mut self, mut session: Session) {
        if session.token_key.is_empty() {
            session.token_key = token_key(&session.resume_token).into();
        }
        self.changed.mark(&session.id);
        self.by_participant
            .insert(session.participant.clone(), session.id.clone());
        self.by_token
            .insert(session.token_key.clone(), session.id.clone());
        self.by_id.insert(session.id.clone(), Box::new(session));
    }

    /// Removes a session and its index entries.
    pub(in crate::router::sessions) fn remove(&mut self, id: &SessionId) -> Option<Session> {
        let s = *self.by_id.remove(id)?;
        self.changed.mark(id);
        if self.by_participant.get(&s.participant) == Some(&s.id) {
            self.by_participant.remove(&s.participant);
        }
        self.by_token.remove(&s.token_key);
        self.by_id.shrink_if_sparse();
        self.by_participant.shrink_if_sparse();
        self.by_token.shrink_if_sparse();
        Some(s)
    }

    /// Replaces a session's resume token (the old one stops working).
    pub fn set_token(&mut self, id: &SessionId, token: String) {
        self.changed.mark(id);
        if let Some(s) = self.by_id.get_mut(id) {
            self.by_token.remove(&s.token_key);
            s.token_key = token_key(&token).into();
            self.by_token.insert(s.token_key.clone(), s.id.clone());
            s.resume_token = token;
        }
    }

    /// Replaces a session's resume token by one this node knows by its digest only (`key`,
    /// [`token_key`]): a relay session's, whose token the standby that drew it keeps
    /// (`router::relay`). The old one stops working.
    pub fn set_token_key(&mut self, id: &SessionId, key: String) {
        self.changed.mark(id);
        if let Some(s) = self.by_id.get_mut(id) {
            self.by_token.remove(&s.token_key);
            s.token_key = key.into();
            self.by_token.insert(s.token_key.clone(), s.id.clone());
            s.resume_token = String::new();
        }
    }

    /// The session whose resume token has digest `key` ([`token_key`]).
    pub fn by_token_key(&self, key: &str) -> Option<&Session> {
        self.by_token.get(key).and_then(|id| self.get(id))
    }

    /// Records that `id` made a call now.
    pub fn touch(&mut self, id: &SessionId) {
        if let Some(s) = self.by_id.get_mut(id) {
            s.last_active_at = crate::protocol::ids::now_ms();
        }
    }

    /// Every session.
    pub fn iter(&self) -> impl Iterator<Item = &Session> {
        self.by_id.values().map(|s| &**s)
    }

    /// Entries of the participant and resume-token indexes (for stats: each equals the
    /// number of sessions unless an index leaks).
    pub fn index_len(&self) -> usize {
        self.by_participant.len() + self.by_token.len()
    }

    /// Number of sessions (attached or detached).
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}
