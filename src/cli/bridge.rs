//! `map-router agent -- <cmd>`: a program that speaks MAP as NDJSON on its stdin/stdout, bridged
//! to the router over one WebSocket (`ws://` or `wss://`, trusting `--ca-file` as every command).
//!
//! - Lines from the program become text frames; frames from the router become lines. Lines are
//!   forwarded as they are (the router answers garbage with JSON-RPC errors itself), except that
//!   `--name` / `--role` fill in `name` / `role` of `map/connect` and `map/agents/register`
//!   when the program leaves them out, and `--token` / `--api-key` fill in `auth` of
//!   `map/connect`.
//! - The program's stderr is ours. Its environment gets `MAP_ROUTER_URL`, and
//!   `MAP_ROUTER_CA_FILE`, `MAP_AGENT_NAME` / `MAP_AGENT_ROLE` when given.
//! - The two directions run independently, so neither side's slowness can stall the other.
//! - When the program exits: its last lines are flushed (bounded), the WebSocket is closed, and
//!   the command exits with the program's exit code (128 + signal when killed by a signal).
//! - When the router closes the connection: the program's stdin is closed, it gets
//!   [`EXIT_GRACE`] to exit, then it is killed. Ctrl-C does the same.

use std::collections::HashMap;
use std::process::{ExitCode, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::process::Child;
use tokio::sync::oneshot;
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::cli::common::connect_failure;
use crate::cli::common::{Failure, UrlArgs};
use crate::client::transport::{Link, WsEndpoint, MAX_INBOUND_FRAME};
use crate::transport::connection::InFrame;
use crate::transport::ndjson::NdjsonCodec;

/// `map-router agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// Agent name: exported as MAP_AGENT_NAME and filled into `map/connect` and
    /// `map/agents/register` when the program leaves `name` out.
    #[arg(long)]
    name: Option<String>,
    /// Agent role: exported as MAP_AGENT_ROLE and filled into `map/agents/register` when the
    /// program leaves `role` out.
    #[arg(long)]
    role: Option<String>,
    /// The program and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// How long the program gets to exit after its stdin is closed, before it is killed.
pub const EXIT_GRACE: Duration = Duration::from_secs(5);
/// How long the program's last lines get to reach the router after it exited.
const FLUSH_GRACE: Duration = Duration::from_secs(1);

/// What the bridge adds to the program's `map/connect` and `map/agents/register` when the
/// program leaves it out: `participantType: "agent"` (a program run as an agent is one), the
/// `--name` / `--role` given on the command line, and the CLI's credentials.
///
/// The line is edited by splicing the missing members into the text of its `params` object:
/// everything the program wrote (key order, number spelling, whitespace, its metadata) reaches
/// the router byte for byte.
#[derive(Debug, Clone, Default)]
struct Patch {
    name: Option<String>,
    role: Option<String>,
    auth: Option<Value>,
}

/// The envelope members [`Patch`] reads; `params` is kept as the text it is.
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    method: Option<std::borrow::Cow<'a, str>>,
    /// `Some` also for `null` (a plain `Option` would read `null` as absent).
    #[serde(borrow, default, deserialize_with = "present")]
    params: Option<&'a serde_json::value::RawValue>,
}

fn present<'de, D>(d: D) -> Result<Option<&'de serde_json::value::RawValue>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    <&serde_json::value::RawValue as serde::Deserialize>::deserialize(d).map(Some)
}

