//! Supervised subprocess agents: launch, pipe, watch, restart, stop and reap child processes
//! that speak MAP as NDJSON on their stdin/stdout.
//!
//! The [`Supervisor`] owns processes; the router owns agent state (`router::supervision`). One
//! *keeper* task per supervised agent runs the process's whole life:
//!
//! 1. launch it (contained: own process group, dies with the router, see [`os`]), with
//!    `MAP_AGENT_ID`, `MAP_AGENT_NAME`, `MAP_PARENT_ID` and `MAP_TRANSPORT=stdio` in its
//!    environment;
//! 2. serve its pipes with the same connection driver as every transport (origin
//!    `Supervised`, so its registration becomes the reserved agent); lines on its stdout that
//!    are not JSON-RPC messages become `agent.diagnostic` events and log lines, never replies
//!    or a broken session;
//! 3. collect its stderr ([`output`]);
//! 4. on `stop`: wait `stop_timeout` for a graceful exit (the router has sent the agent a stop
//!    control message), then SIGTERM the group, wait `kill_timeout`, then SIGKILL; a forced stop
//!    starts at SIGTERM. A process that closes its stdout while alive is stopped the same way.
//!    Suspend and resume are SIGSTOP and SIGCONT to the group;
//! 5. reap it, SIGKILL whatever is left in its group, report the exit to the router, and
//!    restart it with exponential backoff when the policy and the router say so.
//!
//! A child that dies or stays silent during its handshake fails the spawn call (3004) and is
//! not restarted. On shutdown every child is stopped the same way with the shutdown timeouts.

pub mod handshake;
pub mod os;
pub mod output;

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{SinkExt, StreamExt};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::protocol::capabilities::Capability;
use crate::protocol::ids::AgentId;
use crate::protocol::jsonrpc::ErrorObject;
use crate::protocol::methods::agents::{
    CommandSpec, ProcessInfo, RestartMode, RestartPolicy, SpawnParams, SpawnResult,
};
use crate::router::agents::supervised::spawn_failure_cause;
use crate::router::agents::supervised::ExitInfo;
use crate::router::agents::supervised::ProcessControl;
use crate::router::dispatch::ProcessSpawner;
use crate::router::sessions::table::{ConnOrigin, Transport};
use crate::router::ConnId;
use crate::router::RouterError;
use crate::transport::connection::{ConnectionOptions, InFrame, OutFrame};
use crate::transport::{stdio, TransportContext};

use crate::process::handshake::Trace;
use crate::process::os::Signal;
use crate::process::output::Tail;

/// Timeouts for supervised processes (each overridable per spawn in `CommandSpec`).
#[derive(Debug, Clone)]
pub struct SupervisorSettings {
    /// Graceful stop → SIGTERM.
    pub stop_timeout: Duration,
    /// SIGTERM → SIGKILL.
    pub kill_timeout: Duration,
    /// Launch → registration, else the spawn fails.
    pub handshake_timeout: Duration,
    /// Both escalation steps during router shutdown.
    pub shutdown_timeout: Duration,
}

impl Default for SupervisorSettings {
    fn default() -> Self {
        Self {
            stop_timeout: Duration::from_secs(5),
            kill_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(2),
        }
    }
}

/// A process that ran at least this long resets the restart backoff.
const STABLE_RUN: Duration = Duration::from_secs(60);
/// Default restart limit.
const DEFAULT_MAX_RESTARTS: u32 = 5;
/// Default first backoff.
const DEFAULT_BACKOFF: Duration = Duration::from_millis(500);
/// Default backoff ceiling.
const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Most `agent.diagnostic` events per second per child (the rest are counted in logs).
const DIAGNOSTICS_PER_SECOND: u32 = 20;

#[derive(Debug)]
enum KeeperCmd {
    Control(ProcessControl),
    Shutdown,
}

#[derive(Debug)]
struct Keeper {
    tx: mpsc::Sender<KeeperCmd>,
    task: JoinHandle<()>,
}

