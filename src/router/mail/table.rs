//! [`Mailboxes`]: the conversations the router holds in memory (each with its participants, its
//! threads and its turn count, not its turns), where recent turns are, and how many
//! conversations there are. Both caches are bounded (`router::kept`): the store's
//! `conversations`, `threads` and `turns` tables have everything, and the turns themselves are
//! only ever read from there, a page at a time.

use std::sync::Arc;

use crate::protocol::methods::mail::{Conversation, ConversationState, Participant, Thread, Turn};
use crate::router::kept::cache::Cache;
use crate::store::kept::{ConversationLoad, KeptRow};
use crate::store::record::StoredRow;

/// A thread and the distinct authors of its turns (its creator counts as one).
#[derive(Debug, Clone)]
pub struct ThreadRec {
    /// The thread (`turnCount`, `participantCount`, `updatedAt` kept current).
    pub thread: Thread,
    authors: Vec<String>,
}

/// One conversation as the router decides on it: everything but its turns.
#[derive(Debug, Clone)]
pub struct Conv {
    /// The conversation (`participantCount` and `updatedAt` kept current).
    pub conversation: Conversation,
    /// Participants in join order, those that left included.
    pub participants: Vec<Participant>,
    /// Threads in creation order.
    pub threads: Vec<ThreadRec>,
    /// How many turns it has (the quota `max_turns_per_conversation`).
    pub turns: u64,
}

/// Where a turn is: its conversation, its position in the log (turns are listed in that
/// order) and its timestamp. What the checks of `inReplyTo`, `rootTurnId` and cursors need,
/// without the turn's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnPlace {
    /// Its conversation.
    pub conversation_id: String,
    /// The log position of its `mail.turn.added`.
    pub seq: u64,
}

impl TurnPlace {
    /// The place of a stored turn row.
    ///
    /// # Errors
    /// A row that is not a turn event.
    pub fn of_row(row: &StoredRow) -> Result<Self, String> {
        let turn = turn_of_row(row)?;
        Ok(Self {
            conversation_id: turn.conversation_id,
            seq: row.seq,
        })
    }
}

/// The turn a stored `mail.turn.added` row carries.
///
/// # Errors
/// A row that is not a turn event.
pub fn turn_of_row(row: &StoredRow) -> Result<Turn, String> {
    #[derive(serde::Deserialize)]
    struct Data {
        turn: Turn,
    }
    data_of(&row.json).map(|d: Data| d.turn)
}

fn data_of<T: serde::de::DeserializeOwned>(json: &str) -> Result<T, String> {
    #[derive(serde::Deserialize)]
    struct Event<T> {
        data: T,
    }
    serde_json::from_str::<Event<T>>(json)
        .map(|e| e.data)
        .map_err(|e| format!("not a mail event: {e}"))
}

/// The conversation and participants a stored conversation row carries, with `updatedAt` at
/// least its newest turn's timestamp.
///
/// # Errors
/// A row that is not a conversation event.
pub fn conversation_of_row(row: &KeptRow) -> Result<ConversationState, String> {
    let mut state: ConversationState = data_of(&row.row.json)?;
    if let Some(last) = row.last_turn_at {
        state.conversation.updated_at = state.conversation.updated_at.max(last);
    }
    Ok(state)
}

impl Conv {
    /// A conversation with these participants and nothing recorded yet.
    pub fn new(conversation: Conversation, participants: Vec<Participant>) -> Self {
        let mut c = Self {
            conversation,
            participants,
            threads: Vec::new(),
            turns: 0,
        };
        c.recount();
        c
    }

    /// A conversation as a load read it: its newest conversation event, its threads, and its
    /// turns counted.
    ///
    /// # Errors
    /// Rows this version cannot read.
    pub fn of_load(load: ConversationLoad) -> Result<Self, String> {
        let state = conversation_of_row(&load.row)?;
        let mut c = Self::new(state.conversation, state.participants);
        c.turns = load.turns;
        for row in &load.threads {
            #[derive(serde::Deserialize)]
            struct Data {
                thread: Thread,
            }
            let d: Data = data_of(&row.json)?;
            c.push_thread(d.thread);
        }
        for a in load.thread_authors {
            if let Some(t) = c.threads.iter_mut().find(|t| t.thread.id == a.thread) {
                t.thread.turn_count = t
                    .thread
                    .turn_count
                    .saturating_add(u32::try_from(a.turns).unwrap_or(u32::MAX));
                t.thread.updated_at = t.thread.updated_at.max(a.last_at);
                if !t.authors.contains(&a.author) {
                    t.authors.push(a.author);
                }
                t.recount();
            }
        }
        Ok(c)
    }

