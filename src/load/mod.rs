//! From a model name to a loaded model on a device: resolve the name (cache id or local path)
//! and tell the format apart (HF safetensors folder, GGUF file, or a bare config.json for dummy
//! weights: [`source`]), decide what to load from the headers ([`spec`]) and check that it fits
//! ([`plan`]) before anything is allocated, load it, and report what was loaded and the device
//! memory it took. [`text`] loads the same model's tokenizer and chat template.
//!
//! Loading sits above the batching engine (`engine`): the memory plan counts the pool the engine
//! will allocate, and [`start`] loads a model inside a new engine thread. The engine itself
//! knows nothing of names, files or formats.

use std::sync::Arc;

use candle_core::{DType, Device};

use crate::dist::{Collective, Shard};
use crate::engine::core::{Built, Engine, EngineConfig};
use crate::error::{ErrorKind, fail};
use crate::gpu::{self, GpuInfo};
use crate::models::arch::{Build, Origin};
use crate::models::batch::{BatchModel, KvDtype};
use crate::models::registry;

mod beats;
pub mod plan;
pub mod ranks;
pub mod source;
pub mod spec;
pub mod text;

pub use plan::{Budget, MemoryPlan, Target};
pub use source::Source;
pub use spec::Spec;

/// Device choice from the command line: a GPU unless `--cpu` was given explicitly.
pub fn open_device(gpu_index: usize, cpu: bool) -> anyhow::Result<(Device, Option<GpuInfo>)> {
    if cpu {
        return Ok((Device::Cpu, None));
    }
    let (dev, info) = gpu::open(gpu_index)?;
    Ok((dev, Some(info)))
}

/// Parses `--dtype`.
pub fn parse_dtype(s: &str) -> anyhow::Result<DType> {
    match s.to_ascii_lowercase().as_str() {
        "f32" | "float32" => Ok(DType::F32),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f16" | "float16" => Ok(DType::F16),
        other => Err(fail(
            ErrorKind::InvalidInput,
            format!("unknown dtype {other:?} (use f32, bf16 or f16)"),
        )),
    }
}

/// What to load and how.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub dtype: Option<DType>,
    pub context: Option<usize>,
    pub dummy: bool,
    /// How the KV cache stores keys and values (`--kv-dtype`): the plan counts its bytes.
    pub kv_dtype: KvDtype,
}

/// A model on its device, with what the banner and benchmarks report.
pub struct Loaded {
    pub model: Box<dyn BatchModel>,
    pub info: ModelInfo,
}

/// What was loaded, apart from the model itself (which an engine thread owns).
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub source: Source,
    pub name: String,
    pub format: String,
    pub dtype: DType,
    /// The KV pool's dtype ([`plan::kv_dtype_name`] says it).
    pub kv_dtype: DType,
    pub context: usize,
    pub max_context: usize,
    /// No `--context` was given and the model's full context did not fit: `context` is the
    /// largest that does.
    pub context_fitted: bool,
    /// What the model was planned to need, and the memory that was free for it.
    pub plan: MemoryPlan,
    pub budget: Option<Budget>,
    /// Device memory taken by loading (weights and RoPE tables), when measurable.
    pub device_bytes: Option<u64>,
    /// GPUs the model is split over (`--tp`); the plan and memory above are one GPU's.
    pub ranks: usize,
    /// How the ranks sum their pieces ([`Collective::sums_through`]); empty on one GPU.
    pub sums: &'static str,
}

impl ModelInfo {
    /// The device for banners: `NVIDIA H100 80GB HBM3 × 2 (--tp 2, sums through peer memory;
    /// plan and memory per GPU)`.
    pub fn device_label(&self, gpu_name: &str) -> String {
        match self.ranks {
            1 => gpu_name.to_string(),
            n => format!(
                "{gpu_name} × {n} (--tp {n}, sums through {}; plan and memory per GPU)",
                self.sums
            ),
        }
    }

    /// The context for banners: `context 8192 (model max 131072; the largest that fits)`.
    pub fn context_label(&self) -> String {
        let why = if self.context_fitted { "; the largest that fits" } else { "" };
        format!("context {} (model max {}{why})", self.context, self.max_context)
    }
}

impl Loaded {
    /// The model and what the banners report about it.
    pub fn split(self) -> (Box<dyn BatchModel>, ModelInfo) {
        (self.model, self.info)
    }
}

