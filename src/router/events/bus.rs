//! The event bus: the log, the subscriptions, and fan-out from one to the other.
//!
//! Each subscription is a cursor into the log. A subscription is in one of three states:
//! - `Pending`: created, but its `map/subscribe` response may not be on the wire yet. No event
//!   may overtake that response (the SDK drops events for ids it does not know yet), so nothing
//!   is delivered until the session activates it.
//! - `Live`: caught up; each appended event is offered to it directly.
//! - `Paused`: behind. Its outbox was full, its credit window is used up, or it was just
//!   activated. The events it has not read stay in the log, not in per-subscriber memory, and
//!   it is caught up from its cursor when the connection's writer reports room
//!   (`Command::Drained`) or the subscriber acknowledges (`map/subscribe.ack`).
//!
//! Catching up reads the in-memory window first; a cursor older than the window is read from
//! the durable store in batches (asynchronously: the rows come back as `Command::DiskRows`, so
//! the router never waits on a disk; a read that fails is tried again, later each time, and
//! never taken for a gap). Only a cursor older than everything retained is a gap:
//! the subscription gets one `subscription.overflow` notice and then follows its policy, `skip`
//! (continue live) or `close` (end the subscription). Loss is always signalled, never silent.
//!
//! Credit: a subscription that acknowledges (`map/subscribe.ack`, or `options.ackWindow` at
//! subscribe) gets a window: at most that many events unacknowledged in flight; beyond it the
//! subscription pauses until the next ack.
//!
//! Visibility is decided per delivery with `router::permissions`, so a change takes effect on
//! the next event.

use std::sync::Arc;
use std::time::Duration;

use crate::protocol::capabilities::ParticipantType;
use crate::protocol::event::{EventType, SubscriptionOverflowData};
use crate::protocol::ids::{AgentId, ParticipantId, SessionId, SubscriptionId};
use crate::store::{EventStore, StoreError};

use crate::router::events::filter::CompiledFilter;
use crate::router::events::index::SubIndex;
use crate::router::events::log::Audience;
use crate::router::events::log::EventLog;
use crate::router::events::log::EventRecord;
use crate::router::events::log::Lookup;
use crate::router::events::log::StoredRow;
use crate::router::ids::{ConnId, IdMap, Shrink};
use crate::router::outbox::push;
use crate::router::outbox::CausedBy;
use crate::router::outbox::Delivery;
use crate::router::outbox::Outbound;
use crate::router::outbox::Outbox;
use crate::router::outbox::PushError;
use crate::router::permissions::can_see_event;
use crate::router::permissions::SharedPolicy;
use crate::router::permissions::Viewer;
use crate::router::views::AgentView;

/// Rows read from the store per catch-up batch: enough to amortise a read, few enough that a
/// batch the outbox cannot take whole is cheap to re-read.
pub const DISK_BATCH: usize = 512;

/// A catch-up read the store could not answer (NATS away or slow, a disk error) is tried again
/// after this, twice as long after each failure in a row, up to [`DISK_RETRY_MAX`]. The rows
/// are still retained, so a failed read is no gap: reporting one lost events a dashboard on a
/// standby was entitled to (the cluster fault test saw 183 go after one NATS timeout).
pub const DISK_RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between two tries of a failing catch-up read.
pub const DISK_RETRY_MAX: Duration = Duration::from_secs(2);

/// Subscription state (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubState {
    /// Awaiting activation after its response is queued.
    Pending,
    /// Caught up.
    Live,
    /// Behind; waiting for room, credit, or rows from the store.
    Paused,
}

pub use crate::protocol::methods::events::OverflowPolicy;

