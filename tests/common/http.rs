//! A tiny HTTP/1.1 client and Server-Sent-Events reader over `TcpStream`, for the HTTP + SSE
//! transport tests (one request per connection, `Connection: close`; SSE bodies de-chunked and
//! parsed incrementally).

#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::*;

// ---------------------------------------------------------------------------------------------
// A tiny HTTP/1.1 client.

#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn headers_named(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn token(&self) -> Option<String> {
        self.header("map-session").map(str::to_owned)
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Status line and headers of a response head (without the blank line).
pub fn parse_head(head: &[u8]) -> (u16, Vec<(String, String)>) {
    let head = std::str::from_utf8(head).expect("ASCII head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l.split_once(':').expect("header line");
            (k.trim().to_owned(), v.trim().to_owned())
        })
        .collect();
    (status, headers)
}

/// Moves complete chunks from `raw` into `out`; returns true once the last chunk was seen.
pub fn dechunk(raw: &mut Vec<u8>, out: &mut Vec<u8>) -> bool {
    loop {
        let Some(line_end) = find(raw, b"\r\n") else {
            return false;
        };
        let size_text = std::str::from_utf8(&raw[..line_end]).expect("chunk size");
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
            .unwrap_or_else(|_| panic!("bad chunk size {size_text:?}"));
        if size == 0 {
            return true;
        }
        let start = line_end + 2;
        if raw.len() < start + size + 2 {
            return false;
        }
        out.extend_from_slice(&raw[start..start + size]);
        raw.drain(..start + size + 2);
    }
}

/// Sends one request and reads the whole response (the server closes after it).
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    request_from(None, addr, method, path, headers, body).await
}

/// [`request`] from a chosen local address (another loopback address is another client IP to
/// the server's per-IP limits).
pub async fn request_from(
    from: Option<IpAddr>,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    with_timeout(async {
        let mut s = connect_from(from, addr, None).await;
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).await.expect("write head");
        s.write_all(body).await.expect("write body");
        read_response(&mut s).await
    })
    .await
}

/// A TCP connection to `addr`, from `from` if given, with a receive buffer of `rcvbuf` bytes if
/// given (a small one makes a slow reader).
pub async fn connect_from(
    from: Option<IpAddr>,
    addr: SocketAddr,
    rcvbuf: Option<u32>,
) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    if let Some(size) = rcvbuf {
        socket.set_recv_buffer_size(size).expect("SO_RCVBUF");
    }
    if let Some(ip) = from {
        socket
            .bind(SocketAddr::new(ip, 0))
            .expect("bind a loopback address");
    }
    socket.connect(addr).await.expect("connect")
}

/// Reads one response to the end of the connection (`Connection: close`), its body de-chunked.
/// A connection the server resets after answering still yields what arrived.
pub async fn read_response(s: &mut TcpStream) -> HttpResponse {
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw).await;
    let split = find(&raw, b"\r\n\r\n").expect("a complete response head");
    let (status, headers) = parse_head(&raw[..split]);
    let mut rest = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    let body = if chunked {
        let mut out = Vec::new();
        assert!(dechunk(&mut rest, &mut out), "complete chunked body");
        out
    } else {
        rest
    };
    HttpResponse {
        status,
        headers,
        body,
    }
}

// ---------------------------------------------------------------------------------------------
// An SSE reader.

#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: Option<u64>,
    pub event: String,
    pub data: String,
}

impl SseEvent {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("data is not JSON ({e}): {}", self.data))
    }
}

pub struct Sse {
    pub socket: TcpStream,
    pub raw: Vec<u8>,
    pub text: Vec<u8>,
    pub chunked: bool,
    pub ended: bool,
}

impl Sse {
    /// `GET /map/events` with the token and an optional `Last-Event-ID`; asserts 200.
    pub async fn open(addr: SocketAddr, token: &str, last_event_id: Option<u64>) -> Self {
        let (status, headers, sse) = Self::try_open(addr, token, last_event_id).await;
        assert_eq!(status, 200, "event stream opens");
        let ct = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            .map(|(_, v)| v.as_str());
        assert_eq!(ct, Some("text/event-stream"));
        sse
    }

    /// POSTs `body` to `path` with `headers` (and `Accept: text/event-stream`): the status,
    /// the head and the reader of what follows (an A2A stream).
    pub async fn post(
        addr: SocketAddr,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, Vec<(String, String)>, Self) {
        let mut head = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        head.push_str(body);
        Self::send(addr, &head).await
    }

