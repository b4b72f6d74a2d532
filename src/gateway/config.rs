//! `[gateways]`: the settings of the MAMP and IM gateways (docs/gateways.md), with the reason
//! for each default. Parsed by `server::config` as part of the config file.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::gateway::wire::AgentUri;

/// Default largest MAMP message: 256 KiB, what the router delivers (`[limits]
/// max_payload_bytes`). The seed's own card advertises 10 MiB, but a message the router cannot
/// carry would be accepted and never delivered; the card advertises the true limit, and a
/// larger setting is lowered to what the router delivers (docs/gateways.md, "Limits").
pub const DEFAULT_MAMP_MAX_MESSAGE_SIZE: usize = 256 * 1024;
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
/// Default time a caller's MAP session, or the session of an outside MAMP sender, stays open
/// after its last use: long enough for a conversation's back and forth, short enough that a
/// caller who went away does not hold one of its principal's sessions for long.
pub const DEFAULT_SESSION_IDLE_MS: u64 = 60_000;
/// Default time a request body may take to arrive (as `/map/rpc`'s; a stalled connection is
/// answered 408 and closed within it, well inside 15 s).
pub const DEFAULT_BODY_TIMEOUT_MS: u64 = 10_000;
/// Default request budget of one caller (a principal, or an address without authentication),
/// shared by its HTTP requests and its IM frames: 200 per second, bursts of 400. Far above what
/// an agent chatting sends; a flooder spends its own budget and nobody else's.
pub const DEFAULT_RATE_PER_CALLER: u32 = 200;
/// Default burst of [`DEFAULT_RATE_PER_CALLER`].
pub const DEFAULT_BURST_PER_CALLER: u32 = 400;
/// Default most contacts the read model keeps of agents that are not online (the least
/// recently active forgotten first). An online agent is always kept.
pub const DEFAULT_MAX_CONTACTS: usize = 10_000;
/// Default most conversations the read model keeps (the least recently active forgotten
/// first).
pub const DEFAULT_MAX_CONVERSATIONS: usize = 10_000;
/// Default most live IM WebSockets in all (each is a MAP session and about 60 KB).
pub const DEFAULT_IM_MAX_CONNECTIONS: usize = 4096;
/// Default most live IM WebSockets of one caller (a principal, or an address without
/// authentication): the router's default `max_sessions_per_principal`.
pub const DEFAULT_IM_MAX_CONNECTIONS_PER_CALLER: usize = 64;
/// Default longest one write to an IM WebSocket (or a wait for room in its outbound queue)
/// may take before the peer is taken for one that stopped reading and dropped.
pub const DEFAULT_IM_WRITE_TIMEOUT_MS: u64 = 10_000;
/// Default WebSocket ping period of an IM connection; a pong (or any frame) must come back
/// within `write_timeout_ms` of a ping, else the peer is dropped as deaf.
pub const DEFAULT_IM_PING_INTERVAL_MS: u64 = 20_000;
/// Default frames queued for one IM WebSocket's writer.
pub const DEFAULT_IM_SEND_QUEUE: usize = 64;
/// Room left in a MAP frame for the envelope around a gateway message's content (the JSON-RPC
/// envelope, `meta`, the ids): the largest body a gateway accepts is the router's frame limit
/// less this.
pub const ENVELOPE_ROOM: usize = 16 * 1024;

/// What the server tells the gateways about the router they translate for: the limits a
/// message must fit to be deliverable at all, whether loopback callers are exempt from
/// per-address limits, and the ports it listens on (an `agent://HOST:PORT/...` URI is ours
/// only with one of them).
#[derive(Debug, Clone)]
pub struct RouterFacts {
    /// `[limits] max_payload_bytes`: the largest message payload the router takes.
    pub max_payload_bytes: usize,
    /// `[limits] max_frame_bytes`: the largest frame a connection (the gateways' in-process
    /// ones too) may send.
    pub max_frame_bytes: usize,
    /// `[limits] exempt_loopback`: loopback callers without a principal skip the per-address
    /// rate bucket and connection cap (the global ones still apply).
    pub exempt_loopback: bool,
    /// The ports the server listens on.
    pub listen_ports: Vec<u16>,
}

impl Default for RouterFacts {
    fn default() -> Self {
        Self {
            max_payload_bytes: 256 * 1024,
            max_frame_bytes: 1 << 20,
            exempt_loopback: true,
            listen_ports: Vec::new(),
        }
    }
}

