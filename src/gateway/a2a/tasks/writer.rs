//! The task writer: the one owner of every change to an A2A task's record.
//!
//! Owns: the table of tasks with a change in flight and the changes queued behind it. Every
//! change of a task's `meta.a2a` (MAP merges `meta` one key deep, so each change is a whole
//! read-modify-write of the record) is a [`Change`] sent to the writer task over a bounded
//! channel ([`QUEUE`]) by a [`Writer`] handle: a caller's follow-up, a cancel, the record of a
//! new task, an agent's report, the end of an interrupted or orphaned task.
//!
//! Order: the changes of one task are applied one at a time, in the order they reached the
//! channel; the changes of different tasks run side by side (each in a task of its own,
//! tracked by the writer), so a slow or refused update of one task never waits for another's.
//! No lock is held anywhere: the writer's table is its own, and the MAP calls of a change are
//! made by the change's own task, which the writer only starts and hears back from.
//!
//! The shape is async-nats' handle and owner (`Client` holds a `Sender<Command>`, the
//! connection handler owns the state; `docs/architecture.md`, the `a2a/tasks/` rows).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::task::{Id, JoinError, JoinSet};

use crate::gateway::a2a::error::A2aError;
use crate::gateway::a2a::record::{AgentReport, MapTask, Record};
use crate::gateway::a2a::wire::{Message, TaskState};
use crate::protocol::json::RawJson;
use crate::protocol::trace::TraceContext;

use super::books::Books;
use super::replies;
use super::target::Target;

/// Changes waiting to reach the writer at most (its channel's capacity). A sender waits for a
/// place, so a burst of agent reports slows their reader (the gateway agent's inbox).
pub const QUEUE: usize = 1024;

/// Changes the writer holds at most, running or queued behind a running change of their task.
/// Past that it takes no more from its channel until one is done: the channel fills and the
/// senders wait (nothing is dropped), so the writer's memory is bounded whatever callers and
/// agents send.
pub const MAX_HELD: usize = 4096;

/// An edit of a task's record: returns what becomes `meta.result`, or an error to leave the
/// task as it was.
pub(super) type Edit = Box<dyn FnOnce(&mut Record) -> Result<Option<RawJson>, A2aError> + Send>;

/// One change of one task, and where its outcome goes.
pub(super) enum Change {
    /// A new task's first records: `first` (`submitted`: webhooks get the task first), then
    /// `working`.
    Created {
        /// As made (boxed, as `working`: records are large, most changes are not these).
        first: Box<Record>,
        /// What follows at once.
        working: Box<Record>,
        /// Whether both were written.
        done: oneshot::Sender<Result<(), A2aError>>,
        /// The caller's trace context (`params._meta` of the writes).
        trace: Option<TraceContext>,
    },
    /// Read the task (as `target` serves it), apply `edit`, write it back.
    Edit {
        /// Where the request that edits it was addressed.
        target: Target,
        /// The edit.
        edit: Edit,
        /// The record as written.
        done: oneshot::Sender<Result<Record, A2aError>>,
        /// The caller's trace context (`params._meta` of the write).
        trace: Option<TraceContext>,
    },
    /// An agent's message about the task (`replies.rs`); its outcome is logged there.
    Report {
        /// The agent that sent it.
        from: String,
        /// What it says.
        report: AgentReport,
        /// The trace context of its delivery (`params._meta` of the write).
        trace: Option<TraceContext>,
    },
    /// End the task `failed` with `reason` if it still waits and `when` holds (`orphans.rs`
    /// finds such tasks).
    End {
        /// The status message.
        reason: String,
        /// The condition, checked on the task as read.
        when: EndWhen,
        /// Whether it ended it.
        done: oneshot::Sender<bool>,
    },
}

impl std::fmt::Debug for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Created { .. } => "Created",
            Self::Edit { .. } => "Edit",
            Self::Report { .. } => "Report",
            Self::End { .. } => "End",
        })
    }
}

/// What the writer task receives.
#[derive(Debug)]
struct Command {
    /// The task changed.
    task: String,
    change: Change,
}

/// The handle: sends changes to the writer task (cheap to clone).
#[derive(Debug, Clone)]
pub(super) struct Writer {
    tx: mpsc::Sender<Command>,
}

