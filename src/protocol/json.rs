//! [`RawJson`]: JSON that a participant supplied and the router passes on untouched (message
//! payloads and `meta`, addresses, `map/inject` content, agent and scope metadata).
//!
//! It keeps the exact text it arrived as (key order, number spelling such as `1.50` or `1e2`,
//! escapes, whitespace inside it), and serializing it writes that text back byte for byte: a
//! value goes through the router, the event log and a replay unchanged. It is parsed only where
//! something must read into it ([`RawJson::to_value`], [`RawJson::parse`]), and never
//! re-serialized. Cloning is cheap (a shared, immutable text).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

/// Verbatim JSON text (one valid JSON value). See the module docs.
#[derive(Clone)]
pub struct RawJson(Arc<RawValue>);

impl RawJson {
    /// Takes JSON text as it is.
    ///
    /// # Errors
    /// The text is not one valid JSON value, or a string in it holds a lone surrogate escape
    /// ([`lone_surrogate`]).
    pub fn from_text(text: impl Into<String>) -> Result<Self, serde_json::Error> {
        let raw = RawValue::from_string(text.into())?;
        refuse_lone_surrogate(raw.get().as_bytes())
            .map_err(<serde_json::Error as serde::de::Error>::custom)?;
        Ok(Self(Arc::from(raw)))
    }

    /// A value built in Rust (by the router itself, or a Rust client), serialized once.
    pub fn from_value(value: &Value) -> Self {
        Self::serialize_from(value)
    }

    /// Any serializable value, serialized once.
    pub fn serialize_from<T: Serialize + ?Sized>(value: &T) -> Self {
        // Serializing our own values cannot fail (maps with string keys, no foreign types);
        // `null` keeps the field well-formed regardless.
        let text = serde_json::to_string(value).unwrap_or_else(|_| "null".into());
        Self::from_text(text).unwrap_or_else(|_| Self::null())
    }

    /// `null`.
    pub fn null() -> Self {
        Self(Arc::from(
            RawValue::from_string("null".to_owned()).expect("null is valid JSON"),
        ))
    }

    /// The text, exactly as it arrived.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// The raw value, to splice it into other JSON.
    pub fn as_raw(&self) -> &RawValue {
        &self.0
    }

    /// The text's length in bytes.
    pub fn len(&self) -> usize {
        self.get().len()
    }

    /// Whether the text is empty (never, for valid JSON; here for the `len` lint).
    pub fn is_empty(&self) -> bool {
        self.get().is_empty()
    }

    /// Whether it is a JSON object.
    pub fn is_object(&self) -> bool {
        self.get().trim_start().starts_with('{')
    }

    /// Whether it is `null`.
    pub fn is_null(&self) -> bool {
        self.get().trim() == "null"
    }

    /// Parses it into a [`Value`] (a copy: the text stays as it was).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.get()).unwrap_or(Value::Null)
    }

    /// Parses it into `T`.
    ///
    /// # Errors
    /// The text does not have `T`'s shape.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.get())
    }

    /// The members of a JSON object, each still as raw text (`None` when it is not an
    /// object). Reading one member this way costs one pass over the text and no values.
    pub fn members(&self) -> Option<HashMap<Cow<'_, str>, &RawValue>> {
        serde_json::from_str(self.get()).ok()
    }

    /// The members of a JSON object in their order, keys read, values as raw text (`None`
    /// when it is not an object).
    pub fn ordered_members(&self) -> Option<Vec<(String, &RawValue)>> {
        serde_json::from_str::<Ordered<'_>>(self.get())
            .ok()
            .map(|o| o.0)
    }

    /// This object with `changes`' members set (a shallow merge): members keep their place
    /// and their text, replaced ones take the new text, new ones follow in `changes`' order.
    /// Keys are written in the canonical JSON spelling. `None` when either is not an object.
    pub fn merged(&self, changes: &RawJson) -> Option<RawJson> {
        let base = self.ordered_members()?;
        let new = changes.ordered_members()?;
        let mut out = String::with_capacity(self.len() + changes.len());
        out.push('{');
        let mut first = true;
        let mut push = |out: &mut String, k: &str, v: &RawValue| {
            if !std::mem::take(&mut first) {
                out.push(',');
            }
            out.push_str(&serde_json::to_string(k).unwrap_or_default());
            out.push(':');
            out.push_str(v.get());
        };
        for (k, v) in &base {
            let v = new
                .iter()
                .rev()
                .find(|(nk, _)| nk == k)
                .map_or(*v, |(_, nv)| *nv);
            push(&mut out, k, v);
        }
        for (i, (k, v)) in new.iter().enumerate() {
            let later_duplicate = new[i + 1..].iter().any(|(nk, _)| nk == k);
            if !later_duplicate && !base.iter().any(|(bk, _)| bk == k) {
                push(&mut out, k, v);
            }
        }
        out.push('}');
        RawJson::from_text(out).ok()
    }

    /// A string member of an object (`None` when absent, not a string, or not an object).
    pub fn str_member(&self, key: &str) -> Option<String> {
        let members = self.members()?;
        let raw = members.get(key)?;
        serde_json::from_str::<String>(raw.get()).ok()
    }

    /// A boolean member of an object.
    pub fn bool_member(&self, key: &str) -> Option<bool> {
        let members = self.members()?;
        let raw = members.get(key)?;
        serde_json::from_str::<bool>(raw.get()).ok()
    }
}

