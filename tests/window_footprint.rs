//! The memory event window's byte budget counts what its records really take: a counting
//! allocator measures the live heap a batch of appended records holds, and
//! `EventRecord::footprint` must not be below it (or the window would hold more than its
//! configured bytes, as it did before: 4 MiB of budget kept 6.7 MB resident), nor far above it.
//!
//! The one unsafe part is the counting allocator, which only forwards to the system's.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;

use map_router::protocol::event::EventType;
use map_router::protocol::ids::{AgentId, ParticipantId, ScopeId};
use map_router::router::events::log::{Audience, EventDraft, EventLog, FilterKeys, Retention};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A message event as a group send logs it: fresh ids (nothing shared with other state), two
/// scopes, a correlation id, metadata, and an audience of participants and a scope.
fn draft(i: usize) -> EventDraft {
    let agent = AgentId::new(format!("agent-{i:06}-01JD5X8Q2M3N4P5R6S7T8V9W0X"));
    let scopes: Vec<ScopeId> = (0..2)
        .map(|s| ScopeId::new(format!("team-{i}/room-{s}")))
        .collect();
    let metadata: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&format!(
        r#"{{"name":"worker {i}","labels":["a","b","c"],"nested":{{"k":"{i}","n":7}}}}"#
    ))
    .unwrap();
    let payload = "x".repeat(180);
    EventDraft {
        kind: EventType::MessageSent,
        source: Some(Arc::from(agent.as_str())),
        data: format!(r#"{{"message":{{"id":"m{i}","payload":"{payload}"}}}}"#),
        caused_by: Vec::new(),
        keys: FilterKeys {
            agent_id: Some(agent.clone()),
            source_role: Some("worker".into()),
            subject_role: Some("worker".into()),
            scopes: scopes.clone(),
            priority: Some("normal".into()),
            correlation_ids: vec![Arc::from(format!("corr-{i}"))],
            metadata: Some(Arc::new(metadata)),
            ..FilterKeys::default()
        },
        audience: Audience::All {
            of: vec![
                Audience::Participants {
                    who: vec![
                        ParticipantId::new(format!("p-{i}-a")),
                        ParticipantId::new(format!("p-{i}-b")),
                    ],
                },
                Audience::Scoped {
                    owner: Some(ParticipantId::new(format!("p-{i}-owner"))),
                    scopes,
                },
            ],
        },
    }
}

#[test]
fn footprint_covers_the_live_heap_of_records() {
    let mut log = EventLog::new(Retention {
        max_events: usize::MAX,
        max_bytes: usize::MAX,
    });
    // Warm up so the record queue does not grow while measuring (1100 -> capacity 2048).
    for i in 0..1100 {
        log.append(draft(i), None);
    }
    let n = 900;
    let before = LIVE.load(Ordering::SeqCst);
    let mut counted = 0usize;
    for i in 1100..1100 + n {
        let record = log.append(draft(i), None);
        counted += record.footprint();
    }
    let live = (LIVE.load(Ordering::SeqCst) - before) as usize;
    assert_eq!(log.len(), 1100 + n, "the queue kept every record");
    println!(
        "live heap {} B/record, footprint {} B/record",
        live / n,
        counted / n
    );
    assert!(
        counted >= live,
        "footprint {counted} B counts less than the {live} B the records hold"
    );
    assert!(
        counted <= live * 2,
        "footprint {counted} B is more than twice the {live} B the records hold"
    );
}
