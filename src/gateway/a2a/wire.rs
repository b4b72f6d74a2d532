//! A2A wire types, v1.0 (the version `@a2a-js/sdk` 1.3.0 speaks by default) as the canonical
//! model, and their v0.3 spellings.
//!
//! Owns: [`Part`], [`Message`], [`Artifact`] in v1.0 proto-JSON shapes (what the gateway stores
//! in `task.meta.a2a` too), [`TaskState`] and [`Role`] with both versions' names, the request
//! params of every method, and the views that render a task or an update in either version
//! ([`Version`]). Pure data: no I/O, no MAP.
//!
//! A participant's JSON (`data` parts, `metadata`) is [`RawJson`]: kept as the exact text it
//! arrived as, on the way in and on the way out. Everything here is parsed from text
//! (`serde_json::from_str`), never from a `Value`, so that the raw members keep their bytes.
//!
//! v0.3 differences handled here (checked against the SDK's `compat/v0_3` translators): a
//! `kind` tag on every object (`task`, `message`, `status-update`, `artifact-update`, and on
//! parts `text` / `file` / `data`), lower-case roles (`user`, `agent`) and kebab-case states
//! (`input-required`), file parts as `{file: {bytes | uri, mimeType, name}}`, data parts that
//! must be objects (others are wrapped as `{value}` with `metadata.data_part_compat = true`, as
//! the SDK does), and `final` on status updates.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::protocol::json::RawJson;

/// Which A2A version a request came in (and its answer goes out) in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// A2A 1.0: PascalCase methods, proto-JSON shapes.
    V1,
    /// A2A 0.3: `message/send` etc., `kind`-tagged shapes.
    V03,
}

impl Version {
    /// The version an `A2A-Version` header value names: `1.0` or `0.3` (a patch, `1.0.0`,
    /// `0.3.0`, names the same); `None` for any other.
    pub fn from_header(value: &str) -> Option<Self> {
        let v = value.trim();
        let is = |base: &str| {
            v == base
                || v.strip_prefix(base).is_some_and(|rest| {
                    rest.strip_prefix('.')
                        .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                })
        };
        if is("1.0") {
            Some(Self::V1)
        } else if is("0.3") {
            Some(Self::V03)
        } else {
            None
        }
    }
}

/// The state of an A2A task. Stored in `task.meta.a2a.state` by its v0.3 (kebab-case) name,
/// which is also the A2A spec's prose name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskState {
    /// Accepted, not yet started.
    Submitted,
    /// The agent is on it.
    Working,
    /// The agent waits for the caller (interrupted: a stream ends here).
    InputRequired,
    /// The agent waits for credentials (interrupted).
    AuthRequired,
    /// Done (terminal).
    Completed,
    /// Ended in error (terminal).
    Failed,
    /// Canceled by the caller (terminal).
    Canceled,
    /// The agent refused it (terminal).
    Rejected,
}

impl TaskState {
    /// `TASK_STATE_…`.
    pub fn v1_name(self) -> &'static str {
        match self {
            Self::Submitted => "TASK_STATE_SUBMITTED",
            Self::Working => "TASK_STATE_WORKING",
            Self::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            Self::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
            Self::Completed => "TASK_STATE_COMPLETED",
            Self::Failed => "TASK_STATE_FAILED",
            Self::Canceled => "TASK_STATE_CANCELED",
            Self::Rejected => "TASK_STATE_REJECTED",
        }
    }

    /// `input-required` etc.
    pub fn v03_name(self) -> &'static str {
        match self {
            Self::Submitted => "submitted",
            Self::Working => "working",
            Self::InputRequired => "input-required",
            Self::AuthRequired => "auth-required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::Rejected => "rejected",
        }
    }

    /// Reads either version's name.
    pub fn parse(name: &str) -> Option<Self> {
        const ALL: [TaskState; 8] = [
            TaskState::Submitted,
            TaskState::Working,
            TaskState::InputRequired,
            TaskState::AuthRequired,
            TaskState::Completed,
            TaskState::Failed,
            TaskState::Canceled,
            TaskState::Rejected,
        ];
        ALL.into_iter()
            .find(|s| s.v1_name() == name || s.v03_name() == name)
    }

    /// Completed, failed, canceled, rejected: nothing changes after these.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Canceled | Self::Rejected
        )
    }

    /// Submitted or working: in flight, waiting for the agent's answer to a message sent to it.
    pub fn awaits_agent(self) -> bool {
        matches!(self, Self::Submitted | Self::Working)
    }

    /// Terminal or waiting for the caller: where a stream (and a blocking send) ends.
    pub fn ends_stream(self) -> bool {
        self.is_terminal() || matches!(self, Self::InputRequired | Self::AuthRequired)
    }

    /// The MAP task status this state is kept as (`map/tasks` knows five).
    pub fn map_status(self) -> &'static str {
        match self {
            Self::Submitted => "open",
            Self::Working => "in_progress",
            Self::InputRequired | Self::AuthRequired => "blocked",
            Self::Completed => "completed",
            Self::Failed | Self::Canceled | Self::Rejected => "failed",
        }
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// The A2A caller.
    #[default]
    User,
    /// The agent.
    Agent,
}

