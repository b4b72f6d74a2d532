//! [`Need`]: a kept item an operation needs in memory and does not have, so that the operation
//! can say so (`RouterError::NeedsLoad`) and be run again once it is loaded.

/// A kept item to load from the store (or the in-memory tables) before an operation runs
/// again.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Need {
    /// A task, by id.
    Task(String),
    /// A checkpoint, by id.
    Checkpoint(String),
    /// A conversation, by id, with its threads and counts.
    Conversation(String),
    /// A turn, by id (where it is: its conversation and position).
    Turn(String),
    /// What a quota owner has created.
    Counts(String),
}
