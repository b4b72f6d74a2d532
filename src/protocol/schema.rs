//! Generates the JSON Schema files in `schema/` from the protocol types.
//!
//! One file per method (params and result), per notification and per event payload, plus the
//! error object. `tests/schema.rs` fails when the committed files differ from what this
//! produces; `map-router schema --out schema` rewrites them.

use std::collections::BTreeMap;

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{json, Value};

use crate::protocol::event;
use crate::protocol::event::EventNotificationParams;
use crate::protocol::event::MessageNotificationParams;
use crate::protocol::event::SubscriptionFilter;
use crate::protocol::jsonrpc::ErrorObject;
use crate::protocol::methods::for_each_method;
use crate::protocol::methods::Method;
use crate::protocol::methods::MethodVisitor;

/// Every schema file, keyed by its path relative to `schema/`, as pretty JSON with a trailing
/// newline.
pub fn generate_all() -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();

    struct Collect<'a>(&'a mut BTreeMap<String, String>);
    impl MethodVisitor for Collect<'_> {
        fn visit<M: Method>(&mut self) {
            let doc = pair::<M::Params, M::Result>(M::NAME, "params", "result");
            self.0
                .insert(format!("methods/{}.json", file_stem(M::NAME)), pretty(&doc));
        }
    }
    for_each_method(&mut Collect(&mut files));

    let notifications: [(&str, Value); 3] = [
        (
            "map/event",
            single::<EventNotificationParams>("map/event params"),
        ),
        (
            "map/message",
            single::<MessageNotificationParams>("map/message params"),
        ),
        (
            crate::protocol::methods::notifications::AUTH_EXPIRING,
            single::<crate::protocol::methods::auth::AuthExpiringParams>(
                "map/auth/expiring params",
            ),
        ),
    ];
    for (name, doc) in notifications {
        files.insert(
            format!("notifications/{}.json", file_stem(name)),
            pretty(&doc),
        );
    }

    let events: [(event::EventType, Value); 22] = {
        use event::EventType as T;
        [
            (T::AgentRegistered, data::<event::AgentRegisteredData>()),
            (T::AgentUnregistered, data::<event::AgentUnregisteredData>()),
            (T::AgentStateChanged, data::<event::AgentStateChangedData>()),
            (T::AgentOrphaned, data::<event::AgentOrphanedData>()),
            (
                T::AgentEnvironmentChanged,
                data::<event::AgentEnvironmentChangedData>(),
            ),
            (
                T::AgentMetadataChanged,
                data::<event::AgentMetadataChangedData>(),
            ),
            (
                T::ParticipantConnected,
                data::<event::ParticipantConnectedData>(),
            ),
            (
                T::ParticipantDisconnected,
                data::<event::ParticipantDisconnectedData>(),
            ),
            (T::MessageSent, data::<event::MessageSentData>()),
            (T::MessageDelivered, data::<event::MessageDeliveredData>()),
            (T::MessageFailed, data::<event::MessageFailedData>()),
            (T::ScopeCreated, data::<event::ScopeCreatedData>()),
            (T::ScopeDeleted, data::<event::ScopeDeletedData>()),
            (T::ScopeMemberJoined, data::<event::ScopeMemberData>()),
            (T::ScopeMemberLeft, data::<event::ScopeMemberData>()),
            (
                T::SubscriptionOverflow,
                data::<event::SubscriptionOverflowData>(),
            ),
            (T::AgentInjected, data::<event::AgentInjectedData>()),
            (T::AgentStderr, data::<event::AgentStderrData>()),
            (T::AgentDiagnostic, data::<event::AgentDiagnosticData>()),
            (T::MessageQueued, data::<event::MessageQueuedData>()),
            (T::AgentSpawning, data::<event::AgentSpawningData>()),
            (T::AgentSpawnFailed, data::<event::AgentSpawnFailedData>()),
        ]
    };
    for (kind, mut doc) in events {
        if let Some(obj) = doc.as_object_mut() {
            obj.insert(
                "title".into(),
                Value::String(format!("{} event data", kind.as_str())),
            );
        }
        files.insert(format!("events/{}.json", kind.as_str()), pretty(&doc));
    }

    files.insert(
        "error.json".into(),
        pretty(&single::<ErrorObject>("JSON-RPC error object")),
    );
    files.insert(
        "subscription-filter.json".into(),
        pretty(&single::<SubscriptionFilter>("subscription filter")),
    );
    files
}

fn generator() -> SchemaGenerator {
    SchemaSettings::draft2020_12().into_generator()
}

fn file_stem(method: &str) -> String {
    method.replace('/', ".")
}

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// A schema for one method: an object with `params` and `result` properties.
fn pair<P: JsonSchema, R: JsonSchema>(title: &str, a: &str, b: &str) -> Value {
    let mut g = generator();
    let ps = g.subschema_for::<P>();
    let rs = g.subschema_for::<R>();
    let defs = g.take_definitions(true);
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": title,
        "type": "object",
        "properties": { a: ps, b: rs },
        "required": [a, b],
        "$defs": defs,
    })
}

fn single<T: JsonSchema>(title: &str) -> Value {
    let mut v = generator().into_root_schema_for::<T>().to_value();
    if let Some(obj) = v.as_object_mut() {
        obj.insert("title".into(), Value::String(title.into()));
    }
    v
}

fn data<T: JsonSchema>() -> Value {
    generator().into_root_schema_for::<T>().to_value()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_has_a_schema_file() {
        let files = generate_all();
        assert!(files.contains_key("methods/map.connect.json"));
        assert!(files.contains_key("methods/map.agents.list.json"));
        assert!(files.contains_key("events/message_delivered.json"));
        assert!(files.len() > 40, "{}", files.len());
        for (name, text) in &files {
            let v: Value = serde_json::from_str(text).unwrap();
            assert!(v.is_object(), "{name}");
        }
    }
}
