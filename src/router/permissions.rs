//! Permission decisions as pure functions of (viewer, target, registry, policy).
//!
//! Owns *what is allowed* and the configuration that shapes it ([`Policy`], `[permissions]`
//! in the config file). It never mutates state and never produces wire errors (callers map a
//! `false` to `RouterError::PermissionDenied` or, where existence must not leak, to "not
//! found"). The four layers of `../shared/spec/permissions.md`, most restrictive wins:
//!
//! 1. **System exposure** ([`Exposure`]): agents and scopes matched by hidden globs do not exist
//!    for non-system participants; hidden event types are never delivered to them (they are
//!    still logged for system observers).
//! 2. **Participant capabilities** ([`grant`]): the default matrix per participant type,
//!    overridden per type and per authenticated principal from the configuration, narrowed by
//!    what the participant asks for; checked per method by the dispatcher.
//! 3. **Scope rules** ([`can_see_scope`], [`can_join_scope`], [`can_send_to_scope`]):
//!    `visibility`, `joinPolicy` (+ `autoJoinRoles`) and `sendPolicy`.
//! 4. **Agent rules** ([`can_see_agent`], [`can_message_agent`], [`can_control_agent`],
//!    [`can_manage_lifecycle`]): `visibility` (`public`, `parent-only`, `scope`, `system`), and
//!    the agent permission model (`canSee`, `canMessage`, `acceptsFrom`; defaults and per-role
//!    rules from the configuration, per-agent `permissionOverrides`).
//!
//! Every path that shows or acts on an agent, scope or event goes through these functions:
//! list, get, graph, scope members, live events, replay, message recipients, lifecycle and
//! steering calls.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::protocol::agent::{Agent, AgentVisibility};
use crate::protocol::capabilities::{ParticipantCapabilities, ParticipantType};
use crate::protocol::ids::{AgentId, ParticipantId, ScopeId};
use crate::protocol::methods::session::Principal;
use crate::protocol::scope::{JoinPolicy, ScopeVisibility, SendPolicy};

use crate::router::events::log::Audience;
use crate::router::scopes::table::ScopeRecord;
use crate::router::views::AgentView;

// ---------------------------------------------------------------------------------------------
// Configuration

/// `[permissions]`: the policy every decision reads. The default is the open MAP matrix.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "snake_case")]
pub struct Policy {
    /// Layer 1: what the system exposes to non-system participants.
    pub exposure: Exposure,
    /// Whether clients with `lifecycle.canStop` / `canSteer` may stop, suspend, resume and
    /// inject into any agent they can see (`visible`, the default: clients are operators), or
    /// only agents they control (`controlled`).
    pub client_lifecycle: ClientLifecycle,
    /// Capability overrides per participant type (`[permissions.types.client]`, ...), applied
    /// over the default matrix.
    pub types: HashMap<ParticipantType, ParticipantCapabilities>,
    /// Capability overrides per authenticated principal id (`[permissions.principals."alice"]`),
    /// applied over the type's grant.
    pub principals: HashMap<String, ParticipantCapabilities>,
    /// Agent permissions every agent starts from.
    pub agent_defaults: AgentPermissions,
    /// Agent permissions per role, over the defaults.
    pub roles: HashMap<String, AgentPermissions>,
}

/// Who may stop, suspend, resume and inject, among clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientLifecycle {
    /// Any agent the client can see.
    #[default]
    Visible,
    /// Only agents the client controls (clients own no agents, so: none).
    Controlled,
}

/// Layer 1 (`SystemExposure`). Globs: `*` any run, `?` one character, whole-string match.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Exposure {
    /// Agent ids.
    pub agents: GlobRule,
    /// Scope ids.
    pub scopes: GlobRule,
    /// Event types never delivered to non-system participants (either spelling matches).
    pub hidden_event_types: Vec<String>,
}

/// Which ids are exposed.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct GlobRule {
    /// Exposed unless matched by `hidden` (and not by `public`).
    pub public_by_default: bool,
    /// Always exposed (wins over `public_by_default = false`).
    pub public: Vec<String>,
    /// Never exposed (wins over everything).
    pub hidden: Vec<String>,
}

impl Default for GlobRule {
    fn default() -> Self {
        Self {
            public_by_default: true,
            public: Vec::new(),
            hidden: Vec::new(),
        }
    }
}

impl GlobRule {
    fn exposes(&self, id: &str) -> bool {
        if self.hidden.iter().any(|g| glob_match(g, id)) {
            return false;
        }
        self.public_by_default || self.public.iter().any(|g| glob_match(g, id))
    }
}

/// Whether `text` matches `pattern` as a whole (`*` = any run, `?` = one character).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// A rule about other agents (`canSee.agents`, `canMessage.agents`, `acceptsFrom.agents`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum AgentRule {
    /// `all`, `hierarchy` (parent, child, ancestor or descendant), `scoped` (shares a scope),
    /// `direct` (none but itself).
    Named(AgentRuleName),
    /// `{include: [agent ids]}`.
    Include {
        /// The agents allowed.
        include: Vec<String>,
    },
}

