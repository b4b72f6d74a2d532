//! The federation handlers: `map/federation/connect` and `map/federation/route` (inbound), which
//! coordinate the links table ([`super::table`]) with sessions (who is calling, as which
//! principal) and messaging (local delivery, or the queue for the next system); and the
//! router's own peer links' `map/federation/outbound/next` and `.../ack`, which hand out and
//! settle what waits for a peer ([`super::outbound`]).

use std::sync::Arc;

use crate::protocol::capabilities::Capability;
use crate::protocol::capabilities::ParticipantType;
use crate::protocol::ids::{now_ms, MessageId, Ulid};
use crate::protocol::json::RawJson;
use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::message::{Address, Message};
use crate::protocol::methods::federation::{
    check_system_id, process, Empty, Federated, FederationAgentsParams, FederationAgentsResult,
    FederationAuthRequired, FederationConnectParams, FederationConnectResult, FederationEnvelope,
    FederationRouteParams, FederationRouteResult, FederationRouting, OutboundAckParams,
    OutboundAckResult, OutboundAgentsParams, OutboundItem, OutboundNextParams, OutboundNextResult,
    PeerAgents, RouteRefusal, RoutedMessage, SystemInfo, MAX_ACKS, MAX_FROM_BYTES,
};
use crate::router::caller::{Caller, Ctx};
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::federation::outbound::{Waiting, MAX_TAKE};
use crate::router::federation::table::Refused;
use crate::router::federation::MAX_REMOTE_AGENTS;
use crate::router::handle::RouterHandle;
use crate::router::ids::ConnId;
use crate::router::messaging::state::Outgoing;

/// The credential methods a refused link is told to prove its identity with (on `map/connect`).
const AUTH_METHODS: [&str; 2] = ["bearer", "api-key"];

fn forged(message: String) -> RouterError {
    RouterError::Federation(ErrorCode::FEDERATION_NOT_ALLOWED, message)
}

impl Router {
    /// Only gateway and system participants federate.
    fn federating_caller(&self, ctx: &Ctx, method: &str) -> Result<Caller, RouterError> {
        let caller = self.caller(ctx)?;
        if !matches!(
            caller.kind,
            ParticipantType::Gateway | ParticipantType::System
        ) {
            return Err(RouterError::PermissionDenied(format!(
                "{method} is for gateway and system participants"
            )));
        }
        Ok(caller)
    }

    fn system_info(&self) -> SystemInfo {
        SystemInfo {
            name: self.config.federation.rules.system_id.clone(),
            version: self.config.version.clone(),
            capabilities: Some(serde_json::json!({
                "federation": {"canFederate": true, "inbound": true, "forward": true}
            })),
        }
    }

    /// `map/federation/connect`: the calling session speaks for `systemId` from now on, if its
    /// principal is the one configured for that system (with authentication on); else
    /// `connected: false` with `authRequired` (a result, not an error).
    pub fn handle_federation_connect(
        &mut self,
        ctx: &Ctx,
        p: FederationConnectParams,
    ) -> Result<FederationConnectResult, RouterError> {
        let caller = self.federating_caller(ctx, "map/federation/connect")?;
        check_system_id(&p.system_id).map_err(RouterError::InvalidParams)?;
        let principal = caller.principal.as_ref().map(|p| p.id.as_str());
        let proven = self.config.auth.is_none()
            || self
                .config
                .federation
                .peers
                .iter()
                .any(|(system, who)| *system == p.system_id && Some(who.as_str()) == principal);
        let linked = proven
            && match self.federation.links.link(
                &p.system_id,
                &caller.session,
                principal,
                &p.endpoint,
            ) {
                Ok(()) => true,
                Err(Refused::Taken) => false,
                Err(Refused::Full) => {
                    return Err(RouterError::Exhausted(format!(
                        "federation links (limit {})",
                        crate::router::federation::table::MAX_LINKS
                    )))
                }
            };
        Ok(FederationConnectResult {
            connected: linked,
            system_info: self.system_info(),
            session_id: linked.then(|| caller.session.to_string()),
            principal: if linked {
                caller.principal.clone()
            } else {
                None
            },
            auth_required: (!linked).then(|| FederationAuthRequired {
                methods: AUTH_METHODS.iter().map(|m| (*m).to_owned()).collect(),
                challenge: format!("map_chal_{}", Ulid::random()),
                required: true,
            }),
        })
    }

