//! The JSON-RPC 2.0 core over a real WebSocket (docs/compatibility.md §1): parse and envelope
//! errors, ids, params, batches, notifications, frame limits, and the `/map` path.

mod common;

use common::*;
use serde_json::{json, Value};

const CONNECT: &str =
    r#"{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"protocolVersion":1}}"#;

/// A connected raw client whose next request id is 2.
async fn connected(url: &str) -> WsClient {
    let mut c = WsClient::connect(url).await;
    let r = c.request_raw(CONNECT).await;
    assert_eq!(r["id"], json!(1));
    assert!(r["result"]["sessionId"].is_string(), "connect result: {r}");
    c
}

/// Proves the connection still works: a request right after gets its own answer.
async fn still_usable(c: &mut WsClient) {
    let r = c
        .request_raw(r#"{"jsonrpc":"2.0","id":"probe","method":"no/such"}"#)
        .await;
    assert_eq!(r["id"], json!("probe"));
    assert_eq!(r["error"]["code"], json!(-32601));
}

#[tokio::test]
async fn unparsable_json_is_a_parse_error_with_null_id_and_the_connection_survives() {
    let (_server, url) = default_server().await;
    let mut c = connected(&url).await;
    for garbage in ["{not json", "{\"jsonrpc\":\"2.0\",", "]["] {
        let r = c.request_raw(garbage).await;
        assert_eq!(r["jsonrpc"], json!("2.0"));
        assert_eq!(r["id"], Value::Null, "{garbage}: {r}");
        assert!(r.get("result").is_none());
        assert_protocol_error(&r["error"], -32700, "Parse error");
    }
    still_usable(&mut c).await;
}

#[tokio::test]
async fn a_wrong_jsonrpc_version_is_invalid_request_with_the_request_id() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&url).await;
    for (frame, id) in [
        (
            r#"{"jsonrpc":"1.0","id":7,"method":"map/connect"}"#,
            json!(7),
        ),
        (r#"{"id":"s","method":"map/connect"}"#, json!("s")),
        (r#"{"jsonrpc":2.0,"id":8,"method":"map/connect"}"#, json!(8)),
    ] {
        let r = c.request_raw(frame).await;
        assert_eq!(r["id"], id, "{frame}: {r}");
        assert_protocol_error(&r["error"], -32600, "Invalid request");
    }
    still_usable(&mut c).await;
}

#[tokio::test]
async fn non_object_messages_are_invalid_requests_with_null_id() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&url).await;
    for frame in ["42", "\"map/connect\"", "true", "null"] {
        let r = c.request_raw(frame).await;
        assert_eq!(r["id"], Value::Null, "{frame}: {r}");
        assert_protocol_error(&r["error"], -32600, "Invalid request");
    }
    still_usable(&mut c).await;
}

#[tokio::test]
async fn object_array_and_boolean_ids_are_invalid_requests_with_null_id() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&url).await;
    for id in [r#"{"a":1}"#, "[1]", "true", "false"] {
        let frame = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"map/connect"}}"#);
        let r = c.request_raw(&frame).await;
        assert_eq!(r["id"], Value::Null, "{frame}: {r}");
        assert_protocol_error(&r["error"], -32600, "Invalid request");
    }
    still_usable(&mut c).await;
}

#[tokio::test]
async fn scalar_params_are_invalid_requests_with_the_request_id() {
    let (_server, url) = default_server().await;
    let mut c = connected(&url).await;
    for (i, params) in ["5", "\"x\"", "true"].iter().enumerate() {
        let frame =
            format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"map/agents/list","params":{params}}}"#);
        let r = c.request_raw(&frame).await;
        assert_eq!(r["id"], json!(i), "{frame}: {r}");
        assert_protocol_error(&r["error"], -32600, "Invalid request");
    }
}

#[tokio::test]
async fn a_request_without_method_is_an_invalid_request() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&url).await;
    let r = c.request_raw(r#"{"jsonrpc":"2.0","id":3}"#).await;
    assert_eq!(r["id"], json!(3));
    assert_protocol_error(&r["error"], -32600, "Invalid request");
}

#[tokio::test]
async fn an_empty_batch_is_one_invalid_request_object() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&url).await;
    let r = c.request_raw("[]").await;
    assert!(r.is_object(), "one error object, not an array: {r}");
    assert_eq!(r["id"], Value::Null);
    assert_protocol_error(&r["error"], -32600, "Invalid request");
    still_usable(&mut c).await;
}

