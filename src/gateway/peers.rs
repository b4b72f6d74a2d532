//! Opening the peers: one in-process MAP session per outside agent the MAMP gateway speaks for
//! (a configured remote MAMP agent, or an outside sender a caller posts as), each owning one
//! MAP agent whose id is the outside agent's `agent://` URI. The table, with its owners and
//! bounds, is `peer_table.rs`.
//!
//! Whose session: a configured remote agent's is the router's service principal's (the
//! gateways' bookkeeping: it must receive what MAP agents send to the remote for as long as the
//! router runs); an outside sender's is the posting caller's principal's, so that caller's
//! grants (`lifecycle.canRegister` for its agent, `messaging.canSend`), quotas and ids apply
//! as over MAP, and nobody else's. Both are opened by the gateways' one opener (`callers.rs`,
//! through `GatewayContext::open_service` / `open_as`).
//!
//! Messages MAP agents send to a peer's agent arrive on its session; for a configured remote
//! MAMP agent they are POSTed to its endpoint (`outbound.rs`); for any other outside sender
//! they are kept in its mailbox (`peer_table.rs`), which it fetches with
//! `GET /mamp/v1/messages?agent=<its URI>` (docs/gateways.md, "Replies"). A full mailbox closes
//! the peer's session, so nothing more is delivered where nobody would receive it.
//!
//! An outside sender's session closed for idleness ends with `map/disconnect` and the
//! `grace-period` policy: its MAP agent is offline (orphaned) for `session_idle_ms`, so a
//! `guaranteed` message to it waits in the router's queue and is delivered into its mailbox
//! when its next request reopens the session (reclaiming the agent), and anything else fails
//! (`message_failed`) instead of being reported delivered; then the agent is unregistered. One
//! recycled to make room for its owner's newer senders is unregistered at once (its owner
//! chose to post as more senders than it may hold): what is sent to it then fails.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;

use crate::client::{Client, ClientOptions};
use crate::gateway::caller::{Caller, Subject};
use crate::gateway::config::RemoteMamp;
use crate::gateway::context::GatewayContext;
use crate::gateway::outbound;
use crate::gateway::peer_table::{Mailbox, Peer, PeerTable};
use crate::gateway::wire::GatewayError;
use crate::protocol::ids::AgentId;
use crate::protocol::json::RawJson;
use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::methods::agents::RegisterParams;

