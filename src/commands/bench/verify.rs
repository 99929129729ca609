//! `inferno bench MODEL --verify-cost`: what a speculative verify step costs against a one-token
//! step, on the engine's own runner and CUDA graphs. One sequence (`-c N`: N) holds a prompt of
//! `-p` random ids; then steps of 1, 3, 5 and 9 rows a sequence (the last token and 0, 2, 4 or 8
//! drafts) run at the same position again and again (each overwrites the same KV slots, as a
//! rejected draft's are), each followed by the argmax of its rows as a greedy verify does. Random weights cannot show
//! acceptance, so the rates reported are what a drafter that is right for a mean accepted length
//! of 2.0, 2.5 or 3.0 tokens per step would give, from the measured step times.
//!
//! With `--draft HEAD` (an EAGLE-3 head's folder; random weights with `--dummy-weights`) the
//! verify steps also keep the head's hidden-state taps, and each is timed with the head's
//! proposal of as many drafts (its first pass over 3 accepted rows, then the chained passes):
//! the whole cost of a speculative step.

use std::time::Instant;

use candle_core::{DType, Device};

use crate::cli::BenchArgs;
use crate::engine::core::EngineConfig;
use crate::engine::kv::blocks::{BlockConfig, BlockManager, GroupSpec};
use crate::engine::pool::BLOCK_SIZE;
use crate::engine::runner::Runner;
use crate::engine::scheduler::Chunk;
use crate::engine::spec::eagle::EagleDrafter;
use crate::load::{self, LoadOptions};
use crate::models::batch::KvPool;
use crate::models::eagle3::{Eagle3Head, Target};

/// Rows per step measured: one token, and 1, 2, 3, 4, 8 drafts.
const ROWS: [usize; 6] = [1, 2, 3, 4, 5, 9];
/// Mean accepted lengths (tokens a verify step emits) the rates are projected for.
const LENGTHS: [f64; 3] = [2.0, 2.5, 3.0];
/// Steps timed per row count (after as many to warm up and capture the graph).
const STEPS: usize = 200;

pub fn run(
    args: &BenchArgs,
    device: &Device,
    dtype: Option<DType>,
    gpu: Option<String>,
) -> anyhow::Result<()> {
    let prompt = args.prompt_tokens;
    let context = prompt + 2 * BLOCK_SIZE;
    let seqs = args.concurrency.max(1);
    if seqs > 1 && args.spec.draft_model().is_some() {
        anyhow::bail!("--verify-cost with an EAGLE-3 head times one sequence: leave out -c");
    }
    let opts = LoadOptions {
        dtype,
        context: Some(context),
        dummy: args.dummy_weights,
        kv_dtype: args.device.kv_dtype()?,
    };
    let loaded = load::load(&args.model, &opts, device)?;
    let (name, dtype) = (loaded.info.name.clone(), loaded.info.dtype);
    let model = loaded.split().0;
    let shape = model.kv_shape();
    let blocks = seqs * context.div_ceil(BLOCK_SIZE) + 1;
    let groups: Vec<GroupSpec> =
        shape.group_windows.iter().map(|w| GroupSpec { blocks, window: *w }).collect();
    let pool = KvPool::new(&shape, BLOCK_SIZE, &vec![blocks; groups.len()], device)?;
    let mut manager = BlockManager::new(BlockConfig { block_size: BLOCK_SIZE, groups })?;
    let mut runner = Runner::new(model, pool, shape);
    let mut eagle = eagle_head(args, &runner, context, dtype, device)?;
    let vocab = runner.model.vocab_size() as u32;
    // Each sequence its own prompt, so that none shares a block with another.
    let prompt_of = |s: u32| -> Vec<u32> {
        (0..prompt as u32).map(|i| (i * 7919 + 13 + s * 104_729) % vocab).collect()
    };
    for s in 0..seqs {
        let ids = prompt_of(s as u32);
        manager.add_sequence(s as u64, &ids);
        manager.ensure(s as u64, 0, context)?;
        let chunk = Chunk { id: s as u64, start: 0, len: prompt, sample: true, drafts: 0 };
        runner.forward(&[chunk], &[&ids[..]], &manager)?;
    }
    let ids = prompt_of(0);

    // With a head, the one-token step without its taps first (plain decoding), then every step
    // with them (the graphs captured again).
    let plain = match &eagle {
        Some(e) => {
            let t = step_time(&mut runner, &manager, (prompt, 1, seqs), device)?;
            runner.graphs.clear();
            runner.taps = e.taps().to_vec();
            Some(t)
        }
        None => None,
    };
    let mut times = Vec::new();
    let mut draft_times = Vec::new();
    for rows in ROWS {
        times.push(step_time(&mut runner, &manager, (prompt, rows, seqs), device)?);
        if let Some(e) = &mut eagle {
            draft_times.push(eagle_time(e, &mut runner, &ids, rows - 1, device)?);
        }
    }

    let gpu = gpu.unwrap_or_else(|| "CPU".into());
    let who = if seqs == 1 { "one sequence".to_string() } else { format!("{seqs} sequences") };
    println!("model:   {name} ({dtype:?}) · {gpu} · {who} at position {prompt}");
    let base = times[0];
    // What the draft lengths assume a step of so many rows costs (models/step_cost.rs), shown
    // beside the measurement that checks it.
    let cost = runner.model.step_cost();
    println!(
        "rows  drafts   µs/step   × one-token   model ×   tok/s at mean accepted length 2.0 / 2.5 / 3.0"
    );
    let n = seqs as f64;
    for (rows, t) in ROWS.iter().zip(&times) {
        let rates: Vec<String> = if *rows == 1 {
            vec![format!("{:.1} (no speculation)", n / t)]
        } else {
            LENGTHS.iter().map(|l| format!("{:.1}", n * l / t)).collect()
        };
        let model = format!("{:.2}", cost.speculative(seqs, rows - 1));
        println!(
            "{rows:>4}  {:>6}  {:>8.1}  {:>11.2}  {model:>8}   {}",
            rows - 1,
            t * 1e6,
            t / base,
            rates.join(" / ")
        );
    }
    if let Some(plain) = plain {
        println!(
            "EAGLE-3 head: the steps above keep its taps; one token without them: {:.1} µs ({:.1} tok/s)",
            plain * 1e6,
            1.0 / plain
        );
        println!(
            "a step: the verify, then the head's proposal (one pass over 3 rows, then chained passes)"
        );
        println!(
            "drafts  verify µs  draft µs  step µs   tok/s at mean accepted length 2.0 / 2.5 / 3.0 (× plain)"
        );
        for ((rows, t), d) in ROWS.iter().zip(&times).zip(&draft_times).skip(1) {
            let step = t + d;
            let rates: Vec<String> = LENGTHS.iter().map(|l| format!("{:.1}", l / step)).collect();
            let gains: Vec<String> =
                LENGTHS.iter().map(|l| format!("{:.2}", l * plain / step)).collect();
            println!(
                "{:>6}  {:>9.1}  {:>8.1}  {:>7.1}   {} ({})",
                rows - 1,
                t * 1e6,
                d * 1e6,
                step * 1e6,
                rates.join(" / "),
                gains.join(" / ")
            );
        }
    }
    Ok(())
}