#[tokio::test]
async fn an_oversized_frame_is_refused_and_the_connection_stays_usable() {
    let (_server, url) = start_server(|c| c.limits.max_frame_bytes = 1024).await;
    let mut c = connected(&url).await;
    let padding = "x".repeat(2000);
    let frame = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"map/agents/list","params":{{"pad":"{padding}"}}}}"#
    );
    let len = frame.len();
    let r = c.request_raw(&frame).await;
    assert_eq!(r["id"], Value::Null, "{r}");
    assert_protocol_error(&r["error"], -32600, "Invalid request");
    let expected = format!("frame of {len} bytes exceeds the limit of 1024 bytes");
    assert!(
        r["error"].to_string().contains(&expected),
        "error says {expected:?}: {r}"
    );
    // Just under the limit is fine.
    let ok = c
        .request_raw(r#"{"jsonrpc":"2.0","id":3,"method":"map/agents/list"}"#)
        .await;
    assert_eq!(ok["id"], json!(3), "{ok}");
    assert_eq!(without_as_of(&ok["result"]), json!({"agents": []}), "{ok}");
}

#[tokio::test]
async fn a_message_beyond_the_hard_limit_closes_with_1009() {
    let (_server, url) = start_server(|c| c.limits.max_frame_bytes = 1024).await;
    let mut c = connected(&url).await;
    // The hard limit is max(4 × 1024, 1024 + 1 MiB).
    let huge = format!(r#"{{"pad":"{}"}}"#, "y".repeat(1024 + (1 << 20) + 10));
    c.send_raw(&huge).await;
    assert_eq!(c.expect_close().await, Some(1009));
}

#[tokio::test]
async fn a_binary_frame_is_an_invalid_request_and_the_connection_stays_open() {
    let (_server, url) = default_server().await;
    let mut c = connected(&url).await;
    c.send_binary(CONNECT.as_bytes()).await;
    let r = c.next_non_notification().await;
    assert_eq!(r["id"], Value::Null, "{r}");
    assert_protocol_error(&r["error"], -32600, "Invalid request");
    still_usable(&mut c).await;
}

#[tokio::test]
async fn unknown_methods_get_the_sdk_message_before_and_after_connect() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&url).await;
    // -32601 comes before "not connected" (1000).
    assert_eq!(
        c.err("x", Value::Null).await,
        map_error(-32601, "Method not found: x", "protocol")
    );
    c.ok("map/connect", json!({})).await;
    assert_eq!(
        c.err("map/agents/update/state", json!({})).await,
        map_error(
            -32601,
            "Method not found: map/agents/update/state",
            "protocol"
        )
    );
    for method in [
        // [M]'s non-standard peer listing (connect and route are served: tests/federation.rs).
        "map/federation/list",
        "workspace/list",
        "map/resources/list",
    ] {
        assert_eq!(
            c.err(method, json!({})).await,
            map_error(-32601, &format!("Method not found: {method}"), "protocol")
        );
    }
}

#[tokio::test]
async fn invalid_params_for_missing_fields_wrong_types_and_arrays() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::client(&url).await;
    assert_invalid_params(&c.err("map/agents/get", json!({})).await);
    assert_invalid_params(&c.err("map/agents/get", json!({"agentId": 5})).await);
    assert_invalid_params(&c.err("map/unsubscribe", json!({})).await);
    assert_invalid_params(&c.err("map/send", json!({"payload": 1})).await);
    assert_invalid_params(&c.err("map/agents/list", json!([])).await);
    assert_invalid_params(&c.err("map/agents/list", json!([{"limit": 1}])).await);
}

#[tokio::test]
async fn ids_are_echoed_verbatim() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&url).await;
    let frame = |id: &str| format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"map/connect"}}"#);
    let r = c.request_raw(&frame(r#""req-α""#)).await;
    assert_eq!(r["id"], json!("req-α"));
    assert!(r["result"].is_object());
    for id in ["42", "null", "0", "-3", "9007199254740993"] {
        c.send_raw(&frame(id)).await;
        let text = match c.read_frame().await {
            Frame::Json(v) => v.to_string(),
            Frame::Closed(code) => panic!("closed {code:?}"),
        };
        // serde_json keeps integers exactly; the raw id must come back unchanged.
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["id"].to_string(), id, "{text}");
        assert!(back.get("result").is_some(), "{text}");
    }
}

