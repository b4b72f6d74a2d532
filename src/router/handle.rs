//! [`RouterHandle`]: the cheap, cloneable handle everyone outside the router task holds. It
//! sends [`Command`]s, runs operations on the router task and returns their results, and waits
//! (bounded) for the durable store to commit what a call appended, when the caller must not
//! answer before that. [`Router::start`] builds the router task and its first handle.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::protocol::capabilities::Capability;
use crate::protocol::ids::EventId;
use crate::router::agents::supervised::{ProcessControl, Supervision};
use crate::router::caller::Ctx;
use crate::router::config::{Delivery, Durability, RouterConfig};
use crate::router::core::{Command, Op, Router, RouterParts, RouterStats};
use crate::router::error::RouterError;
use crate::router::events::bus::{DiskAccess, DiskRows, RowsBack};
use crate::router::events::log::EventLog;
use crate::router::ids::ConnId;
use crate::router::trajectory::table::Trajectories;

/// What a request declares about itself in `params._meta`: the events that caused it
/// (`causedBy`) and its trace context (`traceparent`, `tracestate`). Both are advisory: a
/// malformed entry is ignored, never a reason to refuse the call.
#[derive(Debug, Clone, Default)]
pub struct Declared {
    /// Event ids the call's events name as causes.
    pub causes: Vec<EventId>,
    /// Stamped on the call's events (`event._meta`).
    pub trace: Option<crate::protocol::trace::TraceContext>,
    /// The relay-only `relayTraceparent` as sent (a cluster node's span for the call it
    /// relays, `router::relay`): refused unless the call comes from a relay session; there, it
    /// is the call's trace context and wins over its message's own.
    pub relay: Option<String>,
}

/// A cheap, cloneable handle to the router task: its channel and one shared part (16 bytes:
/// every connection holds three, and a clone is two reference counts).
#[derive(Debug, Clone)]
pub struct RouterHandle {
    tx: mpsc::Sender<Command>,
    shared: Arc<Shared>,
}

/// What every handle of one router shares.
#[derive(Debug)]
struct Shared {
    next_conn: AtomicU64,
    config: Arc<RouterConfig>,
    /// Store durability progress, when calls wait for it.
    committed: Option<tokio::sync::watch::Receiver<u64>>,
    /// The durable store, for reads that must not go through the router task.
    store: Option<Arc<dyn crate::store::EventStore>>,
    /// Where request latencies and error codes are observed (`[metrics] enabled`).
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl RouterHandle {
    /// Whether this router is a follower (`RouterConfig::follower`).
    pub fn is_follower(&self) -> bool {
        self.shared.config.follower
    }

    /// The server's metrics, when they are enabled.
    pub fn metrics(&self) -> Option<&Arc<crate::metrics::Metrics>> {
        self.shared.metrics.as_ref()
    }

    /// The text of `GET /metrics`: the metrics' families and the router's snapshot.
    ///
    /// # Errors
    /// `NotFound`-like `Unavailable` when metrics are off or the router has stopped.
    pub async fn render_metrics(&self) -> Result<String, RouterError> {
        let metrics = self
            .shared
            .metrics
            .clone()
            .ok_or(RouterError::Unavailable)?;
        let snapshot = self.with(|r| r.metrics_snapshot()).await?;
        Ok(metrics.render(snapshot).await)
    }

    /// A fresh connection id.
    pub fn new_conn_id(&self) -> ConnId {
        ConnId(self.shared.next_conn.fetch_add(1, Ordering::Relaxed))
    }

    /// The router's configuration.
    pub fn config(&self) -> &RouterConfig {
        &self.shared.config
    }

    /// A follower: whether it has followed, within `limit`, every row the stream holds now
    /// (`EventStore::head`). The writer commits a call's saved records before it answers, so
    /// once this holds a read here shows what every call answered before it changed (read
    /// your writes, `router::relay`).
    pub async fn followed_to_the_end(&self, limit: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        let Some(store) = self.store() else {
            return true;
        };
        let Ok(Ok(end)) = tokio::time::timeout_at(deadline, store.head()).await else {
            return false;
        };
        let mut pause = std::time::Duration::from_micros(200);
        loop {
            match self.with(|r| r.bus.log.next_seq()).await {
                Ok(next) if next >= end => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
            if tokio::time::Instant::now() + pause > deadline {
                return false;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(10));
        }
    }

    /// The durable event store, if the log is durable.
    pub fn store(&self) -> Option<Arc<dyn crate::store::EventStore>> {
        self.shared.store.clone()
    }

    /// Sends a command, waiting for room in the channel.
    ///
    /// # Errors
    /// `RouterError::Unavailable` when the router has stopped.
    pub async fn send(&self, cmd: Command) -> Result<(), RouterError> {
        self.tx
            .send(cmd)
            .await
            .map_err(|_| RouterError::Unavailable)
    }

    /// Runs `f` on the router task and returns its result, with no connection context (for
    /// the supervisor and other router-side components).
    ///
    /// # Errors
    /// `Unavailable` when the router has stopped.
    pub async fn with<R, F>(&self, f: F) -> Result<R, RouterError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Router) -> R + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let op: Op = Box::new(move |router: &mut Router| {
            let _ = tx.send(f(router));
        });
        self.send(Command::Call(op)).await?;
        rx.await.map_err(|_| RouterError::Unavailable)
    }

