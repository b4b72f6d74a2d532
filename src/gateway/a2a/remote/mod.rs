//! Remote A2A agents as MAP agents: the gateway's client side.
//!
//! Owns [`Remotes`], the table of remote agents registered by card URL (from `[[a2a.remote]]`
//! at start, or `POST /a2a/remote` at run time), and each one's MAP session. A remote agent is
//! an ordinary MAP agent, registered by an in-process session of its own (participant
//! `a2a-remote-<agentId>`), so that what it sends comes `from` its agent id and it leaves MAP
//! when unregistered (its session closes). Each `map/send` to it becomes one A2A call
//! (`call.rs`); calls run concurrently, at most [`MAX_CALLS`] per agent.
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

use crate::client::{Client, ClientOptions};
use crate::protocol::agent::Agent;
use crate::protocol::json::RawJson;
use crate::protocol::methods::agents::RegisterParams;
use crate::transport::in_process::InProcessLinks;

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
    /// The card could not be fetched or read.
    #[error("the card at {url} is unusable: {why}")]
    Card {
        /// The card URL.
        url: String,
        /// Why.
        why: String,
    },
    /// The agent id is taken.
    #[error("agent id {0:?} is taken")]
    Taken(String),
    /// MAP refused the session or the registration.
    #[error("MAP refused the agent: {0}")]
    Map(String),
}

/// The remote agents.
pub struct Remotes {
    links: Arc<dyn InProcessLinks + Send + Sync>,
    table: Mutex<HashMap<String, Arc<Remote>>>,
}

impl std::fmt::Debug for Remotes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remotes").finish_non_exhaustive()
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
    /// An empty table; sessions open through `links`.
    pub fn new(links: Arc<dyn InProcessLinks + Send + Sync>) -> Arc<Self> {
        Arc::new(Self {
            links,
            table: Mutex::new(HashMap::new()),
        })
    }

    /// The registered remote agents.
    pub fn list(&self) -> Vec<Arc<Remote>> {
        let mut all: Vec<_> = self.lock().values().cloned().collect();
        all.sort_by(|a, b| a.agent_id.cmp(&b.agent_id));
        all
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Remote>>> {
        // A panic while holding this lock leaves a consistent map (inserts and removes only).
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fetches the card, opens the agent's MAP session, registers the agent and starts serving
    /// its messages.
    ///
    /// # Errors
    /// [`RegisterError`]: an unusable URL or card, a taken id, MAP's refusal.
    pub async fn register(&self, spec: RemoteSpec) -> Result<(Arc<Remote>, Agent), RegisterError> {
        let card_target = http::Target::parse(&spec.card_url)
            .map_err(|e| RegisterError::Invalid(e.to_string()))?;
        let card_err = |why: String| RegisterError::Card {
            url: spec.card_url.clone(),
            why,
        };
        let mut headers = Vec::new();
        if let Some(t) = &spec.token {
            headers.push(("authorization", format!("Bearer {t}")));
        }
        let text = http::get_json(&card_target, &headers)
            .await
            .map_err(|e| card_err(e.to_string()))?;
        let card = card::parse(&text).map_err(card_err)?;
        let endpoint = card_target
            .join(&card.endpoint)
            .map_err(|e| card_err(format!("its endpoint: {e}")))?;
        let agent_id = spec
            .name
            .clone()
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| agent_id_for(&card.name));
        if self.lock().contains_key(&agent_id) {
            return Err(RegisterError::Taken(agent_id));
        }
        let client = Client::in_process(
            &*self.links,
            ClientOptions::agent()
                .name(agent_id.clone())
                .participant_id(format!("a2a-remote-{agent_id}")),
        )
        .await
        .map_err(|e| RegisterError::Map(e.to_string()))?;
        let metadata = json!({ "a2a": {
            "cardUrl": spec.card_url,
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
                    Some(3000) => RegisterError::Taken(agent_id),
                    // A name MAP does not take as an agent id.
                    Some(-32602) => RegisterError::Invalid(format!("agent id {agent_id:?}: {e}")),
                    _ => RegisterError::Map(e.to_string()),
                });
            }
        };
        let agent = handle.agent().clone();
        let messages = handle.messages();
        let remote = Arc::new(Remote {
            agent_id: agent_id.clone(),
            spec,
            card,
            endpoint,
            client,
            agent: Mutex::new(Some(handle)),
            in_flight: Mutex::new(HashMap::new()),
        });
        let inserted = {
            let mut table = self.lock();
            let free = !table.contains_key(&agent_id);
            if free {
                table.insert(agent_id.clone(), Arc::clone(&remote));
            }
            free
        };
        if !inserted {
            let _ = remote.client.close().await;
            return Err(RegisterError::Taken(agent_id));
        }
        tokio::spawn(serve(Arc::clone(&remote), messages));
        tracing::info!(agent = %agent_id, card = %remote.spec.card_url, version = version_name(remote.card.version), "a2a remote agent registered");
        Ok((remote, agent))
    }

    /// Unregisters a remote agent and closes its session; `false` when there is none.
    pub async fn unregister(&self, agent_id: &str) -> bool {
        let Some(remote) = self.lock().remove(agent_id) else {
            return false;
        };
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
                    match me.register(spec.clone()).await {
                        Ok((remote, _)) => {
                            tracing::info!(agent = %remote.agent_id, "configured a2a remote agent ready");
                            return;
                        }
                        Err(e @ (RegisterError::Invalid(_) | RegisterError::Taken(_))) => {
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

/// Serves the agent's messages until its stream ends.
async fn serve(remote: Arc<Remote>, mut messages: crate::client::Messages) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CALLS));
    while let Some(message) = messages.next().await {
        // NB: taking the permit before spawning makes a flood wait in the bounded inbox.
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            break;
        };
        let remote = Arc::clone(&remote);
        tokio::spawn(async move {
            let client = remote.client.clone();
            call::serve(&remote, &client, message).await;
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
