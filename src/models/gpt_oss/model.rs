//! The gpt-oss forward pass (docs/gpt-oss.md §4). Attention and the experts are inferno's own ops
//! (`crate::kernels`: CUDA kernels on a GPU, their plain-loop references on the CPU); the rest
//! is candle tensor ops. Routing stays on the device: no host round-trip inside a step. Per layer: RMSNorm → attention (q/k/v/o with biases, YaRN RoPE on
//! half-split pairs, GQA, one learned sink logit per query head in the softmax denominator, a
//! 128-key sliding window on sliding layers) → residual → RMSNorm → router (top-k on the raw
//! logits, softmax over those k) → experts (MXFP4, interleaved gate/up, clamped SwiGLU with the
//! +1, per-expert biases) → weighted sum → residual. The residual stream is f32.

use candle_core::{DType, Device, Tensor};

use super::config::GptOssConfig;
use super::graph::DecodeGraph;
use super::memory;
use crate::kernels::{KvLayout, Mxfp4Experts, SinkAttnConfig, SwiGlu};
use crate::models::head::{Decoder, Head, rms_norm};
use crate::models::kv_cache::{KvCache, RingTracker};
use crate::models::linear::Linear;
use crate::models::rope;

pub struct Attention {
    /// q, k and v projections as one (rows q then k then v): one GEMM and one bias add where
    /// there were three of each, which a decode step feels.
    pub qkv: Linear,
    pub o: Linear,
    /// `[heads]`, f32.
    pub sinks: Tensor,
}

impl Attention {
    /// From the checkpoint's separate dense projections (with biases).
    pub fn new(
        q: Linear,
        k: Linear,
        v: Linear,
        o: Linear,
        sinks: Tensor,
    ) -> anyhow::Result<Attention> {
        let (mut weights, mut biases) = (Vec::new(), Vec::new());
        for p in [q, k, v] {
            match p {
                Linear::Dense { weight, bias: Some(bias) } => {
                    weights.push(weight);
                    biases.push(bias);
                }
                _ => anyhow::bail!("gpt-oss attention projections must be dense with biases"),
            }
        }
        // Biases in f32: the projections' products stay f32 (Linear::forward_f32) until RoPE
        // has run, and converting them on every call would be a launch each.
        let f32_bias = |b: &Tensor| b.to_dtype(DType::F32);
        let qkv = Linear::Dense {
            weight: Tensor::cat(&weights, 0)?,
            bias: Some(f32_bias(&Tensor::cat(&biases, 0)?)?),
        };
        let o = match o {
            Linear::Dense { weight, bias } => {
                Linear::Dense { weight, bias: bias.as_ref().map(f32_bias).transpose()? }
            }
            _ => anyhow::bail!("gpt-oss o_proj must be dense"),
        };
        Ok(Attention { qkv, o, sinks })
    }
}

pub struct Layer {
    pub attn_norm: Tensor,
    pub attn: Attention,
    pub mlp_norm: Tensor,
    /// Router weight `[experts, hidden]` and bias `[experts]`, f32 (docs/gpt-oss.md pitfall #5:
    /// near-ties).
    pub router_w: Tensor,
    pub router_b: Tensor,
    /// Packed MXFP4 weights and biases of every expert.
    pub experts: Mxfp4Experts,
}

pub struct Weights {
    pub embed: Tensor,
    pub layers: Vec<Layer>,
    /// Final norm and LM head.
    pub head: Head,
}

pub struct GptOss {
    cfg: GptOssConfig,
    w: Weights,
    caches: Vec<KvCache>,
    cos: Tensor,
    sin: Tensor,
    dtype: DType,
    device: Device,
    /// Positions the model can hold (full layers' cache size).
    context: usize,
    /// Longest chunk one forward pass runs; sliding layers' rings hold `window + chunk − 1`.
    prefill_chunk: usize,
    /// Per layer: whether its cache is a ring.
    ring: Vec<bool>,
    /// What the rings hold for the current sequence (`None`: no layer has a ring).
    ring_track: Option<RingTracker>,
    /// The rings as they were at the end of the last prompt ([`Decoder::checkpoint`]).
    checkpoint: Option<RingCheckpoint>,
    /// Decode steps as a replayed CUDA graph (None on the CPU or when switched off).
    graph: Option<DecodeGraph>,
}

/// The ring caches' contents at one point of a sequence, and what they held then.
struct RingCheckpoint {
    track: RingTracker,
    /// (layer, keys, values) of each ring layer.
    kv: Vec<(usize, Tensor, Tensor)>,
}

