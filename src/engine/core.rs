//! The engine: one thread that owns the model and its KV pool and runs steps while any request
//! is live. Front ends (play, bench, serve) only submit [`Request`]s and read events; they
//! share this one generation path.
//!
//! Each loop: take new requests and cancellations from the command channel (blocking only when
//! idle), let the scheduler pick the step, run it, then hand out the sampled ids and finish the
//! sequences that stopped (their blocks go back at once). Decode steps on a GPU are pipelined
//! ([`pipeline`]): the next step is enqueued before the host reads this one's ids.

mod masks;
mod oom;
pub use oom::OUT_OF_MEMORY;
mod pipeline;
mod sampling;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

use super::kv::blocks::BlockManager;
use super::logprobs::TokenLogprobs;
use super::pool::{PoolSize, runner_with_pool};
use super::readback::ReadbackStream;
use super::request::{Command, Event, Finish, Pending, Request, RequestHandle};
use super::runner::{Runner, StepOut};
use super::scheduler::{Scheduler, SchedulerConfig};
use super::spec::{Draft, Speculator};
use crate::error::{ErrorKind, fail};
use crate::generate::{Sampler, StopReason};
use crate::models::batch::BatchModel;

/// How big the engine is, and whether it pipelines its decode steps.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// Sequences decoded together at most.
    pub max_seqs: usize,
    /// Tokens of KV the pool holds for full-attention layers (over all sequences).
    pub kv_tokens: usize,
    /// Tokens one step runs at most: bounds a prompt chunk, and so a step's time and workspace.
    pub token_budget: usize,
    /// Decode steps are pipelined where decode graphs run (`core/pipeline.rs`). Front ends pass
    /// [`crate::switches::pipeline`]; a field rather than the switch alone, so that one process
    /// can run an engine of each kind (tests/pipeline_gpu.rs compares them).
    pub pipeline: bool,
    /// Speculative decoding (`--draft`), `None` for none.
    pub spec: Option<super::spec::SpecConfig>,
}

/// Tokens one step runs at most unless a front end says otherwise (`--step-tokens`). gpt-oss-20b
/// on an H100: prefill of a 1k prompt 19.7k tok/s in chunks of 512, 24.3k in one
/// step; of an 8k prompt 16.1k / 19.2k / 21.6k with steps of 512 / 1,024 / 2,048 (the MoE's
/// grouped GEMMs see more tokens per expert). The price is paid by other streams: their next
/// token waits behind a chunk (~85 ms for 2,048 gpt-oss tokens), the trade vLLM's and SGLang's
/// chunked prefill make with their own budgets of a few thousand tokens.
pub const DEFAULT_TOKEN_BUDGET: usize = 2048;

impl EngineConfig {
    /// One sequence of up to `context` tokens (play).
    pub fn single(context: usize) -> Self {
        EngineConfig {
            max_seqs: 1,
            kv_tokens: context,
            token_budget: DEFAULT_TOKEN_BUDGET,
            pipeline: crate::switches::pipeline(),
            spec: None,
        }
    }

    /// What sizes the engine's KV pool, and its drafter's.
    pub fn pool(&self) -> PoolSize {
        PoolSize {
            max_seqs: self.max_seqs,
            kv_tokens: self.kv_tokens,
            token_budget: self.token_budget,
        }
    }
}

/// What an engine thread's `load` builds ([`Engine::start_built`]).
pub struct Built<I> {
    pub model: Box<dyn BatchModel>,
    /// The drafter for speculative decoding (`--draft MODEL` or `--draft HEAD`).
    pub draft: Option<Draft>,
    pub cfg: EngineConfig,
    /// What the front end gets back beside the engine.
    pub info: I,
    /// The other ranks, on rank 0 of a tensor-parallel model.
    pub followers: Option<Box<dyn super::ranks::Followers>>,
}

