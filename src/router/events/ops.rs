//! `map/subscribe`, `map/unsubscribe`, `map/replay` and `map/subscribe.ack`.
//!
//! A new subscription starts `Pending` at the head of the log, or at an earlier position given
//! by `replayFrom` / `startAfter` (an event id, exclusive, or a timestamp, inclusive). It is
//! activated by the session once its response is queued, so the response always precedes the
//! first `map/event`; from there it catches up through the memory window and, further back, the
//! durable store, then goes live: one sequence, no gap, no duplicate.
//!
//! Positions and replay are resolved in the memory window when it covers them, else in the
//! store. Replay reads in chunks (memory or store), and each chunk is filtered on the router
//! task with the exact rules of live delivery, so the router never waits on a disk.

use std::sync::Arc;

use crate::protocol::capabilities::Capability;
use crate::protocol::event::SubscriptionFilter;
use crate::protocol::ids::{now_ms, EventId, SubscriptionId};
use crate::protocol::methods::events::*;

use crate::router::caller::Ctx;
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::events::bus::EventBus;
use crate::router::events::bus::OverflowPolicy;
use crate::router::events::bus::SubState;
use crate::router::events::bus::Subscription;
use crate::router::events::filter::CompiledFilter;
use crate::router::events::log::push_id_array;
use crate::router::events::log::EventRecord;
use crate::router::events::log::Lookup;
use crate::router::events::log::StoredRow;
use crate::router::handle::RouterHandle;
use crate::router::ids::ConnId;

/// Most events one `map/replay` page returns.
pub const MAX_REPLAY_PAGE: u32 = 1000;
/// Page size when `limit` is absent.
pub const DEFAULT_REPLAY_PAGE: u32 = 100;
/// Events examined per router step of a replay (bounds how long one step holds the router).
pub const REPLAY_CHUNK: usize = 2048;
/// A replay counts matches (`totalCount`) only while it has examined fewer events than this;
/// past it, `totalCount` is left out rather than scanning an unbounded log.
pub const REPLAY_COUNT_BUDGET: u64 = 200_000;
/// Credit window of a subscription that acknowledges without choosing one.
pub const DEFAULT_ACK_WINDOW: u64 = 1024;

fn compile(filter: Option<&SubscriptionFilter>) -> Result<CompiledFilter, RouterError> {
    CompiledFilter::compile(filter).map_err(|e| {
        RouterError::InvalidParams(
            e.data
                .and_then(|d| d.details)
                .and_then(|d| d.as_str().map(str::to_owned))
                .unwrap_or(e.message),
        )
    })
}

fn parse_event_id(s: &str, field: &str) -> Result<EventId, RouterError> {
    EventId::parse(s).ok_or_else(|| {
        RouterError::InvalidParams(format!(
            "{field} `{s}` is not an event id (a 26-character ULID)"
        ))
    })
}

/// A position in the log, as a client names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// Just after this event id (which need not exist).
    AfterId(EventId),
    /// At the first event at or after this time (Unix ms).
    AtTime(u64),
}

fn subscribe_position(p: &SubscribeParams) -> Result<Option<Position>, RouterError> {
    let bad = || {
        RouterError::InvalidParams("replayFrom must be an event id or a Unix-ms timestamp".into())
    };
    match (&p.replay_from, &p.start_after) {
        (Some(serde_json::Value::String(id)), _) => {
            Ok(Some(Position::AfterId(parse_event_id(id, "replayFrom")?)))
        }
        (Some(serde_json::Value::Number(n)), _) => {
            Ok(Some(Position::AtTime(n.as_u64().ok_or_else(bad)?)))
        }
        (Some(serde_json::Value::Null) | None, Some(id)) => {
            Ok(Some(Position::AfterId(parse_event_id(id, "startAfter")?)))
        }
        (Some(serde_json::Value::Null) | None, None) => Ok(None),
        (Some(_), _) => Err(bad()),
    }
}

fn storage(e: crate::store::StoreError) -> RouterError {
    RouterError::Storage(e.to_string())
}

