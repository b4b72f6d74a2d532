//! The clients over TLS: the built binary serves `wss://` with a certificate signed by a test CA
//! (rcgen, or the openssl recipe in docs/security.md run as written), and the CLI commands
//! (`agents`, `scopes`, `send`, `agent -- <cmd>`) and the Rust client connect to it trusting
//! that CA (`--ca-file`, `MAP_ROUTER_CA_FILE`, `ClientOptions::ca_file`), by `wss://` and
//! `https://` URLs. Without the CA, every one of them fails and says it is a certificate
//! problem; an unusable CA file is an error naming the file.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use common::{start_binary, with_timeout, within, TempDir};
use futures::StreamExt;
use map_router::client::{Client, ClientError, ClientOptions, ReconnectPolicy};
use map_router::protocol::methods::agents::RegisterParams;
use serde_json::json;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_map-router");

/// The bound on one CLI run (a process start, the system's roots, a TLS handshake, a call).
const CLI_TIMEOUT: Duration = Duration::from_secs(20);

/// A test CA and a server certificate it signed for `localhost` and `127.0.0.1`, as PEM files:
/// `ca.pem`, `server.pem`, `server-key.pem`.
struct Pki {
    dir: TempDir,
}

impl Pki {
    fn new() -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        };
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name
            .push(DnType::CommonName, "map-router test CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);

        let mut server =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        server
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let server_key = KeyPair::generate().unwrap();
        let server_cert = server.signed_by(&server_key, &issuer).unwrap();

        let dir = TempDir::new("tls-client");
        std::fs::write(dir.path.join("ca.pem"), ca_cert.pem()).unwrap();
        std::fs::write(dir.path.join("server.pem"), server_cert.pem()).unwrap();
        std::fs::write(dir.path.join("server-key.pem"), server_key.serialize_pem()).unwrap();
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path.join(name)
    }

    fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }
}

/// Starts the built binary serving TLS with `cert` / `key` on 127.0.0.1:0; returns the child
/// (killed on drop) and its port.
async fn start_tls_router(cert: &Path, key: &Path) -> (tokio::process::Child, u16) {
    let (child, url) = start_binary([
        "serve".as_ref(),
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--ephemeral".as_ref(),
        "--tls-cert".as_ref(),
        cert.as_os_str(),
        "--tls-key".as_ref(),
        key.as_os_str(),
    ])
    .await;
    let port = url
        .strip_prefix("wss://127.0.0.1:")
        .and_then(|rest| rest.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("not a wss:// URL on 127.0.0.1: {url}"));
    (child, port)
}