/// What applies a change: the books (MAP calls); a recorder in the tests.
pub(super) trait Apply: Send + Sync + 'static {
    /// Applies `change` of task `id` and answers whoever waits for it.
    fn apply(self: Arc<Self>, id: String, change: Change) -> impl Future<Output = ()> + Send;
}

impl Apply for Books {
    async fn apply(self: Arc<Self>, id: String, change: Change) {
        apply(&self, &id, change).await;
    }
}

impl Writer {
    /// Starts the writer task over `books`; it ends when every handle is gone and the changes
    /// it took are applied.
    pub(super) fn start<A: Apply>(books: Arc<A>) -> Self {
        Self::start_bounded(books, QUEUE, MAX_HELD)
    }

    /// [`Writer::start`] with a channel of `queue` places and at most `max_held` changes held.
    fn start_bounded<A: Apply>(books: Arc<A>, queue: usize, max_held: usize) -> Self {
        let (tx, rx) = mpsc::channel(queue);
        let owner = Owner {
            rx,
            books,
            queued: HashMap::new(),
            running: JoinSet::new(),
            ids: HashMap::new(),
            held: 0,
            max_held: max_held.max(1),
        };
        tokio::spawn(owner.run());
        Self { tx }
    }

    /// Queues `change` of task `id`.
    async fn send(&self, id: &str, change: Change) -> Result<(), A2aError> {
        let command = Command {
            task: id.to_owned(),
            change,
        };
        self.tx.send(command).await.map_err(|_| stopped())
    }

    /// Writes a new task's first records, in order.
    ///
    /// # Errors
    /// The first write that failed.
    pub(super) async fn created(
        &self,
        id: &str,
        first: Record,
        working: Record,
        trace: Option<TraceContext>,
    ) -> Result<(), A2aError> {
        let (done, outcome) = oneshot::channel();
        let change = Change::Created {
            first: Box::new(first),
            working: Box::new(working),
            done,
            trace,
        };
        self.send(id, change).await?;
        outcome.await.map_err(|_| stopped())?
    }

    /// Reads task `id` (as `target` serves it), applies `edit`, writes it back; the record as
    /// written.
    ///
    /// # Errors
    /// The task is not there (as `target` serves it), `edit` refused, or the write failed.
    pub(super) async fn edit(
        &self,
        target: &Target,
        id: &str,
        edit: Edit,
        trace: Option<TraceContext>,
    ) -> Result<Record, A2aError> {
        let (done, outcome) = oneshot::channel();
        let change = Change::Edit {
            target: target.clone(),
            edit,
            done,
            trace,
        };
        self.send(id, change).await?;
        outcome.await.map_err(|_| stopped())?
    }

    /// Queues an agent's report about task `id` (not awaited: its outcome is logged), with the
    /// trace context of its delivery.
    pub(super) async fn report(
        &self,
        id: &str,
        from: String,
        report: AgentReport,
        trace: Option<TraceContext>,
    ) {
        if self
            .send(
                id,
                Change::Report {
                    from,
                    report,
                    trace,
                },
            )
            .await
            .is_err()
        {
            tracing::debug!(task = %id, "a2a gateway: agent message not applied (the gateway stopped)");
        }
    }

    /// Ends task `id` `failed` with `reason` if it still waits and `when` holds; whether it
    /// did.
    pub(super) async fn end(&self, id: &str, reason: String, when: EndWhen) -> bool {
        let (done, outcome) = oneshot::channel();
        let change = Change::End { reason, when, done };
        if self.send(id, change).await.is_err() {
            return false;
        }
        outcome.await.unwrap_or(false)
    }
}

/// The writer's answer when it has stopped (the gateway is going away).
fn stopped() -> A2aError {
    A2aError::internal("the A2A task writer has stopped")
}

/// The writer task's state.
struct Owner<A> {
    rx: mpsc::Receiver<Command>,
    /// What applies the changes.
    books: Arc<A>,
    /// The tasks with a change running, each with the changes waiting behind it (in arrival
    /// order). A task is here exactly while one of its changes runs.
    queued: HashMap<String, VecDeque<Change>>,
    /// The running changes; each yields its task's id.
    running: JoinSet<String>,
    /// The task of each running change, by the id of the tokio task that runs it (to find the
    /// task of a change that panicked).
    ids: HashMap<Id, String>,
    /// Changes running or queued ([`MAX_HELD`] at most).
    held: usize,
    /// The bound on `held`.
    max_held: usize,
}

