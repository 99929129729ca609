//! `inferno serve MODEL`: the OpenAI-compatible HTTP API over the batching engine.
//!
//! The server listens at once and loads the model on a thread beside it (`/health` answers
//! 503 until the model is ready, then 200). Each HTTP request renders its prompt with the code
//! `play` uses, submits it to the engine and reads its tokens asynchronously; the engine
//! batches whatever runs. Ctrl+C (or SIGTERM) ends open streams with an error event, answers
//! waiting requests with 503 and exits; a second Ctrl+C exits at once.
//!
//! - [`listen`]: the accept loop and its limits (connections, header and idle timeouts).
//! - [`routes`]: paths, API key, CORS, body limit, `/health`, `/v1/models`, `/metrics`.
//! - [`chat`], [`completions`], [`responses`]: OpenAI's generation endpoints; [`messages`]:
//!   Anthropic's. Each converts its body into one [`pipeline::GenRequest`] and shapes its
//!   output from one stream of deltas ([`sse::Shape`]); [`pipeline`] runs every one of them
//!   the same way, and alone builds the engine's job.
//! - [`openai_types`], [`params`]: request bodies and their values → generation settings.
//! - [`prompt`]: chat messages or raw text → prompt ids (harmony or the chat template;
//!   [`tool_prompt`] offers tools to a model whose template cannot).
//! - [`generation`]: one request's tokens → deltas (text, reasoning, tool calls, logprobs),
//!   read by the reply reader `play` uses too (`chat::reply`); [`logprobs`] writes log
//!   probabilities as the API does.
//! - [`sse`]: streaming (SSE) or collecting a generation; the per-request log line.
//! - [`errors`]: OpenAI error objects; [`metrics`]: Prometheus text; [`hooks`]: test-only.
//! - [`ui`]: the chat page at `/` (static files built into the binary).

mod chat;
mod completions;
pub mod constraint;
pub mod errors;
mod generation;
mod hooks;
mod listen;
mod logprobs;
mod messages;
pub mod metrics;
pub mod openai_types;
pub mod params;
mod pipeline;
mod prompt;
mod responses;
mod routes;
mod sse;
mod state;
mod tool_prompt;
mod ui;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Device;
use tokio::sync::{oneshot, watch};

use crate::chat::harmony::HarmonyEncoding;
use crate::cli::ServeArgs;
use crate::engine::core::EngineConfig;
use crate::engine::pool::BLOCK_SIZE;
use crate::error::{ErrorKind, fail};
use crate::load::plan::Target;
use crate::load::{self, LoadOptions, ModelInfo};
use crate::util::human_bytes_iec;
use state::{AppState, ModelIds, Ready};

/// How long open requests get to end after Ctrl+C before the server stops anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    // First: a tensor-parallel rank other than 0 follows rank 0 and never returns.
    crate::gpu::cap_memory(args.device.gpu_memory);
    let role = load::ranks::role(args.device.tp, args.device.gpu, args.device.cpu)?;
    init_tracing(args.verbose);
    for (flag, value) in [
        ("--max-seqs", args.max_seqs),
        ("--max-connections", args.max_connections),
        ("--idle-timeout", args.idle_timeout as usize),
    ] {
        if value == 0 {
            return Err(fail(ErrorKind::InvalidInput, format!("{flag} must be at least 1")));
        }
    }
    if let (Some(kv), Some(ctx)) = (args.kv_tokens, args.context)
        && kv < ctx
    {
        return Err(fail(
            ErrorKind::InvalidInput,
            format!("--kv-tokens {kv} must hold at least one full sequence (--context {ctx})"),
        ));
    }
    let (device, gpu) = load::open_device(role.gpu(args.device.gpu), args.device.cpu)?;
    let device_name = gpu.map(|g| g.name).unwrap_or_else(|| "CPU (--cpu)".to_string());
    let opts = LoadOptions {
        dtype: args.device.dtype.as_deref().map(load::parse_dtype).transpose()?,
        context: args.context,
        dummy: args.dummy_weights,
        kv_dtype: args.device.kv_dtype()?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("inferno-http")
        .build()?;
    runtime.block_on(serve(args, device, device_name, opts, role))
}

