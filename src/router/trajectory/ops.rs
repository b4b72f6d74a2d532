//! Handlers of the trajectory extension: report and get (one router step on the cached
//! checkpoint, loaded first when it is not in memory: `router::kept`), list (an asynchronous
//! method that pages through the store's `checkpoints` table, filtering each chunk on the
//! router task), and content (asked of the agent).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use sha2::Digest as _;
use tokio::sync::oneshot;

use crate::protocol::capabilities::{Capability, ParticipantType};
use crate::protocol::event::EventType;
use crate::protocol::ids::now_ms;
use crate::protocol::json::RawJson;
use crate::protocol::methods::trajectory::{
    notifications, Checkpoint, CheckpointParams, CheckpointResult, Content, ContentChunk,
    ContentParams, ContentRequest, ContentResponse, ContentResult, GetParams, ListParams,
    ListResult, StreamInfo,
};
use crate::router::caller::{Caller, Ctx};
use crate::router::core::{to_json, Router};
use crate::router::error::RouterError;
use crate::router::events::log::{EventDraft, FilterKeys};
use crate::router::handle::RouterHandle;
use crate::router::ids::ConnId;
use crate::router::kept::need::Need;
use crate::router::kept::ops::{paged_read, read_one, rows, settle};
use crate::router::page::scan_page;
use crate::router::permissions;
use crate::router::quota_checks::Created;
use crate::router::trajectory::table::{entry_of_row, ContentAnswer, Entry, OrderKey};
use crate::store::kept::{KeptQuery, KeptRow, PageQuery};

/// Longest checkpoint id accepted.
pub const MAX_ID_LEN: usize = 256;
/// Default and largest `trajectory/list` page.
pub const DEFAULT_PAGE: u32 = 50;
/// Largest `trajectory/list` page.
pub const MAX_PAGE: u32 = 1000;
/// Most stored rows read per step of a listing.
pub const SCAN_CHUNK: usize = 1024;
/// How long `trajectory/content` waits for the agent's answer.
pub const CONTENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Artifacts whose JSON text adds up to more than this are not all inlined: the largest one is
/// streamed as chunks.
pub const INLINE_LIMIT: usize = 256 * 1024;
/// Bytes of artifact text per `trajectory/content.chunk` (before base64).
pub const CHUNK_BYTES: usize = 48 * 1024;

impl Router {
    /// Whether `caller` may see a checkpoint: the rule of its event (its agent's audience when
    /// it was reported, and the exposure rules for its agent id).
    fn sees_checkpoint(&self, caller: &Caller, e: &Entry) -> bool {
        permissions::can_see_event(
            &caller.viewer(),
            EventType::TrajectoryCheckpoint.as_str(),
            &e.audience,
            Some(&e.checkpoint.agent_id),
            self.agent_view(),
        )
    }

    /// A checkpoint the caller may see, else "not found" (existence does not leak);
    /// `NeedsLoad` when it is not in memory.
    fn visible_checkpoint(&mut self, caller: &Caller, id: &str) -> Result<Arc<Entry>, RouterError> {
        let entry = match self.trajectories.cache.get(id) {
            None => {
                return Err(RouterError::NeedsLoad(vec![Need::Checkpoint(
                    id.to_owned(),
                )]))
            }
            Some(e) => e.cloned(),
        };
        entry
            .filter(|e| self.sees_checkpoint(caller, e))
            .ok_or_else(|| RouterError::CheckpointNotFound(id.to_owned()))
    }

