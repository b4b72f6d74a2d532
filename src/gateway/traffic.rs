//! [`Traffic`]: what the gateways' HTTP routes were asked, per gateway, for `/metrics` and the
//! dashboard's system view (docs/metrics.md, "Gateways"): requests by outcome, and how many
//! distinct callers called within the last [`CALLER_WINDOW`].
//!
//! Owns the per-gateway counts and the recent callers' table. Fed by the one gate every gateway
//! route passes (`guard::gate`), so a new route is counted without asking; read at each scrape.
//! Bounded: at most [`MAX_CALLERS`] callers remembered per gateway (past that, callers older
//! than the window are forgotten first, and a new one is counted once room is back).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::gateway::caller::CallerKey;

/// How far back "callers" looks.
pub const CALLER_WINDOW: Duration = Duration::from_secs(600);
/// Callers remembered per gateway.
pub const MAX_CALLERS: usize = 10_000;

/// How a gateway request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted and answered below 400.
    Ok,
    /// Refused by the gate: credential, rate, content type, size or deadline.
    Refused,
    /// Admitted, and answered with an HTTP status of 400 or more.
    Error,
}

#[derive(Debug, Default)]
struct Counts {
    ok: u64,
    refused: u64,
    error: u64,
    callers: HashMap<CallerKey, Instant>,
}

/// The gateways' request counts (module docs). Shared as an `Arc` by the gates.
#[derive(Debug, Default)]
pub struct Traffic {
    by_gateway: Mutex<BTreeMap<&'static str, Counts>>,
}

/// The gateway a route group belongs to: the group's first word (`a2a rpc` → `a2a`).
pub fn gateway_of(group: &'static str) -> &'static str {
    group.split(' ').next().unwrap_or(group)
}

impl Traffic {
    /// One request to `gateway` from `caller` (none: unknown, e.g. refused before it was
    /// known) that ended with `outcome`.
    pub fn observe(&self, gateway: &'static str, caller: Option<&CallerKey>, outcome: Outcome) {
        let now = Instant::now();
        let mut all = self.by_gateway.lock().unwrap_or_else(|p| p.into_inner());
        let c = all.entry(gateway).or_default();
        match outcome {
            Outcome::Ok => c.ok += 1,
            Outcome::Refused => c.refused += 1,
            Outcome::Error => c.error += 1,
        }
        let Some(key) = caller else { return };
        if let Some(seen) = c.callers.get_mut(key) {
            *seen = now;
            return;
        }
        if c.callers.len() >= MAX_CALLERS {
            c.callers
                .retain(|_, t| now.duration_since(*t) < CALLER_WINDOW);
        }
        if c.callers.len() < MAX_CALLERS {
            c.callers.insert(key.clone(), now);
        }
    }

    /// `(gateway, ok, refused, error, callers within the window)`, by gateway name.
    pub fn snapshot(&self) -> Vec<(&'static str, u64, u64, u64, usize)> {
        let now = Instant::now();
        let mut all = self.by_gateway.lock().unwrap_or_else(|p| p.into_inner());
        all.iter_mut()
            .map(|(g, c)| {
                c.callers
                    .retain(|_, t| now.duration_since(*t) < CALLER_WINDOW);
                (*g, c.ok, c.refused, c.error, c.callers.len())
            })
            .collect()
    }

    /// The families `map_gateway_requests_total{gateway, outcome}` and
    /// `map_gateway_callers{gateway}`, in OpenMetrics text (nothing before the first request).
    pub fn render(&self) -> String {
        let rows = self.snapshot();
        if rows.is_empty() {
            return String::new();
        }
        let mut out = String::from(
            "# TYPE map_gateway_requests counter\n\
             # HELP map_gateway_requests HTTP requests to a gateway's routes, by how they ended: ok, refused by the gate (credential, rate, content type, size, deadline), error (answered 400 or more)\n",
        );
        for (g, ok, refused, error, _) in &rows {
            for (outcome, n) in [("ok", ok), ("refused", refused), ("error", error)] {
                let _ = writeln!(
                    out,
                    "map_gateway_requests_total{{gateway=\"{g}\",outcome=\"{outcome}\"}} {n}"
                );
            }
        }
        out.push_str(
            "# TYPE map_gateway_callers gauge\n\
             # HELP map_gateway_callers Distinct callers (principals, or addresses without one) of a gateway within the last 10 minutes\n",
        );
        for (g, _, _, _, callers) in &rows {
            let _ = writeln!(out, "map_gateway_callers{{gateway=\"{g}\"}} {callers}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_outcome_and_distinct_callers() {
        let t = Traffic::default();
        let alice = CallerKey::Principal("alice".into(), None);
        let bob = CallerKey::Principal("bob".into(), None);
        t.observe("a2a", Some(&alice), Outcome::Ok);
        t.observe("a2a", Some(&alice), Outcome::Error);
        t.observe("a2a", Some(&bob), Outcome::Ok);
        t.observe("a2a", None, Outcome::Refused);
        t.observe("mamp", Some(&bob), Outcome::Refused);
        assert_eq!(
            t.snapshot(),
            vec![("a2a", 2, 1, 1, 2), ("mamp", 0, 1, 0, 1)]
        );
        let text = t.render();
        assert!(text.contains("map_gateway_requests_total{gateway=\"a2a\",outcome=\"ok\"} 2\n"));
        assert!(text.contains("map_gateway_callers{gateway=\"mamp\"} 1\n"));
        assert_eq!(gateway_of("a2a rpc"), "a2a");
        assert_eq!(gateway_of("im"), "im");
    }

    #[test]
    fn callers_are_bounded() {
        let t = Traffic::default();
        for i in 0..(MAX_CALLERS + 50) {
            let ip = std::net::IpAddr::from([10, (i >> 16) as u8, (i >> 8) as u8, i as u8]);
            t.observe("im", Some(&CallerKey::Ip(ip)), Outcome::Ok);
        }
        let (_, ok, _, _, callers) = t.snapshot()[0];
        assert_eq!(ok, (MAX_CALLERS + 50) as u64);
        assert_eq!(callers, MAX_CALLERS);
    }
}
