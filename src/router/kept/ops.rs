//! Reading kept items: [`paged`] runs an operation that may need items the router does not
//! hold (loading them between attempts), [`read`] runs queries on the store's reader threads
//! (or, without a store, on the router task against its in-memory tables), and [`settle`]
//! waits until the store has what was logged before a read. `impl Router`: putting what a
//! load read into the parts' caches, and trimming them (see the module docs of `kept`).

use std::sync::Arc;

use crate::protocol::capabilities::Capability;
use crate::router::caller::Ctx;
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::handle::{Declared, RouterHandle};
use crate::router::ids::ConnId;
use crate::router::kept::need::Need;
use crate::router::kept::Ticket;
use crate::store::kept::{
    ConversationLoad, KeptAnswer, KeptQuery, KeptRow, KeptTable, OwnerCounts,
};

/// Most load rounds one operation may take: each round loads everything the operation said
/// it lacked, so two or three are the most a real operation needs.
const MAX_ROUNDS: usize = 8;

/// What a load read, for one [`Need`].
#[derive(Debug)]
pub(crate) enum Loaded {
    Task(String, Option<KeptRow>),
    Checkpoint(String, Option<KeptRow>),
    Conversation(String, Option<Box<ConversationLoad>>),
    Turn(String, Option<KeptRow>),
    Counts(String, OwnerCounts),
}

/// Runs `op` on the router task for `conn` (after the capability check), loading what it says
/// it lacks (`RouterError::NeedsLoad`) and running it again, until it answers. Returns its
/// result and the log position to commit before answering (as `RouterHandle::call_deferred`).
///
/// # Errors
/// The operation's own error; a storage error; `Unavailable`.
pub(crate) async fn paged<R, F>(
    router: &RouterHandle,
    conn: ConnId,
    capability: Option<Capability>,
    declared: Declared,
    op: F,
) -> Result<(R, Option<u64>), RouterError>
where
    R: Send + 'static,
    F: Fn(&mut Router, &Ctx) -> Result<R, RouterError> + Send + Sync + 'static,
{
    let op = Arc::new(op);
    let mut loaded: Option<(Ticket, Vec<Loaded>)> = None;
    for _ in 0..MAX_ROUNDS {
        let f = op.clone();
        let give = loaded.take();
        let (outcome, commit) = router
            .call_deferred(conn, capability, true, declared.clone(), move |r, ctx| {
                if let Some((ticket, items)) = give {
                    r.absorb(ticket, items);
                }
                match f(r, ctx) {
                    Err(RouterError::NeedsLoad(needs)) => Ok(Err((r.kept.open(), needs))),
                    other => other.map(Ok),
                }
            })
            .await?;
        match outcome {
            Ok(result) => return Ok((result, commit)),
            Err((ticket, needs)) => match load(router, needs).await {
                Ok(items) => loaded = Some((ticket, items)),
                Err(e) => {
                    let _ = router.with(move |r| r.kept.close(ticket)).await;
                    return Err(e);
                }
            },
        }
    }
    Err(RouterError::Storage(
        "an operation kept needing items the router could not hold".into(),
    ))
}

/// [`paged`] without the commit position: for the reads of an asynchronous method, whose
/// writes (if any) are waited for by the method itself.
///
/// # Errors
/// As [`paged`].
pub(crate) async fn paged_read<R, F>(
    router: &RouterHandle,
    conn: ConnId,
    capability: Option<Capability>,
    op: F,
) -> Result<R, RouterError>
where
    R: Send + 'static,
    F: Fn(&mut Router, &Ctx) -> Result<R, RouterError> + Send + Sync + 'static,
{
    let (result, commit) = paged(router, conn, capability, Declared::default(), op).await?;
    if let Some(until) = commit {
        router.wait_committed(until).await?;
    }
    Ok(result)
}

fn query_of(need: &Need) -> KeptQuery {
    let get = |table, key: &String| KeptQuery::Get {
        table,
        keys: vec![key.clone()],
    };
    match need {
        Need::Task(id) => get(KeptTable::Tasks, id),
        Need::Checkpoint(id) => get(KeptTable::Checkpoints, id),
        Need::Turn(id) => get(KeptTable::Turns, id),
        Need::Conversation(id) => KeptQuery::Conversation { id: id.clone() },
        Need::Counts(owner) => KeptQuery::OwnerCounts {
            owner: owner.clone(),
        },
    }
}

/// Reads what `needs` names.
async fn load(router: &RouterHandle, mut needs: Vec<Need>) -> Result<Vec<Loaded>, RouterError> {
    needs.sort();
    needs.dedup();
    let answers = read(router, needs.iter().map(query_of).collect()).await?;
    let first = |a: KeptAnswer| match a {
        KeptAnswer::Rows(rows) => rows.into_iter().next(),
        _ => None,
    };
    Ok(needs
        .into_iter()
        .zip(answers)
        .map(|(need, answer)| match need {
            Need::Task(id) => Loaded::Task(id, first(answer)),
            Need::Checkpoint(id) => Loaded::Checkpoint(id, first(answer)),
            Need::Turn(id) => Loaded::Turn(id, first(answer)),
            Need::Conversation(id) => Loaded::Conversation(
                id,
                match answer {
                    KeptAnswer::Conversation(c) => c,
                    _ => None,
                },
            ),
            Need::Counts(owner) => Loaded::Counts(
                owner,
                match answer {
                    KeptAnswer::Counts(c) => c,
                    _ => OwnerCounts::default(),
                },
            ),
        })
        .collect())
}

