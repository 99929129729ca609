//! An EAGLE-3 head's weights and its forward pass over a step of the head's own paged KV pool.
//!
//! Row `t` takes the embedding of token `t + 1` and a feature `g_t`: on the first pass after a
//! target step `g = fc([h_low, h_mid, h_high])` (the target's taps at position `t`), on a chained
//! pass the head's own pre-norm output of the previous row. Then, as vLLM's `llama_eagle3.py`:
//! `input_layernorm(emb)` and `hidden_norm(g)` side by side (width 2H) feed q/k/v; attention
//! with RoPE at position `t`; the residual is `g` (or `hidden_norm(g)` with
//! `norm_before_residual`); post-attention norm, SwiGLU MLP, residual; the final norm and an LM
//! head over the draft vocabulary, whose ids map to the target's by `d2t` (an offset).
//!
//! The products run as the target's do (bf16 weights, f32 results, [`Linear::matmul_f32`]);
//! norms in f32. A head's bits never reach the output: its guesses only decide how many of the
//! target's own tokens a verify step keeps.

use std::path::Path;

use anyhow::Context;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use super::config::{Eagle3Config, Layout};
use crate::error::{ErrorKind, fail};
use crate::kernels::{
    PagedAttnConfig, QkvHeads, RotaryPairs, add_rms_norm, paged_attention, qkv_rope_paged,
    rms_norm, silu_mul_to,
};
use crate::models::batch::{KvPool, KvShape, StepInput};
use crate::models::head::Head;
use crate::models::linear::Linear;
use crate::models::random::normal;
use crate::models::rope;