/// Seconds one step of `seqs` sequences of `rows` rows each at position `prompt` takes (each
/// one's last token and `rows − 1` drafts, then the argmax of every row), over [`STEPS`] after
/// as many to warm up.
fn step_time(
    runner: &mut Runner,
    manager: &BlockManager,
    (prompt, rows, seqs): (usize, usize, usize),
    device: &Device,
) -> anyhow::Result<f64> {
    let vocab = runner.model.vocab_size() as u32;
    let chunks: Vec<Chunk> = (0..seqs as u64)
        .map(|id| Chunk { id, start: prompt, len: rows, sample: true, drafts: rows - 1 })
        .collect();
    // Each sequence its own ids: rows of one token route alike, so shared ids would read a
    // mixture of experts' weights once for all the sequences.
    let input: Vec<Vec<u32>> = (0..seqs as u32)
        .map(|s| (0..rows as u32).map(|i| (i * 31 + 5 + s * 7919) % vocab).collect())
        .collect();
    let inputs: Vec<&[u32]> = input.iter().map(|v| &v[..]).collect();
    let mut step = || -> anyhow::Result<()> {
        let logits = runner.forward(&chunks, &inputs, manager)?;
        let logits = logits.ok_or_else(|| anyhow::anyhow!("a verify step gave no logits"))?;
        crate::kernels::argmax_rows(&logits)?;
        Ok(())
    };
    for _ in 0..STEPS {
        step()?;
    }
    device.synchronize()?;
    let t0 = Instant::now();
    for _ in 0..STEPS {
        step()?;
    }
    device.synchronize()?;
    Ok(t0.elapsed().as_secs_f64() / STEPS as f64)
}

/// The EAGLE-3 head `--draft` names, when it names one, with its pool beside the runner's.
fn eagle_head(
    args: &BenchArgs,
    runner: &Runner,
    context: usize,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<Option<EagleDrafter>> {
    let Some(dir) = args.spec.draft_model().map(std::path::PathBuf::from) else { return Ok(None) };
    let target = Target::of(runner.model.as_ref());
    let head = if args.dummy_weights {
        Eagle3Head::random(&dir, target, context, dtype, device)?
    } else {
        Eagle3Head::load(&dir, target, context, dtype, device)?
    };
    let cfg = EngineConfig { kv_tokens: context, ..EngineConfig::single(context) };
    Ok(Some(EagleDrafter::new(head, &cfg.pool(), runner.model.tap_layers())?))
}

/// Seconds the head takes to propose `k` drafts (0: none) after a verify step that accepted
/// 2 drafts: its first pass over the 3 rows whose taps the step gave, then `k − 1` chained
/// passes, each with the argmax read back.
fn eagle_time(
    e: &mut EagleDrafter,
    runner: &mut Runner,
    prompt: &[u32],
    k: usize,
    device: &Device,
) -> anyhow::Result<f64> {
    if k == 0 {
        return Ok(0.0);
    }
    let p = prompt.len();
    let taps = runner.last_taps.clone().ok_or_else(|| anyhow::anyhow!("no taps"))?;
    let rows = taps.narrow(0, 0, 1)?.repeat((3, 1))?;
    let mut tokens = prompt.to_vec();
    tokens.extend_from_slice(&[1, 2, 3]);
    let mut run = || -> anyhow::Result<()> {
        // The step computed positions p − 1..p + 2 (the last token and 2 accepted drafts).
        e.record(0, p - 1, rows.clone())?;
        e.propose(0, &tokens, k)?;
        Ok(())
    };
    for _ in 0..STEPS / 4 {
        run()?;
    }
    device.synchronize()?;
    let t0 = Instant::now();
    for _ in 0..STEPS {
        run()?;
    }
    device.synchronize()?;
    Ok(t0.elapsed().as_secs_f64() / STEPS as f64)
}
