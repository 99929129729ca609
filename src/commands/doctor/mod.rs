//! `inferno doctor`: what a user runs when something is off, and pastes into a bug report.
//!
//! It checks, in order: the GPUs (name, compute capability, free memory) and whether this
//! binary's kernels were built for them; the NVIDIA driver, the CUDA version and the CUDA
//! libraries found (with their paths); the Hugging Face cache (where, how big, how many models,
//! whether a token is set — never its value); and for each cached model whether it fits on the
//! GPU at its full context (or at which smaller one), by the same memory plan `play` and `bench` use before loading,
//! split over `--tp N` GPUs when asked, with the smallest `--tp` that holds a model one GPU does not;
//! and the `INFERNO_*` switches: each one's value, whether it is set, and any value refused.
//! Every problem comes with a line saying how to fix it. It never needs a GPU to run: on a
//! machine without the driver it says so and still reports the cache.
//!
//! Exit code 0 when nothing is wrong, 1 when a problem was found (the report says which).

mod cache;
mod gpu;
mod models;
mod render;
mod switches;

use serde::Serialize;

use crate::cli::DoctorArgs;
use crate::error::{ErrorKind, fail};

/// Something wrong, and what to do about it.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    pub what: String,
    pub fix: String,
}

/// Everything doctor found; `--json` prints it as is.
#[derive(Debug, Serialize)]
pub struct Report {
    pub version: &'static str,
    pub gpu: gpu::GpuReport,
    pub cache: cache::CacheReport,
    pub models: Vec<models::ModelFit>,
    pub switches: Vec<crate::switches::State>,
    pub problems: Vec<Problem>,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<()> {
    if args.tp == 0 {
        return Err(fail(ErrorKind::InvalidInput, "--tp must be at least 1"));
    }
    let report = collect(args.tp)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render::human(&report));
    }
    if report.problems.is_empty() {
        Ok(())
    } else {
        let n = report.problems.len();
        Err(fail(
            ErrorKind::Other,
            format!("doctor found {n} problem{}", if n == 1 { "" } else { "s" }),
        ))
    }
}

fn collect(tp: usize) -> anyhow::Result<Report> {
    let gpu = gpu::check();
    let found = gpu.devices.len();
    if found > 0 && tp > found {
        return Err(fail(
            ErrorKind::InvalidInput,
            format!("--tp {tp} needs {tp} GPUs; this machine has {found}"),
        ));
    }
    let cache = cache::check();
    let models = models::check(&cache, &gpu, tp);
    let switches = crate::switches::states();
    let mut problems = Vec::new();
    problems.extend(gpu.problems());
    problems.extend(cache.problems());
    problems.extend(models.iter().filter_map(models::ModelFit::problem));
    problems.extend(switches::problems(&switches));
    Ok(Report { version: env!("CARGO_PKG_VERSION"), gpu, cache, models, switches, problems })
}
