//! The append-only event log: one sequencer, bounded retention, records serialized once.
//!
//! Owns event ids (monotonic ULIDs), timestamps (never decreasing), internal sequence numbers
//! (dense, from 0) and retention. Each record carries its `event` JSON, serialized exactly once
//! at append time and shared by every delivery, plus the pre-extracted keys that filters and
//! permission checks read, so delivery never re-parses JSON.
//!
//! Retention is bounded by count and by bytes. Evicted records stay alive only while an outbox
//! still holds a delivery of them (they are `Arc`s).

use std::collections::VecDeque;
use std::sync::Arc;

use crate::protocol::event::EventType;
use crate::protocol::ids::{now_ms, EventId, MonotonicUlids};
use crate::protocol::trace::TraceContext;
pub use crate::store::record::{
    build_event_json, push_id_array, Audience, EventRecord, FilterKeys, StoredRow,
};

/// What a handler hands the log.
#[derive(Debug)]
pub struct EventDraft {
    /// Event type.
    pub kind: EventType,
    /// `event.source`.
    pub source: Option<Arc<str>>,
    /// `event.data`, already JSON.
    pub data: String,
    /// Causes.
    pub caused_by: Vec<EventId>,
    /// Filter keys.
    pub keys: FilterKeys,
    /// Visibility.
    pub audience: Audience,
}

/// Where a sequence number stands relative to retention.
#[derive(Debug)]
pub enum Lookup<'a> {
    /// The record.
    Present(&'a Arc<EventRecord>),
    /// Evicted by retention.
    Evicted,
    /// Not appended yet.
    Future,
}

/// Retention limits.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// At most this many records.
    pub max_events: usize,
    /// At most about this many bytes of records.
    pub max_bytes: usize,
}

/// The log.
#[derive(Debug)]
pub struct EventLog {
    records: VecDeque<Arc<EventRecord>>,
    first_seq: u64,
    ids: MonotonicUlids,
    last_timestamp: u64,
    bytes: usize,
    retention: Retention,
}

impl EventLog {
    /// An empty log.
    pub fn new(retention: Retention) -> Self {
        Self {
            records: VecDeque::new(),
            first_seq: 0,
            ids: MonotonicUlids::new(),
            last_timestamp: 0,
            bytes: 0,
            retention: Retention {
                max_events: retention.max_events.max(1),
                max_bytes: retention.max_bytes.max(1),
            },
        }
    }

    /// A log that continues one recovered from durable storage: sequence numbers, ids and
    /// timestamps carry on after the stored ones, and the newest stored records fill the
    /// memory window. Rows this version cannot read are skipped (and counted in the log).
    pub fn recover(retention: Retention, recovered: &crate::store::Recovered) -> Self {
        let mut log = Self::new(retention);
        log.first_seq = recovered.next_seq;
        log.last_timestamp = recovered.last_timestamp;
        if let Some(last) = recovered.last_id {
            log.ids = MonotonicUlids::starting_after(last.0);
        }
        let mut skipped = 0usize;
        let rows = recovered
            .recent
            .iter()
            .filter(|r| r.seq < recovered.next_seq)
            .cloned();
        let mut records = Vec::new();
        for row in rows {
            match EventRecord::from_row(row) {
                Ok(rec) => records.push(Arc::new(rec)),
                Err(e) => {
                    skipped += 1;
                    tracing::warn!(error = %e, "skipping a stored event this version cannot read");
                }
            }
        }
        // The window must be contiguous and end at next_seq.
        let mut expected = recovered.next_seq;
        let mut window = VecDeque::new();
        for rec in records.into_iter().rev() {
            if rec.seq + 1 != expected {
                break;
            }
            expected = rec.seq;
            window.push_front(rec);
        }
        log.first_seq = expected;
        for rec in window {
            log.bytes += rec.footprint();
            log.records.push_back(rec);
        }
        log.evict();
        if skipped > 0 {
            tracing::warn!(
                skipped,
                "stored events skipped while warming the memory window"
            );
        }
        log
    }

    /// Appends an event, assigning its id, timestamp and sequence number, and evicts what
    /// retention no longer allows.
    pub fn append(&mut self, draft: EventDraft, trace: Option<&TraceContext>) -> Arc<EventRecord> {
        let timestamp = now_ms().max(self.last_timestamp);
        self.last_timestamp = timestamp;
        let id = EventId(self.ids.next(timestamp));
        let id_text = id.to_string();
        let json = build_event_json(
            &id_text,
            draft.kind,
            timestamp,
            draft.source.as_deref(),
            &draft.data,
            &draft.caused_by,
            trace.map(TraceContext::to_meta_json).as_deref(),
        );
        let record = Arc::new(EventRecord {
            seq: self.next_seq(),
            id: Some(id),
            timestamp,
            kind: draft.kind,
            source: draft.source,
            caused_by: draft.caused_by,
            keys: draft.keys,
            audience: draft.audience,
            json: json.into(),
            envelope_head: format!(",\"eventId\":\"{id_text}\",\"timestamp\":{timestamp}").into(),
        });
        self.bytes += record.footprint();
        self.records.push_back(record.clone());
        self.evict();
        record
    }

