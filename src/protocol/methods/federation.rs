//! Federation (`urn:map:ext:federation:1`, seed 001 "Pattern 3: MAP-to-MAP"): the envelope a
//! routed message travels in between systems, and the checks a system runs on one it receives,
//! in the order `../shared/spec/federation.md` §3 gives (the SDK's `processFederationEnvelope`).
//!
//! Owns the wire shapes (the envelope, `map/federation/connect` and `map/federation/route`) and
//! the pure rules (bounds, hop limit, loop detection, allowed sources and targets, the next
//! envelope); who may route and where a message goes are the router's (`router::federation`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::capabilities::Capability;
use crate::protocol::ids::MessageId;
use crate::protocol::json::RawJson;
use crate::protocol::jsonrpc::{ErrorCode, ErrorObject};
use crate::protocol::methods::method::method;
use crate::protocol::methods::session::Principal;

/// The hop limit when neither the envelope nor the system sets one (the SDK's default).
pub const DEFAULT_MAX_HOPS: u64 = 10;

/// The most hops a system accepts an envelope to ask for: an absurd `maxHops` is capped here.
pub const MAX_HOPS_LIMIT: u64 = 64;

/// Longest system id (bytes): system ids name routers in config, paths and metrics labels.
pub const MAX_SYSTEM_ID_BYTES: usize = 128;

/// `federation` of an envelope (the SDK's `FederationEnvelope.federation`, spec §2.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationRouting {
    /// The system the message started at.
    pub source_system: String,
    /// Its final destination.
    pub target_system: String,
    /// Systems traversed so far.
    pub hop_count: u64,
    /// Reject when `hopCount >= maxHops`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_hops: Option<u64>,
    /// Systems traversed, when tracked (we always track it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<Vec<String>>,
    /// When the message started (Unix ms).
    pub origin_timestamp: u64,
    /// Cross-system correlation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// Reserved by the SDK (no algorithm defined); passed on, never trusted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// A routed message: the payload (a MAP `Message`) and its routing (spec §2.1).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationEnvelope {
    /// The message, passed on byte for byte.
    pub payload: RawJson,
    /// Where it came from and goes.
    pub federation: FederationRouting,
}

/// Longest `from` of a routed message (bytes): it becomes part of the federated sender id.
pub const MAX_FROM_BYTES: usize = 256;

impl FederationEnvelope {
    /// Checks what a peer could grow or smuggle: system ids non-empty, at most
    /// [`MAX_SYSTEM_ID_BYTES`] and without `:` (they become part of federated ids), a path of at
    /// most [`MAX_HOPS_LIMIT`] systems.
    ///
    /// # Errors
    /// What is wrong, for `-32602` details.
    pub fn check_bounds(&self) -> Result<(), String> {
        let f = &self.federation;
        let path = f.path.as_deref().unwrap_or_default();
        if path.len() > MAX_HOPS_LIMIT as usize {
            return Err(format!(
                "federation.path holds {} systems (at most {MAX_HOPS_LIMIT})",
                path.len()
            ));
        }
        for id in [&f.source_system, &f.target_system].into_iter().chain(path) {
            check_system_id(id)?;
        }
        Ok(())
    }
}

/// What a federated id names ([M]'s form `<system>:<kind>:<id>`, spec §5): how another
/// system's agent, or a message that came from it, is named here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Federated {
    /// `<system>:agent:<id>`: an agent of that system (a routed message's sender, a reply's
    /// address).
    Agent,
    /// `<system>:message:<id>`: a message that came from that system (its id here).
    Message,
}

impl Federated {
    fn infix(self) -> &'static str {
        match self {
            Self::Agent => ":agent:",
            Self::Message => ":message:",
        }
    }

    /// `<system>:<kind>:<id>`.
    pub fn id(self, system: &str, id: &str) -> String {
        format!("{system}{}{id}", self.infix())
    }

    /// The system and the id of a federated id of this kind: a system part that is non-empty
    /// and holds no `:` (as every system id, [`check_system_id`]); the id part may be empty.
    pub fn split(self, id: &str) -> Option<(&str, &str)> {
        id.split_once(self.infix())
            .filter(|(system, _)| !system.is_empty() && !system.contains(':'))
    }
}