/// Loads `name` on `device` inside a new engine thread sized by `size` (from the loaded
/// context): the engine every front end submits to.
pub fn start(
    name: &str,
    opts: &LoadOptions,
    device: &Device,
    size: impl FnOnce(&ModelInfo) -> EngineConfig + Send + 'static,
) -> anyhow::Result<(Engine, ModelInfo)> {
    start_with_draft(name, None, opts, device, size)
}

/// [`start`] with a draft model for speculative decoding (`--draft MODEL`), loaded after the
/// model (its memory plan then sees what the model left) with the same dtype and context.
pub fn start_with_draft(
    name: &str,
    draft: Option<&str>,
    opts: &LoadOptions,
    device: &Device,
    size: impl FnOnce(&ModelInfo) -> EngineConfig + Send + 'static,
) -> anyhow::Result<(Engine, ModelInfo)> {
    let (name, opts, device) = (name.to_string(), opts.clone(), device.clone());
    let draft = draft.map(str::to_string);
    Engine::start_with_draft(move || {
        let (model, info) = load(&name, &opts, &device)?.split();
        let draft = load_draft(draft.as_deref(), model.as_ref(), &info, &opts, &device)?;
        let cfg = size(&info);
        Ok((model, draft, cfg, info))
    })
}

/// [`start_with_draft`] for `role`: on rank 0 of a tensor-parallel group, the other ranks join
/// (`ranks.rs`), each loads its slice, and the engine sends them its steps. The context is rank
/// 0's choice (its plan's largest that fits, or `--context`), which every rank loads.
pub fn start_group(
    name: &str,
    draft: Option<&str>,
    opts: &LoadOptions,
    device: &Device,
    role: ranks::Role,
    size: impl FnOnce(&ModelInfo) -> EngineConfig + Send + 'static,
) -> anyhow::Result<(Engine, ModelInfo)> {
    let mut leader = match role {
        ranks::Role::Single => return start_with_draft(name, draft, opts, device, size),
        ranks::Role::Leader(l) => l,
    };
    let (name, opts, device) = (name.to_string(), opts.clone(), device.clone());
    let draft = draft.map(str::to_string);
    Engine::start_built(move || {
        let world = leader.rv.world;
        // An EAGLE-3 head without an embedding reads the model's whole table on this rank.
        let keep = draft.as_deref().and_then(|d| head_folder(d, opts.dummy));
        let whole_embedding =
            keep.is_some_and(|dir| registry::head_reads_target_embedding(&dir, opts.dummy));
        let context = rank_context(&name, &opts, &device, world, whole_embedding)?;
        let dtype = opts.dtype.map(|d| d.as_str().to_string());
        let (comm, group) =
            leader.join(&name, dtype, context, (opts.dummy, opts.kv_dtype), &device)?;
        let opts = LoadOptions { context: Some(context), ..opts };
        let loaded = load_with(&name, &opts, &device, Some(comm), whole_embedding)?;
        let (model, info) = loaded.split();
        let cfg = size(&info);
        let group = group.ready(&cfg)?;
        let draft = load_draft(draft.as_deref(), model.as_ref(), &info, &opts, &device)?;
        Ok(Built { model, draft, cfg, info, followers: Some(Box::new(group)) })
    })
}

/// The context every rank of `world` loads: `--context`, or the largest rank 0's plan fits (with
/// the whole embedding table beside its rows where `whole_embedding`).
fn rank_context(
    name: &str,
    opts: &LoadOptions,
    device: &Device,
    world: usize,
    whole_embedding: bool,
) -> anyhow::Result<usize> {
    let (_, whole) = prepare(name, opts, Target::of(device))?;
    let mut spec = whole.for_rank(Shard { rank: 0, world }, whole_embedding)?;
    if opts.context.is_none() {
        fit_default_context(&mut spec, Budget::of(device).as_ref());
    }
    Ok(spec.context)
}

/// The drafter for speculative decoding, loaded after `model` (its plan then sees what the
/// model left), with the model's dtype and context, whole on this GPU: `--draft HEAD`, a folder
/// whose config is a draft head's (random weights with `--dummy-weights`), or `--draft MODEL`,
/// a smaller model with the same tokenizer.
fn load_draft(
    draft: Option<&str>,
    model: &dyn BatchModel,
    info: &ModelInfo,
    opts: &LoadOptions,
    device: &Device,
) -> anyhow::Result<Option<crate::engine::spec::Draft>> {
    use crate::engine::spec::Draft;
    let Some(d) = draft else { return Ok(None) };
    if let Some(dir) = head_folder(d, opts.dummy) {
        let (context, dtype) = (info.context, info.dtype);
        let head = registry::load_draft_head(&dir, model, context, dtype, device, opts.dummy);
        return Ok(Some(Draft::Eagle(Box::new(head.map_err(|e| e.context(d.to_string()))?))));
    }
    let opts = LoadOptions { context: Some(info.context), ..opts.clone() };
    let loaded =
        load(d, &opts, device).map_err(|e| e.context(format!("loading the draft model {d}")))?;
    same_tokenizer(&info.source, &loaded.info.source)?;
    Ok(Some(Draft::Model(loaded.split().0)))
}