    /// `trajectory/checkpoint`: stores the checkpoint (replacing one of the same id and agent)
    /// and emits `trajectory.checkpoint`.
    ///
    /// # Errors
    /// `InvalidParams` for an empty or overlong id or no agent; `AgentNotFound` for an agent
    /// that is not registered (or not visible); `TrajectoryDenied` (13004) for an agent the
    /// caller does not own, or an id another agent's checkpoint has.
    pub fn handle_trajectory_checkpoint(
        &mut self,
        ctx: &Ctx,
        p: CheckpointParams,
    ) -> Result<CheckpointResult, RouterError> {
        let caller = self.caller(ctx)?;
        let input = p.checkpoint;
        if input.id.is_empty() || input.id.len() > MAX_ID_LEN {
            return Err(RouterError::InvalidParams(format!(
                "checkpoint.id must be 1 to {MAX_ID_LEN} bytes"
            )));
        }
        let agent_id = input
            .agent_id
            .clone()
            .or_else(|| caller.primary_agent.clone())
            .ok_or_else(|| {
                RouterError::InvalidParams(
                    "checkpoint.agentId is required (this session has no agent)".into(),
                )
            })?;
        let agent = self.visible_agent(&caller, &agent_id)?.clone();
        let owns = caller.kind == ParticipantType::System
            || self.registry.is_owned_by(&agent_id, &caller.participant);
        if !owns {
            return Err(RouterError::TrajectoryDenied(format!(
                "agent {agent_id} is not this session's: only its owner reports its checkpoints"
            )));
        }
        let owner = self.quota_owner(ctx)?;
        // Everything this needs from the store, in one load: the checkpoint it may replace,
        // and the owner's counts.
        let mut needs = self.created_needs(owner.as_deref(), Created::Checkpoints);
        let existing = match self.trajectories.cache.get(&input.id) {
            None => {
                needs.push(Need::Checkpoint(input.id.clone()));
                None
            }
            Some(e) => e.cloned(),
        };
        if !needs.is_empty() {
            return Err(RouterError::NeedsLoad(needs));
        }
        if let Some(existing) = &existing {
            if existing.checkpoint.agent_id != agent_id {
                return Err(RouterError::TrajectoryDenied(format!(
                    "checkpoint id {} belongs to another agent's checkpoint",
                    input.id
                )));
            }
        }
        let new = existing.is_none();
        if new {
            self.check_created(owner.as_deref(), Created::Checkpoints)?;
        }
        let checkpoint = Checkpoint {
            id: input.id,
            agent_id,
            timestamp: input.timestamp.unwrap_or_else(now_ms),
            label: input.label,
            session_id: input.session_id,
            metadata: input.metadata,
            meta: input.meta,
        };
        let result = CheckpointResult { checkpoint };
        let role: Option<Arc<str>> = agent.role.as_deref().map(Arc::from);
        let audience =
            permissions::agent_audience(&agent, self.agent_view(), &self.config.permissions);
        let seq = self.bus.log.next_seq();
        self.emit(EventDraft {
            kind: EventType::TrajectoryCheckpoint,
            source: Some(agent.id.as_arc().clone()),
            data: to_json(&result),
            caused_by: Vec::new(),
            keys: FilterKeys {
                agent_id: Some(agent.id.clone()),
                source_role: role.clone(),
                subject_role: role,
                metadata: result
                    .checkpoint
                    .metadata
                    .as_ref()
                    .and_then(|m| m.parse().ok())
                    .map(Arc::new),
                work_session: result.checkpoint.session_id.as_deref().map(Arc::from),
                owner: owner.as_deref().filter(|_| new).map(Arc::from),
                ..FilterKeys::default()
            },
            audience: audience.clone(),
        });
        let c = &result.checkpoint;
        self.trajectories.put(
            Entry {
                key: (c.timestamp, seq, c.id.clone()),
                checkpoint: c.clone(),
                audience,
            },
            seq,
        );
        if new {
            self.trajectories.total += 1;
            self.count_created(owner.as_deref(), Created::Checkpoints);
        }
        self.trim_kept();
        Ok(result)
    }

    /// The checkpoints of a chunk of stored rows that pass `filter` and that the caller may
    /// see, as the router has them now (a checkpoint replaced meanwhile is left for its new
    /// place in the order), and the position of the chunk's last row.
    fn pick_checkpoints(
        &self,
        ctx: &Ctx,
        rows: Vec<KeptRow>,
        filter: &crate::protocol::methods::trajectory::ListFilter,
    ) -> Result<(Vec<Checkpoint>, Option<OrderKey>), RouterError> {
        let caller = self.caller(ctx)?;
        let mut last = None;
        let mut picked = Vec::new();
        for row in rows {
            let stored = match entry_of_row(row.row) {
                Ok(e) => Arc::new(e),
                Err(e) => {
                    tracing::warn!(error = %e, "skipping a stored checkpoint this version cannot read");
                    continue;
                }
            };
            last = Some(stored.key.clone());
            let e = match self.trajectories.cache.peek(&stored.checkpoint.id) {
                Some(Some(cached)) if cached.key != stored.key => continue,
                Some(Some(cached)) => cached.clone(),
                _ => stored,
            };
            let c = &e.checkpoint;
            let admitted = filter
                .session_id
                .as_ref()
                .is_none_or(|s| c.session_id.as_ref() == Some(s))
                && self.sees_checkpoint(&caller, &e);
            if admitted {
                picked.push(c.clone());
            }
        }
        Ok((picked, last))
    }

