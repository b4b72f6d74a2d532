//! Handlers of the mail extension that change or check a conversation's record, and the turn
//! a `map/send` with `meta.mail` records. Each runs in one router step on the cached record
//! (participants, threads, turn count), loaded first when it is not in memory
//! (`router::kept`); the turns themselves are written to the log and read back only by
//! [`super::reads`].

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
use crate::router::kept::need::Need;
use crate::router::mail::access::{
    check_content, check_metadata, check_text, mail_err, not_found, thread_not_found,
    turn_not_found, Identities, DEFAULT_PAGE, MAX_PAGE, MAX_TEXT,
};
use crate::router::mail::table::{conversation_of_row, Conv, TurnPlace};
use crate::router::page::take_page;
use crate::router::quota_checks::Created;
use crate::store::kept::KeptRow;
use crate::store::record::{Audience, MailKeys};

impl Router {
    pub(super) fn identities(&self, caller: &Caller) -> Identities {
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
        let system = caller.kind == ParticipantType::System;
        // A session of a system principal (`auth.system_principals`) reads every conversation
        // whatever its participant type: it may connect as `system` anyway, and an operator's
        // dashboard connects as `client` (docs/mail.md, "System participants").
        let reads_all = system
            || self.config.auth.as_ref().is_some_and(|auth| {
                self.sessions
                    .get(&caller.session)
                    .and_then(|s| s.principal())
                    .is_some_and(|p| auth.may_be_system(&p.id))
            });
        Identities {
            address,
            all,
            system,
            reads_all,
        }
    }

    /// Loads, in one go, the conversation and the turns an operation names that are not in
    /// memory.
    ///
    /// # Errors
    /// `NeedsLoad` when some are missing.
    pub(super) fn need_mail(
        &mut self,
        conv: Option<&str>,
        turns: &[&str],
    ) -> Result<(), RouterError> {
        let mut needs = Vec::new();
        if let Some(c) = conv {
            if self.mailboxes.convs.get(c).is_none() {
                needs.push(Need::Conversation(c.to_owned()));
            }
        }
        for t in turns {
            if self.mailboxes.turns.get(t).is_none() {
                needs.push(Need::Turn((*t).to_owned()));
            }
        }
        if needs.is_empty() {
            Ok(())
        } else {
            Err(RouterError::NeedsLoad(needs))
        }
    }

    /// The conversation, if the caller may see it (takes part, took part, or is system).
    ///
    /// # Errors
    /// `10000`; `NeedsLoad` when it is not in memory.
    pub(super) fn visible_conv(
        &mut self,
        who: &Identities,
        id: &str,
    ) -> Result<Arc<Conv>, RouterError> {
        self.conv_if(id, |c| who.sees(&c.participants))
    }

    /// The conversation, if the caller may read it: as [`Router::visible_conv`], and every
    /// conversation for a session of a system principal (the reads: `mail/get`, `mail/list`,
    /// `mail/turns/list`, `mail/summary`, `mail/replay`).
    ///
    /// # Errors
    /// `10000`; `NeedsLoad` when it is not in memory.
    pub(super) fn readable_conv(
        &mut self,
        who: &Identities,
        id: &str,
    ) -> Result<Arc<Conv>, RouterError> {
        self.conv_if(id, |c| who.reads(&c.participants))
    }

    /// The conversation `id` when `admits` it; `10000` otherwise (the same as a missing one).
    fn conv_if(
        &mut self,
        id: &str,
        admits: impl Fn(&Conv) -> bool,
    ) -> Result<Arc<Conv>, RouterError> {
        let conv = match self.mailboxes.convs.get(id) {
            None => {
                return Err(RouterError::NeedsLoad(vec![Need::Conversation(
                    id.to_owned(),
                )]))
            }
            Some(c) => c.cloned(),
        };
        conv.filter(|c| admits(c)).ok_or_else(|| not_found(id))
    }

    /// Where a turn of `conv` is (`None`: no such turn in that conversation).
    ///
    /// # Errors
    /// `NeedsLoad` when it is not in memory.
    pub(super) fn turn_place(
        &mut self,
        conv: &str,
        turn: &str,
    ) -> Result<Option<Arc<TurnPlace>>, RouterError> {
        match self.mailboxes.turns.get(turn) {
            None => Err(RouterError::NeedsLoad(vec![Need::Turn(turn.to_owned())])),
            Some(t) => Ok(t.filter(|t| t.conversation_id == conv).cloned()),
        }
    }

