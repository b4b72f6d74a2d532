//! Agents: the registry of agent records (tree, owners), the handlers that change them
//! (register, spawn, update, unregister, stop, suspend, resume, list, get, graph) and the router
//! side of supervised agents (reservations, exits, process output).

pub mod ops;
pub mod registry;
pub mod supervised;
pub mod supervision;