impl Patch {
    /// The members to add to a request's params, given the keys it already has.
    fn additions(&self, method: &str, has: &dyn Fn(&str) -> bool) -> Vec<(&'static str, Value)> {
        let mut add = Vec::new();
        let mut fill = |key: &'static str, value: Option<Value>| {
            if let Some(value) = value {
                if !has(key) {
                    add.push((key, value));
                }
            }
        };
        let text = |v: &Option<String>| v.clone().map(Value::String);
        match method {
            "map/connect" => {
                fill("participantType", Some(Value::String("agent".into())));
                fill("name", text(&self.name));
                fill("auth", self.auth.clone());
            }
            "map/agents/register" => {
                fill("name", text(&self.name));
                fill("role", text(&self.role));
            }
            _ => {}
        }
        add
    }

    /// The line to forward: `line` itself, or `line` with the missing members spliced in.
    fn apply(&self, line: String) -> String {
        // Cheap test first (it also matches an escaped `map\/connect`).
        if !line.contains("connect") && !line.contains("register") {
            return line;
        }
        let Ok(head) = serde_json::from_str::<Head<'_>>(&line) else {
            return line;
        };
        let Some(method) = head.method.as_deref() else {
            return line;
        };
        let params = head.params.map(|p| (p.get(), offset_in(&line, p.get())));
        let keys: Option<serde_json::Map<String, Value>> = match params {
            Some((text, _)) => match serde_json::from_str(text) {
                Ok(map) => Some(map),
                // `params: null` is treated as absent; an array is left alone.
                Err(_) if text == "null" => None,
                Err(_) => return line,
            },
            None => None,
        };
        let has = |k: &str| keys.as_ref().is_some_and(|m| m.contains_key(k));
        let add = self.additions(method, &has);
        if add.is_empty() {
            return line;
        }
        let members: Vec<String> = add
            .iter()
            .map(|(k, v)| format!("{}:{v}", Value::String((*k).to_owned())))
            .collect();
        let members = members.join(",");
        match (params, keys.is_some()) {
            (Some((text, start)), true) => {
                // After the object's `{`; a comma when it had members already.
                let brace = start + text.find('{').unwrap_or(0) + 1;
                let empty = keys.as_ref().is_some_and(serde_json::Map::is_empty);
                let sep = if empty { "" } else { "," };
                format!("{}{members}{sep}{}", &line[..brace], &line[brace..])
            }
            (Some((text, start)), false) => {
                // `params: null`.
                let end = start + text.len();
                format!("{}{{{members}}}{}", &line[..start], &line[end..])
            }
            (None, _) => {
                // No params: add them before the envelope's closing brace.
                let Some(close) = line.rfind('}') else {
                    return line;
                };
                format!(
                    "{},\"params\":{{{members}}}{}",
                    &line[..close],
                    &line[close..]
                )
            }
        }
    }
}

/// Where `part` (a slice of `whole`) starts in `whole`.
fn offset_in(whole: &str, part: &str) -> usize {
    part.as_ptr() as usize - whole.as_ptr() as usize
}

/// Why the router → program direction ended.
enum Downstream {
    /// The router closed the connection (or it failed).
    RouterClosed(String),
    /// We asked it to stop.
    Stopped,
}

/// The id of the `map/disconnect` the bridge sends for a program that ended without one. Its
/// answer is the bridge's, not the program's.
const DISCONNECT_ID: &str = "\"map-router-agent:disconnect\"";

/// How long a connected program may go without registering an agent before the bridge says
/// so on stderr (it receives no messages until it does).
pub const REGISTER_WARNING: Duration = Duration::from_secs(10);

/// What the bridge knows of the program's session, from the lines it forwards both ways.
#[derive(Debug, Default)]
struct Session {
    /// Ids (as raw JSON text) of the program's connect / register / disconnect requests not
    /// yet answered, with their methods.
    pending: HashMap<String, String>,
    /// `map/connect` succeeded.
    connected: bool,
    /// An agent was registered.
    registered: bool,
    /// The program sent `map/disconnect` itself.
    disconnected: bool,
}

#[derive(serde::Deserialize)]
struct Frame<'a> {
    #[serde(borrow)]
    id: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    result: Option<&'a serde_json::value::RawValue>,
    error: Option<Value>,
}

/// The methods whose answers the bridge watches.
const WATCHED: [&str; 3] = ["map/connect", "map/agents/register", "map/disconnect"];

