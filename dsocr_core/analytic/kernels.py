"""Kernel plans: the vocabulary the time model prices, and the model's work expressed as kernels.

A plan splits one call of an analytic row (its FLOPs F and bytes B, per call part) over the kernels that do it:
each explicit kernel names the profile table that times it (gemm, attention, grouped_gemm, memory.<kind>), the
shape it is looked up at, its SHARE of the row's F and B, how many launches it takes and how many eager host ops
issue it. Whatever F and B the explicit kernels do not take is the remainder: elementwise work (norm arithmetic,
RoPE, copies, residual adds, routing index math) timed on the memory.elementwise table over `rest_launches`
kernels. Shares partition the row exactly, so with every efficiency 1 the kernels' excess over their rooflines
is 0 and the prediction is the roofline (analytic/predict.py).

`real_flops` / `real_bytes` are the work an engine really does where it differs from the analytic count (which is
the eager reference's op-by-op traffic); predict.py uses them with work="engine" (the default) and ignores them
with work="analytic".

This module describes no engine. The builders below are the MODEL's kernels (the GEMMs of a SAM block, the LM's
attention kernel, a SwiGLU), with the shapes and work the model's code gives them; which of them run, fused how,
launched how often, is each engine's plan, written beside the engine's code and reading its options
(runtime/reference_plan.py, fast/plan.py; engines.EngineSpec.kernel_plan builds one). Nothing here is fitted to
measured times.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .cost import Cost
from .lm import expected_experts
from .vision import SOFTMAX_FLOPS, clip_tokens, conv_out, sam_out_side, sam_patches

FP32 = 4


@dataclass
class Kernel:
    # gemm | gemm.float32 | grouped_gemm | conv | linear | attention.<impl>[.causal] | memory.<kind> | bias.<kind>
    table: str
    coords: dict[str, Any]
    flops: Any  # share of the row's FLOPs (per call)
    nbytes: Any  # share of the row's bytes (per call)
    launches: Any = 1.0
    host_ops: Any = None  # eager ops issuing it (None: = launches where the engine runs eagerly, else 0)
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
    graph_launches: Any = 0.0  # CUDA-graph replays per call (the host's part: priced as host time)
    # graph starts the stage timer sees per call: the device time a replay adds beyond its kernels between the events
    # around it (the profile's launch.graph_start_s; the fast plan charges it to the projector and the LM prefill)
    graph_starts: Any = 0.0
    host_ops: Any = 0.0  # eager launching ops outside the kernels and the remainder above (priced as "other")
    view_ops: Any = 0.0  # eager Python-level ops that launch nothing: slices, views (priced as "view")
    # the call as serial segments, host and device overlapping within a segment only: (each segment's share of the
    # call's host time, its share of the call's device time), arrays [..., S]; None: one segment. Set by the
    # reference plan's expert loop where the routing recorded loads (runtime/reference_plan.py expert_segments)
    segments: Any = None


def host_kind(table: str) -> str:
    """The host-cost kind (calibration.schema.HOST_KINDS) of an eager op launching a kernel timed on `table`."""
    if table.startswith(("gemm", "grouped_gemm", "conv", "linear")):
        return "gemm"
    if table.startswith("attention"):
        return "attention"
    return "other"


def host_ops_by_kind(plan: Plan, graphs: bool) -> dict[str, Any]:
    """The eager ops one call of `plan` issues from the host, per host-cost kind: each kernel's host_ops (None:
    its launches, unless the engine replays graphs), the remainder's launches, the plan's other launching ops and
    its views. The time model prices them (analytic/predict.py); runtime/op_count.py checks their sum."""
    out: dict[str, Any] = {"gemm": 0.0, "attention": 0.0, "other": 0.0, "view": 0.0}
    for k in plan.kernels:
        ops = k.host_ops if k.host_ops is not None else (0.0 if graphs else k.launches)
        if k.table.startswith("attention.eager"):  # eager attention is ops, not one SDPA: its two matmuls
            matmuls = 2.0 * np.asarray(ops, dtype=float) / np.maximum(np.asarray(k.launches, dtype=float), 1.0)
            out["gemm"] = out["gemm"] + matmuls  # (scores and output) and elementwise, softmax and mask ops
            out["other"] = out["other"] + (ops - matmuls)
            continue
        out[host_kind(k.table)] = out[host_kind(k.table)] + ops
    out["other"] = out["other"] + (0.0 if graphs else plan.rest_launches) + plan.host_ops
    out["view"] = out["view"] + plan.view_ops
    return out


@dataclass
class Call:
    """What a plan sees: the row kind, one call part's cost and shape context, in a decode step the path the
    engine takes at this call's batch size (EnginePlan.decode_paths: 'fused' for the fused step; '' where the
    plan has one path) and the routing the prediction assumes (None: uniform)."""

    kind: str
    cost: Cost
    ctx: dict
    path: str = ""
    routing: Any = None  # routing.Routing: distinct experts per call; None = uniform

    @property
    def fused(self) -> bool:
        """The call is the engine's fused decode step."""
        return self.path == "fused"

    def __getattr__(self, name):  # ctx entries as attributes (b, sq, n, views, side, dt, spec, ...)
        try:
            return self.__dict__["ctx"][name]
        except KeyError:
            raise AttributeError(name) from None


