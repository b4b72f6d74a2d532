//! [`ClientOptions`], [`ReconnectPolicy`] and [`ConnectionState`].

use std::path::PathBuf;
use std::time::Duration;

use crate::protocol::capabilities::{ParticipantCapabilities, ParticipantType};
use crate::protocol::ids::ParticipantId;
use crate::protocol::methods::session::{AuthCredentials, ConnectParams, DisconnectPolicy};

/// Default time a request waits for its response (the SDK's `defaultTimeout`).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time to open a transport and complete `map/connect`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default events buffered per subscription before the client pauses it (see
/// [`Subscription`](super::Subscription)).
pub const DEFAULT_SUBSCRIPTION_BUFFER: usize = 1024;
/// Default messages buffered per agent inbox.
pub const DEFAULT_MESSAGE_BUFFER: usize = 1024;

/// How a [`Client`](super::Client) connects: who it is and how patient it is.
///
/// ```
/// use std::time::Duration;
/// use map_router::client::{ClientOptions, ReconnectPolicy};
///
/// let options = ClientOptions::agent()
///     .name("worker-1")
///     .request_timeout(Duration::from_secs(5))
///     .reconnect(ReconnectPolicy::default().max_attempts(20));
/// ```
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub(crate) participant_type: ParticipantType,
    pub(crate) participant_id: Option<ParticipantId>,
    pub(crate) name: Option<String>,
    pub(crate) capabilities: Option<ParticipantCapabilities>,
    pub(crate) resume_token: Option<String>,
    pub(crate) auth: Option<AuthCredentials>,
    pub(crate) disconnect_policy: Option<DisconnectPolicy>,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) reconnect: ReconnectPolicy,
    pub(crate) subscription_buffer: usize,
    pub(crate) message_buffer: usize,
    pub(crate) ca_file: Option<PathBuf>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            participant_type: ParticipantType::Client,
            participant_id: None,
            name: None,
            capabilities: None,
            resume_token: None,
            auth: None,
            disconnect_policy: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            reconnect: ReconnectPolicy::default(),
            subscription_buffer: DEFAULT_SUBSCRIPTION_BUFFER,
            message_buffer: DEFAULT_MESSAGE_BUFFER,
            ca_file: None,
        }
    }
}

impl ClientOptions {
    /// Defaults: participant type `client`, 30 s request timeout, default reconnect policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Defaults with participant type `agent` (may register agents, spawn, manage scopes,
    /// broadcast).
    pub fn agent() -> Self {
        Self::default().participant_type(ParticipantType::Agent)
    }

    /// The participant type declared in `map/connect` (`client` by default).
    pub fn participant_type(mut self, kind: ParticipantType) -> Self {
        self.participant_type = kind;
        self
    }

    /// Ask for this participant id (honoured when free).
    pub fn participant_id(mut self, id: impl Into<ParticipantId>) -> Self {
        self.participant_id = Some(id.into());
        self
    }

    /// Display name sent in `map/connect`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Capabilities to ask for; they can only narrow the router's default grant.
    pub fn capabilities(mut self, caps: ParticipantCapabilities) -> Self {
        self.capabilities = Some(caps);
        self
    }

    /// Resume an earlier session (a token from a connect or disconnect result).
    pub fn resume_token(mut self, token: impl Into<String>) -> Self {
        self.resume_token = Some(token.into());
        self
    }

    /// Credentials sent with every `map/connect` (reconnects included), for a router with
    /// authentication on (docs/security.md).
    pub fn auth(mut self, credentials: AuthCredentials) -> Self {
        self.auth = Some(credentials);
        self
    }

    /// Authenticate with a JWT (`{method: "bearer", credential}`).
    pub fn bearer_token(self, token: impl Into<String>) -> Self {
        self.auth(AuthCredentials {
            method: "bearer".into(),
            credential: Some(token.into()),
            token: None,
            metadata: None,
        })
    }

    /// Authenticate with an API key (`{method: "api-key", credential}`).
    pub fn api_key(self, key: impl Into<String>) -> Self {
        self.auth(AuthCredentials {
            method: "api-key".into(),
            credential: Some(key.into()),
            token: None,
            metadata: None,
        })
    }

    /// What the router does with this session's agents when it goes away.
    pub fn disconnect_policy(mut self, policy: DisconnectPolicy) -> Self {
        self.disconnect_policy = Some(policy);
        self
    }

