//! The operating-system edge of supervision: how a child is launched so it cannot outlive the
//! router, and how signals reach it. The only module in the crate with `unsafe` code.
//!
//! - Every child runs in its own process group (`setpgid(0, 0)`), so the router can signal the
//!   child together with anything it started, and a Ctrl-C in the router's terminal reaches the
//!   router (which stops children in order) rather than the children directly.
//! - On Linux the child asks the kernel for `SIGKILL` when its parent *thread* exits
//!   (`prctl(PR_SET_PDEATHSIG)`), so a crashed or `kill -9`ed router leaves no orphans. The
//!   request is tied to the forking thread, so children are forked from one dedicated thread
//!   that lives as long as the supervisor ([`Spawner`]). The child then re-checks its parent,
//!   closing the race where the router died between `fork` and `prctl`.
#![allow(unsafe_code)]

use std::io;
use std::sync::mpsc as std_mpsc;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// Prepares `cmd` so the child gets its own process group and dies with the router.
pub fn contain(cmd: &mut Command) {
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the forked child before exec and only calls
        // async-signal-safe functions (prctl, getppid); it allocates nothing on success.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    // The router is already gone.
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
}

/// A signal to send to a process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Ask to terminate.
    Term,
    /// Terminate now.
    Kill,
    /// Pause.
    Stop,
    /// Continue after `Stop`.
    Cont,
}

impl Signal {
    fn raw(self) -> libc::c_int {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
            Signal::Stop => libc::SIGSTOP,
            Signal::Cont => libc::SIGCONT,
        }
    }
}

/// Sends `signal` to the process group `pgid` (the child's pid, as it leads its group). A
/// group that no longer exists is not an error.
pub fn signal_group(pgid: u32, signal: Signal) -> io::Result<()> {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "pid out of range",
        ));
    };
    if pgid <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to signal pid <= 1",
        ));
    }
    // SAFETY: kill(2) with a negative pid signals that process group; it has no memory effects.
    let rc = unsafe { libc::kill(-pgid, signal.raw()) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(err)
    }
}

/// The signal number that ended a process, from its exit status.
pub fn exit_signal(status: &std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

struct Job {
    cmd: Command,
    reply: oneshot::Sender<io::Result<Child>>,
}

/// Forks children from one long-lived thread (see the module docs on `PR_SET_PDEATHSIG`).
#[derive(Debug, Clone)]
pub struct Spawner {
    jobs: std_mpsc::Sender<Job>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Job")
    }
}

impl Spawner {
    /// Starts the spawning thread. Children are registered with the current tokio runtime.
    ///
    /// # Errors
    /// The thread could not be started, or no tokio runtime is running.
    pub fn start() -> io::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| io::Error::other(format!("no tokio runtime: {e}")))?;
        let (jobs, rx) = std_mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("map-router-spawner".into())
            .spawn(move || {
                let _enter = runtime.enter();
                // Ends when every Spawner clone is gone, i.e. after every keeper has reaped its
                // child; children forked here must never see this thread exit while they run.
                while let Ok(mut job) = rx.recv() {
                    let _ = job.reply.send(job.cmd.spawn());
                }
            })?;
        Ok(Self { jobs })
    }

    /// Launches `cmd` (already [`contain`]ed) on the spawning thread.
    ///
    /// # Errors
    /// The program could not be started.
    pub async fn spawn(&self, cmd: Command) -> io::Result<Child> {
        let (reply, rx) = oneshot::channel();
        self.jobs
            .send(Job { cmd, reply })
            .map_err(|_| io::Error::other("spawner thread is gone"))?;
        rx.await
            .map_err(|_| io::Error::other("spawner thread is gone"))?
    }
}
