//! The gateway's one outbound HTTP client: every request a gateway makes of its own (A2A
//! remote agents' cards and calls, A2A push webhooks, MAMP messages to remote MAMP agents)
//! goes through [`send`].
//!
//! Owns: how a request reaches the wire, and nothing else: one HTTP/1.1 connection per
//! request, made with hyper's connection API (`hyper::client::conn::http1`: hyper is the
//! server's HTTP stack already, so no second one is built; a gateway calls a remote seldom and
//! an SSE answer holds its connection for its whole life, so a pool would buy little), over
//! `https://` the house's rustls setup (`client::tls`: the platform's roots, ring).
//!
//! Where it may connect is not its decision: it takes only an [`Allowed`] (a URL that passed an
//! allow-list, in its normalised form: what was checked is what is sent), and connects through
//! [`egress::connect`](super::connect) (the host resolved once, every address judged, a judged
//! address connected to: no second lookup).
//!
//! Every wait is bounded by the caller's [`Waits`]: connecting (lookup included) and the TLS
//! handshake by `connect`, the response head by `head`; a body is read with a deadline and a
//! cap ([`Response::body`]) or chunk by chunk with an idle bound ([`Response::next_chunk`]).
//! Redirects are not followed (none ever were): a 3xx is a status like any other.
//!
//! What a failure says: no connection, no TLS, and no answer at all are one
//! [`ClientError::Unreachable`] (the details are logged), so an answer cannot be used to tell
//! an open port from a closed one.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::http::{header, HeaderValue, Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use super::{Allowed, EgressError};

/// The `User-Agent` of every outbound request.
pub const USER_AGENT: &str = concat!("map-router/", env!("CARGO_PKG_VERSION"));

/// The bounds of one request's waits before its body.
#[derive(Debug, Clone, Copy)]
pub struct Waits {
    /// Resolving the host and making the TCP connection; again for the TLS handshake.
    pub connect: Duration,
    /// From the request sent to the response head received.
    pub head: Duration,
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Every address the host has is one the router does not call (`egress` module docs).
    #[error("{0}")]
    Forbidden(EgressError),
    /// No connection, no TLS session, or no answer began: one text for all, on purpose.
    #[error("remote unreachable")]
    Unreachable,
    /// The request could not be built (a header value with characters a head cannot carry).
    #[error("bad request: {0}")]
    Request(String),
    /// The body did not arrive within its deadline.
    #[error("the body took longer than {0:?}")]
    BodyTimeout(Duration),
    /// The body broke off, or was larger than the cap.
    #[error("the answer broke off or was larger than {0} bytes")]
    Body(usize),
    /// No chunk of a streamed body within the idle bound.
    #[error("no data for {0:?}")]
    Idle(Duration),
    /// A streamed body broke.
    #[error("the stream broke: {0}")]
    Stream(String),
}

/// A request body and its `Content-Type`.
#[derive(Debug)]
pub struct Body {
    /// The bytes.
    pub bytes: Bytes,
    /// Its `Content-Type`.
    pub content_type: &'static str,
}

/// An answer whose head has arrived; its body is read on demand.
#[derive(Debug)]
pub struct Response {
    url: String,
    inner: hyper::Response<Incoming>,
}

/// Sends `method` to `target` with `headers` (the caller's: `Authorization`, `Accept` ...) and
/// `body`, on a fresh connection; the response once its head has arrived.
///
/// # Errors
/// [`ClientError::Forbidden`] when no address of the host may be called;
/// [`ClientError::Unreachable`] for no connection, no TLS or no head within `waits`;
/// [`ClientError::Request`] for a header value a request head cannot carry.
pub async fn send(
    target: &Allowed,
    method: Method,
    headers: &[(&'static str, String)],
    body: Option<Body>,
    waits: Waits,
) -> Result<Response, ClientError> {
    let mut named = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        let name = header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| ClientError::Request(e.to_string()))?;
        named.push((name, value.clone()));
    }
    send_named(target, method, &named, body, waits).await
}

