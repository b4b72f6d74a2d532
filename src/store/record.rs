//! What a logged event is, and how the durable store keeps it: [`EventRecord`] (the event's
//! JSON, serialized once, plus what delivery needs without re-parsing it: source, causes,
//! [`FilterKeys`], [`Audience`]) and [`StoredRow`] (the same as plain columns).
//!
//! The router's event log creates records and the store persists them; both read them, so the
//! type lives here, below the router.

use std::fmt::Write as _;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::protocol::event::EventType;
use crate::protocol::ids::{now_ms, AgentId, EventId, ParticipantId, ScopeId};

/// Who may see an event, decided when it is emitted (from the visibility of what it is about).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Audience {
    /// Every subscriber allowed to observe.
    Everyone,
    /// System participants only.
    System,
    /// These participants (and system participants).
    Participants {
        /// Who.
        who: Vec<ParticipantId>,
    },
    /// The owner, participants owning an agent in one of these scopes, and system participants.
    Scoped {
        /// The owner of the agent the event is about.
        owner: Option<ParticipantId>,
        /// That agent's scopes.
        scopes: Vec<ScopeId>,
    },
    /// Sessions of this principal (and system participants): what a session of an
    /// authenticated principal says about itself, such as its `participant_connected`.
    Principal {
        /// The principal's id.
        id: String,
        /// Its issuer (a JWT's `iss`), if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        issuer: Option<String>,
    },
    /// Whoever every one of these admits (an event about several things: a message between
    /// two agents is seen only by those who may see both).
    All {
        /// The audiences.
        of: Vec<Audience>,
    },
}

impl Audience {
    /// Heap this audience owns or shares (its lists and the ids in them), for
    /// [`EventRecord::footprint`].
    fn heap(&self) -> usize {
        let id = |s: &Arc<str>| alloc(16 + s.len());
        match self {
            Audience::Everyone | Audience::System => 0,
            Audience::Participants { who } => vec_of(who, |p| id(p.as_arc())),
            Audience::Scoped { owner, scopes } => {
                owner.as_ref().map_or(0, |p| id(p.as_arc())) + vec_of(scopes, |s| id(s.as_arc()))
            }
            Audience::Principal { id, issuer } => {
                alloc(id.len()) + issuer.as_ref().map_or(0, |i| alloc(i.len()))
            }
            Audience::All { of } => vec_of(of, Audience::heap),
        }
    }

    /// The audience admitting whoever both `self` and `other` admit.
    pub fn and(self, other: Audience) -> Audience {
        match (self, other) {
            (Audience::Everyone, x) | (x, Audience::Everyone) => x,
            (Audience::System, _) | (_, Audience::System) => Audience::System,
            (a, b) if a == b => a,
            (Audience::All { mut of }, Audience::All { of: more }) => {
                of.extend(more);
                Audience::All { of }
            }
            (Audience::All { mut of }, x) | (x, Audience::All { mut of }) => {
                of.push(x);
                Audience::All { of }
            }
            (a, b) => Audience::All { of: vec![a, b] },
        }
    }
}

/// Values filters match on, extracted when the event is emitted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FilterKeys {
    /// `data.agentId`: the agent the event is about.
    pub agent_id: Option<AgentId>,
    /// Role of the source agent at emit time.
    pub source_role: Option<Arc<str>>,
    /// Role of the agent the event is about (else of the source agent) at emit time.
    pub subject_role: Option<Arc<str>>,
    /// The event's scope followed by its ancestors (for `scopes` filters).
    pub scopes: Vec<ScopeId>,
    /// Message priority (message events only).
    pub priority: Option<Arc<str>>,
    /// `data.correlationId` and `data.message.meta.correlationId`.
    pub correlation_ids: Vec<Arc<str>>,
    /// `data.metadata`, for `metadataMatch`.
    pub metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    /// A checkpoint's work-session id (`trajectory.checkpoint` events), for `trajectory`
    /// filters; its agent is `agent_id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_session: Option<Arc<str>>,
    /// The task a `task.*` event is about, for `tasks` filters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<Arc<str>>,
    /// What `mail` filters match on (`mail.*` events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mail: Option<Arc<MailKeys>>,
    /// Not matched by any filter: who the task, conversation or checkpoint an event creates
    /// counts against (its creator's quota owner, `router::quotas`). The store records it with
    /// the kept row the first time the row's key is written (`store::kept`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<Arc<str>>,
}

