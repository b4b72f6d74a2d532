//! The Phoenix harness (tests/common/phoenix.rs) against a real Arize Phoenix, before any router
//! span goes to it (issue 45): Phoenix listens on loopback only, accepts an OTLP/HTTP protobuf
//! export, gives the spans of one trace back through its REST API (and no span of another
//! trace), keeps the parent link and the attributes, classifies `gen_ai.operation.name`
//! `invoke_agent` as AGENT and `execute_tool` as TOOL (and a span without it as neither), and
//! its trace page renders that trace in headless Chromium to a PNG.
//!
//! Set `PHOENIX_SCREENSHOT_OUT=/some/file.png` to keep a copy of the screenshot.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, ResourceSpans, ScopeSpans, Span};
use prost::Message;
use serde_json::Value;

use common::phoenix::Phoenix;
use common::TempDir;

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..Default::default()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Fresh ids for this run (a second run against the same Phoenix would not collide): two trace
/// ids and three span ids, from the clock and the process id through splitmix64.
struct Ids {
    trace: [u8; 16],
    other_trace: [u8; 16],
    planner: [u8; 8],
    tool: [u8; 8],
    stray: [u8; 8],
}

fn ids() -> Ids {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as u64;
    let mut state = nanos ^ (u64::from(std::process::id()) << 40);
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) | 1
    };
    let mut trace = || {
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&next().to_be_bytes());
        t[8..].copy_from_slice(&next().to_be_bytes());
        t
    };
    let (trace, other_trace) = (trace(), trace());
    Ids {
        trace,
        other_trace,
        planner: next().to_be_bytes(),
        tool: next().to_be_bytes(),
        stray: next().to_be_bytes(),
    }
}

fn span(trace: [u8; 16], id: [u8; 8], parent: Option<[u8; 8]>, name: &str, kind: SpanKind) -> Span {
    let start = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as u64;
    Span {
        trace_id: trace.to_vec(),
        span_id: id.to_vec(),
        parent_span_id: parent.map(|p| p.to_vec()).unwrap_or_default(),
        name: name.to_owned(),
        kind: kind as i32,
        start_time_unix_nano: start,
        end_time_unix_nano: start + 5_000_000,
        ..Default::default()
    }
}

/// The local addresses (hex, as /proc/net/tcp{,6} print them) of the sockets listening on
/// `port`.
fn listening_on(port: u16) -> Vec<String> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state)) = (fields.get(1), fields.get(3)) else {
                continue;
            };
            let Some((addr, p)) = local.split_once(':') else {
                continue;
            };
            if *state == "0A" && u16::from_str_radix(p, 16) == Ok(port) {
                out.push(addr.to_owned());
            }
        }
    }
    out
}

/// 127.0.0.1, ::ffff:127.0.0.1 or ::1 as /proc/net prints them.
fn is_loopback(hex_addr: &str) -> bool {
    matches!(
        hex_addr,
        "0100007F" | "0000000000000000FFFF00000100007F" | "00000000000000000000000001000000"
    )
}

