//! The A2A JSON-RPC endpoint: reading a request (hostile input included), the method table
//! (v1.0 and v0.3 names, each answered in its own version's shapes), and the answers.
//!
//! Owns: [`Method`] (the table), envelope checks, and the handler of each method on top of
//! [`Core`](super::tasks::Core). Streaming methods answer through `sse.rs`. Each handler acts
//! for an [`access::Caller`](super::access::Caller): reads (`GetTask`, `ListTasks`,
//! `SubscribeToTask`) need the caller's `tasks.canList`, `CancelTask` its `tasks.canUpdate`, a
//! send its `messaging.canSend` (and MAP's `tasks.canCreate` for a new task); and every task
//! operation is limited to the tasks the caller controls (`access.rs`).
//!
//! Input rules: the body must be one JSON-RPC 2.0 request object (`jsonrpc: "2.0"`, a string
//! or number `id`, a string `method`); a batch or anything else is -32600 with `id: null`;
//! text that is not JSON is -32700. A request without an id (a notification) is checked as
//! any other, method and params included, and gets its real error with `id: null`; only one
//! with nothing else wrong gets the -32600 that says notifications are not taken. As MAP's own envelope rules
//! (docs/compatibility.md §1): nesting deeper than MAP's `max_depth` is -32600 with `id: null`
//! before anything is parsed; a numeric id beyond a double's range (`1e400`), which a strict
//! parser could not read back, is -32600 with `id: null`; an unknown method's name is echoed
//! at most its first 128 bytes. Oversize bodies never reach here (`mod.rs` answers 413).
//! Errors of a well-formed call are HTTP 200 with a JSON-RPC error.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::gateway::a2a::access::Caller;
use crate::gateway::a2a::error::A2aError;
use crate::gateway::a2a::frame::{error_frame, result_frame};
use crate::gateway::a2a::push::{ConfigParams, PushConfig};
use crate::gateway::a2a::sse;
use crate::gateway::a2a::tasks::{Core, Target, BLOCKING_WAIT};
use crate::gateway::a2a::wire::{self, ListParams, SendParams, TaskIdParams, TaskState, Version};
use crate::protocol::capabilities::Capability;

/// What a method does (its version is known from its name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `SendMessage`, `message/send`.
    Send,
    /// `SendStreamingMessage`, `message/stream`.
    Stream,
    /// `GetTask`, `tasks/get`.
    Get,
    /// `ListTasks` (v1.0 only).
    List,
    /// `CancelTask`, `tasks/cancel`.
    Cancel,
    /// `SubscribeToTask`, `tasks/resubscribe`.
    Subscribe,
    /// `GetExtendedAgentCard`, `agent/getAuthenticatedExtendedCard`.
    ExtendedCard,
    /// `CreateTaskPushNotificationConfig`, `tasks/pushNotificationConfig/set`.
    PushSet,
    /// `GetTaskPushNotificationConfig`, `tasks/pushNotificationConfig/get`.
    PushGet,
    /// `ListTaskPushNotificationConfigs`, `tasks/pushNotificationConfig/list`.
    PushList,
    /// `DeleteTaskPushNotificationConfig`, `tasks/pushNotificationConfig/delete`.
    PushDelete,
}

impl Method {
    /// Whether it may be about one existing task (a follow-up send included), so that the URL
    /// of an agent gone since may still serve it (`tasks/`, `Target::Former`). Listings and
    /// the card are not.
    pub fn is_about_one_task(self) -> bool {
        !matches!(self, Self::List | Self::ExtendedCard)
    }
}

