//! `[aip]`: the AIP gateway's settings ([`AipSettings`]) and what a silent node becomes
//! ([`Silence`]).
//!
//! Owns nothing but the values.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::dial;

/// What happens to a node silent past `heartbeat_timeout_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Silence {
    /// Upstream's rule (the default): the node is removed, its MAP agent unregistered; it must
    /// register again.
    #[default]
    Evict,
    /// The node stays; its session closes, so its MAP agent is orphaned (presence offline);
    /// its next heartbeat (or call) reclaims it with a new session.
    Offline,
}

/// `[aip]`: the AIP gateway (`docs/aip.md`). Off unless `listen` is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AipSettings {
    /// Where to serve `GatewayService` (gRPC, HTTP/2; TLS when `[tls]` is set). `None`: off.
    pub listen: Option<SocketAddr>,
    /// Where nodes' own servers may be dialled back (`dial.rs`; default loopback only).
    pub dial_allow: Vec<String>,
    /// A node silent this long is evicted or marked offline (default 30 000, upstream's).
    pub heartbeat_timeout_ms: u64,
    /// `evict` (default, upstream's) or `offline`.
    pub on_silence: Silence,
    /// Largest gRPC message received or sent, in bytes (default 4 MiB, gRPC's own).
    pub max_message_bytes: usize,
    /// Connections to the AIP listener at once (default 1024); one more is closed at once.
    pub max_connections: usize,
    /// Concurrent gRPC streams on one connection (default 64).
    pub max_streams_per_connection: u32,
    /// Agent sessions (started by AIP nodes or by MAP agents), tool calls in flight and update
    /// subscriptions open at once, over all callers (default 256).
    pub max_sessions: usize,
    /// Nodes one principal may have registered (default 256). With authentication off every
    /// caller is the one anonymous principal, so this caps all nodes.
    pub max_nodes_per_principal: usize,
    /// Distinct domains (MAP scopes `aip:<domain>`, made by the gateway) over the gateway's
    /// life (default 1024); a registration in one more gets `RESOURCE_EXHAUSTED`.
    pub max_domains: usize,
    /// How long a `RouteAgentCalling` stream may wait before its first message (default 10 000).
    pub first_message_timeout_ms: u64,
    /// An agent session with no traffic this long is ended (default 300 000).
    pub session_idle_timeout_ms: u64,
    /// Longest tool call (default 60 000; a caller's shorter gRPC deadline wins).
    pub tool_timeout_ms: u64,
    /// Longest wait for a node's server to accept the dial-back connection (default 10 000).
    pub dial_timeout_ms: u64,
}

impl Default for AipSettings {
    fn default() -> Self {
        Self {
            listen: None,
            dial_allow: dial::default_allow(),
            heartbeat_timeout_ms: 30_000,
            on_silence: Silence::Evict,
            max_message_bytes: 4 << 20,
            max_connections: 1024,
            max_streams_per_connection: 64,
            max_sessions: 256,
            max_nodes_per_principal: 256,
            max_domains: 1024,
            first_message_timeout_ms: 10_000,
            session_idle_timeout_ms: 300_000,
            tool_timeout_ms: 60_000,
            dial_timeout_ms: 10_000,
        }
    }
}

impl AipSettings {
    /// Checks what can be checked before start.
    ///
    /// # Errors
    /// A malformed `dial_allow` entry, or a zero limit.
    pub fn validate(&self) -> Result<(), String> {
        dial::DialAllow::parse(&self.dial_allow).map_err(|e| format!("aip.dial_allow: {e}"))?;
        if self.max_message_bytes == 0
            || self.max_sessions == 0
            || self.max_domains == 0
            || self.heartbeat_timeout_ms == 0
        {
            return Err(
                "aip: max_message_bytes, max_sessions, max_domains and heartbeat_timeout_ms must be > 0"
                    .into(),
            );
        }
        Ok(())
    }

    /// Milliseconds as a `Duration`.
    pub fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }
}