/// Resolves a position to a sequence number: in the memory window when it covers it, else in
/// the store.
pub(crate) async fn resolve(
    router: &RouterHandle,
    conn: ConnId,
    pos: Position,
) -> Result<u64, RouterError> {
    let in_memory = router
        .call(conn, Some(Capability::CanObserve), true, move |r, _| {
            Ok(r.memory_position(pos))
        })
        .await?;
    if let Some(seq) = in_memory {
        return Ok(seq);
    }
    let store = router
        .store()
        .ok_or_else(|| RouterError::Storage("no event store".into()))?;
    match pos {
        Position::AfterId(id) => store.seq_after(id).await.map_err(storage),
        Position::AtTime(ts) => store.seq_at_or_after_time(ts).await.map_err(storage),
    }
}

/// Whether events from position `pos` on may be gone: it resolved to `cursor`, the oldest
/// retained event, and events before that one were deleted that may come after `pos`.
/// Conservative: it may also flag a client that read exactly up to the last deleted event (or,
/// for a time, one whose deleted events all predate it within the same millisecond).
async fn lost_from(
    router: &RouterHandle,
    conn: ConnId,
    pos: Position,
    cursor: u64,
) -> Result<bool, RouterError> {
    let (oldest, memory_first, memory_oldest_id) = router
        .call(conn, Some(Capability::CanObserve), true, |r, _| {
            Ok((
                r.bus.oldest_retained(),
                r.bus.log.first_seq(),
                r.bus.log.oldest_id(),
            ))
        })
        .await?;
    // Nothing was ever deleted when the log still starts where a fresh store starts.
    let origin = router.store().map_or(0, |s| s.origin());
    if oldest <= origin || cursor > oldest {
        return Ok(false);
    }
    let first_retained = match router.store() {
        Some(store) if oldest < memory_first => store
            .read(oldest, 1)
            .await
            .map_err(storage)?
            .first()
            .and_then(|r| EventId::parse(&r.id)),
        _ => memory_oldest_id,
    };
    Ok(first_retained.is_some_and(|first| match pos {
        Position::AfterId(id) => id < first,
        Position::AtTime(ts) => ts <= first.0.timestamp_ms(),
    }))
}

/// Whether `id`, which resolved to `seq` (the position just after it), is an event of the log:
/// the event just before `seq` has exactly that id. Read from the memory window when it holds
/// that position, else from the store.
async fn id_known(
    router: &RouterHandle,
    conn: ConnId,
    id: EventId,
    seq: u64,
) -> Result<bool, RouterError> {
    let Some(before) = seq.checked_sub(1) else {
        return Ok(false);
    };
    let in_memory = router
        .call(conn, Some(Capability::CanObserve), true, move |r, _| {
            let log = &r.bus.log;
            Ok((before >= log.first_seq()).then(|| log.find(id).is_some_and(|e| e.seq == before)))
        })
        .await?;
    if let Some(known) = in_memory {
        return Ok(known);
    }
    let Some(store) = router.store() else {
        return Ok(false);
    };
    let rows = store.read(before, 1).await.map_err(storage)?;
    Ok(rows
        .first()
        .is_some_and(|r| r.seq == before && EventId::parse(&r.id) == Some(id)))
}

/// `map/subscribe`.
///
/// A `replayFrom` event id older than everything retained starts the subscription in the gap:
/// its first notification is `subscription.overflow`, then it follows its overflow policy, as
/// a subscriber that fell behind retention does.
///
/// # Errors
/// `-32602` for a bad filter or position; 1003 without `observation.canObserve`.
pub async fn subscribe(
    router: RouterHandle,
    conn: ConnId,
    p: SubscribeParams,
) -> Result<SubscribeResult, RouterError> {
    compile(p.filter.as_ref())?;
    let mut unknown = false;
    let start = match subscribe_position(&p)? {
        Some(pos) => {
            let seq = resolve(&router, conn, pos).await?;
            // In the gap: start just before the oldest retained event (deleted), so that
            // delivery starts with the overflow notice.
            if lost_from(&router, conn, pos, seq).await? {
                Some(seq.saturating_sub(1))
            } else {
                if let Position::AfterId(id) = pos {
                    unknown = !id_known(&router, conn, id, seq).await?;
                }
                Some(seq)
            }
        }
        None => None,
    };
    let mut result = router
        .call(conn, Some(Capability::CanObserve), true, move |r, ctx| {
            r.subscribe_at(ctx, p, start)
        })
        .await?;
    result.unknown_event_id = unknown.then_some(true);
    Ok(result)
}

