//! The load generators' clock and latency histograms (`benches/load.rs`, `benches/nats.rs`):
//! a send timestamp written into each payload as `"bts":<µs>`, read back on receipt, and HDR
//! histograms of the difference reported as `{p50, p99, max, count}` in milliseconds.

use std::sync::OnceLock;
use std::time::Instant;

use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// Largest latency the histograms hold (60 s, in µs); larger values are clamped.
pub const MAX_LATENCY_US: u64 = 60_000_000;

/// Microseconds since the generator started: the clock of the payload timestamps.
pub fn now_us() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// An empty histogram of microseconds, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

/// Records one latency in µs (clamped to the histogram's bounds).
pub fn record(h: &mut Histogram<u64>, us: u64) {
    h.saturating_record(us.clamp(1, MAX_LATENCY_US));
}

/// `{p50, p99, max}` in milliseconds (null when empty).
pub fn percentiles(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return Value::Null;
    }
    let ms = |us: u64| (us as f64 / 1000.0 * 1000.0).round() / 1000.0;
    json!({
        "p50": ms(h.value_at_quantile(0.5)),
        "p99": ms(h.value_at_quantile(0.99)),
        "max": ms(h.max()),
        "count": h.len(),
    })
}

/// The `"bts":<µs>` number in a frame, without parsing the frame.
pub fn send_timestamp(text: &str) -> Option<u64> {
    let at = text.find("\"bts\":")? + 6;
    let digits = text[at..].bytes().take_while(u8::is_ascii_digit).count();
    text[at..at + digits].parse().ok()
}

/// What one receiving connection saw: how many deliveries, their latencies, when the last came.
pub struct Arrivals {
    pub count: u64,
    pub latency: Histogram<u64>,
    pub last: Option<Instant>,
}

impl Arrivals {
    pub fn new() -> Self {
        Self {
            count: 0,
            latency: histogram(),
            last: None,
        }
    }

    /// Counts one delivery, and its latency when it carries a send timestamp.
    pub fn saw(&mut self, text: &str) {
        let now = now_us();
        self.count += 1;
        self.last = Some(Instant::now());
        if let Some(sent) = send_timestamp(text) {
            record(&mut self.latency, now.saturating_sub(sent));
        }
    }
}