class _EveryRow:
    """separate_rows of an engine with no fused kernels: every row kind."""

    def __contains__(self, kind) -> bool:
        return True


EVERY_ROW = _EveryRow()


class EnginePlan(Protocol):
    """An engine's kernel plan on one device kind (built by engines.EngineSpec.kernel_plan)."""

    graphs: bool  # kernels launch from CUDA graphs: the graph gap per launch, no eager host op per launch
    notes: tuple[str, ...]  # options the plan does not model, said in every prediction
    # optional: separate_rows, row kinds whose kernels run one after another with nothing fused across them (no
    # overlap credit for the row: its kernels' own rooflines add up; analytic/predict.py); EVERY_ROW for an engine
    # that runs every kernel on its own; host_costs_by_stage, True where the engine's eager ops are the model's own
    # code, priced at the profile's host cost per op of that code by stage (calibration/host_stages.py);
    # step_bucket, the cache length (in positions) a decode step's kernels change shape at (a static cache's
    # bucket): the prediction sums a decode row's steps bucket by bucket (analytic/predict.py)

    def plan(self, c: Call) -> Plan: ...

    def decode_paths(self, b, spec) -> np.ndarray:
        """The path a decode step at each batch size in `b` takes (strings, b's shape; 'fused' for the fused
        step): the prediction plans each group of points with its own path."""


# Eager elementwise ops whose kernels run far from the vectorised add of memory.elementwise (4.4 TB/s; an H200 trace
# of the reference LM prefill at 58,000 tokens, docs/accuracy.md "The reference LM prefill's eager ops"): casts
# (.float(), 2.1 TB/s there), float32 products with a broadcast column (2.5 TB/s, priced as casts: the same unrolled,
# non-vectorised kernels), bfloat16 ops with a broadcast or transposed operand (the norms' weight, RoPE's products,
# negation, cat and add on q and k: 1.0-1.9 TB/s in the trace, the broadcast table 1.6-1.7 from 64 MB up), rows
# written through an index (the reference expert loop's out[order[rows]] = ..., 0.8 TB/s) and rows gathered by one
# (its x[token[rows]], on the fast projector's index_select table). A cast to float32 of a float32 tensor returns
# the tensor itself: in a float32 model those ops launch nothing and have no kernel. The reference plans (the LM's,
# runtime/reference_plan.py, and DeepSeek-OCR 2's encoder, kernels_v2.py) build them here
CAST, BROADCAST, INDEX_PUT, GATHER = "memory.cast", "memory.broadcast", "memory.index_put", "memory.gather_rows"


def eager_ops(table: str, nbytes, launches) -> Kernel:
    """`launches` eager ops of one kind moving `nbytes` of the row's counted bytes between them, each looked up at
    its share of them (no FLOPs: they are bandwidth-bound)."""
    return Kernel(table, dict(bytes=nbytes / np.maximum(launches, 1.0)), 0.0, nbytes, launches)


def casts(c: Call) -> float:
    """1.0 where a model's .float() / .to(dt) round trips copy (a bfloat16 or float16 model), else 0.0."""
    return 1.0 if c.dt < FP32 else 0.0


def eager_rms_norm(c: Call, elements, calls=1.0) -> Plan:
    """`calls` eager RMSNorms (model/decoder.py RMSNorm) over `elements` elements in all, 8 ops each (6 in a float32
    model): x.float() (a cast), pow, mean, + eps, rsqrt, x * rsqrt (float32 against a broadcast column), .to(dt),
    weight * x (against a broadcast row). The cast, the float32 product and the weight's product have kernels of
    their own; pow, mean, + eps, rsqrt and .to(dt) are the remainder (vectorised, or on one value a row). Bytes:
    analytic/lm.py rms_norm's count, op by op."""
    dt, cast = c.dt, casts(c)
    kernels = [eager_ops(CAST, 2 * elements * FP32, calls), eager_ops(BROADCAST, 2 * elements * dt, calls)]
    if cast:
        kernels.insert(0, eager_ops(CAST, elements * (dt + FP32), calls))
    return Plan(kernels, rest_launches=calls * (4.0 + cast))


