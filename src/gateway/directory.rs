//! [`Directory`]: the gateways' read model, folded from the MAP event log by the service
//! session (a `system` participant, so it sees every event): who exchanged how many messages
//! with whom and when, in which conversations, and each agent's presence as the log tells it.
//! Plus the one thing the log cannot know: which IM agents hold a live WebSocket right now
//! (`live`), updated by `im/connect.rs`.
//!
//! It starts by reading the whole retained log (`map/replay`, page by page, so a restarted
//! router answers with what happened before the restart), then follows a subscription from
//! the last event it read. It is a reader only: it never writes to the router.
//!
//! Answers are per reader ([`View`]): a caller that may see everything (authentication off, or
//! a system principal) gets the whole model; any other sees
//! - an agent only when it is its own (the caller's closure says which ids are), or an
//!   ordinary participant was shown its registration: the **public view**, a second service
//!   session that is an ordinary `client` (owning nothing, in no scope) and follows
//!   `agent_registered`, so the router's own visibility rules (exposure, `visibility`) decide
//!   it. An agent hidden from MAP clients is never listed, counted as a peer or given a status;
//! - a conversation (its subject, last message, participants, collaborators) only when one of
//!   its participants is its own: mail conversations are their participants' business.
//!
//! Counting: a message counts once for its sender (`message_sent`) and once for each
//! recipient it reached (`message_delivered`); its conversation is `meta.mail.conversationId`,
//! else (a reply without `meta.mail`) the conversation of the message its
//! `meta.correlationId` or `meta.inReplyTo` names: replies are threaded into the conversation
//! they answer (`threads.rs` states the rule).
//!
//! Bounds (no caller can make it grow without end): contacts of agents that are not online
//! are kept up to `max_contacts`, conversations up to `max_conversations`, the least recently
//! active forgotten first (an online agent is never forgotten: the router's own quotas bound
//! those); each contact keeps its last [`MAX_CONVERSATIONS_PER_CONTACT`] conversations and
//! [`MAX_PEERS_PER_CONTACT`] peers (its counts go on counting), each conversation
//! [`MAX_PARTICIPANTS_PER_CONVERSATION`] participants, and [`REMEMBERED_MESSAGES`] message ids
//! are remembered for threading. A contact keeps the capabilities its last IM registration
//! declared (also after its socket closed, and after a restart, from the registration's
//! metadata in the log).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use serde_json::{json, Value};

use crate::client::Client;
use crate::gateway::recency::Recency;
use crate::gateway::wire::{iso8601, now_ms, GatewayError};
use crate::protocol::event::{Event, SubscriptionFilter};
use crate::protocol::methods::events::{ReplayParams, SubscribeParams};

/// Event types the directory folds.
const FOLDED: &[&str] = &[
    "message_sent",
    "message_delivered",
    "agent_registered",
    "agent_unregistered",
    "agent_orphaned",
    "agent.presence.changed",
    "mail.created",
    "mail.participant.joined",
    "mail.participant.left",
    "mail.closed",
];

/// Replay page size while catching up.
const REPLAY_PAGE: u32 = 1000;
/// Message ids remembered to find the conversation of a `message_delivered` whose event does
/// not carry the message (multicast): enough for any burst between a send and its deliveries.
const REMEMBERED_MESSAGES: usize = 10_000;
/// Conversations listed in a contact's `recent_conversations`.
const RECENT_CONVERSATIONS: usize = 10;
/// Characters of a message kept as a conversation's `last_message` / a collaborator's summary.
const PREVIEW_CHARS: usize = 200;
/// Conversations a contact remembers (its most recent); `total_conversations` goes on counting.
pub const MAX_CONVERSATIONS_PER_CONTACT: usize = 64;
/// Peers a contact remembers (its most recent).
pub const MAX_PEERS_PER_CONTACT: usize = 64;
/// Participants a conversation remembers (the first ones to join or speak).
pub const MAX_PARTICIPANTS_PER_CONVERSATION: usize = 256;

