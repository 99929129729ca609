//! A reused KV cache gives exactly what a fresh one gives (issue: gpt-oss chats went wrong after
//! a long reply). A chat re-renders the conversation every turn and the session reuses the
//! cached prefix it shares with the new prompt; gpt-oss's sliding layers keep only a ring of
//! `window + chunk − 1` positions, which a long reply overwrites, so the session must rewind to a
//! point the caches still hold and re-run from there.
//!
//! Each trial: a random first prompt, a greedy first turn of random length (on both sides of the
//! ring size), then a second prompt that shares a random prefix with what the cache holds —
//! diverging long before the end (the ring lost the window), inside the last chunk (the ring
//! still holds it), or exactly at the end of the first prompt (harmony's dropped reasoning) — and
//! greedy tokens from the reused session against a fresh one. Random per run; the seed is printed
//! and `INFERNO_TEST_SEED` replays one.

mod common;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use candle_core::{DType, Device};
use inferno::generate::{Sampler, SamplerConfig, Session};
use inferno::models::CausalLm;
use inferno::models::gpt_oss::load;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Prompts run in chunks of 4: the tiny model's sliding layers (window 8) keep a ring of 11.
const CHUNK: usize = 4;
const RING: usize = 8 + CHUNK - 1;
const CONTEXT: usize = 256;
const REPLY: usize = 10;

fn gpt_oss_dir() -> PathBuf {
    let built = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt_oss_tiny"));
    if built.exists() { built } else { PathBuf::from("tests/fixtures/gpt_oss_tiny") }
}

fn gpt_oss(device: &Device, dtype: DType) -> Box<dyn CausalLm> {
    let mut model = load::load(&gpt_oss_dir(), dtype, CONTEXT, device).expect("tiny gpt-oss");
    model.set_prefill_chunk(CHUNK).expect("prefill chunk");
    Box::new(model)
}