/// One subscription.
#[derive(Debug)]
pub struct Subscription {
    /// Wire id.
    pub id: SubscriptionId,
    /// Owning session.
    pub session: SessionId,
    /// The connection it delivers to.
    pub conn: ConnId,
    /// Subscriber identity (for visibility).
    pub participant: ParticipantId,
    /// Subscriber type.
    pub participant_type: ParticipantType,
    /// The agent the subscriber speaks as (its `canSee` rules apply).
    pub agent: Option<AgentId>,
    /// The principal the subscriber authenticated as (none with authentication off).
    pub principal: Option<crate::protocol::methods::session::Principal>,
    /// The permission policy.
    pub policy: SharedPolicy,
    /// Compiled filter.
    pub filter: CompiledFilter,
    /// Skip events caused by the subscriber itself.
    pub exclude_own: bool,
    /// Next log sequence number to examine. A live subscription may lag behind the bus's
    /// position (`EventBus::live_base`): the events in between were not candidates for it in
    /// the subscription index, so its filter admits none of them.
    pub cursor: u64,
    /// First log sequence number this subscription could see.
    pub start: u64,
    /// Last `sequenceNumber` sent (0 = none yet).
    pub sequence: u64,
    /// Highest `sequenceNumber` the subscriber acknowledged.
    pub acked: u64,
    /// Credit window: at most this many unacknowledged events in flight (`None`: no credit
    /// limit, only the outbox's).
    pub window: Option<u64>,
    /// Behaviour past retention.
    pub overflow: OverflowPolicy,
    /// A store read for this subscription is in flight.
    pub disk_pending: bool,
    /// Catch-up reads that failed in a row (the next waits longer: [`DISK_RETRY_FIRST`]).
    pub disk_failures: u32,
    /// State.
    pub state: SubState,
    /// Where deliveries go.
    pub outbox: Outbox,
    /// Overflow notices sent on it (`sequence` counts every delivery).
    pub overflows: u64,
}

impl Subscription {
    fn has_credit(&self) -> bool {
        self.window
            .is_none_or(|w| self.sequence.saturating_sub(self.acked) < w)
    }
}

/// Outcome of offering one event to a subscription.
enum Offer {
    /// Delivered or filtered out; the cursor moved on.
    Advanced,
    /// The outbox is full or the credit window used up; the cursor stays.
    Full,
    /// The connection is gone; stop delivering to it.
    Gone,
}

/// Rows the store read for a subscription's catch-up, on their way back to the router task.
#[derive(Debug)]
pub struct DiskRows {
    /// The subscription.
    pub subscription: SubscriptionId,
    /// Where the read started.
    pub from: u64,
    /// The rows, or why not.
    pub rows: Result<Vec<StoredRow>, crate::store::StoreError>,
}

/// Hands [`DiskRows`] back to the router task (which then calls [`EventBus::deliver_disk`]);
/// the router's handle builds it around its command channel, so the bus knows no commands.
pub type RowsBack = Arc<dyn Fn(DiskRows) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// How the bus reaches the durable store for catch-up reads.
#[derive(Clone)]
pub struct DiskAccess {
    /// The store.
    pub store: Arc<dyn EventStore>,
    /// Where the rows go.
    pub rows_back: RowsBack,
}

impl std::fmt::Debug for DiskAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskAccess").finish_non_exhaustive()
    }
}

impl DiskAccess {
    /// Reads a batch from `from` for `subscription`, after `wait`.
    fn request(&self, subscription: SubscriptionId, from: u64, wait: Duration) {
        let store = Arc::clone(&self.store);
        let back = self.rows_back.clone();
        tokio::spawn(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            let rows = store.read(from, DISK_BATCH).await;
            back(DiskRows {
                subscription,
                from,
                rows,
            })
            .await;
        });
    }
}

/// Log + subscriptions.
#[derive(Debug)]
pub struct EventBus {
    /// The log.
    pub log: EventLog,
    subs: IdMap<SubscriptionId, Subscription>,
    /// The subscriptions by the filter field that narrows each (`router::events::index`).
    index: SubIndex,
    /// Every live subscription has examined (explicitly, or as no candidate in the index) the
    /// events below this position: its cursor is at least this. The next event offered live
    /// is normally at it; one that is not (a gap) is offered the slow way, to every live
    /// subscription.
    live_base: u64,
    disk: Option<DiskAccess>,
    /// What removed subscriptions delivered (the live ones count their own).
    retired: BusCounts,
    /// Read-committed delivery: events at or past this log position are not committed yet and
    /// are shown to no one (`None`: every appended event is deliverable at once).
    visible: Option<u64>,
}

