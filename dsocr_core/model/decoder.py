"""DeepseekV2 language model as DeepSeek-OCR uses it (use_mla false): RMSNorm, RoPE, plain MHA, dense SwiGLU
in the first `first_k_dense_replace` layers, then MoE (softmax router, greedy top-k, no renormalisation,
plus one shared SwiGLU expert).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch import nn

from ..spec import ModelSpec
from .kv_cache import KVCache

ATTN_IMPLS = ("eager", "sdpa")


def check_attn_impl(attn_impl: str) -> str:
    if attn_impl not in ATTN_IMPLS:
        raise ValueError(f"attn_impl must be one of {ATTN_IMPLS} for our model, got {attn_impl!r}")
    return attn_impl


# cuDNN attention builds an execution plan for every new sequence length (about 35 ms of CPU time each on an
# H200 with torch 2.11), and a growing KV cache is a new length at every decode step. The LM therefore lets SDPA
# choose only among the flash, memory-efficient and math kernels.
LM_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

class RMSNorm(nn.Module):
    """Weight-only RMSNorm computed in float32, cast back before the weight (Llama convention)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [S, dim] for rotate-half RoPE, computed in float32. A broadcast product (not a matmul),
    so FlopCounterMode sees nothing here."""
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim)
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [S, dim/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def causal_mask(s_q: int, s_kv: int, device) -> torch.Tensor:
    """Boolean [s_q, s_kv], True where query i (at absolute position s_kv - s_q + i) may see key j."""
    return torch.ones(s_q, s_kv, dtype=torch.bool, device=device).tril(diagonal=s_kv - s_q)


class Attention(nn.Module):
    """Llama-style multi-head attention with RoPE; `attn_impl` 'eager' (explicit softmax) or 'sdpa'."""

    def __init__(self, spec: ModelSpec, layer: int, attn_impl: str = "sdpa"):
        super().__init__()
        h = spec.hidden_size
        self.layer = layer
        self.heads, self.head_dim = spec.num_attention_heads, spec.head_dim
        self.attn_impl = check_attn_impl(attn_impl)
        self.q_proj = nn.Linear(h, h, bias=False)
        self.k_proj = nn.Linear(h, h, bias=False)
        self.v_proj = nn.Linear(h, h, bias=False)
        self.o_proj = nn.Linear(h, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        b, s, hidden = x.shape
        q, k, v = (p(x).view(b, s, self.heads, self.head_dim).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q = q * cos + rotate_half(q) * sin  # [B, heads, S, d]
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # [B, heads, L + S, d]
        out = self._eager(q, k, v) if self.attn_impl == "eager" else self._sdpa(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, hidden))

    def _eager(self, q, k, v):
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.head_dim ** -0.5
        if q.shape[-2] > 1:
            mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.matmul(probs, v)

    def _sdpa(self, q, k, v):
        s_q, s_kv = q.shape[-2], k.shape[-2]
        with sdpa_kernel(LM_SDPA_BACKENDS):
            if s_q == s_kv:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            if s_q == 1:  # one new token sees the whole cache
                return F.scaled_dot_product_attention(q, k, v)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(s_q, s_kv, q.device))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), no bias. Dense layers, routed experts and the shared expert."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def meta_routing(tokens: int, k: int, experts: int) -> torch.Tensor:
    """Routing stand-in on the meta device (no values there): token t -> experts (t*k + j) mod E, j < k.
    Each token still reaches k distinct experts, so FLOPs equal those of any real routing. On CPU."""
    return (torch.arange(tokens)[:, None] * k + torch.arange(k)[None, :]) % experts


class MoEGate(nn.Module):
    """Router: fp32 logits x @ W^T, fp32 softmax, greedy top-k, optional renorm (off), times the scale."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.k = spec.num_experts_per_tok
        self.norm_topk_prob = spec.norm_topk_prob
        self.scale = spec.routed_scaling_factor
        self.weight = nn.Parameter(torch.zeros(spec.n_routed_experts, spec.hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> weights [T, k] float32, expert ids [T, k] int64."""
        logits = x.float() @ self.weight.float().t()  # [T, E]
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(scores, self.k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.scale, ids


class MoE(nn.Module):
    """Routed experts grouped by expert (each expert that got tokens runs once on its slice) + shared expert.

    y = (sum_k w_k * expert_k(x), accumulated in float32, cast to the activation dtype) + shared(x)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.k = spec.num_experts_per_tok
        self.gate = MoEGate(spec)
        self.experts = nn.ModuleList(MLP(spec.hidden_size, spec.moe_intermediate_size) for _ in range(spec.n_routed_experts))
        self.shared_experts = MLP(spec.hidden_size, spec.shared_intermediate_size) if spec.n_shared_experts else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # [T, H]
        weights, ids = self.gate(flat)
        y = self.routed(flat, weights, ids).to(x.dtype)
        if self.shared_experts is not None:
            y = y + self.shared_experts(flat)
        return y.view(shape)

    def routed(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [T, H], weights/ids [T, k] -> float32 [T, H] weighted sum of the chosen experts' outputs."""
        t, k = ids.shape
        flat_ids = meta_routing(t, k, len(self.experts)).reshape(-1) if ids.is_meta else ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)  # (token, slot) pairs sorted by expert
        counts = torch.bincount(flat_ids, minlength=len(self.experts)).tolist()  # host sync on GPU
        order = order.to(x.device)
        token = order // k
        out = x.new_empty(t * k, x.shape[-1])  # one row per (token, slot), written exactly once
        start = 0
        for e, n in enumerate(counts):
            if n:
                rows = slice(start, start + n)
                out[order[rows]] = self.experts[e](x[token[rows]])
                start += n
        # fixed-order fp32 sum over the k slots (deterministic, unlike atomic index_add on GPU)
        return (out.view(t, k, -1).float() * weights.unsqueeze(-1)).sum(dim=1)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int, attn_impl: str = "sdpa"):
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec, layer, attn_impl)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        dense = layer < spec.first_k_dense_replace
        self.mlp = MLP(spec.hidden_size, spec.intermediate_size) if dense else MoE(spec)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))