#[tokio::test]
async fn absent_or_null_params_mean_an_empty_object() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&url).await;
    let r = c
        .request_raw(r#"{"jsonrpc":"2.0","id":1,"method":"map/connect"}"#)
        .await;
    assert_eq!(r["result"]["participantType"], json!("client"));
    assert_eq!(r["result"]["protocolVersion"], json!(1));
    for frame in [
        r#"{"jsonrpc":"2.0","id":2,"method":"map/agents/list"}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"map/agents/list","params":null}"#,
    ] {
        let r = c.request_raw(frame).await;
        assert_eq!(
            without_as_of(&r["result"]),
            json!({"agents": []}),
            "{frame}: {r}"
        );
    }
    let r = c
        .request_raw(r#"{"jsonrpc":"2.0","id":4,"method":"map/scopes/list"}"#)
        .await;
    assert_eq!(without_as_of(&r["result"]), json!({"scopes": []}));
    let r = c
        .request_raw(r#"{"jsonrpc":"2.0","id":5,"method":"map/structure/graph"}"#)
        .await;
    assert_eq!(
        without_as_of(&r["result"]),
        json!({"nodes": [], "edges": []})
    );
    let r = c
        .request_raw(r#"{"jsonrpc":"2.0","id":6,"method":"map/disconnect"}"#)
        .await;
    assert_eq!(r["result"]["acknowledged"], json!(true));
}

#[tokio::test]
async fn a_batch_answers_requests_and_invalid_entries_but_not_notifications() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&url).await;
    let batch = r#"[
        {"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"protocolVersion":1}},
        {"jsonrpc":"2.0","method":"map/agents/list"},
        5,
        {"jsonrpc":"2.0","id":"b","method":"no/such"},
        {"jsonrpc":"1.0","id":4,"method":"map/agents/list"},
        {"jsonrpc":"2.0","id":9,"method":"map/agents/list"}
    ]"#;
    let r = c.request_raw(batch).await;
    let responses = r.as_array().unwrap_or_else(|| panic!("an array: {r}"));
    assert_eq!(responses.len(), 5, "one response per non-notification: {r}");
    let by_id = |id: Value| -> Vec<&Value> { responses.iter().filter(|x| x["id"] == id).collect() };
    let connect = by_id(json!(1));
    assert_eq!(connect.len(), 1);
    assert_eq!(connect[0]["result"]["protocolVersion"], json!(1));
    let invalid = by_id(Value::Null);
    assert_eq!(invalid.len(), 1, "{r}");
    assert_protocol_error(&invalid[0]["error"], -32600, "Invalid request");
    assert_eq!(
        by_id(json!("b"))[0]["error"],
        map_error(-32601, "Method not found: no/such", "protocol")
    );
    assert_protocol_error(&by_id(json!(4))[0]["error"], -32600, "Invalid request");
    assert_eq!(
        without_as_of(&by_id(json!(9))[0]["result"]),
        json!({"agents": []})
    );
    for resp in responses {
        assert_eq!(resp["jsonrpc"], json!("2.0"));
    }
    still_usable(&mut c).await;
}

#[tokio::test]
async fn a_batch_of_only_notifications_gets_no_answer() {
    let (_server, url) = default_server().await;
    let mut c = connected(&url).await;
    c.send_raw(r#"[{"jsonrpc":"2.0","method":"map/agents/list"},{"jsonrpc":"2.0","method":"x"}]"#)
        .await;
    let r = c
        .request_raw(r#"{"jsonrpc":"2.0","id":77,"method":"map/agents/list"}"#)
        .await;
    assert_eq!(r["id"], json!(77), "nothing came before this answer: {r}");
}

#[tokio::test]
async fn a_batch_over_max_batch_is_one_invalid_request() {
    let (_server, url) = start_server(|c| c.limits.max_batch = 3).await;
    let mut c = connected(&url).await;
    let entry = r#"{"jsonrpc":"2.0","id":1,"method":"map/agents/list"}"#;
    let three = format!("[{entry},{entry},{entry}]");
    let r = c.request_raw(&three).await;
    assert_eq!(r.as_array().map(Vec::len), Some(3), "{r}");
    let four = format!("[{entry},{entry},{entry},{entry}]");
    let r = c.request_raw(&four).await;
    assert!(r.is_object(), "one error object: {r}");
    assert_eq!(r["id"], Value::Null);
    assert_protocol_error(&r["error"], -32600, "Invalid request");
    still_usable(&mut c).await;
}

#[tokio::test]
async fn notifications_are_never_answered() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&url).await;
    // Before connect, known, unknown, invalid-params and ack notifications.
    for n in [
        r#"{"jsonrpc":"2.0","method":"map/agents/list"}"#,
        r#"{"jsonrpc":"2.0","method":"no/such/method"}"#,
        r#"{"jsonrpc":"2.0","method":"map/agents/get","params":[1]}"#,
        r#"{"jsonrpc":"2.0","method":"map/subscribe.ack","params":{"subscriptionId":"s","upToSequence":3}}"#,
    ] {
        c.send_raw(n).await;
    }
    c.assert_silent().await;
    let r = c.request_raw(CONNECT).await;
    assert_eq!(r["id"], json!(1), "{r}");
    c.send_raw(r#"{"jsonrpc":"2.0","method":"map/connect","params":{"protocolVersion":1}}"#)
        .await;
    c.send_raw(r#"{"jsonrpc":"2.0","method":"map/subscribe.ack","params":{"subscriptionId":"s","upToSequence":1}}"#)
        .await;
    c.assert_silent().await;
    // Responses from the peer are ignored too.
    c.send_raw(r#"{"jsonrpc":"2.0","id":99,"result":{}}"#).await;
    c.send_raw(r#"{"jsonrpc":"2.0","id":98,"error":{"code":-32601,"message":"x"}}"#)
        .await;
    c.assert_silent().await;
}

#[tokio::test]
async fn every_success_response_carries_result() {
    let (_server, url) = default_server().await;
    let mut a = WsClient::agent(&url, "resp-a", json!({})).await;
    let calls = [
        ("map/agents/list", Value::Null),
        ("map/agents/get", json!({"agentId": "resp-a"})),
        ("map/scopes/create", json!({"scopeId": "resp-s"})),
        (
            "map/scopes/join",
            json!({"scopeId": "resp-s", "agentId": "resp-a"}),
        ),
        ("map/scopes/members", json!({"scopeId": "resp-s"})),
        (
            "map/scopes/leave",
            json!({"scopeId": "resp-s", "agentId": "resp-a"}),
        ),
        ("map/scopes/get", json!({"scopeId": "resp-s"})),
        ("map/scopes/delete", json!({"scopeId": "resp-s"})),
        ("map/send", json!({"to": {"system": true}})),
        ("map/unsubscribe", json!({"subscriptionId": "nope"})),
        ("map/replay", json!({})),
        ("map/structure/graph", Value::Null),
        (
            "map/agents/update",
            json!({"agentId": "resp-a", "state": "idle"}),
        ),
        ("map/disconnect", Value::Null),
    ];
    for (method, params) in calls {
        let r = a.ok(method, params).await; // `call` asserts `result` is present
        assert!(
            r.is_object(),
            "{method} answers with a result object, got {r}"
        );
    }
}

#[tokio::test]
async fn newline_separated_values_in_one_frame_are_handled_one_by_one() {
    let (_server, url) = default_server().await;
    let mut c = connected(&url).await;
    c.send_raw(
        "{\"jsonrpc\":\"2.0\",\"id\":10,\"method\":\"map/agents/list\"}\n{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"map/scopes/list\"}\n",
    )
    .await;
    let first = c.next_non_notification().await;
    let second = c.next_non_notification().await;
    assert_eq!(first["id"], json!(10));
    assert_eq!(second["id"], json!(11));
    assert_eq!(without_as_of(&second["result"]), json!({"scopes": []}));
    // A pretty-printed value spread over lines stays whole.
    let r = c
        .request_raw(
            "{\n  \"jsonrpc\": \"2.0\",\n  \"id\": 12,\n  \"method\": \"map/agents/list\"\n}",
        )
        .await;
    assert_eq!(r["id"], json!(12), "{r}");
    assert_eq!(without_as_of(&r["result"]), json!({"agents": []}), "{r}");
}

#[tokio::test]
async fn the_map_path_serves_the_same_protocol() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&format!("{url}map")).await;
    let r = c.ok("map/connect", json!({"protocolVersion": 1})).await;
    assert_eq!(r["protocolVersion"], json!(1));
    assert_eq!(
        without_as_of(&c.ok("map/agents/list", Value::Null).await),
        json!({"agents": []})
    );
}

#[tokio::test]
async fn errors_are_reported_in_the_documented_order() {
    let (_server, url) = default_server().await;
    let mut c = WsClient::connect(&url).await;
    // -32601 before 1000.
    assert_eq!(c.err("nope/x", json!([1])).await["code"], json!(-32601));
    // 1000 before -32602.
    assert_eq!(
        c.err("map/agents/get", json!([1])).await["code"],
        json!(1000)
    );
    c.ok(
        "map/connect",
        json!({"capabilities": {"observation": {"canQuery": false}}}),
    )
    .await;
    // -32602 before 1003 (the client lacks lifecycle.canRegister and canQuery).
    assert_invalid_params(&c.err("map/agents/register", json!({"agentId": 5})).await);
    assert_invalid_params(&c.err("map/agents/get", json!({})).await);
    // 1003 before the method's own errors (the agent does not exist).
    assert_eq!(
        c.err("map/agents/get", json!({"agentId": "ghost"})).await,
        map_error(1003, "Permission denied: observation.canQuery", "auth")
    );
    assert_eq!(
        c.err("map/agents/unregister", json!({"agentId": "ghost"}))
            .await,
        map_error(1003, "Permission denied: lifecycle.canUnregister", "auth")
    );
}
