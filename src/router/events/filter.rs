//! Subscription filters, compiled once at subscribe time and matched per event.
//!
//! Semantics (events.md §4): AND across fields, OR within a list, an absent or empty list is no
//! constraint. Event types match in either spelling (`agent_registered` / `agent.registered`),
//! with `prefix.*` and `*` wildcards; they compile to a bit mask over the types we emit. Our
//! vendor types (`EventType::is_vendor`) pass only a filter that names them exactly.

use crate::router::ids::IdHasher;

/// A filter's list of names, hashed with the router's id hasher (foldhash; std's SipHash was
/// most of a match's cost).
pub type NameSet = std::collections::HashSet<String, IdHasher>;

use crate::protocol::event::{EventType, SubscriptionFilter};
use crate::protocol::jsonrpc::ErrorObject;

use crate::router::events::log::EventRecord;

type JsonMap = serde_json::Map<String, serde_json::Value>;

/// A compiled filter.
#[derive(Debug, Clone, Default)]
pub struct CompiledFilter {
    /// Bit i set = `EventType::ALL[i]` passes. `None` = every type.
    types: Option<u64>,
    from_agents: Option<NameSet>,
    from_roles: Option<NameSet>,
    roles: Option<NameSet>,
    scopes: Option<NameSet>,
    priorities: Option<NameSet>,
    correlation_ids: Option<NameSet>,
    metadata_match: Option<JsonMap>,
    environment_match: Option<Vec<(Vec<String>, serde_json::Value)>>,
    /// A `mail` extension filter: only `mail.*` events, narrowed by its fields.
    mail: Option<crate::protocol::event::MailFilter>,
    /// A `trajectory` extension filter: only `trajectory.*` events, of this agent and work
    /// session when given.
    trajectory: Option<(Option<String>, Option<String>)>,
    /// A `tasks` filter: only `task.*` events, of these tasks when given.
    tasks: Option<Option<NameSet>>,
}

fn set(list: &Option<Vec<String>>) -> Option<NameSet> {
    match list {
        Some(v) if !v.is_empty() => Some(v.iter().cloned().collect()),
        _ => None,
    }
}

