//! W3C trace context (`traceparent`, `tracestate`) as MAP carries it: in a message's `meta` and
//! in a request's `params._meta`. The router keeps it on the message (byte for byte, as all of
//! `meta`), stamps it on the events the message or request causes (`event._meta`), hands it to
//! supervised children (`TRACEPARENT`, `TRACESTATE`) and records it on its own tracing spans.

use std::sync::Arc;

use crate::protocol::json::RawJson;

/// A valid `traceparent` and the `tracestate` that came with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `version-traceid-parentid-flags`, as received.
    pub traceparent: Arc<str>,
    /// Vendor state, as received (only kept with a valid `traceparent`).
    pub tracestate: Option<Arc<str>>,
}

/// Longest `tracestate` kept (the W3C limit is 32 members of at most 256 bytes each).
pub const MAX_TRACESTATE: usize = 8192;

impl TraceContext {
    /// The context, when `traceparent` is valid (W3C Trace Context level 1). An invalid
    /// `traceparent` is not an error: it stays in the participant's JSON and is not propagated.
    pub fn new(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        if !valid_traceparent(traceparent) {
            return None;
        }
        Some(Self {
            traceparent: Arc::from(traceparent),
            tracestate: tracestate
                .filter(|s| {
                    s.len() <= MAX_TRACESTATE && s.chars().all(|c| (' '..='~').contains(&c))
                })
                .map(Arc::from),
        })
    }

    /// From a `meta` / `_meta` object's `traceparent` and `tracestate` members.
    pub fn from_meta(meta: &RawJson) -> Option<Self> {
        if !meta.get().contains("traceparent") {
            return None;
        }
        let parent = meta.str_member("traceparent")?;
        Self::new(&parent, meta.str_member("tracestate").as_deref())
    }

    /// The trace id (32 hex digits).
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// `{"traceparent":"…","tracestate":"…"}`, the `_meta` of the events it is stamped on.
    pub fn to_meta_json(&self) -> String {
        let mut out = String::with_capacity(80 + self.tracestate.as_ref().map_or(0, |s| s.len()));
        out.push_str("{\"traceparent\":");
        out.push_str(&json_string(&self.traceparent));
        if let Some(state) = &self.tracestate {
            out.push_str(",\"tracestate\":");
            out.push_str(&json_string(state));
        }
        out.push('}');
        out
    }
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// `traceparent` syntax: `vv-<32 hex>-<16 hex>-ff`, lowercase, version not `ff`, ids not all
/// zero; version `00` is exactly 55 characters, later versions may append `-…`.
pub fn valid_traceparent(s: &str) -> bool {
    let hex = |p: &str, n: usize| {
        p.len() == n
            && p.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let b = s.as_bytes();
    if s.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
        return false;
    }
    let (version, trace, parent, flags) = (&s[0..2], &s[3..35], &s[36..52], &s[53..55]);
    if !(hex(version, 2) && hex(trace, 32) && hex(parent, 16) && hex(flags, 2)) {
        return false;
    }
    if version == "ff" || trace.bytes().all(|c| c == b'0') || parent.bytes().all(|c| c == b'0') {
        return false;
    }
    match version {
        "00" => s.len() == 55,
        _ => s.len() == 55 || b[55] == b'-',
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn w3c_examples() {
        assert!(valid_traceparent(GOOD));
        assert!(!valid_traceparent(&GOOD.to_uppercase()));
        assert!(!valid_traceparent(
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
        ));
        assert!(!valid_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"
        ));
        assert!(!valid_traceparent(
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(!valid_traceparent(&format!("{GOOD}-extra")));
        assert!(valid_traceparent(&format!("01{}-future", &GOOD[2..])));
        assert!(!valid_traceparent("00-4bf92f35"));
        assert!(!valid_traceparent(""));
    }

    #[test]
    fn from_meta_and_back() {
        let meta = RawJson::from_text(format!(
            r#"{{"x":1,"traceparent":"{GOOD}","tracestate":"rojo=00f067aa0ba902b7"}}"#
        ))
        .unwrap();
        let t = TraceContext::from_meta(&meta).unwrap();
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(
            t.to_meta_json(),
            format!(r#"{{"traceparent":"{GOOD}","tracestate":"rojo=00f067aa0ba902b7"}}"#)
        );
        let bad = RawJson::from_text(r#"{"traceparent":"nope"}"#).unwrap();
        assert!(TraceContext::from_meta(&bad).is_none());
        let none = RawJson::from_text(r#"{"x":1}"#).unwrap();
        assert!(TraceContext::from_meta(&none).is_none());
    }
}
