//! TLS: the router serves `wss://` and `https://` with a certificate generated here (rcgen),
//! through the built binary's `--tls-cert` / `--tls-key` and through `[tls]` in the library;
//! clients that trust the certificate speak MAP over it; plain text to a TLS port, an untrusted
//! certificate and a stalled handshake fail cleanly while a healthy TLS client is served.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::{SinkExt, StreamExt};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

type TlsWs = WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

/// A self-signed certificate for `localhost` and `127.0.0.1`, written as PEM files.
struct Cert {
    dir: TempDir,
    der: CertificateDer<'static>,
}

impl Cert {
    fn new() -> Self {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
            .expect("generate a certificate");
        let dir = TempDir::new("tls");
        std::fs::write(dir.path.join("cert.pem"), ck.cert.pem()).unwrap();
        std::fs::write(dir.path.join("key.pem"), ck.signing_key.serialize_pem()).unwrap();
        Self {
            der: ck.cert.der().clone(),
            dir,
        }
    }

    fn cert_path(&self) -> std::path::PathBuf {
        self.dir.path.join("cert.pem")
    }

    fn key_path(&self) -> std::path::PathBuf {
        self.dir.path.join("key.pem")
    }

    fn connector(&self, trust: bool) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        if trust {
            roots.add(self.der.clone()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }
}

fn addr_of(url: &str) -> std::net::SocketAddr {
    url.trim_start_matches("wss://")
        .trim_start_matches("ws://")
        .trim_end_matches('/')
        .parse()
        .expect("host:port")
}

async fn tls_stream(
    cert: &Cert,
    addr: std::net::SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = with_timeout(TcpStream::connect(addr)).await?;
    let name = ServerName::try_from("localhost").unwrap();
    with_timeout(cert.connector(true).connect(name, tcp)).await
}

async fn wss(cert: &Cert, addr: std::net::SocketAddr) -> TlsWs {
    let tls = tls_stream(cert, addr).await.expect("TLS handshake");
    let url = format!("wss://localhost:{}/", addr.port());
    with_timeout(tokio_tungstenite::client_async(url, tls))
        .await
        .expect("WebSocket over TLS")
        .0
}

async fn call(ws: &mut TlsWs, id: u64, method: &str, params: Value) -> Value {
    let req = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    with_timeout(ws.send(Message::text(req.to_string())))
        .await
        .unwrap();
    within(TIMEOUT, async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(&t).unwrap();
                    if v["id"] == json!(id) {
                        return v;
                    }
                }
                Some(Ok(_)) => continue,
                other => panic!("connection ended: {other:?}"),
            }
        }
    })
    .await
}

#[tokio::test]
async fn the_binary_serves_wss_with_the_given_certificate() {
    let cert = Cert::new();
    let (_child, url) = start_binary([
        "serve".as_ref(),
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--ephemeral".as_ref(),
        "--tls-cert".as_ref(),
        cert.cert_path().as_os_str(),
        "--tls-key".as_ref(),
        cert.key_path().as_os_str(),
    ])
    .await;
    assert!(url.starts_with("wss://"), "{url}");
    let addr = addr_of(&url);
    let mut ws = wss(&cert, addr).await;
    let r = call(&mut ws, 1, "map/connect", json!({"protocolVersion": 1})).await;
    assert_eq!(r["result"]["protocolVersion"], json!(1), "{r}");
    let r = call(&mut ws, 2, "map/agents/list", json!({})).await;
    assert_eq!(without_as_of(&r["result"]), json!({"agents": []}));

    // Plain WebSocket to the TLS port fails cleanly (no hang), and the TLS client goes on.
    let plain = with_timeout(tokio_tungstenite::connect_async(format!("ws://{addr}/"))).await;
    assert!(plain.is_err(), "plain text to a TLS port must fail");
    // So does a client that does not trust the certificate.
    let tcp = with_timeout(TcpStream::connect(addr)).await.unwrap();
    let untrusted = with_timeout(
        cert.connector(false)
            .connect(ServerName::try_from("localhost").unwrap(), tcp),
    )
    .await;
    assert!(untrusted.is_err());
    let r = call(&mut ws, 3, "map/scopes/list", json!({})).await;
    assert_eq!(without_as_of(&r["result"]), json!({"scopes": []}));
}

#[tokio::test]
async fn https_posts_and_a_stalled_handshake_with_tls_from_the_config() {
    let cert = Cert::new();
    let (cert_path, key_path) = (cert.cert_path(), cert.key_path());
    let (server, url) = start_server(move |c| {
        c.tls.cert = Some(cert_path);
        c.tls.key = Some(key_path);
        c.limits.header_timeout_ms = 500;
    })
    .await;
    let addr = server.local_addrs()[0];
    let _ = url;
    let mut healthy = wss(&cert, addr).await;
    call(&mut healthy, 1, "map/connect", json!({})).await;

    // HTTPS POST /map/rpc.
    let mut tls = tls_stream(&cert, addr).await.unwrap();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"map/connect"}"#;
    let req = format!(
        "POST /map/rpc HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    with_timeout(tls.write_all(req.as_bytes())).await.unwrap();
    let mut raw = Vec::new();
    let _ = with_timeout(tls.read_to_end(&mut raw)).await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("\"sessionId\""), "{text}");

    // A TCP connection that never starts its handshake is closed after the header timeout.
    let mut stalled = with_timeout(TcpStream::connect(addr)).await.unwrap();
    let mut buf = [0u8; 8];
    let n = within(Duration::from_secs(10), stalled.read(&mut buf)).await;
    assert!(matches!(n, Ok(0) | Err(_)), "closed: {n:?}");
    let r = call(&mut healthy, 2, "map/agents/list", json!({})).await;
    assert_eq!(without_as_of(&r["result"]), json!({"agents": []}));
}

#[test]
fn a_missing_or_mismatched_key_is_a_start_up_error() {
    let cert = Cert::new();
    let other = Cert::new();
    let files = map_router::server::tls::TlsFiles {
        cert: cert.cert_path(),
        key: other.key_path(),
    };
    let Err(e) = map_router::server::tls::acceptor(&files) else {
        panic!("accepted {files:?}");
    };
    assert!(e.to_string().contains("do not fit"), "{e}");
    let files = map_router::server::tls::TlsFiles {
        cert: cert.dir.path.join("nope.pem"),
        key: cert.key_path(),
    };
    let Err(e) = map_router::server::tls::acceptor(&files) else {
        panic!("accepted {files:?}");
    };
    assert!(e.to_string().contains("nope.pem"), "{e}");
}
