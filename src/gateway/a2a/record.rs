//! How an A2A task is kept as a MAP task, and how an agent's MAP messages become A2A changes.
//!
//! Owns: [`Record`] (what `task.meta.a2a` holds, including the [`Owner`] of the task),
//! [`MapTask`] (the parts of a MAP task the gateway reads), the agent conventions
//! ([`AgentReport`], read from a reply's payload), and the payload an agent receives for an A2A
//! message ([`agent_payload`]). Pure functions: the calls to the router are in `tasks/`, the
//! rule of who may act on a task in `access.rs`.
//!
//! ## The agent conventions (docs/a2a.md has the full table)
//!
//! An agent written with any MAP SDK serves A2A callers without knowing A2A: its ordinary
//! reply (`meta.isResult`, `meta.correlationId` = the task id) completes the task, with one
//! artifact holding the payload (a text part for a string, a data part otherwise). Before
//! that, it may report progress by sending `{"a2a": {...}}` payloads to the gateway agent
//! with the same `correlationId`:
//!
//! - `{"a2a": {"status": "working", "message"?: "..."}}`: still working (a status message).
//! - `{"a2a": {"artifact": {parts, artifactId?, name?, ...}, "append"?, "lastChunk"?}}`.
//! - `{"a2a": {"state": "input-required" | "auth-required" | "completed" | "failed" |
//!   "rejected", "message"?: "...", "error"?: "..."}}`.
//! - `{"a2a": {"reply": "text" | {parts, metadata?} | other JSON}}`: the final answer as a
//!   message (A2A's direct `Message` result when it answers the exchange's first message).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::gateway::a2a::wire::{Artifact, Message, Part, TaskState, TaskView, Update};
use crate::protocol::json::RawJson;
use crate::protocol::methods::session::Principal;

/// The principal an A2A task belongs to: the subject (`id`, `issuer`) of the caller whose
/// `SendMessage` created it. Never a credential: the id and issuer are what the router shows
/// as a session's `principal` too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// The principal's id (an API key's principal, a JWT's `sub`).
    pub id: String,
    /// Its issuer (a JWT's `iss`), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
}

impl Owner {
    /// The owner `p` stands for.
    pub fn of(p: &Principal) -> Self {
        Self {
            id: p.id.clone(),
            issuer: p.issuer.clone(),
        }
    }

    /// Whether `p` is this owner (same id and issuer).
    pub fn is(&self, p: &Principal) -> bool {
        self.id == p.id && self.issuer == p.issuer
    }
}

/// What `task.meta.a2a` holds: everything A2A knows about a task that MAP does not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The A2A context.
    pub context_id: String,
    /// The A2A state (MAP's `status` follows it, coarser: [`TaskState::map_status`]).
    pub state: TaskState,
    /// The message that came with the current state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_message: Option<Message>,
    /// When the state was set (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    /// Outputs so far.
    #[serde(default)]
    pub artifacts: Vec<Artifact>,
    /// The conversation: caller messages and agent status messages.
    #[serde(default)]
    pub history: Vec<Message>,
    /// Counts the gateway's updates of this task (0 at creation). A stream sends each update
    /// once by this number, although MAP may emit two events for one update (`task.status`
    /// and `task.completed`).
    #[serde(default)]
    pub seq: u64,
    /// What the latest update was (what a stream sends for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update: Option<Update>,
    /// The MAP agent that serves the task.
    pub agent: String,
    /// That agent's name when the task was made (or last followed up): after a restart, an
    /// agent that registers without a fixed id comes back under a new one, and its tasks are
    /// found by this name (docs/a2a.md, "After a restart").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_name: Option<String>,
    /// The request metadata of the message that created it, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RawJson>,
    /// Whose task it is (authentication on; `None` when it was off, or for a task made before
    /// owners were recorded). Not part of the A2A view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    /// The agent answered the first message with a message (`{"a2a": {"reply": ...}}`): the
    /// caller's send gets that message (its status message) rather than the task.
    #[serde(default, skip_serializing_if = "is_false")]
    pub message_only: bool,
    /// The gateway agent that sent the agent the latest message (`a2a-gateway`, or a cluster
    /// standby's `a2a-gateway@<node>`): the agent's reply goes to it. When it is a standby's
    /// and that node dies, the live node's gateway ends the task (`tasks/`,
    /// `Core::end_if_orphaned`). Not part of the A2A view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_false(b: &bool) -> bool {
    !*b
}

