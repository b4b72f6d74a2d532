//! Agent cards: the router's (`/.well-known/agent-card.json`, skills = the MAP agents the
//! caller may see) and one per MAP agent (`/a2a/agents/{id}/.well-known/agent-card.json`), in
//! v1.0 shape, and the same in v0.3 shape at `…/.well-known/agent.json`.
//!
//! Owns: the card JSON and what it says about authentication ([`Security`]). Pure functions.
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

/// The endpoint of one agent.
pub fn agent_url(ctx: &CardContext, agent: &Agent) -> String {
    format!("{}/a2a/agents/{}", ctx.base, agent.id)
}

/// The card of one MAP agent, v1.0 (`legacy` false) or v0.3.
pub fn agent_card(ctx: &CardContext, agent: &Agent, legacy: bool) -> Value {
    let name = agent.name.clone().unwrap_or_else(|| agent.id.to_string());
    let description = agent.description.clone().unwrap_or_else(|| {
        format!(
            "MAP agent {} on {}, through the A2A gateway",
            agent.id, ctx.router_name
        )
    });
    let url = agent_url(ctx, agent);
    let skills = vec![skill(agent)];
    if legacy {
        v03_card(ctx, name, description, &url, skills)
    } else {
        v1_card(ctx, name, description, &url, skills)
    }
}

/// The router's card: one skill per agent; its endpoint (`/a2a`) serves every agent's tasks and
/// takes follow-ups. New tasks go to `/a2a/agents/{skill id}`.
pub fn router_card(ctx: &CardContext, agents: &[Agent], legacy: bool) -> Value {
    let name = ctx.router_name.clone();
    let description = format!(
        "MAP router {}: each skill is a MAP agent, reachable over A2A at {}/a2a/agents/{{skill id}}",
        ctx.router_name, ctx.base
    );
    let url = format!("{}/a2a", ctx.base);
    let skills = agents.iter().map(skill).collect();
    if legacy {
        v03_card(ctx, name, description, &url, skills)
    } else {
        v1_card(ctx, name, description, &url, skills)
    }
}
