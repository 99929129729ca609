//! Tensor parallelism on GPUs, ranks as processes over NCCL, as `--tp` runs them: this test
//! binary is rank 0 and starts its other ranks as copies of itself (`load::ranks::role`, the
//! CLI's own), each running the same test, which makes them follow rank 0. An engine over the
//! ranks decodes the tokens an engine on one GPU decodes, with the same log probabilities (f32,
//! within ~1e-5 of the logits' size), for the wide tiny gpt-oss and the Llama-3.2-1B shape over
//! 64 tokens. Measured: 192 of 192 tokens identical for each; log probabilities within 1.4e-6
//! (gpt-oss) and, for the Llama-1B shape (logits of ±40), 3.7e-4 on 2 H100s and 6.1e-4 on 2
//! H200s with the same seeded weights (the GPUs' f32 products sum in orders of their own). Needs 2 GPUs and NCCL:
//! `tensor_parallel_gpu --ignored` on a machine of two; the `gpu_tp4_*` tests need four. The
//! 20b-shaped checkpoint (scripts/fixtures/gpt_oss_20b_random.py, its folder in
//! INFERNO_GPT_OSS_20B_DIR) in f32 gives one GPU's tokens with log probabilities within 6.7e-6
//! over two H200, and in bf16 its teacher-forced predictions agree with transformers' f32 over two
//! GPUs as on one. Besides, `inferno serve --tp 2` itself: under load
//! and vanishing clients, and with a rank that hangs.

use candle_core::{DType, Device};
use inferno::engine::core::{Engine, EngineConfig};
use inferno::engine::request::{Event, Request, RequestHandle};
use inferno::generate::SamplerConfig;
use inferno::load::{self, LoadOptions, ranks};

mod common;

const TOKENS: usize = 64;

/// Each request's tokens and their top-5 log probabilities.
type Replies = Vec<Vec<(u32, Vec<(u32, f32)>)>>;

/// A request's reply to its end: each token and its top log probabilities.
fn reply(mut h: RequestHandle) -> Vec<(u32, Vec<(u32, f32)>)> {
    let mut out = Vec::new();
    loop {
        match h.blocking_next() {
            Some(Event::Token(t, lp)) => out.push((t, lp.map(|l| l.top).unwrap_or_default())),
            Some(Event::Finished(_)) => return out,
            Some(Event::Failed(m)) => panic!("request failed: {m}"),
            None => panic!("the engine dropped the request"),
        }
    }
}

/// Three greedy requests with their top-5 log probabilities (which the host reads from the
/// gathered logits), then `drawn`: requests without, which an engine over ranks draws on the ranks
/// (each rank's candidates of its own logits), greedy and, with `temperature`, at T = 0.9 with
/// seeds (the Gumbel-max draw one GPU makes too).
fn generate(engine: &Engine, vocab: u32, temperature: bool) -> (Replies, Replies) {
    let prompt = |i: u32| (0..(20 + 7 * i)).map(|t| (t * 7919 + i * 104_729) % vocab).collect();
    let request = |p: Vec<u32>, sampling: SamplerConfig, logprobs: Option<usize>| Request {
        prompt: p,
        sampling,
        max_tokens: TOKENS,
        eos_ids: Vec::new(),
        interrupt: None,
        logprobs,
        forced: Vec::new(),
        constraint: None,
        prediction: Vec::new(),
    };
    let run = |reqs: Vec<Request>| -> Replies {
        let handles: Vec<_> = reqs.into_iter().map(|r| engine.submit(r).expect("submit")).collect();
        handles.into_iter().map(reply).collect()
    };
    let scored =
        run((0..3).map(|i| request(prompt(i), SamplerConfig::greedy(), Some(5))).collect());
    let drawn = (0..4u32).map(|i| {
        let sampling = if temperature && i % 2 == 1 {
            SamplerConfig {
                temperature: 0.9,
                top_k: None,
                top_p: None,
                min_p: None,
                seed: 1_000 + u64::from(i),
                ..SamplerConfig::greedy()
            }
        } else {
            SamplerConfig::greedy()
        };
        request(prompt(i + 3), sampling, None)
    });
    (scored, run(drawn.collect()))
}