/// One step of a replay scan.
pub(crate) struct Chunk {
    /// Matching events, rendered (as replay entries, for `map/replay`).
    pub(crate) matched: Vec<String>,
    /// Events examined.
    pub(crate) examined: u64,
    /// Where the next step starts.
    pub(crate) next: u64,
    /// The scan reached the head of the log or `toTimestamp`.
    pub(crate) end: bool,
}

/// How a scan renders an event it admits.
pub(crate) type Render = fn(&EventRecord) -> String;

/// The oldest retained position and the visible head (what the store has committed is made
/// visible first, as for `map/replay`: a caller reads its own writes).
pub(crate) async fn log_bounds(
    router: &RouterHandle,
    conn: ConnId,
) -> Result<(u64, u64), RouterError> {
    router
        .call(conn, Some(Capability::CanObserve), true, |r, _| {
            r.sync_committed();
            Ok((r.bus.oldest_retained(), r.bus.visible_head()))
        })
        .await
}

/// One step of a scan of the log from `cursor` (up to `to`, a time, inclusive): at most
/// [`REPLAY_CHUNK`] events, from the memory window or else the store, each kept (rendered by
/// `render`) only when `filter` and the caller's visibility admit it, exactly as live delivery
/// would. `map/replay` reads this way, and so does the trace reader (`router::traces::read`).
pub(crate) async fn scan_step(
    router: &RouterHandle,
    conn: ConnId,
    filter: &Arc<CompiledFilter>,
    cursor: u64,
    to: Option<u64>,
    render: Render,
) -> Result<Chunk, RouterError> {
    let f = filter.clone();
    let step = router
        .call(conn, Some(Capability::CanObserve), true, move |r, ctx| {
            Ok(r.replay_memory_chunk(ctx, &f, cursor, to, render))
        })
        .await?;
    if let Some(chunk) = step {
        return Ok(chunk);
    }
    // Before the memory window: read the store.
    let store = router
        .store()
        .ok_or_else(|| RouterError::Storage("no event store".into()))?;
    let rows = store.read(cursor, REPLAY_CHUNK).await.map_err(storage)?;
    let f = filter.clone();
    router
        .call(conn, Some(Capability::CanObserve), true, move |r, ctx| {
            Ok(r.replay_rows(ctx, &f, rows, cursor, to, render))
        })
        .await
}

fn render_replayed(rec: &EventRecord) -> String {
    let mut s = String::with_capacity(rec.json.len() + 96);
    s.push_str("{\"eventId\":\"");
    if let Some(id) = rec.id {
        s.push_str(&id.to_string());
    }
    s.push_str(&format!("\",\"timestamp\":{}", rec.timestamp));
    if !rec.caused_by.is_empty() {
        s.push_str(",\"causedBy\":");
        push_id_array(&mut s, &rec.caused_by);
    }
    s.push_str(",\"event\":");
    s.push_str(&rec.json);
    s.push('}');
    s
}

/// `map/replay`.
///
/// # Errors
/// `-32602` for bad params; 1003 without `observation.canObserve`; a storage error.
pub async fn replay(
    router: RouterHandle,
    conn: ConnId,
    p: ReplayParams,
) -> Result<ReplayResult, RouterError> {
    let limit = match p.limit {
        Some(0) => {
            return Err(RouterError::InvalidParams(
                "limit must be at least 1".into(),
            ))
        }
        Some(l) => l.min(MAX_REPLAY_PAGE),
        None => DEFAULT_REPLAY_PAGE,
    } as usize;
    let filter = Arc::new(compile(p.filter.as_ref())?);
    let after_id = p
        .after_event_id
        .as_deref()
        .map(|id| parse_event_id(id, "afterEventId"))
        .transpose()?;
    let oldest = router
        .call(conn, Some(Capability::CanObserve), true, |r, _| {
            r.sync_committed();
            Ok(r.bus.oldest_retained())
        })
        .await?;
    let mut cursor = match (after_id, p.from_timestamp) {
        (Some(id), _) => resolve(&router, conn, Position::AfterId(id)).await?,
        (None, Some(ts)) => resolve(&router, conn, Position::AtTime(ts)).await?,
        (None, None) => oldest,
    };
    let gap = match (after_id, p.from_timestamp) {
        (Some(id), _) => lost_from(&router, conn, Position::AfterId(id), cursor).await?,
        (None, Some(ts)) => lost_from(&router, conn, Position::AtTime(ts), cursor).await?,
        (None, None) => false,
    };
    let unknown = match after_id {
        Some(id) if !gap => !id_known(&router, conn, id, cursor).await?,
        _ => false,
    };
    let to = p.to_timestamp;
    let mut page: Vec<RawReplayedEvent> = Vec::new();
    let mut total: u64 = 0;
    let mut examined: u64 = 0;
    let mut counted_all = false;
    loop {
        let chunk = scan_step(&router, conn, &filter, cursor, to, render_replayed).await?;
        examined += chunk.examined;
        for entry in chunk.matched {
            total += 1;
            if page.len() < limit {
                let raw = serde_json::value::RawValue::from_string(entry)
                    .map_err(|e| RouterError::Storage(format!("corrupt event: {e}")))?;
                page.push(RawReplayedEvent(raw));
            }
        }
        cursor = chunk.next;
        if chunk.end {
            counted_all = true;
            break;
        }
        if total > limit as u64 && examined >= REPLAY_COUNT_BUDGET {
            break;
        }
    }
    Ok(ReplayResult {
        has_more: total > page.len() as u64,
        events: page,
        total_count: counted_all.then_some(total),
        gap: gap.then_some(true),
        unknown_event_id: unknown.then_some(true),
    })
}

