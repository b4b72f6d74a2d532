//! The router's links to its peer systems (`[[federation.peer]]` with an `endpoint`,
//! docs/federation.md): for each, one task that dials the peer's MAP endpoint as a `gateway`
//! participant with this router's credentials for it, proves which system it speaks for
//! (`map/federation/connect`), and routes there, in order, what waits for that peer in the
//! router (`router::federation::outbound`), which it takes and settles over an in-process
//! session of the router's service principal (`map/federation/outbound/next` and `.../ack`).
//!
//! Owns [`PeerLinks`]: each link's state and counters, for `/metrics`.
//!
//! Failure handling:
//! - the peer unreachable, the link lost, or an answer not in time: the link is dialled again
//!   with backoff (250 ms doubling to 10 s, with jitter), and what it had taken and not settled
//!   is taken again from the oldest (`restart`), so nothing is lost and order is kept; a route
//!   sent again after a lost answer is recognised by the peer (its id) and not delivered twice;
//! - the peer refuses a route for now (`5000` unavailable or an agent away, `4001` rate,
//!   `4000` not durable): the same message is tried again after a pause, for at most
//!   [`RETRY_FOR`], then settled as refused;
//! - any other refusal (`5010` loop, `5011` hops, `5003`, `2001` no such agent...): settled as
//!   refused at once, so its sender sees the peer's code and reason (`message_failed`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::watch;

use crate::client::{Client, ClientError, ClientOptions, ConnectionState, ReconnectPolicy};
use crate::protocol::capabilities::ParticipantType;
use crate::protocol::methods::federation::{
    FederationRouteParams, OutboundNextResult, RouteRefusal,
};
use crate::transport::in_process::InProcessLinks;

/// How long a message the peer refuses for now is tried again before it is settled as refused.
pub const RETRY_FOR: Duration = Duration::from_secs(60);

/// How long one call to the peer may take (a route passing through the peer waits there for the
/// next system's answer, up to its `forward_wait`).
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// How often the link lists the peer's agents again (`map/federation/agents`).
const DIRECTORY_EVERY: Duration = Duration::from_secs(30);

/// Most agents listed from a peer (the router keeps as many).
const MAX_LISTED: usize = 1000;

/// How long `outbound/next` waits for a message before it is asked again.
const NEXT_WAIT_MS: u64 = 10_000;

/// One peer link's settings.
#[derive(Debug, Clone)]
pub struct PeerLink {
    /// The peer system.
    pub system: String,
    /// Its MAP endpoint (`ws://` or `wss://`).
    pub endpoint: String,
    /// This system's id.
    pub me: String,
    /// The endpoint this system announces.
    pub announce: String,
    /// `("api-key" | "bearer", secret)`, read from the environment at start.
    pub credential: Option<(&'static str, String)>,
}

/// A link's state and counters.
#[derive(Debug, Default)]
pub struct LinkStats {
    up: std::sync::atomic::AtomicBool,
    dials: AtomicU64,
    failures: AtomicU64,
    routed: AtomicU64,
    refused: AtomicU64,
    retried: AtomicU64,
}

/// A `/metrics` series of the links: name, type, help, and how to read it from a link.
type Series = (
    &'static str,
    &'static str,
    &'static str,
    fn(&LinkStats) -> u64,
);

/// Every link's state, by peer system.
#[derive(Debug, Default, Clone)]
pub struct PeerLinks(Arc<BTreeMap<String, Arc<LinkStats>>>);

impl PeerLinks {
    /// The links for `peers`.
    pub fn new(peers: &[PeerLink]) -> Self {
        Self(Arc::new(
            peers
                .iter()
                .map(|p| (p.system.clone(), Arc::default()))
                .collect(),
        ))
    }

    fn of(&self, system: &str) -> Arc<LinkStats> {
        self.0.get(system).cloned().unwrap_or_default()
    }