/// Checks one system id (see [`FederationEnvelope::check_bounds`]).
///
/// # Errors
/// What is wrong with it.
pub fn check_system_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_SYSTEM_ID_BYTES || id.contains(':') {
        return Err(format!(
            "a system id is 1 to {MAX_SYSTEM_ID_BYTES} bytes without ':'"
        ));
    }
    Ok(())
}

/// The `Message` an envelope carries, as far as routing reads it: `to`, `payload` and `meta`
/// are kept as written (delivered byte for byte); the rest of the message is not trusted.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RoutedMessage {
    /// Its id on the system it started at (the receiver's copy is `<source>:message:<id>`,
    /// which makes a route that is sent again after a lost answer a duplicate, not a second
    /// message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The sender on its own system.
    pub from: String,
    /// Where to deliver: any address form, kept as written.
    #[schemars(with = "serde_json::Value")]
    pub to: RawJson,
    /// The payload, byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Value>")]
    pub payload: Option<RawJson>,
    /// Message metadata, byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Value>")]
    pub meta: Option<RawJson>,
}

/// `map/federation/connect` params (the SDK sends the first four; the rest is read and ignored).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationConnectParams {
    /// The system this link speaks for.
    pub system_id: String,
    /// Where that system is reached (recorded, not dialled).
    pub endpoint: String,
    /// Credentials: not read; the link's identity is its session's principal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<serde_json::Value>,
    /// The challenge a retry answers (not read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_context: Option<serde_json::Value>,
    /// The peer's own description (not read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_info: Option<serde_json::Value>,
    /// Protocol version (not read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<serde_json::Value>,
    /// What the peer exposes (not read yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposure: Option<serde_json::Value>,
}

/// This system, as a peer sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SystemInfo {
    /// Name (the system id).
    pub name: String,
    /// Router version.
    pub version: String,
    /// What it serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<serde_json::Value>,
}

/// How to prove the identity a refused link claimed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FederationAuthRequired {
    /// Methods the router accepts (on `map/connect`).
    pub methods: Vec<String>,
    /// `map_chal_<ULID>`.
    pub challenge: String,
    /// Always true.
    pub required: bool,
}

/// `map/federation/connect` result: `connected: false` with `authRequired` is a result, not
/// an error (spec §1); `systemInfo` is always there (the SDK records a peer only with it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationConnectResult {
    /// Whether the link now speaks for the system.
    pub connected: bool,
    /// This system.
    pub system_info: SystemInfo,
    /// The link's session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The principal the link authenticated as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<Principal>,
    /// When not connected: how to prove the identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_required: Option<FederationAuthRequired>,
}

/// `map/federation/route` params: the SDK's `{systemId, envelope}`, or the legacy
/// `{systemId, message}`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationRouteParams {
    /// The system the message is for (the envelope's `targetSystem` wins).
    pub system_id: String,
    /// The envelope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envelope: Option<FederationEnvelope>,
    /// Legacy: a bare message, wrapped as coming from the link's system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Value>")]
    pub message: Option<RawJson>,
    /// The request's own trace context (`traceparent`, `tracestate`), as on any MAP request:
    /// our links send the sending system's, so the message's events here join its trace.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Value>")]
    pub meta: Option<RawJson>,
}

/// `map/federation/route` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationRouteResult {
    /// Whether it was delivered here (or passed on).
    pub routed: bool,
    /// The id of the message delivered here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<MessageId>,
}

/// `map/federation/outbound/next` params: the router's own peer link (the server's dialler,
/// `gateway::federation`) takes the next messages waiting for a peer system. Not part of MAP:
/// only the router's service principal may call it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboundNextParams {
    /// The peer system.
    pub system_id: String,
    /// Start again from the oldest unacknowledged message (a new link to the peer).
    #[serde(default)]
    pub restart: bool,
    /// Most messages to take (default and cap 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<usize>,
    /// How long to wait for one when none waits (ms; default 0, at most 30 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// One message waiting for a peer: the envelope to route there.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboundItem {
    /// The id of the message here (what the acknowledgement names).
    pub message_id: MessageId,
    /// What to send: `map/federation/route {systemId: <the peer>, envelope}`.
    pub envelope: FederationEnvelope,
    /// The trace context to send with it (`_meta`): this system's span of the message, else
    /// the message's own or its request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Its `tracestate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

/// `map/federation/outbound/next` result.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboundNextResult {
    /// Oldest first.
    pub items: Vec<OutboundItem>,
}

