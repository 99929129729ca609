//! Command-line definitions (clap derive). Each subcommand's arguments are a struct that its
//! module in `commands/` receives whole.

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "inferno", version, about = "Run open-weight LLMs on NVIDIA GPUs", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Download a model from the Hugging Face Hub into the standard HF cache.
    Download(DownloadArgs),
    /// List the models in the Hugging Face cache (also those other tools downloaded).
    List(ListArgs),
    /// Chat with a model (or complete one prompt with --prompt / stdin).
    Play(PlayArgs),
    /// Measure prefill and decode throughput of a model on the GPU.
    Bench(BenchArgs),
    /// Serve a model over the OpenAI HTTP API (chat completions, completions, models).
    Serve(ServeArgs),
    /// Check the GPU, the NVIDIA driver, the CUDA libraries, the model cache and whether each
    /// cached model fits; paste its output into a bug report.
    Doctor(DoctorArgs),
    /// Write an HF-format f32 safetensors checkpoint of a llama GGUF (developer tool).
    #[command(hide = true)]
    Convert(ConvertArgs),
    /// Render chat templates for the parent process over stdin/stdout (started by it, with
    /// memory and CPU limits; see `template::worker`).
    #[command(hide = true, name = "template-worker")]
    TemplateWorker,
}

#[derive(Debug, Args)]
pub struct DownloadArgs {
    /// Model repository on the Hub, e.g. `openai/gpt-oss-20b`.
    pub repo: String,
    /// Branch, tag or commit to download.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// Only weight files matching these globs (e.g. `*Q4_K_M.gguf`); config and tokenizer files
    /// are still fetched. Repeatable.
    #[arg(long = "include", value_name = "GLOB")]
    pub include: Vec<String>,
    /// Skip files matching these globs. Repeatable.
    #[arg(long = "exclude", value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Print the files that would be downloaded and their total size; write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Machine-readable output: a JSON array, one object per cached model revision.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Machine-readable output: one JSON object with every finding and the problems.
    #[arg(long)]
    pub json: bool,
    /// Check each cached model split over the first N GPUs, as `--tp N` runs it: a GPU's share
    /// against the least memory free among them.
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Model: a cached repo id (`org/name[@rev]`), a local folder or `.gguf` file; with
    /// `--dummy-weights`, a config.json (or a folder holding one).
    pub model: String,
    /// Prompt length for the prefill measurement.
    #[arg(short = 'p', long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Tokens generated for the decode measurement.
    #[arg(short = 'n', long, default_value_t = 128)]
    pub gen_tokens: usize,
    /// Measured runs (after one warm-up); medians are reported.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repeat: usize,
    /// Random weights from the config, created on the GPU: benchmark shapes without downloading.
    #[arg(long)]
    pub dummy_weights: bool,
    /// KV-cache size per sequence (default: prompt + generated tokens).
    #[arg(long)]
    pub context: Option<usize>,
    /// Streams run at once through the engine: each run submits this many requests together
    /// (distinct prompts) and reports aggregate and per-stream decode rates and TTFT
    /// percentiles.
    #[arg(short = 'c', long, default_value_t = 1)]
    pub concurrency: usize,
    /// Tokens one engine step runs at most: a longer prompt is prefilled in chunks of this size.
    #[arg(long, default_value_t = crate::engine::core::DEFAULT_TOKEN_BUDGET, value_parser = step_tokens)]
    pub step_tokens: usize,
    /// Sampling (default: greedy); the same flags as `play`'s.
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
    /// Structured output: the streams' tokens follow this JSON schema (a file), masked every
    /// step as `serve` does (needs a tokenizer.json beside a dummy config).
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<std::path::PathBuf>,
    /// With --json-schema: how many of the streams are constrained (default: all); the others
    /// run unconstrained in the same batches, and both groups' decode rates are reported.
    #[arg(long, value_name = "N")]
    pub constrained: Option<usize>,
    /// The prompt is this file's text, as a user message through the model's chat template
    /// (every stream the same; replies end at the model's end token or --gen-tokens), in place
    /// of --prompt-tokens random ids: real text for speculative decoding to copy from.
    #[arg(long, value_name = "FILE")]
    pub prompt_file: Option<std::path::PathBuf>,
    /// Time the model's steps of 1 to 5 and 9 rows at one position (a one-token step and the
    /// verify steps of 1 to 4 and 8 drafts, as CUDA graphs) instead of generating, next to the
    /// cost the draft lengths assume, and the decode rates they give at mean accepted lengths
    /// 2.0, 2.5 and 3.0; with -c N, steps of N sequences.
    #[arg(long)]
    pub verify_cost: bool,
}

