//! W3C trace context across the gateways' edges (docs/trace-context.md, "Gateways").
//!
//! Owns the one reading of a caller's context from HTTP headers ([`from_headers`]) and the ways
//! a gateway passes it on: as `meta.traceparent` / `meta.tracestate` of the MAP message it sends
//! for the request ([`insert_meta`]), as `params._meta` of the MAP calls it makes for the
//! request ([`with_meta`], [`with_meta_text`]), and as headers of its own outbound HTTP calls
//! ([`headers`]), whose context is the router's span of the delivered message when the
//! `map/message` frame names one, else the message's own ([`of_delivery`], [`traced`]).
//!
//! Only a context [`TraceContext::new`] accepts is carried; anything else (malformed, two
//! `traceparent` headers, not ASCII) is ignored, never refused. Values are written as JSON
//! strings by serde, so a header cannot add members to the JSON it is written into. The
//! context is the request's alone: it is read per request and never kept on a caller's
//! session, so it cannot reach another request's message.

use axum::http::HeaderMap;
use futures::{Stream, StreamExt};
use serde_json::{Map, Value};

use crate::client::Messages;
use crate::protocol::message::Message;
use crate::protocol::trace::TraceContext;

/// The caller's context: exactly one valid `traceparent` header, and the `tracestate` headers
/// (joined with `,` as HTTP combines them) when it has any.
pub fn from_headers(headers: &HeaderMap) -> Option<TraceContext> {
    let mut parents = headers.get_all("traceparent").iter();
    let parent = parents.next()?;
    if parents.next().is_some() {
        return None;
    }
    let parent = parent.to_str().ok()?;
    let states: Vec<&str> = headers
        .get_all("tracestate")
        .iter()
        .map(|v| v.to_str().ok())
        .collect::<Option<_>>()?;
    let state = (!states.is_empty()).then(|| states.join(","));
    TraceContext::new(parent.trim(), state.as_deref())
}

/// Puts `trace` into a message's `meta` (`traceparent`, and `tracestate` when it has one).
pub fn insert_meta(meta: &mut Map<String, Value>, trace: Option<&TraceContext>) {
    let Some(t) = trace else { return };
    meta.insert("traceparent".into(), Value::from(&*t.traceparent));
    if let Some(s) = &t.tracestate {
        meta.insert("tracestate".into(), Value::from(&**s));
    }
}

/// `params` (an object) with `trace` as its `_meta` (merged into one it has).
pub fn with_meta(mut params: Value, trace: Option<&TraceContext>) -> Value {
    let Some(t) = trace else { return params };
    if let Some(p) = params.as_object_mut() {
        let entry = p
            .entry("_meta")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(m) = entry.as_object_mut() {
            insert_meta(m, Some(t));
        }
    }
    params
}

/// [`with_meta`] for params as JSON text (an object without `_meta`, as the gateways write
/// them): the other members keep their bytes.
pub fn with_meta_text(params: String, trace: Option<&TraceContext>) -> String {
    let Some(t) = trace else { return params };
    let Some(rest) = params.trim_start().strip_prefix('{') else {
        return params;
    };
    let meta = t.to_meta_json();
    if rest.trim_start().starts_with('}') {
        format!("{{\"_meta\":{meta}{rest}")
    } else {
        format!("{{\"_meta\":{meta},{rest}")
    }
}

/// The headers of an outbound call made with `trace`.
pub fn headers(trace: Option<&TraceContext>) -> Vec<(&'static str, String)> {
    let Some(t) = trace else { return Vec::new() };
    let mut out = vec![("traceparent", t.traceparent.to_string())];
    if let Some(s) = &t.tracestate {
        out.push(("tracestate", s.to_string()));
    }
    out
}

/// The context a call made for a delivered `message` runs in: the router's span of the
/// delivery (the `map/message` frame's `params._meta`, when the router exports traces), else
/// the message's own `meta.traceparent`.
pub fn of_delivery(frame: Option<&TraceContext>, message: &Message) -> Option<TraceContext> {
    frame
        .cloned()
        .or_else(|| message.meta.as_ref().and_then(TraceContext::from_meta))
}

/// `messages` with the trace context of each delivery's frame beside each message
/// ([`Messages::delivered_trace`]).
pub fn traced(messages: Messages) -> impl Stream<Item = (Message, Option<TraceContext>)> {
    futures::stream::unfold(messages, |mut m| async move {
        let message = m.next().await?;
        let trace = m.delivered_trace().cloned();
        Some(((message, trace), m))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn map(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn headers_are_read_strictly() {
        let t = from_headers(&map(&[("traceparent", TP), ("tracestate", "a=1")])).unwrap();
        assert_eq!(
            (&*t.traceparent, t.tracestate.as_deref()),
            (TP, Some("a=1"))
        );
        let t = from_headers(&map(&[
            ("traceparent", TP),
            ("tracestate", "a=1"),
            ("tracestate", "b=2"),
        ]))
        .unwrap();
        assert_eq!(t.tracestate.as_deref(), Some("a=1,b=2"));
        assert!(from_headers(&map(&[("traceparent", TP), ("traceparent", TP)])).is_none());
        assert!(from_headers(&map(&[("traceparent", &format!("{TP}\"}}"))])).is_none());
        assert!(from_headers(&map(&[("tracestate", "a=1")])).is_none());
        assert!(from_headers(&HeaderMap::new()).is_none());
    }

    #[test]
    fn meta_and_params() {
        let t = TraceContext::new(TP, Some("a=\"}")).unwrap();
        let mut m = Map::new();
        insert_meta(&mut m, Some(&t));
        assert_eq!(m["tracestate"], "a=\"}");
        let p = with_meta(
            serde_json::json!({"x": 1, "_meta": {"causedBy": []}}),
            Some(&t),
        );
        assert_eq!(p["_meta"]["traceparent"], TP);
        assert_eq!(p["_meta"]["causedBy"], serde_json::json!([]));
        let text = with_meta_text(r#"{"task":{"id":"t"}}"#.into(), Some(&t));
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["_meta"]["tracestate"], "a=\"}");
        assert_eq!(v["task"]["id"], "t");
        let empty: Value = serde_json::from_str(&with_meta_text("{}".into(), Some(&t))).unwrap();
        assert_eq!(empty["_meta"]["traceparent"], TP);
        assert_eq!(with_meta_text("{}".into(), None), "{}");
        assert_eq!(headers(Some(&t)).len(), 2);
        assert!(headers(None).is_empty());
    }
}