    /// `map/federation/route` on a connected link, one router step: checks the envelope
    /// (bounds, a forged source or relay, then the spec's order) and delivers a message for
    /// this system through normal routing under `<sourceSystem>:agent:<from>`, or queues one
    /// for a system this router reaches (then the answer waits for the next system's, see
    /// [`route`]); any other target is 5001. A message delivered lately (its id,
    /// `<source>:message:<id>`, was seen) is answered as routed again and not delivered twice.
    pub(crate) fn federation_route_step(
        &mut self,
        ctx: &Ctx,
        p: FederationRouteParams,
    ) -> Result<RouteStep, RouterError> {
        let caller = self.federating_caller(ctx, "map/federation/route")?;
        let link = self
            .federation
            .links
            .system_of(&caller.session)
            .ok_or_else(|| {
                RouterError::Federation(
                    ErrorCode::FEDERATION_UNAVAILABLE,
                    "Federation unavailable: this session is no connected peer link (map/federation/connect first)".into(),
                )
            })?
            .to_owned();
        check_system_id(&p.system_id).map_err(RouterError::InvalidParams)?;
        let envelope = match (p.envelope, p.message) {
            (Some(e), _) => e,
            (None, Some(message)) => FederationEnvelope {
                payload: message,
                federation: FederationRouting {
                    source_system: link.clone(),
                    target_system: p.system_id.clone(),
                    hop_count: 0,
                    max_hops: None,
                    path: Some(vec![link.clone()]),
                    origin_timestamp: now_ms(),
                    correlation_id: None,
                    signature: None,
                },
            },
            (None, None) => {
                return Err(RouterError::InvalidParams(
                    "give envelope (or the legacy message)".into(),
                ))
            }
        };
        envelope
            .check_bounds()
            .map_err(RouterError::InvalidParams)?;
        let f = &envelope.federation;
        // The link proves one system: the path must end with it, and start with the source;
        // without a path, the source must be the link itself.
        match f.path.as_deref() {
            Some([first, .., last]) | Some([first @ last]) => {
                if *first != f.source_system {
                    return Err(forged(format!(
                        "Forged route: sourceSystem {} is not the first system of the path",
                        f.source_system
                    )));
                }
                if *last != link {
                    return Err(forged(format!(
                        "Forged route: the path must end with {link}, the system this link speaks for"
                    )));
                }
            }
            _ if f.source_system != link => {
                return Err(forged(format!(
                    "Forged route: sourceSystem {} is not {link}, the system this link speaks for, and no path shows the relay",
                    f.source_system
                )));
            }
            _ => {}
        }
        let next = process(&envelope, &self.config.federation.rules)
            .map_err(|e| RouterError::Federation(e.code, e.message))?;
        let f = &envelope.federation;
        let me = self.config.federation.rules.system_id.clone();
        let transit = f.target_system != me;
        if transit && self.config.federation.next_hop(&f.target_system).is_none() {
            return Err(RouterError::SystemNotFound(f.target_system.clone()));
        }
        let message: RoutedMessage = serde_json::from_str(envelope.payload.get())
            .map_err(|e| RouterError::InvalidParams(format!("envelope.payload: {e}")))?;
        if message.from.is_empty() || message.from.len() > MAX_FROM_BYTES {
            return Err(RouterError::InvalidParams(format!(
                "envelope.payload.from is 1 to {MAX_FROM_BYTES} bytes"
            )));
        }
        let id = match message.id.as_deref() {
            Some(id) if id.is_empty() || id.len() > MAX_FROM_BYTES => {
                return Err(RouterError::InvalidParams(format!(
                    "envelope.payload.id is 1 to {MAX_FROM_BYTES} bytes"
                )))
            }
            Some(id) => Some(MessageId::from(Federated::Message.id(&f.source_system, id))),
            None => None,
        };
        if let Some(id) = id.as_ref().filter(|id| self.federation.seen.contains(id)) {
            return Ok(RouteStep::Done(FederationRouteResult {
                routed: true,
                message_id: Some(id.clone()),
            }));
        }
        self.config.quotas.check_payload(message.payload.as_ref())?;
        let from: Arc<str> = Federated::Agent.id(&f.source_system, &message.from).into();
        let address = Address::parse_raw(&message.to);
        let (to, wait) = if transit {
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.federation.transit = Some((next, Some(tx)));
            let agent = match address {
                Ok(Address::Agent(a)) => a.to_string(),
                Ok(Address::Federated { agent, .. }) => agent.to_string(),
                _ => "*".to_owned(),
            };
            let to = serde_json::json!({"system": f.target_system, "agent": agent});
            (RawJson::from(to), Some(rx))
        } else {
            // The envelope's targetSystem says where a message goes: a `to` naming yet another
            // system would start a new route from here, past this system's checks.
            let systems = &self.config.federation;
            let remote = |id: &str| systems.remote_agent(id).is_some();
            let elsewhere = match &address {
                Ok(Address::Federated { system, .. }) => *system != me,
                Ok(Address::Agent(a)) => remote(a.as_str()),
                Ok(Address::Agents(list)) => list.iter().any(|a| remote(a.as_str())),
                Ok(Address::Text(t)) => remote(t.strip_prefix("agent:").unwrap_or(t)),
                _ => false,
            };
            if elsewhere {
                return Err(RouterError::Federation(
                    ErrorCode::FEDERATION_NOT_ALLOWED,
                    "A routed message's to names another system: route it there with targetSystem"
                        .into(),
                ));
            }
            // An agent that was here and may come back (its id is claimed: after a restart,
            // before it registers again) is away, not unknown: the peer tries again later.
            if let Ok(Address::Agent(a)) = &address {
                if !self.registry.contains(a)
                    && self
                        .identities
                        .owner(crate::router::identities::table::IdKind::Agent, a.as_str())
                        .is_some()
                {
                    return Err(RouterError::Federation(
                        ErrorCode::FEDERATION_UNAVAILABLE,
                        format!("Federation unavailable: agent {a} is away"),
                    ));
                }
            }
            (message.to, None)
        };
        let d = self.deliver_message_as(
            &caller,
            from,
            id.clone(),
            to,
            message.payload,
            message.meta,
            Vec::new(),
        );
        self.federation.transit = None;
        let d = d?;
        if let Some(id) = id {
            self.federation.seen.insert(id);
        }
        match wait {
            Some(_) if d.queued.is_empty() => Err(RouterError::Federation(
                ErrorCode::FEDERATION_UNAVAILABLE,
                format!(
                    "Federation unavailable: the queue for {} is full",
                    envelope.federation.target_system
                ),
            )),
            Some(rx) => Ok(RouteStep::Wait(rx, d.message_id)),
            None => Ok(RouteStep::Done(FederationRouteResult {
                routed: true,
                message_id: Some(d.message_id),
            })),
        }
    }

