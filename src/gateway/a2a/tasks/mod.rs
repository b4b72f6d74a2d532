//! [`Core`]: the gateway's own MAP sessions, and every A2A operation as ordinary MAP calls.
//!
//! Owns: the gateway's two in-process MAP sessions, both of the router's service principal
//! (`auth::service_principal`, with or without `[auth]`; their ids are in
//! `gateway::RESERVED_IDS`, so nobody can squat them):
//! - the **agent** session (participant and agent `a2a-gateway`, type `agent`): the `from` of
//!   every message the gateway sends to an agent, so an agent's `reply()` comes back here and
//!   becomes the task's update (`replies.rs`) even when the caller has gone;
//! - the **books** sessions (participant `a2a-gateway-tasks` …, type `system`; `books.rs`): the
//!   gateway's bookkeeping, which must reach every A2A task whoever created it: each task's
//!   state changes (`map/tasks/update`), reading tasks for the rule in `access.rs`, and the
//!   [`Feed`] of `task.*` events.
//!
//! What is done *as the caller* (its own MAP session, `access::Caller`) is in `calls.rs` and
//! `agents.rs`: resolving the agent a path names (its visibility), and creating the task
//! (`map/tasks/create`, so its `tasks.canCreate` applies and the task records the caller's
//! session as `createdBy` and its principal as `meta.a2a.owner`). Before a message goes to an
//! agent, the caller's `messaging.canSend` is checked. Reads and changes of an existing task
//! first pass [`Caller::controls`](crate::gateway::a2a::access::Caller::controls): anyone else
//! gets -32001, as for an unknown task.
//!
//! Every A2A state change is one `map/tasks/update` (a durable `task.*` event that MAP
//! subscribers see), made by the task writer (`writer.rs`), the one owner of every change: it
//! applies the changes of one task one at a time, in the order they reached it, so that the read-modify-write of
//! `meta.a2a` (MAP merges `meta` one key deep) never interleaves, while the changes of other
//! tasks run beside them. No lock is held across a MAP call. The task itself is the source of
//! truth: nothing about a task is kept in memory, so a restarted router serves the tasks of the
//! previous run (`recovery.rs` finds those a restart interrupted, on the gateway's first use,
//! and `orphans.rs` ends them).
//!
//! Rooms: `calls.rs` (what A2A callers ask: read, send, cancel, list), `agents.rs` (which agent
//! a request addresses), `target.rs` ([`Target`]), `ids.rs` (the gateway's own ids),
//! `books.rs` (the books sessions; reading and writing a record; what MAP would refuse, refused
//! first), `writer.rs` (the task writer: the one owner of changes, and how each kind is
//! applied), `replies.rs` (an agent's report, as an update), `orphans.rs` (finding the tasks
//! nobody will answer). Files import one way: `mod.rs` (Core) uses `ids`, `target`, `books`
//! and `writer`; `calls`, `agents` and `orphans` add methods to Core.
//!
//! After a restart, a task is also found through the URL of the agent that now has its
//! agent's name ([`Target`]): agents that register without a fixed id come back under a new
//! one.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;

use crate::client::{AgentHandle, Client, ClientError, ClientOptions, Messages};
use crate::gateway::a2a::feed::Feed;
use crate::gateway::a2a::limits::Limits;
use crate::gateway::a2a::push::Push;
use crate::gateway::a2a::record::AgentReport;
use crate::gateway::callers::CallerSessions;
use crate::gateway::egress::AllowList;
use crate::protocol::capabilities::ParticipantType;
use crate::protocol::event::SubscriptionFilter;
use crate::protocol::methods::agents::RegisterParams;

mod agents;
mod books;
mod calls;
mod ids;
mod orphans;
mod replies;
mod target;
mod writer;

pub use ids::{is_gateway_agent, node_id, BOOKS, GATEWAY_AGENT, GATEWAY_BOOKS};
pub use target::Target;

use books::Books;
use writer::Writer;

/// Longest a blocking `SendMessage` waits for the task to end or be interrupted; after that it
/// answers with the task as it is (still working), which the caller can poll or resubscribe to.
pub const BLOCKING_WAIT: Duration = Duration::from_secs(60);

/// MAP tasks read per `map/tasks/list` page while `ListTasks` looks for the caller's tasks,
/// after the first page (which is the size the caller asked for: a caller whose tasks are most
/// of the board reads no more than it gets).
pub const LIST_SCAN_PAGE: u32 = 250;

/// MAP pages one `ListTasks` reads at most. A caller whose tasks are rare among many gets a
/// short (or empty) page with a `nextPageToken` rather than one request that reads the whole
/// board.
pub const LIST_SCAN_PAGES: usize = 8;

/// The gateway's MAP sessions and the operations on them.
#[derive(Debug)]
pub struct Core {
    /// The agent session: sends to agents as `a2a-gateway`, receives their replies.
    client: Client,
    agent: AgentHandle,
    /// The books sessions (`system`): task reads and writes; the first also the feed.
    books: Arc<Books>,
    /// The handle of the task writer, through which every change of a task goes.
    writer: Writer,
    /// Watchers of tasks.
    pub feed: Arc<Feed>,
    /// Webhooks of tasks.
    pub push: Arc<Push>,
}

