//! The reads of the mail extension that go through many rows: `mail/list` (pages through the
//! store's `conversations`, through its membership index for anyone who does not read every
//! conversation), and every
//! read of turns (`mail/get` with recent turns or stats, `mail/join`'s catch-up,
//! `mail/turns/list`, `mail/summary`, `mail/replay`), which page through the `turns` table.
//! Each is an asynchronous method: one router step to check the caller and take the
//! conversation as it is, then chunks read on the store's threads, each filtered on the router
//! task with that conversation (`sees_turn`), never the whole history in memory.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use crate::protocol::capabilities::Capability;
use crate::protocol::methods::mail::*;
use crate::router::error::RouterError;
use crate::router::handle::RouterHandle;
use crate::router::ids::ConnId;
use crate::router::kept::ops::{paged_read, read_one, rows, settle};
use crate::router::mail::access::{
    sees_turn, thread_not_found, Identities, DEFAULT_PAGE, DEFAULT_REPLAY, MAX_PAGE, SCAN_CHUNK,
};
use crate::router::mail::ops::{CatchUpFrom, Joined};
use crate::router::mail::table::{turn_of_row, Conv};
use crate::router::page::{scan_page, take_page};
use crate::store::kept::{KeptAnswer, KeptQuery, PageQuery};

/// The capability of the methods that read a conversation's history.
const HISTORY: Option<Capability> = Some(Capability::CanViewConversationHistory);
/// The capability of `mail/join` (its catch-up too).
const JOIN: Option<Capability> = Some(Capability::CanJoinConversations);

/// The caller's identities and the conversation `id` if it may see it (loading it first when
/// it is not in memory).
async fn visible(
    router: &RouterHandle,
    conn: ConnId,
    capability: Option<Capability>,
    id: String,
    turns: Vec<String>,
) -> Result<(Arc<Conv>, Arc<Identities>), RouterError> {
    paged_read(router, conn, capability, move |r, ctx| {
        let caller = r.caller(ctx)?;
        let who = r.identities(&caller);
        let turns: Vec<&str> = turns.iter().map(String::as_str).collect();
        r.need_mail(Some(&id), &turns)?;
        let conv = r.readable_conv(&who, &id)?;
        Ok((conv, Arc::new(who)))
    })
    .await
}

/// The position just before the first turn of `conv` at or after `ts` (`Err(())`: there is
/// none).
async fn seq_at(
    router: &RouterHandle,
    conv: &str,
    ts: u64,
) -> Result<Result<Option<u64>, ()>, RouterError> {
    match read_one(
        router,
        KeptQuery::TurnSeqAt {
            conversation: conv.to_owned(),
            ts,
        },
    )
    .await?
    {
        KeptAnswer::Seq(Some(seq)) => Ok(Ok(seq.checked_sub(1))),
        _ => Ok(Err(())),
    }
}

/// Feeds `sink` the turns of `conv` between two positions (exclusive), oldest first (or newest
/// first), that pass `keep` and that `who` may read, until `sink` says stop or there are no
/// more. Reads the store a chunk at a time; each chunk is filtered on the router task with the
/// conversation as the call found it.
#[allow(clippy::too_many_arguments)]
async fn scan_turns(
    router: &RouterHandle,
    conn: ConnId,
    capability: Option<Capability>,
    conv: &Arc<Conv>,
    who: &Arc<Identities>,
    mut after: Option<u64>,
    mut before: Option<u64>,
    desc: bool,
    keep: Arc<dyn Fn(&Turn) -> bool + Send + Sync>,
    mut sink: impl FnMut(Turn) -> bool,
) -> Result<(), RouterError> {
    loop {
        let rows = rows(
            read_one(
                router,
                KeptQuery::Page(PageQuery::Turns {
                    conversation: conv.conversation.id.clone(),
                    after_seq: after,
                    before_seq: before,
                    desc,
                    limit: SCAN_CHUNK,
                }),
            )
            .await?,
        );
        let end = rows.len() < SCAN_CHUNK;
        let Some(last) = rows.last().map(|r| r.row.seq) else {
            return Ok(());
        };
        let (c, w, k) = (conv.clone(), who.clone(), keep.clone());
        let turns = router
            .call(conn, capability, true, move |_, _| {
                Ok(rows
                    .iter()
                    .filter_map(|r| match turn_of_row(&r.row) {
                        Ok(t) => Some(t),
                        Err(e) => {
                            tracing::warn!(error = %e, "skipping a stored turn this version cannot read");
                            None
                        }
                    })
                    .filter(|t| k(t) && sees_turn(&c, &w, t))
                    .collect::<Vec<Turn>>())
            })
            .await?;
        for t in turns {
            if !sink(t) {
                return Ok(());
            }
        }
        if end {
            return Ok(());
        }
        if desc {
            before = Some(last);
        } else {
            after = Some(last);
        }
    }
}