/// `map-router <command> --url <url> [args...]`, with no URL or CA from the test's environment.
fn cli(command: &str, url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    // `--url` right after the command name: after `--` it would be the program's.
    cmd.arg(command)
        .arg("--url")
        .arg(url)
        .args(args)
        .env_remove("MAP_ROUTER_URL")
        .env_remove("MAP_ROUTER_CA_FILE")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn output(mut cmd: Command) -> Output {
    within(CLI_TIMEOUT, cmd.output())
        .await
        .expect("run the CLI")
}

async fn run(command: &str, url: &str, args: &[&str]) -> Output {
    output(cli(command, url, args)).await
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts the command succeeded and returns its stdout.
fn success(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status,
        stdout(o),
        stderr(o)
    );
    stdout(o)
}

/// Asserts the command failed with an error that names a certificate problem and the CLI's
/// remedy.
fn fails_as_untrusted(o: &Output, url: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(
        err.contains(&format!(
            "map-router: cannot connect to {url}: TLS certificate not trusted (invalid peer \
             certificate: UnknownIssuer); pass the router's CA with --ca-file or \
             MAP_ROUTER_CA_FILE"
        )),
        "{err}"
    );
}

#[tokio::test]
async fn cli_commands_speak_wss_with_the_ca_file() {
    let pki = Pki::new();
    let (_router, port) =
        start_tls_router(&pki.path("server.pem"), &pki.path("server-key.pem")).await;
    let url = format!("wss://127.0.0.1:{port}/");
    let ca = pki.ca();
    let ca_arg = ca.to_str().unwrap();

    // agents, by flag.
    let out = run("agents", &url, &["--ca-file", ca_arg]).await;
    assert_eq!(success(&out).trim(), "no agents");

    // scopes, by environment variable, through the router's https:// URL and its DNS name.
    let mut cmd = cli("scopes", &format!("https://localhost:{port}/"), &[]);
    cmd.env("MAP_ROUTER_CA_FILE", &ca);
    assert_eq!(success(&output(cmd).await).trim(), "no scopes");

    // send, to an agent a TLS Rust client registered: the message arrives.
    let owner = with_timeout(Client::connect_ws(
        &url,
        ClientOptions::agent().ca_file(&ca),
    ))
    .await
    .expect("a TLS client with the CA");
    let target = with_timeout(owner.register(RegisterParams {
        agent_id: Some("tls-target".into()),
        ..Default::default()
    }))
    .await
    .unwrap();
    let mut inbox = target.messages();
    let out = run(
        "send",
        &url,
        &[
            "--ca-file",
            ca_arg,
            "--to",
            "tls-target",
            "--payload",
            r#"{"over":"tls"}"#,
        ],
    )
    .await;
    let result: serde_json::Value = serde_json::from_str(success(&out).trim()).unwrap();
    assert_eq!(result["delivered"], json!(["tls-target"]), "{result}");
    let message = with_timeout(inbox.next()).await.expect("the message");
    assert_eq!(message.payload_value(), Some(json!({"over": "tls"})));

    // agents --json now lists it.
    let out = run("agents", &url, &["--ca-file", ca_arg, "--json"]).await;
    let agents: serde_json::Value = serde_json::from_str(&success(&out)).unwrap();
    assert_eq!(agents[0]["id"], json!("tls-target"), "{agents}");
    let _ = with_timeout(owner.close()).await;
}

/// A shell-script agent: connects, registers as `tls-agent`, reports its `MAP_ROUTER_CA_FILE`
/// on stderr, and on its first `map/message` sends `pong` to `observer` and exits 5.
const SCRIPT_AGENT: &str = r#"
printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"protocolVersion":1,"participantType":"agent"}}'
read -r connected
printf '%s\n' '{"jsonrpc":"2.0","id":2,"method":"map/agents/register","params":{"agentId":"tls-agent"}}'
read -r registered
echo "ca file: $MAP_ROUTER_CA_FILE" >&2
while read -r line; do
  case "$line" in
    *'"map/message"'*)
      printf '%s\n' '{"jsonrpc":"2.0","id":3,"method":"map/send","params":{"to":"observer","payload":"pong"}}'
      read -r sent
      exit 5;;
  esac
done
"#;

#[tokio::test]
async fn the_agent_bridge_speaks_wss_with_the_ca_file() {
    let pki = Pki::new();
    let (_router, port) =
        start_tls_router(&pki.path("server.pem"), &pki.path("server-key.pem")).await;
    let url = format!("wss://127.0.0.1:{port}/");
    let ca = pki.ca();
    let owner = with_timeout(Client::connect_ws(
        &url,
        ClientOptions::agent().ca_file(&ca),
    ))
    .await
    .unwrap();
    let observer = with_timeout(owner.register(RegisterParams {
        agent_id: Some("observer".into()),
        ..Default::default()
    }))
    .await
    .unwrap();
    let mut inbox = observer.messages();

    let child = cli(
        "agent",
        &url,
        &[
            "--ca-file",
            ca.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            SCRIPT_AGENT,
        ],
    )
    .spawn()
    .unwrap();
    // Wait (bounded) for the script's agent to appear.
    within(CLI_TIMEOUT, async {
        for _ in 0..1000 {
            if owner.get_agent("tls-agent").await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("tls-agent never registered");
    })
    .await;
    with_timeout(owner.send("tls-agent", json!("ping")))
        .await
        .unwrap();
    let pong = with_timeout(inbox.next()).await.expect("pong");
    assert_eq!(pong.payload_value(), Some(json!("pong")));
    assert_eq!(pong.from, "tls-agent");
    let out = within(CLI_TIMEOUT, child.wait_with_output()).await.unwrap();
    assert_eq!(out.status.code(), Some(5), "stderr: {}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("ca file: {}", ca.display())),
        "the program is told the CA file: {}",
        stderr(&out)
    );

    // Without the CA the bridge does not start the program and says why.
    let out = run("agent", &url, &["--", "sh", "-c", "echo started >&2"]).await;
    fails_as_untrusted(&out, &url);
    assert!(!stderr(&out).contains("started"), "{}", stderr(&out));
    let _ = with_timeout(owner.close()).await;
}

#[tokio::test]
async fn without_the_ca_the_cli_says_it_is_a_certificate_problem() {
    let pki = Pki::new();
    let (_router, port) =
        start_tls_router(&pki.path("server.pem"), &pki.path("server-key.pem")).await;
    let url = format!("wss://127.0.0.1:{port}/");

    let out = run("agents", &url, &[]).await;
    fails_as_untrusted(&out, &url);
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    // An https:// URL is taken as wss:// and fails the same way.
    let out = run(
        "send",
        &format!("https://127.0.0.1:{port}/"),
        &["--to", "x"],
    )
    .await;
    fails_as_untrusted(&out, &url);

    // A CA file that does not exist, or is not PEM: an error naming the file.
    let missing = pki.path("missing-ca.pem");
    let out = run("agents", &url, &["--ca-file", missing.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("CA file {}: cannot read it", missing.display())),
        "{err}"
    );
    let not_pem = pki.path("not-pem.txt");
    std::fs::write(&not_pem, "hello\n").unwrap();
    let mut cmd = cli("scopes", &url, &[]);
    cmd.env("MAP_ROUTER_CA_FILE", &not_pem);
    let out = output(cmd).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "CA file {}: no certificate in it",
            not_pem.display()
        )),
        "{err}"
    );
    // The server's key file is PEM but holds no certificate.
    let out = run(
        "agents",
        &url,
        &["--ca-file", pki.path("server-key.pem").to_str().unwrap()],
    )
    .await;
    assert!(
        stderr(&out).contains("no certificate in it"),
        "{}",
        stderr(&out)
    );

    // A plain ws:// URL to the TLS router fails, with a hint (and the router goes on serving).
    let out = run("agents", &format!("ws://127.0.0.1:{port}/"), &[]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is the router serving TLS? Then use wss://"),
        "{}",
        stderr(&out)
    );
    let out = run("agents", &url, &["--ca-file", pki.ca().to_str().unwrap()]).await;
    assert_eq!(success(&out).trim(), "no agents");
}

