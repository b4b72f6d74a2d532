//! `map-router watch`: tail events, hide the CLI's own comings and goings, and say on stderr
//! when the connection is lost, when it is back, and whether events were missed.
//!
//! - Filter: `--filter` JSON plus `--type` / `--agent` (a name or id, see `resolve`; text that
//!   names no agent is kept as an id) / `--scope`.
//! - Hiding ([`CliEvents`]): unless `--all`, events about CLI connections are not printed. A CLI
//!   connection is one whose participant id begins with [`CLI_ID_PREFIX`] (every connection of
//!   this CLI), or that connected with the name [`CLI_NAME`] (remembered until it disconnects,
//!   for CLIs that did not choose their id); a CLI agent is one whose id begins with
//!   [`CLI_ID_PREFIX`] (`send --as-agent`'s temporary agents).
//! - Reconnecting ([`Reporter`]): the client reconnects and resumes the subscription after the
//!   last event shown (`docs/client.md`); this module follows [`Client::state_changes`] and
//!   [`Client::last_connection_error`] and reports. Whether events were missed is known at the
//!   first event of the new router subscription: the router sends `subscription.overflow`
//!   first when it no longer retains the events from the outage.

use std::collections::HashSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use futures::StreamExt;
use serde_json::Value;

use crate::cli::common::connect;
use crate::cli::common::describe;
use crate::cli::common::fail;
use crate::cli::common::print_line;
use crate::cli::common::Failure;
use crate::cli::common::UrlArgs;
use crate::cli::common::CLI_ID_PREFIX;
use crate::cli::common::CLI_NAME;
use crate::cli::format;
use crate::cli::resolve;
use crate::client::{ClientError, ClientOptions, ConnectionState, EventEnvelope, ReconnectPolicy};
use crate::protocol::event::SubscriptionFilter;
use crate::protocol::ids::SubscriptionId;

/// First delay and ceiling of `watch`'s reconnect backoff.
const RECONNECT_DELAYS: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(10));
/// Default reconnect attempts: with [`RECONNECT_DELAYS`], about 10 minutes.
const DEFAULT_RECONNECT_ATTEMPTS: u32 = 65;
/// While reconnecting, a reminder every this many attempts.
const REMIND_EVERY: u32 = 10;

/// `watch --help`.
pub const LONG_ABOUT: &str = "\
Tail events: one line per event (UTC time, type, source, data), or the map/event params as \
JSON lines (--json).

Unless --all is given, the CLI's own comings and goings are hidden: participant_connected and \
participant_disconnected of CLI connections (participant ids beginning `map-router-cli-`, or \
connected with the name `map-router-cli`), and events about the CLI's temporary agents (agent \
ids beginning `map-router-cli-`, e.g. `send --as-agent`). What the CLI does (messages it \
sends, agents it stops or spawns) is shown.

When the connection is lost, watch says so on stderr and reconnects (backoff from 100 ms to 10 \
s, --reconnect-attempts attempts: about 10 minutes by default), then resumes after the last \
event shown; it reports on stderr whether events were missed. It exits 1 when it gives up, 0 \
on Ctrl-C.";

/// `map-router watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// A full subscription filter as JSON (e.g. `{"eventTypes":["agent.*"]}`); the flags below
    /// add to it.
    #[arg(long, value_name = "JSON")]
    filter: Option<String>,
    /// Only these event types (repeatable; either spelling, `prefix.*` and `*` work).
    #[arg(long = "type", value_name = "TYPE")]
    types: Vec<String>,
    /// Only events caused by these agents (repeatable; an id or a unique name).
    #[arg(long = "agent", value_name = "AGENT")]
    agents: Vec<String>,
    /// Only events in these scopes or their descendants (repeatable).
    #[arg(long = "scope", value_name = "SCOPE")]
    scopes: Vec<String>,
    /// Print each event's `map/event` params as one JSON line.
    #[arg(long)]
    json: bool,
    /// Also show the CLI's own connection events (hidden by default).
    #[arg(long, visible_alias = "show-cli")]
    all: bool,
    /// Reconnect attempts after the connection is lost before giving up (0: do not reconnect).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_RECONNECT_ATTEMPTS)]
    reconnect_attempts: u32,
}