impl Session {
    /// A line from the program.
    fn sent(&mut self, line: &str) {
        // Cheap test first (it also matches escaped slashes).
        if !["connect", "register"].iter().any(|m| line.contains(m)) {
            return;
        }
        let Ok(f) = serde_json::from_str::<Frame<'_>>(line) else {
            return;
        };
        let (Some(id), Some(method)) = (f.id, f.method) else {
            return;
        };
        if WATCHED.contains(&method.as_ref()) {
            if method == "map/disconnect" {
                self.disconnected = true;
            }
            self.pending
                .insert(id.get().to_owned(), method.into_owned());
        }
    }

    /// A frame from the router. Returns what to say on stderr about it, if anything, and
    /// whether the frame is the program's (false: the answer to the bridge's own request).
    fn received(&mut self, frame: &str) -> (Option<String>, bool) {
        if self.pending.is_empty() && !frame.contains(DISCONNECT_ID) {
            return (None, true);
        }
        let Ok(f) = serde_json::from_str::<Frame<'_>>(frame) else {
            return (None, true);
        };
        let Some(id) = f.id.filter(|_| f.method.is_none()) else {
            return (None, true);
        };
        if id.get() == DISCONNECT_ID {
            return (None, false);
        }
        let Some(method) = self.pending.remove(id.get()) else {
            return (None, true);
        };
        if let Some(error) = f.error {
            let code = error.get("code").map(Value::to_string).unwrap_or_default();
            let message = error.get("message").and_then(Value::as_str).unwrap_or("");
            return (Some(format!("{method} failed: {code} {message}")), true);
        }
        let auth_required = f
            .result
            .is_some_and(|r| r.get().contains("\"authRequired\""));
        match method.as_str() {
            "map/connect" if auth_required => {
                return (
                    Some(
                        "the router requires authentication: pass --api-key KEY or --token JWT \
                         (or set MAP_ROUTER_API_KEY / MAP_ROUTER_TOKEN)"
                            .into(),
                    ),
                    true,
                );
            }
            "map/connect" => self.connected = true,
            "map/agents/register" => self.registered = true,
            _ => {}
        }
        (None, true)
    }

    /// Whether the bridge must end the session for the program: it connected and did not
    /// disconnect, so its agents would otherwise stay orphaned for the resume window.
    fn needs_disconnect(&self) -> bool {
        self.connected && !self.disconnected
    }
}

use crate::sync::lock;