    /// `trajectory/get`.
    ///
    /// # Errors
    /// `CheckpointNotFound` (13001) for an unknown checkpoint or one the caller may not see.
    pub fn handle_trajectory_get(
        &mut self,
        ctx: &Ctx,
        p: GetParams,
    ) -> Result<CheckpointResult, RouterError> {
        let caller = self.caller(ctx)?;
        let e = self.visible_checkpoint(&caller, &p.checkpoint_id)?;
        Ok(CheckpointResult {
            checkpoint: e.checkpoint.clone(),
        })
    }

    /// Sends `trajectory/content.request` to the checkpoint's agent; its answer goes to the
    /// sender taken from `reply` (left there when the checkpoint must be loaded first).
    fn request_content(
        &mut self,
        ctx: &Ctx,
        p: &ContentParams,
        reply: &std::sync::Mutex<Option<oneshot::Sender<ContentAnswer>>>,
    ) -> Result<String, RouterError> {
        let caller = self.caller(ctx)?;
        let e = self.visible_checkpoint(&caller, &p.checkpoint_id)?;
        let agent = &e.checkpoint.agent_id;
        let unavailable =
            |why: &str| RouterError::ContentUnavailable(format!("{}: {why}", p.checkpoint_id));
        if self.registry.get(agent).is_none() {
            return Err(unavailable(&format!(
                "agent {agent} is no longer registered"
            )));
        }
        let conn = self
            .agent_conn(agent)
            .ok_or_else(|| unavailable(&format!("agent {agent} is not connected")))?;
        let reply = crate::sync::lock(reply)
            .take()
            .ok_or(RouterError::Unavailable)?;
        let request_id = self.trajectories.await_content(conn, reply);
        let request = ContentRequest {
            request_id: request_id.clone(),
            checkpoint_id: p.checkpoint_id.clone(),
            agent_id: agent.clone(),
            include: p.include.clone(),
        };
        let frame = notification(notifications::CONTENT_REQUEST, &request);
        if !self.push_message(conn, frame.into()) {
            self.trajectories.forget(&request_id);
            return Err(unavailable(&format!(
                "agent {agent}'s connection cannot take a request now"
            )));
        }
        Ok(request_id)
    }

    /// An agent's `trajectory/content.response` (ignored unless that connection was asked).
    pub(crate) fn handle_content_response(&mut self, conn: ConnId, r: ContentResponse) {
        let answer = match (r.error, r.artifacts) {
            (Some(e), _) => Err(format!("the agent says: {e}")),
            (None, artifacts) => Ok(artifacts.unwrap_or_default()),
        };
        if !self.trajectories.answer(conn, &r.request_id, answer) {
            tracing::debug!(%conn, request = %r.request_id, "ignoring an unexpected trajectory/content.response");
        }
    }
}

/// `trajectory/content`: asks the agent, waits for its answer (bounded), and shapes it inline
/// or streaming.
///
/// # Errors
/// `CheckpointNotFound` (13001); `ContentUnavailable` (13002) when the agent is gone, refuses,
/// or does not answer within [`CONTENT_TIMEOUT`].
pub async fn content(
    router: RouterHandle,
    conn: ConnId,
    p: ContentParams,
) -> Result<ContentResult, RouterError> {
    let (tx, rx) = oneshot::channel();
    let asked = p.clone();
    let tx = std::sync::Mutex::new(Some(tx));
    let request = paged_read(
        &router,
        conn,
        Some(Capability::CanRequestTrajectoryContent),
        move |r, ctx| r.request_content(ctx, &asked, &tx),
    )
    .await?;
    let answer = match tokio::time::timeout(CONTENT_TIMEOUT, rx).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err("the router stopped waiting".into()),
        Err(_) => {
            let _ = router
                .call(conn, None, true, move |r, _| {
                    r.trajectories.forget(&request);
                    Ok(())
                })
                .await;
            Err(format!(
                "the agent did not answer within {} s",
                CONTENT_TIMEOUT.as_secs()
            ))
        }
    };
    let mut artifacts = answer
        .map_err(|why| RouterError::ContentUnavailable(format!("{}: {why}", p.checkpoint_id)))?;
    if let Some(include) = &p.include {
        artifacts.retain(|k, _| include.iter().any(|i| i == k));
    }
    Ok(shape(p.checkpoint_id, artifacts))
}