/// FNV-1a over every token id and log probability's bits: equal digests, equal replies.
fn digest(replies: &Replies) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let words = replies.iter().flatten().flat_map(|(t, top)| {
        std::iter::once(*t).chain(top.iter().flat_map(|(i, l)| [*i, l.to_bits()]))
    });
    for w in words {
        for b in w.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

fn size(_: &load::ModelInfo) -> EngineConfig {
    EngineConfig { max_seqs: 4, kv_tokens: 4 * 256, ..EngineConfig::single(256) }
}

/// A checkpoint a test reads: a folder it wrote (kept until the test ends), or one given.
struct Checkpoint {
    _written: Option<tempfile::TempDir>,
    path: std::path::PathBuf,
}

impl From<tempfile::TempDir> for Checkpoint {
    fn from(dir: tempfile::TempDir) -> Self {
        Checkpoint { path: dir.path().to_path_buf(), _written: Some(dir) }
    }
}

/// The 20b-shaped checkpoint scripts/fixtures/gpt_oss_20b_random.py writes, in
/// INFERNO_GPT_OSS_20B_DIR.
fn gpt_oss_20b_shaped() -> Checkpoint {
    let dir = std::env::var("INFERNO_GPT_OSS_20B_DIR").expect("set INFERNO_GPT_OSS_20B_DIR");
    Checkpoint { _written: None, path: dir.into() }
}

/// `make`'s model over `world` GPUs and on one: the same tokens, log probabilities within
/// `tol`, and the same tokens drawn on the ranks ([`generate`]). The role comes first: the other
/// ranks (this test in copies of this process) follow from there, and read rank 0's checkpoint.
fn check<C: Into<Checkpoint>>(
    world: usize,
    make: impl FnOnce() -> C,
    dtype: DType,
    vocab: u32,
    tol: f32,
    temperature: bool,
) {
    let role = ranks::role(world, 0, false).expect("rank role");
    let dir: Checkpoint = make().into();
    let name = dir.path.to_str().unwrap();
    let opts = LoadOptions {
        dtype: Some(dtype),
        context: Some(256),
        dummy: false,
        kv_dtype: Default::default(),
    };
    let device = Device::new_cuda(0).expect("GPU 0");
    let (tp_engine, info) =
        load::start_group(name, None, &opts, &device, role, size).expect("TP engine");
    // GPUs that reach each other's memory (NVLink, or PCIe peer access) sum through it unless
    // INFERNO_TP_P2P=0; either way the bits are the same, so the digest below is too.
    let peer = std::env::var("INFERNO_TP_P2P").map_or(true, |v| v != "0");
    let want = if peer { "peer memory" } else { "NCCL" };
    assert_eq!(info.sums, want, "the ranks' sums went another way");
    let (tp, tp_drawn) = generate(&tp_engine, vocab, temperature);
    drop(tp_engine);
    eprintln!("TP{world} sums through {}: digest {:016x}", info.sums, digest(&tp));
    let (one_engine, _) = load::start(name, &opts, &device, size).expect("TP1 engine");
    let (one, one_drawn) = generate(&one_engine, vocab, temperature);
    for (r, (a, b)) in tp_drawn.iter().zip(&one_drawn).enumerate() {
        let ids = |x: &Vec<(u32, Vec<(u32, f32)>)>| x.iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(ids(a), ids(b), "drawn request {r}: TP{world} drew other tokens than one GPU");
    }
    let mut worst = 0f32;
    for (r, (a, b)) in tp.iter().zip(&one).enumerate() {
        let ids = |x: &Vec<(u32, Vec<(u32, f32)>)>| x.iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(ids(a), ids(b), "request {r}: TP{world} decoded other tokens than one GPU");
        for ((_, ta), (_, tb)) in a.iter().zip(b) {
            for ((ia, la), (ib, lb)) in ta.iter().zip(tb) {
                assert_eq!(ia, ib, "request {r}: another top-5 order");
                worst = worst.max((la - lb).abs());
            }
        }
    }
    eprintln!(
        "TP{world} vs one GPU ({dtype:?}): {} tokens identical, top-5 log probabilities within \
         {worst:.1e}; {} tokens drawn on the ranks identical",
        3 * TOKENS,
        4 * TOKENS
    );
    assert!(worst <= tol, "log probabilities differ by {worst}");
}

#[test]
#[ignore = "needs 2 GPUs and NCCL"]
fn gpu_tp2_gpt_oss_matches_one_gpu() {
    check(2, common::tp::wide_gpt_oss, DType::F32, 250, 2e-4, true);
}

/// In bf16 each sum feeds the norm after it in one launch where the GPUs reach each other's
/// memory (`all_reduce_add_rms_norm_bf16`): the tokens are one GPU's, and the digest is the same
/// with `INFERNO_TP_P2P=0` (NCCL's sum, then the norm apart).
#[test]
#[ignore = "needs 2 GPUs and NCCL"]
fn gpu_tp2_gpt_oss_bf16_matches_one_gpu() {
    // Top-5 log probabilities differed by 4.9e-3 at most on two H100s and on two H200s.
    // Greedy draws alone: log probabilities 5e-3 apart would flip about one temperature draw in
    // 200 (the gap between the two best noisy logits is near zero that often).
    check(2, common::tp::wide_gpt_oss, DType::BF16, 250, 1e-2, false);
}

fn llama_1b_config() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/benches/configs/llama-3.2-1b.json"
    ))
    .or_else(|_| std::fs::read_to_string("benches/configs/llama-3.2-1b.json"))
    .expect("the Llama-3.2-1B config")
}

