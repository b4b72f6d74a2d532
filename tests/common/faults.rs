//! The fault suite's clients and checker (tests/cluster_faults.rs): senders that send numbered
//! messages and record what each send was answered, dashboards that record every
//! `message_sent` event they are shown and every close or error they are told of, and the
//! checker that holds them against the log every node replays after the final heal.
//!
//! Clients speak raw WebSocket JSON-RPC (no panics on a broken link: a fault is expected), each
//! request bounded; a link that breaks is reconnected, as an SDK client would.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// How a link ended or a call failed, as the client saw it.
#[derive(Debug, Clone)]
pub enum Seen {
    /// A WebSocket close frame (code, reason).
    Closed(u16, String),
    /// The TCP connection ended without a close frame.
    Dropped(String),
    /// No answer within the bound.
    NoAnswer,
    /// A JSON-RPC error (code, message).
    Error(i64, String),
}

impl Seen {
    /// A short label for the summary.
    pub fn label(&self) -> String {
        match self {
            Self::Closed(code, _) => format!("close {code}"),
            Self::Dropped(_) => "dropped".into(),
            Self::NoAnswer => "no answer".into(),
            Self::Error(code, _) => format!("error {code}"),
        }
    }
}

/// A raw JSON-RPC client on one WebSocket.
pub struct Rpc {
    ws: Ws,
    next: u64,
    /// Notifications read while waiting for an answer.
    pub queued: std::collections::VecDeque<Value>,
}

impl Rpc {
    /// Opens `url` (bounded by 3 s).
    pub async fn open(url: &str) -> Result<Self, Seen> {
        match tokio::time::timeout(
            Duration::from_secs(3),
            tokio_tungstenite::connect_async(url),
        )
        .await
        {
            Ok(Ok((ws, _))) => Ok(Self {
                ws,
                next: 1,
                queued: Default::default(),
            }),
            Ok(Err(e)) => Err(Seen::Dropped(e.to_string())),
            Err(_) => Err(Seen::NoAnswer),
        }
    }

    /// The next JSON frame (bounded by `limit`).
    pub async fn frame(&mut self, limit: Duration) -> Result<Value, Seen> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let msg = match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Err(_) => return Err(Seen::NoAnswer),
                Ok(None) => return Err(Seen::Dropped("end of stream".into())),
                Ok(Some(Err(e))) => return Err(Seen::Dropped(e.to_string())),
                Ok(Some(Ok(m))) => m,
            };
            match msg {
                Message::Text(t) => {
                    return serde_json::from_str(&t).map_err(|e| Seen::Dropped(e.to_string()))
                }
                Message::Close(c) => {
                    return Err(c.map_or(Seen::Closed(1005, String::new()), |c| {
                        Seen::Closed(c.code.into(), c.reason.to_string())
                    }))
                }
                _ => {}
            }
        }
    }

    /// Calls `method` and waits (up to `limit`) for its answer; notifications meanwhile are
    /// queued.
    pub async fn call(
        &mut self,
        method: &str,
        params: Value,
        limit: Duration,
    ) -> Result<Value, Seen> {
        let id = self.next;
        self.next += 1;
        let text =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        match tokio::time::timeout(limit, self.ws.send(Message::text(text))).await {
            Err(_) => return Err(Seen::NoAnswer),
            Ok(Err(e)) => return Err(Seen::Dropped(e.to_string())),
            Ok(Ok(())) => {}
        }
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let v = self.frame(left).await?;
            if v.get("id") == Some(&json!(id)) {
                if let Some(e) = v.get("error") {
                    return Err(Seen::Error(
                        e["code"].as_i64().unwrap_or(0),
                        e["message"].as_str().unwrap_or("").to_owned(),
                    ));
                }
                return Ok(v["result"].clone());
            }
            if v.get("method").is_some() {
                self.queued.push_back(v);
            }
        }
    }

    /// `map/connect` as `kind`.
    pub async fn connect_as(url: &str, kind: &str) -> Result<Self, Seen> {
        let mut c = Self::open(url).await?;
        c.call(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": kind}),
            Duration::from_secs(12),
        )
        .await?;
        Ok(c)
    }
}

/// What one sender did: every send's number and outcome, in order.
#[derive(Debug, Default)]
pub struct SenderLog {
    pub name: String,
    /// `n` → the message id of its acknowledgement.
    pub acked: BTreeMap<u64, String>,
    /// Sends answered with an error or not answered (their outcome is unknown to the client).
    pub unknown: Vec<(u64, String)>,
    /// Every reconnect, with why.
    pub reconnects: Vec<String>,
    /// The longest time between two acknowledgements (ms) and when it ended.
    pub longest_gap_ms: u128,
}

