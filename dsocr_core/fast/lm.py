"""The language model's math for the fast engine, as plain functions over tensors (no modules), so the same
code runs eagerly on the CPU, inside CUDA-graph captures, and under torch.compile.

Every op follows the reference decoder (model/decoder.py): RMSNorm in float32 cast back before the weight,
rotate-half RoPE with cos/sin from the same `rope_cos_sin`, causal attention, SwiGLU, fp32 router. Differences
are of layout only: q/k/v in one matmul, gate/up in one matmul, experts grouped (moe.py), KV written into a
static cache, logits for the last position only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model.decoder import rotate_half
from ..spec import ModelSpec
from .moe import combine, moe_forward, router_logits, swiglu


@dataclass(frozen=True)
class LMConfig:
    hidden: int
    heads: int
    head_dim: int
    eps: float
    inter: int  # dense MLP inner width
    moe_inter: int  # one expert's inner width
    k: int  # experts per token
    n_routed: int
    shared_slots: int
    norm_topk_prob: bool
    scale: float

    @classmethod
    def from_spec(cls, spec: ModelSpec, shared_slots: int) -> "LMConfig":
        return cls(spec.hidden_size, spec.num_attention_heads, spec.head_dim, spec.rms_norm_eps,
                   spec.intermediate_size, spec.moe_intermediate_size, spec.num_experts_per_tok,
                   spec.n_routed_experts, shared_slots, spec.norm_topk_prob, spec.routed_scaling_factor)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference RMSNorm: float32 statistics, cast back, then times the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def mlp(h: torch.Tensor, w13, w2, gate, cfg: LMConfig, moe_impl: str, gemv: str = "linear",
        topk: str = "torch", grouping: str = "onehot", rows: str = "torch",
        residual: torch.Tensor | None = None) -> torch.Tensor:
    """Dense SwiGLU (gate None) or MoE of one layer on tokens h [T, H] -> [T, H], plus `residual` when given."""
    if gate is None:
        out = F.linear(swiglu(F.linear(h, w13), cfg.inter), w2)
        return out if residual is None else residual + out
    return moe_forward(h, gate, w13, w2, k=cfg.k, n_routed=cfg.n_routed, shared_slots=cfg.shared_slots,
                       inner=cfg.moe_inter, norm_topk_prob=cfg.norm_topk_prob, scale=cfg.scale, impl=moe_impl,
                       gemv=gemv, topk=topk, grouping=grouping, rows=rows, residual=residual)


def make_prefill_layer(cfg: LMConfig, topk: str = "torch", grouping: str = "sort", last_only: bool = False,
                       rows: str = "torch"):
    """One decoder layer over a whole prompt, as a function of tensors only (so it can be compiled):

    layer(x [B, T, H], cos, sin [T, d], keys, values [B, heads, capacity, d] (the layer's whole static cache, so
          a compiled layer sees contiguous tensors whose only varying sizes are B, T and the capacity), ln1, wqkv,
          wo, ln2, w13, w2, gate or None) -> x; writes the layer's keys/values into the cache's first T positions.
    last_only: the layer's output at the last position only ([B, 1, H]), for the final layer when only the last
    logits are wanted: every key/value is still written, but attention, o_proj and the MLP/MoE run on one row
    per sequence (its query sees all keys, so no mask) instead of T."""

    def layer(x, cos, sin, keys, values, ln1, wqkv, wo, ln2, w13, w2, gate):
        b, t, hdim = x.shape
        h = rms_norm(x, ln1, cfg.eps)
        q, k, v = F.linear(h, wqkv).view(b, t, 3, cfg.heads, cfg.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = rope(q, cos, sin), rope(k, cos, sin)  # [B, heads, T, d]
        keys[:, :, :t].copy_(k)
        values[:, :, :t].copy_(v)
        if last_only:
            x, t = x[:, -1:], 1
            o = F.scaled_dot_product_attention(q[:, :, -1:], k, v)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + F.linear(o.transpose(1, 2).reshape(b, t, hdim), wo)
        h = rms_norm(x, ln2, cfg.eps)
        return mlp(h.reshape(b * t, hdim), w13, w2, gate, cfg, "grouped", topk=topk, grouping=grouping,
                   rows=rows, residual=x.reshape(b * t, hdim)).view(b, t, hdim)

    return layer


def make_decode_fns(cfg: LMConfig, moe_impl: str, gemv: str, topk: str = "torch", rows: str = "torch") -> dict:
    """The pieces of one decode step (batch B, one token per row), each a function of tensors only, with
    static shapes (the attention over the cache, whose length changes, runs between them):

    embed(token [B], table) -> x [B, H]
    pre(x, keys, values, pos, cos_t, sin_t, ln1, wqkv) -> q [B, heads, d]: norm, q/k/v, RoPE at `pos`, and the
        new key/value written into the layer's whole cache tensors [B, heads, capacity, d] at `pos`
    dense(x, o, wo, ln2, w13, w2) -> x: o_proj + residual, then the dense SwiGLU + residual
    moe(x, o, wo, ln2, w13, w2, gate) -> x: the same with the MoE (moe_impl 'grouped' or 'gather')
    logits(x, o, wo, ln2, gate) -> (x, h, float32 router logits): up to the router, for external routing and
        expert kernels (triton_kernels.route_rows, moe_gemv)
    attn_out(x, o, wo, ln2) -> (x, h): o_proj + residual and the normalised rows, for routing that computes its
        own logits (triton_kernels.route_hidden)
    combine(x, y, weights) -> x: weighted sum of per-slot expert outputs + residual
    final(x, norm, lm_head) -> float32 logits [B, V]
    No host sync anywhere; pos (long [1]) and the RoPE tables stay on the device."""

    def embed(token, table):
        return F.embedding(token, table)

    def pre(x, keys, values, pos, cos_t, sin_t, ln1, wqkv):
        b = x.shape[0]
        h = rms_norm(x, ln1, cfg.eps)
        q, k, v = F.linear(h, wqkv).view(b, 3, cfg.heads, cfg.head_dim).unbind(1)  # [B, heads, d]
        cos, sin = cos_t[pos], sin_t[pos]  # [1, d]
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        keys.index_copy_(2, pos, k[:, :, None])
        values.index_copy_(2, pos, v[:, :, None])
        return q

    def attn_out(x, o, wo, ln2):
        x = x + F.linear(o.reshape(x.shape[0], cfg.hidden), wo)
        return x, rms_norm(x, ln2, cfg.eps)

    def dense(x, o, wo, ln2, w13, w2):
        x, h = attn_out(x, o, wo, ln2)
        return x + F.linear(swiglu(F.linear(h, w13), cfg.inter), w2)

    def moe(x, o, wo, ln2, w13, w2, gate):
        x, h = attn_out(x, o, wo, ln2)
        return mlp(h, w13, w2, gate, cfg, moe_impl, gemv, topk, rows=rows, residual=x)

    def logits_fn(x, o, wo, ln2, gate):
        x, h = attn_out(x, o, wo, ln2)
        return x, h, router_logits(h, gate, gemv)

    def combine_fn(x, y, w):
        return x + combine(y, w)

    def final(x, norm, lm_head):
        return F.linear(rms_norm(x, norm, cfg.eps), lm_head).float()

    return {"embed": embed, "pre": pre, "dense": dense, "moe": moe, "logits": logits_fn, "attn_out": attn_out,
            "combine": combine_fn, "final": final}