#[test]
#[ignore = "needs 2 GPUs and NCCL"]
fn gpu_tp2_llama_1b_shape_matches_one_gpu_over_64_tokens() {
    let config = llama_1b_config();
    // Its logits reach ±40 (a random tied embedding of 2048): 2.5e-5 of that is 1e-3, above what
    // either kind of GPU gave (what must hold for this shape is the identical tokens). Greedy
    // draws alone: log probabilities 6e-4 apart would flip about one temperature draw in 1,500.
    check(2, || common::tp::random_llama(&config), DType::F32, 128_256, 1e-3, false);
}

/// Four ranks: two key/value heads replicated over four, a vocabulary of 250 in shares of 63
/// (the last rank's padded), one block of 32 intermediate columns a rank.
/// The tiny Qwen3 fixture (tests/fixtures/qwen3_tiny): its q/k norms, one weight for all heads,
/// whole on each rank.
fn qwen3_tiny() -> Checkpoint {
    let path =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3_tiny");
    let path = if path.exists() { path } else { "tests/fixtures/qwen3_tiny".into() };
    Checkpoint { _written: None, path }
}

#[test]
#[ignore = "needs 2 GPUs and NCCL"]
fn gpu_tp2_qwen3_matches_one_gpu() {
    check(2, qwen3_tiny, DType::F32, 320, 2e-4, true);
}

/// Gemma 3 (the tiny fixture's layers, sliding and global, widened to heads of 128: the GPU's
/// f32 attention takes 64 and 128): its post-norms after the sum over ranks, the √hidden
/// embedding scale on each rank's rows.
#[test]
#[ignore = "needs 2 GPUs and NCCL"]
fn gpu_tp2_gemma3_matches_one_gpu() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gemma3_tiny/config.json");
    let text = std::fs::read_to_string(path)
        .or_else(|_| std::fs::read_to_string("tests/fixtures/gemma3_tiny/config.json"))
        .expect("the Gemma 3 fixture's config");
    let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (k, v) in [("hidden_size", 64), ("intermediate_size", 128), ("head_dim", 128)] {
        config[k] = v.into();
    }
    config["query_pre_attn_scalar"] = 128.into();
    let vocab = config["vocab_size"].as_u64().unwrap() as u32;
    let config = config.to_string();
    check(2, || common::tp::random_gemma3(&config), DType::F32, vocab, 2e-4, true);
}

