//! Address resolution: which recipients an address names for a caller, and which of them it
//! may message. A pure function of read-only views of the agents, scopes and sessions
//! (`router::views`), so every address form can be tested without a router.
//!
//! Rules (methods.md "Address → recipients", REC column; choices in `docs/compatibility.md`):
//! - `{agent: X}` names agent X; if no visible agent has that id but a participant does, it
//!   names that participant (how `AgentConnection.reply()` reaches a client).
//! - Unknown explicit agents, scopes and participants are errors (2001/2002/2000) unless
//!   `strict` is off.
//! - Scope, role and broadcast exclude the sending agent; recipients are de-duplicated.
//! - `{system, agent}`, and `{agent: "<system>:agent:<id>"}` (how a reply reaches a federated
//!   sender), name an agent of another system this router reaches (`config::Federation`):
//!   [`Recipient::Remote`], which no local agent can stand in for. Any other system is 5001.
//! - Only agents and participants the caller may see are named (`can_see_agent`,
//!   `can_see_participant`); a scope must be visible and take messages from the caller
//!   (`sendPolicy`). This is the one place a sender's address meets visibility, and every path
//!   that delivers a message (`map/send`, a reply, a spawn's initial message, a federated
//!   route, the gateways' sends) resolves here. An invisible target is absent: an explicit
//!   address to it answers exactly what it answers for an id nobody has (2001 / 2000), and a
//!   group leaves it out. NB: the fallback from `{agent: X}` to participant X is the one that
//!   matters most, since the SDK's `AgentConnection` connects with its agent's id as
//!   participant id: were the participant not checked as well, it would reach the agent its
//!   id names however hidden (as it did until the Python suite found it).
//! - One exception: a reply (`meta.isResult` with the request's `correlationId`) may name the
//!   sender of the request it answers (`answering`, from the delivery index), seen or not, by an
//!   explicit address: that sender showed itself by asking, so answering it leaks nothing, and
//!   a hidden agent (a hidden gateway's, say) still gets its answers.
//!
//! Owns nothing.

use crate::protocol::capabilities::ParticipantType;
use crate::protocol::ids::{AgentId, ParticipantId, ScopeId};
use crate::protocol::message::{Address, ParticipantGroup};
use crate::router::caller::Caller;
use crate::router::error::RouterError;
use crate::router::ids::IdSet;
use crate::router::permissions::{
    can_message_agent, can_see_agent, can_see_participant, can_see_scope, can_send_to_scope,
    may_message_agent,
};
use crate::router::views::{AgentView, ScopeView, SessionView};

/// What resolution reads.
#[derive(Debug, Clone, Copy)]
pub struct Views<'a> {
    /// The agents (with their scopes).
    pub agents: AgentView<'a>,
    /// The scopes.
    pub scopes: ScopeView<'a>,
    /// The sessions.
    pub sessions: SessionView<'a>,
    /// The systems this router reaches.
    pub systems: &'a crate::router::config::Federation,
}

/// A resolved recipient.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Recipient {
    /// An agent (delivered to its owner's connection).
    Agent(AgentId),
    /// A participant (delivered to its connection).
    Participant(ParticipantId),
    /// An agent of another system (passed on to the peer link for `system`).
    Remote {
        /// Its system (the message's `targetSystem`).
        system: String,
        /// Its id there.
        agent: String,
        /// `<system>:agent:<agent>`: how its events name it here.
        id: String,
    },
}

impl Recipient {
    /// Its id (an agent's or a participant's).
    pub fn id(&self) -> &str {
        match self {
            Self::Agent(a) => a.as_str(),
            Self::Participant(p) => p.as_str(),
            Self::Remote { id, .. } => id,
        }
    }
}