/// Deliveries and overflow notices since start ([`EventBus::counts`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BusCounts {
    /// `map/event` notifications queued (overflow notices included).
    pub deliveries: u64,
    /// Overflow notices queued.
    pub overflows: u64,
    /// Subscriptions now pending, live and paused.
    pub by_state: [u64; 3],
}

/// Removes a subscription (and its index entries), keeping what it delivered in `retired`.
fn retire(
    subs: &mut IdMap<SubscriptionId, Subscription>,
    index: &mut SubIndex,
    retired: &mut BusCounts,
    id: &SubscriptionId,
) -> Option<Subscription> {
    let sub = subs.remove(id)?;
    index.remove(id, &sub.filter);
    subs.shrink_if_sparse();
    retired.deliveries += sub.sequence;
    retired.overflows += sub.overflows;
    Some(sub)
}

impl EventBus {
    /// A bus over a log.
    pub fn new(log: EventLog) -> Self {
        Self {
            live_base: log.next_seq(),
            log,
            subs: IdMap::default(),
            index: SubIndex::default(),
            disk: None,
            retired: BusCounts::default(),
            visible: None,
        }
    }

    /// Switches to read-committed delivery: events from `committed` on are held back until
    /// [`EventBus::committed`] reports them committed.
    pub fn deliver_committed_only(&mut self, committed: u64) {
        self.visible = Some(committed);
        self.live_base = self.live_base.min(committed);
    }

    /// One past the last event subscribers and replays may be shown: the committed position
    /// under read-committed delivery, else the log's head.
    pub fn visible_head(&self) -> u64 {
        self.visible.unwrap_or_else(|| self.log.next_seq())
    }

    /// The store committed every event below `upto`: show them to the live subscriptions, in
    /// log order (read-committed delivery; nothing to do otherwise).
    pub fn committed(&mut self, upto: u64, reg: AgentView<'_>) {
        let Some(old) = self.visible else { return };
        if upto <= old {
            return;
        }
        self.visible = Some(upto);
        for seq in old..upto {
            if let Lookup::Present(rec) = self.log.get(seq) {
                let rec = rec.clone();
                self.offer_live(&rec, reg);
            }
        }
        // NB. Only when the memory window is smaller than what a commit covers could a live
        // subscription be left behind (its event already evicted): it catches up from the store.
        self.catch_up_behind(upto, reg);
    }

    /// Catches up every live subscription whose cursor is below `upto`: from the log, the
    /// store, or (past retention) with the overflow notice and its policy. For the events a
    /// live offer can no longer reach: evicted before their commit, or (a follower) skipped
    /// by a hole in what it followed.
    pub fn catch_up_behind(&mut self, upto: u64, reg: AgentView<'_>) {
        if self.live_base >= upto {
            // Every live subscription's cursor is at least `live_base`.
            return;
        }
        let base = self.live_base;
        let behind: Vec<SubscriptionId> = self
            .subs
            .values()
            .filter(|s| s.state == SubState::Live && s.cursor.max(base) < upto)
            .map(|s| s.id.clone())
            .collect();
        for id in behind {
            if let Some(sub) = self.subs.get_mut(&id) {
                sub.state = SubState::Paused;
                sub.cursor = sub.cursor.max(base);
            }
            self.catch_up(&id, reg);
        }
    }

    /// Lets catch-up read what the memory window no longer holds from the durable store.
    pub fn set_disk(&mut self, disk: DiskAccess) {
        self.disk = Some(disk);
    }

    /// The oldest sequence number any reader can still get: the store's, else the memory
    /// window's.
    pub fn oldest_retained(&self) -> u64 {
        match &self.disk {
            Some(d) => d.store.first_seq().min(self.log.first_seq()),
            None => self.log.first_seq(),
        }
    }

    /// Number of subscriptions.
    pub fn len(&self) -> usize {
        self.subs.len()
    }

