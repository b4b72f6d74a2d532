//! AIP nodes as MAP agents: a [`Node`] (one registered AIP agent or tool), how it is made and
//! removed, how it and MAP-native agents are shown to AIP (`Peer`), and liveness.
//!
//! A node is one MAP session of its registrant's principal (`InProcessLinks::connect_as`), so
//! the router applies that principal's grants: a principal that may not register agents cannot
//! register AIP nodes either. Its agent: id = the AIP id, role `agent` or `tool`, scope
//! `aip:<domain>`, name and description, and `metadata.aip`: `kind`, `domain`, `address`,
//! `version`, modes, skills or the tool's argument schema, and `info`, the registration as
//! sent (protobuf, base64), so that `GetNodes` answers it exactly as registered.
//!
//! A MAP-native agent advertises itself to AIP by joining scope `aip:<domain>`; it is shown as
//! an AIP tool if its role is `tool`, else as an agent, with address "" (reached through the
//! gateway) and the modes, skills or arguments its `metadata.aip` names. Its id is always its
//! MAP agent id and its address always "": `metadata.aip.info` and `address` are claims any
//! agent can write, so only a node this gateway registered is listed with its own `Peer`
//! (from the gateway's table, never from the agent's metadata).
//!
//! Liveness: a heartbeat, a registration, or the first message of a call refreshes a node.
//! The sweeper checks every third of `heartbeat_timeout_ms`; a node silent past it is
//! evicted (upstream's rule) or goes offline (`on_silence = "offline"`: its session closes, so its
//! agent is orphaned, MAP's presence offline; `state.rs`), and comes back with its next sign of
//! life (`service::touch` reclaims it). Each change is a MAP event (`agent_unregistered`;
//! `agent_orphaned` and `agent.presence.changed`; `agent_state_changed`) and a `NodeUpdate` to
//! subscribers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use prost::Message as _;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use super::proto::peer::InfoType;
use super::proto::{agent_info, AgentInfo, AgentMessage, Mode, Peer, ToolInfo};
use crate::client::{AgentHandle, Client};
use crate::gateway::caller::Subject;
use crate::protocol::agent::Agent;
use crate::protocol::methods::agents::RegisterParams;
use crate::protocol::methods::session::Principal;

/// The most refusals (`pump.rs`) one node sends in a second.
pub const REFUSALS_PER_SECOND: u32 = 16;

/// An AIP agent or tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Serves `AgentService`.
    Agent,
    /// Serves `ToolService`.
    Tool,
}

/// One registered node.
#[derive(Debug)]
pub struct Node {
    /// Its AIP id (= its MAP agent id).
    pub id: String,
    /// Agent or tool.
    pub kind: Kind,
    /// Its registered address (dialled back).
    pub address: String,
    /// Who registered it: only this subject (or a system principal) may act as it.
    pub owner: Subject,
    /// Its info as registered (or last updated).
    pub peer: Mutex<Peer>,
    /// The principal that registered it (`None`: authentication is off): its sessions are
    /// this principal's.
    pub principal: Option<Principal>,
    /// How its agent was registered (re-sent to reclaim it after it was offline).
    pub registration: RegisterParams,
    /// Its MAP session and agent (replaced when it comes back from offline).
    session: Mutex<(Client, AgentHandle)>,
    /// The dial-back channel.
    pub channel: Channel,
    last_seen: Mutex<Instant>,
    online: AtomicBool,
    pump: Mutex<Option<JoinHandle<()>>>,
    /// Refusals sent from it this second (`pump.rs`, a forged answer): the window's start and
    /// count, so that other principals' forgeries cost its principal a bounded number of sends.
    refusals: Mutex<(Instant, u32)>,
    /// Sessions other agents hold with this (AIP agent) node: `(MAP sender, session id)` → the
    /// request side of its `CallAgent` stream.
    pub inbound: Mutex<std::collections::HashMap<(String, String), mpsc::Sender<AgentMessage>>>,
}

use crate::sync::lock;

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(pump) = lock(&self.pump).take() {
            pump.abort();
        }
    }
}

/// The `Mode` names of `modes`.
fn mode_names(modes: &[i32]) -> Vec<&'static str> {
    modes
        .iter()
        .map(|m| Mode::try_from(*m).map_or("TEXT", |m| m.as_str_name()))
        .collect()
}

fn modes_of(v: Option<&Value>) -> Vec<i32> {
    let named: Vec<i32> = v
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .filter_map(Mode::from_str_name)
                .map(|m| m as i32)
                .collect()
        })
        .unwrap_or_default();
    if named.is_empty() {
        vec![Mode::Text as i32]
    } else {
        named
    }
}

/// A JSON object as AIP's `map<string, string>` (tool arguments): strings as they are, other
/// values as their JSON text; empty when `v` is not an object.
pub fn string_map<C: FromIterator<(String, String)>>(v: Option<&Value>) -> C {
    v.and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let text = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            (k.clone(), text)
        })
        .collect()
}

/// `metadata.aip` of a node's MAP agent.
pub fn metadata(peer: &Peer) -> Value {
    match &peer.info_type {
        Some(InfoType::AgentInfo(a)) => json!({ "aip": {
            "kind": "agent",
            "domain": a.domain,
            "address": a.address,
            "version": a.version,
            "inputModes": mode_names(&a.input_mode),
            "outputModes": mode_names(&a.output_mode),
            "skills": a.skills.iter().map(|s| json!({"skillId": s.skill_id, "capability": s.capability})).collect::<Vec<_>>(),
            "info": STANDARD.encode(peer.encode_to_vec()),
        }}),
        Some(InfoType::ToolInfo(t)) => json!({ "aip": {
            "kind": "tool",
            "domain": t.domain,
            "address": t.address,
            "version": t.version,
            "inputModes": mode_names(&t.input_mode),
            "outputModes": mode_names(&t.output_mode),
            "arguments": t.arguments,
            "info": STANDARD.encode(peer.encode_to_vec()),
        }}),
        None => json!({}),
    }
}