/// The pool's and the queue's state, for front ends (`/metrics`, bench, tests).
#[derive(Debug, Clone, Default)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    /// Per KV group: blocks a new allocation could get, and all blocks.
    pub free_blocks: Vec<usize>,
    pub total_blocks: Vec<usize>,
    pub steps: u64,
    /// Sequences in the last step.
    pub last_batch: usize,
    /// Steps in which every sequence decoded one token, by batch size: (count, total time).
    /// A full batch's step time is its streams' inter-token latency.
    pub decode_steps: std::collections::BTreeMap<usize, (u64, std::time::Duration)>,
    /// Steps enqueued before the host had read the previous step's ids ([`pipeline`]).
    pub pipelined_steps: u64,
    /// Decode graphs whose capture failed (their steps run eagerly, slower).
    pub failed_graphs: usize,
    /// Speculative decoding's drafts and what they gave.
    pub spec: super::spec::SpecStats,
}

/// A handle on the engine thread; dropping it stops the thread after the running requests.
pub struct Engine {
    tx: Sender<Command>,
    next_id: AtomicU64,
    stats: Arc<Mutex<EngineStats>>,
    context: usize,
    vocab: usize,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    /// Starts the engine thread, which builds the model with `load` (so the model never moves
    /// between threads) and sizes its pool from `cfg`. Returns once the model is loaded, with
    /// what `load` returned beside it.
    pub fn start<I, F>(load: F) -> anyhow::Result<(Engine, I)>
    where
        I: Send + 'static,
        F: FnOnce() -> anyhow::Result<(Box<dyn BatchModel>, EngineConfig, I)> + Send + 'static,
    {
        Engine::start_with_draft(move || {
            let (model, cfg, info) = load()?;
            Ok((model, None, cfg, info))
        })
    }

    /// [`Engine::start`] where `load` also builds a draft model or an EAGLE-3 head for
    /// speculative decoding (`--draft`), which the engine thread owns beside the model.
    pub fn start_with_draft<I, F>(load: F) -> anyhow::Result<(Engine, I)>
    where
        I: Send + 'static,
        F: FnOnce() -> anyhow::Result<(Box<dyn BatchModel>, Option<Draft>, EngineConfig, I)>
            + Send
            + 'static,
    {
        Engine::start_built(move || {
            let (model, draft, cfg, info) = load()?;
            Ok(Built { model, draft, cfg, info, followers: None })
        })
    }

