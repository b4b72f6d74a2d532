//! The method table: each method name (from `protocol::methods`, never a literal here) mapped
//! to its typed handler, and **when its answer may be sent** relative to the durable store
//! ([`Answer`]): after the commit of what the call appended, in place, or in the connection's
//! pipeline. Undecodable params answer `-32602`, unknown methods `-32601`. Registering a name
//! twice panics at start-up, so a typo cannot silently shadow a method.
//!
//! Each entry decodes the params, runs the handler on the router task (after the capability
//! check) and encodes the result; [`super::rpc::RpcSession`] then applies the entry's
//! [`Answer`]. Credentials (`map/connect`'s `auth`, `map/authenticate`, `map/auth/refresh`) are
//! verified in the entry, on the connection's task, before the call goes to the router with the
//! verdict: a signature check is CPU work the router task must not do.
//!
//! `map/agents/spawn` with a `command` goes to a [`ProcessSpawner`] that the server installs
//! (the process supervisor): the router itself launches nothing.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::value::RawValue;

use crate::auth::Authenticator;
use crate::protocol::jsonrpc::{self, ErrorObject};
use crate::protocol::methods::agents::{SpawnParams, SpawnResult};
use crate::protocol::methods::{self, Method};
use crate::protocol::trace::TraceContext;
use crate::router::caller::Ctx;
use crate::router::core::Router;
use crate::router::error::RouterError;
use crate::router::events::ops as subscriptions;
use crate::router::handle::{Declared, RouterHandle};
use crate::router::ids::ConnId;
use crate::router::reply::{AfterReply, Reply};
use crate::router::sessions::auth::{self, Verdict};

/// Default cap on the number of entries in one batch.
pub const DEFAULT_MAX_BATCH: usize = 1000;

/// When a method's answer may be sent, relative to the store's commit of the events the call
/// appended (with durability `durable`; otherwise nothing is waited for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Once the call's events are committed; the connection reads its next request only then.
    /// A call that appended nothing is answered at once.
    AfterCommit,
    /// Once the call's events are committed, but the connection goes on reading meanwhile: the
    /// answer waits in the connection's pipeline, and answers leave in request order
    /// ([`super::pipeline`]). In a batch, or over HTTP, it is answered as `AfterCommit`.
    Pipelined,
}

type CallFuture = Pin<Box<dyn Future<Output = Result<Reply, ErrorObject>> + Send>>;
type Handler = Box<
    dyn Fn(&RouterHandle, ConnId, Option<&RawValue>) -> Result<CallFuture, ErrorObject>
        + Send
        + Sync,
>;

/// One method of the table.
pub(crate) struct Entry {
    handler: Handler,
    /// Only `map/connect` and `map/authenticate` are allowed without a session.
    pub(crate) needs_session: bool,
    /// When its answer may be sent.
    pub(crate) answer: Answer,
}

impl Entry {
    /// Decodes `params` and starts the call.
    pub(crate) fn call(
        &self,
        router: &RouterHandle,
        conn: ConnId,
        params: Option<&RawValue>,
    ) -> Result<CallFuture, ErrorObject> {
        (self.handler)(router, conn, params)
    }
}

