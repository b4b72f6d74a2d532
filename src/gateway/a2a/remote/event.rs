//! What a remote A2A agent answers, read into one shape whatever its version: a JSON-RPC
//! response (a whole body, or one SSE `data`) becomes an [`Event`] or an [`RpcFailure`].
//!
//! Pure: text in, values out. v1.0 results wrap their object (`{task}`, `{message}`,
//! `{statusUpdate}`, `{artifactUpdate}`); v0.3 results are the object itself with a `kind`
//! (`task`, `message`, `status-update`, `artifact-update`). Parts are read by
//! [`wire::parse_part`], which takes both versions and keeps `data`/`metadata` verbatim.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::gateway::a2a::wire::{self, Artifact, IncomingMessage, Message, TaskState};
use crate::protocol::json::RawJson;

/// One thing a remote agent reported.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A task (a snapshot: its state and all its artifacts so far).
    Task {
        /// Its id.
        id: String,
        /// Its context.
        context_id: String,
        /// Its state.
        state: TaskState,
        /// The message with the state.
        message: Option<Message>,
        /// Its artifacts.
        artifacts: Vec<Artifact>,
    },
    /// A direct answer, no task.
    Message(Message),
    /// A state change.
    Status {
        /// The task.
        task_id: String,
        /// Its context.
        context_id: String,
        /// The new state.
        state: TaskState,
        /// The message with it.
        message: Option<Message>,
    },
    /// An artifact, or a chunk of one.
    Artifact {
        /// The task.
        task_id: String,
        /// Its context.
        context_id: String,
        /// The artifact (chunk).
        artifact: Artifact,
        /// Extends the artifact with the same id.
        append: bool,
        /// Its last chunk.
        last_chunk: bool,
    },
}

impl Event {
    /// The task and context it belongs to (`None` for a direct message without ids).
    pub fn ids(&self) -> (Option<&str>, Option<&str>) {
        match self {
            Self::Task { id, context_id, .. } => (Some(id), Some(context_id)),
            Self::Status {
                task_id,
                context_id,
                ..
            }
            | Self::Artifact {
                task_id,
                context_id,
                ..
            } => (Some(task_id), Some(context_id)),
            Self::Message(m) => (m.task_id.as_deref(), m.context_id.as_deref()),
        }
    }

    /// The state it puts the task in, if any.
    pub fn state(&self) -> Option<TaskState> {
        match self {
            Self::Task { state, .. } | Self::Status { state, .. } => Some(*state),
            _ => None,
        }
    }
}

/// A JSON-RPC error from the remote agent, verbatim.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcFailure {
    /// `error.code`.
    pub code: i64,
    /// `error.message`.
    pub message: String,
}

/// Reads one JSON-RPC response.
///
/// # Errors
/// `Ok(Err(_))`: the remote's JSON-RPC error. `Err(_)`: an answer we cannot read.
pub fn read_response(text: &str) -> Result<Result<Event, RpcFailure>, String> {
    #[derive(Deserialize)]
    struct ErrorObject {
        code: i64,
        #[serde(default)]
        message: String,
    }
    #[derive(Deserialize)]
    struct Response {
        #[serde(default)]
        result: Option<Box<RawValue>>,
        #[serde(default)]
        error: Option<ErrorObject>,
    }
    let r: Response =
        serde_json::from_str(text).map_err(|e| format!("not a JSON-RPC response: {e}"))?;
    if let Some(e) = r.error {
        return Ok(Err(RpcFailure {
            code: e.code,
            message: e.message,
        }));
    }
    let result = r
        .result
        .ok_or("a JSON-RPC response without result or error")?;
    read_result(&result).map(Ok)
}

/// Reads a `result`: a v1.0 wrapper or a v0.3 `kind`-tagged object.
///
/// # Errors
/// What is not understood.
pub fn read_result(raw: &RawValue) -> Result<Event, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Any {
        #[serde(default)]
        kind: Option<String>,
        #[serde(default)]
        task: Option<Box<RawValue>>,
        #[serde(default)]
        message: Option<Box<RawValue>>,
        #[serde(default)]
        status_update: Option<Box<RawValue>>,
        #[serde(default)]
        artifact_update: Option<Box<RawValue>>,
    }
    let any: Any = serde_json::from_str(raw.get()).map_err(|e| e.to_string())?;
    match any.kind.as_deref() {
        Some("task") => return read_task(raw),
        Some("message") => return read_message(raw).map(Event::Message),
        Some("status-update") => return read_status(raw),
        Some("artifact-update") => return read_artifact_update(raw),
        Some(other) => return Err(format!("unknown result kind {other:?}")),
        None => {}
    }
    if let Some(t) = any.task {
        read_task(&t)
    } else if let Some(m) = any.message {
        read_message(&m).map(Event::Message)
    } else if let Some(s) = any.status_update {
        read_status(&s)
    } else if let Some(a) = any.artifact_update {
        read_artifact_update(&a)
    } else {
        Err("the result is none of task, message, statusUpdate, artifactUpdate".into())
    }
}

#[derive(Deserialize)]
struct Status {
    state: String,
    #[serde(default)]
    message: Option<Box<RawValue>>,
}