impl Serialize for Role {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            Self::User => "ROLE_USER",
            Self::Agent => "ROLE_AGENT",
        })
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        match name.as_str() {
            "ROLE_USER" | "user" => Ok(Self::User),
            "ROLE_AGENT" | "agent" => Ok(Self::Agent),
            other => Err(serde::de::Error::custom(format!("unknown role {other:?}"))),
        }
    }
}

/// One piece of content (v1.0: exactly one of `text`, `raw` (base64), `url`, `data`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    /// Plain text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// File bytes, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<String>,
    /// A file by URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Structured data, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<RawJson>,
    /// Part metadata, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RawJson>,
    /// File name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    /// Media type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: Some(text.into()),
            ..Self::default()
        }
    }

    /// A data part holding `data` verbatim.
    pub fn data(data: RawJson) -> Self {
        Self {
            data: Some(data),
            ..Self::default()
        }
    }

    /// Whether it carries content at all.
    pub fn has_content(&self) -> bool {
        self.text.is_some() || self.raw.is_some() || self.url.is_some() || self.data.is_some()
    }
}

/// One turn of a conversation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    /// Set by the sender; required (A2A 0.3 and 1.0 both; `@a2a-js/sdk`'s server and the
    /// conformance kit answer -32602 without it).
    #[serde(default)]
    pub message_id: String,
    /// The conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    /// The task it belongs to (a follow-up message names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Who wrote it.
    #[serde(default)]
    pub role: Role,
    /// Its content.
    #[serde(default)]
    pub parts: Vec<Part>,
    /// Message metadata, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RawJson>,
    /// Extension URIs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
    /// Other tasks it refers to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference_task_ids: Vec<String>,
}

impl Message {
    /// An agent message with one text part.
    pub fn agent_text(text: impl Into<String>, task_id: &str, context_id: &str) -> Self {
        Self {
            message_id: crate::protocol::ids::Ulid::random().to_string(),
            context_id: Some(context_id.to_owned()),
            task_id: Some(task_id.to_owned()),
            role: Role::Agent,
            parts: vec![Part::text(text)],
            ..Self::default()
        }
    }
}

/// An output of a task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// Unique within the task.
    #[serde(default)]
    pub artifact_id: String,
    /// Display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its content.
    #[serde(default)]
    pub parts: Vec<Part>,
    /// Artifact metadata, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RawJson>,
    /// Extension URIs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// Request params (v1.0 and v0.3 share these field names; unknown fields are ignored). Each
// multi-word field also takes its proto field name (`task_id`, `history_length`), as protobuf
// JSON parsers do (`serde(alias)`).

/// `SendMessage` / `SendStreamingMessage` / `message/send` / `message/stream`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendParams {
    /// The message, parts still in either version's shape.
    pub message: IncomingMessage,
    /// How to answer.
    #[serde(default)]
    pub configuration: Option<SendConfiguration>,
    /// Request metadata, verbatim (kept in `task.meta.a2a.metadata`).
    #[serde(default)]
    pub metadata: Option<RawJson>,
}