/// The method table.
pub struct Dispatcher {
    table: crate::router::ids::IdMap<&'static str, Entry>,
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

/// Launches a supervised process for `map/agents/spawn` with a `command`, on behalf of the
/// calling connection, and answers once it has registered (the server installs the process
/// supervisor; see `crate::process`).
pub trait ProcessSpawner: Send + Sync + std::fmt::Debug {
    /// Reserves the agent, launches the process and waits (bounded) for its registration.
    fn spawn(
        &self,
        caller: ConnId,
        params: SpawnParams,
    ) -> BoxFuture<'static, Result<SpawnResult, ErrorObject>>;
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

/// The follow-up of most methods: none.
fn nothing<R>(_: &R) -> AfterReply {
    AfterReply::Nothing
}

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
        use Answer::{AfterCommit, Pipelined};
        let mut d = Self {
            table: Default::default(),
        };
        // Sessions and authentication.
        d.add_verified::<Connect>(
            auth::verify_connect,
            Router::handle_connect_verified,
            |r| match r {
                ConnectResponse::Connected(_) => AfterReply::Connected,
                ConnectResponse::AuthRequired(_) => AfterReply::AuthRequired,
            },
        );
        d.add_verified::<Authenticate>(
            auth::verify_authenticate,
            Router::handle_authenticate,
            |r| {
                if r.session.is_some() {
                    AfterReply::Connected
                } else {
                    AfterReply::Nothing
                }
            },
        );
        d.add_verified::<AuthRefresh>(auth::verify_refresh, Router::handle_auth_refresh, nothing);
        d.add::<Disconnect>(AfterCommit, Router::handle_disconnect, |_| {
            AfterReply::Disconnected
        });
        d.add::<SessionList>(AfterCommit, Router::handle_session_list, nothing);
        d.add::<SessionLoad>(AfterCommit, Router::handle_session_load, nothing);
        d.add::<SessionClose>(AfterCommit, Router::handle_session_close, |r| {
            if r.current {
                AfterReply::Disconnected
            } else {
                AfterReply::Nothing
            }
        });
        // Messages: the hot path, pipelined. A send with `meta.mail` may need its conversation
        // loaded first (`router::kept`); the others never do and take the plain path.
        {
            let plain = typed_handler::<Send>(Router::handle_send, nothing, true);
            let mail = paged_handler::<Send>(Router::handle_send, nothing);
            let handler: Handler = Box::new(move |router, conn, params| {
                if params.is_some_and(|p| p.get().contains("\"mail\"")) {
                    mail(router, conn, params)
                } else {
                    plain(router, conn, params)
                }
            });
            d.insert(
                Send::NAME,
                Entry {
                    handler,
                    needs_session: true,
                    answer: Pipelined,
                },
            );
        }
        d.add::<methods::steering::Inject>(AfterCommit, Router::handle_inject, nothing);
        // Events.
        d.add_async::<Subscribe>(
            |router, conn, p| Box::pin(subscriptions::subscribe(router, conn, p)),
            |r| AfterReply::Activate(r.subscription_id.clone()),
        );
        d.add::<Unsubscribe>(AfterCommit, Router::handle_unsubscribe, nothing);
        d.add_async::<Replay>(
            |router, conn, p| Box::pin(subscriptions::replay(router, conn, p)),
            nothing,
        );
        d.add_async::<methods::traces::TracesGet>(
            |router, conn, p| Box::pin(crate::router::traces::read::get(router, conn, p)),
            nothing,
        );
        // Agents.
        d.add::<AgentsList>(AfterCommit, Router::handle_agents_list, nothing);
        d.add::<AgentsGet>(AfterCommit, Router::handle_agents_get, nothing);
        d.add::<AgentsRegister>(AfterCommit, Router::handle_register, nothing);
        d.add::<AgentsSpawn>(AfterCommit, Router::handle_spawn, nothing);
        d.add::<AgentsUnregister>(AfterCommit, Router::handle_unregister, nothing);
        d.add::<AgentsUpdate>(AfterCommit, Router::handle_update, nothing);
        d.add::<AgentsStop>(AfterCommit, Router::handle_stop, nothing);
        d.add::<AgentsSuspend>(AfterCommit, Router::handle_suspend, nothing);
        d.add::<AgentsResume>(AfterCommit, Router::handle_resume, nothing);
        d.add::<StructureGraph>(AfterCommit, Router::handle_graph, nothing);
        // Scopes.
        d.add::<ScopesList>(AfterCommit, Router::handle_scopes_list, nothing);
        d.add::<ScopesGet>(AfterCommit, Router::handle_scopes_get, nothing);
        d.add::<ScopesCreate>(AfterCommit, Router::handle_scopes_create, nothing);
        d.add::<ScopesDelete>(AfterCommit, Router::handle_scopes_delete, nothing);
        d.add::<ScopesJoin>(AfterCommit, Router::handle_scopes_join, nothing);
        d.add::<ScopesLeave>(AfterCommit, Router::handle_scopes_leave, nothing);
        d.add::<ScopesMembers>(AfterCommit, Router::handle_scopes_members, nothing);
        // Trajectory extension.
        {
            use methods::trajectory::*;
            d.add_paged::<TrajectoryCheckpoint>(
                AfterCommit,
                Router::handle_trajectory_checkpoint,
                nothing,
            );
            d.add_async::<TrajectoryList>(
                |router, conn, p| Box::pin(crate::router::trajectory::ops::list(router, conn, p)),
                nothing,
            );
            d.add_paged::<TrajectoryGet>(AfterCommit, Router::handle_trajectory_get, nothing);
            d.add_async::<TrajectoryContent>(
                |router, conn, p| {
                    Box::pin(crate::router::trajectory::ops::content(router, conn, p))
                },
                |r| AfterReply::Frames(r.chunks.clone()),
            );
        }
        // Tasks extension.
        {
            use methods::tasks::*;
            d.add_paged::<TasksCreate>(AfterCommit, Router::handle_tasks_create, nothing);
            d.add_paged::<TasksAssign>(AfterCommit, Router::handle_tasks_assign, nothing);
            d.add_paged::<TasksUpdate>(AfterCommit, Router::handle_tasks_update, nothing);
            d.add_paged::<TasksGet>(AfterCommit, Router::handle_tasks_get, nothing);
            d.add_async::<TasksList>(
                |router, conn, p| Box::pin(crate::router::tasks::ops::list(router, conn, p)),
                nothing,
            );
        }
        // Mail extension.
        {
            use crate::router::mail::reads;
            use methods::mail::*;
            d.add_paged::<MailCreate>(AfterCommit, Router::handle_mail_create, nothing);
            d.add_async::<MailGet>(
                |router, conn, p| Box::pin(reads::get(router, conn, p)),
                nothing,
            );
            d.add_async::<MailList>(
                |router, conn, p| Box::pin(reads::list(router, conn, p)),
                nothing,
            );
            d.add_paged::<MailClose>(AfterCommit, Router::handle_mail_close, nothing);
            d.add_async::<MailJoin>(
                |router, conn, p| Box::pin(reads::join(router, conn, p)),
                nothing,
            );
            d.add_paged::<MailLeave>(AfterCommit, Router::handle_mail_leave, nothing);
            d.add_paged::<MailInvite>(AfterCommit, Router::handle_mail_invite, nothing);
            d.add_paged::<MailTurn>(AfterCommit, Router::handle_mail_turn, nothing);
            d.add_async::<MailTurnsList>(
                |router, conn, p| Box::pin(reads::turns_list(router, conn, p)),
                nothing,
            );
            d.add_paged::<MailThreadCreate>(
                AfterCommit,
                Router::handle_mail_thread_create,
                nothing,
            );
            d.add_paged::<MailThreadList>(AfterCommit, Router::handle_mail_thread_list, nothing);
            d.add_async::<MailSummary>(
                |router, conn, p| Box::pin(reads::summary(router, conn, p)),
                nothing,
            );
            d.add_async::<MailReplay>(
                |router, conn, p| Box::pin(reads::replay(router, conn, p)),
                nothing,
            );
        }
        // Permissions.
        d.add::<methods::permissions::PermissionsUpdate>(
            AfterCommit,
            Router::handle_permissions_update,
            nothing,
        );
        // Federation.
        d.add::<methods::federation::FederationConnect>(
            AfterCommit,
            Router::handle_federation_connect,
            nothing,
        );
        d.add_async::<methods::federation::FederationRoute>(
            |router, conn, p| Box::pin(crate::router::federation::ops::route(router, conn, p)),
            nothing,
        );
        d.add_async::<methods::federation::FederationOutboundNext>(
            |router, conn, p| {
                Box::pin(crate::router::federation::ops::outbound_next(
                    router, conn, p,
                ))
            },
            nothing,
        );
        d.add::<methods::federation::FederationOutboundAgents>(
            AfterCommit,
            Router::handle_federation_outbound_agents,
            nothing,
        );
        d.add::<methods::federation::FederationAgents>(
            AfterCommit,
            Router::handle_federation_agents,
            nothing,
        );
        d.add::<methods::federation::FederationOutboundAck>(
            AfterCommit,
            Router::handle_federation_outbound_ack,
            nothing,
        );
        d.add::<methods::identities::IdentityRelease>(
            AfterCommit,
            Router::handle_identity_release,
            nothing,
        );
        d
    }