#[tokio::test]
async fn the_rust_client_connects_registers_and_gets_messages_over_tls() {
    let pki = Pki::new();
    let (_router, port) =
        start_tls_router(&pki.path("server.pem"), &pki.path("server-key.pem")).await;
    let url = format!("wss://127.0.0.1:{port}/");
    let ca = pki.ca();

    let agent = with_timeout(Client::connect_ws(
        &url,
        ClientOptions::agent().name("tls-worker").ca_file(&ca),
    ))
    .await
    .expect("connects with the CA");
    assert!(with_timeout(agent.list_agents(Default::default()))
        .await
        .unwrap()
        .is_empty());
    let worker = with_timeout(agent.register(RegisterParams {
        agent_id: Some("worker".into()),
        ..Default::default()
    }))
    .await
    .unwrap();
    let mut inbox = worker.messages();

    // A second client, by the https:// URL and the host name.
    let sender = with_timeout(Client::connect_ws(
        &format!("https://localhost:{port}/"),
        ClientOptions::new().ca_file(&ca),
    ))
    .await
    .expect("connects by https:// with the CA");
    let listed = with_timeout(sender.list_agents(Default::default()))
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id.as_str(), "worker");
    let sent = with_timeout(sender.send("worker", json!({"n": 1})))
        .await
        .unwrap();
    assert_eq!(sent.delivered, vec!["worker".to_owned()]);
    let message = with_timeout(inbox.next()).await.expect("the message");
    assert_eq!(message.payload_value(), Some(json!({"n": 1})));

    // A reconnect opens a new TLS connection with the same trust and resumes the session.
    with_timeout(agent.reconnect())
        .await
        .expect("reconnects over TLS");
    with_timeout(sender.send("worker", json!({"n": 2})))
        .await
        .unwrap();
    let message = with_timeout(inbox.next())
        .await
        .expect("after the reconnect");
    assert_eq!(message.payload_value(), Some(json!({"n": 2})));

    // Without the CA: a certificate error, not a generic transport failure.
    let refused = with_timeout(Client::connect_ws(
        &url,
        ClientOptions::new().reconnect(ReconnectPolicy::disabled()),
    ))
    .await
    .expect_err("an untrusted certificate must be refused");
    match &refused {
        ClientError::UntrustedCertificate { url: u, reason } => {
            assert_eq!(u, &url);
            assert!(reason.contains("UnknownIssuer"), "{reason}");
        }
        other => panic!("not a certificate error: {other:?}"),
    }
    assert!(!refused.is_retryable());
    let text = refused.to_string();
    assert!(text.contains("TLS certificate not trusted"), "{text}");
    assert!(text.contains("ClientOptions::ca_file"), "{text}");

    // wss:// to a router without TLS: a handshake failure that says so.
    let (plain, plain_url) = common::start_server(|_| {}).await;
    let e = with_timeout(Client::connect_ws(
        &plain_url.replacen("ws://", "wss://", 1),
        ClientOptions::new().ca_file(&ca),
    ))
    .await
    .expect_err("a plain router cannot be spoken to over TLS");
    assert!(matches!(e, ClientError::Transport(_)), "{e:?}");
    assert!(
        e.to_string().contains("TLS handshake failed") && e.to_string().contains("serving TLS"),
        "{e}"
    );
    plain.shutdown().await;

    // A CA file that is not PEM: an error naming it, before any connection.
    let not_pem = pki.path("garbage.pem");
    std::fs::write(&not_pem, [0u8, 159, 146, 150]).unwrap();
    let e = with_timeout(Client::connect_ws(
        &url,
        ClientOptions::new().ca_file(&not_pem),
    ))
    .await
    .expect_err("a CA file without a certificate");
    assert!(
        matches!(&e, ClientError::CaFile { path, .. } if path == &not_pem),
        "{e:?}"
    );
    assert!(e.to_string().contains("garbage.pem"), "{e}");

    // A self-signed router certificate can be trusted as its own CA.
    let self_signed =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let dir = TempDir::new("tls-self-signed");
    let (cert, key) = (dir.path.join("cert.pem"), dir.path.join("key.pem"));
    std::fs::write(&cert, self_signed.cert.pem()).unwrap();
    std::fs::write(&key, self_signed.signing_key.serialize_pem()).unwrap();
    let (_other, other_port) = start_tls_router(&cert, &key).await;
    let client = with_timeout(Client::connect_ws(
        &format!("wss://127.0.0.1:{other_port}/"),
        ClientOptions::new().ca_file(&cert),
    ))
    .await
    .expect("trusts the self-signed certificate");
    assert!(with_timeout(client.list_agents(Default::default()))
        .await
        .unwrap()
        .is_empty());
    // ... and the test CA does not vouch for it.
    let e = with_timeout(Client::connect_ws(
        &format!("wss://127.0.0.1:{other_port}/"),
        ClientOptions::new().ca_file(&ca),
    ))
    .await
    .expect_err("another CA's file does not trust it");
    assert!(
        matches!(e, ClientError::UntrustedCertificate { .. }),
        "{e:?}"
    );

    for c in [client, sender, agent] {
        let _ = with_timeout(c.close()).await;
    }
}

