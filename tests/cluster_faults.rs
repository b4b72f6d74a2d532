//! Cluster mode under faults (issue 44): nodes started together, links cut, processes paused,
//! NATS servers lost, with the real `map-router` binary and real `nats-server` processes on
//! loopback.
//!
//! - Three nodes started at once on a three-server NATS cluster, configured as
//!   docs/cluster.md's walkthrough says (`replicas = 3`, `standby = true` on every node), all
//!   come up: one live, two standby, every round (`MAP_FAULTS_ROUNDS`, 3 by default; 20 in
//!   scripts/faults.sh).
//!
//! Every await is bounded. Needs `nats-server` on PATH (the tests fail, never skip, without it).
#![cfg(feature = "cluster")]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::cluster::{doc_config, Node, Role};
use common::nats::Nats;
use common::TempDir;

/// The tests of this file take turns: the fault suite's proxies bind ephemeral ports, and one
/// of them once took the port a concurrently starting nats-server had been given (the server
/// could not bind it, and the nodes of the other test were connected, through the proxy, to the
/// fault suite's NATS cluster).
static TURNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A number from the environment, or `default`.
fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Waits until every node is live or standby (or has exited), up to `limit`; returns each
/// node's role (an exited node as `Down`).
async fn settle(nodes: &mut [Node], limit: Duration) -> Vec<Role> {
    let deadline = Instant::now() + limit;
    loop {
        let mut roles = Vec::new();
        for n in nodes.iter_mut() {
            roles.push(if n.exited().is_some() {
                Role::Down
            } else {
                n.role().await
            });
        }
        let exited = nodes.iter_mut().any(|n| n.exited().is_some());
        let settled = roles
            .iter()
            .filter(|r| matches!(r, Role::Live | Role::Standby))
            .count()
            == nodes.len();
        if settled || exited || Instant::now() >= deadline {
            return roles;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts three nodes at the same instant on `nats` (each pointed at the first server, as the
/// doc's single config file is), `rounds` times on fresh NATS from `fresh`; asserts every round
/// comes up one live and two standby with none exited.
async fn start_together(
    what: &str,
    rounds: usize,
    fresh: impl Fn(usize) -> Vec<Nats>,
    replicas: usize,
) {
    let mut whole = 0;
    for round in 1..=rounds {
        let dir = TempDir::new(&format!("start-together-{what}-{round}"));
        let nats = fresh(round);
        let started = Instant::now();
        let mut nodes: Vec<Node> = (1..=3)
            .map(|i| {
                let name = format!("node-{i}");
                Node::spawn(
                    &name,
                    &doc_config(&nats[0].url(), &name, replicas, ""),
                    &dir.path,
                )
            })
            .collect();
        let roles = settle(&mut nodes, Duration::from_secs(40)).await;
        let took = started.elapsed();
        let live = roles.iter().filter(|r| **r == Role::Live).count();
        let standby = roles.iter().filter(|r| **r == Role::Standby).count();
        let mut report = String::new();
        for (n, r) in nodes.iter_mut().zip(&roles) {
            let exit = n.exited();
            report.push_str(&format!(
                "\n--- {} {r:?} exit={exit:?}\n{}",
                n.name,
                n.log_text()
            ));
        }
        if !(live == 1 && standby == 2) {
            for (i, n) in nats.iter().enumerate() {
                report.push_str(&format!("\n--- nats-server {i}\n{}", n.log()));
            }
        }
        assert!(
            live == 1 && standby == 2,
            "{what}, round {round}: {live} live, {standby} standby (expected 1 and 2) after \
             {took:?}; {whole} whole rounds before:{report}"
        );
        whole += 1;
        eprintln!("{what}, round {round}: 1 live + 2 standby in {took:?}");
        for n in &mut nodes {
            n.kill().await;
        }
    }
    eprintln!("{what}: {whole} of {rounds} rounds came up whole (1 live + 2 standby)");
}

/// Item 15: three nodes started at the same instant, as docs/cluster.md's step 3 does, on
/// the doc's three-server NATS cluster (`replicas = 3`): every round, one comes up live and
/// the two others standby, and none exits. (Before the fix, round 1 already lost nodes:
/// "reading the writer lock: failed to get last raw message: timed out".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_started_at_once_on_three_nats_servers_come_up_one_live_two_standby() {
    let _turn = TURNS.lock().await;
    let rounds = env_usize("MAP_FAULTS_ROUNDS", 3);
    start_together(
        "three NATS servers",
        rounds,
        |round| {
            let nats = Nats::cluster(&format!("together{round}"));
            // As the doc's step 1 says: wait for the metadata leader.
            let started = Instant::now();
            while !nats
                .iter()
                .any(|s| s.log().contains("JetStream cluster new metadata leader"))
            {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "no metadata leader"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            nats
        },
        3,
    )
    .await;
}

/// Item 15 on one NATS server (`replicas = 1`): the same, every round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_started_at_once_on_one_nats_server_come_up_one_live_two_standby() {
    let _turn = TURNS.lock().await;
    let rounds = env_usize("MAP_FAULTS_ROUNDS", 3);
    start_together(
        "one NATS server",
        rounds,
        |round| vec![Nats::start(&format!("together-one-{round}"))],
        1,
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// The fault suite.

use common::faults::{check, dashboard, replay, sender, DashLog, SenderLog};
use common::load::{env_seed, Rng};
use common::proxy::Proxy;
use std::sync::{Arc, Mutex};

/// Three NATS servers whose routes go through proxies (one per direction), and for each of the
/// three node slots a proxy to every server: every link of the cluster can be cut and healed.
struct Net {
    nats: Vec<Nats>,
    /// `routes[i][j]`: server i's route to server j (i != j).
    routes: Vec<Vec<Option<Proxy>>>,
    /// `links[k]`: node slot k's link to NATS (to server k, or another while k is down: the
    /// servers tell clients of no other server, so the proxy is the node's way to one).
    links: Vec<Proxy>,
}

impl Net {
    async fn start(name: &str) -> Self {
        // NB: held (and never handed out again) until their server starts: a port released at
        // once came back as a server's client port, and that server failed to start ("Error
        // listening on router port ... address already in use").
        let mut route_held: Vec<Option<std::net::TcpListener>> =
            common::ports::reserve(3).into_iter().map(Some).collect();
        let route_ports: Vec<u16> = route_held
            .iter()
            .flatten()
            .map(|l| l.local_addr().expect("a reserved port").port())
            .collect();
        let mut routes: Vec<Vec<Option<Proxy>>> = Vec::new();
        for i in 0..3 {
            let mut row = Vec::new();
            for (j, port) in route_ports.iter().enumerate() {
                row.push(if i == j {
                    None
                } else {
                    Some(Proxy::start(*port).await)
                });
            }
            routes.push(row);
        }
        let mut nats = Vec::new();
        for i in 0..3 {
            let solicit = (0..3)
                .filter(|j| *j != i)
                .map(|j| format!("nats://127.0.0.1:{}", routes[i][j].as_ref().unwrap().port))
                .collect::<Vec<_>>()
                .join(",");
            drop(route_held[i].take());
            nats.push(Nats::start_with(
                &format!("{name}-{i}"),
                vec![
                    "-n".into(),
                    format!("{name}-{i}").into(),
                    "--cluster_name".into(),
                    name.into(),
                    "--cluster".into(),
                    format!("nats://127.0.0.1:{}", route_ports[i]).into(),
                    "--routes".into(),
                    solicit.into(),
                    // Nobody learns a way around the proxies: servers advertise a route URL
                    // that refuses, and clients are told of no other server.
                    "--cluster_advertise".into(),
                    "127.0.0.1:1".into(),
                    "--no_advertise".into(),
                ],
            ));
        }
        let mut links = Vec::new();
        for n in &nats {
            links.push(Proxy::start(n.port).await);
        }
        let started = Instant::now();
        while !nats
            .iter()
            .any(|s| s.log().contains("JetStream cluster new metadata leader"))
        {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no metadata leader"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self {
            nats,
            routes,
            links,
        }
    }

    /// Node slot k's NATS URL.
    fn url(&self, k: usize) -> String {
        format!("nats://127.0.0.1:{}", self.links[k].port)
    }

    /// The server node slot k's link goes to.
    fn server_of(&self, k: usize) -> usize {
        let port = self.links[k].target();
        self.nats
            .iter()
            .position(|n| n.port == port)
            .expect("a server's port")
    }

    /// Every link up iff both ends are on the same side (`servers[i]`, `nodes[k]`).
    fn sides(&self, servers: [u8; 3], nodes: [u8; 3]) {
        for i in 0..3 {
            for j in 0..3 {
                if let Some(p) = &self.routes[i][j] {
                    p.set(servers[i] == servers[j]);
                }
            }
        }
        for k in 0..3 {
            self.links[k].set(nodes[k] == servers[self.server_of(k)]);
        }
    }

    fn heal(&self) {
        self.sides([0; 3], [0; 3]);
    }
}

/// A fault the suite injects.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// The live node loses every link to NATS.
    CutLiveFromNats,
    /// The live node and one NATS server on one side, the two other servers and nodes on the
    /// other: the live node alone with a minority.
    LiveWithMinority,
    /// The routes between two NATS servers cut (each still reaches the third).
    CutRoute,
    /// SIGSTOP the live node past the takeover time, then SIGCONT.
    PauseLive,
    /// SIGKILL one NATS server, then start it again on its store.
    KillNats,
}

const FAULTS: [Fault; 5] = [
    Fault::CutLiveFromNats,
    Fault::LiveWithMinority,
    Fault::CutRoute,
    Fault::PauseLive,
    Fault::KillNats,
];

/// The router nodes of the run: slot k listens on `ports[k]` with links `net.links[k]`.
struct Nodes {
    dir: TempDir,
    ports: Vec<u16>,
    nodes: Vec<Node>,
    /// Incarnations started per slot (a restarted node gets a new name: issue 44 item 1).
    incarnations: Vec<u32>,
}

impl Nodes {
    fn config(net: &Net, k: usize, name: &str) -> String {
        doc_config(
            &net.url(k),
            name,
            3,
            "request_timeout_ms = 1000\nconnect_timeout_ms = 3000\nroll_call_ms = 500\n\
             [storage]\ncommit_timeout_ms = 1500",
        )
        .replace("takeover_poll_ms = 250", "takeover_poll_ms = 100")
    }

    fn start(net: &Net) -> Self {
        let dir = TempDir::new("faults-nodes");
        let ports: Vec<u16> = (0..3).map(|_| common::cluster::free_port()).collect();
        let nodes = (0..3)
            .map(|k| {
                let name = format!("n{k}.1");
                Node::spawn_on(&name, &Self::config(net, k, &name), &dir.path, ports[k])
            })
            .collect();
        Self {
            dir,
            ports,
            nodes,
            incarnations: vec![1; 3],
        }
    }

    fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("ws://127.0.0.1:{p}/"))
            .collect()
    }

    async fn roles(&mut self) -> Vec<Role> {
        let mut out = Vec::new();
        for n in &mut self.nodes {
            out.push(if n.exited().is_some() {
                Role::Down
            } else {
                n.role().await
            });
        }
        out
    }

    /// The slot of the one live node, waiting up to `limit` for there to be exactly one.
    async fn live(&mut self, limit: Duration) -> Option<usize> {
        let deadline = Instant::now() + limit;
        loop {
            let roles = self.roles().await;
            let live: Vec<usize> = (0..3).filter(|k| roles[*k] == Role::Live).collect();
            if live.len() == 1 {
                return Some(live[0]);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Restarts (under a new name, on the same port) every node that is neither live nor
    /// standby: one that exited, or stopped as diverged. Returns what each was.
    async fn restart_broken(&mut self, net: &Net, logs: &Path) -> Vec<String> {
        let roles = self.roles().await;
        let mut restarted = Vec::new();
        for (k, role) in roles.iter().enumerate() {
            if matches!(role, Role::Live | Role::Standby) {
                continue;
            }
            let old = &mut self.nodes[k];
            let exit = old.exited();
            let why = match role {
                Role::Other(s, b) => format!("{s} {}", b.lines().next().unwrap_or("")),
                r => format!("{r:?} exit={exit:?}"),
            };
            let tail: Vec<String> = old
                .log
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains("ERROR") || l.contains("cannot start"))
                .take(3)
                .cloned()
                .collect();
            restarted.push(format!("{} ({why}; {tail:?})", old.name));
            old.kill().await;
            let _ = std::fs::write(logs.join(format!("{}.log", old.name)), old.log_text());
            self.incarnations[k] += 1;
            let name = format!("n{k}.{}", self.incarnations[k]);
            self.nodes[k] = Node::spawn_on(
                &name,
                &Self::config(net, k, &name),
                &self.dir.path,
                self.ports[k],
            );
        }
        restarted
    }
}

/// Whether every sender has had a new acknowledgement since `counts`.
fn all_acked_since(senders: &[Arc<Mutex<SenderLog>>], counts: &[usize]) -> bool {
    senders
        .iter()
        .zip(counts)
        .all(|(s, c)| s.lock().unwrap().acked.len() > *c)
}

fn ack_counts(senders: &[Arc<Mutex<SenderLog>>]) -> Vec<usize> {
    senders
        .iter()
        .map(|s| s.lock().unwrap().acked.len())
        .collect()
}

/// The fault suite, small by default (one pass over the five faults in a seeded order, about a
/// minute): agents on every node send numbered messages, dashboards on every node subscribe,
/// while links are cut and healed, the live node is paused past the takeover and a NATS server
/// is killed and restarted; then the checker (`common::faults::check`) holds every observer
/// against the log every node replays. `MAP_FAULTS_SEED` repeats a run, `MAP_FAULTS_PASSES`
/// (1) and `MAP_FAULTS_HOLD_MS` (3000: how long a fault lasts) make it longer, and
/// `MAP_FAULTS_PACE_MS` (40) sets the senders' pace. scripts/faults.sh runs the long soak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_link_cuts_partitions_pauses_and_a_lost_nats_server_nothing_acknowledged_is_lost() {
    let _turn = TURNS.lock().await;
    let seed = env_seed("MAP_FAULTS_SEED");
    let passes = env_usize("MAP_FAULTS_PASSES", 1);
    let hold = Duration::from_millis(env_usize("MAP_FAULTS_HOLD_MS", 3000) as u64);
    let pace = Duration::from_millis(env_usize("MAP_FAULTS_PACE_MS", 40) as u64);
    eprintln!(
        "faults: seed {seed} (MAP_FAULTS_SEED={seed} repeats it), {passes} passes, hold {hold:?}"
    );
    let mut rng = Rng(seed);
    // Every node's log, kept after the run for the reader of a failure.
    let logs = std::env::temp_dir().join(format!("map-faults-{seed}"));
    std::fs::create_dir_all(&logs).expect("a log directory");
    eprintln!("faults: node logs in {}", logs.display());
    let run_started = Instant::now();
    let mut net = Net::start("faults").await;
    let mut nodes = Nodes::start(&net);
    let first_live = nodes.live(Duration::from_secs(40)).await;
    let roles = nodes.roles().await;
    assert!(
        first_live.is_some()
            && roles
                .iter()
                .all(|r| matches!(r, Role::Live | Role::Standby)),
        "the nodes did not come up: {roles:?}\n{}",
        nodes
            .nodes
            .iter()
            .map(|n| format!("--- {}\n{}", n.name, n.log_text()))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let urls = nodes.urls();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let (stop_dash_tx, stop_dash) = tokio::sync::watch::channel(false);
    let mut sender_logs = Vec::new();
    let mut dash_logs = Vec::new();
    let mut tasks = Vec::new();
    for k in 0..3 {
        let log = Arc::new(Mutex::new(SenderLog::default()));
        let mine: Vec<String> = (0..3).map(|i| urls[(k + i) % 3].clone()).collect();
        tasks.push(tokio::spawn(sender(
            format!("s{k}"),
            mine,
            pace,
            stop.clone(),
            Arc::clone(&log),
        )));
        sender_logs.push(log);
        let d = Arc::new(Mutex::new(DashLog {
            node: format!("slot {k}"),
            ..DashLog::default()
        }));
        tasks.push(tokio::spawn(dashboard(
            urls[k].clone(),
            stop_dash.clone(),
            Arc::clone(&d),
        )));
        dash_logs.push(d);
    }
    // Warm up: every sender acknowledged.
    let zero = vec![0; 3];
    let warm = Instant::now();
    while !all_acked_since(&sender_logs, &zero) {
        assert!(
            warm.elapsed() < Duration::from_secs(30),
            "no sender was acknowledged within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut record = Vec::new();
    let mut two_live = 0;
    for pass in 0..passes {
        let mut order = FAULTS.to_vec();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for fault in order {
            let Some(live) = nodes.live(Duration::from_secs(30)).await else {
                panic!(
                    "no single live node before {fault:?} (seed {seed}): {:?}",
                    nodes.roles().await
                );
            };
            let before = ack_counts(&sender_logs);
            let hold_for = hold + Duration::from_millis(rng.below(1000));
            let injected = Instant::now();
            let mut killed = None;
            let detail = match fault {
                Fault::CutLiveFromNats => {
                    let mut n = [0; 3];
                    n[live] = 1;
                    net.sides([0; 3], n);
                    format!("node slot {live} cut from every NATS server")
                }
                Fault::LiveWithMinority => {
                    let m = net.server_of(live);
                    let mut s = [0; 3];
                    let mut n = [0; 3];
                    s[m] = 1;
                    n[live] = 1;
                    net.sides(s, n);
                    format!("node slot {live} and NATS server {m} apart from the rest")
                }
                Fault::CutRoute => {
                    let a = rng.below(3) as usize;
                    let b = (a + 1 + rng.below(2) as usize) % 3;
                    net.routes[a][b].as_ref().unwrap().set(false);
                    net.routes[b][a].as_ref().unwrap().set(false);
                    format!("routes between NATS servers {a} and {b} cut")
                }
                Fault::PauseLive => {
                    nodes.nodes[live].signal("STOP");
                    format!("node slot {live} ({}) SIGSTOPped", nodes.nodes[live].name)
                }
                Fault::KillNats => {
                    let r = rng.below(3) as usize;
                    killed = Some(r);
                    net.nats[r].kill();
                    // The nodes on it move to the next server (as a client told of the others
                    // would).
                    let next = net.nats[(r + 1) % 3].port;
                    for link in &net.links {
                        if link.target() == net.nats[r].port {
                            link.retarget(next);
                        }
                    }
                    format!("NATS server {r} SIGKILLed")
                }
            };
            // While the fault holds, watch for two live nodes at once.
            let until = Instant::now() + hold_for;
            while Instant::now() < until {
                let roles = nodes.roles().await;
                if roles.iter().filter(|r| **r == Role::Live).count() > 1 {
                    two_live += 1;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let during = ack_counts(&sender_logs);
            match fault {
                Fault::PauseLive => nodes.nodes[live].signal("CONT"),
                Fault::KillNats => {
                    if let Some(r) = killed {
                        net.nats[r].restart();
                    }
                }
                _ => net.heal(),
            }
            let healed = Instant::now();
            // Recovered: one live node and every sender acknowledged again.
            let after = ack_counts(&sender_logs);
            let mut recovered = None;
            let mut restarted = Vec::new();
            let mut looked = Instant::now();
            while healed.elapsed() < Duration::from_secs(60) {
                if all_acked_since(&sender_logs, &after) {
                    recovered = Some(healed.elapsed());
                    break;
                }
                // A node that stopped (diverged, or exited) is restarted, as a supervisor
                // would restart it (its /health stays 503 otherwise).
                if looked.elapsed() > Duration::from_secs(2) {
                    restarted.extend(nodes.restart_broken(&net, &logs).await);
                    looked = Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            restarted.extend(nodes.restart_broken(&net, &logs).await);
            let line =
                format!(
                "pass {pass}: {fault:?} ({detail}) for {:.1} s: acks during the fault {:?}; every \
                 sender acknowledged again {} after the heal; restarted: {}",
                hold_for.as_secs_f64(),
                during.iter().zip(&before).map(|(d, b)| d - b).collect::<Vec<_>>(),
                recovered.map_or("NEVER (60 s)".into(), |d| format!("{:.2} s", d.as_secs_f64())),
                if restarted.is_empty() { "none".into() } else { restarted.join("; ") },
            );
            eprintln!(
                "faults: {line} (at {:.1} s)",
                injected.duration_since(run_started).as_secs_f64()
            );
            record.push(line);
            if recovered.is_none() {
                for n in &nodes.nodes {
                    let _ = std::fs::write(logs.join(format!("{}.log", n.name)), n.log_text());
                }
            }
            assert!(
                recovered.is_some(),
                "not recovered after {fault:?} (seed {seed}): {record:#?}"
            );
        }
    }
    // Final heal: every node up, the senders stopped, the dashboards caught up.
    net.heal();
    let final_live = nodes.live(Duration::from_secs(30)).await;
    assert!(
        final_live.is_some(),
        "no single live node at the end (seed {seed})"
    );
    let settle_started = Instant::now();
    while !nodes
        .roles()
        .await
        .iter()
        .all(|r| matches!(r, Role::Live | Role::Standby))
    {
        assert!(
            settle_started.elapsed() < Duration::from_secs(40),
            "nodes did not settle"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The senders stop; then the dashboards are given until they were shown the log's last
    // message event (20 s), and stop.
    stop_tx.send_replace(true);
    for t in tasks.iter_mut().step_by(2) {
        let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
    }
    let live_url = nodes.urls()[final_live.unwrap()].clone();
    let reference = common::within(Duration::from_secs(30), async {
        loop {
            if let Ok(r) = replay(&live_url).await {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let caught_up = Instant::now();
    while caught_up.elapsed() < Duration::from_secs(20)
        && !dash_logs.iter().all(|d| {
            d.lock().unwrap().events.last().map(|e| &e.id) == reference.last().map(|e| &e.id)
        })
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_dash_tx.send_replace(true);
    for t in tasks.drain(..).skip(1).step_by(2) {
        let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
    }
    // Every node's replay (a standby's once it has followed to the end).
    let mut replays = Vec::new();
    for (k, url) in nodes.urls().iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(20);
        let r = loop {
            match replay(url).await {
                Ok(r) if r.len() >= reference.len() || Instant::now() >= deadline => break r,
                _ if Instant::now() >= deadline => break Vec::new(),
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        replays.push((format!("slot {k} ({})", nodes.nodes[k].name), r));
    }
    let senders: Vec<SenderLog> = sender_logs
        .iter()
        .map(|s| std::mem::take(&mut *s.lock().unwrap()))
        .collect();
    let dashes: Vec<DashLog> = dash_logs
        .iter()
        .map(|d| std::mem::take(&mut *d.lock().unwrap()))
        .collect();
    for n in &nodes.nodes {
        let _ = std::fs::write(logs.join(format!("{}.log", n.name)), n.log_text());
    }
    let verdict = check(&senders, &dashes, &reference, &replays);
    let total: usize = senders.iter().map(|s| s.acked.len()).sum();
    // Written to the process's stderr itself, past the test harness's capture: the summary is
    // in CI's log whether the run passes or fails.
    let mut out = format!(
        "faults checker: seed {seed}, {} faults in {:.1} s, {} message events in the log, {total} \
         acknowledged, two live nodes seen by /health at once {two_live} times\n",
        record.len(),
        run_started.elapsed().as_secs_f64(),
        reference.len()
    );
    for l in &record {
        out.push_str(&format!("  fault: {l}\n"));
    }
    for l in &verdict.summary {
        out.push_str(&format!("  {l}\n"));
    }
    for l in &verdict.violations {
        out.push_str(&format!("  VIOLATION: {l}\n"));
    }
    {
        use std::io::Write as _;
        let _ = std::io::stderr().write_all(out.as_bytes());
    }
    assert!(
        verdict.violations.is_empty(),
        "the checker found {} violations (seed {seed}; MAP_FAULTS_SEED={seed} repeats the run's \
         choices): {:#?}",
        verdict.violations.len(),
        verdict.violations
    );
}