#[test]
#[ignore = "needs 4 GPUs and NCCL"]
fn gpu_tp4_gpt_oss_matches_one_gpu() {
    check(4, common::tp::wide_gpt_oss, DType::F32, 250, 2e-4, true);
}

#[test]
#[ignore = "needs 4 GPUs and NCCL"]
fn gpu_tp4_llama_1b_shape_matches_one_gpu_over_64_tokens() {
    check(4, || common::tp::random_llama(&llama_1b_config()), DType::F32, 128_256, 1e-3, false);
}

/// The 20b-shaped checkpoint in f32 over two and four GPUs: its logits (±20) within 2e-4, 1e-5
/// of their size, of one GPU's.
#[test]
#[ignore = "needs 2 GPUs, NCCL and the 20b-shaped checkpoint (INFERNO_GPT_OSS_20B_DIR)"]
fn gpu_tp2_20b_shaped_f32_matches_one_gpu() {
    check(2, gpt_oss_20b_shaped, DType::F32, 201_088, 2e-4, true);
}

#[test]
#[ignore = "needs 4 GPUs, NCCL and the 20b-shaped checkpoint (INFERNO_GPT_OSS_20B_DIR)"]
fn gpu_tp4_20b_shaped_f32_matches_one_gpu() {
    check(4, gpt_oss_20b_shaped, DType::F32, 201_088, 2e-4, true);
}

/// `inferno serve --tp 2` (the binary, which starts its own rank) on the tiny gpt-oss with its
/// real tokenizer; `env` beside.
fn serve_tp2(env: &[(&str, &str)]) -> (common::serve::Server, std::path::PathBuf) {
    let model = common::tiny_gpt_oss_full_vocab();
    let args = ["--tp", "2", "--context", "1024", "--kv-tokens", "65536", "--max-seqs", "64"];
    (common::serve::Server::start_gpu(&model, &args, env), model)
}

/// One streamed chat reply, greedy: its reasoning and content as the deltas carried them, and
/// the tokens the usage counts. Fails on an error event and on a stream cut before `[DONE]`.
fn streamed(addr: &str, prompt: &str, max_tokens: usize) -> (String, u64) {
    use std::io::{BufRead, BufReader};
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string();
    let s = common::serve::send_post(addr, "/v1/chat/completions", &body);
    s.set_read_timeout(Some(std::time::Duration::from_secs(120))).expect("timeout");
    let (mut reply, mut tokens, mut done) = (String::new(), None, false);
    for line in BufReader::new(s).lines() {
        let line = line.expect("read");
        assert!(!line.contains("\"error\""), "{line}");
        done |= line == "data: [DONE]";
        let Some(data) = line.strip_prefix("data: ").filter(|d| *d != "[DONE]") else { continue };
        let v: serde_json::Value = serde_json::from_str(data).expect("an SSE event's JSON");
        tokens = tokens.or(v["usage"]["completion_tokens"].as_u64());
        let delta = &v["choices"][0]["delta"];
        for key in ["reasoning_content", "content"] {
            if let Some(t) = delta[key].as_str() {
                reply.push_str(key);
                reply.push(':');
                reply.push_str(t);
            }
        }
    }
    assert!(done, "the stream ended without [DONE]: {reply}");
    (reply, tokens.expect("a usage event"))
}

/// Each of `prompts` streamed at once (24 tokens each).
fn together(addr: &str, prompts: &[String]) -> Vec<(String, u64)> {
    std::thread::scope(|scope| {
        let handles: Vec<_> =
            prompts.iter().map(|p| scope.spawn(|| streamed(addr, p, 24))).collect();
        handles.into_iter().map(|h| h.join().expect("stream")).collect()
    })
}

/// A client that goes away at a random point: `after` SSE lines into a stream, or during a reply
/// it waited for.
fn vanishing_client(addr: &str, i: usize, rng: &mut rand::rngs::StdRng) {
    use rand::Rng;
    use std::io::{BufRead, BufReader, Read};
    let stream = rng.random_bool(0.7);
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": format!("Story number {i}, please.")}],
        "max_tokens": 10000, "temperature": 1.0, "stream": stream,
    })
    .to_string();
    let mut s = common::serve::send_post(addr, "/v1/chat/completions", &body);
    if stream {
        let after = [0, 1, 3, 8][rng.random_range(0..4)];
        let mut lines = BufReader::new(s).lines();
        for _ in 0..after {
            if lines.next().is_none() {
                break;
            }
        }
    } else {
        let wait = std::time::Duration::from_millis(rng.random_range(50..550));
        s.set_read_timeout(Some(wait)).expect("timeout");
        let _ = s.read(&mut [0u8; 64]);
    }
}

