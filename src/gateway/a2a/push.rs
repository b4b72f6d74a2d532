//! Push notifications: webhooks an A2A caller registers for a task, POSTed on every change of
//! the task.
//!
//! Owns: the configs (task id → webhooks, in memory: they do not survive a restart, since a
//! MAP task's `meta` is visible to every observer of the task and a webhook's token must not be;
//! each config remembers the principal that set it, whose secrets they are; at most
//! [`MAX_CONFIGS_PER_TASK`] per task and `[a2a] max_push_configs_per_principal` per principal),
//! the URL allow-list (`[a2a] push_allow`, matched on normalised URLs by `gateway::egress`; empty =
//! push notifications off), and delivery: one POST per update and webhook, in update order per
//! task (one queue and worker per task with webhooks; a queue holds at most the task's
//! updates), with [`ATTEMPTS`] tries and a doubling backoff, each bounded by [`TIMEOUT`]. A
//! POST goes to the URL as normalised (what was checked is what is sent), through the gateways'
//! one outbound client (`gateway::egress::client`: the host's addresses judged, a judged one
//! connected to; `https://` over rustls; the status read, the body not).
//!
//! The body is what `@a2a-js/sdk`'s default sender POSTs: for a config made with a v1.0 method,
//! the update as a v1.0 `StreamResponse` (`{statusUpdate}` / `{artifactUpdate}`,
//! `Content-Type: application/a2a+json`); for a v0.3 one, the whole task (`kind: "task"`,
//! `application/json`). Trace context: `traceparent` / `tracestate` of the request that set
//! the config (the send that carried it, or the config method), when it had valid ones.
//! Authentication: `Authorization: <scheme> <credentials>` when the config
//! has `authentication`, else `X-A2A-Notification-Token: <token>` when it has a token.
//!
//! Secrets: a config's `token` and `authentication.credentials` are shown only to the principal
//! that set it ([`PushConfig::to_json`] with `secrets: false` leaves them out); only that
//! principal, or a system principal, replaces or deletes it. Who may reach a task's configs at
//! all is `access.rs`'s rule (the principals that control the task).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::Method;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::gateway::a2a::error::A2aError;
use crate::gateway::a2a::limits::MAX_PUSH_SECRET_BYTES;
use crate::gateway::a2a::record::{Owner, Snapshot};
use crate::gateway::a2a::wire::{self, Rendered, Update, Version};
use crate::gateway::egress::client::{self, Body, ClientError, Waits};
use crate::gateway::egress::{self, AllowList, Allowed};
use crate::protocol::trace::TraceContext;

/// Tries per notification and webhook.
pub const ATTEMPTS: u32 = 4;
/// The wait before the second try; doubled before each next one.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// Connecting, sending and reading the status of one try.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// Webhooks per task.
pub const MAX_CONFIGS_PER_TASK: usize = 16;

/// One webhook of a task.
#[derive(Debug, Clone, PartialEq)]
pub struct PushConfig {
    /// Its id within the task.
    pub id: String,
    /// Where to POST.
    pub url: String,
    /// Sent as `X-A2A-Notification-Token`.
    pub token: Option<String>,
    /// `(scheme, credentials)`, sent as `Authorization`.
    pub authentication: Option<(String, String)>,
    /// The version of the method that made it (decides the body).
    pub version: Version,
    /// The principal that set it (`None` with authentication off): its secrets are shown to
    /// that principal only.
    pub owner: Option<Owner>,
    /// The trace context of the request that set it (its headers, `gateway::trace`), sent as
    /// `traceparent` / `tracestate` with every notification.
    pub trace: Option<TraceContext>,
}

