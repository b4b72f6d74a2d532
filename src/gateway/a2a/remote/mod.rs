//! Remote A2A agents as MAP agents: the gateway's client side.
//!
//! Owns [`Remotes`], the table of remote agents registered by card URL (from `[[a2a.remote]]`
//! at start, or `POST /a2a/remote` at run time), and each one's MAP session. A remote agent is
//! an ordinary MAP agent, registered by an in-process session of its own (participant
//! `a2a-remote-<agentId>`), so that what it sends comes `from` its agent id and it leaves MAP
//! when unregistered (its session closes). Each `map/send` to it becomes one A2A call
//! (`call.rs`); calls run concurrently, at most [`MAX_CALLS`] per agent, and all end when it
//! is unregistered.
//!
//! Who may do what ([`Asker`]): a remote registered by request belongs to the principal that
//! registered it (its MAP session is opened as that principal); only it or a system principal
//! lists and unregisters it (to anyone else it does not exist: 404), a principal holds at most
//! `[a2a] max_remotes_per_principal`, and the router [`MAX_REMOTES`] by request. With
//! authentication off everyone is anyone, as over MAP. A configured remote is the operator's
//! (the service principal's session; only a system principal unregisters it).
//!
//! Where a remote may be (`egress.rs`): registering by request needs `[a2a] remote_allow`, which
//! the card URL and the endpoint the card names must both pass, and the endpoint's addresses are
//! judged at once; a configured remote's own card origin is allowed.
//!
//! Rooms: `agent.rs` (one remote agent), `http.rs` (the HTTP client), `card.rs` (reading a remote card), `event.rs` (reading
//! remote answers in either version), `call.rs` (one call, both translations).
//!
//! The router core learns nothing here: registering is the gateway's own HTTP route with the
//! gateway's authentication, and the MAP side uses the ordinary methods (`map/agents/register`,
//! `map/send`, `map/tasks/create|update`).

pub mod agent;
pub mod call;
pub mod card;
pub mod event;
pub mod http;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use serde_json::json;

use crate::client::ClientOptions;
use crate::gateway::a2a::limits::MAX_REMOTES;
use crate::gateway::a2a::record::Owner;
use crate::gateway::callers::CallerSessions;
use crate::gateway::egress::AllowList;
use crate::protocol::agent::Agent;
use crate::protocol::json::RawJson;
use crate::protocol::methods::agents::RegisterParams;
use crate::protocol::methods::session::Principal;

use self::agent::version_name;
pub use self::agent::{Remote, RemoteSpec};

/// Most calls one remote agent serves at once; further messages wait in its MAP inbox (which is
/// bounded, and reports drops).
pub const MAX_CALLS: usize = 16;

/// The MAP role of a remote agent (its card has none).
pub const ROLE: &str = "a2a-remote";

/// Why a registration failed.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The spec is unusable.
    #[error("{0}")]
    Invalid(String),
    /// The card URL, or the endpoint the card names, is not one this router calls.
    #[error("{0}")]
    NotAllowed(String),
    /// The card could not be fetched: no connection or no answer (one text for every cause).
    #[error("the card at {0} cannot be fetched: remote unreachable")]
    Unreachable(String),
    /// The card was fetched but is unusable.
    #[error("the card at {url} is unusable: {why}")]
    Card {
        /// The card URL.
        url: String,
        /// Why, in our words.
        why: String,
    },
    /// The agent id is taken.
    #[error("agent id {0:?} is taken")]
    Taken(String),
    /// The caller holds as many remotes as it may, or the router does.
    #[error("{0}")]
    Quota(String),
    /// MAP refused the session or the registration.
    #[error("MAP refused the agent: {0}")]
    Map(String),
}

/// Who registers, lists or unregisters a remote agent.
#[derive(Debug, Clone)]
pub enum Asker {
    /// Authentication is off: nobody is anybody, everyone may do everything (as over MAP).
    Anyone,
    /// An authenticated principal; `system`: listed in `auth.system_principals`.
    Principal {
        /// The principal.
        principal: Principal,
        /// Whether it is a system principal.
        system: bool,
    },
    /// The operator's configuration (`[[a2a.remote]]`), registered at start.
    Configured,
}

impl Asker {
    fn owner(&self) -> Option<Owner> {
        match self {
            Self::Principal { principal, .. } => Some(Owner::of(principal)),
            _ => None,
        }
    }

    /// Whether it may see and unregister `remote`: its owner, a system principal, anyone with
    /// authentication off.
    fn manages(&self, remote: &Remote) -> bool {
        match self {
            Self::Anyone | Self::Configured => true,
            Self::Principal { system: true, .. } => true,
            Self::Principal { principal, .. } => {
                remote.owner.as_ref().is_some_and(|o| o.is(principal))
            }
        }
    }
}