/// `trajectory/list`: newest first, only what the caller may see. Pages through the store's
/// `checkpoints` table (after the reports answered before it are committed), a chunk at a
/// time, each chunk filtered on the router task.
///
/// # Errors
/// `InvalidParams` for a cursor that names no checkpoint the caller may see; a storage error.
pub async fn list(
    router: RouterHandle,
    conn: ConnId,
    p: ListParams,
) -> Result<ListResult, RouterError> {
    const CAP: Option<Capability> = Some(Capability::CanQueryTrajectory);
    let limit = p.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE) as usize;
    let filter = p.filter.unwrap_or_default();
    let before = match p.cursor {
        Some(c) => Some(
            paged_read(&router, conn, CAP, move |r, ctx| {
                let caller = r.caller(ctx)?;
                match r.visible_checkpoint(&caller, &c) {
                    Ok(e) => Ok(e.key.clone()),
                    Err(RouterError::NeedsLoad(n)) => Err(RouterError::NeedsLoad(n)),
                    Err(_) => Err(RouterError::InvalidParams(format!("unknown cursor {c:?}"))),
                }
            })
            .await?,
        ),
        None => None,
    };
    settle(&router, conn, CAP).await?;
    let chunk = (limit + 1).clamp(64, SCAN_CHUNK);
    let agent = filter.agent_id.as_ref().map(|a| a.to_string());
    // Newest first: each chunk continues before the last key read.
    let page = scan_page(
        before,
        limit,
        |before| {
            let (router, filter) = (&router, filter.clone());
            let query = KeptQuery::Page(PageQuery::Checkpoints {
                before,
                agent: agent.clone(),
                after_ts: filter.after_timestamp,
                before_ts: filter.before_timestamp,
                limit: chunk,
            });
            async move {
                let rows = rows(read_one(router, query).await?);
                let end = rows.len() < chunk;
                let (picked, last) = router
                    .call(conn, CAP, true, move |r, ctx| {
                        r.pick_checkpoints(ctx, rows, &filter)
                    })
                    .await?;
                Ok((picked, last, end))
            }
        },
        |c: &Checkpoint| c.id.clone(),
    )
    .await?;
    Ok(ListResult {
        checkpoints: page.items,
        has_more: page.has_more,
        next_cursor: page.next_cursor,
    })
}

/// Inline when small; otherwise the largest artifact goes as chunks (after the answer).
pub fn shape(checkpoint_id: String, mut artifacts: BTreeMap<String, RawJson>) -> ContentResult {
    let total: usize = artifacts.values().map(RawJson::len).sum();
    let largest = artifacts
        .iter()
        .max_by_key(|(_, v)| v.len())
        .map(|(k, _)| k.clone());
    let streamed = match largest {
        Some(name) if total > INLINE_LIMIT => artifacts.remove_entry(&name),
        _ => None,
    };
    let Some((name, text)) = streamed else {
        return ContentResult {
            content: Content {
                checkpoint_id,
                artifacts,
                streaming: false,
                stream_id: None,
                stream_artifact: None,
                stream_info: None,
            },
            chunks: Vec::new(),
        };
    };
    let stream_id = format!("stream-{}", crate::protocol::ids::Ulid::random());
    let bytes = text.get().as_bytes();
    let pieces: Vec<&[u8]> = bytes.chunks(CHUNK_BYTES).collect();
    let checksum = hex(&sha2::Sha256::digest(bytes));
    let last = pieces.len().saturating_sub(1);
    let chunks = pieces
        .iter()
        .enumerate()
        .map(|(i, piece)| {
            notification(
                notifications::CONTENT_CHUNK,
                &ContentChunk {
                    stream_id: stream_id.clone(),
                    index: i as u64,
                    data: base64::engine::general_purpose::STANDARD.encode(piece),
                    r#final: (i == last).then_some(true),
                    checksum: (i == last).then(|| checksum.clone()),
                },
            )
        })
        .collect::<Vec<_>>();
    ContentResult {
        content: Content {
            checkpoint_id,
            artifacts,
            streaming: true,
            stream_id: Some(stream_id),
            stream_artifact: Some(name),
            stream_info: Some(StreamInfo {
                total_bytes: bytes.len() as u64,
                total_chunks: chunks.len() as u64,
                encoding: "base64".into(),
            }),
        },
        chunks,
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// A JSON-RPC notification frame.
fn notification<P: serde::Serialize>(method: &str, params: &P) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"{method}\",\"params\":{}}}",
        to_json(params)
    )
}
