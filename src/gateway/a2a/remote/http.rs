//! The gateway's HTTP client for remote A2A agents: `GET` a card, `POST` a JSON-RPC call, read an
//! SSE stream. Plain `http://` only (see `docs/a2a.md`, "Calling remote A2A agents").
//!
//! Owns nothing but the timeouts and size caps of these calls, the SSE reading, and the words of
//! a failure: the request itself goes through the gateways' one outbound client
//! (`gateway::egress::client`, one HTTP/1.1 connection per call).
//!
//! Where it may connect is not its decision: a [`Target`] is made only from a URL that passed
//! an allow-list (`gateway::egress`), and the client connects through [`egress::connect`] (the
//! host resolved once, its addresses judged, a judged address connected to).
//!
//! Every wait is bounded: connecting ([`CONNECT_TIMEOUT`]), the response head
//! ([`RESPONSE_TIMEOUT`]), a whole JSON body ([`RESPONSE_TIMEOUT`]), and the silence between two
//! stream frames ([`STREAM_IDLE_TIMEOUT`]); a card, all of it, within [`CARD_TIMEOUT`].
//!
//! What a failure says: nothing the remote sent back but its status code. A refused
//! connection, a connect timeout and an answer that never began are one
//! [`HttpError::Unreachable`] ("remote unreachable"), so an answer cannot be used to tell an
//! open port from a closed one; an error body is never echoed (the details are logged).

use std::time::Duration;

use axum::http::Method;
use bytes::Bytes;

use crate::gateway::egress::client::{self, Body, ClientError, Response, Waits};
use crate::gateway::egress::{self, AllowList, Allowed, EgressError};

/// Longest wait for the TCP connection: a loopback or LAN agent answers in milliseconds; a
/// card URL that nobody serves should fail fast and clearly.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for a response head and a whole JSON body. A blocking `SendMessage` waits for
/// the remote task to finish, so this is generous.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest a card fetch may take in all (the registering caller waits for it).
pub const CARD_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest silence between two frames of an SSE stream before the call is given up.
pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Largest JSON body (a JSON-RPC answer) and largest single SSE event read.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Largest card: a card is a name, a few interfaces and skills; what it holds is kept in memory
/// and in the MAP agent's metadata for as long as the remote is registered.
pub const MAX_CARD_BYTES: usize = 256 * 1024;

/// Why an HTTP exchange with a remote agent failed (the text is what the MAP sender, or the
/// registering caller, reads: our words, never the remote's body).
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
    /// The URL, or the address its host has, is not one this router calls.
    #[error("{0}")]
    NotAllowed(String),
    /// No connection, or no answer began: one text for a refused connection, a timeout and an
    /// unknown host.
    #[error("{url}: remote unreachable")]
    Unreachable {
        /// The URL.
        url: String,
    },
    /// A wait ran out after the answer began.
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

/// An `http://` URL that passed an allow-list (normalised).
#[derive(Debug, Clone)]
pub struct Target {
    allowed: Allowed,
}

/// Checks a configured `[[a2a.remote]]` card URL: `http://` with a host.
///
/// # Errors
/// Why it is not one.
pub fn check_configured(url: &str) -> Result<(), HttpError> {
    let list = AllowList::origin_of(url).map_err(|why| HttpError::Url {
        url: url.to_owned(),
        why,
    })?;
    Target::check(&list, url).map(drop)
}

impl Target {
    /// `url` when `list` allows it and it is `http://`.
    ///
    /// # Errors
    /// [`HttpError::Url`] for a malformed or `https://` URL, [`HttpError::NotAllowed`] for one
    /// outside `list`.
    pub fn check(list: &AllowList, url: &str) -> Result<Self, HttpError> {
        let parsed = url::Url::parse(url).map_err(|e| HttpError::Url {
            url: url.to_owned(),
            why: e.to_string(),
        })?;
        Self::check_url(list, parsed)
    }

    /// [`Target::check`] of a parsed URL.
    ///
    /// # Errors
    /// As [`Target::check`].
    pub fn check_url(list: &AllowList, url: url::Url) -> Result<Self, HttpError> {
        let text = url.as_str().to_owned();
        let bad = |why: &str| HttpError::Url {
            url: text.clone(),
            why: why.to_owned(),
        };
        match url.scheme() {
            "http" => {}
            "https" => {
                return Err(bad(
                    "https:// remote agents are not supported yet (plain http only)",
                ))
            }
            _ => return Err(bad("not an absolute http:// URL")),
        }
        let allowed = list.check_parsed(url).map_err(|e| match e {
            egress::Refusal::Malformed(why) => bad(&why),
            e @ egress::Refusal::NotAllowed(_) => {
                HttpError::NotAllowed(format!("{text}: {e} ([a2a] remote_allow)"))
            }
        })?;
        Ok(Self { allowed })
    }

    /// Whether its host has an address the router may call (one lookup; the call itself looks
    /// again and connects to what it judged).
    ///
    /// # Errors
    /// [`HttpError::NotAllowed`] when every address is one the router does not call.
    pub async fn check_addresses(&self) -> Result<(), HttpError> {
        match tokio::time::timeout(CONNECT_TIMEOUT, egress::resolve(&self.allowed)).await {
            Ok(Err(e @ EgressError::Forbidden)) => {
                Err(HttpError::NotAllowed(format!("{}: {e}", self.url())))
            }
            // Unresolvable now is not a reason to refuse: the call will say unreachable.
            _ => Ok(()),
        }
    }

    /// The URL, normalised.
    pub fn url(&self) -> String {
        self.allowed.as_str().to_owned()
    }