/// Every method name the endpoint knows.
pub const METHODS: &[(&str, Method, Version)] = &[
    ("SendMessage", Method::Send, Version::V1),
    ("SendStreamingMessage", Method::Stream, Version::V1),
    ("GetTask", Method::Get, Version::V1),
    ("ListTasks", Method::List, Version::V1),
    ("CancelTask", Method::Cancel, Version::V1),
    ("SubscribeToTask", Method::Subscribe, Version::V1),
    ("GetExtendedAgentCard", Method::ExtendedCard, Version::V1),
    (
        "CreateTaskPushNotificationConfig",
        Method::PushSet,
        Version::V1,
    ),
    (
        "GetTaskPushNotificationConfig",
        Method::PushGet,
        Version::V1,
    ),
    (
        "ListTaskPushNotificationConfigs",
        Method::PushList,
        Version::V1,
    ),
    (
        "DeleteTaskPushNotificationConfig",
        Method::PushDelete,
        Version::V1,
    ),
    ("message/send", Method::Send, Version::V03),
    ("message/stream", Method::Stream, Version::V03),
    ("tasks/get", Method::Get, Version::V03),
    ("tasks/cancel", Method::Cancel, Version::V03),
    ("tasks/resubscribe", Method::Subscribe, Version::V03),
    (
        "tasks/pushNotificationConfig/set",
        Method::PushSet,
        Version::V03,
    ),
    (
        "tasks/pushNotificationConfig/get",
        Method::PushGet,
        Version::V03,
    ),
    (
        "tasks/pushNotificationConfig/list",
        Method::PushList,
        Version::V03,
    ),
    (
        "tasks/pushNotificationConfig/delete",
        Method::PushDelete,
        Version::V03,
    ),
    (
        "agent/getAuthenticatedExtendedCard",
        Method::ExtendedCard,
        Version::V03,
    ),
];

/// A request that passed the envelope checks.
#[derive(Debug)]
pub struct Request {
    /// The id, as the caller wrote it.
    pub id: Box<RawValue>,
    /// The method's name as the caller wrote it (`SendMessage`, `message/send`, ...): MAP's
    /// `meta.a2a.method`.
    pub name: &'static str,
    /// What to do.
    pub method: Method,
    /// In which version.
    pub version: Version,
    /// The params, unread (`{}` when absent).
    pub params: Box<RawValue>,
}

/// Checks the envelope of a body.
///
/// # Errors
/// -32700 / -32600 / -32601, to be answered with `id` (null when it could not be read).
pub fn read(body: &[u8], max_depth: usize) -> Result<Request, (Option<Box<RawValue>>, A2aError)> {
    let text = std::str::from_utf8(body)
        .map_err(|e| (None, A2aError::parse_error(format!("not UTF-8: {e}"))))?;
    // NB: before parsing, as MAP does: a deep body costs one linear scan, and it could never
    // reach the agent (MAP refuses the frame it would become).
    crate::protocol::jsonrpc::check_depth(text, max_depth).map_err(|_| {
        (
            None,
            A2aError::invalid_request(format!(
                "JSON nesting exceeds MAP's limit of {max_depth} levels ([limits] max_depth)"
            )),
        )
    })?;
    let value: &RawValue =
        serde_json::from_str(text).map_err(|e| (None, A2aError::parse_error(e)))?;
    // NB: RawValue keeps a lone surrogate escape that no reader can turn into text.
    crate::protocol::json::refuse_lone_surrogate(body)
        .map_err(|e| (None, A2aError::parse_error(e)))?;
    let t = value.get().trim_start();
    if t.starts_with('[') {
        return Err((None, A2aError::invalid_request("batches are not supported")));
    }
    if !t.starts_with('{') {
        return Err((
            None,
            A2aError::invalid_request("not a JSON-RPC request object"),
        ));
    }
    #[derive(Deserialize)]
    struct Envelope {
        #[serde(default)]
        jsonrpc: Option<Box<RawValue>>,
        #[serde(default)]
        id: Option<Box<RawValue>>,
        #[serde(default)]
        method: Option<Box<RawValue>>,
        #[serde(default)]
        params: Option<Box<RawValue>>,
    }
    let env: Envelope =
        serde_json::from_str(text).map_err(|e| (None, A2aError::invalid_request(e)))?;
    // A string or a number that fits a double (MAP's `Id::from_raw`). An absent or `null` id
    // is a notification, which the endpoint does not take; but the request is still checked
    // first, so that a wrong method or params gets its own error (with `id: null`), and only
    // an otherwise valid notification the -32600 that says so.
    let id = match env.id {
        None => None,
        Some(id) if id.get().trim() == "null" => None,
        Some(id) if crate::protocol::jsonrpc::Id::from_raw(&id).is_some() => Some(id),
        Some(_) => {
            return Err((
                None,
                A2aError::invalid_request(
                    "`id` must be a string or a number within a double's range",
                ),
            ));
        }
    };
    if env.jsonrpc.as_deref().map(RawValue::get) != Some("\"2.0\"") {
        return Err((id, A2aError::invalid_request("`jsonrpc` must be \"2.0\"")));
    }
    let Some(name) = env
        .method
        .as_deref()
        .and_then(|m| serde_json::from_str::<String>(m.get()).ok())
    else {
        return Err((id, A2aError::invalid_request("`method` must be a string")));
    };
    let Some(&(name, method, version)) = METHODS.iter().find(|(n, _, _)| *n == name) else {
        return Err((id, A2aError::method_not_found(&name)));
    };
    let params = match env.params {
        Some(p) if p.get().trim_start().starts_with('{') => p,
        None => RawValue::from_string("{}".into()).map_err(|e| (None, A2aError::internal(e)))?,
        Some(_) => {
            return Err((id, A2aError::invalid_params("params must be an object")));
        }
    };
    let Some(id) = id else {
        // The params are read as the method would read them (nothing is done), so that bad
        // ones get -32602 rather than the notification's -32600.
        check_params(method, &params).map_err(|e| (None, e))?;
        return Err((
            None,
            A2aError::invalid_request(
                "`id` must be a string or a number within a double's range (notifications are not supported)",
            ),
        ));
    };
    Ok(Request {
        id,
        name,
        method,
        version,
        params,
    })
}

