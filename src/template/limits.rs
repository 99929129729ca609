//! Bounds on one render of a chat template: the work (minijinja's fuel: one unit per
//! instruction), the output size, the depth of nested calls, the stack and the time.
//!
//! A template comes with a model's files, from whoever published them; one whose loops nest two
//! ranges of 100,000 would otherwise keep `play` or a `serve` request rendering for minutes.
//! The work and output budgets grow with the render's input (its JSON context), so any
//! conversation that fits a model's context, walked once or a few times, stays within them:
//! running out is the template's fault, not the request's.
//!
//! Data a template nests (a list wrapped in a list on each pass of a loop) is printed, compared
//! and dropped recursively inside minijinja, a stack frame per level, and only the fuel bounds
//! its depth: renders run on a thread of their own whose stack ([`RENDER_STACK`], reserved, not
//! used until touched) holds the deepest nesting the fuel cap ([`MAX_FUEL`]) allows. A panic
//! inside minijinja ends that thread and fails the render, not the process.
//!
//! Memory is bounded outside minijinja, which has no hook for a value's size: minijinja caps
//! one repetition (`'x' * n`, `[x] * n`) at 100 million items but not concatenation, so a
//! template that doubles a string on each pass of a loop (`ns.s = ns.s ~ ns.s`) would exhaust
//! memory in a few dozen instructions, and so would printing data that holds the previous
//! pass's twice (`ns.l = [ns.l, ns.l]`) into a macro's output, which minijinja buffers
//! without a limit. Renders therefore run in a worker process ([`super::worker`]) whose
//! address space is capped at [`Budget::memory`] beyond what it holds when the render starts;
//! past it, the worker dies, alone, and the caller gets one line.

use std::io;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Duration;

use crate::error::{ErrorKind, fail};

/// Instructions any render may run (the Llama 3.1 template with tools runs a few thousand).
const BASE_FUEL: u64 = 1_000_000;
/// Further instructions per byte of input: the real templates of tests/fixtures run 25 to 62
/// per message, and a message takes at least 28 bytes of JSON.
const FUEL_PER_BYTE: u64 = 4;
/// The most instructions any render runs: what 30,000 messages take with the heaviest real
/// template (more than a 128k-token context holds), and what [`RENDER_STACK`] is sized for.
pub(super) const MAX_FUEL: u64 = 2_000_000;
/// The rendering thread's stack: a level of nested data takes up to ~500 bytes of it (printing
/// a list of lists), and a level costs at least one instruction.
const RENDER_STACK: usize = 2 << 30;
/// The stack where the system refuses to reserve [`RENDER_STACK`] (strict overcommit): enough
/// for any real template, and for data nested about 100,000 levels deep.
const FALLBACK_STACK: usize = 64 << 20;
/// Bytes any render may write (templates' fixed text is a few kB).
const BASE_OUTPUT: usize = 1 << 20;
/// Further bytes per byte of input: the input rendered once or twice, or as indented JSON.
const OUTPUT_PER_BYTE: usize = 8;
/// Memory any render may use: real templates use a few MB, and `'x' * 100000000` (100 MB, the
/// largest single value minijinja builds) fits several times.
const BASE_MEMORY: usize = 1 << 30;
/// Further bytes per byte of input: the conversation parsed into minijinja's values, walked,
/// and its output.
const MEMORY_PER_BYTE: usize = 32;
/// Macro calls and includes nested at most: the deepest real template nests 3, and a template
/// that calls itself without end stops here (minijinja's default is 500).
pub(super) const MAX_DEPTH: usize = 64;

/// How long a caller waits for a render. Fuel counts instructions, but one instruction can cost
/// up to minijinja's own caps (`range(100000) | sort`, `'x' * 100000000`), so a template can
/// still take minutes within its fuel; the caller gets this error in time, and the worker
/// rendering it is killed (in-process, the render would run on, unseen, until its fuel is
/// gone).
pub(super) const RENDER_TIME: Duration = Duration::from_secs(10);

/// What one render may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Budget {
    pub fuel: u64,
    pub output: usize,
    /// Bytes of address space beyond what the render worker holds when the render starts.
    pub memory: usize,
}