/// `mail/get`: the conversation, and with `include` its participants, threads, most recent
/// turns and counts (both read from the store).
///
/// # Errors
/// `10000` for an unknown conversation or one the caller does not take part in.
pub async fn get(
    router: RouterHandle,
    conn: ConnId,
    p: GetParams,
) -> Result<GetResult, RouterError> {
    let include = p.include.unwrap_or_default();
    let (conv, who) = visible(&router, conn, HISTORY, p.conversation_id, Vec::new()).await?;
    let all: Arc<dyn Fn(&Turn) -> bool + Send + Sync> = Arc::new(|_| true);
    if include.recent_turns.is_some() || include.stats {
        settle(&router, conn, HISTORY).await?;
    }
    let recent_turns = match include.recent_turns {
        Some(n) => {
            let n = n.min(MAX_PAGE) as usize;
            let mut recent = Vec::with_capacity(n);
            if n > 0 {
                scan_turns(
                    &router,
                    conn,
                    HISTORY,
                    &conv,
                    &who,
                    None,
                    None,
                    true,
                    all.clone(),
                    |t| {
                        recent.push(t);
                        recent.len() < n
                    },
                )
                .await?;
            }
            recent.reverse();
            Some(recent)
        }
        None => None,
    };
    let stats = if include.stats {
        let mut by_type: BTreeMap<String, u64> = BTreeMap::new();
        let mut total = 0u64;
        scan_turns(
            &router,
            conn,
            HISTORY,
            &conv,
            &who,
            None,
            None,
            false,
            all,
            |t| {
                total += 1;
                *by_type.entry(t.content_type).or_insert(0) += 1;
                true
            },
        )
        .await?;
        Some(Stats {
            total_turns: total,
            turns_by_content_type: by_type,
            active_participants: conv.conversation.participant_count,
            thread_count: conv.threads.len() as u32,
        })
    } else {
        None
    };
    Ok(GetResult {
        conversation: conv.conversation.clone(),
        participants: include.participants.then(|| conv.participants.clone()),
        threads: include.threads.then(|| conv.threads()),
        recent_turns,
        stats,
    })
}

