//! The built binary over real pipes (`map-router stdio`): NDJSON in and out, with malformed,
//! oversized and half-written lines and a flood of lines. The session survives every bad line
//! and answers each one correctly; stdout carries frames only; EOF is a clean disconnect.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{with_timeout, within};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

struct Router {
    child: Child,
    stdin: ChildStdin,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Router {
    async fn start(extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_map-router"))
            .arg("stdio")
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("binary starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            stdin,
            stdout,
        }
    }

    async fn write(&mut self, bytes: &[u8]) {
        with_timeout(self.stdin.write_all(bytes)).await.unwrap();
        with_timeout(self.stdin.flush()).await.unwrap();
    }

    async fn line(&mut self) -> Value {
        let line = with_timeout(self.stdout.next_line())
            .await
            .unwrap()
            .expect("a line before EOF");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {line}"))
    }

    async fn call(&mut self, id: u64, method: &str, params: Value) -> Value {
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.write(format!("{frame}\n").as_bytes()).await;
        let reply = self.line().await;
        assert_eq!(reply["id"], json!(id), "{reply}");
        reply
    }
}

fn error_code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error: {v}"))
}

#[tokio::test]
async fn bad_lines_are_answered_and_the_session_continues() {
    let mut r = Router::start(&["--max-frame-bytes", "4096"]).await;
    let connected = r
        .call(1, "map/connect", json!({"participantType": "agent"}))
        .await;
    assert_eq!(connected["result"]["protocolVersion"], json!(1));

    // Malformed JSON: -32700 with id null.
    r.write(b"{this is not json}\n").await;
    let err = r.line().await;
    assert_eq!(error_code(&err), -32700);
    assert_eq!(err["id"], Value::Null);

    // Valid JSON that is not a request: -32600.
    r.write(b"42\n").await;
    assert_eq!(error_code(&r.line().await), -32600);

    // Invalid UTF-8: -32700.
    r.write(b"\xff\xfe\xfd\n").await;
    assert_eq!(error_code(&r.line().await), -32700);

    // An oversized line is discarded to its newline and answered -32600; the next line is fine.
    let mut big = vec![b'x'; 10_000];
    big.push(b'\n');
    r.write(&big).await;
    let err = r.line().await;
    assert_eq!(error_code(&err), -32600);
    assert!(
        err["error"]["data"]["details"]["reason"]
            .as_str()
            .unwrap()
            .contains("exceeds the limit of 4096"),
        "{err}"
    );

    // Blank lines and CRLF are tolerated.
    r.write(b"\n\r\n   \n").await;
    let reg = r
        .call(2, "map/agents/register", json!({"name": "piped"}))
        .await;
    assert_eq!(reg["result"]["agent"]["name"], json!("piped"));

    // A half-written line waits for its end.
    r.write(br#"{"jsonrpc":"2.0","id":3,"method":"map/ag"#)
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    r.write(b"ents/list\"}\n").await;
    let list = r.line().await;
    assert_eq!(list["id"], json!(3));
    assert_eq!(list["result"]["agents"][0]["name"], json!("piped"));

    // Unknown methods and bad params keep their ids.
    assert_eq!(error_code(&r.call(4, "map/nope", json!({})).await), -32601);
    assert_eq!(
        error_code(&r.call(5, "map/agents/get", json!({"agentId": 7})).await),
        -32602
    );
}

#[tokio::test]
async fn a_flood_of_lines_is_answered_in_order() {
    let mut r = Router::start(&[]).await;
    r.call(1, "map/connect", json!({})).await;
    const N: u64 = 2000;
    let mut flood = String::new();
    for id in 10..10 + N {
        flood.push_str(&format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"map/agents/list\"}}\n"
        ));
        if id % 100 == 0 {
            flood.push_str("garbage\n");
        }
    }
    // Write and read concurrently: the router may apply back-pressure to a writer that reads
    // nothing, which is the point of its bounded outbox.
    let Router {
        mut stdin,
        mut stdout,
        child,
    } = r;
    let writer = tokio::spawn(async move {
        stdin.write_all(flood.as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
        stdin
    });
    let mut next_id = 10;
    let mut errors = 0;
    within(Duration::from_secs(30), async {
        while next_id < 10 + N {
            let line = stdout.next_line().await.unwrap().expect("line");
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"].is_null() {
                assert_eq!(v["error"]["code"], json!(-32700));
                errors += 1;
            } else {
                assert_eq!(v["id"], json!(next_id), "responses in request order");
                assert!(v["result"]["agents"].is_array());
                next_id += 1;
            }
        }
    })
    .await;
    let garbage = (10..10 + N).filter(|id| id % 100 == 0).count();
    assert_eq!(errors, garbage, "every garbage line answered");
    let stdin = with_timeout(writer).await.unwrap();
    drop(stdin);
    drop(child);
}

#[tokio::test]
async fn eof_is_a_clean_disconnect_and_the_process_exits() {
    let mut r = Router::start(&[]).await;
    r.call(1, "map/connect", json!({"participantType": "agent"}))
        .await;
    // A final line without a newline is still handled at EOF.
    r.write(br#"{"jsonrpc":"2.0","id":2,"method":"map/agents/list"}"#)
        .await;
    let Router {
        stdin,
        mut stdout,
        mut child,
    } = r;
    drop(stdin);
    let line = with_timeout(stdout.next_line()).await.unwrap().unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["id"], json!(2));
    assert_eq!(with_timeout(stdout.next_line()).await.unwrap(), None, "EOF");
    let status = with_timeout(child.wait()).await.unwrap();
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn stdio_mode_can_also_listen_on_websocket() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_map-router"))
        .args(["stdio", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = with_timeout(async {
        loop {
            let line = stderr.next_line().await.unwrap().expect("listening line");
            if let Some(url) = line.strip_prefix("map-router listening on ") {
                return url.to_owned();
            }
        }
    })
    .await;
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"map/connect\",\"params\":{\"participantType\":\"agent\"}}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"map/agents/register\",\"params\":{\"agentId\":\"over-pipes\"}}\n")
        .await
        .unwrap();
    for _ in 0..2 {
        with_timeout(stdout.next_line()).await.unwrap().unwrap();
    }
    // A WebSocket client sees the agent that registered over the pipes, and can message it.
    let mut ws = common::WsClient::client(&url).await;
    let list = ws.ok("map/agents/list", Value::Null).await;
    assert_eq!(common::ids(&list["agents"]), vec!["over-pipes"]);
    let sent = ws
        .send(json!({"agent": "over-pipes"}), json!({"hi": 1}))
        .await;
    assert_eq!(sent["delivered"], json!(["over-pipes"]));
    let msg: Value =
        serde_json::from_str(&with_timeout(stdout.next_line()).await.unwrap().unwrap()).unwrap();
    assert_eq!(msg["method"], json!("map/message"));
    assert_eq!(msg["params"]["message"]["payload"], json!({"hi": 1}));
}
