//! `map/subscribe`, `map/unsubscribe` and `map/replay`.
//!
//! A new subscription starts `Pending` at the head of the log (or, with `replayFrom` /
//! `startAfter`, at an earlier retained position) and is activated by the session once its
//! response is queued, so the response always precedes the first `map/event`. Replay reads the
//! retained log with the same filter and visibility rules as live delivery.

use crate::protocol::event::SubscriptionFilter;
use crate::protocol::ids::{now_ms, EventId, SubscriptionId};
use crate::protocol::methods::events::*;

use super::events::filter::CompiledFilter;
use super::events::log::push_id_array;
use super::events::{EventBus, SubState, Subscription};
use super::{Ctx, Router, RouterError};

/// Most events one `map/replay` page returns.
pub const MAX_REPLAY_PAGE: u32 = 1000;
/// Page size when `limit` is absent.
pub const DEFAULT_REPLAY_PAGE: u32 = 100;

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

impl Router {
    /// `map/subscribe`.
    pub fn handle_subscribe(
        &mut self,
        ctx: &Ctx,
        p: SubscribeParams,
    ) -> Result<SubscribeResult, RouterError> {
        let caller = self.caller(ctx)?;
        let filter = compile(p.filter.as_ref())?;
        let log = &self.bus.log;
        let start = match (&p.replay_from, &p.start_after) {
            (Some(serde_json::Value::String(id)), _) => {
                log.seq_after(parse_event_id(id, "replayFrom")?)
            }
            (Some(serde_json::Value::Number(n)), _) => {
                let ts = n.as_u64().ok_or_else(|| {
                    RouterError::InvalidParams(
                        "replayFrom must be an event id or a Unix-ms timestamp".into(),
                    )
                })?;
                log.seq_at_or_after_time(ts)
            }
            (Some(serde_json::Value::Null) | None, Some(id)) => {
                log.seq_after(parse_event_id(id, "startAfter")?)
            }
            (Some(serde_json::Value::Null) | None, None) => log.next_seq(),
            (Some(_), _) => {
                return Err(RouterError::InvalidParams(
                    "replayFrom must be an event id or a Unix-ms timestamp".into(),
                ))
            }
        };
        let outbox = self
            .conns
            .get(&ctx.conn)
            .map(|c| c.outbox.clone())
            .ok_or(RouterError::Unavailable)?;
        let id = SubscriptionId::generate();
        self.bus.insert(Subscription {
            id: id.clone(),
            session: caller.session.clone(),
            conn: ctx.conn,
            participant: caller.participant.clone(),
            participant_type: caller.kind,
            filter,
            exclude_own: p
                .options
                .as_ref()
                .and_then(|o| o.exclude_own_events)
                .unwrap_or(false),
            cursor: start,
            start,
            sequence: 0,
            state: SubState::Pending,
            outbox,
        });
        Ok(SubscribeResult {
            subscription_id: id,
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
            .get(p.subscription_id.as_str())
            .is_some_and(|s| s.session == caller.session);
        let unsubscribed = mine && self.bus.remove(p.subscription_id.as_str()).is_some();
        Ok(UnsubscribeResult {
            unsubscribed,
            subscription: ClosedSubscription {
                id: p.subscription_id,
                closed_at: now_ms(),
            },
        })
    }

    /// `map/replay`.
    pub fn handle_replay(
        &mut self,
        ctx: &Ctx,
        p: ReplayParams,
    ) -> Result<ReplayResult, RouterError> {
        let caller = self.caller(ctx)?;
        let limit = match p.limit {
            Some(0) => {
                return Err(RouterError::InvalidParams(
                    "limit must be at least 1".into(),
                ))
            }
            Some(l) => l.min(MAX_REPLAY_PAGE),
            None => DEFAULT_REPLAY_PAGE,
        } as usize;
        let filter = compile(p.filter.as_ref())?;
        let log = &self.bus.log;
        let mut gap = None;
        let start = match (&p.after_event_id, p.from_timestamp) {
            (Some(id), _) => {
                let id = parse_event_id(id, "afterEventId")?;
                let start = log.seq_after(id);
                if start == log.first_seq() && log.first_seq() > 0 {
                    // The id is older than everything retained: some events after it are gone.
                    gap = log.oldest_id().map(|oldest| oldest > id);
                }
                start
            }
            (None, Some(ts)) => log.seq_at_or_after_time(ts),
            (None, None) => log.first_seq(),
        };
        // A probe subscription gives replay the exact rules of live delivery.
        let probe = Subscription {
            id: SubscriptionId::from("replay"),
            session: caller.session.clone(),
            conn: ctx.conn,
            participant: caller.participant.clone(),
            participant_type: caller.kind,
            filter,
            exclude_own: false,
            cursor: start,
            start,
            sequence: 0,
            state: SubState::Paused,
            outbox: self
                .conns
                .get(&ctx.conn)
                .map(|c| c.outbox.clone())
                .ok_or(RouterError::Unavailable)?,
        };
        let mut events = Vec::new();
        let mut total: u64 = 0;
        for rec in log.iter_from(start) {
            if p.to_timestamp.is_some_and(|to| rec.timestamp > to) {
                break;
            }
            if !EventBus::admits(&probe, rec, &self.registry) {
                continue;
            }
            total += 1;
            if events.len() < limit {
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
                let raw = serde_json::value::RawValue::from_string(s)
                    .map_err(|e| RouterError::InvalidRequest(format!("corrupt log record: {e}")))?;
                events.push(RawReplayedEvent(raw));
            }
        }
        Ok(ReplayResult {
            has_more: total > events.len() as u64,
            events,
            total_count: total,
            gap: gap.filter(|g| *g),
        })
    }
}