impl<A: Apply> Owner<A> {
    async fn run(mut self) {
        loop {
            tokio::select! {
                command = self.rx.recv(), if self.held < self.max_held => match command {
                    Some(command) => self.handle_command(command),
                    None => break,
                },
                Some(done) = self.running.join_next_with_id(), if !self.running.is_empty() => {
                    self.handle_done(done);
                }
            }
        }
        // Every handle is gone: apply what was taken, then stop.
        while let Some(done) = self.running.join_next_with_id().await {
            self.handle_done(done);
        }
    }

    /// A new change: runs at once when its task has none running, else waits its turn.
    fn handle_command(&mut self, command: Command) {
        self.held += 1;
        match self.queued.get_mut(&command.task) {
            Some(waiting) => waiting.push_back(command.change),
            None => {
                self.queued.insert(command.task.clone(), VecDeque::new());
                self.start(command.task, command.change);
            }
        }
    }

    /// A change has been applied (or its task panicked): the next of its task starts.
    fn handle_done(&mut self, done: Result<(Id, String), JoinError>) {
        self.held = self.held.saturating_sub(1);
        let task = match done {
            Ok((id, task)) => {
                self.ids.remove(&id);
                task
            }
            Err(e) => {
                tracing::error!(error = %e, "a2a gateway: a task change failed");
                match self.ids.remove(&e.id()) {
                    Some(task) => task,
                    None => return,
                }
            }
        };
        let next = self.queued.get_mut(&task).and_then(VecDeque::pop_front);
        match next {
            Some(change) => self.start(task, change),
            None => {
                self.queued.remove(&task);
            }
        }
    }

    fn start(&mut self, task: String, change: Change) {
        let books = Arc::clone(&self.books);
        let id = task.clone();
        let handle = self.running.spawn(async move {
            books.apply(id.clone(), change).await;
            id
        });
        self.ids.insert(handle.id(), task);
    }
}

/// Applies one change of task `id`, and answers whoever waits for it.
async fn apply(books: &Books, id: &str, change: Change) {
    match change {
        Change::Created {
            first,
            working,
            done,
            trace,
        } => {
            let trace = trace.as_ref();
            let written = match books.write(id, &first, None, trace).await {
                Ok(()) => books.write(id, &working, None, trace).await,
                Err(e) => Err(e),
            };
            let _ = done.send(written);
        }
        Change::Edit {
            target,
            edit,
            done,
            trace,
        } => {
            let edited = async {
                let mut record = books.load(&target, id).await?;
                let result = edit(&mut record)?;
                books
                    .write(id, &record, result.as_ref(), trace.as_ref())
                    .await?;
                Ok(record)
            }
            .await;
            let _ = done.send(edited);
        }
        Change::Report {
            from,
            report,
            trace,
        } => replies::apply(books, id, &from, report, trace.as_ref()).await,
        Change::End { reason, when, done } => {
            let _ = done.send(end_failed(books, id, &reason, when).await);
        }
    }
}

/// Why a task in flight may be ended, checked on the task as the writer reads it.
#[derive(Debug, Clone)]
pub(super) enum EndWhen {
    /// Last changed before `started` (Unix ms, the gateway's start) and its agent is not back
    /// (or another node's gateway, now gone, sent its message).
    Interrupted {
        /// When this gateway was made.
        started: u64,
    },
    /// Its message was sent by `gateway`, another node's gateway agent, now gone.
    Orphaned {
        /// That gateway agent's id.
        gateway: String,
    },
}