    /// Appends a record that another node's log already holds, as it was written there (a
    /// follower, `router::events::follow`): ids and timestamps carry on after it. A record past
    /// a hole (the stream's retention took rows before they were followed) starts the window
    /// again at its seq; an older one is refused (false: the log has it).
    pub fn push_followed(&mut self, record: Arc<EventRecord>) -> bool {
        let next = self.next_seq();
        if record.seq < next {
            return false;
        }
        if record.seq > next {
            self.restart_at(record.seq);
        }
        self.last_timestamp = self.last_timestamp.max(record.timestamp);
        if let Some(id) = record.id {
            self.ids = MonotonicUlids::starting_after(id.0);
        }
        self.bytes += record.footprint();
        self.records.push_back(record);
        self.evict();
        true
    }

    /// Empties the window, which now starts (and ends) at `seq`: what came before it is gone
    /// (a follower's hole, see [`Self::push_followed`]). Never moves backwards.
    pub fn restart_at(&mut self, seq: u64) {
        if seq <= self.next_seq() {
            return;
        }
        self.records.clear();
        self.bytes = 0;
        self.first_seq = seq;
    }

    fn evict(&mut self) {
        while self.records.len() > self.retention.max_events
            || (self.bytes > self.retention.max_bytes && self.records.len() > 1)
        {
            if let Some(old) = self.records.pop_front() {
                self.bytes = self.bytes.saturating_sub(old.footprint());
                self.first_seq += 1;
            }
        }
    }

    /// Sequence number the next append gets.
    pub fn next_seq(&self) -> u64 {
        self.first_seq + self.records.len() as u64
    }

