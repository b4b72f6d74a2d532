//! The SQLite event store (being built).