/// Serve over two ranks under load: 8 concurrent streams each give the reply they give alone
/// (8 rows a step: every product computes a row as it does alone), 64 concurrent streams all
/// run to their end (64 rows take cuBLAS's products, whose sums depend on the batch, so they are
/// not compared), 200 clients that vanish at random points leave no sequence and no KV block
/// behind, and the server serves on.
#[test]
#[ignore = "needs 2 GPUs and NCCL"]
fn gpu_tp2_serve_under_load_loses_and_leaks_nothing() {
    use rand::SeedableRng;
    let (s, _) = serve_tp2(&[]);
    let prompts: Vec<String> =
        (0..64).map(|i| format!("Tell me fact {i} about the sea.")).collect();
    let alone: Vec<(String, u64)> = prompts[..8].iter().map(|p| streamed(&s.addr, p, 24)).collect();
    for (i, (a, t)) in alone.iter().zip(together(&s.addr, &prompts[..8])).enumerate() {
        assert!(!a.0.is_empty(), "request {i} streamed nothing");
        assert_eq!(*a, t, "request {i}: together differs from alone");
    }
    let t0 = std::time::Instant::now();
    let all = together(&s.addr, &prompts);
    eprintln!("64 streams together in {:.2?}", t0.elapsed());
    let tokens: u64 = all.iter().map(|r| r.1).sum();
    assert!(all.iter().all(|r| r.1 > 0 && r.1 <= 24), "{all:?}");
    let before = s.metrics(&[])["inferno_cancelled_total"];
    let t0 = std::time::Instant::now();
    std::thread::scope(|scope| {
        for worker in 0..16usize {
            let addr = s.addr.clone();
            scope.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(worker as u64);
                for i in (worker..200).step_by(16) {
                    vanishing_client(&addr, i, &mut rng);
                }
            });
        }
    });
    let m = s.wait_drained(std::time::Duration::from_secs(120));
    let cancelled = m["inferno_cancelled_total"] - before;
    eprintln!(
        "64 streams: {tokens} tokens; 200 vanishing clients: drained {:.2?} after the first, {cancelled} cancelled",
        t0.elapsed()
    );
    assert!(cancelled >= 100.0, "few generations were cancelled: {m:?}");
    assert_eq!(streamed(&s.addr, &prompts[0], 24), alone[0], "after the load");
}

/// The child of `parent` started as rank `rank`.
fn rank_process(parent: u32, rank: usize) -> Option<u32> {
    common::children_of(parent).into_iter().find(|pid| {
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        env.split(|&b| b == 0).any(|v| v == format!("RANK={rank}").as_bytes())
    })
}