    /// A snapshot of the router's sizes (for health checks, metrics and tests).
    ///
    /// # Errors
    /// `Unavailable` when the router has stopped.
    pub async fn stats(&self) -> Result<RouterStats, RouterError> {
        self.with(|r| RouterStats {
            connections: r.conns.len(),
            sessions: r.sessions.len(),
            agents: r.registry.len(),
            subscriptions: r.bus.len(),
            log_events: r.bus.log.len(),
            next_seq: r.bus.log.next_seq(),
            tables: r.table_sizes(),
        })
        .await
    }

    /// Runs `f` on the router task for `conn`, waits (bounded) until the store has committed
    /// what it appended (when calls wait for commits), and returns its result. The capability,
    /// when given, is checked first against the connection's session.
    ///
    /// # Errors
    /// The operation's own error, `NotConnected`, `PermissionDenied`, `NotDurable` (4000) when
    /// the commit does not come in time, or `Unavailable`.
    pub async fn call<R, F>(
        &self,
        conn: ConnId,
        capability: Option<Capability>,
        needs_session: bool,
        f: F,
    ) -> Result<R, RouterError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Router, &Ctx) -> Result<R, RouterError> + Send + 'static,
    {
        let (result, commit) = self
            .call_deferred(conn, capability, needs_session, Declared::default(), f)
            .await?;
        if let Some(until) = commit {
            self.wait_committed(until).await?;
        }
        Ok(result)
    }

    /// Runs `f` on the router task for `conn` without waiting for the store: returns its result
    /// and, when it appended events and calls wait for commits, the log position that must be
    /// committed before the answer may be sent (the method table decides how: see
    /// `dispatch::Answer`). `causes` are the event ids the call declared
    /// (`params._meta.causedBy`): its events without a cause of their own get them (ids the
    /// router has not issued yet are dropped).
    ///
    /// # Errors
    /// The operation's own error, `NotConnected`, `PermissionDenied`, or `Unavailable`.
    pub async fn call_deferred<R, F>(
        &self,
        conn: ConnId,
        capability: Option<Capability>,
        needs_session: bool,
        declared: Declared,
        f: F,
    ) -> Result<(R, Option<u64>), RouterError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Router, &Ctx) -> Result<R, RouterError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let op: Op = Box::new(move |router: &mut Router| {
            let ctx = Ctx { conn };
            let before = router.bus.log.next_seq();
            let newest = router.bus.log.newest_id();
            let Declared {
                causes,
                trace,
                relay,
            } = declared;
            let relayed = router.relay_trace(conn, relay.as_deref());
            router.call_relayed = matches!(relayed, Ok(Some(_)));
            router.call_trace = match &relayed {
                Ok(Some(t)) => Some(t.clone()),
                _ => trace,
            };
            router.call_causes = causes
                .into_iter()
                .filter(|c| newest.is_some_and(|n| *c <= n))
                .collect();
            let result = relayed
                .map(drop)
                .and_then(|()| router.check_backlog())
                .and_then(|()| router.check_call(&ctx, capability, needs_session))
                .and_then(|()| {
                    router.touch_session(&ctx);
                    f(router, &ctx)
                });
            router.call_causes.clear();
            router.call_trace = None;
            router.call_relayed = false;
            // The answer waits for the commit of the records it changed too.
            router.save_changed();
            let after = router.bus.log.next_seq();
            let _ = tx.send((result, (after > before).then_some(after)));
        });
        self.send(Command::Call(op)).await?;
        let (result, appended_to) = rx.await.map_err(|_| RouterError::Unavailable)?;
        let result = result?;
        let commit = appended_to.filter(|_| self.shared.committed.is_some());
        Ok((result, commit))
    }

    /// The store's commit progress and the commit timeout, when calls wait for commits.
    pub(crate) fn commit_progress(&self) -> Option<(tokio::sync::watch::Receiver<u64>, Duration)> {
        self.shared
            .committed
            .clone()
            .map(|c| (c, self.shared.config.commit_timeout))
    }

    /// Waits (bounded by the commit timeout) until the store holds every event below `until`,
    /// whatever the durability setting, so that a read paging through the store sees them;
    /// at once without a store. Past the timeout it returns anyway (the read then shows what
    /// the store has), with a warning.
    pub async fn store_settled(&self, until: u64) {
        let Some(store) = &self.shared.store else {
            return;
        };
        let mut committed = store.committed();
        let limit = self.shared.config.commit_timeout;
        if tokio::time::timeout(limit, committed.wait_for(|c| *c >= until))
            .await
            .is_err()
        {
            tracing::warn!(
                until,
                "a read did not wait for the store's commit: it took longer than the commit timeout"
            );
        }
    }

    /// Waits (bounded by the commit timeout) until every event below `until` is committed;
    /// at once when calls do not wait for commits.
    ///
    /// # Errors
    /// `NotDurable` (4000) when the commit does not come in time or the store has stopped.
    pub async fn wait_committed(&self, until: u64) -> Result<(), RouterError> {
        let Some(mut committed) = self.shared.committed.clone() else {
            return Ok(());
        };
        let limit = self.shared.config.commit_timeout;
        let reached = tokio::time::timeout(limit, committed.wait_for(|c| *c >= until))
            .await
            .map(|r| r.is_ok());
        match reached {
            Ok(true) => Ok(()),
            Ok(false) => Err(RouterError::not_committed(true, limit)),
            Err(_) => Err(RouterError::not_committed(false, limit)),
        }
    }
}

