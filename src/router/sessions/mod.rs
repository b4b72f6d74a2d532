//! Connections and sessions: the tables ([`table`]), connect / resume / disconnect / transport
//! loss / expiry ([`ops`]), admission and authentication ([`auth`]), and what a restart does to
//! the previous run's participants ([`recovery`]), and the sessions extension (list, load,
//! close: [`manage`]).

pub mod auth;
pub mod lifecycle;
pub mod manage;
pub mod ops;
pub mod recovery;
pub mod table;