/// The keys of a `mail.*` event.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MailKeys {
    /// Its conversation.
    pub conversation_id: String,
    /// The thread of its turn or thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    /// The mail participant it is about or by (joined, left, author, creator, closer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub participant_id: Option<String>,
    /// Its turn's content type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
}

/// A logged event.
#[derive(Debug)]
pub struct EventRecord {
    /// Dense position in the log.
    pub seq: u64,
    /// Event id; `None` only for synthetic per-subscription notices.
    pub id: Option<EventId>,
    /// Unix ms, never decreasing along the log.
    pub timestamp: u64,
    /// Type.
    pub kind: EventType,
    /// Source.
    pub source: Option<Arc<str>>,
    /// Causes.
    pub caused_by: Vec<EventId>,
    /// Filter keys.
    pub keys: FilterKeys,
    /// Visibility.
    pub audience: Audience,
    /// The `event` object as JSON.
    pub json: Box<str>,
    /// Envelope fields after `sequenceNumber`: `,"eventId":"…","timestamp":…`.
    pub envelope_head: Box<str>,
}

impl EventRecord {
    /// What keeping this record costs in memory, for the window's byte budget: the record's own
    /// allocation and every allocation it owns or shares (ids, keys, audience, metadata), each
    /// rounded as an allocator rounds it. Shared strings are counted in full, so the estimate
    /// errs high: a window of N bytes holds at most about N bytes of records.
    pub fn footprint(&self) -> usize {
        let arc_str = |s: &Arc<str>| alloc(16 + s.len());
        let opt_str = |s: &Option<Arc<str>>| s.as_ref().map_or(0, arc_str);
        let keys = &self.keys;
        let mail = keys.mail.as_ref().map_or(0, |m| {
            alloc(16 + std::mem::size_of::<MailKeys>())
                + alloc(m.conversation_id.capacity())
                + [&m.thread_id, &m.participant_id, &m.content_type]
                    .iter()
                    .map(|s| s.as_ref().map_or(0, |s| alloc(s.capacity())))
                    .sum::<usize>()
        });
        alloc(16 + std::mem::size_of::<Self>())
            + alloc(self.json.len())
            + alloc(self.envelope_head.len())
            + opt_str(&self.source)
            + alloc(self.caused_by.capacity() * std::mem::size_of::<EventId>())
            + keys.agent_id.as_ref().map_or(0, |a| arc_str(a.as_arc()))
            + opt_str(&keys.source_role)
            + opt_str(&keys.subject_role)
            + vec_of(&keys.scopes, |s| arc_str(s.as_arc()))
            + opt_str(&keys.priority)
            + vec_of(&keys.correlation_ids, arc_str)
            + keys.metadata.as_ref().map_or(0, |m| {
                alloc(16 + std::mem::size_of::<serde_json::Map<String, serde_json::Value>>())
                    + map_heap(m)
            })
            + opt_str(&keys.work_session)
            + opt_str(&keys.task_id)
            + mail
            + opt_str(&keys.owner)
            + self.audience.heap()
    }

    /// A synthetic record that is not in the log (no event id): used for notices that belong to
    /// one subscription, such as `subscription.overflow`.
    pub fn synthetic(kind: EventType, data: String, audience: Audience) -> Self {
        let timestamp = now_ms();
        let event_id = format!("{}-{}", kind.as_str(), crate::protocol::ids::Ulid::random());
        let json = build_event_json(&event_id, kind, timestamp, Some("system"), &data, &[], None);
        Self {
            seq: u64::MAX,
            id: None,
            timestamp,
            kind,
            source: Some("system".into()),
            caused_by: Vec::new(),
            keys: FilterKeys::default(),
            audience,
            json: json.into(),
            envelope_head: format!(",\"timestamp\":{timestamp}").into(),
        }
    }
}

/// An event record as the durable store keeps it: plain columns, the filter and visibility
/// metadata as one JSON document, and the `event` JSON exactly as it was first serialized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRow {
    /// Dense log position.
    pub seq: u64,
    /// Event id (26-character ULID).
    pub id: String,
    /// Unix ms.
    pub timestamp: u64,
    /// Event type wire string.
    pub kind: String,
    /// `{source, causedBy, keys, audience}` as JSON.
    pub meta: String,
    /// The `event` object as JSON.
    pub json: String,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RowMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<Arc<str>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    caused_by: Vec<EventId>,
    #[serde(default)]
    keys: FilterKeys,
    audience: Audience,
}

