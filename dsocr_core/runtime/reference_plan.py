"""The reference engine's kernel plan (runtime/engine.py ReferenceEngine over dsocr_core/model): which kernels
one call of each analytic row launches when our PyTorch model runs as written, eagerly, op by op.

Launch counts follow the model's code: 8 ops per RMSNorm, RoPE as 5 ops on q and on k, eager attention's
matmul / scale / mask / float / softmax / cast / matmul, a Python loop over the experts that received tokens after
a host synchronisation for their counts, the cache's torch.cat (which rewrites each layer's whole cache every
decode step), SAM's dense relative-position mask. Every op is issued from the host (no graphs). Torch-free: the
time model reads this without loading torch (analytic/kernels.py has the vocabulary).

The counts are those of the kernel-launching aten ops the model dispatches (runtime/op_count.py counts them;
tests/test_reference_plan_ops.py holds the plan to them per stage). Ops that only make a view (view, permute,
transpose, slicing, a reshape of a contiguous tensor) and allocations launch nothing and are not counted here;
a reshape or .contiguous() of a non-contiguous tensor is a copy and is. The rows' comments say what each number
is.
"""
from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict

from ..analytic.kernels import (CAST, EVERY_ROW, FP32, GATHER, INDEX_PUT, Call, Kernel, Plan, casts, clip_attention,
                                clip_mlp, common_vision, eager_ops, eager_rms_norm, eager_rope, kv_write, layout,
                                lm_attention, lm_head_and_cast, observed_loads, patch_embed, routed_experts, router,
                                sam_attention, sam_mlp, swiglu, whole)
from ..analytic.vision import sam_out_side, sam_patches

# RoPE tables (model/decoder.py rope_cos_sin, once per LM call): positions and frequency aranges, /dim, theta **,
# 1.0 / (reciprocal and a product), positions.float(), the outer product, cat, cos, sin, and two casts to the model's
# dtype (none in a float32 model)
ROPE_TABLE_OPS, ROPE_TABLE_CASTS = 13, 2
# greedy token choice after a step (runtime/generate.py next_tokens): the n-gram ban's window compare, all,
# clamp, full_like, where, zeros, scatter_, masked_fill (8), argmax, the finished rows' full_like and where, the
# EOS compare and |=, the history write (6)
TOKEN_CHOICE_OPS = 14


def rope_table_ops(c: Call) -> float:
    """The RoPE tables' launches in this call's dtype."""
    return ROPE_TABLE_OPS - ROPE_TABLE_CASTS * (1 - casts(c))