/// What a head's rows take beside their tokens.
pub enum Feature<'a> {
    /// The target's taps at the rows' positions, f32 `[T, 3 · target_hidden]`.
    Taps(&'a Tensor),
    /// The head's own pre-norm output of the previous position, f32 `[T, H]`.
    Hidden(&'a Tensor),
}

/// A head's weights, shared tensors and RoPE tables.
pub struct Eagle3Head {
    pub cfg: Eagle3Config,
    /// `[target vocab, H]`: the head's own, or the target's shared.
    embed: Tensor,
    /// Over the concatenated taps, `norm_before_fc` only (f32).
    input_norm: Option<Tensor>,
    fc: Linear,
    input_layernorm: Tensor,
    hidden_norm: Tensor,
    /// `[heads·d + 2·kv_heads·d, 2H]`: q, k, v stacked.
    qkv: Linear,
    o: Linear,
    post_attention_layernorm: Tensor,
    /// `[2I, H]`: gate then up.
    gate_up: Linear,
    down: Linear,
    /// Final norm and LM head over the draft vocabulary.
    head: Head,
    /// Per draft id, its target id (u32 `[draft_vocab]` on the head's device, so that a chained
    /// pass takes its input token without reading the last one's on the host).
    d2t: Tensor,
    rope: (Tensor, Tensor),
    dtype: DType,
    device: Device,
}

/// The tensors of a head, by their names in its checkpoint or drawn at random.
trait Source {
    fn get(&self, shape: &[usize], name: &str) -> anyhow::Result<Tensor>;
    fn has(&self, name: &str) -> bool;
}

impl Eagle3Head {
    /// Loads the head in folder `dir` (`config.json` and safetensors) for `target` (whose
    /// embedding it shares when it has none) with RoPE tables that cover `context` positions.
    /// Refused in one line when it was made for another target (hidden size or vocabulary).
    pub fn load(
        dir: &Path,
        target: Target,
        context: usize,
        dtype: DType,
        device: &Device,
    ) -> anyhow::Result<Eagle3Head> {
        let cfg = read_config(dir)?;
        check_target(&cfg, target, device)?;
        let files = crate::models::checkpoint::safetensors_files(dir)?;
        // SAFETY: read-only maps of files the HF cache layout never rewrites in place.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, dtype, device)? };
        // SAFETY: as above; `d2t` is read in its own integer dtype.
        let raw = unsafe { MmapedSafetensors::multi(&files) }
            .map_err(|e| fail(ErrorKind::Integrity, format!("opening the EAGLE-3 head: {e}")))?;
        let prefix = if vb.contains_tensor("model.fc.weight") { "model." } else { "" };
        let src = Checkpoint { vb, prefix };
        check_fits(&cfg, src.has("embed_tokens.weight"), dtype, device)?;
        let d2t = match raw.load(&format!("{prefix}d2t"), &Device::Cpu) {
            Ok(t) => Some(t.to_dtype(DType::I64)?.to_vec1::<i64>()?),
            Err(_) => None,
        };
        let head = Eagle3Head::build(cfg, &src, d2t, target, context, dtype, device)
            .map_err(|e| fail(ErrorKind::Integrity, format!("loading the EAGLE-3 head: {e:#}")))?;
        Ok(head)
    }

    /// A head of config `cfg` (its folder's `config.json`) with random weights and a random
    /// `d2t` (benchmarks of a head's cost: `--dummy-weights`).
    pub fn random(
        dir: &Path,
        target: Target,
        context: usize,
        dtype: DType,
        device: &Device,
    ) -> anyhow::Result<Eagle3Head> {
        let cfg = read_config(dir)?;
        check_target(&cfg, target, device)?;
        let vocab = cfg.layer.vocab_size;
        // An increasing map from the draft vocabulary into the target's.
        let step = (vocab / cfg.draft_vocab).max(1);
        let d2t = (0..cfg.draft_vocab).map(|i| (i * step - i) as i64).collect();
        check_fits(&cfg, false, dtype, device)?;
        let src = Random { dtype, device: device.clone() };
        Eagle3Head::build(cfg, &src, Some(d2t), target, context, dtype, device)
    }

    fn build(
        cfg: Eagle3Config,
        src: &dyn Source,
        d2t: Option<Vec<i64>>,
        target: Target,
        context: usize,
        dtype: DType,
        device: &Device,
    ) -> anyhow::Result<Eagle3Head> {
        let l = &cfg.layer;
        let (h, i, th) = (l.hidden_size, l.intermediate_size, cfg.target_hidden);
        let (qd, kvd) = (l.num_heads * l.head_dim, l.num_kv_heads * l.head_dim);
        let layer = match cfg.layout {
            Layout::SpecForge if !src.has("midlayer.hidden_norm.weight") => "layers.0",
            Layout::SpecForge => "midlayer",
            Layout::Speculators => "layers.0",
        };
        let dense = |shape: (usize, usize), name: &str| -> anyhow::Result<Linear> {
            let name = format!("{name}.weight");
            Ok(Linear::Dense { weight: src.get(&[shape.0, shape.1], &name)?, bias: None })
        };
        let stacked = |parts: &[(usize, &str)], inp: usize| -> anyhow::Result<Linear> {
            let ws = parts
                .iter()
                .map(|(out, name)| src.get(&[*out, inp], &format!("{layer}.{name}.weight")))
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok(Linear::Dense { weight: Tensor::cat(&ws, 0)?, bias: None })
        };
        let norm = |n: usize, name: &str| -> anyhow::Result<Tensor> {
            Ok(src.get(&[n], name)?.to_dtype(DType::F32)?)
        };
        let embed = if src.has("embed_tokens.weight") {
            src.get(&[l.vocab_size, h], "embed_tokens.weight")?
        } else {
            let Some(e) = target.embed else {
                anyhow::bail!(
                    "the head has no embedding of its own, and this rank keeps only its rows of the model's"
                )
            };
            e.to_dtype(dtype)?
        };
        let d2t = match d2t {
            Some(d) => d2t_ids(&d, l.vocab_size)?,
            None if cfg.draft_vocab == l.vocab_size => (0..l.vocab_size as u32).collect(),
            None => anyhow::bail!("d2t is missing (the draft vocabulary is smaller)"),
        };
        let inv_freq = rope::inv_freq(&l.rope, l.rope_theta, l.head_dim, 0);
        let scale = l.rope.attention_scaling();
        let rope = rope::scaled_tables(&inv_freq, scale, 0, context, DType::F32, device)?;
        let input_norm =
            cfg.norm_before_fc.then(|| norm(3 * th, "input_norm.weight")).transpose()?;
        Ok(Eagle3Head {
            embed,
            input_norm,
            fc: dense((h, 3 * th), "fc")?,
            input_layernorm: norm(h, &format!("{layer}.input_layernorm.weight"))?,
            hidden_norm: norm(h, &format!("{layer}.hidden_norm.weight"))?,
            qkv: stacked(
                &[(qd, "self_attn.q_proj"), (kvd, "self_attn.k_proj"), (kvd, "self_attn.v_proj")],
                2 * h,
            )?,
            o: dense((h, qd), &format!("{layer}.self_attn.o_proj"))?,
            post_attention_layernorm: norm(h, &format!("{layer}.post_attention_layernorm.weight"))?,
            gate_up: stacked(&[(i, "mlp.gate_proj"), (i, "mlp.up_proj")], h)?,
            down: dense((h, i), &format!("{layer}.mlp.down_proj"))?,
            head: Head {
                norm: norm(h, "norm.weight")?,
                lm_head: dense((cfg.draft_vocab, h), "lm_head")?,
                eps: l.rms_norm_eps,
            },
            d2t: Tensor::new(d2t.as_slice(), device)?,
            rope,
            dtype,
            device: device.clone(),
            cfg,
        })
    }

    /// The head's KV layout: one layer, one group, full attention.
    pub fn kv_shape(&self) -> KvShape {
        let l = &self.cfg.layer;
        KvShape {
            kv_heads: l.num_kv_heads,
            head_dim: l.head_dim,
            dtype: self.dtype,
            group_windows: vec![None],
            layer_group: vec![0],
        }
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Positions its RoPE tables cover.
    pub fn max_positions(&self) -> usize {
        self.rope.0.dim(0).unwrap_or(0)
    }

    /// The target ids of draft ids `draft` (u32 `[n]`), on the device that holds them.
    pub fn target_ids(&self, draft: &Tensor) -> anyhow::Result<Tensor> {
        Ok(self.d2t.index_select(draft, 0)?)
    }

    /// Runs the step's rows (writing their keys and values into `kv`, one layer) with `g`, and
    /// returns the draft-vocabulary logits of `step.logit_rows` (f32 `[R, draft_vocab]`) and
    /// every row's pre-norm output (f32 `[T, H]`, the next chained pass's feature).
    pub fn forward(
        &self,
        step: &StepInput,
        kv: &KvPool,
        g: Feature,
    ) -> anyhow::Result<(Tensor, Tensor)> {
        let l = &self.cfg.layer;
        let (heads, kv_heads, d, eps) = (l.num_heads, l.num_kv_heads, l.head_dim, l.rms_norm_eps);
        let rows = step.tokens.dim(0)?;
        let g = match g {
            Feature::Hidden(h) => h.clone(),
            Feature::Taps(t) => {
                let t = match &self.input_norm {
                    Some(w) => rms_norm(t, w, eps)?,
                    None => t.clone(),
                };
                self.fc.matmul_f32(&t)?
            }
        };
        let emb = self.embed.index_select(&step.tokens, 0)?;
        let e = rms_norm(&emb, &self.input_layernorm, eps)?.to_dtype(self.dtype)?;
        let g_normed = rms_norm(&g, &self.hidden_norm, eps)?;
        let residual = if self.cfg.norm_before_residual { g_normed.clone() } else { g };
        let h = Tensor::cat(&[e, g_normed.to_dtype(self.dtype)?], 1)?;
        let (k_pool, v_pool) = &kv.layers[0];
        let q = qkv_rope_paged(
            &self.qkv.matmul_f32(&h)?,
            None,
            None,
            &self.rope.0,
            &self.rope.1,
            &step.positions,
            &step.slots[0],
            QkvHeads { heads, kv_heads, head_dim: d },
            RotaryPairs::HalfSplit,
            k_pool,
            v_pool,
            kv.scales(0),
            false,
        )?;
        let attn = PagedAttnConfig {
            block_size: kv.block_size,
            window: None,
            scale: 1.0 / (d as f32).sqrt(),
            release_first: false,
        };
        let o = paged_attention(
            &q,
            k_pool,
            v_pool,
            kv.scales(0),
            None,
            &step.cu_q,
            &step.q_pos,
            &step.tables[0],
            step.bounds,
            &attn,
        )?;
        let o = self.o.matmul_f32(&o.reshape((rows, heads * d))?)?;
        let normed = add_rms_norm(
            &residual,
            Some(&o),
            None,
            &self.post_attention_layernorm,
            eps,
            self.dtype,
            false,
        )?;
        let act = silu_mul_to(&self.gate_up.matmul_f32(&normed.h)?, self.dtype)?;
        let out = (normed.x + self.down.matmul_f32(&act)?)?;
        let logits = self.head.logits(&out.index_select(&step.logit_rows, 0)?)?;
        Ok((logits, out))
    }

    /// Bytes of its weights and tables (a shared embedding is the target's).
    pub fn bytes(&self) -> u64 {
        let mut m = crate::models::memory::Measured::default();
        for t in [&self.input_layernorm, &self.hidden_norm, &self.post_attention_layernorm] {
            m.tensor(t);
        }
        for p in [&self.fc, &self.qkv, &self.o, &self.gate_up, &self.down, &self.head.lm_head] {
            m.linear(p);
        }
        m.tensor(&self.rope.0);
        m.tensor(&self.rope.1);
        m.total
    }
}

fn read_config(dir: &Path) -> anyhow::Result<Eagle3Config> {
    let path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Eagle3Config::from_json(&text)
}

/// The model a head drafts for: its vocabulary and hidden size, and its whole embedding
/// `[vocab, hidden]` where the model keeps one (a head without an embedding of its own reads it;
/// a tensor-parallel rank may keep only its rows).
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub vocab: usize,
    pub hidden: usize,
    pub embed: Option<&'a Tensor>,
}

impl<'a> Target<'a> {
    pub fn of(model: &'a dyn crate::models::batch::BatchModel) -> Target<'a> {
        Target { vocab: model.vocab_size(), hidden: model.hidden_size(), embed: model.embedding() }
    }
}

/// Whether the head in `dir` reads the target's embedding (it has none of its own; a random
/// head never has): a tensor-parallel target then keeps its whole table on rank 0, beside that
/// rank's rows.
pub fn reads_target_embedding(dir: &Path, dummy: bool) -> bool {
    if dummy {
        return true;
    }
    let Ok(files) = crate::models::checkpoint::safetensors_files(dir) else { return true };
    !files.iter().any(|f| {
        crate::inspect::safetensors::read_header(f).is_ok_and(|h| {
            h.tensors.contains_key("embed_tokens.weight")
                || h.tensors.contains_key("model.embed_tokens.weight")
        })
    })
}

/// The head must read the target's hidden states, speak its vocabulary, and have heads the
/// device's attention takes.
fn check_target(cfg: &Eagle3Config, target: Target, device: &Device) -> anyhow::Result<()> {
    let d = cfg.layer.head_dim;
    if device.is_cuda() && ![64, 128].contains(&d) {
        return Err(fail(
            ErrorKind::InvalidInput,
            format!("the EAGLE-3 head's head_dim is {d}: a GPU's attention takes 64 or 128"),
        ));
    }
    let (vocab, hidden) = (target.vocab, target.hidden);
    let refuse = |what: String| {
        Err(fail(
            ErrorKind::InvalidInput,
            format!("the EAGLE-3 head was made for another model: {what}"),
        ))
    };
    if cfg.target_hidden != hidden {
        return refuse(format!(
            "it reads hidden states of {} values, the model's have {hidden}",
            cfg.target_hidden
        ));
    }
    if cfg.layer.vocab_size != vocab {
        return refuse(format!(
            "its vocabulary has {} ids, the model's {vocab}",
            cfg.layer.vocab_size
        ));
    }
    Ok(())
}

/// Memory kept free beside the head for the steps (as the engine keeps beside its pool).
const HEAD_RESERVE: u64 = 512 << 20;

/// Refuses a head whose weights would not fit in what the device has free (exit code 7).
fn check_fits(
    cfg: &Eagle3Config,
    own_embed: bool,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<()> {
    let bytes = cfg.weight_bytes(dtype, own_embed);
    let Some(free) = crate::gpu::available(device) else { return Ok(()) };
    if bytes.saturating_add(HEAD_RESERVE) <= free {
        return Ok(());
    }
    let iec = crate::util::human_bytes_iec;
    Err(fail(
        ErrorKind::Memory,
        format!(
            "the EAGLE-3 head needs {} for its weights, but {} is free beside the model (keeping {} for the steps): lower --context or drop --draft",
            iec(bytes),
            iec(free),
            iec(HEAD_RESERVE)
        ),
    ))
}

/// `d2t`'s offsets as target ids, each checked to fall inside the target's vocabulary.
fn d2t_ids(d2t: &[i64], vocab: usize) -> anyhow::Result<Vec<u32>> {
    d2t.iter()
        .enumerate()
        .map(|(i, &off)| {
            let t = i as i64 + off;
            anyhow::ensure!((0..vocab as i64).contains(&t), "d2t maps draft id {i} to {t}");
            Ok(t as u32)
        })
        .collect()
}

struct Checkpoint<'a> {
    vb: VarBuilder<'a>,
    prefix: &'static str,
}

impl Source for Checkpoint<'_> {
    fn get(&self, shape: &[usize], name: &str) -> anyhow::Result<Tensor> {
        Ok(self.vb.get(shape, &format!("{}{name}", self.prefix))?)
    }

    fn has(&self, name: &str) -> bool {
        self.vb.contains_tensor(&format!("{}{name}", self.prefix))
    }
}

/// Random weights: norms of ones, products of small normal values (as the models' dummies).
struct Random {
    dtype: DType,
    device: Device,
}

impl Source for Random {
    fn get(&self, shape: &[usize], name: &str) -> anyhow::Result<Tensor> {
        Ok(match shape {
            [n] if name.contains("norm") => Tensor::ones(*n, DType::F32, &self.device)?,
            _ => normal(shape, 0.02, self.dtype, &self.device)?,
        })
    }

    fn has(&self, _name: &str) -> bool {
        false
    }
}
