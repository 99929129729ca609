//! The server's side: up to [`MAX_WORKERS`] long-lived render workers, started on demand and
//! kept idle between renders (starting one costs milliseconds, a render through one a few tens
//! of microseconds more than in-process). A worker that misses the deadline is killed; one that
//! dies (its memory limit, a crash) is reaped; either is replaced by the next render that needs
//! one. Workers are started from one long-lived thread because `PR_SET_PDEATHSIG` fires when
//! the *thread* that forked the child exits, not the process.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::super::limits::{self, Budget};
use super::protocol::{Reply, frame_len};
use super::{PARENT_VAR, SUBCOMMAND};
use crate::error::{ErrorKind, fail};

/// Renders at once; more wait for a worker (within their deadline).
const MAX_WORKERS: usize = 4;
/// How long a new worker may take to say it is ready.
const START_TIME: Duration = Duration::from_secs(10);
/// How long a worker that closed its stdout may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// What became of a render sent to the pool.
pub enum Outcome {
    /// The worker's answer, or the one line for a render it could not finish.
    Rendered(anyhow::Result<String>),
    /// No worker could be started: the caller renders in-process.
    Unavailable(anyhow::Error),
}

pub struct Pool {
    program: PathBuf,
    state: Mutex<State>,
    freed: Condvar,
}

struct State {
    idle: Vec<Worker>,
    alive: usize,
}

enum Take {
    Got(Worker),
    /// Every worker stayed busy until the deadline.
    Busy,
    Unstartable(anyhow::Error),
}

impl Pool {
    pub fn new(program: PathBuf) -> Pool {
        Pool {
            program,
            state: Mutex::new(State { idle: Vec::new(), alive: 0 }),
            freed: Condvar::new(),
        }
    }

    /// Renders the request `frame` (a serialized [`super::protocol::Request`]) within
    /// `deadline`, the budget `budget` naming the memory limit in the error.
    pub fn render(&self, frame: &[u8], budget: Budget, deadline: Duration) -> Outcome {
        let until = Instant::now() + deadline;
        let mut refused = String::new();
        // Idle workers may have been killed from outside (the OOM killer): past them all, a
        // new one.
        for _ in 0..=MAX_WORKERS {
            let mut worker = match self.take(until) {
                Take::Got(w) => w,
                Take::Busy => return Outcome::Rendered(Err(too_slow(deadline))),
                Take::Unstartable(e) => return Outcome::Unavailable(e),
            };
            match worker.send(frame) {
                Ok(()) => return Outcome::Rendered(self.answer(worker, until, budget, deadline)),
                Err(e) => {
                    let (status, _) = self.discard(worker, EXIT_GRACE);
                    let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                    refused = format!("{e}; {status}");
                }
            }
        }
        let line = format!("the chat template's worker refused the render ({refused})");
        Outcome::Rendered(Err(fail(ErrorKind::Other, line)))
    }

    /// The reply of `worker` to the render it was sent, the worker kept, killed or reaped.
    fn answer(
        &self,
        mut worker: Worker,
        until: Instant,
        budget: Budget,
        deadline: Duration,
    ) -> anyhow::Result<String> {
        match worker.receive(until) {
            Ok(reply) => {
                if matches!(reply, Reply::Retiring(_)) {
                    let _ = self.discard(worker, EXIT_GRACE);
                } else {
                    self.give_back(worker);
                }
                reply.into_result()
            }
            Err(Received::Late) => {
                let _ = self.discard(worker, Duration::ZERO);
                Err(too_slow(deadline))
            }
            Err(Received::Gone) => {
                let (status, stderr) = self.discard(worker, EXIT_GRACE);
                Err(fail(ErrorKind::Other, died(status, &stderr, budget, deadline)))
            }
        }
    }