/// A message as a caller sent it: its parts are read by [`parse_part`] (either version).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IncomingMessage {
    /// Set by the sender; required (A2A 0.3 and 1.0 both; `@a2a-js/sdk`'s server and the
    /// conformance kit answer -32602 without it).
    #[serde(default)]
    #[serde(alias = "message_id")]
    pub message_id: String,
    /// The conversation.
    #[serde(default)]
    #[serde(alias = "context_id")]
    pub context_id: Option<String>,
    /// The task it continues.
    #[serde(default)]
    #[serde(alias = "task_id")]
    pub task_id: Option<String>,
    /// Who wrote it (callers write as the user); required, as `messageId` is.
    #[serde(default)]
    pub role: Option<Role>,
    /// Its content, unread.
    #[serde(default)]
    pub parts: Vec<Box<serde_json::value::RawValue>>,
    /// Message metadata, verbatim.
    #[serde(default)]
    pub metadata: Option<RawJson>,
    /// Extension URIs.
    #[serde(default)]
    pub extensions: Vec<String>,
    /// Other tasks it refers to.
    #[serde(default)]
    #[serde(alias = "reference_task_ids")]
    pub reference_task_ids: Vec<String>,
}

impl IncomingMessage {
    /// The message with its parts read; an empty or unreadable part list is an error.
    ///
    /// # Errors
    /// What is wrong with the parts.
    pub fn into_message(self) -> Result<Message, String> {
        if self.message_id.is_empty() {
            return Err("message.messageId is required".into());
        }
        let Some(role) = self.role else {
            return Err("message.role is required".into());
        };
        if self.parts.is_empty() {
            return Err("message.parts must not be empty".into());
        }
        let parts = self
            .parts
            .iter()
            .map(|p| parse_part(p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Message {
            message_id: self.message_id,
            context_id: self.context_id.filter(|c| !c.is_empty()),
            task_id: self.task_id.filter(|t| !t.is_empty()),
            role,
            parts,
            metadata: self.metadata,
            extensions: self.extensions,
            reference_task_ids: self.reference_task_ids,
        })
    }
}

/// `SendMessageConfiguration` (v1.0 `returnImmediately`, v0.3 `blocking`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendConfiguration {
    /// v1.0: answer as soon as the task exists.
    #[serde(default)]
    #[serde(alias = "return_immediately")]
    pub return_immediately: Option<bool>,
    /// v0.3: `false` = answer as soon as the task exists.
    #[serde(default)]
    pub blocking: Option<bool>,
    /// How many history messages to return (all when absent).
    #[serde(default)]
    #[serde(alias = "history_length")]
    pub history_length: Option<u32>,
    /// A push-notification config: not supported (refused with -32003).
    #[serde(default)]
    #[serde(alias = "task_push_notification_config")]
    pub task_push_notification_config: Option<Value>,
    /// v0.3 spelling of the same.
    #[serde(default)]
    #[serde(alias = "push_notification_config")]
    pub push_notification_config: Option<Value>,
}

impl SendConfiguration {
    /// Whether the caller wants the answer only when the task ends or is interrupted.
    pub fn blocking(&self) -> bool {
        match (self.return_immediately, self.blocking) {
            (Some(r), _) => !r,
            (None, Some(b)) => b,
            (None, None) => true,
        }
    }
}

/// `GetTask`, `CancelTask`, `SubscribeToTask` and their v0.3 names.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskIdParams {
    /// The task id.
    pub id: String,
    /// How many history messages to return (all when absent).
    #[serde(default)]
    #[serde(alias = "history_length")]
    pub history_length: Option<u32>,
}

/// `ListTasks`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListParams {
    /// Only tasks of this context.
    #[serde(default)]
    #[serde(alias = "context_id")]
    pub context_id: Option<String>,
    /// Only tasks in this state (either version's name).
    #[serde(default)]
    pub status: Option<String>,
    /// Page size (default 50, at most 100).
    #[serde(default)]
    #[serde(alias = "page_size")]
    pub page_size: Option<u32>,
    /// Where the previous page ended (a MAP cursor).
    #[serde(default)]
    #[serde(alias = "page_token")]
    pub page_token: Option<String>,
    /// How many history messages per task.
    #[serde(default)]
    #[serde(alias = "history_length")]
    pub history_length: Option<u32>,
    /// Whether artifacts are included (default true).
    #[serde(default)]
    #[serde(alias = "include_artifacts")]
    pub include_artifacts: Option<bool>,
}