# eager RoPE on q and on k (model/decoder.py, the encoder's the same): x * cos, neg and cat of the halves, * sin, add
ROPE_OPS = 10


def eager_rope(c: Call, rotated, calls=1.0) -> Kernel:
    """`calls` eager RoPE applications on q and k over `rotated` elements of them in all, ROPE_OPS launches a call on
    the broadcast table (cos and sin broadcast over the heads, q and k transposed views): analytic/lm.py counts 5.5
    reads and 4.5 writes a rotated element. Its work follows the call's tokens only (in a decode step, the batch)."""
    rope = eager_ops(BROADCAST, 10 * rotated * c.dt, ROPE_OPS * calls)
    rope.by_batch = True
    return rope


def whole(table: str, coords: dict, c: Call, launches=1.0, real_bytes=None) -> Plan:
    """The whole row is one kernel (convolutions, LayerNorms)."""
    return Plan([Kernel(table, coords, c.cost.flops, c.cost.bytes, launches, real_bytes=real_bytes)])


def observed_loads(c: Call):
    """Rows per rank of routed expert [..., E] of this call under the prediction's routing, where it recorded loads
    (Routing.rows_by_rank: NaN at points outside the token counts recorded); None without a routing or loads."""
    if c.routing is None:
        return None
    s = c.spec
    rows = c.routing.rows_by_rank(s.n_routed_experts, s.num_experts_per_tok, np.asarray(c.b * c.sq, dtype=float))
    return None if rows is None else np.asarray(rows, dtype=float)


def touched_experts(c: Call, tokens):
    """Distinct routed experts a call of `tokens` tokens reaches: the prediction's routing, else uniform."""
    s = c.spec
    if c.routing is None:
        return expected_experts(s.n_routed_experts, s.num_experts_per_tok, tokens)
    return c.routing.touched(s.n_routed_experts, s.num_experts_per_tok, tokens)


# -------------------------------------------------------------------------------------------------- vision
@dataclass
class SamAttention:
    """The kernels of one SAM attention call as the model runs it: q/k/v, the relative-position einsums and the
    output projection (GEMMs), the dense bias mask (the broadcast sum, then its copy) and SDPA with that mask;
    plus its geometry."""

    gemms: list[Kernel]
    mask: Kernel
    mask_copy: Kernel
    sdpa: Kernel
    span: int  # the attended square's side (window or whole grid)
    seq: int  # tokens per attended square
    n: Any  # tokens per view
    rel: Any  # relative-position terms per view
    scores: Any  # score elements per view
    padded: bool  # windows padded (the grid is not a multiple of the window)
    resized: bool  # global attention on a grid other than the learned one


