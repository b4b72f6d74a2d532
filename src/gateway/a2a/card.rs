//! Agent cards: the router's (`/.well-known/agent-card.json`, skills = the MAP agents the
//! caller may see) and one per MAP agent (`/a2a/agents/{id}/.well-known/agent-card.json`), in
//! v1.0 shape, and the same in v0.3 shape at `…/.well-known/agent.json`.
//!
//! Owns: the card JSON and what it says about authentication ([`Security`]), and which card a
//! request gets ([`Shape`]: `…/agent-card.json` serves the version its `A2A-Version` header
//! asks for). Pure functions.
//!
//! A v1.0 card lists two interfaces at the same URL, `JSONRPC` 1.0 and `JSONRPC` 0.3, because
//! the endpoint answers both method sets; `ClientFactory` picks 1.0. The security schemes are
//! written in proto-JSON form (`{"httpAuthSecurityScheme": {...}}`), which the SDK's card
//! resolver recognises and parses; the v0.3 card uses the OpenAPI form (`{"type": "http"}`).

use serde_json::{json, Value};

use crate::protocol::agent::Agent;

/// How A2A callers authenticate, as the cards announce it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Security {
    /// `Authorization: Bearer <JWT>`.
    pub bearer_jwt: bool,
    /// An API key (`Authorization: Bearer <key>`, or the `X-API-Key` header).
    pub api_key: bool,
}

impl Security {
    fn v1(self) -> (Value, Value) {
        let mut schemes = serde_json::Map::new();
        let mut reqs = Vec::new();
        if self.bearer_jwt {
            schemes.insert(
                "bearer".into(),
                json!({"httpAuthSecurityScheme": {"scheme": "Bearer", "bearerFormat": "JWT",
                    "description": "A JWT the router accepts ([auth.jwt])"}}),
            );
            reqs.push(json!({"schemes": {"bearer": {"list": []}}}));
        }
        if self.api_key {
            schemes.insert(
                "apiKey".into(),
                json!({"apiKeySecurityScheme": {"location": "header", "name": "X-API-Key",
                    "description": "An API key of the router ([auth.api_keys]); also accepted as Authorization: Bearer"}}),
            );
            reqs.push(json!({"schemes": {"apiKey": {"list": []}}}));
        }
        (Value::Object(schemes), Value::Array(reqs))
    }

    fn v03(self) -> (Value, Value) {
        let mut schemes = serde_json::Map::new();
        let mut reqs = Vec::new();
        if self.bearer_jwt {
            schemes.insert(
                "bearer".into(),
                json!({"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}),
            );
            reqs.push(json!({"bearer": []}));
        }
        if self.api_key {
            schemes.insert(
                "apiKey".into(),
                json!({"type": "apiKey", "in": "header", "name": "X-API-Key"}),
            );
            reqs.push(json!({"apiKey": []}));
        }
        (Value::Object(schemes), Value::Array(reqs))
    }

    fn any(self) -> bool {
        self.bearer_jwt || self.api_key
    }
}

/// What every card says about the router.
#[derive(Debug, Clone)]
pub struct CardContext {
    /// `http://host:port` or `https://…`, no trailing slash.
    pub base: String,
    /// The router's name (`[router] name`).
    pub router_name: String,
    /// Authentication.
    pub security: Security,
    /// Whether push notifications are offered.
    pub push: bool,
}

const MODES: [&str; 2] = ["text/plain", "application/json"];

fn skill(a: &Agent) -> Value {
    let mut tags: Vec<String> = vec!["map-agent".into()];
    if let Some(role) = &a.role {
        tags.push(role.clone());
    }
    json!({
        "id": a.id,
        "name": a.name.clone().unwrap_or_else(|| a.id.to_string()),
        "description": a.description.clone().unwrap_or_else(|| format!("MAP agent {}", a.id)),
        "tags": tags,
    })
}

fn v1_card(
    ctx: &CardContext,
    name: String,
    description: String,
    url: &str,
    skills: Vec<Value>,
) -> Value {
    let mut card = json!({
        "name": name,
        "description": description,
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        ],
        "provider": {"organization": ctx.router_name, "url": ctx.base},
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {"streaming": true, "pushNotifications": ctx.push, "extendedAgentCard": false},
        "defaultInputModes": MODES,
        "defaultOutputModes": MODES,
        "skills": skills,
    });
    if ctx.security.any() {
        let (schemes, reqs) = ctx.security.v1();
        card["securitySchemes"] = schemes;
        card["securityRequirements"] = reqs;
    }
    card
}

fn v03_card(
    ctx: &CardContext,
    name: String,
    description: String,
    url: &str,
    skills: Vec<Value>,
) -> Value {
    let mut card = json!({
        "protocolVersion": "0.3.0",
        "name": name,
        "description": description,
        "url": url,
        "preferredTransport": "JSONRPC",
        "provider": {"organization": ctx.router_name, "url": ctx.base},
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {"streaming": true, "pushNotifications": ctx.push, "stateTransitionHistory": false},
        "defaultInputModes": MODES,
        "defaultOutputModes": MODES,
        "skills": skills,
        "supportsAuthenticatedExtendedCard": false,
    });
    if ctx.security.any() {
        let (schemes, reqs) = ctx.security.v03();
        card["securitySchemes"] = schemes;
        card["security"] = reqs;
    }
    card
}

/// Which card a request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The v1.0 card (`A2A-Version: 1.0`, or a version the gateway does not speak, as
    /// `@a2a-js/sdk`'s card handler does).
    V1,
    /// The v0.3 card (`…/agent.json`, or `A2A-Version: 0.3`).
    V03,
    /// `…/agent-card.json` without `A2A-Version`, which A2A 1.0 §3.6.2 reads as a v0.3
    /// caller: the v0.3 card (its security schemes in v0.3 form) with the v1.0 card's members
    /// it lacks (`supportedInterfaces`, `securityRequirements`, the v1.0 capabilities), so that
    /// a v0.3 client and a v1.0 client that sends no header can both use it.
    Unasked,
}