    fn insert(&mut self, name: &'static str, entry: Entry) {
        let previous = self.table.insert(name, entry);
        assert!(previous.is_none(), "method {name} registered twice");
    }

    /// Registers `M` with its handler, when its answer may be sent, and its follow-up.
    ///
    /// # Panics
    /// If `M::NAME` is already registered.
    pub fn add<M: Method>(
        &mut self,
        answer: Answer,
        f: HandlerFn<M>,
        after: fn(&M::Result) -> AfterReply,
    ) {
        let needs_session = needs_session(M::NAME);
        self.insert(
            M::NAME,
            Entry {
                handler: typed_handler::<M>(f, after, needs_session),
                needs_session,
                answer,
            },
        );
    }

    /// Registers `M` with a handler that may need kept items loaded first
    /// (`RouterError::NeedsLoad`): it runs again, with its params, once they are
    /// (`kept::ops::paged`), and its answer follows `answer` like any other.
    ///
    /// # Panics
    /// If `M::NAME` is already registered.
    pub fn add_paged<M: Method>(
        &mut self,
        answer: Answer,
        f: HandlerFn<M>,
        after: fn(&M::Result) -> AfterReply,
    ) where
        M::Params: Clone + std::marker::Send + Sync + 'static,
    {
        self.insert(
            M::NAME,
            Entry {
                handler: paged_handler::<M>(f, after),
                needs_session: true,
                answer,
            },
        );
    }

