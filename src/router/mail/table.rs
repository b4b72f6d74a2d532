//! [`Mailboxes`]: every conversation with its participants, turns (in order) and threads.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::protocol::methods::mail::{Conversation, ConversationState, Participant, Thread, Turn};
use crate::store::record::{EventRecord, StoredRow};

/// One conversation and everything in it.
#[derive(Debug)]
pub struct Conv {
    /// The conversation (`participantCount` and `updatedAt` kept current).
    pub conversation: Conversation,
    /// Participants in join order, those that left included.
    pub participants: Vec<Participant>,
    /// Turns in the order they were recorded.
    pub turns: Vec<Arc<Turn>>,
    /// Turn id → index in `turns`.
    turn_index: HashMap<String, usize>,
    /// Threads in creation order (`turnCount`, `participantCount` kept current).
    pub threads: Vec<Thread>,
}

impl Conv {
    /// A conversation with these participants and nothing recorded yet.
    pub fn new(conversation: Conversation, participants: Vec<Participant>) -> Self {
        let mut c = Self {
            conversation,
            participants,
            turns: Vec::new(),
            turn_index: HashMap::new(),
            threads: Vec::new(),
        };
        c.recount();
        c
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

    /// A turn by id, with its index.
    pub fn turn(&self, id: &str) -> Option<(usize, &Arc<Turn>)> {
        self.turn_index.get(id).map(|&i| (i, &self.turns[i]))
    }

    /// Appends a turn (ignored when its id is already there).
    pub fn push_turn(&mut self, turn: Turn) {
        if self.turn_index.contains_key(&turn.id) {
            return;
        }
        self.conversation.updated_at = self.conversation.updated_at.max(turn.timestamp);
        if let Some(t) = turn
            .thread_id
            .as_ref()
            .and_then(|id| self.threads.iter_mut().find(|t| t.id == *id))
        {
            t.turn_count += 1;
            t.updated_at = t.updated_at.max(turn.timestamp);
        }
        self.turn_index.insert(turn.id.clone(), self.turns.len());
        self.turns.push(Arc::new(turn));
        self.recount_thread_authors();
    }

    /// A thread by id.
    pub fn thread(&self, id: &str) -> Option<&Thread> {
        self.threads.iter().find(|t| t.id == id)
    }

    /// Adds a thread (ignored when its id is already there), counting the turns it has.
    pub fn push_thread(&mut self, mut thread: Thread) {
        if self.thread(&thread.id).is_some() {
            return;
        }
        thread.turn_count = self
            .turns
            .iter()
            .filter(|t| t.thread_id.as_deref() == Some(thread.id.as_str()))
            .count() as u32;
        self.threads.push(thread);
        self.recount_thread_authors();
    }

    /// Each thread's `participantCount`: the distinct authors of its turns, and its creator.
    fn recount_thread_authors(&mut self) {
        for th in &mut self.threads {
            let mut authors: BTreeSet<&str> = self
                .turns
                .iter()
                .filter(|t| t.thread_id.as_deref() == Some(th.id.as_str()))
                .map(|t| t.participant.as_str())
                .collect();
            authors.insert(th.created_by.as_str());
            th.participant_count = authors.len() as u32;
        }
    }
}

/// Every conversation the router knows.
#[derive(Debug, Default)]
pub struct Mailboxes {
    convs: HashMap<String, Conv>,
    /// (createdAt, id): creation order.
    order: BTreeSet<(u64, String)>,
}

impl Mailboxes {
    /// What the store kept: the newest conversation event of each conversation, every turn
    /// and every thread (each in log order). Rows that cannot be read are skipped with a
    /// warning (they stay in the database).
    pub fn recover(
        conversations: &[StoredRow],
        turns: &[StoredRow],
        threads: &[StoredRow],
    ) -> Self {
        #[derive(serde::Deserialize)]
        struct Event<T> {
            data: T,
        }
        #[derive(serde::Deserialize)]
        struct TurnData {
            turn: Turn,
        }
        #[derive(serde::Deserialize)]
        struct ThreadData {
            thread: Thread,
        }
        fn read<T: serde::de::DeserializeOwned>(row: &StoredRow) -> Option<T> {
            match EventRecord::from_row(row.clone()).and_then(|rec| {
                serde_json::from_str::<Event<T>>(&rec.json)
                    .map(|e| e.data)
                    .map_err(|e| e.to_string())
            }) {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::warn!(event = %row.id, error = %e, "skipping a stored mail row");
                    None
                }
            }
        }
        let mut m = Self::default();
        for row in conversations {
            if let Some(state) = read::<ConversationState>(row) {
                m.put_state(state);
            }
        }
        // Threads before turns would miscount nothing: push_turn counts into threads that
        // exist, push_thread counts the turns already there. Both orders give the same counts.
        for row in threads {
            if let Some(d) = read::<ThreadData>(row) {
                if let Some(c) = m.convs.get_mut(&d.thread.conversation_id) {
                    c.push_thread(d.thread);
                }
            }
        }
        for row in turns {
            if let Some(d) = read::<TurnData>(row) {
                if let Some(c) = m.convs.get_mut(&d.turn.conversation_id) {
                    c.push_turn(d.turn);
                }
            }
        }
        m
    }

    /// Number of conversations.
    pub fn len(&self) -> usize {
        self.convs.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.convs.is_empty()
    }

    /// A conversation by id.
    pub fn get(&self, id: &str) -> Option<&Conv> {
        self.convs.get(id)
    }

    /// A conversation by id, to change it.
    pub fn get_mut(&mut self, id: &str) -> Option<&mut Conv> {
        self.convs.get_mut(id)
    }

    /// Adds a conversation.
    pub fn insert(&mut self, conv: Conv) {
        let c = &conv.conversation;
        self.order.insert((c.created_at, c.id.clone()));
        self.convs.insert(c.id.clone(), conv);
    }

    /// Sets a conversation and its participants from a conversation event (keeping its turns
    /// and threads).
    fn put_state(&mut self, state: ConversationState) {
        let id = state.conversation.id.clone();
        match self.convs.get_mut(&id) {
            Some(c) => {
                c.conversation = state.conversation;
                c.participants = state.participants;
                c.recount();
            }
            None => self.insert(Conv::new(state.conversation, state.participants)),
        }
    }

    /// Conversations in creation order, strictly after `after` when given.
    pub fn in_order<'a>(
        &'a self,
        after: Option<&(u64, String)>,
    ) -> impl Iterator<Item = &'a Conv> + 'a {
        let range = match after {
            Some(a) => self.order.range((
                std::ops::Bound::Excluded(a.clone()),
                std::ops::Bound::Unbounded,
            )),
            None => self.order.range(..),
        };
        range.filter_map(|(_, id)| self.convs.get(id))
    }
}