    /// The position of a turn of `conv`.
    ///
    /// # Errors
    /// `10004` when it has no such turn; `NeedsLoad`.
    pub(super) fn turn_seq(&mut self, conv: &str, turn: &str) -> Result<u64, RouterError> {
        self.turn_place(conv, turn)?
            .map(|t| t.seq)
            .ok_or_else(|| turn_not_found(turn))
    }

    /// Marks a conversation changed by the event just emitted.
    fn conv_written(&mut self, id: &str) {
        let seq = self.last_seq();
        self.mailboxes.convs.written(id, seq);
        self.trim_kept();
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
        let agent = self.registry.get(&AgentId::from(id)).map(|r| r.agent());
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
                Some(rec) => rec.agent().owner_id.clone(),
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

    fn emit_mail(
        &mut self,
        caller: &Caller,
        kind: EventType,
        data: String,
        keys: MailKeys,
        audience: Audience,
        owner: Option<&str>,
    ) {
        self.emit(EventDraft {
            kind,
            source: Some(caller.address()),
            data,
            caused_by: Vec::new(),
            keys: FilterKeys {
                mail: Some(Arc::new(keys)),
                owner: owner.map(Arc::from),
                ..FilterKeys::default()
            },
            audience,
        });
    }

    /// Emits a conversation-level event whose data is the SDK's `fields` followed by the
    /// conversation and all its participants (what the store keeps the conversation by), and
    /// marks the cached conversation written by it.
    #[allow(clippy::too_many_arguments)]
    fn emit_conv_event(
        &mut self,
        caller: &Caller,
        kind: EventType,
        conv_id: &str,
        fields: serde_json::Map<String, serde_json::Value>,
        participant: Option<&str>,
        audience: Option<Audience>,
        owner: Option<&str>,
    ) {
        let Some(Some(conv)) = self.mailboxes.convs.peek(conv_id).map(|c| c.cloned()) else {
            return;
        };
        let state = ConversationState {
            conversation: conv.conversation.clone(),
            participants: conv.participants.clone(),
        };
        let audience = audience.unwrap_or_else(|| self.conv_audience(&conv, None));
        let mut data = fields;
        if let Ok(serde_json::Value::Object(rest)) = serde_json::to_value(&state) {
            data.extend(rest);
        }
        let keys = MailKeys {
            conversation_id: conv_id.to_owned(),
            participant_id: participant.map(str::to_owned),
            ..MailKeys::default()
        };
        self.emit_mail(caller, kind, to_json(&data), keys, audience, owner);
        self.conv_written(conv_id);
    }

    /// Adds (or re-adds) a participant to a cached conversation and emits
    /// `mail.participant.joined`.
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
            None,
        );
        p
    }

    /// Records a turn of a cached conversation and emits `mail.turn.added`.
    fn record_turn(&mut self, caller: &Caller, turn: Turn) -> Turn {
        let Some(Some(conv)) = self
            .mailboxes
            .convs
            .peek(&turn.conversation_id)
            .map(|c| c.cloned())
        else {
            return turn;
        };
        let audience = self.turn_audience(&conv, &turn);
        // NB: no other handle on the record while it changes below (it would be copied).
        drop(conv);
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
        self.emit_mail(caller, EventType::MailTurnAdded, data, keys, audience, None);
        let seq = self.last_seq();
        if let Some(c) = self.mailboxes.get_mut(&turn.conversation_id) {
            c.count_turn(&turn);
        }
        self.mailboxes.convs.written(&turn.conversation_id, seq);
        self.mailboxes.put_turn(&turn, seq);
        self.trim_kept();
        turn
    }

    /// Checks a new turn's place: the author takes part and may send, the conversation is
    /// open and has room, its thread and the turn it answers exist.
    fn check_turn_place(
        &mut self,
        who: &Identities,
        conv_id: &str,
        thread: Option<&str>,
        in_reply_to: Option<&str>,
    ) -> Result<String, RouterError> {
        self.need_mail(Some(conv_id), in_reply_to.as_slice())?;
        let conv = self.visible_conv(who, conv_id)?;
        let me = self.member(&conv, who).ok_or_else(|| {
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
                return Err(thread_not_found(t));
            }
        }
        if let Some(t) = in_reply_to {
            if self.turn_place(conv_id, t)?.is_none() {
                return Err(turn_not_found(t));
            }
        }
        self.check_turn_quota(conv.turns)?;
        Ok(me.id.clone())
    }

    /// `mail/create`.
    ///
    /// # Errors
    /// `InvalidParams` for oversized text or metadata that is not an object; `10010` for an
    /// unknown (or invisible) parent; `10004` for a parent turn it does not have; `10006` for
    /// a malformed initial turn; `4002` past the caller's conversations quota.
    pub fn handle_mail_create(
        &mut self,
        ctx: &Ctx,
        p: CreateParams,
    ) -> Result<CreateResult, RouterError> {
        let caller = self.caller(ctx)?;
        let who = self.identities(&caller);
        let owner = self.quota_owner(ctx)?;
        check_text("subject", p.subject.as_deref())?;
        check_metadata(p.metadata.as_ref())?;
        let mut needs = self.created_needs(owner.as_deref(), Created::Conversations);
        if let Some(parent) = &p.parent_conversation_id {
            if let Err(RouterError::NeedsLoad(n)) =
                self.need_mail(Some(parent), p.parent_turn_id.as_deref().as_slice())
            {
                needs.extend(n);
            }
        }
        if !needs.is_empty() {
            return Err(RouterError::NeedsLoad(needs));
        }
        if let Some(parent) = &p.parent_conversation_id {
            self.visible_conv(&who, parent).map_err(|_| {
                mail_err(
                    ErrorCode::MAIL_PARENT_CONVERSATION_NOT_FOUND,
                    format!("Parent conversation not found: {parent}"),
                )
            })?;
            if let Some(t) = &p.parent_turn_id {
                if self.turn_place(parent, t)?.is_none() {
                    return Err(turn_not_found(t));
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
        self.check_created(owner.as_deref(), Created::Conversations)?;
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
        let conv = Conv::new(conversation, participants);
        let (kind, subject) = (conv.conversation.kind, conv.conversation.subject.clone());
        // Held until its `mail.created` (the next event) is committed.
        let next = self.bus.log.next_seq();
        self.mailboxes.convs.put(&id, Arc::new(conv), next);
        let mut fields = serde_json::Map::new();
        fields.insert("conversationId".into(), id.clone().into());
        fields.insert(
            "type".into(),
            serde_json::to_value(kind).unwrap_or_default(),
        );
        if let Some(s) = subject {
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
            owner.as_deref(),
        );
        self.mailboxes.total += 1;
        self.count_created(owner.as_deref(), Created::Conversations);
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
            .convs
            .peek(&id)
            .flatten()
            .map(|c| c.conversation.clone())
            .ok_or_else(|| not_found(&id))?;
        Ok(CreateResult {
            conversation,
            participant: creator,
            initial_turn,
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
        let me = self.member(&conv, &who);
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
        drop(conv);
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
            None,
        );
        let conversation = self
            .visible_conv(&who, &p.conversation_id)?
            .conversation
            .clone();
        Ok(ConversationResult { conversation })
    }

    /// The write of `mail/join`: (re)joins, and says where its catch-up starts.
    pub(super) fn join_step(&mut self, ctx: &Ctx, p: &JoinParams) -> Result<Joined, RouterError> {
        let caller = self.caller(ctx)?;
        let who = self.identities(&caller);
        let from_turn = p
            .catch_up
            .as_ref()
            .and_then(|cu| cu.from.as_str().map(str::to_owned));
        self.need_mail(Some(&p.conversation_id), from_turn.as_deref().as_slice())?;
        let conv = self.visible_conv(&who, &p.conversation_id)?;
        if conv.conversation.closed_at.is_some() {
            return Err(mail_err(
                ErrorCode::MAIL_CONVERSATION_CLOSED,
                format!("conversation {} is closed", p.conversation_id),
            ));
        }
        if let Some(m) = self.member(&conv, &who) {
            return Err(mail_err(
                ErrorCode::MAIL_PARTICIPANT_ALREADY_JOINED,
                format!("{} is already in conversation {}", m.id, p.conversation_id),
            ));
        }
        let from = match &from_turn {
            // An unknown turn starts from the beginning.
            Some(t) => CatchUpFrom::After(self.turn_place(&p.conversation_id, t)?.map(|t| t.seq)),
            None => match p.catch_up.as_ref().map(|cu| &cu.from) {
                Some(serde_json::Value::Number(n)) => CatchUpFrom::Time(n.as_u64().unwrap_or(0)),
                _ => CatchUpFrom::After(None),
            },
        };
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
        Ok(Joined {
            conv,
            who,
            participant,
            from,
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
        let mut me = self.member(&conv, &who).cloned().ok_or_else(|| {
            mail_err(
                ErrorCode::MAIL_NOT_A_PARTICIPANT,
                format!("not a participant of conversation {}", p.conversation_id),
            )
        })?;
        // Its audience before it leaves: the one leaving sees its own departure.
        let audience = self.conv_audience(&conv, None);
        drop(conv);
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
            None,
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
            let me = self.member(&conv, &who).ok_or_else(|| {
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
    /// (`threadId`), `10006` (content type or content), `4002` (turns per conversation).
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
        let audience = self.conv_audience(&conv, None);
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
        self.emit_mail(
            &caller,
            EventType::MailThreadCreated,
            data,
            keys,
            audience,
            None,
        );
        if let Some(c) = self.mailboxes.get_mut(&p.conversation_id) {
            c.push_thread(thread.clone());
        }
        self.conv_written(&p.conversation_id);
        let thread = self
            .mailboxes
            .convs
            .peek(&p.conversation_id)
            .flatten()
            .and_then(|c| c.thread(&thread.id).cloned())
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
        let threads = conv.threads();
        let limit = p.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE) as usize;
        let start = match &p.cursor {
            Some(c) => {
                threads
                    .iter()
                    .position(|t| t.id == *c)
                    .ok_or_else(|| thread_not_found(c))?
                    + 1
            }
            None => 0,
        };
        let matching = threads[start..].iter().filter(|t| {
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

    /// Checks a `map/send`'s `meta.mail` before the message is routed; returns the author id.
    ///
    /// # Errors
    /// As `mail/turn`; `NeedsLoad` when the conversation (or the turn it answers) is not in
    /// memory.
    pub(crate) fn check_mail_send(
        &mut self,
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

    /// Records the turn of a routed `map/send` with `meta.mail` (its conversation was checked,
    /// so it is in memory), and has the agents it reached join the conversation.
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
                .convs
                .peek(&m.conversation_id)
                .flatten()
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

    /// The conversations of a chunk of stored rows that the caller may see and that pass `f`,
    /// as the router has them now, and the position of the chunk's last row.
    pub(super) fn pick_conversations(
        &self,
        who: &Identities,
        rows: Vec<KeptRow>,
        f: &ListFilter,
    ) -> (Vec<Conversation>, Option<(u64, String)>) {
        let mut last = None;
        let mut picked = Vec::new();
        for row in rows {
            let stored = match conversation_of_row(&row) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "skipping a stored conversation this version cannot read");
                    continue;
                }
            };
            let id = stored.conversation.id.clone();
            last = Some((stored.conversation.created_at, id.clone()));
            let (c, participants) = match self.mailboxes.convs.peek(&id).flatten() {
                Some(cached) => (cached.conversation.clone(), cached.participants.clone()),
                None => (stored.conversation, stored.participants),
            };
            let admitted = who.reads(&participants)
                && f.kind
                    .as_ref()
                    .is_none_or(|k| k.is_empty() || k.contains(&c.kind))
                && f.status
                    .as_ref()
                    .is_none_or(|s| s.is_empty() || s.contains(&c.status))
                && f.participant_id
                    .as_ref()
                    .is_none_or(|id| participants.iter().any(|p| p.id == *id))
                && f.created_after.is_none_or(|t| c.created_at > t)
                && f.created_before.is_none_or(|t| c.created_at < t)
                && f.parent_conversation_id
                    .as_ref()
                    .is_none_or(|id| c.parent_conversation_id.as_ref() == Some(id));
            if admitted {
                picked.push(c);
            }
        }
        (picked, last)
    }
}

/// What the write of `mail/join` leaves for its catch-up.
pub(super) struct Joined {
    pub(super) conv: Arc<Conv>,
    pub(super) who: Identities,
    pub(super) participant: Participant,
    pub(super) from: CatchUpFrom,
}

/// Where a catch-up or replay starts.
pub(super) enum CatchUpFrom {
    /// After this turn's position (`None`: from the first turn).
    After(Option<u64>),
    /// At the first turn at or after this time (Unix ms).
    Time(u64),
}