    /// Keeps a message for `<system>:agent:<agent>` (`recipient`) in the queue of the peer that
    /// reaches `system`; returns the routing to record in its `message.queued` when it is
    /// passing through (a restart rebuilds its envelope from that).
    ///
    /// # Errors
    /// The reason to report: no peer reaches `system`, or its queue is full.
    pub(crate) fn federation_keep(
        &mut self,
        system: &str,
        agent: &str,
        recipient: &str,
        out: &Arc<Outgoing>,
    ) -> Result<Option<FederationRouting>, &'static str> {
        let (envelope, waiter, transit) = match self.federation.transit.take() {
            Some((envelope, waiter)) => (envelope, waiter, true),
            None => (self.envelope_for(out, system, agent, None), None, false),
        };
        let routing = transit.then(|| envelope.federation.clone());
        self.queue_for_peer(system, recipient, out, envelope, waiter)?;
        Ok(routing)
    }

    /// Queues `envelope` (which takes `out` to `recipient` on `system`) for the peer that
    /// reaches `system`, with `waiter` for a route passing through.
    ///
    /// # Errors
    /// The reason to report: no peer reaches `system`, or its queue is full.
    pub(crate) fn queue_for_peer(
        &mut self,
        system: &str,
        recipient: &str,
        out: &Arc<Outgoing>,
        envelope: FederationEnvelope,
        waiter: Option<crate::router::federation::outbound::Waiter>,
    ) -> Result<(), &'static str> {
        let Some(peer) = self.config.federation.next_hop(system).map(str::to_owned) else {
            return Err("federation_unreachable");
        };
        // This system's span of the message (when it exports traces), else the message's own
        // trace context or its request's: the peer's events join the same trace.
        let trace = self
            .traces
            .as_ref()
            .and_then(|t| t.delivered_context(out.id.as_str()))
            .and_then(|tp| crate::protocol::trace::TraceContext::new(&tp, None))
            .or_else(|| out.trace.clone());
        let item = Waiting {
            out: out.clone(),
            recipient: recipient.to_owned(),
            envelope,
            waiter,
            trace,
        };
        let cap = self.config.federation.max_queued;
        self.federation
            .outbound
            .push(&peer, item, cap)
            .map_err(|_| "federation_queue_full")
    }

    /// The envelope that takes `out` to `<system>:agent:<agent>`: from this system (hop 0, the
    /// path holding this system), or, passing through (`routing`: the next envelope's), the
    /// message as its own system sent it (its id and sender without the source's prefix).
    pub(crate) fn envelope_for(
        &self,
        out: &Outgoing,
        system: &str,
        agent: &str,
        routing: Option<FederationRouting>,
    ) -> FederationEnvelope {
        let me = &self.config.federation.rules.system_id;
        let (id, from) = match &routing {
            Some(r) => {
                let strip = |s: &str, kind: Federated| {
                    kind.split(s)
                        .filter(|(system, _)| *system == r.source_system)
                        .map_or(s, |(_, id)| id)
                        .to_owned()
                };
                (
                    strip(out.id.as_str(), Federated::Message),
                    strip(&out.from, Federated::Agent),
                )
            }
            None => (out.id.to_string(), out.from.to_string()),
        };
        let (payload, meta) = serde_json::from_str::<Message>(out.message_json.get())
            .map(|m| (m.payload, m.meta))
            .unwrap_or((out.payload_json.clone(), None));
        let message = Message {
            id: MessageId::from(id),
            from,
            to: RawJson::from(serde_json::json!({ "agent": agent })),
            timestamp: out.timestamp,
            payload,
            meta,
        };
        let federation = routing.unwrap_or_else(|| FederationRouting {
            source_system: me.clone(),
            target_system: system.to_owned(),
            hop_count: 0,
            max_hops: None,
            path: Some(vec![me.clone()]),
            origin_timestamp: out.timestamp,
            correlation_id: Some(out.id.to_string()),
            signature: None,
        });
        FederationEnvelope {
            payload: RawJson::from_text(crate::router::core::to_json(&message))
                .unwrap_or_else(|_| RawJson::from(serde_json::Value::Null)),
            federation,
        }
    }

    /// Only the router's own peer links (its service principal, `gateway::federation`) take
    /// and settle what waits for a peer.
    fn peer_link(&self, ctx: &Ctx, system: &str) -> Result<Caller, RouterError> {
        let caller = self.caller(ctx)?;
        if !caller
            .principal
            .as_ref()
            .is_some_and(crate::auth::is_service)
        {
            return Err(RouterError::PermissionDenied(
                "map/federation/outbound/* is for the router's own peer links".into(),
            ));
        }
        if !self.config.federation.outbound.iter().any(|p| p == system) {
            return Err(RouterError::SystemNotFound(system.to_owned()));
        }
        Ok(caller)
    }

    /// `map/federation/outbound/next`, one router step: the messages the link has not taken
    /// yet, and what wakes it when there are none.
    pub(crate) fn federation_take(
        &mut self,
        ctx: &Ctx,
        system: &str,
        restart: bool,
        max: usize,
    ) -> Result<(Vec<OutboundItem>, Arc<tokio::sync::Notify>), RouterError> {
        let caller = self.peer_link(ctx, system)?;
        let items = self
            .federation
            .outbound
            .take(system, &caller.session, restart, max);
        Ok((items, self.federation.outbound.ready(system)))
    }

    /// `map/federation/outbound/agents`: the link says which agents the peer shows this system
    /// now (the first [`MAX_REMOTE_AGENTS`]).
    pub fn handle_federation_outbound_agents(
        &mut self,
        ctx: &Ctx,
        p: OutboundAgentsParams,
    ) -> Result<Empty, RouterError> {
        self.peer_link(ctx, &p.system_id)?;
        let mut agents = p.agents;
        agents.truncate(MAX_REMOTE_AGENTS);
        agents.retain(|a| !a.id.is_empty() && a.id.len() <= MAX_FROM_BYTES);
        // What a peer says of its agents is bounded like everything a caller can grow.
        let clip = |s: &mut Option<String>, max: usize| {
            if let Some(t) = s.as_mut().filter(|t| t.len() > max) {
                let mut end = max;
                while !t.is_char_boundary(end) {
                    end -= 1;
                }
                t.truncate(end);
            }
        };
        for a in &mut agents {
            a.federated_id = Federated::Agent.id(&p.system_id, &a.id);
            clip(&mut a.name, 256);
            clip(&mut a.role, 256);
            clip(&mut a.state, 64);
            clip(&mut a.description, 1024);
        }
        self.federation
            .directory
            .insert(p.system_id, (now_ms(), agents));
        Ok(Empty {})
    }

    /// `map/federation/agents`: the agents each peer this router dials shows it, addressable
    /// as `{system, agent}` or by their federated id. Not for gateways: a peer's link sees this
    /// system's own agents (`map/agents/list`), never another peer's.
    pub fn handle_federation_agents(
        &mut self,
        ctx: &Ctx,
        p: FederationAgentsParams,
    ) -> Result<FederationAgentsResult, RouterError> {
        let caller = self.caller(ctx)?;
        if caller.kind == ParticipantType::Gateway {
            return Err(RouterError::PermissionDenied(
                "map/federation/agents is for this system's own participants".into(),
            ));
        }
        let systems = self
            .config
            .federation
            .outbound
            .iter()
            .filter(|s| p.system_id.as_ref().is_none_or(|only| only == *s))
            .map(|s| {
                let known = self.federation.directory.get(s);
                PeerAgents {
                    system_id: s.clone(),
                    listed_at: known.map(|(at, _)| *at),
                    agents: known.map(|(_, a)| a.clone()).unwrap_or_default(),
                }
            })
            .collect();
        Ok(FederationAgentsResult { systems })
    }

    /// `map/federation/outbound/ack`: the peer answered the routes of waiting messages: each
    /// gets `message_delivered` (routed) or `message_failed` with the peer's code and reason,
    /// and a route passing through here gets the same answer.
    pub fn handle_federation_outbound_ack(
        &mut self,
        ctx: &Ctx,
        p: OutboundAckParams,
    ) -> Result<OutboundAckResult, RouterError> {
        self.peer_link(ctx, &p.system_id)?;
        if p.acks.len() > MAX_ACKS {
            return Err(RouterError::InvalidParams(format!(
                "at most {MAX_ACKS} acks at once"
            )));
        }
        let mut acked = 0;
        for a in p.acks {
            let Some(w) = self.federation.outbound.ack(&p.system_id, &a.message_id) else {
                continue;
            };
            acked += 1;
            match &a.error {
                None => {
                    self.emit_delivered(&w.out, &w.recipient, None);
                }
                Some(e) => {
                    let reason = format!("federation_refused: {}", e.message);
                    self.emit_failed_code(&w.out, &w.recipient, &reason, e.code);
                }
            }
            if let Some(waiter) = w.waiter {
                let _ = waiter.send(a.error.map_or(Ok(()), Err));
            }
        }
        Ok(OutboundAckResult { acked })
    }
}

