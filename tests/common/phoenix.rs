//! A real Arize Phoenix (the OTLP receiver of the traces tests, issue 45) on 127.0.0.1, from the
//! pinned venv `scripts/setup.sh` makes (`tests/phoenix/.venv`, `tests/phoenix/requirements.txt`):
//! reserved HTTP and gRPC ports, a temporary working directory (its SQLite database), telemetry
//! and every outside request off, killed on drop (its log printed when the test panicked).
//! Owns that process and its directory; reads spans back through Phoenix's REST API and takes a
//! screenshot of its trace page with headless Chromium. When the venv is missing it fails (never
//! skips), saying to run `scripts/setup.sh`.
//!
//! Phoenix 20.26.1 binds its OTLP/gRPC listener on `[::]` whatever `PHOENIX_HOST` says; it is
//! started through `tests/phoenix/serve.py`, which binds that listener to 127.0.0.1 too.
//!
//! # What Phoenix returns
//!
//! `GET /v1/projects/default/spans?trace_id=<32 hex>&limit=<n>[&cursor=<c>]` (what
//! [`Phoenix::spans`] reads, following `next_cursor` until it is null) answers
//! `{"data": [span...], "next_cursor": null | "<cursor>"}`, each span (newest first):
//!
//! ```json
//! {
//!   "id": "U3Bhbjoy",                        // Phoenix's own id (GraphQL global id), not OTel's
//!   "name": "execute_tool search",
//!   "context": {
//!     "trace_id": "0af7651916cd43dd8448eb211c80319c",   // 32 lowercase hex
//!     "span_id": "00f067aa0ba902b7"                     // 16 lowercase hex
//!   },
//!   "span_kind": "TOOL",                     // Phoenix's (OpenInference) kind, see below
//!   "parent_id": "b7ad6b7169203331",         // 16 hex, or null for a root span
//!   "start_time": "2026-11-29T05:39:48.753118+00:00",
//!   "end_time": "2026-11-29T05:39:48.756118+00:00",
//!   "status_code": "UNSET",                  // UNSET | OK | ERROR
//!   "status_message": "",
//!   "attributes": {                          // flat, dotted keys as sent; values as sent
//!     "gen_ai.operation.name": "execute_tool",
//!     "gen_ai.tool.name": "search",
//!     "gen_ai.tool.call.id": "call-42",
//!     "tool.name": "search",                 // added by Phoenix from gen_ai.tool.name
//!     "tool.id": "call-42"                   // added by Phoenix from gen_ai.tool.call.id
//!   },
//!   "events": []
//! }
//! ```
//!
//! - The OTel span kind (CLIENT, INTERNAL...) is not returned; `span_kind` is Phoenix's
//!   classification (the OpenInference span kind), from the span's own
//!   `openinference.span.kind` attribute when it has one, else from `gen_ai.operation.name`
//!   (phoenix/trace/gen_ai/conversion.py, `_infer_span_kind`): `invoke_agent`, `create_agent` →
//!   AGENT; `execute_tool` → TOOL; `chat`, `text_completion`, `generate_content` → LLM;
//!   `embeddings` → EMBEDDING; `retrieval` → RETRIEVER; no operation but `gen_ai.tool.name` or
//!   `gen_ai.tool.call.id` → TOOL; anything else (other operations, no `gen_ai.*` attribute at
//!   all) → UNKNOWN. The REST answer does not list `openinference.span.kind` among the
//!   attributes; the UI shows it there. Phoenix also derives OpenInference attributes from
//!   `gen_ai.*` ones without overriding any the span carries: `tool.name`, `tool.id` above, and
//!   `llm.token_count.prompt` / `.completion` / `.total` from `gen_ai.usage.input_tokens` /
//!   `output_tokens` (which its UI sums per trace).
//! - OTLP/HTTP takes exactly `Content-Type: application/x-protobuf` (415 for OTLP/JSON or a
//!   content type with parameters), plain, gzip or deflate; it answers 200 before it stores the
//!   spans (a background task). Spans go to the project named by the `x-project-name` header,
//!   else by the resource attribute `openinference.project.name`, else `default` (the one
//!   [`Phoenix::spans`] reads).
//! - Resource attributes (`service.name`...) are not in the answer.
//! - A span only shows once Phoenix's bulk inserter has written it (a second or so after the
//!   export is accepted): read with [`Phoenix::wait_spans`].
//!
//! # The trace page
//!
//! `/projects/<project id>/traces/<trace id>` (`GET /v1/projects` gives the project ids:
//! `{"data": [{"name": "default", "id": "UHJvamVjdDox", ...}], ...}`), e.g.
//! `http://127.0.0.1:PORT/projects/UHJvamVjdDox/traces/0af7651916cd43dd8448eb211c80319c`: the
//! project's trace list with the trace's details open on top of it (the span tree with kind icons
//! on the left, the root span's name, kind badge and attributes on the right, including
//! `openinference.span.kind`). The list behind it holds the project's other traces, so their
//! root spans are in the page's DOM too. See [`Phoenix::screenshot`].

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::http::request;
use super::ports::reserve;
use super::TempDir;