/// The read model. All reads take a snapshot under a std mutex, never held across an await.
/// Lock order: `live` before `state`, never the other way.
#[derive(Debug)]
pub struct Directory {
    state: Mutex<State>,
    live: Mutex<HashMap<String, Live>>,
}

/// How big the read model's tables are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirectorySizes {
    /// Contacts (agents and participants the log mentioned), online or not.
    pub contacts: usize,
    /// Conversations.
    pub conversations: usize,
    /// Message ids remembered for threading deliveries and replies.
    pub remembered_messages: usize,
    /// Live IM connections.
    pub live: usize,
}

/// Who reads, and so what an answer may show (module doc).
#[derive(Clone, Copy)]
pub enum View<'a> {
    /// Everything.
    All,
    /// What an ordinary participant may see, plus what the closure says is the reader's own
    /// (an agent id, a participant id, an IM or outside sender's URI).
    Limited(&'a dyn Fn(&str) -> bool),
}

impl std::fmt::Debug for View<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            View::All => "View::All",
            View::Limited(_) => "View::Limited",
        })
    }
}

/// A live IM connection (what `GET /gateway/agents` lists).
#[derive(Debug, Clone)]
pub struct Live {
    /// `capabilities` of its `register` frame.
    pub capabilities: Value,
    /// When it registered (Unix ms).
    pub connected_at: u64,
    /// Its latest frame (Unix ms).
    pub last_seen: u64,
}

#[derive(Debug, Default)]
struct State {
    agents: HashMap<String, AgentRec>,
    /// Agents that are not online, least recently active first (forgotten past the cap).
    idle: Recency<String>,
    max_contacts: usize,
    conversations: HashMap<String, ConvRec>,
    /// Conversations, least recently active first (forgotten past the cap).
    conversation_order: Recency<String>,
    max_conversations: usize,
    /// message id → (conversation, preview), for deliveries and replies.
    messages: HashMap<String, (Option<String>, String)>,
    message_order: VecDeque<String>,
}

#[derive(Debug, Default, Clone)]
struct AgentRec {
    name: Option<String>,
    online: bool,
    last_seen: u64,
    first_contact: u64,
    last_contact: u64,
    total_messages: u64,
    /// Most recent last.
    peers: VecDeque<String>,
    /// Most recent last.
    conversations: VecDeque<String>,
    total_conversations: u64,
    /// What its last IM registration declared.
    capabilities: Option<Value>,
    /// Whether the public view was shown its registration.
    public: bool,
    /// An IM agent whose connection ended in this process: its last frame.
    im_gone: Option<u64>,
    /// Whether the log told of its registration (else it is a participant, or only a name in
    /// a message).
    registered: bool,
}

/// Puts `item` last in `list` (moving it there if present); `true` when it is new. Keeps at
/// most `cap`, dropping the oldest.
fn remember_recent(list: &mut VecDeque<String>, item: &str, cap: usize) -> bool {
    if let Some(at) = list.iter().position(|x| x == item) {
        if let Some(x) = list.remove(at) {
            list.push_back(x);
        }
        return false;
    }
    list.push_back(item.to_owned());
    while list.len() > cap {
        list.pop_front();
    }
    true
}

impl State {
    /// The record of `id`, made when new.
    fn agent(&mut self, id: &str) -> &mut AgentRec {
        self.agents.entry(id.to_owned()).or_default()
    }

    /// After `id`'s record changed: an online agent is kept, any other goes to the back of
    /// the idle order; the least recently active idle ones past the cap are forgotten.
    fn settle_agent(&mut self, id: &str) {
        match self.agents.get(id) {
            Some(a) if a.online => {
                self.idle.remove(&id.to_owned());
            }
            Some(_) => self.idle.touch(&id.to_owned()),
            None => {
                self.idle.remove(&id.to_owned());
            }
        }
        while self.idle.len() > self.max_contacts {
            match self.idle.pop_oldest() {
                Some(old) => {
                    self.agents.remove(&old);
                }
                None => break,
            }
        }
    }