impl Record {
    /// The task as A2A shows it.
    pub fn view(&self, task_id: &str) -> TaskView {
        TaskView {
            id: task_id.to_owned(),
            context_id: self.context_id.clone(),
            state: self.state,
            status_message: self.status_message.clone(),
            timestamp: self.timestamp.clone(),
            artifacts: self.artifacts.clone(),
            history: self.history.clone(),
            metadata: self.metadata.clone(),
        }
    }

    /// Moves to `state` with an optional agent message; the next update.
    pub fn set_state(&mut self, state: TaskState, message: Option<Message>) {
        self.state = state;
        if let Some(m) = &message {
            self.history.push(m.clone());
        }
        self.status_message = message;
        self.timestamp = Some(rfc3339_now());
        self.seq += 1;
        self.update = Some(Update::status());
    }

    /// Adds an artifact, or appends its parts to the one with the same id; the next update.
    pub fn add_artifact(&mut self, artifact: Artifact, append: bool, last_chunk: bool) {
        match self
            .artifacts
            .iter_mut()
            .find(|a| append && a.artifact_id == artifact.artifact_id)
        {
            Some(existing) => existing.parts.extend(artifact.parts.iter().cloned()),
            None => {
                self.artifacts
                    .retain(|a| a.artifact_id != artifact.artifact_id);
                self.artifacts.push(artifact.clone());
            }
        }
        self.seq += 1;
        self.update = Some(Update {
            kind: crate::gateway::a2a::wire::UpdateKind::Artifact,
            artifact: Some(artifact),
            append,
            last_chunk,
        });
    }
}

/// A task as one `task.*` event left it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The task id.
    pub task_id: String,
    /// Its A2A record after the change.
    pub record: Record,
}

impl Snapshot {
    /// The update's number (`meta.a2a.seq`).
    pub fn seq(&self) -> u64 {
        self.record.seq
    }
}

/// The parts of a MAP task (`map/tasks/*` results, `task.*` event data) the gateway reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MapTask {
    /// The task id.
    pub id: String,
    /// The agent it is assigned to.
    #[serde(default)]
    pub assignee: Option<String>,
    /// `open`, `in_progress`, `blocked`, `completed`, `failed`.
    #[serde(default)]
    pub status: Option<String>,
    /// The task's metadata, verbatim.
    #[serde(default)]
    pub meta: Option<RawJson>,
}

impl MapTask {
    /// Reads `{task}` (a `map/tasks/*` result or a `task.*` event's data) from JSON text.
    pub fn from_wrapped(text: &str) -> Option<Self> {
        #[derive(Deserialize)]
        struct Wrapped {
            task: MapTask,
        }
        serde_json::from_str::<Wrapped>(text).ok().map(|w| w.task)
    }

    /// The A2A record, when the gateway made this task (else `None`: a MAP task of someone
    /// else's, which A2A callers do not see).
    pub fn record(&self) -> Option<Record> {
        let meta = self.meta.as_ref()?;
        let members = meta.members()?;
        let raw = members.get("a2a")?;
        serde_json::from_str(raw.get()).ok()
    }
}

