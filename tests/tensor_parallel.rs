//! Tensor parallelism's sharding math on the CPU, ranks as threads (`dist::ThreadGroup`): a model
//! split over 2 and 4 ranks gives the logits of the whole model on one (f32, within 1e-5 of the
//! largest logit) and the same greedy tokens, for gpt-oss (heads, sinks, MXFP4 experts split at
//! block boundaries, key/value heads replicated past their count, a vocabulary that does not
//! divide), Llama and Gemma 3 (its post-norms after the sum). The GPU run of the same (NCCL, one process per GPU) is
//! `gpu_tp_matches_one_rank` in tests/tensor_parallel_gpu.rs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device};
use inferno::dist::{Collective, ThreadGroup};
use inferno::load::{self, LoadOptions};

mod common;
use common::one_seq::OneSeq;

const PROMPT: [u32; 21] =
    [3, 17, 99, 4, 250 - 1, 8, 12, 5, 5, 77, 31, 2, 9, 64, 128, 200, 1, 0, 45, 46, 47];
const DECODE: usize = 12;

fn opts() -> LoadOptions {
    LoadOptions {
        dtype: Some(DType::F32),
        context: Some(64),
        dummy: false,
        kv_dtype: Default::default(),
    }
}

/// What rank 0 saw: the prompt's logits `[len, vocab]`, then each greedy step's.
struct Run {
    prompt: Vec<Vec<f32>>,
    steps: Vec<Vec<f32>>,
    tokens: Vec<u32>,
}

fn drive(mut seq: OneSeq) -> Run {
    let prompt: Vec<Vec<f32>> = seq.forward_all(&PROMPT, 0).unwrap().to_vec2().unwrap();
    // Greedy from a fresh sequence through the runner, as the engine decodes.
    let mut seq_logits = seq.forward_last(&PROMPT, 0).unwrap();
    let (mut steps, mut tokens) = (Vec::new(), Vec::new());
    for i in 0..DECODE {
        let row: Vec<f32> = seq_logits.to_vec1().unwrap();
        let next = argmax(&row);
        steps.push(row);
        tokens.push(next);
        seq_logits = seq.forward_last(&[next], PROMPT.len() + i).unwrap();
    }
    Run { prompt, steps, tokens }
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32
}

/// The model in `dir` over `world` ranks (threads); rank 0's run, and every rank's tokens.
fn run(dir: &Path, world: usize) -> Run {
    if world == 1 {
        let model = load::load(dir.to_str().unwrap(), &opts(), &Device::Cpu).unwrap().model;
        return drive(OneSeq::new(model));
    }
    let ends = ThreadGroup::new(world);
    let runs: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = ends
            .into_iter()
            .map(|end| {
                s.spawn(move || {
                    let comm: Arc<dyn Collective> = Arc::new(end);
                    let name = dir.to_str().unwrap();
                    let loaded = load::load_rank(name, &opts(), &Device::Cpu, comm).unwrap();
                    drive(OneSeq::new(loaded.model))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    });
    for (r, other) in runs.iter().enumerate().skip(1) {
        assert_eq!(other.tokens, runs[0].tokens, "rank {r} decoded other tokens than rank 0");
        assert_eq!(other.steps, runs[0].steps, "rank {r}'s logits are not rank 0's bits");
    }
    runs.into_iter().next().unwrap()
}

/// Largest |a − b| over the largest |b|, over all rows.
fn relative(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    let (mut diff, mut scale) = (0f32, 0f32);
    for (ra, rb) in a.iter().zip(b) {
        assert_eq!(ra.len(), rb.len(), "vocabulary sizes differ");
        for (x, y) in ra.iter().zip(rb) {
            diff = diff.max((x - y).abs());
            scale = scale.max(y.abs());
        }
    }
    diff / scale
}

fn check(dir: &Path, worlds: &[usize]) {
    let one = run(dir, 1);
    for &world in worlds {
        let tp = run(dir, world);
        let (p, s) = (relative(&tp.prompt, &one.prompt), relative(&tp.steps, &one.steps));
        eprintln!("TP{world}: prompt logits within {p:.1e}, decode logits within {s:.1e} of TP1");
        assert!(p < 1e-5 && s < 1e-5, "TP{world}: logits off by {p:e} / {s:e}");
        assert_eq!(tp.tokens, one.tokens, "TP{world}: greedy tokens differ");
    }
}

#[test]
fn gpt_oss_over_2_and_4_ranks_gives_one_ranks_logits_and_tokens() {
    let dir = common::tp::wide_gpt_oss();
    check(dir.path(), &[2, 4]);
}

#[test]
fn llama_over_2_and_4_ranks_gives_one_ranks_logits_and_tokens() {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llama3_tiny"));
    check(&dir, &[2, 4]);
}

/// Qwen3's q/k norms: one weight for all heads, whole on every rank.
#[test]
fn qwen3_over_2_and_4_ranks_gives_one_ranks_logits_and_tokens() {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen3_tiny"));
    check(&dir, &[2, 4]);
}

#[test]
fn gemma3_over_2_and_4_ranks_gives_one_ranks_logits_and_tokens() {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gemma3_tiny"));
    check(&dir, &[2, 4]);
}

#[test]
fn ranks_that_do_not_divide_the_heads_are_refused_in_one_line() {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llama3_tiny"));
    let ends = ThreadGroup::new(3);
    let end: Arc<dyn Collective> = Arc::new(ends.into_iter().next().unwrap());
    let err = load::load_rank(dir.to_str().unwrap(), &opts(), &Device::Cpu, end).err().unwrap();
    let msg = format!("{err:#}");
    assert!(msg.contains("--tp 3 must divide the model's 4 attention heads"), "{msg}");
    assert_eq!(msg.lines().count(), 1, "{msg}");
}

/// Rendezvous variables that cannot work end in one line and exit code 9 within the join
/// timeout, before any GPU is touched: a rank whose rank 0 is not there (nothing listens at
/// `MASTER_ADDR:MASTER_PORT`), and a rank 0 whose `MASTER_ADDR` is not this machine's (a
/// documentation address: binding it fails at once, nothing is sent).
#[test]
fn a_wrong_master_addr_is_one_line_and_exit_9() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/configs/tinyllama-1.1b.json");
    let run = |rank: &str, addr: &str| {
        let t0 = std::time::Instant::now();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferno"))
            .args(["bench", config, "--dummy-weights", "--tp", "2", "-p", "8", "-n", "4"])
            .envs([("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", "2")])
            .env("MASTER_ADDR", addr)
            .env("MASTER_PORT", port.to_string())
            .env("INFERNO_TP_JOIN_TIMEOUT", "2")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(9), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(30), "{:?}", t0.elapsed());
        err
    };
    let err = run("1", "127.0.0.1");
    let want = format!("rank 1 could not reach rank 0 at 127.0.0.1:{port} within 2 s");
    assert!(err.contains(&want), "{err}");
    let err = run("0", "192.0.2.1");
    assert!(err.contains("rank 0 cannot listen on 192.0.2.1:"), "{err}");
}