    /// Whether there are no subscriptions.
    pub fn is_empty(&self) -> bool {
        self.subs.is_empty()
    }

    /// Number of subscriptions a session holds (for the subscriptions-per-session quota).
    pub fn count_for_session(&self, session: &SessionId) -> usize {
        self.subs.values().filter(|s| &s.session == session).count()
    }

    /// Looks a subscription up.
    pub fn get(&self, id: &SubscriptionId) -> Option<&Subscription> {
        self.subs.get(id)
    }

    /// Adds a pending subscription.
    pub fn insert(&mut self, sub: Subscription) {
        if let Some(old) = self.subs.get(&sub.id) {
            self.index.remove(&old.id, &old.filter);
        }
        self.index.insert(&sub.id, &sub.filter);
        self.subs.insert(sub.id.clone(), sub);
    }

    /// Removes a subscription.
    pub fn remove(&mut self, id: &SubscriptionId) -> Option<Subscription> {
        retire(&mut self.subs, &mut self.index, &mut self.retired, id)
    }

    /// Deliveries and overflow notices since start, and subscriptions by state (computed at
    /// call time: delivering counts nothing extra).
    pub fn counts(&self) -> BusCounts {
        let mut counts = self.retired;
        counts.by_state = [0; 3];
        for sub in self.subs.values() {
            counts.deliveries += sub.sequence;
            counts.overflows += sub.overflows;
            let i = match sub.state {
                SubState::Pending => 0,
                SubState::Live => 1,
                SubState::Paused => 2,
            };
            counts.by_state[i] += 1;
        }
        counts
    }

    /// Offers a freshly appended event to every live subscription, unless delivery waits for
    /// its commit ([`EventBus::committed`] offers it then).
    pub fn publish(&mut self, rec: &Arc<EventRecord>, reg: AgentView<'_>) {
        if self.visible.is_none() {
            self.offer_live(rec, reg);
        }
    }

    /// Offers an event to every live subscription whose cursor is at it: through the index
    /// when the event is the next one at `live_base` (the live subscriptions that are no
    /// candidates move past it without being examined), else to every live subscription.
    fn offer_live(&mut self, rec: &Arc<EventRecord>, reg: AgentView<'_>) {
        let Self {
            log,
            subs,
            index,
            live_base,
            ..
        } = self;
        if rec.seq == *live_base {
            index.candidates(rec, |id| {
                let Some(sub) = subs.get_mut(id) else { return };
                if sub.state != SubState::Live || sub.cursor > rec.seq {
                    return;
                }
                sub.cursor = rec.seq;
                match offer(sub, rec, log, reg) {
                    Offer::Advanced => {}
                    Offer::Full | Offer::Gone => sub.state = SubState::Paused,
                }
            });
            *live_base = rec.seq + 1;
            return;
        }
        // A gap (or an event out of turn): every live subscription, the way without the index.
        let base = *live_base;
        let mut all_past = true;
        for sub in subs.values_mut() {
            if sub.state != SubState::Live {
                continue;
            }
            sub.cursor = sub.cursor.max(base);
            if sub.cursor == rec.seq {
                match offer(sub, rec, log, reg) {
                    Offer::Advanced => {}
                    Offer::Full | Offer::Gone => sub.state = SubState::Paused,
                }
            }
            all_past &= sub.state != SubState::Live || sub.cursor == rec.seq + 1;
        }
        // Back to the index once every live subscription is past this event.
        *live_base = if all_past { rec.seq + 1 } else { 0 };
    }

    /// Moves a pending subscription to catching up, and catches it up as far as its outbox
    /// allows.
    pub fn activate(&mut self, id: &SubscriptionId, reg: AgentView<'_>) {
        if let Some(sub) = self.subs.get_mut(id) {
            if sub.state == SubState::Pending {
                sub.state = SubState::Paused;
            }
        }
        self.catch_up(id, reg);
    }