/// The folder of `name` when its `config.json` is a draft head's.
fn head_folder(name: &str, dummy: bool) -> Option<std::path::PathBuf> {
    let dir = source::resolve(name, dummy).ok()?;
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    registry::is_draft_head(&text).then_some(dir)
}

/// Refuses a draft whose tokenizer maps any token to another id than the model's. Where either
/// side has no tokenizer (random weights from a bare config), the engine's vocabulary-size check
/// is all there is.
fn same_tokenizer(model: &Source, draft: &Source) -> anyhow::Result<()> {
    let (Ok(a), Ok(b)) = (text::load(model), text::load(draft)) else { return Ok(()) };
    let (va, vb) = (a.tokenizer.get_vocab(true), b.tokenizer.get_vocab(true));
    let differ = va.iter().filter(|(tok, id)| vb.get(*tok) != Some(id)).count()
        + vb.keys().filter(|tok| !va.contains_key(*tok)).count();
    if differ > 0 {
        return Err(crate::error::fail(
            crate::error::ErrorKind::InvalidInput,
            format!(
                "the draft model's tokenizer differs from the model's ({differ} tokens have other ids): a draft must share the model's tokenizer"
            ),
        ));
    }
    Ok(())
}

/// Resolves `name` to its files and decides what loading it needs (no tensor data is read):
/// the memory plan of a model on `target`, as `doctor` asks for every cached model.
pub fn prepare(name: &str, opts: &LoadOptions, target: Target) -> anyhow::Result<(Source, Spec)> {
    let path = source::resolve(name, opts.dummy)?;
    let source = Source::detect(&path, opts.dummy)?;
    let spec = Spec::read(&source, opts, target)?;
    Ok((source, spec))
}

/// Resolves `name` (cache id, `id@rev`, local folder or .gguf), checks its memory plan against
/// the device's free memory, and loads it.
pub fn load(name: &str, opts: &LoadOptions, device: &Device) -> anyhow::Result<Loaded> {
    load_with(name, opts, device, None, false)
}

/// [`load`] of rank `comm.shard()`'s slice of a tensor-parallel model: its own memory plan (a
/// refusal names the smallest `--tp` that fits), the whole checkpoint read on the host and its
/// slice put on `device`.
pub fn load_rank(
    name: &str,
    opts: &LoadOptions,
    device: &Device,
    comm: Arc<dyn Collective>,
) -> anyhow::Result<Loaded> {
    load_with(name, opts, device, Some(comm), false)
}

/// [`load_rank`] keeping the whole embedding table beside the rank's rows of it
/// ([`BatchModel::embedding`]): rank 0 of a group whose EAGLE-3 head has no embedding of its
/// own.
pub fn load_rank_with_embedding(
    name: &str,
    opts: &LoadOptions,
    device: &Device,
    comm: Arc<dyn Collective>,
) -> anyhow::Result<Loaded> {
    load_with(name, opts, device, Some(comm), true)
}