/// The named [`AgentRule`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentRuleName {
    /// Every agent.
    All,
    /// Parent, children, ancestors, descendants.
    Hierarchy,
    /// Agents sharing a scope.
    Scoped,
    /// None but itself.
    Direct,
}

/// A rule about participants of one type (`acceptsFrom.clients`, `acceptsFrom.systems`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum ParticipantRule {
    /// `all` or `none`.
    Named(AllOrNone),
    /// `{include: [participant ids]}`.
    Include {
        /// The participants allowed.
        include: Vec<String>,
    },
}

/// `all` or `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AllOrNone {
    /// Everyone.
    All,
    /// Nobody.
    None,
}

/// A rule about scopes (`canSee.scopes`): `all`, `member` or `{include}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum ScopeRule {
    /// `all` or `member`.
    Named(ScopeRuleName),
    /// `{include: [scope ids]}`.
    Include {
        /// The scopes allowed.
        include: Vec<String>,
    },
}

/// The named [`ScopeRule`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScopeRuleName {
    /// Every scope.
    All,
    /// Scopes the agent is a member of.
    Member,
}

/// `AgentPermissions` (SDK shape, camelCase): every field optional, so that layers merge.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AgentPermissions {
    /// What the agent can see.
    pub can_see: CanSee,
    /// Whom the agent can message.
    pub can_message: CanMessage,
    /// From whom the agent accepts messages.
    pub accepts_from: AcceptsFrom,
}

/// `canSee`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct CanSee {
    /// Agents.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agents: Option<AgentRule>,
    /// Scopes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scopes: Option<ScopeRule>,
}

/// `canMessage`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct CanMessage {
    /// Agents.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agents: Option<AgentRule>,
}

/// `acceptsFrom`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AcceptsFrom {
    /// Agents (by their relation to the recipient).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agents: Option<AgentRule>,
    /// Client participants.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clients: Option<ParticipantRule>,
    /// System and gateway participants.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub systems: Option<ParticipantRule>,
}

impl AgentPermissions {
    /// `self` with every field `over` sets replaced (`deepMergePermissions`).
    pub fn merged(mut self, over: &AgentPermissions) -> Self {
        fn set<T: Clone>(v: &mut Option<T>, o: &Option<T>) {
            if o.is_some() {
                v.clone_from(o);
            }
        }
        set(&mut self.can_see.agents, &over.can_see.agents);
        set(&mut self.can_see.scopes, &over.can_see.scopes);
        set(&mut self.can_message.agents, &over.can_message.agents);
        set(&mut self.accepts_from.agents, &over.accepts_from.agents);
        set(&mut self.accepts_from.clients, &over.accepts_from.clients);
        set(&mut self.accepts_from.systems, &over.accepts_from.systems);
        self
    }

    fn is_open(&self) -> bool {
        let all = Some(AgentRule::Named(AgentRuleName::All));
        let open = |r: &Option<AgentRule>| r.is_none() || *r == all;
        open(&self.can_see.agents)
            && matches!(
                self.can_see.scopes,
                None | Some(ScopeRule::Named(ScopeRuleName::All))
            )
            && open(&self.can_message.agents)
            && open(&self.accepts_from.agents)
            && matches!(
                self.accepts_from.clients,
                None | Some(ParticipantRule::Named(AllOrNone::All))
            )
            && matches!(
                self.accepts_from.systems,
                None | Some(ParticipantRule::Named(AllOrNone::All))
            )
    }
}

/// Parses an agent's `permissionOverrides` (the SDK's `AgentPermissions` shape).
///
/// # Errors
/// A message naming what is wrong, for `-32602`.
pub fn parse_overrides(
    overrides: &serde_json::Map<String, serde_json::Value>,
) -> Result<AgentPermissions, String> {
    serde_json::from_value(serde_json::Value::Object(overrides.clone()))
        .map_err(|e| format!("permissionOverrides: {e}"))
}

/// The agent's effective permissions: defaults, then its role's, then its own overrides
/// (`resolveAgentPermissions`, without the SDK's mapping of `visibility` onto `canSee`:
/// visibility says who sees the agent, not what it sees).
pub fn resolve_agent_permissions(agent: &Agent, policy: &Policy) -> AgentPermissions {
    let mut p = policy.agent_defaults.clone();
    if let Some(role) = agent.role.as_deref().and_then(|r| policy.roles.get(r)) {
        p = p.merged(role);
    }
    if let Some(over) = agent.permission_overrides.as_ref() {
        // Stored overrides were validated when they were set; a bad one counts as none.
        if let Ok(over) = parse_overrides(over) {
            p = p.merged(&over);
        }
    }
    p
}

