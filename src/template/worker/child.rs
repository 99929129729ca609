//! The render worker: `inferno template-worker`, started by [`super::pool`] with its stdin and
//! stdout as pipes. It answers `Ready`, then renders one [`Request`] at a time until its stdin
//! closes (the server exited). Renders run on one long-lived thread with the large stack of
//! [`limits::render_thread`] (mapped once: a thread per render would map and unmap it each
//! time), each with the address space capped at its
//! [`Budget::memory`](super::super::limits::Budget) beyond what the worker holds when it starts,
//! and the CPU time at the parent's deadline plus a little (should the parent fail to kill it);
//! past either, the kernel ends the worker, not the server. Nothing else is written to stdout.

use std::io::{self, Write};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Result;

use super::super::{ChatTemplate, limits, render_within_budget};
use super::protocol::{Reply, Request, read_frame, write_frame};

/// A worker whose address space grew this much over its life retires after the render.
const GROWTH_TO_RETIRE: usize = 256 << 20;
/// CPU seconds a render may use beyond the parent's deadline before the kernel ends it.
const CPU_SLACK_S: u64 = 2;

/// The worker's main loop; returns when the parent closes its stdin.
pub fn run() -> Result<()> {
    bind_to_parent()?;
    // A panic is reported in the reply: its message on stderr would only fill the pipe.
    std::panic::set_hook(Box::new(|_| {}));
    let mut input = io::stdin().lock();
    let mut output = io::stdout().lock();
    let thread = limits::render_thread::<Result<String>>()?;
    write_frame(&mut output, &Reply::Ready)?;
    let start = address_space();
    let mut cached: Option<(Key, ChatTemplate)> = None;
    while let Some(frame) = read_frame(&mut input)? {
        let req: Request = serde_json::from_slice(&frame)?;
        drop(frame);
        let (reply, clean) = render(req, &mut cached, &thread);
        let grown = address_space().saturating_sub(start) > GROWTH_TO_RETIRE;
        let reply = if clean && !grown { reply } else { Reply::Retiring(Box::new(reply)) };
        let retiring = matches!(reply, Reply::Retiring(_));
        write_frame(&mut output, &reply)?;
        if retiring {
            return Ok(());
        }
    }
    output.flush()?;
    Ok(())
}

/// No core dumps, and SIGKILL when the thread that started this worker ends; an error when the
/// parent named by [`super::PARENT_VAR`] is not (or no longer) this process's parent.
fn bind_to_parent() -> Result<()> {
    let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: setrlimit and prctl on this process, getppid.
    unsafe {
        libc::setrlimit(libc::RLIMIT_CORE, &none);
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
            anyhow::bail!("prctl(PR_SET_PDEATHSIG): {}", io::Error::last_os_error());
        }
    }
    let want = std::env::var(super::PARENT_VAR).ok().and_then(|p| p.parse::<libc::pid_t>().ok());
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    match want {
        Some(p) if p == parent => Ok(()),
        // The parent died before the prctl above took effect, or a person ran this.
        _ => anyhow::bail!("the template worker runs only under inferno, which starts it"),
    }
}

type Key = (String, Option<String>, Option<String>);
type RenderThread = (Sender<limits::Job<Result<String>>>, Receiver<Result<String>>);

/// Renders `req` on `thread` with the template compiled for the last request when it is the
/// same; false when the render thread panicked or was left running.
fn render(
    req: Request,
    cached: &mut Option<(Key, ChatTemplate)>,
    (jobs, done): &RenderThread,
) -> (Reply, bool) {
    let key = (req.source, req.bos_token, req.eos_token);
    let template = match cached {
        Some((k, t)) if *k == key => t,
        _ => match ChatTemplate::new(&key.0, key.1.clone(), key.2.clone()) {
            Ok(t) => &mut cached.insert((key, t)).1,
            Err(e) => return (Reply::from_result(Err(e)), true),
        },
    };
    let now = UNIX_EPOCH + Duration::from_nanos(req.now_ns.min(u64::MAX as u128) as u64);
    template.set_clock(move || now);
    let input = serde_json::to_vec(&req.ctx).map_or(0, |v| v.len());
    let budget = limits::Budget::for_input(input);
    let deadline = Duration::from_millis(req.time_ms);
    let env = template.env.clone();
    let ctx = req.ctx;
    let limited = set_limits(budget.memory, deadline);
    let sent = jobs.send(Box::new(move || render_within_budget(env, &ctx)));
    let result = match sent.map(|()| done.recv_timeout(deadline + Duration::from_secs(CPU_SLACK_S)))
    {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(RecvTimeoutError::Timeout)) => Err(limits::too_slow(deadline)),
        Ok(Err(RecvTimeoutError::Disconnected)) | Err(_) => {
            Err("the chat template's render panicked".to_string())
        }
    };
    if limited {
        lift_limits();
    }
    match result {
        Ok(r) => (Reply::from_result(r), true),
        Err(line) => (Reply::Failed { invalid_input: false, message: line }, false),
    }
}

/// Caps the address space at `memory` beyond what the worker maps now (the render thread's
/// stack included), and the CPU time at `deadline` plus [`CPU_SLACK_S`]
/// beyond what it used so far. False when the system refused (the render then runs unlimited).
fn set_limits(memory: usize, deadline: Duration) -> bool {
    let now = address_space();
    if now == 0 {
        return false;
    }
    let space = now.saturating_add(memory);
    let cpu = cpu_seconds() + deadline.as_secs() + 1 + CPU_SLACK_S;
    set_soft(libc::RLIMIT_AS, space as u64) && set_soft(libc::RLIMIT_CPU, cpu)
}

fn lift_limits() {
    set_soft(libc::RLIMIT_AS, libc::RLIM_INFINITY);
    set_soft(libc::RLIMIT_CPU, libc::RLIM_INFINITY);
}

/// Sets the soft limit of `resource`, keeping the hard one (so that it can be lifted again).
fn set_soft(resource: libc::__rlimit_resource_t, value: u64) -> bool {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on this process with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(resource, &mut lim) != 0 {
            return false;
        }
        lim.rlim_cur = value.min(lim.rlim_max);
        libc::setrlimit(resource, &lim) == 0
    }
}

/// Bytes of address space this process maps (`/proc/self/statm`'s first field), or 0.
fn address_space() -> usize {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse::<usize>().ok()))
        .unwrap_or(0);
    // SAFETY: sysconf with a valid name.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    pages.saturating_mul(page)
}

/// CPU seconds this process used so far (user and system), rounded up.
fn cpu_seconds() -> u64 {
    // SAFETY: getrusage on this process into a zeroed struct.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0;
    }
    let secs = u.ru_utime.tv_sec + u.ru_stime.tv_sec;
    secs.max(0) as u64 + 1
}