fn seed() -> u64 {
    std::env::var("INFERNO_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    })
}

/// Greedy tokens after `prompt`, at most `max` of them.
fn greedy(session: &mut Session, prompt: &[u32], max: usize) -> (Vec<u32>, usize) {
    let mut sampler = Sampler::new(SamplerConfig::greedy());
    let stop = AtomicBool::new(false);
    let g = session
        .generate_tokens(prompt, &mut sampler, max, &stop, &mut |_| Ok(None))
        .expect("generation");
    (g.tokens, g.prompt_tokens - g.prefilled_tokens)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Divergence {
    /// More than a chunk before the end of what the cache holds: the ring lost the window.
    Lost,
    /// Within the last chunk: the ring still holds everything.
    Held,
    /// Right after the first prompt (a chat turn whose reply's reasoning is dropped).
    PromptEnd,
}

/// What the trials covered: (divergence, how the session continued).
#[derive(Debug, Default)]
struct Coverage {
    lost: usize,
    held: usize,
    prompt_end: usize,
    /// Trials where the session re-ran tokens the cache had (rewound below the common prefix).
    rewound: usize,
    /// Trials where the ring had lost the window but the checkpoint at the end of the first
    /// prompt served the second prompt without a re-run.
    from_checkpoint: usize,
}

fn run_trials(
    make: &dyn Fn() -> Box<dyn CausalLm>,
    vocab: u32,
    trials: usize,
    seed: u64,
) -> Coverage {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cov = Coverage::default();
    let mut reused = Session::new(make());
    let mut fresh = Session::new(make());
    for trial in 0..trials {
        let random = |n: usize, rng: &mut StdRng| -> Vec<u32> {
            (0..n).map(|_| rng.random_range(0..vocab)).collect()
        };
        // Turn 1 on a reused session that ran other conversations before (not reset).
        let prompt1 = random(rng.random_range(2..24), &mut rng);
        let turn1 = rng.random_range(1..3 * RING);
        let (reply1, _) = greedy(&mut reused, &prompt1, turn1);
        let held: Vec<u32> = prompt1.iter().chain(&reply1).copied().collect();
        let kind = match rng.random_range(0..3) {
            0 if held.len() > CHUNK + 2 => Divergence::Lost,
            1 => Divergence::Held,
            _ => Divergence::PromptEnd,
        };
        let cut = match kind {
            Divergence::Lost => rng.random_range(1..held.len() - CHUNK - 1),
            Divergence::Held => rng.random_range(held.len().saturating_sub(CHUNK)..=held.len()),
            Divergence::PromptEnd => prompt1.len(),
        }
        .max(1);
        let mut prompt2 = held[..cut].to_vec();
        let mut tail = random(rng.random_range(1..12), &mut rng);
        if cut < held.len() && tail[0] == held[cut] {
            tail[0] = (tail[0] + 1) % vocab;
        }
        prompt2.extend(tail);
        let (got, reuse) = greedy(&mut reused, &prompt2, REPLY);
        fresh.reset();
        let (want, _) = greedy(&mut fresh, &prompt2, REPLY);
        assert_eq!(
            got,
            want,
            "seed {seed}, trial {trial}: {kind:?} at {cut} after {} cached positions \
             (prompt 1 {}, reply {}), continued from {reuse}",
            held.len(),
            prompt1.len(),
            reply1.len()
        );
        match kind {
            Divergence::Lost => cov.lost += 1,
            Divergence::Held => cov.held += 1,
            Divergence::PromptEnd => cov.prompt_end += 1,
        }
        // The session runs every token but the last sampled one.
        let common = cut.min(held.len() - 1).min(prompt2.len() - 1);
        if reuse < common {
            cov.rewound += 1;
        }
        if kind == Divergence::PromptEnd && reuse == common && held.len() - 1 > cut + CHUNK {
            cov.from_checkpoint += 1;
        }
    }
    cov
}

#[test]
fn gpt_oss_reused_cache_equals_fresh_cpu_f32() {
    let seed = seed();
    eprintln!("seed {seed}");
    let cov = run_trials(&|| gpt_oss(&Device::Cpu, DType::F32), 256, 60, seed);
    eprintln!("{cov:?}");
    assert!(cov.lost > 0 && cov.held > 0 && cov.prompt_end > 0, "seed {seed}: {cov:?}");
    assert!(cov.rewound > 0, "no trial needed a rewind: the test checks nothing (seed {seed})");
    assert!(cov.from_checkpoint > 0, "no trial used the prompt checkpoint (seed {seed})");
}

/// Linear caches (Llama) reuse any prefix as is; the same trials hold for them.
#[test]
fn llama_reused_cache_equals_fresh_cpu_f32() {
    let seed = seed();
    eprintln!("seed {seed}");
    let cov = run_trials(&common::tiny_llama(&Device::Cpu, CONTEXT), 256, 30, seed);
    eprintln!("{cov:?}");
    assert_eq!(cov.rewound, 0, "a linear cache never needs a rewind");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpt_oss_reused_cache_equals_fresh_gpu_bf16_decode_graph() {
    let device = Device::new_cuda(0).expect("CUDA device");
    let seed = seed();
    eprintln!("seed {seed}");
    // The decode steps are replays of the captured CUDA graph (on by default on a GPU).
    let cov = run_trials(&|| gpt_oss(&device, DType::BF16), 256, 60, seed);
    eprintln!("{cov:?}");
    assert!(cov.rewound > 0, "no trial needed a rewind (seed {seed})");
}

/// A harmony chat as `play` runs it: the first reply reasons at length (over 600 tokens of
/// analysis, more than the 512-token prefill chunk, as real gpt-oss replies do), then answers;
/// the second turn's prompt drops that analysis, so it diverges from the cache right after the
/// first prompt, hundreds of tokens before the cache's end. The reply's tokens are fed one decode
/// step at a time (a random model would not write them); the second turn must then decode
/// exactly what a fresh session decodes.
#[test]
fn harmony_second_turn_after_long_reasoning_equals_fresh_cpu_f32() {
    harmony_two_turns(&Device::Cpu, DType::F32);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn harmony_second_turn_after_long_reasoning_equals_fresh_gpu_bf16() {
    harmony_two_turns(&Device::new_cuda(0).expect("CUDA device"), DType::BF16);
}

fn harmony_two_turns(device: &Device, dtype: DType) {
    use inferno::chat::harmony::{
        Channel, HarmonyChat, HarmonyEncoding, HarmonyMessage, SystemConfig,
    };
    let dir = common::tiny_gpt_oss_full_vocab();
    let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let enc = HarmonyEncoding::new(&tokenizer).unwrap();
    // The production prefill chunk (512): rings of window + 511 slots.
    let make =
        || -> Box<dyn CausalLm> { Box::new(load::load(&dir, dtype, 2048, device).expect("model")) };
    let mut chat = HarmonyChat::new(SystemConfig::default(), Some("Be brief.".into()));
    chat.push_user("What is 2 + 2? Think it through carefully.");
    let prompt1 = chat.prompt_ids(&enc).unwrap();

    let thoughts =
        "The user asks for two plus two. Counting on: two, then three, then four. ".repeat(40);
    let mut reply = Vec::new();
    for m in [
        HarmonyMessage::assistant(Channel::Analysis, thoughts),
        HarmonyMessage::assistant(Channel::Final, "2 + 2 = 4."),
    ] {
        enc.render_message(&m, &mut reply).unwrap();
    }
    // The prompt ends in `<|start|>assistant`: the model writes from the channel on, and ends
    // its final message with `<|return|>`.
    let header = reply.iter().position(|&t| t == enc.ids().channel).unwrap();
    assert_eq!(prompt1[prompt1.len() - header..], reply[..header]);
    reply.drain(..header);
    *reply.last_mut().unwrap() = enc.ids().return_;
    assert!(reply.len() > 600, "the analysis is {} tokens", reply.len());

    let mut session = Session::new(make());
    let mut seq = prompt1.clone();
    greedy(&mut session, &seq, 1);
    for &t in &reply {
        seq.push(t);
        greedy(&mut session, &seq, 1); // one decode step for `t`
    }
    let mut parser = enc.parser();
    for &t in &reply {
        parser.push(t).unwrap();
    }
    assert!(chat.record_reply(parser.messages()), "the reply has a final answer");

    chat.push_user("And 3 + 3?");
    let prompt2 = chat.prompt_ids(&enc).unwrap();
    let shared = prompt2.iter().zip(&seq).take_while(|(a, b)| a == b).count();
    assert!(
        seq.len() - shared > 512,
        "the second prompt shares {shared} of the {} cached tokens: not the case under test",
        seq.len()
    );
    let (got, reused) = greedy(&mut session, &prompt2, 24);
    assert_eq!(reused, prompt1.len(), "the first prompt's checkpoint should serve the second turn");
    let (want, _) = greedy(&mut Session::new(make()), &prompt2, 24);
    assert_eq!(got, want, "the second turn differs from a fresh session's");
}