fn by_name<'a>(spans: &'a [Value], name: &str) -> &'a Value {
    spans
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no span {name:?} in {spans:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phoenix_takes_otlp_classifies_agent_and_tool_and_shows_the_trace() {
    let started = std::time::Instant::now();
    let phoenix = Phoenix::start().await;
    eprintln!("Phoenix answered after {:?}", started.elapsed());

    // Loopback only: the HTTP listener and the OTLP/gRPC one (which Phoenix itself would bind
    // on [::]; tests/phoenix/serve.py rebinds it).
    for port in [phoenix.port, phoenix.grpc_port] {
        let listening = listening_on(port);
        assert!(!listening.is_empty(), "nothing listens on port {port}");
        assert!(
            listening.iter().all(|a| is_loopback(a)),
            "port {port} listens beyond loopback: {listening:?}"
        );
    }

    let Ids {
        trace,
        other_trace,
        planner: planner_id,
        tool: tool_id,
        stray: stray_id,
    } = ids();
    let mut planner = span(
        trace,
        planner_id,
        None,
        "invoke_agent planner",
        SpanKind::Client,
    );
    planner.attributes = vec![
        kv("gen_ai.operation.name", "invoke_agent"),
        kv("gen_ai.agent.id", "agent-planner-1"),
        kv("gen_ai.agent.name", "planner"),
        kv("map.sender", "caller-7"),
    ];
    let mut tool = span(
        trace,
        tool_id,
        Some(planner_id),
        "execute_tool search",
        SpanKind::Internal,
    );
    tool.attributes = vec![
        kv("gen_ai.operation.name", "execute_tool"),
        kv("gen_ai.tool.name", "search"),
        kv("gen_ai.tool.call.id", "call-42"),
    ];
    // Another trace in the same export: never returned for the first one.
    let stray = span(
        other_trace,
        stray_id,
        None,
        "send scope",
        SpanKind::Producer,
    );
    let export = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", "phoenix-harness")],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "map-router-tests".to_owned(),
                    ..Default::default()
                }),
                spans: vec![planner, tool, stray],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    assert_eq!(phoenix.export(&export.encode_to_vec()).await, 200);

    let (trace_hex, other_hex) = (hex(&trace), hex(&other_trace));
    let spans = phoenix
        .wait_spans(&trace_hex, 2, Duration::from_secs(30))
        .await;
    eprintln!("{}", serde_json::to_string_pretty(&spans).unwrap());
    assert_eq!(
        spans.len(),
        2,
        "exactly the two spans of the trace: {spans:#?}"
    );

    let planner = by_name(&spans, "invoke_agent planner");
    let tool = by_name(&spans, "execute_tool search");
    assert_eq!(planner["context"]["trace_id"], trace_hex.as_str());
    assert_eq!(planner["context"]["span_id"], hex(&planner_id).as_str());
    assert_eq!(planner["parent_id"], Value::Null, "the root has no parent");
    assert_eq!(tool["context"]["trace_id"], trace_hex.as_str());
    assert_eq!(tool["context"]["span_id"], hex(&tool_id).as_str());
    assert_eq!(
        tool["parent_id"],
        hex(&planner_id).as_str(),
        "parented, not linked"
    );

    assert_eq!(
        planner["span_kind"], "AGENT",
        "invoke_agent is an AGENT span: {planner:#}"
    );
    assert_eq!(
        tool["span_kind"], "TOOL",
        "execute_tool is a TOOL span: {tool:#}"
    );
    let attrs = &planner["attributes"];
    assert_eq!(attrs["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(attrs["gen_ai.agent.id"], "agent-planner-1");
    assert_eq!(attrs["gen_ai.agent.name"], "planner");
    assert_eq!(attrs["map.sender"], "caller-7");
    let attrs = &tool["attributes"];
    assert_eq!(attrs["gen_ai.operation.name"], "execute_tool");
    assert_eq!(attrs["gen_ai.tool.name"], "search");
    assert_eq!(attrs["gen_ai.tool.call.id"], "call-42");
    for s in [planner, tool] {
        assert!(
            s["attributes"].get("service.name").is_none(),
            "resource attributes are not span attributes: {s:#}"
        );
    }

    // The other trace holds only its own span, and a span without gen_ai.operation.name is
    // neither AGENT nor TOOL.
    let others = phoenix.spans(&other_hex).await;
    assert_eq!(others.len(), 1, "{others:#?}");
    assert_eq!(others[0]["name"], "send scope");
    assert_eq!(others[0]["span_kind"], "UNKNOWN", "{:#}", others[0]);

    // The trace page, rendered by headless Chromium.
    let dir = TempDir::new("phoenix-shot");
    let png = dir.path.join("trace.png");
    let shot_started = std::time::Instant::now();
    let url = phoenix.screenshot(&trace_hex, &png).await;
    eprintln!("screenshot of {url} took {:?}", shot_started.elapsed());
    assert!(
        url.starts_with(&format!("{}/projects/", phoenix.otlp_base()))
            && url.ends_with(&format!("/traces/{trace_hex}")),
        "{url}"
    );
    let bytes = std::fs::read(&png).expect("the screenshot was written");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    let (width, height) = (
        u32::from_be_bytes(bytes[16..20].try_into().unwrap()),
        u32::from_be_bytes(bytes[20..24].try_into().unwrap()),
    );
    assert_eq!((width, height), (1400, 900), "the window size");
    assert!(
        bytes.len() > 30_000,
        "{} bytes: too small for a rendered trace page (a blank page is a few KB)",
        bytes.len()
    );
    if let Some(keep) = std::env::var_os("PHOENIX_SCREENSHOT_OUT") {
        std::fs::copy(&png, &keep).expect("copy the screenshot");
    }
    // What that render shows: the trace's two spans, not a loading page.
    let dom = phoenix.rendered_text(&url).await;
    for name in [
        "invoke_agent planner",
        "execute_tool search",
        trace_hex.as_str(),
    ] {
        assert!(dom.contains(name), "the trace page shows no {name:?}");
    }
    // (The page draws the project's trace list behind the trace's details: the other trace's
    // root span is in the DOM too, so its absence cannot be asserted here.)
    eprintln!("whole test took {:?}", started.elapsed());
}

/// The node twin (tests/interop/phoenix.mjs, for scripts that drive the TypeScript SDK) starts
/// its own Phoenix, exports an agent span and its tool span as protobuf it encodes itself, reads
/// them back classified AGENT / TOOL and screenshots the trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_helper_passes_its_self_test() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/phoenix.mjs");
    let mut command = tokio::process::Command::new("node");
    command
        .arg(&script)
        .arg("--self-test")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = common::within(Duration::from_secs(240), command.output())
        .await
        .expect("run node (scripts/setup.sh installs it)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the self-test failed: {stdout}");
    for line in [
        "ok - two spans of trace",
        "ok - the tool span is its child",
        "ok - classified AGENT and TOOL",
        "ok - a PNG of http://127.0.0.1:",
        "ok - the page shows both spans",
    ] {
        assert!(stdout.contains(line), "no {line:?} in {stdout}");
    }
    assert!(!stdout.contains("FAIL"), "{stdout}");
}
