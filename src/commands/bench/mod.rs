//! `inferno bench MODEL`: throughput through the engine, the path play and serve use.
//!
//! Each run submits `--concurrency` requests at once, each with its own pseudo-random prompt of
//! `-p` tokens (distinct per run and stream, so the prefix cache never serves one) and `-n`
//! tokens to generate greedily with no end id. At concurrency 1 this is llama-bench's pp/tg
//! pair: prefill is the prompt over the time to the first token, decode the other tokens over
//! the time after it. At higher concurrency it reports the aggregate rate (all generated
//! tokens over the run's wall time, prefill included), the decode rate while all streams decode
//! (streams over the mean time of such a step: their inter-token latency), each stream's
//! decode rate, and the TTFT percentiles. One
//! warm-up run (none with `INFERNO_BENCH_WARMUP=0`), then `--repeat` runs; medians are reported
//! with the GPU name and memory.
//!
//! With `--draft` it reports what speculation drafted and accepted; `--prompt-file` gives it real
//! text to copy from; `--verify-cost` times the verify steps themselves ([`verify`]).

mod verify;

use std::time::{Duration, Instant};

use crate::cli::BenchArgs;
use crate::engine::constraint::{Constraint, Grammars};
use crate::engine::core::{Engine, EngineConfig};
use crate::engine::request::{Event, Request};
use crate::engine::spec::{SpecConfig, SpecStats};
use crate::error::{ErrorKind, fail};
use crate::generate::SamplerConfig;
use crate::load::plan::kv_dtype_name;
use crate::load::{self, LoadOptions};
use crate::util::human_bytes;

/// Streams one run may submit: far more than a step batches (64), small enough that the
/// prompts and the KV pool's size cannot overflow.
const MAX_CONCURRENCY: usize = 4096;

/// One stream of one run.
struct Stream {
    ttft: Duration,
    decode: Duration,
    generated: usize,
}