def sam_attention(c: Call, einsum_launches: float) -> SamAttention:
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
    gemms = [
        Kernel("gemm", dict(m=v * n, n=3 * w, k=w), v * 2 * n * w * 3 * w,
               v * 4 * n * w * dt + calls * (3 * w * w + 3 * w) * dt, calls),  # qkv
        Kernel("gemm", dict(m=v * n * heads, n=span, k=d), v * 2 * n * w * 2 * span,
               v * (2 * n * w + rel) * dt + calls * rel_params * dt, calls * einsum_launches),  # rel einsums
        Kernel("gemm", dict(m=v * n, n=w, k=w), v * 2 * n * w * w,
               v * 2 * n * w * dt + calls * (w * w + w) * dt, calls),  # proj
    ]
    # the dense [L, L] mask: rel_h + rel_w broadcast, then reshaped, a copy (the sum keeps the einsums' permuted
    # strides) that reads and writes every score: work the analytic count has no share of, the engine's own (at
    # 1024 px 0.8 GB per global block and view). Both run at the bandwidth of broadcast and strided kernels over
    # short rows (the square's side), priced on the bias tables by attended squares and side (on the H100 about a
    # third of a contiguous copy's, docs/accuracy.md); a profile made before them prices them by bytes
    square = dict(bh=v * groups * heads, side=span)
    mask = Kernel("bias.broadcast", dict(bytes=v * (rel + scores) * dt, **square), v * scores,
                  v * (rel + scores) * dt, calls)
    dense = 2 * v * scores * dt
    mask_copy = Kernel("bias.strided", dict(bytes=dense, **square), 0.0, 0.0, calls, real_bytes=dense)
    sdpa = Kernel("attention.sdpa_bias", dict(bh=v * groups * heads, q=seq, k=seq, d=d),
                  v * (4 * n * seq * w + SOFTMAX_FLOPS * scores), v * (4 * n * w + scores) * dt, calls)
    padded = (not glob) and (-(-p // s.sam_window) * s.sam_window != p)
    resized = glob and p != s.sam_pos_grid
    return SamAttention(gemms, mask, mask_copy, sdpa, span, seq, n, rel, scores, padded, resized)


def sam_mlp(c: Call, elementwise: float = 2) -> Plan:
    """SAM's MLP: two GEMMs; `elementwise` kernels per call besides them (GELU, residual add)."""
    s, v, calls, dt = c.spec, c.views, c.calls, c.dt
    t, w, m = sam_patches(s, c.side) ** 2, s.sam_width, s.sam_mlp_dim
    return Plan([
        Kernel("gemm", dict(m=v * t, n=m, k=w), v * 2 * t * w * m, v * (t * w + t * m) * dt + calls * (w * m + m) * dt,
               calls),
        Kernel("gemm", dict(m=v * t, n=w, k=m), v * 2 * t * w * m, v * (t * m + t * w) * dt + calls * (m * w + w) * dt,
               calls),
    ], rest_launches=calls * elementwise)


def sam_neck(c: Call) -> Plan:
    s, v, calls, dt = c.spec, c.views, c.calls, c.dt
    t, w, nd = sam_patches(s, c.side) ** 2, s.sam_width, s.sam_neck_dim
    return Plan([
        Kernel("gemm", dict(m=v * t, n=nd, k=w), v * 2 * t * w * nd, v * (t * w + t * nd) * dt + calls * w * nd * dt,
               calls),  # 1x1 conv
        Kernel("gemm", dict(m=v * t, n=nd, k=9 * nd), v * 2 * t * nd * nd * 9,
               v * 2 * t * nd * dt + calls * 9 * nd * nd * dt, calls),  # 3x3 conv
    ], rest_launches=calls * 20)  # two LayerNorm2d, ten ops each (the neck runs eagerly in every engine)


def patch_embed(c: Call, launches, table: str = "gemm") -> Plan:
    """SAM's patch embedding: a conv, i.e. one GEMM over the patches; timed as that GEMM, or (`table` "conv") as
    the conv kernel itself."""
    s, v = c.spec, c.views
    p = sam_patches(s, c.side)
    return whole(table, dict(m=v * p * p, n=s.sam_width, k=3 * s.sam_patch ** 2), c, c.calls * launches)


def common_vision(c: Call, projector_cat: str = "memory.transposed_cat") -> Plan | None:
    """Vision rows every engine runs as the model writes them: SAM's norms, MLP, neck and downsampling convs,
    CLIP's pre-LayerNorm, the projector (its concatenation timed on `projector_cat`: the reference model's cat
    reads SAM's map through a transpose; the fast engine's map is channels-last). None for the other rows."""
    s, v, calls, kind = c.spec, c.views, c.calls, c.kind
    if kind.startswith(("sam.norm", "clip.pre_layrnorm")):
        return whole("memory.norm", dict(bytes=c.cost.bytes), c, calls)
    if kind.startswith("sam.mlp"):
        return sam_mlp(c)
    if kind == "sam.neck":
        return sam_neck(c)
    if kind in ("sam.net_2", "sam.net_3"):
        p = sam_patches(s, c.side)
        which = 0 if kind == "sam.net_2" else 1
        n_in = p if which == 0 else conv_out(p)
        c_in = s.sam_neck_dim if which == 0 else s.sam_downsample[0]
        o = conv_out(n_in)
        return whole("gemm", dict(m=v * o * o, n=s.sam_downsample[which], k=9 * c_in), c, calls)
    if kind == "projector":  # both families: one Linear per feature (v1: CLIP+SAM concatenated, v2: queries)
        f, h, din, dt = sam_out_side(s, c.side) ** 2, s.hidden_size, s.projector_input_dim, c.dt
        linear = Kernel("linear", dict(m=v * f, n=h, k=din), v * 2 * f * din * h,
                        v * (f * din + f * h) * dt + calls * (din * h + h) * dt, calls)
        if not hasattr(s, "clip_width"):  # DeepSeek-OCR 2: the encoder's query half of each view's sequence, a
            # slice that is contiguous for one view only: nn.Linear runs one addmm there, and on more views copies
            # the slice to rows (clone), then mm and the bias add (runtime/op_count.py, tests/test_reference_plan_ops)
            many = np.where(np.asarray(v) > np.asarray(calls), 1.0, 0.0)
            return Plan([linear], rest_launches=calls * 2 * many)
        # DeepSeek-OCR: one cat of CLIP's features (CLS dropped: a view) and SAM's map flattened and transposed
        # (in the reference model a view whose channel runs are strided by the map's size, so the cat's reads of it
        # are uncoalesced): priced on its own table, read both halves and write the concatenation
        nbytes = v * 2 * f * din * dt
        cat = Kernel(projector_cat, dict(bytes=nbytes / np.maximum(calls, 1.0)), 0.0, nbytes, calls)
        return Plan([linear, cat], rest_launches=0.0)
    return None


def clip_attention(c: Call) -> Plan:
    s, v, calls, dt = c.spec, c.views, c.calls, c.dt
    n, cw, heads = clip_tokens(s, c.side), s.clip_width, s.clip_heads
    return Plan([
        Kernel("gemm", dict(m=v * n, n=3 * cw, k=cw), v * 6 * n * cw * cw,
               v * 4 * n * cw * dt + calls * (3 * cw * cw + 3 * cw) * dt, calls),
        Kernel("attention.sdpa", dict(bh=v * heads, q=n, k=n, d=cw // heads),
               v * (4 * n * n * cw + SOFTMAX_FLOPS * heads * n * n), v * 4 * n * cw * dt, calls),
        Kernel("gemm", dict(m=v * n, n=cw, k=cw), v * 2 * n * cw * cw,
               v * 2 * n * cw * dt + calls * (cw * cw + cw) * dt, calls),
    ], rest_launches=calls * 2)  # head merge, residual add


def clip_mlp(c: Call, elementwise: float) -> Plan:
    """CLIP's MLP: two GEMMs; `elementwise` kernels per call besides them (quick_gelu, residual add)."""
    s, v, calls, dt = c.spec, c.views, c.calls, c.dt
    n, cw, m = clip_tokens(s, c.side), s.clip_width, s.clip_mlp_dim
    return Plan([
        Kernel("gemm", dict(m=v * n, n=m, k=cw), v * 2 * n * cw * m,
               v * (n * cw + n * m) * dt + calls * (cw * m + m) * dt, calls),
        Kernel("gemm", dict(m=v * n, n=cw, k=m), v * 2 * n * cw * m,
               v * (n * m + n * cw) * dt + calls * (m * cw + cw) * dt, calls),
    ], rest_launches=calls * elementwise)


def layout(c: Call) -> Plan:
    """Per image (model/deepseek_ocr.py layout_image, a Python loop in the reference engine and in the fast engine's
    projector_layout='per_image'): the global grid with its newline column (cat) and the final cat; a tiled image
    also stitches its tiles (a copy) and adds their newline column (cat). DeepSeek-OCR 2 (no newlines,
    model/deepseek_ocr2.py layout_image): one cat of the tiles' features, the global view's and view_seperator
    (its cast to the features' dtype is the parameter itself in the model's dtype)."""
    if not c.ctx.get("newlines", False):
        return Plan(rest_launches=1.0 * c.images)
    return Plan(rest_launches=2 * c.images + 2 * c.tiled)


# ------------------------------------------------------------------------------------------------------ LM
def lm_attention(c: Call, impl: str) -> Kernel:
    """The attention kernel of one LM call (`impl`: eager | sdpa | flash), with the scores eager attention
    writes and reads."""
    s, dt = c.spec, c.dt
    h, heads = s.hidden_size, s.num_attention_heads
    b, sq, n = c.b, c.sq, c.n
    t, sk = b * sq, n + sq
    scores = b * heads * sq * sk
    prefill = c.phase == "prefill"
    score_bytes = 0.0
    if c.attn == "eager":
        masked = 1.0 if prefill else 0.0
        score_bytes = 2 * scores * ((3 + masked) * dt + 2 * FP32)
    kv_read = b * n * 2 * h * dt
    return Kernel(f"attention.{impl}" + (".causal" if prefill else ""),
                  dict(bh=b * heads, s=sq, d=s.head_dim) if prefill else dict(bh=b * heads, q=sq, k=sk, d=s.head_dim),
                  4 * b * sq * sk * h + SOFTMAX_FLOPS * scores, 4 * t * h * dt + kv_read + score_bytes)


def kv_write(c: Call) -> Kernel:
    """This call's keys and values into the cache."""
    t, h, dt = c.b * c.sq, c.spec.hidden_size, c.dt
    return Kernel("memory.copy", dict(bytes=t * 2 * h * dt), 0.0, t * 2 * h * dt,
                  0.0 if c.phase == "prefill" else 2.0)


def swiglu(c: Call, inner: int, *, weight_experts=1.0, tokens=None) -> tuple[Kernel, Kernel]:
    """gate+up and down GEMMs of a SwiGLU over `tokens` rows (default the call's tokens)."""
    h, dt = c.spec.hidden_size, c.dt
    t = c.b * c.sq if tokens is None else tokens
    gu = Kernel("gemm", dict(m=t, n=inner, k=h), 4 * t * h * inner,
                2 * (t * h + weight_experts * h * inner + t * inner) * dt, 2.0,
                real_bytes=(t * h + 2 * weight_experts * h * inner + 2 * t * inner) * dt)
    down = Kernel("gemm", dict(m=t, n=h, k=inner), 2 * t * h * inner,
                  (t * inner + weight_experts * inner * h + t * h) * dt, 1.0)
    return gu, down


@dataclass
class RoutedExperts:
    """The routed experts' SwiGLU GEMMs over all (token, expert) pairs of one call. Their shares are the analytic
    count (uniform routing); under the prediction's routing they touch `touched` distinct experts, `per` tokens
    each, and read `gu_extra` / `down_extra` more weight bytes than uniform routing would (None when uniform)."""

    gu: Kernel
    down: Kernel
    touched: Any
    per: Any
    gu_extra: Any = None
    down_extra: Any = None

    def read_routed_weights(self) -> None:
        """Charge the routing's weight reads to the kernels' engine work (after the plan set its real bytes)."""
        if self.gu_extra is not None:
            for k, extra in ((self.gu, self.gu_extra), (self.down, self.down_extra)):
                k.real_bytes = (k.nbytes if k.real_bytes is None else k.real_bytes) + extra


def routed_experts(c: Call) -> RoutedExperts:
    s, dt = c.spec, c.dt
    h, im = s.hidden_size, s.moe_intermediate_size
    t = c.b * c.sq
    tk = t * s.num_experts_per_tok
    uniform = np.maximum(expected_experts(s.n_routed_experts, s.num_experts_per_tok, t), 1e-9)
    gu, down = swiglu(c, im, weight_experts=uniform, tokens=tk)
    if c.routing is None:
        return RoutedExperts(gu, down, uniform, tk / uniform)
    touched = np.maximum(touched_experts(c, t), 1e-9)
    return RoutedExperts(gu, down, touched, tk / touched, 2 * (touched - uniform) * h * im * dt,
                         (touched - uniform) * im * h * dt)


def router(c: Call) -> Kernel:
    """The fp32 router GEMM."""
    s = c.spec
    t, h, e = c.b * c.sq, s.hidden_size, s.n_routed_experts
    return Kernel("gemm.float32", dict(m=t, n=e, k=h), 2 * t * h * e, (t * h + e * h + t * e) * FP32, 1.0)


def lm_head(c: Call) -> Kernel:
    s, dt = c.spec, c.dt
    h, v, lr = s.hidden_size, s.vocab_size, c.logit_rows
    return Kernel("gemm", dict(m=lr, n=v, k=h), 2 * lr * h * v, (lr * h + v * h + lr * v) * dt, 1.0)


def lm_head_and_cast(c: Call) -> Plan:
    """The lm_head GEMM, then `.float()` of its logits (both engines): a kernel of its own that reads them and
    writes them again as float32 (none where they are float32 already). It is timed on the memory.cast table: a
    bf16 -> float32 copy streams at about 0.58 of an H100's HBM bandwidth where an elementwise add reaches 0.9,
    and with every position's logits it takes as long as the GEMM (36,558 rows: GEMM 18.3 ms, cast 14.5 ms)."""
    head = lm_head(c)
    if c.dt >= FP32:
        return Plan([head], rest_launches=0.0)
    moved = c.logit_rows * c.spec.vocab_size * (c.dt + FP32)
    return Plan([head, Kernel("memory.cast", dict(bytes=moved), 0.0, moved, 1.0)], rest_launches=0.0)