    fn take(&self, until: Instant) -> Take {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(w) = s.idle.pop() {
                return Take::Got(w);
            }
            if s.alive < MAX_WORKERS {
                s.alive += 1;
                drop(s);
                return match start(&self.program) {
                    Ok(w) => Take::Got(w),
                    Err(e) => {
                        self.forget_one();
                        Take::Unstartable(e)
                    }
                };
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Take::Busy;
            }
            s = self.freed.wait_timeout(s, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn give_back(&self, w: Worker) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).idle.push(w);
        self.freed.notify_one();
    }

    /// Reaps `w` (see [`Worker::end`]), making room for another.
    fn discard(&self, w: Worker, grace: Duration) -> (io::Result<ExitStatus>, String) {
        let ended = w.end(grace);
        self.forget_one();
        ended
    }

    fn forget_one(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.alive = s.alive.saturating_sub(1);
        drop(s);
        self.freed.notify_one();
    }

    /// Ends the idle workers (busy ones end with their render, or with this process).
    pub fn shutdown(&self) {
        let idle = std::mem::take(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()).idle);
        for w in idle {
            let _ = self.discard(w, Duration::ZERO);
        }
    }
}

fn too_slow(deadline: Duration) -> anyhow::Error {
    fail(ErrorKind::Other, limits::too_slow(deadline))
}

/// The one line for a worker that died during a render: out of memory (the allocator's abort
/// message, or a kill the parent did not send: the kernel's OOM killer), out of CPU time, or a
/// crash.
fn died(
    status: io::Result<ExitStatus>,
    stderr: &str,
    budget: Budget,
    deadline: Duration,
) -> String {
    let status = match status {
        Ok(s) => s,
        Err(e) => return format!("the model's chat template's render worker was lost ({e})"),
    };
    let signal = status.signal();
    if stderr.contains("memory allocation of") || signal == Some(libc::SIGKILL) {
        return limits::too_big(budget);
    }
    if signal == Some(libc::SIGXCPU) {
        return limits::too_slow(deadline);
    }
    let last = stderr.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("").trim();
    let last: String = last.chars().take(200).collect();
    format!(
        "the model's chat template crashed its render worker ({status}{}{last})",
        if last.is_empty() { "" } else { ": " }
    )
}

/// One worker process and its pipes.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    stderr: ChildStderr,
}

enum Received {
    /// The deadline passed first.
    Late,
    /// The worker closed its stdout: it died.
    Gone,
}

impl Worker {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        let len = u32::try_from(frame.len()).map_err(io::Error::other)?;
        self.stdin.write_all(&len.to_le_bytes())?;
        self.stdin.write_all(frame)?;
        self.stdin.flush()
    }

    /// The next reply, read before `until`.
    fn receive(&mut self, until: Instant) -> Result<Reply, Received> {
        let mut prefix = [0u8; 4];
        self.read_until(&mut prefix, until)?;
        let mut body = vec![0u8; frame_len(prefix).map_err(|_| Received::Gone)?];
        self.read_until(&mut body, until)?;
        serde_json::from_slice(&body).map_err(|_| Received::Gone)
    }

    fn read_until(&mut self, buf: &mut [u8], until: Instant) -> Result<(), Received> {
        let mut filled = 0;
        while filled < buf.len() {
            let left = until.saturating_duration_since(Instant::now());
            if !readable(&self.stdout, left).map_err(|_| Received::Gone)? {
                return Err(Received::Late);
            }
            match self.stdout.read(&mut buf[filled..]) {
                Ok(0) => return Err(Received::Gone),
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Err(Received::Gone),
            }
        }
        Ok(())
    }

    /// Reaps the worker, killed unless it exits by itself within `grace` (one that closed its
    /// stdout is dying: its own status tells why); its exit status and its last words on
    /// stderr (the allocator's, a signal handler's).
    fn end(mut self, grace: Duration) -> (io::Result<ExitStatus>, String) {
        let until = Instant::now() + grace;
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = self.child.kill();
        let status = self.child.wait();
        let mut text = Vec::new();
        let _ = (&mut self.stderr).take(64 << 10).read_to_end(&mut text);
        (status, String::from_utf8_lossy(&text).into_owned())
    }
}