    /// The links' series for `/metrics` (docs/metrics.md).
    pub fn render(&self) -> String {
        use std::fmt::Write;
        if self.0.is_empty() {
            return String::new();
        }
        let mut out = String::new();
        let series: [Series; 6] = [
            (
                "map_federation_link_up",
                "gauge",
                "1 while the link to the peer system is up",
                |s| u64::from(s.up.load(Ordering::Relaxed)),
            ),
            (
                "map_federation_dials_total",
                "counter",
                "Links to the peer opened",
                |s| s.dials.load(Ordering::Relaxed),
            ),
            (
                "map_federation_link_failures_total",
                "counter",
                "Dials that failed and links lost",
                |s| s.failures.load(Ordering::Relaxed),
            ),
            (
                "map_federation_routed_total",
                "counter",
                "Messages the peer took",
                |s| s.routed.load(Ordering::Relaxed),
            ),
            (
                "map_federation_refused_total",
                "counter",
                "Messages the peer refused (reported to their senders)",
                |s| s.refused.load(Ordering::Relaxed),
            ),
            (
                "map_federation_retries_total",
                "counter",
                "Routes tried again after the peer refused them for now",
                |s| s.retried.load(Ordering::Relaxed),
            ),
        ];
        for (name, kind, help, value) in series {
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} {kind}");
            for (peer, s) in self.0.iter() {
                let _ = writeln!(out, "{name}{{peer=\"{peer}\"}} {}", value(s));
            }
        }
        out
    }
}

/// Runs the link to `peer` until `shutdown`.
pub async fn run<L: InProcessLinks + ?Sized + Send + Sync + 'static>(
    links: Arc<L>,
    peer: PeerLink,
    stats: PeerLinks,
    mut shutdown: watch::Receiver<bool>,
) {
    let stats = stats.of(&peer.system);
    let mut backoff = Duration::from_millis(250);
    let mut local: Option<Client> = None;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let mut linked = false;
        let outcome = async {
            if local.is_none() {
                local = Some(
                    open_local(
                        &*links,
                        format!("federation-link-{}", peer.system),
                        format!("federation link to {}", peer.system),
                        Duration::from_millis(NEXT_WAIT_MS) + CALL_TIMEOUT,
                    )
                    .await?,
                );
            }
            let (remote, _) = dial(&peer).await?;
            linked = true;
            stats.dials.fetch_add(1, Ordering::Relaxed);
            stats.up.store(true, Ordering::Relaxed);
            tracing::info!(peer = %peer.system, endpoint = %peer.endpoint, "federation link up");
            let directory =
                tokio::spawn(directory(Arc::clone(&links), remote.clone(), peer.clone()));
            let pumped = pump(local.as_ref().expect("opened"), &remote, &peer, &stats).await;
            directory.abort();
            stats.up.store(false, Ordering::Relaxed);
            let _ = remote.close().await;
            pumped
        };
        let result = tokio::select! {
            r = outcome => r,
            _ = shutdown.changed() => return,
        };
        let Err(e) = result else { continue };
        stats.failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(peer = %peer.system, error = %e, "federation link down; dialling again");
        if matches!(e, LinkError::Local(_)) {
            local = None;
        }
        // A link that was up starts the backoff again: it is a new outage.
        if linked {
            backoff = Duration::from_millis(250);
        }
        let jitter = Duration::from_millis(crate::protocol::ids::random_u128() as u64 % 100);
        tokio::select! {
            _ = tokio::time::sleep(backoff + jitter) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

/// Why a link ended.
#[derive(Debug)]
enum LinkError {
    /// The in-process session to this router.
    Local(ClientError),
    /// The peer.
    Remote(String),
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local(e) => write!(f, "the router's own session: {e}"),
            Self::Remote(e) => write!(f, "{e}"),
        }
    }
}

/// A `system` session of the router's service principal on this router, over an in-process
/// link: what takes and settles a peer's messages, and what records its agents.
async fn open_local<L: InProcessLinks + ?Sized>(
    links: &L,
    participant: String,
    name: String,
    request_timeout: Duration,
) -> Result<Client, LinkError> {
    let options = ClientOptions::new()
        .participant_type(ParticipantType::System)
        .participant_id(participant)
        .name(name)
        .request_timeout(request_timeout);
    Client::in_process_as(links, crate::auth::service_principal(), options)
        .await
        .map_err(LinkError::Local)
}

/// Tests the link to `peer` as the router opens it (`map-router peers`): dials, authenticates
/// and links, then closes. Returns the peer's `map/federation/connect` answer.
///
/// # Errors
/// Why the link cannot be opened.
pub async fn probe(peer: &PeerLink) -> Result<serde_json::Value, String> {
    let (remote, answer) = dial(peer).await.map_err(|e| e.to_string())?;
    let _ = remote.close().await;
    Ok(answer)
}