/// Where a chunk's positions come from.
#[derive(Clone, Copy)]
pub(super) enum At<'a> {
    /// Known on the host: the chunk starts at this position.
    Host(usize),
    /// One token whose position is in a device tensor (i64 `[1]`): no launch depends on it, so
    /// a CUDA graph of the step replays correctly at every position.
    Device(&'a Tensor),
}

/// Default prefill chunk: long prompts run in pieces of this many tokens.
pub const PREFILL_CHUNK: usize = 512;

impl GptOss {
    pub fn new(
        cfg: GptOssConfig,
        w: Weights,
        context: usize,
        dtype: DType,
        device: &Device,
    ) -> anyhow::Result<GptOss> {
        let vocab = cfg.vocab_size;
        let inv_freq = rope::inv_freq(&cfg.rope, cfg.rope_theta, cfg.head_dim, 0);
        let (cos, sin) = rope::scaled_tables(
            &inv_freq,
            cfg.rope.attention_scaling(),
            0,
            context,
            memory::ROPE_DTYPE,
            device,
        )?;
        let mut model = GptOss {
            cfg,
            w,
            caches: Vec::new(),
            cos,
            sin,
            dtype,
            device: device.clone(),
            context,
            prefill_chunk: PREFILL_CHUNK,
            ring: Vec::new(),
            ring_track: None,
            checkpoint: None,
            graph: DecodeGraph::new(device, vocab)?,
        };
        model.set_prefill_chunk(PREFILL_CHUNK)?;
        Ok(model)
    }

