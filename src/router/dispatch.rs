//! The JSON-RPC core: the method table and the per-connection request loop body.
//!
//! [`Dispatcher`] maps each method name (from `protocol::methods`, never a literal here) to a
//! typed handler on [`Router`]. Undecodable params answer `-32602`, unknown methods `-32601`.
//! Registering a name twice panics at start-up, so a typo cannot silently shadow a method.
//!
//! [`RpcSession`] is what a transport runs for each incoming text frame, whatever the
//! transport: it classifies the frame (request, notification, batch, garbage), refuses
//! everything but `map/connect` and `map/authenticate` before a session exists (`1000`),
//! dispatches, and queues the response in the connection's outbox.
//!
//! Credentials (`map/connect`'s `auth`, `map/authenticate`, `map/auth/refresh`) are verified
//! here, on the connection's task, before the call goes to the router with the verdict: a
//! signature check is CPU work the router task must not do. Requests from one connection are handled one at a time,
//! in arrival order, so state-changing calls apply in the order they were sent; the router
//! itself applies calls from all connections in one total order.
//!
//! Ordering guarantee: a `map/subscribe` response is queued *before* the subscription is
//! activated, so no `map/event` can overtake it.
//!
//! Limits applied here, before anything is parsed into values or reaches the router
//! ([`SessionLimits`]): JSON nesting depth (checked on the raw text, `-32600`), batch size
//! (`-32600`), and the request rate (`4001` with `data.retryAfterMs`, see [`super::rate`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::value::RawValue;

use crate::protocol::jsonrpc::{self, ErrorObject, Frame, Id, Incoming};
use crate::protocol::methods::{self, Method};

use super::auth_ops::{self, Verdict};
use super::outbox::{Outbound, Outbox};
use super::pipeline::Pipeline;
use super::rate::{retry_after_ms, ConnRate};
use super::{subscription_ops, Command, ConnId, Ctx, Router, RouterError, RouterHandle};
use crate::auth::Authenticator;
use crate::process::WeakSupervisor;

/// Default cap on the number of entries in one batch.
pub const DEFAULT_MAX_BATCH: usize = 1000;

type CallFuture = Pin<Box<dyn Future<Output = Result<Reply, ErrorObject>> + Send>>;
type Handler = Box<
    dyn Fn(&RouterHandle, ConnId, Option<&RawValue>) -> Result<CallFuture, ErrorObject>
        + Send
        + Sync,
>;

struct Entry {
    handler: Handler,
    /// Only `map/connect` and `map/authenticate` are allowed without a session.
    needs_session: bool,
}

/// The method table.
pub struct Dispatcher {
    table: HashMap<&'static str, Entry>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<_> = self.table.keys().collect();
        names.sort();
        f.debug_struct("Dispatcher")
            .field("methods", &names)
            .finish()
    }
}

/// An asynchronous method handler (see [`Dispatcher::add_async`]).
pub type AsyncHandlerFn<M> =
    fn(
        RouterHandle,
        ConnId,
        <M as Method>::Params,
    ) -> Pin<Box<dyn Future<Output = Result<<M as Method>::Result, RouterError>> + Send>>;

type HandlerFn<M> =
    fn(&mut Router, &Ctx, <M as Method>::Params) -> Result<<M as Method>::Result, RouterError>;

/// Checks the credentials in a method's params (`None`: there are none to check).
type VerifyFn<M> = fn(&Authenticator, &<M as Method>::Params) -> Verdict;

/// A router handler that gets the verdict on the call's credentials.
type VerifiedHandlerFn<M> = fn(
    &mut Router,
    &Ctx,
    <M as Method>::Params,
    Verdict,
) -> Result<<M as Method>::Result, RouterError>;

impl Default for Dispatcher {
    fn default() -> Self {
        Self::new()
    }
}

