//! Bytes → `SubscriptionFilter` (serde, as `map/subscribe` reads it) → compiled filter →
//! matched against one sample event of every type (`map_router::fuzzing::check_filter`):
//! refusals are `-32602` only, match-all filters match everything, both event-type spellings
//! agree, and dropping a field never matches fewer events.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = map_router::fuzzing::check_filter(data) {
        panic!("{e}");
    }
});