class ReferenceOptions(BaseModel):
    """The reference engine has no options: it is the model as written."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def resolved(self, device_kind: str) -> "ReferenceOptions":
        return self


class ReferencePlan:
    graphs = False  # every op is launched eagerly from the host
    # nothing is fused: a row's GEMMs cannot hide its elementwise kernels' traffic (SAM's and CLIP's GELU, the
    # residual adds), each kernel takes its own roofline. With the row's overlap credit the reference SAM was 3-4
    # points more under-predicted on every H100 set (docs/accuracy.md)
    separate_rows = EVERY_ROW
    # its host ops are our model's own code: priced at the profile's host cost per op of that code by stage, where
    # the profile has it (calibration/host_stages.py), not at the tiny op mixes' costs
    host_costs_by_stage = True
    notes: tuple[str, ...] = ()

    def __init__(self, options: ReferenceOptions, device_kind: str):
        self.options, self.device_kind = options, device_kind

    def decode_paths(self, b, spec) -> np.ndarray:
        return np.full(np.shape(b), "")  # one path at every batch size

    def plan(self, c: Call) -> Plan:
        if c.phase == "vision":
            return _vision(c)
        if c.phase == "layout":
            return _layout(c)
        k = c.kind
        if k == "lm.self_attn":
            return _attention(c)
        if k in ("lm.input_layernorm", "lm.post_attention_layernorm", "lm.norm"):
            return eager_rms_norm(c, c.b * c.sq * c.spec.hidden_size)
        if k.startswith("lm.mlp"):
            return _mlp(c)
        if k == "lm.embed_tokens":
            if c.phase == "decode":
                # a decode step outside the layers: the embedding lookup, the RoPE tables, the token choice
                return Plan(rest_launches=1 + rope_table_ops(c) + TOKEN_CHOICE_OPS)
            # the lookup; per image row mask.sum() (read on the host: a sync) and masked_scatter, then one stack; the
            # RoPE tables (the last-position logits slice is a view)
            scatter = np.where(np.asarray(c.img) > 0, 1.0, 0.0)
            return Plan(rest_launches=1 + scatter * (2 * c.b + 1) + rope_table_ops(c), syncs=scatter * c.b)
        if k == "lm.lm_head":
            return lm_head_and_cast(c)
        raise KeyError(k)


# The projector stage's views (runtime/op_count.py counts them; tests/test_reference_plan_ops.py holds these): the
# stage is a few launches per image, so its Python views are a third of its host time (an H200's host: one image's
# layout 37 us, of which its two cats 27 us, docs/accuracy.md). DeepSeek-OCR per projector call: the CLS slice,
# SAM's map flattened and transposed, the Linear's views and weight transpose; per image the global view's select,
# its grid reshaped, the newline expanded, the rows flattened, view_seperator unsqueezed, and a tiled image's
# stitching (view, permute, the reshape copy's view) and its own newline and flatten. DeepSeek-OCR 2 per call the
# Linear's three; per image the select and unsqueeze, and a tiled image's features flattened.
PROJECTOR_VIEWS = {"deepseek-ocr": 6, "deepseek-ocr2": 3}  # per projector call, by model family
LAYOUT_VIEWS = {"deepseek-ocr": (5, 5), "deepseek-ocr2": (2, 1)}  # per image, per tiled image


def _layout(c: Call) -> Plan:
    plan = layout(c)
    per_image, per_tiled = LAYOUT_VIEWS[type(c.spec).family]
    plan.view_ops = per_image * c.images + per_tiled * c.tiled
    return plan


def _vision(c: Call) -> Plan:
    s, calls, kind = c.spec, c.calls, c.kind
    if kind == "projector":
        plan = common_vision(c)
        plan.view_ops = PROJECTOR_VIEWS[type(s).family] * calls
        return plan
    if kind.startswith("encoder."):  # DeepSeek-OCR 2's encoder (its SAM and projector rows are planned below)
        from ..analytic.kernels_v2 import plan_encoder

        return plan_encoder(c)
    if kind.startswith("sam.norm"):  # the stream copied to rows (LayerNorm's input must be contiguous), the norm
        plan = common_vision(c)
        copy = _sam_stream(c, PERMUTED_COPY)
        copy.host_ops = 0.0  # launched inside native_layer_norm (its input made contiguous), no op of its own
        plan.kernels.insert(0, copy)
        return plan
    if kind.startswith("sam.mlp"):  # GELU, then the residual add on the stream
        plan = sam_mlp(c, elementwise=1)
        plan.kernels.append(_sam_stream(c, PERMUTED_ADD, share=True))
        return plan
    shared = common_vision(c)
    if shared is not None:
        return shared
    if kind == "sam.patch_embed":
        # one nn.Conv2d: cuDNN runs this 3-channel, stride-16 bf16 conv on implicit_convolve_sgemm, about 40 times
        # its GEMM's time on an H100 (docs/accuracy.md), so it has its own table (the GEMM's where a profile lacks it)
        return patch_embed(c, 1, table="conv")
    if kind == "sam.pos_embed":  # the add (onto the stream); resized off the learned grid: float, bicubic, cast back
        add = _sam_stream(c, PERMUTED_ADD)
        add.flops, add.nbytes, add.real_bytes = c.cost.flops, c.cost.bytes, None  # the whole row (the table once)
        return Plan([add], rest_launches=calls * (1 + 2 * casts(c)) * (sam_patches(s, c.side) != s.sam_pos_grid))
    if kind.startswith("clip.layer_norm"):
        return whole("memory.norm", dict(bytes=c.cost.bytes), c, calls)
    if kind.startswith("sam.attn"):
        return _sam_attention(c)
    if kind == "clip.embeddings":  # CLS concatenated, positions added; resized: float, bicubic, cast back, CLS row
        g = sam_out_side(s, c.side)
        return Plan(rest_launches=calls * (2 + (2 + 2 * casts(c)) * (g != s.clip_pos_grid)))
    if kind == "clip.self_attn":  # residual add; the head merge is a view (SDPA's output is laid out [b, n, heads, d])
        p = clip_attention(c)
        p.rest_launches = calls * 1.0
        return p
    if kind == "clip.mlp":
        return clip_mlp(c, 4)  # quick_gelu (3 ops), residual add
    raise KeyError(kind)


# SAM's residual stream (model/sam.py): the patch embedding's conv output permuted to channels last is a view, and
# an add keeps its first operand's layout, so the stream stays channels first in memory through every block. Each
# LayerNorm first copies it to contiguous rows, and each residual add (and the position add) reads one operand
# across the channel stride: both run far below a contiguous kernel's bandwidth (Base at batch 16 on an H100: 0.38
# ms per norm copy and 0.39 ms per add of a 100 MB stream, docs/accuracy.md), priced on their own tables
PERMUTED_COPY, PERMUTED_ADD = "memory.permuted_copy", "memory.permuted_add"


def _sam_stream(c: Call, table: str, share: bool = False) -> Kernel:
    """One kernel over the views' whole residual stream per call: the norm's copy (read, write: engine work, none in
    the analytic count) or an add (read both, write; `share`: the residual add the analytic row counts)."""
    s, calls = c.spec, c.calls
    elements = c.views * sam_patches(s, c.side) ** 2 * s.sam_width
    moved = (2 if table == PERMUTED_COPY else 3) * elements * c.dt
    per_launch = moved / np.maximum(calls, 1.0)
    if share:
        return Kernel(table, dict(bytes=per_launch), elements, moved, calls, real_bytes=moved)
    return Kernel(table, dict(bytes=per_launch), 0.0, 0.0, calls, real_bytes=moved)


def _sam_attention(c: Call) -> Plan:
    """One SAM attention call (model/sam.py SamAttention) with its block's window partition and residual add.
    Kernels: the qkv and output Linears, one bmm per relative-position einsum, the broadcast add building the dense
    bias (the mask), the bias reshaped to [L, L] (a copy: the broadcast sum keeps the einsums' strides; priced
    with its bytes) and SDPA. Besides them: q reshaped per head (a copy of a permuted view), the first einsum's
    input made contiguous,
    8 ops per relative-position table (two aranges, two scales, the difference, the offset, the long cast, the
    gather) on each axis plus 3 when the table is resized (float, interpolate, cast back); the residual add on
    the stream (_sam_stream);
    windowed blocks also copy in window_partition and window_unpartition, and when the grid is padded, F.pad and
    the crop's .contiguous()."""
    a = sam_attention(c, einsum_launches=2)
    glob = c.kind.endswith("global")
    copies = 2  # q per head, the first einsum's input (small: one head's q)
    tables = 2 * (8 + (1 + 2 * casts(c)) * a.resized)
    windows = 0 if glob else 2 + 2 * a.padded
    add = _sam_stream(c, PERMUTED_ADD, share=True)  # the block's residual add
    return Plan(a.gemms + [a.mask, a.mask_copy, a.sdpa, add], rest_launches=c.calls * (copies + tables + windows))