// ---------------------------------------------------------------------------------------------
// The stored task and its views.

/// An A2A task as the gateway knows it (built from a MAP task and its `meta.a2a`).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskView {
    /// The MAP task id, which is the A2A task id.
    pub id: String,
    /// The A2A context.
    pub context_id: String,
    /// Current state.
    pub state: TaskState,
    /// The message that came with the current state, if any.
    pub status_message: Option<Message>,
    /// When the state was set (RFC 3339).
    pub timestamp: Option<String>,
    /// Outputs so far.
    pub artifacts: Vec<Artifact>,
    /// The conversation so far.
    pub history: Vec<Message>,
    /// Request metadata of the message that created it.
    pub metadata: Option<RawJson>,
}

/// What one update of a task was, for a stream (kept with the task as `meta.a2a.update`).
///
/// A struct rather than a tagged enum: serde buffers tagged enums, and the verbatim
/// [`RawJson`] members inside an artifact can only be read straight from the text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Update {
    /// `status` (the state or its message changed) or `artifact`.
    pub kind: UpdateKind,
    /// For `artifact`: the artifact, or the appended chunk (same `artifactId`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<Artifact>,
    /// Whether `artifact` extends an earlier one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub append: bool,
    /// Whether this is the artifact's last chunk.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub last_chunk: bool,
}

/// The kinds of [`Update`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum UpdateKind {
    /// The state (or its message) changed.
    Status,
    /// An artifact was added or extended.
    Artifact,
}

impl Update {
    /// A state change.
    pub fn status() -> Self {
        Self {
            kind: UpdateKind::Status,
            artifact: None,
            append: false,
            last_chunk: false,
        }
    }
}

fn status_json(v: Version, t: &TaskView) -> Value {
    let mut status = json!({});
    match v {
        Version::V1 => status["state"] = json!(t.state.v1_name()),
        Version::V03 => status["state"] = json!(t.state.v03_name()),
    }
    if let Some(m) = &t.status_message {
        status["message"] = message_json(v, m);
    }
    if let Some(ts) = &t.timestamp {
        status["timestamp"] = json!(ts);
    }
    status
}

/// Renders JSON text as a [`Value`] for output. The raw members (`data`, `metadata`) of what is
/// rendered go out through [`RawJson`] in the final serialization; see [`Rendered`].
pub fn raw(r: &RawJson) -> Value {
    Value::String(Rendered::mark(r))
}

/// Output values are built as [`Value`] trees for clarity; the verbatim members are put in as
/// placeholder strings and spliced back as their original text by [`Rendered::finish`], so
/// they leave the gateway byte for byte.
///
/// The placeholder prefix holds 128 random bits drawn once per process, so no string a caller
/// sends can pass for one.
#[derive(Debug)]
pub struct Rendered {
    _private: (),
}

impl Rendered {
    fn open() -> &'static str {
        static OPEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        OPEN.get_or_init(|| format!("\u{0}raw-{:032x}:", crate::protocol::ids::random_u128()))
    }

    fn mark(r: &RawJson) -> String {
        // The text is valid JSON; we carry it inside the string and unwrap it at the end.
        format!("{}{}", Self::open(), r.get())
    }

    /// Serializes `value`, replacing each placeholder by its original JSON text.
    pub fn finish(value: &Value) -> String {
        let mut out = String::new();
        write_value(&mut out, value);
        out
    }
}