impl EventRecord {
    /// The record as a storage row. Synthetic records (no id) are never stored.
    pub fn to_row(&self) -> Option<StoredRow> {
        let id = self.id?;
        let meta = RowMeta {
            source: self.source.clone(),
            caused_by: self.caused_by.clone(),
            keys: self.keys.clone(),
            audience: self.audience.clone(),
        };
        Some(StoredRow {
            seq: self.seq,
            id: id.to_string(),
            timestamp: self.timestamp,
            kind: self.kind.as_str().to_owned(),
            meta: serde_json::to_string(&meta).unwrap_or_else(|_| "{}".into()),
            json: self.json.to_string(),
        })
    }

    /// Rebuilds a record from a storage row.
    ///
    /// # Errors
    /// A row this version cannot read (unknown type, malformed id or metadata).
    pub fn from_row(row: StoredRow) -> Result<Self, String> {
        let id = EventId::parse(&row.id).ok_or_else(|| format!("bad event id {}", row.id))?;
        let kind = EventType::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == row.kind)
            .ok_or_else(|| format!("unknown event type {}", row.kind))?;
        let meta: RowMeta = serde_json::from_str(&row.meta)
            .map_err(|e| format!("bad metadata for event {}: {e}", row.id))?;
        Ok(Self {
            seq: row.seq,
            id: Some(id),
            timestamp: row.timestamp,
            kind,
            source: meta.source,
            caused_by: meta.caused_by,
            keys: meta.keys,
            audience: meta.audience,
            json: row.json.into(),
            envelope_head: format!(
                ",\"eventId\":\"{}\",\"timestamp\":{}",
                row.id, row.timestamp
            )
            .into(),
        })
    }
}

/// The `event` object's JSON: `{"id","type","timestamp","source"?,"data","causedBy"?,"_meta"?}`,
/// with `data` and `_meta` (the trace context, when the event has one) spliced in as they are.
pub fn build_event_json(
    id: &str,
    kind: EventType,
    timestamp: u64,
    source: Option<&str>,
    data: &str,
    caused_by: &[EventId],
    meta: Option<&str>,
) -> String {
    let mut json = String::with_capacity(
        96 + data.len() + caused_by.len() * 29 + meta.map_or(0, |m| m.len() + 9),
    );
    json.push_str("{\"id\":\"");
    json.push_str(id);
    json.push_str("\",\"type\":\"");
    json.push_str(kind.as_str());
    let _ = write!(json, "\",\"timestamp\":{timestamp}");
    if let Some(source) = source {
        json.push_str(",\"source\":");
        json.push_str(&serde_json::to_string(source).unwrap_or_else(|_| "\"\"".into()));
    }
    json.push_str(",\"data\":");
    json.push_str(data);
    if !caused_by.is_empty() {
        json.push_str(",\"causedBy\":");
        push_id_array(&mut json, caused_by);
    }
    if let Some(meta) = meta {
        json.push_str(",\"_meta\":");
        json.push_str(meta);
    }
    json.push('}');
    json
}

/// Appends `["id","id"]`.
pub fn push_id_array(out: &mut String, ids: &[EventId]) {
    out.push('[');
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "\"{id}\"");
    }
    out.push(']');
}

/// What an allocation of `n` bytes costs: size classes of 16 bytes, then about 1/8 above (as
/// mimalloc's and glibc's bins run).
fn alloc(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let r = n.next_multiple_of(16);
    r + r / 8
}

fn vec_of<T>(v: &Vec<T>, each: impl Fn(&T) -> usize) -> usize {
    alloc(v.capacity() * std::mem::size_of::<T>()) + v.iter().map(each).sum::<usize>()
}

/// Heap under a JSON object's entries (the map itself counted by the caller): its B-tree
/// nodes (room for 11 entries each, about 2/3 full once grown) and what the entries own.
fn map_heap(m: &serde_json::Map<String, serde_json::Value>) -> usize {
    if m.is_empty() {
        return 0;
    }
    let node =
        alloc(11 * (std::mem::size_of::<String>() + std::mem::size_of::<serde_json::Value>()) + 16);
    let nodes = if m.len() <= 11 {
        1
    } else {
        m.len().div_ceil(7)
    };
    nodes * node
        + m.iter()
            .map(|(k, v)| alloc(k.capacity()) + value_heap(v))
            .sum::<usize>()
}

fn value_heap(v: &serde_json::Value) -> usize {
    use serde_json::Value;
    match v {
        Value::String(s) => alloc(s.capacity()),
        Value::Array(a) => vec_of(a, value_heap),
        Value::Object(m) => map_heap(m),
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
    }
}