/// One run: its streams and its wall time.
struct Run {
    streams: Vec<Stream>,
    wall: Duration,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    // First: a tensor-parallel rank other than 0 follows rank 0 and never returns.
    crate::gpu::cap_memory(args.device.gpu_memory);
    let role = load::ranks::role(args.device.tp, args.device.gpu, args.device.cpu)?;
    if args.prompt_tokens == 0 || args.gen_tokens == 0 || args.repeat == 0 || args.concurrency == 0
    {
        return Err(fail(
            ErrorKind::InvalidInput,
            "--prompt-tokens, --gen-tokens, --repeat and --concurrency must be positive",
        ));
    }
    if args.concurrency > MAX_CONCURRENCY {
        return Err(fail(
            ErrorKind::InvalidInput,
            format!("--concurrency is at most {MAX_CONCURRENCY}, not {}", args.concurrency),
        ));
    }
    let sampling = super::play::sampler_config(&args.sampling, SamplerConfig::greedy())?;
    let (device, gpu) = load::open_device(role.gpu(args.device.gpu), args.device.cpu)?;
    let dtype = args.device.dtype.as_deref().map(load::parse_dtype).transpose()?;
    if args.verify_cost {
        return verify::run(&args, &device, dtype, gpu.map(|g| g.name));
    }
    let needed = args.prompt_tokens.checked_add(args.gen_tokens).ok_or_else(|| {
        fail(ErrorKind::InvalidInput, "--prompt-tokens plus --gen-tokens is too large")
    })?;
    // A prompt file's length is known once the tokenizer is loaded: room for a page of text.
    let floor = if args.prompt_file.is_some() { 4096 } else { needed };
    let context = args.context.unwrap_or(floor).max(needed);
    let kv_dtype = args.device.kv_dtype()?;
    let opts = LoadOptions { dtype, context: Some(context), dummy: args.dummy_weights, kv_dtype };
    let streams = args.concurrency;
    let step_tokens = args.step_tokens;
    let spec = args.spec.config()?;
    let started = Instant::now();
    let draft = args.spec.draft_model();
    let (engine, loaded) =
        load::start_group(&args.model, draft, &opts, &device, role, move |info| EngineConfig {
            max_seqs: streams,
            // Every stream's whole sequence, plus a block each for rounding.
            kv_tokens: streams
                .saturating_mul(info.context.saturating_add(crate::engine::pool::BLOCK_SIZE)),
            token_budget: step_tokens,
            pipeline: crate::switches::pipeline(),
            spec,
        })?;
    let load_s = started.elapsed().as_secs_f64();
    let vocab = engine.vocab_size();
    let file_prompt = prompt_from_file(&args, &loaded.source, engine.context())?;
    let prompt_tokens = file_prompt.as_ref().map_or(args.prompt_tokens, |p| p.0.len());
    let mut seed = 0u64;
    let mut next_prompts = || {
        (0..streams)
            .map(|_| {
                seed += 1;
                match &file_prompt {
                    Some((ids, _)) => ids.clone(),
                    None => pseudo_random_tokens(args.prompt_tokens, vocab, seed),
                }
            })
            .collect::<Vec<_>>()
    };
    let grammar = schema_grammar(&args, &loaded.source, vocab)?;
    let eos_ids = file_prompt.as_ref().map(|p| p.1.clone()).unwrap_or_default();
    let sampling = Sampling { config: sampling, grammar, eos_ids };
    if crate::switches::bench_warmup() {
        one_run(&engine, next_prompts(), args.gen_tokens, &sampling)?;
    }
    let spec_before = engine.stats().spec;
    let before = engine.stats().decode_steps.get(&streams).copied().unwrap_or_default();
    let mut runs = Vec::new();
    for _ in 0..args.repeat {
        runs.push(one_run(&engine, next_prompts(), args.gen_tokens, &sampling)?);
    }
    // Steps in which all streams decoded: their mean time is the inter-token latency of a full
    // batch, and streams over it the aggregate decode rate (what SGLang's and vLLM's batch
    // numbers are).
    let after = engine.stats().decode_steps.get(&streams).copied().unwrap_or_default();
    let spec = spec.map(|c| (c, spec_delta(spec_before, engine.stats().spec)));
    let full_steps = after.0.saturating_sub(before.0);
    let full_step_s = after.1.saturating_sub(before.1).as_secs_f64() / full_steps.max(1) as f64;
    let full_decode = if full_steps > 0 { streams as f64 / full_step_s } else { 0.0 };
    let gpu_name = gpu.as_ref().map(|g| g.name.clone()).unwrap_or_else(|| "CPU".into());
    let mem_now = crate::gpu::memory(&device).map(|(free, total)| total - free);
    let r = Report::of(&runs, prompt_tokens);