    pub async fn try_open(
        addr: SocketAddr,
        token: &str,
        last_event_id: Option<u64>,
    ) -> (u16, Vec<(String, String)>, Self) {
        let mut req = format!(
            "GET /map/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\nMAP-Session: {token}\r\n"
        );
        if let Some(n) = last_event_id {
            req.push_str(&format!("Last-Event-ID: {n}\r\n"));
        }
        req.push_str("\r\n");
        Self::send(addr, &req).await
    }

    /// Sends `req` (a whole request) and reads the response's head.
    async fn send(addr: SocketAddr, req: &str) -> (u16, Vec<(String, String)>, Self) {
        with_timeout(async {
            let mut socket = TcpStream::connect(addr).await.expect("connect");
            socket.write_all(req.as_bytes()).await.expect("write");
            let mut raw = Vec::new();
            let split = loop {
                if let Some(i) = find(&raw, b"\r\n\r\n") {
                    break i;
                }
                let mut buf = [0u8; 4096];
                let n = socket.read(&mut buf).await.expect("read head");
                assert!(n > 0, "connection closed before the response head");
                raw.extend_from_slice(&buf[..n]);
            };
            let (status, headers) = parse_head(&raw[..split]);
            let chunked = headers.iter().any(|(k, v)| {
                k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
            });
            raw.drain(..split + 4);
            let mut sse = Self {
                socket,
                raw,
                text: Vec::new(),
                chunked,
                ended: false,
            };
            sse.decode();
            (status, headers, sse)
        })
        .await
    }

    pub fn decode(&mut self) {
        if self.chunked {
            if dechunk(&mut self.raw, &mut self.text) {
                self.ended = true;
            }
        } else {
            self.text.append(&mut self.raw);
        }
    }

    /// The next complete event in the buffer (comment-only blocks are skipped).
    pub fn parse_buffered(&mut self) -> Option<SseEvent> {
        loop {
            let end = find(&self.text, b"\n\n")?;
            let block: Vec<u8> = self.text.drain(..end + 2).collect();
            let block = String::from_utf8(block).expect("UTF-8 stream");
            let mut ev = SseEvent {
                id: None,
                event: "message".into(),
                data: String::new(),
            };
            let mut fields = 0;
            let mut data_lines = Vec::new();
            for line in block.lines() {
                if line.is_empty() || line.starts_with(':') {
                    continue;
                }
                let (name, value) = line.split_once(':').unwrap_or((line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value);
                fields += 1;
                match name {
                    "id" => ev.id = Some(value.parse().expect("numeric id")),
                    "event" => ev.event = value.to_owned(),
                    "data" => data_lines.push(value.to_owned()),
                    other => panic!("unexpected SSE field {other:?}"),
                }
            }
            if fields > 0 {
                ev.data = data_lines.join("\n");
                return Some(ev);
            }
        }
    }

    /// The next event, or `None` when the server ended the stream.
    pub async fn next_or_end(&mut self) -> Option<SseEvent> {
        with_timeout(self.next_unbounded()).await
    }

    pub async fn next_unbounded(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(ev) = self.parse_buffered() {
                return Some(ev);
            }
            if self.ended {
                return None;
            }
            let mut buf = [0u8; 8192];
            let n = self.socket.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                self.ended = true;
                continue;
            }
            self.raw.extend_from_slice(&buf[..n]);
            self.decode();
        }
    }

    pub async fn next(&mut self) -> SseEvent {
        self.next_or_end()
            .await
            .expect("an event, not the end of the stream")
    }

    /// Asserts that nothing arrives for [`QUIET`].
    pub async fn assert_quiet(&mut self) {
        if let Ok(ev) = tokio::time::timeout(QUIET, self.next_unbounded()).await {
            panic!("unexpected {ev:?}");
        }
    }

    /// Reads events until the stream ends; returns them.
    pub async fn until_end(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        while let Some(ev) = self.next_or_end().await {
            out.push(ev);
        }
        out
    }
}

pub fn rpc(id: u64, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

pub async fn post(addr: SocketAddr, token: Option<&str>, body: &str) -> HttpResponse {
    match token {
        Some(t) => {
            request(
                addr,
                "POST",
                "/map/rpc",
                &[("Content-Type", "application/json"), ("MAP-Session", t)],
                body.as_bytes(),
            )
            .await
        }
        None => {
            request(
                addr,
                "POST",
                "/map/rpc",
                &[("Content-Type", "application/json")],
                body.as_bytes(),
            )
            .await
        }
    }
}