/// Whether `agent` may have rules narrower than "everything" (cheap pre-check, so that open
/// configurations skip resolution on hot paths).
fn may_restrict(agent: &Agent, policy: &Policy) -> bool {
    agent.permission_overrides.is_some()
        || !policy.agent_defaults.is_open()
        || agent
            .role
            .as_deref()
            .is_some_and(|r| policy.roles.contains_key(r))
}

// ---------------------------------------------------------------------------------------------
// Layer 2: capabilities

/// The capabilities a participant gets: the default matrix for its type, overridden by the
/// configuration for its type and then for its principal, narrowed by what it asked for.
pub fn grant(
    policy: &Policy,
    kind: ParticipantType,
    principal: Option<&str>,
    requested: Option<&ParticipantCapabilities>,
) -> ParticipantCapabilities {
    let mut caps = ParticipantCapabilities::defaults_for(kind);
    if let Some(over) = policy.types.get(&kind) {
        caps = caps.overlaid_by(over);
    }
    if let Some(over) = principal.and_then(|p| policy.principals.get(p)) {
        caps = caps.overlaid_by(over);
    }
    match requested {
        Some(r) => caps.narrowed_by(r),
        None => caps,
    }
}

// ---------------------------------------------------------------------------------------------
// Viewers

/// The participant a decision is about.
#[derive(Debug, Clone, Copy)]
pub struct Viewer<'a> {
    /// Its participant id.
    pub participant: &'a ParticipantId,
    /// Its declared type.
    pub kind: ParticipantType,
    /// The agent it speaks as (its primary agent), whose `canSee` / `canMessage` rules apply.
    pub agent: Option<&'a AgentId>,
    /// The principal it authenticated as (none with authentication off).
    pub principal: Option<&'a Principal>,
    /// The policy.
    pub policy: &'a Policy,
}

impl Viewer<'_> {
    /// System participants see and may do everything.
    pub fn is_system(&self) -> bool {
        self.kind == ParticipantType::System
    }
}

/// A shared policy for places that keep one (the router, the event bus).
pub type SharedPolicy = Arc<Policy>;

/// Whether `viewer` owns an agent that is a member of any of `scopes`.
fn shares_scope(viewer: &Viewer<'_>, scopes: &[ScopeId], reg: AgentView<'_>) -> bool {
    if scopes.is_empty() {
        return false;
    }
    reg.owned_by(viewer.participant)
        .iter()
        .any(|a| reg.scopes_of(a).iter().any(|s| scopes.contains(s)))
}

/// The scopes of `agent`: those it is a member of, and those a record being announced carries
/// (an agent registering is announced with the scopes it is joining).
fn scopes_of<'a>(agent: &'a Agent, reg: AgentView<'a>) -> std::borrow::Cow<'a, [ScopeId]> {
    let member = reg.scopes_of(&agent.id);
    if agent.scopes.is_empty() {
        std::borrow::Cow::Borrowed(member)
    } else if member.is_empty() {
        std::borrow::Cow::Borrowed(&agent.scopes)
    } else {
        let mut all = agent.scopes.clone();
        all.extend(member.iter().filter(|s| !agent.scopes.contains(s)).cloned());
        std::borrow::Cow::Owned(all)
    }
}

/// How `from` relates to `to` for agent rules.
fn related(rule: &AgentRule, from: &Agent, to: &Agent, reg: AgentView<'_>) -> bool {
    if from.id == to.id {
        return true;
    }
    match rule {
        AgentRule::Named(AgentRuleName::All) => true,
        AgentRule::Named(AgentRuleName::Direct) => false,
        AgentRule::Named(AgentRuleName::Hierarchy) => {
            reg.ancestors(&from.id, None).contains(&to.id)
                || reg.ancestors(&to.id, None).contains(&from.id)
        }
        AgentRule::Named(AgentRuleName::Scoped) => {
            let theirs = scopes_of(to, reg);
            scopes_of(from, reg).iter().any(|s| theirs.contains(s))
        }
        AgentRule::Include { include } => include.iter().any(|i| i == to.id.as_str()),
    }
}

// ---------------------------------------------------------------------------------------------
// Layers 1 and 4: agents

/// Layer 1: is the agent exposed at all (to non-system participants)?
pub fn agent_exposed(policy: &Policy, id: &str) -> bool {
    policy.exposure.agents.exposes(id)
}

/// May `viewer` see `agent`? Exposure, the agent's `visibility`, then (for a viewer speaking as
/// an agent) that agent's `canSee.agents`. A participant always sees the agents it owns
/// (unless they are system-only).
///
/// `scope` visibility means "the viewer owns an agent sharing a scope with it" (the SDK helper
/// always allows it; permissions.md §5 fixes that).
pub fn can_see_agent(viewer: &Viewer<'_>, agent: &Agent, reg: AgentView<'_>) -> bool {
    if viewer.is_system() {
        return true;
    }
    if !agent_exposed(viewer.policy, agent.id.as_str()) {
        return false;
    }
    let owns = |id: &AgentId| reg.is_owned_by(id, viewer.participant);
    let visible = match agent.visibility.unwrap_or_default() {
        AgentVisibility::Public => true,
        AgentVisibility::System => false,
        AgentVisibility::ParentOnly => owns(&agent.id) || agent.parent.as_ref().is_some_and(owns),
        AgentVisibility::Scope => {
            owns(&agent.id) || shares_scope(viewer, &scopes_of(agent, reg), reg)
        }
    };
    visible && viewer_agent_sees(viewer, agent, reg)
}