/// An engine on rank 0 whose steps reach the other ranks (threads here) as the words
/// `engine/ranks.rs` encodes, each following with its own runner and pool: continuous batching
/// of several requests (prefill chunks beside decodes, sequences finishing at different steps)
/// gives the tokens one rank's engine gives. Their greedy rows are drawn on the ranks (each
/// rank's candidates of its own logits, `Runner::forward_drawn`) but for one request that asks
/// for log probabilities, whose steps gather the logits.
#[test]
fn an_engine_over_ranks_decodes_what_one_rank_decodes() {
    let (one, tp) = one_rank_and_two(None, |_| Vec::new());
    assert_eq!(tp, one, "rank 0's engine over 2 ranks decoded other tokens");
}

/// The same with drafts to verify: each request predicts its own reply but for a wrong token
/// in the middle (OpenAI's predicted outputs), so that steps verify several rows a sequence,
/// drawn on the ranks, accept some and reject the rest.
#[test]
fn an_engine_over_ranks_verifies_drafts_as_one_rank_does() {
    let (plain, _) = one_rank_and_two(None, |_| Vec::new());
    let spec = inferno::engine::spec::SpecConfig {
        max_batch: usize::MAX,
        ..inferno::engine::spec::SpecConfig::ngram(4).expect("draft tokens")
    };
    let replies = plain.clone();
    let predicted = move |i: usize| {
        let mut p = replies[i].clone();
        let mid = p.len() / 2;
        p[mid] = (p[mid] + 1) % 250;
        p
    };
    let (one, tp) = one_rank_and_two(Some(spec), predicted);
    assert_eq!(one, plain, "one rank's drafts changed its greedy tokens");
    assert_eq!(tp, one, "rank 0's engine over 2 ranks verified drafts into other tokens");
}

/// Four requests on one rank's engine and on an engine over 2 ranks (threads), with `spec` and
/// each request's predicted output: each engine's tokens.
fn one_rank_and_two(
    spec: Option<inferno::engine::spec::SpecConfig>,
    prediction: impl Fn(usize) -> Vec<u32>,
) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    use inferno::engine::core::{Built, Engine, EngineConfig};
    use inferno::engine::request::Request;
    use inferno::generate::SamplerConfig;

    let dir = common::tp::wide_gpt_oss();
    let name = dir.path().to_str().unwrap().to_string();
    let cfg = EngineConfig {
        max_seqs: 4,
        kv_tokens: 4 * 64,
        token_budget: 16, // prompts of 21 run in two chunks, beside other sequences' decodes
        pipeline: false,
        spec,
    };
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| PROMPT.iter().skip(i * 3).map(|&t| (t + i as u32) % 250).collect())
        .collect();
    let generate = move |engine: &Engine| -> Vec<Vec<u32>> {
        let handles: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let req = Request {
                    prompt: p.clone(),
                    sampling: SamplerConfig::greedy(),
                    max_tokens: 6 + 5 * i,
                    eos_ids: Vec::new(),
                    interrupt: None,
                    logprobs: (i == 0).then_some(3),
                    forced: Vec::new(),
                    constraint: None,
                    prediction: prediction(i),
                };
                engine.submit(req).expect("submit")
            })
            .collect();
        handles.into_iter().map(|h| common::collect(h).0).collect()
    };

    let one = {
        let name = name.clone();
        let (engine, ()) = Engine::start(move || {
            let model = load::load(&name, &opts(), &Device::Cpu)?.model;
            Ok((model, cfg, ()))
        })
        .unwrap();
        generate(&engine)
    };

    let common::tp::Group { leader, followers, threads } =
        common::tp::follower_threads(&name, 2, cfg, opts());
    let tp = {
        let name = name.clone();
        let (engine, ()) = Engine::start_built(move || {
            let model = load::load_rank(&name, &opts(), &Device::Cpu, leader)?.model;
            Ok(Built { model, draft: None, cfg, info: (), followers: Some(followers) })
        })
        .unwrap();
        let tokens = generate(&engine);
        drop(engine);
        tokens
    };
    for t in threads {
        t.join().expect("a following rank failed");
    }
    (one, tp)
}
