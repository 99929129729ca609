//! Every `INFERNO_*` environment variable the binary reads, in one place, so that a user (and
//! `inferno doctor`, and docs/operations.md's tables) can see all of them: a few switches for
//! users, a few diagnostics for performance work, and, kept apart, the knobs the integration
//! tests set.
//!
//! Each is read once per process, on first use, and then fixed: a kernel launch or a decode
//! step asks for it often, and one process must not mix two settings. A value outside the
//! accepted ones prints one warning line on stderr, names the accepted values and falls back to
//! the default; `inferno doctor` lists it as a problem. An empty value counts as unset.
//!
//! Variables only the test code reads (`INFERNO_ASSETS`, `INFERNO_CACHE`, `INFERNO_TEST_SEED`,
//! `INFERNO_FUZZ_SEED`, `INFERNO_FUZZ_ITERS`, `INFERNO_CHAT_FIXTURES`) go through [`test_var`].

use std::sync::OnceLock;

use serde::Serialize;

/// Who a switch is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Settings a user may want.
    User,
    /// Extra output or a fallback for performance work and bug reports.
    Diagnostic,
    /// Set by the integration tests; never needed otherwise.
    Test,
}

/// What a switch is: its name, the values it takes, its default and what it does.
#[derive(Debug)]
pub struct Spec {
    pub name: &'static str,
    pub values: &'static str,
    pub default: &'static str,
    pub what: &'static str,
    pub kind: Kind,
}

// ---------------------------------------------------------------------------------------------
// For users.

static CUDA_GRAPH: Flag = Flag::new(Spec {
    name: "INFERNO_CUDA_GRAPH",
    values: "0, 1",
    default: "1",
    what: "decode steps replay captured CUDA graphs (0: every kernel is launched from the host)",
    kind: Kind::User,
});

static PDL: Flag = Flag::new(Spec {
    name: "INFERNO_PDL",
    values: "0, 1",
    default: "1",
    what: "Programmatic Dependent Launch on GPUs of compute capability 9.0+ (a kernel starts \
           while its predecessor finishes)",
    kind: Kind::User,
});

static PIPELINE: Flag = Flag::new(Spec {
    name: "INFERNO_PIPELINE",
    values: "0, 1",
    default: "1",
    what: "pipelined decode: the next step is enqueued before the host reads this one's tokens \
           (with CUDA graphs only)",
    kind: Kind::User,
});

static BATCH_INVARIANT: Text = Text::new(
    Spec {
        name: "INFERNO_BATCH_INVARIANT",
        values: "auto, 0, 1",
        default: "auto",
        what: "auto: steps that verify drafts (speculative decoding) compute each row as alone, \
               whatever the batch; 1: every step of up to 256 rows does (slower than cuBLAS \
               past 16 rows); 0: none past 16 rows, and speculation verifies in steps of up to \
               8 rows",
        kind: Kind::User,
    },
    check_batch_invariant,
);

fn check_batch_invariant(v: &str) -> Result<(), String> {
    match v {
        "auto" | "0" | "1" => Ok(()),
        _ => Err("expected auto, 0 or 1".into()),
    }
}

static LOG: Text = Text::new(
    Spec {
        name: "INFERNO_LOG",
        values: "a tracing filter, e.g. inferno=debug",
        default: "inferno=info",
        what: "what `serve` logs on stderr (unset, -v raises it to inferno=debug and -vv to debug)",
        kind: Kind::User,
    },
    check_log_filter,
);

static TP_JOIN_TIMEOUT: Number = Number::new(
    Spec {
        name: "INFERNO_TP_JOIN_TIMEOUT",
        values: "seconds, at least 1",
        default: "120",
        what: "seconds the ranks of a --tp group wait for each other to join and to reach rank 0 \
               (a launcher that starts ranks slowly needs more)",
        kind: Kind::User,
    },
    120,
    1,
);

/// Whether decode steps use CUDA graphs (on a CUDA device).
pub fn cuda_graphs() -> bool {
    CUDA_GRAPH.get()
}

