//! The gateway's HTTP client for remote A2A agents: `GET` a card, `POST` a JSON-RPC call, read an
//! SSE stream. Plain `http://` only (see `docs/a2a.md`, "Calling remote A2A agents").
//!
//! Owns nothing but the timeouts and size caps. One HTTP/1.1 connection per call, opened with
//! hyper's connection API (`hyper::client::conn::http1`): a remote agent gets few calls and a
//! stream holds its connection for its whole life, so a pool would buy little; hyper is already
//! the server's HTTP stack, so no second one is built.
//!
//! Every wait is bounded: connecting ([`CONNECT_TIMEOUT`]), the response head
//! ([`RESPONSE_TIMEOUT`]), a whole JSON body ([`RESPONSE_TIMEOUT`]), and the silence between two
//! stream frames ([`STREAM_IDLE_TIMEOUT`]).

use std::time::Duration;

use axum::http::{header, HeaderValue, Method, Request, Response, Uri};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

/// Longest wait for the TCP connection: a loopback or LAN agent answers in milliseconds; a
/// card URL that nobody serves should fail fast and clearly.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for a response head and a whole JSON body. A blocking `SendMessage` waits for
/// the remote task to finish, so this is generous.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest silence between two frames of an SSE stream before the call is given up.
pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Largest JSON body (card or JSON-RPC answer) and largest single SSE event read.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Why an HTTP exchange with a remote agent failed (the text is what the MAP sender reads).
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The URL is not one we can call.
    #[error("bad URL {url:?}: {why}")]
    Url {
        /// The URL.
        url: String,
        /// What is wrong.
        why: String,
    },
    /// No connection.
    #[error("cannot connect to {url}: {why}")]
    Connect {
        /// The URL.
        url: String,
        /// The cause.
        why: String,
    },
    /// A wait ran out.
    #[error("{what} from {url} took longer than {after:?}")]
    Timeout {
        /// The URL.
        url: String,
        /// What was awaited.
        what: &'static str,
        /// The bound.
        after: Duration,
    },
    /// The exchange broke, or the answer is not acceptable.
    #[error("{url}: {why}")]
    Protocol {
        /// The URL.
        url: String,
        /// What happened.
        why: String,
    },
}

/// A parsed `http://` URL.
#[derive(Debug, Clone)]
pub struct Target {
    uri: Uri,
    host: String,
    port: u16,
}

impl Target {
    /// Parses `url`; only `http://host[:port]/path` is accepted.
    ///
    /// # Errors
    /// [`HttpError::Url`].
    pub fn parse(url: &str) -> Result<Self, HttpError> {
        let bad = |why: &str| HttpError::Url {
            url: url.to_owned(),
            why: why.to_owned(),
        };
        let uri: Uri = url.parse().map_err(|e| bad(&format!("{e}")))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(bad(
                    "https:// remote agents are not supported yet (plain http only)",
                ))
            }
            _ => return Err(bad("not an absolute http:// URL")),
        }
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(80);
        Ok(Self { uri, host, port })
    }

    /// The URL as given.
    pub fn url(&self) -> String {
        self.uri.to_string()
    }

    /// Resolves `other` (absolute, or a path) against this URL.
    ///
    /// # Errors
    /// [`HttpError::Url`].
    pub fn join(&self, other: &str) -> Result<Self, HttpError> {
        if other.starts_with('/') {
            let authority = self.uri.authority().map(|a| a.as_str()).unwrap_or_default();
            Self::parse(&format!("http://{authority}{other}"))
        } else {
            Self::parse(other)
        }
    }

    fn err(&self, why: impl std::fmt::Display) -> HttpError {
        HttpError::Protocol {
            url: self.url(),
            why: why.to_string(),
        }
    }

    fn timeout(&self, what: &'static str, after: Duration) -> HttpError {
        HttpError::Timeout {
            url: self.url(),
            what,
            after,
        }
    }
}

/// Extra request headers (name, value).
pub type Headers<'a> = &'a [(&'static str, String)];

async fn exchange(
    target: &Target,
    method: Method,
    headers: Headers<'_>,
    body: Option<String>,
) -> Result<Response<Incoming>, HttpError> {
    let connect = tokio::net::TcpStream::connect((target.host.as_str(), target.port));
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| target.timeout("connecting", CONNECT_TIMEOUT))?
        .map_err(|e| HttpError::Connect {
            url: target.url(),
            why: e.to_string(),
        })?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| target.err(e))?;
    // The connection task ends when the response body is read or dropped and `sender` is gone.
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "a2a remote: connection ended");
        }
    });
    let path = target
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let authority = target
        .uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_default();
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, authority)
        .header(
            header::USER_AGENT,
            concat!("map-router/", env!("CARGO_PKG_VERSION")),
        );
    for (name, value) in headers {
        let value = HeaderValue::from_str(value).map_err(|e| target.err(e))?;
        request = request.header(*name, value);
    }
    let has_body = body.is_some();
    if has_body {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| target.err(e))?;
    tokio::time::timeout(RESPONSE_TIMEOUT, sender.send_request(request))
        .await
        .map_err(|_| target.timeout("the response", RESPONSE_TIMEOUT))?
        .map_err(|e| target.err(e))
}