    if args.json {
        let v = serde_json::json!({
            "model": loaded.name,
            "sampling": sampling_line(&sampling.config),
            "constrained": constrained_json(&sampling, &runs),
            "format": loaded.format,
            "dtype": format!("{:?}", loaded.dtype).to_lowercase(),
            "kv_dtype": kv_dtype_name(loaded.kv_dtype),
            "device": gpu_name,
            "tp": loaded.ranks,
            "context": loaded.context,
            "concurrency": streams,
            "step_tokens": step_tokens,
            "prompt_tokens": prompt_tokens,
            "prompt_file": args.prompt_file,
            "speculation": spec_json(spec),
            "gen_tokens": args.gen_tokens,
            "repeat": args.repeat,
            "prefill_tok_s": r.prefill,
            "decode_tok_s": r.decode,
            "decode_ms_per_token": 1000.0 / r.decode,
            "aggregate_tok_s": r.aggregate,
            "full_batch_decode_tok_s": full_decode,
            "full_batch_step_ms": full_step_s * 1e3,
            "ttft_p50_ms": r.ttft_p50 * 1e3,
            "ttft_p99_ms": r.ttft_p99 * 1e3,
            "decode_runs_tok_s": r.decode_runs,
            "memory_plan": loaded.plan.to_json(loaded.budget.as_ref()),
            "model_device_bytes": loaded.device_bytes,
            "device_bytes_in_use": mem_now,
            "load_seconds": load_s,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "model:   {} ({}, {:?}, KV {}, context {})",
        loaded.name,
        loaded.format,
        loaded.dtype,
        kv_dtype_name(loaded.kv_dtype),
        loaded.context
    );
    println!("device:  {}", loaded.device_label(&gpu_name));
    println!("plan:    {}", loaded.plan.summary(loaded.budget.as_ref()));
    println!("sample:  {}", sampling_line(&sampling.config));
    if let Some(line) = constrained_line(&sampling, &runs) {
        println!("{line}");
    }
    if let Some(line) = spec_line(spec) {
        println!("{line}");
    }
    if let Some(b) = loaded.device_bytes {
        println!("memory:  {} taken by the model (weights + KV cache)", human_bytes(b));
    }
    let n = args.repeat;
    if streams == 1 {
        println!("prefill: pp{:<6} {:>10.1} tok/s   (median of {n})", prompt_tokens, r.prefill);
        println!(
            "decode:  tg{:<6} {:>10.1} tok/s   ({:.2} ms/token)",
            args.gen_tokens,
            r.decode,
            1000.0 / r.decode
        );
    } else {
        println!(
            "streams: {streams} × (pp{} + tg{})   (median of {n} runs)",
            prompt_tokens, args.gen_tokens
        );
        println!("aggregate:  {:>10.1} tok/s generated (prefill included)", r.aggregate);
        println!(
            "decode:     {:>10.1} tok/s with all {streams} streams decoding ({:.2} ms a step)",
            full_decode,
            full_step_s * 1e3
        );
        println!("per stream: {:>10.1} tok/s decode (median)", r.decode);
        println!("TTFT:       p50 {:.1} ms, p99 {:.1} ms", r.ttft_p50 * 1e3, r.ttft_p99 * 1e3);
    }
    Ok(())
}

/// Per-stream decode rates (median over runs and streams) of the constrained streams and the
/// others, with `--json-schema`.
fn group_rates(sampling: &Sampling, runs: &[Run]) -> Option<(usize, f64, f64)> {
    let (_, n) = sampling.grammar.as_ref()?;
    let rate = |s: &Stream| s.generated.saturating_sub(1) as f64 / s.decode.as_secs_f64().max(1e-9);
    let group = |constrained: bool| {
        let v: Vec<f64> = runs
            .iter()
            .flat_map(|r| r.streams.iter().enumerate())
            .filter(|(i, _)| (*i < *n) == constrained)
            .map(|(_, s)| rate(s))
            .collect();
        if v.is_empty() { 0.0 } else { median(v) }
    };
    Some((*n, group(true), group(false)))
}

fn constrained_json(sampling: &Sampling, runs: &[Run]) -> serde_json::Value {
    match group_rates(sampling, runs) {
        Some((n, c, u)) => {
            serde_json::json!({"streams": n, "decode_tok_s": c, "unconstrained_decode_tok_s": u})
        }
        None => serde_json::Value::Null,
    }
}

fn constrained_line(sampling: &Sampling, runs: &[Run]) -> Option<String> {
    let (n, c, u) = group_rates(sampling, runs)?;
    Some(format!(
        "schema:  {n} constrained stream(s) {c:.1} tok/s decode, the others {u:.1} tok/s (medians)"
    ))
}

/// The sampling settings in a few words.
fn sampling_line(c: &SamplerConfig) -> String {
    if c.is_greedy() && c.is_unpenalised() {
        return "greedy".into();
    }
    format!(
        "temperature {} top-k {:?} top-p {:?} min-p {:?} repeat-penalty {} presence {} frequency {}",
        c.temperature,
        c.top_k,
        c.top_p,
        c.min_p,
        c.repeat_penalty,
        c.presence_penalty,
        c.frequency_penalty
    )
}

/// How the streams sample: the settings, with `--json-schema` the grammar's fresh state and
/// how many streams (the first ones) follow it, and the ids that end a reply (none unless the
/// prompt is real text).
struct Sampling {
    config: SamplerConfig,
    grammar: Option<(Constraint, usize)>,
    eos_ids: Vec<u32>,
}

/// `--prompt-file`: the file's text as a chat prompt for the model, and the model's end ids.
fn prompt_from_file(
    args: &BenchArgs,
    source: &load::Source,
    context: usize,
) -> anyhow::Result<Option<(Vec<u32>, Vec<u32>)>> {
    let Some(path) = &args.prompt_file else { return Ok(None) };
    let text = std::fs::read_to_string(path)
        .map_err(|e| fail(ErrorKind::NotFound, format!("{}: {e}", path.display())))?;
    let side = load::text::load(source)?;
    let rendered = match &side.template {
        Some(t) => {
            let messages = [crate::template::Message::new("user", text.trim_end())];
            t.render(&messages, true, &serde_json::Value::Null)?
        }
        None => text,
    };
    let ids = side.encode_chat(&rendered)?;
    if ids.len() + args.gen_tokens > context {
        return Err(fail(
            ErrorKind::InvalidInput,
            format!(
                "{}: {} prompt tokens and {} to generate do not fit the context of {context}: raise --context",
                path.display(),
                ids.len(),
                args.gen_tokens
            ),
        ));
    }
    Ok(Some((ids, side.eos_ids)))
}

/// What speculation did between two readings of the engine's statistics.
fn spec_delta(before: SpecStats, after: SpecStats) -> SpecStats {
    SpecStats {
        drafts: after.drafts - before.drafts,
        draft_tokens: after.draft_tokens - before.draft_tokens,
        accepted_tokens: after.accepted_tokens - before.accepted_tokens,
    }
}

fn spec_line(spec: Option<(SpecConfig, SpecStats)>) -> Option<String> {
    let (c, s) = spec?;
    Some(format!(
        "draft:   {}, up to {} tokens · {} drafts of {:.2} tokens on average, {:.1}% of draft tokens accepted, mean accepted length {:.2}",
        drafter_name(c),
        c.draft_tokens,
        s.drafts,
        s.mean_draft_length(),
        100.0 * s.acceptance_rate(),
        s.mean_accepted_length()
    ))
}

fn drafter_name(c: SpecConfig) -> &'static str {
    match c.drafter {
        crate::engine::spec::Drafter::Ngram => "ngram",
        crate::engine::spec::Drafter::Model => "draft model",
        crate::engine::spec::Drafter::Eagle => "EAGLE-3 head",
    }
}

fn spec_json(spec: Option<(SpecConfig, SpecStats)>) -> serde_json::Value {
    match spec {
        Some((c, s)) => serde_json::json!({
            "drafter": drafter_name(c),
            "draft_tokens": c.draft_tokens,
            "drafts": s.drafts,
            "draft_tokens_verified": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens,
            "acceptance_rate": s.acceptance_rate(),
            "mean_accepted_length": s.mean_accepted_length(),
            "mean_draft_length": s.mean_draft_length(),
        }),
        None => serde_json::Value::Null,
    }
}

/// `--json-schema`: the schema compiled for the model's tokenizer, and the streams it governs.
fn schema_grammar(
    args: &BenchArgs,
    source: &load::Source,
    vocab: usize,
) -> anyhow::Result<Option<(Constraint, usize)>> {
    let Some(path) = &args.json_schema else { return Ok(None) };
    let text = std::fs::read_to_string(path)
        .map_err(|e| fail(ErrorKind::NotFound, format!("{}: {e}", path.display())))?;
    let schema: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| fail(ErrorKind::InvalidInput, format!("{}: {e}", path.display())))?;
    let side = load::text::load(source)?;
    // The streams never stop early: any id ends the grammar's text (none is an end id here).
    let grammars = Grammars::new(&side.tokenizer, vocab, &side.eos_ids)?;
    let g = grammars
        .compile(llguidance::api::TopLevelGrammar::from_json_schema(schema))
        .map_err(|e| fail(ErrorKind::InvalidInput, format!("{}: {e:#}", path.display())))?;
    let n = args.constrained.unwrap_or(args.concurrency).min(args.concurrency);
    Ok(Some((g, n)))
}