/// Whom a peer stands for.
#[derive(Debug, Clone, Copy)]
pub enum PeerFor<'a> {
    /// A configured remote MAMP agent (the service's session).
    Remote(&'a RemoteMamp),
    /// An outside sender the caller posts as (a session of the caller's principal).
    Caller(&'a Caller),
}

/// The peer for `uri`, opening its session and registering its agent when there is none
/// (or its session ended).
///
/// # Errors
/// [`GatewayError::Forbidden`] when another owner holds `uri`, or the router refuses the
/// agent id (1003: another principal's, or reserved); [`GatewayError::Quota`] naming the
/// quota that refused the session; the router's error when the agent id is in use.
pub async fn get_or_open(
    ctx: &Arc<GatewayContext>,
    uri: &str,
    who: PeerFor<'_>,
) -> Result<Peer, GatewayError> {
    start_sweeper(ctx);
    let owner = match who {
        PeerFor::Remote(_) => None,
        PeerFor::Caller(c) => Some(c.subject()),
    };
    let claimed = ctx.peers.claim(uri, owner.as_ref())?;
    for old in claimed.evicted {
        tokio::spawn(async move { end(&old.client).await });
    }
    let cell = claimed.cell;
    let opened = cell
        .get_or_try_init(|| open(ctx, uri, who, owner.as_ref()))
        .await
        .cloned();
    if opened.is_err() {
        ctx.peers.forget(uri, &cell);
    }
    opened
}

/// Opens a peer's session and registers its agent; on the caller's session quota, recycles
/// one of its older peers and tries once more.
async fn open(
    ctx: &Arc<GatewayContext>,
    uri: &str,
    who: PeerFor<'_>,
    owner: Option<&Subject>,
) -> Result<Peer, GatewayError> {
    let (name, remote) = match who {
        PeerFor::Remote(r) => (r.name.clone().unwrap_or_else(|| uri.to_owned()), Some(r)),
        PeerFor::Caller(_) => (uri.to_owned(), None),
    };
    let options = || ClientOptions::agent().name(name.clone());
    let session = match who {
        PeerFor::Remote(_) => ctx.open_service(options()).await,
        PeerFor::Caller(c) => match ctx.open_as(c.principal.as_ref(), options()).await {
            Err(GatewayError::Quota(why)) => match owner.and_then(|o| ctx.peers.evict_one_of(o)) {
                Some(old) => {
                    end(&old.client).await;
                    ctx.open_as(c.principal.as_ref(), options()).await
                }
                None => Err(GatewayError::Quota(why)),
            },
            other => other,
        },
    }?;
    let registered = session
        .register(RegisterParams {
            agent_id: Some(AgentId::from(uri)),
            name: Some(name),
            role: Some("mamp-peer".into()),
            metadata: Some(RawJson::from(json!({
                "gateway": "mamp",
                "agentUri": uri,
            }))),
            ..RegisterParams::default()
        })
        .await;
    let agent = match registered {
        Ok(a) => a,
        Err(e) => {
            end(&session).await;
            return Err(match e.code() {
                Some(ErrorCode::PERMISSION_DENIED) => GatewayError::Forbidden(format!(
                    "the router refused the agent id {uri} to this caller: {}",
                    rpc_message(&e)
                )),
                _ => GatewayError::Map(e),
            });
        }
    };
    let peer = Peer {
        uri: uri.to_owned(),
        client: session,
        agent,
        opened_at: Instant::now(),
    };
    let sink = match remote {
        Some(r) => Sink::Remote(r.clone()),
        None => match ctx.peers.mailbox(uri, owner) {
            Some(mailbox) => Sink::Mailbox(mailbox),
            None => {
                end(&peer.client).await;
                return Err(GatewayError::Forbidden(format!(
                    "{uri} is held by another sender's session"
                )));
            }
        },
    };
    spawn_pump(Arc::clone(ctx), peer.clone(), sink);
    Ok(peer)
}

fn rpc_message(e: &crate::client::ClientError) -> String {
    match e {
        crate::client::ClientError::Rpc { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// Ends a peer's session as a participant's would end (what it registered is unregistered).
async fn end(client: &Client) {
    if client.disconnect().await.is_err() {
        let _ = client.close().await;
    }
}

/// Ends an outside sender's session, leaving its agent offline (orphaned) for `grace`: what is
/// sent to it meanwhile is queued (`guaranteed`) or fails, and its next request reclaims it.
async fn detach(client: &Client, grace: Duration) {
    let policy = json!({"policy": {
        "agentBehavior": "grace-period",
        "gracePeriodMs": grace.as_millis() as u64,
    }, "reason": "idle"});
    let _ = client.call_raw("map/disconnect", policy).await;
    let _ = client.close().await;
}

/// Where a peer's messages go.
enum Sink {
    /// POSTed to a configured remote agent.
    Remote(RemoteMamp),
    /// Kept for an outside sender to fetch.
    Mailbox(Arc<Mailbox>),
}

/// Reads the peer agent's messages until its session ends.
fn spawn_pump(ctx: Arc<GatewayContext>, peer: Peer, sink: Sink) {
    let mut messages = peer.agent.messages();
    tokio::spawn(async move {
        while let Some(message) = messages.next().await {
            match &sink {
                Sink::Remote(remote) => {
                    // The POST's context: the router's span of this delivery, else the
                    // message's own (`gateway::trace`).
                    let trace =
                        crate::gateway::trace::of_delivery(messages.delivered_trace(), &message);
                    outbound::deliver(&ctx, remote, &message, trace.as_ref()).await;
                }
                Sink::Mailbox(mailbox) => {
                    if mailbox.push(message) {
                        tracing::info!(
                            peer = %peer.uri,
                            "an outside sender's mailbox is full: its session is closed until \
                             it fetches"
                        );
                        detach(&peer.client, ctx.settings.session_idle()).await;
                        break;
                    }
                }
            }
        }
    });
}

/// Starts (once) the task that closes outside senders' peers unused for
/// `[gateways] session_idle_ms`; it ends with the table.
fn start_sweeper(ctx: &GatewayContext) {
    if ctx.peers.sweeping.swap(true, Ordering::AcqRel) {
        return;
    }
    let idle = ctx.settings.session_idle();
    tokio::spawn(sweep_loop(Arc::downgrade(&ctx.peers), idle));
}

async fn sweep_loop(table: Weak<PeerTable>, idle: Duration) {
    let period = (idle / 2).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(period).await;
        let Some(table) = table.upgrade() else { break };
        for peer in table.idle(idle) {
            detach(&peer.client, idle).await;
        }
        table.sweep_mailboxes(idle);
    }
}

/// Opens the peers of every configured remote MAMP agent (so MAP agents can find them at once).
pub async fn open_configured(ctx: Arc<GatewayContext>) {
    for remote in ctx.settings.mamp.remote.clone() {
        if let Err(e) = get_or_open(&ctx, &remote.uri, PeerFor::Remote(&remote)).await {
            tracing::error!(uri = %remote.uri, error = %e, "remote MAMP agent not registered");
        }
    }
}
