//! For each cached model: does it fit on the GPU, at its full context or at a smaller one (what
//! `play` and `serve` then take)? The same memory plan `play` and `bench` check before loading (src/load/plan.rs), read from the files' headers
//! only, so this is quick even for a cache of large models.

use serde::Serialize;

use super::Problem;
use super::cache::CacheReport;
use super::gpu::GpuReport;
use super::render::Line;
use crate::load::plan::Target;
use crate::load::{LoadOptions, prepare};
use crate::util::human_bytes_iec as iec;

#[derive(Debug, Serialize)]
pub struct ModelFit {
    pub model: String,
    /// The model's full context, which the plan is for.
    pub context: Option<usize>,
    /// Bytes the plan needs on the GPU at that context.
    pub needed_bytes: Option<u64>,
    /// Free bytes of the GPU it was checked against (`None`: no GPU to check).
    pub free_bytes: Option<u64>,
    /// Whether it fits (`None`: unknown, no GPU or no plan).
    pub fits: Option<bool>,
    /// The largest context that fits, when the full one does not.
    pub largest_context: Option<usize>,
    /// Why no plan could be made (a format or architecture inferno does not run).
    pub note: Option<String>,
}

pub fn check(cache: &CacheReport, gpu: &GpuReport) -> Vec<ModelFit> {
    let free = gpu.devices.first().map(|d| d.free_bytes);
    cache
        .rows
        .iter()
        .filter(|r| r.info.is_ok())
        .filter_map(|r| {
            let path = r.path.as_ref()?;
            let name = match &r.commit {
                Some(c) => format!("{}@{}", r.model, &c[..c.len().min(8)]),
                None => r.model.clone(),
            };
            Some(fit(name, &path.to_string_lossy(), free))
        })
        .collect()
}

fn fit(model: String, path: &str, free: Option<u64>) -> ModelFit {
    let opts =
        LoadOptions { dtype: None, context: None, dummy: false, kv_dtype: Default::default() };
    let mut out = ModelFit {
        model,
        context: None,
        needed_bytes: None,
        free_bytes: free,
        fits: None,
        largest_context: None,
        note: None,
    };
    let spec = match prepare(path, &opts, Target::Gpu) {
        Ok((_, spec)) => spec,
        Err(e) => {
            out.note = Some(first_line(&format!("{e:#}")));
            return out;
        }
    };
    let plan = spec.plan(spec.context);
    out.context = Some(spec.context);
    out.needed_bytes = Some(plan.total());
    if let Some(free) = free {
        let fits = plan.total() <= free;
        out.fits = Some(fits);
        if !fits {
            out.largest_context = spec.largest_context(free, spec.context.saturating_sub(1));
        }
    }
    out
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_string()
}

impl ModelFit {
    pub fn line(&self) -> Line {
        let (Some(need), Some(ctx)) = (self.needed_bytes, self.context) else {
            let why = self.note.as_deref().unwrap_or("no plan");
            return Line::ok(format!("{}: not runnable by inferno ({why})", self.model));
        };
        match (self.fits, self.free_bytes) {
            (Some(true), Some(free)) => Line::ok(format!(
                "{}: fits (needs {} at context {ctx}, {} free)",
                self.model,
                iec(need),
                iec(free)
            )),
            // What `play` and `serve` do with no --context: the largest context that fits.
            (Some(false), Some(free)) if self.largest_context.is_some() => Line::ok(format!(
                "{}: fits at context {} (its full context {ctx} needs {}, {} free)",
                self.model,
                self.largest_context.unwrap_or_default(),
                iec(need),
                iec(free)
            )),
            (Some(false), Some(free)) => Line::bad(format!(
                "{}: does not fit at context {ctx} (needs {}, {} free)",
                self.model,
                iec(need),
                iec(free)
            )),
            _ => Line::ok(format!(
                "{}: needs {} at context {ctx} (no GPU to check against)",
                self.model,
                iec(need)
            )),
        }
    }

    pub fn problem(&self) -> Option<Problem> {
        if self.fits != Some(false) || self.largest_context.is_some() {
            return None;
        }
        Some(Problem {
            what: format!("{} does not fit on the GPU at any context", self.model),
            fix: "free GPU memory or use a larger GPU".to_string(),
        })
    }
}
