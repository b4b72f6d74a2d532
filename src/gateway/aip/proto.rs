//! The AIP wire (`grpc_service`, seed 003): the message types and the services' server and
//! client code, generated from `proto/schema.proto` (upstream's schema, byte for byte; see
//! `/docs/aip.md`) and vendored in `proto/grpc_service.rs`, so that no `protoc` is needed to
//! build. Regenerate with protox + tonic-prost-build (`docs/aip.md`, "Regenerating the code").
//!
//! One hand edit to the generated code: `ToolRequest.arguments` (field 5) is `map<string,
//! string>` in the seed's schema and a JSON `string` in upstream's next version. Both are
//! length-delimited under the same tag, so the field is kept as its raw occurrences and
//! [`arguments`] reads either: an occurrence whose first non-blank byte is `{` and that parses
//! as a JSON object is the string version (`{` as a protobuf tag would be an invalid group
//! start, so no map entry can begin with it); anything else is one map entry. What the gateway
//! sends a tool is always the map form ([`encode_arguments`]): the seed's schema.
//!
//! Owns nothing.

#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic,
    unreachable_pub
)]
mod generated {
    include!("proto/grpc_service.rs");
}

pub use generated::*;

use std::collections::BTreeMap;

use prost::Message as _;

/// One `map<string, string>` entry as protobuf encodes it.
#[derive(Clone, PartialEq, prost::Message)]
struct Entry {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(string, tag = "2")]
    value: String,
}

/// The arguments of a `ToolRequest`, from either wire form (module docs). JSON values that are
/// not strings are kept as their JSON text. A later entry for a key replaces an earlier one,
/// as protobuf's map merge does.
///
/// # Errors
/// An occurrence that is neither a JSON object nor a map entry.
pub fn arguments(raw: &[Vec<u8>]) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for occurrence in raw {
        let first = occurrence.iter().find(|b| !b.is_ascii_whitespace());
        if first == Some(&b'{') {
            if let Ok(serde_json::Value::Object(map)) =
                serde_json::from_slice::<serde_json::Value>(occurrence)
            {
                for (k, v) in map {
                    let v = match v {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    };
                    out.insert(k, v);
                }
                continue;
            }
        }
        let entry = Entry::decode(occurrence.as_slice()).map_err(|e| {
            format!("ToolRequest.arguments: neither a map entry nor a JSON object ({e})")
        })?;
        out.insert(entry.key, entry.value);
    }
    Ok(out)
}

/// `arguments` in the seed's map form: one encoded entry per key.
pub fn encode_arguments(arguments: &BTreeMap<String, String>) -> Vec<Vec<u8>> {
    arguments
        .iter()
        .map(|(key, value)| {
            Entry {
                key: key.clone(),
                value: value.clone(),
            }
            .encode_to_vec()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_of_arguments() {
        let map: BTreeMap<String, String> = [
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), String::new()),
        ]
        .into();
        assert_eq!(arguments(&encode_arguments(&map)).unwrap(), map);
        let json = br#" {"a": "1", "n": 2, "l": [1, 2]}"#.to_vec();
        let got = arguments(&[json]).unwrap();
        assert_eq!(got["a"], "1");
        assert_eq!(got["n"], "2");
        assert_eq!(got["l"], "[1,2]");
        // The empty occurrence: one entry with an empty key and value (or an empty string).
        assert_eq!(
            arguments(&[Vec::new()]).unwrap().get(""),
            Some(&String::new())
        );
        assert!(arguments(&[vec![0xff, 0xff]]).is_err());
    }
}