/// `mail/list`: the conversations the caller takes part in (all, for a system participant or
/// a system principal's session), in creation order. Pages through the store's
/// `conversations` table (through its membership index for anyone else), a chunk at a time.
///
/// # Errors
/// `InvalidParams` for a cursor that names no conversation the caller may see.
pub async fn list(
    router: RouterHandle,
    conn: ConnId,
    p: ListParams,
) -> Result<ListResult, RouterError> {
    let limit = p.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE) as usize;
    let f = p.filter.unwrap_or_default();
    let cursor = p.cursor;
    let (who, after) = paged_read(&router, conn, HISTORY, move |r, ctx| {
        let caller = r.caller(ctx)?;
        let who = r.identities(&caller);
        let after = match &cursor {
            Some(c) => match r.readable_conv(&who, c) {
                Ok(conv) => Some((conv.conversation.created_at, conv.conversation.id.clone())),
                Err(RouterError::NeedsLoad(n)) => return Err(RouterError::NeedsLoad(n)),
                Err(_) => return Err(RouterError::InvalidParams(format!("unknown cursor {c:?}"))),
            },
            None => None,
        };
        Ok((Arc::new(who), after))
    })
    .await?;
    settle(&router, conn, HISTORY).await?;
    let chunk = (limit + 1).clamp(64, SCAN_CHUNK);
    let members = (!who.reads_all).then(|| who.all.clone());
    let page = scan_page(
        after,
        limit,
        |after| {
            let (router, w, filter) = (&router, who.clone(), f.clone());
            let query = KeptQuery::Page(PageQuery::Conversations {
                after,
                members: members.clone(),
                limit: chunk,
            });
            async move {
                let rows = rows(read_one(router, query).await?);
                let end = rows.len() < chunk;
                let (picked, last) = router
                    .call(conn, HISTORY, true, move |r, _| {
                        Ok(r.pick_conversations(&w, rows, &filter))
                    })
                    .await?;
                Ok((picked, last, end))
            }
        },
        |c: &Conversation| c.id.clone(),
    )
    .await?;
    Ok(ListResult {
        conversations: page.items,
        has_more: page.has_more,
        next_cursor: page.next_cursor,
    })
}

/// `mail/join`: (re)joins a conversation the caller took part in (system participants:
/// any), optionally with the history since a point (read from the store).
///
/// # Errors
/// `10000`; `10001` when closed; `10007` when already in it.
pub async fn join(
    router: RouterHandle,
    conn: ConnId,
    p: JoinParams,
) -> Result<JoinResult, RouterError> {
    let catch_up = p.catch_up.clone();
    let joined = paged_read(&router, conn, JOIN, move |r, ctx| r.join_step(ctx, &p)).await?;
    let Joined {
        conv,
        who,
        participant,
        from,
    } = joined;
    let who = Arc::new(who);
    let (history, history_cursor, summary) = match catch_up {
        None => (None, None, None),
        Some(cu) => {
            let limit = cu.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE) as usize;
            settle(&router, conn, JOIN).await?;
            let after = match from {
                CatchUpFrom::After(seq) => Ok(seq),
                CatchUpFrom::Time(ts) => seq_at(&router, &conv.conversation.id, ts).await?,
            };
            let mut turns = Vec::new();
            if let Ok(after) = after {
                scan_turns(
                    &router,
                    conn,
                    JOIN,
                    &conv,
                    &who,
                    after,
                    None,
                    false,
                    Arc::new(|_| true),
                    |t| {
                        turns.push(t);
                        turns.len() <= limit
                    },
                )
                .await?;
            }
            let page = take_page(turns.into_iter(), limit, |t| t.id.clone());
            let summary = cu.include_summary.then(|| {
                let mut s = Summary::default();
                for t in &page.items {
                    s.add(t);
                }
                s.render(&conv)
            });
            (Some(page.items), page.next_cursor, summary)
        }
    };
    Ok(JoinResult {
        conversation: conv.conversation.clone(),
        participant,
        history,
        history_cursor,
        summary,
    })
}

