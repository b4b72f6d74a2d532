//! `map/federation/connect` and `map/federation/route`, inbound: the handlers that coordinate
//! the links table ([`super::table`]) with sessions (who is calling, as which principal) and
//! messaging (local delivery).

use std::sync::Arc;

use crate::protocol::capabilities::ParticipantType;
use crate::protocol::ids::{now_ms, Ulid};
use crate::protocol::jsonrpc::ErrorCode;
use crate::protocol::methods::federation::{
    check_system_id, process, FederationAuthRequired, FederationConnectParams,
    FederationConnectResult, FederationEnvelope, FederationRouteParams, FederationRouteResult,
    FederationRouting, RoutedMessage, SystemInfo, MAX_FROM_BYTES,
};
use crate::router::caller::{Caller, Ctx};
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::federation::table::Refused;

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
                "federation": {"canFederate": true, "inbound": true, "forward": false}
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
            && match self
                .federation
                .link(&p.system_id, &caller.session, principal, &p.endpoint)
            {
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

    /// `map/federation/route` on a connected link: checks the envelope (bounds, a forged
    /// source or relay, then the spec's order) and delivers a message for this system through
    /// normal routing under `<sourceSystem>:agent:<from>`; another target is 5001 for now.
    pub fn handle_federation_route(
        &mut self,
        ctx: &Ctx,
        p: FederationRouteParams,
    ) -> Result<FederationRouteResult, RouterError> {
        let caller = self.federating_caller(ctx, "map/federation/route")?;
        let link = self
            .federation
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
        process(&envelope, &self.config.federation.rules)
            .map_err(|e| RouterError::Federation(e.code, e.message))?;
        let f = &envelope.federation;
        if f.target_system != self.config.federation.rules.system_id {
            return Err(RouterError::SystemNotFound(f.target_system.clone()));
        }
        let message: RoutedMessage = serde_json::from_str(envelope.payload.get())
            .map_err(|e| RouterError::InvalidParams(format!("envelope.payload: {e}")))?;
        if message.from.is_empty() || message.from.len() > MAX_FROM_BYTES {
            return Err(RouterError::InvalidParams(format!(
                "envelope.payload.from is 1 to {MAX_FROM_BYTES} bytes"
            )));
        }
        self.config.quotas.check_payload(message.payload.as_ref())?;
        let from: Arc<str> = format!("{}:agent:{}", f.source_system, message.from).into();
        let d = self.deliver_message_as(
            &caller,
            from,
            message.to,
            message.payload,
            message.meta,
            Vec::new(),
        )?;
        Ok(FederationRouteResult {
            routed: true,
            message_id: Some(d.message_id),
        })
    }
}
