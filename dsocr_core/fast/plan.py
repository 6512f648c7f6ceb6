"""The fast engine's kernel plan (fast/engine.py FastEngine): which kernels one call of each analytic row launches,
read from the engine's resolved options (fast/options.py), not copied from them.

What the options decide here:
* `graphs`: kernels replay from CUDA graphs (the graph gap per launch, one graph replay per stage or step, no
  eager host op per kernel); without graphs every kernel is an eager launch;
* `fused`: a decode step at batch 1 is decode_kernels.FusedDecode: per layer q/k/v (with the norm, RoPE and the
  cache write), attention, o_proj + residual, then 2 kernels (dense) or router + shared gate/up, routed gate/up,
  down + combine (MoE), the lm_head with the greedy choice; `graph_steps` steps share one graph replay;
* `bucket`: decode attention outside the fused step reads the static cache up to the current bucket's end;
* `clip_packed`: every view group's CLIP rows go through each layer at once (one GEMM per layer);
* `projector_layout`: 'gather' lays out every image's slots with one gather, 'per_image' with the reference's cats
  per image;
* `moe_rows`: 'triton' runs the grouped MoE's grouping, its copy into expert order and its weighted combine as
  fast/moe_rows.py's kernels, priced with SwiGLU by their bytes; 'torch' as the kernels Inductor compiles (a
  remainder of 17 launches);
* `batched_choice`: a decode step's greedy choice outside the fused batch-1 step runs as eager ops after the graph
  replay ('host') or as three kernels in the step's graph ('graph');
* `expert_fusion`: batched decode's by-expert MoE either routes in one kernel that computes the logits and
  combines the slots + residual inside the down kernel ('fused'), or runs the router GEMM, a routing kernel and the
  combine as kernels of their own ('separate');
* `sam_attention`: 'fold' folds the relative-position bias into q/k so a flash kernel runs (no dense mask);
  'dense' runs the reference's dense-mask SDPA.
Options the plan does not model (the decode experts' and attention's kernel choice outside the fused step, eager
instead of compiled kernels, FlexAttention in SAM) are named in `notes`, which every prediction carries.

Launch counts outside the fused batch-1 step are estimates of what Inductor emits (docs/time-model.md says how to
count them with the profiler). Torch-free, like the rest of the time model.
"""
from __future__ import annotations

import numpy as np

from ..analytic.kernels import (FP32, Call, Kernel, Plan, clip_attention, clip_mlp, common_vision, kv_write, layout,
                                lm_attention, lm_head, lm_head_and_cast, observed_loads, patch_embed, routed_experts,
                                router, sam_attention, sam_mlp, swiglu, touched_experts, whole)
from ..analytic.vision import clip_tokens, sam_patches
from ..registry import family_of, fast_engine_models
from ..spec import SpecError
from .options import ResolvedFast, expert_lanes, expert_token_tile

STEP_OPS = 7  # a decode step at batch > 1: the greedy choice and history update outside the graph
# batched_choice 'graph' (fast/choice_kernels.py): the n-gram ban, the blocks' best tokens and the rows' choice in the
# step's graph (two without the ban: the plan assumes it, as every generation and measurement runs it, n = 20);
# outside it one copy of the finished flags back to the generator
CHOICE_LAUNCHES, CHOICE_HOST_OPS = 3.0, 1.0
# the MoE's kernels beside moe_rows' kernels, SwiGLU and the grouped GEMMs, per layer of a compiled prefill traced on
# an H200 (docs/fast-mode.md): the top-k's rounds (9), the slots' ids and weights (1), the grouped GEMMs' data (2)
ROUTING_LAUNCHES = 12.0
# the fused step's own kernels have their own tables; a profile without them (a CPU, or one measured before they
# existed) falls back to memory.gemv / attention.flash (analytic.predict._candidates)
FUSED_GEMV, FUSED_ATTENTION = "memory.fused_gemv", "memory.fused_attention"
# the projector's concatenation as this engine builds it (calibration/ops._projector_input_op); profiles without the
# table price it on the reference's memory.transposed_cat and say so
PROJECTOR_CAT = "memory.projector_cat"
# its lm_head kernel, by bytes; a profile without the table falls back to memory.fused_gemv
FUSED_LM_HEAD = "memory.fused_lm_head"
# the by-expert Triton experts of batched decode (triton_kernels.moe_gemv), by the bytes a launch streams; a profile
# without the table falls back to memory.fused_gemv
MOE_GEMV = "memory.moe_gemv"
# the same with the weighted combine + residual in the down kernel (expert_fusion 'fused'); a profile without the
# table falls back to memory.moe_gemv
MOE_GEMV_COMBINE = "memory.moe_gemv_combine"
# gathers of whole rows (index_select), the projector's layout; a profile without the table falls back to
# memory.elementwise
GATHER_ROWS = "memory.gather_rows"
# the MoE grouping kernels (fast/moe_rows.group_rows), by their one-hot work; profiles without it: elementwise
GROUP_ROWS = "memory.group_rows"
# the batched decode attention (Triton split-KV); profiles without it: attention.flash
SPLIT_KV = "attention.split_kv"
# the compiled SAM, CLIP and LM prefill layers call SDPA without choosing a backend: torch picks one (on an H100 with
# torch 2.11 cuDNN's flash kernel, which the trace shows and the reference LM's backend list excludes). SAM, CLIP
# and the prefill are priced on it; a profile without the table falls back to attention.sdpa (SAM, CLIP) and
# attention.flash (prefill), as before it existed
DEFAULT_SDPA = "attention.default"
# torch._grouped_mm's kernel (CUTLASS, sm90) runs a group of more than 128 rows in tiles of 256 rows: its time is
# flat from 129 to 256 rows and steps up by a tile's time at 257, 513, ... (benchmarks/grouped_gemm_steps.py on an
# H200: 140 us at 256 rows per expert, 235 us at 288, 245 us at 512). A group is priced at its rows rounded up to
# whole tiles, on the grouped_gemm table's entry there
GROUPED_TILE_ROWS = 256