/// A rank that stops answering (SIGSTOP: a frozen process, a debugger) in the middle of a step
/// through NCCL, whose collectives would wait forever: rank 0 names it in one line and exits 9
/// within 30 s, and the stopped rank goes with it.
#[test]
#[ignore = "needs 2 GPUs and NCCL"]
fn gpu_tp2_a_hung_rank_ends_every_rank_within_30_s() {
    let (mut s, _) = serve_tp2(&[("INFERNO_TP_P2P", "0")]);
    let rank1 = rank_process(s.pid(), 1).expect("rank 1's process");
    // Requests one after another until one fails: the ranks are inside a step's collectives
    // when rank 1 stops.
    let addr = s.addr.clone();
    let load = std::thread::spawn(move || {
        (0..10_000)
            .take_while(|_| {
                std::panic::catch_unwind(|| streamed(&addr, "Tell a long story.", 64)).is_ok()
            })
            .count()
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: kill(2) on a process this test's server started.
    unsafe { libc::kill(rank1 as i32, libc::SIGSTOP) };
    let t0 = std::time::Instant::now();
    let status = s.wait_exit(std::time::Duration::from_secs(45));
    let took = t0.elapsed();
    let gone = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        !common::running(rank1)
    });
    // Never leave a stopped process behind, whatever happened.
    // SAFETY: as above.
    unsafe { libc::kill(rank1 as i32, libc::SIGKILL) };
    let status = status
        .unwrap_or_else(|| panic!("serve still runs 45 s after rank 1 stopped:\n{}", s.log()));
    eprintln!("rank 1 stopped: serve exited {status} after {took:.2?}");
    assert!(took < std::time::Duration::from_secs(30), "{took:?}\n{}", s.log());
    assert_eq!(status.code(), Some(9), "{}", s.log());
    assert!(s.log().contains("rank 1 gave no sign of life"), "{}", s.log());
    assert!(gone, "rank 1 outlived rank 0 by 5 s");
    let served = load.join().expect("load thread");
    assert!(served > 0 && served < 10_000, "{served} replies before the stop");
}

