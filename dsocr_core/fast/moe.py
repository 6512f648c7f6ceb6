"""Mixture-of-experts without host synchronisation: routing, then the chosen experts run grouped on the device.

The reference MoE (model/decoder.py) copies per-expert token counts to the host and loops over experts in
Python. Here the counts never leave the device, so the whole layer can be captured in a CUDA graph:

* `grouped`: (token, slot) pairs sorted by expert on the device, group ends found by `searchsorted`, and both
  SwiGLU projections run as ONE grouped GEMM each (`torch._grouped_mm`, bf16 CUTLASS kernels on Hopper; experts
  that received no rows are skipped, so each touched expert's weights are read once). Prefill, and decode above
  the Triton kernels' batch limit.
  The grouping itself needs no sort: a one-hot [rows, experts] matrix, its column sums (group sizes) and its
  running sum down the rows (each row's rank inside its expert) give every row its place, in the order a stable
  sort would give (on an H200 torch.sort's radix sort cost 26 us per layer at batch 64).
* `triton` (decode at batch 2-64 on a GPU; batch 1 is the fused step): the engine routes with
  triton_kernels.route_hidden (or route_rows, expert_fusion 'separate') and runs triton_kernels.moe_gemv, one
  program per (expert, block of output rows) over every token that chose the expert, reading its weight tile in
  place: each touched expert's weights are read once, nothing copied, no routing data prepared; with 'fused' its
  down kernel also does the weighted combine + residual (this module's route/combine are not used for it).
* `gather`: each (token, slot) row multiplies its expert's weights gathered by id (`bmm` copies the chosen
  weights first, `reduce` is a multiply-sum Inductor can fuse). CPU path and fallback.

Each returns per-slot outputs [T, K, H] in the model dtype (each expert output rounded as the reference rounds
it), combined in float32 with the routing weights in a fixed slot order, like the reference; with the engine's
MoE row kernels (moe_rows.py) the grouped path's rows are read back, combined and added to the residual in one
kernel instead.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

HAS_GROUPED_MM = hasattr(torch, "_grouped_mm")


def topk_argmax(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(scores, k) as k rounds of max-and-mask (values descending, like topk): k small reductions that
    Inductor fuses, instead of topk's sort kernels. Only exact ties could order differently."""
    vals, ids = [], []
    s = scores
    for _ in range(k):
        v, i = s.max(dim=-1, keepdim=True)
        vals.append(v)
        ids.append(i)
        s = s.scatter(-1, i, float("-inf"))
    return torch.cat(vals, -1), torch.cat(ids, -1)


def router_logits(h: torch.Tensor, gate32: torch.Tensor, gemv: str = "linear") -> torch.Tensor:
    """h [T, H] -> float32 router logits [T, E] (the reference router's float32 GEMM)."""
    if gemv == "reduce":  # a reduction Inductor fuses with its neighbours; same math
        return (h.float()[:, None, :] * gate32[None]).sum(-1)
    return h.float() @ gate32.t()