    /// Sets the prefill chunk and (re)allocates the KV caches as [`memory::layer_cache`] lays
    /// them out (the memory plan counts the same). Forgets the cache contents.
    pub fn set_prefill_chunk(&mut self, chunk: usize) -> anyhow::Result<()> {
        anyhow::ensure!(chunk > 0, "the prefill chunk must be positive");
        let cfg = &self.cfg;
        let layout: Vec<_> =
            cfg.sliding.iter().map(|&s| memory::layer_cache(cfg, s, self.context, chunk)).collect();
        // The old caches go first: both sets at once may not fit where one does.
        self.caches.clear();
        self.ring = layout.iter().map(|c| c.ring).collect();
        self.caches = layout
            .iter()
            .map(|c| {
                KvCache::new(cfg.num_kv_heads, c.slots, cfg.head_dim, self.dtype, &self.device)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        self.prefill_chunk = chunk;
        let ring_slots = layout.iter().find(|c| c.ring).map(|c| c.slots);
        self.ring_track = ring_slots.map(|slots| RingTracker::new(slots, cfg.sliding_window));
        self.checkpoint = None;
        // A captured graph holds the old caches' addresses; a graph switched off stays off.
        if self.graph.is_some() {
            self.graph = DecodeGraph::new(&self.device, self.cfg.vocab_size)?;
        }
        Ok(())
    }

    /// Checks that a chunk may start at `start` and records the ring slots it overwrites. A
    /// start whose window the rings lost is an error, never a silent read of the wrong keys.
    fn before_write(&mut self, start: usize, len: usize) -> anyhow::Result<()> {
        let Some(track) = &mut self.ring_track else { return Ok(()) };
        anyhow::ensure!(
            track.can_continue_at(start),
            "the sliding-window caches no longer hold the keys position {start} attends to \
             (rewind the sequence first)"
        );
        // Positions the checkpoint holds are being rewritten, perhaps with other tokens.
        if self.checkpoint.as_ref().is_some_and(|c| start < c.track.end()) {
            self.checkpoint = None;
        }
        track.record_write(start, len);
        Ok(())
    }

    /// The latest position `≤ want` that continues exactly: `want` when the rings still hold
    /// its window; else the checkpoint's end when that is not past `want` (its rings are copied
    /// back, the caller re-runs from there); else 0.
    fn rewind_rings(&mut self, want: usize) -> anyhow::Result<usize> {
        let Some(track) = self.ring_track else { return Ok(want) };
        if track.can_continue_at(want) {
            return Ok(want);
        }
        if let Some(cp) = self.checkpoint.as_ref().filter(|c| c.track.end() <= want) {
            for (layer, k, v) in &cp.kv {
                self.caches[*layer].restore_from(k, v)?;
            }
            self.ring_track = Some(cp.track);
            return Ok(cp.track.end());
        }
        self.ring_track = Some(track.emptied());
        self.checkpoint = None;
        Ok(0)
    }

    /// Copies the rings (a few MB: `window + chunk − 1` slots per sliding layer) into the
    /// checkpoint buffers, allocated once.
    fn checkpoint_rings(&mut self) -> anyhow::Result<()> {
        let Some(track) = self.ring_track else { return Ok(()) };
        let mut kv = self.checkpoint.take().map(|cp| cp.kv).unwrap_or_default();
        if kv.is_empty() {
            for (n, cache) in self.caches.iter().enumerate().filter(|(n, _)| self.ring[*n]) {
                let (k, v) = cache.empty_like()?;
                kv.push((n, k, v));
            }
        }
        for (layer, k, v) in &kv {
            self.caches[*layer].copy_to(k, v)?;
        }
        self.checkpoint = Some(RingCheckpoint { track, kv });
        Ok(())
    }

    /// Bytes the KV caches hold on the device.
    pub fn kv_cache_bytes(&self) -> usize {
        self.caches.iter().map(KvCache::bytes).sum()
    }

    /// Bytes of the RoPE tables.
    pub fn rope_bytes(&self) -> usize {
        [&self.cos, &self.sin].iter().map(|t| t.elem_count() * t.dtype().size_in_bytes()).sum()
    }

    /// Bytes of the weights, each tensor once (a tied LM head is the embedding).
    pub fn weight_bytes(&self) -> u64 {
        let mut m = crate::models::memory::Measured::default();
        m.tensor(&self.w.embed);
        for l in &self.w.layers {
            for t in [&l.attn_norm, &l.mlp_norm, &l.router_w, &l.router_b, &l.attn.sinks] {
                m.tensor(t);
            }
            m.linear(&l.attn.qkv);
            m.linear(&l.attn.o);
            l.experts.tensors().into_iter().for_each(|t| m.tensor(t));
        }
        m.tensor(&self.w.head.norm);
        m.linear(&self.w.head.lm_head);
        m.total
    }

    pub fn config(&self) -> &GptOssConfig {
        &self.cfg
    }

    /// The decoder layers for token ids `ids` (u32 or i64 `[seq]`, on the device) at `at`:
    /// final hidden states `[seq, hidden]`, f32.
    pub(super) fn layers(&mut self, ids: &Tensor, at: At) -> anyhow::Result<Tensor> {
        let seq = ids.dim(0)?;
        let mut x = self.w.embed.index_select(ids, 0)?.to_dtype(DType::F32)?;
        // The chunk's rows of the RoPE tables; a device position reads its row in the kernel.
        let (cos, sin) = match at {
            At::Host(start) => (self.cos.narrow(0, start, seq)?, self.sin.narrow(0, start, seq)?),
            At::Device(_) => (self.cos.clone(), self.sin.clone()),
        };
        let eps = self.cfg.rms_norm_eps;
        for (n, (layer, cache)) in self.w.layers.iter().zip(self.caches.iter_mut()).enumerate() {
            let l = AttnLayer {
                w: &layer.attn,
                cache,
                layout: if self.ring[n] { KvLayout::Ring } else { KvLayout::Linear },
                window: self.cfg.sliding[n].then_some(self.cfg.sliding_window),
            };
            let h = rms_norm(&x, &layer.attn_norm, eps)?.to_dtype(self.dtype)?;
            let a = match at {
                At::Host(start) => attention_prefill(&self.cfg, l, &h, start, (&cos, &sin))?,
                At::Device(pos) => {
                    attention_at_device_position(&self.cfg, l, &h, pos, (&cos, &sin))?
                }
            };
            x = (x + a)?;
            let h = rms_norm(&x, &layer.mlp_norm, eps)?;
            let m = moe(&self.cfg, layer, &h, &h.to_dtype(self.dtype)?)?;
            x = (x + m)?;
        }
        Ok(x)
    }

    /// Logits `[1, vocab]` of the token at the position held in `step` (i64 `[token, position]`
    /// on the device), with nothing in the launches depending on either: the step a CUDA graph
    /// captures.
    pub(super) fn step_at_device_position(&mut self, step: &Tensor) -> anyhow::Result<Tensor> {
        let _uploads = keep_uploads(&self.device);
        let (token, pos) = (step.narrow(0, 0, 1)?, step.narrow(0, 1, 1)?);
        let h = self.layers(&token, At::Device(&pos))?;
        self.w.head.logits(&h)
    }

    /// Whether decode steps run as a CUDA graph (the default on a GPU) or through the ordinary
    /// per-op path (`INFERNO_CUDA_GRAPH=0` sets this off at load).
    pub fn set_decode_graph(&mut self, on: bool) -> anyhow::Result<()> {
        self.graph = if on { DecodeGraph::new(&self.device, self.cfg.vocab_size)? } else { None };
        Ok(())
    }

    pub(super) fn device(&self) -> &Device {
        &self.device
    }

    /// Positions the KV caches hold.
    pub(super) fn cache_positions(&self) -> usize {
        self.context
    }

    pub(super) fn weights(&self) -> &Weights {
        &self.w
    }

    pub(super) fn dtype(&self) -> DType {
        self.dtype
    }

    /// The f32 RoPE tables `[positions, d/2]`.
    pub(super) fn rope_tables(&self) -> (&Tensor, &Tensor) {
        (&self.cos, &self.sin)
    }

    /// Frees the single-sequence caches (and the graph that holds their addresses) when the
    /// engine's paged pool takes over; the single-sequence path must not be used afterwards.
    pub(super) fn drop_single_sequence_cache(&mut self) {
        self.caches.clear();
        self.graph = None;
        self.checkpoint = None;
    }
}

/// Decode steps: candle uploads the dims and strides of reductions and strided copies on every
/// call (a blocking host-to-device copy each); single-token shapes repeat, so let candle keep
/// those uploads (graph capture needs that too). Not for prefill, whose lengths vary (every new
/// one would stay cached).
fn keep_uploads(device: &Device) -> Option<Box<dyn std::any::Any>> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(cuda) => Some(Box::new(cuda.enable_cuda_graph_htod_cache())),
        _ => None,
    }
}