/// `inferno bench` on the gpt-oss-20b layout with `args`, bounded: (exit code, stderr).
fn bench_tp(args: &[&str]) -> (Option<i32>, String) {
    let config = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/configs"))
        .join("gpt-oss-20b.json");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_inferno"))
        .arg("bench")
        .arg(&config)
        .args(["--dummy-weights", "-p", "8", "-n", "4", "-r", "1"])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("inferno bench");
    let t0 = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if t0.elapsed() > std::time::Duration::from_secs(90) {
            let _ = child.kill();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("output");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Bad input to `--tp`, each a clear line and a documented exit code, never a hang: more ranks
/// than GPUs (8, before any rank starts), and a rank whose GPU another process has filled (the
/// rank's memory plan refuses it; rank 0 names the rank and exits 9).
#[test]
#[ignore = "needs 2 GPUs and NCCL"]
fn gpu_tp_bad_input_is_one_line_each() {
    let (code, err) = bench_tp(&["--tp", "64"]);
    assert_eq!(code, Some(8), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--tp 64 needs GPUs 0…63"), "{err}");

    // GPU 1 full but for 2 GiB: room for a context, not for half of the 20b layout's weights.
    let (device, _) = inferno::gpu::open(1).expect("GPU 1");
    let (free, _) = inferno::gpu::memory(&device).expect("free memory");
    let take = (free.saturating_sub(2 << 30) >> 30) as usize;
    let hog: Vec<_> = (0..take)
        .map(|_| candle_core::Tensor::zeros(1usize << 30, DType::U8, &device).expect("1 GiB"))
        .collect();
    let (code, err) = bench_tp(&["--tp", "2"]);
    drop(hog);
    eprintln!("a full GPU 1: exit {code:?}\n{err}");
    assert_eq!(code, Some(9), "{err}");
    // Rank 0's line (rank 1 prints its own too, for a console of its own).
    assert!(err.lines().any(|l| l.starts_with("error: rank 1: ") && l.contains("needs")), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The top-1 prediction at every position of `ids`, teacher-forced through `engine` as a reply
/// (`Request::forced`): the prompt is the first token, the rest are forced, and one more is
/// sampled, so the k-th token's alternatives are the prediction after position k.
fn forced_top1(engine: &Engine, ids: &[u32]) -> Vec<u32> {
    let req = Request {
        prompt: ids[..1].to_vec(),
        sampling: SamplerConfig::greedy(),
        max_tokens: ids.len(),
        eos_ids: Vec::new(),
        interrupt: None,
        logprobs: Some(1),
        forced: ids[1..].to_vec(),
        constraint: None,
        prediction: Vec::new(),
    };
    let tokens = reply(engine.submit(req).expect("submit"));
    tokens.iter().map(|(_, top)| top.first().expect("log probabilities").0).collect()
}

/// The share of positions where `a` and `b` agree.
fn agreement(a: &[u32], b: &[u32]) -> f64 {
    assert_eq!(a.len(), b.len(), "predictions of other lengths");
    a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64
}

/// Full size: the random checkpoint in gpt-oss-20b's exact layout that
/// scripts/fixtures/gpt_oss_20b_random.py writes (its folder in INFERNO_GPT_OSS_20B_DIR), in bf16
/// over two GPUs and on one, teacher-forced through the engine over the fixture's tokens. TP2
/// agrees with transformers' f32 as well as one GPU does (at most 2 positions in 1,024 fewer, and
/// the single-GPU bar, 99%, of gpt_oss_reference), and where TP2's top-1 is not one GPU's the two
/// best tokens were near-equal in f32 (a margin under 0.05): the sums' other order of additions
/// moves bf16 logits by ~1e-2, which decides only near-ties. Measured on two H200: 1,024
/// positions, TP2 and one GPU both 99.51% against f32, 99.61% against each other, apart at 4
/// positions whose f32 margins were 1.6e-4 to 1.6e-3.
#[test]
#[ignore = "needs 2 GPUs, NCCL and the 20b-shaped checkpoint (INFERNO_GPT_OSS_20B_DIR)"]
fn gpu_tp2_20b_shaped_bf16_teacher_forced_agreement() {
    let role = ranks::role(2, 0, false).expect("rank role");
    let dir = std::env::var("INFERNO_GPT_OSS_20B_DIR").expect("set INFERNO_GPT_OSS_20B_DIR");
    let text = std::fs::read_to_string(std::path::Path::new(&dir).join("reference.json"));
    let fx: serde_json::Value = serde_json::from_str(&text.expect("reference.json")).unwrap();
    let list = |key: &str| -> Vec<f64> {
        let a = fx[key].as_array().unwrap_or_else(|| panic!("reference.json: {key}"));
        a.iter().map(|v| v.as_f64().expect("a number")).collect()
    };
    let ids: Vec<u32> = list("ids").into_iter().map(|v| v as u32).collect();
    let want: Vec<u32> = list("f32_argmax").into_iter().map(|v| v as u32).collect();
    let margins = list("f32_margins");
    let context = (ids.len() + 1).next_power_of_two();
    let opts = LoadOptions {
        dtype: Some(DType::BF16),
        context: Some(context),
        dummy: false,
        kv_dtype: Default::default(),
    };
    let size = move |_: &load::ModelInfo| EngineConfig {
        max_seqs: 1,
        kv_tokens: context,
        ..EngineConfig::single(context)
    };
    let device = Device::new_cuda(0).expect("GPU 0");
    let (tp_engine, info) =
        load::start_group(&dir, None, &opts, &device, role, size).expect("TP2 engine");
    let tp = forced_top1(&tp_engine, &ids);
    drop(tp_engine);
    let (one_engine, _) = load::start(&dir, &opts, &device, size).expect("TP1 engine");
    let one = forced_top1(&one_engine, &ids);
    let (tp_one, tp_f32, one_f32) =
        (agreement(&tp, &one), agreement(&tp, &want), agreement(&one, &want));
    let apart: Vec<(usize, f64)> =
        (0..ids.len()).filter(|&i| tp[i] != one[i]).map(|i| (i, margins[i])).collect();
    eprintln!(
        "20b-shaped, bf16, {} positions teacher-forced, sums through {}: TP2 vs one GPU {:.2}%; \
         against transformers f32: TP2 {:.2}%, one GPU {:.2}%",
        ids.len(),
        info.sums,
        100.0 * tp_one,
        100.0 * tp_f32,
        100.0 * one_f32
    );
    eprintln!("  TP2 ≠ one GPU at (position, f32 top-1 margin): {apart:?}");
    let slack = 2.0 / ids.len() as f64;
    assert!(
        tp_f32 >= 0.99 && tp_f32 >= one_f32 - slack,
        "TP2's top-1 agrees with transformers f32 on {:.2}%, one GPU's on {:.2}%",
        100.0 * tp_f32,
        100.0 * one_f32
    );
    assert!(
        apart.iter().all(|&(_, m)| m < 0.05),
        "TP2's top-1 differs from one GPU's where f32's was clear: {apart:?}"
    );
}