/// `mail/turns/list`: the turns the caller may read, oldest first (or newest first), read from
/// the store a chunk at a time.
///
/// # Errors
/// `10000`; `10004` for an unknown `afterTurnId`, `beforeTurnId` or cursor.
pub async fn turns_list(
    router: RouterHandle,
    conn: ConnId,
    p: TurnsListParams,
) -> Result<TurnsPage, RouterError> {
    let f = p.filter.unwrap_or_default();
    let limit = p.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE) as usize;
    let desc = p.order == Some(Order::Desc);
    let id = p.conversation_id;
    let (after_id, before_id, cursor) =
        (f.after_turn_id.clone(), f.before_turn_id.clone(), p.cursor);
    let (conv, who, after, before) = paged_read(&router, conn, HISTORY, move |r, ctx| {
        let caller = r.caller(ctx)?;
        let who = r.identities(&caller);
        let named: Vec<&str> = [&after_id, &before_id, &cursor]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        r.need_mail(Some(&id), &named)?;
        let conv = r.readable_conv(&who, &id)?;
        let mut after = match &after_id {
            Some(a) => Some(r.turn_seq(&id, a)?),
            None => None,
        };
        let mut before = match &before_id {
            Some(b) => Some(r.turn_seq(&id, b)?),
            None => None,
        };
        if let Some(c) = &cursor {
            let at = r.turn_seq(&id, c)?;
            if desc {
                before = Some(before.map_or(at, |b| b.min(at)));
            } else {
                after = Some(after.map_or(at, |a| a.max(at)));
            }
        }
        Ok((conv, Arc::new(who), after, before))
    })
    .await?;
    settle(&router, conn, HISTORY).await?;
    let keep: Arc<dyn Fn(&Turn) -> bool + Send + Sync> = Arc::new(move |t: &Turn| {
        f.thread_id
            .as_ref()
            .is_none_or(|th| t.thread_id.as_ref() == Some(th))
            && f.content_types
                .as_ref()
                .is_none_or(|c| c.is_empty() || c.contains(&t.content_type))
            && f.participant_id
                .as_ref()
                .is_none_or(|pid| t.participant == *pid)
            && f.after_timestamp.is_none_or(|ts| t.timestamp > ts)
            && f.before_timestamp.is_none_or(|ts| t.timestamp < ts)
    });
    let mut turns = Vec::new();
    scan_turns(
        &router,
        conn,
        HISTORY,
        &conv,
        &who,
        after,
        before,
        desc,
        keep,
        |t| {
            turns.push(t);
            turns.len() <= limit
        },
    )
    .await?;
    let page = take_page(turns.into_iter(), limit, |t| t.id.clone());
    Ok(TurnsPage {
        turns: page.items,
        has_more: page.has_more,
        next_cursor: page.next_cursor,
    })
}

/// `mail/summary`: an extractive summary (no language model): subject, counts, who spoke,
/// and the last text turns, over the turns read from the store.
///
/// # Errors
/// `10000`; `10004` / `10005` for an unknown turn or thread in `scope`.
pub async fn summary(
    router: RouterHandle,
    conn: ConnId,
    p: SummaryParams,
) -> Result<SummaryResult, RouterError> {
    let scope = p.scope.unwrap_or_default();
    let id = p.conversation_id;
    let (from_id, to_id, thread) = (
        scope.from_turn_id.clone(),
        scope.to_turn_id.clone(),
        scope.thread_id.clone(),
    );
    let (conv, who, after, before) = paged_read(&router, conn, HISTORY, move |r, ctx| {
        let caller = r.caller(ctx)?;
        let who = r.identities(&caller);
        let named: Vec<&str> = [&from_id, &to_id]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        r.need_mail(Some(&id), &named)?;
        let conv = r.readable_conv(&who, &id)?;
        // Both ends are included.
        let after = match &from_id {
            Some(t) => r.turn_seq(&id, t)?.checked_sub(1),
            None => None,
        };
        let before = match &to_id {
            Some(t) => Some(r.turn_seq(&id, t)? + 1),
            None => None,
        };
        if let Some(th) = &thread {
            if conv.thread(th).is_none() {
                return Err(thread_not_found(th));
            }
        }
        Ok((conv, Arc::new(who), after, before))
    })
    .await?;
    settle(&router, conn, HISTORY).await?;
    let thread = scope.thread_id;
    let keep: Arc<dyn Fn(&Turn) -> bool + Send + Sync> = Arc::new(move |t: &Turn| {
        thread
            .as_ref()
            .is_none_or(|th| t.thread_id.as_ref() == Some(th))
    });
    let mut s = Summary::default();
    scan_turns(
        &router,
        conn,
        HISTORY,
        &conv,
        &who,
        after,
        before,
        false,
        keep,
        |t| {
            s.add(&t);
            true
        },
    )
    .await?;
    Ok(SummaryResult {
        summary: s.render(&conv),
        generated: true,
    })
}

