"""The benchmarked kernels and how they are timed (calibration/microbench.py runs them over shape grids).

Each table kind has one op (`kernel_op`): a GEMM through F.linear (weights [N, K], as nn.Linear holds them), a
copy, an elementwise add, a LayerNorm over 1,024-wide rows, a GEMV, attention through SDPA (the LM's backends, a
dense additive mask as SAM runs it, flash only) or the reference LM's eager ops, and a grouped expert GEMM
(`torch._grouped_mm`; `bmm` where it cannot run). `measure_entry` times one shape: on a GPU a CUDA graph of N
calls over rotating inputs (enough copies to spill the L2), replayed and timed with CUDA events; on a CPU eager
calls and perf_counter. `launch_costs` measures the per-launch costs of the profile's `launch` block.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from ..fast.options import expert_lanes
from ..spec import DTYPE_BYTES
from .profile import MNK_KINDS, table_kind

ATTN_KERNELS = {"sdpa": 1, "flash": 1, "default": 1, "sdpa_bias": 1, "eager": 6, "eager.causal": 10, "split_kv": 2}
GROUPED_EXPERTS = 64
# The fused decode kernels are timed at the LM's widths (hidden 1280, 10 heads of 128): their block sizes are tuned
# for them, and the table's one axis (bytes read) then moves with the weight rows or the cached tokens.
FUSED_WIDTH, FUSED_HEADS, FUSED_HEAD_DIM = 1280, 10, 128
FUSED_ATTN_SLOT_BYTES = 2 * FUSED_HEADS * FUSED_HEAD_DIM * 2  # one cached token's keys and values, bf16
# The by-expert MoE kernels likewise at the LM's expert widths, rows of 8 slots (6 routed experts and 2 shared): the
# bytes axis moves with the number of distinct experts the rows touch, the tokens axis is the rows' token tile (16,
# 32 and 64 rows; MOE_TOKENS rows, 9 for all 66 experts, where a table has no such axis)
MOE_INNER, MOE_TOKENS, MOE_SLOTS, MOE_MAX_EXPERTS = 896, 8, 8, 66
MOE_EXPERT_BYTES = 3 * FUSED_WIDTH * MOE_INNER * 2  # one expert's gate, up and down weights, bf16
# The MoE's grouping kernels (fast/moe_rows.group_rows) at the LM's 66 experts (64 routed, 2 shared), 8 slots per
# token: the table's axis is the one-hot work of its two passes over the rows, GROUP_BYTES_PER_ROW per (token, slot)
# row (each pass compares a row with 128 expert lanes of int32), the measure fast/plan.py prices the grouping by
GROUP_EXPERTS, GROUP_SLOTS = 66, 8
GROUP_BYTES_PER_ROW = 2 * expert_lanes(GROUP_EXPERTS) * 4
# SAM's residual stream tables at its width and a 1024 px view's patch grid (the stream's bytes move with the views)
SAM_WIDTH, SAM_GRID = 768, 64


@dataclass
class Settings:
    device: str
    quick: bool
    budget_s: float
    flops_cap: float  # per call
    memory_cap: float  # bytes of live inputs (all rotating copies)
    target_s: float  # device time one timed replay should take
    repeats: int
    max_inner: int
    l2_bytes: int
    experts: int = GROUPED_EXPERTS
    notes: list = field(default_factory=list)


def _dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def kernel_op(name: str, c: dict, dev: str, experts: int):
    """(make one input set, run the kernel on an input set, input bytes per set, kernels per call)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kind = table_kind(name)
    gen = torch.Generator(device=dev).manual_seed(0)
    rnd = lambda *shape, dt=torch.bfloat16: torch.randn(*shape, device=dev, dtype=dt, generator=gen)  # noqa: E731
    i = {k: int(round(v)) for k, v in c.items()}
    if kind in ("gemm", "linear"):  # F.linear; a linear entry with its bias (the addmm the projector runs)
        dt = _dtype(name.split(".")[1])
        s = DTYPE_BYTES[name.split(".")[1]]
        bias = i["n"] if kind == "linear" else 0

        def make():
            x, w = rnd(i["m"], i["k"], dt=dt), rnd(i["n"], i["k"], dt=dt)
            return (x, w, rnd(bias, dt=dt)) if bias else (x, w)

        return make, lambda x: F.linear(*x), (i["m"] * i["k"] + i["n"] * i["k"] + bias) * s, 1
    if kind == "conv":  # nn.Conv2d with kernel = stride = the patch, on square views of side 64 patches or less
        dt = _dtype(name.split(".")[1])
        patch = max(int(round(math.sqrt(i["k"] / 3))), 1)
        grid = min(SAM_GRID, max(int(math.isqrt(i["m"])), 1))
        views = max(i["m"] // (grid * grid), 1)
        return (lambda: (rnd(views, 3, grid * patch, grid * patch, dt=dt), rnd(i["n"], 3, patch, patch, dt=dt),
                         rnd(i["n"], dt=dt)),
                lambda x: F.conv2d(x[0], x[1], x[2], stride=patch),  # with its bias, as PatchEmbed's nn.Conv2d
                views * 3 * (grid * patch) ** 2 * DTYPE_BYTES[name.split(".")[1]], 1)
    if kind == "grouped_gemm":
        t, n, k = i["tokens"], i["n"], i["k"]
        offs = torch.arange(1, experts + 1, device=dev, dtype=torch.int32) * t
        make = lambda: (rnd(experts * t, k), rnd(experts, n, k))  # noqa: E731
        grouped = lambda x: torch._grouped_mm(x[0], x[1].transpose(1, 2), offs=offs)  # noqa: E731
        bmm = lambda x: torch.bmm(x[0].view(experts, t, k), x[1].transpose(1, 2))  # noqa: E731
        try:
            if not hasattr(torch, "_grouped_mm"):
                raise RuntimeError("no torch._grouped_mm")
            grouped(make())
            return make, grouped, experts * (t * k + n * k) * 2, 1
        except Exception:  # CPU, or a GPU/dtype without a grouped GEMM kernel: the batched GEMM stand-in
            return make, bmm, experts * (t * k + n * k) * 2, 1
    if kind == "memory":
        what = name.split(".")[1]
        nbytes = max(int(c["bytes"]), 64)
        if what.startswith("fused_"):
            return _fused_op(what, nbytes, dev, rnd)
        if what in ("moe_gemv", "moe_gemv_combine"):
            return _moe_gemv_op(nbytes, dev, rnd, combine=what == "moe_gemv_combine", tokens=int(c.get("tokens", 0)))
        if what == "group_rows":
            return _group_rows_op(nbytes, dev)
        if what == "copy":
            n = nbytes // 4  # bf16 elements: read + write = bytes
            return (lambda: (rnd(n), torch.empty(n, device=dev, dtype=torch.bfloat16)),
                    lambda x: x[1].copy_(x[0]), 2 * n * 2, 1)
        if what == "cast":  # bf16 -> float32 (the lm_head's logits): read two bytes, write four
            n = max(nbytes // 6, 1)
            return lambda: rnd(n), lambda x: x.float(), 2 * n, 1  # an input set: one bf16 tensor
        if what == "elementwise":
            n = max(nbytes // 6, 1)  # two reads and a write
            return lambda: (rnd(n), rnd(n)), lambda x: torch.add(x[0], x[1]), 2 * n * 2, 1
        if what == "transposed_cat":  # [rows, 1024] beside [1024, rows].T -> [rows, 2048]: read both, write both
            width = 1024  # the reference model's projector input (its SAM map is channels-first in memory)
            rows = max(nbytes // (8 * width), 1)
            return (lambda: (rnd(rows, width), rnd(width, rows)),
                    lambda x: torch.cat([x[0], x[1].t()], dim=-1), 4 * rows * width, 1)
        if what == "projector_cat":  # the fast engine's projector input: read both halves, write both
            return _projector_input_op(nbytes, rnd)
        if what in ("permuted_copy", "permuted_add"):  # SAM's residual stream (calibration/profile.py)
            passes = 2 if what == "permuted_copy" else 3  # read, write / read both, write
            n, p = _stream_shape(nbytes // (passes * 2))
            stream = lambda: rnd(n, SAM_WIDTH, p, p).permute(0, 2, 3, 1)  # noqa: E731
            one = n * SAM_WIDTH * p * p * 2  # an input set's bytes: one stream to copy, two to add
            if what == "permuted_copy":
                return stream, lambda x: x.contiguous(), one, 1
            return lambda: (stream(), rnd(n, p, p, SAM_WIDTH)), lambda x: x[0] + x[1], 2 * one, 1
        if what == "gather_rows":  # index_select of [rows, 1280] bf16 rows (the fast projector's layout): read, write
            width = 1280
            rows = max(nbytes // (4 * width), 1)
            where = torch.arange(rows, device=dev)
            where[16::17] = rows  # every 17th slot from one extra row, as a newline column every 16 features
            return (lambda: (rnd(rows + 1, width), where),
                    lambda x: x[0].index_select(0, x[1]), 4 * rows * width, 1)
        if what == "broadcast":  # [rows, 1280] bf16 times a [1280] row (RMSNorm's weight): the stride-0 operand
            # takes TensorIterator's non-vectorised path, as every eager op with a broadcast or strided operand
            width = 1280  # (the reference LM's RoPE on transposed q and k, the norms' weight); read, write
            rows = max(nbytes // (4 * width), 1)
            return (lambda: (rnd(rows, width), rnd(width)), lambda x: x[0] * x[1], 4 * rows * width, 1)
        if what == "index_put":  # rows written to scattered places by an index (the reference MoE's
            # out[order[rows]] = expert(x)): read the rows, write them; [rows, 1280] bf16, the index a permutation
            width = 1280
            rows = max(nbytes // (4 * width), 1)
            where = torch.randperm(rows, device=dev, generator=gen)

            def put(x):
                x[0][where] = x[1]
            return (lambda: (torch.empty(rows, width, device=dev, dtype=torch.bfloat16), rnd(rows, width)), put,
                    4 * rows * width, 1)
        if what == "norm":
            width = 1024
            rows = max(nbytes // (4 * width), 1)  # read and write [rows, 1024] bf16
            return (lambda: (rnd(rows, width), torch.ones(width, device=dev, dtype=torch.bfloat16)),
                    lambda x: F.layer_norm(x[0], (width,), x[1]), rows * width * 2, 1)
        k = 2048
        n = max(nbytes // (2 * k), 1)  # weight [n, 2048] bf16 dominates
        return lambda: (rnd(1, k), rnd(n, k)), lambda x: F.linear(x[0], x[1]), (n * k + k) * 2, 1
    if kind == "bias":
        return _dense_bias_op(name.split(".")[1], i["bh"], i["side"], rnd)
    impl = name.split(".")[1]
    causal = kind == "attention_causal"
    bh, d = i["bh"], i["d"]
    q, k = (i["s"], i["s"]) if causal else (i["q"], i["k"])
    make = lambda: (rnd(1, bh, q, d), rnd(1, bh, k, d), rnd(1, bh, k, d))  # noqa: E731
    nbytes = bh * (q + 2 * k) * d * 2
    if impl == "eager":  # the reference LM's eager attention (model/decoder.py Attention._eager), op for op
        def eager(x):
            qq, kk, vv = x
            scores = torch.matmul(qq, kk.transpose(-1, -2)) * d ** -0.5
            if causal:
                mask = torch.ones(q, k, dtype=torch.bool, device=qq.device).tril(diagonal=k - q)
                scores = scores.masked_fill(~mask, float("-inf"))
            probs = torch.softmax(scores.float(), dim=-1).to(qq.dtype)
            return torch.matmul(probs, vv)
        return make, eager, nbytes, ATTN_KERNELS["eager.causal" if causal else "eager"]
    if impl == "sdpa_bias":  # SAM: a dense additive mask, default SDPA backends
        return (lambda: (*make(), rnd(1, bh, q, k)),
                lambda x: F.scaled_dot_product_attention(x[0], x[1], x[2], attn_mask=x[3]), nbytes + bh * q * k * 2, 1)
    if impl == "split_kv":  # the fast engine's batched decode attention (fast/triton_kernels.py: partial + combine),
        # one query per row at position k - 1 of a static cache of split_kv_length(k, fill) slots: its grid of key
        # chunks covers the whole cache, the chunks past the position load nothing (a GPU with Triton only)
        from ..fast.triton_kernels import decode_attention_splitkv

        pos = torch.tensor([k - 1], device=dev, dtype=torch.long)
        length = split_kv_length(k, c.get("fill", 1.0))
        return ((lambda: (rnd(1, bh, d), rnd(1, bh, length, d), rnd(1, bh, length, d))),
                lambda x: decode_attention_splitkv(x[0], x[1], x[2], pos), nbytes, ATTN_KERNELS["split_kv"])
    if impl == "default":  # torch's own backend choice, as the fast engine's layers call it (no sdpa_kernel)
        return make, lambda x: F.scaled_dot_product_attention(x[0], x[1], x[2], is_causal=causal), nbytes, 1
    backends = ([SDPBackend.FLASH_ATTENTION] if impl == "flash" else
                [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])  # the LM's list

    def sdpa(x):
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(x[0], x[1], x[2], is_causal=causal)
    return make, sdpa, nbytes, 1


def _stream_shape(elements: int) -> tuple[int, int]:
    """(views, grid side) of a SAM residual stream of about `elements` elements: 1024 px views (a 64 x 64 grid) as
    many as fit, else one view of a smaller square grid."""
    views = max(-(-elements // (SAM_WIDTH * SAM_GRID ** 2)), 1)  # the grid then fitted to the elements: the entry
    side = math.isqrt(max(elements // (views * SAM_WIDTH), 1))  # moves its bytes within a few percent
    return views, max(side, 2)  # at 1 x 1 the permuted view is contiguous: no copy to time


def _dense_bias_op(what: str, bh: int, side: int, rnd):
    """SAM's dense bias as model/sam.py builds it for `bh` attended squares of side `side`: rel_h and rel_w from the
    einsums (permuted strides), their broadcast sum [bh, side, side, side, side] ("broadcast"), then its reshape to
    [bh, side^2, side^2], a copy of the non-contiguous sum ("strided")."""
    import torch

    def rel():
        q = rnd(bh, side, side, 64)
        table = rnd(side, side, 64)
        return torch.einsum("bhwc,hkc->bhwk", q, table), torch.einsum("bhwc,wkc->bhwk", q, table)

    def summed(x):
        return x[0][:, :, :, :, None] + x[1][:, :, :, None, :]

    if what == "broadcast":  # (make, run, bytes an input set holds, kernels per call)
        return rel, summed, 4 * bh * side ** 3, 1
    return (lambda: (summed(rel()),), lambda x: x[0].reshape(bh, side * side, side * side), 2 * bh * side ** 4, 1)


def _projector_input_op(nbytes: int, rnd):
    """DeepSeek-OCR's projector input (`DeepseekOCRModel.projector_input`) as the fast engine builds it, over
    `nbytes // 8192` feature rows: each view's CLIP features without the CLS row, beside SAM's map flattened. The
    fast engine's patch embedding is a GEMM over patch rows (fast/vision.py), so SAM's stream is channels-last in
    memory, the neck (neck(x.permute(0, 3, 1, 2))) gets a channels-last view, its convs keep that layout, and the
    flattened map reads as whole rows; only the CLIP half skips a row per view. (The reference model's patch
    embedding is a conv: its stream and map stay channels-first, and its cat reads SAM through a transpose, which
    memory.transposed_cat times.) Views of up to 256 positions (a 1,024-pixel view's
    16 x 16), as many as the rows need, each map one row of positions (the same layout in memory)."""
    import torch

    from ..model.deepseek_ocr import DeepseekOCRModel

    width = 1024
    rows = max(nbytes // (8 * width), 1)
    views = -(-rows // 256)
    positions = rows // views
    rows = views * positions

    def make():
        clip = rnd(views, positions + 1, width)
        sam = rnd(views, width, 1, positions).contiguous(memory_format=torch.channels_last)
        return clip, sam

    return make, lambda x: DeepseekOCRModel.projector_input(x[0], x[1]), 4 * rows * width, 1


def _fused_op(what: str, nbytes: int, dev: str, rnd):
    """The fast engine's fused batch-1 decode kernels, launched as the engine launches them (programmatic
    dependent launch on sm90+, so a graph of them overlaps each launch with the previous kernel's run):
    fused_gemv is the o_proj GEMV + residual kernel over a [rows, 1280] weight (every weight-reading kernel of the
    step but the lm_head is this GEMV with its neighbours' elementwise work folded in); fused_lm_head the lm_head
    kernel over a [vocabulary, 1280] weight (the final norm, float32 logits, each block's best token past the
    n-gram ban's stamps); fused_attention the flash-decoding kernel over `nbytes` of cached keys and values."""
    import torch

    from ..fast.decode_kernels import BLOCKS, _attention, _lm_head, _oproj_residual, attention_blocks
    from ..fast.triton_kernels import next_pow2, triton

    if not dev.startswith("cuda"):
        raise RuntimeError("the fused decode kernels run on a CUDA GPU only")
    pdl = torch.cuda.get_device_capability(dev)[0] >= 9
    launch = {"PDL": True, "launch_pdl": True} if pdl else {}
    if what == "fused_gemv":
        bn, bk, warps = BLOCKS["oproj"]
        rows = max(nbytes // (2 * FUSED_WIDTH) // bn * bn, bn)
        make = lambda: (rnd(FUSED_WIDTH), rnd(rows, FUSED_WIDTH), rnd(rows))  # noqa: E731

        def gemv(x):
            _oproj_residual[(rows // bn,)](x[0], x[1], x[2], H=FUSED_WIDTH, BN=bn,
                                           BK=min(bk, next_pow2(FUSED_WIDTH)), num_warps=warps, **launch)
        return make, gemv, (rows * FUSED_WIDTH + FUSED_WIDTH + 2 * rows) * 2, 1
    if what == "fused_lm_head":
        bn, bk, warps = BLOCKS["lm_head"]
        vocab = max(nbytes // (2 * FUSED_WIDTH), bn)
        blocks = triton.cdiv(vocab, bn)
        stamp, serial = torch.full((vocab,), -1, dtype=torch.long, device=dev), torch.zeros(1, dtype=torch.long,
                                                                                            device=dev)
        pmax, parg = (torch.empty(blocks, dtype=dt, device=dev) for dt in (torch.float32, torch.int32))
        logits = torch.empty(vocab, dtype=torch.float32, device=dev)
        make = lambda: (rnd(FUSED_WIDTH), rnd(FUSED_WIDTH), rnd(vocab, FUSED_WIDTH))  # noqa: E731

        def head(x):
            _lm_head[(blocks,)](x[0], x[1], x[2], logits, stamp, serial, pmax, parg, 1e-6, vocab, H=FUSED_WIDTH,
                                BN=bn, BK=min(bk, next_pow2(FUSED_WIDTH)), num_warps=warps, **launch)
        # what one input set holds (the rotation's size): the hidden row, the norm's weight and the lm_head's
        # weight; the table's bytes are the grid's, the plan's lm_head bytes at batch 1 (its weight, about)
        return make, head, (vocab * FUSED_WIDTH + 2 * FUSED_WIDTH) * 2, 1
    if what != "fused_attention":
        raise ValueError(f"unknown fused kernel {what!r}")
    length = max(nbytes // FUSED_ATTN_SLOT_BYTES, 1)
    chunk, _, warps = attention_blocks(length)  # the engine's blocks for a cache of this length
    splits = triton.cdiv(length, chunk)
    h, d = FUSED_HEADS, FUSED_HEAD_DIM

    def make():
        kc, vc = rnd(h, splits * chunk, d), rnd(h, splits * chunk, d)
        scratch = (torch.empty(h * splits, device=dev), torch.empty(h * splits, device=dev),
                   torch.empty(h * splits, d, device=dev), torch.zeros(h, dtype=torch.int32, device=dev))
        pos = torch.full((1,), length - 1, dtype=torch.long, device=dev)
        return rnd(h, d), kc, vc, pos, scratch, torch.empty(h, d, device=dev, dtype=torch.bfloat16)

    def attend(x):
        q, kc, vc, pos, (m, l_, acc, cnt), o = x
        _attention[(h, splits)](q, kc, vc, pos, m, l_, acc, cnt, o, splits, kc.stride(0), kc.stride(1),
                                vc.stride(0), vc.stride(1), d ** -0.5, D=d, CHUNK=chunk, BS=next_pow2(splits),
                                num_warps=warps, **launch)
    return make, attend, 2 * h * splits * chunk * d * 2, 1


def _moe_gemv_op(nbytes: int, dev: str, rnd, combine: bool = False, tokens: int = 0):
    """The fast engine's by-expert MoE kernels (triton_kernels.moe_gemv: gate/up + SwiGLU, then down; two
    launches) as batched decode runs them: `tokens` rows (a table without that axis: MOE_TOKENS) of MOE_SLOTS slots
    spread over as many distinct experts as make `nbytes` of weights (each row's slots distinct, every expert
    chosen by about as many rows). combine (memory.moe_gemv_combine, expert_fusion 'fused'): the down kernel's
    last programs also combine the slots with their weights and add the residual."""
    import torch

    from ..fast.triton_kernels import moe_gemv

    if not dev.startswith("cuda"):
        raise RuntimeError("the by-expert MoE kernels run on a CUDA GPU only")
    n = min(max(round(nbytes / MOE_EXPERT_BYTES), 1), MOE_MAX_EXPERTS)
    k = min(MOE_SLOTS, n)
    # enough slots to reach every one of the n experts (9 rows for 66)
    tokens = max(tokens or MOE_TOKENS, -(-n // k))
    ids = (torch.arange(tokens, device=dev)[:, None] * k + torch.arange(k, device=dev)[None, :]) % n
    weights = torch.full((tokens, k), 1.0 / k, device=dev)
    make = lambda: (rnd(tokens, FUSED_WIDTH), rnd(n, 2 * MOE_INNER, FUSED_WIDTH),  # noqa: E731
                    rnd(n, FUSED_WIDTH, MOE_INNER), rnd(tokens, FUSED_WIDTH))
    if combine:
        run = lambda x: moe_gemv(x[0], ids, x[1], x[2], weights, x[3])  # noqa: E731
    else:
        run = lambda x: moe_gemv(x[0], ids, x[1], x[2])  # noqa: E731
    return make, run, n * MOE_EXPERT_BYTES + tokens * FUSED_WIDTH * 2, 2


def _group_rows_op(nbytes: int, dev: str):
    """The fast engine's MoE grouping (fast/moe_rows.group_rows: a memset and three kernels) over the (token, slot)
    rows of as many tokens as make `nbytes` of one-hot work: each token's 6 routed experts drawn at random, distinct,
    and the 2 shared ones."""
    import torch

    from ..fast.moe_rows import HAS_ROW_KERNELS, group_rows

    if not (dev.startswith("cuda") and HAS_ROW_KERNELS):
        raise RuntimeError("the MoE grouping kernels run on a CUDA GPU with Triton only")
    tokens = max(nbytes // (GROUP_BYTES_PER_ROW * GROUP_SLOTS), 1)
    gen = torch.Generator(device=dev).manual_seed(0)
    routed = GROUP_EXPERTS - 2
    ids = torch.rand(tokens, routed, device=dev, generator=gen).argsort(-1)[:, :GROUP_SLOTS - 2]
    ids = torch.cat([ids, torch.tensor([routed, routed + 1], device=dev).expand(tokens, 2)], 1)
    return lambda: ids, lambda x: group_rows(x, GROUP_EXPERTS), tokens * GROUP_SLOTS * GROUP_BYTES_PER_ROW, 1


# ---------------------------------------------------------------------------------------------- timing
def _sync(dev: str):
    import torch

    if dev.startswith("cuda"):
        torch.cuda.synchronize(dev)


def _time_calls(run: Callable[[int], object], n: int, st: Settings) -> float:
    """Seconds per call: a CUDA graph of n calls replayed (events) on a GPU, perf_counter on a CPU."""
    import torch

    samples = []
    if st.device.startswith("cuda"):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for j in range(2):
                run(j)
        torch.cuda.current_stream().wait_stream(side)
        _sync(st.device)
        graph = None
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for j in range(n):
                    run(j)
            replay = graph.replay
        except Exception:  # not capturable: eager launches, timed the same way
            graph = None
            _sync(st.device)

            def replay():
                for j in range(n):
                    run(j)
        replay()
        _sync(st.device)
        for _ in range(st.repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            replay()
            b.record()
            b.synchronize()
            samples.append(a.elapsed_time(b) / 1e3 / n)
        del graph
        return statistics.median(samples)
    run(0)
    for _ in range(st.repeats):
        t0 = time.perf_counter()
        for j in range(n):
            run(j)
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


def _estimate(run: Callable[[int], object], st: Settings) -> float:
    """One call's time, roughly (to size the timed loop)."""
    import torch

    run(0)
    _sync(st.device)
    if st.device.startswith("cuda"):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run(0)
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3
    t0 = time.perf_counter()
    run(0)
    return time.perf_counter() - t0


def measure_entry(name: str, coords: dict, st: Settings) -> float:
    """Per-call time of one table entry (device time in a graph on a GPU), launch gaps included."""
    make, op, set_bytes, _ = kernel_op(name, coords, st.device, st.experts)
    copies = int(min(max(math.ceil(2 * st.l2_bytes / max(set_bytes, 1)), 1), 4 if st.quick else 64,
                     max(st.memory_cap // max(set_bytes, 1), 1)))
    sets = [make() for _ in range(copies)]
    run = lambda j: op(sets[j % copies])  # noqa: E731
    one = max(_estimate(run, st), 1e-7)
    n = int(min(max(round(st.target_s / one), 1), st.max_inner))
    n = max(n, min(copies, st.max_inner))
    return _time_calls(run, n, st)


def launch_costs(st: Settings, host_stages: bool = False) -> dict:
    """The per-launch costs (LAUNCH_KEYS). GPU: an empty kernel in a graph; empty eager kernels queued behind a
    busy GPU; the host time of an eager op (op_mix's mean, and per kind of op: host_op_s_by_kind from
    host_mixes); a one-value round trip; a graph replay's host time; with `host_stages` (a full calibration, or one
    that adds launch.host_stages) the host cost per op of the model's own code by stage (host_op_s_by_stage,
    calibration/host_stages.py: it builds the full-size model). CPU: the mean time of op_mix's ops is the
    per-launch cost (they run synchronously, host included), no host term (and no host cost per kind)."""
    import torch

    from ..runtime.host_speed import probe_host_op_s

    x = torch.zeros(1, device=st.device)
    n = 50 if st.quick else 200
    if not st.device.startswith("cuda"):  # ops run synchronously: an op's cost is the launch cost, no host term
        mix = op_mix(st.device)
        for _ in range(2):  # first calls pay one-off setup
            for op in mix:
                op()
        per = _time_calls(lambda j: mix[j % len(mix)](), n, st)
        return {"graph_kernel_s": per, "eager_kernel_s": per, "host_op_s": 0.0, "sync_s": 0.0,
                "graph_launch_s": 0.0, "graph_start_s": 0.0}
    graph_kernel = _time_calls(lambda j: x.add_(1), n, st)
    eager = []
    for _ in range(st.repeats):  # queue the launches behind a busy GPU: the device-side cost of each
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(2e7))  # ~10 ms of GPU time, so the host is far ahead when the adds run
        a.record()
        for _ in range(n):
            x.add_(1)
        b.record()
        b.synchronize()
        eager.append(a.elapsed_time(b) / 1e3 / n)
    mixes = host_mixes(st.device)
    mix = launching_ops(mixes)
    for _ in range(2):  # first calls pay one-off setup (cuBLAS handles, kernel loading)
        for op in (op for ops in mixes.values() for op in ops):
            op()
    _sync(st.device)
    probes = [probe_host_op_s(st.device)]  # the host's speed around the costs by kind (runtime/host_speed.py)
    host = _host_time(mix, n, st)
    by_kind = {kind: _host_time(ops, n, st) for kind, ops in mixes.items()}
    probes.append(probe_host_op_s(st.device))
    syncs = []
    for _ in range(20):
        t0 = time.perf_counter()
        x.add_(1)
        x.item()  # launch, finish, copy one value to the host
        syncs.append(time.perf_counter() - t0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x.add_(1)
    replays = []
    for _ in range(20):
        _sync(st.device)
        t0 = time.perf_counter()
        g.replay()
        replays.append(time.perf_counter() - t0)
    # a graphed stage as the engines time it: runtime.timing.StageTimer's stage with track_memory (a synchronisation,
    # then a GPU wait that hides the host's submission behind the start event), the replay of one kernel; beyond that
    # kernel's own cost, what the graph's start adds on the device
    from ..runtime.timing import StageTimer

    starts = []
    for _ in range(20):
        timer = StageTimer(torch.device(st.device))
        with timer.stage("graph", track_memory=True):
            g.replay()
        starts.append(timer.totals()["graph"])
    _sync(st.device)
    out = {"graph_kernel_s": graph_kernel, "eager_kernel_s": statistics.median(eager), "host_op_s": host,
           "sync_s": max(statistics.median(syncs) - host, 0.0), "graph_launch_s": statistics.median(replays),
           "host_op_s_by_kind": by_kind, "graph_start_s": max(statistics.median(starts) - graph_kernel, 0.0),
           "host_probe_op_s": statistics.median(probes)}
    if host_stages and not st.quick:  # a quick calibration leaves them out: the mixes stand in
        from .host_stages import host_costs_by_stage

        try:
            stage_probes: list[float] = []
            out["host_op_s_by_stage"] = host_costs_by_stage(st.device, probes=stage_probes)
            out["host_stage_probe_op_s"] = statistics.median(stage_probes)
        except Exception as exc:  # e.g. out of memory beside another job: the profile stays usable, priced by kind
            st.notes.append(f"host cost per op of the model's own code not measured: {type(exc).__name__}: {exc}")
    return out


def _host_time(ops: list[Callable[[], object]], n: int, st: Settings) -> float:
    """The host time of one eager call of `ops` (their mean), median over repeats: the GPU is kept busy, so the
    launches queue and the loop times the host alone."""
    import torch

    rounds = max(n // len(ops), 1)
    host = []
    for _ in range(st.repeats):
        torch.cuda._sleep(int(2e7))  # ~10 ms of GPU time, longer than the loop
        t0 = time.perf_counter()
        for _ in range(rounds):
            for op in ops:
                op()
        host.append((time.perf_counter() - t0) / (rounds * len(ops)))
        _sync(st.device)
    return statistics.median(host)


def host_mixes(dev: str) -> dict[str, list[Callable[[], object]]]:
    """One eager call of each kind of op the reference model issues (dsocr_core/model), on tiny tensors, grouped
    by host-cost kind (schema.HOST_KINDS): linear layers; SDPA; the other launching ops (elementwise products and
    sums, casts, the RMSNorm's pow and mean, softmax, top-k, the expert loop's gathers and scatters,
    concatenation); views that launch nothing (the slices, reshapes and transposes around them)."""
    import torch
    import torch.nn.functional as F

    a = torch.randn(4, 64, device=dev, dtype=torch.bfloat16)
    w = torch.randn(64, 64, device=dev, dtype=torch.bfloat16)
    idx = torch.arange(4, device=dev)
    q = torch.randn(1, 2, 4, 32, device=dev, dtype=torch.bfloat16)
    return {
        "gemm": [lambda: F.linear(a, w)],
        "attention": [lambda: F.scaled_dot_product_attention(q, q, q)],
        "other": [lambda: a * a, lambda: a + a, lambda: a.float(), lambda: a.pow(2), lambda: a.mean(-1, keepdim=True),
                  lambda: torch.softmax(a, -1), lambda: torch.topk(a, 2, -1), lambda: a[idx],
                  lambda: w.index_copy(0, idx, a), lambda: torch.cat([a, a])],
        "view": [lambda: a.view(2, 128), lambda: a.transpose(0, 1), lambda: a[1:3], lambda: a.unsqueeze(0),
                 lambda: q.reshape(2, 4, 32)],
    }


def launching_ops(mixes: dict[str, list[Callable[[], object]]]) -> list[Callable[[], object]]:
    """The launching ops of host_mixes, one of each (twelve): the mix whose mean is launch.host_op_s (and, on a
    CPU, the per-launch cost)."""
    return [op for kind, ops in mixes.items() if kind != "view" for op in ops]


def op_mix(dev: str) -> list[Callable[[], object]]:
    return launching_ops(host_mixes(dev))


def split_kv_length(k: float, fill: float) -> int:
    """The static cache's slots for a split-KV entry: k keys before the position fill that share of it."""
    return max(int(round(k / min(max(fill, 1e-6), 1.0))), int(k))


def kernel_count(name: str) -> int:
    kind = table_kind(name)
    if kind in ("attention", "attention_causal"):
        impl = name.split(".")[1]
        return ATTN_KERNELS["eager.causal" if impl == "eager" and kind == "attention_causal" else impl]
    # the by-expert MoE's gate/up and down launches; the grouping's memset and three kernels
    return {"memory.moe_gemv": 2, "memory.moe_gemv_combine": 2, "memory.group_rows": 4}.get(name, 1)


def input_bytes(name: str, c: dict, st: Settings):
    """Input bytes of one entry without allocating (for the caps)."""
    kind = table_kind(name)
    if kind in MNK_KINDS:
        s = DTYPE_BYTES[name.split(".")[1]]
        return None, None, (c["m"] * c["k"] + c["n"] * c["k"] + c["m"] * c["n"]) * s, 1
    if kind == "grouped_gemm":
        return None, None, st.experts * (c["tokens"] * (c["k"] + c["n"]) + c["n"] * c["k"]) * 2, 1
    if kind == "memory":
        return None, None, c["bytes"], 1
    if kind == "bias":  # the einsum outputs and the sum (the strided copy's input set is the sum), bf16
        return None, None, 4 * c["bh"] * c["side"] ** 3 + 2 * c["bh"] * c["side"] ** 4, 1
    q, k = (c["s"], c["s"]) if kind == "attention_causal" else (c["q"], c["k"])
    if name == "attention.split_kv":  # the whole static cache is allocated
        k = split_kv_length(k, c.get("fill", 1.0))
    extra = c["bh"] * q * k * (2 if name.startswith("attention.sdpa_bias") else 0)
    if name.startswith("attention.eager"):
        extra = c["bh"] * q * k * 12  # scores, fp32 copy, probabilities
    return None, None, c["bh"] * (2 * q + 2 * k) * c["d"] * 2 + extra, 1
