//! One MAP message to a remote A2A agent: the A2A call, and what goes back to the sender.
//!
//! Owns the translation both ways for outbound calls (`docs/a2a.md`, "Calling remote A2A
//! agents" has the tables):
//!
//! - MAP payload → A2A message: a string is one text part; `{"parts": [...]}` (its only member)
//!   gives the parts (either version's shapes); anything else is one data part, verbatim.
//!   `meta.a2a {taskId?, contextId?}` continues a remote task (after `input-required`).
//! - A2A updates → MAP messages to the sender, all with `meta.correlationId` = the request's
//!   `correlationId` (else its message id) and `meta.a2a {taskId, contextId, kind}`: progress as
//!   `{"a2a": {"status": <state>, "message"?}}`, artifacts as
//!   `{"a2a": {"artifact": <v1.0 artifact>, "append", "lastChunk"}}`, and one final reply with
//!   `meta.isResult: true`: the result's content when the task completed (or the agent answered
//!   with a message), else `{"a2a": {"state": <state>, "message"?, "error"?}}`.
//! - A2A task → MAP task `a2a-remote:<agentId>:<remote task id>`, assigned to the remote
//!   agent, its status following the A2A state, `meta.a2aRemote` holding what A2A knows
//!   (so MAP subscribers to `task.*` watch the remote work), `meta.result` the final content.
//!
//! Trace context: every HTTP request of a call carries `traceparent` / `tracestate`: the
//! router's span of the delivery when the `map/message` frame names one, else the MAP
//! message's own `meta.traceparent` (`gateway::trace::of_delivery`); none for an untraced one.
//! The MAP task's `map/tasks/create|update` carry the same context as `params._meta`.
//!
//! Nothing is lost silently: every failure (connection, timeout, a JSON-RPC error, an answer we
//! cannot read, a stream that ends early) ends the call with a `failed` final reply that says
//! why, and fails the MAP task when there is one.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::client::Client;
use crate::gateway::a2a::remote::agent::Remote;
use crate::gateway::a2a::remote::event::{self, Event};
use crate::gateway::a2a::remote::http::{self, Answer};
use crate::gateway::a2a::wire::{
    self, Artifact, Message, Part, Rendered, Role, TaskState, Version,
};
use crate::protocol::json::RawJson;
use crate::protocol::message::Message as MapMessage;
use crate::protocol::methods::messaging::SendParams as MapSendParams;
use crate::protocol::methods::tasks::{TasksCreate, TasksUpdate};
use crate::protocol::methods::Method;
use crate::protocol::trace::TraceContext;

/// The first wait before a task that a blocking `SendMessage` left unfinished is polled with
/// `GetTask`; each next wait is twice the last, up to [`POLL_MAX_INTERVAL`]. Polls of all the
/// remote's calls also share one budget (`agent::POLL_SPACING`).
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// The longest wait between two polls of one task.
pub const POLL_MAX_INTERVAL: Duration = Duration::from_secs(8);
/// How long such a task is polled before the call is given up (the MAP task stays as it was
/// last seen; the sender gets a `failed` reply saying so). At most about 40 polls a call.
pub const POLL_LIMIT: Duration = Duration::from_secs(300);
/// Longest JSON-RPC error message of a remote passed on to the MAP sender.
pub const MAX_ERROR_TEXT: usize = 256;

/// The state of one call.
struct Call<'a> {
    remote: &'a Remote,
    client: &'a Client,
    request: &'a MapMessage,
    correlation: String,
    title: String,
    /// The remote task, once known.
    task_id: Option<String>,
    context_id: Option<String>,
    state: Option<TaskState>,
    artifacts: Vec<Artifact>,
    /// Whether the MAP task exists.
    map_task: bool,
    /// The trace context of the delivery, sent with every request of the call.
    trace: Option<TraceContext>,
}