impl Dispatcher {
    /// The table with every method this router implements.
    pub fn new() -> Self {
        use methods::agents::*;
        use methods::auth::*;
        use methods::events::*;
        use methods::messaging::*;
        use methods::scopes::*;
        use methods::session::*;
        let mut d = Self {
            table: HashMap::new(),
        };
        d.add_verified::<Connect>(
            auth_ops::verify_connect,
            Router::handle_connect_verified,
            |r| match r {
                ConnectResponse::Connected(_) => AfterReply::Connected,
                ConnectResponse::AuthRequired(_) => AfterReply::AuthRequired,
            },
        );
        d.add_verified::<Authenticate>(
            auth_ops::verify_authenticate,
            Router::handle_authenticate,
            |r| {
                if r.session.is_some() {
                    AfterReply::Connected
                } else {
                    AfterReply::Nothing
                }
            },
        );
        d.add_verified::<AuthRefresh>(
            auth_ops::verify_refresh,
            Router::handle_auth_refresh,
            |_| AfterReply::Nothing,
        );
        d.add::<Disconnect>(Router::handle_disconnect, |_| AfterReply::Disconnected);
        d.add::<Send>(Router::handle_send, |_| AfterReply::Nothing);
        d.add_async::<Subscribe>(
            |router, conn, p| Box::pin(subscription_ops::subscribe(router, conn, p)),
            |r| AfterReply::Activate(r.subscription_id.to_string()),
        );
        d.add::<Unsubscribe>(Router::handle_unsubscribe, |_| AfterReply::Nothing);
        d.add_async::<Replay>(
            |router, conn, p| Box::pin(subscription_ops::replay(router, conn, p)),
            |_| AfterReply::Nothing,
        );
        d.add::<AgentsList>(Router::handle_agents_list, |_| AfterReply::Nothing);
        d.add::<AgentsGet>(Router::handle_agents_get, |_| AfterReply::Nothing);
        d.add::<AgentsRegister>(Router::handle_register, |_| AfterReply::Nothing);
        d.add::<AgentsSpawn>(Router::handle_spawn, |_| AfterReply::Nothing);
        d.add::<AgentsUnregister>(Router::handle_unregister, |_| AfterReply::Nothing);
        d.add::<AgentsUpdate>(Router::handle_update, |_| AfterReply::Nothing);
        d.add::<AgentsStop>(Router::handle_stop, |_| AfterReply::Nothing);
        d.add::<AgentsSuspend>(Router::handle_suspend, |_| AfterReply::Nothing);
        d.add::<AgentsResume>(Router::handle_resume, |_| AfterReply::Nothing);
        d.add::<StructureGraph>(Router::handle_graph, |_| AfterReply::Nothing);
        d.add::<ScopesList>(Router::handle_scopes_list, |_| AfterReply::Nothing);
        d.add::<ScopesGet>(Router::handle_scopes_get, |_| AfterReply::Nothing);
        d.add::<ScopesCreate>(Router::handle_scopes_create, |_| AfterReply::Nothing);
        d.add::<ScopesDelete>(Router::handle_scopes_delete, |_| AfterReply::Nothing);
        d.add::<ScopesJoin>(Router::handle_scopes_join, |_| AfterReply::Nothing);
        d.add::<ScopesLeave>(Router::handle_scopes_leave, |_| AfterReply::Nothing);
        d.add::<ScopesMembers>(Router::handle_scopes_members, |_| AfterReply::Nothing);
        d.add::<methods::steering::Inject>(Router::handle_inject, |_| AfterReply::Nothing);
        d.add::<methods::permissions::PermissionsUpdate>(Router::handle_permissions_update, |_| {
            AfterReply::Nothing
        });
        d
    }

    /// Registers `M` with its handler and follow-up.
    ///
    /// # Panics
    /// If `M::NAME` is already registered.
    pub fn add<M: Method>(&mut self, f: HandlerFn<M>, after: fn(&M::Result) -> AfterReply) {
        let needs_session = needs_session(M::NAME);
        let previous = self.table.insert(
            M::NAME,
            Entry {
                handler: typed_handler::<M>(f, after, needs_session),
                needs_session,
            },
        );
        assert!(previous.is_none(), "method {} registered twice", M::NAME);
    }

