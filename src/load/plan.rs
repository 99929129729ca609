//! The memory plan: what a model will need on its device (weights, KV cache, RoPE tables,
//! workspace, runtime), computed before anything is allocated and held against the memory
//! that is free, so an over-large context or model is refused with one line that says how
//! much is needed and the largest context that fits, instead of failing halfway through
//! loading (or aborting in the allocator).
//!
//! Every term comes from the same functions the models use to lay out their allocations (each
//! architecture's `memory.rs`, asked through `models::arch::ArchConfig`), so the plan and what
//! is allocated cannot drift apart; the tests compare them on built models. The workspace is an
//! upper bound (every intermediate of one prefill chunk through one layer, counted as live at
//! once), the runtime term a fixed allowance (see [`Target::runtime_bytes`]).
//!
//! Without loading anything, e.g. for "does this cached model fit on this GPU at its default
//! context": `load::prepare(id, &LoadOptions { dtype: None, context: None, dummy: false, kv_dtype: Default::default() },
//! Target::Gpu)` gives the [`Spec`]; `spec.plan(spec.context)` the bytes, and
//! `spec.check(id, Some(&Budget { free, target: Target::Gpu }), false)` the plan or the
//! one-line refusal with the largest context that fits.

use candle_core::{DType, Device};

use super::spec::Spec;
use crate::error::{ErrorKind, fail};
use crate::util::human_bytes_iec as iec;

/// Where the model lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Gpu,
    /// Host memory (`--cpu`).
    Host,
}

impl Target {
    pub fn of(device: &Device) -> Target {
        if device.is_cuda() { Target::Gpu } else { Target::Host }
    }

    /// What the process needs beside the model's tensors. On a GPU: the CUDA libraries' own
    /// allocations made after the device is opened (cuBLAS workspaces, kernel modules loaded on
    /// first use, the decode graphs and their allocation arena, `gpu/arena.rs`) and kernel
    /// scratch that does not scale with the model (attention split partials, argmax parts). On
    /// the host: the tokenizer and the process. Measured on an H100 (tests/memory_plan.rs):
    /// TinyLlama in bf16 takes 285 MiB. Not all of it is attributed (the bf16 LM head's cuBLAS
    /// GEMM is the likeliest part), so the allowance keeps a margin over it.
    pub fn runtime_bytes(self) -> u64 {
        match self {
            Target::Gpu => 320 << 20,
            Target::Host => 128 << 20,
        }
    }

    fn runtime_name(self) -> &'static str {
        match self {
            Target::Gpu => "CUDA runtime",
            Target::Host => "runtime",
        }
    }
}

/// A KV dtype as the plan and bench say it: `bf16`, `f32`, `fp8`, `int8`.
pub fn kv_dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F8E4M3 => "fp8",
        DType::U8 => "int8",
        other => other.as_str(),
    }
}

/// Bytes needed at one context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    pub context: usize,
    pub weights: u64,
    pub kv_cache: u64,
    /// The KV cache's dtype (what [`MemoryPlan::parts`] says of it).
    pub kv_dtype: DType,
    pub rope_tables: u64,
    pub workspace: u64,
    pub runtime: u64,
    pub target: Target,
}

impl MemoryPlan {
    pub fn total(&self) -> u64 {
        crate::models::memory::sum([
            self.weights,
            self.kv_cache,
            self.rope_tables,
            self.workspace,
            self.runtime,
        ])
    }

    /// The terms, e.g. `weights 12.8 GiB, KV cache 204.0 MiB, …`.
    pub fn parts(&self) -> String {
        format!(
            "weights {}, KV cache {} ({}), RoPE tables {}, workspace {}, {} {}",
            iec(self.weights),
            iec(self.kv_cache),
            kv_dtype_name(self.kv_dtype),
            iec(self.rope_tables),
            iec(self.workspace),
            self.target.runtime_name(),
            iec(self.runtime)
        )
    }

    /// One line for banners: the total, its terms, and what is free when known.
    pub fn summary(&self, budget: Option<&Budget>) -> String {
        let of =
            budget.map(|b| format!(" of {} {}", iec(b.free), b.adjective())).unwrap_or_default();
        format!("{} planned ({}){of}", iec(self.total()), self.parts())
    }