    /// Registers `M`, whose params carry credentials: `verify` checks them on the calling
    /// connection's task (when authentication is on), then `f` runs on the router with the
    /// verdict. Answered after the commit of what it appended.
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
            let declared = declared(params);
            let params: M::Params = decode_params(params)?;
            let verdict = router
                .config()
                .auth
                .as_deref()
                .and_then(|a| verify(a, &params));
            let router = router.clone();
            Ok(Box::pin(async move {
                let (result, commit) = router
                    .call_deferred(
                        conn,
                        M::CAPABILITY,
                        needs_session,
                        declared,
                        move |r, ctx| f(r, ctx, params, verdict),
                    )
                    .await
                    .map_err(ErrorObject::from)?;
                reply(&result, after, commit)
            }))
        });
        self.insert(
            M::NAME,
            Entry {
                handler,
                needs_session,
                answer: Answer::AfterCommit,
            },
        );
    }

    /// Registers `M` with an asynchronous handler: one that orchestrates several router steps
    /// (and reads the durable store between them) instead of one router call. The handler
    /// checks capabilities itself, in its router calls, and those calls wait for their own
    /// commits: its answer is [`Answer::AfterCommit`].
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
                reply(&result, after, None)
            }))
        });
        self.insert(
            M::NAME,
            Entry {
                handler,
                needs_session: true,
                answer: Answer::AfterCommit,
            },
        );
    }

    /// The method table with supervised spawning: `map/agents/spawn` with a `command` goes to
    /// `spawner`, without one to the router as usual.
    pub fn with_spawner(spawner: Arc<dyn ProcessSpawner>) -> Self {
        use methods::agents::AgentsSpawn;
        let mut d = Self::new();
        let plain = typed_handler::<AgentsSpawn>(Router::handle_spawn, nothing, true);
        let handler: Handler = Box::new(move |router, conn, params| {
            let mut p: SpawnParams = decode_params(params)?;
            let Some(command) = p.command.as_mut() else {
                return plain(router, conn, params);
            };
            // The spawn's trace context continues in the child (unless its env sets its own).
            if let Some(trace) = declared(params).trace {
                command
                    .env
                    .entry("TRACEPARENT".into())
                    .or_insert_with(|| trace.traceparent.to_string());
                if let Some(state) = &trace.tracestate {
                    command
                        .env
                        .entry("TRACESTATE".into())
                        .or_insert_with(|| state.to_string());
                }
            }
            let spawned = spawner.spawn(conn, p);
            Ok(Box::pin(async move {
                let result = spawned.await?;
                reply(&result, nothing, None)
            }))
        });
        d.table.insert(
            AgentsSpawn::NAME,
            Entry {
                handler,
                needs_session: true,
                answer: Answer::AfterCommit,
            },
        );
        d
    }

    /// Every registered method name.
    pub fn methods(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.table.keys().copied()
    }

    /// The table's own spelling of `method` (a `'static` name, for metrics labels).
    pub fn name_of(&self, method: &str) -> Option<&'static str> {
        self.table.get_key_value(method).map(|(k, _)| *k)
    }

    /// The entry of `method`, if it is in the table.
    pub(crate) fn get(&self, method: &str) -> Option<&Entry> {
        self.table.get(method)
    }

    /// When `method`'s answer may be sent, if it is in the table.
    pub fn answer_of(&self, method: &str) -> Option<Answer> {
        self.table.get(method).map(|e| e.answer)
    }
}