impl PushConfig {
    /// In `v`'s shape: v1.0 `TaskPushNotificationConfig`, v0.3
    /// `{taskId, pushNotificationConfig}`. Without `secrets`, the token and the credentials
    /// are left out (the scheme stays): what another principal than its setter is shown.
    pub fn to_json(&self, v: Version, task_id: &str, secrets: bool) -> Value {
        let token = self.token.as_ref().filter(|_| secrets);
        match v {
            Version::V1 => {
                let mut o = json!({"taskId": task_id, "id": self.id, "url": self.url});
                if let Some(t) = token {
                    o["token"] = json!(t);
                }
                if let Some((scheme, credentials)) = &self.authentication {
                    o["authentication"] = if secrets {
                        json!({"scheme": scheme, "credentials": credentials})
                    } else {
                        json!({"scheme": scheme})
                    };
                }
                o
            }
            Version::V03 => {
                let mut c = json!({"id": self.id, "url": self.url});
                if let Some(t) = token {
                    c["token"] = json!(t);
                }
                if let Some((scheme, credentials)) = &self.authentication {
                    c["authentication"] = if secrets {
                        json!({"schemes": [scheme], "credentials": credentials})
                    } else {
                        json!({"schemes": [scheme]})
                    };
                }
                json!({"taskId": task_id, "pushNotificationConfig": c})
            }
        }
    }

    /// Whether `owner` (a caller's principal; `None` with authentication off) set this config,
    /// and so may see its secrets.
    pub fn is_of(&self, owner: Option<&Owner>) -> bool {
        self.owner.as_ref() == owner
    }
}

/// A config as a caller sends it, in either version's shape.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigParams {
    /// v1.0: the task. v0.3: also `taskId`.
    #[serde(default, alias = "task_id")]
    pub task_id: Option<String>,
    /// v1.0: the config id.
    #[serde(default)]
    pub id: Option<String>,
    /// v1.0: the URL.
    #[serde(default)]
    pub url: Option<String>,
    /// v1.0: the token.
    #[serde(default)]
    pub token: Option<String>,
    /// v1.0 `{scheme, credentials}`, v0.3 `{schemes, credentials}`.
    #[serde(default)]
    pub authentication: Option<AuthParams>,
    /// v0.3: the config itself.
    #[serde(default, alias = "push_notification_config")]
    pub push_notification_config: Option<Box<ConfigParams>>,
}

/// `AuthenticationInfo` in either version's shape.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthParams {
    /// v1.0.
    #[serde(default)]
    pub scheme: Option<String>,
    /// v0.3 (the first one is used).
    #[serde(default)]
    pub schemes: Vec<String>,
    /// The credentials.
    #[serde(default)]
    pub credentials: Option<String>,
}

impl ConfigParams {
    /// The config to keep for `task_id`, set by `owner`.
    ///
    /// # Errors
    /// -32602 without a URL.
    pub fn into_config(
        self,
        version: Version,
        owner: Option<Owner>,
    ) -> Result<PushConfig, A2aError> {
        let inner = match self.push_notification_config {
            Some(c) => *c,
            None => self,
        };
        let url = inner
            .url
            .filter(|u| !u.is_empty())
            .ok_or_else(|| A2aError::invalid_params("a push notification config needs a url"))?;
        let authentication = inner.authentication.and_then(|a| {
            let scheme = a.scheme.or_else(|| a.schemes.into_iter().next())?;
            Some((scheme, a.credentials?))
        });
        Ok(PushConfig {
            id: inner
                .id
                .filter(|i| !i.is_empty())
                .unwrap_or_else(|| crate::protocol::ids::Ulid::random().to_string()),
            url,
            token: inner.token.filter(|t| !t.is_empty()),
            authentication,
            version,
            owner,
            trace: None,
        })
    }
}

/// The webhooks of every task, and their delivery.
#[derive(Debug, Default)]
pub struct Push {
    allow: AllowList,
    /// Configs one principal may hold (over all tasks; the anonymous caller is one).
    per_principal: usize,
    // NB: std mutexes, never held across an await.
    configs: Mutex<HashMap<String, Vec<PushConfig>>>,
    /// Per task with webhooks: the queue of its changes, read by one worker.
    queues: Mutex<HashMap<String, mpsc::UnboundedSender<Snapshot>>>,
}

impl Push {
    /// Push notifications to URLs `allow` allows (none: off), at most `per_principal` configs
    /// per principal.
    pub fn new(allow: AllowList, per_principal: usize) -> Self {
        Self {
            allow,
            per_principal,
            ..Self::default()
        }
    }

    /// Whether push notifications are offered at all.
    pub fn enabled(&self) -> bool {
        !self.allow.is_empty()
    }