/// Keeps the recipients the sender may message (`canMessage` of its agent, `acceptsFrom` of
/// each target). A refused explicit target is an error; refused members of a group are
/// left out. `answering`: as for [`resolve`] (that agent need not be visible; the rest of the
/// rules hold).
pub fn permitted(
    agents: AgentView<'_>,
    caller: &Caller,
    recipients: Vec<Recipient>,
    explicit: bool,
    answering: Option<&str>,
) -> Result<Vec<Recipient>, RouterError> {
    let viewer = caller.viewer();
    let sender = caller.primary_agent.as_ref().and_then(|a| agents.get(a));
    let mut out = Vec::with_capacity(recipients.len());
    for r in recipients {
        let allowed = match &r {
            Recipient::Agent(id) if explicit && answering == Some(id.as_str()) => agents
                .get(id)
                .is_some_and(|t| may_message_agent(&viewer, sender, t, agents)),
            Recipient::Agent(id) => agents
                .get(id)
                .is_some_and(|t| can_message_agent(&viewer, sender, t, agents)),
            Recipient::Participant(_) | Recipient::Remote { .. } => true,
        };
        if allowed {
            out.push(r);
        } else if explicit {
            return Err(RouterError::PermissionDenied(format!(
                "agent {} does not accept messages from {}",
                r.id(),
                caller.address()
            )));
        }
    }
    Ok(out)
}

/// Whether a string address names a scope for `caller`: `scope:<id>`, or the id of a scope it
/// may see that is not also the id of an agent it may see (that is 2004, ambiguous). A scope
/// it may not see is absent here too, so the answer (a multicast needing
/// `messaging.canBroadcast`, or not) never tells whether such a scope exists.
pub fn names_scope(views: Views<'_>, caller: &Caller, text: &str) -> bool {
    text.starts_with("scope:")
        || (names_visible_scope(views, caller, text)
            && !views
                .agents
                .get(&AgentId::from(text))
                .is_some_and(|r| can_see_agent(&caller.viewer(), r, views.agents)))
}

/// Whether `text` is the id of a scope `caller` may see.
fn names_visible_scope(views: Views<'_>, caller: &Caller, text: &str) -> bool {
    views
        .scopes
        .get(&ScopeId::from(text))
        .is_some_and(|s| can_see_scope(&caller.viewer(), s, views.agents))
}