/// Whether `stdout` has data (or its end) within `wait`.
fn readable(stdout: &ChildStdout, wait: Duration) -> io::Result<bool> {
    let mut fd = libc::pollfd { fd: stdout.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = wait.as_millis().min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: poll on one valid pollfd.
        let n = unsafe { libc::poll(&mut fd, 1, ms) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Starts a worker from the spawning thread and waits for its `Ready`.
fn start(program: &Path) -> anyhow::Result<Worker> {
    let (tx, rx) = mpsc::channel();
    spawner().lock().unwrap_or_else(|p| p.into_inner()).send((program.to_path_buf(), tx))?;
    let mut w = rx.recv()??;
    match w.receive(Instant::now() + START_TIME) {
        Ok(Reply::Ready) => Ok(w),
        Ok(other) => {
            let _ = w.end(Duration::ZERO);
            anyhow::bail!("the chat template's worker answered {other:?} to its start")
        }
        Err(_) => {
            let (status, stderr) = w.end(EXIT_GRACE);
            let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
            let stderr = stderr.lines().next().unwrap_or("").trim().to_string();
            anyhow::bail!("the chat template's worker did not start ({status}): {stderr}")
        }
    }
}

type SpawnJob = (PathBuf, mpsc::Sender<io::Result<Worker>>);

/// The thread that forks every worker, alive as long as the process.
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnJob>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        let spawned =
            std::thread::Builder::new().name("inferno-template-spawner".into()).spawn(move || {
                for (program, reply) in rx {
                    let _ = reply.send(spawn(&program));
                }
            });
        // Without the thread, each start fails with a closed channel: renders stay in-process.
        drop(spawned);
        Mutex::new(tx)
    })
}

/// Starts `program template-worker`, telling it this process's id: the worker then asks for
/// SIGKILL when this thread (the spawner, so the process) ends, and exits if its parent is
/// already another. Set there, not between fork and exec, so that the standard library can use
/// `posix_spawn` (a `vfork`), not copy the page tables of a server that holds a model.
fn spawn(program: &Path) -> io::Result<Worker> {
    let mut cmd = Command::new(program);
    cmd.arg(SUBCOMMAND).env(PARENT_VAR, std::process::id().to_string());
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let (Some(stdin), Some(stdout), Some(stderr)) = pipes else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(io::Error::other("the chat template's worker has no pipes"));
    };
    Ok(Worker { child, stdin, stdout, stderr })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(raw_status: i32, stderr: &str) -> String {
        let budget = Budget::for_input(0);
        died(Ok(ExitStatus::from_raw(raw_status)), stderr, budget, Duration::from_secs(10))
    }

    #[test]
    fn a_worker_that_cannot_start_leaves_the_render_to_the_caller() {
        let budget = Budget::for_input(0);
        for program in ["/nonexistent/inferno", "/bin/true"] {
            let pool = Pool::new(PathBuf::from(program));
            match pool.render(b"{}", budget, Duration::from_secs(5)) {
                Outcome::Unavailable(e) => {
                    let line = crate::error::one_line(&e);
                    assert!(!line.contains('\n'), "{line}");
                }
                Outcome::Rendered(r) => panic!("{program}: {r:?}"),
            }
            assert_eq!(pool.state.lock().unwrap().alive, 0, "{program}");
        }
    }

    #[test]
    fn a_dead_worker_is_explained_in_one_line() {
        let abort = libc::SIGABRT;
        assert!(line(abort, "memory allocation of 2147483648 bytes failed\n").starts_with(
            "the model's chat template used more than 1024 MiB of memory for this conversation"
        ));
        assert!(line(libc::SIGKILL, "").contains("used more than 1024 MiB"));
        assert!(line(libc::SIGXCPU, "").contains("did not finish within 10s"));
        let crash = line(libc::SIGSEGV, "\nthread 'x' has overflowed its stack\n\n");
        assert!(
            crash.starts_with("the model's chat template crashed its render worker"),
            "{crash}"
        );
        assert!(crash.ends_with(": thread 'x' has overflowed its stack)"), "{crash}");
        assert!(!crash.contains('\n'));
    }
}