/// Whether a follower (`RouterConfig::follower`) serves `method`: sessions, subscriptions and
/// replay, which read the log and write nothing to it, and the reads of agents and scopes it
/// answers from the saved records it follows (`router::relay::reads_saved_image`). Every
/// other method is refused there with `RouterError::NotOnFollower`, before it reaches the
/// router task.
pub fn served_by_follower(method: &str) -> bool {
    if crate::router::relay::reads_saved_image(method) {
        return true;
    }
    use methods::auth::{AuthRefresh, Authenticate};
    use methods::events::{Replay, Subscribe, Unsubscribe};
    use methods::session::{Connect, Disconnect};
    [
        Connect::NAME,
        Authenticate::NAME,
        AuthRefresh::NAME,
        Disconnect::NAME,
        Subscribe::NAME,
        Unsubscribe::NAME,
        Replay::NAME,
    ]
    .contains(&method)
}

/// Encodes a result as a [`Reply`].
fn reply<R: serde::Serialize>(
    result: &R,
    after: fn(&R) -> AfterReply,
    commit: Option<u64>,
) -> Result<Reply, ErrorObject> {
    let json = serde_json::to_string(result)
        .map_err(|e| ErrorObject::internal(format!("cannot encode result: {e}")))?;
    Ok(Reply {
        result: json,
        after: after(result),
        commit,
    })
}

/// Whether a method needs a session: all but `map/connect` and `map/authenticate`.
fn needs_session(method: &str) -> bool {
    method != methods::session::Connect::NAME && method != methods::auth::Authenticate::NAME
}

/// Wraps a typed router handler as a table entry: decode params, run on the router task
/// (after the capability check), encode the result with the log position to be committed.
fn typed_handler<M: Method>(
    f: HandlerFn<M>,
    after: fn(&M::Result) -> AfterReply,
    needs_session: bool,
) -> Handler {
    Box::new(move |router, conn, params| {
        let declared = declared(params);
        let params: M::Params = decode_params(params)?;
        let router = router.clone();
        Ok(Box::pin(async move {
            let (result, commit) = router
                .call_deferred(
                    conn,
                    M::CAPABILITY,
                    needs_session,
                    declared,
                    move |r, ctx| f(r, ctx, params),
                )
                .await
                .map_err(ErrorObject::from)?;
            reply(&result, after, commit)
        }))
    })
}

