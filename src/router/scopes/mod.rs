//! Scopes: the scope tree and membership ([`table`]) and their handlers ([`ops`]).

pub mod ops;
pub mod table;