/// The remote agents.
pub struct Remotes {
    /// Where each remote agent's MAP session is opened (as its registrant).
    sessions: Arc<CallerSessions>,
    table: Mutex<HashMap<String, Arc<Remote>>>,
    /// `[a2a] remote_allow`: where remotes registered by request may be.
    allow: AllowList,
    /// Remotes one principal may register by request.
    per_principal: usize,
}

impl std::fmt::Debug for Remotes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remotes")
            .field("allow", &self.allow)
            .field("per_principal", &self.per_principal)
            .finish_non_exhaustive()
    }
}

/// The default agent id for a card name.
pub fn agent_id_for(name: &str) -> String {
    let id: String = name
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let id = id.trim_matches('-').to_owned();
    if id.is_empty() {
        "a2a-agent".into()
    } else {
        id.chars().take(64).collect()
    }
}

impl Remotes {
    /// An empty table; sessions open through `sessions` (the gateway layer's one opener);
    /// remotes registered by request must be under `allow`, at most `per_principal` per
    /// principal.
    pub fn new(sessions: Arc<CallerSessions>, allow: AllowList, per_principal: usize) -> Arc<Self> {
        Arc::new(Self {
            sessions,
            table: Mutex::new(HashMap::new()),
            allow,
            per_principal,
        })
    }

