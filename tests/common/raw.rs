//! [`Raw`]: a WebSocket participant that writes and reads exact text: what it compares is
//! never parsed first (tests/byte_exact.rs, tests/federation.rs).

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::with_timeout;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A WebSocket participant that writes and reads exact text.
pub struct Raw {
    ws: Ws,
    next_id: u64,
}

impl Raw {
    pub async fn connect(url: &str, connect_params: &str) -> Self {
        let (ws, _) = with_timeout(tokio_tungstenite::connect_async(url))
            .await
            .expect("connect");
        let mut raw = Self { ws, next_id: 0 };
        let answer = raw.call("map/connect", connect_params).await;
        assert!(answer.contains("\"sessionId\""), "{answer}");
        raw
    }

    pub async fn send(&mut self, text: String) {
        with_timeout(self.ws.send(WsMessage::Text(text.into())))
            .await
            .expect("send");
    }

    /// The next text frame, as text.
    pub async fn next_text(&mut self) -> String {
        loop {
            match with_timeout(self.ws.next()).await {
                Some(Ok(WsMessage::Text(t))) => return t.as_str().to_owned(),
                Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_))) => continue,
                other => panic!("no text frame: {other:?}"),
            }
        }
    }

    /// Sends a request with `params` written exactly as given; returns the response's text
    /// (notifications that arrive first are skipped: this client keeps no queue).
    pub async fn call(&mut self, method: &str, params: &str) -> String {
        self.next_id += 1;
        let id = self.next_id;
        self.send(format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#
        ))
        .await;
        let prefix = format!(r#"{{"jsonrpc":"2.0","id":{id},"#);
        for _ in 0..1000 {
            let t = self.next_text().await;
            if t.starts_with(&prefix) {
                assert!(!t.contains(r#""error":"#), "{method} failed: {t}");
                return t;
            }
        }
        panic!("no answer to {method}");
    }

    /// The next frame whose text contains `needle`.
    pub async fn frame_with(&mut self, needle: &str) -> String {
        for _ in 0..1000 {
            let t = self.next_text().await;
            if t.contains(needle) {
                return t;
            }
        }
        panic!("no frame with {needle}");
    }

    /// Asserts no `map/message` arrives within a short quiet period.
    pub async fn assert_no_message(&mut self) {
        let quiet = Duration::from_millis(300);
        if let Ok(Some(Ok(WsMessage::Text(t)))) = tokio::time::timeout(quiet, self.ws.next()).await
        {
            assert!(!t.contains("map/message"), "unexpected message: {t}");
        }
    }
}