fn watch_filter(args: &WatchArgs, agents: &[String]) -> Result<SubscriptionFilter, Failure> {
    let mut filter: SubscriptionFilter = match &args.filter {
        Some(text) => serde_json::from_str(text)
            .map_err(|e| Failure::new("--filter", format!("not a subscription filter: {e}")))?,
        None => SubscriptionFilter::default(),
    };
    let add = |list: &mut Option<Vec<String>>, more: &[String]| {
        if !more.is_empty() {
            list.get_or_insert_with(Vec::new)
                .extend(more.iter().cloned());
        }
    };
    add(&mut filter.event_types, &args.types);
    // No type asked for: every type, our vendor types (stderr lines, spawns, presence)
    // included, which a filter must name.
    if filter.event_types.as_ref().is_none_or(Vec::is_empty) {
        filter.event_types = Some(crate::protocol::event::EventType::every_type());
    }
    add(&mut filter.from_agents, agents);
    add(&mut filter.scopes, &args.scopes);
    Ok(filter)
}

pub(super) async fn run(args: WatchArgs) -> Result<ExitCode, Failure> {
    // Checked before connecting: a bad filter is the user's to fix, whatever the router says.
    watch_filter(&args, &[])?;
    // A watcher outlives router restarts for a while: it keeps reconnecting.
    let policy = ReconnectPolicy::default()
        .delays(RECONNECT_DELAYS.0, RECONNECT_DELAYS.1)
        .max_attempts(args.reconnect_attempts);
    let client = connect(&args.url, ClientOptions::new().reconnect(policy)).await?;
    let mut agents = Vec::with_capacity(args.agents.len());
    for agent in &args.agents {
        agents.push(resolve::agent_or_as_is(&client, "--agent", agent).await?);
    }
    let mut events = client
        .subscribe(watch_filter(&args, &agents)?)
        .await
        .map_err(fail("map/subscribe"))?;
    let mut hidden = (!args.all).then(CliEvents::default);
    let mut reporter = Reporter::new(args.reconnect_attempts);
    let mut states = client.state_changes();
    let mut states_open = true;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        tokio::select! {
            // NB. State changes first: a reconnect is reported before the events after it.
            biased;
            _ = &mut interrupted => break,
            changed = states.changed(), if states_open => {
                if changed.is_err() {
                    states_open = false;
                    continue;
                }
                let state = *states.borrow_and_update();
                let resumed = client.session().is_some_and(|s| s.reconnected);
                if let Some(note) = reporter.on_state(state, client.last_connection_error(), resumed) {
                    eprintln!("map-router: watch: {note}");
                }
            }
            next = events.next() => {
                let Some(event) = next else {
                    return match events.error() {
                        Some(e) => Err(reporter.ended(&e)),
                        None => Ok(ExitCode::SUCCESS),
                    };
                };
                if let Some(note) = reporter.on_event(&event) {
                    eprintln!("map-router: watch: {note}");
                }
                if hidden.as_mut().is_some_and(|h| h.hides(&event)) {
                    continue;
                }
                let line = if args.json {
                    serde_json::to_string(&event).unwrap_or_default()
                } else {
                    format::event_line(&event)
                };
                if !print_line(&line) {
                    break;
                }
            }
        }
    }
    let _ = client.close().await;
    Ok(ExitCode::SUCCESS)
}

/// Recognises events about CLI connections and CLI agents (the rule is in the module docs).
#[derive(Debug, Default)]
pub(super) struct CliEvents {
    /// Participants that connected with the CLI's name but not its id prefix.
    named: HashSet<String>,
}

impl CliEvents {
    /// Whether `e` is about a CLI connection or agent (and so hidden).
    pub(super) fn hides(&mut self, e: &EventEnvelope) -> bool {
        let data = e.event.data.as_ref().map(|d| d.to_value());
        let field = |key: &str| {
            data.as_ref()
                .and_then(|d| d.get(key))
                .and_then(Value::as_str)
        };
        let is_cli = |id: Option<&str>| id.is_some_and(|id| id.starts_with(CLI_ID_PREFIX));
        match e.kind() {
            "participant_connected" | "participant.connected" => {
                let id = field("participantId");
                if is_cli(id) {
                    return true;
                }
                if field("name") != Some(CLI_NAME) {
                    return false;
                }
                if let Some(id) = id {
                    self.named.insert(id.to_owned());
                }
                true
            }
            "participant_disconnected" | "participant.disconnected" => {
                let id = field("participantId");
                is_cli(id) || id.is_some_and(|id| self.named.remove(id))
            }
            kind if kind.starts_with("agent") => is_cli(field("agentId")),
            _ => false,
        }
    }
}