impl Budget {
    /// The budget for a render whose context serializes to `input` bytes of JSON.
    pub fn for_input(input: usize) -> Budget {
        Budget {
            fuel: BASE_FUEL
                .saturating_add(FUEL_PER_BYTE.saturating_mul(input as u64))
                .min(MAX_FUEL),
            output: BASE_OUTPUT.saturating_add(OUTPUT_PER_BYTE.saturating_mul(input)),
            memory: BASE_MEMORY.saturating_add(MEMORY_PER_BYTE.saturating_mul(input)),
        }
    }
}

/// The render's output, refused past `cap` bytes (minijinja then stops with a write failure).
pub(super) struct Capped {
    pub buf: Vec<u8>,
    cap: usize,
    pub overflowed: bool,
}

impl Capped {
    pub fn new(cap: usize) -> Capped {
        Capped { buf: Vec::new(), cap, overflowed: false }
    }
}

impl io::Write for Capped {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len().saturating_add(data.len()) > self.cap {
            self.overflowed = true;
            return Err(io::Error::other("chat template output limit"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The one-line message for a render stopped by a limit, if `e` is one (an include or a macro
/// call wraps the error that stopped it, so the whole chain is searched).
pub(super) fn exceeded(e: &minijinja::Error, out: &Capped, budget: Budget) -> Option<String> {
    use minijinja::ErrorKind as K;
    let chain = std::iter::successors(Some(e), |e| {
        std::error::Error::source(*e).and_then(|s| s.downcast_ref::<minijinja::Error>())
    });
    let (mut fuel, mut depth) = (false, false);
    for e in chain {
        fuel |= e.kind() == K::OutOfFuel;
        depth |= e.kind() == K::InvalidOperation && e.detail() == Some("recursion limit exceeded");
    }
    let what = if out.overflowed {
        format!("wrote more than {} bytes", budget.output)
    } else if fuel {
        format!("ran past its limit of {} steps", budget.fuel)
    } else if depth {
        format!("nested calls deeper than {MAX_DEPTH}")
    } else {
        return None;
    };
    Some(format!(
        "the model's chat template {what} for this conversation (a template that never ends?)"
    ))
}

/// Runs `render` on a thread with [`RENDER_STACK`] and waits at most `deadline` for it. A
/// render past the deadline is left to run out of its fuel (minijinja cannot be interrupted;
/// the worker process that runs it is killed instead).
pub(super) fn on_render_thread<T: Send + 'static>(
    render: impl FnOnce() -> T + Send + 'static,
    deadline: Duration,
) -> anyhow::Result<T> {
    use std::sync::mpsc::RecvTimeoutError;
    let (job, done) = render_thread()?;
    // The thread waits for its job, so a failed spawn above leaves `render` unmoved.
    let _ = job.send(Box::new(render));
    match done.recv_timeout(deadline) {
        Ok(out) => Ok(out),
        Err(RecvTimeoutError::Timeout) => Err(fail(ErrorKind::Other, too_slow(deadline))),
        Err(RecvTimeoutError::Disconnected) => {
            Err(fail(ErrorKind::Other, "the chat template's render panicked"))
        }
    }
}

pub(super) type Job<T> = Box<dyn FnOnce() -> T + Send>;

/// A thread that runs the jobs sent to it, one at a time, until their sender is dropped: with
/// [`RENDER_STACK`], else [`FALLBACK_STACK`].
pub(super) fn render_thread<T: Send + 'static>() -> anyhow::Result<(Sender<Job<T>>, Receiver<T>)> {
    let mut refused = String::new();
    for stack in [RENDER_STACK, FALLBACK_STACK] {
        let (job_tx, job_rx) = mpsc::channel::<Job<T>>();
        let (done_tx, done_rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("inferno-template".into())
            .stack_size(stack)
            .spawn(move || {
                while let Ok(job) = job_rx.recv() {
                    let _ = done_tx.send(job());
                }
            });
        match spawned {
            Ok(_) => return Ok((job_tx, done_rx)),
            Err(e) => refused = e.to_string(),
        }
    }
    Err(anyhow::anyhow!("starting the chat template's thread: {refused}"))
}

/// The message for a render that missed its deadline.
pub(super) fn too_slow(deadline: Duration) -> String {
    format!(
        "the model's chat template did not finish within {}s for this conversation (a template that never ends?)",
        deadline.as_secs_f32()
    )
}

/// The message for a render that passed its memory limit.
pub(super) fn too_big(budget: Budget) -> String {
    format!(
        "the model's chat template used more than {} MiB of memory for this conversation (a template that never ends?)",
        budget.memory >> 20
    )
}

#[cfg(test)]
#[path = "limits_tests.rs"]
mod tests;