impl Router {
    /// The sequence number of a position if the memory window decides it; `None` when only
    /// the store can (the position is older than the window and a store exists).
    pub(crate) fn memory_position(&self, pos: Position) -> Option<u64> {
        let log = &self.bus.log;
        let seq = match pos {
            Position::AfterId(id) => log.seq_after(id),
            Position::AtTime(ts) => log.seq_at_or_after_time(ts),
        };
        // The window decides, unless the answer is its very first event while the store still
        // holds older ones (the position may be among them).
        let store_has_older = self.store.is_some() && self.bus.oldest_retained() < log.first_seq();
        (seq > log.first_seq() || !store_has_older).then_some(seq)
    }

    /// Brings the visible head up to what the store has committed. Under read-committed
    /// delivery the router hears of commits through `Command::Committed`, which can arrive
    /// after the answer to a call whose events that commit holds; a replay sent after such an
    /// answer must show them (a client reads its own writes).
    pub(crate) fn sync_committed(&mut self) {
        if let Some(store) = &self.store {
            let upto = *store.committed().borrow();
            let (bus, agents) = self.bus_and_agents();
            bus.committed(upto, agents);
        }
    }

    /// Creates a pending subscription starting at `start` (default: the head).
    pub(crate) fn subscribe_at(
        &mut self,
        ctx: &Ctx,
        p: SubscribeParams,
        start: Option<u64>,
    ) -> Result<SubscribeResult, RouterError> {
        let caller = self.caller(ctx)?;
        self.check_subscription_quota(ctx)?;
        let filter = compile(p.filter.as_ref())?;
        let head = self.bus.log.next_seq();
        let start = start.map_or(head, |s| s.min(head));
        let outbox = self
            .conns
            .get(&ctx.conn)
            .map(|c| c.outbox().clone())
            .ok_or(RouterError::Unavailable)?;
        let options = p.options.unwrap_or_default();
        let id = SubscriptionId::generate();
        self.bus.insert(Subscription {
            id: id.clone(),
            session: caller.session.clone(),
            conn: ctx.conn,
            participant: caller.participant.clone(),
            participant_type: caller.kind,
            agent: caller.primary_agent.clone(),
            principal: caller.principal.clone(),
            policy: caller.policy.clone(),
            filter,
            exclude_own: options.exclude_own_events.unwrap_or(false),
            cursor: start,
            start,
            sequence: 0,
            acked: 0,
            window: options.ack_window.filter(|w| *w > 0),
            overflow: options.on_overflow.unwrap_or_default(),
            disk_pending: false,
            disk_failures: 0,
            overflows: 0,
            state: SubState::Pending,
            outbox,
        });
        Ok(SubscribeResult {
            subscription_id: id,
            unknown_event_id: None,
        })
    }

    /// `map/unsubscribe`. Idempotent: an unknown id (or another session's) is `unsubscribed:
    /// false`, not an error.
    pub fn handle_unsubscribe(
        &mut self,
        ctx: &Ctx,
        p: UnsubscribeParams,
    ) -> Result<UnsubscribeResult, RouterError> {
        let caller = self.caller(ctx)?;
        let mine = self
            .bus
            .get(&p.subscription_id)
            .is_some_and(|s| s.session == caller.session);
        let unsubscribed = mine && self.bus.remove(&p.subscription_id).is_some();
        Ok(UnsubscribeResult {
            unsubscribed,
            subscription: ClosedSubscription {
                id: p.subscription_id,
                closed_at: now_ms(),
            },
        })
    }