/// What `watch` says on stderr about its connection.
#[derive(Debug)]
struct Reporter {
    max_attempts: u32,
    /// When the current outage began.
    outage: Option<Instant>,
    /// After a reconnect, until the first event of the new router subscription: the
    /// subscription the last event before the outage came from.
    verdict_pending: Option<Option<SubscriptionId>>,
    /// The subscription the last event came from.
    last_subscription: Option<SubscriptionId>,
}

impl Reporter {
    fn new(max_attempts: u32) -> Self {
        Self {
            max_attempts,
            outage: None,
            verdict_pending: None,
            last_subscription: None,
        }
    }

    /// A connection state change; the note to print, if any.
    fn on_state(
        &mut self,
        state: ConnectionState,
        last_error: Option<ClientError>,
        resumed: bool,
    ) -> Option<String> {
        match state {
            ConnectionState::Reconnecting { attempt } => {
                let why = why(last_error);
                if self.outage.is_none() {
                    self.outage = Some(Instant::now());
                    Some(format!("connection lost ({why}); reconnecting…"))
                } else if attempt > 0 && attempt % REMIND_EVERY == 0 {
                    Some(format!(
                        "still reconnecting (attempt {attempt} of {}; {why})",
                        self.max_attempts
                    ))
                } else {
                    None
                }
            }
            ConnectionState::Connected => {
                let since = self.outage.take()?;
                self.verdict_pending = Some(self.last_subscription.clone());
                let session = if resumed {
                    "session resumed"
                } else {
                    "new session: the router restarted or had forgotten this one"
                };
                Some(format!(
                    "reconnected after {:.1} s ({session}); resuming after the last event shown",
                    since.elapsed().as_secs_f64()
                ))
            }
            _ => None,
        }
    }

    /// An event arrived; after a reconnect, the first one of the new router subscription says
    /// whether events were missed.
    fn on_event(&mut self, e: &EventEnvelope) -> Option<String> {
        let note = match &self.verdict_pending {
            Some(before) if before.as_ref() != Some(&e.subscription_id) => {
                self.verdict_pending = None;
                Some(verdict(e))
            }
            _ => None,
        };
        self.last_subscription = Some(e.subscription_id.clone());
        note
    }

    /// The stream ended with `error`: the failure to report.
    fn ended(&self, error: &ClientError) -> Failure {
        match (self.outage, error) {
            (_, ClientError::Auth(_)) => Failure::new("watch: reconnecting", describe(error)),
            (Some(since), e) => Failure::new(
                "watch",
                format!(
                    "gave up reconnecting after {} attempts ({:.0} s): {}",
                    self.max_attempts,
                    since.elapsed().as_secs_f64(),
                    why(Some(e.clone()))
                ),
            ),
            (None, e) => Failure::new("watch: the event stream ended", describe(e)),
        }
    }
}

/// A connection error without the words the notes already say.
fn why(error: Option<ClientError>) -> String {
    match error {
        Some(ClientError::Transport(why)) => {
            let why = why.strip_prefix("connection lost: ").unwrap_or(&why);
            why.strip_prefix("transport: ").unwrap_or(why).to_owned()
        }
        Some(e) => describe(&e),
        None => "no reason given".into(),
    }
}