#[derive(Debug)]
struct Inner {
    ctx: Mutex<Option<TransportContext>>,
    options: ConnectionOptions,
    settings: SupervisorSettings,
    keepers: Mutex<HashMap<AgentId, Keeper>>,
    spawner: os::Spawner,
}

/// The process supervisor (a cheap handle).
#[derive(Debug, Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

use crate::sync::lock;

fn spawn_failed(message: impl Into<String>) -> ErrorObject {
    RouterError::SpawnFailed(message.into()).to_error_object()
}

/// Drops a reservation whose spawn failed and returns the 3004 error for the spawner.
async fn cancel_spawn(
    router: &crate::router::RouterHandle,
    agent: &AgentId,
    msg: String,
) -> ErrorObject {
    let a = agent.clone();
    let m = msg.clone();
    let _ = router
        .with(move |r| r.cancel_supervised(&a, RouterError::SpawnFailed(m)))
        .await;
    spawn_failed(msg)
}

impl Supervisor {
    /// Starts a supervisor. The returned sender is what the router uses to send process
    /// controls (give it to `Router::spawn_with`).
    ///
    /// # Errors
    /// The spawning thread could not be started.
    pub fn start(
        settings: SupervisorSettings,
        options: ConnectionOptions,
    ) -> std::io::Result<(Self, mpsc::Sender<ProcessControl>)> {
        let inner = Arc::new(Inner {
            ctx: Mutex::new(None),
            options: stdio::pipe_options(options),
            settings,
            keepers: Mutex::new(HashMap::new()),
            spawner: os::Spawner::start()?,
        });
        let (tx, mut rx) = mpsc::channel::<ProcessControl>(1024);
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            while let Some(control) = rx.recv().await {
                let Some(inner) = weak.upgrade() else { break };
                let agent = match &control {
                    ProcessControl::Stop { agent, .. }
                    | ProcessControl::Suspend { agent }
                    | ProcessControl::Resume { agent } => agent.clone(),
                };
                let keeper = lock(&inner.keepers).get(&agent).map(|k| k.tx.clone());
                if let Some(k) = keeper {
                    let _ = k.send(KeeperCmd::Control(control)).await;
                }
            }
        });
        Ok((Self { inner }, tx))
    }

    /// Gives the supervisor the transport context it serves children with.
    pub fn bind(&self, ctx: TransportContext) {
        *lock(&self.inner.ctx) = Some(ctx);
    }

    /// A weak handle, for holders that must not keep the supervisor alive (the dispatcher).
    pub fn downgrade(&self) -> WeakSupervisor {
        WeakSupervisor(Arc::downgrade(&self.inner))
    }

    /// Process ids of the running supervised children (for tests and diagnostics).
    pub fn agents(&self) -> Vec<AgentId> {
        lock(&self.inner.keepers).keys().cloned().collect()
    }

    /// `map/agents/spawn` with a `command`: reserve, launch, wait for the handshake, send the
    /// initial message. `caller` is `None` for agents started from the router's config.
    ///
    /// # Errors
    /// The router's reservation errors (1003, 2001, 3000, ...), or 3004 when the process cannot
    /// be launched or does not register in time.
    pub async fn spawn(
        &self,
        caller: Option<ConnId>,
        params: SpawnParams,
    ) -> Result<SpawnResult, ErrorObject> {
        let ctx = lock(&self.inner.ctx)
            .clone()
            .ok_or_else(|| spawn_failed("the supervisor is shutting down"))?;
        let command = params
            .command
            .clone()
            .ok_or_else(|| ErrorObject::invalid_params("command is required"))?;
        if command.program.trim().is_empty() {
            return Err(ErrorObject::invalid_params(
                "command.program must not be empty",
            ));
        }
        let router = ctx.router.clone();
        let reserve_params = params.clone();
        let (agent, parent, waiter) = match caller {
            Some(conn) => {
                router
                    .call(conn, Some(Capability::CanSpawn), true, move |r, ctx| {
                        r.reserve_supervised(Some(ctx), &reserve_params)
                    })
                    .await?
            }
            None => {
                router
                    .with(move |r| r.reserve_supervised(None, &reserve_params))
                    .await??
            }
        };
        let mut env = vec![
            ("MAP_AGENT_ID".to_owned(), agent.to_string()),
            ("MAP_TRANSPORT".to_owned(), "stdio".to_owned()),
        ];
        if let Some(name) = &params.register.name {
            env.push(("MAP_AGENT_NAME".to_owned(), name.clone()));
        }
        if let Some(parent) = &parent {
            env.push(("MAP_PARENT_ID".to_owned(), parent.to_string()));
        }
        let (first_tx, first_rx) = oneshot::channel();
        let watch = Watch::default();
        self.start_keeper(
            &ctx,
            agent.clone(),
            command.clone(),
            env,
            watch.clone(),
            first_tx,
        );
        let pid = match first_rx.await {
            Ok(Ok(pid)) => pid,
            other => {
                let why = match other {
                    Ok(Err(why)) => why,
                    _ => "the supervisor stopped".to_owned(),
                };
                let msg = format!("cannot start `{}`: {why}", command.program);
                return Err(cancel_spawn(&router, &agent, msg).await);
            }
        };
        let handshake = command
            .handshake_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(self.inner.settings.handshake_timeout);
        let registered = match tokio::time::timeout(handshake, waiter).await {
            Ok(Ok(Ok(agent))) => agent,
            Ok(Ok(Err(e))) => return Err(e.to_error_object()),
            Ok(Err(_)) => return Err(spawn_failed("the reservation was dropped")),
            Err(_) => {
                self.control(ProcessControl::Stop {
                    agent: agent.clone(),
                    force: true,
                })
                .await;
                let msg = format!(
                    "process {pid} did not register within {} ms{}",
                    handshake.as_millis(),
                    spawn_failure_cause(watch.trace.last_error().as_deref(), &watch.tail.lines())
                );
                return Err(cancel_spawn(&router, &agent, msg).await);
            }
        };
        let message_id = match (caller, params.initial_message) {
            (Some(conn), Some(initial)) => {
                let to = crate::protocol::json::RawJson::from(
                    serde_json::json!({ "agent": registered.id }),
                );
                let d = router
                    .call(conn, Some(Capability::CanSend), true, move |r, ctx| {
                        let caller = r.caller(ctx)?;
                        r.deliver_message(&caller, to, initial.payload, initial.meta, Vec::new())
                    })
                    .await?;
                Some(d.message_id)
            }
            _ => None,
        };
        Ok(SpawnResult {
            agent: registered,
            message_id,
            process: Some(ProcessInfo {
                pid,
                program: command.program,
            }),
        })
    }

    async fn control(&self, control: ProcessControl) {
        let agent = match &control {
            ProcessControl::Stop { agent, .. }
            | ProcessControl::Suspend { agent }
            | ProcessControl::Resume { agent } => agent.clone(),
        };
        let keeper = lock(&self.inner.keepers).get(&agent).map(|k| k.tx.clone());
        if let Some(k) = keeper {
            let _ = k.send(KeeperCmd::Control(control)).await;
        }
    }

    fn start_keeper(
        &self,
        ctx: &TransportContext,
        agent: AgentId,
        command: CommandSpec,
        env: Vec<(String, String)>,
        watch: Watch,
        first: oneshot::Sender<Result<u32, String>>,
    ) {
        let (tx, rx) = mpsc::channel(16);
        let keeper = KeeperTask {
            agent: agent.clone(),
            command,
            env,
            watch,
            ctx: ctx.clone(),
            options: self.inner.options.clone(),
            settings: self.inner.settings.clone(),
            spawner: self.inner.spawner.clone(),
            supervisor: Arc::downgrade(&self.inner),
        };
        let task = tokio::spawn(keeper.run(rx, first));
        lock(&self.inner.keepers).insert(agent, Keeper { tx, task });
    }

    /// Stops every child (graceful, SIGTERM, SIGKILL with the shutdown timeouts), reaps them,
    /// and stops accepting spawns.
    pub async fn shutdown(&self) {
        let ctx = lock(&self.inner.ctx).take();
        drop(ctx);
        let keepers: Vec<Keeper> = lock(&self.inner.keepers).drain().map(|(_, k)| k).collect();
        for k in &keepers {
            let _ = k.tx.send(KeeperCmd::Shutdown).await;
        }
        let budget = self.inner.settings.shutdown_timeout * 2 + Duration::from_secs(2);
        for k in keepers {
            let abort = k.task.abort_handle();
            if tokio::time::timeout(budget, k.task).await.is_err() {
                // Dropping the task drops its `Child`, which SIGKILLs it (kill_on_drop).
                abort.abort();
            }
        }
    }
}

