//! Bytes → NDJSON lines → frame-level checks → JSON-RPC classification
//! (`map_router::fuzzing::check_decode`). The first byte picks the chunk size the decoder is
//! fed in; the whole input is decoded both in one piece and in chunks, which must agree.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let chunk = data.first().map_or(1, |b| usize::from(b % 64) + 1);
    if let Err(e) = map_router::fuzzing::check_decode(data, chunk) {
        panic!("{e}");
    }
});