fn load_with(
    name: &str,
    opts: &LoadOptions,
    device: &Device,
    comm: Option<Arc<dyn Collective>>,
    whole_embedding: bool,
) -> anyhow::Result<Loaded> {
    let shard = comm.as_ref().map_or(Shard::SINGLE, |c| c.shard());
    let sums = comm.as_ref().map_or("", |c| c.sums_through());
    let (source, whole) = prepare(name, opts, Target::of(device))?;
    let mut spec = whole.for_rank(shard, whole_embedding)?;
    let budget = Budget::of(device);
    let full = spec.context;
    if opts.context.is_none() {
        fit_default_context(&mut spec, budget.as_ref());
    }
    let plan = spec
        .check(name, budget.as_ref(), opts.context.is_some())
        .map_err(|e| with_tp_advice(e, &whole, spec.context, budget.as_ref(), shard))?;
    let (n, max) = (spec.context, spec.max_context);
    if n > max {
        // Positions past the trained maximum get RoPE angles the model never saw (YaRN is
        // scaled for `max`).
        eprintln!(
            "warning: --context {n} is beyond the {max} positions this model was trained for; output past position {max} is untested"
        );
    }
    let before = gpu::memory(device);
    // A rank builds its slice: random weights made in the slice's shapes, or the checkpoint read
    // whole on the host and sliced (the whole embedding table too with `whole_embedding`).
    let b = build_of(&source, &spec, device);
    let built = match comm {
        Some(c) => spec.arch.build_rank(&b, c, whole_embedding),
        None => spec.arch.build(&b),
    };
    let mut model = built.map_err(|e| out_of_memory(e, name, &plan, budget))?;
    model.set_kv_dtype(spec.kv_dtype);
    let after = gpu::memory(device);
    let device_bytes = match (before, after) {
        (Some((free_before, _)), Some((free_after, _))) => {
            Some(free_before.saturating_sub(free_after))
        }
        _ => None,
    };
    let info = ModelInfo {
        format: format_name(&source, &spec),
        source,
        name: name.to_string(),
        dtype: spec.dtype,
        kv_dtype: spec.kv_pool_dtype(),
        context: spec.context,
        max_context: spec.max_context,
        context_fitted: spec.context < full,
        plan,
        budget,
        device_bytes,
        ranks: shard.world,
        sums,
    };
    Ok(Loaded { model, info })
}

/// A refusal by the memory plan, with the smallest `--tp` whose rank's plan fits a GPU like this
/// one (2, 4 or 8).
fn with_tp_advice(
    err: anyhow::Error,
    whole: &Spec,
    context: usize,
    budget: Option<&Budget>,
    shard: Shard,
) -> anyhow::Error {
    let Some(b) = budget.filter(|b| b.target == Target::Gpu) else { return err };
    match whole.smallest_tp(context, b.free, shard.world) {
        Some((w, need)) => fail(
            ErrorKind::Memory,
            format!("{err}; with --tp {w} each GPU needs {}", crate::util::human_bytes_iec(need)),
        ),
        None => err,
    }
}

/// An allocation that failed although the plan fitted (another process took the memory, or
/// the plan fell short): exit code 7 with the numbers, not the driver's bare error.
fn out_of_memory(
    err: anyhow::Error,
    name: &str,
    plan: &MemoryPlan,
    budget: Option<Budget>,
) -> anyhow::Error {
    if !crate::error::is_out_of_memory(&err) {
        return err;
    }
    let iec = crate::util::human_bytes_iec;
    let free = budget.map(|b| format!("; {} was free before loading", iec(b.free)));
    fail(
        ErrorKind::Memory,
        format!(
            "out of GPU memory while loading {name} at context {}: the plan was {} ({}){} (is another process using the GPU?)",
            plan.context,
            iec(plan.total()),
            plan.parts(),
            free.unwrap_or_default()
        ),
    )
}

/// With no `--context`: the model's full trained context when its plan fits the device, else
/// the largest context that does (front ends show both numbers). Agents' first requests are
/// 9k (Codex) to 18k (Claude Code) tokens: a fixed smaller default refuses them for nothing.
fn fit_default_context(spec: &mut Spec, budget: Option<&Budget>) {
    let Some(b) = budget else { return };
    if spec.plan(spec.context).total() > b.free
        && let Some(c) = spec.largest_context(b.free, spec.context)
    {
        spec.context = c;
    }
}

/// The weight format for banners.
fn format_name(source: &Source, spec: &Spec) -> String {
    let format = spec.arch.weight_format();
    match source {
        Source::Gguf(path) => {
            crate::inspect::inspect(path).map(|i| i.format).unwrap_or_else(|_| "GGUF".into())
        }
        Source::HfDir(_) => format.unwrap_or("safetensors").into(),
        Source::Dummy(_) => format.map_or_else(|| "dummy".into(), |f| format!("dummy {f}")),
    }
}

/// What the architecture builds from `source` for `spec` on `device`.
fn build_of<'a>(source: &'a Source, spec: &Spec, device: &'a Device) -> Build<'a> {
    let origin = match source {
        Source::HfDir(dir) => Origin::Checkpoint(dir),
        Source::Gguf(path) => Origin::Gguf(path),
        Source::Dummy(_) => Origin::Random,
    };
    Build { origin, dtype: spec.dtype, context: spec.context, device }
}
