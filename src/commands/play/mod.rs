//! `inferno play [MODEL]`: chat with a model in a REPL, or answer one prompt (`--prompt`, or
//! stdin when it is not a terminal) printing only the reply on stdout.

mod picker;
mod printer;
mod repl;
mod store;

use std::io::{IsTerminal, Read, Write};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use crate::chat::{Dialogue, Sampling, SavedChat, TurnEnd, default_sampling};
use crate::cli::{PlayArgs, SamplingArgs};
use crate::engine::Session;
use crate::engine::core::EngineConfig;
use crate::engine::warm_up;
use crate::error::{ErrorKind, fail};
use crate::generate::{Sampler, SamplerConfig, StopConditions};
use crate::load::{self, LoadOptions, ModelInfo, text::TextSide};
use crate::util::human_bytes;

use printer::{Output, Printer, stats_line};

/// Everything a chat needs, loaded: the model (inside its session, with what its KV cache holds)
/// and its text side.
pub struct Chat {
    /// The model's name as the banner shows it (saved with a conversation).
    pub model: String,
    pub session: Session,
    pub text: TextSide,
    pub sampler: SamplerConfig,
    pub stop_strings: Vec<String>,
    pub max_tokens: usize,
}

impl Chat {
    pub fn stop_conditions(&self) -> StopConditions {
        StopConditions {
            eos_ids: self.text.eos_ids.clone(),
            stop_strings: self.stop_strings.clone(),
            max_tokens: self.max_tokens,
        }
    }

    /// Runs one turn of `dialogue`, printed as `out` says.
    pub fn turn(
        &mut self,
        dialogue: &mut Dialogue,
        user: &str,
        sampler: &mut Sampler,
        interrupt: &Arc<AtomicBool>,
        out: Output,
    ) -> anyhow::Result<TurnEnd> {
        let dropped = dialogue.fit(&self.text, Some(user), self.context(), self.reserve())?;
        if dropped > 0 {
            eprintln!("{}", dropped_notice(dropped, self.context()));
        }
        let sampling = Sampling { sampler, stop: self.stop_conditions(), interrupt };
        dialogue.turn(&mut self.session, &self.text, user, sampling, &mut Printer::new(out))
    }

    fn context(&self) -> usize {
        self.session.engine().context()
    }

    /// The room a prompt leaves for the reply before old turns are dropped: without it a
    /// prompt that just fits would leave a reply of a few tokens. `--max-tokens`, but at most
    /// a quarter of the context, so a small context still keeps a few turns.
    fn reserve(&self) -> usize {
        self.max_tokens.min(self.context() / 4)
    }

    /// Continues `saved` in `dialogue`: its history, system prompt and settings replace the
    /// current ones, and its prompt is run once (one greedy token, thrown away) so the engine's
    /// prefix cache holds it and the next turn prefills only the new message. Returns what to
    /// tell the user: a warning when another model saved it, then what was loaded.
    pub fn resume(
        &mut self,
        name: &str,
        saved: &SavedChat,
        dialogue: &mut Dialogue,
    ) -> anyhow::Result<Vec<String>> {
        let sampler = saved.sampler(self.sampler.repeat_last_n)?;
        saved.restore(dialogue)?;
        self.sampler = sampler;
        self.max_tokens = saved.settings.max_tokens;
        let mut notes = Vec::new();
        if saved.model != self.model {
            notes.push(format!(
                "warning: {name} was saved with {}; continuing it with {}",
                saved.model, self.model
            ));
        }
        let dropped = dialogue.fit(&self.text, None, self.context(), self.reserve())?;
        if dropped > 0 {
            notes.push(dropped_notice(dropped, self.context()));
        }
        let ids = dialogue.prompt_ids(&self.text)?;
        let mut greedy = Sampler::new(SamplerConfig { temperature: 0.0, ..self.sampler.clone() });
        let never = Arc::new(AtomicBool::new(false));
        let g = self.session.generate_tokens(&ids, &mut greedy, 1, &never, &mut |_| Ok(None))?;
        notes.push(format!(
            "(resumed {name}: {} messages, {} prompt tokens, {} of them prefilled now)",
            saved.messages.len(),
            g.prompt_tokens,
            g.prefilled_tokens
        ));
        Ok(notes)
    }

    /// The conversation as it would be saved now.
    pub fn saved(&self, dialogue: &Dialogue) -> SavedChat {
        SavedChat::of(dialogue, &self.model, &self.sampler, self.max_tokens)
    }
}