    /// The record of conversation `id`, made when new.
    fn conversation(&mut self, id: &str) -> &mut ConvRec {
        self.conversations.entry(id.to_owned()).or_default()
    }

    /// After conversation `id` changed: to the back of the order; the least recently active
    /// past the cap are forgotten.
    fn settle_conversation(&mut self, id: &str) {
        self.conversation_order.touch(&id.to_owned());
        while self.conversations.len() > self.max_conversations {
            match self.conversation_order.pop_oldest() {
                Some(old) => {
                    self.conversations.remove(&old);
                }
                None => break,
            }
        }
    }

    /// Adds `who` to conversation `conv` (within the cap).
    fn participant(&mut self, conv: &str, who: &str) -> Option<&mut PartRec> {
        let c = self.conversation(conv);
        if !c.participants.contains_key(who)
            && c.participants.len() >= MAX_PARTICIPANTS_PER_CONVERSATION
        {
            return None;
        }
        Some(c.participants.entry(who.to_owned()).or_default())
    }

    /// The conversation a message belongs to: `meta.mail.conversationId`, else that of the
    /// message it answers (`meta.correlationId`, `meta.inReplyTo`), when remembered.
    fn conversation_of(&self, message: &Value) -> Option<String> {
        if let Some(c) = message
            .pointer("/meta/mail/conversationId")
            .and_then(Value::as_str)
        {
            return Some(c.to_owned());
        }
        ["/meta/correlationId", "/meta/inReplyTo"]
            .iter()
            .filter_map(|p| message.pointer(p).and_then(Value::as_str))
            .find_map(|id| self.messages.get(id).and_then(|(c, _)| c.clone()))
    }

    /// Whether `view` may see agent (or participant) `id`.
    fn sees(&self, view: View<'_>, id: &str) -> bool {
        match view {
            View::All => true,
            View::Limited(own) => own(id) || self.agents.get(id).is_some_and(|a| a.public),
        }
    }
}

#[derive(Debug, Default, Clone)]
struct ConvRec {
    subject: Option<String>,
    started_at: u64,
    last_message_at: u64,
    last_message: String,
    closed: bool,
    total_messages: u64,
    participants: BTreeMap<String, PartRec>,
}

#[derive(Debug, Default, Clone)]
struct PartRec {
    joined_at: u64,
    last_message_at: u64,
    summary: String,
    /// Whether its latest act was sending (then it waits for an answer).
    last_sent: bool,
    left: bool,
}

impl Directory {
    /// Folds the retained log with `client` (a system participant), then follows it live;
    /// `public` (an ordinary participant's session, with authentication on) feeds the public
    /// view the same way.
    ///
    /// # Errors
    /// [`GatewayError::Map`] when a replay or a subscription fails.
    pub async fn start(
        client: Client,
        public: Option<Client>,
        max_contacts: usize,
        max_conversations: usize,
    ) -> Result<Arc<Self>, GatewayError> {
        let dir = Arc::new(Self::new(max_contacts, max_conversations));
        follow(&client, FOLDED, Arc::clone(&dir), Self::fold).await?;
        if let Some(public) = public {
            follow(
                &public,
                &["agent_registered"],
                Arc::clone(&dir),
                Self::fold_public,
            )
            .await?;
        }
        Ok(dir)
    }

    /// An empty read model with these caps (folding nothing yet).
    pub fn new(max_contacts: usize, max_conversations: usize) -> Self {
        Self {
            state: Mutex::new(State {
                max_contacts: max_contacts.max(1),
                max_conversations: max_conversations.max(1),
                ..State::default()
            }),
            live: Mutex::new(HashMap::new()),
        }
    }