pub async fn run(args: AgentArgs) -> Result<ExitCode, Failure> {
    let url = args.url.url.clone();
    let endpoint = WsEndpoint::new(&url, args.url.ca_file.as_deref()).map_err(connect_failure)?;
    let Link {
        stream: mut from_router,
        sink: mut to_router,
        ..
    } = endpoint.connect().await.map_err(connect_failure)?;

    let program = args.command[0].clone();
    let mut cmd = tokio::process::Command::new(&program);
    cmd.args(&args.command[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .env("MAP_ROUTER_URL", &url)
        .kill_on_drop(true);
    if let Some(ca_file) = &args.url.ca_file {
        cmd.env("MAP_ROUTER_CA_FILE", ca_file);
    }
    if let Some(name) = &args.name {
        cmd.env("MAP_AGENT_NAME", name);
    }
    if let Some(role) = &args.role {
        cmd.env("MAP_AGENT_ROLE", role);
    }
    let mut child = cmd.spawn().map_err(|e| Failure {
        what: format!("cannot start `{program}`"),
        error: e.to_string(),
    })?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(Failure {
            what: format!("cannot start `{program}`"),
            error: "no piped stdin/stdout".into(),
        });
    };
    let patch = Patch {
        name: args.name,
        role: args.role,
        auth: args
            .url
            .credentials()
            .and_then(|c| serde_json::to_value(c).ok()),
    };
    let session = Arc::new(Mutex::new(Session::default()));

    // Program → router. Ends at the program's EOF or when the router is gone. At the program's
    // EOF it ends the program's session (unless the program did), so that its agents are
    // unregistered rather than orphaned, then closes the WebSocket.
    let upstream = {
        let session = session.clone();
        let program = program.clone();
        async move {
            let mut lines = FramedRead::new(stdout, NdjsonCodec::new(MAX_INBOUND_FRAME));
            while let Some(frame) = lines.next().await {
                match frame {
                    Ok(InFrame::Text(line)) => {
                        let line = patch.apply(line);
                        lock(&session).sent(&line);
                        if to_router.send(line).await.is_err() {
                            return;
                        }
                    }
                    Ok(InFrame::TooLarge { len }) => {
                        eprintln!(
                            "map-router: agent: dropped a {len}-byte line from `{program}` (too long)"
                        );
                    }
                    Ok(_) => eprintln!(
                        "map-router: agent: dropped a line from `{program}` that is not UTF-8"
                    ),
                    Err(_) => break,
                }
            }
            if lock(&session).needs_disconnect() {
                let disconnect = format!(
                    r#"{{"jsonrpc":"2.0","id":{DISCONNECT_ID},"method":"map/disconnect","params":{{"reason":"the program ended"}}}}"#
                );
                let _ = tokio::time::timeout(FLUSH_GRACE, to_router.send(disconnect)).await;
            }
            let _ = tokio::time::timeout(FLUSH_GRACE, to_router.close()).await;
        }
    };

    // Router → program. Dropping the writer (when this ends) closes the program's stdin.
    let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
    let downstream = {
        let session = session.clone();
        let program = program.clone();
        async move {
            let mut child_in = Some(FramedWrite::new(stdin, NdjsonCodec::new(MAX_INBOUND_FRAME)));
            loop {
                let frame = tokio::select! {
                    _ = &mut stop_rx => return Downstream::Stopped,
                    frame = from_router.next() => frame,
                };
                match frame {
                    Some(Ok(text)) => {
                        let (note, forward) = lock(&session).received(&text);
                        if let Some(note) = note {
                            eprintln!("map-router: agent: `{program}`: {note}");
                        }
                        if !forward {
                            continue;
                        }
                        if let Some(w) = child_in.as_mut() {
                            if w.send(text).await.is_err() {
                                // The program closed its stdin; keep reading so the router is
                                // not stalled, and discard.
                                child_in = None;
                            }
                        }
                    }
                    Some(Err(e)) => return Downstream::RouterClosed(e.to_string()),
                    None => {
                        return Downstream::RouterClosed("the router closed the connection".into())
                    }
                }
            }
        }
    };

    tokio::pin!(upstream, downstream);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let register_warning = tokio::time::sleep(REGISTER_WARNING);
    tokio::pin!(register_warning);
    let mut warned = false;
    let mut upstream_done = false;
    let mut stop_tx = Some(stop_tx);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.ok(),
            () = &mut upstream, if !upstream_done => {
                // The program closed its stdout: it has nothing more to say. Wait for it.
                upstream_done = true;
            }
            why = &mut downstream => {
                if let Downstream::RouterClosed(reason) = why {
                    eprintln!("map-router: agent: {reason}; closing `{program}`'s stdin");
                }
                break wind_down(&mut child).await;
            }
            () = &mut register_warning, if !warned => {
                warned = true;
                let s = lock(&session);
                if !s.registered {
                    let state = if s.connected { "is connected but has" } else { "has not connected and" };
                    eprintln!(
                        "map-router: agent: `{program}` {state} not registered an agent after {}s \
                         (map/agents/register): it receives no messages",
                        REGISTER_WARNING.as_secs()
                    );
                }
            }
            _ = &mut interrupted => {
                if let Some(tx) = stop_tx.take() {
                    let _ = tx.send(());
                }
                // Dropping the downstream half closes the program's stdin.
                let _ = tokio::time::timeout(FLUSH_GRACE, &mut downstream).await;
                break wind_down(&mut child).await;
            }
        }
    };
    // Let its last words (and the bridge's map/disconnect) reach the router, then close.
    if !upstream_done {
        let _ = tokio::time::timeout(FLUSH_GRACE * 2, &mut upstream).await;
    }
    Ok(exit_code(status))
}

/// Waits (bounded) for the program to exit once its stdin is closed, then kills it.
async fn wind_down(child: &mut Child) -> Option<ExitStatus> {
    match tokio::time::timeout(EXIT_GRACE, child.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            eprintln!(
                "map-router: agent: the program did not exit within {EXIT_GRACE:?}; killing it"
            );
            let _ = child.kill().await;
            child.wait().await.ok()
        }
    }
}