    /// How long a request waits for its response (default 30 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long opening a transport plus `map/connect` may take (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// When and how to reconnect after the transport is lost (WebSocket only).
    pub fn reconnect(mut self, policy: ReconnectPolicy) -> Self {
        self.reconnect = policy;
        self
    }

    /// Events buffered per subscription (at least 2; default 1024).
    pub fn subscription_buffer(mut self, events: usize) -> Self {
        self.subscription_buffer = events.max(2);
        self
    }

    /// Messages buffered per agent inbox (at least 1; default 1024).
    pub fn message_buffer(mut self, messages: usize) -> Self {
        self.message_buffer = messages.max(1);
        self
    }

    /// A CA certificate file (PEM, one or more certificates) to trust for a `wss://` router,
    /// besides the platform's root certificates: the CA that signed the router's certificate, or
    /// a self-signed certificate itself. Read when the client is created (an unusable file is
    /// [`ClientError::CaFile`](super::ClientError::CaFile)) and kept for its reconnects; ignored
    /// for `ws://`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), map_router::client::ClientError> {
    /// use map_router::client::{Client, ClientOptions};
    /// let client = Client::connect_ws(
    ///     "wss://router.example:4500/",
    ///     ClientOptions::new().ca_file("ca.pem"),
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// The `map/connect` params these options produce.
    pub(crate) fn connect_params(&self) -> ConnectParams {
        ConnectParams {
            protocol_version: Some(serde_json::Value::from(crate::protocol::PROTOCOL_VERSION)),
            participant_type: Some(self.participant_type),
            participant_id: self.participant_id.clone(),
            name: self.name.clone(),
            capabilities: self.capabilities.clone(),
            resume_token: self.resume_token.clone(),
            disconnect_policy: self.disconnect_policy.clone(),
            auth: self.auth.clone(),
            ..ConnectParams::default()
        }
    }
}

/// Reconnecting after a lost transport: bounded attempts with exponential backoff and jitter.
///
/// Each attempt opens a new transport and resumes the session with its resume token, which
/// also reclaims the session's agents; live subscriptions are re-subscribed from the last event
/// they delivered. Only WebSocket clients reconnect; a stdio child or an in-process link that
/// ends closes the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) initial_delay: Duration,
    pub(crate) max_delay: Duration,
}

impl Default for ReconnectPolicy {
    /// 10 attempts, starting after 100 ms and doubling up to 5 s (about 25 s in all).
    fn default() -> Self {
        Self {
            max_attempts: 10,
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(5),
        }
    }
}

impl ReconnectPolicy {
    /// Never reconnect automatically ([`Client::reconnect`](super::Client::reconnect) still
    /// tries once).
    pub fn disabled() -> Self {
        Self {
            max_attempts: 0,
            ..Self::default()
        }
    }

    /// Give up after this many consecutive failed attempts (0 disables reconnecting).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// First delay and ceiling of the exponential backoff.
    pub fn delays(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_delay = initial;
        self.max_delay = max.max(initial);
        self
    }

    /// Whether automatic reconnection is on.
    pub fn is_enabled(&self) -> bool {
        self.max_attempts > 0
    }

    /// The delay before attempt `attempt` (1-based): `initial · 2^(attempt−1)`, capped, with
    /// ±50 % jitter so many clients do not reconnect in lock-step.
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(20);
        let base = self
            .initial_delay
            .saturating_mul(1u32 << exp)
            .min(self.max_delay);
        let jitter = (crate::protocol::ids::random_u128() % 1000) as u32; // 0..1000
        base.mul_f64(0.5 + f64::from(jitter) / 1000.0)
    }
}

/// Where the client's connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionState {
    /// The first transport is open and `map/connect` is in flight.
    Connecting,
    /// A session is established; calls go out at once.
    Connected,
    /// The transport was lost; the client is reconnecting (calls wait for it, up to their
    /// timeout).
    Reconnecting {
        /// Attempts made so far in this outage.
        attempt: u32,
    },
    /// The client is closed; every call fails with [`ClientError::Closed`](super::ClientError::Closed).
    Closed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_ceiling_with_jitter() {
        let p =
            ReconnectPolicy::default().delays(Duration::from_millis(100), Duration::from_secs(1));
        for _ in 0..50 {
            let d1 = p.delay(1);
            assert!(d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(150));
            let d10 = p.delay(10);
            assert!(d10 >= Duration::from_millis(500) && d10 <= Duration::from_millis(1500));
        }
        assert!(!ReconnectPolicy::disabled().is_enabled());
    }
}
