"""Kernel plans: which kernels run one call of an analytic row, in each session mode.

A plan splits the row's analytic work (its FLOPs F and bytes B, per call part) over the kernels that do it:
each explicit kernel names the profile table that times it (gemm, attention, grouped_gemm, memory.<kind>), the
shape it is looked up at, its SHARE of the row's F and B, how many launches it takes and how many eager host ops
issue it. Whatever F and B the explicit kernels do not take is the remainder: elementwise work (norm arithmetic,
RoPE, copies, residual adds, routing index math) timed on the memory.elementwise table over `rest_launches`
kernels. Shares partition the row exactly, so with every efficiency 1 the kernels' excess over their rooflines
is 0 and the prediction is the roofline (analytic/predict.py).

`real_flops` / `real_bytes` are the work the mode's engine really does where it differs from the analytic count
(which is the eager reference's op-by-op traffic): the reference cache's torch.cat rewrites the whole cache every
decode step; the fast engine folds SAM's relative-position bias into q/k (no dense mask, a padded head dim),
fuses norms, RoPE and SwiGLU into single kernels, attends over a 256-slot bucket of its static cache, and at
batch 1 runs the fused decode step (5 kernels for the dense layer, 6 per MoE layer, the lm_head with the greedy
choice). predict.py uses them with work="engine" (the default) and ignores them with work="analytic".

Launch counts follow the code (dsocr_core/model for the reference, dsocr_core/fast for the fast engine); the
fast engine's counts outside the fused batch-1 step are estimates of what Inductor emits (docs/time-model.md says
how to check them with the profiler). Nothing here is fitted to measured times.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..registry import family_of, fast_engine_models
from ..spec import SpecError
from .cost import Cost
from .lm import expected_experts
from .vision import SOFTMAX_FLOPS, clip_tokens, conv_out, sam_out_side, sam_patches

FP32 = 4
DECODE_BUCKET = 256  # the fast engine's static-cache length bucket (fast/engine.py)
REF_STEP_OPS = 18  # reference decode step outside the layers: token choice, history, positions, RoPE tables
REF_PREFILL_OPS = 12  # reference prefill outside the layers: positions, RoPE tables, logits slicing
FAST_STEP_OPS = 7  # fast decode at batch > 1: the greedy choice and history update outside the graph
# the fused batch-1 step's own kernels (fast/decode_kernels.py) have their own tables; a profile without them (a
# CPU, or one measured before they existed) falls back to memory.gemv / attention.flash (predict._candidates)
FUSED_GEMV, FUSED_ATTENTION = "memory.fused_gemv", "memory.fused_attention"


@dataclass
class Kernel:
    table: str  # gemm | gemm.float32 | grouped_gemm | attention.<impl>[.causal] | memory.<kind>
    coords: dict[str, Any]
    flops: Any  # share of the row's FLOPs (per call)
    nbytes: Any  # share of the row's bytes (per call)
    launches: Any = 1.0
    host_ops: Any = None  # eager ops issuing it (None: = launches where the mode runs eagerly, else 0)
    real_flops: Any = None  # what the engine really does (None: the share)
    real_bytes: Any = None
    by_batch: bool = False  # in a decode step its work and shape depend on the batch only (not the context)


@dataclass
class Plan:
    kernels: list[Kernel] = field(default_factory=list)
    rest_launches: Any = 0.0
    rest_real_bytes: Any = None  # engine bytes of the remainder (None: its share)
    rest_table: str = "memory.elementwise"
    rest_by_batch: bool = False  # the remainder's work depends on the batch only in a decode step
    syncs: Any = 0.0  # host synchronisations per call
    graph_launches: Any = 0.0  # CUDA-graph replays per call
    host_ops: Any = 0.0  # eager host ops that launch nothing counted above (Python work, views)


@dataclass
class Call:
    """What a plan function sees: the row kind, one call part's cost and shape context, and the mode."""

    kind: str
    cost: Cost
    ctx: dict
    mode: str  # reference | fast
    fused: bool  # the fast engine's fused batch-1 decode step

    @property
    def fast(self) -> bool:
        return self.mode == "fast"

    def __getattr__(self, name):  # ctx entries as attributes (b, sq, n, views, side, dt, spec, ...)
        try:
            return self.__dict__["ctx"][name]
        except KeyError:
            raise AttributeError(name) from None