/// Reads `raw` as `method`'s params, as its handler will (without acting on them).
///
/// # Errors
/// -32602 for params the handler would refuse as such.
fn check_params(method: Method, raw: &RawValue) -> Result<(), A2aError> {
    match method {
        Method::Send | Method::Stream => {
            let p: SendParams = params(raw)?;
            p.message
                .into_message()
                .map(drop)
                .map_err(A2aError::invalid_params)
        }
        Method::Get | Method::Cancel | Method::Subscribe => params::<TaskIdParams>(raw).map(drop),
        Method::List => params::<ListParams>(raw).map(drop),
        Method::ExtendedCard
        | Method::PushSet
        | Method::PushGet
        | Method::PushList
        | Method::PushDelete => Ok(()),
    }
}

fn json_response(status: StatusCode, body: String) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// The error answer in `v`'s shape (with `Retry-After` when the error says when to retry).
pub fn error_response(id: Option<&RawValue>, e: &A2aError, v: Version) -> Response {
    let mut response = json_response(e.status, error_frame(id, e, v));
    if let Some(v) = e.retry_after.and_then(retry_after_header) {
        response.headers_mut().insert(header::RETRY_AFTER, v);
    }
    response
}

/// What the request's `A2A-Version` header asks for: `Ok(None)` without one (or an empty one),
/// which A2A 1.0 §3.6.2 reads as 0.3; the version for `1.0` or `0.3` (a patch, `1.0.0`, too).
/// Which method set a request uses is still read from its method's name, whatever the header
/// says (as `@a2a-js/sdk`'s server does), so that every client of either version keeps working.
///
/// # Errors
/// -32009 (`VersionNotSupported`) for any other value.
pub fn asked_version(headers: &axum::http::HeaderMap) -> Result<Option<Version>, A2aError> {
    let Some(value) = headers.get("a2a-version") else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(value.as_bytes());
    if text.trim().is_empty() {
        return Ok(None);
    }
    Version::from_header(&text)
        .map(Some)
        .ok_or_else(|| A2aError::version_not_supported(text.trim()))
}

/// The error answer of a streaming method (`SendStreamingMessage`, `SubscribeToTask` and their
/// v0.3 names): a v0.3 caller gets it as one SSE event (`text/event-stream`, which v0.3 clients
/// require, as `@a2a-js/sdk`'s v0.3 server sends it), a v1.0 caller as JSON (as its v1.0 server
/// does for an error before the first event). Errors with an HTTP status of their own (401,
/// 403, 404, 429 ...) stay JSON in both.
pub fn stream_error_response(id: &RawValue, e: &A2aError, v: Version) -> Response {
    if v == Version::V03 && e.status == StatusCode::OK {
        sse::error_response(id, e, v)
    } else {
        error_response(Some(id), e, v)
    }
}

/// `Retry-After` for a wait: whole seconds, rounded up, at least 1.
pub fn retry_after_header(wait: std::time::Duration) -> Option<HeaderValue> {
    let secs = wait.as_millis().div_ceil(1000).max(1);
    HeaderValue::from_str(&secs.to_string()).ok()
}