/// Submits every prompt at once (stream `i` sampling with seed `sampling.seed + i`) and waits
/// for all of them.
fn one_run(
    engine: &Engine,
    prompts: Vec<Vec<u32>>,
    new_tokens: usize,
    sampling: &Sampling,
) -> anyhow::Result<Run> {
    let t0 = Instant::now();
    let mut handles = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.into_iter().enumerate() {
        let seed = sampling.config.seed.wrapping_add(i as u64);
        let constraint = match &sampling.grammar {
            Some((g, n)) if i < *n => Some(g.clone()),
            _ => None,
        };
        let request = Request {
            prompt,
            sampling: SamplerConfig { seed, ..sampling.config.clone() },
            max_tokens: new_tokens,
            eos_ids: sampling.eos_ids.clone(),
            interrupt: None,
            logprobs: None,
            forced: Vec::new(),
            constraint,
            prediction: Vec::new(),
        };
        handles.push(engine.submit(request)?);
    }
    let mut streams = Vec::with_capacity(handles.len());
    for mut h in handles {
        let finish = loop {
            match h.blocking_next() {
                Some(Event::Token(_, _)) => {}
                Some(Event::Finished(f)) => break f,
                Some(Event::Failed(msg)) => return Err(anyhow::anyhow!(msg)),
                None => anyhow::bail!("the engine stopped during the benchmark"),
            }
        };
        streams.push(Stream {
            ttft: finish.time_to_first_token,
            decode: finish.decode_time,
            generated: finish.generated,
        });
    }
    Ok(Run { streams, wall: t0.elapsed() })
}