    /// The sizes of its tables.
    pub fn sizes(&self) -> DirectorySizes {
        let live = self.live.lock().map_or(0, |l| l.len());
        let Ok(st) = self.state.lock() else {
            return DirectorySizes::default();
        };
        DirectorySizes {
            contacts: st.agents.len(),
            conversations: st.conversations.len(),
            remembered_messages: st.messages.len(),
            live,
        }
    }

    fn fold_public(&self, e: &Event) {
        let id = e
            .data
            .as_ref()
            .and_then(|d| d.to_value().get("agentId")?.as_str().map(str::to_owned));
        if let (Some(id), Ok(mut st)) = (id, self.state.lock()) {
            st.agent(&id).public = true;
            st.settle_agent(&id);
        }
    }

    /// Folds one event (the public view's are [`Directory::fold_public`]'s).
    pub fn fold(&self, e: &Event) {
        let data = e.data.as_ref().map_or(Value::Null, |d| d.to_value());
        let ts = e.timestamp;
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        let st = &mut *st;
        let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        match e.kind.as_str() {
            "agent_registered" => {
                if let Some(id) = text(&data, "agentId") {
                    let a = st.agent(&id);
                    a.online = true;
                    a.registered = true;
                    a.last_seen = ts;
                    if let Some(name) = text(&data, "name") {
                        a.name = Some(name);
                    }
                    let meta = data.get("metadata");
                    if meta.and_then(|m| m.get("gateway")).and_then(Value::as_str) == Some("im") {
                        if let Some(caps) = meta.and_then(|m| m.get("capabilities")) {
                            a.capabilities = Some(caps.clone());
                        }
                    }
                    st.settle_agent(&id);
                }
            }
            "agent_unregistered" | "agent_orphaned" => {
                if let Some(id) = text(&data, "agentId") {
                    let a = st.agent(&id);
                    a.online = false;
                    a.last_seen = a.last_seen.max(ts);
                    st.settle_agent(&id);
                }
            }
            "agent.presence.changed" => {
                if let Some(id) = text(&data, "agentId") {
                    let a = st.agent(&id);
                    a.online = data.get("status").and_then(Value::as_str) == Some("online");
                    a.last_seen = data
                        .get("lastSeen")
                        .or_else(|| data.get("since"))
                        .and_then(Value::as_u64)
                        .unwrap_or(ts)
                        .max(a.last_seen);
                    st.settle_agent(&id);
                }
            }
            "message_sent" => {
                let (Some(id), Some(from)) = (text(&data, "messageId"), text(&data, "from")) else {
                    return;
                };
                let message = data.get("message").cloned().unwrap_or(Value::Null);
                let conv = st.conversation_of(&message);
                let preview = preview(message.get("payload").or_else(|| data.get("payload")));
                remember(st, &id, conv.clone(), preview.clone());
                count(st, &from, None, conv.as_deref(), ts, &preview, true);
            }
            "message_delivered" => {
                let Some(id) = text(&data, "messageId") else {
                    return;
                };
                let from = text(&data, "from").unwrap_or_default();
                let remembered = st.messages.get(&id).cloned();
                let (conv, preview) = match (data.get("message"), remembered) {
                    (Some(m), remembered) => (
                        st.conversation_of(m)
                            .or_else(|| remembered.and_then(|(c, _)| c)),
                        preview(m.get("payload")),
                    ),
                    (None, Some(r)) => r,
                    (None, None) => (None, String::new()),
                };
                let to: Vec<String> = data
                    .get("deliveredTo")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                for r in to {
                    count(st, &r, Some(&from), conv.as_deref(), ts, &preview, false);
                    if let Some(f) = st.agents.get_mut(&from) {
                        remember_recent(&mut f.peers, &r, MAX_PEERS_PER_CONTACT);
                    }
                }
            }
            "mail.created" => {
                if let Some(id) = text(&data, "conversationId") {
                    let c = st.conversation(&id);
                    c.started_at = if c.started_at == 0 { ts } else { c.started_at };
                    c.subject = data
                        .pointer("/conversation/subject")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                    st.settle_conversation(&id);
                }
            }
            "mail.participant.joined" => {
                let id = text(&data, "conversationId");
                let who = data
                    .pointer("/participant/id")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                if let (Some(id), Some(who)) = (id, who) {
                    let c = st.conversation(&id);
                    if c.started_at == 0 {
                        c.started_at = ts;
                    }
                    if let Some(p) = st.participant(&id, &who) {
                        p.joined_at = ts;
                        p.left = false;
                    }
                    st.settle_conversation(&id);
                    let a = st.agent(&who);
                    if remember_recent(&mut a.conversations, &id, MAX_CONVERSATIONS_PER_CONTACT) {
                        a.total_conversations += 1;
                    }
                    st.settle_agent(&who);
                }
            }
            "mail.participant.left" => {
                let id = text(&data, "conversationId");
                let who = text(&data, "participantId");
                if let (Some(id), Some(who)) = (id, who) {
                    if let Some(p) = st
                        .conversations
                        .get_mut(&id)
                        .and_then(|c| c.participants.get_mut(&who))
                    {
                        p.left = true;
                    }
                }
            }
            "mail.closed" => {
                if let Some(id) = text(&data, "conversationId") {
                    st.conversation(&id).closed = true;
                    st.settle_conversation(&id);
                }
            }
            _ => {}
        }
    }

