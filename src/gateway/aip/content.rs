//! AIP content and MAP payloads, both ways.
//!
//! A list of `ContentItem`s is the MAP payload `{"parts": [...]}`, one part per item, in order:
//! `{"kind": "text", "text": ...}`, or `{"kind": "image" | "audio" | "embedded", "bytes":
//! <standard base64>}`. Bytes survive the round trip exactly (base64 is lossless, the text is
//! JSON-escaped and unescaped). A payload that MAP agents wrote another way is read leniently
//! ([`items`]): a string is one text item, a `parts` list as above (A2A's `data` and `file`
//! parts too), anything else one text item holding its JSON text.
//!
//! Owns nothing.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::{json, Value};

use super::proto::content_item::Data;
use super::proto::ContentItem;

/// The MAP parts of `items`.
pub fn parts(items: &[ContentItem]) -> Vec<Value> {
    items
        .iter()
        .filter_map(|item| {
            Some(match item.data.as_ref()? {
                Data::Text(t) => json!({ "kind": "text", "text": t }),
                Data::Image(b) => json!({ "kind": "image", "bytes": STANDARD.encode(b) }),
                Data::Audio(b) => json!({ "kind": "audio", "bytes": STANDARD.encode(b) }),
                Data::Embedded(b) => json!({ "kind": "embedded", "bytes": STANDARD.encode(b) }),
            })
        })
        .collect()
}

/// The MAP payload of `items`: `{"parts": [...]}`.
pub fn payload(items: &[ContentItem]) -> Value {
    json!({ "parts": parts(items) })
}

fn text(t: impl Into<String>) -> ContentItem {
    ContentItem {
        data: Some(Data::Text(t.into())),
    }
}

fn bytes_of(part: &Value) -> Option<Vec<u8>> {
    let b64 = part
        .get("bytes")
        .or_else(|| part.get("file").and_then(|f| f.get("bytes")))?
        .as_str()?;
    STANDARD.decode(b64).ok()
}

/// One part as an item (`None`: a part of no kind we know, or bytes that are not base64).
fn item(part: &Value) -> Option<ContentItem> {
    let kind = part.get("kind").and_then(Value::as_str).unwrap_or("text");
    let data = match kind {
        "text" => Data::Text(part.get("text")?.as_str()?.to_owned()),
        "image" => Data::Image(bytes_of(part)?),
        "audio" => Data::Audio(bytes_of(part)?),
        "embedded" | "file" => Data::Embedded(bytes_of(part)?),
        "data" => Data::Text(part.get("data")?.to_string()),
        _ => return None,
    };
    Some(ContentItem { data: Some(data) })
}

/// The items of a MAP payload (module docs).
pub fn items(payload: Option<&Value>) -> Vec<ContentItem> {
    match payload {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![text(s.clone())],
        Some(v) => match v.get("parts").and_then(Value::as_array) {
            Some(parts) => parts.iter().filter_map(item).collect(),
            None => vec![text(v.to_string())],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_round_trip_byte_exactly() {
        let all: Vec<u8> = (0..=255).collect();
        let given = vec![
            text("héllo \u{0} \"q\""),
            ContentItem {
                data: Some(Data::Image(all.clone())),
            },
            ContentItem {
                data: Some(Data::Audio(vec![])),
            },
            ContentItem {
                data: Some(Data::Embedded(all)),
            },
        ];
        let wire = serde_json::to_string(&payload(&given)).unwrap();
        let back: Value = serde_json::from_str(&wire).unwrap();
        assert_eq!(items(Some(&back)), given);
    }

    #[test]
    fn lenient_payloads() {
        assert_eq!(items(Some(&json!("hi"))), vec![text("hi")]);
        assert_eq!(items(Some(&json!({"a": 1}))), vec![text("{\"a\":1}")]);
        assert!(items(None).is_empty());
    }
}