/// The note on the first event after a reconnect.
fn verdict(first: &EventEnvelope) -> String {
    if first.kind() != "subscription.overflow" {
        return "no events missed".into();
    }
    let dropped = first
        .event
        .data
        .as_ref()
        .map(|d| d.to_value())
        .and_then(|d| d.get("eventsDropped").and_then(Value::as_u64));
    match dropped {
        Some(n) => format!(
            "events were missed: the router no longer had up to {n} of the events from the outage"
        ),
        None => "events were missed: the router no longer had some events from the outage".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(sub: &str, kind: &str, data: Value) -> EventEnvelope {
        serde_json::from_value(json!({
            "subscriptionId": sub, "sequenceNumber": 1, "eventId": "01J", "timestamp": 1,
            "event": {"id": "01J", "type": kind, "timestamp": 1, "data": data}
        }))
        .unwrap()
    }

    #[test]
    fn cli_connections_and_agents_are_hidden() {
        let mut h = CliEvents::default();
        let cli = "map-router-cli-0123456789abcdef";
        for (kind, data) in [
            (
                "participant_connected",
                json!({"participantId": cli, "participantType": "client"}),
            ),
            (
                "participant_disconnected",
                json!({"participantId": cli, "participantType": "client", "reason": "disconnect"}),
            ),
            ("agent_registered", json!({"agentId": cli, "ownerId": cli})),
            ("agent_unregistered", json!({"agentId": cli})),
        ] {
            assert!(h.hides(&event("s", kind, data.clone())), "{kind} {data}");
        }
        // Connected with the CLI's name under another id: hidden, and so is its disconnect.
        let named = json!({"participantId": "p9", "participantType": "client", "name": CLI_NAME});
        assert!(h.hides(&event("s", "participant_connected", named)));
        let gone = json!({"participantId": "p9", "participantType": "client", "reason": "x"});
        assert!(h.hides(&event("s", "participant_disconnected", gone.clone())));
        assert!(
            !h.hides(&event("s", "participant_disconnected", gone)),
            "forgotten"
        );
        // Everything else is shown.
        for (kind, data) in [
            (
                "participant_connected",
                json!({"participantId": "p1", "participantType": "agent", "name": "w"}),
            ),
            ("agent_registered", json!({"agentId": "a1", "ownerId": cli})),
            ("message_sent", json!({"from": cli, "to": "a1"})),
            ("scope_created", json!({"scopeId": "map-router-cli-x"})),
        ] {
            assert!(!h.hides(&event("s", kind, data.clone())), "{kind} {data}");
        }
    }

    #[test]
    fn the_first_event_after_a_reconnect_says_whether_events_were_missed() {
        let mut r = Reporter::new(3);
        assert_eq!(r.on_event(&event("s1", "scope_created", json!({}))), None);
        // Reconnected (as on_state does it).
        r.verdict_pending = Some(r.last_subscription.clone());
        // Events still buffered from the old subscription say nothing.
        assert_eq!(r.on_event(&event("s1", "scope_created", json!({}))), None);
        assert_eq!(
            r.on_event(&event("s2", "scope_created", json!({})))
                .as_deref(),
            Some("no events missed")
        );
        assert_eq!(r.on_event(&event("s2", "scope_created", json!({}))), None);
        r.verdict_pending = Some(r.last_subscription.clone());
        let gap = event("s3", "subscription.overflow", json!({"eventsDropped": 7}));
        assert_eq!(
            r.on_event(&gap).as_deref(),
            Some("events were missed: the router no longer had up to 7 of the events from the outage")
        );
    }

    #[test]
    fn outages_are_reported_once_then_every_few_attempts() {
        let mut r = Reporter::new(30);
        let lost = || {
            Some(ClientError::Transport(
                "connection lost: closed by the router".into(),
            ))
        };
        assert_eq!(
            r.on_state(ConnectionState::Connected, None, true),
            None,
            "not an outage"
        );
        assert_eq!(
            r.on_state(ConnectionState::Reconnecting { attempt: 0 }, lost(), false)
                .as_deref(),
            Some("connection lost (closed by the router); reconnecting…")
        );
        assert_eq!(
            r.on_state(ConnectionState::Reconnecting { attempt: 1 }, lost(), false),
            None
        );
        assert_eq!(
            r.on_state(ConnectionState::Reconnecting { attempt: 10 }, lost(), false)
                .as_deref(),
            Some("still reconnecting (attempt 10 of 30; closed by the router)")
        );
        let back = r.on_state(ConnectionState::Connected, None, true).unwrap();
        assert!(back.starts_with("reconnected after "), "{back}");
        assert!(
            back.ends_with("(session resumed); resuming after the last event shown"),
            "{back}"
        );
        assert!(r.verdict_pending.is_some());
        let gave_up = r.ended(&ClientError::Closed);
        assert_eq!(gave_up.what, "watch: the event stream ended");
        r.outage = Some(Instant::now());
        let gave_up = r.ended(&ClientError::Transport("refused".into()));
        assert!(
            gave_up
                .error
                .starts_with("gave up reconnecting after 30 attempts ("),
            "{}",
            gave_up.error
        );
    }

    #[test]
    fn connection_errors_read_plainly() {
        assert_eq!(
            why(Some(ClientError::Transport(
                "connection lost: closed by the router".into()
            ))),
            "closed by the router"
        );
        assert_eq!(
            why(Some(ClientError::Transport(
                "connection lost: transport: closed by the router (1001 bye)".into()
            ))),
            "closed by the router (1001 bye)"
        );
        assert_eq!(why(None), "no reason given");
    }
}