    /// Keeps `config` for `task_id` (replacing one with the same id that its principal set),
    /// its URL normalised; returns it as kept.
    ///
    /// # Errors
    /// -32003 when push notifications are off; -32602 for a URL outside the allow-list (or with
    /// userinfo, a fragment, control characters), a token or credentials over
    /// [`MAX_PUSH_SECRET_BYTES`], too many configs (of the task, or of the principal), or an id
    /// taken by a config of another principal's.
    pub fn set(&self, task_id: &str, mut config: PushConfig) -> Result<PushConfig, A2aError> {
        if !self.enabled() {
            return Err(A2aError::push_not_supported());
        }
        // NB: these go into a request head: no control characters.
        let clean = |s: &str| !s.chars().any(char::is_control);
        let headers_clean = config.token.as_deref().is_none_or(clean)
            && config
                .authentication
                .as_ref()
                .is_none_or(|(a, b)| clean(a) && clean(b) && !a.contains(' '));
        if !headers_clean {
            return Err(A2aError::invalid_params(
                "push notification token and authentication must not hold control characters",
            ));
        }
        let secrets = config.token.as_ref().map_or(0, String::len)
            + config
                .authentication
                .as_ref()
                .map_or(0, |(a, b)| a.len() + b.len());
        if secrets > MAX_PUSH_SECRET_BYTES {
            return Err(A2aError::invalid_params(format!(
                "push notification token and authentication are at most {MAX_PUSH_SECRET_BYTES} bytes"
            )));
        }
        let allowed =
            self.allow.check(&config.url).map_err(|e| {
                A2aError::invalid_params(format!(
                "push notification URL {:?} is not allowed on this router ([a2a] push_allow): {e}",
                config.url.chars().take(egress::MAX_URL_BYTES).collect::<String>()
            ))
            })?;
        config.url = allowed.as_str().to_owned();
        let mut all = self
            .configs
            .lock()
            .map_err(|_| A2aError::internal("push table poisoned"))?;
        let replaces = |c: &PushConfig| c.id == config.id && c.owner == config.owner;
        let list = all.get(task_id);
        if list.is_some_and(|l| {
            l.iter()
                .any(|c| c.id == config.id && c.owner != config.owner)
        }) {
            return Err(A2aError::invalid_params(format!(
                "push notification config {:?} of task {task_id} was set by another principal: choose another id",
                config.id
            )));
        }
        let replacing = list.is_some_and(|l| l.iter().any(replaces));
        if !replacing {
            if list.is_some_and(|l| l.len() >= MAX_CONFIGS_PER_TASK) {
                return Err(A2aError::invalid_params(format!(
                    "at most {MAX_CONFIGS_PER_TASK} push notification configs per task"
                )));
            }
            let held = all
                .values()
                .flatten()
                .filter(|c| c.owner == config.owner)
                .count();
            if held >= self.per_principal {
                return Err(A2aError::invalid_params(format!(
                    "Quota exceeded: push notification configs per principal (limit {}); delete one first",
                    self.per_principal
                )));
            }
        }
        let list = all.entry(task_id.to_owned()).or_default();
        list.retain(|c| !replaces(c));
        list.push(config.clone());
        Ok(config)
    }

    /// The configs of a task.
    pub fn list(&self, task_id: &str) -> Vec<PushConfig> {
        self.configs
            .lock()
            .ok()
            .and_then(|c| c.get(task_id).cloned())
            .unwrap_or_default()
    }

    /// Removes a config; whether it was there.
    pub fn delete(&self, task_id: &str, id: &str) -> bool {
        let Ok(mut all) = self.configs.lock() else {
            return false;
        };
        let Some(list) = all.get_mut(task_id) else {
            return false;
        };
        let before = list.len();
        list.retain(|c| c.id != id);
        let removed = list.len() != before;
        if list.is_empty() {
            all.remove(task_id);
        }
        removed
    }

    /// Drops every config of a task (one that was never created).
    pub fn forget(&self, task_id: &str) {
        if let Ok(mut c) = self.configs.lock() {
            c.remove(task_id);
        }
    }