/// A supervisor handle that does not keep it alive.
#[derive(Debug, Clone)]
pub struct WeakSupervisor(Weak<Inner>);

impl WeakSupervisor {
    /// The supervisor, if it still exists.
    pub fn upgrade(&self) -> Option<Supervisor> {
        self.0.upgrade().map(|inner| Supervisor { inner })
    }
}

/// How the method table reaches the supervisor (weakly: the table does not keep it alive).
impl ProcessSpawner for WeakSupervisor {
    fn spawn(
        &self,
        caller: ConnId,
        params: SpawnParams,
    ) -> BoxFuture<'static, Result<SpawnResult, ErrorObject>> {
        let supervisor = self.upgrade();
        Box::pin(async move {
            match supervisor {
                Some(s) => s.spawn(Some(caller), params).await,
                None => Err(spawn_failed("the process supervisor has stopped")),
            }
        })
    }
}

/// Whether a line from a child's stdout is a JSON-RPC message (object or batch).
fn is_json_message(line: &str) -> bool {
    let t = line.trim_start();
    (t.starts_with('{') || t.starts_with('['))
        && serde_json::from_str::<&serde_json::value::RawValue>(line).is_ok()
}

fn truncate(line: &str, max: usize) -> String {
    if line.len() <= max {
        return line.to_owned();
    }
    let mut end = max;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

/// Stop escalation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// Waiting for a graceful exit until the deadline, then SIGTERM.
    Graceful,
    /// SIGTERM sent; SIGKILL at the deadline.
    Terminating,
    /// SIGKILL sent.
    Killed,
}