/// What a peer answered a route with, when it refused it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RouteRefusal {
    /// The peer's error code.
    pub code: i32,
    /// Its message.
    pub message: String,
}

/// The peer's answer to the route of one message.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteAnswer {
    /// The message here.
    pub message_id: MessageId,
    /// The peer's refusal; none: routed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RouteRefusal>,
}

/// Most answers one `map/federation/outbound/ack` settles.
pub const MAX_ACKS: usize = 256;

/// `map/federation/outbound/ack` params: the peer's answers to routes, oldest first (one
/// call settles a batch: one commit).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboundAckParams {
    /// The peer system.
    pub system_id: String,
    /// The answers (at most [`MAX_ACKS`]).
    pub acks: Vec<RouteAnswer>,
}

/// `map/federation/outbound/ack` result.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboundAckResult {
    /// How many of them were waiting (the others were settled before, or are unknown).
    pub acked: usize,
}

/// An agent a peer system shows this one (what the peer lets this system's link principal
/// see), as `map/federation/agents` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemoteAgent {
    /// How to address it here: `<system>:agent:<id>` (or `{system, agent}`).
    #[serde(default)]
    pub federated_id: String,
    /// Its id on its system.
    pub id: String,
    /// Its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Its description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its state, as its system last said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// `map/federation/outbound/agents` params: the router's own link tells it which agents the
/// peer shows this system (the router's own peer links only).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboundAgentsParams {
    /// The peer system.
    pub system_id: String,
    /// Its agents, as the peer listed them to the link.
    pub agents: Vec<RemoteAgent>,
}

/// `map/federation/agents` params.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationAgentsParams {
    /// Only this peer system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_id: Option<String>,
}

/// One peer system in `map/federation/agents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeerAgents {
    /// The peer system.
    pub system_id: String,
    /// When the link last listed them (Unix ms; absent: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listed_at: Option<u64>,
    /// The agents.
    pub agents: Vec<RemoteAgent>,
}

/// `map/federation/agents` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationAgentsResult {
    /// Each peer this router dials.
    pub systems: Vec<PeerAgents>,
}

/// Empty result.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct Empty {}

method!(
    /// `map/federation/agents`: the agents of the peer systems this router dials, as each
    /// shows them to this system (a map-router extension).
    FederationAgents,
    "map/federation/agents",
    None,
    FederationAgentsParams,
    FederationAgentsResult
);

method!(
    /// `map/federation/outbound/agents` (the router's own peer links only).
    FederationOutboundAgents,
    "map/federation/outbound/agents",
    None,
    OutboundAgentsParams,
    Empty
);

method!(
    /// `map/federation/outbound/next` (the router's own peer links only).
    FederationOutboundNext,
    "map/federation/outbound/next",
    None,
    OutboundNextParams,
    OutboundNextResult
);

method!(
    /// `map/federation/outbound/ack` (the router's own peer links only).
    FederationOutboundAck,
    "map/federation/outbound/ack",
    None,
    OutboundAckParams,
    OutboundAckResult
);

method!(
    /// `map/federation/connect` (gateway and system participants).
    FederationConnect,
    "map/federation/connect",
    None,
    FederationConnectParams,
    FederationConnectResult
);

method!(
    /// `map/federation/route` (a connected peer link; it sends, so `messaging.canSend`).
    FederationRoute,
    "map/federation/route",
    Some(Capability::CanSend),
    FederationRouteParams,
    FederationRouteResult
);

/// What a system's own rules allow (spec §3's `config`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutingRules {
    /// This system's id.
    pub system_id: String,
    /// Hop limit when the envelope sets none ([`DEFAULT_MAX_HOPS`] when `None`).
    pub max_hops: Option<u64>,
    /// Only these sources, when set.
    pub allowed_sources: Option<Vec<String>>,
    /// Only these targets, when set.
    pub allowed_targets: Option<Vec<String>>,
}