    /// Called for every change of every task: POSTs it to the task's webhooks.
    pub fn notify(self: &Arc<Self>, snapshot: &Snapshot) {
        if self.list(&snapshot.task_id).is_empty() {
            return;
        }
        let Ok(mut queues) = self.queues.lock() else {
            return;
        };
        // NB: one queue and one worker per task, so its notifications go out in update order.
        let queue = queues.entry(snapshot.task_id.clone()).or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(Arc::clone(self).worker(snapshot.task_id.clone(), rx));
            tx
        });
        let _ = queue.send(snapshot.clone());
    }

    /// Delivers one task's notifications in order, each update once (MAP may emit two events
    /// for one update), until the task ends.
    async fn worker(self: Arc<Self>, task_id: String, mut rx: mpsc::UnboundedReceiver<Snapshot>) {
        let mut last: Option<u64> = None;
        while let Some(snapshot) = rx.recv().await {
            if last.is_some_and(|l| snapshot.seq() <= l) {
                continue;
            }
            last = Some(snapshot.seq());
            // The configs as they are now (one deleted meanwhile gets nothing more).
            for config in self.list(&task_id) {
                // Checked again as it goes out: what is sent is what passed.
                let Ok(target) = self.allow.check(&config.url) else {
                    tracing::warn!(url = %config.url, "a2a push: webhook no longer allowed");
                    continue;
                };
                let (body, content_type) = body(&config, &snapshot);
                deliver(&config, &target, &body, content_type).await;
            }
            if snapshot.record.state.is_terminal() {
                break;
            }
        }
        // NB: configs first, so a late event of this task finds none and starts no worker.
        if let Ok(mut c) = self.configs.lock() {
            c.remove(&task_id);
        }
        if let Ok(mut q) = self.queues.lock() {
            q.remove(&task_id);
        }
    }
}

fn body(config: &PushConfig, s: &Snapshot) -> (String, &'static str) {
    let view = s.record.view(&s.task_id);
    match config.version {
        Version::V1 => {
            let update = s.record.update.clone().unwrap_or_else(Update::status);
            let value = if s.record.seq == 0 {
                wire::task_result(Version::V1, &view, None)
            } else {
                wire::update_json(Version::V1, &view, &update)
            };
            (Rendered::finish(&value), "application/a2a+json")
        }
        Version::V03 => (
            Rendered::finish(&wire::task_json(Version::V03, &view, None)),
            "application/json",
        ),
    }
}