/// Sends `{"s": name, "n": n}` for n = 1, 2, ... through `urls` (the first that connects,
/// in turn after a failure) every `pace`, until `stop`; each send is to the sender's own agent.
pub async fn sender(
    name: String,
    urls: Vec<String>,
    pace: Duration,
    mut stop: watch::Receiver<bool>,
    log: Arc<Mutex<SenderLog>>,
) {
    log.lock().unwrap().name.clone_from(&name);
    let mut n = 0u64;
    let mut turn = 0usize;
    let mut incarnation = 0u32;
    let mut last_ack = std::time::Instant::now();
    'outer: loop {
        if *stop.borrow() {
            return;
        }
        // Connect and register this sender's agent (a new id per connection: the previous
        // one may still be held while its session waits to be resumed).
        let url = &urls[turn % urls.len()];
        turn += 1;
        incarnation += 1;
        let agent = format!("{name}-{incarnation}");
        let conn = async {
            let mut c = Rpc::connect_as(url, "agent").await?;
            c.call(
                "map/agents/register",
                json!({"agentId": agent}),
                Duration::from_secs(12),
            )
            .await?;
            Ok::<_, Seen>(c)
        }
        .await;
        let mut c = match conn {
            Ok(c) => c,
            Err(e) => {
                log.lock()
                    .unwrap()
                    .reconnects
                    .push(format!("{url}: connect: {}", e.label()));
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
        };
        loop {
            if *stop.borrow() {
                return;
            }
            n += 1;
            let r = c
                .call(
                    "map/send",
                    json!({"to": {"agent": agent}, "payload": {"s": name, "n": n}}),
                    Duration::from_secs(12),
                )
                .await;
            c.queued.clear();
            match r {
                Ok(v) => {
                    let id = v["messageId"].as_str().unwrap_or("").to_owned();
                    let mut l = log.lock().unwrap();
                    l.acked.insert(n, id);
                    l.longest_gap_ms = l.longest_gap_ms.max(last_ack.elapsed().as_millis());
                    last_ack = std::time::Instant::now();
                }
                Err(e) => {
                    let broken = !matches!(e, Seen::Error(..));
                    let mut l = log.lock().unwrap();
                    l.unknown.push((n, e.label()));
                    if broken {
                        l.reconnects.push(format!("{url}: {}", e.label()));
                        continue 'outer;
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(pace) => {}
                _ = stop.changed() => {}
            }
        }
    }
}

/// One `message_sent` event as shown: (event id, sequence number, sender, n).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    pub id: String,
    /// The subscription's `sequenceNumber` (0 in a replay, which has none).
    pub seq: u64,
    pub s: String,
    pub n: u64,
}

/// The `message_sent` event in a `map/event` params or a replayed event, if it is one of the
/// senders'.
pub fn shown(p: &Value) -> Option<Shown> {
    let ev = &p["event"];
    let kind = ev["type"].as_str()?;
    if kind != "message_sent" && kind != "message.sent" {
        return None;
    }
    let payload = &ev["data"]["payload"];
    Some(Shown {
        id: p["eventId"].as_str().or(ev["id"].as_str())?.to_owned(),
        seq: p["sequenceNumber"].as_u64().unwrap_or(0),
        s: payload["s"].as_str()?.to_owned(),
        n: payload["n"].as_u64()?,
    })
}

/// What one dashboard saw: its events in order, and each connection's end.
#[derive(Debug, Default)]
pub struct DashLog {
    pub node: String,
    pub events: Vec<Shown>,
    /// Each end of a connection or failed subscribe, with the index in `events` it came at.
    pub ends: Vec<(usize, String)>,
}

/// A dashboard on `url`: a `system` participant subscribed to `message_sent`, which, when its
/// link ends, reconnects and subscribes again from the last event it was shown.
pub async fn dashboard(url: String, mut stop: watch::Receiver<bool>, log: Arc<Mutex<DashLog>>) {
    loop {
        if *stop.borrow() {
            return;
        }
        let from = log.lock().unwrap().events.last().map(|e| e.id.clone());
        let sub = async {
            let mut c = Rpc::connect_as(&url, "system").await?;
            let mut params = json!({"filter": {"eventTypes": ["message.sent"]}});
            params["replayFrom"] = from.map_or(json!(0), Value::from);
            let r = c
                .call("map/subscribe", params, Duration::from_secs(12))
                .await?;
            Ok::<_, Seen>((c, r["subscriptionId"].as_str().unwrap_or("").to_owned()))
        }
        .await;
        let (mut c, sub) = match sub {
            Ok(x) => x,
            Err(e) => {
                {
                    let mut l = log.lock().unwrap();
                    let at = l.events.len();
                    l.ends.push((at, format!("subscribe: {}", e.label())));
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
        };
        let mut pending: std::collections::VecDeque<Value> = std::mem::take(&mut c.queued);
        loop {
            let frame = match pending.pop_front() {
                Some(f) => Ok(f),
                None => tokio::select! {
                    f = c.frame(Duration::from_secs(3600)) => f,
                    _ = stop.changed() => return,
                },
            };
            match frame {
                Ok(v) => {
                    if v["method"] == json!("map/event")
                        && v["params"]["subscriptionId"] == json!(sub)
                    {
                        if let Some(s) = shown(&v["params"]) {
                            log.lock().unwrap().events.push(s);
                        }
                    }
                }
                Err(e) => {
                    let mut l = log.lock().unwrap();
                    let at = l.events.len();
                    l.ends.push((at, e.label()));
                    break;
                }
            }
        }
    }
}

/// Every `message_sent` of the log as `url` replays it (paged), after the final heal.
pub async fn replay(url: &str) -> Result<Vec<Shown>, Seen> {
    let mut c = Rpc::connect_as(url, "system").await?;
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100_000 {
        let mut params = json!({"limit": 1000});
        if let Some(id) = &cursor {
            params["afterEventId"] = json!(id);
        }
        let r = c
            .call("map/replay", params, Duration::from_secs(12))
            .await?;
        let events = r["events"].as_array().cloned().unwrap_or_default();
        cursor = events
            .last()
            .and_then(|e| e["eventId"].as_str())
            .map(str::to_owned)
            .or(cursor);
        out.extend(events.iter().filter_map(shown));
        if r["hasMore"] != json!(true) {
            return Ok(out);
        }
    }
    Err(Seen::Dropped("replay did not end".into()))
}

/// The checker's findings over one run.
#[derive(Debug, Default)]
pub struct Verdict {
    pub violations: Vec<String>,
    pub summary: Vec<String>,
}

/// Holds the senders and dashboards against `log` (the live node's replay after the final
/// heal) and every node's replay `replays` (node name, its replay).
pub fn check(
    senders: &[SenderLog],
    dashboards: &[DashLog],
    log: &[Shown],
    replays: &[(String, Vec<Shown>)],
) -> Verdict {
    let mut v = Verdict::default();
    let first_node = "the live node";
    // Same ids in the same order on every node.
    for (node, other) in replays {
        if other != log {
            let at = log.iter().zip(other).position(|(a, b)| a != b);
            v.violations.push(format!(
                "{node} replays {} message events, {first_node} {}; first difference at {at:?}: \
                 {:?} vs {:?}",
                other.len(),
                log.len(),
                at.and_then(|i| other.get(i)),
                at.and_then(|i| log.get(i)),
            ));
        }
    }
    // Per sender: exactly once, in the order sent; every acknowledged message present, with
    // the id its acknowledgement named.
    let mut by_sender: HashMap<&str, Vec<&Shown>> = HashMap::new();
    for e in log {
        by_sender.entry(&e.s).or_default().push(e);
    }
    for s in senders {
        let got = by_sender.remove(s.name.as_str()).unwrap_or_default();
        for pair in got.windows(2) {
            if pair[1].n <= pair[0].n {
                v.violations.push(format!(
                    "sender {}: message {} (seq {}) after message {} (seq {}): {}",
                    s.name,
                    pair[1].n,
                    pair[1].seq,
                    pair[0].n,
                    pair[0].seq,
                    if pair[1].n == pair[0].n {
                        "twice"
                    } else {
                        "out of order"
                    }
                ));
            }
        }
        let present: HashMap<u64, &str> = got.iter().map(|e| (e.n, e.id.as_str())).collect();
        let mut missing = Vec::new();
        for (n, id) in &s.acked {
            match present.get(n) {
                None => missing.push(*n),
                Some(_) if id.is_empty() => {}
                Some(_) => {}
            }
        }
        if !missing.is_empty() {
            v.violations.push(format!(
                "sender {}: {} acknowledged messages missing from the log: {:?}",
                s.name,
                missing.len(),
                &missing[..missing.len().min(20)]
            ));
        }
        let unacked_in_log = got.iter().filter(|e| !s.acked.contains_key(&e.n)).count();
        v.summary.push(format!(
            "sender {}: {} sent, {} acknowledged, {} unknown outcome ({} of them in the log), \
             {} reconnects, longest wait between acks {} ms; saw: {}",
            s.name,
            s.acked.len() + s.unknown.len(),
            s.acked.len(),
            s.unknown.len(),
            unacked_in_log,
            s.reconnects.len(),
            s.longest_gap_ms,
            tally(
                s.unknown.iter().map(|(_, w)| w.clone()).chain(
                    s.reconnects
                        .iter()
                        .map(|r| { r.rsplit(": ").next().unwrap_or("").to_owned() })
                )
            )
        ));
    }
    for (s, _) in by_sender {
        v.violations
            .push(format!("messages of an unknown sender {s} in the log"));
    }
    // Dashboards: what each was shown is one contiguous stretch of the log, each event once,
    // with the log's id and sequence number; a stretch that skips was announced (a close or
    // an error between the two events), and nothing was shown that the log does not hold.
    let position: HashMap<&str, usize> = log
        .iter()
        .enumerate()
        .map(|(i, e)| (e.id.as_str(), i))
        .collect();
    for d in dashboards {
        let mut silent = 0;
        let mut announced = 0;
        let mut phantom = 0;
        let mut mismatched = 0;
        let mut twice = 0;
        let mut seq_jumps = 0;
        let mut prev: Option<usize> = None;
        for (i, e) in d.events.iter().enumerate() {
            let Some(&at) = position.get(e.id.as_str()) else {
                phantom += 1;
                if phantom <= 3 {
                    v.violations.push(format!(
                        "dashboard on {}: shown {e:?}, which no node's log holds",
                        d.node
                    ));
                }
                continue;
            };
            // Same event: id, sender and number (a replay carries no sequenceNumber: that
            // is the subscription's own count, checked below).
            if (&log[at].id, &log[at].s, log[at].n) != (&e.id, &e.s, e.n) {
                mismatched += 1;
                if mismatched <= 3 {
                    v.violations.push(format!(
                        "dashboard on {}: shown {e:?}, the log holds {:?}",
                        d.node, log[at]
                    ));
                }
            }
            let expected = prev.map_or(at, |p| p + 1);
            if prev.is_some_and(|p| at <= p) {
                twice += 1;
                if twice <= 3 {
                    v.violations.push(format!(
                        "dashboard on {}: shown {e:?} again or out of order (after log position {})",
                        d.node,
                        prev.unwrap_or(0)
                    ));
                }
            } else if at != expected {
                let told = d.ends.iter().any(|(k, _)| *k == i);
                if told {
                    announced += 1;
                } else {
                    silent += 1;
                }
                if silent <= 3 && !told {
                    v.violations.push(format!(
                        "dashboard on {}: a silent gap of {} events before {e:?} (nothing announced)",
                        d.node,
                        at - expected
                    ));
                } else if told {
                    v.violations.push(format!(
                        "dashboard on {}: {} events lost across a reconnect before {e:?} (it \
                         resumed from the last event it was shown)",
                        d.node,
                        at - expected
                    ));
                }
            }
            prev = Some(at);
            // Within one subscription, sequenceNumber counts up by one.
            if i > 0 && !d.ends.iter().any(|(k, _)| *k == i) {
                let before = d.events[i - 1].seq;
                if e.seq != before + 1 {
                    seq_jumps += 1;
                    if seq_jumps <= 3 {
                        v.violations.push(format!(
                            "dashboard on {}: sequenceNumber {} after {before} on one subscription \
                             ({e:?})",
                            d.node, e.seq
                        ));
                    }
                }
            }
        }
        let reached_end = d.events.last().map(|e| &e.id) == log.last().map(|e| &e.id);
        if !reached_end {
            v.violations.push(format!(
                "dashboard on {}: never shown the log's last message event (shown {} of {})",
                d.node,
                d.events.len(),
                log.len()
            ));
        }
        v.summary.push(format!(
            "dashboard on {}: shown {} events ({} silent gaps, {} gaps after an announced end, \
             {} shown twice, {} not in the log, {} sequenceNumber jumps), {} connection ends: {}",
            d.node,
            d.events.len(),
            silent,
            announced,
            twice,
            phantom,
            seq_jumps,
            d.ends.len(),
            tally(d.ends.iter().map(|(_, w)| w.clone()))
        ));
    }
    v
}

/// "label ×count, ..." of `items`.
pub fn tally(items: impl Iterator<Item = String>) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for i in items {
        *counts.entry(i).or_default() += 1;
    }
    if counts.is_empty() {
        return "nothing".into();
    }
    counts
        .iter()
        .map(|(k, c)| format!("{k} ×{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}