#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The llama-architecture GGUF file.
    pub gguf: String,
    /// Output folder (model.safetensors + config.json).
    pub out: String,
}

/// How `play` and `bench` pick tokens (unset fields keep the command's defaults).
#[derive(Debug, Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long)]
    pub temperature: Option<f32>,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub top_p: Option<f32>,
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Repetition penalty (1.0 = off).
    #[arg(long)]
    pub repeat_penalty: Option<f32>,
    /// OpenAI's presence penalty, -2 to 2: subtracted once from every token already in the
    /// reply (0 = off).
    #[arg(long, allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty, -2 to 2: subtracted per occurrence in the reply (0 = off).
    #[arg(long, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    /// Random seed (default: a fresh one each run).
    #[arg(long)]
    pub seed: Option<u64>,
}

#[derive(Debug, Args)]
pub struct PlayArgs {
    /// Model: a cached repo id (`org/name[@rev]`), a local folder or `.gguf` file. Without it,
    /// pick one of the cached models.
    pub model: Option<String>,
    /// Answer this prompt, print only the reply on stdout and exit (stdin works too when it is
    /// not a terminal).
    #[arg(short, long)]
    pub prompt: Option<String>,
    /// System prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// Complete the text as is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Reasoning: gpt-oss's effort, low, medium or high; `off` turns a thinking model's
    /// reasoning off (Qwen3: its template's enable_thinking).
    #[arg(long, default_value = "medium")]
    pub reasoning: String,
    /// Do not show the reasoning (gpt-oss, Qwen3), only the answer.
    #[arg(long)]
    pub hide_reasoning: bool,
    /// Most tokens per reply.
    #[arg(long, default_value_t = 1024)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Stop when the reply contains this text (repeatable).
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// KV-cache size in tokens (default: the model's trained context when it fits the GPU, else
    /// the largest that does; the banner says which).
    #[arg(long)]
    pub context: Option<usize>,
    #[command(flatten)]
    pub spec: SpecArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Continue a saved conversation (`/list` shows them); without NAME, the one saved when
    /// play last exited. Its settings and system prompt come back with it.
    #[arg(long, value_name = "NAME", num_args = 0..=1, default_missing_value = "last")]
    pub resume: Option<String>,
    /// Print loading details and the stats line also in non-interactive mode (on stderr).
    #[arg(short, long)]
    pub verbose: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model: a cached repo id (`org/name[@rev]`), a local folder or `.gguf` file.
    pub model: String,
    /// Address to listen on (`0.0.0.0` to accept other machines: set an API key then).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long, env = "INFERNO_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Allow browser pages from this origin (CORS); repeatable, `*` for any. Off by default.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// Serve no chat page at `/` (the API alone; `GET /` is then 404).
    #[arg(long)]
    pub no_ui: bool,
    /// Requests that may wait for a free sequence slot; more get 503 with Retry-After.
    #[arg(long, default_value_t = 256)]
    pub max_waiting: usize,
    /// Sequences decoded together at most.
    #[arg(long, default_value_t = 16)]
    pub max_seqs: usize,
    /// Positions one sequence may hold, prompt and reply (default: the model's trained context
    /// when it fits the GPU, else the largest that does; the banner says which).
    #[arg(long)]
    pub context: Option<usize>,
    /// Tokens of KV cache shared by all sequences (default: what fits beside the model, up to
    /// --max-seqs full contexts; at least one context).
    #[arg(long)]
    pub kv_tokens: Option<usize>,
    /// Tokens one engine step runs at most, over all sequences: bounds a prompt chunk, and so
    /// how long other streams' next tokens wait behind a long prompt.
    #[arg(long, default_value_t = crate::engine::core::DEFAULT_TOKEN_BUDGET, value_parser = step_tokens)]
    pub step_tokens: usize,
    /// Largest request body in bytes (more gets 413).
    #[arg(long, default_value_t = 16 << 20)]
    pub body_limit: usize,
    /// Connections open at once; more wait until one closes.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Seconds a connection may take to send a request's headers (also how long an idle
    /// keep-alive connection stays open) and may pause within a request body.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub idle_timeout: u64,
    /// Responses kept for `previous_response_id` and `GET /v1/responses/{id}` (those created
    /// with `store` on), oldest dropped first past this count or --responses-store-mb.
    #[arg(long, default_value_t = 1000)]
    pub responses_store: usize,
    /// Megabytes of JSON the kept responses may hold in all.
    #[arg(long, default_value_t = 256)]
    pub responses_store_mb: usize,
    /// Random weights from MODEL's config.json, with the tokenizer.json beside it (serving
    /// benchmarks without a checkpoint).
    #[arg(long, hide = true)]
    pub dummy_weights: bool,
    #[command(flatten)]
    pub spec: SpecArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// More logging (-v: debug).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// Speculative decoding (shared by `play`, `bench` and `serve`).
#[derive(Debug, Args, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: `ngram` drafts the next tokens by prompt lookup over the
    /// sequence's own tokens (faster where a reply copies its input); a MODEL (a smaller one
    /// with the same tokenizer: Llama-3.2-1B for Llama-3.1-8B) drafts them greedily beside the
    /// model; an EAGLE-3 HEAD (a folder or repo in the SpecForge/lmsys or speculators layout)
    /// drafts them from the model's hidden states. Each step verifies the drafts at once: the
    /// same tokens as without. Off by default.
    #[arg(long, value_name = "ngram|MODEL|HEAD")]
    pub draft: Option<String>,
    /// With --draft: draft tokens a step verifies at most (1 to 15); n-gram drafts are cut to
    /// what the sequence's acceptance pays for.
    #[arg(long, value_name = "N", requires = "draft")]
    pub draft_tokens: Option<usize>,
}

