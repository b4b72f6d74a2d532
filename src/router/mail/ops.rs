//! Handlers of the mail extension, and the turn a `map/send` with `meta.mail` records.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::protocol::capabilities::ParticipantType;
use crate::protocol::event::EventType;
use crate::protocol::ids::{now_ms, AgentId, MessageId, ParticipantId, Ulid};
use crate::protocol::json::RawJson;
use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::methods::mail::*;
use crate::router::caller::{Caller, Ctx};
use crate::router::core::{to_json, Router};
use crate::router::error::RouterError;
use crate::router::events::log::{EventDraft, FilterKeys};
use crate::router::mail::table::Conv;
use crate::router::page::take_page;
use crate::store::record::{Audience, MailKeys};

/// Longest subject, reason, content type and participant id accepted (bytes).
pub const MAX_TEXT: usize = 1024;
/// Default page of `mail/list`, `mail/turns/list`, `mail/thread/list` and `mail/join` history.
pub const DEFAULT_PAGE: u32 = 50;
/// Default page of `mail/replay`.
pub const DEFAULT_REPLAY: u32 = 100;
/// Largest page.
pub const MAX_PAGE: u32 = 1000;

fn mail_err(code: ErrorCode, msg: impl Into<String>) -> RouterError {
    RouterError::Mail(code, msg.into())
}

fn not_found(id: &str) -> RouterError {
    mail_err(
        ErrorCode::MAIL_CONVERSATION_NOT_FOUND,
        format!("Conversation not found: {id}"),
    )
}

fn check_text(what: &str, v: Option<&str>) -> Result<(), RouterError> {
    match v {
        Some(t) if t.len() > MAX_TEXT => Err(RouterError::InvalidParams(format!(
            "{what} must be at most {MAX_TEXT} bytes"
        ))),
        _ => Ok(()),
    }
}

fn check_metadata(v: Option<&RawJson>) -> Result<(), RouterError> {
    match v {
        Some(m) if !m.is_object() => Err(RouterError::InvalidParams(
            "metadata must be an object".into(),
        )),
        _ => Ok(()),
    }
}

/// `contentType` must be well known (`text`, `data`, `event`, `reference`) or `x-*`, and a
/// `text` turn's content a string.
fn check_content(content_type: &str, content: &RawJson) -> Result<(), RouterError> {
    let known = matches!(content_type, "text" | "data" | "event" | "reference")
        || (content_type.len() > 2 && content_type.starts_with("x-"));
    if !known || content_type.len() > MAX_TEXT {
        return Err(mail_err(
            ErrorCode::MAIL_INVALID_TURN_CONTENT,
            format!("unknown contentType {content_type:?}: text, data, event, reference or x-*"),
        ));
    }
    if content_type == "text" && !content.get().starts_with('"') {
        return Err(mail_err(
            ErrorCode::MAIL_INVALID_TURN_CONTENT,
            "a text turn's content must be a string",
        ));
    }
    Ok(())
}

/// The ids through which a session takes part in conversations: its address (agent id, else
/// participant id), its participant id, and every agent it owns.
struct Identities {
    address: String,
    all: Vec<String>,
    system: bool,
}

impl Identities {
    fn has(&self, id: &str) -> bool {
        self.all.iter().any(|i| i == id)
    }
}

impl Router {
    fn identities(&self, caller: &Caller) -> Identities {
        let address = caller.address().to_string();
        let mut all = vec![address.clone()];
        let pid = caller.participant.as_str().to_owned();
        if pid != address {
            all.push(pid);
        }
        for a in self.registry.owned_by(&caller.participant) {
            if !all.iter().any(|i| i == a.as_str()) {
                all.push(a.as_str().to_owned());
            }
        }
        Identities {
            address,
            all,
            system: caller.kind == ParticipantType::System,
        }
    }

    /// The conversation, if the caller may see it (takes part, took part, or is system).
    fn visible_conv(&self, who: &Identities, id: &str) -> Result<&Conv, RouterError> {
        self.mailboxes
            .get(id)
            .filter(|c| who.system || c.participants.iter().any(|p| who.has(&p.id)))
            .ok_or_else(|| not_found(id))
    }

