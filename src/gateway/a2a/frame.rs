//! JSON-RPC response frames: the body of a JSON answer, and each `data:` line of a stream.
//! The request's id goes back as the caller wrote it; a `result` is rendered with its verbatim
//! members spliced back ([`Rendered`]).

use serde_json::json;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::gateway::a2a::error::A2aError;
use crate::gateway::a2a::wire::{Rendered, Version};

/// A JSON-RPC response body with `result` (rendered: verbatim members spliced back).
pub fn result_frame(id: &RawValue, result: &Value) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{}}}"#,
        id.get(),
        Rendered::finish(result)
    )
}

/// A JSON-RPC error body, in the shape of version `v`: a v1.0 A2A error carries its
/// `google.rpc.ErrorInfo` in `data` ([`A2aError::error_info`]).
pub fn error_frame(id: Option<&RawValue>, e: &A2aError, v: Version) -> String {
    let mut error = json!({"code": e.code, "message": e.message});
    if v == Version::V1 {
        if let Some(data) = e.error_info() {
            error["data"] = data;
        }
    }
    format!(
        r#"{{"jsonrpc":"2.0","id":{},"error":{}}}"#,
        id.map_or("null", RawValue::get),
        error
    )
}