    /// Catches every paused subscription of a connection up (its writer reported room).
    pub fn resume_conn(&mut self, conn: ConnId, reg: AgentView<'_>) {
        let ids: Vec<SubscriptionId> = self
            .subs
            .values()
            .filter(|s| s.conn == conn && s.state == SubState::Paused)
            .map(|s| s.id.clone())
            .collect();
        for id in ids {
            self.catch_up(&id, reg);
        }
    }

    /// Records an acknowledgement (`map/subscribe.ack`): the subscription enters credit mode
    /// (with `default_window` if it had none) and, if it was waiting for credit, catches up.
    /// Acks for other connections' subscriptions are ignored.
    pub fn ack(
        &mut self,
        conn: ConnId,
        id: &SubscriptionId,
        up_to: u64,
        default_window: u64,
        reg: AgentView<'_>,
    ) {
        let Some(sub) = self.subs.get_mut(id) else {
            return;
        };
        if sub.conn != conn {
            return;
        }
        sub.acked = sub.acked.max(up_to.min(sub.sequence));
        if sub.window.is_none() {
            sub.window = Some(default_window.max(1));
        }
        if sub.state == SubState::Paused {
            self.catch_up(id, reg);
        }
    }

    /// Delivers from the cursor until caught up (→ `Live`), out of credit or room (stays
    /// `Paused`), or waiting for store rows.
    fn catch_up(&mut self, id: &SubscriptionId, reg: AgentView<'_>) {
        let Self {
            log,
            subs,
            index,
            disk,
            retired,
            visible,
            ..
        } = self;
        let Some(sub) = subs.get_mut(id) else { return };
        if sub.state != SubState::Paused || sub.disk_pending {
            return;
        }
        let mut close = false;
        loop {
            if visible.is_some_and(|v| sub.cursor >= v) {
                // Caught up with what is committed; the rest comes with its commit.
                sub.state = SubState::Live;
                break;
            }
            match log.get(sub.cursor) {
                Lookup::Future => {
                    sub.state = SubState::Live;
                    break;
                }
                Lookup::Evicted => {
                    if let Some(d) = disk.as_ref() {
                        if sub.cursor >= d.store.first_seq() {
                            sub.disk_pending = true;
                            d.request(sub.id.clone(), sub.cursor, Duration::ZERO);
                            return;
                        }
                    }
                    match overflow(sub, log) {
                        Overflowed::Queued => match sub.overflow {
                            OverflowPolicy::Skip => continue,
                            OverflowPolicy::Close => {
                                close = true;
                                break;
                            }
                        },
                        Overflowed::NoRoom => return,
                    }
                }
                Lookup::Present(rec) => {
                    let rec = rec.clone();
                    match offer(sub, &rec, log, reg) {
                        Offer::Advanced => {}
                        Offer::Full | Offer::Gone => return,
                    }
                }
            }
        }
        if close {
            retire(subs, index, retired, id);
        }
    }