/// What an agent's message to the gateway means for the task it names.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentReport {
    /// `{"a2a": {"status": "working", "message"?}}`.
    Working(Option<String>),
    /// `{"a2a": {"artifact": {...}, "append"?, "lastChunk"?}}`.
    Artifact {
        /// The artifact (an id is made up when it has none).
        artifact: Artifact,
        /// Extends the artifact with the same id.
        append: bool,
        /// Its last chunk.
        last_chunk: bool,
    },
    /// `{"a2a": {"state": ..., "message"?, "error"?}}`.
    State(TaskState, Option<String>),
    /// `{"a2a": {"reply": ...}}`: the final answer, as an agent message.
    Reply {
        /// Its parts.
        parts: Vec<Part>,
        /// Its metadata, verbatim.
        metadata: Option<RawJson>,
    },
    /// `{"a2a": {"cancel": ...}}` seen coming back (an agent echoing its control message):
    /// ignored.
    Ignored,
    /// Any other payload: the final answer. The task completes with one artifact holding it.
    Final(Option<RawJson>),
}

impl AgentReport {
    /// Reads an agent's payload.
    pub fn of(payload: Option<&RawJson>) -> Self {
        let Some(p) = payload else {
            return Self::Final(None);
        };
        let Some(a2a) = p.members().and_then(|m| {
            (m.len() == 1)
                .then(|| m.get("a2a").map(|r| r.get().to_owned()))
                .flatten()
        }) else {
            return Self::Final(Some(p.clone()));
        };
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Convention {
            #[serde(default)]
            status: Option<String>,
            #[serde(default)]
            state: Option<String>,
            #[serde(default)]
            message: Option<String>,
            #[serde(default)]
            error: Option<String>,
            #[serde(default)]
            artifact: Option<Box<RawValue>>,
            #[serde(default)]
            append: bool,
            #[serde(default)]
            last_chunk: bool,
            #[serde(default)]
            cancel: Option<serde::de::IgnoredAny>,
            #[serde(default)]
            reply: Option<Box<RawValue>>,
        }
        let Ok(c) = serde_json::from_str::<Convention>(&a2a) else {
            return Self::Final(Some(p.clone()));
        };
        if let Some(raw) = c.artifact {
            if let Some(artifact) = read_artifact(&raw) {
                return Self::Artifact {
                    artifact,
                    append: c.append,
                    last_chunk: c.last_chunk,
                };
            }
            return Self::Final(Some(p.clone()));
        }
        if let Some(raw) = c.reply {
            let text = raw.get().trim_start();
            if text.starts_with('"') {
                if let Ok(t) = serde_json::from_str::<String>(text) {
                    return Self::Reply {
                        parts: vec![Part::text(t)],
                        metadata: None,
                    };
                }
            } else if let Some(a) = text.starts_with('{').then(|| read_artifact(&raw)).flatten() {
                return Self::Reply {
                    parts: a.parts,
                    metadata: a.metadata,
                };
            } else if let Ok(data) = RawJson::from_text(raw.get().to_owned()) {
                return Self::Reply {
                    parts: vec![Part::data(data)],
                    metadata: None,
                };
            }
            return Self::Final(Some(p.clone()));
        }
        if let Some(state) = c.state.as_deref().and_then(TaskState::parse) {
            return Self::State(state, c.message.or(c.error));
        }
        if c.status.as_deref().and_then(TaskState::parse) == Some(TaskState::Working) {
            return Self::Working(c.message);
        }
        if c.cancel.is_some() {
            return Self::Ignored;
        }
        Self::Final(Some(p.clone()))
    }
}

/// An artifact in the convention: v1.0 or v0.3 parts; `artifactId` made up when missing.
fn read_artifact(raw: &RawValue) -> Option<Artifact> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct In {
        #[serde(default)]
        artifact_id: Option<String>,
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        description: Option<String>,
        #[serde(default)]
        parts: Vec<Box<RawValue>>,
        #[serde(default)]
        metadata: Option<RawJson>,
    }
    let a: In = serde_json::from_str(raw.get()).ok()?;
    let parts = a
        .parts
        .iter()
        .map(|p| crate::gateway::a2a::wire::parse_part(p))
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    if parts.is_empty() {
        return None;
    }
    Some(Artifact {
        artifact_id: a
            .artifact_id
            .filter(|id| !id.is_empty())
            .unwrap_or_else(|| crate::protocol::ids::Ulid::random().to_string()),
        name: a.name,
        description: a.description,
        parts,
        metadata: a.metadata,
        extensions: Vec::new(),
    })
}

