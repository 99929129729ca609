//! Chat templates render in worker processes, because minijinja can bound neither a render's
//! memory nor its time: a template that doubles a string on each pass of a loop would take the
//! whole server (and its GPU sessions) down with it, and one stuck in a single costly builtin
//! would burn its thread long after the request got its error. A worker is this same binary
//! started as `inferno template-worker` ([`child`]); the server keeps a few alive between
//! renders ([`pool`]) and talks to them over pipes ([`protocol`]). A worker past its memory
//! limit dies, one past its deadline is killed, and the request gets one line either way.
//!
//! The binary opts in with [`enable`]; a library user (tests included) that does not renders
//! in-process, with the step, output, depth and time bounds of [`super::limits`] but no memory
//! bound. So does the binary where a worker cannot start (no `fork`, no `/proc/self/exe`, a
//! seccomp profile), which it logs once.

mod child;
mod pool;
mod protocol;

use std::path::PathBuf;
use std::sync::{Once, OnceLock};
use std::time::Duration;

use super::limits::Budget;
pub use child::run;
use pool::{Outcome, Pool};
pub use protocol::Request;

/// The hidden subcommand that runs a worker.
pub const SUBCOMMAND: &str = "template-worker";
/// The environment variable that gives a worker its parent's process id.
const PARENT_VAR: &str = "INFERNO_TEMPLATE_PARENT";

static POOL: OnceLock<Pool> = OnceLock::new();

/// Renders chat templates in workers started from `program` (this binary) from now on.
pub fn enable(program: PathBuf) {
    let _ = POOL.set(Pool::new(program));
}

/// Renders chat templates in workers started from this executable from now on
/// (`/proc/self/exe`, which still runs after the file was replaced by an upgrade).
pub fn enable_this_binary() {
    let exe = PathBuf::from("/proc/self/exe");
    let program = if exe.exists() { Some(exe) } else { std::env::current_exe().ok() };
    if let Some(p) = program {
        enable(p);
    }
}

/// Ends the idle workers, so that none outlives the process (they would end anyway: their
/// stdin closes and `PR_SET_PDEATHSIG` kills them, but a container's init may not reap them).
pub fn shutdown() {
    if let Some(p) = POOL.get() {
        p.shutdown();
    }
}

/// `req` rendered by a worker, or `None` where workers are not enabled or cannot start.
pub(super) fn render(
    req: &Request,
    budget: Budget,
    deadline: Duration,
) -> Option<anyhow::Result<String>> {
    let pool = POOL.get()?;
    let frame = match serde_json::to_vec(req) {
        Ok(f) => f,
        Err(e) => return Some(Err(e.into())),
    };
    match pool.render(&frame, budget, deadline) {
        Outcome::Rendered(r) => Some(r),
        Outcome::Unavailable(e) => {
            static SAID: Once = Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    "chat templates render inside this process, without a memory limit: {}",
                    crate::error::one_line(&e)
                );
            });
            None
        }
    }
}
