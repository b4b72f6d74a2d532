//! Transports: framing and connection loops. A transport knows bytes, not routing.
//!
//! Every transport adapts its medium to the frames of [`connection`] and runs the same
//! [`connection::serve_connection`] driver, so sessions, ordering and back-pressure behave the
//! same over each.

pub mod connection;
pub mod ws;