/// POSTs with retries; failures are logged, never raised (a webhook cannot fail a task).
async fn deliver(config: &PushConfig, target: &Allowed, body: &str, content_type: &'static str) {
    let mut backoff = FIRST_BACKOFF;
    for attempt in 1..=ATTEMPTS {
        match tokio::time::timeout(TIMEOUT, post(config, target, body, content_type)).await {
            Ok(Ok(status)) if (200..300).contains(&status) => return,
            Ok(Ok(status)) => {
                tracing::debug!(url = %config.url, status, attempt, "a2a push: webhook refused")
            }
            Ok(Err(e)) => {
                tracing::debug!(url = %config.url, error = %e, attempt, "a2a push: failed")
            }
            Err(_) => tracing::debug!(url = %config.url, attempt, "a2a push: timed out"),
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
    }
    tracing::warn!(url = %config.url, "a2a push: notification dropped after {ATTEMPTS} attempts");
}

/// One POST to `target` (the config's URL as the allow-list normalised it) on the gateways'
/// client, every wait bounded by [`TIMEOUT`]; the response's status code (its body is not read).
async fn post(
    config: &PushConfig,
    target: &Allowed,
    body: &str,
    content_type: &'static str,
) -> Result<u16, ClientError> {
    let mut headers = crate::gateway::trace::headers(config.trace.as_ref());
    if let Some((scheme, credentials)) = &config.authentication {
        headers.push(("authorization", format!("{scheme} {credentials}")));
    } else if let Some(token) = &config.token {
        headers.push(("x-a2a-notification-token", token.clone()));
    }
    let body = Body {
        bytes: Bytes::copy_from_slice(body.as_bytes()),
        content_type,
    };
    let waits = Waits {
        connect: TIMEOUT,
        head: TIMEOUT,
    };
    let answer = client::send(target, Method::POST, &headers, Some(body), waits).await?;
    Ok(answer.status().as_u16())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_read_both_versions() {
        let v1: ConfigParams = serde_json::from_str(
            r#"{"taskId":"t","url":"http://x/h","token":"k","authentication":{"scheme":"Bearer","credentials":"c"}}"#,
        )
        .unwrap();
        let c = v1.into_config(Version::V1, None).unwrap();
        assert_eq!(c.url, "http://x/h");
        assert_eq!(c.authentication, Some(("Bearer".into(), "c".into())));
        let v03: ConfigParams = serde_json::from_str(
            r#"{"taskId":"t","pushNotificationConfig":{"id":"p","url":"http://x/h","authentication":{"schemes":["Basic"],"credentials":"c"}}}"#,
        )
        .unwrap();
        let c = v03.into_config(Version::V03, None).unwrap();
        assert_eq!(c.id, "p");
        assert_eq!(c.authentication, Some(("Basic".into(), "c".into())));
        assert_eq!(
            c.to_json(Version::V03, "t", true)["pushNotificationConfig"]["authentication"]
                ["schemes"],
            json!(["Basic"])
        );
        // Without the secrets: the scheme, not the credentials or the token.
        let shown = c.to_json(Version::V03, "t", false);
        assert_eq!(
            shown["pushNotificationConfig"]["authentication"],
            json!({"schemes": ["Basic"]})
        );
        let v1 = PushConfig {
            token: Some("tok".into()),
            ..c
        }
        .to_json(Version::V1, "t", false);
        assert!(v1.get("token").is_none(), "{v1}");
        assert!(!v1.to_string().contains("tok") && !v1.to_string().contains("\"c\""));
    }

    fn allow(entries: &[&str]) -> AllowList {
        AllowList::parse(&entries.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn a_config_id_is_its_setters() {
        let p = Push::new(allow(&["http://127.0.0.1:9/"]), 64);
        let of = |who: &str| PushConfig {
            id: "a".into(),
            url: "http://127.0.0.1:9/h".into(),
            token: Some(format!("tok-{who}")),
            authentication: None,
            version: Version::V1,
            owner: Some(Owner {
                id: who.into(),
                issuer: None,
            }),
            trace: None,
        };
        assert!(p.set("t", of("alice")).is_ok());
        assert_eq!(p.set("t", of("bob")).unwrap_err().code, -32602);
        assert_eq!(p.list("t")[0].token.as_deref(), Some("tok-alice"));
        assert!(p.set("t", of("alice")).is_ok(), "its setter replaces it");
    }

    #[test]
    fn only_allowed_urls() {
        let p = Push::new(allow(&["http://127.0.0.1:9/hook/"]), 3);
        let c = |id: &str, url: &str| PushConfig {
            id: id.into(),
            url: url.into(),
            token: None,
            authentication: None,
            version: Version::V1,
            owner: None,
            trace: None,
        };
        assert!(p.set("t", c("a", "http://127.0.0.1:9/hook/a")).is_ok());
        for bad in [
            "http://10.0.0.1:9/hook/",
            "ftp://127.0.0.1:9/hook/",
            "http://127.0.0.1:9/hook/../admin",
            "http://127.0.0.1:9/hook/%2e%2e/admin",
            "http://127.0.0.1:9/hook/#frag",
            "http://u:p@127.0.0.1:9/hook/",
            "http://127.0.0.1:10/hook/",
        ] {
            assert_eq!(p.set("t", c("b", bad)).unwrap_err().code, -32602, "{bad}");
        }
        // Kept normalised: what is sent is what was checked.
        assert!(p
            .set("t", c("b", "http://0x7f000001:9/hook/x/../y"))
            .is_ok());
        assert_eq!(p.list("t")[1].url, "http://127.0.0.1:9/hook/y");
        assert_eq!(
            Push::default()
                .set("t", c("a", "http://127.0.0.1:9/hook/"))
                .unwrap_err()
                .code,
            -32003
        );
        // A principal's configs are capped over its tasks; replacing one is not a new one.
        assert!(p.set("u", c("a", "http://127.0.0.1:9/hook/")).is_ok());
        let e = p.set("v", c("a", "http://127.0.0.1:9/hook/")).unwrap_err();
        assert!(e.message.contains("per principal (limit 3)"), "{e}");
        assert!(p.set("u", c("a", "http://127.0.0.1:9/hook/z")).is_ok());
        let long = PushConfig {
            token: Some("k".repeat(MAX_PUSH_SECRET_BYTES + 1)),
            ..c("a", "http://127.0.0.1:9/hook/")
        };
        assert_eq!(p.set("t", long).unwrap_err().code, -32602);
        assert!(p.delete("t", "a"));
        assert!(!p.delete("t", "a"));
    }
}