/// An object's members in order (see [`RawJson::ordered_members`]).
struct Ordered<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Ordered<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Members<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Members<'a> {
            type Value = Ordered<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                    out.push((k, v));
                }
                Ok(Ordered(out))
            }
        }
        d.deserialize_map(Members(std::marker::PhantomData))
    }
}

impl From<Value> for RawJson {
    fn from(value: Value) -> Self {
        Self::from_value(&value)
    }
}

impl From<&Value> for RawJson {
    fn from(value: &Value) -> Self {
        Self::from_value(value)
    }
}

impl From<serde_json::Map<String, Value>> for RawJson {
    fn from(map: serde_json::Map<String, Value>) -> Self {
        Self::serialize_from(&map)
    }
}

impl Default for RawJson {
    fn default() -> Self {
        Self::null()
    }
}

/// Equal when the texts are equal, byte for byte (`{"a":1}` and `{ "a": 1 }` differ: they are
/// different things a participant sent). Compare with a [`Value`] to compare meaning.
impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for RawJson {}

/// Equal when the text parses to `other`.
impl PartialEq<Value> for RawJson {
    fn eq(&self, other: &Value) -> bool {
        self.to_value() == *other
    }
}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

impl fmt::Display for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        refuse_lone_surrogate(raw.get().as_bytes()).map_err(serde::de::Error::custom)?;
        Ok(Self(Arc::from(raw)))
    }
}

/// Refuses JSON text holding a lone surrogate escape (see [`lone_surrogate`]), with a message
/// naming it. Gateways call it on a body before reading it, as [`RawJson`] does on a value.
///
/// # Errors
/// The message for the caller.
pub fn refuse_lone_surrogate(text: &[u8]) -> Result<(), String> {
    // NB: `<[u8]>::contains` on one byte is a memchr; most frames hold no escape at all.
    if !text.contains(&b'\\') {
        return Ok(());
    }
    match lone_surrogate(text) {
        None => Ok(()),
        Some(at) => Err(format!(
            "a string holds the lone UTF-16 surrogate {} (at byte {at}), which is not text",
            text.get(at..at + 6)
                .and_then(|e| std::str::from_utf8(e).ok())
                .unwrap_or("\\u")
        )),
    }
}

/// Where `text` (JSON) holds a `\uXXXX` escape naming a lone UTF-16 surrogate: a high one
/// (`\uD800`–`\uDBFF`) not followed at once by an escaped low one (`\uDC00`–`\uDFFF`), or a low
/// one standing alone. `None` when every escape names a Unicode scalar value.
///
/// Such a string is not text: RFC 8259 §8.2 leaves its meaning undefined, I-JSON (RFC 7493)
/// forbids it, and serde_json (so the Rust client, the store's readers and every Rust consumer)
/// refuses to read it into a string, although its `RawValue` accepts it. A participant's JSON
/// passes through the router byte for byte, so one accepted would reach every reader; the
/// router refuses the entry instead ([`crate::protocol::jsonrpc::classify`]).
///
/// One pass over the bytes, tracking strings and escapes, no allocation.
pub fn lone_surrogate(text: impl AsRef<[u8]>) -> Option<usize> {
    let bytes = text.as_ref();
    let mut in_string = false;
    // After a high surrogate escape, the offset where it starts.
    let mut high: Option<usize> = None;
    let mut i = 0usize;
    while i < bytes.len() {
        let b = bytes[i];
        if !in_string {
            in_string = b == b'"';
            i += 1;
            continue;
        }
        match b {
            b'\\' if bytes.get(i + 1) == Some(&b'u') => {
                let unit = bytes
                    .get(i + 2..i + 6)
                    .and_then(|d| std::str::from_utf8(d).ok())
                    .filter(|d| d.bytes().all(|c| c.is_ascii_hexdigit()))
                    .and_then(|d| u32::from_str_radix(d, 16).ok());
                let Some(unit) = unit else {
                    // Not four hex digits: the parser refuses it.
                    return high;
                };
                match (unit, high.take()) {
                    (0xDC00..=0xDFFF, Some(_)) => {}
                    (0xD800..=0xDBFF, None) => high = Some(i),
                    (0xD800..=0xDFFF, None) => return Some(i),
                    (_, Some(at)) => return Some(at),
                    _ => {}
                }
                i += 6;
                continue;
            }
            _ if high.is_some() => return high,
            b'\\' => i += 1,
            b'"' => in_string = false,
            _ => {}
        }
        i += 1;
    }
    high
}