/// Serves one MAP message to `remote`'s agent; ends when the sender has had its final reply.
/// `trace`: the context its HTTP requests carry (`traceparent`, `tracestate`).
pub async fn serve(
    remote: &Remote,
    client: &Client,
    request: MapMessage,
    trace: Option<TraceContext>,
) {
    if request.is_result() {
        // A reply is not a request: nothing to call (and no loop between two remote agents).
        tracing::debug!(agent = %remote.agent_id, from = %request.from, "a2a remote: a reply ignored");
        return;
    }
    if let Some(correlation) = cancel_notice(&request) {
        cancel(remote, &correlation, trace.as_ref()).await;
        return;
    }
    let message = match outgoing_message(&request) {
        Ok(m) => m,
        Err(why) => {
            let mut call = Call::new(remote, client, &request, String::new(), trace);
            call.fail(&why).await;
            return;
        }
    };
    let title: String = message
        .parts
        .iter()
        .find_map(|p| p.text.as_deref())
        .unwrap_or("A2A call")
        .chars()
        .take(80)
        .collect();
    let mut call = Call::new(remote, client, &request, title, trace);
    call.task_id.clone_from(&message.task_id);
    call.context_id.clone_from(&message.context_id);
    if let Err(why) = call.run(message).await {
        call.fail(&why).await;
    }
    remote.untrack(&call.correlation);
}

/// The server side's cancel notice (`{"a2a": {"cancel": <task>}}` with `meta.a2a.control:
/// "cancel"`, see `tasks/`): the correlation id of the call to cancel.
fn cancel_notice(request: &MapMessage) -> Option<String> {
    let payload = request.payload_value()?;
    let asked = payload.as_object().is_some_and(|o| o.len() == 1)
        && payload["a2a"].as_object().is_some_and(|o| o.len() == 1)
        && !payload["a2a"]["cancel"].is_null();
    asked.then(|| request.correlation_id()).flatten()
}

/// Cancels the remote task of the call answering `correlation` (`CancelTask` / `tasks/cancel`).
/// The call itself ends when the remote agent reports the task canceled. A notice for no call
/// in flight is dropped: the task is over already.
async fn cancel(remote: &Remote, correlation: &str, trace: Option<&TraceContext>) {
    let Some(task) = remote.tracked(correlation) else {
        tracing::debug!(agent = %remote.agent_id, correlation, "a2a remote: cancel for no call in flight");
        return;
    };
    let method = match remote.card.version {
        Version::V1 => "CancelTask",
        Version::V03 => "tasks/cancel",
    };
    let id = format!("map-{}", crate::protocol::ids::Ulid::random());
    let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": { "id": task } })
        .to_string();
    let mut headers = crate::gateway::trace::headers(trace);
    if remote.card.version == Version::V1 {
        headers.push(("a2a-version", "1.0".to_owned()));
    }
    if let Some(t) = &remote.spec.token {
        headers.push(("authorization", format!("Bearer {t}")));
    }
    match http::post(&remote.endpoint, &headers, body, false).await {
        Ok(_) => tracing::debug!(agent = %remote.agent_id, task, "a2a remote: cancel sent"),
        Err(e) => {
            tracing::info!(agent = %remote.agent_id, task, error = %e, "a2a remote: cancel not sent")
        }
    }
}

