//! The trajectory extension (`trajectory/checkpoint|list|get|content`): what each agent did,
//! step by step. It owns the checkpoint index ([`table::Trajectories`]) and the content
//! requests waiting on agents; its handlers are in [`ops`].
//!
//! - A checkpoint is reported by (the owner of) its agent, stamped with the router's clock
//!   when it has no timestamp, and published as a `trajectory.checkpoint` event whose
//!   audience is its agent's, so it is seen exactly by those who may see that agent then.
//!   The same audience decides who may list and get it later, after the agent is gone too.
//! - Checkpoints are durable with the log: the store keeps each checkpoint event's row in a
//!   table of its own that retention never trims, and the index is rebuilt from it at start.
//! - Content is the agent's: the router asks the agent's connection
//!   (`trajectory/content.request`) and relays its `trajectory/content.response`, inline or,
//!   when large, as `trajectory/content.chunk` notifications after the answer.

pub mod ops;
pub mod table;