/// Resolves an address to recipients (see the module docs). `answering`: the sender of the
/// request this message answers, which an explicit address may name whether or not the caller
/// may see it (the caller's message is a reply to a request that reached it).
pub fn resolve(
    views: Views<'_>,
    caller: &Caller,
    address: &Address,
    strict: bool,
    answering: Option<&str>,
) -> Result<Vec<Recipient>, RouterError> {
    let Views {
        agents,
        scopes,
        sessions,
        systems,
    } = views;
    let viewer = caller.viewer();
    let visible_agent = |id: &AgentId| {
        agents
            .get(id)
            .is_some_and(|r| can_see_agent(&viewer, r, agents))
    };
    let answered = |id: &str| answering == Some(id);
    // A participant the caller may see (one standing for an agent it may not see is absent),
    // or the one that asked what the caller answers.
    let visible_participant = |id: &ParticipantId| {
        sessions
            .by_participant(id)
            .filter(|s| {
                answered(id.as_str()) || can_see_participant(&viewer, s.participant, agents)
            })
            .map(|s| Recipient::Participant(s.participant.clone()))
    };
    let sender_agent = caller.primary_agent.as_ref();
    let not_sender = |a: &AgentId| Some(a) != sender_agent;
    let scope_members = |id: &ScopeId| -> Result<Vec<Recipient>, RouterError> {
        match scopes.get(id).filter(|s| can_see_scope(&viewer, s, agents)) {
            Some(s) if !can_send_to_scope(&viewer, s, agents) => {
                Err(RouterError::PermissionDenied(format!(
                    "scope {id} takes messages from its members only (sendPolicy)"
                )))
            }
            Some(s) => Ok(s
                .members()
                .iter()
                .filter(|a| not_sender(a) && visible_agent(a))
                .cloned()
                .map(Recipient::Agent)
                .collect()),
            None if strict => Err(RouterError::ScopeNotFound(id.to_string())),
            None => Ok(Vec::new()),
        }
    };
    let remote = |system: &str, agent: &str| Recipient::Remote {
        system: system.to_owned(),
        agent: agent.to_owned(),
        id: crate::protocol::methods::federation::Federated::Agent.id(system, agent),
    };
    let agent_or_participant = |id: &str| -> Option<Recipient> {
        if let Some((system, agent)) = systems.remote_agent(id) {
            return Some(remote(system, agent));
        }
        let agent = AgentId::from(id);
        if visible_agent(&agent) || (answered(id) && agents.contains(&agent)) {
            Some(Recipient::Agent(agent))
        } else {
            visible_participant(&ParticipantId::from(id))
        }
    };
    let mut out = match address {
        Address::Text(text) => {
            if let Some(id) = text.strip_prefix("agent:") {
                match agent_or_participant(id) {
                    Some(r) => vec![r],
                    None if strict => return Err(RouterError::AgentNotFound(id.into())),
                    None => Vec::new(),
                }
            } else if let Some(id) = text.strip_prefix("scope:") {
                scope_members(&ScopeId::from(id))?
            } else {
                let is_agent = visible_agent(&AgentId::from(text.as_str()));
                match (is_agent, names_visible_scope(views, caller, text)) {
                    (true, true) => return Err(RouterError::AddressAmbiguous(text.clone())),
                    (false, true) => scope_members(&ScopeId::from(text.as_str()))?,
                    _ => match agent_or_participant(text) {
                        Some(r) => vec![r],
                        None if strict => return Err(RouterError::AddressNotFound(text.clone())),
                        None => Vec::new(),
                    },
                }
            }
        }
        Address::Agent(id) => match agent_or_participant(id.as_str()) {
            Some(r) => vec![r],
            None if strict => return Err(RouterError::AgentNotFound(id.to_string())),
            None => Vec::new(),
        },
        Address::Agents(ids) => {
            let mut v = Vec::new();
            for id in ids {
                match agent_or_participant(id.as_str()) {
                    Some(r) => v.push(r),
                    None if strict => return Err(RouterError::AgentNotFound(id.to_string())),
                    None => {}
                }
            }
            v
        }
        Address::Scope(id) => scope_members(id)?,
        Address::Role { role, within } => {
            let members = match within {
                Some(scope) => match scopes
                    .get(scope)
                    .filter(|s| can_see_scope(&viewer, s, agents))
                {
                    Some(s) => Some(&s.members()),
                    None if strict => return Err(RouterError::ScopeNotFound(scope.to_string())),
                    None => return Ok(Vec::new()),
                },
                None => None,
            };
            agents
                .iter_ordered()
                .filter(|r| r.role.as_deref() == Some(role.as_str()))
                .filter(|r| members.is_none_or(|m| m.contains(&r.id)))
                .filter(|r| not_sender(&r.id) && visible_agent(&r.id))
                .map(|r| Recipient::Agent(r.id.clone()))
                .collect()
        }
        Address::Hierarchical(h) => {
            let me = sender_agent.ok_or_else(|| {
                RouterError::AddressNotFound(
                    "hierarchical address: the sender has no registered agent".into(),
                )
            })?;
            let mut v: Vec<AgentId> = Vec::new();
            if h.parent {
                match agents.get(me).and_then(|r| r.parent.clone()) {
                    // An invisible parent is no parent (2000 alone, left out of a union).
                    Some(p) if visible_agent(&p) => v.push(p),
                    _ if strict && !(h.children || h.ancestors || h.descendants || h.siblings) => {
                        return Err(RouterError::AddressNotFound(format!(
                            "parent of {me} (it has none)"
                        )))
                    }
                    _ => {}
                }
            }
            if h.children {
                v.extend(agents.descendants(me, Some(h.depth.unwrap_or(1))));
            }
            if h.descendants {
                v.extend(agents.descendants(me, h.depth));
            }
            if h.ancestors {
                v.extend(agents.ancestors(me, h.depth));
            }
            if h.siblings {
                v.extend(agents.siblings(me));
            }
            v.into_iter()
                .filter(|a| a != me && visible_agent(a))
                .map(Recipient::Agent)
                .collect()
        }
        Address::Broadcast => agents
            .iter_ordered()
            .filter(|r| not_sender(&r.id) && visible_agent(&r.id))
            .map(|r| Recipient::Agent(r.id.clone()))
            .collect(),
        Address::System => Vec::new(),
        Address::Participant(p) => match visible_participant(p) {
            Some(r) => vec![r],
            None if strict => return Err(RouterError::AddressNotFound(p.to_string())),
            None => Vec::new(),
        },
        Address::Participants(group) => sessions
            .iter()
            .filter(|s| s.attached && *s.participant != caller.participant)
            .filter(|s| match group {
                ParticipantGroup::All => true,
                ParticipantGroup::Agents => s.kind == ParticipantType::Agent,
                ParticipantGroup::Clients => s.kind == ParticipantType::Client,
            })
            .filter(|s| can_see_participant(&viewer, s.participant, agents))
            .map(|s| Recipient::Participant(s.participant.clone()))
            .collect(),
        Address::Federated { system, agent } if *system == systems.rules.system_id => {
            match agent_or_participant(agent.as_str()) {
                Some(r) => vec![r],
                None if strict => return Err(RouterError::AgentNotFound(agent.to_string())),
                None => Vec::new(),
            }
        }
        Address::Federated { system, agent } => {
            if systems.next_hop(system).is_none() || agent.as_str().is_empty() {
                return Err(RouterError::SystemNotFound(system.clone()));
            }
            vec![remote(system, agent.as_str())]
        }
    };
    dedup_in_order(&mut out);
    Ok(out)
}