/// The A2A message for a MAP message (role user, message id = the MAP message id).
fn outgoing_message(request: &MapMessage) -> Result<Message, String> {
    let parts = match &request.payload {
        None => vec![Part::data(RawJson::from_value(&Value::Null))],
        Some(p) => match serde_json::from_str::<String>(p.get()) {
            Ok(text) => vec![Part::text(text)],
            Err(_) => match p.members() {
                Some(m) if m.len() == 1 && m.contains_key("parts") => {
                    let parts: Vec<Box<serde_json::value::RawValue>> =
                        serde_json::from_str(m["parts"].get())
                            .map_err(|e| format!("payload.parts is not a list of parts: {e}"))?;
                    if parts.is_empty() {
                        return Err("payload.parts is empty".into());
                    }
                    parts
                        .iter()
                        .map(|p| wire::parse_part(p))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| format!("payload.parts: {e}"))?
                }
                _ => vec![Part::data(p.clone())],
            },
        },
    };
    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Ids {
        #[serde(default)]
        task_id: Option<String>,
        #[serde(default)]
        context_id: Option<String>,
    }
    #[derive(serde::Deserialize, Default)]
    struct Meta {
        #[serde(default)]
        a2a: Option<Ids>,
        #[serde(default)]
        protocol: Option<String>,
    }
    // NB: the server side's messages (`meta.protocol: "a2a"`) name *its* task and context in
    // `meta.a2a`, not the remote agent's: those ids stay here.
    let ids = request
        .meta
        .as_ref()
        .and_then(|m| serde_json::from_str::<Meta>(m.get()).ok())
        .filter(|m| m.protocol.is_none())
        .and_then(|m| m.a2a)
        .unwrap_or_default();
    Ok(Message {
        message_id: request.id.to_string(),
        context_id: ids.context_id.filter(|c| !c.is_empty()),
        task_id: ids.task_id.filter(|t| !t.is_empty()),
        role: Role::User,
        parts,
        ..Message::default()
    })
}

/// The text of a message's text parts, if any.
fn text_of(m: &Message) -> Option<String> {
    let texts: Vec<&str> = m.parts.iter().filter_map(|p| p.text.as_deref()).collect();
    (!texts.is_empty()).then(|| texts.join("\n"))
}

/// A result's content as a MAP payload: one text part is a string, one data part its data
/// verbatim, anything else `{"parts": [v1.0 parts]}`; no part is `null`.
pub fn content_payload(parts: &[Part]) -> RawJson {
    if let [part] = parts {
        if let (Some(text), None, None, None) = (&part.text, &part.raw, &part.url, &part.data) {
            return RawJson::serialize_from(text);
        }
        if let (Some(data), None, None, None) = (&part.data, &part.text, &part.raw, &part.url) {
            return data.clone();
        }
    }
    if parts.is_empty() {
        return RawJson::from_value(&Value::Null);
    }
    let parts: Vec<Value> = parts
        .iter()
        .map(|p| wire::part_json(Version::V1, p))
        .collect();
    rendered(&json!({ "parts": parts }))
}

fn rendered(v: &Value) -> RawJson {
    // `Rendered::finish` writes valid JSON (the spliced members were JSON text).
    RawJson::from_text(Rendered::finish(v)).unwrap_or_else(|_| RawJson::from_value(&Value::Null))
}

impl<'a> Call<'a> {
    fn new(
        remote: &'a Remote,
        client: &'a Client,
        request: &'a MapMessage,
        title: String,
        trace: Option<TraceContext>,
    ) -> Self {
        Self {
            remote,
            client,
            request,
            correlation: request
                .correlation_id()
                .unwrap_or_else(|| request.id.to_string()),
            title,
            task_id: None,
            context_id: None,
            state: None,
            artifacts: Vec::new(),
            map_task: false,
            trace,
        }
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = crate::gateway::trace::headers(self.trace.as_ref());
        if self.remote.card.version == Version::V1 {
            h.push(("a2a-version", "1.0".to_owned()));
        }
        if let Some(t) = &self.remote.spec.token {
            h.push(("authorization", format!("Bearer {t}")));
        }
        h
    }