impl Decoder for GptOss {
    fn hidden_chunk(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Tensor> {
        self.before_write(start, tokens.len())?;
        // Uploaded before the cache below is on: it would keep every token id it ever saw.
        let ids = Tensor::new(tokens, &self.device)?;
        let _uploads = if tokens.len() == 1 { keep_uploads(&self.device) } else { None };
        self.layers(&ids, At::Host(start))
    }

    fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    fn head(&self) -> &Head {
        &self.w.head
    }

    fn rewind(&mut self, want: usize) -> anyhow::Result<usize> {
        self.rewind_rings(want)
    }

    fn checkpoint(&mut self) -> anyhow::Result<()> {
        self.checkpoint_rings()
    }

    fn cache_capacity(&self) -> usize {
        self.context
    }

    fn vocab(&self) -> usize {
        self.cfg.vocab_size
    }

    fn allocated(&self) -> crate::models::memory::Allocated {
        crate::models::memory::Allocated {
            weights: self.weight_bytes(),
            kv_cache: self.kv_cache_bytes() as u64,
            rope_tables: self.rope_bytes() as u64,
        }
    }

    fn into_batch(self: Box<Self>) -> Box<dyn crate::models::batch::BatchModel> {
        self
    }

    fn decode_step(&mut self, token: u32, start: usize) -> Option<anyhow::Result<Tensor>> {
        let mut graph = self.graph.take()?;
        if let Err(e) = self.before_write(start, 1) {
            self.graph = Some(graph);
            return Some(Err(e));
        }
        let logits = graph.step(self, token, start);
        self.graph = Some(graph);
        Some(logits)
    }
}

/// One layer's attention weights and KV cache, as the layer loop hands them to attention.
struct AttnLayer<'a> {
    w: &'a Attention,
    cache: &'a mut KvCache,
    layout: KvLayout,
    /// Sliding layers: the window; full layers: `None`.
    window: Option<usize>,
}