fn params<T: DeserializeOwned>(raw: &RawValue) -> Result<T, A2aError> {
    serde_json::from_str(raw.get()).map_err(A2aError::invalid_params)
}

/// Answers one request.
pub async fn handle(
    core: &Core,
    caller: &Caller,
    target: &Target,
    request: Request,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Response {
    let Request {
        id,
        method,
        version,
        params: raw,
        ..
    } = request;
    let answer = match method {
        Method::Send => send(core, caller, target, version, &raw).await,
        Method::Stream => {
            return match stream(core, caller, target, version, id.clone(), &raw, shutdown).await {
                Ok(r) => r,
                Err(e) => stream_error_response(&id, &e, version),
            };
        }
        Method::Subscribe => {
            return match subscribe(core, caller, target, version, id.clone(), &raw, shutdown).await
            {
                Ok(r) => r,
                Err(e) => stream_error_response(&id, &e, version),
            };
        }
        Method::Get => get(core, caller, target, version, &raw).await,
        Method::List => list(core, caller, target, version, &raw).await,
        Method::Cancel => cancel(core, caller, target, version, &raw).await,
        Method::ExtendedCard => Err(A2aError::no_extended_card()),
        Method::PushSet | Method::PushGet | Method::PushList | Method::PushDelete => {
            push(core, caller, target, method, version, &raw).await
        }
    };
    match answer {
        Ok(result) => json_response(StatusCode::OK, result_frame(&id, &result)),
        Err(e) => error_response(Some(&id), &e, version),
    }
}

/// The webhook a send's `configuration` registers, if any (the caller's).
fn push_of(p: &SendParams, v: Version, caller: &Caller) -> Result<Option<PushConfig>, A2aError> {
    let Some(raw) = p.configuration.as_ref().and_then(|c| {
        c.task_push_notification_config
            .clone()
            .or_else(|| c.push_notification_config.clone())
    }) else {
        return Ok(None);
    };
    let params: ConfigParams = serde_json::from_value(raw).map_err(A2aError::invalid_params)?;
    let mut config = params.into_config(v, caller.owner())?;
    config.trace = caller.trace().cloned();
    Ok(Some(config))
}

/// The push-notification config methods.
async fn push(
    core: &Core,
    caller: &Caller,
    target: &Target,
    method: Method,
    v: Version,
    raw: &RawValue,
) -> Result<Value, A2aError> {
    if !core.push.enabled() {
        return Err(A2aError::push_not_supported());
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Ids {
        #[serde(default, alias = "task_id")]
        task_id: Option<String>,
        #[serde(default)]
        id: Option<String>,
        #[serde(default, alias = "push_notification_config_id")]
        push_notification_config_id: Option<String>,
    }
    // v1.0: {taskId, id}; v0.3: {id: taskId, pushNotificationConfigId}.
    let ids: Ids = params(raw)?;
    let (task_id, config_id) = match (v, method) {
        (Version::V1, _) | (Version::V03, Method::PushSet) => (ids.task_id, ids.id),
        (Version::V03, _) => (ids.id, ids.push_notification_config_id),
    };
    let task_id = task_id.ok_or_else(|| A2aError::invalid_params("the task id is missing"))?;
    // Only a principal that controls the task reaches its configs at all (else: no such task).
    core.task(caller, target, &task_id).await?;
    let me = caller.owner();
    let missing = |id: &str| {
        A2aError::invalid_params(format!(
            "no push notification config {id:?} on task {task_id}"
        ))
    };
    // A config's secrets are its setter's.
    let render = |c: &PushConfig| c.to_json(v, &task_id, c.is_of(me.as_ref()));
    match method {
        Method::PushSet => {
            let mut config = params::<ConfigParams>(raw)?.into_config(v, me.clone())?;
            config.trace = caller.trace().cloned();
            let kept = core.push.set(&task_id, config)?;
            Ok(render(&kept))
        }
        Method::PushGet => {
            let configs = core.push.list(&task_id);
            let found = match &config_id {
                Some(id) => configs.into_iter().find(|c| &c.id == id),
                None => configs.into_iter().next(),
            };
            found
                .map(|c| render(&c))
                .ok_or_else(|| missing(config_id.as_deref().unwrap_or("")))
        }
        Method::PushList => {
            let configs: Vec<Value> = core.push.list(&task_id).iter().map(render).collect();
            Ok(match v {
                Version::V1 => json!({ "configs": configs, "nextPageToken": "" }),
                Version::V03 => Value::Array(configs),
            })
        }
        _ => {
            let id =
                config_id.ok_or_else(|| A2aError::invalid_params("the config id is missing"))?;
            let config = core
                .push
                .list(&task_id)
                .into_iter()
                .find(|c| c.id == id)
                .ok_or_else(|| missing(&id))?;
            // Its setter, or a system principal, deletes it; the task's other controllers see
            // it (without its secrets) but leave it.
            if !config.is_of(me.as_ref()) && !caller.is_system() {
                return Err(A2aError::forbidden(format!(
                    "push notification config {id:?} of task {task_id} was set by another principal"
                )));
            }
            if !core.push.delete(&task_id, &id) {
                return Err(missing(&id));
            }
            Ok(match v {
                Version::V1 => json!({}),
                Version::V03 => Value::Null,
            })
        }
    }
}

async fn send(
    core: &Core,
    caller: &Caller,
    target: &Target,
    v: Version,
    raw: &RawValue,
) -> Result<Value, A2aError> {
    let p: SendParams = params(raw)?;
    let push = push_of(&p, v, caller)?;
    let config = p.configuration.clone().unwrap_or_default();
    let message = p.message.into_message().map_err(A2aError::invalid_params)?;
    let blocking = config.blocking();
    let (id, _first, watcher) = core
        .send(caller, target, message, p.metadata, push, blocking)
        .await?;
    if let Some(mut watcher) = watcher {
        let waited = tokio::time::timeout(BLOCKING_WAIT, async {
            while let Some(s) = watcher.recv().await {
                if s.record.state.ends_stream() {
                    return Some(s.record);
                }
            }
            None
        })
        .await;
        if let Ok(Some(record)) = waited {
            let view = record.view(&id);
            return Ok(wire::direct_answer(v, &view, record.message_only)
                .unwrap_or_else(|| wire::task_result(v, &view, config.history_length)));
        }
    }
    let record = core.task(caller, target, &id).await?;
    let view = record.view(&id);
    Ok(wire::direct_answer(v, &view, record.message_only)
        .unwrap_or_else(|| wire::task_result(v, &view, config.history_length)))
}

async fn stream(
    core: &Core,
    caller: &Caller,
    target: &Target,
    v: Version,
    id: Box<RawValue>,
    raw: &RawValue,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<Response, A2aError> {
    let p: SendParams = params(raw)?;
    let push = push_of(&p, v, caller)?;
    let history_length = p.configuration.as_ref().and_then(|c| c.history_length);
    let message = p.message.into_message().map_err(A2aError::invalid_params)?;
    let (task_id, first, watcher) = core
        .send(caller, target, message, p.metadata, push, true)
        .await?;
    let watcher = watcher.ok_or_else(|| A2aError::internal("no watcher"))?;
    Ok(sse::respond(sse::Stream {
        id,
        version: v,
        task_id,
        first,
        watcher,
        history_length,
        shutdown,
        until_terminal: false,
    }))
}

async fn subscribe(
    core: &Core,
    caller: &Caller,
    target: &Target,
    v: Version,
    id: Box<RawValue>,
    raw: &RawValue,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<Response, A2aError> {
    let p: TaskIdParams = params(raw)?;
    caller.require(Capability::CanListTasks)?;
    // NB: watch first, then read: every change after the read reaches the watcher.
    let watcher = core.feed.watch(&p.id);
    let first = core.task(caller, target, &p.id).await?;
    if first.state.is_terminal() {
        return Err(A2aError::unsupported(format!(
            "task {} is {}: there is nothing to subscribe to (use GetTask)",
            p.id,
            first.state.v03_name()
        )));
    }
    Ok(sse::respond(sse::Stream {
        id,
        version: v,
        task_id: p.id,
        first,
        watcher,
        history_length: p.history_length,
        shutdown,
        until_terminal: true,
    }))
}

async fn get(
    core: &Core,
    caller: &Caller,
    target: &Target,
    v: Version,
    raw: &RawValue,
) -> Result<Value, A2aError> {
    let p: TaskIdParams = params(raw)?;
    let record = core.task(caller, target, &p.id).await?;
    Ok(wire::task_json(v, &record.view(&p.id), p.history_length))
}

async fn cancel(
    core: &Core,
    caller: &Caller,
    target: &Target,
    v: Version,
    raw: &RawValue,
) -> Result<Value, A2aError> {
    let p: TaskIdParams = params(raw)?;
    let record = core.cancel(caller, target, &p.id).await?;
    Ok(wire::task_json(v, &record.view(&p.id), p.history_length))
}

/// Most tasks per `ListTasks` page.
pub const MAX_PAGE: u32 = 100;
/// Tasks per page when the caller does not say.
pub const DEFAULT_PAGE: u32 = 50;

async fn list(
    core: &Core,
    caller: &Caller,
    target: &Target,
    v: Version,
    raw: &RawValue,
) -> Result<Value, A2aError> {
    let p: ListParams = params(raw)?;
    caller.require(Capability::CanListTasks)?;
    let state = match p.status.as_deref() {
        // NB: `@a2a-js/sdk` 1.3.0 sends `"UNRECOGNIZED"` for `listTasks({})` (its toJSON maps
        // an absent status through its enum), so that means "any state" as well.
        None | Some("") | Some("TASK_STATE_UNSPECIFIED") | Some("UNRECOGNIZED") => None,
        Some(s) => Some(
            TaskState::parse(s)
                .ok_or_else(|| A2aError::invalid_params(format!("unknown task state {s:?}")))?,
        ),
    };
    let size = p.page_size.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE);
    let (tasks, next) = core
        .list(
            caller,
            target,
            p.context_id.as_deref().filter(|c| !c.is_empty()),
            state,
            size,
            p.page_token.as_deref().filter(|t| !t.is_empty()),
        )
        .await?;
    let include_artifacts = p.include_artifacts.unwrap_or(true);
    let rendered: Vec<Value> = tasks
        .iter()
        .map(|t| {
            let mut j = wire::task_json(v, t, p.history_length);
            if !include_artifacts {
                j["artifacts"] = json!([]);
            }
            j
        })
        .collect();
    Ok(json!({
        "tasks": rendered,
        "nextPageToken": next.unwrap_or_default(),
        "pageSize": size,
        "totalSize": tasks.len(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(body: &str) -> i32 {
        read(body.as_bytes(), 64).unwrap_err().1.code
    }

    #[test]
    fn envelopes_are_checked() {
        use crate::gateway::a2a::error::code::*;
        assert_eq!(code("{"), PARSE_ERROR);
        assert_eq!(code("[]"), INVALID_REQUEST);
        assert_eq!(code("3"), INVALID_REQUEST);
        // No id: the real error (GetTask without its task id: bad params), else -32600.
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","method":"GetTask"}"#),
            INVALID_PARAMS
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","method":"GetTask","params":{"id":"t"}}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":{},"method":"GetTask"}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            code(r#"{"jsonrpc":"1.0","id":1,"method":"GetTask"}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":7}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"Nope"}"#),
            METHOD_NOT_FOUND
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":[1]}"#),
            INVALID_PARAMS
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1e400,"method":"GetTask"}"#),
            INVALID_REQUEST
        );
        assert!(
            read(br#"{"jsonrpc":"2.0","id":1e400,"method":"GetTask"}"#, 64)
                .unwrap_err()
                .0
                .is_none()
        );
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        let body =
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{{"x":{deep}}}}}"#);
        let (id, e) = read(body.as_bytes(), 64).unwrap_err();
        assert!(id.is_none() && e.code == INVALID_REQUEST && e.message.contains("64"));
        let long = "m".repeat(1 << 20);
        let (_, e) = read(
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{long}"}}"#).as_bytes(),
            64,
        )
        .unwrap_err();
        assert_eq!(e.code, METHOD_NOT_FOUND);
        assert!(e.message.len() < 200, "{} bytes", e.message.len());
        let ok = read(br#"{"jsonrpc":"2.0","id":"a","method":"tasks/get"}"#, 64).unwrap();
        assert_eq!((ok.method, ok.version), (Method::Get, Version::V03));
        assert_eq!(ok.params.get(), "{}");
    }

    #[test]
    fn the_two_method_sets_never_collide() {
        let mut names: Vec<&str> = METHODS.iter().map(|(n, _, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), METHODS.len());
    }
}
