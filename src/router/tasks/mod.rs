//! The tasks extension (`map/tasks/create|assign|update|get|list`): a task board shared by the
//! participants, and what the A2A gateway stores A2A tasks as. It owns the task table
//! ([`table::Tasks`]); its handlers are in [`ops`].
//!
//! - Every change is one or two `task.*` events (`task.created`, `task.assigned`,
//!   `task.status` then `task.completed`, or `task.updated`), each carrying the whole task
//!   after the change, so that any one of them is enough to know the task.
//! - Visibility: an assigned task is seen by whoever may see its assignee agent (its events
//!   have that agent's audience); an unassigned task by every participant that may list tasks.
//!   Its creator always sees it through `map/tasks/get` and `map/tasks/list`.
//!   A gateway's record in its `meta` (a `RouterConfig::reserved_task_meta` member: the A2A
//!   gateway's `meta.a2a`, with the caller's messages) and `meta.result` follow the messages
//!   they copy instead: whoever may read the `message_sent` events of the record's `gateway`
//!   agent, and the parties (system, the creator, the assignee's owner); others get the task
//!   without them, and no event that carries them (`ops::Router::task_event_audience`).
//! - Who may change a task: system participants, its creator, and the owner of its assignee;
//!   anyone may assign an unassigned task to an agent of their own (claim it).
//! - Tasks are durable with the log: the store keeps the row of each task's newest event in a
//!   table retention never trims, and the table is rebuilt from it at start.

pub mod ops;
pub mod table;