/// Most `[[gateways.mamp.remote]]` entries. Each is a MAP session and agent of the router's
/// service principal for as long as the router runs: the configuration alone decides how many
/// sessions the service holds for them, and this keeps that number small (well within
/// `[limits] max_sessions_per_principal`, where the service's sessions are counted).
pub const MAX_MAMP_REMOTES: usize = 32;

/// `[gateways]`.
#[derive(Debug, Clone, Deserialize)]
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
    /// A caller's MAP session (and an outside MAMP sender's) is closed after this long unused,
    /// in ms (docs/gateways.md, "Identity").
    pub session_idle_ms: u64,
    /// Longest a request body may take to arrive, in ms (408 and the connection closed after).
    pub body_timeout_ms: u64,
    /// Requests per second of one caller (principal, or address without authentication), its
    /// HTTP requests and IM frames together; 0: unlimited.
    pub rate_per_caller: u32,
    /// Burst of `rate_per_caller`.
    pub burst_per_caller: u32,
    /// Most contacts kept of agents not online (read model; least recently active forgotten).
    pub max_contacts: usize,
    /// Most conversations kept (read model; least recently active forgotten).
    pub max_conversations: usize,
}

/// `[gateways.mamp]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MampSettings {
    /// Serve `/mamp/v1/*` (default true).
    pub enabled: bool,
    /// Largest `POST /mamp/v1/messages` body in bytes (413 above it; advertised in the card).
    /// Lowered to what the router can deliver when larger (`[limits] max_payload_bytes`, and
    /// `max_frame_bytes` less [`ENVELOPE_ROOM`]).
    pub max_message_size: usize,
    /// Time limit of one outbound POST, in ms.
    pub request_timeout_ms: u64,
    /// `[[gateways.mamp.remote]]`: remote MAMP agents MAP agents may message.
    pub remote: Vec<RemoteMamp>,
    /// `namespaces = { "<principal id>" = "agent://alice.example/" }` (or a list of prefixes):
    /// the `from` URIs a principal may post as, besides its default namespace
    /// `agent://<principal id>@HOST/...` (docs/gateways.md, "Who may send as whom").
    pub namespaces: BTreeMap<String, Prefixes>,
}

/// One URI prefix or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prefixes {
    /// `"agent://alice.example/"`.
    One(String),
    /// `["agent://alice.example/", "agent://alice.dev/"]`.
    Many(Vec<String>),
}

impl Prefixes {
    /// The prefixes.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        let list: &[String] = match self {
            Prefixes::One(p) => std::slice::from_ref(p),
            Prefixes::Many(v) => v,
        };
        list.iter().map(String::as_str)
    }
}

impl Default for MampSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            max_message_size: DEFAULT_MAMP_MAX_MESSAGE_SIZE,
            request_timeout_ms: DEFAULT_MAMP_REQUEST_TIMEOUT_MS,
            remote: Vec::new(),
            namespaces: BTreeMap::new(),
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
    /// The principal (its id: an API key's principal or a JWT's `sub`) whose credential may
    /// post to `/mamp/v1/messages` as this agent. Unset: nobody may (with `[auth]` on).
    pub principal: Option<String>,
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
    /// Largest text frame an IM client may send, in bytes (close 1009 above it).
    pub max_frame_bytes: usize,
    /// Most live IM WebSockets in all (503 to the upgrade above it).
    pub max_connections: usize,
    /// Most live IM WebSockets of one caller (429 to the upgrade above it).
    pub max_connections_per_caller: usize,
    /// Longest one write to an IM WebSocket may take, in ms, before the peer is dropped as one
    /// that stopped reading; also how long a ping may go unanswered.
    pub write_timeout_ms: u64,
    /// How often the gateway pings an IM WebSocket, in ms (0: never).
    pub ping_interval_ms: u64,
    /// Frames queued for one IM WebSocket's writer.
    pub send_queue: usize,
}

impl Default for ImSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            heartbeat_timeout_ms: DEFAULT_IM_HEARTBEAT_TIMEOUT_MS,
            register_timeout_ms: DEFAULT_IM_REGISTER_TIMEOUT_MS,
            max_frame_bytes: DEFAULT_IM_MAX_FRAME_BYTES,
            max_connections: DEFAULT_IM_MAX_CONNECTIONS,
            max_connections_per_caller: DEFAULT_IM_MAX_CONNECTIONS_PER_CALLER,
            write_timeout_ms: DEFAULT_IM_WRITE_TIMEOUT_MS,
            ping_interval_ms: DEFAULT_IM_PING_INTERVAL_MS,
            send_queue: DEFAULT_IM_SEND_QUEUE,
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

    /// [`ImSettings::write_timeout_ms`] as a duration.
    pub fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.write_timeout_ms.max(1))
    }

    /// [`ImSettings::ping_interval_ms`] as a duration (`None`: no pings).
    pub fn ping_interval(&self) -> Option<Duration> {
        (self.ping_interval_ms > 0).then(|| Duration::from_millis(self.ping_interval_ms))
    }
}

