//! `[gateways]`: the settings of the MAMP and IM gateways (docs/gateways.md), with the reason
//! for each default. Parsed by `server::config` as part of the config file.

use std::time::Duration;

use serde::Deserialize;

/// Default largest MAMP message: the seed's own card advertises 10 MiB (`max_message_size`).
pub const DEFAULT_MAMP_MAX_MESSAGE_SIZE: usize = 10 * 1024 * 1024;
/// Default time an outbound MAMP POST may take (connect, send, answer): long enough for a
/// remote agent that does some work before answering, short enough that a dead endpoint does
/// not hold a message for long.
pub const DEFAULT_MAMP_REQUEST_TIMEOUT_MS: u64 = 10_000;
/// Default IM heartbeat timeout: three missed heartbeats of the seed's 30 s period.
pub const DEFAULT_IM_HEARTBEAT_TIMEOUT_MS: u64 = 90_000;
/// Default time a new IM WebSocket has to send its `register` frame (the router's own
/// handshake timeout for MAP sessions).
pub const DEFAULT_IM_REGISTER_TIMEOUT_MS: u64 = 10_000;
/// Default largest IM frame (the router's default MAP frame limit).
pub const DEFAULT_IM_MAX_FRAME_BYTES: usize = 1 << 20;

/// `[gateways]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewaySettings {
    /// The host of this router's `agent://HOST/ID` URIs. Unset: the host a request was
    /// addressed to (its `Host` header) is taken as ours, and outbound messages name the
    /// first listen address.
    pub domain: Option<String>,
    /// `[gateways.mamp]`.
    pub mamp: MampSettings,
    /// `[gateways.im]`.
    pub im: ImSettings,
}

/// `[gateways.mamp]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MampSettings {
    /// Serve `/mamp/v1/*` (default true).
    pub enabled: bool,
    /// Largest `POST /mamp/v1/messages` body in bytes (413 above it; advertised in the card).
    pub max_message_size: usize,
    /// Time limit of one outbound POST, in ms.
    pub request_timeout_ms: u64,
    /// `[[gateways.mamp.remote]]`: remote MAMP agents MAP agents may message.
    pub remote: Vec<RemoteMamp>,
}

impl Default for MampSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            max_message_size: DEFAULT_MAMP_MAX_MESSAGE_SIZE,
            request_timeout_ms: DEFAULT_MAMP_REQUEST_TIMEOUT_MS,
            remote: Vec::new(),
        }
    }
}

impl MampSettings {
    /// [`MampSettings::request_timeout_ms`] as a duration.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms.max(1))
    }
}

/// One `[[gateways.mamp.remote]]`: a remote MAMP agent that gets a MAP agent of its own (id =
/// its URI) while the router runs; what MAP agents send to it is POSTed to `endpoint`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteMamp {
    /// Its `agent://HOST/ID` URI.
    pub uri: String,
    /// The base URL of its MAMP server (`http://host:port`); messages go to
    /// `<endpoint>/mamp/v1/messages`. A URL already ending in `/mamp/v1/messages` is used as is.
    pub endpoint: String,
    /// Sent as `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// The MAP agent's name (default: the URI).
    pub name: Option<String>,
}

/// `[gateways.im]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImSettings {
    /// Serve `/gateway/*` and `/api/*` (default true).
    pub enabled: bool,
    /// An IM connection that sends nothing for this long (ms) is closed and its agent goes
    /// offline.
    pub heartbeat_timeout_ms: u64,
    /// Time (ms) a new connection has to send its `register` frame.
    pub register_timeout_ms: u64,
    /// Largest text frame an IM client may send, in bytes.
    pub max_frame_bytes: usize,
}

impl Default for ImSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            heartbeat_timeout_ms: DEFAULT_IM_HEARTBEAT_TIMEOUT_MS,
            register_timeout_ms: DEFAULT_IM_REGISTER_TIMEOUT_MS,
            max_frame_bytes: DEFAULT_IM_MAX_FRAME_BYTES,
        }
    }
}

impl ImSettings {
    /// [`ImSettings::heartbeat_timeout_ms`] as a duration.
    pub fn heartbeat_timeout(&self) -> Duration {
        Duration::from_millis(self.heartbeat_timeout_ms.max(1))
    }

    /// [`ImSettings::register_timeout_ms`] as a duration.
    pub fn register_timeout(&self) -> Duration {
        Duration::from_millis(self.register_timeout_ms.max(1))
    }
}

impl GatewaySettings {
    /// Checks what serde cannot: remote URIs and endpoints.
    ///
    /// # Errors
    /// What is wrong, naming the setting.
    pub fn validate(&self) -> Result<(), String> {
        for r in &self.mamp.remote {
            if crate::gateway::wire::AgentUri::parse(&r.uri).is_none() {
                return Err(format!(
                    "gateways.mamp.remote: uri `{}` is not agent://HOST/ID",
                    r.uri
                ));
            }
            if !r.endpoint.starts_with("http://") {
                return Err(format!(
                    "gateways.mamp.remote: endpoint `{}` must be an http:// URL",
                    r.endpoint
                ));
            }
        }
        Ok(())
    }
}
