//! Loading Llama weights onto a device: HF safetensors (single file or sharded through
//! `model.safetensors.index.json`, memory-mapped and copied tensor by tensor straight to the
//! device: no full host copy) or a GGUF file (quantized tensors stay quantized).

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use candle_core::quantized::{QMatMul, gguf_file};
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use super::config::{LlamaConfig, Variant};
use super::model::{Layer, Llama, RopeStyle, Weights};
use crate::error::{ErrorKind, fail};
use crate::models::embedding::Embedding;
use crate::models::head::Head;
use crate::models::linear::Linear;
use crate::quant::{CtConfig, QuantLinear};

/// The compute dtype: the one asked for, else the checkpoint's (bf16 when it says nothing).
pub fn choose_dtype(requested: Option<DType>, cfg: &LlamaConfig) -> DType {
    requested.unwrap_or(match cfg.checkpoint_dtype.as_deref() {
        Some("float32") => DType::F32,
        Some("float16") => DType::F16,
        _ => DType::BF16,
    })
}

/// Loads an HF-format Llama checkpoint folder.
pub fn load_safetensors(
    dir: &Path,
    dtype: Option<DType>,
    context: usize,
    device: &Device,
) -> anyhow::Result<Llama> {
    load_checkpoint(dir, read_config(dir, Variant::LLAMA)?, dtype, context, device)
}

/// The config of the checkpoint in `dir`, as `variant`'s family reads it.
pub fn read_config(dir: &Path, variant: Variant) -> anyhow::Result<LlamaConfig> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path)
        .with_context(|| format!("reading {}", cfg_path.display()))?;
    (variant.read_hf)(&text)
}

/// Loads the checkpoint in `dir` whose `config.json` read as `cfg` (by its family's reader).
pub fn load_checkpoint(
    dir: &Path,
    cfg: LlamaConfig,
    dtype: Option<DType>,
    context: usize,
    device: &Device,
) -> anyhow::Result<Llama> {
    let dtype = choose_dtype(dtype, &cfg);
    let files = crate::models::checkpoint::safetensors_files(dir)?;
    for f in &files {
        crate::inspect::safetensors::read_header(f)
            .map_err(|e| fail(ErrorKind::Integrity, format!("{}: {e}", f.display())))?;
    }
    // SAFETY: the files are memory-mapped read-only; a concurrent writer could change what we
    // read, which the HF cache layout (write to .incomplete, then rename) rules out.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, dtype, device)? };
    let ct = match &cfg.quant {
        Some(q) => {
            // SAFETY: as above; the quantized tensors are read raw (candle has no int8 dtype).
            let st = unsafe { MmapedSafetensors::multi(&files) }
                .map_err(|e| fail(ErrorKind::Integrity, format!("opening the weights: {e}")))?;
            Some((q.clone(), st))
        }
        None => None,
    };
    let weights = checkpoint_weights(&cfg, &vb, ct.as_ref().map(|(q, st)| (q, st)))
        .map_err(|e| fail(ErrorKind::Integrity, format!("loading weights: {e:#}")))?;
    Llama::new(cfg, weights, RopeStyle::HalfSplit, context, dtype, device)
}

