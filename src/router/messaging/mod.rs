//! Messages: `map/send` with every address form, delivery, offline queues and the correlation
//! of replies ([`ops`]; what they keep between calls: [`state`]), and steering (`map/inject`,
//! [`steering`]).

pub mod ops;
pub mod recovery;
pub mod state;
pub mod steering;