/// Whether launches may carry the Programmatic Dependent Launch attribute (the GPU must also
/// support it).
pub fn pdl() -> bool {
    PDL.get()
}

/// Whether engines pipeline their decode steps: the default of `EngineConfig::pipeline`.
pub fn pipeline() -> bool {
    PIPELINE.get()
}

/// `INFERNO_BATCH_INVARIANT`: `Some(on)` when set to 1 or 0, `None` for auto
/// (`kernels::invariance::on` decides).
pub fn batch_invariant() -> Option<bool> {
    match BATCH_INVARIANT.get() {
        Some("1") => Some(true),
        Some("0") => Some(false),
        _ => None,
    }
}

/// The `serve` log filter, when set (a `tracing_subscriber::EnvFilter` directive).
pub fn log_filter() -> Option<&'static str> {
    LOG.get()
}

fn check_log_filter(v: &str) -> Result<(), String> {
    tracing_subscriber::EnvFilter::try_new(v).map(drop).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------------------------
// Diagnostics, for performance work.

static STEP_STATS: Flag = Flag::new(Spec {
    name: "INFERNO_STEP_STATS",
    values: "0, 1",
    default: "0",
    what: "the engine prints its step times by kind and batch size on stderr when it stops",
    kind: Kind::Diagnostic,
});

static GRAPH_STATS: Flag = Flag::new(Spec {
    name: "INFERNO_GRAPH_STATS",
    values: "0, 1",
    default: "0",
    what: "each captured decode graph's nodes, replay time and arena use, on stderr",
    kind: Kind::Diagnostic,
});

static PIPELINE_TRACE: Flag = Flag::new(Spec {
    name: "INFERNO_PIPELINE_TRACE",
    values: "0, 1",
    default: "0",
    what: "why a decode step was not pipelined, on stderr",
    kind: Kind::Diagnostic,
});

static TP_TRACE: Flag = Flag::new(Spec {
    name: "INFERNO_TP_TRACE",
    values: "0, 1",
    default: "0",
    what: "each rank of a tensor-parallel model says on stderr which step it starts and ends \
           (each step waits for the GPU: slow)",
    kind: Kind::Diagnostic,
});

static TP_P2P: Flag = Flag::new(Spec {
    name: "INFERNO_TP_P2P",
    values: "0, 1",
    default: "1",
    what: "a tensor-parallel model's collectives go through the GPUs' peer memory where they can \
           reach each other (0: through NCCL; the same bits either way)",
    kind: Kind::Diagnostic,
});

static TP_SKIP_SUMS: Flag = Flag::new(Spec {
    name: "INFERNO_TP_SKIP_SUMS",
    values: "0, 1",
    default: "0",
    what: "the ranks of a tensor-parallel model skip the sums of their row-parallel products \
           (1: every output is wrong; a bench's step times then say what the sums cost)",
    kind: Kind::Diagnostic,
});

static GRAPH_ARENA: Flag = Flag::new(Spec {
    name: "INFERNO_GRAPH_ARENA",
    values: "0, 1",
    default: "1",
    what: "captured steps allocate from the engine's arena (0: the graphs hold memory nodes, \
           which cancel PDL's overlap)",
    kind: Kind::Diagnostic,
});

static BENCH_WARMUP: Flag = Flag::new(Spec {
    name: "INFERNO_BENCH_WARMUP",
    values: "0, 1",
    default: "1",
    what: "`bench` runs once before the runs it measures (0: not, for a profiler that times each \
           kernel alone and needs the measured run only; the first run then captures the graphs)",
    kind: Kind::Diagnostic,
});

static PROFILE_FROM_STEP: Number = Number::new(
    Spec {
        name: "INFERNO_PROFILE_FROM_STEP",
        values: "a step number, 0: off",
        default: "0",
        what: "the engine starts the CUDA profiler (cuProfilerStart) before its step N, counting \
               from 1, for a profiler started with profiling off (`ncu --profile-from-start off`, \
               as `scripts/gpu-profile.sh` does) to time the last steps only",
        kind: Kind::Diagnostic,
    },
    0,
    0,
);

/// Whether the engine prints its step times when it stops.
pub fn step_stats() -> bool {
    STEP_STATS.get()
}

/// Whether each captured decode graph is described on stderr.
pub fn graph_stats() -> bool {
    GRAPH_STATS.get()
}

/// Whether the engine says on stderr why a decode step was not pipelined.
pub fn pipeline_trace() -> bool {
    PIPELINE_TRACE.get()
}

/// Whether each rank of a tensor-parallel model traces its steps.
pub fn tp_trace() -> bool {
    TP_TRACE.get()
}

/// Whether tensor-parallel collectives may go through peer memory.
pub fn tp_p2p() -> bool {
    TP_P2P.get()
}

/// Whether a tensor-parallel model's ranks skip their sums (timing only: the outputs are wrong).
pub fn tp_skip_sums() -> bool {
    TP_SKIP_SUMS.get()
}

/// Whether captured decode steps allocate from the engine's arena.
pub fn graph_arena() -> bool {
    GRAPH_ARENA.get()
}

/// Whether `bench` runs once before the runs it measures.
pub fn bench_warmup() -> bool {
    BENCH_WARMUP.get()
}

/// The engine step before which the CUDA profiler starts (`None`: never started by the engine).
pub fn profile_from_step() -> Option<u64> {
    Some(PROFILE_FROM_STEP.get()).filter(|&n| n > 0)
}

// ---------------------------------------------------------------------------------------------
// For tests: knobs the integration tests set on the binary they run.

static TEST_HOOKS: Flag = Flag::new(Spec {
    name: "INFERNO_TEST_HOOKS",
    values: "0, 1",
    default: "0",
    what: "`serve` honours test-only request fields",
    kind: Kind::Test,
});

static TEST_REPLIES: Text = Text::new(
    Spec {
        name: "INFERNO_TEST_REPLIES",
        values: "a JSON file: an array of strings",
        default: "unset",
        what: "with INFERNO_TEST_HOOKS=1, `serve` forces these replies in turn",
        kind: Kind::Test,
    },
    |_| Ok(()),
);

static RETRY_DELAY_MS: Number = Number::new(
    Spec {
        name: "INFERNO_RETRY_DELAY_MS",
        values: "milliseconds",
        default: "500",
        what: "the first delay between download retries (doubling, up to 8 s)",
        kind: Kind::Test,
    },
    500,
    0,
);

static SSE_KEEP_ALIVE_SECS: Number = Number::new(
    Spec {
        name: "INFERNO_SSE_KEEP_ALIVE_SECS",
        values: "seconds, at least 1",
        default: "10",
        what: "seconds between a stream's keep-alive comments",
        kind: Kind::Test,
    },
    10,
    1,
);

/// How long the ranks of a `--tp` group wait for each other to join.
pub fn tp_join_timeout() -> std::time::Duration {
    std::time::Duration::from_secs(TP_JOIN_TIMEOUT.get())
}

/// Whether `serve` honours test-only request fields.
pub fn test_hooks() -> bool {
    TEST_HOOKS.get()
}

/// The file of replies `serve` forces in turn (with [`test_hooks`]).
pub fn test_replies() -> Option<&'static str> {
    TEST_REPLIES.get()
}

