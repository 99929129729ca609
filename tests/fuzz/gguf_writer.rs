//! GGUF files generated from structure: typed metadata (the keys the loaders and tokenizer
//! builders read, with values of the right type most of the time), tensor infos with ggml types
//! and dimensions, offsets laid out as a writer would (or anywhere), and the data section.

use inferno::inspect::gguf::type_layout;
use proptest::collection::vec;
use proptest::prelude::*;

/// A metadata value as written: GGUF type numbers 0..=12 (and unknown ones).
#[derive(Debug, Clone)]
pub enum Val {
    /// A fixed-size scalar: its type and little-endian bytes.
    Scalar(u32, Vec<u8>),
    Str(Vec<u8>),
    Array(u32, Vec<Val>),
}

#[derive(Debug, Clone)]
pub struct TensorDoc {
    name: String,
    dims: Vec<u64>,
    ty: u32,
    /// Where the writer puts it: `None` for the next aligned place after the previous tensor.
    offset: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct GgufDoc {
    version: u32,
    kvs: Vec<(String, Val)>,
    tensors: Vec<TensorDoc>,
}

const ARCHS: &[&str] = &["llama", "gpt-oss", "qwen3", "mistral", ""];
const KEYS: &[&str] = &[
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.layer_norm_rms_epsilon",
    "rope.dimension_count",
    "rope.freq_base",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scaling.original_context_length",
    "expert_count",
    "expert_used_count",
    "attention.sliding_window",
    "vocab_size",
];
/// Keys outside an architecture's namespace.
const GENERAL_KEYS: &[&str] = &["general.alignment", "general.file_type", "general.name"];
const TENSORS: &[&str] = &[
    "token_embd.weight",
    "output_norm.weight",
    "output.weight",
    "rope_freqs.weight",
    "blk.0.attn_q.weight",
    "blk.0.attn_k.weight",
    "blk.0.attn_v.weight",
    "blk.0.attn_output.weight",
    "blk.0.attn_norm.weight",
    "blk.0.ffn_norm.weight",
    "blk.0.ffn_gate.weight",
    "blk.0.ffn_up.weight",
    "blk.0.ffn_down.weight",
    "blk.0.ffn_gate_exps.weight",
    "blk.0.attn_sinks.weight",
];
/// F32, F16, Q4_0, Q8_0, Q4_K, Q6_K, BF16, MXFP4, and types ggml does not have.
const TYPES: &[u32] = &[0, 1, 2, 8, 12, 14, 30, 39, 4, 99, u32::MAX];

fn scalar() -> impl Strategy<Value = Val> {
    prop_oneof![
        (0u32..=7, any::<u64>()).prop_map(|(t, v)| {
            let n = [1, 1, 2, 2, 4, 4, 4, 1][t as usize];
            Val::Scalar(t, v.to_le_bytes()[..n].to_vec())
        }),
        (10u32..=12, any::<u64>()).prop_map(|(t, v)| Val::Scalar(t, v.to_le_bytes().to_vec())),
        (prop::sample::select(vec![4u32, 10]), super::run::interesting_int()).prop_map(|(t, v)| {
            Val::Scalar(t, v.to_le_bytes()[..if t == 4 { 4 } else { 8 }].to_vec())
        }),
        (13u32..40, vec(any::<u8>(), 0..8)).prop_map(|(t, b)| Val::Scalar(t, b)),
    ]
}

fn string() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "\\PC{0,8}".prop_map(String::into_bytes),
        prop::sample::select(vec![
            "<0x41>",
            "<s>",
            "</s>",
            "<unk>",
            "▁a",
            "Ġb",
            "a b",
            "Ġ Ġ",
            "<|im_start|>",
            "{{ messages }}"
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        vec(any::<u8>(), 0..8),
    ]
}

fn value() -> impl Strategy<Value = Val> {
    let leaf = prop_oneof![scalar(), string().prop_map(Val::Str)];
    leaf.prop_recursive(2, 64, 32, |inner| {
        prop_oneof![
            (0u32..=12, vec(inner, 0..32)).prop_map(|(t, items)| Val::Array(t, items)),
            vec(string(), 0..64).prop_map(|s| Val::Array(8, s.into_iter().map(Val::Str).collect())),
            vec(any::<i32>(), 0..64).prop_map(|v| Val::Array(
                5,
                v.into_iter().map(|x| Val::Scalar(5, x.to_le_bytes().to_vec())).collect()
            )),
        ]
    })
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        (prop::sample::select(ARCHS), prop::sample::select(KEYS))
            .prop_map(|(a, k)| format!("{a}.{k}")),
        prop::sample::select(super::tokenizer::KEYS).prop_map(str::to_string),
        prop::sample::select(GENERAL_KEYS).prop_map(str::to_string),
        "[a-z.]{0,12}",
    ]
}

