//! The mail extension (`mail/*`, and `meta.mail` on `map/send`): conversations that outlive a
//! connection. It owns what the router holds of them ([`table::Mailboxes`]: a bounded cache of
//! conversation records and of where turns are); the store keeps every conversation, turn and
//! thread. Its handlers are in [`ops`] (changes and checks, one router step each) and
//! [`reads`] (reads of many rows, paged from the store); [`access`] holds what both share.
//!
//! - A mail participant id is an agent id (a session speaking as an agent) or a MAP participant
//!   id (a session without one). A session takes part in a conversation through its agent, its
//!   participant id, or any agent it owns.
//! - Who sees a conversation: its participants (those that left too) and system participants.
//!   Who reads it (`mail/get`, `list`, `turns/list`, `summary`, `replay`): those, and every
//!   session of a principal in `auth.system_principals`, whatever its participant type (an
//!   operator's dashboard is a `client`), which changes only what it takes part in. To anyone else it does not exist (`10000`). Every `mail.*` event has that audience: the
//!   owners of its participants' agents; a turn's visibility narrows its event further.
//! - A `map/send` with `meta.mail {conversationId}` is routed as usual and recorded as a turn
//!   (`source: intercepted`); agents it reached that were not in the conversation join it.
//! - Durable with the log: the store keeps the newest event of each conversation (which
//!   carries the conversation and all its participants), every turn and every thread in tables
//!   retention never trims; the router loads a conversation's record from them when it needs
//!   it, and reads turns from them a page at a time.

pub mod access;
pub mod ops;
pub mod reads;
pub mod table;
