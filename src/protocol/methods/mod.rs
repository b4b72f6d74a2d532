//! One type per MAP method, each naming its wire string, params and result.
//!
//! Method-name strings live here and nowhere else. Params types are lenient (unknown fields are
//! ignored, `params` may be absent); result types are the union shapes chosen in
//! `docs/compatibility.md`, so SDK clients, the schema and both reference servers' callers find
//! the fields they read.

pub mod agents;
pub mod auth;
pub mod events;
pub mod federation;
pub mod identities;
pub mod mail;
pub mod messaging;
pub mod method;
pub mod permissions;
pub mod scopes;
pub mod session;
pub mod steering;
pub mod tasks;
pub mod traces;
pub mod trajectory;

pub use method::Method;

/// Notification method names.
pub mod notifications {
    /// Server → client: an event on a subscription.
    pub const EVENT: &str = "map/event";
    /// Server → agent connection: a delivered message.
    pub const MESSAGE: &str = "map/message";
    /// Client → server: cumulative ack of a subscription's events.
    pub const SUBSCRIBE_ACK: &str = "map/subscribe.ack";
    /// Server → client: the session's credential expires soon; refresh it.
    pub const AUTH_EXPIRING: &str = "map/auth/expiring";
}

/// Calls `visit` once per method with its name and the schema-bearing types. Used to generate
/// `schema/` and to test that every method is dispatched.
pub fn for_each_method<V: MethodVisitor>(visit: &mut V) {
    use agents::*;
    use events::*;
    use messaging::*;
    use scopes::*;
    use session::*;
    visit.visit::<Connect>();
    visit.visit::<Disconnect>();
    visit.visit::<SessionList>();
    visit.visit::<SessionLoad>();
    visit.visit::<SessionClose>();
    visit.visit::<auth::Authenticate>();
    visit.visit::<auth::AuthRefresh>();
    visit.visit::<Send>();
    visit.visit::<Subscribe>();
    visit.visit::<Unsubscribe>();
    visit.visit::<Replay>();
    visit.visit::<AgentsList>();
    visit.visit::<AgentsGet>();
    visit.visit::<AgentsRegister>();
    visit.visit::<AgentsSpawn>();
    visit.visit::<AgentsUnregister>();
    visit.visit::<AgentsUpdate>();
    visit.visit::<AgentsStop>();
    visit.visit::<AgentsSuspend>();
    visit.visit::<AgentsResume>();
    visit.visit::<StructureGraph>();
    visit.visit::<ScopesList>();
    visit.visit::<ScopesGet>();
    visit.visit::<ScopesCreate>();
    visit.visit::<ScopesDelete>();
    visit.visit::<ScopesJoin>();
    visit.visit::<ScopesLeave>();
    visit.visit::<ScopesMembers>();
    visit.visit::<steering::Inject>();
    visit.visit::<permissions::PermissionsUpdate>();
    visit.visit::<identities::IdentityRelease>();
    visit.visit::<trajectory::TrajectoryCheckpoint>();
    visit.visit::<trajectory::TrajectoryList>();
    visit.visit::<trajectory::TrajectoryGet>();
    visit.visit::<trajectory::TrajectoryContent>();
    visit.visit::<tasks::TasksCreate>();
    visit.visit::<tasks::TasksAssign>();
    visit.visit::<tasks::TasksUpdate>();
    visit.visit::<tasks::TasksGet>();
    visit.visit::<tasks::TasksList>();
    visit.visit::<mail::MailCreate>();
    visit.visit::<mail::MailGet>();
    visit.visit::<mail::MailList>();
    visit.visit::<mail::MailClose>();
    visit.visit::<mail::MailJoin>();
    visit.visit::<mail::MailLeave>();
    visit.visit::<mail::MailInvite>();
    visit.visit::<mail::MailTurn>();
    visit.visit::<mail::MailTurnsList>();
    visit.visit::<mail::MailThreadCreate>();
    visit.visit::<mail::MailThreadList>();
    visit.visit::<mail::MailSummary>();
    visit.visit::<mail::MailReplay>();
    visit.visit::<traces::TracesGet>();
    visit.visit::<federation::FederationConnect>();
    visit.visit::<federation::FederationRoute>();
    visit.visit::<federation::FederationAgents>();
    visit.visit::<federation::FederationOutboundNext>();
    visit.visit::<federation::FederationOutboundAck>();
    visit.visit::<federation::FederationOutboundAgents>();
}

/// Receives each method type from [`for_each_method`].
pub trait MethodVisitor {
    /// Called once per method.
    fn visit<M: Method>(&mut self);
}