    /// Rows the store returned for a subscription's catch-up.
    pub fn deliver_disk(
        &mut self,
        id: &SubscriptionId,
        from: u64,
        rows: Result<Vec<StoredRow>, StoreError>,
        reg: AgentView<'_>,
    ) {
        let Some(sub) = self.subs.get_mut(id) else {
            return;
        };
        sub.disk_pending = false;
        if sub.state != SubState::Paused || sub.cursor != from {
            return;
        }
        let rows = match rows {
            Ok(rows) => {
                sub.disk_failures = 0;
                rows
            }
            Err(StoreError::Io(e)) if self.disk.is_some() => {
                // The rows are still there: read again later, never report them lost. The
                // wait grows, so a broken store is not spun on; the subscription stays paused
                // until a read succeeds or it is removed.
                sub.disk_failures = sub.disk_failures.saturating_add(1);
                let wait = retry_wait(sub.disk_failures);
                if sub.disk_failures == 1 || sub.disk_failures % 20 == 0 {
                    tracing::warn!(
                        subscription = %id, error = %e, failures = sub.disk_failures, ?wait,
                        "catch-up read failed; trying again"
                    );
                }
                sub.disk_pending = true;
                if let Some(d) = &self.disk {
                    d.request(id.clone(), from, wait);
                }
                return;
            }
            Err(e) => {
                // Unreadable (corrupt) or closed: reading again would fail the same way; the
                // gap is reported instead.
                tracing::error!(subscription = %id, error = %e, "catch-up read failed");
                Vec::new()
            }
        };
        let mut lost = rows.first().is_none_or(|r| r.seq != from);
        for row in rows {
            if row.seq != sub.cursor {
                lost = true;
                break;
            }
            let rec = match EventRecord::from_row(row) {
                Ok(rec) => Arc::new(rec),
                Err(e) => {
                    tracing::error!(subscription = %id, error = %e, "unreadable stored event");
                    lost = true;
                    break;
                }
            };
            match offer(sub, &rec, &self.log, reg) {
                Offer::Advanced => lost = false,
                Offer::Full | Offer::Gone => return,
            }
        }
        if lost && sub.cursor < self.log.first_seq() {
            // What the store no longer holds (retention raced the read, or the read failed)
            // and memory does not either: a gap, signalled like any other.
            match overflow(sub, &self.log) {
                Overflowed::Queued if sub.overflow == OverflowPolicy::Close => {
                    retire(&mut self.subs, &mut self.index, &mut self.retired, id);
                    return;
                }
                Overflowed::Queued => {}
                Overflowed::NoRoom => return,
            }
        }
        self.catch_up(id, reg);
    }

    /// Removes every subscription of a session; returns their ids.
    pub fn remove_session(&mut self, session: &SessionId) -> Vec<SubscriptionId> {
        let ids: Vec<SubscriptionId> = self
            .subs
            .values()
            .filter(|s| &s.session == session)
            .map(|s| s.id.clone())
            .collect();
        for id in &ids {
            retire(&mut self.subs, &mut self.index, &mut self.retired, id);
        }
        ids
    }

    /// Whether a subscription would deliver `rec` (filter + visibility + own-events rule).
    pub fn admits(sub: &Subscription, rec: &EventRecord, reg: AgentView<'_>) -> bool {
        admits(sub, rec, reg)
    }
}

fn admits(sub: &Subscription, rec: &EventRecord, reg: AgentView<'_>) -> bool {
    if rec.kind.is_internal() {
        return false;
    }
    let viewer = Viewer {
        participant: &sub.participant,
        kind: sub.participant_type,
        agent: sub.agent.as_ref(),
        principal: sub.principal.as_ref(),
        policy: &sub.policy,
    };
    if !can_see_event(
        &viewer,
        rec.kind.as_str(),
        &rec.audience,
        rec.keys.agent_id.as_ref(),
        reg,
    ) {
        return false;
    }
    if sub.exclude_own {
        if let Some(src) = rec.source.as_deref() {
            if src == sub.participant.as_str() || reg.text_is_owned_by(src, &sub.participant) {
                return false;
            }
        }
    }
    sub.filter.matches(rec, |agent| {
        reg.get_by_text(agent).and_then(|r| r.environment.as_ref())
    })
}

/// Offers `rec` (which must be at `sub.cursor`) to `sub`.
fn offer(
    sub: &mut Subscription,
    rec: &Arc<EventRecord>,
    log: &EventLog,
    reg: AgentView<'_>,
) -> Offer {
    if !admits(sub, rec, reg) {
        sub.cursor = rec.seq + 1;
        return Offer::Advanced;
    }
    if !sub.has_credit() {
        return Offer::Full;
    }
    let delivery = Delivery {
        subscription: sub.id.clone(),
        sequence: sub.sequence + 1,
        record: rec.clone(),
        caused_by: delivered_causes(sub, rec, log, reg),
    };
    match push(&sub.outbox, Outbound::Event(delivery)) {
        Ok(()) => {
            sub.sequence += 1;
            sub.cursor = rec.seq + 1;
            Offer::Advanced
        }
        Err(PushError::Full(_)) => Offer::Full,
        Err(PushError::Closed(_)) => Offer::Gone,
    }
}

