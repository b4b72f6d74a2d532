//! How a [`StoredRow`] travels as a JetStream message, and back.
//!
//! Owns the wire form of a row in the stream: subject `<prefix>.<kind>`; headers `Nats-Msg-Id`
//! (the event id, which the server de-duplicates on), `Map-Ts`, `Map-Kind` and `Map-Meta-Len`;
//! payload `meta` then `json`, both byte for byte. The position is not written: it is the
//! message's stream sequence.

use async_nats::jetstream::message::StreamMessage;
use async_nats::HeaderMap;
use bytes::Bytes;

use crate::store::record::StoredRow;
use crate::store::StoreError;

const MSG_ID: &str = "Nats-Msg-Id";
const TS: &str = "Map-Ts";
const KIND: &str = "Map-Kind";
const META_LEN: &str = "Map-Meta-Len";

/// The subject of rows of `kind`. A byte that cannot be in a subject token becomes `_` (and
/// an empty token `_`), so every row has a subject; readers by kind check `Map-Kind` too.
pub(crate) fn subject(prefix: &str, kind: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1 + kind.len());
    out.push_str(prefix);
    for token in kind.split('.') {
        out.push('.');
        if token.is_empty() {
            out.push('_');
        }
        out.extend(token.chars().map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        }));
    }
    out
}

/// The headers and payload of `row` (the caller adds `Nats-Expected-Last-Sequence`).
///
/// # Errors
/// The id or kind cannot go in a header or subject.
pub fn encode(row: &StoredRow) -> Result<(HeaderMap, Bytes), String> {
    if row.id.is_empty() || !row.id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("event id {:?} cannot be a message id", row.id));
    }
    let mut headers = HeaderMap::new();
    headers.insert(MSG_ID, row.id.as_str());
    headers.insert(TS, row.timestamp.to_string().as_str());
    headers.insert(KIND, row.kind.as_str());
    headers.insert(META_LEN, row.meta.len().to_string().as_str());
    let mut payload = Vec::with_capacity(row.meta.len() + row.json.len());
    payload.extend_from_slice(row.meta.as_bytes());
    payload.extend_from_slice(row.json.as_bytes());
    Ok((headers, payload.into()))
}

/// The row a stream message holds.
///
/// # Errors
/// [`StoreError::Corrupt`] when a header is missing or malformed, or the payload is not the
/// UTF-8 `meta` + `json` its header says.
pub fn decode(msg: &StreamMessage) -> Result<StoredRow, StoreError> {
    decode_parts(msg.sequence, Some(&msg.headers), &msg.payload)
}

/// The row of a message at stream sequence `seq` with these headers and payload (a consumer's
/// message rather than a direct get's), with the errors of [`decode`].
pub(crate) fn decode_parts(
    seq: u64,
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<StoredRow, StoreError> {
    let bad = |what: &str| StoreError::Corrupt(format!("stream message {seq}: {what}"));
    let header = |name: &str| {
        headers
            .and_then(|h| h.get(name))
            .map(async_nats::HeaderValue::as_str)
            .ok_or_else(|| bad(&format!("no {name} header")))
    };
    let id = header(MSG_ID)?.to_owned();
    let timestamp = header(TS)?.parse().map_err(|_| bad("bad Map-Ts"))?;
    let kind = header(KIND)?.to_owned();
    let meta_len: usize = header(META_LEN)?
        .parse()
        .map_err(|_| bad("bad Map-Meta-Len"))?;
    if meta_len > payload.len() {
        return Err(bad("Map-Meta-Len beyond the payload"));
    }
    let (meta, json) = payload.split_at(meta_len);
    let text = |b: &[u8]| {
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| bad("payload is not UTF-8"))
    };
    Ok(StoredRow {
        seq,
        id,
        timestamp,
        kind,
        meta: text(meta)?,
        json: text(json)?,
    })
}
