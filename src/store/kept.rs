//! The kept tables: rows the store keeps apart from the event log, the newest per key, that
//! retention never trims (tasks, checkpoints, conversations with their members, turns,
//! threads), the columns they are indexed by, and the queries the router pages them with.
//!
//! Owns the *meaning* of the kept rows, shared by the SQLite store (`sqlite/kept.rs`, which writes
//! them on its writer thread and answers [`KeptQuery`]s on its reader threads) and the
//! in-memory tables of a router without a store (`memory.rs`): which event types are kept
//! where, under which key, with which columns ([`kept_of`]), and what each query returns, in
//! which order. Both answer every query the same way; `tests/memory.rs` runs the same calls
//! against both.
//!
//! A row is always the exact [`StoredRow`] of the newest event about its key, so the router
//! reads a kept item exactly as it was published. The columns are read from that event when
//! it is stored: the store never interprets anything else.

use serde::Deserialize;

use crate::store::record::StoredRow;

/// A kept table that the router pages from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeptTable {
    /// `task.*` events: the newest per task.
    Tasks,
    /// `trajectory.checkpoint` events: the newest per checkpoint.
    Checkpoints,
    /// `mail.created|closed|participant.*`: the newest per conversation (it carries the
    /// conversation and all its participants).
    Conversations,
    /// `mail.turn.added`: every turn.
    Turns,
    /// `mail.thread.created`: every thread.
    Threads,
}

impl KeptTable {
    /// Every table.
    pub const ALL: [KeptTable; 5] = [
        KeptTable::Tasks,
        KeptTable::Checkpoints,
        KeptTable::Conversations,
        KeptTable::Turns,
        KeptTable::Threads,
    ];

    /// The table's name in the database; its key column is the singular.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tasks => "tasks",
            Self::Checkpoints => "checkpoints",
            Self::Conversations => "conversations",
            Self::Turns => "turns",
            Self::Threads => "threads",
        }
    }

    /// The key column (and the member of the event's `data` whose `id` is the key).
    pub fn key(self) -> &'static str {
        match self {
            Self::Tasks => "task",
            Self::Checkpoints => "checkpoint",
            Self::Conversations => "conversation",
            Self::Turns => "turn",
            Self::Threads => "thread",
        }
    }

    /// The table an event type's rows are kept in.
    pub fn of_kind(kind: &str) -> Option<KeptTable> {
        match kind {
            "trajectory.checkpoint" => Some(Self::Checkpoints),
            "mail.created"
            | "mail.closed"
            | "mail.participant.joined"
            | "mail.participant.left" => Some(Self::Conversations),
            "mail.turn.added" => Some(Self::Turns),
            "mail.thread.created" => Some(Self::Threads),
            k if k.starts_with("task.") => Some(Self::Tasks),
            _ => None,
        }
    }
}

/// The indexed columns of a kept row, read from its event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Columns {
    /// A task.
    Task {
        /// `createdAt`: creation order is (`created_at`, id).
        created_at: u64,
        /// `status` as on the wire.
        status: String,
        /// `assignee`.
        assignee: Option<String>,
    },
    /// A checkpoint.
    Checkpoint {
        /// `agentId`.
        agent: String,
        /// `timestamp`: time order is (timestamp, seq, id).
        timestamp: u64,
    },
    /// A conversation.
    Conversation {
        /// `createdAt`: creation order is (`created_at`, id).
        created_at: u64,
        /// Every participant id (those that left too).
        members: Vec<String>,
    },
    /// A turn.
    Turn {
        /// Its conversation.
        conversation: String,
        /// Its thread.
        thread: Option<String>,
        /// Its author (a mail participant id).
        participant: String,
        /// Its `timestamp`.
        timestamp: u64,
    },
    /// A thread.
    Thread {
        /// Its conversation.
        conversation: String,
    },
}

/// What a kept event writes: into which table, under which key, with which columns, and who
/// it counts against (the creator's quota owner, recorded when the key is first written and
/// never changed after).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptWrite {
    /// The table.
    pub table: KeptTable,
    /// The key (`data.<member>.id`).
    pub key: String,
    /// Who created it, for per-principal quotas (`None`: nobody's, as rows older than the
    /// column are).
    pub owner: Option<String>,
    /// The indexed columns.
    pub columns: Columns,
}

/// What `kind`'s event (its `json` and row `meta`) writes into a kept table: `None` for an
/// event type that is not kept; `Some(Err)` for a kept type whose data lacks what its table
/// needs (the store logs it and keeps the event only in the log).
pub fn kept_of(kind: &str, json: &str, meta: &str) -> Option<Result<KeptWrite, String>> {
    let table = KeptTable::of_kind(kind)?;
    Some(read_write(table, json, meta))
}