/// The one line play prints when a conversation outgrew the context.
fn dropped_notice(turns: usize, context: usize) -> String {
    let what = if turns == 1 {
        "the oldest turn".to_string()
    } else {
        format!("the {turns} oldest turns")
    };
    format!("(the conversation outgrew the {context}-token context: dropped {what})")
}

pub fn run(args: PlayArgs) -> anyhow::Result<()> {
    // First: a tensor-parallel rank other than 0 follows rank 0 and never returns.
    crate::gpu::cap_memory(args.device.gpu_memory);
    let role = load::ranks::role(args.device.tp, args.device.gpu, args.device.cpu)?;
    let interactive = args.prompt.is_none() && std::io::stdin().is_terminal();
    let model = match &args.model {
        Some(m) => m.clone(),
        None if interactive => picker::pick()?,
        None => {
            return Err(fail(
                ErrorKind::InvalidInput,
                "name a model: inferno play MODEL --prompt …",
            ));
        }
    };
    // `off` is a thinking model's switch; the levels are gpt-oss's effort.
    let (effort, thinking_off) = match args.reasoning.trim().to_ascii_lowercase().as_str() {
        "off" | "none" => (Default::default(), true),
        level => (level.parse::<crate::chat::harmony::ReasoningEffort>()?, false),
    };
    // Read before the model loads: a bad name or file is one line at once, not after a minute.
    let resumed = match &args.resume {
        Some(name) => Some((name.clone(), store::load(name)?)),
        None => None,
    };
    let spec = args.spec.config()?;
    let (device, gpu) = load::open_device(role.gpu(args.device.gpu), args.device.cpu)?;
    let gpu_name = gpu.map(|g| g.name).unwrap_or_else(|| "CPU (--cpu)".to_string());
    let opts = LoadOptions {
        dtype: args.device.dtype.as_deref().map(load::parse_dtype).transpose()?,
        context: args.context,
        dummy: false,
        kv_dtype: args.device.kv_dtype()?,
    };
    let verbose = interactive || args.verbose;
    let spinner = loading_spinner(verbose, &model);
    let started = Instant::now();
    // One sequence at a time: the pool holds the context once (what the memory plan counted).
    let draft = args.spec.draft_model();
    let (engine, loaded) = load::start_group(&model, draft, &opts, &device, role, move |info| {
        EngineConfig { spec, ..EngineConfig::single(info.context) }
    })?;
    let text = load::text::load(&loaded.source)?;
    // One throw-away step loads the kernels and creates the cuBLAS handle now, so the first
    // reply's time to first token measures the model, not CUDA start-up.
    warm_up(&engine)?;
    spinner.finish_and_clear();
    let mut dialogue = Dialogue::for_model(&text, args.system.clone(), args.raw, effort);
    if thinking_off {
        dialogue.set_thinking(&text, false)?;
    }
    let sampler =
        sampler_config(&args.sampling, default_sampling(matches!(dialogue, Dialogue::Harmony(_))))?;
    if verbose {
        eprintln!("{}", banner(&loaded, &gpu_name, &dialogue, started.elapsed().as_secs_f64()));
        if interactive {
            eprintln!("/help for commands, Ctrl+D to quit");
        }
    }
    if matches!(&dialogue, Dialogue::Plain(c) if c.raw) && !args.raw && verbose {
        eprintln!("note: the model has no chat template; completing raw text");
    }
    let session = Session::new(engine);
    let mut chat = Chat {
        model: loaded.name.clone(),
        session,
        text,
        sampler,
        stop_strings: args.stop.clone(),
        max_tokens: args.max_tokens,
    };
    if let Some((name, saved)) = &resumed {
        for note in chat.resume(name, saved, &mut dialogue)? {
            // The warning always; what was loaded only where the banner shows.
            if verbose || note.starts_with("warning") {
                eprintln!("{note}");
            }
        }
    }
    if interactive {
        return repl::run(chat, dialogue, !args.hide_reasoning, resumed.map(|(n, _)| n));
    }
    let prompt = match &args.prompt {
        Some(p) => p.clone(),
        None => stdin_prompt(std::io::stdin().lock())?,
    };
    let out = Output { interactive: false, show_reasoning: args.verbose && !args.hide_reasoning };
    one_shot(chat, dialogue, &prompt, out, args.verbose)
}

