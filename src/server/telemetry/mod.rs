//! Traces out (docs/traces.md): the router's spans ([`crate::router::traces`]) exported over
//! OTLP/HTTP to the operator's collector (Phoenix, Jaeger, Langfuse, Tempo ...).
//!
//! Owns: reading `[telemetry]` and the `OTEL_*` environment ([`config`]), and the exporter
//! ([`export`]: the bounded queue, the export task, the counts). [`tap`] puts them together
//! for a router that writes the log (a single node, or a cluster's live node).

pub mod config;
pub mod export;

use std::sync::Arc;

pub use crate::metrics::TelemetryCounts as Counts;
pub use config::TelemetrySettings;

use crate::router::traces::Tap;

/// The router's tap when traces are exported (`None`: off), and the exporter's counts.
///
/// # Errors
/// A setting that cannot be used, named.
pub fn tap(
    settings: &TelemetrySettings,
    node: Option<&str>,
    counts: Arc<Counts>,
) -> Result<Option<Tap>, String> {
    let Some(resolved) = settings.resolve(&|k| std::env::var(k).ok())? else {
        return Ok(None);
    };
    let exporter = export::Exporter::start(&resolved, node, counts)?;
    Ok(Some(Tap::new(resolved.model.clone(), exporter)))
}
