//! The router core: the one owner of all routing state. It opens no sockets, launches no
//! process and reads no configuration file; transports, the process supervisor and the server
//! sit above it (docs/architecture.md draws the layers).
//!
//! One task owns the state ([`core::Router`]); everyone else holds a [`handle::RouterHandle`].
//! The state is split into owned parts, each a folder or a file with its own tables, invariants
//! and a small API keyed by id newtypes, and each with its handlers (`ops.rs`: `impl Router`
//! blocks that coordinate a call across parts, in one direction):
//!
//! - [`sessions`]: connections and sessions (connect, resume, disconnect, authentication,
//!   credential expiry, recovery after a restart);
//! - [`agents`]: the agent registry (register, spawn, update, lifecycle) and supervised agents;
//! - [`scopes`]: the scope tree and membership;
//! - [`messaging`]: `map/send`, address resolution, offline queues, correlation, steering;
//! - [`events`]: the append-only log, subscriptions with a cursor each, filters, replay;
//! - [`trajectory`]: the trajectory extension's checkpoints and content requests;
//! - [`tasks`]: the tasks extension's task board;
//! - [`mail`]: the mail extension's conversations, turns and threads;
//! - [`handover`]: in cluster mode, the saved records of sessions, agents and scopes, which the
//!   node that takes the log over restores;
//! - [`kept`]: how the tasks, checkpoints, conversations and turns (kept by the store for good)
//!   are paged into bounded caches, and the loads in flight;
//! - [`traces`]: the span model (every hop between agents as a span, from logged events) and,
//!   when traces are exported, the tap that runs it on each event;
//! - [`federation`]: the connected inbound peer links (which session speaks for which peer
//!   system) and routed envelopes delivered here;
//! - [`permissions`]: every permission decision, as pure functions.
//!
//! A new extension (tasks, mail, trajectory) is one more such part: a folder with its state and
//! its handlers, a field of `Router`, and its methods registered in [`dispatch`].
//!
//! Around them: [`dispatch`] (the method table: name → handler, and when each answer may be
//! sent relative to the store's commit), [`rpc`] (one connection's JSON-RPC session),
//! [`pipeline`] (answers waiting for commits, in order), [`metrics`] (running counts and the
//! scrape-time snapshot of everything above), [`outbox`] (bounded queues to
//! writers), [`rate`] and [`quotas`] (limits), [`error`] (the one mapping to wire errors).

pub mod agents;
pub mod caller;
pub mod changes;
pub mod config;
pub mod core;
pub mod dispatch;
pub mod error;
pub mod events;
pub mod federation;
pub mod handle;
pub mod handover;
pub mod identities;
pub mod ids;
pub mod kept;
pub mod mail;
pub mod messaging;
pub mod metrics;
pub mod outbox;
pub mod page;
pub mod permissions;
pub mod pipeline;
pub mod quota_checks;
pub mod quotas;
pub mod rate;
pub mod relay;
pub mod reply;
pub mod rpc;
pub mod scopes;
pub mod sessions;
pub mod tasks;
pub mod timers;
pub mod traces;
pub mod trajectory;
pub mod views;

pub use self::caller::{Caller, Ctx};
pub use self::config::{
    Durability, RouterConfig, DEFAULT_COMMAND_QUEUE, DEFAULT_COMMIT_TIMEOUT, DEFAULT_LOG_BYTES,
    DEFAULT_LOG_EVENTS, DEFAULT_MAX_UNCOMMITTED, DEFAULT_OUTBOX_FRAMES, DEFAULT_PENDING_MESSAGES,
    DEFAULT_RESUME_WINDOW,
};
pub use self::core::{Command, Op, Router, RouterParts, RouterStats, TableSizes};
pub use self::error::RouterError;
pub use self::handle::RouterHandle;
pub use self::ids::ConnId;