def _attention(c: Call) -> Plan:
    s, dt = c.spec, c.dt
    h = s.hidden_size
    b, sq, n = c.b, c.sq, c.n
    t, sk = b * sq, n + sq
    prefill = c.phase == "prefill"
    attn = lm_attention(c, c.attn)
    # eager: matmul, scale, (causal mask: ones, tril, not, masked_fill), float, softmax, cast, matmul (the float and
    # the cast launch nothing in a float32 model)
    attn.launches = (10 if prefill else 6) - 2 * (1 - casts(c)) if c.attn == "eager" else 1
    kv = kv_write(c)
    if prefill:
        kv.real_bytes = 0.0  # the first call appends to an empty cache: no copy
    else:  # torch.cat rewrites the layer's whole cache: read old + new, write all
        kv.real_bytes = 2 * b * sk * 2 * h * dt
        kv.coords = dict(bytes=kv.real_bytes)
    proj = Kernel("gemm", dict(m=t, n=h, k=h), 8 * t * h * h, 4 * (2 * t * h + h * h) * dt, 4.0, by_batch=True)
    # RoPE on q and k (5 ops each on the transposed [b, heads, s, d] views: 2 products with cos / sin broadcast,
    # neg and cat of the halves, the add; 5.5 reads and 4.5 writes an element, analytic/lm.py), then the residual
    # add (the remainder). The head merge is a view of SDPA's output (laid out [b, s, heads, d]), a copy of eager
    # attention's in a prefill; eager's matmuls there also copy q, k and v (views [b, s, heads, d] transposed) when
    # the batch cannot fold into the heads without one (b > 1)
    rope = eager_rope(c, 2 * t * h)  # q and k, each t x h
    copies = 0.0
    if c.attn == "eager" and prefill:
        copies = 1.0 + np.where(np.asarray(b) > 1, 3.0, 0.0)
    return Plan([proj, attn, kv, rope], rest_launches=1 + copies, rest_by_batch=True)


