//! The probes a load balancer or an orchestrator asks (docs/http.md, "Probes"): `GET /livez`,
//! `GET /readyz` and `GET /readyz?role=live` (or `?role=standby`). Owns nothing but the answers:
//! what a node is and whether it can serve is read, when asked, from the NATS state its caller
//! passes (`cluster::Probe` on a cluster node, read through a closure so that this file imports
//! nothing of `cluster.rs`).
//!
//! - `/livez`: 200 while the process answers HTTP at all (nothing else is checked: a liveness
//!   probe that fails on a NATS outage would restart every node at once).
//! - `/readyz`: 200 on every node that serves clients: a single node always; a cluster's live
//!   node and its standbys (which serve MAP, relaying what changes state) while their NATS
//!   connection is up and the log has not diverged; 503 otherwise (and on a standby whose
//!   follower router is not serving yet).
//! - `/readyz?role=live`: as `/readyz`, and 503 on a standby: 200 on the one node that writes
//!   the event log. `?role=standby` is the converse. Any other `role` is 400.
//!
//! `/health` keeps its meaning (`cluster::health`: 503 on a standby by design).

use axum::extract::RawQuery;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// What the probes need of a cluster node's NATS connection.
#[derive(Debug, Clone, Default)]
pub struct Nats {
    /// Whether the connection is up.
    pub connected: bool,
    /// Why the store stopped publishing, if it did.
    pub diverged: Option<String>,
}

/// What a node is, for the probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A single node, or the cluster node that writes the log.
    Live,
    /// A cluster standby: `serving` once its follower router answers clients.
    Standby {
        /// Whether its follower router serves clients.
        serving: bool,
    },
}

/// The probe routes of a node that is `role`, its NATS state read from `nats` (none: not a
/// cluster node).
pub fn routes<F>(role: Role, nats: Option<F>) -> axum::Router
where
    F: Fn() -> Nats + Clone + Send + Sync + 'static,
{
    axum::Router::new()
        .route("/livez", get(|| async { "alive\n" }))
        .route(
            "/readyz",
            get(move |RawQuery(query): RawQuery| {
                let nats = nats.clone();
                async move { ready(role, nats.map(|n| n()).as_ref(), query.as_deref()) }
            }),
        )
}

/// The `/readyz` answer of a node that is `role`, in NATS state `state` (none: not a cluster
/// node), asked with `query`.
fn ready(role: Role, state: Option<&Nats>, query: Option<&str>) -> Response {
    let wanted = match query
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "role")
        .map(|(_, v)| v)
    {
        None => None,
        Some("live") => Some(true),
        Some("standby") => Some(false),
        Some(other) => {
            return (
                StatusCode::BAD_REQUEST,
                format!(
                    "unknown role {:?}: `live` or `standby`\n",
                    other.chars().take(32).collect::<String>()
                ),
            )
                .into_response()
        }
    };
    let (live, serving) = match role {
        Role::Live => (true, true),
        Role::Standby { serving } => (false, serving),
    };
    let name = if live { "live" } else { "standby" };
    let unavailable = |why: &str| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(axum::http::header::RETRY_AFTER, "1")],
            format!("not ready: {why}\nrole: {name}\n"),
        )
            .into_response()
    };
    if let Some(state) = state {
        if let Some(why) = &state.diverged {
            return unavailable(&format!("the event log diverged: {why}"));
        }
        if !state.connected {
            return unavailable("NATS disconnected");
        }
    }
    if !serving {
        return unavailable("the follower router does not serve clients yet");
    }
    if wanted.is_some_and(|w| w != live) {
        return unavailable(&format!(
            "this node is not {}",
            if live { "a standby" } else { "live" }
        ));
    }
    (StatusCode::OK, format!("ready\nrole: {name}\n")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(role: Role, state: Option<&Nats>, q: Option<&str>) -> u16 {
        ready(role, state, q).status().as_u16()
    }

    #[test]
    fn the_table() {
        let up = Nats {
            connected: true,
            diverged: None,
        };
        let down = Nats::default();
        let serving = Role::Standby { serving: true };
        let starting = Role::Standby { serving: false };
        let live = Some("role=live");
        let standby = Some("role=standby");
        assert_eq!(status(Role::Live, None, None), 200, "single node");
        assert_eq!(status(Role::Live, None, live), 200);
        assert_eq!(status(Role::Live, None, standby), 503);
        assert_eq!(status(Role::Live, Some(&up), live), 200);
        assert_eq!(status(Role::Live, Some(&down), None), 503);
        assert_eq!(status(Role::Live, Some(&down), live), 503);
        assert_eq!(status(serving, Some(&up), None), 200);
        assert_eq!(status(serving, Some(&up), live), 503);
        assert_eq!(status(serving, Some(&up), standby), 200);
        assert_eq!(status(serving, Some(&down), None), 503);
        assert_eq!(status(starting, Some(&up), None), 503);
        assert_eq!(status(Role::Live, None, Some("role=leader")), 400);
        assert_eq!(status(Role::Live, None, Some("x=1&role=live")), 200);
    }
}