impl Status {
    fn read(self) -> Result<(TaskState, Option<Message>), String> {
        let state = TaskState::parse(&self.state)
            .ok_or_else(|| format!("unknown state {:?}", self.state))?;
        let message = match self.message {
            Some(m) if m.get() != "null" => Some(read_message(&m)?),
            _ => None,
        };
        Ok((state, message))
    }
}

fn read_message(raw: &RawValue) -> Result<Message, String> {
    let m: IncomingMessage = serde_json::from_str(raw.get()).map_err(|e| e.to_string())?;
    m.into_message()
}

fn read_task(raw: &RawValue) -> Result<Event, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Task {
        id: String,
        #[serde(default)]
        context_id: String,
        status: Status,
        #[serde(default)]
        artifacts: Vec<Box<RawValue>>,
    }
    let t: Task = serde_json::from_str(raw.get()).map_err(|e| format!("a bad task: {e}"))?;
    let (state, message) = t.status.read()?;
    let artifacts = t
        .artifacts
        .iter()
        .map(|a| read_artifact(a))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Event::Task {
        id: t.id,
        context_id: t.context_id,
        state,
        message,
        artifacts,
    })
}

fn read_status(raw: &RawValue) -> Result<Event, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Update {
        task_id: String,
        #[serde(default)]
        context_id: String,
        status: Status,
    }
    let u: Update =
        serde_json::from_str(raw.get()).map_err(|e| format!("a bad status update: {e}"))?;
    let (state, message) = u.status.read()?;
    Ok(Event::Status {
        task_id: u.task_id,
        context_id: u.context_id,
        state,
        message,
    })
}

fn read_artifact_update(raw: &RawValue) -> Result<Event, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Update {
        task_id: String,
        #[serde(default)]
        context_id: String,
        artifact: Box<RawValue>,
        #[serde(default)]
        append: Option<bool>,
        #[serde(default)]
        last_chunk: Option<bool>,
    }
    let u: Update =
        serde_json::from_str(raw.get()).map_err(|e| format!("a bad artifact update: {e}"))?;
    Ok(Event::Artifact {
        task_id: u.task_id,
        context_id: u.context_id,
        artifact: read_artifact(&u.artifact)?,
        append: u.append.unwrap_or(false),
        last_chunk: u.last_chunk.unwrap_or(false),
    })
}

fn read_artifact(raw: &RawValue) -> Result<Artifact, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct In {
        #[serde(default)]
        artifact_id: String,
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        description: Option<String>,
        #[serde(default)]
        parts: Vec<Box<RawValue>>,
        #[serde(default)]
        metadata: Option<RawJson>,
        #[serde(default)]
        extensions: Vec<String>,
    }
    let a: In = serde_json::from_str(raw.get()).map_err(|e| format!("a bad artifact: {e}"))?;
    Ok(Artifact {
        artifact_id: a.artifact_id,
        name: a.name,
        description: a.description,
        parts: a
            .parts
            .iter()
            .map(|p| wire::parse_part(p))
            .collect::<Result<Vec<_>, _>>()?,
        metadata: a.metadata,
        extensions: a.extensions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::a2a::wire::Part;

    fn event(text: &str) -> Event {
        read_response(text).unwrap().unwrap()
    }

    #[test]
    fn v1_results() {
        let e = event(
            r#"{"jsonrpc":"2.0","id":1,"result":{"statusUpdate":{"taskId":"t","contextId":"c","status":{"state":"TASK_STATE_WORKING"}}}}"#,
        );
        assert_eq!(e.state(), Some(TaskState::Working));
        let e = event(
            r#"{"jsonrpc":"2.0","id":1,"result":{"artifactUpdate":{"taskId":"t","contextId":"c","artifact":{"artifactId":"a","parts":[{"data":{"z":1,"a":2}}]},"lastChunk":true}}}"#,
        );
        match e {
            Event::Artifact {
                artifact,
                last_chunk,
                ..
            } => {
                assert!(last_chunk);
                assert_eq!(
                    artifact.parts[0].data.as_ref().unwrap().get(),
                    r#"{"z":1,"a":2}"#
                );
            }
            other => panic!("{other:?}"),
        }
        let e = event(
            r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t","contextId":"c","status":{"state":"TASK_STATE_COMPLETED"},"artifacts":[{"artifactId":"a","parts":[{"text":"hi"}]}]}}}"#,
        );
        assert_eq!(e.ids(), (Some("t"), Some("c")));
        assert_eq!(e.state(), Some(TaskState::Completed));
    }

    #[test]
    fn v03_results_and_errors() {
        let e = event(
            r#"{"jsonrpc":"2.0","id":1,"result":{"kind":"message","messageId":"m","role":"agent","parts":[{"kind":"text","text":"yo"}]}}"#,
        );
        match e {
            Event::Message(m) => assert_eq!(m.parts, vec![Part::text("yo")]),
            other => panic!("{other:?}"),
        }
        let e = event(
            r#"{"jsonrpc":"2.0","id":1,"result":{"kind":"status-update","taskId":"t","contextId":"c","status":{"state":"input-required"},"final":true}}"#,
        );
        assert_eq!(e.state(), Some(TaskState::InputRequired));
        let failure =
            read_response(r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"nope"}}"#)
                .unwrap()
                .unwrap_err();
        assert_eq!(failure.code, -32001);
        assert!(read_response("{}").is_err());
        assert!(read_response(r#"{"result":{"other":1}}"#).is_err());
    }
}