/// `mail/replay`: the turns from a point (after `fromTurnId`, or from `fromTimestamp`),
/// with how many there are in all.
///
/// # Errors
/// `10000`; `10004` for an unknown `fromTurnId`.
pub async fn replay(
    router: RouterHandle,
    conn: ConnId,
    p: ReplayParams,
) -> Result<ReplayResult, RouterError> {
    let limit = p.limit.unwrap_or(DEFAULT_REPLAY).clamp(1, MAX_PAGE) as usize;
    let id = p.conversation_id.clone();
    let from_turn = p.from_turn_id.clone();
    let (conv, who, from) = paged_read(&router, conn, HISTORY, move |r, ctx| {
        let caller = r.caller(ctx)?;
        let who = r.identities(&caller);
        r.need_mail(Some(&id), from_turn.as_deref().as_slice())?;
        let conv = r.readable_conv(&who, &id)?;
        let from = match &from_turn {
            Some(t) => Some(r.turn_seq(&id, t)?),
            None => None,
        };
        Ok((conv, Arc::new(who), from))
    })
    .await?;
    settle(&router, conn, HISTORY).await?;
    let after = match (from, p.from_timestamp) {
        (Some(seq), _) => Ok(Some(seq)),
        (None, Some(ts)) => seq_at(&router, &conv.conversation.id, ts).await?,
        (None, None) => Ok(None),
    };
    let (thread, types) = (p.thread_id, p.content_types);
    let keep: Arc<dyn Fn(&Turn) -> bool + Send + Sync> = Arc::new(move |t: &Turn| {
        thread
            .as_ref()
            .is_none_or(|th| t.thread_id.as_ref() == Some(th))
            && types
                .as_ref()
                .is_none_or(|c| c.is_empty() || c.contains(&t.content_type))
    });
    let mut turns = Vec::new();
    let mut missed = 0u64;
    if let Ok(after) = after {
        scan_turns(
            &router,
            conn,
            HISTORY,
            &conv,
            &who,
            after,
            None,
            false,
            keep,
            |t| {
                missed += 1;
                if turns.len() < limit {
                    turns.push(t);
                }
                true
            },
        )
        .await?;
    }
    let has_more = missed > limit as u64;
    Ok(ReplayResult {
        next_cursor: if has_more {
            turns.last().map(|t| t.id.clone())
        } else {
            None
        },
        has_more,
        missed_count: missed,
        turns,
    })
}

/// An extractive summary, built one turn at a time: how many, who spoke (in order of first
/// turn), and the last three text turns.
#[derive(Debug, Default)]
struct Summary {
    turns: usize,
    authors: Vec<String>,
    texts: VecDeque<(String, String)>,
}

impl Summary {
    fn add(&mut self, t: &Turn) {
        self.turns += 1;
        if !self.authors.contains(&t.participant) {
            self.authors.push(t.participant.clone());
        }
        if t.content_type == "text" {
            if let Ok(text) = serde_json::from_str::<String>(t.content.get()) {
                self.texts.push_back((t.participant.clone(), text));
                if self.texts.len() > 3 {
                    self.texts.pop_front();
                }
            }
        }
    }

    fn render(&self, conv: &Conv) -> String {
        use std::fmt::Write as _;
        let c = &conv.conversation;
        let mut s = String::new();
        if let Some(subject) = &c.subject {
            let _ = write!(s, "{subject}. ");
        }
        let (n, a) = (self.turns, self.authors.len());
        let _ = write!(
            s,
            "{} turn{} by {} participant{}",
            n,
            if n == 1 { "" } else { "s" },
            a,
            if a == 1 { "" } else { "s" }
        );
        if a > 0 {
            let _ = write!(s, " ({})", self.authors.join(", "));
        }
        s.push('.');
        for (who, text) in &self.texts {
            let short: String = text.chars().take(200).collect();
            let more = if short.len() < text.len() { "…" } else { "" };
            let _ = write!(s, " {who}: {short}{more}");
        }
        s
    }
}