/// Layer 4 for viewers speaking as an agent: its `canSee.agents`.
fn viewer_agent_sees(viewer: &Viewer<'_>, agent: &Agent, reg: AgentView<'_>) -> bool {
    let Some(me) = viewer.agent.and_then(|a| reg.get(a)) else {
        return true;
    };
    if !may_restrict(me, viewer.policy) || reg.is_owned_by(&agent.id, viewer.participant) {
        return true;
    }
    match resolve_agent_permissions(me, viewer.policy).can_see.agents {
        None => true,
        Some(rule) => related(&rule, me, agent, reg),
    }
}

/// May a message from `viewer` (speaking as `sender`, if an agent) be delivered to `target`?
/// The sender must see the target, its agent's `canMessage.agents` must allow it, and the
/// target's `acceptsFrom` must accept the sender.
pub fn can_message_agent(
    viewer: &Viewer<'_>,
    sender: Option<&Agent>,
    target: &Agent,
    reg: AgentView<'_>,
) -> bool {
    can_see_agent(viewer, target, reg) && may_message_agent(viewer, sender, target, reg)
}

/// [`can_message_agent`] without its visibility check: the sender's `canMessage.agents` and the
/// target's `acceptsFrom`. On its own only for a target the sender may address unseen: the
/// sender of a request it answers (`messaging::resolve`).
pub fn may_message_agent(
    viewer: &Viewer<'_>,
    sender: Option<&Agent>,
    target: &Agent,
    reg: AgentView<'_>,
) -> bool {
    if let Some(sender) = sender {
        if may_restrict(sender, viewer.policy) {
            let rule = resolve_agent_permissions(sender, viewer.policy)
                .can_message
                .agents;
            if rule.is_some_and(|r| !related(&r, sender, target, reg)) {
                return false;
            }
        }
    }
    if !may_restrict(target, viewer.policy) {
        return true;
    }
    let accepts = resolve_agent_permissions(target, viewer.policy).accepts_from;
    let participant_rule = |rule: Option<ParticipantRule>| match rule {
        None | Some(ParticipantRule::Named(AllOrNone::All)) => true,
        Some(ParticipantRule::Named(AllOrNone::None)) => false,
        Some(ParticipantRule::Include { include }) => {
            include.iter().any(|i| i == viewer.participant.as_str())
        }
    };
    match (viewer.kind, sender) {
        (ParticipantType::Agent, Some(sender)) => accepts
            .agents
            .is_none_or(|rule| related(&rule, target, sender, reg)),
        // An agent participant without an agent of its own is judged as a client.
        (ParticipantType::Agent | ParticipantType::Client, _) => participant_rule(accepts.clients),
        (ParticipantType::System | ParticipantType::Gateway, _) => {
            participant_rule(accepts.systems)
        }
    }
}

/// May `viewer` see the participant `participant` (address a message to it, learn that it
/// exists)? A participant stands for the agents it owns: the SDK's `AgentConnection` (and our
/// Python client) connect with their agent's id as the participant id, so a participant whose
/// agent is invisible would otherwise be the way to reach that agent. Hence, as for its
/// `participant_*` events (`Router::emit_participant_event`): its id must not be hidden by the
/// agents' exposure rules, and the viewer must see every agent it owns. A participant always
/// sees itself; system participants see every one.
///
/// The principal a participant authenticated as plays no part here: a client of one principal
/// must still be able to answer another's agent (`reply()` addresses `{agent: <its from>}`).
pub fn can_see_participant(
    viewer: &Viewer<'_>,
    participant: &ParticipantId,
    reg: AgentView<'_>,
) -> bool {
    if viewer.is_system() || viewer.participant == participant {
        return true;
    }
    agent_exposed(viewer.policy, participant.as_str())
        && reg
            .owned_by(participant)
            .iter()
            .all(|a| reg.get(a).is_none_or(|r| can_see_agent(viewer, r, reg)))
}

/// May `viewer` act on `agent` as its controller (update, unregister, join it to scopes)?
/// System participants, the owner, and the owner of any ancestor may.
pub fn can_control_agent(viewer: &Viewer<'_>, agent: &Agent, reg: AgentView<'_>) -> bool {
    if viewer.is_system() || agent.owner_id.as_ref() == Some(viewer.participant) {
        return true;
    }
    reg.ancestors(&agent.id, None)
        .iter()
        .any(|a| reg.is_owned_by(a, viewer.participant))
}