    /// `map/subscribe.ack` (a notification): cumulative acknowledgement; enters credit mode.
    pub fn handle_ack(&mut self, conn: ConnId, subscription: &SubscriptionId, up_to: u64) {
        let (bus, agents) = self.bus_and_agents();
        bus.ack(conn, subscription, up_to, DEFAULT_ACK_WINDOW, agents);
    }

    /// A probe subscription with the caller's identity, for replay filtering.
    fn probe(&self, ctx: &Ctx, filter: &CompiledFilter) -> Result<Subscription, RouterError> {
        let caller = self.caller(ctx)?;
        Ok(Subscription {
            id: SubscriptionId::from("replay"),
            session: caller.session,
            conn: ctx.conn,
            participant: caller.participant,
            participant_type: caller.kind,
            agent: caller.primary_agent,
            principal: caller.principal,
            policy: caller.policy,
            filter: filter.clone(),
            exclude_own: false,
            cursor: 0,
            start: 0,
            sequence: 0,
            acked: 0,
            window: None,
            overflow: OverflowPolicy::Skip,
            disk_pending: false,
            disk_failures: 0,
            overflows: 0,
            state: SubState::Paused,
            outbox: self
                .conns
                .get(&ctx.conn)
                .map(|c| c.outbox().clone())
                .ok_or(RouterError::Unavailable)?,
        })
    }

    /// One replay step over the memory window from `from`; `None` when `from` is before it and
    /// a store holds it.
    fn replay_memory_chunk(
        &self,
        ctx: &Ctx,
        filter: &CompiledFilter,
        from: u64,
        to: Option<u64>,
        render: Render,
    ) -> Option<Chunk> {
        let log = &self.bus.log;
        if let Lookup::Evicted = log.get(from) {
            if self.store.is_some() && from >= self.bus.oldest_retained() {
                return None;
            }
        }
        let probe = self.probe(ctx, filter).ok()?;
        let start = from.max(log.first_seq());
        let mut chunk = Chunk {
            matched: Vec::new(),
            examined: 0,
            next: start,
            end: false,
        };
        let head = self.bus.visible_head();
        for rec in log
            .iter_from(start)
            .take(REPLAY_CHUNK)
            .take_while(|r| r.seq < head)
        {
            if to.is_some_and(|to| rec.timestamp > to) {
                chunk.end = true;
                return Some(chunk);
            }
            chunk.examined += 1;
            chunk.next = rec.seq + 1;
            if EventBus::admits(&probe, rec, self.agent_view()) {
                chunk.matched.push(render(rec));
            }
        }
        chunk.end = chunk.next >= head;
        Some(chunk)
    }

    /// One replay step over rows read from the store.
    fn replay_rows(
        &self,
        ctx: &Ctx,
        filter: &CompiledFilter,
        rows: Vec<StoredRow>,
        from: u64,
        to: Option<u64>,
        render: Render,
    ) -> Chunk {
        let mut chunk = Chunk {
            matched: Vec::new(),
            examined: 0,
            // Rows may start later than asked (retention); none left means the memory window.
            next: rows
                .first()
                .map_or(self.bus.log.first_seq().max(from), |r| r.seq),
            end: false,
        };
        let Ok(probe) = self.probe(ctx, filter) else {
            chunk.end = true;
            return chunk;
        };
        for row in rows {
            let seq = row.seq;
            let rec = match EventRecord::from_row(row) {
                Ok(rec) => rec,
                Err(e) => {
                    tracing::warn!(seq, error = %e, "skipping an unreadable stored event in replay");
                    chunk.next = seq + 1;
                    continue;
                }
            };
            if to.is_some_and(|to| rec.timestamp > to) {
                chunk.end = true;
                return chunk;
            }
            chunk.examined += 1;
            chunk.next = seq + 1;
            if EventBus::admits(&probe, &rec, self.agent_view()) {
                chunk.matched.push(render(&rec));
            }
        }
        chunk.end = chunk.next >= self.bus.visible_head();
        chunk
    }
}