    /// Registers `M`, whose params carry credentials: `verify` checks them on the calling
    /// connection's task (when authentication is on), then `f` runs on the router with the
    /// verdict.
    ///
    /// # Panics
    /// If `M::NAME` is already registered.
    pub fn add_verified<M: Method>(
        &mut self,
        verify: VerifyFn<M>,
        f: VerifiedHandlerFn<M>,
        after: fn(&M::Result) -> AfterReply,
    ) {
        let needs_session = needs_session(M::NAME);
        let handler: Handler = Box::new(move |router, conn, params| {
            let causes = declared_causes(params);
            let params: M::Params = decode_params(params)?;
            let verdict = router
                .config()
                .auth
                .as_deref()
                .and_then(|a| verify(a, &params));
            let router = router.clone();
            Ok(Box::pin(async move {
                let result = router
                    .call_caused(conn, M::CAPABILITY, needs_session, causes, move |r, ctx| {
                        f(r, ctx, params, verdict)
                    })
                    .await
                    .map_err(ErrorObject::from)?;
                let json = serde_json::to_string(&result)
                    .map_err(|e| ErrorObject::internal(format!("cannot encode result: {e}")))?;
                Ok(Reply {
                    result: json,
                    after: after(&result),
                })
            }))
        });
        let previous = self.table.insert(
            M::NAME,
            Entry {
                handler,
                needs_session,
            },
        );
        assert!(previous.is_none(), "method {} registered twice", M::NAME);
    }

    /// Registers `M` with an asynchronous handler: one that orchestrates several router steps
    /// (and reads the durable store between them) instead of one router call. The handler
    /// checks capabilities itself, in its router calls.
    ///
    /// # Panics
    /// If `M::NAME` is already registered.
    pub fn add_async<M: Method>(
        &mut self,
        f: AsyncHandlerFn<M>,
        after: fn(&M::Result) -> AfterReply,
    ) {
        let handler: Handler = Box::new(move |router, conn, params| {
            let params: M::Params = decode_params(params)?;
            let fut = f(router.clone(), conn, params);
            Ok(Box::pin(async move {
                let result = fut.await.map_err(ErrorObject::from)?;
                let json = serde_json::to_string(&result)
                    .map_err(|e| ErrorObject::internal(format!("cannot encode result: {e}")))?;
                Ok(Reply {
                    result: json,
                    after: after(&result),
                })
            }))
        });
        let previous = self.table.insert(
            M::NAME,
            Entry {
                handler,
                needs_session: true,
            },
        );
        assert!(previous.is_none(), "method {} registered twice", M::NAME);
    }

    /// The method table with supervised spawning: `map/agents/spawn` with a `command` goes to
    /// the process supervisor, without one to the router as usual.
    pub fn with_supervisor(supervisor: WeakSupervisor) -> Self {
        use methods::agents::{AgentsSpawn, SpawnParams};
        let mut d = Self::new();
        let plain =
            typed_handler::<AgentsSpawn>(Router::handle_spawn, |_| AfterReply::Nothing, true);
        let handler: Handler = Box::new(move |router, conn, params| {
            let p: SpawnParams = decode_params(params)?;
            if p.command.is_none() {
                return plain(router, conn, params);
            }
            let supervisor = supervisor.upgrade().ok_or_else(|| {
                RouterError::SpawnFailed("the process supervisor has stopped".into())
                    .to_error_object()
            })?;
            Ok(Box::pin(async move {
                let result = supervisor.spawn(Some(conn), p).await?;
                let json = serde_json::to_string(&result)
                    .map_err(|e| ErrorObject::internal(format!("cannot encode result: {e}")))?;
                Ok(Reply {
                    result: json,
                    after: AfterReply::Nothing,
                })
            }))
        });
        d.table.insert(
            AgentsSpawn::NAME,
            Entry {
                handler,
                needs_session: true,
            },
        );
        d
    }

    /// Every registered method name.
    pub fn methods(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.table.keys().copied()
    }
}

/// Whether a method needs a session: all but `map/connect` and `map/authenticate`.
fn needs_session(method: &str) -> bool {
    method != methods::session::Connect::NAME && method != methods::auth::Authenticate::NAME
}