/// May `viewer` stop, suspend, resume or inject into `agent`? (The capability itself,
/// `lifecycle.canStop` / `canSteer`, is checked by the dispatcher.) Its controllers may; other
/// agents may not; clients may when the policy lets them act on every agent they can see.
pub fn can_manage_lifecycle(viewer: &Viewer<'_>, agent: &Agent, reg: AgentView<'_>) -> bool {
    if can_control_agent(viewer, agent, reg) {
        return true;
    }
    viewer.kind == ParticipantType::Client
        && viewer.policy.client_lifecycle == ClientLifecycle::Visible
        && can_see_agent(viewer, agent, reg)
}

/// The audience of events about `agent`, fixed when the event is emitted.
pub fn agent_audience(agent: &Agent, reg: AgentView<'_>, policy: &Policy) -> Audience {
    if !agent_exposed(policy, agent.id.as_str()) {
        return Audience::System;
    }
    match agent.visibility.unwrap_or_default() {
        AgentVisibility::Public => Audience::Everyone,
        AgentVisibility::System => Audience::System,
        AgentVisibility::ParentOnly => {
            let mut who: Vec<ParticipantId> = agent.owner_id.iter().cloned().collect();
            if let Some(parent_owner) = agent
                .parent
                .as_ref()
                .and_then(|p| reg.get(p))
                .and_then(|p| p.owner_id.clone())
            {
                who.push(parent_owner);
            }
            Audience::Participants { who }
        }
        AgentVisibility::Scope => Audience::Scoped {
            owner: agent.owner_id.clone(),
            scopes: scopes_of(agent, reg).into_owned(),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Layer 3: scopes

/// Layer 1: is the scope exposed at all?
pub fn scope_exposed(policy: &Policy, id: &str) -> bool {
    policy.exposure.scopes.exposes(id)
}

/// Whether `viewer` owns an agent that is a member of `scope`.
fn owns_member(viewer: &Viewer<'_>, scope: &ScopeRecord, reg: AgentView<'_>) -> bool {
    scope
        .members()
        .iter()
        .any(|m| reg.is_owned_by(m, viewer.participant))
}

/// May `viewer` see `scope`? Exposure; `visibility` (`public`; `members` = the viewer owns a
/// member agent; `system`); its creator always sees it; then the viewer agent's `canSee.scopes`.
pub fn can_see_scope(viewer: &Viewer<'_>, scope: &ScopeRecord, reg: AgentView<'_>) -> bool {
    if viewer.is_system() {
        return true;
    }
    if !scope_exposed(viewer.policy, scope.id().as_str()) {
        return false;
    }
    let creator = scope.creator() == Some(viewer.participant);
    let visible = creator
        || match scope.scope().visibility.unwrap_or_default() {
            ScopeVisibility::Public => true,
            ScopeVisibility::System => false,
            ScopeVisibility::Members => owns_member(viewer, scope, reg),
        };
    if !visible {
        return false;
    }
    let Some(me) = viewer.agent.and_then(|a| reg.get(a)) else {
        return true;
    };
    if !may_restrict(me, viewer.policy) || creator {
        return true;
    }
    match resolve_agent_permissions(me, viewer.policy).can_see.scopes {
        None | Some(ScopeRule::Named(ScopeRuleName::All)) => true,
        Some(ScopeRule::Named(ScopeRuleName::Member)) => reg.scopes_of(&me.id).contains(scope.id()),
        Some(ScopeRule::Include { include }) => include.iter().any(|i| i == scope.id().as_str()),
    }
}

/// Why a join is refused.
pub type Refusal = String;

/// May `viewer` add `agent` to `scope` (`joinPolicy`)? `open`: the agent's controllers (and the
/// scope's creator); `invite`: the creator only; `role`: as `open`, and the agent's role must be
/// in `autoJoinRoles`; `system`: system participants only. System participants may always.
///
/// # Errors
/// Why not, for `Permission denied: ...`.
pub fn can_join_scope(
    viewer: &Viewer<'_>,
    scope: &ScopeRecord,
    agent: &Agent,
    reg: AgentView<'_>,
) -> Result<(), Refusal> {
    if viewer.is_system() {
        return Ok(());
    }
    let creator = scope.creator() == Some(viewer.participant);
    let controls = can_control_agent(viewer, agent, reg);
    let id = scope.id();
    match scope.scope().join_policy.unwrap_or_default() {
        JoinPolicy::Open if creator || controls => Ok(()),
        JoinPolicy::Open => Err(format!(
            "agent {} is not controlled by this participant",
            agent.id
        )),
        JoinPolicy::Invite if creator => Ok(()),
        JoinPolicy::Invite => Err(format!(
            "scope {id} is invite-only: only its creator adds members"
        )),
        JoinPolicy::Role => {
            let roles = scope.scope().auto_join_roles.as_deref().unwrap_or_default();
            if !agent.role.as_ref().is_some_and(|r| roles.contains(r)) {
                Err(format!("scope {id} admits only the roles {roles:?}"))
            } else if creator || controls {
                Ok(())
            } else {
                Err(format!(
                    "agent {} is not controlled by this participant",
                    agent.id
                ))
            }
        }
        JoinPolicy::System => Err(format!("scope {id} is joined by system participants only")),
    }
}

/// May `viewer` send to `scope` (`sendPolicy`)? `any`: anyone who sees it; `members` (default):
/// participants owning a member agent, and its creator. System participants may always.
pub fn can_send_to_scope(viewer: &Viewer<'_>, scope: &ScopeRecord, reg: AgentView<'_>) -> bool {
    if viewer.is_system() {
        return true;
    }
    match scope.scope().send_policy.unwrap_or_default() {
        SendPolicy::Any => true,
        SendPolicy::Members => {
            scope.creator() == Some(viewer.participant) || owns_member(viewer, scope, reg)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Events

/// Layer 1: may non-system participants see events of this type?
pub fn event_type_exposed(policy: &Policy, kind: &str) -> bool {
    if policy.exposure.hidden_event_types.is_empty() {
        // Per delivery: no allocation when nothing is hidden.
        return true;
    }
    let norm = |s: &str| s.replace('.', "_");
    let k = norm(kind);
    !policy
        .exposure
        .hidden_event_types
        .iter()
        .any(|h| glob_match(&norm(h), &k))
}

/// May `viewer` see an event with this audience?
pub fn audience_allows(viewer: &Viewer<'_>, audience: &Audience, reg: AgentView<'_>) -> bool {
    if viewer.is_system() {
        return true;
    }
    match audience {
        Audience::Everyone => true,
        Audience::System => false,
        Audience::Participants { who } => who.contains(viewer.participant),
        Audience::Principal { id, issuer } => viewer
            .principal
            .is_some_and(|p| p.id == *id && p.issuer == *issuer),
        Audience::Scoped { owner, scopes } => {
            owner.as_ref() == Some(viewer.participant) || shares_scope(viewer, scopes, reg)
        }
        Audience::All { of } => of.iter().all(|a| audience_allows(viewer, a, reg)),
    }
}

/// May `viewer` see an event: its type is exposed, its audience admits the viewer, and the agent
/// it is about (if any, and if still registered) passes the viewer agent's `canSee.agents`.
pub fn can_see_event(
    viewer: &Viewer<'_>,
    kind: &str,
    audience: &Audience,
    subject: Option<&AgentId>,
    reg: AgentView<'_>,
) -> bool {
    if viewer.is_system() {
        return true;
    }
    if !event_type_exposed(viewer.policy, kind) || !audience_allows(viewer, audience, reg) {
        return false;
    }
    match subject.and_then(|s| reg.get(s)) {
        Some(agent) => viewer_agent_sees(viewer, agent, reg),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::scope::Scope;
    use crate::router::agents::registry::Registry;
    use crate::router::scopes::table::Scopes;

    fn agent(id: &str, parent: Option<&str>, owner: &str, vis: AgentVisibility) -> Agent {
        let mut a = Agent::new(id.into(), Some(owner.into()));
        a.parent = parent.map(AgentId::from);
        a.visibility = Some(vis);
        a
    }

    fn viewer<'a>(p: &'a ParticipantId, kind: ParticipantType, policy: &'a Policy) -> Viewer<'a> {
        Viewer {
            participant: p,
            kind,
            agent: None,
            principal: None,
            policy,
        }
    }

    #[test]
    fn visibility_table() {
        let policy = Policy::default();
        let mut reg = Registry::default();
        let scopes = Scopes::default();
        reg.insert_for_test(agent("parent", None, "p-owner", AgentVisibility::Public));
        let child = agent(
            "child",
            Some("parent"),
            "c-owner",
            AgentVisibility::ParentOnly,
        );
        reg.insert_for_test(child.clone());
        let hidden = agent("hidden", None, "c-owner", AgentVisibility::System);
        reg.insert_for_test(hidden.clone());

        let (po, co, other, sys) = (
            ParticipantId::from("p-owner"),
            ParticipantId::from("c-owner"),
            ParticipantId::from("other"),
            ParticipantId::from("sys"),
        );
        let v = |p| viewer(p, ParticipantType::Client, &policy);
        assert!(
            can_see_agent(&v(&po), &child, AgentView::new(&reg, &scopes)),
            "parent's owner"
        );
        assert!(
            can_see_agent(&v(&co), &child, AgentView::new(&reg, &scopes)),
            "owner"
        );
        assert!(!can_see_agent(
            &v(&other),
            &child,
            AgentView::new(&reg, &scopes)
        ));
        assert!(
            !can_see_agent(&v(&co), &hidden, AgentView::new(&reg, &scopes)),
            "system-only even for its owner"
        );
        let system = viewer(&sys, ParticipantType::System, &policy);
        assert!(can_see_agent(
            &system,
            &hidden,
            AgentView::new(&reg, &scopes)
        ));

        let audience = agent_audience(&child, AgentView::new(&reg, &scopes), &policy);
        assert!(audience_allows(
            &v(&po),
            &audience,
            AgentView::new(&reg, &scopes)
        ));
        assert!(!audience_allows(
            &v(&other),
            &audience,
            AgentView::new(&reg, &scopes)
        ));
    }

    #[test]
    fn control_follows_ownership_up_the_tree() {
        let policy = Policy::default();
        let mut reg = Registry::default();
        let scopes = Scopes::default();
        reg.insert_for_test(agent("root", None, "boss", AgentVisibility::Public));
        let leaf = agent("leaf", Some("root"), "worker", AgentVisibility::Public);
        reg.insert_for_test(leaf.clone());
        let (boss, worker, other) = (
            ParticipantId::from("boss"),
            ParticipantId::from("worker"),
            ParticipantId::from("other"),
        );
        let v = |p| viewer(p, ParticipantType::Agent, &policy);
        assert!(can_control_agent(
            &v(&worker),
            &leaf,
            AgentView::new(&reg, &scopes)
        ));
        assert!(can_control_agent(
            &v(&boss),
            &leaf,
            AgentView::new(&reg, &scopes)
        ));
        assert!(!can_control_agent(
            &v(&other),
            &leaf,
            AgentView::new(&reg, &scopes)
        ));
        assert!(
            !can_manage_lifecycle(&v(&other), &leaf, AgentView::new(&reg, &scopes)),
            "a stranger agent"
        );
        let client = viewer(&other, ParticipantType::Client, &policy);
        assert!(
            can_manage_lifecycle(&client, &leaf, AgentView::new(&reg, &scopes)),
            "operator clients by default"
        );
        let strict = Policy {
            client_lifecycle: ClientLifecycle::Controlled,
            ..Policy::default()
        };
        let client = viewer(&other, ParticipantType::Client, &strict);
        assert!(!can_manage_lifecycle(
            &client,
            &leaf,
            AgentView::new(&reg, &scopes)
        ));
    }

    #[test]
    fn a_participant_is_seen_by_those_who_see_every_agent_it_owns() {
        let policy: Policy = toml::from_str("[exposure.agents]\nhidden = [\"hid-*\"]\n").unwrap();
        let mut reg = Registry::default();
        let scopes = Scopes::default();
        // The SDK's shape: each agent's participant id is its agent id.
        reg.insert_for_test(agent("lead", None, "lead", AgentVisibility::Public));
        reg.insert_for_test(agent(
            "po-1",
            Some("lead"),
            "po-1",
            AgentVisibility::ParentOnly,
        ));
        reg.insert_for_test(agent("hid-1", None, "hid-1", AgentVisibility::Public));
        reg.insert_for_test(agent("pub-1", None, "pub-1", AgentVisibility::Public));
        let reg = AgentView::new(&reg, &scopes);
        let ids = [
            "lead",
            "po-1",
            "hid-1",
            "pub-1",
            "client",
            "hid-client",
            "sys",
        ]
        .map(ParticipantId::from);
        let [lead, po, hid, public, client, hid_client, sys] = &ids;
        let sees = |who: &ParticipantId, kind, whom: &ParticipantId| {
            can_see_participant(&viewer(who, kind, &policy), whom, reg)
        };
        let stranger = ParticipantType::Agent;
        // (viewer, participant, seen?)
        for (who, whom, seen) in [
            (public, public, true),
            (public, client, true),
            (public, lead, true),
            (public, po, false),  // owns a parent-only agent it may not see
            (lead, po, true),     // the parent's owner sees it
            (po, po, true),       // itself
            (public, hid, false), // an id (and agent) hidden by exposure
            (hid, hid, true),
            (public, hid_client, false), // hidden by its id alone
        ] {
            assert_eq!(sees(who, stranger, whom), seen, "{who} sees {whom}");
        }
        for whom in &ids {
            assert!(
                sees(sys, ParticipantType::System, whom),
                "system sees {whom}"
            );
        }
    }

    #[test]
    fn globs() {
        assert!(glob_match("internal-*", "internal-db"));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "abbc"));
        assert!(glob_match("*", ""));
        assert!(glob_match("*x*y", "axbxy"));
        assert!(!glob_match("internal-*", "public-internal-db"));
    }

    #[test]
    fn exposure_hides_agents_and_event_types() {
        let policy: Policy = toml::from_str(
            "[exposure]\nhidden_event_types = [\"agent.metadata_changed\", \"message_*\"]\n[exposure.agents]\nhidden = [\"internal-*\"]\n",
        )
        .unwrap();
        let mut reg = Registry::default();
        let scopes = Scopes::default();
        let a = agent("internal-db", None, "o", AgentVisibility::Public);
        reg.insert_for_test(a.clone());
        let p = ParticipantId::from("o");
        assert!(!can_see_agent(
            &viewer(&p, ParticipantType::Client, &policy),
            &a,
            AgentView::new(&reg, &scopes)
        ));
        assert_eq!(
            agent_audience(&a, AgentView::new(&reg, &scopes), &policy),
            Audience::System
        );
        assert!(!event_type_exposed(&policy, "message_sent"));
        assert!(
            !event_type_exposed(&policy, "agent.metadata.changed"),
            "either spelling"
        );
        assert!(event_type_exposed(&policy, "agent_registered"));
    }

    #[test]
    fn accepts_from_and_can_message() {
        let policy: Policy = toml::from_str(
            "[roles.vault.acceptsFrom]\nagents = \"hierarchy\"\nclients = \"none\"\n",
        )
        .unwrap();
        let mut reg = Registry::default();
        let scopes = Scopes::default();
        let mut vault = agent("vault", Some("lead"), "ov", AgentVisibility::Public);
        vault.role = Some("vault".into());
        let lead = agent("lead", None, "ol", AgentVisibility::Public);
        let stranger = agent("stranger", None, "os", AgentVisibility::Public);
        reg.insert_for_test(lead.clone());
        reg.insert_for_test(vault.clone());
        reg.insert_for_test(stranger.clone());
        let (ol, os, oc) = (
            ParticipantId::from("ol"),
            ParticipantId::from("os"),
            ParticipantId::from("client"),
        );
        let as_agent = |p, a: &'static str| Viewer {
            participant: p,
            kind: ParticipantType::Agent,
            agent: Some(Box::leak(Box::new(AgentId::from(a)))),
            principal: None,
            policy: &policy,
        };
        assert!(
            can_message_agent(
                &as_agent(&ol, "lead"),
                Some(&lead),
                &vault,
                AgentView::new(&reg, &scopes)
            ),
            "its parent"
        );
        assert!(!can_message_agent(
            &as_agent(&os, "stranger"),
            Some(&stranger),
            &vault,
            AgentView::new(&reg, &scopes)
        ));
        let client = viewer(&oc, ParticipantType::Client, &policy);
        assert!(
            !can_message_agent(&client, None, &vault, AgentView::new(&reg, &scopes)),
            "clients: none"
        );
        assert!(
            can_message_agent(&client, None, &lead, AgentView::new(&reg, &scopes)),
            "others accept everyone"
        );
    }

    #[test]
    fn join_and_send_policies() {
        let policy = Policy::default();
        let mut reg = Registry::default();
        let scopes = Scopes::default();
        let mut worker = agent("w", None, "ow", AgentVisibility::Public);
        worker.role = Some("worker".into());
        reg.insert_for_test(worker.clone());
        let record = |join: JoinPolicy, send: SendPolicy| {
            ScopeRecord::for_test(
                Scope {
                    id: "s".into(),
                    name: None,
                    description: None,
                    parent: None,
                    join_policy: Some(join),
                    auto_join_roles: Some(vec!["lead".into()]),
                    visibility: None,
                    message_visibility: None,
                    send_policy: Some(send),
                    persistent: None,
                    auto_delete: None,
                    metadata: None,
                },
                Some("creator".into()),
            )
        };
        let (ow, creator) = (ParticipantId::from("ow"), ParticipantId::from("creator"));
        let owner = viewer(&ow, ParticipantType::Agent, &policy);
        let maker = viewer(&creator, ParticipantType::Agent, &policy);
        assert!(can_join_scope(
            &owner,
            &record(JoinPolicy::Open, SendPolicy::Members),
            &worker,
            AgentView::new(&reg, &scopes)
        )
        .is_ok());
        assert!(can_join_scope(
            &owner,
            &record(JoinPolicy::Invite, SendPolicy::Members),
            &worker,
            AgentView::new(&reg, &scopes)
        )
        .is_err());
        assert!(can_join_scope(
            &maker,
            &record(JoinPolicy::Invite, SendPolicy::Members),
            &worker,
            AgentView::new(&reg, &scopes)
        )
        .is_ok());
        assert!(
            can_join_scope(
                &owner,
                &record(JoinPolicy::Role, SendPolicy::Members),
                &worker,
                AgentView::new(&reg, &scopes)
            )
            .is_err(),
            "not a lead"
        );
        assert!(can_join_scope(
            &maker,
            &record(JoinPolicy::System, SendPolicy::Members),
            &worker,
            AgentView::new(&reg, &scopes)
        )
        .is_err());
        assert!(!can_send_to_scope(
            &owner,
            &record(JoinPolicy::Open, SendPolicy::Members),
            AgentView::new(&reg, &scopes)
        ));
        assert!(can_send_to_scope(
            &maker,
            &record(JoinPolicy::Open, SendPolicy::Members),
            AgentView::new(&reg, &scopes)
        ));
        assert!(can_send_to_scope(
            &owner,
            &record(JoinPolicy::Open, SendPolicy::Any),
            AgentView::new(&reg, &scopes)
        ));
    }
}
