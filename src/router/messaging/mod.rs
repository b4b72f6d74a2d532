//! Messages: `map/send` with every address form, delivery, offline queues and the correlation
//! of replies ([`ops`]; what they keep between calls: [`state`]; which recipients an address
//! names: [`resolve`], a pure function over read-only views), and steering (`map/inject`,
//! [`steering`]).

pub mod ops;
pub mod recovery;
pub mod resolve;
pub mod state;
pub mod steering;
