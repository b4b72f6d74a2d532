//! `[telemetry]` and the OpenTelemetry environment variables: where spans go, with which
//! headers, under which service name, which traces are kept and whether content is exported.
//!
//! Owns: [`TelemetrySettings`] (the file's section) and [`Resolved`] (the file's values with the
//! environment's on top, checked once at start). The environment wins, as every OpenTelemetry
//! SDK reads it: `OTEL_SDK_DISABLED`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL),
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (a base: `/v1/traces` is added), `OTEL_EXPORTER_OTLP_HEADERS`
//! and `OTEL_EXPORTER_OTLP_TRACES_HEADERS` (`k=v,k2=v2`, values percent-decoded),
//! `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`,
//! `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` / `OTEL_EXPORTER_OTLP_TIMEOUT` (ms).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::router::traces::{Sampler, Settings};

/// `[telemetry]`: traces out over OTLP/HTTP (docs/traces.md). Off unless an endpoint is set
/// here or in the environment.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetrySettings {
    /// The collector's base URL (`http://127.0.0.1:6006`): spans go to `<endpoint>/v1/traces`.
    pub endpoint: Option<String>,
    /// The full URL spans are posted to (wins over `endpoint`).
    pub traces_endpoint: Option<String>,
    /// Headers sent with every export (`Authorization` for Langfuse and LangSmith).
    pub headers: BTreeMap<String, String>,
    /// `service.name` (default `map-router`).
    pub service_name: Option<String>,
    /// More resource attributes (`deployment.environment` ...).
    pub resource_attributes: BTreeMap<String, String>,
    /// Export message payloads and injected content (off: never).
    pub capture_content: bool,
    /// Which traces are kept (`parentbased_always_on` by default).
    pub sampler: Option<String>,
    /// The sampler's ratio.
    pub sampler_arg: Option<f64>,
    /// Spans waiting for export at most; more are dropped and counted.
    pub queue: usize,
    /// Spans per export request at most.
    pub batch: usize,
    /// How long spans wait to fill a batch, in ms.
    pub delay_ms: u64,
    /// The deadline of one export request, in ms.
    pub timeout_ms: u64,
    /// How long a request's hop waits for its reply before it is ended at its delivery, in ms.
    pub reply_wait_ms: u64,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            endpoint: None,
            traces_endpoint: None,
            headers: BTreeMap::new(),
            service_name: None,
            resource_attributes: BTreeMap::new(),
            capture_content: false,
            sampler: None,
            sampler_arg: None,
            queue: 4096,
            batch: 512,
            delay_ms: 1000,
            timeout_ms: 10_000,
            reply_wait_ms: crate::router::traces::model::REPLY_WAIT_MS,
        }
    }
}

/// What the exporter runs with.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The URL spans are posted to.
    pub url: String,
    /// Export headers.
    pub headers: BTreeMap<String, String>,
    /// `service.name`.
    pub service_name: String,
    /// Other resource attributes.
    pub resource: BTreeMap<String, String>,
    /// The model's settings (content, sampler).
    pub model: Settings,
    /// Queue bound.
    pub queue: usize,
    /// Batch bound.
    pub batch: usize,
    /// Batch delay.
    pub delay: Duration,
    /// Export deadline.
    pub timeout: Duration,
}