/// [`send`] with header names made at run time (an operator's configured export headers).
///
/// # Errors
/// As [`send`].
pub async fn send_named(
    target: &Allowed,
    method: Method,
    headers: &[(header::HeaderName, String)],
    body: Option<Body>,
    waits: Waits,
) -> Result<Response, ClientError> {
    let url = target.as_str();
    let mut request = Request::builder()
        .method(method)
        .uri(target.request_target())
        .header(header::HOST, target.authority())
        .header(header::USER_AGENT, USER_AGENT)
        // One request per connection (module docs): said so, so the server need not wait.
        .header(header::CONNECTION, "close");
    for (name, value) in headers {
        let value =
            HeaderValue::from_str(value).map_err(|e| ClientError::Request(e.to_string()))?;
        request = request.header(name, value);
    }
    let bytes = match body {
        Some(b) => {
            request = request.header(header::CONTENT_TYPE, b.content_type);
            b.bytes
        }
        None => Bytes::new(),
    };
    let request = request
        .body(Full::new(bytes))
        .map_err(|e| ClientError::Request(e.to_string()))?;
    let mut sender = open(target, waits.connect).await?;
    // NB: no answer at all reads as unreachable, whatever the reason (module docs).
    match tokio::time::timeout(waits.head, sender.send_request(request)).await {
        Ok(Ok(inner)) => Ok(Response {
            url: url.to_owned(),
            inner,
        }),
        Ok(Err(e)) => {
            tracing::debug!(url, error = %e, "egress: no answer");
            Err(ClientError::Unreachable)
        }
        Err(_) => {
            tracing::debug!(url, head = ?waits.head, "egress: no answer in time");
            Err(ClientError::Unreachable)
        }
    }
}

/// A connection to `target` (TCP through [`super::connect`], then TLS for `https://`), ready
/// for one request.
async fn open(target: &Allowed, wait: Duration) -> Result<SendRequest<Full<Bytes>>, ClientError> {
    let url = target.as_str();
    let tcp = super::connect(target, wait).await.map_err(|e| match e {
        EgressError::Forbidden => ClientError::Forbidden(e),
        EgressError::Unreachable => ClientError::Unreachable,
    })?;
    if !target.is_tls() {
        return handshake(url, tcp).await;
    }
    let config = tls_config().map_err(|e| {
        tracing::warn!(url, error = %e, "egress: no TLS configuration");
        ClientError::Unreachable
    })?;
    let name = rustls::pki_types::ServerName::try_from(target.host_name()).map_err(|e| {
        tracing::debug!(url, error = %e, "egress: not a TLS server name");
        ClientError::Unreachable
    })?;
    let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp);
    match tokio::time::timeout(wait, tls).await {
        Ok(Ok(stream)) => handshake(url, stream).await,
        Ok(Err(e)) => {
            tracing::debug!(url, error = %e, "egress: TLS handshake failed");
            Err(ClientError::Unreachable)
        }
        Err(_) => {
            tracing::debug!(url, ?wait, "egress: TLS handshake timed out");
            Err(ClientError::Unreachable)
        }
    }
}

/// The HTTP/1 handshake over `io` (no bytes are exchanged: it cannot wait), its connection
/// driven by a task that ends when the response body is read or dropped and the sender is gone.
async fn handshake<S>(url: &str, io: S) -> Result<SendRequest<Full<Bytes>>, ClientError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    // Title-case names (`Content-Type`), as the hand-written heads before this client sent
    // them: names are case-insensitive, but a webhook written against those may not know it.
    let (sender, connection) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| {
            tracing::debug!(url, error = %e, "egress: handshake");
            ClientError::Unreachable
        })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "egress: connection ended");
        }
    });
    Ok(sender)
}

/// The rustls configuration of `https://` requests: the platform's roots (`client::tls`), read
/// once per process.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            crate::client::tls::trust(None)
                .map(|t| t.config)
                .map_err(|e| e.to_string())
        })
        .clone()
}

impl Response {
    /// The status code.
    pub fn status(&self) -> StatusCode {
        self.inner.status()
    }

    /// The `Content-Type`, when it is text.
    pub fn content_type(&self) -> Option<&str> {
        self.inner
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
    }

    /// The whole body, at most `max` bytes, within `deadline`.
    ///
    /// # Errors
    /// [`ClientError::BodyTimeout`], or [`ClientError::Body`] for a body that broke off or is
    /// larger than `max`.
    pub async fn body(self, max: usize, deadline: Duration) -> Result<Bytes, ClientError> {
        let url = self.url;
        let body = Limited::new(self.inner.into_body(), max);
        let collected = tokio::time::timeout(deadline, body.collect())
            .await
            .map_err(|_| ClientError::BodyTimeout(deadline))?
            .map_err(|e| {
                tracing::debug!(url, error = %e, "egress: reading the body");
                ClientError::Body(max)
            })?;
        Ok(collected.to_bytes())
    }