    /// The caller's active participant in `conv` (its address first, then its other ids).
    fn member<'a>(&self, conv: &'a Conv, who: &Identities) -> Option<&'a Participant> {
        conv.active(&who.address)
            .or_else(|| who.all.iter().find_map(|id| conv.active(id)))
    }

    /// A new participant record for `id`.
    fn new_participant(
        &self,
        id: &str,
        role: Role,
        permissions: Option<&PermissionsInput>,
        system: bool,
    ) -> Participant {
        let agent = self.registry.get(&AgentId::from(id)).map(|r| &r.agent);
        let base = Permissions::for_role(role);
        Participant {
            id: id.to_owned(),
            kind: if agent.is_some() {
                "agent"
            } else if system {
                "system"
            } else {
                "user"
            }
            .into(),
            role,
            joined_at: now_ms(),
            left_at: None,
            permissions: match permissions {
                Some(over) => base.overlaid(over),
                None => base,
            },
            agent_info: agent.map(|a| AgentInfo {
                agent_id: a.id.clone(),
                name: a.name.clone(),
                role: a.role.clone(),
            }),
        }
    }

    /// Who sees a conversation's events: the sessions behind its active participants (an
    /// agent's owner, or the participant id itself), and system participants. `only` narrows
    /// it to some participant ids.
    fn conv_audience(&self, conv: &Conv, only: Option<&dyn Fn(&Participant) -> bool>) -> Audience {
        let mut who: Vec<ParticipantId> = Vec::new();
        for p in conv.participants.iter().filter(|p| p.left_at.is_none()) {
            if only.is_some_and(|f| !f(p)) {
                continue;
            }
            let owner = match self.registry.get(&AgentId::from(p.id.as_str())) {
                Some(rec) => rec.agent.owner_id.clone(),
                None => Some(ParticipantId::from(p.id.as_str())),
            };
            if let Some(o) = owner {
                if !who.contains(&o) {
                    who.push(o);
                }
            }
        }
        Audience::Participants { who }
    }

    /// Who sees a turn's event: the conversation's audience narrowed by its visibility (its
    /// author always).
    fn turn_audience(&self, conv: &Conv, turn: &Turn) -> Audience {
        match &turn.visibility {
            None | Some(TurnVisibility::All) => self.conv_audience(conv, None),
            Some(v) => {
                let admits = |p: &Participant| {
                    p.id == turn.participant
                        || match v {
                            TurnVisibility::Participants { ids } => ids.contains(&p.id),
                            TurnVisibility::Role { roles } => roles.contains(&p.role),
                            _ => false,
                        }
                };
                self.conv_audience(conv, Some(&admits))
            }
        }
    }

    /// Whether the caller may read `turn`: system; its author; else by the turn's visibility
    /// and the caller's history access.
    fn sees_turn(&self, conv: &Conv, who: &Identities, turn: &Turn) -> bool {
        if who.system || who.has(&turn.participant) {
            return true;
        }
        let Some(me) = who.all.iter().find_map(|id| conv.participant(id)) else {
            return false;
        };
        let visible = match &turn.visibility {
            None | Some(TurnVisibility::All) => true,
            Some(TurnVisibility::Participants { ids }) => ids.iter().any(|i| who.has(i)),
            Some(TurnVisibility::Role { roles }) => roles.contains(&me.role),
            Some(TurnVisibility::Private) => false,
        };
        visible
            && match me.permissions.history_access {
                HistoryAccess::Full => true,
                HistoryAccess::FromJoin => turn.timestamp >= me.joined_at,
                HistoryAccess::None => false,
            }
    }

    fn emit_mail(
        &mut self,
        caller: &Caller,
        kind: EventType,
        data: String,
        keys: MailKeys,
        audience: Audience,
    ) {
        self.emit(EventDraft {
            kind,
            source: Some(caller.address()),
            data,
            caused_by: Vec::new(),
            keys: FilterKeys {
                mail: Some(Arc::new(keys)),
                ..FilterKeys::default()
            },
            audience,
        });
    }

    /// Emits a conversation-level event whose data is the SDK's `fields` followed by the
    /// conversation and all its participants (what the store keeps the conversation by).
    fn emit_conv_event(
        &mut self,
        caller: &Caller,
        kind: EventType,
        conv_id: &str,
        fields: serde_json::Map<String, serde_json::Value>,
        participant: Option<&str>,
        audience: Option<Audience>,
    ) {
        let Some(conv) = self.mailboxes.get(conv_id) else {
            return;
        };
        let state = ConversationState {
            conversation: conv.conversation.clone(),
            participants: conv.participants.clone(),
        };
        let audience = audience.unwrap_or_else(|| self.conv_audience(conv, None));
        let mut data = fields;
        if let (Ok(serde_json::Value::Object(rest)), true) = (serde_json::to_value(&state), true) {
            data.extend(rest);
        }
        let keys = MailKeys {
            conversation_id: conv_id.to_owned(),
            participant_id: participant.map(str::to_owned),
            ..MailKeys::default()
        };
        self.emit_mail(caller, kind, to_json(&data), keys, audience);
    }

    /// Adds (or re-adds) a participant and emits `mail.participant.joined`.
    fn join(&mut self, caller: &Caller, conv_id: &str, p: Participant) -> Participant {
        let pid = p.id.clone();
        if let Some(c) = self.mailboxes.get_mut(conv_id) {
            c.conversation.updated_at = now_ms();
            c.put_participant(p.clone());
        }
        let mut fields = serde_json::Map::new();
        fields.insert("conversationId".into(), conv_id.into());
        fields.insert(
            "participant".into(),
            serde_json::to_value(&p).unwrap_or_default(),
        );
        self.emit_conv_event(
            caller,
            EventType::MailParticipantJoined,
            conv_id,
            fields,
            Some(&pid),
            None,
        );
        p
    }

    /// Records a turn and emits `mail.turn.added`.
    fn record_turn(&mut self, caller: &Caller, turn: Turn) -> Turn {
        let Some(conv) = self.mailboxes.get(&turn.conversation_id) else {
            return turn;
        };
        let audience = self.turn_audience(conv, &turn);
        let keys = MailKeys {
            conversation_id: turn.conversation_id.clone(),
            thread_id: turn.thread_id.clone(),
            participant_id: Some(turn.participant.clone()),
            content_type: Some(turn.content_type.clone()),
        };
        #[derive(serde::Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Data<'a> {
            conversation_id: &'a str,
            turn: &'a Turn,
        }
        let data = to_json(&Data {
            conversation_id: &turn.conversation_id,
            turn: &turn,
        });
        self.emit_mail(caller, EventType::MailTurnAdded, data, keys, audience);
        if let Some(c) = self.mailboxes.get_mut(&turn.conversation_id) {
            c.push_turn(turn.clone());
        }
        turn
    }

    /// Checks a new turn's place: the author takes part and may send, the conversation is
    /// open, its thread and the turn it answers exist.
    fn check_turn_place(
        &self,
        who: &Identities,
        conv_id: &str,
        thread: Option<&str>,
        in_reply_to: Option<&str>,
    ) -> Result<String, RouterError> {
        let conv = self.visible_conv(who, conv_id)?;
        let me = self.member(conv, who).ok_or_else(|| {
            mail_err(
                ErrorCode::MAIL_NOT_A_PARTICIPANT,
                format!("not a participant of conversation {conv_id}"),
            )
        })?;
        if conv.conversation.closed_at.is_some() {
            return Err(mail_err(
                ErrorCode::MAIL_CONVERSATION_CLOSED,
                format!("conversation {conv_id} is closed"),
            ));
        }
        if !me.permissions.can_send {
            return Err(mail_err(
                ErrorCode::MAIL_PERMISSION_DENIED,
                format!("{} may not send in conversation {conv_id}", me.id),
            ));
        }
        if let Some(t) = thread {
            if conv.thread(t).is_none() {
                return Err(mail_err(
                    ErrorCode::MAIL_THREAD_NOT_FOUND,
                    format!("Thread not found: {t}"),
                ));
            }
        }
        if let Some(t) = in_reply_to {
            if conv.turn(t).is_none() {
                return Err(mail_err(
                    ErrorCode::MAIL_TURN_NOT_FOUND,
                    format!("Turn not found: {t}"),
                ));
            }
        }
        Ok(me.id.clone())
    }

    /// `mail/create`.
    ///
    /// # Errors
    /// `InvalidParams` for oversized text or metadata that is not an object; `10010` for an
    /// unknown (or invisible) parent; `10004` for a parent turn it does not have; `10006` for
    /// a malformed initial turn.
    pub fn handle_mail_create(
        &mut self,
        ctx: &Ctx,
        p: CreateParams,
    ) -> Result<CreateResult, RouterError> {
        let caller = self.caller(ctx)?;
        let who = self.identities(&caller);
        check_text("subject", p.subject.as_deref())?;
        check_metadata(p.metadata.as_ref())?;
        if let Some(parent) = &p.parent_conversation_id {
            let conv = self.visible_conv(&who, parent).map_err(|_| {
                mail_err(
                    ErrorCode::MAIL_PARENT_CONVERSATION_NOT_FOUND,
                    format!("Parent conversation not found: {parent}"),
                )
            })?;
            if let Some(t) = &p.parent_turn_id {
                if conv.turn(t).is_none() {
                    return Err(mail_err(
                        ErrorCode::MAIL_TURN_NOT_FOUND,
                        format!("Turn not found: {t}"),
                    ));
                }
            }
        }
        if let Some(t) = &p.initial_turn {
            check_content(&t.content_type, &t.content)?;
        }
        let initial = p.initial_participants.unwrap_or_default();
        for i in &initial {
            if i.id.is_empty() || i.id.len() > MAX_TEXT {
                return Err(RouterError::InvalidParams(format!(
                    "participant ids must be 1 to {MAX_TEXT} bytes"
                )));
            }
        }
        let now = now_ms();
        let id = format!("conv-{}", Ulid::random());
        let creator = self.new_participant(&who.address, Role::Initiator, None, who.system);
        let conversation = Conversation {
            id: id.clone(),
            kind: p.kind.unwrap_or_default(),
            status: ConversationStatus::Active,
            subject: p.subject,
            participant_count: 0,
            parent_conversation_id: p.parent_conversation_id,
            parent_turn_id: p.parent_turn_id,
            created_at: now,
            updated_at: now,
            closed_at: None,
            created_by: who.address.clone(),
            metadata: p.metadata,
        };
        let mut participants = vec![creator.clone()];
        for i in &initial {
            if participants.iter().any(|q| q.id == i.id) {
                continue;
            }
            participants.push(self.new_participant(
                &i.id,
                i.role.unwrap_or_default(),
                i.permissions.as_ref(),
                false,
            ));
        }
        self.mailboxes.insert(Conv::new(conversation, participants));
        let mut fields = serde_json::Map::new();
        fields.insert("conversationId".into(), id.clone().into());
        let conv = self.mailboxes.get(&id).map(|c| &c.conversation);
        fields.insert(
            "type".into(),
            serde_json::to_value(conv.map(|c| c.kind)).unwrap_or_default(),
        );
        if let Some(s) = conv.and_then(|c| c.subject.clone()) {
            fields.insert("subject".into(), s.into());
        }
        fields.insert("createdBy".into(), who.address.clone().into());
        self.emit_conv_event(
            &caller,
            EventType::MailCreated,
            &id,
            fields,
            Some(&who.address),
            None,
        );
        let initial_turn = p.initial_turn.map(|t| {
            self.record_turn(
                &caller,
                Turn {
                    id: format!("turn-{}", Ulid::random()),
                    conversation_id: id.clone(),
                    participant: who.address.clone(),
                    timestamp: now_ms(),
                    content_type: t.content_type,
                    content: t.content,
                    thread_id: None,
                    in_reply_to: None,
                    source: TurnSource::Explicit {
                        method: "mail/create".into(),
                    },
                    visibility: t.visibility,
                    status: None,
                    metadata: None,
                },
            )
        });
        let conversation = self
            .mailboxes
            .get(&id)
            .map(|c| c.conversation.clone())
            .ok_or_else(|| not_found(&id))?;
        Ok(CreateResult {
            conversation,
            participant: creator,
            initial_turn,
        })
    }

    /// `mail/get`.
    ///
    /// # Errors
    /// `10000` for an unknown conversation or one the caller does not take part in.
    pub fn handle_mail_get(&mut self, ctx: &Ctx, p: GetParams) -> Result<GetResult, RouterError> {
        let caller = self.caller(ctx)?;
        let who = self.identities(&caller);
        let conv = self.visible_conv(&who, &p.conversation_id)?;
        let include = p.include.unwrap_or_default();
        let visible: Vec<&Arc<Turn>> = conv
            .turns
            .iter()
            .filter(|t| self.sees_turn(conv, &who, t))
            .collect();
        let recent_turns = include.recent_turns.map(|n| {
            let n = (n.min(MAX_PAGE)) as usize;
            visible[visible.len().saturating_sub(n)..]
                .iter()
                .map(|t| (***t).clone())
                .collect()
        });
        let stats = include.stats.then(|| {
            let mut by_type = BTreeMap::new();
            for t in &visible {
                *by_type.entry(t.content_type.clone()).or_insert(0u64) += 1;
            }
            Stats {
                total_turns: visible.len() as u64,
                turns_by_content_type: by_type,
                active_participants: conv.conversation.participant_count,
                thread_count: conv.threads.len() as u32,
            }
        });
        Ok(GetResult {
            conversation: conv.conversation.clone(),
            participants: include.participants.then(|| conv.participants.clone()),
            threads: include.threads.then(|| conv.threads.clone()),
            recent_turns,
            stats,
        })
    }

    /// `mail/list`: the conversations the caller takes part in (all, for system), in creation
    /// order.
    ///
    /// # Errors
    /// `InvalidParams` for a cursor that names no conversation the caller may see.
    pub fn handle_mail_list(
        &mut self,
        ctx: &Ctx,
        p: ListParams,
    ) -> Result<ListResult, RouterError> {
        let caller = self.caller(ctx)?;
        let who = self.identities(&caller);
        let limit = p.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE) as usize;
        let f = p.filter.unwrap_or_default();
        let after = match &p.cursor {
            Some(c) => {
                let conv = self
                    .visible_conv(&who, c)
                    .map_err(|_| RouterError::InvalidParams(format!("unknown cursor {c:?}")))?;
                Some((conv.conversation.created_at, conv.conversation.id.clone()))
            }
            None => None,
        };
        let matching = self.mailboxes.in_order(after.as_ref()).filter(|conv| {
            let c = &conv.conversation;
            (who.system || conv.participants.iter().any(|p| who.has(&p.id)))
                && f.kind
                    .as_ref()
                    .is_none_or(|k| k.is_empty() || k.contains(&c.kind))
                && f.status
                    .as_ref()
                    .is_none_or(|s| s.is_empty() || s.contains(&c.status))
                && f.participant_id
                    .as_ref()
                    .is_none_or(|id| conv.participant(id).is_some())
                && f.created_after.is_none_or(|t| c.created_at > t)
                && f.created_before.is_none_or(|t| c.created_at < t)
                && f.parent_conversation_id
                    .as_ref()
                    .is_none_or(|id| c.parent_conversation_id.as_ref() == Some(id))
        });
        let page = take_page(matching.map(|c| c.conversation.clone()), limit, |c| {
            c.id.clone()
        });
        Ok(ListResult {
            conversations: page.items,
            has_more: page.has_more,
            next_cursor: page.next_cursor,
        })
    }

    /// `mail/close`: by its creator, an initiator or moderator, or a system participant.
    ///
    /// # Errors
    /// `10000`; `10001` when already closed; `10003` for anyone else.
    pub fn handle_mail_close(
        &mut self,
        ctx: &Ctx,
        p: CloseParams,
    ) -> Result<ConversationResult, RouterError> {
        let caller = self.caller(ctx)?;
        let who = self.identities(&caller);
        check_text("reason", p.reason.as_deref())?;
        let conv = self.visible_conv(&who, &p.conversation_id)?;
        if conv.conversation.closed_at.is_some() {
            return Err(mail_err(
                ErrorCode::MAIL_CONVERSATION_CLOSED,
                format!("conversation {} is already closed", p.conversation_id),
            ));
        }
        let me = self.member(conv, &who);
        let may = who.system
            || who.has(&conv.conversation.created_by)
            || me.is_some_and(|m| matches!(m.role, Role::Initiator | Role::Moderator));
        if !may {
            return Err(mail_err(
                ErrorCode::MAIL_PERMISSION_DENIED,
                "only the conversation's initiator or a moderator may close it",
            ));
        }
        let closed_by = me.map_or_else(|| who.address.clone(), |m| m.id.clone());
        let now = now_ms();
        if let Some(c) = self.mailboxes.get_mut(&p.conversation_id) {
            c.conversation.status = ConversationStatus::Completed;
            c.conversation.closed_at = Some(now);
            c.conversation.updated_at = now;
        }
        let mut fields = serde_json::Map::new();
        fields.insert("conversationId".into(), p.conversation_id.clone().into());
        fields.insert("closedBy".into(), closed_by.clone().into());
        if let Some(r) = &p.reason {
            fields.insert("reason".into(), r.clone().into());
        }
        self.emit_conv_event(
            &caller,
            EventType::MailClosed,
            &p.conversation_id,
            fields,
            Some(&closed_by),
            None,
        );
        let conversation = self
            .visible_conv(&who, &p.conversation_id)?
            .conversation
            .clone();
        Ok(ConversationResult { conversation })
    }

    /// `mail/join`: (re)joins a conversation the caller took part in (system participants:
    /// any), optionally with the history since a point.
    ///
    /// # Errors
    /// `10000`; `10001` when closed; `10007` when already in it.
    pub fn handle_mail_join(
        &mut self,
        ctx: &Ctx,
        p: JoinParams,
    ) -> Result<JoinResult, RouterError> {
        let caller = self.caller(ctx)?;
        let who = self.identities(&caller);
        let conv = self.visible_conv(&who, &p.conversation_id)?;
        if conv.conversation.closed_at.is_some() {
            return Err(mail_err(
                ErrorCode::MAIL_CONVERSATION_CLOSED,
                format!("conversation {} is closed", p.conversation_id),
            ));
        }
        if let Some(m) = self.member(conv, &who) {
            return Err(mail_err(
                ErrorCode::MAIL_PARTICIPANT_ALREADY_JOINED,
                format!("{} is already in conversation {}", m.id, p.conversation_id),
            ));
        }
        // Rejoin as the id that took part before (else as the caller's address).
        let previous = who.all.iter().find_map(|id| conv.participant(id)).cloned();
        let participant = match previous {
            Some(mut prev) => {
                prev.left_at = None;
                prev.joined_at = now_ms();
                if let Some(r) = p.role {
                    prev.role = r;
                }
                prev
            }
            None => {
                self.new_participant(&who.address, p.role.unwrap_or_default(), None, who.system)
            }
        };
        let participant = self.join(&caller, &p.conversation_id, participant);
        let conv = self.visible_conv(&who, &p.conversation_id)?;
        let (history, history_cursor, summary) = match &p.catch_up {
            None => (None, None, None),
            Some(cu) => {
                let limit = cu.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE) as usize;
                let start = match &cu.from {
                    serde_json::Value::String(turn) => conv.turn(turn).map_or(0, |(i, _)| i + 1),
                    serde_json::Value::Number(n) => {
                        let ts = n.as_u64().unwrap_or(0);
                        conv.turns.partition_point(|t| t.timestamp < ts)
                    }
                    _ => 0,
                };
                let visible = conv.turns[start.min(conv.turns.len())..]
                    .iter()
                    .filter(|t| self.sees_turn(conv, &who, t));
                let page = take_page(visible.map(|t| (**t).clone()), limit, |t| t.id.clone());
                let (turns, cursor) = (page.items, page.next_cursor);
                let summary = cu.include_summary.then(|| summarize(conv, &turns));
                (Some(turns), cursor, summary)
            }
        };
        Ok(JoinResult {
            conversation: conv.conversation.clone(),
            participant,
            history,
            history_cursor,
            summary,
        })
    }

    /// `mail/leave`.
    ///
    /// # Errors
    /// `10000`; `10002` when the caller is not in it.
    pub fn handle_mail_leave(
        &mut self,
        ctx: &Ctx,
        p: CloseParams,
    ) -> Result<LeaveResult, RouterError> {
        let caller = self.caller(ctx)?;
        let who = self.identities(&caller);
        check_text("reason", p.reason.as_deref())?;
        let conv = self.visible_conv(&who, &p.conversation_id)?;
        let mut me = self.member(conv, &who).cloned().ok_or_else(|| {
            mail_err(
                ErrorCode::MAIL_NOT_A_PARTICIPANT,
                format!("not a participant of conversation {}", p.conversation_id),
            )
        })?;
        // Its audience before it leaves: the one leaving sees its own departure.
        let audience = self.conv_audience(conv, None);
        let now = now_ms();
        me.left_at = Some(now);
        let left = me.id.clone();
        if let Some(c) = self.mailboxes.get_mut(&p.conversation_id) {
            c.put_participant(me);
            c.conversation.updated_at = now;
        }
        let mut fields = serde_json::Map::new();
        fields.insert("conversationId".into(), p.conversation_id.clone().into());
        fields.insert("participantId".into(), left.clone().into());
        if let Some(r) = &p.reason {
            fields.insert("reason".into(), r.clone().into());
        }
        self.emit_conv_event(
            &caller,
            EventType::MailParticipantLeft,
            &p.conversation_id,
            fields,
            Some(&left),
            Some(audience),
        );
        Ok(LeaveResult {
            success: true,
            left_at: now,
        })
    }

    /// `mail/invite`: adds the participant at once (no pending invitations).
    ///
    /// # Errors
    /// `10000`; `10001` when closed; `10002` when the caller is not in it; `10003` without
    /// `canInvite`; `10007` when the invitee is already in it.
    pub fn handle_mail_invite(
        &mut self,
        ctx: &Ctx,
        p: InviteParams,
    ) -> Result<InviteResult, RouterError> {
        let caller = self.caller(ctx)?;
        let who = self.identities(&caller);
        if p.participant.id.is_empty() || p.participant.id.len() > MAX_TEXT {
            return Err(RouterError::InvalidParams(format!(
                "participant.id must be 1 to {MAX_TEXT} bytes"
            )));
        }
        check_text("message", p.message.as_deref())?;
        let conv = self.visible_conv(&who, &p.conversation_id)?;
        if conv.conversation.closed_at.is_some() {
            return Err(mail_err(
                ErrorCode::MAIL_CONVERSATION_CLOSED,
                format!("conversation {} is closed", p.conversation_id),
            ));
        }
        if !who.system {
            let me = self.member(conv, &who).ok_or_else(|| {
                mail_err(
                    ErrorCode::MAIL_NOT_A_PARTICIPANT,
                    format!("not a participant of conversation {}", p.conversation_id),
                )
            })?;
            if !me.permissions.can_invite {
                return Err(mail_err(
                    ErrorCode::MAIL_PERMISSION_DENIED,
                    format!(
                        "{} may not invite to conversation {}",
                        me.id, p.conversation_id
                    ),
                ));
            }
        }
        if conv.active(&p.participant.id).is_some() {
            return Err(mail_err(
                ErrorCode::MAIL_PARTICIPANT_ALREADY_JOINED,
                format!(
                    "{} is already in conversation {}",
                    p.participant.id, p.conversation_id
                ),
            ));
        }
        let participant = self.new_participant(
            &p.participant.id,
            p.participant.role.unwrap_or_default(),
            p.participant.permissions.as_ref(),
            false,
        );
        let participant = self.join(&caller, &p.conversation_id, participant);
        Ok(InviteResult {
            invited: true,
            participant: Some(participant),
            pending: Some(false),
        })
    }

    /// `mail/turn`.
    ///
    /// # Errors
    /// `10000`, `10001`, `10002`, `10003` (no `canSend`), `10004` (`inReplyTo`), `10005`
    /// (`threadId`), `10006` (content type or content).
    pub fn handle_mail_turn(
        &mut self,
        ctx: &Ctx,
        p: TurnParams,
    ) -> Result<TurnResult, RouterError> {
        let caller = self.caller(ctx)?;
        let who = self.identities(&caller);
        check_metadata(p.metadata.as_ref())?;
        let author = self.check_turn_place(
            &who,
            &p.conversation_id,
            p.thread_id.as_deref(),
            p.in_reply_to.as_deref(),
        )?;
        check_content(&p.content_type, &p.content)?;
        let turn = self.record_turn(
            &caller,
            Turn {
                id: format!("turn-{}", Ulid::random()),
                conversation_id: p.conversation_id,
                participant: author,
                timestamp: now_ms(),
                content_type: p.content_type,
                content: p.content,
                thread_id: p.thread_id,
                in_reply_to: p.in_reply_to,
                source: TurnSource::Explicit {
                    method: "mail/turn".into(),
                },
                visibility: p.visibility,
                status: None,
                metadata: p.metadata,
            },
        );
        Ok(TurnResult { turn })
    }

    /// `mail/turns/list`: the turns the caller may read, oldest first (or newest first).
    ///
    /// # Errors
    /// `10000`; `10004` for an unknown `afterTurnId`, `beforeTurnId` or cursor.
    pub fn handle_mail_turns_list(
        &mut self,
        ctx: &Ctx,
        p: TurnsListParams,
    ) -> Result<TurnsPage, RouterError> {
        let caller = self.caller(ctx)?;
        let who = self.identities(&caller);
        let conv = self.visible_conv(&who, &p.conversation_id)?;
        let f = p.filter.unwrap_or_default();
        let limit = p.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE) as usize;
        let index_of = |id: &str| {
            conv.turn(id).map(|(i, _)| i).ok_or_else(|| {
                mail_err(
                    ErrorCode::MAIL_TURN_NOT_FOUND,
                    format!("Turn not found: {id}"),
                )
            })
        };
        let mut lo = 0usize;
        let mut hi = conv.turns.len();
        if let Some(a) = &f.after_turn_id {
            lo = lo.max(index_of(a)? + 1);
        }
        if let Some(b) = &f.before_turn_id {
            hi = hi.min(index_of(b)?);
        }
        let desc = p.order == Some(Order::Desc);
        if let Some(c) = &p.cursor {
            let i = index_of(c)?;
            if desc {
                hi = hi.min(i);
            } else {
                lo = lo.max(i + 1);
            }
        }
        let window = if lo < hi {
            &conv.turns[lo..hi]
        } else {
            &[][..]
        };
        let matches = |t: &&Arc<Turn>| {
            f.thread_id
                .as_ref()
                .is_none_or(|th| t.thread_id.as_ref() == Some(th))
                && f.content_types
                    .as_ref()
                    .is_none_or(|c| c.is_empty() || c.contains(&t.content_type))
                && f.participant_id
                    .as_ref()
                    .is_none_or(|pid| t.participant == *pid)
                && f.after_timestamp.is_none_or(|ts| t.timestamp > ts)
                && f.before_timestamp.is_none_or(|ts| t.timestamp < ts)
                && self.sees_turn(conv, &who, t)
        };
        let iter: Box<dyn Iterator<Item = &Arc<Turn>>> = if desc {
            Box::new(window.iter().rev())
        } else {
            Box::new(window.iter())
        };
        let page = take_page(iter.filter(matches).map(|t| (**t).clone()), limit, |t| {
            t.id.clone()
        });
        Ok(TurnsPage {
            turns: page.items,
            has_more: page.has_more,
            next_cursor: page.next_cursor,
        })
    }

    /// `mail/thread/create`.
    ///
    /// # Errors
    /// `10000`, `10001`, `10002`, `10003` (no `canCreateThreads`), `10004` (root turn),
    /// `10005` (parent thread).
    pub fn handle_mail_thread_create(
        &mut self,
        ctx: &Ctx,
        p: ThreadCreateParams,
    ) -> Result<ThreadResult, RouterError> {
        let caller = self.caller(ctx)?;
        let who = self.identities(&caller);
        check_text("subject", p.subject.as_deref())?;
        let author = self.check_turn_place(
            &who,
            &p.conversation_id,
            p.parent_thread_id.as_deref(),
            Some(&p.root_turn_id),
        )?;
        let conv = self.visible_conv(&who, &p.conversation_id)?;
        if conv
            .active(&author)
            .is_some_and(|m| !m.permissions.can_create_threads)
        {
            return Err(mail_err(
                ErrorCode::MAIL_PERMISSION_DENIED,
                format!("{author} may not create threads here"),
            ));
        }
        let now = now_ms();
        let thread = Thread {
            id: format!("thread-{}", Ulid::random()),
            conversation_id: p.conversation_id.clone(),
            parent_thread_id: p.parent_thread_id,
            subject: p.subject,
            root_turn_id: p.root_turn_id,
            turn_count: 0,
            participant_count: 1,
            created_at: now,
            updated_at: now,
            created_by: author.clone(),
        };
        let audience = self.conv_audience(conv, None);
        #[derive(serde::Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Data<'a> {
            conversation_id: &'a str,
            thread: &'a Thread,
        }
        let data = to_json(&Data {
            conversation_id: &thread.conversation_id,
            thread: &thread,
        });
        let keys = MailKeys {
            conversation_id: thread.conversation_id.clone(),
            thread_id: Some(thread.id.clone()),
            participant_id: Some(author),
            content_type: None,
        };
        self.emit_mail(&caller, EventType::MailThreadCreated, data, keys, audience);
        if let Some(c) = self.mailboxes.get_mut(&p.conversation_id) {
            c.push_thread(thread.clone());
        }
        let thread = self
            .mailboxes
            .get(&p.conversation_id)
            .and_then(|c| c.thread(&thread.id))
            .cloned()
            .unwrap_or(thread);
        Ok(ThreadResult { thread })
    }

    /// `mail/thread/list`, in creation order.
    ///
    /// # Errors
    /// `10000`; `10005` for an unknown cursor.
    pub fn handle_mail_thread_list(
        &mut self,
        ctx: &Ctx,
        p: ThreadListParams,
    ) -> Result<ThreadListResult, RouterError> {
        let caller = self.caller(ctx)?;
        let who = self.identities(&caller);
        let conv = self.visible_conv(&who, &p.conversation_id)?;
        let limit = p.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE) as usize;
        let start = match &p.cursor {
            Some(c) => {
                conv.threads
                    .iter()
                    .position(|t| t.id == *c)
                    .ok_or_else(|| {
                        mail_err(
                            ErrorCode::MAIL_THREAD_NOT_FOUND,
                            format!("Thread not found: {c}"),
                        )
                    })?
                    + 1
            }
            None => 0,
        };
        let matching = conv.threads[start..].iter().filter(|t| {
            p.parent_thread_id
                .as_ref()
                .is_none_or(|pt| t.parent_thread_id.as_ref() == Some(pt))
        });
        let page = take_page(matching.cloned(), limit, |t| t.id.clone());
        Ok(ThreadListResult {
            threads: page.items,
            has_more: page.has_more,
            next_cursor: page.next_cursor,
        })
    }

    /// `mail/summary`: an extractive summary (no language model): subject, counts, who spoke,
    /// and the last text turns.
    ///
    /// # Errors
    /// `10000`; `10004` / `10005` for an unknown turn or thread in `scope`.
    pub fn handle_mail_summary(
        &mut self,
        ctx: &Ctx,
        p: SummaryParams,
    ) -> Result<SummaryResult, RouterError> {
        let caller = self.caller(ctx)?;
        let who = self.identities(&caller);
        let conv = self.visible_conv(&who, &p.conversation_id)?;
        let scope = p.scope.unwrap_or_default();
        let find = |id: &str| {
            conv.turn(id).map(|(i, _)| i).ok_or_else(|| {
                mail_err(
                    ErrorCode::MAIL_TURN_NOT_FOUND,
                    format!("Turn not found: {id}"),
                )
            })
        };
        let lo = match &scope.from_turn_id {
            Some(t) => find(t)?,
            None => 0,
        };
        let hi = match &scope.to_turn_id {
            Some(t) => find(t)? + 1,
            None => conv.turns.len(),
        };
        if let Some(th) = &scope.thread_id {
            if conv.thread(th).is_none() {
                return Err(mail_err(
                    ErrorCode::MAIL_THREAD_NOT_FOUND,
                    format!("Thread not found: {th}"),
                ));
            }
        }
        let turns: Vec<Turn> = conv.turns[lo.min(hi)..hi]
            .iter()
            .filter(|t| {
                scope
                    .thread_id
                    .as_ref()
                    .is_none_or(|th| t.thread_id.as_ref() == Some(th))
                    && self.sees_turn(conv, &who, t)
            })
            .map(|t| (**t).clone())
            .collect();
        Ok(SummaryResult {
            summary: summarize(conv, &turns),
            generated: true,
        })
    }

    /// `mail/replay`: the turns from a point (after `fromTurnId`, or from `fromTimestamp`),
    /// with how many there are in all.
    ///
    /// # Errors
    /// `10000`; `10004` for an unknown `fromTurnId`.
    pub fn handle_mail_replay(
        &mut self,
        ctx: &Ctx,
        p: ReplayParams,
    ) -> Result<ReplayResult, RouterError> {
        let caller = self.caller(ctx)?;
        let who = self.identities(&caller);
        let conv = self.visible_conv(&who, &p.conversation_id)?;
        let limit = p.limit.unwrap_or(DEFAULT_REPLAY).clamp(1, MAX_PAGE) as usize;
        let start = match (&p.from_turn_id, p.from_timestamp) {
            (Some(t), _) => conv.turn(t).map(|(i, _)| i + 1).ok_or_else(|| {
                mail_err(
                    ErrorCode::MAIL_TURN_NOT_FOUND,
                    format!("Turn not found: {t}"),
                )
            })?,
            (None, Some(ts)) => conv.turns.partition_point(|t| t.timestamp < ts),
            (None, None) => 0,
        };
        let matching: Vec<&Arc<Turn>> = conv.turns[start..]
            .iter()
            .filter(|t| {
                p.thread_id
                    .as_ref()
                    .is_none_or(|th| t.thread_id.as_ref() == Some(th))
                    && p.content_types
                        .as_ref()
                        .is_none_or(|c| c.is_empty() || c.contains(&t.content_type))
                    && self.sees_turn(conv, &who, t)
            })
            .collect();
        let has_more = matching.len() > limit;
        let turns: Vec<Turn> = matching
            .iter()
            .take(limit)
            .map(|t| (***t).clone())
            .collect();
        Ok(ReplayResult {
            next_cursor: if has_more {
                turns.last().map(|t| t.id.clone())
            } else {
                None
            },
            has_more,
            missed_count: matching.len() as u64,
            turns,
        })
    }

    /// Checks a `map/send`'s `meta.mail` before the message is routed; returns the author id.
    ///
    /// # Errors
    /// As `mail/turn`.
    pub(crate) fn check_mail_send(
        &self,
        caller: &Caller,
        m: &MailMeta,
    ) -> Result<String, RouterError> {
        let who = self.identities(caller);
        self.check_turn_place(
            &who,
            &m.conversation_id,
            m.thread_id.as_deref(),
            m.in_reply_to.as_deref(),
        )
    }

    /// Records the turn of a routed `map/send` with `meta.mail`, and has the agents it reached
    /// join the conversation.
    pub(crate) fn record_mail_send(
        &mut self,
        caller: &Caller,
        m: MailMeta,
        author: String,
        message_id: MessageId,
        payload: Option<RawJson>,
        reached: &[String],
    ) {
        let content = payload.unwrap_or_else(RawJson::null);
        let content_type = if content.get().starts_with('"') {
            "text"
        } else {
            "data"
        };
        for id in reached {
            let joined = self
                .mailboxes
                .get(&m.conversation_id)
                .is_some_and(|c| c.active(id).is_some());
            if !joined && self.registry.get(&AgentId::from(id.as_str())).is_some() {
                let p = self.new_participant(id, Role::Assistant, None, false);
                self.join(caller, &m.conversation_id, p);
            }
        }
        self.record_turn(
            caller,
            Turn {
                id: format!("turn-{}", Ulid::random()),
                conversation_id: m.conversation_id,
                participant: author,
                timestamp: now_ms(),
                content_type: content_type.into(),
                content,
                thread_id: m.thread_id,
                in_reply_to: m.in_reply_to,
                source: TurnSource::Intercepted { message_id },
                visibility: m.visibility,
                status: None,
                metadata: None,
            },
        );
    }
}