/// Ends task `id` `failed` with the status message `reason` if it is still in flight
/// (`submitted`, `working`) and `when` holds for what was read. Whether it ended it.
async fn end_failed(books: &Books, id: &str, reason: &str, when: EndWhen) -> bool {
    #[derive(serde::Deserialize)]
    struct Wrapped {
        task: crate::gateway::a2a::recovery::Times,
    }
    let Ok(text) = books.get(id).await else {
        return false;
    };
    let Some(mut record) = MapTask::from_wrapped(&text).and_then(|t| t.record()) else {
        return false;
    };
    if !record.state.awaits_agent() {
        return false;
    }
    let still = match &when {
        EndWhen::Interrupted { started } => {
            serde_json::from_str::<Wrapped>(&text).is_ok_and(|w| w.task.updated_at < *started)
                && (!books.agent_live(&record.agent).await || books.sender_gone(&record).await)
        }
        EndWhen::Orphaned { gateway } => {
            record.gateway.as_deref() == Some(gateway.as_str()) && books.sender_gone(&record).await
        }
    };
    if !still {
        return false;
    }
    let message = Message::agent_text(reason, id, &record.context_id);
    record.set_state(TaskState::Failed, Some(message));
    match books.write(id, &record, None, None).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(task = %id, error = %e, reason, "a2a gateway: a task in flight could not be ended");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    /// Records when each change starts and ends; the changes of task "slow" take a while.
    #[derive(Default)]
    struct Recorder {
        log: Mutex<Vec<String>>,
    }

    impl Apply for Recorder {
        async fn apply(self: Arc<Self>, id: String, change: Change) {
            let Change::Report {
                report: AgentReport::Working(Some(n)),
                ..
            } = change
            else {
                panic!("only reports here");
            };
            self.log.lock().unwrap().push(format!("start {id} {n}"));
            if id == "slow" {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            self.log.lock().unwrap().push(format!("end {id} {n}"));
        }
    }

    #[tokio::test]
    async fn one_tasks_changes_apply_in_order_and_others_run_beside_them() {
        let recorder = Arc::new(Recorder::default());
        let writer = Writer::start(Arc::clone(&recorder));
        for (id, n) in [
            ("slow", 1),
            ("slow", 2),
            ("fast", 1),
            ("slow", 3),
            ("fast", 2),
        ] {
            let report = AgentReport::Working(Some(n.to_string()));
            writer.report(id, "agent".into(), report, None).await;
        }
        let log = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if recorder.log.lock().unwrap().len() == 10 {
                    return recorder.log.lock().unwrap().clone();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("every change applied");
        let of =
            |id: &str| -> Vec<String> { log.iter().filter(|l| l.contains(id)).cloned().collect() };
        // One at a time, in arrival order, per task.
        assert_eq!(
            of("slow"),
            [
                "start slow 1",
                "end slow 1",
                "start slow 2",
                "end slow 2",
                "start slow 3",
                "end slow 3"
            ]
        );
        assert_eq!(
            of("fast"),
            ["start fast 1", "end fast 1", "start fast 2", "end fast 2"]
        );
        // The fast task did not wait for the slow one.
        let at = |line: &str| log.iter().position(|l| l == line).unwrap();
        assert!(at("end fast 2") < at("end slow 1"), "{log:?}");
    }

    /// Holds every change until released; counts those started.
    #[derive(Default)]
    struct Gate {
        started: Mutex<Vec<String>>,
        open: tokio::sync::Notify,
        opened: std::sync::atomic::AtomicBool,
    }

    impl Apply for Gate {
        async fn apply(self: Arc<Self>, id: String, _change: Change) {
            self.started.lock().unwrap().push(id);
            while !self.opened.load(std::sync::atomic::Ordering::SeqCst) {
                let notified = self.open.notified();
                if self.opened.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                notified.await;
            }
        }
    }

    #[tokio::test]
    async fn the_writer_holds_a_bounded_number_of_changes_and_senders_wait_for_room() {
        let gate = Arc::new(Gate::default());
        // Room for 2 held changes and 1 in the channel.
        let writer = Writer::start_bounded(Arc::clone(&gate), 1, 2);
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let sender = {
            let (writer, sent) = (writer.clone(), Arc::clone(&sent));
            tokio::spawn(async move {
                for n in 0..6 {
                    let report = AgentReport::Working(Some(n.to_string()));
                    writer
                        .report(&format!("t{n}"), "agent".into(), report, None)
                        .await;
                    sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            gate.started.lock().unwrap().len(),
            2,
            "two changes of distinct tasks run; no more are taken"
        );
        assert!(
            sent.load(std::sync::atomic::Ordering::SeqCst) <= 3,
            "the sender waits once the writer and its channel are full"
        );
        assert!(!sender.is_finished());
        gate.opened.store(true, std::sync::atomic::Ordering::SeqCst);
        gate.open.notify_waiters();
        tokio::time::timeout(Duration::from_secs(5), sender)
            .await
            .expect("the sender finishes once changes are applied")
            .expect("no panic");
        tokio::time::timeout(Duration::from_secs(5), async {
            while gate.started.lock().unwrap().len() < 6 {
                gate.open.notify_waiters();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("every change applied, none dropped");
    }
}