impl SpecArgs {
    /// The engine's speculation settings (`None`: off).
    pub fn config(&self) -> anyhow::Result<Option<crate::engine::spec::SpecConfig>> {
        use crate::engine::spec::{DEFAULT_DRAFT_TOKENS, SpecConfig};
        let Some(draft) = self.draft.as_deref() else { return Ok(None) };
        let k = self.draft_tokens.unwrap_or(DEFAULT_DRAFT_TOKENS);
        match draft {
            "ngram" => SpecConfig::ngram(k).map(Some),
            _ => SpecConfig::model(k).map(Some),
        }
    }

    /// The draft model to load beside the model (`--draft MODEL`), if any.
    pub fn draft_model(&self) -> Option<&str> {
        self.draft.as_deref().filter(|d| *d != "ngram")
    }
}

/// Where and in which precision a model runs (shared by `play` and `bench`).
#[derive(Debug, Args)]
pub struct DeviceArgs {
    /// Compute dtype: f32, bf16 or f16 (default: the checkpoint's; a Llama GGUF computes in f32,
    /// a gpt-oss GGUF in bf16).
    #[arg(long)]
    pub dtype: Option<String>,
    /// CUDA device index (with --tp, the first of the GPUs).
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// Tensor parallelism: split the model over N GPUs, one process each (GPUs --gpu to
    /// --gpu + N − 1, or as RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT say when a
    /// launcher starts the ranks).
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// Run on the CPU (debugging and tests only; slow). Never chosen implicitly.
    #[arg(long)]
    pub cpu: bool,
    /// The most GPU memory inferno may take (`20G`, `16GiB`, `24GB`): the memory plan, the
    /// context it picks and the KV cache fit within it. For sharing a GPU, or trying what fits a
    /// smaller card. Default: all that is free.
    #[arg(long, value_name = "SIZE", value_parser = crate::util::parse_size)]
    pub gpu_memory: Option<u64>,
    /// KV cache storage: bf16 (the compute dtype's), fp8 (E4M3) or int8, the 8-bit ones with a
    /// power-of-two scale per token and kv head: about twice the tokens in the same memory, int8
    /// the closer to bf16 (the CPU emulates both).
    #[arg(long, value_name = "DTYPE", default_value = "bf16")]
    pub kv_dtype: String,
}

impl DeviceArgs {
    /// `--kv-dtype`, parsed.
    pub fn kv_dtype(&self) -> anyhow::Result<crate::models::batch::KvDtype> {
        crate::models::batch::KvDtype::parse(&self.kv_dtype)
    }
}

/// `--step-tokens`: 16 to 8,192 (a step's intermediates grow with it; the memory plan counts
/// the default's).
fn step_tokens(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|_| format!("'{s}' is not a whole number"))?;
    if (16..=8192).contains(&n) { Ok(n) } else { Err(format!("{n} is outside 16..=8192")) }
}