async fn serve(
    args: ServeArgs,
    device: Device,
    device_name: String,
    opts: LoadOptions,
    role: load::ranks::Role,
) -> anyhow::Result<()> {
    // An IP address or a name (`localhost`), resolved as the system does.
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}:{}: {e}", args.host, args.port))?;
    let addr = listener.local_addr()?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let state = Arc::new(AppState::new(
        ModelIds::from_name(&args.model),
        args.api_key.clone(),
        args.max_seqs.saturating_add(args.max_waiting),
        shutdown_rx.clone(),
        responses::Store::new(args.responses_store, args.responses_store_mb << 20),
    ));
    let app = routes::router(state.clone(), &args.cors_origins, args.body_limit, !args.no_ui)?;
    eprintln!("inferno serve · http://{addr} · loading {} …", args.model);

    let (load_tx, load_rx) = oneshot::channel();
    let (model, max_seqs, kv_tokens, step_tokens) =
        (args.model.clone(), args.max_seqs, args.kv_tokens, args.step_tokens);
    let spec = args.spec.config()?;
    let draft = args.spec.draft_model().map(str::to_string);
    let started = Instant::now();
    std::thread::Builder::new().name("inferno-load".into()).spawn(move || {
        let sizes = Sizes { max_seqs, kv_tokens, step_tokens, spec, draft };
        let _ = load_tx.send(load(&model, &opts, &device, sizes, role));
    })?;
    let shutdown = state::shutdown_started(shutdown_rx);
    let limits = listen::Limits {
        max_connections: args.max_connections,
        idle: Duration::from_secs(args.idle_timeout),
    };
    let mut server = tokio::spawn(listen::serve(listener, app, limits, shutdown));
    let signal = stop_signal();
    tokio::pin!(signal);

    tokio::select! {
        loaded = load_rx => {
            let ready = loaded.map_err(|_| anyhow::anyhow!("the loading thread stopped"))?;
            let ready = match ready {
                Ok(r) => Arc::new(r),
                Err(e) => {
                    let _ = shutdown_tx.send(true);
                    return Err(e);
                }
            };
            eprintln!("{}", banner(&ready, &device_name, &args, addr, started.elapsed()));
            // The grammar compiler's token trie (the whole vocabulary, ~0.5 s for 128k ids) is
            // built now, beside the first requests, so a structured request does not wait for it.
            let warm = ready.clone();
            std::thread::Builder::new()
                .name("inferno-grammars".into())
                .spawn(move || drop(constraint::grammars(&warm)))?;
            state.set_ready(ready);
        }
        _ = &mut signal => {
            eprintln!("interrupted while loading");
            let _ = shutdown_tx.send(true);
            return Ok(());
        }
        r = &mut server => return server_ended(r),
    }
    tokio::select! {
        _ = &mut signal => {}
        r = &mut server => return server_ended(r),
    }
    tracing::info!("shutting down: open requests end with an error (Ctrl+C again to exit now)");
    let _ = shutdown_tx.send(true);
    tokio::spawn(async {
        stop_signal().await;
        eprintln!("exiting at once");
        std::process::exit(130);
    });
    match tokio::time::timeout(SHUTDOWN_GRACE, server).await {
        Ok(r) => server_ended(r),
        Err(_) => {
            tracing::warn!("requests still open after {}s; exiting", SHUTDOWN_GRACE.as_secs());
            Ok(())
        }
    }
}

fn server_ended(r: Result<(), tokio::task::JoinError>) -> anyhow::Result<()> {
    r.map_err(|e| anyhow::anyhow!("the HTTP server failed: {e}"))
}

