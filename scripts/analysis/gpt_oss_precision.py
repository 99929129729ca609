"""Where bf16 rounding costs top-1 agreement on a random gpt-oss checkpoint.

  python3 scripts/analysis/gpt_oss_precision.py CONFIG.json [--tokens N] [--settings 1,0 4,2 ...]
  python3 scripts/analysis/gpt_oss_precision.py --check-tiny tests/fixtures/gpt_oss_tiny

A plain torch forward of gpt-oss in float32 (weights are bf16/MXFP4 values, exact in f32), in
which a chosen set of intermediate tensors is rounded to bf16 and back: a bf16 GEMM is its f32
product on bf16 inputs with the output rounded, so each flag below models one place where an
implementation holds a value in bf16. For each random checkpoint (the same generator as
scripts/fixtures/gpt_oss_20b_random.py, built in GPU memory, nothing written) it prints the
teacher-forced top-1 agreement of every rounding set with the unrounded forward, and the f32
top-1 margins at the misses.

--check-tiny runs the unrounded forward on the tiny fixture and compares its logits with
transformers' (reference.json): the forward here is only worth its numbers if that is ~1e-6.
Needs a GPU (a 20b-shaped checkpoint: ~16 GB) and torch + transformers (for the RoPE tables).
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))

FLAGS = {
    "res": "the residual stream after each add (transformers in bf16; inferno keeps it f32)",
    "attn_in": "the normed input of q/k/v",
    "qkv": "q/k/v after the GEMM, the bias and RoPE, and the RoPE tables (the KV cache)",
    "qkv1": "q/k/v once, after an f32 bias and an f32 RoPE with f32 tables (the KV cache)",
    "attn_out": "attention's output (o_proj's input)",
    "o_out": "o_proj's output, after the GEMM and the bias",
    "router": "the router's input and logits",
    "moe_in": "the experts' input",
    "moe_mid": "gate_up's output and the SwiGLU activation between the experts' GEMMs",
    "moe_out": "the experts' weighted sum",
    "head_in": "the final normed hidden state (lm_head's input)",
    "logits": "lm_head's output (a bf16 GEMM's result; inferno keeps it f32 since matmul_f32_out)",
}
# Bugs other engines shipped (docs/gpt-oss.md §7, pitfalls #3, #5, #13 and #4), to show what the
# agreement detects.
BUGS = {
    "bug_window": "a sliding window one key too wide",
    "bug_gates": "softmax over all experts' logits, top-k weights not renormalized",
    "bug_rope": "RoPE on interleaved pairs instead of half-split",
    "bug_sinks": "no sink logit in the softmax",
}
# Where inferno's bf16 path holds values in bf16: GEMM inputs and the KV cache. Its residual
# stream, router, GEMM results, RoPE and logits are f32; the LM head takes the f32 hidden state
# as bf16 hi + lo.
INFERNO = {"attn_in", "qkv1", "attn_out", "moe_in"}
BEFORE = {"attn_in", "qkv", "attn_out", "o_out", "moe_in", "head_in", "logits"}
VARIANTS = {
    "transformers bf16": set(FLAGS),
    "inferno before (bf16 GEMM outputs and logits)": BEFORE,
    "inferno before, f32 logits": BEFORE - {"logits"},
    "inferno (now)": INFERNO,
    "inferno - moe_in": INFERNO - {"moe_in"},
    "inferno - attention path": INFERNO - {"attn_in", "qkv1", "attn_out"},
    "only head_in": {"head_in"},
    "only logits": {"logits"},
    "only qkv": {"qkv"},
    "only qkv1": {"qkv1"},
    **{f"inferno + {bug}": INFERNO | {bug} for bug in BUGS},
}

FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def dequant(blocks, scales):
    """MXFP4 `[rows, nb, 16]` bytes + `[rows, nb]` E8M0 scales → f32 `[rows, nb·32]` (low nibble first)."""
    lut = torch.tensor(FP4, device=blocks.device)
    vals = torch.stack([lut[(blocks & 0x0F).int()], lut[(blocks >> 4).int()]], dim=-1).reshape(*blocks.shape[:-1], 32)
    return (vals * torch.exp2(scales.float() - 127).unsqueeze(-1)).reshape(blocks.shape[0], -1)


class Forward:
    def __init__(self, cfg, w, flags):
        self.cfg, self.w, self.flags = cfg, w, flags

    def r(self, flag, x):
        return x.to(torch.bfloat16).float() if flag in self.flags else x

    def rms(self, x, weight):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg["rms_norm_eps"])
        return x * weight.float()

    def rope(self, x, cos, sin):
        if "bug_rope" in self.flags:
            a, b = x[..., ::2], x[..., 1::2]
            return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
        a, b = torch.chunk(x, 2, dim=-1)
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

    def attention(self, n, h, cos, sin):
        c, w, p = self.cfg, self.w, f"model.layers.{n}.self_attn."
        nh, nkv, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        T = h.shape[0]
        proj = lambda name: self.r("qkv", self.r("qkv", h @ w[p + name + ".weight"].float().T) + w[p + name + ".bias"].float())
        q = proj("q_proj").reshape(T, nh, D).transpose(0, 1)
        k = proj("k_proj").reshape(T, nkv, D).transpose(0, 1)
        v = self.r("qkv1", proj("v_proj")).reshape(T, nkv, D).transpose(0, 1)
        q, k = self.r("qkv", self.rope(q, cos, sin)), self.r("qkv", self.rope(k, cos, sin))
        q, k = self.r("qkv1", q), self.r("qkv1", k)
        k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        scores = q @ k.transpose(1, 2) / D ** 0.5
        i = torch.arange(T, device=h.device)
        visible = i[None, :] <= i[:, None]
        if c["layer_types"][n] == "sliding_attention":
            visible &= i[:, None] - i[None, :] < c["sliding_window"] + ("bug_window" in self.flags)
        scores = scores.masked_fill(~visible, float("-inf"))
        sinks = w[p + "sinks"].float().reshape(nh, 1, 1).expand(nh, T, 1)
        if "bug_sinks" in self.flags:
            sinks = torch.full_like(sinks, float("-inf"))
        probs = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :T]
        out = self.r("attn_out", (probs @ v).transpose(0, 1).reshape(T, nh * D))
        return self.r("o_out", self.r("o_out", out @ w[p + "o_proj.weight"].float().T) + w[p + "o_proj.bias"].float())

    def moe(self, n, h):
        c, w, p = self.cfg, self.w, f"model.layers.{n}.mlp."
        hr = self.r("router", h)
        logits = self.r("router", self.r("router", hr @ w[p + "router.weight"].float().T) + w[p + "router.bias"].float())
        top, idx = torch.topk(logits, c["num_experts_per_tok"], dim=-1)
        gates = torch.softmax(top, dim=-1)
        if "bug_gates" in self.flags:
            gates = torch.softmax(logits, dim=-1).gather(-1, idx)
        x = self.r("moe_in", h)
        out = torch.zeros_like(h)
        lim, alpha = c["swiglu_limit"], 1.702
        for e in range(c["num_local_experts"]):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            wgu = dequant(w[p + "experts.gate_up_proj_blocks"][e], w[p + "experts.gate_up_proj_scales"][e])
            gu = self.r("moe_mid", x[tok] @ wgu.T + w[p + "experts.gate_up_proj_bias"][e].float())
            gate, up = gu[:, ::2].clamp(max=lim), gu[:, 1::2].clamp(-lim, lim)
            act = self.r("moe_mid", (up + 1) * gate * torch.sigmoid(alpha * gate))
            wd = dequant(w[p + "experts.down_proj_blocks"][e], w[p + "experts.down_proj_scales"][e])
            d = act @ wd.T + w[p + "experts.down_proj_bias"][e].float()
            out.index_add_(0, tok, d * gates[tok, slot, None])
        return self.r("moe_out", out)

    @torch.no_grad()
    def logits(self, ids, cos, sin):
        c, w = self.cfg, self.w
        rt = lambda t: self.r("qkv", t)
        cos, sin = rt(cos), rt(sin)
        x = w["model.embed_tokens.weight"][ids].float()
        for n in range(c["num_hidden_layers"]):
            p = f"model.layers.{n}."
            h = self.r("attn_in", self.rms(x, w[p + "input_layernorm.weight"]))
            x = self.r("res", x + self.attention(n, h, cos, sin))
            x = self.r("res", x + self.moe(n, self.rms(x, w[p + "post_attention_layernorm.weight"])))
        h = self.r("head_in", self.rms(x, w["model.norm.weight"]))
        return self.r("logits", h @ w["lm_head.weight"].float().T)


def rope_tables(cfg, T, dev):
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    rot = GptOssRotaryEmbedding(config=GptOssConfig(**cfg), device=dev)
    x = torch.zeros(1, T, cfg["head_dim"], device=dev)
    cos, sin = rot(x, torch.arange(T, device=dev)[None])
    half = cfg["head_dim"] // 2
    return cos[0, :, :half].float(), sin[0, :, :half].float()


def check_tiny(fixture):
    from safetensors.torch import load_file

    dev = "cuda"
    cfg = json.load(open(os.path.join(fixture, "config.json")))
    ref = json.load(open(os.path.join(fixture, "reference.json")))
    w = {k: v.to(dev) for k, v in load_file(os.path.join(fixture, "model.safetensors")).items()}
    ids = torch.tensor(ref["prompt_ids"], device=dev)
    cos, sin = rope_tables(cfg, len(ids), dev)
    got = Forward(cfg, w, set()).logits(ids, cos, sin)
    want = torch.tensor(ref["prompt_logits"], device=dev)
    print(f"tiny fixture: max |logit − transformers f32| = {(got - want).abs().max().item():.3g}")


def checkpoint(cfg, router_scale, damp, dev):
    from gpt_oss_20b_random import tensors_for_layer

    g = torch.Generator(device=dev).manual_seed(0)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    w = {"model.embed_tokens.weight": torch.randn(V, H, generator=g, device=dev).to(torch.bfloat16)}
    for n in range(cfg["num_hidden_layers"]):
        w.update(tensors_for_layer(cfg, n, g, dev, router_scale, damp))
    w["model.norm.weight"] = (1 + 0.1 * torch.randn(H, generator=g, device=dev)).to(torch.bfloat16)
    w["lm_head.weight"] = (torch.randn(V, H, generator=g, device=dev) * 4 * H ** -0.5).to(torch.bfloat16)
    return w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config", nargs="?")
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--settings", nargs="*", default=["1,0"], help="ROUTER_SCALE,DAMP pairs (see gpt_oss_20b_random.py)")
    ap.add_argument("--check-tiny")
    ap.add_argument("--reference", help="a folder written by gpt_oss_20b_random.py with the same settings and --tokens")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.check_tiny:
        check_tiny(args.check_tiny)
    if not args.config:
        return
    cfg = json.load(open(args.config))
    dev = "cuda"
    # The token ids gpt_oss_20b_random.py uses.
    ids = torch.randint(0, 199998, (args.tokens,), generator=torch.Generator().manual_seed(1)).to(dev)
    cos, sin = rope_tables(cfg, args.tokens, dev)
    for setting in args.settings:
        rs, damp = setting.split(",")
        w = checkpoint(cfg, float(rs), int(damp), dev)
        exact = Forward(cfg, w, set()).logits(ids, cos, sin)
        if args.reference:
            ref = json.load(open(os.path.join(args.reference, "reference.json")))
            same = (exact.argmax(-1).cpu() == torch.tensor(ref["f32_argmax"])).float().mean().item()
            print(f"unrounded forward vs transformers f32 ({args.reference}): top-1 agreement {100 * same:.2f}%")
            for p, row in zip(ref.get("probe_positions", []), ref.get("f32_probe_logits", [])):
                print(f"  position {p}: max |logit difference| {(exact[p].cpu() - torch.tensor(row)).abs().max().item():.2e}")
        top = torch.topk(exact, 2, dim=-1)
        want, margin = top.indices[:, 0], top.values[:, 0] - top.values[:, 1]
        print(f"\n== router scale {rs}, damp {damp}: {args.tokens} positions; f32 margin < 0.1 at "
              f"{(margin < 0.1).sum().item()}, < 0.3 at {(margin < 0.3).sum().item()}")
        for name, flags in VARIANTS.items():
            got = Forward(cfg, w, flags).logits(ids, cos, sin).argmax(-1)
            miss = (got != want).nonzero().flatten()
            worst = margin[miss].max().item() if miss.numel() else 0.0
            print(f"  {name:34s} {100 * (1 - miss.numel() / args.tokens):6.2f}%  misses {miss.numel():4d}, "
                  f"largest f32 margin missed {worst:.3f}")
        del w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
