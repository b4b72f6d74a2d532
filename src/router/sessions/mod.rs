//! Connections and sessions: the tables ([`table`]), connect / resume / disconnect / transport
//! loss / expiry ([`ops`]), admission and authentication ([`auth`]), and what a restart does to
//! the previous run's participants ([`recovery`]).

pub mod auth;
pub mod ops;
pub mod recovery;
pub mod table;