/// The weights of a safetensors checkpoint; `ct`: its compressed-tensors quantization and the
/// files again, for the quantized tensors candle cannot read as typed tensors.
fn checkpoint_weights(
    cfg: &LlamaConfig,
    vb: &VarBuilder,
    ct: Option<(&CtConfig, &MmapedSafetensors)>,
) -> anyhow::Result<Weights> {
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let (qd, kvd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
    let linear = |vb: VarBuilder, out: usize, inp: usize, bias: bool| -> anyhow::Result<Linear> {
        let bias = if bias { Some(vb.get(out, "bias")?) } else { None };
        let scheme = ct.and_then(|(q, st)| q.scheme_for(&vb.prefix()).map(|s| (s, st)));
        if let Some((scheme, st)) = scheme {
            let q = QuantLinear::load(st, &vb.prefix(), scheme, (out, inp), vb.device())?;
            return Ok(Linear::Ct { weight: Arc::new(q), bias });
        }
        Ok(Linear::Dense { weight: vb.get((out, inp), "weight")?, bias })
    };
    let m = vb.pp("model");
    let embed = m.get((cfg.vocab_size, h), "embed_tokens.weight")?;
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for n in 0..cfg.num_layers {
        let l = m.pp(format!("layers.{n}"));
        let a = l.pp("self_attn");
        let p = l.pp("mlp");
        layers.push(
            Layer {
                attn_norm: l.get(h, "input_layernorm.weight")?.to_dtype(DType::F32)?,
                q: linear(a.pp("q_proj"), qd, h, cfg.attention_bias)?,
                k: linear(a.pp("k_proj"), kvd, h, cfg.attention_bias)?,
                qk_norm: match cfg.variant.qk_norm {
                    true => Some((
                        a.get(cfg.head_dim, "q_norm.weight")?.to_dtype(DType::F32)?,
                        a.get(cfg.head_dim, "k_norm.weight")?.to_dtype(DType::F32)?,
                    )),
                    false => None,
                },
                v: linear(a.pp("v_proj"), kvd, h, cfg.attention_bias)?,
                o: linear(a.pp("o_proj"), h, qd, cfg.attention_bias)?,
                mlp_norm: l.get(h, "post_attention_layernorm.weight")?.to_dtype(DType::F32)?,
                gate: linear(p.pp("gate_proj"), i, h, cfg.mlp_bias)?,
                up: linear(p.pp("up_proj"), i, h, cfg.mlp_bias)?,
                down: linear(p.pp("down_proj"), h, i, cfg.mlp_bias)?,
                fused: Default::default(),
            }
            .fuse()?,
        );
    }
    let norm = m.get(h, "norm.weight")?.to_dtype(DType::F32)?;
    let lm_head = if cfg.tie_word_embeddings && !vb.contains_tensor("lm_head.weight") {
        Linear::Dense { weight: embed.clone(), bias: None }
    } else {
        linear(vb.pp("lm_head"), cfg.vocab_size, h, false)?
    };
    Ok(Weights {
        embed: Embedding::whole(embed),
        layers,
        head: Head { norm, lm_head, eps: cfg.rms_norm_eps },
    })
}

/// An opened GGUF file: metadata and tensor directory (the data is read on demand).
pub struct GgufFile {
    pub path: PathBuf,
    pub content: gguf_file::Content,
    file: File,
}

impl GgufFile {
    pub fn open(path: &Path) -> anyhow::Result<GgufFile> {
        let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let content = gguf_file::Content::read(&mut file).map_err(|e| {
            fail(
                ErrorKind::Integrity,
                format!("{} is not a readable GGUF file: {e}", path.display()),
            )
        })?;
        Ok(GgufFile { path: path.to_path_buf(), content, file })
    }

    pub fn qtensor(
        &mut self,
        name: &str,
        device: &Device,
    ) -> anyhow::Result<candle_core::quantized::QTensor> {
        self.content.tensor(&mut self.file, name, device).map_err(|e| {
            fail(ErrorKind::Integrity, format!("{}: tensor {name}: {e}", self.path.display()))
        })
    }

    /// A plain-float tensor (F32, F16, BF16) as a dense tensor of `dtype` on `device`: its bytes
    /// as they are in the file, converted only when the dtypes differ.
    pub fn dense(&mut self, name: &str, dtype: DType, device: &Device) -> anyhow::Result<Tensor> {
        let q = self.qtensor(name, &Device::Cpu)?;
        let Some(stored) = plain_float(q.dtype()) else {
            anyhow::bail!("{}: tensor {name} is not a plain float tensor", self.path.display())
        };
        let bytes = q.data()?;
        let t = Tensor::from_raw_buffer(&bytes, stored, q.shape().dims(), device)?;
        Ok(t.to_dtype(dtype)?)
    }

    pub fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// A Q8_0, Q4_K or Q6_K matmul weight as our own [`QuantLinear`] on `device` (see
    /// [`own_blocks_only`]).
    fn block_linear(&mut self, name: &str, device: &Device) -> anyhow::Result<Linear> {
        use crate::quant::WeightFormat;
        use candle_core::quantized::GgmlDType as G;
        let t = self.qtensor(name, &Device::Cpu)?;
        let bad = |e: &dyn std::fmt::Display| {
            fail(ErrorKind::Integrity, format!("{}: tensor {name}: {e}", self.path.display()))
        };
        let (out, inp) = t.shape().dims2().map_err(|e| bad(&e))?;
        let bytes = t.data().map_err(|e| bad(&e))?;
        let w = match t.dtype() {
            G::Q8_0 => QuantLinear::from_q8_0(&bytes, (out, inp), device),
            G::Q4K => QuantLinear::from_k_quant(WeightFormat::Q4K, &bytes, (out, inp), device),
            G::Q6K => QuantLinear::from_k_quant(WeightFormat::Q6K, &bytes, (out, inp), device),
            other => Err(anyhow::anyhow!("{other:?} is not a format of our GEMVs")),
        }
        .map_err(|e| bad(&e))?;
        Ok(Linear::Ct { weight: Arc::new(w), bias: None })
    }

    /// The config of a Llama GGUF.
    pub fn config(&self) -> anyhow::Result<LlamaConfig> {
        self.config_as(Variant::LLAMA)
    }

    /// The config of a GGUF of `variant`'s architecture.
    pub fn config_as(&self, variant: Variant) -> anyhow::Result<LlamaConfig> {
        let embd = self
            .content
            .tensor_infos
            .get("token_embd.weight")
            .ok_or_else(|| fail(ErrorKind::Integrity, "GGUF file has no token_embd.weight"))?;
        let vocab = *embd.shape.dims().first().ok_or_else(|| {
            fail(ErrorKind::Integrity, "GGUF file's token_embd.weight has no dimensions")
        })?;
        LlamaConfig::from_gguf(&self.content.metadata, variant, vocab, self.rope_freqs()?)
    }

    /// llama.cpp's per-pair RoPE frequency factors (Llama 3.x's llama3 scaling), if present.
    fn rope_freqs(&self) -> anyhow::Result<Option<Vec<f32>>> {
        const NAME: &str = "rope_freqs.weight";
        if !self.has(NAME) {
            return Ok(None);
        }
        // `&File` reads and seeks too, so a shared borrow is enough for one small tensor.
        let mut file = &self.file;
        let cpu = Device::Cpu;
        let factors = self
            .content
            .tensor(&mut file, NAME, &cpu)
            .and_then(|t| t.dequantize(&cpu)?.flatten_all()?.to_vec1::<f32>())
            .map_err(|e| {
                fail(ErrorKind::Integrity, format!("{}: tensor {NAME}: {e}", self.path.display()))
            })?;
        Ok(Some(factors))
    }
}

/// Loads a llama-architecture GGUF. Block-quantized matmul weights (Q8_0, Q4_K, …) stay
/// quantized (candle's GGUF kernels), embeddings and norms are dequantized, activations are f32.
/// A GGUF whose weights are all plain floats (a `--outtype bf16` conversion) loads as dense
/// weights in that dtype instead, and runs the same path as a safetensors checkpoint: through
/// candle's quantized matmul it decoded at 375 tok/s against 607 (Llama-1B shape, H100). On a
/// GPU, a GGUF whose weights are all Q8_0, Q4_K or Q6_K runs on our own GEMVs
/// ([`own_blocks_only`]).
pub fn load_gguf(gguf: &mut GgufFile, context: usize, device: &Device) -> anyhow::Result<Llama> {
    let cfg = gguf.config()?;
    load_gguf_as(gguf, cfg, context, device)
}

/// Loads a GGUF whose metadata read as `cfg` (by its family's reader, [`GgufFile::config_as`]).
pub fn load_gguf_as(
    gguf: &mut GgufFile,
    cfg: LlamaConfig,
    context: usize,
    device: &Device,
) -> anyhow::Result<Llama> {
    let pairs = cfg.variant.gguf_pairs;
    let float = float_dtype(gguf);
    let own = float.is_none() && device.is_cuda() && own_blocks_only(gguf);
    let mut q = |name: String| -> anyhow::Result<Linear> {
        Ok(match float {
            Some(dtype) => Linear::Dense { weight: gguf.dense(&name, dtype, device)?, bias: None },
            None if own => gguf.block_linear(&name, device)?,
            None => {
                let t = gguf.qtensor(&name, device)?;
                Linear::Quantized { weight: QMatMul::from_qtensor(t)?, bias: None }
            }
        })
    };
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for n in 0..cfg.num_layers {
        let b = |s: &str| format!("blk.{n}.{s}.weight");
        let (qw, kw, vw, ow) =
            (q(b("attn_q"))?, q(b("attn_k"))?, q(b("attn_v"))?, q(b("attn_output"))?);
        let (g, u, d) = (q(b("ffn_gate"))?, q(b("ffn_up"))?, q(b("ffn_down"))?);
        layers.push(
            Layer {
                attn_norm: Tensor::zeros(1, DType::F32, device)?,
                q: qw,
                k: kw,
                qk_norm: None,
                v: vw,
                o: ow,
                mlp_norm: Tensor::zeros(1, DType::F32, device)?,
                gate: g,
                up: u,
                down: d,
                fused: Default::default(),
            }
            .fuse()?,
        );
    }
    for (n, layer) in layers.iter_mut().enumerate() {
        layer.attn_norm =
            gguf.qtensor(&format!("blk.{n}.attn_norm.weight"), device)?.dequantize(device)?;
        layer.mlp_norm =
            gguf.qtensor(&format!("blk.{n}.ffn_norm.weight"), device)?.dequantize(device)?;
        if cfg.variant.qk_norm {
            let mut norm = |s: &str| -> anyhow::Result<Tensor> {
                Ok(gguf.qtensor(&format!("blk.{n}.{s}.weight"), device)?.dequantize(device)?)
            };
            layer.qk_norm = Some((norm("attn_q_norm")?, norm("attn_k_norm")?));
        }
    }
    let norm = gguf.qtensor("output_norm.weight", device)?.dequantize(device)?;
    let head_name = match gguf.has("output.weight") {
        true => "output.weight",
        false => "token_embd.weight", // tied embeddings
    };
    if let Some(dtype) = float {
        let embed = gguf.dense("token_embd.weight", dtype, device)?;
        let head = gguf.dense(head_name, dtype, device)?;
        let lm_head = Linear::Dense { weight: head, bias: None };
        let weights = Weights {
            embed: Embedding::whole(embed),
            layers,
            head: Head { norm, lm_head, eps: cfg.rms_norm_eps },
        };
        return Llama::new(cfg, weights, pairs, context, dtype, device);
    }
    if own {
        // bf16 activations, as a bf16 checkpoint's: the GEMV takes bf16 x. The embedding is
        // dequantized on the host, so that the device never holds its f32 copy (the plan counts
        // it in bf16).
        let lm_head = gguf.block_linear(head_name, device)?;
        let cpu = Device::Cpu;
        let embed = gguf.qtensor("token_embd.weight", &cpu)?.dequantize(&cpu)?;
        let embed = embed.to_dtype(DType::BF16)?.to_device(device)?;
        let weights = Weights {
            embed: Embedding::whole(embed),
            layers,
            head: Head { norm, lm_head, eps: cfg.rms_norm_eps },
        };
        return Llama::new(cfg, weights, pairs, context, DType::BF16, device);
    }
    let embed_q = gguf.qtensor("token_embd.weight", device)?;
    let embed = embed_q.dequantize(device)?;
    let head_q = match gguf.has("output.weight") {
        true => gguf.qtensor(head_name, device)?,
        false => embed_q,
    };
    let lm_head = Linear::Quantized { weight: QMatMul::from_qtensor(head_q)?, bias: None };
    let weights = Weights {
        embed: Embedding::whole(embed),
        layers,
        head: Head { norm, lm_head, eps: cfg.rms_norm_eps },
    };
    Llama::new(cfg, weights, pairs, context, DType::F32, device)
}

/// Whether every matmul weight (embeddings included) is Q8_0, Q4_K or Q6_K with rows our layouts
/// take, so that the model runs on gguf_gemv.cu's GEMVs (`quant::gguf_q8`, `quant::gguf_k`)
/// instead of candle's quantized matmul: decode reads 16-byte chunks, fuses q/k/v and gate/up
/// where their formats agree, and keeps bf16 activations. The memory plan (`memory.rs`'s
/// `own_gemvs_take`) applies the same rule to the file's header.
pub fn own_blocks_only(gguf: &GgufFile) -> bool {
    use crate::quant::{gguf_k, gguf_q8};
    use candle_core::quantized::GgmlDType as G;
    gguf.content.tensor_infos.iter().all(|(name, info)| {
        let k = info.shape.dims().last().copied().unwrap_or(0);
        name.ends_with("_norm.weight")
            || name == "rope_freqs.weight"
            || match info.ggml_dtype {
                G::Q8_0 => gguf_q8::fits(k),
                G::Q4K | G::Q6K => gguf_k::fits(k),
                _ => false,
            }
    })
}

/// The dtype of a GGUF's matmul weights when every one is a plain float (bf16 if any is bf16,
/// else f16 if any is f16, else f32); `None` when any is block-quantized. Norms are f32 in every
/// GGUF and do not count.
fn float_dtype(gguf: &GgufFile) -> Option<DType> {
    let mut found = Vec::new();
    for (name, info) in &gguf.content.tensor_infos {
        if name.ends_with("_norm.weight") || name == "rope_freqs.weight" {
            continue;
        }
        found.push(plain_float(info.ggml_dtype)?);
    }
    [DType::BF16, DType::F16, DType::F32].into_iter().find(|d| found.contains(d))
}

fn plain_float(d: candle_core::quantized::GgmlDType) -> Option<DType> {
    use candle_core::quantized::GgmlDType as G;
    match d {
        G::F32 => Some(DType::F32),
        G::F16 => Some(DType::F16),
        G::BF16 => Some(DType::BF16),
        _ => None,
    }
}

/// Names of GGUF tensors the loader did not use (for a warning on unexpected files).
pub fn unused_gguf_tensors(gguf: &GgufFile, cfg: &LlamaConfig) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = gguf.content.tensor_infos.keys().cloned().collect();
    for n in 0..cfg.num_layers {
        for s in [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
            "attn_norm",
            "ffn_norm",
            "attn_q_norm",
            "attn_k_norm",
        ] {
            names.remove(&format!("blk.{n}.{s}.weight"));
        }
    }
    for s in ["token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"] {
        names.remove(s);
    }
    names
}