/// What the keeper collects about the current run of a process, shared with the spawn call
/// that waits for its handshake (a failed spawn reports the cause).
#[derive(Debug, Default, Clone)]
struct Watch {
    tail: Tail,
    trace: Trace,
}

struct KeeperTask {
    agent: AgentId,
    command: CommandSpec,
    env: Vec<(String, String)>,
    watch: Watch,
    ctx: TransportContext,
    options: ConnectionOptions,
    settings: SupervisorSettings,
    spawner: os::Spawner,
    supervisor: Weak<Inner>,
}

impl KeeperTask {
    fn build(&self) -> Command {
        let mut cmd = Command::new(&self.command.program);
        cmd.args(&self.command.args)
            .envs(self.command.env.iter())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(dir) = &self.command.cwd {
            cmd.current_dir(dir);
        }
        os::contain(&mut cmd);
        cmd
    }

    fn policy(&self) -> RestartPolicy {
        self.command.restart.clone().unwrap_or_default()
    }

    async fn run(
        self,
        mut rx: mpsc::Receiver<KeeperCmd>,
        first: oneshot::Sender<Result<u32, String>>,
    ) {
        let mut first = Some(first);
        let mut restarts: u32 = 0;
        let mut consecutive: u32 = 0;
        let tail = self.watch.tail.clone();
        loop {
            tail.clear();
            self.watch.trace.clear();
            let started = Instant::now();
            let child = match self.spawner.spawn(self.build()).await {
                Ok(child) => child,
                Err(e) => {
                    if let Some(f) = first.take() {
                        let _ = f.send(Err(e.to_string()));
                        break;
                    }
                    tracing::warn!(agent = %self.agent, error = %e, "restart failed to launch");
                    // Counts as a failed run.
                    let info = ExitInfo {
                        code: None,
                        signal: None,
                        stderr_tail: vec![format!("cannot start: {e}")],
                        requested: false,
                        policy_restarts: self.policy_allows(None, restarts),
                        last_error: None,
                    };
                    if !self.report(0, info).await {
                        break;
                    }
                    restarts += 1;
                    consecutive += 1;
                    if !self.backoff(consecutive, &mut rx).await {
                        break;
                    }
                    continue;
                }
            };
            let Some(pid) = child.id() else {
                if let Some(f) = first.take() {
                    let _ = f.send(Err("the process exited immediately".into()));
                }
                break;
            };
            tracing::info!(agent = %self.agent, pid, program = %self.command.program, "started supervised process");
            {
                let agent = self.agent.clone();
                let program = self.command.program.clone();
                let _ = self
                    .ctx
                    .router
                    .with(move |r| r.supervised_launched(&agent, pid, &program))
                    .await;
            }
            if let Some(f) = first.take() {
                let _ = f.send(Ok(pid));
            }
            let (status, requested, shutdown) = self.supervise(child, pid, &tail, &mut rx).await;
            let code = status.as_ref().and_then(|s| s.code());
            let signal = status.as_ref().and_then(os::exit_signal);
            tracing::info!(agent = %self.agent, pid, ?code, ?signal, requested, "supervised process exited");
            if started.elapsed() >= STABLE_RUN {
                consecutive = 0;
            }
            let info = ExitInfo {
                code,
                signal,
                stderr_tail: tail.lines(),
                requested: requested || shutdown,
                policy_restarts: !shutdown && self.policy_allows(code, restarts),
                last_error: self.watch.trace.last_error(),
            };
            if !self.report(pid, info).await || shutdown {
                break;
            }
            restarts += 1;
            consecutive += 1;
            if !self.backoff(consecutive, &mut rx).await {
                // Stopped while waiting to restart: record it as a requested stop.
                let info = ExitInfo {
                    code,
                    signal,
                    stderr_tail: tail.lines(),
                    requested: true,
                    policy_restarts: false,
                    last_error: self.watch.trace.last_error(),
                };
                self.report(pid, info).await;
                break;
            }
        }
        if let Some(inner) = self.supervisor.upgrade() {
            lock(&inner.keepers).remove(&self.agent);
        }
    }

