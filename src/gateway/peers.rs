//! Opening the peers: one in-process MAP session per outside agent the gateways speak for (a
//! remote MAMP agent, an IM agent named as a sender without a live connection, the gateway
//! itself as a sender), each owning one MAP agent whose id is the outside agent's `agent://`
//! URI. The table is `peer_table.rs`.
//!
//! Messages MAP agents send to a peer's agent arrive on its session; for a configured remote
//! MAMP agent they are POSTed to its endpoint (`outbound.rs`), for others they are logged and
//! dropped (nobody outside can receive them).

use std::sync::Arc;

use futures::StreamExt;
use serde_json::json;

use crate::client::{ClientOptions, ConnectionState};
use crate::gateway::config::RemoteMamp;
use crate::gateway::context::GatewayContext;
use crate::gateway::outbound;
use crate::gateway::peer_table::Peer;
use crate::gateway::wire::GatewayError;
use crate::protocol::ids::AgentId;
use crate::protocol::json::RawJson;
use crate::protocol::methods::agents::RegisterParams;

/// The peer for `uri`, opening its session and registering its agent when there is none
/// (or its session ended). `remote`: the configured remote MAMP agent it stands for.
///
/// # Errors
/// The session could not be opened, or the agent id is taken (for example by a live IM
/// connection under the same URI).
pub async fn get_or_open(
    ctx: &Arc<GatewayContext>,
    uri: &str,
    kind: &str,
) -> Result<Peer, GatewayError> {
    let mut table = ctx.peers.table.lock().await;
    if let Some(p) = table.get(uri) {
        if !matches!(p.client.state(), ConnectionState::Closed) {
            return Ok(p.clone());
        }
    }
    let remote = ctx
        .settings
        .mamp
        .remote
        .iter()
        .find(|r| r.uri == uri)
        .cloned();
    let name = remote
        .as_ref()
        .and_then(|r| r.name.clone())
        .unwrap_or_else(|| uri.to_owned());
    let client = ctx
        .open_session(ClientOptions::agent().name(name.clone()))
        .await?;
    let agent = client
        .register(RegisterParams {
            agent_id: Some(AgentId::from(uri)),
            name: Some(name),
            role: Some(format!("{kind}-peer")),
            metadata: Some(RawJson::from(json!({
                "gateway": kind,
                "agentUri": uri,
            }))),
            ..RegisterParams::default()
        })
        .await?;
    let peer = Peer {
        uri: uri.to_owned(),
        client,
        agent,
    };
    spawn_pump(Arc::clone(ctx), peer.clone(), remote);
    table.insert(uri.to_owned(), peer.clone());
    Ok(peer)
}

/// Reads the peer agent's messages until its session ends.
fn spawn_pump(ctx: Arc<GatewayContext>, peer: Peer, remote: Option<RemoteMamp>) {
    let mut messages = peer.agent.messages();
    tokio::spawn(async move {
        while let Some(message) = messages.next().await {
            match &remote {
                Some(remote) => outbound::deliver(&ctx, remote, &message).await,
                None => tracing::warn!(
                    peer = %peer.uri,
                    from = %message.from,
                    "message to an outside agent with no endpoint: dropped"
                ),
            }
        }
    });
}

/// Opens the peers of every configured remote MAMP agent (so MAP agents can find them at once).
pub async fn open_configured(ctx: Arc<GatewayContext>) {
    for remote in ctx.settings.mamp.remote.clone() {
        if let Err(e) = get_or_open(&ctx, &remote.uri, "mamp").await {
            tracing::error!(uri = %remote.uri, error = %e, "remote MAMP agent not registered");
        }
    }
}