    /// The next chunk of the body (`None` at its end), waiting at most `idle` for it: for a
    /// stream, whose reader caps what it keeps.
    ///
    /// # Errors
    /// [`ClientError::Idle`], or [`ClientError::Stream`] when the body broke.
    pub async fn next_chunk(&mut self, idle: Duration) -> Result<Option<Bytes>, ClientError> {
        loop {
            let frame = tokio::time::timeout(idle, self.inner.body_mut().frame())
                .await
                .map_err(|_| ClientError::Idle(idle))?;
            match frame {
                None => return Ok(None),
                Some(Err(e)) => return Err(ClientError::Stream(e.to_string())),
                // Trailers carry no data: read on.
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::egress::AllowList;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const WAITS: Waits = Waits {
        connect: Duration::from_secs(2),
        head: Duration::from_secs(2),
    };

    /// A one-shot server on loopback: reads one request head and body, answers `answer`;
    /// returns what it read.
    async fn serve_once(answer: &'static str) -> (String, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut chunk = [0u8; 1024];
            while !String::from_utf8_lossy(&seen).contains("\r\n\r\nbody") {
                let n = s.read(&mut chunk).await.unwrap();
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&chunk[..n]);
            }
            s.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&seen).into_owned()
        });
        (format!("http://127.0.0.1:{port}"), task)
    }

    #[tokio::test]
    async fn a_request_goes_as_checked_and_its_body_is_capped() {
        let (base, server) =
            serve_once("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n0123456789").await;
        let list = AllowList::parse(&[format!("{base}/hook/")]).unwrap();
        let target = list.check(&format!("{base}/hook/a/../b?x=1")).unwrap();
        let body = Body {
            bytes: Bytes::from_static(b"body"),
            content_type: "application/json",
        };
        let headers = [("authorization", "Bearer t".to_owned())];
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            send(&target, Method::POST, &headers, Some(body), WAITS),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        let err = answer.body(4, Duration::from_secs(2)).await.unwrap_err();
        assert!(matches!(err, ClientError::Body(4)), "{err}");
        let seen = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap()
            .to_ascii_lowercase();
        assert!(seen.starts_with("post /hook/b?x=1 http/1.1\r\n"), "{seen}");
        assert!(seen.contains("authorization: bearer t\r\n"), "{seen}");
        assert!(seen.contains("user-agent: map-router/"), "{seen}");
        assert!(
            seen.contains("content-type: application/json\r\n"),
            "{seen}"
        );
        assert!(seen.contains("content-length: 4\r\n"), "{seen}");
    }

    #[tokio::test]
    async fn no_head_in_time_is_unreachable() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let list = AllowList::parse(&[format!("http://127.0.0.1:{port}/")]).unwrap();
        let target = list.check(&format!("http://127.0.0.1:{port}/")).unwrap();
        let waits = Waits {
            connect: Duration::from_secs(1),
            head: Duration::from_millis(200),
        };
        let err = tokio::time::timeout(
            Duration::from_secs(5),
            send(&target, Method::GET, &[], None, waits),
        )
        .await
        .unwrap()
        .unwrap_err();
        assert!(matches!(err, ClientError::Unreachable), "{err}");
        assert_eq!(err.to_string(), "remote unreachable");
        let bad = [("x-bad", "a\nb".to_owned())];
        let err = send(&target, Method::GET, &bad, None, waits)
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::Request(_)), "{err}");
        drop(listener);
    }

    #[tokio::test]
    async fn https_goes_over_tls() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut first = [0u8; 1];
            s.read_exact(&mut first).await.unwrap();
            first[0]
        });
        let list = AllowList::parse(&[format!("https://127.0.0.1:{port}/")]).unwrap();
        let target = list
            .check(&format!("https://127.0.0.1:{port}/hook"))
            .unwrap();
        // The test server speaks no TLS: the handshake fails, which reads as unreachable.
        let err = tokio::time::timeout(
            Duration::from_secs(5),
            send(&target, Method::POST, &[], None, WAITS),
        )
        .await
        .unwrap()
        .unwrap_err();
        assert!(matches!(err, ClientError::Unreachable), "{err}");
        let first = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first, 0x16, "a TLS handshake record, not a plain request");
    }
}
