//! Raw bytes through a real in-process router session (`map_router::fuzzing::DispatchHarness`):
//! the input is split into NDJSON lines, sent on one connection (after a `map/connect` unless
//! the first byte is odd), and the transcript must keep its invariants: one response per
//! request id, in order, or a close with a reason; documented error codes only. A fresh router
//! per input, so a finding replays from the input alone; a run over 10 s panics.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use map_router::fuzzing::DispatchHarness;

static HARNESS: OnceLock<DispatchHarness> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let harness = HARNESS.get_or_init(DispatchHarness::new);
    let (connect, rest) = match data.split_first() {
        Some((flags, rest)) => (flags & 1 == 0, rest),
        None => (true, data),
    };
    let transcript = harness.run_bytes(rest, connect);
    if let Err(e) = transcript.check() {
        panic!("{e}\nreceived: {:#?}", transcript.received);
    }
});