fn read_write(table: KeptTable, json: &str, meta: &str) -> Result<KeptWrite, String> {
    #[derive(Deserialize)]
    struct Event<D> {
        data: D,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct TaskData {
        task: TaskCols,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct TaskCols {
        id: String,
        #[serde(default)]
        created_at: u64,
        status: String,
        #[serde(default)]
        assignee: Option<String>,
    }
    #[derive(Deserialize)]
    struct CheckpointData {
        checkpoint: CheckpointCols,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct CheckpointCols {
        id: String,
        agent_id: String,
        timestamp: u64,
    }
    #[derive(Deserialize)]
    struct ConversationData {
        conversation: ConversationCols,
        #[serde(default)]
        participants: Vec<Id>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct ConversationCols {
        id: String,
        #[serde(default)]
        created_at: u64,
    }
    #[derive(Deserialize)]
    struct Id {
        id: String,
    }
    #[derive(Deserialize)]
    struct TurnData {
        turn: TurnCols,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct TurnCols {
        id: String,
        conversation_id: String,
        #[serde(default)]
        thread_id: Option<String>,
        participant: String,
        timestamp: u64,
    }
    #[derive(Deserialize)]
    struct ThreadData {
        thread: ThreadCols,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct ThreadCols {
        id: String,
        conversation_id: String,
    }
    fn data<D: serde::de::DeserializeOwned>(json: &str) -> Result<D, String> {
        serde_json::from_str::<Event<D>>(json)
            .map(|e| e.data)
            .map_err(|e| format!("not a kept event: {e}"))
    }
    let (key, columns) = match table {
        KeptTable::Tasks => {
            let t = data::<TaskData>(json)?.task;
            let columns = Columns::Task {
                created_at: t.created_at,
                status: t.status,
                assignee: t.assignee,
            };
            (t.id, columns)
        }
        KeptTable::Checkpoints => {
            let c = data::<CheckpointData>(json)?.checkpoint;
            let columns = Columns::Checkpoint {
                agent: c.agent_id,
                timestamp: c.timestamp,
            };
            (c.id, columns)
        }
        KeptTable::Conversations => {
            let d = data::<ConversationData>(json)?;
            let columns = Columns::Conversation {
                created_at: d.conversation.created_at,
                members: d.participants.into_iter().map(|p| p.id).collect(),
            };
            (d.conversation.id, columns)
        }
        KeptTable::Turns => {
            let t = data::<TurnData>(json)?.turn;
            let columns = Columns::Turn {
                conversation: t.conversation_id,
                thread: t.thread_id,
                participant: t.participant,
                timestamp: t.timestamp,
            };
            (t.id, columns)
        }
        KeptTable::Threads => {
            let t = data::<ThreadData>(json)?.thread;
            (
                t.id,
                Columns::Thread {
                    conversation: t.conversation_id,
                },
            )
        }
    };
    Ok(KeptWrite {
        table,
        key,
        owner: owner_of(meta),
        columns,
    })
}

/// `data.claim.id` of an `identity.claimed` / `identity.released` event's JSON: the id the
/// claims table (`router::identities`) is keyed by.
pub fn claim_key(event_json: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Id {
        id: String,
    }
    #[derive(Deserialize)]
    struct Data {
        claim: Id,
    }
    #[derive(Deserialize)]
    struct Event {
        data: Data,
    }
    serde_json::from_str::<Event>(event_json)
        .ok()
        .map(|e| e.data.claim.id)
}

/// `data.key` of a `state.saved` / `state.dropped` event's JSON of one record
/// (`router::handover`): what the saved records are keyed by (`session:<id>`, `agent:<id>`,
/// `scope:<id>`).
pub fn saved_key(event_json: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Data {
        key: String,
    }
    #[derive(Deserialize)]
    struct Event {
        data: Data,
    }
    serde_json::from_str::<Event>(event_json)
        .ok()
        .map(|e| e.data.key)
}

/// One record of a `state.saved` row's `data.records` (`router::handover`).
#[derive(Debug, PartialEq, Eq)]
pub struct SavedRecord {
    /// `session:<id>`, `agent:<id>` or `scope:<id>`.
    pub key: String,
    /// The record's JSON (`{key, session | agent | scope}`); `None`: the key was dropped.
    pub json: Option<String>,
}

/// The records of a `state.saved` event's JSON that holds several (`data.records`, how the
/// live node writes them since one row carries every record a call changed), `None` for a
/// row of one record (`data.key`, [`saved_key`]) or an unreadable one. A record with nothing
/// besides its key is a drop.
pub fn saved_records(event_json: &str) -> Option<Vec<SavedRecord>> {
    use serde_json::value::RawValue;
    #[derive(Deserialize)]
    struct Data<'a> {
        #[serde(borrow)]
        records: Vec<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Event<'a> {
        #[serde(borrow)]
        data: Data<'a>,
    }
    /// Which record it is: a body besides the key, or a drop.
    #[derive(Deserialize)]
    struct Head {
        key: String,
        #[serde(default)]
        session: Option<serde::de::IgnoredAny>,
        #[serde(default)]
        agent: Option<serde::de::IgnoredAny>,
        #[serde(default)]
        scope: Option<serde::de::IgnoredAny>,
    }
    let event: Event = serde_json::from_str(event_json).ok()?;
    let mut out = Vec::with_capacity(event.data.records.len());
    for raw in event.data.records {
        let Ok(head) = serde_json::from_str::<Head>(raw.get()) else {
            tracing::warn!("skipping a saved record without its key");
            continue;
        };
        let body = head.session.is_some() || head.agent.is_some() || head.scope.is_some();
        out.push(SavedRecord {
            key: head.key,
            json: body.then(|| raw.get().to_owned()),
        });
    }
    Some(out)
}

/// The quota owner a row's `meta` names (`keys.owner`), if any.
pub fn owner_of(meta: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Meta {
        #[serde(default)]
        keys: Keys,
    }
    #[derive(Deserialize, Default)]
    struct Keys {
        #[serde(default)]
        owner: Option<String>,
    }
    serde_json::from_str::<Meta>(meta).ok()?.keys.owner
}

/// A kept row as a query returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptRow {
    /// The newest event about the key, exactly as it was stored.
    pub row: StoredRow,
    /// For a conversation: the timestamp of its newest turn (its `updatedAt` is at least
    /// that); `None` otherwise, or when it has no turns.
    pub last_turn_at: Option<u64>,
}

/// One page of a kept table, in its listing order, after (or before) a position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageQuery {
    /// Tasks in creation order (`created_at`, id), strictly after `after`.
    Tasks {
        /// Where the previous page ended.
        after: Option<(u64, String)>,
        /// Only tasks assigned to this agent.
        assignee: Option<String>,
        /// Only tasks with one of these statuses (empty: any).
        statuses: Vec<String>,
        /// At most this many rows.
        limit: usize,
    },
    /// Checkpoints newest first (timestamp, seq, id descending), strictly before `before`.
    Checkpoints {
        /// Where the previous page ended.
        before: Option<(u64, u64, String)>,
        /// Only this agent's.
        agent: Option<String>,
        /// Only those with a timestamp strictly after this.
        after_ts: Option<u64>,
        /// Only those with a timestamp strictly before this.
        before_ts: Option<u64>,
        /// At most this many rows.
        limit: usize,
    },
    /// Conversations in creation order (`created_at`, id), strictly after `after`.
    Conversations {
        /// Where the previous page ended.
        after: Option<(u64, String)>,
        /// Only those one of these ids takes (or took) part in (`None`: all).
        members: Option<Vec<String>>,
        /// At most this many rows.
        limit: usize,
    },
    /// One conversation's turns in the order they were recorded (by seq), strictly between
    /// two positions.
    Turns {
        /// The conversation.
        conversation: String,
        /// Only turns recorded after this seq.
        after_seq: Option<u64>,
        /// Only turns recorded before this seq.
        before_seq: Option<u64>,
        /// Newest first.
        desc: bool,
        /// At most this many rows.
        limit: usize,
    },
}

/// What loading one conversation reads: its row, its threads, and the counts the router keeps
/// current while it holds the conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversationLoad {
    /// The conversation's row (the newest conversation event).
    pub row: KeptRow,
    /// Its threads' rows, in creation order.
    pub threads: Vec<StoredRow>,
    /// How many turns it has.
    pub turns: u64,
    /// For each thread with turns and each of its authors: the thread, the author, how many
    /// turns and the newest timestamp among them.
    pub thread_authors: Vec<ThreadAuthor>,
}

/// How much one quota owner has created, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OwnerCounts {
    /// Tasks.
    pub tasks: u64,
    /// Conversations.
    pub conversations: u64,
    /// Checkpoints.
    pub checkpoints: u64,
}

/// How many items each paged table holds (the gauges `map_tasks`, `map_conversations`,
/// `map_checkpoints`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeptCounts {
    /// Tasks.
    pub tasks: u64,
    /// Conversations.
    pub conversations: u64,
    /// Checkpoints.
    pub checkpoints: u64,
}