/// Merges the v1.0 card `v1` into the v0.3 card `v03` ([`Shape::Unasked`]).
fn merged(v1: Value, mut v03: Value) -> Value {
    let (Value::Object(v1), Some(out)) = (v1, v03.as_object_mut()) else {
        return v03;
    };
    for (k, val) in v1 {
        match (k.as_str(), val) {
            ("capabilities", Value::Object(caps)) => {
                if let Some(Value::Object(mine)) = out.get_mut("capabilities") {
                    for (ck, cv) in caps {
                        mine.entry(ck).or_insert(cv);
                    }
                }
            }
            // The two versions write schemes differently: the v0.3 form is kept.
            ("securitySchemes", _) => {}
            (_, val) => {
                out.entry(k).or_insert(val);
            }
        }
    }
    v03
}

/// The endpoint of one agent.
pub fn agent_url(ctx: &CardContext, agent: &Agent) -> String {
    format!("{}/a2a/agents/{}", ctx.base, agent.id)
}

/// The card of one MAP agent in `shape`.
pub fn agent_card(ctx: &CardContext, agent: &Agent, shape: Shape) -> Value {
    let name = agent.name.clone().unwrap_or_else(|| agent.id.to_string());
    let description = agent.description.clone().unwrap_or_else(|| {
        format!(
            "MAP agent {} on {}, through the A2A gateway",
            agent.id, ctx.router_name
        )
    });
    let url = agent_url(ctx, agent);
    let skills = vec![skill(agent)];
    shaped(ctx, shape, name, description, &url, skills)
}

fn shaped(
    ctx: &CardContext,
    shape: Shape,
    name: String,
    description: String,
    url: &str,
    skills: Vec<Value>,
) -> Value {
    match shape {
        Shape::V1 => v1_card(ctx, name, description, url, skills),
        Shape::V03 => v03_card(ctx, name, description, url, skills),
        Shape::Unasked => merged(
            v1_card(ctx, name.clone(), description.clone(), url, skills.clone()),
            v03_card(ctx, name, description, url, skills),
        ),
    }
}

/// The router's card: one skill per agent; its endpoint (`/a2a`) serves every agent's tasks and
/// takes follow-ups. New tasks go to `/a2a/agents/{skill id}`.
pub fn router_card(ctx: &CardContext, agents: &[Agent], shape: Shape) -> Value {
    let name = ctx.router_name.clone();
    let description = format!(
        "MAP router {}: each skill is a MAP agent, reachable over A2A at {}/a2a/agents/{{skill id}}",
        ctx.router_name, ctx.base
    );
    let url = format!("{}/a2a", ctx.base);
    let skills = agents.iter().map(skill).collect();
    shaped(ctx, shape, name, description, &url, skills)
}

/// `ms` (Unix milliseconds) as an HTTP date (`Thu, 01 Jan 1970 00:00:00 GMT`, RFC 9110 §5.6.7).
pub fn http_date(ms: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    // `2026-11-25T11:30:00.123Z`
    let t = crate::gateway::a2a::record::rfc3339(ms);
    let month: usize = t[5..7].parse().unwrap_or(1);
    let weekday = DAYS[usize::try_from((ms / 86_400_000) % 7).unwrap_or(0)];
    format!(
        "{weekday}, {} {} {} {} GMT",
        &t[8..10],
        MONTHS[month.clamp(1, 12) - 1],
        &t[0..4],
        &t[11..19]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates() {
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(
            http_date(1_764_070_200_123),
            "Tue, 25 Nov 2025 11:30:00 GMT"
        );
    }

    #[test]
    fn the_unasked_card_serves_both_versions() {
        let ctx = CardContext {
            base: "http://h".into(),
            router_name: "r".into(),
            security: Security {
                bearer_jwt: true,
                api_key: false,
            },
            push: false,
        };
        let card = router_card(&ctx, &[], Shape::Unasked);
        assert_eq!(card["protocolVersion"], "0.3.0");
        assert_eq!(card["url"], "http://h/a2a");
        assert_eq!(card["supportedInterfaces"][0]["protocolVersion"], "1.0");
        assert_eq!(card["capabilities"]["extendedAgentCard"], false);
        assert_eq!(card["capabilities"]["stateTransitionHistory"], false);
        assert_eq!(card["securitySchemes"]["bearer"]["type"], "http");
        assert!(card["securityRequirements"].is_array() && card["security"].is_array());
    }
}