def _mlp(c: Call) -> Plan:
    s = c.spec
    if c.kind in ("lm.mlp.dense", "lm.mlp.shared_experts"):
        gu, down = swiglu(c, s.intermediate_size if c.kind == "lm.mlp.dense" else s.shared_intermediate_size)
        gu.real_bytes = None  # gate and up are two GEMMs reading x each: the analytic count
        return Plan([gu, down], rest_launches=3.0)  # SiLU, product, residual add (or y + shared)
    if c.kind == "lm.mlp.gate":  # x.float() (its own kernel), then W.float(), softmax, topk, * scale
        cast = casts(c)
        x_cast = [eager_ops(CAST, c.b * c.sq * s.hidden_size * (c.dt + FP32), 1.0)] if cast else []
        return Plan([router(c), *x_cast], rest_launches=3.0 + cast)
    if c.kind == "lm.mlp.experts":  # a Python loop over the experts that got tokens, after a host sync
        r = routed_experts(c)
        gu, down, e_act = r.gu, r.down, r.touched
        gu.real_bytes = None
        r.read_routed_weights()
        gu.coords, down.coords = dict(m=r.per, n=s.moe_intermediate_size, k=s.hidden_size), \
            dict(m=r.per, n=s.hidden_size, k=s.moe_intermediate_size)
        gu.launches, down.launches = 2 * e_act, e_act
        # argsort, bincount (read with .tolist(): the sync), order // k; per expert the token gather and the
        # index_put_ (kernels of their own: each moves its expert's rows, read and written), SiLU and product
        # (beside its 3 GEMMs); then .float() and * weights (kernels of their own), sum, the cast back and the
        # layer's residual add (the y + shared add is the shared expert's). view_ops: per expert the Python slice
        # and its two views.
        rows = c.b * c.sq * s.num_experts_per_tok * s.hidden_size  # elements of the (token, slot) rows
        cast = casts(c)
        eager = [eager_ops(GATHER, 2 * rows * c.dt, e_act), eager_ops(INDEX_PUT, 2 * rows * c.dt, e_act),
                 eager_ops(CAST, 2 * rows * FP32, 1.0)]
        if cast:
            eager.append(eager_ops(CAST, rows * (c.dt + FP32), 1.0))
        return Plan([gu, down, *eager], rest_launches=3 + 2 * e_act + 2 + cast, syncs=1.0, view_ops=3 * e_act,
                    segments=expert_segments(c))
    raise KeyError(c.kind)


def expert_segments(c: Call):
    """The expert loop as one serial segment per rank of expert (Plan.segments), where the routing recorded each
    rank's rows (analytic/kernels.py observed_loads): each touched rank an equal share of the loop's host ops, and a
    share of its device time by its rows. The predictor then adds up each segment's excess of host over device time,
    as if every expert's ops finished before the next expert's were issued.

    An empirical model, not the loop's mechanism: the loop (model/decoder.py MoE.routed) synchronises once, before it
    starts, and a pure pipeline of the host's issue and the GPU's run in expert order predicts what one segment
    predicts (the larger of the two sums), which left the H200's LM prefill 14-23% under (seeds 94-96). One segment per
    expert took those sets to 6-16%, and the sets measured after it was frozen confirmed it (seeds 97-100,
    docs/accuracy.md, "The reference expert loop one expert at a time"); what holds the GPU back between experts is
    not established. Two simplifications of the frozen model, kept as measured: the host ops are split over every
    rank the recorded mean load shape touches (more than the distinct experts the plan's launches count at small
    calls), and every device second, the launches' and the casts after the loop included, is split by rows. Either
    alternative (the host ops over the distinct experts; the launches split evenly) predicted seeds 97, 99 and 100
    0.3-2.8 points worse (median), tried after they were measured. Points whose token count the
    loads were not recorded at take equal shares (one segment's result); None where no point has loads."""
    rows = observed_loads(c)
    if rows is None:
        return None
    known = np.isfinite(rows).all(-1, keepdims=True)
    if not known.any():
        return None
    rows = np.where(known, rows, 1.0)  # unknown points: equal rows, i.e. one segment's split (no change)
    touched = rows > 0
    host = touched / np.maximum(touched.sum(-1, keepdims=True), 1)
    device = rows / np.maximum(rows.sum(-1, keepdims=True), 1e-30)
    return host, device
