//! For each cached model: does it fit on the GPU (or, with `--tp N`, each of N GPUs its share), at
//! its full context or at a smaller one (what `play` and `serve` then take), and where it does not
//! fit at its full context, which `--tp` would hold it? The same memory plan `play` and `bench`
//! check before loading (src/load/plan.rs), read from the files' headers only, so this is quick
//! even for a cache of large models.

use serde::Serialize;

use super::Problem;
use super::cache::CacheReport;
use super::gpu::GpuReport;
use super::render::Line;
use crate::dist::Shard;
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
    /// GPUs the plan splits the model over (`--tp`); the bytes are one GPU's.
    pub tp: usize,
    /// Where the full context does not fit: the smallest larger `--tp` (2, 4 or 8) at which each
    /// GPU, with the memory free here, would hold it.
    pub fits_with: Option<TpFit>,
}

/// A `--tp` at which a model fits at its full context.
#[derive(Debug, Serialize)]
pub struct TpFit {
    pub tp: usize,
    /// Bytes each GPU's share needs.
    pub needed_bytes: u64,
}

pub fn check(cache: &CacheReport, gpu: &GpuReport, tp: usize) -> Vec<ModelFit> {
    // A model split over `tp` GPUs waits for the fullest.
    let free = gpu.devices.iter().take(tp).map(|d| d.free_bytes).min();
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
            Some(fit(name, &path.to_string_lossy(), free, tp))
        })
        .collect()
}

fn fit(model: String, path: &str, free: Option<u64>, tp: usize) -> ModelFit {
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
        tp,
        fits_with: None,
    };
    // Rank 0's share: the largest (a vocabulary the ranks do not divide leaves the last fewer rows).
    let planned = prepare(path, &opts, Target::Gpu)
        .and_then(|(_, whole)| Ok((whole.for_rank(Shard { rank: 0, world: tp }, false)?, whole)));
    let (spec, whole) = match planned {
        Ok(pair) => pair,
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
            out.fits_with = whole
                .smallest_tp(spec.context, free, tp)
                .map(|(tp, needed_bytes)| TpFit { tp, needed_bytes });
        }
    }
    out
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_string()
}

impl ModelFit {
    /// How the model is split, for lines: "" on one GPU, " over --tp 2 (a GPU's share)".
    fn over(&self) -> String {
        if self.tp > 1 { format!(" over --tp {} (a GPU's share)", self.tp) } else { String::new() }
    }

    /// "; with --tp 2 each GPU needs X at context C", where a larger `--tp` holds it.
    fn with_tp(&self, ctx: usize) -> String {
        self.fits_with.as_ref().map_or(String::new(), |t| {
            format!("; with --tp {} each GPU needs {} at context {ctx}", t.tp, iec(t.needed_bytes))
        })
    }

    pub fn line(&self) -> Line {
        let (Some(need), Some(ctx)) = (self.needed_bytes, self.context) else {
            let why = self.note.as_deref().unwrap_or("no plan");
            return Line::ok(format!("{}: not runnable by inferno ({why})", self.model));
        };
        let (model, over, more) = (&self.model, self.over(), self.with_tp(ctx));
        match (self.fits, self.free_bytes) {
            (Some(true), Some(free)) => Line::ok(format!(
                "{model}: fits{over} (needs {} at context {ctx}, {} free)",
                iec(need),
                iec(free)
            )),
            // What `play` and `serve` do with no --context: the largest context that fits.
            (Some(false), Some(free)) if self.largest_context.is_some() => Line::ok(format!(
                "{model}: fits{over} at context {} (its full context {ctx} needs {}, {} free{more})",
                self.largest_context.unwrap_or_default(),
                iec(need),
                iec(free)
            )),
            (Some(false), Some(free)) => Line::bad(format!(
                "{model}: does not fit{over} at context {ctx} (needs {}, {} free{more})",
                iec(need),
                iec(free)
            )),
            _ => Line::ok(format!(
                "{model}: needs {}{over} at context {ctx} (no GPU to check against)",
                iec(need)
            )),
        }
    }

    pub fn problem(&self) -> Option<Problem> {
        if self.fits != Some(false) || self.largest_context.is_some() {
            return None;
        }
        let fix = match &self.fits_with {
            Some(t) => {
                format!("run it with --tp {} on {} such GPUs, or free GPU memory", t.tp, t.tp)
            }
            None => "free GPU memory or use a larger GPU".to_string(),
        };
        Some(Problem {
            what: format!("{} does not fit on the GPU at any context", self.model),
            fix,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> String {
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt_oss_tiny").to_string()
    }

    /// A model one GPU holds only at a smaller context is held whole by two: the line and the
    /// JSON name `--tp 2` and what each GPU needs; checked over two GPUs, the share is planned.
    #[test]
    fn a_model_that_needs_two_gpus_says_so() {
        let one = fit("tiny".into(), &fixture(), None, 1);
        let two = fit("tiny".into(), &fixture(), None, 2);
        let (need1, need2) = (one.needed_bytes.unwrap(), two.needed_bytes.unwrap());
        assert!(need2 < need1, "a GPU's share {need2} is not below the whole {need1}");
        assert!(two.line().text.contains("over --tp 2"), "{}", two.line().text);

        let tight = fit("tiny".into(), &fixture(), Some(need2), 1);
        assert_eq!(tight.fits, Some(false));
        let with = tight.fits_with.as_ref().expect("a --tp that fits");
        assert_eq!((with.tp, with.needed_bytes), (2, need2));
        let line = tight.line().text;
        assert!(line.contains("with --tp 2 each GPU needs"), "{line}");
        let over_two = fit("tiny".into(), &fixture(), Some(need2), 2);
        assert_eq!(over_two.fits, Some(true), "{}", over_two.line().text);
        assert!(over_two.fits_with.is_none());
    }
}