def route(h: torch.Tensor, gate32: torch.Tensor, k: int, norm_topk_prob: bool, scale: float,
          gemv: str = "linear", topk: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """h [T, H] -> routing weights [T, k] float32 and expert ids [T, k]: fp32 logits, fp32 softmax, greedy
    top-k, optional renormalisation, times the scale (the reference router's ops)."""
    logits = router_logits(h, gate32, gemv)
    scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = topk_argmax(scores, k) if topk == "argmax" else torch.topk(scores, k, dim=-1)
    if norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scale, ids


def with_shared(weights: torch.Tensor, ids: torch.Tensor, n_routed: int, shared_slots: int):
    """Append the shared expert's pseudo-experts (ids n_routed .. n_routed+S-1, weight 1.0) to every token."""
    if not shared_slots:
        return weights, ids
    t = ids.shape[0]
    sid = torch.arange(n_routed, n_routed + shared_slots, device=ids.device, dtype=ids.dtype)
    return (torch.cat([weights, weights.new_ones(t, shared_slots)], 1),
            torch.cat([ids, sid.expand(t, shared_slots)], 1))


def swiglu(h: torch.Tensor, inner: int) -> torch.Tensor:
    """[..., 2*inner] gate|up -> silu(gate) * up [..., inner]."""
    return F.silu(h[..., :inner]) * h[..., inner:]


def experts_gather(x: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, inner: int,
                   formulation: str = "bmm") -> torch.Tensor:
    """x [T, H], ids [T, K] -> per-slot outputs [T, K, H] (model dtype), each slot's expert gathered by id."""
    t, k = ids.shape
    dt = x.dtype
    if formulation == "reduce":  # explicit multiply + sum in float32: one fused gather-GEMV under Inductor
        h = (x.float()[:, None, None, :] * w13[ids].float()).sum(-1).to(dt)  # [T, K, 2Im]
        a = swiglu(h, inner)  # [T, K, Im]
        return (a.float()[:, :, None, :] * w2[ids].float()).sum(-1).to(dt)  # [T, K, H]
    flat = ids.reshape(-1)
    rows = x.repeat_interleave(k, dim=0)  # [T*K, H], row (t, j) = x[t]
    h = torch.bmm(w13[flat], rows[:, :, None])[..., 0]  # [T*K, 2Im]
    a = swiglu(h, inner)
    return torch.bmm(w2[flat], a[:, :, None])[..., 0].view(t, k, -1)


def group_rows(ids: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat (token, slot) rows -> (dest: each row's place in expert order [R], ends: int32 end of each expert's
    group [E]); rows of one expert keep their order (what a stable sort gives), with no sort and no host sync."""
    flat = ids.reshape(-1)
    onehot = (flat[:, None] == torch.arange(n_experts, device=ids.device)).to(torch.int32)  # [R, E]
    counts = onehot.sum(0)
    ends = torch.cumsum(counts, 0, dtype=torch.int32)
    rank = (torch.cumsum(onehot, 0, dtype=torch.int32) * onehot).sum(1) - 1  # place inside its expert's group
    dest = (ends - counts).index_select(0, flat) + rank
    return dest.long(), ends


def group_rows_sorted(ids: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """group_rows by a stable sort: the better choice eagerly (ATen's cumsum down the rows of a [R, E] matrix
    runs one thread per column, serially: ~1 ms per call at R = 5,624 on an H200), while under torch.compile
    the one-hot version becomes a parallel Triton scan and beats the sort's radix kernels."""
    flat = ids.reshape(-1)
    sorted_ids, order = torch.sort(flat, stable=True)
    ends = torch.searchsorted(sorted_ids, torch.arange(n_experts, device=ids.device, dtype=sorted_ids.dtype),
                              right=True, out_int32=True)
    dest = torch.empty_like(order).index_copy_(0, order, torch.arange(flat.numel(), device=ids.device))
    return dest, ends


def to_expert_order(x: torch.Tensor, dest: torch.Tensor, k: int) -> torch.Tensor:
    """x [T, H] -> each token's row at its k (token, slot) rows' places in expert order [T*K, H] (torch's
    formulation of moe_rows.scatter_rows)."""
    return x.new_empty(x.shape[0] * k, x.shape[1]).index_copy_(0, dest, x.repeat_interleave(k, dim=0))


def from_expert_order(ys: torch.Tensor, dest: torch.Tensor, slots: torch.Size) -> torch.Tensor:
    """Expert outputs in expert order [T*K, H] -> per-slot outputs [T, K, H] (`slots` = (T, K))."""
    return ys.index_select(0, dest).view(*slots, -1)


def combine_rows(ys: torch.Tensor, dest: torch.Tensor, weights: torch.Tensor,
                 residual: torch.Tensor) -> torch.Tensor:
    """Expert outputs in expert order [T*K, H] read back in (token, slot) order, combined with `weights` [T, K],
    plus `residual` [T, H] (torch's formulation of moe_rows.gather_combine)."""
    return residual + combine(from_expert_order(ys, dest, weights.shape), weights)


def expert_rows(x: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, inner: int,
                grouping: str = "onehot", rows: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], ids [T, K] -> (expert outputs [T*K, H] in expert order, dest [T*K]: each (token, slot) row's
    place in that order): rows placed in expert order, two grouped GEMMs. No host sync: group ends are computed
    on the device. grouping 'onehot' (compiled) or 'sort' (eager); rows 'torch' or 'triton' (the grouping and
    the copy into expert order by moe_rows' kernels; the grouping by `grouping` above their row limit)."""
    k, n_experts = ids.shape[1], w13.shape[0]
    kernels = None
    if rows == "triton":
        from . import moe_rows as kernels
    if kernels is not None and ids.numel() <= kernels.GROUP_MAX_ROWS:
        dest, ends = kernels.group_rows(ids, n_experts)
    else:
        dest, ends = (group_rows_sorted if grouping == "sort" else group_rows)(ids, n_experts)
    xs = kernels.scatter_rows(x, dest, k) if kernels is not None else to_expert_order(x, dest, k)
    h = torch._grouped_mm(xs, w13.transpose(1, 2), offs=ends)  # [T*K, 2Im]; b is column-major per group
    a = swiglu(h, inner)
    return torch._grouped_mm(a, w2.transpose(1, 2), offs=ends), dest  # [T*K, H]


def experts_grouped(x: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                    inner: int, grouping: str = "onehot") -> torch.Tensor:
    """x [T, H], ids [T, K] -> per-slot outputs [T, K, H]: expert_rows read back in (token, slot) order."""
    if not HAS_GROUPED_MM:  # pragma: no cover - torch without grouped GEMM
        return experts_gather(x, ids, w13, w2, inner, "bmm")
    ys, dest = expert_rows(x, ids, w13, w2, inner, grouping)
    return from_expert_order(ys, dest, ids.shape)


def combine(y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-slot outputs [T, K, H] and weights [T, K] -> float32 weighted sum over slots, in the model dtype."""
    return (y.float() * weights.unsqueeze(-1)).sum(dim=1).to(y.dtype)


def moe_forward(h: torch.Tensor, gate32: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, *, k: int,
                n_routed: int, shared_slots: int, inner: int, norm_topk_prob: bool, scale: float,
                impl: str = "grouped", gemv: str = "linear", topk: str = "torch",
                grouping: str = "onehot", rows: str = "torch", residual: torch.Tensor | None = None
                ) -> torch.Tensor:
    """Routed experts + shared expert of one MoE layer on tokens h [T, H] -> [T, H] (model dtype), plus
    `residual` [T, H] when given. The grouped impl with a residual: rows 'triton' runs the grouping, the copy into
    expert order and the weighted combine with the residual as moe_rows' kernels, 'torch' as their torch
    formulations (to_expert_order, combine_rows)."""
    weights, ids = route(h, gate32, k, norm_topk_prob, scale, gemv, topk)
    weights, ids = with_shared(weights, ids, n_routed, shared_slots)
    if impl == "grouped" and residual is not None and HAS_GROUPED_MM:  # the engine's prefill and grouped decode
        ys, dest = expert_rows(h, ids, w13, w2, inner, grouping, rows)
        if rows == "triton":
            from .moe_rows import gather_combine
            return gather_combine(ys, dest, weights, residual)
        return combine_rows(ys, dest, weights, residual)
    if impl == "triton":
        from .triton_kernels import moe_gemv
        y = moe_gemv(h, ids, w13, w2)
    elif impl == "gather":
        y = experts_gather(h, ids, w13, w2, inner, "reduce" if gemv == "reduce" else "bmm")
    elif impl == "grouped":
        y = experts_grouped(h, ids, w13, w2, inner, grouping)
    else:
        raise ValueError(f"moe impl must be 'triton', 'gather' or 'grouped', got {impl!r}")
    out = combine(y, weights)
    return out if residual is None else residual + out