    fn envelope(&self, method: &str, params: &Value) -> String {
        let id = format!("map-{}", crate::protocol::ids::Ulid::random());
        Rendered::finish(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
    }

    /// The call itself; `Err` is why it failed (the caller sends the failure).
    async fn run(&mut self, message: Message) -> Result<(), String> {
        let v = self.remote.card.version;
        let stream = self.remote.card.streaming;
        let method = match (v, stream) {
            (Version::V1, true) => "SendStreamingMessage",
            (Version::V1, false) => "SendMessage",
            (Version::V03, true) => "message/stream",
            (Version::V03, false) => "message/send",
        };
        let mut params = json!({ "message": wire::message_json(v, &message) });
        if !stream {
            params["configuration"] = match v {
                Version::V1 => json!({ "returnImmediately": false }),
                Version::V03 => json!({ "blocking": true }),
            };
        }
        let body = self.envelope(method, &params);
        let answer = http::post(&self.remote.endpoint, &self.headers(), body, stream)
            .await
            .map_err(|e| e.to_string())?;
        match answer {
            Answer::Json(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let ev = read(&text)?;
                if self.on_event(ev).await? {
                    return Ok(());
                }
                self.poll().await
            }
            Answer::Stream(mut events) => {
                while let Some(data) = events.next_data().await.map_err(|e| e.to_string())? {
                    let ev = read(&data)?;
                    if self.on_event(ev).await? {
                        return Ok(());
                    }
                }
                // The stream ended without a final state: ask once more.
                self.poll_once().await.and_then(|done| {
                    if done {
                        Ok(())
                    } else {
                        Err(format!(
                            "the stream ended while the task was {}",
                            self.state.map_or("unknown", TaskState::v03_name)
                        ))
                    }
                })
            }
        }
    }

    /// `GetTask` until the task ends or [`POLL_LIMIT`] passes, waiting longer each time
    /// (from [`POLL_INTERVAL`] to [`POLL_MAX_INTERVAL`]) and for the remote's poll budget.
    async fn poll(&mut self) -> Result<(), String> {
        let start = Instant::now();
        let mut wait = POLL_INTERVAL;
        loop {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(POLL_MAX_INTERVAL);
            self.remote.poll_slot().await;
            if self.poll_once().await? {
                return Ok(());
            }
            if start.elapsed() > POLL_LIMIT {
                return Err(format!(
                    "the task was still {} after {POLL_LIMIT:?}",
                    self.state.map_or("unknown", TaskState::v03_name)
                ));
            }
        }
    }

    /// One `GetTask`; `true` when the call is over.
    async fn poll_once(&mut self) -> Result<bool, String> {
        let Some(id) = self.task_id.clone() else {
            return Err("the agent answered with neither a task nor a message".into());
        };
        let method = match self.remote.card.version {
            Version::V1 => "GetTask",
            Version::V03 => "tasks/get",
        };
        let body = self.envelope(method, &json!({ "id": id }));
        let answer = http::post(&self.remote.endpoint, &self.headers(), body, false)
            .await
            .map_err(|e| e.to_string())?;
        let Answer::Json(bytes) = answer else {
            return Err(format!("{method} answered with a stream"));
        };
        let ev = read(&String::from_utf8_lossy(&bytes))?;
        self.on_event(ev).await
    }

    /// Applies one event: MAP task, messages to the sender. `true` when it ended the call.
    async fn on_event(&mut self, ev: Event) -> Result<bool, String> {
        let (task_id, context_id) = ev.ids();
        if let Some(t) = task_id.filter(|t| !t.is_empty()) {
            if self.task_id.as_deref() != Some(t) {
                self.task_id = Some(t.to_owned());
                self.map_task = false;
                self.remote.track(&self.correlation, t);
            }
        }
        if let Some(c) = context_id.filter(|c| !c.is_empty()) {
            self.context_id = Some(c.to_owned());
        }
        match ev {
            Event::Message(m) => {
                let payload = content_payload(&m.parts);
                self.finish(TaskState::Completed, payload, true).await;
                Ok(true)
            }
            Event::Task {
                state,
                message,
                artifacts,
                ..
            } => {
                if !artifacts.is_empty() {
                    self.artifacts = artifacts;
                }
                self.on_state(state, message).await
            }
            Event::Status { state, message, .. } => self.on_state(state, message).await,
            Event::Artifact {
                artifact,
                append,
                last_chunk,
                ..
            } => {
                let shown = wire::artifact_json(Version::V1, &artifact);
                match self
                    .artifacts
                    .iter_mut()
                    .find(|a| append && a.artifact_id == artifact.artifact_id)
                {
                    Some(existing) => existing.parts.extend(artifact.parts),
                    None => {
                        self.artifacts
                            .retain(|a| a.artifact_id != artifact.artifact_id);
                        self.artifacts.push(artifact);
                    }
                }
                self.write_task(None).await;
                let payload = rendered(&json!({
                    "a2a": { "artifact": shown, "append": append, "lastChunk": last_chunk }
                }));
                self.tell(payload, "artifact", None).await;
                Ok(false)
            }
        }
    }

    async fn on_state(
        &mut self,
        state: TaskState,
        message: Option<Message>,
    ) -> Result<bool, String> {
        self.state = Some(state);
        if state == TaskState::Completed {
            let parts: Vec<Part> = if self.artifacts.is_empty() {
                message.map(|m| m.parts).unwrap_or_default()
            } else {
                self.artifacts
                    .iter()
                    .flat_map(|a| a.parts.clone())
                    .collect()
            };
            let payload = content_payload(&parts);
            self.finish(state, payload, false).await;
            return Ok(true);
        }
        let mut a2a = serde_json::Map::new();
        let key = if state.ends_stream() {
            "state"
        } else {
            "status"
        };
        a2a.insert(key.into(), json!(state.v03_name()));
        if let Some(text) = message.as_ref().and_then(text_of) {
            a2a.insert("message".into(), json!(text));
        }
        let payload = RawJson::from_value(&json!({ "a2a": a2a }));
        if state.ends_stream() {
            self.finish(state, payload, false).await;
            return Ok(true);
        }
        self.write_task(None).await;
        // NB: only `working` is told: in the conventions the server side reads (record.rs),
        // any other `status` would read as a final answer.
        if state == TaskState::Working {
            self.tell(payload, "status", None).await;
        }
        Ok(false)
    }

    /// The final reply, and the MAP task's last update.
    async fn finish(&mut self, state: TaskState, payload: RawJson, direct: bool) {
        self.state = Some(state);
        if !direct {
            let result = (state == TaskState::Completed).then_some(&payload);
            self.write_task(result).await;
        }
        self.tell(
            payload,
            if direct { "message" } else { "final" },
            Some(state),
        )
        .await;
    }

    /// Ends the call in failure: a `failed` final reply saying `why`; the MAP task fails too.
    async fn fail(&mut self, why: &str) {
        tracing::info!(agent = %self.remote.agent_id, error = why, "a2a remote: call failed");
        self.state = Some(TaskState::Failed);
        let payload = RawJson::from_value(&json!({ "a2a": { "state": "failed", "error": why } }));
        self.write_task(None).await;
        self.tell(payload, "final", Some(TaskState::Failed)).await;
    }

    /// Sends one message to the requester. `state` marks the final reply.
    async fn tell(&self, payload: RawJson, kind: &str, state: Option<TaskState>) {
        let mut a2a = serde_json::Map::new();
        if let Some(t) = &self.task_id {
            a2a.insert("taskId".into(), json!(t));
        }
        if let Some(c) = &self.context_id {
            a2a.insert("contextId".into(), json!(c));
        }
        a2a.insert("kind".into(), json!(kind));
        if let Some(s) = state {
            a2a.insert("state".into(), json!(s.v03_name()));
        }
        let mut meta = json!({ "correlationId": self.correlation, "a2a": a2a });
        if state.is_some() {
            meta["isResult"] = json!(true);
        }
        let sent = self
            .client
            .send_with(MapSendParams {
                to: RawJson::from_value(&json!(self.request.from)),
                payload: Some(payload),
                meta: Some(RawJson::from_value(&meta)),
            })
            .await;
        if let Err(e) = sent {
            tracing::info!(agent = %self.remote.agent_id, to = %self.request.from, error = %e, "a2a remote: could not tell the sender");
        }
    }

    /// The MAP task's id for the current remote task.
    fn map_task_id(&self) -> Option<String> {
        self.task_id
            .as_ref()
            .map(|t| format!("a2a-remote:{}:{t}", self.remote.agent_id))
    }

    /// Creates or updates the MAP task (when there is a remote task). Failures are logged: the
    /// A2A call goes on without its MAP mirror rather than failing for it.
    async fn write_task(&mut self, result: Option<&RawJson>) {
        let Some(id) = self.map_task_id() else {
            return;
        };
        let state = self.state.unwrap_or(TaskState::Submitted);
        let artifacts: Vec<Value> = self
            .artifacts
            .iter()
            .map(|a| wire::artifact_json(Version::V1, a))
            .collect();
        let record = json!({
            "agent": self.remote.agent_id,
            "taskId": self.task_id,
            "contextId": self.context_id,
            "state": state.v03_name(),
            "requestedBy": self.request.from,
            "messageId": self.request.id.to_string(),
            "artifacts": artifacts,
        });
        if !self.map_task {
            let params = json!({ "task": {
                "id": id,
                "assignee": self.remote.agent_id,
                "title": self.title,
                "status": TaskState::Submitted.map_status(),
                "meta": { "a2aRemote": record.clone() },
            }});
            // Created as submitted, then updated: a subscriber sees the task's status events
            // (and `task.completed`) even when the first answer is already the final one.
            match self
                .client
                .call_text(
                    TasksCreate::NAME,
                    crate::gateway::trace::with_meta_text(
                        Rendered::finish(&params),
                        self.trace.as_ref(),
                    ),
                )
                .await
            {
                Ok(_) => self.map_task = true,
                // Taken: a later turn of the same remote task (after input-required).
                Err(e) if e.code().map(|c| c.0) == Some(-32602) => self.map_task = true,
                Err(e) => {
                    tracing::info!(task = %id, error = %e, "a2a remote: MAP task not created");
                    return;
                }
            }
        }
        let mut meta = json!({ "a2aRemote": record });
        if let Some(r) = result {
            meta["result"] = wire::raw(r);
        }
        let params = json!({ "taskId": id, "status": state.map_status(), "meta": meta });
        if let Err(e) = self
            .client
            .call_text(
                TasksUpdate::NAME,
                crate::gateway::trace::with_meta_text(
                    Rendered::finish(&params),
                    self.trace.as_ref(),
                ),
            )
            .await
        {
            tracing::info!(task = %id, error = %e, "a2a remote: MAP task not updated");
        }
    }
}

/// One answer of the remote agent. What goes back to the MAP sender is in our words: a
/// JSON-RPC error's code and (at most [`MAX_ERROR_TEXT`] bytes of) its message, which is the
/// A2A protocol's own answer, else only that the answer could not be read (why: logged).
fn read(text: &str) -> Result<Event, String> {
    match event::read_response(text) {
        Ok(Ok(ev)) => Ok(ev),
        Ok(Err(f)) => {
            let mut message = f.message;
            if message.len() > MAX_ERROR_TEXT {
                let mut cut = MAX_ERROR_TEXT;
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                message.truncate(cut);
                message.push('…');
            }
            Err(format!("the agent answered error {}: {message}", f.code))
        }
        Err(why) => {
            tracing::debug!(error = %why, "a2a remote: unreadable answer");
            Err("the agent's answer is not an A2A JSON-RPC response".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_payloads() {
        assert_eq!(content_payload(&[Part::text("hi")]).get(), r#""hi""#);
        let d = RawJson::from_text(r#"{"z":1,"a":2}"#).unwrap();
        assert_eq!(content_payload(&[Part::data(d)]).get(), r#"{"z":1,"a":2}"#);
        assert_eq!(content_payload(&[]).get(), "null");
        assert_eq!(
            content_payload(&[Part::text("a"), Part::text("b")]).get(),
            r#"{"parts":[{"text":"a"},{"text":"b"}]}"#
        );
    }
}