    /// Oldest retained sequence number.
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// Number of retained records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether nothing is retained.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The record at `seq`.
    pub fn get(&self, seq: u64) -> Lookup<'_> {
        if seq < self.first_seq {
            Lookup::Evicted
        } else {
            match self.records.get((seq - self.first_seq) as usize) {
                Some(r) => Lookup::Present(r),
                None => Lookup::Future,
            }
        }
    }

    /// The first sequence number whose event id is greater than `id` (ids are monotonic, so
    /// this is a binary search). Works for ids that were never logged: they are positions.
    pub fn seq_after(&self, id: EventId) -> u64 {
        let idx = self
            .records
            .partition_point(|r| r.id.is_some_and(|rid| rid <= id));
        self.first_seq + idx as u64
    }

    /// The first sequence number whose timestamp is at least `ts`.
    pub fn seq_at_or_after_time(&self, ts: u64) -> u64 {
        let idx = self.records.partition_point(|r| r.timestamp < ts);
        self.first_seq + idx as u64
    }

    /// The record with this id, if retained.
    pub fn find(&self, id: EventId) -> Option<&Arc<EventRecord>> {
        let idx = self
            .records
            .partition_point(|r| r.id.is_some_and(|rid| rid < id));
        self.records.get(idx).filter(|r| r.id == Some(id))
    }

    /// The id of the newest event issued (retained or not).
    pub fn newest_id(&self) -> Option<EventId> {
        (self.ids_issued()).then(|| EventId(crate::protocol::ids::Ulid(self.ids.last())))
    }

    fn ids_issued(&self) -> bool {
        self.ids.last() != 0
    }

    /// The id of the oldest retained event.
    pub fn oldest_id(&self) -> Option<EventId> {
        self.records.front().and_then(|r| r.id)
    }

    /// Iterates retained records from `seq` on.
    pub fn iter_from(&self, seq: u64) -> impl Iterator<Item = &Arc<EventRecord>> {
        let start = seq.saturating_sub(self.first_seq) as usize;
        self.records.range(start.min(self.records.len())..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(n: u32) -> EventDraft {
        EventDraft {
            kind: EventType::ScopeCreated,
            source: None,
            data: format!("{{\"n\":{n}}}"),
            caused_by: vec![],
            keys: FilterKeys::default(),
            audience: Audience::Everyone,
        }
    }

    #[test]
    fn followed_records_keep_their_numbers_and_a_hole_restarts_the_window() {
        let mut writer = EventLog::new(Retention {
            max_events: 100,
            max_bytes: 1 << 20,
        });
        let written: Vec<Arc<EventRecord>> =
            (0..6).map(|n| writer.append(draft(n), None)).collect();
        let mut follower = EventLog::new(Retention {
            max_events: 100,
            max_bytes: 1 << 20,
        });
        for r in &written[..3] {
            assert!(follower.push_followed(Arc::clone(r)));
        }
        assert!(!follower.push_followed(Arc::clone(&written[1])), "seen");
        assert_eq!((follower.first_seq(), follower.next_seq()), (0, 3));
        // Seq 3 was taken by retention before it was followed.
        assert!(follower.push_followed(Arc::clone(&written[4])));
        assert_eq!((follower.first_seq(), follower.next_seq()), (4, 5));
        assert_eq!(follower.newest_id(), written[4].id);
        // Ids minted later (after a takeover) continue after the followed ones.
        let next = follower.append(draft(9), None);
        assert_eq!(next.seq, 5);
        assert!(next.id > written[4].id && next.timestamp >= written[4].timestamp);
    }

    #[test]
    fn ids_and_timestamps_are_monotonic_and_json_is_well_formed() {
        let mut log = EventLog::new(Retention {
            max_events: 100,
            max_bytes: 1 << 20,
        });
        let a = log.append(draft(1), None);
        let b = log.append(draft(2), None);
        assert!(b.id > a.id);
        assert!(b.timestamp >= a.timestamp);
        assert_eq!((a.seq, b.seq), (0, 1));
        let v: serde_json::Value = serde_json::from_str(&b.json).unwrap();
        assert_eq!(v["type"], "scope_created");
        assert_eq!(v["id"], b.id.unwrap().to_string());
        assert_eq!(v["data"]["n"], 2);
    }

    #[test]
    fn retention_evicts_oldest_and_lookups_report_it() {
        let mut log = EventLog::new(Retention {
            max_events: 3,
            max_bytes: 1 << 20,
        });
        let first = log.append(draft(0), None);
        for n in 1..5 {
            log.append(draft(n), None);
        }
        assert_eq!(log.len(), 3);
        assert_eq!(log.first_seq(), 2);
        assert!(matches!(log.get(0), Lookup::Evicted));
        assert!(matches!(log.get(4), Lookup::Present(_)));
        assert!(matches!(log.get(5), Lookup::Future));
        assert!(log.find(first.id.unwrap()).is_none());
        assert_eq!(
            log.seq_after(first.id.unwrap()),
            2,
            "evicted id is still a position"
        );
    }

    #[test]
    fn byte_budget_bounds_the_log() {
        let mut log = EventLog::new(Retention {
            max_events: 1_000_000,
            max_bytes: 4096,
        });
        for n in 0..1000 {
            log.append(draft(n), None);
        }
        assert!(log.len() < 1000 && !log.is_empty());
    }

    #[test]
    fn records_round_trip_through_storage_rows() {
        let mut log = EventLog::new(Retention {
            max_events: 10,
            max_bytes: 1 << 20,
        });
        let cause = log.append(draft(1), None);
        let mut d = draft(2);
        d.source = Some("agent-7".into());
        d.caused_by = vec![cause.id.unwrap()];
        d.keys.scopes = vec!["team".into()];
        d.keys.priority = Some("high".into());
        d.audience = Audience::Participants {
            who: vec!["p1".into()],
        };
        let rec = log.append(d, None);
        let row = rec.to_row().unwrap();
        let back = EventRecord::from_row(row.clone()).unwrap();
        assert_eq!(back.seq, rec.seq);
        assert_eq!(back.id, rec.id);
        assert_eq!(back.json, rec.json);
        assert_eq!(back.envelope_head, rec.envelope_head);
        assert_eq!(back.caused_by, rec.caused_by);
        assert_eq!(back.keys, rec.keys);
        assert_eq!(back.audience, rec.audience);
        assert_eq!(back.source, rec.source);
        let mut bad = row;
        bad.kind = "nope".into();
        assert!(EventRecord::from_row(bad).is_err());
    }

    #[test]
    fn seq_after_finds_positions() {
        let mut log = EventLog::new(Retention {
            max_events: 100,
            max_bytes: 1 << 20,
        });
        let ids: Vec<_> = (0..5)
            .map(|n| log.append(draft(n), None).id.unwrap())
            .collect();
        assert_eq!(log.seq_after(ids[2]), 3);
        assert_eq!(log.seq_after(ids[4]), 5);
        assert_eq!(log.find(ids[3]).unwrap().seq, 3);
        assert_eq!(log.seq_at_or_after_time(0), 0);
    }
}