/// The `aip:` domain of a MAP agent (its first `aip:` scope), if it shows itself to AIP.
pub fn domain_of(agent: &Agent) -> Option<String> {
    agent
        .scopes
        .iter()
        .find_map(|s| s.as_str().strip_prefix("aip:").map(str::to_owned))
}

/// How a MAP agent that this gateway did not register shows to AIP (module docs): under its
/// own id, at address `""`, whatever its metadata claims (`metadata.aip.info` is not read).
pub fn peer_of(agent: &Agent, domain: &str) -> Peer {
    let meta = agent
        .metadata
        .as_ref()
        .map(|m| m.to_value())
        .unwrap_or(Value::Null);
    let aip = meta.get("aip");
    let name = agent.name.clone().unwrap_or_else(|| agent.id.to_string());
    let description = agent.description.clone().unwrap_or_default();
    let version = aip
        .and_then(|a| a.get("version"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let input_mode = modes_of(aip.and_then(|a| a.get("inputModes")));
    let output_mode = modes_of(aip.and_then(|a| a.get("outputModes")));
    if agent.role.as_deref() == Some("tool") {
        let arguments = string_map(aip.and_then(|a| a.get("arguments")));
        return Peer {
            info_type: Some(InfoType::ToolInfo(ToolInfo {
                tool_id: agent.id.to_string(),
                address: String::new(),
                name,
                domain: domain.to_owned(),
                input_mode,
                output_mode,
                description,
                arguments,
                version,
            })),
        };
    }
    let skills = aip
        .and_then(|a| a.get("skills"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|s| agent_info::AgentSkill {
                    skill_id: s
                        .get("skillId")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                    capability: s
                        .get("capability")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                })
                .collect()
        })
        .unwrap_or_default();
    Peer {
        info_type: Some(InfoType::AgentInfo(AgentInfo {
            agent_id: agent.id.to_string(),
            address: String::new(),
            name,
            domain: domain.to_owned(),
            input_mode,
            output_mode,
            description,
            skills,
            version,
        })),
    }
}

/// The id of `peer`.
pub fn peer_id(peer: &Peer) -> &str {
    match &peer.info_type {
        Some(InfoType::AgentInfo(a)) => &a.agent_id,
        Some(InfoType::ToolInfo(t)) => &t.tool_id,
        None => "",
    }
}

impl Node {
    /// A node over its opened session and registered agent (its pump is started by the
    /// registration, [`Node::set_pump`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kind: Kind,
        peer: Peer,
        owner: Subject,
        principal: Option<Principal>,
        registration: RegisterParams,
        client: Client,
        agent: AgentHandle,
        channel: Channel,
    ) -> Arc<Self> {
        let (id, address) = match &peer.info_type {
            Some(InfoType::AgentInfo(a)) => (a.agent_id.clone(), a.address.clone()),
            Some(InfoType::ToolInfo(t)) => (t.tool_id.clone(), t.address.clone()),
            None => (String::new(), String::new()),
        };
        Arc::new(Self {
            id,
            kind,
            address,
            owner,
            peer: Mutex::new(peer),
            principal,
            registration,
            session: Mutex::new((client, agent)),
            channel,
            last_seen: Mutex::new(Instant::now()),
            online: AtomicBool::new(true),
            pump: Mutex::new(None),
            refusals: Mutex::new((Instant::now(), 0)),
            inbound: Mutex::new(std::collections::HashMap::new()),
        })
    }

    /// Its MAP session now.
    pub fn client(&self) -> Client {
        lock(&self.session).0.clone()
    }

    /// A new session and agent (the old agent reclaimed by it).
    pub fn replace_session(&self, client: Client, agent: AgentHandle) {
        *lock(&self.session) = (client, agent);
    }

    /// The task that delivers its MAP inbox (`pump.rs`); aborted when the node goes.
    pub fn set_pump(&self, pump: JoinHandle<()>) {
        *lock(&self.pump) = Some(pump);
    }

    /// Stops its pump.
    pub fn abort_pump(&self) {
        if let Some(pump) = lock(&self.pump).take() {
            pump.abort();
        }
    }

    /// A sign of life now; whether it was offline before.
    pub fn refresh(&self) -> bool {
        *lock(&self.last_seen) = Instant::now();
        !self.online.swap(true, Ordering::Relaxed)
    }

    /// Whether one more refusal may be sent from it now: at most [`REFUSALS_PER_SECOND`] in
    /// any one-second window (the rest are dropped unanswered, and still never delivered).
    pub fn may_refuse(&self) -> bool {
        let mut r = lock(&self.refusals);
        if r.0.elapsed() >= Duration::from_secs(1) {
            *r = (Instant::now(), 0);
        }
        r.1 += 1;
        r.1 <= REFUSALS_PER_SECOND
    }

    /// Marks it offline.
    pub fn set_offline(&self) {
        self.online.store(false, Ordering::Relaxed);
    }

    /// The info as `Peer`.
    pub fn peer(&self) -> Peer {
        lock(&self.peer).clone()
    }

    /// Whether it is online (always, under the eviction rule).
    pub fn is_online(&self) -> bool {
        self.online.load(Ordering::Relaxed)
    }

    /// How long since its last sign of life.
    pub fn silent_for(&self) -> Duration {
        lock(&self.last_seen).elapsed()
    }
}