/// The envelope `causedBy`: only causes this subscription was shown (a cause it never saw would
/// make a client-side causal buffer wait for nothing).
fn delivered_causes(
    sub: &Subscription,
    rec: &EventRecord,
    log: &EventLog,
    reg: AgentView<'_>,
) -> CausedBy {
    if rec.caused_by.is_empty() {
        return CausedBy::None;
    }
    let seen: Vec<_> = rec
        .caused_by
        .iter()
        .copied()
        .filter(|id| {
            log.find(*id)
                .is_some_and(|cause| cause.seq >= sub.start && admits(sub, cause, reg))
        })
        .collect();
    if seen.is_empty() {
        CausedBy::None
    } else if seen.len() == rec.caused_by.len() {
        CausedBy::All
    } else {
        CausedBy::Some(seen)
    }
}

enum Overflowed {
    /// The notice is queued and the cursor moved past the gap (for `skip`: to live).
    Queued,
    /// The outbox is full; try again later.
    NoRoom,
}

/// How long to wait before trying a catch-up read again after `failures` failed in a row.
fn retry_wait(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    DISK_RETRY_FIRST
        .saturating_mul(1 << doublings)
        .min(DISK_RETRY_MAX)
}

/// Queues the overflow notice for a cursor older than everything retained, and moves the
/// cursor: to live (`skip`) or nowhere (`close`, the caller removes the subscription).
fn overflow(sub: &mut Subscription, log: &EventLog) -> Overflowed {
    let resume = log.next_seq();
    let lost = resume.saturating_sub(sub.cursor);
    let data = SubscriptionOverflowData {
        subscription_id: sub.id.clone(),
        events_dropped: lost,
        resumes_at: None,
        recommendation: match sub.overflow {
            OverflowPolicy::Skip => "events in the gap are no longer retained; this subscription continues with live events; re-read current state (map/agents/list, map/scopes/list)".into(),
            OverflowPolicy::Close => "events in the gap are no longer retained; this subscription is closed; re-read current state and subscribe again".into(),
        },
        policy: Some(match sub.overflow {
            OverflowPolicy::Skip => "skip".into(),
            OverflowPolicy::Close => "close".into(),
        }),
    };
    let json = serde_json::to_string(&data).unwrap_or_else(|_| "{}".into());
    let rec = Arc::new(EventRecord::synthetic(
        EventType::SubscriptionOverflow,
        json,
        Audience::Everyone,
    ));
    let delivery = Delivery {
        subscription: sub.id.clone(),
        sequence: sub.sequence + 1,
        record: rec,
        caused_by: CausedBy::None,
    };
    match push(&sub.outbox, Outbound::Event(delivery)) {
        Ok(()) => {
            sub.sequence += 1;
            sub.overflows += 1;
            sub.cursor = resume;
            Overflowed::Queued
        }
        Err(_) => Overflowed::NoRoom,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::protocol::capabilities::ParticipantType;
    use crate::protocol::event::{EventType, SubscriptionFilter};
    use crate::router::agents::registry::Registry;
    use crate::router::events::bus::{EventBus, SubState, Subscription};
    use crate::router::events::filter::CompiledFilter;
    use crate::router::events::index::tests::FILTERS;
    use crate::router::events::log::{Audience, EventDraft, EventLog, FilterKeys, Retention};
    use crate::router::ids::ConnId;
    use crate::router::outbox::{outbox, Outbound, OutboxReceiver};
    use crate::router::scopes::table::Scopes;
    use crate::router::views::AgentView;

    /// A small deterministic generator (xorshift), so a failure repeats.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn sub(i: usize, filter: Option<&str>, capacity: usize) -> (Subscription, OutboxReceiver) {
        let f = filter.map(|j| serde_json::from_str::<SubscriptionFilter>(j).unwrap());
        let (tx, rx) = outbox(capacity);
        let sub = Subscription {
            id: format!("sub-{i}").into(),
            session: format!("s-{i}").into(),
            conn: ConnId(i as u64),
            participant: format!("p-{i}").into(),
            participant_type: ParticipantType::Client,
            agent: None,
            principal: None,
            policy: Default::default(),
            filter: CompiledFilter::compile(f.as_ref()).unwrap(),
            exclude_own: false,
            cursor: 0,
            start: 0,
            sequence: 0,
            acked: 0,
            window: None,
            overflow: Default::default(),
            disk_pending: false,
            disk_failures: 0,
            overflows: 0,
            state: SubState::Pending,
            outbox: tx,
        };
        (sub, rx)
    }

    fn draft(rng: &mut Rng) -> EventDraft {
        let kind = [
            EventType::MessageSent,
            EventType::MessageDelivered,
            EventType::AgentRegistered,
        ][rng.below(3) as usize];
        let scopes = match rng.below(4) {
            0 => vec![],
            1 => vec!["s1".into()],
            2 => vec!["s2".into(), "s1".into()],
            _ => vec!["s3".into()],
        };
        EventDraft {
            kind,
            source: Some(["a1", "a2", "a3"][rng.below(3) as usize].into()),
            data: "{}".into(),
            caused_by: vec![],
            keys: FilterKeys {
                scopes,
                priority: (rng.below(2) == 0).then(|| "high".into()),
                ..FilterKeys::default()
            },
            audience: Audience::Everyone,
        }
    }

    fn seqs(rx: &mut OutboxReceiver, into: &mut Vec<u64>) {
        while let Some(item) = rx.try_recv() {
            if let Outbound::Event(d) = item {
                into.push(d.record.seq);
            }
        }
    }

    /// Every subscription gets exactly the events its filter admits, in log order, once each:
    /// however long it went without a candidate event, whether its outbox filled (and it
    /// caught up from the log later), and under read-committed delivery in batches.
    #[test]
    fn every_subscription_gets_exactly_what_its_filter_admits() {
        for (seed, committed) in [(1u64, false), (2, false), (3, true), (4, true)] {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seed);
            let mut bus = EventBus::new(EventLog::new(Retention {
                max_events: 100_000,
                max_bytes: 1 << 28,
            }));
            if committed {
                bus.deliver_committed_only(0);
            }
            let (registry, scopes) = (Registry::default(), Scopes::default());
            let reg = AgentView::new(&registry, &scopes);
            let mut rxs = Vec::new();
            let mut filters = Vec::new();
            for i in 0..21 {
                // Some outboxes are tiny, so those subscriptions pause and catch up.
                let (s, rx) = sub(i, FILTERS[i % FILTERS.len()], [2, 8, 4096][i % 3]);
                filters.push(s.filter.clone());
                let id = s.id.clone();
                bus.insert(s);
                bus.activate(&id, reg);
                rxs.push(rx);
            }
            let mut got = vec![Vec::new(); rxs.len()];
            let mut records = Vec::new();
            for n in 0..2_000u64 {
                let rec = bus.log.append(draft(&mut rng), None);
                bus.publish(&rec, reg);
                records.push(Arc::clone(&rec));
                if committed && rng.below(5) == 0 {
                    bus.committed(n + 1, reg);
                }
                // Readers drain at random moments; a drained connection is caught up.
                for (i, rx) in rxs.iter_mut().enumerate() {
                    if rng.below(7) == 0 {
                        seqs(rx, &mut got[i]);
                        bus.resume_conn(ConnId(i as u64), reg);
                    }
                }
            }
            if committed {
                bus.committed(2_000, reg);
            }
            for _ in 0..2_000 {
                for (i, rx) in rxs.iter_mut().enumerate() {
                    seqs(rx, &mut got[i]);
                    bus.resume_conn(ConnId(i as u64), reg);
                }
            }
            for (i, f) in filters.iter().enumerate() {
                let want: Vec<u64> = records
                    .iter()
                    .filter(|r| f.matches(r, |_| None))
                    .map(|r| r.seq)
                    .collect();
                assert!(!want.is_empty(), "subscription {i} matches something");
                assert_eq!(
                    got[i],
                    want,
                    "seed {seed}: subscription {i} ({:?})",
                    FILTERS[i % FILTERS.len()]
                );
            }
        }
    }
}