/// The first delay between download retries, in milliseconds.
pub fn retry_delay_ms() -> u64 {
    RETRY_DELAY_MS.get()
}

/// Seconds between SSE keep-alive comments.
pub fn sse_keep_alive_secs() -> u64 {
    SSE_KEEP_ALIVE_SECS.get()
}

/// A variable only test code reads (the module's header lists them), when set and not empty.
/// Read at each call: tests read them once each.
pub fn test_var(name: &str) -> Option<String> {
    debug_assert!(name.starts_with("INFERNO_"), "{name} is not an inferno variable");
    raw(name)
}

// ---------------------------------------------------------------------------------------------
// The report `inferno doctor` prints.

/// One switch as this process sees it.
#[derive(Debug, Serialize)]
pub struct State {
    pub name: &'static str,
    pub kind: Kind,
    /// The value in effect (the default when unset or not accepted).
    pub value: String,
    /// The variable's value when it is set.
    pub set: Option<String>,
    /// Why the set value is not accepted.
    pub error: Option<String>,
    pub values: &'static str,
    pub default: &'static str,
    pub what: &'static str,
}

/// Every switch, in the order of this module.
pub fn all() -> [&'static dyn Switch; 19] {
    [
        &CUDA_GRAPH,
        &PDL,
        &PIPELINE,
        &BATCH_INVARIANT,
        &LOG,
        &TP_JOIN_TIMEOUT,
        &STEP_STATS,
        &GRAPH_STATS,
        &PIPELINE_TRACE,
        &TP_TRACE,
        &TP_P2P,
        &TP_SKIP_SUMS,
        &GRAPH_ARENA,
        &BENCH_WARMUP,
        &PROFILE_FROM_STEP,
        &TEST_HOOKS,
        &TEST_REPLIES,
        &RETRY_DELAY_MS,
        &SSE_KEEP_ALIVE_SECS,
    ]
}