impl JsonSchema for RawJson {
    fn schema_name() -> Cow<'static, str> {
        "AnyJson".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "description": "Any JSON value, passed on byte for byte." })
    }

    fn inline_schema() -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lone_surrogates_are_found_where_serde_json_refuses_them() {
        // Every sequence of up to three pieces, inside a string: the scan finds nothing in
        // exactly what serde_json can read back into a String.
        let pieces = [
            "\\ud800",
            "\\uDBFF",
            "\\udc00",
            "\\uDFFF",
            "\\u0041",
            "\\u0000",
            "\\n",
            "\\\\",
            "\\\\ud800",
            "u",
            "x",
            "\\/",
        ];
        let mut checked = 0;
        for a in pieces {
            for b in pieces {
                for c in pieces {
                    let text = format!(r#"{{"k":"{a}{b}{c}","n":["\\"]}}"#);
                    let ours = lone_surrogate(&text);
                    let serde = serde_json::from_str::<serde_json::Value>(&text);
                    assert_eq!(
                        ours.is_none(),
                        serde.is_ok(),
                        "{text}: {ours:?} vs {serde:?}"
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 12 * 12 * 12);
        assert_eq!(lone_surrogate(r#"{"\udfff":1}"#), Some(2));
        // A pair split by the end of the string or by other text is still lone.
        assert_eq!(lone_surrogate(r#"["\ud800","\udc00"]"#), Some(2));
        assert_eq!(lone_surrogate(r#"["\ud800 \udc00"]"#), Some(2));
        assert_eq!(lone_surrogate(r#"["\ud83d\ude00"]"#), None);
    }
    use serde_json::json;

    #[test]
    fn text_survives_a_round_trip_through_serde() {
        let text = r#"{"z":1.50,"a":[1e2,{"é":"\u00e9"}], "s" : "x" }"#;
        #[derive(Deserialize, Serialize)]
        struct Wrap {
            payload: RawJson,
        }
        let wrapped = format!(r#"{{"payload":{text}}}"#);
        let w: Wrap = serde_json::from_str(&wrapped).unwrap();
        assert_eq!(w.payload.get(), text);
        assert_eq!(serde_json::to_string(&w).unwrap(), wrapped);
        assert_eq!(
            w.payload,
            json!({"a": [100.0, {"é": "é"}], "s": "x", "z": 1.5})
        );
        assert!(w.payload.is_object());
        assert_eq!(w.payload.str_member("s").as_deref(), Some("x"));
        assert_eq!(w.payload.str_member("z"), None);
    }

    #[test]
    fn a_shallow_merge_keeps_order_and_text() {
        let base = RawJson::from_text(r#"{"b": 1.50, "a": [1e2], "c": "x"}"#).unwrap();
        let changes = RawJson::from_text(r#"{"a": {"z":1, "y":2}, "d": 0.10}"#).unwrap();
        let merged = base.merged(&changes).unwrap();
        assert_eq!(
            merged.get(),
            r#"{"b":1.50,"a":{"z":1, "y":2},"c":"x","d":0.10}"#
        );
        assert!(base.merged(&RawJson::from_text("[1]").unwrap()).is_none());
        let order: Vec<String> = merged
            .ordered_members()
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(order, ["b", "a", "c", "d"]);
    }

    #[test]
    fn values_built_in_rust_serialize_once() {
        let r = RawJson::from(json!({"b": true, "a": "t"}));
        assert_eq!(r.bool_member("b"), Some(true));
        assert_eq!(r.to_value(), json!({"a": "t", "b": true}));
        assert!(RawJson::from_text("{nope").is_err());
        // A lone surrogate is refused however the value arrives; a pair is kept verbatim.
        assert!(RawJson::from_text(r#"{"a":"\ud800"}"#).is_err());
        assert!(serde_json::from_str::<RawJson>(r#"["x\udc00"]"#).is_err());
        let pair = serde_json::from_str::<RawJson>(r#"["\ud83d\ude00"]"#).unwrap();
        assert_eq!(pair.get(), r#"["\ud83d\ude00"]"#);
        assert!(RawJson::null().is_null());
        assert_ne!(
            RawJson::from_text("{\"a\":1}").unwrap(),
            RawJson::from_text("{ \"a\": 1 }").unwrap()
        );
    }
}
