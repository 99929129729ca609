//! The fuzz runner and the mutations the targets share.
//!
//! proptest on stable Rust: each target is a strategy of structured inputs (a list of edits to
//! a valid seed file, or a generated document) and a check that must hold for all of them (no
//! panic, an answer within a time bound). CI runs a fixed number of cases from a seed derived
//! from the target's name, so a failure replays; `INFERNO_FUZZ_SECONDS=N` (scripts/fuzz.sh)
//! runs fresh random cases for N seconds per target instead. proptest shrinks a failing input
//! to a small one, which becomes a regression test (tests/fuzz/regressions.rs).

use std::fmt::Debug;
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use serde_json::Value;

/// Runs `check` on `cases` inputs drawn from `strategy` (or for `INFERNO_FUZZ_SECONDS`); a
/// case fails when `check` fails, panics, or takes longer than `slow`.
pub fn fuzz<S: Strategy>(
    name: &str,
    cases: u32,
    slow: Duration,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: Debug,
{
    // A stack overflow or an abort ends the process before proptest can report the input:
    // INFERNO_FUZZ_TRACE=1 prints each input first, so the last one printed is the culprit.
    let trace = std::env::var_os("INFERNO_FUZZ_TRACE").is_some();
    let timed = |v: S::Value| {
        if trace {
            eprintln!("fuzz {name} input: {v:?}");
        }
        let t0 = Instant::now();
        check(v)?;
        let took = t0.elapsed();
        if took > slow {
            return Err(TestCaseError::fail(format!("took {took:?} (more than {slow:?})")));
        }
        Ok(())
    };
    let seconds = std::env::var("INFERNO_FUZZ_SECONDS").ok().and_then(|s| s.parse::<u64>().ok());
    let t0 = Instant::now();
    let Some(seconds) = seconds else {
        // INFERNO_FUZZ_SEED replays a failure a longer run reported (its seed, in hex).
        let seed = std::env::var("INFERNO_FUZZ_SEED").ok().and_then(|h| parse_seed(&h));
        run(name, cases, seed.unwrap_or_else(|| name_seed(name)), &strategy, &timed);
        eprintln!("fuzz {name}: {cases} cases in {:.1?}", t0.elapsed());
        return;
    };
    let mut rounds = 0u64;
    while t0.elapsed() < Duration::from_secs(seconds) {
        run(name, cases, rand::random(), &strategy, &timed);
        rounds += 1;
    }
    eprintln!("fuzz {name}: {} cases in {:.1?}", rounds * u64::from(cases), t0.elapsed());
}

fn run<S: Strategy>(
    name: &str,
    cases: u32,
    seed: [u8; 32],
    strategy: &S,
    check: &impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: Debug,
{
    // No failure files in the tree: a failure is replayed by its seed, then kept as a
    // regression test by hand.
    let config =
        Config { cases, failure_persistence: None, max_shrink_iters: 512, ..Config::default() };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
    let mut runner = TestRunner::new_with_rng(config, rng);
    if let Err(e) = runner.run(strategy, check) {
        panic!("fuzz {name} (seed {}) found: {e}", hex(&seed));
    }
}

/// A fixed seed per target: CI runs the same cases every time.
fn name_seed(name: &str) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(name.as_bytes()).into()
}

fn parse_seed(hex: &str) -> Option<[u8; 32]> {
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| hex.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
        .collect();
    bytes?.try_into().ok()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// ---------------------------------------------------------------- byte edits

/// One edit of a byte string, positions relative to its length at the time.
#[derive(Debug, Clone)]
pub enum Edit {
    Flip(Index, u8),
    Set(Index, u8),
    /// A little-endian integer of 1, 2, 4 or 8 bytes written over the bytes at the index:
    /// lengths, counts, offsets and types in binary headers.
    Int(Index, u8, u64),
    Delete(Index, u16),
    Insert(Index, Vec<u8>),
    /// Bytes copied from one place to another (a repeated field, a moved length).
    Copy(Index, Index, u16),
    Truncate(Index),
}

/// Integers that break length and offset arithmetic.
pub fn interesting_int() -> impl Strategy<Value = u64> {
    prop_oneof![
        prop::sample::select(vec![
            0,
            1,
            2,
            7,
            8,
            0x7f,
            0x80,
            0xff,
            0x100,
            0x7fff,
            0xffff,
            0x7fff_ffff,
            0x8000_0000,
            0xffff_ffff,
            1 << 32,
            1 << 40,
            i64::MAX as u64,
            u64::MAX,
            u64::MAX - 1,
        ]),
        any::<u64>(),
        0u64..4096,
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Edit::Flip(i, b)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        4 => (any::<Index>(), prop::sample::select(vec![1u8, 2, 4, 8]), interesting_int())
            .prop_map(|(i, w, v)| Edit::Int(i, w, v)),
        1 => (any::<Index>(), 1u16..64).prop_map(|(i, n)| Edit::Delete(i, n)),
        1 => (any::<Index>(), vec(any::<u8>(), 1..16)).prop_map(|(i, b)| Edit::Insert(i, b)),
        1 => (any::<Index>(), any::<Index>(), 1u16..64).prop_map(|(a, b, n)| Edit::Copy(a, b, n)),
        1 => any::<Index>().prop_map(Edit::Truncate),
    ]
}

/// One to `max` edits.
pub fn edits(max: usize) -> impl Strategy<Value = Vec<Edit>> {
    vec(edit(), 1..=max)
}

/// `seed` with `edits` applied in order.
pub fn apply(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for e in edits {
        if b.is_empty() {
            break;
        }
        let n = b.len();
        match e {
            Edit::Flip(i, bit) => b[i.index(n)] ^= 1 << bit,
            Edit::Set(i, v) => b[i.index(n)] = *v,
            Edit::Int(i, w, v) => {
                let at = i.index(n);
                let w = usize::from(*w).min(n - at);
                b[at..at + w].copy_from_slice(&v.to_le_bytes()[..w]);
            }
            Edit::Delete(i, len) => {
                let at = i.index(n);
                b.drain(at..(at + usize::from(*len)).min(n));
            }
            Edit::Insert(i, bytes) => {
                let at = i.index(n + 1);
                b.splice(at..at, bytes.iter().copied());
            }
            Edit::Copy(from, to, len) => {
                let (from, to) = (from.index(n), to.index(n));
                let len = usize::from(*len).min(n - from).min(n - to);
                b.copy_within(from..from + len, to);
            }
            Edit::Truncate(i) => b.truncate(i.index(n)),
        }
    }
    b
}

// ---------------------------------------------------------------- JSON edits

/// Scalars and small containers that JSON parsers and field readers trip on.
pub fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        interesting_int().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        prop::sample::select(vec![-1i64, -2, i64::MIN]).prop_map(Value::from),
        prop::sample::select(vec![0.5f64, -0.0, 1e30, -1e30, 1e-30, 2.5, 1e300])
            .prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
        prop::sample::select(vec![
            "",
            "\u{0}",
            "<|im_start|>",
            "<|end|>",
            "{{ x }}",
            "%}",
            "\u{feff}",
            "auto",
            "none",
            "required",
            "json_schema",
            "function",
            "text",
            "user",
            "assistant",
            "system",
            "tool",
            "developer",
            "high",
        ])
        .prop_map(Value::from),
        (1usize..20_000).prop_map(|n| Value::from("a".repeat(n))),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            vec(("[a-z_]{1,8}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// One edit of a JSON document, at a node picked among all of its nodes.
#[derive(Debug, Clone)]
pub enum JsonEdit {
    Replace(Index, Value),
    Remove(Index),
    /// The node wrapped in an array `depth` deep.
    Wrap(Index, u8),
    /// The node replaced by a copy of another.
    CopyFrom(Index, Index),
    /// A new key in an object (or element in an array).
    Add(Index, String, Value),
}

/// Keys the endpoints and configs read, so added keys land on real fields.
const KEYS: &[&str] = &[
    "model",
    "messages",
    "content",
    "role",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "response_format",
    "json_schema",
    "schema",
    "stop",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "logprobs",
    "top_logprobs",
    "n",
    "input",
    "instructions",
    "previous_response_id",
    "reasoning",
    "reasoning_effort",
    "text",
    "format",
    "type",
    "name",
    "parameters",
    "tool_calls",
    "function",
    "arguments",
    "system",
    "thinking",
    "prompt",
    "echo",
    "suffix",
    "store",
    "quantization_config",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "head_dim",
    "rope_scaling",
    "rope_theta",
    "max_position_embeddings",
    "torch_dtype",
    "tie_word_embeddings",
    "weight_map",
];

fn json_edit() -> impl Strategy<Value = JsonEdit> {
    let key = prop_oneof![prop::sample::select(KEYS).prop_map(str::to_string), "[a-z]{1,6}"];
    prop_oneof![
        4 => (any::<Index>(), json_value()).prop_map(|(i, v)| JsonEdit::Replace(i, v)),
        2 => any::<Index>().prop_map(JsonEdit::Remove),
        1 => (any::<Index>(), 1u8..200).prop_map(|(i, d)| JsonEdit::Wrap(i, d)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| JsonEdit::CopyFrom(a, b)),
        2 => (any::<Index>(), key, json_value()).prop_map(|(i, k, v)| JsonEdit::Add(i, k, v)),
    ]
}

pub fn json_edits(max: usize) -> impl Strategy<Value = Vec<JsonEdit>> {
    vec(json_edit(), 1..=max)
}

/// `seed` with `edits` applied in order.
pub fn apply_json(seed: &Value, edits: &[JsonEdit]) -> Value {
    let mut v = seed.clone();
    for e in edits {
        let paths = pointers(&v);
        let at = |i: &Index| paths[i.index(paths.len())].clone();
        match e {
            JsonEdit::Replace(i, new) => set(&mut v, &at(i), new.clone()),
            JsonEdit::Remove(i) => remove(&mut v, &at(i)),
            JsonEdit::Wrap(i, depth) => {
                let p = at(i);
                let mut node = v.pointer(&p).cloned().unwrap_or(Value::Null);
                for _ in 0..*depth {
                    node = Value::Array(vec![node]);
                }
                set(&mut v, &p, node);
            }
            JsonEdit::CopyFrom(i, from) => {
                let node = v.pointer(&at(from)).cloned().unwrap_or(Value::Null);
                set(&mut v, &at(i), node);
            }
            JsonEdit::Add(i, key, new) => match v.pointer_mut(&at(i)) {
                Some(Value::Object(m)) => {
                    m.insert(key.clone(), new.clone());
                }
                Some(Value::Array(a)) => a.push(new.clone()),
                _ => {}
            },
        }
    }
    v
}

/// JSON pointers of every node, the root first.
fn pointers(v: &Value) -> Vec<String> {
    fn walk(v: &Value, at: String, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, c) in m {
                    walk(c, format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), out);
                }
            }
            Value::Array(a) => {
                for (i, c) in a.iter().enumerate() {
                    walk(c, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
        out.push(at);
    }
    let mut out = Vec::new();
    walk(v, String::new(), &mut out);
    out.reverse();
    out
}

fn set(root: &mut Value, pointer: &str, new: Value) {
    if let Some(slot) = root.pointer_mut(pointer) {
        *slot = new;
    }
}

fn remove(root: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else { return };
    match root.pointer_mut(parent) {
        Some(Value::Object(m)) => {
            m.shift_remove(&last.replace("~1", "/").replace("~0", "~"));
        }
        Some(Value::Array(a)) => {
            if let Ok(i) = last.parse::<usize>()
                && i < a.len()
            {
                a.remove(i);
            }
        }
        _ => {}
    }
}
