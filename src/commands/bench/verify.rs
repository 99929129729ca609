//! `inferno bench MODEL --verify-cost`: what a speculative verify step costs against a one-token
//! step, on the engine's own runner and CUDA graphs. One sequence holds a prompt of `-p` random
//! ids; then steps of 1, 3, 5 and 9 rows (the last token and 0, 2, 4 or 8 drafts) run at the
//! same position again and again (each overwrites the same KV slots, as a rejected draft's are),
//! each followed by the argmax of its rows as a greedy verify does. Random weights cannot show
//! acceptance, so the rates reported are what a drafter that is right for a mean accepted length
//! of 2.0, 2.5 or 3.0 tokens per step would give, from the measured step times.

use std::time::Instant;

use candle_core::{DType, Device};

use crate::cli::BenchArgs;
use crate::engine::core::BLOCK_SIZE;
use crate::engine::kv::blocks::{BlockConfig, BlockManager, GroupSpec};
use crate::engine::runner::Runner;
use crate::engine::scheduler::Chunk;
use crate::load::{self, LoadOptions};
use crate::models::batch::KvPool;

/// Rows per step measured: one token, and 2, 4, 8 drafts.
const ROWS: [usize; 4] = [1, 3, 5, 9];
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
    let blocks = context.div_ceil(BLOCK_SIZE) + 1;
    let groups: Vec<GroupSpec> =
        shape.group_windows.iter().map(|w| GroupSpec { blocks, window: *w }).collect();
    let pool = KvPool::new(&shape, BLOCK_SIZE, &vec![blocks; groups.len()], device)?;
    let mut manager = BlockManager::new(BlockConfig { block_size: BLOCK_SIZE, groups })?;
    let mut runner = Runner::new(model, pool, shape);
    let vocab = runner.model.vocab_size() as u32;
    let ids: Vec<u32> = (0..prompt as u32).map(|i| (i * 7919 + 13) % vocab).collect();
    manager.add_sequence(0, &ids);
    manager.ensure(0, 0, context)?;
    let chunk = Chunk { id: 0, start: 0, len: prompt, sample: true, drafts: 0 };
    runner.forward(&[chunk], &[&ids[..]], &manager)?;

    let mut times = Vec::new();
    for rows in ROWS {
        let chunk = Chunk { id: 0, start: prompt, len: rows, sample: true, drafts: rows - 1 };
        let input: Vec<u32> = (0..rows as u32).map(|i| (i * 31 + 5) % vocab).collect();
        let mut step = || -> anyhow::Result<()> {
            let logits = runner.forward(&[chunk], &[&input[..]], &manager)?;
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
        times.push(t0.elapsed().as_secs_f64() / STEPS as f64);
    }

    let gpu = gpu.unwrap_or_else(|| "CPU".into());
    println!("model:   {name} ({dtype:?}) · {gpu} · one sequence at position {prompt}");
    let base = times[0];
    println!(
        "rows  drafts   µs/step   × one-token   tok/s at mean accepted length 2.0 / 2.5 / 3.0"
    );
    for (rows, t) in ROWS.iter().zip(&times) {
        let rates: Vec<String> = if *rows == 1 {
            vec![format!("{:.1} (no speculation)", 1.0 / t)]
        } else {
            LENGTHS.iter().map(|l| format!("{:.1}", l / t)).collect()
        };
        println!(
            "{rows:>4}  {:>6}  {:>8.1}  {:>11.2}   {}",
            rows - 1,
            t * 1e6,
            t / base,
            rates.join(" / ")
        );
    }
    Ok(())
}
