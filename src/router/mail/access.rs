//! Who a mail caller is and what it may read, the limits and the input checks: the pure
//! pieces the mail handlers ([`super::ops`]) and the reads ([`super::reads`]) share.

use crate::protocol::json::RawJson;
use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::methods::mail::*;
use crate::router::error::RouterError;
use crate::router::mail::table::Conv;

/// Longest subject, reason, content type and participant id accepted (bytes).
pub const MAX_TEXT: usize = 1024;
/// Default page of `mail/list`, `mail/turns/list`, `mail/thread/list` and `mail/join` history.
pub const DEFAULT_PAGE: u32 = 50;
/// Default page of `mail/replay`.
pub const DEFAULT_REPLAY: u32 = 100;
/// Largest page.
pub const MAX_PAGE: u32 = 1000;

pub(crate) fn mail_err(code: ErrorCode, msg: impl Into<String>) -> RouterError {
    RouterError::Mail(code, msg.into())
}

pub(crate) fn not_found(id: &str) -> RouterError {
    mail_err(
        ErrorCode::MAIL_CONVERSATION_NOT_FOUND,
        format!("Conversation not found: {id}"),
    )
}

pub(crate) fn check_text(what: &str, v: Option<&str>) -> Result<(), RouterError> {
    match v {
        Some(t) if t.len() > MAX_TEXT => Err(RouterError::InvalidParams(format!(
            "{what} must be at most {MAX_TEXT} bytes"
        ))),
        _ => Ok(()),
    }
}

pub(crate) fn check_metadata(v: Option<&RawJson>) -> Result<(), RouterError> {
    match v {
        Some(m) if !m.is_object() => Err(RouterError::InvalidParams(
            "metadata must be an object".into(),
        )),
        _ => Ok(()),
    }
}

/// `contentType` must be well known (`text`, `data`, `event`, `reference`) or `x-*`, and a
/// `text` turn's content a string.
pub(crate) fn check_content(content_type: &str, content: &RawJson) -> Result<(), RouterError> {
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

/// Most stored rows read per step of a listing or a scan of turns.
pub const SCAN_CHUNK: usize = 512;

/// The ids through which a session takes part in conversations: its address (agent id, else
/// participant id), its participant id, and every agent it owns.
#[derive(Debug, Clone)]
pub(crate) struct Identities {
    /// Its address: the agent id it speaks as, else its participant id.
    pub(crate) address: String,
    /// Every id it takes part through.
    pub(crate) all: Vec<String>,
    /// Whether it is a system participant.
    pub(crate) system: bool,
    /// Whether it reads every conversation and turn: a system participant, or any session of a
    /// system principal (`auth.system_principals`). It changes only what it takes part in.
    pub(crate) reads_all: bool,
}

impl Identities {
    /// Whether `id` is one of them.
    pub(crate) fn has(&self, id: &str) -> bool {
        self.all.iter().any(|i| i == id)
    }

    /// Whether they may see `conv`: they take (or took) part, or they are system.
    pub(crate) fn sees(&self, participants: &[Participant]) -> bool {
        self.system || participants.iter().any(|p| self.has(&p.id))
    }

    /// Whether they may read `conv`: they see it, or they read every conversation.
    pub(crate) fn reads(&self, participants: &[Participant]) -> bool {
        self.reads_all || self.sees(participants)
    }
}

/// Whether `who` may read `turn` in `conv`: system (or reading every conversation); its author;
/// else by the turn's visibility and the reader's history access. A pure function of the
/// conversation's participants.
pub(crate) fn sees_turn(conv: &Conv, who: &Identities, turn: &Turn) -> bool {
    if who.reads_all || who.has(&turn.participant) {
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

pub(crate) fn turn_not_found(id: &str) -> RouterError {
    mail_err(
        ErrorCode::MAIL_TURN_NOT_FOUND,
        format!("Turn not found: {id}"),
    )
}

pub(crate) fn thread_not_found(id: &str) -> RouterError {
    mail_err(
        ErrorCode::MAIL_THREAD_NOT_FOUND,
        format!("Thread not found: {id}"),
    )
}
