//! [`Threads`]: the conversation of each message the MAMP and IM gateways brought into MAP for
//! an outside caller, so that a MAP agent's reply reaches the caller *in the caller's
//! conversation* (docs/gateways.md, "Replies") even when the reply carries no `meta.mail`: the
//! Rust client's and the SDK's `reply()` address `{agent: original.from}` with
//! `meta.correlationId` = the original's id, and nothing else.
//!
//! The rule a message to an outside agent is threaded by: its own
//! `meta.mail.conversationId`; else the conversation of the message its `meta.correlationId`
//! (or `meta.inReplyTo`) names, when that is one of ours; else none.
//!
//! Owns: MAP message id → our conversation id, for the messages the gateways sent; at most
//! [`MAX_THREADS`], the least recently used forgotten first (a reply to a message that old
//! arrives without a conversation id), in memory (a restart forgets them).

use std::sync::Mutex;

use serde_json::Value;

use crate::gateway::recency::BoundedMap;
use crate::protocol::json::RawJson;
use crate::protocol::message::Message;

/// Most messages remembered (about 100 bytes each).
pub const MAX_THREADS: usize = 65_536;

/// Which conversation each message sent for an outside caller belongs to.
#[derive(Debug)]
pub struct Threads {
    map: Mutex<BoundedMap<String, String>>,
}

impl Default for Threads {
    fn default() -> Self {
        Self {
            map: Mutex::new(BoundedMap::new(MAX_THREADS)),
        }
    }
}

use crate::sync::lock;

/// `meta.mail.conversationId` of `meta`.
pub fn mail_conversation(meta: Option<&RawJson>) -> Option<String> {
    let meta = meta?;
    if !meta.get().contains("\"mail\"") {
        return None;
    }
    meta.to_value()
        .pointer("/mail/conversationId")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// The message ids `message` answers: its `meta.correlationId` and `meta.inReplyTo`.
fn answers(message: &Message) -> Vec<String> {
    let Some(meta) = message.meta.as_ref() else {
        return Vec::new();
    };
    let v = meta.to_value();
    ["correlationId", "inReplyTo"]
        .iter()
        .filter_map(|k| v.get(*k).and_then(Value::as_str).map(str::to_owned))
        .collect()
}

impl Threads {
    /// Records that MAP message `message_id` (sent by a gateway for an outside caller) is in
    /// `conversation`.
    pub fn record(&self, message_id: &str, conversation: &str) {
        lock(&self.map).insert(message_id.to_owned(), conversation.to_owned());
    }

    /// The conversation `message` (to an outside agent) belongs to, by the rule of the module
    /// doc.
    pub fn conversation_of(&self, message: &Message) -> Option<String> {
        if let Some(c) = mail_conversation(message.meta.as_ref()) {
            return Some(c);
        }
        let mut map = lock(&self.map);
        answers(message).iter().find_map(|id| map.get(id).cloned())
    }

    /// Messages remembered.
    pub fn len(&self) -> usize {
        lock(&self.map).len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