impl Router {
    /// Starts the router task and returns its handle.
    pub fn spawn(config: RouterConfig) -> (RouterHandle, tokio::task::JoinHandle<()>) {
        Self::spawn_with(config, None)
    }

    /// Starts the router task with a channel to a process supervisor.
    pub fn spawn_with(
        config: RouterConfig,
        process_control: Option<mpsc::Sender<ProcessControl>>,
    ) -> (RouterHandle, tokio::task::JoinHandle<()>) {
        Self::start(
            config,
            RouterParts {
                process_control,
                store: None,
                metrics: None,
                traces: None,
                carried_fold: None,
            },
        )
    }

    /// Starts the router task with its collaborators (supervisor channel, durable store).
    pub fn start(
        config: RouterConfig,
        parts: RouterParts,
    ) -> (RouterHandle, tokio::task::JoinHandle<()>) {
        let config = Arc::new(config);
        let (tx, rx) = mpsc::channel(config.command_queue.max(1));
        let mut router = Router::new(config.clone());
        router.supervised = Supervision::new(parts.process_control);
        router.traces = parts.traces.map(Box::new);
        router.carried_fold = parts.carried_fold;
        if router.traces.is_some() {
            router.schedule(
                std::time::Instant::now() + crate::router::traces::FLUSH_EVERY,
                crate::router::timers::Deadline::FlushSpans,
            );
        }
        let mut committed = None;
        let handle_store = parts.store.as_ref().map(|(s, _)| s.clone());
        if let Some((store, recovered)) = parts.store {
            router.bus.log = EventLog::recover(config.retention, &recovered);
            // The kept items stay in the store; the router pages them (`router::kept`).
            let counts = recovered.kept_counts;
            router.kept = crate::router::kept::Kept::new(Some(store.committed()));
            router.trajectories = Trajectories::new(config.cache_items, counts.checkpoints);
            router.tasks =
                crate::router::tasks::table::Tasks::new(config.cache_items, counts.tasks);
            router.mailboxes = crate::router::mail::table::Mailboxes::new(
                config.cache_items,
                counts.conversations,
            );
            router.identities = crate::router::identities::table::Identities::recover(
                &recovered.claims,
                config.ids_per_principal,
            );
            if config.follower {
                // The live node's agents and scopes as saved, for the reads a follower
                // answers (`router::handover`); what follows comes with the rows.
                router.follow_saved_rows(&recovered.saved);
            }
            if config.node.is_some() && !config.follower {
                // Cluster mode, live node: save sessions, agents and scopes for the next one.
                router.start_saving();
                router.saved_at_open = recovered.saved;
                if config.saved_refresh.is_some() {
                    router.schedule(
                        std::time::Instant::now() + crate::router::handover::REFRESH_EVERY,
                        crate::router::timers::Deadline::RefreshSaved,
                    );
                }
            }
            if config.durability == Durability::Durable {
                committed = Some(store.committed());
            }
            router.store = Some(store.clone());
            router.store_progress = Some(store.committed());
            let commands = tx.downgrade();
            let rows_back: RowsBack = Arc::new(move |rows: DiskRows| {
                let commands = commands.clone();
                Box::pin(async move {
                    if let Some(tx) = commands.upgrade() {
                        let _ = tx.send(Command::DiskRows(rows)).await;
                    }
                })
            });
            // A follower is handed committed rows only (`router::events::follow`).
            if config.delivery == Delivery::Committed && !config.follower {
                // Read-committed: events reach subscribers as their commits land.
                let mut progress = store.committed();
                router
                    .bus
                    .deliver_committed_only(*progress.borrow_and_update());
                let commands = tx.downgrade();
                tokio::spawn(async move {
                    while progress.changed().await.is_ok() {
                        let upto = *progress.borrow_and_update();
                        let Some(tx) = commands.upgrade() else { break };
                        if tx.send(Command::Committed(upto)).await.is_err() {
                            break;
                        }
                    }
                });
            }
            router.bus.set_disk(DiskAccess { store, rows_back });
        }
        let task = tokio::spawn(router.run(rx));
        (
            RouterHandle {
                tx,
                shared: Arc::new(Shared {
                    next_conn: AtomicU64::new(1),
                    committed,
                    store: handle_store,
                    metrics: parts.metrics,
                    config,
                }),
            },
            task,
        )
    }
}