impl TelemetrySettings {
    /// The settings with the environment (`env`) on top; `None` when traces are off.
    ///
    /// # Errors
    /// A value that cannot be used, named.
    pub fn resolve(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Resolved>, String> {
        let var = |k: &str| {
            env(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let base = |b: &str| format!("{}/v1/traces", b.trim_end_matches('/'));
        let url = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT").map(|b| base(&b)))
            .or_else(|| self.traces_endpoint.clone())
            .or_else(|| self.endpoint.as_deref().map(base));
        let Some(url) = url else {
            return Ok(None);
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "telemetry: the OTLP endpoint {url:?} is not an http:// or https:// URL"
            ));
        }
        let mut headers = self.headers.clone();
        for k in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        ] {
            if let Some(v) = var(k) {
                headers.extend(pairs(&v).map_err(|e| format!("telemetry: {k}: {e}"))?);
            }
        }
        let mut resource = self.resource_attributes.clone();
        if let Some(v) = var("OTEL_RESOURCE_ATTRIBUTES") {
            resource.extend(
                pairs(&v).map_err(|e| format!("telemetry: OTEL_RESOURCE_ATTRIBUTES: {e}"))?,
            );
        }
        let service_name = var("OTEL_SERVICE_NAME")
            .or_else(|| resource.remove("service.name"))
            .or_else(|| self.service_name.clone())
            .unwrap_or_else(|| "map-router".to_owned());
        resource.remove("service.name");
        let sampler_name = var("OTEL_TRACES_SAMPLER")
            .or_else(|| self.sampler.clone())
            .unwrap_or_else(|| "parentbased_always_on".to_owned());
        let arg = match var("OTEL_TRACES_SAMPLER_ARG") {
            Some(a) => Some(a.parse::<f64>().map_err(|_| {
                format!("telemetry: OTEL_TRACES_SAMPLER_ARG {a:?} is not a number")
            })?),
            None => self.sampler_arg,
        };
        let sampler = Sampler::parse(&sampler_name, arg).map_err(|e| format!("telemetry: {e}"))?;
        let timeout_ms = match var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
            .or_else(|| var("OTEL_EXPORTER_OTLP_TIMEOUT"))
        {
            Some(t) => t.parse::<u64>().map_err(|_| {
                format!("telemetry: the export timeout {t:?} is not a number of ms")
            })?,
            None => self.timeout_ms,
        };
        if self.queue == 0 || self.batch == 0 {
            return Err("telemetry: queue and batch must be at least 1".into());
        }
        Ok(Some(Resolved {
            url,
            headers,
            service_name,
            resource,
            model: Settings {
                reply_wait_ms: self.reply_wait_ms,
                capture_content: self.capture_content,
                sampler,
            },
            queue: self.queue,
            batch: self.batch.min(self.queue),
            delay: Duration::from_millis(self.delay_ms.max(1)),
            timeout: Duration::from_millis(timeout_ms.clamp(1, 600_000)),
        }))
    }
}

/// `k=v,k2=v2` (W3C Baggage-like, as the OpenTelemetry variables write them): keys and values
/// trimmed, values percent-decoded.
fn pairs(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| format!("{p:?} is not key=value"))?;
            let k = k.trim();
            if k.is_empty() {
                return Err(format!("{p:?} has no key"));
            }
            Ok((k.to_owned(), percent_decode(v.trim())?))
        })
        .collect()
}

fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape in {s:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once decoded"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn off_without_an_endpoint_and_with_sdk_disabled() {
        let s = TelemetrySettings::default();
        assert!(s.resolve(&env(&[])).unwrap().is_none());
        let s = TelemetrySettings {
            endpoint: Some("http://127.0.0.1:4318".into()),
            ..Default::default()
        };
        assert!(s
            .resolve(&env(&[("OTEL_SDK_DISABLED", "true")]))
            .unwrap()
            .is_none());
        assert_eq!(
            s.resolve(&env(&[])).unwrap().unwrap().url,
            "http://127.0.0.1:4318/v1/traces"
        );
    }

    #[test]
    fn the_environment_wins_over_the_file() {
        let s = TelemetrySettings {
            endpoint: Some("http://file:4318/".into()),
            service_name: Some("from-file".into()),
            headers: [("a".to_owned(), "1".to_owned())].into(),
            ..Default::default()
        };
        let r = s
            .resolve(&env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "Authorization=Basic%20cGs6c2s=, b = 2",
                ),
                ("OTEL_SERVICE_NAME", "from-env"),
                ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test"),
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ]))
            .unwrap()
            .unwrap();
        assert_eq!(r.url, "http://env:4318/v1/traces");
        assert_eq!(r.headers["Authorization"], "Basic cGs6c2s=");
        assert_eq!(r.headers["a"], "1");
        assert_eq!(r.headers["b"], "2");
        assert_eq!(r.service_name, "from-env");
        assert_eq!(r.resource["deployment.environment"], "test");
        assert_eq!(r.model.sampler, Sampler::Ratio(0.25));
        let r = s
            .resolve(&env(&[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://x/api/public/otel/v1/traces",
            )]))
            .unwrap()
            .unwrap();
        assert_eq!(r.url, "https://x/api/public/otel/v1/traces");
        assert_eq!(r.service_name, "from-file");
    }

    #[test]
    fn bad_values_are_named() {
        let s = TelemetrySettings {
            endpoint: Some("http://127.0.0.1:4318".into()),
            ..Default::default()
        };
        for (k, v, says) in [
            ("OTEL_TRACES_SAMPLER", "sometimes", "unknown sampler"),
            ("OTEL_TRACES_SAMPLER_ARG", "lots", "not a number"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "novalue", "not key=value"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://x", "not an http"),
        ] {
            let e = s.resolve(&env(&[(k, v)])).unwrap_err();
            assert!(e.contains(says), "{k}={v}: {e}");
        }
    }
}