    /// The participant with this id (one that left included).
    pub fn participant(&self, id: &str) -> Option<&Participant> {
        self.participants.iter().find(|p| p.id == id)
    }

    /// The participant with this id that has not left.
    pub fn active(&self, id: &str) -> Option<&Participant> {
        self.participant(id).filter(|p| p.left_at.is_none())
    }

    /// Adds or replaces (by id) a participant.
    pub fn put_participant(&mut self, p: Participant) {
        match self.participants.iter_mut().find(|q| q.id == p.id) {
            Some(q) => *q = p,
            None => self.participants.push(p),
        }
        self.recount();
    }

    /// Keeps `participantCount` equal to the participants that have not left.
    fn recount(&mut self) {
        self.conversation.participant_count = self
            .participants
            .iter()
            .filter(|p| p.left_at.is_none())
            .count() as u32;
    }

    /// A thread by id.
    pub fn thread(&self, id: &str) -> Option<&Thread> {
        self.threads.iter().map(|t| &t.thread).find(|t| t.id == id)
    }

    /// The threads, in creation order.
    pub fn threads(&self) -> Vec<Thread> {
        self.threads.iter().map(|t| t.thread.clone()).collect()
    }

    /// Adds a thread (ignored when its id is already there).
    pub fn push_thread(&mut self, thread: Thread) {
        if self.thread(&thread.id).is_some() {
            return;
        }
        let mut t = ThreadRec {
            thread,
            authors: Vec::new(),
        };
        t.thread.turn_count = 0;
        t.recount();
        self.threads.push(t);
    }

    /// Counts a turn just recorded: the conversation's turns and `updatedAt`, its thread's.
    pub fn count_turn(&mut self, turn: &Turn) {
        self.turns += 1;
        self.conversation.updated_at = self.conversation.updated_at.max(turn.timestamp);
        if let Some(t) = turn
            .thread_id
            .as_ref()
            .and_then(|id| self.threads.iter_mut().find(|t| t.thread.id == *id))
        {
            t.thread.turn_count += 1;
            t.thread.updated_at = t.thread.updated_at.max(turn.timestamp);
            if !t.authors.contains(&turn.participant) {
                t.authors.push(turn.participant.clone());
            }
            t.recount();
        }
    }
}

impl ThreadRec {
    /// `participantCount`: the distinct authors of its turns, and its creator.
    fn recount(&mut self) {
        let creator = &self.thread.created_by;
        let others = self.authors.iter().filter(|a| *a != creator).count();
        self.thread.participant_count = (others + 1) as u32;
    }
}

/// The conversations' part in memory.
#[derive(Debug)]
pub struct Mailboxes {
    /// Conversations by id: those in use, at most about its capacity, plus writes not yet
    /// committed.
    pub convs: Cache<Conv>,
    /// Where turns are, by turn id: those recorded or looked up lately.
    pub turns: Cache<TurnPlace>,
    /// How many conversations exist (the gauge `map_conversations`).
    pub total: u64,
}

impl Mailboxes {
    /// Caches of `capacity` conversations (and four times as many turn places), over `total`
    /// stored conversations.
    pub fn new(capacity: usize, total: u64) -> Self {
        Self {
            convs: Cache::new(capacity),
            turns: Cache::new(capacity.saturating_mul(4)),
            total,
        }
    }

    /// Number of conversations.
    pub fn len(&self) -> usize {
        self.total as usize
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// A cached conversation to change (call `convs.written` after).
    pub fn get_mut(&mut self, id: &str) -> Option<&mut Conv> {
        self.convs.get_mut(id)
    }

    /// Stores where a turn just recorded is (its event at `seq`).
    pub fn put_turn(&mut self, turn: &Turn, seq: u64) {
        self.turns.put(
            &turn.id,
            Arc::new(TurnPlace {
                conversation_id: turn.conversation_id.clone(),
                seq,
            }),
            seq,
        );
    }
}