async fn read_body(target: &Target, response: Response<Incoming>) -> Result<Bytes, HttpError> {
    let body = Limited::new(response.into_body(), MAX_BODY_BYTES);
    let collected = tokio::time::timeout(RESPONSE_TIMEOUT, body.collect())
        .await
        .map_err(|_| target.timeout("the body", RESPONSE_TIMEOUT))?
        .map_err(|e| target.err(format!("reading the body: {e}")))?;
    Ok(collected.to_bytes())
}

/// `GET url`, expecting a JSON body with status 200.
///
/// # Errors
/// Connection, timeout, a status other than 200, a body that is too large.
pub async fn get_json(target: &Target, headers: Headers<'_>) -> Result<Bytes, HttpError> {
    let response = exchange(target, Method::GET, headers, None).await?;
    let status = response.status();
    let body = read_body(target, response).await?;
    if !status.is_success() {
        return Err(target.err(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        )));
    }
    Ok(body)
}

/// What a JSON-RPC `POST` answered: one JSON body, or a stream of SSE `data` payloads.
#[derive(Debug)]
pub enum Answer {
    /// `application/json`: the whole body.
    Json(Bytes),
    /// `text/event-stream`.
    Stream(EventStream),
}

/// `POST url` with a JSON body. With `stream`, asks for `text/event-stream`; a server may still
/// answer with JSON (an error, typically).
///
/// # Errors
/// Connection, timeout, an HTTP error status whose body is not JSON, a too large body.
pub async fn post(
    target: &Target,
    headers: Headers<'_>,
    body: String,
    stream: bool,
) -> Result<Answer, HttpError> {
    let mut all: Vec<(&'static str, String)> = headers.to_vec();
    all.push((
        "accept",
        if stream {
            "text/event-stream".into()
        } else {
            "application/json".into()
        },
    ));
    let response = exchange(target, Method::POST, &all, Some(body)).await?;
    let status = response.status();
    let is_sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if is_sse && status.is_success() {
        return Ok(Answer::Stream(EventStream {
            target: target.clone(),
            body: response.into_body(),
            buffer: Vec::new(),
        }));
    }
    let bytes = read_body(target, response).await?;
    // JSON-RPC errors may come with an HTTP error status: keep the body when it is JSON.
    if !status.is_success() && serde_json::from_slice::<serde_json::Value>(&bytes).is_err() {
        return Err(target.err(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        )));
    }
    Ok(Answer::Json(bytes))
}

/// An SSE response, read event by event.
#[derive(Debug)]
pub struct EventStream {
    target: Target,
    body: Incoming,
    buffer: Vec<u8>,
}

impl EventStream {
    /// The next event's `data` (its `data:` lines joined by `\n`), `None` at the end of the
    /// stream. Events without data (comments, keep-alives) are skipped.
    ///
    /// # Errors
    /// The stream broke, stayed silent for [`STREAM_IDLE_TIMEOUT`], or sent an event larger
    /// than [`MAX_BODY_BYTES`].
    pub async fn next_data(&mut self) -> Result<Option<String>, HttpError> {
        loop {
            if let Some((end, skip)) = find_event_end(&self.buffer) {
                let event: Vec<u8> = self.buffer.drain(..end + skip).take(end).collect();
                let text = String::from_utf8_lossy(&event);
                let data: Vec<&str> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    continue;
                }
                return Ok(Some(data.join("\n")));
            }
            if self.buffer.len() > MAX_BODY_BYTES {
                return Err(self.target.err("an SSE event is too large"));
            }
            let frame = tokio::time::timeout(STREAM_IDLE_TIMEOUT, self.body.frame())
                .await
                .map_err(|_| {
                    self.target
                        .timeout("the next stream event", STREAM_IDLE_TIMEOUT)
                })?;
            match frame {
                None => {
                    // A last event without its blank line still counts.
                    if self.buffer.iter().any(|b| !b.is_ascii_whitespace()) {
                        self.buffer.extend_from_slice(b"\n\n");
                        continue;
                    }
                    return Ok(None);
                }
                Some(Err(e)) => return Err(self.target.err(format!("the stream broke: {e}"))),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

/// Where the first event of `buffer` ends (a blank line: `\n\n` or `\r\n\r\n`), and the length of
/// the separator.
fn find_event_end(buffer: &[u8]) -> Option<(usize, usize)> {
    let lf = buffer.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buffer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert!(Target::parse("http://127.0.0.1:9/x").is_ok());
        assert!(Target::parse("https://a.example/x")
            .unwrap_err()
            .to_string()
            .contains("not supported"));
        assert!(Target::parse("ftp://a/x").is_err());
        assert!(Target::parse("/relative").is_err());
        let t = Target::parse("http://127.0.0.1:9/.well-known/agent-card.json").unwrap();
        assert_eq!(t.join("/a2a").unwrap().url(), "http://127.0.0.1:9/a2a");
    }

    #[test]
    fn event_ends() {
        assert_eq!(find_event_end(b"data: x\n\nrest"), Some((7, 2)));
        assert_eq!(find_event_end(b"data: x\r\n\r\n"), Some((7, 4)));
        assert_eq!(find_event_end(b"data: x\n"), None);
    }
}