/// Medians over runs.
struct Report {
    prefill: f64,
    decode: f64,
    aggregate: f64,
    ttft_p50: f64,
    ttft_p99: f64,
    decode_runs: Vec<f64>,
}

impl Report {
    fn of(runs: &[Run], prompt: usize) -> Report {
        let rate = |s: &Stream| {
            let n = s.generated.saturating_sub(1) as f64;
            n / s.decode.as_secs_f64().max(1e-9)
        };
        // Per run: the median stream.
        let decode_runs: Vec<f64> =
            runs.iter().map(|r| median(r.streams.iter().map(rate).collect())).collect();
        let ttfts: Vec<f64> =
            runs.iter().flat_map(|r| r.streams.iter().map(|s| s.ttft.as_secs_f64())).collect();
        Report {
            prefill: median(
                runs.iter()
                    .map(|r| prompt as f64 / r.streams[0].ttft.as_secs_f64().max(1e-9))
                    .collect(),
            ),
            decode: median(decode_runs.clone()),
            aggregate: median(
                runs.iter()
                    .map(|r| {
                        let total: usize = r.streams.iter().map(|s| s.generated).sum();
                        total as f64 / r.wall.as_secs_f64().max(1e-9)
                    })
                    .collect(),
            ),
            ttft_p50: percentile(ttfts.clone(), 0.50),
            ttft_p99: percentile(ttfts, 0.99),
            decode_runs,
        }
    }
}

/// Deterministic token ids spread over the vocabulary, a different sequence per `seed`.
fn pseudo_random_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ seed.wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn median(v: Vec<f64>) -> f64 {
    percentile(v, 0.5)
}

/// The `q` quantile by linear interpolation between closest ranks (0 for no values).
fn percentile(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn median_and_tokens() {
        assert_eq!(super::median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(super::percentile(vec![1.0, 2.0, 3.0, 4.0, 5.0], 0.99), 4.96);
        let t = super::pseudo_random_tokens(1000, 50, 1);
        assert!(t.iter().all(|&x| x < 50));
        assert!(t.iter().collect::<std::collections::BTreeSet<_>>().len() > 40);
        assert_ne!(t, super::pseudo_random_tokens(1000, 50, 2));
    }
}