/// How long Phoenix may take to start answering: about 8 s on an idle 2-core machine (Python
/// imports, then its database migrations), 25 s seen with two Phoenixes starting while other
/// builds ran.
pub const START_LIMIT: Duration = Duration::from_secs(90);

/// How long one headless Chromium run may take (4 s idle, 14 s seen under load).
const BROWSER_LIMIT: Duration = Duration::from_secs(60);

/// At most this many pages of spans are followed for one trace.
const MAX_PAGES: usize = 50;

/// A running `phoenix serve`, killed on drop.
pub struct Phoenix {
    child: Option<Child>,
    /// The HTTP port: UI, REST API, OTLP/HTTP at `/v1/traces`.
    pub port: u16,
    /// The OTLP/gRPC port.
    pub grpc_port: u16,
    dir: TempDir,
}

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

impl Phoenix {
    /// Starts Phoenix on two reserved ports and waits (at most [`START_LIMIT`]) until
    /// `GET /healthz` answers 200.
    pub async fn start() -> Self {
        let python = root().join("tests/phoenix/.venv/bin/python");
        assert!(
            python.exists(),
            "{} is missing: run scripts/setup.sh (it makes the Phoenix venv from \
             tests/phoenix/requirements.txt)",
            python.display()
        );
        let mut held = reserve(2);
        let port_of = |l: &TcpListener| l.local_addr().expect("a reserved port").port();
        let (port, grpc_port) = (port_of(&held[0]), port_of(&held[1]));
        let dir = TempDir::new("phoenix");
        let work = dir.path.join("work");
        std::fs::create_dir_all(&work).expect("create Phoenix's working directory");
        let log = std::fs::File::create(dir.path.join("phoenix.log")).expect("create the log");
        let mut command = Command::new(&python);
        command
            .arg(root().join("tests/phoenix/serve.py"))
            .arg("serve")
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_GRPC_PORT", grpc_port.to_string())
            .env("PHOENIX_WORKING_DIR", &work)
            // Nothing phones home: no usage telemetry, no web fonts, no sandbox download, no
            // agent assistant (nor its server-side shell), no outside requests at all.
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .env("PHOENIX_ALLOW_EXTERNAL_RESOURCES", "false")
            .env("PHOENIX_DISABLE_AGENT_ASSISTANT", "true")
            .env("PHOENIX_AGENTS_DISABLE_BASH", "true")
            .env("PHOENIX_AGENTS_DISABLE_WEB_ACCESS", "true")
            .env("PHOENIX_AGENTS_DISABLE_GITHUB", "true")
            .env("DO_NOT_TRACK", "1")
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log handle"))
            .stderr(log);
        // No inherited OTel settings: Phoenix would instrument itself and export there.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("OTEL_") {
                command.env_remove(&key);
            }
        }
        held.clear(); // release the ports just before Phoenix binds them
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start Phoenix ({}): {e}", python.display()));
        let mut phoenix = Self {
            child: Some(child),
            port,
            grpc_port,
            dir,
        };
        phoenix.wait_ready().await;
        phoenix
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("Phoenix exited at start ({status}):\n{}", self.log());
            }
            if healthy(self.addr()).await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "Phoenix did not answer /healthz within {START_LIMIT:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The HTTP address (127.0.0.1).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `http://127.0.0.1:PORT`: the base for `OTEL_EXPORTER_OTLP_ENDPOINT` (OTLP/HTTP at
    /// `/v1/traces`), the UI and the REST API.
    pub fn otlp_base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:PORT/v1/traces`: OTLP/HTTP, protobuf or JSON.
    pub fn traces_endpoint(&self) -> String {
        format!("{}/v1/traces", self.otlp_base())
    }

    /// `http://127.0.0.1:GRPC_PORT`: OTLP/gRPC.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// Phoenix's log so far (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path.join("phoenix.log")).unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// `GET path` answered 200 with JSON (panics with the answer and the log otherwise).
    pub async fn get_json(&self, path: &str) -> Value {
        let answer = request(
            self.addr(),
            "GET",
            path,
            &[("Accept", "application/json")],
            b"",
        )
        .await;
        assert_eq!(
            answer.status,
            200,
            "GET {path}: {}\n--- Phoenix log (tail) ---\n{}",
            String::from_utf8_lossy(&answer.body),
            self.log_tail(40)
        );
        answer.json()
    }

    /// POSTs an OTLP/HTTP protobuf export (`ExportTraceServiceRequest` bytes) to `/v1/traces`
    /// and returns the status.
    pub async fn export(&self, body: &[u8]) -> u16 {
        request(
            self.addr(),
            "POST",
            "/v1/traces",
            &[("Content-Type", "application/x-protobuf")],
            body,
        )
        .await
        .status
    }

    /// The id of the project named `name` (`default` for spans without
    /// `openinference.project.name`), as the UI's URLs use it.
    pub async fn project_id(&self, name: &str) -> String {
        let projects = self.get_json("/v1/projects").await;
        projects["data"]
            .as_array()
            .and_then(|all| all.iter().find(|p| p["name"] == name))
            .and_then(|p| p["id"].as_str())
            .unwrap_or_else(|| panic!("no project {name:?} in {projects}"))
            .to_owned()
    }

    /// Every span Phoenix holds for `trace_id` (32 hex) in the default project, all pages.
    pub async fn spans(&self, trace_id: &str) -> Vec<Value> {
        assert!(
            trace_id.len() == 32 && trace_id.bytes().all(|b| b.is_ascii_hexdigit()),
            "a trace id is 32 hex digits: {trace_id:?}"
        );
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut path = format!(
                "/v1/projects/default/spans?trace_id={}&limit=1000",
                trace_id.to_ascii_lowercase()
            );
            if let Some(c) = &cursor {
                path.push_str("&cursor=");
                path.push_str(&percent_encode(c));
            }
            let page = self.get_json(&path).await;
            let data = page["data"]
                .as_array()
                .unwrap_or_else(|| panic!("no data array: {page}"));
            out.extend(data.iter().cloned());
            match page["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => return out,
            }
        }
        panic!("more than {MAX_PAGES} pages of spans for trace {trace_id}");
    }

    /// Polls [`Self::spans`] until at least `at_least` spans of `trace_id` are there, for at
    /// most `limit`; panics with what it saw and the log otherwise.
    pub async fn wait_spans(&self, trace_id: &str, at_least: usize, limit: Duration) -> Vec<Value> {
        let deadline = Instant::now() + limit;
        loop {
            let spans = self.spans(trace_id).await;
            if spans.len() >= at_least {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "Phoenix holds {} span(s) of trace {trace_id} after {limit:?}, not {at_least}: \
                 {spans:#?}\n--- Phoenix log (tail) ---\n{}",
                spans.len(),
                self.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The UI's page of one trace: `http://127.0.0.1:PORT/projects/<project id>/traces/<trace id>`.
    pub async fn trace_url(&self, trace_id: &str) -> String {
        let project = self.project_id("default").await;
        format!("{}/projects/{project}/traces/{trace_id}", self.otlp_base())
    }

    /// Saves a PNG of the trace's page (1400×900) to `out`, with headless Chromium
    /// (`/usr/bin/chromium`, or `$CHROMIUM`), and returns the page's URL. Chromium runs the page
    /// on virtual time (`--virtual-time-budget`): it renders once the page's own requests and
    /// timers have run, not after a wall-clock wait. [`Self::rendered_text`] tells what that
    /// render shows.
    pub async fn screenshot(&self, trace_id: &str, out: &Path) -> String {
        self.screenshot_sized(trace_id, out, 1400, 900).await
    }

    /// [`Self::screenshot`] in a `width`×`height` window.
    pub async fn screenshot_sized(
        &self,
        trace_id: &str,
        out: &Path,
        width: u32,
        height: u32,
    ) -> String {
        let url = self.trace_url(trace_id).await;
        let mut shot = std::ffi::OsString::from("--screenshot=");
        shot.push(out);
        let size = format!("--window-size={width},{height}");
        self.chromium(&[shot, size.into(), url.clone().into()])
            .await;
        url
    }

    /// The page at `url` as Chromium renders it under the same settings as
    /// [`Self::screenshot`]: its DOM after scripts ran (`--dump-dom`).
    pub async fn rendered_text(&self, url: &str) -> String {
        self.chromium(&[
            "--dump-dom".into(),
            "--window-size=1400,900".into(),
            url.into(),
        ])
        .await
    }

    /// Runs headless Chromium with `args` after the common flags; returns its stdout.
    async fn chromium(&self, args: &[std::ffi::OsString]) -> String {
        let program = std::env::var_os("CHROMIUM").unwrap_or_else(|| "/usr/bin/chromium".into());
        let profile = self.dir.path.join("chromium");
        let mut command = tokio::process::Command::new(&program);
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-quic",
                "--virtual-time-budget=15000",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let run = tokio::time::timeout(BROWSER_LIMIT, command.output()).await;
        let output = match run {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => panic!(
                "cannot run {} ({e}): the screenshot needs Debian's chromium (scripts/setup.sh)",
                program.to_string_lossy()
            ),
            Err(_) => panic!("headless Chromium did not finish within {BROWSER_LIMIT:?}"),
        };
        assert!(
            output.status.success(),
            "headless Chromium failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

/// Percent-encodes a query value (Phoenix's cursors are base64: `+`, `/`, `=`).
fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- Phoenix log (tail, port {}) ---\n{}",
                self.port,
                self.log_tail(60)
            );
        }
    }
}

/// Whether Phoenix answers `GET /healthz` with 200. While it starts, its port can take a
/// connection and close it without an answer (CI saw that once): that is "not yet", never a
/// failure of the test. Bounded by 2 s.
async fn healthy(addr: SocketAddr) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut head = Vec::new();
        let _ = s.read_to_end(&mut head).await;
        Some(head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.0 200"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), probe).await,
        Ok(Some(true))
    )
}