/// Wraps a typed router handler as a table entry: decode params, run on the router task
/// (after the capability check), encode the result.
fn typed_handler<M: Method>(
    f: HandlerFn<M>,
    after: fn(&M::Result) -> AfterReply,
    needs_session: bool,
) -> Handler {
    Box::new(move |router, conn, params| {
        let causes = declared_causes(params);
        let params: M::Params = decode_params(params)?;
        let router = router.clone();
        Ok(Box::pin(async move {
            let result = router
                .call_caused(conn, M::CAPABILITY, needs_session, causes, move |r, ctx| {
                    f(r, ctx, params)
                })
                .await
                .map_err(ErrorObject::from)?;
            let json = serde_json::to_string(&result)
                .map_err(|e| ErrorObject::internal(format!("cannot encode result: {e}")))?;
            Ok(Reply {
                result: json,
                after: after(&result),
            })
        }))
    })
}

/// The event ids a call names as its causes in `params._meta.causedBy` (malformed entries are
/// ignored: causality is advisory metadata, never a reason to refuse a call).
fn declared_causes(params: Option<&RawValue>) -> Vec<crate::protocol::ids::EventId> {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(default, rename = "causedBy")]
        caused_by: Vec<serde_json::Value>,
    }
    #[derive(serde::Deserialize)]
    struct WithMeta {
        #[serde(default, rename = "_meta")]
        meta: Option<Meta>,
    }
    let Some(raw) = params else {
        return Vec::new();
    };
    if !raw.get().contains("_meta") {
        return Vec::new();
    }
    serde_json::from_str::<WithMeta>(raw.get())
        .ok()
        .and_then(|w| w.meta)
        .map(|m| {
            m.caused_by
                .iter()
                .filter_map(|v| v.as_str().and_then(crate::protocol::ids::EventId::parse))
                .take(16)
                .collect()
        })
        .unwrap_or_default()
}

/// The principal id in a `map/connect` result, if any.
fn principal_of(result: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Principal {
        id: String,
    }
    #[derive(serde::Deserialize)]
    struct WithPrincipal {
        #[serde(default)]
        principal: Option<Principal>,
    }
    if !result.contains("\"principal\"") {
        return None;
    }
    serde_json::from_str::<WithPrincipal>(result)
        .ok()?
        .principal
        .map(|p| p.id)
}

/// Decodes params; absent params decode from `{}`.
fn decode_params<P: serde::de::DeserializeOwned>(
    params: Option<&RawValue>,
) -> Result<P, ErrorObject> {
    let text = params.map_or("{}", RawValue::get);
    if text.trim_start().starts_with('[') {
        return Err(ErrorObject::invalid_params(
            "MAP methods take named params (an object), not an array",
        ));
    }
    serde_json::from_str(text).map_err(jsonrpc::params_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::methods::{for_each_method, MethodVisitor};

    #[test]
    fn every_protocol_method_is_dispatched_and_nothing_else() {
        struct Names(Vec<&'static str>);
        impl MethodVisitor for Names {
            fn visit<M: Method>(&mut self) {
                self.0.push(M::NAME);
            }
        }
        let mut names = Names(Vec::new());
        for_each_method(&mut names);
        let d = Dispatcher::new();
        let mut table: Vec<_> = d.methods().collect();
        table.sort_unstable();
        names.0.sort_unstable();
        assert_eq!(table, names.0);
    }

    #[test]
    #[should_panic(expected = "registered twice")]
    fn duplicate_registration_panics() {
        let mut d = Dispatcher::new();
        d.add::<methods::session::Connect>(Router::handle_connect, |_| AfterReply::Nothing);
    }

    #[test]
    fn absent_params_decode_as_empty_object_and_arrays_are_refused() {
        let p: methods::agents::AgentsListParams = decode_params(None).unwrap();
        assert!(p.filter.is_none());
        let raw: &RawValue = serde_json::from_str("[1]").unwrap();
        let err = decode_params::<methods::agents::AgentsListParams>(Some(raw)).unwrap_err();
        assert_eq!(err.code.0, -32602);
    }
}
