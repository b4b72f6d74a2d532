//! Raw load for the crash tests: agents that send as fast as answers come back over a bare
//! WebSocket, recording every answered send, until their connection breaks (the router was
//! killed) or they reach their count.

use std::sync::{Arc, Mutex};

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One call on a raw socket: its whole answer (result or error); `None` once the connection
/// is gone.
pub async fn call(ws: &mut Ws, n: u64, method: &str, params: Value) -> Option<Value> {
    let req = json!({"jsonrpc": "2.0", "id": n, "method": method, "params": params});
    ws.send(Message::text(req.to_string())).await.ok()?;
    loop {
        let Message::Text(t) = ws.next().await?.ok()? else {
            continue;
        };
        let v: Value = serde_json::from_str(t.as_str()).ok()?;
        if v["id"] == json!(n) {
            return Some(v);
        }
    }
}

/// One call on a raw socket; `None` once the connection is gone (or the call failed).
pub async fn rpc(ws: &mut Ws, n: u64, method: &str, params: Value) -> Option<Value> {
    call(ws, n, method, params).await?.get("result").cloned()
}

/// A raw socket connected as an agent that registered `id` (calls 1 and 2); `None` when the
/// router is not there.
async fn connect_agent(url: &str, id: &str) -> Option<Ws> {
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.ok()?;
    let connect = json!({"protocolVersion": 1, "participantType": "agent"});
    rpc(&mut ws, 1, "map/connect", connect).await?;
    rpc(&mut ws, 2, "map/agents/register", json!({"agentId": id})).await?;
    Some(ws)
}

/// An agent that sends to `to` as fast as answers come back, recording the id of every
/// answered send, until its connection breaks or `max` sends are answered.
pub async fn sender(url: String, id: String, to: String, acked: Arc<Mutex<Vec<String>>>, max: u64) {
    let Some(mut ws) = connect_agent(&url, &id).await else {
        return;
    };
    for n in 3..3 + max {
        let params = json!({"to": {"agent": to}, "payload": {"n": n}});
        let Some(result) = rpc(&mut ws, n, "map/send", params).await else {
            return;
        };
        let message_id = result["messageId"].as_str().unwrap().to_owned();
        acked.lock().unwrap().push(message_id);
    }
}

/// Agents `<prefix>0`, `<prefix>1`... registered one after another on `url`, each then
/// unregistered, made busy and kept connected, or dropped without a close (orphaned), until
/// the router stops answering (a kill at a random point finds them at any step).
pub async fn churn(url: String, prefix: String) {
    let mut kept = Vec::new();
    for i in 0u64.. {
        let id = format!("{prefix}{i}");
        let Some(mut ws) = connect_agent(&url, &id).await else {
            return;
        };
        let step = match i % 3 {
            0 => rpc(&mut ws, 3, "map/agents/unregister", json!({"agentId": id})).await,
            1 => {
                let busy = json!({"agentId": id, "state": "busy"});
                rpc(&mut ws, 3, "map/agents/update", busy).await
            }
            _ => Some(Value::Null),
        };
        if step.is_none() {
            return;
        }
        if i % 3 == 1 {
            kept.push(ws);
        }
    }
}

/// A xorshift generator for random kill points (seeded, so a failing run can be repeated).
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The number in the environment variable `name`, if set (a panic if it is not a number).
pub fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse::<u64>()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
    })
}

/// A seed for [`Rng`]: `name` from the environment (to repeat a run), else the clock.
pub fn env_seed(name: &str) -> u64 {
    env_number(name).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    }) | 1
}

/// As [`sender`], through failures: a send answered with an error (the log could not commit
/// it in time, NATS being away) is not recorded, and the next one follows 20 ms later;
/// `failed` counts them. Ends when `stop` is set or the connection breaks.
pub async fn persistent_sender(
    url: String,
    id: String,
    to: String,
    acked: Arc<Mutex<Vec<String>>>,
    failed: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::atomic::Ordering;
    let Some(mut ws) = connect_agent(&url, &id).await else {
        return;
    };
    let mut n = 3;
    while !stop.load(Ordering::Acquire) {
        let params = json!({"to": {"agent": to}, "payload": {"n": n}});
        let Some(answer) = call(&mut ws, n, "map/send", params).await else {
            return;
        };
        n += 1;
        match answer["result"]["messageId"].as_str() {
            Some(id) => acked.lock().unwrap().push(id.to_owned()),
            None => {
                failed.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
}

/// The load the crash tests kill a router under: a dashboard recording the id of every event
/// its subscription `sub` is shown, a sink agent reading its messages, and two [`sender`]s to
/// it recording every answered send.
pub struct CrashLoad {
    /// Event ids the dashboard was shown, in order.
    pub seen: Arc<Mutex<Vec<String>>>,
    /// Message ids of the answered sends.
    pub acked: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl CrashLoad {
    /// Starts it on `url`: `dash` is subscribed with `sub`; the sink registers `sink`, the
    /// senders `senders`, each sending up to `max`.
    pub async fn start(
        url: &str,
        mut dash: super::WsClient,
        sub: String,
        sink: &str,
        senders: [String; 2],
        max: u64,
    ) -> Self {
        use super::Frame;
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        let shown = seen.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                match dash.read_frame().await {
                    Frame::Json(v) if v["params"]["subscriptionId"] == json!(sub) => {
                        let id = v["params"]["eventId"].as_str().unwrap().to_owned();
                        shown.lock().unwrap().push(id);
                    }
                    Frame::Json(_) => {}
                    Frame::Closed(_) => return,
                }
            }
        }));
        let mut sink_client = super::WsClient::agent(url, sink, json!({})).await;
        tasks.push(tokio::spawn(async move {
            while let Frame::Json(_) = sink_client.read_frame().await {}
        }));
        for id in senders {
            tasks.push(tokio::spawn(sender(
                url.to_owned(),
                id,
                sink.to_owned(),
                acked.clone(),
                max,
            )));
        }
        Self { seen, acked, tasks }
    }

    /// Stops every part at once (the router lives on: its connections stay open otherwise).
    pub fn abort(self) {
        for task in self.tasks {
            task.abort();
        }
    }

    /// After the router is gone: waits for every part (bounded) and returns what the
    /// dashboard was shown and which sends were answered.
    pub async fn finish(self) -> (Vec<String>, Vec<String>) {
        for task in self.tasks {
            let _ = super::with_timeout(task).await;
        }
        let seen = self.seen.lock().unwrap().clone();
        let acked = self.acked.lock().unwrap().clone();
        (seen, acked)
    }
}