fn exit_code(status: Option<ExitStatus>) -> ExitCode {
    let Some(status) = status else {
        return ExitCode::FAILURE;
    };
    if let Some(code) = status.code() {
        return ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1));
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        if let Some(sig) = status.signal() {
            return ExitCode::from(u8::try_from(128 + (sig & 0x7f)).unwrap_or(1));
        }
    }
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn missing_members_are_spliced_in_and_the_rest_kept_byte_for_byte() {
        let p = Patch {
            name: Some("n".into()),
            role: Some("r".into()),
            auth: Some(json!({"method": "api-key", "credential": "k"})),
        };
        let connect = r#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{ "protocolVersion":1.0 ,"z":{"b":1,"a":2}}}"#;
        assert_eq!(
            p.apply(connect.into()),
            r#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"participantType":"agent","name":"n","auth":{"credential":"k","method":"api-key"}, "protocolVersion":1.0 ,"z":{"b":1,"a":2}}}"#
        );
        // What the program set is kept; only the rest is added.
        let reg = r#"{"jsonrpc":"2.0","id":2,"method":"map/agents/register","params":{"name":"mine","metadata":{"y":1,"x":[1e2]}}}"#;
        assert_eq!(
            p.apply(reg.into()),
            r#"{"jsonrpc":"2.0","id":2,"method":"map/agents/register","params":{"role":"r","name":"mine","metadata":{"y":1,"x":[1e2]}}}"#
        );
        let other = r#"{"jsonrpc":"2.0","id":3,"method":"map/send","params":{"to":"map/connect"}}"#;
        assert_eq!(p.apply(other.into()), other);
        assert_eq!(p.apply("garbage map/connect".into()), "garbage map/connect");
    }

    #[test]
    fn a_connect_without_participant_type_becomes_an_agent() {
        let p = Patch::default();
        // No params at all (the README's stdio line).
        assert_eq!(
            p.apply(r#"{"jsonrpc":"2.0","id":1,"method":"map/connect"}"#.into()),
            r#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"participantType":"agent"}}"#
        );
        assert_eq!(
            p.apply(r#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{}}"#.into()),
            r#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"participantType":"agent"}}"#
        );
        assert_eq!(
            p.apply(r#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":null}"#.into()),
            r#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"participantType":"agent"}}"#
        );
        // A program that says what it is keeps it.
        let client = r#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"participantType":"client"}}"#;
        assert_eq!(p.apply(client.into()), client);
        // An escaped method name is still read.
        let escaped = r#"{"jsonrpc":"2.0","id":1,"method":"map\/connect","params":{}}"#;
        assert_eq!(
            p.apply(escaped.into()),
            r#"{"jsonrpc":"2.0","id":1,"method":"map\/connect","params":{"participantType":"agent"}}"#
        );
    }

    #[test]
    fn the_session_is_followed_from_both_directions() {
        let mut s = Session::default();
        s.sent(r#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{}}"#);
        s.sent(r#"{"jsonrpc":"2.0","id":"r","method":"map/agents/register","params":{}}"#);
        assert!(!s.needs_disconnect());
        assert_eq!(
            s.received(r#"{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}}"#),
            (None, true)
        );
        assert!(s.connected && s.needs_disconnect());
        let (note, forward) = s.received(
            r#"{"jsonrpc":"2.0","id":"r","error":{"code":1003,"message":"Permission denied: lifecycle.canRegister"}}"#,
        );
        assert_eq!(
            note.as_deref(),
            Some("map/agents/register failed: 1003 Permission denied: lifecycle.canRegister")
        );
        assert!(forward && !s.registered);
        // The answer to the bridge's own disconnect is not the program's.
        let own = format!(r#"{{"jsonrpc":"2.0","id":{DISCONNECT_ID},"result":{{}}}}"#);
        assert_eq!(s.received(&own), (None, false));
        s.sent(r#"{"jsonrpc":"2.0","id":9,"method":"map/disconnect"}"#);
        assert!(!s.needs_disconnect());
        // authRequired is explained with the CLI's flags.
        let mut a = Session::default();
        a.sent(r#"{"jsonrpc":"2.0","id":1,"method":"map/connect"}"#);
        let (note, _) = a.received(
            r#"{"jsonrpc":"2.0","id":1,"result":{"authRequired":{"methods":["api-key"]}}}"#,
        );
        assert!(note.unwrap().contains("--api-key"));
        assert!(!a.connected);
    }
}