/// What one router step of a route came to.
#[derive(Debug)]
pub(crate) enum RouteStep {
    /// Answered.
    Done(FederationRouteResult),
    /// Queued for the next system: wait for its answer.
    Wait(
        tokio::sync::oneshot::Receiver<Result<(), RouteRefusal>>,
        MessageId,
    ),
}

/// `map/federation/route`: one router step, then, for a message passing through, the next
/// system's answer (bounded by `config::Federation::forward_wait`; past it the message waits
/// here, durably, and the answer is `routed: true`). So a refusal further on (a loop, the hop
/// limit) reaches the sender's system as this answer, with the refusing system's code.
///
/// # Errors
/// The step's, or the next system's refusal.
pub async fn route(
    handle: RouterHandle,
    conn: ConnId,
    p: FederationRouteParams,
) -> Result<FederationRouteResult, RouterError> {
    let wait = handle.config().federation.forward_wait;
    let declared = crate::router::handle::Declared {
        trace: p
            .meta
            .as_ref()
            .and_then(crate::protocol::trace::TraceContext::from_meta),
        ..Default::default()
    };
    let (step, commit) = handle
        .call_deferred(
            conn,
            Some(Capability::CanSend),
            true,
            declared,
            move |r, ctx| r.federation_route_step(ctx, p),
        )
        .await?;
    if let Some(until) = commit {
        handle.wait_committed(until).await?;
    }
    match step {
        RouteStep::Done(result) => Ok(result),
        RouteStep::Wait(rx, message_id) => match tokio::time::timeout(wait, rx).await {
            Ok(Ok(Err(refusal))) => Err(RouterError::Federation(
                ErrorCode(refusal.code),
                refusal.message,
            )),
            _ => Ok(FederationRouteResult {
                routed: true,
                message_id: Some(message_id),
            }),
        },
    }
}

/// `map/federation/outbound/next`: what waits for the peer, waiting up to `waitMs` for a first
/// message when none does.
///
/// # Errors
/// Not the router's own link, not a dialled peer, or the router stopped.
pub async fn outbound_next(
    handle: RouterHandle,
    conn: ConnId,
    p: OutboundNextParams,
) -> Result<OutboundNextResult, RouterError> {
    let deadline = tokio::time::Instant::now()
        + std::time::Duration::from_millis(p.wait_ms.unwrap_or(0).min(30_000));
    let max = p.max.unwrap_or(MAX_TAKE);
    let mut restart = p.restart;
    loop {
        let system = p.system_id.clone();
        let (items, ready) = handle
            .call(conn, None, true, move |r, ctx| {
                r.federation_take(ctx, &system, restart, max)
            })
            .await?;
        restart = false;
        if !items.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(OutboundNextResult { items });
        }
        let _ = tokio::time::timeout_at(deadline, ready.notified()).await;
    }
}
