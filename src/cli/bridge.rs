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

use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::process::Child;
use tokio::sync::oneshot;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::{connect_failure, AgentArgs, Failure};
use crate::client::transport::{Link, WsEndpoint, MAX_INBOUND_FRAME};
use crate::transport::connection::InFrame;
use crate::transport::ndjson::NdjsonCodec;

/// How long the program gets to exit after its stdin is closed, before it is killed.
pub const EXIT_GRACE: Duration = Duration::from_secs(5);
/// How long the program's last lines get to reach the router after it exited.
const FLUSH_GRACE: Duration = Duration::from_secs(1);

/// Fills in `name` / `role` the program left out.
#[derive(Debug, Clone, Default)]
struct Patch {
    name: Option<String>,
    role: Option<String>,
    auth: Option<Value>,
}

impl Patch {
    fn apply(&self, line: String) -> String {
        if self.name.is_none() && self.role.is_none() && self.auth.is_none() {
            return line;
        }
        if !line.contains("map/connect") && !line.contains("map/agents/register") {
            return line;
        }
        let Ok(mut v) = serde_json::from_str::<Value>(&line) else {
            return line;
        };
        let is_connect = v.get("method").and_then(Value::as_str) == Some("map/connect");
        let fill: &[(&str, &Option<String>)] = match v.get("method").and_then(Value::as_str) {
            Some("map/connect") => &[("name", &self.name)],
            Some("map/agents/register") => &[("name", &self.name), ("role", &self.role)],
            _ => return line,
        };
        let Some(obj) = v.as_object_mut() else {
            return line;
        };
        let params = obj
            .entry("params")
            .or_insert_with(|| Value::Object(Default::default()));
        if params.is_null() {
            *params = Value::Object(Default::default());
        }
        let Some(params) = params.as_object_mut() else {
            return line;
        };
        for (key, value) in fill {
            if let Some(value) = value {
                params
                    .entry(*key)
                    .or_insert_with(|| Value::String(value.clone()));
            }
        }
        if let (Some(auth), true) = (&self.auth, is_connect) {
            params.entry("auth").or_insert_with(|| auth.clone());
        }
        v.to_string()
    }
}

/// Why the router → program direction ended.
enum Downstream {
    /// The router closed the connection (or it failed).
    RouterClosed(String),
    /// We asked it to stop.
    Stopped,
}

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

    // Program → router. Ends at the program's EOF (then closes the WebSocket) or when the
    // router is gone.
    let upstream = async move {
        let mut lines = FramedRead::new(stdout, NdjsonCodec::new(MAX_INBOUND_FRAME));
        while let Some(frame) = lines.next().await {
            match frame {
                Ok(InFrame::Text(line)) => {
                    if to_router.send(patch.apply(line)).await.is_err() {
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
        let _ = tokio::time::timeout(FLUSH_GRACE, to_router.close()).await;
    };

    // Router → program. Dropping the writer (when this ends) closes the program's stdin.
    let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
    let downstream = async move {
        let mut child_in = Some(FramedWrite::new(stdin, NdjsonCodec::new(MAX_INBOUND_FRAME)));
        loop {
            let frame = tokio::select! {
                _ = &mut stop_rx => return Downstream::Stopped,
                frame = from_router.next() => frame,
            };
            match frame {
                Some(Ok(text)) => {
                    if let Some(w) = child_in.as_mut() {
                        if w.send(text).await.is_err() {
                            // The program closed its stdin; keep reading so the router is not
                            // stalled, and discard.
                            child_in = None;
                        }
                    }
                }
                Some(Err(e)) => return Downstream::RouterClosed(e.to_string()),
                None => return Downstream::RouterClosed("the router closed the connection".into()),
            }
        }
    };

    tokio::pin!(upstream, downstream);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut upstream_done = false;
    let mut stop_tx = Some(stop_tx);
    let status = loop {
        tokio::select! {
            status = child.wait() => {
                // Let its last words reach the router, then close the WebSocket.
                if !upstream_done {
                    let _ = tokio::time::timeout(FLUSH_GRACE, &mut upstream).await;
                }
                break status.ok();
            }
            () = &mut upstream, if !upstream_done => {
                // The program closed its stdout: it has nothing more to say. Wait for it.
                upstream_done = true;
            }
            why = &mut downstream => {
                if let Downstream::RouterClosed(reason) = why {
                    eprintln!("map-router: agent: {reason}; closing `{}`'s stdin", args.command[0]);
                }
                break wind_down(&mut child).await;
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
    fn name_and_role_are_filled_in_only_when_missing() {
        let p = Patch {
            name: Some("n".into()),
            role: Some("r".into()),
            auth: Some(json!({"method": "api-key", "credential": "k"})),
        };
        let connect =
            r#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"protocolVersion":1}}"#;
        let out: Value = serde_json::from_str(&p.apply(connect.into())).unwrap();
        assert_eq!(
            out["params"],
            json!({"protocolVersion": 1, "name": "n", "auth": {"method": "api-key", "credential": "k"}})
        );
        let reg =
            r#"{"jsonrpc":"2.0","id":2,"method":"map/agents/register","params":{"name":"mine"}}"#;
        let out: Value = serde_json::from_str(&p.apply(reg.into())).unwrap();
        assert_eq!(out["params"], json!({"name": "mine", "role": "r"}));
        let other = r#"{"jsonrpc":"2.0","id":3,"method":"map/send","params":{"to":"map/connect"}}"#;
        assert_eq!(p.apply(other.into()), other);
        assert_eq!(p.apply("garbage map/connect".into()), "garbage map/connect");
    }
}
