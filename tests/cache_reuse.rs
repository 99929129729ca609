//! Reusing a cached prefix gives exactly what a fresh run gives (a reused prefix that differs sends
//! a gpt-oss chat wrong after a long reply). A chat re-renders the conversation every turn; the
//! engine's prefix cache keeps every full block of 16 computed positions under a hash of the token
//! prefix it ends, and a new prompt takes back the longest run of leading blocks it holds.
//! gpt-oss's sliding-window layers keep their blocks in a group of their own, which gives blocks
//! back to the cache as soon as they fall out of the window: a hit needs the full-attention blocks
//! of the whole prefix and the sliding blocks of the last window before its end, so after a long
//! reply those windows must still be cached, not recomputed or lost.
//!
//! Each trial: a random first prompt, a greedy first turn of random length (shorter and longer
//! than the window and the block), then a second prompt that shares a random prefix with what
//! the cache holds — diverging long before the end (its window's sliding blocks were released
//! during the reply), inside the last block, or exactly at the end of the first prompt (harmony's
//! dropped reasoning) — and greedy tokens from the reused session against a fresh engine's. Both
//! engines run prompts in chunks of 4, so prompts take several steps. Reuse is whole blocks, at
//! most the prompt less its last token, and every cached block of the shared prefix is taken.
//! Random per run; the seed is printed and `INFERNO_TEST_SEED` replays one.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use candle_core::{DType, Device};
use inferno::engine::Session;
use inferno::engine::core::{Engine, EngineConfig};
use inferno::engine::pool::BLOCK_SIZE;
use inferno::generate::{Sampler, SamplerConfig};
use inferno::load::{self, LoadOptions};
use inferno::models::batch::KvDtype;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The tiny gpt-oss checkpoint's sliding window.
const WINDOW: usize = 8;
/// Tokens per step: prompts go in chunks of 4.
const CHUNK: usize = 4;
const CONTEXT: usize = 256;
const REPLY: usize = 10;

fn gpt_oss_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt_oss_tiny"))
}

/// A pool far larger than one trial needs: nothing of the trial under test is evicted.
fn small_engine() -> EngineConfig {
    EngineConfig {
        max_seqs: 2,
        kv_tokens: 4 * CONTEXT,
        token_budget: CHUNK,
        pipeline: inferno::switches::pipeline(),
        spec: None,
    }
}

fn gpt_oss(device: &Device, dtype: DType, kv_dtype: KvDtype) -> Engine {
    let opts = LoadOptions { dtype: Some(dtype), context: Some(CONTEXT), dummy: false, kv_dtype };
    let path = gpt_oss_dir();
    let (engine, _) =
        load::start(path.to_str().expect("utf-8 path"), &opts, device, |_| small_engine())
            .expect("tiny gpt-oss engine");
    engine
}

/// A maker of engines over identical tiny Llamas (random weights, full attention only).
fn llama(device: &Device, kv_dtype: KvDtype) -> impl Fn() -> Engine {
    let make = Arc::new(common::tiny_llama(device, CONTEXT));
    move || {
        let make = make.clone();
        let model = move || {
            let mut model = make();
            model.set_kv_dtype(kv_dtype);
            model
        };
        Engine::start(move || Ok((model(), small_engine(), ()))).expect("tiny llama engine").0
    }
}

