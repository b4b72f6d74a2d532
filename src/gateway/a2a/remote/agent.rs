//! [`Remote`]: one remote A2A agent as the gateway knows it (how it was registered and by whom,
//! its card, its endpoint, its MAP session and agent, its calls in flight and its poll budget),
//! and [`RemoteSpec`], how to register one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;

use crate::client::{AgentHandle, Client};
use crate::gateway::a2a::record::Owner;
use crate::gateway::a2a::remote::card::RemoteCard;
use crate::gateway::a2a::remote::http;
use crate::gateway::a2a::wire::Version;

/// The least time between two polls (`GetTask`) of one remote agent, whatever the number of its
/// calls waiting: a remote that leaves many tasks `working` is asked at most this often.
pub const POLL_SPACING: Duration = Duration::from_millis(500);

/// A remote agent to register: `[[a2a.remote]]`, or the body of `POST /a2a/remote`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteSpec {
    /// The card's URL (`http://host:port/.well-known/agent-card.json`, or a v0.3
    /// `.../agent.json`).
    #[serde(alias = "cardUrl")]
    pub card_url: String,
    /// The MAP agent id (default: the card's name, lower-cased, with `-` for anything but
    /// letters, digits, `-` and `_`).
    #[serde(default)]
    pub name: Option<String>,
    /// A bearer token sent to the remote agent (`Authorization: Bearer <token>`).
    #[serde(default)]
    pub token: Option<String>,
}

/// One remote agent.
#[derive(Debug)]
pub struct Remote {
    /// Its MAP agent id.
    pub agent_id: String,
    /// How it was registered (its card URL normalised).
    pub spec: RemoteSpec,
    /// What its card says.
    pub card: RemoteCard,
    /// Its JSON-RPC endpoint.
    pub endpoint: http::Target,
    /// Who registered it (`None`: the configuration, or a caller with authentication off).
    pub owner: Option<Owner>,
    /// Whether it comes from `[[a2a.remote]]`.
    pub configured: bool,
    /// Its MAP session.
    pub(super) client: Client,
    /// Its MAP agent, until unregistered.
    pub(super) agent: Mutex<Option<AgentHandle>>,
    /// The remote task of each call in flight, by the request's correlation id: what a cancel
    /// notice names (a std mutex, never held across an await).
    pub(super) in_flight: Mutex<HashMap<String, String>>,
    /// `true` once unregistered: every call in flight ends, nothing is polled or posted again.
    closed: watch::Sender<bool>,
    /// When the next poll of this remote may go out ([`POLL_SPACING`] apart).
    next_poll: Mutex<Instant>,
}

impl Remote {
    /// A remote registered by `owner` (or the configuration), serving through `client` and
    /// `agent`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        agent_id: String,
        spec: RemoteSpec,
        card: RemoteCard,
        endpoint: http::Target,
        client: Client,
        agent: AgentHandle,
        owner: Option<Owner>,
        configured: bool,
    ) -> Self {
        Self {
            agent_id,
            spec,
            card,
            endpoint,
            owner,
            configured,
            client,
            agent: Mutex::new(Some(agent)),
            in_flight: Mutex::new(HashMap::new()),
            closed: watch::Sender::new(false),
            next_poll: Mutex::new(Instant::now()),
        }
    }

    /// Ends its calls: unregistered.
    pub(super) fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Whether it was unregistered (a watch that turns `true`).
    pub(super) fn closed(&self) -> watch::Receiver<bool> {
        self.closed.subscribe()
    }

    /// Waits for this remote's next poll slot: polls of all its calls together go out at most
    /// one per [`POLL_SPACING`].
    pub(super) async fn poll_slot(&self) {
        let at = {
            let mut next = self.next_poll.lock().unwrap_or_else(|p| p.into_inner());
            let at = (*next).max(Instant::now());
            *next = at + POLL_SPACING;
            at
        };
        tokio::time::sleep_until(at.into()).await;
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        // Inserts and removes only: a panic cannot leave it inconsistent.
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes that the call answering `correlation` works on remote task `task`.
    pub fn track(&self, correlation: &str, task: &str) {
        self.table().insert(correlation.to_owned(), task.to_owned());
    }

    /// The call answering `correlation` is over.
    pub fn untrack(&self, correlation: &str) {
        self.table().remove(correlation);
    }

    /// The remote task of the call answering `correlation`, if in flight.
    pub fn tracked(&self, correlation: &str) -> Option<String> {
        self.table().get(correlation).cloned()
    }

    /// What `GET /a2a/remote` shows of it.
    pub fn describe(&self) -> serde_json::Value {
        let mut d = json!({
            "agentId": self.agent_id,
            "cardUrl": self.spec.card_url,
            "name": self.card.name,
            "url": self.endpoint.url(),
            "protocolVersion": version_name(self.card.version),
            "streaming": self.card.streaming,
        });
        if let Some(o) = &self.owner {
            d["owner"] = json!(o);
        }
        if self.configured {
            d["configured"] = json!(true);
        }
        d
    }
}

/// `1.0` or `0.3`.
pub fn version_name(v: Version) -> &'static str {
    match v {
        Version::V1 => "1.0",
        Version::V03 => "0.3",
    }
}