class FastPlan:
    # CLIP's MLP runs as four kernels one after another (fc1 GEMM, the fused quick_gelu, fc2 GEMM, the residual add):
    # nothing overlaps the GEMMs' compute with the elementwise traffic, so the row gets no overlap credit (its
    # kernels' own rooflines add up). With the credit CLIP was predicted 12-29% fast at batch 3-64 (docs/accuracy.md).
    # SAM's compiled blocks with the folded attention likewise: Inductor fuses the elementwise work into kernels of
    # its own, none into a GEMM or the attention (docs/accuracy.md, "SAM planned kernel by kernel"). The LM's
    # attention row too: its q/k/v GEMM, RoPE, head split, cache write, SDPA and o_proj run one after another (an
    # H200 trace of prefills of 14,088-53,560 tokens: the kernels took 503-2,006 us per layer, their own rooflines
    # 507-1,691 us, the row with the credit 312-957 us; docs/accuracy.md, "The LM attention's kernels add up").
    # The lm_head also: its GEMM, then the cast of its logits to float32 (lm_prefill's .float()), a second kernel
    # that can start only when the GEMM is done. With every position's logits the cast moves three times the GEMM's
    # output (54 Large pages: 28 GB after a 12 TFLOP GEMM) and the credit hid it under the GEMM's compute.
    # The projector also (fast/vision.run_projector): per view group the concatenation of CLIP's and SAM's features
    # (model.projector_input, one CatArrayBatchedCopy kernel), then the addmm that reads it: the GEMM cannot start
    # before the copy ends. With the credit the concatenation's roofline (8 KiB moved per feature row: a third (H200)
    # to a half (H100) of the GEMM's compute time per row) was hidden wherever the GEMM bounds the row
    separate_rows = frozenset({"clip.mlp", "lm.self_attn", "lm.lm_head", "projector"})
    sam_rows = frozenset(f"sam.{part}.{tag}" for part in ("norm1", "attn", "norm2", "mlp")
                         for tag in ("windowed", "global"))

    def __init__(self, options: ResolvedFast, device_kind: str):
        self.o = options
        self.device_kind = device_kind
        self.graphs = options.graphs
        # a decode step's attention runs over the static cache up to its bucket's end: its shape (the SDPA path's
        # length, the split-KV kernel's fill) jumps at each bucket's edge, so the steps are summed bucket by bucket
        self.step_bucket = options.bucket
        # the dense-mask option keeps the analytic rows' elementwise work and their overlap (it was not traced)
        self.sam_kernels = options.sam_attention != "dense"
        if self.sam_kernels:
            self.separate_rows = self.separate_rows | self.sam_rows
        notes = []
        if options.sam_attention == "flex":
            notes.append("fast engine sam_attention='flex' is planned as the folded bias (no FlexAttention table)")
        if options.moe == "gather":
            notes.append("fast engine moe='gather': decode experts outside the fused step are planned as the "
                         "grouped GEMM")
        if options.attention != ("triton" if device_kind == "cuda" else "reduce"):  # not the device's default
            notes.append(f"fast engine attention={options.attention!r}: decode attention outside the fused step is "
                         "planned as the flash kernel")
        if device_kind == "cuda" and not (options.compile and options.compile_vision and options.compile_prefill):
            notes.append("fast engine with torch.compile off in part: kernel counts are planned as compiled")
        self.notes = tuple(notes)

    def decode_paths(self, b, spec) -> np.ndarray:
        """'fused' at batch 1 with the fused step, else the experts' kernels the engine runs at that batch size
        (options.decode_moe, the function FastEngine.moe_impl calls)."""
        b = np.asarray(b)
        slots = spec.num_experts_per_tok + spec.n_shared_experts
        sizes, inv = np.unique(b, return_inverse=True)
        moe = np.array([self.o.decode_moe(int(x), slots) for x in sizes], dtype=object)[inv].reshape(b.shape)
        return np.where((b == 1) & self.o.fused, "fused", moe).astype(str)

    def plan(self, c: Call) -> Plan:
        if not family_of(c.spec).fast_engine:
            raise SpecError(f"the fast engine runs {', '.join(fast_engine_models())} only; predict "
                            f"{family_of(c.spec).label} in the reference session mode")
        if c.phase == "vision":
            return self._vision(c)
        if c.phase == "layout":  # the projector stage's one row: its graph's start is charged here
            plan = _gathered_layout(c) if self.o.projector_layout == "gather" else layout(c)
            plan.graph_starts = 1.0  # costs nothing without graphs (the predictor's graph_start_s is then 0)
            return plan
        k = c.kind
        if k == "lm.self_attn":
            return self._attention(c)
        if k in ("lm.input_layernorm", "lm.post_attention_layernorm", "lm.norm"):
            return _rms(c)
        if k.startswith("lm.mlp"):
            return _by_expert_mlp(c, self.o.expert_fusion) if c.path == "triton" else _mlp(c, self.o.moe_rows)
        if k == "lm.embed_tokens":
            if c.fused:  # the embedding row is read inside the first q/k/v kernel; graph_steps steps per replay
                return Plan(rest_launches=0.0, rest_real_bytes=0.0, rest_table=FUSED_GEMV,
                            graph_launches=1.0 / self.o.graph_steps)
            if c.phase == "decode" and self.o.batched_choice == "graph":
                # the choice in the graph (the default on a GPU): best_rows reads every logit and its ban stamp
                # (float32, int32) once; the ban and the rows' choice move a few kilobytes. On an H200 at batch 8 the
                # three kernels cost no measurable time in the graph and the loop's span beyond the replay fell from
                # 73 to 23 us a step (docs/fast-mode.md, "The batched choice in the graph")
                moved = c.b * c.spec.vocab_size * (FP32 + 4)
                choice = Kernel("memory.elementwise", dict(bytes=moved), 0.0, 0.0, CHOICE_LAUNCHES,
                                real_bytes=moved, by_batch=True)
                return Plan([choice], rest_launches=1.0, host_ops=CHOICE_HOST_OPS, graph_launches=1.0)
            if c.phase == "decode":
                # the greedy choice, the history update and the replay call, outside the graph. The host issues a
                # step in 0.16-0.32 ms, well ahead of the GPU, and a step in the generation loop takes 0.02-0.04 ms
                # more than its replay alone (benchmarks/decode_loop_gap.py, an H100 and an H200 at batch 2 and 8:
                # docs/accuracy.md). Priced as before as this row's host time beyond its device time (0.13 ms):
                # without it every set under-predicts batched steps by 5-12%, so part of a step's device time is
                # still missing from the kernels (not traced to one)
                return Plan(rest_launches=1.0 + STEP_OPS, host_ops=STEP_OPS, graph_launches=1.0)
            # embedding, image-slot index_copy (with the per-image layout, the rows' concatenation before it)
            return Plan(rest_launches=2.0 + (self.o.projector_layout == "per_image"), graph_launches=1.0,
                        graph_starts=1.0)
        if k == "lm.lm_head":
            if c.fused:  # final norm + lm_head + per-block best token; then the greedy choice
                head = lm_head(c)
                head.table, head.coords, head.launches = FUSED_LM_HEAD, dict(bytes=head.nbytes), 2.0
                return Plan([head], rest_launches=0.0, rest_real_bytes=0.0, rest_table=FUSED_GEMV)
            return lm_head_and_cast(c)
        raise KeyError(k)

    # ---------------------------------------------------------------------------------------------- vision
    def _vision(self, c: Call) -> Plan:
        s, calls, kind = c.spec, c.calls, c.kind
        if self.sam_kernels and kind.startswith(("sam.norm", "sam.mlp")):
            return _sam_norm(c) if kind.startswith("sam.norm") else _sam_mlp(c)
        shared = common_vision(c, projector_cat=PROJECTOR_CAT)  # SAM's map is channels-last: the cat reads rows
        if shared is not None:
            return shared
        if kind == "sam.patch_embed":
            return patch_embed(c, 2)  # one GEMM over the patches (and the unfold)
        if kind == "sam.pos_embed":  # the engine keeps a table per grid size (fast/vision.Positions)
            return Plan(rest_launches=calls * 1)
        packed = self.o.clip_packed
        if kind.startswith("clip.layer_norm"):
            if not packed:
                return whole("memory.norm", dict(bytes=c.cost.bytes), c, calls)
            share = _clip_share(c, clip_tokens(s, c.side) * c.views)  # one norm over all groups' rows
            return whole("memory.norm", dict(bytes=np.where(share > 0, c.cost.bytes / np.maximum(share, 1e-12),
                                                            c.cost.bytes)), c, share)
        if kind.startswith("sam.attn"):
            return self._sam_attention(c)
        if kind == "clip.embeddings":
            return Plan(rest_launches=calls * 2)
        if kind == "clip.self_attn":
            plan = clip_attention(c)
            plan.kernels[1].table = DEFAULT_SDPA  # the compiled layer's SDPA: torch's own backend choice
            return _clip_packed(c, plan, c.views * clip_tokens(s, c.side), skip=(1,)) if packed else plan
        if kind == "clip.mlp":
            plan = clip_mlp(c, 2)
            # Inductor fuses quick_gelu's three ops into one kernel (read h, write the product) and the residual
            # add is one more (read both, write the sum): what moves, not the eager ops' traffic of the analytic row
            rows, cw, m = c.views * clip_tokens(s, c.side), s.clip_width, s.clip_mlp_dim
            plan.rest_real_bytes = rows * (2 * m + 3 * cw) * c.dt
            return _clip_packed(c, plan, rows) if packed else plan
        raise KeyError(kind)

    def _sam_attention(self, c: Call) -> Plan:
        a = sam_attention(c, einsum_launches=2)
        v, calls, dt, heads = c.views, c.calls, c.dt, c.spec.sam_heads
        if self.o.sam_attention == "dense":  # the reference's dense mask (the broadcast sum and its copy), read by SDPA
            return Plan(a.gemms + [a.mask, a.mask_copy, a.sdpa], rest_launches=calls * 3)
        t, n = _sam_tokens(c), v * a.n  # tokens of the call's views; the attention's (windows padded)
        cw, d = c.spec.sam_width, c.spec.sam_width // heads
        groups = a.n // a.seq
        # bias folded into q/k: [scale*q, rel_h, rel_w] . [k, onehot rows, onehot cols], head dim padded to 8
        dq = -(-(d + 2 * a.span) // 8) * 8
        rel = n * heads * 2 * a.span  # rel_h and rel_w, one term per token, head and row or column
        moved = [
            # the window partition (norm1's output zero-padded and cut into windows): read the map, write the windows
            (0.0 if c.kind.endswith("global") else t * cw + n * cw, 1.0),
            (4 * n * cw, 2.0),  # q and v split out of the q/k/v GEMM's rows, each read and written whole
            # the two relative-position tables for this grid: (2 span - 1) x d read, span x span x d written
            (c.calls * 2 * ((2 * a.span - 1) * d + a.span * a.span * d), 2.0),
            (n * cw + rel + n * heads * dq, 1.0),  # q' = [scale*q, rel_h, rel_w, 0]: read q and rel, write q'
            (n * cw + n * heads * dq, 1.0),  # k' = [k, onehot rows, onehot cols, 0]: read k, write k'
            (2 * n * cw, 1.0),  # the attention's output, heads merged back into rows
        ]
        copies = [_moved(c, "memory.elementwise", nb * dt, k) for nb, k in moved if np.any(nb)]
        # cuDNN's flash kernel (what the compiled block's SDPA runs; attention.default) with q.k at head dim dq and
        # p.v at d: it runs at a head-dim tile of dq rounded up to 64 (the kernel names' last dimension: 128, 192,
        # 256). The table has kernels with one head dim for both products, so it is timed as a blend of the table's
        # kernel at the tile and at d, weighted by the two products' shares of the padded matrix work (tile and d).
        # An empirical rule, chosen on the trace of 5 SAM stages (docs/accuracy.md), where it is within -8% to +10%
        # of each attention; charging each product half a kernel at its own head dim (the kernel's FLOPs exactly)
        # is 7-21% fast there, the whole kernel at the tile 5-26% slow
        tile = -(-dq // 64) * 64
        bh = v * groups * heads / np.maximum(calls, 1.0)
        attention = []
        for dim, weight, share in ((tile, tile / (tile + d), a.sdpa), (d, d / (tile + d), None)):
            attention.append(Kernel(DEFAULT_SDPA, dict(bh=bh, q=a.seq, k=a.seq, d=dim),
                                    share.flops if share else 0.0, share.nbytes if share else 0.0, calls * weight,
                                    real_flops=weight * calls * 4 * bh * a.seq * a.seq * dim,
                                    real_bytes=weight * calls * 4 * bh * a.seq * dim * dt))
        return _whole_row(c, a.gemms + attention + copies)

    # ---------------------------------------------------------------------------------------------- LM
    def _attention(self, c: Call) -> Plan:
        s, dt = c.spec, c.dt
        h, heads = s.hidden_size, s.num_attention_heads
        b, sq, n = c.b, c.sq, c.n
        t, sk = b * sq, n + sq
        kv = kv_write(c)
        kv.launches = 2.0  # keys.copy_ / index_copy_ into the static cache
        io = 4 * t * h * dt  # the query read and the output written: the engine's attention never writes scores
        bucket = np.ceil(sk / self.o.bucket) * self.o.bucket  # a decode step's static cache ends at its bucket
        if c.phase == "prefill":  # SDPA with torch's own backend choice
            attn = lm_attention(c, "default")
            attn.real_bytes = io + b * n * 2 * h * dt
        elif c.fused:  # flash-decoding in the fused step reads the slots up to the position, not the whole bucket
            attn = lm_attention(c, "flash")
            cached = b * sk * 2 * h * dt
            attn.table, attn.real_bytes = FUSED_ATTENTION, io + cached
            # bh, q, k (the bucket), d kept for the fallback to attention.flash
            attn.coords = dict(bh=b * heads, q=sq, k=bucket, d=s.head_dim, bytes=cached)
        elif self.o.attention == "triton":
            # the split-KV kernel and its combine (fast/triton_kernels.py), on their own table: it masks its loads
            # past the position, so it reads the keys and values up to it, but its grid covers every chunk of the
            # static cache up to the bucket's end (the table's fill: the position's share of that length); the keys
            # reach the cache inside the RoPE kernel, the values by one copy (the H100's batched traces: 7 kernels a
            # layer)
            attn = lm_attention(c, "flash")  # coords at the position
            attn.table, attn.launches, kv.launches = SPLIT_KV, 2.0, 1.0
            attn.real_bytes = io + b * sk * 2 * h * dt
            attn.coords = dict(attn.coords, fill=sk / bucket)  # in (0, 1]: the cache ends at or after the position
        else:  # SDPA attends over the static cache up to the end of the current bucket (flash table)
            attn = lm_attention(c, "flash")
            attn.real_bytes = io + b * (bucket - sq) * 2 * h * dt
            attn.coords = dict(bh=b * heads, q=sq, k=bucket, d=s.head_dim)
        qkv = Kernel("gemm", dict(m=t, n=3 * h, k=h), 6 * t * h * h, 3 * (2 * t * h + h * h) * dt, 1.0,
                     real_bytes=(4 * t * h + 3 * h * h) * dt, by_batch=True)  # one matmul over stacked q/k/v
        o = Kernel("gemm", dict(m=t, n=h, k=h), 2 * t * h * h, (2 * t * h + h * h) * dt, 1.0, by_batch=True)
        kv.by_batch = True  # the static cache: this step's entry only
        if c.fused:  # norm + q/k/v GEMV + RoPE + cache write; attention; o_proj + residual: 3 kernels
            qkv.table = o.table = kv.table = FUSED_GEMV
            qkv.coords, o.coords = dict(bytes=qkv.real_bytes), dict(bytes=o.nbytes)
            kv.coords, kv.launches = dict(bytes=qkv.real_bytes), 0.0
            return Plan([qkv, attn, o, kv], rest_launches=0.0, rest_real_bytes=0.0, rest_table=FUSED_GEMV,
                        rest_by_batch=True)
        return Plan([qkv, attn, o, kv], rest_launches=2.0, rest_real_bytes=9 * t * h * dt,
                    rest_by_batch=True)  # RoPE, head merge


def _sam_tokens(c: Call):
    """Tokens of a SAM call's views (the map, unpadded; the attention's padded windows are kernels.sam_attention's)."""
    return c.views * sam_patches(c.spec, c.side) ** 2


def _moved(c: Call, table: str, nbytes, launches: float) -> Kernel:
    """`launches` kernels of a call (all its views) that move `nbytes` in all, each timed at its share of them."""
    per = nbytes / np.maximum(c.calls, 1.0) / launches
    return Kernel(table, dict(bytes=per), 0.0, 0.0, c.calls * launches, real_flops=0.0, real_bytes=nbytes)


def _whole_row(c: Call, kernels: list[Kernel]) -> Plan:
    """A plan of exactly `kernels`, the last a memory kernel: the row's analytic work they do not claim (the
    elementwise ops' FLOPs and bytes) becomes its share, so no remainder is timed beside them (in a row without
    overlap credit a kernel's share moves time between the roofline and the excess, never adds any; with
    work="analytic" the share is timed on that memory kernel's table, as a remainder would be)."""
    last = kernels[-1]
    last.flops = last.flops + np.maximum(c.cost.flops - sum(k.flops for k in kernels), 0.0)
    last.nbytes = last.nbytes + np.maximum(c.cost.bytes - sum(k.nbytes for k in kernels), 0.0)
    return Plan(kernels, rest_launches=0.0, rest_real_bytes=0.0)


def _sam_norm(c: Call) -> Plan:
    """A SAM block's LayerNorm as Inductor compiles it: norm1 reads the block's input and writes the normalised
    map; norm2 is one kernel with the attention's residual add (and, windowed, the windows put back, their padding
    cropped away unread): it reads the input and the attention's output and writes the normalised map. The residual
    stream itself is written by the MLP's last kernel (_sam_mlp)."""
    t = _sam_tokens(c)
    rows = 2 * t if c.kind.startswith("sam.norm1") else 3 * t
    nbytes = rows * c.spec.sam_width * c.dt
    return _whole_row(c, [_moved(c, "memory.norm", nbytes, 1.0)])


def _sam_mlp(c: Call) -> Plan:
    """SAM's MLP: the two GEMMs (bias in their epilogue), the exact GELU as one kernel (read and write the hidden
    rows) and the block's residual add (the input, the attention's output, windowed read through the crop of its
    windows, and the MLP's output read; the new residual stream written)."""
    plan = sam_mlp(c, elementwise=0)
    t = _sam_tokens(c)
    cw, dt = c.spec.sam_width, c.dt
    return _whole_row(c, plan.kernels + [_moved(c, "memory.elementwise", 2 * t * c.spec.sam_mlp_dim * dt, 1.0),
                                         _moved(c, "memory.elementwise", 4 * t * cw * dt, 1.0)])


def _clip_share(c: Call, rows):
    """This view group's share of the CLIP rows the engine packs through each layer."""
    return np.where(c.packed_rows > 0, rows / np.maximum(c.packed_rows, 1e-9), 0.0)


def _clip_packed(c: Call, plan: Plan, rows, skip: tuple[int, ...] = ()) -> Plan:
    """The engine runs every view group's CLIP rows through each layer together (fast/vision.run_clip, packed):
    one GEMM over all groups' rows, reading the weights once. This group's part of it is its share of the rows:
    the GEMMs are looked up at the packed M, their launches and weight reads split by the share. Attention
    (`skip`) still runs per group (the groups' sequence lengths differ)."""
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


def _gathered_layout(c: Call) -> Plan:
    """fast/vision.run_projector's layout: one gather of every image slot from the projected rows and the layout
    vectors (the projector's GEMMs write their rows into its source), whatever the batch: it reads and writes
    each slot's row."""
    moved = 2.0 * np.asarray(c.cost.act_write, dtype=float)
    gather = Kernel(GATHER_ROWS, dict(bytes=moved), 0.0, c.cost.bytes, 1.0, real_bytes=moved)
    return Plan([gather], rest_launches=0.0)


def _rms(c: Call) -> Plan:
    el = c.b * c.sq * c.spec.hidden_size
    real = 2 * el * c.dt + c.spec.hidden_size * c.dt  # one fused kernel: read x, write the output
    if c.fused:  # inside the next GEMV kernel, which reads x anyway: timed at that kernel's size (q/k/v)
        return whole(FUSED_GEMV, dict(bytes=3 * c.spec.hidden_size ** 2 * c.dt), c, 0.0, real_bytes=el * c.dt)
    return whole("memory.norm", dict(bytes=real), c, 1.0, real_bytes=real)


def _fused_moe_bytes(c: Call) -> tuple[float, float]:
    """Weight bytes of the fused step's two MoE kernels that several rows share: the router kernel (fp32 router
    + the shared experts' gate/up) and the down kernel (the routed and the shared experts' down). Each row's part
    is timed at its kernel's size: a GEMV's efficiency depends on the bytes the whole launch streams."""
    s, dt = c.spec, c.dt
    h, si = s.hidden_size, s.shared_intermediate_size
    routed = s.num_experts_per_tok * s.moe_intermediate_size
    return s.n_routed_experts * h * FP32 + 2 * si * h * dt, (routed + si) * h * dt


def _routing_kernel(c: Call, nbytes: float) -> Plan:
    """The router's work as one of the engine's Triton kernels that computes the logits and routes (the fused
    batch-1 router, the batched route_hidden), timed on memory.fused_gemv at the `nbytes` it streams; nothing else
    launches."""
    gate = router(c)
    gate.table, gate.coords = FUSED_GEMV, dict(bytes=nbytes)
    return Plan([gate], rest_launches=0.0, rest_real_bytes=0.0, rest_table=FUSED_GEMV)


def _mlp(c: Call, moe_rows: str = "torch") -> Plan:
    s, dt = c.spec, c.dt
    h, t = s.hidden_size, c.b * c.sq
    if c.kind == "lm.mlp.dense":
        gu, down = swiglu(c, s.intermediate_size)
        gu.launches, gu.coords = 1.0, dict(m=t, n=2 * s.intermediate_size, k=h)  # one GEMM over stacked w13
        if c.fused:
            for k in (gu, down):
                k.table, k.coords = FUSED_GEMV, dict(bytes=k.real_bytes if k.real_bytes is not None else k.nbytes)
            return Plan([gu, down], rest_launches=0.0, rest_real_bytes=0.0, rest_table=FUSED_GEMV)
        return Plan([gu, down], rest_launches=2.0, rest_real_bytes=t * (3 * s.intermediate_size + 3 * h) * dt)
    if c.kind == "lm.mlp.gate":
        if c.fused:  # router logits, softmax, top-k and the shared experts' gate/up SwiGLU: one kernel
            return _routing_kernel(c, _fused_moe_bytes(c)[0])
        return Plan([router(c)], rest_launches=3.0)  # softmax, top-k, shared-slot ids
    if c.kind == "lm.mlp.experts":
        im = s.moe_intermediate_size
        r = routed_experts(c)
        gu, down = r.gu, r.down
        r.read_routed_weights()
        if c.fused:  # routed gate/up + SwiGLU; down (with the shared experts' down) + weighted sum + residual
            for kk in (gu, down):
                kk.table = FUSED_GEMV
            gu.coords, down.coords = dict(bytes=gu.real_bytes), dict(bytes=_fused_moe_bytes(c)[1])
            gu.launches, down.launches = 1.0, 1.0
            return Plan([gu, down], rest_launches=0.0, rest_real_bytes=0.0, rest_table=FUSED_GEMV)
        gu.launches, down.launches = 1.0, 1.0
        by_rank = _observed_rows_by_rank(c)
        if by_rank is not None:  # the groups as the observed loads make them: each rank bucket at its own tiles
            kernels = (_ranked_grouped(gu, by_rank, dict(n=2 * im, k=h), weight_bytes=2 * h * im * c.dt,
                                       row_bytes=(h + 2 * im) * c.dt)
                       + _ranked_grouped(down, by_rank, dict(n=h, k=im), weight_bytes=h * im * c.dt,
                                         row_bytes=(im + h) * c.dt))
        else:
            rows = _routed_group_rows(c, r)
            _grouped(gu, rows, dict(n=2 * im, k=h))
            _grouped(down, rows, dict(n=h, k=im))
            kernels = [gu, down]
        if moe_rows == "triton":  # moe_rows' kernels and SwiGLU by their bytes; the routing's small kernels left
            return Plan(kernels + _row_kernels(c), rest_launches=ROUTING_LAUNCHES,
                        rest_real_bytes=ROUTING_LAUNCHES * _routing_bytes(c))
        # 23 kernels per MoE layer outside the fused step, counted with the profiler on an H100 (torch 2.11's
        # Inductor, decode batch 8; docs/fast-mode.md): the gate row's 4, the two grouped GEMMs and 17 more: their
        # two data-preparation kernels, the routing's scatters, maxima and cumulative sums, the gather, SwiGLU and
        # the weighted combine + residual. The prefill runs the same MoE code; its count was not traced
        return Plan(kernels, rest_launches=17.0)
    if c.kind == "lm.mlp.shared_experts":
        gu, down = swiglu(c, s.shared_intermediate_size)
        gu.launches = down.launches = 0.0  # run inside the routed kernels (two extra experts of width 896)
        if c.fused:  # gate/up inside the router's kernel, down inside the routed experts' down kernel
            router_kernel, down_kernel = _fused_moe_bytes(c)
            gu.table = down.table = FUSED_GEMV
            gu.coords, down.coords = dict(bytes=router_kernel), dict(bytes=down_kernel)
            return Plan([gu, down], rest_launches=0.0, rest_real_bytes=0.0, rest_table=FUSED_GEMV)
        rows = _even_group_rows(t)  # each shared expert takes every token
        _grouped(gu, rows, dict(n=2 * s.moe_intermediate_size, k=h))
        _grouped(down, rows, dict(n=h, k=s.moe_intermediate_size))
        return Plan([gu, down], rest_launches=0.0)
    raise KeyError(c.kind)


def _row_kernels(c: Call) -> list[Kernel]:
    """fast/moe_rows.py's kernels of one MoE call and the SwiGLU between the grouped GEMMs, each by the bytes it
    moves (engine work only: their analytic share stays with the row's remainder):
    * the grouping: a memset, the counts pass, the chunk offsets and the places pass; the two passes compare every
      row with every expert lane and sum or scan the one-hot [rows, lanes] int32 matrix in registers, timed on
      their own table by that work (calibration/ops.GROUP_BYTES_PER_ROW); a profile without the table prices it
      as streamed bytes on the elementwise table, about half what the kernels took on an H200 (55.6 us at 14,088
      tokens);
    * the copy into expert order: each token row read once, written to its slots;
    * SwiGLU: gate and up read, the product written;
    * the weighted combine: each slot row, the places and weights and the residual read, the sum written."""
    s, dt = c.spec, c.dt
    h, im = s.hidden_size, s.moe_intermediate_size
    t = c.b * c.sq
    slots = s.num_experts_per_tok + s.n_shared_experts  # every token takes its routed and its shared experts' slots
    rows = t * slots

    def streamed(table, nbytes, launches=1.0):
        return Kernel(table, dict(bytes=nbytes), 0.0, 0.0, launches, real_bytes=nbytes)

    onehot = 2 * rows * expert_lanes(s.n_routed_experts + s.n_shared_experts) * FP32  # its two passes
    return [streamed(GROUP_ROWS, onehot, 4.0),  # memset, counts, chunk offsets, places
            streamed(GATHER_ROWS, t * h * dt * (1 + slots)),
            streamed("memory.elementwise", rows * 3 * im * dt),
            streamed(GATHER_ROWS, t * h * dt * (slots + 2) + rows * (8 + FP32))]  # int64 places, float32 weights


def _routing_bytes(c: Call):
    """Bytes one routing kernel moves: the float32 expert scores of every token, read and written once."""
    return 2 * c.b * c.sq * c.spec.n_routed_experts * FP32


def tiled_rows(rows):
    """The rows a grouped GEMM's group of `rows` rows pays for: whole tiles of GROUPED_TILE_ROWS above half a tile
    (below, the kernel takes smaller tiles, which the table measures as they are)."""
    rows = np.asarray(rows, dtype=float)
    tiles = np.ceil(rows / GROUPED_TILE_ROWS) * GROUPED_TILE_ROWS
    return np.where(rows > GROUPED_TILE_ROWS / 2, tiles, rows)


def _even_group_rows(rows) -> tuple:
    """(rows each group holds, rows it pays for) of groups of `rows` rows each."""
    return np.asarray(rows, dtype=float), tiled_rows(rows)


def _routed_group_rows(c: Call, r) -> tuple:
    """(mean rows per touched expert, mean rows each pays for) of one call's routed groups where no loads are known.
    Uniform routing spreads the rows evenly (each expert's count by about its square root): every group pays for the
    mean's whole tiles. An observed routing without loads (runs measured before they were recorded) is priced at
    the mean: its groups are far from even (the synthetic router sends 60-95% of a layer's rows to one expert), so
    the mean's padding is not theirs."""
    mean = np.asarray(r.per, dtype=float)
    return (mean, tiled_rows(mean)) if c.routing is None else (mean, mean)


# ranks of experts (largest group first) priced together when an observed routing has its loads: the largest
# group, the next three, the next twelve, the rest. Each bucket is looked up at its own mean rows in whole tiles;
# one lookup at the mean of all groups priced the synthetic router's skew 25% fast, these four within 3 points of a
# lookup per group (docs/accuracy.md, "Loads recorded")
RANK_BUCKETS = ((0, 1), (1, 4), (4, 16), (16, None))


def _observed_rows_by_rank(c: Call):
    """Rows per rank of expert [points, E] of a call under an observed routing that recorded its loads, every point
    inside the recorded range; else None (the plan then prices the mean group)."""
    by_rank = observed_loads(c)
    if by_rank is None or np.isnan(by_rank).any():
        return None
    return by_rank


def _ranked_grouped(k: Kernel, by_rank, shape: dict, weight_bytes: float, row_bytes: float) -> list:
    """One routed grouped GEMM as kernels per rank bucket (RANK_BUCKETS): each holds its share of `k`'s analytic
    work (by rows), reads its experts' weights and its rows, and is looked up at its groups' mean rows in whole
    tiles; the launch is the first bucket's."""
    held_all = np.maximum(by_rank.sum(-1), 1e-9)
    out = []
    for i, (a, z) in enumerate(RANK_BUCKETS):
        part = by_rank[..., a:z]
        held, groups = part.sum(-1), (part > 0).sum(-1).astype(float)
        paid = tiled_rows(part).sum(-1)
        share = held / held_all
        per = np.where(groups > 0, paid / np.maximum(groups, 1.0), 1.0)
        out.append(Kernel("grouped_gemm", dict(tokens=per, **shape), k.flops * share, k.nbytes * share,
                          launches=1.0 if i == 0 else 0.0,
                          real_flops=(k.flops / held_all) * paid,  # the work of the rows paid for
                          real_bytes=groups * weight_bytes + held * row_bytes))
    return out


def _grouped(k: Kernel, rows: tuple, shape: dict) -> None:
    """Price `k` (a SwiGLU GEMM over groups; `rows`: (mean rows a group holds, mean rows it pays for in whole
    tiles)) on the grouped_gemm table at the rows paid for, for the work of those rows (its analytic share stays
    the real rows')."""
    held, paid = rows
    k.table, k.coords = "grouped_gemm", dict(tokens=paid, **shape)
    k.real_flops = (k.flops if k.real_flops is None else k.real_flops) * paid / np.maximum(held, 1e-9)


def _by_expert_bytes(c: Call) -> tuple[float, float]:
    """Bytes each by-expert launch streams: the touched routed experts' and the shared experts' weights (gate/up,
    then down) and the rows' activations."""
    s, dt = c.spec, c.dt
    h, im, t = s.hidden_size, s.moe_intermediate_size, c.b * c.sq
    experts = touched_experts(c, t) + s.n_shared_experts
    slots = t * (s.num_experts_per_tok + s.n_shared_experts)
    return (experts * 2 * im * h + t * h + slots * im) * dt, (experts * im * h + slots * (im + h)) * dt


def _by_expert_mlp(c: Call, fusion: str = "separate") -> Plan:
    """Decode at a batch size the engine runs with Triton's routing and by-expert kernels (fast/options.decode_moe):
    the routing, then one gate/up + SwiGLU launch and one down launch over the routed and the shared experts
    together (one program per expert and block of output rows, each touched expert read once). No routing data is
    prepared. fusion 'separate': the router GEMM, its reduction and one routing kernel, and the weighted combine +
    residual as a kernel of its own; 'fused' (triton_kernels.route_hidden, moe_gemv's combine): one routing kernel
    that computes the logits, priced like the fused batch-1 router by the bytes it streams, and the combine inside
    the down kernel, on a table of its own (`memory.moe_gemv_combine`) that times the two expert launches so."""
    if c.kind == "lm.mlp.dense":
        return _mlp(c)
    if c.kind == "lm.mlp.gate" and fusion == "fused":
        t, h, e = c.b * c.sq, c.spec.hidden_size, c.spec.n_routed_experts
        return _routing_kernel(c, (e * h + t * e) * FP32 + t * h * c.dt)
    if c.kind == "lm.mlp.gate":  # the float32 router GEMM (cuBLAS splits K: the GEMM and its reduction), then
        # softmax, top-k and the shared ids in one kernel: three kernels a layer in the H100's batched traces
        return Plan([router(c)], rest_launches=2.0)
    s = c.spec
    up_bytes, down_bytes = _by_expert_bytes(c)
    if c.kind == "lm.mlp.experts":
        r = routed_experts(c)
        r.read_routed_weights()
        gu, down, rest = r.gu, r.down, 0.0 if fusion == "fused" else 1.0  # the combine
    elif c.kind == "lm.mlp.shared_experts":
        gu, down = swiglu(c, s.shared_intermediate_size)
        gu.launches = down.launches = 0.0  # inside the routed experts' launches
        rest = 0.0
    else:
        raise KeyError(c.kind)
    gu.table = down.table = MOE_GEMV_COMBINE if fusion == "fused" else MOE_GEMV
    # the table times the two launches together (calibration/ops.py): each is looked up at the pair's bytes and
    # the kernels' token tile. A table measured before that axis existed was timed at 8-9 tokens, a tile of 16: at
    # batches 17-64 it under-prices the kernels by what the larger tiles cost
    gu.coords = down.coords = dict(bytes=up_bytes + down_bytes, tokens=expert_token_tile(c.b * c.sq))
    if c.kind == "lm.mlp.experts":
        gu.launches = down.launches = 1.0
    return Plan([gu, down], rest_launches=rest)