/// Ctrl+C, or SIGTERM (what `docker stop` and systemd send).
async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// How big the serving engine is (from the command line).
struct Sizes {
    max_seqs: usize,
    kv_tokens: Option<usize>,
    step_tokens: usize,
    spec: Option<crate::engine::spec::SpecConfig>,
    /// `--draft MODEL`: the draft model's name.
    draft: Option<String>,
}

/// Loads the model into an engine sized for serving, its text side, and warms it up.
fn load(
    name: &str,
    opts: &LoadOptions,
    device: &Device,
    sizes: Sizes,
    role: load::ranks::Role,
) -> anyhow::Result<Ready> {
    let Sizes { max_seqs, kv_tokens, step_tokens, spec, .. } = sizes;
    let draft = sizes.draft.as_deref();
    let (engine, info) =
        load::start_group(name, draft, opts, device, role, move |info| EngineConfig {
            max_seqs,
            kv_tokens: kv_tokens
                .unwrap_or_else(|| default_kv_tokens(info, max_seqs))
                .max(info.context),
            token_budget: step_tokens,
            pipeline: crate::switches::pipeline(),
            spec,
        })?;
    let kv_tokens =
        kv_tokens.unwrap_or_else(|| default_kv_tokens(&info, max_seqs)).max(info.context);
    let text = load::text::load(&info.source)?;
    crate::engine::warm_up(&engine)?;
    let harmony = HarmonyEncoding::new(&text.tokenizer).is_ok();
    Ok(Ready { engine, text, info, harmony, kv_tokens, grammars: Default::default() })
}

/// The KV pool when `--kv-tokens` is not given: room for `max_seqs` full contexts, within half
/// the GPU memory the plan leaves free (a tenth of the host's under `--cpu`), at least one
/// context (what the memory plan checked).
fn default_kv_tokens(info: &ModelInfo, max_seqs: usize) -> usize {
    let context = info.context;
    let want = context.saturating_mul(max_seqs);
    let per_token = info.plan.kv_cache as f64 / info.plan.context.max(1) as f64;
    let share = match info.plan.target {
        Target::Gpu => 0.5,
        Target::Host => 0.1,
    };
    let fits = info.budget.filter(|_| per_token > 0.0).map(|b| {
        let spare = b.free.saturating_sub(info.plan.total()) as f64 * share;
        context + (spare / per_token) as usize
    });
    fits.map_or(want, |f| want.min(f)).max(context)
}

fn banner(r: &Ready, device: &str, args: &ServeArgs, addr: SocketAddr, load: Duration) -> String {
    let i = &r.info;
    let kv_bytes = i.plan.kv_cache as f64 / i.plan.context.max(1) as f64 * r.kv_tokens as f64;
    let key = if args.api_key.as_deref().is_some_and(|k| !k.is_empty()) {
        "API key required"
    } else {
        "no API key"
    };
    let format = if r.harmony { " · harmony (reasoning, tools)" } else { "" };
    let page =
        if args.no_ui { String::new() } else { format!("\nchat:   http://{addr}/ (in a browser)") };
    let device = i.device_label(device);
    format!(
        "inferno serve · {} ({}, {:?}) · {device} · {}{format} · loaded in {:.1}s\n\
         memory: {}\n\
         batch:  up to {} sequences, KV pool {} tokens ({} blocks of {BLOCK_SIZE}, ≈{}), {} tokens per step; {} may wait\n\
         ready:  http://{addr}/v1 (OpenAI API, {key}) · /health · /metrics{page}",
        i.name,
        i.format,
        i.dtype,
        i.context_label(),
        load.as_secs_f64(),
        i.plan.summary(i.budget.as_ref()),
        args.max_seqs,
        r.kv_tokens,
        r.kv_tokens.div_ceil(BLOCK_SIZE),
        human_bytes_iec(kv_bytes as u64),
        args.step_tokens,
        args.max_waiting,
    )
}

fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "inferno=info",
        1 => "inferno=debug,tower_http=debug",
        _ => "debug",
    };
    let filter = crate::switches::log_filter().unwrap_or(default);
    let filter = tracing_subscriber::EnvFilter::new(filter);
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}