/// An extractive summary of `turns`.
fn summarize(conv: &Conv, turns: &[Turn]) -> String {
    use std::fmt::Write as _;
    let c = &conv.conversation;
    let mut s = String::new();
    if let Some(subject) = &c.subject {
        let _ = write!(s, "{subject}. ");
    }
    let mut authors: Vec<&str> = Vec::new();
    for t in turns {
        if !authors.contains(&t.participant.as_str()) {
            authors.push(&t.participant);
        }
    }
    let _ = write!(
        s,
        "{} turn{} by {} participant{}",
        turns.len(),
        if turns.len() == 1 { "" } else { "s" },
        authors.len(),
        if authors.len() == 1 { "" } else { "s" }
    );
    if !authors.is_empty() {
        let _ = write!(s, " ({})", authors.join(", "));
    }
    s.push('.');
    let texts: Vec<(&str, String)> = turns
        .iter()
        .rev()
        .filter(|t| t.content_type == "text")
        .filter_map(|t| {
            serde_json::from_str::<String>(t.content.get())
                .ok()
                .map(|text| (t.participant.as_str(), text))
        })
        .take(3)
        .collect();
    for (who, text) in texts.into_iter().rev() {
        let short: String = text.chars().take(200).collect();
        let more = if short.len() < text.len() { "…" } else { "" };
        let _ = write!(s, " {who}: {short}{more}");
    }
    s
}