/// Runs queries against the kept tables: on the store's reader threads, or (no store) on the
/// router task against its in-memory tables. Answers in the order of `queries`.
///
/// # Errors
/// A storage error; `Unavailable`.
pub(crate) async fn read(
    router: &RouterHandle,
    queries: Vec<KeptQuery>,
) -> Result<Vec<KeptAnswer>, RouterError> {
    match router.store() {
        Some(store) => futures::future::try_join_all(queries.into_iter().map(|q| store.kept(q)))
            .await
            .map_err(|e| RouterError::Storage(e.to_string())),
        None => {
            router
                .with(move |r| {
                    let memory = r.kept.memory.as_ref();
                    queries
                        .iter()
                        .map(|q| memory.map_or(KeptAnswer::Rows(Vec::new()), |m| m.query(q)))
                        .collect()
                })
                .await
        }
    }
}

/// One query (see [`read`]).
///
/// # Errors
/// As [`read`].
pub(crate) async fn read_one(
    router: &RouterHandle,
    query: KeptQuery,
) -> Result<KeptAnswer, RouterError> {
    read(router, vec![query])
        .await?
        .pop()
        .ok_or(RouterError::Unavailable)
}

/// The rows of a `Get` or `Page` answer.
pub(crate) fn rows(answer: KeptAnswer) -> Vec<KeptRow> {
    match answer {
        KeptAnswer::Rows(rows) => rows,
        _ => Vec::new(),
    }
}

/// Waits until the store holds everything logged before now (bounded by the commit timeout),
/// so that a read that pages through the store sees every change answered before it. At once
/// without a store (the in-memory tables are written as events are logged).
///
/// # Errors
/// `NotConnected` / `PermissionDenied` for a caller without the capability; `Unavailable`.
pub(crate) async fn settle(
    router: &RouterHandle,
    conn: ConnId,
    capability: Option<Capability>,
) -> Result<(), RouterError> {
    let head = router
        .call(conn, capability, true, |r, _| Ok(r.bus.log.next_seq()))
        .await?;
    router.store_settled(head).await;
    Ok(())
}

impl Router {
    /// Puts what a load read into the caches (a key cached meanwhile keeps its newer value),
    /// unless the load's ticket expired: then the operation asks again.
    pub(crate) fn absorb(&mut self, ticket: Ticket, items: Vec<Loaded>) {
        if !self.kept.close(ticket) {
            return;
        }
        // NB: room first, then the loaded items, so that none of them is dropped before the
        // operation that asked for them runs (a cache may hold `capacity` plus one load).
        self.trim_kept();
        for item in items {
            match item {
                Loaded::Task(id, row) => {
                    let entry = row.and_then(|r| {
                        crate::router::tasks::table::entry_of_row(r.row)
                            .map_err(|e| tracing::warn!(task = %id, error = %e, "a stored task this version cannot read"))
                            .ok()
                    });
                    self.tasks.cache.fill(&id, entry.map(Arc::new));
                }
                Loaded::Checkpoint(id, row) => {
                    let entry = row.and_then(|r| {
                        crate::router::trajectory::table::entry_of_row(r.row)
                            .map_err(|e| tracing::warn!(checkpoint = %id, error = %e, "a stored checkpoint this version cannot read"))
                            .ok()
                    });
                    self.trajectories.cache.fill(&id, entry.map(Arc::new));
                }
                Loaded::Turn(id, row) => {
                    let place = row.and_then(|r| {
                        crate::router::mail::table::TurnPlace::of_row(&r.row)
                            .map_err(|e| tracing::warn!(turn = %id, error = %e, "a stored turn this version cannot read"))
                            .ok()
                    });
                    self.mailboxes.turns.fill(&id, place.map(Arc::new));
                }
                Loaded::Conversation(id, load) => {
                    let conv = load.and_then(|l| {
                        crate::router::mail::table::Conv::of_load(*l)
                            .map_err(|e| tracing::warn!(conversation = %id, error = %e, "a stored conversation this version cannot read"))
                            .ok()
                    });
                    self.mailboxes.convs.fill(&id, conv.map(Arc::new));
                }
                Loaded::Counts(owner, counts) => {
                    self.created.fill(&owner, Some(Arc::new(counts)));
                }
            }
        }
    }

    /// Drops what each cache holds beyond its capacity and no longer needs (see `kept`).
    pub(crate) fn trim_kept(&mut self) {
        let safe = self.kept.safe_below();
        self.tasks.cache.trim(safe);
        self.trajectories.cache.trim(safe);
        self.mailboxes.convs.trim(safe);
        self.mailboxes.turns.trim(safe);
        self.created.trim(safe);
    }

    /// The log position of the newest event (what a write just emitted).
    pub(crate) fn last_seq(&self) -> u64 {
        self.bus.log.next_seq().saturating_sub(1)
    }
}