fn tensor() -> impl Strategy<Value = TensorDoc> {
    let dim = prop_oneof![4 => 1u64..48, 1 => Just(0u64), 1 => super::run::interesting_int()];
    (
        prop_oneof![prop::sample::select(TENSORS).prop_map(str::to_string), "[a-z.]{0,8}"],
        vec(dim, 0..=5),
        prop::sample::select(TYPES),
        prop::option::weighted(0.1, super::run::interesting_int()),
    )
        .prop_map(|(name, dims, ty, offset)| TensorDoc { name, dims, ty, offset })
}

pub fn gguf_doc() -> impl Strategy<Value = GgufDoc> {
    let arch = prop::sample::select(ARCHS)
        .prop_map(|a| ("general.architecture".to_string(), Val::Str(a.as_bytes().to_vec())));
    (
        prop_oneof![8 => Just(3u32), 1 => 1u32..=2, 1 => any::<u32>()],
        arch,
        vec((key(), value()), 0..12),
        vec(tensor(), 0..8),
    )
        .prop_map(|(version, arch, mut kvs, tensors)| {
            kvs.insert(0, arch);
            GgufDoc { version, kvs, tensors }
        })
}

impl GgufDoc {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = W { out: b"GGUF".to_vec(), version: self.version };
        w.u32(self.version);
        w.len(self.tensors.len() as u64);
        w.len(self.kvs.len() as u64);
        for (k, v) in &self.kvs {
            w.str(k.as_bytes());
            w.u32(type_of(v));
            w.value(v);
        }
        let mut next = 0u64;
        for t in &self.tensors {
            w.str(t.name.as_bytes());
            w.u32(t.dims.len() as u32);
            for &d in &t.dims {
                w.len(d);
            }
            w.u32(t.ty);
            let offset = t.offset.unwrap_or(next);
            w.out.extend_from_slice(&offset.to_le_bytes());
            // Saturating all the way: a hostile offset near u64::MAX must not overflow the
            // rounding (a panic under overflow checks, a wrap to 0 without them).
            next = offset
                .saturating_add(data_bytes(t))
                .checked_next_multiple_of(32)
                .unwrap_or(u64::MAX);
        }
        let start = w.out.len().next_multiple_of(32);
        // The data section, capped: a tensor said to be huge finds the file too short.
        w.out.resize(start + next.min(4 << 20) as usize, 0x3c);
        w.out
    }
}

fn data_bytes(t: &TensorDoc) -> u64 {
    let Some((block, size)) = type_layout(t.ty) else { return 64 };
    let elems = t.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).unwrap_or(u64::MAX);
    elems.div_ceil(block).saturating_mul(size)
}

fn type_of(v: &Val) -> u32 {
    match v {
        Val::Scalar(t, _) => *t,
        Val::Str(_) => 8,
        Val::Array(..) => 9,
    }
}

struct W {
    out: Vec<u8>,
    version: u32,
}

impl W {
    fn u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    /// Lengths and counts: u32 in version 1, u64 after.
    fn len(&mut self, v: u64) {
        if self.version == 1 {
            self.u32(v as u32);
        } else {
            self.out.extend_from_slice(&v.to_le_bytes());
        }
    }

    fn str(&mut self, s: &[u8]) {
        self.len(s.len() as u64);
        self.out.extend_from_slice(s);
    }

    fn value(&mut self, v: &Val) {
        match v {
            Val::Scalar(_, b) => self.out.extend_from_slice(b),
            Val::Str(s) => self.str(s),
            Val::Array(t, items) => {
                self.u32(*t);
                self.len(items.len() as u64);
                // Items of another type than declared are written as they are: a lie the
                // reader must catch.
                for i in items {
                    self.value(i);
                }
            }
        }
    }
}