/// Attention of a chunk whose positions the host knows (prefill, and decode steps run without
/// the CUDA graph); `x` is `[seq, hidden]`, `rope` the chunk's rows of the cos/sin tables.
fn attention_prefill(
    cfg: &GptOssConfig,
    l: AttnLayer,
    x: &Tensor,
    start: usize,
    (cos, sin): (&Tensor, &Tensor),
) -> anyhow::Result<Tensor> {
    let (seq, heads, kv_heads, d) = (x.dim(0)?, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let dtype = l.cache.dtype();
    // q, k, v in one product with its bias, kept in f32 ...
    let qkv = l.w.qkv.forward_f32(x)?;
    let (qd, kvd) = (heads * d, kv_heads * d);
    // ... RoPE in f32 on q and k, then one rounding into the cache dtype (as the decode kernel).
    let rope = |t: Tensor, n: usize| -> candle_core::Result<Tensor> {
        candle_nn::rotary_emb::rope(&heads_first(t, n, d)?, cos, sin)?.squeeze(0)?.to_dtype(dtype)
    };
    let q = rope(qkv.narrow(1, 0, qd)?, heads)?.contiguous()?;
    let k = rope(qkv.narrow(1, qd, kvd)?, kv_heads)?;
    let v = heads_first(qkv.narrow(1, qd + kvd, kvd)?, kv_heads, d)?.squeeze(0)?.to_dtype(dtype)?;
    // The chunk's keys and values into the cache (ring slots p mod slots on sliding layers).
    let (k_all, v_all) = match l.layout {
        KvLayout::Ring => l.cache.append_ring(&k, &v, start)?,
        KvLayout::Linear => l.cache.append(&k, &v, start)?,
    };
    // Sink attention over what the cache holds; [heads, seq, d] back to rows [seq, heads·d].
    let scale = 1.0 / (d as f32).sqrt();
    let attn = SinkAttnConfig { start, window: l.window, layout: l.layout, scale };
    let out = crate::kernels::sink_attention(&q, &k_all, &v_all, &l.w.sinks, &attn)?;
    let out = if seq == 1 {
        out.reshape((1, heads * d))? // [heads, 1, d] is already that layout: no copy
    } else {
        out.transpose(0, 1)?.reshape((seq, heads * d))?
    };
    // o_proj in f32, straight into the f32 residual stream.
    Ok(l.w.o.forward_f32(&out)?)
}

/// Attention of one token at the position held in `pos` (i64 `[1]` on the device): no launch
/// depends on the position, so a CUDA graph of the step replays at every position. `rope` are
/// the whole cos/sin tables; the kernels read the position's row.
fn attention_at_device_position(
    cfg: &GptOssConfig,
    l: AttnLayer,
    x: &Tensor,
    pos: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
) -> anyhow::Result<Tensor> {
    let (heads, kv_heads, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let Some(bias) = l.w.qkv.bias() else { anyhow::bail!("gpt-oss q/k/v must have biases") };
    // The q, k, v product in f32; then bias, RoPE at the device position and both cache writes
    // in one launch.
    let (k_all, v_all) = l.cache.buffers();
    let q = crate::kernels::qkv_rope_store(
        &l.w.qkv.matmul_f32(x)?,
        bias,
        cos,
        sin,
        pos,
        crate::kernels::QkvHeads { heads, kv_heads, head_dim: d },
        (&k_all, &v_all),
        l.layout,
    )?;
    // Sink attention reading its last position from the device; [heads, 1, d] is already the
    // memory layout of the row [1, heads·d].
    let scale = 1.0 / (d as f32).sqrt();
    let attn = SinkAttnConfig { start: 0, window: l.window, layout: l.layout, scale };
    let out = crate::kernels::sink_attention_at(&q, &k_all, &v_all, &l.w.sinks, &attn, pos)?;
    // o_proj in f32, straight into the f32 residual stream.
    Ok(l.w.o.forward_f32(&out.reshape((1, heads * d))?)?)
}

/// `[seq, n·d]` rows as `[1, n, seq, d]` heads (contiguous), the layout RoPE and attention take.
fn heads_first(t: Tensor, n: usize, d: usize) -> candle_core::Result<Tensor> {
    let seq = t.dim(0)?;
    t.reshape((seq, n, d))?.transpose(0, 1)?.contiguous()?.unsqueeze(0)
}

/// Router and experts for `h` (`[seq, hidden]`, f32) and `h_experts`, the same rounded to the
/// compute dtype; returns the f32 MoE output. The router runs in f32 on the f32 normed residual
/// (docs/gpt-oss.md pitfall #5: near-ties); routing (top-k, softmax over the k) is fused into the
/// experts' op.
pub(super) fn moe(
    cfg: &GptOssConfig,
    layer: &Layer,
    h: &Tensor,
    h_experts: &Tensor,
) -> anyhow::Result<Tensor> {
    let logits = crate::kernels::router_logits(h, &layer.router_w)?;
    let act = SwiGlu { limit: cfg.swiglu_limit, alpha: cfg.swiglu_alpha };
    Ok(crate::kernels::mxfp4_moe_routed(
        h_experts,
        &layer.experts,
        &logits,
        &layer.router_b,
        cfg.experts_per_token,
        act,
    )?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sliding_window_counts_the_current_token() {
        let cfg = crate::kernels::SinkAttnConfig {
            start: 4,
            window: Some(2),
            layout: crate::kernels::KvLayout::Linear,
            scale: 1.0,
        };
        let visible: Vec<Vec<usize>> =
            (4..7).map(|p| (0..7).filter(|&t| cfg.allows(t, p)).collect()).collect();
        assert_eq!(visible, vec![vec![3, 4], vec![4, 5], vec![5, 6]]);
    }
}