/// The filter field that narrows a subscription the most, for the subscription index
/// (`router::events::index`): each is a condition every admitted event meets.
#[derive(Debug, Clone, Copy)]
pub enum IndexKey<'a> {
    /// The event names one of these scopes.
    Scopes(&'a NameSet),
    /// The event's source is one of these agents.
    Agents(&'a NameSet),
    /// The event's type is one of these (bit i = `EventType::ALL[i]`).
    Types(u64),
    /// Nothing narrows it.
    Any,
}

/// Normalises an event type name: `_` → `.`.
pub fn normalize_type(t: &str) -> String {
    t.replace('_', ".")
}

impl CompiledFilter {
    /// Compiles a wire filter. Errors (`-32602`) for event-type patterns that are malformed.
    pub fn compile(filter: Option<&SubscriptionFilter>) -> Result<Self, ErrorObject> {
        let Some(f) = filter else {
            return Ok(Self::default());
        };
        let types = match &f.event_types {
            Some(list) if !list.is_empty() => {
                let mut mask = 0u64;
                for pattern in list {
                    if pattern.is_empty() {
                        return Err(ErrorObject::invalid_params(
                            "filter.eventTypes must not contain empty strings",
                        ));
                    }
                    let p = normalize_type(pattern);
                    for (i, t) in EventType::ALL.iter().enumerate() {
                        // A vendor type only by its exact name (EventType::is_vendor).
                        let matched = if t.is_vendor() {
                            p == t.normalized()
                        } else {
                            type_matches(&p, t.normalized())
                        };
                        if matched {
                            mask |= 1u64 << i;
                        }
                    }
                }
                Some(mask)
            }
            _ => None,
        };
        let mut from_agents = set(&f.from_agents);
        if let Some(extra) = set(&f.agents) {
            from_agents
                .get_or_insert_with(NameSet::default)
                .extend(extra);
        }
        let environment_match = f
            .environment_match
            .as_ref()
            .filter(|m| !m.is_empty())
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.split('.').map(str::to_owned).collect(), v.clone()))
                    .collect()
            });
        Ok(Self {
            types,
            from_agents,
            from_roles: set(&f.from_roles),
            roles: set(&f.roles),
            scopes: set(&f.scopes),
            priorities: set(&f.priorities),
            correlation_ids: set(&f.correlation_ids),
            metadata_match: f.metadata_match.clone().filter(|m| !m.is_empty()),
            environment_match,
            mail: f.mail.clone(),
            trajectory: f
                .trajectory
                .as_ref()
                .map(|t| (t.agent_id.clone(), t.session_id.clone())),
            tasks: f.tasks.as_ref().map(|t| set(&t.task_ids)),
        })
    }

    /// Whether the filter lets `rec` through. `environment` looks up the current environment of
    /// the agent the event is about (for `environmentMatch`).
    pub fn matches<'a>(
        &self,
        rec: &EventRecord,
        environment: impl FnOnce(&str) -> Option<&'a JsonMap>,
    ) -> bool {
        if let Some(m) = &self.mail {
            let Some(keys) = rec.keys.mail.as_deref().filter(|_| rec.kind.is_mail()) else {
                return false;
            };
            let differs = |want: &Option<String>, have: &Option<String>| {
                want.as_ref().is_some_and(|w| have.as_ref() != Some(w))
            };
            if m.conversation_id
                .as_ref()
                .is_some_and(|c| *c != keys.conversation_id)
                || differs(&m.thread_id, &keys.thread_id)
                || differs(&m.participant_id, &keys.participant_id)
                || differs(&m.content_type, &keys.content_type)
            {
                return false;
            }
        }
        if let Some((agent, session)) = &self.trajectory {
            if rec.kind != EventType::TrajectoryCheckpoint {
                return false;
            }
            if agent
                .as_deref()
                .is_some_and(|a| rec.keys.agent_id.as_ref().is_none_or(|k| k.as_str() != a))
            {
                return false;
            }
            if session
                .as_deref()
                .is_some_and(|s| rec.keys.work_session.as_deref() != Some(s))
            {
                return false;
            }
        }
        if let Some(ids) = &self.tasks {
            if !rec.kind.is_task() {
                return false;
            }
            if ids
                .as_ref()
                .is_some_and(|ids| rec.keys.task_id.as_deref().is_none_or(|t| !ids.contains(t)))
            {
                return false;
            }
        }
        match self.types {
            Some(mask) if mask & (1u64 << rec.kind.index()) == 0 => return false,
            Some(_) => {}
            // No `eventTypes`: every standard type, no vendor one.
            None if rec.kind.is_vendor() => return false,
            None => {}
        }
        if let Some(agents) = &self.from_agents {
            match &rec.source {
                Some(s) if agents.contains(&**s) => {}
                _ => return false,
            }
        }
        if let Some(roles) = &self.from_roles {
            match &rec.keys.source_role {
                Some(r) if roles.contains(&**r) => {}
                _ => return false,
            }
        }
        if let Some(roles) = &self.roles {
            match &rec.keys.subject_role {
                Some(r) if roles.contains(&**r) => {}
                _ => return false,
            }
        }
        if let Some(scopes) = &self.scopes {
            if !rec.keys.scopes.iter().any(|s| scopes.contains(s.as_str())) {
                return false;
            }
        }
        if let Some(priorities) = &self.priorities {
            match &rec.keys.priority {
                Some(p) if priorities.contains(&**p) => {}
                _ => return false,
            }
        }
        if let Some(ids) = &self.correlation_ids {
            if !rec.keys.correlation_ids.iter().any(|c| ids.contains(&**c)) {
                return false;
            }
        }
        if let Some(want) = &self.metadata_match {
            let Some(have) = &rec.keys.metadata else {
                return false;
            };
            if !want.iter().all(|(k, v)| have.get(k) == Some(v)) {
                return false;
            }
        }
        if let Some(paths) = &self.environment_match {
            let env = rec
                .keys
                .agent_id
                .as_ref()
                .map(|a| a.as_str())
                .or(rec.source.as_deref())
                .and_then(environment);
            let Some(env) = env else {
                return false;
            };
            for (path, want) in paths {
                if resolve_path(env, path) != Some(want) {
                    return false;
                }
            }
        }
        true
    }

    /// The key the subscription index files this filter under (see [`IndexKey`]).
    pub fn index_key(&self) -> IndexKey<'_> {
        if let Some(scopes) = &self.scopes {
            IndexKey::Scopes(scopes)
        } else if let Some(agents) = &self.from_agents {
            IndexKey::Agents(agents)
        } else if let Some(mask) = self.types {
            IndexKey::Types(mask)
        } else {
            IndexKey::Any
        }
    }

    /// Whether this filter admits every event of a standard type (vendor types need naming;
    /// used by tests and fast paths).
    pub fn is_match_all(&self) -> bool {
        self.types.is_none()
            && self.from_agents.is_none()
            && self.from_roles.is_none()
            && self.roles.is_none()
            && self.scopes.is_none()
            && self.priorities.is_none()
            && self.correlation_ids.is_none()
            && self.metadata_match.is_none()
            && self.environment_match.is_none()
            && self.mail.is_none()
            && self.trajectory.is_none()
            && self.tasks.is_none()
    }
}

/// `pattern` and `name` are both normalised (dotted).
fn type_matches(pattern: &str, name: &str) -> bool {
    if pattern == "*" || pattern == name {
        return true;
    }
    match pattern.strip_suffix(".*") {
        Some(prefix) => name
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('.')),
        None => false,
    }
}