    fn policy_allows(&self, code: Option<i32>, restarts: u32) -> bool {
        let policy = self.policy();
        if restarts >= policy.max_restarts.unwrap_or(DEFAULT_MAX_RESTARTS) {
            return false;
        }
        match policy.mode {
            RestartMode::Never => false,
            RestartMode::OnFailure => code != Some(0),
            RestartMode::Always => true,
        }
    }

    /// Tells the router; returns whether to restart.
    async fn report(&self, pid: u32, info: ExitInfo) -> bool {
        let agent = self.agent.clone();
        self.ctx
            .router
            .with(move |r| r.supervised_exited(&agent, pid, info))
            .await
            .unwrap_or(false)
    }

    /// Waits the backoff for the `n`th consecutive restart. False when told to stop meanwhile.
    async fn backoff(&self, n: u32, rx: &mut mpsc::Receiver<KeeperCmd>) -> bool {
        let policy = self.policy();
        let base = policy
            .backoff_ms
            .map(Duration::from_millis)
            .unwrap_or(DEFAULT_BACKOFF);
        let max = policy
            .max_backoff_ms
            .map(Duration::from_millis)
            .unwrap_or(DEFAULT_MAX_BACKOFF);
        let delay = base
            .saturating_mul(1u32 << n.saturating_sub(1).min(16))
            .min(max);
        tracing::info!(agent = %self.agent, delay_ms = delay.as_millis() as u64, "restarting after backoff");
        let deadline = Instant::now() + delay;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return true,
                cmd = rx.recv() => match cmd {
                    Some(KeeperCmd::Control(ProcessControl::Stop { .. }))
                    | Some(KeeperCmd::Shutdown)
                    | None => return false,
                    Some(KeeperCmd::Control(_)) => {}
                },
            }
        }
    }

    /// Runs one process to its end. Returns its status (None if waiting failed), whether its
    /// end was requested, and whether the router is shutting down.
    async fn supervise(
        &self,
        mut child: Child,
        pid: u32,
        tail: &Tail,
        rx: &mut mpsc::Receiver<KeeperCmd>,
    ) -> (Option<std::process::ExitStatus>, bool, bool) {
        let stdout = child.stdout.take();
        let stdin = child.stdin.take();
        let stderr = child.stderr.take();
        let mut conn_task = match (stdout, stdin) {
            (Some(out), Some(inp)) => Some(tokio::spawn(serve_child(
                self.ctx.clone(),
                self.agent.clone(),
                pid,
                out,
                inp,
                self.options.clone(),
                self.watch.trace.clone(),
            ))),
            _ => None,
        };
        let stderr_task = stderr.map(|err| {
            tokio::spawn(output::collect(
                err,
                self.agent.clone(),
                pid,
                self.ctx.router.clone(),
                tail.clone(),
            ))
        });
        let stop_timeout = self
            .command
            .stop_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(self.settings.stop_timeout);
        let kill_timeout = self
            .command
            .kill_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(self.settings.kill_timeout);
        let mut phase = Phase::Running;
        let mut deadline: Option<Instant> = None;
        let mut requested = false;
        let mut shutdown = false;
        let mut suspended = false;
        let mut commands_open = true;
        let signal = |s: Signal| {
            if let Err(e) = os::signal_group(pid, s) {
                tracing::warn!(pid, signal = ?s, error = %e, "cannot signal process group");
            }
        };
        let status = loop {
            tokio::select! {
                status = child.wait() => break status.ok(),
                done = async { conn_task.as_mut().expect("guarded").await }, if conn_task.is_some() => {
                    let _ = done;
                    conn_task = None;
                    if phase == Phase::Running {
                        tracing::info!(agent = %self.agent, pid, "process closed its MAP channel; stopping it");
                        phase = Phase::Graceful;
                        deadline = Some(Instant::now() + stop_timeout);
                    }
                }
                cmd = rx.recv(), if commands_open => {
                    let (force, grace) = match cmd {
                        Some(KeeperCmd::Control(ProcessControl::Stop { force, .. })) => {
                            requested = true;
                            (force, stop_timeout)
                        }
                        Some(KeeperCmd::Shutdown) => {
                            requested = true;
                            shutdown = true;
                            (false, self.settings.shutdown_timeout)
                        }
                        Some(KeeperCmd::Control(ProcessControl::Suspend { .. })) => {
                            if phase == Phase::Running {
                                signal(Signal::Stop);
                                suspended = true;
                            }
                            continue;
                        }
                        Some(KeeperCmd::Control(ProcessControl::Resume { .. })) => {
                            signal(Signal::Cont);
                            suspended = false;
                            continue;
                        }
                        None => {
                            commands_open = false;
                            requested = true;
                            (true, Duration::ZERO)
                        }
                    };
                    if suspended {
                        // A stopped process cannot act on SIGTERM or a stop request.
                        signal(Signal::Cont);
                        suspended = false;
                    }
                    let term_timeout = if shutdown { self.settings.shutdown_timeout } else { kill_timeout };
                    match phase {
                        Phase::Running | Phase::Graceful if force => {
                            signal(Signal::Term);
                            phase = Phase::Terminating;
                            deadline = Some(Instant::now() + term_timeout);
                        }
                        Phase::Running => {
                            phase = Phase::Graceful;
                            deadline = Some(Instant::now() + grace);
                        }
                        Phase::Graceful if shutdown => {
                            deadline = Some(deadline.map_or(Instant::now() + grace, |d| d.min(Instant::now() + grace)));
                        }
                        _ => {}
                    }
                }
                () = sleep_until(deadline) => {
                    match phase {
                        Phase::Graceful => {
                            tracing::info!(agent = %self.agent, pid, "no graceful exit; sending SIGTERM");
                            signal(Signal::Term);
                            phase = Phase::Terminating;
                            let t = if shutdown { self.settings.shutdown_timeout } else { kill_timeout };
                            deadline = Some(Instant::now() + t);
                        }
                        Phase::Terminating => {
                            tracing::warn!(agent = %self.agent, pid, "SIGTERM ignored; sending SIGKILL");
                            signal(Signal::Kill);
                            phase = Phase::Killed;
                            deadline = None;
                        }
                        Phase::Running | Phase::Killed => deadline = None,
                    }
                }
            }
        };
        // Whatever the child left running in its group goes with it.
        let _ = os::signal_group(pid, Signal::Kill);
        if let Some(task) = stderr_task {
            let _ = tokio::time::timeout(Duration::from_secs(1), task).await;
        }
        if let Some(task) = conn_task {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(1), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        (status, requested, shutdown)
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Serves a child's pipes; non-JSON lines become diagnostics instead of replies. `trace`
/// taps both directions (requests in, error answers out) to explain a failed handshake.
async fn serve_child(
    ctx: TransportContext,
    agent: AgentId,
    pid: u32,
    stdout: tokio::process::ChildStdout,
    stdin: tokio::process::ChildStdin,
    options: ConnectionOptions,
    trace: Trace,
) {
    let mut opts = options;
    opts.transport = Transport::Pipes;
    opts.origin = ConnOrigin::Supervised {
        agent: agent.clone(),
        pid,
    };
    let (stream, sink) = stdio::framed(stdout, stdin, opts.max_frame_bytes);
    let answers = trace.clone();
    let sink = sink.with(move |frame: OutFrame| {
        if let OutFrame::Text(text) = &frame {
            answers.answer(text);
        }
        futures::future::ready(Ok::<_, std::io::Error>(frame))
    });
    let router = ctx.router.clone();
    let limiter = Arc::new(Mutex::new((Instant::now(), 0u32, 0u64)));
    let stream = stream.filter_map(move |frame| {
        let router = router.clone();
        let agent = agent.clone();
        let limiter = limiter.clone();
        let trace = trace.clone();
        async move {
            let (line, error) = match frame {
                Ok(InFrame::Text(line)) if is_json_message(&line) => {
                    trace.request(&line);
                    return Some(Ok(InFrame::Text(line)));
                }
                Ok(InFrame::Text(line)) => (line, "not a JSON-RPC message".to_owned()),
                Ok(InFrame::TooLarge { len }) => (
                    format!("<{len} bytes>"),
                    "line longer than the frame limit".to_owned(),
                ),
                Ok(InFrame::BadUtf8) => ("<not UTF-8>".to_owned(), "line is not UTF-8".to_owned()),
                other => return Some(other),
            };
            tracing::warn!(target: "map_router::child", agent = %agent, pid, "stdout: {}: {}", error, truncate(&line, 200));
            let publish = {
                let mut l = lock(&limiter);
                if l.0.elapsed() >= Duration::from_secs(1) {
                    *l = (Instant::now(), 0, l.2);
                }
                l.1 += 1;
                if l.1 > DIAGNOSTICS_PER_SECOND {
                    l.2 += 1;
                    false
                } else {
                    true
                }
            };
            if publish {
                let line = truncate(&line, 1024);
                let _ = router
                    .with(move |r| r.supervised_diagnostic(&agent, pid, line, error))
                    .await;
            }
            None
        }
    });
    ctx.serve(Box::pin(stream), sink, opts).await;
}