impl Default for GatewaySettings {
    fn default() -> Self {
        Self {
            domain: None,
            mamp: MampSettings::default(),
            im: ImSettings::default(),
            session_idle_ms: DEFAULT_SESSION_IDLE_MS,
            body_timeout_ms: DEFAULT_BODY_TIMEOUT_MS,
            rate_per_caller: DEFAULT_RATE_PER_CALLER,
            burst_per_caller: DEFAULT_BURST_PER_CALLER,
            max_contacts: DEFAULT_MAX_CONTACTS,
            max_conversations: DEFAULT_MAX_CONVERSATIONS,
        }
    }
}

impl GatewaySettings {
    /// [`GatewaySettings::session_idle_ms`] as a duration.
    pub fn session_idle(&self) -> Duration {
        Duration::from_millis(self.session_idle_ms.max(1))
    }

    /// [`GatewaySettings::body_timeout_ms`] as a duration.
    pub fn body_timeout(&self) -> Duration {
        Duration::from_millis(self.body_timeout_ms.max(1))
    }

    /// Checks what serde cannot: remote URIs and endpoints, namespace prefixes.
    ///
    /// # Errors
    /// What is wrong, naming the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.mamp.remote.len() > MAX_MAMP_REMOTES {
            return Err(format!(
                "gateways.mamp.remote: at most {MAX_MAMP_REMOTES} remote agents (each is a \
                 session of the router's service principal)"
            ));
        }
        for (principal, prefixes) in &self.mamp.namespaces {
            for prefix in prefixes.iter() {
                let host_ok = prefix
                    .strip_prefix(AgentUri::SCHEME)
                    .and_then(|rest| rest.split_once('/'))
                    .is_some_and(|(host, _)| !host.is_empty());
                if !host_ok || !prefix.ends_with('/') {
                    return Err(format!(
                        "gateways.mamp.namespaces.{principal}: `{prefix}` must be \
                         agent://HOST/ with an optional path, ending in /"
                    ));
                }
            }
        }
        for r in &self.mamp.remote {
            if AgentUri::parse(&r.uri).is_none() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<GatewaySettings, String> {
        let s: GatewaySettings = toml::from_str(text).map_err(|e| e.to_string())?;
        s.validate().map(|()| s)
    }

    #[test]
    fn namespaces_and_remote_principals() {
        let s = parse(
            r#"
session_idle_ms = 500
[mamp]
namespaces = { alice = "agent://alice.example/", bob = ["agent://bob.example/", "agent://bob.dev/x/"] }
[[mamp.remote]]
uri = "agent://other.example/a"
endpoint = "http://127.0.0.1:9"
principal = "partner"
"#,
        )
        .unwrap();
        assert_eq!(s.session_idle(), Duration::from_millis(500));
        assert_eq!(
            s.mamp.namespaces["bob"].iter().collect::<Vec<_>>(),
            ["agent://bob.example/", "agent://bob.dev/x/"]
        );
        assert_eq!(s.mamp.remote[0].principal.as_deref(), Some("partner"));
        assert_eq!(
            GatewaySettings::default().session_idle_ms,
            DEFAULT_SESSION_IDLE_MS
        );
        for bad in [
            "agent://alice.example",
            "agent:///x/",
            "http://alice.example/",
            "agent://alice.example/bots",
        ] {
            let e = parse(&format!("[mamp]\nnamespaces = {{ alice = \"{bad}\" }}")).unwrap_err();
            assert!(e.contains("gateways.mamp.namespaces.alice"), "{bad}: {e}");
        }
        let many: String = (0..=MAX_MAMP_REMOTES)
            .map(|i| {
                format!(
                    "[[mamp.remote]]\nuri = \"agent://r.example/{i}\"\nendpoint = \"http://127.0.0.1:9\"\n"
                )
            })
            .collect();
        assert!(parse(&many).unwrap_err().contains("at most"));
    }
}
