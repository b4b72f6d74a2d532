//! What a supervised child was answered: the last JSON-RPC error the router sent it, named by
//! the method of the request it answered, so that a spawn that fails (the child exits, or never
//! registers) can say why (`map/agents/register → 1003 Permission denied: ...`) instead of only
//! that it timed out.
//!
//! The keeper's connection taps both directions of the child's pipes: requests going in
//! ([`Trace::request`]: their ids and methods, the last [`REMEMBERED`] only) and answers going
//! out ([`Trace::answer`]). Nothing here changes a frame; a line that cannot be read is ignored.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::value::RawValue;

/// How many recent request ids (with their methods) are remembered to name an error answer.
pub const REMEMBERED: usize = 16;

#[derive(Debug, Default)]
struct State {
    /// `(id as raw JSON text, method)`, newest last.
    requests: VecDeque<(String, String)>,
    last_error: Option<String>,
}

/// A child's recent requests and the last error it was answered (shared, cheap to clone).
#[derive(Debug, Default, Clone)]
pub struct Trace(Arc<Mutex<State>>);

#[derive(Deserialize)]
struct RequestHead<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    method: Option<String>,
}

#[derive(Deserialize)]
struct ErrorBody {
    code: i64,
    message: String,
}

#[derive(Deserialize)]
struct AnswerHead<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    error: Option<ErrorBody>,
}

impl Trace {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        crate::sync::lock(&self.0)
    }

    /// A line the child sent (a request, a notification, an answer or a batch).
    pub fn request(&self, line: &str) {
        let Ok(head) = serde_json::from_str::<RequestHead<'_>>(line) else {
            return;
        };
        let (Some(id), Some(method)) = (head.id, head.method) else {
            return;
        };
        let mut state = self.state();
        if state.requests.len() == REMEMBERED {
            state.requests.pop_front();
        }
        state.requests.push_back((id.get().to_owned(), method));
    }

    /// A frame the router sent the child.
    pub fn answer(&self, frame: &str) {
        // Cheap test first: most frames are results, messages and events.
        if !frame.contains("\"error\"") {
            return;
        }
        let Ok(head) = serde_json::from_str::<AnswerHead<'_>>(frame) else {
            return;
        };
        let Some(error) = head.error else { return };
        let mut state = self.state();
        let method = head.id.and_then(|id| {
            state
                .requests
                .iter()
                .rev()
                .find(|(known, _)| known == id.get())
                .map(|(_, m)| m.clone())
        });
        state.last_error = Some(match method {
            Some(m) => format!("{m} → {} {}", error.code, error.message),
            None => format!("{} {}", error.code, error.message),
        });
    }

    /// The last error answer, as `method → code message`.
    pub fn last_error(&self) -> Option<String> {
        self.state().last_error.clone()
    }

    /// Forgets everything (a restarted process starts afresh).
    pub fn clear(&self) {
        *self.state() = State::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_answer_is_named_by_its_request() {
        let t = Trace::default();
        t.request(r#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{}}"#);
        t.request(r#"{"jsonrpc":"2.0","id":"r2","method":"map/agents/register"}"#);
        t.answer(r#"{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}}"#);
        assert_eq!(t.last_error(), None);
        t.answer(r#"{"jsonrpc":"2.0","id":"r2","error":{"code":1003,"message":"Permission denied: lifecycle.canRegister"}}"#);
        assert_eq!(
            t.last_error().as_deref(),
            Some("map/agents/register → 1003 Permission denied: lifecycle.canRegister")
        );
        // An answer to an unknown id (or a parse error, id null) still counts.
        t.answer(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#);
        assert_eq!(t.last_error().as_deref(), Some("-32700 Parse error"));
        // Messages that merely mention "error" in a payload are not answers.
        t.answer(r#"{"jsonrpc":"2.0","method":"map/message","params":{"payload":{"error":1}}}"#);
        assert_eq!(t.last_error().as_deref(), Some("-32700 Parse error"));
        t.clear();
        assert_eq!(t.last_error(), None);
    }

    #[test]
    fn only_recent_requests_are_remembered() {
        let t = Trace::default();
        for i in 0..(REMEMBERED + 4) {
            t.request(&format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"m{i}"}}"#));
        }
        t.answer(r#"{"jsonrpc":"2.0","id":0,"error":{"code":1,"message":"old"}}"#);
        assert_eq!(t.last_error().as_deref(), Some("1 old"));
        let last = REMEMBERED + 3;
        t.answer(&format!(
            r#"{{"jsonrpc":"2.0","id":{last},"error":{{"code":2,"message":"new"}}}}"#
        ));
        assert_eq!(t.last_error(), Some(format!("m{last} → 2 new")));
    }
}