/// The artifact a final reply becomes: a text part for a JSON string, a data part (verbatim)
/// for anything else, no part for no payload.
pub fn final_artifact(payload: Option<&RawJson>) -> Artifact {
    let part = payload.map(|p| match serde_json::from_str::<String>(p.get()) {
        Ok(text) => Part::text(text),
        Err(_) => Part::data(p.clone()),
    });
    Artifact {
        artifact_id: crate::protocol::ids::Ulid::random().to_string(),
        name: Some("result".into()),
        parts: part.into_iter().collect(),
        ..Artifact::default()
    }
}

/// What the MAP agent receives for an A2A message: the text for a message of one text part,
/// the data (verbatim) for one data part, else `{"parts": [...]}` (v1.0 parts).
pub fn agent_payload(message: &Message) -> RawJson {
    if let [part] = message.parts.as_slice() {
        if let (Some(text), None, None, None) = (&part.text, &part.raw, &part.url, &part.data) {
            return RawJson::serialize_from(text);
        }
        if let (Some(data), None, None, None) = (&part.data, &part.text, &part.raw, &part.url) {
            return data.clone();
        }
    }
    #[derive(Serialize)]
    struct Parts<'a> {
        parts: &'a [Part],
    }
    // Serialized straight to text: the parts' verbatim members keep their bytes.
    RawJson::serialize_from(&Parts {
        parts: &message.parts,
    })
}

/// Now as RFC 3339 in UTC with milliseconds (`2026-11-25T11:30:00.123Z`).
pub fn rfc3339_now() -> String {
    rfc3339(crate::protocol::ids::now_ms())
}

/// `ms` (Unix milliseconds) as RFC 3339 in UTC.
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> RawJson {
        RawJson::from_text(s).unwrap()
    }

    #[test]
    fn dates_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_606_200_123), "2026-11-25T11:30:00.123Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn reports_follow_the_convention() {
        assert_eq!(
            AgentReport::of(Some(&raw(r#"{"a2a":{"status":"working","message":"hm"}}"#))),
            AgentReport::Working(Some("hm".into()))
        );
        assert_eq!(
            AgentReport::of(Some(&raw(r#"{"a2a":{"state":"failed","error":"boom"}}"#))),
            AgentReport::State(TaskState::Failed, Some("boom".into()))
        );
        assert_eq!(
            AgentReport::of(Some(&raw(r#"{"a2a":{"state":"input-required"}}"#))),
            AgentReport::State(TaskState::InputRequired, None)
        );
        match AgentReport::of(Some(&raw(
            r#"{"a2a":{"artifact":{"artifactId":"x","parts":[{"text":"a"}]},"append":true}}"#,
        ))) {
            AgentReport::Artifact {
                artifact, append, ..
            } => {
                assert_eq!(artifact.artifact_id, "x");
                assert!(append);
            }
            other => panic!("{other:?}"),
        }
        // Anything else is a final answer, kept verbatim.
        let p = raw(r#"{"a2a":1,"other":2}"#);
        assert_eq!(AgentReport::of(Some(&p)), AgentReport::Final(Some(p)));
        let p = raw(r#""hello""#);
        assert_eq!(AgentReport::of(Some(&p)), AgentReport::Final(Some(p)));
    }

    #[test]
    fn payloads_for_agents() {
        let m = Message {
            parts: vec![Part::text("hi")],
            ..Message::default()
        };
        assert_eq!(agent_payload(&m).get(), r#""hi""#);
        let m = Message {
            parts: vec![Part::data(raw(r#"{"z":1,"a":2}"#))],
            ..Message::default()
        };
        assert_eq!(agent_payload(&m).get(), r#"{"z":1,"a":2}"#);
        let a = final_artifact(Some(&raw(r#""done""#)));
        assert_eq!(a.parts, vec![Part::text("done")]);
    }
}