fn resolve_path<'a>(root: &'a JsonMap, path: &[String]) -> Option<&'a serde_json::Value> {
    let (first, rest) = path.split_first()?;
    let mut cur = root.get(first)?;
    for key in rest {
        cur = cur.as_object()?.get(key)?;
    }
    Some(cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::events::log::Audience;
    use crate::router::events::log::FilterKeys;
    use std::sync::Arc;

    fn record(kind: EventType, source: Option<&str>, keys: FilterKeys) -> EventRecord {
        let mut r = EventRecord::synthetic(kind, "{}".into(), Audience::Everyone);
        r.source = source.map(Arc::from);
        r.keys = keys;
        r
    }

    fn compile(json: serde_json::Value) -> CompiledFilter {
        let f: SubscriptionFilter = serde_json::from_value(json).unwrap();
        CompiledFilter::compile(Some(&f)).unwrap()
    }

    fn no_env(_: &str) -> Option<&'static JsonMap> {
        None
    }

    #[test]
    fn absent_and_empty_filters_match_everything() {
        let r = record(EventType::ScopeCreated, None, FilterKeys::default());
        assert!(CompiledFilter::compile(None).unwrap().matches(&r, no_env));
        let f = compile(serde_json::json!({"eventTypes": [], "fromAgents": []}));
        assert!(f.is_match_all());
        assert!(f.matches(&r, no_env));
    }

    #[test]
    fn event_types_match_in_both_spellings_and_with_wildcards() {
        let r = record(EventType::AgentRegistered, None, FilterKeys::default());
        for p in [
            "agent_registered",
            "agent.registered",
            "agent.*",
            "agent_*",
            "*",
        ] {
            assert!(
                compile(serde_json::json!({"eventTypes": [p]})).matches(&r, no_env),
                "{p}"
            );
        }
        for p in [
            "agent_unregistered",
            "scope.*",
            "agent.reg",
            "agent.registered.*",
        ] {
            assert!(
                !compile(serde_json::json!({"eventTypes": [p]})).matches(&r, no_env),
                "{p}"
            );
        }
    }

    #[test]
    fn from_agents_fails_events_without_a_source() {
        let f = compile(serde_json::json!({"fromAgents": ["a1"]}));
        assert!(f.matches(
            &record(
                EventType::AgentRegistered,
                Some("a1"),
                FilterKeys::default()
            ),
            no_env
        ));
        assert!(!f.matches(
            &record(
                EventType::AgentRegistered,
                Some("a2"),
                FilterKeys::default()
            ),
            no_env
        ));
        assert!(!f.matches(
            &record(EventType::ScopeCreated, None, FilterKeys::default()),
            no_env
        ));
    }

    #[test]
    fn scopes_roles_priorities_correlation_and_metadata() {
        let keys = FilterKeys {
            scopes: vec!["child".into(), "root".into()],
            subject_role: Some("worker".into()),
            priority: Some("high".into()),
            correlation_ids: vec!["c1".into()],
            metadata: Some(Arc::new(
                serde_json::json!({"team": "red", "n": 1})
                    .as_object()
                    .unwrap()
                    .clone(),
            )),
            ..FilterKeys::default()
        };
        let r = record(EventType::MessageSent, Some("a"), keys);
        assert!(
            compile(serde_json::json!({"scopes": ["root"]})).matches(&r, no_env),
            "ancestor scope"
        );
        assert!(!compile(serde_json::json!({"scopes": ["other"]})).matches(&r, no_env));
        assert!(compile(serde_json::json!({"roles": ["worker", "x"]})).matches(&r, no_env));
        assert!(!compile(serde_json::json!({"roles": ["boss"]})).matches(&r, no_env));
        assert!(compile(serde_json::json!({"priorities": ["high"]})).matches(&r, no_env));
        assert!(compile(serde_json::json!({"correlationIds": ["c1"]})).matches(&r, no_env));
        assert!(!compile(serde_json::json!({"correlationIds": ["c2"]})).matches(&r, no_env));
        assert!(compile(serde_json::json!({"metadataMatch": {"team": "red"}})).matches(&r, no_env));
        assert!(
            !compile(serde_json::json!({"metadataMatch": {"team": "blue"}})).matches(&r, no_env)
        );
        // AND across fields.
        assert!(
            !compile(serde_json::json!({"roles": ["worker"], "priorities": ["low"]}))
                .matches(&r, no_env)
        );
    }

    #[test]
    fn environment_match_resolves_dot_paths() {
        let env = serde_json::json!({"os": {"type": "linux"}})
            .as_object()
            .unwrap()
            .clone();
        let keys = FilterKeys {
            agent_id: Some("a".into()),
            ..FilterKeys::default()
        };
        let r = record(EventType::AgentStateChanged, Some("a"), keys);
        let f = compile(serde_json::json!({"environmentMatch": {"os.type": "linux"}}));
        assert!(f.matches(&r, |id| (id == "a").then_some(&env)));
        let g = compile(serde_json::json!({"environmentMatch": {"os.type": "mac"}}));
        assert!(!g.matches(&r, |_| Some(&env)));
    }

    #[test]
    fn extension_filters_match_nothing_we_emit() {
        let f = compile(serde_json::json!({"mail": {"conversationId": "c"}}));
        assert!(!f.matches(
            &record(EventType::MessageSent, Some("a"), FilterKeys::default()),
            no_env
        ));
    }
}