    /// For `--json` output.
    pub fn to_json(&self, budget: Option<&Budget>) -> serde_json::Value {
        serde_json::json!({
            "context": self.context,
            "weights_bytes": self.weights,
            "kv_cache_bytes": self.kv_cache,
            "kv_dtype": kv_dtype_name(self.kv_dtype),
            "rope_tables_bytes": self.rope_tables,
            "workspace_bytes": self.workspace,
            "runtime_bytes": self.runtime,
            "total_bytes": self.total(),
            "available_bytes": budget.map(|b| b.free),
        })
    }
}

/// Memory the model may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub free: u64,
    pub target: Target,
}

impl Budget {
    /// Free memory of `device` now: the GPU's free memory, or the host's `MemAvailable` for
    /// `--cpu`. `None` when it cannot be read (then nothing is refused in advance).
    pub fn of(device: &Device) -> Option<Budget> {
        Some(Budget { free: crate::gpu::available(device)?, target: Target::of(device) })
    }

    fn adjective(&self) -> &'static str {
        match (self.target, crate::gpu::memory_cap()) {
            (Target::Gpu, Some(_)) => "free on the GPU within --gpu-memory",
            (Target::Gpu, None) => "free on the GPU",
            (Target::Host, _) => "available on the host",
        }
    }
}

/// The largest `c` in `1..=upto` with `fits(c)`, for a `fits` that holds up to some point and
/// not after (every term of a plan is non-decreasing in the context). `None` when not even 1
/// fits.
pub fn largest_fitting(upto: usize, fits: impl Fn(usize) -> bool) -> Option<usize> {
    if upto == 0 || !fits(1) {
        return None;
    }
    if fits(upto) {
        return Some(upto);
    }
    // Invariant: fits(lo), !fits(hi).
    let (mut lo, mut hi) = (1, upto);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) { lo = mid } else { hi = mid }
    }
    Some(lo)
}

impl Spec {
    /// The largest context up to `upto` whose plan fits in `free` bytes.
    pub fn largest_context(&self, free: u64, upto: usize) -> Option<usize> {
        largest_fitting(upto, |c| self.plan(c).total() <= free)
    }

    /// The plan at this spec's context, or the refusal (exit code 7) when it does not fit in
    /// `budget`. `name`: the model as the user named it; `requested`: the context came from
    /// `--context` (else it is the default, and the message says how to lower it).
    pub fn check(
        &self,
        name: &str,
        budget: Option<&Budget>,
        requested: bool,
    ) -> anyhow::Result<MemoryPlan> {
        let plan = self.plan(self.context);
        let Some(budget) = budget else { return Ok(plan) };
        if plan.total() <= budget.free {
            return Ok(plan);
        }
        let largest = self.largest_context(budget.free, self.context.saturating_sub(1));
        Err(fail(ErrorKind::Memory, refusal(name, &plan, budget, largest, requested)))
    }
}

/// The one-line refusal.
fn refusal(
    name: &str,
    plan: &MemoryPlan,
    budget: &Budget,
    largest: Option<usize>,
    requested: bool,
) -> String {
    let at = if requested {
        format!("--context {}", plan.context)
    } else {
        format!("its default context {}", plan.context)
    };
    let advice = match largest {
        Some(c) if requested => format!("the largest context that fits is {c}"),
        Some(c) => format!("the largest context that fits is {c}: pass --context {c}"),
        None => "it does not fit at any context".to_string(),
    };
    let has = match (budget.target, crate::gpu::memory_cap()) {
        (Target::Gpu, Some(cap)) => {
            format!("--gpu-memory {} leaves {}", iec(cap), iec(budget.free))
        }
        (Target::Gpu, None) => format!("the GPU has {} free", iec(budget.free)),
        (Target::Host, _) => {
            format!("the host has {} available (MemAvailable)", iec(budget.free))
        }
    };
    format!("{name} needs {} at {at} ({}) but {has}; {advice}", iec(plan.total()), plan.parts())
}

#[cfg(test)]
mod tests;