/// Leaves the first of each recipient, in order, without copying any (a scope's members are
/// already distinct: the usual case keeps everything).
fn dedup_in_order(out: &mut Vec<Recipient>) {
    if out.len() < 2 {
        return;
    }
    let mut seen: IdSet<&Recipient> =
        IdSet::with_capacity_and_hasher(out.len(), Default::default());
    let first: Vec<bool> = out.iter().map(|r| seen.insert(r)).collect();
    drop(seen);
    if first.iter().all(|&f| f) {
        return;
    }
    let mut keep = first.into_iter();
    out.retain(|_| keep.next().unwrap_or(false));
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::protocol::agent::{Agent, AgentVisibility};
    use crate::protocol::json::RawJson;
    use crate::protocol::scope::{Scope, SendPolicy};
    use crate::router::agents::registry::Registry;
    use crate::router::permissions::Policy;
    use crate::router::scopes::table::Scopes;
    use crate::router::sessions::table::{SessionSeed, Sessions};

    /// Three owners: `alice` (agents `a1`, child `a2`, system-only `secret`), `bob` (agent
    /// `b1`, role `worker`, and `b2`, a child of `secret`), and a client `carol` with no agent.
    /// Scope `team` holds `a1`, `a2`, `b1`; scope `closed` (members send only) holds `b1`.
    /// And `ghost`, connected as the SDK connects an agent (participant id = agent id), whose
    /// agent `ghost` is system-only.
    struct World {
        registry: Registry,
        scopes: Scopes,
        sessions: Sessions,
        systems: crate::router::config::Federation,
    }

    fn agent(id: &str, owner: &str, parent: Option<&str>, role: Option<&str>) -> Agent {
        let mut a = Agent::new(id.into(), Some(owner.into()));
        a.parent = parent.map(AgentId::from);
        a.role = role.map(str::to_owned);
        a
    }

    fn scope(id: &str, send: Option<SendPolicy>) -> Scope {
        Scope {
            id: id.into(),
            name: None,
            description: None,
            parent: None,
            join_policy: None,
            auto_join_roles: None,
            visibility: None,
            message_visibility: None,
            send_policy: send,
            persistent: None,
            auto_delete: None,
            metadata: None,
        }
    }

    fn session(participant: &str, kind: ParticipantType) -> SessionSeed {
        SessionSeed {
            id: format!("s-{participant}").as_str().into(),
            participant: participant.into(),
            kind,
            name: None,
            capabilities: Default::default(),
            created_at: 0,
            token_key: format!("k-{participant}"),
            policy: None,
            primary_agent: None,
            orphaned: Vec::new(),
            principal: None,
        }
    }

    fn world() -> World {
        let mut registry = Registry::default();
        registry.insert_for_test(agent("a1", "alice", None, Some("lead")));
        registry.insert_for_test(agent("a2", "alice", Some("a1"), Some("worker")));
        let mut secret = agent("secret", "alice", None, Some("worker"));
        secret.visibility = Some(AgentVisibility::System);
        registry.insert_for_test(secret);
        registry.insert_for_test(agent("b1", "bob", None, Some("worker")));
        registry.insert_for_test(agent("b2", "bob", Some("secret"), None));
        let mut ghost = agent("ghost", "ghost", None, Some("worker"));
        ghost.visibility = Some(AgentVisibility::System);
        registry.insert_for_test(ghost);
        let mut scopes = Scopes::default();
        scopes.restore(scope("team", Some(SendPolicy::Any)), None);
        scopes.restore(scope("closed", Some(SendPolicy::Members)), None);
        for a in ["a1", "a2", "b1"] {
            scopes.join(&"team".into(), &a.into());
        }
        scopes.join(&"closed".into(), &"b1".into());
        let mut sessions = Sessions::default();
        let now = std::time::Instant::now();
        sessions.restore(session("alice", ParticipantType::Agent), now);
        sessions.restore(session("bob", ParticipantType::Agent), now);
        sessions.restore(session("carol", ParticipantType::Client), now);
        sessions.restore(session("ghost", ParticipantType::Agent), now);
        let mut systems = crate::router::config::Federation::default();
        systems.rules.system_id = "home".into();
        systems.outbound = vec!["beta".into()];
        systems.routes = vec![
            ("gamma".into(), "beta".into()),
            ("delta".into(), "nope".into()),
        ];
        World {
            registry,
            scopes,
            sessions,
            systems,
        }
    }

    fn caller(participant: &str, kind: ParticipantType, agent: Option<&str>) -> Caller {
        Caller {
            session: format!("s-{participant}").as_str().into(),
            participant: participant.into(),
            kind,
            primary_agent: agent.map(AgentId::from),
            principal: None,
            policy: Arc::new(Policy::default()),
        }
    }

    fn run(
        w: &World,
        c: &Caller,
        to: serde_json::Value,
        strict: bool,
    ) -> Result<Vec<String>, RouterError> {
        answer(w, c, to, strict, None)
    }

    /// [`run`] for a reply to a request from `answering`.
    fn answer(
        w: &World,
        c: &Caller,
        to: serde_json::Value,
        strict: bool,
        answering: Option<&str>,
    ) -> Result<Vec<String>, RouterError> {
        let views = Views {
            agents: AgentView::new(&w.registry, &w.scopes),
            scopes: ScopeView::new(&w.scopes),
            sessions: SessionView::new(&w.sessions),
            systems: &w.systems,
        };
        let address = Address::parse_raw(&RawJson::from(to)).expect("an address");
        let found = resolve(views, c, &address, strict, answering)?;
        let allowed = permitted(views.agents, c, found, true, answering)?;
        Ok(allowed.iter().map(|r| r.id().to_owned()).collect())
    }

    #[test]
    fn recipients_named_twice_are_reached_once_in_the_order_first_named() {
        let agent = |id: &str| Recipient::Agent(AgentId::from(id));
        let participant = |id: &str| Recipient::Participant(ParticipantId::from(id));
        let mut out = vec![
            agent("a"),
            agent("b"),
            participant("a"),
            agent("a"),
            agent("c"),
            agent("b"),
            participant("a"),
        ];
        dedup_in_order(&mut out);
        assert_eq!(
            out,
            vec![agent("a"), agent("b"), participant("a"), agent("c")],
            "an agent and a participant of one id are two recipients"
        );
        let mut distinct = vec![agent("x"), agent("y")];
        dedup_in_order(&mut distinct);
        assert_eq!(distinct, vec![agent("x"), agent("y")]);
        let mut one = vec![agent("x")];
        dedup_in_order(&mut one);
        assert_eq!(one, vec![agent("x")]);
    }

    #[test]
    fn group_addresses_leave_out_the_sender_and_what_it_cannot_see() {
        let w = world();
        let alice = caller("alice", ParticipantType::Agent, Some("a1"));
        assert_eq!(
            run(&w, &alice, serde_json::json!({"broadcast": true}), true).unwrap(),
            vec!["a2", "b1", "b2"],
            "no sender, no system-only agent"
        );
        assert_eq!(
            run(&w, &alice, serde_json::json!({"scope": "team"}), true).unwrap(),
            vec!["a2", "b1"]
        );
        assert_eq!(
            run(&w, &alice, serde_json::json!({"role": "worker"}), true).unwrap(),
            vec!["a2", "b1"],
            "the system-only worker is not named"
        );
        assert_eq!(
            run(&w, &alice, serde_json::json!({"children": true}), true).unwrap(),
            vec!["a2"]
        );
    }

    #[test]
    fn a_scope_that_takes_members_only_refuses_an_outsider() {
        let w = world();
        let carol = caller("carol", ParticipantType::Client, None);
        let refused = run(&w, &carol, serde_json::json!({"scope": "closed"}), true);
        assert!(
            matches!(refused, Err(RouterError::PermissionDenied(_))),
            "{refused:?}"
        );
        let bob = caller("bob", ParticipantType::Agent, Some("b1"));
        assert_eq!(
            run(&w, &bob, serde_json::json!({"scope": "closed"}), true).unwrap(),
            Vec::<String>::new(),
            "its only member is the sender"
        );
    }

    #[test]
    fn an_agent_address_falls_back_to_a_participant_and_unknown_ids_are_errors_when_strict() {
        let w = world();
        let bob = caller("bob", ParticipantType::Agent, Some("b1"));
        assert_eq!(
            run(&w, &bob, serde_json::json!({"agent": "carol"}), true).unwrap(),
            vec!["carol"]
        );
        assert!(matches!(
            run(&w, &bob, serde_json::json!({"agent": "nobody"}), true),
            Err(RouterError::AgentNotFound(_))
        ));
        assert!(run(&w, &bob, serde_json::json!({"agent": "nobody"}), false)
            .unwrap()
            .is_empty());
        assert!(
            matches!(
                run(&w, &bob, serde_json::json!({"agent": "secret"}), true),
                Err(RouterError::AgentNotFound(_))
            ),
            "a system-only agent is not found by others"
        );
        assert_eq!(
            run(
                &w,
                &bob,
                serde_json::json!({"agents": ["a1", "a1", "a2"]}),
                true
            )
            .unwrap(),
            vec!["a1", "a2"],
            "de-duplicated"
        );
    }

    #[test]
    fn an_invisible_agent_is_not_reached_through_the_participant_of_its_id() {
        let w = world();
        let bob = caller("bob", ParticipantType::Agent, Some("b1"));
        let to = |v| run(&w, &bob, v, true);
        // Each answer is the one an id nobody has gets.
        for (address, absent) in [
            (serde_json::json!({"agent": "ghost"}), "agent"),
            (serde_json::json!("agent:ghost"), "agent"),
            (serde_json::json!({"agents": ["b1", "ghost"]}), "agent"),
            (
                serde_json::json!({"system": "home", "agent": "ghost"}),
                "agent",
            ),
            (serde_json::json!("ghost"), "address"),
            (serde_json::json!({"participant": "ghost"}), "address"),
        ] {
            match (to(address.clone()), absent) {
                (Err(RouterError::AgentNotFound(id)), "agent")
                | (Err(RouterError::AddressNotFound(id)), "address") => {
                    assert_eq!(id, "ghost", "{address}")
                }
                (got, _) => panic!("{address}: {got:?}"),
            }
        }
        // Its parent is system-only: for bob's b2 it has none.
        let bob2 = caller("bob", ParticipantType::Agent, Some("b2"));
        assert!(matches!(
            run(&w, &bob2, serde_json::json!({"parent": true}), true),
            Err(RouterError::AddressNotFound(_))
        ));
        // A reply to its request reaches it, by an explicit address only; not a group.
        for to in [
            serde_json::json!({"agent": "ghost"}),
            serde_json::json!({"agents": ["b1", "ghost"]}),
            serde_json::json!({"participant": "ghost"}),
            serde_json::json!("ghost"),
        ] {
            let got = answer(&w, &bob, to.clone(), true, Some("ghost")).unwrap();
            assert!(got.contains(&"ghost".to_owned()), "{to}: {got:?}");
        }
        assert_eq!(
            answer(
                &w,
                &bob,
                serde_json::json!({"role": "worker"}),
                true,
                Some("ghost")
            )
            .unwrap(),
            vec!["a2"],
            "the sender (b1) and the system-only ghost left out"
        );
        // A system participant reaches it (as the agent: the participant stands in only for
        // an agent it cannot see).
        let ops = caller("ops", ParticipantType::System, None);
        assert_eq!(
            run(&w, &ops, serde_json::json!({"participant": "ghost"}), true).unwrap(),
            vec!["ghost"]
        );
        assert_eq!(
            run(&w, &ops, serde_json::json!({"agent": "ghost"}), true).unwrap(),
            vec!["ghost"]
        );
    }

    #[test]
    fn participants_addresses_name_attached_sessions_only() {
        let w = world();
        let carol = caller("carol", ParticipantType::Client, None);
        // Restored sessions are detached: nobody is reached.
        assert!(
            run(&w, &carol, serde_json::json!({"participants": "all"}), true)
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            run(&w, &carol, serde_json::json!({"participant": "bob"}), true).unwrap(),
            vec!["bob"]
        );
        // Alice owns a system-only agent: to carol she is no participant (as in the
        // participant events carol is shown), and the answer is an absent id's.
        assert!(matches!(
            run(&w, &carol, serde_json::json!({"participant": "alice"}), true),
            Err(RouterError::AddressNotFound(id)) if id == "alice"
        ));
        let ops = caller("ops", ParticipantType::System, None);
        assert_eq!(
            run(&w, &ops, serde_json::json!({"participant": "alice"}), true).unwrap(),
            vec!["alice"]
        );
    }

    #[test]
    fn other_systems_are_named_only_when_reached_and_no_local_id_stands_in() {
        let w = world();
        let alice = caller("alice", ParticipantType::Agent, Some("a1"));
        let to = |v| run(&w, &alice, v, true);
        assert_eq!(
            to(serde_json::json!({"system": "beta", "agent": "bob"})).unwrap(),
            vec!["beta:agent:bob"]
        );
        // Through a peer that dials gamma in turn; the reply form names it too.
        assert_eq!(
            to(serde_json::json!({"agent": "gamma:agent:carol"})).unwrap(),
            vec!["gamma:agent:carol"]
        );
        // This system's own id is a local address.
        assert_eq!(
            to(serde_json::json!({"system": "home", "agent": "a2"})).unwrap(),
            vec!["a2"]
        );
        // Unknown systems, and a route through a peer not dialled, are 5001.
        for system in ["zeta", "delta"] {
            let e = to(serde_json::json!({"system": system, "agent": "x"})).unwrap_err();
            assert!(
                matches!(e, RouterError::SystemNotFound(ref s) if s == system),
                "{e:?}"
            );
        }
        // `<unknown>:agent:x` is an ordinary (here unknown) local id.
        assert!(matches!(
            to(serde_json::json!({"agent": "zeta:agent:x"})).unwrap_err(),
            RouterError::AgentNotFound(_)
        ));
    }
}