/// Wraps a router handler that may need kept items loaded (see [`Dispatcher::add_paged`]).
fn paged_handler<M: Method>(f: HandlerFn<M>, after: fn(&M::Result) -> AfterReply) -> Handler
where
    M::Params: Clone + std::marker::Send + Sync + 'static,
{
    Box::new(move |router, conn, params| {
        let declared = declared(params);
        let params: M::Params = decode_params(params)?;
        let router = router.clone();
        Ok(Box::pin(async move {
            let (result, commit) = crate::router::kept::ops::paged(
                &router,
                conn,
                M::CAPABILITY,
                declared,
                move |r, ctx| f(r, ctx, params.clone()),
            )
            .await
            .map_err(ErrorObject::from)?;
            reply(&result, after, commit)
        }))
    })
}

/// What a call declares in `params._meta`: the event ids it names as its causes
/// (`causedBy`, at most 16) and its trace context (`traceparent`, `tracestate`). Malformed
/// entries are ignored: both are advisory metadata, never a reason to refuse a call.
pub(crate) fn declared(params: Option<&RawValue>) -> Declared {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(default, rename = "causedBy")]
        caused_by: Vec<serde_json::Value>,
        #[serde(default)]
        traceparent: Option<serde_json::Value>,
        #[serde(default)]
        tracestate: Option<serde_json::Value>,
    }
    #[derive(serde::Deserialize)]
    struct WithMeta {
        #[serde(default, rename = "_meta")]
        meta: Option<Meta>,
        #[serde(default, rename = "relayTraceparent")]
        relay: Option<serde_json::Value>,
    }
    let Some(raw) = params else {
        return Declared::default();
    };
    let text = raw.get();
    if !text.contains("_meta") && !text.contains("relayTraceparent") {
        return Declared::default();
    }
    let Ok(with) = serde_json::from_str::<WithMeta>(text) else {
        return Declared::default();
    };
    // Any value counts as sent: a client's is refused whatever it holds.
    let relay = with
        .relay
        .map(|v| v.as_str().map_or_else(String::new, str::to_owned));
    let Some(m) = with.meta else {
        return Declared {
            relay,
            ..Declared::default()
        };
    };
    Declared {
        relay,
        causes: m
            .caused_by
            .iter()
            .filter_map(|v| v.as_str().and_then(crate::protocol::ids::EventId::parse))
            .take(16)
            .collect(),
        trace: m
            .traceparent
            .as_ref()
            .and_then(|v| v.as_str())
            .and_then(|p| TraceContext::new(p, m.tracestate.as_ref().and_then(|v| v.as_str()))),
    }
}

/// The trace context a request carries (`router::traces::call_context`).
pub(crate) fn trace_of_params(params: Option<&RawValue>) -> Option<TraceContext> {
    crate::router::traces::call_context(params)
}

/// Decodes params; absent params decode from `{}`.
pub(crate) fn decode_params<P: serde::de::DeserializeOwned>(
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

    #[test]
    fn a_relay_traceparent_is_declared_whatever_it_holds() {
        let raw = |s: &str| RawValue::from_string(s.to_owned()).unwrap();
        let p = raw(
            r#"{"to":{"agent":"a"},"relayTraceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#,
        );
        assert_eq!(
            declared(Some(&p)).relay.as_deref(),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        let p = raw(
            r#"{"relayTraceparent":7,"_meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}"#,
        );
        let d = declared(Some(&p));
        assert_eq!(d.relay.as_deref(), Some(""));
        assert!(d.trace.is_some());
        assert!(declared(Some(&raw(r#"{"to":"a"}"#))).relay.is_none());
    }
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
        d.add::<methods::session::Connect>(Answer::AfterCommit, Router::handle_connect, nothing);
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