/// What every switch is in this process's environment (read afresh, without warnings).
pub fn states() -> Vec<State> {
    all().iter().map(|s| s.state()).collect()
}

/// A switch of any type, described.
pub trait Switch: Sync {
    fn spec(&self) -> &Spec;
    /// The value in effect for `raw` (the variable's value, if set), or why `raw` is refused.
    fn effective(&self, raw: Option<&str>) -> Result<String, String>;

    fn state(&self) -> State {
        let spec = self.spec();
        let set = raw(spec.name);
        let (value, error) = match self.effective(set.as_deref()) {
            Ok(v) => (v, None),
            Err(e) => (spec.default.to_string(), Some(e)),
        };
        State {
            name: spec.name,
            kind: spec.kind,
            value,
            set,
            error,
            values: spec.values,
            default: spec.default,
            what: spec.what,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The three types of switch.

/// The variable's value; empty counts as unset.
fn raw(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// One warning line for a refused value; each switch is read once, so it prints once.
fn warn(spec: &Spec, value: &str, why: &str) {
    eprintln!("inferno: ignoring {}={value}: {why}; it keeps its default", spec.name);
}

/// Reads `spec`'s variable with `parse` (None: unset), warning about a refused value.
fn read<T>(spec: &Spec, parse: impl Fn(&str) -> Result<T, String>) -> Option<T> {
    let value = raw(spec.name)?;
    parse(&value).map_err(|why| warn(spec, &value, &why)).ok()
}

/// On or off: `0` or `1`.
struct Flag {
    spec: Spec,
    cell: OnceLock<bool>,
}

impl Flag {
    const fn new(spec: Spec) -> Self {
        Flag { spec, cell: OnceLock::new() }
    }

    fn default_on(&self) -> bool {
        self.spec.default == "1"
    }

    fn parse(v: &str) -> Result<bool, String> {
        match v {
            "0" => Ok(false),
            "1" => Ok(true),
            _ => Err("expected 0 or 1".into()),
        }
    }

    fn get(&self) -> bool {
        *self.cell.get_or_init(|| read(&self.spec, Self::parse).unwrap_or(self.default_on()))
    }
}

impl Switch for Flag {
    fn spec(&self) -> &Spec {
        &self.spec
    }
    fn effective(&self, raw: Option<&str>) -> Result<String, String> {
        let on = raw.map(Self::parse).transpose()?.unwrap_or(self.default_on());
        Ok(if on { "1" } else { "0" }.into())
    }
}

/// A whole number of at least `min`.
struct Number {
    spec: Spec,
    default: u64,
    min: u64,
    cell: OnceLock<u64>,
}

impl Number {
    const fn new(spec: Spec, default: u64, min: u64) -> Self {
        Number { spec, default, min, cell: OnceLock::new() }
    }

    fn parse(&self, v: &str) -> Result<u64, String> {
        match v.parse::<u64>() {
            Ok(n) if n >= self.min => Ok(n),
            _ => Err(format!("expected a whole number of at least {}", self.min)),
        }
    }

    fn get(&self) -> u64 {
        *self.cell.get_or_init(|| read(&self.spec, |v| self.parse(v)).unwrap_or(self.default))
    }
}

impl Switch for Number {
    fn spec(&self) -> &Spec {
        &self.spec
    }
    fn effective(&self, raw: Option<&str>) -> Result<String, String> {
        Ok(raw.map(|v| self.parse(v)).transpose()?.unwrap_or(self.default).to_string())
    }
}

/// Text, checked by `check`; unset by default.
struct Text {
    spec: Spec,
    check: fn(&str) -> Result<(), String>,
    cell: OnceLock<Option<String>>,
}

impl Text {
    const fn new(spec: Spec, check: fn(&str) -> Result<(), String>) -> Self {
        Text { spec, check, cell: OnceLock::new() }
    }

    fn get(&self) -> Option<&str> {
        let parse = |v: &str| (self.check)(v).map(|()| v.to_string());
        self.cell.get_or_init(|| read(&self.spec, parse)).as_deref()
    }
}

impl Switch for Text {
    fn spec(&self) -> &Spec {
        &self.spec
    }
    fn effective(&self, raw: Option<&str>) -> Result<String, String> {
        match raw {
            Some(v) => (self.check)(v).map(|()| v.to_string()),
            None => Ok(self.spec.default.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_take_0_and_1_only() {
        assert_eq!(Flag::parse("0"), Ok(false));
        assert_eq!(Flag::parse("1"), Ok(true));
        for bad in ["maybe", "true", "on", " 1", "2"] {
            assert_eq!(Flag::parse(bad), Err("expected 0 or 1".into()), "{bad}");
        }
        assert_eq!(PDL.effective(None), Ok("1".into()));
        assert_eq!(STEP_STATS.effective(None), Ok("0".into()));
        assert_eq!(PDL.effective(Some("0")), Ok("0".into()));
        assert!(PDL.effective(Some("maybe")).is_err());
    }

    #[test]
    fn numbers_keep_their_minimum() {
        assert_eq!(SSE_KEEP_ALIVE_SECS.effective(Some("3")), Ok("3".into()));
        assert!(SSE_KEEP_ALIVE_SECS.effective(Some("0")).is_err());
        assert!(SSE_KEEP_ALIVE_SECS.effective(Some("-1")).is_err());
        assert_eq!(RETRY_DELAY_MS.effective(Some("0")), Ok("0".into()));
        assert_eq!(RETRY_DELAY_MS.effective(None), Ok("500".into()));
    }

    #[test]
    fn log_filters_are_checked() {
        assert_eq!(
            LOG.effective(Some("inferno=debug,tower_http=info")),
            Ok("inferno=debug,tower_http=info".into())
        );
        assert!(LOG.effective(Some("inferno=loud")).is_err());
    }

    /// Every switch has a distinct name, a default among its values (flags) and a row in
    /// docs/operations.md's tables, which must list no other.
    #[test]
    fn docs_list_every_switch() {
        let doc = include_str!("../docs/operations.md");
        let rows: Vec<&str> =
            doc.lines().map(str::trim_start).filter(|l| l.starts_with("| `INFERNO_")).collect();
        let mut names: Vec<&str> = all().iter().map(|s| s.spec().name).collect();
        for s in all() {
            let spec = s.spec();
            assert!(s.effective(None).is_ok(), "{}: its default is refused", spec.name);
            let row = format!("| `{}` |", spec.name);
            assert!(
                rows.iter().any(|r| r.starts_with(&row)),
                "docs/operations.md has no row for {}",
                spec.name
            );
        }
        assert_eq!(rows.len(), names.len(), "docs/operations.md's switch tables: {rows:#?}");
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all().len(), "two switches share a name");
    }
}