/// The prompt piped on stdin, without the line break(s) that end it.
///
/// `echo`, here-strings and editors end the text with a newline that the user did not mean as
/// part of the message: kept, the chat template renders `…France?\n` and a small model answers
/// differently than to the same `--prompt`. Only `\n` and `\r` are stripped, and only at the
/// end (as shell command substitution does): inner line breaks are the user's, and trailing
/// spaces or tabs are kept because with `--raw` they are part of the text to continue
/// (`"The capital is "` and `"The capital is"` tokenize differently).
fn stdin_prompt(mut input: impl Read) -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    input.read_to_end(&mut bytes)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| fail(ErrorKind::InvalidInput, "the prompt on stdin is not UTF-8 text"))?;
    let prompt = text.trim_end_matches(['\n', '\r']);
    if prompt.is_empty() {
        return Err(fail(
            ErrorKind::InvalidInput,
            "no prompt: stdin is empty (pipe text in, or pass --prompt TEXT)",
        ));
    }
    Ok(prompt.to_string())
}

fn one_shot(
    mut chat: Chat,
    mut dialogue: Dialogue,
    prompt: &str,
    out: Output,
    verbose: bool,
) -> anyhow::Result<()> {
    let mut sampler = Sampler::new(chat.sampler.clone());
    let interrupt = Arc::new(AtomicBool::new(false));
    let flag = interrupt.clone();
    // A second Ctrl-C while we wind down exits the usual way.
    let _ = ctrlc::set_handler(move || {
        if flag.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::process::exit(130);
        }
    });
    let end = chat.turn(&mut dialogue, prompt, &mut sampler, &interrupt, out)?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout)?;
    if verbose {
        eprintln!("{}", stats_line(&end.generation, chat.session.engine().context()));
    }
    Ok(())
}

/// `base` with the flags' settings; a fresh seed unless one is given. Validated.
pub(crate) fn sampler_config(
    args: &SamplingArgs,
    base: SamplerConfig,
) -> anyhow::Result<SamplerConfig> {
    let mut cfg = base;
    if let Some(t) = args.temperature {
        cfg.temperature = t;
    }
    if args.top_k.is_some() {
        cfg.top_k = args.top_k.filter(|&k| k > 0);
    }
    if args.top_p.is_some() {
        cfg.top_p = args.top_p;
    }
    if args.min_p.is_some() {
        cfg.min_p = args.min_p;
    }
    if let Some(r) = args.repeat_penalty {
        cfg.repeat_penalty = r;
    }
    cfg.presence_penalty = args.presence_penalty.unwrap_or(cfg.presence_penalty);
    cfg.frequency_penalty = args.frequency_penalty.unwrap_or(cfg.frequency_penalty);
    cfg.seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    cfg.validate()?;
    Ok(cfg)
}

fn loading_spinner(visible: bool, model: &str) -> indicatif::ProgressBar {
    if !visible || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(format!("loading {model}"));
    bar.enable_steady_tick(std::time::Duration::from_millis(100));
    bar
}

/// Two lines: what runs where, then the memory plan (and what loading measurably took).
fn banner(l: &ModelInfo, gpu_name: &str, dialogue: &Dialogue, load_s: f64) -> String {
    let mem =
        l.device_bytes.map(|b| format!(", {} on the GPU", human_bytes(b))).unwrap_or_default();
    let effort = dialogue.effort().map(|e| format!(" · reasoning {e}")).unwrap_or_default();
    format!(
        "inferno · {} ({}, {:?}) · {}{mem} · {}{effort} · loaded in {load_s:.1}s\nmemory: {}",
        l.name,
        l.format,
        l.dtype,
        l.device_label(gpu_name),
        l.context_label(),
        l.plan.summary(l.budget.as_ref())
    )
}

#[cfg(test)]
mod tests {
    use super::stdin_prompt;

    #[test]
    fn stdin_prompt_loses_only_its_final_line_breaks() {
        for (input, want) in [
            ("What is the capital of France?\n", "What is the capital of France?"),
            ("What is the capital of France?", "What is the capital of France?"),
            ("Windows line end\r\n", "Windows line end"),
            ("blank lines after\n\n\r\n", "blank lines after"),
            ("two\nlines\n", "two\nlines"),
            ("\n  indented\n", "\n  indented"),
            ("The capital is \n", "The capital is "),
            ("tab\t", "tab\t"),
        ] {
            assert_eq!(stdin_prompt(input.as_bytes()).unwrap(), want, "{input:?}");
        }
    }

    #[test]
    fn empty_or_non_utf8_stdin_is_invalid_input() {
        for input in [&b""[..], b"\n", b"\r\n", b"caf\xe9\n"] {
            let err = stdin_prompt(input).unwrap_err();
            assert_eq!(crate::error::kind_of(&err), crate::error::ErrorKind::InvalidInput, "{err}");
        }
    }
}