impl Core {
    /// Opens the sessions, registers the gateway agent, subscribes to `task.*` and starts the
    /// loops (they end when the sessions do), and the sweep of the tasks a restart interrupted
    /// (`recovery.rs`; `started`: when the gateway was made, Unix ms). `node`: the standby
    /// this gateway runs on ([`node_id`]); a standby's gateway sweeps nothing (the live node's
    /// does, when it starts: a standby that takes over starts one).
    ///
    /// # Errors
    /// A session or the registration was refused.
    pub async fn start(
        sessions: &CallerSessions,
        push_allow: AllowList,
        limits: Limits,
        started: u64,
        node: Option<&str>,
    ) -> Result<Arc<Self>, ClientError> {
        let me = node_id(GATEWAY_AGENT, node);
        let client = sessions
            .open_service(
                ClientOptions::agent()
                    .name(me.clone())
                    .participant_id(me.clone())
                    .request_timeout(Duration::from_secs(30)),
            )
            .await?;
        let agent = client
            .register(RegisterParams {
                agent_id: Some(me.clone().into()),
                name: Some(me),
                description: Some(
                    "The A2A gateway: sends A2A callers' messages to MAP agents and takes their replies"
                        .into(),
                ),
                role: Some("gateway".into()),
                ..RegisterParams::default()
            })
            .await?;
        let mut books = Vec::with_capacity(BOOKS.len());
        for id in BOOKS {
            let id = node_id(id, node);
            books.push(
                sessions
                    .open_service(
                        ClientOptions::new()
                            .participant_type(ParticipantType::System)
                            .name(id.clone())
                            .participant_id(id)
                            .request_timeout(Duration::from_secs(30)),
                    )
                    .await?,
            );
        }
        let events = books[0]
            .subscribe(SubscriptionFilter {
                // task.updated is a vendor type: named (docs/compatibility.md §7).
                event_types: Some(vec!["task.*".into(), "task.updated".into()]),
                ..SubscriptionFilter::default()
            })
            .await?;
        let feed = Arc::new(Feed::default());
        let push = Arc::new(Push::new(push_allow, limits.max_push_configs_per_principal));
        let books = Arc::new(Books::new(books, limits, agent.id().to_string()));
        let core = Arc::new(Self {
            client,
            agent,
            writer: Writer::start(Arc::clone(&books)),
            books,
            feed: Arc::clone(&feed),
            push: Arc::clone(&push),
        });
        tokio::spawn(async move { feed.run(events, push).await });
        // NB: after the feed, so that a stream resubscribed to an interrupted task sees it end.
        let weak = Arc::downgrade(&core);
        let sweep = node.is_none().then(|| {
            crate::gateway::a2a::recovery::run(core.books.first().clone(), started, move |id| {
                let core = weak.upgrade();
                async move {
                    match core {
                        Some(core) => {
                            let reason = crate::gateway::a2a::recovery::REASON;
                            core.end_if_interrupted(&id, started, reason).await
                        }
                        None => false,
                    }
                }
            })
        });
        if let Some(sweep) = sweep {
            tokio::spawn(sweep);
        }
        // The live node's gateway also ends the tasks a dead standby's gateway was waiting on.
        if node.is_none() {
            let gone = core
                .books
                .first()
                .subscribe(SubscriptionFilter {
                    // agent.presence.changed is a vendor type: named.
                    event_types: Some(vec![
                        "agent_unregistered".into(),
                        "agent.presence.changed".into(),
                    ]),
                    ..SubscriptionFilter::default()
                })
                .await?;
            tokio::spawn(Self::watch_other_gateways(Arc::downgrade(&core), gone));
        }
        // NB: the agents' replies reach the writer in arrival order, which applies those about
        // one task in that order and those about different tasks side by side (`writer.rs`).
        tokio::spawn(Self::take_replies(
            Arc::downgrade(&core),
            core.agent.messages(),
        ));
        Ok(core)
    }

    /// Reads the gateway agent's `inbox` until it ends (or the gateway is gone), handing each
    /// agent's report to the task writer (`replies.rs` applies it) in arrival order.
    async fn take_replies(core: Weak<Self>, mut inbox: Messages) {
        while let Some(message) = inbox.next().await {
            let Some(core) = core.upgrade() else { break };
            let Some(id) = message.correlation_id() else {
                tracing::debug!(from = %message.from, "a2a gateway: message without correlationId ignored");
                continue;
            };
            let report = AgentReport::of(message.payload.as_ref());
            if report == AgentReport::Ignored {
                continue;
            }
            // The update's context: the router's span of this delivery, else the reply's own.
            let trace = crate::gateway::trace::of_delivery(inbox.delivered_trace(), &message);
            // NB: waits only for a place in the writer's queue, never for the update itself.
            core.writer
                .report(&id, message.from.to_string(), report, trace)
                .await;
        }
    }
}