/// A read of the kept tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeptQuery {
    /// The rows with these keys (absent keys are left out), in no particular order.
    Get {
        /// The table.
        table: KeptTable,
        /// The keys.
        keys: Vec<String>,
    },
    /// One page.
    Page(PageQuery),
    /// One conversation with its threads and counts.
    Conversation {
        /// Its id.
        id: String,
    },
    /// The seq of the first turn (in recording order) of a conversation whose timestamp is at
    /// least `ts`.
    TurnSeqAt {
        /// The conversation.
        conversation: String,
        /// Unix ms.
        ts: u64,
    },
    /// What one quota owner has created.
    OwnerCounts {
        /// The owner.
        owner: String,
    },
}

/// The answer to a [`KeptQuery`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeptAnswer {
    /// `Get` and `Page`.
    Rows(Vec<KeptRow>),
    /// `Conversation`.
    Conversation(Option<Box<ConversationLoad>>),
    /// `TurnSeqAt`.
    Seq(Option<u64>),
    /// `OwnerCounts`.
    Counts(OwnerCounts),
}

/// The turns one author wrote in one thread of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadAuthor {
    /// The thread.
    pub thread: String,
    /// The author.
    pub author: String,
    /// How many turns.
    pub turns: u64,
    /// The newest timestamp among them.
    pub last_at: u64,
}