    /// The registered remote agents `asker` may see (all of them for a system principal, or with
    /// authentication off; else its own).
    pub fn list(&self, asker: &Asker) -> Vec<Arc<Remote>> {
        let mut all: Vec<_> = self
            .lock()
            .values()
            .filter(|r| asker.manages(r))
            .cloned()
            .collect();
        all.sort_by(|a, b| a.agent_id.cmp(&b.agent_id));
        all
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Remote>>> {
        // A panic while holding this lock leaves a consistent map (inserts and removes only).
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuses a registration by `asker` over its caps (before any fetch).
    fn check_caps(&self, asker: &Asker) -> Result<(), RegisterError> {
        if matches!(asker, Asker::Configured) {
            return Ok(());
        }
        let owner = asker.owner();
        let table = self.lock();
        let by_request = table.values().filter(|r| !r.configured);
        let (mut all, mut mine) = (0, 0);
        for r in by_request {
            all += 1;
            if r.owner == owner {
                mine += 1;
            }
        }
        if mine >= self.per_principal {
            return Err(RegisterError::Quota(format!(
                "Quota exceeded: remote agents per principal (limit {}); unregister one first",
                self.per_principal
            )));
        }
        if all >= MAX_REMOTES {
            return Err(RegisterError::Quota(format!(
                "Quota exceeded: remote agents on this router (limit {MAX_REMOTES})"
            )));
        }
        Ok(())
    }

    /// Checks the card URL and the endpoint its card names, fetches the card, opens the agent's
    /// MAP session (as `asker`'s principal; the service principal's for a configured remote),
    /// registers the agent and starts serving its messages.
    ///
    /// Where a remote may be: a remote registered by request, its card URL and its endpoint
    /// under `[a2a] remote_allow`; a configured one, its card URL's origin (scheme, host,
    /// port), or `remote_allow`.
    ///
    /// # Errors
    /// [`RegisterError`]: an unusable or unallowed URL, an unreachable or unusable card, a
    /// taken id, a cap, MAP's refusal.
    pub async fn register(
        &self,
        spec: RemoteSpec,
        asker: Asker,
    ) -> Result<(Arc<Remote>, Agent), RegisterError> {
        let configured = matches!(asker, Asker::Configured);
        let origin = if configured {
            AllowList::origin_of(&spec.card_url).map_err(RegisterError::Invalid)?
        } else {
            if self.allow.is_empty() {
                return Err(RegisterError::NotAllowed(
                    "registering remote agents by request is off on this router ([a2a] remote_allow is empty)"
                        .into(),
                ));
            }
            AllowList::default()
        };
        self.check_caps(&asker)?;
        let check = |url: url::Url| {
            http::Target::check_url(&origin, url.clone())
                .or_else(|_| http::Target::check_url(&self.allow, url))
        };
        let refused = |e: http::HttpError| match e {
            http::HttpError::NotAllowed(why) => RegisterError::NotAllowed(why),
            e => RegisterError::Invalid(e.to_string()),
        };
        let card_url = url::Url::parse(&spec.card_url)
            .map_err(|e| RegisterError::Invalid(format!("bad URL {:?}: {e}", spec.card_url)))?;
        let card_target = check(card_url).map_err(refused)?;
        let card_err = |why: String| RegisterError::Card {
            url: card_target.url(),
            why,
        };
        // The version the gateway prefers (a server that reads a header-less request as v0.3,
        // A2A 1.0 §3.6.2, would otherwise serve its v0.3 card).
        let mut headers = vec![("a2a-version", "1.0".to_owned())];
        if let Some(t) = &spec.token {
            headers.push(("authorization", format!("Bearer {t}")));
        }
        let text = http::get_card(&card_target, &headers)
            .await
            .map_err(|e| match e {
                http::HttpError::Unreachable { .. } => {
                    RegisterError::Unreachable(card_target.url())
                }
                http::HttpError::NotAllowed(why) => RegisterError::NotAllowed(why),
                http::HttpError::Timeout { .. } => card_err("it did not arrive in time".into()),
                http::HttpError::Protocol { why, .. } => card_err(why),
                e @ http::HttpError::Url { .. } => RegisterError::Invalid(e.to_string()),
            })?;
        let card = card::parse(&text).map_err(card_err)?;
        let endpoint_url = card_target
            .join(&card.endpoint)
            .map_err(|e| card_err(format!("its endpoint: {e}")))?;
        let endpoint_refused = |e: http::HttpError| match e {
            http::HttpError::NotAllowed(why) => {
                RegisterError::NotAllowed(format!("the endpoint the card names, {why}"))
            }
            e => card_err(format!("its endpoint: {e}")),
        };
        let endpoint = check(endpoint_url).map_err(endpoint_refused)?;
        // NB: its addresses now, so that a card naming an internal endpoint is refused at
        // once; every call judges them again as it connects.
        endpoint.check_addresses().await.map_err(endpoint_refused)?;
        let agent_id = spec
            .name
            .clone()
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| agent_id_for(&card.name));
        if self.lock().contains_key(&agent_id) {
            return Err(RegisterError::Taken(agent_id));
        }
        let options = ClientOptions::agent()
            .name(agent_id.clone())
            .participant_id(format!("a2a-remote-{agent_id}"));
        let opened = match &asker {
            Asker::Principal { principal, .. } => {
                self.sessions.open(Some(principal), options).await
            }
            Asker::Configured => self.sessions.open_service(options).await,
            Asker::Anyone => self.sessions.open(None, options).await,
        };
        let client = opened.map_err(|e| match e.code().map(|c| c.0) {
            Some(4001 | 4002) => RegisterError::Quota(e.to_string()),
            _ => RegisterError::Map(e.to_string()),
        })?;
        let metadata = json!({ "a2a": {
            "cardUrl": card_target.url(),
            "url": endpoint.url(),
            "protocolVersion": version_name(card.version),
            "streaming": card.streaming,
            "version": card.agent_version,
            "skills": crate::gateway::a2a::wire::raw(&card.skills),
        }});
        let registered = client
            .register(RegisterParams {
                agent_id: Some(agent_id.clone().into()),
                name: Some(card.name.clone()),
                description: card.description.clone(),
                role: Some(ROLE.into()),
                metadata: Some(
                    RawJson::from_text(crate::gateway::a2a::wire::Rendered::finish(&metadata))
                        .map_err(|e| RegisterError::Map(e.to_string()))?,
                ),
                ..RegisterParams::default()
            })
            .await;
        let handle = match registered {
            Ok(h) => h,
            Err(e) => {
                let _ = client.close().await;
                return Err(match e.code().map(|c| c.0) {
                    // Registered, or owned by another principal.
                    Some(3000 | 1003) => RegisterError::Taken(agent_id),
                    Some(4001 | 4002) => RegisterError::Quota(e.to_string()),
                    // A name MAP does not take as an agent id.
                    Some(-32602) => RegisterError::Invalid(format!("agent id {agent_id:?}: {e}")),
                    _ => RegisterError::Map(e.to_string()),
                });
            }
        };
        let agent = handle.agent().clone();
        let messages = handle.messages();
        let remote = Arc::new(Remote::new(
            agent_id.clone(),
            RemoteSpec {
                card_url: card_target.url(),
                ..spec
            },
            card,
            endpoint,
            client,
            handle,
            asker.owner(),
            configured,
        ));
        let inserted = {
            let mut table = self.lock();
            let free = !table.contains_key(&agent_id);
            if free {
                table.insert(agent_id.clone(), Arc::clone(&remote));
            }
            free
        };
        if !inserted {
            remote.close();
            let _ = remote.client.close().await;
            return Err(RegisterError::Taken(agent_id));
        }
        tokio::spawn(serve(Arc::clone(&remote), messages));
        tracing::info!(agent = %agent_id, card = %remote.spec.card_url, version = version_name(remote.card.version), "a2a remote agent registered");
        Ok((remote, agent))
    }

    /// Unregisters a remote agent `asker` manages, stops its calls (polls included) and closes
    /// its session; `false` when there is none it may see (another principal's is "none").
    pub async fn unregister(&self, agent_id: &str, asker: &Asker) -> bool {
        let remote = {
            let mut table = self.lock();
            match table.get(agent_id) {
                Some(r) if asker.manages(r) => table.remove(agent_id),
                _ => None,
            }
        };
        let Some(remote) = remote else {
            return false;
        };
        // NB: first, so that no call in flight polls or posts again.
        remote.close();
        let handle = remote
            .agent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(h) = handle {
            if let Err(e) = h.unregister().await {
                tracing::debug!(agent = agent_id, error = %e, "a2a remote: unregister");
            }
        }
        let _ = remote.client.close().await;
        true
    }

    /// Registers `specs` in the background, each retried a few times (the remote agent may
    /// start after the router); failures are logged with the reason.
    pub fn register_configured(self: &Arc<Self>, specs: Vec<RemoteSpec>) {
        for spec in specs {
            let me = Arc::clone(self);
            tokio::spawn(async move {
                let mut delay = std::time::Duration::from_millis(500);
                for attempt in 1..=CONFIGURED_ATTEMPTS {
                    match me.register(spec.clone(), Asker::Configured).await {
                        Ok((remote, _)) => {
                            tracing::info!(agent = %remote.agent_id, "configured a2a remote agent ready");
                            return;
                        }
                        Err(
                            e @ (RegisterError::Invalid(_)
                            | RegisterError::Taken(_)
                            | RegisterError::NotAllowed(_)),
                        ) => {
                            tracing::error!(card = %spec.card_url, error = %e, "configured a2a remote agent not registered");
                            return;
                        }
                        Err(e) if attempt == CONFIGURED_ATTEMPTS => {
                            tracing::error!(card = %spec.card_url, error = %e, attempts = attempt, "configured a2a remote agent not registered");
                        }
                        Err(e) => {
                            tracing::warn!(card = %spec.card_url, error = %e, attempt, "configured a2a remote agent not registered yet; retrying");
                            tokio::time::sleep(delay).await;
                            delay = (delay * 2).min(std::time::Duration::from_secs(30));
                        }
                    }
                }
            });
        }
    }
}

/// How often a configured remote agent is tried before giving up (about two minutes in all).
pub const CONFIGURED_ATTEMPTS: u32 = 8;

/// Serves the agent's messages until its stream ends or the remote is unregistered (which also
/// ends every call in flight: no poll or post after that).
async fn serve(remote: Arc<Remote>, mut messages: crate::client::Messages) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CALLS));
    let mut closed = remote.closed();
    loop {
        let message = tokio::select! {
            m = messages.next() => m,
            _ = closed.wait_for(|c| *c) => None,
        };
        let Some(message) = message else { break };
        // The context the call runs in: the router's span of this delivery, else the
        // message's own (`gateway::trace`).
        let trace = crate::gateway::trace::of_delivery(messages.delivered_trace(), &message);
        // NB: taking the permit before spawning makes a flood wait in the bounded inbox.
        let permit = tokio::select! {
            p = Arc::clone(&permits).acquire_owned() => p,
            _ = closed.wait_for(|c| *c) => break,
        };
        let Ok(permit) = permit else { break };
        let remote = Arc::clone(&remote);
        tokio::spawn(async move {
            let client = remote.client.clone();
            let mut closed = remote.closed();
            tokio::select! {
                () = call::serve(&remote, &client, message, trace) => {}
                _ = closed.wait_for(|c| *c) => {
                    tracing::debug!(agent = %remote.agent_id, "a2a remote: call ended by unregistering");
                }
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_from_names() {
        assert_eq!(agent_id_for("Echo Agent"), "echo-agent");
        assert_eq!(agent_id_for("  !!  "), "a2a-agent");
        assert_eq!(agent_id_for("a_b-C"), "a_b-c");
    }

    #[test]
    fn specs() {
        let s: RemoteSpec = serde_json::from_str(r#"{"cardUrl":"http://h/c","name":"x"}"#).unwrap();
        assert_eq!(s.card_url, "http://h/c");
        assert!(serde_json::from_str::<RemoteSpec>(r#"{"cardUrl":"u","bogus":1}"#).is_err());
    }
}