/// Opens the link: `map/connect` as a gateway with this router's credential, then
/// `map/federation/connect`, which must answer `connected: true`.
async fn dial(peer: &PeerLink) -> Result<(Client, serde_json::Value), LinkError> {
    let mut options = ClientOptions::new()
        .participant_type(ParticipantType::Gateway)
        .name(format!("federation link from {}", peer.me))
        .request_timeout(CALL_TIMEOUT)
        .connect_timeout(Duration::from_secs(5))
        .reconnect(ReconnectPolicy::disabled());
    match &peer.credential {
        Some(("bearer", t)) => options = options.bearer_token(t.clone()),
        Some((_, k)) => options = options.api_key(k.clone()),
        None => {}
    }
    let remote = Client::connect_ws(&peer.endpoint, options)
        .await
        .map_err(|e| LinkError::Remote(format!("dialling {}: {e}", peer.endpoint)))?;
    let answer = remote
        .call_raw(
            "map/federation/connect",
            json!({"systemId": peer.me, "endpoint": peer.announce}),
        )
        .await
        .map_err(|e| LinkError::Remote(format!("map/federation/connect: {e}")))?;
    if answer.get("connected") != Some(&json!(true)) {
        let _ = remote.close().await;
        return Err(LinkError::Remote(format!(
            "{} did not take the link as {} (check its [[federation.peer]] principal and our credential): {answer}",
            peer.system, peer.me
        )));
    }
    Ok((remote, answer))
}

/// Keeps the router's view of the peer's agents (`map/federation/agents`) while the link is
/// up: listed at once, again soon after the peer reports an agent registered, unregistered or
/// changing state (when it lets our principal observe them), and every [`DIRECTORY_EVERY`].
/// Its own in-process session: the link's is busy waiting for messages.
async fn directory<L: InProcessLinks + ?Sized + Send + Sync + 'static>(
    links: Arc<L>,
    remote: Client,
    peer: PeerLink,
) {
    use futures::StreamExt;
    let Ok(local) = open_local(
        &*links,
        format!("federation-directory-{}", peer.system),
        format!("federation directory of {}", peer.system),
        CALL_TIMEOUT,
    )
    .await
    else {
        return;
    };
    let filter = crate::protocol::event::SubscriptionFilter {
        event_types: Some(
            [
                "agent_registered",
                "agent_unregistered",
                "agent_state_changed",
            ]
            .map(str::to_owned)
            .to_vec(),
        ),
        ..Default::default()
    };
    let mut changes = match remote.subscribe(filter).await {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::info!(peer = %peer.system, error = %e, "the peer's agent events are not shown to this system; listing its agents every 30 s");
            None
        }
    };
    loop {
        if list_agents(&local, &remote, &peer).await.is_err() {
            let _ = local.close().await;
            return;
        }
        let changed = async {
            match changes.as_mut() {
                Some(c) => c.next().await.is_some(),
                None => std::future::pending().await,
            }
        };
        match tokio::time::timeout(DIRECTORY_EVERY, changed).await {
            // Several changes at once (a tree registering) are listed once.
            Ok(true) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Some(c) = changes.as_mut() {
                    while let Some(Some(_)) = futures::FutureExt::now_or_never(c.next()) {}
                }
            }
            Ok(false) => changes = None,
            Err(_) => {}
        }
    }
}

/// Tells the router which agents the peer shows this system (`map/agents/list` on the link:
/// what the peer lets our principal see), for `map/federation/agents`. A peer that refuses
/// the listing shows none; only the router's own session failing ends the link.
async fn list_agents(local: &Client, remote: &Client, peer: &PeerLink) -> Result<(), LinkError> {
    let agents: Vec<serde_json::Value> = match remote
        .call_raw("map/agents/list", json!({"limit": MAX_LISTED}))
        .await
    {
        Ok(r) => r["agents"].as_array().cloned().unwrap_or_default(),
        Err(ClientError::Rpc { code, message, .. }) => {
            tracing::warn!(peer = %peer.system, code = code.0, %message, "the peer does not list its agents to this system");
            Vec::new()
        }
        Err(e) => return Err(LinkError::Remote(format!("map/agents/list: {e}"))),
    };
    let text = |a: &serde_json::Value, k: &str| a[k].as_str().map(str::to_owned);
    let agents: Vec<serde_json::Value> = agents
        .iter()
        .filter_map(|a| {
            Some(json!({
                "id": text(a, "id")?,
                "name": text(a, "name"),
                "role": text(a, "role"),
                "description": text(a, "description"),
                "state": text(a, "state"),
            }))
        })
        .collect();
    local
        .call_raw(
            "map/federation/outbound/agents",
            json!({"systemId": peer.system, "agents": agents}),
        )
        .await
        .map_err(LinkError::Local)?;
    Ok(())
}