    /// Resolves `other` (absolute, or relative to this URL), unchecked.
    ///
    /// # Errors
    /// [`HttpError::Url`].
    pub fn join(&self, other: &str) -> Result<url::Url, HttpError> {
        self.allowed.url().join(other).map_err(|e| HttpError::Url {
            url: other.to_owned(),
            why: e.to_string(),
        })
    }

    fn err(&self, why: impl std::fmt::Display) -> HttpError {
        HttpError::Protocol {
            url: self.url(),
            why: why.to_string(),
        }
    }

    fn unreachable(&self) -> HttpError {
        HttpError::Unreachable { url: self.url() }
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

/// What the one client's failure says about `target`, in this module's words.
fn from_client(target: &Target, e: ClientError) -> HttpError {
    match e {
        ClientError::Forbidden(e) => HttpError::NotAllowed(format!("{}: {e}", target.url())),
        ClientError::Unreachable => target.unreachable(),
        ClientError::BodyTimeout(after) => target.timeout("the body", after),
        ClientError::Idle(after) => target.timeout("the next stream event", after),
        e @ (ClientError::Request(_) | ClientError::Body(_)) => target.err(e),
        ClientError::Stream(why) => target.err(format!("the stream broke: {why}")),
    }
}

/// One request to `target` on the gateway's client; the response once its head has arrived.
async fn exchange(
    target: &Target,
    method: Method,
    headers: Headers<'_>,
    body: Option<String>,
    head_timeout: Duration,
) -> Result<Response, HttpError> {
    let body = body.map(|b| Body {
        bytes: Bytes::from(b),
        content_type: "application/json",
    });
    let waits = Waits {
        connect: CONNECT_TIMEOUT,
        head: head_timeout,
    };
    client::send(&target.allowed, method, headers, body, waits)
        .await
        .map_err(|e| from_client(target, e))
}

async fn read_body(
    target: &Target,
    response: Response,
    max: usize,
    deadline: Duration,
) -> Result<Bytes, HttpError> {
    response
        .body(max, deadline)
        .await
        .map_err(|e| from_client(target, e))
}

/// `GET url` of a card, expecting a JSON body with a 2xx status, all within [`CARD_TIMEOUT`]
/// and at most [`MAX_CARD_BYTES`].
///
/// # Errors
/// Unreachable, a status other than 2xx (its body is not read), a body that is too large or
/// too slow.
pub async fn get_card(target: &Target, headers: Headers<'_>) -> Result<Bytes, HttpError> {
    let fetch = async {
        let response = exchange(target, Method::GET, headers, None, CARD_TIMEOUT).await?;
        let status = response.status();
        if !status.is_success() {
            return Err(target.err(format!("answered HTTP {}", status.as_u16())));
        }
        read_body(target, response, MAX_CARD_BYTES, CARD_TIMEOUT).await
    };
    tokio::time::timeout(CARD_TIMEOUT, fetch)
        .await
        .unwrap_or_else(|_| Err(target.timeout("the card", CARD_TIMEOUT)))
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
    let response = exchange(target, Method::POST, &all, Some(body), RESPONSE_TIMEOUT).await?;
    let status = response.status();
    let is_sse = response
        .content_type()
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if is_sse && status.is_success() {
        return Ok(Answer::Stream(EventStream {
            target: target.clone(),
            body: Box::new(response),
            buffer: Vec::new(),
        }));
    }
    let bytes = read_body(target, response, MAX_BODY_BYTES, RESPONSE_TIMEOUT).await?;
    // JSON-RPC errors may come with an HTTP error status: keep the body when it is JSON; else
    // say the status, never the body.
    if !status.is_success() && serde_json::from_slice::<serde_json::Value>(&bytes).is_err() {
        return Err(target.err(format!("answered HTTP {}", status.as_u16())));
    }
    Ok(Answer::Json(bytes))
}

/// An SSE response, read event by event.
#[derive(Debug)]
pub struct EventStream {
    target: Target,
    /// Boxed: a response head is large, and an [`Answer`] is mostly JSON.
    body: Box<Response>,
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
            let chunk = self
                .body
                .next_chunk(STREAM_IDLE_TIMEOUT)
                .await
                .map_err(|e| from_client(&self.target, e))?;
            match chunk {
                None => {
                    // A last event without its blank line still counts.
                    if self.buffer.iter().any(|b| !b.is_ascii_whitespace()) {
                        self.buffer.extend_from_slice(b"\n\n");
                        continue;
                    }
                    return Ok(None);
                }
                Some(data) => self.buffer.extend_from_slice(&data),
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
        let list = AllowList::parse(&["http://127.0.0.1:9/".into()]).unwrap();
        assert!(Target::check(&list, "http://127.0.0.1:9/x").is_ok());
        assert!(Target::check(&list, "https://a.example/x")
            .unwrap_err()
            .to_string()
            .contains("not supported"));
        assert!(Target::check(&list, "ftp://a/x").is_err());
        assert!(Target::check(&list, "/relative").is_err());
        assert!(matches!(
            Target::check(&list, "http://127.0.0.1:10/x"),
            Err(HttpError::NotAllowed(_))
        ));
        let t = Target::check(&list, "http://127.0.0.1:9/.well-known/agent-card.json").unwrap();
        assert_eq!(t.join("/a2a").unwrap().as_str(), "http://127.0.0.1:9/a2a");
        assert_eq!(
            t.join("rpc").unwrap().as_str(),
            "http://127.0.0.1:9/.well-known/rpc"
        );
        assert!(check_configured("http://h:1/c").is_ok());
        assert!(check_configured("https://h/c").is_err());
    }

    #[test]
    fn event_ends() {
        assert_eq!(find_event_end(b"data: x\n\nrest"), Some((7, 2)));
        assert_eq!(find_event_end(b"data: x\r\n\r\n"), Some((7, 4)));
        assert_eq!(find_event_end(b"data: x\n"), None);
    }
}
