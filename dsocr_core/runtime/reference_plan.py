"""The reference engine's kernel plan (runtime/engine.py ReferenceEngine over dsocr_core/model): which kernels
one call of each analytic row launches when our PyTorch model runs as written, eagerly, op by op.

Launch counts follow the model's code: 8 ops per RMSNorm, RoPE as 5 ops on q and on k, eager attention's
matmul / scale / mask / float / softmax / cast / matmul, a Python loop over the experts that received tokens after
a host synchronisation for their counts, the cache's torch.cat (which rewrites each layer's whole cache every
decode step), SAM's dense relative-position mask. Every op is issued from the host (no graphs). Torch-free: the
time model reads this without loading torch (analytic/kernels.py has the vocabulary).
"""
from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict

from ..analytic.kernels import (Call, Kernel, Plan, clip_attention, clip_mlp, common_vision, kv_write, layout,
                                lm_attention, lm_head, patch_embed, routed_experts, router, sam_attention, swiglu,
                                whole)
from ..analytic.vision import sam_out_side, sam_patches

STEP_OPS = 18  # a decode step outside the layers: token choice, history, positions, RoPE tables
PREFILL_OPS = 12  # the LM prefill outside the layers: positions, RoPE tables, logits slicing


class ReferenceOptions(BaseModel):
    """The reference engine has no options: it is the model as written."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def resolved(self, device_kind: str) -> "ReferenceOptions":
        return self


class ReferencePlan:
    graphs = False  # every op is launched eagerly from the host
    fused_decode_b1 = False
    notes: tuple[str, ...] = ()

    def __init__(self, options: ReferenceOptions, device_kind: str):
        self.options, self.device_kind = options, device_kind

    def plan(self, c: Call) -> Plan:
        if c.phase == "vision":
            return _vision(c)
        if c.phase == "layout":
            return layout(c)
        k = c.kind
        if k == "lm.self_attn":
            return _attention(c)
        if k in ("lm.input_layernorm", "lm.post_attention_layernorm", "lm.norm"):
            return Plan(rest_launches=8.0)  # float, pow, mean, + eps, rsqrt, *, to, * weight
        if k.startswith("lm.mlp"):
            return _mlp(c)
        if k == "lm.embed_tokens":
            if c.phase == "decode":
                return Plan(rest_launches=STEP_OPS)
            scatter = np.where(np.asarray(c.img) > 0, 1.0, 0.0)
            return Plan(rest_launches=1 + scatter * (3 * c.b + 1) + PREFILL_OPS)
        if k == "lm.lm_head":
            return Plan([lm_head(c)], rest_launches=1.0)  # .float()
        raise KeyError(k)


def _vision(c: Call) -> Plan:
    s, calls, kind = c.spec, c.calls, c.kind
    if kind.startswith("encoder."):  # DeepSeek-OCR 2's encoder (its SAM and projector rows are planned below)
        from ..analytic.kernels_v2 import plan_encoder

        return plan_encoder(c)
    shared = common_vision(c)
    if shared is not None:
        return shared
    if kind == "sam.patch_embed":
        return patch_embed(c, 1)  # one conv
    if kind == "sam.pos_embed":  # interpolated (6 ops) when the grid is not the learned one
        return Plan(rest_launches=calls * (1 + 6 * (sam_patches(s, c.side) != s.sam_pos_grid)))
    if kind.startswith("clip.layer_norm"):
        return whole("memory.norm", dict(bytes=c.cost.bytes), c, calls)
    if kind.startswith("sam.attn"):
        a = sam_attention(c, einsum_launches=4)
        glob = kind.endswith("global")
        rest = (5 + 2 * a.padded) if not glob else 3  # partition, q copy, head merge, un-partition, crop, residual
        rest += 6 + 8 * a.resized  # relative-position tables (resized when the grid differs from the learned one)
        return Plan(a.gemms + [a.mask, a.sdpa], rest_launches=calls * rest)
    if kind == "clip.embeddings":
        g = sam_out_side(s, c.side)
        return Plan(rest_launches=calls * (2 + 6 * (g != s.clip_pos_grid)))
    if kind == "clip.self_attn":
        return clip_attention(c)
    if kind == "clip.mlp":
        return clip_mlp(c, 4)  # quick_gelu (3 ops), residual add
    raise KeyError(kind)


def _attention(c: Call) -> Plan:
    s, dt = c.spec, c.dt
    h = s.hidden_size
    b, sq, n = c.b, c.sq, c.n
    t, sk = b * sq, n + sq
    prefill = c.phase == "prefill"
    attn = lm_attention(c, c.attn)
    attn.launches = (10 if prefill else 6) if c.attn == "eager" else 1  # eager: matmul, scale, (mask), float, ...
    kv = kv_write(c)
    if prefill:
        kv.real_bytes = 0.0  # the first call appends to an empty cache: no copy
    else:  # torch.cat rewrites the layer's whole cache: read old + new, write all
        kv.real_bytes = 2 * b * sk * 2 * h * dt
        kv.coords = dict(bytes=kv.real_bytes)
    proj = Kernel("gemm", dict(m=t, n=h, k=h), 8 * t * h * h, 4 * (2 * t * h + h * h) * dt, 4.0, by_batch=True)
    return Plan([proj, attn, kv], rest_launches=12, rest_by_batch=True)  # RoPE (5 ops each), merge, residual


def _mlp(c: Call) -> Plan:
    s = c.spec
    if c.kind in ("lm.mlp.dense", "lm.mlp.shared_experts"):
        gu, down = swiglu(c, s.intermediate_size if c.kind == "lm.mlp.dense" else s.shared_intermediate_size)
        gu.real_bytes = None  # gate and up are two GEMMs reading x each: the analytic count
        return Plan([gu, down], rest_launches=3.0)  # SiLU, product, residual add (or y + shared)
    if c.kind == "lm.mlp.gate":
        return Plan([router(c)], rest_launches=5.0)  # x.float(), W.float(), softmax, topk, * scale
    if c.kind == "lm.mlp.experts":  # a Python loop over the experts that got tokens, after a host sync
        r = routed_experts(c)
        gu, down, e_act = r.gu, r.down, r.touched
        gu.real_bytes = None
        r.read_routed_weights()
        gu.coords, down.coords = dict(m=r.per, n=s.moe_intermediate_size, k=s.hidden_size), \
            dict(m=r.per, n=s.hidden_size, k=s.moe_intermediate_size)
        gu.launches, down.launches = 2 * e_act, e_act
        return Plan([gu, down], rest_launches=4 + 4 * e_act + 5, syncs=1.0, host_ops=3 * e_act)
    raise KeyError(c.kind)