    // -----------------------------------------------------------------------------------------
    // Live IM connections (im/connect.rs)
    // -----------------------------------------------------------------------------------------

    /// An IM agent registered on a live connection.
    pub fn connected(&self, uri: &str, capabilities: Value) {
        let now = now_ms();
        if let Ok(mut live) = self.live.lock() {
            live.insert(
                uri.to_owned(),
                Live {
                    capabilities: capabilities.clone(),
                    connected_at: now,
                    last_seen: now,
                },
            );
        }
        if let Ok(mut st) = self.state.lock() {
            let a = st.agent(uri);
            a.im_gone = None;
            a.capabilities = Some(capabilities);
            st.settle_agent(uri);
        }
    }

    /// A frame arrived on an IM agent's connection.
    pub fn heard(&self, uri: &str) {
        if let Ok(mut live) = self.live.lock() {
            if let Some(l) = live.get_mut(uri) {
                l.last_seen = now_ms();
            }
        }
    }

    /// An IM agent's connection ended (closed, or its heartbeats stopped).
    pub fn disconnected(&self, uri: &str) {
        let gone = self.live.lock().ok().and_then(|mut l| l.remove(uri));
        if let (Some(gone), Ok(mut st)) = (gone, self.state.lock()) {
            let a = st.agent(uri);
            a.im_gone = Some(gone.last_seen);
            a.last_seen = a.last_seen.max(gone.last_seen);
            st.settle_agent(uri);
        }
    }

    /// Whether the log told of an agent (registered at some point, still remembered) whose id
    /// or name is `id_or_name`.
    pub fn knows_agent(&self, id_or_name: &str) -> bool {
        self.state.lock().is_ok_and(|st| {
            st.agents.get(id_or_name).is_some_and(|a| a.registered)
                || st
                    .agents
                    .values()
                    .any(|a| a.registered && a.name.as_deref() == Some(id_or_name))
        })
    }

    /// Whether an IM agent holds a live connection under `uri`.
    pub fn is_live(&self, uri: &str) -> bool {
        self.live.lock().is_ok_and(|l| l.contains_key(uri))
    }

    // -----------------------------------------------------------------------------------------
    // Reads
    // -----------------------------------------------------------------------------------------

    /// `{agent_uri, status, last_seen}` of the agent with MAP id `id` shown as `uri`; `None`
    /// when the directory never heard of it, or `view` may not see it.
    pub fn status(&self, id: &str, uri: &str, view: View<'_>) -> Option<Value> {
        let live = self.live.lock().ok()?.get(id).cloned();
        let st = self.state.lock().ok()?;
        status_in(&st, live.as_ref(), id, uri, view)
    }