fn write_value(out: &mut String, v: &Value) {
    match v {
        Value::String(s) => match s.strip_prefix(Rendered::open()) {
            Some(text) => out.push_str(text),
            None => out.push_str(&serde_json::to_string(s).unwrap_or_default()),
        },
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push(':');
                write_value(out, item);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A part in `v`'s shape.
pub fn part_json(v: Version, p: &Part) -> Value {
    match v {
        Version::V1 => {
            let mut o = serde_json::Map::new();
            if let Some(t) = &p.text {
                o.insert("text".into(), json!(t));
            }
            if let Some(r) = &p.raw {
                o.insert("raw".into(), json!(r));
            }
            if let Some(u) = &p.url {
                o.insert("url".into(), json!(u));
            }
            if let Some(d) = &p.data {
                o.insert("data".into(), raw(d));
            }
            if let Some(m) = &p.metadata {
                o.insert("metadata".into(), raw(m));
            }
            if let Some(f) = &p.filename {
                o.insert("filename".into(), json!(f));
            }
            if let Some(m) = &p.media_type {
                o.insert("mediaType".into(), json!(m));
            }
            Value::Object(o)
        }
        Version::V03 => {
            let mut o = serde_json::Map::new();
            if let Some(t) = &p.text {
                o.insert("kind".into(), json!("text"));
                o.insert("text".into(), json!(t));
            } else if p.raw.is_some() || p.url.is_some() {
                let mut file = serde_json::Map::new();
                if let Some(r) = &p.raw {
                    file.insert("bytes".into(), json!(r));
                }
                if let Some(u) = &p.url {
                    file.insert("uri".into(), json!(u));
                }
                if let Some(m) = &p.media_type {
                    file.insert("mimeType".into(), json!(m));
                }
                if let Some(f) = &p.filename {
                    file.insert("name".into(), json!(f));
                }
                o.insert("kind".into(), json!("file"));
                o.insert("file".into(), Value::Object(file));
            } else if let Some(d) = &p.data {
                o.insert("kind".into(), json!("data"));
                if d.is_object() {
                    o.insert("data".into(), raw(d));
                } else {
                    // v0.3 data parts are objects: wrap, as the SDK's compat layer does.
                    o.insert("data".into(), json!({ "value": raw(d) }));
                    let mut meta = p
                        .metadata
                        .as_ref()
                        .map(RawJson::to_value)
                        .and_then(|m| m.as_object().cloned())
                        .unwrap_or_default();
                    meta.insert("data_part_compat".into(), json!(true));
                    o.insert("metadata".into(), Value::Object(meta));
                    return Value::Object(o);
                }
            } else {
                o.insert("kind".into(), json!("text"));
                o.insert("text".into(), json!(""));
            }
            if let Some(m) = &p.metadata {
                o.insert("metadata".into(), raw(m));
            }
            Value::Object(o)
        }
    }
}

/// A message in `v`'s shape.
pub fn message_json(v: Version, m: &Message) -> Value {
    let mut o = serde_json::Map::new();
    if v == Version::V03 {
        o.insert("kind".into(), json!("message"));
    }
    o.insert("messageId".into(), json!(m.message_id));
    if let Some(c) = &m.context_id {
        o.insert("contextId".into(), json!(c));
    }
    if let Some(t) = &m.task_id {
        o.insert("taskId".into(), json!(t));
    }
    let role = match (v, m.role) {
        (Version::V1, Role::User) => "ROLE_USER",
        (Version::V1, Role::Agent) => "ROLE_AGENT",
        (Version::V03, Role::User) => "user",
        (Version::V03, Role::Agent) => "agent",
    };
    o.insert("role".into(), json!(role));
    o.insert(
        "parts".into(),
        Value::Array(m.parts.iter().map(|p| part_json(v, p)).collect()),
    );
    if let Some(md) = &m.metadata {
        o.insert("metadata".into(), raw(md));
    }
    if !m.extensions.is_empty() {
        o.insert("extensions".into(), json!(m.extensions));
    }
    if !m.reference_task_ids.is_empty() {
        o.insert("referenceTaskIds".into(), json!(m.reference_task_ids));
    }
    Value::Object(o)
}

/// An artifact in `v`'s shape.
pub fn artifact_json(v: Version, a: &Artifact) -> Value {
    let mut o = serde_json::Map::new();
    o.insert("artifactId".into(), json!(a.artifact_id));
    if let Some(n) = &a.name {
        o.insert("name".into(), json!(n));
    }
    if let Some(d) = &a.description {
        o.insert("description".into(), json!(d));
    }
    o.insert(
        "parts".into(),
        Value::Array(a.parts.iter().map(|p| part_json(v, p)).collect()),
    );
    if let Some(md) = &a.metadata {
        o.insert("metadata".into(), raw(md));
    }
    if !a.extensions.is_empty() {
        o.insert("extensions".into(), json!(a.extensions));
    }
    Value::Object(o)
}

/// A task in `v`'s shape, with at most `history_length` of its latest history messages.
pub fn task_json(v: Version, t: &TaskView, history_length: Option<u32>) -> Value {
    let mut o = serde_json::Map::new();
    if v == Version::V03 {
        o.insert("kind".into(), json!("task"));
    }
    o.insert("id".into(), json!(t.id));
    o.insert("contextId".into(), json!(t.context_id));
    o.insert("status".into(), status_json(v, t));
    o.insert(
        "artifacts".into(),
        Value::Array(t.artifacts.iter().map(|a| artifact_json(v, a)).collect()),
    );
    let skip = match history_length {
        Some(n) => t.history.len().saturating_sub(n as usize),
        None => 0,
    };
    o.insert(
        "history".into(),
        Value::Array(
            t.history
                .iter()
                .skip(skip)
                .map(|m| message_json(v, m))
                .collect(),
        ),
    );
    if let Some(md) = &t.metadata {
        o.insert("metadata".into(), raw(md));
    }
    Value::Object(o)
}

/// The `result` of a stream frame for `update` of `t` (whose state is after the update).
pub fn update_json(v: Version, t: &TaskView, update: &Update) -> Value {
    match (v, &update.artifact) {
        (Version::V1, None) => json!({"statusUpdate": {
            "taskId": t.id, "contextId": t.context_id, "status": status_json(v, t)
        }}),
        (Version::V03, None) => json!({
            "kind": "status-update", "taskId": t.id, "contextId": t.context_id,
            "status": status_json(v, t), "final": t.state.ends_stream()
        }),
        (_, Some(artifact)) => {
            let mut o = serde_json::Map::new();
            if v == Version::V03 {
                o.insert("kind".into(), json!("artifact-update"));
            }
            o.insert("taskId".into(), json!(t.id));
            o.insert("contextId".into(), json!(t.context_id));
            o.insert("artifact".into(), artifact_json(v, artifact));
            if update.append {
                o.insert("append".into(), json!(true));
            }
            if update.last_chunk {
                o.insert("lastChunk".into(), json!(true));
            }
            match v {
                Version::V1 => json!({ "artifactUpdate": Value::Object(o) }),
                Version::V03 => Value::Object(o),
            }
        }
    }
}

/// The `result` of a stream frame (or a send answer) carrying the whole task.
pub fn task_result(v: Version, t: &TaskView, history_length: Option<u32>) -> Value {
    match v {
        Version::V1 => json!({ "task": task_json(v, t, history_length) }),
        Version::V03 => task_json(v, t, history_length),
    }
}

/// The `result` of a send answered with a message (v1.0 `{message}`, v0.3 a `kind: "message"`
/// object): the agent's answer, which belongs to no task the caller knows (no `taskId`).
pub fn message_result(v: Version, m: &Message) -> Value {
    let mut m = m.clone();
    m.task_id = None;
    match v {
        Version::V1 => json!({ "message": message_json(v, &m) }),
        Version::V03 => message_json(v, &m),
    }
}

/// The `result` of a send or a stream frame for `t` as it now is: the agent's message when it
/// answered with one (`message_only`, completed), else `None`.
pub fn direct_answer(v: Version, t: &TaskView, message_only: bool) -> Option<Value> {
    if !message_only || t.state != TaskState::Completed {
        return None;
    }
    t.status_message.as_ref().map(|m| message_result(v, m))
}

/// Reads a part in either version's shape (v0.3 when it has `kind`).
pub fn parse_part(raw_part: &serde_json::value::RawValue) -> Result<Part, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct V03File {
        #[serde(default)]
        bytes: Option<String>,
        #[serde(default)]
        uri: Option<String>,
        #[serde(default, alias = "mime_type")]
        mime_type: Option<String>,
        #[serde(default)]
        name: Option<String>,
    }
    // No `#[serde(flatten)]`: it buffers, and `RawJson` must be read straight from the text.
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Any {
        #[serde(default)]
        kind: Option<String>,
        #[serde(default)]
        file: Option<V03File>,
        #[serde(default)]
        text: Option<String>,
        #[serde(default)]
        raw: Option<String>,
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        data: Option<RawJson>,
        #[serde(default)]
        metadata: Option<RawJson>,
        #[serde(default)]
        filename: Option<String>,
        #[serde(default, alias = "media_type")]
        media_type: Option<String>,
    }
    let any: Any = serde_json::from_str(raw_part.get()).map_err(|e| e.to_string())?;
    let mut part = Part {
        text: any.text,
        raw: any.raw,
        url: any.url,
        data: any.data,
        metadata: any.metadata,
        filename: any.filename,
        media_type: any.media_type,
    };
    match any.kind.as_deref() {
        None | Some("text") => {}
        Some("data") => {
            // Undo the SDK's wrapping of non-object data.
            let compat = part
                .metadata
                .as_ref()
                .and_then(|m| m.bool_member("data_part_compat"))
                .unwrap_or(false);
            if compat {
                if let Some(inner) = part.data.as_ref().and_then(|d| {
                    d.members()
                        .and_then(|m| m.get("value").map(|r| r.get().to_owned()))
                }) {
                    part.data = RawJson::from_text(inner).ok();
                }
                part.metadata = None;
            }
        }
        Some("file") => {
            let f = any.file.ok_or("a file part needs `file`")?;
            part.raw = f.bytes;
            part.url = f.uri;
            part.media_type = f.mime_type;
            part.filename = f.name;
        }
        Some(other) => return Err(format!("unknown part kind {other:?}")),
    }
    if !part.has_content() {
        return Err("a part needs text, raw, url or data".into());
    }
    Ok(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_read_both_names() {
        assert_eq!(
            TaskState::parse("TASK_STATE_INPUT_REQUIRED"),
            Some(TaskState::InputRequired)
        );
        assert_eq!(
            TaskState::parse("input-required"),
            Some(TaskState::InputRequired)
        );
        assert_eq!(TaskState::parse("nope"), None);
        assert_eq!(
            serde_json::to_string(&TaskState::AuthRequired).unwrap(),
            "\"auth-required\""
        );
    }

    #[test]
    fn raw_members_leave_byte_for_byte() {
        let data = RawJson::from_text(r#"{"b":1.50,"a":[1e2]}"#).unwrap();
        let p = Part::data(data);
        let out = Rendered::finish(&part_json(Version::V1, &p));
        assert_eq!(out, r#"{"data":{"b":1.50,"a":[1e2]}}"#);
        let out = Rendered::finish(&part_json(Version::V03, &p));
        assert_eq!(out, r#"{"data":{"b":1.50,"a":[1e2]},"kind":"data"}"#);
    }

    #[test]
    fn v03_data_parts_wrap_non_objects_and_unwrap_on_the_way_in() {
        let p = Part::data(RawJson::from_text("[1, 2]").unwrap());
        let out = Rendered::finish(&part_json(Version::V03, &p));
        assert_eq!(
            out,
            r#"{"data":{"value":[1, 2]},"kind":"data","metadata":{"data_part_compat":true}}"#
        );
        let raw = serde_json::value::RawValue::from_string(out).unwrap();
        let back = parse_part(&raw).unwrap();
        assert_eq!(back.data.unwrap().get(), "[1, 2]");
        assert!(back.metadata.is_none());
    }

    #[test]
    fn v03_file_parts_become_v1_parts() {
        let raw = serde_json::value::RawValue::from_string(
            r#"{"kind":"file","file":{"uri":"http://x/y","mimeType":"text/plain","name":"y"}}"#
                .into(),
        )
        .unwrap();
        let p = parse_part(&raw).unwrap();
        assert_eq!(p.url.as_deref(), Some("http://x/y"));
        assert_eq!(p.media_type.as_deref(), Some("text/plain"));
        assert_eq!(p.filename.as_deref(), Some("y"));
    }
}