/// Resolves once `remote` is no longer connected.
async fn gone(remote: &Client) {
    let mut state = remote.state_changes();
    loop {
        if !matches!(*state.borrow_and_update(), ConnectionState::Connected) {
            return;
        }
        if state.changed().await.is_err() {
            return;
        }
    }
}

/// Whether a refusal is for now: the same route may succeed later.
fn for_now(code: i32) -> bool {
    matches!(code, 5000 | 4000 | 4001)
}

/// Routes what waits for the peer until the link fails.
async fn pump(
    local: &Client,
    remote: &Client,
    peer: &PeerLink,
    stats: &LinkStats,
) -> Result<(), LinkError> {
    let mut restart = true;
    loop {
        // NB: as text, never `serde_json::Value`: the envelope's payload passes byte for byte.
        let next = local.call_text(
            "map/federation/outbound/next",
            json!({"systemId": peer.system, "restart": restart, "waitMs": NEXT_WAIT_MS})
                .to_string(),
        );
        // While nothing waits, the peer going away is noticed by its socket, not by a route:
        // what this call takes meanwhile is taken again by the next link (`restart`).
        let next = tokio::select! {
            next = next => next.map_err(LinkError::Local)?,
            () = gone(remote) => {
                return Err(LinkError::Remote("the peer closed the link".into()));
            }
        };
        restart = false;
        let next: OutboundNextResult = serde_json::from_str(&next)
            .map_err(|e| LinkError::Local(ClientError::Decode(e.to_string())))?;
        let mut answers = Vec::with_capacity(next.items.len());
        for item in next.items {
            let meta = item.traceparent.as_ref().map(|tp| {
                crate::protocol::trace::TraceContext {
                    traceparent: tp.as_str().into(),
                    tracestate: item.tracestate.as_deref().map(Into::into),
                }
                .to_meta_json()
            });
            let params = serde_json::to_string(&FederationRouteParams {
                system_id: item.envelope.federation.target_system.clone(),
                envelope: Some(item.envelope),
                message: None,
                meta: meta.and_then(|m| crate::protocol::json::RawJson::from_text(m).ok()),
            })
            .map_err(|e| LinkError::Local(ClientError::Decode(e.to_string())))?;
            let started = Instant::now();
            let error = loop {
                match remote
                    .call_text("map/federation/route", params.clone())
                    .await
                {
                    Ok(_) => break None,
                    Err(ClientError::Rpc { code, message, .. })
                        if for_now(code.0) && started.elapsed() < RETRY_FOR =>
                    {
                        stats.retried.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(peer = %peer.system, code = code.0, %message, "route refused for now; trying again");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(ClientError::Rpc { code, message, .. }) => {
                        break Some(RouteRefusal {
                            code: code.0,
                            message,
                        })
                    }
                    Err(e) => {
                        // What the peer answered so far is settled; the rest is taken again.
                        settle(local, peer, &mut answers).await?;
                        return Err(LinkError::Remote(format!("map/federation/route: {e}")));
                    }
                }
            };
            match &error {
                None => stats.routed.fetch_add(1, Ordering::Relaxed),
                Some(_) => stats.refused.fetch_add(1, Ordering::Relaxed),
            };
            answers.push(json!({"messageId": item.message_id, "error": error}));
        }
        // One call (one commit here) settles the batch.
        settle(local, peer, &mut answers).await?;
    }
}

/// `map/federation/outbound/ack` with `answers`, emptied.
async fn settle(
    local: &Client,
    peer: &PeerLink,
    answers: &mut Vec<serde_json::Value>,
) -> Result<(), LinkError> {
    if answers.is_empty() {
        return Ok(());
    }
    let acks = std::mem::take(answers);
    local
        .call_raw(
            "map/federation/outbound/ack",
            json!({"systemId": peer.system, "acks": acks}),
        )
        .await
        .map_err(LinkError::Local)?;
    Ok(())
}