/// Checks an envelope this system received, in the spec's order, and returns the envelope to
/// pass on: the same payload, `hopCount + 1`, and this system appended to `path` (always
/// tracked, so loops are always caught).
///
/// 1. `hopCount >= maxHops` (the envelope's, capped at [`MAX_HOPS_LIMIT`], else the rules',
///    else 10): `5011 Message exceeded maximum hop count of <maxHops>`.
/// 2. `path` holds this system, unless it is the origin itself (spec §3's caveat: with the path
///    tracked, the origin is already in it): `5010 Loop detected: message already visited <id>`.
/// 3. `allowedSources` set and the source not in it: `5003 Source system <s> not in allowed
///    sources`.
/// 4. `allowedTargets` set and the target not in it: `5003 Target system <t> not in allowed
///    targets`.
///
/// # Errors
/// The first rule broken, as the error object to answer with (`data.category: "federation"`).
pub fn process(
    envelope: &FederationEnvelope,
    rules: &RoutingRules,
) -> Result<FederationEnvelope, ErrorObject> {
    let f = &envelope.federation;
    let max_hops = f
        .max_hops
        .unwrap_or_else(|| rules.max_hops.unwrap_or(DEFAULT_MAX_HOPS))
        .min(MAX_HOPS_LIMIT);
    if f.hop_count >= max_hops {
        return Err(ErrorObject::new(
            ErrorCode::FEDERATION_MAX_HOPS,
            format!("Message exceeded maximum hop count of {max_hops}"),
        ));
    }
    let me = rules.system_id.as_str();
    let visited = f.path.as_deref().unwrap_or_default();
    // The origin's own envelope, not yet sent anywhere, holds it alone: any other visit is a
    // loop (a message of ours that came back through other systems too).
    let origin_once = f.source_system == me && visited == [me];
    let visits = visited.iter().filter(|s| s.as_str() == me).count();
    if visits > usize::from(origin_once) {
        return Err(ErrorObject::new(
            ErrorCode::FEDERATION_LOOP,
            format!("Loop detected: message already visited {me}"),
        ));
    }
    if let Some(allowed) = &rules.allowed_sources {
        if !allowed.contains(&f.source_system) {
            return Err(ErrorObject::new(
                ErrorCode::FEDERATION_NOT_ALLOWED,
                format!("Source system {} not in allowed sources", f.source_system),
            ));
        }
    }
    if let Some(allowed) = &rules.allowed_targets {
        if !allowed.contains(&f.target_system) {
            return Err(ErrorObject::new(
                ErrorCode::FEDERATION_NOT_ALLOWED,
                format!("Target system {} not in allowed targets", f.target_system),
            ));
        }
    }
    let mut next = envelope.clone();
    next.federation.hop_count = f.hop_count + 1;
    let mut path = visited.to_vec();
    if !origin_once {
        path.push(me.to_owned());
    }
    next.federation.path = Some(path);
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(source: &str, target: &str, hops: u64, path: Option<&[&str]>) -> FederationEnvelope {
        FederationEnvelope {
            payload: RawJson::from_text(
                r#"{"id":"m1","from":"a","to":{"agent":"b"},"timestamp":1}"#,
            )
            .unwrap(),
            federation: FederationRouting {
                source_system: source.into(),
                target_system: target.into(),
                hop_count: hops,
                max_hops: None,
                path: path.map(|p| p.iter().map(|s| (*s).to_owned()).collect()),
                origin_timestamp: 1,
                correlation_id: None,
                signature: None,
            },
        }
    }

    fn rules(me: &str) -> RoutingRules {
        RoutingRules {
            system_id: me.into(),
            ..RoutingRules::default()
        }
    }

    #[test]
    fn federated_ids_are_made_and_read_back_one_way() {
        let id = Federated::Agent.id("beta", "bob");
        assert_eq!(id, "beta:agent:bob");
        assert_eq!(Federated::Agent.split(&id), Some(("beta", "bob")));
        assert_eq!(Federated::Message.split(&id), None);
        assert_eq!(
            Federated::Message.split("alpha:message:m:1"),
            Some(("alpha", "m:1"))
        );
        // The system part is a system id: not empty, no `:`. The id part may be empty.
        assert_eq!(Federated::Agent.split(":agent:bob"), None);
        assert_eq!(Federated::Agent.split("a:b:agent:bob"), None);
        assert_eq!(Federated::Agent.split("beta:agent:"), Some(("beta", "")));
        assert_eq!(Federated::Agent.split("bob"), None);
    }

    #[test]
    fn a_fresh_envelope_moves_one_hop_and_records_the_system() {
        let next = process(&env("alpha", "beta", 0, Some(&["alpha"])), &rules("beta")).unwrap();
        assert_eq!(next.federation.hop_count, 1);
        assert_eq!(next.federation.path.unwrap(), ["alpha", "beta"]);
        assert_eq!(next.payload.get(), env("a", "b", 0, None).payload.get());
        // The origin itself (the SDK puts it in the path first) is not a loop.
        let own = process(&env("alpha", "beta", 0, Some(&["alpha"])), &rules("alpha")).unwrap();
        assert_eq!(own.federation.path.unwrap(), ["alpha"]);
        // No path yet: tracking starts here.
        let untracked = process(&env("alpha", "beta", 0, None), &rules("beta")).unwrap();
        assert_eq!(untracked.federation.path.unwrap(), ["beta"]);
    }

    #[test]
    fn the_checks_run_in_the_specs_order_with_its_messages() {
        let strict = RoutingRules {
            system_id: "beta".into(),
            max_hops: Some(3),
            allowed_sources: Some(vec!["alpha".into()]),
            allowed_targets: Some(vec!["beta".into()]),
        };
        // Every rule broken at once: the hop limit is reported first.
        let all = env("evil", "gamma", 3, Some(&["evil", "beta"]));
        let e = process(&all, &strict).unwrap_err();
        assert_eq!(e.code, ErrorCode::FEDERATION_MAX_HOPS);
        assert_eq!(e.message, "Message exceeded maximum hop count of 3");
        assert_eq!(format!("{:?}", e.code.category()), "Federation");
        // Then the loop.
        let e = process(&env("evil", "gamma", 1, Some(&["evil", "beta"])), &strict).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                ErrorCode::FEDERATION_LOOP,
                "Loop detected: message already visited beta"
            )
        );
        // Then the source.
        let e = process(&env("evil", "gamma", 1, Some(&["evil"])), &strict).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                ErrorCode::FEDERATION_NOT_ALLOWED,
                "Source system evil not in allowed sources"
            )
        );
        // Then the target.
        let e = process(&env("alpha", "gamma", 1, Some(&["alpha"])), &strict).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                ErrorCode::FEDERATION_NOT_ALLOWED,
                "Target system gamma not in allowed targets"
            )
        );
        assert!(process(&env("alpha", "beta", 1, Some(&["alpha"])), &strict).is_ok());
    }

    #[test]
    fn the_envelopes_hop_limit_wins_but_an_absurd_one_is_capped() {
        let mut e = env("alpha", "beta", 2, Some(&["alpha"]));
        e.federation.max_hops = Some(2);
        assert_eq!(
            process(&e, &rules("beta")).unwrap_err().code,
            ErrorCode::FEDERATION_MAX_HOPS
        );
        e.federation.max_hops = Some(u64::MAX);
        e.federation.hop_count = MAX_HOPS_LIMIT;
        let err = process(&e, &rules("beta")).unwrap_err();
        assert_eq!(
            err.message,
            format!("Message exceeded maximum hop count of {MAX_HOPS_LIMIT}")
        );
        e.federation.hop_count = 9;
        e.federation.max_hops = None;
        assert!(process(&e, &rules("beta")).is_ok());
        e.federation.hop_count = 10;
        assert_eq!(
            process(&e, &rules("beta")).unwrap_err().code,
            ErrorCode::FEDERATION_MAX_HOPS
        );
    }

    #[test]
    fn a_loop_through_the_origin_is_caught_on_its_second_visit() {
        // alpha → beta → alpha: alpha sees itself first and again.
        let e = env("alpha", "gamma", 2, Some(&["alpha", "beta", "alpha"]));
        assert_eq!(
            process(&e, &rules("alpha")).unwrap_err().code,
            ErrorCode::FEDERATION_LOOP
        );
        // alpha → beta → gamma → alpha: back at the origin through other systems.
        let e = env("alpha", "delta", 2, Some(&["alpha", "beta", "gamma"]));
        assert_eq!(
            process(&e, &rules("alpha")).unwrap_err().message,
            "Loop detected: message already visited alpha"
        );
        // A forged source naming us with a path that does not start with us is a loop too.
        let e = env("alpha", "gamma", 1, Some(&["beta", "alpha"]));
        assert_eq!(
            process(&e, &rules("alpha")).unwrap_err().code,
            ErrorCode::FEDERATION_LOOP
        );
    }
}