/// The shell block of docs/security.md marked `<!-- doc: test tls-recipe -->`.
fn documented_recipe() -> String {
    let body = common::docs::doc_script("docs/security.md", "tls-recipe");
    assert!(body.contains("openssl"), "the recipe runs openssl: {body}");
    body
}

#[tokio::test]
async fn the_documented_openssl_recipe_makes_a_certificate_the_cli_trusts() {
    let recipe = documented_recipe();
    let has_openssl = std::process::Command::new("sh")
        .args(["-c", "command -v openssl"])
        .output()
        .expect("run sh")
        .status
        .success();
    assert!(
        has_openssl,
        "this test runs the openssl commands of docs/security.md and needs `openssl` on PATH \
         (Debian: apt-get install openssl; scripts/setup.sh installs it)"
    );
    let dir = TempDir::new("tls-recipe");
    let ran = within(
        Duration::from_secs(60),
        Command::new("sh")
            .args(["-eu", "-c", &recipe])
            .current_dir(&dir.path)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap();
    assert!(
        ran.status.success(),
        "the recipe failed ({:?}):\n{recipe}\nstdout: {}\nstderr: {}",
        ran.status,
        stdout(&ran),
        stderr(&ran)
    );
    let (ca, cert, key) = (
        dir.path.join("ca.pem"),
        dir.path.join("server.pem"),
        dir.path.join("server-key.pem"),
    );
    for file in [&ca, &cert, &key] {
        assert!(file.is_file(), "the recipe made no {}", file.display());
    }

    let (_router, port) = start_tls_router(&cert, &key).await;
    let url = format!("wss://127.0.0.1:{port}/");
    let out = run("agents", &url, &["--ca-file", ca.to_str().unwrap()]).await;
    assert_eq!(success(&out).trim(), "no agents");
    let mut cmd = cli("scopes", &format!("https://localhost:{port}/"), &[]);
    cmd.env("MAP_ROUTER_CA_FILE", &ca);
    assert_eq!(success(&output(cmd).await).trim(), "no scopes");
    let out = run("agents", &url, &[]).await;
    fails_as_untrusted(&out, &url);
    // The Rust client trusts it too.
    let client = with_timeout(Client::connect_ws(&url, ClientOptions::new().ca_file(&ca)))
        .await
        .expect("the Rust client trusts the recipe's CA");
    let _ = with_timeout(client.close()).await;
}