fn seed() -> u64 {
    std::env::var("INFERNO_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    })
}

/// Greedy tokens after `prompt`, at most `max` of them, and how many prompt tokens came from
/// the cache.
fn greedy(session: &mut Session, prompt: &[u32], max: usize) -> (Vec<u32>, usize) {
    let mut sampler = Sampler::new(SamplerConfig::greedy());
    let stop = Arc::new(AtomicBool::new(false));
    let g = session
        .generate_tokens(prompt, &mut sampler, max, &stop, &mut |_| Ok(None))
        .expect("generation");
    assert_eq!(g.prompt_tokens, prompt.len());
    (g.tokens, g.prompt_tokens - g.prefilled_tokens)
}

/// Prompt tokens a request takes from the cache when the cache holds (every block of) the
/// first `cached` tokens of it: whole blocks, never the last token (it must run for logits).
fn expected_reuse(cached: usize, prompt_len: usize) -> usize {
    cached.min(prompt_len - 1) / BLOCK_SIZE * BLOCK_SIZE
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Divergence {
    /// More than a block before the end of what the cache holds.
    Early,
    /// Within the last block the cache holds, or right at its end.
    LastBlock,
    /// Right after the first prompt (a chat turn whose reply's reasoning is dropped).
    PromptEnd,
}

/// What the trials covered.
#[derive(Debug, Default)]
struct Coverage {
    early: usize,
    last_block: usize,
    prompt_end: usize,
    /// Trials whose second prompt took blocks from the cache.
    reused: usize,
    /// Trials whose reused prefix ends a window or more before the last position the first
    /// turn computed: its sliding-window blocks had been released to the cache during the turn.
    reused_released_window: usize,
}

fn run_trials(make: &dyn Fn() -> Engine, trials: usize, seed: u64) -> Coverage {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cov = Coverage::default();
    let mut reused = Session::new(make());
    let vocab = reused.engine().vocab_size() as u32;
    for trial in 0..trials {
        let random = |n: usize, rng: &mut StdRng| -> Vec<u32> {
            (0..n).map(|_| rng.random_range(0..vocab)).collect()
        };
        // Turn 1 on a reused engine that ran other conversations before.
        let prompt1 = random(rng.random_range(2..40), &mut rng);
        let turn1 = rng.random_range(1..3 * BLOCK_SIZE);
        let (reply1, _) = greedy(&mut reused, &prompt1, turn1);
        let held: Vec<u32> = prompt1.iter().chain(&reply1).copied().collect();
        // Every position but the last sampled token's has been computed (and so cached).
        let computed = held.len() - 1;
        let kind = match rng.random_range(0..3) {
            0 if held.len() > BLOCK_SIZE + 2 => Divergence::Early,
            1 => Divergence::LastBlock,
            _ => Divergence::PromptEnd,
        };
        let cut = match kind {
            Divergence::Early => rng.random_range(1..held.len() - BLOCK_SIZE - 1),
            Divergence::LastBlock => {
                rng.random_range(held.len().saturating_sub(BLOCK_SIZE)..=held.len())
            }
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
        let (want, fresh_reuse) = greedy(&mut Session::new(make()), &prompt2, REPLY);
        let what = format!(
            "seed {seed}, trial {trial}: {kind:?} at {cut} after {computed} computed positions \
             (prompt 1 {}, reply {}), prompt 2 of {}, {reuse} tokens from the cache",
            prompt1.len(),
            reply1.len(),
            prompt2.len()
        );
        assert_eq!(fresh_reuse, 0, "{what}: a fresh engine has nothing cached");
        assert_eq!(got, want, "{what}: the reused prefix gives other tokens than a fresh run");
        assert!(reuse % BLOCK_SIZE == 0 && reuse < prompt2.len(), "{what}");
        // The trial's blocks are the newest in a pool much larger than a trial: every full block
        // of the shared prefix is still cached, in both groups, and must be taken.
        assert_eq!(reuse, expected_reuse(cut.min(computed), prompt2.len()), "{what}");
        match kind {
            Divergence::Early => cov.early += 1,
            Divergence::LastBlock => cov.last_block += 1,
            Divergence::PromptEnd => cov.prompt_end += 1,
        }
        if reuse > 0 {
            cov.reused += 1;
            if reuse + WINDOW <= computed {
                cov.reused_released_window += 1;
            }
        }
    }
    cov
}

#[test]
fn gpt_oss_reused_cache_equals_fresh_cpu_f32() {
    let seed = seed();
    eprintln!("seed {seed}");
    let cov = run_trials(&|| gpt_oss(&Device::Cpu, DType::F32, KvDtype::Compute), 60, seed);
    eprintln!("{cov:?}");
    assert!(cov.early > 0 && cov.last_block > 0 && cov.prompt_end > 0, "seed {seed}: {cov:?}");
    assert!(
        cov.reused_released_window > 0,
        "no trial reused a window released during the first turn: the test checks little \
         (seed {seed}, {cov:?})"
    );
}

/// Full attention only (Llama): the same trials hold.
#[test]
fn llama_reused_cache_equals_fresh_cpu_f32() {
    let seed = seed();
    eprintln!("seed {seed}");
    let cov = run_trials(&llama(&Device::Cpu, KvDtype::Compute), 30, seed);
    eprintln!("{cov:?}");
    assert!(cov.reused > 0, "no trial reused the cache (seed {seed}, {cov:?})");
}

/// FP8 KV (`--kv-dtype fp8`): a cached block holds its codes and their scales, reused as they
/// are, so the same trials hold with both models.
#[test]
fn reused_cache_equals_fresh_cpu_fp8_kv() {
    let seed = seed();
    eprintln!("seed {seed}");
    let cov = run_trials(&|| gpt_oss(&Device::Cpu, DType::F32, KvDtype::Fp8), 30, seed);
    eprintln!("gpt-oss {cov:?}");
    assert!(cov.reused_released_window > 0, "no trial reused a released window (seed {seed})");
    let cov = run_trials(&llama(&Device::Cpu, KvDtype::Fp8), 20, seed);
    eprintln!("llama {cov:?}");
    assert!(cov.reused > 0, "no trial reused the cache (seed {seed}, {cov:?})");
    let cov = run_trials(&|| gpt_oss(&Device::Cpu, DType::F32, KvDtype::Int8), 20, seed);
    eprintln!("gpt-oss int8 {cov:?}");
    assert!(cov.reused > 0, "no trial reused the cache (seed {seed}, {cov:?})");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpt_oss_reused_cache_equals_fresh_gpu_fp8_kv_decode_graph() {
    let device = Device::new_cuda(0).expect("CUDA device");
    let seed = seed();
    eprintln!("seed {seed}");
    for kv in [KvDtype::Fp8, KvDtype::Int8] {
        let cov = run_trials(&|| gpt_oss(&device, DType::BF16, kv), 60, seed);
        eprintln!("{kv:?} {cov:?}");
        assert!(cov.reused_released_window > 0, "no trial reused a released window ({seed})");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpt_oss_reused_cache_equals_fresh_gpu_bf16_decode_graph() {
    let device = Device::new_cuda(0).expect("CUDA device");
    let seed = seed();
    eprintln!("seed {seed}");
    // The decode steps are replays of the captured CUDA graph (on by default on a GPU).
    let cov = run_trials(&|| gpt_oss(&device, DType::BF16, KvDtype::Compute), 60, seed);
    eprintln!("{cov:?}");
    assert!(cov.reused_released_window > 0, "no trial reused a released window (seed {seed})");
}

/// A harmony chat as `play` runs it: the first reply reasons at length (over 600 tokens of
/// analysis, more than the 512-token step budget, as real gpt-oss replies do), then answers; the
/// second turn's prompt drops that analysis, so it diverges from the cache right after the first
/// prompt, hundreds of tokens before the cache's end, long after the sliding layers' blocks of
/// that point were released. The reply's tokens are fed one request per token (a random model
/// would not write them), each reusing the one before; the second turn must then take every
/// full block of the shared prefix from the cache and decode exactly what a fresh engine decodes.
#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the gpt-oss tokenizer: scripts/test.sh")]
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
    // Play's engine: one sequence, the production step budget (512).
    let make = || -> Engine {
        let opts = LoadOptions {
            dtype: Some(dtype),
            context: Some(2048),
            dummy: false,
            kv_dtype: Default::default(),
        };
        load::start(dir.to_str().unwrap(), &opts, device, |_| EngineConfig::single(2048))
            .expect("engine")
            .0
    };
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
        // One request per token, each reusing the previous one's blocks.
        let (_, reused) = greedy(&mut session, &seq, 1);
        assert_eq!(reused, expected_reuse(seq.len() - 1, seq.len()), "at {}", seq.len());
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
        shared >= prompt1.len() && seq.len() - shared > 512,
        "the second prompt shares {shared} of the {} cached tokens: not the case under test",
        seq.len()
    );
    let (got, reused) = greedy(&mut session, &prompt2, 24);
    // Everything up to the last full block of the shared prefix (which holds the whole first
    // prompt) comes from the cache.
    assert_eq!(reused, expected_reuse(shared, prompt2.len()), "shared {shared}");
    assert!(reused >= prompt1.len() / BLOCK_SIZE * BLOCK_SIZE && reused > 0);
    let (want, fresh_reused) = greedy(&mut Session::new(make()), &prompt2, 24);
    assert_eq!(fresh_reused, 0);
    assert_eq!(got, want, "the second turn differs from a fresh engine's");
}
