//! `inferno bench MODEL`: llama-bench-style throughput. Prefill: one forward pass over an
//! N-token prompt (default 512). Decode: M tokens generated one at a time (default 128), each
//! step including the argmax read-back a real generation loop pays. One warm-up run, then
//! `--repeat` runs; medians are reported with the GPU name and the device memory the model took.

use std::time::Instant;

use candle_core::Device;

use crate::cli::BenchArgs;
use crate::engine::{self, LoadOptions};
use crate::error::{ErrorKind, fail};
use crate::util::human_bytes;

struct Run {
    prefill_s: f64,
    decode_s: f64,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.prompt_tokens == 0 || args.gen_tokens == 0 || args.repeat == 0 {
        return Err(fail(
            ErrorKind::InvalidInput,
            "--prompt-tokens, --gen-tokens and --repeat must be positive",
        ));
    }
    let (device, gpu) = engine::open_device(args.device.gpu, args.device.cpu)?;
    let dtype = args.device.dtype.as_deref().map(engine::parse_dtype).transpose()?;
    let needed = args.prompt_tokens.checked_add(args.gen_tokens).ok_or_else(|| {
        fail(ErrorKind::InvalidInput, "--prompt-tokens plus --gen-tokens is too large")
    })?;
    let opts = LoadOptions {
        dtype,
        context: Some(args.context.unwrap_or(needed).max(needed)),
        dummy: args.dummy_weights,
    };
    let started = Instant::now();
    let mut loaded = engine::load(&args.model, &opts, &device)?;
    let load_s = started.elapsed().as_secs_f64();
    let vocab = loaded.model.vocab_size();
    let prompt = pseudo_random_tokens(args.prompt_tokens, vocab);

    one_run(loaded.model.as_mut(), &prompt, args.gen_tokens, &device)?; // warm-up
    // Grown as the runs finish: --repeat is the user's number, not an allocation size.
    let mut runs = Vec::new();
    for _ in 0..args.repeat {
        runs.push(one_run(loaded.model.as_mut(), &prompt, args.gen_tokens, &device)?);
    }
    let prefill = median(runs.iter().map(|r| args.prompt_tokens as f64 / r.prefill_s).collect());
    let decode = median(runs.iter().map(|r| args.gen_tokens as f64 / r.decode_s).collect());
    let gpu_name = gpu.as_ref().map(|g| g.name.clone()).unwrap_or_else(|| "CPU".into());
    let mem_now = crate::gpu::memory(&device).map(|(free, total)| total - free);

    if args.json {
        let v = serde_json::json!({
            "model": loaded.name,
            "format": loaded.format,
            "dtype": format!("{:?}", loaded.dtype).to_lowercase(),
            "device": gpu_name,
            "context": loaded.context,
            "prompt_tokens": args.prompt_tokens,
            "gen_tokens": args.gen_tokens,
            "repeat": args.repeat,
            "prefill_tok_s": prefill,
            "decode_tok_s": decode,
            "decode_ms_per_token": 1000.0 / decode,
            "prefill_runs_tok_s": runs.iter().map(|r| args.prompt_tokens as f64 / r.prefill_s).collect::<Vec<_>>(),
            "decode_runs_tok_s": runs.iter().map(|r| args.gen_tokens as f64 / r.decode_s).collect::<Vec<_>>(),
            "memory_plan": loaded.plan.to_json(loaded.budget.as_ref()),
            "model_device_bytes": loaded.device_bytes,
            "device_bytes_in_use": mem_now,
            "load_seconds": load_s,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "model:   {} ({}, {:?}, context {})",
            loaded.name, loaded.format, loaded.dtype, loaded.context
        );
        println!("device:  {gpu_name}");
        println!("plan:    {}", loaded.plan.summary(loaded.budget.as_ref()));
        if let Some(b) = loaded.device_bytes {
            println!("memory:  {} taken by the model (weights + KV cache)", human_bytes(b));
        }
        println!(
            "prefill: pp{:<6} {:>10.1} tok/s   (median of {})",
            args.prompt_tokens, prefill, args.repeat
        );
        println!(
            "decode:  tg{:<6} {:>10.1} tok/s   ({:.2} ms/token)",
            args.gen_tokens,
            decode,
            1000.0 / decode
        );
    }
    Ok(())
}

fn one_run(
    model: &mut dyn crate::models::CausalLm,
    prompt: &[u32],
    steps: usize,
    device: &Device,
) -> anyhow::Result<Run> {
    device.synchronize()?;
    let t0 = Instant::now();
    let logits = model.forward_last(prompt, 0)?;
    let mut next = crate::kernels::argmax(&logits)?.to_scalar::<u32>()?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for i in 0..steps {
        let logits = model.forward_last(&[next], prompt.len() + i)?;
        next = crate::kernels::argmax(&logits)?.to_scalar::<u32>()?;
    }
    let decode_s = t1.elapsed().as_secs_f64();
    Ok(Run { prefill_s, decode_s })
}

/// Deterministic token ids spread over the vocabulary (no RNG state to seed or share).
fn pseudo_random_tokens(n: usize, vocab: usize) -> Vec<u32> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

#[cfg(test)]
mod tests {
    #[test]
    fn median_and_tokens() {
        assert_eq!(super::median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        let t = super::pseudo_random_tokens(1000, 50);
        assert!(t.iter().all(|&x| x < 50));
        assert!(t.iter().collect::<std::collections::BTreeSet<_>>().len() > 40);
    }
}