    /// [`Engine::start_with_draft`] for any [`Built`]: a tensor-parallel model's rank 0 comes
    /// with the other ranks its runner sends each step to.
    pub fn start_built<I, F>(load: F) -> anyhow::Result<(Engine, I)>
    where
        I: Send + 'static,
        F: FnOnce() -> anyhow::Result<Built<I>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let stats = Arc::new(Mutex::new(EngineStats::default()));
        let thread_stats = stats.clone();
        let thread =
            std::thread::Builder::new().name("inferno-engine".into()).spawn(move || {
                let core = load().and_then(|Built { model, draft, cfg, info, followers }| {
                    Ok((Core::new(model, followers, draft, cfg, thread_stats)?, info))
                });
                match core {
                    Ok((mut core, info)) => {
                        let dims = (core.max_context, core.runner.model.vocab_size());
                        if ready_tx.send(Ok((dims, info))).is_ok() {
                            core.run(rx);
                        }
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })?;
        let ((context, vocab), info) = ready_rx
            .recv()
            .map_err(|_| anyhow::anyhow!("the engine thread stopped while loading"))??;
        let engine =
            Engine { tx, next_id: AtomicU64::new(1), stats, context, vocab, thread: Some(thread) };
        Ok((engine, info))
    }

    /// Queues a request. Its events start once the scheduler admits it.
    pub fn submit(&self, req: Request) -> anyhow::Result<RequestHandle> {
        if req.prompt.is_empty() {
            return Err(fail(ErrorKind::InvalidInput, "the prompt is empty"));
        }
        if req.prompt.len() >= self.context {
            return Err(fail(
                ErrorKind::InvalidInput,
                format!(
                    "the prompt is {} tokens, the context holds {}: shorten it or raise --context",
                    req.prompt.len(),
                    self.context
                ),
            ));
        }
        req.sampling.validate()?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (events_tx, events) = unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let pending = Pending {
            id,
            req,
            events: events_tx,
            cancel: cancel.clone(),
            submitted: Instant::now(),
        };
        self.tx
            .send(Command::Submit(Box::new(pending)))
            .map_err(|_| anyhow::anyhow!("the engine has stopped"))?;
        Ok(RequestHandle { id, events, cancel, wake: self.tx.clone() })
    }

    pub fn stats(&self) -> EngineStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Positions one sequence may hold.
    pub fn context(&self) -> usize {
        self.context
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.tx.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A request the scheduler knows, with its sampling state and event channel.
struct Live {
    req: Request,
    events: UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
    sampler: Sampler,
    submitted: Instant,
    started: Option<Instant>,
    first_token: Option<Instant>,
    cached: usize,
    generated: usize,
}

impl Live {
    /// Draft tokens this request may verify in its next step (`None`: it may not speculate):
    /// its tokens are its sampler's (no output constraint, no forced token left), and a draft
    /// leaves room for one more token within `max_tokens`.
    fn draft_room(&self) -> Option<usize> {
        let own = self.req.constraint.is_none() && self.req.forced.len() <= self.generated;
        let room = self.req.max_tokens.saturating_sub(self.generated + 1);
        (own && room > 0).then_some(room)
    }
}

struct Core {
    /// Step times by kind and batch size (`INFERNO_STEP_STATS=1` prints them when the engine
    /// stops): where a benchmark's time goes without a profiler.
    step_times: std::collections::BTreeMap<(bool, usize), (u64, std::time::Duration)>,
    print_step_times: bool,
    runner: Runner,
    blocks: BlockManager,
    sched: Scheduler,
    live: HashMap<u64, Live>,
    stats: Arc<Mutex<EngineStats>>,
    max_context: usize,
    steps: u64,
    /// When the last step's results were handed out.
    last_step_end: Option<Instant>,
    pipelined_steps: u64,
    /// A decode step enqueued whose ids the host has not read yet ([`pipeline`]).
    in_flight: Option<pipeline::InFlight>,
    /// The stream sampled ids are read through.
    readback: ReadbackStream,
    /// Decode steps are pipelined (on a GPU with decode graphs, unless the config says no).
    pipelined: bool,
    /// Sequences of this step whose output constraint failed (its mask or its commit), with
    /// the message they end with once the step's tokens are handed out.
    broken: HashMap<u64, String>,
    /// Time spent on constraint masks (printed with the step times): rows and steps masked,
    /// the host's time computing them, and the time writing them into the logits.
    mask_time: masks::MaskTime,
    /// Speculative decoding: the drafter, and every sequence's drafts and what they gave.
    spec: Speculator,
}

impl Core {
    /// The engine over `model` (with its other ranks, `followers`, on rank 0 of a
    /// tensor-parallel model) and `draft`, its drafter, sized by `cfg`.
    fn new(
        model: Box<dyn BatchModel>,
        followers: Option<Box<dyn super::ranks::Followers>>,
        draft: Option<Draft>,
        cfg: EngineConfig,
        stats: Arc<Mutex<EngineStats>>,
    ) -> anyhow::Result<Core> {
        let max_context = model.max_positions();
        let pipelined = super::graphs::enabled(model.device()) && cfg.pipeline;
        let (mut runner, blocks) = runner_with_pool(model, &cfg.pool())?;
        // Before the drafter is built: a runner dropped with its ranks stops them first.
        runner.followers = followers;
        let spec = Speculator::new(cfg.spec, draft, &cfg.pool(), &mut runner)?;
        let sched = Scheduler::new(SchedulerConfig {
            max_seqs: cfg.max_seqs.max(1),
            token_budget: cfg.token_budget.max(1),
            max_context,
        });
        let core = Core {
            step_times: Default::default(),
            print_step_times: crate::switches::step_stats(),
            runner,
            blocks,
            sched,
            live: HashMap::new(),
            stats,
            max_context,
            steps: 0,
            last_step_end: None,
            pipelined_steps: 0,
            in_flight: None,
            readback: ReadbackStream::default(),
            pipelined,
            broken: HashMap::new(),
            mask_time: Default::default(),
            spec,
        };
        core.publish(0);
        Ok(core)
    }

    fn run(&mut self, rx: Receiver<Command>) {
        loop {
            // Block only when there is nothing to run.
            let first = if self.sched.is_idle() && self.in_flight.is_none() {
                match rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return,
                }
            } else {
                None
            };
            for cmd in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                match cmd {
                    Command::Submit(p) => self.admit(*p),
                    Command::Wake => {}
                    Command::Shutdown => {
                        self.fail_all("the engine is shutting down");
                        self.print_step_times();
                        return;
                    }
                }
            }
            self.drop_cancelled();
            self.publish(0);
            if !self.sched.is_idle() || self.in_flight.is_some() {
                self.step();
            }
        }
    }

    fn admit(&mut self, p: Pending) {
        self.spec.start(p.id, &p.req, self.sched.running());
        let live = Live {
            sampler: Sampler::new(p.req.sampling.clone()).with_prompt_len(p.req.prompt.len()),
            events: p.events,
            cancel: p.cancel,
            submitted: p.submitted,
            started: None,
            first_token: None,
            cached: 0,
            generated: 0,
            req: p.req,
        };
        if live.req.max_tokens == 0 {
            self.live.insert(p.id, live);
            self.finish(p.id, StopReason::MaxTokens);
            return;
        }
        self.sched.push(p.id, live.req.prompt.clone());
        self.live.insert(p.id, live);
    }

    /// Cancelled requests and those whose receiver is gone leave at once.
    fn drop_cancelled(&mut self) {
        let gone: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, l)| {
                let interrupted =
                    l.req.interrupt.as_ref().is_some_and(|f| f.load(Ordering::Relaxed));
                interrupted || l.cancel.load(Ordering::Relaxed) || l.events.is_closed()
            })
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.finish(id, StopReason::Interrupted);
        }
    }

    fn step(&mut self) {
        if let Some(step) = self.in_flight.take() {
            self.advance(step);
            return;
        }
        let t0 = Instant::now();
        self.propose_drafts();
        let plan = self.sched.schedule(&mut self.blocks);
        let now = Instant::now();
        for (id, cached) in &plan.admitted {
            if let Some(l) = self.live.get_mut(id) {
                l.started.get_or_insert(now);
                // A preempted sequence re-admitted keeps its first count.
                if l.generated == 0 {
                    l.cached = *cached;
                }
            }
        }
        if plan.chunks.is_empty() {
            // Nothing fits although nothing runs: the head of the queue can never fit.
            if self.sched.running() == 0
                && let Some(id) = self.oldest_waiting()
            {
                self.fail(id, "the request does not fit in the KV cache: raise --kv-tokens");
            }
            return;
        }
        let inputs: Vec<Vec<u32>> = plan.chunks.iter().map(|c| self.sched.chunk_ids(c)).collect();
        self.runner.keep_taps = self.spec.wants_taps(&plan.chunks, self.sched.running());
        let draws = self.rank_draws(&plan.chunks, 0);
        let out = self.runner.forward_drawn(&plan.chunks, &inputs, &self.blocks, draws.as_deref());
        let out = match out {
            Ok(l) => {
                self.spec.record_taps(
                    &plan.chunks,
                    self.sched.running(),
                    &mut self.runner.last_taps,
                );
                l
            }
            Err(e) => {
                if self.runner.followers.is_some() {
                    // The other ranks ran this step's collectives, or wait in them: a rank 0 that
                    // went on alone would pair its next collectives with their old ones.
                    eprintln!("inferno (rank 0): a step failed, so the ranks cannot go on: {e:#}");
                    crate::error::exit_now(crate::error::ErrorKind::Rank);
                }
                self.step_failed(&plan.chunks, &e);
                return;
            }
        };
        let sampling: Vec<_> = plan.chunks.iter().filter(|c| c.sample).copied().collect();
        // Ids drawn on the ranks: none of their requests has a constraint (`rank_draws`).
        let constrained = out.map(|o| match o {
            StepOut::Logits(l) => self.constrain(l, &sampling).map(StepOut::Logits),
            ids => Ok(ids),
        });
        let out = match constrained.transpose() {
            Ok(o) => o,
            Err(e) => {
                self.step_failed(&plan.chunks, &e);
                return;
            }
        };
        if let Some(o) = &out
            && self.defer(o, &plan.chunks, t0)
        {
            return;
        }
        let sampled = match out.map(|o| self.sample(&o, &sampling)).transpose() {
            Ok(s) => s.unwrap_or_default(),
            Err(e) => {
                self.step_failed(&plan.chunks, &e);
                return;
            }
        };
        let mut sampled = sampled.into_iter();
        self.count_step(&plan.chunks, t0);
        for c in &plan.chunks {
            let run = if c.sample { sampled.next() } else { None };
            if let Some(msg) = self.broken.remove(&c.id) {
                self.fail(c.id, &msg);
                continue;
            }
            let (accepted, tokens) = run.map_or((0, Vec::new()), |r| (r.accepted, r.tokens));
            let ids: Vec<u32> = tokens.iter().map(|t| t.0).collect();
            self.sched.complete(c, accepted, &ids, &mut self.blocks);
            if c.sample && c.len > 1 && c.drafts == 0 {
                self.spec.prefilled(c.id, &self.sched);
            }
            self.emit_run(c.id, tokens);
        }
        // Sequences that failed above are gone from the scheduler: the head skips them.
        let prefilled = plan.chunks.iter().map(|c| (c.id, c.sample && c.len > 1 && c.drafts == 0));
        self.spec.catch_up(&self.sched, prefilled);
        self.publish(plan.chunks.len());
    }

    /// Sets this step's drafts in the scheduler: the speculator's, for the requests that may
    /// take one ([`Live::draft_room`]).
    fn propose_drafts(&mut self) {
        let Core { spec, sched, live, runner, .. } = self;
        let room = |id: u64| live.get(&id).and_then(Live::draft_room);
        for (id, draft) in spec.propose(sched, runner.model.as_ref(), room) {
            sched.set_draft(id, draft);
        }
    }

    /// Whether sequence `id` would draft if its tokens so far were all it had (the pipelined
    /// decode stops going ahead for it, so that its next step can verify).
    fn would_draft(&self, id: u64) -> bool {
        let room = self.live.get(&id).and_then(Live::draft_room).is_some();
        self.spec.would_draft(id, room, &self.sched, self.runner.model.as_ref())
    }

    /// A step's count and time, by kind and batch size.
    /// A pipelined step starts before the previous one is done: its time runs from the later
    /// of its start and the previous step's end, so that the times of back-to-back steps add
    /// up to the wall time (bench's "all streams decoding" rate).
    fn count_step(&mut self, chunks: &[super::scheduler::Chunk], t0: Instant) {
        self.steps += 1;
        let now = Instant::now();
        let from = self.last_step_end.map_or(t0, |end| end.max(t0));
        self.last_step_end = Some(now);
        let decode_only = chunks.iter().all(|c| c.len == 1);
        let e = self.step_times.entry((decode_only, chunks.len())).or_default();
        e.0 += 1;
        e.1 += now.saturating_duration_since(from);
    }

    /// Hands a sampled id (with its log probabilities, when asked) to its request, whose sequence
    /// is `len` tokens long with it, and finishes the request when it stops. Whether the request
    /// goes on.
    fn emit(&mut self, id: u64, tok: u32, scores: Option<Box<TokenLogprobs>>, len: usize) -> bool {
        let Some(l) = self.live.get_mut(&id) else { return false };
        l.first_token.get_or_insert_with(Instant::now);
        l.generated += 1;
        let sent = l.events.send(Event::Token(tok, scores)).is_ok();
        let reason = if !sent {
            Some(StopReason::Interrupted)
        } else if l.req.eos_ids.contains(&tok) {
            Some(StopReason::Eos(tok))
        } else if l.generated >= l.req.max_tokens {
            Some(StopReason::MaxTokens)
        } else if len >= self.max_context {
            Some(StopReason::ContextFull)
        } else {
            None
        };
        match reason {
            Some(r) => {
                self.finish(id, r);
                false
            }
            None => true,
        }
    }

    fn finish(&mut self, id: u64, reason: StopReason) {
        self.sched.remove(id, &mut self.blocks);
        let (draft_tokens, accepted_draft_tokens) = self.spec.end(id);
        let Some(l) = self.live.remove(&id) else { return };
        let now = Instant::now();
        let first = l.first_token.unwrap_or(now);
        let finish = Finish {
            reason,
            prompt_tokens: l.req.prompt.len(),
            cached_tokens: l.cached,
            generated: l.generated,
            queued: l.started.unwrap_or(now).duration_since(l.submitted),
            time_to_first_token: first.duration_since(l.submitted),
            decode_time: now.duration_since(first),
            draft_tokens,
            accepted_draft_tokens,
        };
        let _ = l.events.send(Event::Finished(finish));
    }

    fn fail(&mut self, id: u64, msg: &str) {
        self.sched.remove(id, &mut self.blocks);
        self.spec.end(id);
        if let Some(l) = self.live.remove(&id) {
            let _ = l.events.send(Event::Failed(msg.to_string()));
        }
    }

    /// Fails every sequence of a step (what the pool holds for them is unknown).
    fn fail_chunks(&mut self, chunks: &[super::scheduler::Chunk], msg: &str) {
        for c in chunks {
            self.fail(c.id, msg);
        }
    }

    fn fail_all(&mut self, msg: &str) {
        let ids: Vec<u64> = self.live.keys().copied().collect();
        for id in ids {
            self.fail(id, msg);
        }
    }

    fn print_step_times(&self) {
        if !self.print_step_times {
            return;
        }
        let m = &self.mask_time;
        if m.rows > 0 {
            eprintln!(
                "constraint masks: {} rows in {} steps; computing {:.2} ms a step (in parallel), \
                 writing {:.2} ms a step",
                m.rows,
                m.steps,
                m.compute.as_secs_f64() * 1e3 / m.steps as f64,
                m.write.as_secs_f64() * 1e3 / m.steps as f64,
            );
        }
        for ((decode_only, seqs), (n, total)) in &self.step_times {
            let kind = if *decode_only { "decode" } else { "mixed " };
            let ms = total.as_secs_f64() * 1e3 / *n as f64;
            eprintln!("step {kind} seqs {seqs:>3}: {n:>6} steps, {ms:>8.3} ms each");
        }
    }

    fn oldest_waiting(&self) -> Option<u64> {
        self.live.keys().copied().filter(|id| self.sched.get(*id).is_some()).min()
    }

    fn publish(&self, batch: usize) {
        if let Ok(mut s) = self.stats.lock() {
            let groups = self.runner.shape.group_windows.len();
            *s = EngineStats {
                running: self.sched.running(),
                waiting: self.sched.waiting(),
                free_blocks: (0..groups).map(|g| self.blocks.free_blocks(g)).collect(),
                total_blocks: (0..groups).map(|g| self.blocks.total_blocks(g)).collect(),
                steps: self.steps,
                last_batch: batch,
                decode_steps: self
                    .step_times
                    .iter()
                    .filter(|((decode_only, _), _)| *decode_only)
                    .map(|((_, n), v)| (*n, *v))
                    .collect(),
                pipelined_steps: self.pipelined_steps,
                failed_graphs: self.runner.graphs.values().filter(|g| g.capture_failed()).count(),
                spec: self.spec.stats(),
            };
        }
    }
}
