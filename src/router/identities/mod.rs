//! The identities part: who owns which participant id and agent id (the principal that first
//! took it), so that no other principal takes it over, and which ids are reserved for the
//! router's own services. Tables in [`table`], decisions and handlers in [`ops`].

pub mod ops;
pub mod table;