def whole(table: str, coords: dict, c: Call, launches=1.0, real_bytes=None) -> Plan:
    """The whole row is one kernel (convolutions, LayerNorms)."""
    return Plan([Kernel(table, coords, c.cost.flops, c.cost.bytes, launches, real_bytes=real_bytes)])


# -------------------------------------------------------------------------------------------------- vision
def _sam_attn(c: Call) -> Plan:
    s, v, calls, dt = c.spec, c.views, c.calls, c.dt
    p, w, heads = sam_patches(s, c.side), s.sam_width, s.sam_heads
    d = w // heads
    glob = c.kind.endswith("global")
    if glob:
        span, groups, rel_side = p, 1, s.sam_pos_grid
    else:
        win = s.sam_window
        span, groups, rel_side = win, (-(-p // win)) ** 2, win
    seq = span * span
    n = groups * seq
    scores = groups * heads * seq * seq
    rel = 2 * groups * heads * seq * span
    rel_params = 2 * (2 * rel_side - 1) * d
    padded = (not glob) and (-(-p // s.sam_window) * s.sam_window != p)
    resized = glob and p != s.sam_pos_grid
    k = [
        Kernel("gemm", dict(m=v * n, n=3 * w, k=w), v * 2 * n * w * 3 * w,
               v * 4 * n * w * dt + calls * (3 * w * w + 3 * w) * dt, calls),  # qkv
        Kernel("gemm", dict(m=v * n * heads, n=span, k=d), v * 2 * n * w * 2 * span,
               v * (2 * n * w + rel) * dt + calls * rel_params * dt, calls * (2 if c.fast else 4)),  # rel einsums
        Kernel("gemm", dict(m=v * n, n=w, k=w), v * 2 * n * w * w,
               v * 2 * n * w * dt + calls * (w * w + w) * dt, calls),  # proj
    ]
    mask = Kernel("memory.elementwise", dict(bytes=v * (rel + scores) * dt), v * scores, v * (rel + scores) * dt,
                  calls)  # rel_h + rel_w broadcast into the dense [L, L] mask
    sdpa = Kernel("attention.sdpa_bias", dict(bh=v * groups * heads, q=seq, k=seq, d=d),
                  v * (4 * n * seq * w + SOFTMAX_FLOPS * scores), v * (4 * n * w + scores) * dt, calls)
    if c.fast:  # bias folded into q/k: [scale*q, rel_h, rel_w] . [k, onehot rows, onehot cols], padded to 8
        dq = -(-(d + 2 * span) // 8) * 8
        mask.real_flops = 0.0
        mask.real_bytes = v * (2 * n * w + rel + 2 * n * heads * dq) * dt  # read q, k, rel; write q', k'
        mask.launches = calls * 3
        mask.coords = dict(bytes=mask.real_bytes)
        sdpa.table = "attention.sdpa"  # a flash kernel, no mask; q/k head dim dq, v keeps d
        sdpa.coords = dict(bh=v * groups * heads, q=seq, k=seq, d=(dq + d) / 2)
        sdpa.real_flops = v * (2 * scores * (dq + d) + SOFTMAX_FLOPS * scores)
        sdpa.real_bytes = v * n * heads * (2 * dq + 2 * d) * dt
        rest = 3
    else:
        rest = (5 + 2 * padded) if not glob else 3  # partition, q copy, head merge, un-partition, crop, residual
        rest += 6 + 8 * resized  # relative-position tables (resized when the grid differs from the learned one)
    return Plan(k + [mask, sdpa], rest_launches=calls * rest)


def _sam_mlp(c: Call) -> Plan:
    s, v, calls, dt = c.spec, c.views, c.calls, c.dt
    t, w, m = sam_patches(s, c.side) ** 2, s.sam_width, s.sam_mlp_dim
    return Plan([
        Kernel("gemm", dict(m=v * t, n=m, k=w), v * 2 * t * w * m, v * (t * w + t * m) * dt + calls * (w * m + m) * dt,
               calls),
        Kernel("gemm", dict(m=v * t, n=w, k=m), v * 2 * t * w * m, v * (t * m + t * w) * dt + calls * (m * w + w) * dt,
               calls),
    ], rest_launches=calls * 2)  # GELU, residual add


def _sam_neck(c: Call) -> Plan:
    s, v, calls, dt = c.spec, c.views, c.calls, c.dt
    t, w, nd = sam_patches(s, c.side) ** 2, s.sam_width, s.sam_neck_dim
    return Plan([
        Kernel("gemm", dict(m=v * t, n=nd, k=w), v * 2 * t * w * nd, v * (t * w + t * nd) * dt + calls * w * nd * dt,
               calls),  # 1x1 conv
        Kernel("gemm", dict(m=v * t, n=nd, k=9 * nd), v * 2 * t * nd * nd * 9,
               v * 2 * t * nd * dt + calls * 9 * nd * nd * dt, calls),  # 3x3 conv
    ], rest_launches=calls * 20)  # two LayerNorm2d, ten ops each (the neck runs eagerly in both modes)


def _vision(c: Call) -> Plan:
    s, v, calls, kind = c.spec, c.views, c.calls, c.kind
    if kind.startswith("encoder."):  # DeepSeek-OCR 2's encoder (its SAM and projector rows are planned below)
        from .kernels_v2 import plan_encoder

        return plan_encoder(c)
    p = sam_patches(s, c.side)
    if kind == "sam.patch_embed":  # a conv (reference), one GEMM over the patches (fast)
        return whole("gemm", dict(m=v * p * p, n=s.sam_width, k=3 * s.sam_patch ** 2), c,
                     calls * (2 if c.fast else 1))
    if kind == "sam.pos_embed":
        return Plan(rest_launches=calls * (1 + (0 if c.fast else 6 * (p != s.sam_pos_grid))))
    if kind.startswith("clip.layer_norm") and c.fast:  # inside the packed layer: one norm over all groups' rows
        share = _clip_share(c, clip_tokens(s, c.side) * v)
        return whole("memory.norm", dict(bytes=np.where(share > 0, c.cost.bytes / np.maximum(share, 1e-12),
                                                        c.cost.bytes)), c, share)
    if kind.startswith(("sam.norm", "clip.layer_norm", "clip.pre_layrnorm")):
        return whole("memory.norm", dict(bytes=c.cost.bytes), c, calls)
    if kind.startswith("sam.attn"):
        return _sam_attn(c)
    if kind.startswith("sam.mlp"):
        return _sam_mlp(c)
    if kind == "sam.neck":
        return _sam_neck(c)
    if kind in ("sam.net_2", "sam.net_3"):
        which = 0 if kind == "sam.net_2" else 1
        n_in = p if which == 0 else conv_out(p)
        c_in = s.sam_neck_dim if which == 0 else s.sam_downsample[0]
        o = conv_out(n_in)
        return whole("gemm", dict(m=v * o * o, n=s.sam_downsample[which], k=9 * c_in), c, calls)
    if kind == "projector":  # both families: one Linear per feature (v1: CLIP+SAM concatenated, v2: queries)
        dt = c.dt
        f, h, din = sam_out_side(s, c.side) ** 2, s.hidden_size, s.projector_input_dim
        return Plan([Kernel("gemm", dict(m=v * f, n=h, k=din), v * 2 * f * din * h,
                            v * (f * din + f * h) * dt + calls * (din * h + h) * dt, calls)],
                    rest_launches=calls * 2)  # SAM features flattened, concatenation
    n, cw, dt = clip_tokens(s, c.side), s.clip_width, c.dt
    if kind == "clip.embeddings":
        g = sam_out_side(s, c.side)
        return Plan(rest_launches=calls * (2 + (0 if c.fast else 6 * (g != s.clip_pos_grid))))
    if kind == "clip.self_attn":
        heads = s.clip_heads
        plan = Plan([
            Kernel("gemm", dict(m=v * n, n=3 * cw, k=cw), v * 6 * n * cw * cw,
                   v * 4 * n * cw * dt + calls * (3 * cw * cw + 3 * cw) * dt, calls),
            Kernel("attention.sdpa", dict(bh=v * heads, q=n, k=n, d=cw // heads),
                   v * (4 * n * n * cw + SOFTMAX_FLOPS * heads * n * n), v * 4 * n * cw * dt, calls),
            Kernel("gemm", dict(m=v * n, n=cw, k=cw), v * 2 * n * cw * cw,
                   v * 2 * n * cw * dt + calls * (cw * cw + cw) * dt, calls),
        ], rest_launches=calls * 2)  # head merge, residual add
        return _clip_packed(c, plan, v * n, skip=(1,)) if c.fast else plan
    if kind == "clip.mlp":
        m = s.clip_mlp_dim
        plan = Plan([
            Kernel("gemm", dict(m=v * n, n=m, k=cw), v * 2 * n * cw * m,
                   v * (n * cw + n * m) * dt + calls * (cw * m + m) * dt, calls),
            Kernel("gemm", dict(m=v * n, n=cw, k=m), v * 2 * n * cw * m,
                   v * (n * m + n * cw) * dt + calls * (m * cw + cw) * dt, calls),
        ], rest_launches=calls * (2 if c.fast else 4))  # quick_gelu (3 ops eager, 1 compiled), residual
        return _clip_packed(c, plan, v * n) if c.fast else plan
    raise KeyError(kind)


def _clip_share(c: Call, rows):
    """This view group's share of the CLIP rows the fast engine packs through each layer."""
    return np.where(c.packed_rows > 0, rows / np.maximum(c.packed_rows, 1e-9), 0.0)


def _clip_packed(c: Call, plan: Plan, rows, skip: tuple[int, ...] = ()) -> Plan:
    """The fast engine runs every view group's CLIP rows through each layer together (fast/vision.run_clip,
    packed): one GEMM over all groups' rows, reading the weights once. This group's part of it is its share of
    the rows: the GEMMs are looked up at the packed M, their launches and weight reads split by the share.
    Attention (`skip`) still runs per group (the groups' sequence lengths differ)."""
    share = _clip_share(c, rows)
    for i, k in enumerate(plan.kernels):
        if i in skip:
            continue
        weights = k.coords["n"] * k.coords["k"] * c.dt
        k.coords = dict(k.coords, m=c.packed_rows)
        k.launches = share
        k.real_bytes = k.nbytes - c.calls * weights + share * weights
    plan.rest_launches = plan.rest_launches * share
    return plan


# ------------------------------------------------------------------------------------------------------ LM
def _lm_attn(c: Call) -> Plan:
    s, dt = c.spec, c.dt
    h, heads = s.hidden_size, s.num_attention_heads
    b, sq, n = c.b, c.sq, c.n
    t, sk = b * sq, n + sq
    scores = b * heads * sq * sk
    prefill = c.phase == "prefill"
    eager = c.attn == "eager"
    score_bytes = 0.0
    if eager:
        masked = 1.0 if prefill else 0.0
        score_bytes = 2 * scores * ((3 + masked) * dt + 2 * FP32)
    kv_read = b * n * 2 * h * dt
    impl = c.attn if c.mode == "reference" else "flash"  # the fast engine: flash SDPA / its Triton decode kernel
    attn = Kernel(f"attention.{impl}" + (".causal" if prefill else ""),
                  dict(bh=b * heads, s=sq, d=s.head_dim) if prefill else dict(bh=b * heads, q=sq, k=sk, d=s.head_dim),
                  4 * b * sq * sk * h + SOFTMAX_FLOPS * scores, 4 * t * h * dt + kv_read + score_bytes)
    kv = Kernel("memory.copy", dict(bytes=t * 2 * h * dt), 0.0, t * 2 * h * dt, 0.0 if prefill else 2.0)
    if c.mode == "reference":
        attn.launches = (10 if prefill else 6) if eager else 1  # eager: matmul, scale, (mask), float, softmax, ...
        if prefill:
            kv.real_bytes = 0.0  # the first call appends to an empty cache: no copy
        else:  # torch.cat rewrites the layer's whole cache: read old + new, write all
            kv.real_bytes = 2 * b * sk * 2 * h * dt
            kv.coords = dict(bytes=kv.real_bytes)
        proj = Kernel("gemm", dict(m=t, n=h, k=h), 8 * t * h * h, 4 * (2 * t * h + h * h) * dt, 4.0, by_batch=True)
        return Plan([proj, attn, kv], rest_launches=12, rest_by_batch=True)  # RoPE (5 ops each), merge, residual
    attn.real_bytes = 4 * t * h * dt + kv_read  # the fast engine's attention never writes scores
    if not prefill:  # decode attends over the static cache's current 256-slot bucket
        bucket = np.ceil(sk / DECODE_BUCKET) * DECODE_BUCKET
        attn.real_bytes = 4 * t * h * dt + b * (bucket - sq) * 2 * h * dt
        attn.coords = dict(bh=b * heads, q=sq, k=bucket, d=s.head_dim)
    kv.launches = 2.0  # keys.copy_ / index_copy_ into the static cache
    qkv = Kernel("gemm", dict(m=t, n=3 * h, k=h), 6 * t * h * h, 3 * (2 * t * h + h * h) * dt, 1.0,
                 real_bytes=(4 * t * h + 3 * h * h) * dt, by_batch=True)  # one matmul over stacked q/k/v
    o = Kernel("gemm", dict(m=t, n=h, k=h), 2 * t * h * h, (2 * t * h + h * h) * dt, 1.0, by_batch=True)
    kv.by_batch = True  # the static cache: this step's entry only
    if c.fused:  # norm + q/k/v GEMV + RoPE + cache write; attention; o_proj + residual: 3 kernels
        qkv.table = o.table = kv.table = FUSED_GEMV
        cached = b * sk * 2 * h * dt  # flash-decoding reads the slots up to the position, not the whole bucket
        attn.table, attn.real_bytes = FUSED_ATTENTION, 4 * t * h * dt + cached
        attn.coords = dict(attn.coords, bytes=cached)  # bh, q, k, d kept for the fallback to attention.flash
        qkv.coords, o.coords = dict(bytes=qkv.real_bytes), dict(bytes=o.nbytes)
        kv.coords, kv.launches = dict(bytes=qkv.real_bytes), 0.0
        return Plan([qkv, attn, o, kv], rest_launches=0.0, rest_real_bytes=0.0, rest_table=FUSED_GEMV,
                    rest_by_batch=True)
    return Plan([qkv, attn, o, kv], rest_launches=2.0, rest_real_bytes=9 * t * h * dt,
                rest_by_batch=True)  # RoPE, head merge


def _rms(c: Call) -> Plan:
    el = c.b * c.sq * c.spec.hidden_size
    if c.mode == "reference":
        return Plan(rest_launches=8.0)  # float, pow, mean, + eps, rsqrt, *, to, * weight
    real = 2 * el * c.dt + c.spec.hidden_size * c.dt  # one fused kernel: read x, write the output
    if c.fused:  # inside the next GEMV kernel, which reads x anyway: timed at that kernel's size (q/k/v)
        return whole(FUSED_GEMV, dict(bytes=3 * c.spec.hidden_size ** 2 * c.dt), c, 0.0, real_bytes=el * c.dt)
    return whole("memory.norm", dict(bytes=real), c, 1.0, real_bytes=real)


def _swiglu(c: Call, inner: int, *, weight_experts=1.0, tokens=None) -> tuple[Kernel, Kernel]:
    """gate+up and down GEMMs of a SwiGLU over `tokens` rows (default the call's tokens)."""
    h, dt = c.spec.hidden_size, c.dt
    t = c.b * c.sq if tokens is None else tokens
    gu = Kernel("gemm", dict(m=t, n=inner, k=h), 4 * t * h * inner,
                2 * (t * h + weight_experts * h * inner + t * inner) * dt, 2.0,
                real_bytes=(t * h + 2 * weight_experts * h * inner + 2 * t * inner) * dt)
    down = Kernel("gemm", dict(m=t, n=h, k=inner), 2 * t * h * inner,
                  (t * inner + weight_experts * inner * h + t * h) * dt, 1.0)
    return gu, down


def _fused_moe_bytes(c: Call) -> tuple[float, float]:
    """Weight bytes of the fused step's two MoE kernels that several rows share: the router kernel (fp32 router
    + the shared experts' gate/up) and the down kernel (the routed and the shared experts' down). Each row's part
    is timed at its kernel's size: a GEMV's efficiency depends on the bytes the whole launch streams."""
    s, dt = c.spec, c.dt
    h, si = s.hidden_size, s.shared_intermediate_size
    routed = s.num_experts_per_tok * s.moe_intermediate_size
    return s.n_routed_experts * h * FP32 + 2 * si * h * dt, (routed + si) * h * dt


def _lm_mlp(c: Call) -> Plan:
    s, dt = c.spec, c.dt
    h, t = s.hidden_size, c.b * c.sq
    ref = c.mode == "reference"
    if c.kind == "lm.mlp.dense":
        gu, down = _swiglu(c, s.intermediate_size)
        if ref:
            gu.real_bytes = None
            return Plan([gu, down], rest_launches=3.0)  # SiLU, product, residual add
        gu.launches, gu.coords = 1.0, dict(m=t, n=2 * s.intermediate_size, k=h)  # one GEMM over stacked w13
        if c.fused:
            for k in (gu, down):
                k.table, k.coords = FUSED_GEMV, dict(bytes=k.real_bytes if k.real_bytes is not None else k.nbytes)
            return Plan([gu, down], rest_launches=0.0, rest_real_bytes=0.0, rest_table=FUSED_GEMV)
        return Plan([gu, down], rest_launches=2.0, rest_real_bytes=t * (3 * s.intermediate_size + 3 * h) * dt)
    e, k = s.n_routed_experts, s.num_experts_per_tok
    if c.kind == "lm.mlp.gate":
        router = Kernel("gemm.float32", dict(m=t, n=e, k=h), 2 * t * h * e, (t * h + e * h + t * e) * FP32, 1.0)
        if ref:
            return Plan([router], rest_launches=5.0)  # x.float(), W.float(), softmax, topk, * scale
        if c.fused:  # router logits, softmax, top-k and the shared experts' gate/up SwiGLU: one kernel
            router.table, router.coords = FUSED_GEMV, dict(bytes=_fused_moe_bytes(c)[0])
            return Plan([router], rest_launches=0.0, rest_real_bytes=0.0, rest_table=FUSED_GEMV)
        return Plan([router], rest_launches=3.0)  # softmax, top-k, shared-slot ids
    if c.kind == "lm.mlp.experts":
        im = s.moe_intermediate_size
        tk = t * k
        e_act = np.maximum(expected_experts(e, k, t), 1e-9)  # distinct experts the call's tokens reach
        per = tk / e_act  # tokens per touched expert
        gu, down = _swiglu(c, im, weight_experts=e_act, tokens=tk)
        if ref:  # a Python loop over the experts that got tokens, after a host sync for the counts
            gu.real_bytes = None
            gu.coords, down.coords = dict(m=per, n=im, k=h), dict(m=per, n=h, k=im)
            gu.launches, down.launches = 2 * e_act, e_act
            return Plan([gu, down], rest_launches=4 + 4 * e_act + 5, syncs=1.0, host_ops=3 * e_act)
        if c.fused:  # routed gate/up + SwiGLU; down (with the shared experts' down) + weighted sum + residual
            for kk in (gu, down):
                kk.table = FUSED_GEMV
            gu.coords, down.coords = dict(bytes=gu.real_bytes), dict(bytes=_fused_moe_bytes(c)[1])
            gu.launches, down.launches = 1.0, 1.0
            return Plan([gu, down], rest_launches=0.0, rest_real_bytes=0.0, rest_table=FUSED_GEMV)
        gu.table = down.table = "grouped_gemm"
        gu.coords, down.coords = dict(tokens=per, n=2 * im, k=h), dict(tokens=per, n=h, k=im)
        gu.launches, down.launches = 1.0, 1.0
        return Plan([gu, down], rest_launches=9.0)  # grouping, gather, SwiGLU, read-back, combine + residual
    if c.kind == "lm.mlp.shared_experts":
        si = s.shared_intermediate_size
        gu, down = _swiglu(c, si)
        if ref:
            gu.real_bytes = None
            return Plan([gu, down], rest_launches=3.0)  # SiLU, product, y + shared
        gu.launches = down.launches = 0.0  # run inside the routed kernels (two extra experts of width 896)
        if c.fused:  # gate/up inside the router's kernel, down inside the routed experts' down kernel
            router_kernel, down_kernel = _fused_moe_bytes(c)
            gu.table = down.table = FUSED_GEMV
            gu.coords, down.coords = dict(bytes=router_kernel), dict(bytes=down_kernel)
            return Plan([gu, down], rest_launches=0.0, rest_real_bytes=0.0, rest_table=FUSED_GEMV)
        gu.table = down.table = "grouped_gemm"
        gu.coords = dict(tokens=t, n=2 * s.moe_intermediate_size, k=h)
        down.coords = dict(tokens=t, n=h, k=s.moe_intermediate_size)
        return Plan([gu, down], rest_launches=0.0)
    raise KeyError(c.kind)


def _lm_other(c: Call) -> Plan:
    s, dt = c.spec, c.dt
    h, v = s.hidden_size, s.vocab_size
    ref = c.mode == "reference"
    decode = c.phase == "decode"
    if c.kind == "lm.embed_tokens":
        if ref:
            scatter = np.where(np.asarray(c.img) > 0, 1.0, 0.0)
            ops = REF_STEP_OPS if decode else 1 + scatter * (3 * c.b + 1) + REF_PREFILL_OPS
            return Plan(rest_launches=ops)
        if c.fused:  # the embedding row is read inside the first q/k/v kernel; 2 steps per graph replay
            return Plan(rest_launches=0.0, rest_real_bytes=0.0, rest_table=FUSED_GEMV, graph_launches=0.5)
        if decode:
            return Plan(rest_launches=1.0 + FAST_STEP_OPS, host_ops=FAST_STEP_OPS, graph_launches=1.0)
        return Plan(rest_launches=2.0, graph_launches=1.0)  # embedding, image-slot index_copy
    if c.kind == "lm.norm":
        return _rms(c)
    if c.kind == "lm.lm_head":
        lr = c.logit_rows
        head = Kernel("gemm", dict(m=lr, n=v, k=h), 2 * lr * h * v, (lr * h + v * h + lr * v) * dt, 1.0)
        if c.fused:  # final norm + lm_head + per-block best token; then the greedy choice
            head.table, head.coords, head.launches = FUSED_GEMV, dict(bytes=head.nbytes), 2.0
            return Plan([head], rest_launches=0.0, rest_real_bytes=0.0, rest_table=FUSED_GEMV)
        return Plan([head], rest_launches=1.0)  # .float()
    raise KeyError(c.kind)


def plan(c: Call) -> Plan:
    """The kernels of one call of row kind `c.kind` in mode `c.mode`."""
    if c.fast and not family_of(c.spec).fast_engine:
        raise SpecError(f"the fast engine runs {', '.join(fast_engine_models())} only; predict "
                        f"{family_of(c.spec).label} in the reference session mode")
    if c.phase in ("vision",):
        return _vision(c)
    if c.phase == "layout":  # per image: grids reshaped, newline columns, concatenations (a Python loop)
        return Plan(rest_launches=8 * c.images)
    k = c.kind
    if k == "lm.self_attn":
        return _lm_attn(c)
    if k in ("lm.input_layernorm", "lm.post_attention_layernorm"):
        return _rms(c)
    if k.startswith("lm.mlp"):
        return _lm_mlp(c)
    return _lm_other(c)