    /// The live IM connections `view` may see: `(uri, Live)`, sorted by URI.
    pub fn online(&self, view: View<'_>) -> Vec<(String, Live)> {
        let mut out: Vec<_> = self
            .live
            .lock()
            .map(|l| l.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        if let Ok(st) = self.state.lock() {
            out.retain(|(uri, _)| st.sees(view, uri));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Every agent `view` may see that sent or received a message, or connected over IM, as
    /// contacts; `uri_of` turns a MAP agent id into its URI.
    pub fn contacts(&self, view: View<'_>, uri_of: &dyn Fn(&str) -> String) -> Vec<Value> {
        let live = self.live.lock().map(|l| l.clone()).unwrap_or_default();
        let Ok(st) = self.state.lock() else {
            return Vec::new();
        };
        let mut ids: Vec<&String> = st
            .agents
            .iter()
            .filter(|(id, a)| a.total_messages > 0 || id.starts_with("agent://"))
            .map(|(id, _)| id)
            .chain(live.keys())
            .collect();
        ids.sort();
        ids.dedup();
        ids.into_iter()
            .filter_map(|id| contact_in(&st, live.get(id), id, view, uri_of))
            .collect()
    }

    /// One contact in the seed's shape, plus `status`/`last_seen`; `None` if unknown (or not
    /// for `view`). Its conversations and peers are those `view` may see.
    pub fn contact(
        &self,
        id: &str,
        view: View<'_>,
        uri_of: &dyn Fn(&str) -> String,
    ) -> Option<Value> {
        let live = self.live.lock().ok()?.get(id).cloned();
        let st = self.state.lock().ok()?;
        contact_in(&st, live.as_ref(), id, view, uri_of)
    }

    /// The conversations agent `id` took part in that `view` takes part in too, newest first;
    /// `None` if the agent is unknown (or not for `view`).
    pub fn conversations_of(
        &self,
        id: &str,
        view: View<'_>,
        uri_of: &dyn Fn(&str) -> String,
    ) -> Option<Value> {
        let st = self.state.lock().ok()?;
        if !st.sees(view, id) {
            return None;
        }
        let a = st.agents.get(id)?;
        let mut list: Vec<(&String, &ConvRec)> = a
            .conversations
            .iter()
            .filter_map(|c| st.conversations.get(c).map(|r| (c, r)))
            .filter(|(_, r)| takes_part(view, r))
            .collect();
        list.sort_by_key(|x| std::cmp::Reverse(x.1.last_message_at));
        Some(Value::Array(
            list.into_iter()
                .map(|(cid, c)| {
                    let mut v = conversation_summary(cid, c);
                    v["total_messages"] = c.total_messages.into();
                    v["participants"] = c
                        .participants
                        .keys()
                        .map(|p| Value::String(uri_of(p)))
                        .collect();
                    v
                })
                .collect(),
        ))
    }

    /// The collaborators of a conversation (seed 002's "active collaborators" of a trace: our
    /// trace is the conversation); `None` if the conversation is unknown, or `view` does not
    /// take part in it (existence does not leak).
    pub fn collaborators(
        &self,
        conv: &str,
        view: View<'_>,
        uri_of: &dyn Fn(&str) -> String,
    ) -> Option<Value> {
        let st = self.state.lock().ok()?;
        let c = st.conversations.get(conv)?;
        if !takes_part(view, c) {
            return None;
        }
        Some(Value::Array(
            c.participants
                .iter()
                .map(|(id, p)| {
                    let status = if c.closed || p.left {
                        "completed"
                    } else if p.last_sent {
                        "waiting"
                    } else {
                        "running"
                    };
                    json!({
                        "name": st.agents.get(id).and_then(|a| a.name.clone()).unwrap_or_else(|| uri_of(id)),
                        "type": "agent",
                        "agent_uri": uri_of(id),
                        "agent_id": id,
                        "trace_id": conv,
                        "conversation_id": conv,
                        "status": status,
                        "summary": p.summary,
                        "last_message_at": (p.last_message_at > 0).then(|| iso8601(p.last_message_at)),
                    })
                })
                .collect(),
        ))
    }
}

/// Whether `view` takes part in conversation `c` (one of its participants is the reader's).
fn takes_part(view: View<'_>, c: &ConvRec) -> bool {
    match view {
        View::All => true,
        View::Limited(own) => c.participants.keys().any(|p| own(p)),
    }
}

/// [`Directory::status`] under the state lock; `live`: its live IM connection, if any.
fn status_in(
    st: &State,
    live: Option<&Live>,
    id: &str,
    uri: &str,
    view: View<'_>,
) -> Option<Value> {
    if !st.sees(view, id) {
        return None;
    }
    let rec = st.agents.get(id);
    if live.is_none() && rec.is_none() {
        return None;
    }
    let gone = rec.and_then(|r| r.im_gone);
    let (online, last_seen) = match (live, rec) {
        (Some(l), _) => (true, l.last_seen),
        // An IM agent is online only with a live connection (its MAP agent may linger,
        // orphaned, for the resume window).
        (None, Some(r)) => (
            r.online && gone.is_none() && !id.starts_with("agent://"),
            r.last_seen.max(gone.unwrap_or(0)),
        ),
        (None, None) => (false, 0),
    };
    let last_seen = if online {
        now_ms().max(last_seen)
    } else {
        last_seen
    };
    Some(json!({
        "agent_uri": uri,
        "status": if online { "online" } else { "offline" },
        "last_seen": iso8601(last_seen),
    }))
}

/// [`Directory::contact`] under the state lock.
fn contact_in(
    st: &State,
    live: Option<&Live>,
    id: &str,
    view: View<'_>,
    uri_of: &dyn Fn(&str) -> String,
) -> Option<Value> {
    let uri = uri_of(id);
    let status = status_in(st, live, id, &uri, view)?;
    let empty = AgentRec::default();
    let a = st.agents.get(id).unwrap_or(&empty);
    // The live connection's capabilities, else the last ones it registered with.
    let capabilities = live
        .map(|l| l.capabilities.clone())
        .or_else(|| a.capabilities.clone())
        .unwrap_or(Value::Array(Vec::new()));
    let mut recent: Vec<(&String, &ConvRec)> = a
        .conversations
        .iter()
        .filter_map(|c| st.conversations.get(c).map(|r| (c, r)))
        .filter(|(_, r)| takes_part(view, r))
        .collect();
    recent.sort_by_key(|x| std::cmp::Reverse(x.1.last_message_at));
    let recent: Vec<Value> = recent
        .into_iter()
        .take(RECENT_CONVERSATIONS)
        .map(|(id, c)| conversation_summary(id, c))
        .collect();
    Some(json!({
        "agent_uri": uri,
        "agent_id": id,
        "name": a.name.clone().unwrap_or_else(|| uri.clone()),
        "type": "agent",
        "card": {"capabilities": capabilities},
        "stats": {
            "first_contact": (a.first_contact > 0).then(|| iso8601(a.first_contact)),
            "last_contact": (a.last_contact > 0).then(|| iso8601(a.last_contact)),
            "total_conversations": a.total_conversations,
            "total_messages": a.total_messages,
        },
        "recent_conversations": recent,
        "peers": a
            .peers
            .iter()
            .filter(|p| st.sees(view, p))
            .map(|p| uri_of(p))
            .collect::<Vec<_>>(),
        "tags": [],
        "pinned": false,
        "status": status["status"],
        "last_seen": status["last_seen"],
    }))
}

/// Folds what `client` may read of the events `kinds` with `fold`: the retained log page by
/// page, then a live subscription from the last event read.
async fn follow(
    client: &Client,
    kinds: &[&str],
    dir: Arc<Directory>,
    fold: fn(&Directory, &Event),
) -> Result<(), GatewayError> {
    let filter = SubscriptionFilter {
        event_types: Some(kinds.iter().map(|s| (*s).to_owned()).collect()),
        ..SubscriptionFilter::default()
    };
    let mut after: Option<String> = None;
    loop {
        let page = client
            .replay(ReplayParams {
                after_event_id: after.clone(),
                filter: Some(filter.clone()),
                limit: Some(REPLAY_PAGE),
                ..ReplayParams::default()
            })
            .await?;
        for e in &page.events {
            fold(&dir, &e.event);
            after = Some(e.event_id.to_string());
        }
        if !page.has_more || page.events.is_empty() {
            break;
        }
    }
    let mut events = client
        .subscribe_with(SubscribeParams {
            filter: Some(filter),
            replay_from: Some(after.map_or(json!(0), Value::String)),
            ..SubscribeParams::default()
        })
        .await?;
    tokio::spawn(async move {
        while let Some(e) = events.next().await {
            fold(&dir, &e.event);
        }
    });
    Ok(())
}

fn conversation_summary(id: &str, c: &ConvRec) -> Value {
    json!({
        "conversation_id": id,
        "trace_id": id,
        "subject": c.subject,
        "started_at": iso8601(c.started_at),
        "last_message_at": (c.last_message_at > 0).then(|| iso8601(c.last_message_at)),
        "last_message": c.last_message,
        "status": if c.closed { "completed" } else { "active" },
    })
}

/// Remembers a message's conversation for its deliveries.
fn remember(st: &mut State, id: &str, conv: Option<String>, preview: String) {
    if st.messages.insert(id.to_owned(), (conv, preview)).is_none() {
        st.message_order.push_back(id.to_owned());
        while st.message_order.len() > REMEMBERED_MESSAGES {
            if let Some(old) = st.message_order.pop_front() {
                st.messages.remove(&old);
            }
        }
    }
}

/// Counts one message for `agent` (sent, or received from `peer`).
fn count(
    st: &mut State,
    agent: &str,
    peer: Option<&str>,
    conv: Option<&str>,
    ts: u64,
    preview: &str,
    sent: bool,
) {
    let a = st.agent(agent);
    a.total_messages += 1;
    if a.first_contact == 0 {
        a.first_contact = ts;
    }
    a.last_contact = a.last_contact.max(ts);
    if let Some(p) = peer {
        remember_recent(&mut a.peers, p, MAX_PEERS_PER_CONTACT);
    }
    if let Some(conv) = conv {
        if remember_recent(&mut a.conversations, conv, MAX_CONVERSATIONS_PER_CONTACT) {
            a.total_conversations += 1;
        }
    }
    st.settle_agent(agent);
    let Some(conv) = conv else {
        return;
    };
    let c = st.conversation(conv);
    if c.started_at == 0 {
        c.started_at = ts;
    }
    if sent {
        c.total_messages += 1;
        c.last_message_at = c.last_message_at.max(ts);
        c.last_message = preview.to_owned();
    }
    if let Some(p) = st.participant(conv, agent) {
        if p.joined_at == 0 {
            p.joined_at = ts;
        }
        p.last_message_at = p.last_message_at.max(ts);
        p.last_sent = sent;
        if sent {
            p.summary = preview.to_owned();
        }
    }
    st.settle_conversation(conv);
}

/// A short text of a payload: a string as is, MAMP/IM blocks' texts joined, else the JSON.
fn preview(payload: Option<&Value>) -> String {
    let text = match payload {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        Some(other) => other
            .get("text")
            .and_then(Value::as_str)
            .map_or_else(|| other.to_string(), str::to_owned),
    };
    text.chars().take(PREVIEW_CHARS).collect()
}
